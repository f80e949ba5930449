#pragma once
// Sampling on the device: one token id per logit row under per-row
// parameters, so that only ids cross to the host. The rule is
// backend/sampling.h's, the one the host Sampler (engine/sampler.h) follows:
// same tempered probabilities bit for bit, same kept sets for top-k, top-p
// and min-p, same Philox(seed, counter) number, inverse CDF in id order.
// Sums differ only in rounding order (double on both sides; top-p masses in
// exact 128-bit fixed point here), so host and device agree on the token
// except when the number lands within ~1e-15 of a boundary.
//
// Cost per row (one 1024-thread block each, no sort of the vocabulary):
// a max pass, a probability pass (written in place), 3 radix passes plus a
// tie pass for each of top-k and top-p when on, and one draw pass. Every sum
// has a fixed order (integer atomics only), so a row's id depends on its
// logits and parameters alone: not on its position or the batch.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling.h"

namespace rill::cuda {

// ids[r] = the token drawn from row r of logits ([n_rows, n_vocab] f32)
// under params[r] (params null: every row an argmax) and row r's token mask
// in `masks` if it has one (the host Sampler's draw under that mask: the
// masked logits are -inf, and a draw that lands outside the mask takes the
// masked argmax). Rows whose draw is not an argmax (sampling_is_argmax)
// are overwritten with their tempered probabilities (0 where masked).
// kept_bounds (optional, [n_rows]) receives each row's kept-set bound, as
// Sampler::kept_bound defines it (all ones for argmax rows). Every pointer,
// masks' too, is a device pointer; n_vocab < 2^31. Unmasked rows read no
// mask; a masked draw costs one more block reduction (its argmax).
void sample_rows(float* logits, int64_t n_rows, int64_t n_vocab, const DeviceSamplingParams* params,
                 const TokenMasks& masks, int32_t* ids, uint64_t* kept_bounds, cudaStream_t stream);

}  // namespace rill::cuda
