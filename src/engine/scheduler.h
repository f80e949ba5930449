#pragma once
// Scheduler: decides, before every step, which requests run and how many of
// their uncomputed tokens each computes (iteration-level scheduling).
//
// Policy, under a token budget per step and the KV pool:
//  1. Every running request with one token left (decoding) gets it, oldest
//     first, so streams keep flowing whatever else happens.
//  2. Running requests with more tokens left (prefilling, or resuming after
//     preemption) get chunks of the remaining budget, oldest first: a long
//     prompt is split over steps interleaved with the decode tokens.
//  3. Waiting requests are admitted in arrival order while the budget, the
//     running limit and the pool allow; admission matches the prefix cache
//     first (matched tokens are not computed again) and requires blocks for
//     the whole remaining prompt plus one spare block per running decoder
//     (so they need not be preempted next step). The head
//     of the queue blocks the rest (first come, first served). Nothing is
//     admitted in a step that had to preempt.
// When a running request cannot get blocks, the newest running request is
// preempted (its blocks go back to the pool, full ones into the prefix
// cache; it returns to the front of the queue and resumes from what the
// cache still holds). The oldest request always progresses: a request is
// only accepted if it fits the pool alone, so nothing waits forever.
//
// Engine thread only. Requests are owned by the caller and must stay alive
// while the scheduler refers to them (until remove()).
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine/request.h"
#include "kv/kv_manager.h"

namespace rill {

struct SchedulerOptions {
  int32_t token_budget = 512;  // tokens per step (<= the model's max_batch_tokens)
  int32_t max_running = 64;    // sequences per step
};

struct ScheduledChunk {
  Request* request = nullptr;
  int32_t n_tokens = 0;  // tokens [n_computed, n_computed + n_tokens) compute this step
  bool samples = false;  // the chunk ends at the request's last token
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // in Batch order
  std::vector<Request*> preempted;     // this step, newest first
  // Requests that can no longer run (admission failed): the engine finishes
  // them with the message.
  std::vector<std::pair<Request*, std::string>> failed;
  int32_t n_tokens = 0;
  bool empty() const { return chunks.empty(); }
};

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
  // step_computed(), or remove() the requests on failure.
  const StepPlan& schedule();
  // After a successful forward: advances each chunk's n_computed and offers
  // newly full blocks to the prefix cache.
  Status step_computed();

  const std::deque<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }
  int64_t n_preemptions() const { return n_preemptions_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  // Tokens of `r` (up to `want`) whose blocks fit now, keeping `reserve`
  // blocks free; 0 if none.
  int32_t fit(const Request& r, int32_t want, int32_t reserve) const;
  // Preempts the newest running request newer than `than` (null: any);
  // false when there is none.
  bool preempt_newest(const Request* than);
  void preempt(Request* r);
  void schedule_chunk(Request* r, int32_t n);
  void insert_running(Request* r);  // keeps running_ in arrival order
  int32_t n_decoding() const;

  KvManager& kv_;
  SchedulerOptions options_;
  std::deque<Request*> waiting_;   // arrival order; preempted requests go to the front
  std::vector<Request*> running_;  // arrival order, oldest first
  StepPlan plan_;
  int32_t budget_ = 0;
  int64_t n_preemptions_ = 0;
};

}  // namespace rill
