#pragma once
// BlockPool: the paged KV cache's block allocator (ids only; the K/V storage
// lives with the backend and is indexed by these ids).
//
// Every block is in exactly one state:
//   free    refcount 0, holds nothing worth keeping       -> free list
//   cached  refcount 0, holds a full hashed prefix block  -> LRU list
//   used    refcount > 0 (cached or not)                  -> neither list
// A block becomes "cached" only through mark_cached() (the PrefixTree calls
// it when it registers the block). When its last lease is released a cached
// block goes to the back of the LRU list instead of the free list; allocate()
// evicts from the front (least recently released) when the free list is
// empty, and calls the eviction callback so the prefix tree drops the block.
//
// Not thread-safe: the engine thread owns the pool. The pool must outlive
// every BlockLease and is neither copyable nor movable (leases point to it).
#include <cstdint>
#include <functional>
#include <vector>

#include "core/result.h"

namespace rill {

class BlockPool;

// One reference on one block. Move-only; releases the reference when
// destroyed or on release(). A default-constructed or moved-from lease holds
// nothing.
class BlockLease {
 public:
  BlockLease() = default;
  BlockLease(BlockLease&& other) noexcept : pool_(other.pool_), block_(other.block_) { other.pool_ = nullptr; }
  BlockLease& operator=(BlockLease&& other) noexcept;
  BlockLease(const BlockLease&) = delete;
  BlockLease& operator=(const BlockLease&) = delete;
  ~BlockLease() { release(); }

  bool valid() const { return pool_ != nullptr; }
  // Requires valid().
  int32_t block() const { return block_; }
  // Drops the reference now; the lease becomes empty. No-op when empty.
  void release();

 private:
  friend class BlockPool;
  BlockLease(BlockPool* pool, int32_t block) : pool_(pool), block_(block) {}
  BlockPool* pool_ = nullptr;
  int32_t block_ = -1;
};

// Releases a chain of leases last-first, so that the tail blocks of a prefix
// enter the LRU list before their parents and are evicted first (the prefix
// tree then loses leaves, not inner nodes). Leaves `leases` empty.
void release_tail_first(std::vector<BlockLease>& leases);

class BlockPool {
 public:
  // Called with a block that allocate() is evicting from the LRU list. On
  // entry the block is already free (refcount 0, not cached, on the free
  // list). The callback may call uncache() on other blocks but must not call
  // allocate() or acquire().
  using EvictCallback = std::function<void(int32_t block)>;

  static constexpr int32_t kDefaultBlockSize = 16;

  // n_blocks >= 1 blocks with ids 0..n_blocks-1, all free; block_size tokens
  // per block (>= 1).
  explicit BlockPool(int32_t n_blocks, int32_t block_size = kDefaultBlockSize);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // n fresh blocks (refcount 1, not cached), taken from the free list first,
  // then by evicting cached blocks in LRU order. Fails without changing
  // anything when n > n_free() + n_cached().
  Result<std::vector<BlockLease>> allocate(int32_t n);
  // True when allocate(n) would succeed.
  bool can_allocate(int32_t n) const { return n <= n_free() + n_cached(); }

  // A new reference on a block that is cached (refcount 0 or more) or used.
  // A cached block with refcount 0 leaves the LRU list. Requires
  // !is_free(block).
  BlockLease acquire(int32_t block);

  // Marks a used block as holding a full hashed prefix block: when its last
  // reference is released it goes to the LRU list. Requires refcount > 0 and
  // !is_cached(block).
  void mark_cached(int32_t block);
  // Undoes mark_cached: a block in the LRU list moves to the free list; a
  // used block will go to the free list when released. Requires
  // is_cached(block).
  void uncache(int32_t block);

  void set_evict_callback(EvictCallback callback) { on_evict_ = std::move(callback); }

  int32_t n_blocks() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t block_size() const { return block_size_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t n_cached() const { return n_lru_; }  // unreferenced, evictable
  int32_t n_used() const { return n_blocks() - n_free() - n_cached(); }
  int32_t refcount(int32_t block) const { return refcount_[block]; }
  bool is_cached(int32_t block) const { return cached_[block]; }
  bool is_free(int32_t block) const { return refcount_[block] == 0 && !cached_[block]; }
  // Blocks in LRU order, least recently released first (for tests and stats).
  std::vector<int32_t> lru_order() const;

  // Verifies that every block is in exactly one of free list, LRU list,
  // referenced, and that list membership matches refcount and cached flag.
  Status check_integrity() const;

 private:
  friend class BlockLease;
  void release(int32_t block);
  void lru_push_back(int32_t block);
  void lru_remove(int32_t block);
  void evict_one();

  int32_t block_size_;
  std::vector<int32_t> refcount_;
  std::vector<uint8_t> cached_;
  std::vector<int32_t> free_;  // stack of free block ids
  // Intrusive doubly linked LRU list; index n_blocks() is the sentinel, so
  // no allocation happens on acquire/release. -1 = not in the list.
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t n_lru_ = 0;
  bool in_evict_callback_ = false;
  EvictCallback on_evict_;
};

}  // namespace rill
