// Test hooks of kv_probe.h: load8h against load8's f32 route,
// Iq4nlLevels::code and e4m3_round_bits, one thread per 8 elements / per
// value.
#include "backend/cuda/kv_probe.h"

#include <cuda_fp16.h>

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
  if (kv_dtype == DType::kIQ4_NL) block_bytes = detail::KvIq4Nl::kBlockBytes;
  if (kv_dtype == kKvIq4Nl64) {
    block_bytes = detail::KvIq4Nl64::kBlockBytes;
    block = detail::KvIq4Nl64::kBlock;
  }
  if (block_bytes == 0 || row.empty() || row.size() % static_cast<size_t>(block_bytes) != 0) {
    return Error{"probe_load8h: a row of whole Q8_0, Q4_0, IQ4_NL or IQ4_NL64 blocks, got " +
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

}  // namespace rill::cuda
