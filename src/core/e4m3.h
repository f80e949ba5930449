#pragma once
// OCP FP8 e4m3 ("fn": no infinities; 0x7f / 0xff are NaN): the element of
// the CUDA fp8 KV type (kF8E4M3, backend/cuda/kv_types.cuh), and its
// conversions on the host, for dequantizing its rows and for references in
// tests.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/dtype.h"

namespace rill {

// The KV-only dtype of fp8 KV (model/kv_types.h "fp8"): one e4m3 byte per
// element, no stored scale. Not a GGML id (GGML has no e4m3 type) and not
// an enumerator of DType: dtype_info(uint32_t), which checks GGUF tensor
// types, refuses it; dtype_info(DType) describes it (F8_E4M3, a byte an
// element). Like cuda::kFp8Rows, a value only rill's own code carries.
inline constexpr DType kF8E4M3 = static_cast<DType>(0x4538);  // "E8"

// KV-only block types of the 4-bit per-channel KV type k4c (model/kv_types.h;
// layouts in backend/cpu/kv_quant.h), carried like kF8E4M3:
// dtype_info(DType) describes them, dtype_info(uint32_t) refuses them.
// kKvQ4Chan ("Q4_CHAN"): K of a KV block of 32 tokens, per channel an f16
// zero, an e4m3 step and 32 nibbles: 19 bytes per channel per 32 tokens
// (block_size 32 / block_bytes 19 make row_bytes() the bytes per token).
// kKvIq4Nl64 ("IQ4_NL64"): a row in blocks of 64, an e4m3 scale and 64
// IQ4_NL nibbles each (33 bytes).
inline constexpr DType kKvQ4Chan = static_cast<DType>(0x4334);  // "4C"
// kKvQ4Alloc ("Q4_ALLOC", q4a of the pair k4a): q4c's block with each
// channel at its own width (bit planes, backend/cpu/kv_alloc.h), the
// layer's widths summing to 4 per channel: the same 19 bytes per channel
// per 32 tokens.
inline constexpr DType kKvQ4Alloc = static_cast<DType>(0x4134);  // "4A"
// K types encoded per channel over a KV block of 32 tokens (q4c, q4a):
// the flow of k4c (q8_0 tails, blocks encoded once complete, the sink key).
inline constexpr bool kv_chan_k(DType t) {
  return t == kKvQ4Chan || t == kKvQ4Alloc;
}
inline constexpr DType kKvIq4Nl64 = static_cast<DType>(0x4E36);  // "6N"
// kKvQ8_0x64 ("Q8_0_64", the rotated q8_0h64 only; not e4m3, but the
// KV-only block types are declared together): q8_0's block stretched to 64
// values, an f16 scale and 64 int8 codes -127..127 (66 bytes, 8.25 bits a
// value against q8_0's 8.5: 1.939x f16's tokens per GiB, q8_0's 1.882x).
inline constexpr DType kKvQ8_0x64 = static_cast<DType>(0x3838);  // "88"

// The value of an e4m3 byte.
inline float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// e4m3_value without branches or calls, so a loop over bytes vectorizes
// (the CPU's fp8 KV rows; e4m3_value's ldexp made fp8 attention 17x slower
// than q8_0's): the magnitude's 7 bits shifted to an f32's exponent and
// mantissa positions with the bias moved from 7 to 127 for normal codes,
// m * 2^-9 for subnormal ones (exact in f32 both), the sign bit copied. The
// same value as e4m3_value for every code (0x7f / 0xff: NaN, as there;
// 0xff keeps its sign bit).
inline float e4m3_to_f32(uint8_t b) {
  const uint32_t mag = b & 0x7Fu;
  const uint32_t normal_bits = (mag << 20) + (120u << 23);
  float normal, out;
  std::memcpy(&normal, &normal_bits, 4);
  const float subnormal = static_cast<float>(mag & 7u) * (1.0f / 512.0f);
  float v = (mag >> 3) == 0 ? subnormal : normal;
  v = mag == 0x7Fu ? std::numeric_limits<float>::quiet_NaN() : v;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits |= static_cast<uint32_t>(b & 0x80u) << 24;
  std::memcpy(&out, &bits, 4);
  return out;
}

// e4m3_value of every byte, by index (hot loops: the KV scales of k4c).
inline const float* e4m3_values() {
  struct Table {
    float v[256];
    Table() {
      for (int i = 0; i < 256; ++i) v[i] = e4m3_value(static_cast<uint8_t>(i));
    }
  };
  static const Table table;
  return table.v;
}
inline float e4m3_value_fast(uint8_t b) {
  return e4m3_values()[b];
}

// x rounded to the nearest e4m3 value, ties to the even code, saturating at
// +-448 (what cvt.rn.satfinite.e4m3x2.f32 does on the device); NaN -> 0x7f.
inline uint8_t e4m3_round(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormals, steps of 2^-9 (code 8 is 2^-6 itself)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int ex = 0;
  const float f = std::frexp(a, &ex);                   // a = f 2^ex, f in [0.5, 1)
  int m = static_cast<int>(std::nearbyint(f * 16.0f));  // 8 .. 16: the mantissa with its leading 1, rounded
  int e = ex - 1 + 7;                                   // biased exponent, 1 .. 15
  if (m == 16) {
    m = 8;
    ++e;
  }
  return sign | static_cast<uint8_t>((e << 3) | (m - 8));
}

}  // namespace rill
