#pragma once
// Scheduler: decides, before every step, which requests run and how many of
// their uncomputed tokens each computes (iteration-level scheduling).
//
// A request's work in a step is its target minus its computed tokens
// (Request::n_uncomputed): there is no prefill or decode phase, only how far
// each request is from its target. A request is *decoding* when what is left
// is one decode round: its last sampled token plus any draft tokens a
// speculator appended (1 + k tokens, verified in one step). Everything else
// with tokens left is prefilling (a prompt, or a resume after preemption).
//
// Policy, under a token budget per step and the KV pool:
//  1. Every decoding request gets its round, oldest first, so streams keep
//     flowing whatever else happens. Its first token is owed (older requests
//     preempt newer ones for its block); its drafts are budgeted like
//     prefill tokens and get only what the budget holds beyond one token per
//     later decoder and what the free blocks hold: drafts never cause a
//     preemption, and drafts that do not fit are dropped from the request.
//  2. Prefilling requests get chunks of the remaining budget, oldest first:
//     a long prompt is split over steps interleaved with the decode rounds.
//  3. Waiting requests are admitted in arrival order while the budget, the
//     running limit and the pool allow; admission matches the prefix cache
//     first (matched tokens are not computed again) and requires blocks for
//     the whole remaining prompt plus one spare block per running decoder
//     (so they need not be preempted next step). An embedding request
//     is admitted only when its whole prompt fits this step's budget (it
//     is pooled, and an encoder attends both ways, so it is never chunked).
//     The head
//     of the queue blocks the rest (first come, first served). Nothing is
//     admitted in a step that had to preempt.
// Latency-aware planning: in a step with decode rounds, phases 2 and 3 (the
// prefill share) get only the tokens that keep the step's predicted time
// within a target (max_step_s, or max_step_factor x the predicted time of
// the rounds alone), at least min_prefill_tokens so prompts always advance;
// the prediction is the StepCostModel the engine feeds with measured steps.
// With nothing decoding the whole budget goes to prefill and admission, so
// idle capacity fills at once. Chunking never changes a request's tokens:
// the attention form is chosen by position (BatchSeq::decode_from).
// When a running request cannot get blocks, the newest running request is
// preempted (its drafts are dropped, its blocks go back to the pool, full
// ones into the prefix cache; it returns to the front of the queue and resumes from what the
// cache still holds). The oldest request always progresses: a request is
// only accepted if it fits the pool alone, so nothing waits forever.
//
// Engine thread only. Requests are owned by the caller and must stay alive
// while the scheduler refers to them (until remove()).
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/step_cost_model.h"
#include "kv/kv_manager.h"

namespace rill {

struct SchedulerOptions {
  int32_t token_budget = 512;  // tokens per step (<= the model's max_batch_tokens)
  int32_t max_running = 64;    // sequences per step
  // Latency-aware planning (see above); both 0: off, the prefill share is
  // the whole budget left after the decode rounds.
  double max_step_s = 0;            // > 0: the step time target in seconds
  double max_step_factor = 0;       // else, > 0: the target as this x the rounds' predicted time
  int32_t min_prefill_tokens = 16;  // the prefill share never drops below this
  // Logit rows per step (the model's max_batch_seqs; at least max_running);
  // 0: max_running. A chunk returns a row when it samples, so any plan of
  // max_running chunks fits; a prompt-scoring chunk (Request::logit_rows)
  // returns one per scored position and is cut to the rows left after one
  // for every chunk that may still follow it.
  int32_t max_rows = 0;
};

struct ScheduledChunk {
  Request* request = nullptr;
  int32_t n_tokens = 0;  // tokens [n_computed, n_computed + n_tokens) compute this step
  int32_t n_draft = 0;   // of those, the trailing draft tokens the step verifies
  bool samples = false;  // the chunk ends at the request's target (its last token)
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // in Batch order
  std::vector<Request*> preempted;     // this step, newest first
  // Requests that can no longer run (admission failed): the engine finishes
  // them with the message.
  std::vector<std::pair<Request*, std::string>> failed;
  int32_t n_tokens = 0;
  int32_t n_decode_tokens = 0;  // of n_tokens, the decode rounds' (phase 1)
  double target_s = 0;          // the step time target latency-aware planning used; 0: none
  int32_t prefill_cap = -1;     // the prefill share it allowed when below the budget left; -1: not capped
  bool empty() const { return chunks.empty(); }
};

// Pipelined decode's check of a plan made behind a step in flight: true
// when `plan` is exactly one sampling token without drafts for each request
// of `in_flight`, in the same order (the chained batch takes its tokens
// from the step in flight's sample rows, row i for sequence i), and nothing
// else: no other chunk, preemption or failed admission.
bool is_rounds_of(const StepPlan& plan, std::span<const ScheduledChunk> in_flight);

class Scheduler {
 public:
  Scheduler(KvManager& kv, SchedulerOptions options);

  // Queues a new request (state kWaiting) at the back.
  void add(Request* request);
  // Forgets the request wherever it is and releases its KV (finish, cancel,
  // failure). Its state is left to the caller.
  void remove(Request* request);

  // Plans the next step: reserves KV for every scheduled chunk (KvManager::
  // append). The engine must then compute the plan and call
  // step_computed() (or, pipelined, step_queued() and commit_computed()),
  // remove() the requests on failure, or discard_plan().
  const StepPlan& schedule();
  // Gives back what schedule() reserved for the plan's chunks (each
  // sequence is cut back to its computed tokens) and empties the plan.
  // Preemptions and admissions it made stand: the requests stay where it
  // put them (an admitted one running with its cached prefix computed) and
  // the next schedule() plans them again; its failed requests are the
  // caller's to end. Attention KV only (a sequence with recurrent state
  // cannot be cut back; such models never queue steps), so it does not
  // fail for the plans pipelined decode makes.
  Status discard_plan();
  // Pipelined decode: called while every running request's decode round
  // is in flight (planned, not yet step_computed() or step_queued()). True
  // when, once that step is computed and each request has its next token,
  // schedule() will plan exactly one token for every running request, in
  // running() order, and nothing else: each decodes without drafts, the
  // budget and the free blocks hold one more token each (no preemption),
  // and no waiting request could be admitted.
  bool next_plan_is_rounds_only() const;
  // After a successful forward: advances each chunk's n_computed and offers
  // newly full blocks to the prefix cache.
  Status step_computed();
  // Pipelined decode: the plan's forward is queued on the device, not yet
  // complete, and the next step is planned behind it. Advances each
  // chunk's n_computed as step_computed() does (the next plan starts after
  // these tokens) but offers no block: the step may still fail with an
  // error the device survives, and a cached block must hold computed KV.
  // Once the step completed, commit_computed() offers its blocks; on
  // failure its requests are remove()d and its blocks never cached.
  // Requires a plan without drafts (their blocks wait for verified()), and
  // no recurrent state (its pending restore is cleared only by a commit;
  // such models never queue steps).
  void step_queued();
  // r's first n_tokens tokens are computed (n_tokens <= r.n_computed, no
  // unverified drafts among them): offers their newly full blocks to the
  // prefix cache.
  Status commit_computed(Request& r, int32_t n_tokens);
  // After the engine verified r's drafts of the step just computed: r's
  // n_computed covers its accepted tokens and `tokens` ends with its next
  // owed token. Gives back the KV of the rejected drafts (the block tail
  // past n_computed; blocks offered to the prefix cache are never touched,
  // and no rejected draft's block was offered) and offers the full blocks
  // of the accepted tokens to the prefix cache.
  Status verified(Request& r);

  const std::deque<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }
  int64_t n_preemptions() const { return n_preemptions_; }
  const SchedulerOptions& options() const { return options_; }
  // What latency-aware planning predicts with; the engine observes each
  // computed step (its n_tokens and wall time) here.
  StepCostModel& cost_model() { return cost_; }
  const StepCostModel& cost_model() const { return cost_; }

 private:
  // Tokens of `r` (up to `want`) whose blocks fit now, keeping `reserve`
  // blocks free; 0 if none.
  int32_t fit(const Request& r, int32_t want, int32_t reserve) const;
  // Preempts the newest running request newer than `than` (null: any);
  // false when there is none.
  bool preempt_newest(const Request* than);
  void preempt(Request* r);
  void schedule_chunk(Request* r, int32_t n);
  // The most of r's next n tokens whose logit rows fit this step, keeping a
  // row for each of `later` chunks that may follow; 0 if none.
  int32_t fit_rows(const Request& r, int32_t n, int32_t later) const;
  // Chunks that may still be planned after running_[i]'s (phase 2: the
  // prefilling requests after it, then admissions) or after the admission
  // of waiting_.front() (admitting). Each returns at most one row.
  int32_t chunks_after(size_t i, bool admitting) const;
  // Schedules decoding r's round: its owed token, then the drafts that fit.
  void schedule_round(Request* r, size_t index);
  void insert_running(Request* r);  // keeps running_ in arrival order
  // Decoding requests in running_[from, end).
  int32_t n_decoding(size_t from = 0) const;
  // After phase 1: lowers budget_ to the prefill share the target allows.
  void cap_prefill_share();

  KvManager& kv_;
  SchedulerOptions options_;
  std::deque<Request*> waiting_;   // arrival order; preempted requests go to the front
  std::vector<Request*> running_;  // arrival order, oldest first
  StepCostModel cost_;
  StepPlan plan_;
  int32_t budget_ = 0;
  int32_t rows_ = 0;  // logit rows of the plan so far
  int64_t n_preemptions_ = 0;
};

}  // namespace rill
