// The per-(query, KV head) kernel of attention_quant.h, compiled once per
// ISA (attention_quant.cpp: the baseline; attention_quant_avx2.cpp: AVX2 +
// FMA + F16C) inside namespace RILL_QUANT_ISA. Plain loops: the compiler
// vectorizes the dequantizers, the 8-way dot and the V axpy for the ISA.
#include <cmath>
#include <cstring>
#include <limits>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "backend/cpu/attention_quant.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"
#include "core/half.h"

namespace rill::cpu::detail::RILL_QUANT_ISA {

inline void dq_f32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
inline void dq_f16(const uint8_t* src, float* dst, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}
inline void dq_bf16(const uint8_t* src, float* dst, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}
inline void dq_q8_0(const uint8_t* src, float* dst, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}
inline void dq_q4_0(const uint8_t* src, float* dst, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}
// GGML's IQ4_NL blocks (the rotated iq4_nlh): x = d * kIq4nlValues[q].
inline void dq_iq4_nl(const uint8_t* src, float* dst, int64_t n) {
  const auto* b = reinterpret_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(kIq4nlValues[b[i].qs[j] & 0xF]) * d;
      dst[j + kQK / 2] = static_cast<float>(kIq4nlValues[b[i].qs[j] >> 4]) * d;
    }
  }
}
// iq4_nlh64's blocks of 64 (kKvIq4Nl64, backend/cpu/kv_quant.h): x =
// e4m3_value(byte 0) / 16 * kIq4nlValues[q].
inline void dq_iq4_nl64(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / 64; ++i, dst += 64, src += 33) {
    const float d = e4m3_value_fast(src[0]) * (1.0f / 16.0f);
    for (int j = 0; j < 32; ++j) {
      dst[j] = static_cast<float>(kIq4nlValues[src[1 + j] & 0xF]) * d;
      dst[j + 32] = static_cast<float>(kIq4nlValues[src[1 + j] >> 4]) * d;
    }
  }
}
// q8_0h64's blocks of 64 (kKvQ8_0x64, backend/cpu/kv_quant.h): x = f16 d
// (bytes 0..1) * int8 q (bytes 2..65).
inline void dq_q8_0x64(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / 64; ++i, dst += 64, src += 66) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const float d = f16_to_f32(h);
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < 64; ++j) dst[j] = static_cast<float>(q[j]) * d;
  }
}
inline void dq_q4_1(const uint8_t* src, float* dst, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      dst[j + kQK / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}
inline void dq_q5_0(const uint8_t* src, float* dst, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) << 4) & 0x10;
      const int h1 = static_cast<int>(qh >> (j + 12)) & 0x10;
      dst[j] = static_cast<float>(((b[i].qs[j] & 0xF) | h0) - 16) * d;
      dst[j + kQK / 2] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}
inline void dq_q5_1(const uint8_t* src, float* dst, int64_t n) {
  const auto* b = reinterpret_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0; i < n / kQK; ++i, dst += kQK) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) << 4) & 0x10;
      const int h1 = static_cast<int>(qh >> (j + 12)) & 0x10;
      dst[j] = static_cast<float>((b[i].qs[j] & 0xF) | h0) * d + m;
      dst[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

// fp8 (kF8E4M3, core/e4m3.h): a byte per element, exact in f32
// (e4m3_to_f32). The AVX2 build does 8 at a time in lanes (e4m3_to_f32's
// arithmetic; GCC's -O2 vectorizer leaves the scalar loop scalar, 17x
// q8_0's attention time), the rest and the baseline build one at a time.
inline void dq_fp8(const uint8_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256i low7 = _mm256_set1_epi32(0x7F), bias = _mm256_set1_epi32(120 << 23);
  const __m256 nan = _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN());
  for (; i + 8 <= n; i += 8) {
    int64_t raw;
    std::memcpy(&raw, src + i, 8);
    const __m256i u = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(raw));
    const __m256i mag = _mm256_and_si256(u, low7);
    const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(mag, 20), bias));
    const __m256 sub =
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(mag, _mm256_set1_epi32(7))), _mm256_set1_ps(1.0f / 512.0f));
    __m256 v = _mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
    v = _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, low7)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign)));
  }
#endif
  for (; i < n; ++i) dst[i] = e4m3_to_f32(src[i]);
}

inline KvDequant dequant_for(DType t) {
  if (t == kF8E4M3) return dq_fp8;
  if (t == kKvIq4Nl64) return dq_iq4_nl64;
  if (t == kKvQ8_0x64) return dq_q8_0x64;
  switch (t) {
    case DType::kF32:
      return dq_f32;
    case DType::kF16:
      return dq_f16;
    case DType::kBF16:
      return dq_bf16;
    case DType::kQ8_0:
      return dq_q8_0;
    case DType::kQ4_0:
      return dq_q4_0;
    case DType::kQ4_1:
      return dq_q4_1;
    case DType::kQ5_0:
      return dq_q5_0;
    case DType::kQ5_1:
      return dq_q5_1;
    case DType::kIQ4_NL:
      return dq_iq4_nl;
    default:
      return nullptr;
  }
}

// 8 partial sums in a fixed order (vectorizable without reassociation).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[d + k] * b[d + k];
  }
  for (; d < n; ++d) acc[d & 7] += a[d] * b[d];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

inline void attend(const QuantAttendArgs& a) {
  const int64_t n = a.j_end - a.j_begin, hd = a.head_dim;
  alignas(64) float buf[4096];
  const float* krow = buf + a.k_head_elem;  // the head within buf
  const float* vrow = buf + a.v_head_elem;
  for (int64_t j = a.j_begin; j < a.j_end; ++j) {
    a.k_dequant(a.kv.k_row(j), buf, a.k_row_elems > 0 ? a.k_row_elems : hd);
    for (int g = 0; g < a.n_heads; ++g) {
      float x = dot(a.q + g * hd, krow, hd) * a.scale;
      if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
      a.scores[g * n + (j - a.j_begin)] = x;
    }
  }
  for (int g = 0; g < a.n_heads; ++g) {
    float* s = a.scores + g * n;
    float max = -INFINITY;
    for (int64_t j = 0; j < n; ++j) max = s[j] > max ? s[j] : max;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - max);
      sum += s[j];
    }
    const auto inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < n; ++j) s[j] *= inv;
    float* o = a.out + g * hd;
    for (int64_t d = 0; d < hd; ++d) o[d] = 0.0f;
  }
  for (int64_t j = a.j_begin; j < a.j_end; ++j) {
    a.v_dequant(a.kv.v_row(j), buf, a.v_row_elems > 0 ? a.v_row_elems : hd);
    for (int g = 0; g < a.n_heads; ++g) {
      const float p = a.scores[g * n + (j - a.j_begin)];
      float* o = a.out + g * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] += p * vrow[d];
    }
  }
}

}  // namespace rill::cpu::detail::RILL_QUANT_ISA
