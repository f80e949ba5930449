#pragma once
// FakeModel: a Model with real paged-KV bookkeeping and no arithmetic, for
// engine and scheduler tests. Its "KV" is the (token, position) pair stored
// in each block slot; a sampling row reads the whole sequence back through
// the block table, fails the step if any slot holds the wrong position, and
// returns logits that depend on every token of the sequence up to the row. So a request
// continues exactly as it would alone (next_token()) only if its blocks were
// written, shared, evicted and restored correctly.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/sampler.h"
#include "model/model.h"
#include "model/step_overlap.h"

namespace rill::testing {

class FakeModel final : public Model, public StepOverlap {
 public:
  struct Options {
    int32_t n_vocab = 64;
    int64_t n_ctx = 512;
    int32_t block_size = 4;
    int32_t n_blocks = 64;
    int max_batch_tokens = 64;
    int max_batch_seqs = 16;
    // Offer forward_greedy (ids only, as a GPU model does); it counts its
    // calls apart from forward()'s.
    bool device_greedy = false;
    // Offer forward_sample (ids drawn by the host reference of the device
    // rule, Sampler::reference_draw); it counts its calls too.
    bool device_sample = false;
    // Each forward takes at least this long (a device step's duration, for
    // tests of what happens on other threads meanwhile).
    std::chrono::microseconds forward_delay{0};
    // Offer StepOverlap (with device_greedy / device_sample): launch_ids
    // queues a copy of the step, take_ids computes it, in launch order as a
    // device would; a chained step's tokens are the ids of the step queued
    // before it.
    bool queue_steps = false;
    // KV tails as k4c keeps them (model/kv_tails.h), this many slots (0:
    // none): a step must continue at a multiple of block_size or inside
    // the block its tail's last step ended in, no further than that step
    // ended (KvTails::check's rule), else forward fails naming the slot.
    int32_t kv_tail_slots = 0;
  };

  explicit FakeModel(Options o) : o_(o), spec_{full()} {
    cfg_.n_vocab = o.n_vocab;
    cells_.assign(static_cast<size_t>(o.n_blocks) * static_cast<size_t>(o.block_size), Cell{});
  }

  // Logits for the context `tokens` (all of them, in order): a pseudo-random
  // row whose argmax depends on every token.
  static void logits_for(const std::vector<int32_t>& tokens, int32_t n_vocab, float* out) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : tokens) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
    for (int32_t i = 0; i < n_vocab; ++i) {
      uint64_t x = h ^ (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
      x ^= x >> 29;
      x *= 0xBF58476D1CE4E5B9ull;
      x ^= x >> 32;
      out[i] = static_cast<float>(x % 100000) / 1000.0f;
    }
  }
  // The greedy continuation of `tokens` by one token.
  static int32_t next_token(const std::vector<int32_t>& tokens, int32_t n_vocab) {
    std::vector<float> l(static_cast<size_t>(n_vocab));
    logits_for(tokens, n_vocab, l.data());
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  }

  const ModelConfig& config() const override { return cfg_; }
  int64_t n_vocab() const override { return o_.n_vocab; }
  int64_t n_ctx() const override { return o_.n_ctx; }
  int max_batch_tokens() const override { return o_.max_batch_tokens; }
  int max_batch_seqs() const override { return o_.max_batch_seqs; }
  const KvSpec& kv_spec() const override { return spec_; }
  int32_t kv_block_size() const override { return o_.block_size; }
  int32_t n_kv_blocks() const override { return o_.n_blocks; }
  size_t kv_bytes_per_token() const override { return 8; }
  int32_t n_kv_tail_slots() const override { return o_.kv_tail_slots; }

  bool has_forward_greedy() const override { return o_.device_greedy; }
  // The rows' argmax (first maximum: the lowest id on ties) from a scratch
  // copy of forward()'s logits; masked rows: the host reference's argmax
  // under the mask.
  Status forward_greedy(const Batch& batch, const TokenMasks& masks, int32_t* ids) override {
    if (!o_.device_greedy) return Error{"forward_greedy not offered"};
    ++n_greedy_calls_;
    const size_t n_rows = batch.sample_rows.size(), V = static_cast<size_t>(o_.n_vocab);
    RILL_TRY(check_masks(masks, n_rows));
    std::vector<float> rows(n_rows * V);
    RILL_TRY(compute(batch, rows.data()));
    for (size_t i = 0; i < n_rows; ++i) {
      const uint32_t* allowed = mask_of(masks, i);
      if (allowed) {
        ids[i] = Sampler::reference_draw(DeviceSamplingParams{.temperature = 0.0f}, rows.data() + i * V, o_.n_vocab,
                                         allowed);
        continue;
      }
      ids[i] = static_cast<int32_t>(std::max_element(rows.begin() + i * V, rows.begin() + (i + 1) * V) -
                                    (rows.begin() + i * V));
    }
    return Status::Ok();
  }

  bool has_forward_sample() const override { return o_.device_sample; }
  Status forward_sample(const Batch& batch, const DeviceSamplingParams* params, const TokenMasks& masks,
                        int32_t* ids) override {
    if (!o_.device_sample) return Error{"forward_sample not offered"};
    ++n_sample_calls_;
    const size_t n_rows = batch.sample_rows.size(), V = static_cast<size_t>(o_.n_vocab);
    RILL_TRY(check_masks(masks, n_rows));
    std::vector<float> rows(n_rows * V);
    RILL_TRY(compute(batch, rows.data()));
    for (size_t i = 0; i < n_rows; ++i) {
      ids[i] = Sampler::reference_draw(params[i], rows.data() + i * V, o_.n_vocab, mask_of(masks, i));
    }
    return Status::Ok();
  }
  bool can_queue_steps() const override { return o_.queue_steps; }
  Status launch_ids(const Batch& batch, const DeviceSamplingParams* rows, bool chain_ids) override {
    if (!o_.queue_steps) return Error{"queued steps not offered"};
    if (queued_.size() >= 2) return Error{"two steps are queued already"};
    if (chain_ids) {
      const bool one_each =
          std::all_of(batch.seqs.begin(), batch.seqs.end(), [](const BatchSeq& q) { return q.q_len == 1; });
      if (queued_.empty() || queued_.back().batch.sample_rows.size() != static_cast<size_t>(batch.n_tokens()) ||
          !one_each)
        return Error{"a chained step must take one token per sample row of the step queued before it"};
    }
    Queued q{batch, {}, rows == nullptr, chain_ids};
    if (rows) q.rows.assign(rows, rows + batch.sample_rows.size());
    queued_.push_back(std::move(q));
    ++n_launches_;
    n_chained_ += chain_ids;
    return Status::Ok();
  }
  Status take_ids(int32_t* ids) override {
    if (queued_.empty()) return Error{"no step is queued"};
    Queued q = std::move(queued_.front());
    queued_.pop_front();
    if (q.chain) std::copy(last_ids_.begin(), last_ids_.end(), q.batch.token_ids.begin());
    RILL_TRY(q.greedy ? forward_greedy(q.batch, TokenMasks{}, ids) : forward_sample(q.batch, q.rows.data(), {}, ids));
    last_ids_.assign(ids, ids + q.batch.sample_rows.size());
    return Status::Ok();
  }
  int n_queued() const override { return static_cast<int>(queued_.size()); }
  // Steps launched through launch_ids, and of those the chained ones.
  int n_launches() const { return n_launches_; }
  int n_chained() const { return n_chained_; }

  // Steps whose draws carried token masks, and the masked rows in all.
  int n_masked_steps() const { return n_masked_steps_; }
  int n_masked_rows() const { return n_masked_rows_; }

  Status forward(const Batch& batch, float* logits) override {
    if (!queued_.empty()) return Error{"forward with a step queued"};
    ++n_logit_calls_;
    return compute(batch, logits);
  }
  int n_greedy_calls() const { return n_greedy_calls_; }
  int n_logit_calls() const { return n_logit_calls_; }
  int n_sample_calls() const { return n_sample_calls_; }

  Status compute(const Batch& batch, float* logits) {
    size_t index = 0;
    {
      std::lock_guard lk(mu_);
      index = step_tokens_.size();
      step_tokens_.push_back(batch.n_tokens());
      step_seqs_.push_back(static_cast<int32_t>(batch.seqs.size()));
    }
    if (o_.forward_delay.count() > 0) std::this_thread::sleep_for(o_.forward_delay);
    if (fail_next_.exchange(false)) return Error{"injected forward failure"};
    if (static_cast<int64_t>(index) == fail_at_.load()) return Error{"injected forward failure"};
    if (batch.n_tokens() > o_.max_batch_tokens) return Error{"batch too large"};
    if (static_cast<int>(batch.sample_rows.size()) > o_.max_batch_seqs) return Error{"too many sample rows"};
    const int32_t bs = o_.block_size;
    RILL_TRY(check_tails(batch));
    size_t next_sample = 0;
    for (const BatchSeq& s : batch.seqs) {
      auto table = batch.table(0, s);
      for (int32_t i = 0; i < s.q_len; ++i) {
        const int32_t t = s.q_start + i, p = batch.positions[static_cast<size_t>(t)];
        const int32_t block = table[static_cast<size_t>(p / bs)];
        if (block < 0 || block >= o_.n_blocks) return Error{"bad block id " + std::to_string(block)};
        cells_[static_cast<size_t>(block * bs + p % bs)] = {batch.token_ids[static_cast<size_t>(t)], p};
      }
      // This sequence's rows (any of its tokens, in order): the logits of
      // the context up to and including the row's position.
      while (next_sample < batch.sample_rows.size() && batch.sample_rows[next_sample] >= s.q_start &&
             batch.sample_rows[next_sample] < s.q_start + s.q_len) {
        const int32_t row_pos = batch.positions[static_cast<size_t>(batch.sample_rows[next_sample])];
        std::vector<int32_t> context;
        for (int32_t p = 0; p <= row_pos; ++p) {
          const Cell& c = cells_[static_cast<size_t>(table[static_cast<size_t>(p / bs)] * bs + p % bs)];
          if (c.pos != p) return Error{"KV of position " + std::to_string(p) + " is missing or stale"};
          context.push_back(c.token);
        }
        logits_for(context, o_.n_vocab, logits + next_sample * static_cast<size_t>(o_.n_vocab));
        ++next_sample;
      }
    }
    if (next_sample != batch.sample_rows.size()) return Error{"sample rows out of sequence order"};
    for (const BatchSeq& s : batch.seqs) {  // each tail keeps the step's newest partial block
      if (o_.kv_tail_slots > 0) tails_[static_cast<size_t>(s.kv_tail)] = {s.kv_len - s.kv_len % bs, s.kv_len % bs};
    }
    return Status::Ok();
  }

  void fail_next_forward() { fail_next_ = true; }
  // The computed step with this index (0: the first; in compute order, so
  // a queued step's when it is taken) fails before it writes any KV, and
  // the model goes on: a device error that does not end the context.
  void fail_forward_at(int64_t index) { fail_at_ = index; }
  std::vector<int32_t> step_tokens() const {
    std::lock_guard lk(mu_);
    return step_tokens_;
  }
  std::vector<int32_t> step_seqs() const {
    std::lock_guard lk(mu_);
    return step_seqs_;
  }

 private:
  Status check_tails(const Batch& batch) {
    if (o_.kv_tail_slots == 0) return Status::Ok();
    tails_.resize(static_cast<size_t>(o_.kv_tail_slots), {0, 0});
    const int32_t bs = o_.block_size;
    for (const BatchSeq& s : batch.seqs) {
      if (s.kv_tail < 0 || s.kv_tail >= o_.kv_tail_slots) return Error{"bad KV tail slot " + std::to_string(s.kv_tail)};
      const int32_t c0 = s.kv_len - s.q_len;
      const auto [start, rows] = tails_[static_cast<size_t>(s.kv_tail)];
      if (c0 % bs != 0 && (start != c0 - c0 % bs || rows < c0 % bs)) {
        return Error{"KV tail slot " + std::to_string(s.kv_tail) + " holds [" + std::to_string(start) + ", " +
                     std::to_string(start + rows) + "), the step continues at " + std::to_string(c0)};
      }
    }
    return Status::Ok();
  }

  // The masks' shape as a device model checks it; counts masked steps.
  Status check_masks(const TokenMasks& masks, size_t n_rows) {
    if (masks.empty()) return Status::Ok();
    if (masks.n_words != (o_.n_vocab + 31) / 32) return Error{"token masks of the wrong width"};
    for (size_t i = 0; i < n_rows; ++i) {
      if (masks.row_mask[i] < -1 || masks.row_mask[i] >= masks.n_masked) return Error{"bad token mask index"};
    }
    ++n_masked_steps_;
    n_masked_rows_ += masks.n_masked;
    return Status::Ok();
  }
  static const uint32_t* mask_of(const TokenMasks& masks, size_t row) {
    if (masks.empty() || masks.row_mask[row] < 0) return nullptr;
    return masks.words + static_cast<size_t>(masks.row_mask[row]) * static_cast<size_t>(masks.n_words);
  }

  struct Cell {
    int32_t token = -1;
    int32_t pos = -1;
  };
  Options o_;
  ModelConfig cfg_;
  KvSpec spec_;
  std::vector<Cell> cells_;
  std::vector<std::pair<int32_t, int32_t>> tails_;  // per KV tail slot: first position, rows
  std::atomic<bool> fail_next_{false};
  std::atomic<int64_t> fail_at_{-1};
  std::atomic<int> n_greedy_calls_{0}, n_logit_calls_{0}, n_sample_calls_{0};
  std::atomic<int> n_masked_steps_{0}, n_masked_rows_{0};
  mutable std::mutex mu_;
  std::vector<int32_t> step_tokens_, step_seqs_;
  // StepOverlap (engine thread only).
  struct Queued {
    Batch batch;
    std::vector<DeviceSamplingParams> rows;
    bool greedy = true;
    bool chain = false;
  };
  std::deque<Queued> queued_;
  std::vector<int32_t> last_ids_;  // the ids of the step taken last
  std::atomic<int> n_launches_{0}, n_chained_{0};
};

}  // namespace rill::testing
