#include "kv/prefix_tree.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "core/hash.h"

namespace rill {

namespace {
constexpr uint64_t kRootSeed = 0x72696c6c2d6b7630ull;  // "rill-kv0"
}  // namespace

std::vector<int32_t> PrefixMatch::block_ids() const {
  std::vector<int32_t> ids;
  ids.reserve(blocks.size());
  for (const auto& l : blocks) ids.push_back(l.valid() ? l.block() : -1);
  return ids;
}

PrefixTree::PrefixTree(BlockPool& pool)
    : pool_(pool),
      block_size_(pool.block_size()),
      node_of_block_(pool.n_blocks(), nullptr),
      ns_of_block_(pool.n_blocks(), 0) {
  pool_.set_evict_callback([this](int32_t block) { evict(block); });
}

PrefixTree::~PrefixTree() {
  pool_.set_evict_callback(nullptr);
  for (auto& [ns, root] : roots_) {
    for (auto& [key, child] : root->children) drop_subtree(child.get());
    destroy(std::move(root));
  }
}

void PrefixTree::destroy(std::unique_ptr<Node> node) {
  // Iterative, so freeing a chain thousands of blocks deep cannot overflow
  // the stack through nested destructors.
  std::vector<std::unique_ptr<Node>> doomed;
  doomed.push_back(std::move(node));
  while (!doomed.empty()) {
    std::unique_ptr<Node> n = std::move(doomed.back());
    doomed.pop_back();
    for (auto& [key, child] : n->children) doomed.push_back(std::move(child));
  }
}

uint64_t PrefixTree::root_key(uint64_t ns) {
  return hash64(&ns, sizeof ns, kRootSeed);
}

std::vector<uint64_t> PrefixTree::chain_keys(uint64_t ns, std::span<const int32_t> tokens, int32_t block_size) {
  std::vector<uint64_t> keys;
  uint64_t key = root_key(ns);
  for (size_t i = 0; block_size > 0 && i + static_cast<size_t>(block_size) <= tokens.size();
       i += static_cast<size_t>(block_size)) {
    key = block_key(key, ns, tokens.subspan(i, static_cast<size_t>(block_size)));
    keys.push_back(key);
  }
  return keys;
}

uint64_t PrefixTree::block_key(uint64_t parent_key, uint64_t ns, std::span<const int32_t> block_tokens) {
  const uint64_t seed_parts[2] = {parent_key, ns};
  const uint64_t seed = hash64(seed_parts, sizeof seed_parts);
  return hash64(block_tokens.data(), block_tokens.size_bytes(), seed);
}

PrefixTree::Node* PrefixTree::root(uint64_t ns, bool create) {
  auto it = roots_.find(ns);
  if (it != roots_.end()) return it->second.get();
  if (!create) return nullptr;
  auto node = std::make_unique<Node>();
  node->key = root_key(ns);
  Node* raw = node.get();
  roots_.emplace(ns, std::move(node));
  return raw;
}

int32_t PrefixTree::height(const Node& node) {
  int32_t h = 0;
  for (const auto& [key, child] : node.children) h = std::max(h, 1 + height(*child));
  return h;
}

const PrefixTree::Node* PrefixTree::deepest_child(const Node& node) {
  const Node* best = nullptr;
  int32_t best_height = -1;
  for (const auto& [key, child] : node.children) {
    const int32_t h = height(*child);
    if (h > best_height) best = child.get(), best_height = h;
  }
  return best;
}

std::vector<int32_t> PrefixTree::find_chain(uint64_t ns, std::span<const int32_t> tokens) const {
  std::vector<int32_t> ids;
  auto r = roots_.find(ns);
  if (r == roots_.end()) return ids;
  const Node* node = r->second.get();
  const size_t n_full = tokens.size() / block_size_;
  for (size_t i = 0; i < n_full; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    auto it = node->children.find(block_key(node->key, ns, block_tokens));
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    if (!std::equal(block_tokens.begin(), block_tokens.end(), child->tokens.begin())) break;  // collision
    ids.push_back(child->block);
    node = child;
  }
  return ids;
}

PrefixMatch PrefixTree::match(uint64_t ns, std::span<const int32_t> tokens) {
  PrefixMatch m;
  Node* node = root(ns, /*create=*/false);
  if (node == nullptr) return m;
  const size_t n_full = tokens.size() / block_size_;
  for (size_t i = 0; i < n_full; ++i) {
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    auto it = node->children.find(block_key(node->key, ns, block_tokens));
    if (it == node->children.end()) break;
    Node* child = it->second.get();
    if (!std::equal(block_tokens.begin(), block_tokens.end(), child->tokens.begin())) break;  // collision
    m.blocks.push_back(hollow(*child) ? BlockLease() : pool_.acquire(child->block));
    node = child;
  }
  m.n_tokens = static_cast<int32_t>(m.blocks.size()) * block_size_;
  return m;
}

int32_t PrefixTree::insert(uint64_t ns, std::span<const int32_t> tokens, std::span<const int32_t> block_ids) {
  assert(block_ids.size() <= tokens.size() / block_size_);
  Node* node = root(ns, /*create=*/true);
  int32_t n_inserted = 0;
  for (size_t i = 0; i < block_ids.size(); ++i) {
    const int32_t block = block_ids[i];
    assert((block < 0 || pool_.refcount(block) > 0) && "insert requires a lease on every block");
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t key = block_key(node->key, ns, block_tokens);
    auto it = node->children.find(key);
    if (it != node->children.end()) {
      Node* child = it->second.get();
      if (!std::equal(block_tokens.begin(), block_tokens.end(), child->tokens.begin())) break;  // collision
      if (hollow(*child) && block >= 0 && !pool_.is_cached(block)) {  // computed KV fills a hollow node
        child->block = block;
        node_of_block_[block] = child;
        ns_of_block_[block] = ns;
        pool_.mark_cached(block);
        --n_hollow_;
        ++n_nodes_;
        ++n_inserted;
      }
      node = child;  // already cached (maybe under another block id)
      continue;
    }
    if (block >= 0 && pool_.is_cached(block)) break;  // this id is a node elsewhere
    auto child = std::make_unique<Node>();
    child->key = key;
    child->block = block;
    child->parent = node;
    child->tokens.assign(block_tokens.begin(), block_tokens.end());
    if (block >= 0) {
      node_of_block_[block] = child.get();
      ns_of_block_[block] = ns;
      pool_.mark_cached(block);
      ++n_nodes_;
      ++n_inserted;
    } else {
      ++n_hollow_;
    }
    Node* raw = child.get();
    node->children.emplace(key, std::move(child));
    node = raw;
  }
  prune_hollow(node, ns);  // a chain may not end in hollow nodes; drops an unused root too
  return n_inserted;
}

void PrefixTree::prune_hollow(Node* node, uint64_t ns) {
  while (hollow(*node) && node->children.empty()) {
    Node* parent = node->parent;
    const uint64_t key = node->key;
    parent->children.erase(key);  // frees node
    --n_hollow_;
    node = parent;
  }
  if (node->parent == nullptr && node->children.empty()) roots_.erase(ns);
}

void PrefixTree::drop_subtree(Node* node) {
  // Iterative: chains can be thousands of blocks deep.
  std::vector<Node*> stack{node};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& [key, child] : n->children) stack.push_back(child.get());
    if (hollow(*n)) {
      --n_hollow_;
      continue;
    }
    node_of_block_[n->block] = nullptr;
    if (pool_.is_cached(n->block)) pool_.uncache(n->block);
    --n_nodes_;
  }
}

void PrefixTree::evict(int32_t block) {
  Node* node = node_of_block_[block];
  assert(node != nullptr && "evict of a block the tree does not hold");
  if (node == nullptr) return;
  const uint64_t ns = ns_of_block_[block];
  if (spill_) {
    // The chain root -> node, in order, then on down node's deepest
    // descendant path: those blocks are dropped with node, and they still
    // hold their KV (a sliding group gives its oldest blocks back first, so
    // its chains are evicted from the root).
    int32_t depth = 0;
    for (const Node* n = node; n->parent != nullptr; n = n->parent) ++depth;
    spill_tokens_.resize(static_cast<size_t>(depth) * static_cast<size_t>(block_size_));
    spill_blocks_.resize(static_cast<size_t>(depth));
    int32_t i = depth;
    for (const Node* n = node; n->parent != nullptr; n = n->parent) {
      --i;
      spill_blocks_[static_cast<size_t>(i)] = n->block;
      std::copy(n->tokens.begin(), n->tokens.end(), spill_tokens_.begin() + static_cast<ptrdiff_t>(i) * block_size_);
    }
    for (const Node* n = deepest_child(*node); n != nullptr; n = deepest_child(*n)) {
      spill_blocks_.push_back(n->block);
      spill_tokens_.insert(spill_tokens_.end(), n->tokens.begin(), n->tokens.end());
    }
    spill_(ns, spill_tokens_, spill_blocks_);
  }
  drop_subtree(node);  // the pool already cleared `block`'s cached flag
  Node* parent = node->parent;
  auto it = parent->children.find(node->key);
  std::unique_ptr<Node> owned = std::move(it->second);
  parent->children.erase(it);
  destroy(std::move(owned));
  prune_hollow(parent, ns);
}

Status PrefixTree::check_node(const Node& node, uint64_t ns, int32_t* n_seen, int32_t* n_hollow_seen) const {
  auto fail = [](const std::string& what) { return Status(Error{"kv prefix tree integrity: " + what}); };
  for (const auto& [key, child] : node.children) {
    const std::string id = "block " + std::to_string(child->block);
    if (child->key != key) return fail(id + " is filed under the wrong key");
    if (child->parent != &node) return fail(id + " has a wrong parent link");
    if (static_cast<int32_t>(child->tokens.size()) != block_size_) return fail(id + " does not hold a full block");
    if (block_key(node.key, ns, child->tokens) != key) return fail(id + " key does not match its tokens and parent");
    if (hollow(*child)) {
      if (child->children.empty()) return fail("a hollow node is a leaf");
      ++*n_hollow_seen;
      RILL_TRY(check_node(*child, ns, n_seen, n_hollow_seen));
      continue;
    }
    if (child->block >= pool_.n_blocks()) return fail(id + " is out of range");
    if (node_of_block_[child->block] != child.get()) return fail(id + " is not indexed (or indexed twice)");
    if (ns_of_block_[child->block] != ns) return fail(id + " has the wrong namespace");
    if (!pool_.is_cached(child->block)) return fail(id + " is a node but not cached in the pool");
    ++*n_seen;
    RILL_TRY(check_node(*child, ns, n_seen, n_hollow_seen));
  }
  return Status::Ok();
}

Status PrefixTree::check_integrity() const {
  int32_t n_seen = 0, n_hollow_seen = 0;
  for (const auto& [ns, root] : roots_) {
    if (root->parent != nullptr || root->block != -1) return Status(Error{"kv prefix tree integrity: bad root"});
    if (root->children.empty()) return Status(Error{"kv prefix tree integrity: empty root kept"});
    RILL_TRY(check_node(*root, ns, &n_seen, &n_hollow_seen));
  }
  if (n_hollow_seen != n_hollow_) {
    return Status(Error{"kv prefix tree integrity: " + std::to_string(n_hollow_seen) + " hollow nodes reachable, " +
                        std::to_string(n_hollow_) + " counted"});
  }
  if (n_seen != n_nodes_) {
    return Status(Error{"kv prefix tree integrity: " + std::to_string(n_seen) + " nodes reachable, " +
                        std::to_string(n_nodes_) + " counted"});
  }
  int32_t n_indexed = 0, n_cached = 0;
  for (int32_t b = 0; b < pool_.n_blocks(); ++b) {
    n_indexed += node_of_block_[b] != nullptr;
    n_cached += pool_.is_cached(b);
  }
  if (n_indexed != n_seen || n_cached != n_seen) {
    return Status(Error{"kv prefix tree integrity: " + std::to_string(n_seen) + " nodes, " + std::to_string(n_indexed) +
                        " indexed blocks, " + std::to_string(n_cached) + " cached blocks in the pool"});
  }
  return Status::Ok();
}

}  // namespace rill
