// k4c's per-layer step on CUDA (backend/cuda/kv_chan_step.h: the units'
// plan and the tail update around the encoder and the reference attention)
// against the CPU backend's flow (backend/cpu/cpu_backend.cpp
// encode_chan_blocks, attention_chan and its tail update, restated here
// over the CPU's own functions), step after step of two sequences that
// share steps: prompts that stop inside blocks, chunks that complete
// blocks from tail and step rows (one of them the sink block at 0, one
// two blocks at once), decode steps, a step that ends on a block boundary
// (its tail left empty). The CUDA side runs the kernels' code built for
// the host (plan_chan_step_host, quantize_chan_block_host,
// chan_attention_host, update_chan_tails_host: no GPU needed) over the CUDA
// pool's layout (K and V in separate planes, v_block_stride) while the CPU
// keeps its blocks of both. Held: the pool's K groups and both tails byte
// for byte after every step, the outputs within 2e-5 (the CPU build on
// this machine may sum in other orders), and, so the test can fail, the
// same step with the two sequences' tail slots exchanged is far off.
// DeviceRunIsTheHostRun (gpu): the device kernels give the host run's plan
// and tails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/attention_chan.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/attention_chan.h"
#include "backend/cuda/kv_chan.h"
#include "backend/cuda/kv_chan_step.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;
constexpr int64_t kT = cpu::kKvChanTokens;
constexpr int32_t kHeads = 4, kHeadsKv = 2, kHd = 64, kW = kHeadsKv * kHd, kBlocks = 8, kMaxKeys = 128;

struct SeqData {
  std::vector<int32_t> table;           // its pool blocks
  std::vector<uint8_t> k_rows, v_rows;  // [n] q8_0 rows (V rotated)
  std::vector<float> v;                 // [n, kW] V floats (the pool's iq4_nlh64 rows)
  std::vector<float> q;                 // [n, kHeads * kHd]
  int32_t slot = 0;                     // its tail slot
  int32_t len = 0;                      // tokens in the cache
};

struct StepRun {  // one sequence's tokens of a step
  int seq;
  int32_t n;
};

class K4cLayer {
 public:
  K4cLayer() {
    tail_row_ = row_bytes(cpu::kKvChanTailType, kW);
    k_row_ = row_bytes(kKvQ4Chan, kW);
    v_row_ = row_bytes(kKvIq4Nl64, kW);
    span_ = kT * (k_row_ + v_row_);
    tail_stride_ = sizeof(KvTailHeader) + 2 * kT * tail_row_;
    cpu_pool_.assign(kBlocks * span_, 0);
    k_plane_.assign(kBlocks * kT * k_row_, 0);
    v_plane_.assign(kBlocks * kT * v_row_, 0);
    cpu_tails_.assign(2 * tail_stride_, 0);
    cuda_tails_.assign(3 * tail_stride_, 0);  // slot 2: a decode graph's scratch slot
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    const std::vector<std::vector<int32_t>> tables = {{5, 2, 7, 0}, {1, 6, 3, 4}};
    for (int s = 0; s < 2; ++s) {
      SeqData& d = seqs_[s];
      d.table = tables[static_cast<size_t>(s)];
      d.slot = 1 - s;
      const int64_t n = kMaxKeys;
      std::vector<float> k(static_cast<size_t>(n * kW));
      d.v.resize(k.size());
      for (int64_t i = 0; i < n * kW; ++i) {
        k[static_cast<size_t>(i)] = i % kHd == 9 ? 5.0f + 2.0f * nd(rng) : nd(rng);  // an outlier channel
        d.v[static_cast<size_t>(i)] = nd(rng);
      }
      d.q.resize(static_cast<size_t>(n * kHeads * kHd));
      for (float& x : d.q) x = 0.3f * nd(rng);
      d.k_rows.resize(static_cast<size_t>(n) * tail_row_);
      d.v_rows.resize(d.k_rows.size());
      for (int64_t t = 0; t < n; ++t) {
        cpu::store_chan_tail_rows(k.data() + t * kW, d.v.data() + t * kW, true, kHeadsKv, kHd,
                                  d.k_rows.data() + t * tail_row_, d.v_rows.data() + t * tail_row_);
      }
    }
  }

  // One step; returns the largest output difference. `swapped`: the CUDA
  // side runs with the first two sequences' tail slots exchanged (a probe
  // that must fail; run it on a copy). `padded`: the CUDA side's plan and
  // tail update also see a decode graph's padding (CudaModelBase::compute):
  // a dummy sequence of one token at position 0 and a sequence of none,
  // both in the scratch slot 2, which must change nothing else.
  double step(const std::vector<StepRun>& runs, bool swapped = false, bool padded = false) {
    // The step's arrays, as a batch lays them out.
    std::vector<int32_t> q_start, q_len, kv_len, kv_tail, table_start, tables, pos, seq_of;
    std::vector<uint8_t> step_k, step_v;
    std::vector<float> q;
    for (size_t i = 0; i < runs.size(); ++i) {
      SeqData& d = seqs_[runs[i].seq];
      const int32_t c0 = d.len, c1 = d.len + runs[i].n;
      q_start.push_back(static_cast<int32_t>(pos.size()));
      q_len.push_back(runs[i].n);
      kv_len.push_back(c1);
      kv_tail.push_back(d.slot);
      table_start.push_back(static_cast<int32_t>(tables.size()));
      tables.insert(tables.end(), d.table.begin(), d.table.end());
      for (int32_t p = c0; p < c1; ++p) {
        pos.push_back(p);
        seq_of.push_back(static_cast<int32_t>(i));
        step_k.insert(step_k.end(), d.k_rows.begin() + p * tail_row_, d.k_rows.begin() + (p + 1) * tail_row_);
        step_v.insert(step_v.end(), d.v_rows.begin() + p * tail_row_, d.v_rows.begin() + (p + 1) * tail_row_);
        q.insert(q.end(), d.q.begin() + p * kHeads * kHd, d.q.begin() + (p + 1) * kHeads * kHd);
        // V's iq4_nlh64 row into both pools (rope_store_kv's).
        const int32_t b = d.table[static_cast<size_t>(p / kT)], r = p % kT;
        cpu::store_kv_row(kKvIq4Nl64, true, d.v.data() + p * kW,
                          cpu_pool_.data() + b * span_ + kT * k_row_ + r * v_row_, kHeadsKv, kHd);
        std::memcpy(v_plane_.data() + (b * kT + r) * v_row_, cpu_pool_.data() + b * span_ + kT * k_row_ + r * v_row_,
                    v_row_);
      }
    }
    const auto n_tokens = static_cast<int32_t>(pos.size()), n_seqs = static_cast<int32_t>(runs.size());
    const int64_t qw = int64_t{kHeads} * kHd;
    std::vector<float> want(static_cast<size_t>(n_tokens * qw), NAN), got(want.size(), NAN);
    std::vector<int32_t> cuda_tail = kv_tail;
    if (swapped) std::swap(cuda_tail[0], cuda_tail[1]);
    std::vector<int32_t> c_q_start = q_start, c_q_len = q_len, c_kv_len = kv_len, c_table_start = table_start;
    if (padded) {
      const auto dummy = static_cast<int32_t>(pos.size());
      step_k.resize(step_k.size() + tail_row_, 0);  // the dummy token's rows (after the real ones)
      step_v.resize(step_v.size() + tail_row_, 0);
      for (const int32_t len : {1, 0}) {
        c_q_start.push_back(len ? dummy : 0);
        c_q_len.push_back(len);
        c_kv_len.push_back(len);
        c_table_start.push_back(0);
        cuda_tail.push_back(2);
      }
    }
    const auto c_seqs = static_cast<int32_t>(c_q_len.size());

    // The CPU backend's flow (cpu_backend.cpp).
    {
      std::vector<float> rows(static_cast<size_t>(kT * kW));
      for (int32_t s = 0; s < n_seqs; ++s) {
        const int32_t c1 = kv_len[s], c0 = c1 - q_len[s];
        const uint8_t* tail_k = cpu_tails_.data() + kv_tail[s] * tail_stride_ + sizeof(KvTailHeader);
        for (int32_t g = c0 - c0 % kT; g + kT <= c1; g += kT) {
          for (int32_t r = 0; r < kT; ++r) {
            const int32_t p = g + r;
            const uint8_t* src = p < c0 ? tail_k + r * tail_row_ : step_k.data() + (q_start[s] + p - c0) * tail_row_;
            cpu::ref::dequantize_row(cpu::kKvChanTailType, src, rows.data() + r * kW, kW);
          }
          cpu::quantize_chan_block(rows.data(), kW, kW, cpu_pool_.data() + tables[table_start[s] + g / kT] * span_,
                                   g == 0);
        }
      }
      std::vector<cpu::AttentionSeq> as(static_cast<size_t>(n_seqs));
      std::vector<cpu::ChanTail> ts(static_cast<size_t>(n_seqs));
      for (int32_t s = 0; s < n_seqs; ++s) {
        cpu::AttentionSeq& a = as[static_cast<size_t>(s)];
        a.q = q.data() + q_start[s] * qw;
        a.q_pos = pos.data() + q_start[s];
        a.n_q = q_len[s];
        a.kv.k = cpu_pool_.data();
        a.kv.v = cpu_pool_.data() + kT * k_row_;
        a.kv.table = tables.data() + table_start[s];
        a.kv.block_shift = 5;
        a.kv.block_bytes = span_;
        a.kv.row_bytes = k_row_;
        a.kv.v_row_bytes = v_row_;
        a.n_kv = kv_len[s];
        a.out = want.data() + q_start[s] * qw;
        cpu::ChanTail& t = ts[static_cast<size_t>(s)];
        t.tail_k = cpu_tails_.data() + kv_tail[s] * tail_stride_ + sizeof(KvTailHeader);
        t.tail_v = t.tail_k + kT * tail_row_;
        t.step_k = step_k.data() + q_start[s] * tail_row_;
        t.step_v = step_v.data() + q_start[s] * tail_row_;
        t.c0 = kv_len[s] - q_len[s];
      }
      cpu::AttentionParams p;
      p.n_head = kHeads;
      p.n_head_kv = kHeadsKv;
      p.head_dim = kHd;
      p.scale = 0.125f;
      ThreadPool pool(2);
      cpu::attention_chan_batch(as.data(), ts.data(), n_seqs, p, cpu::KvSideTypes{kKvQ4Chan, kKvIq4Nl64, false, true},
                                pool);
      for (int32_t s = 0; s < n_seqs; ++s) {
        const int32_t c1 = kv_len[s], c0 = c1 - q_len[s], g0 = c0 - c0 % kT, g1 = c1 - c1 % kT;
        uint8_t* base = cpu_tails_.data() + kv_tail[s] * tail_stride_;
        uint8_t* tail_k = base + sizeof(KvTailHeader);
        uint8_t* tail_v = tail_k + kT * tail_row_;
        const int32_t from = g1 == g0 ? c0 : g1;
        const size_t src = (q_start[s] + from - c0) * tail_row_, dst = (from - g1) * tail_row_,
                     n = (c1 - from) * tail_row_;
        std::memcpy(tail_k + dst, step_k.data() + src, n);
        std::memcpy(tail_v + dst, step_v.data() + src, n);
        KvTailHeader h;
        h.group_start = g1;
        h.n_rows = c1 - g1;
        std::memcpy(base, &h, sizeof h);
      }
    }

    // The CUDA backend's flow (cuda_backend.cpp) over the host builds.
    const int32_t max_units = chan_max_units(n_tokens, c_seqs);
    std::vector<const uint8_t*> rows(static_cast<size_t>(max_units) * kT), tail_k(c_seqs), tail_v(c_seqs);
    std::vector<uint8_t*> dst(static_cast<size_t>(max_units));
    std::vector<uint8_t> seq_start(static_cast<size_t>(max_units));
    std::vector<int32_t> units(2 * static_cast<size_t>(max_units)), c0(static_cast<size_t>(c_seqs));
    int32_t n_units = -1;
    ChanStepArgs c;
    c.n_seqs = c_seqs;
    c.q_start = c_q_start.data();
    c.q_len = c_q_len.data();
    c.kv_len = c_kv_len.data();
    c.kv_tail = cuda_tail.data();
    c.table_start = c_table_start.data();
    c.block_tables = tables.data();
    c.tails = cuda_tails_.data();
    c.tail_stride = tail_stride_;
    c.step_k = step_k.data();
    c.step_v = step_v.data();
    c.k_blocks = k_plane_.data();
    c.k_block_stride = kT * k_row_;
    c.width = kW;
    c.max_units = max_units;
    c.rows = rows.data();
    c.dst = dst.data();
    c.sequence_start = seq_start.data();
    c.n_units = &n_units;
    c.units = units.data();
    c.c0 = c0.data();
    c.tail_k = tail_k.data();
    c.tail_v = tail_v.data();
    plan_chan_step_host(c);
    EXPECT_GE(n_units, 0);
    EXPECT_LE(n_units, max_units);
    std::vector<float> block(static_cast<size_t>(kT * kW));
    for (int32_t u = 0; u < std::min(n_units, max_units); ++u) {
      for (int32_t r = 0; r < kT; ++r) {
        cpu::ref::dequantize_row(cpu::kKvChanTailType, rows[static_cast<size_t>(u * kT + r)], block.data() + r * kW,
                                 kW);
      }
      detail::quantize_chan_block_host(block.data(), kW, kW, dst[static_cast<size_t>(u)],
                                       seq_start[static_cast<size_t>(u)] != 0);
    }
    std::vector<float> scores(static_cast<size_t>(n_tokens) * kHeads * kMaxKeys);
    ChanAttentionArgs a;
    a.q = q.data();
    a.q_stride = qw;
    a.out = got.data();
    a.scores = scores.data();
    a.max_keys = kMaxKeys;
    a.pos = pos.data();
    a.seq_of = seq_of.data();
    a.block_tables = tables.data();
    a.table_start = table_start.data();
    a.c0 = c0.data();
    a.q_start = q_start.data();
    a.tail_k = tail_k.data();
    a.tail_v = tail_v.data();
    a.step_k = step_k.data();
    a.step_v = step_v.data();
    a.k_blocks = k_plane_.data();
    a.v_blocks = v_plane_.data();
    a.block_stride = kT * k_row_;
    a.v_row_bytes = v_row_;
    a.v_block_stride = kT * v_row_;
    a.n_tokens = n_tokens;
    a.n_head = kHeads;
    a.n_head_kv = kHeadsKv;
    a.head_dim = kHd;
    a.scale = 0.125f;
    chan_attention_host(a);
    for (int64_t i = 0; i < int64_t{n_tokens} * kHeads; ++i) cpu::hadamard_rotate(got.data() + i * kHd, kHd);
    update_chan_tails_host(c);

    for (size_t i = 0; i < runs.size(); ++i) seqs_[runs[i].seq].len += runs[i].n;
    return max_diff(got, want);
  }

  // The pool's K groups and the tails, CPU against CUDA.
  void expect_same_state(const std::string& what) const {
    for (int32_t b = 0; b < kBlocks; ++b) {
      EXPECT_EQ(std::memcmp(cpu_pool_.data() + b * span_, k_plane_.data() + b * kT * k_row_, kT * k_row_), 0)
          << what << ": block " << b << "'s K group";
    }
    for (int32_t slot = 0; slot < 2; ++slot) {
      KvTailHeader hc, hg;
      std::memcpy(&hc, cpu_tails_.data() + slot * tail_stride_, sizeof hc);
      std::memcpy(&hg, cuda_tails_.data() + slot * tail_stride_, sizeof hg);
      EXPECT_EQ(hg.group_start, hc.group_start) << what << ": slot " << slot;
      EXPECT_EQ(hg.n_rows, hc.n_rows) << what << ": slot " << slot;
      const size_t n = static_cast<size_t>(std::max(0, hc.n_rows)) * tail_row_;
      for (size_t side = 0; side < 2; ++side) {
        const size_t at = slot * tail_stride_ + sizeof(KvTailHeader) + side * kT * tail_row_;
        EXPECT_EQ(std::memcmp(cpu_tails_.data() + at, cuda_tails_.data() + at, n), 0)
            << what << ": slot " << slot << (side ? " V" : " K") << " rows";
      }
    }
  }

  int32_t len(int s) const { return seqs_[s].len; }
  // The scratch slot's header (the padding's: group_start 0, and 1 or 0 rows).
  KvTailHeader scratch_header() const {
    KvTailHeader h;
    std::memcpy(&h, cuda_tails_.data() + 2 * tail_stride_, sizeof h);
    return h;
  }

 private:
  static double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::fabs(double(a[i]) - b[i]);
      m = std::isnan(d) ? INFINITY : std::max(m, d);
    }
    return a.size() == b.size() ? m : INFINITY;
  }

  size_t tail_row_ = 0, k_row_ = 0, v_row_ = 0, span_ = 0, tail_stride_ = 0;
  SeqData seqs_[2];
  std::vector<uint8_t> cpu_pool_, k_plane_, v_plane_, cpu_tails_, cuda_tails_;
};

TEST(CudaKvChanStep, HostRunIsTheCpuBackendsFlow) {
  K4cLayer layer;
  // Sequence 0 (tail slot 1) and 1 (slot 0): positions after each step in
  // the comments.
  const std::vector<std::vector<StepRun>> steps = {
      {{0, 20}, {1, 40}},  // 20; 40 (the sink block [0, 32) of 1 from step rows alone)
      {{1, 30}, {0, 27}},  // 70 (block [32, 64): 8 tail rows, 24 step rows; [64, 70) left); 47
      {{0, 1}, {1, 1}},    // decode: 48; 71
      {{0, 1}, {1, 1}},    // 49; 72
      {{0, 15}},           // 64: the block [32, 64) completed, the tail left empty
      {{0, 36}, {1, 19}},  // 100 (64 .. 96 a block from step rows, 4 left); 91
      {{1, 1}, {0, 1}},    // 92; 101
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string what = "step " + std::to_string(i);
    if (i == 2) {  // the probe, on a copy: step 2 with the tails exchanged (both hold rows)
      K4cLayer probe = layer;
      EXPECT_GT(probe.step(steps[i], /*swapped=*/true), 1e-2) << "a step that read the other sequence's tail";
    }
    const bool decode = std::all_of(steps[i].begin(), steps[i].end(), [](const StepRun& r) { return r.n == 1; });
    const double d = layer.step(steps[i], false, /*padded=*/decode);
    EXPECT_LE(d, 2e-5) << what << ": outputs";
    layer.expect_same_state(what);
  }
  EXPECT_EQ(layer.scratch_header().group_start, 0);  // the padding went to the scratch slot
  EXPECT_LE(layer.scratch_header().n_rows, 1);
  EXPECT_EQ(layer.len(0), 101);
  EXPECT_EQ(layer.len(1), 92);
}

// The device kernels against their host builds over one step of three
// sequences (a decode token completing a block, a chunk continuing a tail
// of 30 rows and completing three blocks, the sink block among them, a
// prompt from 0): the plan (units, every row
// pointer as (buffer, offset), blocks, the sink flag, c0 and the tails),
// the encoder launched for more units than exist (the rest must skip:
// their pointers are poison), and the tails after the update.
TEST(CudaKvChanStep, DeviceRunIsTheHostRun) {
  RILL_REQUIRE_GPU();
  const size_t row = row_bytes(cpu::kKvChanTailType, kW), k_block = kT * row_bytes(kKvQ4Chan, kW);
  const size_t stride = sizeof(KvTailHeader) + 2 * kT * row;
  const std::vector<int32_t> q_start = {0, 1, 71}, q_len = {1, 70, 40}, kv_len = {64, 100, 40}, kv_tail = {2, 0, 1},
                             table_start = {0, 4, 8}, tables = {9, 3, 8, 1, 0, 2, 4, 6, 5, 7, 10, 11};
  const auto n_tokens = 111;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<uint8_t> tails(3 * stride, 0), step_k(static_cast<size_t>(n_tokens) * row), step_v(step_k.size());
  std::vector<float> k(kW), v(kW);
  auto rows_of = [&](uint8_t* kd, uint8_t* vd) {
    for (int32_t c = 0; c < kW; ++c) k[c] = nd(rng), v[c] = nd(rng);
    cpu::store_chan_tail_rows(k.data(), v.data(), true, kHeadsKv, kHd, kd, vd);
  };
  for (int32_t t = 0; t < n_tokens; ++t) rows_of(step_k.data() + t * row, step_v.data() + t * row);
  for (int32_t slot = 0; slot < 3; ++slot) {
    for (int32_t r = 0; r < kT; ++r) {
      uint8_t* base = tails.data() + slot * stride + sizeof(KvTailHeader);
      rows_of(base + r * row, base + (kT + r) * row);
    }
  }
  const int32_t n_seqs = 3, max_units = chan_max_units(n_tokens, n_seqs);
  std::vector<uint8_t> k_plane(12 * k_block, 0);
  // Host.
  std::vector<const uint8_t*> h_rows(static_cast<size_t>(max_units) * kT), h_tk(3), h_tv(3);
  std::vector<uint8_t*> h_dst(static_cast<size_t>(max_units));
  std::vector<uint8_t> h_start(static_cast<size_t>(max_units));
  std::vector<int32_t> h_units(2 * static_cast<size_t>(max_units)), h_c0(3);
  int32_t h_n = -1;
  std::vector<uint8_t> h_tails = tails, h_plane = k_plane;
  ChanStepArgs h;
  h.n_seqs = n_seqs;
  h.q_start = q_start.data();
  h.q_len = q_len.data();
  h.kv_len = kv_len.data();
  h.kv_tail = kv_tail.data();
  h.table_start = table_start.data();
  h.block_tables = tables.data();
  h.tails = h_tails.data();
  h.tail_stride = stride;
  h.step_k = step_k.data();
  h.step_v = step_v.data();
  h.k_blocks = h_plane.data();
  h.k_block_stride = k_block;
  h.width = kW;
  h.max_units = max_units;
  h.rows = h_rows.data();
  h.dst = h_dst.data();
  h.sequence_start = h_start.data();
  h.n_units = &h_n;
  h.units = h_units.data();
  h.c0 = h_c0.data();
  h.tail_k = h_tk.data();
  h.tail_v = h_tv.data();
  plan_chan_step_host(h);
  ASSERT_EQ(h_n, 1 + 3 + 1);  // [32, 64) of 0; [0, 32) (30 tail rows), [32, 64), [64, 96) of 1; [0, 32) of 2
  std::vector<float> block(static_cast<size_t>(kT * kW));
  for (int32_t u = 0; u < h_n; ++u) {
    for (int32_t r = 0; r < kT; ++r) {
      cpu::ref::dequantize_row(cpu::kKvChanTailType, h_rows[static_cast<size_t>(u * kT + r)], block.data() + r * kW,
                               kW);
    }
    detail::quantize_chan_block_host(block.data(), kW, kW, h_dst[static_cast<size_t>(u)], h_start[u] != 0);
  }
  update_chan_tails_host(h);
  // Device.
  auto d_q_start = upload(q_start), d_q_len = upload(q_len), d_kv_len = upload(kv_len), d_kv_tail = upload(kv_tail),
       d_table_start = upload(table_start), d_tables = upload(tables), d_tails = upload(tails),
       d_step_k = upload(step_k), d_step_v = upload(step_v), d_plane = upload(k_plane);
  auto d_rows = upload(std::vector<uint64_t>(static_cast<size_t>(max_units) * kT, 0x8)),  // poison pointers
      d_dst = upload(std::vector<uint64_t>(static_cast<size_t>(max_units), 0x8)),
       d_start = upload(std::vector<uint8_t>(static_cast<size_t>(max_units), 7)),
       d_units = upload(std::vector<int32_t>(2 * static_cast<size_t>(max_units))),
       d_n = upload(std::vector<int32_t>{-1}), d_c0 = upload(std::vector<int32_t>(3)),
       d_tk = upload(std::vector<uint64_t>(3)), d_tv = upload(std::vector<uint64_t>(3));
  ChanStepArgs d = h;
  d.q_start = d_q_start.as<int32_t>();
  d.q_len = d_q_len.as<int32_t>();
  d.kv_len = d_kv_len.as<int32_t>();
  d.kv_tail = d_kv_tail.as<int32_t>();
  d.table_start = d_table_start.as<int32_t>();
  d.block_tables = d_tables.as<int32_t>();
  d.tails = d_tails.as<uint8_t>();
  d.step_k = d_step_k.as<uint8_t>();
  d.step_v = d_step_v.as<uint8_t>();
  d.k_blocks = d_plane.as<uint8_t>();
  d.rows = d_rows.as<const uint8_t*>();
  d.dst = d_dst.as<uint8_t*>();
  d.sequence_start = d_start.as<uint8_t>();
  d.n_units = d_n.as<int32_t>();
  d.units = d_units.as<int32_t>();
  d.c0 = d_c0.as<int32_t>();
  d.tail_k = d_tk.as<const uint8_t*>();
  d.tail_v = d_tv.as<const uint8_t*>();
  plan_chan_step(d, nullptr);
  ChanEncodeArgs e;
  e.rows = d.rows;
  e.dst = d.dst;
  e.sequence_start = d.sequence_start;
  e.row_dtype = cpu::kKvChanTailType;
  e.n_units = max_units;  // more than exist: the rest skip
  e.width = kW;
  e.n_units_dev = d.n_units;
  quantize_chan_blocks(e, nullptr);
  update_chan_tails(d, nullptr);
  RILL_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_EQ(download<int32_t>(d_n, 1)[0], h_n);
  // Pointers as offsets from the buffer they point into: 0 tails, 1 step_k, 2 the plane.
  auto where = [](const uint8_t* p, const uint8_t* const bases[3], const size_t sizes[3]) {
    for (int b = 0; b < 3; ++b) {
      if (p >= bases[b] && p < bases[b] + sizes[b]) return std::pair<int, size_t>{b, size_t(p - bases[b])};
    }
    return std::pair<int, size_t>{-1, 0};
  };
  const size_t sizes[3] = {tails.size(), step_k.size(), k_plane.size()};
  const uint8_t* const hb[3] = {h_tails.data(), step_k.data(), h_plane.data()};
  const uint8_t* const db[3] = {d.tails, d.step_k, d.k_blocks};
  const auto g_rows = download<uint64_t>(d_rows, h_rows.size()), g_dst = download<uint64_t>(d_dst, h_dst.size());
  const auto g_start = download<uint8_t>(d_start, h_start.size());
  for (int32_t u = 0; u < h_n; ++u) {
    EXPECT_EQ(where(reinterpret_cast<const uint8_t*>(g_dst[u]), db, sizes), where(h_dst[u], hb, sizes)) << u;
    EXPECT_EQ(g_start[u], h_start[u]) << u;
    for (int32_t r = 0; r < kT; ++r) {
      const size_t i = static_cast<size_t>(u * kT + r);
      EXPECT_EQ(where(reinterpret_cast<const uint8_t*>(g_rows[i]), db, sizes), where(h_rows[i], hb, sizes))
          << "unit " << u << " row " << r;
    }
  }
  EXPECT_EQ(download<int32_t>(d_c0, 3), h_c0);
  const auto g_tk = download<uint64_t>(d_tk, 3), g_tv = download<uint64_t>(d_tv, 3);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(where(reinterpret_cast<const uint8_t*>(g_tk[s]), db, sizes), where(h_tk[s], hb, sizes)) << s;
    EXPECT_EQ(where(reinterpret_cast<const uint8_t*>(g_tv[s]), db, sizes), where(h_tv[s], hb, sizes)) << s;
  }
  EXPECT_TRUE(download<uint8_t>(d_plane, k_plane.size()) == h_plane) << "the encoded K groups";
  EXPECT_TRUE(download<uint8_t>(d_tails, tails.size()) == h_tails) << "the tails after the update";
}

}  // namespace
}  // namespace rill::cuda
