// Pipelined decode (engine.cpp run_step): on a model that queues steps
// (StepOverlap), a step of decode rounds only is queued behind the step in
// flight, its tokens read where the model runs from that step's draws, and
// the host commits the step in flight's tokens meanwhile. Checked over
// FakeModel with queue_steps (steps computed when taken, in launch order,
// as a device computes them): the same requests give the same tokens,
// finish reasons and usage as serial steps (EngineOptions::pipelined_decode
// off) and as a model that queues nothing, greedy and seeded, alone and
// batched, with requests ending at different steps by length and by stop
// token; what a request that ended leaves behind (the row of the token
// after its last) never reaches the prefix cache, so later prompts that
// extend its output continue as the model says; steps that cannot be
// chained fall back; a step that fails leaves none of its blocks cached.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fake_model.h"
#include "rill/engine.h"

namespace rill {
namespace {

using testing::FakeModel;

constexpr int32_t kVocab = 96;

struct Outcome {
  std::vector<std::vector<int32_t>> ids;  // per request
  std::vector<FinishReason> reasons;
  std::vector<int32_t> cached;  // usage.cached_tokens
  int64_t steps_pipelined = 0;
  int n_chained = 0;  // FakeModel's chained launches
};

enum class Mode { kNoQueue, kSerial, kPipelined };

struct Runner {
  explicit Runner(Mode mode, bool sample = false, int32_t n_blocks = 512) {
    auto m = std::make_unique<FakeModel>(FakeModel::Options{.n_vocab = kVocab,
                                                            .n_blocks = n_blocks,
                                                            .device_greedy = true,
                                                            .device_sample = sample,
                                                            .queue_steps = mode != Mode::kNoQueue});
    model = m.get();
    EngineOptions eo;
    eo.check_integrity = true;  // the KV structures after every step, a chained step in flight
    eo.pipelined_decode = mode == Mode::kPipelined;
    auto e = Engine::create(std::move(m), nullptr, eo);
    EXPECT_TRUE(e.ok()) << e.error().message;
    engine = std::move(e).value();
  }
  // Submits every request at once and reads them to the end.
  Outcome run(const std::vector<GenerationRequest>& requests) {
    std::vector<RequestHandle> hs;
    for (const GenerationRequest& r : requests) {
      auto h = engine->submit(r);
      EXPECT_TRUE(h.ok()) << h.error().message;
      hs.push_back(std::move(h).value());
    }
    Outcome out;
    for (RequestHandle& h : hs) {
      std::vector<int32_t> ids;
      GenerationEvent ev;
      FinishReason reason = FinishReason::kError;
      int32_t cached = -1;
      while (h.next(ev)) {
        EXPECT_TRUE(ev.error.empty()) << ev.error;
        ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
        if (ev.finished) {
          reason = ev.finish_reason;
          cached = ev.usage.cached_tokens;
          EXPECT_EQ(ev.usage.completion_tokens, static_cast<int32_t>(ids.size()));
        }
      }
      out.ids.push_back(std::move(ids));
      out.reasons.push_back(reason);
      out.cached.push_back(cached);
    }
    out.steps_pipelined = engine->stats().steps_pipelined;
    out.n_chained = model->n_chained();
    EXPECT_EQ(engine->stats().integrity_errors, 0) << engine->stats().last_integrity_error;
    return out;
  }
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine;
};

GenerationRequest request(int32_t salt, int32_t max_tokens) {
  GenerationRequest r;
  for (int32_t i = 0; i < 2 + salt % 7; ++i) r.prompt.push_back((i * 17 + salt * 5 + 3) % kVocab);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;  // greedy unless a test sets it
  return r;
}

// Requests ending at different steps: by length, and by stop tokens that
// FakeModel's pseudo-random argmax meets within a few tokens.
std::vector<GenerationRequest> mixed_batch(bool seeded) {
  std::vector<GenerationRequest> rs;
  for (int32_t i = 0; i < 12; ++i) {
    GenerationRequest r = request(i, 3 + 4 * i);
    if (i % 3 == 1) r.stop_token_ids = {1, 5, 9, 13, 17, 21, 25, 29};
    if (seeded) {
      r.sampling.temperature = 1.5f + 0.25f * static_cast<float>(i % 3);
      r.sampling.seed = 77 + static_cast<uint64_t>(i);
      if (i % 4 == 1) r.sampling.top_k = 6;
      if (i % 4 == 2) r.sampling.top_p = 0.85f;
    }
    rs.push_back(r);
  }
  return rs;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.ids.size(), b.ids.size());
  for (size_t i = 0; i < a.ids.size(); ++i) {
    EXPECT_EQ(a.ids[i], b.ids[i]) << "request " << i;
    EXPECT_EQ(a.reasons[i], b.reasons[i]) << "request " << i;
  }
}

TEST(PipelinedDecode, GreedyBatchGivesTheSerialTokens) {
  const auto rs = mixed_batch(false);
  const Outcome plain = Runner(Mode::kNoQueue).run(rs);
  const Outcome serial = Runner(Mode::kSerial).run(rs);
  const Outcome piped = Runner(Mode::kPipelined).run(rs);
  expect_same(plain, serial);
  expect_same(plain, piped);
  EXPECT_EQ(serial.steps_pipelined, 0);
  EXPECT_EQ(serial.n_chained, 0);
  EXPECT_GT(piped.steps_pipelined, 0) << "no step was chained";
  EXPECT_EQ(piped.steps_pipelined, piped.n_chained);
  int n_stopped = 0;
  for (FinishReason r : piped.reasons) n_stopped += r == FinishReason::kStop;
  EXPECT_GT(n_stopped, 0) << "no request met a stop token: the batch tests only lengths";
}

TEST(PipelinedDecode, SeededBatchAndAloneGiveTheSerialTokens) {
  const auto rs = mixed_batch(true);
  const Outcome serial = Runner(Mode::kSerial, true).run(rs);
  const Outcome piped = Runner(Mode::kPipelined, true).run(rs);
  expect_same(serial, piped);
  EXPECT_GT(piped.steps_pipelined, 0);
  // Alone: a request's stream does not depend on the batch.
  const Outcome alone = Runner(Mode::kPipelined, true).run({rs[11]});
  EXPECT_EQ(alone.ids[0], serial.ids[11]);
  EXPECT_GT(alone.steps_pipelined, 0);
  // The draws were random: some request left its greedy continuation.
  auto greedy = rs;
  for (GenerationRequest& r : greedy) r.sampling.temperature = 0.0f;
  EXPECT_NE(Runner(Mode::kPipelined, true).run(greedy).ids, piped.ids);
}

// A request that ended had a row in the step chained behind its last one;
// its KV blocks go back without that row's token. Later prompts extend the
// outputs (so they reuse the cached blocks, and a block offered with a
// token it does not hold would change their continuation): every one must
// continue as FakeModel::next_token says.
TEST(PipelinedDecode, EndedRequestsLeaveOnlyRealTokensInThePrefixCache) {
  Runner piped(Mode::kPipelined);
  const auto first = mixed_batch(false);
  const Outcome a = piped.run(first);
  std::vector<GenerationRequest> follow;
  std::vector<std::vector<int32_t>> expected;
  for (size_t i = 0; i < first.size(); ++i) {
    GenerationRequest r;
    r.prompt = first[i].prompt;
    r.prompt.insert(r.prompt.end(), a.ids[i].begin(), a.ids[i].end());
    if (i % 2 == 1) r.prompt.push_back(0);  // the placeholder id where the next token was
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    std::vector<int32_t> context = r.prompt, want;
    for (int k = 0; k < r.max_tokens; ++k) {
      want.push_back(FakeModel::next_token(context, kVocab));
      context.push_back(want.back());
    }
    follow.push_back(r);
    expected.push_back(want);
  }
  const Outcome b = piped.run(follow);
  int32_t n_cached = 0;
  for (size_t i = 0; i < follow.size(); ++i) {
    EXPECT_EQ(b.ids[i], expected[i]) << "request " << i;
    n_cached += b.cached[i];
  }
  EXPECT_GT(n_cached, 0) << "no prompt reused a cached block";
}

// A step with a row that needs its logits on the host (logprobs) is not
// chained: alone, such a request runs serial steps only; beside requests
// that chain once it ends, every output is the serial one.
TEST(PipelinedDecode, StepsThatNeedLogitsFallBackToSerial) {
  GenerationRequest lp = request(40, 40);
  lp.logprobs = 1;
  const Outcome alone = Runner(Mode::kPipelined).run({lp});
  EXPECT_EQ(alone.steps_pipelined, 0) << "a step of the logprobs request was chained";
  auto rs = mixed_batch(false);
  rs.insert(rs.begin(), lp);
  const Outcome serial = Runner(Mode::kSerial).run(rs);
  const Outcome piped = Runner(Mode::kPipelined).run(rs);
  expect_same(serial, piped);
  EXPECT_EQ(alone.ids[0], piped.ids[0]);
}

// Blocks run short: the round after the step in flight would preempt, so
// it is not chained; the outputs stay the serial ones.
TEST(PipelinedDecode, APoolTooSmallForTheNextRoundFallsBack) {
  std::vector<GenerationRequest> rs;
  for (int32_t i = 0; i < 6; ++i) rs.push_back(request(i, 24));
  const Outcome serial = Runner(Mode::kSerial, false, 40).run(rs);
  const Outcome piped = Runner(Mode::kPipelined, false, 40).run(rs);
  const Outcome plain = Runner(Mode::kNoQueue, false, 40).run(rs);
  for (size_t i = 0; i < rs.size(); ++i) {
    std::vector<int32_t> context = rs[i].prompt, want;
    for (int k = 0; k < rs[i].max_tokens; ++k) {
      want.push_back(FakeModel::next_token(context, kVocab));
      context.push_back(want.back());
    }
    EXPECT_EQ(plain.ids[i], want) << "plain " << i;
    EXPECT_EQ(serial.ids[i], want) << "serial " << i;
    EXPECT_EQ(piped.ids[i], want) << "piped " << i;
  }
  expect_same(serial, piped);
}

// A step fails on the device with an error the model survives
// (FakeModel::fail_forward_at: nothing written, later steps run) while a
// step is chained behind it. Its tokens counted as computed once that step
// was planned, but no block they fill may reach the prefix cache: a later
// prompt sharing the block would reuse KV that was never written (FakeModel
// reads it back: the step fails, or a real model continues differently).
// The request ends with the error, the cache keeps only the prefill's
// block, and a prompt that extends the request's tokens computes the rest
// and continues as the model says; serial steps, which commit after the
// step, behave the same.
TEST(PipelinedDecode, AFailedStepLeavesNoneOfItsBlocksInThePrefixCache) {
  for (Mode mode : {Mode::kPipelined, Mode::kSerial}) {
    SCOPED_TRACE(mode == Mode::kPipelined ? "pipelined" : "serial");
    Runner runner(mode);
    // 7 prompt tokens in blocks of 4: the prefill (computed step 0) fills
    // block 0, the first decode step (step 1, position 7) fills block 1.
    const GenerationRequest a = request(5, 8);
    ASSERT_EQ(a.prompt.size(), 7u);
    const int32_t first = FakeModel::next_token(a.prompt, kVocab);
    runner.model->fail_forward_at(1);
    auto h = runner.engine->submit(a);
    ASSERT_TRUE(h.ok()) << h.error().message;
    std::vector<int32_t> ids;
    GenerationEvent ev;
    GenerationEvent last;
    while (h->next(ev)) {
      ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) last = ev;
    }
    EXPECT_EQ(ids, std::vector<int32_t>{first});
    EXPECT_EQ(last.finish_reason, FinishReason::kError);
    EXPECT_NE(last.error.find("injected forward failure"), std::string::npos) << last.error;
    if (mode == Mode::kPipelined) {
      EXPECT_EQ(runner.model->n_chained(), 1) << "no step was chained behind step 1";
    }
    EXPECT_EQ(runner.engine->stats().kv_blocks_cached, 1) << "a block of the failed step is cached";

    GenerationRequest b;
    b.prompt = a.prompt;
    b.prompt.push_back(first);  // block 1's tokens, and one more
    b.prompt.push_back(3);
    b.max_tokens = 5;
    b.ignore_eos = true;
    b.sampling.temperature = 0.0f;
    std::vector<int32_t> context = b.prompt, want;
    for (int k = 0; k < b.max_tokens; ++k) {
      want.push_back(FakeModel::next_token(context, kVocab));
      context.push_back(want.back());
    }
    const Outcome o = runner.run({b});
    EXPECT_EQ(o.ids[0], want);
    EXPECT_EQ(o.reasons[0], FinishReason::kLength);
    EXPECT_EQ(o.cached[0], 4) << "b reused more than the prefill's block";
  }
}

}  // namespace
}  // namespace rill
