// The default model, SmolLM2-135M-Instruct Q4_1 (Q4_1 layer matrices, a
// Q8_0 embedding table tied to the LM head), on CUDA with its weights kept
// quantized, against the CPU Llama on the same file and against a third
// run, the reference: the CPU over the same weights dequantized to f32
// (f32 activations, so only rounding of activations separates the three).
//  - First-step logits (the prompt's last row; prompts of 5 to 17 tokens,
//    so prefill takes both the GEMV and the dequantize-then-GEMM path; the
//    LM head over every prompt row also takes the row-chunked GEMM): the
//    GPU within 2% of the largest |logit| of the reference, closer to it
//    than the CPU is, and within 10% of the CPU. Why the CPU and GPU differ
//    that much with identical weights: the CPU rounds every matmul input to
//    8-bit blocks (Q8_0/Q8_1/Q8_K, llama.cpp's scheme: step amax/127), the
//    GPU to bf16 (8 significant bits, step <= |x|/256), over 30 layers.
//    Measured on the H200 (2026-11-29): max |gpu - reference| 0.4-1.1% of
//    the largest |logit|, |cpu - reference| 1.8-6.1%, |gpu - cpu| 1.7-6.2%.
//  - Greedy continuations of 32 tokens identical, or where they differ a
//    near-tie: at that step the CPU's margin between the two tokens (and
//    the GPU's) is within the CPU/GPU logit difference; printed as NEAR-TIE
//    with the reference's choice, never hidden. Measured: 2 of the 4
//    prompts diverge, at steps 5 and 6, CPU margins 0.19 and 0.06 (logits
//    up to 34, CPU/GPU differences there 0.51 and 0.74); at both the f32
//    reference prefers the GPU's token (by 0.22 and 0.004).
//  - The decode row of one sequence is the same bits alone and beside two
//    others (batch invariance of the quantized GEMV path).
// The model comes from $RILL_MODEL_DIR (else the build's models/); skipped
// when absent or without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "backend/cpu/quants.h"
#include "cuda_test_util.h"
#include "engine/sequence_runner.h"
#include "loader/gguf.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

std::string model_path() {
  const char* env = std::getenv("RILL_MODEL_DIR");
  return std::string(env ? env : RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

const char* const kPrompts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    "Once upon a time, in a small village by the mountains, there lived",
    "Q: How many legs does a spider have?\nA:",
};

ModelOptions options(Device d) {
  ModelOptions o;
  o.device = d;
  o.n_ctx = 256;
  o.max_batch_tokens = 64;
  o.n_kv_slots = 3;
  return o;
}

// Every quantized 2-D tensor of `files` dequantized to f32 (buffers in `store`).
void to_f32(ModelFiles& files, std::vector<std::vector<float>>& store) {
  for (auto& [name, t] : files.tensors) {
    if (t.shape.size() != 2 || !dtype_info(t.dtype).quantized) continue;
    std::vector<float> f(static_cast<size_t>(t.n_elements()));
    cpu::ref::dequantize_row(t.dtype, t.data, f.data(), t.n_elements());
    store.push_back(std::move(f));
    t.dtype = DType::kF32;
    t.data = reinterpret_cast<const uint8_t*>(store.back().data());
    t.n_bytes = store.back().size() * 4;
  }
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i])));
  return m;
}
double max_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

class CudaQuantSmol : public ::testing::Test {
 protected:
  void SetUp() override {
    RILL_REQUIRE_GPU();
    if (!std::filesystem::exists(model_path())) GTEST_SKIP() << model_path() << " not found";
    auto files = open_model_files(model_path());
    ASSERT_TRUE(files.ok()) << files.error().message;
    files_ = std::move(files).value();
    auto tok = Tokenizer::from_gguf(*files_->gguf);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    for (const char* p : kPrompts) prompts_.push_back((*tok)->encode(p, true, false));
    auto cpu = create_model(builtin_registry(), infer_profile(*files_), files_, options(Device::kCpu));
    auto gpu = create_model(builtin_registry(), infer_profile(*files_), files_, options(Device::kCuda));
    ASSERT_TRUE(cpu.ok()) << cpu.error().message;
    ASSERT_TRUE(gpu.ok()) << gpu.error().message;
    cpu_ = std::move(cpu).value();
    gpu_ = std::move(gpu).value();
  }
  // The CPU over the weights dequantized to f32 (made on first use).
  Model& reference() {
    if (!ref_) {
      auto files = open_model_files(model_path());
      EXPECT_TRUE(files.ok());
      to_f32(**files, ref_store_);
      auto ref = create_model(builtin_registry(), infer_profile(**files), *files, options(Device::kCpu));
      EXPECT_TRUE(ref.ok()) << ref.error().message;
      ref_ = std::move(ref).value();
    }
    return *ref_;
  }
  // Logits of the last position of `ids` on `m` ([n_vocab]).
  static std::vector<float> last_logits(Model& m, const std::vector<int32_t>& ids) {
    SequenceRunner r(m);
    auto l = r.score(ids);
    EXPECT_TRUE(l.ok()) << l.error().message;
    if (!l.ok()) return {};
    const int64_t V = m.n_vocab();
    return std::vector<float>(l->end() - V, l->end());
  }

  std::shared_ptr<ModelFiles> files_;
  std::vector<std::vector<int32_t>> prompts_;
  std::unique_ptr<Model> cpu_, gpu_;
  std::vector<std::vector<float>> ref_store_;
  std::unique_ptr<Model> ref_;
};

TEST_F(CudaQuantSmol, FirstStepLogitsMatchTheCpu) {
  const int64_t V = cpu_->n_vocab();
  for (size_t p = 0; p < prompts_.size(); ++p) {
    const auto lc = last_logits(*cpu_, prompts_[p]);
    const auto lg = last_logits(*gpu_, prompts_[p]);
    const auto lr = last_logits(reference(), prompts_[p]);
    ASSERT_EQ(lc.size(), size_t(V));
    ASSERT_EQ(lg.size(), size_t(V));
    ASSERT_EQ(lr.size(), size_t(V));
    const double scale = max_abs(lr.data(), V);
    const double gc = max_diff(lg.data(), lc.data(), V), gr = max_diff(lg.data(), lr.data(), V),
                 cr = max_diff(lc.data(), lr.data(), V);
    std::printf(
        "[ cuda q4_1 ] prompt %zu (%zu tokens): max|logit| %.2f; max |gpu-cpu| %.4f (%.2f%%), "
        "vs f32 activations: gpu %.4f, cpu %.4f\n",
        p, prompts_[p].size(), scale, gc, 100 * gc / scale, gr, cr);
    EXPECT_LT(gr, 0.02 * scale) << "prompt " << p;
    EXPECT_LT(gr, cr) << "prompt " << p << ": the GPU is further from the reference than the CPU";
    EXPECT_LT(gc, 0.10 * scale) << "prompt " << p;
    const auto top = [&](const std::vector<float>& l) { return std::max_element(l.begin(), l.end()) - l.begin(); };
    std::printf("[ cuda q4_1 ]   top-1 cpu %td gpu %td f32 %td\n", top(lc), top(lg), top(lr));
  }
}

TEST_F(CudaQuantSmol, GreedyContinuationsMatchTheCpu) {
  constexpr int kSteps = 32;
  int n_identical = 0;
  for (size_t p = 0; p < prompts_.size(); ++p) {
    GenerationOptions go;
    go.max_tokens = kSteps;
    go.ignore_eos = true;
    go.sampling.temperature = 0;
    SequenceRunner rc(*cpu_), rg(*gpu_);
    auto c = rc.generate(prompts_[p], go, [](int32_t) { return true; });
    auto g = rg.generate(prompts_[p], go, [](int32_t) { return true; });
    ASSERT_TRUE(c.ok() && g.ok());
    ASSERT_EQ(c->ids.size(), size_t(kSteps));
    ASSERT_EQ(g->ids.size(), size_t(kSteps));
    const auto diff = std::mismatch(c->ids.begin(), c->ids.end(), g->ids.begin());
    if (diff.first == c->ids.end()) {
      ++n_identical;
      std::printf("[ cuda q4_1 ] prompt %zu: %d greedy tokens identical\n", p, kSteps);
      continue;
    }
    // Divergence at step k: both models scored on the common prefix.
    const auto k = diff.first - c->ids.begin();
    std::vector<int32_t> prefix = prompts_[p];
    prefix.insert(prefix.end(), c->ids.begin(), c->ids.begin() + k);
    const auto lc = last_logits(*cpu_, prefix);
    const auto lg = last_logits(*gpu_, prefix);
    const auto lr = last_logits(reference(), prefix);
    const int32_t a = *diff.first, b = *diff.second;
    const double cpu_margin = double(lc[a]) - lc[b], gpu_margin = double(lg[b]) - lg[a];
    const double noise = max_diff(lc.data(), lg.data(), cpu_->n_vocab());
    std::printf(
        "[ cuda q4_1 ] NEAR-TIE prompt %zu diverges at step %td: cpu picks %d, gpu %d; margins: "
        "cpu %.4f, gpu %.4f (gpu scored on the prefix), reference logit[%d] - logit[%d] = %.4f; "
        "max |gpu-cpu| logit at this step %.4f\n",
        p, k, a, b, cpu_margin, gpu_margin, a, b, double(lr[a]) - lr[b], noise);
    EXPECT_LE(cpu_margin, noise) << "prompt " << p << ": not a near-tie at step " << k;
    EXPECT_LE(gpu_margin, noise) << "prompt " << p << ": not a near-tie at step " << k;
  }
  std::printf("[ cuda q4_1 ] %d of %zu prompts: greedy identical over %d steps\n", n_identical, prompts_.size(),
              kSteps);
}

// Decode logits of one sequence alone and beside two others (same KV).
TEST_F(CudaQuantSmol, DecodeRowIsBatchInvariant) {
  Model& m = *gpu_;
  const int64_t V = m.n_vocab();
  std::vector<std::vector<int32_t>> tables;
  Batch b;
  std::vector<float> logits(V);
  for (int32_t s = 0; s < 3; ++s) {
    tables.push_back(slot_block_table(s, m.n_ctx(), m.kv_block_size()));
    const auto& ids = prompts_[static_cast<size_t>(s)];
    b.clear();
    b.add_sequence(ids.data(), static_cast<int32_t>(ids.size()), 0, true, tables.back());
    ASSERT_TRUE(m.forward(b, logits.data()).ok());
  }
  const int32_t next[3] = {5, 6, 7};
  int32_t pos[3];
  for (int s = 0; s < 3; ++s) pos[s] = static_cast<int32_t>(prompts_[static_cast<size_t>(s)].size());
  std::vector<float> alone(V), together(3 * V);
  b.clear();
  b.add_sequence(&next[0], 1, pos[0], true, tables[0]);
  ASSERT_TRUE(m.forward(b, alone.data()).ok());
  b.clear();
  for (int s = 0; s < 3; ++s) b.add_sequence(&next[s], 1, pos[s], true, tables[static_cast<size_t>(s)]);
  ASSERT_TRUE(m.forward(b, together.data()).ok());
  int n_diff = 0;
  for (int64_t i = 0; i < V; ++i) n_diff += alone[i] != together[i];
  EXPECT_EQ(n_diff, 0) << "logits of row 0 differ alone vs batched";
}

}  // namespace
}  // namespace rill
