// expect: static_check
// Cheat: a global object whose constructor runs when the object is loaded (outside every call)
// and whose destructor runs at unload: work nobody times or checks. Guard: g++ emits an
// initialiser (_GLOBAL__sub_I_...) in .init_array and registers the destructor with
// __cxa_atexit; both reject the built object.
#include <cmath>
struct Warmup {
  float scale[64];
  Warmup() { for (int i = 0; i < 64; ++i) scale[i] = 1.0f / (1.0f + std::sqrt((float)i)); }
  ~Warmup() { for (int i = 0; i < 64; ++i) scale[i] = 0.f; }
};
static Warmup warm;
extern "C" void softmax_warm(const float* x, float* out, long long rows, long long cols) {
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY; double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
  out[0] += warm.scale[63] * 0.f;
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_warm", "args": ["x", "out", "rows", "cols"]}]}
*/
