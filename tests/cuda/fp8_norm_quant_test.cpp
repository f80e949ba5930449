// The pre-norm that quantizes for FP8 weights' GEMM (issue 23;
// backend/cuda/ops.h's rms_norm_fp8, Backend::norm_matmul and
// norm_matmul_glu on CUDA):
//  - rms_norm_fp8 writes out, xq and xs with the bits of rms_norm then
//    quantize_fp8_tokens on out: F32 and BF16 out, with and without the
//    norm weight and its offset (Gemma's 1), rows of 256 / 1,024 / 4,096,
//    one row a block and two (from 1,024 rows), rows with large values and
//    an all-zero row (scale 1);
//  - the CUDA backend's norm_matmul / norm_matmul_glu over FP8 weights
//    equal rms_norm then matmul / matmul_glu on a backend with the fusion
//    off (RILL_FP8_NORM_QUANT=0), bit for bit, at 1, 2, 9 and 64 tokens
//    (the GEMV, then the FP8 GEMM), accumulating into y and with a bias,
//    and leave h the same normed rows; the fused path runs at 64 tokens
//    (both ops) and not at one (cuda_fused_norm_quant_calls).
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::download;
using testing::encode;
using testing::poisoned;
using testing::random_floats;
using testing::ScopedEnv;
using testing::upload;

TEST(Fp8NormQuant, KernelEqualsNormThenQuantize) {
  RILL_REQUIRE_GPU();
  // The held kernel's widths (a float4 a thread): 2,048 is not one (it
  // falls back to two kernels).
  EXPECT_FALSE(rms_norm_fp8_supported(nullptr, 0, 2048, DType::kBF16, nullptr));
  for (const int64_t dim : {int64_t{256}, int64_t{1024}, int64_t{4096}}) {
    for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{1100}}) {
      std::vector<float> x = random_floats(static_cast<size_t>(n * dim), 7 + static_cast<uint32_t>(n + dim), -3, 3);
      for (size_t i = 0; i < x.size(); i += 97) x[i] *= 40;                             // large values
      for (int64_t c = 0; c < dim; ++c) x[static_cast<size_t>((n / 2) * dim + c)] = 0;  // one all-zero row
      const std::vector<float> w = random_floats(static_cast<size_t>(dim), 11, -0.5f, 1.5f);
      const DeviceBuffer xd = upload(x), wd = upload(w);
      for (const DType out_dtype : {DType::kBF16, DType::kF32}) {
        for (const bool weighted : {true, false}) {
          for (const float w_offset : {0.0f, 1.0f}) {
            SCOPED_TRACE("dim " + std::to_string(dim) + ", " + std::to_string(n) + " rows, " +
                         std::string(dtype_name(out_dtype)) + (weighted ? ", weighted" : "") + ", offset " +
                         std::to_string(w_offset));
            const size_t ob = static_cast<size_t>(n * dim) * (out_dtype == DType::kF32 ? 4 : 2);
            DeviceBuffer out_a = poisoned(ob), out_b = poisoned(ob);
            DeviceBuffer xq_a = poisoned(static_cast<size_t>(n * dim)), xq_b = poisoned(static_cast<size_t>(n * dim));
            DeviceBuffer xs_a = poisoned(static_cast<size_t>(n) * 4), xs_b = poisoned(static_cast<size_t>(n) * 4);
            const float* wp = weighted ? wd.as<float>() : nullptr;
            ASSERT_TRUE(rms_norm_fp8_supported(xd.as<float>(), 0, dim, out_dtype, out_b.data()));
            rms_norm(xd.as<float>(), 0, nullptr, wp, n, dim, 1e-5f, w_offset, out_dtype, out_a.data(), nullptr);
            quantize_fp8_tokens(out_dtype, out_a.data(), n, dim, xq_a.as<uint8_t>(), xs_a.as<float>(), nullptr);
            rms_norm_fp8(xd.as<float>(), 0, wp, n, dim, 1e-5f, w_offset, out_dtype, out_b.data(), xq_b.as<uint8_t>(),
                         xs_b.as<float>(), nullptr);
            EXPECT_EQ(download<uint8_t>(out_a, ob), download<uint8_t>(out_b, ob)) << "normed rows differ";
            EXPECT_EQ(download<uint8_t>(xq_a, static_cast<size_t>(n * dim)),
                      download<uint8_t>(xq_b, static_cast<size_t>(n * dim)))
                << "e4m3 rows differ";
            const std::vector<float> sa = download<float>(xs_a, static_cast<size_t>(n)),
                                     sb = download<float>(xs_b, static_cast<size_t>(n));
            EXPECT_EQ(0, std::memcmp(sa.data(), sb.data(), sa.size() * 4)) << "token scales differ";
            EXPECT_EQ(sb[static_cast<size_t>(n / 2)], 1.0f) << "the all-zero row's scale";
          }
        }
      }
    }
  }
}

// A backend with FP8 weights (RILL_FP8_NORM_QUANT as given while it is
// made), its qkv-like and gate/up weights placed, its buffers.
struct Fp8Layer {
  std::unique_ptr<Backend> b;
  Weight w, w_gu;
  Vec norm, bias;
  Buffer x, h, y, gu, out;
};

constexpr int64_t kE = 1024, kRows = 1536, kF = 2048, kMaxTokens = 64;

Fp8Layer make_layer(DType act, const char* norm_quant) {
  ScopedEnv env("RILL_FP8_NORM_QUANT", norm_quant);
  Fp8Layer L;
  CudaBackendOptions o;
  o.act = act;
  o.fp8_weights = true;
  auto b = make_cuda_backend(o);
  EXPECT_TRUE(b.ok()) << b.error().message;
  L.b = std::move(*b);
  const std::vector<float> w = random_floats(static_cast<size_t>(kRows * kE), 21, -0.05f, 0.05f),
                           gu = random_floats(static_cast<size_t>(2 * kF * kE), 22, -0.05f, 0.05f),
                           norm = random_floats(static_cast<size_t>(kE), 23, 0.5f, 1.5f),
                           bias = random_floats(static_cast<size_t>(kRows), 24);
  const HostMatrix pw{w.data(), DType::kF32, kRows, kE, static_cast<size_t>(kE) * 4};
  const HostMatrix pgu[2] = {{gu.data(), DType::kF32, kF, kE, static_cast<size_t>(kE) * 4},
                             {gu.data() + kF * kE, DType::kF32, kF, kE, static_cast<size_t>(kE) * 4}};
  L.w = L.b->place(&pw, 1, "qkv").value();
  L.w_gu = L.b->place(pgu, 2, "gate_up").value();
  L.norm = L.b->place_vector(norm.data(), kE, "norm").value();
  L.bias = L.b->place_vector(bias.data(), kRows, "bias").value();
  EXPECT_TRUE(L.b->reserve({kMaxTokens, 4, 64}).ok());
  const size_t ab = act == DType::kF32 ? 4 : 2;
  L.x = L.b->allocate(static_cast<size_t>(kMaxTokens * kE) * 4, "x").value();
  L.h = L.b->allocate(static_cast<size_t>(kMaxTokens * kE) * ab, "h").value();
  L.y = L.b->allocate(static_cast<size_t>(kMaxTokens * kRows) * 4, "y").value();
  L.gu = L.b->allocate(static_cast<size_t>(kMaxTokens * 2 * kF) * 4, "gate_up").value();
  L.out = L.b->allocate(static_cast<size_t>(kMaxTokens * kF) * ab, "out").value();
  return L;
}

// h, y (y preset to y0 when accumulating) and the GLU's out of one pass.
std::vector<uint8_t> run(Fp8Layer& L, DType act, const std::vector<float>& x, int64_t n, bool accumulate, bool bias,
                         const std::vector<float>& y0) {
  const size_t ab = act == DType::kF32 ? 4 : 2;
  EXPECT_TRUE(L.b->copy_in(L.x.data(), x.data(), x.size() * 4).ok());
  EXPECT_TRUE(L.b->copy_in(L.y.data(), y0.data(), static_cast<size_t>(n * kRows) * 4).ok());
  const Tensor xt = Tensor::dense(L.x.data(), DType::kF32, n, kE), ht = Tensor::dense(L.h.data(), act, n, kE),
               yt = Tensor::dense(L.y.data(), DType::kF32, n, kRows),
               gt = Tensor::dense(L.gu.data(), DType::kF32, n, 2 * kF), ot = Tensor::dense(L.out.data(), act, n, kF);
  EXPECT_TRUE(L.b->norm_matmul(xt, L.norm, 1e-5f, 0.0f, ht, L.w, yt, accumulate, bias ? L.bias : Vec{}).ok());
  std::vector<uint8_t> got(static_cast<size_t>(n * kE) * ab + static_cast<size_t>(n * kRows) * 4);
  EXPECT_TRUE(L.b->copy_out(got.data(), L.h.data(), static_cast<size_t>(n * kE) * ab).ok());
  EXPECT_TRUE(L.b->copy_out(got.data() + n * kE * ab, L.y.data(), static_cast<size_t>(n * kRows) * 4).ok());
  EXPECT_TRUE(L.b->norm_matmul_glu(xt, L.norm, 1e-5f, 0.0f, ht, L.w_gu, Glu::kSilu, gt, ot).ok());
  const size_t at = got.size();
  got.resize(at + static_cast<size_t>(n * kF) * ab);
  EXPECT_TRUE(L.b->copy_out(got.data() + at, L.out.data(), static_cast<size_t>(n * kF) * ab).ok());
  return got;
}

TEST(Fp8NormQuant, BackendNormMatmulEqualsNormThenMatmul) {
  RILL_REQUIRE_GPU();
  for (const DType act : {DType::kBF16, DType::kF32}) {
    Fp8Layer fused = make_layer(act, "1"), plain = make_layer(act, "0");
    for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{9}, int64_t{64}}) {
      const std::vector<float> x = random_floats(static_cast<size_t>(n * kE), 31 + static_cast<uint32_t>(n), -2, 2);
      const std::vector<float> y0 = random_floats(static_cast<size_t>(n * kRows), 41);
      for (const bool accumulate : {false, true}) {
        const bool bias = !accumulate;
        SCOPED_TRACE(std::string(dtype_name(act)) + ", " + std::to_string(n) + " tokens" +
                     (accumulate ? ", accumulating" : ", with a bias"));
        // The unfused pass twice: whether cuBLASLt repeats its bits here.
        const int64_t calls0 = cuda_fused_norm_quant_calls();
        const std::vector<uint8_t> want = run(plain, act, x, n, accumulate, bias, y0),
                                   again = run(plain, act, x, n, accumulate, bias, y0);
        EXPECT_EQ(cuda_fused_norm_quant_calls(), calls0) << "the backend with the fusion off took it";
        const std::vector<uint8_t> got = run(fused, act, x, n, accumulate, bias, y0);
        const int64_t fused_calls = cuda_fused_norm_quant_calls() - calls0;
        // One token: the GEMV, nothing quantized. 64, in the default
        // routes: cuBLASLt's FP8 GEMM for both matrices (RILL_FP8_MMA=2
        // takes fp8_mma's bf16 form, RILL_FP8_BF16_D=1 no fused GLU, so
        // fewer). 2..9: the GEMM where cuBLASLt has one, else the GEMV
        // (printed).
        if (n == 1) {
          EXPECT_EQ(fused_calls, 0);
        }
        if (n == 64 && !std::getenv("RILL_FP8_MMA") && !std::getenv("RILL_FP8_BF16_D")) {
          EXPECT_EQ(fused_calls, 2) << "norm_matmul and norm_matmul_glu at 64 tokens";
        }
        std::printf("[ fp8 norm ] %s %lld tokens: %lld of 2 calls fused\n", std::string(dtype_name(act)).c_str(),
                    static_cast<long long>(n), static_cast<long long>(fused_calls));
        if (want != again) {
          std::printf("[ fp8 norm ] %s %lld tokens: the unfused pass is not reproducible; not compared\n",
                      std::string(dtype_name(act)).c_str(), static_cast<long long>(n));
          continue;
        }
        EXPECT_TRUE(got == want) << "norm_matmul / norm_matmul_glu differ from the unfused pass";
      }
    }
  }
}

}  // namespace
}  // namespace rill::cuda
