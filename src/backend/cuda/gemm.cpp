#include "backend/cuda/gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/fp8.h"
#include "backend/cuda/gemm_tune.h"
#include "backend/cuda/hopper/gemm_stream.h"
#include "backend/cuda/ops.h"

namespace rill::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

std::string blas_error(cublasStatus_t s, const char* what) {
  return std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusString(s);
}

}  // namespace

// Column-major view: D (rows x n, ld rows) = op(A) B with A = W stored as a
// cols x rows column-major matrix (transposed), B = x as cols x n.
struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first; emptied once chosen
  bool chosen = false;
  // > 0: the timing chose gemm_stream with this many splits over every
  // cuBLASLt candidate (algo holds cuBLASLt's fastest, the fallback for a
  // call whose pointers gemm_stream cannot take).
  int stream_splits = 0;
  Key key{};
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(std::array<uint64_t, 8>));

size_t Gemm::KeyHash::operator()(const Key& k) const {
  uint64_t h = static_cast<uint64_t>(k.kind) | (k.fast_accum ? 0x100u : 0u);
  for (int64_t v : {k.n, k.rows, k.cols}) h = (h ^ static_cast<uint64_t>(v)) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

Gemm::Gemm(const Context& ctx) : ctx_(ctx) {
  const char* env = std::getenv("RILL_GEMM_TUNE");
  tuning_ = !(env && std::string(env) == "0");
  if (const char* e = std::getenv("RILL_FP8_FAST_ACCUM")) fp8_fast_accum_ = std::string(e) != "0";
  if (const char* e = std::getenv("RILL_FP8_BF16_D")) fp8_bf16_d_ = std::string(e) == "1";
  if (const char* e = std::getenv("RILL_GEMM_STREAM")) stream_ = std::string(e) == "1";
}
Gemm::~Gemm() = default;

namespace {

// Whether the algorithm adds its split-K partial sums in f32 (no split, or
// the compute-type reduction): a narrow plan's output is then rounded to 16
// bits once, never partial sums in the output type.
bool reduces_in_f32(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 1;
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits, &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  if (splits <= 1) return true;
  return cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme,
                                              &written) == CUBLAS_STATUS_SUCCESS &&
         scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
}

}  // namespace

bool Gemm::ask_heuristic(Plan& p) {
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return false;
  const size_t ws = ctx_.workspace_bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates] = {};
  int n_results = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx_.blas(), p.desc, p.a, p.b, p.d, p.d, pref,
                                                          kTuneCandidates, results, &n_results);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return false;
  const bool narrow = p.key.kind == Kind::kF16Narrow || p.key.kind == Kind::kBF16Narrow;
  for (int i = 0; i < n_results; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    if (narrow && !reduces_in_f32(results[i].algo)) continue;
    p.candidates.push_back(results[i].algo);
  }
  if (p.candidates.empty()) return false;
  p.algo = p.candidates.front();
  if (tuning_ && p.key.n <= kSplitKMaxTokens) add_split_k_variants(p);
  return true;
}

// Few tokens: the weights' read bounds the GEMM, and a tile grid over the
// output rows alone can leave SMs idle; split-K spreads the rows' columns.
// Narrow plans take the compute-type (f32) reduction only.
void Gemm::add_split_k_variants(Plan& p) {
  const bool narrow = p.key.kind == Kind::kF16Narrow || p.key.kind == Kind::kBF16Narrow;
  const size_t n_base = p.candidates.size();
  for (size_t i = 0; i < n_base; ++i) {
    const cublasLtMatmulAlgo_t& base = p.candidates[i];
    int32_t support = 0, current = 1;
    uint32_t schemes = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof support,
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        !support ||
        cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes,
                                          &written) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigGetAttribute(&base, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &current, sizeof current,
                                             &written) != CUBLAS_STATUS_SUCCESS ||
        current > 1) {
      continue;
    }
    uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    for (uint32_t s : {uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE},
                       uint32_t{CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}, uint32_t{CUBLASLT_REDUCTION_SCHEME_INPLACE}}) {
      if (narrow && s != CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) continue;
      if (scheme == CUBLASLT_REDUCTION_SCHEME_NONE && (schemes & s)) scheme = s;
    }
    if (scheme == CUBLASLT_REDUCTION_SCHEME_NONE) continue;
    for (int32_t splits : {2, 4, 8}) {
      if (p.candidates.size() >= static_cast<size_t>(kMaxCandidates)) return;
      cublasLtMatmulAlgo_t algo = base;
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ==
              CUBLAS_STATUS_SUCCESS &&
          cublasLtMatmulAlgoCheck(ctx_.blas(), p.desc, p.a, p.b, p.d, p.d, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= ctx_.workspace_bytes()) {
        p.candidates.push_back(algo);
      }
    }
  }
}

namespace {

// Shapes of up to 128 tokens are timed one by one (decode batches: the CUDA
// models pad them to a few sizes); longer ones share a power-of-two bucket.
int64_t tuning_bucket(int64_t n) {
  if (n <= 128) return n;
  int64_t b = 256;
  while (b < n) b <<= 1;
  return b;
}

const char* kind_name(int kind) {
  static const char* const names[] = {"f32", "f16",          "bf16",        "fp8 (outer scales)",
                                      "fp8", "fp8 (bf16 D)", "f16 (f16 D)", "bf16 (bf16 D)"};
  return names[kind];
}

}  // namespace

GemmStreamArgs Gemm::stream_args(const Key& key, const void* w, const void* x, void* y, bool accumulate, int splits) {
  GemmStreamArgs g;
  g.dtype = key.kind == Kind::kF16 || key.kind == Kind::kF16Narrow ? DType::kF16 : DType::kBF16;
  g.w = w;
  g.x = x;
  g.y = y;
  g.n = key.n;
  g.rows = key.rows;
  g.cols = key.cols;
  g.narrow = key.kind == Kind::kF16Narrow || key.kind == Kind::kBF16Narrow;
  g.accumulate = accumulate && !g.narrow;
  g.splits = splits;
  g.w_stable = false;  // Gemm's W may be a dequantization scratch the previous kernel writes
  return g;
}

Status Gemm::choose(Plan& p, const void* a, const void* b, float* out, float beta) {
  const Key& key = p.key;
  p.chosen = true;
  const std::vector<cublasLtMatmulAlgo_t> cands = std::move(p.candidates);
  p.candidates = {};
  p.algo = cands.front();  // the heuristic's first unless a timing says otherwise
  if (!tuning_) return Status::Ok();
  // gemm_stream's split counts that take this shape join the timing.
  const bool narrow = key.kind == Kind::kF16Narrow || key.kind == Kind::kBF16Narrow;
  std::vector<int> stream;
  const bool sixteen = narrow || key.kind == Kind::kF16 || key.kind == Kind::kBF16;
  if (stream_ && sixteen && key.n <= kGemmStreamMaxTokens && gemm_stream_available()) {
    for (int splits : kGemmStreamSplits) {
      if (gemm_stream_supported(stream_args(key, a, b, out, beta != 0.0f, splits))) stream.push_back(splits);
    }
  }
  if (cands.size() + stream.size() < 2) return Status::Ok();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(ctx_.stream(), &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    return Status::Ok();  // a graph being captured cannot be timed
  }
  Key bucket = key;
  bucket.n = tuning_bucket(key.n);
  if (auto it = bucket_winners_.find(bucket); it != bucket_winners_.end()) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, it->second.data(), sizeof algo);
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(ctx_.blas(), p.desc, p.a, p.b, p.d, p.d, &algo, &check) == CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= ctx_.workspace_bytes()) {
      p.algo = algo;
    }
    return Status::Ok();
  }

  // Accumulating calls are timed into a scratch output, so y keeps its
  // contents; a plain call's timing runs write y, which the real call
  // overwrites after. No scratch memory: keep the heuristic's first.
  const size_t out_bytes = static_cast<size_t>(key.n) * static_cast<size_t>(key.rows) * sizeof(float);
  DeviceBuffer scratch;
  float* target = out;
  if (beta != 0.0f) {
    auto buf = DeviceBuffer::allocate(out_bytes, "GEMM tuning output");
    if (!buf.ok()) return Status::Ok();
    scratch = std::move(*buf);
    RILL_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, out_bytes, ctx_.stream()));
    target = scratch.as<float>();
  }
  if (!flush_.data()) {
    const size_t bytes = 2 * static_cast<size_t>(std::max(ctx_.props().l2CacheSize, 32 << 20));
    if (auto buf = DeviceBuffer::allocate(bytes, "GEMM tuning L2 flush"); buf.ok()) flush_ = std::move(*buf);
  }
  const float alpha = 1.0f;
  const int n_blas = static_cast<int>(cands.size());
  auto launch = [&](int i) {
    if (i >= n_blas) {
      return gemm_stream(stream_args(key, a, b, target, beta != 0.0f, stream[static_cast<size_t>(i - n_blas)]),
                         ctx_.stream());
    }
    return cublasLtMatmul(ctx_.blas(), p.desc, &alpha, a, p.a, b, p.b, &beta, target, p.d, target, p.d,
                          &cands[static_cast<size_t>(i)], ctx_.workspace(), ctx_.workspace_bytes(),
                          ctx_.stream()) == CUBLAS_STATUS_SUCCESS;
  };
  RILL_ASSIGN_OR_RETURN(std::vector<float> ms, time_candidates(ctx_, n_blas + static_cast<int>(stream.size()), launch,
                                                               flush_.data(), flush_.size()));
  const int best = fastest(ms);
  // cuBLASLt's fastest stays the plan's algorithm also where gemm_stream
  // won: it runs the calls whose pointers gemm_stream cannot take.
  const int best_blas = fastest(std::vector<float>(ms.begin(), ms.begin() + n_blas));
  if (best_blas >= 0) p.algo = cands[static_cast<size_t>(best_blas)];
  if (best >= n_blas) p.stream_splits = stream[static_cast<size_t>(best - n_blas)];
  ++timings_;
  std::array<uint64_t, 8> bytes;
  std::memcpy(bytes.data(), &p.algo, sizeof p.algo);
  bucket_winners_.emplace(bucket, bytes);
  if (const char* log = std::getenv("RILL_GEMM_TUNE_LOG"); log && std::string(log) == "1") {
    std::string times;
    for (size_t i = 0; i < ms.size(); ++i) {
      const float t = ms[i];
      if (static_cast<int>(i) == n_blas) times += " | stream (splits " + std::to_string(stream.front()) + "..):";
      times += " " + (t < 0 ? std::string("-") : std::to_string(static_cast<int>(t * 1e3f + 0.5f)));
    }
    std::fprintf(stderr,
                 "gemm tune %s %lld x %lld x %lld (bucket %lld): %zu candidates, heuristic's first %.1f us, "
                 "chose #%d %.1f us; all (us):%s\n",
                 kind_name(static_cast<int>(key.kind)), static_cast<long long>(key.n), static_cast<long long>(key.rows),
                 static_cast<long long>(key.cols), static_cast<long long>(bucket.n), cands.size(), ms[0] * 1e3, best,
                 best >= 0 ? ms[static_cast<size_t>(best)] * 1e3 : -1.0, times.c_str());
  }
  return Status::Ok();
}

Result<Gemm::Plan*> Gemm::plan(DType dtype, int64_t n, int64_t rows, int64_t cols, bool narrow) {
  narrow = narrow && (dtype == DType::kF16 || dtype == DType::kBF16);
  const Kind kind = dtype == DType::kF16    ? (narrow ? Kind::kF16Narrow : Kind::kF16)
                    : dtype == DType::kBF16 ? (narrow ? Kind::kBF16Narrow : Kind::kBF16)
                                            : Kind::kF32;
  const Key key{kind, n, rows, cols};
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  p->key = key;
  const cudaDataType_t t = cuda_type(dtype);
  cublasStatus_t s = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return Error{blas_error(s, "matmul descriptor")};
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a);
  cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b);
  if ((s = cublasLtMatrixLayoutCreate(&p->a, t, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), cols)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&p->b, t, static_cast<uint64_t>(cols), static_cast<uint64_t>(n), cols)) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&p->d, narrow ? t : CUDA_R_32F, static_cast<uint64_t>(rows),
                                      static_cast<uint64_t>(n), rows)) != CUBLAS_STATUS_SUCCESS) {
    return Error{blas_error(s, "matrix layout")};
  }
  if (!ask_heuristic(*p)) {
    return Error{"cuBLASLt has no algorithm for " + std::string(dtype_name(dtype)) + " " + std::to_string(n) + " x " +
                 std::to_string(rows) + " x " + std::to_string(cols)};
  }
  Plan* raw = p.get();
  plans_.emplace(key, std::move(p));
  return raw;
}

Status Gemm::run(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                 bool accumulate) {
  if (n <= 0) return Status::Ok();
  RILL_ASSIGN_OR_RETURN(Plan * p, plan(dtype, n, rows, cols));
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (!p->chosen) RILL_TRY(choose(*p, w, x, y, beta));
  if (p->stream_splits > 0 && gemm_stream(stream_args(p->key, w, x, y, accumulate, p->stream_splits), ctx_.stream())) {
    return Status::Ok();
  }
  const cublasStatus_t s = cublasLtMatmul(ctx_.blas(), p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d,
                                          &p->algo, ctx_.workspace(), ctx_.workspace_bytes(), ctx_.stream());
  if (s != CUBLAS_STATUS_SUCCESS) return Error{blas_error(s, "matmul")};
  return Status::Ok();
}

Status Gemm::run_narrow(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, void* y) {
  if (n <= 0) return Status::Ok();
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    return Error{"narrow matmul: " + std::string(dtype_name(dtype)) + " weights (F16 or BF16 only)"};
  }
  RILL_ASSIGN_OR_RETURN(Plan * p, plan(dtype, n, rows, cols, true));
  const float alpha = 1.0f, beta = 0.0f;
  // beta 0: a timing run writes y itself, which the real call overwrites.
  if (!p->chosen) RILL_TRY(choose(*p, w, x, static_cast<float*>(y), beta));
  if (p->stream_splits > 0 && gemm_stream(stream_args(p->key, w, x, y, false, p->stream_splits), ctx_.stream())) {
    return Status::Ok();
  }
  const cublasStatus_t s = cublasLtMatmul(ctx_.blas(), p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->d, y, p->d,
                                          &p->algo, ctx_.workspace(), ctx_.workspace_bytes(), ctx_.stream());
  if (s != CUBLAS_STATUS_SUCCESS) return Error{blas_error(s, "narrow matmul")};
  return Status::Ok();
}

Gemm::Plan* Gemm::fp8_plan(int64_t n, int64_t rows, int64_t cols, int64_t w_ld, bool outer, bool bf16_d) {
  if (w_ld != cols + 16) return nullptr;
  bf16_d = bf16_d && !outer;
  const Key key{outer    ? Kind::kFp8Outer
                : bf16_d ? Kind::kFp8PlainBf16
                         : Kind::kFp8Plain,
                n, rows, cols, fp8_fast_accum_};
  if (auto it = fp8_plans_.find(key); it != fp8_plans_.end()) return it->second.get();
  auto p = std::make_unique<Plan>();
  p->key = key;
  bool ok = cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  ok = ok &&
       cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b) ==
           CUBLAS_STATUS_SUCCESS;
  if (fp8_fast_accum_) {  // partial sums not promoted to f32 along K (faster, coarser)
    const int8_t fast = 1;
    ok = ok && cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast) ==
                   CUBLAS_STATUS_SUCCESS;
  }
  if (outer) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    ok = ok &&
         cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode) ==
             CUBLAS_STATUS_SUCCESS;
  }
  ok = ok &&
       cublasLtMatrixLayoutCreate(&p->a, CUDA_R_8F_E4M3, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows),
                                  w_ld) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&p->b, CUDA_R_8F_E4M3, static_cast<uint64_t>(cols), static_cast<uint64_t>(n), cols) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatrixLayoutCreate(&p->d, bf16_d ? CUDA_R_16BF : CUDA_R_32F, static_cast<uint64_t>(rows),
                                  static_cast<uint64_t>(n), rows) == CUBLAS_STATUS_SUCCESS;
  ok = ok && ask_heuristic(*p);
  if (!ok) p.reset();
  Plan* raw = p.get();
  fp8_plans_.emplace(key, std::move(p));
  return raw;
}

bool Gemm::fp8_gemm_supported(int64_t n, int64_t rows, int64_t cols, int64_t w_ld) {
  return n > 0 && (fp8_plan(n, rows, cols, w_ld, true) || fp8_plan(n, rows, cols, w_ld, false));
}

Status Gemm::fp8_launch(Plan& p, const uint8_t* a, const uint8_t* xq, void* out, float beta) {
  const float alpha = 1.0f;
  if (!p.chosen) RILL_TRY(choose(p, a, xq, static_cast<float*>(out), beta));  // beta == 0 for bf16 D: no scratch
  const cublasStatus_t s = cublasLtMatmul(ctx_.blas(), p.desc, &alpha, a, p.a, xq, p.b, &beta, out, p.d, out, p.d,
                                          &p.algo, ctx_.workspace(), ctx_.workspace_bytes(), ctx_.stream());
  return s == CUBLAS_STATUS_SUCCESS ? Status::Ok() : Status(Error{blas_error(s, "FP8 matmul")});
}

Status Gemm::run_fp8_unscaled(const uint8_t* wq, int64_t w_ld, const uint8_t* xq, int64_t n, int64_t rows, int64_t cols,
                              float* d) {
  if (n <= 0) return Status::Ok();
  Plan* p = fp8_plan(n, rows, cols, w_ld, false);
  if (!p)
    return Error{"cuBLASLt has no unscaled FP8 GEMM for " + std::to_string(n) + " x " + std::to_string(rows) + " x " +
                 std::to_string(cols)};
  return fp8_launch(*p, wq, xq, d, 0.0f);
}

Status Gemm::run_fp8(const uint8_t* wq, int64_t w_ld, const float* ws, const uint8_t* xq, const float* xs, int64_t n,
                     int64_t rows, int64_t cols, float* y, bool accumulate, float* d, int64_t d_floats) {
  if (n <= 0) return Status::Ok();
  const float beta = accumulate ? 1.0f : 0.0f;
  auto matmul = [&](Plan* p, const uint8_t* a, void* out, float b) { return fp8_launch(*p, a, xq, out, b); };
  if (Plan* p = fp8_plan(n, rows, cols, w_ld, true)) {
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws);
    cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs);
    return matmul(p, wq, y, beta);
  }
  // Unscaled in bf16 into d (row chunks of whole 16s when it takes more
  // than one), each chunk scaled into y; f32 below where d is missing or a
  // chunk's shape has no bf16-output algorithm.
  const int64_t d_bf16 = d ? 2 * d_floats / n : 0;  // bf16 values a token
  int64_t bchunk = std::min(rows, d_bf16);
  if (bchunk < rows) bchunk = bchunk / 16 * 16;
  if (fp8_bf16_d_ && bchunk > 0 && fp8_plan(n, bchunk, cols, w_ld, false, true) &&
      (rows % bchunk == 0 || fp8_plan(n, rows % bchunk, cols, w_ld, false, true))) {
    for (int64_t r0 = 0; r0 < rows; r0 += bchunk) {
      const int64_t rc = std::min(bchunk, rows - r0);
      RILL_TRY(matmul(fp8_plan(n, rc, cols, w_ld, false, true), wq + r0 * w_ld, d, 0.0f));
      fp8_scale_rows_bf16(d, n, rc, rows, r0, xs, ws, y, accumulate, ctx_.stream());
    }
    return Status::Ok();
  }
  if (!accumulate) {  // unscaled into y, then scaled in place
    Plan* p = fp8_plan(n, rows, cols, w_ld, false);
    if (!p)
      return Error{"cuBLASLt has no FP8 GEMM for " + std::to_string(n) + " x " + std::to_string(rows) + " x " +
                   std::to_string(cols)};
    RILL_TRY(matmul(p, wq, y, 0.0f));
    fp8_scale_rows(y, n, rows, rows, 0, xs, ws, y, false, ctx_.stream());
    return Status::Ok();
  }
  const int64_t chunk = std::min(rows, d_floats / n);
  if (chunk <= 0) return Error{"FP8 matmul: no scratch for an accumulating GEMM of " + std::to_string(n) + " tokens"};
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t rc = std::min(chunk, rows - r0);
    Plan* p = fp8_plan(n, rc, cols, w_ld, false);
    if (!p)
      return Error{"cuBLASLt has no FP8 GEMM for " + std::to_string(n) + " x " + std::to_string(rc) + " x " +
                   std::to_string(cols)};
    RILL_TRY(matmul(p, wq + r0 * w_ld, d, 0.0f));
    fp8_scale_rows(d, n, rc, rows, r0, xs, ws, y, true, ctx_.stream());
  }
  return Status::Ok();
}

Status Gemm::matmul(DType dtype, const void* w, const void* x, int64_t n, int64_t rows, int64_t cols, float* y,
                    bool accumulate) {
  if (batch_invariant_ && dtype != DType::kF32) {
    if (!gemm_invariant_supported(dtype, cols)) {
      return Error{"batch-invariant matmul: " + std::to_string(cols) + " " + std::string(dtype_name(dtype)) +
                   " columns are not a whole number of 16 bytes"};
    }
    gemm_invariant(dtype, w, x, n, rows, cols, y, accumulate, ctx_.stream());
    return Status::Ok();
  }
  if (batch_invariant_ && !gemv_supported(dtype, cols)) {
    return Error{"batch-invariant matmul: " + std::to_string(cols) + " f32 columns are not a multiple of 4"};
  }
  if (gemv_supported(dtype, cols) && (dtype == DType::kF32 || n == 1 || batch_invariant_)) {
    gemv(dtype, w, x, n, rows, cols, y, accumulate, ctx_.stream());
    return Status::Ok();
  }
  return run(dtype, w, x, n, rows, cols, y, accumulate);
}

}  // namespace rill::cuda
