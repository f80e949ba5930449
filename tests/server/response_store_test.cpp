// ResponseStore with an injected clock: TTL expiry whatever the LRU order,
// LRU eviction under the byte cap, get refreshing recency, oversized entries,
// delete, stats.
#include "server/response_store.h"

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace rill::server {
namespace {

using Clock = ResponseStore::Clock;
using std::chrono::seconds;

struct FakeClock {
  Clock::time_point t = Clock::time_point(seconds(1000));
  ResponseStore::NowFn fn() {
    return [this] { return t; };
  }
};

// An entry whose byte size is dominated by `n_bytes` of text.
StoredResponse entry_of(size_t n_bytes, const std::string& tag = "x") {
  StoredResponse e;
  e.response = {{"id", tag}, {"object", "response"}, {"pad", std::string(n_bytes, 'a')}};
  e.input_items = nlohmann::ordered_json::array({{{"role", "user"}, {"content", tag}}});
  e.instructions = "be brief";
  return e;
}

TEST(ResponseStore, PutGetRoundTripsAndCountsHitsAndMisses) {
  FakeClock clock;
  ResponseStore store(60, 1 << 20, clock.fn());
  ASSERT_TRUE(store.put("resp_a", entry_of(100, "a")));
  auto got = store.get("resp_a");
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->response["id"], "a");
  EXPECT_EQ(got->input_items[0]["content"], "a");
  EXPECT_EQ(got->instructions, "be brief");
  EXPECT_EQ(store.get("resp_unknown"), nullptr);
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_GT(s.bytes, 100);
  EXPECT_EQ(s.max_bytes, 1 << 20);
}

TEST(ResponseStore, EntriesExpireAfterTtlEvenWhenRecentlyUsed) {
  FakeClock clock;
  ResponseStore store(60, 1 << 20, clock.fn());
  ASSERT_TRUE(store.put("old", entry_of(10)));
  clock.t += seconds(30);
  ASSERT_TRUE(store.put("young", entry_of(10)));
  clock.t += seconds(29);                // old: 59 s, young: 29 s
  ASSERT_NE(store.get("old"), nullptr);  // old is now the most recently used
  clock.t += seconds(1);                 // old: 60 s -> expired despite its LRU position
  EXPECT_EQ(store.get("old"), nullptr);
  EXPECT_NE(store.get("young"), nullptr);
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.expirations, 1);
  EXPECT_EQ(s.evictions, 0);
  clock.t += seconds(30);
  s = store.stats();  // the sweep runs on stats() too
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(s.expirations, 2);
}

TEST(ResponseStore, ExpiredEntriesLeaveBeforeLruVictims) {
  // Cap for two entries. "a" is expired but the most recently used; "b" is
  // live and least recently used. Storing "c" must drop "a" (TTL), not "b".
  FakeClock clock;
  ResponseStore probe(0, 1 << 20, clock.fn());
  ASSERT_TRUE(probe.put("a", entry_of(1000)));
  const int64_t entry = probe.stats().bytes;
  ResponseStore store(100, 2 * entry + entry / 2, clock.fn());
  ASSERT_TRUE(store.put("a", entry_of(1000)));
  clock.t += seconds(50);
  ASSERT_TRUE(store.put("b", entry_of(1000)));
  ASSERT_NE(store.get("a"), nullptr);  // LRU order now: a (recent), b
  clock.t += seconds(60);              // a: 110 s (expired), b: 60 s
  ASSERT_TRUE(store.put("c", entry_of(1000)));
  EXPECT_NE(store.get("b"), nullptr);
  EXPECT_NE(store.get("c"), nullptr);
  EXPECT_EQ(store.get("a"), nullptr);
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.expirations, 1);
  EXPECT_EQ(s.evictions, 0);
}

TEST(ResponseStore, ByteCapEvictsLeastRecentlyUsedAndGetRefreshes) {
  FakeClock clock;
  ResponseStore probe(0, 1 << 20, clock.fn());
  ASSERT_TRUE(probe.put("a", entry_of(1000)));
  const int64_t entry = probe.stats().bytes;
  ResponseStore store(0, 3 * entry, clock.fn());  // room for exactly three
  ASSERT_TRUE(store.put("a", entry_of(1000)));
  ASSERT_TRUE(store.put("b", entry_of(1000)));
  ASSERT_TRUE(store.put("c", entry_of(1000)));
  EXPECT_EQ(store.stats().bytes, 3 * entry);
  ASSERT_NE(store.get("a"), nullptr);  // order: a, c, b -> b is the LRU
  ASSERT_TRUE(store.put("d", entry_of(1000)));
  EXPECT_EQ(store.get("b"), nullptr);
  EXPECT_NE(store.get("a"), nullptr);           // order: a, d, c
  EXPECT_NE(store.get("d"), nullptr);           // order: d, a, c
  ASSERT_TRUE(store.put("e", entry_of(1000)));  // evicts c
  EXPECT_EQ(store.get("c"), nullptr);
  EXPECT_NE(store.get("a"), nullptr);
  EXPECT_NE(store.get("e"), nullptr);
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.evictions, 2);
  EXPECT_LE(s.bytes, s.max_bytes);
}

TEST(ResponseStore, OneLargeEntryEvictsSeveralSmallOnes) {
  FakeClock clock;
  ResponseStore store(0, 10'000, clock.fn());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(store.put("s" + std::to_string(i), entry_of(500)));
  ASSERT_TRUE(store.put("big", entry_of(6000)));
  ResponseStoreStats s = store.stats();
  EXPECT_LE(s.bytes, 10'000);
  EXPECT_NE(store.get("big"), nullptr);
  EXPECT_EQ(store.get("s0"), nullptr);  // the oldest went first
  EXPECT_NE(store.get("s7"), nullptr);  // the newest stayed
  EXPECT_EQ(s.entries + s.evictions, 9);
}

TEST(ResponseStore, EntryLargerThanTheCapIsNotStoredAndEvictsNothing) {
  FakeClock clock;
  ResponseStore store(0, 4000, clock.fn());
  ASSERT_TRUE(store.put("small", entry_of(100)));
  EXPECT_FALSE(store.put("huge", entry_of(5000)));
  EXPECT_EQ(store.get("huge"), nullptr);
  EXPECT_NE(store.get("small"), nullptr);
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.entries, 1);

  ResponseStore disabled(60, 0, clock.fn());  // a zero cap stores nothing
  EXPECT_FALSE(disabled.put("a", entry_of(1)));
  EXPECT_EQ(disabled.get("a"), nullptr);
}

TEST(ResponseStore, EraseRemovesAndReportsWhetherLive) {
  FakeClock clock;
  ResponseStore store(60, 1 << 20, clock.fn());
  ASSERT_TRUE(store.put("a", entry_of(100)));
  ASSERT_TRUE(store.put("b", entry_of(100)));
  EXPECT_TRUE(store.erase("a"));
  EXPECT_FALSE(store.erase("a"));
  EXPECT_EQ(store.get("a"), nullptr);
  clock.t += seconds(61);
  EXPECT_FALSE(store.erase("b"));  // expired: gone already
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.bytes, 0);
}

TEST(ResponseStore, PutReplacesAnEntryUnderTheSameId) {
  FakeClock clock;
  ResponseStore store(60, 1 << 20, clock.fn());
  ASSERT_TRUE(store.put("a", entry_of(5000, "first")));
  const int64_t big = store.stats().bytes;
  clock.t += seconds(50);
  ASSERT_TRUE(store.put("a", entry_of(10, "second")));
  ResponseStoreStats s = store.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_LT(s.bytes, big);
  clock.t += seconds(30);  // 80 s after the first put, 30 s after the second
  auto got = store.get("a");
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->response["id"], "second");
}

TEST(ResponseStore, HeldEntriesOutliveEviction) {
  FakeClock clock;
  ResponseStore store(60, 1 << 20, clock.fn());
  ASSERT_TRUE(store.put("a", entry_of(100, "kept")));
  auto held = store.get("a");
  ASSERT_TRUE(store.erase("a"));
  EXPECT_EQ(held->response["id"], "kept");
}

TEST(ResponseStore, ConcurrentUseKeepsTheAccountingConsistent) {
  ResponseStore store(3600, 200'000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < 500; ++i) {
        const std::string id = "t" + std::to_string(t) + "_" + std::to_string(i);
        store.put(id, entry_of(1000 + size_t(i % 7) * 100));
        store.get("t" + std::to_string((t + 1) % 4) + "_" + std::to_string(i / 2));
        if (i % 5 == 0) store.erase(id);
      }
    });
  }
  for (auto& th : threads) th.join();
  ResponseStoreStats s = store.stats();
  EXPECT_LE(s.bytes, s.max_bytes);
  EXPECT_GT(s.entries, 0);
  EXPECT_GT(s.evictions, 0);
}

TEST(ResponseStore, RandomIdsHavePrefixAndHex) {
  const std::string a = random_id("resp_"), b = random_id("resp_");
  EXPECT_EQ(a.rfind("resp_", 0), 0u);
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef", 5), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace rill::server
