#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "engine/token_logprobs.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace rill {

// Two passes, both vectorized: the largest value (NaNs skipped), then the
// first index holding it. Equal to the scalar scan `if (x[i] > x[best])
// best = i` from best = 0 for every input: that scan ends on the first
// element of the maximum's equality class (signed zeros compare equal), and
// never moves to a NaN, so a NaN at 0 is the answer and elsewhere is
// skipped. The scalar scan's compare chain on one loaded value cost ~50 us
// per 49k-entry row; this runs in a few (it is on the engine thread, once per
// sampled row per step).
int32_t argmax(const float* x, int64_t n) {
  if (n <= 1 || std::isnan(x[0])) return 0;
  int64_t i = 0;
  float m = x[0];
#if defined(__SSE2__)
  if (n >= 16) {
    // maxps(v, acc) returns acc where v is NaN: NaNs never enter acc.
    __m128 acc[4] = {_mm_set1_ps(m), _mm_set1_ps(m), _mm_set1_ps(m), _mm_set1_ps(m)};
    for (; i + 16 <= n; i += 16) {
      for (int k = 0; k < 4; ++k) acc[k] = _mm_max_ps(_mm_loadu_ps(x + i + 4 * k), acc[k]);
    }
    const __m128 a = _mm_max_ps(_mm_max_ps(acc[0], acc[1]), _mm_max_ps(acc[2], acc[3]));
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, a);
    for (float v : lanes) m = v > m ? v : m;
  }
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  int64_t j = 0;
#if defined(__SSE2__)
  const __m128 mv = _mm_set1_ps(m);
  for (; j + 16 <= n; j += 16) {
    int mask = 0;
    for (int k = 0; k < 4; ++k) mask |= _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + j + 4 * k), mv)) << (4 * k);
    if (mask) return static_cast<int32_t>(j + __builtin_ctz(static_cast<unsigned>(mask)));
  }
#endif
  for (; j < n; ++j) {
    if (x[j] == m) return static_cast<int32_t>(j);
  }
  return 0;  // unreachable: m is one of the values
}

Sampler::Sampler(const SamplingParams& params, int64_t n_vocab)
    : params_(params),
      n_vocab_(n_vocab),
      seed_(params.seed ? *params.seed : (uint64_t{std::random_device{}()} << 32 | std::random_device{}())),
      output_counts_(static_cast<size_t>(n_vocab), 0),
      seen_(static_cast<size_t>(n_vocab), 0) {
  candidates_.reserve(static_cast<size_t>(n_vocab));
  if (!sampling_is_argmax(params.temperature, params.top_k)) probs_.resize(static_cast<size_t>(n_vocab));
}

void Sampler::add_prompt_tokens(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id < 0 || id >= n_vocab_) continue;
    if (!seen_[id]) touched_.push_back(id);
    seen_[id] = 1;
  }
}

void Sampler::add_output_token(int32_t id) {
  if (id < 0 || id >= n_vocab_) return;
  if (!seen_[id]) touched_.push_back(id);
  seen_[id] = 1;
  ++output_counts_[id];
}

namespace {

bool draw_is_argmax(const SamplingParams& p) {
  return sampling_is_argmax(p.temperature, p.top_k);
}

}  // namespace

bool Sampler::edits_logits() const {
  const SamplingParams& p = params_;
  const bool penalties = (p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f) || p.presence_penalty != 0.0f ||
                         p.frequency_penalty != 0.0f;
  return !p.logit_bias.empty() || penalties;
}

bool Sampler::is_plain_greedy() const {
  return draw_is_argmax(params_) && !edits_logits();
}

DeviceSamplingParams Sampler::take_device_draw() {
  DeviceSamplingParams d;
  d.temperature = params_.temperature;
  d.top_k = params_.top_k;
  d.top_p = params_.top_p;
  d.min_p = params_.min_p;
  d.seed = seed_;
  d.counter = n_draws_;
  if (!draw_is_argmax(params_)) ++n_draws_;
  return d;
}

void Sampler::apply_penalties(float* logits) const {
  const float rep = params_.repetition_penalty;
  const bool use_rep = rep != 1.0f && rep > 0.0f;
  const bool use_pf = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!use_rep && !use_pf) return;
  for (int32_t id : touched_) {
    float& l = logits[id];
    if (use_rep) l = l > 0 ? l / rep : l * rep;
    const int32_t c = output_counts_[id];
    if (use_pf && c > 0) l -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(c);
  }
}

void Sampler::apply_logit_bias(float* logits) const {
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < n_vocab_) logits[id] += bias;
  }
}

namespace {

bool mask_allows(std::span<const uint64_t> allowed, int32_t id) {
  const auto w = static_cast<size_t>(id) >> 6;
  return w < allowed.size() && ((allowed[w] >> (id & 63)) & 1);
}

}  // namespace

int32_t Sampler::sample(float* logits, int n_top_logprobs, SampledToken* out, std::span<const uint64_t> allowed) {
  apply_logit_bias(logits);
  apply_penalties(logits);
  double lse = 0.0;
  if (n_top_logprobs >= 0) {
    const int n_top = static_cast<int>(std::min<int64_t>({n_top_logprobs, kMaxTopLogprobs, n_vocab_}));
    lse = token_logprobs(logits, n_vocab_, -1, n_top, *out);
  }
  if (!allowed.empty()) apply_mask(logits, allowed);
  int32_t id = draw(logits);
  if (!allowed.empty() && !mask_allows(allowed, id)) id = argmax(logits, n_vocab_);
  if (n_top_logprobs >= 0) {
    // An allowed token's logit is not touched by the mask.
    out->id = id;
    out->logprob = static_cast<float>(static_cast<double>(logits[id]) - lse);
  }
  return id;
}

void Sampler::apply_mask(float* logits, std::span<const uint64_t> allowed) const {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t base = 0; base < n_vocab_; base += 64) {
    const auto w = static_cast<size_t>(base >> 6);
    const uint64_t bits = w < allowed.size() ? allowed[w] : 0;
    const int64_t n = std::min<int64_t>(64, n_vocab_ - base);
    if (bits == ~uint64_t{0}) continue;
    if (bits == 0) {
      std::fill(logits + base, logits + base + n, kNegInf);
      continue;
    }
    for (int64_t b = 0; b < n; ++b) {
      if (!((bits >> b) & 1)) logits[base + b] = kNegInf;
    }
  }
}

int32_t Sampler::reference_draw(const DeviceSamplingParams& row, const float* logits, int64_t n_vocab,
                                const uint32_t* allowed) {
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_k = row.top_k;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.seed = row.seed;
  Sampler s(p, n_vocab);
  s.n_draws_ = row.counter;
  std::vector<float> copy(logits, logits + n_vocab);
  if (!allowed) return s.sample(copy.data());
  std::vector<uint64_t> mask(static_cast<size_t>((n_vocab + 63) / 64));
  for (int64_t w = 0; w < token_mask_words(n_vocab); ++w) {
    mask[static_cast<size_t>(w / 2)] |= static_cast<uint64_t>(allowed[w]) << (w % 2 ? 32 : 0);
  }
  return s.sample(copy.data(), -1, nullptr, mask);
}

uint64_t Sampler::kept_bound(const float* logits) {
  // Tempered probabilities (unnormalised, the maximum exactly 1), kept in id
  // order in probs_ and as (p, id) candidates for the filters.
  const float inv_t = 1.0f / params_.temperature;
  float max_l = logits[0];
  for (int64_t i = 1; i < n_vocab_; ++i) max_l = std::max(max_l, logits[i]);
  probs_.resize(static_cast<size_t>(n_vocab_));
  candidates_.clear();
  double total = 0.0;
  uint64_t top = 0;  // the first-ranked candidate's key
  for (int64_t i = 0; i < n_vocab_; ++i) {
    const float p = sampling_prob(logits[i], max_l, inv_t);
    probs_[static_cast<size_t>(i)] = p;
    candidates_.emplace_back(p, static_cast<int32_t>(i));
    total += p;
    top = std::max(top, sampling_key(p, static_cast<int32_t>(i)));
  }
  auto by_prob = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  auto key_of = [](const std::pair<float, int32_t>& c) { return sampling_key(c.first, c.second); };
  // n: the kept prefix of candidates_ (sorted by by_prob when a filter cut
  // it); bound: the key of its last entry (0: nothing cut).
  size_t n = candidates_.size();
  uint64_t bound = 0;
  bool sorted = false;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), by_prob);
    sorted = true;
    total = 0.0;
    for (size_t i = 0; i < n; ++i) total += candidates_[i].first;
    bound = key_of(candidates_[n - 1]);
  }
  if (params_.top_p < 1.0f) {
    // The smallest top set whose mass reaches top_p. Sort a growing prefix
    // instead of the whole vocabulary: the set is small in practice.
    const double target = params_.top_p * total;
    size_t sorted_n = sorted ? n : 0;
    size_t keep = n;
    for (size_t k = std::min<size_t>(64, n);; k = std::min(n, k * 4)) {
      if (k > sorted_n) {
        std::partial_sort(candidates_.begin() + sorted_n, candidates_.begin() + k, candidates_.begin() + n, by_prob);
        sorted_n = k;
      }
      double cum = 0.0;
      size_t i = 0;
      for (; i < k; ++i) {
        cum += candidates_[i].first;
        if (cum >= target) break;
      }
      if (i < k) {
        keep = i + 1;
        break;
      }
      if (k == n) break;
    }
    if (keep < n) bound = key_of(candidates_[keep - 1]);
  }
  // min-p relative to the top probability, which is exactly 1. When it cuts
  // everything (min_p > 1) only the top candidate is left.
  if (params_.min_p > 0.0f) bound = std::max(bound, sampling_min_p_bound(params_.min_p));
  return std::min(bound, top);
}

int32_t Sampler::draw(const float* logits) {
  if (draw_is_argmax(params_)) return argmax(logits, n_vocab_);
  const uint64_t bound = kept_bound(logits);
  const double u = sampling_uniform(seed_, n_draws_++);
  // Inverse CDF over the kept set in id order: the first id whose running
  // mass exceeds u * (kept mass); the last kept id if rounding leaves none.
  double kept_total = 0.0;
  for (int64_t i = 0; i < n_vocab_; ++i) {
    const float p = probs_[static_cast<size_t>(i)];
    if (sampling_key(p, static_cast<int32_t>(i)) >= bound) kept_total += p;
  }
  const double r = u * kept_total;
  double cum = 0.0;
  int32_t last = -1;
  for (int64_t i = 0; i < n_vocab_; ++i) {
    const float p = probs_[static_cast<size_t>(i)];
    if (sampling_key(p, static_cast<int32_t>(i)) < bound) continue;
    cum += p;
    last = static_cast<int32_t>(i);
    if (cum > r) return last;
  }
  return last;
}

}  // namespace rill
