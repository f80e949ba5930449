#pragma once
// Model: one forward step over a flat Batch. Implementations live in
// model/arch/ (one file per family) and are chosen by the registry.
//
// The model owns its KV storage: a pool of n_kv_blocks() blocks of
// kv_block_size() tokens for every layer of every attention group of
// kv_spec(). Which sequence owns which block is the caller's business (the
// engine's KvManager, or a fixed carving via slot_block_table()); the model
// only reads and writes the blocks the Batch's tables name.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "core/dtype.h"
#include "core/result.h"
#include "loader/model_config.h"
#include "model/batch.h"
#include "model/kv_spec.h"
#include "model/kv_types.h"

namespace rill {

// Where the forward pass runs. kCuda needs a build with RILL_CUDA and a
// device; otherwise model creation fails with a message saying so.
enum class Device { kCpu, kCuda };

// Weights quantized at load (--quantize). kFp8: every float matrix except
// embedding tables as e4m3 with a scale per row (kCuda only: the CUDA
// backend's FP8 weights, backend/cuda/fp8.h); quantized GGUF matrices and
// the CUDA MoE experts stay as they are.
enum class WeightQuantization { kNone, kFp8 };

struct ModelOptions {
  Device device = Device::kCpu;
  int n_threads = 0;           // 0: one per core
  int64_t n_ctx = 0;           // longest sequence; 0: the model's max_position
  int max_batch_tokens = 512;  // largest Batch::n_tokens() forward() accepts
  int max_batch_seqs = 0;      // most sequences (and sample rows) per Batch; 0: max_batch_tokens
  int32_t kv_block_size = 16;  // tokens per KV block, a power of two
  // KV pool size: kv_cache_bytes when > 0, else n_kv_slots whole contexts.
  int64_t kv_cache_bytes = 0;
  int n_kv_slots = 1;
  // KV storage types per layer and side (model/kv_types.h); empty: the
  // model's own (f16, f32 for f32 checkpoints). Backends that cannot store
  // a type refuse it at load.
  KvTypeOptions kv_types;
  // kCuda only: when > 0 and kv_cache_bytes == 0, the KV pool takes what is
  // left of this fraction of device memory after weights and activations.
  double gpu_memory_fraction = 0;
  // Models with recurrent layers: checkpoint slots of recurrent state (each
  // as large as a live state, see Model::state_bytes()) for prefix caching;
  // -1: as many as live state slots; 0: no checkpoints (no hybrid prefix reuse).
  int n_state_checkpoints = -1;
  // Models with recurrent layers under speculative decoding: verify states
  // per live slot (the state after each verified position but the last, so
  // a rejected draft rolls back; kv/state_pool.h), checkpoint ids after the
  // n_state_checkpoints ones. The engine needs its --spec-tokens of them.
  int n_spec_states = 0;
  // The most requests that run at once, when > 0 (the engine's
  // --max-running): recurrent models' live state slots and k4c's KV tail
  // slots; else max_batch_seqs (which speculation raises to cover every
  // draft's logit row, not more sequences).
  int n_state_slots = 0;
  // Tensor parallelism: the model split over this many ranks (see
  // model/tensor_split.h), each holding its share of the weights and KV
  // heads. kCpu: simulated ranks in one process (SimulatedGroup), the
  // reference the device runs are held to; kCuda: one GPU per rank over
  // NCCL. Implementations without it refuse values above 1.
  int tensor_parallel = 1;
  // kCuda only: batch-invariant mode (CudaModelBase::batch_invariant_ says
  // what it guarantees): a token's logits do not depend on the other tokens
  // of its step nor on its prompt's chunking, at some cost in speed. The
  // CPU models are batch invariant always and ignore it.
  bool batch_invariant = false;
  // kCuda only: decode steps replayed from CUDA graphs (CudaModelBase).
  // Off runs the same kernels eagerly, so numerics do not change; for
  // profilers that serialize kernels and for locating a fault in a
  // captured step (bench_cuda --graphs 0).
  bool cuda_graphs = true;
  // kCuda only: forward_sample draws on the device (the host Sampler's
  // rule: the same token for the same logits, so numerics do not change).
  // Off: the model offers no forward_sample and sampled rows go to the host
  // as logits (--host-sampling; benchmarks compare the two).
  bool cuda_device_sampling = true;
  WeightQuantization quantize = WeightQuantization::kNone;
  // Bind the files' first multi-token-prediction layer (loader/mtp_layers.h)
  // for forward_mtp; its KV rows are one more layer in the pool. Files
  // without one, and runtimes that do not run MTP layers, are refused.
  bool mtp = false;
  // Gemma 4 targets (gemma.cpu and gemma.cuda): the directory of a Gemma 4 assistant
  // checkpoint (gemma4_assistant, model/arch/gemma4_assistant.h), bound as
  // the model's MTP head: n_mtp_layers() is its layer count, forward_mtp
  // runs it (see there). Checked against the target at load (errors name
  // both); other families leave it unbound, which Engine::load refuses.
  std::string gemma4_assistant;
};

// How a model turns a sequence's last hidden states into one embedding
// (Model::embedding()): as its sentence-transformers config declares
// (modules.json: a Pooling module, then optionally Normalize), or the GGUF
// pooling_type. kNone: the model declares no pooling and serves no
// embeddings.
struct EmbeddingSpec {
  enum class Pooling { kNone, kMean, kCls, kLast };
  Pooling pooling = Pooling::kNone;
  bool normalize = false;    // L2-normalized after pooling
  int64_t n_dims = 0;        // the embedding's width
  bool truncatable = false;  // a prefix of the vector is itself an embedding (Matryoshka)
  // The encoder attends both ways: a sequence is computed whole in one step
  // and its KV is never reused (no prefix cache, no chunking).
  bool bidirectional = false;
};
const char* pooling_name(EmbeddingSpec::Pooling p);

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual int64_t n_vocab() const = 0;
  virtual int64_t n_ctx() const = 0;
  virtual int max_batch_tokens() const = 0;
  virtual int max_batch_seqs() const = 0;

  // The KV layout: one entry per layer group (see model/kv_spec.h).
  virtual const KvSpec& kv_spec() const = 0;
  virtual int32_t kv_block_size() const = 0;
  virtual int32_t n_kv_blocks() const = 0;
  // Bytes of KV one token takes across all layers (for sizing and stats).
  virtual size_t kv_bytes_per_token() const = 0;

  // Recurrent state (models with a kRecurrent group; 0 otherwise): live
  // slots (at least max(max_batch_seqs, n_kv_slots), Batch::state_slot),
  // checkpoint slots (Batch::state_restore / state_saves) and the bytes of
  // one state (every recurrent layer's conv + recurrent state).
  virtual int32_t n_state_slots() const { return 0; }
  virtual int32_t n_state_checkpoints() const { return 0; }  // the verify states included
  virtual int32_t n_spec_states() const { return 0; }        // per live slot (ModelOptions::n_spec_states)
  virtual size_t state_bytes() const { return 0; }

  // KV tails (models whose KV types keep the keys and values of each
  // sequence's newest partial block in q8_0, k4c: model/kv_tails.h; 0
  // otherwise): slots (Batch::seqs[s].kv_tail: max(n_state_slots or else
  // max_batch_seqs, n_kv_slots) when the options set either, as the engine
  // does, else n_kv_slots) and the bytes of all of them. A sequence with a tail continues only at
  // a multiple of the KV block size or where its tail's last step ended
  // (forward() refuses other steps).
  virtual int32_t n_kv_tail_slots() const { return 0; }
  virtual size_t kv_tail_bytes() const { return 0; }

  // Computes the batch and writes one row of n_vocab logits per sample row:
  // logits [batch.sample_rows.size(), n_vocab]. Requires every sequence's
  // positions to continue its cache (KV for [0, pos0) present in the blocks
  // its table names) and n_tokens() <= max_batch_tokens(). Tokens of one
  // step never depend on the other sequences of the batch (batch
  // invariance). Per step this allocates nothing.
  virtual Status forward(const Batch& batch, float* logits) = 0;

  // Embeddings: the model's pooling (kNone: it serves none), and forward()
  // that also writes each Batch::pool_seqs sequence's pooled embedding:
  // pooled [pool_seqs.size(), embedding().n_dims]. Requires every pooled
  // sequence to be computed whole in this batch (q_len == kv_len).
  virtual EmbeddingSpec embedding() const { return {}; }
  virtual Status forward_pooled(const Batch& batch, float* logits, float* pooled) {
    (void)batch, (void)logits, (void)pooled;
    return Error{"this model declares no pooling and computes no embeddings"};
  }

  // forward() followed by a greedy pick per sample row, done where the model
  // runs so that only ids[sample_rows.size()] cross to the host (argmax,
  // lowest index on ties, as the CPU sampler). Rows with a token mask
  // (`masks`, backend/sampling.h) pick as the host Sampler does under that
  // mask: the argmax of the allowed logits. Optional: models that do not
  // offer it return an error and callers sample from forward()'s logits.
  virtual bool has_forward_greedy() const { return false; }
  virtual Status forward_greedy(const Batch& batch, const TokenMasks& masks, int32_t* ids) {
    (void)batch, (void)masks, (void)ids;
    return Error{"this model has no forward_greedy; sample from forward()'s logits"};
  }

  // forward() followed by one draw per sample row under rows[i] (the rule
  // of backend/sampling.h: the host Sampler's, same token for the same
  // logits, parameters, token mask and (seed, counter)), done where the
  // model runs so that only ids[sample_rows.size()] cross to the host. Rows
  // whose draw is an argmax behave as in forward_greedy. Optional, like
  // forward_greedy.
  virtual bool has_forward_sample() const { return false; }
  virtual Status forward_sample(const Batch& batch, const DeviceSamplingParams* rows, const TokenMasks& masks,
                                int32_t* ids) {
    (void)batch, (void)rows, (void)masks, (void)ids;
    return Error{"this model has no forward_sample; sample from forward()'s logits"};
  }

  // Multi-token prediction (ModelOptions::mtp): the MTP layers bound (0
  // without), forward() that also writes every token's hidden state after
  // the final norm (the MTP layer's input h_i): hidden [n_tokens, n_embd],
  // and the MTP head: batch token j is t_{p+1} at batch position p, with
  // hidden row j the model's h_p (forward_hidden's row for position p);
  // writes the MTP layer's KV rows of those positions into the blocks the
  // batch's tables name (the pool's MTP layer, beside the model's layers)
  // and the MTP head's logits [n_sample, n_vocab]: its guess of t_{p+2}.
  // The same preconditions as forward(); the MTP rows of positions before
  // the batch's must have been computed by forward_mtp. mtp_hidden (may be
  // null) receives every token's MTP layer output [n_tokens, n_embd] (the
  // residual stream before shared_head's norm for DeepSeek and GLM, after
  // mtp.norm for Qwen3-Next: model/mtp_head.h): a chained draft (the guess
  // of t_{p+3}) feeds it back as the hidden row of position p + 1, with
  // the first guess as its token (one MTP layer reused, as vLLM and
  // SGLang chain them).
  // Gemma 4's assistant (ModelOptions::gemma4_assistant) runs through the
  // same two calls: forward_mtp's token j (t_{p+1} at batch position p,
  // hidden row h_p) is rotated at p + 1 and attends to the target's own KV
  // of positions up to p; it writes no KV, and mtp_hidden is its
  // post_projection [n_tokens, n_embd], which a chained draft feeds back at
  // the same position p with the guess as its token
  // (engine/assistant_speculator.h).
  virtual int32_t n_mtp_layers() const { return 0; }
  // Where the MTP head came from: empty for the checkpoint's own layers
  // (ModelOptions::mtp), the assistant's path for Gemma 4's assistant, so a
  // speculator refuses a head that is not the one its flag names.
  virtual std::string mtp_head_source() const { return {}; }
  virtual Status forward_hidden(const Batch& batch, float* logits, float* hidden) {
    (void)batch, (void)logits, (void)hidden;
    return Error{"this model does not export its hidden states"};
  }
  virtual Status forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) {
    (void)batch, (void)hidden, (void)logits, (void)mtp_hidden;
    return Error{"this model runs no multi-token-prediction layers"};
  }

  // KV export and import for the prefix cache's RAM and disk tiers. One
  // entry per layer that keeps KV, in layer order; empty when the model
  // does not support it (the tiers then stay off).
  struct KvLayer {
    int32_t group = 0;  // its kv_spec() group
    DType dtype = DType::kF16;
    size_t row_bytes = 0;  // one token's K (or V) row of this layer
    // Quantized KV with V in another type than K (model/kv_types.h, e.g.
    // k4c): V's type and row bytes; v_row_bytes 0: V as K.
    size_t v_row_bytes = 0;
    DType v_dtype = DType::kF16;
  };
  virtual std::vector<KvLayer> kv_layers() const { return {}; }
  // Copies the K and V rows of KV layer `layer` in block `block`
  // (kv_block_size() rows of row_bytes each) out to k / v, or in from them.
  virtual Status copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
    (void)layer, (void)block, (void)k, (void)v;
    return Error{"this model does not export its KV"};
  }
  virtual Status copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) {
    (void)layer, (void)block, (void)k, (void)v;
    return Error{"this model does not import KV"};
  }
  // copy_kv_out / copy_kv_in of blocks[i] to / from k + i * block_bytes and
  // v + i * block_bytes (block_bytes: kv_block_size() rows of the layer's
  // row_bytes, so a tier's run is one call per layer). The bytes are in
  // place when the call returns; implementations may batch the copies (the
  // CUDA runtime: one synchronization per 16 MiB). Default: copy_kv_* per block.
  virtual Status copy_kv_blocks_out(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, uint8_t* k,
                                    uint8_t* v) const {
    for (size_t i = 0; i < blocks.size(); ++i)
      RILL_TRY(copy_kv_out(layer, blocks[i], k + i * block_bytes, v + i * block_bytes));
    return {};
  }
  virtual Status copy_kv_blocks_in(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, const uint8_t* k,
                                   const uint8_t* v) {
    for (size_t i = 0; i < blocks.size(); ++i)
      RILL_TRY(copy_kv_in(layer, blocks[i], k + i * block_bytes, v + i * block_bytes));
    return {};
  }
  // What decides the bits of this model's KV (and recurrent state) beyond
  // its config and weights: the device, its kernels' instruction set or
  // architecture, compute dtypes and the options that change the arithmetic
  // (e.g. "cpu avx512", "cuda sm_90 act=bf16"). The disk tier records it in
  // every file and restores only files of equal numerics, so KV computed by
  // one device is never silently resumed by another.
  virtual std::string kv_numerics() const { return "unspecified"; }

  // Recurrent-state export and import for the same tiers (models with a
  // kRecurrent group): per recurrent layer, the f32 tensors of one state in
  // memory order (tensor t's bytes follow tensor t-1's); empty when the
  // model does not support it.
  struct StateTensor {
    std::string name;
    std::vector<int64_t> shape;  // f32 elements
  };
  virtual std::vector<std::vector<StateTensor>> state_layers() const { return {}; }
  // Copies recurrent layer `layer`'s state (all its tensors, contiguous) in
  // checkpoint slot `checkpoint` out to `out`, or in from `in`.
  virtual Status copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const {
    (void)checkpoint, (void)layer, (void)out;
    return Error{"this model does not export its recurrent state"};
  }
  virtual Status copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) {
    (void)checkpoint, (void)layer, (void)in;
    return Error{"this model does not import recurrent state"};
  }
};

}  // namespace rill
