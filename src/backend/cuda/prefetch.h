#pragma once
// Weights pulled into L2 ahead of the op that reads them (the CUDA form of
// Backend::prefetch): a decode step's small matmuls (o, qkv) read their
// weights at 2.0-2.6 TB/s where the large ones reach 2.9-3.1 (docs/perf.md:
// too few bytes an SM in flight to cover HBM's latency), while the ops
// before them (RoPE and the KV store, attention at short contexts, the
// norms) leave HBM mostly idle. A prefetch issued before those ops moves
// the weight during them.
#include <cuda_runtime.h>

#include <cstddef>

namespace rill::cuda {

// The least bytes one bulk prefetch request covers (larger regions take
// larger requests: at most two blocks of 32 requests an SM).
inline constexpr size_t kPrefetchChunk = 16 << 10;

// How the requests are made: kBulk, sm_90's cp.async.bulk.prefetch.L2 (a
// request per thread, no registers or shared memory held while the bytes
// move; nothing on older devices); kLines, a prefetch.global.L2 per
// 128-byte line.
enum class PrefetchForm { kBulk, kLines };

// Requests [p, p + bytes) into L2 from a small kernel on `stream`. With
// `programmatic` it is launched behind the stream's previous kernel
// (programmatic launch: the requests go out while that kernel drains) and
// waits for that kernel before it exits, so a later kernel's programmatic
// wait still covers every kernel before it. A hint: no value anywhere
// depends on it. p must be 16-byte aligned; the last partial 16 bytes are
// not requested.
void prefetch_l2(const void* p, size_t bytes, cudaStream_t stream, PrefetchForm form = PrefetchForm::kBulk,
                 bool programmatic = true);

// The byte caps of Backend::prefetch's calls, by the call's place in a
// Llama layer (0: o before RoPE, 1: gate/up before the FFN norm, 2: the
// next qkv or the head after down), from RILL_CUDA_PREFETCH: "MB" for all
// three or "MB,MB,MB", whole megabytes (2^20 bytes), 0 for none. Null or
// empty gives `fallback`; anything else malformed gives false (the caller
// says so once and keeps `fallback`).
struct PrefetchCaps {
  size_t bytes[3] = {0, 0, 0};
};
bool parse_prefetch_caps(const char* text, PrefetchCaps& caps);

}  // namespace rill::cuda
