// prefetch_l2 (prefetch.h).
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/prefetch.h"

namespace rill::cuda {
namespace {

constexpr int kMaxBlocks = 264;  // two an SM on an H100 / H200

// Bulk form: thread g of the grid requests bytes [g per, (g + 1) per) (the
// last thread what is left), per a multiple of 16, one cp.async.bulk
// prefetch each.
__global__ void prefetch_bulk_kernel(const uint8_t* p, uint64_t bytes, uint64_t per, bool programmatic) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t at = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * per;
  if (at < bytes) {
    const uint64_t left = bytes - at;
    const uint32_t size = static_cast<uint32_t>(left < per ? left : per);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(size) : "memory");
  }
#endif
  if (programmatic) {
    detail::pdl_wait();
    detail::pdl_trigger();
  }
}

// Line form: one prefetch.global.L2 per 128-byte line, the grid's threads
// striding over the region.
__global__ void prefetch_lines_kernel(const uint8_t* p, uint64_t bytes, bool programmatic) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x * 128;
  for (uint64_t at = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 128; at < bytes; at += stride) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + at));
  }
  if (programmatic) {
    detail::pdl_wait();
    detail::pdl_trigger();
  }
}

}  // namespace

bool parse_prefetch_caps(const char* text, PrefetchCaps& caps) {
  if (!text || !*text) return true;
  PrefetchCaps parsed;
  const char* at = text;
  int n = 0;
  for (; n < 3; ++n) {
    if (*at < '0' || *at > '9') return false;
    char* end = nullptr;
    const unsigned long long mb = std::strtoull(at, &end, 10);
    if (mb > (1ull << 20)) return false;  // a terabyte: no L2 is near it
    parsed.bytes[n] = static_cast<size_t>(mb) << 20;
    at = end;
    if (*at == '\0') break;
    if (*at != ',') return false;
    ++at;
  }
  if (*at != '\0' || (n != 0 && n != 2)) return false;
  if (n == 0) parsed.bytes[1] = parsed.bytes[2] = parsed.bytes[0];
  caps = parsed;
  return true;
}

void prefetch_l2(const void* p, size_t bytes, cudaStream_t stream, PrefetchForm form, bool programmatic) {
  bytes = bytes / 16 * 16;
  if (!p || bytes == 0) return;
  const auto* base = static_cast<const uint8_t*>(p);
  if (form == PrefetchForm::kLines) {
    const size_t lines = (bytes + 127) / 128;
    const unsigned blocks = static_cast<unsigned>(std::min<size_t>((lines + 255) / 256, kMaxBlocks));
    if (programmatic) {
      launch_pdl(prefetch_lines_kernel, dim3(blocks), dim3(256), 0, stream, base, static_cast<uint64_t>(bytes), true);
    } else {
      prefetch_lines_kernel<<<blocks, 256, 0, stream>>>(base, bytes, false);
      RILL_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  // At least kPrefetchChunk a request; more where the grid's threads would
  // not cover the region.
  constexpr uint64_t kThreads = 32;
  uint64_t per = std::max<uint64_t>(kPrefetchChunk, (bytes + kMaxBlocks * kThreads - 1) / (kMaxBlocks * kThreads));
  per = (per + 15) / 16 * 16;
  const uint64_t requests = (bytes + per - 1) / per;
  const unsigned blocks = static_cast<unsigned>((requests + kThreads - 1) / kThreads);
  if (programmatic) {
    launch_pdl(prefetch_bulk_kernel, dim3(blocks), dim3(kThreads), 0, stream, base, static_cast<uint64_t>(bytes), per,
               true);
  } else {
    prefetch_bulk_kernel<<<blocks, kThreads, 0, stream>>>(base, bytes, per, false);
    RILL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace rill::cuda
