// KV export and import of the CUDA runtime (CudaModelBase, see
// cuda_model_base.h): the prefix cache tiers' copies of whole blocks between
// the device KV planes and host memory.
//
// Why a pinned staging buffer: a tier's run copies every block of every
// layer (a 4,096-token prefix of a 32-layer model is 8,192 block copies per
// plane). A copy to or from pageable memory is synchronous, so each would
// pay a full round trip; copies to pinned memory are queued on the stream
// and the host waits once per staging chunk. Consecutive block ids (the
// common case: the pool hands out runs of ids) go as one copy.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "model/cuda_model_base.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/fp8.h"
#include "backend/cuda/glu_narrow.h"
#include "backend/cuda/latent_attention.h"
#include "backend/cuda/quant.h"
#include "core/hash.h"

namespace rill {

namespace {
// Staging size: both planes of a 4,096-token layer of an 8-KV-head,
// 128-dim f16 model (16 MiB) in one chunk.
constexpr size_t kStagingBytes = size_t{16} << 20;
}  // namespace

std::vector<Model::KvLayer> CudaModelBase::kv_layers() const {
  const int64_t n = n_kv_layers_ > 0 ? n_kv_layers_ : cfg_.n_layer;
  std::vector<KvLayer> out;
  for (size_t l = 0; l < static_cast<size_t>(n); ++l) {
    KvLayer k{0, kv_dtype_, kv_row_bytes(l)};
    if (kv_chan_) {  // k4c: V in its own type (copy_kv_blocks moves such layers a block at a time)
      k.v_row_bytes = kv_v_row_bytes(l);
      k.v_dtype = kv_v_dtype();
    }
    out.push_back(k);
  }
  return out;
}

std::string CudaModelBase::kv_numerics() const {
  const cudaDeviceProp& p = ctx_->props();
  std::string act(dtype_name(act_));  // "BF16" -> "bf16"
  for (char& c : act) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string s = "cuda sm_" + std::to_string(p.major) + std::to_string(p.minor) + " act=" + act;
  if (batch_invariant_) s += " batch-invariant";
  if (fp8_weights_) s += " weights=fp8";
  // How FP8 GEMMs (--quantize fp8 or an FP8 checkpoint) sum and store:
  // files written with other settings, or by builds before them, are refused.
  if (gemm_ && gemm_->fp8_fast_accum()) s += " fp8acc=fast";
  if (gemm_ && gemm_->fp8_bf16_d()) s += " fp8d=bf16";
  // FP8 matmuls of 2..N tokens on gemm_stream (N 8 by default, 128 with
  // RILL_FP8_STREAM=1): other sums than cuBLASLt's.
  if (fp8_weights_ && cuda::fp8_stream_max_tokens() > 0) {
    s += " fp8mm=stream" + std::to_string(cuda::fp8_stream_max_tokens());
  }
  // Dense 16-bit decode matmuls may take gemm_stream where Gemm timed it
  // faster (RILL_GEMM_STREAM=1).
  if (gemm_ && gemm_->stream()) s += " gemm=stream";
  // Dense bf16 MLPs past 8 tokens round gate/up to bf16 (Backend::matmul_glu).
  if (act_ == DType::kBF16 && !batch_invariant_ && cuda::glu_narrow_on()) s += " glu=bf16";
  // r2: the tensor-core MLA kernels (f16 q and probabilities); a file of
  // the f32 MLA kernels (RILL_MLA_MMA=0) or of earlier builds is refused.
  s += cuda::mla_tensor_cores_off() ? " mla=f32" : " r2";
  // Q8_0 decode matmuls of 1..8 tokens on int8 x and dp4a (the default;
  // RILL_Q8_DP4A=0: the f32 GEMV and quant_mma):
  // other sums than the f32 GEMV's and quant_mma's. Named whenever the
  // switch is on (the tag does not look at the weights' types).
  if (cuda::q8_dp4a_on()) s += " q8=dp4a";
  if (!kv_types_desc_.empty()) s += " " + kv_types_desc_;
  // k4a: its widths' hash, as CpuPagedModel::kv_numerics (XXH3 of every
  // q4a layer's index and widths in order), so KV made under other widths
  // (another calibration, or the CPU's) is refused.
  std::vector<uint8_t> all;
  for (size_t l = 0; l < k_widths_.size(); ++l) {
    const std::vector<uint8_t>& w = k_widths_[l];
    if (w.empty()) continue;
    for (int i = 0; i < 4; ++i) all.push_back(static_cast<uint8_t>(l >> (8 * i)));
    all.insert(all.end(), w.begin(), w.end());
  }
  if (!all.empty()) s += " q4a-widths=" + hex64(hash64(all.data(), all.size()));
  if (sharded()) s += " tp=" + std::to_string(split_.size);
  return s;
}

Status CudaModelBase::check_kv_blocks(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes) const {
  const int64_t n_layers = n_kv_layers_ > 0 ? n_kv_layers_ : cfg_.n_layer;
  if (layer < 0 || layer >= n_layers) {
    return Error{"KV layer " + std::to_string(layer) + " does not exist (" + std::to_string(n_layers) + " layers)"};
  }
  const size_t want = kv_block_bytes(layer);
  if (block_bytes != want) {
    return Error{"KV layer " + std::to_string(layer) + ": a block is " + std::to_string(want) + " bytes, not " +
                 std::to_string(block_bytes)};
  }
  for (int32_t b : blocks) {
    if (b < 0 || b >= n_blocks_) {
      return Error{"KV layer " + std::to_string(layer) + " block " + std::to_string(b) + " does not exist"};
    }
  }
  return Status::Ok();
}

Status CudaModelBase::copy_kv_blocks(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes,
                                     uint8_t* const out[2], const uint8_t* const in[2]) const {
  // The tiers' probe of a layer whose K and V types differ (no block, no
  // size; kv_tiers.cpp): these copies move it.
  if (blocks.empty() && block_bytes == 0 && layer >= 0 && layer < static_cast<int64_t>(kv_plane_off_.size())) {
    return Status::Ok();
  }
  RILL_TRY(check_kv_blocks(layer, blocks, block_bytes));
  if (blocks.empty()) return Status::Ok();
  // k4c: V's blocks (iq4_nlh64 rows) are smaller than K's (q4c groups); a
  // caller's V blocks sit block_bytes apart as K's (Model's contract; the
  // tiers copy such layers a block at a time), so these go one at a time.
  const size_t v_block = static_cast<size_t>(block_size_) * kv_v_row_bytes(static_cast<size_t>(layer));
  if (v_block != block_bytes && blocks.size() > 1) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      uint8_t* const one_out[2] = {out ? out[0] + i * block_bytes : nullptr, out ? out[1] + i * block_bytes : nullptr};
      const uint8_t* const one_in[2] = {in ? in[0] + i * block_bytes : nullptr, in ? in[1] + i * block_bytes : nullptr};
      RILL_TRY(
          copy_kv_blocks(layer, blocks.subspan(i, 1), block_bytes, out ? one_out : nullptr, in ? one_in : nullptr));
    }
    return Status::Ok();
  }
  const size_t bytes[2] = {block_bytes, v_block}, widest = std::max(block_bytes, v_block);
  if (sharded()) cudaSetDevice(ctx_->device());
  if (kv_staging_.size() < 2 * widest) {
    RILL_ASSIGN_OR_RETURN(kv_staging_,
                          cuda::PinnedBuffer::allocate(std::max(kStagingBytes, 2 * widest), "KV export staging"));
  }
  const bool to_host = out != nullptr;
  uint8_t* const planes[2] = {static_cast<uint8_t*>(k_cache(static_cast<size_t>(layer))),
                              static_cast<uint8_t*>(v_cache(static_cast<size_t>(layer)))};
  const size_t per_chunk = kv_staging_.size() / (2 * widest);
  auto* staging = static_cast<uint8_t*>(kv_staging_.data());
  for (size_t c0 = 0; c0 < blocks.size(); c0 += per_chunk) {
    const size_t n = std::min(per_chunk, blocks.size() - c0);
    // Staging holds the chunk's K blocks, then (from n * widest) its V blocks, in order.
    uint8_t* const stage_of[2] = {staging, staging + n * widest};
    if (!to_host) {
      for (int p = 0; p < 2; ++p) std::memcpy(stage_of[p], in[p] + c0 * block_bytes, n * bytes[p]);
    }
    for (int p = 0; p < 2; ++p) {
      for (size_t i = 0; i < n;) {
        size_t run = 1;  // consecutive block ids: one copy
        while (i + run < n && blocks[c0 + i + run] == blocks[c0 + i] + static_cast<int32_t>(run)) ++run;
        uint8_t* dev = planes[p] + static_cast<size_t>(blocks[c0 + i]) * bytes[p];
        uint8_t* stage = stage_of[p] + i * bytes[p];
        const cudaError_t e = to_host ? cudaMemcpyAsync(stage, dev, run * bytes[p], cudaMemcpyDeviceToHost, stream())
                                      : cudaMemcpyAsync(dev, stage, run * bytes[p], cudaMemcpyHostToDevice, stream());
        if (e != cudaSuccess) return Error{cuda::cuda_error_text(e, to_host ? "copying KV out" : "copying KV in")};
        i += run;
      }
    }
    RILL_TRY(ctx_->synchronize());  // before staging is read (out) or refilled (in)
    if (to_host) {
      for (int p = 0; p < 2; ++p) std::memcpy(out[p] + c0 * block_bytes, stage_of[p], n * bytes[p]);
    }
  }
  return Status::Ok();
}

size_t CudaModelBase::kv_block_bytes(int64_t layer) const {
  return static_cast<size_t>(block_size_) * kv_row_bytes(static_cast<size_t>(layer));
}

Status CudaModelBase::copy_kv_out(int64_t layer, int32_t block, uint8_t* k, uint8_t* v) const {
  uint8_t* const out[2] = {k, v};
  if (layer < 0 || layer >= static_cast<int64_t>(kv_plane_off_.size())) return check_kv_blocks(layer, {}, 0);
  return copy_kv_blocks(layer, std::span<const int32_t>(&block, 1), kv_block_bytes(layer), out, nullptr);
}

Status CudaModelBase::copy_kv_in(int64_t layer, int32_t block, const uint8_t* k, const uint8_t* v) {
  const uint8_t* const in[2] = {k, v};
  if (layer < 0 || layer >= static_cast<int64_t>(kv_plane_off_.size())) return check_kv_blocks(layer, {}, 0);
  return copy_kv_blocks(layer, std::span<const int32_t>(&block, 1), kv_block_bytes(layer), nullptr, in);
}

Status CudaModelBase::copy_kv_blocks_out(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes, uint8_t* k,
                                         uint8_t* v) const {
  uint8_t* const out[2] = {k, v};
  return copy_kv_blocks(layer, blocks, block_bytes, out, nullptr);
}

Status CudaModelBase::copy_kv_blocks_in(int64_t layer, std::span<const int32_t> blocks, size_t block_bytes,
                                        const uint8_t* k, const uint8_t* v) {
  const uint8_t* const in[2] = {k, v};
  return copy_kv_blocks(layer, blocks, block_bytes, nullptr, in);
}

}  // namespace rill
#endif  // RILL_HAVE_CUDA
