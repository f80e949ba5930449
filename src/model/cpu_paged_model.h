#pragma once
// What the CPU model families (model/arch/llama.cpp, gemma.cpp,
// qwen3_next.cpp) share: their files and config, a CPU backend, the batch
// limits, the paged KV cache of their attention layers sized from the
// options, the recurrent-state pool of hybrid families (model/state_pool.h),
// a step's metadata as the CPU Backend reads it, and the Model accessors,
// KV-block and state export over them. A family adds its weights,
// activations, kv_spec_ and forward().
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/host_ops.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/kv_types.h"
#include "model/model.h"
#include "model/paged_kv_cache.h"
#include "model/state_pool.h"

namespace rill {

// The per-sequence and per-token arrays of a step's StepMetadata on the CPU
// (the rest points into the Batch). reserve() once: filling them then
// allocates nothing.
struct CpuStepArrays {
  std::vector<int32_t> q_start, q_len, kv_len, decode_from, table_start, kv_tail;  // [n_seqs]
  std::vector<int32_t> slots[kMaxKvGroups];                                        // [n_tokens] per KV group
  std::vector<RecurrentSeq> rec_seqs;                                              // [n_seqs], with a state pool
  std::vector<RecurrentSave> rec_saves;                                            // [n_saves]
  std::vector<int32_t> rec_tok_seq;                                                // [n_tokens]
  void reserve(int64_t max_tokens);  // a batch has at most one sequence per token
};

class CpuPagedModel : public Model {
 public:
  const ModelConfig& config() const override { return cfg_; }
  int64_t n_vocab() const override { return cfg_.n_vocab; }
  int64_t n_ctx() const override { return n_ctx_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_batch_seqs() const override { return max_seqs_; }
  const KvSpec& kv_spec() const override { return kv_spec_; }
  int32_t kv_block_size() const override { return kv_.block_size(); }
  int32_t n_kv_blocks() const override { return kv_.n_blocks(); }
  size_t kv_bytes_per_token() const override { return kv_.bytes_per_token(); }

  // `layer` counts the cache's layers (a family's kv_layers() says which
  // model layers those are); errors name a layer or block that is not there.
  Status copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const override;
  Status copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) override;
  // "cpu <isa>": the kernels' instruction set (backend/cpu/cpu_features.h)
  // changes results within rounding, the thread count does not.
  std::string kv_numerics() const override;

  // The recurrent-state pool's (families that create_states()).
  int32_t n_state_slots() const override { return states_ ? states_->n_slots() : 0; }
  int32_t n_state_checkpoints() const override { return states_ ? states_->n_checkpoints() : 0; }
  int32_t n_spec_states() const override { return states_ ? states_->n_spec_states() : 0; }
  size_t state_bytes() const override { return states_ ? states_->state_bytes() : 0; }
  int32_t n_kv_tail_slots() const override { return kv_.tails().n_slots(); }
  size_t kv_tail_bytes() const override { return kv_.tails().bytes(); }
  std::vector<std::vector<StateTensor>> state_layers() const override {
    return states_ ? states_->state_layers() : std::vector<std::vector<StateTensor>>{};
  }
  Status copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const override;
  Status copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) override;

  // q4a's widths of a KV layer (PagedKvCache::k_widths; empty for other
  // types): what tests hold the CUDA model's k4a to under the same widths.
  const std::vector<uint8_t>& kv_k_widths(int64_t layer) const { return kv_.k_widths(layer); }
  // The tokens q4a's calibration pass reads at most (calibrate_kv; the
  // CUDA model's pass too, CudaModelBase::calibrate_kv).
  static constexpr int32_t kKvCalibrationTokens = 256;
  // How many of n_text calibration tokens q4a's pass reads (both devices'
  // calibrate_kv): at most kKvCalibrationTokens, the context and the KV
  // pool's tokens; an error naming `path` under two blocks, and a line on
  // stderr saying why when under kKvCalibrationTokens.
  static Result<int64_t> kv_calibration_length(const std::string& path, size_t n_text, int64_t n_ctx,
                                               int64_t pool_tokens, int64_t block_size);

 protected:
  CpuPagedModel(std::shared_ptr<const ModelFiles> files, int n_threads)
      : files_(std::move(files)), cfg_(files_->config), backend_(cpu::make_host_ops(n_threads)) {}

  // n_ctx_: options.n_ctx, else the config's max_position, else 4096;
  // max_tokens_: options.max_batch_tokens (at least 1); max_seqs_:
  // options.max_batch_seqs capped at max_tokens_ (0: max_tokens_).
  void set_limits(const ModelOptions& options);

  // kv_: n_layers planes of kv_width-element rows (heads of head_dim) in
  // dtype, or in options.kv_types where set, with as many blocks as
  // options.kv_cache_bytes holds when it is set, else n_kv_slots whole
  // contexts. Call after set_limits(). The error names the model file (or
  // the KV config file and line).
  Status create_kv(const ModelOptions& options, int64_t n_layers, int64_t kv_width, int64_t head_dim, DType dtype);
  // The same with one plane per entry of planes, each of its own shape
  // (n_head_kv heads of head_dim: Gemma 4's full layers are wider); their
  // types are set here from options.kv_types (or dtype).
  Status create_kv(const ModelOptions& options, std::vector<PagedKvCache::LayerSpec> planes, DType dtype);
  // kv_layers() of a cache whose layer l is in group group_of(l).
  template <typename GroupOf>
  std::vector<KvLayer> cache_kv_layers(GroupOf&& group_of) const {
    std::vector<KvLayer> out;
    for (int64_t l = 0; l < kv_.n_layers(); ++l) {
      const size_t k = kv_.k_row_bytes(l), v = kv_.v_row_bytes(l);
      const bool same = v == k && kv_.types(l).k == kv_.types(l).v;
      out.push_back({group_of(l), kv_.types(l).k.dtype, k, same ? 0 : v, kv_.types(l).v.dtype});
    }
    return out;
  }

  // q4a (k4a): when any layer's K is kKvQ4Alloc, computes its widths:
  // one forward pass of the first kKvCalibrationTokens of `tokens` (one
  // sequence, tail slot 0, blocks from 0 in every KV group's table, every
  // width 4) gathering KvCalibrationStats, then cpu::allocate_channel_bits
  // (one_bit false) per layer (pairs: rope[layer], one per KV layer). The
  // pass's KV is left in blocks no table holds (never cached), and the
  // tail slot is reused by the next sequence (which starts at a block
  // boundary). The same tokens give the same widths every load on a
  // machine of the same ISA (the forward pass's bits depend on the ISA
  // alone; kv_numerics names both). Call at the end of init, before any
  // other forward().
  Status calibrate_kv(const std::vector<int32_t>& tokens, const std::vector<KvRopePairs>& rope);
  // The same with every layer paired alike.
  Status calibrate_kv(const std::vector<int32_t>& tokens, bool rope_interleaved, int64_t rope_dim) {
    return calibrate_kv(
        tokens, std::vector<KvRopePairs>(static_cast<size_t>(kv_.n_layers()), KvRopePairs{rope_interleaved, rope_dim}));
  }

  Status check_kv_block(int64_t layer, int32_t block) const;
  // The batch's KV tails (KvTails::check); Ok without.
  Status check_kv_tails(const Batch& batch) const { return kv_.tails().check(batch, kv_.block_size()); }

  // The recurrent-state pool of n_layers layers of `tensors` each, in
  // memory of `device` (a CPU Backend that must outlive the model's use of
  // the pool). Call after set_limits().
  Status create_states(Backend& device, int64_t n_layers, std::vector<StateTensor> tensors,
                       const ModelOptions& options);

  // The step's indices as the CPU Backend reads them: the Batch's own
  // arrays, and in `a` the per-sequence ones and every attention group's
  // slots (kv_'s block size; group g's table from batch.table(g, s)).
  // With a state pool, also the step's recurrent indices (the batch's
  // states checked by states_->check() first).
  // Requires a batch check_batch() accepted and a.reserve(n_tokens).
  StepMetadata step_metadata(const Batch& batch, CpuStepArrays& a) const;

  std::shared_ptr<const ModelFiles> files_;
  const ModelConfig& cfg_;
  std::unique_ptr<cpu::HostOps> backend_;
  int max_tokens_ = 0, max_seqs_ = 0;
  int64_t n_ctx_ = 0;
  KvSpec kv_spec_;
  PagedKvCache kv_;
  std::string kv_types_desc_;  // describe_kv_types() of kv_, for kv_numerics()
  // Set by families whose forward() checks and passes KV tails
  // (check_kv_tails(), step_metadata()) and whose layers that read another
  // layer's KV leave its tails to the step's last reader
  // (AttentionOp::tail_read_later): create_kv() refuses q4c / q4a (k4c,
  // k4a) KV otherwise.
  bool kv_tails_supported_ = false;
  // The last planes hold a draft layer's KV (the MTP layer): its rows past
  // the verified positions are rewritten by the next step, which a q4c /
  // q4a block, encoded once complete, cannot take. create_kv() gives them
  // the model's own KV type (f16 or f32) where a q4c / q4a pair resolves
  // for them; the pair's layers are the model's, so drafts change
  // acceptance only.
  int64_t kv_draft_planes_ = 0;
  std::optional<StatePool> states_;
  Backend* states_device_ = nullptr;  // the pool's memory and copies
};

}  // namespace rill
