#pragma once
// Batch: the one flat structure that crosses from the scheduler to the model
// each step (see docs/architecture.md). Tokens of all sequences are laid end
// to end; sequence s owns tokens [seqs[s].q_start, q_start + q_len).
//
// KV is paged (Model::kv_block_size() tokens per block): sequence s's KV for
// positions [0, kv_len) lives in the physical blocks listed by its block
// table, block_table[seqs[s].table_start + i] holding positions
// [i*bs, (i+1)*bs). Entries of blocks no query can attend to (outside a
// sliding window) may be -1. Models with several KV groups (Model::kv_spec())
// read group g's table from group_tables[g - 1]; every group's table of a
// sequence has the same length and start.
#include <cstdint>
#include <span>
#include <vector>

namespace rill {

struct BatchSeq {
  int32_t q_start = 0;         // first token of this sequence in the flat arrays
  int32_t q_len = 0;           // tokens computed this step
  int32_t kv_len = 0;          // tokens in the cache after this step (= last position + 1)
  int32_t table_start = 0;     // first entry of this sequence's block table
  int32_t table_len = 0;       // entries, >= ceil(kv_len / block size)
  int32_t state_slot = -1;     // recurrent groups: the live state slot; -1 without
  int32_t state_restore = -1;  // checkpoint to load before the step; -1: none
  // Where the sequence's generated tokens start (its prompt length): a query
  // at a position >= decode_from is computed in the decode form of the ops
  // that have two (the llama.cpp-exact f16 attention on AVX-512), the others
  // in the prefill form, whatever the step's make-up. So a token's rows do
  // not depend on how its sequence was chunked, batched or recomputed after
  // preemption. -1 (callers that do not know): a one-token step is decode,
  // a longer one prefill, which is not batch invariant.
  int32_t decode_from = -1;
  // The sequence's KV tail slot (Model::n_kv_tail_slots(): models whose KV
  // types keep one, k4c): the q8_0 keys and values of its newest partial block. The
  // caller leases one per running sequence; -1 without.
  int32_t kv_tail = -1;
};

struct StateSave {
  int32_t seq = 0;         // index into Batch::seqs
  int32_t pos = 0;         // the state right after this position (within the step)
  int32_t checkpoint = 0;  // the model's checkpoint slot to fill
};

struct Batch {
  std::vector<int32_t> token_ids;                  // [n_tokens]
  std::vector<int32_t> positions;                  // [n_tokens]
  std::vector<int32_t> seq_index;                  // [n_tokens] -> index into seqs
  std::vector<BatchSeq> seqs;                      // [n_seqs]
  std::vector<int32_t> sample_rows;                // token indices whose logits are returned, in order
  std::vector<int32_t> block_table;                // group 0: all sequences' tables end to end
  std::vector<std::vector<int32_t>> group_tables;  // groups 1.. (same layout)
  std::vector<StateSave> state_saves;              // recurrent checkpoints to take this step
  std::vector<int32_t> pool_seqs;                  // sequences whose pooled embedding the step returns

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  std::span<const int32_t> table(int32_t group, const BatchSeq& s) const {
    const std::vector<int32_t>& t = group == 0 ? block_table : group_tables[static_cast<size_t>(group - 1)];
    return {t.data() + s.table_start, static_cast<size_t>(s.table_len)};
  }
  void clear() {
    token_ids.clear();
    positions.clear();
    seq_index.clear();
    seqs.clear();
    sample_rows.clear();
    block_table.clear();
    for (auto& t : group_tables) t.clear();
    state_saves.clear();
    pool_seqs.clear();
  }
  // Appends `n` tokens of one sequence at positions [pos0, pos0 + n) with
  // its group-0 block table; the last token samples when `sample_last`.
  // Returns the sequence's index (callers of multi-group models then append
  // the same number of entries to each group_tables[g]).
  int32_t add_sequence(const int32_t* ids, int32_t n, int32_t pos0, bool sample_last, std::span<const int32_t> table) {
    const int32_t s = static_cast<int32_t>(seqs.size());
    seqs.push_back(
        {n_tokens(), n, pos0 + n, static_cast<int32_t>(block_table.size()), static_cast<int32_t>(table.size())});
    block_table.insert(block_table.end(), table.begin(), table.end());
    for (int32_t i = 0; i < n; ++i) {
      token_ids.push_back(ids[i]);
      positions.push_back(pos0 + i);
      seq_index.push_back(s);
    }
    if (sample_last && n > 0) sample_rows.push_back(n_tokens() - 1);
    return s;
  }
};

// The block table of a fixed slot when a pool is carved into equal slots of
// `n_ctx` tokens each (callers that do not page: SequenceRunner, tests):
// blocks [slot * per_slot, (slot + 1) * per_slot), per_slot = ceil(n_ctx / bs).
inline std::vector<int32_t> slot_block_table(int32_t slot, int64_t n_ctx, int32_t block_size) {
  const auto per_slot = static_cast<int32_t>((n_ctx + block_size - 1) / block_size);
  std::vector<int32_t> t(static_cast<size_t>(per_slot));
  for (int32_t i = 0; i < per_slot; ++i) t[static_cast<size_t>(i)] = slot * per_slot + i;
  return t;
}

}  // namespace rill
