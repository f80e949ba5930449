#pragma once
// KvManager: per-sequence KV bookkeeping over one BlockPool + PrefixTree +
// StatePool, for any layout declared as a KvSpec (list of layer groups).
//
// Per sequence and per attention group (full / sliding) it keeps a block
// table: entry i holds the KV of positions [i*bs, (i+1)*bs); -1 is a hole (a
// sliding group's block wholly outside the window, already given back). Per
// recurrent group it holds one StateSlot. Every attention group draws from
// the same pool and caches in the same tree under its own namespace
// (group_ns(ns, g)), so groups never share blocks.
//
// Protocol (engine thread, not thread-safe):
//   begin_step()                   a new step is being planned
//   admit(seq, ns, prompt)         matched prefix; the sequence's length is
//                                  the matched token count
//   append(seq, n)                 reserve slots for the next n tokens; all
//                                  tokens appended before are computed
//   commit_full_blocks(seq, toks)  after computing: cache the full blocks
//   release(seq) / preempt(seq)    give everything back, tail first
//
// Prefix caching and layouts: a prefix is reused only when every attention
// group matches it (the common length of the per-group matches).
//
// Recurrent groups (at most one is checkpointed) resume from checkpoints:
// the StatePool's checkpoint slots hold snapshots of a sequence's state at
// block boundaries, keyed by the block id of the first full-attention group
// (the "key group") that ends there. append() plans which boundaries of the
// new tokens get one (state_saves(): every checkpoint_every-th block, and
// the prompt's last full block) and the model fills them while computing
// the step; a block's checkpoint is dropped when the block id is allocated
// again. admit() then trims the attention match down to the longest prefix
// whose last block has a checkpoint and reports it (state_restore()) so the
// model loads it into the sequence's state slot before its first step
// (which the scheduler runs in the admitting step). Without checkpoint
// slots, or without an attention group, a recurrent model reuses nothing.
// Checkpoint slots are recycled least recently used, never two in one step
// (begin_step()); memory stays at n_checkpoints states.
#include <climits>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/result.h"
#include "kv/block_pool.h"
#include "kv/prefix_tree.h"
#include "kv/state_pool.h"
#include "model/kv_spec.h"

namespace rill {

struct Admission {
  int32_t n_cached_tokens = 0;  // prompt tokens whose KV is reused (< prompt size)
  // Matched block ids per group (empty for recurrent groups); the manager
  // holds their leases in the sequence's block tables, except a sliding
  // group's blocks already outside the window, given back at once (holes).
  std::vector<std::vector<int32_t>> cached_blocks;
  int32_t state_restore = -1;  // checkpoint holding the recurrent state after the cached prefix; -1: none
};

// A recurrent-state checkpoint the planned step must take: the state right
// after position `pos` goes into checkpoint slot `checkpoint`.
struct CheckpointSave {
  int32_t pos = 0;
  int32_t checkpoint = 0;
};

class KvManager {
 public:
  // spec: at least one group; sliding windows >= 1. The pool, tree and state
  // pool must outlive the manager; the tree must be over `pool`.
  // checkpoint_every: recurrent checkpoints at every n-th block boundary
  // (>= 1) besides the prompt's last full block.
  KvManager(KvSpec spec, BlockPool& pool, PrefixTree& tree, StatePool& states, int32_t checkpoint_every = 8);
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  // Registers `seq` (must be new) in namespace ns and matches the longest
  // cached prefix of `prompt` that leaves at least one token to compute and
  // holds at most max_cached tokens.
  // Errors (nothing changes): empty prompt, seq already present, a prompt
  // that could never fit in the pool even alone, no free state slot.
  Result<Admission> admit(int64_t seq, uint64_t ns, std::span<const int32_t> prompt, int32_t max_cached = INT32_MAX);

  // True when append(seq, n) would succeed. Conservative: blocks a sliding
  // group will give back during the append are not counted as available.
  bool can_allocate(int64_t seq, int32_t n_new_tokens) const;
  // Blocks append(seq, n) would take from the pool (before sliding frees).
  int32_t blocks_needed(int64_t seq, int32_t n_new_tokens) const;
  // Grows the sequence by n >= 0 tokens: first gives back sliding blocks no
  // future token can attend to, then allocates the missing blocks of every
  // attention group. When blocks run out it fails without allocating (the
  // dead sliding blocks are given back either way: that is always valid).
  // n_draft > 0 (speculative decoding): the last n_draft tokens are drafts;
  // with a recurrent group the step also saves the state after each of the
  // n_draft positions before the last (the pool's verify states, or a
  // prefix checkpoint planned at the same position), so truncate() can
  // roll the state back. Fails (nothing changes) when the pool has fewer
  // verify states.
  Status append(int64_t seq, int32_t n_tokens, int32_t n_draft = 0);

  // Shrinks the sequence to its first n_tokens (speculative decoding: the
  // KV of rejected draft tokens), giving back the blocks past them tail
  // first. Requires n_tokens <= length(seq), n_tokens to keep every block
  // offered to the prefix cache (shared blocks are never rewritten). The
  // partial tail block kept is rewritten by the next append's tokens. With
  // a recurrent group, n_tokens must end at a position the last append saved
  // (its drafts, see append()): that state becomes the pending restore
  // (state_restore(), read by the next step), and the prefix checkpoints of
  // blocks no longer full (their state saw rejected tokens) are dropped.
  Status truncate(int64_t seq, int32_t n_tokens);

  // `tokens` are the sequence's tokens so far (size <= length, all
  // computed). Inserts each attention group's full blocks not offered
  // before into the prefix tree. A sliding group's chain continues past its
  // holes while the tree still holds the dropped blocks (commit every step
  // so blocks are offered before they leave the window). Returns the number
  // of blocks newly cached over all groups.
  Result<int32_t> commit_full_blocks(int64_t seq, std::span<const int32_t> tokens);

  // Gives back all of seq's blocks (tail first) and its state slots. No-op
  // for an unknown seq.
  void release(int64_t seq);
  // release(), returning how many leading tokens were offered to the prefix
  // cache in every group (an upper bound on what a resume will match: LRU
  // eviction may take some, and a recurrent group resumes only at a
  // checkpoint; 0 with a recurrent group that cannot be checkpointed).
  int32_t preempt(int64_t seq);

  // Starts planning a step: checkpoints taken from now on are never
  // recycled by another save of the same step.
  void begin_step() { step_stamp_ = states_.clock() + 1; }
  // The checkpoint to load into seq's recurrent state before its next step
  // (set by admit() on a hit, cleared by commit_full_blocks()); -1: none.
  int32_t state_restore(int64_t seq) const;
  // The checkpoints seq's planned step (its last append) must take, by
  // position; cleared by commit_full_blocks().
  std::span<const CheckpointSave> state_saves(int64_t seq) const;
  // True when recurrent prefixes can be reused (see above).
  bool checkpoints_enabled() const;

  bool contains(int64_t seq) const { return seqs_.count(seq) != 0; }
  int32_t n_sequences() const { return static_cast<int32_t>(seqs_.size()); }
  int32_t length(int64_t seq) const;  // tokens; 0 for an unknown seq
  // Block ids in position order, -1 for holes; empty for unknown seq or a
  // recurrent group.
  std::vector<int32_t> block_table(int64_t seq, int32_t group = 0) const;
  // Appends the same entries to `out` (no allocation once `out` has grown);
  // returns how many were appended.
  int32_t append_block_table(int64_t seq, int32_t group, std::vector<int32_t>& out) const;
  // Live state slot of a recurrent group, -1 otherwise.
  int32_t state_slot(int64_t seq, int32_t group) const;
  // Blocks an allocation can take now (free + evictable cached).
  int32_t n_free_blocks() const { return pool_.n_free() + pool_.n_cached(); }
  const KvSpec& spec() const { return spec_; }
  // The prefix-tree namespace of attention group g under request namespace ns.
  static uint64_t group_ns(uint64_t ns, int32_t group);

  // KV tails (Model::n_kv_tail_slots(), k4c): `tails`' live slots, one
  // leased per sequence from admit() to release / preempt (admit() fails
  // when none is free). Call before the first admit(); the pool must
  // outlive the manager. Without: no sequence holds one.
  void set_tail_pool(StatePool* tails) { tails_ = tails; }
  // seq's KV tail slot; -1 without a tail pool or for an unknown seq.
  int32_t kv_tail_slot(int64_t seq) const;

  // Verifies pool, tree, state pool, and the manager's own invariants:
  // tables cover exactly ceil(length/bs) blocks, holes only in sliding
  // groups and only outside the window, every held block is used in the
  // pool with refcount >= the manager's leases on it, one state slot per
  // sequence per recurrent group and no other leased slots.
  Status check_integrity() const;

 private:
  struct Group {
    std::vector<BlockLease> blocks;  // invalid lease = hole
    int32_t n_offered = 0;           // leading blocks offered to the tree
    StateSlot state;                 // recurrent groups only
  };
  struct Sequence {
    uint64_t ns = 0;
    int32_t n_tokens = 0;
    int32_t n_prompt = 0;
    int32_t restore = -1;               // pending checkpoint restore
    bool restore_pinned = false;        // restore is a prefix checkpoint pinned by truncate()
    std::vector<CheckpointSave> saves;  // of the planned step
    // The last append's drafts: verify_states[j] holds the state after
    // position verify_from + j (append()).
    int32_t verify_from = 0;
    std::vector<int32_t> verify_states;
    std::vector<Group> groups;
    StateSlot tail;  // the KV tail slot (set_tail_pool())
  };

  int32_t blocks_for(int32_t n_tokens) const;
  // Blocks of a sliding group that no token at position >= n_tokens attends to.
  int32_t n_dead_blocks(const LayerGroupSpec& g, int32_t n_tokens) const;
  bool has_recurrent() const;
  // The deepest m <= k at which every attention group's match holds the
  // blocks resuming at m reads (first_needed_block): holes (hollow nodes)
  // may only lie before them.
  int32_t deepest_resumable(const std::vector<PrefixMatch>& matches, int32_t k) const;
  // Whether the boundary after block k (1-based count of full blocks) gets a checkpoint.
  bool wants_checkpoint(const Sequence& s, int32_t k) const;
  void plan_checkpoints(Sequence& s, int32_t n_before);
  void plan_verify_saves(Sequence& s, int32_t n_draft);
  void clear_restore(Sequence& s);
  void move_duplicate_checkpoints(const Group& grp, uint64_t gns, std::span<const int32_t> tokens, int32_t first,
                                  int32_t end);

  KvSpec spec_;
  int32_t key_group_ = -1;  // first full (else attention) group; -1: none
  int32_t checkpoint_every_ = 8;
  uint64_t step_stamp_ = UINT64_MAX;
  BlockPool& pool_;
  PrefixTree& tree_;
  StatePool& states_;
  StatePool* tails_ = nullptr;
  int32_t bs_;
  std::unordered_map<int64_t, Sequence> seqs_;
};

}  // namespace rill
