// forge_cpu.h: helpers for forge-pack CPU kernels (C++17, no dependencies).
// bf16 and f16 tensors arrive as 16-bit raw values (`const uint16_t*`, or the layout-identical
// forge_bf16 / forge_f16 wrappers below, which let overloads tell the two formats apart).
// Conversions round to nearest even and keep NaN a NaN, like the CUDA intrinsics.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

struct forge_bf16 { uint16_t bits; };
struct forge_f16 { uint16_t bits; };
static_assert(sizeof(forge_bf16) == 2 && sizeof(forge_f16) == 2, "16-bit wrappers must stay 2 bytes");

static inline float forge_bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline uint32_t forge_float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

static inline float forge_bf16_to_float(uint16_t b) { return forge_bits_to_float((uint32_t)b << 16); }

static inline uint16_t forge_float_to_bf16(float f) {
  uint32_t u = forge_float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // NaN stays (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (uint16_t)(u >> 16);
}

static inline float forge_f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return forge_bits_to_float(sign);
    exp = 113;  // subnormal: normalise
    while (!(mant & 0x400u)) { mant <<= 1; --exp; }
    mant &= 0x3ffu;
    return forge_bits_to_float(sign | (exp << 23) | (mant << 13));
  }
  if (exp == 31) return forge_bits_to_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return forge_bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

static inline uint16_t forge_float_to_f16(float f) {
  uint32_t u = forge_float_to_bits(f);
  const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;              // rounds to +-inf (>= 65520)
  if (u < 0x38800000u) {                                    // fp16 subnormal or zero
    const float scaled = forge_bits_to_float(u) * 16777216.0f;  // units of 2^-24, exact
    return sign | (uint16_t)std::nearbyint(scaled);          // default rounding: nearest even
  }
  uint16_t h = (uint16_t)((((u >> 23) - 112) << 10) | ((u >> 13) & 0x3ffu));
  const uint32_t rem = u & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry into the exponent is correct
  return sign | h;
}

// Overloads for templated kernels: to_float(x[i]) and forge_store(out + i, v) for every dtype.
static inline float to_float(float v) { return v; }
static inline float to_float(forge_bf16 v) { return forge_bf16_to_float(v.bits); }
static inline float to_float(forge_f16 v) { return forge_f16_to_float(v.bits); }
static inline void forge_store(float* p, float v) { *p = v; }
static inline void forge_store(forge_bf16* p, float v) { p->bits = forge_float_to_bf16(v); }
static inline void forge_store(forge_f16* p, float v) { p->bits = forge_float_to_f16(v); }
