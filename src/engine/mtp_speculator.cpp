#include "engine/mtp_speculator.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace rill {

MtpSpeculator::MtpSpeculator(Model& target) : model_(target) {
  assert(target.n_mtp_layers() > 0);
  const size_t n_groups = model_.kv_spec().size();
  batch_.group_tables.resize(n_groups > 0 ? n_groups - 1 : 0);
}

bool MtpSpeculator::run_head(bool want_hidden) {
  const auto E = static_cast<size_t>(model_.config().n_embd);
  const auto V = static_cast<size_t>(model_.n_vocab());
  const auto n = static_cast<size_t>(batch_.n_tokens());
  if (logits_.size() < batch_.sample_rows.size() * V) logits_.resize(batch_.sample_rows.size() * V);
  if (want_hidden && out_.size() < n * E) out_.resize(n * E);
  return model_.forward_mtp(batch_, hidden_.data(), logits_.data(), want_hidden ? out_.data() : nullptr).ok();
}

void MtpSpeculator::take_argmax(std::span<const size_t> chain_of_row) {
  const auto V = static_cast<size_t>(model_.n_vocab());
  for (size_t i = 0; i < chain_of_row.size(); ++i) {
    const float* row = logits_.data() + i * V;
    chains_[chain_of_row[i]].draft->tokens.push_back(static_cast<int32_t>(std::max_element(row, row + V) - row));
  }
}

void MtpSpeculator::observe(std::span<const HiddenRows> rows) {
  const auto E = static_cast<size_t>(model_.config().n_embd);
  batch_.clear();
  hidden_.clear();
  chains_.clear();
  sampled_.clear();
  int32_t max_drafts = 0;
  for (const HiddenRows& o : rows) {
    Draft& d = drafts_[o.seq];
    d.tokens.clear();
    // Position p's row reads t_{p+1}; the rows fit a step (they were one).
    assert(o.n > 0 && o.tokens.size() > static_cast<size_t>(o.first + o.n));
    if (batch_.n_tokens() + o.n > model_.max_batch_tokens() ||
        static_cast<int32_t>(batch_.sample_rows.size()) >= model_.max_batch_seqs())
      continue;
    // The head's guess at the last kept position follows the request's
    // newest token only when that token is the one right after it.
    const bool sample = o.n_drafts > 0 && o.tokens.size() == static_cast<size_t>(o.first + o.n + 1);
    ids_.assign(o.tokens.begin() + o.first + 1, o.tokens.begin() + o.first + o.n + 1);
    const int32_t s = batch_.add_sequence(ids_.data(), o.n, o.first, sample, o.block_table);
    batch_.seqs[static_cast<size_t>(s)].decode_from = o.decode_from;
    for (auto& t : batch_.group_tables) t.insert(t.end(), o.block_table.begin(), o.block_table.end());
    hidden_.insert(hidden_.end(), o.hidden, o.hidden + static_cast<size_t>(o.n) * E);
    if (!sample) continue;
    d.after = o.tokens.size();
    sampled_.push_back(chains_.size());
    chains_.push_back(Chain{&o, &d});
    max_drafts = std::max(max_drafts, o.n_drafts);
  }
  if (batch_.n_tokens() == 0) return;
  if (!run_head(max_drafts > 1)) return;  // no drafts this step
  take_argmax(sampled_);
  if (max_drafts <= 1) return;
  // Each chain's last row: the layer's output at its last kept position
  // (sample row i is chains_[i]'s).
  chain_hidden_.resize(chains_.size() * E);
  for (size_t i = 0; i < chains_.size(); ++i) {
    const auto row = static_cast<size_t>(batch_.sample_rows[i]);
    std::memcpy(chain_hidden_.data() + i * E, out_.data() + row * E, E * sizeof(float));
  }
  // Draft j + 1 from d_j at position p + j, every chain still growing at once.
  for (int32_t j = 1; j < max_drafts; ++j) {
    batch_.clear();
    hidden_.clear();
    sampled_.clear();
    for (size_t i = 0; i < chains_.size(); ++i) {
      const HiddenRows& o = *chains_[i].rows;
      if (o.n_drafts <= j) continue;
      const int32_t s =
          batch_.add_sequence(&chains_[i].draft->tokens.back(), 1, o.first + o.n + j - 1, true, o.block_table);
      batch_.seqs[static_cast<size_t>(s)].decode_from = o.decode_from;
      for (auto& t : batch_.group_tables) t.insert(t.end(), o.block_table.begin(), o.block_table.end());
      hidden_.insert(hidden_.end(), chain_hidden_.data() + i * E, chain_hidden_.data() + (i + 1) * E);
      sampled_.push_back(i);
    }
    if (sampled_.empty()) return;
    if (!run_head(j + 1 < max_drafts)) return;  // the chains stop here
    take_argmax(sampled_);
    if (j + 1 == max_drafts) return;
    for (size_t r = 0; r < sampled_.size(); ++r)
      std::memcpy(chain_hidden_.data() + sampled_[r] * E, out_.data() + r * E, E * sizeof(float));
  }
}

void MtpSpeculator::propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                            std::vector<int32_t>& out) {
  assert(max_tokens >= 1);
  const auto it = drafts_.find(seq);
  if (it == drafts_.end() || it->second.after != tokens.size()) return;
  const std::vector<int32_t>& d = it->second.tokens;
  out.insert(out.end(), d.begin(), d.begin() + std::min(d.size(), static_cast<size_t>(max_tokens)));
}

}  // namespace rill
