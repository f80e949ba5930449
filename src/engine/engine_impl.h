#pragma once
// EngineImpl: the engine thread and everything it owns (see rill/engine.h).
// Threads: submit()/cancel()/stats() from any thread touch only the
// mutex-guarded inbox and stats; everything else belongs to the engine thread.
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <optional>
#include "engine/event_dispatcher.h"
#include "engine/grammar_masks.h"
#include "engine/kv_tiers.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/speculator.h"
#include "kv/block_pool.h"
#include "kv/kv_manager.h"
#include "kv/prefix_tree.h"
#include "kv/state_pool.h"

#include "model/model.h"
#include "rill/engine.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace rill {

class EngineImpl final : public Engine {
 public:
  EngineImpl(std::unique_ptr<Model> model, std::shared_ptr<const Tokenizer> tokenizer, const EngineOptions& options,
             std::shared_ptr<const ChatTemplate> chat_template);
  ~EngineImpl() override;
  // Opens the cache tiers and starts the engine thread.
  Status start();

  Result<uint64_t> submit(GenerationRequest request, EventCallback on_event) override;
  void cancel(uint64_t id) override;
  void shut_down(std::string reason) override;
  EngineStats stats() const override;
  int64_t flush_cache_tiers(std::chrono::steady_clock::time_point deadline) override;
  const Model& model() const override { return *model_; }
  const Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  const ChatTemplate* chat_template() const override { return chat_template_.get(); }
  const std::vector<int32_t>& eos_ids() const override { return eos_ids_; }

 private:
  Status validate(const GenerationRequest& r) const;
  void loop();
  bool has_work() const { return !live_.empty(); }
  // Erases the finished requests from live_, but for those a step in
  // flight still names (kept until it completes).
  void erase_finished();
  void take_inbox(std::vector<std::unique_ptr<Request>>& incoming, std::vector<uint64_t>& cancels,
                  std::vector<std::pair<uint64_t, std::string>>& consumer_failures);
  // One step: launches one unless a step is in flight, chains the next
  // behind it where it can (pipelined decode, see engine.cpp), then
  // completes the oldest step in flight.
  void run_step();
  // Plans and launches a step; false when nothing was launched (an empty
  // plan, or its launch failed and its requests with it).
  bool launch_step();
  // Launches a planned step (chain: its tokens are the draws of the step in
  // flight) and records it in launched_; `start` is when its planning began.
  Status launch_plan(const StepPlan& plan, StepIds ids, bool chain, std::chrono::steady_clock::time_point start);
  // Ends the requests of a step that could not run.
  void fail_plan(const StepPlan& plan, const Status& st);
  // Whether the next step may be queued behind the one in flight.
  bool can_chain() const;
  // Plans and queues the next round behind the step in flight when
  // can_chain(); otherwise does nothing.
  void chain_step();
  // Collects the oldest step in flight and commits its tokens.
  void complete_step();
  // Appends drafts to the decoding requests that speculate this step.
  void propose_drafts();
  // False when the decode rounds are compute-bound (no drafts this step).
  bool speculation_pays() const;
  // The most drafts r takes in a step it speculates (Request::Speculation::k,
  // at least 1 when it may speculate, capped by max_tokens); 0: none.
  int32_t draft_length(const Request& r) const;
  // After a step's verification, hands the hidden states of every
  // speculating chunk's kept positions to a speculator that reads them.
  void observe_hidden();
  // The token non-speculative decoding picks from r's logit row `row` (the
  // device's pick for kGreedy / kSample steps); -1 when r finished instead
  // (no token of the grammar can continue).
  int32_t pick_token(Request& r, int32_t row, StepIds ids, SampledToken* sampled);
  // Samples a computed chunk's token(s): its owed token's row and, when it
  // verifies drafts, each following row while the drafts hold (see
  // speculator.h), then rolls back the rejected drafts' KV.
  void sample_chunk(Request& r, const ScheduledChunk& c, const ModelRunner::ChunkRows& rows, StepIds ids,
                    GenerationEvent& event);
  // Fills r's token mask for this step; false (r finished with an error)
  // when the grammar allows no token here.
  bool fill_grammar_mask(Request& r);
  // fill_grammar_mask without the finish: false when the mask allows no
  // token (`complete`: the matcher's parse-stack bounds were not reached).
  static bool fill_mask(Request& r, bool& complete);
  // Before a kGreedy / kSample step: fills the mask of every sampling chunk
  // whose grammar applies (ModelRunner hands them to the model). False when
  // one allows no token: the step then samples on the host, where
  // pick_token ends that request exactly as a host step would.
  bool fill_device_masks(const StepPlan& plan);
  // Appends the sampled token `id` (with its logprobs when the request asked
  // for them) to r and to `event`; finishes r when it stops.
  // Moves r.think past token id (GenerationRequest::Thinking).
  static void advance_thinking(Request& r, int32_t id);
  void commit_token(Request& r, int32_t id, const SampledToken* sampled, GenerationEvent& event);
  // Appends the logprobs of the prompt tokens this step's scored rows of r
  // predict to r.prompt_scores.
  void score_prompt(Request& r, const ModelRunner::ChunkRows& rows);
  // Ends r: frees its KV, sends the final event (merged into `event`).
  void finish(Request& r, FinishReason reason, GenerationEvent&& event, std::string error = {});
  // Hands an event to the dispatcher (its consumer runs off this thread; a
  // consumer that throws ends r at a later step, through take_inbox).
  void deliver(Request& r, GenerationEvent&& event);
  void publish_stats();

  std::unique_ptr<Model> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatTemplate> chat_template_;
  EngineOptions options_;
  std::vector<int32_t> eos_ids_;
  uint64_t model_ns_ = 0;  // hash of the model's config fingerprint

  BlockPool pool_;
  PrefixTree tree_;
  StatePool states_;
  StatePool kv_tails_;  // the model's KV tail slots (k4c; none otherwise)
  KvManager kv_;
  Scheduler scheduler_;
  ModelRunner runner_;
  std::unique_ptr<KvTiers> tiers_;                       // null without --cache-ram-mb / --cache-dir
  std::optional<GrammarMasks> grammar_masks_;            // with a tokenizer
  std::unique_ptr<Speculator> speculator_;               // null: no speculation
  std::vector<int32_t> drafts_;                          // propose / verify scratch
  std::vector<DraftRequest> draft_requests_;             // propose_drafts scratch: one per speculating row
  std::vector<int32_t> chunk_starts_;                    // [step chunks]: first position of each
  std::vector<HiddenRows> hidden_rows_;                  // observe_hidden scratch: one per speculating chunk
  std::vector<int32_t> hidden_tables_;                   // ... their block tables end to end
  std::vector<std::pair<size_t, size_t>> table_spans_;   // ... and where each is in it
  std::vector<int32_t> hidden_group_tables_;             // ... their own blocks of groups 1.., end to end
  std::vector<std::pair<size_t, int32_t>> group_spans_;  // ... where each request's are, its own block count
  std::vector<Request*> draft_rows_;                     // ... and its request
  std::vector<BlockLease> chain_scratch_;                // observe_hidden: blocks for chained drafts' rows
  int64_t spec_drafted_ = 0, spec_accepted_ = 0;         // EngineStats::spec_*

  // Engine thread only.
  std::unordered_map<uint64_t, std::unique_ptr<Request>> live_;
  std::vector<uint64_t> finished_ids_;       // erased from live_ after the step
  std::vector<ScheduledChunk> step_chunks_;  // the completing step's plan, copied (finish() edits the plan)
  // Steps launched and not completed (ModelRunner::n_in_flight(), at most
  // two), oldest at oldest_launched_.
  struct LaunchedStep {
    std::vector<ScheduledChunk> chunks;  // its plan, copied
    StepIds ids = StepIds::kHost;
    int32_t n_tokens = 0;
    std::chrono::steady_clock::time_point start;  // when its planning began
    // A step was chained behind it: Scheduler::step_queued() counted its
    // tokens as computed, and complete_step() commits its blocks.
    bool chained_behind = false;
  };
  LaunchedStep launched_[2];
  int oldest_launched_ = 0;
  bool warned_misprediction_ = false;  // chain_step found a plan other than the predicted rounds (said once)
  std::chrono::steady_clock::time_point last_completed_;  // the last complete_step()'s end

  // Inbox, guarded by mu_.
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> cancel_inbox_;
  std::vector<std::pair<uint64_t, std::string>> consumer_failures_;  // from the dispatcher: (request, message)
  bool stopping_ = false;
  std::optional<std::string> shut_down_;  // shut_down()'s reason; submissions refused
  bool shut_down_done_ = false;           // the engine thread ended every request
  uint64_t next_id_ = 1;

  mutable std::mutex stats_mu_;
  EngineStats stats_;

  std::thread thread_;
  // Consumers' callbacks run here; created before and destroyed after thread_
  // (every event the engine thread posted is delivered before it goes).
  std::unique_ptr<EventDispatcher> dispatcher_;
};

}  // namespace rill
