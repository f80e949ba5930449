// rill bench: drives the engine directly (no HTTP) with N concurrent
// streams and reports aggregate throughput, TTFT and inter-token latency.
//
//   rill bench MODEL --concurrency N --prompt-tokens P --gen-tokens G
//              [--requests R] [--shared-prefix S] [--long-prompt L] [--json]
//
// Prompts are random token ids (seeded), so results do not depend on text;
// generation ignores EOS so every request produces exactly G tokens. With
// --shared-prefix S the first S tokens of every prompt are the same (a
// system prompt): later requests hit the prefix cache. --requests R > N
// keeps N in flight until R have run (R = N, 1 in flight: a cold request
// then warm ones, one after another). --long-prompt L submits one extra
// L-token request once the streams are decoding and reports the running
// streams' largest inter-token gap while it prefills. --record-tokens FILE
// writes every request's prompt and output ids, which `--spec replay=FILE`
// then proposes as drafts (speculative decoding measured at acceptance 1).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/cache_tier_options.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/loaded_model.h"
#include "cli/spec_flags.h"
#include "engine/replay_speculator.h"
#include "model/model.h"
#include "rill/engine.h"

namespace rill::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  int concurrency = 1;
  int requests = 0;  // 0: = concurrency
  int prompt_tokens = 128;
  int gen_tokens = 128;
  int shared_prefix = 0;
  int long_prompt = 0;
  int threads = 0;
  int max_batch_tokens = 512;
  double max_step_ms = -1;  // EngineOptions::max_step_ms
  int64_t kv_cache_mb = 0;
  int64_t ctx_size = 0;
  bool json = false;
  std::string record_tokens;  // path: every request's prompt + output ids
  uint64_t seed = 1;
  // Every request's sampling (default greedy); request i is seeded seed + i.
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  bool serial_steps = false;  // EngineOptions::pipelined_decode off
  DeviceFlags device;
  SpecFlags spec;
  EngineOptions tiers;  // only the cache tier fields (--cache-ram-mb, --cache-dir, ...)
};

struct Trace {
  Clock::time_point submitted, finished;
  std::vector<Clock::time_point> token_times;
  std::vector<int32_t> tokens;  // prompt then output ids (for --record-tokens)
  Usage usage;
  FinishReason reason = FinishReason::kLength;
  std::string error;
  bool done = false;
};

double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(idx);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
}

class Runner {
 public:
  Runner(Engine& e, const BenchOptions& o) : e_(e), o_(o), rng_(o.seed) {
    const auto v = static_cast<int32_t>(e.model().n_vocab());
    for (int i = 0; i < o.shared_prefix; ++i) prefix_.push_back(random_id(v));
  }

  // Submits request i; returns false on a submission error.
  bool submit(size_t i, int n_prompt, Trace& t) {
    const auto v = static_cast<int32_t>(e_.model().n_vocab());
    GenerationRequest r;
    r.prompt.assign(prefix_.begin(), prefix_.begin() + std::min<size_t>(prefix_.size(), static_cast<size_t>(n_prompt)));
    while (static_cast<int>(r.prompt.size()) < n_prompt) r.prompt.push_back(random_id(v));
    r.max_tokens = o_.gen_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = o_.temperature;
    r.sampling.top_k = o_.top_k;
    r.sampling.top_p = o_.top_p;
    r.sampling.min_p = o_.min_p;
    r.sampling.seed = o_.seed + i;
    t.tokens = r.prompt;
    t.submitted = Clock::now();
    auto id = e_.submit(std::move(r), [this, &t](GenerationEvent&& ev) {
      const auto now = Clock::now();
      std::lock_guard lk(mu_);
      for (size_t k = 0; k < ev.token_ids.size(); ++k) t.token_times.push_back(now);
      t.tokens.insert(t.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      if (ev.finished) {
        t.finished = now;
        t.usage = ev.usage;
        t.reason = ev.finish_reason;
        t.error = ev.error;
        t.done = true;
        ++n_done_;
        done_.notify_all();
      }
    });
    if (!id.ok()) {
      std::fprintf(stderr, "rill bench: request %zu: %s\n", i, id.error().message.c_str());
      return false;
    }
    return true;
  }
  void wait_done(int n) {
    std::unique_lock lk(mu_);
    done_.wait(lk, [&] { return n_done_ >= n; });
  }
  // Waits until every trace in `ts` has at least `n` tokens.
  void wait_tokens(std::vector<Trace>& ts, size_t n) {
    for (;;) {
      {
        std::lock_guard lk(mu_);
        if (std::all_of(ts.begin(), ts.end(), [&](const Trace& t) { return t.done || t.token_times.size() >= n; }))
          return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::mutex& mu() { return mu_; }

 private:
  int32_t random_id(int32_t v) { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(v)); }
  Engine& e_;
  const BenchOptions& o_;
  std::mt19937_64 rng_;
  std::vector<int32_t> prefix_;
  std::mutex mu_;
  std::condition_variable done_;
  int n_done_ = 0;
};

int run_bench(const BenchOptions& o) {
  EngineOptions eo;
  eo.n_threads = o.threads;
  eo.max_batch_tokens = o.max_batch_tokens;
  eo.max_step_ms = o.max_step_ms;
  eo.max_running = std::max(o.concurrency + (o.long_prompt > 0 ? 1 : 0), 1);
  eo.kv_cache_mb = o.kv_cache_mb;
  eo.n_ctx = o.ctx_size;
  eo.device = o.device.value();
  eo.gpu_memory_fraction = o.device.gpu_memory_fraction;
  eo.tensor_parallel = o.device.tensor_parallel;
  eo.batch_invariant = o.device.batch_invariant;
  eo.quantize = o.device.quantization();
  eo.cuda_device_sampling = !o.device.host_sampling;
  eo.pipelined_decode = !o.serial_steps;
  o.spec.apply(eo);
  auto kv_types = o.device.kv_types.value();
  if (!kv_types.ok()) {
    std::fprintf(stderr, "rill bench: %s\n", kv_types.error().message.c_str());
    return 2;
  }
  eo.kv_types = std::move(kv_types).value();
  eo.cache_ram_mb = o.tiers.cache_ram_mb;
  eo.cache_dir = o.tiers.cache_dir;
  eo.cache_disk_mb = o.tiers.cache_disk_mb;
  eo.kv_verify = o.tiers.kv_verify;
  auto path = resolve_model_path(o.model);
  if (!path.ok()) {
    std::fprintf(stderr, "rill bench: %s\n", path.error().message.c_str());
    return 1;
  }
  auto engine = Engine::load(*path, eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "rill bench: %s\n", engine.error().message.c_str());
    return 1;
  }
  Engine& e = **engine;
  const int n_requests = o.requests > 0 ? o.requests : o.concurrency;
  std::vector<Trace> traces(static_cast<size_t>(n_requests));
  Runner runner(e, o);
  const auto t0 = Clock::now();

  // Keep `concurrency` requests in flight.
  int submitted = 0;
  for (; submitted < std::min(o.concurrency, n_requests); ++submitted) {
    if (!runner.submit(static_cast<size_t>(submitted), o.prompt_tokens, traces[static_cast<size_t>(submitted)]))
      return 1;
  }
  Trace long_trace;
  Clock::time_point long_submitted;
  if (o.long_prompt > 0) {
    // Once every stream is past a few tokens, inject the long prompt.
    runner.wait_tokens(traces, 4);
    long_submitted = Clock::now();
    if (!runner.submit(static_cast<size_t>(n_requests), o.long_prompt, long_trace)) return 1;
  }
  while (submitted < n_requests) {
    runner.wait_done(submitted - o.concurrency + 1);
    if (!runner.submit(static_cast<size_t>(submitted), o.prompt_tokens, traces[static_cast<size_t>(submitted)]))
      return 1;
    ++submitted;
  }
  runner.wait_done(n_requests + (o.long_prompt > 0 ? 1 : 0));
  const auto t_end = Clock::now();

  std::lock_guard lk(runner.mu());
  std::vector<double> ttft, itl;
  int64_t n_gen = 0, n_prompt = 0, n_cached = 0;
  for (const Trace& t : traces) {
    if (t.reason == FinishReason::kError) {
      std::fprintf(stderr, "rill bench: a request failed: %s\n", t.error.c_str());
      return 1;
    }
    n_gen += t.usage.completion_tokens;
    n_prompt += t.usage.prompt_tokens;
    n_cached += t.usage.cached_tokens;
    if (t.token_times.empty()) continue;
    ttft.push_back(ms(t.token_times.front() - t.submitted));
    for (size_t k = 1; k < t.token_times.size(); ++k) itl.push_back(ms(t.token_times[k] - t.token_times[k - 1]));
  }
  const double wall_s = ms(t_end - t0) / 1000.0;
  // Aggregate decode throughput in the steady state: from the moment every
  // stream of the first wave has its first token (no prompt left to
  // prefill) to the moment the first of them finishes, the tokens all
  // streams produced over that window. With one stream: its own decode rate.
  Clock::time_point window_begin = t0, window_end = t_end;
  const size_t wave = std::min(traces.size(), static_cast<size_t>(o.concurrency));
  for (size_t i = 0; i < wave; ++i) {
    if (traces[i].token_times.empty()) continue;
    window_begin = std::max(window_begin, traces[i].token_times.front());
    window_end = std::min(window_end, traces[i].token_times.back());
  }
  int64_t n_window = 0;
  for (const Trace& t : traces) {
    for (const auto& tt : t.token_times) n_window += tt > window_begin && tt <= window_end;
  }
  const double window_s = ms(window_end - window_begin) / 1000.0;
  const double decode_tok_s = window_s > 0 ? static_cast<double>(n_window) / window_s : 0;

  nlohmann::ordered_json j;
  j["model"] = *path;
  j["concurrency"] = o.concurrency;
  j["requests"] = n_requests;
  j["prompt_tokens"] = o.prompt_tokens;
  j["gen_tokens"] = o.gen_tokens;
  j["shared_prefix"] = o.shared_prefix;
  j["sampling"] = {{"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}, {"min_p", o.min_p}};
  j["wall_s"] = wall_s;
  j["generated_tokens"] = n_gen;
  j["cached_tokens"] = n_cached;
  j["output_tok_s"] = static_cast<double>(n_gen) / wall_s;
  j["decode_tok_s"] = decode_tok_s;
  j["ttft_ms"] = {{"p50", percentile(ttft, 0.5)}, {"p99", percentile(ttft, 0.99)}, {"max", percentile(ttft, 1.0)}};
  j["ttft_ms_each"] = ttft;
  j["cached_tokens_each"] = nlohmann::json::array();
  for (const Trace& t : traces) j["cached_tokens_each"].push_back(t.usage.cached_tokens);
  j["itl_ms"] = {{"p50", percentile(itl, 0.5)}, {"p99", percentile(itl, 0.99)}, {"max", percentile(itl, 1.0)}};
  if (o.long_prompt > 0) {
    // The streams' gaps between the long prompt's submission and its first token.
    const Clock::time_point end = long_trace.token_times.empty() ? t_end : long_trace.token_times.front();
    double max_gap = 0;
    for (const Trace& t : traces) {
      for (size_t k = 1; k < t.token_times.size(); ++k) {
        if (t.token_times[k] > long_submitted && t.token_times[k - 1] < end) {
          max_gap = std::max(max_gap, ms(t.token_times[k] - t.token_times[k - 1]));
        }
      }
    }
    const double prefill_ms = ms(end - long_submitted);
    j["long_prompt"] = {{"tokens", o.long_prompt},
                        {"prefill_ms", prefill_ms},
                        {"chunks", long_trace.usage.prefill_steps},
                        {"longest_chunk_step_ms", long_trace.usage.longest_prefill_step_s * 1000.0},
                        {"streams_max_gap_ms", max_gap},
                        {"normal_step_ms", percentile(itl, 0.5)}};
  }
  const EngineStats s = e.stats();
  j["preemptions"] = s.preemptions;
  if (!s.speculator.empty()) {
    j["spec"] = {{"speculator", s.speculator},
                 {"spec_tokens", o.spec.spec_tokens},
                 {"draft_tokens", s.spec_draft_tokens},
                 {"accepted_tokens", s.spec_accepted_tokens}};
  }
  if (!o.record_tokens.empty()) {
    std::vector<std::vector<int32_t>> sequences;
    for (const Trace& t : traces) sequences.push_back(t.tokens);
    if (Status st = write_replay_file(o.record_tokens, sequences); !st.ok()) {
      std::fprintf(stderr, "rill bench: %s\n", st.error().message.c_str());
      return 1;
    }
  }
  j["steps"] = s.steps;
  j["steps_pipelined"] = s.steps_pipelined;  // queued while the step before them ran (see --serial-steps)
  if (s.ram_tier.enabled || s.disk_tier.enabled) {
    j["tier_restored_tokens"] = s.tier_restored_tokens;
    j["ram_tier_hits"] = s.ram_tier.hits;
    j["disk_tier_hits"] = s.disk_tier.hits;
  }
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%d requests, %d concurrent, %d prompt + %d generated tokens each (%d shared)\n", n_requests,
                o.concurrency, o.prompt_tokens, o.gen_tokens, o.shared_prefix);
    std::printf("  wall %.2f s, output %.1f tok/s, decode %.1f tok/s, cached %lld tokens\n", wall_s,
                static_cast<double>(n_gen) / wall_s, decode_tok_s, static_cast<long long>(n_cached));
    std::printf("  TTFT p50 %.1f ms p99 %.1f ms; ITL p50 %.2f ms p99 %.2f ms max %.2f ms\n", percentile(ttft, 0.5),
                percentile(ttft, 0.99), percentile(itl, 0.5), percentile(itl, 0.99), percentile(itl, 1.0));
    if (o.long_prompt > 0) std::printf("  long prompt: %s\n", j["long_prompt"].dump().c_str());
    if (j.contains("spec")) std::printf("  speculation: %s\n", j["spec"].dump().c_str());
  }
  (void)n_prompt;
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand("bench", "Measure throughput and latency of the engine with concurrent streams");
  sub->add_option("model", o->model, "a .gguf file or a Hugging Face model directory (default: the default model)");
  sub->add_option("--concurrency", o->concurrency, "requests in flight")->check(CLI::Range(1, 4096));
  sub->add_option("--requests", o->requests, "requests in all (default: --concurrency)")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--prompt-tokens", o->prompt_tokens, "prompt length")->check(CLI::Range(1, 1 << 22));
  sub->add_option("--gen-tokens", o->gen_tokens, "tokens generated per request")->check(CLI::Range(1, 1 << 22));
  sub->add_option("--shared-prefix", o->shared_prefix, "leading prompt tokens shared by every request")
      ->check(CLI::Range(0, 1 << 22));
  sub->add_option("--long-prompt", o->long_prompt, "inject one prompt of this many tokens while the streams decode")
      ->check(CLI::Range(0, 1 << 22));
  sub->add_option("--threads,-t", o->threads, "CPU threads (default: one per core)");
  sub->add_option("--max-batch-tokens", o->max_batch_tokens, "token budget per step")->check(CLI::Range(1, 1 << 16));
  sub->add_option("--max-step-ms", o->max_step_ms,
                  "ms a step may take while requests decode: longer prefills are chunked to fit (default: 2.5x the "
                  "measured decode step; 0: no limit)")
      ->check(CLI::Range(0.0, 600000.0));
  sub->add_option("--kv-cache-mb", o->kv_cache_mb, "KV cache size (default: four full contexts)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--ctx-size,-c", o->ctx_size, "context tokens per sequence")->check(CLI::Range(16, 1 << 22));
  sub->add_option("--seed", o->seed, "seed of the random prompts (and of request i's sampling: seed + i)");
  sub->add_option("--temperature", o->temperature, "sampling temperature of every request (0: greedy)")
      ->check(CLI::Range(0.0, 100.0));
  sub->add_option("--top-k", o->top_k, "top-k of every request (0: off)")->check(CLI::Range(0, 1 << 30));
  sub->add_option("--top-p", o->top_p, "top-p of every request (1: off)")->check(CLI::Range(0.0, 1.0));
  sub->add_option("--min-p", o->min_p, "min-p of every request (0: off)")->check(CLI::Range(0.0, 1.0));
  sub->add_flag("--json", o->json, "print the results as JSON");
  sub->add_flag("--serial-steps", o->serial_steps,
                "with --device cuda: plan each decode step only once the step before it returned its tokens, "
                "instead of while it runs (for comparing the two: the same tokens with --batch-invariant; without it "
                "the last bits of the logits, and so near-tied tokens, may differ)");
  sub->add_option("--record-tokens", o->record_tokens,
                  "write every request's prompt and output token ids to this file (for --spec replay=FILE)");
  o->device.add_to(sub);
  o->spec.add_to(sub);
  add_cache_tier_options(*sub, o->tiers);
  return {sub, [o]() -> int { return run_bench(*o); }};
}

}  // namespace rill::cli
