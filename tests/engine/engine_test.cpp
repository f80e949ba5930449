// The engine over a FakeModel (tests/engine/fake_model.h): streaming,
// batching, stop handling, validation, cancellation, failure containment and
// the prefix cache, with the KV structures checked after every step.
#include "rill/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "fake_model.h"

namespace rill {
namespace {

using testing::FakeModel;

std::vector<int32_t> reference(std::vector<int32_t> prompt, int32_t n, int32_t n_vocab = 64) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t = FakeModel::next_token(prompt, n_vocab);
    out.push_back(t);
    prompt.push_back(t);
  }
  return out;
}

std::unique_ptr<Engine> make_engine(FakeModel::Options mo = {}, EngineOptions eo = {}, FakeModel** raw = nullptr) {
  auto model = std::make_unique<FakeModel>(mo);
  if (raw) *raw = model.get();
  eo.check_integrity = true;
  auto e = Engine::create(std::move(model), nullptr, eo);
  EXPECT_TRUE(e.ok()) << e.error().message;
  return std::move(e).value();
}

struct Collected {
  std::vector<int32_t> ids;
  GenerationEvent last;
  int n_events = 0;
};

Collected drain(RequestHandle& h) {
  Collected c;
  GenerationEvent ev;
  while (h.next(ev)) {
    ++c.n_events;
    c.ids.insert(c.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    if (ev.finished) c.last = ev;
  }
  return c;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

std::vector<int32_t> prompt_of(int32_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back((i * 7 + salt * 13) % 64);
  return p;
}

void expect_clean(const Engine& e) {
  // The engine thread publishes stats after the step that finished the last
  // request; wait for it.
  auto busy = [&] {
    const EngineStats s = e.stats();
    return s.requests_finished != s.requests_submitted || s.running != 0 || s.kv_blocks_used != 0;
  };
  for (int i = 0; i < 4000 && busy(); ++i) {  // up to 20 s on a loaded machine
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const EngineStats s = e.stats();
  EXPECT_EQ(s.integrity_errors, 0) << s.last_integrity_error;
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.running, 0);
}

TEST(Engine, OneRequestStreamsTheGreedyContinuation) {
  auto e = make_engine();
  auto h = e->submit(greedy(prompt_of(10, 1), 12));
  ASSERT_TRUE(h.ok()) << h.error().message;
  Collected c = drain(*h);
  EXPECT_EQ(c.ids, reference(prompt_of(10, 1), 12));
  EXPECT_EQ(c.n_events, 12);  // one token per step, the last event finishes
  EXPECT_TRUE(c.last.finished);
  EXPECT_EQ(c.last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(c.last.usage.prompt_tokens, 10);
  EXPECT_EQ(c.last.usage.completion_tokens, 12);
  EXPECT_EQ(c.last.usage.cached_tokens, 0);
  expect_clean(*e);
}

TEST(Engine, ConcurrentRequestsGiveTheirAloneTokens) {
  FakeModel* model = nullptr;
  auto e = make_engine({.n_blocks = 256}, {}, &model);
  std::vector<RequestHandle> handles;
  for (int32_t i = 0; i < 16; ++i) {
    auto h = e->submit(greedy(prompt_of(3 + i * 5, i), 8 + i));
    ASSERT_TRUE(h.ok());
    handles.push_back(std::move(h).value());
  }
  for (int32_t i = 0; i < 16; ++i) {
    Collected c = drain(handles[static_cast<size_t>(i)]);
    EXPECT_EQ(c.ids, reference(prompt_of(3 + i * 5, i), 8 + i)) << "request " << i;
  }
  const auto seqs = model->step_seqs();
  EXPECT_GT(*std::max_element(seqs.begin(), seqs.end()), 1) << "requests were never batched";
  expect_clean(*e);
  // The batch-size histogram counts every step once, with the same total.
  const EngineStats st = e->stats();
  int64_t n_steps = 0;
  for (int64_t c : st.batch_size_counts) n_steps += c;
  EXPECT_EQ(n_steps, st.steps);
  EXPECT_GT(st.batch_size_sum, st.steps);  // some steps held several sequences
}

TEST(Engine, StopTokenEndsWithStop) {
  auto e = make_engine();
  const auto ref = reference(prompt_of(6, 2), 10);
  GenerationRequest r = greedy(prompt_of(6, 2), 10);
  r.stop_token_ids = {ref[4]};
  // The first occurrence of ref[4] ends the stream (it may occur earlier).
  const size_t first = static_cast<size_t>(std::find(ref.begin(), ref.end(), ref[4]) - ref.begin());
  auto h = e->submit(std::move(r));
  ASSERT_TRUE(h.ok());
  Collected c = drain(*h);
  EXPECT_EQ(c.ids, std::vector<int32_t>(ref.begin(), ref.begin() + static_cast<ptrdiff_t>(first) + 1));
  EXPECT_EQ(c.last.finish_reason, FinishReason::kStop);
  ASSERT_TRUE(c.last.stop_token.has_value());
  EXPECT_EQ(*c.last.stop_token, ref[4]);
  expect_clean(*e);
}

TEST(Engine, InvalidRequestsAreRejectedNamingTheField) {
  auto e = make_engine({.n_ctx = 64, .n_blocks = 8});
  auto expect_error = [&](GenerationRequest r, const std::string& field) {
    auto id = e->submit(std::move(r), [](GenerationEvent&&) {});
    ASSERT_FALSE(id.ok()) << field;
    EXPECT_NE(id.error().message.find(field), std::string::npos) << id.error().message;
  };
  expect_error(greedy({}, 4), "prompt");
  expect_error(greedy({1, 64}, 4), "prompt: token id 64");
  expect_error(greedy({1, -1}, 4), "prompt: token id -1");
  expect_error(greedy({1}, 0), "max_tokens");
  expect_error(greedy(prompt_of(60, 0), 10), "exceeds the context of 64");
  expect_error(greedy(prompt_of(20, 0), 20), "KV blocks");  // 40 tokens > 8 blocks of 4
  GenerationRequest s = greedy({1}, 4);
  s.stop = {"x"};
  expect_error(s, "stop");
  GenerationRequest lp = greedy({1}, 4);
  lp.logprobs = 21;
  expect_error(lp, "logprobs");
  GenerationRequest tp = greedy({1}, 4);
  tp.sampling.top_p = 0.0f;
  expect_error(tp, "top_p");
  EXPECT_EQ(e->stats().requests_rejected, 9);
  EXPECT_EQ(e->stats().requests_submitted, 0);
}

TEST(Engine, CancelFreesTheRequestAndOthersContinue) {
  auto e = make_engine({.n_ctx = 4096, .n_blocks = 1024});
  auto long_one = e->submit(greedy(prompt_of(5, 3), 3000));
  auto short_one = e->submit(greedy(prompt_of(7, 4), 20));
  ASSERT_TRUE(long_one.ok() && short_one.ok());
  GenerationEvent ev;
  ASSERT_TRUE(long_one->next(ev));  // it is running
  long_one->cancel();
  Collected c = drain(*long_one);
  EXPECT_EQ(c.last.finish_reason, FinishReason::kAborted);
  EXPECT_LT(c.last.usage.completion_tokens, 3000);
  EXPECT_EQ(drain(*short_one).ids, reference(prompt_of(7, 4), 20));
  expect_clean(*e);
}

TEST(Engine, DroppingTheHandleCancels) {
  auto e = make_engine({.n_ctx = 4096, .n_blocks = 1024});
  {
    auto h = e->submit(greedy(prompt_of(5, 3), 4000));
    ASSERT_TRUE(h.ok());
    GenerationEvent ev;
    ASSERT_TRUE(h->next(ev));
  }
  expect_clean(*e);
  EXPECT_EQ(e->stats().requests_finished, 1);
}

TEST(Engine, ShutDownEndsRunningAndQueuedRequestsWithItsErrorAndRefusesNewOnes) {
  // One running request, and more queued than may run at once.
  EngineOptions one_at_a_time;
  one_at_a_time.max_running = 1;
  auto e = make_engine({.n_ctx = 4096, .n_blocks = 1024}, one_at_a_time);
  auto running = e->submit(greedy(prompt_of(5, 3), 4000));
  ASSERT_TRUE(running.ok());
  GenerationEvent ev;
  ASSERT_TRUE(running->next(ev));
  auto queued = e->submit(greedy(prompt_of(6, 5), 4000));
  ASSERT_TRUE(queued.ok());
  e->shut_down("the server is shutting down");
  for (RequestHandle* h : {&*running, &*queued}) {
    Collected c = drain(*h);
    EXPECT_EQ(c.last.finish_reason, FinishReason::kError);
    EXPECT_EQ(c.last.error, "the server is shutting down");
    EXPECT_LT(c.last.usage.completion_tokens, 4000);
  }
  auto late = e->submit(greedy(prompt_of(4, 1), 4));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().message, "the server is shutting down");
  e->shut_down("again");  // idempotent
  expect_clean(*e);
}

TEST(Engine, AThrowingConsumerEndsOnlyItsRequest) {
  // 5 ms a step and 400 tokens: the failure (a hand-over between two
  // threads) has 2 s to reach the engine before the request could finish
  // by itself, even on a loaded machine.
  auto e = make_engine({.n_blocks = 256, .forward_delay = std::chrono::milliseconds(5)});
  std::atomic<int> calls{0};
  std::atomic<bool> got_final{false};
  GenerationEvent final_event;
  auto bad = e->submit(greedy(prompt_of(4, 5), 400), [&](GenerationEvent&& ev) {
    if (ev.finished) {
      final_event = ev;
      got_final = true;
      return;
    }
    if (++calls == 3) throw std::runtime_error("client went away");
  });
  ASSERT_TRUE(bad.ok());
  auto good = e->submit(greedy(prompt_of(9, 6), 30));
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(drain(*good).ids, reference(prompt_of(9, 6), 30));
  for (int i = 0; i < 2000 && !got_final; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(got_final);
  EXPECT_EQ(final_event.finish_reason, FinishReason::kError);
  EXPECT_NE(final_event.error.find("client went away"), std::string::npos);
  // Consumers run off the engine thread (EventDispatcher): the engine may
  // compute a few more tokens before it hears of the failure, but the
  // consumer gets no event after the one that threw except the final one.
  EXPECT_EQ(calls.load(), 3);
  EXPECT_GE(final_event.usage.completion_tokens, 3);
  EXPECT_LT(final_event.usage.completion_tokens, 400);
  expect_clean(*e);
}

TEST(Engine, AForwardErrorFailsThatStepAndTheEngineKeepsServing) {
  FakeModel* model = nullptr;
  auto e = make_engine({}, {}, &model);
  model->fail_next_forward();
  auto a = e->submit(greedy(prompt_of(5, 7), 5));
  ASSERT_TRUE(a.ok());
  Collected ca = drain(*a);
  EXPECT_EQ(ca.last.finish_reason, FinishReason::kError);
  EXPECT_NE(ca.last.error.find("injected forward failure"), std::string::npos);
  auto b = e->submit(greedy(prompt_of(5, 7), 5));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(drain(*b).ids, reference(prompt_of(5, 7), 5));
  expect_clean(*e);
}

TEST(Engine, SharedPrefixIsServedFromTheCacheWithTheSameTokens) {
  auto e = make_engine({.n_blocks = 256});
  std::vector<int32_t> p = prompt_of(41, 8);
  auto a = e->submit(greedy(p, 6));
  ASSERT_TRUE(a.ok());
  Collected ca = drain(*a);
  EXPECT_EQ(ca.last.usage.cached_tokens, 0);
  auto b = e->submit(greedy(p, 6));
  ASSERT_TRUE(b.ok());
  Collected cb = drain(*b);
  EXPECT_EQ(cb.last.usage.cached_tokens, 40);  // ten full blocks of 4
  EXPECT_EQ(cb.ids, ca.ids);
  // Another namespace never shares blocks.
  GenerationRequest other = greedy(p, 6);
  other.cache_namespace = 42;
  auto c = e->submit(std::move(other));
  ASSERT_TRUE(c.ok());
  Collected cc = drain(*c);
  EXPECT_EQ(cc.last.usage.cached_tokens, 0);
  EXPECT_EQ(cc.ids, ca.ids);
  expect_clean(*e);
}

TEST(Engine, SeededSamplingIsReproducibleAloneAndBatched) {
  auto run = [](int n_parallel) {
    auto e = make_engine({.n_blocks = 512});
    std::vector<RequestHandle> hs;
    for (int i = 0; i < n_parallel; ++i) {
      GenerationRequest r = greedy(prompt_of(5 + i, i), 16);
      r.sampling.temperature = 0.9f;
      r.sampling.seed = 1234;
      hs.push_back(std::move(e->submit(std::move(r))).value());
    }
    return drain(hs[0]).ids;
  };
  const auto alone = run(1);
  EXPECT_EQ(run(8), alone);
  EXPECT_EQ(run(1), alone);
}

}  // namespace
}  // namespace rill
