#include "backend/cpu/ordered_logits.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace rill::cpu {

void pick_ordered_tokens(const float* scores, int32_t n_centroids, int32_t top_k, const int32_t* token_ordering,
                         int64_t per, int32_t* picked) {
  assert(top_k >= 1 && top_k <= n_centroids && per >= 1);
  // picked[0, n) holds the best groups so far, best first: one pass over
  // the scores, a group entering only when it beats the last kept one
  // (equal scores: the lower group stays ahead, groups arrive in order).
  // A NaN score ranks as -infinity (below every number, tied with -inf),
  // as the CUDA pick does: a NaN row still picks top_k valid groups.
  const auto score = [scores](int32_t c) { return std::isnan(scores[c]) ? -INFINITY : scores[c]; };
  int32_t* top = picked;
  int32_t n = 0;
  for (int32_t c = 0; c < n_centroids; ++c) {
    const float s = score(c);
    if (n == top_k && !(s > score(top[n - 1]))) continue;
    int32_t i = n < top_k ? n++ : n - 1;
    for (; i > 0 && score(top[i - 1]) < s; --i) top[i] = top[i - 1];
    top[i] = c;
  }
  assert(n == top_k);  // top_k <= n_centroids
  // Each group's tokens, from the last group back: group k's span [k per,
  // (k + 1) per) starts at or after k, so it never covers a group id j < k
  // still to be read.
  for (int32_t k = top_k - 1; k >= 0; --k) {
    const int64_t c = top[k];
    std::copy_n(token_ordering + c * per, per, picked + k * per);
  }
}

float dot_lanes8(const float* a, const float* b, int64_t n) {
  constexpr int64_t kLanes = 8;
  float acc[kLanes] = {};
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[e + l] * b[e + l];
  }
  float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; e < n; ++e) dot += a[e] * b[e];
  return dot;
}

void fill_masked_logits(const float* dots, const int32_t* picked, int64_t n_picked, float* logits, int64_t n_vocab) {
  float lowest = INFINITY;
  for (int64_t i = 0; i < n_picked; ++i) lowest = std::min(lowest, dots[i]);
  std::fill(logits, logits + n_vocab, lowest - 1.0f);
  for (int64_t i = 0; i < n_picked; ++i) logits[picked[i]] = dots[i];
}

}  // namespace rill::cpu
