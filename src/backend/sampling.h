#pragma once
// The sampling rule shared by the host Sampler (engine/sampler.h) and the
// CUDA sampler (backend/cuda/sampling.h), so that a seeded request draws the
// same token wherever its row is sampled:
//  - the per-row parameters of a draw (DeviceSamplingParams);
//  - the random stream: Philox4x32-10 keyed by the request's seed, counter
//    = the request's draw index, so a draw depends on (seed, index) only and
//    not on which rows share the step;
//  - the tempered probabilities p_i = exp((l_i - max) / T), computed with a
//    fixed sequence of IEEE-rounded float operations (no library exp, no
//    fused multiply-add) so host and device get bit-identical p_i;
//  - the candidate order: by p descending, then id ascending, encoded as one
//    64-bit key. Every filter (top-k, top-p, min-p) keeps a prefix of that
//    order, so a kept set is "key >= bound" for one bound.
// Host code that calls these must be compiled without floating-point
// contraction (x86-64 baseline has no FMA, so rill's ordinary files are).
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define RILL_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define RILL_HD inline
#endif

namespace rill {

// One row's draw. temperature, top_k, top_p and min_p mean what they mean in
// SamplingParams; seed and counter select the row's random number.
struct DeviceSamplingParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t counter = 0;
};

// A step's token masks (constrained decoding) for the draws where the model
// runs: sample row i draws only among the tokens its mask allows, as if
// every other logit were -inf (the host Sampler's token mask). Only masked
// rows have a mask: row_mask[i] is the row's index into `words`, or -1.
// Mask m is words[m * n_words, (m + 1) * n_words): token t is allowed iff
// bit t % 32 of word t / 32 is set (n_words = ceil(n_vocab / 32)).
// n_masked == 0: no row is masked (row_mask and words may be null), and the
// model does nothing for masks (no upload, no kernel).
struct TokenMasks {
  const int32_t* row_mask = nullptr;  // [n_sample]
  const uint32_t* words = nullptr;    // [n_masked, n_words]
  int32_t n_masked = 0;
  int64_t n_words = 0;
  bool empty() const { return n_masked == 0; }
};

RILL_HD int64_t token_mask_words(int64_t n_vocab) {
  return (n_vocab + 31) / 32;
}
RILL_HD bool token_mask_allows(const uint32_t* mask, int64_t id) {
  return (mask[id >> 5] >> (id & 31)) & 1u;
}

// The draw is an argmax over the logits (lowest id on ties) and consumes no
// random number: tiny, negative or non-finite temperatures (1/T would
// overflow) or top_k == 1.
RILL_HD bool sampling_is_argmax(float temperature, int32_t top_k) {
  return !(temperature >= 1e-6f) || !(temperature <= 3.40282347e38f) || top_k == 1;  // not finite: > FLT_MAX
}

namespace sampling_detail {

// IEEE round-to-nearest float operations that no compiler fuses.
#ifdef __CUDA_ARCH__
RILL_HD float mul(float a, float b) {
  return __fmul_rn(a, b);
}
RILL_HD float add(float a, float b) {
  return __fadd_rn(a, b);
}
RILL_HD float sub(float a, float b) {
  return __fsub_rn(a, b);
}
RILL_HD float rint(float a) {
  return rintf(a);
}
RILL_HD uint32_t bits(float a) {
  return __float_as_uint(a);
}
RILL_HD float from_bits(uint32_t b) {
  return __uint_as_float(b);
}
#else
inline float mul(float a, float b) {
  return a * b;
}
inline float add(float a, float b) {
  return a + b;
}
inline float sub(float a, float b) {
  return a - b;
}
inline float rint(float a) {
  return std::rint(a);
}
inline uint32_t bits(float a) {
  uint32_t b;
  std::memcpy(&b, &a, 4);
  return b;
}
inline float from_bits(uint32_t b) {
  float a;
  std::memcpy(&a, &b, 4);
  return a;
}
#endif

}  // namespace sampling_detail

// exp(x) for x <= 0 within 2 ulp, identical on host and device: Cody-Waite
// reduction by ln 2, a degree-7 Taylor polynomial on |r| <= 0.35, and an
// exact power-of-two scale. exp(0) is exactly 1; x <= -86 (below 2^-124,
// nothing a draw can pick) and NaN give 0.
RILL_HD float sampling_exp(float x) {
  namespace d = sampling_detail;
  if (!(x > -86.0f)) return 0.0f;
  const float n = d::rint(d::mul(x, 1.44269504f));
  float r = d::sub(x, d::mul(n, 0.693359375f));  // exact: 0.693359375 has 10 significant bits
  r = d::sub(r, d::mul(n, -2.12194440e-4f));
  float q = 1.98412698e-4f;  // 1/7!
  q = d::add(d::mul(q, r), 1.38888889e-3f);
  q = d::add(d::mul(q, r), 8.33333333e-3f);
  q = d::add(d::mul(q, r), 4.16666667e-2f);
  q = d::add(d::mul(q, r), 1.66666667e-1f);
  q = d::add(d::mul(q, r), 0.5f);
  q = d::add(d::mul(q, r), 1.0f);
  q = d::add(d::mul(q, r), 1.0f);
  const auto e = static_cast<int32_t>(n) + 127;  // in [3, 127] for x in (-86, 0]
  return d::mul(q, d::from_bits(static_cast<uint32_t>(e) << 23));
}

// The unnormalised tempered probability of a logit: exp((l - max) * inv_t),
// inv_t = 1 / temperature rounded to float. The row maximum gets exactly 1.
RILL_HD float sampling_prob(float logit, float max_logit, float inv_t) {
  namespace d = sampling_detail;
  return sampling_exp(d::mul(d::sub(logit, max_logit), inv_t));
}

// Candidate order as one integer: a larger key ranks first (higher p, then
// lower id). p >= 0, so its float bits order like its value.
RILL_HD uint64_t sampling_key(float p, int32_t id) {
  return (static_cast<uint64_t>(sampling_detail::bits(p)) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}

// The min-p filter as a bound: key >= min_p_bound(m) iff p >= m (m > 0).
RILL_HD uint64_t sampling_min_p_bound(float min_p) {
  return static_cast<uint64_t>(sampling_detail::bits(min_p)) << 32;
}

// Philox4x32-10 (Salmon et al., SC'11): ctr[4] is replaced by its output.
RILL_HD void philox4x32_10(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * ctr[2];
    const uint32_t c1 = ctr[1], c3 = ctr[3];
    ctr[0] = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ key0;
    ctr[1] = static_cast<uint32_t>(p1);
    ctr[2] = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ key1;
    ctr[3] = static_cast<uint32_t>(p0);
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
}

// The draw's uniform number in [0, 1) (53 random bits) for (seed, counter).
RILL_HD double sampling_uniform(uint64_t seed, uint64_t counter) {
  uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u};
  philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t u53 = (static_cast<uint64_t>(c[0]) << 21) | (c[1] >> 11);
  return static_cast<double>(u53) * 0x1p-53;
}

}  // namespace rill
