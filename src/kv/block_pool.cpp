#include "kv/block_pool.h"

#include <cassert>
#include <string>

namespace rill {

BlockLease& BlockLease::operator=(BlockLease&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = other.pool_;
    block_ = other.block_;
    other.pool_ = nullptr;
  }
  return *this;
}

void BlockLease::release() {
  if (pool_ == nullptr) return;
  BlockPool* pool = pool_;
  pool_ = nullptr;
  pool->release(block_);
}

void release_tail_first(std::vector<BlockLease>& leases) {
  for (auto it = leases.rbegin(); it != leases.rend(); ++it) it->release();
  leases.clear();
}

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size)
    : block_size_(block_size),
      refcount_(n_blocks, 0),
      cached_(n_blocks, 0),
      lru_prev_(n_blocks + 1, -1),
      lru_next_(n_blocks + 1, -1) {
  assert(n_blocks >= 1 && block_size >= 1);
  free_.reserve(n_blocks);
  // Stack order: block 0 is handed out first.
  for (int32_t b = n_blocks - 1; b >= 0; --b) free_.push_back(b);
  lru_prev_[n_blocks] = lru_next_[n_blocks] = n_blocks;  // empty ring
}

void BlockPool::lru_push_back(int32_t block) {
  const int32_t s = n_blocks();
  const int32_t last = lru_prev_[s];
  lru_prev_[block] = last;
  lru_next_[block] = s;
  lru_next_[last] = block;
  lru_prev_[s] = block;
  ++n_lru_;
}

void BlockPool::lru_remove(int32_t block) {
  assert(lru_next_[block] >= 0);
  lru_next_[lru_prev_[block]] = lru_next_[block];
  lru_prev_[lru_next_[block]] = lru_prev_[block];
  lru_prev_[block] = lru_next_[block] = -1;
  --n_lru_;
}

void BlockPool::evict_one() {
  const int32_t victim = lru_next_[n_blocks()];
  assert(victim != n_blocks() && "evict_one on an empty LRU list");
  lru_remove(victim);
  cached_[victim] = 0;
  free_.push_back(victim);
  if (on_evict_) {
    in_evict_callback_ = true;
    on_evict_(victim);
    in_evict_callback_ = false;
  }
}

Result<std::vector<BlockLease>> BlockPool::allocate(int32_t n) {
  assert(!in_evict_callback_ && n >= 0);
  if (!can_allocate(n)) {
    return Error{"kv block pool: cannot allocate " + std::to_string(n) + " blocks: " + std::to_string(n_free()) +
                 " free + " + std::to_string(n_cached()) + " evictable of " + std::to_string(n_blocks())};
  }
  std::vector<BlockLease> out;
  out.reserve(n);
  while (static_cast<int32_t>(out.size()) < n) {
    // Evicting one block may free more (the tree drops its subtree), never
    // fewer, so the can_allocate check above guarantees progress.
    if (free_.empty()) evict_one();
    const int32_t b = free_.back();
    free_.pop_back();
    assert(refcount_[b] == 0 && !cached_[b]);
    refcount_[b] = 1;
    out.push_back(BlockLease(this, b));
  }
  return out;
}

BlockLease BlockPool::acquire(int32_t block) {
  assert(!in_evict_callback_);
  assert(!is_free(block) && "acquire of a free block");
  if (refcount_[block] == 0) lru_remove(block);
  ++refcount_[block];
  return BlockLease(this, block);
}

void BlockPool::mark_cached(int32_t block) {
  assert(refcount_[block] > 0 && !cached_[block]);
  cached_[block] = 1;
}

void BlockPool::uncache(int32_t block) {
  assert(cached_[block]);
  cached_[block] = 0;
  if (refcount_[block] == 0) {
    lru_remove(block);
    free_.push_back(block);
  }
}

void BlockPool::release(int32_t block) {
  assert(refcount_[block] > 0);
  if (--refcount_[block] > 0) return;
  if (cached_[block]) {
    lru_push_back(block);
  } else {
    free_.push_back(block);
  }
}

std::vector<int32_t> BlockPool::lru_order() const {
  std::vector<int32_t> out;
  for (int32_t b = lru_next_[n_blocks()]; b != n_blocks() && static_cast<int32_t>(out.size()) <= n_blocks();
       b = lru_next_[b]) {
    out.push_back(b);
  }
  return out;
}

Status BlockPool::check_integrity() const {
  const int32_t n = n_blocks();
  auto fail = [](const std::string& what) { return Status(Error{"kv block pool integrity: " + what}); };
  std::vector<uint8_t> on_free(n, 0), on_lru(n, 0);
  for (int32_t b : free_) {
    if (b < 0 || b >= n) return fail("free list holds bad id " + std::to_string(b));
    if (on_free[b]++) return fail("block " + std::to_string(b) + " twice on the free list");
  }
  // Walk the ring forward with a step bound (a corrupted ring must not hang).
  int32_t n_walked = 0;
  for (int32_t b = lru_next_[n]; b != n; b = lru_next_[b]) {
    if (b < 0 || b > n || ++n_walked > n) return fail("LRU list is corrupted");
    if (on_lru[b]++) return fail("block " + std::to_string(b) + " twice on the LRU list");
    if (lru_prev_[lru_next_[b]] != b) return fail("LRU links broken at block " + std::to_string(b));
  }
  if (n_walked != n_lru_) return fail("LRU count " + std::to_string(n_lru_) + " != walked " + std::to_string(n_walked));
  for (int32_t b = 0; b < n; ++b) {
    const std::string id = "block " + std::to_string(b);
    if (refcount_[b] < 0) return fail(id + " has negative refcount");
    const int places = (refcount_[b] > 0) + on_free[b] + on_lru[b];
    if (places != 1) return fail(id + " is in " + std::to_string(places) + " of {free, LRU, referenced}");
    if (on_free[b] && cached_[b]) return fail(id + " is on the free list but cached");
    if (on_lru[b] && !cached_[b]) return fail(id + " is on the LRU list but not cached");
    if (!on_lru[b] && lru_next_[b] != -1) return fail(id + " has stale LRU links");
  }
  return Status::Ok();
}

}  // namespace rill
