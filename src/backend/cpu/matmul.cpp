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

namespace {

// Quantizes x ([n_tokens, n] f32) to `partner` in scratch; returns the
// activation rows and their stride (x itself for f32 partners).
const uint8_t* prepare_activations(const Kernels& k, DType partner, const float* x, int64_t n, int64_t n_tokens,
                                   ThreadPool& pool, Scratch& scratch, size_t* a_stride) {
  if (partner == DType::kF32) {
    *a_stride = static_cast<size_t>(n) * sizeof(float);
    return reinterpret_cast<const uint8_t*>(x);
  }
  *a_stride = row_bytes(partner, n);
  assert(scratch.size() >= *a_stride * static_cast<size_t>(n_tokens));
  auto* q = static_cast<uint8_t*>(scratch.data());
  const QuantizeRowFn quantize = k.quantize[static_cast<size_t>(partner)];
  const size_t stride = *a_stride;
  auto quantize_rows = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) quantize(x + t * n, q + static_cast<size_t>(t) * stride, n);
  };
  if (n_tokens < 8)
    quantize_rows(0, n_tokens);
  else
    pool.parallel_for(n_tokens, 4, quantize_rows);
  return q;
}

// One weight's share of a matmul job, split in chunks of rows.
struct MatJob {
  const WeightView* w;
  GemmTileFn gemm;
  float* y;
  int64_t y_stride;
  int64_t chunk;  // rows per chunk: a multiple of the tile height
  int64_t n_chunks;
  int64_t token_block;  // token rows per gemm call
};

MatJob plan(const Kernels& k, const WeightView& w, float* y, int64_t y_stride, int64_t n_tokens, int n_threads) {
  MatJob j{&w, k.gemm[static_cast<size_t>(w.dtype)], y, y_stride == 0 ? w.n_rows : y_stride, 0, 0, 0};
  // 64 tokens a call: a block's activations stay in cache while the chunk's rows stream over them.
  const int max_tokens = k.gemm_max_tokens[static_cast<size_t>(w.dtype)];
  j.token_block = max_tokens > 0 ? max_tokens : 64;
  assert(j.gemm);
  // Small enough that every thread gets several chunks (handed out dynamically).
  int64_t chunk = w.n_rows / (n_threads * (n_tokens == 1 ? 8 : 4));
  chunk = std::max<int64_t>(kMaxTileRows, chunk / kMaxTileRows * kMaxTileRows);
  // At most 64 rows (they stay in cache across the token tiles); 128 for
  // the gemms that take a whole prefill per call (their repacked rows stay
  // in L2, and each call permutes all the tokens' activations once: fewer
  // calls, fewer permutes).
  const int64_t max_rows = max_tokens > 0 ? 128 : 64;
  if (n_tokens > 1 && chunk > max_rows) {
    // In a number of chunks that the threads share evenly: 576 rows on 2
    // threads are 10 chunks of 60 (5 each), not 9 of 64 (5 and 4).
    const int64_t n_min = (w.n_rows + max_rows - 1) / max_rows;
    const int64_t n_even = (n_min + n_threads - 1) / n_threads * n_threads;
    chunk = (w.n_rows + n_even - 1) / n_even;
    chunk = (chunk + kMaxTileRows - 1) / kMaxTileRows * kMaxTileRows;
  }
  j.chunk = chunk;
  j.n_chunks = (w.n_rows + chunk - 1) / chunk;
  return j;
}

// Rows [r0, r1) of one weight against all tokens, in blocks of
// j.token_block tokens; the gemm function tiles the chunk x token block itself.
void run_chunk(const MatJob& j, int64_t c, const uint8_t* a, size_t a_stride, int64_t n_tokens) {
  const WeightView& w = *j.w;
  const auto* wb = static_cast<const uint8_t*>(w.data);
  const int64_t r0 = c * j.chunk, r1 = std::min(w.n_rows, r0 + j.chunk);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += j.token_block) {
    const int64_t t1 = std::min(n_tokens, t0 + j.token_block);
    j.gemm(w.n_cols, wb + static_cast<size_t>(r0) * w.row_stride, w.row_stride, static_cast<int>(r1 - r0),
           a + static_cast<size_t>(t0) * a_stride, a_stride, static_cast<int>(t1 - t0), j.y + t0 * j.y_stride + r0,
           j.y_stride);
  }
}

}  // namespace

// Every (row, token) dot gives the same bits whatever the batch size: the
// one-token and prefill tiles compute the type's one dot definition (for
// most types llama.cpp's vec_dot order; Q4_K/Q5_K/Q6_K/IQ4_XS: exact int32s
// per super-block, quants_ref.cpp / quants_iq_ref.cpp), so the kernel chosen by token count never
// changes a result.
void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, Scratch& scratch,
            int64_t y_stride) {
  if (n_tokens <= 0 || w.n_rows <= 0) return;
  const Kernels& k = kernels();
  size_t a_stride = 0;
  const uint8_t* a = prepare_activations(k, vec_dot_partner(w.dtype), x, w.n_cols, n_tokens, pool, scratch, &a_stride);
  const MatJob j = plan(k, w, y, y_stride, n_tokens, pool.n_threads());
  pool.parallel_for(j.n_chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) run_chunk(j, c, a, a_stride, n_tokens);
  });
}

void matmul_group(const WeightView* const* ws, float* const* ys, int n_mats, const float* x, int64_t n_tokens,
                  ThreadPool& pool, Scratch& scratch, const int64_t* y_strides) {
  assert(n_mats >= 1 && n_mats <= kMaxMatmulGroup);
  if (n_tokens <= 0) return;
  const Kernels& k = kernels();
  const DType partner = vec_dot_partner(ws[0]->dtype);
  for (int i = 1; i < n_mats; ++i) {
    assert(ws[i]->n_cols == ws[0]->n_cols && vec_dot_partner(ws[i]->dtype) == partner);
  }
  size_t a_stride = 0;
  const uint8_t* a = prepare_activations(k, partner, x, ws[0]->n_cols, n_tokens, pool, scratch, &a_stride);
  MatJob jobs[kMaxMatmulGroup];
  int64_t first_chunk[kMaxMatmulGroup + 1] = {0};
  for (int i = 0; i < n_mats; ++i) {
    jobs[i] = plan(k, *ws[i], ys[i], y_strides ? y_strides[i] : 0, n_tokens, pool.n_threads());
    first_chunk[i + 1] = first_chunk[i] + jobs[i].n_chunks;
  }
  pool.parallel_for(first_chunk[n_mats], 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int i = 0;
      while (c >= first_chunk[i + 1]) ++i;
      run_chunk(jobs[i], c - first_chunk[i], a, a_stride, n_tokens);
    }
  });
}

}  // namespace rill::cpu
