"""The built CPU object checked (forge_pack/evaluate/object_check.py): imports, system-call bytes, load-time code.

- unit tests on small shared objects compiled here with the candidates' own g++ flags;
- the fixtures that only the object check catches: each passes the source-text check, and the
  CPU Evaluator rejects it with `static_check` and a detail naming what the object does;
- every CPU template family and reference kernel passes (the allow-list is no regression).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forge_pack.evaluate import object_check, static_check
from forge_pack.evaluate.compile import CPU_FLAGS, compile_candidate, cpu_include_dir
from forge_pack.targets.ops import with_output
from forge_pack.search.families import reference_candidate
from forge_pack.evaluate.timing import TimingConfig

from eval_helpers import CPU_SIGNATURE, KERNELS, expected_reasons, hotspot, load_fixture, one_thread_cpu_evaluator

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH")

# fixture -> what the verdict's detail must name
OBJECT_FIXTURES = {
    "cpu_python_c_api": ["PyGILState_Ensure", "PyImport_ImportModule", "PyObject_SetAttrString"],
    "cpu_asm_label_libc": ["system"],
    "cpu_inline_syscall": ["0f 05", "softmax_asks+"],
    "cpu_load_time_hook": ["fill_table_early", "outside any call"],
    "cpu_global_object": ["_GLOBAL__sub_I_", "__cxa_atexit"],
    "cpu_symbol_lookup": ["dlsym"],
    "cpu_thread_alias": ["pthread_create", "pthread_detach"],
}

KERNEL = """
#include <cmath>
#include <vector>
extern "C" void k(const float* x, float* out, long long n) {
  std::vector<float> tmp(n);
  #pragma omp parallel for
  for (long long i = 0; i < n; ++i) tmp[i] = std::exp(x[i]) + std::sqrt(std::fabs(x[i]));
  #pragma omp parallel for schedule(dynamic, 4)
  for (long long i = 0; i < n; ++i) out[i] = tmp[i];
}
"""


# Objects built here are kept by the hash of (g++ version, flags, source) under build/: the checks
# only read them, and mutation testing reruns these tests once per mutant (a compile each was most of it).
OBJECTS = Path(__file__).resolve().parent.parent / "build" / "test-objects"


@functools.lru_cache(maxsize=1)
def _toolchain() -> str:
    return subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout


def build(tmp_path: Path, source: str, name: str = "k") -> Path:
    src, out = tmp_path / f"{name}.cpp", tmp_path / f"{name}.so"
    src.write_text(source)
    cmd = ["g++", *CPU_FLAGS, f"-I{cpu_include_dir()}", "-o", str(out), str(src)]
    key = hashlib.sha256("\0".join([_toolchain(), *cmd[:-3], source]).encode()).hexdigest()
    kept = OBJECTS / f"{key}.so"
    if kept.is_file():
        shutil.copyfile(kept, out)
        return out
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    OBJECTS.mkdir(parents=True, exist_ok=True)
    part = OBJECTS / f"{key}.{os.getpid()}.part"
    shutil.copyfile(out, part)
    os.replace(part, kept)  # atomic: a concurrent run never reads half an object
    return out


@pytest.fixture(autouse=True)
def _fresh_decisions(monkeypatch):
    # check_object remembers decisions per process by content hash: each test decides afresh, so a
    # test judges the code in place now, not a decision an earlier test (or process state) left
    monkeypatch.setattr(object_check, "_decisions", {})


def detail(tmp_path: Path, source: str, name: str = "k") -> str:
    v = object_check.check_object(build(tmp_path, source, name))
    assert v is not None and not v.ok and v.reason == "static_check"
    assert v.detail.startswith("built object: ")
    return v.detail


# ---------------------------------------------------------------- the allow-list


@pytest.mark.parametrize("name", ["expf", "exp", "log1pf", "sqrtf", "fmaxf", "tanhf", "_ZGVdN8v_expf",
                                  "_ZGVeN16vv_powf", "__expf_finite", "memcpy", "memset", "memmove", "_Znwm",
                                  "_ZdlPvm", "_ZSt20__throw_length_errorPKc", "_Unwind_Resume", "__gxx_personality_v0",
                                  "GOMP_parallel", "GOMP_barrier", "GOMP_critical_start", "GOMP_atomic_end",
                                  "GOMP_loop_nonmonotonic_dynamic_start", "GOMP_loop_end_nowait",
                                  "GOMP_parallel_loop_guided", "GOMP_parallel_sections", "GOMP_loop_static_start",
                                  "GOMP_sections_start", "omp_get_thread_num", "omp_get_max_threads",
                                  "__stack_chk_fail", "__divti3", "__extendhfsf2", "__truncsfhf2"])
def test_allow_list_accepts_what_numeric_kernels_need(name):
    assert object_check.allowed_symbol(name)


@pytest.mark.parametrize("name", ["system", "fork", "vfork", "execve", "dlopen", "dlsym", "pthread_create",
                                  "PyRun_SimpleString", "PyGILState_Ensure", "mmap", "mprotect", "open", "fopen",
                                  "syscall", "clone", "signal", "setjmp", "getenv", "__cxa_atexit", "__tls_get_addr",
                                  "omp_set_num_threads", "GOMP_target_ext", "GOMP_parallel_start",
                                  "GOMP_parallel_loop_static_start", "GOMP_parallel_sections_start", "_ZGVdN8v_system", "__system_finite",
                                  "at_quick_exit", "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14"
                                  "default_deleteIS1_EEPFvvE"])
def test_allow_list_rejects_everything_else(name):
    assert not object_check.allowed_symbol(name)


def test_plain_numeric_kernel_with_openmp_and_vector_passes(tmp_path):
    assert object_check.check_object(build(tmp_path, KERNEL)) is None


def test_empty_translation_unit_is_the_baseline_and_passes(tmp_path):
    base = object_check.baseline()
    assert base.init_array == 1 and base.fini_array == 1  # frame_dummy, __do_global_dtors_aux
    assert "__gmon_start__" in base.weak
    assert object_check.check_object(build(tmp_path, "// nothing\n")) is None


# ---------------------------------------------------------------- symbols


def test_weak_undefined_symbols_count(tmp_path):
    d = detail(tmp_path, """
extern "C" int system(const char*) __attribute__((weak));
extern "C" void k(float* out) { if (system) out[0] = (float)system(":"); }
""")
    assert "functions or data from outside the kernel runtime: system (" in d


def test_function_pointer_to_libc_is_an_import(tmp_path):
    d = detail(tmp_path, """
#include <cstdlib>
extern "C" void k(float* out, int (*volatile* slot)(const char*)) { *slot = &std::system; out[0] = 1; }
""")
    assert "system" in d


def test_every_denied_symbol_is_named_once(tmp_path):
    d = detail(tmp_path, """
extern "C" int getpid(); extern "C" char* getenv(const char*); extern "C" void* mmap(void*, unsigned long, int, int, int, long);
extern "C" void k(float* out) { out[0] = getpid() + (getenv("X") != 0) + (mmap(0, 0, 0, 0, -1, 0) != 0); }
""")
    assert "outside the kernel runtime: getenv, getpid, mmap (" in d


# ---------------------------------------------------------------- system calls and code that changes


@pytest.mark.parametrize("asm,shown", [("syscall", "0f 05 (`syscall`)"), ("sysenter", "0f 34 (`sysenter`)"),
                                       ("int $0x80", "cd 80 (`int 0x80`)")])
def test_system_call_instructions_are_rejected(tmp_path, asm, shown):
    d = detail(tmp_path, f'extern "C" void k(float* out) {{ __asm__ volatile("{asm}" ::: "memory"); out[0] = 1; }}')
    assert shown in d and " at k+0x" in d


# mov $0x050f, %eax encodes as b8 0f 05 00 00: a jump to its second byte would run `syscall`
HIDDEN = 'extern "C" void k(int* out) {{ int v; __asm__("{before}movl $0x050f, %0" : "=r"(v){clobber}); out[0] = v; }}'


def test_system_call_bytes_inside_an_instruction_no_jump_lands_in_pass(tmp_path):
    """g++'s own vector code holds such bytes (vpblendvb with ymm8: c4 e3 75 4c cd 80); reaching them needs a jump
    into the middle of the instruction, and this object has none."""
    assert object_check.check_object(build(tmp_path, HIDDEN.format(before="", clobber=""))) is None
    blend = ('extern "C" void k(float* out) { __asm__ volatile("vpblendvb %%ymm8, %%ymm5, %%ymm1, %%ymm1" ::: '
             '"xmm1", "xmm5", "xmm8"); out[0] = 1; }')
    assert object_check.check_object(build(tmp_path, blend, "blend")) is None


@pytest.mark.parametrize("how", ["jump", "call", "address"])
def test_system_call_bytes_a_jump_or_an_address_lands_in_are_rejected(tmp_path, how):
    """A direct jump or call to the byte after the opcode, or its address taken RIP-relative (a computed jump's
    start), runs `syscall`: the whole object is held to the plain byte rule."""
    before = {"jump": "jmp 1f+1\\n1: ", "call": "call 1f+1\\n1: ", "address": "lea 1f+1(%%rip), %%rcx\\n1: "}[how]
    d = detail(tmp_path, HIDDEN.format(before=before, clobber=' : : "rcx"' if how == "address" else ""))
    assert "0f 05 (`syscall`) at k+0x" in d and "inside another instruction" in d


def test_a_prefixed_system_call_is_rejected_though_its_bytes_start_inside_it(tmp_path):
    # data16 syscall: 66 0f 05, one instruction whose bytes 0f 05 are not its first
    d = detail(tmp_path, 'extern "C" void k(float* out) { __asm__ volatile(".byte 0x66, 0x0f, 0x05" ::: "memory"); '
                         'out[0] = 1; }')
    assert "0f 05 (`syscall`) at k+0x" in d and "syscall" in d.split("(inline asm)")[1]


def test_without_objdump_every_system_call_byte_is_rejected(tmp_path, monkeypatch):
    so = build(tmp_path, HIDDEN.format(before="", clobber=""))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    d = object_check.check_object(so).detail
    assert "0f 05 (`syscall`) at k+0x" in d and "objdump (binutils) is not on PATH" in d


def test_writable_executable_segment_is_rejected(tmp_path):
    d = detail(tmp_path, 'asm(".section .wx,\\"awx\\",@progbits\\n.byte 0xc3\\n.previous");\n'
                         'extern "C" void k(float* out) { out[0] = 1; }')
    assert "writable and executable" in d


def test_executable_stack_is_rejected(tmp_path):
    d = detail(tmp_path, 'asm(".section .note.GNU-stack,\\"x\\",@progbits\\n.previous");\n'
                         'extern "C" void k(float* out) { out[0] = 1; }')
    assert "executable stack" in d


def test_text_relocations_are_rejected(tmp_path):
    d = detail(tmp_path, 'int g;\nasm(".text\\n.quad g\\n");\nextern "C" void k(float* out) { out[0] = g; }')
    assert "text relocations" in d


# ---------------------------------------------------------------- code outside the call


def test_destructor_function_is_rejected(tmp_path):
    d = detail(tmp_path, 'volatile int seen;\n__attribute__((destructor)) static void bye() { seen = 1; }\n'
                         'extern "C" void k(float* out) { out[0] = 1; }')
    assert "outside any call: bye() (" in d


def test_code_added_to_init_is_rejected(tmp_path):
    d = detail(tmp_path, 'asm(".section .init,\\"ax\\",@progbits\\nnop\\nnop\\n.previous");\n'
                         'extern "C" void k(float* out) { out[0] = 1; }')
    assert "code was added to _init" in d


def test_ifunc_resolvers_are_rejected(tmp_path):
    d = detail(tmp_path, '__attribute__((target_clones("avx2", "default"))) float twice(float v) { return 2 * v; }\n'
                         'extern "C" void k(float* out) { out[0] = twice(out[0]); }')
    assert "IFUNC resolvers (twice(float)" in d


def test_thread_local_storage_is_rejected(tmp_path):
    d = detail(tmp_path, 'static thread_local int calls;\nextern "C" void k(float* out) { out[0] = ++calls; }')
    assert "thread-local storage" in d


def test_function_local_static_set_up_inside_the_call_passes(tmp_path):
    src = """
#include <cmath>
static float make(int i) { return std::exp(-i * 0.1f); }
extern "C" void k(float* out, int i) {
  static const float* table = [] { float* t = new float[64]; for (int j = 0; j < 64; ++j) t[j] = make(j); return t; }();
  out[0] = table[i & 63];
}
"""
    assert object_check.check_object(build(tmp_path, src)) is None


# ---------------------------------------------------------------- not an object, CUDA, the cache


def test_unreadable_artifacts_are_verdicts(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 20)
    v = object_check.check_object(junk)
    assert v.reason == "static_check" and v.detail.startswith("built object: not a readable ELF64 object")
    data = bytearray(build(tmp_path, KERNEL).read_bytes())
    data[60:62] = b"\0\0"  # e_shnum = 0: the loader needs no section headers, this check does
    stripped = tmp_path / "stripped.so"
    stripped.write_bytes(bytes(data))
    assert object_check.check_object(stripped).detail == ("built object: it has no dynamic symbol table, so its "
                                                          "imports cannot be checked")
    v = object_check.check_object(tmp_path / "missing.so")
    assert v.reason == "static_check" and "cannot be read" in v.detail


def test_cubins_hold_no_host_code_and_are_passed(tmp_path):
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 11 + (190).to_bytes(2, "little") + b"\0" * 40)
    assert object_check.check_object(cubin, "cuda") is None
    v = object_check.check_object(build(tmp_path, KERNEL), "cuda")
    assert v.detail == "built object: expected a cubin (CUDA ELF), found machine type 62"


HOST_CODE_CU = """
extern "C" int system(const char*);
struct Greeter { Greeter() { system(": hello from the package's import"); } };
static Greeter greeter;
extern "C" __global__ void scale(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.f; }
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_nvcc_fallback_build_has_its_host_side_checked(tmp_path, monkeypatch):
    """`nvcc -cubin` drops host code from the cubin, but the package compiles it: it is checked."""
    from forge_pack.evaluate import compile as fcompile
    from forge_pack.core.candidate import Candidate, parse_spec

    monkeypatch.setattr(fcompile, "_nvrtc", None)  # NVRTC unavailable: the nvcc fallback
    spec = parse_spec('{"kernels": [{"name": "scale", "args": ["x", "i32:n"]}]}')
    bad = Candidate("softmax", "cuda", HOST_CODE_CU, spec, "test")
    good = Candidate("softmax", "cuda", HOST_CODE_CU.split("\n")[-2] + "\n", spec, "test")
    assert good.source.startswith('extern "C" __global__ void scale')
    builds = [fcompile.compile_candidate(c, arch="sm_90", cache_dir=tmp_path) for c in (bad, good)]
    assert all(b.ok and b.cmd.startswith(shutil.which("nvcc")) for b in builds), builds
    v = object_check.check_build(builds[0])
    assert v.reason == "static_check" and v.detail.startswith("built object: its host code calls or references system")
    assert "runs when the package loads" in v.detail
    assert object_check.check_build(builds[1]) is None


def test_nvrtc_builds_need_no_host_check(tmp_path):
    from forge_pack.evaluate.compile import Build

    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 11 + (190).to_bytes(2, "little") + b"\0" * 40)
    (tmp_path / "kernel.cu").write_text(HOST_CODE_CU)  # would be rejected, but NVRTC never compiles host code
    build = Build(True, "cuda", str(cubin), "", "nvrtc(libnvrtc.so.13 13.0) --gpu-architecture=sm_90", 0.0, False,
                  "k", "sm_90")
    assert object_check.check_build(build) is None


def test_decision_is_cached_by_content_hash(tmp_path, monkeypatch):
    so = build(tmp_path, KERNEL.replace("4)", "8)"))
    calls = []
    real = object_check._decide
    monkeypatch.setattr(object_check, "_decide", lambda data, backend: calls.append(1) or real(data, backend))
    copy = tmp_path / "copy.so"
    shutil.copyfile(so, copy)
    assert object_check.check_object(so) is None
    assert object_check.check_object(copy) is None  # same bytes, another path: no second decision
    assert len(calls) == 1


# ---------------------------------------------------------------- the fixtures, through the evaluator


def test_object_fixtures_are_listed_and_expect_static_check():
    found = {p.stem for p in KERNELS.glob("cpu_*.cpp")}
    assert set(OBJECT_FIXTURES) <= found
    for name in OBJECT_FIXTURES:
        assert expected_reasons(KERNELS / f"{name}.cpp") == {"static_check"}


@pytest.mark.parametrize("name", sorted(OBJECT_FIXTURES))
def test_fixture_passes_the_source_check_and_only_the_built_object_is_rejected(name, tmp_path):
    cand = load_fixture(KERNELS / f"{name}.cpp")
    sig = with_output(hotspot("softmax", CPU_SIGNATURE).signature)
    assert static_check.check(cand, sig) is None  # the text alone looks like a kernel
    build_ = compile_candidate(cand, cache_dir=OBJECTS / "candidates")  # keyed by the build's own content hash
    assert build_.ok, build_.log
    v = object_check.check_object(build_.path)
    assert v is not None and v.reason == "static_check"
    for word in OBJECT_FIXTURES[name]:
        assert word in v.detail, (word, v.detail)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    timing = TimingConfig(warmup=1, reps=5, flush=False, compile_baseline=False)
    with one_thread_cpu_evaluator(tmp_path_factory, 20, timing, cache=True) as ev:
        yield ev


def test_evaluator_rejects_object_fixtures_before_loading_them_then_judges_the_next(evaluator):
    h = hotspot("softmax", CPU_SIGNATURE)
    for name in sorted(OBJECT_FIXTURES):
        e = evaluator.evaluate(load_fixture(KERNELS / f"{name}.cpp"), h)
        assert e.verdict.reason == "static_check", (name, e.verdict.detail)
        assert e.verdict.detail.startswith("built object: "), name
        assert e.compile_cmd.startswith("g++") and "worker" not in e.extra  # no worker saw it
    e = evaluator.evaluate(reference_candidate(h.signature, "cpu"), h)
    assert e.verdict.ok, e.verdict.detail


# ---------------------------------------------------------------- no regression on built-in kernels


@pytest.mark.slow
def test_every_cpu_template_family_and_reference_kernel_passes_the_object_check(tmp_path):
    from forge_pack.evaluate.compile import compile_many
    from forge_pack.search.families import reference_ops
    from test_templates import SIGS, _sig, _variants

    cands = [c for _, _, c in _variants("cpu", extremes_everywhere=False)]
    cands += [c for op in reference_ops() for text in SIGS.get(op, [])
              if (c := reference_candidate(_sig(op, text), "cpu")) is not None]
    assert {c.family for c in cands} >= {"rows", "online", "groups", "planes", "nchw", "nhwc", "reference"}
    builds = compile_many(cands, cache_dir=tmp_path, max_workers=2)
    failures = [f"{c.op} {c.family} {c.label}: {b.log[-500:] if not b.ok else object_check.check_object(b.path).detail}"
                for c, b in zip(cands, builds) if not b.ok or object_check.check_object(b.path) is not None]
    assert not failures, "\n".join(failures)


def test_the_baseline_is_what_gxx_puts_in_an_empty_object(monkeypatch):
    monkeypatch.setattr(object_check, "_baselines", {})
    base = object_check.baseline()
    # crtstuff's frame_dummy and __do_global_dtors_aux; _init/_fini are a few instructions each
    assert (base.init_array, base.fini_array) == (1, 1)
    assert 0 < base.init_size <= 32 and 0 < base.fini_size <= 32
    assert "__cxa_finalize" in base.weak and "__gmon_start__" in base.weak
    assert object_check.baseline() is base and object_check.baseline(tuple(CPU_FLAGS)) is base


# ---------------------------------------------------------------- the nvcc fallback's host side, unit by unit

CUBIN = b"\x7fELF\x02\x01\x01" + b"\0" * 11 + (190).to_bytes(2, "little") + b"\0" * 40


def _nvcc_build(tmp_path: Path, source: str | None, cmd: str = "/usr/bin/nvcc -cubin -arch=sm_90"):
    from forge_pack.evaluate.compile import Build

    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(CUBIN)
    if source is not None:
        (tmp_path / "kernel.cu").write_text(source)
    return Build(True, "cuda", str(cubin), "", cmd, 0.0, False, "k", "sm_90")


def test_an_nvcc_build_without_its_source_is_rejected_as_unreadable(tmp_path):
    v = object_check.check_build(_nvcc_build(tmp_path, None))
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail.startswith("built object: the source of an nvcc build cannot be read ([Errno 2] ")
    assert v.detail.endswith(f"'{tmp_path / 'kernel.cu'}')")


def test_an_nvcc_builds_host_problems_are_the_verdict_and_decided_once_per_source(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(object_check, "cuda_host_problems",
                        lambda source, arch: calls.append((source, arch)) or ["its host code calls _ZN1A1fEv", "x"])
    b = _nvcc_build(tmp_path, "// host code\n")
    v = object_check.check_build(b)
    assert (v.ok, v.reason, v.detail) == (False, "static_check", "built object: its host code calls A::f(); x")
    assert object_check.check_build(b) is v and calls == [("// host code\n", "sm_90")]
    other = tmp_path / "other"
    other.mkdir()
    assert object_check.check_build(_nvcc_build(other, "// other code\n")).detail.startswith("built object: its")
    assert len(calls) == 2  # another source: decided afresh


def test_an_nvcc_build_with_clean_host_code_passes(tmp_path, monkeypatch):
    monkeypatch.setattr(object_check, "cuda_host_problems", lambda source, arch: [])
    assert object_check.check_build(_nvcc_build(tmp_path, "// device code only\n")) is None


def test_an_nvcc_host_side_that_cannot_be_built_is_a_verdict(tmp_path, monkeypatch):
    def fail(source, arch):
        raise RuntimeError("nvcc -c failed: boom")

    monkeypatch.setattr(object_check, "cuda_host_problems", fail)
    v = object_check.check_build(_nvcc_build(tmp_path, "// x\n"))
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail == "built object: the host side of this CUDA source could not be built for checking: nvcc -c failed: boom"


def test_a_rejected_cubin_is_the_verdict_before_any_host_check(tmp_path, monkeypatch):
    monkeypatch.setattr(object_check, "cuda_host_problems", lambda source, arch: pytest.fail("host check ran"))
    b = _nvcc_build(tmp_path, "// x\n")
    Path(b.path).write_bytes(CUBIN[:18] + (62).to_bytes(2, "little") + CUBIN[20:])  # an x86-64 header
    assert object_check.check_build(b).detail == "built object: expected a cubin (CUDA ELF), found machine type 62"


def test_cpu_builds_are_judged_by_their_object_alone(tmp_path, monkeypatch):
    from forge_pack.evaluate.compile import Build

    monkeypatch.setattr(object_check, "cuda_host_problems", lambda source, arch: pytest.fail("host check ran"))
    so = build(tmp_path, KERNEL)
    (tmp_path / "kernel.cu").write_text("// never read\n")
    assert object_check.check_build(Build(True, "cpu", str(so), "", "g++", 0.0, False, "k")) is None


def _host(undefined=(), init=0, fini=0, tls=False, ifunc=(), syscalls=()):
    return object_check.HostObject(frozenset(undefined), init, fini, tls, tuple(ifunc), tuple(syscalls))


def test_cuda_host_problems_are_what_the_source_adds_to_an_empty_kernels_host_object(monkeypatch):
    base = _host(undefined={"__cudaRegisterFunction", "atexit"}, init=8, fini=8)
    objects = {object_check._HOST_BASELINE_SOURCE: base}
    seen = []

    def fake(source, arch):
        seen.append((source[:10], arch))
        return objects[source]

    monkeypatch.setattr(object_check, "_nvcc_host_object", fake)
    monkeypatch.setattr(object_check, "_host_baselines", {})
    objects["clean"] = _host(undefined={"__cudaRegisterFunction", "atexit", "expf"}, init=8, fini=8)
    assert object_check.cuda_host_problems("clean", "sm_90") == []
    objects["all"] = _host(undefined={"atexit", "system", "dlopen", "expf"}, init=16, fini=8, tls=True,
                           ifunc=("pick_a", "pick_b"), syscalls=[f"0f 05 (`syscall`) at f+{i:#x}" for i in range(8)])
    assert object_check.cuda_host_problems("all", "sm_90") == [
        "its host code calls or references dlopen, system (a CUDA candidate is device code: no host functions, no "
        "host globals with initialisers)",
        "its host code runs when the package loads or unloads (a global object with a constructor or destructor, "
        "`__attribute__((constructor))`): a CUDA candidate is device code",
        "its host code has thread-local storage",
        "its host code has IFUNC resolvers (pick_a, pick_b)",
        "its host code holds system-call bytes " + ", ".join(f"0f 05 (`syscall`) at f+{i:#x}" for i in range(6)),
    ]
    objects["fini"] = _host(fini=16)
    assert object_check.cuda_host_problems("fini", "sm_90") == [
        "its host code runs when the package loads or unloads (a global object with a constructor or destructor, "
        "`__attribute__((constructor))`): a CUDA candidate is device code"]
    # the baseline is built once per architecture
    assert [s for s in seen if s[0] == object_check._HOST_BASELINE_SOURCE[:10]] == [
        (object_check._HOST_BASELINE_SOURCE[:10], "sm_90")]
    objects["clean_b"] = objects["clean"]
    object_check.cuda_host_problems("clean_b", "sm_100")
    assert seen[-2:] == [(object_check._HOST_BASELINE_SOURCE[:10], "sm_100"), ("clean_b", "sm_100")]


NVCC_HOST_CU = """
#include <cstdlib>
struct Hello { Hello() { std::system("true"); } ~Hello() {} };
static Hello hello;
static thread_local int counter;
extern "C" int bump() { return ++counter; }
extern "C" void raw() { asm volatile("syscall" ::: "rcx", "r11", "memory"); }
asm(".text\\n.byte 0x90, 0x0f, 0x05\\n");
extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.f; }
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_the_nvcc_host_object_lists_imports_load_time_code_tls_and_system_call_bytes():
    obj = object_check._nvcc_host_object(NVCC_HOST_CU, "sm_90")  # one nvcc run (~2 s): mutation reruns it
    assert {"system", "__cxa_atexit", "__cudaRegisterFunction"} <= obj.undefined
    assert "bump" not in obj.undefined and "raw" not in obj.undefined and "" not in obj.undefined
    # .init_array: the static object's constructor and nvcc's fatbinary registration, 8 bytes each
    assert (obj.init_bytes, obj.fini_bytes, obj.tls, obj.ifunc) == (16, 0, True, ())
    # one inside a function, one in .text outside any function symbol
    assert obj.syscalls == ("0f 05 (`syscall`) at .text", "0f 05 (`syscall`) at raw+0x0")
    with pytest.raises(RuntimeError) as e:
        object_check._nvcc_host_object("".join(f"this is not C++ {i};\n" for i in range(200)), "sm_90")
    # the last 1500 characters of nvcc's own text (not its bytes' repr), after a fixed prefix
    msg = str(e.value)
    assert msg.startswith("nvcc -c failed: ") and len(msg) == len("nvcc -c failed: ") + 1500
    assert "error" in msg and "\n" in msg and "\\n" not in msg


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_the_nvcc_host_object_looks_for_system_call_bytes_in_code_only():
    src = 'extern "C" const unsigned char table[] = {0x0f, 0x05, 0x0f, 0x34};\n' + object_check._HOST_BASELINE_SOURCE
    assert object_check._nvcc_host_object(src, "sm_90").syscalls == ()


def test_without_nvcc_the_host_object_cannot_be_built(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="^nvcc is not on PATH$"):
        object_check._nvcc_host_object(object_check._HOST_BASELINE_SOURCE, "sm_90")


def _elf_with_relative(*pairs):
    from types import SimpleNamespace

    oc = object_check
    return SimpleNamespace(machine=oc.EM_X86_64,
                           relocations=lambda: [(addr, oc.R_RELATIVE[oc.EM_X86_64], 0, target) for addr, target in pairs])


def test_array_targets_names_each_constructor_once_and_leaves_the_toolchains_out():
    oc = object_check
    elf = _elf_with_relative((0x100, 1), (0x108, 2), (0x110, 1), (0x200, 3), (0x208, 4))
    names = {1: "make_table+0x0", 2: "frame_dummy", 3: "__do_global_dtors_aux", 4: "drop_table+0x4"}
    dyn = {oc.DT_INIT_ARRAY: 0x100, oc.DT_INIT_ARRAYSZ: 24, oc.DT_FINI_ARRAY: 0x200, oc.DT_FINI_ARRAYSZ: 16}
    assert oc._array_targets(elf, dyn, names.get) == "make_table, drop_table"
    # no .fini_array at all, and an .init_array whose address entry is missing (address 0)
    elf = _elf_with_relative((0x0, 1), (0x8, 4))
    assert oc._array_targets(elf, {oc.DT_INIT_ARRAYSZ: 16}, names.get) == "make_table, drop_table"
    assert oc._array_targets(elf, {}, names.get) == ""


# ---------------------------------------------------------------- problems(), on patched objects

def _parsed(tmp_path, source=KERNEL):
    so = build(tmp_path, source)
    data = bytearray(so.read_bytes())
    return data, object_check.Elf.parse(bytes(data))


def _func(elf, name):
    return next(s for s in elf.symbols(object_check.SHT_SYMTAB) if s.name == name)


def _file_offset(elf, vaddr):
    seg = next(s for s in elf.segments if s.type == object_check.PT_LOAD and s.vaddr <= vaddr < s.vaddr + s.filesz)
    return seg.offset + vaddr - seg.vaddr


def _problems(data):
    return object_check.problems(bytes(data), object_check.baseline())


def _unlisted(monkeypatch):
    """Every hit left to the plain byte rule (as without objdump): these tests are about placing and counting."""
    monkeypatch.setattr(object_check.x86_listing, "inside_instructions", lambda data, hits, code: (set(), "unlisted"))


def test_more_than_six_system_call_sites_are_counted_after_the_first_six(tmp_path, monkeypatch):
    _unlisted(monkeypatch)
    data, elf = _parsed(tmp_path)
    k = _func(elf, "k")
    at = _file_offset(elf, k.value)
    for i in range(8):
        data[at + 4 * i:at + 4 * i + 2] = b"\x0f\x05"
    found = _problems(data)
    assert found == ["system-call bytes 0f 05 (`syscall`) at " + ", ".join(f"k+{4 * i:#x}" for i in range(6))
                     + " and 2 more: a kernel makes no system calls (inline asm) (unlisted)"]


def test_system_call_bytes_outside_any_function_name_their_section(tmp_path, monkeypatch):
    _unlisted(monkeypatch)
    data, elf = _parsed(tmp_path)
    plt = next(s for s in elf.sections if s.name == ".plt")
    data[plt.offset + 1:plt.offset + 3] = b"\x0f\x05"
    assert _problems(data)[0].startswith(f"system-call bytes 0f 05 (`syscall`) at .plt@{plt.addr + 1:#x}: ")
    init = _func(elf, "_init") if any(s.name == "_init" for s in elf.symbols(object_check.SHT_SYMTAB)) else None
    assert init is not None and init.size == 0  # crtstuff's _init carries no size: named by its start
    data2, _ = _parsed(tmp_path)
    data2[_file_offset(elf, init.value):_file_offset(elf, init.value) + 2] = b"\x0f\x05"
    assert _problems(data2)[0].startswith("system-call bytes 0f 05 (`syscall`) at _init: ")


def test_aarch64_objects_are_searched_for_svc_words_on_instruction_boundaries(tmp_path):
    data, elf = _parsed(tmp_path)
    data[18:20] = object_check.EM_AARCH64.to_bytes(2, "little")
    k = _func(elf, "k")
    seg = next(s for s in elf.segments if s.type == object_check.PT_LOAD and s.flags & object_check.PF_X)
    first = (k.value - seg.vaddr + 3) // 4 * 4  # 4-aligned within the segment, as AArch64 code is
    at = seg.offset + first
    for word in (0, 2):
        data[at + 4 * word:at + 4 * word + 4] = (0xD4000001 | (7 << 5)).to_bytes(4, "little")  # svc #7
    data[at + 13:at + 17] = (0xD4000001).to_bytes(4, "little")  # not on a 4-byte boundary: not an instruction
    off = seg.vaddr + first - k.value
    found = _problems(data)
    assert f"`svc` (system call) at k+{off:#x}, k+{off + 8:#x}: a kernel makes no system calls" in found, found
    assert not any("0f 05" in f for f in found)


def test_an_unknown_machine_type_is_named():
    data = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    data[18:20] = (40).to_bytes(2, "little")
    assert object_check.problems(bytes(data), object_check.baseline()) == [
        "machine type 40 is not one the object check knows (x86-64, AArch64)"]


def test_an_object_whose_dynamic_symbol_table_is_relabelled_cannot_be_checked(tmp_path):
    data, elf = _parsed(tmp_path)
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    idx = next(i for i, s in enumerate(elf.sections) if s.type == object_check.SHT_DYNSYM)
    data[shoff + idx * shentsize + 4:shoff + idx * shentsize + 8] = (1).to_bytes(4, "little")  # SHT_PROGBITS
    assert _problems(data) == ["it has no dynamic symbol table, so its imports cannot be checked"]


def test_a_library_beyond_the_compiler_runtime_is_named(tmp_path):
    src, out = tmp_path / "k.cpp", tmp_path / "k.so"
    src.write_text(KERNEL)
    res = subprocess.run(["g++", *CPU_FLAGS, "-o", str(out), str(src), "-Wl,--no-as-needed", "-lanl", "-lresolv"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert object_check.check_object(out).detail == (
        "built object: it links libraries beyond the compiler's runtime: libanl.so.1, libresolv.so.2")


def test_relocations_are_read_entry_by_entry_as_readelf_lists_them(tmp_path):
    so = build(tmp_path, 'int g[4];\nint* p[3] = {&g[0], &g[1], &g[3]};\nextern "C" int* k(int i) { return p[i]; }\n')
    elf = object_check.Elf.parse(so.read_bytes())
    mine = {(off, (sym << 32) | typ) for off, typ, sym, _ in elf.relocations()}
    listed = subprocess.run(["readelf", "-rW", str(so)], capture_output=True, text=True).stdout
    theirs = {(int(f[0], 16), int(f[1], 16)) for f in (line.split() for line in listed.splitlines())
              if len(f) > 2 and all(c in "0123456789abcdef" for c in f[0] + f[1]) and len(f[0]) == 16}
    assert mine == theirs and len(elf.relocations()) == len(theirs) >= 3


def test_unreadable_or_foreign_artifacts_are_rejecting_verdicts_with_exact_details(tmp_path):
    v = object_check.check_object(tmp_path / "missing.so")
    assert (v.ok, v.reason) == (False, "static_check")
    assert v.detail == f"built object: cannot be read ([Errno 2] No such file or directory: '{tmp_path / 'missing.so'}')"
    text = tmp_path / "text.cubin"
    text.write_bytes(b"not an elf at all, just text" * 4)
    v = object_check.check_object(text, "cuda")
    assert (v.ok, v.detail) == (False, "built object: not a readable ELF64 object (not an ELF file)")
    high = tmp_path / "high.cubin"
    high.write_bytes(CUBIN[:18] + (0xBEEF).to_bytes(2, "little") + CUBIN[20:])
    v = object_check.check_object(high, "cuda")
    assert (v.ok, v.detail) == (False, "built object: expected a cubin (CUDA ELF), found machine type 48879")


def test_a_decision_is_remembered_whether_it_passes_or_rejects(tmp_path, monkeypatch):
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(b"junk")
    first = object_check.check_object(bad, "cuda")
    monkeypatch.setattr(object_check, "_decide", lambda data, backend: pytest.fail("decided twice"))
    assert object_check.check_object(bad, "cuda") is first and not first.ok
