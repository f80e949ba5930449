// The CUDA sampler (backend/cuda/sampling.h) held to the host Sampler:
//  - kept sets: on random rows (vocabularies of 128256, 32000, 1000 and 7;
//    LLM-like spreads and rows full of ties) the device's kept-set bound
//    equals Sampler::kept_bound for top-k, top-p, min-p and all together,
//    and the probabilities it writes equal the host's bit for bit;
//  - draws: every row's id equals Sampler::reference_draw's for the same
//    (seed, counter), and argmax rows give the host argmax;
//  - distribution: 20,000 draws from a 16-token row match the host's
//    filtered softmax (chi-square under its 1e-6 critical value) and never
//    leave the kept set;
//  - determinism and batch invariance: a row's id and bound are the same
//    alone and at rows 0, 31 and 63 of a batch of 64 with other parameters;
//  - the engine on the tiny HF llama (f32) on CUDA: a seeded request gives
//    the same tokens alone, among 16 concurrent requests (one with
//    logprobs, so some steps sample on the host), and on the CPU engine;
//  - token masks (constrained decoding): masked and unmasked rows of one
//    batch, greedy and seeded, masks of one token, of a few tokens below
//    the row's best and of all but the best, vocabularies that are and are
//    not multiples of 32: every id equals the host Sampler's under the
//    same mask (Sampler::reference_draw), kept sets and probabilities as
//    the host's; and the model's forward_greedy / forward_sample with a
//    step's masks give the host's draws from forward()'s logits; on the
//    default model (batch-invariant, so a row's logits do not depend on
//    the path), constrained requests give the same tokens drawn on the
//    device as sampled on the host.
// Skipped without a CUDA device. DISABLED_KernelTimes prints the kernel's
// time at a 128k vocabulary (run with --gtest_also_run_disabled_tests).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "backend/cuda/ops.h"
#include "backend/cuda/sampling.h"
#include "cuda_test_util.h"
#include "engine/sampler.h"
#include "loader/model_files.h"
#include "model/registry.h"
#include "rill/engine.h"
#include "text/grammar/grammar_cache.h"
#include "text/grammar/json_schema_grammar.h"

namespace rill {
namespace {

using cuda::testing::download;
using cuda::testing::poisoned;
using cuda::testing::upload;

struct DeviceResult {
  std::vector<int32_t> ids;
  std::vector<uint64_t> bounds;
  std::vector<float> probs;  // the rows after the kernel
};

DeviceResult run_sampler(const std::vector<float>& logits, int64_t V, const std::vector<DeviceSamplingParams>& params) {
  const size_t n = params.size();
  auto dl = upload(logits);
  auto dp = upload(params);
  auto di = poisoned(n * sizeof(int32_t));
  auto db = poisoned(n * sizeof(uint64_t));
  cuda::sample_rows(dl.as<float>(), static_cast<int64_t>(n), V, dp.as<DeviceSamplingParams>(), TokenMasks{},
                    di.as<int32_t>(), db.as<uint64_t>(), nullptr);
  return {download<int32_t>(di, n), download<uint64_t>(db, n), download<float>(dl, n * static_cast<size_t>(V))};
}

SamplingParams host_params(const DeviceSamplingParams& d) {
  SamplingParams p;
  p.temperature = d.temperature;
  p.top_k = d.top_k;
  p.top_p = d.top_p;
  p.min_p = d.min_p;
  p.seed = d.seed;
  return p;
}

// Logits like a language model's: a normal bulk and a few strong tokens;
// `ties`: rounded to multiples of 0.5, so many probabilities are equal.
std::vector<float> llm_row(int64_t V, std::mt19937& rng, bool ties) {
  std::normal_distribution<float> bulk(0.0f, 2.5f);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = bulk(rng);
  for (int i = 0; i < 20; ++i) l[rng() % static_cast<size_t>(V)] += 6.0f + static_cast<float>(rng() % 90) * 0.1f;
  if (ties) {
    for (float& x : l) x = std::round(x * 2.0f) * 0.5f;
  }
  return l;
}

std::vector<DeviceSamplingParams> param_set(int64_t V) {
  auto make = [](float t, int32_t k, float p, float m) {
    DeviceSamplingParams d;
    d.temperature = t;
    d.top_k = k;
    d.top_p = p;
    d.min_p = m;
    return d;
  };
  return {make(1.0f, 0, 1.0f, 0.0f),
          make(0.7f, 50, 1.0f, 0.0f),
          make(0.8f, 0, 0.9f, 0.0f),
          make(1.0f, 0, 1.0f, 0.05f),
          make(0.6f, 40, 0.95f, 0.02f),
          make(1.3f, 1000, 0.99f, 0.0f),
          make(0.0f, 0, 1.0f, 0.0f),
          make(0.9f, 1, 1.0f, 0.0f),
          make(1.0f, 0, 0.0f, 0.0f),
          make(1.0f, 0, 1.0f, 1.5f),
          make(2.0f, static_cast<int32_t>(V - 1), 0.5f, 0.0f),
          make(1e-3f, 0, 0.9f, 0.0f),
          make(5.0f, 3, 1.0f, 0.0f),
          make(0.5f, 0, 0.3f, 0.2f)};
}

TEST(CudaSampling, KeptSetsProbabilitiesAndDrawsMatchTheHost) {
  RILL_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (int64_t V : {int64_t{128256}, int64_t{32000}, int64_t{1000}, int64_t{7}}) {
    const auto set = param_set(V);
    std::vector<DeviceSamplingParams> params;
    std::vector<float> logits;
    for (size_t r = 0; r < 2 * set.size(); ++r) {
      DeviceSamplingParams d = set[r % set.size()];
      d.seed = rng();
      d.counter = rng() % 1000;
      params.push_back(d);
      const auto row = llm_row(V, rng, r >= set.size());
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const DeviceResult got = run_sampler(logits, V, params);
    int n_id_mismatch = 0;
    for (size_t r = 0; r < params.size(); ++r) {
      const DeviceSamplingParams& d = params[r];
      const float* l = logits.data() + r * static_cast<size_t>(V);
      const std::string what = "V " + std::to_string(V) + " row " + std::to_string(r) + " (T " +
                               std::to_string(d.temperature) + ", k " + std::to_string(d.top_k) + ", p " +
                               std::to_string(d.top_p) + ", min_p " + std::to_string(d.min_p) + ")";
      if (sampling_is_argmax(d.temperature, d.top_k)) {
        EXPECT_EQ(got.ids[r], argmax(l, V)) << what;
        EXPECT_EQ(got.bounds[r], ~uint64_t{0}) << what;
        continue;
      }
      Sampler host(host_params(d), V);
      EXPECT_EQ(got.bounds[r], host.kept_bound(l)) << what;
      const float mx = *std::max_element(l, l + V);
      const float inv_t = 1.0f / d.temperature;
      int64_t n_prob_diff = 0;
      for (int64_t i = 0; i < V; ++i) {
        const float want = sampling_prob(l[i], mx, inv_t);
        n_prob_diff += std::memcmp(&want, &got.probs[r * static_cast<size_t>(V) + static_cast<size_t>(i)], 4) != 0;
      }
      EXPECT_EQ(n_prob_diff, 0) << what << ": probabilities differ from the host's";
      const int32_t want_id = Sampler::reference_draw(d, l, V);
      n_id_mismatch += got.ids[r] != want_id;
      EXPECT_EQ(got.ids[r], want_id) << what;
    }
    std::printf("[ cuda sampling ] V %lld: %zu rows, kept sets and probabilities as the host's, %d id mismatches\n",
                static_cast<long long>(V), params.size(), n_id_mismatch);
  }
}

// Wilson-Hilferty: the chi-square quantile of `df` degrees of freedom at
// standard-normal quantile z (z = 4.75: upper tail 1e-6).
double chi2_critical(int df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

TEST(CudaSampling, DrawsFollowTheFilteredSoftmax) {
  RILL_REQUIRE_GPU();
  const int64_t V = 16;
  std::vector<float> row(V);
  for (int64_t i = 0; i < V; ++i) row[static_cast<size_t>(i)] = 0.37f * i - 0.025f * i * i + (i % 3 == 0 ? 0.4f : 0.0f);
  struct Case {
    float t;
    int32_t k;
    float p, m;
  };
  for (const Case& c : {Case{1.0f, 0, 1.0f, 0.0f}, Case{0.9f, 12, 0.95f, 0.03f}, Case{1.5f, 6, 1.0f, 0.0f},
                        Case{0.8f, 0, 0.7f, 0.0f}, Case{1.2f, 0, 1.0f, 0.1f}}) {
    const int n = 20000;
    std::vector<DeviceSamplingParams> params(n);
    std::vector<float> logits;
    for (int i = 0; i < n; ++i) {
      params[static_cast<size_t>(i)] = {c.t, c.k, c.p, c.m, 12345, static_cast<uint64_t>(i)};
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const DeviceResult got = run_sampler(logits, V, params);
    // Expected: the host's kept set, each token with p_i / (kept mass).
    Sampler host(host_params(params[0]), V);
    const uint64_t bound = host.kept_bound(row.data());
    const float mx = *std::max_element(row.begin(), row.end());
    std::vector<double> prob(V, 0.0);
    double kept = 0;
    for (int64_t i = 0; i < V; ++i) {
      const float p = sampling_prob(row[static_cast<size_t>(i)], mx, 1.0f / c.t);
      if (sampling_key(p, static_cast<int32_t>(i)) >= bound) prob[static_cast<size_t>(i)] = p, kept += p;
    }
    std::vector<int> count(V, 0);
    int outside = 0, n_id_mismatch = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t id = got.ids[static_cast<size_t>(i)];
      ASSERT_TRUE(id >= 0 && id < V) << id;
      ++count[static_cast<size_t>(id)];
      outside += prob[static_cast<size_t>(id)] == 0.0;
      if (i < 2000) n_id_mismatch += id != Sampler::reference_draw(params[static_cast<size_t>(i)], row.data(), V);
    }
    double chi2 = 0;
    int df = -1;
    for (int64_t i = 0; i < V; ++i) {
      if (prob[static_cast<size_t>(i)] == 0.0) continue;
      const double e = n * prob[static_cast<size_t>(i)] / kept;
      chi2 += (count[static_cast<size_t>(i)] - e) * (count[static_cast<size_t>(i)] - e) / e;
      ++df;
    }
    EXPECT_EQ(outside, 0) << "draws outside the kept set";
    EXPECT_EQ(n_id_mismatch, 0) << "first 2000 draws vs the host's";
    if (df > 0) {
      EXPECT_LT(chi2, chi2_critical(df, 4.75)) << "T " << c.t << " k " << c.k << " p " << c.p;
    }
    std::printf("[ cuda sampling ] T %.2f k %d p %.2f min_p %.2f: %d kept, chi2 %.2f (df %d, 1e-6 critical %.1f)\n",
                c.t, c.k, c.p, c.m, df + 1, chi2, df, df > 0 ? chi2_critical(df, 4.75) : 0.0);
  }
}

TEST(CudaSampling, ARowGivesTheSameIdAloneAndAnywhereInABatch) {
  RILL_REQUIRE_GPU();
  const int64_t V = 128256;
  std::mt19937 rng(3);
  const auto target = llm_row(V, rng, false);
  DeviceSamplingParams tp{0.8f, 0, 0.95f, 0.01f, 7, 3};
  const DeviceResult alone = run_sampler(target, V, {tp});
  const auto set = param_set(V);
  for (int pos : {0, 31, 63}) {
    std::vector<float> logits;
    std::vector<DeviceSamplingParams> params;
    for (int r = 0; r < 64; ++r) {
      if (r == pos) {
        logits.insert(logits.end(), target.begin(), target.end());
        params.push_back(tp);
        continue;
      }
      const auto row = llm_row(V, rng, r % 2 == 1);
      logits.insert(logits.end(), row.begin(), row.end());
      DeviceSamplingParams d = set[static_cast<size_t>(r) % set.size()];
      d.seed = rng();
      d.counter = static_cast<uint64_t>(r);
      params.push_back(d);
    }
    const DeviceResult batch = run_sampler(logits, V, params);
    EXPECT_EQ(batch.ids[static_cast<size_t>(pos)], alone.ids[0]) << "row " << pos;
    EXPECT_EQ(batch.bounds[static_cast<size_t>(pos)], alone.bounds[0]) << "row " << pos;
  }
  EXPECT_EQ(run_sampler(target, V, {tp}).ids[0], alone.ids[0]) << "a second run differs";
  EXPECT_EQ(alone.ids[0], Sampler::reference_draw(tp, target.data(), V));
}

std::string goldens_dir() {
  const char* env = std::getenv("RILL_SHARED_DIR");
  return std::string(env ? env : RILL_SHARED_DIR) + "/goldens/hf/llama";
}

// Runs `requests` at once on a fresh engine over the tiny llama; returns each one's tokens.
std::vector<std::vector<int32_t>> generate(Device device, const std::vector<GenerationRequest>& requests,
                                           bool* device_sampling) {
  auto files = open_model_files(goldens_dir());
  EXPECT_TRUE(files.ok()) << files.error().message;
  if (!files.ok()) return {};
  ModelOptions o;
  o.device = device;
  o.n_threads = 2;
  o.n_ctx = 256;
  o.max_batch_tokens = 128;
  o.n_kv_slots = 18;
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, o);
  EXPECT_TRUE(model.ok()) << model.error().message;
  if (!model.ok()) return {};
  if (device_sampling) *device_sampling = (*model)->has_forward_sample();
  auto engine = Engine::create(std::move(model).value(), nullptr, EngineOptions{});
  EXPECT_TRUE(engine.ok()) << engine.error().message;
  std::vector<RequestHandle> hs;
  for (const GenerationRequest& r : requests) {
    auto h = (*engine)->submit(r);
    EXPECT_TRUE(h.ok()) << h.error().message;
    hs.push_back(std::move(h).value());
  }
  std::vector<std::vector<int32_t>> out;
  for (RequestHandle& h : hs) {
    std::vector<int32_t> ids;
    GenerationEvent ev;
    while (h.next(ev)) {
      EXPECT_TRUE(ev.error.empty()) << ev.error;
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    }
    out.push_back(std::move(ids));
  }
  return out;
}

TEST(CudaSampling, EngineSeededTokensAreTheSameAloneAmongSixteenAndOnTheCpu) {
  RILL_REQUIRE_GPU();
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r;
    for (int t = 0; t < 12 + 3 * i; ++t) r.prompt.push_back((t * 37 + i * 101 + 5) % 512);
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = 0.8f + 0.05f * static_cast<float>(i % 5);
    r.sampling.top_p = i % 2 ? 0.95f : 1.0f;
    r.sampling.top_k = i % 3 == 0 ? 40 : 0;
    r.sampling.min_p = i % 4 == 1 ? 0.02f : 0.0f;
    r.sampling.seed = 42 + static_cast<uint64_t>(i);
    if (i == 5) r.logprobs = 2;  // its steps sample on the host
    if (i == 5) r.max_tokens = 10;
    rs.push_back(r);
  }
  bool device_sampling = false;
  const auto alone = generate(Device::kCuda, {rs[0]}, &device_sampling);
  EXPECT_TRUE(device_sampling);
  const auto crowd = generate(Device::kCuda, rs, nullptr);
  const auto cpu = generate(Device::kCpu, {rs[0], rs[1]}, nullptr);
  ASSERT_EQ(alone.size(), 1u);
  ASSERT_EQ(crowd.size(), 16u);
  ASSERT_EQ(cpu.size(), 2u);
  EXPECT_EQ(alone[0].size(), 24u);
  EXPECT_EQ(alone[0], crowd[0]) << "request 0 alone vs among 16";
  EXPECT_EQ(alone[0], cpu[0]) << "request 0 on CUDA vs on the CPU";
  EXPECT_EQ(crowd[1], cpu[1]) << "request 1 among 16 on CUDA vs on the CPU";
  EXPECT_NE(crowd[0], crowd[2]);
}

// A grammar-like token mask for `row` (TokenMasks words): kind 0, about a
// third of the tokens; 1, one token; 2, a few tokens, none of the row's
// best 20; 3, every token but the row's argmax.
std::vector<uint32_t> make_mask(const std::vector<float>& row, int kind, std::mt19937& rng) {
  const auto V = static_cast<int64_t>(row.size());
  std::vector<uint32_t> m(static_cast<size_t>(token_mask_words(V)), 0);
  auto allow = [&](int64_t t) { m[static_cast<size_t>(t / 32)] |= uint32_t{1} << (t % 32); };
  auto forbid = [&](int64_t t) { m[static_cast<size_t>(t / 32)] &= ~(uint32_t{1} << (t % 32)); };
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  switch (kind) {
    case 0:
      for (int64_t t = 0; t < V; ++t) {
        if (rng() % 3 == 0) allow(t);
      }
      allow(static_cast<int64_t>(rng() % static_cast<uint32_t>(V)));  // never empty
      break;
    case 1:
      allow(static_cast<int64_t>(rng() % static_cast<uint32_t>(V)));
      break;
    case 2: {
      const size_t skip = std::min<size_t>(20, static_cast<size_t>(V) - 1);
      for (int k = 0; k < 5; ++k) allow(order[skip + rng() % (static_cast<size_t>(V) - skip)]);
      break;
    }
    default:
      for (int64_t t = 0; t < V; ++t) allow(t);
      forbid(order[0]);
      break;
  }
  return m;
}

TEST(CudaSampling, MaskedRowsDrawTheHostsTokens) {
  RILL_REQUIRE_GPU();
  std::mt19937 rng(23);
  for (int64_t V : {int64_t{128256}, int64_t{32001}, int64_t{1000}, int64_t{7}}) {
    const auto set = param_set(V);
    const int64_t n_words = token_mask_words(V);
    std::vector<DeviceSamplingParams> params;
    std::vector<float> logits;
    std::vector<int32_t> row_mask;
    std::vector<uint32_t> words;
    int32_t n_masked = 0;
    for (size_t r = 0; r < 3 * set.size(); ++r) {
      DeviceSamplingParams d = set[r % set.size()];
      d.seed = rng();
      d.counter = rng() % 1000;
      params.push_back(d);
      const auto row = llm_row(V, rng, r % 4 == 3);
      logits.insert(logits.end(), row.begin(), row.end());
      if (r % 5 == 4) {  // unmasked rows between masked ones
        row_mask.push_back(-1);
        continue;
      }
      const auto m = make_mask(row, static_cast<int>(r % 4), rng);
      words.insert(words.end(), m.begin(), m.end());
      row_mask.push_back(n_masked++);
    }
    const size_t n = params.size();
    auto dl = upload(logits);
    const auto pristine = upload(logits);
    auto dp = upload(params);
    auto drm = upload(row_mask);
    auto dw = upload(words);
    auto di = poisoned(n * sizeof(int32_t));
    auto db = poisoned(n * sizeof(uint64_t));
    const TokenMasks masks{drm.as<int32_t>(), dw.as<uint32_t>(), n_masked, n_words};
    cuda::sample_rows(dl.as<float>(), static_cast<int64_t>(n), V, dp.as<DeviceSamplingParams>(), masks,
                      di.as<int32_t>(), db.as<uint64_t>(), nullptr);
    const auto ids = download<int32_t>(di, n);
    const auto bounds = download<uint64_t>(db, n);
    const auto probs = download<float>(dl, n * static_cast<size_t>(V));
    // Greedy: no parameters, every row an argmax under its mask.
    auto dg = poisoned(n * sizeof(int32_t));
    cuda::sample_rows(pristine.as<float>(), static_cast<int64_t>(n), V, nullptr, masks, dg.as<int32_t>(), nullptr,
                      nullptr);
    const auto greedy = download<int32_t>(dg, n);
    int n_masked_draws = 0;
    for (size_t r = 0; r < n; ++r) {
      const DeviceSamplingParams& d = params[r];
      const float* l = logits.data() + r * static_cast<size_t>(V);
      const uint32_t* mask = row_mask[r] >= 0 ? words.data() + row_mask[r] * n_words : nullptr;
      const std::string what = "V " + std::to_string(V) + " row " + std::to_string(r) + " mask " +
                               std::to_string(row_mask[r]) + " (T " + std::to_string(d.temperature) + ", k " +
                               std::to_string(d.top_k) + ", p " + std::to_string(d.top_p) + ", min_p " +
                               std::to_string(d.min_p) + ")";
      EXPECT_EQ(ids[r], Sampler::reference_draw(d, l, V, mask)) << what;
      EXPECT_EQ(greedy[r], Sampler::reference_draw(DeviceSamplingParams{.temperature = 0.0f}, l, V, mask)) << what;
      if (!mask) continue;
      EXPECT_TRUE(token_mask_allows(mask, ids[r])) << what;
      EXPECT_TRUE(token_mask_allows(mask, greedy[r])) << what;
      if (sampling_is_argmax(d.temperature, d.top_k)) continue;
      ++n_masked_draws;
      // The masked row as the host Sampler draws from it: -inf outside the mask.
      std::vector<float> masked(l, l + V);
      for (int64_t i = 0; i < V; ++i) {
        if (!token_mask_allows(mask, i)) masked[static_cast<size_t>(i)] = -INFINITY;
      }
      Sampler host(host_params(d), V);
      EXPECT_EQ(bounds[r], host.kept_bound(masked.data())) << what;
      const float mx = *std::max_element(masked.begin(), masked.end());
      int64_t n_prob_diff = 0;
      for (int64_t i = 0; i < V; ++i) {
        const float want = sampling_prob(masked[static_cast<size_t>(i)], mx, 1.0f / d.temperature);
        n_prob_diff += std::memcmp(&want, &probs[r * static_cast<size_t>(V) + static_cast<size_t>(i)], 4) != 0;
      }
      EXPECT_EQ(n_prob_diff, 0) << what << ": probabilities differ from the host's";
    }
    std::printf("[ cuda sampling ] V %lld: %zu rows, %d masked (%d masked draws), ids as the host's\n",
                static_cast<long long>(V), n, n_masked, n_masked_draws);
  }
}

TEST(CudaSampling, ModelDrawsUnderAStepsMasksAsTheHost) {
  RILL_REQUIRE_GPU();
  auto files = open_model_files(goldens_dir());
  ASSERT_TRUE(files.ok()) << files.error().message;
  ModelOptions o;
  o.device = Device::kCuda;
  o.n_ctx = 64;
  o.max_batch_tokens = 64;
  o.n_kv_slots = 6;
  auto created = create_model(builtin_registry(), infer_profile(**files), *files, o);
  ASSERT_TRUE(created.ok()) << created.error().message;
  Model& model = **created;
  ASSERT_TRUE(model.has_forward_greedy() && model.has_forward_sample());
  const int64_t V = model.n_vocab(), n_words = token_mask_words(V);
  // Six sequences' prompts in one step; rows 1, 2, 4 and 5 masked.
  Batch b;
  for (int32_t s = 0; s < 6; ++s) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 3 + 2 * s; ++t) prompt.push_back((t * 29 + s * 71 + 3) % static_cast<int32_t>(V));
    b.add_sequence(prompt.data(), static_cast<int32_t>(prompt.size()), 0, true,
                   slot_block_table(s, o.n_ctx, model.kv_block_size()));
  }
  std::vector<float> logits(6 * static_cast<size_t>(V));
  ASSERT_TRUE(model.forward(b, logits.data()).ok());
  std::mt19937 rng(5);
  const std::vector<int32_t> row_mask = {-1, 0, 1, -1, 2, 3};
  std::vector<uint32_t> words;
  for (size_t r = 0; r < row_mask.size(); ++r) {
    if (row_mask[r] < 0) continue;
    const std::vector<float> l(logits.begin() + static_cast<std::ptrdiff_t>(r) * V,
                               logits.begin() + static_cast<std::ptrdiff_t>(r + 1) * V);
    const auto m = make_mask(l, row_mask[r], rng);  // each kind once
    words.insert(words.end(), m.begin(), m.end());
  }
  const TokenMasks masks{row_mask.data(), words.data(), 4, n_words};
  std::vector<DeviceSamplingParams> params;
  for (int32_t s = 0; s < 6; ++s) {
    params.push_back({s == 3 ? 0.0f : 0.9f, s == 2 ? 20 : 0, s == 4 ? 0.9f : 1.0f, 0.0f, 77u + s, 5u});
  }
  std::vector<int32_t> sampled(6, -1), greedy(6, -1), unmasked(6, -1);
  ASSERT_TRUE(model.forward_sample(b, params.data(), masks, sampled.data()).ok());
  ASSERT_TRUE(model.forward_greedy(b, masks, greedy.data()).ok());
  ASSERT_TRUE(model.forward_greedy(b, TokenMasks{}, unmasked.data()).ok());
  for (size_t r = 0; r < 6; ++r) {
    const float* l = logits.data() + r * static_cast<size_t>(V);
    const uint32_t* mask = row_mask[r] >= 0 ? words.data() + row_mask[r] * n_words : nullptr;
    EXPECT_EQ(sampled[r], Sampler::reference_draw(params[r], l, V, mask)) << "row " << r;
    EXPECT_EQ(greedy[r], Sampler::reference_draw(DeviceSamplingParams{.temperature = 0.0f}, l, V, mask)) << "row " << r;
    EXPECT_EQ(unmasked[r], argmax(l, V)) << "row " << r;
  }
  // A mask naming a row it cannot belong to is refused before the step.
  const std::vector<int32_t> bad = {-1, 0, 1, -1, 2, 4};
  EXPECT_FALSE(model.forward_greedy(b, TokenMasks{bad.data(), words.data(), 4, n_words}, greedy.data()).ok());
  EXPECT_FALSE(model.forward_greedy(b, TokenMasks{row_mask.data(), words.data(), 4, n_words + 1}, greedy.data()).ok());
}

std::shared_ptr<const grammar::CompiledGrammar> compile(const std::string& gbnf) {
  auto g = grammar::GrammarCache::shared().get(gbnf);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? *g : nullptr;
}

struct Finished {
  std::vector<int32_t> ids;
  FinishReason reason = FinishReason::kError;
  std::string error;
};

// Submits every request at once and waits for all.
std::vector<Finished> run_together(Engine& e, const std::vector<GenerationRequest>& requests) {
  std::vector<RequestHandle> hs;
  for (const GenerationRequest& r : requests) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.ok()) << h.error().message;
    if (h.ok()) hs.push_back(std::move(h).value());
  }
  std::vector<Finished> out;
  for (RequestHandle& h : hs) {
    Finished f;
    GenerationEvent ev;
    while (h.next(ev)) {
      f.ids.insert(f.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) f.reason = ev.finish_reason, f.error = ev.error;
    }
    out.push_back(std::move(f));
  }
  return out;
}

TEST(CudaSampling, ConstrainedRequestsDrawOnTheDeviceAsOnTheHost) {
  RILL_REQUIRE_GPU();
  const char* env = std::getenv("RILL_MODEL_DIR");
  const std::string path = std::string(env ? env : RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found";
  EngineOptions o;
  o.device = Device::kCuda;
  o.batch_invariant = true;  // a row's logits do not depend on what shares its step
  o.n_ctx = 256;
  o.max_batch_tokens = 128;
  o.max_running = 8;
  o.kv_cache_mb = 32;
  o.check_integrity = true;
  auto engine = Engine::load(path, o);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  auto schema = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
      "required": ["name", "n", "ok"], "additionalProperties": false})"));
  ASSERT_TRUE(schema.ok()) << schema.error().message;
  auto choice = grammar::choice_gbnf({"yes", "no", "maybe later"});
  ASSERT_TRUE(choice.ok());
  const std::vector<std::shared_ptr<const grammar::CompiledGrammar>> grammars = {
      compile(*schema), compile(grammar::json_object_gbnf()), compile(*choice), nullptr};
  std::vector<GenerationRequest> device;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    for (int t = 0; t < 6 + i; ++t) r.prompt.push_back(1 + (t * 211 + i * 97) % 4000);
    r.max_tokens = 40;
    r.grammar = grammars[static_cast<size_t>(i) % grammars.size()];
    r.sampling.temperature = i < 4 ? 0.0f : 0.9f;  // a greedy set (forward_greedy) and a seeded set
    r.sampling.top_p = i == 5 ? 0.9f : 1.0f;
    r.sampling.top_k = i == 6 ? 30 : 0;
    r.sampling.seed = 300 + static_cast<uint64_t>(i);
    device.push_back(std::move(r));
  }
  // Logprobs keep a request's rows on the host sampler (the token does not
  // depend on them): the host side of the comparison.
  std::vector<GenerationRequest> host = device;
  for (GenerationRequest& r : host) r.logprobs = 0;
  for (size_t half : {size_t{0}, size_t{4}}) {
    const std::vector<GenerationRequest> d(device.begin() + half, device.begin() + half + 4);
    const std::vector<GenerationRequest> h(host.begin() + half, host.begin() + half + 4);
    const auto got = run_together(**engine, d);
    const auto want = run_together(**engine, h);
    ASSERT_EQ(got.size(), 4u);
    ASSERT_EQ(want.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i].ids, want[i].ids) << "request " << half + i;
      EXPECT_EQ(got[i].reason, want[i].reason) << "request " << half + i << ": " << got[i].error;
      EXPECT_NE(want[i].reason, FinishReason::kError) << want[i].error;
      EXPECT_FALSE(got[i].ids.empty());
    }
  }
  EXPECT_EQ((*engine)->stats().integrity_errors, 0) << (*engine)->stats().last_integrity_error;
}

TEST(CudaSampling, DISABLED_KernelTimes) {
  RILL_REQUIRE_GPU();
  const int64_t V = 128256;
  std::mt19937 rng(1);
  const int max_rows = 128;
  std::vector<float> logits;
  for (int r = 0; r < max_rows; ++r) {
    const auto row = llm_row(V, rng, false);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  auto pristine = upload(logits);
  auto work = poisoned(logits.size() * 4);
  auto ids = poisoned(max_rows * 4);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  struct Cfg {
    const char* name;
    DeviceSamplingParams d;
  };
  for (const Cfg& c : {Cfg{"argmax", {0.0f, 0, 1.0f, 0.0f, 1, 0}}, Cfg{"T=0.8", {0.8f, 0, 1.0f, 0.0f, 1, 0}},
                       Cfg{"T=0.8 top_p=0.95", {0.8f, 0, 0.95f, 0.0f, 1, 0}},
                       Cfg{"T=0.7 top_k=50 top_p=0.9", {0.7f, 50, 0.9f, 0.0f, 1, 0}},
                       Cfg{"T=1 min_p=0.05", {1.0f, 0, 1.0f, 0.05f, 1, 0}}}) {
    for (int B : {1, 8, 64, 128}) {
      std::vector<DeviceSamplingParams> params(static_cast<size_t>(B), c.d);
      auto dp = upload(params);
      std::vector<float> t;
      for (int it = 0; it < 25; ++it) {
        RILL_CUDA_CHECK(
            cudaMemcpy(work.data(), pristine.data(), static_cast<size_t>(B * V) * 4, cudaMemcpyDeviceToDevice));
        cudaEventRecord(e0);
        cuda::sample_rows(work.as<float>(), B, V, dp.as<DeviceSamplingParams>(), TokenMasks{}, ids.as<int32_t>(),
                          nullptr, nullptr);
        cudaEventRecord(e1);
        RILL_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (it >= 5) t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      std::printf("[ sample time ] V %lld batch %3d %-26s %8.1f us\n", static_cast<long long>(V), B, c.name,
                  1e3 * t[t.size() / 2]);
    }
  }
  // The greedy kernel for scale.
  for (int B : {1, 64}) {
    std::vector<float> t;
    for (int it = 0; it < 25; ++it) {
      cudaEventRecord(e0);
      cuda::argmax_rows(pristine.as<float>(), B, V, ids.as<int32_t>(), nullptr);
      cudaEventRecord(e1);
      RILL_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (it >= 5) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    std::printf("[ sample time ] V %lld batch %3d %-26s %8.1f us\n", static_cast<long long>(V), B, "argmax_rows",
                1e3 * t[t.size() / 2]);
  }
}

}  // namespace
}  // namespace rill
