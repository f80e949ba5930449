#include "engine/token_logprobs.h"

#include <algorithm>
#include <cmath>

namespace rill {

double token_logprobs(const float* logits, int64_t n_vocab, int32_t id, int n_top, SampledToken& out) {
  float max_l = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) max_l = std::max(max_l, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_l);
  const double lse = max_l + std::log(sum);
  auto logprob = [&](int64_t i) { return static_cast<float>(static_cast<double>(logits[i]) - lse); };
  if (id >= 0) {
    out.id = id;
    out.logprob = logprob(id);
  }
  out.n_top = n_top;
  if (n_top == 0) return lse;
  // Partial selection with a heap of n_top entries whose front is the worst
  // kept one, kept in `out.top` itself.
  auto better = [](const TokenLogprob& a, const TokenLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
  };
  auto* top = out.top.data();
  for (int i = 0; i < n_top; ++i) top[i] = {i, logprob(i)};
  std::make_heap(top, top + n_top, better);
  for (int64_t i = n_top; i < n_vocab; ++i) {
    const TokenLogprob c{static_cast<int32_t>(i), logprob(i)};
    if (!better(c, top[0])) continue;
    std::pop_heap(top, top + n_top, better);
    top[n_top - 1] = c;
    std::push_heap(top, top + n_top, better);
  }
  std::sort_heap(top, top + n_top, better);
  return lse;
}

}  // namespace rill
