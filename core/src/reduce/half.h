// Scalar IEEE conversions between f32 and the 16-bit float formats, round-to-nearest-even.
// Exact and branchy; the vector paths in reduce_impl.cc use F16C where the CPU has it and agree
// with these bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace chorus::reduce {

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: mant * 2^-24 is exact in f32
    bits = std::bit_cast<uint32_t>(float(mant) * 0x1p-24f) | sign;
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN, quieted
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);                         // >= 65520 rounds to infinity
  if (ax < 0x38800000u) {                                                         // below 2^-14: subnormal or zero
    float scaled = std::bit_cast<float>(ax) * 0x1p24f;                            // exact
    return uint16_t(sign | uint32_t(std::nearbyint(scaled)));                     // 0x400 is the smallest normal
  }
  uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t nan = (x >> 16) | 0x40u;
  uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return uint16_t((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace chorus::reduce
