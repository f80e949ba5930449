#include "model/cuda_model_base.h"

#if RILL_HAVE_CUDA
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_stored_types.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/sampling.h"
#include "core/e4m3.h"
#include "core/half.h"
#include "model/batch_check.h"
#include "model/cpu_paged_model.h"  // kKvCalibrationTokens
#include "model/kv_tails.h"
#include "model/kv_types.h"
#include "parallel/nccl_group.h"

namespace rill {
namespace {

// push_back over a raw array (capacity checked by the caller's sizing).
template <typename T>
struct Appender {
  T* data;
  int32_t n = 0;
  void push_back(const T& v) { data[n++] = v; }
};

}  // namespace

Result<CudaDtypes> pick_cuda_dtypes(const std::string& path, const std::vector<const WeightView*>& layer_mats,
                                    const WeightView& embed) {
  CudaDtypes d;
  d.act = layer_mats.empty() ? DType::kBF16 : layer_mats.front()->dtype;
  // An FP8 checkpoint's weights arrive as their f32 dequantization
  // (WeightView::fp8): the activations follow its unquantized tensors (the
  // embedding: bf16 in the checkpoints Hugging Face hosts) instead.
  if (!layer_mats.empty() && layer_mats.front()->fp8) d.act = embed.dtype;
  bool all_f32 = true, any_quant = false;
  for (const WeightView* w : layer_mats) {
    const DType t = w->dtype;
    if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16 && !cuda::quant_supported(t)) {
      return Error{path +
                   ": the CUDA backend runs F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K "
                   "and Q6_K weights; this model has " +
                   std::string(dtype_name(t))};
    }
    all_f32 = all_f32 && t == DType::kF32;
    any_quant = any_quant || cuda::quant_supported(t);
  }
  // Quantized layers: bf16 activations (what their GEMV reads and their
  // dequantize-then-GEMM path multiplies in).
  if (any_quant || (d.act != DType::kF32 && d.act != DType::kF16 && d.act != DType::kBF16)) d.act = DType::kBF16;
  d.kv = all_f32 && embed.dtype == DType::kF32 ? DType::kF32 : DType::kF16;
  return d;
}

// --- DeviceRope / StepMeta --------------------------------------------------

Result<DeviceRope> DeviceRope::upload(cpu::RopeTable table) {
  DeviceRope r;
  r.table = std::move(table);
  const int64_t rot = r.table.rot_dim;
  std::vector<float> host(static_cast<size_t>(std::max<int64_t>(rot, 1)), 0.0f);
  std::copy(r.table.inv_freq.begin(), r.table.inv_freq.end(), host.begin());
  std::copy(r.table.ggml_freq_divisor.begin(), r.table.ggml_freq_divisor.end(), host.begin() + rot / 2);
  RILL_ASSIGN_OR_RETURN(r.buf, cuda::DeviceBuffer::allocate(host.size() * sizeof(float), "the RoPE table"));
  // cudaMemcpy from pageable memory may return with the DMA still queued
  // on the legacy stream, which the model's non-blocking stream does not
  // wait for: wait for it here.
  cudaError_t e = cudaMemcpy(r.buf.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  if (e != cudaSuccess) return Error{cuda::cuda_error_text(e, "uploading the RoPE table")};
  return r;
}

void DeviceRope::apply(cuda::RopeKvArgs& rk) const {
  rk.inv_freq = buf.as<float>();
  rk.freq_divisor = table.ggml_freq_divisor.empty() ? nullptr : buf.as<float>() + table.rot_dim / 2;
  rk.rot_dim = static_cast<int32_t>(table.rot_dim);
  rk.interleaved = table.interleaved;
  rk.attn_factor = table.attn_factor;
  rk.ggml_theta_scale = table.ggml_theta_scale;
}

void StepMeta::carve(cuda::Arena& a, size_t T, size_t S, size_t table_cap, int n_groups, size_t n_seq_arrays) {
  for (int g = 1; g < n_groups; ++g) tables[g] = a.take<int32_t>(table_cap);
  ids = a.take<int32_t>(T);
  pos = a.take<int32_t>(T);
  seq_of = a.take<int32_t>(T);
  decode_tokens = a.take<int32_t>(T);
  sample_rows = a.take<int32_t>(S);
  table_start = a.take<int32_t>(T);
  tiles = a.take<cuda::PrefillTile>(T);
  for (int g = 0; g < n_groups; ++g) slots[g] = a.take<int32_t>(T);
  for (int32_t** p : {&q_start, &q_len, &kv_len, &kv_tail}) *p = n_seq_arrays ? a.take<int32_t>(n_seq_arrays) : nullptr;
  tables[0] = a.take<int32_t>(table_cap);
}

void DrawInputs::carve(cuda::Arena& a, size_t S, size_t n_words) {
  params = a.take<DeviceSamplingParams>(S);
  row_mask = a.take<int32_t>(S);
  words = a.take<uint32_t>(S * n_words);
}

// --- CudaModelBase: init ----------------------------------------------------

Status CudaModelBase::read_dims() {
  const std::string& path = files_->path;
  E_ = cfg_.n_embd;
  V_ = cfg_.n_vocab;
  F_ = cfg_.n_ff;
  if (E_ <= 0 || V_ <= 0 || cfg_.n_layer <= 0 || cfg_.n_head <= 0 || cfg_.n_head_kv <= 0 || F_ <= 0 ||
      cfg_.n_head % cfg_.n_head_kv != 0) {
    return Error{path + ": inconsistent model config (embd " + std::to_string(E_) + ", heads " +
                 std::to_string(cfg_.n_head) + "/" + std::to_string(cfg_.n_head_kv) + ")"};
  }
  hd_ = cfg_.head_dim > 0 ? cfg_.head_dim : E_ / cfg_.n_head;
  if (hd_ <= 0 || hd_ > 256 || hd_ % 4 != 0 || cfg_.n_head / cfg_.n_head_kv > 8) {
    return Error{path +
                 ": the CUDA backend supports head_dim a multiple of 4 up to 256 and at most 8 query heads "
                 "per KV head (model: head_dim " +
                 std::to_string(hd_) + ", " + std::to_string(cfg_.n_head / cfg_.n_head_kv) + " per KV head)"};
  }
  Q_ = cfg_.n_head * hd_;
  KV_ = cfg_.n_head_kv * hd_;
  n_head_ = cfg_.n_head;
  n_head_kv_ = cfg_.n_head_kv;
  if (shard_.group) {
    const int n_ranks = shard_.group->size();
    RILL_ASSIGN_OR_RETURN(split_, plan_tensor_split(cfg_, shard_.rank, n_ranks, path));
    RILL_ASSIGN_OR_RETURN(ff_split_, split_evenly(F_, shard_.rank, n_ranks, "intermediate_size", path));
    n_head_ = split_.heads.n;
    n_head_kv_ = split_.kv_heads.n;
    comm_ = &shard_.group->rank(shard_.rank);
  }
  return Status::Ok();
}

void CudaModelBase::narrow_dims() {
  if (!sharded()) return;
  Q_ = n_head_ * hd_;
  KV_ = n_head_kv_ * hd_;
  F_ = ff_split_.n;
}

Status CudaModelBase::create_context() {
  RILL_ASSIGN_OR_RETURN(ctx_, cuda::Context::create(shard_.group ? shard_.group->device(shard_.rank) : 0));
  gemm_ = std::make_unique<cuda::Gemm>(*ctx_);
  if (shard_.group) shard_.group->set_stream(shard_.rank, ctx_->stream());
  return Status::Ok();
}

Status CudaModelBase::create_backend(const ModelOptions& options) {
  CudaBackendOptions bo;
  bo.act = act_;
  bo.batch_invariant = options.batch_invariant;
  bo.fp8_weights = options.quantize == WeightQuantization::kFp8;
  RILL_ASSIGN_OR_RETURN(backend_, make_cuda_backend_on(*ctx_, *gemm_, bo));
  backend_scratch_ = true;
  return Status::Ok();
}

int CudaModelBase::n_table_groups() const {
  int n = 0;
  while (n < static_cast<int>(kv_spec_.size()) && kv_spec_[static_cast<size_t>(n)].is_attention()) ++n;
  return n;
}

Status CudaModelBase::choose_kv_type(const KvTypeOptions& kt) {
  const ModelFiles& f = *files_;
  if (kt.empty()) return Status::Ok();
  const int64_t n_kv_layers = n_kv_layers_ > 0 ? n_kv_layers_ : cfg_.n_layer;
  const DType base = kv_dtype_;
  RILL_ASSIGN_OR_RETURN(const std::vector<KvLayerTypes> types, kt.resolve(n_kv_layers, base));
  if (types.empty()) return Status::Ok();
  const KvType t = types[0].k;
  // k4c / k4a: q4c / q4a K with rotated iq4_nlh64 V in every layer
  // (model/kv_types.h).
  if (kv_chan_k(t.dtype)) {
    const bool alloc = t.dtype == kKvQ4Alloc;
    const std::string pair = alloc ? "k4a (k=q4a v=iq4_nlh64)" : "k4c (k=q4c v=iq4_nlh64)";
    const std::string k_name = alloc ? "q4a (k4a)" : "q4c (k4c)";
    const KvLayerTypes want{KvType{t.dtype, false}, KvType{kKvIq4Nl64, true}};
    for (const KvLayerTypes& lt : types) {
      if (lt.k != want.k || lt.v != want.v) {
        return Error{f.path + ": CUDA stores " + pair + " in every layer or not at all, not " +
                     describe_kv_types(types, base) + "; name one --kv-type, or use --device cpu"};
      }
    }
    if (!kv_tails_supported_) {
      const std::string why = kv_tails_refusal_.empty()
                                  ? "which on CUDA only the Llama and Gemma families' models keep"
                                  : "which this model does not keep on CUDA: " + kv_tails_refusal_;
      return Error{f.path + ": KV type " + k_name + " needs a per-sequence KV tail, " + why + "; use another KV type"};
    }
    if (!cuda::kv_rotation_supported(kKvIq4Nl64, static_cast<int32_t>(hd_), true) || hd_ > 1024) {
      return Error{f.path + ": KV type " + pair + " needs a power-of-two head_dim of at least 64 and at most " +
                   std::to_string(cuda::kMaxHeadDim) + " on CUDA; head_dim is " + std::to_string(hd_)};
    }
    if (n_head_kv_ > 0 && n_head_ / n_head_kv_ > 64) {  // as the CPU model (attention_chan_impl.h)
      return Error{f.path + ": KV type " + k_name + " reads at most 64 query heads per KV head, not " +
                   std::to_string(n_head_ / n_head_kv_)};
    }
    kv_dtype_ = t.dtype;
    kv_rotated_ = false;
    kv_chan_ = true;
    kv_types_desc_ = describe_kv_types(types, base);
    return Status::Ok();
  }
  for (const KvLayerTypes& lt : types) {
    if (lt.k != t || lt.v != t) {
      return Error{f.path + ": CUDA stores one KV type for every layer and both K and V, not " +
                   describe_kv_types(types, base) + "; name one --kv-type, or use --device cpu"};
    }
  }
  // bf16 is taken whatever the checkpoint (as the quantized types are); f16
  // and f32 only as the model's own.
  const bool own_float = t.dtype == DType::kF32 || t.dtype == DType::kF16;
  if (own_float && t != KvType{base, false}) {
    return Error{f.path + ": KV type " + kv_type_name(t) + " is not what CUDA stores for this model (" +
                 std::string(dtype_name(base)) + "); drop --kv-type / --kv-config or use --device cpu"};
  }
  const std::string stored = cuda::kv_types_cuda_stores();
  if (!own_float && !cuda::kv_supported(t.dtype)) {
    return Error{f.path + ": KV type " + kv_type_name(t) + " runs on the CPU only (" + stored +
                 "); use one of those, or --device cpu"};
  }
  if (!cuda::kv_rotation_supported(t.dtype, static_cast<int32_t>(hd_), t.rotated)) {
    const std::string least = t.dtype == kKvQ8_0x64 || t.dtype == kKvIq4Nl64 ? "at least 64 and " : "";
    return Error{f.path + ": KV type " + kv_type_name(t) + " needs a power-of-two head_dim of " + least + "at most " +
                 std::to_string(cuda::kMaxHeadDim) + " on CUDA; " + "head_dim is " + std::to_string(hd_)};
  }
  // Heads of whole blocks, or (small heads) blocks of whole heads that the
  // rope kernel stores together (backend/cuda/ops.cu kv_heads_per_block).
  const int64_t block = dtype_info(t.dtype).block_size;
  bool whole = hd_ % block == 0 || (block % hd_ == 0 && n_head_kv_ % (block / hd_) == 0);
  for (int64_t l = 0; l < n_kv_layers; ++l) whole = whole && kv_width(static_cast<size_t>(l)) % block == 0;
  if (!whole) {
    return Error{f.path + ": KV type " + kv_type_name(t) + " needs K/V heads of whole blocks of " +
                 std::to_string(block) + " (or blocks of whole heads) on CUDA; head_dim is " + std::to_string(hd_) +
                 ", " + std::to_string(n_head_kv_) + " KV heads"};
  }
  kv_dtype_ = t.dtype;
  kv_rotated_ = t.rotated;
  kv_types_desc_ = describe_kv_types(types, base);
  return Status::Ok();
}

Status CudaModelBase::init_runtime(const ModelOptions& options) {
  const ModelFiles& f = *files_;
  RILL_TRY(choose_kv_type(options.kv_types));
  const int n_groups = n_table_groups();
  for (size_t g = static_cast<size_t>(n_groups); g < kv_spec_.size(); ++g) {
    if (kv_spec_[g].is_attention()) return Error{f.path + ": the CUDA models take recurrent KV groups last"};
  }
  if (n_groups < 1 || n_groups > kMaxKvGroups) {
    return Error{f.path + ": the CUDA models take 1 to " + std::to_string(kMaxKvGroups) + " KV groups"};
  }
  n_ctx_ = options.n_ctx > 0 ? options.n_ctx : cfg_.max_position;
  if (n_ctx_ <= 0) n_ctx_ = 4096;
  block_size_ = kv_chan_ ? cpu::kKvChanTokens : options.kv_block_size;  // q4c's groups are blocks (kv_types.h)
  if (block_size_ <= 0 || (block_size_ & (block_size_ - 1)) != 0) {
    return Error{"KV block size " + std::to_string(block_size_) + " is not a power of two"};
  }
  block_shift_ = __builtin_ctz(static_cast<unsigned>(block_size_));
  max_tokens_ = std::max(1, options.max_batch_tokens);
  max_seqs_ = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens_) : max_tokens_;

  batch_invariant_ = options.batch_invariant;
  fp8_weights_ = options.quantize == WeightQuantization::kFp8;
  gemm_->set_batch_invariant(batch_invariant_);

  // Activations for max_tokens_ rows (and max_seqs_ sampled rows).
  const auto T = static_cast<size_t>(max_tokens_), S = static_cast<size_t>(max_seqs_);
  auto carve = [&](cuda::Arena& a) {
    carve_activations(a);
    logits_ = a.take<float>(S * V_);
    partial_ = backend_scratch_ ? nullptr
                                : a.take<float>(cuda::attention_partial_floats(
                                      max_tokens_, static_cast<int32_t>(n_head_), static_cast<int32_t>(hd_)));
    ids_dev_ = a.take<int32_t>(S);
    if (mtp_rows_) {
      rows_in_ = a.take<float>(T * static_cast<size_t>(E_));
      rows_out_ = a.take<float>(T * static_cast<size_t>(E_));
    }
    if (sharded()) {
      vocab_local_ = a.take<float>(S * static_cast<size_t>(split_.vocab_stride));
      vocab_all_ = a.take<float>(static_cast<size_t>(split_.size) * S * static_cast<size_t>(split_.vocab_stride));
    }
    const int64_t quant_cols = quant_max_elems_ > 0 || quant_head_ ? std::max({E_, F_, Q_}) : 0;
    qscratch_.carve(a, act_, max_tokens_, quant_max_elems_, quant_head_ ? V_ : 0, E_, max_seqs_, batch_invariant_,
                    quant_cols);
  };
  cuda::Arena sizing;
  carve(sizing);
  RILL_ASSIGN_OR_RETURN(act_buf_, cuda::DeviceBuffer::allocate(sizing.used(), "activations"));
  cuda::Arena real(act_buf_.data());
  carve(real);
  // A decode graph's padding rows read rows_in() past the step's rows:
  // zeros (finite) until real rows were there.
  // (On the model's stream, whose later work a legacy-stream cudaMemset
  // would not be ordered with.)
  if (rows_in_) {
    RILL_CUDA_CHECK(cudaMemsetAsync(rows_in_, 0, T * static_cast<size_t>(E_) * sizeof(float), ctx_->stream()));
  }

  // Step metadata: block tables for every sequence of a full batch at full context.
  const size_t blocks_per_seq = static_cast<size_t>((n_ctx_ + block_size_ - 1) / block_size_);
  table_cap_ = std::min(T, S + 16) * blocks_per_seq + 1;  // + the padding rows' scratch block
  cuda::Arena meta_sizing;
  // k4c's per-sequence arrays: a decode graph's steps name n_run + 1 <= T + 1.
  const size_t n_seq_arrays = kv_chan_ ? T + 1 : 0;
  meta_dev_.carve(meta_sizing, T, S, table_cap_, n_groups, n_seq_arrays);
  RILL_ASSIGN_OR_RETURN(meta_dev_buf_, cuda::DeviceBuffer::allocate(meta_sizing.used(), "step metadata"));
  cuda::Arena md(meta_dev_buf_.data());
  meta_dev_.carve(md, T, S, table_cap_, n_groups, n_seq_arrays);
  // The draws' inputs: a token mask per row is 1/32 of the row's logits.
  const auto n_words = static_cast<size_t>(token_mask_words(V_));
  cuda::Arena draw_sizing;
  draw_dev_.carve(draw_sizing, S, n_words);
  RILL_ASSIGN_OR_RETURN(draw_dev_buf_, cuda::DeviceBuffer::allocate(draw_sizing.used(), "sampling parameters"));
  cuda::Arena dd(draw_dev_buf_.data());
  draw_dev_.carve(dd, S, n_words);
  for (int k = 0; k < 2; ++k) {  // the two host sets (launch_ids)
    RILL_ASSIGN_OR_RETURN(meta_host_buf_[k], cuda::PinnedBuffer::allocate(meta_sizing.used(), "step metadata"));
    cuda::Arena mh(meta_host_buf_[k].data());
    meta_host_[k].carve(mh, T, S, table_cap_, n_groups, n_seq_arrays);
    RILL_ASSIGN_OR_RETURN(ids_host_[k], cuda::PinnedBuffer::allocate(S * sizeof(int32_t), "greedy ids"));
    RILL_ASSIGN_OR_RETURN(draw_host_buf_[k], cuda::PinnedBuffer::allocate(draw_sizing.used(), "sampling parameters"));
    cuda::Arena dh(draw_host_buf_[k].data());
    draw_host_[k].carve(dh, S, n_words);
    RILL_TRY(ids_ready_[k].create());
  }

  // KV pool: explicit bytes, else a share of device memory, else whole contexts.
  const int64_t n_kv_layers = n_kv_layers_ > 0 ? n_kv_layers_ : cfg_.n_layer;
  if (!kv_widths_.empty() && static_cast<int64_t>(kv_widths_.size()) != n_kv_layers) {
    return Error{f.path + ": " + std::to_string(kv_widths_.size()) + " KV widths for " + std::to_string(n_kv_layers) +
                 " KV layers"};
  }
  kv_token_bytes_ = 0;
  std::vector<int64_t> tail_widths;
  for (int64_t l = 0; l < n_kv_layers; ++l) {
    kv_token_bytes_ += kv_row_bytes(static_cast<size_t>(l)) + kv_v_row_bytes(static_cast<size_t>(l));
    tail_widths.push_back(kv_chan_ ? kv_width(static_cast<size_t>(l)) : 0);
  }
  const size_t block_bytes = kv_token_bytes_ * static_cast<size_t>(block_size_);
  // k4c's tails: one slot per sequence that runs at once, as the CPU model
  // (cpu_paged_model.cpp create_kv), in KvTails' layout, counted in the budget.
  tail_off_.clear();
  tail_slot_bytes_ = 0;
  for (const int64_t w : tail_widths) {
    tail_off_.push_back(w > 0 ? tail_slot_bytes_ : SIZE_MAX);
    tail_slot_bytes_ += KvTails::slot_bytes({w});
  }
  const int32_t live = options.n_state_slots > 0 ? options.n_state_slots : options.max_batch_seqs > 0 ? max_seqs_ : 1;
  n_tail_slots_ = tail_slot_bytes_ > 0 ? std::max(live, std::max(1, options.n_kv_slots)) : 0;
  const auto tail_bytes = static_cast<int64_t>(tail_slot_bytes_) * n_tail_slots_;
  int64_t n_blocks = 0;
  if (options.kv_cache_bytes > 0) {
    n_blocks = std::max<int64_t>(0, options.kv_cache_bytes - tail_bytes) / static_cast<int64_t>(block_bytes);
  } else if (options.gpu_memory_fraction > 0) {
    size_t free_b = 0, total_b = 0;
    ctx_->mem_info(&free_b, &total_b);
    const double budget = options.gpu_memory_fraction * static_cast<double>(total_b) -
                          static_cast<double>(total_b - free_b) - static_cast<double>(tail_bytes);
    n_blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
    if (n_blocks < 1) {
      return Error{f.path + ": --gpu-memory-fraction " + std::to_string(options.gpu_memory_fraction) +
                   " leaves no room for the KV cache after weights and activations (" +
                   std::to_string((total_b - free_b) >> 20) + " MiB in use of " + std::to_string(total_b >> 20) +
                   " MiB)"};
    }
  } else {
    n_blocks = std::max(1, options.n_kv_slots) * static_cast<int64_t>(blocks_per_seq);
  }
  n_blocks = std::min<int64_t>(n_blocks, (int64_t{1} << 31) / block_size_ - 1);  // slots are int32
  if (n_blocks < 1) {
    return Error{f.path + ": a KV cache of " + std::to_string(options.kv_cache_bytes) +
                 " bytes holds no whole block of " + std::to_string(block_size_) + " tokens (" +
                 std::to_string(kv_token_bytes_) + " bytes per token)"};
  }
  n_blocks_ = static_cast<int32_t>(n_blocks);
  // One block more than reported: the scratch block that padding rows of a
  // decode graph write to and read from.
  RILL_ASSIGN_OR_RETURN(kv_,
                        cuda::DeviceBuffer::allocate(static_cast<size_t>(n_blocks + 1) * block_bytes, "the KV cache"));
  kv_plane_off_.assign(static_cast<size_t>(n_kv_layers), 0);
  for (size_t l = 1; l < kv_plane_off_.size(); ++l) {
    kv_plane_off_[l] = kv_plane_off_[l - 1] + kv_plane_bytes(l - 1) + kv_v_plane_bytes(l - 1);
  }
  if (n_tail_slots_ > 0) {  // zeros: every header at position 0 with no rows
    // One slot more than reported: the scratch slot of a decode graph's
    // padding sequences (compute()), as the pool's scratch block.
    const size_t bytes = static_cast<size_t>(tail_bytes) + tail_slot_bytes_;
    RILL_ASSIGN_OR_RETURN(kv_tails_, cuda::DeviceBuffer::allocate(bytes, "the KV tails"));
    RILL_CUDA_CHECK(cudaMemsetAsync(kv_tails_.data(), 0, bytes, ctx_->stream()));
    tail_heads_.assign(static_cast<size_t>(n_tail_slots_), {0, 0});
  }
  // k4a: every layer's widths table, every channel at 4 bits until calibrate_kv().
  k_widths_.assign(static_cast<size_t>(n_kv_layers), {});
  k_widths_off_.assign(static_cast<size_t>(n_kv_layers), 0);
  if (kv_dtype_ == kKvQ4Alloc) {
    size_t bytes = 0;
    for (int64_t l = 0; l < n_kv_layers; ++l) {
      const int64_t w = kv_width(static_cast<size_t>(l));
      k_widths_[static_cast<size_t>(l)].assign(static_cast<size_t>(w), 4);
      k_widths_off_[static_cast<size_t>(l)] = bytes;
      bytes += (cuda::alloc_table_bytes(w) + 255) / 256 * 256;
    }
    RILL_ASSIGN_OR_RETURN(k_widths_dev_, cuda::DeviceBuffer::allocate(bytes, "the KV widths"));
    for (int64_t l = 0; l < n_kv_layers; ++l) RILL_TRY(set_kv_k_widths(l, k_widths_[static_cast<size_t>(l)]));
  }
  use_graphs_ = options.cuda_graphs;
  device_sampling_ = options.cuda_device_sampling;
  return ctx_->synchronize();
}

CudaModelBase::~CudaModelBase() {
  if (sharded() && ctx_) cudaSetDevice(ctx_->device());  // the members below free on it
  for (auto& [key, g] : graphs_) {
    if (g.exec) cudaGraphExecDestroy(g.exec);
  }
}

// --- CudaModelBase: steps ---------------------------------------------------

Status CudaModelBase::reduce_residual(float* x, int64_t n) {
  return comm_ ? comm_->all_reduce_sum(x, n * E_) : Status::Ok();
}

StepMetadata CudaModelBase::step_metadata(const Step& s) const {
  StepMetadata md;
  md.n_tokens = static_cast<int32_t>(s.n);
  md.n_sample = static_cast<int32_t>(s.n_sample);
  md.ids = meta_dev_.ids;
  md.pos = meta_dev_.pos;
  md.seq_of = meta_dev_.seq_of;
  md.sample_rows = meta_dev_.sample_rows;
  md.table_start = meta_dev_.table_start;
  for (int g = 0; g < kMaxKvGroups; ++g) {
    md.slots[g] = meta_dev_.slots[g];
    md.block_tables[g] = meta_dev_.tables[g];
  }
  md.decode_tokens = meta_dev_.decode_tokens;
  md.n_decode = s.n_decode;
  md.max_decode_len = s.max_decode_len;
  md.decode_work = s.decode_work;
  md.tiles = reinterpret_cast<const AttentionTile*>(meta_dev_.tiles);
  md.n_tiles = s.n_tiles;
  md.recurrent = rec_step_;
  if (kv_chan_) {
    md.n_seqs = s.n_seqs;
    md.q_start = meta_dev_.q_start;
    md.q_len = meta_dev_.q_len;
    md.kv_len = meta_dev_.kv_len;
    md.kv_tail = meta_dev_.kv_tail;
  }
  return md;
}

Status CudaModelBase::create_states(int64_t n_layers, std::vector<StateTensor> tensors, const ModelOptions& options) {
  // The limits init_runtime() will set (set_limits' rule): T tokens, max_seqs sequences.
  const int max_tokens = std::max(1, options.max_batch_tokens);
  const int max_seqs = options.max_batch_seqs > 0 ? std::min(options.max_batch_seqs, max_tokens) : max_tokens;
  RILL_ASSIGN_OR_RETURN(states_, StatePool::create(*backend_, n_layers, std::move(tensors), max_seqs, options));
  // Sequences and saves are at most one per token, tok_seq one per token.
  const auto T = static_cast<size_t>(max_tokens);
  auto carve = [&](cuda::Arena& a, RecurrentSeq*& seqs, RecurrentSave*& saves, int32_t*& tok) {
    seqs = a.take<RecurrentSeq>(T);
    saves = a.take<RecurrentSave>(T);
    tok = a.take<int32_t>(T);
  };
  cuda::Arena sizing;
  carve(sizing, rec_seqs_host_, rec_saves_host_, rec_tok_host_);
  RILL_ASSIGN_OR_RETURN(rec_host_buf_, cuda::PinnedBuffer::allocate(sizing.used(), "recurrent step indices"));
  RILL_ASSIGN_OR_RETURN(rec_dev_buf_, cuda::DeviceBuffer::allocate(sizing.used(), "recurrent step indices"));
  cuda::Arena host(rec_host_buf_.data()), dev(rec_dev_buf_.data());
  carve(host, rec_seqs_host_, rec_saves_host_, rec_tok_host_);
  carve(dev, rec_seqs_dev_, rec_saves_dev_, rec_tok_dev_);
  return Status::Ok();
}

Status CudaModelBase::upload_states(const Batch& batch, int64_t n_run) {
  RILL_TRY(states_->check(batch));
  rec_step_ = states_->plan(batch, n_run, rec_seqs_host_, rec_saves_host_, rec_tok_host_);
  cudaStream_t st = stream();
  RILL_CUDA_CHECK(cudaMemcpyAsync(rec_seqs_dev_, rec_seqs_host_,
                                  static_cast<size_t>(rec_step_.n_seqs) * sizeof(RecurrentSeq), cudaMemcpyHostToDevice,
                                  st));
  RILL_CUDA_CHECK(cudaMemcpyAsync(rec_tok_dev_, rec_tok_host_, static_cast<size_t>(n_run) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, st));
  if (rec_step_.n_saves > 0) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(rec_saves_dev_, rec_saves_host_,
                                    static_cast<size_t>(rec_step_.n_saves) * sizeof(RecurrentSave),
                                    cudaMemcpyHostToDevice, st));
  }
  rec_step_.seqs = rec_seqs_dev_;
  rec_step_.saves = rec_saves_dev_;
  rec_step_.tok_seq = rec_tok_dev_;
  return Status::Ok();
}

Status CudaModelBase::copy_state_out(int32_t checkpoint, int64_t layer, uint8_t* out) const {
  if (!states_) return Model::copy_state_out(checkpoint, layer, out);
  return states_->copy_out(*backend_, checkpoint, layer, out);
}

Status CudaModelBase::copy_state_in(int32_t checkpoint, int64_t layer, const uint8_t* in) {
  if (!states_) return Model::copy_state_in(checkpoint, layer, in);
  return states_->copy_in(*backend_, checkpoint, layer, in);
}

KvCacheView CudaModelBase::kv_view(size_t layer) const {
  KvCacheView v;
  v.k = k_cache(layer);
  v.v = v_cache(layer);
  v.dtype = kv_dtype_;
  v.k_rotated = v.v_rotated = kv_rotated_;
  v.block_shift = block_shift_;
  v.row_bytes = kv_row_bytes(layer);
  v.block_stride = v.row_bytes << block_shift_;
  if (kv_chan_) {  // k4c: V rotated in its own type; the layer's tails (KvCacheView::tail)
    v.v_dtype = kv_v_dtype();
    v.v_row_bytes = kv_v_row_bytes(layer);
    v.v_rotated = true;
    if (layer < tail_off_.size() && tail_off_[layer] != SIZE_MAX && kv_tails_.data()) {
      v.tail = kv_tails_.as<uint8_t>() + tail_off_[layer];
      v.tail_stride = tail_slot_bytes_;
    }
    if (kv_dtype_ == kKvQ4Alloc) v.k_widths = k_widths_dev_.as<uint8_t>() + k_widths_off_[layer];
    if (!calibration_.empty()) v.calibration = &calibration_[layer];
  }
  return v;
}

Status CudaModelBase::set_kv_k_widths(int64_t layer, std::vector<uint8_t> widths) {
  if (kv_dtype_ != kKvQ4Alloc || layer < 0 || layer >= static_cast<int64_t>(k_widths_.size())) {
    return Error{"KV layer " + std::to_string(layer) + " has no q4a K widths"};
  }
  const int64_t w = kv_width(static_cast<size_t>(layer));
  int64_t sum = 0;
  for (const uint8_t b : widths) sum += b > cpu::kKvChanMaxBits ? int64_t{1} << 40 : b;
  if (static_cast<int64_t>(widths.size()) != w || sum != 4 * w) {
    return Error{"KV layer " + std::to_string(layer) + ": q4a widths must be " + std::to_string(w) +
                 " channels of 0.." + std::to_string(cpu::kKvChanMaxBits) + " bits summing to " +
                 std::to_string(4 * w)};
  }
  std::vector<uint8_t> table(cuda::alloc_table_bytes(w));
  cuda::fill_alloc_table(widths.data(), w, table.data());
  RILL_CUDA_CHECK(cudaMemcpyAsync(k_widths_dev_.as<uint8_t>() + k_widths_off_[static_cast<size_t>(layer)], table.data(),
                                  table.size(), cudaMemcpyHostToDevice, ctx_->stream()));
  RILL_TRY(ctx_->synchronize());  // table is freed on return
  k_widths_[static_cast<size_t>(layer)] = std::move(widths);
  return Status::Ok();
}

CudaChanLimits CudaModelBase::chan_limits() const {
  CudaChanLimits chan;
  if (!kv_chan_) return chan;
  chan.max_width = kv_widths_.empty() ? KV_ : *std::max_element(kv_widths_.begin(), kv_widths_.end());
  chan.max_keys = n_ctx();
  // A test hook (tests/cuda/k4c_cuda_test.cpp): a smaller score buffer,
  // so that the attention goes in chunks of a few queries.
  if (const char* e = std::getenv("RILL_CUDA_K4C_SCORE_FLOATS"); e && std::atoll(e) > 0) {
    chan.max_score_floats = static_cast<size_t>(std::atoll(e));
  }
  return chan;
}

Status CudaModelBase::calibrate_kv(const std::vector<int32_t>& tokens, const std::vector<KvRopePairs>& rope) {
  if (kv_dtype_ != kKvQ4Alloc) return Status::Ok();
  assert(rope.size() == k_widths_.size());
  const ModelFiles& f = *files_;
  const int64_t bs = block_size_;
  RILL_ASSIGN_OR_RETURN(const int64_t n, CpuPagedModel::kv_calibration_length(f.path, tokens.size(), n_ctx_,
                                                                              int64_t{n_blocks_} * bs, bs));
  // As the CPU's pass: one sequence in tail slot 0, blocks from 0, every
  // query in the prefill form; its KV is left in blocks no table holds.
  std::vector<int32_t> table(static_cast<size_t>((n + bs - 1) / bs));
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::vector<float> logits(static_cast<size_t>(cfg_.n_vocab));
  const int64_t n_kv_layers = static_cast<int64_t>(k_widths_.size());
  calibration_.assign(static_cast<size_t>(n_kv_layers), {});
  for (int64_t l = 0; l < n_kv_layers; ++l) {
    KvCalibrationStats& st = calibration_[static_cast<size_t>(l)];
    const auto w = static_cast<size_t>(kv_width(static_cast<size_t>(l)));
    st.query_energy.assign(w, 0.0);
    st.block_range_sq.assign(w, 0.0);
    st.block_min.assign(w, INFINITY);
    st.block_max.assign(w, -INFINITY);
  }
  const bool graphs = use_graphs_;
  use_graphs_ = false;  // the backend waits on the stream during the pass: no capture
  Status st;
  Batch batch;
  for (int64_t c0 = 0; c0 < n && st.ok(); c0 += max_tokens_) {
    const auto len = static_cast<int32_t>(std::min<int64_t>(max_tokens_, n - c0));
    batch.clear();
    batch.add_sequence(tokens.data() + c0, len, static_cast<int32_t>(c0), /*sample_last=*/true, table);
    // Every KV group reads the same blocks: each layer has its own plane.
    batch.group_tables.assign(static_cast<size_t>(std::max(n_table_groups(), 1) - 1), table);
    batch.seqs.back().kv_tail = 0;
    batch.seqs.back().decode_from = static_cast<int32_t>(n);
    st = forward(batch, logits.data());
  }
  use_graphs_ = graphs;
  std::vector<KvCalibrationStats> stats;
  stats.swap(calibration_);
  if (!st.ok()) return Error{f.path + ": q4a's calibration pass: " + st.error().message};
  for (int64_t l = 0; l < n_kv_layers; ++l) {
    const KvCalibrationStats& s = stats[static_cast<size_t>(l)];
    const KvRopePairs& r = rope[static_cast<size_t>(l)];
    const auto pairs = r.interleaved ? cpu::RopePairs::kInterleaved : cpu::RopePairs::kNeox;
    const int64_t w = kv_width(static_cast<size_t>(l));
    std::vector<uint8_t> widths(static_cast<size_t>(w));
    // No channel at 1 bit, as the CPU's (docs/perf.md, "k4a stage 2").
    cpu::allocate_channel_bits(s.query_energy.data(), s.block_range_sq.data(), w, hd_, pairs, widths.data(),
                               /*one_bit=*/false, r.rot_dim, r.rotated_pairs);
    RILL_TRY(set_kv_k_widths(l, std::move(widths)));
  }
  return Status::Ok();
}

Status CudaModelBase::lm_head(const cuda::DeviceWeight& w, const void* x, int64_t n_sample) {
  if (!comm_) return matmul(w, x, n_sample, V_, E_, logits_, false);
  if (split_.vocab.n > 0) RILL_TRY(matmul(w, x, n_sample, split_.vocab.n, E_, vocab_local_, false));
  return gather_logits(n_sample);
}

Status CudaModelBase::gather_logits(int64_t n_sample) {
  if (!comm_) return Status::Ok();
  // Rank r's rows are [r Vp, r Vp + n_r) (the last ranks' may be short or
  // empty); its slice goes out as [n_sample, n_r] in an [n_sample, Vp] send.
  const int64_t Vp = split_.vocab_stride;
  RILL_TRY(comm_->all_gather(vocab_local_, n_sample * Vp, vocab_all_));
  if (split_.rank != 0) return Status::Ok();
  for (int r = 0; r < split_.size; ++r) {
    const int64_t v0 = std::min(V_, r * Vp), n_r = std::min(V_, v0 + Vp) - v0;
    if (n_r <= 0) continue;
    RILL_CUDA_CHECK(cudaMemcpy2DAsync(logits_ + v0, static_cast<size_t>(V_) * sizeof(float),
                                      vocab_all_ + r * n_sample * Vp, static_cast<size_t>(n_r) * sizeof(float),
                                      static_cast<size_t>(n_r) * sizeof(float), static_cast<size_t>(n_sample),
                                      cudaMemcpyDeviceToDevice, ctx_->stream()));
  }
  return Status::Ok();
}

// Shards other than rank 0 are called with logits == nullptr (their part
// of the step is the collectives; TensorParallelModel reads rank 0).
Status CudaModelBase::forward(const Batch& batch, float* logits) {
  if (batch.n_tokens() <= 0) return {};
  if (n_queued_ > 0) return Error{"forward: a queued step was not taken (StepOverlap::take_ids)"};
  RILL_TRY(compute(batch));
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  if (n_sample > 0 && logits) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(logits, logits_, static_cast<size_t>(n_sample * V_) * sizeof(float),
                                    cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  return ctx_->synchronize();
}

Status CudaModelBase::compute_kind(const Batch& batch, StepKind kind, float* logits, float* rows) {
  if (n_queued_ > 0) return Error{"a queued step was not taken (StepOverlap::take_ids)"};
  step_kind_ = kind;
  const Status st = compute(batch);
  step_kind_ = StepKind::kForward;
  RILL_TRY(st);
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  if (n_sample > 0 && logits) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(logits, logits_, static_cast<size_t>(n_sample * V_) * sizeof(float),
                                    cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  if (rows) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(rows, rows_out_, static_cast<size_t>(batch.n_tokens() * E_) * sizeof(float),
                                    cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  return ctx_->synchronize();
}

Status CudaModelBase::forward_hidden(const Batch& batch, float* logits, float* hidden) {
  if (!mtp_rows_) return Model::forward_hidden(batch, logits, hidden);
  if (batch.n_tokens() <= 0) return {};
  return compute_kind(batch, StepKind::kHidden, logits, hidden);
}

Status CudaModelBase::forward_mtp(const Batch& batch, const float* hidden, float* logits, float* mtp_hidden) {
  if (!mtp_rows_) return Model::forward_mtp(batch, hidden, logits, mtp_hidden);
  const int64_t n = batch.n_tokens();
  if (n <= 0) return {};
  if (n > max_tokens_) {
    return Error{"batch has " + std::to_string(n) + " tokens, more than the " + std::to_string(max_tokens_) +
                 " the model planned for"};
  }
  // Ordered before the step's kernels (one stream); a replayed decode graph
  // reads the same buffer.
  RILL_CUDA_CHECK(cudaMemcpyAsync(rows_in_, hidden, static_cast<size_t>(n * E_) * sizeof(float), cudaMemcpyHostToDevice,
                                  ctx_->stream()));
  return compute_kind(batch, StepKind::kMtp, logits, mtp_hidden);
}

StepEvent::~StepEvent() {
  if (e_) cudaEventDestroy(e_);
}

Status StepEvent::create() {
  RILL_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
  return Status::Ok();
}

Status CudaModelBase::forward_greedy(const Batch& batch, const TokenMasks& masks, int32_t* ids) {
  if (batch.n_tokens() <= 0) return {};
  if (n_queued_ > 0) return Error{"forward_greedy: a queued step was not taken (StepOverlap::take_ids)"};
  RILL_TRY(enqueue_ids(batch, nullptr, masks));
  return wait_ids(host_slot_, static_cast<int64_t>(batch.sample_rows.size()), ids);
}

Status CudaModelBase::forward_sample(const Batch& batch, const DeviceSamplingParams* rows, const TokenMasks& masks,
                                     int32_t* ids) {
  if (batch.n_tokens() <= 0) return {};
  if (n_queued_ > 0) return Error{"forward_sample: a queued step was not taken (StepOverlap::take_ids)"};
  RILL_TRY(enqueue_ids(batch, rows, masks));
  return wait_ids(host_slot_, static_cast<int64_t>(batch.sample_rows.size()), ids);
}

Status CudaModelBase::launch_ids(const Batch& batch, const DeviceSamplingParams* rows, bool chain_ids) {
  if (!can_queue_steps()) return Error{"launch_ids: this CUDA model does not queue steps"};
  if (n_queued_ >= 2) return Error{"launch_ids: two steps are queued already"};
  if (batch.n_tokens() <= 0) return Error{"launch_ids: an empty batch"};
  if (chain_ids) {
    const bool one_each =
        std::all_of(batch.seqs.begin(), batch.seqs.end(), [](const BatchSeq& q) { return q.q_len == 1; });
    if (n_queued_ == 0 || queued_[n_queued_ - 1].n_sample != batch.n_tokens() || !one_each) {
      return Error{"launch_ids: a chained step needs one token per sequence for each sample row of the queued step"};
    }
  }
  chain_ids_ = chain_ids;
  const Status st = enqueue_ids(batch, rows, TokenMasks{});
  chain_ids_ = false;
  RILL_TRY(st);
  queued_[n_queued_++] = {host_slot_, static_cast<int64_t>(batch.sample_rows.size())};
  return Status::Ok();
}

Status CudaModelBase::take_ids(int32_t* ids) {
  if (n_queued_ == 0) return Error{"take_ids: no step is queued"};
  const QueuedStep q = queued_[0];
  queued_[0] = queued_[1];
  --n_queued_;
  return wait_ids(q.slot, q.n_sample, ids);
}

// Masked steps pick their argmax in the sampler's kernel, which reads the
// masks; unmasked ones in argmax_rows, as before masks existed.
Status CudaModelBase::enqueue_ids(const Batch& batch, const DeviceSamplingParams* rows, const TokenMasks& masks) {
  // The other host set: the last step's set stays untouched while that
  // step may be queued (its uploads may not have run yet); the set before
  // it belongs to a step already taken (launch_ids queues at most two, and
  // forward calls run with none queued).
  host_slot_ ^= 1;
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  // After compute(): a tensor-parallel rank 0 that returned before it would
  // leave the other ranks waiting in the step's collectives.
  RILL_TRY(compute(batch));
  RILL_TRY(check_token_masks(masks, n_sample, V_));
  cudaStream_t st = ctx_->stream();
  if (n_sample > 0 && rows) {
    // One copy: the rows, and the masks after them when the step has any.
    DrawInputs& dh = draw_host_[host_slot_];
    std::memcpy(dh.params, rows, static_cast<size_t>(n_sample) * sizeof(DeviceSamplingParams));
    const TokenMasks dev = masks.empty() ? TokenMasks{} : stage_masks(masks, n_sample);
    const auto* from = reinterpret_cast<const uint8_t*>(dh.params);
    const size_t bytes = masks.empty() ? static_cast<size_t>(n_sample) * sizeof(DeviceSamplingParams)
                                       : static_cast<size_t>(masks_end(masks) - from);
    RILL_CUDA_CHECK(cudaMemcpyAsync(draw_dev_.params, from, bytes, cudaMemcpyHostToDevice, st));
    cuda::sample_rows(logits_, n_sample, V_, draw_dev_.params, dev, ids_dev_, nullptr, st);
  } else if (n_sample > 0 && masks.empty()) {
    cuda::argmax_rows(logits_, n_sample, V_, ids_dev_, st);
  } else if (n_sample > 0) {
    const TokenMasks dev = stage_masks(masks, n_sample);
    const auto* from = reinterpret_cast<const uint8_t*>(draw_host_[host_slot_].row_mask);
    RILL_CUDA_CHECK(cudaMemcpyAsync(draw_dev_.row_mask, from, static_cast<size_t>(masks_end(masks) - from),
                                    cudaMemcpyHostToDevice, st));
    cuda::sample_rows(logits_, n_sample, V_, nullptr, dev, ids_dev_, nullptr, st);
  }
  if (n_sample > 0) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(ids_host_[host_slot_].data(), ids_dev_,
                                    static_cast<size_t>(n_sample) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  }
  RILL_CUDA_CHECK(cudaEventRecord(ids_ready_[host_slot_].get(), st));
  return Status::Ok();
}

TokenMasks CudaModelBase::stage_masks(const TokenMasks& masks, int64_t n_sample) {
  DrawInputs& dh = draw_host_[host_slot_];
  std::memcpy(dh.row_mask, masks.row_mask, static_cast<size_t>(n_sample) * sizeof(int32_t));
  std::memcpy(dh.words, masks.words,
              static_cast<size_t>(masks.n_masked) * static_cast<size_t>(masks.n_words) * sizeof(uint32_t));
  return {draw_dev_.row_mask, draw_dev_.words, masks.n_masked, masks.n_words};
}

Status CudaModelBase::wait_ids(int slot, int64_t n_sample, int32_t* ids) {
  if (cudaError_t e = cudaEventSynchronize(ids_ready_[slot].get()); e != cudaSuccess) {
    return Error{cuda::cuda_error_text(e, "CUDA step")};
  }
  std::memcpy(ids, ids_host_[slot].data(), static_cast<size_t>(n_sample) * sizeof(int32_t));
  return Status::Ok();
}

Status CudaModelBase::check_kv_tails(const Batch& batch) const {
  if (n_tail_slots_ == 0) return Status::Ok();
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const BatchSeq& q = batch.seqs[s];
    // Built only for an error's message (every sequence of every step passes here).
    const auto what = [&] {
      return "batch sequence " + std::to_string(s) + ": KV tail slot " + std::to_string(q.kv_tail);
    };
    if (q.kv_tail < 0 || q.kv_tail >= n_tail_slots_) {
      return Error{what() + " is not one of the model's " + std::to_string(n_tail_slots_) +
                   " (k4c KV keeps one per sequence)"};
    }
    for (size_t o = 0; o < s; ++o) {
      if (batch.seqs[o].kv_tail == q.kv_tail) return Error{what() + " is also sequence " + std::to_string(o) + "'s"};
    }
    const int32_t c0 = q.kv_len - q.q_len;
    if (c0 % block_size_ == 0) continue;
    const auto [start, rows] = tail_heads_[static_cast<size_t>(q.kv_tail)];
    if (start != c0 - c0 % block_size_ || rows < c0 % block_size_) {
      return Error{what() + " holds positions [" + std::to_string(start) + ", " + std::to_string(start + rows) +
                   "), but the step continues at " + std::to_string(c0) + ": k4c KV continues only at a multiple of " +
                   std::to_string(block_size_) + " tokens or where its last step ended"};
    }
  }
  return Status::Ok();
}

void CudaModelBase::note_kv_tails(const Batch& batch) {
  if (n_tail_slots_ == 0) return;
  for (const BatchSeq& q : batch.seqs) {  // as update_chan_tails leaves each header
    const int32_t g1 = q.kv_len - q.kv_len % block_size_;
    tail_heads_[static_cast<size_t>(q.kv_tail)] = {g1, q.kv_len - g1};
  }
}

Status CudaModelBase::compute(const Batch& batch) {
  // A shard's step runs on a thread that may have last used another
  // device (the ranks of a group are built on one thread).
  if (sharded()) RILL_CUDA_CHECK(cudaSetDevice(ctx_->device()));
  const int64_t n = batch.n_tokens();
  const int n_groups = n_table_groups();
  BatchLimits lim;
  lim.max_tokens = max_tokens_;
  lim.max_sample_rows = max_seqs_;
  lim.n_ctx = n_ctx_;
  lim.n_vocab = V_;
  lim.block_size = block_size_;
  lim.n_blocks = n_blocks_;
  RILL_TRY(check_batch(batch, lim, kv_spec_));
  RILL_TRY(check_kv_tails(batch));
  if (batch.block_table.size() + 1 > table_cap_) {
    return Error{"batch block tables hold " + std::to_string(batch.block_table.size()) + " entries, more than the " +
                 std::to_string(table_cap_ - 1) + " the CUDA model planned for"};
  }
  const auto n_sample = static_cast<int64_t>(batch.sample_rows.size());
  const auto n_seqs = static_cast<int32_t>(batch.seqs.size());
  const size_t n_table = batch.block_table.size();

  // Host: the step's index arrays.
  StepMeta& mh = meta_host_[host_slot_];
  std::memcpy(mh.ids, batch.token_ids.data(), static_cast<size_t>(n) * 4);
  std::memcpy(mh.pos, batch.positions.data(), static_cast<size_t>(n) * 4);
  std::memcpy(mh.seq_of, batch.seq_index.data(), static_cast<size_t>(n) * 4);
  std::memcpy(mh.sample_rows, batch.sample_rows.data(), static_cast<size_t>(n_sample) * 4);
  for (int g = 0; g < n_groups; ++g) {
    const std::vector<int32_t>& t = g == 0 ? batch.block_table : batch.group_tables[static_cast<size_t>(g - 1)];
    std::memcpy(mh.tables[g], t.data(), n_table * 4);
  }
  Appender<int32_t> decode{mh.decode_tokens};
  Appender<cuda::PrefillTile> tiles{mh.tiles};
  int32_t max_decode_len = 0;
  int64_t decode_work = 0;  // the decode tokens' splits (StepMetadata::decode_work)
  bool decode_only = n_sample == n;
  const int32_t tile_q = cuda::prefill_tile_q(kv_dtype_, static_cast<int32_t>(hd_));
  for (int32_t s = 0; s < n_seqs; ++s) {
    const BatchSeq& q = batch.seqs[static_cast<size_t>(s)];
    mh.table_start[s] = q.table_start;
    if (kv_chan_) {
      mh.q_start[s] = q.q_start;
      mh.q_len[s] = q.q_len;
      mh.kv_len[s] = q.kv_len;
      mh.kv_tail[s] = q.kv_tail;
    }
    for (int g = 0; g < n_groups; ++g) {
      const int32_t* table = mh.tables[g] + q.table_start;
      for (int32_t i = q.q_start; i < q.q_start + q.q_len; ++i) {
        const int32_t p = batch.positions[static_cast<size_t>(i)];
        mh.slots[g][i] = table[p >> block_shift_] * block_size_ + (p & (block_size_ - 1));
      }
    }
    const bool decoded = batch_invariant_ || q.q_len <= cuda::kDecodeMaxQ;
    if (batch_invariant_) {  // every token through split-KV decode attention (see cuda_model_base.h)
      for (int32_t i = q.q_start; i < q.q_start + q.q_len; ++i) decode.push_back(i);
    } else {
      cuda::route_attention(s, q.q_start, q.q_len, tile_q, decode, tiles);
    }
    if (decoded) {
      max_decode_len = std::max(max_decode_len, q.kv_len);
      for (int32_t i = q.q_start; i < q.q_start + q.q_len; ++i) {
        decode_work += cuda::decode_splits(batch.positions[static_cast<size_t>(i)] + 1);
      }
    }
    decode_only = decode_only && q.q_len == 1;
  }

  // Decode-only steps: pad to a bucket and replay that bucket's graph. The
  // padding rows are one dummy sequence at position 0 in the scratch block.
  int64_t n_run = n;
  int32_t split_bucket = 0;
  if (decode_only && use_graphs_) {
    n_run = n <= 8 ? n : n <= 128 ? (n + 15) / 16 * 16 : (n + 31) / 32 * 32;
    n_run = std::min<int64_t>(n_run, max_seqs_);
    split_bucket = 1;
    while (split_bucket < cuda::decode_splits(max_decode_len)) split_bucket *= 2;
    max_decode_len = split_bucket * cuda::kSplitKeys;  // the kernel's grid: split_bucket splits
    if (n_run > n) {
      const auto pad_table = static_cast<int32_t>(n_table);
      for (int g = 0; g < n_groups; ++g) mh.tables[g][pad_table] = n_blocks_;
      mh.table_start[n_seqs] = pad_table;
      for (int64_t i = n; i < n_run; ++i) {
        mh.ids[i] = 0;
        mh.pos[i] = 0;
        for (int g = 0; g < n_groups; ++g) mh.slots[g][i] = n_blocks_ * block_size_;
        mh.seq_of[i] = n_seqs;
        mh.sample_rows[i] = static_cast<int32_t>(i);
        decode.push_back(static_cast<int32_t>(i));
        ++decode_work;  // one split at position 0
      }
    }
    // k4c: a graph's step names n_run + 1 sequences whatever the batch (the
    // count is a kernel argument, kv_chan_step.h): the dummy sequence of
    // the padding rows as one token at position 0, then sequences of no
    // tokens; all in the scratch tail slot (never read: no step of theirs
    // starts inside a block).
    if (kv_chan_) {
      for (int64_t s = n_seqs; s <= n_run; ++s) {
        const bool dummy = s == n_seqs && n_run > n;
        mh.q_start[s] = dummy ? static_cast<int32_t>(n) : 0;
        mh.q_len[s] = mh.kv_len[s] = dummy ? 1 : 0;
        mh.kv_tail[s] = n_tail_slots_;
      }
    }
  }
  // A power of two, in the graph's key below: every replay of a graph
  // chose its decode blocks for the same count.
  const int32_t work = cuda::decode_work_bucket(decode_work);
  const size_t n_used = n_table + (n_run > n ? 1 : 0);
  const size_t meta_bytes =
      reinterpret_cast<const uint8_t*>(mh.tables[0] + n_used) - reinterpret_cast<const uint8_t*>(mh.ids);
  cudaStream_t st = ctx_->stream();
  RILL_CUDA_CHECK(cudaMemcpyAsync(meta_dev_.ids, mh.ids, meta_bytes, cudaMemcpyHostToDevice, st));
  for (int g = 1; g < n_groups; ++g) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(meta_dev_.tables[g], mh.tables[g], n_used * 4, cudaMemcpyHostToDevice, st));
  }
  // A chained step's tokens are the queued step's ids (launch_ids): its
  // sample rows are this step's tokens in order, and ids_dev_ is rewritten
  // only by this step's draws, after every kernel that reads meta_dev_.ids.
  if (chain_ids_) {
    RILL_CUDA_CHECK(cudaMemcpyAsync(meta_dev_.ids, ids_dev_, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, st));
  }
  // An MTP step runs the MTP layer (or Gemma 4's assistant's four
  // attention layers): its batch names no state slots and its graph reads
  // no recurrent indices.
  if (step_kind_ == StepKind::kMtp) {
    rec_step_ = {};
  } else if (states_) {
    RILL_TRY(upload_states(batch, n_run));
  }

  if (split_bucket == 0) {
    RILL_TRY(run_layers({n, n_sample, decode.n, max_decode_len, tiles.n, work, n_seqs}));
    note_kv_tails(batch);
    return Status::Ok();
  }
  const Step step{n_run, n_run, decode.n, max_decode_len, 0, work, kv_chan_ ? static_cast<int32_t>(n_run + 1) : 0};
  int work_log2 = 0;
  while ((int32_t{1} << work_log2) < work) ++work_log2;
  Graph& g = graphs_[static_cast<uint64_t>(step_kind_) << 48 | static_cast<uint64_t>(work_log2) << 40 |
                     static_cast<uint64_t>(n_run) << 8 | static_cast<uint64_t>(split_bucket)];
  if (g.exec) {
    if (cudaError_t e = cudaGraphLaunch(g.exec, st); e != cudaSuccess)
      return Error{cuda::cuda_error_text(e, "cudaGraphLaunch")};
    note_kv_tails(batch);
    return Status::Ok();
  }
  if (!g.seen) {
    g.seen = true;
    RILL_TRY(run_layers(step));
    note_kv_tails(batch);
    return Status::Ok();
  }
  cudaGraph_t graph = nullptr;
  if (cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
    return Error{cuda::cuda_error_text(e, "cudaStreamBeginCapture")};
  }
  const Status run = run_layers(step);
  const cudaError_t end = cudaStreamEndCapture(st, &graph);
  if (!run.ok()) return run;
  if (end != cudaSuccess) return Error{cuda::cuda_error_text(end, "cudaStreamEndCapture")};
  const cudaError_t inst = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) return Error{cuda::cuda_error_text(inst, "cudaGraphInstantiate")};
  if (cudaError_t e = cudaGraphLaunch(g.exec, st); e != cudaSuccess)
    return Error{cuda::cuda_error_text(e, "cudaGraphLaunch")};
  note_kv_tails(batch);
  return Status::Ok();
}

}  // namespace rill
#endif  // RILL_HAVE_CUDA
