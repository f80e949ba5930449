#pragma once
// Backend: the device-neutral ops one model graph is written in (issue 16).
// A family's forward() calls these over plain views, so the same code runs
// on the CPU (backend/cpu/cpu_backend.cpp) and on CUDA
// (backend/cuda/cuda_backend.cpp). The CPU Backend is the reference: every
// other Backend is held to it op by op (tests/backend/backend_ops_test.cpp).
//
// The ops are at the fused granularity the CUDA graph already runs (RoPE +
// q/k norm + KV store is one op, attention covers every sequence of a step,
// o/down accumulate into the residual stream), so a Backend adds no
// launches over the hand-written CUDA families.
//
// Contracts shared by every Backend:
//  - Memory: every pointer an op reads or writes (Tensor::data, Vec::data,
//    the KV cache, StepMetadata's arrays) is memory the backend addresses:
//    host memory on the CPU, device memory on CUDA (allocate(), or the
//    runtime's arena). Ops are ordered: each sees the results of the ones
//    before it; copy_out() waits for all of them.
//  - No allocation and no host synchronization inside a step: placement and
//    reserve() happen while planning; every op only launches (CUDA, graph
//    capturable) or computes (CPU).
//  - Dtypes: the residual stream, matmul outputs, q/k/v, logits and GLU
//    inputs are F32. A matmul's input is in act_dtype() (F32 on the CPU;
//    the weights' F32/F16/BF16 on CUDA), so norms, GLU and attention write
//    their outputs in the dtype of the `out` view they are given.
//  - Views are dense (stride == cols) unless an op says it takes strided
//    rows.
//  - Per-row results do not depend on how many rows share the call, so a
//    token's bits do not depend on its batch (CUDA: in batch-invariant
//    mode; the CPU always).
//  - Bad arguments are programming errors (asserted), except where an op
//    returns a Status (placement, reserve, matmul).
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/rope.h"
#include "core/dtype.h"
#include "core/result.h"

namespace rill {

// rows x cols elements of dtype (F32, F16 or BF16), row r at data + r *
// stride elements. A view: owns nothing.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0, stride = 0;

  static Tensor dense(void* data, DType dtype, int64_t rows, int64_t cols) { return {data, dtype, rows, cols, cols}; }
  // Rows [r0, r0 + n) / columns [c0, c0 + n) of this view.
  Tensor rows_from(int64_t r0, int64_t n) const { return {at(r0, 0), dtype, n, cols, stride}; }
  Tensor cols_from(int64_t c0, int64_t n) const { return {at(0, c0), dtype, rows, n, stride}; }
  bool is_dense() const { return stride == cols || rows <= 1; }
  size_t elem_bytes() const { return dtype == DType::kF32 ? 4 : 2; }
  void* at(int64_t r, int64_t c) const {
    return static_cast<uint8_t*>(data) + static_cast<size_t>(r * stride + c) * elem_bytes();
  }
  float* f32() const { return static_cast<float*>(data); }
};

// A placed f32 vector (a norm weight, a bias). data null: absent.
struct Vec {
  const float* data = nullptr;
  int64_t n = 0;
  explicit operator bool() const { return data != nullptr; }
};

// A matrix in host memory, as a model file maps it: rows x cols of dtype
// (any supported type, quantized included), rows row_stride bytes apart.
struct HostMatrix {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0, cols = 0;
  size_t row_stride = 0;
  // Rows are gathered (an embedding table, also when tied to the LM head):
  // a backend keeps them in their precision (never requantized, e.g. by
  // the CUDA backend's FP8 weights).
  bool gathered = false;
  // From an FP8 checkpoint (WeightView's fields of the same names): a
  // backend with FP8 weights places the matrix as FP8, from e4m3 /
  // e4m3_scales as they are when set (one scale per row), else by
  // quantizing `data`.
  bool fp8 = false;
  const uint8_t* e4m3 = nullptr;
  const float* e4m3_scales = nullptr;
};

// A weight matrix as a backend placed it: rows() x cols(). Opaque to
// families: `placed` is the backend's own record (CPU: views of the mapped
// parts; CUDA: one device matrix), valid while the Backend lives. A
// placement of several parts (q/k/v, gate/up) is one Weight whose rows are
// the parts' rows in order.
struct Weight {
  int64_t rows = 0, cols = 0;
  const void* placed = nullptr;
};

// A placed RoPE table (place_rope()); opaque as Weight.
struct Rope {
  int64_t rot_dim = 0;
  const void* placed = nullptr;
};

// What a calibration pass of q4a's widths (kKvQ4Alloc, backend/cpu/kv_alloc.h
// allocate_channel_bits) gathers of one KV layer (CPU rope_store_kv, from
// the f32 rows after RoPE, before any quantization), over one sequence
// whose positions arrive in order: query_energy[c] sums q_c^2 over every
// query and every query head of channel c's KV head (a q-only layer's
// queries too, when it reads this layer's KV: Gemma 4's KV sharing);
// block_range_sq[c] sums (max - min)^2 of K's channel c over each
// complete block of 32 positions (block 0 without position 0: the sink
// key is held on its own grid, quantize_chan_values' sequence_start).
// block_min / block_max: the running block's. Sized [width] by whoever
// attaches it.
struct KvCalibrationStats {
  std::vector<double> query_energy, block_range_sq;
  std::vector<float> block_min, block_max;
};

// One layer's paged K and V: position slot s (block s >> block_shift, row
// s & (block_size - 1)) of K at k + block * block_stride + row * row_bytes,
// of V likewise from v. row_bytes = n_head_kv * head_dim * dtype size
// (dtype F32 or F16). CUDA requires block_stride == row_bytes <<
// block_shift (one plane per layer); the CPU also takes its block-major
// pool (blocks of every layer interleaved, model/paged_kv_cache.h).
struct KvCacheView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::kF16;
  int32_t block_shift = 4;
  size_t block_stride = 0;
  size_t row_bytes = 0;
  // Quantized KV (model/kv_types.h; CUDA takes Q8_0, Q4_0, F8_E4M3 with V as K,
  // unrotated: cuda::kv_supported): V's type and row bytes
  // where V is stored apart from K (v_row_bytes 0: V as K, dtype and
  // row_bytes); *_rotated: that side is Walsh-Hadamard rotated per head.
  // dtype / v_dtype may then be BF16, GGML blocks (Q8_0, Q4_0, Q4_1,
  // Q5_0, Q5_1) or e4m3 bytes (kF8E4M3, core/e4m3.h), quantized by
  // rope_store_kv and read by attention in place.
  DType v_dtype = DType::kF16;
  size_t v_row_bytes = 0;
  bool k_rotated = false, v_rotated = false;
  // k4c (K in kKvQ4Chan, model/kv_types.h; the CPU only): each sequence's
  // K and V tail. Tail slot s's tail of this layer is at tail + s *
  // tail_stride: a KvTailHeader, then kKvChanTokens K rows, then as many V
  // rows, each a row of the layer's width in cpu::kKvChanTailType (q8_0; V
  // rotated when v_rotated). rope_store_kv keeps the step's rows (in the backend) and encodes
  // every block the step completes from the tail and those rows; attention
  // reads both, then moves each sequence's newest partial block into its
  // tail, unless AttentionOp::tail_read_later (a layer reading another
  // layer's KV reads the tail and step rows that layer left: the last
  // reader of the step moves it).
  uint8_t* tail = nullptr;
  size_t tail_stride = 0;
  // q4a (K in kKvQ4Alloc): the layer's widths [n_head_kv * head_dim], 0..8
  // bits per K channel (backend/cpu/kv_alloc.h); on CUDA its device widths
  // table (backend/cuda/kv_chan.h). Required for q4a, null otherwise.
  const uint8_t* k_widths = nullptr;
  // Non-null only during a calibration pass (CpuPagedModel::calibrate_kv,
  // CudaModelBase's): this layer's statistics, which rope_store_kv adds to.
  KvCalibrationStats* calibration = nullptr;

  DType v_type() const { return v_row_bytes ? v_dtype : dtype; }
  size_t v_bytes() const { return v_row_bytes ? v_row_bytes : row_bytes; }
  // K and V both F32 or both F16, unrotated: the original KV of every backend.
  bool plain() const {
    return (dtype == DType::kF32 || dtype == DType::kF16) && v_type() == dtype && !k_rotated && !v_rotated;
  }
};

// The head of one layer's tail of one sequence (k4c): the K and V rows of
// positions [group_start, group_start + n_rows) follow it (KvCacheView::tail).
struct KvTailHeader {
  int32_t group_start = 0;
  int32_t n_rows = 0;
  int32_t reserved[14] = {};  // 64 bytes: the rows stay aligned
};

inline constexpr int kMaxKvGroups = 2;

// A run of one sequence's query tokens that attention computes together
// (the CUDA prefill kernel's tile; layout of cuda::PrefillTile).
struct AttentionTile {
  int32_t seq = 0;
  int32_t t0 = 0;   // first token (flat index)
  int32_t n_q = 0;  // tokens
};

// How a backend wants a step's attention routed (attention_routing()):
// sequences of at most decode_max_q tokens go token by token into
// StepMetadata::decode_tokens, longer ones into tiles of tile_q tokens.
// needed false (the CPU): the backend reads the per-sequence arrays only.
struct AttentionRouting {
  bool needed = false;
  int32_t decode_max_q = 0;
  int32_t tile_q = 0;
};

// One sequence of a step as the recurrent layers (gated_delta()) see it:
// it starts from state id src (-1: zeros, position 0) and ends in state id
// dst; its snapshots are saves[save_begin, save_begin + n_saves), by
// ascending after_token. A step never saves into a state another of its
// sequences starts from.
struct RecurrentSeq {
  int32_t q_start = 0, q_len = 0;  // tokens [q_start, q_start + q_len) of the step
  int32_t src = -1, dst = 0;
  int32_t save_begin = 0, n_saves = 0;
};
// A copy of a sequence's state right after its token after_token (an index
// within its tokens of the step) into state id `state`.
struct RecurrentSave {
  int32_t after_token = 0;
  int32_t state = 0;
};

// One step's recurrent indices (the runtime's state pool fills them, in
// memory the backend addresses; the counts are read on the host). A CUDA
// decode graph's padding tokens are sequences of their own.
struct RecurrentStep {
  const RecurrentSeq* seqs = nullptr;  // [n_seqs]
  int32_t n_seqs = 0;
  const RecurrentSave* saves = nullptr;  // [n_saves]
  int32_t n_saves = 0;
  const int32_t* tok_seq = nullptr;  // [n_tokens]: each token's entry in seqs
  int64_t n_tokens = 0;
};

// One step's indices, filled by the runtime before the step's first op, in
// memory the backend addresses (host arrays on the CPU, one uploaded block
// on CUDA); the scalars are read on the host. Tokens of all sequences lie
// end to end: sequence s owns tokens [q_start[s], q_start[s] + q_len[s]),
// at positions kv_len[s] - q_len[s] ... kv_len[s] - 1.
struct StepMetadata {
  int32_t n_tokens = 0, n_seqs = 0, n_sample = 0;
  const int32_t* ids = nullptr;          // [n_tokens] token ids
  const int32_t* pos = nullptr;          // [n_tokens] positions
  const int32_t* seq_of = nullptr;       // [n_tokens] sequence of each token
  const int32_t* sample_rows = nullptr;  // [n_sample] tokens whose logits the step returns
  // Per sequence [n_seqs].
  const int32_t* q_start = nullptr;
  const int32_t* q_len = nullptr;
  const int32_t* kv_len = nullptr;       // tokens in the cache after the step
  const int32_t* decode_from = nullptr;  // BatchSeq::decode_from (model/batch.h); -1: by q_len
  const int32_t* table_start = nullptr;  // first entry of its block table in block_tables[g]
  const int32_t* kv_tail = nullptr;      // BatchSeq::kv_tail (k4c KV); null: none
  // Per KV group g: slots[g][t] = block * block_size + offset of token t;
  // block_tables[g]: every sequence's table end to end.
  const int32_t* slots[kMaxKvGroups] = {};
  const int32_t* block_tables[kMaxKvGroups] = {};
  // Attention routing, where attention_routing().needed.
  const int32_t* decode_tokens = nullptr;  // [n_decode]
  int32_t n_decode = 0;
  int32_t max_decode_len = 0;  // largest pos + 1 among the decode tokens
  // CUDA: the decode tokens' attention splits summed, rounded up to a power
  // of two (cuda::decode_work_bucket); 0: not given.
  int32_t decode_work = 0;
  const AttentionTile* tiles = nullptr;
  int32_t n_tiles = 0;
  // Hybrid models' recurrent layers.
  RecurrentStep recurrent;
};

enum class Glu { kSilu, kGeluTanh };

// rope_store_kv(): qkv [n_tokens, (n_head + 2 n_head_kv) * head_dim] F32
// (strided rows allowed): q heads, then k heads, then v heads. Per token:
// q and k heads RMS-normed over head_dim when q_norm / k_norm are set
// (weights norm_offset + w), then rotated by `rope` at the token's
// position, then K and V stored at the token's slot of kv_group in `kv`
// (converted to kv.dtype). q is rotated in place; the k and v columns of
// qkv are unspecified afterwards (the CPU rotates k in place, CUDA only
// stores it), so later ops read K and V from the cache.
// v_norm: V heads are RMS-normed over head_dim without a weight before the
// store (Gemma 4). n_head_kv 0: qkv holds q only, which is normed and
// rotated; nothing is stored (a layer reading another layer's KV, Gemma 4).
// pos_offset: the rotation is at pos[t] + pos_offset (q only: Gemma 4's
// assistant rotates its query one past the last key it reads).
struct RopeKvOp {
  Tensor qkv;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  Vec q_norm, k_norm;
  bool v_norm = false;
  float norm_eps = 1e-6f, norm_offset = 0.0f;
  Rope rope;
  KvCacheView kv;
  int kv_group = 0;
  int32_t pos_offset = 0;
};

// attention(): every query token t of the step (q row t: [n_head,
// head_dim] F32, strided rows allowed) over its sequence's keys j in [lo,
// pos[t]], lo = max(0, pos[t] - window + 1) when window > 0, else 0;
// score = scale * q.k, softcap > 0: softcap * tanh(score / softcap), then
// an f32 softmax. F16 KV rounds as llama.cpp (backend/cpu/attention_f16.h)
// on the CPU. out: [n_tokens, n_head * head_dim] in out.dtype.
// sinks [n_head] (gpt-oss; absent: none): head h's softmax denominator also
// holds exp(sinks[h]), a logit without a value (the CPU: F32 KV only; CUDA:
// every kernel, F32 and F16 KV).
struct AttentionOp {
  Tensor q, out;
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f, softcap = 0.0f;
  int32_t window = 0;
  KvCacheView kv;
  int kv_group = 0;
  Vec sinks;
  // k4c (KvCacheView::tail): a later layer of this step reads kv too
  // (Gemma 4's KV sharing), so the tails stay as the step found them; the
  // step's last reader of kv leaves this false and moves them.
  bool tail_read_later = false;
};

// gated_delta(): one Gated DeltaNet layer's core over the step (Qwen3.5 /
// Qwen3-Next; backend/cpu/gated_delta.h has the arithmetic). proj
// [n_tokens, >= conv_dim] F32, strided rows: q | k | v (conv_dim = 2
// n_k_heads dk + n_v_heads dv channels) from column 0, b and a (n_v_heads
// each) at b_col / a_col. Per sequence (step.recurrent): the depthwise
// causal conv1d (kernel conv_kernel, weight conv_w [conv_dim, K], inputs
// before the step from the src state's window) + SiLU over q|k|v; beta =
// sigmoid(b), g = neg_a * softplus(a + dt_bias); then per value head h
// (key head h / (n_v_heads / n_k_heads)) with q' = l2norm(q) / sqrt(dk),
// k' = l2norm(k): S = exp(g) S; S += k' (x) ((v - k'^T S) beta); core =
// q'^T S. The state of id s of this layer is at states + s * state_stride:
// its conv window [conv_dim, K-1] (oldest first), then S [n_v_heads, dk,
// dv], f32. mixed [n_tokens, conv_dim], g and beta [n_tokens, n_v_heads]
// are F32 scratch; proj's q|k|v columns are unspecified afterwards (the
// CPU convolves in place). Tokens of a sequence go strictly in order with
// the same arithmetic whatever the call, so a sequence's results do not
// depend on its step's split or neighbours.
struct GatedDeltaOp {
  Tensor proj;
  int64_t b_col = 0, a_col = 0;
  int32_t n_k_heads = 0, n_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 4;
  Vec conv_w, neg_a, dt_bias;
  float* states = nullptr;
  int64_t state_stride = 0;
  Tensor mixed, g, beta, core;

  int64_t key_dim() const { return int64_t{n_k_heads} * head_k_dim; }
  int64_t value_dim() const { return int64_t{n_v_heads} * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// attention_bidirectional(): every token t of the step attends to every
// token of its own sequence (both directions, no KV cache: encoders compute
// a sequence whole in one step): qkv [n_tokens, 3 n_head head_dim] F32 (q
// heads, then k heads, then v heads per row), score = scale * q.k, an f32
// softmax over the sequence's tokens; out [n_tokens, n_head head_dim] F32.
struct BidirectionalAttentionOp {
  Tensor qkv, out;
  int32_t n_head = 0, head_dim = 0;
  float scale = 1.0f;
};

// rope_store_latent(): multi-head latent attention's RoPE and KV store
// (model/kv_spec.h's LatentKvRow). Per token t: each head h's rope part of
// q, columns [h * q_head_dim + q_rope_col, + rope_dim), rotated in place by
// `rope` at the token's position; kv [n_tokens, kv_lora_rank + rope_dim]
// (kv_a_proj_with_mqa's output): the latent RMS-normed by kv_norm (eps),
// the rope key rotated, and the row [latent | rope key] stored at the
// token's slot of kv_group: its first kv_cache.row_bytes in K, the rest in V
// (zero padded), in kv_cache.dtype. q and kv F32, strided rows allowed; kv's
// columns are unspecified afterwards.
struct LatentKvOp {
  Tensor q, kv;
  int32_t n_head = 0, q_head_dim = 0, q_rope_col = 0;
  int32_t kv_lora_rank = 0, rope_dim = 0;
  Vec kv_norm;
  float norm_eps = 1e-6f;
  Rope rope;
  KvCacheView kv_cache;
  int kv_group = 0;
};

// latent_attention(): the absorbed form of multi-head latent attention.
// Every query token t and head h attends to its sequence's stored rows j
// in [0, pos[t]] (c_j the latent, r_j the rope key): score = scale *
// (q_latent[t, h] . c_j + q_rope[t, h] . r_j), an f32 softmax, out[t, h] =
// sum_j p_j c_j. q_latent [n_tokens, n_head * kv_lora_rank] F32 (the nope
// query absorbed through kv_b_proj's K part), q_rope head h at columns
// [h * q_rope_step, + rope_dim) F32, out [n_tokens, n_head * kv_lora_rank]
// F32; strided rows allowed. All heads read the same row per key.
// selected (DeepSeek sparse attention; null: every key): token t attends
// only to the n_selected[t] keys selected[t * selected_stride + i], in
// ascending positions, all <= pos[t] (lightning_index() writes them).
struct LatentAttentionOp {
  Tensor q_latent, q_rope, out;
  int64_t q_rope_step = 0;
  int32_t n_head = 0, kv_lora_rank = 0, rope_dim = 0;
  float scale = 1.0f;
  KvCacheView kv;
  int kv_group = 0;
  const int32_t* selected = nullptr;
  const int32_t* n_selected = nullptr;
  int32_t selected_stride = 0;
};

// lightning_index(): DeepSeek sparse attention's indexer (GLM-5,
// glm_moe_dsa). First, per token t: its key k[t] [head_dim] (k_norm
// already applied) has its first rope_dim dims rotated by `rope` at pos[t]
// and is stored at columns [key_col, key_col + head_dim) of the token's
// latent row in kv (LatentKvRow's index_dim columns: the row's first
// kv.row_bytes in K, the rest in V), and every query head q[t, h] (columns
// [h head_dim, + head_dim)) is rotated alike in place. Then per token t,
// over its sequence's stored keys j in [0, pos[t]]:
//   score_j = sum_h (weight_scale w[t, h]) relu(score_scale q[t, h] . k_j)
// and the min(topk, pos[t] + 1) best keys go to selected[t topk, ...] in
// ascending positions, their count to n_selected[t]. Ties of equal scores
// go to the later key, so a selection is one function of the scores (a
// total order), whatever the algorithm or the step's split. q, k, w
// [n_tokens, n_head] F32, strided rows allowed; selected [n_tokens, topk]
// and n_selected [n_tokens] in memory the backend addresses.
struct LightningIndexOp {
  Tensor q, k, w;
  int32_t n_head = 0, head_dim = 0, rope_dim = 0;
  float score_scale = 1.0f, weight_scale = 1.0f;
  Rope rope;
  int32_t key_col = 0;
  int32_t topk = 0;
  int32_t* selected = nullptr;
  int32_t* n_selected = nullptr;
  KvCacheView kv;
  int kv_group = 0;
};

// Gemma 4's assistant's head over ordered embeddings (its
// use_ordered_embeddings): the vocabulary is n_centroids groups of V / C
// tokens, group c = token_ordering[c V/C, (c + 1) V/C). Per row r:
//   the top_k groups by scores[r] (descending; equal scores: the lower
//   group first), their tokens picked[r] [top_k V/C] group by group;
//   logits[r, t] = hidden[r] . lm_head[t] (f32 products of the rows'
//   f32 values) for the picked tokens, every other token the smallest of
//   those minus 1 (a row's logits do not depend on the other rows).
// hidden [n, E] F32, scores [n, C] F32 (the centroids' logits), logits
// [n, V] F32, all dense; lm_head [V, E] placed gathered (F32 / F16 /
// BF16 on CUDA); token_ordering [V], picked and dots [n, top_k V/C]
// (scratch) in memory the backend addresses.
struct OrderedLogitsOp {
  Tensor hidden, scores, logits;
  Weight lm_head;
  const int32_t* token_ordering = nullptr;
  int32_t n_centroids = 0, top_k = 0;
  int32_t* picked = nullptr;
  float* dots = nullptr;

  int64_t n_picked() const { return int64_t{top_k} * (logits.cols / n_centroids); }
};

// --- Mixtures of experts ---------------------------------------------------
// One MoE layer's routing and experts (model/moe.h reads them from a config;
// backend/cpu/moe.h has the reference arithmetic):
//   probs  = softmax(router x)                       [n_expert], f32
//   top-k  = the n_expert_used largest probs (ties: lower expert id first),
//            renormalised to sum to 1 when norm_topk_prob, then scaled by
//            HostMoe::expert_scale (when given)
//   (sigmoid_scores: probs = sigmoid(router x); the choice adds the score
//   bias and, with n_group > 1, keeps only the experts of the topk_group
//   groups whose two best choice scores sum highest, the others scored 0 as
//   transformers masks them; the weights are the chosen probs, renormalised
//   (+1e-20) and times routed_scaling_factor)
//   out    = sum over the token's experts e, in increasing e, of
//            w_e * down_e(act(gate_e x) * up_e x)
//          + sigmoid(shared_gate . x) * shared(x)   (a shared expert; without
//                                                    shared_gate: + shared(x))
struct MoeParams {
  int64_t n_embd = 0;
  int64_t n_expert = 0;        // routed experts
  int64_t n_expert_used = 0;   // top-k per token, in [1, n_expert]
  int64_t n_ff = 0;            // each routed expert's intermediate size
  bool norm_topk_prob = true;  // renormalise the top-k probabilities
  int64_t n_ff_shared = 0;     // the shared expert's intermediate size; 0: none
  // gpt-oss: the top-k of the router's logits (the router's bias included),
  // then a softmax over those k only (norm_topk_prob does not apply).
  bool softmax_after_topk = false;
  // gpt-oss's clamped SwiGLU when swiglu_limit > 0: with g = min(gate,
  // limit) and u = clamp(up, -limit, limit), act = g * sigmoid(alpha g) *
  // (u + 1). 0: silu(gate) * up.
  float swiglu_limit = 0.0f;
  float swiglu_alpha = 1.702f;
  bool gelu_tanh = false;  // experts are GeGLU: gelu_tanh(gate x) * up x (Gemma 4); else SwiGLU
  // DeepSeek-V3 / GLM-4.5 routing; the defaults keep the softmax router.
  bool sigmoid_scores = false;         // scores = sigmoid(router x), each token's weights its chosen scores
  int64_t n_group = 1;                 // experts in n_group equal groups; only the topk_group groups with
  int64_t topk_group = 1;              // the largest sums of their top-2 choice scores are eligible
  float routed_scaling_factor = 1.0f;  // multiplies the routed experts' weights (after norm_topk_prob)
  bool shared_gate = true;             // the shared expert's sigmoid gate (Qwen3-Next); false: weight 1
};

// One expert FFN in host memory: gate, up [n_ff, n_embd], down [n_embd,
// n_ff]; a bias (f32, one per row) or null.
struct HostExpert {
  HostMatrix gate, up, down;
  const float* gate_bias = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
};

// One MoE layer as the model files hold it (Backend::place_moe). The
// vectors are copied at placement; the matrices as place() takes them.
struct HostMoe {
  MoeParams p;
  HostMatrix router;                    // [n_expert, n_embd]
  const float* router_bias = nullptr;   // [n_expert] or null
  std::vector<HostExpert> experts;      // n_expert
  std::optional<HostExpert> shared;     // with p.n_ff_shared > 0
  HostMatrix shared_gate;               // [1, n_embd] with a shared expert and p.shared_gate
  const float* expert_scale = nullptr;  // [n_expert]: times each chosen expert's weight (Gemma 4), or null
  const float* score_bias = nullptr;    // [n_expert]: added for the choice only (DeepSeek), or null
};

// A placed MoE layer; opaque as Weight.
struct MoeWeight {
  MoeParams p;
  const void* placed = nullptr;
  explicit operator bool() const { return placed != nullptr; }
};

// What reserve() sizes scratch for: steps of up to max_tokens tokens with
// attention of up to n_head heads of head_dim. Two placed weights may be
// named because steps use them less: `embedding`, only gathered (embed()),
// and `lm_head`, multiplied by at most max_head_tokens rows (CUDA then
// dequantizes a large quantized head in row chunks instead of whole); null:
// every placed weight may be any matmul's.
struct StepLimits {
  int64_t max_tokens = 0;
  int32_t n_head = 0, head_dim = 0;
  const Weight* embedding = nullptr;
  const Weight* lm_head = nullptr;
  int64_t max_head_tokens = 0;
  // matmul_heads(): the widest per-head input (w.cols) it is called with;
  // 0: the model never calls it.
  int64_t max_head_cols = 0;
  // lightning_index(): the most keys a token scores (the context length);
  // 0: the model never calls it.
  int64_t max_index_keys = 0;
};

// Memory from allocate(): freed when the Buffer goes (before its Backend).
class Buffer {
 public:
  using Free = void (*)(void*);
  Buffer() = default;
  Buffer(void* data, size_t bytes, Free free) : data_(data), bytes_(bytes), free_(free) {}
  Buffer(Buffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_), free_(o.free_) { o.data_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = o.data_;
      bytes_ = o.bytes_;
      free_ = o.free_;
      o.data_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void reset() {
    if (data_ && free_) free_(data_);
    data_ = nullptr;
  }
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Free free_ = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // The dtype of matmul inputs (see the contracts above).
  virtual DType act_dtype() const = 0;
  // How StepMetadata's attention routing must be filled (route_attention()).
  virtual AttentionRouting attention_routing(DType kv_dtype, int32_t head_dim) const = 0;

  // --- Planning: may allocate; never inside a step. -------------------------

  // Places a weight: the parts' rows in order (q/k/v, gate/up), every part
  // with the same cols. The CPU keeps views of the host data (which must
  // outlive the Backend: a mapped file); CUDA copies it into device memory,
  // quantized blocks kept where its kernels read them, else converted to
  // act_dtype(). Errors name `what`.
  virtual Result<Weight> place(const HostMatrix* parts, int n_parts, const std::string& what) = 0;
  // An f32 vector of n (norm weights, biases), copied.
  virtual Result<Vec> place_vector(const float* host, int64_t n, const std::string& what) = 0;
  virtual Result<Rope> place_rope(const RopeTable& table) = 0;
  // Places a whole model: `place_all` makes every place*() call of it. The
  // CPU calls it once; CUDA twice (a sizing pass, then into one device
  // buffer), so place_all must make the same calls both times and keep
  // only the last pass's results (the first pass's are not valid).
  virtual Status place_model(const std::function<Status()>& place_all) { return place_all(); }
  // Sizes the scratch every op needs for steps within `limits` against the
  // weights placed so far.
  virtual Status reserve(const StepLimits& limits) = 0;

  // Memory the ops address (zeroed); and copies between it and the host.
  // copy_out() waits for every op before it.
  virtual Result<Buffer> allocate(size_t bytes, const std::string& what) = 0;
  virtual Status copy_in(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status copy_out(void* host_dst, const void* src, size_t bytes) = 0;

  // --- The step's ops. -------------------------------------------------------

  // out[i, :] = row ids[i] of table (dequantized). out: [n, table.cols] F32.
  virtual void embed(const Weight& table, const int32_t* ids, int64_t n, Tensor out) = 0;
  // out[r, :] = x[xr, :] / rms(x[xr, :]) * (w_offset + w) with xr = row_ids
  // ? row_ids[r] : r, for r < out.rows; in out.dtype. x: F32, strided rows
  // allowed. eps is added to the mean square (ggml). out may alias x (F32,
  // no row_ids).
  virtual void rms_norm(Tensor x, const int32_t* row_ids, Vec w, float eps, float w_offset, Tensor out) = 0;
  // y[t, r] (+)= sum_c W[r, c] x[t, c] (+ bias[r]): x [n, w.cols] in
  // act_dtype(), y [n, w.rows] F32; accumulate adds into y (o/down into the
  // residual stream). With a bias the CPU adds it to the product before the
  // product goes into y (a Linear's rounding), CUDA after. A quantized W
  // pairs with x as llama.cpp does on the CPU (x quantized to the partner
  // type), so GGUF models give llama.cpp's logits.
  virtual Status matmul(const Weight& w, Tensor x, Tensor y, bool accumulate, Vec bias = {}) = 0;
  // y[r, :] += b over y [rows, b.n] F32.
  virtual void add_bias(Tensor y, Vec b) = 0;
  virtual void rope_store_kv(const RopeKvOp& op, const StepMetadata& step) = 0;
  virtual void attention(const AttentionOp& op, const StepMetadata& step) = 0;
  // gate_up [rows, 2 F] F32 (gate columns [0, F), up [F, 2F)); out[r, i] =
  // act(gate[r, i]) * up[r, i], [rows, F] in out.dtype. kSilu: gate *
  // sigmoid(gate); kGeluTanh: the tanh approximation of GELU (GeGLU).
  virtual void glu(Glu kind, Tensor gate_up, Tensor out) = 0;
  // The dense MLP's first half: out = glu(kind, x . w_gate_up^T), i.e.
  // matmul(w_gate_up, x, gate_up, false) then glu(kind, gate_up, out), which
  // is what this default does. gate_up [x.rows, w_gate_up.rows] F32 is
  // scratch (its contents are unspecified after the call), out as glu()'s.
  // CUDA overrides it for FP8 weights on the tensor-core GEMM path, where
  // the GEMM's per-token and per-row scales go into the GLU's one pass
  // (fp8_matmul_glu in backend/cuda/fp8.h: the same bits as the default),
  // and, outside batch-invariant mode, for dense BF16 weights at more than
  // 8 tokens, where gate/up is written in bf16 (one rounding more than the
  // default) and gate_up holds those bytes afterwards.
  virtual Status matmul_glu(const Weight& w_gate_up, Tensor x, Glu kind, Tensor gate_up, Tensor out) {
    RILL_TRY(matmul(w_gate_up, x, gate_up, false));
    glu(kind, gate_up, out);
    return Status::Ok();
  }
  // A layer's pre-norm and the matmul that reads it: rms_norm(x, nullptr,
  // w_norm, eps, w_offset, h) then matmul(w, h, y, accumulate, bias)
  // (norm_matmul_glu: matmul_glu(w, h, kind, gate_up, out)); h holds the
  // normed rows afterwards either way. A backend may prepare in the norm's
  // pass what the matmul makes of h: CUDA quantizes h for FP8 weights'
  // tensor-core GEMM there (rms_norm_fp8 in backend/cuda/ops.h: the same
  // bits as the default, one kernel less).
  virtual Status norm_matmul(Tensor x, Vec w_norm, float eps, float w_offset, Tensor h, const Weight& w, Tensor y,
                             bool accumulate, Vec bias = {}) {
    rms_norm(x, nullptr, w_norm, eps, w_offset, h);
    return matmul(w, h, y, accumulate, bias);
  }
  virtual Status norm_matmul_glu(Tensor x, Vec w_norm, float eps, float w_offset, Tensor h, const Weight& w_gate_up,
                                 Glu kind, Tensor gate_up, Tensor out) {
    rms_norm(x, nullptr, w_norm, eps, w_offset, h);
    return matmul_glu(w_gate_up, h, kind, gate_up, out);
  }
  // x = cap * tanh(x / cap) (final logit softcapping); x = x * s (Gemma's
  // embedding scale). x F32.
  virtual void softcap(Tensor x, float cap) = 0;
  virtual void scale(Tensor x, float s) = 0;
  // Gemma's sandwich norm, fused with the next pre-norm, per row r:
  //   x[r] += rms_norm(y[r]) * (w_offset + w_post)
  //   out[r] = rms_norm(x[r]) * (w_offset + w_next)    in out.dtype
  // y, x F32 [rows, dim]; y is scratch (its contents are unspecified after
  // the call). w_next absent: only the first line (out unused).
  virtual void post_norm_add(Tensor y, Vec w_post, Tensor x, Vec w_next, float eps, float w_offset, Tensor out) = 0;

  // --- Mixtures of experts. A Backend without them keeps these defaults:
  // place_moe() refuses, so a family refuses the model at load. --------------

  // Places one MoE layer (the matrices as place() would, every vector
  // copied). Errors name `what`, also for options this Backend does not
  // run (CUDA: see backend/cuda/cuda_backend.cpp).
  virtual Result<MoeWeight> place_moe(const HostMoe& layer, const std::string& what) {
    (void)layer;
    return Error{what + ": the " + std::string(name()) + " backend has no mixture-of-experts ops"};
  }
  // out[t] (+)= MoE(in[t]) for the step's tokens (MoeParams), the router
  // reading router_in[t] (Gemma 4 routes its own norm of the residual;
  // otherwise router_in is in). router_in, in [n, n_embd] in act_dtype(),
  // out [n, n_embd] F32, all dense; out aliases neither input. accumulate
  // adds into out (the residual stream), else overwrites it. The step is
  // read for its attention routing only (CUDA: a step without prefill
  // tiles may be captured in a graph, so its MoE routes on the device). A
  // token's result does not depend on the other tokens of the step (CUDA:
  // f32 weights, or batch-invariant mode). reserve() sizes the scratch for
  // the layers placed before it.
  virtual Status moe_ffn(const MoeWeight& w, Tensor router_in, Tensor in, Tensor out, bool accumulate,
                         const StepMetadata& step) {
    (void)w, (void)router_in, (void)in, (void)out, (void)accumulate, (void)step;
    assert(false && "moe_ffn: this Backend has no MoE ops");
    return Error{"moe_ffn: this Backend has no MoE ops"};
  }

  // --- Gemma 4. A Backend without these keeps the asserting defaults and
  // says so in has_gemma4_ops(); the Gemma family refuses Gemma 4 files on
  // it at load. ----------------------------------------------------------------
  virtual bool has_gemma4_ops() const { return false; }
  // glu() with gate and up in separate views: out[r, i] = act(gate[r, i]) *
  // up[r, i] over [rows, F]; gate and up F32, strided rows allowed; out in
  // out.dtype (Gemma 4's per-layer input gate).
  virtual void glu_split(Glu kind, Tensor gate, Tensor up, Tensor out) {
    (void)kind, (void)gate, (void)up, (void)out;
    assert(false && "glu_split: this Backend has no Gemma 4 ops");
  }
  // out = x converted to out.dtype, [rows, cols]; x F32; both with strided
  // rows allowed (the residual stream as a matmul input; Gemma 4's
  // assistant writes the two halves of its input's rows).
  virtual void convert(Tensor x, Tensor out) {
    (void)x, (void)out;
    assert(false && "convert: this Backend has no Gemma 4 ops");
  }
  // Gemma 4's assistant's head over ordered embeddings (OrderedLogitsOp).
  virtual void ordered_logits(const OrderedLogitsOp& op) {
    (void)op;
    assert(false && "ordered_logits: this Backend has no Gemma 4 ops");
  }

  // --- Hybrid (gated DeltaNet) models. ---------------------------------------

  virtual void gated_delta(const GatedDeltaOp& op, const StepMetadata& step) = 0;
  // The DeltaNet's gated RMSNorm, per row r and head h of head_dim:
  //   out[r, h] = rms_norm(core[r, h]) * w * silu(z[r, h])    in out.dtype
  // core [rows, n_heads * head_dim] F32 (scratch: unspecified afterwards), z
  // F32 strided rows allowed, w [head_dim] (a plain weight). tiled_k_heads
  // > 0: out's heads go in the tiled order of a qwen35 GGUF out_proj (head
  // g*r + j written at j*tiled_k_heads + g, r = n_heads / tiled_k_heads;
  // the CPU only).
  virtual void gated_rms_norm(Tensor core, Tensor z, Vec w, int32_t head_dim, float eps, Tensor out,
                              int32_t tiled_k_heads = 0) = 0;
  // The gated attention's output gate: out = x * sigmoid(gate) per element,
  // x F32 dense, gate F32 strided rows allowed, out in out.dtype.
  virtual void sigmoid_mul(Tensor x, Tensor gate, Tensor out) = 0;

  // --- Encoder ops (BERT). A Backend without them keeps these defaults and
  // says so in has_encoder_ops(); families check it at load and refuse
  // cleanly, so the asserting defaults are never reached. ---------------------
  virtual bool has_encoder_ops() const { return false; }
  // out[r] = (x[r] - mean) / sqrt(var + eps) * w + b over each row (biased
  // variance: LayerNorm), in out.dtype. x F32; out may alias x; strided
  // rows allowed (GLM-5's indexer key norm).
  virtual void layer_norm(Tensor x, Vec w, Vec b, float eps, Tensor out) {
    (void)x, (void)w, (void)b, (void)eps, (void)out;
    assert(false && "layer_norm: this Backend has no encoder ops");
  }
  // y += x elementwise over [rows, cols] F32 (BERT's position embeddings).
  virtual void add(Tensor y, Tensor x) {
    (void)y, (void)x;
    assert(false && "add: this Backend has no encoder ops");
  }
  // x = x / 2 * (1 + erf(x / sqrt(2))) in place (GELU, exact form). x F32.
  virtual void gelu_erf(Tensor x) {
    (void)x;
    assert(false && "gelu_erf: this Backend has no encoder ops");
  }
  virtual void attention_bidirectional(const BidirectionalAttentionOp& op, const StepMetadata& step) {
    (void)op, (void)step;
    assert(false && "attention_bidirectional: this Backend has no encoder ops");
  }

  // --- Multi-head latent attention (DeepSeek-V3, MiniCPM3, GLM-5). A Backend
  // without these ops keeps the asserting defaults and says so in
  // has_mla_ops(); the MLA family refuses it at load. -------------------------
  virtual bool has_mla_ops() const { return false; }
  // Per-head products: for every head h < n_heads, y[t, h * y_step + r] =
  // sum_c W[h * R + r, c] x[t, h * x_step + c], r < R = w.rows / n_heads, c
  // < w.cols (the absorbed MLA's q_nope -> latent and latent -> v). x, y
  // F32, strided rows allowed; w placed as one part; reserve()'s
  // StepLimits::max_head_cols at least w.cols.
  virtual void matmul_heads(const Weight& w, int32_t n_heads, Tensor x, int64_t x_step, Tensor y, int64_t y_step) {
    (void)w, (void)n_heads, (void)x, (void)x_step, (void)y, (void)y_step;
    assert(false && "matmul_heads: this Backend has no MLA ops");
  }
  virtual void rope_store_latent(const LatentKvOp& op, const StepMetadata& step) {
    (void)op, (void)step;
    assert(false && "rope_store_latent: this Backend has no MLA ops");
  }
  virtual void latent_attention(const LatentAttentionOp& op, const StepMetadata& step) {
    (void)op, (void)step;
    assert(false && "latent_attention: this Backend has no MLA ops");
  }
  // DeepSeek sparse attention (GLM-5); has_mla_ops() covers it and the
  // layer_norm() of its keys. reserve()'s StepLimits::max_index_keys at
  // least the longest context.
  virtual void lightning_index(const LightningIndexOp& op, const StepMetadata& step) {
    (void)op, (void)step;
    assert(false && "lightning_index: this Backend has no MLA ops");
  }
};

// The CPU Backend (backend/cpu/cpu_backend.cpp): n_threads <= 0 means one
// thread per core.
std::unique_ptr<Backend> make_cpu_backend(int n_threads);

// Fills the attention routing of a step (StepMetadata::decode_tokens,
// n_decode, max_decode_len, tiles, n_tiles) from its per-sequence host
// arrays, as `r` asks: decode_tokens and tiles need n_tokens entries each;
// max_decode_len is the largest kv_len among decode sequences. The runtime
// uploads the result with the rest of the metadata.
struct RoutedAttention {
  int32_t n_decode = 0, max_decode_len = 0, n_tiles = 0;
};
RoutedAttention route_attention(const AttentionRouting& r, int32_t n_seqs, const int32_t* q_start, const int32_t* q_len,
                                const int32_t* kv_len, int32_t* decode_tokens, AttentionTile* tiles);

}  // namespace rill
