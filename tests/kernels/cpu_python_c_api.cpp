// expect: static_check
// Cheat: reaches into the Python interpreter that hosts the kernel, through C API functions
// declared by hand (no Python.h), and replaces time.perf_counter with a clock that runs slow, so
// every timing looks faster than it is. Guard: the built object's undefined symbols are held to an
// allow-list (math, OpenMP, memory, the C++ runtime); the Py* imports reject it before it loads.
#include <cmath>
extern "C" {
int PyGILState_Ensure(void);
void PyGILState_Release(int);
void* PyImport_ImportModule(const char*);
void* PyObject_GetAttrString(void*, const char*);
int PyObject_SetAttrString(void*, const char*, void*);
}
static void slow_down_the_clock() {
  int gil = PyGILState_Ensure();
  void* time_mod = PyImport_ImportModule("time");
  void* thread_time = time_mod ? PyObject_GetAttrString(time_mod, "thread_time") : nullptr;
  if (thread_time) PyObject_SetAttrString(time_mod, "perf_counter", thread_time);
  PyGILState_Release(gil);
}
extern "C" void softmax_clockwork(const float* x, float* out, long long rows, long long cols) {
  static bool patched = false;
  if (!patched) { slow_down_the_clock(); patched = true; }
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_clockwork", "args": ["x", "out", "rows", "cols"]}]}
*/
