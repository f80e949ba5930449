// FP8 gate/up GEMM fused with the GLU (issue 23; backend/cuda/fp8.h's
// fp8_scale_glu and fp8_matmul_glu, Backend::matmul_glu):
//  - fp8_scale_glu equals fp8_scale_rows then silu_mul / gelu_tanh_mul on
//    the same unscaled product bit for bit: SiLU and GELU-tanh, out in F32,
//    F16 and BF16, its float4 form and its scalar form (n_ff not a multiple
//    of 4; out one element off 8-byte alignment), one and several blocks a
//    token;
//  - the CUDA backend's matmul_glu over FP8 weights equals its matmul then
//    glu bit for bit (1, 7, 64 and 300 tokens; SiLU and GELU-tanh; BF16
//    and F32 activations, those FP8 weights take; gate/up widths 2 x 344,
//    2 x 1,000 and 2 x 1,030, the last not a multiple of 16 rows: no FP8
//    GEMM expected, the default path), takes the fused path where
//    fp8_matmul runs the unscaled tensor-core GEMM (asserted from 64 tokens
//    at the widths of whole 16s: the scratch then holds the unscaled
//    product, not today's scaled gate_up), and there lies within the FP8
//    GEMM's error of the f64 GLU of the e4m3-quantized operands.
// Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/ops.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using testing::decode;
using testing::download;
using testing::encode;
using testing::random_floats;
using testing::round_to;
using testing::upload;

size_t elem_bytes(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

// e4m3 (fn) value of a code, and the nearest code (ties to even,
// saturating at +-448): fp8_weights_test's reference quantization.
float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

uint8_t e4m3_nearest(float x) {
  const float a = std::fabs(x);
  int best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const float d = std::fabs(e4m3_value(static_cast<uint8_t>(c)) - a),
                db = std::fabs(e4m3_value(static_cast<uint8_t>(best)) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

// Rows quantized as the device quantizes weights and tokens: scale max |row|
// / 448 (1 for an all-zero row), values e4m3(v / scale) x scale.
std::vector<float> quantized(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> out(v.size());
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, std::fabs(v[r * cols + c]));
    const float s = m > 0 ? m / 448.0f : 1.0f;
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = e4m3_value(e4m3_nearest(v[r * cols + c] / s)) * s;
  }
  return out;
}

double act_of(bool gelu, double x) {
  if (gelu) return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
  return x / (1.0 + std::exp(-x));
}

// fp8_scale_glu against the three kernels it replaces, on one d.
TEST(Fp8Glu, ScaleGluEqualsScalePassThenGlu) {
  RILL_REQUIRE_GPU();
  struct Case {
    int64_t n, n_ff;
    bool misalign_out;  // out one element past a 16-byte boundary: the scalar form
  };
  for (const Case c :
       {Case{3, 64, false}, Case{3, 37, false}, Case{5, 64, true}, Case{70, 8200, false}, Case{1, 14336, false}}) {
    // Scaled gate and up within about +-4 (both tails of the activations).
    const std::vector<float> d = random_floats(static_cast<size_t>(c.n * 2 * c.n_ff), 41, -400.0f, 400.0f);
    const std::vector<float> xs = random_floats(static_cast<size_t>(c.n), 42, 0.002f, 0.01f);
    const std::vector<float> ws = random_floats(static_cast<size_t>(2 * c.n_ff), 43, 0.1f, 1.0f);
    const DeviceBuffer dd = upload(d), xd = upload(xs), wd = upload(ws);
    // The scale pass as fp8_matmul runs it (in place over the whole gate_up).
    const DeviceBuffer scaled = upload(d);
    fp8_scale_rows(scaled.as<float>(), c.n, 2 * c.n_ff, 2 * c.n_ff, 0, xd.as<float>(), wd.as<float>(),
                   scaled.as<float>(), false, nullptr);
    for (const DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (const bool gelu : {false, true}) {
        SCOPED_TRACE(std::to_string(c.n) + " x " + std::to_string(c.n_ff) +
                     (c.misalign_out ? " (out misaligned)" : "") + ", " + std::string(dtype_name(out)) +
                     (gelu ? ", GELU-tanh" : ", SiLU"));
        const size_t eb = elem_bytes(out), bytes = static_cast<size_t>(c.n * c.n_ff) * eb;
        const size_t off = c.misalign_out ? eb : 0;
        auto want = DeviceBuffer::allocate(bytes + 16, "want"), got = DeviceBuffer::allocate(bytes + 16, "got");
        ASSERT_TRUE(want.ok() && got.ok());
        void* got_at = got->as<uint8_t>() + off;
        if (gelu) {
          gelu_tanh_mul(scaled.as<float>(), c.n, c.n_ff, out, want->data(), nullptr);
        } else {
          silu_mul(scaled.as<float>(), c.n, c.n_ff, out, want->data(), nullptr);
        }
        fp8_scale_glu(dd.as<float>(), c.n, c.n_ff, xd.as<float>(), wd.as<float>(), gelu, out, got_at, nullptr);
        const auto w = download<uint8_t>(*want, bytes + 16);
        const auto g = download<uint8_t>(*got, bytes + 16);
        int64_t bad = 0, first = -1;
        for (size_t i = 0; i < bytes; i += eb) {
          if (std::memcmp(w.data() + i, g.data() + off + i, eb) != 0) {
            if (first < 0) first = static_cast<int64_t>(i / eb);
            ++bad;
          }
        }
        EXPECT_EQ(bad, 0) << "outputs differ from scale pass + GLU (first at element " << first << ")";
        // The values themselves: the f64 GLU of the scaled halves.
        const std::vector<float> v = decode(out, std::vector<uint8_t>(g.begin() + off, g.begin() + off + bytes));
        for (int64_t t = 0; t < c.n; ++t) {
          for (int64_t i = 0; i < c.n_ff; ++i) {
            const double gate = double(d[t * 2 * c.n_ff + i]) * xs[t] * ws[i],
                         up = double(d[t * 2 * c.n_ff + c.n_ff + i]) * xs[t] * ws[c.n_ff + i];
            const double ref = act_of(gelu, gate) * up;
            // f32 expf/tanhf against f64 (GELU's 1 + tanh cancels for
            // negative gates: a few ulps of |gate up|), then the rounding
            // to out (f16's subnormals: an absolute 2^-24).
            const double tol = 1e-5 * std::fabs(ref) + 1e-6 * std::fabs(gate * up) +
                               (out == DType::kF32   ? 0.0
                                : out == DType::kF16 ? std::ldexp(std::fabs(ref), -11) + std::ldexp(1.0, -24)
                                                     : std::ldexp(std::fabs(ref), -8));
            ASSERT_NEAR(v[static_cast<size_t>(t * c.n_ff + i)], ref, tol) << "token " << t << " column " << i;
          }
        }
      }
    }
  }
}

// Backend::matmul_glu on the CUDA backend with FP8 weights against its
// matmul then glu.
TEST(Fp8Glu, BackendMatmulGluEqualsMatmulThenGlu) {
  RILL_REQUIRE_GPU();
  const int64_t cols = 512, max_tokens = 300;
  int fused_cases = 0, expected_fused = 0;
  for (const int64_t F : {int64_t{344}, int64_t{1000}, int64_t{1030}}) {
    // Weights of both halves, a few larger entries (unequal row scales).
    std::vector<float> w = random_floats(static_cast<size_t>(2 * F * cols), 51, -0.05f, 0.05f);
    for (size_t i = 0; i < w.size(); i += 89) w[i] *= 12;
    const std::vector<float> wq = quantized(w, 2 * F, cols);
    // --quantize fp8 takes bf16 and f32 activations (place() refuses f16).
    for (const DType act : {DType::kBF16, DType::kF32}) {
      CudaBackendOptions o;
      o.act = act;
      o.fp8_weights = true;
      auto b = make_cuda_backend(o);
      ASSERT_TRUE(b.ok()) << b.error().message;
      const HostMatrix parts[2] = {{w.data(), DType::kF32, F, cols, static_cast<size_t>(cols) * 4},
                                   {w.data() + F * cols, DType::kF32, F, cols, static_cast<size_t>(cols) * 4}};
      auto wt = (*b)->place(parts, 2, "mlp.{gate,up}_proj");
      ASSERT_TRUE(wt.ok()) << wt.error().message;
      ASSERT_TRUE((*b)->reserve({max_tokens, 4, 64}).ok());
      const size_t ab = elem_bytes(act);
      auto xb = (*b)->allocate(static_cast<size_t>(max_tokens * cols) * ab, "x");
      auto gu_a = (*b)->allocate(static_cast<size_t>(max_tokens * 2 * F) * 4, "gate_up a");
      auto gu_b = (*b)->allocate(static_cast<size_t>(max_tokens * 2 * F) * 4, "gate_up b");
      auto out_a = (*b)->allocate(static_cast<size_t>(max_tokens * F) * ab, "out a");
      auto out_b = (*b)->allocate(static_cast<size_t>(max_tokens * F) * ab, "out b");
      ASSERT_TRUE(xb.ok() && gu_a.ok() && gu_b.ok() && out_a.ok() && out_b.ok());
      for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{300}}) {
        std::vector<float> x = random_floats(static_cast<size_t>(n * cols), 52 + static_cast<uint32_t>(n));
        for (float& v : x) v = round_to(act, v);
        const std::vector<uint8_t> xbytes = encode(act, x);
        ASSERT_TRUE((*b)->copy_in(xb->data(), xbytes.data(), xbytes.size()).ok());
        const Tensor xt = Tensor::dense(xb->data(), act, n, cols);
        const Tensor ga = Tensor::dense(gu_a->data(), DType::kF32, n, 2 * F),
                     gb = Tensor::dense(gu_b->data(), DType::kF32, n, 2 * F);
        const Tensor oa = Tensor::dense(out_a->data(), act, n, F), ob = Tensor::dense(out_b->data(), act, n, F);
        // The f64 sums of the quantized operands (used where the fused path ran).
        const std::vector<float> xq = quantized(x, n, cols);
        std::vector<double> sums(static_cast<size_t>(n * 2 * F)), mags(sums.size());
        bool sums_done = false;
        for (const Glu kind : {Glu::kSilu, Glu::kGeluTanh}) {
          const bool gelu = kind == Glu::kGeluTanh;
          SCOPED_TRACE("F " + std::to_string(F) + ", " + std::to_string(n) + " tokens, " +
                       std::string(dtype_name(act)) + (gelu ? ", GELU-tanh" : ", SiLU"));
          // Today's path, twice (whether cuBLASLt gives the same bits run to run).
          std::vector<uint8_t> want[2];
          std::vector<float> scaled;
          for (int rep = 0; rep < 2; ++rep) {
            ASSERT_TRUE((*b)->matmul(*wt, xt, ga, false).ok());
            (*b)->glu(kind, ga, oa);
            want[rep].resize(static_cast<size_t>(n * F) * ab);
            ASSERT_TRUE((*b)->copy_out(want[rep].data(), out_a->data(), want[rep].size()).ok());
          }
          scaled.resize(static_cast<size_t>(n * 2 * F));
          ASSERT_TRUE((*b)->copy_out(scaled.data(), gu_a->data(), scaled.size() * 4).ok());
          // The fused op.
          ASSERT_TRUE((*b)->matmul_glu(*wt, xt, kind, gb, ob).ok());
          std::vector<uint8_t> got(static_cast<size_t>(n * F) * ab);
          std::vector<float> scratch(static_cast<size_t>(n * 2 * F));
          ASSERT_TRUE((*b)->copy_out(got.data(), out_b->data(), got.size()).ok());
          ASSERT_TRUE((*b)->copy_out(scratch.data(), gu_b->data(), scratch.size() * 4).ok());
          // Fused: the scratch holds the unscaled product, not today's
          // scaled gate_up: larger by 1 / (xs[t] ws[r]), ~10^5 here (a
          // test that a GEMM's run-to-run differences cannot pass).
          int64_t unscaled = 0;
          for (size_t i = 0; i < scratch.size(); ++i) unscaled += std::fabs(scratch[i]) > 100 * std::fabs(scaled[i]);
          const bool fused = unscaled > static_cast<int64_t>(scratch.size()) / 2;
          // From 64 tokens on, widths of whole 16s, fp8_matmul surely takes
          // cuBLASLt's FP8 GEMM or gemm_stream (64 tokens by default), both
          // leaving the unscaled sums in the scratch (fewer tokens: where
          // cuBLASLt has a GEMM, else the GEMV; printed).
          // (With RILL_FP8_MMA=1, 2..64 tokens go through fp8_mma_glu,
          // which leaves the scratch alone: not asserted there.)
          const bool expect_fused = n >= 64 && (2 * F) % 16 == 0 && !(fp8_mma_on() && n <= kFp8MmaMaxTokens);
          expected_fused += expect_fused;
          fused_cases += fused;
          if (expect_fused) {
            EXPECT_TRUE(fused) << "matmul_glu did not take the fused path (cuBLASLt outer-vector scales or no FP8 "
                                  "GEMM for the shape?)";
          }
          if (!gelu) {
            std::printf("[ fp8 glu ] F %lld, %lld tokens, %s: %s path\n", static_cast<long long>(F),
                        static_cast<long long>(n), std::string(dtype_name(act)).c_str(), fused ? "fused" : "default");
          }
          if (n == 1) {
            EXPECT_FALSE(fused) << "one token: fp8_matmul's GEMV, nothing to fuse";
          }
          const bool reproducible = want[0] == want[1];
          if (reproducible) {
            int64_t bad = 0;
            for (size_t i = 0; i < got.size(); i += ab) bad += std::memcmp(got.data() + i, want[0].data() + i, ab) != 0;
            EXPECT_EQ(bad, 0) << "of " << n * F << " outputs differ from matmul then glu"
                              << (fused ? " (fused path)" : " (default path)");
          } else {
            std::printf(
                "[ fp8 glu ] F %lld, %lld tokens: matmul then glu not the same bits run to run; "
                "%s\n",
                static_cast<long long>(F), static_cast<long long>(n),
                fused ? "held to the f64 bound only" : "default path, not compared");
          }
          if (!fused) continue;
          // Within the FP8 GEMM's error (fp8_weights_test holds it to 1e-2
          // of sum |w x| with fast accumulation) of the f64 GLU of the
          // quantized operands, carried through act(g) * u.
          if (!sums_done) {
            for (int64_t t = 0; t < n; ++t) {
              for (int64_t r = 0; r < 2 * F; ++r) {
                double s = 0, m = 0;
                for (int64_t k = 0; k < cols; ++k) {
                  const double p = double(wq[r * cols + k]) * xq[t * cols + k];
                  s += p;
                  m += std::fabs(p);
                }
                sums[static_cast<size_t>(t * 2 * F + r)] = s;
                mags[static_cast<size_t>(t * 2 * F + r)] = m;
              }
            }
            sums_done = true;
          }
          const std::vector<float> v = decode(act, got);
          const double out_eps = act == DType::kF32 ? 1e-6 : 1.0 / 128;  // bf16: twice its rounding
          for (int64_t t = 0; t < n; ++t) {
            for (int64_t i = 0; i < F; ++i) {
              const size_t gi = static_cast<size_t>(t * 2 * F + i), ui = gi + static_cast<size_t>(F);
              const double g = sums[gi], u = sums[ui], eg = 1e-2 * mags[gi], eu = 1e-2 * mags[ui];
              const double ref = act_of(gelu, g) * u;
              // |act'| <= 1.13 for both activations.
              const double tol = 1.13 * eg * (std::fabs(u) + eu) + (std::fabs(act_of(gelu, g)) + 1.13 * eg) * eu +
                                 out_eps * std::fabs(ref) + 1e-6 * std::fabs(g * u) + 1e-6;
              ASSERT_NEAR(v[static_cast<size_t>(t * F + i)], ref, tol) << "token " << t << " column " << i;
            }
          }
        }
      }
    }
  }
  std::printf("[ fp8 glu ] fused path taken in %d cases (%d expected)\n", fused_cases, expected_fused);
  EXPECT_GT(fused_cases, 0);
}

}  // namespace
}  // namespace rill::cuda
