// The fast k4c / k4a attention (backend/cuda/attention_chan.h
// chan_attention_fast) against the reference kernel
// (chan_attention_parallel, itself held to the CPU's by
// attention_chan_cuda_test.cpp) over batches of sequences of different
// lengths in one shared, shuffled pool of KV blocks:
//  - head_dim 64 and 128, GQA 1, 4 and 8, k4c (q4c groups) and k4a (q4a's
//    planes under random widths 0..8, pairs summing to 8: 4 a channel on
//    average), without and with a window and softcap;
//  - sequences of 1, 31, 32, 33, 100, 1,000 and 5,000 keys (and more
//    lengths, so the tail before the step holds 0..31 rows), steps of 1, 5
//    and 40 query tokens (steps are capped at the sequence's length);
//  - tolerance: max |fast - reference| <= 2e-3 * the output's scale (the
//    batch's largest |reference output|, at least 1e-2); the worst seen is
//    printed on a `[ k4c fast ]` line;
//  - batch invariance: a sequence's outputs alone are its outputs in a
//    batch with 9 other sequences, bit for bit (the split plan is the
//    query's own); determinism: two calls give the same bits.
// The host runs (the kernel's phases thread after thread, no GPU needed)
// check the algorithm on any machine; the device runs check the kernel.
// The flash prefill kernel (chan_attention_flash, CudaChanFlashAttention):
// against the reference within 5e-3 of the scale (f16 rounding), a group of
// 3 too and a 512-token step; its rotation back byte-equal to
// rotate_heads_back; batch invariant bit for bit; its time beside the
// token tiles'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kv_alloc.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/attention_chan.h"
#include "backend/cuda/kv_chan.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;
constexpr int64_t kT = cpu::kKvChanTokens;

struct Shape {
  int32_t n_head, n_head_kv, hd, window;
  float softcap;
  bool alloc;  // k4a
};

struct SeqSpec {
  int64_t n;      // keys after the step (positions 0 .. n - 1)
  int64_t steps;  // the step's query tokens: positions [n - steps, n)
  uint32_t seed;  // the sequence's data (the same whatever the batch)
};

// A batch's host buffers in the layout ChanAttentionArgs reads.
struct Batch {
  Shape shape{};
  int64_t width = 0;
  size_t tail_row = 0, k_row = 0, v_row = 0, block_bytes = 0;
  int32_t n_tokens = 0, max_keys = 0;
  std::vector<float> q;  // [n_tokens, n_head * hd]
  std::vector<int32_t> pos, seq_of, tables, table_start, c0, q_start;
  std::vector<std::vector<uint8_t>> tail_k, tail_v;  // [seq] 32 rows each
  std::vector<uint8_t> step_k, step_v, kb, vb;
  std::vector<uint8_t> widths, widths_table;  // k4a
  std::vector<int32_t> first_token;           // [seq]: its first token in the batch
};

Batch make_batch(const Shape& sh, const std::vector<SeqSpec>& seqs, uint32_t pool_seed) {
  Batch bt;
  bt.shape = sh;
  bt.width = int64_t{sh.n_head_kv} * sh.hd;
  const int64_t width = bt.width;
  bt.tail_row = row_bytes(cpu::kKvChanTailType, width);
  if (sh.alloc) {  // the widths depend on the shape only (a layer's table)
    std::mt19937 rng(7);
    bt.widths.resize(static_cast<size_t>(width));
    for (int64_t ch = 0; ch + 1 < width; ch += 2) {
      const auto w = static_cast<uint8_t>(rng() % 9);
      bt.widths[static_cast<size_t>(ch)] = w;
      bt.widths[static_cast<size_t>(ch + 1)] = static_cast<uint8_t>(8 - w);
    }
    std::shuffle(bt.widths.begin(), bt.widths.end(), rng);
    bt.widths_table.resize(alloc_table_bytes(width));
    fill_alloc_table(bt.widths.data(), width, bt.widths_table.data());
  }
  bt.k_row = row_bytes(sh.alloc ? kKvQ4Alloc : kKvQ4Chan, width);
  bt.v_row = row_bytes(kKvIq4Nl64, width);
  bt.block_bytes = std::max(bt.k_row, bt.v_row) * kT;
  int64_t total_blocks = 0;
  for (const SeqSpec& s : seqs) total_blocks += (s.n + kT - 1) / kT;
  std::vector<int32_t> phys(static_cast<size_t>(total_blocks));
  std::iota(phys.begin(), phys.end(), 0);
  std::mt19937 pool_rng(pool_seed);
  std::shuffle(phys.begin(), phys.end(), pool_rng);
  bt.kb.assign(static_cast<size_t>(total_blocks) * bt.block_bytes, 0);
  bt.vb.assign(bt.kb.size(), 0);
  const int64_t qw = int64_t{sh.n_head} * sh.hd;
  size_t next_block = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const SeqSpec& s = seqs[si];
    std::mt19937 rng(s.seed);
    std::normal_distribution<float> nd;
    std::vector<float> k(static_cast<size_t>(s.n * width)), v(k.size());
    for (int64_t t = 0; t < s.n; ++t) {
      for (int64_t ch = 0; ch < width; ++ch) {
        k[static_cast<size_t>(t * width + ch)] = ch % sh.hd == 5 ? 6.0f + 3.0f * nd(rng) : nd(rng);
        v[static_cast<size_t>(t * width + ch)] = nd(rng);
      }
    }
    std::vector<uint8_t> k_rows(static_cast<size_t>(s.n) * bt.tail_row), v_rows(k_rows.size());
    for (int64_t t = 0; t < s.n; ++t) {
      cpu::store_chan_tail_rows(k.data() + t * width, v.data() + t * width, true, sh.n_head_kv, sh.hd,
                                k_rows.data() + t * bt.tail_row, v_rows.data() + t * bt.tail_row);
    }
    const int64_t n_blocks = (s.n + kT - 1) / kT;
    bt.table_start.push_back(static_cast<int32_t>(bt.tables.size()));
    for (int64_t b = 0; b < n_blocks; ++b) bt.tables.push_back(phys[next_block++]);
    const int32_t* table = bt.tables.data() + bt.table_start.back();
    std::vector<float> rows(static_cast<size_t>(kT * width));
    for (int64_t b = 0; (b + 1) * kT <= s.n; ++b) {  // every full block encoded (the step's too)
      for (int64_t r = 0; r < kT; ++r) {
        cpu::ref::dequantize_row(cpu::kKvChanTailType, k_rows.data() + (b * kT + r) * bt.tail_row,
                                 rows.data() + r * width, width);
      }
      uint8_t* dst = bt.kb.data() + static_cast<size_t>(table[b]) * bt.block_bytes;
      if (sh.alloc) {
        cpu::quantize_alloc_block(rows.data(), width, width, bt.widths.data(), dst, b == 0);
      } else {
        cpu::quantize_chan_block(rows.data(), width, width, dst, b == 0);
      }
    }
    for (int64_t t = 0; t < s.n; ++t) {
      cpu::store_kv_row(
          kKvIq4Nl64, true, v.data() + t * width,
          bt.vb.data() + static_cast<size_t>(table[t / kT]) * bt.block_bytes + static_cast<size_t>(t % kT) * bt.v_row,
          sh.n_head_kv, sh.hd);
    }
    const int64_t c0 = s.n - s.steps, tail_start = c0 - c0 % kT;
    std::vector<uint8_t> tk(static_cast<size_t>(kT) * bt.tail_row, 0x77), tv = tk;
    std::copy(k_rows.begin() + tail_start * bt.tail_row, k_rows.begin() + c0 * bt.tail_row, tk.begin());
    std::copy(v_rows.begin() + tail_start * bt.tail_row, v_rows.begin() + c0 * bt.tail_row, tv.begin());
    bt.tail_k.push_back(tk);
    bt.tail_v.push_back(tv);
    bt.c0.push_back(static_cast<int32_t>(c0));
    bt.q_start.push_back(bt.n_tokens);
    bt.first_token.push_back(bt.n_tokens);
    bt.step_k.insert(bt.step_k.end(), k_rows.begin() + c0 * bt.tail_row, k_rows.end());
    bt.step_v.insert(bt.step_v.end(), v_rows.begin() + c0 * bt.tail_row, v_rows.end());
    for (int64_t t = c0; t < s.n; ++t) {
      bt.pos.push_back(static_cast<int32_t>(t));
      bt.seq_of.push_back(static_cast<int32_t>(si));
      for (int64_t e = 0; e < qw; ++e) bt.q.push_back(0.3f * nd(rng));
    }
    bt.n_tokens += static_cast<int32_t>(s.steps);
    bt.max_keys = std::max(bt.max_keys, static_cast<int32_t>(s.n));
  }
  return bt;
}

// ChanAttentionArgs over the batch's buffers at the given addresses (host
// or device).
struct Ptrs {
  const float* q;
  float *out, *scores, *partials;
  const int32_t *pos, *seq_of, *tables, *table_start, *c0, *q_start;
  const uint8_t *const *tail_k, *const *tail_v;
  const uint8_t *step_k, *step_v, *kb, *vb, *k_widths;
};
ChanAttentionArgs args(const Batch& bt, const Ptrs& p, bool tile = false, bool warp = false) {
  const Shape& sh = bt.shape;
  ChanAttentionArgs a;
  a.q = p.q;
  a.q_stride = int64_t{sh.n_head} * sh.hd;
  a.out = p.out;
  a.scores = p.scores;
  a.partials = p.partials;
  a.max_keys = bt.max_keys;
  a.pos = p.pos;
  a.seq_of = p.seq_of;
  a.block_tables = p.tables;
  a.table_start = p.table_start;
  a.c0 = p.c0;
  a.q_start = p.q_start;
  a.tail_k = p.tail_k;
  a.tail_v = p.tail_v;
  a.step_k = p.step_k;
  a.step_v = p.step_v;
  a.k_blocks = p.kb;
  a.v_blocks = p.vb;
  a.block_stride = bt.block_bytes;
  a.v_row_bytes = bt.v_row;
  a.k_widths = sh.alloc ? p.k_widths : nullptr;
  a.n_tokens = bt.n_tokens;
  a.n_head = sh.n_head;
  a.n_head_kv = sh.n_head_kv;
  a.head_dim = sh.hd;
  a.window = sh.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
  a.softcap = sh.softcap;
  a.tile_tokens = tile;
  a.warp_softmax = warp;
  return a;
}

size_t out_floats(const Batch& bt) {
  return static_cast<size_t>(bt.n_tokens) * static_cast<size_t>(bt.shape.n_head) * static_cast<size_t>(bt.shape.hd);
}

// The reference's or the fast kernel's outputs (f32, V's rotated basis).
std::vector<float> host_run(const Batch& bt, bool fast, bool tile = false, bool warp = false) {
  std::vector<float> out(out_floats(bt), NAN);
  std::vector<float> scores(static_cast<size_t>(bt.n_tokens) * bt.shape.n_head * bt.max_keys);
  std::vector<float> partials(chan_fast_partial_floats(bt.n_tokens, bt.shape.n_head, bt.shape.hd), NAN);
  std::vector<const uint8_t*> tk, tv;
  for (size_t s = 0; s < bt.tail_k.size(); ++s) {
    tk.push_back(bt.tail_k[s].data());
    tv.push_back(bt.tail_v[s].data());
  }
  const Ptrs p{bt.q.data(),           out.data(),        scores.data(),    partials.data(),
               bt.pos.data(),         bt.seq_of.data(),  bt.tables.data(), bt.table_start.data(),
               bt.c0.data(),          bt.q_start.data(), tk.data(),        tv.data(),
               bt.step_k.data(),      bt.step_v.data(),  bt.kb.data(),     bt.vb.data(),
               bt.widths_table.data()};
  if (fast) {
    chan_attention_fast_host(args(bt, p, tile, warp));
  } else {
    chan_attention_parallel_host(args(bt, p));
  }
  return out;
}

// The batch on the device through kernel k (the reference, the fast kernel
// or the flash prefill kernel), `calls` times into the same output (each
// call's bits returned). ms set: then the median of 20 timed calls in *ms
// (milliseconds a call). rotated set (the fast or flash kernel): after the
// calls, the outputs rotated back in rotated_dtype by the kernel itself
// (ChanAttentionArgs::rotated_out) and by rotate_heads_back of its f32
// outputs, their bytes; ms set too: the fused call's median time in
// `ms`.
// kFlashBatched: the flash kernel with ChanAttentionArgs::flash_batched_loads.
enum class Kernel { kRef, kFast, kFlash, kFlashBatched };
void call(Kernel k, ChanAttentionArgs a) {
  if (k == Kernel::kFast) {
    chan_attention_fast(a, nullptr);
  } else if (k == Kernel::kFlash || k == Kernel::kFlashBatched) {
    a.flash_batched_loads = k == Kernel::kFlashBatched;
    chan_attention_flash(a, nullptr);
  } else {
    chan_attention_parallel(a, nullptr);
  }
}
struct Rotated {
  DType dtype = DType::kF32;
  std::vector<uint8_t> fused, separate;
  double ms = 0.0;
};
std::vector<std::vector<float>> device_run(const Batch& bt, Kernel k, int calls = 1, double* ms = nullptr,
                                           bool tile = false, bool warp = false, Rotated* rotated = nullptr) {
  auto d_q = upload(bt.q);
  auto d_out = poisoned(out_floats(bt) * 4);
  auto d_scores = poisoned(static_cast<size_t>(bt.n_tokens) * bt.shape.n_head * bt.max_keys * 4);
  auto d_part = poisoned(chan_fast_partial_floats(bt.n_tokens, bt.shape.n_head, bt.shape.hd) * 4);
  auto d_pos = upload(bt.pos), d_seq = upload(bt.seq_of), d_tables = upload(bt.tables), d_ts = upload(bt.table_start),
       d_c0 = upload(bt.c0), d_qs = upload(bt.q_start);
  std::vector<DeviceBuffer> tails;
  std::vector<const uint8_t*> tk, tv;
  for (size_t s = 0; s < bt.tail_k.size(); ++s) {
    tails.push_back(upload(bt.tail_k[s]));
    tk.push_back(tails.back().as<uint8_t>());
    tails.push_back(upload(bt.tail_v[s]));
    tv.push_back(tails.back().as<uint8_t>());
  }
  auto d_tk = upload(tk), d_tv = upload(tv);
  auto d_step_k = upload(bt.step_k), d_step_v = upload(bt.step_v), d_kb = upload(bt.kb), d_vb = upload(bt.vb);
  auto d_widths = upload(bt.widths_table.empty() ? std::vector<uint8_t>(1, 0) : bt.widths_table);
  const Ptrs p{d_q.as<float>(),        d_out.as<float>(),      d_scores.as<float>(),      d_part.as<float>(),
               d_pos.as<int32_t>(),    d_seq.as<int32_t>(),    d_tables.as<int32_t>(),    d_ts.as<int32_t>(),
               d_c0.as<int32_t>(),     d_qs.as<int32_t>(),     d_tk.as<const uint8_t*>(), d_tv.as<const uint8_t*>(),
               d_step_k.as<uint8_t>(), d_step_v.as<uint8_t>(), d_kb.as<uint8_t>(),        d_vb.as<uint8_t>(),
               d_widths.as<uint8_t>()};
  std::vector<std::vector<float>> outs;
  for (int i = 0; i < calls; ++i) {
    call(k, k == Kernel::kFast ? args(bt, p, tile, warp) : args(bt, p));
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    outs.push_back(download<float>(d_out, out_floats(bt)));
  }
  if (rotated) {
    const size_t bytes = row_bytes(rotated->dtype, static_cast<int64_t>(out_floats(bt)));
    auto d_sep = poisoned(bytes), d_fused = poisoned(bytes);
    rotate_heads_back(d_out.as<float>(), int64_t{bt.shape.n_head} * bt.shape.hd, bt.n_tokens, bt.shape.n_head,
                      bt.shape.hd, rotated->dtype, d_sep.data(), nullptr);
    ChanAttentionArgs a = args(bt, p, tile, warp);
    a.rotated_out = d_fused.data();
    a.rotated_dtype = rotated->dtype;
    call(k, a);
    RILL_CUDA_CHECK(cudaDeviceSynchronize());
    rotated->separate = download<uint8_t>(d_sep, bytes);
    rotated->fused = download<uint8_t>(d_fused, bytes);
    if (ms) rotated->ms = median_ms([&] { call(k, a); });
  }
  if (ms) *ms = median_ms([&] { call(k, k == Kernel::kFast ? args(bt, p, tile, warp) : args(bt, p)); });
  return outs;
}

std::string name(const Shape& sh) {
  return std::string(sh.alloc ? "k4a" : "k4c") + " heads " + std::to_string(sh.n_head) + "/" +
         std::to_string(sh.n_head_kv) + " hd " + std::to_string(sh.hd) + " window " + std::to_string(sh.window) +
         " softcap " + std::to_string(sh.softcap);
}

// The sequences of a batch: key counts with each step that fits, and
// lengths whose tails before the step hold 0..31 rows. size 0: up to 300
// keys (the host's runs), 1: up to 1,000, 2: up to 5,000 (the brief's
// counts: 1, 31, 32, 33, 100, 1,000 and 5,000).
std::vector<SeqSpec> batch_specs(int size, uint32_t seed) {
  std::vector<SeqSpec> v;
  const bool big = size == 2;
  std::vector<int64_t> keys = {1, 31, 32, 33, 100, 300};
  if (size >= 1) keys.push_back(1000);
  if (size >= 2) keys.push_back(5000);
  for (const int64_t n : keys) {
    for (const int64_t steps : {1, 5, 40}) {
      if (steps > n) continue;
      if (big && n == 5000 && steps == 40) continue;  // the reference is slow there; 5000 x 1 and x 5 remain
      v.push_back({n, steps, seed + static_cast<uint32_t>(v.size())});
    }
  }
  for (int64_t tail = 0; tail < 32; tail += 3) {  // c0 % 32 = tail, steps 1 and 5
    v.push_back({64 + tail + 1, 1, seed + static_cast<uint32_t>(v.size())});
    v.push_back({96 + tail + 5, 5, seed + static_cast<uint32_t>(v.size())});
  }
  return v;
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (const bool alloc : {false, true}) {
    for (const int32_t hd : {64, 128}) {
      for (const int32_t group : {1, 4, 8}) {
        const int32_t n_head_kv = 2;
        v.push_back({n_head_kv * group, n_head_kv, hd, 0, 0.0f, alloc});
        v.push_back({n_head_kv * group, n_head_kv, hd, 100, 30.0f, alloc});
      }
    }
  }
  return v;
}

struct Worst {
  double rel = 0.0;
  std::string where;
};

// max |got - want| / scale within bound (scale: max |want|, at least 1e-2).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what, Worst& worst,
                  double bound = 2e-3) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1e-2, diff = 0.0;
  for (const float w : want) scale = std::max(scale, double{std::fabs(w)});
  for (size_t e = 0; e < want.size(); ++e) {
    ASSERT_TRUE(std::isfinite(got[e])) << what << " elem " << e;
    diff = std::max(diff, double{std::fabs(got[e] - want[e])});
  }
  const double rel = diff / scale;
  if (rel > worst.rel) worst = {rel, what};
  EXPECT_LE(rel, bound) << what << ": max |diff| " << diff << ", scale " << scale;
}

// The algorithm (the kernel's phases on the host) against the reference's
// host run: no GPU needed.
TEST(CudaChanFastAttention, HostRunMatchesTheReference) {
  Worst worst, worst_warp;
  uint32_t seed = 100;
  for (const Shape& sh : shapes()) {
    const Batch bt = make_batch(sh, batch_specs(0, seed), seed);
    const std::vector<float> want = host_run(bt, false);
    expect_close(host_run(bt, true), want, "host " + name(sh), worst);
    expect_close(host_run(bt, true, false, true), want, "host warp " + name(sh), worst_warp);
    seed += 100;
  }
  std::printf("[ k4c fast ] host: worst max|diff| / scale %.3g (%s)\n", worst.rel, worst.where.c_str());
  std::printf("[ k4c fast ] host warp softmax: worst max|diff| / scale %.3g (%s)\n", worst_warp.rel,
              worst_warp.where.c_str());
}

// The host run of one long sequence (5,000 keys, 32 splits of 5 blocks):
// the splits' merge.
TEST(CudaChanFastAttention, HostRunLongSequence) {
  Worst worst;
  for (const bool alloc : {false, true}) {
    const Shape sh{8, 2, 128, 0, 0.0f, alloc};
    const Batch bt = make_batch(sh, {{5000, 1, 5}, {1000, 5, 6}}, 9);
    expect_close(host_run(bt, true), host_run(bt, false), "host long " + name(sh), worst);
  }
  std::printf("[ k4c fast ] host long: worst max|diff| / scale %.3g (%s)\n", worst.rel, worst.where.c_str());
}

// The device kernel against the device reference over every shape and the
// brief's key counts (5,000 keys with heads of 128; 1,000 at most with 64,
// to keep the host's encoding of the batches short).
TEST(CudaChanFastAttention, DeviceMatchesTheReference) {
  RILL_REQUIRE_GPU();
  Worst worst, worst_warp;
  uint32_t seed = 1000;
  for (const Shape& sh : shapes()) {
    const Batch bt = make_batch(sh, batch_specs(sh.hd == 128 ? 2 : 1, seed), seed);
    const std::vector<float> want = device_run(bt, Kernel::kRef)[0];
    const std::vector<std::vector<float>> got = device_run(bt, Kernel::kFast, 2);
    expect_close(got[0], want, "device " + name(sh), worst);
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
        << name(sh) << ": two calls differ";
    const std::vector<std::vector<float>> warp = device_run(bt, Kernel::kFast, 2, nullptr, false, true);
    expect_close(warp[0], want, "device warp " + name(sh), worst_warp);
    EXPECT_EQ(std::memcmp(warp[0].data(), warp[1].data(), warp[0].size() * sizeof(float)), 0)
        << name(sh) << ": two warp-softmax calls differ";
    seed += 1000;
  }
  std::printf("[ k4c fast ] device: worst max|diff| / scale %.3g (%s)\n", worst.rel, worst.where.c_str());
  std::printf("[ k4c fast ] device warp softmax: worst max|diff| / scale %.3g (%s)\n", worst_warp.rel,
              worst_warp.where.c_str());
}

// Token tiles (a.tile_tokens: a thread block's rows span several tokens
// of a sequence) change no bit: every shape over the batches of steps of 1,
// 5 and 40 tokens (runs cut by block boundaries, windows, softcaps), on the
// host and, with a GPU, on the device (heads of 128 there: the 5,000-key
// sequences too).
TEST(CudaChanFastAttention, TokenTilesChangeNoBit) {
  const bool gpu = device_available();
  uint32_t seed = 300;
  for (const Shape& sh : shapes()) {
    const Batch bt = make_batch(sh, batch_specs(0, seed), seed);
    const std::vector<float> plain = host_run(bt, true), tiled = host_run(bt, true, true);
    EXPECT_EQ(std::memcmp(plain.data(), tiled.data(), plain.size() * sizeof(float)), 0) << "host " << name(sh);
    if (gpu) {
      const Batch big = make_batch(sh, batch_specs(sh.hd == 128 ? 2 : 1, seed), seed);
      const std::vector<float> a = device_run(big, Kernel::kFast)[0],
                               b = device_run(big, Kernel::kFast, 1, nullptr, true)[0];
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "device " << name(sh);
    }
    seed += 100;
  }
}

// The combine's fused rotation back (what the backend runs) is
// rotate_heads_back over the combine's f32 outputs, byte for byte, in f32,
// f16 and bf16, decode and tiled, every shape.
TEST(CudaChanFastAttention, FusedRotationIsRotateHeadsBack) {
  RILL_REQUIRE_GPU();
  uint32_t seed = 700;
  int compared = 0;
  for (const Shape& sh : shapes()) {
    const Batch bt = make_batch(sh, batch_specs(1, seed), seed);
    for (const DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (const bool tile : {false, true}) {
        Rotated r;
        r.dtype = dt;
        device_run(bt, Kernel::kFast, 1, nullptr, tile, !tile, &r);
        ASSERT_FALSE(r.fused.empty());
        EXPECT_EQ(r.fused, r.separate) << name(sh) << " dtype " << static_cast<int>(dt) << " tile " << tile;
        ++compared;
      }
    }
    seed += 100;
  }
  std::printf("[ k4c fast ] fused rotation: %d runs byte-equal to rotate_heads_back\n", compared);
}

// A target sequence alone, and the same sequence sixth in a batch of ten
// (five fixed ones before it, `after` after it: other lengths, steps and
// pool places); where its outputs start in the batch's, and how many.
struct AloneAndAmong {
  Batch alone, many;
  size_t at = 0, n = 0;
};
AloneAndAmong alone_and_among(const Shape& sh, const SeqSpec& target, const std::vector<SeqSpec>& after) {
  std::vector<SeqSpec> batch = {{50, 1, 1}, {2000, 1, 2}, {7, 5, 3}, {300, 40, 4}, {64, 1, 5}};
  batch.push_back(target);
  batch.insert(batch.end(), after.begin(), after.end());
  AloneAndAmong r{make_batch(sh, {target}, 11), make_batch(sh, batch, 12)};
  const size_t row = static_cast<size_t>(sh.n_head) * sh.hd;
  r.n = static_cast<size_t>(target.steps) * row;
  r.at = static_cast<size_t>(r.many.first_token[5]) * row;
  return r;
}

// A sequence's outputs alone are its outputs in a batch of 9 others (other
// lengths, steps, pool places), bit for bit, on the device (without one,
// the host run's).
TEST(CudaChanFastAttention, BatchInvariant) {
  const bool gpu = device_available();
  for (const bool alloc : {false, true}) {
    const Shape sh{32, 8, 128, 0, 0.0f, alloc};
    for (const SeqSpec target : {SeqSpec{1000, 1, 77}, SeqSpec{33, 5, 78}, SeqSpec{4100, 1, 79}}) {
      const AloneAndAmong in = alone_and_among(sh, target, {{5000, 1, 6}, {129, 1, 7}, {31, 1, 8}, {700, 5, 9}});
      const Batch &alone = in.alone, &many = in.many;
      const size_t n = in.n, at = in.at;
      const std::string what = name(sh) + " n " + std::to_string(target.n);
      if (gpu) {
        const std::vector<float> a = device_run(alone, Kernel::kFast)[0], b = device_run(many, Kernel::kFast)[0];
        EXPECT_EQ(std::memcmp(a.data(), b.data() + at, n * sizeof(float)), 0) << "device " << what;
        const std::vector<float> aw = device_run(alone, Kernel::kFast, 1, nullptr, false, true)[0];
        const std::vector<float> bw = device_run(many, Kernel::kFast, 1, nullptr, false, true)[0];
        EXPECT_EQ(std::memcmp(aw.data(), bw.data() + at, n * sizeof(float)), 0) << "device warp " << what;
      }
      if (!gpu && target.n <= 1000) {  // the host's run (where no GPU checks the kernel); slow for long keys
        const std::vector<float> a = host_run(alone, true), b = host_run(many, true);
        EXPECT_EQ(std::memcmp(a.data(), b.data() + at, n * sizeof(float)), 0) << "host " << what;
        const std::vector<float> aw = host_run(alone, true, false, true), bw = host_run(many, true, false, true);
        EXPECT_EQ(std::memcmp(aw.data(), bw.data() + at, n * sizeof(float)), 0) << "host warp " << what;
      }
    }
  }
}

// Prefill times at Llama-3.1-8B's shape: one sequence's step of 512 query
// tokens after 1,536 keys (a layer's attention call), a token a thread block
// against token tiles (a.tile_tokens), and the tiles' outputs bit for bit
// the untiled ones. Printed only: `[ k4c fast ] prefill` lines.
TEST(CudaChanFastAttention, DeviceTimingPrefill) {
  RILL_REQUIRE_GPU();
  for (const bool alloc : {false, true}) {
    const Shape sh{32, 8, 128, 0, 0.0f, alloc};
    const Batch bt = make_batch(sh, {{2048, 512, 41}}, 6);
    double plain_ms = 0, tiled_ms = 0;
    const std::vector<float> a = device_run(bt, Kernel::kFast, 1, &plain_ms)[0];
    const std::vector<float> b = device_run(bt, Kernel::kFast, 1, &tiled_ms, true)[0];
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << name(sh);
    std::printf("[ k4c fast ] prefill %s 512 tokens after 1536: a token a block %.1f us, token tiles %.1f us (%.2fx)\n",
                alloc ? "k4a" : "k4c", plain_ms * 1e3, tiled_ms * 1e3, plain_ms / tiled_ms);
  }
}

// Kernel times at Llama-3.1-8B's shape (32 query heads, 8 KV heads, head_dim
// 128): one decode token per sequence after ctx keys, B sequences reading
// the same blocks (the host encodes one sequence of 4,097 keys), a layer's
// attention call; the reference at B = 1 for comparison. Printed only (no
// limit): `[ k4c fast ] time` lines.
TEST(CudaChanFastAttention, DeviceTiming) {
  RILL_REQUIRE_GPU();
  for (const bool alloc : {false, true}) {
    const Shape sh{32, 8, 128, 0, 0.0f, alloc};
    const Batch one = make_batch(sh, {{4097, 1, 21}}, 5);
    const size_t qw = static_cast<size_t>(sh.n_head) * sh.hd;
    for (const int32_t ctx : {1024, 4096}) {
      for (const int B : {1, 64}) {
        Batch bt = one;
        bt.pos = {ctx};
        bt.c0 = {ctx};  // an empty tail: the step's row alone in the own block
        for (int s = 1; s < B; ++s) {
          bt.pos.push_back(ctx);
          bt.seq_of.push_back(s);
          bt.table_start.push_back(0);
          bt.c0.push_back(ctx);
          bt.q_start.push_back(s);
          bt.tail_k.push_back(one.tail_k[0]);
          bt.tail_v.push_back(one.tail_v[0]);
          bt.step_k.insert(bt.step_k.end(), one.step_k.begin(), one.step_k.end());
          bt.step_v.insert(bt.step_v.end(), one.step_v.begin(), one.step_v.end());
          bt.q.insert(bt.q.end(), one.q.begin(), one.q.begin() + static_cast<std::ptrdiff_t>(qw));
        }
        bt.n_tokens = B;
        double fast_ms = 0, ref_ms = 0, warp_ms = 0;
        const std::vector<float> got = device_run(bt, Kernel::kFast, 1, &fast_ms)[0];
        for (const float x : got) ASSERT_TRUE(std::isfinite(x));
        Rotated fused;  // the warp softmax with the rotation back fused into its combine (bf16 out)
        fused.dtype = DType::kBF16;
        device_run(bt, Kernel::kFast, 1, &warp_ms, false, true, &fused);
        if (B == 1) device_run(bt, Kernel::kRef, 1, &ref_ms);
        const double kv_mb = B * (ctx + 1.0) * (bt.k_row + bt.v_row) / 1e6;
        std::printf(
            "[ k4c fast ] time %s ctx %d batch %d: fast %.1f us (%.0f GB/s of K+V, %.1f MB), warp softmax %.1f us, "
            "with the rotation fused %.1f us%s\n",
            alloc ? "k4a" : "k4c", ctx, B, fast_ms * 1e3, kv_mb / 1e3 / (fast_ms / 1e3), kv_mb, warp_ms * 1e3,
            fused.ms * 1e3, B == 1 ? (", reference " + std::to_string(ref_ms * 1e3) + " us").c_str() : "");
      }
    }
  }
}

// The flash prefill kernel's shapes: the fast kernel's, a group of 3
// (SmolLM2's 9 query heads on 3 KV heads: tiles of 16 tokens, 48 rows),
// and groups of 16 and 64 (tiles of 4 tokens and of 1).
std::vector<Shape> flash_shapes() {
  std::vector<Shape> v = shapes();
  v.push_back({9, 3, 64, 0, 0.0f, false});
  v.push_back({9, 3, 64, 100, 30.0f, true});
  v.push_back({32, 2, 64, 0, 0.0f, false});
  v.push_back({64, 1, 128, 100, 0.0f, false});
  return v;
}

// The flash kernel against the device reference within f16 rounding (5e-3
// of the output's scale: q, K, V and the probabilities go through f16)
// over every shape and the brief's key counts with steps of 1, 5 and 40
// tokens, and a 512-token step after 1,536 keys (a prefill chunk); two
// calls give the same bits.
TEST(CudaChanFlashAttention, DeviceMatchesTheReference) {
  RILL_REQUIRE_GPU();
  Worst worst;
  uint32_t seed = 5000;
  for (const Shape& sh : flash_shapes()) {
    std::vector<SeqSpec> specs = batch_specs(sh.hd == 128 ? 2 : 1, seed);
    specs.push_back({2048, 512, seed + 999});
    const Batch bt = make_batch(sh, specs, seed);
    const std::vector<float> want = device_run(bt, Kernel::kRef)[0];
    const std::vector<std::vector<float>> got = device_run(bt, Kernel::kFlash, 2);
    expect_close(got[0], want, "flash " + name(sh), worst, 5e-3);
    EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)), 0)
        << name(sh) << ": two calls differ";
    // Batched loads read the same values: the same bits.
    const std::vector<float> batched = device_run(bt, Kernel::kFlashBatched)[0];
    EXPECT_EQ(std::memcmp(got[0].data(), batched.data(), got[0].size() * sizeof(float)), 0)
        << name(sh) << ": batched loads change the outputs";
    seed += 1000;
  }
  std::printf("[ k4c flash ] device: worst max|diff| / scale %.3g (%s)\n", worst.rel, worst.where.c_str());
}

// Its rotation back (ChanAttentionArgs::rotated_out) is rotate_heads_back
// over its f32 outputs, byte for byte, in f32, f16 and bf16.
TEST(CudaChanFlashAttention, FusedRotationIsRotateHeadsBack) {
  RILL_REQUIRE_GPU();
  uint32_t seed = 900;
  int compared = 0;
  for (const Shape& sh : flash_shapes()) {
    const Batch bt = make_batch(sh, batch_specs(1, seed), seed);
    for (const DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
      Rotated r;
      r.dtype = dt;
      device_run(bt, Kernel::kFlash, 1, nullptr, false, false, &r);
      ASSERT_FALSE(r.fused.empty());
      EXPECT_EQ(r.fused, r.separate) << name(sh) << " dtype " << static_cast<int>(dt);
      ++compared;
    }
    seed += 100;
  }
  std::printf("[ k4c flash ] fused rotation: %d runs byte-equal to rotate_heads_back\n", compared);
}

// A sequence's outputs alone are its outputs among 9 others (other
// lengths, steps and pool places; its step cut into other tiles nowhere:
// tiles follow positions), bit for bit.
TEST(CudaChanFlashAttention, BatchInvariant) {
  RILL_REQUIRE_GPU();
  for (const bool alloc : {false, true}) {
    for (const int32_t window : {0, 100}) {
      const Shape sh{32, 8, 128, window, 0.0f, alloc};
      for (const SeqSpec target : {SeqSpec{1000, 1, 77}, SeqSpec{33, 5, 78}, SeqSpec{2100, 300, 79}}) {
        const AloneAndAmong in = alone_and_among(sh, target, {{5000, 1, 6}, {129, 17, 7}, {31, 1, 8}, {700, 5, 9}});
        const std::vector<float> a = device_run(in.alone, Kernel::kFlash)[0],
                                 b = device_run(in.many, Kernel::kFlash)[0];
        EXPECT_EQ(std::memcmp(a.data(), b.data() + in.at, in.n * sizeof(float)), 0)
            << name(sh) << " n " << target.n << " steps " << target.steps;
      }
    }
  }
}

// Prefill times at Llama-3.1-8B's shape, one layer's call: a step of 512
// tokens after 1,536 keys and of 2,048 from the start, the fast kernel's
// token tiles against the flash kernel. Printed only: `[ k4c flash ]
// prefill` lines.
TEST(CudaChanFlashAttention, DeviceTimingPrefill) {
  RILL_REQUIRE_GPU();
  for (const bool alloc : {false, true}) {
    const Shape sh{32, 8, 128, 0, 0.0f, alloc};
    for (const SeqSpec spec : {SeqSpec{2048, 512, 41}, SeqSpec{2048, 2048, 42}}) {
      const Batch bt = make_batch(sh, {spec}, 6);
      double tiles_ms = 0, flash_ms = 0, batched_ms = 0;
      const std::vector<float> a = device_run(bt, Kernel::kFast, 1, &tiles_ms, true)[0];
      const std::vector<float> b = device_run(bt, Kernel::kFlash, 1, &flash_ms)[0];
      device_run(bt, Kernel::kFlashBatched, 1, &batched_ms);
      Worst worst;
      expect_close(b, a, "flash vs tiles " + name(sh), worst, 5e-3);
      std::printf(
          "[ k4c flash ] prefill %s %lld tokens after %lld: token tiles %.1f us, flash %.1f us (%.2fx), batched "
          "loads %.1f us\n",
          alloc ? "k4a" : "k4c", static_cast<long long>(spec.steps), static_cast<long long>(spec.n - spec.steps),
          tiles_ms * 1e3, flash_ms * 1e3, tiles_ms / flash_ms, batched_ms * 1e3);
    }
  }
}

}  // namespace
}  // namespace rill::cuda
