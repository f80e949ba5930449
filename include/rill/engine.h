#pragma once
// rill's engine API: load a model, submit generation requests from any
// thread, stream their events, cancel them. Usable without the server.
//
// One engine thread owns the model and drives every running request a step
// at a time (continuous batching over a paged KV cache with a prefix cache;
// see docs/architecture.md). Submissions, cancellations and reads of a
// request's stream are thread-safe.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "engine/sampler.h"
#include "model/model.h"  // Device

namespace rill {
namespace grammar {
class CompiledGrammar;
}

class ChatTemplate;
class Model;
class Tokenizer;

enum class FinishReason { kStop, kLength, kAborted, kError };
// "stop", "length", "abort", "error".
const char* finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, at least one
  SamplingParams sampling;
  int32_t max_tokens = 256;             // >= 1 (unless prompt_only); prompt + max_tokens must fit the context
  std::vector<std::string> stop;        // stop strings (need a tokenizer); never streamed
  std::vector<int32_t> stop_token_ids;  // end generation besides the model's EOS ids
  bool ignore_eos = false;              // keep going past the model's EOS ids
  int32_t logprobs = -1;                // -1: off; 0..kMaxTopLogprobs alternatives per token
  // Prompt scoring: -1: off; 0..kMaxTopLogprobs: the logprob of every prompt
  // token after the first (log-softmax of the model's logits at the position
  // before it; no bias, penalties or temperature) with that many
  // alternatives, delivered together in the event of the first sampled
  // token (or the last event). Such a request computes its whole prompt:
  // the prefix cache gives it no KV (there would be no logits for it), and
  // each of its prompt positions takes a logit row of its steps.
  int32_t prompt_logprobs = -1;
  // Compute the prompt (and its prompt_logprobs) and sample nothing; the
  // request ends with FinishReason::kLength. max_tokens is ignored.
  bool prompt_only = false;
  // Embedding: compute the prompt whole in one step (at most the step's
  // token budget) and deliver the model's pooled embedding
  // (Model::embedding()) in the last event; samples nothing (as
  // prompt_only) and takes no KV from the prefix cache. Needs a model that
  // declares a pooling.
  bool embed = false;
  bool skip_special_tokens = true;  // in the streamed text
  uint64_t cache_namespace = 0;     // prefix-cache isolation (adapters, tenants)
  // Cache warm-up: when the request ends, its prompt's cached prefix is
  // also written to the disk tier (needs EngineOptions::cache_dir).
  bool persist_prefix = false;
  // Constrained decoding (text/grammar): every sampled token keeps the
  // output a prefix of the grammar's language. An end-of-generation token is
  // allowed only where the grammar may end, and ends the request even with
  // ignore_eos; once nothing more can follow, the request ends (kStop, no
  // stop token). Needs a tokenizer. Null: unconstrained. Share one object
  // between requests (grammar::GrammarCache) so they share its mask cache.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  // The model's thinking block, for models whose template opens it with one
  // token and closes it with another (`<think>` ... `</think>`): the engine
  // follows the output in and out of the block. Inside it `grammar` does not
  // apply (it constrains the answer after the block; before the first token
  // the open token is allowed besides the grammar's), and at most `budget`
  // tokens are generated: once they are spent the close token is forced and
  // generation goes on with the answer. close < 0: not tracked.
  struct Thinking {
    int32_t open = -1, close = -1;  // token ids
    bool starts_inside = false;     // the prompt ends inside the block
    int32_t budget = -1;            // most tokens inside the block; -1: unbounded
    bool tracked() const { return close >= 0; }
  } thinking;
  // Speculative decoding (EngineOptions::spec): false opts this request out.
  // Either way its tokens are the same (speculation is lossless).
  bool speculative = true;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  int32_t completion_tokens = 0;
  int32_t reasoning_tokens = 0;  // of those, the thinking block's (its open and close included); tracked blocks only
  int32_t preemptions = 0;
  int32_t persisted_tokens = 0;       // persist_prefix: prompt tokens written to the disk tier
  double queue_s = 0;                 // submit -> first scheduled
  double prefill_s = 0;               // first scheduled -> first token
  double decode_s = 0;                // first token -> finished
  double first_token_s = 0;           // submit -> first token
  int32_t prefill_steps = 0;          // engine steps that computed part of the prompt
  double longest_prefill_step_s = 0;  // the longest of those steps (its whole duration)
  // Speculative decoding: draft tokens verified, and of those accepted (each
  // accepted draft is an output token that took no step of its own).
  int32_t draft_tokens = 0;
  int32_t accepted_draft_tokens = 0;
};

// What a request's stream carries. Every event but the last carries at least
// one new token; the last has `finished` set (and may carry tokens too).
struct GenerationEvent {
  std::vector<int32_t> token_ids;      // new tokens since the previous event
  std::string text;                    // new text (stop strings held back and cut)
  std::vector<SampledToken> logprobs;  // one per new token when requested
  // GenerationRequest::prompt_logprobs: prompt tokens 1..n-1, all in one
  // event (the first with a token, or the last); empty in every other event.
  std::vector<SampledToken> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  std::string stop_string;            // the stop string that ended it, if any
  std::optional<int32_t> stop_token;  // the EOS / stop token that ended it, if any
  std::string error;                  // kError: what failed
  std::vector<float> embedding;       // GenerationRequest::embed: the pooled vector, in the last event
  Usage usage;                        // set on the last event
};

// Called for each event of one request, in order, on the engine's event
// dispatcher thread (not the engine thread: the engine goes on with its
// next step meanwhile, so an event may arrive after submit() or cancel()
// returned and after the request's blocks were freed). Should not block:
// while 4,096 events wait, the engine waits too. If it throws on a
// non-final event, that request ends at the engine's next step (a few more
// tokens may be computed and counted in usage, none delivered) and nothing
// else is affected; the final event is still delivered.
using EventCallback = std::function<void(GenerationEvent&&)>;

// A request's stream as a blocking queue, for callers that read from their
// own thread. Destroying the handle before the last event cancels the request.
class RequestHandle {
 public:
  struct Channel;
  RequestHandle(std::shared_ptr<Channel> channel, uint64_t id, std::function<void(uint64_t)> cancel);
  RequestHandle(RequestHandle&&) noexcept = default;
  RequestHandle& operator=(RequestHandle&&) noexcept = default;
  ~RequestHandle();

  uint64_t id() const { return id_; }
  // Waits for the next event; false once the last event was returned.
  bool next(GenerationEvent& event);
  // Cancels at the next step boundary; the stream still ends with a final
  // event (finish reason abort).
  void cancel();

 private:
  std::shared_ptr<Channel> channel_;
  uint64_t id_ = 0;
  std::function<void(uint64_t)> cancel_;
  bool done_ = false;
};

struct EngineOptions {
  int n_threads = 0;           // compute threads; 0: one per core
  int64_t n_ctx = 0;           // longest sequence; 0: the model's
  int max_batch_tokens = 512;  // token budget of one step
  int max_running = 64;        // most requests in one step
  // Latency-aware step planning: while requests decode, a step's prefill
  // share is cut so the step's predicted time (a cost model fitted to
  // measured steps) stays within this many ms. < 0: 2.5x the predicted time
  // of the step's decode rounds alone; 0: off (the whole token budget).
  double max_step_ms = -1;
  int64_t kv_cache_mb = 0;       // KV pool; 0: see kv_cache_fraction
  double kv_cache_fraction = 0;  // of physical RAM when kv_cache_mb is 0; 0: 4 full contexts
  int32_t kv_block_size = 16;
  Device device = Device::kCpu;      // kCuda: the model runs on GPU 0
  double gpu_memory_fraction = 0.9;  // kCuda without kv_cache_mb: device memory rill may fill (KV gets the rest)
  int tensor_parallel = 1;           // > 1: the model split over that many ranks (kCuda: GPUs 0..N-1, NCCL)
  bool batch_invariant = false;      // kCuda: a request's tokens do not depend on the batch (ModelOptions)
  bool cuda_device_sampling = true;  // kCuda: sample on the device; false: logits to the host sampler (ModelOptions)
  WeightQuantization quantize = WeightQuantization::kNone;  // kCuda: --quantize fp8 (ModelOptions)
  KvTypeOptions kv_types;                                   // KV storage types per layer and side (ModelOptions)
  bool check_integrity = false;                             // verify the KV structures after every step (tests; slow)
  // Pipelined decode: on a model that queues steps (CUDA), a step of decode
  // rounds only is planned and queued while the step before it runs, its
  // tokens read on the device (engine.cpp run_step). Off: every step waits
  // for the one before it (for comparisons). Both give the same tokens
  // with batch_invariant; without it a chained step's batch keeps the rows
  // of requests that ended, so its shapes, and the logits' last bits (a
  // near tie's token), may differ from a serial step's.
  bool pipelined_decode = true;
  // Prefix-cache tiers below the device cache (see engine/kv_tiers.h).
  int64_t cache_ram_mb = 0;      // host-RAM tier; 0: off
  std::string cache_dir;         // disk tier directory; empty: off
  int64_t cache_disk_mb = 8192;  // disk tier cap
  bool kv_verify = false;        // at start, check every disk file's tensor hashes (loads always check theirs)
  // Disk tier write-behind: a finished request's computed KV (whole blocks,
  // prompt and output) of at least this many tokens is queued for disk, so
  // a restart finds it; <= 0: off (only evictions and warm-ups reach disk).
  int64_t cache_write_behind_min_tokens = 256;
  // The model artifact's identity for disk entries; Engine::load sets it
  // (artifact fingerprint), Engine::create callers may.
  std::string model_id;
  std::string model_path;  // the model's files, for messages; Engine::load sets it
  // Speculative decoding (engine/speculator.h): "off", "ngram" (prompt
  // lookup), "draft=PATH" (a smaller model of the same tokenizer), "mtp"
  // (the model's MTP layer) or "assistant=PATH" (a Gemma 4 target's
  // assistant checkpoint, which Engine::load binds to the target); at most spec_tokens (>= 1) drafts per request per
  // step, fewer as its drafts get rejected. Models with recurrent layers need ModelOptions::n_spec_states >=
  // spec_tokens (Engine::load sets it), else they run without (a log line says so).
  std::string spec = "off";
  int32_t spec_tokens = 4;
};

// One prefix-cache tier's counters.
struct CacheTierStats {
  bool enabled = false;
  int64_t bytes = 0, entries = 0, hits = 0, misses = 0, evictions = 0, errors = 0, loads = 0;
  double load_seconds = 0;
  // Disk tier writes: runs queued or being written now, files written
  // (spills and write-behind), runs dropped unwritten (write-behind with the
  // queue full, or the queue closed at shutdown), files replaced by a newer
  // file holding their whole chain.
  int64_t queued = 0, written = 0, dropped = 0, replaced = 0;
};

struct EngineStats {
  int64_t requests_submitted = 0, requests_finished = 0, requests_rejected = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  int64_t steps = 0, preemptions = 0;
  // Sequences per step: counts of steps with at most kBatchSizeBounds[i]
  // sequences (not cumulative), the last bucket for larger steps.
  static constexpr std::array<int32_t, 8> kBatchSizeBounds = {1, 2, 4, 8, 16, 32, 64, 128};
  std::array<int64_t, kBatchSizeBounds.size() + 1> batch_size_counts{};
  int64_t batch_size_sum = 0;
  int32_t running = 0, waiting = 0;
  int32_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_cached = 0;
  int32_t kv_block_size = 0;
  int64_t kv_bytes_per_token = 0;  // K and V of every layer as stored (quantized KV: the real bytes; MLA: latent rows)
  int64_t kv_tail_bytes = 0;       // k4c: every running sequence's f16 tail (model/kv_tails.h), reserved at load
  CacheTierStats ram_tier, disk_tier;
  int64_t tier_restored_tokens = 0;  // prompt tokens loaded back from the RAM / disk tiers
  int64_t integrity_errors = 0;      // with EngineOptions::check_integrity
  // Latency-aware step planning (EngineOptions::max_step_ms): the step cost
  // model's fit (ms = fixed + per token x tokens), the target and prefill
  // cap of the last step with decode rounds (0 and -1: none), steps whose
  // prefill share the target cut.
  double step_fixed_ms = 0, step_ms_per_token = 0;
  double step_target_ms = 0;
  int32_t prefill_cap_tokens = -1;
  int64_t steps_prefill_capped = 0;
  int64_t steps_pipelined = 0;  // steps queued while the step before them ran (EngineOptions::pipelined_decode)
  std::string last_integrity_error;
  // Speculative decoding: the speculator's name ("" when off) and its draft
  // tokens verified and accepted over all requests.
  std::string speculator;
  int64_t spec_draft_tokens = 0, spec_accepted_tokens = 0;
};

class Engine {
 public:
  // Loads a model file or directory with its tokenizer.
  static Result<std::unique_ptr<Engine>> load(const std::string& model_path, const EngineOptions& options);
  // Serves an already created model (its KV pool sizes the cache). The
  // tokenizer may be null: then there is no text, no stop strings and EOS
  // comes only from stop_token_ids.
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<Model> model,
                                                std::shared_ptr<const Tokenizer> tokenizer,
                                                const EngineOptions& options,
                                                std::shared_ptr<const ChatTemplate> chat_template = nullptr);
  virtual ~Engine() = default;

  // Validates and queues a request. Errors (nothing queued) name the field:
  // an empty prompt, an id outside the vocabulary, prompt + max_tokens
  // beyond the context, a request the KV pool could never hold, ...
  virtual Result<uint64_t> submit(GenerationRequest request, EventCallback on_event) = 0;
  Result<RequestHandle> submit(GenerationRequest request);
  // Cancels at the next step boundary (no-op for an unknown or finished id).
  virtual void cancel(uint64_t id) = 0;
  // Graceful shutdown's last step: at the next step boundary every queued and
  // running request ends with FinishReason::kError and `reason` as its error
  // (so each API sends its error event), and submit() refuses from now on
  // with `reason`. Idempotent; stats() and the cache tiers keep working.
  virtual void shut_down(std::string reason) = 0;

  // For graceful shutdown, from any thread, once requests have ended: waits
  // until every queued disk-tier write (spills, write-behind) is on disk or
  // `deadline` passes, then closes the queue (what is still queued, and
  // anything queued later, is dropped; the one write in progress finishes
  // in the destructor). Returns the runs dropped at the deadline; 0 when
  // everything reached disk or there is no disk tier. Without this call the
  // destructor writes the whole queue, however long that takes.
  virtual int64_t flush_cache_tiers(std::chrono::steady_clock::time_point deadline) {
    (void)deadline;
    return 0;
  }

  virtual EngineStats stats() const = 0;
  virtual const Model& model() const = 0;
  virtual const Tokenizer* tokenizer() const = 0;
  // The model's chat template; null when it ships none.
  virtual const ChatTemplate* chat_template() const = 0;
  // The ids that end generation unless ignore_eos (tokenizer EOS/EOT ids and
  // the model's generation_config eos ids).
  virtual const std::vector<int32_t>& eos_ids() const = 0;
};

}  // namespace rill
