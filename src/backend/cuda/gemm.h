#pragma once
// GEMM through cuBLASLt: y[n, rows] (+)= x[n, cols] . W[rows, cols]^T with
// W and x in one dtype (F32, F16 or BF16) and y in f32. F32 runs in true
// f32 (CUBLAS_COMPUTE_32F: no TF32), so f32 checkpoints match the CPU.
// One plan (descriptors + algorithm) per shape, made the first time a shape
// is seen and reused after: the step path only looks plans up.
//
// Algorithm choice (gemm_tune.h): the first call of a shape asks cuBLASLt's
// heuristic for up to kTuneCandidates algorithms, times each on that call's
// own operands with L2 flushed (with set_stream(true), 16-bit shapes of up
// to 128 tokens also rill's gemm_stream at each split count, on Hopper),
// and keeps the fastest for the shape's lifetime in this Gemm, so a shape
// always runs the same algorithm (where gemm_stream won, a call whose
// pointers it cannot take, unaligned x, runs cuBLASLt's fastest). Shapes
// with more than 128 tokens share one timing per power-of-two bucket of
// tokens (each prefill chunk size would otherwise be timed anew): a later
// shape of the bucket takes the bucket's algorithm when cuBLASLt accepts it
// for that shape (cublasLtMatmulAlgoCheck), else the heuristic's first. A
// first call inside a CUDA graph capture cannot be timed and takes the
// heuristic's first (the CUDA models run each decode shape eagerly before
// capturing it, so theirs are timed). RILL_GEMM_TUNE=0 in the environment,
// or set_tuning(false), takes the heuristic's first everywhere (the
// behaviour before tuning, for comparisons); RILL_GEMM_TUNE_LOG=1 prints
// each timing to stderr. Batch-invariant mode never reaches cuBLASLt, so
// tuning does not touch it. What timing gives up: two Gemms (two engines,
// two processes, a server and its restart) may pick different algorithms
// for one shape and so round its GEMMs differently; in default mode a
// request's output was never bitwise fixed across batch compositions
// either. Where bits must match across engines, use batch-invariant mode
// (or RILL_GEMM_TUNE=0).
#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/hopper/gemm_stream.h"
#include "core/dtype.h"
#include "core/result.h"

namespace rill::cuda {

class Gemm {
 public:
  explicit Gemm(const Context& ctx);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // All pointers on the device; W rows contiguous (cols elements each).
  Status run(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
             bool accumulate);

  // y = x W^T written in `dtype` (F16 or BF16, the weights' and
  // activations' own) instead of f32, by cuBLASLt at every token count: half
  // the output bytes, each sum rounded once to 16 bits. For outputs that a
  // 16-bit reader consumes (the fused gate/up ahead of its GLU, Backend's
  // matmul_glu). Not batch invariant: callers keep batch-invariant mode on
  // run()/matmul().
  Status run_narrow(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, void* y);

  // Matmul dispatch used by the models. F32 weights always take the hand
  // GEMV (batch invariant; f32 checkpoints are for parity runs, not speed).
  // F16/BF16 take it for one token and cuBLASLt for more: on the H200 the
  // GEMV streams the 8B shapes' weights as fast as cuBLASLt or faster at one
  // token and loses from two tokens on (docs/perf.md, bench_cuda --kernels).
  // Batch-invariant mode (set_batch_invariant(true)): F16/BF16 take
  // gemm_invariant at every token count (one token too) and F32 the GEMV,
  // never cuBLASLt, so y[t, r] depends only on W's row r and x's row t.
  Status matmul(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                bool accumulate);

  // FP8 GEMM on the tensor cores (fp8.h's weights): y[t, r] (+)=
  // xs[t] ws[r] sum_c xq[t, c] wq[r, c], wq e4m3 rows w_ld bytes apart
  // (16-byte aligned), xq [n, cols] e4m3 dense, ws [rows] and xs [n] f32,
  // f32 accumulation. The scales go in cuBLASLt's outer-vector scaling
  // where it has an algorithm for it; else the GEMM runs unscaled into y
  // (or, accumulating, into `d` [n, d_floats / n], in row chunks) and
  // fp8_scale_rows applies them. Errors when cuBLASLt has no FP8 algorithm
  // for the shape at all (fp8_gemm_supported says so first; the answer is
  // remembered per shape).
  bool fp8_gemm_supported(int64_t n, int64_t rows, int64_t cols, int64_t w_ld);
  // Whether the shape gets cuBLASLt's outer-vector scales (no extra pass).
  bool fp8_gemm_outer_scales(int64_t n, int64_t rows, int64_t cols, int64_t w_ld) {
    return n > 0 && fp8_plan(n, rows, cols, w_ld, true) != nullptr;
  }
  // With set_fp8_bf16_d(true) (RILL_FP8_BF16_D=1) the unscaled product
  // goes to `d` in bf16 instead (2 x d_floats values, rows in chunks that fit), and
  // the pass reads it from there: 2 bytes an element written and read
  // instead of 4, for one bf16 rounding (2^-8 relative) of each unscaled
  // sum. Off by default: on the H200 it moved prefill by ~1% (docs/perf.md).
  // FP8 plans are made with CUBLASLT_MATMUL_DESC_FAST_ACCUM (partial sums
  // not promoted to f32 along K) unless set_fp8_fast_accum(false) or
  // RILL_FP8_FAST_ACCUM=0: 6% faster prefill on the 8B. Its error per
  // matmul (measured at K = 4,096: up to 6.9e-4 of sum |w x|) stays below
  // what rounding the operands to e4m3 costs (1e-3 to 4e-3); the goldens'
  // logits did not move, and no trained large model was measured
  // (docs/perf.md, 2026-12-04).
  Status run_fp8(const uint8_t* wq, int64_t w_ld, const float* ws, const uint8_t* xq, const float* xs, int64_t n,
                 int64_t rows, int64_t cols, float* y, bool accumulate, float* d, int64_t d_floats);

  // d [n, rows] f32 = sum_c xq[t, c] wq[r, c], no scales: run_fp8's
  // unscaled GEMM (the same plan, so the same bits as run_fp8's product
  // before its scale pass when it takes that path: not accumulating, no
  // outer scales, f32 D), for a caller that applies the scales itself
  // (fp8_matmul_glu). Errors where cuBLASLt has no such algorithm.
  Status run_fp8_unscaled(const uint8_t* wq, int64_t w_ld, const uint8_t* xq, int64_t n, int64_t rows, int64_t cols,
                          float* d);

  // For plans made from now on (the environment gives the defaults); the
  // plan and tuning caches key on the setting, so a toggle never reuses a
  // plan made under the other.
  void set_fp8_fast_accum(bool on) { fp8_fast_accum_ = on; }
  bool fp8_fast_accum() const { return fp8_fast_accum_; }
  void set_fp8_bf16_d(bool on) { fp8_bf16_d_ = on; }
  bool fp8_bf16_d() const { return fp8_bf16_d_; }

  // Whether shapes timed from now on also time gemm_stream (TMA + wgmma,
  // hopper/gemm_stream.h) for 16-bit weights and up to 128 tokens, on
  // devices that run it; off unless RILL_GEMM_STREAM=1 (on the H100 it
  // has not yet beaten cuBLASLt in a decode step: docs/perf.md). Plans
  // made before keep their choice.
  void set_stream(bool on) { stream_ = on; }
  bool stream() const { return stream_; }

  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  // Whether shapes seen from now on are timed (see the top of this file).
  // Shapes already planned keep their algorithm.
  void set_tuning(bool on) { tuning_ = on; }
  bool tuning() const { return tuning_; }
  // How many timings ran (one per bucket of shapes; a shape that took its
  // bucket's algorithm or the heuristic's first adds none).
  int64_t timings() const { return timings_; }

  // Most candidates asked of the heuristic per shape; shapes of up to
  // kSplitKMaxTokens tokens also time split-K variants (2, 4, 8 splits) of
  // those that allow it, up to kMaxCandidates in all.
  static constexpr int kTuneCandidates = 16;
  static constexpr int kSplitKMaxTokens = 128;
  static constexpr int kMaxCandidates = 40;

 private:
  struct Plan;
  // Kind of plan in a key: the activation dtype, or FP8 with/without outer scales.
  // kFp8PlainBf16: unscaled, D in bf16.
  enum class Kind : uint8_t { kF32, kF16, kBF16, kFp8Outer, kFp8Plain, kFp8PlainBf16, kF16Narrow, kBF16Narrow };
  struct Key {
    Kind kind;
    int64_t n, rows, cols;
    bool fast_accum = false;  // FP8 plans: made with CUBLASLT_MATMUL_DESC_FAST_ACCUM
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  // narrow: D in `dtype` (F16/BF16) instead of f32.
  Result<Plan*> plan(DType dtype, int64_t n, int64_t rows, int64_t cols, bool narrow = false);
  // Null: no algorithm. `outer`: with outer-vector scales (else unscaled).
  Plan* fp8_plan(int64_t n, int64_t rows, int64_t cols, int64_t w_ld, bool outer, bool bf16_d = false);
  // One FP8 GEMM of plan p: out = beta out + (a . xq^T) (p's scales, if any, set by the caller).
  Status fp8_launch(Plan& p, const uint8_t* a, const uint8_t* xq, void* out, float beta);
  // Fills the plan's descriptors' heuristic candidates; false: none.
  bool ask_heuristic(Plan& p);
  void add_split_k_variants(Plan& p);
  // Picks p's algorithm on its first call (a, b, out, beta: that call's
  // operands; out holds n x rows floats).
  Status choose(Plan& p, const void* a, const void* b, float* out, float beta);
  // gemm_stream's arguments for a 16-bit plan's call.
  static GemmStreamArgs stream_args(const Key& key, const void* w, const void* x, void* y, bool accumulate, int splits);

  const Context& ctx_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> fp8_plans_;  // a null plan: the shape has no algorithm
  // The timed winner of each bucket (Key with n = the bucket's largest n):
  // a cublasLtMatmulAlgo_t's bytes.
  std::unordered_map<Key, std::array<uint64_t, 8>, KeyHash> bucket_winners_;
  DeviceBuffer flush_;  // evicts L2 between timed runs; allocated at the first timing
  bool batch_invariant_ = false;
  bool tuning_ = true;
  bool stream_ = false;
  bool fp8_fast_accum_ = true;
  bool fp8_bf16_d_ = false;
  int64_t timings_ = 0;
};

// The batch-invariant GEMM (gemm_invariant.cu): y[t, r] (+)= sum_c W[r, c]
// x[t, c] for W [rows, cols], x [n, cols] in one dtype (F16 or BF16, rows a
// whole number of 16 bytes: gemm_invariant_supported), y [n, rows] f32. On
// tensor cores (mma.m16n8k16, f32 accumulation) in an order fixed by cols
// alone: each output is the same bits whatever n is and whichever other
// tokens share the call. Slower than cuBLASLt at large n (no shared-memory
// tiling) and than the GEMV at one token; used only in batch-invariant mode.
bool gemm_invariant_supported(DType dtype, int64_t n_cols);
void gemm_invariant(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                    bool accumulate, cudaStream_t stream);

}  // namespace rill::cuda
