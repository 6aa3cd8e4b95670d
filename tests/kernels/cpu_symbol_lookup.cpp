// expect: static_check
// Cheat: looks a function up by name at run time with dlsym, declared by hand (no <dlfcn.h>),
// to reach whatever the worker process has loaded (libc, libpython, libtorch) without importing
// it. Here it fetches sched_yield and calls it through the pointer. Guard: the built object
// imports `dlsym`, which is not on the allow-list.
#include <cmath>
extern "C" void* dlsym(void* handle, const char* name);
extern "C" void softmax_lookup(const float* x, float* out, long long rows, long long cols) {
  using fn_t = int (*)();
  fn_t yield = (fn_t)dlsym(nullptr, "sched_yield");  // nullptr is RTLD_DEFAULT: every loaded object
  if (yield) yield();
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_lookup", "args": ["x", "out", "rows", "cols"]}]}
*/
