// k4c KV (K q4c per channel over blocks of 32 tokens, V iq4_nlh64 rotated,
// each sequence's newest partial block in q8_0 tails) on the CUDA Llama
// model against the CPU's (branch k4cwire22; written without a GPU: these
// tests have not yet run on one). The model: chan_model_test_util.h's
// golden llama with heads of 64.
//
// Both devices run f32 activations (an f32 checkpoint) and store the same
// k4c bytes for the same floats: the encoder, the V store and the tail rows
// are the CPU's (kv_chan_cuda_test.cpp, BackendOps.RotatedKvStore...), and
// the reference attention is the CPU baseline build's arithmetic
// (attention_chan_cuda_test.cpp). What remains is f32 rounding of the
// matmuls and norms (the f32 model's CUDA logits are within ~1e-5 of the
// CPU's), which now and then moves a value across a 4-bit or q8_0 level.
// The bound is a share of what k4c itself changes on the CPU (rms over
// every logit of every position, against f32 KV): 5%, where perturbing
// every weight by 1e-7 .. 3e-6 relative (what two devices' f32 sums
// differ by) moved the CPU's k4c logits by at most 0.005% of that change
// (the host, 2x scale). A CUDA path that read
// the wrong tail rows, a block before it was encoded, the wrong block, or
// skipped the sink rule, costs a k4c-sized error or more (and a CUDA run
// that stored f32 KV instead would sit one whole k4c change away: checked
// below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "../engine/golden_util.h"
#include "chan_model_test_util.h"
#include "core/e4m3.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "engine/sequence_runner.h"
#include "loader/model_files.h"
#include "model/batch.h"
#include "model/kv_types.h"
#include "model/registry.h"

namespace rill {
namespace {

using namespace chan_test;

class CudaK4c : public K4cHd64 {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    K4cHd64::SetUp();
  }
};

// Loads with the CPU's bytes a token and tails.
TEST_F(CudaK4c, LoadsAsTheCpu) {
  auto on = try_open(Device::kCuda, 8, "k4c");
  ASSERT_TRUE(on.ok()) << on.error().message;
  auto cpu = try_open(Device::kCpu, 8, "k4c");
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  // The same bytes a token and the same tails (KvTails' layout and count).
  EXPECT_EQ((*on)->kv_bytes_per_token(), (*cpu)->kv_bytes_per_token());
  EXPECT_EQ((*on)->n_kv_tail_slots(), (*cpu)->n_kv_tail_slots());
  EXPECT_EQ((*on)->kv_tail_bytes(), (*cpu)->kv_tail_bytes());
  EXPECT_EQ((*on)->kv_block_size(), 32);
  EXPECT_NE((*on)->kv_numerics().find("q4c"), std::string::npos) << (*on)->kv_numerics();
}

// One sequence of 100 tokens (blocks at 0, 32, 64 completed, the last 4
// tokens left in the tail), scored in chunks of 1 (every step a decode
// step: one query, a block completed at positions 31, 63, 95; with decode
// graphs, then without: chunk -1 below), 7 (chunks
// that end inside blocks and cross their boundaries: the tail partly
// filled before a step, blocks completed from tail and step rows) and 64
// (a prefill that completes two blocks in one step, the first the
// sequence's sink block), against the CPU's k4c scored in chunks of 64
// (the CPU's k4c bits do not depend on chunking: attention_chan.h); and
// in chunks of 64 again with the attention's score buffer cut to 3
// queries (CudaChanLimits::max_score_floats), each step's attention then
// run in chunks of 3 queries.
TEST_F(CudaK4c, LogitsMatchTheCpusK4cAtEveryPosition) {
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab);
  auto f32_cpu = open(Device::kCpu, 64, nullptr), f32_gpu = open(Device::kCuda, 64, nullptr);
  auto cpu = open(Device::kCpu, 64, "k4c");
  ASSERT_TRUE(f32_cpu && f32_gpu && cpu);
  const std::vector<float> own_f32 = score(*f32_cpu, ids), gpu_f32 = score(*f32_gpu, ids), c = score(*cpu, ids);
  const double own = rms_diff(c, own_f32);
  // k4c must change this model's logits visibly, or the bound says nothing.
  EXPECT_GT(own, 100 * rms_diff(gpu_f32, own_f32)) << "k4c's own change is below f32 noise";
  // Chunks of 1 twice: decode steps replayed from CUDA graphs (the
  // default; their padding in the scratch tail slot), then run eagerly.
  // 0: chunks of 64 with the reference attention's score buffer cut to 3
  // queries' scores (RILL_CUDA_K4C_SCORE_FLOATS, llama.cpp), so that a
  // step's attention runs in chunks of 3 queries (the last of 1).
  for (const int chunk : {1, -1, 7, 64, 0}) {
    if (chunk == 0) {
      const int64_t per_query = int64_t{files_->config.n_head} * 256;  // n_head x n_ctx
      setenv("RILL_CUDA_K4C_SCORE_FLOATS", std::to_string(3 * per_query + per_query / 2).c_str(), 1);
    }
    auto gpu = open(Device::kCuda, chunk == 0 ? 64 : std::abs(chunk), "k4c", 1, /*graphs=*/chunk > 0);
    unsetenv("RILL_CUDA_K4C_SCORE_FLOATS");
    ASSERT_TRUE(gpu) << chunk;
    const std::vector<float> g = score(*gpu, ids);
    ASSERT_EQ(g.size(), c.size()) << chunk;
    const double e = rms_diff(g, c);
    EXPECT_LT(e, kShare * own) << "chunks of " << chunk
                               << " (-1: without graphs; 0: 64 with the attention in chunks of 3 queries): CUDA k4c "
                                  "against the CPU's";
    // Not f32 KV under another name: CUDA's k4c costs what the CPU's does.
    EXPECT_GT(rms_diff(g, gpu_f32), 0.5 * own) << "chunks of " << chunk;
    // The last position (its block's 4 rows from the tail and the step).
    const size_t V = static_cast<size_t>(files_->config.n_vocab);
    const std::vector<float> last_g(g.end() - static_cast<std::ptrdiff_t>(V), g.end()),
        last_c(c.end() - static_cast<std::ptrdiff_t>(V), c.end());
    std::printf(
        "[ cuda k4c ] chunks of %d: vs CPU k4c rms %.3g max %.3g (last position max %.3g); CPU k4c vs f32 KV rms "
        "%.3g; CUDA f32 vs CPU f32 rms %.3g\n",
        chunk, e, test::max_abs_diff(g, c), test::max_abs_diff(last_g, last_c), own, rms_diff(gpu_f32, own_f32));
  }
}

// The CPU half, on the host: the widened model loads with k4c, k4c moves
// its logits well above f32 noise (so the GPU tests' bound, a share of
// that move, is not vacuous), its bits do not depend on chunking (the CPU
// reference the GPU runs are held to in chunks of 64), and the shared
// steps run.
TEST_F(K4cHd64, CpuK4cMovesTheLogitsAndItsStepsRun) {
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab);
  auto f32 = open(Device::kCpu, 64, nullptr), k64 = open(Device::kCpu, 64, "k4c"), k7 = open(Device::kCpu, 7, "k4c");
  ASSERT_TRUE(f32 && k64 && k7);
  EXPECT_EQ(k64->kv_block_size(), 32);
  const std::vector<float> f = score(*f32, ids), c = score(*k64, ids), c7 = score(*k7, ids);
  const double own = rms_diff(c, f);
  EXPECT_GT(own, 1e-3) << "k4c hardly moves this model's logits";
  EXPECT_EQ(test::max_abs_diff(c, c7), 0.0) << "the CPU's k4c depends on chunking";
  auto f32_2 = open(Device::kCpu, 80, nullptr, 2), k4c_2 = open(Device::kCpu, 80, "k4c", 2);
  ASSERT_TRUE(f32_2 && k4c_2);
  const std::vector<float> a = two_sequences(*f32_2), b = two_sequences(*k4c_2);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_GT(rms_diff(a, b), 1e-3);
  auto f32_9 = open(Device::kCpu, 64, nullptr, 9), k4c_9 = open(Device::kCpu, 64, "k4c", 9);
  ASSERT_TRUE(f32_9 && k4c_9);
  const std::vector<float> a9 = nine_sequences(*f32_9), b9 = nine_sequences(*k4c_9);
  ASSERT_EQ(a9.size(), b9.size());
  EXPECT_GT(rms_diff(a9, b9), 1e-3);
  std::printf("[ k4c hd64 ] CPU k4c vs f32 KV: rms %.3g max %.3g (one sequence), rms %.3g (two), rms %.3g (nine)\n",
              own, test::max_abs_diff(c, f), rms_diff(a, b), rms_diff(a9, b9));
}

TEST_F(CudaK4c, TwoSequencesInSharedStepsMatchTheCpu) {
  auto f32_cpu = open(Device::kCpu, 80, nullptr, 2), cpu = open(Device::kCpu, 80, "k4c", 2);
  auto gpu = open(Device::kCuda, 80, "k4c", 2);
  ASSERT_TRUE(f32_cpu && cpu && gpu);
  const std::vector<float> own_f32 = two_sequences(*f32_cpu), c = two_sequences(*cpu), g = two_sequences(*gpu);
  const double own = rms_diff(c, own_f32), e = rms_diff(g, c);
  EXPECT_LT(e, kShare * own) << "two sequences: CUDA k4c against the CPU's";
  std::printf("[ cuda k4c ] two sequences: vs CPU k4c rms %.3g max %.3g; CPU k4c vs f32 KV rms %.3g\n", e,
              test::max_abs_diff(g, c), own);
}

// Nine sequences in shared decode steps replayed from graphs (nine rows
// padded to a bucket of 16: the only steps that pad, more than 8 rows and
// not a bucket's count) against the CPU's same steps.
TEST_F(CudaK4c, NineSequencesInPaddedDecodeGraphsMatchTheCpu) {
  auto f32_cpu = open(Device::kCpu, 64, nullptr, 9), cpu = open(Device::kCpu, 64, "k4c", 9);
  auto gpu = open(Device::kCuda, 64, "k4c", 9, /*graphs=*/true);
  ASSERT_TRUE(f32_cpu && cpu && gpu);
  const std::vector<float> own_f32 = nine_sequences(*f32_cpu), c = nine_sequences(*cpu), g = nine_sequences(*gpu);
  ASSERT_EQ(g.size(), c.size());
  const double own = rms_diff(c, own_f32), e = rms_diff(g, c);
  EXPECT_LT(e, kShare * own) << "nine sequences, padded decode graphs: CUDA k4c against the CPU's";
  // The decode steps alone (the last 4 x 9 rows of logits).
  const size_t tail = size_t{36} * static_cast<size_t>(files_->config.n_vocab);
  const std::vector<float> dg(g.end() - static_cast<std::ptrdiff_t>(tail), g.end()),
      dc(c.end() - static_cast<std::ptrdiff_t>(tail), c.end()),
      df(own_f32.end() - static_cast<std::ptrdiff_t>(tail), own_f32.end());
  const double own_d = rms_diff(dc, df), e_d = rms_diff(dg, dc);
  EXPECT_LT(e_d, kShare * own_d) << "nine sequences, the decode steps alone";
  std::printf(
      "[ cuda k4c ] nine sequences: vs CPU k4c rms %.3g max %.3g (decode steps rms %.3g); CPU k4c vs f32 KV rms %.3g "
      "(decode steps %.3g)\n",
      e, test::max_abs_diff(g, c), e_d, own, own_d);
}

// The pool's blocks themselves: after the same 100 tokens (slot 0's blocks
// 0, 1, 2 complete, 4 tokens in the tail), CUDA's K groups and V rows,
// exported, against the CPU model's of the same blocks. They are the
// same bytes but where an f32 rounding difference upstream moved a value
// across a level (or a grid's error across another's): at least 97% of
// each side's bytes are the CPU's, the sink block's too. A block encoded
// without the sink rule, from wrong rows or into the wrong block, or V
// rows in the wrong place, differs in most of its bytes. Then the CPU's
// blocks imported into unused blocks and exported back are the same bytes
// (K and V blocks of different sizes, copied a block at a time).
TEST_F(CudaK4c, PoolBlocksAreTheCpusAndMoveBetweenDevices) {
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab);
  auto cpu = open(Device::kCpu, 64, "k4c"), gpu = open(Device::kCuda, 7, "k4c");
  ASSERT_TRUE(cpu && gpu);
  score(*cpu, ids);
  score(*gpu, ids);
  const std::vector<Model::KvLayer> layers = gpu->kv_layers();
  ASSERT_EQ(layers.size(), cpu->kv_layers().size());
  const std::vector<int32_t> blocks = {0, 1, 2}, spare = {5, 6, 7};
  size_t same[2] = {}, total[2] = {}, sink_same = 0, sink_total = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const size_t kb = layers[l].row_bytes * 32, vb = layers[l].v_row_bytes * 32;
    ASSERT_GT(vb, 0u);
    EXPECT_EQ(layers[l].v_dtype, kKvIq4Nl64);
    std::vector<uint8_t> ck(3 * kb), cv(3 * kb), gk(3 * kb), gv(3 * kb);
    ASSERT_TRUE(cpu->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, kb, ck.data(), cv.data()).ok());
    const Status out = gpu->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, kb, gk.data(), gv.data());
    ASSERT_TRUE(out.ok()) << out.error().message;
    for (size_t b = 0; b < 3; ++b) {
      for (size_t i = 0; i < kb; ++i) {
        const bool eq = ck[b * kb + i] == gk[b * kb + i];
        same[0] += eq;
        ++total[0];
        if (b == 0) sink_same += eq, ++sink_total;
      }
      for (size_t i = 0; i < vb; ++i) same[1] += cv[b * kb + i] == gv[b * kb + i], ++total[1];
    }
    // The CPU's blocks into CUDA's spare blocks and back.
    ASSERT_TRUE(gpu->copy_kv_blocks_in(static_cast<int64_t>(l), spare, kb, ck.data(), cv.data()).ok());
    std::vector<uint8_t> bk(3 * kb, 0), bv(3 * kb, 0);
    ASSERT_TRUE(gpu->copy_kv_blocks_out(static_cast<int64_t>(l), spare, kb, bk.data(), bv.data()).ok());
    EXPECT_EQ(bk, ck) << "layer " << l << ": K blocks through the device";
    for (size_t b = 0; b < 3; ++b) {
      EXPECT_TRUE(std::equal(bv.begin() + b * kb, bv.begin() + b * kb + vb, cv.begin() + b * kb))
          << "layer " << l << " block " << b << ": V rows through the device";
    }
  }
  const double k_share = double(same[0]) / total[0], v_share = double(same[1]) / total[1];
  const double sink_share = double(sink_same) / sink_total;
  EXPECT_GE(k_share, 0.97) << "K groups as the CPU's";
  EXPECT_GE(sink_share, 0.97) << "the sink block's K groups as the CPU's";
  EXPECT_GE(v_share, 0.97) << "V rows as the CPU's";
  std::printf("[ cuda k4c ] pool bytes as the CPU's: K %.4f (sink block %.4f), V %.4f\n", k_share, sink_share, v_share);
}

// A step that continues a sequence where its tail does not hold the rows
// before it is refused, naming the slot, as the CPU refuses it.
TEST_F(CudaK4c, AStepThatSkipsTheTailIsRefused) {
  auto gpu = open(Device::kCuda, 64, "k4c");
  ASSERT_TRUE(gpu);
  const std::vector<int32_t> ids = prompt(60, files_->config.n_vocab);
  Batch batch;
  add(batch, *gpu, 0, ids, 0, 10);
  std::vector<float> logits(batch.sample_rows.size() * static_cast<size_t>(gpu->n_vocab()));
  ASSERT_TRUE(gpu->forward(batch, logits.data()).ok());
  batch.clear();
  add(batch, *gpu, 0, ids, 20, 4);  // the tail holds [0, 10)
  logits.resize(batch.sample_rows.size() * static_cast<size_t>(gpu->n_vocab()));
  const Status st = gpu->forward(batch, logits.data());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("KV tail slot 0 holds positions [0, 10)"), std::string::npos) << st.error().message;
}

// Prefill through the tensor-core kernel (chan_attention_flash: 16-bit
// models, steps of 4+ tokens a sequence) against the fast kernel's token
// tiles (RILL_K4C_ATTENTION=tiles) on a bf16 copy of the model (every
// matrix rounded to bf16, so bf16 activations): 100 tokens in chunks of
// 48 (the second chunk's tiles read 16 tail rows, the third is 4 tokens),
// every position's logits. The two differ by f16 rounding inside
// attention (q, K, V, probabilities: ~1e-3 of an output), which flips some
// of the bf16 roundings after it; a path that read a wrong row, block or
// tail, or rotated wrongly, moves the logits by k4c's own change or more.
// Bound: a quarter of k4c's own change on this bf16 model (k4c against f16
// KV, both through the token tiles). Written without a GPU at hand; its
// first device run sets the measured share in docs/perf.md.
TEST_F(CudaK4c, Bf16PrefillOnTheTensorCoresIsTheTokenTiles) {
  std::vector<std::vector<uint16_t>> bf16_store;
  test::to_bf16(*files_, bf16_store);  // the matrices: the activations follow them
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab, 5);
  auto flash = open(Device::kCuda, 48, "k4c");
  setenv("RILL_K4C_ATTENTION", "tiles", 1);  // read when the backend carves its scratch
  auto tiles = open(Device::kCuda, 48, "k4c");
  auto f16 = open(Device::kCuda, 48, "f16");
  unsetenv("RILL_K4C_ATTENTION");
  ASSERT_TRUE(flash && tiles && f16);
  const std::vector<float> a = score(*flash, ids), b = score(*tiles, ids), c = score(*f16, ids);
  ASSERT_EQ(a.size(), b.size());
  for (const float x : a) ASSERT_TRUE(std::isfinite(x));
  const double own = rms_diff(b, c), e = rms_diff(a, b);
  EXPECT_GT(own, 0.0) << "k4c does not move the bf16 model's logits: the bound says nothing";
  EXPECT_LT(e, 0.25 * own) << "flash prefill against the token tiles";
  std::printf("[ cuda k4c ] bf16, chunks of 48: flash vs token tiles rms %.3g (%.3g of k4c's own change %.3g)\n", e,
              e / own, own);
}

}  // namespace
}  // namespace rill
