// The prefix cache's RAM and disk tiers through the engine, on real models:
// a prefix evicted from the device cache comes back from the RAM tier, and a
// prefix written to disk comes back after a restart (a new engine), counted
// as cached tokens, giving the cold run's tokens and exactly the logprobs
// of a device-cache hit (the round trip is bit-exact, so the continuation's
// logits are too).
// Covered: the default model (f16 KV, full attention), the MLA goldens
// (latent rows), the HF llama golden
// (f32 KV), mistral-swa (a sliding-window layer group) and gemma2 / gemma3
// (a sliding and a full group in one run), qwen3_5 / qwen3-next (recurrent
// state at the run's end). A sliding layer stores only the blocks resuming at
// the run's end reads (file header and RAM bytes checked), and a prompt that
// shares only part of such a run (it would need dropped blocks) is computed,
// correctly, instead. A corrupt disk entry is removed at start and the prompt
// is computed normally; corrupt tensor data is caught at the load (always).
// Write-behind puts an ordinary request on disk once; flush_cache_tiers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/e4m3.h"
#include "engine/replay_speculator.h"
#include "engine/sampler.h"
#include "fake_model.h"
#include "kv/kv_file.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "parity_engine.h"
#include "rill/engine.h"

namespace rill {
namespace {
namespace fs = std::filesystem;

const std::string kSmol = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kGoldens = std::string(RILL_SHARED_DIR) + "/goldens/hf/";

struct TmpDir {
  fs::path path;
  TmpDir() {
    path = fs::temp_directory_path() /
           ("rill_tiers_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
  }
  ~TmpDir() { fs::remove_all(path); }
};

struct GenRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // chosen token, then its top-5, per step
  int32_t cached = 0;
  int32_t persisted = 0;  // Usage::persisted_tokens
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

std::unique_ptr<Engine> load(const std::string& model, EngineOptions o) {
  o.n_threads = 2;
  auto e = Engine::load(model, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return e.ok() ? std::move(e).value() : nullptr;
}

TEST(KvTiers, EvictedPrefixComesBackFromTheRamTier) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  EngineOptions o;
  o.kv_cache_mb = 9;  // ~24 blocks of 16 tokens: three 160-token prompts cannot all stay
  o.cache_ram_mb = 256;
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(161, 49152, 1);
  const GenRun cold = generate(*e, a, 8);
  EXPECT_EQ(cold.cached, 0);
  // The same prompt again hits the device cache: the reference for a hit
  // (one query computed instead of 161 sums in another order, so its
  // logprobs differ from the cold run's in the last bits).
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 160);
  generate(*e, random_prompt(161, 49152, 2), 8);  // these evict a's blocks
  generate(*e, random_prompt(161, 49152, 3), 8);
  const GenRun warm = generate(*e, a, 8);
  const EngineStats s = e->stats();
  EXPECT_TRUE(s.ram_tier.enabled);
  EXPECT_GE(s.ram_tier.hits, 1);
  EXPECT_GE(s.ram_tier.loads, 1) << "the restore is counted against the tier that served it";
  EXPECT_GT(s.ram_tier.load_seconds, 0);
  EXPECT_GT(s.tier_restored_tokens, 0);
  EXPECT_EQ(warm.cached, 160) << "every full block of the prompt (all but its last token)";
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.tokens, device_hit.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored KV must be bit-identical";
}

std::vector<fs::path> kv_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& de : fs::directory_iterator(dir)) {
    if (de.path().extension() == ".rkv") files.push_back(de.path());
  }
  return files;
}

// Every layer of a run file holds what resuming after its last token reads:
// a full layer every row, a sliding layer the rows from the first block its
// window reaches (blocks of block_size: 16, 32 with k4c's q4c K) on.
void expect_window_only_layers(const fs::path& file, int n_tokens, int block_size = 16) {
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(static_cast<int>(h->tokens.size()), n_tokens);
  for (size_t l = 0; l < h->layers.size(); ++l) {
    const KvLayerDesc& d = h->layers[l];
    if (d.kind == LayerKind::kRecurrent) continue;
    int64_t first = 0;
    if (d.kind == LayerKind::kSliding) {
      EXPECT_GT(d.window, 0) << "layer " << l;
      first = std::max(0, (n_tokens - d.window + 1) / block_size) * block_size;
    }
    EXPECT_EQ(d.first_token, first) << "layer " << l;
    ASSERT_EQ(d.tensors.size(), 2u);
    EXPECT_EQ(d.tensors[0].shape[0], n_tokens - first) << "layer " << l << " rows";
  }
}

// Writes `prompt`'s prefix to disk with one engine, then checks a second
// engine over the same directory serves it (and a cold engine agrees).
// `base`: the engine's options (e.g. tensor parallelism, KV types: quantized
// KV, issue 22) in every run; expect_dtype: with base.kv_types set, the type
// the file holds the first layer's K in. Returns the file written.
fs::path disk_round_trip(const std::string& model, int vocab, int prompt_len, int expect_cached,
                         const EngineOptions& base = {}, const TmpDir* keep = nullptr,
                         DType expect_dtype = DType::kF32) {
  TmpDir own;
  const TmpDir& dir = keep ? *keep : own;
  const auto prompt = random_prompt(prompt_len, vocab, 11);
  GenRun cold, device_hit;  // computed; then the same prompt from the device cache
  {
    auto e = load(model, base);
    if (!e) return {};  // load() failed the test
    cold = generate(*e, prompt, 6);
    device_hit = generate(*e, prompt, 6);
    EXPECT_EQ(device_hit.cached, expect_cached);
  }
  EngineOptions o = base;
  o.cache_dir = dir.path.string();
  {
    auto e = load(model, o);
    if (!e) return {};
    const GenRun warmup = generate(*e, prompt, 1, /*persist=*/true);
    EXPECT_EQ(warmup.tokens.size(), 1u);
    EXPECT_EQ(warmup.persisted, expect_cached) << "the prompt's whole blocks were written";
    EXPECT_EQ(e->stats().disk_tier.entries, 1);
  }
  const auto files = kv_files(dir.path);
  EXPECT_EQ(files.size(), 1u);
  if (files.size() != 1) return {};
  const bool chan = base.kv_types.k && kv_chan_k(base.kv_types.k->dtype);
  expect_window_only_layers(files[0], expect_cached, chan ? 32 : 16);
  if (!base.kv_types.empty()) {  // the file holds the KV in its stored type
    auto h = read_kv_header(files[0].string());
    EXPECT_TRUE(h.ok());
    if (!h.ok()) return {};
    EXPECT_EQ(h->layers[0].tensors[0].dtype, expect_dtype);
  }
  auto e = load(model, o);  // a restart
  if (!e) return {};
  EXPECT_EQ(e->stats().disk_tier.entries, 1);
  const GenRun warm = generate(*e, prompt, 6);
  EXPECT_EQ(warm.cached, expect_cached);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.tokens, device_hit.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "KV read back from disk must be bit-identical";
  EXPECT_EQ(e->stats().disk_tier.hits, 1);
  EXPECT_EQ(e->stats().disk_tier.loads, 1);
  EXPECT_GT(e->stats().disk_tier.load_seconds, 0);
  return files[0];
}

TEST(KvTiers, DiskPrefixSurvivesARestartF16Kv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  disk_round_trip(kSmol, 49152, 100, 96);
}

TEST(KvTiers, DiskPrefixSurvivesARestartF32Kv) {
  disk_round_trip(kGoldens + "llama", 512, 40, 32);
}

TEST(KvTiers, DiskPrefixSurvivesARestartSlidingWindow) {
  disk_round_trip(kGoldens + "mistral-swa", 512, 40, 32);
}

// mistral-swa: every layer slides (window 8, f32 KV rows of 128 bytes, 3
// layers). A 401-token prompt's run holds 25 blocks of tokens, but its layers
// only the last block: resuming at 400 reads positions 393..399. Restored, it
// continues exactly as a device hit; a prompt sharing 20 of its blocks would
// need blocks the run dropped, so it is computed (correctly) instead.
TEST(KvTiers, SlidingWindowRunKeepsOnlyTheWindowAndComesBackFromRam) {
  const std::string model = kGoldens + "mistral-swa";
  EngineOptions o;
  o.cache_ram_mb = 64;
  o.kv_cache_mb = 1;  // 85 blocks of 12 KiB: four 26-block prompts cannot all stay
  o.check_integrity = true;
  auto e = load(model, o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(401, 512, 1);
  std::vector<int32_t> shares_20(a.begin(), a.begin() + 320);  // 20 of a's blocks, then other tokens
  std::vector<int32_t> also_shares_20 = shares_20;
  const auto tail = random_prompt(81, 512, 99), other_tail = random_prompt(81, 512, 98);
  shares_20.insert(shares_20.end(), tail.begin(), tail.end());
  also_shares_20.insert(also_shares_20.end(), other_tail.begin(), other_tail.end());
  GenRun cold_shares_20, cold_also_shares_20;
  {
    auto ref = load(model, EngineOptions{});
    ASSERT_TRUE(ref);
    cold_shares_20 = generate(*ref, shares_20, 8);
    cold_also_shares_20 = generate(*ref, also_shares_20, 8);
  }
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 400);
  // Evict all of a (a spill of its whole chain, then its other blocks).
  for (uint32_t seed = 2; seed < 7; ++seed) generate(*e, random_prompt(401, 512, seed), 8);
  EngineStats s = e->stats();
  ASSERT_GE(s.ram_tier.entries, 1) << "a's chain was spilled to RAM";
  constexpr int64_t kRunBytes = 3 * 2 * 16 * 128;  // layers * (K, V) * one block's rows * row bytes
  EXPECT_EQ(s.ram_tier.bytes, s.ram_tier.entries * kRunBytes) << "sliding layers keep only the last block";
  const GenRun warm = generate(*e, a, 8);
  s = e->stats();
  EXPECT_GE(s.ram_tier.hits, 1);
  EXPECT_EQ(warm.cached, 400);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored KV must be bit-identical";
  // The device now holds a's chain with its first 24 blocks hollow, the RAM
  // tier a run that resumes only at 25 blocks: neither may serve 20.
  const int64_t restored = s.tier_restored_tokens;
  const GenRun partial = generate(*e, shares_20, 8);
  s = e->stats();
  EXPECT_EQ(partial.cached, 0) << "resuming at 20 blocks reads block 19, which nobody holds";
  EXPECT_EQ(s.tier_restored_tokens, restored);
  EXPECT_EQ(partial.tokens, cold_shares_20.tokens);
  EXPECT_EQ(partial.logprobs, cold_shares_20.logprobs);
  // Computing it filled the hollow nodes of the 20 shared blocks: another
  // prompt sharing them now resumes there from the device.
  const GenRun again = generate(*e, also_shares_20, 8);
  EXPECT_EQ(again.cached, 320);
  EXPECT_EQ(again.tokens, cold_also_shares_20.tokens);
  EXPECT_EQ(e->stats().integrity_errors, 0) << e->stats().last_integrity_error;
}

// The same through the disk tier after a restart: the file's layers hold one
// block; a prompt sharing three of its six blocks is refused (a miss) and
// computed exactly as cold, the prompt itself resumes bit for bit.
TEST(KvTiers, SlidingWindowDiskRunResumesOnlyWhereItHoldsTheWindow) {
  const std::string model = kGoldens + "mistral-swa";
  TmpDir dir;
  const auto prompt = random_prompt(100, 512, 21);
  std::vector<int32_t> shares_3(prompt.begin(), prompt.begin() + 48);
  const auto tail = random_prompt(52, 512, 22);
  shares_3.insert(shares_3.end(), tail.begin(), tail.end());
  GenRun device_hit, cold_shares_3;
  {
    auto e = load(model, EngineOptions{});
    ASSERT_TRUE(e);
    cold_shares_3 = generate(*e, shares_3, 6);
    generate(*e, prompt, 6);
    device_hit = generate(*e, prompt, 6);
    EXPECT_EQ(device_hit.cached, 96);
  }
  EngineOptions o;
  o.cache_dir = dir.path.string();
  o.check_integrity = true;
  {
    auto e = load(model, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(generate(*e, prompt, 1, /*persist=*/true).persisted, 96);
  }
  const auto files = kv_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  expect_window_only_layers(files[0], 96);
  auto h = read_kv_header(files[0].string());
  ASSERT_TRUE(h.ok());
  for (const KvLayerDesc& d : h->layers) {
    EXPECT_EQ(d.window, 8);
    EXPECT_EQ(d.first_token, 80) << "resuming at 96 reads positions 89..95: block 5 only";
    EXPECT_EQ(d.tensors[0].bytes, 16u * 128u);
  }
  auto e = load(model, o);  // a restart
  ASSERT_TRUE(e);
  const GenRun partial = generate(*e, shares_3, 6);
  EXPECT_EQ(partial.cached, 0);
  EXPECT_EQ(e->stats().disk_tier.hits, 0) << "the run cannot resume at 3 blocks";
  EXPECT_EQ(partial.tokens, cold_shares_3.tokens);
  EXPECT_EQ(partial.logprobs, cold_shares_3.logprobs);
  const GenRun warm = generate(*e, prompt, 6);
  EXPECT_EQ(warm.cached, 96);
  EXPECT_EQ(e->stats().disk_tier.hits, 1);
  EXPECT_EQ(warm.tokens, device_hit.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "KV read back from disk must be bit-identical";
  EXPECT_EQ(e->stats().integrity_errors, 0) << e->stats().last_integrity_error;
}

// Gemma: a sliding group (window 8) and a full group; a run holds both.
TEST(KvTiers, DiskPrefixSurvivesARestartGemma2TwoGroups) {
  disk_round_trip(kGoldens + "gemma2", 512, 40, 32);
}
TEST(KvTiers, DiskPrefixSurvivesARestartGemma3TwoGroups) {
  disk_round_trip(kGoldens + "gemma3", 512, 70, 64);
}

// Gemma 4: groups of different row widths (full layers' heads are wider),
// and two KV-shared layers that store nothing: the file holds the 4 layers
// that keep KV, each with its own row width.
TEST(KvTiers, DiskPrefixSurvivesARestartGemma4SharedKvLayers) {
  disk_round_trip(kGoldens + "gemma4", 512, 40, 32);
  TmpDir dir;
  EngineOptions o;
  o.cache_dir = dir.path.string();
  {
    auto e = load(kGoldens + "gemma4", o);
    ASSERT_TRUE(e);
    generate(*e, random_prompt(40, 512, 11), 1, /*persist=*/true);
  }
  const auto files = kv_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  auto h = read_kv_header(files[0].string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_EQ(h->layers.size(), 4u) << "6 layers, 2 of them reading another layer's KV";
  const LayerKind kinds[] = {LayerKind::kSliding, LayerKind::kSliding, LayerKind::kFull, LayerKind::kSliding};
  const int64_t widths[] = {32, 32, 64, 32};  // f32 elements of a K row: 2 x 16 sliding, 2 x 32 full
  for (size_t l = 0; l < 4; ++l) {
    EXPECT_EQ(h->layers[l].kind, kinds[l]) << "layer " << l;
    ASSERT_EQ(h->layers[l].tensors.size(), 2u);
    EXPECT_EQ(h->layers[l].tensors[0].shape.back(), widths[l]) << "layer " << l;
  }
}

// A two-group prefix evicted from the device cache comes back from RAM. The
// sliding group gives its oldest blocks back first, so its chain is evicted
// from the root: the spill must still keep the whole prefix.
TEST(KvTiers, EvictedTwoGroupPrefixComesBackFromTheRamTier) {
  EngineOptions o;
  o.cache_ram_mb = 64;
  // 1 MiB holds 64 blocks of this model's f32 KV (1 KiB a token); a
  // 241-token prompt (+8 generated) takes 16 blocks in each group, so the
  // later prompts evict the first's blocks.
  o.kv_cache_mb = 1;
  auto e = load(kGoldens + "gemma3", o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(241, 512, 1);
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 240);
  generate(*e, random_prompt(241, 512, 2), 8);  // these evict a's blocks
  generate(*e, random_prompt(241, 512, 3), 8);
  const GenRun warm = generate(*e, a, 8);
  const EngineStats s = e->stats();
  EXPECT_GE(s.ram_tier.hits, 1);
  EXPECT_GT(s.tier_restored_tokens, 0);
  EXPECT_EQ(warm.cached, 240) << "every full block of the prompt, in both groups";
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored KV must be bit-identical";
}

// RAM tier overflow: runs the RAM tier evicts are written to disk off the
// engine thread, and a prompt whose run went there comes back from disk
// (waiting for its write if it is still queued), bit for bit. The llama
// golden: f32 KV of 768 bytes a token, so a 401-token prompt's run is 300
// KiB and a 1 MiB RAM tier holds three.
TEST(KvTiers, RunsTheRamTierEvictsGoToDiskAndComeBack) {
  TmpDir dir;
  EngineOptions o;
  o.cache_ram_mb = 1;
  o.kv_cache_mb = 1;
  o.cache_dir = dir.path.string();
  o.cache_write_behind_min_tokens = 0;  // only RAM-tier evictions reach the disk here
  o.check_integrity = true;
  auto e = load(kGoldens + "llama", o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(401, 512, 1);
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 400);
  for (uint32_t seed = 2; seed < 10; ++seed) generate(*e, random_prompt(401, 512, seed), 8);
  EngineStats s = e->stats();
  EXPECT_GE(s.ram_tier.evictions, 1);
  const GenRun warm = generate(*e, a, 8);
  s = e->stats();
  EXPECT_GE(s.disk_tier.entries, 1);
  EXPECT_GE(s.disk_tier.hits, 1) << "a's run left the RAM tier for the disk";
  EXPECT_EQ(warm.cached, 400);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "KV written and read back must be bit-identical";
  EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
  EXPECT_FALSE(kv_files(dir.path).empty());
}

// Hybrids (linear attention + full attention): a run also holds the
// recurrent state checkpoint at its last block boundary.
TEST(KvTiers, DiskPrefixSurvivesARestartQwen35Hybrid) {
  disk_round_trip(kGoldens + "qwen3_5", 512, 40, 32);
}
TEST(KvTiers, DiskPrefixSurvivesARestartQwen3NextHybrid) {
  disk_round_trip(kGoldens + "qwen3-next", 512, 70, 64);
}

// Multi-head latent attention (DeepSeek-V3, MiniCPM3): one latent row per
// token and layer, split over the K and V planes, round-trips through the
// disk tier and the RAM tier bit for bit.
TEST(KvTiers, DiskPrefixSurvivesARestartDeepSeekV3Latent) {
  disk_round_trip(kGoldens + "deepseek-v3", 512, 40, 32);
}
TEST(KvTiers, DiskPrefixSurvivesARestartMiniCpm3Latent) {
  disk_round_trip(kGoldens + "minicpm3", 512, 40, 32);
}
// GLM-5 (DeepSeek sparse attention): the row also holds the indexer's key,
// which later tokens' selections read; a restored prefix selects as the
// cold run did only if the keys came back.
TEST(KvTiers, DiskPrefixSurvivesARestartGlm5IndexerKeys) {
  disk_round_trip(kGoldens + "glm-5", 512, 40, 32);
}

void evicted_latent_prefix_comes_back(const std::string& model) {
  EngineOptions o;
  o.cache_ram_mb = 64;
  // deepseek-v3: 227 blocks of 16 tokens at 288 bytes a token (3 layers x
  // 24 f32); glm-5: 136 at 480 (3 x 40)
  o.kv_cache_mb = 1;
  auto e = load(model, o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(401, 512, 1);  // 26 blocks; ten such prompts cannot all stay
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 400);
  for (uint32_t seed = 2; seed < 12; ++seed) generate(*e, random_prompt(401, 512, seed), 8);
  const GenRun warm = generate(*e, a, 8);
  const EngineStats s = e->stats();
  EXPECT_GE(s.ram_tier.hits, 1);
  EXPECT_GT(s.tier_restored_tokens, 0);
  EXPECT_EQ(warm.cached, 400);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored latent rows must be bit-identical";
  EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
}
TEST(KvTiers, EvictedLatentPrefixComesBackFromTheRamTier) {
  evicted_latent_prefix_comes_back(kGoldens + "deepseek-v3");
}
TEST(KvTiers, EvictedGlm5PrefixWithIndexerKeysComesBackFromTheRamTier) {
  evicted_latent_prefix_comes_back(kGoldens + "glm-5");
}

TEST(KvTiers, EvictedHybridPrefixComesBackFromTheRamTier) {
  EngineOptions o;
  o.cache_ram_mb = 64;
  o.kv_cache_mb = 1;  // 128 blocks of this model's f32 KV (2 attention layers)
  auto e = load(kGoldens + "qwen3_5", o);
  ASSERT_TRUE(e);
  const auto a = random_prompt(401, 512, 1);  // 26 blocks; five such prompts cannot all stay
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 400) << "the prompt's last full block has a checkpoint";
  for (uint32_t seed = 2; seed < 7; ++seed) generate(*e, random_prompt(401, 512, seed), 8);
  const GenRun warm = generate(*e, a, 8);
  const EngineStats s = e->stats();
  EXPECT_GE(s.ram_tier.hits, 1);
  EXPECT_GT(s.tier_restored_tokens, 0);
  EXPECT_EQ(warm.cached, 400);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored KV and state must be bit-identical";
}

TEST(KvTiers, CorruptDiskEntryIsRemovedAndThePromptComputed) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const auto prompt = random_prompt(60, 49152, 5);
  EngineOptions o;
  o.cache_dir = dir.path.string();
  GenRun first;
  {
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    first = generate(*e, prompt, 4, /*persist=*/true);
  }
  std::vector<fs::path> files;
  for (const auto& de : fs::directory_iterator(dir.path)) {
    if (de.path().extension() == ".rkv") files.push_back(de.path());
  }
  ASSERT_EQ(files.size(), 1u);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('!');
  }
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  EXPECT_FALSE(fs::exists(files[0]));
  const GenRun again = generate(*e, prompt, 4);
  EXPECT_EQ(again.cached, 0);
  EXPECT_EQ(again.tokens, first.tokens);
}

// Waits until the disk tier's write queue is empty (written off thread).
void wait_for_disk_writes(const Engine& e) {
  for (int i = 0; i < 2000 && e.stats().disk_tier.queued > 0; ++i) ::usleep(5000);
}

// Corrupt tensor data (16 KiB overwritten in the middle of a K tensor)
// without --kv-verify: the load checks the tensor hashes, so the entry is a
// miss, counted and removed, and the prompt is computed: the cold answer.
TEST(KvTiers, CorruptTensorDataOnDiskIsAMissAndTheAnswerIsCold) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const auto prompt = random_prompt(100, 49152, 21);
  EngineOptions o;
  o.cache_dir = dir.path.string();
  o.cache_write_behind_min_tokens = 0;  // only the warm-up writes
  GenRun cold;
  {
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    cold = generate(*e, prompt, 6);
    EXPECT_EQ(generate(*e, prompt, 1, /*persist=*/true).persisted, 96);
  }
  const auto files = kv_files(dir.path);
  ASSERT_EQ(files.size(), 1u);
  {
    auto h = read_kv_header(files[0].string());
    ASSERT_TRUE(h.ok());
    const KvTensorDesc& k = h->layers[h->layers.size() / 2].tensors[0];
    ASSERT_GT(k.bytes, 32u << 10);
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(k.off + k.bytes / 2 - (8u << 10)));
    const std::string junk(16u << 10, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->stats().disk_tier.entries, 1) << "open reads headers only (no --kv-verify)";
  const GenRun again = generate(*e, prompt, 6);
  EXPECT_EQ(again.cached, 0);
  EXPECT_EQ(again.tokens, cold.tokens);
  EXPECT_EQ(e->stats().disk_tier.errors, 1);
  EXPECT_EQ(e->stats().disk_tier.hits, 0);
  EXPECT_FALSE(fs::exists(files[0]));
}

// Write-behind: an ordinary request (no warm-up, no eviction) reaches disk
// once, off the request path, and a restart answers it from disk with the
// cold tokens and the device hit's logprobs.
TEST(KvTiers, WriteBehindMakesARestartWarmAndWritesARunOnce) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const auto prompt = random_prompt(100, 49152, 23);
  EngineOptions o;
  o.cache_dir = dir.path.string();
  o.cache_write_behind_min_tokens = 64;
  GenRun cold, device_hit;
  {
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    cold = generate(*e, prompt, 6);
    EXPECT_EQ(cold.cached, 0);
    wait_for_disk_writes(*e);
    device_hit = generate(*e, prompt, 6);  // the same chain: not written again
    EXPECT_EQ(device_hit.cached, 96);
    generate(*e, random_prompt(40, 49152, 24), 4);  // below the minimum: not written
    wait_for_disk_writes(*e);
    const EngineStats s = e->stats();
    EXPECT_EQ(s.disk_tier.written, 1);
    EXPECT_EQ(s.disk_tier.queued, 0);
    EXPECT_EQ(s.disk_tier.dropped, 0);
  }
  ASSERT_EQ(kv_files(dir.path).size(), 1u);
  auto e = load(kSmol, o);  // a restart
  ASSERT_TRUE(e);
  const GenRun warm = generate(*e, prompt, 6);
  EXPECT_EQ(warm.cached, 96);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "KV read back from disk must be bit-identical";
  EXPECT_EQ(e->stats().disk_tier.hits, 1);
}

// flush_cache_tiers: the queue is on disk when it returns, and closed after.
TEST(KvTiers, FlushCacheTiersWritesTheQueueThenClosesIt) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  EngineOptions o;
  o.cache_dir = dir.path.string();
  o.cache_write_behind_min_tokens = 32;
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  generate(*e, random_prompt(80, 49152, 31), 4);
  EXPECT_EQ(e->flush_cache_tiers(std::chrono::steady_clock::now() + std::chrono::seconds(60)), 0);
  EXPECT_EQ(e->stats().disk_tier.queued, 0);
  EXPECT_EQ(e->stats().disk_tier.written, 1);
  EXPECT_EQ(kv_files(dir.path).size(), 1u) << "on disk before the engine is gone";
  generate(*e, random_prompt(80, 49152, 32), 4);
  EXPECT_EQ(e->stats().disk_tier.written, 1) << "closed: nothing more is written";
  EXPECT_EQ(kv_files(dir.path).size(), 1u);
}

TEST(KvTiers, ASecondEngineCannotShareTheDirectory) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  EngineOptions o;
  o.cache_dir = dir.path.string();
  auto first = load(kSmol, o);
  ASSERT_TRUE(first);
  o.n_threads = 1;
  auto second = Engine::load(kSmol, o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("in use"), std::string::npos) << second.error().message;
}

// A model that does not export its KV cannot have tiers: the engine refuses
// to start, saying why.
TEST(KvTiers, AModelWithoutKvExportIsRefusedNamingWhy) {
  auto model = std::make_unique<testing::FakeModel>(testing::FakeModel::Options{});
  EXPECT_TRUE(model->kv_layers().empty());
  EngineOptions o;
  o.cache_ram_mb = 16;
  auto e = Engine::create(std::move(model), nullptr, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("--cache-ram-mb / --cache-dir"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("does not export its KV"), std::string::npos) << e.error().message;
}

// The f32 rows of every tensor of a KV file, in file order.
std::vector<float> kv_file_floats(const fs::path& file) {
  auto h = read_kv_header(file.string());
  EXPECT_TRUE(h.ok()) << h.error().message;
  std::vector<float> out;
  if (!h.ok()) return out;
  std::ifstream in(file, std::ios::binary);
  for (const KvLayerDesc& d : h->layers) {
    for (const KvTensorDesc& t : d.tensors) {
      std::vector<float> buf(t.bytes / sizeof(float));
      in.seekg(static_cast<std::streamoff>(t.off));
      in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(t.bytes));
      out.insert(out.end(), buf.begin(), buf.end());
    }
  }
  return out;
}

// Tensor-parallel models use the tiers too: a rank's KV blocks hold its
// heads, and the export joins them into the one-device row layout (N = 2
// splits the golden's two KV heads; N = 4 replicates each over two ranks,
// and an import writes both replicas). A restart resumes the file with the
// same tokens and bits, and the file's rows equal a one-device model's
// within the ranks' rounding (so the heads are in the one-device order).
TEST(KvTiers, TensorParallelPrefixSurvivesARestartInTheOneDeviceLayout) {
  TmpDir one_dir;
  const fs::path one = disk_round_trip(kGoldens + "llama", 512, 40, 32, EngineOptions{}, &one_dir);
  const std::vector<float> want = kv_file_floats(one);
  ASSERT_FALSE(want.empty());
  for (int n : {2, 4}) {
    SCOPED_TRACE("tensor_parallel " + std::to_string(n));
    EngineOptions o;
    o.tensor_parallel = n;
    TmpDir dir;
    const fs::path file = disk_round_trip(kGoldens + "llama", 512, 40, 32, o, &dir);
    auto h = read_kv_header(file.string());
    ASSERT_TRUE(h.ok()) << h.error().message;
    EXPECT_NE(h->identity.numerics.find("tp=" + std::to_string(n)), std::string::npos) << h->identity.numerics;
    const std::vector<float> got = kv_file_floats(file);
    ASSERT_EQ(got.size(), want.size());
    float max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
    EXPECT_LT(max_diff, 1e-4f);
  }
}

TEST(KvTiers, EvictedTensorParallelPrefixComesBackFromTheRamTier) {
  EngineOptions o;
  o.tensor_parallel = 4;
  o.n_ctx = 64;
  o.kv_cache_mb = 1;
  o.cache_ram_mb = 16;
  auto e = load(kGoldens + "llama", o);
  ASSERT_TRUE(e);
  const int32_t n_blocks = e->stats().kv_blocks_total;
  const auto a = random_prompt(33, 512, 1);
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 32);
  // Each prompt takes 3 blocks; n_blocks / 2 of them evict every older block.
  for (uint32_t seed = 2; seed < 4 + static_cast<uint32_t>(n_blocks) / 2; ++seed)
    generate(*e, random_prompt(33, 512, seed), 8);
  const GenRun warm = generate(*e, a, 8);
  EXPECT_GE(e->stats().ram_tier.hits, 1);
  EXPECT_EQ(warm.cached, 32);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored KV must be bit-identical";
}

TEST(KvTiers, PersistWithoutADiskTierIsAnError) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  auto e = load(kSmol, EngineOptions{});
  ASSERT_TRUE(e);
  GenerationRequest r;
  r.prompt = random_prompt(40, 49152, 9);
  r.max_tokens = 1;
  r.persist_prefix = true;
  auto h = e->submit(std::move(r));
  ASSERT_TRUE(h.ok());
  GenerationEvent ev, last;
  while (h->next(ev)) last = ev;
  EXPECT_EQ(last.finish_reason, FinishReason::kError);
  EXPECT_NE(last.error.find("--cache-dir"), std::string::npos) << last.error;
}

// Quantized KV (issue 22): the tiers store the blocks as the cache holds
// them, so the round trip stays bit-exact in every type.
KvTypeOptions kv_all(const char* name) {
  KvTypeOptions o;
  const std::optional<KvLayerTypes> t = parse_kv_pair(name);  // a type for both sides, or k4c's pair
  EXPECT_TRUE(t) << name;
  if (t) {
    o.k = t->k;
    o.v = t->v;
  }
  return o;
}
EngineOptions with_kv(const KvTypeOptions& kv) {
  EngineOptions o;
  o.kv_types = kv;
  return o;
}

TEST(KvTiers, DiskPrefixSurvivesARestartQ8_0Kv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv_all("q8_0")), nullptr, DType::kQ8_0);
}

// Every plain llama.cpp-layout type the CPU stores, through the disk tier
// and a restart on the f32 llama golden: the file holds the KV in that
// type, read back bit for bit.
TEST(KvTiers, DiskPrefixSurvivesARestartInEveryPlainKvType) {
  const std::pair<const char*, DType> types[] = {
      {"bf16", DType::kBF16}, {"q4_0", DType::kQ4_0}, {"q4_1", DType::kQ4_1},
      {"q5_0", DType::kQ5_0}, {"q5_1", DType::kQ5_1},
  };
  for (const auto& [name, dtype] : types) {
    SCOPED_TRACE(name);
    disk_round_trip(kGoldens + "llama", 512, 40, 32, with_kv(kv_all(name)), nullptr, dtype);
  }
}

TEST(KvTiers, DiskPrefixSurvivesARestartRotatedQ4Kv) {
  // gemma3: a sliding and a full group; heads of 16 share q4_0 blocks.
  disk_round_trip(kGoldens + "gemma3", 512, 70, 64, with_kv(kv_all("q4_0h")), nullptr, DType::kQ4_0);
}

TEST(KvTiers, DiskPrefixSurvivesARestartRotatedIq4nlKv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  // The file holds GGML's IQ4_NL blocks of the rotated heads.
  disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv_all("iq4_nlh")), nullptr, DType::kIQ4_NL);
}

TEST(KvTiers, DiskPrefixSurvivesARestartPerLayerKv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir cfg_dir;
  fs::create_directories(cfg_dir.path);
  const std::string cfg = (cfg_dir.path / "kv.conf").string();
  std::ofstream(cfg) << "# first and last layers at 8 bits\n0 q8_0\n-1 q8_0\n1-28 q5_1\n";
  KvTypeOptions kv = kv_all("q4_0h");
  ASSERT_TRUE(load_kv_config(cfg, kv).ok());
  disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv), nullptr, DType::kQ8_0);
}

// Quantized KV on Gemma 4: rows of their own width per layer (2 heads of 16
// on sliding layers, 2 of 32 on the full ones) and their own type per
// layer, KV-shared layers storing none. Layer 2 (the first full layer) is
// q8_0, the others rotated q4_0; the file holds each layer in its type.
TEST(KvTiers, DiskPrefixSurvivesARestartGemma4QuantizedKv) {
  TmpDir cfg_dir;
  fs::create_directories(cfg_dir.path);
  const std::string cfg = (cfg_dir.path / "kv.conf").string();
  std::ofstream(cfg) << "2 q8_0\n";
  KvTypeOptions kv = kv_all("q4_0h");
  ASSERT_TRUE(load_kv_config(cfg, kv).ok());
  TmpDir dir;
  const fs::path file = disk_round_trip(kGoldens + "gemma4", 512, 40, 32, with_kv(kv), &dir, DType::kQ4_0);
  ASSERT_FALSE(file.empty());
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  ASSERT_EQ(h->layers.size(), 4u) << "6 layers, 2 of them reading another layer's KV";
  const DType types[] = {DType::kQ4_0, DType::kQ4_0, DType::kQ8_0, DType::kQ4_0};
  const int64_t widths[] = {32, 32, 64, 32};
  for (size_t l = 0; l < 4; ++l) {
    ASSERT_EQ(h->layers[l].tensors.size(), 2u);
    EXPECT_EQ(h->layers[l].tensors[0].dtype, types[l]) << "layer " << l;
    EXPECT_EQ(h->layers[l].tensors[1].dtype, types[l]) << "layer " << l;
    EXPECT_EQ(h->layers[l].tensors[0].shape.back(), widths[l]) << "layer " << l;
  }
}

// Quantized KV under tensor parallelism: each rank quantizes its own heads
// (qwen3: 2 KV heads of 32, one q8_0 block per rank at tp=2); the file holds
// the one-device row of both ranks' blocks side by side, and restores bit
// for bit. Layers whose K and V types differ are refused by the tiers.
TEST(KvTiers, TensorParallelQuantizedPrefixSurvivesARestart) {
  EngineOptions o = with_kv(kv_all("q8_0"));
  o.tensor_parallel = 2;
  TmpDir dir;
  const fs::path file = disk_round_trip(kGoldens + "qwen3", 512, 40, 32, o, &dir, DType::kQ8_0);
  ASSERT_FALSE(file.empty());
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_NE(h->identity.numerics.find("kv=q8_0"), std::string::npos) << h->identity.numerics;
  EXPECT_NE(h->identity.numerics.find("tp=2"), std::string::npos) << h->identity.numerics;
  for (const auto& layer : h->layers) EXPECT_EQ(layer.tensors[0].shape.back(), 64) << "2 KV heads of 32";

  EngineOptions mixed;
  mixed.tensor_parallel = 2;
  mixed.kv_types.k = parse_kv_type("q8_0");
  mixed.kv_types.v = parse_kv_type("q4_0");
  mixed.cache_ram_mb = 16;
  mixed.n_threads = 2;
  auto r = Engine::load(kGoldens + "qwen3", mixed);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("different types"), std::string::npos) << r.error().message;
}

TEST(KvTiers, EvictedQuantizedPrefixComesBackFromTheRamTier) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  for (const char* type : {"q4_0h", "iq4_nlh"}) {
    SCOPED_TRACE(type);
    EngineOptions o;
    o.kv_cache_mb = 3;  // 4-bit rotated: ~3.5x the tokens of f16 per MiB, still too few for three prompts
    o.cache_ram_mb = 256;
    o.kv_types = kv_all(type);
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->stats().kv_bytes_per_token, 30 * 2 * 3 * 64 / 32 * 18) << "30 layers, K and V, 3 KV heads of 64";
    const auto a = random_prompt(161, 49152, 1);
    const GenRun cold = generate(*e, a, 8);
    const GenRun device_hit = generate(*e, a, 8);
    EXPECT_EQ(device_hit.cached, 160);
    generate(*e, random_prompt(161, 49152, 2), 8);
    generate(*e, random_prompt(161, 49152, 3), 8);
    const GenRun warm = generate(*e, a, 8);
    EXPECT_GE(e->stats().ram_tier.hits, 1);
    EXPECT_EQ(warm.cached, 160);
    EXPECT_EQ(warm.tokens, device_hit.tokens);
    EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored quantized KV must be bit-identical";
  }
}

// q8_0h64 (rotated q8_0 in blocks of 64, 66 bytes per 64 values): the
// disk tier's file holds Q8_0_64 tensors (groupSize 64) and the numerics
// name the type and its encoder; the restart and the RAM tier restore the
// blocks bit for bit (disk_round_trip and the logprobs below).
TEST(KvTiers, DiskPrefixSurvivesARestartQ8_0h64Kv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const fs::path file = disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv_all("q8_0h64")), &dir, kKvQ8_0x64);
  ASSERT_FALSE(file.empty());
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_NE(h->identity.numerics.find("kv=q8_0h64#2"), std::string::npos) << h->identity.numerics;
  ASSERT_EQ(h->layers.size(), 30u);
  for (const auto& layer : h->layers) {
    for (const auto& t : layer.tensors) {
      EXPECT_EQ(t.dtype, kKvQ8_0x64);
      EXPECT_EQ(t.shape, (std::vector<int64_t>{96, 192}));
      EXPECT_EQ(t.bytes, 96u * 198u);
    }
  }
}

// A model whose heads are not whole blocks of 64 refuses q8_0h64 at load,
// naming the type and the head_dim (the goldens' heads are 16 and 32 wide).
TEST(KvTiers, Q8_0h64RefusedOnHeadsNotMultiplesOf64) {
  for (const char* model : {"gemma3", "qwen3"}) {
    EngineOptions o = with_kv(kv_all("q8_0h64"));
    o.n_threads = 1;
    auto r = Engine::load(kGoldens + model, o);
    ASSERT_FALSE(r.ok()) << model;
    EXPECT_NE(r.error().message.find("q8_0h64"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("not a multiple of 64"), std::string::npos) << r.error().message;
  }
}

TEST(KvTiers, EvictedQ8_0h64PrefixComesBackFromTheRamTier) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  EngineOptions o;
  o.kv_cache_mb = 2;  // 8.25 bits: 11 blocks of 16 tokens, one 83-token run (6 blocks) at a time
  o.cache_ram_mb = 256;
  o.kv_types = kv_all("q8_0h64");
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  // Admission and /stats count the real bytes: 30 layers, K and V, 3 KV
  // heads of 64 in one block of 66 bytes each (f16: 23,040).
  EXPECT_EQ(e->stats().kv_bytes_per_token, 30 * 2 * 3 * 66);
  const auto a = random_prompt(81, 49152, 1);
  const GenRun cold = generate(*e, a, 2);
  const GenRun device_hit = generate(*e, a, 2);
  EXPECT_EQ(device_hit.cached, 80);
  EXPECT_EQ(device_hit.tokens, cold.tokens);
  generate(*e, random_prompt(81, 49152, 2), 2);
  generate(*e, random_prompt(81, 49152, 3), 2);
  const GenRun warm = generate(*e, a, 2);
  EXPECT_GE(e->stats().ram_tier.hits, 1);
  EXPECT_EQ(warm.cached, 80);
  EXPECT_EQ(warm.tokens, device_hit.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored quantized KV must be bit-identical";
}

// A file written under one KV type is never resumed under another: the
// numerics it records name the types.
TEST(KvTiers, ChangedKvTypeInvalidatesDiskFiles) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const auto prompt = random_prompt(100, 49152, 11);
  EngineOptions o;
  o.cache_dir = dir.path.string();
  o.kv_types = kv_all("q8_0");
  {
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(generate(*e, prompt, 1, /*persist=*/true).persisted, 96);
  }
  // iq4_nlh and q4_0h: the same bytes per block, other levels.
  for (const char* other : {"f16", "q4_0h", "iq4_nlh", "k4c", "k4a", "q8_0h", "q8_0h64"}) {
    o.kv_types = std::string(other) == "f16" ? KvTypeOptions{} : kv_all(other);
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(e->stats().disk_tier.entries, 0) << other;
    EXPECT_EQ(generate(*e, prompt, 2).cached, 0) << other;
  }
}

// K and V in different types (k4c's are): each tensor of the file in its
// own type, and the round trip bit-exact.
TEST(KvTiers, MixedKAndVTypesSurviveARestart) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  KvTypeOptions kv;
  kv.k = parse_kv_type("q8_0");
  kv.v = parse_kv_type("q4_0");
  TmpDir dir;
  const fs::path file = disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv), &dir, DType::kQ8_0);
  ASSERT_FALSE(file.empty());
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  for (const auto& layer : h->layers) EXPECT_EQ(layer.tensors[1].dtype, DType::kQ4_0);
}

// k4c (model/kv_tails.h): blocks of 32 whose K is quantized per channel;
// only whole blocks reach the tiers, and the tail of the resumed sequence
// is rebuilt from the prompt's last partial block.
TEST(KvTiers, DiskPrefixSurvivesARestartK4cKv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const fs::path file = disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv_all("k4c")), &dir, kKvQ4Chan);
  ASSERT_FALSE(file.empty());
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_NE(h->identity.numerics.find("kv=k:q4c#3/v:iq4_nlh64#2"), std::string::npos) << h->identity.numerics;
  ASSERT_EQ(h->layers.size(), 30u);
  for (const auto& layer : h->layers) {
    EXPECT_EQ(layer.tensors[1].dtype, kKvIq4Nl64);
    EXPECT_EQ(layer.tensors[0].shape, (std::vector<int64_t>{96, 192}));
  }
}

// k4a: k4c's flow with q4a's calibrated K widths; the file names them (a
// hash in the numerics), and a restart calibrates to the same widths, so
// the round trip is bit-exact.
TEST(KvTiers, DiskPrefixSurvivesARestartK4aKv) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const fs::path file = disk_round_trip(kSmol, 49152, 100, 96, with_kv(kv_all("k4a")), &dir, kKvQ4Alloc);
  ASSERT_FALSE(file.empty());
  auto h = read_kv_header(file.string());
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_NE(h->identity.numerics.find("kv=k:q4a#3/v:iq4_nlh64#2"), std::string::npos) << h->identity.numerics;
  EXPECT_NE(h->identity.numerics.find(" q4a-widths="), std::string::npos) << h->identity.numerics;
}

// KV stored under other q4a widths (another calibration text) is never
// resumed: the numerics differ, so the disk tier drops the file.
TEST(KvTiers, OtherQ4aWidthsInvalidateDiskFiles) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  TmpDir dir;
  const auto prompt = random_prompt(100, 49152, 11);
  EngineOptions o;
  o.cache_dir = dir.path.string();
  o.kv_types = kv_all("k4a");
  {
    auto e = load(kSmol, o);
    ASSERT_TRUE(e);
    EXPECT_EQ(generate(*e, prompt, 1, /*persist=*/true).persisted, 96);
  }
  const fs::path text = dir.path / "calibration.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "Line " << i << ": the quick brown fox jumps over the lazy dog, twice.\n";
  }
  o.kv_types.calibration_path = text.string();
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->stats().disk_tier.entries, 0);
  EXPECT_EQ(generate(*e, prompt, 2).cached, 0);
  // A calibration file that is missing is an error naming it.
  o.kv_types.calibration_path = (dir.path / "missing.txt").string();
  o.n_threads = 2;
  auto missing = Engine::load(kSmol, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing.txt"), std::string::npos) << missing.error().message;
}

// q4c K on a sliding-window model (mistral-swa: window 8, rows of 32): the
// run keeps only the block resuming at 96 reads, and a sequence resumes
// with an empty tail at that block boundary.
TEST(KvTiers, DiskPrefixSurvivesARestartSlidingWindowQ4cK) {
  KvTypeOptions kv;
  kv.k = parse_kv_type("q4c");
  disk_round_trip(kGoldens + "mistral-swa", 512, 100, 96, with_kv(kv), nullptr, kKvQ4Chan);
}

TEST(KvTiers, EvictedK4cPrefixComesBackFromTheRamTier) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  EngineOptions o;
  o.kv_cache_mb = 3;  // two running sequences' tails, then 11 blocks of 32: too few for three prompts
  o.max_running = 2;
  o.cache_ram_mb = 256;
  o.kv_types = kv_all("k4c");
  auto e = load(kSmol, o);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->stats().kv_block_size, 32);
  EXPECT_EQ(e->stats().kv_bytes_per_token, 30 * (192 / 32 * 19 + 192 / 64 * 33)) << "K 114 + V 99 B per layer";
  // Per layer and sequence: a 64-byte head, then K and V of 32 tokens in
  // q8_0 rows of 192 (6 blocks of 34 bytes).
  EXPECT_EQ(e->stats().kv_tail_bytes, 2 * 30 * (64 + 2 * 32 * 6 * 34)) << "q8_0 K and V of 32 tokens";
  EXPECT_EQ(e->stats().kv_blocks_total, (3 * 1048576 - 2 * 30 * (64 + 2 * 32 * 6 * 34)) / (32 * 6390));
  const auto a = random_prompt(161, 49152, 1);
  const GenRun cold = generate(*e, a, 8);
  const GenRun device_hit = generate(*e, a, 8);
  EXPECT_EQ(device_hit.cached, 160);
  EXPECT_EQ(device_hit.tokens, cold.tokens);
  generate(*e, random_prompt(161, 49152, 2), 8);
  generate(*e, random_prompt(161, 49152, 3), 8);
  const GenRun warm = generate(*e, a, 8);
  EXPECT_GE(e->stats().ram_tier.hits, 1);
  EXPECT_EQ(warm.cached, 160);
  EXPECT_EQ(warm.tokens, device_hit.tokens);
  EXPECT_EQ(warm.logprobs, device_hit.logprobs) << "restored k4c KV must be bit-identical";
}

// k4c with drafts (which end before their block does, so a verify step
// never encodes a block with a rejected draft in it): the prefix cache
// then holds the blocks a run without drafts makes, byte for byte, so a
// request resuming from them reads the same logprobs in both engines.
TEST(KvTiers, K4cSpeculativeRunCachesTheBlocksOfARunWithoutDrafts) {
  if (!fs::exists(kSmol)) GTEST_SKIP() << "default model missing: " << kSmol;
  EngineOptions o;
  o.kv_types = kv_all("k4c");
  auto plain = load(kSmol, o);
  ASSERT_TRUE(plain);
  const auto a = random_prompt(100, 49152, 21);
  const GenRun cold = generate(*plain, a, 90);
  ASSERT_EQ(cold.tokens.size(), 90u);
  std::vector<int32_t> recorded = a;
  recorded.insert(recorded.end(), cold.tokens.begin(), cold.tokens.end());
  const fs::path replay = fs::temp_directory_path() / ("rill_k4c_replay_" + std::to_string(::getpid()));
  ASSERT_TRUE(write_replay_file(replay.string(), {recorded}).ok());
  o.spec = "replay=" + replay.string() + ":0.5";
  o.spec_tokens = 6;
  auto drafted = load(kSmol, o);
  ASSERT_TRUE(drafted);
  EXPECT_EQ(generate(*drafted, a, 90).tokens, cold.tokens);
  EXPECT_GT(drafted->stats().spec_accepted_tokens, 10);
  EXPECT_LT(drafted->stats().spec_accepted_tokens, drafted->stats().spec_draft_tokens);
  // Prompt and 80 of its tokens: 180 tokens, 5 full blocks of 32 cached.
  std::vector<int32_t> longer(recorded.begin(), recorded.begin() + 180);
  const GenRun from_drafted = generate(*drafted, longer, 6);
  const GenRun from_plain = generate(*plain, longer, 6);
  EXPECT_EQ(from_drafted.cached, 160);
  EXPECT_EQ(from_plain.cached, 160);
  EXPECT_EQ(from_drafted.tokens, from_plain.tokens);
  EXPECT_EQ(from_drafted.logprobs, from_plain.logprobs) << "cached k4c blocks must be bit-identical";
  fs::remove(replay);
}

}  // namespace
}  // namespace rill
