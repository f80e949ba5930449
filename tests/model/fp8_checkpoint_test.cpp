// FP8 checkpoints on the CPU (tests/data/fp8/, tools/make_fp8_checkpoint.py):
// the CPU runs the weights' F32 dequantization, so
//  - its logits over the golden prompt equal, bit for bit, those of the same
//    model with numpy's f32 dequantization (dequantized.safetensors) in
//    their place, and
//  - they stay within FP8's error of the f32 HF golden's logits (the max
//    |logit| difference is printed: the FP8 error vs the unquantized model).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "loader/model_files.h"
#include "loader/safetensors.h"
#include "model/batch.h"
#include "model/registry.h"

namespace rill {
namespace {

const std::string kData = std::string(RILL_TEST_DATA) + "/fp8/";
const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

struct Golden {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // [n_ids][n_vocab]
};

Golden golden(const std::string& family) {
  std::ifstream in(kGoldens + family + "/golden.json");
  const auto j = nlohmann::json::parse(in);
  return {j["prompt_ids"].get<std::vector<int32_t>>(), j["logits"].get<std::vector<std::vector<float>>>()};
}

// Every prompt row's logits, [n_ids * n_vocab].
Result<std::vector<float>> logits_of(std::shared_ptr<const ModelFiles> files, const std::vector<int32_t>& ids) {
  ModelOptions opts;
  opts.n_threads = 2;
  opts.n_ctx = 32;
  opts.n_kv_slots = 1;
  RILL_ASSIGN_OR_RETURN(auto model, create_model(builtin_registry(), infer_profile(*files), files, opts));
  const auto n = static_cast<int32_t>(ids.size());
  const std::vector<int32_t> table = slot_block_table(0, opts.n_ctx, model->kv_block_size());
  Batch b;
  b.add_sequence(ids.data(), n, 0, false, table);
  for (int32_t i = 0; i < n; ++i) b.sample_rows.push_back(i);
  std::vector<float> out(static_cast<size_t>(n * model->n_vocab()));
  RILL_TRY(model->forward(b, out.data()));
  return out;
}

// The checkpoint with numpy's f32 dequantization in place of each FP8 weight.
struct Reference {
  std::shared_ptr<ModelFiles> files;
  SafetensorsFile dequantized;  // what the replaced tensors point into
};

Reference with_numpy_weights(const std::string& dir) {
  Reference r;
  auto files = open_model_files(dir);
  EXPECT_TRUE(files.ok()) << files.error().message;
  r.files = std::move(files).value();
  auto d = open_safetensors(dir + "/dequantized.safetensors");
  EXPECT_TRUE(d.ok());
  r.dequantized = std::move(d).value();
  for (const SafetensorsTensor& t : r.dequantized.tensors) {
    TensorRef& ref = r.files->tensors.at(t.name);
    ref = TensorRef{};
    ref.name = t.name;
    ref.file = dir + "/dequantized.safetensors";
    ref.dtype = t.dtype;
    ref.shape = t.shape;
    ref.data = t.data;
    ref.n_bytes = t.n_bytes;
  }
  return r;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

struct Case {
  std::string dir, family;
};

class Fp8CheckpointCpu : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8CheckpointCpu, LogitsMatchNumpysDequantizationAndStayNearTheGolden) {
  const Case c = GetParam();
  const Golden g = golden(c.family);
  auto files = open_model_files(kData + c.dir);
  ASSERT_TRUE(files.ok()) << files.error().message;
  auto fp8 = logits_of(std::move(files).value(), g.ids);
  ASSERT_TRUE(fp8.ok()) << fp8.error().message;
  const Reference ref = with_numpy_weights(kData + c.dir);
  auto numpy = logits_of(ref.files, g.ids);
  ASSERT_TRUE(numpy.ok()) << numpy.error().message;
  std::vector<float> hf;
  for (const auto& row : g.logits) hf.insert(hf.end(), row.begin(), row.end());
  ASSERT_EQ(hf.size(), fp8->size());
  double max_logit = 0;
  for (float x : hf) max_logit = std::max(max_logit, double(std::fabs(x)));

  const double vs_numpy = max_abs_diff(*fp8, *numpy), vs_hf = max_abs_diff(*fp8, hf),
               numpy_vs_hf = max_abs_diff(*numpy, hf);
  std::printf(
      "%s: max |logit| %.4f; max |diff| vs numpy's f32 dequantization %.2e, vs the f32 HF golden %.2e "
      "(numpy's weights vs the golden %.2e)\n",
      c.dir.c_str(), max_logit, vs_numpy, vs_hf, numpy_vs_hf);
  EXPECT_EQ(vs_numpy, 0.0);
  EXPECT_GT(vs_hf, 0.0);  // really quantized
  // FP8 e4m3 with per-block/channel/tensor scales on these random tiny
  // models: measured 0.23-0.25 with max |logit| 2.6-2.7 (2026-12-02).
  EXPECT_LT(vs_hf, 0.15 * max_logit);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fp8CheckpointCpu,
                         ::testing::Values(Case{"llama-fp8-block", "llama"}, Case{"llama-ct-channel", "llama"},
                                           Case{"llama-ct-tensor", "llama"}, Case{"qwen3-fp8-block", "qwen3"}),
                         [](const auto& info) {
                           std::string s = info.param.dir;
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

TEST(Fp8CheckpointCpu, QuantizeFp8StaysCudaOnly) {
  auto files = open_model_files(kData + "llama-ct-channel");
  ASSERT_TRUE(files.ok());
  ModelOptions opts;
  opts.quantize = WeightQuantization::kFp8;
  auto m = create_model(builtin_registry(), infer_profile(**files), *files, opts);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("--quantize fp8 runs on --device cuda only"), std::string::npos);
}

}  // namespace
}  // namespace rill
