// The prefix cache's RAM and disk tiers with the model on the GPU (KV export
// of the CUDA runtime, model/cuda_kv_export.cpp), on the tiny
// ../shared/goldens/hf models (block size 16, context 512):
//  - a long prefix (400 of a 401-token prompt) written to disk by one engine
//    comes back after a restart (a new model and engine on the same
//    directory): cached_tokens reported, the cold run's tokens, and the
//    logprobs of a device-cache hit bit for bit (the round trip copies
//    bytes). Llama with f32 weights (f32 KV), the same converted to bf16 in
//    memory (bf16 activations, f16 KV), gemma2 (a sliding and a full KV
//    group) and qwen3_5 (recurrent state at the run's end);
//  - an evicted prefix comes back from the RAM tier (bf16 Llama);
//  - the exported KV has the CPU models' layout: the f32 Llama's K and V
//    blocks after the same prompt agree with the CPU's within f32 rounding
//    (so a file's bytes mean the same on both devices);
//  - q8_0h's and iq4_nlh's exported blocks, dequantized and rotated back,
//    agree with the CPU's f32 KV within the type's error, mostly equal the
//    CPU model's own blocks of the same type, and move into a CPU model of
//    the type byte for byte;
//  - block copies: scattered blocks written as a batch read back one by
//    one; a block or layer that is not there is an error;
//  - a cache written on the CPU is removed, not restored, by the device
//    engine (another "numerics"), and the reverse: the prompt is computed.
// Gemma 4 with full layers of head_dim 512 (gemma4_hd512_model.h; f32, bf16,
// q8_0 and q8_0h64 KV) takes the disk round trip too, and holds q8_0h64's
// exported rows to the CPU q8_0h64 model's (Q8_0h64RowsAreTheCpus).
// RILL_SHARED_DIR in the environment overrides the build-time path.
// Skipped without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "../engine/parity_engine.h"
#include "backend/cpu/kv_quant.h"
#include "backend/cpu/ops.h"
#include "core/half.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "engine/sequence_runner.h"
#include "gemma4_hd512_model.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

constexpr int kPrompt = 401;  // 25 whole blocks of 16 cached, the last token computed
constexpr int kCached = 400;

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_cuda_tiers_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
  }
  ~TmpDir() { fs::remove_all(path); }
};

struct GenRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // chosen token, then its top-5, per step
  int32_t cached = 0, persisted = 0;
};

GenRun generate(Engine& e, const std::vector<int32_t>& prompt, int32_t max_tokens, bool persist = false) {
  GenerationRequest r = test::parity_request(prompt, 0, max_tokens);  // greedy: the tokens must match exactly
  r.persist_prefix = persist;
  auto h = e.submit(std::move(r));
  EXPECT_TRUE(h.ok()) << h.error().message;
  if (!h.ok()) return {};
  test::ParityOutput o = test::collect_output(*h);
  return {std::move(o.ids), std::move(o.logprobs), o.usage.cached_tokens, o.usage.persisted_tokens};
}

std::vector<int32_t> random_prompt(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return p;
}

size_t n_kv_files(const fs::path& dir) {
  size_t n = 0;
  for (const auto& de : fs::directory_iterator(dir)) n += de.path().extension() == ".rkv";
  return n;
}

// kv_type: a --kv-type for K and V ("": the model's own).
EngineOptions engine_options(Device d, const std::string& cache_dir = "", int64_t ram_mb = 0,
                             const std::string& kv_type = "") {
  EngineOptions o;
  if (!kv_type.empty()) o.kv_types.k = o.kv_types.v = parse_kv_type(kv_type);
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 512;
  o.max_batch_tokens = 128;  // the prompt in chunks
  o.kv_cache_mb = 16;
  o.cache_dir = cache_dir;
  o.cache_ram_mb = ram_mb;
  o.cache_write_behind_min_tokens = 0;  // only the warm-up's persist writes
  o.check_integrity = true;
  return o;
}

// A golden model, or (bf16) the same with its matrices converted to bf16 in
// memory, on `device`: Engine::load for the files as they are, else
// Engine::create over the converted files (kept in `store`).
class Models {
 public:
  // "gemma4-hd512": gemma4_hd512_model.h's checkpoint (full layers of head_dim 512).
  Models(std::string name, bool bf16)
      : dir_(name == "gemma4-hd512" ? test::gemma4_hd512_model_dir() : test::hf_golden_dir(name)), bf16_(bf16) {}
  bool present() const { return !dir_.empty() && fs::exists(dir_ + "/config.json"); }
  std::unique_ptr<Engine> engine(const EngineOptions& eo) {
    Result<std::unique_ptr<Engine>> e = Error{"unset"};
    if (!bf16_) {
      e = Engine::load(dir_, eo);
    } else {
      if (!files_) {
        auto f = open_model_files(dir_);
        EXPECT_TRUE(f.ok()) << f.error().message;
        if (!f.ok()) return nullptr;
        test::to_bf16(**f, store_);
        files_ = *f;
      }
      ModelOptions mo;
      mo.device = eo.device;
      mo.n_threads = eo.n_threads;
      mo.n_ctx = eo.n_ctx;
      mo.max_batch_tokens = eo.max_batch_tokens;
      mo.kv_cache_bytes = eo.kv_cache_mb << 20;
      mo.kv_types = eo.kv_types;
      auto m = create_model(builtin_registry(), infer_profile(*files_), files_, mo);
      EXPECT_TRUE(m.ok()) << m.error().message;
      if (!m.ok()) return nullptr;
      EngineOptions o = eo;
      o.model_id = "bf16 " + dir_;
      e = Engine::create(std::move(m).value(), nullptr, o);
    }
    EXPECT_TRUE(e.ok()) << e.error().message;
    return e.ok() ? std::move(e).value() : nullptr;
  }

 private:
  std::string dir_;
  bool bf16_;
  std::shared_ptr<ModelFiles> files_;
  std::vector<std::vector<uint16_t>> store_;
};

struct Case {
  std::string model;
  bool bf16;
  std::string kv_type = "";  // "q8_0": quantized KV blocks through the tiers
};

class CudaKvTiers : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { RILL_REQUIRE_GPU(); }
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.model + (info.param.bf16 ? "_bf16" : "") +
                  (info.param.kv_type.empty() ? "" : "_kv_" + info.param.kv_type);
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return s;
}

TEST_P(CudaKvTiers, DiskPrefixSurvivesARestart) {
  // Each engine's Gemm times cuBLASLt's candidates for itself (gemm.h), so
  // two engines in default mode may pick different algorithms and round a
  // prefill differently; a restored prefix is bit-identical to what the
  // algorithm that computed it gives: pin the heuristic's choice here.
  ::setenv("RILL_GEMM_TUNE", "0", 1);
  struct Unset {
    ~Unset() { ::unsetenv("RILL_GEMM_TUNE"); }
  } unset;
  Models models(GetParam().model, GetParam().bf16);
  if (!models.present()) GTEST_SKIP() << GetParam().model << " golden not found";
  TmpDir dir;
  const auto prompt = random_prompt(kPrompt, 512, 11);
  GenRun cold, device_hit;
  {
    auto e = models.engine(engine_options(Device::kCuda, "", 0, GetParam().kv_type));
    ASSERT_TRUE(e);
    cold = generate(*e, prompt, 6);
    device_hit = generate(*e, prompt, 6);
    EXPECT_EQ(cold.cached, 0);
    EXPECT_EQ(device_hit.cached, kCached);
  }
  const EngineOptions o = engine_options(Device::kCuda, dir.path.string(), 0, GetParam().kv_type);
  {
    auto e = models.engine(o);
    ASSERT_TRUE(e);
    const GenRun warmup = generate(*e, prompt, 1, /*persist=*/true);
    EXPECT_EQ(warmup.persisted, kCached) << "the prompt's whole blocks were written";
    EXPECT_EQ(e->stats().disk_tier.entries, 1);
  }
  ASSERT_EQ(n_kv_files(dir.path), 1u);
  auto e = models.engine(o);  // a restart
  ASSERT_TRUE(e);
  EXPECT_EQ(e->stats().disk_tier.entries, 1);
  const GenRun warm = generate(*e, prompt, 6);
  EXPECT_EQ(warm.cached, kCached);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.tokens, device_hit.tokens);
  double max_diff = 0;
  for (size_t i = 0; i < std::min(warm.logprobs.size(), device_hit.logprobs.size()); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(warm.logprobs[i]) - device_hit.logprobs[i]));
  }
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "KV read back from disk must be bit-identical";
  const EngineStats s = e->stats();
  EXPECT_EQ(s.disk_tier.hits, 1);
  EXPECT_EQ(s.disk_tier.loads, 1);
  EXPECT_EQ(s.tier_restored_tokens, kCached);
  EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
  std::printf(
      "[ cuda tiers ] %s%s%s: restart restored %d cached tokens from disk in %.3f ms, tokens %s, max |logprob - "
      "device hit| %.3g\n",
      GetParam().model.c_str(), GetParam().bf16 ? " bf16" : "",
      GetParam().kv_type.empty() ? "" : (" kv " + GetParam().kv_type).c_str(), warm.cached,
      s.disk_tier.load_seconds * 1e3, warm.tokens == cold.tokens ? "= cold" : "DIFFER", max_diff);
}

INSTANTIATE_TEST_SUITE_P(
    Goldens, CudaKvTiers,
    ::testing::Values(Case{"llama", false}, Case{"llama", true}, Case{"gemma2", false}, Case{"qwen3_5", false},
                      Case{"gemma4", false}, Case{"llama", false, "q8_0"}, Case{"llama", true, "q8_0"},
                      Case{"gemma2", false, "q8_0"}, Case{"llama", false, "fp8"}, Case{"llama", true, "fp8"},
                      Case{"llama", true, "q8_0h"}, Case{"gemma2", false, "q4_0h"}, Case{"gemma2", false, "iq4_nlh"},
                      Case{"gemma4-hd512", false}, Case{"gemma4-hd512", true}, Case{"gemma4-hd512", false, "q8_0"},
                      Case{"gemma4-hd512", false, "q8_0h64"}, Case{"gemma4-hd512", false, "iq4_nlh64"}),
    case_name);

class CudaKvTiersRam : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { RILL_REQUIRE_GPU(); }
};

TEST_P(CudaKvTiersRam, EvictedPrefixComesBackFromTheRamTier) {
  Models models("llama", /*bf16=*/true);
  if (!models.present()) GTEST_SKIP() << "llama golden not found";
  EngineOptions o = engine_options(Device::kCuda, "", /*ram_mb=*/64, GetParam());
  o.kv_cache_mb = 1;  // 170 blocks of this model's f16 KV (384 bytes a token), 321 of q8_0 (204)
  auto e = models.engine(o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(kPrompt, 512, 1);
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, kCached);
  // A prompt and its 8 tokens take 26 blocks: this many others evict a's.
  const int n_others = e->stats().kv_blocks_total / 26 + 1;
  for (int i = 0; i < n_others; ++i) generate(*e, random_prompt(kPrompt, 512, 2 + static_cast<uint32_t>(i)), 8);
  const GenRun warm = generate(*e, a, 8);
  const EngineStats s = e->stats();
  EXPECT_GE(s.ram_tier.hits, 1);
  EXPECT_GT(s.tier_restored_tokens, 0);
  EXPECT_EQ(warm.cached, kCached);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored KV must be bit-identical";
  EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
  std::printf("[ cuda tiers ] llama bf16 kv %s: RAM tier restored %lld tokens (%lld hits)\n",
              GetParam().empty() ? "f16" : GetParam().c_str(), static_cast<long long>(s.tier_restored_tokens),
              static_cast<long long>(s.ram_tier.hits));
}

INSTANTIATE_TEST_SUITE_P(KvTypes, CudaKvTiersRam,
                         ::testing::Values(std::string(), std::string("q8_0"), std::string("fp8"), std::string("q8_0h"),
                                           std::string("iq4_nlh")),
                         [](const auto& info) { return info.param.empty() ? std::string("f16") : info.param; });

ModelOptions model_options(Device d) {
  ModelOptions o;
  o.device = d;
  o.n_threads = 2;
  o.n_ctx = 64;
  o.max_batch_tokens = 64;
  o.kv_block_size = 16;
  o.n_kv_slots = 2;
  return o;
}

// kv: a KV type for K and V (null: the model's own, f32).
Result<std::unique_ptr<Model>> open_llama(Device d, const char* kv = nullptr) {
  RILL_ASSIGN_OR_RETURN(auto files, open_model_files(test::hf_golden_dir("llama")));
  ModelOptions o = model_options(d);
  if (kv) o.kv_types.k = o.kv_types.v = parse_kv_type(kv);
  return create_model(builtin_registry(), infer_profile(*files), files, o);
}

// K and V of every layer's blocks [0, n) of slot 0 as f32.
std::vector<float> exported_kv(const Model& m, int32_t n_blocks) {
  const std::vector<Model::KvLayer> layers = m.kv_layers();
  std::vector<float> out;
  std::vector<int32_t> blocks(static_cast<size_t>(n_blocks));
  for (int32_t b = 0; b < n_blocks; ++b) blocks[static_cast<size_t>(b)] = b;
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(layers[l].dtype, DType::kF32);
    const size_t bb = layers[l].row_bytes * static_cast<size_t>(m.kv_block_size());
    std::vector<float> k(bb * blocks.size() / sizeof(float)), v(k.size());
    Status st = m.copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, reinterpret_cast<uint8_t*>(k.data()),
                                     reinterpret_cast<uint8_t*>(v.data()));
    EXPECT_TRUE(st.ok()) << st.error().message;
    out.insert(out.end(), k.begin(), k.end());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(CudaKvExport, KvHasTheCpuLayout) {
  RILL_REQUIRE_GPU();
  if (!fs::exists(test::hf_golden_dir("llama") + "/golden.json")) GTEST_SKIP() << "llama golden not found";
  auto cpu = open_llama(Device::kCpu);
  auto gpu = open_llama(Device::kCuda);
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  ASSERT_EQ((*cpu)->kv_layers().size(), (*gpu)->kv_layers().size());
  EXPECT_EQ((*cpu)->kv_layers()[0].row_bytes, (*gpu)->kv_layers()[0].row_bytes);
  const auto prompt = random_prompt(48, 512, 5);  // three whole blocks
  SequenceRunner rc(**cpu), rg(**gpu);
  ASSERT_TRUE(rc.score(prompt).ok());
  ASSERT_TRUE(rg.score(prompt).ok());
  const std::vector<float> want = exported_kv(**cpu, 3), got = exported_kv(**gpu, 3);
  double max_ref = 0;
  for (float x : want) max_ref = std::max(max_ref, double(std::fabs(x)));
  const double err = test::max_abs_diff(got, want);
  EXPECT_GT(max_ref, 1e-3);
  EXPECT_LT(err, 1e-4 * std::max(1.0, max_ref));
  EXPECT_NE((*cpu)->kv_numerics(), (*gpu)->kv_numerics());
  std::printf("[ cuda tiers ] llama f32 KV, GPU vs CPU export: max |diff| %.3g (max |kv| %.3g); numerics \"%s\"\n", err,
              max_ref, (*gpu)->kv_numerics().c_str());
}

// Rotated KV (q8_0h, iq4_nlh) exports in the CPU's layout: the CUDA
// model's blocks after a prompt, dequantized (cpu::dequantize_row) and each
// head rotated back (cpu::hadamard_rotate: H is its own inverse), agree
// with the CPU f32 model's exported K and V within the type's error, where
// a layout that differs (heads not rotated back, rows or blocks in another
// order) is off by the values themselves. q8_0h: a block's level step is at
// most 1/127 of its largest element; rotating back spreads a head's error
// over its 16 elements: sqrt(16) / 127 of the largest value, 5% here.
// iq4_nlh: iq4_nl's widest step is 24 of its 127 (0.19 of a block's
// largest element, half of it the rounding), sqrt(16) * 0.095 = 0.38 of the
// largest value: 45%. The blocks are the CPU encoder's for the same floats
// (backend_ops_test.cpp RotatedKvStoreIsTheCpuEncodersBytes); the floats
// here differ from the CPU iq4_nlh model's by the matmuls' rounding, so
// most blocks, not all, equal that model's own after the same prompt
// (at least half: any encoder of its own would match on almost none). And
// the same blocks imported into a CPU model of the type (the same block
// bytes) export back unchanged: a tier's or file's bytes move between the
// devices as they are.
TEST(CudaKvExport, RotatedKvHasTheCpuLayout) {
  RILL_REQUIRE_GPU();
  if (!fs::exists(test::hf_golden_dir("llama") + "/golden.json")) GTEST_SKIP() << "llama golden not found";
  struct Kind {
    const char* name;
    DType dtype;
    double bound;  // of max |kv|
  };
  for (const Kind kind : {Kind{"q8_0h", DType::kQ8_0, 0.05}, Kind{"iq4_nlh", DType::kIQ4_NL, 0.45}}) {
    auto ref = open_llama(Device::kCpu);
    auto gpu = open_llama(Device::kCuda, kind.name);
    auto cpu_rot = open_llama(Device::kCpu, kind.name);
    ASSERT_TRUE(ref.ok()) << ref.error().message;
    ASSERT_TRUE(gpu.ok()) << gpu.error().message;
    ASSERT_TRUE(cpu_rot.ok()) << cpu_rot.error().message;
    const std::vector<Model::KvLayer> layers = (*gpu)->kv_layers(), cpu_layers = (*cpu_rot)->kv_layers();
    ASSERT_EQ(layers.size(), cpu_layers.size());
    const auto prompt = random_prompt(48, 512, 5);  // three whole blocks
    SequenceRunner rr(**ref), rg(**gpu), rc(**cpu_rot);
    ASSERT_TRUE(rr.score(prompt).ok());
    ASSERT_TRUE(rg.score(prompt).ok());
    ASSERT_TRUE(rc.score(prompt).ok());
    const std::vector<float> want = exported_kv(**ref, 3);
    const int64_t hd = 16;  // the golden's head_dim
    const std::vector<int32_t> blocks = {0, 1, 2};
    const DTypeInfo info = dtype_info(kind.dtype);
    std::vector<float> got;
    size_t n_blocks = 0, n_same = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      EXPECT_EQ(layers[l].dtype, kind.dtype);
      EXPECT_EQ(layers[l].row_bytes, cpu_layers[l].row_bytes);
      EXPECT_EQ(layers[l].dtype, cpu_layers[l].dtype);
      const size_t bb = layers[l].row_bytes * static_cast<size_t>((*gpu)->kv_block_size());
      std::vector<uint8_t> k(bb * blocks.size()), v(k.size()), ck(k.size()), cv(k.size());
      Status st = (*gpu)->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, k.data(), v.data());
      ASSERT_TRUE(st.ok()) << st.error().message;
      ASSERT_TRUE((*cpu_rot)->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, ck.data(), cv.data()).ok());
      const auto block_bytes = static_cast<size_t>(info.block_bytes);
      for (size_t at = 0; at < k.size(); at += block_bytes) {
        n_blocks += 2;
        n_same += std::equal(k.begin() + at, k.begin() + at + block_bytes, ck.begin() + at);
        n_same += std::equal(v.begin() + at, v.begin() + at + block_bytes, cv.begin() + at);
      }
      for (const std::vector<uint8_t>* plane : {&k, &v}) {
        std::vector<float> x(plane->size() / block_bytes * static_cast<size_t>(info.block_size));
        cpu::dequantize_row(kind.dtype, plane->data(), x.data(), static_cast<int64_t>(x.size()));
        for (size_t h = 0; h < x.size(); h += hd) cpu::hadamard_rotate(x.data() + h, hd);
        got.insert(got.end(), x.begin(), x.end());
      }
      ASSERT_TRUE((*cpu_rot)->copy_kv_blocks_in(static_cast<int64_t>(l), blocks, bb, k.data(), v.data()).ok());
      std::vector<uint8_t> k2(k.size()), v2(v.size());
      ASSERT_TRUE((*cpu_rot)->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, k2.data(), v2.data()).ok());
      EXPECT_EQ(k2, k) << kind.name << " layer " << l << ": CUDA's K blocks through the CPU model";
      EXPECT_EQ(v2, v) << kind.name << " layer " << l << ": CUDA's V blocks through the CPU model";
    }
    ASSERT_EQ(got.size(), want.size());
    double max_ref = 0;
    for (float x : want) max_ref = std::max(max_ref, double(std::fabs(x)));
    const double err = test::max_abs_diff(got, want);
    EXPECT_GT(max_ref, 1e-3);
    EXPECT_LT(err, kind.bound * max_ref) << kind.name;
    EXPECT_GT(err, 0.0) << kind.name << " blocks equal f32 KV: not quantized?";
    EXPECT_GE(2 * n_same, n_blocks) << kind.name << ": blocks equal to the CPU model's own";
    std::printf(
        "[ cuda tiers ] llama %s KV, GPU export rotated back vs CPU f32 KV: max |diff| %.3g (max |kv| %.3g); %zu of "
        "%zu blocks equal the CPU %s model's\n",
        kind.name, err, max_ref, n_same, n_blocks, kind.name);
  }
}

// q8_0h64 (rotated q8_0 in blocks of 64: the goldens' heads of 16 hold
// none) on Gemma 4 with full layers of head_dim 512 (gemma4_hd512_model.h:
// sliding heads of 64, full heads of 512): the CUDA model's exported rows
// after a prompt are the CPU q8_0h64 model's layout and mostly its very
// blocks (the same encoder, RotatedKvStoreIsTheCpuEncodersBytes, over
// floats that differ by the matmuls' f32 rounding, so a block's scale
// choice may differ now and then: at least half equal, where any other
// encoder matches almost none), dequantized within 5% of the largest value
// of the CPU's (a scale choice 2.5% away plus a level step), and imported
// into the CPU model they export back unchanged: a tier's or KV file's
// q8_0h64 bytes move between the devices as they are. iq4_nlh64 (k4c's V
// type, blocks of 64 with an e4m3 scale) the same way, within 30% of the
// largest value: one of its codes moved to the next level is up to 24 of
// 127 of its block's largest value, a scale one e4m3 step away 1/8 of it.
void expect_rows_are_the_cpus(const char* kv, DType dtype, size_t block_bytes, double bound) {
  const std::string dir = test::gemma4_hd512_model_dir();
  if (dir.empty()) GTEST_SKIP() << "the gemma4 golden is missing";
  auto open = [&](Device d) -> Result<std::unique_ptr<Model>> {
    RILL_ASSIGN_OR_RETURN(auto files, open_model_files(dir));
    ModelOptions o = model_options(d);
    o.kv_types.k = o.kv_types.v = parse_kv_type(kv);
    return create_model(builtin_registry(), infer_profile(*files), files, o);
  };
  auto gpu = open(Device::kCuda), cpu = open(Device::kCpu);
  ASSERT_TRUE(gpu.ok()) << gpu.error().message;
  ASSERT_TRUE(cpu.ok()) << cpu.error().message;
  const std::vector<Model::KvLayer> layers = (*gpu)->kv_layers(), cpu_layers = (*cpu)->kv_layers();
  ASSERT_EQ(layers.size(), cpu_layers.size());
  ASSERT_FALSE(layers.empty());
  const auto prompt = random_prompt(48, 512, 5);  // three whole blocks
  SequenceRunner rg(**gpu), rc(**cpu);
  ASSERT_TRUE(rg.score(prompt).ok());
  ASSERT_TRUE(rc.score(prompt).ok());
  const std::vector<int32_t> blocks = {0, 1, 2};
  size_t n_blocks = 0, n_same = 0;
  double err = 0, max_ref = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    EXPECT_EQ(layers[l].dtype, dtype) << l;
    EXPECT_EQ(cpu_layers[l].dtype, dtype) << l;
    ASSERT_EQ(layers[l].row_bytes, cpu_layers[l].row_bytes) << l;
    const size_t bb = layers[l].row_bytes * static_cast<size_t>((*gpu)->kv_block_size());
    std::vector<uint8_t> k(bb * blocks.size()), v(k.size()), ck(k.size()), cv(k.size());
    ASSERT_TRUE((*gpu)->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, k.data(), v.data()).ok());
    ASSERT_TRUE((*cpu)->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, ck.data(), cv.data()).ok());
    for (size_t at = 0; at < k.size(); at += block_bytes) {
      n_blocks += 2;
      n_same += std::equal(k.begin() + at, k.begin() + at + block_bytes, ck.begin() + at);
      n_same += std::equal(v.begin() + at, v.begin() + at + block_bytes, cv.begin() + at);
    }
    for (auto [mine, theirs] : {std::pair{&k, &ck}, std::pair{&v, &cv}}) {
      const auto n = static_cast<int64_t>(mine->size() / block_bytes * 64);
      std::vector<float> x(static_cast<size_t>(n)), y(x.size());
      cpu::dequantize_row(dtype, mine->data(), x.data(), n);
      cpu::dequantize_row(dtype, theirs->data(), y.data(), n);
      err = std::max(err, test::max_abs_diff(x, y));
      for (float f : y) max_ref = std::max(max_ref, double(std::fabs(f)));
    }
    ASSERT_TRUE((*cpu)->copy_kv_blocks_in(static_cast<int64_t>(l), blocks, bb, k.data(), v.data()).ok());
    std::vector<uint8_t> k2(k.size()), v2(v.size());
    ASSERT_TRUE((*cpu)->copy_kv_blocks_out(static_cast<int64_t>(l), blocks, bb, k2.data(), v2.data()).ok());
    EXPECT_EQ(k2, k) << "layer " << l << ": CUDA's K blocks through the CPU model";
    EXPECT_EQ(v2, v) << "layer " << l << ": CUDA's V blocks through the CPU model";
  }
  EXPECT_GT(max_ref, 1e-3);
  EXPECT_LT(err, bound * max_ref);
  EXPECT_GE(2 * n_same, n_blocks) << "blocks equal to the CPU " << kv << " model's own";
  EXPECT_NE((*gpu)->kv_numerics().find(std::string("kv=") + kv + "#"), std::string::npos) << (*gpu)->kv_numerics();
  std::printf(
      "[ cuda tiers ] gemma4-hd512 %s KV: %zu of %zu blocks equal the CPU %s model's; dequantized max |diff| %.3g "
      "(max |kv| %.3g)\n",
      kv, n_same, n_blocks, kv, err, max_ref);
}

TEST(CudaKvExport, Q8_0h64RowsAreTheCpus) {
  RILL_REQUIRE_GPU();
  expect_rows_are_the_cpus("q8_0h64", kKvQ8_0x64, cpu::kQ8_0x64Bytes, 0.05);
}

TEST(CudaKvExport, Iq4Nlh64RowsAreTheCpus) {
  RILL_REQUIRE_GPU();
  expect_rows_are_the_cpus("iq4_nlh64", kKvIq4Nl64, cpu::kIq4Nl64Bytes, 0.3);
}

TEST(CudaKvExport, BlockCopiesRoundTripAndRefuseWhatIsNotThere) {
  RILL_REQUIRE_GPU();
  if (!fs::exists(test::hf_golden_dir("llama") + "/golden.json")) GTEST_SKIP() << "llama golden not found";
  auto m = open_llama(Device::kCuda);
  ASSERT_TRUE(m.ok()) << m.error().message;
  Model& model = **m;
  const int64_t last = static_cast<int64_t>(model.kv_layers().size()) - 1;
  const size_t bb = model.kv_layers()[0].row_bytes * static_cast<size_t>(model.kv_block_size());
  const std::vector<int32_t> blocks = {5, 2, 3, 4, 0};  // a run of three, two alone
  std::vector<uint8_t> k(blocks.size() * bb), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<uint8_t>(i * 7 + 1);
    v[i] = static_cast<uint8_t>(i * 13 + 5);
  }
  ASSERT_TRUE(model.copy_kv_blocks_in(last, blocks, bb, k.data(), v.data()).ok());
  std::vector<uint8_t> one_k(bb), one_v(bb);
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_TRUE(model.copy_kv_out(last, blocks[i], one_k.data(), one_v.data()).ok());
    EXPECT_TRUE(std::equal(one_k.begin(), one_k.end(), k.begin() + static_cast<ptrdiff_t>(i * bb))) << i;
    EXPECT_TRUE(std::equal(one_v.begin(), one_v.end(), v.begin() + static_cast<ptrdiff_t>(i * bb))) << i;
  }
  std::vector<uint8_t> k2(k.size()), v2(v.size());
  ASSERT_TRUE(model.copy_kv_blocks_out(last, blocks, bb, k2.data(), v2.data()).ok());
  EXPECT_EQ(k2, k);
  EXPECT_EQ(v2, v);
  EXPECT_FALSE(model.copy_kv_out(last + 1, 0, one_k.data(), one_v.data()).ok());
  EXPECT_FALSE(model.copy_kv_out(0, model.n_kv_blocks(), one_k.data(), one_v.data()).ok());
  EXPECT_FALSE(model.copy_kv_in(0, -1, one_k.data(), one_v.data()).ok());
  Status wrong = model.copy_kv_blocks_out(0, blocks, bb / 2, k2.data(), v2.data());
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("bytes"), std::string::npos) << wrong.error().message;
}

// A directory written on one device is another device's foreign cache: its
// files are removed at open (their numerics differ) and the prompt is
// computed, giving that device's cold tokens.
TEST(CudaKvTiersCrossDevice, ACacheOfTheOtherDeviceIsRemovedNotRestored) {
  RILL_REQUIRE_GPU();
  Models models("llama", /*bf16=*/false);
  if (!models.present()) GTEST_SKIP() << "llama golden not found";
  const auto prompt = random_prompt(kPrompt, 512, 21);
  for (Device writer : {Device::kCpu, Device::kCuda}) {
    const Device reader = writer == Device::kCpu ? Device::kCuda : Device::kCpu;
    TmpDir dir;
    GenRun reader_cold;
    {
      auto e = models.engine(engine_options(reader));
      ASSERT_TRUE(e);
      reader_cold = generate(*e, prompt, 6);
    }
    {
      auto e = models.engine(engine_options(writer, dir.path.string()));
      ASSERT_TRUE(e);
      EXPECT_EQ(generate(*e, prompt, 1, /*persist=*/true).persisted, kCached);
    }
    ASSERT_EQ(n_kv_files(dir.path), 1u);
    auto e = models.engine(engine_options(reader, dir.path.string()));
    ASSERT_TRUE(e);
    EXPECT_EQ(e->stats().disk_tier.entries, 0);
    EXPECT_EQ(n_kv_files(dir.path), 0u) << "the other device's file is removed at open";
    const GenRun got = generate(*e, prompt, 6);
    EXPECT_EQ(got.cached, 0);
    EXPECT_EQ(got.tokens, reader_cold.tokens);
    EXPECT_EQ(e->stats().disk_tier.hits, 0);
  }
}

}  // namespace
}  // namespace rill
