// The CPU Backend against the CPU kernels it composes: each fused op gives
// exactly the bits of the kernel calls the CPU families made before
// (cpu::HostOps'), so a family ported to Backend keeps llama.cpp parity and
// batch invariance. (The kernels themselves are held to the scalar
// references in ops_test.cpp, matmul_test.cpp and quants_test.cpp.)
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/attention_f16.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/rope_table.h"
#include "core/half.h"
#include "quant_test_util.h"

namespace rill {
namespace {

using cpu::testing::random_floats;
using cpu::testing::random_weight_rows;

TEST(CpuBackend, FusedMatmulEqualsSeparateMatmulsAndAccumulateEqualsAdd) {
  auto b = make_cpu_backend(2);
  ThreadPool pool(2);
  cpu::Scratch scratch;
  const int64_t cols = 256, n = 9;
  const std::vector<int64_t> part_rows = {64, 32, 32};
  for (DType t : {DType::kQ4_1, DType::kQ8_0, DType::kF32}) {
    std::vector<std::vector<uint8_t>> data;
    std::vector<HostMatrix> parts;
    for (int64_t r : part_rows) {
      data.push_back(t == DType::kF32 ? std::vector<uint8_t>(r * cols * 4) : random_weight_rows(t, r, cols, 1));
      if (t == DType::kF32) {
        const auto f = random_floats(r * cols, 2);
        std::memcpy(data.back().data(), f.data(), data.back().size());
      }
    }
    for (size_t i = 0; i < part_rows.size(); ++i) {
      parts.push_back({data[i].data(), t, part_rows[i], cols, row_bytes(t, cols)});
    }
    auto w = b->place(parts.data(), 3, "qkv");
    ASSERT_TRUE(w.ok()) << w.error().message;
    ASSERT_TRUE(b->reserve({n, 4, 64}).ok());
    scratch.reserve(cpu::matmul_scratch_bytes(t, cols, n));
    auto x = random_floats(n * cols, 3);
    std::vector<float> y(static_cast<size_t>(n * 128));
    ASSERT_TRUE(b->matmul(*w, Tensor::dense(x.data(), DType::kF32, n, cols),
                          Tensor::dense(y.data(), DType::kF32, n, 128), false)
                    .ok());
    int64_t col = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const cpu::WeightView v{t, part_rows[i], cols, data[i].data(), row_bytes(t, cols)};
      std::vector<float> want(static_cast<size_t>(n * part_rows[i]));
      cpu::matmul(v, x.data(), n, want.data(), pool, scratch);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < part_rows[i]; ++c) {
          ASSERT_EQ(y[static_cast<size_t>(r * 128 + col + c)], want[static_cast<size_t>(r * part_rows[i] + c)])
              << dtype_name(t) << " part " << i;
        }
      }
      col += part_rows[i];
    }
    // accumulate: y0 + (W x), as "h = W x; x += h" with add_inplace
    auto w1 = b->place(parts.data(), 1, "o");
    ASSERT_TRUE(w1.ok());
    ASSERT_TRUE(b->reserve({n, 4, 64}).ok());
    auto acc = random_floats(n * 64, 4);
    std::vector<float> want = acc, h(static_cast<size_t>(n * 64));
    cpu::matmul(cpu::WeightView{t, 64, cols, data[0].data(), row_bytes(t, cols)}, x.data(), n, h.data(), pool, scratch);
    cpu::add_inplace(want.data(), h.data(), n * 64);
    ASSERT_TRUE(b->matmul(*w1, Tensor::dense(x.data(), DType::kF32, n, cols),
                          Tensor::dense(acc.data(), DType::kF32, n, 64), true)
                    .ok());
    EXPECT_EQ(acc, want) << dtype_name(t);
    // with a bias: "h = W x; h += b; x += h", a Linear's rounding
    const auto bias = random_floats(64, 5);
    auto bv = b->place_vector(bias.data(), 64, "bias");
    ASSERT_TRUE(bv.ok());
    for (int64_t r = 0; r < n; ++r) cpu::add_inplace(h.data() + r * 64, bias.data(), 64);
    cpu::add_inplace(want.data(), h.data(), n * 64);
    ASSERT_TRUE(b->matmul(*w1, Tensor::dense(x.data(), DType::kF32, n, cols),
                          Tensor::dense(acc.data(), DType::kF32, n, 64), true, *bv)
                    .ok());
    EXPECT_EQ(acc, want) << dtype_name(t) << " with bias";
  }
}

TEST(CpuBackend, RmsNormAndGluEqualTheKernels) {
  auto b = make_cpu_backend(1);
  const int64_t n = 6, E = 96, F = 48;
  auto x = random_floats(n * E, 5, -3, 3);
  const auto w = random_floats(E, 6);
  auto wv = b->place_vector(w.data(), E, "norm");
  ASSERT_TRUE(wv.ok());
  std::vector<float> got(static_cast<size_t>(n * E)), want(got.size());
  b->rms_norm(Tensor::dense(x.data(), DType::kF32, n, E), nullptr, *wv, 1e-5f, 1.0f,
              Tensor::dense(got.data(), DType::kF32, n, E));
  cpu::rms_norm(x.data(), w.data(), n, E, 1e-5f, want.data(), 1.0f);
  EXPECT_EQ(got, want);
  const int32_t rows[] = {5, 2};
  b->rms_norm(Tensor::dense(x.data(), DType::kF32, n, E), rows, *wv, 1e-5f, 0.0f,
              Tensor::dense(got.data(), DType::kF32, 2, E));
  for (int r = 0; r < 2; ++r) {
    cpu::rms_norm(x.data() + rows[r] * E, w.data(), 1, E, 1e-5f, want.data() + r * E);
  }
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 2 * E),
            std::vector<float>(want.begin(), want.begin() + 2 * E));

  // GLU per row over [gate | up] equals the kernel over each row's halves
  // (and, with F a multiple of the vector width, over whole gate/up arrays).
  auto gu = random_floats(n * 2 * F, 7, -4, 4);
  std::vector<float> gate(static_cast<size_t>(n * F)), up(gate.size());
  for (int64_t r = 0; r < n; ++r) {
    std::copy_n(gu.begin() + r * 2 * F, F, gate.begin() + r * F);
    std::copy_n(gu.begin() + r * 2 * F + F, F, up.begin() + r * F);
  }
  std::vector<float> out(gate.size()), ref(gate.size());
  b->glu(Glu::kSilu, Tensor::dense(gu.data(), DType::kF32, n, 2 * F), Tensor::dense(out.data(), DType::kF32, n, F));
  cpu::silu_mul(gate.data(), up.data(), ref.data(), n * F);
  EXPECT_EQ(out, ref);
  b->glu(Glu::kGeluTanh, Tensor::dense(gu.data(), DType::kF32, n, 2 * F), Tensor::dense(out.data(), DType::kF32, n, F));
  cpu::gelu_tanh_mul(gate.data(), up.data(), ref.data(), n * F);
  EXPECT_EQ(out, ref);
}

// rope_store_kv into a block-major pool (blocks of two layers interleaved,
// as model/paged_kv_cache.h lays them out) equals q/k norm + cpu::rope +
// the f16 store, and attention over it equals attention_f16_rounded_batch
// on contiguous q.
TEST(CpuBackend, RopeStoreAndAttentionEqualTheKernels) {
  auto b = make_cpu_backend(2);
  ThreadPool pool(2);
  const int32_t n_head = 4, n_head_kv = 2, hd = 64, shift = 2, n_blocks = 8;
  const int64_t Q = n_head * hd, KV = n_head_kv * hd, QKV = Q + 2 * KV;
  const size_t row = static_cast<size_t>(KV) * 2, block = row << shift, span = 2 * 2 * block;  // 2 layers, K and V
  std::vector<uint8_t> pool_mem(span * n_blocks, 0);
  KvCacheView kv;
  kv.k = pool_mem.data() + 2 * block;  // layer 1's K
  kv.v = pool_mem.data() + 3 * block;
  kv.dtype = DType::kF16;
  kv.block_shift = shift;
  kv.block_stride = span;
  kv.row_bytes = row;

  // Two sequences: 3 new tokens after 2 cached (blocks 5, 1), one token at position 0 (block 6).
  const std::vector<int32_t> tables = {5, 1, 6}, pos = {2, 3, 4, 0}, q_start = {0, 3}, q_len = {3, 1}, kv_len = {5, 1},
                             table_start = {0, 2}, decode_from = {-1, -1}, seq_of = {0, 0, 0, 1};
  std::vector<int32_t> slots;
  for (int t = 0; t < 4; ++t) {
    const int32_t* table = tables.data() + table_start[seq_of[t]];
    slots.push_back((table[pos[t] >> shift] << shift) + (pos[t] & 3));
  }
  StepMetadata md;
  md.n_tokens = 4;
  md.n_seqs = 2;
  md.pos = pos.data();
  md.seq_of = seq_of.data();
  md.q_start = q_start.data();
  md.q_len = q_len.data();
  md.kv_len = kv_len.data();
  md.decode_from = decode_from.data();
  md.table_start = table_start.data();
  md.slots[0] = slots.data();
  md.block_tables[0] = tables.data();

  const RopeTable table = cpu::make_rope_table(10000.0f, hd, false);
  auto rope = b->place_rope(table);
  const auto qn = random_floats(hd, 8), kn = random_floats(hd, 9);
  auto qnv = b->place_vector(qn.data(), hd, "q_norm"), knv = b->place_vector(kn.data(), hd, "k_norm");
  ASSERT_TRUE(rope.ok() && qnv.ok() && knv.ok());
  auto qkv = random_floats(4 * QKV, 10, -2, 2);
  // Cached positions 0 and 1 of sequence 0 (block 5), as earlier steps left them.
  for (int64_t i = 0; i < 2 * KV; ++i) {
    reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(kv.k) + 5 * span)[i] = f32_to_f16(0.01f * (i % 37));
    reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(kv.v) + 5 * span)[i] = f32_to_f16(0.02f * (i % 29));
  }
  const std::vector<uint8_t> before = pool_mem;

  // The expected: the per-op kernels on contiguous q / k, stored by hand.
  std::vector<float> q(4 * Q), k(4 * KV), v(4 * KV);
  for (int t = 0; t < 4; ++t) {
    std::copy_n(qkv.begin() + t * QKV, Q, q.begin() + t * Q);
    std::copy_n(qkv.begin() + t * QKV + Q, KV, k.begin() + t * KV);
    std::copy_n(qkv.begin() + t * QKV + Q + KV, KV, v.begin() + t * KV);
  }
  cpu::rms_norm(q.data(), qn.data(), 4 * n_head, hd, 1e-6f, q.data());
  cpu::rms_norm(k.data(), kn.data(), 4 * n_head_kv, hd, 1e-6f, k.data());
  cpu::rope(q.data(), pos.data(), 4, n_head, hd, table);
  cpu::rope(k.data(), pos.data(), 4, n_head_kv, hd, table);
  std::vector<uint8_t> want_pool = before;
  for (int t = 0; t < 4; ++t) {
    const size_t at = static_cast<size_t>(slots[t] >> shift) * span + static_cast<size_t>(slots[t] & 3) * row;
    auto* kd = reinterpret_cast<uint16_t*>(want_pool.data() + 2 * block + at);
    auto* vd = reinterpret_cast<uint16_t*>(want_pool.data() + 3 * block + at);
    for (int64_t j = 0; j < KV; ++j) {
      kd[j] = f32_to_f16(k[t * KV + j]);
      vd[j] = f32_to_f16(v[t * KV + j]);
    }
  }

  RopeKvOp op;
  op.qkv = Tensor::dense(qkv.data(), DType::kF32, 4, QKV);
  op.n_head = n_head;
  op.n_head_kv = n_head_kv;
  op.head_dim = hd;
  op.q_norm = *qnv;
  op.k_norm = *knv;
  op.rope = *rope;
  op.kv = kv;
  b->rope_store_kv(op, md);
  for (int t = 0; t < 4; ++t) {
    ASSERT_EQ(std::vector<float>(qkv.begin() + t * QKV, qkv.begin() + t * QKV + Q),
              std::vector<float>(q.begin() + t * Q, q.begin() + (t + 1) * Q))
        << "q of token " << t;
  }
  EXPECT_EQ(pool_mem, want_pool);

  AttentionOp at;
  at.q = op.qkv.cols_from(0, Q);
  std::vector<float> out(4 * Q), want(4 * Q);
  at.out = Tensor::dense(out.data(), DType::kF32, 4, Q);
  at.n_head = n_head;
  at.n_head_kv = n_head_kv;
  at.head_dim = hd;
  at.scale = 0.125f;
  at.kv = kv;
  b->attention(at, md);
  cpu::AttentionParams p;
  p.n_head = n_head;
  p.n_head_kv = n_head_kv;
  p.head_dim = hd;
  p.scale = 0.125f;
  p.kv_dtype = DType::kF16;
  std::vector<cpu::AttentionSeq> seqs;
  for (int s = 0; s < 2; ++s) {
    cpu::PagedKv pk{static_cast<const uint8_t*>(kv.k),
                    static_cast<const uint8_t*>(kv.v),
                    tables.data() + table_start[s],
                    shift,
                    span,
                    row};
    seqs.push_back({q.data() + q_start[s] * Q, pos.data() + q_start[s], q_len[s], pk, kv_len[s],
                    want.data() + q_start[s] * Q, -1});
  }
  cpu::attention_f16_rounded_batch(seqs.data(), 2, p, pool);
  EXPECT_EQ(out, want);
}

}  // namespace
}  // namespace rill
