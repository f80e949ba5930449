#include "engine/assistant_speculator.h"

#include <algorithm>
#include <cassert>

namespace rill {

AssistantSpeculator::AssistantSpeculator(Model& target) : model_(target) {
  assert(target.n_mtp_layers() > 0);
  const size_t n_groups = model_.kv_spec().size();
  batch_.group_tables.resize(n_groups > 0 ? n_groups - 1 : 0);
}

void AssistantSpeculator::add_row(size_t i, int32_t token) {
  const HiddenRows& o = *chains_[i].rows;
  const auto own = static_cast<size_t>(o.n_own_blocks);
  // One token at the last kept position p: it sees the target's KV up to p.
  const int32_t s = batch_.add_sequence(&token, 1, o.first + o.n - 1, true, o.block_table.first(own));
  batch_.seqs[static_cast<size_t>(s)].decode_from = o.decode_from;
  for (size_t g = 0; g < batch_.group_tables.size(); ++g) {
    const std::span<const int32_t> t = o.group_tables.subspan(g * own, own);
    batch_.group_tables[g].insert(batch_.group_tables[g].end(), t.begin(), t.end());
  }
  row_of_.push_back(i);
}

void AssistantSpeculator::observe(std::span<const HiddenRows> rows) {
  const auto E = static_cast<size_t>(model_.config().n_embd);
  const auto V = static_cast<size_t>(model_.n_vocab());
  batch_.clear();
  hidden_.clear();
  chains_.clear();
  row_of_.clear();
  int32_t max_drafts = 0;
  for (const HiddenRows& o : rows) {
    Draft& d = drafts_[o.seq];
    d.tokens.clear();
    assert(o.n > 0 && o.tokens.size() > static_cast<size_t>(o.first + o.n));
    // The guess after the newest token needs the row of the position right
    // before it; one token per drafting request.
    if (o.n_drafts <= 0 || o.tokens.size() != static_cast<size_t>(o.first + o.n + 1)) continue;
    if (batch_.n_tokens() >= model_.max_batch_tokens() ||
        static_cast<int32_t>(batch_.sample_rows.size()) >= model_.max_batch_seqs())
      continue;
    d.after = o.tokens.size();
    chains_.push_back(Chain{&o, &d});
    add_row(chains_.size() - 1, o.tokens.back());
    const float* h = o.hidden + static_cast<size_t>(o.n - 1) * E;
    hidden_.insert(hidden_.end(), h, h + E);
    max_drafts = std::max(max_drafts, o.n_drafts);
  }
  for (int32_t j = 1; batch_.n_tokens() > 0; ++j) {
    // Draft j of every chain in the batch; the chains still growing go on
    // from it at the same position, their hidden row the assistant's own.
    const bool more = j < max_drafts;
    const auto n = static_cast<size_t>(batch_.n_tokens());
    if (logits_.size() < n * V) logits_.resize(n * V);
    if (more && out_.size() < n * E) out_.resize(n * E);
    if (!model_.forward_mtp(batch_, hidden_.data(), logits_.data(), more ? out_.data() : nullptr).ok()) return;
    for (size_t r = 0; r < n; ++r) {
      const float* row = logits_.data() + r * V;
      chains_[row_of_[r]].draft->tokens.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
    }
    if (!more) return;
    prev_rows_.assign(row_of_.begin(), row_of_.end());
    batch_.clear();
    hidden_.clear();
    row_of_.clear();
    for (size_t r = 0; r < prev_rows_.size(); ++r) {
      const Chain& c = chains_[prev_rows_[r]];
      if (c.rows->n_drafts <= j) continue;
      add_row(prev_rows_[r], c.draft->tokens.back());
      hidden_.insert(hidden_.end(), out_.data() + r * E, out_.data() + (r + 1) * E);
    }
  }
}

void AssistantSpeculator::propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                                  std::vector<int32_t>& out) {
  assert(max_tokens >= 1);
  const auto it = drafts_.find(seq);
  if (it == drafts_.end() || it->second.after != tokens.size()) return;
  const std::vector<int32_t>& d = it->second.tokens;
  out.insert(out.end(), d.begin(), d.begin() + std::min(d.size(), static_cast<size_t>(max_tokens)));
}

}  // namespace rill
