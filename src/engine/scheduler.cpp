#include "engine/scheduler.h"

#include <algorithm>
#include <cassert>

namespace rill {

Scheduler::Scheduler(KvManager& kv, SchedulerOptions options) : kv_(kv), options_(options) {
  options_.token_budget = std::max(1, options_.token_budget);
  options_.max_running = std::max(1, options_.max_running);
  options_.min_prefill_tokens = std::max(1, options_.min_prefill_tokens);
  options_.max_rows = options_.max_rows > 0 ? std::max(options_.max_rows, options_.max_running) : options_.max_running;
}

void Scheduler::add(Request* request) {
  request->state = RequestState::kWaiting;
  waiting_.push_back(request);
}

void Scheduler::remove(Request* request) {
  std::erase(waiting_, request);
  std::erase(running_, request);
  std::erase_if(plan_.chunks, [&](const ScheduledChunk& c) { return c.request == request; });
  kv_.release(static_cast<int64_t>(request->id));
}

int32_t Scheduler::fit(const Request& r, int32_t want, int32_t reserve) const {
  const auto seq = static_cast<int64_t>(r.id);
  const int32_t avail = kv_.n_free_blocks() - reserve;
  auto fits = [&](int32_t n) { return kv_.blocks_needed(seq, n) <= avail; };
  if (want <= 0 || !fits(1)) return 0;
  if (fits(want)) return want;
  int32_t lo = 1, hi = want;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

void Scheduler::insert_running(Request* r) {
  auto at = std::upper_bound(running_.begin(), running_.end(), r,
                             [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
  running_.insert(at, r);
}

void Scheduler::preempt(Request* r) {
  auto chunk =
      std::find_if(plan_.chunks.begin(), plan_.chunks.end(), [&](const ScheduledChunk& c) { return c.request == r; });
  if (chunk != plan_.chunks.end()) {
    budget_ += chunk->n_tokens;
    plan_.n_tokens -= chunk->n_tokens;
    plan_.chunks.erase(chunk);
  }
  std::erase(running_, r);
  kv_.preempt(static_cast<int64_t>(r->id));
  r->n_computed = 0;
  r->drop_draft(r->n_draft);  // a resume recomputes accepted tokens only
  r->state = RequestState::kPreempted;
  ++r->n_preemptions;
  ++n_preemptions_;
  // Keep the front of the queue in arrival order: preempted requests are
  // older than anything never admitted.
  auto at = std::find_if(waiting_.begin(), waiting_.end(), [&](const Request* w) {
    return w->state != RequestState::kPreempted || w->arrival > r->arrival;
  });
  waiting_.insert(at, r);
  plan_.preempted.push_back(r);
}

bool Scheduler::preempt_newest(const Request* than) {
  if (running_.empty()) return false;
  Request* newest = running_.back();
  if (newest == than || (than != nullptr && newest->arrival < than->arrival)) return false;
  preempt(newest);
  return true;
}

int32_t Scheduler::chunks_after(size_t i, bool admitting) const {
  int32_t n = 0;
  if (!admitting) {
    for (size_t j = i + 1; j < running_.size(); ++j) n += !running_[j]->decoding() && running_[j]->n_uncomputed() > 0;
  }
  const int32_t slots = options_.max_running - static_cast<int32_t>(running_.size()) - (admitting ? 1 : 0);
  const size_t queued = waiting_.size() - (admitting ? 1 : 0);
  return n + static_cast<int32_t>(std::min(queued, size_t(std::max(0, slots))));
}

int32_t Scheduler::fit_rows(const Request& r, int32_t n, int32_t later) const {
  const int32_t avail = options_.max_rows - rows_ - later;
  if (n <= 0 || r.logit_rows(n) <= avail) return std::max(n, 0);
  if (r.logit_rows(1) > avail) return 0;
  int32_t lo = 1, hi = n;  // fits(lo), !fits(hi); logit_rows grows with n
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    (r.logit_rows(mid) <= avail ? lo : hi) = mid;
  }
  return lo;
}

void Scheduler::schedule_chunk(Request* r, int32_t n) {
  assert(n >= 1 && n <= r->n_uncomputed());
  rows_ += r->logit_rows(n);
  const int32_t end = r->n_computed + n;
  const int32_t n_draft = std::max(0, end - (r->n_target() - r->n_draft));
  Status st = kv_.append(static_cast<int64_t>(r->id), n, n_draft);
  assert(st.ok());
  (void)st;
  plan_.chunks.push_back({r, n, n_draft, end == r->n_target()});
  plan_.n_tokens += n;
  budget_ -= n;
}

void Scheduler::schedule_round(Request* r, size_t index) {
  assert(r->decoding() && fit(*r, 1, 0) == 1 && budget_ > 0);
  int32_t n = 1;
  if (r->n_draft > 0) {
    const int32_t room = std::max(1, budget_ - n_decoding(index + 1));
    // Each draft takes a logit row: keep one row for every chunk that may
    // still follow (the running requests not planned yet and admissions).
    const auto n_running = static_cast<int32_t>(running_.size());
    const int32_t n_admissible =
        std::min(static_cast<int32_t>(waiting_.size()), std::max(0, options_.max_running - n_running));
    const int32_t n_later = n_running - static_cast<int32_t>(plan_.chunks.size()) - 1 + n_admissible;
    const int32_t draft_rows = std::max(0, options_.max_rows - rows_ - 1 - n_later);
    n = fit(*r, std::min({r->n_uncomputed(), room, 1 + draft_rows}), 0);
    r->drop_draft(r->n_uncomputed() - n);
  }
  schedule_chunk(r, n);
}

void Scheduler::cap_prefill_share() {
  const SchedulerOptions& o = options_;
  if (plan_.n_decode_tokens == 0 || (o.max_step_s <= 0 && o.max_step_factor <= 0) || !cost_.ready()) return;
  plan_.target_s = o.max_step_s > 0 ? o.max_step_s : o.max_step_factor * cost_.predict_s(plan_.n_decode_tokens);
  const int32_t within = cost_.max_tokens_within(plan_.target_s);  // may be INT32_MAX
  const int32_t share = std::max(o.min_prefill_tokens, within - std::min(within, plan_.n_decode_tokens));
  if (share < budget_) {
    budget_ = share;
    plan_.prefill_cap = share;
  }
}

int32_t Scheduler::n_decoding(size_t from) const {
  int32_t n = 0;
  for (size_t i = from; i < running_.size(); ++i) n += running_[i]->decoding();
  return n;
}

const StepPlan& Scheduler::schedule() {
  // Cleared, not replaced: the vectors keep their capacity across steps.
  plan_.chunks.clear();
  plan_.preempted.clear();
  plan_.failed.clear();
  plan_.n_tokens = 0;
  plan_.n_decode_tokens = 0;
  plan_.target_s = 0;
  plan_.prefill_cap = -1;
  budget_ = options_.token_budget;
  rows_ = 0;
  kv_.begin_step();

  // 1. Decode rounds, oldest first. running_ may shrink while we walk it.
  for (size_t i = 0; i < running_.size() && budget_ > 0;) {
    Request* r = running_[i];
    if (!r->decoding()) {
      ++i;
      continue;
    }
    // Blocks for the owed token only: drafts take what is free.
    while (fit(*r, 1, 0) == 0 && preempt_newest(r)) {
    }
    if (fit(*r, 1, 0) == 0) {
      preempt(r);  // r is the newest: let the older ones run
      continue;
    }
    schedule_round(r, i);
    ++i;
  }
  plan_.n_decode_tokens = plan_.n_tokens;
  cap_prefill_share();

  // 2. Prefill (and resume) chunks of running requests, oldest first.
  for (size_t i = 0; i < running_.size() && budget_ > 0;) {
    Request* r = running_[i];
    const int32_t want = std::min(r->n_uncomputed(), budget_);
    if (r->decoding() || r->n_uncomputed() == 0) {
      ++i;
      continue;
    }
    while (fit(*r, want, 0) < want && preempt_newest(r)) {
    }
    // Preemption may have removed requests after r only; r is still at i.
    int32_t n = fit(*r, std::min(want, budget_), 0);
    if (r->params.prompt_logprobs >= 0) n = fit_rows(*r, n, chunks_after(i, /*admitting=*/false));
    if (n > 0) schedule_chunk(r, n);
    ++i;
  }

  // 3. Admission, first come first served.
  const int32_t max_running = options_.max_running;
  while (budget_ > 0 && !waiting_.empty() && plan_.preempted.empty() &&
         static_cast<int32_t>(running_.size()) < max_running) {
    Request* r = waiting_.front();
    const auto seq = static_cast<int64_t>(r->id);
    auto admission = kv_.admit(seq, r->ns, r->tokens, r->max_cached_tokens());
    if (!admission.ok()) {
      waiting_.pop_front();
      plan_.failed.emplace_back(r, admission.error().message);
      continue;
    }
    r->n_computed = admission->n_cached_tokens;
    // Admit only when the whole remaining prompt fits beside one spare block
    // per decoder, though only this step's chunk is allocated now: admitting
    // on a chunk's worth would overcommit and end in preemption.
    const bool fits = kv_.blocks_needed(seq, r->n_uncomputed()) + n_decoding() <= kv_.n_free_blocks();
    int32_t n = fits ? std::min(r->n_uncomputed(), budget_) : 0;
    if (r->params.prompt_logprobs >= 0) n = fit_rows(*r, n, chunks_after(0, /*admitting=*/true));
    if (r->params.embed && n < r->n_uncomputed()) n = 0;  // an embedding is computed whole in one step
    if (n == 0) {
      kv_.release(seq);
      r->n_computed = 0;
      break;
    }
    if (!r->admitted_once) {
      r->admitted_once = true;
      r->n_cached = admission->n_cached_tokens;
    }
    waiting_.pop_front();
    r->state = RequestState::kRunning;
    insert_running(r);
    schedule_chunk(r, n);
  }
  return plan_;
}

bool Scheduler::next_plan_is_rounds_only() const {
  const auto n_running = static_cast<int32_t>(running_.size());
  if (n_running == 0 || n_running > options_.token_budget) return false;
  if (!waiting_.empty() && n_running < options_.max_running) return false;  // admission would run
  int32_t n_blocks = 0;
  for (const Request* r : running_) {
    if (!r->decoding() || r->n_draft > 0) return false;
    n_blocks += kv_.blocks_needed(static_cast<int64_t>(r->id), 1);
  }
  return n_blocks <= kv_.n_free_blocks();
}

Status Scheduler::discard_plan() {
  for (const ScheduledChunk& c : plan_.chunks) {
    RILL_TRY(kv_.truncate(static_cast<int64_t>(c.request->id), c.request->n_computed));
  }
  plan_.chunks.clear();
  plan_.n_tokens = 0;
  plan_.n_decode_tokens = 0;
  return Status::Ok();
}

Status Scheduler::step_computed() {
  for (const ScheduledChunk& c : plan_.chunks) {
    c.request->n_computed += c.n_tokens;
    // Drafts are computed but not yet verified: their blocks are offered
    // once the engine kept the accepted ones (verified()).
    RILL_TRY(commit_computed(*c.request, c.request->n_computed - c.n_draft));
  }
  return Status::Ok();
}

void Scheduler::step_queued() {
  for (const ScheduledChunk& c : plan_.chunks) {
    // Chained steps are draft-free rounds without recurrent state (see the header).
    assert(c.n_draft == 0 && kv_.state_restore(static_cast<int64_t>(c.request->id)) < 0);
    c.request->n_computed += c.n_tokens;
  }
}

Status Scheduler::commit_computed(Request& r, int32_t n_tokens) {
  assert(n_tokens >= 0 && n_tokens <= r.n_computed);
  const std::span<const int32_t> computed(r.tokens.data(), static_cast<size_t>(n_tokens));
  auto cached = kv_.commit_full_blocks(static_cast<int64_t>(r.id), computed);
  if (!cached.ok()) return cached.error();
  return Status::Ok();
}

bool is_rounds_of(const StepPlan& plan, std::span<const ScheduledChunk> in_flight) {
  if (plan.chunks.size() != in_flight.size() || !plan.preempted.empty() || !plan.failed.empty()) return false;
  for (size_t i = 0; i < in_flight.size(); ++i) {
    const ScheduledChunk& c = plan.chunks[i];
    if (c.request != in_flight[i].request || c.n_tokens != 1 || c.n_draft != 0 || !c.samples) return false;
  }
  return true;
}

Status Scheduler::verified(Request& r) {
  const auto seq = static_cast<int64_t>(r.id);
  // Commit before truncating: truncate() leaves a recurrent state restore
  // for the next step, which a commit would clear.
  const std::span<const int32_t> computed(r.tokens.data(), static_cast<size_t>(r.n_computed));
  auto cached = kv_.commit_full_blocks(seq, computed);
  if (!cached.ok()) return cached.error();
  return kv_.truncate(seq, r.n_computed);
}

}  // namespace rill
