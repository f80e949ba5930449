#pragma once
// The K-quant gemm (Q4_K, Q5_K, Q6_K; IQ4_XS with its decoder KRowsXS in
// gemm_iquant_avx512.cpp) for batches of token rows (prefill, batched
// decode) on AVX-512BW + VNNI, on rill's K-quant definition (quants_ref.cpp,
// quants_iq_ref.cpp): per super-block exact int32s, each converted and fma'd
// once. Fewer token rows keep the one-token tiles (gemm_kquant_avx512_impl.h,
// gemm_xs_entry), which compute the same. Include only from
// quants_avx512.cpp and gemm_iquant_avx512.cpp; internal linkage.
//
// Layout: rows in the vector lanes, the weights repacked once per call.
//  * a zmm holds 4 weight rows x 16 values, one 128-bit lane per row; over
//    the Dec::kIters successive zmm ("pieces") of a chunk jb, dword lane c
//    walks through sub-block 4 jb + c (Q6_K: 4 pieces, 16-element
//    sub-blocks; Q4_K/Q5_K: 8 pieces, 32-element sub-blocks), so after
//    kIters vpdpbusd a dword lane holds one whole sub-block of its row and
//    one vpmulld by the sub-block scales follows (1.25 multiplies per 64
//    products for Q6_K, 1.125 for Q4_K/Q5_K; the token-pair tile needed 2.0);
//  * the activations are permuted the same way and each 16-byte piece is
//    broadcast to the 4 rows. Q6_K's weights are signed (q - 32), so its
//    activations go in as vpdpbusd's unsigned operand biased to a + 128
//    (a ^ 0x80); the bias adds 128 * sum(q - 32) per sub-block, which the
//    repack precomputes per row (corr) and the tile subtracts once per
//    super-block. Q4_K/Q5_K's weights are unsigned and the activations go
//    in as they are; their min term (mins x sub-block sums of a) is 4
//    vpdpwssd per 16 rows and token;
//  * at the end of a super-block four 4-row groups reduce into one zmm of 16
//    row sums (lane 4 r + k: row 4 k + r of the 16), converted and fma'd.
// All integer sums are exact (|values| < 2^28 before Q6_K's correction), so
// the result equals the reference bit for bit.
//
// The weight repack is done per call (per row chunk of the matmul driver,
// kRowsChunkBlocks super-blocks at a time) and amortized over all the call's
// tokens (the driver hands these gemms a whole prefill). Repacking at load
// instead would keep a second copy of the weights (this layout is 348 bytes
// per row and super-block against Q6_K's 210 and Q4_K's 144; the
// memory-bound one-token decode must keep reading the compact GGUF blocks).
#include <vector>

#include "backend/cpu/gemm_kquant_avx512_impl.h"

namespace rill::cpu {
namespace {

inline constexpr int kRowsMinTokens = 8;        // fewer: the one-token tiles
inline constexpr int64_t kRowsChunkBlocks = 8;  // super-blocks repacked at a time (L2-resident)
inline constexpr int kRowsTokens = 2;           // tokens per register tile (32 zmm: 16 sums, 8 partial, 2 + 1 operands)
inline constexpr int kRowsTokenBlock = 64;      // prepared activations: 64 x 8 x 256 bytes, L2-resident
// The repack is the weights' first touch (from DRAM in a prefill): it prefetches the row this
// many rows ahead (about 4 rows' repack work covers a DRAM latency).
inline constexpr int kRepackAheadRows = 4;

// 16 rows of one super-block, repacked. Group k holds rows 4k..4k+3; row
// 4k + r's per-row values sit in lane 4 r + k (the order the reduction
// leaves the row sums in).
struct KRows16 {
  struct Group {
    alignas(64) int8_t q[16][4][16];  // piece p = kIters jb + i, row r: 16 values (Q6_K: q - 32)
    alignas(64) int32_t sc[4][16];    // chunk jb: lane 4 r + c = scale of sub-block 4 jb + c of row r
  } g[4];
  alignas(64) int32_t corr[16];     // Q6_K: 128 * sum_j sc[j] * sum_{e in j} (q[e] - 32)
  alignas(64) int32_t mins[4][16];  // Q4_K/Q5_K: (mn[2p], mn[2p+1]) as i16 pair p
  alignas(64) float d[16];          // w.d
  alignas(64) float dmin[16];       // Q4_K/Q5_K: w.dmin
};

// A token's super-block: its 256 values in the weights' piece order (Q6_K:
// biased to unsigned), a.d, and (Q4_K/Q5_K) its 8 sub-block sums as i16 pairs.
struct alignas(64) KRowsAct {
  uint8_t q[kQKK];
};
struct KRowsActMeta {
  float d;
  int32_t sums[4];
};

// Lane m <- lane 4 (m % 4) + m / 4: a 4 x 4 transpose of dwords, its own
// inverse. It maps a Q6_K chunk's dword 4 c + i (elements 16 c + 4 i..) to
// 4 i + c, and the reduced row sums' lanes to row order.
RILL_KERNEL_TARGET static inline __m512i transpose4x4_index() {
  return _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
}

// Stores v's four 16-byte lanes as pieces p0..p0+3 of row r.
RILL_KERNEL_TARGET static inline void store_pieces(KRows16::Group& g, int p0, int r, __m512i v) {
  _mm_store_si128(reinterpret_cast<__m128i*>(g.q[p0][r]), _mm512_castsi512_si128(v));
  _mm_store_si128(reinterpret_cast<__m128i*>(g.q[p0 + 1][r]), _mm512_extracti32x4_epi32(v, 1));
  _mm_store_si128(reinterpret_cast<__m128i*>(g.q[p0 + 2][r]), _mm512_extracti32x4_epi32(v, 2));
  _mm_store_si128(reinterpret_cast<__m128i*>(g.q[p0 + 3][r]), _mm512_extracti32x4_epi32(v, 3));
}

struct KRowsQ6 {
  using Block = BlockQ6_K;
  static constexpr int kChunks = 4, kIters = 4;
  static constexpr bool kSignedW = true, kMins = false;
  static constexpr GemmTileFn small_gemm = &gemm_k_vnni_entry<KVnniQ6>;
  // Row 4 k + r of out from b.
  RILL_KERNEL_TARGET static void repack(const Block& b, KRows16* out, int k, int r) {
    const __m512i perm = transpose4x4_index();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03), off32 = _mm512_set1_epi8(32);
    // Chunk 2h (2h+1) takes qh bits (0, 2) ((4, 6)) in its two 32-byte halves.
    const __m512i shift_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    KRows16::Group& g = out->g[k];
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
      store_pieces(g, 4 * jb, r, _mm512_permutexvar_epi32(perm, _mm512_sub_epi8(u, off32)));
      // dword d of u's 4-sums belongs to sub-block 4 jb + d / 4
      const __m512i sum4 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_set1_epi8(1));
      const __m512i sc_of = _mm512_permutexvar_epi32(
          _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
                           _mm512_set1_epi32(4 * jb)),
          s32);
      weighted = _mm512_add_epi32(weighted, _mm512_mullo_epi32(sum4, sc_of));
    }
    RILL_UNROLL
    for (int jb = 0; jb < 4; ++jb) _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[jb] + 4 * r), lane128(s32, jb));
    // sum_j sc[j] * sum_{e in j} (q[e] - 32) = sum sc * q - 16 * 32 * sum_j sc[j]
    out->corr[4 * r + k] = 128 * (_mm512_reduce_add_epi32(weighted) - 512 * _mm512_reduce_add_epi32(s32));
    out->d[4 * r + k] = simd::f16(b.d);
  }
  RILL_KERNEL_TARGET static void prepare(const BlockQ8_K& b, KRowsAct* out, KRowsActMeta* meta) {
    const __m512i perm = transpose4x4_index();
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    RILL_UNROLL
    for (int jb = 0; jb < 4; ++jb)
      _mm512_store_si512(out->q + 64 * jb,
                         _mm512_permutexvar_epi32(perm, _mm512_xor_si512(_mm512_loadu_si512(b.qs + 64 * jb), bias)));
    meta->d = b.d;
  }
};

// Q4_K/Q5_K: chunk jb is sub-blocks 4 jb .. 4 jb + 3 (128 elements); output
// o (0, 1) of a chunk is pieces 8 jb + 4 o + i', whose dword c is elements
// 4 (4 o + i') .. + 3 of sub-block 4 jb + c: permutex2var index
// base[c] + 4 o + i' for dword 4 i' + c, base[c] being where sub-block
// 4 jb + c starts in the (lo, hi) pair it reads.
// Weights, base {0, 16, 8, 24} (low nibbles: sub-blocks 4 jb, 4 jb + 2; high: 4 jb + 1, 4 jb + 3):
alignas(64) inline constexpr int32_t kK4WeightIndex[2][16] = {
    {0, 16, 8, 24, 1, 17, 9, 25, 2, 18, 10, 26, 3, 19, 11, 27},
    {4, 20, 12, 28, 5, 21, 13, 29, 6, 22, 14, 30, 7, 23, 15, 31}};
// Activations, base {0, 8, 16, 24} (elements in order):
alignas(64) inline constexpr int32_t kK4ActIndex[2][16] = {
    {0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27},
    {4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31}};

template <bool kHighBit>
struct KRowsK4 {
  using Block = std::conditional_t<kHighBit, BlockQ5_K, BlockQ4_K>;
  static constexpr int kChunks = 2, kIters = 8;
  static constexpr bool kSignedW = false, kMins = true;
  static constexpr GemmTileFn small_gemm = kHighBit ? &gemm_k_vnni_entry<KVnniQ5> : &gemm_k_vnni_entry<KVnniQ4>;
  RILL_KERNEL_TARGET static void repack(const Block& b, KRows16* out, int k, int r) {
    // In qs[64 jb ..], low nibbles: bytes 0..31 sub-block 4 jb, 32..63 4 jb + 2; high: 4 jb + 1, 4 jb + 3.
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    KRows16::Group& g = out->g[k];
    RILL_UNROLL
    for (int jb = 0; jb < 2; ++jb) {
      const __m512i raw = _mm512_loadu_si512(b.qs + 64 * jb);
      __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      if constexpr (kHighBit) {  // bit j of qh[l] is bit 4 of sub-block j's element l
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
        const __m512i sixteen = _mm512_set1_epi8(16);
        const __m512i bits_lo = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (4 * jb))),
                                                   _mm256_set1_epi8(static_cast<char>(1 << (4 * jb + 2))), 1);
        const __m512i bits_hi = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (4 * jb + 1))),
                                                   _mm256_set1_epi8(static_cast<char>(1 << (4 * jb + 3))), 1);
        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, bits_lo), lo, sixteen);
        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bits_hi), hi, sixteen);
      }
      RILL_UNROLL
      for (int o = 0; o < 2; ++o)
        store_pieces(g, 8 * jb + 4 * o, r, _mm512_permutex2var_epi32(lo, _mm512_load_si512(kK4WeightIndex[o]), hi));
    }
    const __m128i s8 = unpack_k4_scales_simd(b.scales);  // sc (bytes 0..7), mn (bytes 8..15)
    const __m512i s32 = _mm512_cvtepu8_epi32(s8);
    _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[0] + 4 * r), _mm512_castsi512_si128(s32));
    _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[1] + 4 * r), _mm512_extracti32x4_epi32(s32, 1));
    alignas(16) int32_t mn[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(mn), _mm_cvtepu8_epi16(_mm_srli_si128(s8, 8)));
    for (int p = 0; p < 4; ++p) out->mins[p][4 * r + k] = mn[p];
    out->d[4 * r + k] = simd::f16(b.d);
    out->dmin[4 * r + k] = simd::f16(b.dmin);
  }
  RILL_KERNEL_TARGET static void prepare(const BlockQ8_K& b, KRowsAct* out, KRowsActMeta* meta) {
    // Elements 128 jb ..: sub-blocks 4 jb, 4 jb + 1 in the first 64 bytes, 4 jb + 2, 4 jb + 3 in the next.
    RILL_UNROLL
    for (int jb = 0; jb < 2; ++jb) {
      const __m512i e0 = _mm512_loadu_si512(b.qs + 128 * jb), e1 = _mm512_loadu_si512(b.qs + 128 * jb + 64);
      RILL_UNROLL
      for (int o = 0; o < 2; ++o)
        _mm512_store_si512(out->q + 128 * jb + 64 * o,
                           _mm512_permutex2var_epi32(e0, _mm512_load_si512(kK4ActIndex[o]), e1));
    }
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
    // sub-block j's sum: bsums[2j] + bsums[2j+1] (|sum| <= 32 * 127: an i16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(meta->sums),
                     _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
    meta->d = b.d;
  }
};
using KRowsQ4 = KRowsK4<false>;
using KRowsQ5 = KRowsK4<true>;

// 16 rows x TB tokens over nbc super-blocks: wr[ib] the repacked rows,
// act[ib * act_stride + t] and meta[same] token t's values. The
// accumulators come from y when not first (the fma chain continues: same
// bits) and go back to y (rows < n_valid only).
template <typename Dec, int TB>
RILL_KERNEL_TARGET void k_rows_tile(int64_t nbc, bool first, const KRows16* wr, const KRowsAct* act,
                                    const KRowsActMeta* meta, int64_t act_stride, int n_valid, float* y,
                                    int64_t y_stride) {
  constexpr int kI = Dec::kIters;
  const __m512i perm = transpose4x4_index();
  const __mmask16 valid = static_cast<__mmask16>((1u << n_valid) - 1);
  __m512 acc[TB];
  RILL_UNROLL
  for (int t = 0; t < TB; ++t)
    acc[t] = first ? _mm512_setzero_ps() : _mm512_permutexvar_ps(perm, _mm512_maskz_loadu_ps(valid, y + t * y_stride));
  for (int64_t ib = 0; ib < nbc; ++ib) {
    const KRows16& w = wr[ib];
    const KRowsAct* a = act + ib * act_stride;
    const KRowsActMeta* am = meta + ib * act_stride;
    __m512i s[4][TB];
    RILL_UNROLL
    for (int k = 0; k < 4; ++k) RILL_UNROLL
    for (int t = 0; t < TB; ++t) s[k][t] = _mm512_setzero_si512();
    RILL_UNROLL
    for (int jb = 0; jb < Dec::kChunks; ++jb) {
      // Each activation piece is loaded once and serves the 4 row groups (k); the weight piece
      // serves the TB tokens: 0.75 loads per vpdpbusd at TB = 2.
      __m512i r[4][TB];
      RILL_UNROLL
      for (int i = 0; i < kI; ++i) {
        __m512i av[TB];
        RILL_UNROLL
        for (int t = 0; t < TB; ++t)
          av[t] = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(a[t].q + 16 * (kI * jb + i))));
        RILL_UNROLL
        for (int k = 0; k < 4; ++k) {
          const __m512i wq = _mm512_load_si512(w.g[k].q[kI * jb + i]);
          RILL_UNROLL
          for (int t = 0; t < TB; ++t) {
            const __m512i r0 = i == 0 ? _mm512_setzero_si512() : r[k][t];
            r[k][t] = Dec::kSignedW ? _mm512_dpbusd_epi32(r0, av[t], wq) : _mm512_dpbusd_epi32(r0, wq, av[t]);
          }
        }
      }
      RILL_UNROLL
      for (int k = 0; k < 4; ++k) {
        const __m512i sc = _mm512_load_si512(w.g[k].sc[jb]);
        RILL_UNROLL
        for (int t = 0; t < TB; ++t) s[k][t] = _mm512_add_epi32(s[k][t], _mm512_mullo_epi32(r[k][t], sc));
      }
    }
    const __m512 wd = _mm512_load_ps(w.d);
    RILL_UNROLL
    for (int t = 0; t < TB; ++t) {
      // Row r's 4 dword lanes of group k -> lane 4 r + k.
      const __m512i u01 =
          _mm512_add_epi32(_mm512_unpacklo_epi32(s[0][t], s[1][t]), _mm512_unpackhi_epi32(s[0][t], s[1][t]));
      const __m512i u23 =
          _mm512_add_epi32(_mm512_unpacklo_epi32(s[2][t], s[3][t]), _mm512_unpackhi_epi32(s[2][t], s[3][t]));
      __m512i sum = _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
      if constexpr (!Dec::kMins) sum = _mm512_sub_epi32(sum, _mm512_load_si512(w.corr));
      const float da = am[t].d;
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(sum), acc[t]);
      if constexpr (Dec::kMins) {
        __m512i ms = _mm512_setzero_si512();
        RILL_UNROLL
        for (int p = 0; p < 4; ++p)
          ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512(w.mins[p]), _mm512_set1_epi32(am[t].sums[p]));
        acc[t] =
            _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(w.dmin), _mm512_set1_ps(-da)), _mm512_cvtepi32_ps(ms), acc[t]);
      }
    }
  }
  RILL_UNROLL
  for (int t = 0; t < TB; ++t) _mm512_mask_storeu_ps(y + t * y_stride, valid, _mm512_permutexvar_ps(perm, acc[t]));
}

using KRowsTileFn = void (*)(int64_t, bool, const KRows16*, const KRowsAct*, const KRowsActMeta*, int64_t, int, float*,
                             int64_t);
template <typename Dec>
inline constexpr KRowsTileFn kKRowsTiles[kRowsTokens] = {&k_rows_tile<Dec, 1>, &k_rows_tile<Dec, 2>};

// GemmTileFn entry. Fewer than kRowsMinTokens token rows: the one-token
// tiles. Otherwise, kRowsChunkBlocks super-blocks at a time: the rows
// repacked in 16-row groups (rows past n_r repeat the last: computed, never
// stored), then per block of kRowsTokenBlock tokens the tokens prepared and
// every 16-row group x 4-token tile (per-thread grow-only buffers). It takes
// any number of tokens (Kernels::gemm_max_tokens), so a prefill repacks each
// weight once.
template <typename Dec>
RILL_KERNEL_TARGET void gemm_k_rows_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                          size_t a_stride, int n_t, float* y, int64_t y_stride) {
  if (n_t < kRowsMinTokens) {
    Dec::small_gemm(n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
    return;
  }
  using Block = typename Dec::Block;
  thread_local std::vector<KRows16> wbuf;
  thread_local std::vector<KRowsAct> abuf;
  thread_local std::vector<KRowsActMeta> mbuf;
  const int64_t nb = n / kQKK;
  const int64_t chunk = nb < kRowsChunkBlocks ? nb : kRowsChunkBlocks;
  const int n_groups = (n_r + 15) / 16;
  const int tb_max = n_t < kRowsTokenBlock ? n_t : kRowsTokenBlock;
  const size_t n_wblocks = static_cast<size_t>(n_groups * chunk), n_ablocks = static_cast<size_t>(tb_max * chunk);
  if (wbuf.size() < n_wblocks) wbuf.resize(n_wblocks);
  if (abuf.size() < n_ablocks) abuf.resize(n_ablocks);
  if (mbuf.size() < n_ablocks) mbuf.resize(n_ablocks);
  KRows16* const wp = wbuf.data();  // (not the thread_locals in the loops: their access is a call)
  KRowsAct* const ap = abuf.data();
  KRowsActMeta* const mp = mbuf.data();
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(a);
  for (int64_t ib0 = 0; ib0 < nb; ib0 += chunk) {
    const int64_t nbc = nb - ib0 < chunk ? nb - ib0 : chunk;
    const size_t chunk_bytes = static_cast<size_t>(nbc) * sizeof(Block);
    for (int m = 0; m < 16 * n_groups; ++m) {
      if (m + kRepackAheadRows < n_r) {
        const auto* pf = wb + static_cast<size_t>(m + kRepackAheadRows) * w_stride + ib0 * sizeof(Block);
        for (size_t l = 0; l < chunk_bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + l), _MM_HINT_T0);
      }
      const int row = m < n_r ? m : n_r - 1;
      const auto* br = reinterpret_cast<const Block*>(wb + static_cast<size_t>(row) * w_stride) + ib0;
      for (int64_t ib = 0; ib < nbc; ++ib) Dec::repack(br[ib], wp + (m / 16) * chunk + ib, (m % 16) / 4, m % 4);
    }
    for (int tb0 = 0; tb0 < n_t; tb0 += kRowsTokenBlock) {
      const int ntb = n_t - tb0 < kRowsTokenBlock ? n_t - tb0 : kRowsTokenBlock;
      for (int t = 0; t < ntb; ++t) {
        const auto* row = reinterpret_cast<const BlockQ8_K*>(ab + static_cast<size_t>(tb0 + t) * a_stride) + ib0;
        for (int64_t ib = 0; ib < nbc; ++ib) Dec::prepare(row[ib], ap + ib * ntb + t, mp + ib * ntb + t);
      }
      for (int g = 0; g < n_groups; ++g) {
        const int n_valid = n_r - 16 * g < 16 ? n_r - 16 * g : 16;
        for (int t0 = 0; t0 < ntb; t0 += kRowsTokens) {
          const int tb = ntb - t0 < kRowsTokens ? ntb - t0 : kRowsTokens;
          kKRowsTiles<Dec>[tb - 1](nbc, ib0 == 0, wp + g * chunk, ap + t0, mp + t0, ntb, n_valid,
                                   y + (tb0 + t0) * y_stride + 16 * g, y_stride);
        }
      }
    }
  }
}

}  // namespace
}  // namespace rill::cpu
