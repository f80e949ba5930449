#include "engine/mtp_speculator.h"

#include <algorithm>
#include <cassert>

namespace rill {

MtpSpeculator::MtpSpeculator(Model& target) : model_(target) {
  assert(target.n_mtp_layers() > 0);
  const size_t n_groups = model_.kv_spec().size();
  batch_.group_tables.resize(n_groups > 0 ? n_groups - 1 : 0);
}

void MtpSpeculator::observe(std::span<const HiddenRows> rows) {
  const auto E = static_cast<size_t>(model_.config().n_embd);
  const auto V = static_cast<size_t>(model_.n_vocab());
  batch_.clear();
  hidden_.clear();
  sampled_.clear();
  for (const HiddenRows& o : rows) {
    drafts_[o.seq].token = -1;
    // Position p's row reads t_{p+1}; the rows fit a step (they were one).
    assert(o.n > 0 && o.tokens.size() > static_cast<size_t>(o.first + o.n));
    if (batch_.n_tokens() + o.n > model_.max_batch_tokens() ||
        static_cast<int32_t>(batch_.sample_rows.size()) >= model_.max_batch_seqs())
      continue;
    // The head's guess at the last kept position follows the request's
    // newest token only when that token is the one right after it.
    const bool sample = o.tokens.size() == static_cast<size_t>(o.first + o.n + 1);
    ids_.assign(o.tokens.begin() + o.first + 1, o.tokens.begin() + o.first + o.n + 1);
    const int32_t s = batch_.add_sequence(ids_.data(), o.n, o.first, sample, o.block_table);
    batch_.seqs[static_cast<size_t>(s)].decode_from = o.decode_from;
    for (auto& t : batch_.group_tables) t.insert(t.end(), o.block_table.begin(), o.block_table.end());
    hidden_.insert(hidden_.end(), o.hidden, o.hidden + static_cast<size_t>(o.n) * E);
    if (sample) sampled_.push_back(&o);
  }
  if (batch_.n_tokens() == 0) return;
  if (logits_.size() < sampled_.size() * V) logits_.resize(sampled_.size() * V);
  if (!model_.forward_mtp(batch_, hidden_.data(), logits_.data()).ok()) return;  // no drafts this step
  for (size_t i = 0; i < sampled_.size(); ++i) {
    const float* row = logits_.data() + i * V;
    Draft& d = drafts_[sampled_[i]->seq];
    d.token = static_cast<int32_t>(std::max_element(row, row + V) - row);
    d.after = sampled_[i]->tokens.size();
  }
}

void MtpSpeculator::propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                            std::vector<int32_t>& out) {
  assert(max_tokens >= 1);
  (void)max_tokens;
  const auto it = drafts_.find(seq);
  if (it == drafts_.end() || it->second.token < 0 || it->second.after != tokens.size()) return;
  out.push_back(it->second.token);
}

}  // namespace rill
