// kv_alloc.h's block scores compiled for AVX-512: the masked adds of each
// plane's weight (alloc_block_scores_avx512) and the codes widened first
// (alloc_block_scores_widen_avx512). Both take a chunk of up to 4 query
// rows at a time, so each plane (or each channel's widened codes) is read
// once for all of them.
#include <immintrin.h>

#include <cassert>
#include <cstdint>
#include <cstring>

#include "backend/cpu/kv_alloc.h"
#include "core/e4m3.h"

namespace rill::cpu::detail {
namespace {

constexpr int kT = kKvChanTokens;
// Rows a chunk: 4 (masked adds: 16 accumulators) in registers. The loops
// over a chunk's rows are unrolled by pragma: -O2 leaves them rolled, and
// a rolled loop keeps the accumulator arrays in memory (5x slower).
constexpr int kMaxRows = 4;

// q.z of NG rows: 16 lanes (channel c in lane c % 16, FMAs in channel
// order), the lanes then summed in lane order.
template <int NG>
void dot_z(const AllocHead& h, const float* q, float* qz) {
  __m512 acc[NG];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) acc[g] = _mm512_setzero_ps();
  for (int64_t c = 0; c < h.head_dim; c += 16) {
    const __m512 z = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h.z + c)));
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) acc[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * h.head_dim + c), z, acc[g]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) {
    float lanes[16];
    _mm512_storeu_ps(lanes, acc[g]);
    qz[g] = 0.0f;
    for (float v : lanes) qz[g] += v;
  }
}

uint32_t load_plane(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian: x86
  return v;
}

// Plane k's weights w 2^k (exact: a power of two; each plane's its own
// product, so no plane waits on the previous one's) added to the parity
// e's accumulators of the tokens whose bit is set.
template <int NG>
inline void add_plane(uint32_t plane, const __m512* w, __m512 scale, __m512 (*acc)[2][2], int e) {
  const auto lo = static_cast<__mmask16>(plane), hi = static_cast<__mmask16>(plane >> 16);
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) {
    const __m512 wk = _mm512_mul_ps(w[g], scale);
    acc[g][e][0] = _mm512_mask_add_ps(acc[g][e][0], lo, acc[g][e][0], wk);
    acc[g][e][1] = _mm512_mask_add_ps(acc[g][e][1], hi, acc[g][e][1], wk);
  }
}

template <int NG>
void masked_rows(const AllocHead& h, const float* q, float* scores) {
  const float* steps = e4m3_values();
  float qz[NG];
  dot_z<NG>(h, q, qz);
  // [row][parity of k][token half]
  __m512 acc[NG][2][2];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g)
    for (int e = 0; e < 2; ++e) acc[g][e][0] = acc[g][e][1] = _mm512_setzero_ps();
  const uint8_t* p = h.planes;
  for (int64_t c = 0; c < h.head_dim; ++c) {
    const int b = h.widths[c];
    if (b == 0) continue;
    const float step = steps[h.d[c]] * (1.0f / 16.0f);
    __m512 w[NG];
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) w[g] = _mm512_set1_ps(q[g * h.head_dim + c] * step);
    // Planes in pairs, so the accumulators' indices are constants (a
    // run-time index would keep them in memory).
    for (int k = 0; k < b; k += 2) {
      add_plane<NG>(load_plane(p + 4 * k), w, _mm512_set1_ps(static_cast<float>(1 << k)), acc, 0);
      if (k + 1 < b) add_plane<NG>(load_plane(p + 4 * k + 4), w, _mm512_set1_ps(static_cast<float>(2 << k)), acc, 1);
    }
    p += 4 * b;
  }
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) {
    const __m512 z = _mm512_set1_ps(qz[g]);
    _mm512_storeu_ps(scores + g * kT, _mm512_add_ps(_mm512_add_ps(acc[g][0][0], acc[g][1][0]), z));
    _mm512_storeu_ps(scores + g * kT + 16, _mm512_add_ps(_mm512_add_ps(acc[g][0][1], acc[g][1][1]), z));
  }
}

template <int NG>
void widen_rows(const AllocHead& h, const float* q, float* scores) {
  const float* steps = e4m3_values();
  float qz[NG];
  dot_z<NG>(h, q, qz);
  __m512 acc[NG][2];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_ps();
  const uint8_t* p = h.planes;
  for (int64_t c = 0; c < h.head_dim; ++c) {
    const int b = h.widths[c];
    if (b == 0) continue;
    __m256i codes = _mm256_setzero_si256();
    for (int k = 0; k < b; ++k, p += 4) {
      codes = _mm256_mask_add_epi8(codes, static_cast<__mmask32>(load_plane(p)), codes,
                                   _mm256_set1_epi8(static_cast<char>(1 << k)));
    }
    const __m512 flo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(codes)));
    const __m512 fhi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(codes, 1)));
    const float step = steps[h.d[c]] * (1.0f / 16.0f);
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
      const __m512 w = _mm512_set1_ps(q[g * h.head_dim + c] * step);
      acc[g][0] = _mm512_fmadd_ps(w, flo, acc[g][0]);
      acc[g][1] = _mm512_fmadd_ps(w, fhi, acc[g][1]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) {
    const __m512 z = _mm512_set1_ps(qz[g]);
    _mm512_storeu_ps(scores + g * kT, _mm512_add_ps(acc[g][0], z));
    _mm512_storeu_ps(scores + g * kT + 16, _mm512_add_ps(acc[g][1], z));
  }
}

template <template <int> class Rows>
void by_chunks(const AllocHead& h, const float* q, int n_rows, float* scores) {
  assert(h.head_dim % 16 == 0);
  for (int r0 = 0; r0 < n_rows; r0 += kMaxRows) {
    const float* qr = q + r0 * h.head_dim;
    float* out = scores + r0 * kT;
    switch (n_rows - r0 < kMaxRows ? n_rows - r0 : kMaxRows) {
      case 1:
        Rows<1>::run(h, qr, out);
        break;
      case 2:
        Rows<2>::run(h, qr, out);
        break;
      case 3:
        Rows<3>::run(h, qr, out);
        break;
      default:
        Rows<4>::run(h, qr, out);
        break;
    }
  }
}

template <int NG>
struct Masked {
  static void run(const AllocHead& h, const float* q, float* s) { masked_rows<NG>(h, q, s); }
};
template <int NG>
struct Widen {
  static void run(const AllocHead& h, const float* q, float* s) { widen_rows<NG>(h, q, s); }
};

}  // namespace

void alloc_block_scores_avx512(const AllocHead& h, const float* q, int n_rows, float* scores) {
  by_chunks<Masked>(h, q, n_rows, scores);
}

void alloc_block_scores_widen_avx512(const AllocHead& h, const float* q, int n_rows, float* scores) {
  by_chunks<Widen>(h, q, n_rows, scores);
}

}  // namespace rill::cpu::detail
