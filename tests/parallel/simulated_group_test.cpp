// SimulatedGroup: the collectives give the documented results, all-reduce
// folds in rank order whatever the threads' timing, and ranks that disagree
// get an error instead of a wrong answer.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "parallel/simulated_group.h"

namespace rill {
namespace {

// Runs body(rank_communicator) on one thread per rank.
void run_ranks(SimulatedGroup& group, const std::function<void(Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) threads.emplace_back([&, r] { body(group.rank(r)); });
  for (std::thread& t : threads) t.join();
}

std::unique_ptr<SimulatedGroup> make_group(int n) {
  auto g = SimulatedGroup::create(n);
  EXPECT_TRUE(g.ok());
  return std::move(g).value();
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(SimulatedGroup, RejectsBadSizes) {
  EXPECT_FALSE(SimulatedGroup::create(0).ok());
  EXPECT_FALSE(SimulatedGroup::create(SimulatedGroup::kMaxRanks + 1).ok());
  auto g = make_group(3);
  EXPECT_EQ(g->size(), 3);
  EXPECT_EQ(g->rank(2).rank(), 2);
  EXPECT_EQ(g->rank(2).size(), 3);
}

// Values chosen so that float addition order shows: in f32,
// ((1e8 + 1) + -1e8) + 1 = 1, while e.g. (1 + 1) + (1e8 + -1e8) = 2.
TEST(SimulatedGroup, AllReduceFoldsInRankOrderWhateverTheTiming) {
  constexpr int kRanks = 4;
  constexpr int64_t kN = 1001;  // not a multiple of the rank count: uneven chunks
  const float kTerms[kRanks] = {1e8f, 1.0f, -1e8f, 1.0f};
  std::vector<std::vector<float>> inputs(kRanks, std::vector<float>(kN));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (int r = 0; r < kRanks; ++r) {
    for (int64_t i = 0; i < kN; ++i) inputs[r][i] = i % 2 == 0 ? kTerms[r] : u(rng) * (r == 0 ? 1e7f : 1.0f);
  }
  std::vector<float> expected(kN);
  for (int64_t i = 0; i < kN; ++i) {
    float s = inputs[0][i];
    for (int r = 1; r < kRanks; ++r) s += inputs[r][i];
    expected[i] = s;
  }
  ASSERT_EQ(expected[0], 1.0f);
  auto group = make_group(kRanks);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::vector<float>> data = inputs;
    run_ranks(*group, [&](Communicator& c) {
      // Jitter: ranks arrive in a different order each trial.
      std::this_thread::sleep_for(std::chrono::microseconds((trial * 37 + c.rank() * 101) % 300));
      ASSERT_TRUE(c.all_reduce_sum(data[c.rank()].data(), kN).ok());
    });
    for (int r = 0; r < kRanks; ++r) {
      for (int64_t i = 0; i < kN; ++i) {
        ASSERT_EQ(bits(data[r][i]), bits(expected[i])) << "trial " << trial << " rank " << r << " element " << i;
      }
    }
  }
}

TEST(SimulatedGroup, AllGatherLaysRanksEndToEnd) {
  constexpr int kRanks = 3;
  constexpr int64_t kN = 5;
  auto group = make_group(kRanks);
  std::vector<std::vector<float>> recv(kRanks, std::vector<float>(kRanks * kN, -1.0f));
  run_ranks(*group, [&](Communicator& c) {
    std::vector<float> send(kN);
    for (int64_t i = 0; i < kN; ++i) send[i] = static_cast<float>(c.rank() * 100 + i);
    ASSERT_TRUE(c.all_gather(send.data(), kN, recv[c.rank()].data()).ok());
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int q = 0; q < kRanks; ++q) {
      for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(recv[r][q * kN + i], static_cast<float>(q * 100 + i));
    }
  }
}

TEST(SimulatedGroup, BroadcastCopiesTheRootsBuffer) {
  constexpr int kRanks = 4;
  auto group = make_group(kRanks);
  std::vector<std::vector<float>> data(kRanks);
  for (int r = 0; r < kRanks; ++r) data[r] = {static_cast<float>(r), static_cast<float>(r) + 0.5f};
  run_ranks(*group, [&](Communicator& c) { ASSERT_TRUE(c.broadcast(data[c.rank()].data(), 2, 2).ok()); });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(data[r], (std::vector<float>{2.0f, 2.5f}));
}

// Many collectives back to back: a fast rank posting the next call must
// never disturb a slow rank still finishing the previous one.
TEST(SimulatedGroup, BackToBackCollectivesStayInStep) {
  constexpr int kRanks = 4;
  constexpr int kSteps = 300;
  auto group = make_group(kRanks);
  std::vector<float> last(kRanks);
  run_ranks(*group, [&](Communicator& c) {
    float v = 1.0f;
    std::vector<float> gathered(kRanks);
    for (int s = 0; s < kSteps; ++s) {
      float x = v * static_cast<float>(c.rank() + 1);
      ASSERT_TRUE(c.all_reduce_sum(&x, 1).ok());  // v * (1 + 2 + 3 + 4)
      ASSERT_TRUE(c.all_gather(&x, 1, gathered.data()).ok());
      for (float g : gathered) ASSERT_EQ(g, x);
      v = x / 10.0f;
    }
    last[c.rank()] = v;
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(last[r], 1.0f);
}

TEST(SimulatedGroup, DisagreeingRanksAllGetAnError) {
  constexpr int kRanks = 2;
  auto group = make_group(kRanks);
  std::vector<Status> status(kRanks);
  run_ranks(*group, [&](Communicator& c) {
    std::vector<float> buf(8, 1.0f);
    status[c.rank()] = c.all_reduce_sum(buf.data(), c.rank() == 0 ? 8 : 4);
  });
  for (const Status& s : status) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("all_reduce_sum(n=8"), std::string::npos) << s.error().message;
    EXPECT_NE(s.error().message.find("all_reduce_sum(n=4"), std::string::npos) << s.error().message;
  }
  // The group is still usable afterwards.
  run_ranks(*group, [&](Communicator& c) {
    float x = 2.0f;
    ASSERT_TRUE(c.all_reduce_sum(&x, 1).ok());
    EXPECT_EQ(x, 4.0f);
  });
}

}  // namespace
}  // namespace rill
