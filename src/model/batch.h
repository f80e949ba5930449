#pragma once
// Batch: the one flat structure that crosses from the scheduler to the model
// each step (see docs/architecture.md). Tokens of all sequences are laid end
// to end; sequence s owns tokens [seqs[s].q_start, q_start + q_len).
#include <cstdint>
#include <vector>

namespace rill {

struct BatchSeq {
  int32_t kv_slot = 0;  // which KV slot holds this sequence's cache
  int32_t q_start = 0;  // first token of this sequence in the flat arrays
  int32_t q_len = 0;    // tokens computed this step
  int32_t kv_len = 0;   // tokens in the cache after this step (= last position + 1)
};

struct Batch {
  std::vector<int32_t> token_ids;    // [n_tokens]
  std::vector<int32_t> positions;    // [n_tokens]
  std::vector<int32_t> seq_index;    // [n_tokens] -> index into seqs
  std::vector<BatchSeq> seqs;        // [n_seqs]
  std::vector<int32_t> sample_rows;  // token indices whose logits are returned, in order

  int32_t n_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  void clear() {
    token_ids.clear();
    positions.clear();
    seq_index.clear();
    seqs.clear();
    sample_rows.clear();
  }
  // Appends `n` tokens of one sequence at positions [pos0, pos0 + n); the
  // sequence's last token samples when `sample_last`.
  void add_sequence(int32_t kv_slot, const int32_t* ids, int32_t n, int32_t pos0, bool sample_last) {
    const int32_t s = static_cast<int32_t>(seqs.size());
    seqs.push_back({kv_slot, n_tokens(), n, pos0 + n});
    for (int32_t i = 0; i < n; ++i) {
      token_ids.push_back(ids[i]);
      positions.push_back(pos0 + i);
      seq_index.push_back(s);
    }
    if (sample_last && n > 0) sample_rows.push_back(n_tokens() - 1);
  }
};

}  // namespace rill
