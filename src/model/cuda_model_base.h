#pragma once
// The CUDA runtime the model families share (model/arch/llama.cpp,
// gemma.cpp, qwen3_next.cpp): weight upload into one device buffer, the
// activation arena, the paged KV pool (one K and one V plane per layer), the
// recurrent-state pool of hybrid families (model/state_pool.h, with its
// step indices uploaded each step), the step's index arrays uploaded with
// one copy from pinned memory, decode
// steps replayed as CUDA graphs, and forward / forward_greedy /
// forward_sample (ids drawn on the device under the step's token masks,
// backend/cuda/sampling.h), which may also be queued without waiting and
// chained, the next step's tokens read on the device from the ids the
// queued one draws (StepOverlap, model/step_overlap.h). A
// family supplies its weights, its activations and run_layers() (every
// kernel of one step). A family on the device-neutral Backend (the Llama and
// Gemma graphs) calls create_backend(), places its weights through
// backend_, carves its activations (carve_tensor) and the Backend's scratch
// (carve_cuda_scratch) in carve_activations(), and runs its forward over
// step_metadata() and kv_view().
//
// KV groups (Model::kv_spec()): every layer has a plane of n_kv_blocks()
// blocks; a block id belongs to one group, whose layers alone write it.
// A step's slots and block tables are uploaded per group (at most
// kMaxKvGroups), so a family reads group g's through meta().slots[g] and
// meta().tables[g].
//
// Tensor parallelism (a CudaShard with a group, model/cuda_shard.h): the
// model is one rank's share (model/tensor_split.h's cut) on the group's
// device for that rank. read_dims() plans the split; the family binds the
// full tensors, slices them and calls narrow_dims(); run_layers() lets only
// rank 0 accumulate the row-parallel o/down outputs into the residual
// (owns_residual()) and calls reduce_residual() after each, and ends with
// lm_head() (vocabulary-parallel, gathered). All of it sits inside the
// decode graphs: the collectives are enqueued on the rank's stream.
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loader/model_files.h"
#include "model/cuda_shard.h"
#include "model/kv_types.h"
#include "model/model.h"
#include "model/state_pool.h"
#include "model/step_overlap.h"
#include "model/tensor_split.h"

#if RILL_HAVE_CUDA
#include <optional>

#include "backend/backend.h"       // kMaxKvGroups
#include "backend/cpu/host_ops.h"  // WeightView
#include "backend/cpu/rope_table.h"
#include "backend/cuda/cuda_backend.h"  // CudaChanLimits
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "core/e4m3.h"  // kKvIq4Nl64

namespace rill {

class Communicator;

// Bytes of one element of a float dtype on the device (F32: 4, F16/BF16: 2).
inline size_t cuda_dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

// A dense [rows, cols] view of dtype t taken from `a` (cuda::Arena's two
// passes: null data in the sizing pass).
inline Tensor carve_tensor(cuda::Arena& a, DType t, int64_t rows, int64_t cols) {
  void* p = a.take<uint8_t>(static_cast<size_t>(rows * cols) * cuda_dtype_size(t));
  return Tensor::dense(p, t, rows, cols);
}

// The dtypes a CUDA model computes in, from its layer matrices (layer 0's
// first matrix first) and embedding: act is that first matrix's dtype (bf16
// where any matrix is quantized, or for a dtype the kernels do not take);
// KV is f32 when every matrix and the embedding are f32 (f32 checkpoints
// match the CPU within f32 rounding), else f16. Errors name an unsupported
// weight dtype.
struct CudaDtypes {
  DType act = DType::kBF16;
  DType kv = DType::kF16;
};
Result<CudaDtypes> pick_cuda_dtypes(const std::string& path, const std::vector<const WeightView*>& layer_mats,
                                    const WeightView& embed);

// A RoPE table on the device: inv_freq [rot_dim / 2], then the ggml
// divisors [rot_dim / 2] (zeros when none).
struct DeviceRope {
  cpu::RopeTable table;
  cuda::DeviceBuffer buf;
  static Result<DeviceRope> upload(cpu::RopeTable table);
  // Sets rk's angle fields (inv_freq, divisors, rot_dim, style, factors).
  void apply(cuda::RopeKvArgs& rk) const;
};

// Step metadata: the same layout in pinned host memory and on the device,
// so one copy uploads it. Groups >= 1's block tables come first (one copy
// each, of the used prefix), then the per-token arrays and group 0's tables
// last: one copy moves those up to group 0's used prefix.
struct StepMeta {
  int32_t* ids = nullptr;              // [T]
  int32_t* pos = nullptr;              // [T]
  int32_t* seq_of = nullptr;           // [T]
  int32_t* decode_tokens = nullptr;    // [T]
  int32_t* sample_rows = nullptr;      // [S]
  int32_t* table_start = nullptr;      // [T] (a batch has at most one sequence per token)
  cuda::PrefillTile* tiles = nullptr;  // [T]
  int32_t* slots[kMaxKvGroups] = {};   // [T] cache row of each token, per group
  // k4c's per-sequence arrays (StepMetadata's; [n_seq_arrays] each, 0
  // without KV tails: uploaded only by models that keep tails).
  int32_t* q_start = nullptr;
  int32_t* q_len = nullptr;
  int32_t* kv_len = nullptr;
  int32_t* kv_tail = nullptr;
  int32_t* tables[kMaxKvGroups] = {};  // [table_cap] per group

  void carve(cuda::Arena& a, size_t T, size_t S, size_t table_cap, int n_groups, size_t n_seq_arrays = 0);
};

// What a step's draws read besides the logits, the same layout in pinned
// host memory and on the device: forward_sample's rows, then the token
// masks (backend/sampling.h TokenMasks), so one copy of a used prefix
// uploads a step's rows and masks. Steps without masks copy the rows only.
struct DrawInputs {
  DeviceSamplingParams* params = nullptr;  // [S]
  int32_t* row_mask = nullptr;             // [S]
  uint32_t* words = nullptr;               // [S, n_words]

  void carve(cuda::Arena& a, size_t S, size_t n_words);
};

// A CUDA event without timing, destroyed with its owner.
class StepEvent {
 public:
  StepEvent() = default;
  StepEvent(const StepEvent&) = delete;
  StepEvent& operator=(const StepEvent&) = delete;
  ~StepEvent();
  Status create();
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class CudaModelBase : public Model, public StepOverlap {
 public:
  const ModelConfig& config() const override { return cfg_; }
  int64_t n_vocab() const override { return cfg_.n_vocab; }
  int64_t n_ctx() const override { return n_ctx_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_batch_seqs() const override { return max_seqs_; }
  const KvSpec& kv_spec() const override { return kv_spec_; }
  int32_t kv_block_size() const override { return block_size_; }
  int32_t n_kv_blocks() const override { return n_blocks_; }
  size_t kv_bytes_per_token() const override { return kv_token_bytes_; }
  // k4c's per-sequence KV tails on the device (model/kv_tails.h's layout
  // and slot count; 0 without).
  int32_t n_kv_tail_slots() const override { return n_tail_slots_; }
  size_t kv_tail_bytes() const override { return static_cast<size_t>(n_tail_slots_) * tail_slot_bytes_; }
  Status forward(const Batch& batch, float* logits) override;
  bool has_forward_greedy() const override { return true; }
  Status forward_greedy(const Batch& batch, const TokenMasks& masks, int32_t* ids) override;
  // A family with an MTP layer (mtp_rows_): the step with every token's
  // final-normed hidden state (rows_out()), and the MTP layer over the
  // uploaded hidden rows (rows_in(); its fed-back output in rows_out()).
  // Decode steps replay graphs of their own kind. Otherwise Model's errors.
  Status forward_hidden(const Batch& batch, float* logits, float* hidden) override;
  Status forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) override;
  bool has_forward_sample() const override { return device_sampling_; }
  Status forward_sample(const Batch& batch, const DeviceSamplingParams* rows, const TokenMasks& masks,
                        int32_t* ids) override;
  // StepOverlap. Host buffers a queued step reads (step metadata, draw
  // parameters, the ids it copies back) come in two sets used in turn, so
  // a step is prepared while the one before it may still read its set;
  // the device's own buffers are used in stream order. Not for recurrent
  // families (their state indices have one host set), shards or KV tails.
  bool can_queue_steps() const override { return !states_ && !sharded() && n_kv_tail_slots() == 0; }
  Status launch_ids(const Batch& batch, const DeviceSamplingParams* rows, bool chain_ids) override;
  Status take_ids(int32_t* ids) override;
  int n_queued() const override { return n_queued_; }
  ~CudaModelBase() override;

  // KV export and import for the prefix cache tiers (model/cuda_kv_export.cpp):
  // layer i < n_kv_layers_ is plane pair i, rows in kv_dtype_ (f16; f32 for
  // f32 checkpoints; q8_0 blocks where chosen), one token's K (or V) row KV_ elements, head-major: the
  // layout the CPU models' PagedKvCache exports (rotated types: its rotated heads' blocks). Every layer is in group 0;
  // families with several groups (Gemma) say which group each layer is in.
  // The copies go on stream(), so they are ordered after any step queued
  // there, and through a pinned staging buffer (allocated at the first
  // copy): one synchronization per staging chunk, not one per block. Like
  // forward(), they are for one thread at a time (the engine's).
  std::vector<KvLayer> kv_layers() const override;
  Status copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const override;
  Status copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) override;
  Status copy_kv_blocks_out(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, uint8_t* k,
                            uint8_t* v) const override;
  Status copy_kv_blocks_in(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, const uint8_t* k,
                           const uint8_t* v) override;
  // "cuda sm_<cc> act=<dtype>", then the numerics-changing modes in use
  // (batch-invariant) and, for a shard, tp=<n>; with q4a, its widths' hash
  // (as CpuPagedModel::kv_numerics: the CUDA model's own calibration).
  std::string kv_numerics() const override;

  // k4a (kv_dtype_ kKvQ4Alloc): a layer's K widths ([KV row], 0..8 a
  // channel, 4 on average: backend/cpu/kv_alloc.h), every channel 4 until
  // calibrate_kv() or set_kv_k_widths() sets them; empty for other types.
  const std::vector<uint8_t>& kv_k_widths(int64_t layer) const { return k_widths_[static_cast<size_t>(layer)]; }
  // Replaces a layer's widths (uploaded to its widths table now): for
  // tests that hold CUDA's k4a to the CPU's under the CPU's widths. Only
  // while no q4a block is stored (blocks encoded under other widths would
  // be read wrong). widths: kv_width(layer) entries in 0..8 summing to 4
  // a channel.
  Status set_kv_k_widths(int64_t layer, std::vector<uint8_t> widths);

  // The recurrent-state pool's (families that create_states()).
  int32_t n_state_slots() const override { return states_ ? states_->n_slots() : 0; }
  int32_t n_state_checkpoints() const override { return states_ ? states_->n_checkpoints() : 0; }
  int32_t n_spec_states() const override { return states_ ? states_->n_spec_states() : 0; }
  size_t state_bytes() const override { return states_ ? states_->state_bytes() : 0; }
  std::vector<std::vector<StateTensor>> state_layers() const override {
    return states_ ? states_->state_layers() : std::vector<std::vector<StateTensor>>{};
  }
  Status copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const override;
  Status copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) override;

 protected:
  explicit CudaModelBase(std::shared_ptr<const ModelFiles> files, CudaShard shard = {})
      : files_(std::move(files)), cfg_(files_->config), shard_(shard) {}

  // One step as run_layers() sees it: n tokens (decode graphs: padded),
  // logits for the first n_sample sample rows, decode and prefill routing.
  struct Step {
    int64_t n = 0, n_sample = 0;
    int32_t n_decode = 0, max_decode_len = 0, n_tiles = 0;
    int32_t decode_work = 0;  // StepMetadata::decode_work
    int32_t n_seqs = 0;       // the batch's sequences (read with KV tails: StepMetadata::n_seqs)
  };

  // Init, first: E_, V_, F_, hd_, Q_, KV_ from cfg_ (the whole model's),
  // refusing configs the CUDA kernels do not take (errors name the model
  // file); a shard also plans split_ and ff_split_ (errors when they do
  // not divide).
  Status read_dims();
  // Init, next: the device context and cuBLASLt (on the shard's device;
  // the group's collectives of this rank go on its stream).
  Status create_context();
  // Init, for a family on the Backend, once act_ is chosen: backend_ on this
  // context and GEMM (options.batch_invariant), its scratch carved by the
  // family's carve_activations() (backend_scratch_).
  Status create_backend(const ModelOptions& options);
  // Shards, once the full tensors are bound and sliced: Q_, KV_, F_ become
  // this rank's (its heads', KV heads' and intermediate slice's).
  void narrow_dims();
  // Init, last (after weights, act_, kv_dtype_, the dims and kv_spec_):
  // options, the arena (carve_activations() plus the shared buffers), the
  // step metadata and the KV pool.
  Status init_runtime(const ModelOptions& options);
  // Init, for a family with recurrent layers, after create_backend() and
  // before init_runtime() (the KV pool takes what memory is left): the
  // state pool of n_layers layers of `tensors` each in device memory, and
  // its per-step indices (pinned and device copies). Each step then checks
  // the batch's states and uploads its indices, which step_metadata()
  // carries (StepMetadata::recurrent; a decode graph's padding tokens are
  // sequences of their own ending in the pool's scratch state).
  Status create_states(int64_t n_layers, std::vector<StateTensor> tensors, const ModelOptions& options);
  const StatePool& states() const { return *states_; }
  // The family's activation buffers; called twice (sizing pass, then real).
  virtual void carve_activations(cuda::Arena& a) = 0;
  // What the backend carves for k4c / k4a steps (the step's q8_0 rows at
  // the widest KV layer's width, the attention's scores over the context):
  // every family that keeps KV tails passes it to carve_cuda_scratch;
  // empty (nothing carved) without k4c / k4a.
  CudaChanLimits chan_limits() const;
  // Every kernel of the step over metadata already uploaded (meta()),
  // logits_ for the first s.n_sample entries of sample_rows. Captured in a
  // graph for decode steps: no host synchronization, nothing that varies
  // between replays except through meta().
  virtual Status run_layers(const Step& s) = 0;

  // Tensor parallelism. sharded(): this model is one rank of a group.
  // Row-parallel matmuls (o, down) accumulate into the residual stream x on
  // rank 0 only and overwrite it on the others; reduce_residual() then sums
  // x over the ranks, so every rank holds x + the full product (the same
  // bits on every rank). Unsharded: owns_residual() and a no-op.
  bool sharded() const { return comm_ != nullptr; }
  bool owns_residual() const { return split_.rank == 0; }
  Status reduce_residual(float* x, int64_t n);  // x: [n, E_]
  // logits_ [n_sample, V_] = x [n_sample, E_] times the LM head w. Shards:
  // w holds this rank's vocabulary rows (split_.vocab); the slices are
  // all-gathered and rank 0 lays them out as full rows (logits_ is complete
  // on rank 0 only, where forward/greedy/sample read it).
  Status lm_head(const cuda::DeviceWeight& w, const void* x, int64_t n_sample);
  // lm_head() in two halves, for families whose head matmul is a Backend's:
  // where the head's [n_sample, this rank's vocabulary rows] product goes
  // (logits_, or a shard's slice buffer), then the gather (no-op unsharded).
  float* head_out() const { return comm_ ? vocab_local_ : logits_; }
  Status gather_logits(int64_t n_sample);

  // What run_layers() computes (forward_hidden, forward_mtp): kForward
  // the logits; kHidden also every token's final-normed hidden state into
  // rows_out(); kMtp the MTP layer over the hidden rows in rows_in(), its
  // fed-back output into rows_out(). Both [max tokens, E_] F32, carved
  // when the family set mtp_rows_ before init_runtime().
  enum class StepKind : uint32_t { kForward = 0, kHidden = 1, kMtp = 2 };
  StepKind step_kind() const { return step_kind_; }
  float* rows_in() const { return rows_in_; }
  float* rows_out() const { return rows_out_; }
  bool mtp_rows_ = false;

  const StepMeta& meta() const { return meta_dev_; }
  // The step as a Backend reads it (backend/backend.h): meta()'s device
  // arrays and s's counts. The per-sequence arrays (q_start, q_len, kv_len,
  // decode_from) stay null: the CUDA Backend reads the routed ones; with
  // k4c KV, n_seqs, q_start, q_len, kv_len and kv_tail are set (the tails'
  // plan, backend/cuda/kv_chan_step.h).
  StepMetadata step_metadata(const Step& s) const;
  // Layer `layer`'s K and V planes as a Backend reads them.
  KvCacheView kv_view(size_t layer) const;
  Status matmul(const cuda::DeviceWeight& w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                bool accumulate) {
    if (cuda::quant_supported(w.dtype)) {
      return cuda::quant_matmul(*gemm_, qscratch_, w.dtype, w.data, act_, x, n, rows, cols, y, accumulate,
                                ctx_->stream());
    }
    return gemm_->matmul(act_, w.data, x, n, rows, cols, y, accumulate);
  }
  void* k_cache(size_t layer) const { return kv_.as<uint8_t>() + kv_plane_off_[layer]; }
  void* v_cache(size_t layer) const { return kv_.as<uint8_t>() + kv_plane_off_[layer] + kv_plane_bytes(layer); }
  // Elements of one token's K (or V) row in KV layer `layer`.
  int64_t kv_width(size_t layer) const { return kv_widths_.empty() ? KV_ : kv_widths_[layer]; }
  // Bytes of one token's K row in KV layer `layer` (kv_dtype_'s blocks),
  // and of its V row (kv_v_dtype(): k4c's iq4_nlh64; else K's type).
  size_t kv_row_bytes(size_t layer) const { return row_bytes(kv_dtype_, kv_width(layer)); }
  size_t kv_v_row_bytes(size_t layer) const { return row_bytes(kv_v_dtype(), kv_width(layer)); }
  DType kv_v_dtype() const { return kv_chan_ ? kKvIq4Nl64 : kv_dtype_; }
  size_t kv_plane_bytes(size_t layer) const {
    return static_cast<size_t>(n_blocks_ + 1) * static_cast<size_t>(block_size_) * kv_row_bytes(layer);
  }
  size_t kv_v_plane_bytes(size_t layer) const {
    return static_cast<size_t>(n_blocks_ + 1) * static_cast<size_t>(block_size_) * kv_v_row_bytes(layer);
  }
  cudaStream_t stream() const { return ctx_->stream(); }

  std::shared_ptr<const ModelFiles> files_;
  const ModelConfig& cfg_;
  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<cuda::Gemm> gemm_;
  // The device-neutral ops on ctx_ and gemm_ (create_backend()); null for
  // the families on backend/cuda/ops.h.
  std::unique_ptr<Backend> backend_;
  std::optional<StatePool> states_;  // create_states()
  // kv_dtype_: what the KV planes store. A family sets its own (f16; f32
  // for f32 checkpoints) before init_runtime(), which replaces it by the
  // KV type options name (choose_kv_type()).
  DType act_ = DType::kBF16, kv_dtype_ = DType::kF16;
  // q8_0h / q4_0h / iq4_nlh: both sides Hadamard-rotated per head (kv_view()'s flags).
  bool kv_rotated_ = false;
  // k4c / k4a (kv_dtype_ kKvQ4Chan / kKvQ4Alloc, V iq4_nlh64 rotated,
  // blocks of 32, a KV tail per running sequence): chosen by
  // choose_kv_type() only for families that set kv_tails_supported_ (every
  // layer reads its own KV, and the family's forward() is the base's, which
  // checks the batch's tails).
  bool kv_chan_ = false;
  // k4a: computes the widths (CpuPagedModel::calibrate_kv's pass and
  // allocation, the same tokens, pairs and rot_dim) from this model's own
  // forward pass: the CUDA backend adds each token's statistics on the
  // host from the step's downloaded queries and f32 K rows after RoPE
  // (KvCacheView::calibration; decode graphs off for the pass). The same
  // tokens give the same widths every load on the same GPU and build (the
  // pass is deterministic; kv_numerics names the device, the build's
  // numerics and the widths' hash). A no-op without a q4a layer. Call at
  // the end of init, after init_runtime(). rope: one per KV layer (every
  // KV layer's head is hd_ wide: families with per-layer head dims keep no
  // tails here).
  Status calibrate_kv(const std::vector<int32_t>& tokens, const std::vector<KvRopePairs>& rope);
  // The same with every layer paired alike.
  Status calibrate_kv(const std::vector<int32_t>& tokens, bool rope_interleaved, int64_t rope_dim) {
    return calibrate_kv(tokens, std::vector<KvRopePairs>(k_widths_.size(), KvRopePairs{rope_interleaved, rope_dim}));
  }
  bool kv_tails_supported_ = false;
  // Why a family that keeps tails does not for this model (for the error
  // choose_kv_type() gives); empty: the family keeps none.
  std::string kv_tails_refusal_;
  int64_t E_ = 0, V_ = 0, F_ = 0, hd_ = 0, Q_ = 0, KV_ = 0;  // KV_: one layer's K (or V) row
  // Attention groups (with block tables) first; a recurrent group, whose
  // states are states_, after them.
  KvSpec kv_spec_;
  // Layers with K/V planes (k_cache(i) for i < n_kv_layers_); 0: every layer.
  int64_t n_kv_layers_ = 0;
  // Each KV layer's row width when they differ (Gemma 4's full layers);
  // empty: every layer KV_ wide. Set before init_runtime().
  std::vector<int64_t> kv_widths_;
  // Quantized matrices: the largest kept in blocks (elements), and whether
  // the LM head is one (its GEMM goes in row chunks of the scratch).
  int64_t quant_max_elems_ = 0;
  bool quant_head_ = false;
  float* logits_ = nullptr;  // [S, V]
  // The family runs on a Backend whose scratch (attention partials, the
  // dequantization scratch) it carves in carve_activations(): the base then
  // carves no attention partials of its own.
  bool backend_scratch_ = false;
  CudaShard shard_;
  Communicator* comm_ = nullptr;        // shards: rank shard_.rank of shard_.group
  TensorSplit split_;                   // shards: this rank's heads, KV heads and vocabulary rows
  SplitRange ff_split_;                 // shards: this rank's rows of gate/up (columns of down)
  int64_t n_head_ = 0, n_head_kv_ = 0;  // this rank's (all of them unsharded)

 private:
  // The step's recurrent indices (states_) into pinned memory and up to the
  // device on stream(); sets rec_step_. n_run: the padded token count.
  Status upload_states(const Batch& batch, int64_t n_run);
  // Uploads the step's indices and computes logits_ for the sample rows;
  // decode-only steps replay a CUDA graph per (padded batch, split count).
  Status compute(const Batch& batch);
  // compute() then the draws of the step's sample rows into ids_dev_
  // (rows == nullptr: argmax, or the masked argmax) and their copy to the
  // host set in use, marked by its event; waits for nothing. Switches
  // host_slot_ first.
  Status enqueue_ids(const Batch& batch, const DeviceSamplingParams* rows, const TokenMasks& masks);
  // Waits for host set `slot`'s event and copies its n_sample ids to `ids`.
  Status wait_ids(int slot, int64_t n_sample, int32_t* ids);
  // Copies `masks` (host, checked) into the draw set in use; returns their
  // device view in draw_dev_, valid once that set is uploaded up to
  // masks_end().
  TokenMasks stage_masks(const TokenMasks& masks, int64_t n_sample);
  const uint8_t* masks_end(const TokenMasks& masks) const {
    const DrawInputs& dh = draw_host_[host_slot_];
    return reinterpret_cast<const uint8_t*>(dh.words + masks.n_masked * masks.n_words);
  }
  // kv_spec_'s groups with block tables: those before the first recurrent one.
  int n_table_groups() const;
  // The KV type options against what CUDA stores: one type for every layer
  // and both sides, the family's kv_dtype_ or a quantized type the kernels
  // read (cuda::kv_supported: q8_0; rotated q8_0h / q4_0h / iq4_nlh set kv_rotated_),
  // which then becomes kv_dtype_. Errors name the model file and the type.
  Status choose_kv_type(const KvTypeOptions& kt);
  // KV export: the checks shared by the copies, and the staging buffer.
  Status check_kv_blocks(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes) const;
  // Device -> out[0] (K), out[1] (V) when out is set, else in -> device.
  Status copy_kv_blocks(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, uint8_t* const out[2],
                        const uint8_t* const in[2]) const;
  size_t kv_block_bytes(int64_t layer) const;  // one block's K rows of one layer (V's as K's but with k4c)
  mutable cuda::PinnedBuffer kv_staging_;
  // k4c's tails (model/kv_tails.h's layout: per slot, each KV layer's
  // 64-byte KvTailHeader, 32 K rows, 32 V rows in q8_0), carved once with
  // the KV pool and counted in its budget. Never exported: the tiers and
  // KV files take whole blocks only (copy_kv_blocks). tail_off_[l]: layer l's tail within a
  // slot. tail_heads_: each slot's header as the host last left it
  // (group_start, n_rows; the device's after every step), which
  // check_kv_tails() holds each batch to without reading the device.
  cuda::DeviceBuffer kv_tails_;
  // k4a's widths per KV layer (host) and their tables on the device
  // (backend/cuda/kv_chan.h alloc_table_bytes; layer l's at
  // k_widths_off_[l], KvCacheView::k_widths); calibration_: the pass's
  // statistics per layer while calibrate_kv() runs, else empty.
  std::vector<std::vector<uint8_t>> k_widths_;
  cuda::DeviceBuffer k_widths_dev_;
  std::vector<size_t> k_widths_off_;
  mutable std::vector<KvCalibrationStats> calibration_;
  std::vector<size_t> tail_off_;
  size_t tail_slot_bytes_ = 0;
  int32_t n_tail_slots_ = 0;
  std::vector<std::pair<int32_t, int32_t>> tail_heads_;
  // The batch's tails, as KvTails::check; then, once its step is queued,
  // each slot's header as the step leaves it (note_kv_tails).
  Status check_kv_tails(const Batch& batch) const;
  void note_kv_tails(const Batch& batch);

  int max_tokens_ = 0, max_seqs_ = 0;
  int64_t n_ctx_ = 0;
  int32_t block_size_ = 16, block_shift_ = 4, n_blocks_ = 0;
  size_t kv_token_bytes_ = 0;
  std::string kv_types_desc_;         // describe_kv_types() of the KV types in use, for kv_numerics()
  std::vector<size_t> kv_plane_off_;  // [n_kv_layers]: the K plane of each layer (its V plane follows)
  size_t table_cap_ = 0;
  cuda::QuantScratch qscratch_;

  cuda::DeviceBuffer kv_;
  cuda::DeviceBuffer act_buf_;
  float* partial_ = nullptr;
  float* vocab_local_ = nullptr;  // shards: [S, split_.vocab_stride] this rank's logits
  float* vocab_all_ = nullptr;    // shards: [N, S, split_.vocab_stride] gathered
  int32_t* ids_dev_ = nullptr;    // [S] greedy or sampled ids
  StepKind step_kind_ = StepKind::kForward;
  float *rows_in_ = nullptr, *rows_out_ = nullptr;  // mtp_rows_: [T, E_] each
  // compute() as `kind` (then back to kForward), and the copies out:
  // logits of the sample rows and `rows` [n, E_] from rows_out() when set.
  Status compute_kind(const Batch& batch, StepKind kind, float* logits, float* rows);

  // states_' step indices: pinned host and device copies ([T] each), and
  // the step's (device pointers).
  cuda::PinnedBuffer rec_host_buf_;
  cuda::DeviceBuffer rec_dev_buf_;
  RecurrentSeq *rec_seqs_host_ = nullptr, *rec_seqs_dev_ = nullptr;
  RecurrentSave *rec_saves_host_ = nullptr, *rec_saves_dev_ = nullptr;
  int32_t *rec_tok_host_ = nullptr, *rec_tok_dev_ = nullptr;
  RecurrentStep rec_step_;

  // Host sets, used in turn (host_slot_: the set of the step being
  // prepared or last run; see launch_ids), and their events.
  cuda::PinnedBuffer meta_host_buf_[2], ids_host_[2], draw_host_buf_[2];
  StepMeta meta_host_[2];
  DrawInputs draw_host_[2];
  StepEvent ids_ready_[2];
  int host_slot_ = 0;
  cuda::DeviceBuffer meta_dev_buf_, draw_dev_buf_;
  StepMeta meta_dev_;
  DrawInputs draw_dev_;
  // Queued steps (StepOverlap), oldest first: their host set and sample
  // row count.
  struct QueuedStep {
    int slot = 0;
    int64_t n_sample = 0;
  };
  QueuedStep queued_[2];
  int n_queued_ = 0;
  // compute(): tokens [0, n) read from ids_dev_ after the metadata upload
  // (launch_ids with chain_ids).
  bool chain_ids_ = false;

  // Decode graphs, keyed by step kind << 48 | log2 of the decode work
  // bucket << 40 | padded batch size << 8 | split bucket (decode_cuda). A
  // key is run eagerly the first time (plans GEMMs, sets kernel
  // attributes) and captured the second.
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    bool seen = false;
  };
  std::unordered_map<uint64_t, Graph> graphs_;
  bool use_graphs_ = true;  // ModelOptions::cuda_graphs
  // Decode attention always combines its splits in a combine kernel and
  // takes the fast kernel where it applies. The switches that forced the
  // alternatives are gone, their comparisons done: the in-kernel split
  // merge was slower on the H200 (8B bf16, 2026-11-29, 26cac1b: 5.17 vs
  // 5.10 ms at batch 1, 7.62 vs 7.50 ms at 64) and the general kernel far
  // slower (158 / 8,255 tok/s at batch 1 / 64; docs/perf.md). Both paths
  // stay in the kernels and their tests (tests/cuda/cuda_attention_test).
  // ModelOptions::batch_invariant. What it guarantees: a token's logits
  // (and so its greedy or seeded sample: sampling is per row) are the same
  // bits whatever else shares its step and however its prompt was chunked.
  // How: every matmul goes through gemm_'s invariant mode (bf16/f16 and
  // dequantized weights: gemm_invariant; f32: the GEMV; never cuBLASLt nor a
  // switch by token count), the MoE experts through device routing and the
  // fixed-order expert kernels at every token count (backend/cuda/moe_ffn.h), and every
  // token's attention through the split-KV decode kernel, whose splits
  // depend on the token's own length (the prefill tile kernel would make a
  // prompt token's bits depend on its chunk's length). The rest is per
  // token or per row already: norms, RoPE, activations, sampling. What it
  // does not: bits equal to the default mode (it is a different kernel, so
  // logits differ from it within bf16 rounding), to other GPUs or builds,
  // or across tensor-parallel sizes. (The hybrid family's gated DeltaNet
  // layers are invariant in either mode: cuda/gated_delta.h.) Cost: slower prefill and large batches
  // (gemm_invariant is far below cuBLASLt's peak), and quantized weights
  // are dequantized at every step, one token too.
  bool batch_invariant_ = false;
  bool fp8_weights_ = false;  // ModelOptions::quantize == kFp8
  // ModelOptions::cuda_device_sampling: false offers no forward_sample, so
  // sampled rows go to the host as logits (benchmarks compare the two).
  bool device_sampling_ = true;
};

}  // namespace rill
#endif  // RILL_HAVE_CUDA
