// expect: static_check
// Cheat: runs a shell command from the kernel under a harmless-looking name: the declaration's asm
// label binds `note_progress` to libc's `system`, so the source never spells a call to it (here
// the command is the shell's no-op; it could be anything the worker may do). Guard: the built
// object imports `system`, which is not on the allow-list.
#include <cmath>
extern "C" int note_progress(const char* message) __asm__("system");
extern "C" void softmax_reporting(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
  if (rows < 0) note_progress(": forge-pack fixture, never reached");
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_reporting", "args": ["x", "out", "rows", "cols"]}]}
*/
