#include "engine/engine_impl.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <string>

#include "core/hash.h"
#include "engine/token_logprobs.h"
#include "model/fingerprint.h"

namespace rill {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int32_t blocks_for(int64_t n_tokens, int32_t block_size) {
  return static_cast<int32_t>((n_tokens + block_size - 1) / block_size);
}

bool has_recurrent(const Model& m) {
  const KvSpec& spec = m.kv_spec();
  return std::any_of(spec.begin(), spec.end(), [](const LayerGroupSpec& g) { return !g.is_attention(); });
}

// At most one running request per recurrent state slot.
int max_running(const Model& m, const EngineOptions& o) {
  int n = std::min(std::max(1, o.max_running), m.max_batch_seqs());
  if (has_recurrent(m)) n = std::min(n, std::max(1, m.n_state_slots()));
  if (m.n_kv_tail_slots() > 0) n = std::min(n, m.n_kv_tail_slots());  // one KV tail per running request
  return n;
}

// EngineOptions::max_step_ms < 0: the step time target is this x the
// predicted time of a step's decode rounds alone (issue 19 asks for 2-3x a
// decode step: 2.5 bounds the inter-token gap a prefill can cause while the
// prefill share stays about 1.5x the decode tokens' cost).
constexpr double kAutoStepFactor = 2.5;

// Events waiting for the dispatcher's thread before the engine thread waits
// for room (EventDispatcher: a slow consumer slows generation, it does not
// grow memory): 64 steps of a full 64-row batch.
constexpr size_t kMaxPendingEvents = 4096;

// Speculation's draft length per request: a round whose drafts all held
// doubles the next one (up to EngineOptions::spec_tokens), a rejection sets
// it to one more than what held (a run that broke off early tends to again).
// A running acceptance rate (weight kSpecRateWeight per round) below
// kSpecMinRate pauses the request's drafts for kSpecPauseRounds rounds: a
// rejected draft costs a token of compute and gains nothing. It then tries
// again with one draft.
constexpr float kSpecRateWeight = 0.25f;
constexpr float kSpecMinRate = 0.2f;
constexpr int32_t kSpecPauseRounds = 8;

void adapt_draft_length(Request::Speculation& sp, int32_t n_draft, int32_t n_held, int32_t max_k) {
  sp.rate += kSpecRateWeight * (static_cast<float>(n_held) / static_cast<float>(n_draft) - sp.rate);
  sp.k = n_held == n_draft ? std::min(max_k, 2 * sp.k) : std::min(max_k, n_held + 1);
  if (sp.rate < kSpecMinRate) {
    sp.n_skip = kSpecPauseRounds;
    sp.k = 1;
    sp.rate = 0.5f;  // a fresh start after the pause: one bad round must not pause it again at once
  }
}

SchedulerOptions scheduler_options(const Model& m, const EngineOptions& o) {
  SchedulerOptions s;
  s.token_budget = std::min(std::max(1, o.max_batch_tokens), m.max_batch_tokens());
  s.max_running = max_running(m, o);
  s.max_step_s = o.max_step_ms > 0 ? o.max_step_ms / 1000 : 0;
  s.max_step_factor = o.max_step_ms < 0 ? kAutoStepFactor : 0;
  s.max_rows = m.max_batch_seqs();
  return s;
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAborted:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

EngineImpl::EngineImpl(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
                       const EngineOptions& options, std::shared_ptr<const ChatTemplate> chat_template)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      options_(options),
      pool_(model_->n_kv_blocks(), model_->kv_block_size()),
      tree_(pool_),
      states_(has_recurrent(*model_) ? model_->n_state_slots() : 0,
              has_recurrent(*model_) ? model_->n_state_checkpoints() - model_->n_state_slots() * model_->n_spec_states()
                                     : 0,
              has_recurrent(*model_) ? model_->n_spec_states() : 0),
      kv_tails_(model_->n_kv_tail_slots(), 0),
      kv_(model_->kv_spec(), pool_, tree_, states_),
      scheduler_(kv_, scheduler_options(*model_, options)),
      runner_(*model_, kv_) {
  kv_.set_tail_pool(&kv_tails_);
  eos_ids_ = model_->config().generation.eos_token_ids;
  if (tokenizer_) {
    for (int32_t id : tokenizer_->eos_ids()) {
      if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
    }
  }
  if (tokenizer_) grammar_masks_.emplace(*tokenizer_, eos_ids_);
  model_ns_ = hash64(config_fingerprint(model_->config()));
  stats_.kv_blocks_total = pool_.n_blocks();
  stats_.kv_block_size = pool_.block_size();
  stats_.kv_bytes_per_token = static_cast<int64_t>(model_->kv_bytes_per_token());
  stats_.kv_tail_bytes = static_cast<int64_t>(model_->kv_tail_bytes());
}

Status EngineImpl::start() {
  if (options_.cache_ram_mb > 0 || !options_.cache_dir.empty()) {
    KvTierConfig c;
    c.ram_bytes = options_.cache_ram_mb << 20;
    c.disk_dir = options_.cache_dir;
    c.disk_bytes = options_.cache_disk_mb << 20;
    c.verify = options_.kv_verify;
    c.identity.model_id = options_.model_id.empty() ? config_fingerprint(model_->config()) : options_.model_id;
    c.identity.config_fingerprint = config_fingerprint(model_->config());
    c.identity.numerics = model_->kv_numerics();
    c.identity.tokenizer_hash = tokenizer_ ? hash64(tokenizer_->fingerprint()) : 0;
    c.write_behind_min_tokens = options_.cache_write_behind_min_tokens;
    RILL_ASSIGN_OR_RETURN(tiers_, KvTiers::open(c, *model_, pool_, tree_, &states_));
  }
  RILL_ASSIGN_OR_RETURN(
      speculator_, make_speculator(options_.spec, {model_.get(), tokenizer_.get(), options_.model_path, options_}));
  if (speculator_ && options_.spec_tokens < 1) return Error{"spec_tokens: must be at least 1"};
  if (speculator_ && has_recurrent(*model_) && states_.n_spec_states() < options_.spec_tokens) {
    // A rejected draft rolls the recurrent state back to a verify state
    // (kv/state_pool.h), which the model must hold for every draft.
    std::fprintf(stderr,
                 "speculative decoding (--spec %s) is off for this model: its recurrent state pool keeps %d verify "
                 "states per sequence, --spec-tokens needs %d (ModelOptions::n_spec_states)\n",
                 options_.spec.c_str(), states_.n_spec_states(), options_.spec_tokens);
    speculator_.reset();
  }
  stats_.speculator = speculator_ ? speculator_->name() : "";
  runner_.set_want_hidden(speculator_ && speculator_->wants_hidden());
  publish_stats();  // the tiers' contents are known before the first step
  dispatcher_ = std::make_unique<EventDispatcher>(
      [this](uint64_t id, std::string message) {
        {
          std::lock_guard lk(mu_);
          consumer_failures_.emplace_back(id, std::move(message));
        }
        wake_.notify_all();
      },
      kMaxPendingEvents);
  thread_ = std::thread([this] { loop(); });
  return {};
}

EngineImpl::~EngineImpl() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  dispatcher_.reset();  // delivers the final events the engine thread posted
}

Status EngineImpl::validate(const GenerationRequest& r) const {
  const int64_t n_vocab = model_->n_vocab();
  if (r.prompt.empty()) return Error{"prompt: must contain at least one token"};
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= n_vocab) {
      return Error{"prompt: token id " + std::to_string(r.prompt[i]) + " at index " + std::to_string(i) +
                   " is outside the vocabulary (" + std::to_string(n_vocab) + " tokens)"};
    }
  }
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || id >= n_vocab) return Error{"stop_token_ids: " + std::to_string(id) + " is outside the vocabulary"};
  }
  const EmbeddingSpec embedding = model_->embedding();
  if (r.embed && embedding.pooling == EmbeddingSpec::Pooling::kNone)
    return Error{"input: this model declares no pooling, so it computes no embeddings"};
  if (!r.embed && embedding.bidirectional)
    return Error{"model: this is an encoder (embedding) model; it generates no tokens"};
  if (r.embed && static_cast<int64_t>(r.prompt.size()) > scheduler_.options().token_budget)
    return Error{"input: " + std::to_string(r.prompt.size()) + " tokens exceed the step budget of " +
                 std::to_string(scheduler_.options().token_budget) + " tokens (--max-batch-tokens)"};
  const bool prompt_only = r.prompt_only || r.embed;
  if (r.max_tokens < 1 && !prompt_only) return Error{"max_tokens: must be at least 1"};
  if (r.prompt_logprobs > kMaxTopLogprobs) {
    return Error{"prompt_logprobs: at most " + std::to_string(kMaxTopLogprobs) + " alternatives per token"};
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + (prompt_only ? 0 : r.max_tokens);
  if (total > model_->n_ctx()) {
    return Error{"prompt (" + std::to_string(r.prompt.size()) + " tokens) + max_tokens (" +
                 std::to_string(r.max_tokens) + ") exceeds the context of " + std::to_string(model_->n_ctx()) +
                 " tokens"};
  }
  // Never fits: every attention group holds the whole sequence at the end
  // (a sliding group only its window plus the largest step).
  int64_t need = 0;
  for (const LayerGroupSpec& g : model_->kv_spec()) {
    if (g.kind == LayerKind::kFull) need += blocks_for(total, pool_.block_size());
    if (g.kind == LayerKind::kSliding) {
      need += std::min(blocks_for(total, pool_.block_size()),
                       blocks_for(g.window + scheduler_.options().token_budget, pool_.block_size()) + 1);
    }
  }
  if (need > pool_.n_blocks()) {
    return Error{"prompt + max_tokens (" + std::to_string(total) + " tokens) need " + std::to_string(need) +
                 " KV blocks but the cache holds " + std::to_string(pool_.n_blocks()) +
                 "; lower max_tokens or give the KV cache more memory"};
  }
  if (!r.stop.empty() && !tokenizer_) return Error{"stop: stop strings need a model with a tokenizer"};
  if (r.grammar && !tokenizer_) return Error{"grammar: constrained decoding needs a model with a tokenizer"};
  const GenerationRequest::Thinking& t = r.thinking;
  if (t.close >= n_vocab || t.open >= n_vocab || (t.tracked() && t.open == t.close) ||
      (!t.tracked() && (t.open >= 0 || t.starts_inside || t.budget >= 0))) {
    return Error{"thinking: the open and close tokens must be two different ids of the vocabulary"};
  }
  if (t.budget < -1) return Error{"thinking: the budget must be >= 0 (or -1: unbounded)"};
  if (r.logprobs > kMaxTopLogprobs) {
    return Error{"logprobs: at most " + std::to_string(kMaxTopLogprobs) + " alternatives per token"};
  }
  const SamplingParams& s = r.sampling;
  if (!(s.temperature >= 0.0f)) return Error{"temperature: must be >= 0"};
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return Error{"top_p: must be in (0, 1]"};
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return Error{"min_p: must be in [0, 1]"};
  if (s.top_k < 0) return Error{"top_k: must be >= 0"};
  if (!(s.repetition_penalty > 0.0f)) return Error{"repetition_penalty: must be > 0"};
  return Status::Ok();
}

Result<uint64_t> EngineImpl::submit(GenerationRequest request, EventCallback on_event) {
  if (Status st = validate(request); !st.ok()) {
    std::lock_guard lk(stats_mu_);
    ++stats_.requests_rejected;
    return st.error();
  }
  auto r = std::make_unique<Request>();
  r->params = std::move(request);
  if (on_event) r->on_event = std::make_shared<const EventCallback>(std::move(on_event));
  r->tokens = r->params.prompt;
  r->n_prompt = static_cast<int32_t>(r->tokens.size());
  if (tokenizer_) r->decoder.emplace(*tokenizer_, r->params.skip_special_tokens);
  if (!r->params.stop.empty()) r->stops.emplace(r->params.stop);
  const uint64_t user_ns = r->params.cache_namespace;
  r->ns = hash64(&user_ns, sizeof user_ns, model_ns_);
  r->submitted = Clock::now();
  uint64_t id = 0;
  {
    std::lock_guard lk(mu_);
    if (stopping_) return Error{"the engine is shutting down"};
    if (shut_down_) return Error{*shut_down_};
    id = next_id_++;
    r->id = id;
    r->arrival = id;
    inbox_.push_back(std::move(r));
  }
  {
    std::lock_guard lk(stats_mu_);
    ++stats_.requests_submitted;
  }
  wake_.notify_one();
  return id;
}

void EngineImpl::cancel(uint64_t id) {
  {
    std::lock_guard lk(mu_);
    cancel_inbox_.push_back(id);
  }
  wake_.notify_one();
}

void EngineImpl::shut_down(std::string reason) {
  {
    std::lock_guard lk(mu_);
    if (shut_down_) return;
    shut_down_ = std::move(reason);
  }
  wake_.notify_one();
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  {
    std::lock_guard lk(stats_mu_);
    s = stats_;
  }
  // The disk writer's counters move while the engine thread sleeps: live.
  if (tiers_ && tiers_->disk()) {
    s.disk_tier.queued = tiers_->disk_queue_depth();
    s.disk_tier.written = tiers_->disk_written();
    s.disk_tier.dropped = tiers_->disk_dropped();
  }
  return s;
}

void EngineImpl::take_inbox(std::vector<std::unique_ptr<Request>>& incoming, std::vector<uint64_t>& cancels,
                            std::vector<std::pair<uint64_t, std::string>>& consumer_failures) {
  std::unique_lock lk(mu_);
  wake_.wait(lk, [&] {
    return stopping_ || !inbox_.empty() || !cancel_inbox_.empty() || !consumer_failures_.empty() || has_work() ||
           (shut_down_ && !shut_down_done_);
  });
  incoming.swap(inbox_);
  cancels.swap(cancel_inbox_);
  consumer_failures.swap(consumer_failures_);
}

void EngineImpl::loop() {
  std::vector<std::unique_ptr<Request>> incoming;
  std::vector<uint64_t> cancels;
  std::vector<std::pair<uint64_t, std::string>> consumer_failures;
  for (;;) {
    incoming.clear();
    cancels.clear();
    consumer_failures.clear();
    take_inbox(incoming, cancels, consumer_failures);
    bool stopping = false;
    std::optional<std::string> shut_down;
    {
      std::lock_guard lk(mu_);
      stopping = stopping_;
      shut_down = shut_down_;
    }
    for (auto& r : incoming) {
      Request* p = r.get();
      // A prefix held by a lower cache tier goes back into the device cache
      // first, so admission matches it like any cached prefix.
      if (tiers_ && !stopping && !shut_down) tiers_->restore(p->ns, p->tokens);
      live_.emplace(p->id, std::move(r));
      scheduler_.add(p);
    }
    if (stopping) {
      while (runner_.n_in_flight() > 0) (void)runner_.collect();  // a queued step reads buffers the model owns
      for (auto& [id, r] : live_) {
        if (!r->finished()) finish(*r, FinishReason::kAborted, GenerationEvent{}, "the engine is shutting down");
      }
      live_.clear();
      publish_stats();
      dispatcher_->flush();
      return;
    }
    if (shut_down) {
      // Every request submitted before shut_down() is in live_ by now.
      for (auto& [id, r] : live_) {
        if (!r->finished()) finish(*r, FinishReason::kError, GenerationEvent{}, *shut_down);
      }
      std::lock_guard lk(mu_);
      shut_down_done_ = true;
    }
    for (uint64_t id : cancels) {
      auto it = live_.find(id);
      if (it != live_.end() && !it->second->finished()) finish(*it->second, FinishReason::kAborted, GenerationEvent{});
    }
    for (auto& [id, message] : consumer_failures) {  // a consumer threw: its request ends here
      auto it = live_.find(id);
      if (it != live_.end() && !it->second->finished())
        finish(*it->second, FinishReason::kError, GenerationEvent{}, std::move(message));
    }
    erase_finished();
    dispatcher_->flush();  // the events of ended requests go out before the step
    if (has_work()) run_step();
    dispatcher_->flush();  // the step's events, in one hand-over
    erase_finished();
    if (options_.check_integrity) {
      Status st = kv_.check_integrity();
      if (!st.ok()) {
        std::lock_guard lk(stats_mu_);
        ++stats_.integrity_errors;
        stats_.last_integrity_error = st.error().message;
      }
    }
    if (tiers_) tiers_->poll();  // disk writes finished off the engine thread
    publish_stats();
  }
}

void EngineImpl::erase_finished() {
  // A step in flight may still name a request that ended (a chained step's
  // row for it): its chunk points at the Request, which stays in live_
  // until that step completes.
  const bool in_flight = runner_.n_in_flight() > 0;
  const std::vector<ScheduledChunk>& named = launched_[oldest_launched_].chunks;
  size_t n_kept = 0;
  for (uint64_t id : finished_ids_) {
    const bool keep = in_flight && std::any_of(named.begin(), named.end(),
                                               [&](const ScheduledChunk& c) { return c.request->id == id; });
    if (keep) {
      finished_ids_[n_kept++] = id;
    } else {
      live_.erase(id);
    }
  }
  finished_ids_.resize(n_kept);
}

bool EngineImpl::speculation_pays() const {
  int32_t n_decoding = 0;
  for (const Request* r : scheduler_.running()) n_decoding += r->decoding();
  // Compute-bound: once decode rounds fill half the step's token budget,
  // extra tokens per row would slow every row more than drafts can win.
  return n_decoding > 0 && 2 * n_decoding <= scheduler_.options().token_budget;
}

int32_t EngineImpl::draft_length(const Request& r) const {
  const int32_t k = r.spec.k == 0 ? options_.spec_tokens : r.spec.k;
  // The owed token and the drafts all become output when every draft holds.
  int32_t n = std::min(k, r.params.max_tokens - r.n_output() - 1);
  if (model_->n_kv_tail_slots() > 0) {
    // KV tails (k4c, k4a; model/kv_tails.h): a step encodes each KV block
    // it completes, and its tail keeps only its last partial block, so a
    // draft rejected inside a block the verify step completed would leave
    // the accepted tokens before it in no tail. The drafts stop short of
    // the owed token's block end: the step never completes that block.
    // (Rolling back to the block's start and computing its accepted tokens
    // again instead cost more on the default model: docs/perf.md.)
    const int32_t bs = pool_.block_size();
    n = std::min(n, bs - r.n_computed % bs - 2);
  }
  return std::max(0, n);
}

void EngineImpl::propose_drafts() {
  if (!speculator_ || !speculation_pays()) return;
  draft_requests_.clear();
  draft_rows_.clear();
  for (Request* r : scheduler_.running()) {
    if (!r->decoding() || r->n_draft > 0 || !r->params.speculative) continue;
    Request::Speculation& sp = r->spec;
    if (sp.k == 0) sp.k = options_.spec_tokens;
    if (sp.n_skip > 0) {
      --sp.n_skip;
      continue;
    }
    const int32_t k = draft_length(*r);
    if (k < 1) continue;
    draft_requests_.push_back(DraftRequest{r->id, r->tokens, k, 0});
    draft_rows_.push_back(r);
  }
  if (draft_requests_.empty()) return;
  drafts_.clear();
  speculator_->propose_batch(draft_requests_, drafts_);
  auto next = drafts_.begin();
  for (size_t i = 0; i < draft_rows_.size(); ++i) {
    const DraftRequest& d = draft_requests_[i];
    assert(d.n_drafts >= 0 && d.n_drafts <= d.max_tokens);
    Request* r = draft_rows_[i];
    r->tokens.insert(r->tokens.end(), next, next + d.n_drafts);
    r->n_draft = d.n_drafts;
    next += d.n_drafts;
  }
}

void EngineImpl::observe_hidden() {
  hidden_rows_.clear();
  hidden_tables_.clear();
  table_spans_.clear();
  hidden_group_tables_.clear();
  group_spans_.clear();
  const auto n_groups = static_cast<int32_t>(model_->kv_spec().size());
  const bool pays = speculation_pays();
  const int32_t block_size = pool_.block_size();
  for (size_t i = 0; i < step_chunks_.size(); ++i) {
    const Request& r = *step_chunks_[i].request;
    const int32_t first = chunk_starts_[i];
    // The kept positions of the chunk (a verify chunk's rejected drafts
    // are gone from n_computed); the token after the last must be known.
    const int32_t n = r.n_computed - first;
    if (r.finished() || !r.params.speculative || n <= 0 || r.tokens.size() <= static_cast<size_t>(r.n_computed))
      continue;
    // What propose_drafts will ask of r next step (a decoding request).
    int32_t n_drafts = !pays || !r.decoding() || r.spec.n_skip > 0 ? 0 : draft_length(r);
    n_drafts = std::min(n_drafts, static_cast<int32_t>(model_->n_ctx()) - r.n_computed);
    const size_t at = hidden_tables_.size();
    kv_.append_block_table(static_cast<int64_t>(r.id), 0, hidden_tables_);
    // Chained draft j >= 2 writes the MTP layer's row of position
    // n_computed + j - 2: past the request's blocks it takes free blocks
    // (never a cached prefix block) for this observe only; without them the
    // chain stops where the request's tail block ends.
    const auto owned = static_cast<int32_t>(hidden_tables_.size() - at);
    // The other groups' tables of the request's own blocks, each as long
    // as group 0's (HiddenRows::group_tables).
    group_spans_.emplace_back(hidden_group_tables_.size(), owned);
    for (int32_t g = 1; g < n_groups; ++g) {
      const size_t from = hidden_group_tables_.size();
      kv_.append_block_table(static_cast<int64_t>(r.id), g, hidden_group_tables_);
      hidden_group_tables_.resize(from + static_cast<size_t>(owned), -1);
    }
    const int32_t want = !speculator_->chain_writes_kv()
                             ? 0
                             : (r.n_computed + std::max(0, n_drafts - 1) + block_size - 1) / block_size - owned;
    if (want > 0 && pool_.n_free() >= want) {
      auto leased = pool_.allocate(want);
      assert(leased.ok());  // free blocks only: no eviction
      for (BlockLease& b : *leased) {
        hidden_tables_.push_back(b.block());
        chain_scratch_.push_back(std::move(b));
      }
    } else if (want > 0) {
      n_drafts = std::min(n_drafts, owned * block_size - r.n_computed + 1);
    }
    table_spans_.emplace_back(at, hidden_tables_.size() - at);
    const int32_t q_start = runner_.batch().seqs[i].q_start;
    hidden_rows_.push_back(
        HiddenRows{r.id, r.tokens, first, n, runner_.hidden(q_start), {}, r.n_prompt, n_drafts, 0, {}});
  }
  for (size_t i = 0; i < hidden_rows_.size(); ++i) {  // spans once the tables stopped growing
    HiddenRows& h = hidden_rows_[i];
    h.block_table = std::span<const int32_t>(hidden_tables_).subspan(table_spans_[i].first, table_spans_[i].second);
    h.n_own_blocks = group_spans_[i].second;
    h.group_tables = std::span<const int32_t>(hidden_group_tables_)
                         .subspan(group_spans_[i].first,
                                  static_cast<size_t>(group_spans_[i].second) * static_cast<size_t>(n_groups - 1));
  }
  if (!hidden_rows_.empty()) speculator_->observe(hidden_rows_);
  chain_scratch_.clear();  // the chains' rows are dead: the blocks go back
}

// Pipelined decode (EngineOptions::pipelined_decode): while step n runs on
// a model that queues steps (StepOverlap, the CUDA runtime), step n + 1 is
// planned, its batch built and queued behind it, its tokens read on the
// device from step n's draws; then step n's ids come back and are committed
// (stop conditions, events) while the device runs n + 1. A request that
// finished at step n had a row in n + 1 for a token that never existed:
// finish() takes it out of the scheduler's plan of n + 1 and releases its
// KV, including the slot that row writes (the device writes it before any
// later step can reuse the block: one stream), and since n + 1's full
// blocks are offered to the prefix cache only once n + 1 completed, with
// real tokens, the cache never sees that row. Likewise step n's own blocks
// are offered only once n completed without error (complete_step): a step
// that fails with an error the device survives leaves no block it should
// have computed in the cache. The overlap applies only to a step that is
// exactly the decode rounds of the step in flight (chain_step).
void EngineImpl::run_step() {
  if (runner_.n_in_flight() == 0 && !launch_step()) return;
  chain_step();
  complete_step();
}

bool EngineImpl::launch_step() {
  propose_drafts();
  const StepPlan& plan = scheduler_.schedule();
  for (const auto& [r, message] : plan.failed) finish(*r, FinishReason::kError, GenerationEvent{}, message);
  if (plan.empty()) {
    // Unreachable when admission works as documented (every accepted request
    // fits alone); fail the head rather than spin.
    if (scheduler_.running().empty() && !scheduler_.waiting().empty()) {
      finish(*scheduler_.waiting().front(), FinishReason::kError, GenerationEvent{},
             "the request could not be scheduled (KV cache exhausted)");
    }
    return false;
  }
  const auto now = Clock::now();
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *c.request;
    if (!r.scheduled_once) {
      r.scheduled_once = true;
      r.first_scheduled = now;
      // The sampler's per-vocabulary state is built only once the request
      // runs, so queued requests cost a few hundred bytes, not ~5 B x vocab.
      r.sampler.emplace(r.params.sampling, model_->n_vocab());
      r.sampler->add_prompt_tokens(std::span<const int32_t>(r.tokens.data(), static_cast<size_t>(r.n_prompt)));
      if (r.params.grammar) {
        r.matcher.emplace(grammar_masks_->cache_for(r.params.grammar));
        r.mask.resize(grammar_masks_->vocabulary().mask_words());
      }
      if (r.params.thinking.tracked()) {
        r.think = r.params.thinking.starts_inside ? Request::Think::kInside
                  : r.params.thinking.open >= 0   ? Request::Think::kMaybe
                                                  : Request::Think::kAfter;
      }
    }
  }
  // Steps whose every sampling row can be drawn where the model runs take
  // only token ids from the model (on a GPU the logit rows never cross to
  // the host): an argmax when every row is plain greedy, else a draw under
  // each row's parameters, which gives the token the Sampler would; a
  // constrained row draws there under its token mask. A row with logprobs,
  // logit bias, penalties, a thinking budget or a grammar and drafts (each
  // draft's mask follows the drafts before it) needs its logits here, and
  // then the whole step samples here; the other rows draw the token the
  // device would (the shared rule of backend/sampling.h), so their output
  // does not depend on the batch.
  bool all_greedy = true, all_device = true, has_drafts = false;
  for (const ScheduledChunk& c : plan.chunks) {
    has_drafts = has_drafts || c.n_draft > 0;
    const Request& r = *c.request;
    if (r.n_scored_rows(c.n_tokens) > 0) all_device = false;  // scored prompt rows are logits
    if (r.params.embed) all_device = false;                   // pooled rows come back with the logits
    if (!c.samples || r.params.prompt_only || r.params.embed) continue;
    all_device = all_device && r.params.logprobs < 0 && !r.sampler->edits_logits() && !(r.matcher && c.n_draft > 0) &&
                 r.params.thinking.budget < 0;  // a spent budget forces a token here
    all_greedy = all_greedy && r.sampler->is_plain_greedy();
  }
  StepIds ids = StepIds::kHost;
  if (all_device && all_greedy && model_->has_forward_greedy()) {
    ids = StepIds::kGreedy;  // a draft's row is verified by its argmax
  } else if (all_device && !has_drafts && model_->has_forward_sample()) {
    ids = StepIds::kSample;
  }
  if (speculator_ && speculator_->wants_hidden()) ids = StepIds::kHost;  // hidden states come with logits
  if (ids != StepIds::kHost && !fill_device_masks(plan)) ids = StepIds::kHost;
  if (Status st = launch_plan(plan, ids, /*chain=*/false, now); !st.ok()) {
    fail_plan(plan, st);
    return false;
  }
  return true;
}

Status EngineImpl::launch_plan(const StepPlan& plan, StepIds ids, bool chain, Clock::time_point start) {
  RILL_TRY(runner_.launch(plan, ids, chain));
  LaunchedStep& s = launched_[(oldest_launched_ + runner_.n_in_flight() - 1) % 2];
  s.chunks.assign(plan.chunks.begin(), plan.chunks.end());  // finish() edits the plan; no allocation once grown
  s.ids = ids;
  s.n_tokens = plan.n_tokens;
  s.start = start;
  s.chained_behind = false;
  std::lock_guard lk(stats_mu_);
  ++stats_.steps;
  stats_.steps_pipelined += chain;
  const auto n_seqs = static_cast<int32_t>(plan.chunks.size());
  size_t b = 0;
  while (b < EngineStats::kBatchSizeBounds.size() && n_seqs > EngineStats::kBatchSizeBounds[b]) ++b;
  ++stats_.batch_size_counts[b];
  stats_.batch_size_sum += n_seqs;
  if (plan.target_s > 0) {
    stats_.step_target_ms = plan.target_s * 1e3;
    stats_.prefill_cap_tokens = plan.prefill_cap;
  }
  stats_.steps_prefill_capped += plan.prefill_cap >= 0;
  return Status::Ok();
}

void EngineImpl::fail_plan(const StepPlan& plan, const Status& st) {
  // A failed step fails exactly its requests; their KV is released.
  step_chunks_.assign(plan.chunks.begin(), plan.chunks.end());  // finish() edits the plan
  for (const ScheduledChunk& c : step_chunks_) {
    finish(*c.request, FinishReason::kError, GenerationEvent{}, "the forward pass failed: " + st.error().message);
  }
}

bool EngineImpl::can_chain() const {
  // Serial, and why: without a device queue there is nothing to overlap
  // (the CPU backend computes within the call); a speculator proposes from
  // the tokens just sampled and may read hidden states; a host step
  // (logprobs, penalties, logit bias, thinking budgets, prompt scoring)
  // needs its logits before the next step's sampler state exists; a masked
  // step's next mask depends on the token just sampled (grammars).
  if (!options_.pipelined_decode || speculator_ || runner_.n_in_flight() != 1 || !runner_.can_queue()) return false;
  const LaunchedStep& s = launched_[oldest_launched_];
  if (s.ids == StepIds::kHost || !runner_.oldest_queued()) return false;
  // The next step must be exactly one token for each request of this one,
  // in the same order (its tokens are this step's sample rows in order):
  // no request ended since it was planned, every chunk samples one token,
  // and the scheduler would plan those rounds and nothing else (no
  // admission, prefill or preemption, so no request waits longer for it).
  const std::vector<Request*>& running = scheduler_.running();
  if (s.chunks.size() != running.size()) return false;
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const ScheduledChunk& c = s.chunks[i];
    const Request& r = *c.request;
    if (c.request != running[i] || r.finished() || c.n_tokens != 1 || c.n_draft != 0 || !c.samples) return false;
    if (r.params.prompt_only || r.params.embed || r.params.logprobs >= 0 || r.matcher ||
        r.params.thinking.budget >= 0 || r.sampler->edits_logits())
      return false;
    if (s.ids == StepIds::kGreedy && !r.sampler->is_plain_greedy()) return false;
  }
  return scheduler_.next_plan_is_rounds_only();
}

void EngineImpl::chain_step() {
  if (!can_chain()) return;
  LaunchedStep& s = launched_[oldest_launched_];
  // The step in flight's tokens count as computed, so the scheduler plans
  // the next round after them; the device computes them before anything
  // planned later reads them (one stream). Its full blocks reach the
  // prefix cache only once it completed (complete_step): should it fail
  // on the device, its requests fail there and its blocks are dropped.
  s.chained_behind = true;
  scheduler_.step_queued();
  // Each request's next token is the one the device draws now: a
  // placeholder (0, a valid id) holds its place while the plan and batch
  // are built, and leaves before the real token is committed.
  for (const ScheduledChunk& c : s.chunks) c.request->tokens.push_back(0);
  const StepPlan& plan = scheduler_.schedule();
  if (!is_rounds_of(plan, s.chunks)) {
    // can_chain() predicted these rounds (Scheduler::
    // next_plan_is_rounds_only); a plan that differs cannot take its
    // tokens from the step in flight's rows. Nothing of it runs: its KV
    // goes back and the next step is planned once this one completed (its
    // preemptions stand; a request of the step in flight it preempted
    // gets its token and resumes from the cache).
    for (const ScheduledChunk& c : s.chunks) c.request->tokens.pop_back();
    if (!warned_misprediction_) {
      std::fprintf(stderr,
                   "rill: pipelined decode planned a step other than the predicted decode rounds; it runs serially "
                   "(a scheduler defect: please report it)\n");
      warned_misprediction_ = true;
    }
    for (const auto& [r, message] : plan.failed) finish(*r, FinishReason::kError, GenerationEvent{}, message);
    if (Status st = scheduler_.discard_plan(); !st.ok()) fail_plan(plan, st);
    return;
  }
  const Status st = launch_plan(plan, s.ids, /*chain=*/true, Clock::now());
  for (const ScheduledChunk& c : s.chunks) c.request->tokens.pop_back();
  if (!st.ok()) fail_plan(plan, st);  // the requests of the step in flight: it completes with none left
}

void EngineImpl::complete_step() {
  LaunchedStep& s = launched_[oldest_launched_];
  oldest_launched_ = (oldest_launched_ + 1) % 2;
  Status st = runner_.collect();
  if (st.ok() && !s.chained_behind) st = scheduler_.step_computed();  // the scheduler's plan is still this step's
  if (st.ok() && s.chained_behind) {
    // A step was chained behind this one: its tokens counted as computed
    // from then on (Scheduler::step_queued), and now that it completed
    // they are, so its full blocks go to the prefix cache.
    for (const ScheduledChunk& c : s.chunks) {
      Request& r = *c.request;
      if (r.state != RequestState::kRunning) continue;  // ended, or preempted by a plan that was discarded
      st = scheduler_.commit_computed(r, r.n_computed);
      if (!st.ok()) break;
    }
  }
  std::swap(step_chunks_, s.chunks);
  if (!st.ok()) {
    for (const ScheduledChunk& c : step_chunks_) {
      finish(*c.request, FinishReason::kError, GenerationEvent{}, "the forward pass failed: " + st.error().message);
    }
    return;
  }
  const StepIds ids = s.ids;
  // The wall time a decoding stream waited for this step's token: from its
  // launch, or from the step before it completing when it was queued
  // behind it (the forward, sampling and delivery: what latency-aware
  // planning bounds).
  const auto start = std::max(s.start, last_completed_);
  const double step_s = seconds(start, Clock::now());
  for (const ScheduledChunk& c : step_chunks_) {
    // A request preempted by a discarded chained plan has n_computed 0: its
    // chunk computed nothing that counts.
    if (c.request->state == RequestState::kPreempted) continue;
    if (c.request->n_computed - c.n_tokens < c.request->n_prompt) {  // this chunk computed prompt tokens
      ++c.request->prefill_steps;
      c.request->longest_prefill_step_s = std::max(c.request->longest_prefill_step_s, step_s);
    }
  }
  chunk_starts_.clear();  // each chunk's first position, before verification moves n_computed
  for (const ScheduledChunk& c : step_chunks_) chunk_starts_.push_back(c.request->n_computed - c.n_tokens);
  for (size_t i = 0; i < step_chunks_.size(); ++i) {
    const ScheduledChunk& c = step_chunks_[i];
    const ModelRunner::ChunkRows& rows = runner_.chunk_rows()[i];
    Request& r = *c.request;
    if (r.finished()) continue;
    if (rows.n_scored > 0) score_prompt(r, rows);
    if (r.params.embed) {
      GenerationEvent event;
      const float* v = runner_.pooled(rows.pool_index);
      event.embedding.assign(v, v + model_->embedding().n_dims);
      finish(r, FinishReason::kLength, std::move(event));
      continue;
    }
    if (!c.samples) continue;
    GenerationEvent event;
    if (r.params.prompt_logprobs >= 0 && !r.prompt_scores.empty()) event.prompt_logprobs = std::move(r.prompt_scores);
    if (r.params.prompt_only) {
      finish(r, FinishReason::kLength, std::move(event));
      continue;
    }
    sample_chunk(r, c, rows, ids, event);
    if (!r.finished()) deliver(r, std::move(event));
  }
  if (speculator_ && speculator_->wants_hidden()) observe_hidden();
  last_completed_ = Clock::now();
  scheduler_.cost_model().observe(s.n_tokens, seconds(start, last_completed_));
}

int32_t EngineImpl::pick_token(Request& r, int32_t row, StepIds ids, SampledToken* sampled) {
  if (ids != StepIds::kHost) return runner_.token(row);
  if (r.must_close_thinking()) {
    // Forced, not sampled: its logprob is what the model gave it.
    const int32_t id = r.params.thinking.close;
    if (sampled) {
      const int n_top = static_cast<int>(std::min<int64_t>(r.params.logprobs, model_->n_vocab()));
      token_logprobs(runner_.logits(row), model_->n_vocab(), id, n_top, *sampled);
    }
    return id;
  }
  const bool masked = r.grammar_applies();
  if (masked && !fill_grammar_mask(r)) return -1;
  return r.sampler->sample(runner_.logits(row), sampled ? r.params.logprobs : -1, sampled,
                           masked ? std::span<const uint64_t>(r.mask) : std::span<const uint64_t>());
}

void EngineImpl::sample_chunk(Request& r, const ScheduledChunk& c, const ModelRunner::ChunkRows& rows, StepIds ids,
                              GenerationEvent& event) {
  // Verification: row sample_row() + j follows draft j - 1 (j = 0: the owed
  // token). Each row's token is picked exactly as without speculation (the
  // sampler, its penalties and mask as of the tokens before it, and its
  // seeded draw index), so a draft holds iff it equals that token: a greedy
  // request's output is its non-speculative output, and a sampled one takes
  // draft d with probability p(d) and otherwise a token of p without d
  // (standard speculative sampling for a proposer that is sure of its
  // guess), with the same seeded draws as without speculation. The drafts
  // leave `tokens` first; the ones that hold go back in as committed tokens.
  const int32_t n_draft = rows.n_draft;
  assert(n_draft == c.n_draft && n_draft == r.n_draft);
  (void)c;
  drafts_.assign(r.tokens.end() - n_draft, r.tokens.end());
  r.n_computed -= n_draft;
  r.drop_draft(n_draft);
  const int32_t base = r.n_computed;  // the owed token's KV included
  r.spec.n_drafted += n_draft;
  spec_drafted_ += n_draft;
  const bool want_logprobs = ids == StepIds::kHost && r.params.logprobs >= 0;
  int32_t n_held = 0;
  for (int32_t j = 0; j <= n_draft; ++j) {
    SampledToken sampled;
    const int32_t id = pick_token(r, rows.sample_row() + j, ids, want_logprobs ? &sampled : nullptr);
    if (id < 0) return;  // r finished: no token can continue its grammar
    const bool held = j < n_draft && id == drafts_[static_cast<size_t>(j)];
    n_held += held;
    r.spec.n_accepted += held;
    spec_accepted_ += held;  // before commit_token: a finish publishes the stats
    commit_token(r, id, want_logprobs ? &sampled : nullptr, event);
    if (r.finished() || !held) break;
    r.n_computed = base + j + 1;  // the draft's KV, computed this step, is the token's
    if (r.n_computed % pool_.block_size() == 0) {
      // A block of accepted tokens is full: offer it now, as a step without
      // speculation would have, in case the next token ends the request.
      const auto seq = static_cast<int64_t>(r.id);
      auto cached =
          kv_.commit_full_blocks(seq, std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.n_computed)));
      assert(cached.ok());  // r runs, and its n_computed tokens were appended
      (void)cached;
    }
  }
  if (n_draft == 0) return;
  adapt_draft_length(r.spec, n_draft, n_held, options_.spec_tokens);
  if (r.finished()) return;  // its KV is released
  if (Status st = scheduler_.verified(r); !st.ok()) {
    finish(r, FinishReason::kError, std::move(event), "speculative decoding: " + st.error().message);
  }
}

void EngineImpl::score_prompt(Request& r, const ModelRunner::ChunkRows& rows) {
  // The chunk is computed (n_computed moved past it) but n_prompt_scored
  // has not: the rows start where the runner started them.
  const int32_t from = r.n_prompt_scored;
  const int64_t n_vocab = model_->n_vocab();
  const int n_top = static_cast<int>(std::min<int64_t>(r.params.prompt_logprobs, n_vocab));
  for (int32_t k = 0; k < rows.n_scored; ++k) {
    SampledToken& t = r.prompt_scores.emplace_back();
    token_logprobs(runner_.logits(rows.first + k), n_vocab, r.tokens[static_cast<size_t>(from + k + 1)], n_top, t);
  }
  r.n_prompt_scored = from + rows.n_scored;
}

bool EngineImpl::fill_mask(Request& r, bool& complete) {
  // A mask the parse-stack bounds cut (fill_mask false) still allows only
  // tokens that keep to the grammar: generation goes on with those.
  complete = r.matcher->fill_mask(r.mask);
  if (r.think == Request::Think::kMaybe) {  // the first token may open the thinking block instead
    const auto open = static_cast<size_t>(r.params.thinking.open);
    if (open / 64 < r.mask.size()) r.mask[open / 64] |= uint64_t{1} << (open % 64);
  }
  return std::any_of(r.mask.begin(), r.mask.end(), [](uint64_t w) { return w != 0; });
}

bool EngineImpl::fill_device_masks(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *c.request;
    if (!c.samples || r.params.prompt_only || r.params.embed || !r.grammar_applies()) continue;
    bool complete = true;
    if (!fill_mask(r, complete)) return false;
  }
  return true;
}

bool EngineImpl::fill_grammar_mask(Request& r) {
  bool complete = true;
  if (fill_mask(r, complete)) return true;
  finish(r, FinishReason::kError, GenerationEvent{},
         complete ? "grammar: no token of the vocabulary can continue the output here"
                  : "grammar: too ambiguous (the matcher's parse-stack bounds were reached)");
  return false;
}

void EngineImpl::advance_thinking(Request& r, int32_t id) {
  const GenerationRequest::Thinking& t = r.params.thinking;
  switch (r.think) {
    case Request::Think::kUntracked:
    case Request::Think::kAfter:
      return;
    case Request::Think::kMaybe:
      r.think = id == t.open ? Request::Think::kInside : Request::Think::kAfter;
      r.n_reasoning += id == t.open;
      return;
    case Request::Think::kInside:
      ++r.n_reasoning;
      if (id == t.close) {
        r.think = Request::Think::kAfter;
      } else {
        ++r.n_thinking;
      }
      return;
  }
}

void EngineImpl::commit_token(Request& r, int32_t id, const SampledToken* sampled, GenerationEvent& event) {
  assert(r.n_draft == 0);  // drafts leave `tokens` before they are verified (sample_chunk)
  const Request::Think think_before = r.think;
  advance_thinking(r, id);
  // The open token (first output token) and the block's tokens are not the grammar's.
  const bool grammar_token = r.matcher && think_before != Request::Think::kInside && r.think != Request::Think::kInside;
  if (grammar_token && !r.matcher->accept_token(id)) {
    // Unreachable: the mask allowed only tokens the matcher accepts.
    finish(r, FinishReason::kError, std::move(event),
           "grammar: the sampled token " + std::to_string(id) + " does not continue the grammar");
    return;
  }
  r.sampler->add_output_token(id);
  r.tokens.push_back(id);
  event.token_ids.push_back(id);
  if (sampled) event.logprobs.push_back(*sampled);
  if (r.n_output() == 1) r.first_token = Clock::now();

  // A grammar's end: the matcher took an end-of-generation token.
  const bool is_stop_token =
      std::find(r.params.stop_token_ids.begin(), r.params.stop_token_ids.end(), id) != r.params.stop_token_ids.end() ||
      (!r.params.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end()) ||
      (r.matcher && r.matcher->terminated());
  if (is_stop_token) {
    event.stop_token = id;
    finish(r, FinishReason::kStop, std::move(event));
    return;
  }
  if (r.decoder) {
    std::string piece;
    r.decoder->push(id, piece);
    if (r.stops) {
      if (r.stops->push(piece, event.text)) {
        event.stop_string = r.stops->matched();
        finish(r, FinishReason::kStop, std::move(event));
        return;
      }
    } else {
      event.text += piece;
    }
  }
  if (r.matcher && r.matcher->must_end()) {
    finish(r, FinishReason::kStop, std::move(event));  // the grammar is complete and allows nothing more
    return;
  }
  if (r.n_output() >= r.params.max_tokens) finish(r, FinishReason::kLength, std::move(event));
}

void EngineImpl::finish(Request& r, FinishReason reason, GenerationEvent&& event, std::string error) {
  if (r.finished()) return;
  scheduler_.remove(&r);
  if (speculator_) speculator_->release(r.id);
  r.state = RequestState::kFinished;
  if (r.params.persist_prefix && reason != FinishReason::kError && reason != FinishReason::kAborted) {
    // Cache warm-up: the prompt's blocks are cached in the tree (released
    // just now, nothing allocated since); write them to disk.
    if (!tiers_) {
      reason = FinishReason::kError;
      error = "persist_prefix: no disk cache tier is configured (--cache-dir)";
    } else {
      auto saved = tiers_->persist(r.ns, std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.n_prompt)));
      if (!saved.ok()) {
        reason = FinishReason::kError;
        error = saved.error().message;
      } else {
        event.usage.persisted_tokens = *saved;
      }
    }
  }
  const auto now = Clock::now();
  if (reason != FinishReason::kError && reason != FinishReason::kAborted && r.decoder) {
    // Release held-back text: the stream is complete.
    std::string rest;
    if (!event.stop_string.empty()) {
      // Text after a stop string is dropped.
    } else {
      r.decoder->flush(rest);
      if (r.stops) {
        r.stops->push(rest, event.text);
        r.stops->flush(event.text);
      } else {
        event.text += rest;
      }
    }
  }
  event.finished = true;
  event.finish_reason = reason;
  event.error = std::move(error);
  Usage& u = event.usage;
  u.prompt_tokens = r.n_prompt;
  u.cached_tokens = r.n_cached;
  u.completion_tokens = r.n_output();
  u.reasoning_tokens = r.n_reasoning;
  u.preemptions = r.n_preemptions;
  u.prefill_steps = r.prefill_steps;
  u.longest_prefill_step_s = r.longest_prefill_step_s;
  u.draft_tokens = r.spec.n_drafted;
  u.accepted_draft_tokens = r.spec.n_accepted;
  if (r.scheduled_once) u.queue_s = seconds(r.submitted, r.first_scheduled);
  if (r.n_output() > 0) {
    u.first_token_s = seconds(r.submitted, r.first_token);
    u.prefill_s = seconds(r.first_scheduled, r.first_token);
    u.decode_s = seconds(r.first_token, now);
  }
  {
    std::lock_guard lk(stats_mu_);
    ++stats_.requests_finished;
    stats_.prompt_tokens += u.prompt_tokens;
    stats_.cached_tokens += u.cached_tokens;
    stats_.completion_tokens += u.completion_tokens;
  }
  finished_ids_.push_back(r.id);
  // Queued before the final event (so whoever hears it finds the run queued,
  // and a flush after it writes it); the write itself is off this thread.
  if (tiers_ && !r.params.persist_prefix && (reason == FinishReason::kStop || reason == FinishReason::kLength)) {
    tiers_->write_behind(r.ns, std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.n_computed)));
  }
  // Whoever hears that the request ended may read stats() next: they must
  // already show what it did (a tier restore or persist, its KV blocks).
  publish_stats();
  dispatcher_->post(r.id, r.on_event, std::move(event));
}

int64_t EngineImpl::flush_cache_tiers(std::chrono::steady_clock::time_point deadline) {
  return tiers_ ? tiers_->close_disk_queue(deadline) : 0;  // tiers_ is set before the engine thread starts
}

void EngineImpl::deliver(Request& r, GenerationEvent&& event) {
  dispatcher_->post(r.id, r.on_event, std::move(event));
}

void EngineImpl::publish_stats() {
  std::lock_guard lk(stats_mu_);
  stats_.running = static_cast<int32_t>(scheduler_.running().size());
  stats_.waiting = static_cast<int32_t>(scheduler_.waiting().size());
  if (tiers_) {
    auto fill = [](CacheTierStats& o, const TierStats& t) {
      o.enabled = true;
      o.bytes = t.bytes;
      o.entries = t.entries;
      o.hits = t.hits;
      o.misses = t.misses;
      o.evictions = t.evictions;
      o.errors = t.errors;
      o.loads = t.loads;
      o.load_seconds = t.load_seconds;
    };
    if (tiers_->ram()) fill(stats_.ram_tier, tiers_->ram()->stats());
    if (tiers_->disk()) {
      fill(stats_.disk_tier, tiers_->disk()->stats());
      stats_.disk_tier.replaced = tiers_->disk()->stats().replaced;
    }
    stats_.tier_restored_tokens = tiers_->restored_tokens();
  }
  stats_.kv_blocks_used = pool_.n_used();
  stats_.kv_blocks_cached = pool_.n_cached();
  stats_.preemptions = scheduler_.n_preemptions();
  const StepCostModel& cost = scheduler_.cost_model();
  stats_.step_fixed_ms = cost.fixed_s() * 1e3;
  stats_.step_ms_per_token = cost.per_token_s() * 1e3;
  stats_.spec_draft_tokens = spec_drafted_;
  stats_.spec_accepted_tokens = spec_accepted_;
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer,
                                               const EngineOptions& options,
                                               std::shared_ptr<const ChatTemplate> chat_template) {
  if (!model) return Error{"Engine::create: no model"};
  if (model->n_kv_blocks() <= 0) return Error{"Engine::create: the model has no KV blocks"};
  std::unique_ptr<EngineImpl> e(
      new EngineImpl(std::move(model), std::move(tokenizer), options, std::move(chat_template)));
  RILL_TRY(e->start());
  return std::unique_ptr<Engine>(std::move(e));
}

}  // namespace rill
