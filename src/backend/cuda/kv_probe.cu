// Test hooks of kv_probe.h: load8h against load8's f32 route,
// Iq4nlLevels::code and e4m3_round_bits, one thread per 8 elements / per
// value; host runs of the KV types' code.
#include "backend/cuda/kv_probe.h"

#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/kv_types.cuh"
#include "backend/cuda/mma_tile.cuh"

namespace rill::cuda {
namespace {

template <typename KvT>
__global__ void load8h_probe_kernel(const uint8_t* row, int64_t n, uint16_t* via_h, uint16_t* via_f32) {
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (e >= n) return;
  const uint4 h = detail::load8h<KvT>(row, e);
  float f[8];
  KvT::load8(row, e, f);
  const uint32_t hw[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 v = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    const uint32_t fw = *reinterpret_cast<const uint32_t*>(&v);
    via_h[e + 2 * i] = static_cast<uint16_t>(hw[i] & 0xffffu);
    via_h[e + 2 * i + 1] = static_cast<uint16_t>(hw[i] >> 16);
    via_f32[e + 2 * i] = static_cast<uint16_t>(fw & 0xffffu);
    via_f32[e + 2 * i + 1] = static_cast<uint16_t>(fw >> 16);
  }
}

__global__ void iq4nl_code_probe_kernel(const float* y, int64_t n, int* codes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) codes[i] = detail::Iq4nlLevels{}.code(y[i]);
}

__global__ void e4m3_round_probe_kernel(const float* x, int64_t n, uint8_t* bytes) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) bytes[i] = static_cast<uint8_t>(detail::e4m3_round_bits(x[i]));
}

constexpr int kThreads = 128;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

}  // namespace

Status probe_load8h(DType kv_dtype, const std::vector<uint8_t>& row, std::vector<uint16_t>& via_h,
                    std::vector<uint16_t>& via_f32) {
  int block_bytes = 0, block = 32;
  if (kv_dtype == DType::kQ8_0) block_bytes = detail::KvQ8_0::kBlockBytes;
  if (kv_dtype == DType::kQ4_0) block_bytes = detail::KvQ4_0::kBlockBytes;
  if (kv_dtype == DType::kQ4_1) block_bytes = detail::KvQ4_1::kBlockBytes;
  if (kv_dtype == DType::kQ5_0) block_bytes = detail::KvQ5_0::kBlockBytes;
  if (kv_dtype == DType::kQ5_1) block_bytes = detail::KvQ5_1::kBlockBytes;
  if (kv_dtype == DType::kIQ4_NL) block_bytes = detail::KvIq4Nl::kBlockBytes;
  if (kv_dtype == kKvIq4Nl64) {
    block_bytes = detail::KvIq4Nl64::kBlockBytes;
    block = detail::KvIq4Nl64::kBlock;
  }
  if (block_bytes == 0 || row.empty() || row.size() % static_cast<size_t>(block_bytes) != 0) {
    return Error{"probe_load8h: a row of whole Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL or IQ4_NL64 blocks, got " +
                 std::to_string(row.size()) + " bytes of " + std::string(dtype_name(kv_dtype))};
  }
  const int64_t n = static_cast<int64_t>(row.size() / static_cast<size_t>(block_bytes)) * block;
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_row, DeviceBuffer::allocate(row.size(), "probe row"));
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_h, DeviceBuffer::allocate(static_cast<size_t>(n) * 2, "probe load8h"));
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_f, DeviceBuffer::allocate(static_cast<size_t>(n) * 2, "probe load8"));
  RILL_CUDA_CHECK(cudaMemcpy(d_row.data(), row.data(), row.size(), cudaMemcpyHostToDevice));
  const unsigned grid = blocks_for(n / 8);
  const auto* r = d_row.as<const uint8_t>();
  if (kv_dtype == DType::kQ8_0) {
    load8h_probe_kernel<detail::KvQ8_0><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  } else if (kv_dtype == DType::kQ4_0) {
    load8h_probe_kernel<detail::KvQ4_0><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  } else if (kv_dtype == DType::kQ4_1) {
    load8h_probe_kernel<detail::KvQ4_1><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  } else if (kv_dtype == DType::kQ5_0) {
    load8h_probe_kernel<detail::KvQ5_0><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  } else if (kv_dtype == DType::kQ5_1) {
    load8h_probe_kernel<detail::KvQ5_1><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  } else if (kv_dtype == DType::kIQ4_NL) {
    load8h_probe_kernel<detail::KvIq4Nl><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  } else {
    load8h_probe_kernel<detail::KvIq4Nl64><<<grid, kThreads>>>(r, n, d_h.as<uint16_t>(), d_f.as<uint16_t>());
  }
  RILL_CUDA_CHECK_LAUNCH();
  via_h.resize(static_cast<size_t>(n));
  via_f32.resize(static_cast<size_t>(n));
  RILL_CUDA_CHECK(cudaMemcpy(via_h.data(), d_h.data(), d_h.size(), cudaMemcpyDeviceToHost));
  RILL_CUDA_CHECK(cudaMemcpy(via_f32.data(), d_f.data(), d_f.size(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status probe_iq4nl_code(const std::vector<float>& y, std::vector<int>& codes) {
  const auto n = static_cast<int64_t>(y.size());
  codes.assign(y.size(), -1);
  if (n == 0) return Status::Ok();
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_y, DeviceBuffer::allocate(y.size() * sizeof(float), "probe values"));
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_q, DeviceBuffer::allocate(y.size() * sizeof(int), "probe codes"));
  RILL_CUDA_CHECK(cudaMemcpy(d_y.data(), y.data(), d_y.size(), cudaMemcpyHostToDevice));
  iq4nl_code_probe_kernel<<<blocks_for(n), kThreads>>>(d_y.as<const float>(), n, d_q.as<int>());
  RILL_CUDA_CHECK_LAUNCH();
  RILL_CUDA_CHECK(cudaMemcpy(codes.data(), d_q.data(), d_q.size(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status probe_e4m3_round(const std::vector<float>& x, std::vector<uint8_t>& bytes) {
  const auto n = static_cast<int64_t>(x.size());
  bytes.assign(x.size(), 0);
  if (n == 0) return Status::Ok();
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_x, DeviceBuffer::allocate(x.size() * sizeof(float), "probe values"));
  RILL_ASSIGN_OR_RETURN(DeviceBuffer d_b, DeviceBuffer::allocate(x.size(), "probe bytes"));
  RILL_CUDA_CHECK(cudaMemcpy(d_x.data(), x.data(), d_x.size(), cudaMemcpyHostToDevice));
  e4m3_round_probe_kernel<<<blocks_for(n), kThreads>>>(d_x.as<const float>(), n, d_b.as<uint8_t>());
  RILL_CUDA_CHECK_LAUNCH();
  RILL_CUDA_CHECK(cudaMemcpy(bytes.data(), d_b.data(), d_b.size(), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

void host_iq4nl64_loads(const uint8_t* row, int64_t n, float* via_load1, float* via_load4, float* via_load8) {
  for (int64_t e = 0; e < n; ++e) via_load1[e] = detail::KvIq4Nl64::load1(row, e);
  for (int64_t e = 0; e < n; e += 4) detail::KvIq4Nl64::load4(row, e, via_load4 + e);
  for (int64_t e = 0; e < n; e += 8) detail::KvIq4Nl64::load8(row, e, via_load8 + e);
}

void host_e4m3_round(const std::vector<float>& x, std::vector<uint8_t>& bytes) {
  bytes.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) bytes[i] = static_cast<uint8_t>(detail::e4m3_round_bits(x[i]));
}

namespace {

// The device store (KvGgmlBlock::store) block by block, the warp's
// reductions replaced by the CPU's scans (strict comparisons: the first of
// equal elements).
template <typename KvT>
void host_store_blocks(const float* x, int64_t n, uint8_t* row) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float lo = INFINITY, hi = -INFINITY, amax = 0.0f, top = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (x[j] < lo) lo = x[j];
      if (hi < x[j]) hi = x[j];
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        top = x[j];
      }
    }
    if (!KvT::kHasMin) lo = 0.0f;
    const float d = KvT::kHasMin ? KvT::scale(lo, hi) : KvT::scale(top, 0.0f);
    const float id = KvT::inverse(d);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = KvT::code(x[j], lo, id);
    uint8_t* blk = row + b * KvT::kBlockBytes;
    const __half dh = __float2half_rn(d), mh = __float2half_rn(lo);
    std::memcpy(blk, &dh, 2);
    if (KvT::kHasMin) std::memcpy(blk + 2, &mh, 2);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    if (KvT::kMaxCode == 31) std::memcpy(blk + KvT::kQhAt, &qh, 4);
    for (int j = 0; j < 16; ++j) blk[KvT::kQsAt + j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
  }
}

template <typename KvT>
void host_loads(const uint8_t* row, int64_t n, float* via_load1, float* via_load4, float* via_load8) {
  for (int64_t e = 0; e < n; ++e) via_load1[e] = KvT::load1(row, e);
  for (int64_t e = 0; e < n; e += 4) KvT::load4(row, e, via_load4 + e);
  for (int64_t e = 0; e < n; e += 8) KvT::load8(row, e, via_load8 + e);
}

}  // namespace

bool host_ggml_store(DType kv_dtype, const float* x, int64_t n, uint8_t* row) {
  switch (kv_dtype) {
    case DType::kBF16:
      for (int64_t e = 0; e < n; ++e) {
        const uint16_t b = detail::KvBf16::encode(x[e]);
        std::memcpy(row + 2 * e, &b, 2);
      }
      return true;
    case DType::kQ4_1:
      host_store_blocks<detail::KvQ4_1>(x, n, row);
      return true;
    case DType::kQ5_0:
      host_store_blocks<detail::KvQ5_0>(x, n, row);
      return true;
    case DType::kQ5_1:
      host_store_blocks<detail::KvQ5_1>(x, n, row);
      return true;
    default:
      return false;
  }
}

bool host_ggml_loads(DType kv_dtype, const uint8_t* row, int64_t n, float* via_load1, float* via_load4,
                     float* via_load8, float* via_biased) {
  switch (kv_dtype) {
    case DType::kBF16:
      host_loads<detail::KvBf16>(row, n, via_load1, via_load4, via_load8);
      return true;
    case DType::kQ4_1:
      host_loads<detail::KvQ4_1>(row, n, via_load1, via_load4, via_load8);
      return true;
    case DType::kQ5_1:
      host_loads<detail::KvQ5_1>(row, n, via_load1, via_load4, via_load8);
      return true;
    case DType::kQ5_0:
      host_loads<detail::KvQ5_0>(row, n, via_load1, via_load4, via_load8);
      for (int64_t e = 0; e < n; e += 8) {
        uint32_t u[2];
        const float s = __half2float(detail::KvQ5_0::load8_biased(row, e, u));
        for (int i = 0; i < 8; ++i) {
          const int code = static_cast<int>((u[i / 4] >> (8 * (i % 4))) & 0xFFu);
          via_biased[e + i] = static_cast<float>(code - detail::KvQ5_0::kLevelBias) * s;
        }
      }
      return true;
    default:
      return false;
  }
}

}  // namespace rill::cuda
