// The CPU Backend (backend/backend.h): each op composes the CPU kernels of
// backend/cpu with the arithmetic the CPU families used before (cpu::HostOps'),
// so a family ported to Backend keeps llama.cpp's bits and its batch
// invariance:
//  - matmul: cpu::matmul / cpu::matmul_group (x quantized once for a fused
//    weight whose parts share an activation type); bias and accumulate as
//    the families' Linear: "h = W x; h += b; x += h" (h scratch);
//  - rms_norm: cpu::rms_norm (per row when gathering or strided; a row's
//    bits do not depend on its neighbours);
//  - rope_store_kv: per token, cpu::rms_norm over the heads, cpu::rope, then
//    the row stored as model/paged_kv_cache.cpp does (f32 copy or f16
//    round-to-nearest);
//  - attention: one attention_f16_rounded_batch (F16 KV) or cpu::attention
//    per sequence (F32 KV), exactly HostOps::attention_batch; quantized,
//    rotated or mixed K/V types (model/kv_types.h): attention_quant_batch,
//    after rope_store_kv quantized the rows with cpu::store_kv_row;
//  - gated_delta: the hybrid CPU model's arithmetic: the conv1d in place over
//    proj (cpu::causal_conv1d_silu_batch), beta and g per token, then
//    cpu::gated_delta_batch; a sequence's state is first zeroed or copied
//    from its src into its dst, and the kernels run in place on dst;
//  - gated_rms_norm: cpu::rms_norm per head (in place on core) then
//    cpu::silu_mul; sigmoid_mul: x * (1 / (1 + exp(-gate)));
//  - MLA (matmul_heads, rope_store_latent, latent_attention): per-head
//    cpu::matmul over gathered columns; cpu::rope / rms_norm per token; a
//    plain f32 softmax per (token, head) over the stored latent rows (or the
//    keys lightning_index selected: cpu::lightning_index);
//  - moe_ffn: backend/cpu/moe.h's cpu::moe_forward (the CPU MoE families'
//    arithmetic) over a cpu::HostOps on the backend's threads, into a
//    scratch added into out when accumulating (the families' "moe_out; x +=
//    moe_out");
//  - glu: silu_mul / gelu_tanh_mul per row (llama.cpp's ggml_vec_swiglu runs
//    per row too, and a row's SIMD/tail split then depends on F alone).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/attention_f16.h"
#include "backend/cpu/attention_quant.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/gated_delta.h"
#include "backend/cpu/host_ops.h"
#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/lightning_index.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ordered_logits.h"
#include "backend/cpu/quants.h"
#include "core/e4m3.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace rill {
namespace {

// A placed weight: views of its parts (the host data stays where it is).
struct CpuWeight {
  int n_parts = 0;
  cpu::WeightView parts[cpu::kMaxMatmulGroup];
  bool shared_x = false;  // one quantization of x serves every part (matmul_group)
};

const CpuWeight& record(const Weight& w) {
  return *static_cast<const CpuWeight*>(w.placed);
}
const RopeTable& record(const Rope& r) {
  return *static_cast<const RopeTable*>(r.placed);
}

// A placed MoE layer: views of its matrices, copies of its vectors.
struct CpuMoe {
  MoeParams p;
  MoeWeights w;
};

const CpuMoe& record(const MoeWeight& w) {
  return *static_cast<const CpuMoe*>(w.placed);
}

std::string shape(const HostMatrix& m) {
  return "[" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]";
}

// The shapes place_moe() takes (MoeFfn::create checks bound layers more fully).
Status check_moe(const HostMoe& h, const std::string& what) {
  const MoeParams& p = h.p;
  auto check = [&](const HostMatrix& m, int64_t rows, int64_t cols, const std::string& name) -> Status {
    if (m.data && m.rows == rows && m.cols == cols) return Status::Ok();
    return Error{what + ": the MoE " + name + " is " + shape(m) + ", expected [" + std::to_string(rows) + ", " +
                 std::to_string(cols) + "]"};
  };
  if (p.n_expert <= 0 || p.n_expert_used < 1 || p.n_expert_used > p.n_expert ||
      static_cast<int64_t>(h.experts.size()) != p.n_expert || (p.n_ff_shared > 0) != h.shared.has_value()) {
    return Error{what + ": an MoE layer of " + std::to_string(h.experts.size()) + " experts does not match its " +
                 "parameters (" + std::to_string(p.n_expert_used) + " of " + std::to_string(p.n_expert) + ")"};
  }
  RILL_TRY(check(h.router, p.n_expert, p.n_embd, "router"));
  auto ffn = [&](const HostExpert& e, int64_t F, const std::string& name) -> Status {
    RILL_TRY(check(e.gate, F, p.n_embd, name + " gate"));
    RILL_TRY(check(e.up, F, p.n_embd, name + " up"));
    return check(e.down, p.n_embd, F, name + " down");
  };
  for (const HostExpert& e : h.experts) RILL_TRY(ffn(e, p.n_ff, "expert"));
  if (h.shared) {
    RILL_TRY(ffn(*h.shared, p.n_ff_shared, "shared expert"));
    if (p.shared_gate) RILL_TRY(check(h.shared_gate, 1, p.n_embd, "shared expert gate"));
  }
  return Status::Ok();
}

void free_host(void* p) {
  std::free(p);
}

// What a CPU Backend placed, shared with its decode lanes (make_cpu_lane).
// Deques: records stay put as more are placed.
struct Placements {
  std::deque<CpuWeight> weights;
  std::deque<std::vector<float>> vectors;
  std::deque<RopeTable> ropes;
  std::deque<CpuMoe> moes;
};

class CpuBackend final : public Backend {
 public:
  // On a pool of its own (n_threads), or on `shared` (not owned).
  CpuBackend(int n_threads, ThreadPool* shared, std::shared_ptr<Placements> placed)
      : own_pool_(shared ? nullptr : std::make_unique<ThreadPool>(n_threads)),
        pool_(shared ? *shared : *own_pool_),
        placed_(placed ? std::move(placed) : std::make_shared<Placements>()),
        moe_ops_(cpu::make_host_ops_on(pool_)) {}
  const std::shared_ptr<Placements>& placements() const { return placed_; }

  const char* name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::kF32; }
  AttentionRouting attention_routing(DType, int32_t) const override { return {}; }

  Result<Weight> place(const HostMatrix* parts, int n_parts, const std::string& what) override {
    if (n_parts < 1 || n_parts > cpu::kMaxMatmulGroup) {
      return Error{what + ": a weight of " + std::to_string(n_parts) + " parts (1 to " +
                   std::to_string(cpu::kMaxMatmulGroup) + " are placed)"};
    }
    CpuWeight w;
    w.n_parts = n_parts;
    int64_t rows = 0;
    for (int i = 0; i < n_parts; ++i) {
      const HostMatrix& p = parts[i];
      if (p.cols != parts[0].cols || p.rows <= 0 || p.cols % dtype_info(p.dtype).block_size != 0 ||
          p.row_stride < row_bytes(p.dtype, p.cols)) {
        return Error{what + ": part " + std::to_string(i) + " [" + std::to_string(p.rows) + ", " +
                     std::to_string(p.cols) + "] of " + std::string(dtype_name(p.dtype)) +
                     " does not fit the weight (equal columns, whole blocks, rows at least a row apart)"};
      }
      w.parts[i] = {p.dtype, p.rows, p.cols, p.data, p.row_stride};
      rows += p.rows;
    }
    w.shared_x = true;
    for (int i = 1; i < n_parts; ++i) {
      w.shared_x = w.shared_x && cpu::vec_dot_partner(w.parts[i].dtype) == cpu::vec_dot_partner(w.parts[0].dtype);
    }
    placed_->weights.push_back(w);
    return Weight{rows, parts[0].cols, &placed_->weights.back()};
  }

  Result<Vec> place_vector(const float* host, int64_t n, const std::string& what) override {
    if (n <= 0) return Error{what + ": an empty vector"};
    placed_->vectors.emplace_back(host, host + n);
    return Vec{placed_->vectors.back().data(), n};
  }

  Result<Rope> place_rope(const RopeTable& table) override {
    placed_->ropes.push_back(table);
    return Rope{table.rot_dim, &placed_->ropes.back()};
  }

  Result<MoeWeight> place_moe(const HostMoe& layer, const std::string& what) override {
    RILL_TRY(check_moe(layer, what));
    placed_->moes.push_back({layer.p, cpu::moe_weights(layer)});
    return MoeWeight{layer.p, &placed_->moes.back()};
  }

  Status reserve(const StepLimits& limits) override {
    std::vector<const WeightView*> moe_weights;
    for (const CpuMoe& m : placed_->moes) {
      moe_scratch_.reserve(m.p, limits.max_tokens);
      moe_out_.resize(std::max(moe_out_.size(), static_cast<size_t>(limits.max_tokens * m.p.n_embd)));
      cpu::collect_moe_weights(m.p, m.w, &moe_weights);
    }
    if (!moe_weights.empty()) {
      moe_ops_->reserve(moe_weights.data(), static_cast<int>(moe_weights.size()), limits.max_tokens);
    }
    size_t scratch = 0;
    int64_t max_rows = 0;  // of the weights that may accumulate: not the embedding or the LM head
    int64_t max_cols = 0;  // of every weight (ordered_logits() reads a row of a head)
    const void* embedding = limits.embedding ? limits.embedding->placed : nullptr;
    const void* lm_head = limits.lm_head ? limits.lm_head->placed : nullptr;
    for (const CpuWeight& w : placed_->weights) {
      int64_t rows = 0;
      for (int i = 0; i < w.n_parts; ++i) {
        const cpu::WeightView& p = w.parts[i];
        scratch = std::max(scratch, cpu::matmul_scratch_bytes(p.dtype, p.n_cols, limits.max_tokens));
        rows += p.n_rows;
      }
      if (&w != embedding && &w != lm_head) max_rows = std::max(max_rows, rows);
      max_cols = std::max(max_cols, w.parts[0].n_cols);
    }
    ordered_row_.resize(static_cast<size_t>(max_cols));
    heads_x_.resize(static_cast<size_t>(limits.max_tokens * limits.max_head_cols));
    scratch_.reserve(scratch);
    acc_.resize(static_cast<size_t>(limits.max_tokens * max_rows));
    seqs_.reserve(static_cast<size_t>(limits.max_tokens));  // at most one sequence per token
    const auto T = static_cast<size_t>(limits.max_tokens);  // at most one save per token
    conv_seqs_.reserve(T);
    delta_seqs_.reserve(T);
    conv_snaps_.reserve(T);
    delta_snaps_.reserve(T);
    return Status::Ok();
  }

  Result<Buffer> allocate(size_t bytes, const std::string& what) override {
    void* p = std::calloc(bytes > 0 ? bytes : 1, 1);
    if (!p) return Error{what + ": out of memory allocating " + std::to_string(bytes) + " bytes"};
    return Buffer(p, bytes, free_host);
  }
  Status copy_in(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status copy_out(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }

  void embed(const Weight& table, const int32_t* ids, int64_t n, Tensor out) override {
    assert(out.dtype == DType::kF32 && out.is_dense() && out.cols == table.cols);
    cpu::get_rows(record(table).parts[0], ids, n, out.f32());
  }

  void rms_norm(Tensor x, const int32_t* row_ids, Vec w, float eps, float w_offset, Tensor out) override {
    assert(x.dtype == DType::kF32 && out.dtype == DType::kF32 && out.cols == x.cols);
    if (!row_ids && x.is_dense() && out.is_dense()) {
      cpu::rms_norm(x.f32(), w.data, out.rows, x.cols, eps, out.f32(), w_offset);
      return;
    }
    for (int64_t r = 0; r < out.rows; ++r) {
      const auto* src = static_cast<const float*>(x.at(row_ids ? row_ids[r] : r, 0));
      cpu::rms_norm(src, w.data, 1, x.cols, eps, static_cast<float*>(out.at(r, 0)), w_offset);
    }
  }

  Status matmul(const Weight& w, Tensor x, Tensor y, bool accumulate, Vec bias) override {
    assert(x.dtype == DType::kF32 && x.is_dense() && x.cols == w.cols);
    assert(y.dtype == DType::kF32 && y.cols == w.rows && y.rows == x.rows);
    const int64_t n = x.rows;
    if (n <= 0) return Status::Ok();
    assert(!accumulate || static_cast<size_t>(n * w.rows) <= acc_.size());
    float* dst = accumulate ? acc_.data() : y.f32();
    const int64_t stride = accumulate ? w.rows : y.stride;
    const CpuWeight& cw = record(w);
    if (cw.n_parts == 1) {
      cpu::matmul(cw.parts[0], x.f32(), n, dst, pool_, scratch_, stride);
    } else {
      float* ys[cpu::kMaxMatmulGroup];
      int64_t strides[cpu::kMaxMatmulGroup];
      const cpu::WeightView* ws[cpu::kMaxMatmulGroup];
      int64_t col = 0;
      for (int i = 0; i < cw.n_parts; ++i) {
        ws[i] = &cw.parts[i];
        ys[i] = dst + col;
        strides[i] = stride;
        col += cw.parts[i].n_rows;
      }
      if (cw.shared_x) {
        cpu::matmul_group(ws, ys, cw.n_parts, x.f32(), n, pool_, scratch_, strides);
      } else {
        for (int i = 0; i < cw.n_parts; ++i) cpu::matmul(*ws[i], x.f32(), n, ys[i], pool_, scratch_, stride);
      }
    }
    if (bias) {
      assert(bias.n == w.rows);
      for (int64_t t = 0; t < n; ++t) cpu::add_inplace(dst + t * stride, bias.data, w.rows);
    }
    if (accumulate) {
      if (y.is_dense()) {
        cpu::add_inplace(y.f32(), acc_.data(), n * w.rows);
      } else {
        for (int64_t t = 0; t < n; ++t)
          cpu::add_inplace(static_cast<float*>(y.at(t, 0)), acc_.data() + t * w.rows, w.rows);
      }
    }
    return Status::Ok();
  }

  Status moe_ffn(const MoeWeight& w, Tensor router_in, Tensor in, Tensor out, bool accumulate,
                 const StepMetadata& step) override {
    (void)step;
    const CpuMoe& m = record(w);
    const int64_t n = in.rows, E = m.p.n_embd;
    assert(in.dtype == DType::kF32 && router_in.dtype == DType::kF32 && out.dtype == DType::kF32);
    assert(in.is_dense() && router_in.is_dense() && out.is_dense() && in.cols == E && out.cols == E);
    assert(router_in.rows == n && out.rows == n && out.data != in.data && out.data != router_in.data);
    if (!accumulate) {
      cpu::moe_forward(m.p, m.w, router_in.f32(), in.f32(), n, out.f32(), moe_scratch_, *moe_ops_);
      return Status::Ok();
    }
    assert(static_cast<size_t>(n * E) <= moe_out_.size());
    cpu::moe_forward(m.p, m.w, router_in.f32(), in.f32(), n, moe_out_.data(), moe_scratch_, *moe_ops_);
    cpu::add_inplace(out.f32(), moe_out_.data(), n * E);
    return Status::Ok();
  }

  void gated_delta(const GatedDeltaOp& op, const StepMetadata& step) override {
    const RecurrentStep& rs = step.recurrent;
    const int64_t cd = op.conv_dim(), nv = op.n_v_heads, K = op.conv_kernel;
    const int64_t conv_floats = cd * (K - 1);
    const int64_t layer_floats = conv_floats + nv * op.head_k_dim * op.head_v_dim;
    assert(op.proj.dtype == DType::kF32 && op.proj.cols >= cd && op.core.cols == op.value_dim());
    auto state = [&](int32_t id) { return op.states + static_cast<int64_t>(id) * op.state_stride; };
    for (int64_t t = 0; t < op.proj.rows; ++t) {
      const auto* row = static_cast<const float*>(op.proj.at(t, 0));
      float* beta = static_cast<float*>(op.beta.at(t, 0));
      float* g = static_cast<float*>(op.g.at(t, 0));
      for (int64_t i = 0; i < nv; ++i) {
        beta[i] = 1.0f / (1.0f + std::exp(-row[op.b_col + i]));
        const float a = row[op.a_col + i] + op.dt_bias.data[i];
        g[i] = op.neg_a.data[i] * (a > 20.0f ? a : std::log1p(std::exp(a)));  // softplus as torch's
      }
    }
    conv_snaps_.clear();
    delta_snaps_.clear();
    for (int32_t k = 0; k < rs.n_saves; ++k) {
      float* dst = state(rs.saves[k].state);
      conv_snaps_.push_back({rs.saves[k].after_token, dst});
      delta_snaps_.push_back({rs.saves[k].after_token, dst + conv_floats});
    }
    conv_seqs_.clear();
    delta_seqs_.clear();
    for (int32_t i = 0; i < rs.n_seqs; ++i) {
      const RecurrentSeq& q = rs.seqs[i];
      float* st = state(q.dst);
      if (q.src < 0) {
        std::memset(st, 0, static_cast<size_t>(layer_floats) * sizeof(float));
      } else if (q.src != q.dst) {
        std::memcpy(st, state(q.src), static_cast<size_t>(layer_floats) * sizeof(float));
      }
      auto* x = static_cast<float*>(op.proj.at(q.q_start, 0));
      conv_seqs_.push_back({x, q.q_len, st, conv_snaps_.data() + q.save_begin, q.n_saves});
      cpu::GatedDeltaSeq ds;
      ds.q = x;
      ds.k = x + op.key_dim();
      ds.v = x + 2 * op.key_dim();
      ds.g = static_cast<const float*>(op.g.at(q.q_start, 0));
      ds.beta = static_cast<const float*>(op.beta.at(q.q_start, 0));
      ds.out = static_cast<float*>(op.core.at(q.q_start, 0));
      ds.n_tokens = q.q_len;
      ds.state = st + conv_floats;
      ds.snapshots = delta_snaps_.data() + q.save_begin;
      ds.n_snapshots = q.n_saves;
      delta_seqs_.push_back(ds);
    }
    cpu::causal_conv1d_silu_batch(conv_seqs_.data(), static_cast<int>(conv_seqs_.size()), op.conv_w.data, cd, K,
                                  op.proj.stride, pool_);
    const cpu::GatedDeltaParams p{op.n_k_heads,   nv,          op.head_k_dim, op.head_v_dim,
                                  op.proj.stride, op.g.stride, op.core.stride};
    cpu::gated_delta_batch(delta_seqs_.data(), static_cast<int>(delta_seqs_.size()), p, pool_);
  }

  void gated_rms_norm(Tensor core, Tensor z, Vec w, int32_t head_dim, float eps, Tensor out,
                      int32_t tiled_k_heads) override {
    assert(core.dtype == DType::kF32 && z.dtype == DType::kF32 && out.dtype == DType::kF32);
    const int64_t width = core.cols, n_heads = width / head_dim;
    for (int64_t r = 0; r < core.rows; ++r) {
      auto* c = static_cast<float*>(core.at(r, 0));
      const auto* zr = static_cast<const float*>(z.at(r, 0));
      auto* o = static_cast<float*>(out.at(r, 0));
      cpu::rms_norm(c, w.data, n_heads, head_dim, eps, c);
      if (tiled_k_heads <= 0) {
        cpu::silu_mul(zr, c, o, width);
        continue;
      }
      const int64_t nk = tiled_k_heads, rr = n_heads / nk;
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t to = (h % rr) * nk + h / rr;
        cpu::silu_mul(zr + h * head_dim, c + h * head_dim, o + to * head_dim, head_dim);
      }
    }
  }

  void sigmoid_mul(Tensor x, Tensor gate, Tensor out) override {
    assert(x.dtype == DType::kF32 && gate.dtype == DType::kF32 && out.dtype == DType::kF32);
    for (int64_t r = 0; r < x.rows; ++r) {
      const auto* xr = static_cast<const float*>(x.at(r, 0));
      const auto* gr = static_cast<const float*>(gate.at(r, 0));
      auto* o = static_cast<float*>(out.at(r, 0));
      for (int64_t i = 0; i < x.cols; ++i) o[i] = xr[i] * (1.0f / (1.0f + std::exp(-gr[i])));
    }
  }

  void add_bias(Tensor y, Vec b) override {
    assert(y.dtype == DType::kF32 && y.cols == b.n);
    for (int64_t r = 0; r < y.rows; ++r) cpu::add_inplace(static_cast<float*>(y.at(r, 0)), b.data, b.n);
  }

  void rope_store_kv(const RopeKvOp& op, const StepMetadata& step) override {
    const int64_t hd = op.head_dim, q_width = op.n_head * hd, kv_width = op.n_head_kv * hd;
    assert(op.qkv.dtype == DType::kF32 && op.qkv.cols == q_width + 2 * kv_width);
    const bool plain = op.kv.plain();
    const RopeTable& table = record(op.rope);
    if (op.n_head_kv == 0) {  // q only: this layer reads another layer's KV
      for (int64_t t = 0; t < op.qkv.rows; ++t) {
        float* q = static_cast<float*>(op.qkv.at(t, 0));
        if (op.q_norm) cpu::rms_norm(q, op.q_norm.data, op.n_head, hd, op.norm_eps, q, op.norm_offset);
        const int32_t pos = step.pos[t] + op.pos_offset;
        cpu::rope(q, &pos, 1, op.n_head, hd, table);
        // Its queries read that layer's K channels as the storing layer's do.
        if (op.kv.calibration) add_query_energy(*op.kv.calibration, q, op.n_head, hd);
      }
      return;
    }
    assert(op.pos_offset == 0);  // only q-only layers rotate off their positions
    assert(op.kv.row_bytes == row_bytes(op.kv.dtype, kv_width) &&
           op.kv.v_bytes() == row_bytes(op.kv.v_type(), kv_width));
    const int32_t* slots = step.slots[op.kv_group];
    const int64_t mask = (int64_t{1} << op.kv.block_shift) - 1;
    // k4c: K and V rows are kept in q8_0 (the tail's rows) for this step's
    // attention, K encoded a block at a time below; V goes to the pool too.
    const bool chan = kv_chan_k(op.kv.dtype);
    assert(op.kv.dtype != kKvQ4Alloc || op.kv.k_widths);
    const size_t tail_row = row_bytes(cpu::kKvChanTailType, kv_width);
    ChanStepRows* chan_rows = nullptr;
    if (chan) {
      assert(op.kv.tail && step.kv_tail);
      chan_rows = &chan_step_[op.kv.tail];
      const auto n = static_cast<size_t>(op.qkv.rows) * tail_row;
      if (chan_rows->k.size() < n) {
        chan_rows->k.resize(n);
        chan_rows->v.resize(n);
      }
    }
    for (int64_t t = 0; t < op.qkv.rows; ++t) {
      float* q = static_cast<float*>(op.qkv.at(t, 0));
      float* k = q + q_width;
      float* v = k + kv_width;
      if (op.q_norm) cpu::rms_norm(q, op.q_norm.data, op.n_head, hd, op.norm_eps, q, op.norm_offset);
      if (op.k_norm) cpu::rms_norm(k, op.k_norm.data, op.n_head_kv, hd, op.norm_eps, k, op.norm_offset);
      if (op.v_norm) cpu::rms_norm(v, nullptr, op.n_head_kv, hd, op.norm_eps, v);
      cpu::rope(q, step.pos + t, 1, op.n_head, hd, table);
      cpu::rope(k, step.pos + t, 1, op.n_head_kv, hd, table);
      if (op.kv.calibration) add_calibration(*op.kv.calibration, q, k, step.pos[t], op.n_head, op.n_head_kv, hd);
      const int64_t slot = slots[t];
      const size_t at = static_cast<size_t>(slot >> op.kv.block_shift) * op.kv.block_stride +
                        static_cast<size_t>(slot & mask) * op.kv.row_bytes;
      uint8_t* kd = static_cast<uint8_t*>(op.kv.k) + at;
      if (!plain) {
        // Quantized / rotated / mixed KV: each side in its own type and row bytes.
        const size_t v_at = static_cast<size_t>(slot >> op.kv.block_shift) * op.kv.block_stride +
                            static_cast<size_t>(slot & mask) * op.kv.v_bytes();
        if (chan) {
          const size_t r = static_cast<size_t>(t) * tail_row;
          cpu::store_chan_tail_rows(k, v, op.kv.v_rotated, op.n_head_kv, hd, chan_rows->k.data() + r,
                                    chan_rows->v.data() + r);
        } else {
          cpu::store_kv_row(op.kv.dtype, op.kv.k_rotated, k, kd, op.n_head_kv, hd);
        }
        cpu::store_kv_row(op.kv.v_type(), op.kv.v_rotated, v, static_cast<uint8_t*>(op.kv.v) + v_at, op.n_head_kv, hd);
        continue;
      }
      uint8_t* vd = static_cast<uint8_t*>(op.kv.v) + at;
      if (op.kv.dtype == DType::kF32) {
        std::memcpy(kd, k, op.kv.row_bytes);
        std::memcpy(vd, v, op.kv.row_bytes);
      } else {
        auto* kh = reinterpret_cast<uint16_t*>(kd);
        auto* vh = reinterpret_cast<uint16_t*>(vd);
        for (int64_t j = 0; j < kv_width; ++j) {
          kh[j] = f32_to_f16(k[j]);
          vh[j] = f32_to_f16(v[j]);
        }
      }
    }
    if (chan) encode_chan_blocks(op, step, chan_rows->k.data());
  }

  // q4a's calibration statistics (KvCalibrationStats) of one token at
  // position pos: q [n_head * hd] and k [n_head_kv * hd] after RoPE
  // (cpu::add_calibration_token, which the CUDA backend shares).
  static void add_calibration(KvCalibrationStats& s, const float* q, const float* k, int32_t pos, int64_t n_head,
                              int64_t n_head_kv, int64_t hd) {
    assert(static_cast<int64_t>(s.query_energy.size()) == n_head_kv * hd &&
           static_cast<int64_t>(s.block_min.size()) == n_head_kv * hd);
    cpu::add_calibration_token(s.query_energy.data(), s.block_range_sq.data(), s.block_min.data(), s.block_max.data(),
                               q, k, pos, n_head, n_head_kv, hd);
  }

  // The query part of add_calibration: q [n_head * hd] after RoPE, its
  // heads grouped onto the layer's KV heads (query_energy's width / hd).
  static void add_query_energy(KvCalibrationStats& s, const float* q, int64_t n_head, int64_t hd) {
    const auto n_head_kv = static_cast<int64_t>(s.query_energy.size()) / hd;
    assert(n_head_kv > 0 && n_head % n_head_kv == 0);
    cpu::add_calibration_queries(s.query_energy.data(), q, n_head, n_head_kv, hd);
  }

  // k4c: encodes every K block of 32 tokens the step completes, its rows
  // before the step from the sequence's tail, the others from step_k (q8_0
  // rows, decoded: the same values however the sequence was chunked); the
  // block at position 0 holds the sequence's first key on its grids
  // (quantize_chan_block's sequence_start).
  void encode_chan_blocks(const RopeKvOp& op, const StepMetadata& step, const uint8_t* step_k) {
    constexpr int64_t kT = cpu::kKvChanTokens;
    const int64_t W = int64_t{op.n_head_kv} * op.head_dim;
    const size_t tail_row = row_bytes(cpu::kKvChanTailType, W);
    // One unit per completed block: [seq, block start).
    chan_units_.clear();
    for (int32_t s = 0; s < step.n_seqs; ++s) {
      const int64_t c1 = step.kv_len[s], c0 = c1 - step.q_len[s];
      for (int64_t g = c0 - c0 % kT; g + kT <= c1; g += kT) chan_units_.push_back({s, g});
    }
    pool_.parallel_for(static_cast<int64_t>(chan_units_.size()), 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> rows;
      rows.resize(static_cast<size_t>(kT * W));
      for (int64_t u = begin; u < end; ++u) {
        const auto [s, g] = chan_units_[static_cast<size_t>(u)];
        const int64_t c0 = step.kv_len[s] - step.q_len[s];
        const uint8_t* tail_k = static_cast<const uint8_t*>(op.kv.tail) +
                                static_cast<size_t>(step.kv_tail[s]) * op.kv.tail_stride + sizeof(KvTailHeader);
        for (int64_t r = 0; r < kT; ++r) {
          const int64_t pos = g + r;
          const uint8_t* src = pos < c0 ? tail_k + static_cast<size_t>(r) * tail_row
                                        : step_k + static_cast<size_t>(step.q_start[s] + pos - c0) * tail_row;
          cpu::dequantize_row(cpu::kKvChanTailType, src, rows.data() + r * W, W);
        }
        const int32_t block = step.block_tables[op.kv_group][step.table_start[s] + g / kT];
        uint8_t* dst = static_cast<uint8_t*>(op.kv.k) + static_cast<size_t>(block) * op.kv.block_stride;
        if (op.kv.dtype == kKvQ4Alloc) {
          cpu::quantize_alloc_block(rows.data(), W, W, op.kv.k_widths, dst, /*sequence_start=*/g == 0);
        } else {
          cpu::quantize_chan_block(rows.data(), W, W, dst, /*sequence_start=*/g == 0);
        }
      }
    });
  }

  // k4c: attention over the quantized blocks and the q8_0 keys and values
  // of each query's own block, then each sequence's tail takes its newest
  // partial block from the step's rows (unless a later layer reads them:
  // op.tail_read_later).
  void attention_chan(const AttentionOp& op, const StepMetadata& step, const cpu::AttentionParams& p) {
    constexpr int64_t kT = cpu::kKvChanTokens;
    const int64_t W = int64_t{op.n_head_kv} * op.head_dim;
    const size_t tail_row = row_bytes(cpu::kKvChanTailType, W);
    assert(op.kv.tail && step.kv_tail && chan_step_.count(op.kv.tail));
    const ChanStepRows& rows = chan_step_[op.kv.tail];
    // A tail: its header, kT K rows, kT V rows.
    auto tail_of = [&](int32_t s) {
      return static_cast<uint8_t*>(op.kv.tail) + static_cast<size_t>(step.kv_tail[s]) * op.kv.tail_stride;
    };
    chan_tails_.clear();
    for (int32_t s = 0; s < step.n_seqs; ++s) {
      cpu::ChanTail t;
      t.tail_k = tail_of(s) + sizeof(KvTailHeader);
      t.tail_v = t.tail_k + kT * tail_row;
      t.step_k = rows.k.data() + static_cast<size_t>(step.q_start[s]) * tail_row;
      t.step_v = rows.v.data() + static_cast<size_t>(step.q_start[s]) * tail_row;
      t.c0 = step.kv_len[s] - step.q_len[s];
      chan_tails_.push_back(t);
    }
    const cpu::KvSideTypes t{op.kv.dtype, op.kv.v_type(), op.kv.k_rotated, op.kv.v_rotated};
    cpu::attention_chan_batch(seqs_.data(), chan_tails_.data(), static_cast<int>(seqs_.size()), p, t, pool_,
                              op.kv.dtype == kKvQ4Alloc ? op.kv.k_widths : nullptr);
    if (op.tail_read_later) return;
    for (int32_t s = 0; s < step.n_seqs; ++s) {
      const int64_t c1 = step.kv_len[s], c0 = c1 - step.q_len[s];
      const int64_t g0 = c0 - c0 % kT, g1 = c1 - c1 % kT;
      uint8_t* base = tail_of(s);
      uint8_t* tail_k = base + sizeof(KvTailHeader);
      uint8_t* tail_v = tail_k + kT * tail_row;
      const int64_t from = g1 == g0 ? c0 : g1;  // the step's rows the tail takes
      const size_t src = static_cast<size_t>(step.q_start[s] + from - c0) * tail_row;
      const size_t dst = static_cast<size_t>(from - g1) * tail_row, n = static_cast<size_t>(c1 - from) * tail_row;
      std::memcpy(tail_k + dst, rows.k.data() + src, n);
      std::memcpy(tail_v + dst, rows.v.data() + src, n);
      KvTailHeader h;
      h.group_start = static_cast<int32_t>(g1);
      h.n_rows = static_cast<int32_t>(c1 - g1);
      std::memcpy(base, &h, sizeof h);
    }
  }

  void attention(const AttentionOp& op, const StepMetadata& step) override {
    assert(op.q.dtype == DType::kF32 && op.out.dtype == DType::kF32);
    cpu::AttentionParams p;
    p.n_head = op.n_head;
    p.n_head_kv = op.n_head_kv;
    p.head_dim = op.head_dim;
    p.scale = op.scale;
    p.window = op.window;
    p.softcap = op.softcap;
    p.kv_dtype = op.kv.dtype;
    p.sinks = op.sinks.data;
    assert(!op.sinks || op.kv.dtype == DType::kF32);  // the f16 kernels have no sinks
    seqs_.clear();
    for (int32_t s = 0; s < step.n_seqs; ++s) {
      const int32_t t0 = step.q_start[s];
      cpu::PagedKv kv;
      kv.k = static_cast<const uint8_t*>(op.kv.k);
      kv.v = static_cast<const uint8_t*>(op.kv.v);
      kv.table = step.block_tables[op.kv_group] + step.table_start[s];
      kv.block_shift = op.kv.block_shift;
      kv.block_bytes = op.kv.block_stride;
      kv.row_bytes = op.kv.row_bytes;
      kv.v_row_bytes = op.kv.v_row_bytes == op.kv.row_bytes ? 0 : op.kv.v_row_bytes;
      cpu::AttentionSeq a;
      a.q = static_cast<const float*>(op.q.at(t0, 0));
      a.q_pos = step.pos + t0;
      a.n_q = step.q_len[s];
      a.kv = kv;
      a.n_kv = step.kv_len[s];
      a.out = static_cast<float*>(op.out.at(t0, 0));
      a.decode_from = step.decode_from ? step.decode_from[s] : -1;
      a.q_stride = op.q.stride;
      a.out_stride = op.out.stride;
      seqs_.push_back(a);
    }
    if (kv_chan_k(op.kv.dtype)) {
      attention_chan(op, step, p);
      return;
    }
    if (!op.kv.plain()) {
      const cpu::KvSideTypes t{op.kv.dtype, op.kv.v_type(), op.kv.k_rotated, op.kv.v_rotated};
      cpu::attention_quant_batch(seqs_.data(), static_cast<int>(seqs_.size()), p, t, pool_);
      return;
    }
    if (p.kv_dtype == DType::kF16) {
      cpu::attention_f16_rounded_batch(seqs_.data(), static_cast<int>(seqs_.size()), p, pool_);
      return;
    }
    for (const cpu::AttentionSeq& a : seqs_) {
      cpu::attention_strided(a.q, a.q_pos, a.n_q, a.kv, a.n_kv, p, a.out, pool_, a.q_stride, a.out_stride);
    }
  }

  void glu(Glu kind, Tensor gate_up, Tensor out) override {
    const int64_t F = out.cols;
    assert(gate_up.dtype == DType::kF32 && out.dtype == DType::kF32 && gate_up.cols == 2 * F);
    for (int64_t r = 0; r < out.rows; ++r) {
      const auto* g = static_cast<const float*>(gate_up.at(r, 0));
      auto* o = static_cast<float*>(out.at(r, 0));
      if (kind == Glu::kSilu) {
        cpu::silu_mul(g, g + F, o, F);
      } else {
        cpu::gelu_tanh_mul(g, g + F, o, F);
      }
    }
  }

  bool has_gemma4_ops() const override { return true; }

  void glu_split(Glu kind, Tensor gate, Tensor up, Tensor out) override {
    const int64_t F = out.cols;
    assert(gate.dtype == DType::kF32 && up.dtype == DType::kF32 && out.dtype == DType::kF32);
    assert(gate.cols == F && up.cols == F && gate.rows == out.rows && up.rows == out.rows);
    for (int64_t r = 0; r < out.rows; ++r) {
      const auto* g = static_cast<const float*>(gate.at(r, 0));
      const auto* u = static_cast<const float*>(up.at(r, 0));
      auto* o = static_cast<float*>(out.at(r, 0));
      if (kind == Glu::kSilu) {
        cpu::silu_mul(g, u, o, F);
      } else {
        cpu::gelu_tanh_mul(g, u, o, F);
      }
    }
  }

  void ordered_logits(const OrderedLogitsOp& op) override {
    const int64_t E = op.hidden.cols, V = op.logits.cols, n_picked = op.n_picked();
    assert(op.hidden.dtype == DType::kF32 && op.hidden.is_dense() && op.scores.is_dense() && op.logits.is_dense());
    assert(op.scores.cols == op.n_centroids && op.lm_head.cols == E && op.lm_head.rows == V);
    const cpu::WeightView& head = record(op.lm_head).parts[0];
    assert(static_cast<size_t>(E) <= ordered_row_.size());  // reserve() sized it
    for (int64_t r = 0; r < op.hidden.rows; ++r) {
      int32_t* picked = op.picked + r * n_picked;
      float* dots = op.dots + r * n_picked;
      cpu::pick_ordered_tokens(op.scores.f32() + r * op.n_centroids, op.n_centroids, op.top_k, op.token_ordering,
                               V / op.n_centroids, picked);
      const float* h = op.hidden.f32() + r * E;
      for (int64_t i = 0; i < n_picked; ++i) {
        cpu::get_rows(head, picked + i, 1, ordered_row_.data());
        dots[i] = cpu::dot_lanes8(h, ordered_row_.data(), E);
      }
      cpu::fill_masked_logits(dots, picked, n_picked, op.logits.f32() + r * V, V);
    }
  }

  void convert(Tensor x, Tensor out) override {
    assert(x.dtype == DType::kF32 && out.dtype == DType::kF32 && x.rows == out.rows && x.cols == out.cols);
    for (int64_t r = 0; r < x.rows; ++r) {
      std::memcpy(out.at(r, 0), x.at(r, 0), static_cast<size_t>(x.cols) * sizeof(float));
    }
  }

  void softcap(Tensor x, float cap) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      float* row = static_cast<float*>(x.at(r, 0));
      for (int64_t i = 0; i < x.cols; ++i) row[i] = cap * std::tanh(row[i] / cap);
    }
  }

  void scale(Tensor x, float s) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      float* row = static_cast<float*>(x.at(r, 0));
      for (int64_t i = 0; i < x.cols; ++i) row[i] *= s;
    }
  }

  // As the CPU Gemma: norm y in place, add it into x, then the next pre-norm.
  void post_norm_add(Tensor y, Vec w_post, Tensor x, Vec w_next, float eps, float w_offset, Tensor out) override {
    assert(y.is_dense() && x.is_dense() && y.rows == x.rows && y.cols == x.cols);
    cpu::rms_norm(y.f32(), w_post.data, y.rows, y.cols, eps, y.f32(), w_offset);
    cpu::add_inplace(x.f32(), y.f32(), x.rows * x.cols);
    if (w_next) rms_norm(x, nullptr, w_next, eps, w_offset, out);
  }

  bool has_encoder_ops() const override { return true; }

  // Mean and variance in double, so a row's bits do not depend on the
  // summation order of a SIMD split.
  void layer_norm(Tensor x, Vec w, Vec b, float eps, Tensor out) override {
    assert(x.dtype == DType::kF32 && out.dtype == DType::kF32 && out.cols == x.cols && out.rows == x.rows);
    assert(w.n == x.cols && b.n == x.cols);
    for (int64_t r = 0; r < x.rows; ++r) {
      const auto* src = static_cast<const float*>(x.at(r, 0));
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < x.cols; ++i) sum += src[i];
      const double mean = sum / static_cast<double>(x.cols);
      for (int64_t i = 0; i < x.cols; ++i) sq += (src[i] - mean) * (src[i] - mean);
      const auto inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(x.cols) + eps));
      const auto m = static_cast<float>(mean);
      auto* dst = static_cast<float*>(out.at(r, 0));
      for (int64_t i = 0; i < x.cols; ++i) dst[i] = (src[i] - m) * inv * w.data[i] + b.data[i];
    }
  }

  void add(Tensor y, Tensor x) override {
    assert(y.dtype == DType::kF32 && x.dtype == DType::kF32 && y.rows == x.rows && y.cols == x.cols);
    for (int64_t r = 0; r < y.rows; ++r)
      cpu::add_inplace(static_cast<float*>(y.at(r, 0)), static_cast<const float*>(x.at(r, 0)), y.cols);
  }

  void gelu_erf(Tensor x) override {
    assert(x.dtype == DType::kF32);
    for (int64_t r = 0; r < x.rows; ++r) {
      float* row = static_cast<float*>(x.at(r, 0));
      for (int64_t i = 0; i < x.cols; ++i) row[i] = 0.5f * row[i] * (1.0f + std::erf(row[i] * 0.70710678118654752f));
    }
  }

  // One task per (sequence, head); each query row is a plain softmax over
  // its sequence's keys.
  void attention_bidirectional(const BidirectionalAttentionOp& op, const StepMetadata& step) override {
    const int64_t hd = op.head_dim, width = op.n_head * hd;
    assert(op.qkv.dtype == DType::kF32 && op.qkv.cols == 3 * width && op.out.cols == width);
    const int64_t n_tasks = int64_t{step.n_seqs} * op.n_head;
    pool_.parallel_for(n_tasks, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> scores;  // grows to the longest sequence once per thread
      for (int64_t task = begin; task < end; ++task) {
        const auto s = static_cast<int32_t>(task / op.n_head);
        const int64_t h = task % op.n_head;
        const int32_t t0 = step.q_start[s], n = step.q_len[s];
        scores.resize(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) {
          const float* q = static_cast<const float*>(op.qkv.at(t0 + i, h * hd));
          float best = -INFINITY;
          for (int32_t j = 0; j < n; ++j) {
            const float* k = static_cast<const float*>(op.qkv.at(t0 + j, width + h * hd));
            float dot = 0;
            for (int64_t d = 0; d < hd; ++d) dot += q[d] * k[d];
            scores[static_cast<size_t>(j)] = dot * op.scale;
            best = std::max(best, scores[static_cast<size_t>(j)]);
          }
          float total = 0;
          for (float& v : scores) total += (v = std::exp(v - best));
          float* o = static_cast<float*>(op.out.at(t0 + i, h * hd));
          std::fill(o, o + hd, 0.0f);
          for (int32_t j = 0; j < n; ++j) {
            const float* v = static_cast<const float*>(op.qkv.at(t0 + j, 2 * width + h * hd));
            const float p = scores[static_cast<size_t>(j)] / total;
            for (int64_t d = 0; d < hd; ++d) o[d] += p * v[d];
          }
        }
      }
    });
  }

  bool has_mla_ops() const override { return true; }

  // Per head: its columns of x gathered into a dense block, then cpu::matmul
  // over the head's rows of w (a row's bits do not depend on its neighbours).
  void matmul_heads(const Weight& w, int32_t n_heads, Tensor x, int64_t x_step, Tensor y, int64_t y_step) override {
    const CpuWeight& cw = record(w);
    assert(cw.n_parts == 1 && w.rows % n_heads == 0 && x.dtype == DType::kF32 && y.dtype == DType::kF32);
    const int64_t n = x.rows, R = w.rows / n_heads, C = w.cols;
    assert(y.rows == n && static_cast<size_t>(n * C) <= heads_x_.size());
    if (n <= 0) return;
    for (int32_t h = 0; h < n_heads; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        const auto* src = static_cast<const float*>(x.at(t, h * x_step));
        std::copy(src, src + C, heads_x_.data() + t * C);
      }
      cpu::WeightView part = cw.parts[0];
      part.n_rows = R;
      part.data = static_cast<const uint8_t*>(part.data) + static_cast<size_t>(h * R) * part.row_stride;
      cpu::matmul(part, heads_x_.data(), n, static_cast<float*>(y.at(0, h * y_step)), pool_, scratch_, y.stride);
    }
  }

  // Per token: the rope parts of q and the key rotated one head at a time
  // (cpu::rope over rope_dim), the latent normed (cpu::rms_norm), the row
  // split over the K and V planes.
  void rope_store_latent(const LatentKvOp& op, const StepMetadata& step) override {
    const int64_t L = op.kv_lora_rank, W = L + op.rope_dim;
    const size_t elem = op.kv_cache.dtype == DType::kF32 ? 4 : 2;
    const auto plane = static_cast<int64_t>(op.kv_cache.row_bytes / elem);
    assert(op.q.dtype == DType::kF32 && op.kv.dtype == DType::kF32 && op.kv.cols == W && 2 * plane >= W);
    const RopeTable& table = record(op.rope);
    const int32_t* slots = step.slots[op.kv_group];
    const int64_t mask = (int64_t{1} << op.kv_cache.block_shift) - 1;
    for (int64_t t = 0; t < op.q.rows; ++t) {
      auto* q = static_cast<float*>(op.q.at(t, 0));
      for (int32_t h = 0; h < op.n_head; ++h) {
        cpu::rope(q + int64_t{h} * op.q_head_dim + op.q_rope_col, step.pos + t, 1, 1, op.rope_dim, table);
      }
      auto* row = static_cast<float*>(op.kv.at(t, 0));
      cpu::rms_norm(row, op.kv_norm.data, 1, L, op.norm_eps, row);
      cpu::rope(row + L, step.pos + t, 1, 1, op.rope_dim, table);
      const int64_t slot = slots[t];
      const size_t at = static_cast<size_t>(slot >> op.kv_cache.block_shift) * op.kv_cache.block_stride +
                        static_cast<size_t>(slot & mask) * op.kv_cache.row_bytes;
      uint8_t* planes[2] = {static_cast<uint8_t*>(op.kv_cache.k) + at, static_cast<uint8_t*>(op.kv_cache.v) + at};
      for (int64_t i = 0; i < 2 * plane; ++i) {
        const float v = i < W ? row[i] : 0.0f;
        uint8_t* dst = planes[i / plane] + static_cast<size_t>(i % plane) * elem;
        if (elem == 4) {
          std::memcpy(dst, &v, 4);
        } else {
          const uint16_t hv = f32_to_f16(v);
          std::memcpy(dst, &hv, 2);
        }
      }
    }
  }

  void lightning_index(const LightningIndexOp& op, const StepMetadata& step) override {
    cpu::lightning_index(op, record(op.rope), step, pool_);
  }

  // One task per (token, group of heads); a key's row is read once per task
  // (converted to f32 when F16) and serves every head of the group. Each
  // (token, head) runs the same loops whatever the grouping: a token's bits
  // do not depend on its step.
  void latent_attention(const LatentAttentionOp& op, const StepMetadata& step) override {
    const int64_t L = op.kv_lora_rank, R = op.rope_dim, H = op.n_head;
    const bool f16 = op.kv.dtype == DType::kF16;
    const size_t elem = f16 ? 2 : 4;
    const auto plane = static_cast<int64_t>(op.kv.row_bytes / elem);
    assert(op.q_latent.dtype == DType::kF32 && op.q_rope.dtype == DType::kF32 && op.out.dtype == DType::kF32);
    const int64_t n_groups = std::min<int64_t>(H, pool_.n_threads());
    const int64_t per_group = (H + n_groups - 1) / n_groups;
    const int32_t shift = op.kv.block_shift, mask = (1 << shift) - 1;
    pool_.parallel_for(int64_t{step.n_tokens} * n_groups, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> scores, row;  // grow to the longest context once per thread
      row.resize(static_cast<size_t>(2 * plane));
      for (int64_t task = begin; task < end; ++task) {
        const int64_t t = task / n_groups, h0 = (task % n_groups) * per_group, h1 = std::min(H, h0 + per_group);
        if (h0 >= h1) continue;
        const int32_t s = step.seq_of[t];
        // Key i of the token's n_kv: position i, or the i-th selected one.
        const int32_t* selected = op.selected ? op.selected + t * op.selected_stride : nullptr;
        const int32_t n_kv = selected ? op.n_selected[t] : step.pos[t] + 1;
        const int32_t* table = step.block_tables[op.kv_group] + step.table_start[s];
        scores.resize(static_cast<size_t>((h1 - h0) * n_kv));
        auto load = [&](int32_t i) {
          const int32_t j = selected ? selected[i] : i;
          const size_t at = static_cast<size_t>(table[j >> shift]) * op.kv.block_stride +
                            static_cast<size_t>(j & mask) * op.kv.row_bytes;
          const uint8_t* planes[2] = {static_cast<const uint8_t*>(op.kv.k) + at,
                                      static_cast<const uint8_t*>(op.kv.v) + at};
          for (int p = 0; p < 2; ++p) {
            if (!f16) {
              std::memcpy(row.data() + p * plane, planes[p], static_cast<size_t>(plane) * 4);
              continue;
            }
            const auto* hp = reinterpret_cast<const uint16_t*>(planes[p]);
            for (int64_t i = 0; i < plane; ++i) row[static_cast<size_t>(p * plane + i)] = f16_to_f32(hp[i]);
          }
        };
        for (int32_t j = 0; j < n_kv; ++j) {
          load(j);
          for (int64_t h = h0; h < h1; ++h) {
            const auto* ql = static_cast<const float*>(op.q_latent.at(t, h * L));
            const auto* qr = static_cast<const float*>(op.q_rope.at(t, h * op.q_rope_step));
            float dot = 0, dot_r = 0;
            for (int64_t i = 0; i < L; ++i) dot += ql[i] * row[static_cast<size_t>(i)];
            for (int64_t i = 0; i < R; ++i) dot_r += qr[i] * row[static_cast<size_t>(L + i)];
            scores[static_cast<size_t>((h - h0) * n_kv + j)] = (dot + dot_r) * op.scale;
          }
        }
        for (int64_t h = h0; h < h1; ++h) {
          float* sc = scores.data() + (h - h0) * n_kv;
          float best = -INFINITY, total = 0;
          for (int32_t j = 0; j < n_kv; ++j) best = std::max(best, sc[j]);
          for (int32_t j = 0; j < n_kv; ++j) total += (sc[j] = std::exp(sc[j] - best));
          for (int32_t j = 0; j < n_kv; ++j) sc[j] /= total;
          auto* o = static_cast<float*>(op.out.at(t, h * L));
          std::fill(o, o + L, 0.0f);
        }
        for (int32_t j = 0; j < n_kv; ++j) {
          load(j);
          for (int64_t h = h0; h < h1; ++h) {
            const float p = scores[static_cast<size_t>((h - h0) * n_kv + j)];
            auto* o = static_cast<float*>(op.out.at(t, h * L));
            for (int64_t i = 0; i < L; ++i) o[i] += p * row[static_cast<size_t>(i)];
          }
        }
      }
    });
  }

 private:
  std::unique_ptr<ThreadPool> own_pool_;
  ThreadPool& pool_;
  std::shared_ptr<Placements> placed_;
  cpu::Scratch scratch_;
  std::vector<float> acc_;  // matmul(accumulate): [max_tokens, widest weight]
  std::vector<cpu::AttentionSeq> seqs_;
  // k4c (KvCacheView::tail): the step's K and V rows in q8_0 per layer (keyed by
  // its tail), written by rope_store_kv and read by attention; grown to
  // the largest step, so a step allocates nothing once warm.
  struct ChanStepRows {
    std::vector<uint8_t> k, v;  // [step rows] rows of kKvChanTailType
  };
  std::unordered_map<const void*, ChanStepRows> chan_step_;
  std::vector<std::pair<int32_t, int64_t>> chan_units_;  // encode_chan_blocks(): [seq, block start]
  std::vector<cpu::ChanTail> chan_tails_;                // attention_chan(): [n_seqs]
  std::vector<cpu::ConvSeq> conv_seqs_;                  // gated_delta(): [n_seqs], snapshots [n_saves]
  std::vector<cpu::GatedDeltaSeq> delta_seqs_;
  std::vector<cpu::StateSnapshot> conv_snaps_, delta_snaps_;
  std::vector<float> heads_x_;      // matmul_heads(): one head's x, [max_tokens, StepLimits::max_head_cols]
  std::vector<float> ordered_row_;  // ordered_logits(): one lm_head row in f32, [the widest weight's cols]
  // moe_ffn(): the MoE arithmetic's ops on pool_ with their own scratch, the
  // routing scratch, and the layer's output before it is added into out.
  std::unique_ptr<cpu::HostOps> moe_ops_;
  MoeScratch moe_scratch_;
  std::vector<float> moe_out_;  // [max_tokens, n_embd]
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads, nullptr, nullptr);
}

std::unique_ptr<Backend> make_cpu_backend_on(ThreadPool& pool) {
  return std::make_unique<CpuBackend>(0, &pool, nullptr);
}

std::unique_ptr<Backend> make_cpu_lane(const Backend& parent, int n_threads) {
  const auto* p = dynamic_cast<const CpuBackend*>(&parent);
  assert(p && "make_cpu_lane: the parent is not a CPU Backend");
  return std::make_unique<CpuBackend>(n_threads, nullptr, p->placements());
}

}  // namespace rill
