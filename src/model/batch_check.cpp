#include "model/batch_check.h"

#include <algorithm>
#include <string>

namespace rill {

Status check_batch(const Batch& batch, const BatchLimits& lim) {
  const int64_t n = batch.n_tokens();
  if (n > lim.max_tokens) {
    return Error{"batch of " + std::to_string(n) + " tokens exceeds max_batch_tokens " +
                 std::to_string(lim.max_tokens)};
  }
  if (static_cast<int64_t>(batch.sample_rows.size()) > lim.max_sample_rows) {
    return Error{"batch samples " + std::to_string(batch.sample_rows.size()) + " rows, more than " +
                 std::to_string(lim.max_sample_rows)};
  }
  for (int32_t row : batch.sample_rows) {
    if (row < 0 || row >= n) return Error{"sample row " + std::to_string(row) + " is outside the batch"};
  }
  const int32_t bs = lim.block_size;
  for (const BatchSeq& s : batch.seqs) {
    if (s.kv_len < 0 || s.kv_len > lim.n_ctx) {
      return Error{"sequence length " + std::to_string(s.kv_len) + " is outside the context (" +
                   std::to_string(lim.n_ctx) + ")"};
    }
    if (s.q_start < 0 || s.q_len < 0 || s.q_start + s.q_len > n || s.q_len > s.kv_len || s.table_start < 0 ||
        s.table_len < (s.kv_len + bs - 1) / bs ||
        static_cast<size_t>(s.table_start + s.table_len) > batch.block_table.size()) {
      return Error{"batch sequence (tokens [" + std::to_string(s.q_start) + ", +" + std::to_string(s.q_len) +
                   "), length " + std::to_string(s.kv_len) + ") is inconsistent with its block table"};
    }
    const int64_t first_pos = s.kv_len - s.q_len;
    const int64_t lo = lim.window > 0 ? std::max<int64_t>(0, first_pos - lim.window + 1) : 0;
    const std::span<const int32_t> table = batch.table(0, s);
    for (int64_t b = lo / bs; b < (s.kv_len + bs - 1) / bs; ++b) {
      const int32_t e = table[static_cast<size_t>(b)];
      if (e < 0 || e >= lim.n_blocks) {
        return Error{"block table entry " + std::to_string(b) + " (" + std::to_string(e) +
                     ") is not a KV block (the cache has " + std::to_string(lim.n_blocks) + ")"};
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = batch.token_ids[i];
    if (id < 0 || id >= lim.n_vocab) {
      return Error{"token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(lim.n_vocab) +
                   ")"};
    }
    if (batch.seq_index[i] < 0 || static_cast<size_t>(batch.seq_index[i]) >= batch.seqs.size()) {
      return Error{"token " + std::to_string(i) + " names sequence " + std::to_string(batch.seq_index[i]) +
                   ", which is not in the batch"};
    }
    const BatchSeq& s = batch.seqs[static_cast<size_t>(batch.seq_index[i])];
    if (batch.positions[i] < s.kv_len - s.q_len || batch.positions[i] >= s.kv_len) {
      return Error{"position " + std::to_string(batch.positions[i]) + " of token " + std::to_string(i) +
                   " is outside its sequence's step [" + std::to_string(s.kv_len - s.q_len) + ", " +
                   std::to_string(s.kv_len) + ")"};
    }
  }
  return Status::Ok();
}

Status check_batch(const Batch& batch, const BatchLimits& limits, const KvSpec& spec) {
  BatchLimits lim0 = limits;
  lim0.window = !spec.empty() && spec[0].kind == LayerKind::kSliding ? spec[0].window : 0;
  RILL_TRY(check_batch(batch, lim0));
  if (batch.group_tables.size() + 1 < spec.size()) {
    return Error{"batch has block tables for " + std::to_string(batch.group_tables.size() + 1) +
                 " KV groups, the model has " + std::to_string(spec.size())};
  }
  const int32_t bs = limits.block_size;
  for (size_t g = 1; g < spec.size(); ++g) {
    if (!spec[g].is_attention()) continue;
    const std::vector<int32_t>& t = batch.group_tables[g - 1];
    const int64_t window = spec[g].kind == LayerKind::kSliding ? spec[g].window : 0;
    for (const BatchSeq& s : batch.seqs) {
      if (static_cast<size_t>(s.table_start + s.table_len) > t.size()) {
        return Error{"KV group " + std::to_string(g) + "'s block table has " + std::to_string(t.size()) +
                     " entries; a sequence needs [" + std::to_string(s.table_start) + ", +" +
                     std::to_string(s.table_len) + ")"};
      }
      const int64_t first_pos = s.kv_len - s.q_len;
      const int64_t lo = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
      for (int64_t b = lo / bs; b < (s.kv_len + bs - 1) / bs; ++b) {
        const int32_t e = t[static_cast<size_t>(s.table_start + b)];
        if (e < 0 || e >= limits.n_blocks) {
          return Error{"KV group " + std::to_string(g) + " block table entry " + std::to_string(b) + " (" +
                       std::to_string(e) + ") is not a KV block (the cache has " + std::to_string(limits.n_blocks) +
                       ")"};
        }
      }
    }
  }
  return Status::Ok();
}

Status check_token_masks(const TokenMasks& masks, int64_t n_sample, int64_t n_vocab) {
  if (masks.empty()) return Status::Ok();
  if (masks.n_words != token_mask_words(n_vocab)) {
    return Error{"token masks of " + std::to_string(masks.n_words) + " words for a vocabulary of " +
                 std::to_string(n_vocab) + " tokens (" + std::to_string(token_mask_words(n_vocab)) + " words)"};
  }
  if (masks.n_masked < 0 || masks.n_masked > n_sample || !masks.row_mask || !masks.words) {
    return Error{"token masks: " + std::to_string(masks.n_masked) + " masks for " + std::to_string(n_sample) +
                 " sample rows"};
  }
  for (int64_t i = 0; i < n_sample; ++i) {
    const int32_t m = masks.row_mask[i];
    if (m < -1 || m >= masks.n_masked) {
      return Error{"sample row " + std::to_string(i) + " names token mask " + std::to_string(m) + " of " +
                   std::to_string(masks.n_masked)};
    }
  }
  return Status::Ok();
}

}  // namespace rill
