#pragma once
// AVX2-level helpers shared by the *_avx2.cpp / *_avx512.cpp kernel files.
// Include only from files compiled with at least -mavx2 -mfma -mf16c.
// Everything is static so each ISA file keeps its own copy (no ODR merging
// of code compiled for different instruction sets).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace rill::cpu::simd {

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

static inline float f16(uint16_t h) {
  return _cvtsh_ss(h);
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15) then
// high nibbles (elements 16..31), values 0..15.
static inline __m256i nibbles_32(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// The 32 bits at p (little-endian) -> 32 bytes, 0xFF where the bit is set.
static inline __m256i bits_to_bytes_32(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0x0000000000000000LL));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// Sum of u8 x s8 products, 4 adjacent pairs per i32 lane, as 8 floats.
// maddubs saturates at +-32767 per pair of products; the callers' operands
// (|u| <= 128 with |s| <= 127, or u <= 31) keep every pair below that.
static inline __m256i dot_us8_i32(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// 4 x 8 floats -> 32 int8 in element order (values already within -127..127).
static inline __m256i pack_i32x32_to_i8(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_packs_epi32(a, b);  // lanes interleaved per 128-bit half
  const __m256i cd = _mm256_packs_epi32(c, d);
  const __m256i abcd = _mm256_packs_epi16(ab, cd);
  return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// exp(x) for f32 lanes computed exactly as ggml's AVX2 ggml_v_expf (the ARM
// optimized-routines algorithm: 2^n * (1 + p(b)) with n = round(x / ln 2)),
// so SiLU matches llama.cpp bit for bit on AVX2 builds. ~1.5 ulp; flushes to
// 0 below about -104 and to inf above about 88.4.
static inline __m256 exp_ggml(__m256 x) {
  const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shifter);
  const __m256 n = _mm256_sub_ps(z, shifter);
  const __m256 b =
      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (!_mm256_movemask_ps(big)) return _mm256_fmadd_ps(j, k, k);
  // |n| > 126: scale in two steps to avoid overflow/underflow of 2^n.
  const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                     _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 scaled = _mm256_blendv_ps(_mm256_fmadd_ps(k, j, k), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1), big);
  return _mm256_blendv_ps(scaled, _mm256_mul_ps(s1, s1), huge);
}

}  // namespace rill::cpu::simd
