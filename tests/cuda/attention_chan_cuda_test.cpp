// k4c and k4a attention on CUDA (backend/cuda/attention_chan.h, the
// reference kernel) against the CPU's (cpu::attention_chan_batch) over the
// same paged blocks (K's q4c groups, or q4a's planes under widths 0..8,
// encoded from the q8_0 tail rows, V's
// iq4_nlh64 rows, shuffled block tables) and the same tail and step rows:
//  - the kernel's code built for the host (no GPU needed) within 2e-5 of
//    the CPU's outputs (the CPU's build on this machine may sum in other
//    orders: AVX2 / AVX-512), after rotating V back as the CPU does;
//  - on the device, within 2e-5 of the host run (expf and tanhf differ
//    from the host's by ulps; every other operation is rounded the same).
// Shapes: a decode query, a prefill chunk after a prefix (its own block
// partly in the tail), a whole prompt, a window with softcap; GQA 4 and 1;
// heads of 64 and 128.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention_chan.h"
#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/attention_chan.h"
#include "backend/cuda/kv_chan.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;
constexpr int64_t kT = cpu::kKvChanTokens;

struct Case {
  int64_t n, c0;  // the sequence's tokens; the step's first position
  int32_t n_head, n_head_kv, hd, window;
  float softcap;
};

struct ChanSeq {
  int64_t width = 0;
  size_t tail_row = 0, k_row = 0, v_row = 0, block_bytes = 0;
  std::vector<uint8_t> k_rows, v_rows;  // [n] q8_0 rows (V rotated)
  std::vector<int32_t> table;
  std::vector<uint8_t> kb, vb;  // K / V regions of every block, block_bytes apart
  std::vector<float> q;         // [n, n_head * hd]: the queries of every position
  // The tail (32 rows, positions [c0 - c0 % 32, c0), garbage after) and the
  // step's rows (positions [c0, n)), each in its own buffer, as the runtime
  // keeps them.
  std::vector<uint8_t> tail_k, tail_v, step_k, step_v;
  // k4a (alloc): K's blocks in q4a under `widths` (every width 0..8, 4 a
  // channel on average, drawn from the seed), `table` their widths table
  // (backend/cuda/kv_chan.h); empty for k4c.
  std::vector<uint8_t> widths, widths_table;

  ChanSeq(const Case& c, uint32_t seed, bool alloc = false) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    width = int64_t{c.n_head_kv} * c.hd;
    std::vector<float> k(static_cast<size_t>(c.n * width)), v(k.size());
    for (int64_t t = 0; t < c.n; ++t) {
      for (int64_t ch = 0; ch < width; ++ch) {
        k[static_cast<size_t>(t * width + ch)] = ch % c.hd == 5 ? 6.0f + 3.0f * nd(rng) : nd(rng);
        v[static_cast<size_t>(t * width + ch)] = nd(rng);
      }
    }
    q.resize(static_cast<size_t>(c.n * c.n_head * c.hd));
    for (float& x : q) x = 0.3f * nd(rng);
    tail_row = row_bytes(cpu::kKvChanTailType, width);
    k_rows.resize(static_cast<size_t>(c.n) * tail_row);
    v_rows.resize(k_rows.size());
    for (int64_t t = 0; t < c.n; ++t) {
      cpu::store_chan_tail_rows(k.data() + t * width, v.data() + t * width, true, c.n_head_kv, c.hd,
                                k_rows.data() + t * tail_row, v_rows.data() + t * tail_row);
    }
    const int64_t n_blocks = (c.n + kT - 1) / kT;
    table.resize(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    if (alloc) {
      widths.resize(static_cast<size_t>(width));
      for (int64_t ch = 0; ch < width; ++ch)
        widths[static_cast<size_t>(ch)] = static_cast<uint8_t>((ch * 5 + seed) % 9);
      for (int64_t ch = 0; ch + 1 < width; ch += 2) {  // pairs summing to 8: 4 a channel
        widths[static_cast<size_t>(ch + 1)] = static_cast<uint8_t>(8 - widths[static_cast<size_t>(ch)]);
      }
      widths_table.resize(alloc_table_bytes(width));
      fill_alloc_table(widths.data(), width, widths_table.data());
    }
    k_row = row_bytes(alloc ? kKvQ4Alloc : kKvQ4Chan, width);
    v_row = row_bytes(kKvIq4Nl64, width);
    block_bytes = std::max(k_row, v_row) * kT;
    kb.assign(static_cast<size_t>(n_blocks) * block_bytes, 0);
    vb.assign(kb.size(), 0);
    std::vector<float> rows(static_cast<size_t>(kT * width));
    for (int64_t b = 0; (b + 1) * kT <= c.n; ++b) {
      for (int64_t r = 0; r < kT; ++r) {
        cpu::ref::dequantize_row(cpu::kKvChanTailType, k_rows.data() + (b * kT + r) * tail_row, rows.data() + r * width,
                                 width);
      }
      uint8_t* dst = kb.data() + static_cast<size_t>(table[static_cast<size_t>(b)]) * block_bytes;
      if (alloc) {
        cpu::quantize_alloc_block(rows.data(), width, width, widths.data(), dst, b == 0);
      } else {
        cpu::quantize_chan_block(rows.data(), width, width, dst, b == 0);
      }
    }
    const int64_t tail_start = c.c0 - c.c0 % kT;
    tail_k.assign(static_cast<size_t>(kT) * tail_row, 0x77);
    tail_v = tail_k;
    std::copy(k_rows.begin() + tail_start * tail_row, k_rows.begin() + c.c0 * tail_row, tail_k.begin());
    std::copy(v_rows.begin() + tail_start * tail_row, v_rows.begin() + c.c0 * tail_row, tail_v.begin());
    step_k.assign(k_rows.begin() + c.c0 * tail_row, k_rows.end());
    step_v.assign(v_rows.begin() + c.c0 * tail_row, v_rows.end());
    for (int64_t t = 0; t < c.n; ++t) {
      cpu::store_kv_row(kKvIq4Nl64, true, v.data() + t * width,
                        vb.data() + static_cast<size_t>(table[static_cast<size_t>(t / kT)]) * block_bytes +
                            static_cast<size_t>(t % kT) * v_row,
                        c.n_head_kv, c.hd);
    }
  }
};

// The CPU's outputs of the step's queries (positions c0 .. n - 1).
std::vector<float> cpu_out(const Case& c, const ChanSeq& s) {
  const int64_t n_q = c.n - c.c0, qw = int64_t{c.n_head} * c.hd;
  std::vector<int32_t> q_pos(static_cast<size_t>(n_q));
  std::iota(q_pos.begin(), q_pos.end(), static_cast<int32_t>(c.c0));
  std::vector<float> out(static_cast<size_t>(n_q * qw), NAN);
  cpu::AttentionSeq seq;
  seq.q = s.q.data() + c.c0 * qw;
  seq.q_pos = q_pos.data();
  seq.n_q = n_q;
  seq.kv.k = s.kb.data();
  seq.kv.v = s.vb.data();
  seq.kv.table = s.table.data();
  seq.kv.block_shift = 5;
  seq.kv.block_bytes = s.block_bytes;
  seq.kv.row_bytes = s.k_row;
  seq.kv.v_row_bytes = s.v_row;
  seq.n_kv = c.n;
  seq.out = out.data();
  cpu::ChanTail tail;
  tail.tail_k = s.tail_k.data();
  tail.tail_v = s.tail_v.data();
  tail.step_k = s.step_k.data();
  tail.step_v = s.step_v.data();
  tail.c0 = c.c0;
  cpu::AttentionParams p;
  p.n_head = c.n_head;
  p.n_head_kv = c.n_head_kv;
  p.head_dim = c.hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  p.window = c.window;
  p.softcap = c.softcap;
  ThreadPool pool(2);
  const bool alloc = !s.widths.empty();
  cpu::attention_chan_batch(&seq, &tail, 1, p,
                            cpu::KvSideTypes{alloc ? kKvQ4Alloc : kKvQ4Chan, kKvIq4Nl64, false, true}, pool,
                            alloc ? s.widths.data() : nullptr);
  return out;
}

// ChanAttentionArgs over the sequence's buffers at the given addresses
// (host or device copies of ChanSeq's, the step's queries, and scratch).
struct Buffers {
  const float* q;
  float *out, *scores;
  const int32_t *pos, *seq_of, *table, *table_start, *c0, *q_start;
  const uint8_t *const *tail_k, *const *tail_v;
  const uint8_t *step_k, *step_v, *kb, *vb;
  const uint8_t* k_widths = nullptr;  // k4a's widths table
};
ChanAttentionArgs args(const Case& c, const ChanSeq& s, const Buffers& b) {
  ChanAttentionArgs a;
  a.q = b.q;
  a.q_stride = int64_t{c.n_head} * c.hd;
  a.out = b.out;
  a.scores = b.scores;
  a.max_keys = static_cast<int32_t>(c.n);
  a.pos = b.pos;
  a.seq_of = b.seq_of;
  a.block_tables = b.table;
  a.table_start = b.table_start;
  a.c0 = b.c0;
  a.q_start = b.q_start;
  a.tail_k = b.tail_k;
  a.tail_v = b.tail_v;
  a.step_k = b.step_k;
  a.step_v = b.step_v;
  a.k_blocks = b.kb;
  a.v_blocks = b.vb;
  a.block_stride = s.block_bytes;
  a.v_row_bytes = s.v_row;
  a.n_tokens = static_cast<int32_t>(c.n - c.c0);
  a.n_head = c.n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = c.hd;
  a.window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  a.softcap = c.softcap;
  a.k_widths = b.k_widths;
  return a;
}

const std::vector<Case> kCases = {
    {45, 44, 8, 2, 64, 0, 0.0f},     // decode: one query, its own block partly in the tail
    {100, 70, 8, 2, 64, 0, 0.0f},    // a prefill chunk after a prefix of 70
    {64, 0, 4, 4, 128, 0, 0.0f},     // a whole prompt, GQA 1
    {130, 97, 8, 2, 128, 40, 20.0f}  // a window and softcap
};

std::vector<float> host_run(const Case& c, const ChanSeq& s, bool parallel = false, bool rotate_back = true) {
  const int64_t n_q = c.n - c.c0, qw = int64_t{c.n_head} * c.hd;
  std::vector<float> out(static_cast<size_t>(n_q * qw), NAN), scores(static_cast<size_t>(n_q * c.n_head * c.n));
  std::vector<int32_t> pos(static_cast<size_t>(n_q)), seq_of(static_cast<size_t>(n_q), 0);
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(c.c0));
  const int32_t table_start = 0, c0 = static_cast<int32_t>(c.c0), q_start = 0;
  const uint8_t* tk = s.tail_k.data();
  const uint8_t* tv = s.tail_v.data();
  const Buffers b{s.q.data() + c.c0 * qw,
                  out.data(),
                  scores.data(),
                  pos.data(),
                  seq_of.data(),
                  s.table.data(),
                  &table_start,
                  &c0,
                  &q_start,
                  &tk,
                  &tv,
                  s.step_k.data(),
                  s.step_v.data(),
                  s.kb.data(),
                  s.vb.data(),
                  s.widths.empty() ? nullptr : s.widths_table.data()};
  if (parallel) {
    chan_attention_parallel_host(args(c, s, b));
  } else {
    chan_attention_host(args(c, s, b));
  }
  if (!rotate_back) return out;
  // V's rotation undone, as the CPU does it (the device's callers rotate back too).
  for (int64_t i = 0; i < n_q * c.n_head; ++i) cpu::hadamard_rotate(out.data() + i * c.hd, c.hd);
  return out;
}

std::string name(const Case& c, bool alloc = false) {
  return std::string(alloc ? "k4a " : "k4c ") + "n " + std::to_string(c.n) + " c0 " + std::to_string(c.c0) + " heads " +
         std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " hd " + std::to_string(c.hd) + " window " +
         std::to_string(c.window);
}

// k4c, then k4a (q4a's planes under widths 0..8; the CPU picks its own
// ISA's group sums, within f32 rounding of the scalar form the kernel has).
TEST(CudaChanAttention, HostRunIsTheCpus) {
  for (const bool alloc : {false, true}) {
    for (size_t i = 0; i < kCases.size(); ++i) {
      const Case& c = kCases[i];
      const ChanSeq s(c, 40 + static_cast<uint32_t>(i), alloc);
      const std::vector<float> want = cpu_out(c, s), got = host_run(c, s);
      ASSERT_EQ(got.size(), want.size());
      for (size_t e = 0; e < want.size(); ++e) ASSERT_NEAR(got[e], want[e], 2e-5) << name(c, alloc) << " elem " << e;
    }
  }
}

// k4a's blocks are not k4c's: read as q4c groups (no widths table), the
// same bytes give other outputs (the test above is not passed by a kernel
// that ignores the widths).
TEST(CudaChanAttention, AllocBlocksReadAsQ4cDiffer) {
  const Case& c = kCases[1];
  ChanSeq s(c, 41, /*alloc=*/true);
  const std::vector<float> right = host_run(c, s);
  s.widths.clear();
  const std::vector<float> wrong = host_run(c, s);
  double diff = 0;
  for (size_t e = 0; e < right.size(); ++e) diff = std::max(diff, double{std::fabs(right[e] - wrong[e])});
  EXPECT_GT(diff, 1e-2);
}

// The parallel kernel's code (chan_attention_parallel: a thread block per
// query and head) run phase after phase on the host gives the reference's
// bits (its values are computed as the reference computes them).
TEST(CudaChanAttention, ParallelHostRunIsTheReferenceBitForBit) {
  for (const bool alloc : {false, true}) {
    for (size_t i = 0; i < kCases.size(); ++i) {
      const Case& c = kCases[i];
      const ChanSeq s(c, 40 + static_cast<uint32_t>(i), alloc);
      const std::vector<float> want = host_run(c, s, false, false), got = host_run(c, s, true, false);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << name(c, alloc);
    }
  }
}

TEST(CudaChanAttention, DeviceIsTheHostRun) {
  RILL_REQUIRE_GPU();
  for (size_t i = 0; i < 2 * kCases.size(); ++i) {  // k4c's cases, then k4a's
    const bool alloc = i >= kCases.size();
    const Case& c = kCases[i % kCases.size()];
    const ChanSeq s(c, 40 + static_cast<uint32_t>(i % kCases.size()), alloc);
    const int64_t n_q = c.n - c.c0, qw = int64_t{c.n_head} * c.hd;
    std::vector<int32_t> pos(static_cast<size_t>(n_q)), seq_of(static_cast<size_t>(n_q), 0);
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(c.c0));
    auto d_q = upload(std::vector<float>(s.q.begin() + c.c0 * qw, s.q.end()));
    auto d_out = poisoned(static_cast<size_t>(n_q * qw) * 4);
    auto d_scores = upload(std::vector<float>(static_cast<size_t>(n_q * c.n_head * c.n), 0.0f));
    auto d_pos = upload(pos), d_seq = upload(seq_of), d_table = upload(s.table);
    auto d_zero = upload(std::vector<int32_t>{0}), d_c0 = upload(std::vector<int32_t>{static_cast<int32_t>(c.c0)});
    auto d_tail_k = upload(s.tail_k), d_tail_v = upload(s.tail_v), d_step_k = upload(s.step_k),
         d_step_v = upload(s.step_v), d_kb = upload(s.kb), d_vb = upload(s.vb);
    auto d_tk = upload(std::vector<const uint8_t*>{d_tail_k.as<uint8_t>()});
    auto d_tv = upload(std::vector<const uint8_t*>{d_tail_v.as<uint8_t>()});
    auto d_widths = upload(alloc ? s.widths_table : std::vector<uint8_t>(1, 0));
    const Buffers b{d_q.as<float>(),           d_out.as<float>(),
                    d_scores.as<float>(),      d_pos.as<int32_t>(),
                    d_seq.as<int32_t>(),       d_table.as<int32_t>(),
                    d_zero.as<int32_t>(),      d_c0.as<int32_t>(),
                    d_zero.as<int32_t>(),      d_tk.as<const uint8_t*>(),
                    d_tv.as<const uint8_t*>(), d_step_k.as<uint8_t>(),
                    d_step_v.as<uint8_t>(),    d_kb.as<uint8_t>(),
                    d_vb.as<uint8_t>(),        alloc ? d_widths.as<uint8_t>() : nullptr};
    chan_attention(args(c, s, b), nullptr);
    std::vector<float> got = download<float>(d_out, static_cast<size_t>(n_q * qw));
    // The parallel kernel (what the CUDA backend runs): the reference's bits.
    auto d_par = poisoned(static_cast<size_t>(n_q * qw) * 4);
    Buffers bp = b;
    bp.out = d_par.as<float>();
    chan_attention_parallel(args(c, s, bp), nullptr);
    const std::vector<float> par = download<float>(d_par, static_cast<size_t>(n_q * qw));
    EXPECT_EQ(std::memcmp(par.data(), got.data(), got.size() * sizeof(float)), 0)
        << name(c, alloc) << ": parallel kernel";
    for (int64_t r = 0; r < n_q * c.n_head; ++r) cpu::hadamard_rotate(got.data() + r * c.hd, c.hd);
    const std::vector<float> want = host_run(c, s);
    for (size_t e = 0; e < want.size(); ++e) ASSERT_NEAR(got[e], want[e], 2e-5) << name(c, alloc) << " elem " << e;
  }
}

// rotate_heads_back (what the k4c attention's f32 outputs go through into
// the step's activations): its f32 output is the CPU's rotation of each
// head (within f32 rounding), and its bf16 and f16 outputs are that f32
// output rounded to the type, bit for bit (one kernel, one rounding at the
// store). Rows read in_stride floats apart (wider than the heads), head
// sizes of the warp kernel (64, 128) and of the block kernel (16).
TEST(CudaChanAttention, RotateHeadsBackInBf16AndF16IsTheF32Rounded) {
  RILL_REQUIRE_GPU();
  for (const int32_t hd : {16, 64, 128}) {
    const int32_t n_rows = 5, n_heads = 3;
    const int64_t width = int64_t{n_heads} * hd, stride = width + 8;
    const std::vector<float> in = random_floats(static_cast<size_t>(n_rows * stride), 900 + static_cast<uint32_t>(hd));
    auto d_in = upload(in);
    const auto n = static_cast<size_t>(n_rows * width);
    auto d_f32 = poisoned(n * 4);
    rotate_heads_back(d_in.as<float>(), stride, n_rows, n_heads, hd, DType::kF32, d_f32.data(), nullptr);
    const std::vector<float> f32 = download<float>(d_f32, n);
    std::vector<float> want(n);
    for (int32_t r = 0; r < n_rows; ++r) {
      std::memcpy(want.data() + r * width, in.data() + r * stride, static_cast<size_t>(width) * sizeof(float));
    }
    for (int64_t h = 0; h < int64_t{n_rows} * n_heads; ++h) cpu::hadamard_rotate(want.data() + h * hd, hd);
    for (size_t e = 0; e < n; ++e) ASSERT_NEAR(f32[e], want[e], 1e-5) << "head_dim " << hd << " elem " << e;
    for (const DType t : {DType::kBF16, DType::kF16}) {
      auto d_out = poisoned(n * 2);
      rotate_heads_back(d_in.as<float>(), stride, n_rows, n_heads, hd, t, d_out.data(), nullptr);
      const std::vector<uint8_t> got = download<uint8_t>(d_out, n * 2);
      EXPECT_EQ(got, encode(t, f32)) << "head_dim " << hd << ", " << (t == DType::kBF16 ? "bf16" : "f16")
                                     << ": not the f32 output rounded";
    }
  }
}

}  // namespace
}  // namespace rill::cuda
