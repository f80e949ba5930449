// HostArena: extents are handed out best-fit, page aligned, come back (and
// coalesce) when their handle dies, even after the arena object is gone; the
// prefault thread finishes and leaves the bytes alone.
#include "kv/host_arena.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

namespace rill {
namespace {

constexpr size_t kPage = HostArena::kAlign;

TEST(HostArena, AllocatesBestFitAndCoalescesOnFree) {
  auto arena = HostArena::create(10 * kPage, /*prefault=*/false);
  ASSERT_TRUE(arena.ok()) << arena.error().message;
  HostArena& a = **arena;
  EXPECT_EQ(a.capacity(), 10 * kPage);
  HostBytes x = a.allocate(2 * kPage);
  HostBytes y = a.allocate(kPage + 1);  // rounds up to two pages
  HostBytes z = a.allocate(3 * kPage);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(y.size(), kPage + 1);
  EXPECT_TRUE(x.in_arena());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(y.data()) % kPage, 0u);
  EXPECT_EQ(y.data(), x.data() + 2 * kPage);
  EXPECT_EQ(a.free_bytes(), 3 * kPage);
  EXPECT_FALSE(a.allocate(4 * kPage)) << "no extent holds four pages";
  x = HostBytes();  // frees pages [0, 2): the best fit for two pages now
  HostBytes w = a.allocate(2 * kPage);
  ASSERT_TRUE(w);
  EXPECT_EQ(w.data(), z.data() - 4 * kPage);
  w = HostBytes();
  y = HostBytes();  // [0, 4) coalesces
  EXPECT_EQ(a.largest_free(), 4 * kPage);
  z = HostBytes();  // everything is one extent again
  EXPECT_EQ(a.largest_free(), 10 * kPage);
  EXPECT_EQ(a.free_bytes(), 10 * kPage);
}

TEST(HostArena, BytesOutliveTheArenaObject) {
  HostBytes keep;
  {
    auto arena = HostArena::create(4 * kPage, /*prefault=*/true);
    ASSERT_TRUE(arena.ok());
    keep = (*arena)->allocate(100);
    ASSERT_TRUE(keep);
    std::memset(keep.data(), 7, keep.size());
  }
  EXPECT_EQ(keep.data()[99], 7);  // still mapped
}

TEST(HostArena, PrefaultFinishesAndKeepsWrittenBytes) {
  auto arena = HostArena::create(64 * kPage * 16, /*prefault=*/true);
  ASSERT_TRUE(arena.ok());
  HostBytes b = (*arena)->allocate(kPage * 16);
  ASSERT_TRUE(b);
  std::memset(b.data(), 0x5a, b.size());  // may race the prefault: it must not zero these
  for (int i = 0; i < 500 && !(*arena)->prefault_done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_TRUE((*arena)->prefault_done());
  for (size_t i = 0; i < b.size(); i += 997) ASSERT_EQ(b.data()[i], 0x5a);
}

TEST(HostArena, OwnMappingIsOutsideTheArena) {
  auto b = HostBytes::own(3 * kPage);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->in_arena());
  EXPECT_EQ(b->size(), 3 * kPage);
  b->data()[3 * kPage - 1] = 1;
}

}  // namespace
}  // namespace rill
