#include "model/cpu_paged_model.h"

#include <algorithm>
#include <climits>

#include "backend/cpu/cpu_features.h"

namespace rill {

void CpuPagedModel::set_limits(const ModelOptions& options) {
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : cfg_.max_position;
  if (n_ctx_ <= 0) n_ctx_ = 4096;
  max_tokens_ = std::max(1, options.max_batch_tokens);
  max_seqs_ = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens_) : max_tokens_;
}

Status CpuPagedModel::create_kv(const ModelOptions& options, int64_t n_layers, int64_t kv_width, DType dtype) {
  const int32_t bs = std::max(1, options.kv_block_size);
  const size_t token_bytes = 2 * static_cast<size_t>(n_layers) * row_bytes(dtype, kv_width);
  const int64_t n_blocks = options.kv_cache_bytes > 0
                               ? options.kv_cache_bytes / static_cast<int64_t>(token_bytes * static_cast<size_t>(bs))
                               : std::max(1, options.n_kv_slots) * ((n_ctx_ + bs - 1) / bs);
  if (n_blocks < 1 || n_blocks > INT32_MAX) {
    return Error{files_->path + ": a KV cache of " + std::to_string(options.kv_cache_bytes) +
                 " bytes holds no whole block of " + std::to_string(bs) + " tokens (" + std::to_string(token_bytes) +
                 " bytes per token)"};
  }
  RILL_ASSIGN_OR_RETURN(
      kv_, PagedKvCache::create(n_layers, static_cast<int32_t>(n_blocks), options.kv_block_size, kv_width, dtype));
  return {};
}

Status CpuPagedModel::check_kv_block(int64_t layer, int32_t block) const {
  if (layer < 0 || layer >= kv_.n_layers() || block < 0 || block >= kv_.n_blocks()) {
    return Error{"KV layer " + std::to_string(layer) + " block " + std::to_string(block) + " does not exist"};
  }
  return {};
}

Status CpuPagedModel::copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
  RILL_TRY(check_kv_block(layer, block));
  kv_.copy_block_out(layer, block, k, v);
  return {};
}

Status CpuPagedModel::copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) {
  RILL_TRY(check_kv_block(layer, block));
  kv_.copy_block_in(layer, block, k, v);
  return {};
}

std::string CpuPagedModel::kv_numerics() const {
  return std::string("cpu ") + cpu::isa_name(cpu::best_isa());
}

}  // namespace rill
