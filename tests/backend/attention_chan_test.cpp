// Attention over k4c and k4a KV (attention_chan.h): K per channel over
// blocks of 32 tokens (q4c, or q4a: each channel at its own width, bit
// planes), V rotated iq4_nlh64 rows, each query's own block's keys
// and values in q8_0 from the tail and the step's rows. Held to its
// contract (double-precision attention over exactly the keys and values it
// reads: quantized groups dequantized, the own block's q8_0 rows) within f32 rounding, to exact f32
// attention within the stated 4-bit error, and bit-identical however the
// queries are split into steps and batched with other sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "core/e4m3.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace rill::cpu {
namespace {

constexpr int64_t kT = kKvChanTokens;

// One sequence of n tokens of n_kv_heads heads of hd: K like a model's
// after RoPE (most channels N(0,1), one channel per head offset by +6 with
// spread 3; with spread_channels, channel c also scaled by 2^(c % 8 - 4),
// as real models' K channels differ by orders of magnitude), V N(0,1),
// stored in paged blocks (a shuffled block table).
struct Seq {
  int64_t n = 0, hd = 64, n_kv_heads = 2, width = 128;
  std::vector<float> k, v;              // [n, width] f32
  std::vector<uint8_t> k_tail, v_tail;  // [n] q8_0 tail rows (kKvChanTailType), V rotated
  size_t tail_row = 0;                  // bytes of one
  std::vector<int32_t> table;           // [ceil(n / 32)]
  std::vector<uint8_t> kb, vb;          // K / V of every block, block_bytes apart
  size_t block_bytes = 0, k_row = 0, v_row = 0;
  const uint8_t* widths = nullptr;  // q4a's [width]; null: q4c

  Seq(int64_t n_tokens, uint32_t seed, const uint8_t* k_widths = nullptr, bool spread_channels = false)
      : n(n_tokens), widths(k_widths) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(n * width));
    v.resize(k.size());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < width; ++c) {
        const bool outlier = c % hd == 5;
        const size_t i = static_cast<size_t>(t * width + c);
        k[i] = outlier ? 6.0f + 3.0f * nd(rng) : nd(rng);
        if (spread_channels) k[i] *= std::ldexp(1.0f, static_cast<int>(c % 8) - 4);
        v[i] = nd(rng);
      }
    }
    tail_row = row_bytes(kKvChanTailType, width);
    k_tail.resize(static_cast<size_t>(n) * tail_row);
    v_tail.resize(k_tail.size());
    for (int64_t t = 0; t < n; ++t) {
      const size_t at = static_cast<size_t>(t) * tail_row;
      store_chan_tail_rows(k.data() + t * width, v.data() + t * width, true, n_kv_heads, hd, k_tail.data() + at,
                           v_tail.data() + at);
    }
    const int64_t n_blocks = (n + kT - 1) / kT;
    table.resize(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    k_row = row_bytes(kKvQ4Chan, width);
    v_row = row_bytes(kKvIq4Nl64, width);
    block_bytes = std::max(k_row, v_row) * kT;
    kb.assign(static_cast<size_t>(n_blocks) * block_bytes, 0);
    vb.assign(kb.size(), 0);
    // Every complete block's K group, encoded from the q8_0 tail rows (as
    // the backend encodes them); V rows as stored.
    std::vector<float> rows(static_cast<size_t>(kT * width));
    for (int64_t b = 0; b + 1 <= n / kT; ++b) {
      for (int64_t r = 0; r < kT; ++r)
        decode_q8(k_tail.data() + static_cast<size_t>(b * kT + r) * tail_row, width, rows.data() + r * width);
      uint8_t* dst = kb.data() + static_cast<size_t>(table[static_cast<size_t>(b)]) * block_bytes;
      if (widths) {
        quantize_alloc_block(rows.data(), width, width, widths, dst);
      } else {
        quantize_chan_block(rows.data(), width, width, dst);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      store_kv_row(kKvIq4Nl64, true, v.data() + t * width, v_row_ptr(t), n_kv_heads, hd);
    }
  }
  uint8_t* v_row_ptr(int64_t t) {
    return vb.data() + static_cast<size_t>(table[static_cast<size_t>(t / kT)]) * block_bytes +
           static_cast<size_t>(t % kT) * v_row;
  }
  PagedKv kv() const {
    PagedKv p;
    p.k = kb.data();
    p.v = vb.data();
    p.table = table.data();
    p.block_shift = 5;
    p.block_bytes = block_bytes;
    p.row_bytes = k_row;
    p.v_row_bytes = v_row;
    return p;
  }
  // A q8_0 row's n values (f16 d times int8), in f32.
  static void decode_q8(const uint8_t* row, int64_t n, float* out) {
    for (int64_t b = 0; b < n / 32; ++b) {
      const uint8_t* blk = row + b * 34;
      const float d = f16_to_f32(static_cast<uint16_t>(blk[0] | blk[1] << 8));
      for (int j = 0; j < 32; ++j) out[b * 32 + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
    }
  }
  // x = H rot / sqrt(hd) in double, H[i][j] = (-1)^popcount(i & j).
  static void rotate_back(const std::vector<double>& rot, int64_t hd, double* x) {
    for (int64_t i = 0; i < hd; ++i) {
      double s = 0;
      for (int64_t j = 0; j < hd; ++j)
        s += (__builtin_popcountll(i & j) & 1 ? -1.0 : 1.0) * rot[static_cast<size_t>(j)];
      x[i] = s / std::sqrt(static_cast<double>(hd));
    }
  }
  // The keys and values attention is specified to read for a query at
  // position p (double): the pool's before p's block (K's quantized groups,
  // V's iq4_nlh64 rows), the q8_0 tail rows from p's block on.
  void reference_kv(int64_t p, std::vector<double>& keys, std::vector<double>& vals) const {
    keys.assign(static_cast<size_t>(n * width), 0);
    vals.assign(keys.size(), 0);
    std::vector<float> deq(static_cast<size_t>(kT * width));
    const int64_t own = p - p % kT;
    for (int64_t b = 0; b * kT < own; ++b) {
      const uint8_t* src = kb.data() + static_cast<size_t>(table[static_cast<size_t>(b)]) * block_bytes;
      if (widths) {
        dequantize_alloc_block(src, width, widths, deq.data());
      } else {
        dequantize_chan_block(src, width, deq.data());
      }
      for (size_t i = 0; i < deq.size(); ++i) keys[static_cast<size_t>(b * kT * width) + i] = deq[i];
    }
    std::vector<float> row(static_cast<size_t>(width));
    for (int64_t t = own; t <= p; ++t) {
      decode_q8(k_tail.data() + static_cast<size_t>(t) * tail_row, width, row.data());
      for (int64_t c = 0; c < width; ++c) keys[static_cast<size_t>(t * width + c)] = row[static_cast<size_t>(c)];
    }
    // V: the stored rotated blocks (q8_0 tail rows in p's block), decoded
    // and rotated back in double.
    const int64_t n_vblk = hd / 64;
    for (int64_t t = 0; t <= p; ++t) {
      const uint8_t* r = const_cast<Seq*>(this)->v_row_ptr(t);
      if (t >= own) decode_q8(v_tail.data() + static_cast<size_t>(t) * tail_row, width, row.data());
      for (int64_t h = 0; h < n_kv_heads; ++h) {
        std::vector<double> rot(static_cast<size_t>(hd));
        for (int64_t blk = 0; blk < n_vblk && t < own; ++blk) {
          const uint8_t* b = r + (h * n_vblk + blk) * 33;
          const double d = e4m3_value(b[0]) / 16.0;
          for (int j = 0; j < 32; ++j) {
            rot[static_cast<size_t>(blk * 64 + j)] = d * kIq4nlLevels[b[1 + j] & 15];
            rot[static_cast<size_t>(blk * 64 + j + 32)] = d * kIq4nlLevels[b[1 + j] >> 4];
          }
        }
        for (int64_t i = 0; i < hd && t >= own; ++i) rot[static_cast<size_t>(i)] = row[static_cast<size_t>(h * hd + i)];
        rotate_back(rot, hd, vals.data() + t * width + h * hd);
      }
    }
  }
  static constexpr double kIq4nlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
};

constexpr int kGroup = 3;  // query heads per KV head
constexpr int64_t kHeads = 2 * kGroup;

AttentionParams params(int64_t window = 0) {
  AttentionParams p;
  p.n_head = kHeads;
  p.n_head_kv = 2;
  p.head_dim = 64;
  p.scale = 0.125f;
  p.window = window;
  return p;
}

std::vector<float> queries(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(n * kHeads * 64));
  for (float& x : q) x = nd(rng);
  return q;
}

// Queries at positions [c0, c1) of `s` in one call: the tail holds rows
// [c0 - c0 % 32, c0) and the step rows [c0, c1), as the backend keeps them.
struct Step {
  AttentionSeq a;
  ChanTail t;
  std::vector<int32_t> pos;
  std::vector<uint8_t> tail_k, tail_v;
  std::vector<float> out;
};
void prepare(Step& st, const Seq& s, const std::vector<float>& q, int64_t c0, int64_t c1) {
  const int64_t qw = kHeads * 64;
  st.pos.resize(static_cast<size_t>(c1 - c0));
  std::iota(st.pos.begin(), st.pos.end(), static_cast<int32_t>(c0));
  const int64_t g0 = c0 - c0 % kT;
  const auto rb = static_cast<int64_t>(s.tail_row);
  st.tail_k.assign(static_cast<size_t>(kT * rb), 0xFF);  // NaN scales where no row is held
  st.tail_v.assign(st.tail_k.size(), 0xFF);
  std::copy(s.k_tail.begin() + g0 * rb, s.k_tail.begin() + c0 * rb, st.tail_k.begin());
  std::copy(s.v_tail.begin() + g0 * rb, s.v_tail.begin() + c0 * rb, st.tail_v.begin());
  st.out.assign(static_cast<size_t>((c1 - c0) * qw), NAN);
  st.a.q = q.data() + c0 * qw;
  st.a.q_pos = st.pos.data();
  st.a.n_q = c1 - c0;
  st.a.kv = s.kv();
  st.a.n_kv = c1;
  st.a.out = st.out.data();
  st.t.tail_k = st.tail_k.data();
  st.t.tail_v = st.tail_v.data();
  st.t.step_k = s.k_tail.data() + c0 * rb;
  st.t.step_v = s.v_tail.data() + c0 * rb;
  st.t.c0 = c0;
}

const KvSideTypes kK4c{kKvQ4Chan, kKvIq4Nl64, false, true};
const KvSideTypes kK4a{kKvQ4Alloc, kKvIq4Nl64, false, true};

// q4a widths for the test rows (2 heads of 64): allocate_channel_bits over
// ranges 4^(c % 9), so channel c gets about c % 9 bits (each width
// present, checked below), summing to 4 per channel.
const std::vector<uint8_t>& test_widths() {
  static const std::vector<uint8_t> w = [] {
    std::vector<double> q(128, 1.0), r(128);
    for (int c = 0; c < 128; ++c) r[static_cast<size_t>(c)] = std::ldexp(1.0, 2 * (c % 9));
    std::vector<uint8_t> out(128);
    allocate_channel_bits(q.data(), r.data(), 128, 64, RopePairs::kNeox, out.data());
    return out;
  }();
  return w;
}

// Each test runs on k4c (false) and on k4a with test_widths() (true).
class AttentionChan : public ::testing::TestWithParam<bool> {
 protected:
  const uint8_t* widths() const { return GetParam() ? test_widths().data() : nullptr; }
  const KvSideTypes& types() const { return GetParam() ? kK4a : kK4c; }
  void attend(const AttentionSeq* seqs, const ChanTail* tails, int n, const AttentionParams& p,
              ThreadPool& pool) const {
    attention_chan_batch(seqs, tails, n, p, types(), pool, widths());
  }
};
INSTANTIATE_TEST_SUITE_P(K, AttentionChan, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "q4a" : "q4c"; });

TEST(AttentionChanWidths, TestWidthsSpanEveryWidth) {
  const std::vector<uint8_t>& w = test_widths();
  int sum = 0, seen = 0;
  for (uint8_t b : w) sum += b, seen |= 1 << b;
  EXPECT_EQ(sum, 4 * 128);
  EXPECT_EQ(seen, 0x1FF) << "widths 0..8 each present";
}

TEST_P(AttentionChan, MatchesDoubleAttentionOverTheKeysItReads) {
  ThreadPool pool(2);
  const Seq s(100, 1, widths());
  const auto q = queries(s.n, 2);
  for (const int64_t window : {int64_t{0}, int64_t{40}}) {
    Step st;
    prepare(st, s, q, 0, s.n);
    attend(&st.a, &st.t, 1, params(window), pool);
    double err = 0, ref_sq = 0;
    std::vector<double> keys, vals;
    for (int64_t p = 0; p < s.n; ++p) {
      s.reference_kv(p, keys, vals);
      const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t kvh = h / kGroup;
        const float* qh = q.data() + (p * kHeads + h) * 64;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (int64_t j = lo; j <= p; ++j) {
          double d = 0;
          for (int64_t c = 0; c < 64; ++c) d += qh[c] * keys[static_cast<size_t>(j * s.width + kvh * 64 + c)];
          sc.push_back(d * 0.125);
          mx = std::max(mx, sc.back());
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < 64; ++c) {
          double o = 0;
          for (int64_t j = lo; j <= p; ++j)
            o += sc[static_cast<size_t>(j - lo)] / sum * vals[static_cast<size_t>(j * s.width + kvh * 64 + c)];
          const double e = st.out[static_cast<size_t>((p * kHeads + h) * 64 + c)] - o;
          err += e * e;
          ref_sq += o * o;
        }
      }
    }
    // f32 sums of 64 products, exp and the rotation back: a few ulps.
    EXPECT_LT(std::sqrt(err / ref_sq), 2e-6) << "window " << window;
  }
}

// Relative RMS error of attention outputs `out` (queries q over every
// position of s, causal) against exact attention over s's f32 rows.
double error_vs_f32_attention(const Seq& s, const std::vector<float>& q, const std::vector<float>& out) {
  double err = 0, ref_sq = 0;
  for (int64_t p = 0; p < s.n; ++p) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t kvh = h / kGroup;
      const float* qh = q.data() + (p * kHeads + h) * 64;
      std::vector<double> sc;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= p; ++j) {
        double d = 0;
        for (int64_t c = 0; c < 64; ++c) d += qh[c] * s.k[static_cast<size_t>(j * s.width + kvh * 64 + c)];
        sc.push_back(d * 0.125);
        mx = std::max(mx, sc.back());
      }
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < 64; ++c) {
        double o = 0;
        for (int64_t j = 0; j <= p; ++j)
          o += sc[static_cast<size_t>(j)] / sum * s.v[static_cast<size_t>(j * s.width + kvh * 64 + c)];
        const double e = out[static_cast<size_t>((p * kHeads + h) * 64 + c)] - o;
        err += e * e;
        ref_sq += o * o;
      }
    }
  }
  return std::sqrt(err / ref_sq);
}

// RMS error of the attention scores q.k over the keys held in quantized
// groups (positions before the last query's block), relative to the exact
// scores: what allocate_channel_bits spends K's bits to reduce.
double key_score_error(const Seq& s, const std::vector<float>& q) {
  std::vector<double> keys, vals;
  s.reference_kv(s.n - 1, keys, vals);
  const int64_t held = (s.n - 1) - (s.n - 1) % kT;
  double err = 0, ref_sq = 0;
  for (int64_t p = 0; p < s.n; ++p) {
    for (int64_t h = 0; h < kHeads; ++h) {
      const float* qh = q.data() + (p * kHeads + h) * 64;
      for (int64_t j = 0; j < held; ++j) {
        double d = 0, exact = 0;
        for (int64_t c = 0; c < 64; ++c) {
          const auto i = static_cast<size_t>(j * s.width + h / kGroup * 64 + c);
          d += qh[c] * (keys[i] - s.k[i]);
          exact += qh[c] * s.k[i];
        }
        err += d * d;
        ref_sq += exact * exact;
      }
    }
  }
  return std::sqrt(err / ref_sq);
}

// q4a's widths as the model calibrates them (CpuPagedModel::calibrate_kv):
// add_calibration_token over the sequence's f32 queries and keys, then
// allocate_channel_bits with the loader's defaults.
std::vector<uint8_t> calibrated_widths(const Seq& s, const std::vector<float>& q) {
  const auto w = static_cast<size_t>(s.width);
  std::vector<double> energy(w, 0.0), range_sq(w, 0.0);
  std::vector<float> lo(w), hi(w);
  for (int64_t p = 0; p < s.n; ++p) {
    add_calibration_token(energy.data(), range_sq.data(), lo.data(), hi.data(), q.data() + p * kHeads * 64,
                          s.k.data() + p * s.width, static_cast<int32_t>(p), kHeads, s.n_kv_heads, s.hd);
  }
  std::vector<uint8_t> widths(w);
  allocate_channel_bits(energy.data(), range_sq.data(), s.width, s.hd, RopePairs::kNeox, widths.data());
  return widths;
}

// Both K encodings against exact f32 attention. q4c: 4 bits per K channel
// over 32 tokens and 4-bit V, measured 0.07 here (iq4_nlh on the same data:
// kv_quant_test's bounds are per type). q4a's fixed test_widths() are not
// fitted to the data, so it gets widths calibrated on the same rows.
TEST(AttentionChanAccuracy, WithinTheFourBitErrorOfF32Attention) {
  ThreadPool pool(2);
  const auto q = queries(200, 4);
  const Seq c(200, 3);
  Step sc;
  prepare(sc, c, q, 0, c.n);
  attention_chan_batch(&sc.a, &sc.t, 1, params(), kK4c, pool);
  EXPECT_LT(error_vs_f32_attention(c, q, sc.out), 0.1);

  const std::vector<uint8_t> widths = calibrated_widths(c, q);
  const Seq a(200, 3, widths.data());
  Step sa;
  prepare(sa, a, q, 0, a.n);
  attention_chan_batch(&sa.a, &sa.t, 1, params(), kK4a, pool, widths.data());
  EXPECT_LT(error_vs_f32_attention(a, q, sa.out), 0.1);
}

// What q4a is for: K channels whose ranges differ by orders of magnitude
// (spread_channels: 2^-4..2^3). Calibrated widths (4 bits a channel on
// average, so q4c's bytes) move bits to the wide channels, and the score
// error q.k over the quantized keys must fall to half of q4c's or less (measured
// 0.020 against 0.070; the outputs 0.075 against 0.135), the output's with it.
TEST(AttentionChanAccuracy, CalibratedWidthsBeatFourBitsPerChannel) {
  ThreadPool pool(2);
  const auto q = queries(200, 4);
  const Seq c(200, 3, nullptr, true);
  const std::vector<uint8_t> widths = calibrated_widths(c, q);
  int sum = 0, fewest = 8, most = 0;
  for (uint8_t b : widths) sum += b, fewest = std::min<int>(fewest, b), most = std::max<int>(most, b);
  EXPECT_EQ(sum, 4 * c.width) << "4 bits a channel on average";
  EXPECT_GT(most, fewest);
  const Seq a(200, 3, widths.data(), true);

  const double q4c_scores = key_score_error(c, q), q4a_scores = key_score_error(a, q);
  RecordProperty("q4c_score_error", std::to_string(q4c_scores));
  RecordProperty("q4a_score_error", std::to_string(q4a_scores));
  EXPECT_LT(q4a_scores, 0.5 * q4c_scores) << "q4a " << q4a_scores << " against q4c " << q4c_scores;

  Step sc, sa;
  prepare(sc, c, q, 0, c.n);
  attention_chan_batch(&sc.a, &sc.t, 1, params(), kK4c, pool);
  prepare(sa, a, q, 0, a.n);
  attention_chan_batch(&sa.a, &sa.t, 1, params(), kK4a, pool, widths.data());
  const double q4c_err = error_vs_f32_attention(c, q, sc.out), q4a_err = error_vs_f32_attention(a, q, sa.out);
  RecordProperty("q4c_error", std::to_string(q4c_err));
  RecordProperty("q4a_error", std::to_string(q4a_err));
  EXPECT_LT(q4a_err, q4c_err) << "q4a " << q4a_err << " against q4c " << q4c_err;
}

// How the queries of a sequence are split into steps (the tail holding the
// keys of the step's first block before it), and which other sequences
// share the call, changes no bit of any query's output.
TEST_P(AttentionChan, StepsAndBatchesAreBitExact) {
  ThreadPool pool(2);
  const Seq a(97, 5, widths()), b(40, 6, widths());
  const auto qa = queries(a.n, 7), qb = queries(b.n, 8);
  Step whole;
  prepare(whole, a, qa, 0, a.n);
  attend(&whole.a, &whole.t, 1, params(), pool);
  const int64_t qw = kHeads * 64;
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, 31, 32, 33, 65, 97}, std::vector<int64_t>{0, 1, 64, 90, 97},
        std::vector<int64_t>{0, 17, 50, 96, 97}}) {
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      Step sa, sb;
      prepare(sa, a, qa, cuts[i], cuts[i + 1]);
      prepare(sb, b, qb, 10, b.n);  // another sequence in the same call
      AttentionSeq seqs[] = {sb.a, sa.a};
      ChanTail tails[] = {sb.t, sa.t};
      attend(seqs, tails, 2, params(), pool);
      for (int64_t r = 0; r < sa.a.n_q * qw; ++r) {
        ASSERT_EQ(sa.out[static_cast<size_t>(r)], whole.out[static_cast<size_t>(cuts[i] * qw + r)])
            << "step [" << cuts[i] << ", " << cuts[i + 1] << ") element " << r;
      }
    }
  }
}

// A prefill step attends its queries in tiles (a K group's codes and a V
// row decoded once per tile), a decode step one query alone: the same bits
// per query, with and without a window, tiles straddling blocks and the
// step starting mid-block.
TEST_P(AttentionChan, TilesMatchSingleQueriesBitForBit) {
  ThreadPool pool(2);
  const Seq a(150, 9, widths());
  const auto qa = queries(a.n, 10);
  const int64_t qw = kHeads * 64;
  for (const int64_t window : {int64_t{0}, int64_t{40}, int64_t{5}}) {
    std::vector<float> single(static_cast<size_t>(a.n * qw));
    for (int64_t i = 0; i < a.n; ++i) {
      Step st;
      prepare(st, a, qa, i, i + 1);
      attend(&st.a, &st.t, 1, params(window), pool);
      std::copy(st.out.begin(), st.out.end(), single.begin() + i * qw);
    }
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 150}, std::vector<int64_t>{0, 3, 37, 70, 150}}) {
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        Step st;
        prepare(st, a, qa, cuts[c], cuts[c + 1]);
        attend(&st.a, &st.t, 1, params(window), pool);
        for (int64_t r = 0; r < st.a.n_q * qw; ++r) {
          ASSERT_EQ(st.out[static_cast<size_t>(r)], single[static_cast<size_t>(cuts[c] * qw + r)])
              << "window " << window << " step [" << cuts[c] << ", " << cuts[c + 1] << ") element " << r;
        }
      }
    }
  }
}

// The tile kernel against the single-query kernel of each ISA this machine
// runs (the batch driver takes the best one only): every query of tiles of
// 2..kChanTile queries at every offset in a block, K blocks and own blocks
// straddled, bit for bit, rotation left to the caller in both.
TEST_P(AttentionChan, EveryIsaTileMatchesItsSingleQueryKernel) {
  const Seq a(100, 11, widths());
  const auto qa = queries(a.n, 12);
  const int64_t qw = kHeads * 64, hd = 64;
  struct Kernels {
    void (*one)(const detail::ChanAttendArgs&);
    void (*tile)(const detail::ChanTileArgs&);
    detail::KvDequant dq;
  };
  std::vector<Kernels> isas = {
      {detail::attend_chan_scalar, detail::attend_chan_tile_scalar, detail::kv_dequant_scalar(kKvIq4Nl64)}};
  if (best_isa() != Isa::kScalar)
    isas.push_back({detail::attend_chan_avx2, detail::attend_chan_tile_avx2, detail::kv_dequant_avx2(kKvIq4Nl64)});
  if (best_isa() == Isa::kAvx512)
    isas.push_back({detail::attend_chan_avx512, detail::attend_chan_tile_avx512, detail::kv_dequant_avx2(kKvIq4Nl64)});
  const int64_t c0 = 21;  // the step [21, 100): its first block from the tail
  Step st;
  prepare(st, a, qa, c0, a.n);
  std::vector<float> scores(static_cast<size_t>(a.n * 4));
  std::vector<std::vector<float>> baseline;  // the scalar build's single queries, per (window, head)
  for (const Kernels& k : isas) {
    for (const int64_t window : {int64_t{0}, int64_t{30}}) {
      // Query heads per KV head: the model's 3 and the other sizes the
      // AVX-512 decode's register V pass takes (1, 2, 4: KV head 0 only,
      // reading heads 0..3 of the step's queries).
      for (const int g : {kGroup, 1, 2, 4}) {
        for (int64_t kvh = 0; kvh < (g == 4 ? 1 : 2); ++kvh) {
          auto args = [&](detail::ChanAttendArgs& x, int64_t i, float* out) {
            x.q = st.a.q + i * qw + kvh * kGroup * hd;
            x.kv = st.a.kv;
            x.kv.v += static_cast<size_t>(kvh) * row_bytes(kKvIq4Nl64, hd);
            x.k_blocks = st.a.kv.k;
            x.k_widths = widths() ? widths() + kvh * hd : nullptr;
            x.k_plane_offset = widths() ? alloc_plane_offset(widths(), a.width, kvh * hd) : 0;
            x.width = a.width;
            x.head = kvh;
            x.head_dim = hd;
            x.tail_row_bytes = a.tail_row;
            x.pos = c0 + i;
            x.j_end = c0 + i + 1;
            x.j_begin = window > 0 ? std::max<int64_t>(0, c0 + i - window + 1) : 0;
            x.tail = st.t;
            x.v_dequant = k.dq;
            x.v_type = kKvIq4Nl64;
            x.n_heads = g;
            x.scale = 0.125f;
            x.softcap = 0.0f;
            x.scores = scores.data();
            x.out = out;
          };
          const int64_t n_q = a.n - c0;
          std::vector<float> one(static_cast<size_t>(n_q * g * hd));
          for (int64_t i = 0; i < n_q; ++i) {
            detail::ChanAttendArgs x;
            args(x, i, one.data() + i * g * hd);
            k.one(x);
          }
          // Each vector build within rounding of the baseline build (its own
          // sum orders, FMAs and vector exp).
          const size_t case_index = static_cast<size_t>(((window > 0) * 2 + kvh) * 5 + g);
          if (&k == isas.data()) {
            baseline.resize(20);
            baseline[case_index] = one;
          }
          for (size_t r = 0; r < one.size(); ++r) {
            ASSERT_NEAR(one[r], baseline[case_index][r], 2e-5f) << "isa " << (&k - isas.data()) << " element " << r;
          }
          for (int n_tile = 2; n_tile <= detail::kChanTile; ++n_tile) {
            std::vector<float> tiled(one.size(), NAN);
            for (int64_t i0 = 0; i0 < n_q; i0 += n_tile) {
              detail::ChanTileArgs x;
              args(x, i0, tiled.data() + i0 * g * hd);
              x.n_q = static_cast<int>(std::min<int64_t>(n_tile, n_q - i0));
              x.q_stride = qw;
              x.out_stride = g * hd;
              x.window = window;
              x.n_kv = a.n;
              k.tile(x);
            }
            for (size_t r = 0; r < one.size(); ++r) {
              ASSERT_EQ(tiled[r], one[r]) << "isa " << (&k - isas.data()) << " window " << window << " head " << kvh
                                          << " query heads " << g << " tile " << n_tile << " element " << r;
            }
          }
        }
      }
    }
  }
}

// q4a with every channel at 4 bits holds q4c's z, d and codes (in planes):
// its attention gives q4c's bits through the driver (this machine's best
// ISA's kernel; each ISA's tiles against its decode are tested above).
TEST(AttentionChanWidths, FourBitsEverywhereIsQ4cBitForBit) {
  ThreadPool pool(2);
  const std::vector<uint8_t> four(128, 4);
  const Seq c(120, 13), a(120, 13, four.data());
  const auto q = queries(c.n, 14);
  for (const int64_t c0 : {int64_t{0}, int64_t{70}, int64_t{119}}) {
    Step sc, sa;
    prepare(sc, c, q, c0, c.n);
    prepare(sa, a, q, c0, a.n);
    attention_chan_batch(&sc.a, &sc.t, 1, params(), kK4c, pool);
    attention_chan_batch(&sa.a, &sa.t, 1, params(), kK4a, pool, four.data());
    for (size_t r = 0; r < sc.out.size(); ++r) ASSERT_EQ(sa.out[r], sc.out[r]) << "from " << c0 << " element " << r;
  }
}

// The same on each ISA's single-query and tile kernels (the driver above
// takes the best ISA only): q4a at 4 bits everywhere gives q4c's bits.
TEST(AttentionChanWidths, FourBitsEverywhereIsQ4cOnEveryIsa) {
  const std::vector<uint8_t> four(128, 4);
  const Seq c(100, 13), a(100, 13, four.data());
  const auto q = queries(c.n, 14);
  const int64_t qw = kHeads * 64, hd = 64, c0 = 21, n_q = c.n - c0;
  struct Kernels {
    void (*one)(const detail::ChanAttendArgs&);
    void (*tile)(const detail::ChanTileArgs&);
    detail::KvDequant dq;
  };
  std::vector<Kernels> isas = {
      {detail::attend_chan_scalar, detail::attend_chan_tile_scalar, detail::kv_dequant_scalar(kKvIq4Nl64)}};
  if (best_isa() != Isa::kScalar)
    isas.push_back({detail::attend_chan_avx2, detail::attend_chan_tile_avx2, detail::kv_dequant_avx2(kKvIq4Nl64)});
  if (best_isa() == Isa::kAvx512)
    isas.push_back({detail::attend_chan_avx512, detail::attend_chan_tile_avx512, detail::kv_dequant_avx2(kKvIq4Nl64)});
  Step sc, sa;
  prepare(sc, c, q, c0, c.n);
  prepare(sa, a, q, c0, a.n);
  std::vector<float> scores(static_cast<size_t>(c.n * kGroup));
  for (const Kernels& k : isas) {
    for (int64_t kvh = 0; kvh < 2; ++kvh) {
      auto args = [&](detail::ChanAttendArgs& x, const Step& st, const Seq& s, bool planes, int64_t i, float* out) {
        x.q = st.a.q + i * qw + kvh * kGroup * hd;
        x.kv = st.a.kv;
        x.kv.v += static_cast<size_t>(kvh) * row_bytes(kKvIq4Nl64, hd);
        x.k_blocks = st.a.kv.k;
        x.k_widths = planes ? four.data() + kvh * hd : nullptr;
        x.k_plane_offset = planes ? alloc_plane_offset(four.data(), s.width, kvh * hd) : 0;
        x.width = s.width;
        x.head = kvh;
        x.head_dim = hd;
        x.tail_row_bytes = s.tail_row;
        x.pos = c0 + i;
        x.j_end = c0 + i + 1;
        x.j_begin = 0;
        x.tail = st.t;
        x.v_dequant = k.dq;
        x.v_type = kKvIq4Nl64;
        x.n_heads = kGroup;
        x.scale = 0.125f;
        x.softcap = 0.0f;
        x.scores = scores.data();
        x.out = out;
      };
      std::vector<float> oc(static_cast<size_t>(n_q * kGroup * hd)), oa(oc.size(), NAN);
      for (int64_t i = 0; i < n_q; ++i) {
        detail::ChanAttendArgs x, y;
        args(x, sc, c, false, i, oc.data() + i * kGroup * hd);
        args(y, sa, a, true, i, oa.data() + i * kGroup * hd);
        k.one(x);
        k.one(y);
      }
      for (size_t r = 0; r < oc.size(); ++r) {
        ASSERT_EQ(oa[r], oc[r]) << "isa " << (&k - isas.data()) << " head " << kvh << " element " << r;
      }
      std::vector<float> ta(oc.size(), NAN);
      for (int64_t i0 = 0; i0 < n_q; i0 += detail::kChanTile) {
        detail::ChanTileArgs y;
        args(y, sa, a, true, i0, ta.data() + i0 * kGroup * hd);
        y.n_q = static_cast<int>(std::min<int64_t>(detail::kChanTile, n_q - i0));
        y.q_stride = qw;
        y.out_stride = kGroup * hd;
        y.window = 0;
        y.n_kv = a.n;
        k.tile(y);
      }
      for (size_t r = 0; r < oc.size(); ++r) {
        ASSERT_EQ(ta[r], oc[r]) << "tiles, isa " << (&k - isas.data()) << " head " << kvh << " element " << r;
      }
    }
  }
}

}  // namespace
}  // namespace rill::cpu
