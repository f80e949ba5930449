#include "backend/cpu/ordered_logits.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace rill::cpu {

void pick_ordered_tokens(const float* scores, int32_t n_centroids, int32_t top_k, const int32_t* token_ordering,
                         int64_t per, int32_t* picked) {
  assert(top_k >= 1 && top_k <= n_centroids);
  // (score, -index) descending: c comes after p iff s[c] < s[p] or (s[c] == s[p] and c > p).
  int32_t prev = -1;
  for (int32_t k = 0; k < top_k; ++k) {
    int32_t best = -1;
    for (int32_t c = 0; c < n_centroids; ++c) {
      const float s = scores[c];
      if (prev >= 0 && !(s < scores[prev] || (s == scores[prev] && c > prev))) continue;
      if (best < 0 || s > scores[best]) best = c;  // equal: the lower index stays
    }
    assert(best >= 0);  // NaN-free scores have top_k <= n_centroids picks
    std::copy_n(token_ordering + static_cast<int64_t>(best) * per, per, picked + k * per);
    prev = best;
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
