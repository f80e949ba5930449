// Randomized stress: thousands of requests with random lengths, shared
// prefixes and cancellations through a tiny KV pool that forces preemption.
// Every request must end; uncancelled ones must produce exactly their alone
// (greedy) tokens; the KV structures are checked after every step and every
// block is back in the pool at the end.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "fake_model.h"
#include "rill/engine.h"

namespace rill {
namespace {

using testing::FakeModel;

struct Outcome {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
  bool cancel_requested = false;
  std::vector<int32_t> ids;
  std::optional<GenerationEvent> final_event;
};

TEST(EngineStress, RandomRequestsCancellationsAndPreemptionOnATinyPool) {
  constexpr int kRequests = 2000;
  FakeModel::Options mo;
  mo.n_ctx = 256;
  mo.block_size = 4;
  mo.n_blocks = 40;  // 160 tokens: a few requests at a time
  mo.max_batch_tokens = 32;
  mo.max_batch_seqs = 8;
  EngineOptions eo;
  eo.max_batch_tokens = 32;
  eo.max_running = 8;
  eo.check_integrity = true;
  auto engine = Engine::create(std::make_unique<FakeModel>(mo), nullptr, eo);
  ASSERT_TRUE(engine.ok()) << engine.error().message;
  Engine& e = **engine;

  std::mt19937 rng(2026);
  std::vector<int32_t> shared_prefix;
  for (int i = 0; i < 48; ++i) shared_prefix.push_back(static_cast<int32_t>(rng() % 64));

  std::vector<Outcome> outcomes(kRequests);
  std::mutex mu;
  std::atomic<int> n_finished{0};
  std::vector<uint64_t> ids(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    Outcome& o = outcomes[static_cast<size_t>(i)];
    const int32_t n = 1 + static_cast<int32_t>(rng() % 80);
    const int32_t share = rng() % 2 ? std::min<int32_t>(n, static_cast<int32_t>(rng() % 49)) : 0;
    o.prompt.assign(shared_prefix.begin(), shared_prefix.begin() + share);
    while (static_cast<int32_t>(o.prompt.size()) < n) o.prompt.push_back(static_cast<int32_t>(rng() % 64));
    o.max_tokens = 1 + static_cast<int32_t>(rng() % 40);
    o.cancel_requested = rng() % 10 == 0;
    GenerationRequest r;
    r.prompt = o.prompt;
    r.max_tokens = o.max_tokens;
    r.sampling.temperature = 0.0f;
    auto id = e.submit(std::move(r), [&, i](GenerationEvent&& ev) {
      std::lock_guard lk(mu);
      Outcome& out = outcomes[static_cast<size_t>(i)];
      out.ids.insert(out.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) {
        out.final_event = std::move(ev);
        ++n_finished;
      }
    });
    ASSERT_TRUE(id.ok()) << id.error().message;
    ids[static_cast<size_t>(i)] = *id;
    // Cancel some soon after submission (waiting or running by then).
    if (i >= 3 && outcomes[static_cast<size_t>(i - 3)].cancel_requested) e.cancel(ids[static_cast<size_t>(i - 3)]);
    if (rng() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  for (int t = 0; t < 6000 && n_finished < kRequests; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(n_finished.load(), kRequests);

  std::lock_guard lk(mu);
  int n_aborted = 0;
  for (int i = 0; i < kRequests; ++i) {
    const Outcome& o = outcomes[static_cast<size_t>(i)];
    ASSERT_TRUE(o.final_event.has_value());
    std::vector<int32_t> ref, ctx = o.prompt;
    for (int32_t k = 0; k < o.max_tokens; ++k) {
      ref.push_back(FakeModel::next_token(ctx, 64));
      ctx.push_back(ref.back());
    }
    const FinishReason why = o.final_event->finish_reason;
    if (why == FinishReason::kAborted) {
      ++n_aborted;
      EXPECT_TRUE(o.cancel_requested) << "request " << i << " aborted without a cancel";
      ASSERT_LE(o.ids.size(), ref.size());
      EXPECT_TRUE(std::equal(o.ids.begin(), o.ids.end(), ref.begin())) << "request " << i;
    } else {
      EXPECT_EQ(why, FinishReason::kLength) << "request " << i << ": " << o.final_event->error;
      EXPECT_EQ(o.ids, ref) << "request " << i;
    }
  }
  for (int t = 0; t < 200 && e.stats().kv_blocks_used != 0; ++t)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const EngineStats s = e.stats();
  EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.kv_blocks_cached + s.kv_blocks_used <= s.kv_blocks_total, true);
  EXPECT_GT(s.preemptions, 0) << "the pool was meant to force preemption";
  EXPECT_GT(s.cached_tokens, 0) << "shared prefixes were meant to hit the cache";
  EXPECT_GT(n_aborted, 0);
  std::printf("steps %lld, preemptions %lld, cached tokens %lld, aborted %d\n", static_cast<long long>(s.steps),
              static_cast<long long>(s.preemptions), static_cast<long long>(s.cached_tokens), n_aborted);
}

}  // namespace
}  // namespace rill
