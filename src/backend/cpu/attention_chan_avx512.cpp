// attention_chan_impl.h compiled for AVX-512, its group sums in
// intrinsics: a channel's 32 codes widened to two zmm of floats once for
// every query head of the group, one FMA each (the same sums in the same
// channel order as the baseline build, within FMA rounding).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"

#define RILL_CHAN_ISA avx512
#define RILL_CHAN_GROUP_SUMS
#define RILL_CHAN_ACCUMULATE_V
#define RILL_CHAN_GROUP_SCALES

namespace rill::cpu::detail::avx512 {

inline void group_sums(const uint8_t* qs, const float* qd, int64_t hd, int n_heads, float* acc) {
  constexpr int kMaxHeads = 8;  // accumulators in registers: 2 per head
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int g0 = 0; g0 < n_heads; g0 += kMaxHeads) {
    const int ng = n_heads - g0 < kMaxHeads ? n_heads - g0 : kMaxHeads;
    __m512 lo[kMaxHeads], hi[kMaxHeads];
    for (int g = 0; g < kMaxHeads; ++g) lo[g] = hi[g] = _mm512_setzero_ps();
    for (int64_t c = 0; c < hd; ++c) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + c * 16));
      const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)));
      const __m512 fhi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
      for (int g = 0; g < ng; ++g) {
        const __m512 w = _mm512_set1_ps(qd[(g0 + g) * hd + c]);
        lo[g] = _mm512_fmadd_ps(w, flo, lo[g]);
        hi[g] = _mm512_fmadd_ps(w, fhi, hi[g]);
      }
    }
    for (int g = 0; g < ng; ++g) {
      _mm512_storeu_ps(acc + (g0 + g) * 32, lo[g]);
      _mm512_storeu_ps(acc + (g0 + g) * 32 + 16, hi[g]);
    }
  }
}

// qz and qd as the baseline's group_scales, 16 channels at a time (F16C
// zeros, the e4m3 steps gathered from their table); q.z summed in 16 lanes
// then reduced, not in channel order.
inline void group_scales(const float* q, const uint16_t* z, const uint8_t* d, int64_t hd, int n_heads, float* qd,
                         float* qz) {
  const float* table = e4m3_values();
  const __m512 sixteenth = _mm512_set1_ps(1.0f / 16.0f);
  for (int g = 0; g < n_heads; ++g) {
    const float* qg = q + g * hd;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = 0; c < hd; c += 16) {
      const __m512 zf = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + c)));
      const __m512i di = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d + c)));
      const __m512 df = _mm512_mul_ps(_mm512_i32gather_ps(di, table, 4), sixteenth);
      const __m512 qc = _mm512_loadu_ps(qg + c);
      acc = _mm512_fmadd_ps(qc, zf, acc);
      _mm512_storeu_ps(qd + g * hd + c, _mm512_mul_ps(qc, df));
    }
    qz[g] = _mm512_reduce_add_ps(acc);
  }
}

// out[g] += p[g] * row, one FMA per 16 elements and head.
inline void accumulate_row(const ChanAttendArgs& a, const float* row, const float* p) {
  const int64_t hd = a.head_dim;
  for (int g = 0; g < a.n_heads; ++g) {
    float* o = a.out + g * hd;
    const __m512 pg = _mm512_set1_ps(p[g]);
    for (int64_t c = 0; c < hd; c += 16) {
      _mm512_storeu_ps(o + c, _mm512_fmadd_ps(pg, _mm512_loadu_ps(row + c), _mm512_loadu_ps(o + c)));
    }
  }
}

// out[g] += p[g] * v: iq4_nlh64 rows decoded in registers (the 16 levels
// in one zmm, vpermps by the nibbles, times the block's scale: the same
// f32 values as dq_iq4_nl64), other types through the dequantizer; one
// FMA per 16 elements and head.
inline void accumulate_v(const ChanAttendArgs& a, const uint8_t* v, const float* p, float* row) {
  const int64_t hd = a.head_dim;
  if (a.v_type == kKvIq4Nl64) {
    alignas(64) static const float kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};
    const __m512 levels = _mm512_load_ps(kLevels);
    const __m128i mask = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < hd / 64; ++b, v += 33) {
      const __m512 d = _mm512_set1_ps(e4m3_value_fast(v[0]) * (1.0f / 16.0f));
      const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 1));
      const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + 17));
      const __m512 x[4] = {
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b0, mask)), levels), d),
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b1, mask)), levels), d),
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b0, 4), mask)), levels),
                        d),
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b1, 4), mask)), levels),
                        d)};
      for (int g = 0; g < a.n_heads; ++g) {
        float* o = a.out + g * hd + b * 64;
        const __m512 pg = _mm512_set1_ps(p[g]);
        for (int k = 0; k < 4; ++k)
          _mm512_storeu_ps(o + 16 * k, _mm512_fmadd_ps(pg, x[k], _mm512_loadu_ps(o + 16 * k)));
      }
    }
    return;
  }
  a.v_dequant(v, row, hd);
  accumulate_row(a, row, p);
}

}  // namespace rill::cpu::detail::avx512

#include "backend/cpu/attention_chan_impl.h"

namespace rill::cpu::detail {

void attend_chan_avx512(const ChanAttendArgs& a) {
  avx512::attend(a);
}

}  // namespace rill::cpu::detail
