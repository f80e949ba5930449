// matmul driver: quantize the activations once, then tile weight rows x
// token rows and spread weight-row chunks across the pool.
#include <algorithm>
#include <cassert>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"

namespace rill::cpu {

size_t matmul_scratch_bytes(DType w, int64_t n_cols, int64_t n_tokens) {
  const DType p = vec_dot_partner(w);
  if (p == DType::kF32) return 0;  // x is used in place
  return row_bytes(p, n_cols) * static_cast<size_t>(n_tokens);
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, Scratch& scratch,
            int64_t y_stride) {
  if (n_tokens <= 0 || w.n_rows <= 0) return;
  if (y_stride == 0) y_stride = w.n_rows;
  const Kernels& k = kernels();
  const int64_t n = w.n_cols;
  const DType partner = vec_dot_partner(w.dtype);
  const GemmTileFn gemm = k.gemm[static_cast<size_t>(w.dtype)];
  assert(gemm);

  // For llama.cpp parity every (row, token) dot uses the same kernel and sum
  // order whatever the batch size (llama.cpp runs vec_dot per pair).
  const void* a = x;
  size_t a_stride = static_cast<size_t>(n) * sizeof(float);
  if (partner != DType::kF32) {
    assert(scratch.size() >= matmul_scratch_bytes(w.dtype, n, n_tokens));
    a_stride = row_bytes(partner, n);
    auto* q = static_cast<uint8_t*>(scratch.data());
    const QuantizeRowFn quantize = k.quantize[static_cast<size_t>(partner)];
    auto quantize_rows = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) quantize(x + t * n, q + static_cast<size_t>(t) * a_stride, n);
    };
    if (n_tokens < 8) quantize_rows(0, n_tokens);
    else pool.parallel_for(n_tokens, 4, quantize_rows);
    a = q;
  }

  // Chunks of weight rows: a multiple of the tile height, small enough that
  // every thread gets several (the pool hands them out dynamically).
  const int64_t n_threads = pool.n_threads();
  int64_t chunk = w.n_rows / (n_threads * (n_tokens == 1 ? 8 : 4));
  chunk = std::max<int64_t>(kMaxTileRows, chunk / kMaxTileRows * kMaxTileRows);
  if (n_tokens > 1) chunk = std::min<int64_t>(chunk, 64);
  const int64_t n_chunks = (w.n_rows + chunk - 1) / chunk;
  // Tokens are processed in blocks so a block's activations stay in cache
  // while the chunk's weight rows stream over them.
  constexpr int64_t kTokenBlock = 64;
  const auto* wb = static_cast<const uint8_t*>(w.data);
  const auto* ab = static_cast<const uint8_t*>(a);
  pool.parallel_for(n_chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t r0 = c * chunk, r1 = std::min(w.n_rows, r0 + chunk);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
        const int64_t t1 = std::min(n_tokens, t0 + kTokenBlock);
        for (int64_t r = r0; r < r1; r += kMaxTileRows) {
          const int n_r = static_cast<int>(std::min<int64_t>(kMaxTileRows, r1 - r));
          for (int64_t t = t0; t < t1; t += kMaxTileCols) {
            const int n_t = static_cast<int>(std::min<int64_t>(kMaxTileCols, t1 - t));
            gemm(n, wb + static_cast<size_t>(r) * w.row_stride, w.row_stride, n_r,
                 ab + static_cast<size_t>(t) * a_stride, a_stride, n_t, y + t * y_stride + r, y_stride);
          }
        }
      }
    }
  });
}

}  // namespace rill::cpu
