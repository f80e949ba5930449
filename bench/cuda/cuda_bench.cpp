// bench_cuda: the CUDA Llama's forward pass on one device, measured at the
// model interface (Model::forward: upload of the step's indices, every
// kernel, logits back to the host), next to the ceilings measured in the
// same run: device-to-device copy bandwidth and the bf16 GEMM rate.
//
//   bench_cuda MODEL_DIR [--steps N] [--batches 1,8,...] [--json OUT]
//   (--graphs 0: decode without CUDA graphs, ModelOptions::cuda_graphs)
//   bench_cuda MODEL_DIR --kernels 1: the decode GEMV shapes alone (every
//   GEMV configuration and cuBLASLt) and the small per-layer kernels
//   bench_cuda MODEL --quant-kernels 1: the quantized GEMV (quant_gemv,
//   1 and 8 tokens) and dequantize + cuBLASLt (64 tokens) over the 8B's
//   matrix shapes in Q4_K, Q6_K and Q8_0 (MODEL is not read); 2: the
//   dequantization alone (GB/s of quantized bytes read plus bf16 bytes
//   written) and dequantize + cuBLASLt at 64 tokens only, also in slabs
//   of rows of 8 / 16 / 32 MB in bf16; --quant-only TYPE:SHAPE (Q4_K:gate_up):
//   that matrix only; Q8_0 also times the dp4a GEMV (quantize_x8 +
//   q8_dp4a_gemv, 1 and 8 tokens) from the GGUF blocks and from the
//   repacked rows, and each decode kernel again as 16 launches back to
//   back ("x16": per call, without the launch latency of one timed call)
//   bench_cuda MODEL_DIR --profile-step B: one decode step of batch B inside
//   cudaProfilerStart/Stop, for ncu --profile-from-start off
//   bench_cuda MODEL_DIR --tensor-parallel 1,2,4: the same measurements for
//   the model split over each number of GPUs in turn (one model at a time,
//   in this one run), then the decode scaling: tok/s at N over tok/s at the
//   first N, and that speedup's efficiency (speedup / N * first N)
//   bench_cuda MODEL_DIR --batch-invariant 0,1: the same measurements with
//   ModelOptions::batch_invariant off, then on (one model at a time)
//   bench_cuda MODEL_DIR --profile-prefill 1: the same for the forward of
//   one 2,048-token prompt (after a warm-up forward)
//   bench_cuda MODEL_DIR --quantize fp8: the model with FP8 weights
//   (ModelOptions::quantize; the roofline counts their bytes)
//   bench_cuda MODEL_DIR --kv-type q8_0: K and V stored in that KV type
//   (model/kv_types.h; the roofline counts its bytes per token; k4a
//   calibrates on the built-in text, or fixed ids without a tokenizer)
//   bench_cuda MODEL_DIR --prefill N: the prefill row for one prompt of N
//   tokens in one forward (default 2,048; long prompts: 16,384, 32,768;
//   the forward's token budget is N, and N > 4,096 times 2 runs, not 4)
//   bench_cuda MODEL_DIR --kv-fit F: the KV pool sized as rill serve sizes
//   it at --gpu-memory-fraction F (every byte up to F of device memory
//   after weights and activations), reported as 4,096-token sequences
//   that fit (the pool must still hold the bench's own sequences; k4c /
//   k4a: also the count when each sequence brings its own tail slot)
//   bench_cuda none --mixed-attention 1: decode attention alone on steps
//   mixing one long context with short ones, the block size chosen by the
//   grid and by its working blocks (attention_decode.h), then exit
//   bench_cuda MODEL_DIR --context N: decode after prompts of N tokens
//   (default 128; long contexts make attention's KV reads a large part of
//   a step, the regime where a smaller KV type pays)
//
// Reports: decode tok/s at batch 1/8/32/64/128 (128-token prompts, then N
// steps; median step; greedy on the device, and with full logits copied
// to the host as Model::forward does), batch 1's fraction of the bandwidth roofline (bytes
// read per step / measured copy bandwidth), prefill tok/s of one
// 2,048-token prompt and its fraction of the GEMM peak, the forward time
// of a 128-token prompt (TTFT at the model, no queueing) and the KV
// cache's bytes per token (Model::kv_bytes_per_token, /stats' figure).
//
// Mixtures of experts (config n_expert > 0): a token reads and multiplies
// only its K of X experts. Prefill FLOPs count the routed experts only
// (K / X of the expert matrices); decode bytes per step count the experts
// a batch of B touches as X (1 - (1 - K/X)^B) per layer, the expected
// number under uniform routing (random weights route nearly uniformly).
// Hybrid models (a recurrent KV group: qwen3.5) get a state slot per
// sequence; their decode bytes count each sequence's state read and
// written, and the report gives the memory of one state (a live slot or a
// checkpoint).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cuda/attention_decode.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/quant.h"
#include "core/e4m3.h"
#include "engine/kv_calibration.h"
#include "loader/model_files.h"
#include "model/registry.h"

namespace rill {
namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Device-to-device copy of 4 GiB, counting bytes read + written (GB/s).
double copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&a, bytes));
  RILL_CUDA_CHECK(cudaMalloc(&b, bytes));
  RILL_CUDA_CHECK(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    cudaEventRecord(e0);
    RILL_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 2) t.push_back(ms);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / (median(t) * 1e-3) / 1e9;
}

// bf16 8192^3 through rill's cuBLASLt wrapper (f32 output), TFLOP/s.
double gemm_peak(const cuda::Context& ctx) {
  const int64_t n = 8192;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&a, n * n * 2));
  RILL_CUDA_CHECK(cudaMalloc(&b, n * n * 2));
  RILL_CUDA_CHECK(cudaMalloc(&c, n * n * 4));
  // Random-ish bits (not zeros: zeros run faster than real data).
  std::vector<uint16_t> h(static_cast<size_t>(n * n));
  uint32_t s = 12345;
  for (auto& x : h) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<uint16_t>(0x3c00 | ((s >> 16) & 0x3ff)) ^ static_cast<uint16_t>((s >> 31) << 15);
  }
  RILL_CUDA_CHECK(cudaMemcpy(a, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  RILL_CUDA_CHECK(cudaMemcpy(b, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  cuda::Gemm g(ctx);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0, ctx.stream());
    if (!g.run(DType::kBF16, a, b, n, n, n, static_cast<float*>(c), false).ok()) return 0;
    cudaEventRecord(e1, ctx.stream());
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms);
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * n / (median(t) * 1e-3) / 1e12;
}

void attention_bench(const cuda::Context& ctx);

// The 8B decode GEMV shapes at one token through every GEMV configuration
// and cuBLASLt, weights rotating over 3 copies (each set is 1.5 GB, far
// beyond L2), GB/s of weight reads.
void kernel_bench(const cuda::Context& ctx) {
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096},
                          {"o", 4096, 4096},
                          {"gate_up", 28672, 4096},
                          {"down", 4096, 14336},
                          {"lm_head", 128256, 4096}};
  constexpr int kCopies = 3;
  std::vector<void*> w[5];
  for (int i = 0; i < 5; ++i) {
    for (int c = 0; c < kCopies; ++c) {
      void* p = nullptr;
      RILL_CUDA_CHECK(cudaMalloc(&p, shapes[i].rows * shapes[i].cols * 2));
      RILL_CUDA_CHECK(cudaMemset(p, 0x3b + c, shapes[i].rows * shapes[i].cols * 2));
      w[i].push_back(p);
    }
  }
  void *x = nullptr, *y = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&x, 14336 * 2 * 8));
  RILL_CUDA_CHECK(cudaMemset(x, 0x3c, 14336 * 2 * 8));
  RILL_CUDA_CHECK(cudaMalloc(&y, 128256 * 4 * 8));
  cuda::Gemm gemm(ctx);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  auto time = [&](auto&& fn) {
    std::vector<double> t;
    for (int rep = 0; rep < 24; ++rep) {
      cudaEventRecord(e0, ctx.stream());
      fn(rep % kCopies);
      cudaEventRecord(e1, ctx.stream());
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (rep >= 3) t.push_back(ms);
    }
    return median(t);
  };
  for (int i = 0; i < 5; ++i) {
    const Shape& sh = shapes[i];
    const double bytes = 2.0 * sh.rows * sh.cols;
    std::printf("kernel %-8s %6lld x %5lld:", sh.name, static_cast<long long>(sh.rows),
                static_cast<long long>(sh.cols));
    for (int v = 0; v < cuda::gemv_n_variants(); ++v) {
      const double ms = time(
          [&](int c) { cuda::gemv_variant(v, w[i][c], x, sh.rows, sh.cols, static_cast<float*>(y), ctx.stream()); });
      std::printf("  v%d %.1f us %.0f GB/s", v, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    }
    for (int n : {1, 8}) {
      const double ms = time(
          [&](int c) { (void)gemm.run(DType::kBF16, w[i][c], x, n, sh.rows, sh.cols, static_cast<float*>(y), false); });
      std::printf("  cublas n=%d %.1f us %.0f GB/s", n, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
    }
    for (int n : {2, 4, 8}) {
      const double ms = time([&](int c) {
        cuda::gemv(DType::kBF16, w[i][c], x, n, sh.rows, sh.cols, static_cast<float*>(y), false, ctx.stream());
      });
      std::printf("  gemv n=%d %.1f us", n, ms * 1e3);
    }
    std::printf("\n");
  }
  // Small per-layer kernels at one token.
  void* f = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&f, 64 << 20));
  RILL_CUDA_CHECK(cudaMemset(f, 0x3c, 64 << 20));  // f32 ~0.0115 everywhere
  float* ff = static_cast<float*>(f);
  const double t_norm = time([&](int) {
    cuda::rms_norm(ff, 4096, nullptr, ff + 8192, 1, 4096, 1e-5f, 0.0f, DType::kBF16, ff + 16384, ctx.stream());
  });
  const double t_silu = time([&](int) { cuda::silu_mul(ff, 1, 14336, DType::kBF16, ff + 40000, ctx.stream()); });
  std::printf("kernel small: rms_norm 4096 %.1f us, silu_mul 14336 %.1f us\n", t_norm * 1e3, t_silu * 1e3);
  attention_bench(ctx);
  for (auto& v : w)
    for (void* p : v) cudaFree(p);
  cudaFree(x);
  cudaFree(y);
  cudaFree(f);
}

// Decode attention alone, Llama-3.1-8B's heads (32 q / 8 KV, head_dim 128,
// f16 KV in 16-token blocks): B sequences of L keys, the fast and the
// general kernel, 32 launches back to back rotating over copies of the
// cache (several times the L2 in all), per launch; GB/s of K and V read.
void attention_bench(const cuda::Context& ctx) {
  constexpr int32_t kHeads = 32, kKvHeads = 8, kHd = 128, kRowElems = kKvHeads * kHd, kQkv = 6144;
  const size_t cache_bytes = size_t{1} << 30;  // per K and V, all copies
  void *k = nullptr, *v = nullptr, *q = nullptr, *part = nullptr, *out = nullptr, *meta = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&k, cache_bytes));
  RILL_CUDA_CHECK(cudaMalloc(&v, cache_bytes));
  RILL_CUDA_CHECK(cudaMemset(k, 0x2e, cache_bytes));  // f16 ~0.1: the timing's data, not zeros
  RILL_CUDA_CHECK(cudaMemset(v, 0x3a, cache_bytes));
  RILL_CUDA_CHECK(cudaMalloc(&q, 64 * kQkv * 4));
  RILL_CUDA_CHECK(cudaMemset(q, 0x3e, 64 * kQkv * 4));
  RILL_CUDA_CHECK(cudaMalloc(&part, cuda::attention_partial_floats(64, kHeads, kHd) * 4));
  RILL_CUDA_CHECK(cudaMalloc(&out, 64 * kHeads * kHd * 2));
  const size_t meta_ints = 5 * 64 + 64 * 256;
  RILL_CUDA_CHECK(cudaMalloc(&meta, meta_ints * 4));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int B : {1, 64}) {
    for (int L : {160, 1000, 4000}) {
      const int32_t blocks_per_seq = (L + 15) / 16;
      const size_t copy_rows = static_cast<size_t>(B) * blocks_per_seq * 16;
      const int n_copies = static_cast<int>(std::min<size_t>(1024, cache_bytes / (copy_rows * kRowElems * 2)));
      std::vector<int32_t> h(meta_ints, 0);
      int32_t* dec = h.data();
      int32_t* pos = dec + 64;
      int32_t* seq = pos + 64;
      int32_t* tstart = seq + 64;
      int32_t* tables = tstart + 128;
      for (int s = 0; s < B; ++s) {
        dec[s] = s;
        pos[s] = L - 1;
        seq[s] = s;
        tstart[s] = s * blocks_per_seq;
        for (int b = 0; b < blocks_per_seq; ++b) tables[s * blocks_per_seq + b] = s * blocks_per_seq + b;
      }
      RILL_CUDA_CHECK(cudaMemcpy(meta, h.data(), meta_ints * 4, cudaMemcpyHostToDevice));
      const auto* dm = static_cast<const int32_t*>(meta);
      cuda::AttentionArgs a;
      a.q = static_cast<const float*>(q);
      a.q_stride = kQkv;
      a.n_head = kHeads;
      a.n_head_kv = kKvHeads;
      a.head_dim = kHd;
      a.scale = 0.088f;
      a.kv_dtype = DType::kF16;
      a.block_shift = 4;
      a.decode_tokens = dm;
      a.pos = dm + 64;
      a.seq_of = dm + 128;
      a.table_start = dm + 192;
      a.block_tables = dm + 320;
      a.n_decode = B;
      a.max_decode_len = L;
      a.partial = static_cast<float*>(part);
      a.out_dtype = DType::kBF16;
      a.out = out;
      double us[2];
      for (int general = 0; general < 2; ++general) {
        a.general_decode = general == 1;
        std::vector<double> t;
        for (int rep = 0; rep < 8; ++rep) {
          cudaEventRecord(e0, ctx.stream());
          for (int i = 0; i < 32; ++i) {
            const size_t off = static_cast<size_t>((rep * 32 + i) % n_copies) * copy_rows * kRowElems * 2;
            a.k_cache = static_cast<const uint8_t*>(k) + off;
            a.v_cache = static_cast<const uint8_t*>(v) + off;
            cuda::attention(a, ctx.stream());
          }
          cudaEventRecord(e1, ctx.stream());
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (rep >= 2) t.push_back(ms * 1e3 / 32);
        }
        us[general] = median(t);
      }
      const double kv_bytes = 2.0 * B * L * kRowElems * 2;
      std::printf(
          "kernel attention decode B=%2d L=%4d (%2d splits): fast %.1f us (%.0f GB/s), general %.1f us (%.0f GB/s)\n",
          B, L, cuda::decode_splits(L), us[0], kv_bytes / (us[0] * 1e-6) / 1e9, us[1], kv_bytes / (us[1] * 1e-6) / 1e9);
    }
  }
  for (void* p : {k, v, q, part, out, meta}) cudaFree(p);
}

// The decode block choice on steps mixing one long context with short
// ones (the 8B's attention shape, f16 KV): B decode tokens, token 0 at
// LONG keys and the others at 160, the grid as a decode graph launches it
// (the long token's splits rounded up to a power of two). Each launch
// timed with the block chosen by the whole grid (work 0), by the working
// blocks (decode_work_bucket of the tokens' splits, as the runtime passes
// it) and forced to 8, 4 and 2 warps; K/V rotate over copies past the L2.
void mixed_attention_bench(const cuda::Context& ctx) {
  constexpr int32_t kHeads = 32, kKvHeads = 8, kHd = 128, kRowElems = kKvHeads * kHd, kQkv = 6144, kMax = 64;
  const size_t cache_bytes = size_t{1} << 30;  // per K and V, all copies
  void *k = nullptr, *v = nullptr, *q = nullptr, *part = nullptr, *out = nullptr, *meta = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&k, cache_bytes));
  RILL_CUDA_CHECK(cudaMalloc(&v, cache_bytes));
  RILL_CUDA_CHECK(cudaMemset(k, 0x2e, cache_bytes));
  RILL_CUDA_CHECK(cudaMemset(v, 0x3a, cache_bytes));
  RILL_CUDA_CHECK(cudaMalloc(&q, kMax * kQkv * 4));
  RILL_CUDA_CHECK(cudaMemset(q, 0x3e, kMax * kQkv * 4));
  RILL_CUDA_CHECK(cudaMalloc(&part, cuda::attention_partial_floats(kMax, kHeads, kHd) * 4));
  RILL_CUDA_CHECK(cudaMalloc(&out, kMax * kHeads * kHd * 2));
  const size_t meta_ints = 4 * kMax + 8192;
  RILL_CUDA_CHECK(cudaMalloc(&meta, meta_ints * 4));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int B : {8, 16, 32, 64}) {
    for (int L : {2000, 8000}) {
      std::vector<int32_t> h(meta_ints, 0);
      int32_t* dec = h.data();
      int32_t* pos = dec + kMax;
      int32_t* seq = pos + kMax;
      int32_t* tstart = seq + kMax;
      int32_t* tables = tstart + kMax;
      int32_t n_blocks = 0;
      int64_t splits = 0;
      for (int s = 0; s < B; ++s) {
        const int32_t len = s == 0 ? L : 160;
        dec[s] = s;
        pos[s] = len - 1;
        seq[s] = s;
        tstart[s] = n_blocks;
        for (int b = 0; b < (len + 15) / 16; ++b, ++n_blocks) tables[n_blocks] = n_blocks;
        splits += cuda::decode_splits(len);
      }
      const size_t copy_rows = static_cast<size_t>(n_blocks) * 16;
      const int n_copies = static_cast<int>(std::min<size_t>(1024, cache_bytes / (copy_rows * kRowElems * 2)));
      int32_t bucket = 1;
      while (bucket < cuda::decode_splits(L)) bucket *= 2;
      RILL_CUDA_CHECK(cudaMemcpy(meta, h.data(), meta_ints * 4, cudaMemcpyHostToDevice));
      const auto* dm = static_cast<const int32_t*>(meta);
      cuda::AttentionArgs a;
      a.q = static_cast<const float*>(q);
      a.q_stride = kQkv;
      a.n_head = kHeads;
      a.n_head_kv = kKvHeads;
      a.head_dim = kHd;
      a.scale = 0.088f;
      a.kv_dtype = DType::kF16;
      a.block_shift = 4;
      a.decode_tokens = dm;
      a.pos = dm + kMax;
      a.seq_of = dm + 2 * kMax;
      a.table_start = dm + 3 * kMax;
      a.block_tables = dm + 4 * kMax;
      a.n_decode = B;
      a.max_decode_len = bucket * cuda::kSplitKeys;
      a.partial = static_cast<float*>(part);
      a.out_dtype = DType::kBF16;
      a.out = out;
      const int32_t work = cuda::decode_work_bucket(splits);
      struct Mode {
        int32_t warps, work;
      };
      const Mode modes[] = {{0, 0}, {0, work}, {8, 0}, {4, 0}, {2, 0}};
      double us[5];
      for (int mi = 0; mi < 5; ++mi) {
        std::vector<double> t;
        for (int rep = 0; rep < 8; ++rep) {
          cudaEventRecord(e0, ctx.stream());
          for (int i = 0; i < 32; ++i) {
            const size_t off = static_cast<size_t>((rep * 32 + i) % n_copies) * copy_rows * kRowElems * 2;
            a.k_cache = static_cast<const uint8_t*>(k) + off;
            a.v_cache = static_cast<const uint8_t*>(v) + off;
            cuda::attention(a, ctx.stream(), modes[mi].warps, modes[mi].work);
          }
          cudaEventRecord(e1, ctx.stream());
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (rep >= 2) t.push_back(ms * 1e3 / 32);
        }
        us[mi] = median(t);
      }
      std::printf(
          "kernel attention mixed B=%2d long=%4d (grid %d x %d x %d, working %lld -> %d): by grid %d warps %.1f us, by "
          "working blocks %d warps %.1f us; 8 / 4 / 2 warps %.1f / %.1f / %.1f us\n",
          B, L, kKvHeads, bucket, B, static_cast<long long>(splits), work, cuda::decode_fast_warps(a, bucket, 0, 0),
          us[0], cuda::decode_fast_warps(a, bucket, 0, work), us[1], us[2], us[3], us[4]);
    }
  }
  for (void* p : {k, v, q, part, out, meta}) cudaFree(p);
}

// The 8B's decode matrices in GGUF block types (every byte 0x11: scales
// are a small f16, no NaN; 3 copies rotating, beyond the L2), one token
// and 8 through quant_gemv, 64 through dequantize_rows (bf16) + cuBLASLt;
// GB/s of quantized weight bytes read. dequant_only: the dequantization
// alone and with the GEMM, nothing else.
// only: "TYPE:SHAPE" (Q4_K:gate_up) measures that one matrix (for ncu).
void quant_kernel_bench(const cuda::Context& ctx, bool dequant_only, const std::string& only) {
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096},
                          {"o", 4096, 4096},
                          {"gate_up", 28672, 4096},
                          {"down", 4096, 14336},
                          {"lm_head", 128256, 4096}};
  constexpr int kCopies = 3;
  void *x = nullptr, *y = nullptr, *scratch = nullptr;
  RILL_CUDA_CHECK(cudaMalloc(&x, 14336 * 2 * 64));
  RILL_CUDA_CHECK(cudaMemset(x, 0x3c, 14336 * 2 * 64));
  RILL_CUDA_CHECK(cudaMalloc(&y, 128256 * 4 * 64));
  RILL_CUDA_CHECK(cudaMalloc(&scratch, 128256 * 4096 * 2));
  float* part = nullptr;  // a slab's GEMM output
  RILL_CUDA_CHECK(cudaMalloc(&part, 64 * 16384 * 4));
  cuda::Gemm gemm(ctx);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (DType t : {DType::kQ4_K, DType::kQ6_K, DType::kQ8_0}) {
    for (const Shape& sh : shapes) {
      if (!only.empty() && only != std::string(dtype_name(t)) + ":" + sh.name) continue;
      const size_t bytes = row_bytes(t, sh.cols) * static_cast<size_t>(sh.rows);
      std::vector<void*> w;
      for (int c = 0; c < kCopies; ++c) {
        void* p = nullptr;
        RILL_CUDA_CHECK(cudaMalloc(&p, bytes));
        RILL_CUDA_CHECK(cudaMemset(p, 0x11, bytes));
        w.push_back(p);
      }
      auto time = [&](auto&& fn) {
        std::vector<double> ts;
        for (int rep = 0; rep < 24; ++rep) {
          cudaEventRecord(e0, ctx.stream());
          fn(w[static_cast<size_t>(rep % kCopies)]);
          cudaEventRecord(e1, ctx.stream());
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (rep >= 3) ts.push_back(ms);
        }
        return median(ts);
      };
      std::printf("quant %-5s %-8s %6lld x %5lld (%6.1f MB):", std::string(dtype_name(t)).c_str(), sh.name,
                  static_cast<long long>(sh.rows), static_cast<long long>(sh.cols), bytes / 1e6);
      const double dq =
          time([&](void* p) { cuda::dequantize_rows(t, p, sh.cols, 0, sh.rows, DType::kBF16, scratch, ctx.stream()); });
      std::printf("  dequant %.1f us %.0f GB/s;", dq * 1e3,
                  (static_cast<double>(bytes) + 2.0 * sh.rows * sh.cols) / (dq * 1e-3) / 1e9);
      for (int n : {1, 8}) {
        if (dequant_only) break;
        const double ms = time([&](void* p) {
          cuda::quant_gemv(t, p, DType::kBF16, x, n, sh.rows, sh.cols, static_cast<float*>(y), false, ctx.stream());
        });
        std::printf("  gemv n=%d %.1f us %.0f GB/s", n, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
      }
      const double ms = time([&](void* p) {
        cuda::dequantize_rows(t, p, sh.cols, 0, sh.rows, DType::kBF16, scratch, ctx.stream());
        (void)gemm.run(DType::kBF16, scratch, x, 64, sh.rows, sh.cols, static_cast<float*>(y), false);
      });
      std::printf("  dequant+gemm n=64 %.1f us;", ms * 1e3);
      // Slabs of rows small enough for the L2 (quant_matmul's LM-head
      // chunks): dequantize, multiply into a [64, slab] part, add it in.
      for (int64_t slab_mb : {8, 16, 32}) {
        const int64_t rows = std::min(sh.rows, slab_mb * (1 << 20) / 2 / sh.cols);
        if (!dequant_only || rows >= sh.rows) continue;
        const double sm = time([&](void* p) {
          for (int64_t r0 = 0; r0 < sh.rows; r0 += rows) {
            const int64_t rc = std::min(rows, sh.rows - r0);
            cuda::dequantize_rows(t, p, sh.cols, r0, rc, DType::kBF16, scratch, ctx.stream());
            (void)gemm.run(DType::kBF16, scratch, x, 64, rc, sh.cols, part, false);
            cuda::add_columns(part, 64, rc, static_cast<float*>(y), sh.rows, r0, false, ctx.stream());
          }
        });
        std::printf("  slabs of %lld MB %.1f us;", static_cast<long long>(slab_mb), sm * 1e3);
      }
      // The int8 path: quantize_x8 into the scratch, then quant_mma (past
      // 16 tokens quant_mmq where eligible: RILL_QUANT_MMQ=0 and
      // RILL_QUANT_MMQ_ROWS choose, quant.h).
      for (int n : {1, 8, 16, 32, 64}) {
        if (dequant_only) break;
        const double mm = time([&](void* p) {
          cuda::quantize_x8(DType::kBF16, x, n, sh.cols, scratch, ctx.stream());
          cuda::quant_mma(t, p, scratch, n, sh.rows, sh.cols, static_cast<float*>(y), sh.rows, false, ctx.stream());
        });
        std::printf("  mma n=%d %.1f us %.0f GB/s", n, mm * 1e3, bytes / (mm * 1e-3) / 1e9);
      }
      if (t == DType::kQ8_0 && !dequant_only) {
        // The dp4a GEMV (quant.h): x quantized as for quant_mma, weights
        // from the GGUF blocks and from their repacked rows (copies of the
        // same bytes, made here).
        std::vector<void*> packed;
        for (void* p : w) {
          void* r = nullptr;
          RILL_CUDA_CHECK(cudaMalloc(&r, bytes));
          cuda::repack_q8_0_rows(p, sh.rows, sh.cols, r, ctx.stream());
          packed.push_back(r);
        }
        RILL_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
        auto dp4a = [&](cuda::Q8Layout layout, int n, void* p) {
          cuda::quantize_x8(DType::kBF16, x, n, sh.cols, scratch, ctx.stream());
          cuda::q8_dp4a_gemv(layout, p, scratch, n, sh.rows, sh.cols, static_cast<float*>(y), sh.rows, false,
                             ctx.stream());
        };
        // 16 calls back to back, copies rotating: per call.
        auto time16 = [&](auto&& fn) {
          std::vector<double> ts;
          for (int rep = 0; rep < 8; ++rep) {
            cudaEventRecord(e0, ctx.stream());
            for (int k = 0; k < 16; ++k) fn(k % kCopies);
            cudaEventRecord(e1, ctx.stream());
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep >= 2) ts.push_back(ms / 16);
          }
          return median(ts);
        };
        for (int n : {1, 8}) {
          const double g = time([&](void* p) { dp4a(cuda::Q8Layout::kGguf, n, p); });
          std::printf("  dp4a n=%d %.1f us %.0f GB/s", n, g * 1e3, bytes / (g * 1e-3) / 1e9);
        }
        int c = 0;
        for (int n : {1, 8}) {
          const double r =
              time([&](void*) { dp4a(cuda::Q8Layout::kRows, n, packed[static_cast<size_t>(c++ % kCopies)]); });
          std::printf("  dp4a-rows n=%d %.1f us %.0f GB/s", n, r * 1e3, bytes / (r * 1e-3) / 1e9);
        }
        std::printf("\n  x16 %-14s", sh.name);
        for (int n : {1, 8}) {
          const double g = time16([&](int k) {
            cuda::quant_gemv(t, w[static_cast<size_t>(k)], DType::kBF16, x, n, sh.rows, sh.cols, static_cast<float*>(y),
                             false, ctx.stream());
          });
          const double m = time16([&](int k) {
            cuda::quantize_x8(DType::kBF16, x, n, sh.cols, scratch, ctx.stream());
            cuda::quant_mma(t, w[static_cast<size_t>(k)], scratch, n, sh.rows, sh.cols, static_cast<float*>(y), sh.rows,
                            false, ctx.stream());
          });
          const double d = time16([&](int k) { dp4a(cuda::Q8Layout::kGguf, n, w[static_cast<size_t>(k)]); });
          const double r = time16([&](int k) { dp4a(cuda::Q8Layout::kRows, n, packed[static_cast<size_t>(k)]); });
          std::printf("  n=%d: gemv %.1f us %.0f GB/s, mma %.1f / %.0f, dp4a %.1f / %.0f, dp4a-rows %.1f / %.0f;", n,
                      g * 1e3, bytes / (g * 1e-3) / 1e9, m * 1e3, bytes / (m * 1e-3) / 1e9, d * 1e3,
                      bytes / (d * 1e-3) / 1e9, r * 1e3, bytes / (r * 1e-3) / 1e9);
        }
        for (void* p : packed) cudaFree(p);
      }
      std::printf("\n");
      for (void* p : w) cudaFree(p);
    }
  }
  cudaFree(x);
  cudaFree(y);
  cudaFree(scratch);
  cudaFree(part);
}

std::vector<int32_t> range_table(int32_t first, int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

std::vector<int> parse_list(const char* p) {
  std::vector<int> v;
  while (*p) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_cuda MODEL_DIR [--steps N] [--batches B,..] [--tensor-parallel N,..] [--batch-invariant "
                 "0,1] [--graphs 0|1] [--kv-type T] [--context N] [--prefill N] [--kv-fit F] [--json OUT]\n");
    return 2;
  }
  const std::string path = argv[1];
  int steps = 32;
  std::string json_out;
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int> tps = {1};
  std::vector<int> invs = {0};  // --batch-invariant 0,1: both modes in one run
  bool kernels = false;
  bool mixed_attention = false;  // --mixed-attention 1: mixed_attention_bench, then exit
  int quant_kernels = 0;
  std::string quant_only;
  bool graphs = true;
  int profile_batch = 0;         // > 0: one decode step of this batch between cudaProfilerStart/Stop, then exit
  bool profile_prefill = false;  // the second 2,048-token prefill between cudaProfilerStart/Stop, then exit
  bool fp8 = false;              // --quantize fp8
  std::string kv_type;           // --kv-type: K and V in this KV type
  int context = 128;             // --context: prompt tokens before the decode steps
  int prefill = 2048;            // --prefill: tokens of the timed prefill prompt
  double kv_fit = 0;             // --kv-fit F: the KV pool sized as rill serve sizes it (--gpu-memory-fraction F)
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--kv-type")) kv_type = argv[i + 1];
    if (!std::strcmp(argv[i], "--context")) context = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--prefill")) prefill = std::max(16, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--json")) json_out = argv[i + 1];
    if (!std::strcmp(argv[i], "--kernels")) kernels = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--quant-kernels")) quant_kernels = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--quant-only")) quant_only = argv[i + 1];
    if (!std::strcmp(argv[i], "--profile-step")) profile_batch = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--profile-prefill")) profile_prefill = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--batches")) batches = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tensor-parallel")) tps = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batch-invariant")) invs = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--graphs")) graphs = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--quantize")) fp8 = !std::strcmp(argv[i + 1], "fp8");
    if (!std::strcmp(argv[i], "--kv-fit")) kv_fit = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--mixed-attention")) mixed_attention = std::atoi(argv[i + 1]) != 0;
  }
  // One measured run per (tensor-parallel size, batch-invariant mode).
  struct RunCfg {
    int tp;
    bool invariant;
  };
  std::vector<RunCfg> cfgs;
  for (int tp : tps) {
    for (int inv : invs) cfgs.push_back({tp, inv != 0});
  }
  if (mixed_attention) {
    auto mctx = cuda::Context::create(0);
    if (!mctx.ok()) return 1;
    mixed_attention_bench(**mctx);
    return 0;
  }
  if (quant_kernels) {
    auto qctx = cuda::Context::create(0);
    if (!qctx.ok()) return 1;
    quant_kernel_bench(**qctx, quant_kernels == 2, quant_only);
    return 0;
  }
  const int kPrompt = context, kPrefill = prefill, kTtftPrompt = 128;
  const int kPrefillBlocks = (kPrefill + 15) / 16;
  const int kMaxBatch = std::max(profile_batch, *std::max_element(batches.begin(), batches.end()));
  // A slot holds the prompt, the decode steps and the warm-up ones, in whole blocks.
  const int kSlotTokens = std::max(512, (kPrompt + 2 * steps + 8 + 15) / 16 * 16);
  auto t_load = Clock::now();
  auto files = open_model_files(path);
  if (!files.ok()) {
    std::fprintf(stderr, "%s\n", files.error().message.c_str());
    return 1;
  }
  const double open_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  ModelOptions o;
  o.device = Device::kCuda;
  o.n_ctx = std::max({4096, kSlotTokens, kPrefillBlocks * 16});
  o.max_batch_tokens = kPrefill;
  o.max_batch_seqs = kMaxBatch;
  o.kv_block_size = 16;
  o.cuda_graphs = graphs;
  if (fp8) o.quantize = WeightQuantization::kFp8;
  if (!kv_type.empty()) {
    const std::optional<KvType> t = parse_kv_type(kv_type);
    const std::optional<KvLayerTypes> pair = parse_kv_pair(kv_type);  // k4c: K and V types of its own
    if (!t && !pair) {
      std::fprintf(stderr, "--kv-type %s: expected one of %s\n", kv_type.c_str(), kv_type_names().c_str());
      return 2;
    }
    if (pair) {
      o.kv_types.k = pair->k;
      o.kv_types.v = pair->v;
    } else {
      o.kv_types.k = o.kv_types.v = t;
    }
    // k4a calibrates its widths at load: the built-in text through the
    // model's tokenizer (rill's own path), or, with no tokenizer beside
    // the model, 256 fixed token ids (a random model's widths mean nothing
    // either way; the pass and its cost are what run).
    if (o.kv_types.mentions(kKvQ4Alloc)) {
      auto tok = (*files)->tokenizer_json_path.empty() ? Result<std::unique_ptr<Tokenizer>>(Error{"no tokenizer.json"})
                                                       : Tokenizer::from_tokenizer_json((*files)->tokenizer_json_path);
      const Status st = tok.ok() ? add_kv_calibration(tok->get(), o.kv_types) : Status(tok.error());
      if (!st.ok()) {
        const int64_t vocab = (*files)->config.n_vocab;
        o.kv_types.calibration_tokens.resize(256);
        for (size_t i = 0; i < 256; ++i) {
          o.kv_types.calibration_tokens[i] = static_cast<int32_t>((i * 7919 + 13) % static_cast<size_t>(vocab));
        }
        std::printf("k4a: calibrating on 256 fixed token ids (%s)\n", st.error().message.c_str());
      } else {
        std::printf("k4a: calibrating on the built-in text (%zu tokens)\n", o.kv_types.calibration_tokens.size());
      }
    }
  }
  const ModelConfig& c = (*files)->config;
  const int64_t hd = c.head_dim > 0 ? c.head_dim : c.n_embd / c.n_head;
  const int64_t kv_token = 2 * c.n_layer * c.n_head_kv * hd * 2;  // f16 KV (room to spare for smaller types)
  const int32_t slot_blocks = kSlotTokens / 16;
  const int32_t n_blocks = kMaxBatch * slot_blocks + kPrefillBlocks + 8;
  o.kv_cache_bytes = static_cast<int64_t>(n_blocks) * 16 * kv_token;  // tensor parallel: split over the GPUs
  if (kv_fit > 0) {  // the pool fills device memory up to the fraction instead (at least the bench's blocks)
    o.kv_cache_bytes = 0;
    o.gpu_memory_fraction = kv_fit;
  }

  // Weight bytes a decode step reads: every matrix but the embedding table
  // (MoE: the routed experts' matrices apart, see expert_fraction).
  size_t weight_bytes = 0, matmul_params = 0, expert_bytes = 0, expert_params = 0;
  for (const auto& [name, t] : (*files)->tensors) {
    if (name == "model.embed_tokens.weight" && (*files)->find("lm_head.weight")) continue;
    const bool expert = c.n_expert > 0 && name.find(".experts.") != std::string::npos;
    size_t bytes = t.n_bytes;  // FP8 weights: one byte per element and a 16-byte header per row
    if (fp8 && !expert && t.shape.size() == 2 && name != "model.embed_tokens.weight") {
      bytes = static_cast<size_t>(t.n_elements() + 16 * t.shape[0]);
    }
    (expert ? expert_bytes : weight_bytes) += bytes;
    if (t.shape.size() == 2 || expert) (expert ? expert_params : matmul_params) += static_cast<size_t>(t.n_elements());
  }
  const double used_share = c.n_expert > 0 ? double(c.n_expert_used) / double(c.n_expert) : 1.0;
  // Expected share of the experts a batch of B tokens touches (uniform routing).
  auto expert_fraction = [&](int B) { return 1.0 - std::pow(1.0 - used_share, B); };
  matmul_params += static_cast<size_t>(static_cast<double>(expert_params) * used_share);

  auto ctx = cuda::Context::create(0);
  if (!ctx.ok()) return 1;
  if (kernels) {
    kernel_bench(**ctx);
    return 0;
  }
  if (profile_batch > 0) batches = {profile_batch};
  const double bw = copy_bandwidth();
  const double peak = gemm_peak(**ctx);
  std::printf("device: %s\n", (*ctx)->describe().c_str());
  std::printf("ceilings: copy %.0f GB/s (read + write), bf16 GEMM 8192^3 %.0f TFLOP/s (GPU 0)\n", bw, peak);

  nlohmann::ordered_json j;
  j["device"] = (*ctx)->describe();
  j["copy_gb_s"] = bw;
  j["gemm_tflops"] = peak;
  std::vector<std::vector<double>> tok_s(cfgs.size());  // [run][batch] greedy decode tok/s
  for (size_t ti = 0; ti < cfgs.size(); ++ti) {
    const int n_gpus = cfgs[ti].tp;
    o.tensor_parallel = n_gpus;
    o.batch_invariant = cfgs[ti].invariant;
    const auto t_create = Clock::now();
    auto created = create_model(builtin_registry(), infer_profile(**files), *files, o);
    if (!created.ok()) {
      std::fprintf(stderr, "%s\n", created.error().message.c_str());
      return 1;
    }
    Model& m = **created;
    // The blocks a sequence's slot and the prefill take at the model's own
    // block size (k4c / k4a KV: 32, whatever kv_block_size asked).
    const int32_t bs = m.kv_block_size();
    const int32_t seq_blocks = (kSlotTokens + bs - 1) / bs;
    const int32_t prefill_blocks = (kPrefillBlocks * 16 + bs - 1) / bs;
    const double load_s = std::chrono::duration<double>(Clock::now() - t_create).count() + (ti == 0 ? open_s : 0);
    const int64_t V = m.n_vocab();
    if (cfgs.size() > 1) {
      std::printf("--- tensor parallel: %d GPU%s, batch invariant %s ---\n", n_gpus, n_gpus > 1 ? "s" : "",
                  cfgs[ti].invariant ? "on" : "off");
    }
    std::printf("model: %s, load + upload %.1f s, %.2f GB read per decode step (weights%s)\n", path.c_str(), load_s,
                (weight_bytes + expert_bytes * expert_fraction(1)) / 1e9, n_gpus > 1 ? ", all GPUs together" : "");
    if (c.n_expert > 0) {
      std::printf(
          "MoE: %lld of %lld experts per token; expert matrices %.2f GB (decode bytes count X (1 - (1 - K/X)^B) "
          "experts per layer), other weights %.2f GB\n",
          static_cast<long long>(c.n_expert_used), static_cast<long long>(c.n_expert), expert_bytes / 1e9,
          weight_bytes / 1e9);
    }
    // The KV cache's bytes per token over all layers, as /stats reports them
    // (latent attention: the latent and rope key; KV-shared layers: none).
    std::printf("KV cache: %zu bytes per token\n", m.kv_bytes_per_token());
    if (kv_fit > 0) {
      // The pool the model made of device memory up to the fraction (after
      // weights and activations): whole blocks; a 4,096-token sequence
      // holds 4,096 / block_size of them.
      const int64_t per_seq = (4096 + m.kv_block_size() - 1) / m.kv_block_size();
      std::printf(
          "KV pool at --gpu-memory-fraction %.2f: %d blocks of %d tokens (%.2f GiB), %lld sequences of 4,096 "
          "tokens\n",
          kv_fit, m.n_kv_blocks(), m.kv_block_size(),
          static_cast<double>(m.n_kv_blocks()) * m.kv_block_size() * m.kv_bytes_per_token() / (1 << 30),
          static_cast<long long>(m.n_kv_blocks() / per_seq));
      if (m.n_kv_tail_slots() > 0) {
        // k4c / k4a: each running sequence also holds a tail slot (its
        // newest partial block in q8_0), which the pool's budget paid for
        // up front, one per slot. Sequences that fit the same memory when
        // each brings its blocks and one tail: (blocks + tails) / (blocks
        // of 4,096 tokens + one tail).
        const double block_bytes = static_cast<double>(m.kv_block_size()) * static_cast<double>(m.kv_bytes_per_token());
        const double slot = static_cast<double>(m.kv_tail_bytes()) / m.n_kv_tail_slots();
        const double total = m.n_kv_blocks() * block_bytes + static_cast<double>(m.kv_tail_bytes());
        std::printf("KV tails: %d slots of %.0f bytes; with a tail each, %lld sequences of 4,096 tokens fit\n",
                    m.n_kv_tail_slots(), slot, static_cast<long long>(total / (per_seq * block_bytes + slot)));
      }
    }
    // The sequence on blocks `table`; hybrids run it in state slot `slot`,
    // k4c in KV tail slot `slot`.
    const bool recurrent = m.n_state_slots() > 0;
    auto add = [&](Batch& batch, const int32_t* ids, int n, int32_t pos0, const std::vector<int32_t>& table,
                   int32_t slot) {
      batch.add_sequence(ids, n, pos0, true, table);
      // Every further group (Gemma's and gpt-oss's sliding layers, a
      // hybrid's recurrent one) reads the same block ids in its own planes,
      // as the engine's SequenceRunner gives them.
      batch.group_tables.resize(std::max<size_t>(m.kv_spec().size(), 1) - 1);
      for (auto& t : batch.group_tables) t.insert(t.end(), table.begin(), table.end());
      if (recurrent) batch.seqs.back().state_slot = slot;
      if (m.n_kv_tail_slots() > 0) batch.seqs.back().kv_tail = slot;  // k4c: the sequence's KV tail
    };
    const double state_bytes = static_cast<double>(m.state_bytes());
    if (recurrent) {
      std::printf(
          "recurrent state: %.1f MiB per sequence (conv + delta of every linear layer, f32); %d live slots + "
          "%d checkpoints = %.2f GiB on the device\n",
          state_bytes / (1 << 20), m.n_state_slots(), m.n_state_checkpoints(),
          state_bytes * (m.n_state_slots() + m.n_state_checkpoints()) / (1 << 30));
    }

    std::vector<float> logits(static_cast<size_t>(kMaxBatch) * V);
    Batch b;
    nlohmann::ordered_json jr;
    jr["tensor_parallel"] = n_gpus;
    jr["batch_invariant"] = cfgs[ti].invariant;
    jr["load_s"] = load_s;
    jr["kv_bytes_per_token"] = m.kv_bytes_per_token();
    if (recurrent) jr["state_bytes"] = state_bytes;

    // Prefill of one 2,048-token prompt, and a 128-token prompt (TTFT).
    const int32_t prefill_first = kMaxBatch * seq_blocks;
    auto prompt_time = [&](int n_tok) {
      std::vector<int32_t> ids(static_cast<size_t>(n_tok));
      for (int i = 0; i < n_tok; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % V);
      const auto table = range_table(prefill_first, prefill_blocks);
      std::vector<double> t;
      const int reps = n_tok > 4096 ? 3 : 5;  // the first is a warm-up (and times the GEMM algorithms)
      for (int rep = 0; rep < reps; ++rep) {
        b.clear();
        add(b, ids.data(), n_tok, 0, table, 0);
        const bool profiled = profile_prefill && rep == 1;
        if (profiled) cudaProfilerStart();
        const auto t0 = Clock::now();
        if (const Status st = m.forward(b, logits.data()); !st.ok()) {
          std::fprintf(stderr, "prompt of %d tokens: %s\n", n_tok, st.error().message.c_str());
          return -1.0;
        }
        if (rep > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        if (profiled) {
          cudaProfilerStop();
          std::printf("profiled one %d-token prefill: %.2f ms\n", n_tok, t.back() * 1e3);
          std::exit(0);
        }
      }
      return median(t);
    };
    const double prefill_s = profile_batch > 0 ? 1 : prompt_time(kPrefill);
    const double ttft_s = profile_batch > 0 ? 1 : prompt_time(kTtftPrompt);
    const double prefill_flops = 2.0 * static_cast<double>(matmul_params) * kPrefill;
    std::printf("prefill %d tokens: %.1f ms, %.0f tok/s, %.0f TFLOP/s in matmuls (%.0f%% of the GEMM peak%s)\n",
                kPrefill, prefill_s * 1e3, kPrefill / prefill_s, prefill_flops / prefill_s / 1e12,
                100 * prefill_flops / prefill_s / 1e12 / (peak * n_gpus), n_gpus > 1 ? " times the GPUs" : "");
    std::printf("TTFT (forward of a %d-token prompt): %.1f ms\n", kTtftPrompt, ttft_s * 1e3);
    jr["prefill"] = {{"tokens", kPrefill},
                     {"ms", prefill_s * 1e3},
                     {"tok_s", kPrefill / prefill_s},
                     {"matmul_tflops", prefill_flops / prefill_s / 1e12}};
    jr["ttft_ms_prompt128"] = ttft_s * 1e3;

    // Decode: B sequences of 128-token prompts, then `steps` one-token steps.
    for (int B : batches) {
      std::vector<std::vector<int32_t>> tables;
      for (int s = 0; s < B; ++s) tables.push_back(range_table(s * seq_blocks, seq_blocks));
      // Prompts of up to kPrefill tokens go several to a forward; longer
      // ones in chunks of kPrefill.
      const int per_forward = std::max(1, kPrefill / kPrompt), chunk = std::min(kPrompt, kPrefill);
      for (int s0 = 0; s0 < B; s0 += per_forward) {
        for (int c0 = 0; c0 < kPrompt; c0 += chunk) {
          b.clear();
          const int n = std::min(chunk, kPrompt - c0);
          for (int s = s0; s < std::min(B, s0 + per_forward); ++s) {
            std::vector<int32_t> ids(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i)
              ids[static_cast<size_t>(i)] = static_cast<int32_t>(((c0 + i) * 31 + s * 101) % V);
            add(b, ids.data(), n, c0, tables[static_cast<size_t>(s)], s);
          }
          if (!m.forward(b, logits.data()).ok()) return 1;
        }
      }
      // Steps alternate between greedy on the device (ids back) and full
      // logits back to the host, at the same positions' lengths +- 1.
      std::vector<double> t, t_logits;
      std::vector<int32_t> ids(static_cast<size_t>(B));
      for (int step = 0; step < 2 * steps + 4; ++step) {
        b.clear();
        for (int s = 0; s < B; ++s) {
          const int32_t id = step == 0 ? static_cast<int32_t>(s % V) : ids[static_cast<size_t>(s)];
          add(b, &id, 1, kPrompt + step, tables[static_cast<size_t>(s)], s);
        }
        const bool greedy = step % 2 == 0;
        const bool profiled = profile_batch > 0 && step == 4;
        if (profiled) cudaProfilerStart();
        const auto t0 = Clock::now();
        auto st = greedy ? m.forward_greedy(b, TokenMasks{}, ids.data()) : m.forward(b, logits.data());
        if (!st.ok()) {
          std::fprintf(stderr, "decode: %s\n", st.error().message.c_str());
          return 1;
        }
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (profiled) {
          cudaProfilerStop();
          std::printf("profiled one greedy decode step at batch %d: %.2f ms\n", B, dt * 1e3);
          return 0;
        }
        if (step >= 4) (greedy ? t : t_logits).push_back(dt);
      }
      const double step_s = median(t);
      const double logits_step_s = median(t_logits);
      const double ctx_len = kPrompt + steps;
      // Every GPU reads its share: the roofline is against their bandwidth together.
      const double bytes = static_cast<double>(weight_bytes) + static_cast<double>(expert_bytes) * expert_fraction(B) +
                           B * ctx_len * static_cast<double>(m.kv_bytes_per_token()) +
                           2.0 * B * state_bytes;  // a hybrid's states, read and written
      const double roofline = bytes / (bw * 1e9 * n_gpus);
      std::printf(
          "decode batch %3d: %.2f ms/step, %.0f tok/s (greedy on device); %.2f ms, %.0f tok/s with logits to "
          "the host; bytes/step %.2f GB, roofline %.2f ms (%.0f%% of it)\n",
          B, step_s * 1e3, B / step_s, logits_step_s * 1e3, B / logits_step_s, bytes / 1e9, roofline * 1e3,
          100 * roofline / step_s);
      jr["decode"].push_back({{"batch", B},
                              {"ms_per_step", step_s * 1e3},
                              {"tok_s", B / step_s},
                              {"ms_per_step_logits_to_host", logits_step_s * 1e3},
                              {"bytes_per_step", bytes},
                              {"roofline_fraction", roofline / step_s}});
      tok_s[ti].push_back(B / step_s);
    }
    if (cfgs.size() == 1) {
      for (auto& [k, v] : jr.items()) {
        if (k != "tensor_parallel" && k != "batch_invariant") j[k] = v;
      }
    } else {
      j["runs"].push_back(jr);
    }
  }
  if (tps.size() > 1 && invs.size() == 1) {
    std::printf("--- decode scaling (greedy on device; against %d GPU%s) ---\n", tps[0], tps[0] > 1 ? "s" : "");
    for (size_t bi = 0; bi < batches.size(); ++bi) {
      std::printf("batch %3d:", batches[bi]);
      for (size_t ti = 0; ti < tps.size(); ++ti) {
        const double speedup = tok_s[ti][bi] / tok_s[0][bi];
        const double eff = speedup * tps[0] / tps[ti];
        std::printf("  N=%d %.0f tok/s (x%.2f, efficiency %.0f%%)", tps[ti], tok_s[ti][bi], speedup, 100 * eff);
        j["scaling"].push_back({{"batch", batches[bi]},
                                {"tensor_parallel", tps[ti]},
                                {"tok_s", tok_s[ti][bi]},
                                {"speedup", speedup},
                                {"efficiency", eff}});
      }
      std::printf("\n");
    }
  }
  if (!json_out.empty()) std::ofstream(json_out) << j.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace rill

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log as they are printed
  return rill::run(argc, argv);
}
