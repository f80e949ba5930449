// The CUDA Backend: each op is one of today's fused CUDA launches, its
// arguments read from the device-neutral views. Placement outside
// place_model() (the ops test) gives each weight a device buffer of its own;
// place_model() lays a whole model out in a sizing pass and then places it
// into one device buffer. MoE layers (moe_ffn.h) go into it too: the
// router, every expert's [gate | up] rows and every expert's down rows, each
// projection's experts at a constant stride, in the activation dtype or
// (quantized GGUF experts the kernels decode, MXFP4 included) their blocks.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <vector>

#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/attention_chan.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/gated_delta.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/glu_narrow.h"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_chan_step.h"
#include "backend/cuda/latent_attention.h"
#include "backend/cuda/lightning_index.h"
#include "backend/cuda/moe_ffn.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_gemma4.h"
#include "backend/cuda/quant.h"
#include "core/half.h"

namespace rill {
namespace {

static_assert(sizeof(AttentionTile) == sizeof(cuda::PrefillTile) &&
              offsetof(AttentionTile, seq) == offsetof(cuda::PrefillTile, seq) &&
              offsetof(AttentionTile, t0) == offsetof(cuda::PrefillTile, t0) &&
              offsetof(AttentionTile, n_q) == offsetof(cuda::PrefillTile, n_q));

static_assert(sizeof(RecurrentSeq) == sizeof(cuda::GdnSeq) &&
              offsetof(RecurrentSeq, src) == offsetof(cuda::GdnSeq, src) &&
              offsetof(RecurrentSeq, dst) == offsetof(cuda::GdnSeq, dst) &&
              offsetof(RecurrentSeq, save_begin) == offsetof(cuda::GdnSeq, save_begin) &&
              offsetof(RecurrentSeq, n_saves) == offsetof(cuda::GdnSeq, n_saves));
static_assert(sizeof(RecurrentSave) == sizeof(cuda::GdnSave) &&
              offsetof(RecurrentSave, after_token) == offsetof(cuda::GdnSave, after_token) &&
              offsetof(RecurrentSave, state) == offsetof(cuda::GdnSave, state));

struct CudaWeight {
  cuda::DeviceWeight w;
  int64_t elems = 0;
  int64_t cols = 0;
  // A matrix of mixed block types (place(): parts of different quantized
  // types) is its parts, each in its own type; w then holds the first.
  std::vector<cuda::QuantPart> parts;
};
struct CudaRope {
  RopeTable table;
  const float* inv_freq = nullptr;      // device [rot_dim / 2]
  const float* freq_divisor = nullptr;  // device [rot_dim / 2] or null
};

const CudaWeight& record(const Weight& w) {
  return *static_cast<const CudaWeight*>(w.placed);
}
const CudaRope& record(const Rope& r) {
  return *static_cast<const CudaRope*>(r.placed);
}
const CudaMoeWeights& record(const MoeWeight& w) {
  return *static_cast<const CudaMoeWeights*>(w.placed);
}

// Whether the CUDA MoE keeps an expert projection in its GGUF blocks: every
// expert's matrices of the projection (`parts` per expert) in one block type
// the expert GEMV decodes (quant.h), rows of whole blocks. Else they go in
// the activation dtype (dequantized at placement).
DType expert_dtype(const HostMoe& h, bool gate_up, DType act) {
  const DType t = gate_up ? h.experts[0].gate.dtype : h.experts[0].down.dtype;
  if (!dtype_info(t).quantized || t == cuda::kFp8Rows || !cuda::quant_supported(t)) return act;
  for (const HostExpert& e : h.experts) {
    const HostMatrix& m = gate_up ? e.gate : e.down;
    if (m.dtype != t || (gate_up && e.up.dtype != t) || !cuda::moe_gemv_supported(t, m.cols)) return act;
  }
  return t;
}

cuda::RopeAngles angles(const CudaRope& r) {
  cuda::RopeAngles a;
  a.inv_freq = r.inv_freq;
  a.freq_divisor = r.freq_divisor;
  a.rot_dim = static_cast<int32_t>(r.table.rot_dim);
  a.interleaved = r.table.interleaved;
  a.attn_factor = r.table.attn_factor;
  a.ggml_theta_scale = r.table.ggml_theta_scale;
  return a;
}

// A layer's latent rows (LatentKvRow) as the MLA kernels address them.
cuda::LatentCache latent_cache(const KvCacheView& v) {
  assert(v.dtype == DType::kF32 || v.dtype == DType::kF16);
  cuda::LatentCache c;
  c.k = v.k;
  c.v = v.v;
  c.dtype = v.dtype;
  c.plane = static_cast<int32_t>(v.row_bytes / (v.dtype == DType::kF32 ? 4 : 2));
  c.block_shift = v.block_shift;
  c.row_bytes = v.row_bytes;
  c.block_stride = v.block_stride;
  return c;
}

// What the CUDA MoE (moe_ffn.h) runs: every router and expert option of
// MoeParams. Refused by name, so a family's load fails clearly rather than
// computing another model: more experts, groups or picks than the kernels
// take, widths the vector loads cannot read, biases on a shared expert.
Status check_cuda_moe(const HostMoe& h, const std::string& what) {
  const MoeParams& p = h.p;
  if (p.n_expert > cuda::kMoeMaxExperts || p.n_expert_used > cuda::kMoeMaxExpertsUsed ||
      static_cast<int64_t>(h.experts.size()) != p.n_expert) {
    return Error{what + ": the CUDA MoE layer takes up to " + std::to_string(cuda::kMoeMaxExperts) + " experts and " +
                 std::to_string(cuda::kMoeMaxExpertsUsed) + " per token (model: " + std::to_string(p.n_expert_used) +
                 " of " + std::to_string(p.n_expert) + "); the CPU runs it"};
  }
  if (p.n_group > cuda::kMoeMaxGroups || p.n_group < 1 || p.n_expert % p.n_group != 0 || p.topk_group < 1 ||
      p.topk_group > p.n_group) {
    return Error{what + ": the CUDA MoE router takes up to " + std::to_string(cuda::kMoeMaxGroups) +
                 " equal expert groups (model: " + std::to_string(p.n_group) + " groups, " +
                 std::to_string(p.topk_group) + " kept); the CPU runs it"};
  }
  // The expert GEMV reads rows as 16-byte vectors: 8 bf16/f16 or 4 f32.
  if (p.n_embd % 8 != 0 || p.n_ff % 8 != 0 || p.n_ff_shared % 8 != 0) {
    return Error{what + ": the CUDA MoE layer needs hidden and expert sizes that are multiples of 8 (model: " +
                 std::to_string(p.n_embd) + ", " + std::to_string(p.n_ff) + ", shared " +
                 std::to_string(p.n_ff_shared) + ")"};
  }
  if (h.shared && (h.shared->gate_bias || h.shared->up_bias || h.shared->down_bias)) {
    return Error{what + ": biases on the shared expert are not on CUDA (no model has them); the CPU runs it"};
  }
  return Status::Ok();
}

// Expert e's biases of one projection laid out [X, rows] (gate then up
// for gate_up: [X, 2F]); zeros for a missing bias. Empty when no expert has one.
std::vector<float> expert_biases(const HostMoe& h, bool gate_up) {
  const MoeParams& p = h.p;
  bool any = false;
  for (const HostExpert& e : h.experts) any = any || (gate_up ? e.gate_bias || e.up_bias : e.down_bias != nullptr);
  if (!any) return {};
  const int64_t rows = gate_up ? 2 * p.n_ff : p.n_embd;
  std::vector<float> v(static_cast<size_t>(p.n_expert * rows), 0.0f);
  for (int64_t e = 0; e < p.n_expert; ++e) {
    const HostExpert& x = h.experts[static_cast<size_t>(e)];
    float* at = v.data() + e * rows;
    if (gate_up) {
      if (x.gate_bias) std::copy(x.gate_bias, x.gate_bias + p.n_ff, at);
      if (x.up_bias) std::copy(x.up_bias, x.up_bias + p.n_ff, at + p.n_ff);
    } else {
      if (x.down_bias) std::copy(x.down_bias, x.down_bias + p.n_embd, at);
    }
  }
  return v;
}

void free_device(void* p) {
  cudaFree(p);
}

// Host row conversion into a device dtype (act: F32/F16/BF16), through f32
// as cpu::dequantize_row gives it.
void convert_row(const void* src, DType src_dtype, int64_t n, DType dst, std::vector<float>& tmp, uint8_t* out) {
  tmp.resize(static_cast<size_t>(n));
  cpu::dequantize_row(src_dtype, src, tmp.data(), n);
  if (dst == DType::kF32) {
    std::memcpy(out, tmp.data(), static_cast<size_t>(n) * 4);
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) h[i] = dst == DType::kF16 ? f32_to_f16(tmp[i]) : f32_to_bf16(tmp[i]);
}

Error upload_error(cudaError_t e, const std::string& what) {
  return Error{cuda::cuda_error_text(e, ("uploading " + what).c_str())};
}

// The first pass of place_model() returns vectors that point here: valid
// to hold, never read.
const float kSizingVector[1] = {0.0f};

std::atomic<int64_t> g_fused_norm_quant_calls{0};  // cuda_fused_norm_quant_calls()

class CudaBackend final : public Backend {
 public:
  // Owns ctx and a GEMM of its own, or (owned null) runs on the runtime's.
  CudaBackend(std::unique_ptr<cuda::Context> owned, cuda::Context* ctx, cuda::Gemm* gemm, const CudaBackendOptions& o)
      : owned_ctx_(std::move(owned)),
        ctx_(owned_ctx_ ? owned_ctx_.get() : ctx),
        owned_gemm_(gemm ? nullptr : std::make_unique<cuda::Gemm>(*ctx_)),
        gemm_(gemm ? gemm : owned_gemm_.get()),
        act_(o.act),
        invariant_(o.batch_invariant),
        fp8_(o.fp8_weights) {
    gemm_->set_batch_invariant(invariant_);
    const char* nq = std::getenv("RILL_FP8_NORM_QUANT");
    fp8_norm_quant_ = !(nq && std::strcmp(nq, "0") == 0);
  }

  const char* name() const override { return "cuda"; }
  DType act_dtype() const override { return act_; }
  AttentionRouting attention_routing(DType kv_dtype, int32_t head_dim) const override {
    AttentionRouting r;
    r.needed = true;
    r.decode_max_q = invariant_ ? INT32_MAX : cuda::kDecodeMaxQ;
    r.tile_q = cuda::prefill_tile_q(kv_dtype, head_dim);
    return r;
  }

  Result<Weight> place(const HostMatrix* parts, int n_parts, const std::string& what) override {
    if (n_parts < 1) return Error{what + ": a weight of no parts"};
    DType t = parts[0].dtype;
    int64_t rows = 0;
    for (int i = 0; i < n_parts; ++i) {
      const HostMatrix& p = parts[i];
      if (p.cols != parts[0].cols || p.rows <= 0 || p.cols % dtype_info(p.dtype).block_size != 0 ||
          p.row_stride < row_bytes(p.dtype, p.cols)) {
        return Error{what + ": part " + std::to_string(i) + " does not fit the weight"};
      }
      t = p.dtype == t ? t : act_;
      rows += p.rows;
    }
    // The quantized GEMV pairs blocks with F32/BF16 activations only.
    t = cuda::quant_supported(t) && act_ != DType::kF16 ? t : act_;
    const int64_t cols = parts[0].cols;
    if (t == act_ && n_parts > 1 && act_ != DType::kF16 && !fp8_ && !parts[0].gathered) {
      // Parts of different block types, all of them read in place: kept
      // as they are, side by side (not widened to act: 3.3x the bytes of
      // Q4_K, read every step).
      bool all_quant = true;
      for (int i = 0; i < n_parts; ++i) all_quant = all_quant && cuda::quant_supported(parts[i].dtype) && !parts[i].fp8;
      if (all_quant) return place_mixed(parts, n_parts, rows, what);
    }
    // FP8 checkpoints' weights stay FP8 without --quantize fp8; where the
    // rows cannot be FP8 they run in act (their dequantized values).
    bool from_fp8 = false;
    for (int i = 0; i < n_parts; ++i) from_fp8 = from_fp8 || parts[i].fp8;
    if ((fp8_ || from_fp8) && !parts[0].gathered && !dtype_info(t).quantized) {
      const bool fits = cuda::fp8_cols_ok(cols) && act_ != DType::kF16;
      if (!fits && fp8_) {
        return Error{what + ": --quantize fp8 needs rows of a multiple of 16 columns (" + std::to_string(cols) +
                     ") and bf16 or f32 activations"};
      }
      if (fits) t = cuda::kFp8Rows;
    }
    const bool fp8 = t == cuda::kFp8Rows;
    const size_t dst_row = fp8 ? cuda::fp8_row_bytes(cols) : row_bytes(t, cols);
    RILL_ASSIGN_OR_RETURN(uint8_t* const dev,
                          take(fp8 ? cuda::fp8_matrix_bytes(rows, cols) : dst_row * static_cast<size_t>(rows), what));
    uint8_t* at = dev;
    int64_t row0 = 0;
    for (int i = 0; i < n_parts && dev; ++i) {
      if (fp8) {
        auto* scales = const_cast<float*>(cuda::fp8_scales(dev, rows, cols)) + row0;
        if (parts[i].e4m3) {
          RILL_TRY(upload_fp8_part(parts[i], at, scales, what));
        } else {
          RILL_TRY(quantize_part(parts[i], at, scales, what));
        }
      } else {
        RILL_TRY(copy_part(parts[i], t, at, what));
      }
      at += dst_row * static_cast<size_t>(parts[i].rows);
      row0 += parts[i].rows;
    }
    weights_.push_back({cuda::DeviceWeight{dev, t}, rows * cols, cols, {}});
    return Weight{rows, cols, &weights_.back()};
  }

  // place()'s mixed-type case: the parts one after the other in their own
  // types, each from a 256-byte boundary (the kernels' loads assume
  // aligned matrix bases).
  Result<Weight> place_mixed(const HostMatrix* parts, int n_parts, int64_t rows, const std::string& what) {
    constexpr size_t kAlign = cuda::Arena::kAlign;
    auto part_bytes = [&](int i) {
      return (row_bytes(parts[i].dtype, parts[i].cols) * static_cast<size_t>(parts[i].rows) + kAlign - 1) / kAlign *
             kAlign;
    };
    size_t bytes = 0;
    for (int i = 0; i < n_parts; ++i) bytes += part_bytes(i);
    RILL_ASSIGN_OR_RETURN(uint8_t* const dev, take(bytes, what));
    CudaWeight rec{cuda::DeviceWeight{dev, parts[0].dtype}, rows * parts[0].cols, parts[0].cols, {}};
    size_t at = 0;
    for (int i = 0; i < n_parts; ++i) {
      if (dev) RILL_TRY(copy_part(parts[i], parts[i].dtype, dev + at, what));
      rec.parts.push_back({dev + at, parts[i].dtype, parts[i].rows});
      at += part_bytes(i);
    }
    weights_.push_back(std::move(rec));
    return Weight{rows, parts[0].cols, &weights_.back()};
  }

  Result<Vec> place_vector(const float* host, int64_t n, const std::string& what) override {
    if (n <= 0) return Error{what + ": an empty vector"};
    RILL_ASSIGN_OR_RETURN(uint8_t * dev, take(static_cast<size_t>(n) * 4, what));
    if (!dev) return Vec{kSizingVector, n};
    RILL_TRY(upload(dev, host, static_cast<size_t>(n) * 4, what));
    return Vec{reinterpret_cast<const float*>(dev), n};
  }

  Result<Rope> place_rope(const RopeTable& table) override {
    const int64_t half = table.rot_dim / 2;
    std::vector<float> host(static_cast<size_t>(std::max<int64_t>(2 * half, 1)), 0.0f);
    std::copy(table.inv_freq.begin(), table.inv_freq.end(), host.begin());
    std::copy(table.ggml_freq_divisor.begin(), table.ggml_freq_divisor.end(), host.begin() + half);
    RILL_ASSIGN_OR_RETURN(const Vec dev,
                          place_vector(host.data(), static_cast<int64_t>(host.size()), "the RoPE table"));
    CudaRope r;
    r.table = table;
    r.inv_freq = dev.data;
    r.freq_divisor = table.ggml_freq_divisor.empty() ? nullptr : r.inv_freq + half;
    ropes_.push_back(std::move(r));
    return Rope{table.rot_dim, &ropes_.back()};
  }

  Result<MoeWeight> place_moe(const HostMoe& h, const std::string& what) override {
    RILL_TRY(check_cuda_moe(h, what));
    const MoeParams& p = h.p;
    const DType gu_t = expert_dtype(h, true, act_), dn_t = expert_dtype(h, false, act_);
    if (pass_ != Pass::kSizing) {  // the layers share one CudaMoe, sized for the largest of each width
      MoeParams m = moe_.initialized() ? moe_.params() : p;
      m.n_embd = std::max(m.n_embd, p.n_embd);
      m.n_expert = std::max(m.n_expert, p.n_expert);
      m.n_expert_used = std::max(m.n_expert_used, p.n_expert_used);
      m.n_ff = std::max(m.n_ff, p.n_ff);
      m.n_ff_shared = std::max(m.n_ff_shared, p.n_ff_shared);
      const bool quantized = (moe_.initialized() && moe_.quantized_experts()) || gu_t != act_ || dn_t != act_;
      if (!moe_.initialized() || m.n_embd != moe_.params().n_embd || m.n_expert != moe_.params().n_expert ||
          m.n_expert_used != moe_.params().n_expert_used || m.n_ff != moe_.params().n_ff ||
          m.n_ff_shared != moe_.params().n_ff_shared || quantized != moe_.quantized_experts()) {
        RILL_TRY(moe_.init(m, act_, quantized));
      }
    }
    const int64_t X = p.n_expert, E = p.n_embd, F = p.n_ff;
    // Each expert's matrices start 16-byte aligned (the float GEMV's vector loads).
    auto aligned = [](size_t b) { return (b + 15) / 16 * 16; };
    const size_t gu_bytes = aligned(row_bytes(gu_t, E) * static_cast<size_t>(2 * F));
    const size_t dn_bytes = aligned(row_bytes(dn_t, F) * static_cast<size_t>(E));
    CudaMoeWeights d;
    d.p = p;
    RILL_ASSIGN_OR_RETURN(d.router, place_in_act(&h.router, 1, what + " router"));
    auto vec = [&](const float* v, int64_t n, const std::string& name) -> Result<const float*> {
      if (!v) return static_cast<const float*>(nullptr);
      RILL_ASSIGN_OR_RETURN(const Vec placed, place_vector(v, n, what + " " + name));
      return placed.data;
    };
    RILL_ASSIGN_OR_RETURN(d.router_bias, vec(h.router_bias, X, "router bias"));
    RILL_ASSIGN_OR_RETURN(d.score_bias, vec(h.score_bias, X, "score correction bias"));
    RILL_ASSIGN_OR_RETURN(d.expert_scale, vec(h.expert_scale, X, "per-expert scales"));
    const std::vector<float> gu_bias = expert_biases(h, true), dn_bias = expert_biases(h, false);
    RILL_ASSIGN_OR_RETURN(d.gate_up_bias, vec(gu_bias.empty() ? nullptr : gu_bias.data(), X * 2 * F, "expert biases"));
    RILL_ASSIGN_OR_RETURN(d.down_bias, vec(dn_bias.empty() ? nullptr : dn_bias.data(), X * E, "expert down biases"));
    RILL_ASSIGN_OR_RETURN(uint8_t* const gu, take(gu_bytes * static_cast<size_t>(X), what + " experts"));
    RILL_ASSIGN_OR_RETURN(uint8_t* const dn, take(dn_bytes * static_cast<size_t>(X), what + " experts"));
    for (int64_t e = 0; e < X && gu; ++e) {
      const HostExpert& x = h.experts[static_cast<size_t>(e)];
      uint8_t* at = gu + static_cast<size_t>(e) * gu_bytes;
      RILL_TRY(copy_part(x.gate, gu_t, at, what + " expert gate"));
      RILL_TRY(copy_part(x.up, gu_t, at + row_bytes(gu_t, E) * static_cast<size_t>(F), what + " expert up"));
      RILL_TRY(copy_part(x.down, dn_t, dn + static_cast<size_t>(e) * dn_bytes, what + " expert down"));
    }
    d.gate_up = {gu, gu_t, gu_bytes, 2 * F, E};
    d.down = {dn, dn_t, dn_bytes, E, F};
    if (h.shared) {
      const HostMatrix gate_up[] = {h.shared->gate, h.shared->up};
      RILL_ASSIGN_OR_RETURN(d.shared_gate_up, place_in_act(gate_up, 2, what + " shared expert"));
      RILL_ASSIGN_OR_RETURN(d.shared_down, place_in_act(&h.shared->down, 1, what + " shared expert down"));
      if (p.shared_gate) {
        RILL_ASSIGN_OR_RETURN(d.shared_gate, place_in_act(&h.shared_gate, 1, what + " shared expert gate"));
      }
    }
    moes_.push_back(d);
    return MoeWeight{p, &moes_.back()};
  }

  Status place_model(const std::function<Status()>& place_all) override {
    if (pass_ != Pass::kDirect || model_.data()) return Error{"CUDA backend: one place_model() per backend"};
    const size_t n_weights = weights_.size(), n_ropes = ropes_.size(), n_moes = moes_.size();
    pass_ = Pass::kSizing;
    model_used_ = 0;
    const Status sized = place_all();
    weights_.resize(n_weights);  // the sizing pass's records go
    ropes_.resize(n_ropes);
    moes_.resize(n_moes);
    pass_ = Pass::kDirect;
    RILL_TRY(sized);
    RILL_ASSIGN_OR_RETURN(model_, cuda::DeviceBuffer::allocate(std::max<size_t>(model_used_, 1), "the model weights"));
    pass_ = Pass::kPlacing;
    model_used_ = 0;
    const Status placed = place_all();
    pass_ = Pass::kDirect;
    fp8_staging_ = {};
    return placed;
  }

  Status reserve(const StepLimits& limits) override {
    cuda::Arena sizing;
    carve(sizing, limits);
    RILL_ASSIGN_OR_RETURN(scratch_,
                          cuda::DeviceBuffer::allocate(std::max<size_t>(sizing.used(), 1), "backend scratch"));
    cuda::Arena real(scratch_.data());
    carve(real, limits);
    return Status::Ok();
  }

  // The scratch every op needs within `limits` (reserve()'s, or from a
  // runtime's arena: carve_cuda_scratch).
  void carve(cuda::Arena& a, const StepLimits& limits, const CudaChanLimits& chan = {}) {
    partial_ = a.take<float>(cuda::attention_partial_floats(limits.max_tokens, limits.n_head, limits.head_dim));
    shifted_pos_ = a.take<int32_t>(static_cast<size_t>(limits.max_tokens));  // rope_store_kv's pos_offset
    // Rotated KV's queries and outputs (2 f32 rows a token: 1/16 of the
    // partials above at head_dim 128), carved for every type: the limits
    // do not name the KV types, and a model may store any of them.
    rotation_ = a.take<float>(cuda::attention_rotation_floats(limits.max_tokens, limits.n_head, limits.head_dim));
    const CudaWeight* table = limits.embedding ? &record(*limits.embedding) : nullptr;
    const CudaWeight* head = limits.lm_head ? &record(*limits.lm_head) : nullptr;
    int64_t layer_max = 0, quant_cols = 0;
    for (const CudaWeight& w : weights_) {
      if (&w != table && &w != head && cuda::quant_supported(w.w.dtype)) layer_max = std::max(layer_max, w.elems);
      if (&w != table && cuda::quant_mma_supported(w.w.dtype)) quant_cols = std::max(quant_cols, w.cols);
    }
    const bool quant_head = head && cuda::quant_supported(head->w.dtype);
    qscratch_.carve(a, act_, limits.max_tokens, layer_max, quant_head ? limits.lm_head->rows : 0,
                    quant_head ? limits.lm_head->cols : 0, limits.max_head_tokens, invariant_, quant_cols);
    int64_t fp8_cols = 0;  // the FP8 GEMM's activations: the widest FP8 matrix's rows
    for (const CudaWeight& w : weights_) {
      if (w.w.dtype == cuda::kFp8Rows) fp8_cols = std::max(fp8_cols, w.cols);
    }
    if (fp8_cols > 0 && !invariant_) {
      fp8scratch_.carve(a, std::max<int64_t>(limits.max_tokens, limits.max_head_tokens), fp8_cols);
    }
    if (!moes_.empty()) moe_.carve(a, limits.max_tokens);
    index_keys_ = limits.max_index_keys;
    index_scores_ = index_keys_ > 0 ? a.take<float>(static_cast<size_t>(cuda::kIndexBlocks * index_keys_)) : nullptr;
    carve_chan(a, limits, chan);
  }

  // k4c (CudaChanLimits): the step's q8_0 K and V rows, the plan's arrays
  // (kv_chan_step.h) and the reference attention's scores, for at most
  // chan.max_score_floats floats (the attention goes in chunks of
  // chan_.chunk tokens: a query's scores take max_keys floats a head).
  void carve_chan(cuda::Arena& a, const StepLimits& limits, const CudaChanLimits& chan) {
    chan_ = {};
    if (chan.max_width <= 0) return;
    const auto T = static_cast<size_t>(limits.max_tokens);
    const size_t row = row_bytes(cpu::kKvChanTailType, chan.max_width);
    chan_.step_k = a.take<uint8_t>(T * row);
    chan_.step_v = a.take<uint8_t>(T * row);
    chan_.max_units = cuda::chan_max_units(limits.max_tokens, limits.max_tokens);
    const auto U = static_cast<size_t>(chan_.max_units);
    chan_.rows = a.take<const uint8_t*>(U * cpu::kKvChanTokens);
    chan_.dst = a.take<uint8_t*>(U);
    chan_.sequence_start = a.take<uint8_t>(U);
    chan_.n_units = a.take<int32_t>(1);
    chan_.units = a.take<int32_t>(2 * U);
    // Per sequence: a decode graph's step names up to T + 1 (CudaModelBase::compute).
    chan_.c0 = a.take<int32_t>(T + 1);
    chan_.tail_k = a.take<const uint8_t*>(T + 1);
    chan_.tail_v = a.take<const uint8_t*>(T + 1);
    chan_.keys = static_cast<int32_t>(chan.max_keys);
    // The fast kernel (attention_chan.h chan_attention_fast) for a head_dim
    // it has, unless RILL_K4C_ATTENTION=ref asks for the reference (the
    // CPU's bits; 4-17x slower end to end, docs/perf.md): its split
    // partials (at most 64 MiB of them: 126 tokens a chunk for
    // Llama-3.1-8B, a B=64 decode in one) instead of the reference's scores.
    const char* which = std::getenv("RILL_K4C_ATTENTION");
    chan_.fast = !(which && std::strcmp(which, "ref") == 0) && cuda::chan_attention_fast_supported(limits.head_dim);
    // Its one-phase warp softmax for decode unless RILL_K4C_ATTENTION=rows.
    chan_.warp_softmax = chan_.fast && !(which && std::strcmp(which, "rows") == 0);
    // Prefill-like steps on the tensor cores (chan_attention_flash) unless
    // RILL_K4C_ATTENTION=tiles keeps them on the fast kernel's token tiles.
    chan_.flash = chan_.fast && !(which && std::strcmp(which, "tiles") == 0) &&
                  cuda::chan_attention_flash_supported(limits.head_dim, 1);  // the group: checked a call
    // q4c blocks' batched loads unless RILL_K4C_FLASH_LOADS=plain (on an
    // H100 15% faster for k4c; chan_attention_flash keeps q4a's loads).
    const char* loads = std::getenv("RILL_K4C_FLASH_LOADS");
    chan_.flash_batched_loads = !(loads && std::strcmp(loads, "plain") == 0);
    if (chan_.fast) {
      const size_t per_token = cuda::chan_fast_partial_floats(1, limits.n_head, limits.head_dim);
      const size_t budget = std::min(chan.max_score_floats, size_t{16} << 20);
      chan_.chunk = static_cast<int32_t>(std::clamp<size_t>(budget / std::max<size_t>(per_token, 1), 1, T));
      chan_.partials = a.take<float>(static_cast<size_t>(chan_.chunk) * per_token);
      return;
    }
    const size_t per_token = static_cast<size_t>(limits.n_head) * static_cast<size_t>(chan.max_keys);
    chan_.chunk =
        static_cast<int32_t>(std::clamp<size_t>(chan.max_score_floats / std::max<size_t>(per_token, 1), 1, T));
    chan_.scores = a.take<float>(static_cast<size_t>(chan_.chunk) * per_token);
  }

  Result<Buffer> allocate(size_t bytes, const std::string& what) override {
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
      return Error{cuda::cuda_error_text(e, ("allocating " + what).c_str())};
    }
    // Cleared on the backend's stream, which is non-blocking: a cudaMemset
    // (the legacy stream, asynchronous to the host) could land after the
    // first copy_in or kernel on stream() and zero what they wrote.
    if (cudaError_t e = cudaMemsetAsync(p, 0, bytes, stream()); e != cudaSuccess) {
      cudaFree(p);
      return Error{cuda::cuda_error_text(e, ("clearing " + what).c_str())};
    }
    if (Status s = ctx_->synchronize(); !s.ok()) {
      cudaFree(p);
      return s.error();
    }
    return Buffer(p, bytes, free_device);
  }
  Status copy_in(void* dst, const void* src, size_t bytes) override {
    return copy(dst, src, bytes, cudaMemcpyHostToDevice, "copying to the device");
  }
  Status copy_out(void* dst, const void* src, size_t bytes) override {
    return copy(dst, src, bytes, cudaMemcpyDeviceToHost, "copying from the device");
  }

  void embed(const Weight& table, const int32_t* ids, int64_t n, Tensor out) override {
    assert(out.dtype == DType::kF32 && out.is_dense() && out.cols == table.cols);
    const cuda::DeviceWeight& w = record(table).w;
    cuda::embed_rows_any(w.dtype, w.data, table.cols, ids, n, out.f32(), stream());
  }

  void rms_norm(Tensor x, const int32_t* row_ids, Vec w, float eps, float w_offset, Tensor out) override {
    assert(x.dtype == DType::kF32 && out.is_dense() && out.cols == x.cols);
    cuda::rms_norm(x.f32(), x.stride, row_ids, w.data, out.rows, x.cols, eps, w_offset, out.dtype, out.data, stream());
  }

  Status matmul(const Weight& w, Tensor x, Tensor y, bool accumulate, Vec bias) override {
    assert(x.dtype == act_ && x.is_dense() && x.cols == w.cols);
    assert(y.dtype == DType::kF32 && y.is_dense() && y.cols == w.rows && y.rows == x.rows);
    if (x.rows <= 0) return Status::Ok();
    const CudaWeight& rec = record(w);
    const cuda::DeviceWeight& d = rec.w;
    if (!rec.parts.empty()) {
      RILL_TRY(cuda::quant_matmul_parts(*gemm_, qscratch_, rec.parts.data(), static_cast<int>(rec.parts.size()), act_,
                                        x.data, x.rows, w.cols, y.f32(), accumulate, stream()));
    } else if (d.dtype == cuda::kFp8Rows) {
      RILL_TRY(cuda::fp8_matmul(*gemm_, qscratch_, fp8scratch_, d.data, act_, x.data, x.rows, w.rows, w.cols, y.f32(),
                                accumulate, stream()));
    } else if (cuda::quant_supported(d.dtype)) {
      RILL_TRY(cuda::quant_matmul(*gemm_, qscratch_, d.dtype, d.data, act_, x.data, x.rows, w.rows, w.cols, y.f32(),
                                  accumulate, stream()));
    } else {
      RILL_TRY(gemm_->matmul(act_, d.data, x.data, x.rows, w.rows, w.cols, y.f32(), accumulate));
    }
    if (bias) cuda::add_bias(y.f32(), bias.data, y.rows, y.cols, stream());
    return Status::Ok();
  }

  // Whether matmul_glu(w, x, .., gate_up, out) takes fp8_matmul_glu: FP8
  // weights, the shapes it reads, and fp8_glu_fusable.
  bool fp8_glu_route(const Weight& w, Tensor x, Tensor gate_up, Tensor out) {
    const CudaWeight& rec = record(w);
    return rec.parts.empty() && rec.w.dtype == cuda::kFp8Rows && x.dtype == act_ && x.is_dense() && x.cols == w.cols &&
           gate_up.dtype == DType::kF32 && gate_up.is_dense() && gate_up.rows == x.rows && gate_up.cols == w.rows &&
           out.is_dense() && out.rows == x.rows && 2 * out.cols == w.rows &&
           cuda::fp8_glu_fusable(*gemm_, fp8scratch_, act_, x.rows, w.rows, w.cols);
  }

  // FP8 weights where fp8_matmul would run the unscaled tensor-core GEMM
  // and a scale pass: the scales go into the GLU (cuda::fp8_matmul_glu, the
  // same bits); dense BF16 weights past kGemvMaxTokens tokens: gate/up in
  // bf16 (below); everything else is matmul then glu.
  Status matmul_glu(const Weight& w, Tensor x, Glu kind, Tensor gate_up, Tensor out) override {
    const CudaWeight& rec = record(w);
    if (fp8_glu_route(w, x, gate_up, out)) {
      return cuda::fp8_matmul_glu(*gemm_, fp8scratch_, rec.w.data, act_, x.data, x.rows, w.rows, w.cols,
                                  kind == Glu::kGeluTanh, gate_up.f32(), out.dtype, out.data, stream());
    }
    // Dense BF16 weights at more than kGemvMaxTokens tokens (outside
    // batch-invariant mode, where every token's matmuls already go through
    // cuBLASLt): the GEMM writes gate/up in the weights' own dtype into the
    // scratch and the GLU reads that, half the bytes between the two (at
    // 2,048 tokens on the 8B, 235 MB written and read a layer less, which
    // counts at the H200's power cap). Each gate/up value is rounded once
    // to bf16 before the GLU, as a model run in bf16 rounds it (F16 keeps
    // f32 gate/up: 16-bit values past 65,504 would turn into infinities).
    // The scratch then holds bf16 bytes, not the F32 its Tensor names.
    // RILL_GLU_NARROW=0 turns the route off (glu_narrow.h).
    if (rec.parts.empty() && !invariant_ && act_ == DType::kBF16 && rec.w.dtype == act_ && cuda::glu_narrow_on() &&
        x.rows > cuda::kGemvMaxTokens && x.dtype == act_ && x.is_dense() && x.cols == w.cols &&
        gate_up.dtype == DType::kF32 && gate_up.is_dense() && gate_up.rows == x.rows && gate_up.cols == w.rows &&
        out.is_dense() && out.rows == x.rows && 2 * out.cols == w.rows) {
      RILL_TRY(gemm_->run_narrow(act_, rec.w.data, x.data, x.rows, w.rows, w.cols, gate_up.data));
      cuda::glu_narrow(kind == Glu::kGeluTanh, act_, gate_up.data, x.rows, out.cols, out.dtype, out.data, stream());
      return Status::Ok();
    }
    return Backend::matmul_glu(w, x, kind, gate_up, out);
  }

  // FP8 weights whose matmul quantizes h for the tensor-core GEMM: the
  // norm's kernel leaves that quantization in the FP8 scratch too
  // (rms_norm_fp8) and the matmul skips its own, with the same bits.
  // RILL_FP8_NORM_QUANT=0 keeps the two kernels (comparisons).
  Status norm_matmul(Tensor x, Vec w_norm, float eps, float w_offset, Tensor h, const Weight& w, Tensor y,
                     bool accumulate, Vec bias) override {
    if (!norm_quantizes(x, h, w, false) || y.dtype != DType::kF32 || !y.is_dense() || y.rows != h.rows ||
        y.cols != w.rows) {
      return Backend::norm_matmul(x, w_norm, eps, w_offset, h, w, y, accumulate, bias);
    }
    cuda::rms_norm_fp8(x.f32(), x.stride, w_norm.data, h.rows, h.cols, eps, w_offset, h.dtype, h.data, fp8scratch_.xq,
                       fp8scratch_.xs, stream());
    g_fused_norm_quant_calls.fetch_add(1, std::memory_order_relaxed);
    RILL_TRY(cuda::fp8_matmul(*gemm_, qscratch_, fp8scratch_, record(w).w.data, act_, h.data, h.rows, w.rows, w.cols,
                              y.f32(), accumulate, stream(), true));
    if (bias) cuda::add_bias(y.f32(), bias.data, y.rows, y.cols, stream());
    return Status::Ok();
  }
  Status norm_matmul_glu(Tensor x, Vec w_norm, float eps, float w_offset, Tensor h, const Weight& w, Glu kind,
                         Tensor gate_up, Tensor out) override {
    if (!norm_quantizes(x, h, w, true) || !fp8_glu_route(w, h, gate_up, out)) {
      return Backend::norm_matmul_glu(x, w_norm, eps, w_offset, h, w, kind, gate_up, out);
    }
    cuda::rms_norm_fp8(x.f32(), x.stride, w_norm.data, h.rows, h.cols, eps, w_offset, h.dtype, h.data, fp8scratch_.xq,
                       fp8scratch_.xs, stream());
    g_fused_norm_quant_calls.fetch_add(1, std::memory_order_relaxed);
    return cuda::fp8_matmul_glu(*gemm_, fp8scratch_, record(w).w.data, act_, h.data, h.rows, w.rows, w.cols,
                                kind == Glu::kGeluTanh, gate_up.f32(), out.dtype, out.data, stream(), true);
  }
  // Whether norm_matmul(_glu) of x into h for w takes rms_norm_fp8.
  bool norm_quantizes(Tensor x, Tensor h, const Weight& w, bool glu) {
    if (!fp8_norm_quant_ || !w.placed) return false;
    const CudaWeight& rec = record(w);
    return rec.parts.empty() && rec.w.dtype == cuda::kFp8Rows && x.dtype == DType::kF32 && h.dtype == act_ &&
           h.is_dense() && h.rows == x.rows && h.cols == x.cols && x.cols == w.cols &&
           cuda::rms_norm_fp8_supported(x.f32(), x.stride, x.cols, h.dtype, h.data) &&
           cuda::fp8_quantizes_x(*gemm_, fp8scratch_, act_, h.rows, w.rows, w.cols, glu);
  }

  Status moe_ffn(const MoeWeight& w, Tensor router_in, Tensor in, Tensor out, bool accumulate,
                 const StepMetadata& step) override {
    assert(in.dtype == act_ && in.is_dense() && out.dtype == DType::kF32 && out.is_dense() && in.rows == out.rows);
    assert(router_in.dtype == act_ && router_in.is_dense() && router_in.rows == in.rows);
    return moe_.forward(record(w), router_in.data, in.data, in.rows, step.n_tiles == 0, out.f32(), accumulate, *gemm_,
                        stream());
  }

  void add_bias(Tensor y, Vec b) override {
    assert(y.dtype == DType::kF32 && y.is_dense() && y.cols == b.n);
    cuda::add_bias(y.f32(), b.data, y.rows, y.cols, stream());
  }

  // The KV types the kernels take (cuda::kv_supported): K and V in one
  // dtype, each side rotated or not as cuda::kv_rotation_supported allows
  // (iq4_nl is rotated only: asked per side, since the rope kernel stores
  // such a type rotated whatever the flags say).
  static bool kv_readable(const KvCacheView& kv, int32_t head_dim) {
    return cuda::kv_supported(kv.dtype) && kv.v_type() == kv.dtype && kv.v_bytes() == kv.row_bytes &&
           cuda::kv_rotation_supported(kv.dtype, head_dim, kv.k_rotated) &&
           cuda::kv_rotation_supported(kv.dtype, head_dim, kv.v_rotated);
  }

  // k4c / k4a (KvCacheView::tail): q4c or q4a K blocks in their plane
  // (q4a: KvCacheView::k_widths, the layer's widths table on the device,
  // kv_chan.h), rotated iq4_nlh64 V rows in theirs, the tails and the
  // step's arrays on the device.
  static bool chan_kv(const KvCacheView& kv) { return kv_chan_k(kv.dtype); }
  static const uint8_t* alloc_widths(const KvCacheView& kv) {
    assert(kv.dtype != kKvQ4Alloc || kv.k_widths);
    return kv.dtype == kKvQ4Alloc ? kv.k_widths : nullptr;
  }

  // The plan (kv_chan_step.h) of this step and layer's k4c KV.
  cuda::ChanStepArgs chan_plan(const KvCacheView& kv, int32_t n_head_kv, int32_t head_dim, int kv_group,
                               const StepMetadata& step) const {
    assert(chan_.step_k && step.kv_tail && step.q_start && step.q_len && step.kv_len && step.n_seqs > 0);
    cuda::ChanStepArgs c;
    c.n_seqs = step.n_seqs;
    c.q_start = step.q_start;
    c.q_len = step.q_len;
    c.kv_len = step.kv_len;
    c.kv_tail = step.kv_tail;
    c.table_start = step.table_start;
    c.block_tables = step.block_tables[kv_group];
    c.tails = kv.tail;
    c.tail_stride = kv.tail_stride;
    c.step_k = chan_.step_k;
    c.step_v = chan_.step_v;
    c.k_blocks = static_cast<uint8_t*>(kv.k);
    c.k_block_stride = kv.block_stride;
    c.width = n_head_kv * head_dim;
    c.max_units = chan_.max_units;
    c.rows = chan_.rows;
    c.dst = chan_.dst;
    c.sequence_start = chan_.sequence_start;
    c.n_units = chan_.n_units;
    c.units = chan_.units;
    c.c0 = chan_.c0;
    c.tail_k = chan_.tail_k;
    c.tail_v = chan_.tail_v;
    return c;
  }

  void rope_store_kv(const RopeKvOp& op, const StepMetadata& step) override {
    const bool chan = op.n_head_kv > 0 && chan_kv(op.kv);
    assert(chan || (op.kv.block_stride == op.kv.row_bytes << op.kv.block_shift && kv_readable(op.kv, op.head_dim)));
    const CudaRope& rope = record(op.rope);
    cuda::RopeKvArgs a;
    a.qkv = op.qkv.f32();
    a.n_tokens = op.qkv.rows;
    a.qkv_stride = op.qkv.stride;
    a.n_head = op.n_head;
    a.n_head_kv = op.n_head_kv;
    a.head_dim = op.head_dim;
    a.positions = step.pos;
    if (op.pos_offset != 0) {  // q only (backend.h): the rotation's positions, shifted
      assert(op.n_head_kv == 0);
      cuda::shift_positions(step.pos, op.qkv.rows, op.pos_offset, shifted_pos_, stream());
      a.positions = shifted_pos_;
    }
    a.slots = step.slots[op.kv_group];
    a.q_norm = op.q_norm.data;
    a.k_norm = op.k_norm.data;
    a.norm_eps = op.norm_eps;
    a.norm_offset = op.norm_offset;
    a.inv_freq = rope.inv_freq;
    a.freq_divisor = rope.freq_divisor;
    a.rot_dim = static_cast<int32_t>(rope.table.rot_dim);
    a.interleaved = rope.table.interleaved;
    a.attn_factor = rope.table.attn_factor;
    a.ggml_theta_scale = rope.table.ggml_theta_scale;
    a.k_cache = op.kv.k;
    a.v_cache = op.kv.v;
    a.kv_dtype = op.kv.dtype;
    a.k_rotated = op.kv.k_rotated;
    a.v_rotated = op.kv.v_rotated;
    if (chan) {  // K's q8_0 rows for the encoder, V rotated to its rows and its plane (RopeKvArgs::k_rows)
      assert(op.kv.v_dtype == kKvIq4Nl64 && op.kv.v_rotated && !op.kv.k_rotated && op.kv.tail);
      a.kv_dtype = op.kv.v_dtype;
      a.k_rotated = false;
      a.k_rows = chan_.step_k;
      a.v_rows = chan_.step_v;
    }
    if (op.v_norm && op.n_head_kv > 0) {  // Gemma 4: V heads normed in place before the store
      cuda::head_rms_norm(op.qkv.f32(), op.qkv.stride, op.qkv.rows, int64_t{op.n_head + op.n_head_kv} * op.head_dim,
                          op.n_head_kv, op.head_dim, op.norm_eps, stream());
    }
    const bool calibrating = chan && op.kv.calibration;
    if (calibrating) copy_calibration_rows(op);
    cuda::rope_store_kv(a, stream());
    if (calibrating) add_calibration(op, step, a);
    if (chan) encode_chan_blocks(op, step);
  }

  // q4a's calibration pass (KvCacheView::calibration, set only then:
  // CudaModelBase::calibrate_kv, decode graphs off). Before the step's RoPE
  // its q/k/v rows are copied; after it, the copy goes through the same
  // RoPE kernel storing K in f32 (kv_dtype F32 into scratch rows, slot t
  // for token t): the queries and the f32 keys after RoPE, as the CPU's
  // rope_store_kv gathers them (docs/perf.md's plan: the ranges from f32
  // K rows, not from the q8_0 rows the encoder reads). Both are downloaded
  // and the statistics added on the host a token at a time in the step's
  // order (cpu::add_calibration_token, the CPU backend's), so they do not
  // depend on scheduling. The stream waits: a load-time pass of 256 tokens.
  void copy_calibration_rows(const RopeKvOp& op) {
    const auto n = static_cast<size_t>(op.qkv.rows), W = static_cast<size_t>(op.n_head_kv) * op.head_dim;
    const size_t qkv_bytes = n * static_cast<size_t>(op.qkv.stride) * sizeof(float);
    const size_t need = qkv_bytes + 2 * n * W * sizeof(float) + n * sizeof(int32_t);
    if (calib_buf_.size() < need) {  // an op returns no error: fatal, as RILL_CUDA_CHECK's
      auto b = cuda::DeviceBuffer::allocate(need, "q4a's calibration rows");
      if (!b.ok()) {
        std::fprintf(stderr, "%s\n", b.error().message.c_str());
        std::abort();
      }
      calib_buf_ = std::move(b).value();
    }
    calib_slots_.resize(n);
    for (size_t t = 0; t < n; ++t) calib_slots_[t] = static_cast<int32_t>(t);
    uint8_t* base = calib_buf_.as<uint8_t>();
    RILL_CUDA_CHECK(cudaMemcpyAsync(base, op.qkv.f32(), qkv_bytes, cudaMemcpyDeviceToDevice, stream()));
    RILL_CUDA_CHECK(cudaMemcpyAsync(base + qkv_bytes + 2 * n * W * sizeof(float), calib_slots_.data(),
                                    n * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  }

  // a: the step's RopeKvArgs (run already on op's rows).
  void add_calibration(const RopeKvOp& op, const StepMetadata& step, const cuda::RopeKvArgs& a) {
    KvCalibrationStats& stats = *op.kv.calibration;
    const int64_t n = op.qkv.rows, hd = op.head_dim, W = int64_t{op.n_head_kv} * hd;
    assert(static_cast<int64_t>(stats.query_energy.size()) == W && int64_t{op.n_head} * hd <= op.qkv.stride);
    const size_t qkv_floats = static_cast<size_t>(n * op.qkv.stride);
    auto* base = calib_buf_.as<float>();
    cuda::RopeKvArgs f = a;
    f.qkv = base;
    f.k_cache = base + qkv_floats;
    f.v_cache = base + qkv_floats + static_cast<size_t>(n * W);
    f.slots = reinterpret_cast<const int32_t*>(base + qkv_floats + static_cast<size_t>(2 * n * W));
    f.kv_dtype = DType::kF32;
    f.k_rotated = f.v_rotated = false;
    f.k_rows = f.v_rows = nullptr;
    cuda::rope_store_kv(f, stream());
    std::vector<float> q(qkv_floats), k(static_cast<size_t>(n * W));
    std::vector<int32_t> pos(static_cast<size_t>(n));
    cudaStream_t cs = stream();
    RILL_CUDA_CHECK(cudaMemcpyAsync(q.data(), f.qkv, q.size() * sizeof(float), cudaMemcpyDeviceToHost, cs));
    RILL_CUDA_CHECK(cudaMemcpyAsync(k.data(), f.k_cache, k.size() * sizeof(float), cudaMemcpyDeviceToHost, cs));
    RILL_CUDA_CHECK(cudaMemcpyAsync(pos.data(), step.pos, pos.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, cs));
    RILL_CUDA_CHECK(cudaStreamSynchronize(cs));
    for (int64_t t = 0; t < n; ++t) {
      cpu::add_calibration_token(stats.query_energy.data(), stats.block_range_sq.data(), stats.block_min.data(),
                                 stats.block_max.data(), q.data() + t * op.qkv.stride, k.data() + t * W,
                                 pos[static_cast<size_t>(t)], op.n_head, op.n_head_kv, hd);
    }
  }

  // k4c: every K block the step completes, encoded from the tail's and the
  // step's q8_0 rows into the pool (units planned on the device: the grid
  // is the most the step can complete, the rest skip).
  void encode_chan_blocks(const RopeKvOp& op, const StepMetadata& step) {
    const cuda::ChanStepArgs c = chan_plan(op.kv, op.n_head_kv, op.head_dim, op.kv_group, step);
    cuda::plan_chan_step(c, stream());
    chan_.planned = c;
    chan_.plan_live = true;
    cuda::ChanEncodeArgs e;
    e.rows = chan_.rows;
    e.dst = chan_.dst;
    e.sequence_start = chan_.sequence_start;
    e.row_dtype = cpu::kKvChanTailType;
    e.n_units = cuda::chan_max_units(op.qkv.rows, step.n_seqs);
    e.width = c.width;
    e.n_units_dev = chan_.n_units;
    e.widths = alloc_widths(op.kv);
    cuda::quantize_chan_blocks(e, stream());
  }

  // k4c: the fast attention (attention_chan.h chan_attention_fast) or,
  // with RILL_K4C_ATTENTION=ref or a head_dim it lacks, the reference
  // (chan_attention_parallel: a thread block per query and head, the
  // CPU's bits), in chunks of tokens,
  // its f32 outputs rotated back into op.out, then each sequence's tail
  // takes its newest partial block (after the attention that read it).
  void attention_chan(const AttentionOp& op, const StepMetadata& step) {
    // The step rows are the last rope_store_kv's: a layer reading another
    // layer's KV (tail_read_later) is refused at load (gemma_cuda_tails_refusal).
    assert(!op.tail_read_later);
    const cuda::ChanStepArgs c = chan_plan(op.kv, op.n_head_kv, op.head_dim, op.kv_group, step);
    // c0 and the tails of this layer: the plan rope_store_kv made, unless
    // another plan or a tail update came between (then planned again).
    if (!(chan_.plan_live && cuda::same_plan(c, chan_.planned))) cuda::plan_chan_step(c, stream());
    const auto n = static_cast<int32_t>(op.q.rows);
    const int64_t width = int64_t{op.n_head} * op.head_dim;
    cuda::ChanAttentionArgs a;
    a.q_stride = op.q.stride;
    a.scores = chan_.scores;
    a.partials = chan_.partials;
    a.max_keys = chan_.keys;
    a.block_tables = step.block_tables[op.kv_group];
    a.table_start = step.table_start;
    a.c0 = chan_.c0;
    a.q_start = step.q_start;
    a.tail_k = chan_.tail_k;
    a.tail_v = chan_.tail_v;
    a.step_k = chan_.step_k;
    a.step_v = chan_.step_v;
    a.k_blocks = static_cast<const uint8_t*>(op.kv.k);
    a.v_blocks = static_cast<const uint8_t*>(op.kv.v);
    a.block_stride = op.kv.block_stride;
    a.v_row_bytes = op.kv.v_row_bytes;
    a.v_block_stride = op.kv.v_row_bytes << op.kv.block_shift;
    a.n_head = op.n_head;
    a.n_head_kv = op.n_head_kv;
    a.head_dim = op.head_dim;
    a.window = op.window;
    a.scale = op.scale;
    a.softcap = op.softcap;
    a.k_widths = alloc_widths(op.kv);
    a.tile_tokens = n >= 4 * step.n_seqs;  // several tokens a sequence on average: prefill or verify
    a.warp_softmax = chan_.warp_softmax;
    a.rotated_dtype = op.out.dtype;
    const size_t out_row = row_bytes(op.out.dtype, width);
    // Prefill-like steps of 16-bit models on the tensor cores (f16
    // rounding; f32 checkpoints, parity runs, keep the fast kernel's f32).
    if (chan_.flash && a.tile_tokens && op.out.dtype != DType::kF32 && n <= 65535 &&
        cuda::chan_attention_flash_supported(op.head_dim, op.n_head / op.n_head_kv)) {
      a.n_tokens = n;  // the whole step at once: no partials to chunk
      a.q = op.q.f32();
      a.pos = step.pos;
      a.seq_of = step.seq_of;
      a.out = rotation_;
      a.rotated_out = op.out.data;
      a.flash_batched_loads = chan_.flash_batched_loads;
      cuda::chan_attention_flash(a, stream());
      cuda::update_chan_tails(c, stream());
      chan_.plan_live = false;
      return;
    }
    for (int32_t t0 = 0; t0 < n; t0 += chan_.chunk) {
      a.n_tokens = std::min(chan_.chunk, n - t0);
      a.q = op.q.f32() + t0 * op.q.stride;
      a.pos = step.pos + t0;
      a.seq_of = step.seq_of + t0;
      a.out = rotation_ + t0 * width;
      if (chan_.fast) {  // its combine rotates V's outputs back into op.out
        a.rotated_out = static_cast<uint8_t*>(op.out.data) + static_cast<size_t>(t0) * out_row;
        cuda::chan_attention_fast(a, stream());
      } else {
        cuda::chan_attention_parallel(a, stream());
      }
    }
    if (!chan_.fast) {
      cuda::rotate_heads_back(rotation_, width, n, op.n_head, op.head_dim, op.out.dtype, op.out.data, stream());
    }
    cuda::update_chan_tails(c, stream());
    chan_.plan_live = false;  // the tails the plan read have moved on
  }

  void attention(const AttentionOp& op, const StepMetadata& step) override {
    if (chan_kv(op.kv)) {
      assert(op.out.is_dense() && !op.sinks && op.out.stride == int64_t{op.n_head} * op.head_dim);
      attention_chan(op, step);
      return;
    }
    assert(op.kv.block_stride == op.kv.row_bytes << op.kv.block_shift && op.out.is_dense() &&
           kv_readable(op.kv, op.head_dim));
    cuda::AttentionArgs a;
    a.q = op.q.f32();
    a.q_stride = op.q.stride;
    a.n_head = op.n_head;
    a.n_head_kv = op.n_head_kv;
    a.head_dim = op.head_dim;
    a.scale = op.scale;
    a.softcap = op.softcap;
    a.window = op.window;
    a.sinks = op.sinks.data;
    a.k_cache = op.kv.k;
    a.v_cache = op.kv.v;
    a.kv_dtype = op.kv.dtype;
    a.block_shift = op.kv.block_shift;
    a.block_tables = step.block_tables[op.kv_group];
    a.table_start = step.table_start;
    a.seq_of = step.seq_of;
    a.pos = step.pos;
    a.decode_tokens = step.decode_tokens;
    a.n_decode = step.n_decode;
    a.max_decode_len = step.max_decode_len;
    a.partial = partial_;
    a.tiles = reinterpret_cast<const cuda::PrefillTile*>(step.tiles);
    a.n_tiles = step.n_tiles;
    a.out_dtype = op.out.dtype;
    a.out = op.out.data;
    a.k_rotated = op.kv.k_rotated;
    a.v_rotated = op.kv.v_rotated;
    a.n_tokens = static_cast<int32_t>(op.q.rows);
    a.rotation = rotation_;
    // Decode attention in one block shape at every grid (attention_decode.h),
    // so a token's bits do not depend on the batch, wherever the step's
    // matmuls do not either: batch-invariant mode, f32 activations (f32
    // checkpoints: the GEMV at every token count) and steps of up to
    // kGemvMaxTokens (quantized weights' and FP8's GEMV). Elsewhere the
    // matmuls already vary with the batch (cuBLASLt), and large grids may
    // take smaller blocks.
    const bool fixed_blocks = invariant_ || act_ == DType::kF32 || op.q.rows <= cuda::kGemvMaxTokens;
    cuda::attention(a, stream(), fixed_blocks ? 8 : 0, step.decode_work);
  }

  void glu(Glu kind, Tensor gate_up, Tensor out) override {
    assert(gate_up.dtype == DType::kF32 && gate_up.is_dense() && out.is_dense() && gate_up.cols == 2 * out.cols);
    if (kind == Glu::kSilu) {
      cuda::silu_mul(gate_up.f32(), out.rows, out.cols, out.dtype, out.data, stream());
    } else {
      cuda::gelu_tanh_mul(gate_up.f32(), out.rows, out.cols, out.dtype, out.data, stream());
    }
  }

  bool has_gemma4_ops() const override { return true; }

  void glu_split(Glu kind, Tensor gate, Tensor up, Tensor out) override {
    assert(gate.dtype == DType::kF32 && up.dtype == DType::kF32 && out.is_dense());
    assert(gate.cols == out.cols && up.cols == out.cols && gate.rows == out.rows && up.rows == out.rows);
    cuda::glu_split(kind == Glu::kGeluTanh, gate.f32(), gate.stride, up.f32(), up.stride, out.rows, out.cols, out.dtype,
                    out.data, stream());
  }

  void convert(Tensor x, Tensor out) override {
    assert(x.dtype == DType::kF32 && x.rows == out.rows && x.cols == out.cols);
    if (x.is_dense() && out.is_dense()) {
      cuda::convert_f32(x.f32(), x.rows * x.cols, out.dtype, out.data, stream());
    } else {
      cuda::convert_f32_rows(x.f32(), x.stride, x.rows, x.cols, out.dtype, out.data, out.stride, stream());
    }
  }

  void ordered_logits(const OrderedLogitsOp& op) override {
    assert(op.hidden.dtype == DType::kF32 && op.hidden.is_dense() && op.scores.is_dense() && op.logits.is_dense());
    assert(op.scores.cols == op.n_centroids && op.lm_head.cols == op.hidden.cols && op.lm_head.rows == op.logits.cols);
    const cuda::DeviceWeight& head = record(op.lm_head).w;
    cuda::ordered_logits(op.hidden.f32(), op.scores.f32(), head.dtype, head.data, op.hidden.rows, op.hidden.cols,
                         op.logits.cols, op.n_centroids, op.top_k, op.token_ordering, op.picked, op.dots,
                         op.logits.f32(), stream());
  }

  void softcap(Tensor x, float cap) override {
    assert(x.dtype == DType::kF32 && x.is_dense());
    cuda::softcap(x.f32(), x.rows * x.cols, cap, stream());
  }
  void scale(Tensor x, float s) override {
    assert(x.dtype == DType::kF32 && x.is_dense());
    cuda::scale(x.f32(), x.rows * x.cols, s, stream());
  }

  void post_norm_add(Tensor y, Vec w_post, Tensor x, Vec w_next, float eps, float w_offset, Tensor out) override {
    assert(y.is_dense() && x.is_dense() && y.rows == x.rows && y.cols == x.cols);
    cuda::post_norm_add(y.f32(), w_post.data, x.f32(), w_next.data, x.rows, x.cols, eps, w_offset, out.dtype, out.data,
                        stream());
  }

  // The hybrid CUDA model's kernels (cuda/gated_delta.h): gdn_conv (conv,
  // l2 norms, g, beta into mixed / g / beta), then gdn_recurrence, reading
  // each sequence's src state and writing its dst and saves in place.
  void gated_delta(const GatedDeltaOp& op, const StepMetadata& step) override {
    const RecurrentStep& rs = step.recurrent;
    assert(op.proj.dtype == DType::kF32 && op.mixed.is_dense() && op.g.is_dense() && op.beta.is_dense() &&
           op.core.is_dense() && op.mixed.cols == op.conv_dim() && op.core.cols == op.value_dim());
    cuda::GdnArgs ga;
    ga.n_k_heads = op.n_k_heads;
    ga.n_v_heads = op.n_v_heads;
    ga.head_k_dim = op.head_k_dim;
    ga.head_v_dim = op.head_v_dim;
    ga.conv_kernel = op.conv_kernel;
    ga.seqs = reinterpret_cast<const cuda::GdnSeq*>(rs.seqs);
    ga.n_seqs = rs.n_seqs;
    ga.saves = reinterpret_cast<const cuda::GdnSave*>(rs.saves);
    ga.tok_seq = rs.tok_seq;
    ga.n_tokens = op.proj.rows;
    ga.states = op.states;
    ga.state_stride = op.state_stride;
    ga.conv_w = op.conv_w.data;
    ga.neg_a = op.neg_a.data;
    ga.dt_bias = op.dt_bias.data;
    ga.proj = op.proj.f32();
    ga.proj_stride = op.proj.stride;
    ga.b_off = op.b_col;
    ga.a_off = op.a_col;
    ga.mixed = op.mixed.f32();
    ga.g = op.g.f32();
    ga.beta = op.beta.f32();
    ga.core = op.core.f32();
    ga.columns = cuda::gdn_columns();
    cuda::gdn_conv(ga, stream());
    cuda::gdn_recurrence(ga, stream());
  }

  void gated_rms_norm(Tensor core, Tensor z, Vec w, int32_t head_dim, float eps, Tensor out,
                      int32_t tiled_k_heads) override {
    assert(core.dtype == DType::kF32 && core.is_dense() && z.dtype == DType::kF32 && out.is_dense() &&
           tiled_k_heads == 0);
    (void)tiled_k_heads;
    cuda::gdn_gated_norm(core.f32(), z.f32(), z.stride, w.data, core.rows, static_cast<int32_t>(core.cols / head_dim),
                         head_dim, eps, out.dtype, out.data, stream());
  }

  void sigmoid_mul(Tensor x, Tensor gate, Tensor out) override {
    assert(x.dtype == DType::kF32 && x.is_dense() && gate.dtype == DType::kF32 && out.is_dense());
    cuda::sigmoid_gate_mul(x.f32(), gate.f32(), gate.stride, x.rows, x.cols, out.dtype, out.data, stream());
  }

  // --- Multi-head latent attention (cuda/latent_attention.h,
  // cuda/lightning_index.h): per-token kernels, batch invariant in either
  // mode. The indexer's LayerNorm is the one encoder op the MLA family needs.
  bool has_mla_ops() const override { return true; }

  void matmul_heads(const Weight& w, int32_t n_heads, Tensor x, int64_t x_step, Tensor y, int64_t y_step) override {
    const cuda::DeviceWeight& d = record(w).w;
    assert(d.dtype == DType::kF32 || d.dtype == DType::kF16 || d.dtype == DType::kBF16);
    assert(x.dtype == DType::kF32 && y.dtype == DType::kF32 && w.rows % n_heads == 0 && y.rows == x.rows);
    cuda::HeadsMatmulArgs a;
    a.w = d.data;
    a.w_dtype = d.dtype;
    a.n_heads = n_heads;
    a.R = w.rows / n_heads;
    a.C = w.cols;
    a.x = x.f32();
    a.x_stride = x.stride;
    a.x_step = x_step;
    a.y = y.f32();
    a.y_stride = y.stride;
    a.y_step = y_step;
    a.n_tokens = x.rows;
    cuda::matmul_heads(a, stream());
  }

  void rope_store_latent(const LatentKvOp& op, const StepMetadata& step) override {
    assert(op.q.dtype == DType::kF32 && op.kv.dtype == DType::kF32 && op.kv.cols == op.kv_lora_rank + op.rope_dim);
    cuda::LatentStoreArgs a;
    a.q = op.q.f32();
    a.q_stride = op.q.stride;
    a.n_head = op.n_head;
    a.q_head_dim = op.q_head_dim;
    a.q_rope_col = op.q_rope_col;
    a.kv = op.kv.f32();
    a.kv_stride = op.kv.stride;
    a.kv_lora_rank = op.kv_lora_rank;
    a.rope_dim = op.rope_dim;
    a.kv_norm = op.kv_norm.data;
    a.norm_eps = op.norm_eps;
    a.rope = angles(record(op.rope));
    a.pos = step.pos;
    a.slots = step.slots[op.kv_group];
    a.n_tokens = op.q.rows;
    a.cache = latent_cache(op.kv_cache);
    assert(2 * a.cache.plane >= op.kv_lora_rank + op.rope_dim);
    cuda::rope_store_latent(a, stream());
  }

  void latent_attention(const LatentAttentionOp& op, const StepMetadata& step) override {
    assert(op.q_latent.dtype == DType::kF32 && op.q_rope.dtype == DType::kF32 && op.out.dtype == DType::kF32);
    assert(op.kv_lora_rank + op.rope_dim <= cuda::kLatentMaxRow);
    cuda::LatentAttentionArgs a;
    a.q_latent = op.q_latent.f32();
    a.q_latent_stride = op.q_latent.stride;
    a.q_rope = op.q_rope.f32();
    a.q_rope_stride = op.q_rope.stride;
    a.q_rope_step = op.q_rope_step;
    a.out = op.out.f32();
    a.out_stride = op.out.stride;
    a.n_head = op.n_head;
    a.kv_lora_rank = op.kv_lora_rank;
    a.rope_dim = op.rope_dim;
    a.scale = op.scale;
    a.cache = latent_cache(op.kv);
    a.pos = step.pos;
    a.seq_of = step.seq_of;
    a.table_start = step.table_start;
    a.block_tables = step.block_tables[op.kv_group];
    a.selected = op.selected;
    a.n_selected = op.n_selected;
    a.selected_stride = op.selected_stride;
    a.n_tokens = step.n_tokens;
    cuda::latent_attention(a, stream());
  }

  void lightning_index(const LightningIndexOp& op, const StepMetadata& step) override {
    assert(op.q.dtype == DType::kF32 && op.k.dtype == DType::kF32 && op.w.dtype == DType::kF32);
    assert(index_scores_ && "lightning_index: reserve() with StepLimits::max_index_keys");
    cuda::LightningIndexArgs a;
    a.q = op.q.f32();
    a.q_stride = op.q.stride;
    a.k = op.k.f32();
    a.k_stride = op.k.stride;
    a.w = op.w.f32();
    a.w_stride = op.w.stride;
    a.n_head = op.n_head;
    a.head_dim = op.head_dim;
    a.score_scale = op.score_scale;
    a.weight_scale = op.weight_scale;
    a.rope = angles(record(op.rope));
    a.key_col = op.key_col;
    a.topk = op.topk;
    a.selected = op.selected;
    a.n_selected = op.n_selected;
    a.cache = latent_cache(op.kv);
    assert(op.key_col + op.head_dim <= 2 * a.cache.plane);
    a.pos = step.pos;
    a.seq_of = step.seq_of;
    a.table_start = step.table_start;
    a.block_tables = step.block_tables[op.kv_group];
    a.slots = step.slots[op.kv_group];
    a.n_tokens = step.n_tokens;
    a.scores = index_scores_;
    a.max_keys = index_keys_;
    cuda::lightning_index(a, stream());
  }

  void layer_norm(Tensor x, Vec w, Vec b, float eps, Tensor out) override {
    assert(x.dtype == DType::kF32 && out.dtype == DType::kF32 && out.cols == x.cols && out.rows == x.rows);
    assert(w.n == x.cols && b.n == x.cols);
    cuda::layer_norm(x.f32(), x.stride, w.data, b.data, x.rows, x.cols, eps, out.f32(), out.stride, stream());
  }

 private:
  enum class Pass { kDirect, kSizing, kPlacing };

  cudaStream_t stream() const { return ctx_->stream(); }

  // Device memory for `bytes` of placed data: a buffer of its own outside
  // place_model(), the model buffer's next piece in its placing pass, null
  // in its sizing pass (nothing is copied).
  Result<uint8_t*> take(size_t bytes, const std::string& what) {
    const size_t at = (model_used_ + cuda::Arena::kAlign - 1) / cuda::Arena::kAlign * cuda::Arena::kAlign;
    switch (pass_) {
      case Pass::kSizing:
        model_used_ = at + bytes;
        return static_cast<uint8_t*>(nullptr);
      case Pass::kPlacing:
        if (at + bytes > model_.size()) return Error{what + ": placed differently in the sizing pass"};
        model_used_ = at + bytes;
        return model_.as<uint8_t>() + at;
      case Pass::kDirect:
        break;
    }
    RILL_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(bytes, what));
    placed_.push_back(std::move(buf));
    return placed_.back().as<uint8_t>();
  }

  // parts' rows in the activation dtype (never quantized or FP8: the MoE's
  // matrices), one after another; data null in place_model()'s sizing pass.
  Result<cuda::DeviceWeight> place_in_act(const HostMatrix* parts, int n_parts, const std::string& what) {
    size_t bytes = 0;
    for (int i = 0; i < n_parts; ++i) bytes += row_bytes(act_, parts[i].cols) * static_cast<size_t>(parts[i].rows);
    RILL_ASSIGN_OR_RETURN(uint8_t* const dev, take(bytes, what));
    uint8_t* at = dev;
    for (int i = 0; i < n_parts && dev; ++i) {
      RILL_TRY(copy_part(parts[i], act_, at, what));
      at += row_bytes(act_, parts[i].cols) * static_cast<size_t>(parts[i].rows);
    }
    return cuda::DeviceWeight{dev, act_};
  }

  // p's rows packed into dst in dtype t: straight from the host when the
  // dtypes agree (strided rows in one 2-D copy), else converted on the host
  // in chunks of rows.
  Status copy_part(const HostMatrix& p, DType t, uint8_t* dst, const std::string& what) {
    const size_t dst_row = row_bytes(t, p.cols);
    const auto rows = static_cast<size_t>(p.rows);
    if (p.dtype == t) {
      if (p.row_stride == dst_row) return upload(dst, p.data, dst_row * rows, what);
      const cudaError_t e =
          cudaMemcpy2DAsync(dst, dst_row, p.data, p.row_stride, dst_row, rows, cudaMemcpyHostToDevice, stream());
      if (e != cudaSuccess) return upload_error(e, what);
      return ctx_->synchronize();
    }
    constexpr size_t kChunkBytes = size_t{16} << 20;
    const size_t chunk_rows = std::max<size_t>(1, kChunkBytes / dst_row);
    std::vector<float> tmp;
    for (size_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const size_t n = std::min(chunk_rows, rows - r0);
      staging_.resize(n * dst_row);
      for (size_t r = 0; r < n; ++r) {
        const auto* src = static_cast<const uint8_t*>(p.data) + (r0 + r) * p.row_stride;
        convert_row(src, p.dtype, p.cols, t, tmp, staging_.data() + r * dst_row);
      }
      RILL_TRY(upload(dst + r0 * dst_row, staging_.data(), n * dst_row, what));
    }
    staging_.clear();
    staging_.shrink_to_fit();
    return Status::Ok();
  }

  // p's rows as FP8 rows at dst: uploaded in their own dtype (F32, F16,
  // BF16: one rounding, to e4m3) or else the activation dtype to a device
  // staging buffer (grown as needed, freed when placement ends), then
  // quantized there.
  Status quantize_part(const HostMatrix& p, uint8_t* dst, float* scales, const std::string& what) {
    const DType stage = dtype_info(p.dtype).quantized ? act_ : p.dtype;
    const size_t bytes = row_bytes(stage, p.cols) * static_cast<size_t>(p.rows);
    if (fp8_staging_.size() < bytes) {
      fp8_staging_ = {};
      RILL_ASSIGN_OR_RETURN(fp8_staging_, cuda::DeviceBuffer::allocate(bytes, "the FP8 quantization staging"));
    }
    RILL_TRY(copy_part(p, stage, fp8_staging_.as<uint8_t>(), what));
    cuda::quantize_fp8_rows(stage, fp8_staging_.data(), p.rows, p.cols, dst, scales, stream());
    return ctx_->synchronize();
  }

  // p's stored e4m3 rows and scales (an FP8 checkpoint's, one scale per
  // row) as FP8 rows at dst, as they are: each row's header built on the
  // host, in chunks of rows.
  Status upload_fp8_part(const HostMatrix& p, uint8_t* dst, float* scales, const std::string& what) {
    const size_t dst_row = cuda::fp8_row_bytes(p.cols), cols = static_cast<size_t>(p.cols);
    const auto rows = static_cast<size_t>(p.rows);
    const size_t chunk_rows = std::max<size_t>(1, (size_t{16} << 20) / dst_row);
    for (size_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      const size_t n = std::min(chunk_rows, rows - r0);
      staging_.assign(n * dst_row, 0);
      for (size_t r = 0; r < n; ++r) {
        std::memcpy(staging_.data() + r * dst_row, p.e4m3_scales + r0 + r, 4);
        std::memcpy(staging_.data() + r * dst_row + cuda::kFp8RowHeader, p.e4m3 + (r0 + r) * cols, cols);
      }
      RILL_TRY(upload(dst + r0 * dst_row, staging_.data(), n * dst_row, what));
    }
    staging_.clear();
    staging_.shrink_to_fit();
    return upload(scales, p.e4m3_scales, rows * 4, what);
  }

  // Host bytes to the device, complete on return. On stream(), not with
  // cudaMemcpy: from pageable memory that returns once the bytes are
  // staged, with the DMA still queued on the legacy stream, which the
  // non-blocking stream()'s kernels do not wait for.
  Status upload(void* dst, const void* src, size_t bytes, const std::string& what) {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()); e != cudaSuccess) {
      return upload_error(e, what);
    }
    return ctx_->synchronize();
  }

  Status copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream()); e != cudaSuccess) {
      return Error{cuda::cuda_error_text(e, what)};
    }
    return ctx_->synchronize();
  }

  std::unique_ptr<cuda::Context> owned_ctx_;
  cuda::Context* ctx_;
  std::unique_ptr<cuda::Gemm> owned_gemm_;
  cuda::Gemm* gemm_;
  DType act_;
  bool invariant_;
  Pass pass_ = Pass::kDirect;
  cuda::DeviceBuffer model_;  // place_model()'s weights, vectors and RoPE tables
  size_t model_used_ = 0;
  std::deque<cuda::DeviceBuffer> placed_;  // what was placed outside place_model()
  std::deque<CudaWeight> weights_;         // deques: records stay put as more are placed
  std::deque<CudaRope> ropes_;
  std::deque<CudaMoeWeights> moes_;
  CudaMoe moe_;  // the MoE layers' scratch and kernels (one layer at a time; reserve() after placing them)
  std::vector<uint8_t> staging_;    // host conversions while placing
  bool fp8_;                        // CudaBackendOptions::fp8_weights
  bool fp8_norm_quant_ = true;      // norm_matmul(_glu) may take rms_norm_fp8 (RILL_FP8_NORM_QUANT)
  cuda::DeviceBuffer fp8_staging_;  // a part in act_ before quantize_part
  cuda::DeviceBuffer scratch_;
  float* partial_ = nullptr;
  int32_t* shifted_pos_ = nullptr;  // [max_tokens]: rope_store_kv's positions + pos_offset
  float* rotation_ = nullptr;       // cuda::attention_rotation_floats of the limits
  // q4a's calibration pass only (copy_calibration_rows): the step's q/k/v
  // rows copied, their f32 K and V rows and the identity slots; the slots'
  // host copy, alive until the pass's download waits.
  cuda::DeviceBuffer calib_buf_;
  std::vector<int32_t> calib_slots_;
  float* index_scores_ = nullptr;  // lightning_index(): [kIndexBlocks, index_keys_]
  // k4c's scratch (carve_chan): the plan's outputs, the step's rows, scores.
  struct ChanScratch {
    uint8_t* step_k = nullptr;  // [max_tokens] q8_0 rows each (RopeKvArgs::k_rows / v_rows)
    uint8_t* step_v = nullptr;
    int32_t max_units = 0;  // the plan's room (cuda::chan_max_units of max_tokens)
    const uint8_t** rows = nullptr;
    uint8_t** dst = nullptr;
    uint8_t* sequence_start = nullptr;
    int32_t* n_units = nullptr;
    int32_t* units = nullptr;
    int32_t* c0 = nullptr;  // [max_tokens + 1] (a sequence per token at most, and a graph's padding)
    const uint8_t** tail_k = nullptr;
    const uint8_t** tail_v = nullptr;
    float* scores = nullptr;          // [chunk, n_head, keys] (the reference kernel's)
    float* partials = nullptr;        // chan_fast_partial_floats(chunk, ...) (the fast kernel's)
    bool fast = false;                // chan_attention_fast, not chan_attention_parallel
    bool warp_softmax = false;        // ChanAttentionArgs::warp_softmax (off: RILL_K4C_ATTENTION=rows)
    bool flash = false;               // chan_attention_flash for prefill-like steps (off: RILL_K4C_ATTENTION=tiles)
    bool flash_batched_loads = true;  // ChanAttentionArgs::flash_batched_loads (RILL_K4C_FLASH_LOADS=plain: off)
    int32_t keys = 0, chunk = 0;
    // The plan the outputs above hold (encode_chan_blocks made it), live
    // until update_chan_tails moves the tails it read: attention_chan
    // reuses it for the same layer and step instead of planning again. As
    // host state it is decided once when a decode graph is captured, the
    // same calls in the same order as every replay.
    cuda::ChanStepArgs planned;
    bool plan_live = false;
  } chan_;
  int64_t index_keys_ = 0;
  cuda::QuantScratch qscratch_;
  cuda::Fp8Scratch fp8scratch_;
};

Status check_options(const CudaBackendOptions& options) {
  if (options.act != DType::kF32 && options.act != DType::kF16 && options.act != DType::kBF16) {
    return Error{std::string("CUDA backend: activation dtype ") + std::string(dtype_name(options.act)) +
                 " is not F32, F16 or BF16"};
  }
  return Status::Ok();
}

}  // namespace

int64_t cuda_fused_norm_quant_calls() {
  return g_fused_norm_quant_calls.load(std::memory_order_relaxed);
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  RILL_TRY(check_options(options));
  if (!cuda::device_available()) return Error{"CUDA backend: no CUDA device"};
  RILL_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Context> ctx, cuda::Context::create(options.device));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(std::move(ctx), nullptr, nullptr, options));
}

Result<std::unique_ptr<Backend>> make_cuda_backend_on(cuda::Context& ctx, cuda::Gemm& gemm,
                                                      const CudaBackendOptions& options) {
  RILL_TRY(check_options(options));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(nullptr, &ctx, &gemm, options));
}

void carve_cuda_scratch(Backend& backend, cuda::Arena& arena, const StepLimits& limits, const CudaChanLimits& chan) {
  assert(std::strcmp(backend.name(), "cuda") == 0);
  static_cast<CudaBackend&>(backend).carve(arena, limits, chan);
}

}  // namespace rill
