// Scalar reference for block dequantization, activation quantization and
// quantized dot products. Fast paths are tested against this file.
#include <cassert>
#include <cmath>
#include <cstring>

#include "backend/cpu/quants.h"
#include "backend/cpu/quants_iq.h"
#include "core/e4m3.h"
#include "core/half.h"

namespace rill::cpu {

DType vec_dot_partner(DType w) {
  switch (w) {
    case DType::kQ4_0:
    case DType::kQ5_0:
    case DType::kQ8_0:
    case DType::kMXFP4:
    case DType::kIQ4_NL:
      return DType::kQ8_0;
    case DType::kQ4_1:
    case DType::kQ5_1:
      return DType::kQ8_1;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_XS:
      return DType::kQ8_K;
    default:
      return DType::kF32;
  }
}

namespace ref {
namespace {

inline float h2f(uint16_t h) {
  return f16_to_f32(h);
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// llama.cpp's nearest_int: round half to even through the float magic number.
inline int nearest_int(float fval) {
  assert(std::fabs(fval) <= 4194303.f);
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + kQK / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[j] = static_cast<float>(((b[i].qs[j] & 0xF) | h0) - 16) * d;
      y[j + kQK / 2] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d), m = h2f(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) | h0) * d + m;
      y[j + kQK / 2] = static_cast<float>((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q8_1(const BlockQ8_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = h2f(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < kQKK; j += 64, q += 32) {
      uint8_t sc, mn;
      unpack_scale_min_k4(j / 32, b[i].scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      unpack_scale_min_k4(j / 32 + 1, b[i].scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQKK; j += 64, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, mn;
      unpack_scale_min_k4(j / 32, b[i].scales, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      unpack_scale_min_k4(j / 32 + 1, b[i].scales, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

// The 6-bit value of element e (0..255) of a Q6_K block, minus 32.
inline int q6_value(const BlockQ6_K& b, int e) {
  const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
  const uint8_t* ql = b.ql + half * 64;
  const uint8_t* qh = b.qh + half * 32;
  const int low = (quarter & 1) ? 32 : 0;  // quarters 1,3 use ql[l + 32]
  const int nib = (quarter >= 2) ? (ql[l + low] >> 4) : (ql[l + low] & 0xF);
  const int hi = (qh[l] >> (2 * quarter)) & 3;
  return (nib | (hi << 4)) - 32;
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const float d = h2f(b[i].d);
    for (int e = 0; e < kQKK; ++e) y[e] = d * static_cast<float>(b[i].scales[e / 16]) * q6_value(b[i], e);
  }
}

void dequant_q8_k(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK)
    for (int j = 0; j < kQKK; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

// Shared by Q8_0 and Q8_1: the block scale and quantized values; returns sum(q).
inline int quantize_block_q8(const float* x, float* d_out, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int j = 0; j < kQK; ++j) {
    qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));  // default mode: half to even
    sum += qs[j];
  }
  *d_out = d;
  return sum;
}

// Sum over a classic block of w-value * a-value, as integers.
template <typename GetW>
inline int block_isum(GetW get_w, const int8_t* a) {
  int s = 0;
  for (int j = 0; j < kQK; ++j) s += get_w(j) * a[j];
  return s;
}

inline int q4_nib(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
}
inline int q5_val(const uint8_t* qs, uint32_t qh, int j) {
  return q4_nib(qs, j) | static_cast<int>(((qh >> j) & 1) << 4);
}

float dot_q4_0(int64_t nb, const BlockQ4_0* x, const BlockQ8_0* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const int s = block_isum([&](int j) { return q4_nib(x[i].qs, j) - 8; }, y[i].qs);
    sum += static_cast<float>(s) * (h2f(x[i].d) * h2f(y[i].d));
  }
  return sum;
}

// llama.cpp's ggml_vec_dot_mxfp4_q8_0: per block the integer sum of the
// doubled values times q, scaled by the halved e8m0 scale times y's d.
float dot_mxfp4(int64_t nb, const BlockMXFP4* x, const BlockQ8_0* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const int s = block_isum([&](int j) { return static_cast<int>(kMxfp4Values[q4_nib(x[i].qs, j)]); }, y[i].qs);
    sum += (e8m0_to_f32_half(x[i].e) * h2f(y[i].d)) * static_cast<float>(s);
  }
  return sum;
}

void dequant_mxfp4(const BlockMXFP4* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = e8m0_to_f32_half(b[i].e);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = d * static_cast<float>(kMxfp4Values[b[i].qs[j] & 0xF]);
      y[i * kQK + j + kQK / 2] = d * static_cast<float>(kMxfp4Values[b[i].qs[j] >> 4]);
    }
  }
}

float dot_q4_1(int64_t nb, const BlockQ4_1* x, const BlockQ8_1* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const int s = block_isum([&](int j) { return q4_nib(x[i].qs, j); }, y[i].qs);
    sum += (h2f(x[i].d) * h2f(y[i].d)) * static_cast<float>(s) + h2f(x[i].m) * h2f(y[i].s);
  }
  return sum;
}

float dot_q5_0(int64_t nb, const BlockQ5_0* x, const BlockQ8_0* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_u32(x[i].qh);
    const int s = block_isum([&](int j) { return q5_val(x[i].qs, qh, j) - 16; }, y[i].qs);
    sum += static_cast<float>(s) * (h2f(x[i].d) * h2f(y[i].d));
  }
  return sum;
}

float dot_q5_1(int64_t nb, const BlockQ5_1* x, const BlockQ8_1* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_u32(x[i].qh);
    const int s = block_isum([&](int j) { return q5_val(x[i].qs, qh, j); }, y[i].qs);
    sum += (h2f(x[i].d) * h2f(y[i].d)) * static_cast<float>(s) + h2f(x[i].m) * h2f(y[i].s);
  }
  return sum;
}

float dot_q8_0(int64_t nb, const BlockQ8_0* x, const BlockQ8_0* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const int s = block_isum([&](int j) { return static_cast<int>(x[i].qs[j]); }, y[i].qs);
    sum += static_cast<float>(s) * (h2f(x[i].d) * h2f(y[i].d));
  }
  return sum;
}

// Element e of a Q4_K/Q5_K super-block: within each 64-group, the first 32
// elements are low nibbles of 32 bytes, the next 32 the high nibbles.
inline int k4_nib(const uint8_t* qs, int e) {
  const uint8_t byte = qs[(e / 64) * 32 + e % 32];
  return (e % 64) < 32 ? (byte & 0xF) : (byte >> 4);
}

// Q4_K and Q5_K are defined per super-block as two exact int32s (not
// llama.cpp's vec_dot lanes): isum = sum over the 8 sub-blocks j of
// sc[j] * sum_{e in j} q[e] * a[e] (q unsigned; |isum| <= 256 * 31 * 127 * 63
// < 2^26) and msum = sum_j mn[j] * (bsums[2j] + bsums[2j+1]), then
// acc = fma(a.d * w.d, float(isum), acc); acc = fma(-a.d * w.dmin,
// float(msum), acc) over the super-blocks in order from acc = 0; the dot is
// acc. As for Q6_K below, the lane layout of a tile is then free.
// q: the super-block's 256 unsigned values.
inline float k4_superblock(const uint8_t* scales, uint16_t dh, uint16_t dminh, const BlockQ8_K& y, const int* q,
                           float acc) {
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, scales, &sc[j], &mn[j]);
  int32_t isum = 0, msum = 0;
  for (int j = 0; j < 8; ++j) {
    int32_t s = 0;
    for (int e = 32 * j; e < 32 * j + 32; ++e) s += q[e] * y.qs[e];
    isum += s * sc[j];
    msum += mn[j] * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
  }
  acc = std::fmaf(y.d * h2f(dh), static_cast<float>(isum), acc);
  return std::fmaf(-y.d * h2f(dminh), static_cast<float>(msum), acc);
}

float dot_q4_k(int64_t nb, const BlockQ4_K* x, const BlockQ8_K* y) {
  float acc = 0.0f;
  int q[kQKK];
  for (int64_t i = 0; i < nb; ++i) {
    for (int e = 0; e < kQKK; ++e) q[e] = k4_nib(x[i].qs, e);
    acc = k4_superblock(x[i].scales, x[i].d, x[i].dmin, y[i], q, acc);
  }
  return acc;
}

float dot_q5_k(int64_t nb, const BlockQ5_K* x, const BlockQ8_K* y) {
  float acc = 0.0f;
  int q[kQKK];
  for (int64_t i = 0; i < nb; ++i) {
    for (int e = 0; e < kQKK; ++e) {
      const int hbit = (x[i].qh[e % 32] >> (e / 32)) & 1;  // bit (2*(e/64) + half) of qh[l]
      q[e] = k4_nib(x[i].qs, e) | (hbit << 4);
    }
    acc = k4_superblock(x[i].scales, x[i].d, x[i].dmin, y[i], q, acc);
  }
  return acc;
}

// Q6_K is defined per super-block as ONE exact int32 (not llama.cpp's
// vec_dot lanes): isum = sum over the 16 sub-blocks j of
// sc[j] * sum_{e in j} (q[e] - 32) * a[e] (|isum| <= 256 * 32 * 127 * 128
// < 2^31, so any summation order gives the same integer), then
// acc = fma(a.d * w.d, float(isum), acc) over the super-blocks in order from
// acc = 0; the dot is acc. With the lane layout free, a tile can put rows or
// tokens in its vector lanes as suits it (gemm_kquant_rows_avx512_impl.h);
// every path of the type computes exactly this, so results never depend on
// the batch.
inline int32_t q6_k_superblock_isum(const BlockQ6_K& x, const BlockQ8_K& y) {
  int32_t isum = 0;
  for (int j = 0; j < 16; ++j) {
    int32_t s = 0;
    for (int e = 16 * j; e < 16 * j + 16; ++e) s += q6_value(x, e) * y.qs[e];
    isum += s * x.scales[j];
  }
  return isum;
}

float dot_q6_k(int64_t nb, const BlockQ6_K* x, const BlockQ8_K* y) {
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i)
    acc = std::fmaf(y[i].d * h2f(x[i].d), static_cast<float>(q6_k_superblock_isum(x[i], y[i])), acc);
  return acc;
}

}  // namespace

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const int bs = dtype_info(t).block_size;
  assert(n % bs == 0);
  const int64_t nb = n / bs;
  if (t == kF8E4M3) {  // CUDA's fp8 KV, read back on the host (tests)
    for (int64_t i = 0; i < n; ++i) dst[i] = e4m3_value(static_cast<const uint8_t*>(src)[i]);
    return;
  }
  if (t == kKvQ8_0x64) {  // q8_0h64's blocks (backend/cpu/kv_quant.h), read back on the host (tests, tiers)
    const auto* blk = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < nb; ++i, blk += 2 + bs) {
      uint16_t d = 0;
      std::memcpy(&d, blk, 2);
      const float s = f16_to_f32(d);
      for (int j = 0; j < bs; ++j) dst[i * bs + j] = s * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
    }
    return;
  }
  if (t == kKvIq4Nl64) {  // iq4_nlh64's blocks (backend/cpu/kv_quant.h), read back on the host (tests, tiers)
    const auto* blk = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < nb; ++i, blk += 1 + bs / 2) {
      const float s = e4m3_value(blk[0]) * (1.0f / 16.0f);
      for (int j = 0; j < bs / 2; ++j) {
        dst[i * bs + j] = static_cast<float>(kIq4nlValues[blk[1 + j] & 0xF]) * s;
        dst[i * bs + bs / 2 + j] = static_cast<float>(kIq4nlValues[blk[1 + j] >> 4]) * s;
      }
    }
    return;
  }
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kQ4_0:
      return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::kQ4_1:
      return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::kQ5_0:
      return dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::kQ5_1:
      return dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::kQ8_0:
      return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::kQ8_1:
      return dequant_q8_1(static_cast<const BlockQ8_1*>(src), dst, nb);
    case DType::kQ4_K:
      return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::kQ5_K:
      return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::kQ6_K:
      return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::kQ8_K:
      return dequant_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
    case DType::kMXFP4:
      return dequant_mxfp4(static_cast<const BlockMXFP4*>(src), dst, nb);
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return iq::dequantize(t, src, dst, nb);
  }
  assert(false && "dequantize_row: unsupported dtype");
}

void quantize_row_q8_0(const float* x, void* out, int64_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    quantize_block_q8(x + i * kQK, &d, y[i].qs);
    y[i].d = f32_to_f16(d);
  }
}

void quantize_row_q8_1(const float* x, void* out, int64_t n) {
  assert(n % kQK == 0);
  auto* y = static_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < n / kQK; ++i) {
    float d;
    const int sum = quantize_block_q8(x + i * kQK, &d, y[i].qs);
    y[i].d = f32_to_f16(d);
    y[i].s = f32_to_f16(d * static_cast<float>(sum));
  }
}

void quantize_row_q8_k(const float* x, void* out, int64_t n) {
  assert(n % kQKK == 0);
  auto* y = static_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n / kQKK; ++i, x += kQKK) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQKK; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;  // signed: the extreme value maps to -127
    for (int j = 0; j < kQKK; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQKK / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

void quantize_row(DType partner, const float* x, void* y, int64_t n) {
  switch (partner) {
    case DType::kQ8_0:
      return quantize_row_q8_0(x, y, n);
    case DType::kQ8_1:
      return quantize_row_q8_1(x, y, n);
    case DType::kQ8_K:
      return quantize_row_q8_k(x, y, n);
    case DType::kF32:
      std::memcpy(y, x, static_cast<size_t>(n) * 4);
      return;
    default:
      assert(false && "quantize_row: not an activation type");
  }
}

float vec_dot(DType w, int64_t n, const void* wrow, const void* arow) {
  const int bs = dtype_info(w).block_size;
  assert(n % bs == 0);
  const int64_t nb = n / bs;
  switch (w) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: {
      const auto* a = static_cast<const float*>(arow);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        float wv;
        if (w == DType::kF32)
          wv = static_cast<const float*>(wrow)[i];
        else if (w == DType::kF16)
          wv = f16_to_f32(static_cast<const uint16_t*>(wrow)[i]);
        else
          wv = bf16_to_f32(static_cast<const uint16_t*>(wrow)[i]);
        sum += wv * a[i];
      }
      return sum;
    }
    case DType::kQ4_0:
      return dot_q4_0(nb, static_cast<const BlockQ4_0*>(wrow), static_cast<const BlockQ8_0*>(arow));
    case DType::kQ4_1:
      return dot_q4_1(nb, static_cast<const BlockQ4_1*>(wrow), static_cast<const BlockQ8_1*>(arow));
    case DType::kQ5_0:
      return dot_q5_0(nb, static_cast<const BlockQ5_0*>(wrow), static_cast<const BlockQ8_0*>(arow));
    case DType::kQ5_1:
      return dot_q5_1(nb, static_cast<const BlockQ5_1*>(wrow), static_cast<const BlockQ8_1*>(arow));
    case DType::kQ8_0:
      return dot_q8_0(nb, static_cast<const BlockQ8_0*>(wrow), static_cast<const BlockQ8_0*>(arow));
    case DType::kQ4_K:
      return dot_q4_k(nb, static_cast<const BlockQ4_K*>(wrow), static_cast<const BlockQ8_K*>(arow));
    case DType::kQ5_K:
      return dot_q5_k(nb, static_cast<const BlockQ5_K*>(wrow), static_cast<const BlockQ8_K*>(arow));
    case DType::kQ6_K:
      return dot_q6_k(nb, static_cast<const BlockQ6_K*>(wrow), static_cast<const BlockQ8_K*>(arow));
    case DType::kMXFP4:
      return dot_mxfp4(nb, static_cast<const BlockMXFP4*>(wrow), static_cast<const BlockQ8_0*>(arow));
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return iq::vec_dot(w, nb, wrow, arow);
    default:
      assert(false && "vec_dot: unsupported weight dtype");
  }
  return 0.0f;
}

}  // namespace ref
}  // namespace rill::cpu
