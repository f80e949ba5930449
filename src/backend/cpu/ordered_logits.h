#pragma once
// The arithmetic of Backend::ordered_logits() (Gemma 4's assistant's head
// over ordered embeddings, backend/backend.h OrderedLogitsOp) that the CPU
// Backend runs per row: the picked tokens, the dot products, the fill.
#include <cstdint>

namespace rill::cpu {

// The tokens of the top_k of n_centroids groups by scores (descending;
// equal scores: the lower group first), group by group in that order:
// picked [top_k * per], group c being token_ordering[c per, (c + 1) per).
// One pass over the scores keeping the best top_k so far in picked's first
// entries (no other scratch), then each group's tokens in place.
void pick_ordered_tokens(const float* scores, int32_t n_centroids, int32_t top_k, const int32_t* token_ordering,
                         int64_t per, int32_t* picked);

// a . b over n in f32 with eight partial sums (lane l sums elements l, l +
// 8, ...; the tail after the last whole eight into the total): a single
// running sum is bound by the add's latency (4,096 picked tokens x 256 is
// 1 M dependent adds per row, about 1.3 ms); eight vectorize.
float dot_lanes8(const float* a, const float* b, int64_t n);

// logits [n_vocab]: dots[i] at picked[i], every other token the smallest
// of the dots minus 1 (per row: transformers takes the smallest over the
// whole batch; per row keeps a row independent of its batch).
void fill_masked_logits(const float* dots, const int32_t* picked, int64_t n_picked, float* logits, int64_t n_vocab);

}  // namespace rill::cpu
