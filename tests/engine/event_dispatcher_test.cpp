#include "engine/event_dispatcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rill {
namespace {

GenerationEvent event_with(int32_t token, bool finished = false) {
  GenerationEvent e;
  e.token_ids.push_back(token);
  e.finished = finished;
  return e;
}

struct Failures {
  std::mutex mu;
  std::vector<std::pair<uint64_t, std::string>> seen;
  EventDispatcher::FailureSink sink() {
    return [this](uint64_t id, std::string message) {
      std::lock_guard lk(mu);
      seen.emplace_back(id, std::move(message));
    };
  }
};

TEST(EventDispatcher, DeliversEachRequestsEventsInOrderOffTheCallersThread) {
  Failures failures;
  std::vector<int32_t> a, b;
  std::atomic<bool> on_caller_thread{false};
  const std::thread::id caller = std::this_thread::get_id();
  {
    EventDispatcher d(failures.sink(), 16);
    auto cb_a = std::make_shared<const EventCallback>([&](GenerationEvent&& e) {
      on_caller_thread = on_caller_thread || std::this_thread::get_id() == caller;
      a.push_back(e.token_ids.at(0));
    });
    auto cb_b = std::make_shared<const EventCallback>([&](GenerationEvent&& e) { b.push_back(e.token_ids.at(0)); });
    for (int32_t t = 0; t < 100; ++t) {
      d.post(1, cb_a, event_with(t, t == 99));
      d.post(2, cb_b, event_with(1000 + t, t == 99));
      if (t % 7 == 0) d.flush();
    }
  }  // the destructor delivers everything posted
  ASSERT_EQ(a.size(), 100u);
  ASSERT_EQ(b.size(), 100u);
  for (int32_t t = 0; t < 100; ++t) {
    EXPECT_EQ(a[static_cast<size_t>(t)], t);
    EXPECT_EQ(b[static_cast<size_t>(t)], 1000 + t);
  }
  EXPECT_FALSE(on_caller_thread);
  EXPECT_TRUE(failures.seen.empty());
}

TEST(EventDispatcher, AThrowingConsumerIsReportedOnceAndGetsOnlyItsFinalEvent) {
  Failures failures;
  std::vector<int32_t> got;
  bool got_final = false;
  {
    EventDispatcher d(failures.sink(), 64);
    auto cb = std::make_shared<const EventCallback>([&](GenerationEvent&& e) {
      if (e.finished) {
        got_final = true;
        return;
      }
      got.push_back(e.token_ids.at(0));
      if (got.size() == 3) throw std::runtime_error("client went away");
    });
    for (int32_t t = 0; t < 10; ++t) d.post(7, cb, event_with(t));
    d.post(7, cb, event_with(10, true));
    d.flush();
  }
  EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2}));  // nothing after the throw but the final event
  EXPECT_TRUE(got_final);
  ASSERT_EQ(failures.seen.size(), 1u);
  EXPECT_EQ(failures.seen[0].first, 7u);
  EXPECT_NE(failures.seen[0].second.find("client went away"), std::string::npos);
}

TEST(EventDispatcher, AFullQueueBlocksTheFlushUntilTheConsumerCatchesUp) {
  Failures failures;
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> delivered{0};
  std::atomic<int> posted{0};
  EventDispatcher d(failures.sink(), 2);
  auto cb = std::make_shared<const EventCallback>([&](GenerationEvent&&) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return release; });
    ++delivered;
  });
  std::thread poster([&] {
    for (int32_t t = 0; t < 6; ++t) {
      d.post(1, cb, event_with(t));
      d.flush();
      ++posted;
    }
  });
  // One event is in the consumer (held), two wait: the fourth flush blocks.
  for (int i = 0; i < 200 && posted < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(posted.load(), 3);
  EXPECT_EQ(delivered.load(), 0);
  {
    std::lock_guard lk(mu);
    release = true;
  }
  cv.notify_all();
  poster.join();
  EXPECT_EQ(posted.load(), 6);
}

TEST(EventDispatcher, ANullCallbackDropsTheEventAndOthersStillArrive) {
  Failures failures;
  int delivered = 0;
  {
    EventDispatcher d(failures.sink(), 4);
    d.post(1, nullptr, event_with(1));
    d.post(1, std::make_shared<const EventCallback>(), event_with(2));  // empty std::function
    d.post(2, std::make_shared<const EventCallback>([&](GenerationEvent&&) { ++delivered; }), event_with(3));
    d.flush();
  }
  EXPECT_EQ(delivered, 1);
  EXPECT_TRUE(failures.seen.empty());
}

}  // namespace
}  // namespace rill
