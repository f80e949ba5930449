// The CUDA Backend: each op is one of today's fused CUDA launches (the ones
// model/arch/llama_cuda.cpp's run_layers() makes), its arguments read from
// the device-neutral views. Placement copies each weight into a device
// buffer of its own (the per-device runtime of issue 16 step 5 will place a
// model into one buffer, as model/cuda_model_base.h's WeightUpload does).
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstring>
#include <deque>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "core/half.h"

namespace rill {
namespace {

static_assert(sizeof(AttentionTile) == sizeof(cuda::PrefillTile) &&
              offsetof(AttentionTile, seq) == offsetof(cuda::PrefillTile, seq) &&
              offsetof(AttentionTile, t0) == offsetof(cuda::PrefillTile, t0) &&
              offsetof(AttentionTile, n_q) == offsetof(cuda::PrefillTile, n_q));

struct CudaWeight {
  cuda::DeviceWeight w;
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

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::unique_ptr<cuda::Context> ctx, const CudaBackendOptions& o)
      : ctx_(std::move(ctx)), gemm_(std::make_unique<cuda::Gemm>(*ctx_)), act_(o.act), invariant_(o.batch_invariant) {
    gemm_->set_batch_invariant(invariant_);
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
    const size_t dst_row = row_bytes(t, cols);
    std::vector<uint8_t> host(dst_row * static_cast<size_t>(rows));
    std::vector<float> tmp;
    size_t at = 0;
    for (int i = 0; i < n_parts; ++i) {
      const HostMatrix& p = parts[i];
      for (int64_t r = 0; r < p.rows; ++r, at += dst_row) {
        const auto* src = static_cast<const uint8_t*>(p.data) + static_cast<size_t>(r) * p.row_stride;
        if (p.dtype == t) {
          std::memcpy(host.data() + at, src, dst_row);
        } else {
          convert_row(src, p.dtype, cols, t, tmp, host.data() + at);
        }
      }
    }
    RILL_ASSIGN_OR_RETURN(void* dev, upload(host.data(), host.size(), what));
    if (cuda::quant_supported(t)) quant_max_elems_ = std::max(quant_max_elems_, rows * cols);
    weights_.push_back({cuda::DeviceWeight{dev, t}});
    return Weight{rows, cols, &weights_.back()};
  }

  Result<Vec> place_vector(const float* host, int64_t n, const std::string& what) override {
    if (n <= 0) return Error{what + ": an empty vector"};
    RILL_ASSIGN_OR_RETURN(void* dev, upload(host, static_cast<size_t>(n) * 4, what));
    return Vec{static_cast<const float*>(dev), n};
  }

  Result<Rope> place_rope(const RopeTable& table) override {
    const int64_t half = table.rot_dim / 2;
    std::vector<float> host(static_cast<size_t>(std::max<int64_t>(2 * half, 1)), 0.0f);
    std::copy(table.inv_freq.begin(), table.inv_freq.end(), host.begin());
    std::copy(table.ggml_freq_divisor.begin(), table.ggml_freq_divisor.end(), host.begin() + half);
    RILL_ASSIGN_OR_RETURN(void* dev, upload(host.data(), host.size() * 4, "the RoPE table"));
    CudaRope r;
    r.table = table;
    r.inv_freq = static_cast<const float*>(dev);
    r.freq_divisor = table.ggml_freq_divisor.empty() ? nullptr : r.inv_freq + half;
    ropes_.push_back(std::move(r));
    return Rope{table.rot_dim, &ropes_.back()};
  }

  Status reserve(const StepLimits& limits) override {
    auto carve = [&](cuda::Arena& a) {
      partial_ = a.take<float>(cuda::attention_partial_floats(limits.max_tokens, limits.n_head, limits.head_dim));
      qscratch_.carve(a, act_, limits.max_tokens, quant_max_elems_, 0, 0, 0, invariant_);
    };
    cuda::Arena sizing;
    carve(sizing);
    RILL_ASSIGN_OR_RETURN(scratch_,
                          cuda::DeviceBuffer::allocate(std::max<size_t>(sizing.used(), 1), "backend scratch"));
    cuda::Arena real(scratch_.data());
    carve(real);
    return Status::Ok();
  }

  Result<Buffer> allocate(size_t bytes, const std::string& what) override {
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
      return Error{cuda::cuda_error_text(e, ("allocating " + what).c_str())};
    }
    if (cudaError_t e = cudaMemset(p, 0, bytes); e != cudaSuccess) {
      cudaFree(p);
      return Error{cuda::cuda_error_text(e, ("clearing " + what).c_str())};
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
    const cuda::DeviceWeight& d = record(w).w;
    if (cuda::quant_supported(d.dtype)) {
      RILL_TRY(cuda::quant_matmul(*gemm_, qscratch_, d.dtype, d.data, act_, x.data, x.rows, w.rows, w.cols, y.f32(),
                                  accumulate, stream()));
    } else {
      RILL_TRY(gemm_->matmul(act_, d.data, x.data, x.rows, w.rows, w.cols, y.f32(), accumulate));
    }
    if (bias) cuda::add_bias(y.f32(), bias.data, y.rows, y.cols, stream());
    return Status::Ok();
  }

  void add_bias(Tensor y, Vec b) override {
    assert(y.dtype == DType::kF32 && y.is_dense() && y.cols == b.n);
    cuda::add_bias(y.f32(), b.data, y.rows, y.cols, stream());
  }

  void rope_store_kv(const RopeKvOp& op, const StepMetadata& step) override {
    assert(op.kv.block_stride == op.kv.row_bytes << op.kv.block_shift);
    const CudaRope& rope = record(op.rope);
    cuda::RopeKvArgs a;
    a.qkv = op.qkv.f32();
    a.n_tokens = op.qkv.rows;
    a.qkv_stride = op.qkv.stride;
    a.n_head = op.n_head;
    a.n_head_kv = op.n_head_kv;
    a.head_dim = op.head_dim;
    a.positions = step.pos;
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
    cuda::rope_store_kv(a, stream());
  }

  void attention(const AttentionOp& op, const StepMetadata& step) override {
    assert(op.kv.block_stride == op.kv.row_bytes << op.kv.block_shift && op.out.is_dense());
    cuda::AttentionArgs a;
    a.q = op.q.f32();
    a.q_stride = op.q.stride;
    a.n_head = op.n_head;
    a.n_head_kv = op.n_head_kv;
    a.head_dim = op.head_dim;
    a.scale = op.scale;
    a.softcap = op.softcap;
    a.window = op.window;
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
    cuda::attention(a, stream());
  }

  void glu(Glu kind, Tensor gate_up, Tensor out) override {
    assert(gate_up.dtype == DType::kF32 && gate_up.is_dense() && out.is_dense() && gate_up.cols == 2 * out.cols);
    if (kind == Glu::kSilu) {
      cuda::silu_mul(gate_up.f32(), out.rows, out.cols, out.dtype, out.data, stream());
    } else {
      cuda::gelu_tanh_mul(gate_up.f32(), out.rows, out.cols, out.dtype, out.data, stream());
    }
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

 private:
  cudaStream_t stream() const { return ctx_->stream(); }

  Result<void*> upload(const void* host, size_t bytes, const std::string& what) {
    RILL_ASSIGN_OR_RETURN(cuda::DeviceBuffer buf, cuda::DeviceBuffer::allocate(bytes, what));
    if (cudaError_t e = cudaMemcpy(buf.data(), host, bytes, cudaMemcpyHostToDevice); e != cudaSuccess) {
      return Error{cuda::cuda_error_text(e, ("uploading " + what).c_str())};
    }
    placed_.push_back(std::move(buf));
    return placed_.back().data();
  }

  Status copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream()); e != cudaSuccess) {
      return Error{cuda::cuda_error_text(e, what)};
    }
    return ctx_->synchronize();
  }

  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<cuda::Gemm> gemm_;
  DType act_;
  bool invariant_;
  std::deque<cuda::DeviceBuffer> placed_;  // weights, vectors, RoPE tables
  std::deque<CudaWeight> weights_;         // deques: records stay put as more are placed
  std::deque<CudaRope> ropes_;
  int64_t quant_max_elems_ = 0;
  cuda::DeviceBuffer scratch_;
  float* partial_ = nullptr;
  cuda::QuantScratch qscratch_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& options) {
  if (options.act != DType::kF32 && options.act != DType::kF16 && options.act != DType::kBF16) {
    return Error{std::string("CUDA backend: activation dtype ") + std::string(dtype_name(options.act)) +
                 " is not F32, F16 or BF16"};
  }
  if (!cuda::device_available()) return Error{"CUDA backend: no CUDA device"};
  RILL_ASSIGN_OR_RETURN(std::unique_ptr<cuda::Context> ctx, cuda::Context::create(options.device));
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(std::move(ctx), options));
}

}  // namespace rill
