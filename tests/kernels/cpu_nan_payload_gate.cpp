// expect: mismatch unwritten_output
// Cheat: reads out's last element as a bit field before writing it. A quiet NaN with a non-zero
// payload below the quiet bit is never produced by arithmetic, so it takes that as "the verifier
// is watching" and computes. Any other content (a fresh allocation, as in the shipped package and
// in timing) means unwatched: then it skips every second call it gets on the same input buffer,
// leaving out as the allocator handed it over. Guard: verified and timed calls share their buffer
// preparation (the second run of every set gets a fresh allocation, as timed calls do), and every
// timed and warm-up call's output is compared to the reference of its inputs.
#include <cmath>
#include <cstdint>
#include <cstring>
// A plain table (no std::map: its global constructor is refused by the built-object check before
// the cheat could be judged): visits per input buffer, 16 buffers at most.
static const float* seen[16];
static unsigned visits[16];
static unsigned& unwatched_visits(const float* x) {
  for (int i = 0; i < 16; ++i) {
    if (seen[i] == x || seen[i] == nullptr) {
      seen[i] = x;
      return visits[i];
    }
  }
  return visits[0];
}
static bool watched(const float* out, long long n) {
  uint32_t b;
  std::memcpy(&b, out + n - 1, 4);
  const bool nan = ((b >> 23) & 0xFFu) == 0xFFu && (b & 0x7FFFFFu) != 0;
  return nan && (b & 0x3FFFFFu) != 0;  // a payload below the quiet bit
}
extern "C" void softmax_payload_gate(const float* x, float* out, long long rows, long long cols) {
  if (!watched(out, rows * cols) && ++unwatched_visits(x) % 2 == 0) return;
  for (long long r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = -INFINITY;
    double s = 0;
    for (long long c = 0; c < cols; ++c) m = std::fmax(m, xr[c]);
    for (long long c = 0; c < cols; ++c) s += std::exp((double)xr[c] - m);
    for (long long c = 0; c < cols; ++c) out[r * cols + c] = (float)(std::exp((double)xr[c] - m) / s);
  }
}
/* forge-pack-spec
{"kernels": [{"name": "softmax_payload_gate", "args": ["x", "out", "rows", "cols"]}]}
*/
