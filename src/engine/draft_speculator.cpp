#include "engine/draft_speculator.h"

#include <algorithm>
#include <cassert>

#include "loader/model_files.h"
#include "model/registry.h"
#include "text/tokenizer.h"

namespace rill {
namespace {

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFiles& files) {
  if (files.gguf) return Tokenizer::from_gguf(*files.gguf);
  if (!files.tokenizer_json_path.empty()) return Tokenizer::from_tokenizer_json(files.tokenizer_json_path);
  return std::unique_ptr<Tokenizer>();
}

}  // namespace

Result<std::unique_ptr<Speculator>> DraftModelSpeculator::load(const std::string& path,
                                                               const SpeculatorTarget& target) {
  assert(target.model);
  const std::string where = "--spec draft=" + path;
  auto files = open_model_files(path);
  if (!files.ok()) return Error{where + ": " + files.error().message};
  auto tok = load_tokenizer(**files);
  if (!tok.ok()) return Error{where + ": " + tok.error().message};
  const std::string target_name = target.model_path.empty() ? std::string("the target model") : target.model_path;
  if (target.tokenizer && *tok) {
    if ((*tok)->fingerprint() != target.tokenizer->fingerprint()) {
      return Error{where + ": the draft model's tokenizer (" + std::to_string((*tok)->n_vocab()) + " tokens, " + path +
                   ") differs from the target's (" + std::to_string(target.tokenizer->n_vocab()) + " tokens, " +
                   target_name + "); a draft model must share the target's tokenizer"};
    }
  }
  ModelOptions mo;
  mo.device = target.options.device;
  mo.n_threads = target.options.n_threads;
  mo.n_ctx = target.model->n_ctx();
  mo.max_batch_tokens = std::max(1, target.options.max_batch_tokens);
  // A step's requests draft together: as many rows as the target runs.
  mo.max_batch_seqs = std::clamp(target.options.max_running, 1, mo.max_batch_tokens);
  mo.kv_block_size = target.options.kv_block_size;
  mo.batch_invariant = target.options.batch_invariant;
  mo.quantize = target.options.quantize;
  if (target.options.kv_cache_mb > 0) {
    mo.kv_cache_bytes = target.options.kv_cache_mb << 20;
  } else {
    mo.n_kv_slots = 4;
  }
  auto model = create_model(builtin_registry(), infer_profile(**files), *files, mo);
  if (!model.ok()) return Error{where + ": " + model.error().message};
  const KvSpec& spec = (*model)->kv_spec();
  if (std::any_of(spec.begin(), spec.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); })) {
    return Error{where + ": a draft model with recurrent layers is not supported (its state is not rolled back)"};
  }
  if (!(target.tokenizer && *tok) && (*model)->n_vocab() != target.model->n_vocab()) {
    return Error{where + ": the draft model's vocabulary (" + std::to_string((*model)->n_vocab()) + " tokens, " + path +
                 ") differs from the target's (" + std::to_string(target.model->n_vocab()) + " tokens, " + target_name +
                 ")"};
  }
  return std::unique_ptr<Speculator>(new DraftModelSpeculator(std::move(model).value(), target.model->n_vocab()));
}

DraftModelSpeculator::DraftModelSpeculator(std::unique_ptr<Model> model, int64_t n_target_vocab)
    : model_(std::move(model)),
      n_target_vocab_(n_target_vocab),
      pool_(model_->n_kv_blocks(), model_->kv_block_size()),
      tree_(pool_),
      states_(0, 0),
      kv_(model_->kv_spec(), pool_, tree_, states_) {
  const size_t n_groups = model_->kv_spec().size();
  batch_.group_tables.resize(n_groups > 0 ? n_groups - 1 : 0);
  const auto n_rows = static_cast<size_t>(model_->max_batch_seqs());
  picks_.resize(n_rows);
  if (!model_->has_forward_greedy()) logits_.resize(n_rows * static_cast<size_t>(model_->n_vocab()));
}

void DraftModelSpeculator::release(uint64_t seq) {
  kv_.release(static_cast<int64_t>(seq));
  seqs_.erase(seq);
}

void DraftModelSpeculator::propose(uint64_t seq, std::span<const int32_t> tokens, int32_t max_tokens,
                                   std::vector<int32_t>& out) {
  DraftRequest r{seq, tokens, max_tokens, 0};
  propose_batch(std::span<DraftRequest>(&r, 1), out);
}

bool DraftModelSpeculator::prepare(DraftRequest& r) {
  assert(r.max_tokens >= 1 && !r.tokens.empty());
  const auto id = static_cast<int64_t>(r.seq);
  if (static_cast<int64_t>(r.tokens.size()) + r.max_tokens > model_->n_ctx()) return false;
  if (!kv_.contains(id)) {
    if (!kv_.admit(id, 0, r.tokens).ok()) return false;
    // Its first propose follows the request's first output token (the
    // owed one): the output starts there, computed in the decode form as
    // the target computes it.
    seqs_[r.seq] = Sequence{{}, static_cast<int32_t>(r.tokens.size()) - 1, round_};
  }
  Sequence& sq = seqs_[r.seq];
  // Roll back to what the draft's KV shares with the request (the target
  // rejected the rest), keeping one token to compute for the next logits.
  const auto common = static_cast<int32_t>(
      std::min<size_t>(std::mismatch(sq.computed.begin(), sq.computed.end(), r.tokens.begin(), r.tokens.end()).first -
                           sq.computed.begin(),
                       r.tokens.size() - 1));
  if (!kv_.truncate(id, common).ok()) {
    release(r.seq);
    return false;
  }
  sq.computed.resize(static_cast<size_t>(common));
  // The missing tokens and every draft but the last (its KV is not needed).
  const int32_t n = static_cast<int32_t>(r.tokens.size()) - common + r.max_tokens - 1;
  if (!kv_.can_allocate(id, n)) {
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      if (it->second.round == round_) {
        ++it;
        continue;
      }
      kv_.release(static_cast<int64_t>(it->first));
      it = seqs_.erase(it);
    }
  }
  if (!kv_.can_allocate(id, n) || !kv_.append(id, n).ok()) {
    release(r.seq);
    return false;
  }
  return true;
}

void DraftModelSpeculator::add_row(const Row& row, const int32_t* ids, int32_t n, int32_t pos, bool sample) {
  const auto id = static_cast<int64_t>(row.request->seq);
  if (sample) sampled_rows_.push_back(static_cast<int32_t>(&row - rows_.data()));
  const int32_t s = batch_.add_sequence(ids, n, pos, sample, {});
  BatchSeq& bs = batch_.seqs[static_cast<size_t>(s)];
  bs.decode_from = row.seq->decode_from;  // a token's draft does not depend on how it was chunked
  bs.table_len = kv_.append_block_table(id, 0, batch_.block_table);
  for (size_t g = 1; g <= batch_.group_tables.size(); ++g)
    kv_.append_block_table(id, static_cast<int32_t>(g), batch_.group_tables[g - 1]);
}

bool DraftModelSpeculator::forward() {
  const size_t n_sample = batch_.sample_rows.size();
  assert(n_sample <= picks_.size());
  if (model_->has_forward_greedy()) return model_->forward_greedy(batch_, TokenMasks{}, picks_.data()).ok();
  if (!model_->forward(batch_, logits_.data()).ok()) return false;
  const auto V = static_cast<size_t>(model_->n_vocab());
  for (size_t i = 0; i < n_sample; ++i) {
    const float* row = logits_.data() + i * V;
    picks_[i] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
  return true;
}

bool DraftModelSpeculator::catch_up() {
  // Rows in order, each continuing where the last forward left it; a row's
  // chunk samples when it reaches the request's last token.
  size_t first = 0;  // rows before it are caught up
  while (first < rows_.size()) {
    batch_.clear();
    sampled_rows_.clear();
    int32_t budget = model_->max_batch_tokens();
    for (size_t i = first; i < rows_.size() && budget > 0 && batch_.seqs.size() < picks_.size(); ++i) {
      Row& row = rows_[i];
      std::vector<int32_t>& computed = row.seq->computed;
      const std::span<const int32_t> tokens = row.request->tokens;
      const auto pos = static_cast<int32_t>(computed.size());
      if (pos == static_cast<int32_t>(tokens.size())) continue;  // caught up in an earlier forward
      const int32_t n = std::min(static_cast<int32_t>(tokens.size()) - pos, budget);
      add_row(row, tokens.data() + pos, n, pos, pos + n == static_cast<int32_t>(tokens.size()));
      computed.insert(computed.end(), tokens.begin() + pos, tokens.begin() + pos + n);
      budget -= n;
    }
    if (!forward()) return false;
    for (size_t i = 0; i < sampled_rows_.size(); ++i) rows_[static_cast<size_t>(sampled_rows_[i])].next = picks_[i];
    while (first < rows_.size() && rows_[first].seq->computed.size() == rows_[first].request->tokens.size()) ++first;
  }
  return true;
}

void DraftModelSpeculator::release_round() {
  for (Row& row : rows_) release(row.request->seq);
  rows_.clear();
}

void DraftModelSpeculator::propose_batch(std::span<DraftRequest> requests, std::vector<int32_t>& out) {
  ++round_;
  for (DraftRequest& r : requests) {
    r.n_drafts = 0;
    const auto it = seqs_.find(r.seq);
    if (it != seqs_.end()) it->second.round = round_;  // not given back to make room for another
  }
  rows_.clear();
  int32_t n_drafts = 0;
  for (DraftRequest& r : requests) {
    if (!prepare(r)) continue;
    rows_.push_back(Row{&r, &seqs_[r.seq], -1, n_drafts, 0});
    n_drafts += r.max_tokens;
  }
  if (rows_.empty()) return;
  drafted_.resize(static_cast<size_t>(n_drafts));
  if (!catch_up()) return release_round();
  // Draft position j of every row still drafting is one forward.
  for (;;) {
    batch_.clear();
    sampled_rows_.clear();
    for (Row& row : rows_) {
      if (row.next < 0 || row.next >= n_target_vocab_ || row.n_drafts == row.request->max_tokens) continue;
      int32_t& slot = drafted_[static_cast<size_t>(row.first_draft + row.n_drafts++)];
      slot = row.next;
      row.next = -1;
      if (row.n_drafts == row.request->max_tokens) continue;  // the last draft needs no forward
      const auto pos = static_cast<int32_t>(row.seq->computed.size());
      add_row(row, &slot, 1, pos, true);
      row.seq->computed.push_back(slot);
    }
    if (batch_.seqs.empty()) break;
    if (!forward()) return release_round();
    for (size_t i = 0; i < sampled_rows_.size(); ++i) rows_[static_cast<size_t>(sampled_rows_[i])].next = picks_[i];
  }
  for (Row& row : rows_) {
    // Give back the reserved KV no draft used.
    const auto id = static_cast<int64_t>(row.request->seq);
    if (!kv_.truncate(id, static_cast<int32_t>(row.seq->computed.size())).ok()) {
      release(row.request->seq);
      continue;
    }
    const auto begin = drafted_.begin() + row.first_draft;
    out.insert(out.end(), begin, begin + row.n_drafts);
    row.request->n_drafts = row.n_drafts;
  }
}

}  // namespace rill
