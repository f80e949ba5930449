#pragma once
// PrefixTree: the prefix cache's index. A radix tree over chained block
// hashes: the key of a full block is
//   key(parent) -> hash64(block_size token ids, seed = hash64({parent key, ns}))
// (XXH3 via core/hash.h), with the per-namespace root key = hash64(ns). The
// namespace (adapter set + model config fingerprint) is mixed into every key
// and every namespace has its own root, so namespaces never share blocks.
// Each node also keeps its token ids, so a hash collision is a miss, never
// wrong KV.
//
// Only full blocks are ever cached. The tree owns the pool's "cached" flag:
// a block is cached in the pool exactly when it is a node of this tree.
// When the pool evicts a cached block (LRU, unreferenced) the tree drops its
// node. Requests release chains tail-first (release_tail_first), so the
// evicted block is normally a leaf; if it is an inner node its descendants
// are unreachable and are dropped too (idle ones return to the free list at
// once, referenced ones when released).
//
// Hollow nodes: a node may hold no block (block -1). Only the cache tiers
// make them: a sliding-window group's run keeps only the blocks that resuming
// at its end reads (first_needed_block, model/kv_spec.h), and restoring it
// still needs the whole chain of keys from the root, so the blocks before
// the window are restored as hollow nodes. match() gives an empty lease (a
// hole) for a hollow node and the caller decides whether the holes are dead
// for its resume point (KvManager::admit). A hollow node is never a leaf: it
// goes when its last child does; insert() fills it when a computed block for
// it comes along.
//
// Not thread-safe; the engine thread owns it. Requires the pool to outlive
// the tree; the tree installs the pool's eviction callback and removes it
// (uncaching every block it holds) when destroyed.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_pool.h"

namespace rill {

// The longest cached prefix of a token sequence.
struct PrefixMatch {
  std::vector<BlockLease> blocks;  // one lease per matched block, in order; empty for a hollow node
  int32_t n_tokens = 0;            // blocks.size() * block_size

  std::vector<int32_t> block_ids() const;  // -1 for hollow nodes
};

class PrefixTree {
 public:
  explicit PrefixTree(BlockPool& pool);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // The longest chain of cached full blocks that prefixes `tokens` in
  // namespace ns, with a lease on each (so none can be evicted while the
  // caller holds them). Only whole blocks match: a trailing partial block is
  // ignored. The caller trims: to keep at least one token to compute (there
  // must be logits to sample) pass the prompt without its last token, so a
  // fully cached prompt still recomputes its final token.
  PrefixMatch match(uint64_t ns, std::span<const int32_t> tokens);

  // The block ids of the same chain as match() finds (-1 for hollow
  // nodes), without leases and without touching the pool: for a spill hook,
  // which must not change the pool. The ids are valid only until the pool
  // next evicts.
  std::vector<int32_t> find_chain(uint64_t ns, std::span<const int32_t> tokens) const;

  // Registers computed full blocks: block_ids[i] holds the KV of tokens
  // [i*bs, (i+1)*bs), or is -1 for a hollow node (see above). Requires
  // block_ids.size() <= tokens.size() / bs and that the caller holds a lease
  // on every block in block_ids (the ones it got from match() included). A
  // block whose key is already cached under another block id is left alone
  // (the caller's copy stays uncached and is freed on release); the chain
  // continues below the existing node. A block whose key is a hollow node
  // fills it. Insertion stops early at a block id that is already cached
  // elsewhere or at a hash collision; hollow nodes left as leaves then go.
  // Returns the number of blocks newly cached.
  int32_t insert(uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> block_ids);

  // Drops the node holding `block` and its descendants. Called by the pool's
  // eviction callback (the block is then unreferenced and already free);
  // requires that `block` is a node of this tree. The spill hook, when set,
  // sees the chain from the root to `block` first.
  void evict(int32_t block);

  // Called on eviction, before the node is dropped, with its namespace and
  // the whole chain from the root down to the evicted block, continued down
  // its deepest descendant path (dropped with it): tokens [n * block_size]
  // and block ids [n] (-1 for hollow nodes). Every block of the chain still
  // holds its KV (the evicted one is free but not yet handed out). The hook
  // may read KV and the tree (find_chain); it must not allocate or change
  // the pool or the tree.
  using SpillHook = std::function<void(uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> blocks)>;
  void set_spill_hook(SpillHook hook) { spill_ = std::move(hook); }

  // The key of each full block of `tokens` under ns, as the tree computes
  // them: keys[i] identifies the chain of blocks 0..i. Cache tiers index
  // their runs by these keys.
  static std::vector<uint64_t> chain_keys(uint64_t ns, std::span<const int32_t> tokens, int32_t block_size);

  // Number of cached blocks (nodes, roots and hollow nodes excluded).
  int32_t n_nodes() const { return n_nodes_; }
  int32_t n_hollow() const { return n_hollow_; }
  // Verifies: every node's key recomputes from its parent key, tokens and
  // namespace; child/parent links agree; the block->node index matches the
  // nodes; a block is cached in the pool exactly when it is a node.
  Status check_integrity() const;

 private:
  struct Node {
    uint64_t key = 0;
    int32_t block = -1;  // -1 for a namespace root or a hollow node
    Node* parent = nullptr;
    std::vector<int32_t> tokens;  // block_size ids; empty for a root
    std::unordered_map<uint64_t, std::unique_ptr<Node>> children;
  };

  static uint64_t block_key(uint64_t parent_key, uint64_t ns, std::span<const int32_t> block_tokens);
  static uint64_t root_key(uint64_t ns);
  // Blocks on node's longest path down (0 for a leaf), and its first child
  // on such a path (nullptr for a leaf).
  static int32_t height(const Node& node);
  static const Node* deepest_child(const Node& node);
  Node* root(uint64_t ns, bool create);
  // Unindexes and uncaches node and its descendants (does not free them).
  void drop_subtree(Node* node);
  // Removes `node` and then its ancestors while each is a hollow leaf, and
  // the namespace root when it is left empty.
  void prune_hollow(Node* node, uint64_t ns);
  static bool hollow(const Node& n) { return n.parent != nullptr && n.block < 0; }
  static void destroy(std::unique_ptr<Node> node);
  Status check_node(const Node& node, uint64_t ns, int32_t* n_seen, int32_t* n_hollow_seen) const;

  BlockPool& pool_;
  int32_t block_size_;
  int32_t n_nodes_ = 0, n_hollow_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Node>> roots_;  // by namespace
  std::vector<Node*> node_of_block_;                           // by block id
  std::vector<uint64_t> ns_of_block_;                          // by block id
  SpillHook spill_;
  std::vector<int32_t> spill_tokens_, spill_blocks_;  // scratch for the hook
};

}  // namespace rill
