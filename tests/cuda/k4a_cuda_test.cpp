// k4a KV (K q4a: per channel over blocks of 32 tokens, each channel at its
// own width 0..8 calibrated at load; V iq4_nlh64 rotated; q8_0 tails) on
// the CUDA Llama model against the CPU's (branch q4acuda22; written without
// a GPU: these tests have not yet run on one). The model:
// chan_model_test_util.h's golden llama with heads of 64, k4a calibrated
// on 256 fixed tokens on each device.
//
// The two devices calibrate on their own forward passes (CUDA's statistics
// from its q rows and f32 K rows: CudaModelBase::calibrate_kv), so their
// widths may differ where two channels' weights are near a tie; the
// comparisons of logits and bytes upload the CPU model's widths into the
// CUDA model first (CudaModelBase::set_kv_k_widths), so that both store
// the same q4a blocks for the same floats (the encoder and the reference
// attention are the CPU's arithmetic: kv_chan_cuda_test.cpp,
// attention_chan_cuda_test.cpp) and only f32 rounding upstream differs.
// Bound: as k4c's (k4c_cuda_test.cpp), 5% of k4a's own change on the CPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "chan_model_test_util.h"
#include "core/e4m3.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "model/cpu_paged_model.h"
#include "model/cuda_model_base.h"

namespace rill {
namespace {

using namespace chan_test;

class K4aHd64 : public K4cHd64 {};

class CudaK4a : public K4cHd64 {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    K4cHd64::SetUp();
  }
  // The CUDA model opened with k4a, then given cpu's widths.
  std::unique_ptr<Model> open_with_widths(const Model& cpu, int chunk, int n_slots = 1, bool graphs = true) {
    auto gpu = open(Device::kCuda, chunk, "k4a", n_slots, graphs);
    if (!gpu) return nullptr;
    const auto* c = dynamic_cast<const CpuPagedModel*>(&cpu);
    auto* g = dynamic_cast<CudaModelBase*>(gpu.get());
    EXPECT_TRUE(c && g);
    if (!c || !g) return nullptr;
    for (int64_t l = 0; l < static_cast<int64_t>(gpu->kv_layers().size()); ++l) {
      const Status st = g->set_kv_k_widths(l, c->kv_k_widths(l));
      EXPECT_TRUE(st.ok()) << st.error().message;
    }
    return gpu;
  }
};

// The widths of every KV layer of a model (CPU or CUDA).
std::vector<std::vector<uint8_t>> widths_of(const Model& m) {
  std::vector<std::vector<uint8_t>> out;
  for (int64_t l = 0; l < static_cast<int64_t>(m.kv_layers().size()); ++l) {
    if (const auto* c = dynamic_cast<const CpuPagedModel*>(&m)) out.push_back(c->kv_k_widths(l));
    if (const auto* g = dynamic_cast<const CudaModelBase*>(&m)) out.push_back(g->kv_k_widths(l));
  }
  return out;
}

// The CPU half (no GPU): k4a loads on the widened model with calibrated
// widths (not q4c's 4 everywhere), moves its logits well above f32 noise
// (so the GPU tests' bound is not vacuous), and its bits do not depend on
// chunking.
TEST_F(K4aHd64, CpuK4aCalibratesAndMovesTheLogits) {
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab);
  auto f32 = open(Device::kCpu, 64, nullptr), k64 = open(Device::kCpu, 64, "k4a"), k7 = open(Device::kCpu, 7, "k4a");
  ASSERT_TRUE(f32 && k64 && k7);
  int n_not4 = 0;
  for (const std::vector<uint8_t>& w : widths_of(*k64)) {
    for (const uint8_t b : w) n_not4 += b != 4;
  }
  EXPECT_GT(n_not4, 0) << "calibration left every channel at 4 bits";
  EXPECT_EQ(widths_of(*k64), widths_of(*k7)) << "the CPU's widths depend on the pass's chunking";
  const std::vector<float> f = score(*f32, ids), c = score(*k64, ids), c7 = score(*k7, ids);
  EXPECT_GT(rms_diff(c, f), 1e-3) << "k4a hardly moves this model's logits";
  EXPECT_EQ(test::max_abs_diff(c, c7), 0.0) << "the CPU's k4a depends on chunking";
  std::printf("[ k4a hd64 ] CPU k4a vs f32 KV: rms %.3g; %d channels not at 4 bits\n", rms_diff(c, f), n_not4);
}

// Loads with the CPU's bytes a token and tails, and names its widths.
TEST_F(CudaK4a, LoadsAsTheCpu) {
  auto on = try_open(Device::kCuda, 8, "k4a");
  ASSERT_TRUE(on.ok()) << on.error().message;
  auto cpu = try_open(Device::kCpu, 8, "k4a");
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  EXPECT_EQ((*on)->kv_bytes_per_token(), (*cpu)->kv_bytes_per_token());
  EXPECT_EQ((*on)->n_kv_tail_slots(), (*cpu)->n_kv_tail_slots());
  EXPECT_EQ((*on)->kv_tail_bytes(), (*cpu)->kv_tail_bytes());
  EXPECT_EQ((*on)->kv_block_size(), 32);
  const std::string numerics = (*on)->kv_numerics();
  EXPECT_NE(numerics.find("q4a"), std::string::npos) << numerics;
  EXPECT_NE(numerics.find(" q4a-widths="), std::string::npos) << numerics;
  // Without calibration tokens the model refuses to load (as the CPU's).
  ModelOptions o;
  o.device = Device::kCuda;
  o.n_ctx = 256;
  o.kv_types.k = KvType{kKvQ4Alloc, false};
  o.kv_types.v = KvType{kKvIq4Nl64, true};
  auto none = create_model(builtin_registry(), infer_profile(*files_), files_, o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("calibrates its widths on at least 64"), std::string::npos)
      << none.error().message;
}

// CUDA's own calibration: every layer's widths valid (0..8, no channel at
// 1 bit, 4 a channel), not all 4, the same on a second load (the pass is
// deterministic), and mostly the CPU's (the same statistics from the
// device's f32 sums upstream: a near-tie may go the other way). The widths'
// hash follows them: a model given other widths names other numerics.
TEST_F(CudaK4a, CalibratesItsOwnWidthsDeterministically) {
  auto cpu = open(Device::kCpu, 64, "k4a");
  auto a = open(Device::kCuda, 64, "k4a"), b = open(Device::kCuda, 64, "k4a");
  ASSERT_TRUE(cpu && a && b);
  const auto wc = widths_of(*cpu), wa = widths_of(*a), wb = widths_of(*b);
  ASSERT_EQ(wa.size(), wc.size());
  EXPECT_EQ(wa, wb) << "two loads calibrated other widths";
  EXPECT_EQ(a->kv_numerics(), b->kv_numerics());
  size_t same = 0, total = 0, not4 = 0;
  for (size_t l = 0; l < wa.size(); ++l) {
    ASSERT_EQ(wa[l].size(), wc[l].size());
    int64_t sum = 0;
    for (size_t c = 0; c < wa[l].size(); ++c) {
      const int bits = wa[l][c];
      EXPECT_TRUE(bits <= 8 && bits != 1) << "layer " << l << " channel " << c << ": " << bits << " bits";
      sum += bits;
      not4 += bits != 4;
      same += wa[l][c] == wc[l][c];
      ++total;
    }
    EXPECT_EQ(sum, 4 * static_cast<int64_t>(wa[l].size())) << "layer " << l;
  }
  EXPECT_GT(not4, 0u) << "calibration left every channel at 4 bits";
  EXPECT_GE(double(same) / double(total), 0.75) << "CUDA's widths far from the CPU's";
  auto* g = dynamic_cast<CudaModelBase*>(b.get());
  ASSERT_TRUE(g);
  const std::string before = b->kv_numerics();
  for (int64_t l = 0; l < static_cast<int64_t>(wc.size()); ++l) ASSERT_TRUE(g->set_kv_k_widths(l, wc[l]).ok());
  if (wc != wa) {
    EXPECT_NE(b->kv_numerics(), before) << "other widths, the same numerics";
  }
  std::vector<uint8_t> bad = wc[0];
  bad[0] = static_cast<uint8_t>(bad[0] == 8 ? 7 : bad[0] + 1);  // 4 a channel no more
  EXPECT_FALSE(g->set_kv_k_widths(0, bad).ok());
  std::printf("[ cuda k4a ] CUDA's widths: %.4f of channels as the CPU's, %zu of %zu not at 4 bits\n",
              double(same) / double(total), not4, total);
}

// One sequence of 100 tokens, under the CPU's widths, in chunks of 1 (with
// decode graphs, then without: -1), 7 and 64, against the CPU's k4a in
// chunks of 64 (k4c_cuda_test.cpp's LogitsMatchTheCpusK4cAtEveryPosition).
TEST_F(CudaK4a, LogitsMatchTheCpusK4aAtEveryPosition) {
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab);
  auto f32_cpu = open(Device::kCpu, 64, nullptr), f32_gpu = open(Device::kCuda, 64, nullptr);
  auto cpu = open(Device::kCpu, 64, "k4a");
  ASSERT_TRUE(f32_cpu && f32_gpu && cpu);
  const std::vector<float> own_f32 = score(*f32_cpu, ids), gpu_f32 = score(*f32_gpu, ids), c = score(*cpu, ids);
  const double own = rms_diff(c, own_f32);
  EXPECT_GT(own, 100 * rms_diff(gpu_f32, own_f32)) << "k4a's own change is below f32 noise";
  for (const int chunk : {1, -1, 7, 64}) {
    auto gpu = open_with_widths(*cpu, std::abs(chunk), 1, /*graphs=*/chunk > 0);
    ASSERT_TRUE(gpu) << chunk;
    const std::vector<float> g = score(*gpu, ids);
    ASSERT_EQ(g.size(), c.size()) << chunk;
    const double e = rms_diff(g, c);
    EXPECT_LT(e, kShare * own) << "chunks of " << chunk << " (-1: without graphs): CUDA k4a against the CPU's";
    EXPECT_GT(rms_diff(g, gpu_f32), 0.5 * own) << "chunks of " << chunk;
    std::printf("[ cuda k4a ] chunks of %d: vs CPU k4a rms %.3g max %.3g; CPU k4a vs f32 KV rms %.3g\n", chunk, e,
                test::max_abs_diff(g, c), own);
  }
}

// Two sequences of different lengths in shared prefill and decode steps
// (k4c_cuda_test.cpp's), under the CPU's widths.
TEST_F(CudaK4a, TwoSequencesInSharedStepsMatchTheCpu) {
  auto f32_cpu = open(Device::kCpu, 80, nullptr, 2), cpu = open(Device::kCpu, 80, "k4a", 2);
  ASSERT_TRUE(f32_cpu && cpu);
  auto gpu = open_with_widths(*cpu, 80, 2);
  ASSERT_TRUE(gpu);
  const std::vector<float> own_f32 = two_sequences(*f32_cpu), c = two_sequences(*cpu), g = two_sequences(*gpu);
  const double own = rms_diff(c, own_f32), e = rms_diff(g, c);
  EXPECT_LT(e, kShare * own) << "two sequences: CUDA k4a against the CPU's";
  std::printf("[ cuda k4a ] two sequences: vs CPU k4a rms %.3g max %.3g; CPU k4a vs f32 KV rms %.3g\n", e,
              test::max_abs_diff(g, c), own);
}

// Nine sequences in shared decode steps replayed from padded graphs
// (k4c_cuda_test.cpp's), under the CPU's widths.
TEST_F(CudaK4a, NineSequencesInPaddedDecodeGraphsMatchTheCpu) {
  auto f32_cpu = open(Device::kCpu, 64, nullptr, 9), cpu = open(Device::kCpu, 64, "k4a", 9);
  ASSERT_TRUE(f32_cpu && cpu);
  auto gpu = open_with_widths(*cpu, 64, 9, /*graphs=*/true);
  ASSERT_TRUE(gpu);
  const std::vector<float> own_f32 = nine_sequences(*f32_cpu), c = nine_sequences(*cpu), g = nine_sequences(*gpu);
  ASSERT_EQ(g.size(), c.size());
  const double own = rms_diff(c, own_f32), e = rms_diff(g, c);
  EXPECT_LT(e, kShare * own) << "nine sequences, padded decode graphs: CUDA k4a against the CPU's";
  std::printf("[ cuda k4a ] nine sequences: vs CPU k4a rms %.3g max %.3g; CPU k4a vs f32 KV rms %.3g\n", e,
              test::max_abs_diff(g, c), own);
}

// The pool's q4a blocks under the CPU's widths, exported, against the CPU
// model's (at least 97% of the bytes the same, as k4c's), and the CPU's
// blocks imported into spare blocks and exported back unchanged.
TEST_F(CudaK4a, PoolBlocksAreTheCpusAndMoveBetweenDevices) {
  const std::vector<int32_t> ids = prompt(100, files_->config.n_vocab);
  auto cpu = open(Device::kCpu, 64, "k4a");
  ASSERT_TRUE(cpu);
  auto gpu = open_with_widths(*cpu, 7);
  ASSERT_TRUE(gpu);
  score(*cpu, ids);
  score(*gpu, ids);
  const std::vector<Model::KvLayer> layers = gpu->kv_layers();
  ASSERT_EQ(layers.size(), cpu->kv_layers().size());
  const std::vector<int32_t> blocks = {0, 1, 2}, spare = {5, 6, 7};
  size_t same = 0, total = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const size_t kb = layers[l].row_bytes * 32;
    std::vector<uint8_t> ck(3 * kb), cv(3 * kb), gk(3 * kb), gv(3 * kb);
    ASSERT_TRUE(cpu->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, kb, ck.data(), cv.data()).ok());
    const Status out = gpu->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, kb, gk.data(), gv.data());
    ASSERT_TRUE(out.ok()) << out.error().message;
    for (size_t i = 0; i < ck.size(); ++i) same += ck[i] == gk[i], ++total;
    ASSERT_TRUE(gpu->copy_kv_blocks_in(static_cast<int64_t>(l), spare, kb, ck.data(), cv.data()).ok());
    std::vector<uint8_t> bk(3 * kb, 0), bv(3 * kb, 0);
    ASSERT_TRUE(gpu->copy_kv_blocks_out(static_cast<int64_t>(l), spare, kb, bk.data(), bv.data()).ok());
    EXPECT_EQ(bk, ck) << "layer " << l << ": K blocks through the device";
  }
  const double share = double(same) / double(total);
  EXPECT_GE(share, 0.97) << "q4a K blocks as the CPU's";
  std::printf("[ cuda k4a ] pool K bytes as the CPU's: %.4f\n", share);
}

}  // namespace
}  // namespace rill
