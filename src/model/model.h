#pragma once
// Model: one forward step over a flat Batch. Implementations live in
// model/arch/ (one file per family) and are chosen by the registry.
#include <cstdint>
#include <memory>

#include "core/result.h"
#include "loader/model_config.h"
#include "model/batch.h"

namespace rill {

struct ModelOptions {
  int n_threads = 0;           // 0: one per core
  int n_kv_slots = 1;          // sequences that can hold KV at once
  int64_t n_ctx = 0;           // tokens per slot; 0: the model's max_position
  int max_batch_tokens = 512;  // largest Batch::n_tokens() forward() accepts
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int64_t n_vocab() const = 0;
  virtual int64_t n_ctx() const = 0;
  virtual int max_batch_tokens() const = 0;

  // Computes the batch and writes one row of n_vocab logits per sample row:
  // logits [batch.sample_rows.size(), n_vocab]. Requires every sequence's
  // positions to continue its slot's cache (KV for [0, pos0) present) and
  // n_tokens() <= max_batch_tokens(). Per step this allocates nothing.
  virtual Status forward(const Batch& batch, float* logits) = 0;

  // Bytes of KV one token takes across all layers (for sizing and stats).
  virtual size_t kv_bytes_per_token() const = 0;
};

}  // namespace rill
