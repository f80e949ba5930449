// AVX-512 BW + VNNI: the Q2_K, Q3_K and IQ4_XS tiles on 512-bit vectors
// (two 32-element chunks per zmm: maddubs, then vpdpwssd adds the scaled i16
// pair sums; the sign trick's sign(a, w) is a masked negate with w's sign
// bits taken once per tile); Q2_K/Q3_K folded to llama.cpp's 8 lanes (lane
// l + lane l + 8: integer sums, so the same bits) before the convert, IQ4_XS
// summed to one exact int32 per super-block then one fma; IQ4_NL on the
// 256-bit tiles of gemm_iquant_x86_impl.h with vpdpbusd. 32 vector
// registers: 4 x 4 tiles (IQ4_NL 4 x 2). With 8+ token rows (prefill)
// IQ4_XS runs the row tile of gemm_kquant_rows_avx512_impl.h (KRowsXS; its
// one-token tile sums each super-block to one int32 too), and with 4+
// IQ4_NL its own token-pair tile (gemm_nl_pair_tile).
// Installed only with AVX512_VNNI.
#define RILL_KERNEL_TARGET __attribute__((target("avx512vnni,bmi2")))  // every AVX-512 CPU has BMI2
// GCC 12's AVX-512 permute / extract intrinsics read an undefined source
// vector (gemm_kquant_rows_avx512_impl.h): not a bug here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <vector>

#include "backend/cpu/gemm_iquant_x86_impl.h"
#include "backend/cpu/gemm_kquant_rows_avx512_impl.h"

namespace rill::cpu {
namespace {

struct IqOpsVnni {
  static constexpr int kMaxTK = 4;
  static constexpr int kMaxTNl = 2;
  RILL_KERNEL_TARGET static __m256i madd_acc(__m256i acc, __m256i p16, __m256i s) {
    return _mm256_dpwssd_epi32(acc, p16, s);
  }
  RILL_KERNEL_TARGET static __m256i dot(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
  }
};

// A Q2_K / Q3_K super-block decoded into registers: zmm c holds chunks 2c
// and 2c+1 (elements 64c..64c+63; Q3_K as |value| with the sign mask neg[c]),
// sc[c] the i16 scale of each of its maddubs lanes (sub-block 4c + i / 8).
struct ZDec {
  __m512i q[4];
  __m512i sc[4];
  __mmask64 neg[4];
  __m256i mins;  // Q2_K: the 16 mins (i16), multiplying bsums
  float d, dmin;
};

// The 16 i16 scales s16 spread over the four zmm's maddubs lanes.
RILL_KERNEL_TARGET static inline void spread_scales_16(__m256i s16, __m512i sc[4]) {
  const __m512i base = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                                          16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         3);
  const __m512i s = _mm512_castsi256_si512(s16);
  RILL_UNROLL
  for (int c = 0; c < 4; ++c)
    sc[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(base, _mm512_set1_epi16(static_cast<short>(4 * c))), s);
}

// The 2 low bits of elements 64c..64c+63: (qs[32h + l] >> 2k) & 3 for h = c / 2,
// k = 2 (c % 2) in the low 256 bits and k + 1 in the high ones.
RILL_KERNEL_TARGET static inline __m512i low2_pair(const uint8_t* qs, int c) {
  const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (c / 2))));
  const int k = 2 * (c % 2);
  const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(2 * k)),
                                           _mm256_set1_epi16(static_cast<short>(2 * k + 2)), 1);
  return _mm512_and_si512(_mm512_srlv_epi16(raw, shift), _mm512_set1_epi8(3));
}

struct ZDecQ2K {
  using Block = BlockQ2_K;
  static constexpr bool kSigned = false, kMins = true;
  RILL_KERNEL_TARGET static void decode(const Block* b, ZDec* z) {
    RILL_UNROLL
    for (int c = 0; c < 4; ++c) z->q[c] = low2_pair(b->qs, c);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales));
    spread_scales_16(_mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F))), z->sc);
    z->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
    z->d = simd::f16(b->d);
    z->dmin = simd::f16(b->dmin);
  }
};

struct ZDecQ3K {
  using Block = BlockQ3_K;
  static constexpr bool kSigned = true, kMins = false;
  RILL_KERNEL_TARGET static void decode(const Block* b, ZDec* z) {
    const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->hmask)));
    RILL_UNROLL
    for (int c = 0; c < 4; ++c) {
      // bit 4h + k of hmask[l] (srlv_epi16 by < 8 keeps each byte's own bit at bit 0)
      const int bit = 4 * (c / 2) + 2 * (c % 2);
      const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(bit)),
                                               _mm256_set1_epi16(static_cast<short>(bit + 1)), 1);
      const __m512i high = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hm, shift), _mm512_set1_epi8(1)), 2);
      const __m512i v = _mm512_sub_epi8(_mm512_or_si512(low2_pair(b->qs, c), high), _mm512_set1_epi8(4));
      z->q[c] = _mm512_abs_epi8(v);
      z->neg[c] = _mm512_movepi8_mask(v);
    }
    uint32_t aux[3];
    std::memcpy(aux, b->scales, 12);
    const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
    const __m128i s8 =
        _mm_sub_epi8(_mm_setr_epi32(static_cast<int>((aux[0] & k2) | ((aux[2] & k1) << 4)),
                                    static_cast<int>((aux[1] & k2) | (((aux[2] >> 2) & k1) << 4)),
                                    static_cast<int>(((aux[0] >> 4) & k2) | (((aux[2] >> 4) & k1) << 4)),
                                    static_cast<int>(((aux[1] >> 4) & k2) | (((aux[2] >> 6) & k1) << 4))),
                     _mm_set1_epi8(32));
    spread_scales_16(_mm256_cvtepi8_epi16(s8), z->sc);
    z->d = simd::f16(b->d);
    z->dmin = 0.0f;
  }
};

template <typename Dec, int R, int T>
RILL_KERNEL_TARGET void gemm_iq_tile_512(int64_t n, const void* w, size_t w_stride, const void* a, size_t a_stride,
                                         float* y, int64_t y_stride) {
  using WBlock = typename Dec::Block;
  const int64_t nb = n / kQKK;
  const WBlock* wr[R];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const WBlock*>(static_cast<const uint8_t*>(w) + r * w_stride);
  __m256 acc[R][T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t ib = 0; ib < nb; ++ib) {
    ZDec dec[R];
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      if constexpr (T == 1) {
        const char* pf = reinterpret_cast<const char*>(wr[r] + ib + kIqPrefetchBlocks);
        RILL_UNROLL
        for (size_t l = 0; l < sizeof(WBlock); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
      }
      Dec::decode(wr[r] + ib, &dec[r]);
    }
    RILL_UNROLL
    for (int t = 0; t < T; ++t) {
      const BlockQ8_K& ab = reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + t * a_stride)[ib];
      __m512i av[4];
      RILL_UNROLL
      for (int c = 0; c < 4; ++c) av[c] = _mm512_loadu_si512(ab.qs + 64 * c);
      RILL_UNROLL
      for (int r = 0; r < R; ++r) {
        __m512i isum = _mm512_setzero_si512();
        RILL_UNROLL
        for (int c = 0; c < 4; ++c) {
          __m512i as = av[c];
          if constexpr (Dec::kSigned) as = _mm512_mask_sub_epi8(as, dec[r].neg[c], _mm512_setzero_si512(), as);
          isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(dec[r].q[c], as), dec[r].sc[c]);
        }
        const __m256i i8 = _mm256_add_epi32(_mm512_castsi512_si256(isum), _mm512_extracti64x4_epi64(isum, 1));
        if constexpr (Dec::kMins) {
          const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.bsums));
          acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(-ab.d * dec[r].dmin),
                                      _mm256_cvtepi32_ps(_mm256_madd_epi16(dec[r].mins, bs)), acc[r][t]);
        }
        acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * dec[r].d), _mm256_cvtepi32_ps(i8), acc[r][t]);
      }
    }
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) y[t * y_stride + r] = simd::hsum(acc[r][t]);
}

template <typename Dec, int... I>
constexpr std::array<TileFn, sizeof...(I)> iq_tiles_512(std::integer_sequence<int, I...>) {
  return {&gemm_iq_tile_512<Dec, I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
template <typename Dec>
inline constexpr auto kIqTiles512 = iq_tiles_512<Dec>(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

// IQ4_XS straight from its blocks: a zmm of 64 packed bytes holds, in its
// low nibbles, elements 0..15 of four sub-blocks (16-byte lane m: sub-block
// m) and in its high nibbles their elements 16..31. The activations are
// reordered to match once per call and token (XsAct): A[2h] = elements
// 0..15 of sub-blocks 4h..4h+3, A[2h+1] their elements 16..31. The 16 i32
// lanes of a (row, token) sum to its super-block's exact int32 (rill's
// IQ4_XS definition, quants_iq_ref.cpp), converted and fma'd once.
struct XsAct {
  alignas(64) int8_t qs[4][64];
  float d;
};

RILL_KERNEL_TARGET void prepare_xs_acts(XsAct* out, int64_t nb, const BlockQ8_K* a) {
  const __m512i even = _mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), odd = _mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15);
  for (int64_t ib = 0; ib < nb; ++ib) {
    for (int h = 0; h < 2; ++h) {
      const __m512i x0 = _mm512_loadu_si512(a[ib].qs + 128 * h), x1 = _mm512_loadu_si512(a[ib].qs + 128 * h + 64);
      _mm512_store_si512(out[ib].qs[2 * h], _mm512_permutex2var_epi64(x0, even, x1));
      _mm512_store_si512(out[ib].qs[2 * h + 1], _mm512_permutex2var_epi64(x0, odd, x1));
    }
    out[ib].d = a[ib].d;
  }
}

// |kIq4nlValues|, once per 128-bit lane (vpshufb looks up within lanes).
alignas(64) inline constexpr int8_t kIq4nlAbs4[64] = {127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113,
                                                      127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113,
                                                      127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113,
                                                      127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113};

template <int R, int T>
RILL_KERNEL_TARGET void gemm_xs_tile(int64_t n, const void* w, size_t w_stride, const XsAct* act, int64_t act_stride,
                                     float* y, int64_t y_stride) {
  const int64_t nb = n / kQKK;
  const BlockIQ4_XS* wr[R];
  RILL_UNROLL
  for (int r = 0; r < R; ++r)
    wr[r] = reinterpret_cast<const BlockIQ4_XS*>(static_cast<const uint8_t*>(w) + r * w_stride);
  float acc[R][T];
  RILL_UNROLL
  for (int r = 0; r < R; ++r) RILL_UNROLL
  for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
  __m128 acc1 = _mm_setzero_ps();  // T = 1: row r's accumulator in lane r
  const __m512i abs_table = _mm512_load_si512(kIq4nlAbs4);
  const __m512i m4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
  // i16 lane i of the scale vectors: sub-block i / 8 (low half of the block) or 4 + i / 8.
  const __m512i lane_sb = _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                                             16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            3);
  const __m512i lane_sb_hi = _mm512_add_epi16(lane_sb, _mm512_set1_epi16(4));
  for (int64_t ib = 0; ib < nb; ++ib) {
    __m512i q[R][4];
    __mmask64 neg[R][4];
    __m512i sc[R][2];
    float dw[R];
    RILL_UNROLL
    for (int r = 0; r < R; ++r) {
      const BlockIQ4_XS& b = wr[r][ib];
      if constexpr (T == 1) {
        const char* pf = reinterpret_cast<const char*>(wr[r] + ib + kIqPrefetchBlocks);
        RILL_UNROLL
        for (size_t l = 0; l < sizeof(BlockIQ4_XS); l += 64) _mm_prefetch(pf + l, _MM_HINT_T0);
      }
      const __m512i lo = _mm512_loadu_si512(b.qs), hi = _mm512_loadu_si512(b.qs + 64);
      const __m512i nib[4] = {_mm512_and_si512(lo, m4), _mm512_and_si512(_mm512_srli_epi16(lo, 4), m4),
                              _mm512_and_si512(hi, m4), _mm512_and_si512(_mm512_srli_epi16(hi, 4), m4)};
      RILL_UNROLL
      for (int z = 0; z < 4; ++z) {
        q[r][z] = _mm512_shuffle_epi8(abs_table, nib[z]);
        neg[r][z] = _mm512_cmplt_epu8_mask(nib[z], eight);  // codes 0..7 are the negative values
      }
      // byte j: sub-block j's 6-bit scale (iq4_xs_scale), from its nibble and its 2 high bits
      uint32_t sl;
      std::memcpy(&sl, b.scales_l, 4);
      const uint64_t s6 = _pdep_u64(sl, 0x0F0F0F0F0F0F0F0FULL) | _pdep_u64(b.scales_h, 0x3030303030303030ULL);
      const __m128i s8 = _mm_sub_epi8(_mm_cvtsi64_si128(static_cast<long long>(s6)), _mm_set1_epi8(32));
      const __m512i s16 = _mm512_castsi128_si512(_mm_cvtepi8_epi16(s8));
      sc[r][0] = _mm512_permutexvar_epi16(lane_sb, s16);
      sc[r][1] = _mm512_permutexvar_epi16(lane_sb_hi, s16);
      dw[r] = simd::f16(b.d);
    }
    RILL_UNROLL
    for (int t = 0; t < T; ++t) {
      const XsAct& ab = act[t * act_stride + ib];
      __m512i av[4];
      RILL_UNROLL
      for (int z = 0; z < 4; ++z) av[z] = _mm512_load_si512(ab.qs[z]);
      __m512i zs[4];  // T = 1: row r's 16 partial sums
      RILL_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m512i zero = _mm512_setzero_si512();
        __m512i part[2];  // low nibbles (z = 0, 2), high nibbles (z = 1, 3)
        RILL_UNROLL
        for (int e = 0; e < 2; ++e) {
          const __m512i a0 = _mm512_mask_sub_epi8(av[e], neg[r][e], zero, av[e]);
          const __m512i a2 = _mm512_mask_sub_epi8(av[e + 2], neg[r][e + 2], zero, av[e + 2]);
          part[e] = _mm512_dpwssd_epi32(zero, _mm512_maddubs_epi16(q[r][e], a0), sc[r][0]);
          part[e] = _mm512_dpwssd_epi32(part[e], _mm512_maddubs_epi16(q[r][e + 2], a2), sc[r][1]);
        }
        if constexpr (T == 1) {
          zs[r] = _mm512_add_epi32(part[0], part[1]);
        } else {
          const int32_t isum = _mm512_reduce_add_epi32(_mm512_add_epi32(part[0], part[1]));
          acc[r][t] = std::fmaf(dw[r] * ab.d, static_cast<float>(isum), acc[r][t]);
        }
      }
      if constexpr (T == 1) {
        // The rows' 16 lanes each -> lane r of one xmm (integers: any order), then one
        // convert and fma for the 4 rows, each lane the scalar fma of the definition.
        RILL_UNROLL
        for (int r = R; r < 4; ++r) zs[r] = zs[R - 1];
        const __m512i u01 = _mm512_add_epi32(_mm512_unpacklo_epi32(zs[0], zs[1]), _mm512_unpackhi_epi32(zs[0], zs[1]));
        const __m512i u23 = _mm512_add_epi32(_mm512_unpacklo_epi32(zs[2], zs[3]), _mm512_unpackhi_epi32(zs[2], zs[3]));
        const __m512i v = _mm512_add_epi32(_mm512_unpacklo_epi64(u01, u23), _mm512_unpackhi_epi64(u01, u23));
        const __m256i v2 = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
        const __m128i sb = _mm_add_epi32(_mm256_castsi256_si128(v2), _mm256_extracti128_si256(v2, 1));
        const __m128 dwv = _mm_setr_ps(dw[0], dw[R > 1 ? 1 : 0], dw[R > 2 ? 2 : 0], dw[R > 3 ? 3 : 0]);
        acc1 = _mm_fmadd_ps(_mm_mul_ps(dwv, _mm_set1_ps(ab.d)), _mm_cvtepi32_ps(sb), acc1);
      }
    }
  }
  if constexpr (T == 1) {
    alignas(16) float o[4];
    _mm_store_ps(o, acc1);
    RILL_UNROLL
    for (int r = 0; r < R; ++r) y[r] = o[r];
    return;
  }
  RILL_UNROLL
  for (int t = 0; t < T; ++t) RILL_UNROLL
  for (int r = 0; r < R; ++r) y[t * y_stride + r] = acc[r][t];
}

using XsTileFn = void (*)(int64_t, const void*, size_t, const XsAct*, int64_t, float*, int64_t);
template <int... I>
constexpr std::array<XsTileFn, sizeof...(I)> xs_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_xs_tile<I / kMaxTileCols + 1, I % kMaxTileCols + 1>...};
}
inline constexpr auto kXsTiles = xs_tiles(std::make_integer_sequence<int, kMaxTileRows * kMaxTileCols>{});

// GemmTileFn entry: token rows in quads, each reordered once (XsAct per
// super-block, in a grow-only per-thread buffer that allocates only for a
// longer row or the first call), then every row tile against them.
RILL_KERNEL_TARGET void gemm_xs_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                      size_t a_stride, int n_t, float* y, int64_t y_stride) {
  thread_local std::vector<XsAct> act;
  const int64_t nb = n / kQKK;
  if (static_cast<int64_t>(act.size()) < kMaxTileCols * nb) act.resize(static_cast<size_t>(kMaxTileCols * nb));
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int t0 = 0; t0 < n_t; t0 += kMaxTileCols) {
    const int nt = n_t - t0 < kMaxTileCols ? n_t - t0 : kMaxTileCols;
    for (int t = 0; t < nt; ++t)
      prepare_xs_acts(act.data() + t * nb, nb,
                      reinterpret_cast<const BlockQ8_K*>(static_cast<const uint8_t*>(a) + (t0 + t) * a_stride));
    for (int r0 = 0; r0 < n_r; r0 += kMaxTileRows) {
      const int nr = n_r - r0 < kMaxTileRows ? n_r - r0 : kMaxTileRows;
      kXsTiles[(nr - 1) * kMaxTileCols + (nt - 1)](n, wb + static_cast<size_t>(r0) * w_stride, w_stride, act.data(), nb,
                                                   y + t0 * y_stride + r0, y_stride);
    }
  }
}

// IQ4_XS for the row tile of gemm_kquant_rows_avx512_impl.h (8+ token
// rows), on the same super-block int32 as the tiles above. As Q4_K/Q5_K,
// chunk jb is sub-blocks 4 jb .. 4 jb + 3 over 8 pieces; as Q6_K the weights
// are signed (the IQ4 values themselves, -127..113) against activations
// biased to a + 128, the bias's 128 * sum_j s[j] * sum_{e in j} v[e] per row
// (corr) subtracted once per super-block.
struct KRowsXS {
  using Block = BlockIQ4_XS;
  static constexpr int kChunks = 2, kIters = 8;
  static constexpr bool kSignedW = true, kMins = false;
  static constexpr GemmTileFn small_gemm = &gemm_xs_entry;
  // Row 4 k + r of out from b.
  RILL_KERNEL_TARGET static void repack(const Block& b, KRows16* out, int k, int r) {
    // Chunk jb's 64 bytes: 128-bit lane c is sub-block 4 jb + c, its low nibbles elements 0..15,
    // its high nibbles 16..31; piece 8 jb + 4 o + i' takes dword i' of lane c (o = 0: low, 1: high)
    // into dword 4 i' + c, the dword transpose.
    const __m512i perm = transpose4x4_index();
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
    const __m512i m4 = _mm512_set1_epi8(0x0F), ones = _mm512_set1_epi8(1);
    KRows16::Group& g = out->g[k];
    uint32_t sl;
    std::memcpy(&sl, b.scales_l, 4);
    const uint64_t s6 = _pdep_u64(sl, 0x0F0F0F0F0F0F0F0FULL) | _pdep_u64(b.scales_h, 0x3030303030303030ULL);
    const __m512i s32 =
        _mm512_cvtepi8_epi32(_mm_sub_epi8(_mm_cvtsi64_si128(static_cast<long long>(s6)), _mm_set1_epi8(32)));
    __m512i weighted = _mm512_setzero_si512();  // sum over elements of s * v
    RILL_UNROLL
    for (int jb = 0; jb < 2; ++jb) {
      const __m512i raw = _mm512_loadu_si512(b.qs + 64 * jb);
      const __m512i lo = _mm512_shuffle_epi8(table, _mm512_and_si512(raw, m4));
      const __m512i hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
      store_pieces(g, 8 * jb, r, _mm512_permutexvar_epi32(perm, lo));
      store_pieces(g, 8 * jb + 4, r, _mm512_permutexvar_epi32(perm, hi));
      // dword d of the 4-sums belongs to sub-block 4 jb + d / 4
      const __m512i sum4 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, lo), ones, hi);
      const __m512i sc_of = _mm512_permutexvar_epi32(
          _mm512_add_epi32(_mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
                           _mm512_set1_epi32(4 * jb)),
          s32);
      weighted = _mm512_add_epi32(weighted, _mm512_mullo_epi32(sum4, sc_of));
    }
    RILL_UNROLL
    for (int jb = 0; jb < 2; ++jb) _mm_store_si128(reinterpret_cast<__m128i*>(g.sc[jb] + 4 * r), lane128(s32, jb));
    out->corr[4 * r + k] = 128 * _mm512_reduce_add_epi32(weighted);
    out->d[4 * r + k] = simd::f16(b.d);
  }
  RILL_KERNEL_TARGET static void prepare(const BlockQ8_K& b, KRowsAct* out, KRowsActMeta* meta) {
    // The elements in Q4_K/Q5_K's piece order (the same sub-blocks per chunk), biased to unsigned.
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    RILL_UNROLL
    for (int jb = 0; jb < 2; ++jb) {
      const __m512i e0 = _mm512_loadu_si512(b.qs + 128 * jb), e1 = _mm512_loadu_si512(b.qs + 128 * jb + 64);
      RILL_UNROLL
      for (int o = 0; o < 2; ++o)
        _mm512_store_si512(
            out->q + 128 * jb + 64 * o,
            _mm512_xor_si512(_mm512_permutex2var_epi32(e0, _mm512_load_si512(kK4ActIndex[o]), e1), bias));
    }
    meta->d = b.d;
  }
};

// IQ4_NL x Q8_0 for 4+ token rows, in the token-pair layout of the K-quant
// tile on 32-element blocks: the activations repacked once per call, one
// zmm per block and token pair ([token 2p's 32 | token 2p+1's 32], NlPairs),
// a weight block decoded once per row as |w| and a sign mask in both
// halves, then per pair one masked negate and one vpdpbusd give lanes 0..7
// of token 2p's llama.cpp lanes and 8..15 of 2p+1's. Each block's convert
// and fma with d = a.d * w.d go, as llama.cpp's, into one accumulator for
// even blocks and one for odd; an odd last block is its scalar tail.
inline constexpr int kNlPairs = 8;  // token pairs per group, at most
struct NlPairs {                    // one block of a 16-token group
  alignas(64) int8_t qs[kNlPairs][64];
  alignas(64) float dpair[kNlPairs][16];  // a.d of token 2p in lanes 0..7, of 2p+1 in 8..15
};
struct alignas(64) NlPairState {
  float acc[2][kNlPairs][16];
};
inline constexpr int64_t kNlChunkBlocks = 32;  // a chunk's NlPairs: 32 KiB, in L1 while the rows pass
inline constexpr int kNlPairMinTokens = 4;     // fewer: the 256-bit tiles (4 and 8 tokens: 2.0x and 2.3x faster here)

RILL_KERNEL_TARGET void prepare_nl_pairs(NlPairs* out, int64_t nb, const uint8_t* a, size_t a_stride, int n_t) {
  constexpr int kT = 2 * kNlPairs;
  const BlockQ8_0* ar[kT];
  for (int t = 0; t < kT; ++t) ar[t] = reinterpret_cast<const BlockQ8_0*>(a + (t < n_t ? t : n_t - 1) * a_stride);
  const int n_pairs = (n_t + 1) / 2;
  for (int64_t ib = 0; ib < nb; ++ib)
    for (int p = 0; p < n_pairs; ++p) {
      const BlockQ8_0& b0 = ar[2 * p][ib];
      const BlockQ8_0& b1 = ar[2 * p + 1][ib];
      _mm256_store_si256(reinterpret_cast<__m256i*>(out[ib].qs[p]),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0.qs)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out[ib].qs[p] + 32),
                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1.qs)));
      _mm512_store_ps(out[ib].dpair[p],
                      _mm512_insertf32x8(_mm512_set1_ps(simd::f16(b0.d)), _mm256_set1_ps(simd::f16(b1.d)), 1));
    }
}

// 16 bytes of nibbles -> |value| and (w < 0) mask, elements 0..15 in 128-bit
// lanes 0 and 2, 16..31 in 1 and 3 (as KPairXS::decode_one).
RILL_KERNEL_TARGET static inline void decode_iq4_pair(const uint8_t* qs, __m512i* q, __mmask64* neg) {
  const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0x0004000400040004LL,
                                          0x0004000400040004LL);
  const __m512i raw = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(raw, shift), _mm512_set1_epi8(0x0F));
  *q = _mm512_shuffle_epi8(_mm512_load_si512(kIq4nlAbs4), nib);
  *neg = _mm512_cmplt_epu8_mask(nib, _mm512_set1_epi8(8));  // codes 0..7 are the negative values
}

// One weight row against a group of 2P tokens over block pairs [jb0, jb1)
// (blocks 2jb, 2jb + 1); accumulators from / to st between column chunks.
// When last: the two accumulators reduced, the odd last block of an odd
// count added, token t written to y[t * y_stride].
template <int P>
RILL_KERNEL_TARGET void gemm_nl_pair_tile(int64_t jb0, int64_t jb1, bool first, bool last, int64_t nb, const void* w,
                                          size_t w_stride, const NlPairs* act, int n_t, NlPairState* st, float* y,
                                          int64_t y_stride) {
  const auto* wr = static_cast<const BlockIQ4_NL*>(w);
  __m512 acc[2][P];
  RILL_UNROLL
  for (int h = 0; h < 2; ++h) RILL_UNROLL
  for (int p = 0; p < P; ++p) acc[h][p] = first ? _mm512_setzero_ps() : _mm512_load_ps(st->acc[h][p]);
  for (int64_t jb = jb0; jb < jb1; ++jb) {
    // 36 bytes per block pair: the next chunk's row (w + w_stride) when past this one.
    const int64_t jpf = jb + 16;
    const char* pf = jpf < jb1 ? reinterpret_cast<const char*>(wr + 2 * jpf)
                               : reinterpret_cast<const char*>(wr + 2 * (jb0 + jpf - jb1)) + w_stride;
    _mm_prefetch(pf, _MM_HINT_T0);
    RILL_UNROLL
    for (int h = 0; h < 2; ++h) {
      const int64_t ib = 2 * jb + h;
      __m512i q;
      __mmask64 neg;
      decode_iq4_pair(wr[ib].qs, &q, &neg);
      const __m512 vd = _mm512_set1_ps(simd::f16(wr[ib].d));
      const NlPairs& ab = act[ib];
      RILL_UNROLL
      for (int p = 0; p < P; ++p) {
        const __m512i av = _mm512_load_si512(ab.qs[p]);
        const __m512i i =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av));
        acc[h][p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(ab.dpair[p]), vd), _mm512_cvtepi32_ps(i), acc[h][p]);
      }
    }
  }
  if (!last) {
    RILL_UNROLL
    for (int h = 0; h < 2; ++h) RILL_UNROLL
    for (int p = 0; p < P; ++p) _mm512_store_ps(st->acc[h][p], acc[h][p]);
    return;
  }
  alignas(64) float a[P][16];
  alignas(64) int32_t tail[P][16];
  const bool odd = nb % 2;
  __m512i q;
  __mmask64 neg;
  if (odd) decode_iq4_pair(wr[nb - 1].qs, &q, &neg);
  RILL_UNROLL
  for (int p = 0; p < P; ++p) {
    _mm512_store_ps(a[p], _mm512_add_ps(acc[0][p], acc[1][p]));
    if (odd) {
      const __m512i av = _mm512_load_si512(act[nb - 1].qs[p]);
      _mm512_store_si512(tail[p], _mm512_dpbusd_epi32(_mm512_setzero_si512(), q,
                                                      _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av)));
    }
  }
  const float dw = odd ? simd::f16(wr[nb - 1].d) : 0.0f;
  for (int t = 0; t < n_t && t < 2 * P; ++t) {
    const float* l = a[t / 2] + 8 * (t % 2);
    float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    if (odd) {
      const int32_t* li = tail[t / 2] + 8 * (t % 2);
      int32_t s = 0;
      for (int i = 0; i < 8; ++i) s += li[i];
      sum = std::fmaf(act[nb - 1].dpair[t / 2][8 * (t % 2)] * dw, static_cast<float>(s), sum);
    }
    y[t * y_stride] = sum;
  }
}

using NlPairTileFn = void (*)(int64_t, int64_t, bool, bool, int64_t, const void*, size_t, const NlPairs*, int,
                              NlPairState*, float*, int64_t);
template <int... I>
constexpr std::array<NlPairTileFn, sizeof...(I)> nl_pair_tiles(std::integer_sequence<int, I...>) {
  return {&gemm_nl_pair_tile<I + 1>...};
}
inline constexpr auto kNlPairTiles = nl_pair_tiles(std::make_integer_sequence<int, kNlPairs>{});

// GemmTileFn entry: fewer than kNlPairMinTokens token rows run the 256-bit
// tiles; else 16-token groups, each repacked once (per-thread grow-only
// buffers), then chunk by chunk of block pairs, every row.
RILL_KERNEL_TARGET void gemm_nl_pair_entry(int64_t n, const void* w, size_t w_stride, int n_r, const void* a,
                                           size_t a_stride, int n_t, float* y, int64_t y_stride) {
  if (n_t < kNlPairMinTokens) {
    gemm_tiles<kIq4nlTiles<IqOpsVnni>, IqMaxT<IqOpsVnni::kMaxTNl>>(n, w, w_stride, n_r, a, a_stride, n_t, y, y_stride);
    return;
  }
  thread_local std::vector<NlPairs> act;
  thread_local std::vector<NlPairState> state;
  const int64_t nb = n / kQK, n_pairs = nb / 2;
  if (static_cast<int64_t>(act.size()) < nb) act.resize(static_cast<size_t>(nb));
  if (static_cast<int>(state.size()) < n_r) state.resize(static_cast<size_t>(n_r));
  NlPairs* const ad = act.data();  // (not the thread_locals in the loops: their access is a call)
  NlPairState* const sd = state.data();
  const auto* wb = static_cast<const uint8_t*>(w);
  constexpr int kGroup = 2 * kNlPairs;
  constexpr int64_t kChunk = kNlChunkBlocks / 2;  // block pairs
  for (int t0 = 0; t0 < n_t; t0 += kGroup) {
    const int nt = n_t - t0 < kGroup ? n_t - t0 : kGroup;
    prepare_nl_pairs(ad, nb, static_cast<const uint8_t*>(a) + static_cast<size_t>(t0) * a_stride, a_stride, nt);
    const NlPairTileFn tile = kNlPairTiles[(nt + 1) / 2 - 1];
    int64_t jb0 = 0;
    do {  // at least once: a row of one block is all tail
      const int64_t jb1 = n_pairs - jb0 < kChunk ? n_pairs : jb0 + kChunk;
      for (int r = 0; r < n_r; ++r)
        tile(jb0, jb1, jb0 == 0, jb1 == n_pairs, nb, wb + static_cast<size_t>(r) * w_stride, w_stride, ad, nt, sd + r,
             y + t0 * y_stride + r, y_stride);
      jb0 = jb1;
    } while (jb0 < n_pairs);
  }
}

}  // namespace

void fill_iquant_avx512(Kernels& k) {
  if (!cpu_features().avx512_vnni) return;
  fill_iquant_gemm<IqOpsVnni>(k);
  k.gemm[static_cast<size_t>(DType::kQ2_K)] = &gemm_tiles<kIqTiles512<ZDecQ2K>, IqMaxT<4>>;
  k.gemm[static_cast<size_t>(DType::kQ3_K)] = &gemm_tiles<kIqTiles512<ZDecQ3K>, IqMaxT<4>>;
  k.gemm[static_cast<size_t>(DType::kIQ4_XS)] = &gemm_k_rows_entry<KRowsXS>;
  k.gemm_max_tokens[static_cast<size_t>(DType::kIQ4_XS)] = 1 << 20;  // the row tile repacks once per call
  k.gemm[static_cast<size_t>(DType::kIQ4_NL)] = &gemm_nl_pair_entry;
}

}  // namespace rill::cpu
