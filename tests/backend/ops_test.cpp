// RMSNorm, activations, RoPE (+ tables) and attention against direct
// formulas, and every ISA's kernels against the scalar reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/attention_f16.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/rope_table.h"
#include "quant_test_util.h"

namespace rill::cpu {
namespace {

using testing::available_isas;
using testing::random_floats;

TEST(RmsNorm, MatchesFormulaAndEveryIsa) {
  const int64_t dim = 576, n_rows = 3;
  const auto x = random_floats(dim * n_rows, 1, -3.0f, 3.0f);
  const auto w = random_floats(dim, 2);
  std::vector<float> out(x.size());
  rms_norm(x.data(), w.data(), n_rows, dim, 1e-5f, out.data());
  for (int64_t r = 0; r < n_rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double scale = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i)
      ASSERT_NEAR(out[r * dim + i], x[r * dim + i] * scale * w[i], 1e-5) << r << "," << i;
  }
  // weight_offset (Gemma's 1 + w) and no weight; out aliasing x.
  for (Isa isa : available_isas()) {
    for (const float* wp : {w.data(), static_cast<const float*>(nullptr)}) {
      std::vector<float> want(dim), got(x.begin(), x.begin() + dim);
      ref::rms_norm_row(x.data(), wp, dim, 1e-6f, 1.0f, want.data());
      kernels(isa).rms_norm_row(got.data(), wp, dim, 1e-6f, 1.0f, got.data());
      for (int64_t i = 0; i < dim; ++i)
        ASSERT_NEAR(got[i], want[i], 2e-6f * std::fabs(want[i]) + 1e-7f) << isa_name(isa);
    }
  }
}

// rms_norm() runs four rows' sums interleaved: every row must still be the
// per-row kernel's bits, for any row count and with out aliasing x.
TEST(RmsNorm, BatchedRowsEqualTheRowKernelBitForBit) {
  const int64_t dim = 576;
  for (int64_t n_rows : {1, 3, 4, 5, 8, 9, 13}) {
    const auto x = random_floats(dim * n_rows, 10 + static_cast<uint32_t>(n_rows), -4.0f, 4.0f);
    const auto w = random_floats(dim, 11);
    for (const float* wp : {w.data(), static_cast<const float*>(nullptr)}) {
      std::vector<float> got(x);
      rms_norm(got.data(), wp, n_rows, dim, 1e-5f, got.data(), 1.0f);
      for (int64_t r = 0; r < n_rows; ++r) {
        std::vector<float> want(dim);
        kernels().rms_norm_row(x.data() + r * dim, wp, dim, 1e-5f, 1.0f, want.data());
        ASSERT_EQ(0, std::memcmp(want.data(), got.data() + r * dim, dim * sizeof(float)))
            << n_rows << " rows, row " << r;
      }
    }
  }
}

TEST(Activations, MatchFormulasAndEveryIsa) {
  const int64_t n = 1000;  // not a multiple of any vector width
  const auto g = random_floats(n, 3, -12.0f, 12.0f);
  const auto u = random_floats(n, 4);
  std::vector<float> s(n), ge(n);
  ref::silu_mul(g.data(), u.data(), s.data(), n);
  ref::gelu_tanh_mul(g.data(), u.data(), ge.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double x = g[i];
    ASSERT_NEAR(s[i], x / (1.0 + std::exp(-x)) * u[i], 1e-6 * std::fabs(x) + 1e-7);
    const double gl = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    ASSERT_NEAR(ge[i], gl * u[i], 1e-6 * std::fabs(x) + 1e-7);
  }
  for (Isa isa : available_isas()) {
    const Kernels& k = kernels(isa);
    std::vector<float> got(n), y(u);
    k.silu_mul(g.data(), u.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], s[i], 4e-6f * std::fabs(s[i]) + 1e-7f) << isa_name(isa) << " silu " << i;
    k.gelu_tanh_mul(g.data(), u.data(), got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], ge[i], 4e-6f * std::fabs(ge[i]) + 1e-6f) << isa_name(isa) << " gelu " << i;
    k.add_inplace(y.data(), g.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], u[i] + g[i]);
  }
}

// Direct rotation: pair i turns by pos * inv_freq[i].
void check_rope(const RopeTable& table, int64_t head_dim) {
  const int64_t n_tokens = 3, n_heads = 2;
  const int32_t pos[n_tokens] = {0, 7, 1234};
  auto x = random_floats(n_tokens * n_heads * head_dim, 8);
  const auto orig = x;
  rope(x.data(), pos, n_tokens, n_heads, head_dim, table);
  const int64_t half = table.rot_dim / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const float* o = orig.data() + (t * n_heads + h) * head_dim;
      const float* r = x.data() + (t * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = table.interleaved ? 2 * i : i, b = table.interleaved ? 2 * i + 1 : i + half;
        const double th = static_cast<double>(static_cast<float>(pos[t]) * table.inv_freq[i]);
        const double c = std::cos(th) * table.attn_factor, s = std::sin(th) * table.attn_factor;
        ASSERT_NEAR(r[a], o[a] * c - o[b] * s, 1e-5);
        ASSERT_NEAR(r[b], o[a] * s + o[b] * c, 1e-5);
      }
      for (int64_t d = table.rot_dim; d < head_dim; ++d) ASSERT_EQ(r[d], o[d]);  // partial rotary
    }
  }
}

TEST(Rope, BothLayoutsAndPartialRotary) {
  check_rope(make_rope_table(10000.0f, 64, false), 64);
  check_rope(make_rope_table(10000.0f, 64, true), 64);
  check_rope(make_rope_table(500000.0f, 32, false), 64);
  check_rope(make_rope_table(500000.0f, 32, true), 64);
  // Position 0 is the identity; the default table is base^(-2i/d).
  const RopeTable t = make_rope_table(10000.0f, 64, false);
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(t.inv_freq[i], static_cast<float>(std::pow(10000.0, -2.0 * i / 64)));
}

TEST(RopeTable, LinearAndLlama3) {
  RopeScalingParams lin;
  lin.type = RopeScalingParams::Type::kLinear;
  lin.factor = 4.0f;
  const RopeTable base = make_rope_table(10000.0f, 64, false);
  const RopeTable l = make_rope_table(10000.0f, 64, false, lin);
  for (int i = 0; i < 32; ++i) EXPECT_FLOAT_EQ(l.inv_freq[i], base.inv_freq[i] / 4.0f);

  // Llama 3.1: theta 500000, head_dim 128, factor 8, low 1, high 4, original 8192.
  RopeScalingParams s;
  s.type = RopeScalingParams::Type::kLlama3;
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position = 8192;
  const RopeTable b3 = make_rope_table(500000.0f, 128, false);
  const RopeTable t3 = make_rope_table(500000.0f, 128, false, s);
  int n_high = 0, n_low = 0, n_mid = 0;
  for (int i = 0; i < 64; ++i) {
    const double inv = b3.inv_freq[i];
    const double wavelen = 2 * std::numbers::pi / inv;
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_FLOAT_EQ(t3.inv_freq[i], b3.inv_freq[i]);
      ++n_high;
    } else if (wavelen > 8192.0 / 1.0) {
      EXPECT_FLOAT_EQ(t3.inv_freq[i], b3.inv_freq[i] / 8.0f);
      ++n_low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(t3.inv_freq[i], (1 - smooth) * inv / 8 + smooth * inv, 1e-6 * inv);
      ++n_mid;
    }
  }
  EXPECT_GT(n_high, 0);
  EXPECT_GT(n_low, 0);
  EXPECT_GT(n_mid, 0);
  check_rope(t3, 128);
}

TEST(RopeTable, Yarn) {
  // Qwen-style yarn: factor 4, original 32768, beta_fast 32, beta_slow 1, head_dim 128, theta 1e6.
  RopeScalingParams s;
  s.type = RopeScalingParams::Type::kYarn;
  s.factor = 4.0f;
  s.original_max_position = 32768;
  const RopeTable b = make_rope_table(1e6f, 128, false);
  const RopeTable t = make_rope_table(1e6f, 128, false, s);
  EXPECT_FLOAT_EQ(t.attn_factor, static_cast<float>(0.1 * std::log(4.0) + 1.0));
  // correction range: dims with more than beta_fast rotations over the
  // original context keep their frequency; fewer than beta_slow are interpolated.
  auto corr = [](double rot) { return 128 * std::log(32768 / (rot * 2 * std::numbers::pi)) / (2 * std::log(1e6)); };
  const double low = std::max(0.0, std::floor(corr(32))), high = std::min(127.0, std::ceil(corr(1)));
  for (int i = 0; i < 64; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = b.inv_freq[i] * (1 - ramp) + b.inv_freq[i] / 4.0 * ramp;
    EXPECT_NEAR(t.inv_freq[i], want, 1e-6 * want) << i;
  }
  EXPECT_FLOAT_EQ(t.inv_freq[0], b.inv_freq[0]);
  EXPECT_FLOAT_EQ(t.inv_freq[63], b.inv_freq[63] / 4.0f);
  s.attention_factor = 1.5f;
  EXPECT_EQ(make_rope_table(1e6f, 128, false, s).attn_factor, 1.5f);
  check_rope(t, 128);
}

// Naive attention in f64 with a full score matrix.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<int32_t>& pos,
                                    const std::vector<float>& k, const std::vector<float>& v, int64_t n_kv,
                                    const AttentionParams& p) {
  const int64_t n_q = static_cast<int64_t>(pos.size());
  std::vector<double> out(static_cast<size_t>(n_q * p.n_head * p.head_dim), 0.0);
  for (int64_t i = 0; i < n_q; ++i) {
    for (int64_t h = 0; h < p.n_head; ++h) {
      const int64_t kvh = h / (p.n_head / p.n_head_kv);
      std::vector<double> sc(static_cast<size_t>(n_kv), -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n_kv; ++j) {
        if (j > pos[i] || (p.window > 0 && j <= pos[i] - p.window)) continue;
        double s = 0.0;
        for (int64_t d = 0; d < p.head_dim; ++d)
          s +=
              static_cast<double>(q[(i * p.n_head + h) * p.head_dim + d]) * k[(j * p.n_head_kv + kvh) * p.head_dim + d];
        s *= p.scale;
        if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
        sc[j] = s;
        mx = std::max(mx, s);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < n_kv; ++j) sum += std::isinf(sc[j]) ? 0.0 : std::exp(sc[j] - mx);
      for (int64_t j = 0; j < n_kv; ++j) {
        if (std::isinf(sc[j])) continue;
        const double pr = std::exp(sc[j] - mx) / sum;
        for (int64_t d = 0; d < p.head_dim; ++d)
          out[(i * p.n_head + h) * p.head_dim + d] += pr * v[(j * p.n_head_kv + kvh) * p.head_dim + d];
      }
    }
  }
  return out;
}

struct AttnCase {
  int64_t n_head, n_head_kv, head_dim, n_kv, n_q, window;
  float softcap;
  DType kv;
};

TEST(Attention, MatchesNaive) {
  const AttnCase cases[] = {
      {9, 3, 64, 150, 150, 0, 0.0f, DType::kF32},  // prefill, GQA (SmolLM2 heads)
      {9, 3, 64, 150, 1, 0, 0.0f, DType::kF32},    // decode
      {4, 4, 32, 100, 20, 16, 0.0f, DType::kF32},  // sliding window
      {8, 2, 128, 90, 10, 0, 50.0f, DType::kF16},  // softcap, f16 kv
      {8, 1, 80, 70, 70, 24, 30.0f, DType::kF16},  // MQA, window, softcap, odd head_dim
  };
  for (const AttnCase& c : cases) {
    AttentionParams p;
    p.n_head = c.n_head;
    p.n_head_kv = c.n_head_kv;
    p.head_dim = c.head_dim;
    p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    p.window = c.window;
    p.softcap = c.softcap;
    p.kv_dtype = c.kv;
    auto q = random_floats(c.n_q * c.n_head * c.head_dim, 31, -2.0f, 2.0f);
    auto k = random_floats(c.n_kv * c.n_head_kv * c.head_dim, 32, -2.0f, 2.0f);
    auto v = random_floats(c.n_kv * c.n_head_kv * c.head_dim, 33);
    std::vector<uint16_t> k16(k.size()), v16(v.size());
    if (c.kv == DType::kF16) {  // the reference sees the f16-rounded values
      for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_f16(k[i]), k[i] = f16_to_f32(k16[i]);
      for (size_t i = 0; i < v.size(); ++i) v16[i] = f32_to_f16(v[i]), v[i] = f16_to_f32(v16[i]);
    }
    std::vector<int32_t> pos(static_cast<size_t>(c.n_q));
    for (int64_t i = 0; i < c.n_q; ++i) pos[i] = static_cast<int32_t>(c.n_kv - c.n_q + i);
    const auto want = naive_attention(q, pos, k, v, c.n_kv, p);
    const void* kp = c.kv == DType::kF16 ? static_cast<const void*>(k16.data()) : k.data();
    const void* vp = c.kv == DType::kF16 ? static_cast<const void*>(v16.data()) : v.data();
    const PagedKv kv = make_contiguous_kv(kp, vp, row_bytes(c.kv, c.n_head_kv * c.head_dim));
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      std::vector<float> out(want.size(), -9.0f);
      attention(q.data(), pos.data(), c.n_q, kv, c.n_kv, p, out.data(), pool);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(out[i], want[i], 2e-5) << "case heads " << c.n_head << "/" << c.n_head_kv << " i " << i;
    }
    // Every ISA's attention row against the scalar one.
    for (Isa isa : available_isas()) {
      for (int64_t i = 0; i < c.n_q; i += std::max<int64_t>(1, c.n_q / 7)) {
        AttendRowArgs a;
        a.q = q.data() + i * c.n_head * c.head_dim;
        a.kv = kv;
        a.head_dim = c.head_dim;
        a.j_begin = c.window > 0 ? std::max<int64_t>(0, pos[i] - c.window + 1) : 0;
        a.j_end = pos[i] + 1;
        a.scale = p.scale;
        a.softcap = p.softcap;
        a.kv_f16 = c.kv == DType::kF16;
        std::vector<float> want_row(c.head_dim), got_row(c.head_dim);
        a.out = want_row.data();
        ref::attend_row(a);
        a.out = got_row.data();
        kernels(isa).attend_row(a);
        for (int64_t d = 0; d < c.head_dim; ++d) ASSERT_NEAR(got_row[d], want_row[d], 1e-5) << isa_name(isa);
      }
    }
  }
}

// llama.cpp-rounded attention (q and probabilities rounded to f16) against a
// naive f64 version with the same roundings, prefill and single-query forms.
TEST(Attention, F16RoundedMatchesNaive) {
  for (int64_t n_q : {1, 2, 37}) {
    AttentionParams p;
    p.n_head = 9;
    p.n_head_kv = 3;
    p.head_dim = 64;
    p.scale = 0.125f;
    p.kv_dtype = DType::kF16;
    p.window = n_q == 37 ? 20 : 0;
    const int64_t n_kv = 60;
    auto q = random_floats(n_q * 9 * 64, 51, -2.0f, 2.0f);
    auto k = random_floats(n_kv * 3 * 64, 52, -2.0f, 2.0f);
    auto v = random_floats(n_kv * 3 * 64, 53);
    std::vector<uint16_t> k16(k.size()), v16(v.size());
    for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_f16(k[i]), k[i] = f16_to_f32(k16[i]);
    for (size_t i = 0; i < v.size(); ++i) v16[i] = f32_to_f16(v[i]), v[i] = f16_to_f32(v16[i]);
    std::vector<int32_t> pos(n_q);
    for (int64_t i = 0; i < n_q; ++i) pos[i] = static_cast<int32_t>(n_kv - n_q + i);
    ThreadPool pool(2);
    std::vector<float> out(q.size());
    const PagedKv kv = make_contiguous_kv(k16.data(), v16.data(), 3 * 64 * sizeof(uint16_t));
    attention_f16_rounded(q.data(), pos.data(), n_q, kv, n_kv, p, out.data(), pool);
    for (int64_t i = 0; i < n_q; ++i) {
      for (int64_t h = 0; h < 9; ++h) {
        const float* qr = q.data() + (i * 9 + h) * 64;
        std::vector<double> s;
        const int64_t j0 = p.window > 0 ? std::max<int64_t>(0, pos[i] - p.window + 1) : 0;
        double mx = -INFINITY;
        for (int64_t j = j0; j <= pos[i]; ++j) {
          double d = 0.0;
          for (int64_t c = 0; c < 64; ++c)
            d += static_cast<double>(f16_to_f32(f32_to_f16(qr[c]))) * k[(j * 3 + h / 3) * 64 + c];
          s.push_back(d * p.scale);
          mx = std::max(mx, s.back());
        }
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < 64; ++c) {
          double o = 0.0;
          for (size_t t = 0; t < s.size(); ++t)
            o += static_cast<double>(f16_to_f32(f32_to_f16(static_cast<float>(s[t] / sum)))) *
                 v[((j0 + t) * 3 + h / 3) * 64 + c];
          ASSERT_NEAR(out[(i * 9 + h) * 64 + c], o, 2e-5) << "n_q " << n_q << " query " << i << " head " << h;
        }
      }
    }
  }
}

// The rows of a contiguous K/V region ([n_kv, row_bytes] each) scattered
// over a pool of blocks in shuffled physical order, blocks `pad` bytes
// apart beyond their rows, with the table entries of the first n_dead
// logical blocks -1 (those rows are not copied). Unused pool bytes are
// 0xFF (NaN in f32 and f16), so any read of a wrong row shows.
struct ScatteredKv {
  std::vector<uint8_t> k_pool, v_pool;
  std::vector<int32_t> table;
  PagedKv kv;
};

ScatteredKv scatter_kv(const void* k, const void* v, size_t row_b, int64_t n_kv, int32_t shift, int64_t n_dead,
                       size_t pad, uint32_t seed) {
  const int64_t bs = int64_t{1} << shift;
  const int64_t n_blocks = (n_kv + bs - 1) / bs;
  const int64_t n_phys = n_blocks + 3;  // spare blocks never referenced
  ScatteredKv out;
  out.kv.block_shift = shift;
  out.kv.row_bytes = row_b;
  out.kv.block_bytes = static_cast<size_t>(bs) * row_b + pad;
  out.k_pool.assign(static_cast<size_t>(n_phys) * out.kv.block_bytes, 0xFF);
  out.v_pool.assign(out.k_pool.size(), 0xFF);
  std::vector<int32_t> perm(static_cast<size_t>(n_phys));
  for (int64_t i = 0; i < n_phys; ++i) perm[i] = static_cast<int32_t>(i);
  std::mt19937 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  out.table.resize(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) {
    out.table[b] = b < n_dead ? -1 : perm[b];
    if (b < n_dead) continue;
    for (int64_t r = 0; r < bs && b * bs + r < n_kv; ++r) {
      const size_t dst = static_cast<size_t>(perm[b]) * out.kv.block_bytes + static_cast<size_t>(r) * row_b;
      const size_t src = static_cast<size_t>(b * bs + r) * row_b;
      std::memcpy(out.k_pool.data() + dst, static_cast<const uint8_t*>(k) + src, row_b);
      std::memcpy(out.v_pool.data() + dst, static_cast<const uint8_t*>(v) + src, row_b);
    }
  }
  out.kv.k = out.k_pool.data();
  out.kv.v = out.v_pool.data();
  out.kv.table = out.table.data();
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct PagedCase {
  int64_t n_head, n_head_kv, head_dim, n_kv, n_q, window;
  float softcap;
  int32_t shift;  // block_size = 1 << shift
  size_t pad;     // bytes between blocks beyond their rows
};

// Attention over K/V rows scattered across blocks must give the same bits as
// over the same rows stored contiguously: the drivers (default ISA) and each
// ISA's inner kernel, f32 and f16 KV, both f16 attentions.
TEST(Attention, PagedBitIdenticalToContiguous) {
  const PagedCase cases[] = {
      {9, 3, 64, 150, 1, 0, 0.0f, 4, 0},     // SmolLM2 decode
      {9, 3, 64, 150, 150, 0, 0.0f, 4, 0},   // prefill
      {8, 2, 128, 77, 5, 20, 30.0f, 3, 64},  // window + softcap, block 8, padded pool
      {4, 4, 32, 100, 20, 16, 0.0f, 5, 0},   // window, block 32
      {8, 1, 80, 70, 70, 24, 30.0f, 4, 0},   // MQA, head_dim 80 (no exact avx512 path)
      {6, 2, 256, 45, 1, 0, 50.0f, 2, 0},    // head_dim 256 decode, block 4
      {4, 2, 64, 200, 1, 40, 0.0f, 4, 32},   // decode with window: dead blocks
      {4, 2, 64, 200, 3, 33, 0.0f, 6, 0},    // window, block 64
  };
  ThreadPool pool(2);
  for (const PagedCase& c : cases) {
    for (DType dt : {DType::kF32, DType::kF16}) {
      SCOPED_TRACE(::testing::Message() << "heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.head_dim
                                        << " n_kv " << c.n_kv << " n_q " << c.n_q << " window " << c.window << " block "
                                        << (1 << c.shift) << " " << dtype_info(dt).name);
      AttentionParams p;
      p.n_head = c.n_head;
      p.n_head_kv = c.n_head_kv;
      p.head_dim = c.head_dim;
      p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      p.window = c.window;
      p.softcap = c.softcap;
      p.kv_dtype = dt;
      const int64_t width = c.n_head_kv * c.head_dim;
      const size_t row_b = row_bytes(dt, width);
      const auto q = random_floats(c.n_q * c.n_head * c.head_dim, 61, -2.0f, 2.0f);
      auto k = random_floats(c.n_kv * width, 62, -2.0f, 2.0f);
      auto v = random_floats(c.n_kv * width, 63);
      std::vector<uint16_t> k16(k.size()), v16(v.size());
      for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_f16(k[i]), v16[i] = f32_to_f16(v[i]);
      const void* kp = dt == DType::kF16 ? static_cast<const void*>(k16.data()) : k.data();
      const void* vp = dt == DType::kF16 ? static_cast<const void*>(v16.data()) : v.data();
      std::vector<int32_t> pos(static_cast<size_t>(c.n_q));
      for (int64_t i = 0; i < c.n_q; ++i) pos[i] = static_cast<int32_t>(c.n_kv - c.n_q + i);
      // Blocks wholly before the earliest query's window are never read.
      const int64_t j_min = c.window > 0 ? std::max<int64_t>(0, pos[0] - c.window + 1) : 0;
      const int64_t n_dead = j_min >> c.shift;
      if (c.window == 40) {
        ASSERT_GT(n_dead, 0);
      }
      const PagedKv contiguous = make_contiguous_kv(kp, vp, row_b);
      const ScatteredKv paged = scatter_kv(kp, vp, row_b, c.n_kv, c.shift, n_dead, c.pad, 70 + c.shift);

      using AttnFn = void (*)(const float*, const int32_t*, int64_t, const PagedKv&, int64_t, const AttentionParams&,
                              float*, ThreadPool&);
      std::vector<AttnFn> fns = {attention};
      if (dt == DType::kF16) fns.push_back(attention_f16_rounded);
      for (AttnFn fn : fns) {
        std::vector<float> want(q.size(), -7.0f), got(q.size(), -9.0f);
        fn(q.data(), pos.data(), c.n_q, contiguous, c.n_kv, p, want.data(), pool);
        fn(q.data(), pos.data(), c.n_q, paged.kv, c.n_kv, p, got.data(), pool);
        for (float x : want) ASSERT_TRUE(std::isfinite(x));
        ASSERT_TRUE(same_bits(want, got)) << (fn == attention ? "attention" : "attention_f16_rounded");
      }

      // Each ISA's inner kernels on a sample of (query, head) pairs.
      const int64_t group = c.n_head / c.n_head_kv;
      std::vector<float> scores(static_cast<size_t>(c.n_kv));
      std::vector<uint16_t> probs16(static_cast<size_t>(c.n_kv)), q16(static_cast<size_t>(c.head_dim));
      for (int64_t i = 0; i < c.n_q; i += std::max<int64_t>(1, c.n_q / 5)) {
        for (int64_t h = 0; h < c.n_head; h += std::max<int64_t>(1, c.n_head / 3)) {
          const size_t head_off = static_cast<size_t>((h / group) * c.head_dim) * (dt == DType::kF16 ? 2 : 4);
          auto at_head = [&](PagedKv kv) {
            kv.k += head_off;
            kv.v += head_off;
            return kv;
          };
          const int64_t j_begin = c.window > 0 ? std::max<int64_t>(0, pos[i] - c.window + 1) : 0;
          const int64_t j_end = std::min<int64_t>(pos[i] + 1, c.n_kv);
          const float* qr = q.data() + (i * c.n_head + h) * c.head_dim;
          for (Isa isa : available_isas()) {
            AttendRowArgs a;
            a.q = qr;
            a.head_dim = c.head_dim;
            a.j_begin = j_begin;
            a.j_end = j_end;
            a.scale = p.scale;
            a.softcap = p.softcap;
            a.kv_f16 = dt == DType::kF16;
            std::vector<float> want(c.head_dim, -7.0f), got(c.head_dim, -9.0f);
            a.kv = at_head(contiguous);
            a.out = want.data();
            kernels(isa).attend_row(a);
            a.kv = at_head(paged.kv);
            a.out = got.data();
            kernels(isa).attend_row(a);
            ASSERT_TRUE(same_bits(want, got)) << "attend_row " << isa_name(isa) << " query " << i << " head " << h;
          }
          if (dt != DType::kF16) continue;
          for (int64_t d = 0; d < c.head_dim; ++d) q16[d] = f32_to_f16(qr[d]);
          std::vector<std::pair<const char*, void (*)(const detail::F16AttendArgs&)>> f16_kernels = {
              {"scalar", detail::attend_f16_rounded_scalar}};
          if (cpu_features().avx2) f16_kernels.push_back({"avx2", detail::attend_f16_rounded_avx2});
          if (cpu_features().avx512 && detail::attend_f16_exact_supported(c.head_dim))
            f16_kernels.push_back({"avx512", detail::attend_f16_rounded_avx512});
          for (const auto& [name, fn] : f16_kernels) {
            detail::F16AttendArgs a;
            a.q16 = q16.data();
            a.head_dim = c.head_dim;
            a.j_begin = j_begin;
            a.j_end = j_end;
            a.scale = p.scale;
            a.softcap = p.softcap;
            a.scores = scores.data();
            a.probs16 = probs16.data();
            a.single_query = c.n_q == 1;
            std::vector<float> want(c.head_dim, -7.0f), got(c.head_dim, -9.0f);
            a.kv = at_head(contiguous);
            a.out = want.data();
            fn(a);
            a.kv = at_head(paged.kv);
            a.out = got.data();
            fn(a);
            ASSERT_TRUE(same_bits(want, got)) << "f16 rounded " << name << " query " << i << " head " << h;
          }
        }
      }
    }
  }
}

TEST(Attention, QueryWithNoVisibleKeyGetsZeros) {
  AttentionParams p{1, 1, 8, 1.0f, 0, 0.0f, DType::kF32};
  std::vector<float> q(8, 1.0f), k(8, 1.0f), v(8, 1.0f), out(8, -1.0f);
  const int32_t pos = 0;
  ThreadPool pool(1);
  attention(q.data(), &pos, 1, make_contiguous_kv(k.data(), v.data(), 8 * sizeof(float)), /*n_kv=*/0, p, out.data(),
            pool);
  for (float o : out) EXPECT_EQ(o, 0.0f);
}

}  // namespace
}  // namespace rill::cpu

namespace rill::cpu {
namespace {

// attention_f16_rounded_batch over several sequences (decode and prefill
// rows, different lengths) equals one call per sequence, bit for bit.
TEST(Attention, F16BatchEqualsSeparateCalls) {
  AttentionParams p;
  p.n_head = 9;
  p.n_head_kv = 3;
  p.head_dim = 64;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;
  const int64_t width = p.n_head_kv * p.head_dim;
  struct Seq {
    int64_t n_q, n_kv;
  };
  const Seq shapes[] = {{1, 37}, {5, 80}, {1, 1}, {16, 16}, {1, 150}};
  ThreadPool pool(2);
  std::vector<std::vector<float>> qs, outs_batch, outs_alone;
  std::vector<std::vector<uint16_t>> ks, vs;
  std::vector<std::vector<int32_t>> poss;
  std::vector<AttentionSeq> seqs;
  uint32_t seed = 100;
  for (const Seq& sh : shapes) {
    qs.push_back(random_floats(sh.n_q * p.n_head * p.head_dim, seed++, -2.0f, 2.0f));
    const auto kf = random_floats(sh.n_kv * width, seed++, -2.0f, 2.0f);
    const auto vf = random_floats(sh.n_kv * width, seed++);
    ks.emplace_back(kf.size());
    vs.emplace_back(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) ks.back()[i] = f32_to_f16(kf[i]);
    for (size_t i = 0; i < vf.size(); ++i) vs.back()[i] = f32_to_f16(vf[i]);
    poss.emplace_back();
    for (int64_t i = 0; i < sh.n_q; ++i) poss.back().push_back(static_cast<int32_t>(sh.n_kv - sh.n_q + i));
    outs_batch.emplace_back(qs.back().size(), 0.0f);
    outs_alone.emplace_back(qs.back().size(), 0.0f);
  }
  for (size_t s = 0; s < qs.size(); ++s) {
    const PagedKv kv = make_contiguous_kv(ks[s].data(), vs[s].data(), static_cast<size_t>(width) * 2);
    seqs.push_back({qs[s].data(), poss[s].data(), shapes[s].n_q, kv, shapes[s].n_kv, outs_batch[s].data()});
    attention_f16_rounded(qs[s].data(), poss[s].data(), shapes[s].n_q, kv, shapes[s].n_kv, p, outs_alone[s].data(),
                          pool);
  }
  attention_f16_rounded_batch(seqs.data(), static_cast<int>(seqs.size()), p, pool);
  for (size_t s = 0; s < qs.size(); ++s) {
    ASSERT_EQ(0, std::memcmp(outs_batch[s].data(), outs_alone[s].data(), outs_alone[s].size() * sizeof(float)))
        << "sequence " << s;
  }
}

}  // namespace
}  // namespace rill::cpu
