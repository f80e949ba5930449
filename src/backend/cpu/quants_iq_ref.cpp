// Scalar reference for Q2_K, Q3_K, IQ4_NL, IQ4_XS (see quants_iq.h).
#include <cassert>
#include <cmath>

#include "backend/cpu/quants.h"
#include "backend/cpu/quants_iq.h"
#include "core/half.h"

namespace rill::cpu::ref::iq {
namespace {

// Element e (0..255) of a Q2_K/Q3_K super-block: its 2 low bits.
inline int low2(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}
inline int q2_k_value(const BlockQ2_K& b, int e) {
  return low2(b.qs, e);
}
inline int q3_k_value(const BlockQ3_K& b, int e) {  // -4..3
  const int bit = (b.hmask[e % 32] >> (4 * (e / 128) + (e % 128) / 32)) & 1;
  return (low2(b.qs, e) | (bit << 2)) - 4;
}
// Element j (0..31) of a 16-byte nibble group: low nibbles first, then high.
inline int nibble(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
}

inline float hsum8(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

// lanes[l] = sum over the 8 chunks c, e in 4l..4l+3: value(32c+e) * scale(32c+e) * a[32c+e].
template <typename Value, typename Scale>
inline void lanes_k(Value value, Scale scale, const int8_t* a, int32_t lanes[8]) {
  for (int l = 0; l < 8; ++l) lanes[l] = 0;
  for (int e = 0; e < kQKK; ++e) lanes[(e % 32) / 4] += value(e) * scale(e) * a[e];
}

void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    for (int e = 0; e < kQKK; ++e) {
      const uint8_t sc = b[i].scales[e / 16];
      y[e] = d * static_cast<float>(sc & 0xF) * static_cast<float>(q2_k_value(b[i], e)) -
             dmin * static_cast<float>(sc >> 4);
    }
  }
}

void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQKK) {
    const float d = f16_to_f32(b[i].d);
    for (int e = 0; e < kQKK; ++e) {
      const float dl = d * static_cast<float>(q3_k_scale(e / 16, b[i].scales) - 32);
      y[e] = dl * static_cast<float>(q3_k_value(b[i], e));
    }
  }
}

void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = d * static_cast<float>(kIq4nlValues[nibble(b[i].qs, j)]);
  }
}

void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int s = 0; s < 8; ++s, y += 32) {
      const float dl = d * static_cast<float>(iq4_xs_scale(s, b[i]) - 32);
      for (int j = 0; j < 32; ++j) y[j] = dl * static_cast<float>(kIq4nlValues[nibble(b[i].qs + 16 * s, j)]);
    }
  }
}

float dot_q2_k(int64_t nb, const BlockQ2_K* x, const BlockQ8_K* y) {
  float acc[8] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const float d = y[i].d * f16_to_f32(x[i].d);
    const float dmin = -y[i].d * f16_to_f32(x[i].dmin);
    for (int l = 0; l < 8; ++l) {
      const int prod =
          (x[i].scales[2 * l] >> 4) * y[i].bsums[2 * l] + (x[i].scales[2 * l + 1] >> 4) * y[i].bsums[2 * l + 1];
      acc[l] = std::fmaf(dmin, static_cast<float>(prod), acc[l]);
    }
    int32_t lanes[8];
    lanes_k([&](int e) { return q2_k_value(x[i], e); }, [&](int e) { return x[i].scales[e / 16] & 0xF; }, y[i].qs,
            lanes);
    for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(d, static_cast<float>(lanes[l]), acc[l]);
  }
  return hsum8(acc);
}

float dot_q3_k(int64_t nb, const BlockQ3_K* x, const BlockQ8_K* y) {
  float acc[8] = {};
  for (int64_t i = 0; i < nb; ++i) {
    const float d = y[i].d * f16_to_f32(x[i].d);
    int sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = q3_k_scale(j, x[i].scales) - 32;
    int32_t lanes[8];
    lanes_k([&](int e) { return q3_k_value(x[i], e); }, [&](int e) { return sc[e / 16]; }, y[i].qs, lanes);
    for (int l = 0; l < 8; ++l) acc[l] = std::fmaf(d, static_cast<float>(lanes[l]), acc[l]);
  }
  return hsum8(acc);
}

// IQ4_XS is defined per super-block as ONE exact int32 (not llama.cpp's
// vec_dot lanes): isum = sum over the 8 sub-blocks j of
// (s[j] - 32) * sum_{e in j} v[e] * a[e], v the IQ4 code values
// (|isum| <= 256 * 127 * 127 * 32 < 2^28), then acc = fma(w.d * a.d,
// float(isum), acc) over the super-blocks in order from acc = 0; the dot is
// acc. As for Q4_K/Q5_K/Q6_K (quants_ref.cpp), a tile's lane layout is then
// free (gemm_kquant_rows_avx512_impl.h puts rows in the lanes).
float dot_iq4_xs(int64_t nb, const BlockIQ4_XS* x, const BlockQ8_K* y) {
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t isum = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t s = 0;
      for (int e = 0; e < 32; ++e) s += kIq4nlValues[nibble(x[i].qs + 16 * j, e)] * y[i].qs[32 * j + e];
      isum += s * (iq4_xs_scale(j, x[i]) - 32);
    }
    acc = std::fmaf(f16_to_f32(x[i].d) * y[i].d, static_cast<float>(isum), acc);
  }
  return acc;
}

// One IQ4_NL block's 8 integer lanes (elements 4l..4l+3).
inline void iq4_nl_lanes(const BlockIQ4_NL& x, const BlockQ8_0& y, int32_t lanes[8]) {
  for (int l = 0; l < 8; ++l) lanes[l] = 0;
  for (int j = 0; j < kQK; ++j) lanes[j / 4] += kIq4nlValues[nibble(x.qs, j)] * y.qs[j];
}

float dot_iq4_nl(int64_t nb, const BlockIQ4_NL* x, const BlockQ8_0* y) {
  float acc1[8] = {}, acc2[8] = {};
  int64_t ib = 0;
  int32_t lanes[8];
  for (; ib + 1 < nb; ib += 2) {
    iq4_nl_lanes(x[ib], y[ib], lanes);
    const float d1 = f16_to_f32(y[ib].d) * f16_to_f32(x[ib].d);
    for (int l = 0; l < 8; ++l) acc1[l] = std::fmaf(d1, static_cast<float>(lanes[l]), acc1[l]);
    iq4_nl_lanes(x[ib + 1], y[ib + 1], lanes);
    const float d2 = f16_to_f32(y[ib + 1].d) * f16_to_f32(x[ib + 1].d);
    for (int l = 0; l < 8; ++l) acc2[l] = std::fmaf(d2, static_cast<float>(lanes[l]), acc2[l]);
  }
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = acc1[l] + acc2[l];
  float sum = hsum8(acc);
  for (; ib < nb; ++ib) {  // llama.cpp's scalar tail (gnu11: contracted to an fma)
    iq4_nl_lanes(x[ib], y[ib], lanes);
    int s = 0;
    for (int l = 0; l < 8; ++l) s += lanes[l];
    sum = std::fmaf(f16_to_f32(y[ib].d) * f16_to_f32(x[ib].d), static_cast<float>(s), sum);
  }
  return sum;
}

}  // namespace

void dequantize(DType t, const void* src, float* dst, int64_t nb) {
  switch (t) {
    case DType::kQ2_K:
      return dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case DType::kQ3_K:
      return dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case DType::kIQ4_NL:
      return dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case DType::kIQ4_XS:
      return dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    default:
      assert(false && "iq::dequantize: not a low-bit type");
  }
}

float vec_dot(DType t, int64_t nb, const void* w, const void* a) {
  switch (t) {
    case DType::kQ2_K:
      return dot_q2_k(nb, static_cast<const BlockQ2_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::kQ3_K:
      return dot_q3_k(nb, static_cast<const BlockQ3_K*>(w), static_cast<const BlockQ8_K*>(a));
    case DType::kIQ4_NL:
      return dot_iq4_nl(nb, static_cast<const BlockIQ4_NL*>(w), static_cast<const BlockQ8_0*>(a));
    case DType::kIQ4_XS:
      return dot_iq4_xs(nb, static_cast<const BlockIQ4_XS*>(w), static_cast<const BlockQ8_K*>(a));
    default:
      assert(false && "iq::vec_dot: not a low-bit type");
  }
  return 0.0f;
}

}  // namespace rill::cpu::ref::iq
