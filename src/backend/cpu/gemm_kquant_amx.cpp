// The K-quant gemm for token batches on AMX int8 tiles (Q4_K, Q5_K, Q6_K,
// IQ4_XS against Q8_K activations), bit-identical to the AVX-512 row tile
// (gemm_kquant_rows_avx512_impl.h); see gemm_kquant_amx.h. The only
// translation unit compiled with -mamx-tile -mamx-int8 (and AVX-512): its
// functions run only after kquant_amx_usable() (kquant_amx_dispatch.cpp).
//
// Arithmetic. Per super-block, rill's K-quant dot is one exact int32
// isum = sum_e w[e] * a[e], w[e] = scale(sub-block of e) * value(e) (Q6_K:
// sc * (q - 32); Q4_K/Q5_K: sc * q, their min term kept apart as msum;
// IQ4_XS: (s - 32) * v), then acc = fma(w.d * a.d, float(isum), acc) (and
// Q4_K/Q5_K acc = fma(-a.d * w.dmin, float(msum), acc)). |w| <= 4096 does
// not fit the tiles' 8 bits, so each weight is split exactly as
// w = 64 * (w >> 6) + (w & 63), both parts signed bytes (-64..64, 0..63), and
// TDPBSSD (s8 x s8 -> i32) sums each part over the super-block's 256
// elements: isum = 64 * C_hi + C_lo, an exact integer identity, so no
// per-sub-block scale multiply is left (the row tile's vpmulld). The float
// epilogue is the row tile's, per super-block, in the same order.
//
// Layout. A tiles: 16 tokens x 64 activation bytes, copied per 32 tokens
// and super-block from the Q8_K rows into one contiguous buffer (ActPanel;
// read in place, each tile row would be a strided, unaligned pair of
// cache lines), tokens past the call's zero. B tiles: 16 weight rows x 64
// elements in the tiles' K/4 x (N x 4) layout, built once per call and row
// chunk from the GGUF blocks (decoded to int16 w, split, transposed by
// dwords) and reused by every token block of the call. C = 16 tokens x 16
// weight rows of int32: two token tiles x the two weight parts fill the 8
// tile registers (A0, A1, B_hi, B_lo, 4 x C).
// GCC 12's AVX-512 extract / convert intrinsics read an undefined source
// vector: not a bug here (as in quants_avx512.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm_kquant_amx.h"
#include "backend/cpu/quants.h"

#define RILL_AMX_UNROLL _Pragma("GCC unroll 16")

namespace rill::cpu {
namespace {

constexpr int64_t kChunkBlocks = 8;  // super-blocks of panels built at a time (a 128-row chunk's: 512 KiB, L2)
constexpr int kPassTokens = 32;      // two 16-token A tiles per pass

// 16 weight rows of one super-block in the B tiles' layout.
struct alignas(64) Panel {
  // Part (0: w >> 6, 1: w & 63), 64-element step s, B-tile row kk: weight row
  // n's elements 64 s + 4 kk .. + 3 at bytes 4 n .. 4 n + 3.
  int8_t b[2][4][16][64];
  float d[16];          // w.d
  float dmin[16];       // Q4_K/Q5_K: w.dmin
  int32_t mins[4][16];  // Q4_K/Q5_K: (mn[2p], mn[2p+1]) as an i16 pair
};

// 32 tokens of one super-block: the A tiles' rows, contiguous (one aligned
// 1 KiB load per tile), and the per-token values of the epilogue. Tokens
// past the call's are zero (computed, never stored).
struct alignas(64) ActPanel {
  int8_t q[4][kPassTokens][64];  // step s, token t: elements 64 s .. 64 s + 63
  float d[kPassTokens];          // a.d
  int32_t msum[kPassTokens][4];  // Q4_K/Q5_K: sub-block sums (S[2p], S[2p+1]) as i16 pairs
};

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows x 64 bytes. The tile state is the thread's for one
// call: loaded at entry and released at exit (TileConfigLease), so no other
// user of AMX on the thread (another library, a later kernel) can leave it
// configured otherwise under us, and an idle thread carries no 8 KiB of tile
// data through its context switches. Both cost nothing next to a call of
// kMinTokens or more tokens.
class TileConfigLease {
 public:
  TileConfigLease() {
    TileConfig cfg;
    for (int i = 0; i < 8; ++i) {
      cfg.colsb[i] = 64;
      cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
  }
  ~TileConfigLease() { _tile_release(); }
  TileConfigLease(const TileConfigLease&) = delete;
  TileConfigLease& operator=(const TileConfigLease&) = delete;
};

// Decoders: a super-block's 256 weights w[e] as int16 in element order
// (v[i]: elements 32 i .. 32 i + 31), plus row n's per-row values in p.

struct AmxQ6 {
  using Block = BlockQ6_K;
  static constexpr DType kType = DType::kQ6_K;
  static constexpr bool kMins = false;
  static void decode(const Block& b, __m512i v[8], Panel& p, int n) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    // Elements 64 jb .. + 63 take qh bits (0, 2) (jb even) or (4, 6) (jb odd) in their two 32-byte halves.
    const __m512i shift_lo = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift_hi = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    const __m512i sc16 =
        _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))));
    const __m512i halves = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
    RILL_AMX_UNROLL
    for (int jb = 0; jb < 4; ++jb) {
      const int h = jb / 2;
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      const __m512i nib = jb % 2 ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
      const __m512i hi2 = _mm512_and_si512(_mm512_srlv_epi16(qh, jb % 2 ? shift_hi : shift_lo), m3);
      const __m512i u = _mm512_or_si512(nib, _mm512_slli_epi16(hi2, 4));  // elements 64 jb .. + 63, 0..63
      RILL_AMX_UNROLL
      for (int o = 0; o < 2; ++o) {
        // elements 64 jb + 32 o ..: sub-blocks j = 4 jb + 2 o and j + 1, 16 lanes each
        const __m512i q =
            _mm512_sub_epi16(_mm512_cvtepu8_epi16(o ? _mm512_extracti64x4_epi64(u, 1) : _mm512_castsi512_si256(u)),
                             _mm512_set1_epi16(32));
        const __m512i sc = _mm512_permutexvar_epi16(_mm512_add_epi16(halves, _mm512_set1_epi16(4 * jb + 2 * o)), sc16);
        v[2 * jb + o] = _mm512_mullo_epi16(q, sc);
      }
    }
    p.d[n] = _cvtsh_ss(b.d);
  }
};

template <bool kHighBit>
struct AmxK4 {
  using Block = std::conditional_t<kHighBit, BlockQ5_K, BlockQ4_K>;
  static constexpr DType kType = kHighBit ? DType::kQ5_K : DType::kQ4_K;
  static constexpr bool kMins = true;
  static void decode(const Block& b, __m512i v[8], Panel& p, int n) {
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, b.scales, &sc[j], &mn[j]);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kHighBit) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    RILL_AMX_UNROLL
    for (int jb = 0; jb < 2; ++jb) {
      // qs[64 jb ..]: low nibbles of bytes 0..31 are sub-block 4 jb, of 32..63 4 jb + 2; high: 4 jb + 1, 4 jb + 3.
      const __m512i raw = _mm512_loadu_si512(b.qs + 64 * jb);
      const __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
      const __m256i part[4] = {_mm512_castsi512_si256(lo), _mm512_castsi512_si256(hi), _mm512_extracti64x4_epi64(lo, 1),
                               _mm512_extracti64x4_epi64(hi, 1)};
      RILL_AMX_UNROLL
      for (int c = 0; c < 4; ++c) {
        const int j = 4 * jb + c;
        __m512i q = _mm512_cvtepu8_epi16(part[c]);
        if constexpr (kHighBit) {  // bit j of qh[l] is bit 4 of sub-block j's element l
          const __mmask32 set = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << j)));
          q = _mm512_mask_add_epi16(q, set, q, _mm512_set1_epi16(16));
        }
        v[j] = _mm512_mullo_epi16(q, _mm512_set1_epi16(sc[j]));
      }
    }
    for (int pp = 0; pp < 4; ++pp) p.mins[pp][n] = static_cast<int32_t>(mn[2 * pp] | (mn[2 * pp + 1] << 16));
    p.d[n] = _cvtsh_ss(b.d);
    p.dmin[n] = _cvtsh_ss(b.dmin);
  }
};
using AmxQ4 = AmxK4<false>;
using AmxQ5 = AmxK4<true>;

struct AmxXS {
  using Block = BlockIQ4_XS;
  static constexpr DType kType = DType::kIQ4_XS;
  static constexpr bool kMins = false;
  static void decode(const Block& b, __m512i v[8], Panel& p, int n) {
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    RILL_AMX_UNROLL
    for (int j = 0; j < 8; ++j) {
      // sub-block j: 16 bytes, low nibbles elements 0..15, high nibbles 16..31
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * j));
      const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(x, m4));
      const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(x, 4), m4));
      const __m512i q = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
      v[j] = _mm512_mullo_epi16(q, _mm512_set1_epi16(static_cast<int16_t>(iq4_xs_scale(j, b) - 32)));
    }
    p.d[n] = _cvtsh_ss(b.d);
  }
};

// r[n] dword k -> r[k] dword n.
inline void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  RILL_AMX_UNROLL
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4 q + c]: in 128-bit lane L, column 4 L + c of rows 4 q .. 4 q + 3.
  __m512i u[16];
  RILL_AMX_UNROLL
  for (int q = 0; q < 4; ++q) {
    u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  RILL_AMX_UNROLL
  for (int c = 0; c < 4; ++c) {
    const __m512i e01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), o01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i e23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i o23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(e01, e23, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(e01, e23, 0xDD);
    r[4 + c] = _mm512_shuffle_i32x4(o01, o23, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(o01, o23, 0xDD);
  }
}

// Super-blocks decoded row by row before their transposes: 16 KiB, in L1.
constexpr int64_t kStageBlocks = 2;

// A 16-row group's decoded rows before the transpose: super-block ib, part, row n.
struct alignas(64) Stage {
  int8_t q[2][16][256];
};

// Weight rows row0 .. row0 + 15 of super-blocks ib0 .. ib0 + nbc - 1 (rows
// from n_r on repeat the last: computed, never stored) into p[0 .. nbc - 1].
// Row by row (each row's blocks are contiguous), prefetching the row
// kPanelAheadRows ahead: this is the weights' first touch, from DRAM in a
// prefill.
template <typename Dec>
void build_panels(const uint8_t* w, size_t w_stride, int row0, int n_r, int64_t ib0, int64_t nbc, Stage* stage,
                  Panel* p) {
  constexpr int kPanelAheadRows = 4;
  const size_t bytes = static_cast<size_t>(nbc) * sizeof(typename Dec::Block);
  for (int n = 0; n < 16; ++n) {
    if (row0 + n + kPanelAheadRows < n_r) {
      const uint8_t* pf =
          w + static_cast<size_t>(row0 + n + kPanelAheadRows) * w_stride + ib0 * sizeof(typename Dec::Block);
      for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + l), _MM_HINT_T0);
    }
    const int row = row0 + n < n_r ? row0 + n : n_r - 1;
    const auto* br = reinterpret_cast<const typename Dec::Block*>(w + static_cast<size_t>(row) * w_stride) + ib0;
    for (int64_t ib = 0; ib < nbc; ++ib) {
      __m512i v[8];
      Dec::decode(br[ib], v, p[ib], n);
      RILL_AMX_UNROLL
      for (int i = 0; i < 8; ++i) {
        const __m512i hi = _mm512_srai_epi16(v[i], 6), lo = _mm512_and_si512(v[i], _mm512_set1_epi16(63));
        _mm256_store_si256(reinterpret_cast<__m256i*>(stage[ib].q[0][n] + 32 * i), _mm512_cvtepi16_epi8(hi));
        _mm256_store_si256(reinterpret_cast<__m256i*>(stage[ib].q[1][n] + 32 * i), _mm512_cvtepi16_epi8(lo));
      }
    }
  }
  for (int64_t ib = 0; ib < nbc; ++ib) {
    for (int part = 0; part < 2; ++part) {
      for (int s = 0; s < 4; ++s) {
        __m512i r[16];
        RILL_AMX_UNROLL
        for (int n = 0; n < 16; ++n) r[n] = _mm512_load_si512(stage[ib].q[part][n] + 64 * s);
        transpose16x16_epi32(r);
        RILL_AMX_UNROLL
        for (int k = 0; k < 16; ++k) _mm512_store_si512(p[ib].b[part][s][k], r[k]);
      }
    }
  }
}

// One super-block of 32 tokens x 16 weight rows into acc[t] (lanes: rows).
template <bool kMins>
void tile_superblock(const Panel& p, const ActPanel& ap, float (*acc)[16]) {
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  RILL_AMX_UNROLL
  for (int s = 0; s < 4; ++s) {
    _tile_loadd(0, ap.q[s][0], 64);
    _tile_loadd(1, ap.q[s][16], 64);
    _tile_loadd(2, p.b[0][s], 64);
    _tile_loadd(3, p.b[1][s], 64);
    _tile_dpbssd(4, 0, 2);
    _tile_dpbssd(5, 0, 3);
    _tile_dpbssd(6, 1, 2);
    _tile_dpbssd(7, 1, 3);
  }
  alignas(64) int32_t c[4][16][16];  // tokens 0..15 hi, lo; tokens 16..31 hi, lo
  _tile_stored(4, c[0], 64);
  _tile_stored(5, c[1], 64);
  _tile_stored(6, c[2], 64);
  _tile_stored(7, c[3], 64);
  const __m512 wd = _mm512_load_ps(p.d);
  RILL_AMX_UNROLL
  for (int t = 0; t < kPassTokens; ++t) {
    const int32_t* hi = c[2 * (t / 16)][t % 16];
    const int32_t* lo = c[2 * (t / 16) + 1][t % 16];
    const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(hi), 6), _mm512_load_si512(lo));
    const float da = ap.d[t];
    __m512 a = _mm512_fmadd_ps(_mm512_mul_ps(wd, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(isum), _mm512_load_ps(acc[t]));
    if constexpr (kMins) {
      __m512i ms = _mm512_setzero_si512();
      RILL_AMX_UNROLL
      for (int pp = 0; pp < 4; ++pp)
        ms = _mm512_dpwssd_epi32(ms, _mm512_load_si512(p.mins[pp]), _mm512_set1_epi32(ap.msum[t][pp]));
      a = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(p.dmin), _mm512_set1_ps(-da)), _mm512_cvtepi32_ps(ms), a);
    }
    _mm512_store_ps(acc[t], a);
  }
}

// Tokens t0 .. t0 + nt - 1 (nt <= 32) of super-block ib into out.
template <bool kMins>
void prepare_acts(const uint8_t* a, size_t a_stride, int t0, int nt, int64_t ib, ActPanel& out) {
  for (int t = 0; t < kPassTokens; ++t) {
    if (t >= nt) {
      for (int s = 0; s < 4; ++s) _mm512_store_si512(out.q[s][t], _mm512_setzero_si512());
      out.d[t] = 0.0f;
      if constexpr (kMins) _mm_store_si128(reinterpret_cast<__m128i*>(out.msum[t]), _mm_setzero_si128());
      continue;
    }
    const auto& b = reinterpret_cast<const BlockQ8_K*>(a + static_cast<size_t>(t0 + t) * a_stride)[ib];
    RILL_AMX_UNROLL
    for (int s = 0; s < 4; ++s) _mm512_store_si512(out.q[s][t], _mm512_loadu_si512(b.qs + 64 * s));
    out.d[t] = b.d;
    if constexpr (kMins) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.bsums));
      // sub-block j's sum: bsums[2j] + bsums[2j+1] (|sum| <= 32 * 128: an i16)
      _mm_store_si128(reinterpret_cast<__m128i*>(out.msum[t]),
                      _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
    }
  }
}

// GemmTileFn entry (contract in kernels.h). Fewer than kMinTokens token rows:
// the fallback (the AVX-512 row tile / one-token tiles). Otherwise per chunk
// of kChunkBlocks super-blocks: every 16-row group's panels built, then per
// 32 tokens and 16-row group the chunk's super-blocks in order, the float
// accumulators carried through y between chunks (same bits).
template <typename Dec>
void gemm_amx_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a, size_t a_stride, int n_t,
                    float* y, int64_t y_stride) {
  if (n_t < amx_detail::kMinTokens) {
    amx_detail::g_fallback[static_cast<size_t>(Dec::kType)](n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
    return;
  }
  const TileConfigLease tiles;
  thread_local std::vector<Panel> panel_buf;
  thread_local std::vector<ActPanel> act_buf;
  thread_local std::vector<Stage> stage_buf;
  const int64_t nb = n / kQKK;
  const int64_t chunk = nb < kChunkBlocks ? nb : kChunkBlocks;
  const int n_groups = (n_r + 15) / 16;
  if (panel_buf.size() < static_cast<size_t>(n_groups * chunk)) panel_buf.resize(static_cast<size_t>(n_groups * chunk));
  if (act_buf.size() < static_cast<size_t>(chunk)) act_buf.resize(static_cast<size_t>(chunk));
  if (stage_buf.size() < kStageBlocks) stage_buf.resize(kStageBlocks);
  Panel* const panels = panel_buf.data();  // (not the thread_locals in the loops: their access is a call)
  ActPanel* const acts = act_buf.data();
  Stage* const stages = stage_buf.data();
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* a8 = static_cast<const uint8_t*>(a);
  for (int64_t ib0 = 0; ib0 < nb; ib0 += chunk) {
    const int64_t nbc = nb - ib0 < chunk ? nb - ib0 : chunk;
    for (int g = 0; g < n_groups; ++g)
      for (int64_t ib = 0; ib < nbc; ib += kStageBlocks)
        build_panels<Dec>(wb, w_stride, 16 * g, n_r, ib0 + ib, nbc - ib < kStageBlocks ? nbc - ib : kStageBlocks,
                          stages, panels + g * chunk + ib);
    for (int t0 = 0; t0 < n_t; t0 += kPassTokens) {
      const int nt = n_t - t0 < kPassTokens ? n_t - t0 : kPassTokens;
      for (int64_t ib = 0; ib < nbc; ++ib) prepare_acts<Dec::kMins>(a8, a_stride, t0, nt, ib0 + ib, acts[ib]);
      for (int g = 0; g < n_groups; ++g) {
        const int n_valid = n_r - 16 * g < 16 ? n_r - 16 * g : 16;
        const auto valid = static_cast<__mmask16>((1u << n_valid) - 1);
        float* yg = y + t0 * y_stride + 16 * g;
        alignas(64) float acc[kPassTokens][16];
        for (int t = 0; t < kPassTokens; ++t)
          _mm512_store_ps(acc[t],
                          ib0 == 0 || t >= nt ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid, yg + t * y_stride));
        for (int64_t ib = 0; ib < nbc; ++ib) tile_superblock<Dec::kMins>(panels[g * chunk + ib], acts[ib], acc);
        for (int t = 0; t < nt; ++t) _mm512_mask_storeu_ps(yg + t * y_stride, valid, _mm512_load_ps(acc[t]));
      }
    }
  }
}

}  // namespace

namespace amx_detail {
GemmTileFn amx_entry(DType w) {
  switch (w) {
    case DType::kQ4_K:
      return &gemm_amx_entry<AmxQ4>;
    case DType::kQ5_K:
      return &gemm_amx_entry<AmxQ5>;
    case DType::kQ6_K:
      return &gemm_amx_entry<AmxQ6>;
    case DType::kIQ4_XS:
      return &gemm_amx_entry<AmxXS>;
    default:
      return nullptr;
  }
}
}  // namespace amx_detail

}  // namespace rill::cpu
