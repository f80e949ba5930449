#pragma once
// The Q6_K gemm for batches of token rows (prefill, batched decode) on
// AVX-512BW + VNNI, on rill's Q6_K definition (quants_ref.cpp): per
// super-block one exact int32, then one fma with a.d * w.d. Fewer token rows
// keep the one-token tiles (gemm_kquant_avx512_impl.h), which compute the
// same. Include only from quants_avx512.cpp; internal linkage.
//
// Layout: rows in the vector lanes, the weights repacked once per call.
//  * a zmm holds 4 weight rows x 16 signed values (q - 32), one 128-bit lane
//    per row; its dword lane c of iteration i (0..3) of a 64-element chunk jb
//    holds elements 16 (4 jb + c) + 4 i .. + 3, so after 4 vpdpbusd a dword
//    lane holds one whole 16-element sub-block (4 jb + c) of its row, and one
//    vpmulld by the sub-block scales follows (1.25 multiplies per 64
//    products; the token-pair tile needed 2.0);
//  * the activations are permuted the same way, biased to u8 (a + 128 =
//    a ^ 0x80, for vpdpbusd's unsigned operand), and each 16-byte piece is
//    broadcast to the 4 rows; the bias adds 128 * sum(q - 32) per sub-block,
//    which the repack precomputes per row (corr) and the tile subtracts once
//    per super-block;
//  * at the end of a super-block four 4-row groups reduce into one zmm of 16
//    row sums (lane 4 r + k: row 4 k + r of the 16), converted and fma'd.
// All integer sums are exact (|values| < 2^28 before the correction), so the
// result equals the reference bit for bit.
//
// The weight repack is done per call (per row chunk of the matmul driver,
// kQ6RowsChunkBlocks super-blocks at a time) and amortized over all the
// call's tokens (the driver hands this gemm a whole prefill). Repacking at
// load instead would keep a second copy of the weights (this layout is 328
// bytes per row and super-block against Q6_K's 210; the memory-bound
// one-token decode must keep reading the compact GGUF blocks).
#include <vector>

#include "backend/cpu/gemm_kquant_avx512_impl.h"

namespace rill::cpu {
namespace {

inline constexpr int kQ6RowsMinTokens = 8;         // fewer: the one-token tiles
inline constexpr int64_t kQ6RowsChunkBlocks = 8;  // super-blocks repacked at a time (L2-resident)
inline constexpr int kQ6RowsTokens = 4;            // tokens per register tile

// 16 rows of one super-block, repacked. Group k holds rows 4k..4k+3.
struct Q6Rows16 {
  struct Group {
    alignas(64) int8_t q[4][4][4][16];  // chunk jb, iteration i, row r: 16 values q - 32
    alignas(64) int32_t sc[4][16];      // chunk jb: lane 4 r + c = scale 4 jb + c of row r
  } g[4];
  alignas(64) int32_t corr[16];  // lane 4 r + k: 128 * sum_j sc[j] * sum_{e in j} (q[e] - 32) of row 4 k + r
  alignas(64) float d[16];       // lane 4 r + k: w.d of row 4 k + r
};

// Lane m <- lane 4 (m % 4) + m / 4: a 4 x 4 transpose of dwords, its own
// inverse. It maps a 64-element chunk's dword 4 c + i (elements 16 c + 4 i..)
// to 4 i + c, and the reduced row sums' lanes to row order.
RILL_KERNEL_TARGET static inline __m512i transpose4x4_index() {
  return _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
}

// Rows [0, 16) of super-block ib (row m at w + m * w_stride; rows at or past
// n_valid repeat the last valid one: computed, never stored).
RILL_KERNEL_TARGET void repack_q6_rows16(const uint8_t* w, size_t w_stride, int n_valid, int64_t ib, Q6Rows16* out) {
  const __m512i perm = transpose4x4_index();
  const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03), off32 = _mm512_set1_epi8(32);
  const __m512i ones = _mm512_set1_epi8(1);
  // Chunk 2h (2h+1) takes qh bits (0, 2) ((4, 6)) in its two 32-byte halves.
  const __m512i shift_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i shift_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
  for (int m = 0; m < 16; ++m) {
    const int row = m < n_valid ? m : n_valid - 1;
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(w + static_cast<size_t>(row) * w_stride)[ib];
    const int k = m / 4, r = m % 4;
    Q6Rows16::Group& g = out->g[k];
    const __m512i s32 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    __m512i weighted = _mm512_setzero_si512();  // sum over elements of sc * q (q unsigned)
    RILL_UNROLL
    for (int jb = 0; jb < 4; ++jb) {
      const int h = jb / 2;
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      const __m512i nib = jb % 2 ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
      const __m512i hi2 = _mm512_and_si512(_mm512_srlv_epi16(qh, jb % 2 ? shift_hi : shift_lo), m3);
      const __m512i u = _mm512_or_si512(nib, _mm512_slli_epi16(hi2, 4));  // elements 64 jb .. + 63, 0..63
      const __m512i v = _mm512_permutexvar_epi32(perm, _mm512_sub_epi8(u, off32));
      _mm_store_si128(reinterpret_cast<__m128i*>(g.q[jb][0][r]), _mm512_castsi512_si128(v));
      _mm_store_si128(reinterpret_cast<__m128i*>(g.q[jb][1][r]), _mm512_extracti32x4_epi32(v, 1));
      _mm_store_si128(reinterpret_cast<__m128i*>(g.q[jb][2][r]), _mm512_extracti32x4_epi32(v, 2));
      _mm_store_si128(reinterpret_cast<__m128i*>(g.q[jb][3][r]), _mm512_extracti32x4_epi32(v, 3));
      // dword d of u's 4-sums belongs to sub-block 4 jb + d / 4
      const __m512i sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, ones);
      const __m512i sc_of = _mm512_permutexvar_epi32(
          _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
                           _mm512_set1_epi32(4 * jb)),
          s32);
      weighted = _mm512_add_epi32(weighted, _mm512_mullo_epi32(sum4, sc_of));
    }
    _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[0] + 4 * r), _mm512_castsi512_si128(s32));
    _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[1] + 4 * r), _mm512_extracti32x4_epi32(s32, 1));
    _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[2] + 4 * r), _mm512_extracti32x4_epi32(s32, 2));
    _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[3] + 4 * r), _mm512_extracti32x4_epi32(s32, 3));
    // sum_j sc[j] * sum_{e in j} (q[e] - 32) = sum sc * q - 16 * 32 * sum_j sc[j]
    out->corr[4 * r + k] = 128 * (_mm512_reduce_add_epi32(weighted) - 512 * _mm512_reduce_add_epi32(s32));
    out->d[4 * r + k] = simd::f16(b.d);
  }
}

// Token t's super-block: values a ^ 0x80 (= a + 128, unsigned) with each
// 64-element chunk's dwords transposed as the weights'.
struct alignas(64) Q6RowsAct {
  uint8_t q[kQKK];
};

RILL_KERNEL_TARGET static inline void prepare_q6_act(const BlockQ8_K& b, Q6RowsAct* out) {
  const __m512i perm = transpose4x4_index();
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  RILL_UNROLL
  for (int jb = 0; jb < 4; ++jb)
    _mm512_store_si512(out->q + 64 * jb,
                       _mm512_permutexvar_epi32(perm, _mm512_xor_si512(_mm512_loadu_si512(b.qs + 64 * jb), bias)));
}

// 16 rows x TB tokens over super-blocks [ib0, ib1): wr[ib - ib0] the
// repacked rows, act[(ib - ib0) * act_stride + t] and ad[same] token t's
// values and a.d. The accumulators come from y when not first (the fma
// chain continues: same bits) and go back to y (rows < n_valid only).
template <int TB>
RILL_KERNEL_TARGET void q6_rows_tile(int64_t nbc, bool first, const Q6Rows16* wr, const Q6RowsAct* act,
                                     const float* ad, int64_t act_stride, int n_valid, float* y, int64_t y_stride) {
  const __m512i perm = transpose4x4_index();
  const __mmask16 valid = static_cast<__mmask16>((1u << n_valid) - 1);
  __m512 acc[TB];
  RILL_UNROLL
  for (int t = 0; t < TB; ++t)
    acc[t] = first ? _mm512_setzero_ps()
                   : _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(valid, y + t * y_stride));
  for (int64_t ib = 0; ib < nbc; ++ib) {
    const Q6Rows16& w = wr[ib];
    const Q6RowsAct* a = act + ib * act_stride;
    __m512i s[4][TB];
    RILL_UNROLL
    for (int k = 0; k < 4; ++k) RILL_UNROLL
    for (int t = 0; t < TB; ++t) s[k][t] = _mm512_setzero_si512();
    RILL_UNROLL
    for (int jb = 0; jb < 4; ++jb) {
      RILL_UNROLL
      for (int k = 0; k < 4; ++k) {
        __m512i r[TB];
        RILL_UNROLL
        for (int i = 0; i < 4; ++i) {
          const __m512i wq = _mm512_load_si512(w.g[k].q[jb][i]);
          RILL_UNROLL
          for (int t = 0; t < TB; ++t) {
            const __m512i av =
                _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(a[t].q + 64 * jb + 16 * i)));
            r[t] = i == 0 ? _mm512_dpbusd_epi32(_mm512_setzero_si512(), av, wq) : _mm512_dpbusd_epi32(r[t], av, wq);
          }
        }
        const __m512i sc = _mm512_load_si512(w.g[k].sc[jb]);
        RILL_UNROLL
        for (int t = 0; t < TB; ++t) s[k][t] = _mm512_add_epi32(s[k][t], _mm512_mullo_epi32(r[t], sc));
      }
    }
    const __m512i corr = _mm512_load_si512(w.corr);
    const __m512 wd = _mm512_load_ps(w.d);
    RILL_UNROLL
    for (int t = 0; t < TB; ++t) {
      // Row r's 4 dword lanes of group k -> lane 4 r + k.
      const __m512i u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0][t], s[1][t]), _mm512_unpackhi_epi32(s[0][t], s[1][t]));
      const __m512i u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2][t], s[3][t]), _mm512_unpackhi_epi32(s[2][t], s[3][t]));
      const __m512i sum = _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
      const __m512 d = _mm512_mul_ps(wd, _mm512_set1_ps(ad[ib * act_stride + t]));
      acc[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, corr)), acc[t]);
    }
  }
  RILL_UNROLL
  for (int t = 0; t < TB; ++t) _mm512_mask_storeu_ps(y + t * y_stride, valid, _mm512_permutexvar_ps(perm, acc[t]));
}

using Q6RowsTileFn = void (*)(int64_t, bool, const Q6Rows16*, const Q6RowsAct*, const float*, int64_t, int, float*,
                              int64_t);
inline constexpr Q6RowsTileFn kQ6RowsTiles[kQ6RowsTokens] = {&q6_rows_tile<1>, &q6_rows_tile<2>, &q6_rows_tile<3>,
                                                             &q6_rows_tile<4>};

// GemmTileFn entry. Fewer than kQ6RowsMinTokens token rows: the one-token
// tiles. Otherwise, kQ6RowsChunkBlocks super-blocks at a time: the rows
// repacked in 16-row groups, then per block of kQ6RowsTokenBlock tokens the
// tokens prepared and every 16-row group x 4-token tile (per-thread grow-only
// buffers). It takes any number of tokens (Kernels::gemm_max_tokens), so a
// prefill repacks each weight once.
inline constexpr int kQ6RowsTokenBlock = 64;  // prepared activations: 64 x 8 x 256 bytes, L2-resident

RILL_KERNEL_TARGET void gemm_q6_rows_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                           size_t a_stride, int n_t, float* y, int64_t y_stride) {
  if (n_t < kQ6RowsMinTokens) {
    gemm_k_vnni_entry<KVnniQ6>(n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
    return;
  }
  thread_local std::vector<Q6Rows16> wbuf;
  thread_local std::vector<Q6RowsAct> abuf;
  thread_local std::vector<float> dbuf;
  const int64_t nb = n / kQKK;
  const int64_t chunk = nb < kQ6RowsChunkBlocks ? nb : kQ6RowsChunkBlocks;
  const int n_groups = (n_r + 15) / 16;
  const int tb_max = n_t < kQ6RowsTokenBlock ? n_t : kQ6RowsTokenBlock;
  const size_t n_wblocks = static_cast<size_t>(n_groups * chunk), n_ablocks = static_cast<size_t>(tb_max * chunk);
  if (wbuf.size() < n_wblocks) wbuf.resize(n_wblocks);
  if (abuf.size() < n_ablocks) abuf.resize(n_ablocks);
  if (dbuf.size() < n_ablocks) dbuf.resize(n_ablocks);
  Q6Rows16* const wp = wbuf.data();  // (not the thread_locals in the loops: their access is a call)
  Q6RowsAct* const ap = abuf.data();
  float* const dp = dbuf.data();
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int64_t ib0 = 0; ib0 < nb; ib0 += chunk) {
    const int64_t nbc = nb - ib0 < chunk ? nb - ib0 : chunk;
    for (int g = 0; g < n_groups; ++g) {
      const int n_valid = n_r - 16 * g < 16 ? n_r - 16 * g : 16;
      for (int64_t ib = 0; ib < nbc; ++ib)
        repack_q6_rows16(wb + static_cast<size_t>(16 * g) * w_stride, w_stride, n_valid, ib0 + ib,
                         wp + g * chunk + ib);
    }
    for (int tb0 = 0; tb0 < n_t; tb0 += kQ6RowsTokenBlock) {
      const int ntb = n_t - tb0 < kQ6RowsTokenBlock ? n_t - tb0 : kQ6RowsTokenBlock;
      for (int t = 0; t < ntb; ++t) {
        const auto* row = reinterpret_cast<const BlockQ8_K*>(ab + static_cast<size_t>(tb0 + t) * a_stride);
        for (int64_t ib = 0; ib < nbc; ++ib) {
          prepare_q6_act(row[ib0 + ib], ap + ib * ntb + t);
          dp[ib * ntb + t] = row[ib0 + ib].d;
        }
      }
      for (int g = 0; g < n_groups; ++g) {
        const int n_valid = n_r - 16 * g < 16 ? n_r - 16 * g : 16;
        for (int t0 = 0; t0 < ntb; t0 += kQ6RowsTokens) {
          const int tb = ntb - t0 < kQ6RowsTokens ? ntb - t0 : kQ6RowsTokens;
          kQ6RowsTiles[tb - 1](nbc, ib0 == 0, wp + g * chunk, ap + t0, dp + t0, ntb, n_valid,
                               y + (tb0 + t0) * y_stride + 16 * g, y_stride);
        }
      }
    }
  }
}

}  // namespace
}  // namespace rill::cpu
