// bench_prefill_attention: one layer's prefill attention alone
// (cuda::attention over prefill tiles, as the models route them) at
// Gemma-4 26B-A4B's shapes and Llama-3.1-8B's: one sequence of N tokens from position 0,
// paged in blocks of 16 over a shuffled table, per KV type. Prints the
// median of 30 calls (CUDA events), the causal (and windowed) FLOPs done
// per second (4 x head_dim per query head per visible key: Q K^T and P V)
// and their fraction of the tensor cores' dense f16 peak (--peak, TFLOP/s;
// 989.4: H100/H200 SXM's published figure). K and V bytes are constant
// (no NaN or infinity: the timing does not depend on the values).
// RILL_CUDA_FLASH_PREFILL=0 in the environment runs the WMMA kernel
// instead of the register-fragment ones, RILL_CUDA_WIDE_PREFILL=512 at
// head_dim 256 only (attention_mma.h), for comparisons; each line names
// the kernel that ran at 256 and 512 (at 64 and 128: "WMMA" under
// RILL_CUDA_FLASH_PREFILL=0, else "default": attention_mma.h says which).
// Rotated types (q8_0h, q4_0h, iq4_nlh) include the two rotation kernels
// of cuda::attention (q's heads, and the output's back), as a model's
// layer runs them.
//
//   bench_prefill_attention [--tokens 2048] [--types f16,q8_0,fp8,q4_0]
//       [--shapes full,full256,sliding] [--peak 989.4]
// --types also takes the rotated q8_0h, q4_0h, iq4_nlh (and any other type
// CUDA stores at the shape's head_dim); --shapes also takes llama.
// Shapes (Gemma-4 26B-A4B): full = 16 q heads over 2 KV heads of 512 (its
// full layers), full256 = the same at 256 (the hd-256 variant of
// docs/perf.md), sliding = 16 over 8 of 256, window 1,024; llama = 32 q
// heads over 8 KV heads of 128 (Llama-3.1-8B).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_context.h"
#include "backend/cuda/ops.h"
#include "model/kv_types.h"

namespace {

using namespace rill;

std::vector<std::string> parse_names(const char* s) {
  std::vector<std::string> v;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || !*p) {
      if (!cur.empty()) v.push_back(cur);
      cur.clear();
      if (!*p) break;
    } else {
      cur += *p;
    }
  }
  return v;
}

#define CHECK(x)                                                   \
  do {                                                             \
    if (cudaError_t e = (x); e != cudaSuccess) {                   \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

struct Shape {
  const char* name;
  int32_t heads, heads_kv, hd, window;
};

}  // namespace

int main(int argc, char** argv) {
  int32_t n_tokens = 2048;
  double peak = 989.4;
  std::vector<std::string> types = {"f16", "q8_0", "fp8", "q4_0"}, shape_names = {"full", "full256", "sliding"};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) {
      n_tokens = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--types")) {
      types = parse_names(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--shapes")) {
      shape_names = parse_names(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--peak")) {
      peak = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 1;
    }
  }
  if (n_tokens <= cuda::kDecodeMaxQ || peak <= 0.0) {
    std::fprintf(stderr, "--tokens must exceed %d and --peak be positive\n", cuda::kDecodeMaxQ);
    return 1;
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  const Shape all[] = {
      {"full", 16, 2, 512, 0}, {"full256", 16, 2, 256, 0}, {"sliding", 16, 8, 256, 1024}, {"llama", 32, 8, 128, 0}};
  const char* flash_env = std::getenv("RILL_CUDA_FLASH_PREFILL");
  const char* wide_env = std::getenv("RILL_CUDA_WIDE_PREFILL");
  const std::string flash = flash_env ? flash_env : "", wide = wide_env ? wide_env : "";
  auto kernel = [&](int32_t hd) {  // attention_mma.cu's choice at 256 and 512
    if (hd <= 128) return flash == "0" ? "WMMA" : "default";
    const bool wmma = flash == "0" || wide == "0" || (wide == "512" && hd < 512);
    return wmma ? "WMMA" : "wide";
  };
  constexpr int32_t kBlock = 16, kShift = 4;
  for (const std::string& sname : shape_names) {
    const Shape* sh = nullptr;
    for (const Shape& s : all)
      if (sname == s.name) sh = &s;
    if (!sh) {
      std::fprintf(stderr, "--shapes: %s is not one of full, full256, sliding, llama\n", sname.c_str());
      return 1;
    }
    for (const std::string& name : types) {
      const auto t = parse_kv_type(name);
      if (!t || !cuda::kv_supported(t->dtype) || !cuda::kv_rotation_supported(t->dtype, sh->hd, t->rotated)) {
        std::fprintf(stderr, "--types: %s is not a CUDA KV type at head_dim %d\n", name.c_str(), sh->hd);
        return 1;
      }
      const size_t row = row_bytes(t->dtype, static_cast<int64_t>(sh->heads_kv) * sh->hd);
      const int32_t n_blocks = (n_tokens + kBlock - 1) / kBlock;
      std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
      std::vector<int32_t> pos(static_cast<size_t>(n_tokens)), seq_of(static_cast<size_t>(n_tokens), 0);
      std::iota(pos.begin(), pos.end(), 0);
      std::vector<int32_t> decode;
      std::vector<cuda::PrefillTile> tiles;
      cuda::route_attention(0, 0, n_tokens, cuda::prefill_tile_q(t->dtype, sh->hd), decode, tiles);
      const size_t kv_bytes = static_cast<size_t>(n_blocks) * kBlock * row;
      void *k = nullptr, *v = nullptr, *out = nullptr;
      CHECK(cudaMalloc(&k, kv_bytes));
      CHECK(cudaMalloc(&v, kv_bytes));
      // 0x11 bytes: f16 0x1111, e4m3 0x11 and q8_0/q4_0 scales 0x1111 are small normal values.
      CHECK(cudaMemset(k, 0x11, kv_bytes));
      CHECK(cudaMemset(v, 0x11, kv_bytes));
      const int64_t width = static_cast<int64_t>(sh->heads) * sh->hd;
      std::vector<float> qh(static_cast<size_t>(n_tokens * width), 0.01f);
      float* q = upload(qh);
      int32_t *dt = upload(perm), *dts = upload(std::vector<int32_t>{0}), *dseq = upload(seq_of), *dpos = upload(pos);
      cuda::PrefillTile* dtiles = upload(tiles);
      CHECK(cudaMalloc(&out, qh.size() * 2));
      cuda::AttentionArgs a;
      a.q = q;
      a.q_stride = width;
      a.n_head = sh->heads;
      a.n_head_kv = sh->heads_kv;
      a.head_dim = sh->hd;
      a.scale = 1.0f;  // every shape (Gemma 4's own: q and k are normed); q is constant, so it does not change the time
      a.window = sh->window;
      a.k_cache = k;
      a.v_cache = v;
      a.kv_dtype = t->dtype;
      a.block_shift = kShift;
      a.block_tables = dt;
      a.table_start = dts;
      a.seq_of = dseq;
      a.pos = dpos;
      a.tiles = dtiles;
      a.n_tiles = static_cast<int32_t>(tiles.size());
      a.out_dtype = DType::kBF16;
      a.out = out;
      a.n_tokens = n_tokens;
      float* rotation = nullptr;
      if (t->rotated) {
        CHECK(cudaMalloc(&rotation, cuda::attention_rotation_floats(n_tokens, sh->heads, sh->hd) * sizeof(float)));
        a.k_rotated = a.v_rotated = true;
        a.rotation = rotation;
      }
      cudaEvent_t e0, e1;
      CHECK(cudaEventCreate(&e0));
      CHECK(cudaEventCreate(&e1));
      std::vector<float> ms;
      for (int it = 0; it < 35; ++it) {
        CHECK(cudaEventRecord(e0));
        cuda::attention(a, nullptr);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float m = 0;
        CHECK(cudaEventElapsedTime(&m, e0, e1));
        if (it >= 5) ms.push_back(m);
      }
      CHECK(cudaGetLastError());
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2] * 1e-3;
      double keys = 0;  // visible keys summed over the queries
      for (int32_t p = 0; p < n_tokens; ++p) keys += sh->window > 0 ? std::min(p + 1, sh->window) : p + 1;
      const double flops = 4.0 * sh->hd * sh->heads * keys;
      std::printf(
          "prefill %-7s (%d/%d heads of %d, window %d) kv %-4s tokens %d, %s kernel: %9.1f us/layer, "
          "%6.1f TFLOP/s, %4.1f%% of %.1f\n",
          sh->name, sh->heads, sh->heads_kv, sh->hd, sh->window, name.c_str(), n_tokens, kernel(sh->hd), med * 1e6,
          flops / med / 1e12, 100.0 * flops / med / 1e12 / peak, peak);
      CHECK(cudaEventDestroy(e0));
      CHECK(cudaEventDestroy(e1));
      for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(dt),
                      static_cast<void*>(dts), static_cast<void*>(dseq), static_cast<void*>(dpos),
                      static_cast<void*>(dtiles), out, static_cast<void*>(rotation)})
        CHECK(cudaFree(p));
    }
  }
  return 0;
}
