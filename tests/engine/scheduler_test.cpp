// Scheduler policy over a real KvManager, with the "model" simulated: a
// step's chunks are marked computed and each sampling chunk appends a token.
// check_integrity() runs after every step.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>

namespace rill {
namespace {

struct Rig {
  Rig(int32_t n_blocks, int32_t block_size, SchedulerOptions o)
      : pool(n_blocks, block_size), tree(pool), states(0, 0), kv({full()}, pool, tree, states), sched(kv, o) {}

  Request* add(std::vector<int32_t> prompt, int32_t max_tokens = 8) {
    auto r = std::make_unique<Request>();
    r->id = r->arrival = next_id++;
    r->tokens = std::move(prompt);
    r->n_prompt = static_cast<int32_t>(r->tokens.size());
    r->params.max_tokens = max_tokens;
    r->ns = 7;
    Request* p = r.get();
    owned.push_back(std::move(r));
    sched.add(p);
    return p;
  }
  // One step: schedule, "compute", sample a token per sampling chunk, finish
  // requests that reached max_tokens. Returns the plan's (id, n_tokens).
  std::vector<std::pair<uint64_t, int32_t>> step() {
    const StepPlan& plan = sched.schedule();
    EXPECT_TRUE(plan.failed.empty());
    std::vector<std::pair<uint64_t, int32_t>> out;
    for (const auto& c : plan.chunks) out.emplace_back(c.request->id, c.n_tokens);
    const std::vector<ScheduledChunk> chunks = plan.chunks;
    EXPECT_TRUE(sched.step_computed().ok());
    for (const auto& c : chunks) {
      if (!c.samples) continue;
      c.request->tokens.push_back(1000 + c.request->n_output());
      if (c.request->n_output() >= c.request->params.max_tokens) {
        sched.remove(c.request);
        c.request->state = RequestState::kFinished;
      }
    }
    Status st = kv.check_integrity();
    EXPECT_TRUE(st.ok()) << st.error().message;
    return out;
  }

  BlockPool pool;
  PrefixTree tree;
  StatePool states;
  KvManager kv;
  Scheduler sched;
  uint64_t next_id = 1;
  std::vector<std::unique_ptr<Request>> owned;
};

std::vector<int32_t> tokens(int32_t n, int32_t first = 0) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(Scheduler, LongPromptIsChunkedUnderTheBudget) {
  Rig rig(64, 4, {16, 8});
  Request* r = rig.add(tokens(40), 2);
  EXPECT_EQ(rig.step(), (std::vector<std::pair<uint64_t, int32_t>>{{r->id, 16}}));
  EXPECT_EQ(rig.step(), (std::vector<std::pair<uint64_t, int32_t>>{{r->id, 16}}));
  EXPECT_EQ(r->n_output(), 0);
  EXPECT_EQ(rig.step(), (std::vector<std::pair<uint64_t, int32_t>>{{r->id, 8}}));
  EXPECT_EQ(r->n_output(), 1);  // the last chunk sampled
  EXPECT_EQ(rig.step(), (std::vector<std::pair<uint64_t, int32_t>>{{r->id, 1}}));
  EXPECT_TRUE(r->finished());
  EXPECT_EQ(rig.pool.n_used(), 0);
}

TEST(Scheduler, DecodeTokensComeFirstAndPrefillTakesTheRestOfTheBudget) {
  Rig rig(128, 4, {16, 8});
  Request* a = rig.add(tokens(3, 100), 50);
  Request* b = rig.add(tokens(3, 200), 50);
  rig.step();  // both prefill (3 + 3 tokens)
  ASSERT_EQ(a->n_output(), 1);
  ASSERT_EQ(b->n_output(), 1);
  Request* big = rig.add(tokens(60, 300), 1);
  // Every step: a and b decode one token each; big gets the other 14.
  for (int i = 0; i < 4; ++i) {
    auto plan = rig.step();
    ASSERT_EQ(plan.size(), 3u);
    EXPECT_EQ(plan[0], (std::pair<uint64_t, int32_t>{a->id, 1}));
    EXPECT_EQ(plan[1], (std::pair<uint64_t, int32_t>{b->id, 1}));
    EXPECT_EQ(plan[2].first, big->id);
    EXPECT_EQ(plan[2].second, i < 4 ? std::min(14, 60 - 14 * i) : 0);
  }
  // The prefilling request being older than a later decoder does not starve it.
  Request* c = rig.add(tokens(2, 400), 50);
  rig.step();
  ASSERT_EQ(c->n_output(), 1);
  auto plan = rig.step();
  EXPECT_NE(std::find(plan.begin(), plan.end(), std::pair<uint64_t, int32_t>{c->id, 1}), plan.end());
}

TEST(Scheduler, RunningLimitAndBudgetBoundAdmission) {
  Rig rig(256, 4, {8, 2});
  Request* a = rig.add(tokens(4, 0), 10);
  Request* b = rig.add(tokens(4, 10), 10);
  Request* c = rig.add(tokens(4, 20), 10);
  auto plan = rig.step();
  ASSERT_EQ(plan.size(), 2u);  // max_running = 2
  EXPECT_EQ(plan[0].first, a->id);
  EXPECT_EQ(plan[1].first, b->id);
  EXPECT_EQ(c->state, RequestState::kWaiting);
  EXPECT_EQ(rig.sched.waiting().size(), 1u);
}

TEST(Scheduler, PrefixHitSkipsCachedTokens) {
  Rig rig(64, 4, {64, 8});
  std::vector<int32_t> shared = tokens(17);
  Request* a = rig.add(shared, 1);
  rig.step();
  ASSERT_TRUE(a->finished());
  std::vector<int32_t> p = shared;
  p.push_back(99);
  Request* b = rig.add(p, 1);
  auto plan = rig.step();
  // 16 of the 17 shared tokens are in full cached blocks; b computes 2.
  EXPECT_EQ(b->n_cached, 16);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].second, 2);
}

TEST(Scheduler, FullyCachedPromptStillComputesItsLastToken) {
  Rig rig(64, 4, {64, 8});
  Request* a = rig.add(tokens(16), 1);
  rig.step();
  ASSERT_TRUE(a->finished());
  Request* b = rig.add(tokens(16), 1);
  auto plan = rig.step();
  EXPECT_EQ(b->n_cached, 12);  // the last block holds the token that must be recomputed
  EXPECT_EQ(plan[0].second, 4);
}

TEST(Scheduler, AdmissionWaitsForBlocksAndKeepsArrivalOrder) {
  // 8 blocks of 4 tokens; each request needs 3 blocks for its prompt.
  Rig rig(8, 4, {64, 8});
  Request* a = rig.add(tokens(12, 0), 4);
  Request* b = rig.add(tokens(12, 100), 4);
  Request* c = rig.add(tokens(12, 200), 4);
  rig.step();
  // a and b admitted (6 blocks); c's prompt needs 3 blocks, 2 are left: c
  // waits rather than start a chunk it could not finish.
  EXPECT_EQ(a->state, RequestState::kRunning);
  EXPECT_EQ(b->state, RequestState::kRunning);
  EXPECT_EQ(c->state, RequestState::kWaiting);
  while (!c->finished()) rig.step();
  EXPECT_TRUE(a->finished());
  EXPECT_TRUE(b->finished());
  EXPECT_EQ(rig.pool.n_used(), 0);
}

TEST(Scheduler, NewestRequestIsPreemptedWhenBlocksRunOutAndResumesFromTheCache) {
  // 6 blocks of 4 tokens. a and b start with 8-token prompts (2 blocks each)
  // and decode 10 tokens: together they need 10 blocks, so b must yield.
  Rig rig(6, 4, {64, 8});
  Request* a = rig.add(tokens(8, 0), 10);
  Request* b = rig.add(tokens(8, 50), 10);
  int steps = 0;
  bool b_was_preempted = false;
  while (!(a->finished() && b->finished()) && steps++ < 200) {
    rig.step();
    b_was_preempted = b_was_preempted || b->n_preemptions > 0;
    EXPECT_EQ(a->n_preemptions, 0) << "the oldest request must never be preempted";
  }
  ASSERT_TRUE(a->finished() && b->finished());
  EXPECT_TRUE(b_was_preempted);
  EXPECT_GE(rig.sched.n_preemptions(), 1);
  // b's output continued where it stopped (tokens are the simulated ids).
  for (int32_t i = 0; i < b->n_output(); ++i) EXPECT_EQ(b->tokens[static_cast<size_t>(b->n_prompt + i)], 1000 + i);
  EXPECT_EQ(rig.pool.n_used(), 0);
}

TEST(Scheduler, RemoveReleasesEverywhere) {
  Rig rig(32, 4, {8, 8});
  Request* a = rig.add(tokens(20, 0), 5);
  Request* b = rig.add(tokens(5, 100), 5);
  rig.step();  // a takes the whole budget; b waits
  EXPECT_GT(rig.pool.n_used(), 0);
  rig.sched.remove(a);  // cancelled mid-prefill
  rig.sched.remove(b);  // cancelled while waiting
  EXPECT_TRUE(rig.sched.running().empty());
  EXPECT_TRUE(rig.sched.waiting().empty());
  EXPECT_EQ(rig.pool.n_used(), 0);
  EXPECT_TRUE(rig.kv.check_integrity().ok());
  EXPECT_TRUE(rig.sched.schedule().empty());
}

// Random arrivals, lengths, shared prefixes and cancellations on a tiny
// pool: every request ends, the pool is whole after every step, and all
// blocks are back at the end.
TEST(Scheduler, RandomizedRunsEndWithEveryBlockBack) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    Rig rig(24, 4, {16, 6});
    std::vector<int32_t> prefix = tokens(20, 500);
    int added = 0, steps = 0;
    while ((added < 300 || !rig.sched.running().empty() || !rig.sched.waiting().empty()) && steps < 20000) {
      if (added < 300 && rng() % 3 == 0) {
        const int32_t n = 1 + static_cast<int32_t>(rng() % 40);
        std::vector<int32_t> p;
        if (rng() % 2) p.assign(prefix.begin(), prefix.begin() + static_cast<int>(std::min<int32_t>(n, 20)));
        while (static_cast<int32_t>(p.size()) < n) p.push_back(static_cast<int32_t>(rng() % 50));
        rig.add(p, 1 + static_cast<int32_t>(rng() % 40));
        ++added;
      }
      if (rng() % 17 == 0 && !rig.sched.running().empty()) {
        Request* victim = rig.sched.running()[rng() % rig.sched.running().size()];
        rig.sched.remove(victim);
        victim->state = RequestState::kFinished;
      }
      rig.step();
      ++steps;
    }
    for (const auto& r : rig.owned) EXPECT_TRUE(r->finished()) << "request " << r->id << " seed " << seed;
    EXPECT_EQ(rig.pool.n_used(), 0);
    EXPECT_EQ(rig.pool.n_free() + rig.pool.n_cached(), rig.pool.n_blocks());
  }
}

// Speculative decoding's shape: a decoding request carries k draft tokens
// after its last sampled token, so its round is k + 1 tokens.
void add_draft(Request* r, int32_t k) {
  for (int32_t i = 0; i < k; ++i) r->tokens.push_back(2000 + i);
  r->n_draft += k;
}

struct Chunk {
  uint64_t id;
  int32_t n_tokens, n_draft;
  bool samples;
  bool operator==(const Chunk&) const = default;
};

std::vector<Chunk> chunks_of(const StepPlan& plan) {
  std::vector<Chunk> out;
  for (const auto& c : plan.chunks) out.push_back({c.request->id, c.n_tokens, c.n_draft, c.samples});
  return out;
}

TEST(Scheduler, DecodeRoundOfKPlusOneTokensIsScheduledWholeBesidePrefill) {
  Rig rig(128, 4, {16, 8});
  Request* a = rig.add(tokens(3, 100), 50);
  Request* b = rig.add(tokens(3, 200), 50);
  rig.step();
  Request* big = rig.add(tokens(60, 300), 1);
  add_draft(a, 3);
  ASSERT_TRUE(a->decoding());
  ASSERT_EQ(a->n_uncomputed(), 4);
  EXPECT_EQ(a->n_output(), 1);  // drafts are not output
  const StepPlan& plan = rig.sched.schedule();
  // a's round (its token + 3 drafts) is budgeted like prefill tokens: big gets 16 - 4 - 1.
  EXPECT_EQ(chunks_of(plan), (std::vector<Chunk>{{a->id, 4, 3, true}, {b->id, 1, 0, true}, {big->id, 11, 0, false}}));
  EXPECT_EQ(plan.n_tokens, 16);
  ASSERT_TRUE(rig.sched.step_computed().ok());
  EXPECT_EQ(a->n_computed, a->n_target());  // the drafts' KV exists: verification reads it
  EXPECT_TRUE(rig.kv.check_integrity().ok());
  // The verifier accepts every draft and appends the bonus token: a decodes one token again.
  a->n_draft = 0;
  a->tokens.push_back(1999);
  b->tokens.push_back(1998);
  EXPECT_EQ(chunks_of(rig.sched.schedule()),
            (std::vector<Chunk>{{a->id, 1, 0, true}, {b->id, 1, 0, true}, {big->id, 14, 0, false}}));
}

TEST(Scheduler, DraftsGetOnlyTheBudgetBeyondOneTokenPerLaterDecoder) {
  Rig rig(128, 4, {6, 8});
  Request* a = rig.add(tokens(2, 100), 50);
  Request* b = rig.add(tokens(2, 200), 50);
  Request* c = rig.add(tokens(2, 300), 50);
  rig.step();
  add_draft(a, 5);
  add_draft(c, 5);
  // a may take 6 - 2 (b's and c's owed tokens): its token and 3 drafts; c,
  // last, gets what is left: its owed token, no draft.
  EXPECT_EQ(chunks_of(rig.sched.schedule()),
            (std::vector<Chunk>{{a->id, 4, 3, true}, {b->id, 1, 0, true}, {c->id, 1, 0, true}}));
  // Drafts that were not scheduled are dropped from the request.
  EXPECT_EQ(a->n_draft, 3);
  EXPECT_EQ(a->n_target(), 2 + 1 + 3);
  EXPECT_EQ(c->n_draft, 0);
  EXPECT_EQ(c->n_target(), 2 + 1);
  EXPECT_EQ(rig.sched.n_preemptions(), 0);
}

TEST(Scheduler, DraftsTakeOnlyFreeBlocksAndNeverPreempt) {
  // 4 blocks of 4 tokens: a holds 2 (7-token prompt), b 1 (3-token prompt), 1 is free.
  Rig rig(4, 4, {64, 8});
  Request* a = rig.add(tokens(7, 100), 50);
  Request* b = rig.add(tokens(3, 200), 50);
  rig.step();
  ASSERT_EQ(rig.kv.n_free_blocks(), 1);
  add_draft(a, 6);  // positions 7..13: the free block holds 8..11
  const StepPlan& plan = rig.sched.schedule();
  EXPECT_EQ(chunks_of(plan), (std::vector<Chunk>{{a->id, 5, 4, true}, {b->id, 1, 0, true}}));
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(rig.sched.n_preemptions(), 0);
}

TEST(Scheduler, PrefillingRequestWithKPlusOneTokensLeftIsChunkedNotDecoded) {
  Rig rig(64, 4, {8, 8});
  Request* a = rig.add(tokens(2, 100), 50);
  rig.step();
  Request* r = rig.add(tokens(12, 300), 4);
  EXPECT_EQ(rig.step(), (std::vector<std::pair<uint64_t, int32_t>>{{a->id, 1}, {r->id, 7}}));
  // r has 5 prompt tokens left, a (decoding) its token and 4 drafts: both 5
  // tokens of work; a's round comes first and whole, r takes the rest.
  ASSERT_EQ(r->n_uncomputed(), 5);
  EXPECT_FALSE(r->decoding());
  add_draft(a, 4);
  EXPECT_EQ(chunks_of(rig.sched.schedule()), (std::vector<Chunk>{{a->id, 5, 4, true}, {r->id, 3, 0, false}}));
  ASSERT_TRUE(rig.sched.step_computed().ok());
  a->n_draft = 0;  // all accepted, plus the bonus token
  a->tokens.push_back(1999);
  EXPECT_EQ(chunks_of(rig.sched.schedule()), (std::vector<Chunk>{{a->id, 1, 0, true}, {r->id, 2, 0, true}}));
}

TEST(Scheduler, PreemptionDropsTheDrafts) {
  // 4 blocks of 4: a (8-token prompt) and b (7) hold 2 each; a's next token
  // needs a block, so b, the newest, yields it and its drafts go.
  Rig rig(4, 4, {64, 8});
  Request* a = rig.add(tokens(8, 100), 50);
  Request* b = rig.add(tokens(7, 200), 50);
  rig.step();
  ASSERT_EQ(rig.kv.n_free_blocks(), 0);
  add_draft(b, 2);
  const StepPlan& plan = rig.sched.schedule();
  EXPECT_EQ(chunks_of(plan), (std::vector<Chunk>{{a->id, 1, 0, true}}));
  ASSERT_EQ(plan.preempted, (std::vector<Request*>{b}));
  EXPECT_EQ(b->state, RequestState::kPreempted);
  EXPECT_EQ(b->n_draft, 0);
  EXPECT_EQ(b->n_target(), 8);  // prompt + the one sampled token, recomputed on resume
  EXPECT_EQ(b->n_computed, 0);
}

// Random traffic where decoders carry 0-6 drafts and the "verifier" accepts
// them all: rounds are whole or trimmed, never split, the budget holds, the
// pool is whole after every step and every request ends.
TEST(Scheduler, RandomizedRunsWithDraftsKeepTheBudgetAndEveryBlock) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    std::mt19937 rng(seed);
    Rig rig(24, 4, {16, 6});
    int added = 0, steps = 0;
    while ((added < 200 || !rig.sched.running().empty() || !rig.sched.waiting().empty()) && steps < 20000) {
      if (added < 200 && rng() % 3 == 0) {
        rig.add(tokens(1 + static_cast<int32_t>(rng() % 30), static_cast<int32_t>(rng() % 50)),
                1 + static_cast<int32_t>(rng() % 30));
        ++added;
      }
      for (Request* r : rig.sched.running()) {
        if (r->decoding() && r->n_draft == 0) add_draft(r, static_cast<int32_t>(rng() % 7));
      }
      const StepPlan& plan = rig.sched.schedule();
      ASSERT_TRUE(plan.failed.empty());
      ASSERT_LE(plan.n_tokens, 16);
      const std::vector<ScheduledChunk> chunks = plan.chunks;
      for (const auto& c : chunks) {
        if (c.n_draft > 0) {
          EXPECT_TRUE(c.samples) << "a round is never split";
        }
        EXPECT_EQ(c.n_draft, c.samples ? c.request->n_draft : 0);
      }
      ASSERT_TRUE(rig.sched.step_computed().ok());
      for (const auto& c : chunks) {
        if (!c.samples) continue;
        c.request->n_draft = 0;  // accepted
        c.request->tokens.push_back(1000 + c.request->n_output());
        if (c.request->n_output() >= c.request->params.max_tokens) {
          rig.sched.remove(c.request);
          c.request->state = RequestState::kFinished;
        }
      }
      Status st = rig.kv.check_integrity();
      ASSERT_TRUE(st.ok()) << st.error().message;
      ++steps;
    }
    for (const auto& r : rig.owned) EXPECT_TRUE(r->finished()) << "request " << r->id << " seed " << seed;
    EXPECT_EQ(rig.pool.n_used(), 0);
  }
}

// Latency-aware planning with the step cost injected: the cost model gets
// steps that cost 10 ms + 1 ms per token.
void teach_cost(Scheduler& s) {
  for (int32_t n : {1, 10, 40, 5, 20, 64}) s.cost_model().observe(n, 0.010 + 0.001 * n);
  ASSERT_TRUE(s.cost_model().ready());
}

SchedulerOptions latency_options(double max_step_s, double factor) {
  SchedulerOptions o;
  o.token_budget = 64;
  o.max_running = 8;
  o.max_step_s = max_step_s;
  o.max_step_factor = factor;
  o.min_prefill_tokens = 4;
  return o;
}

TEST(Scheduler, PrefillShareIsSizedToTheStepTarget) {
  Rig rig(256, 4, latency_options(0.030, 0));
  Request* a = rig.add(tokens(2, 100), 50);
  Request* b = rig.add(tokens(2, 200), 50);
  rig.step();
  teach_cost(rig.sched);
  Request* big = rig.add(tokens(60, 300), 1);
  // 30 ms holds 20 tokens: 2 decode tokens, 18 of prefill.
  const StepPlan& plan = rig.sched.schedule();
  EXPECT_EQ(chunks_of(plan), (std::vector<Chunk>{{a->id, 1, 0, true}, {b->id, 1, 0, true}, {big->id, 18, 0, false}}));
  EXPECT_EQ(plan.n_decode_tokens, 2);
  EXPECT_DOUBLE_EQ(plan.target_s, 0.030);
  EXPECT_EQ(plan.prefill_cap, 18);
}

TEST(Scheduler, TheDefaultTargetIsAMultipleOfTheDecodeRounds) {
  Rig rig(256, 4, latency_options(0, 2.5));
  std::vector<Request*> d;
  for (int i = 0; i < 4; ++i) d.push_back(rig.add(tokens(2, 100 * i), 50));
  rig.step();
  teach_cost(rig.sched);
  Request* big = rig.add(tokens(60, 500), 1);
  // 4 decode tokens predict 14 ms; 2.5 x 14 = 35 ms holds 25 tokens: 21 of prefill.
  const StepPlan& plan = rig.sched.schedule();
  ASSERT_EQ(plan.chunks.size(), 5u);
  EXPECT_EQ(plan.chunks[4].request, big);
  EXPECT_EQ(plan.chunks[4].n_tokens, 21);
  EXPECT_NEAR(plan.target_s, 0.035, 1e-9);
  EXPECT_EQ(plan.prefill_cap, 21);
}

TEST(Scheduler, WithNothingDecodingPrefillTakesTheWholeBudget) {
  Rig rig(256, 4, latency_options(0.030, 0));
  teach_cost(rig.sched);
  Request* big = rig.add(tokens(100, 0), 1);
  Request* next = rig.add(tokens(30, 200), 1);
  const StepPlan& plan = rig.sched.schedule();
  // Admission fills the idle step at once: no decode round to protect.
  EXPECT_EQ(chunks_of(plan), (std::vector<Chunk>{{big->id, 64, 0, false}}));
  EXPECT_EQ(plan.prefill_cap, -1);
  EXPECT_EQ(plan.target_s, 0.0);
  (void)next;
}

TEST(Scheduler, ThePrefillShareNeverDropsBelowItsFloor) {
  Rig rig(256, 4, latency_options(0.005, 0));  // below the 10 ms fixed cost
  Request* a = rig.add(tokens(2, 100), 50);
  rig.step();
  teach_cost(rig.sched);
  Request* big = rig.add(tokens(60, 300), 1);
  EXPECT_EQ(chunks_of(rig.sched.schedule()), (std::vector<Chunk>{{a->id, 1, 0, true}, {big->id, 4, 0, false}}));
}

TEST(Scheduler, NoCapUntilTheCostModelHasSeenSteps) {
  Rig rig(256, 4, latency_options(0.030, 0));
  Request* a = rig.add(tokens(2, 100), 50);
  rig.step();
  Request* big = rig.add(tokens(100, 300), 1);
  EXPECT_FALSE(rig.sched.cost_model().ready());
  const StepPlan& plan = rig.sched.schedule();
  EXPECT_EQ(chunks_of(plan), (std::vector<Chunk>{{a->id, 1, 0, true}, {big->id, 63, 0, false}}));
  EXPECT_EQ(plan.prefill_cap, -1);
}

TEST(Scheduler, OffMeansTheWholeBudget) {
  Rig rig(256, 4, latency_options(0, 0));
  Request* a = rig.add(tokens(2, 100), 50);
  rig.step();
  teach_cost(rig.sched);
  Request* big = rig.add(tokens(100, 300), 1);
  EXPECT_EQ(chunks_of(rig.sched.schedule()), (std::vector<Chunk>{{a->id, 1, 0, true}, {big->id, 63, 0, false}}));
}

TEST(Scheduler, ALongPromptAdvancesOverSeveralStepsWhileStreamsDecode) {
  Rig rig(256, 4, latency_options(0.030, 0));
  Request* a = rig.add(tokens(2, 100), 50);
  Request* b = rig.add(tokens(2, 200), 50);
  rig.step();
  teach_cost(rig.sched);
  Request* big = rig.add(tokens(60, 300), 2);
  // Every step: both streams decode, big takes 18 tokens (60 = 18 + 18 + 18 + 6).
  const std::vector<int32_t> want = {18, 18, 18, 6};
  for (int32_t n : want) {
    auto plan = rig.step();
    ASSERT_EQ(plan.size(), 3u);
    EXPECT_EQ(plan[0], (std::pair<uint64_t, int32_t>{a->id, 1}));
    EXPECT_EQ(plan[1], (std::pair<uint64_t, int32_t>{b->id, 1}));
    EXPECT_EQ(plan[2], (std::pair<uint64_t, int32_t>{big->id, n}));
  }
  EXPECT_EQ(big->n_output(), 1);     // the last chunk sampled
  EXPECT_EQ(big->prefill_steps, 0);  // (counted by the engine, not the scheduler)
}

}  // namespace
}  // namespace rill

namespace rill {
namespace {

// Each draft takes a logit row: a round gets only the rows beyond one for
// every chunk that may still follow (later decoders, prefills, admissions).
TEST(Scheduler, DraftsGetOnlyTheLogitRowsLeftForLaterChunks) {
  SchedulerOptions o;
  o.token_budget = 64;
  o.max_running = 4;
  o.max_rows = 6;
  Rig rig(128, 4, o);
  Request* a = rig.add(tokens(2, 100), 50);
  Request* b = rig.add(tokens(2, 200), 50);
  rig.step();
  add_draft(a, 8);
  add_draft(b, 8);
  rig.add(tokens(3, 300), 50);  // waiting: one more chunk may follow
  // Rows: 6. a keeps one for b and one for the admission: its token and 3
  // drafts (4 rows); b then has 2 - 1 (the admission) = 1 row: no draft.
  EXPECT_EQ(chunks_of(rig.sched.schedule()),
            (std::vector<Chunk>{{a->id, 4, 3, true}, {b->id, 1, 0, true}, {3, 3, 0, true}}));
  EXPECT_EQ(b->n_draft, 0);
}

// Pipelined decode (engine.cpp chain_step) asks, while a step is in
// flight, whether the next plan is exactly one token per running request;
// when it says so, the engine plans that step before it commits the step
// in flight's tokens (so before requests that ended leave). Random arrivals
// and lengths over a pool small enough to preempt: every prediction holds.
TEST(Scheduler, RoundsOnlyPredictionIsTheNextPlan) {
  std::mt19937 rng(11);
  Rig rig(20, 4, {24, 4});
  int n_predicted = 0, n_declined = 0;
  const StepPlan* plan = &rig.sched.schedule();
  for (int s = 0; s < 600; ++s) {
    if (rng() % 3 == 0) {
      rig.add(tokens(1 + static_cast<int32_t>(rng() % 9), 100 * s), 1 + static_cast<int32_t>(rng() % 14));
    }
    const bool predicted = !plan->empty() && rig.sched.next_plan_is_rounds_only();
    n_predicted += predicted;
    n_declined += !plan->empty() && !predicted;
    const std::vector<ScheduledChunk> chunks = plan->chunks;
    ASSERT_TRUE(rig.sched.step_computed().ok());
    for (const auto& c : chunks) {
      if (c.samples) c.request->tokens.push_back(1000 + c.request->n_output());
    }
    if (predicted) {  // chained: planned before the step's requests that ended leave
      const std::vector<Request*> running = rig.sched.running();
      plan = &rig.sched.schedule();
      ASSERT_EQ(plan->chunks.size(), running.size()) << "step " << s;
      for (size_t i = 0; i < running.size(); ++i) {
        EXPECT_EQ(plan->chunks[i].request, running[i]) << "step " << s;
        EXPECT_EQ(plan->chunks[i].n_tokens, 1) << "step " << s;
        EXPECT_TRUE(plan->chunks[i].samples) << "step " << s;
      }
      EXPECT_TRUE(plan->preempted.empty() && plan->failed.empty()) << "step " << s;
    }
    for (const auto& c : chunks) {
      if (c.samples && c.request->n_output() >= c.request->params.max_tokens) {
        rig.sched.remove(c.request);
        c.request->state = RequestState::kFinished;
      }
    }
    if (!predicted) plan = &rig.sched.schedule();
    const Status st = rig.kv.check_integrity();
    ASSERT_TRUE(st.ok()) << st.error().message;
  }
  EXPECT_GT(n_predicted, 20);
  EXPECT_GT(n_declined, 20);
}

}  // namespace
}  // namespace rill

namespace rill {
namespace {

// Tokens of `r` whose blocks the prefix cache holds (whole blocks).
int32_t n_cached_in_tree(Rig& rig, const Request& r, int32_t n) {
  return rig.tree.match(KvManager::group_ns(r.ns, 0), std::span<const int32_t>(r.tokens).first(static_cast<size_t>(n)))
      .n_tokens;
}

// Pipelined decode: a step with the next one chained behind it counts as
// computed from then on (step_queued), but its blocks reach the prefix
// cache only once it completed (commit_computed); should it fail, its
// requests are removed and the cache never held its blocks.
TEST(Scheduler, AQueuedStepOffersItsBlocksOnlyOnceCommitted) {
  Rig rig(64, 4, {16, 4});
  Request* a = rig.add(tokens(7, 100), 10);
  Request* b = rig.add(tokens(7, 200), 10);
  rig.step();  // the prompts: block 0 of each is cached
  ASSERT_EQ(a->n_output(), 1);
  ASSERT_EQ(n_cached_in_tree(rig, *a, 8), 4);
  EXPECT_EQ(chunks_of(rig.sched.schedule()), (std::vector<Chunk>{{a->id, 1, 0, true}, {b->id, 1, 0, true}}));
  rig.sched.step_queued();  // position 7 fills block 1 of each
  EXPECT_EQ(a->n_computed, 8);
  EXPECT_EQ(b->n_computed, 8);
  EXPECT_EQ(n_cached_in_tree(rig, *a, 8), 4) << "a block of a step still in flight is cached";
  EXPECT_EQ(n_cached_in_tree(rig, *b, 8), 4);
  // The next round is planned behind it (as the engine does, with the
  // step's draws as placeholders).
  a->tokens.push_back(0);
  b->tokens.push_back(0);
  EXPECT_EQ(chunks_of(rig.sched.schedule()), (std::vector<Chunk>{{a->id, 1, 0, true}, {b->id, 1, 0, true}}));
  a->tokens.pop_back();
  b->tokens.pop_back();
  // a's step completed; b's failed (the engine removes its requests).
  ASSERT_TRUE(rig.sched.commit_computed(*a, a->n_computed).ok());
  EXPECT_EQ(n_cached_in_tree(rig, *a, 8), 8);
  rig.sched.remove(b);
  b->state = RequestState::kFinished;
  EXPECT_EQ(n_cached_in_tree(rig, *b, 8), 4) << "the failed step's block reached the cache";
  const Status st = rig.kv.check_integrity();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

// The engine's runtime check of a plan made behind a step in flight: only
// that step's requests, in its order, one sampling token each, and nothing
// else, may take their tokens from its rows.
TEST(Scheduler, IsRoundsOfAcceptsOnlyTheRoundsOfTheStepInFlight) {
  Rig rig(64, 4, {16, 4});
  Request* a = rig.add(tokens(3, 100), 20);
  Request* b = rig.add(tokens(3, 200), 20);
  rig.step();
  const std::vector<ScheduledChunk> in_flight = rig.sched.schedule().chunks;
  ASSERT_EQ(in_flight.size(), 2u);
  rig.sched.step_queued();
  a->tokens.push_back(0);  // the draws of the step in flight (placeholders)
  b->tokens.push_back(0);
  const StepPlan& plan = rig.sched.schedule();
  EXPECT_TRUE(is_rounds_of(plan, in_flight));
  const std::vector<ScheduledChunk> swapped = {in_flight[1], in_flight[0]};
  EXPECT_FALSE(is_rounds_of(plan, swapped)) << "rows in another order";
  EXPECT_FALSE(is_rounds_of(plan, std::span(in_flight).first(1))) << "a request it does not name";
  ASSERT_TRUE(rig.sched.discard_plan().ok());
  add_draft(a, 2);
  EXPECT_FALSE(is_rounds_of(rig.sched.schedule(), in_flight)) << "a round with drafts";
  ASSERT_TRUE(rig.sched.discard_plan().ok());
  a->drop_draft(a->n_draft);
  rig.add(tokens(5, 300), 4);
  EXPECT_FALSE(is_rounds_of(rig.sched.schedule(), in_flight)) << "an admission";
  ASSERT_TRUE(rig.sched.discard_plan().ok());
  const Status st = rig.kv.check_integrity();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

// A plan that is not launched (engine.cpp chain_step, when the plan differs
// from the predicted rounds) gives back its KV; its admission stands and
// the next plan is the same.
TEST(Scheduler, ADiscardedPlanGivesBackItsKvAndIsPlannedAgain) {
  Rig rig(64, 4, {16, 4});
  Request* a = rig.add(tokens(4, 100), 20);
  Request* b = rig.add(tokens(3, 200), 20);
  rig.step();
  Request* c = rig.add(tokens(9, 300), 4);
  const int32_t n_free = rig.kv.n_free_blocks();
  const std::vector<Chunk> planned = chunks_of(rig.sched.schedule());
  ASSERT_EQ(planned, (std::vector<Chunk>{{a->id, 1, 0, true}, {b->id, 1, 0, true}, {c->id, 9, 0, true}}));
  EXPECT_LT(rig.kv.n_free_blocks(), n_free);
  ASSERT_TRUE(rig.sched.discard_plan().ok());
  EXPECT_EQ(rig.kv.n_free_blocks(), n_free);
  for (const Request* r : {a, b, c}) EXPECT_EQ(rig.kv.length(static_cast<int64_t>(r->id)), r->n_computed);
  EXPECT_EQ(c->state, RequestState::kRunning);
  Status st = rig.kv.check_integrity();
  EXPECT_TRUE(st.ok()) << st.error().message;
  EXPECT_EQ(chunks_of(rig.sched.schedule()), planned);
  ASSERT_TRUE(rig.sched.step_computed().ok());
  st = rig.kv.check_integrity();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

}  // namespace
}  // namespace rill
