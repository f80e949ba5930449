#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

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
      rng_(params.seed ? *params.seed : std::random_device{}()),
      output_counts_(static_cast<size_t>(n_vocab), 0),
      seen_(static_cast<size_t>(n_vocab), 0) {
  candidates_.reserve(static_cast<size_t>(n_vocab));
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

// The draw is an argmax: tiny, negative or non-finite temperatures (1/T
// would overflow) or top_k == 1.
bool draw_is_argmax(const SamplingParams& p) {
  return !(p.temperature >= 1e-6f) || !std::isfinite(p.temperature) || p.top_k == 1;
}

}  // namespace

bool Sampler::is_plain_greedy() const {
  const SamplingParams& p = params_;
  const bool penalties = (p.repetition_penalty != 1.0f && p.repetition_penalty > 0.0f) ||
                         p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return draw_is_argmax(p) && p.logit_bias.empty() && !penalties;
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

int32_t Sampler::sample(float* logits, int n_top_logprobs, SampledToken* out) {
  apply_logit_bias(logits);
  apply_penalties(logits);
  const int32_t id = draw(logits);
  if (n_top_logprobs >= 0) {
    const int n_top = static_cast<int>(std::min<int64_t>({n_top_logprobs, kMaxTopLogprobs, n_vocab_}));
    fill_logprobs(logits, id, n_top, *out);
  }
  return id;
}

void Sampler::fill_logprobs(const float* logits, int32_t id, int n_top, SampledToken& out) const {
  // log-sum-exp with a double accumulator: float sums over 150k exp terms
  // lose the small tail the top entries are compared against.
  float max_l = logits[0];
  for (int64_t i = 1; i < n_vocab_; ++i) max_l = std::max(max_l, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n_vocab_; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_l);
  const double lse = max_l + std::log(sum);
  auto logprob = [&](int64_t i) { return static_cast<float>(static_cast<double>(logits[i]) - lse); };
  out.id = id;
  out.logprob = logprob(id);
  out.n_top = n_top;
  if (n_top == 0) return;
  // Partial selection with a heap of n_top entries whose front is the worst
  // kept one: O(n_vocab log n_top), no buffer beyond `out.top`.
  auto better = [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  };
  auto* top = out.top.data();
  for (int i = 0; i < n_top; ++i) top[i] = {i, logprob(i)};
  std::make_heap(top, top + n_top, better);
  for (int64_t i = n_top; i < n_vocab_; ++i) {
    const TokenLogprob c{static_cast<int32_t>(i), logprob(i)};
    if (!better(c, top[0])) continue;
    std::pop_heap(top, top + n_top, better);
    top[n_top - 1] = c;
    std::push_heap(top, top + n_top, better);
  }
  std::sort_heap(top, top + n_top, better);
}

int32_t Sampler::draw(const float* logits) {
  if (draw_is_argmax(params_)) return argmax(logits, n_vocab_);

  // Probabilities (unnormalised) of the tempered logits: exp((l - max) / T).
  const float inv_t = 1.0f / params_.temperature;
  float max_l = logits[0];
  for (int64_t i = 1; i < n_vocab_; ++i) max_l = std::max(max_l, logits[i]);
  candidates_.clear();
  double total = 0.0;
  for (int64_t i = 0; i < n_vocab_; ++i) {
    const float p = std::exp((logits[i] - max_l) * inv_t);
    candidates_.emplace_back(p, static_cast<int32_t>(i));
    total += p;
  }
  auto by_prob = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // n: the kept prefix of candidates_; sorted: whether that prefix is sorted.
  size_t n = candidates_.size();
  bool sorted = false;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + n, candidates_.end(), by_prob);
    sorted = true;
    total = 0.0;
    for (size_t i = 0; i < n; ++i) total += candidates_[i].first;
  }
  if (params_.top_p < 1.0f) {
    // The smallest top set whose mass reaches top_p. Sort a growing prefix
    // instead of the whole vocabulary: the set is small in practice.
    const double target = params_.top_p * total;
    size_t sorted_n = sorted ? n : 0;
    size_t keep = n;
    for (size_t k = std::min<size_t>(64, n);; k = std::min(n, k * 4)) {
      if (k > sorted_n) {
        std::partial_sort(candidates_.begin() + sorted_n, candidates_.begin() + k,
                          candidates_.begin() + n, by_prob);
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
    n = std::max<size_t>(1, keep);
    sorted = true;
  }
  if (params_.min_p > 0.0f) {
    // Relative to the top probability, which is exp(0) = 1 before any cut.
    const float threshold = params_.min_p * (sorted ? candidates_[0].first : 1.0f);
    size_t kept = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; ++i) {
      if (by_prob(candidates_[i], candidates_[best])) best = i;
    }
    const auto top = candidates_[best];
    for (size_t i = 0; i < n; ++i) {
      if (candidates_[i].first >= threshold) candidates_[kept++] = candidates_[i];
    }
    if (kept == 0) candidates_[kept++] = top;  // min_p > 1: only the most likely token is left
    n = kept;
  }
  double kept_total = 0.0;
  for (size_t i = 0; i < n; ++i) kept_total += candidates_[i].first;
  std::uniform_real_distribution<double> uni(0.0, kept_total);
  double r = uni(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= candidates_[i].first;
    if (r < 0) return candidates_[i].second;
  }
  return candidates_[n - 1].second;
}

}  // namespace rill
