#include "engine/model_runner.h"

#include <cassert>

namespace rill {
namespace {

// A Request::mask (64-bit words over the tokenizer's vocabulary) as one
// TokenMasks mask over the model's n_vocab tokens: a token past either
// vocabulary's end is not allowed.
void pack_mask(std::span<const uint64_t> mask, int64_t n_vocab, uint32_t* out) {
  const int64_t n_words = token_mask_words(n_vocab);
  for (int64_t w = 0; w < n_words; ++w) {
    const auto m = static_cast<size_t>(w / 2);
    const uint64_t bits = m < mask.size() ? mask[m] : 0;
    out[w] = static_cast<uint32_t>(w % 2 ? bits >> 32 : bits);
  }
  if (n_vocab % 32 != 0) out[n_words - 1] &= (uint32_t{1} << (n_vocab % 32)) - 1;
}

}  // namespace

ModelRunner::ModelRunner(Model& model, const KvManager& kv)
    : model_(model), overlap_(dynamic_cast<StepOverlap*>(&model)), kv_(kv) {
  const size_t n_groups = model_.kv_spec().size();
  batch_.group_tables.resize(n_groups > 0 ? n_groups - 1 : 0);
  for (size_t g = 0; g < n_groups && recurrent_group_ < 0; ++g) {
    if (!model_.kv_spec()[g].is_attention()) recurrent_group_ = static_cast<int32_t>(g);
  }
}

Status ModelRunner::launch(const StepPlan& plan, StepIds mode, bool chain) {
  assert(n_launched_ < 2);
  Launched& l = launched_[(oldest_ + n_launched_) % 2];
  int32_t n_masked = 0;
  const int32_t n_sample = build(plan, mode, l.rows, n_masked);
  l.queued = mode != StepIds::kHost && n_masked == 0 && n_sample > 0 && can_queue();
  if (chain && !l.queued) return Error{"a chained step must be queued on the model (StepOverlap)"};
  if (l.queued) {
    RILL_TRY(overlap_->launch_ids(batch_, mode == StepIds::kSample ? rows_.data() : nullptr, chain));
    if (ids_.size() < static_cast<size_t>(n_sample)) ids_.resize(static_cast<size_t>(n_sample));
  } else {
    assert(n_launched_ == 0);  // computed now: nothing may be queued before it
    l.status = compute_now(mode, n_sample, n_masked);
  }
  ++n_launched_;
  return Status::Ok();
}

Status ModelRunner::collect() {
  assert(n_launched_ > 0);
  Launched& l = launched_[oldest_];
  current_ = oldest_;
  oldest_ = (oldest_ + 1) % 2;
  --n_launched_;
  if (!l.queued) return l.status;
  return overlap_->take_ids(ids_.data());
}

int32_t ModelRunner::build(const StepPlan& plan, StepIds mode, std::vector<ChunkRows>& chunk_rows, int32_t& n_masked) {
  batch_.clear();
  rows_.clear();
  chunk_rows.clear();
  row_masks_.clear();
  int32_t n_sample = 0;
  n_masked = 0;
  const int64_t n_words = token_mask_words(model_.n_vocab());
  const auto n_groups = static_cast<int32_t>(model_.kv_spec().size());
  for (const ScheduledChunk& c : plan.chunks) {
    const Request& r = *c.request;
    const auto seq = static_cast<int64_t>(r.id);
    // Rows in position order: the scored prompt positions, then the last token.
    const int32_t q_start = batch_.n_tokens();
    const int32_t s = batch_.add_sequence(r.tokens.data() + r.n_computed, c.n_tokens, r.n_computed, false, {});
    ChunkRows rows{n_sample, r.n_scored_rows(c.n_tokens), c.samples && !r.params.prompt_only && !r.params.embed};
    if (r.params.embed) {  // computed whole in this step (the scheduler's rule)
      assert(r.n_computed == 0 && c.n_tokens == r.n_target());
      rows.pool_index = static_cast<int32_t>(batch_.pool_seqs.size());
      batch_.pool_seqs.push_back(s);
    }
    assert(rows.n_scored == 0 || mode == StepIds::kHost);
    const int32_t scored_from = q_start + r.first_scored_position() - r.n_computed;
    for (int32_t k = 0; k < rows.n_scored; ++k) batch_.sample_rows.push_back(scored_from + k);
    // A verify chunk: the owed token's row, then one per draft.
    rows.n_draft = rows.samples ? c.n_draft : 0;
    assert(rows.n_draft == 0 || mode != StepIds::kSample);
    if (rows.samples) {
      for (int32_t k = rows.n_draft; k >= 0; --k) batch_.sample_rows.push_back(batch_.n_tokens() - 1 - k);
    }
    chunk_rows.push_back(rows);
    BatchSeq& bs = batch_.seqs[static_cast<size_t>(s)];
    bs.decode_from = r.n_prompt;  // so a recomputed output token is computed as it was decoded
    bs.kv_tail = kv_.kv_tail_slot(seq);
    bs.table_len = kv_.append_block_table(seq, 0, batch_.block_table);
    for (int32_t g = 1; g < n_groups; ++g) {
      auto& t = batch_.group_tables[static_cast<size_t>(g - 1)];
      t.resize(static_cast<size_t>(bs.table_start));  // groups share the start
      kv_.append_block_table(seq, g, t);
    }
    if (recurrent_group_ >= 0) {
      bs.state_slot = kv_.state_slot(seq, recurrent_group_);
      bs.state_restore = kv_.state_restore(seq);
      for (const CheckpointSave& v : kv_.state_saves(seq)) batch_.state_saves.push_back({s, v.pos, v.checkpoint});
    }
    n_sample += rows.n_scored + (rows.samples ? 1 + rows.n_draft : 0);
    if (mode == StepIds::kSample && rows.samples) rows_.push_back(c.request->sampler->take_device_draw());
    if (mode != StepIds::kHost && rows.samples) {
      const bool masked = r.grammar_applies();
      assert(!masked || rows.n_draft == 0);
      row_masks_.push_back(masked ? n_masked : -1);
      row_masks_.insert(row_masks_.end(), static_cast<size_t>(rows.n_draft), -1);
      if (masked) {
        mask_words_.resize(static_cast<size_t>((n_masked + 1) * n_words));
        pack_mask(r.mask, model_.n_vocab(), mask_words_.data() + n_masked * n_words);
        ++n_masked;
      }
    }
  }
  return n_sample;
}

Status ModelRunner::compute_now(StepIds mode, int32_t n_sample, int32_t n_masked) {
  const int64_t n_words = token_mask_words(model_.n_vocab());
  if (mode != StepIds::kHost) {
    if (ids_.size() < static_cast<size_t>(n_sample)) ids_.resize(static_cast<size_t>(n_sample));
    // Only constrained rows carry a mask; a step without any passes none.
    const TokenMasks masks =
        n_masked > 0 ? TokenMasks{row_masks_.data(), mask_words_.data(), n_masked, n_words} : TokenMasks{};
    if (mode == StepIds::kGreedy) return model_.forward_greedy(batch_, masks, ids_.data());
    return model_.forward_sample(batch_, rows_.data(), masks, ids_.data());
  }
  const size_t need = static_cast<size_t>(n_sample) * static_cast<size_t>(model_.n_vocab());
  if (logits_.size() < need) logits_.resize(need);
  if (want_hidden_ && batch_.pool_seqs.empty()) {
    const size_t n_hidden = static_cast<size_t>(batch_.n_tokens()) * static_cast<size_t>(model_.config().n_embd);
    if (hidden_.size() < n_hidden) hidden_.resize(n_hidden);
    return model_.forward_hidden(batch_, logits_.data(), hidden_.data());
  }
  if (batch_.pool_seqs.empty()) return model_.forward(batch_, logits_.data());
  assert(mode == StepIds::kHost);
  const size_t n_pooled = batch_.pool_seqs.size() * static_cast<size_t>(model_.embedding().n_dims);
  if (pooled_.size() < n_pooled) pooled_.resize(n_pooled);
  return model_.forward_pooled(batch_, logits_.data(), pooled_.data());
}

}  // namespace rill
