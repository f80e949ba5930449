// bench_kv_attention: one layer's decode attention alone (cuda::attention,
// the fast split-KV kernel where it applies, splits merged in the kernel as
// the models run it) per KV type, on Llama-3.1-8B's shape (32 q heads over
// 8 KV heads of 128): B sequences of `context` keys each, one decode token
// per sequence, paged in blocks of 16 over a shuffled table. Prints the
// median of 50 calls (CUDA events) and the KV bytes it read per second.
// The KV bytes are constant (no NaN or infinity: the timing does not
// depend on the values).
//
// Rotated types (q8_0h, q4_0h, iq4_nlh, q8_0h64) include the query's rotation and the
// output's rotation back (two small kernels around the attention's).
//
//   bench_kv_attention [--contexts 1024,8192] [--batches 1,64] [--types f16,q8_0,fp8,q4_0] [--general 0|1]
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

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

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

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> contexts = {1024, 8192}, batches = {1, 64};
  std::vector<std::string> types = {"f16", "q8_0", "fp8", "q4_0"};
  bool general = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--contexts")) contexts = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--batches")) batches = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--types")) types = parse_names(argv[i + 1]);
    if (!std::strcmp(argv[i], "--general")) general = std::atoi(argv[i + 1]) != 0;
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  constexpr int32_t kHeads = 32, kHeadsKv = 8, kHd = 128, kBlock = 16, kShift = 4;
  for (const std::string& name : types) {
    const auto t = parse_kv_type(name);
    if (!t || !cuda::kv_supported(t->dtype) || !cuda::kv_rotation_supported(t->dtype, kHd, t->rotated)) {
      std::fprintf(stderr, "--types: %s is not a CUDA KV type\n", name.c_str());
      return 1;
    }
    const size_t row = row_bytes(t->dtype, kHeadsKv * kHd);
    for (int ctx : contexts) {
      for (int B : batches) {
        const int32_t blocks_per_seq = (ctx + kBlock - 1) / kBlock, n_blocks = B * blocks_per_seq;
        std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
        std::vector<int32_t> table_start, seq_of, pos, decode;
        for (int s = 0; s < B; ++s) {
          table_start.push_back(s * blocks_per_seq);
          seq_of.push_back(s);
          pos.push_back(ctx - 1);
          decode.push_back(s);
        }
        const size_t kv_bytes = static_cast<size_t>(n_blocks) * kBlock * row;
        void *k = nullptr, *v = nullptr;
        CHECK(cudaMalloc(&k, kv_bytes));
        CHECK(cudaMalloc(&v, kv_bytes));
        // 0x11 bytes: f16 0x1111, e4m3 0x11 and q8_0/q4_0 scales 0x1111 are small normal values.
        CHECK(cudaMemset(k, 0x11, kv_bytes));
        CHECK(cudaMemset(v, 0x11, kv_bytes));
        std::vector<float> qh(static_cast<size_t>(B) * kHeads * kHd, 0.01f);
        float* q = upload(qh);
        int32_t *dt = upload(perm), *dts = upload(table_start), *dseq = upload(seq_of), *dpos = upload(pos),
                *ddec = upload(decode);
        int32_t* counts = upload(std::vector<int32_t>(static_cast<size_t>(B) * kHeadsKv, 0));
        float *partial = nullptr, *out = nullptr, *rotation = nullptr;
        CHECK(cudaMalloc(&partial, cuda::attention_partial_floats(B, kHeads, kHd) * sizeof(float)));
        CHECK(cudaMalloc(&rotation, cuda::attention_rotation_floats(B, kHeads, kHd) * sizeof(float)));
        CHECK(cudaMalloc(&out, qh.size() * 2));
        cuda::AttentionArgs a;
        a.q = q;
        a.q_stride = kHeads * kHd;
        a.n_head = kHeads;
        a.n_head_kv = kHeadsKv;
        a.head_dim = kHd;
        a.scale = 1.0f / 11.3137f;
        a.k_cache = k;
        a.v_cache = v;
        a.kv_dtype = t->dtype;
        a.block_shift = kShift;
        a.block_tables = dt;
        a.table_start = dts;
        a.seq_of = dseq;
        a.pos = dpos;
        a.decode_tokens = ddec;
        a.n_decode = B;
        a.max_decode_len = ctx;
        a.partial = partial;
        a.split_counts = counts;
        a.out_dtype = DType::kBF16;
        a.out = out;
        a.general_decode = general;
        a.k_rotated = a.v_rotated = t->rotated;  // q8_0h / q4_0h: q rotated first, the output rotated back
        a.n_tokens = B;
        a.rotation = rotation;
        cudaEvent_t e0, e1;
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int it = 0; it < 55; ++it) {
          CHECK(cudaEventRecord(e0));
          cuda::attention(a, nullptr);
          CHECK(cudaEventRecord(e1));
          CHECK(cudaEventSynchronize(e1));
          float m = 0;
          CHECK(cudaEventElapsedTime(&m, e0, e1));
          if (it >= 5) ms.push_back(m);
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2] * 1e-3;
        const double read = 2.0 * static_cast<double>(B) * ctx * static_cast<double>(row);
        std::printf("kv %-5s context %5d batch %3d%s: %8.1f us/layer, KV %7.1f MB, %6.0f GB/s\n", name.c_str(), ctx, B,
                    general ? " (general kernel)" : "", med * 1e6, read / 1e6, read / med / 1e9);
        CHECK(cudaEventDestroy(e0));
        CHECK(cudaEventDestroy(e1));
        for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(dt),
                        static_cast<void*>(dts), static_cast<void*>(dseq), static_cast<void*>(dpos),
                        static_cast<void*>(ddec), static_cast<void*>(counts), static_cast<void*>(partial),
                        static_cast<void*>(out), static_cast<void*>(rotation)})
          CHECK(cudaFree(p));
      }
    }
  }
  return 0;
}
