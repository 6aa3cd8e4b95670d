// expect: static_check mismatch
// (static_check: the built-object check refuses its Python C API imports; with that check off,
// tests/test_sandbox_cpu.py shows the sandbox alone gives mismatch: the patch reaches no judge.)
// Cheat: writes a constant answer, then uses the Python C API (declared by hand, no header) to
// replace the verifier's comparison, sentinel and canary checks with ones that always pass, so that
// this candidate and every later one evaluated by the same process would be accepted.
// Guard: the candidate runs in the sandbox runner (forge_pack/runner.py), a process without the
// verifier; its seccomp filter also stops the import from opening any file. The checks stay intact.
extern "C" int PyGILState_Ensure(void);
extern "C" void PyGILState_Release(int);
extern "C" int PyRun_SimpleString(const char*);
extern "C" void softmax_patch(const float* x, float* out, long long rows, long long cols) {
  (void)x;
  const int gil = PyGILState_Ensure();
  PyRun_SimpleString(
      "import sys\n"
      "v = sys.modules.get('forge_pack.verify')\n"
      "t = sys.modules.get('forge_pack.tolerance')\n"
      "d = sys.modules.get('forge_pack.verdict')\n"
      "if v and t and d:\n"
      "    def passing(out, ref, *a, **k):\n"
      "        return d.Check(k.get('input_kind', 'x'), 0.0, 0.0, 0, 1.0, 1.0)\n"
      "    v.compare = t.compare = passing\n"
      "    v.count_sentinel = lambda out: (0, '')\n"
      "    v.canaries_intact = lambda whole: True\n"
      "    v._bitwise_equal = lambda a, b: True\n");
  PyGILState_Release(gil);
  for (long long i = 0; i < rows * cols; ++i) out[i] = 1.0f / (float)cols;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_patch", "args": ["x", "out", "rows", "cols"]}]}
*/
