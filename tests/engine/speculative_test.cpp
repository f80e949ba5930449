// Speculative decoding (engine/speculator.h): the n-gram speculator's
// proposals; on the fake model (whose KV checks catch a stale or missing
// slot) greedy and seeded output identical with and without speculation,
// speculating and opted-out rows in one batch, the prefix cache after
// rejections equal to a cold run's; a chi-square test that the verified
// tokens keep the target's distribution (a fixed synthetic distribution and
// the real Sampler); and greedy / seeded identity on the default model with
// an edit workload, where most drafts hold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "../text/tokenizer_test_util.h"
#include "engine/speculator.h"
#include "fake_model.h"
#include "golden_util.h"
#include "model/kv_spec.h"
#include "rill/engine.h"
#include "text/grammar/grammar_cache.h"
#include "text/grammar/json_schema_grammar.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

std::vector<int32_t> propose(NgramSpeculator& s, const std::vector<int32_t>& tokens, int32_t k) {
  std::vector<int32_t> out;
  s.propose(0, tokens, k, out);
  return out;
}

TEST(NgramSpeculator, ProposesWhatFollowedTheLatestLongestMatch) {
  NgramSpeculator s;
  // Tail 7 8 9 occurred at 1..3 (followed by 4 5) and 6 8 9 is no match:
  // the 3-gram wins over the later 1-gram 9.
  EXPECT_EQ(propose(s, {0, 7, 8, 9, 4, 5, 6, 9, 1, 7, 8, 9}, 2), (std::vector<int32_t>{4, 5}));
  // The latest occurrence: 1 2 followed by 3 first, later by 5.
  EXPECT_EQ(propose(s, {1, 2, 3, 1, 2, 5, 9, 1, 2}, 1), (std::vector<int32_t>{5}));
  // Only a 1-gram matches (n from 3 down to 1).
  EXPECT_EQ(propose(s, {4, 6, 0, 2, 4}, 3), (std::vector<int32_t>{6, 0, 2}));
  // The continuation stops at the end of what exists.
  EXPECT_EQ(propose(s, {5, 5}, 4), (std::vector<int32_t>{5}));
  // No earlier occurrence: nothing.
  EXPECT_TRUE(propose(s, {1, 2, 3, 4}, 4).empty());
  EXPECT_TRUE(propose(s, {1}, 4).empty());
}

TEST(MakeSpeculator, NamesWhatItAccepts) {
  auto off = make_speculator("off");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off.value(), nullptr);
  auto ngram = make_speculator("ngram");
  ASSERT_TRUE(ngram.ok());
  EXPECT_STREQ(ngram.value()->name(), "ngram");
  auto draft = make_speculator("draft=models/x.gguf");  // no target model
  ASSERT_FALSE(draft.ok());
  EXPECT_NE(draft.error().message.find("target"), std::string::npos);
  auto mtp = make_speculator("mtp");  // no target model
  ASSERT_FALSE(mtp.ok());
  EXPECT_NE(mtp.error().message.find("target"), std::string::npos);
  auto bad = make_speculator("eagle");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("eagle"), std::string::npos);
}

// The fake model's logits depend on the whole context, so its greedy
// continuation of a prompt that repeats a pattern soon repeats itself too
// (a cycle of the hash); the n-gram speculator then drafts it.
std::unique_ptr<Engine> fake_engine(const std::string& spec, testing::FakeModel** model = nullptr,
                                    int32_t n_vocab = 8) {
  testing::FakeModel::Options mo;
  mo.n_vocab = n_vocab;  // small: contexts repeat, so drafts hold often
  mo.block_size = 4;
  mo.n_blocks = 256;
  mo.max_batch_tokens = 64;
  mo.max_batch_seqs = 64;
  auto m = std::make_unique<testing::FakeModel>(mo);
  if (model) *model = m.get();
  EngineOptions o;
  o.max_batch_tokens = 64;
  o.max_running = 8;
  o.check_integrity = true;
  o.spec = spec;
  o.spec_tokens = 4;
  auto e = Engine::create(std::move(m), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return std::move(e).value();
}

std::vector<std::vector<int32_t>> fake_prompts() {
  std::vector<std::vector<int32_t>> p;
  for (int32_t i = 0; i < 8; ++i) {
    std::vector<int32_t> t;
    for (int32_t j = 0; j < 6 + i; ++j) t.push_back((j * (i + 1)) % 5);
    p.push_back(t);
  }
  return p;
}

TEST(SpeculativeEngine, FakeModelOutputIsTheSameWithAndWithout) {
  auto off = fake_engine("off");
  auto on = fake_engine("ngram");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.7f;
  seeded.seed = 5;
  seeded.top_k = 5;
  const auto prompts = fake_prompts();
  for (const SamplingParams& s : {greedy, seeded}) {
    const auto want = test::generate_all(*off, prompts, s, false, 1, 40);
    const auto alone = test::generate_all(*on, prompts, s, false, 1, 40);
    const auto batched = test::generate_all(*on, prompts, s, true, 2, 40);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(want[i].size(), 40u);
      EXPECT_EQ(alone[i], want[i]) << "prompt " << i << ", temperature " << s.temperature;
      EXPECT_EQ(batched[i], want[i]) << "prompt " << i << " batched, temperature " << s.temperature;
    }
  }
  const EngineStats st = on->stats();
  EXPECT_EQ(st.speculator, "ngram");
  EXPECT_GT(st.spec_draft_tokens, 100);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);  // rejections happened (and were rolled back)
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
  EXPECT_EQ(off->stats().spec_draft_tokens, 0);
  EXPECT_EQ(off->stats().speculator, "");
}

// Half the rows opt out ("speculative": false) in the same batch: every
// row's tokens are its tokens alone, and the opted-out rows draft nothing.
TEST(SpeculativeEngine, SpeculatingAndOptedOutRowsShareABatch) {
  auto on = fake_engine("ngram");
  const auto prompts = fake_prompts();
  auto run = [&](bool concurrent, uint64_t ns) {
    std::vector<std::vector<int32_t>> out(prompts.size());
    std::vector<Usage> usage(prompts.size());
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 32;
      r.ignore_eos = true;
      r.sampling.temperature = 0.0f;
      r.cache_namespace = ns;
      r.speculative = i % 2 == 0;
      auto h = on->submit(std::move(r));
      EXPECT_TRUE(h.ok());
      hs.push_back(std::move(h).value());
      if (!concurrent) {
        GenerationEvent ev;
        while (hs.back().next(ev)) {
          out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
          if (ev.finished) usage[i] = ev.usage;
        }
      }
    }
    if (concurrent) {
      for (size_t i = 0; i < prompts.size(); ++i) {
        GenerationEvent ev;
        while (hs[i].next(ev)) {
          out[i].insert(out[i].end(), ev.token_ids.begin(), ev.token_ids.end());
          if (ev.finished) usage[i] = ev.usage;
        }
      }
    }
    return std::make_pair(out, usage);
  };
  const auto [alone, alone_usage] = run(false, 1);
  const auto [batched, usage] = run(true, 2);
  int32_t drafted = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(batched[i], alone[i]) << "prompt " << i;
    if (i % 2 == 1) {
      EXPECT_EQ(usage[i].draft_tokens, 0) << "prompt " << i << " opted out";
    } else {
      drafted += usage[i].draft_tokens;
      EXPECT_LE(usage[i].accepted_draft_tokens, usage[i].draft_tokens);
    }
    EXPECT_EQ(usage[i].completion_tokens, 32);
  }
  EXPECT_GT(drafted, 0);
  EXPECT_EQ(on->stats().integrity_errors, 0) << on->stats().last_integrity_error;
}

// After speculating requests finish (with rejected drafts rolled back), the
// prefix cache holds what a run without speculation leaves: the same number
// of cached blocks, and a request continuing each conversation matches the
// same prefix and continues the same way.
TEST(SpeculativeEngine, PrefixCacheAfterRejectionsEqualsTheColdState) {
  auto off = fake_engine("off");
  auto on = fake_engine("ngram");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const auto prompts = fake_prompts();
  const auto a = test::generate_all(*off, prompts, greedy, false, 1, 37);
  const auto b = test::generate_all(*on, prompts, greedy, false, 1, 37);
  ASSERT_EQ(a, b);
  ASSERT_GT(on->stats().spec_draft_tokens - on->stats().spec_accepted_tokens, 0) << "no draft was rejected";
  EXPECT_EQ(on->stats().kv_blocks_cached, off->stats().kv_blocks_cached);
  EXPECT_EQ(on->stats().kv_blocks_used, 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> next = prompts[i];
    next.insert(next.end(), a[i].begin(), a[i].end());
    auto continue_on = [&](Engine& e) {
      GenerationRequest r;
      r.prompt = next;
      r.max_tokens = 8;
      r.ignore_eos = true;
      r.sampling.temperature = 0.0f;
      r.cache_namespace = 1;
      r.speculative = false;
      auto h = e.submit(std::move(r));
      EXPECT_TRUE(h.ok());
      std::pair<std::vector<int32_t>, int32_t> out;
      GenerationEvent ev;
      while (h.value().next(ev)) {
        out.first.insert(out.first.end(), ev.token_ids.begin(), ev.token_ids.end());
        if (ev.finished) out.second = ev.usage.cached_tokens;
      }
      return out;
    };
    const auto cold = continue_on(*off);
    const auto warm = continue_on(*on);
    EXPECT_EQ(warm.second, cold.second) << "prompt " << i << ": cached tokens";
    EXPECT_GT(warm.second, 0) << "prompt " << i;
    EXPECT_EQ(warm.first, cold.first) << "prompt " << i;
  }
  EXPECT_EQ(on->stats().integrity_errors, 0) << on->stats().last_integrity_error;
}

// Grammars roll back with the tokens: a JSON-schema-constrained request on
// a fake model over SmolLM2's vocabulary (pseudo-random logits, so the
// output comes from the masks) gives the same tokens with and without
// speculation, greedy and seeded; drafts the grammar forbids are rejected,
// and the matcher advances over accepted tokens only.
TEST(SpeculativeEngine, GrammarOutputIsTheSameWithAndWithout) {
  const Tokenizer* tok = testing::load_tokenizer("smollm2");
  if (tok == nullptr) GTEST_SKIP() << "SmolLM2 model file missing";
  std::shared_ptr<const Tokenizer> shared(tok, [](const Tokenizer*) {});
  auto make = [&](const std::string& spec) {
    auto model = std::make_unique<testing::FakeModel>(testing::FakeModel::Options{.n_vocab = tok->n_vocab(),
                                                                                  .n_ctx = 512,
                                                                                  .block_size = 16,
                                                                                  .n_blocks = 256,
                                                                                  .max_batch_tokens = 256,
                                                                                  .max_batch_seqs = 64});
    EngineOptions eo;
    eo.check_integrity = true;
    eo.max_running = 8;
    eo.spec = spec;
    eo.spec_tokens = 4;
    auto e = Engine::create(std::move(model), shared, eo);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return std::move(e).value();
  };
  auto on = make("ngram");
  auto off = make("off");
  auto gbnf = grammar::json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
    "items": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 6, "maxItems": 6}},
    "required": ["items"], "additionalProperties": false})"));
  ASSERT_TRUE(gbnf.ok()) << gbnf.error().message;
  auto g = grammar::GrammarCache::shared().get(*gbnf);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto run = [&](Engine& e, float temperature, uint64_t seed) {
    GenerationRequest r;
    r.prompt = tok->encode("Answer: \"red\", \"green\", \"blue\", \"red\", \"green\"", false, false);
    r.max_tokens = 120;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.grammar = *g;
    std::pair<std::vector<int32_t>, std::string> out;
    auto h = e.submit(std::move(r));
    EXPECT_TRUE(h.ok());
    GenerationEvent ev;
    while (h.value().next(ev)) {
      out.first.insert(out.first.end(), ev.token_ids.begin(), ev.token_ids.end());
      out.second += ev.text;
      EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
    }
    return out;
  };
  for (float temperature : {0.0f, 1.0f}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      const auto a = run(*on, temperature, seed);
      const auto b = run(*off, temperature, seed);
      EXPECT_EQ(a.first, b.first) << "temperature " << temperature << " seed " << seed << ": " << a.second;
      EXPECT_TRUE(nlohmann::json::accept(a.second)) << a.second;
    }
  }
  const EngineStats st = on->stats();
  EXPECT_GT(st.spec_draft_tokens, 0);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
  std::printf("grammar: %lld draft tokens verified, %lld accepted\n", static_cast<long long>(st.spec_draft_tokens),
              static_cast<long long>(st.spec_accepted_tokens));
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

// A model whose every logit row is log(p) for a fixed p: each output token
// is an independent draw of p, whatever the context.
class FixedDistributionModel final : public Model {
 public:
  explicit FixedDistributionModel(std::vector<double> p) : spec_{full()} {
    for (double x : p) logits_.push_back(static_cast<float>(std::log(x)));
    cfg_.n_vocab = static_cast<int64_t>(logits_.size());
  }
  const ModelConfig& config() const override { return cfg_; }
  int64_t n_vocab() const override { return static_cast<int64_t>(logits_.size()); }
  int64_t n_ctx() const override { return 256; }
  int max_batch_tokens() const override { return 256; }
  int max_batch_seqs() const override { return 256; }
  const KvSpec& kv_spec() const override { return spec_; }
  int32_t kv_block_size() const override { return 4; }
  int32_t n_kv_blocks() const override { return 1024; }
  size_t kv_bytes_per_token() const override { return 8; }
  Status forward(const Batch& batch, float* logits) override {
    for (size_t r = 0; r < batch.sample_rows.size(); ++r) {
      std::copy(logits_.begin(), logits_.end(), logits + r * logits_.size());
    }
    return Status::Ok();
  }

 private:
  ModelConfig cfg_;
  KvSpec spec_;
  std::vector<float> logits_;
};

// Speculative sampling keeps the target's distribution: the prompt makes
// the n-gram speculator draft token 0 (then whatever repeats), each draft
// holds with probability p(draft), and over all output tokens of many
// seeded requests the counts fit p (chi-square, 7 degrees of freedom, the
// 0.1% critical value 24.32; the seeds are fixed, so the test is
// deterministic). Each request's tokens also equal its tokens without
// speculation (the same seeded draws).
TEST(SpeculativeEngine, SamplingKeepsTheTargetDistribution) {
  const std::vector<double> p = {0.35, 0.2, 0.15, 0.1, 0.08, 0.06, 0.04, 0.02};
  auto make = [&](const std::string& spec) {
    EngineOptions o;
    o.max_batch_tokens = 256;
    o.max_running = 32;
    o.spec = spec;
    o.spec_tokens = 4;
    auto e = Engine::create(std::make_unique<FixedDistributionModel>(p), nullptr, o);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return std::move(e).value();
  };
  auto on = make("ngram");
  auto off = make("off");
  std::vector<std::vector<int32_t>> prompts(200, std::vector<int32_t>{0, 0, 0, 0});
  std::vector<int64_t> counts(p.size(), 0);
  int64_t n = 0;
  for (uint64_t batch = 0; batch < 4; ++batch) {
    SamplingParams s;
    s.temperature = 1.0f;
    s.seed = 1000 * batch;  // generate_all gives every prompt the same seed: vary it by namespace and prompt below
    std::vector<std::vector<int32_t>> ps(prompts.begin(), prompts.begin() + 50);
    for (size_t i = 0; i < ps.size(); ++i) ps[i].push_back(static_cast<int32_t>(i % 8));  // distinct contexts
    std::vector<std::vector<int32_t>> with, without;
    for (size_t i = 0; i < ps.size(); ++i) {
      SamplingParams si = s;
      si.seed = 1000 * batch + i;
      with.push_back(test::generate_all(*on, {ps[i]}, si, false, batch + 1, 24)[0]);
      without.push_back(test::generate_all(*off, {ps[i]}, si, false, batch + 1, 24)[0]);
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(with[i], without[i]) << "batch " << batch << " request " << i;
      for (int32_t t : with[i]) {
        ASSERT_GE(t, 0);
        ASSERT_LT(t, static_cast<int32_t>(p.size()));
        ++counts[static_cast<size_t>(t)];
        ++n;
      }
    }
  }
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] * static_cast<double>(n);
    chi2 += (static_cast<double>(counts[i]) - expected) * (static_cast<double>(counts[i]) - expected) / expected;
  }
  EXPECT_LT(chi2, 24.32) << "n = " << n;
  const EngineStats st = on->stats();
  ASSERT_GT(st.spec_draft_tokens, 1000);
  // A draft d holds with probability p(d): the rate lies between the
  // smallest and the largest p (drafts are mostly the frequent tokens).
  const double rate = static_cast<double>(st.spec_accepted_tokens) / static_cast<double>(st.spec_draft_tokens);
  EXPECT_GT(rate, 0.1);
  EXPECT_LT(rate, 0.35 + 0.05);
}

// The default model (real weights) on an edit workload: the output copies
// most of the prompt, so most drafts hold; greedy and seeded output are the
// same with and without speculation, alone and batched.
const std::string kModel = std::string(RILL_MODEL_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(SpeculativeEngine, DefaultModelEditOutputIsTheSameWithAndWithout) {
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not found (run scripts/setup.sh)";
  auto load = [](const std::string& spec) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.max_batch_tokens = 96;
    o.max_running = 4;
    o.kv_cache_mb = 64;
    o.check_integrity = true;
    o.spec = spec;
    o.spec_tokens = 6;
    auto e = Engine::load(kModel, o);
    EXPECT_TRUE(e.ok()) << e.error().message;
    return std::move(e).value();
  };
  auto off = load("off");
  auto on = load("ngram");
  const char* const texts[] = {
      "Rewrite the text, replacing 'cat' with 'dog'.\nText: The cat sat on the mat. The cat was happy and the cat "
      "purred.\nRewritten: The dog",
      "Copy the code exactly.\ndef add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\nCopy:\ndef add(",
      "The capital of France is",
  };
  std::vector<std::vector<int32_t>> prompts;
  for (const char* t : texts) prompts.push_back(on->tokenizer()->encode(t, true, false));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams seeded;
  seeded.temperature = 0.7f;
  seeded.seed = 3;
  for (const SamplingParams& s : {greedy, seeded}) {
    const auto want = test::generate_all(*off, prompts, s, false, 1, 32);
    const auto got = test::generate_all(*on, prompts, s, true, 1, 32);
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(want[i].size(), 32u);
      EXPECT_EQ(got[i], want[i]) << "prompt " << i << ", temperature " << s.temperature;
    }
  }
  const EngineStats st = on->stats();
  EXPECT_GT(st.spec_accepted_tokens, 20);
  EXPECT_EQ(st.integrity_errors, 0) << st.last_integrity_error;
}

}  // namespace
}  // namespace rill
