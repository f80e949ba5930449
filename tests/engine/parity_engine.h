#pragma once
// What engine-level tests share: a greedy or seeded request with top-5
// logprobs and what it returned (ids, logprobs, usage; also the KV tiers'
// tests, CPU and CUDA), and for the MiniCPM3, MLA and hybrid parity tests
// one engine with chunked prefill and integrity checks, eight seeded
// prompts, run one at a time or submitted together (batch invariance
// compares the two).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "rill/engine.h"

namespace rill::test {

struct ParityOutput {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;  // the chosen token's and the top-5's, per token
  Usage usage;
};

// Drains h; an error event fails the test.
inline ParityOutput collect_output(RequestHandle& h) {
  ParityOutput out;
  GenerationEvent ev;
  while (h.next(ev)) {
    EXPECT_NE(ev.finish_reason, FinishReason::kError) << ev.error;
    out.ids.insert(out.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    for (const SampledToken& t : ev.logprobs) {
      out.logprobs.push_back(t.logprob);
      for (int i = 0; i < t.n_top; ++i) out.logprobs.push_back(t.top[static_cast<size_t>(i)].logprob);
    }
    if (ev.finished) out.usage = ev.usage;
  }
  return out;
}

// max_tokens tokens (EOS ignored) with the top-5 logprobs in prefix-cache
// namespace ns: greedy, or sampled at temperature 0.9 with seed.
inline GenerationRequest parity_request(std::vector<int32_t> prompt, uint64_t ns, int32_t max_tokens = 12,
                                        std::optional<uint64_t> seed = std::nullopt) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.cache_namespace = ns;
  r.logprobs = 5;
  if (seed) {
    r.sampling.temperature = 0.9f;
    r.sampling.seed = seed;
  } else {
    r.sampling.temperature = 0.0f;
  }
  return r;
}

// A fixture's engine and prompts (derive from it beside ::testing::Test).
class ParityEngine {
 protected:
  // Loads dir: 2 threads, n_ctx, prefill chunks of 13 tokens (batched
  // prompts split at other places than alone), 8 running, integrity checks;
  // prompts of 3..58 tokens with ids 3 + rng() % id_range. A load error
  // fails the test.
  void load_parity_engine(const std::string& dir, int32_t n_ctx, uint32_t id_range) {
    EngineOptions o;
    o.n_threads = 2;
    o.n_ctx = n_ctx;
    o.max_batch_tokens = 13;
    o.max_running = 8;
    o.check_integrity = true;
    auto e = Engine::load(dir, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    engine_ = std::move(e).value();
    std::mt19937 rng(5);
    for (int len : {3, 9, 17, 24, 33, 40, 47, 58}) {
      std::vector<int32_t> p;
      for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(3 + rng() % id_range));
      prompts_.push_back(std::move(p));
    }
  }
  // For TearDown: the engine's integrity checks found nothing.
  void expect_intact() {
    if (engine_) {
      EXPECT_EQ(engine_->stats().integrity_errors, 0) << engine_->stats().last_integrity_error;
    }
  }
  ParityOutput run(GenerationRequest r) {
    auto h = engine_->submit(std::move(r));
    EXPECT_TRUE(h.ok()) << h.error().message;
    return collect_output(*h);
  }
  // Every prompt (prompt i in namespace ns + i), one at a time or all
  // submitted before any is read.
  std::vector<ParityOutput> run_all(uint64_t ns, std::optional<uint64_t> seed, bool concurrent) {
    std::vector<ParityOutput> out;
    if (!concurrent) {
      for (size_t i = 0; i < prompts_.size(); ++i) out.push_back(run(parity_request(prompts_[i], ns + i, 12, seed)));
      return out;
    }
    std::vector<RequestHandle> hs;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      auto h = engine_->submit(parity_request(prompts_[i], ns + i, 12, seed));
      EXPECT_TRUE(h.ok()) << h.error().message;
      hs.push_back(std::move(h).value());
    }
    for (auto& h : hs) out.push_back(collect_output(h));
    return out;
  }

  std::unique_ptr<Engine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
};

}  // namespace rill::test
