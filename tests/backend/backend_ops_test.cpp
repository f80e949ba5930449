// The backend-ops test (llama.cpp's test-backend-ops model): every Backend
// of backend/backend.h against the CPU Backend on one thread, op by op, on
// seeded random inputs that both see bit for bit (matmul inputs rounded to
// the backend's act dtype first, the same weight and KV bytes).
//
// Instances: the CPU Backend on two threads (exact: the CPU's results do
// not depend on its thread count) and, in CUDA builds, CUDA with f32, bf16
// and f16 activations and bf16 in batch-invariant mode (skipped without a
// GPU). Tolerances, relative to the largest reference magnitude, come from
// the arithmetic that differs:
//  - gathers, bias adds, KV copies of the same values: exact;
//  - f32 formulas in another summation order (norms, float matmuls,
//    attention over f32 KV, GLU, softcap): 1e-5 (1e-4 for matmuls);
//  - outputs in bf16 / f16: one more rounding, 2^-8 / 2^-11;
//  - RoPE: CUDA's sincosf against glibc's: 5e-5 absolute;
//  - attention over f16 KV: the CPU rounds q and the probabilities to f16
//    as llama.cpp does, CUDA does not: 4e-3; over q8_0 / q4_0 KV (the
//    same blocks): as f32, 2e-5; their stores: one level of K's RoPE
//    difference; V quantized from the same floats: exact;
//  - quantized weights: the CPU quantizes x to the llama.cpp partner type
//    (Q8_0 / Q8_K), CUDA multiplies its act values: 3e-2;
//  - the MoE FFN: f32 1e-4; bf16 / f16 (CUDA rounds the experts' GLU output
//    to act before down): 2e-2; MXFP4 experts as quantized weights, 3e-2.
// The CPU Backend itself is held to the CPU kernels in cpu_backend_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/quants.h"
#include "backend/cpu/rope_table.h"
#include "core/half.h"
#include "model/kv_spec.h"
#include "quant_test_util.h"

#if RILL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace rill {
namespace {

using cpu::testing::random_floats;
using cpu::testing::random_weight_rows;

struct Instance {
  std::string name;
  std::function<Result<std::unique_ptr<Backend>>()> make;
};

void PrintTo(const Instance& i, std::ostream* os) {
  *os << i.name;
}

std::vector<Instance> instances() {
  std::vector<Instance> v;
  v.push_back({"cpu_2threads", [] { return Result<std::unique_ptr<Backend>>(make_cpu_backend(2)); }});
#if RILL_HAVE_CUDA
  auto cuda = [](DType act, bool invariant) {
    return [act, invariant] { return make_cuda_backend({act, invariant, 0}); };
  };
  v.push_back({"cuda_f32", cuda(DType::kF32, false)});
  v.push_back({"cuda_bf16", cuda(DType::kBF16, false)});
  v.push_back({"cuda_f16", cuda(DType::kF16, false)});
  v.push_back({"cuda_bf16_invariant", cuda(DType::kBF16, true)});
#endif
  return v;
}

size_t elem_bytes(DType t) {
  return t == DType::kF32 ? 4 : 2;
}
float round_to(DType t, float x) {
  if (t == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
  if (t == DType::kF16) return f16_to_f32(f32_to_f16(x));
  return x;
}
std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * elem_bytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}
float decode_one(DType t, const uint8_t* p) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}
std::vector<float> rounded(DType t, std::vector<float> v) {
  for (float& x : v) x = round_to(t, x);
  return v;
}

// The largest |want|, and whether got is within tol of it everywhere.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (tol == 0) {
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << what << " at " << i;
    }
    return;
  }
  double scale = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::fabs(double(want[i])));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= err)) err = std::isnan(d) ? INFINITY : d, worst = i;
  }
  EXPECT_LE(err, tol * std::max(scale, 1e-3)) << what << ": worst at " << worst << " got " << got[worst] << " want "
                                              << want[worst] << " (scale " << scale << ")";
}

// One backend's copy of the test's inputs.
struct Side {
  std::unique_ptr<Backend> b;
  std::vector<Buffer> bufs;

  void* put(const void* host, size_t bytes) {
    auto buf = b->allocate(bytes, "test input");
    EXPECT_TRUE(buf.ok()) << buf.error().message;
    EXPECT_TRUE(b->copy_in(buf->data(), host, bytes).ok());
    bufs.push_back(std::move(*buf));
    return bufs.back().data();
  }
  template <typename T>
  T* put(const std::vector<T>& v) {
    return static_cast<T*>(put(v.data(), v.size() * sizeof(T)));
  }
  // rows x cols of v (values as dtype), rows `stride` apart (0: cols).
  Tensor tensor(const std::vector<float>& v, int64_t rows, int64_t cols, DType dtype, int64_t stride = 0) {
    stride = stride > 0 ? stride : cols;
    std::vector<float> full(static_cast<size_t>(rows * stride), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(v.begin() + r * cols, cols, full.begin() + r * stride);
    }
    const auto bytes = encode(dtype, full);
    return {put(bytes.data(), bytes.size()), dtype, rows, cols, stride};
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<uint8_t> bytes(static_cast<size_t>((t.rows - 1) * t.stride + t.cols) * elem_bytes(t.dtype));
    EXPECT_TRUE(b->copy_out(bytes.data(), t.data, bytes.size()).ok());
    std::vector<float> out;
    for (int64_t r = 0; r < t.rows; ++r) {
      for (int64_t c = 0; c < t.cols; ++c) {
        out.push_back(decode_one(t.dtype, bytes.data() + static_cast<size_t>(r * t.stride + c) * elem_bytes(t.dtype)));
      }
    }
    return out;
  }
  Weight place(const std::vector<HostMatrix>& parts) {
    auto w = b->place(parts.data(), static_cast<int>(parts.size()), "test weight");
    EXPECT_TRUE(w.ok()) << w.error().message;
    return w.ok() ? *w : Weight{};
  }
  Vec vec(const std::vector<float>& v) {
    auto r = b->place_vector(v.data(), static_cast<int64_t>(v.size()), "test vector");
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? *r : Vec{};
  }
};

// A step's host metadata: sequences of (q_len, kv_len), each with a table
// of distinct random blocks; routed as the device asks.
struct HostStep {
  std::vector<int32_t> ids, pos, seq_of, sample_rows, q_start, q_len, kv_len, decode_from, table_start, slots, tables,
      decode_tokens;
  std::vector<AttentionTile> tiles;
  RoutedAttention routed;
  int32_t n_tokens = 0;

  HostStep(const std::vector<std::pair<int32_t, int32_t>>& seqs, int32_t block_shift, int32_t n_blocks, uint32_t seed,
           const AttentionRouting& routing) {
    std::mt19937 rng(seed);
    std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    size_t next_block = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [ql, kl] = seqs[s];
      q_start.push_back(n_tokens);
      q_len.push_back(ql);
      kv_len.push_back(kl);
      decode_from.push_back(-1);
      table_start.push_back(static_cast<int32_t>(tables.size()));
      const int32_t n_tab = ((kl - 1) >> block_shift) + 1;
      for (int32_t i = 0; i < n_tab; ++i) tables.push_back(blocks.at(next_block++));
      for (int32_t i = 0; i < ql; ++i) {
        const int32_t p = kl - ql + i;
        ids.push_back(static_cast<int32_t>(rng() % 50));
        pos.push_back(p);
        seq_of.push_back(static_cast<int32_t>(s));
        slots.push_back((tables[static_cast<size_t>(table_start.back() + (p >> block_shift))] << block_shift) +
                        (p & ((1 << block_shift) - 1)));
        ++n_tokens;
      }
      sample_rows.push_back(n_tokens - 1);
    }
    decode_tokens.resize(static_cast<size_t>(n_tokens));
    tiles.resize(static_cast<size_t>(n_tokens));
    routed = route_attention(routing, static_cast<int32_t>(seqs.size()), q_start.data(), q_len.data(), kv_len.data(),
                             decode_tokens.data(), tiles.data());
  }

  StepMetadata place(Side& side) const {
    StepMetadata m;
    m.n_tokens = n_tokens;
    m.n_seqs = static_cast<int32_t>(q_start.size());
    m.n_sample = static_cast<int32_t>(sample_rows.size());
    m.ids = side.put(ids);
    m.pos = side.put(pos);
    m.seq_of = side.put(seq_of);
    m.sample_rows = side.put(sample_rows);
    m.q_start = side.put(q_start);
    m.q_len = side.put(q_len);
    m.kv_len = side.put(kv_len);
    m.decode_from = side.put(decode_from);
    m.table_start = side.put(table_start);
    m.slots[0] = side.put(slots);
    m.block_tables[0] = side.put(tables);
    m.decode_tokens = side.put(decode_tokens);
    m.n_decode = routed.n_decode;
    m.max_decode_len = routed.max_decode_len;
    m.tiles = side.put(tiles);
    m.n_tiles = routed.n_tiles;
    return m;
  }
};

class BackendOps : public ::testing::TestWithParam<Instance> {
 protected:
  void SetUp() override {
    auto b = GetParam().make();
    if (!b.ok()) GTEST_SKIP() << b.error().message;
    dev_.b = std::move(*b);
    ref_.b = make_cpu_backend(1);
    exact_ = std::string(dev_.b->name()) == "cpu";
  }
  DType act() const { return dev_.b->act_dtype(); }
  // The tolerance of an op whose f32 arithmetic differs by `f32`, its
  // output in `out`.
  double tol(double f32, DType out = DType::kF32) const {
    if (exact_) return 0;
    return f32 + (out == DType::kBF16 ? 1.0 / 128 : out == DType::kF16 ? 1.0 / 1024 : 0.0);
  }
  void reserve(int64_t max_tokens, int32_t n_head, int32_t head_dim) {
    for (Side* s : {&ref_, &dev_}) ASSERT_TRUE(s->b->reserve({max_tokens, n_head, head_dim}).ok());
  }
  struct MlaShape {
    int32_t H, nope, rope_dim, lora, v_dim, n_blocks;
    std::vector<std::pair<int32_t, int32_t>> seqs;  // (new tokens, keys) per sequence
    float scale, w_range;                           // attention scale; W_uk^T, W_uv in [-w_range, w_range]
  };
  void check_mla(const MlaShape& m);
  // Backend::ordered_logits on the CPU, then the device (head: [V][E] in
  // act's bits; ordering: V token ids in C groups): each side's logits
  // [n][V] and picked tokens [n][top_k * V / C]; the device's must be the
  // CPU's picks, group by group, and its logits within tol(1e-5).
  void run_ordered_logits(const std::vector<float>& hidden, const std::vector<float>& scores,
                          const std::vector<int32_t>& ordering, const std::vector<float>& head, int32_t n, int32_t E,
                          int32_t C, int32_t top_k, std::vector<std::vector<float>>& logits,
                          std::vector<std::vector<int32_t>>& picked);

  Side ref_, dev_;
  bool exact_ = false;
};

void BackendOps::run_ordered_logits(const std::vector<float>& hidden, const std::vector<float>& scores,
                                    const std::vector<int32_t>& ordering, const std::vector<float>& head, int32_t n,
                                    int32_t E, int32_t C, int32_t top_k, std::vector<std::vector<float>>& logits,
                                    std::vector<std::vector<int32_t>>& picked) {
  const auto V = static_cast<int32_t>(ordering.size()), n_picked = top_k * (V / C);
  const auto head_bytes = encode(act(), head);
  HostMatrix hm{head_bytes.data(), act(), V, E, row_bytes(act(), E)};
  hm.gathered = true;
  for (Side* s : {&ref_, &dev_}) {
    OrderedLogitsOp op;
    op.lm_head = s->place({hm});
    ASSERT_TRUE(s->b->reserve({n, 4, 64}).ok());  // after placing: the CPU sizes its row by the weights
    op.hidden = s->tensor(hidden, n, E, DType::kF32);
    op.scores = s->tensor(scores, n, C, DType::kF32);
    op.logits = s->tensor(std::vector<float>(n * V, NAN), n, V, DType::kF32);
    op.token_ordering = s->put(ordering);
    op.n_centroids = C;
    op.top_k = top_k;
    op.picked = s->put(std::vector<int32_t>(static_cast<size_t>(n * n_picked), -1));
    op.dots = s->put(std::vector<float>(static_cast<size_t>(n * n_picked), NAN));
    s->b->ordered_logits(op);
    logits.push_back(s->read(op.logits));
    std::vector<int32_t> p(static_cast<size_t>(n * n_picked));
    ASSERT_TRUE(s->b->copy_out(p.data(), op.picked, p.size() * sizeof(int32_t)).ok());
    picked.push_back(p);
  }
  EXPECT_EQ(picked[1], picked[0]) << "the picked tokens, group by group";
  expect_close(logits[1], logits[0], tol(1e-5), "ordered logits");
}

TEST_P(BackendOps, EmbedGathersExactly) {
  const int64_t V = 64, E = 256;
  const std::vector<int32_t> ids = {0, 63, 17, 17, 5};
  std::vector<DType> types = {act(), DType::kQ8_0, DType::kQ4_K};
  if (act() == DType::kF16) types = {act()};  // CUDA keeps blocks only beside F32/BF16 activations
  for (DType t : types) {
    const auto table =
        dtype_info(t).block_size > 1 ? random_weight_rows(t, V, E, 1) : encode(t, random_floats(V * E, 1));
    const HostMatrix m{table.data(), t, V, E, row_bytes(t, E)};
    std::vector<std::vector<float>> outs;
    for (Side* s : {&ref_, &dev_}) {
      const Weight w = s->place({m});
      Tensor out = s->tensor(std::vector<float>(ids.size() * E, NAN), static_cast<int64_t>(ids.size()), E, DType::kF32);
      s->b->embed(w, s->put(ids), static_cast<int64_t>(ids.size()), out);
      outs.push_back(s->read(out));
    }
    expect_close(outs[1], outs[0], 0, std::string("embed ") + std::string(dtype_name(t)));
  }
}

TEST_P(BackendOps, RmsNormOfStridedAndGatheredRows) {
  const int64_t n = 7, E = 96, stride = 128;
  const auto x = random_floats(n * E, 2, -3, 3);
  const auto w = random_floats(E, 3);
  const std::vector<int32_t> rows = {6, 0, 3};
  for (float offset : {0.0f, 1.0f}) {
    for (bool gather : {false, true}) {
      std::vector<std::vector<float>> outs;
      for (Side* s : {&ref_, &dev_}) {
        const DType out_t = s == &ref_ ? DType::kF32 : act();
        const int64_t n_out = gather ? 3 : n;
        Tensor xt = s->tensor(x, n, E, DType::kF32, stride);
        Tensor out = s->tensor(std::vector<float>(n_out * E, NAN), n_out, E, out_t);
        s->b->rms_norm(xt, gather ? s->put(rows) : nullptr, s->vec(w), 1e-5f, offset, out);
        outs.push_back(s->read(out));
      }
      expect_close(outs[1], outs[0], tol(1e-5, act()), "rms_norm gather " + std::to_string(gather));
    }
  }
}

TEST_P(BackendOps, MatmulOfFusedPartsWithAndWithoutAccumulate) {
  const int64_t cols = 256;
  const std::vector<int64_t> part_rows = {64, 32, 32};
  std::vector<DType> types = {act(), DType::kQ8_0, DType::kQ4_K};
  if (act() == DType::kF16) types = {act()};
  for (DType t : types) {
    const bool quant = dtype_info(t).block_size > 1;
    std::vector<std::vector<uint8_t>> data;
    std::vector<HostMatrix> parts;
    for (size_t i = 0; i < part_rows.size(); ++i) {
      const int64_t r = part_rows[i];
      data.push_back(quant ? random_weight_rows(t, r, cols, 10 + static_cast<uint32_t>(i))
                           : encode(t, random_floats(r * cols, 10 + static_cast<uint32_t>(i))));
    }
    for (size_t i = 0; i < part_rows.size(); ++i) {
      parts.push_back({data[i].data(), t, part_rows[i], cols, row_bytes(t, cols)});
    }
    const int64_t rows = 128;
    for (int64_t n : {1, 5, 37}) {
      for (int mode = 0; mode < 4; ++mode) {  // bit 0: accumulate, bit 1: bias
        const bool acc = mode & 1, biased = mode & 2;
        const auto x = rounded(act(), random_floats(n * cols, 20 + static_cast<uint32_t>(n)));
        const auto y0 = random_floats(n * rows, 30);
        const auto bias = random_floats(rows, 31);
        std::vector<std::vector<float>> outs;
        for (Side* s : {&ref_, &dev_}) {
          const Weight w = s->place(parts);
          ASSERT_EQ(w.rows, rows);
          ASSERT_TRUE(s->b->reserve({64, 4, 64}).ok());
          Tensor xt = s->tensor(x, n, cols, s->b->act_dtype());
          Tensor y = s->tensor(y0, n, rows, DType::kF32);
          ASSERT_TRUE(s->b->matmul(w, xt, y, acc, biased ? s->vec(bias) : Vec{}).ok());
          outs.push_back(s->read(y));
        }
        expect_close(outs[1], outs[0], tol(quant ? 3e-2 : 1e-4),
                     std::string("matmul ") + std::string(dtype_name(t)) + " n " + std::to_string(n) +
                         (acc ? " accumulate" : "") + (biased ? " bias" : ""));
      }
    }
  }
}

TEST_P(BackendOps, AddBiasSoftcapScaleAndGlu) {
  const int64_t n = 5, F = 80;
  const auto y = random_floats(n * 2 * F, 4, -4, 4);
  const auto b = random_floats(2 * F, 5);
  std::vector<std::vector<float>> outs[5];
  for (Side* s : {&ref_, &dev_}) {
    const DType out_t = s == &ref_ ? DType::kF32 : act();
    Tensor t = s->tensor(y, n, 2 * F, DType::kF32);
    s->b->add_bias(t, s->vec(b));
    outs[0].push_back(s->read(t));
    for (int k = 0; k < 2; ++k) {
      Tensor out = s->tensor(std::vector<float>(n * F, NAN), n, F, out_t);
      s->b->glu(k == 0 ? Glu::kSilu : Glu::kGeluTanh, t, out);
      outs[1 + k].push_back(s->read(out));
    }
    s->b->softcap(t, 3.0f);
    outs[3].push_back(s->read(t));
    s->b->scale(t, 1.7f);
    outs[4].push_back(s->read(t));
  }
  expect_close(outs[0][1], outs[0][0], 0, "add_bias");
  expect_close(outs[1][1], outs[1][0], tol(1e-5, act()), "silu glu");
  expect_close(outs[2][1], outs[2][0], tol(1e-5, act()), "gelu_tanh glu");
  expect_close(outs[3][1], outs[3][0], tol(1e-5), "softcap");
  expect_close(outs[4][1], outs[4][0], tol(1e-5), "scale");
}

// matmul_glu (the dense MLP's gate/up matmul and GLU, one op a backend may
// fuse) against the CPU's matmul then glu, [gate | up] placed as two parts
// in the activation dtype, at 1, 9 and 64 tokens. CUDA with bf16
// activations writes gate/up in bf16 past 8 tokens (outside batch-invariant
// mode): one more rounding of each, up to ~2^-7 of the output's scale.
TEST_P(BackendOps, MatmulGluOfFusedGateUp) {
  const int64_t cols = 256, F = 96;
  const DType t = act();
  const std::vector<uint8_t> gate = encode(t, random_floats(F * cols, 61));
  const std::vector<uint8_t> up = encode(t, random_floats(F * cols, 62));
  const std::vector<HostMatrix> parts = {{gate.data(), t, F, cols, row_bytes(t, cols)},
                                         {up.data(), t, F, cols, row_bytes(t, cols)}};
  for (const int64_t n : {int64_t{1}, int64_t{9}, int64_t{64}}) {
    const auto x = rounded(t, random_floats(n * cols, 63 + static_cast<uint32_t>(n)));
    for (const Glu kind : {Glu::kSilu, Glu::kGeluTanh}) {
      std::vector<std::vector<float>> outs;
      for (Side* s : {&ref_, &dev_}) {
        const Weight w = s->place(parts);
        ASSERT_EQ(w.rows, 2 * F);
        ASSERT_TRUE(s->b->reserve({64, 4, 64}).ok());
        Tensor xt = s->tensor(x, n, cols, s->b->act_dtype());
        Tensor gu = s->tensor(std::vector<float>(n * 2 * F, NAN), n, 2 * F, DType::kF32);
        Tensor out = s->tensor(std::vector<float>(n * F, NAN), n, F, s->b->act_dtype());
        ASSERT_TRUE(s->b->matmul_glu(w, xt, kind, gu, out).ok());
        outs.push_back(s->read(out));
      }
      expect_close(
          outs[1], outs[0], tol(1e-4 + (t == DType::kBF16 ? 1.0 / 128 : 0.0), t),
          std::string("matmul_glu ") + (kind == Glu::kSilu ? "silu" : "gelu_tanh") + " n " + std::to_string(n));
    }
  }
}

TEST_P(BackendOps, PostNormAdd) {
  const int64_t n = 6, E = 128;
  const auto y = random_floats(n * E, 6, -2, 2), x = random_floats(n * E, 7, -2, 2);
  const auto wp = random_floats(E, 8), wn = random_floats(E, 9);
  for (bool next : {false, true}) {
    std::vector<std::vector<float>> xs, ys;
    for (Side* s : {&ref_, &dev_}) {
      const DType out_t = s == &ref_ ? DType::kF32 : act();
      Tensor yt = s->tensor(y, n, E, DType::kF32), xt = s->tensor(x, n, E, DType::kF32);
      Tensor out = s->tensor(std::vector<float>(n * E, 0.0f), n, E, out_t);
      s->b->post_norm_add(yt, s->vec(wp), xt, next ? s->vec(wn) : Vec{}, 1e-6f, 1.0f, out);
      xs.push_back(s->read(xt));
      ys.push_back(s->read(out));
    }
    expect_close(xs[1], xs[0], tol(1e-5), "post_norm_add residual");
    if (next) expect_close(ys[1], ys[0], tol(1e-5, act()), "post_norm_add next norm");
  }
}

// A KV side's dtype and rotation (model/kv_types.h's KvType, which the
// backend layer does not link): q8_0h / q4_0h / iq4_nlh / q8_0h64 /
// iq4_nlh64 are Q8_0 / Q4_0 / IQ4_NL / Q8_0_64 / IQ4_NL64 rotated (IQ4_NL,
// Q8_0_64 and IQ4_NL64 are stored rotated only; Q8_0_64 and IQ4_NL64 need
// heads of whole blocks of 64).
struct KvKind {
  DType dtype;
  bool rotated;
  std::string name() const { return std::string(dtype_name(dtype)) + (rotated ? " rotated" : ""); }
};
constexpr KvKind kKvKinds[] = {{DType::kF32, false},   {DType::kF16, false}, {DType::kQ8_0, false},
                               {DType::kQ4_0, false},  {DType::kQ8_0, true}, {DType::kQ4_0, true},
                               {DType::kIQ4_NL, true}, {kKvQ8_0x64, true},   {kKvIq4Nl64, true}};

// A per-layer KV plane pair of n_blocks blocks, as both devices address it.
struct KvPlanes {
  KvCacheView view;
  size_t bytes = 0;
};
// The block types CUDA stores KV in (GGML's, q8_0h64's Q8_0_64 and
// iq4_nlh64's IQ4_NL64), and
// each one's level step as a fraction of its block's largest magnitude:
// how far one value moved to the next level may differ (IQ4_NL: its widest
// step, 24 of 127).
bool block_kv(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kIQ4_NL || t == kKvQ8_0x64 || t == kKvIq4Nl64;
}
// Blocks of 64 (q8_0h64, iq4_nlh64): heads of whole blocks of them only.
bool blocks_of_64(DType t) {
  return t == kKvQ8_0x64 || t == kKvIq4Nl64;
}
double level_step(DType t) {
  return t == DType::kQ8_0 || t == kKvQ8_0x64     ? 1.0 / 127
         : t == DType::kIQ4_NL || t == kKvIq4Nl64 ? 24.0 / 127
                                                  : 1.0 / 8;
}
// Plane bytes of floats v in a KV dtype: plain ones rounded, GGML blocks by
// the CPU's reference quantizer (the blocks both backends read); rotated
// (q8_0h / q4_0h / iq4_nlh): each head of head_dim rotated, then the CPU's rotated
// encoder (cpu::store_kv_row; blocks never straddle rows, so the plane is
// one long row of heads).
std::vector<uint8_t> encode_plane(DType t, const std::vector<float>& v, bool rotated = false, int64_t head_dim = 0) {
  if (!block_kv(t)) return encode(t, v);
  assert(rotated || (t != DType::kIQ4_NL && !blocks_of_64(t)));  // iq4_nl / Q8_0_64 / IQ4_NL64 KV: rotated only
  std::vector<uint8_t> out(row_bytes(t, static_cast<int64_t>(v.size())));
  if (rotated) {
    cpu::store_kv_row(t, true, v.data(), out.data(), static_cast<int64_t>(v.size()) / head_dim, head_dim);
  } else {
    cpu::ref::quantize_kv_row(t, v.data(), out.data(), static_cast<int64_t>(v.size()));
  }
  return out;
}
KvPlanes make_kv(Side& s, DType dtype, int32_t block_shift, int32_t n_blocks, int64_t kv_width, uint32_t seed,
                 bool rotated = false, int64_t head_dim = 0) {
  KvPlanes p;
  p.view.dtype = dtype;
  p.view.k_rotated = p.view.v_rotated = rotated;
  p.view.block_shift = block_shift;
  p.view.row_bytes = row_bytes(dtype, kv_width);
  p.view.block_stride = p.view.row_bytes << block_shift;
  p.bytes = p.view.block_stride * static_cast<size_t>(n_blocks);
  const int64_t n_elems = kv_width * (int64_t{n_blocks} << block_shift);
  const auto k =
      seed ? encode_plane(dtype, random_floats(n_elems, seed), rotated, head_dim) : std::vector<uint8_t>(p.bytes, 0);
  const auto v = seed ? encode_plane(dtype, random_floats(n_elems, seed + 1), rotated, head_dim)
                      : std::vector<uint8_t>(p.bytes, 0);
  p.view.k = s.put(k.data(), k.size());
  p.view.v = s.put(v.data(), v.size());
  return p;
}
std::vector<float> read_plane(Side& s, const void* plane, size_t bytes, DType dtype) {
  std::vector<uint8_t> raw(bytes);
  EXPECT_TRUE(s.b->copy_out(raw.data(), plane, bytes).ok());
  std::vector<float> out;
  if (block_kv(dtype)) {  // the CPU's dequantization of GGML's blocks
    const DTypeInfo info = dtype_info(dtype);
    out.resize(bytes / static_cast<size_t>(info.block_bytes) * static_cast<size_t>(info.block_size));
    cpu::dequantize_row(dtype, raw.data(), out.data(), static_cast<int64_t>(out.size()));
    return out;
  }
  for (size_t i = 0; i < bytes; i += elem_bytes(dtype)) out.push_back(decode_one(dtype, raw.data() + i));
  return out;
}

TEST_P(BackendOps, RopeQkNormAndKvStore) {
  // head_dim 16: two heads to a q8_0 block, stored by one block of CUDA's kernel
  for (const int32_t hd : {64, 16}) {
    const int32_t n_head = 4, n_head_kv = 2, shift = 4, n_blocks = 16;
    const int64_t Q = n_head * hd, KV = n_head_kv * hd, QKV = Q + 2 * KV;
    const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 40}, {3, 9}, {20, 20}};
    for (DType kv_t : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_0}) {
      for (int variant = 0; variant < 3; ++variant) {
        // 0: HF angles, full rotary, no norms; 1: ggml angles + q/k norms; 2: partial interleaved rotary
        RopeTable table = cpu::make_rope_table(10000.0f, variant == 2 ? hd / 2 : hd, variant == 2);
        if (variant == 1) table.ggml_theta_scale = std::pow(10000.0f, -2.0f / hd);
        const auto qn = random_floats(hd, 40), kn = random_floats(hd, 41);
        std::vector<std::vector<float>> qkvs, ks, vs;
        for (Side* s : {&ref_, &dev_}) {
          const HostStep hs(seqs, shift, n_blocks, 11, s->b->attention_routing(kv_t, hd));
          const StepMetadata md = hs.place(*s);
          auto rope = s->b->place_rope(table);
          ASSERT_TRUE(rope.ok());
          KvPlanes kv = make_kv(*s, kv_t, shift, n_blocks, KV, 0);
          RopeKvOp op;
          op.qkv = s->tensor(random_floats(hs.n_tokens * QKV, 12, -2, 2), hs.n_tokens, QKV, DType::kF32, QKV + 8);
          op.n_head = n_head;
          op.n_head_kv = n_head_kv;
          op.head_dim = hd;
          if (variant == 1) {
            op.q_norm = s->vec(qn);
            op.k_norm = s->vec(kn);
            op.norm_offset = 1.0f;
          }
          op.rope = *rope;
          op.kv = kv.view;
          s->b->rope_store_kv(op, md);
          qkvs.push_back(s->read(op.qkv.cols_from(0, Q)));  // k and v columns: unspecified after the op
          ks.push_back(read_plane(*s, kv.view.k, kv.bytes, kv_t));
          vs.push_back(read_plane(*s, kv.view.v, kv.bytes, kv_t));
        }
        const std::string what = "rope variant " + std::to_string(variant) + " kv " + std::string(dtype_name(kv_t)) +
                                 " head_dim " + std::to_string(hd);
        // RoPE: absolute 5e-5 of values of magnitude <= ~4 (normed: a few).
        expect_close(qkvs[1], qkvs[0], tol(2e-5), what + " q");
        // GGML blocks: K's f32 values differ by RoPE's 5e-5, which may move a
        // value to the next level (level_step of its block); V is quantized
        // from the same floats by the same rule: exact.
        const double k_tol = block_kv(kv_t) ? level_step(kv_t) : kv_t == DType::kF16 ? 2e-3 : 2e-5;
        expect_close(ks[1], ks[0], tol(k_tol), what + " K cache");
        expect_close(vs[1], vs[0], 0, what + " V cache");
      }
    }
  }
}

// q8_0h / q4_0h / iq4_nlh / q8_0h64 stores: K and V heads rotated and
// encoded by the rotated types' encoder give the CPU encoder's bytes
// (cpu::store_kv_row over the same floats) on every backend, byte for
// byte: q8_0h64's blocks of 64 (two warps a block, a value a lane each) are
// the CPU's quantize_q8_0x64_fit's, so a CUDA-written q8_0h64 KV row is the
// CPU's row (tiers and KV files carry it between the devices). The RoPE
// table turns no pair (every angle 0: cos 1 and sin 0 exactly on both
// devices), so K reaches the encoder as the given floats, as V does. Heads
// of 256, 128, 64 and 16 (two to a block; not q8_0h64, whose blocks need
// heads of 64); K head 0 has an outlier channel (what the rotation is
// for), K head 1 is small on some tokens (f16-subnormal scales) and zero
// on others (scale 0). Some tokens' V head 0 holds a NaN, which the
// rotation spreads over the head: a zero block (no finite maximum); at
// head_dim 16 its block shares a finite head, and no candidate fits:
// codes of 0 and the scale 0x7e00 on both devices, whose NaNs otherwise
// differ in sign. Some tokens' V head 1 holds an infinity, which the
// rotation turns into infinities (and NaNs) over the head: every candidate
// scale's error is NaN, and the unshrinking scale (x . x / x . 0) is NaN:
// the scale 0x7e00 and codes of 0 (the CPU's nearest_code of NaN; CUDA's
// __float2int_rn).
TEST_P(BackendOps, RotatedKvStoreIsTheCpuEncodersBytes) {
  for (const int32_t hd : {256, 128, 64, 16}) {
    const int32_t n_head = 2, n_head_kv = 2, shift = 4, n_blocks = 16;
    const int64_t Q = n_head * hd, KV = n_head_kv * hd, QKV = Q + 2 * KV;
    const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 40}, {3, 9}, {20, 20}};
    RopeTable table;
    table.rot_dim = hd;
    table.inv_freq.assign(static_cast<size_t>(hd / 2), 0.0f);
    for (DType kv_t : {DType::kQ8_0, DType::kQ4_0, DType::kIQ4_NL, kKvQ8_0x64, kKvIq4Nl64}) {
      if (blocks_of_64(kv_t) && hd % 64 != 0) continue;
      const std::string what = std::string(dtype_name(kv_t)) + " rotated, head_dim " + std::to_string(hd);
      std::vector<std::vector<uint8_t>> ks, vs;
      std::vector<uint8_t> want_k, want_v;
      for (Side* s : {&ref_, &dev_}) {
        const HostStep hs(seqs, shift, n_blocks, 11, s->b->attention_routing(kv_t, hd));
        const StepMetadata md = hs.place(*s);
        auto rope = s->b->place_rope(table);
        ASSERT_TRUE(rope.ok());
        KvPlanes kv = make_kv(*s, kv_t, shift, n_blocks, KV, 0, /*rotated=*/true, hd);
        std::vector<float> x = random_floats(hs.n_tokens * QKV, 12, -2, 2);
        for (int32_t t = 0; t < hs.n_tokens; ++t) {
          float* k = x.data() + t * QKV + Q;
          k[3] = 40.0f;
          for (int64_t d = hd; d < 2 * hd; ++d) k[d] = t % 3 == 2 ? 0.0f : t % 3 == 1 ? k[d] * 1e-3f : k[d];
          if (t % 7 == 5) k[KV + 2] = std::numeric_limits<float>::quiet_NaN();      // V head 0
          if (t % 5 == 3) k[KV + hd + 1] = std::numeric_limits<float>::infinity();  // V head 1
        }
        if (s == &ref_) {  // the CPU encoder's plane for these rows
          const size_t row = row_bytes(kv_t, KV);
          want_k.assign(kv.bytes, 0);
          want_v.assign(kv.bytes, 0);
          for (int32_t t = 0; t < hs.n_tokens; ++t) {
            const size_t at = static_cast<size_t>(hs.slots[static_cast<size_t>(t)]) * row;
            cpu::store_kv_row(kv_t, true, x.data() + t * QKV + Q, want_k.data() + at, n_head_kv, hd);
            cpu::store_kv_row(kv_t, true, x.data() + t * QKV + Q + KV, want_v.data() + at, n_head_kv, hd);
          }
        }
        RopeKvOp op;
        op.qkv = s->tensor(x, hs.n_tokens, QKV, DType::kF32, QKV + 8);
        op.n_head = n_head;
        op.n_head_kv = n_head_kv;
        op.head_dim = hd;
        op.rope = *rope;
        op.kv = kv.view;
        s->b->rope_store_kv(op, md);
        for (auto [plane, out] : {std::pair{kv.view.k, &ks}, std::pair{kv.view.v, &vs}}) {
          std::vector<uint8_t> raw(kv.bytes);
          ASSERT_TRUE(s->b->copy_out(raw.data(), plane, kv.bytes).ok());
          out->push_back(std::move(raw));
        }
      }
      const HostStep hs(seqs, shift, n_blocks, 11, ref_.b->attention_routing(kv_t, hd));
      // The scale's bits (iq4_nlh64: byte 0, the e4m3 code; NaN 0x7f).
      const bool e4m3 = kv_t == kKvIq4Nl64;
      auto scale_bits = [&](size_t at) { return e4m3 ? want_v[at] : want_v[at] | want_v[at + 1] << 8; };
      for (int32_t t = 5; t < hs.n_tokens; t += 7) {  // V head 0's first block of the NaN tokens
        const size_t at = static_cast<size_t>(hs.slots[static_cast<size_t>(t)]) * row_bytes(kv_t, KV);
        EXPECT_EQ(scale_bits(at), hd == 16 ? 0x7e00 : 0) << what << " token " << t;
      }
      // The inf tokens: iq4_nlh64's e4m3 scale saturates at 28 (+-448 / 16)
      // where f16 overflows, but every candidate's error is still inf or
      // NaN, and the unshrinking scale NaN: 0x7f.
      for (int32_t t = 3; t < hs.n_tokens;
           t += 5) {  // V head 1's first block (head_dim 16: head 0's) of the inf tokens
        const size_t at = static_cast<size_t>(hs.slots[static_cast<size_t>(t)]) * row_bytes(kv_t, KV) +
                          row_bytes(kv_t, hd == 16 ? 0 : hd);
        EXPECT_EQ(scale_bits(at), e4m3 ? 0x7f : 0x7e00) << what << " token " << t;
      }
      ASSERT_EQ(ks[0], want_k) << what << ": the CPU Backend's K is its encoder's";
      ASSERT_EQ(vs[0], want_v) << what << ": the CPU Backend's V is its encoder's";
      EXPECT_NE(std::count(want_k.begin(), want_k.end(), 0), static_cast<ptrdiff_t>(want_k.size())) << what;
      size_t k_diff = 0, v_diff = 0;
      for (size_t i = 0; i < want_k.size(); ++i) {
        k_diff += ks[1][i] != want_k[i];
        v_diff += vs[1][i] != want_v[i];
      }
      EXPECT_EQ(k_diff, 0u) << what << ": K bytes that differ from the CPU encoder's";
      EXPECT_EQ(v_diff, 0u) << what << ": V bytes that differ from the CPU encoder's";
    }
  }
}

// Gemma 4's RoPE op: q/k norms scaling by w (offset 0), the weightless V
// norm, a proportional table (only the first pairs rotate, the others have
// angle 0), and a layer that computes only q and stores nothing.
TEST_P(BackendOps, Gemma4RopeVNormAndQOnly) {
  if (!dev_.b->has_gemma4_ops()) GTEST_SKIP() << dev_.b->name() << " has no Gemma 4 ops";
  const int32_t n_head = 4, n_head_kv = 2, hd = 64, shift = 4, n_blocks = 16;
  const int64_t Q = n_head * hd, KV = n_head_kv * hd, QKV = Q + 2 * KV;
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 40}, {3, 9}, {20, 20}};
  RopeTable table;
  table.rot_dim = hd;
  table.inv_freq.assign(hd / 2, 0.0f);
  for (int i = 0; i < 8; ++i) table.inv_freq[static_cast<size_t>(i)] = std::pow(1e6f, -2.0f * i / hd);
  const auto qn = random_floats(hd, 42), kn = random_floats(hd, 43);
  for (DType kv_t : {DType::kF32, DType::kF16}) {
    for (bool q_only : {false, true}) {
      std::vector<std::vector<float>> qkvs, ks, vs;
      for (Side* s : {&ref_, &dev_}) {
        const HostStep hs(seqs, shift, n_blocks, 13, s->b->attention_routing(kv_t, hd));
        const StepMetadata md = hs.place(*s);
        auto rope = s->b->place_rope(table);
        ASSERT_TRUE(rope.ok());
        KvPlanes kv = make_kv(*s, kv_t, shift, n_blocks, KV, 0);
        const int64_t width = q_only ? Q : QKV;
        RopeKvOp op;
        op.qkv = s->tensor(random_floats(hs.n_tokens * width, 14, -2, 2), hs.n_tokens, width, DType::kF32, width + 8);
        op.n_head = n_head;
        op.n_head_kv = q_only ? 0 : n_head_kv;
        op.head_dim = hd;
        op.q_norm = s->vec(qn);
        op.k_norm = s->vec(kn);
        op.v_norm = true;
        op.rope = *rope;
        op.kv = kv.view;
        s->b->rope_store_kv(op, md);
        qkvs.push_back(s->read(op.qkv.cols_from(0, Q)));
        ks.push_back(read_plane(*s, kv.view.k, kv.bytes, kv_t));
        vs.push_back(read_plane(*s, kv.view.v, kv.bytes, kv_t));
      }
      const std::string what = std::string(q_only ? "q only" : "v norm") + " kv " + std::string(dtype_name(kv_t));
      expect_close(qkvs[1], qkvs[0], tol(2e-5), what + " q");
      expect_close(ks[1], ks[0], tol(kv_t == DType::kF16 ? 2e-3 : 2e-5), what + " K cache");
      expect_close(vs[1], vs[0], tol(kv_t == DType::kF16 ? 2e-3 : 2e-5), what + " V cache");
      if (q_only) {
        for (float v : ks[0]) ASSERT_EQ(v, 0.0f) << "a q-only layer stores nothing";
      } else {  // every stored V head is normed: mean square 1
        int n_heads_stored = 0;
        for (size_t h0 = 0; h0 + hd <= vs[0].size(); h0 += hd) {
          double ss = 0;
          for (int64_t d = 0; d < hd; ++d) ss += double(vs[0][h0 + d]) * vs[0][h0 + d];
          if (ss == 0) continue;
          ++n_heads_stored;
          EXPECT_NEAR(ss / hd, 1.0, 1e-2) << what;
        }
        EXPECT_EQ(n_heads_stored, 24 * n_head_kv) << what;
      }
    }
  }
}

// A q-only layer rotating one past its positions (RopeKvOp::pos_offset,
// Gemma 4's assistant): the CPU's q equals its q at positions + 1 bit for
// bit, and the device's is within RoPE's tolerance of it.
TEST_P(BackendOps, Gemma4QOnlyRopeAtAnOffset) {
  if (!dev_.b->has_gemma4_ops()) GTEST_SKIP() << dev_.b->name() << " has no Gemma 4 ops";
  const int32_t n_head = 4, hd = 32, shift = 4, n_blocks = 16;
  const int64_t Q = n_head * hd;
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 40}, {3, 9}, {1, 1}};
  reserve(8, n_head, hd);  // CUDA shifts the positions in its scratch
  RopeTable table;
  table.rot_dim = hd;
  for (int i = 0; i < hd / 2; ++i) table.inv_freq.push_back(std::pow(1e4f, -2.0f * i / hd));
  std::vector<std::vector<float>> qs;
  for (int pass = 0; pass < 3; ++pass) {  // ref at +1, ref at shifted positions, the device at +1
    Side& s = pass < 2 ? ref_ : dev_;
    HostStep hs(seqs, shift, n_blocks, 13, s.b->attention_routing(DType::kF32, hd));
    if (pass == 1) {
      for (int32_t& p : hs.pos) ++p;
    }
    const StepMetadata md = hs.place(s);
    auto rope = s.b->place_rope(table);
    ASSERT_TRUE(rope.ok());
    KvPlanes kv = make_kv(s, DType::kF32, shift, n_blocks, 2 * hd, 0);
    RopeKvOp op;
    op.qkv = s.tensor(random_floats(hs.n_tokens * Q, 16, -2, 2), hs.n_tokens, Q, DType::kF32, Q + 4);
    op.n_head = n_head;
    op.head_dim = hd;
    op.rope = *rope;
    op.kv = kv.view;
    op.pos_offset = pass == 1 ? 0 : 1;
    s.b->rope_store_kv(op, md);
    qs.push_back(s.read(op.qkv));
  }
  expect_close(qs[0], qs[1], 0, "the CPU's q at pos + 1 against at shifted positions");
  expect_close(qs[2], qs[0], tol(2e-5), "q at pos + 1");
}

// Gemma 4's assistant's ordered head (Backend::ordered_logits): 8 groups of
// 8 tokens, the top 3 per row; row 0's scores tie at the cut (the lower
// group goes first), row 1 has its own ordering. The CPU against the
// formula, the device against the CPU (the same head bits in act).
TEST_P(BackendOps, Gemma4OrderedLogits) {
  if (!dev_.b->has_gemma4_ops()) GTEST_SKIP() << dev_.b->name() << " has no Gemma 4 ops";
  const int32_t n = 3, E = 40, V = 64, C = 8, top_k = 3, per = V / C, n_picked = top_k * per;
  std::vector<int32_t> ordering(static_cast<size_t>(V));
  std::iota(ordering.begin(), ordering.end(), 0);
  std::shuffle(ordering.begin(), ordering.end(), std::mt19937(17));
  std::vector<float> scores = random_floats(n * C, 18, -1, 1);
  const float tied[C] = {0.5f, 0.9f, 0.2f, 0.1f, 0.5f, 0.3f, -1.0f, 0.5f};  // top 3: groups 1, 0, 4
  std::copy_n(tied, C, scores.begin());
  const auto hidden = random_floats(n * E, 19, -2, 2);
  const auto head = rounded(act(), random_floats(V * E, 20));
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> picked;
  ASSERT_NO_FATAL_FAILURE(run_ordered_logits(hidden, scores, ordering, head, n, E, C, top_k, logits, picked));
  // The CPU against the formula.
  for (int32_t r = 0; r < n; ++r) {
    std::vector<int32_t> order(C);
    std::iota(order.begin(), order.end(), 0);
    const float* sr = scores.data() + r * C;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sr[a] > sr[b]; });
    if (r == 0) {
      EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + top_k), (std::vector<int32_t>{1, 0, 4}));
    }
    std::vector<float> want(static_cast<size_t>(V));
    std::vector<bool> is_picked(static_cast<size_t>(V), false);
    float lowest = INFINITY;
    for (int32_t k = 0; k < top_k; ++k) {
      for (int32_t j = 0; j < per; ++j) {
        const int32_t t = ordering[static_cast<size_t>(order[static_cast<size_t>(k)] * per + j)];
        ASSERT_EQ(picked[0][static_cast<size_t>(r * n_picked + k * per + j)], t) << "row " << r;
        double dot = 0;
        for (int32_t e = 0; e < E; ++e)
          dot += double(hidden[static_cast<size_t>(r * E + e)]) * head[static_cast<size_t>(t * E + e)];
        want[static_cast<size_t>(t)] = static_cast<float>(dot);
        is_picked[static_cast<size_t>(t)] = true;
        lowest = std::min(lowest, static_cast<float>(dot));
      }
    }
    for (int32_t v = 0; v < V; ++v) {
      const float got = logits[0][static_cast<size_t>(r * V + v)];
      if (is_picked[static_cast<size_t>(v)]) {
        ASSERT_NEAR(got, want[static_cast<size_t>(v)], 1e-4) << "row " << r << " token " << v;
      } else {
        ASSERT_NEAR(got, lowest - 1.0f, 1e-4) << "row " << r << " token " << v << " (not picked)";
      }
    }
  }
}

// The ordered head's pick with many ties at the cut, over 200 groups (not a
// multiple of a warp):
// row 0 draws from 3 levels (-0 and +0 tie), row 1 has every
// score equal, row 2 ties 60 groups at the cut with -inf below, row 3 has
// NaN scores (group 0 among them), which rank as -inf on both. The device
// picks the same groups in the same order as the CPU, which picks as a
// stable sort by score, descending.
TEST_P(BackendOps, Gemma4OrderedLogitsTiesAtTheCut) {
  if (!dev_.b->has_gemma4_ops()) GTEST_SKIP() << dev_.b->name() << " has no Gemma 4 ops";
  const int32_t n = 4, E = 8, C = 200, per = 2, V = C * per, top_k = 37, n_picked = top_k * per;
  std::vector<int32_t> ordering(static_cast<size_t>(V));
  std::iota(ordering.begin(), ordering.end(), 0);
  std::shuffle(ordering.begin(), ordering.end(), std::mt19937(21));
  std::vector<float> scores(static_cast<size_t>(n * C));
  std::mt19937 rng(22);
  const float levels[8] = {0.25f, -0.0f, -0.0f, -0.0f, 0.0f, 0.0f, 0.0f, -0.5f};
  for (int32_t c = 0; c < C; ++c) {
    scores[static_cast<size_t>(c)] = levels[rng() % 8];  // about 25 above 0, 150 tie at 0 (the cut)
    scores[static_cast<size_t>(C + c)] = 0.75f;
    scores[static_cast<size_t>(2 * C + c)] = c % 7 == 0 ? 1.0f : (c % 3 == 0 ? 0.5f : -INFINITY);
    scores[static_cast<size_t>(3 * C + c)] = c % 5 == 0 ? NAN : (c % 11 == 0 ? 2.0f : -INFINITY);
  }
  const auto hidden = random_floats(n * E, 23, -2, 2);
  const auto head = rounded(act(), random_floats(V * E, 24));
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> picked;
  ASSERT_NO_FATAL_FAILURE(run_ordered_logits(hidden, scores, ordering, head, n, E, C, top_k, logits, picked));
  for (int32_t r = 0; r < n; ++r) {
    std::vector<int32_t> order(C);
    std::iota(order.begin(), order.end(), 0);
    std::vector<float> sane(scores.begin() + r * C, scores.begin() + (r + 1) * C);
    for (float& v : sane) v = std::isnan(v) ? -INFINITY : v;  // the rank NaN takes
    const float* sr = sane.data();
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sr[a] > sr[b]; });
    const float cut = sr[order[static_cast<size_t>(top_k - 1)]];
    EXPECT_EQ(cut, sr[order[static_cast<size_t>(top_k)]]) << "row " << r << " ties at the cut";
    for (int32_t k = 0; k < top_k; ++k) {
      for (int32_t j = 0; j < per; ++j) {
        ASSERT_EQ(picked[0][static_cast<size_t>(r * n_picked + k * per + j)],
                  ordering[static_cast<size_t>(order[static_cast<size_t>(k)] * per + j)])
            << "row " << r << " pick " << k;
      }
    }
  }
}

// Gemma 4's per-layer input gate (gate and up in separate strided views)
// and the residual stream converted to the matmul input dtype.
TEST_P(BackendOps, Gemma4GluSplitAndConvert) {
  if (!dev_.b->has_gemma4_ops()) GTEST_SKIP() << dev_.b->name() << " has no Gemma 4 ops";
  const int64_t n = 5, F = 40, stride = 3 * F;
  const auto buf = random_floats(n * stride, 15, -4, 4);
  std::vector<std::vector<float>> outs[4];
  for (Side* s : {&ref_, &dev_}) {
    const DType out_t = s == &ref_ ? DType::kF32 : act();
    Tensor all = s->tensor(buf, n, stride, DType::kF32);
    for (int k = 0; k < 2; ++k) {
      Tensor out = s->tensor(std::vector<float>(n * F, NAN), n, F, out_t);
      s->b->glu_split(k == 0 ? Glu::kSilu : Glu::kGeluTanh, all.cols_from(2 * F, F), all.cols_from(0, F), out);
      outs[k].push_back(s->read(out));
    }
    Tensor x = s->tensor(buf, n, stride, DType::kF32);
    Tensor out = s->tensor(std::vector<float>(n * stride, NAN), n, stride, out_t);
    s->b->convert(x, out);
    outs[2].push_back(s->read(out));
    // Strided in and out: a column range of x into the second half of a
    // wider row (Gemma 4's assistant's input).
    Tensor wide = s->tensor(std::vector<float>(n * 2 * F, 0.0f), n, 2 * F, out_t);
    s->b->convert(x.cols_from(F, F), wide.cols_from(F, F));
    outs[3].push_back(s->read(wide));
  }
  expect_close(outs[3][1], outs[3][0], tol(0, act()), "convert into strided rows");
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < F; ++i) {
      ASSERT_EQ(outs[3][0][static_cast<size_t>(r * 2 * F + i)], 0.0f) << "convert wrote outside its columns";
      ASSERT_EQ(outs[3][0][static_cast<size_t>(r * 2 * F + F + i)], buf[static_cast<size_t>(r * stride + F + i)]);
    }
  }
  expect_close(outs[0][1], outs[0][0], tol(1e-5, act()), "silu glu_split");
  expect_close(outs[1][1], outs[1][0], tol(1e-5, act()), "gelu_tanh glu_split");
  expect_close(outs[2][1], outs[2][0], tol(0, act()), "convert");
  // The CPU reference against the formula.
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < F; ++i) {
      const float g = buf[static_cast<size_t>(r * stride + 2 * F + i)], u = buf[static_cast<size_t>(r * stride + i)];
      const float want = 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
      ASSERT_NEAR(outs[1][0][static_cast<size_t>(r * F + i)], want, 1e-5f * (1.0f + std::fabs(want)));
    }
  }
}

TEST_P(BackendOps, AttentionOverPagedKvForAWholeStep) {
  // head_dim 16: the goldens' heads, two to a q8_0 block (CUDA rotates
  // those by a block per head); 32 and 64: CUDA's warp rotation with one
  // and two elements a lane (rotate_heads_warp_kernel)
  for (const int32_t hd : {64, 32, 16}) {
    const int32_t n_head = 8, n_head_kv = 2, shift = 4, n_blocks = 64;
    const int64_t Q = n_head * hd, KV = n_head_kv * hd, QKV = Q + 2 * KV;
    // decode (1 and 3 tokens), a prefill chunk of 40 after 30 cached, a whole prompt of 70
    const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 300}, {3, 17}, {40, 70}, {70, 70}};
    // q8_0h / q4_0h / iq4_nlh / q8_0h64: K and V rotated per head; the query is rotated and
    // the output rotated back by each backend itself.
    for (const KvKind kind : kKvKinds) {
      const DType kv_t = kind.dtype;
      if (blocks_of_64(kv_t) && hd % 64 != 0) continue;  // blocks of 64 need whole heads of them
      for (int variant = 0; variant < 2; ++variant) {
        std::vector<std::vector<float>> outs;
        for (Side* s : {&ref_, &dev_}) {
          const HostStep hs(seqs, shift, n_blocks, 13, s->b->attention_routing(kv_t, hd));
          ASSERT_TRUE(s->b->reserve({hs.n_tokens, n_head, hd}).ok());
          const StepMetadata md = hs.place(*s);
          KvPlanes kv = make_kv(*s, kv_t, shift, n_blocks, KV, 14, kind.rotated, hd);
          AttentionOp op;
          Tensor qkv = s->tensor(random_floats(hs.n_tokens * QKV, 15, -1, 1), hs.n_tokens, QKV, DType::kF32);
          op.q = qkv.cols_from(0, Q);
          op.out = s->tensor(std::vector<float>(hs.n_tokens * Q, NAN), hs.n_tokens, Q,
                             s == &ref_ ? DType::kF32 : s->b->act_dtype());
          op.n_head = n_head;
          op.n_head_kv = n_head_kv;
          op.head_dim = hd;
          op.scale = 0.125f;
          op.softcap = variant == 1 ? 20.0f : 0.0f;
          op.window = variant == 1 ? 24 : 0;
          op.kv = kv.view;
          s->b->attention(op, md);
          outs.push_back(s->read(op.out));
        }
        // Q8_0 / Q4_0 / IQ4_NL / Q8_0_64: both dequantize the same blocks to the same f32
        // products (scale * level) and differ in summation order only, as
        // f32, except where CUDA's prefill takes the tensor cores (head_dim
        // 64): those round q, the probabilities and the values to f16, as
        // for f16 KV. Rotated: the query is rotated by the same butterflies
        // on both (the same bits), the output rotated back in f32 (a sum of
        // head_dim products more: within the same bounds).
        const bool blocks = block_kv(kv_t);
        const bool f16_prefill = kv_t == DType::kF16 || (blocks && hd == 64);
        expect_close(
            outs[1], outs[0],
            tol(f16_prefill ? 4e-3
                : blocks    ? 2e-5
                            : 1e-5,
                act()),
            "attention variant " + std::to_string(variant) + " kv " + kind.name() + " head_dim " + std::to_string(hd));
      }
    }
  }
}

// Sink logits (gpt-oss): head h's softmax denominator also holds
// exp(sinks[h]). The CPU's sinks run over f32 KV only, so an f16 cache is
// held to the CPU over f32 planes of the same (f16-rounded) values; the
// tolerance is the f16 kernels' (the tensor-core prefill rounds q and the
// probabilities to f16). Shapes: gpt-oss-20b's heads (64, 8 q heads per KV
// head), the fast decode kernel's head-owning path (128, 4), 64 with 4, and
// the HF golden's 16 (the general kernels); full and sliding (window 24:
// the 300-key decode token's first split holds no key of its window). One
// sink dominates (8), one vanishes (-20), the rest are the scores' size.
// (The CPU instance runs f32 KV: its f16 kernels have no sinks.)
TEST_P(BackendOps, AttentionWithSinksOverPagedKv) {
  struct Shape {
    int32_t n_head, n_head_kv, hd;
  };
  const int32_t shift = 4, n_blocks = 64;
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 300}, {3, 17}, {40, 70}, {70, 70}};
  for (const Shape sh : {Shape{8, 1, 64}, Shape{8, 2, 128}, Shape{8, 2, 64}, Shape{4, 2, 16}}) {
    const int64_t Q = int64_t{sh.n_head} * sh.hd, KV = int64_t{sh.n_head_kv} * sh.hd, QKV = Q + 2 * KV;
    std::vector<float> sinks = random_floats(sh.n_head, 16, -1, 3);
    sinks[1] = 8.0f;
    sinks[2] = -20.0f;
    for (DType kv_t : {DType::kF32, DType::kF16}) {
      if (kv_t == DType::kF16 && exact_) continue;  // the CPU's f16 kernels have no sinks
      for (int32_t window : {0, 24}) {
        std::vector<std::vector<float>> outs;
        for (Side* s : {&ref_, &dev_}) {
          const DType stored = s == &ref_ ? DType::kF32 : kv_t;
          const HostStep hs(seqs, shift, n_blocks, 13, s->b->attention_routing(stored, sh.hd));
          ASSERT_TRUE(s->b->reserve({hs.n_tokens, sh.n_head, sh.hd}).ok());
          const StepMetadata md = hs.place(*s);
          KvPlanes kv;
          kv.view.dtype = stored;
          kv.view.block_shift = shift;
          kv.view.row_bytes = static_cast<size_t>(KV) * elem_bytes(stored);
          kv.view.block_stride = kv.view.row_bytes << shift;
          const int64_t n_elems = KV * (int64_t{1} << shift) * n_blocks;
          const auto k = encode(stored, rounded(kv_t, random_floats(n_elems, 14)));
          const auto v = encode(stored, rounded(kv_t, random_floats(n_elems, 15)));
          kv.view.k = s->put(k.data(), k.size());
          kv.view.v = s->put(v.data(), v.size());
          AttentionOp op;
          Tensor qkv = s->tensor(random_floats(hs.n_tokens * QKV, 17, -1, 1), hs.n_tokens, QKV, DType::kF32);
          op.q = qkv.cols_from(0, Q);
          op.out = s->tensor(std::vector<float>(hs.n_tokens * Q, NAN), hs.n_tokens, Q,
                             s == &ref_ ? DType::kF32 : s->b->act_dtype());
          op.n_head = sh.n_head;
          op.n_head_kv = sh.n_head_kv;
          op.head_dim = sh.hd;
          op.scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
          op.window = window;
          op.kv = kv.view;
          op.sinks = s->vec(sinks);
          s->b->attention(op, md);
          outs.push_back(s->read(op.out));
        }
        expect_close(outs[1], outs[0], tol(kv_t == DType::kF16 ? 4e-3 : 1e-5, act()),
                     "attention with sinks, head_dim " + std::to_string(sh.hd) + ", " + std::to_string(sh.n_head) +
                         "/" + std::to_string(sh.n_head_kv) + " heads, window " + std::to_string(window) + ", kv " +
                         std::string(dtype_name(kv_t)));
      }
    }
  }
}

// A step of three sequences over a pool of 3 slots + 3 checkpoints + 1
// scratch, two layers (the op runs on layer 1): one from zeros with a
// snapshot after its third token, a decode token from its slot, one
// restored from checkpoint 0 with a snapshot after its last token.
TEST_P(BackendOps, GatedDeltaOverStatesWithSnapshots) {
  const int32_t nk = 2, nv = 4, dk = 16, dv = 16, K = 4;
  const int64_t kd = nk * dk, vd = nv * dv, cd = 2 * kd + vd, P = cd + vd + 2 * nv;
  const int64_t layer_floats = cd * (K - 1) + int64_t{nv} * dk * dv, stride = 2 * layer_floats, n_ids = 7;
  const std::vector<RecurrentSeq> seqs = {{0, 5, -1, 0, 0, 1}, {5, 1, 1, 1, 1, 0}, {6, 3, 3, 2, 1, 1}};
  const std::vector<RecurrentSave> saves = {{2, 4}, {2, 5}};  // checkpoints 1 and 2
  const std::vector<int32_t> tok_seq = {0, 0, 0, 0, 0, 1, 2, 2, 2};
  const int64_t n = 9;
  std::vector<float> neg_a = random_floats(nv, 30, 0.0f, 1.0f);
  for (float& a : neg_a) a = -std::exp(a);
  const auto states0 = random_floats(n_ids * stride, 31, -0.3f, 0.3f);
  std::vector<std::vector<float>> cores, states;
  for (Side* s : {&ref_, &dev_}) {
    GatedDeltaOp op;
    op.proj = s->tensor(random_floats(n * P, 32, -1, 1), n, P, DType::kF32);
    op.b_col = cd + vd;
    op.a_col = op.b_col + nv;
    op.n_k_heads = nk;
    op.n_v_heads = nv;
    op.head_k_dim = dk;
    op.head_v_dim = dv;
    op.conv_kernel = K;
    op.conv_w = s->vec(random_floats(cd * K, 33, -0.5f, 0.5f));
    op.neg_a = s->vec(neg_a);
    op.dt_bias = s->vec(random_floats(nv, 34));
    auto* pool = s->put(states0);
    op.states = pool + layer_floats;
    op.state_stride = stride;
    op.mixed = s->tensor(std::vector<float>(n * cd, 0.0f), n, cd, DType::kF32);
    op.g = s->tensor(std::vector<float>(n * nv, 0.0f), n, nv, DType::kF32);
    op.beta = s->tensor(std::vector<float>(n * nv, 0.0f), n, nv, DType::kF32);
    op.core = s->tensor(std::vector<float>(n * vd, NAN), n, vd, DType::kF32);
    StepMetadata md;
    md.n_tokens = static_cast<int32_t>(n);
    md.recurrent = {s->put(seqs), 3, s->put(saves), 2, s->put(tok_seq), n};
    s->b->gated_delta(op, md);
    cores.push_back(s->read(op.core));
    states.push_back(s->read(Tensor::dense(pool, DType::kF32, n_ids, stride)));
  }
  expect_close(cores[1], cores[0], tol(1e-4), "gated_delta core");
  expect_close(states[1], states[0], tol(1e-4), "gated_delta states");
  // Layer 0 and the states only read (checkpoint 0) or unused (the
  // scratch) keep their bits; slot 0 (from zeros) no longer holds its old ones.
  for (int64_t id = 0; id < n_ids; ++id) {
    for (int64_t i = 0; i < layer_floats; ++i) ASSERT_EQ(states[0][id * stride + i], states0[id * stride + i]);
  }
  for (int64_t id : {3, 6}) {
    for (int64_t i = 0; i < layer_floats; ++i) {
      ASSERT_EQ(states[0][id * stride + layer_floats + i], states0[id * stride + layer_floats + i]);
    }
  }
  EXPECT_NE(states[0][layer_floats], states0[layer_floats]);
}

TEST_P(BackendOps, GatedRmsNormAndSigmoidMul) {
  const int64_t n = 5, nh = 4, hd = 32, W = nh * hd, zs = W + 16;
  const auto core = random_floats(n * W, 20, -2, 2), z = random_floats(n * W, 21, -3, 3);
  const auto w = random_floats(hd, 22), x = random_floats(n * W, 23, -2, 2);
  std::vector<std::vector<float>> normed, gated;
  for (Side* s : {&ref_, &dev_}) {
    const DType out_t = s == &ref_ ? DType::kF32 : act();
    Tensor out = s->tensor(std::vector<float>(n * W, NAN), n, W, out_t);
    s->b->gated_rms_norm(s->tensor(core, n, W, DType::kF32), s->tensor(z, n, W, DType::kF32, zs), s->vec(w),
                         static_cast<int32_t>(hd), 1e-6f, out);
    normed.push_back(s->read(out));
    Tensor out2 = s->tensor(std::vector<float>(n * W, NAN), n, W, out_t);
    s->b->sigmoid_mul(s->tensor(x, n, W, DType::kF32), s->tensor(z, n, W, DType::kF32, zs), out2);
    gated.push_back(s->read(out2));
  }
  expect_close(normed[1], normed[0], tol(1e-5, act()), "gated_rms_norm");
  expect_close(gated[1], gated[0], tol(1e-5, act()), "sigmoid_mul");
  if (!exact_) return;
  // The CPU's tiled order (qwen35 GGUF): head g*r + j written at j*nk + g.
  const int64_t nk = 2, r = nh / nk;
  Tensor out = ref_.tensor(std::vector<float>(n * W, NAN), n, W, DType::kF32);
  ref_.b->gated_rms_norm(ref_.tensor(core, n, W, DType::kF32), ref_.tensor(z, n, W, DType::kF32, zs), ref_.vec(w),
                         static_cast<int32_t>(hd), 1e-6f, out, static_cast<int32_t>(nk));
  const std::vector<float> tiled = ref_.read(out);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < hd; ++i) {
        ASSERT_EQ(tiled[(t * nh + (h % r) * nk + h / r) * hd + i], normed[0][(t * nh + h) * hd + i]);
      }
    }
  }
}

// Multi-head latent attention (DeepSeek-V3, MiniCPM3), on backends that
// have the ops: matmul_heads over strided head columns, rope_store_latent
// into a cache of random earlier rows (decode, a chunk, a whole prompt),
// latent_attention over it. W_uk^T and W_uv in the activation dtype on
// both sides (CUDA places float weights in it). Tolerances as the ops they
// stand for: RoPE and the stores 2e-5 (f16 KV: the rounding, 2e-3),
// attention 1e-5 (f16 KV 4e-3), the products 1e-4.
TEST_P(BackendOps, MultiHeadLatentAttention) {
  if (!dev_.b->has_mla_ops()) GTEST_SKIP() << dev_.b->name() << " has no MLA ops yet";
  check_mla({4, 16, 8, 32, 12, 32, {{1, 30}, {3, 11}, {9, 9}}, 0.2f, 1.0f});
}

// The same at the models' widths, where CUDA's tensor-core kernels run
// (matmul_heads on F16 / BF16 weights, latent_attention on F16 rows: L 512
// and 256, the second with a partial group of 16 heads), over more than
// one chunk of 64 keys; scale and weights as the models' (scores of a few
// units).
TEST_P(BackendOps, MultiHeadLatentAttentionAtModelWidths) {
  if (!dev_.b->has_mla_ops()) GTEST_SKIP() << dev_.b->name() << " has no MLA ops yet";
  check_mla({16, 128, 64, 512, 128, 96, {{1, 150}, {3, 70}, {40, 40}, {2, 65}}, 0.072f, 0.1f});
  check_mla({20, 64, 32, 256, 64, 96, {{1, 130}, {33, 33}}, 0.1f, 0.15f});
}

void BackendOps::check_mla(const MlaShape& m) {
  const int32_t H = m.H, nope = m.nope, rope_dim = m.rope_dim, lora = m.lora, v_dim = m.v_dim, qk = nope + rope_dim;
  const int32_t shift = 2, n_blocks = m.n_blocks;
  const LatentKvRow row{lora, rope_dim};
  const auto& seqs = m.seqs;
  const auto wk = encode(act(), random_floats(H * lora * nope, 21, -m.w_range, m.w_range));
  const auto wv = encode(act(), random_floats(H * v_dim * lora, 22, -m.w_range, m.w_range));
  const size_t es = elem_bytes(act());
  const auto kv_norm = random_floats(lora, 23);
  const RopeTable table = cpu::make_rope_table(10000.0f, rope_dim, /*interleaved=*/true);
  for (DType kv_t : {DType::kF32, DType::kF16}) {
    std::vector<std::vector<float>> qs, ks, vs, lats, outs;
    for (Side* s : {&ref_, &dev_}) {
      const HostStep hs(seqs, shift, n_blocks, 24, s->b->attention_routing(kv_t, qk));
      const int32_t T = hs.n_tokens;
      const Weight w_k = s->place({{wk.data(), act(), H * lora, nope, nope * es}});
      const Weight w_v = s->place({{wv.data(), act(), H * v_dim, lora, lora * es}});
      auto rope = s->b->place_rope(table);
      ASSERT_TRUE(rope.ok());
      StepLimits lim{T, H, qk};
      lim.max_head_cols = lora;
      ASSERT_TRUE(s->b->reserve(lim).ok());
      const StepMetadata md = hs.place(*s);
      KvPlanes kv = make_kv(*s, kv_t, shift, n_blocks, row.plane_width(), 25);
      LatentKvOp st;
      st.q = s->tensor(random_floats(T * H * qk, 26, -2, 2), T, H * qk, DType::kF32, H * qk + 4);
      st.kv = s->tensor(random_floats(T * row.row_width(), 27, -2, 2), T, row.row_width(), DType::kF32);
      st.n_head = H;
      st.q_head_dim = qk;
      st.q_rope_col = nope;
      st.kv_lora_rank = lora;
      st.rope_dim = rope_dim;
      st.kv_norm = s->vec(kv_norm);
      st.rope = *rope;
      st.kv_cache = kv.view;
      s->b->rope_store_latent(st, md);
      qs.push_back(s->read(st.q));
      ks.push_back(read_plane(*s, kv.view.k, kv.bytes, kv_t));
      vs.push_back(read_plane(*s, kv.view.v, kv.bytes, kv_t));
      LatentAttentionOp at;
      at.q_latent = s->tensor(std::vector<float>(T * H * lora, NAN), T, H * lora, DType::kF32);
      s->b->matmul_heads(w_k, H, st.q, qk, at.q_latent, lora);
      at.q_rope = st.q.cols_from(nope, H * qk - nope);
      at.q_rope_step = qk;
      at.out = s->tensor(std::vector<float>(T * H * lora, NAN), T, H * lora, DType::kF32);
      at.n_head = H;
      at.kv_lora_rank = lora;
      at.rope_dim = rope_dim;
      at.scale = m.scale;
      at.kv = kv.view;
      s->b->latent_attention(at, md);
      lats.push_back(s->read(at.out));
      const Tensor out = s->tensor(std::vector<float>(T * H * v_dim, NAN), T, H * v_dim, DType::kF32);
      s->b->matmul_heads(w_v, H, at.out, lora, out, v_dim);
      outs.push_back(s->read(out));
    }
    const std::string what = "MLA L " + std::to_string(lora) + " kv " + std::string(dtype_name(kv_t));
    const double store = kv_t == DType::kF16 ? 2e-3 : 2e-5;
    expect_close(qs[1], qs[0], tol(2e-5), what + " q (rope dims rotated)");
    expect_close(ks[1], ks[0], tol(store), what + " K plane");
    expect_close(vs[1], vs[0], tol(store), what + " V plane");
    expect_close(lats[1], lats[0], tol(kv_t == DType::kF16 ? 4e-3 : 1e-4), what + " latent attention");
    expect_close(outs[1], outs[0], tol(kv_t == DType::kF16 ? 4e-3 : 1e-4), what + " output");
  }
}

// DeepSeek sparse attention's indexer (GLM-5) on backends with the MLA
// ops: keys stored into the indexer columns of latent rows (decode, a
// chunk, whole prompts, sequences with fewer keys than topk), queries
// rotated, and the top-k selection over random earlier rows, where many
// keys score exactly 0 (every head's dot product negative: ReLU) so ties
// fall at the cut. The selection must be the CPU's exactly; then
// latent_attention over the selected keys only (4 heads over the rows'
// latent and rope columns), 1e-4 (f16 KV 4e-3) as above.
TEST_P(BackendOps, LightningIndexSelectsAsTheCpu) {
  if (!dev_.b->has_mla_ops()) GTEST_SKIP() << dev_.b->name() << " has no MLA ops yet";
  const int32_t H = 2, D = 16, rope_dim = 8, topk = 8, shift = 2, n_blocks = 40;
  const LatentKvRow row{16, rope_dim, D};
  const std::vector<std::pair<int32_t, int32_t>> seqs = {{1, 37}, {3, 11}, {12, 12}, {1, 5}, {2, 8}};
  const RopeTable table = cpu::make_rope_table(10000.0f, rope_dim, /*interleaved=*/true);
  for (DType kv_t : {DType::kF32, DType::kF16}) {
    std::vector<std::vector<float>> qs, ks, vs, lats;
    std::vector<std::vector<int32_t>> sels, counts;
    for (Side* s : {&ref_, &dev_}) {
      const HostStep hs(seqs, shift, n_blocks, 31, s->b->attention_routing(kv_t, D));
      const int32_t T = hs.n_tokens;
      auto rope = s->b->place_rope(table);
      ASSERT_TRUE(rope.ok());
      StepLimits lim{T, H, D};
      lim.max_index_keys = 64;
      ASSERT_TRUE(s->b->reserve(lim).ok());
      const StepMetadata md = hs.place(*s);
      KvPlanes kv = make_kv(*s, kv_t, shift, n_blocks, row.plane_width(), 32);
      LightningIndexOp ix;
      ix.q = s->tensor(random_floats(T * H * D, 33, -2, 2), T, H * D, DType::kF32, H * D + 3);
      const Tensor kw = s->tensor(random_floats(T * (D + H), 34, -2, 2), T, D + H, DType::kF32);
      ix.k = kw.cols_from(0, D);
      ix.w = kw.cols_from(D, H);
      ix.n_head = H;
      ix.head_dim = D;
      ix.rope_dim = rope_dim;
      ix.score_scale = 0.25f;
      ix.weight_scale = 0.7f;
      ix.rope = *rope;
      ix.key_col = row.index_col();
      ix.topk = topk;
      ix.selected = s->put(std::vector<int32_t>(static_cast<size_t>(T * topk), -1));
      ix.n_selected = s->put(std::vector<int32_t>(static_cast<size_t>(T), -1));
      ix.kv = kv.view;
      s->b->lightning_index(ix, md);
      qs.push_back(s->read(ix.q));
      ks.push_back(read_plane(*s, kv.view.k, kv.bytes, kv_t));
      vs.push_back(read_plane(*s, kv.view.v, kv.bytes, kv_t));
      std::vector<int32_t> sel(static_cast<size_t>(T * topk)), n_sel(static_cast<size_t>(T));
      ASSERT_TRUE(s->b->copy_out(sel.data(), ix.selected, sel.size() * 4).ok());
      ASSERT_TRUE(s->b->copy_out(n_sel.data(), ix.n_selected, n_sel.size() * 4).ok());
      for (size_t t = 0; t < n_sel.size(); ++t) {  // entries past a token's count are unspecified
        for (int32_t i = std::max(0, n_sel[t]); i < topk; ++i) sel[t * topk + static_cast<size_t>(i)] = -1;
      }
      sels.push_back(sel);
      counts.push_back(n_sel);
      const int32_t n_attn_heads = 4;
      LatentAttentionOp at;
      at.q_latent = s->tensor(random_floats(T * n_attn_heads * row.kv_lora_rank, 35, -2, 2), T,
                              n_attn_heads * row.kv_lora_rank, DType::kF32);
      at.q_rope = s->tensor(random_floats(T * n_attn_heads * rope_dim, 36, -2, 2), T, n_attn_heads * rope_dim,
                            DType::kF32, n_attn_heads * rope_dim + 5);
      at.q_rope_step = rope_dim;
      at.out = s->tensor(std::vector<float>(T * n_attn_heads * row.kv_lora_rank, NAN), T,
                         n_attn_heads * row.kv_lora_rank, DType::kF32);
      at.n_head = n_attn_heads;
      at.kv_lora_rank = row.kv_lora_rank;
      at.rope_dim = rope_dim;
      at.scale = 0.2f;
      at.kv = kv.view;
      at.selected = ix.selected;
      at.n_selected = ix.n_selected;
      at.selected_stride = topk;
      s->b->latent_attention(at, md);
      lats.push_back(s->read(at.out));
    }
    const std::string what = "lightning_index kv " + std::string(dtype_name(kv_t));
    expect_close(qs[1], qs[0], tol(2e-5), what + " q (rope dims rotated)");
    expect_close(ks[1], ks[0], tol(kv_t == DType::kF16 ? 2e-3 : 2e-5), what + " K plane");
    expect_close(vs[1], vs[0], tol(kv_t == DType::kF16 ? 2e-3 : 2e-5), what + " V plane");
    EXPECT_EQ(counts[1], counts[0]) << what;
    EXPECT_EQ(sels[1], sels[0]) << what << ": the selected keys";
    expect_close(lats[1], lats[0], tol(kv_t == DType::kF16 ? 4e-3 : 1e-4), what + " sparse latent attention");
  }
}

// LayerNorm (the indexer's key norm) over strided rows, in place.
TEST_P(BackendOps, LayerNormInPlaceOverStridedRows) {
  if (!dev_.b->has_mla_ops() && !dev_.b->has_encoder_ops()) GTEST_SKIP() << dev_.b->name() << " has no layer_norm";
  const int64_t n = 9, D = 48, stride = 56;
  const auto x = random_floats(n * D, 40, -3, 3), w = random_floats(D, 41), b = random_floats(D, 42);
  std::vector<std::vector<float>> outs;
  for (Side* s : {&ref_, &dev_}) {
    const Tensor xt = s->tensor(x, n, D, DType::kF32, stride);
    s->b->layer_norm(xt, s->vec(w), s->vec(b), 1e-6f, xt);
    outs.push_back(s->read(xt));
  }
  expect_close(outs[1], outs[0], tol(1e-5), "layer_norm");
}

// The MoE layers of the families, small and random:
//  kSoftmax:  softmax top-k, renormalised, SwiGLU experts (Mixtral, Qwen3-MoE),
//             with or without a sigmoid-gated shared expert (Qwen3-Next);
//  kDeepSeek: sigmoid scores, score correction bias, 4 groups of 2 experts
//             with 2 kept, renormalised, routed_scaling_factor 2.5 and an
//             ungated shared expert (DeepSeek-V3, GLM-4.5 / GLM-5);
//  kGptOss:   the router's bias, top-k then softmax, clamped SwiGLU (alpha
//             1.702, limit 7), biases on every expert's gate/up/down;
//  kGemma4:   GeGLU experts, per-expert scales, the router reading its own
//             input, the output overwritten (not accumulated);
//  kGptOssMxfp4: kGptOss with its expert matrices in MXFP4 (gpt-oss's GGUF).
enum class MoeVariant { kSoftmax, kDeepSeek, kGptOss, kGemma4, kGptOssMxfp4 };

struct RandomMoeLayer {
  MoeParams p;
  std::vector<std::vector<uint8_t>> store;
  std::vector<std::vector<float>> vectors;
  HostMoe host;
  HostMatrix mat(int64_t rows, int64_t cols, DType t, uint32_t seed) {
    if (dtype_info(t).quantized) {
      store.push_back(cpu::testing::random_weight_rows(t, rows, cols, seed));
    } else {
      store.push_back(encode(t, random_floats(rows * cols, seed, -0.5f, 0.5f)));
    }
    return {store.back().data(), t, rows, cols, row_bytes(t, cols)};
  }
  const float* vec(int64_t n, uint32_t seed, float lo, float hi) {
    vectors.push_back(random_floats(n, seed, lo, hi));
    return vectors.back().data();
  }
  RandomMoeLayer(int64_t n_ff_shared, DType t, MoeVariant v = MoeVariant::kSoftmax) {
    const bool oss = v == MoeVariant::kGptOss || v == MoeVariant::kGptOssMxfp4;
    p.n_embd = 64;
    p.n_expert = 8;
    p.n_expert_used = v == MoeVariant::kDeepSeek ? 3 : 2;
    p.n_ff = v == MoeVariant::kGptOssMxfp4 ? 64 : 40;  // MXFP4 rows: whole blocks of 32
    p.n_ff_shared = n_ff_shared;
    if (v == MoeVariant::kDeepSeek) {
      p.sigmoid_scores = true;
      p.n_group = 4;
      p.topk_group = 2;
      p.routed_scaling_factor = 2.5f;
      p.shared_gate = false;
    }
    if (oss) {
      p.softmax_after_topk = true;
      p.swiglu_limit = 7.0f;
      p.swiglu_alpha = 1.702f;
    }
    p.gelu_tanh = v == MoeVariant::kGemma4;
    const DType et = v == MoeVariant::kGptOssMxfp4 ? DType::kMXFP4 : t;
    store.reserve(static_cast<size_t>(3 * p.n_expert + 5));  // the matrices keep their addresses
    vectors.reserve(static_cast<size_t>(3 * p.n_expert + 5));
    host.p = p;
    host.router = mat(p.n_expert, p.n_embd, t, 800);
    for (int64_t e = 0; e < p.n_expert; ++e) {
      const auto seed = static_cast<uint32_t>(810 + 3 * e);
      host.experts.push_back(
          {mat(p.n_ff, p.n_embd, et, seed), mat(p.n_ff, p.n_embd, et, seed + 1), mat(p.n_embd, p.n_ff, et, seed + 2)});
      if (oss) {
        HostExpert& x = host.experts.back();
        x.gate_bias = vec(p.n_ff, seed + 100, -1, 1);
        x.up_bias = vec(p.n_ff, seed + 101, -1, 1);
        x.down_bias = vec(p.n_embd, seed + 102, -1, 1);
      }
    }
    if (n_ff_shared > 0) {
      host.shared = HostExpert{mat(n_ff_shared, p.n_embd, t, 850), mat(n_ff_shared, p.n_embd, t, 851),
                               mat(p.n_embd, n_ff_shared, t, 852)};
      if (p.shared_gate) host.shared_gate = mat(1, p.n_embd, t, 853);
    }
    if (oss) host.router_bias = vec(p.n_expert, 870, -1, 1);
    if (v == MoeVariant::kDeepSeek) host.score_bias = vec(p.n_expert, 871, -0.2f, 0.2f);
    if (v == MoeVariant::kGemma4) host.expert_scale = vec(p.n_expert, 872, 0.5f, 2.0f);
  }
};

const char* variant_name(MoeVariant v) {
  switch (v) {
    case MoeVariant::kSoftmax:
      return "softmax";
    case MoeVariant::kDeepSeek:
      return "deepseek sigmoid groups";
    case MoeVariant::kGptOss:
      return "gpt-oss";
    case MoeVariant::kGemma4:
      return "gemma4 geglu";
    case MoeVariant::kGptOssMxfp4:
      return "gpt-oss mxfp4";
  }
  return "?";
}

// out (+)= MoE(in) of one variant for a decode step (CUDA: device routing)
// and a prefill step (CUDA: the grouped GEMMs for bf16/f16 float experts),
// both backends from the same inputs. Gemma 4's router reads its own input
// and the output is overwritten.
void run_moe_case(Side& ref, Side& dev, MoeVariant v, int64_t shared, DType act, double tol) {
  const int64_t n = 23, E = 64;
  const RandomMoeLayer layer(shared, act, v);
  const bool gemma = v == MoeVariant::kGemma4;
  const auto in = rounded(act, random_floats(n * E, 860, -2, 2));
  const auto router_in = rounded(act, random_floats(n * E, 862, -2, 2));
  const auto residual = random_floats(n * E, 861);
  for (bool prefill : {false, true}) {
    std::vector<std::vector<float>> outs;
    for (Side* s : {&ref, &dev}) {
      auto w = s->b->place_moe(layer.host, "test MoE layer");
      ASSERT_TRUE(w.ok()) << w.error().message;
      ASSERT_TRUE(s->b->reserve({n, 1, 64}).ok());
      const DType t = s == &ref ? DType::kF32 : act;
      const Tensor x = s->tensor(in, n, E, t);
      const Tensor r = gemma ? s->tensor(router_in, n, E, t) : x;
      Tensor out = s->tensor(residual, n, E, DType::kF32);
      StepMetadata step;
      step.n_tokens = static_cast<int32_t>(n);
      step.n_tiles = prefill ? 1 : 0;  // only the routing is read
      const Status st = s->b->moe_ffn(*w, r, x, out, !gemma, step);
      ASSERT_TRUE(st.ok()) << st.error().message;
      outs.push_back(s->read(out));
    }
    const std::string what = std::string("moe_ffn ") + variant_name(v) + " shared " + std::to_string(shared) +
                             (prefill ? " prefill" : " decode");
    expect_close(outs[1], outs[0], tol, what);
  }
}

// CUDA rounds act(gate) * up to act before down and multiplies in act.
TEST_P(BackendOps, MoeFfnRoutedAndSharedExperts) {
  for (int64_t shared : {int64_t{0}, int64_t{48}}) {
    run_moe_case(ref_, dev_, MoeVariant::kSoftmax, shared, act(), exact_ ? 0 : act() == DType::kF32 ? 1e-4 : 2e-2);
  }
}

// DeepSeek-V3 / GLM-4.5 / GLM-5: the group-limited sigmoid router with its
// correction bias and scaling, an ungated shared expert.
TEST_P(BackendOps, MoeFfnSigmoidGroupRouterAndUngatedSharedExpert) {
  for (int64_t shared : {int64_t{0}, int64_t{48}}) {
    run_moe_case(ref_, dev_, MoeVariant::kDeepSeek, shared, act(), exact_ ? 0 : act() == DType::kF32 ? 1e-4 : 2e-2);
  }
}

// gpt-oss: router bias, top-k then softmax, clamped SwiGLU, expert biases.
TEST_P(BackendOps, MoeFfnGptOssRouterClampedSwigluAndBiases) {
  run_moe_case(ref_, dev_, MoeVariant::kGptOss, 0, act(), exact_ ? 0 : act() == DType::kF32 ? 1e-4 : 2e-2);
}

// Gemma 4: GeGLU experts, per-expert scales, a router input of its own, out
// overwritten.
TEST_P(BackendOps, MoeFfnGemma4GegluScalesAndRouterInput) {
  run_moe_case(ref_, dev_, MoeVariant::kGemma4, 0, act(), exact_ ? 0 : act() == DType::kF32 ? 1e-4 : 2e-2);
}

// gpt-oss's GGUF experts in MXFP4: the CPU multiplies them with x quantized
// to Q8_0 (llama.cpp's pairing), CUDA with x in act (decoded blocks): the
// quantized-weights tolerance, 3e-2.
TEST_P(BackendOps, MoeFfnMxfp4Experts) {
  run_moe_case(ref_, dev_, MoeVariant::kGptOssMxfp4, 0, act(), exact_ ? 0 : 3e-2);
}

// Options a Backend does not run are refused at placement, by name (CUDA:
// more than 32 expert groups).
TEST_P(BackendOps, MoePlacementRefusesWhatTheBackendDoesNotRun) {
  RandomMoeLayer layer(0, act());
  layer.host.p.n_expert = 64;
  layer.host.p.n_group = 64;
  layer.host.p.topk_group = 1;
  layer.host.p.sigmoid_scores = true;
  layer.host.experts.resize(64, layer.host.experts[0]);
  layer.host.router = layer.mat(64, 64, act(), 801);  // store keeps its reserved room: no reallocation
  auto w = dev_.b->place_moe(layer.host, "sigmoid layer");
  if (exact_) {
    EXPECT_TRUE(w.ok()) << w.error().message;
  } else {
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.error().message.find("sigmoid layer"), std::string::npos) << w.error().message;
    EXPECT_NE(w.error().message.find("groups"), std::string::npos) << w.error().message;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, BackendOps, ::testing::ValuesIn(instances()),
                         [](const ::testing::TestParamInfo<Instance>& i) { return i.param.name; });

}  // namespace
}  // namespace rill
