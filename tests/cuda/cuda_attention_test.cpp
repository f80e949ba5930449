// Paged attention on the device (split-KV decode and tiled prefill) against
// cpu::attention on the same paged cache: f32 and f16 KV, GQA groups
// 1/2/3/4/8, head_dim 16/64/96/128/256, sliding window, softcap, shuffled
// block tables; decode through both the fast and the general kernel;
// gpt-oss's sink logits (f32 KV, every path). Block, bf16 and fp8 KV (q8_0,
// q4_0, q4_1, q5_0, q5_1, e4m3: backend/cuda/kv_types.cuh) against
// cpu::attention over f32 KV holding the same values (the host's
// dequantization of the same bytes),
// through the fast decode kernel (fp8 in 8-byte pieces, q8_0/q4_0 through
// its shared-memory copy of whole heads), the general one, the
// tensor-core prefill and the SIMT one; batch invariance per type; and
// against f32 attention over the values before they were stored, within
// the CPU's bounds for each type (tests/backend/kv_quant_test.cpp).
// head_dim 512 (Gemma 4's full layers: the general decode kernel, the
// tensor-core prefill of attention_wide.cu, the SIMT prefill) for every KV type,
// GQA groups 1/2/4/8, window and softcap, chunked prefill over a prefix.
// Tolerance: 2e-5 absolute on outputs of magnitude <= 1 (f32 softmax and
// sums in another order; no rounding of q or probabilities on either side),
// plus one output rounding for bf16 outputs; 3e-3 for prefill rows on the
// tensor cores (f16 KV, head_dim 64/128/256/512), which round q and the
// probabilities to f16 as llama.cpp does (and round q8_0/q4_0 values to f16:
// a relative 2^-11 more, inside the same bound), and for decode tokens of
// the quantized types the tensor-core decode kernel takes (head_dim 64 and
// 128: attention_decode.h decode_mma_takes), which rounds alike. A decode token gives bitwise
// the same result alone and inside a batch (its split count depends only on
// its own length).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>

#include "backend/cpu/kv_quant.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quants.h"
#include "backend/cuda/attention_decode.h"
#include "backend/cuda/ops.h"
#include "core/e4m3.h"
#include "cuda_test_util.h"

namespace rill::cuda {
namespace {

using namespace testing;

struct SeqSpec {
  int32_t q_len, kv_len;
};

struct Case {
  int32_t n_head, n_head_kv, head_dim, window;
  float softcap;
  DType kv;
};

bool stored_as_blocks(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
         t == DType::kIQ4_NL || t == kKvQ8_0x64 || t == kKvIq4Nl64 || t == kF8E4M3;
}

// Rows of `row_elems` floats in KV type t: F32/F16/BF16 as encode(),
// q8_0/q4_0/q4_1/q5_0/q5_1 by the CPU's reference quantizer (the store
// kernel's bytes), iq4_nl and
// q8_0h64's Q8_0_64 / iq4_nlh64's IQ4_NL64 by the CPU's rotated encoder
// (iq4_nlh's, q8_0h64's and iq4_nlh64's
// blocks; attention reads them the same whether the floats were rotated or
// not), fp8 rounded to the nearest e4m3.
std::vector<uint8_t> encode_kv(DType t, const std::vector<float>& v, int64_t row_elems) {
  if (!stored_as_blocks(t)) return encode(t, v);
  const size_t n_rows = v.size() / static_cast<size_t>(row_elems), rb = row_bytes(t, row_elems);
  std::vector<uint8_t> out(n_rows * rb);
  for (size_t r = 0; r < n_rows; ++r) {
    if (t == kF8E4M3) {
      for (int64_t e = 0; e < row_elems; ++e) out[r * rb + e] = e4m3_round(v[r * row_elems + e]);
    } else if (t == DType::kIQ4_NL || t == kKvQ8_0x64 || t == kKvIq4Nl64) {
      cpu::quantize_rotated_row(t, v.data() + r * row_elems, out.data() + r * rb, row_elems);
    } else {
      cpu::ref::quantize_kv_row(t, v.data() + r * row_elems, out.data() + r * rb, row_elems);
    }
  }
  return out;
}

// The f32 values of rows stored by encode_kv (the host's dequantization).
std::vector<float> decode_kv(DType t, const std::vector<uint8_t>& b, int64_t row_elems) {
  const size_t rb = row_bytes(t, row_elems), n_rows = b.size() / rb;
  std::vector<float> out(n_rows * row_elems);
  for (size_t r = 0; r < n_rows; ++r)
    cpu::ref::dequantize_row(t, b.data() + r * rb, out.data() + r * row_elems, row_elems);
  return out;
}

// The K/V values: uniform in [-1, 1] (q in [-2, 2]), or kv_quant_test.cpp's
// (K ~ N(0, 1) with outlier channels 3 and 40 of 8 and -6 sigma, as real K
// has; V ~ N(0, 1); q ~ N(0, 1/4)), which its bounds per type are for.
enum class Values { kUniform, kOutliers };

class Paged {
 public:
  static constexpr int32_t kBlock = 16, kShift = 4;
  Paged(const Case& c, const std::vector<SeqSpec>& seqs, Values values = Values::kUniform) : c_(c), seqs_(seqs) {
    int32_t n_blocks = 0;
    for (const SeqSpec& s : seqs) n_blocks += (s.kv_len + kBlock - 1) / kBlock;
    n_blocks_ = n_blocks + 3;  // a few never-used blocks
    std::vector<int32_t> perm(n_blocks_);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
    int32_t next = 0;
    for (const SeqSpec& s : seqs) {
      table_start_.push_back(static_cast<int32_t>(tables_.size()));
      for (int32_t b = 0; b < (s.kv_len + kBlock - 1) / kBlock; ++b) tables_.push_back(perm[next++]);
      // A hole (-1) for blocks wholly before the window of every query.
      if (c.window > 0) {
        const int32_t first_pos = s.kv_len - s.q_len;
        const int32_t lo = std::max(0, first_pos - c.window + 1);
        for (int32_t b = 0; b < lo / kBlock; ++b) tables_[table_start_.back() + b] = -1;
      }
      for (int32_t i = 0; i < s.q_len; ++i) {
        seq_of_.push_back(static_cast<int32_t>(table_start_.size()) - 1);
        pos_.push_back(s.kv_len - s.q_len + i);
      }
    }
    row_elems_ = c.n_head_kv * c.head_dim;
    const size_t n_kv = static_cast<size_t>(n_blocks_) * kBlock * row_elems_, n_q = pos_.size() * c.n_head * c.head_dim;
    if (values == Values::kUniform) {
      k_raw_ = random_floats(n_kv, 20);
      v_raw_ = random_floats(n_kv, 21);
      q_ = random_floats(n_q, 22, -2, 2);
    } else {
      std::mt19937 rng(11);
      std::normal_distribution<float> nd;
      k_raw_.resize(n_kv);
      v_raw_.resize(n_kv);
      q_.resize(n_q);
      for (float& x : q_) x = 0.5f * nd(rng);
      for (size_t i = 0; i < n_kv; ++i) {
        const int64_t ch = static_cast<int64_t>(i) % c.head_dim;
        k_raw_[i] = nd(rng) * (ch == 3 ? 8.0f : ch == 40 ? -6.0f : 1.0f);
        v_raw_[i] = nd(rng);
      }
    }
    k_ = encode_kv(c.kv, k_raw_, row_elems_);
    v_ = encode_kv(c.kv, v_raw_, row_elems_);
  }

  // f32 attention over the stored values (raw: over the values before they
  // were stored, the quantization's own error included).
  std::vector<float> cpu_out(bool raw = false) const {
    std::vector<float> out(q_.size());
    ThreadPool pool(2);
    cpu::AttentionParams p;
    p.n_head = c_.n_head;
    p.n_head_kv = c_.n_head_kv;
    p.head_dim = c_.head_dim;
    p.scale = 1.0f / std::sqrt(float(c_.head_dim));
    p.window = c_.window;
    p.softcap = c_.softcap;
    p.kv_dtype = c_.kv;
    if (!sinks_.empty()) p.sinks = sinks_.data();
    // Stored types (and bf16): f32 attention over their values.
    const bool blocks = raw || stored_as_blocks(c_.kv) || c_.kv == DType::kBF16;
    const std::vector<uint8_t> k32 = raw      ? encode(DType::kF32, k_raw_)
                                     : blocks ? encode(DType::kF32, decode_kv(c_.kv, k_, row_elems_))
                                              : k_;
    const std::vector<uint8_t> v32 = raw      ? encode(DType::kF32, v_raw_)
                                     : blocks ? encode(DType::kF32, decode_kv(c_.kv, v_, row_elems_))
                                              : v_;
    if (blocks) p.kv_dtype = DType::kF32;
    const size_t es = p.kv_dtype == DType::kF32 ? 4 : 2;
    int32_t t0 = 0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      cpu::PagedKv kv;
      kv.k = k32.data();
      kv.v = v32.data();
      kv.table = tables_.data() + table_start_[s];
      kv.block_shift = kShift;
      kv.row_bytes = row_elems_ * es;
      kv.block_bytes = kBlock * kv.row_bytes;
      const int64_t w = c_.n_head * c_.head_dim;
      cpu::attention(q_.data() + t0 * w, pos_.data() + t0, seqs_[s].q_len, kv, seqs_[s].kv_len, p, out.data() + t0 * w,
                     pool);
      t0 += seqs_[s].q_len;
    }
    return out;
  }

  // Runs the device kernels over the sequences in `only` (all when empty).
  // counts: split counters for the decode kernel's own merge (null: the
  // combine kernel merges).
  // general: decode through the general kernel. warps: the fast decode
  // kernel's block (attention_decode.h; 0: chosen by the grid; *chosen, when
  // given, receives the choice). working: the block choice's working-block
  // count given as the runtime gives it (the tokens' splits, bucketed).
  std::vector<float> gpu_out(DType out_dtype, const std::vector<int>& only = {}, int32_t* counts = nullptr,
                             bool general = false, int32_t warps = 0, int32_t* chosen = nullptr,
                             bool working = false) const {
    std::vector<int32_t> decode_tokens;
    std::vector<PrefillTile> tiles;
    int32_t t0 = 0, max_len = 0;
    for (size_t s = 0; s < seqs_.size(); ++s) {
      if (only.empty() || std::find(only.begin(), only.end(), int(s)) != only.end()) {
        route_attention(static_cast<int32_t>(s), t0, seqs_[s].q_len, prefill_tile_q(c_.kv, c_.head_dim), decode_tokens,
                        tiles);
        if (seqs_[s].q_len <= kDecodeMaxQ) max_len = std::max(max_len, seqs_[s].kv_len);
      }
      t0 += seqs_[s].q_len;
    }
    auto dq = upload(q_);
    auto dk = upload(k_), dv = upload(v_);
    auto dt = upload(tables_), dts = upload(table_start_), dseq = upload(seq_of_), dpos = upload(pos_);
    auto ddec = upload(decode_tokens.empty() ? std::vector<int32_t>{0} : decode_tokens);
    auto dtiles = upload(tiles.empty() ? std::vector<PrefillTile>{{0, 0, 0}} : tiles);
    auto dsinks = upload(sinks_.empty() ? std::vector<float>{0.0f} : sinks_);
    auto dpart =
        poisoned(attention_partial_floats(std::max<size_t>(1, decode_tokens.size()), c_.n_head, c_.head_dim) * 4);
    const size_t es = out_dtype == DType::kF32 ? 4 : 2;
    auto dout = poisoned(q_.size() * es);
    AttentionArgs a;
    a.q = dq.as<float>();
    a.q_stride = c_.n_head * c_.head_dim;
    a.n_head = c_.n_head;
    a.n_head_kv = c_.n_head_kv;
    a.head_dim = c_.head_dim;
    a.scale = 1.0f / std::sqrt(float(c_.head_dim));
    a.softcap = c_.softcap;
    a.window = c_.window;
    a.sinks = sinks_.empty() ? nullptr : dsinks.as<float>();
    a.k_cache = dk.data();
    a.v_cache = dv.data();
    a.kv_dtype = c_.kv;
    a.block_shift = kShift;
    a.block_tables = dt.as<int32_t>();
    a.table_start = dts.as<int32_t>();
    a.seq_of = dseq.as<int32_t>();
    a.pos = dpos.as<int32_t>();
    a.decode_tokens = ddec.as<int32_t>();
    a.n_decode = static_cast<int32_t>(decode_tokens.size());
    a.max_decode_len = max_len;
    a.partial = dpart.as<float>();
    a.split_counts = counts;
    a.tiles = dtiles.as<PrefillTile>();
    a.n_tiles = static_cast<int32_t>(tiles.size());
    a.out_dtype = out_dtype;
    a.out = dout.data();
    a.general_decode = general;
    int32_t work = 0;
    if (working) {
      int64_t splits = 0;
      for (const int32_t t : decode_tokens) splits += decode_splits(pos_[static_cast<size_t>(t)] + 1);
      work = decode_work_bucket(splits);
    }
    if (chosen) *chosen = decode_fast_warps(a, decode_splits(max_len), warps, work);
    attention(a, nullptr, warps, work);
    return decode(out_dtype, download<uint8_t>(dout, q_.size() * es));
  }

  // The absolute tolerance of token t's outputs (see the file comment);
  // general: the output of the general decode kernel (f32 throughout).
  double tolerance(size_t elem, bool general = false) const {
    const size_t t = elem / static_cast<size_t>(c_.n_head * c_.head_dim);
    int32_t t0 = 0;
    for (const SeqSpec& s : seqs_) {
      if (t < static_cast<size_t>(t0 + s.q_len)) {
        if (s.q_len <= kDecodeMaxQ) {
          return !general && decode_mma_takes(c_.kv, c_.head_dim, c_.n_head / c_.n_head_kv) ? 3e-3 : 2e-5;
        }
        return prefill_tile_q(c_.kv, c_.head_dim) == kPrefillTileQMma ? 3e-3 : 2e-5;
      }
      t0 += s.q_len;
    }
    return 2e-5;
  }

  // Sink logits [n_head] (gpt-oss) on both sides; empty: none. The CPU's
  // sinks run over f32 KV only.
  void set_sinks(std::vector<float> sinks) { sinks_ = std::move(sinks); }

  int32_t first_token(int s) const {
    int32_t t = 0;
    for (int i = 0; i < s; ++i) t += seqs_[static_cast<size_t>(i)].q_len;
    return t;
  }

 private:
  Case c_;
  std::vector<SeqSpec> seqs_;
  int32_t n_blocks_ = 0;
  int64_t row_elems_ = 0;
  std::vector<int32_t> tables_, table_start_, seq_of_, pos_;
  std::vector<uint8_t> k_, v_;
  std::vector<float> k_raw_, v_raw_, q_, sinks_;
};

TEST(CudaAttention, MatchesCpuOnPagedKv) {
  RILL_REQUIRE_GPU();
  // decode (1 and 3 tokens; 1 to 32 splits, the last 8,300 keys: splits of
  // more than kSplitKeys), prefill with and without a prefix
  const std::vector<SeqSpec> seqs = {{1, 1000}, {40, 50}, {3, 300}, {70, 70}, {1, 1}, {5, 133}, {150, 400}, {1, 8300}};
  // head_dim 16 and 96 (3 q heads per KV head) take the general decode
  // kernel, the others attention_decode.cu's; each case runs both.
  const std::vector<Case> cases = {
      {8, 2, 128, 0, 0.0f, DType::kF16},   {8, 2, 128, 0, 0.0f, DType::kF32},  {4, 2, 16, 0, 0.0f, DType::kF32},
      {4, 4, 64, 37, 0.0f, DType::kF16},   {8, 1, 64, 0, 0.5f, DType::kF32},   {2, 1, 256, 100, 0.0f, DType::kF16},
      {32, 8, 128, 0, 0.0f, DType::kF16},  {8, 2, 128, 0, 0.5f, DType::kF16},  {8, 2, 128, 90, 0.0f, DType::kF16},
      {12, 4, 96, 0, 0.0f, DType::kF16},   {16, 2, 128, 0, 0.0f, DType::kF16}, {4, 2, 64, 0, 0.0f, DType::kF16},
      {16, 8, 256, 37, 0.5f, DType::kF16},
  };
  for (const Case& c : cases) {
    const Paged p(c, seqs);
    const auto want = p.cpu_out();
    const auto got = p.gpu_out(DType::kF32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], p.tolerance(i))
          << "heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.head_dim << " window " << c.window << " softcap "
          << c.softcap << " kv " << dtype_name(c.kv) << " elem " << i;
    }
    const auto got_bf16 = p.gpu_out(DType::kBF16);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got_bf16[i], want[i], p.tolerance(i) + std::fabs(want[i]) / 128) << i;
    const auto general = p.gpu_out(DType::kF32, {}, nullptr, true);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(general[i], want[i], p.tolerance(i, true))
          << "general kernel, heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.head_dim << " elem " << i;
    }
  }
}

// Sink logits for n_head heads in [-1, 3], head 1's dominant (8) and head
// 2's vanishing (-20).
std::vector<float> test_sinks(int32_t n_head, uint32_t seed) {
  std::vector<float> sinks = random_floats(static_cast<size_t>(n_head), seed, -1, 3);
  sinks[1] = 8.0f;
  sinks[2] = -20.0f;
  return sinks;
}

// The decode kernels' last-block merge gives the combine kernel's outputs
// bit for bit, and leaves its counters zero for the next call.
TEST(CudaAttention, InKernelSplitMergeEqualsTheCombineKernel) {
  RILL_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1, 1000}, {1, 1}, {3, 300}, {1, 64}, {2, 129}, {1, 2050}};
  const std::vector<Case> cases = {
      {32, 8, 128, 0, 0.0f, DType::kF16}, {8, 2, 64, 37, 0.0f, DType::kF32}, {4, 4, 128, 0, 0.5f, DType::kF16}};
  for (const Case& c : cases) {
    const Paged p(c, seqs);
    int32_t n_decode = 0;
    for (const SeqSpec& s : seqs) n_decode += s.q_len;
    auto counts = upload(std::vector<int32_t>(static_cast<size_t>(n_decode * c.n_head_kv), 0));
    for (bool general : {false, true}) {
      for (DType out : {DType::kF32, DType::kBF16}) {
        const auto want = p.gpu_out(out, {}, nullptr, general);
        for (int rep = 0; rep < 2; ++rep) {
          const auto got = p.gpu_out(out, {}, counts.as<int32_t>(), general);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(got[i], want[i]) << "heads " << c.n_head << "/" << c.n_head_kv << " elem " << i << " call " << rep
                                       << (general ? " general" : " fast");
          }
        }
      }
    }
    const auto left = download<int32_t>(counts, static_cast<size_t>(n_decode * c.n_head_kv));
    for (int32_t v : left) ASSERT_EQ(v, 0);
  }
}

// Sink logits (gpt-oss) against the CPU's f32 kernel on every f32 path:
// the fast and the general decode kernel, split merges in the combine
// kernel and in the decode kernels' last block (bit for bit the same), the
// SIMT prefill; the shapes of the HF golden (head_dim 16) and of
// gpt-oss-20b (64 heads over 8 KV heads of 64, window 128). One sink
// dominates its head (8), one vanishes (-20). (f16 KV and the tensor-core
// prefill: tests/backend/backend_ops_test.cpp.)
TEST(CudaAttention, SinksMatchCpuOnEveryPath) {
  RILL_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1, 1000}, {40, 50}, {3, 300}, {70, 70}, {1, 1}, {150, 400}, {1, 2050}};
  const std::vector<Case> cases = {{64, 8, 64, 128, 0.0f, DType::kF32},
                                   {8, 2, 128, 90, 0.0f, DType::kF32},
                                   {4, 2, 16, 8, 0.0f, DType::kF32},
                                   {8, 1, 64, 0, 0.0f, DType::kF32}};
  for (const Case& c : cases) {
    Paged p(c, seqs);
    p.set_sinks(test_sinks(c.n_head, 23));
    const auto want = p.cpu_out();
    int32_t n_decode = 0;
    for (const SeqSpec& s : seqs) n_decode += s.q_len <= kDecodeMaxQ ? s.q_len : 0;
    auto counts = upload(std::vector<int32_t>(static_cast<size_t>(n_decode * c.n_head_kv), 0));
    for (bool general : {false, true}) {
      const auto got = p.gpu_out(DType::kF32, {}, nullptr, general);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], p.tolerance(i, general))
            << "sinks, heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.head_dim << " window " << c.window
            << (general ? " general" : " fast") << " elem " << i;
      }
      const auto merged = p.gpu_out(DType::kF32, {}, counts.as<int32_t>(), general);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(merged[i], got[i]) << "in-kernel merge, elem " << i;
    }
  }
}

// fp8 (e4m3), q8_0, q4_0, iq4_nl (iq4_nlh's blocks), Q8_0_64 (q8_0h64's)
// and IQ4_NL64 (iq4_nlh64's) KV against f32 attention over the values they
// hold, on every path: the fast decode kernel (fp8: 8-byte loads converted
// in registers) and the general one, splits merged by the combine kernel,
// the tensor-core prefill (fp8/q8_0/q4_0 tiles converted to f16 as they are
// loaded) for head_dim 64/128/256 and the SIMT prefill for the others.
// Bounds: the file comment's (the same f32 arithmetic over the same values
// in decode; the tensor cores' f16 rounding in prefill).
TEST(CudaAttention, StoredKvTypesMatchF32OverTheirValues) {
  RILL_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1, 1000}, {40, 50}, {3, 300}, {70, 70}, {1, 1}, {150, 400}, {1, 4100}};
  const std::vector<Case> cases = {
      {32, 8, 128, 0, 0.0f, kF8E4M3},
      {8, 2, 64, 37, 0.0f, kF8E4M3},
      {2, 1, 256, 0, 0.5f, kF8E4M3},
      {8, 1, 64, 0, 0.0f, kF8E4M3},
      {12, 4, 96, 0, 0.0f, kF8E4M3},
      {4, 2, 16, 0, 0.0f, kF8E4M3},
      {32, 8, 128, 0, 0.0f, DType::kQ8_0},
      {8, 2, 64, 37, 0.5f, DType::kQ8_0},
      {4, 2, 256, 0, 0.0f, DType::kQ8_0},
      {32, 8, 128, 0, 0.0f, DType::kQ4_0},
      {8, 2, 64, 0, 0.0f, DType::kQ4_0},
      {8, 2, 256, 90, 0.0f, DType::kQ4_0},
      {32, 8, 128, 0, 0.0f, DType::kIQ4_NL},
      {8, 2, 64, 37, 0.5f, DType::kIQ4_NL},
      {4, 2, 256, 0, 0.0f, DType::kIQ4_NL},
      {4, 2, 16, 0, 0.0f, DType::kIQ4_NL},
      // q8_0h64 (66-byte blocks: the fast decode kernel copies each head's
      // aligned 16-byte span; rows of 2 or 3 heads of 64 / 128 put a head at
      // every even lead, 8 heads of 128 at every multiple of 4); GQA 1 to 8.
      {32, 8, 128, 0, 0.0f, kKvQ8_0x64},
      {8, 2, 64, 37, 0.5f, kKvQ8_0x64},
      {4, 2, 256, 0, 0.0f, kKvQ8_0x64},
      {4, 2, 128, 90, 0.0f, kKvQ8_0x64},
      {6, 3, 64, 0, 0.0f, kKvQ8_0x64},
      {16, 2, 128, 0, 0.0f, kKvQ8_0x64},
      {3, 3, 128, 0, 0.0f, kKvQ8_0x64},
      // iq4_nlh64 (33-byte blocks, an e4m3 scale: a head of 64 starts at
      // any byte, so the fast decode kernel's span copy sees every lead
      // 0..15 over rows of 3 and 5 heads, and the codes are read unaligned
      // from global memory by the WMMA prefill (heads of 33 / 66 bytes) and
      // the wide one (132 at 256)); GQA 1 to 8, a window and softcap.
      {32, 8, 128, 0, 0.0f, kKvIq4Nl64},
      {8, 2, 64, 37, 0.5f, kKvIq4Nl64},
      {6, 3, 64, 0, 0.0f, kKvIq4Nl64},
      {5, 5, 64, 0, 0.0f, kKvIq4Nl64},
      {8, 1, 64, 0, 0.0f, kKvIq4Nl64},
      {4, 2, 256, 0, 0.0f, kKvIq4Nl64},
      {4, 2, 128, 90, 0.0f, kKvIq4Nl64},
      {16, 2, 128, 0, 0.0f, kKvIq4Nl64},
      {3, 3, 128, 0, 0.0f, kKvIq4Nl64},
      // bf16, q4_1, q5_0, q5_1 (kv_types_ggml.cuh; blocks of 20, 22 and 24
      // bytes: heads of 40 / 44 / 48 bytes at 64, q5_0's head of 16 in half
      // a 2-byte aligned block); GQA 1 to 8, head_dim 16 to 256, a window
      // and softcap; 96 takes the general decode kernel and the SIMT prefill.
      {32, 8, 128, 0, 0.0f, DType::kBF16},
      {8, 2, 64, 37, 0.5f, DType::kBF16},
      {4, 2, 256, 0, 0.0f, DType::kBF16},
      {12, 4, 96, 0, 0.0f, DType::kBF16},
      {4, 2, 16, 0, 0.0f, DType::kBF16},
      {32, 8, 128, 0, 0.0f, DType::kQ4_1},
      {8, 2, 64, 37, 0.5f, DType::kQ4_1},
      {4, 2, 256, 0, 0.0f, DType::kQ4_1},
      {8, 1, 64, 0, 0.0f, DType::kQ4_1},
      {32, 8, 128, 0, 0.0f, DType::kQ5_0},
      {8, 2, 64, 37, 0.5f, DType::kQ5_0},
      {6, 3, 64, 0, 0.0f, DType::kQ5_0},
      {4, 2, 256, 90, 0.0f, DType::kQ5_0},
      {4, 2, 16, 0, 0.0f, DType::kQ5_0},
      {12, 4, 96, 0, 0.0f, DType::kQ5_0},
      {32, 8, 128, 0, 0.0f, DType::kQ5_1},
      {8, 2, 64, 37, 0.5f, DType::kQ5_1},
      {4, 2, 256, 0, 0.0f, DType::kQ5_1},
      {16, 2, 128, 0, 0.0f, DType::kQ5_1},
      {4, 2, 16, 0, 0.0f, DType::kQ5_1},
  };
  for (const Case& c : cases) {
    const Paged p(c, seqs);
    const auto want = p.cpu_out();
    for (bool general : {false, true}) {
      const auto got = p.gpu_out(DType::kF32, {}, nullptr, general);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], p.tolerance(i, general))
            << "heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.head_dim << " window " << c.window
            << " softcap " << c.softcap << " kv " << dtype_name(c.kv) << (general ? " general" : " fast") << " elem "
            << i;
      }
    }
    const auto got_bf16 = p.gpu_out(DType::kBF16);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got_bf16[i], want[i], p.tolerance(i) + std::fabs(want[i]) / 128) << dtype_name(c.kv) << " " << i;
  }
}

// Every plain KV type against f32 attention over the values before they
// were stored: the quantization's own error, which the blocks (the CPU's
// bytes) share with the CPU's attention. Bounds per type are
// tests/backend/kv_quant_test.cpp's (about twice the error the CPU measured
// on this data, Values::kOutliers: 8 q heads over 2 KV heads of 64, 200
// keys; bf16's from its 8 significant bits, q4_1's / q5_1's from a step of
// (max - min) / 15 or 31, q4_0's / q5_0's from max-abs / 8 or 16), twice
// them under a window of 37 (fewer V rows averaged), plus the path's
// tolerance from the file comment (prefill rows on the tensor cores round
// to f16). Decode tokens through the fast and the general kernel, and a
// prefill of 5 queries (the CPU test's).
TEST(CudaAttention, StoredKvTypesWithinTheCpusBoundsOfTheirStep) {
  RILL_REQUIRE_GPU();
  struct Bound {
    DType t;
    float bound;  // max |out - out_f32|, full context
  };
  const Bound bounds[] = {{DType::kF16, 0.001f}, {DType::kBF16, 0.005f}, {DType::kQ8_0, 0.012f}, {DType::kQ5_0, 0.1f},
                          {DType::kQ5_1, 0.07f}, {DType::kQ4_0, 0.25f},  {DType::kQ4_1, 0.12f},  {kF8E4M3, 0.05f}};
  const std::vector<SeqSpec> seqs = {{1, 200}, {1, 150}, {5, 200}};
  for (const Bound& b : bounds) {
    for (const int32_t window : {0, 37}) {
      const Case c{8, 2, 64, window, 0.0f, b.t};
      const Paged p(c, seqs, Values::kOutliers);
      const auto want = p.cpu_out(/*raw=*/true);
      for (bool general : {false, true}) {
        const auto got = p.gpu_out(DType::kF32, {}, nullptr, general);
        ASSERT_EQ(got.size(), want.size());
        double max_err = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const double err = std::fabs(double{got[i]} - want[i]);
          max_err = std::max(max_err, err);
          ASSERT_LE(err, (window > 0 ? 2.0 : 1.0) * b.bound + p.tolerance(i, general))
              << dtype_name(b.t) << " window " << window << (general ? " general" : " fast") << " elem " << i;
        }
        std::printf("[ cuda kv step bound ] %-8s window %2d %-7s max |out - out_f32| %.4f (bound %.4f)\n",
                    std::string(dtype_name(b.t)).c_str(), window, general ? "general" : "fast", max_err,
                    (window > 0 ? 2.0 : 1.0) * b.bound);
      }
    }
  }
}

// head_dim 512 (Gemma 4's full layers; 16 q heads over 2 KV heads in the
// public 26B-A4B and 31B) on every path and KV type against the CPU: the
// general decode kernel (the fast one stops at 256) with splits merged by
// the combine kernel and in-kernel (bit for bit equal), the tensor-core
// prefill (attention_wide.cu: four row groups of 16 queries per 64-query
// tile; tiles of 64, of 40 (groups 0-1 full, 2 part full, 3 empty), of 21
// (group 1 part full), of 55 (group 3 part full), of 6 (group 0 part full)
// and of 2 queries below) for f16 / fp8 / q8_0 / q4_0, the SIMT prefill for
// f32; prefill chunks after a prefix of 230 keys (chunked prefill), GQA
// groups 1, 2, 4 and 8, a window and softcap; decode batch invariance.
TEST(CudaAttention, HeadDim512MatchesCpuOnEveryPath) {
  RILL_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1, 1000},  {40, 50},  {3, 300}, {70, 300}, {1, 1},
                                     {130, 200}, {1, 2100}, {21, 21}, {55, 400}};
  const std::vector<Case> cases = {
      {16, 2, 512, 0, 0.0f, DType::kF16},  {16, 2, 512, 0, 0.0f, DType::kF32},  {8, 8, 512, 0, 0.0f, DType::kF16},
      {4, 2, 512, 100, 0.5f, DType::kF16}, {8, 2, 512, 0, 0.0f, DType::kF16},   {16, 2, 512, 0, 0.0f, kF8E4M3},
      {16, 2, 512, 0, 0.0f, DType::kQ8_0}, {8, 2, 512, 37, 0.0f, DType::kQ4_0}, {8, 2, 512, 0, 0.0f, DType::kIQ4_NL},
      {16, 2, 512, 37, 0.5f, kKvQ8_0x64},  {8, 2, 512, 0, 0.0f, kKvIq4Nl64},    {16, 2, 512, 0, 0.0f, DType::kBF16},
      {8, 2, 512, 37, 0.0f, DType::kQ4_1}, {8, 8, 512, 0, 0.5f, DType::kQ5_0},  {16, 2, 512, 0, 0.0f, DType::kQ5_1},
  };
  EXPECT_FALSE(decode_fast_supported(DType::kF16, 512, 8)) << "512 runs the general decode kernel";
  for (const Case& c : cases) {
    ASSERT_EQ(prefill_tile_q(c.kv, c.head_dim), prefill_tile_q(c.kv, 256)) << "tiles are cut once for every layer";
    const Paged p(c, seqs);
    const auto want = p.cpu_out();
    int32_t n_decode = 0;
    for (const SeqSpec& s : seqs) n_decode += s.q_len <= kDecodeMaxQ ? s.q_len : 0;
    auto counts = upload(std::vector<int32_t>(static_cast<size_t>(n_decode * c.n_head_kv), 0));
    const auto got = p.gpu_out(DType::kF32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], p.tolerance(i))
          << "hd 512, heads " << c.n_head << "/" << c.n_head_kv << " window " << c.window << " softcap " << c.softcap
          << " kv " << dtype_name(c.kv) << " elem " << i;
    }
    const auto merged = p.gpu_out(DType::kF32, {}, counts.as<int32_t>());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(merged[i], got[i]) << "in-kernel merge, elem " << i;
    const auto got_bf16 = p.gpu_out(DType::kBF16);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got_bf16[i], want[i], p.tolerance(i) + std::fabs(want[i]) / 128) << dtype_name(c.kv) << " " << i;
    const int64_t w = c.n_head * c.head_dim;
    for (int s : {0, 2, 6}) {
      const auto alone = p.gpu_out(DType::kF32, {s});
      const int32_t t0 = p.first_token(s);
      for (int32_t i = 0; i < seqs[static_cast<size_t>(s)].q_len * w; ++i)
        ASSERT_EQ(alone[t0 * w + i], got[t0 * w + i]) << dtype_name(c.kv) << " seq " << s << " elem " << i;
    }
  }
}

// Sinks on the tensor-core prefill at 256 and 512 (attention_wide.cu; the
// test above runs sinks on f32 KV, which takes the SIMT kernels): f16 and
// q8_0 KV, a window, query tiles that leave row groups part full.
TEST(CudaAttention, SinksMatchCpuOnTheWidePrefill) {
  RILL_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1, 600}, {40, 50}, {70, 300}, {21, 21}, {130, 400}};
  const std::vector<Case> cases = {
      {16, 2, 512, 0, 0.0f, DType::kF16}, {8, 2, 256, 100, 0.0f, DType::kF16}, {16, 2, 512, 37, 0.0f, DType::kQ8_0}};
  for (const Case& c : cases) {
    Paged p(c, seqs);
    p.set_sinks(test_sinks(c.n_head, 29));
    const auto want = p.cpu_out();
    const auto got = p.gpu_out(DType::kF32);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], p.tolerance(i))
          << "sinks, hd " << c.head_dim << " window " << c.window << " kv " << dtype_name(c.kv) << " elem " << i;
    }
  }
}

// With the block size fixed (warps 8: batch-invariant mode's; the
// whole batch's grid here is past what fits in 8-warp blocks, so by default
// it would take smaller ones).
TEST(CudaAttention, DecodeTokensAreBatchInvariant) {
  RILL_REQUIRE_GPU();
  const std::vector<SeqSpec> seqs = {{1, 700}, {1, 4000}, {2, 65}, {1, 129}};
  for (const DType kv : {DType::kF16, kF8E4M3, DType::kQ8_0, DType::kQ4_0, kKvQ8_0x64, kKvIq4Nl64, DType::kBF16,
                         DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    const Case c{32, 8, 128, 0, 0.0f, kv};
    const Paged p(c, seqs);
    const int64_t w = c.n_head * c.head_dim;
    for (bool general : {false, true}) {
      const auto all = p.gpu_out(DType::kF32, {}, nullptr, general, 8);
      for (int s = 0; s < 4; ++s) {
        const auto alone = p.gpu_out(DType::kF32, {s}, nullptr, general, 8);
        const int32_t t0 = p.first_token(s);
        for (int32_t i = 0; i < seqs[static_cast<size_t>(s)].q_len * w; ++i) {
          ASSERT_EQ(alone[t0 * w + i], all[t0 * w + i])
              << dtype_name(kv) << " seq " << s << " elem " << i << (general ? " general" : " fast");
        }
      }
    }
  }
}

// The tensor-core decode kernel (attention_decode_mma.cu) for every type it
// takes, against the CPU over the stored values: head_dim 64 and 128, GQA 1,
// 2, 4 and 8, a window, softcap, sinks (one dominant, one vanishing), 1 to
// 8,300 keys (33 splits: more than kSplitKeys a split, so a block's chunk
// loop runs twice), round tails of 1 to 15 keys; within the file comment's
// tensor-core tolerance; each token's bits the same with the splits merged
// in the kernel, alone as in the batch, and in both of the kernel's shapes.
// force_decode_mma for one test's scope.
struct ForceDecodeMma {
  explicit ForceDecodeMma(int on) { force_decode_mma(on); }
  ~ForceDecodeMma() { force_decode_mma(-1); }
  ForceDecodeMma(const ForceDecodeMma&) = delete;
  ForceDecodeMma& operator=(const ForceDecodeMma&) = delete;
};

TEST(CudaAttention, DecodeOnTheTensorCoresMatchesCpu) {
  RILL_REQUIRE_GPU();
  const ForceDecodeMma on(1);  // whatever RILL_DECODE_MMA and the default say
  const std::vector<SeqSpec> seqs = {{1, 1}, {1, 15}, {1, 17}, {2, 300}, {1, 1000}, {1, 4100}, {1, 8300}};
  struct Shape {
    int32_t n_head, n_head_kv, head_dim, window;
    float softcap;
    bool sinks;
  };
  const Shape shapes[] = {{8, 8, 64, 0, 0.0f, false},
                          {16, 8, 128, 37, 0.0f, true},
                          {32, 8, 128, 0, 0.5f, false},
                          {64, 8, 64, 128, 0.0f, true}};
  for (const DType kv :
       {kF8E4M3, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL}) {
    for (const Shape& sh : shapes) {
      const Case c{sh.n_head, sh.n_head_kv, sh.head_dim, sh.window, sh.softcap, kv};
      const std::string what = std::string(dtype_name(kv)) + " heads " + std::to_string(c.n_head) + "/" +
                               std::to_string(c.n_head_kv) + " hd " + std::to_string(c.head_dim);
      ASSERT_TRUE(decode_mma_takes(kv, c.head_dim, c.n_head / c.n_head_kv)) << what;
      Paged p(c, seqs);
      if (sh.sinks) {
        p.set_sinks(test_sinks(c.n_head, 23));
      }
      const auto want = p.cpu_out();
      const auto got = p.gpu_out(DType::kF32);
      ASSERT_EQ(got.size(), want.size());
      double max_err = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], p.tolerance(i)) << what << " elem " << i;
        max_err = std::max(max_err, std::fabs(double{got[i]} - want[i]));
      }
      std::printf("[ cuda mma decode ] %-34s max |out - cpu| %.2e\n", what.c_str(), max_err);
      int32_t n_decode = 0;
      for (const SeqSpec& s : seqs) n_decode += s.q_len;
      auto counts = upload(std::vector<int32_t>(static_cast<size_t>(n_decode * c.n_head_kv), 0));
      const auto merged = p.gpu_out(DType::kF32, {}, counts.as<int32_t>());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(merged[i], got[i]) << what << " in-kernel merge " << i;
      for (const int blocks : {6, 8}) {  // the kernel's two shapes: the same bits
        force_decode_mma_blocks(blocks);
        const auto shaped = p.gpu_out(DType::kF32);
        force_decode_mma_blocks(0);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(shaped[i], got[i]) << what << " " << blocks << " blocks, " << i;
      }
      const int64_t w = c.n_head * c.head_dim;
      for (int s : {0, 3, 6}) {
        const auto alone = p.gpu_out(DType::kF32, {s});
        const int32_t t0 = p.first_token(s);
        for (int32_t i = 0; i < seqs[static_cast<size_t>(s)].q_len * w; ++i) {
          ASSERT_EQ(alone[t0 * w + i], got[t0 * w + i]) << what << " seq " << s << " alone, elem " << i;
        }
      }
    }
  }
}

// Blocks of 8, 4 and 2 warps (f16, bf16 and fp8 KV, attention_decode.h's `warps`)
// against the CPU on the decode tokens of the first test's shapes: 1 to 17
// splits, GQA 1 to 8, head_dim 64/128/256, window, softcap; each block size
// with the splits merged by the combine kernel and in the kernel (bit for
// bit equal). By default a grid that fits in 8-warp blocks takes them (the
// bits of warps 8); 80 tokens of 8 KV heads in 2 splits (1,280
// blocks) take smaller ones, and the output is that size's.
TEST(CudaAttention, DecodeBlocksOfFourAndTwoWarpsMatchCpu) {
  RILL_REQUIRE_GPU();
  const ForceDecodeMma off(0);  // fp8 at 64 / 128 on the fast kernel's block sizes too
  const std::vector<SeqSpec> seqs = {{1, 1000}, {40, 50}, {3, 300}, {1, 1}, {1, 150}, {2, 257}, {1, 4100}};
  const std::vector<Case> cases = {
      {32, 8, 128, 0, 0.0f, DType::kF16},  {8, 2, 128, 0, 0.5f, DType::kF16},   {4, 4, 64, 37, 0.0f, DType::kF16},
      {16, 2, 128, 0, 0.0f, DType::kF16},  {2, 1, 256, 100, 0.0f, DType::kF16}, {16, 8, 256, 37, 0.5f, DType::kF16},
      {32, 8, 128, 0, 0.0f, kF8E4M3},      {8, 1, 64, 0, 0.0f, kF8E4M3},        {2, 1, 256, 0, 0.5f, kF8E4M3},
      {32, 8, 128, 0, 0.0f, DType::kBF16}, {8, 1, 64, 0, 0.0f, DType::kBF16},   {2, 1, 256, 0, 0.5f, DType::kBF16},
  };
  for (const Case& c : cases) {
    const Paged p(c, seqs);
    const auto want = p.cpu_out();
    int32_t n_decode = 0;
    for (const SeqSpec& s : seqs) n_decode += s.q_len <= kDecodeMaxQ ? s.q_len : 0;
    auto counts = upload(std::vector<int32_t>(static_cast<size_t>(n_decode * c.n_head_kv), 0));
    for (int32_t warps : {8, 4, 2}) {
      int32_t chosen = 0;
      const auto got = p.gpu_out(DType::kF32, {}, nullptr, false, warps, &chosen);
      ASSERT_EQ(chosen, warps);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], p.tolerance(i))
            << warps << " warps, heads " << c.n_head << "/" << c.n_head_kv << " hd " << c.head_dim << " window "
            << c.window << " softcap " << c.softcap << " kv " << dtype_name(c.kv) << " elem " << i;
      }
      const auto merged = p.gpu_out(DType::kF32, {}, counts.as<int32_t>(), false, warps);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(merged[i], got[i]) << warps << " warps, in-kernel merge " << i;
      const auto got_bf16 = p.gpu_out(DType::kBF16, {}, nullptr, false, warps);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got_bf16[i], want[i], p.tolerance(i) + std::fabs(want[i]) / 128) << warps << " warps, " << i;
    }
    // One token alone (sequence 0, token 0; the other rows stay poisoned): a
    // grid of at most 8 x 4 blocks, so 8 warps by default.
    int32_t chosen = 0;
    const auto alone = p.gpu_out(DType::kF32, {0}, nullptr, false, 0, &chosen);
    const auto alone8 = p.gpu_out(DType::kF32, {0}, nullptr, false, 8);
    EXPECT_EQ(chosen, 8);
    for (int32_t i = 0; i < c.n_head * c.head_dim; ++i) ASSERT_EQ(alone[i], alone8[i]) << i;
  }
  for (const DType kv : {DType::kF16, kF8E4M3, DType::kBF16}) {
    const Case c{32, 8, 128, 0, 0.0f, kv};
    std::vector<SeqSpec> many;
    for (int s = 0; s < 80; ++s) many.push_back({1, 20 + 37 * s % 480});
    const Paged p(c, many);
    const auto want = p.cpu_out();
    int32_t chosen = 0;
    const auto got = p.gpu_out(DType::kF32, {}, nullptr, false, 0, &chosen);
    EXPECT_TRUE(chosen == 4 || chosen == 2) << chosen;
    const auto forced = p.gpu_out(DType::kF32, {}, nullptr, false, chosen);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], p.tolerance(i)) << "80 tokens, " << dtype_name(kv) << " elem " << i;
      ASSERT_EQ(got[i], forced[i]) << "80 tokens, " << dtype_name(kv) << " elem " << i;
    }
  }
}

// The block size counts the grid's working blocks where decode_work is
// given (the runtime's steps): one token of 4,100 keys (17 splits) among 15
// of 1-200 keys is a grid of 8 x 17 x 16 = 2,176 blocks, of which 8 x 32
// (17 + 15 splits) read keys. By the grid it takes 2-warp blocks; by its
// working blocks the size of a grid of 32 one-split tokens (8 warps on an
// H200: all 256 resident), with that size's bits and the CPU's values.
TEST(CudaAttention, DecodeBlockSizeCountsWorkingBlocksOnly) {
  RILL_REQUIRE_GPU();
  const ForceDecodeMma off(0);  // the fast kernel's block sizes, which the tensor-core kernel does not have
  EXPECT_EQ(decode_work_bucket(0), 0);
  EXPECT_EQ(decode_work_bucket(1), 1);
  EXPECT_EQ(decode_work_bucket(32), 32);
  EXPECT_EQ(decode_work_bucket(33), 64);
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  for (const DType kv : {DType::kF16, kF8E4M3}) {
    const Case c{32, 8, 128, 0, 0.0f, kv};
    std::vector<SeqSpec> seqs = {{1, 4100}};
    for (int s = 1; s < 16; ++s) seqs.push_back({1, 1 + 13 * s});
    const Paged p(c, seqs);
    const auto want = p.cpu_out();
    int32_t by_grid = 0, by_work = 0;
    const auto grid_out = p.gpu_out(DType::kF32, {}, nullptr, false, 0, &by_grid);
    const auto got = p.gpu_out(DType::kF32, {}, nullptr, false, 0, &by_work, true);
    // The same choice as a grid of 32 one-split tokens.
    const Paged dense(c, std::vector<SeqSpec>(32, SeqSpec{1, 100}));
    int32_t want_warps = 0;
    (void)dense.gpu_out(DType::kF32, {}, nullptr, false, 0, &want_warps);
    EXPECT_EQ(by_work, want_warps) << dtype_name(kv);
    if (sms >= 132) {  // an H200: 264 blocks of 8 warps resident
      EXPECT_EQ(by_grid, 2) << dtype_name(kv);
      EXPECT_EQ(by_work, 8) << dtype_name(kv);
    }
    const auto forced = p.gpu_out(DType::kF32, {}, nullptr, false, by_work);
    const auto forced_grid = p.gpu_out(DType::kF32, {}, nullptr, false, by_grid);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], p.tolerance(i)) << dtype_name(kv) << " elem " << i;
      ASSERT_EQ(got[i], forced[i]) << dtype_name(kv) << " elem " << i;
      ASSERT_EQ(grid_out[i], forced_grid[i]) << dtype_name(kv) << " elem " << i;
    }
  }
}

// RILL_DECODE_WARPS: 8, 4 or 2 as a whole base-10 number; anything else 0
// (ignored, reported on stderr).
TEST(CudaAttention, DecodeWarpsSettingIsValidated) {
  EXPECT_EQ(parse_decode_warps(nullptr), 0);
  EXPECT_EQ(parse_decode_warps(""), 0);
  EXPECT_EQ(parse_decode_warps("8"), 8);
  EXPECT_EQ(parse_decode_warps("4"), 4);
  EXPECT_EQ(parse_decode_warps("2"), 2);
  for (const char* bad : {"16", "1", "0", "-2", "8x", "4 ", "two", "0x8", "99999999999999999999", "2.0"}) {
    EXPECT_EQ(parse_decode_warps(bad), 0) << bad;
  }
}

}  // namespace
}  // namespace rill::cuda
