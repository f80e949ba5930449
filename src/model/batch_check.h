#pragma once
// Validation of a Batch against a model's limits, shared by the model
// implementations (the CUDA Llama uses it; it is the CPU Llama's rules).
#include <cstdint>

#include "backend/sampling.h"
#include "core/result.h"
#include "model/batch.h"
#include "model/kv_spec.h"

namespace rill {

struct BatchLimits {
  int64_t max_tokens = 0;
  int64_t max_sample_rows = 0;
  int64_t n_ctx = 0;
  int64_t n_vocab = 0;
  int32_t block_size = 16;
  int32_t n_blocks = 0;
  int64_t window = 0;  // > 0: blocks wholly before every query's window may be -1
};

// Errors say which token, sequence or table entry is wrong.
Status check_batch(const Batch& batch, const BatchLimits& limits);

// check_batch for a model with the KV groups of `spec` (limits.window is
// ignored): group 0's table as above with spec[0]'s window, and each
// attention group g >= 1's table in batch.group_tables[g - 1], with the same
// start and length as group 0's, naming a KV block wherever a query of the
// step can attend (holes only wholly before a sliding group's window).
Status check_batch(const Batch& batch, const BatchLimits& limits, const KvSpec& spec);

// A step's token masks (backend/sampling.h) for n_sample rows of n_vocab
// logits: n_words = ceil(n_vocab / 32), each row's index -1 or a mask, and
// n_masked <= n_sample.
Status check_token_masks(const TokenMasks& masks, int64_t n_sample, int64_t n_vocab);

}  // namespace rill
