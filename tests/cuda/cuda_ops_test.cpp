// The backend-ops test: every CUDA op against the CPU reference
// (backend/cpu) on seeded random inputs, several shapes and dtypes.
// Tolerances (stated per op below) come from the arithmetic that differs:
//  - f32 outputs of the same formula: summation order only, |err| <= 1e-5
//    relative to the row's scale (attention, RMSNorm, GEMM in true f32);
//  - outputs rounded to bf16/f16: one rounding of the output (2^-8 / 2^-11
//    relative) on top of that;
//  - RoPE: CUDA's cosf/sinf against glibc's, a few ulp: 2e-5 absolute at
//    positions up to 5,000.
// The Gemma family's ops (GeGLU, the sandwich norm's fused residual add,
// softcap, scale) are held to the same CPU functions the CPU Gemma uses.
// Skipped where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cpu/rope_table.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/rope_kv.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}
double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}
float rel_tol(DType out) {
  return out == DType::kBF16 ? 1.0f / 128 : out == DType::kF16 ? 1.0f / 1024 : 1e-5f;
}

TEST(CudaOps, EmbeddingGatherIsExact) {
  RILL_REQUIRE_GPU();
  const int64_t V = 300, E = 96;
  const std::vector<int32_t> ids = {0, 299, 17, 17, 150};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const auto table = encode(t, random_floats(V * E, 1));
    cpu::WeightView w{t, V, E, table.data(), row_bytes(t, E)};
    std::vector<float> want(ids.size() * E);
    cpu::get_rows(w, ids.data(), static_cast<int64_t>(ids.size()), want.data());
    auto d_table = upload(table);
    auto d_ids = upload(ids);
    auto d_out = poisoned(want.size() * 4);
    embed_rows(t, d_table.data(), E, d_ids.as<int32_t>(), static_cast<int64_t>(ids.size()), d_out.as<float>(), nullptr);
    EXPECT_EQ(download<float>(d_out, want.size()), want) << dtype_name(t);
  }
}

// From 1,024 rows a block takes two (ops.cu): an odd count leaves the last
// block one row, and gathered rows (row_ids) go through the same path.
TEST(CudaOps, RmsNormTwoRowsABlockMatchesCpu) {
  RILL_REQUIRE_GPU();
  const int64_t n = 1025, dim = 4096;
  const auto x = random_floats(n * dim, 12, -3, 3);
  const auto w = random_floats(dim, 13);
  std::vector<float> want(x.size());
  cpu::rms_norm(x.data(), w.data(), n, dim, 1e-5f, want.data());
  auto dx = upload(x);
  auto dw = upload(w);
  for (DType out : {DType::kF32, DType::kBF16}) {
    const size_t es = out == DType::kF32 ? 4 : 2;
    auto d_out = poisoned(x.size() * es + 64);
    rms_norm(dx.as<float>(), dim, nullptr, dw.as<float>(), n, dim, 1e-5f, 0.0f, out, d_out.data(), nullptr);
    const auto raw = download<uint8_t>(d_out, x.size() * es + 64);
    const auto got =
        decode(out, std::vector<uint8_t>(raw.begin(), raw.begin() + static_cast<std::ptrdiff_t>(x.size() * es)));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], rel_tol(out) * std::fabs(want[i]) + 1e-6) << dtype_name(out) << " " << i;
    }
    EXPECT_EQ(std::count(raw.end() - 64, raw.end(), uint8_t{0xff}), 64) << "written past the rows";
  }
  // 1,025 gathered rows in reverse order.
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) rows[static_cast<size_t>(r)] = static_cast<int32_t>(n - 1 - r);
  auto d_rows = upload(rows);
  auto d_out = poisoned(x.size() * 4);
  rms_norm(dx.as<float>(), dim, d_rows.as<int32_t>(), dw.as<float>(), n, dim, 1e-5f, 0.0f, DType::kF32, d_out.data(),
           nullptr);
  const auto got = download<float>(d_out, x.size());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      ASSERT_NEAR(got[r * dim + i], want[(n - 1 - r) * dim + i], 1e-5 * std::fabs(want[(n - 1 - r) * dim + i]) + 1e-6)
          << "gathered row " << r;
    }
  }
}

TEST(CudaOps, RmsNormMatchesCpu) {
  RILL_REQUIRE_GPU();
  for (int64_t dim : {64, 96, 4096}) {
    const int64_t n = 5;
    const auto x = random_floats(n * dim, 2, -3, 3);
    const auto w = random_floats(dim, 3);
    std::vector<float> want(x.size());
    cpu::rms_norm(x.data(), w.data(), n, dim, 1e-5f, want.data());
    auto dx = upload(x);
    auto dw = upload(w);
    for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
      auto d_out = poisoned(x.size() * 4);
      rms_norm(dx.as<float>(), dim, nullptr, dw.as<float>(), n, dim, 1e-5f, 0.0f, out, d_out.data(), nullptr);
      const size_t es = out == DType::kF32 ? 4 : 2;
      const auto got = decode(out, download<uint8_t>(d_out, x.size() * es));
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], rel_tol(out) * std::fabs(want[i]) + 1e-6)
            << dim << " " << dtype_name(out) << " " << i;
      }
    }
    // Gathered rows (row_ids) with a stride: rows 4 and 1.
    const std::vector<int32_t> rows = {4, 1};
    auto d_rows = upload(rows);
    auto d_out = poisoned(2 * dim * 4);
    rms_norm(dx.as<float>(), dim, d_rows.as<int32_t>(), dw.as<float>(), 2, dim, 1e-5f, 0.0f, DType::kF32, d_out.data(),
             nullptr);
    const auto got = download<float>(d_out, 2 * dim);
    for (int64_t i = 0; i < dim; ++i) {
      ASSERT_NEAR(got[i], want[4 * dim + i], 1e-5 * std::fabs(want[4 * dim + i]) + 1e-6);
      ASSERT_NEAR(got[dim + i], want[dim + i], 1e-5 * std::fabs(want[dim + i]) + 1e-6);
    }
  }
}

TEST(CudaOps, SiluMulAndBiasMatchCpu) {
  RILL_REQUIRE_GPU();
  const int64_t n = 3;
  for (int64_t F : {int64_t{1000}, int64_t{1001}}) {  // float4s, and the scalar kernel
    const auto gu = random_floats(n * 2 * F, 4, -12, 12);
    std::vector<float> want(n * F);
    for (int64_t r = 0; r < n; ++r) cpu::silu_mul(&gu[r * 2 * F], &gu[r * 2 * F + F], &want[r * F], F);
    auto d_gu = upload(gu);
    for (DType out : {DType::kF32, DType::kBF16}) {
      auto d_out = poisoned(want.size() * 4);
      silu_mul(d_gu.as<float>(), n, F, out, d_out.data(), nullptr);
      const auto got = decode(out, download<uint8_t>(d_out, want.size() * (out == DType::kF32 ? 4 : 2)));
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], (rel_tol(out) + 4e-6) * std::fabs(want[i]) + 1e-6)
            << dtype_name(out) << " F=" << F << " " << i;
      }
    }
  }
  const int64_t F = 1000;
  auto y = random_floats(n * F, 5);
  const auto b = random_floats(F, 6);
  auto dy = upload(y);
  auto db = upload(b);
  add_bias(dy.as<float>(), db.as<float>(), n, F, nullptr);
  const auto got = download<float>(dy, y.size());
  for (int64_t r = 0; r < n; ++r) cpu::add_inplace(&y[r * F], b.data(), F);
  EXPECT_EQ(got, y);
}

// Greedy picks: the first index of the row maximum, as the CPU sampler's
// argmax; rows of whole float4s (the vocabulary of Llama-3) and not, ties
// planted across and inside threads' stretches, maxima at either end.
TEST(CudaOps, ArgmaxRowsIsTheFirstMaximum) {
  RILL_REQUIRE_GPU();
  for (int64_t V : {128256, 1001, 7}) {
    const int64_t n = 5;
    auto x = random_floats(n * V, 11, -30, 30);
    x[0 * V + V - 1] = 100.0f;  // row 0: at the end
    x[1 * V + 0] = 100.0f;      // row 1: at the start, tied later
    x[1 * V + V / 2] = 100.0f;
    if (V > 4100) {  // row 2: ties 4096 apart (the same thread's float4 lane), and 1 apart
      x[2 * V + 5] = 50.0f;
      x[2 * V + 5 + 4096] = 50.0f;
      x[3 * V + 4001] = 60.0f;
      x[3 * V + 4000] = 60.0f;
    }
    std::vector<int32_t> want;
    for (int64_t r = 0; r < n; ++r) {
      const float* row = &x[r * V];
      want.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));  // first maximum
    }
    auto dx = upload(x);
    auto dids = upload(std::vector<int32_t>(n, -1));
    argmax_rows(dx.as<float>(), n, V, dids.as<int32_t>(), nullptr);
    EXPECT_EQ(download<int32_t>(dids, n), want) << "V " << V;
  }
}

// RoPE (+ optional q/k RMSNorm, weights (norm_offset + w)) on a fused qkv
// buffer, K/V stored to slots.
void check_rope_kv(const cpu::RopeTable& table, int64_t hd, bool qk_norm, DType kv_dtype, float norm_offset = 0.0f) {
  const int32_t n_head = 4, n_head_kv = 2;
  const int64_t n_tok = 5, stride = (n_head + 2 * n_head_kv) * hd;
  const std::vector<int32_t> pos = {0, 1, 17, 999, 4999};
  const std::vector<int32_t> slots = {3, 0, 7, 1, 5};  // rows of an 8-row cache
  const auto qkv = random_floats(n_tok * stride, 7);
  const auto qn = random_floats(hd, 8), kn = random_floats(hd, 9);
  // CPU: split, optional norm, rope.
  std::vector<float> q(n_tok * n_head * hd), k(n_tok * n_head_kv * hd), v(k.size());
  for (int64_t t = 0; t < n_tok; ++t) {
    std::copy_n(&qkv[t * stride], n_head * hd, &q[t * n_head * hd]);
    std::copy_n(&qkv[t * stride + n_head * hd], n_head_kv * hd, &k[t * n_head_kv * hd]);
    std::copy_n(&qkv[t * stride + (n_head + n_head_kv) * hd], n_head_kv * hd, &v[t * n_head_kv * hd]);
  }
  if (qk_norm) {
    cpu::rms_norm(q.data(), qn.data(), n_tok * n_head, hd, 1e-6f, q.data(), norm_offset);
    cpu::rms_norm(k.data(), kn.data(), n_tok * n_head_kv, hd, 1e-6f, k.data(), norm_offset);
  }
  cpu::rope(q.data(), pos.data(), n_tok, n_head, hd, table);
  cpu::rope(k.data(), pos.data(), n_tok, n_head_kv, hd, table);

  auto d_qkv = upload(qkv);
  auto d_pos = upload(pos);
  auto d_slots = upload(slots);
  auto d_inv = upload(table.inv_freq);
  auto d_div = upload(table.ggml_freq_divisor.empty() ? std::vector<float>{0} : table.ggml_freq_divisor);
  auto d_qn = upload(qn), d_kn = upload(kn);
  const size_t es = kv_dtype == DType::kF32 ? 4 : 2;
  auto d_k = poisoned(8 * n_head_kv * hd * es), d_v = poisoned(8 * n_head_kv * hd * es);
  RopeKvArgs a;
  a.qkv = d_qkv.as<float>();
  a.n_tokens = n_tok;
  a.qkv_stride = stride;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = static_cast<int32_t>(hd);
  a.positions = d_pos.as<int32_t>();
  a.slots = d_slots.as<int32_t>();
  a.q_norm = qk_norm ? d_qn.as<float>() : nullptr;
  a.k_norm = qk_norm ? d_kn.as<float>() : nullptr;
  a.norm_eps = 1e-6f;
  a.norm_offset = norm_offset;
  a.inv_freq = d_inv.as<float>();
  a.freq_divisor = table.ggml_freq_divisor.empty() ? nullptr : d_div.as<float>();
  a.rot_dim = static_cast<int32_t>(table.rot_dim);
  a.interleaved = table.interleaved;
  a.attn_factor = table.attn_factor;
  a.ggml_theta_scale = table.ggml_theta_scale;
  a.k_cache = d_k.data();
  a.v_cache = d_v.data();
  a.kv_dtype = kv_dtype;
  rope_store_kv(a, nullptr);
  const auto got_qkv = download<float>(d_qkv, qkv.size());
  const auto got_k = decode(kv_dtype, download<uint8_t>(d_k, 8 * n_head_kv * hd * es));
  const auto got_v = decode(kv_dtype, download<uint8_t>(d_v, 8 * n_head_kv * hd * es));
  const float kv_tol = kv_dtype == DType::kF16 ? 1.0f / 1024 : kv_dtype == DType::kBF16 ? 1.0f / 256 : 0.0f;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t i = 0; i < n_head * hd; ++i) {
      ASSERT_NEAR(got_qkv[t * stride + i], q[t * n_head * hd + i], 2e-5) << "q token " << t << " elem " << i;
    }
    for (int64_t i = 0; i < n_head_kv * hd; ++i) {
      const float kw = k[t * n_head_kv * hd + i], vw = v[t * n_head_kv * hd + i];
      const int64_t at = slots[t] * n_head_kv * hd + i;
      ASSERT_NEAR(got_k[at], kw, 2e-5 + kv_tol * std::fabs(kw)) << "k token " << t << " elem " << i;
      ASSERT_NEAR(got_v[at], vw, kv_tol * std::fabs(vw)) << "v token " << t << " elem " << i;
    }
  }
}

TEST(CudaOps, RopeAndKvStoreMatchCpuForEveryVariant) {
  RILL_REQUIRE_GPU();
  using S = cpu::RopeScalingParams;
  S llama3;
  llama3.type = S::Type::kLlama3;
  llama3.factor = 8;
  llama3.original_max_position = 8192;
  S yarn;
  yarn.type = S::Type::kYarn;
  yarn.factor = 4;
  yarn.original_max_position = 4096;
  S linear;
  linear.type = S::Type::kLinear;
  linear.factor = 2;
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
    check_rope_kv(cpu::make_rope_table(10000.0f, 64, false), 64, false, kv);
    check_rope_kv(cpu::make_rope_table(500000.0f, 128, false, llama3), 128, false, kv);
    check_rope_kv(cpu::make_rope_table(10000.0f, 64, true, yarn), 64, false, kv);
    check_rope_kv(cpu::make_rope_table(10000.0f, 32, false, linear), 64, true, kv);  // partial rotary + qk norm
    cpu::RopeTable ggml = cpu::make_rope_table(10000.0f, 16, false);                 // llama.cpp's angle recurrence
    ggml.ggml_theta_scale = std::pow(10000.0f, -2.0f / 16);
    check_rope_kv(ggml, 16, false, kv);
    ggml.ggml_freq_divisor = random_floats(8, 10, 1.0f, 8.0f);
    check_rope_kv(ggml, 16, true, kv);
    check_rope_kv(cpu::make_rope_table(1000000.0f, 16, false), 16, true, kv, 1.0f);  // gemma3: (1 + w) q/k norms
  }
}

// rope_store_kv's warp-per-head kernel (F32 / F16 / BF16 / F8_E4M3 KV) against
// the block-per-head kernel (rope_store_kv_general) on the same inputs:
// the rotated q and the stored K/V bytes must be the same bits. n_head_kv
// 0: a q-only layer. pad: floats between rows of qkv (odd: scalar loads).
void check_rope_kernels_agree(const cpu::RopeTable& table, int32_t hd, int32_t n_head, int32_t n_head_kv, bool qk_norm,
                              DType kv, float norm_offset = 0.0f, int64_t pad = 0) {
  const int64_t n_tok = 37, n_rows = 41, stride = (n_head + 2 * n_head_kv) * hd + pad;
  std::vector<int32_t> pos(n_tok), slots(n_tok);
  for (int64_t t = 0; t < n_tok; ++t) {
    pos[t] = static_cast<int32_t>((t * 7919) % 6000);
    slots[t] = static_cast<int32_t>((t * 5 + 3) % n_rows);  // distinct: 5 and 41 are coprime
  }
  const auto qkv = random_floats(n_tok * stride, 21, -3.0f, 3.0f);
  const auto qn = random_floats(hd, 22), kn = random_floats(hd, 23);
  const size_t es = kv == DType::kF32 ? 4 : kv == DType::kF16 || kv == DType::kBF16 ? 2 : 1;
  const size_t cache_bytes = static_cast<size_t>(n_rows * std::max(n_head_kv, 1) * hd) * es;
  auto d_pos = upload(pos);
  auto d_slots = upload(slots);
  auto d_inv = upload(table.inv_freq);
  auto d_div = upload(table.ggml_freq_divisor.empty() ? std::vector<float>{0} : table.ggml_freq_divisor);
  auto d_qn = upload(qn), d_kn = upload(kn);
  std::vector<float> got_qkv[2];
  std::vector<uint8_t> got_k[2], got_v[2];
  for (int general = 0; general < 2; ++general) {
    auto d_qkv = upload(qkv);
    auto d_k = poisoned(cache_bytes), d_v = poisoned(cache_bytes);
    RopeKvArgs a;
    a.qkv = d_qkv.as<float>();
    a.n_tokens = n_tok;
    a.qkv_stride = stride;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = hd;
    a.positions = d_pos.as<int32_t>();
    a.slots = d_slots.as<int32_t>();
    a.q_norm = qk_norm ? d_qn.as<float>() : nullptr;
    a.k_norm = qk_norm ? d_kn.as<float>() : nullptr;
    a.norm_eps = 1e-6f;
    a.norm_offset = norm_offset;
    a.inv_freq = d_inv.as<float>();
    a.freq_divisor = table.ggml_freq_divisor.empty() ? nullptr : d_div.as<float>();
    a.rot_dim = static_cast<int32_t>(table.rot_dim);
    a.interleaved = table.interleaved;
    a.attn_factor = table.attn_factor;
    a.ggml_theta_scale = table.ggml_theta_scale;
    a.k_cache = d_k.data();
    a.v_cache = d_v.data();
    a.kv_dtype = kv;
    if (general) {
      rope_store_kv_general(a, nullptr);
    } else {
      rope_store_kv(a, nullptr);
    }
    got_qkv[general] = download<float>(d_qkv, qkv.size());
    got_k[general] = download<uint8_t>(d_k, cache_bytes);
    got_v[general] = download<uint8_t>(d_v, cache_bytes);
  }
  const std::string what = std::string("kv ") +
                           (kv == DType::kF32    ? "f32"
                            : kv == DType::kF16  ? "f16"
                            : kv == DType::kBF16 ? "bf16"
                                                 : "fp8") +
                           " hd " + std::to_string(hd) + " rot " + std::to_string(table.rot_dim) + " norm " +
                           std::to_string(qk_norm) + " pad " + std::to_string(pad);
  for (size_t i = 0; i < qkv.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got_qkv[0][i]), std::bit_cast<uint32_t>(got_qkv[1][i]))
        << what << ": qkv element " << i << " " << got_qkv[0][i] << " vs " << got_qkv[1][i];
  }
  EXPECT_EQ(got_k[0], got_k[1]) << what << ": K bytes";
  EXPECT_EQ(got_v[0], got_v[1]) << what << ": V bytes";
}

TEST(CudaOps, RopeWarpKernelMatchesTheBlockKernelBitForBit) {
  RILL_REQUIRE_GPU();
  using S = cpu::RopeScalingParams;
  S llama3;
  llama3.type = S::Type::kLlama3;
  llama3.factor = 8;
  llama3.original_max_position = 8192;
  S yarn;
  yarn.type = S::Type::kYarn;
  yarn.factor = 4;
  yarn.original_max_position = 4096;
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16, kF8E4M3}) {
    check_rope_kernels_agree(cpu::make_rope_table(500000.0f, 128, false, llama3), 128, 32, 8, false, kv);
    check_rope_kernels_agree(cpu::make_rope_table(500000.0f, 128, false, llama3), 128, 12, 3, false, kv, 0.0f, 4);
    check_rope_kernels_agree(cpu::make_rope_table(1000000.0f, 128, false), 128, 8, 2, true, kv);  // qwen3: q/k norms
    check_rope_kernels_agree(cpu::make_rope_table(10000.0f, 64, true, yarn), 64, 6, 2, false, kv, 0.0f, 1);
    check_rope_kernels_agree(cpu::make_rope_table(10000.0f, 32, false), 64, 5, 1, true, kv);        // partial + norms
    check_rope_kernels_agree(cpu::make_rope_table(10000.0f, 64, true), 256, 4, 2, true, kv, 1.0f);  // gemma: 1 + w
    check_rope_kernels_agree(cpu::make_rope_table(10000.0f, 512, false), 512, 3, 1, true, kv);
    check_rope_kernels_agree(cpu::make_rope_table(10000.0f, 128, false), 128, 9, 0, true, kv);  // q only
    cpu::RopeTable ggml = cpu::make_rope_table(10000.0f, 16, false);  // llama.cpp's angle recurrence
    ggml.ggml_theta_scale = std::pow(10000.0f, -2.0f / 16);
    check_rope_kernels_agree(ggml, 16, 4, 2, false, kv);
    ggml.ggml_freq_divisor = random_floats(8, 10, 1.0f, 8.0f);
    check_rope_kernels_agree(ggml, 16, 4, 2, true, kv, 0.0f, 3);
    check_rope_kernels_agree(cpu::make_rope_table(10000.0f, 12, false), 20, 3, 1, true, kv);  // head_dim not x4
  }
}

// cuBLASLt GEMM and the hand GEMV against cpu::matmul on the same values.
TEST(CudaOps, MatmulMatchesCpu) {
  RILL_REQUIRE_GPU();
  auto ctx = Context::create();
  ASSERT_TRUE(ctx.ok()) << ctx.error().message;
  Gemm gemm(**ctx);
  ThreadPool pool(2);
  cpu::Scratch scratch;
  struct Shape {
    int64_t n, rows, cols;
  };
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Shape s : {Shape{1, 200, 96}, Shape{3, 130, 256}, Shape{8, 64, 1000}, Shape{17, 300, 512}, Shape{64, 256, 128},
                    Shape{1, 70, 8192}, Shape{5, 70, 4096}}) {  // the last two: split-K GEMV
      const auto w = encode(t, random_floats(s.rows * s.cols, 11));
      auto x = random_floats(s.n * s.cols, 12);
      for (float& v : x) v = round_to(t, v);  // the device sees x in the weights' dtype
      cpu::WeightView wv{t, s.rows, s.cols, w.data(), row_bytes(t, s.cols)};
      scratch.reserve(cpu::matmul_scratch_bytes(t, s.cols, s.n));
      std::vector<float> want(s.n * s.rows);
      cpu::matmul(wv, x.data(), s.n, want.data(), pool, scratch);
      auto dw = upload(w);
      auto dx = upload(encode(t, x));
      auto dy = poisoned(want.size() * 4);
      ASSERT_TRUE(gemm.matmul(t, dw.data(), dx.data(), s.n, s.rows, s.cols, dy.as<float>(), false).ok());
      auto got = download<float>(dy, want.size());
      const double tol = 1e-5 * std::sqrt(double(s.cols)) * max_abs(want) + 1e-6;
      EXPECT_LT(max_abs_diff(got, want), tol) << dtype_name(t) << " n=" << s.n << " rows=" << s.rows;
      // accumulate: y += W x
      ASSERT_TRUE(gemm.matmul(t, dw.data(), dx.data(), s.n, s.rows, s.cols, dy.as<float>(), true).ok());
      got = download<float>(dy, want.size());
      for (float& v : want) v *= 2;
      EXPECT_LT(max_abs_diff(got, want), 2 * tol) << dtype_name(t) << " accumulate n=" << s.n;
    }
  }
}

TEST(CudaOps, GemvRowsDoNotDependOnTokenCount) {
  RILL_REQUIRE_GPU();
  const int64_t rows = 77, cols = 8192;  // long rows: the split-K GEMV
  for (DType t : {DType::kF16, DType::kBF16}) {
    auto dw = upload(encode(t, random_floats(rows * cols, 13)));
    auto dx = upload(encode(t, random_floats(8 * cols, 14)));
    auto y8 = poisoned(8 * rows * 4);
    gemv(t, dw.data(), dx.data(), 8, rows, cols, y8.as<float>(), false, nullptr);
    const auto all = download<float>(y8, 8 * rows);
    for (int64_t n = 1; n < 8; ++n) {
      auto yn = poisoned(n * rows * 4);
      gemv(t, dw.data(), dx.data(), n, rows, cols, yn.as<float>(), false, nullptr);
      const auto got = download<float>(yn, n * rows);
      ASSERT_TRUE(std::equal(got.begin(), got.end(), all.begin())) << dtype_name(t) << " n=" << n;
    }
  }
}

// --- The Gemma family's ops --------------------------------------------------

// GeGLU: the formula of cpu::gelu_tanh_mul; tanhf against glibc's tanh, a
// few ulp.
TEST(CudaOps, GeluTanhMulMatchesCpu) {
  RILL_REQUIRE_GPU();
  const int64_t n = 3, F = 1000;
  const auto gu = random_floats(n * 2 * F, 21, -8, 8);
  std::vector<float> want(n * F);
  for (int64_t r = 0; r < n; ++r) cpu::gelu_tanh_mul(&gu[r * 2 * F], &gu[r * 2 * F + F], &want[r * F], F);
  auto d_gu = upload(gu);
  for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto d_out = poisoned(want.size() * 4);
    gelu_tanh_mul(d_gu.as<float>(), n, F, out, d_out.data(), nullptr);
    const auto got = decode(out, download<uint8_t>(d_out, want.size() * (out == DType::kF32 ? 4 : 2)));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], (rel_tol(out) + 4e-6) * std::fabs(want[i]) + 1e-6) << dtype_name(out) << " " << i;
    }
  }
}

// The sandwich norm: x += rms_norm(y) (offset + w_post), then the next
// pre-norm of x; against cpu::rms_norm + add_inplace + rms_norm, with the
// HF offset (1) and the GGUF one (0), rows of float4s and not.
TEST(CudaOps, PostNormAddMatchesCpu) {
  RILL_REQUIRE_GPU();
  for (int64_t dim : {64, 98, 4096}) {
    for (float off : {1.0f, 0.0f}) {
      const int64_t n = 4;
      const auto y = random_floats(n * dim, 22, -3, 3);
      const auto x = random_floats(n * dim, 23, -5, 5);
      const auto w_post = random_floats(dim, 24), w_next = random_floats(dim, 25);
      std::vector<float> want_x = x, normed(y.size()), want(y.size());
      cpu::rms_norm(y.data(), w_post.data(), n, dim, 1e-6f, normed.data(), off);
      cpu::add_inplace(want_x.data(), normed.data(), n * dim);
      cpu::rms_norm(want_x.data(), w_next.data(), n, dim, 1e-6f, want.data(), off);
      auto dy = upload(y), dwp = upload(w_post), dwn = upload(w_next);
      for (DType out : {DType::kF32, DType::kBF16}) {
        auto dx = upload(x);
        auto d_out = poisoned(y.size() * 4);
        post_norm_add(dy.as<float>(), dwp.as<float>(), dx.as<float>(), dwn.as<float>(), n, dim, 1e-6f, off, out,
                      d_out.data(), nullptr);
        const auto got_x = download<float>(dx, x.size());
        const auto got = decode(out, download<uint8_t>(d_out, y.size() * (out == DType::kF32 ? 4 : 2)));
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_NEAR(got_x[i], want_x[i], 1e-5 * (std::fabs(want_x[i]) + 1)) << dim << " x " << i;
          ASSERT_NEAR(got[i], want[i], (rel_tol(out) + 2e-5) * std::fabs(want[i]) + 1e-5)
              << dim << " " << dtype_name(out) << " out " << i;
        }
      }
      auto dx = upload(x);  // no next norm: only the residual add
      post_norm_add(dy.as<float>(), dwp.as<float>(), dx.as<float>(), nullptr, n, dim, 1e-6f, off, DType::kF32, nullptr,
                    nullptr);
      EXPECT_LT(max_abs_diff(download<float>(dx, x.size()), want_x), 1e-4) << dim;
    }
  }
}

TEST(CudaOps, SoftcapAndScaleMatchCpu) {
  RILL_REQUIRE_GPU();
  const auto x = random_floats(5000, 26, -200, 200);
  auto dx = upload(x);
  softcap(dx.as<float>(), static_cast<int64_t>(x.size()), 30.0f, nullptr);
  auto got = download<float>(dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = 30.0f * std::tanh(x[i] / 30.0f);
    ASSERT_NEAR(got[i], want, 4e-6 * 30) << i;
    ASSERT_LT(std::fabs(got[i]), 30.0f + 1e-4f);
  }
  auto ds = upload(x);
  scale(ds.as<float>(), static_cast<int64_t>(x.size()), 8.0f, nullptr);
  got = download<float>(ds, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i] * 8.0f) << i;
}

}  // namespace
}  // namespace rill::cuda
