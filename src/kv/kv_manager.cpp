#include "kv/kv_manager.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <string>

#include "core/hash.h"

namespace rill {
namespace {

std::string seq_name(int64_t seq) {
  return "kv manager: sequence " + std::to_string(seq);
}

}  // namespace

KvManager::KvManager(KvSpec spec, BlockPool& pool, PrefixTree& tree, StatePool& states, int32_t checkpoint_every)
    : spec_(std::move(spec)),
      checkpoint_every_(std::max(1, checkpoint_every)),
      pool_(pool),
      tree_(tree),
      states_(states),
      bs_(pool.block_size()) {
  assert(!spec_.empty());
  for ([[maybe_unused]] const auto& g : spec_) assert(g.kind != LayerKind::kSliding || g.window >= 1);
  for (size_t g = 0; g < spec_.size(); ++g) {
    if (spec_[g].kind == LayerKind::kFull) {
      key_group_ = static_cast<int32_t>(g);
      break;
    }
    if (spec_[g].is_attention() && key_group_ < 0) key_group_ = static_cast<int32_t>(g);
  }
}

// Give everything back before the pool / tree / state pool go away.
KvManager::~KvManager() {
  while (!seqs_.empty()) release(seqs_.begin()->first);
}

uint64_t KvManager::group_ns(uint64_t ns, int32_t group) {
  const uint64_t parts[2] = {ns, static_cast<uint64_t>(group)};
  return hash64(parts, sizeof(parts));
}

int32_t KvManager::blocks_for(int32_t n_tokens) const {
  return (n_tokens + bs_ - 1) / bs_;
}

// The next token is at position n_tokens and attends to positions
// >= n_tokens - window + 1; block b is dead when (b+1)*bs <= that bound.
int32_t KvManager::n_dead_blocks(const LayerGroupSpec& g, int32_t n_tokens) const {
  return first_needed_block(g, n_tokens, bs_);
}

bool KvManager::has_recurrent() const {
  return std::any_of(spec_.begin(), spec_.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); });
}

bool KvManager::checkpoints_enabled() const {
  const auto n_recurrent =
      std::count_if(spec_.begin(), spec_.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); });
  return n_recurrent == 1 && key_group_ >= 0 && states_.n_checkpoints() > 0;
}

bool KvManager::wants_checkpoint(const Sequence& s, int32_t k) const {
  return k % checkpoint_every_ == 0 || k == s.n_prompt / bs_;
}

// The boundaries after positions k*bs - 1 in (n_before, n_tokens] that want
// a checkpoint, keyed by the key group's block k - 1. A failed take (every
// slot already used this step) skips that checkpoint.
void KvManager::plan_checkpoints(Sequence& s, int32_t n_before) {
  s.saves.clear();
  if (!checkpoints_enabled()) return;
  const auto& blocks = s.groups[static_cast<size_t>(key_group_)].blocks;
  for (int32_t k = n_before / bs_ + 1; k <= s.n_tokens / bs_; ++k) {
    if (!wants_checkpoint(s, k) || !blocks[static_cast<size_t>(k - 1)].valid()) continue;
    auto c = states_.take_checkpoint(blocks[static_cast<size_t>(k - 1)].block(), step_stamp_);
    if (c.ok()) s.saves.push_back({k * bs_ - 1, *c});
  }
}

Result<Admission> KvManager::admit(int64_t seq, uint64_t ns, std::span<const int32_t> prompt, int32_t max_cached) {
  if (prompt.empty()) return Error{seq_name(seq) + ": empty prompt"};
  if (contains(seq)) return Error{seq_name(seq) + ": already admitted"};
  const auto n_prompt = static_cast<int32_t>(prompt.size());
  // Never fits: the prompt prefilled in one step needs blocks_for(n_prompt)
  // blocks in every attention group at once (sliding groups give blocks
  // back only between steps).
  int64_t need = 0;
  for (const auto& g : spec_) need += g.is_attention() ? blocks_for(n_prompt) : 0;
  if (need > pool_.n_blocks()) {
    return Error{seq_name(seq) + ": a prompt of " + std::to_string(n_prompt) + " tokens needs " + std::to_string(need) +
                 " KV blocks but the pool has only " + std::to_string(pool_.n_blocks())};
  }
  if (has_recurrent() && states_.n_slots() == 0) {
    return Error{seq_name(seq) + ": the model has recurrent layers but the state pool has no slots"};
  }

  Sequence s;
  s.ns = ns;
  s.groups.resize(spec_.size());
  for (size_t g = 0; g < spec_.size(); ++g) {
    if (spec_[g].is_attention()) continue;
    auto slot = states_.acquire();
    if (!slot.ok()) return Error{seq_name(seq) + ": " + slot.error().message};  // s releases taken slots
    s.groups[g].state = std::move(slot).value();
  }
  if (tails_ && tails_->n_slots() > 0) {
    auto slot = tails_->acquire();
    if (!slot.ok()) return Error{seq_name(seq) + ": no free KV tail slot: " + slot.error().message};
    s.tail = std::move(slot).value();
  }

  // Match everything but the last prompt token (there must be logits to
  // sample). A recurrent state resumes only at a checkpointed boundary.
  int32_t common = 0;
  std::vector<PrefixMatch> matches(spec_.size());
  Admission out;
  if (!has_recurrent() || checkpoints_enabled()) {
    common = n_prompt;
    for (size_t g = 0; g < spec_.size(); ++g) {
      if (!spec_[g].is_attention()) continue;
      matches[g] = tree_.match(group_ns(ns, static_cast<int32_t>(g)), prompt.first(prompt.size() - 1));
      common = std::min(common, matches[g].n_tokens);
    }
  }
  // Resume where every group holds the blocks the next token reads (a
  // match may pass hollow nodes a cache tier restored) and, with a
  // recurrent group, where a checkpoint is; each trim may call for the other.
  int32_t k = std::min(common, std::max(0, max_cached)) / bs_;
  std::optional<int32_t> ckpt;
  for (;;) {
    const int32_t resumable = deepest_resumable(matches, k);
    k = resumable;
    if (!has_recurrent() || k == 0) break;
    const auto& key = matches[static_cast<size_t>(key_group_)].blocks;
    for (; k > 0; --k) {
      const BlockLease& l = key[static_cast<size_t>(k - 1)];
      if (l.valid() && (ckpt = states_.find_checkpoint(l.block()))) break;
    }
    if (k == resumable) break;
    ckpt.reset();
  }
  common = k * bs_;
  if (has_recurrent()) out.state_restore = k > 0 && ckpt ? *ckpt : -1;
  s.restore = out.state_restore;
  s.n_prompt = n_prompt;
  out.n_cached_tokens = common;
  out.cached_blocks.resize(spec_.size());
  const int32_t n_keep = common / bs_;
  for (size_t g = 0; g < spec_.size(); ++g) {
    auto& leases = matches[g].blocks;
    if (static_cast<int32_t>(leases.size()) > n_keep) {  // beyond the common prefix: tail first
      std::vector<BlockLease> extra(std::make_move_iterator(leases.begin() + n_keep),
                                    std::make_move_iterator(leases.end()));
      leases.resize(static_cast<size_t>(n_keep));
      release_tail_first(extra);
    }
    for (auto& l : leases) out.cached_blocks[g].push_back(l.block());
    Group& grp = s.groups[g];
    grp.blocks = std::move(leases);
    grp.n_offered = static_cast<int32_t>(grp.blocks.size());
    const int32_t n_dead = n_dead_blocks(spec_[g], common);
    for (int32_t b = std::min(n_dead, grp.n_offered) - 1; b >= 0; --b) grp.blocks[b].release();
  }
  s.n_tokens = common;
  seqs_.emplace(seq, std::move(s));
  return out;
}

int32_t KvManager::deepest_resumable(const std::vector<PrefixMatch>& matches, int32_t k) const {
  return rill::deepest_resumable(
      spec_, k, bs_, [&](size_t g, int32_t b) { return matches[g].blocks[static_cast<size_t>(b)].valid(); });
}

int32_t KvManager::blocks_needed(int64_t seq, int32_t n_new_tokens) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  const int32_t n_after = blocks_for(it->second.n_tokens + n_new_tokens);
  int32_t need = 0;
  for (size_t g = 0; g < spec_.size(); ++g) {
    if (spec_[g].is_attention()) need += n_after - static_cast<int32_t>(it->second.groups[g].blocks.size());
  }
  return need;
}

bool KvManager::can_allocate(int64_t seq, int32_t n_new_tokens) const {
  return contains(seq) && n_new_tokens >= 0 && pool_.can_allocate(blocks_needed(seq, n_new_tokens));
}

Status KvManager::append(int64_t seq, int32_t n_tokens, int32_t n_draft) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Error{seq_name(seq) + ": append to an unknown sequence"};
  if (n_tokens < 0) return Error{seq_name(seq) + ": append of a negative token count"};
  if (n_draft < 0 || n_draft >= std::max(1, n_tokens)) {
    return Error{seq_name(seq) + ": " + std::to_string(n_draft) + " drafts in an append of " +
                 std::to_string(n_tokens) + " tokens"};
  }
  if (has_recurrent() && n_draft > states_.n_spec_states()) {
    return Error{seq_name(seq) + ": " + std::to_string(n_draft) + " drafts but the recurrent state pool keeps " +
                 std::to_string(states_.n_spec_states()) + " verify states per sequence"};
  }
  Sequence& s = it->second;
  // Every appended token so far is computed, so blocks dead at the current
  // length can go back now (last first), before allocating.
  for (size_t g = 0; g < spec_.size(); ++g) {
    auto& blocks = s.groups[g].blocks;
    const int32_t n_dead = std::min(n_dead_blocks(spec_[g], s.n_tokens), static_cast<int32_t>(blocks.size()));
    for (int32_t b = n_dead - 1; b >= 0; --b) blocks[b].release();
  }
  const int32_t need = blocks_needed(seq, n_tokens);
  auto fresh = pool_.allocate(need);
  if (!fresh.ok()) {
    return Error{seq_name(seq) + ": cannot grow by " + std::to_string(n_tokens) + " tokens: " + fresh.error().message};
  }
  const int32_t n_after = blocks_for(s.n_tokens + n_tokens);
  size_t next = 0;
  for (size_t g = 0; g < spec_.size(); ++g) {
    if (!spec_[g].is_attention()) continue;
    auto& blocks = s.groups[g].blocks;
    while (static_cast<int32_t>(blocks.size()) < n_after) blocks.push_back(std::move(fresh.value()[next++]));
  }
  assert(next == fresh.value().size());
  // A fresh block id may still key a checkpoint of its previous contents.
  for (const BlockLease& l : fresh.value()) states_.drop_checkpoint(l.block());
  const int32_t n_before = s.n_tokens;
  s.n_tokens += n_tokens;
  plan_checkpoints(s, n_before);
  plan_verify_saves(s, n_draft);
  return Status::Ok();
}

// The state after each position in [n_tokens - 1 - n_draft, n_tokens - 1):
// the owed token's and every draft's but the last (the live slot ends after
// it). A position that already has a prefix checkpoint save reuses it (a
// step saves a position once).
void KvManager::plan_verify_saves(Sequence& s, int32_t n_draft) {
  s.verify_states.clear();
  if (n_draft == 0 || !has_recurrent()) return;
  int32_t slot = -1;
  for (size_t g = 0; g < spec_.size(); ++g) {
    if (!spec_[g].is_attention()) slot = s.groups[g].state.slot();
  }
  s.verify_from = s.n_tokens - 1 - n_draft;
  const size_t n_prefix_saves = s.saves.size();
  for (int32_t j = 0; j < n_draft; ++j) {
    const int32_t pos = s.verify_from + j;
    auto same = std::find_if(s.saves.begin(), s.saves.begin() + static_cast<std::ptrdiff_t>(n_prefix_saves),
                             [&](const CheckpointSave& v) { return v.pos == pos; });
    if (same != s.saves.begin() + static_cast<std::ptrdiff_t>(n_prefix_saves)) {
      s.verify_states.push_back(same->checkpoint);
      continue;
    }
    s.verify_states.push_back(states_.spec_state(slot, j));
    s.saves.push_back({pos, s.verify_states.back()});
  }
  std::sort(s.saves.begin(), s.saves.end(),
            [](const CheckpointSave& a, const CheckpointSave& b) { return a.pos < b.pos; });
}

void KvManager::clear_restore(Sequence& s) {
  if (s.restore_pinned) states_.set_pinned(s.restore, false);
  s.restore_pinned = false;
  s.restore = -1;
}

Result<int32_t> KvManager::commit_full_blocks(int64_t seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Error{seq_name(seq) + ": commit for an unknown sequence"};
  Sequence& s = it->second;
  if (static_cast<int32_t>(tokens.size()) > s.n_tokens) {
    return Error{seq_name(seq) + ": commit of " + std::to_string(tokens.size()) + " tokens but only " +
                 std::to_string(s.n_tokens) + " were appended"};
  }
  clear_restore(s);  // the step that needed it (and took the saves) has run
  s.saves.clear();
  const auto n_full = static_cast<int32_t>(tokens.size()) / bs_;
  int32_t n_new = 0;
  std::vector<int32_t> ids;
  for (size_t g = 0; g < spec_.size(); ++g) {
    Group& grp = s.groups[g];
    if (!spec_[g].is_attention() || grp.n_offered >= n_full) continue;
    const uint64_t gns = group_ns(s.ns, static_cast<int32_t>(g));
    // The tree takes a chain from the root. A sliding group's holes are a
    // prefix [0, n_holes): re-lease that part of the chain from the tree
    // (held while inserting, as insert requires); if the cache lost part of
    // it the chain is broken and nothing further can be offered.
    int32_t n_holes = 0;
    while (n_holes < n_full && !grp.blocks[n_holes].valid()) ++n_holes;
    PrefixMatch head;
    if (n_holes > 0) {
      head = tree_.match(gns, tokens.first(static_cast<size_t>(n_holes) * static_cast<size_t>(bs_)));
      if (head.n_tokens < n_holes * bs_) continue;
    }
    ids = head.block_ids();
    for (int32_t b = n_holes; b < n_full && grp.blocks[b].valid(); ++b) ids.push_back(grp.blocks[b].block());
    const auto n_ids = static_cast<int32_t>(ids.size());
    if (n_ids > grp.n_offered) {
      n_new += tree_.insert(gns, tokens.first(static_cast<size_t>(n_ids) * static_cast<size_t>(bs_)), ids);
      if (static_cast<int32_t>(g) == key_group_) move_duplicate_checkpoints(grp, gns, tokens, grp.n_offered, n_ids);
      grp.n_offered = n_ids;
    }
    release_tail_first(head.blocks);
  }
  return n_new;
}

Status KvManager::truncate(int64_t seq, int32_t n_tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Error{seq_name(seq) + ": truncate of an unknown sequence"};
  Sequence& s = it->second;
  if (n_tokens < 0 || n_tokens > s.n_tokens) {
    return Error{seq_name(seq) + ": truncate to " + std::to_string(n_tokens) + " of " + std::to_string(s.n_tokens) +
                 " tokens"};
  }
  const int32_t n_keep = blocks_for(n_tokens);
  for (Group& grp : s.groups) {
    if (grp.n_offered > n_keep) {
      return Error{seq_name(seq) + ": truncate to " + std::to_string(n_tokens) + " tokens would drop cached blocks"};
    }
  }
  if (has_recurrent() && n_tokens < s.n_tokens) {
    const int32_t j = n_tokens - 1 - s.verify_from;
    if (j < 0 || j >= static_cast<int32_t>(s.verify_states.size()) || s.restore >= 0) {
      return Error{seq_name(seq) + ": the recurrent state after position " + std::to_string(n_tokens - 1) +
                   " was not saved, so it cannot be truncated to " + std::to_string(n_tokens) + " tokens"};
    }
    s.restore = s.verify_states[static_cast<size_t>(j)];
    if (s.restore < states_.n_checkpoints()) {  // a prefix checkpoint: the next step's saves must not recycle it
      states_.set_pinned(s.restore, true);
      s.restore_pinned = true;
    }
    // A block past the accepted tokens (kept partial or given back) had its
    // checkpoint saved after rejected tokens.
    if (key_group_ >= 0) {
      const auto& blocks = s.groups[static_cast<size_t>(key_group_)].blocks;
      for (size_t b = static_cast<size_t>(n_tokens / bs_); b < blocks.size(); ++b) {
        if (blocks[b].valid()) states_.drop_checkpoint(blocks[b].block());
      }
    }
  }
  s.verify_states.clear();
  for (Group& grp : s.groups) {
    if (static_cast<int32_t>(grp.blocks.size()) <= n_keep) continue;
    std::vector<BlockLease> tail(std::make_move_iterator(grp.blocks.begin() + n_keep),
                                 std::make_move_iterator(grp.blocks.end()));
    grp.blocks.resize(static_cast<size_t>(n_keep));
    release_tail_first(tail);
  }
  s.n_tokens = n_tokens;
  return Status::Ok();
}

void KvManager::release(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  clear_restore(it->second);
  for (Group& grp : it->second.groups) {
    release_tail_first(grp.blocks);
    grp.state.release();
  }
  seqs_.erase(it);
}

int32_t KvManager::preempt(int64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return 0;
  int32_t n_cached = has_recurrent() && !checkpoints_enabled() ? 0 : it->second.n_tokens;
  for (size_t g = 0; g < spec_.size(); ++g) {
    if (spec_[g].is_attention()) n_cached = std::min(n_cached, it->second.groups[g].n_offered * bs_);
  }
  release(seq);
  return n_cached;
}

int32_t KvManager::length(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.n_tokens;
}

std::vector<int32_t> KvManager::block_table(int64_t seq, int32_t group) const {
  std::vector<int32_t> out;
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || group < 0 || group >= static_cast<int32_t>(spec_.size())) return out;
  for (const auto& l : it->second.groups[group].blocks) out.push_back(l.valid() ? l.block() : -1);
  return out;
}

int32_t KvManager::append_block_table(int64_t seq, int32_t group, std::vector<int32_t>& out) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || group < 0 || group >= static_cast<int32_t>(spec_.size())) return 0;
  for (const auto& l : it->second.groups[group].blocks) out.push_back(l.valid() ? l.block() : -1);
  return static_cast<int32_t>(it->second.groups[group].blocks.size());
}

// Blocks [first, end) of the key group were just offered. One the tree
// already held under another id (the same tokens computed twice, e.g. after
// a hit trimmed to an earlier checkpoint) stays uncached: its checkpoint
// moves to the cached twin, where a later match can find it.
void KvManager::move_duplicate_checkpoints(const Group& grp, uint64_t gns, std::span<const int32_t> tokens,
                                           int32_t first, int32_t end) {
  for (int32_t b = first; b < end; ++b) {
    const BlockLease& l = grp.blocks[static_cast<size_t>(b)];
    if (!l.valid() || pool_.is_cached(l.block()) || !states_.checkpoint_of(l.block())) continue;
    PrefixMatch twin = tree_.match(gns, tokens.first(static_cast<size_t>(b + 1) * static_cast<size_t>(bs_)));
    if (twin.n_tokens == (b + 1) * bs_) states_.move_checkpoint(l.block(), twin.blocks.back().block());
    release_tail_first(twin.blocks);
  }
}

int32_t KvManager::state_restore(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? -1 : it->second.restore;
}

std::span<const CheckpointSave> KvManager::state_saves(int64_t seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.saves;
}

int32_t KvManager::state_slot(int64_t seq, int32_t group) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || group < 0 || group >= static_cast<int32_t>(spec_.size())) return -1;
  const StateSlot& st = it->second.groups[group].state;
  return st.valid() ? st.slot() : -1;
}

int32_t KvManager::kv_tail_slot(int64_t seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() || !it->second.tail.valid() ? -1 : it->second.tail.slot();
}

Status KvManager::check_integrity() const {
  RILL_TRY(pool_.check_integrity());
  RILL_TRY(tree_.check_integrity());
  RILL_TRY(states_.check_integrity());
  std::vector<int32_t> held(static_cast<size_t>(pool_.n_blocks()), 0);
  int32_t n_slots = 0;
  for (const auto& [seq, s] : seqs_) {
    for (size_t g = 0; g < spec_.size(); ++g) {
      const Group& grp = s.groups[g];
      const std::string where = seq_name(seq) + " group " + std::to_string(g);
      if (!spec_[g].is_attention()) {
        if (!grp.state.valid() || !states_.is_leased(grp.state.slot())) return Error{where + ": no leased state slot"};
        if (!grp.blocks.empty()) return Error{where + ": recurrent group holds blocks"};
        ++n_slots;
        continue;
      }
      if (grp.state.valid()) return Error{where + ": attention group holds a state slot"};
      if (static_cast<int32_t>(grp.blocks.size()) != blocks_for(s.n_tokens)) {
        return Error{where + ": " + std::to_string(grp.blocks.size()) + " blocks for " + std::to_string(s.n_tokens) +
                     " tokens"};
      }
      if (grp.n_offered > static_cast<int32_t>(grp.blocks.size())) return Error{where + ": offered past the table"};
      const int32_t n_dead = n_dead_blocks(spec_[g], s.n_tokens);
      for (size_t b = 0; b < grp.blocks.size(); ++b) {
        if (!grp.blocks[b].valid()) {
          if (static_cast<int32_t>(b) >= n_dead) return Error{where + ": hole at live block " + std::to_string(b)};
          continue;
        }
        const int32_t id = grp.blocks[b].block();
        if (pool_.is_free(id) || pool_.refcount(id) <= 0) {
          return Error{where + ": block " + std::to_string(id) + " is not in use in the pool"};
        }
        ++held[static_cast<size_t>(id)];
      }
    }
  }
  for (const auto& [seq, s] : seqs_) {
    if (s.restore < -1 || s.restore >= states_.n_state_ids()) {
      return Error{seq_name(seq) + ": pending restore of checkpoint " + std::to_string(s.restore) + " does not exist"};
    }
    for (const CheckpointSave& v : s.saves) {
      const bool verify_state = v.checkpoint >= states_.n_checkpoints();  // at any position (append())
      if (v.checkpoint < 0 || v.checkpoint >= states_.n_state_ids() || v.pos >= s.n_tokens ||
          (!verify_state && (v.pos + 1) % bs_ != 0)) {
        return Error{seq_name(seq) + ": planned checkpoint " + std::to_string(v.checkpoint) + " after position " +
                     std::to_string(v.pos) + " is not at a block boundary of the sequence"};
      }
    }
  }
  for (int32_t b = 0; b < pool_.n_blocks(); ++b) {
    if (held[static_cast<size_t>(b)] > pool_.refcount(b)) {
      return Error{"kv manager: block " + std::to_string(b) + " held more times than its refcount"};
    }
  }
  // The manager is the state pool's only client.
  if (n_slots != states_.n_leased()) return Error{"kv manager: state slots leased outside any sequence"};
  if (tails_ && tails_->n_slots() > 0) {
    RILL_TRY(tails_->check_integrity());
    for (const auto& [seq, s] : seqs_) {
      if (!s.tail.valid() || !tails_->is_leased(s.tail.slot()))
        return Error{seq_name(seq) + ": no leased KV tail slot"};
    }
    if (n_sequences() != tails_->n_leased()) return Error{"kv manager: KV tail slots leased outside any sequence"};
  }
  return Status::Ok();
}

}  // namespace rill
