// rill serve: the OpenAI / Anthropic compatible HTTP server over the engine.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/cache_tier_options.h"
#include "cli/commands.h"
#include "cli/device_flags.h"
#include "cli/loaded_model.h"
#include "cli/spec_flags.h"
#include "model/model.h"
#include "rill/engine.h"
#include "server/app.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/response_store.h"

namespace rill::cli {
namespace {

struct ServeOptions {
  std::string model;
  server::ServerOptions server;
  EngineOptions engine;
  DeviceFlags device;
  bool serial_steps = false;  // EngineOptions::pipelined_decode off
  SpecFlags spec;
  server::HttpServerOptions http;  // the connection limits below (host, port, io threads, body cap: `server`)
  double shutdown_grace_s = 30;
  bool api_key_given = false;  // --api-key was on the command line (maybe as '')
};

// An empty key would turn authentication off without a word: refuse it,
// whether it came from --api-key '' or from an empty $RILL_API_KEY (a shell
// variable that was never set, expanded into it).
Result<std::string> api_key_of(const ServeOptions& o) {
  if (o.api_key_given) {
    if (o.server.api_key.empty())
      return Error{"--api-key: the key is empty (leave the flag out to serve without a key)"};
    return o.server.api_key;
  }
  if (const char* k = std::getenv("RILL_API_KEY")) {
    if (*k == 0) return Error{"$RILL_API_KEY is set but empty (unset it to serve without a key)"};
    return std::string(k);
  }
  return std::string();
}

const char* signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

// Waits for SIGINT/SIGTERM, then shuts down gracefully: stop accepting, let
// running requests finish for `grace_s` seconds, end what is left with each
// API's error event (Engine::shut_down), wait for those replies to leave,
// then stop. A second signal at any point exits at once (128 + signal).
// Returns the process's exit code.
int shut_down(const sigset_t& signals, server::HttpServer& http, Engine& engine, double grace_s) {
  int sig = 0;
  sigwait(&signals, &sig);
  std::printf("rill serve: %s: no new requests; %lld running get up to %.0f s to finish (a second signal exits now)\n",
              signal_name(sig), static_cast<long long>(http.active_responses()), grace_s);
  std::fflush(stdout);
  http.stop_accepting();
  using Clock = std::chrono::steady_clock;
  // Polls for a second signal while `done` is false, up to `seconds`; false
  // when a signal came.
  auto wait_until = [&](auto done, double seconds) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (!done() && Clock::now() < deadline) {
      const timespec tick{0, 50'000'000};
      if (sigtimedwait(&signals, nullptr, &tick) > 0) return false;
    }
    return true;
  };
  auto idle = [&] { return http.active_responses() == 0; };
  if (!wait_until(idle, grace_s)) {
    std::printf("rill serve: second signal: exiting now\n");
    std::fflush(stdout);
    std::_Exit(128 + sig);
  }
  if (!idle()) {
    std::printf("rill serve: grace period over: ending %lld requests\n",
                static_cast<long long>(http.active_responses()));
    engine.shut_down("the server is shutting down");
    // The error events are written by the I/O threads; give them a moment.
    if (!wait_until(idle, 5.0)) std::_Exit(128 + sig);
  }
  // Write-behind and spills still queued for the disk tier reach the disk
  // (bounded: what is left at the deadline is dropped and counted); the
  // flush runs on its own thread so a second signal still exits at once.
  std::atomic<bool> flushed{false};
  int64_t dropped = 0;
  std::thread flusher([&] {
    dropped = engine.flush_cache_tiers(Clock::now() + std::chrono::seconds(60));
    flushed = true;
  });
  if (!wait_until([&] { return flushed.load(); }, 3600)) std::_Exit(128 + sig);
  flusher.join();
  if (dropped > 0)
    std::printf("rill serve: %lld disk-tier writes dropped at the flush deadline\n", static_cast<long long>(dropped));
  http.stop();
  std::printf("rill serve: stopped\n");
  return 0;
}

int run_serve(ServeOptions& o) {
  // Signals are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto key = api_key_of(o);
  if (!key.ok()) {
    std::fprintf(stderr, "rill serve: %s\n", key.error().message.c_str());
    return 2;
  }
  auto resolved = resolve_model_path(o.model);
  if (!resolved.ok()) {
    std::fprintf(stderr, "rill serve: %s\n", resolved.error().message.c_str());
    return 1;
  }
  const std::string& path = *resolved;
  o.engine.device = o.device.value();
  o.engine.gpu_memory_fraction = o.device.gpu_memory_fraction;
  o.engine.tensor_parallel = o.device.tensor_parallel;
  o.engine.batch_invariant = o.device.batch_invariant;
  o.engine.quantize = o.device.quantization();
  o.engine.cuda_device_sampling = !o.device.host_sampling;
  o.engine.pipelined_decode = !o.serial_steps;
  o.spec.apply(o.engine);
  auto kv_types = o.device.kv_types.value();
  if (!kv_types.ok()) {
    std::fprintf(stderr, "rill serve: %s\n", kv_types.error().message.c_str());
    return 2;
  }
  o.engine.kv_types = std::move(kv_types).value();
  auto engine = Engine::load(path, o.engine);
  if (!engine.ok()) {
    std::fprintf(stderr, "rill serve: %s\n", engine.error().message.c_str());
    return 1;
  }
  server::ServerOptions so = o.server;
  if (so.model_id.empty()) so.model_id = std::filesystem::path(path).stem().string();
  so.api_key = *key;
  server::Metrics metrics;
  server::ResponseStore responses(so.response_ttl_s, std::max<int64_t>(0, so.response_store_mb) << 20);
  server::ServerContext ctx{
      **engine, (*engine)->chat_template(), so, &metrics, &responses, &(*engine)->model().config().generation};
  server::App app(ctx);
  server::HttpServerOptions ho = o.http;
  ho.host = so.host;
  ho.port = so.port;
  ho.io_threads = so.io_threads;
  ho.max_body_bytes = so.max_body_bytes;
  auto http =
      server::HttpServer::start(ho, [&app](const server::HttpRequest& req, std::shared_ptr<server::Responder> res) {
        app.dispatch(req, std::move(res));
      });
  if (!http.ok()) {
    std::fprintf(stderr, "rill serve: %s\n", http.error().message.c_str());
    return 1;
  }
  app.set_http_server(http->get());
  const Model& m = (*engine)->model();
  std::printf("rill serve: %s (%lld-token context, %d KV blocks of %d tokens)\n", so.model_id.c_str(),
              static_cast<long long>(m.n_ctx()), m.n_kv_blocks(), m.kv_block_size());
  std::printf("rill serve: listening on http://%s:%d  (chat page at /, OpenAI API at /v1)\n", so.host.c_str(),
              (*http)->port());
  const EngineStats st = (*engine)->stats();
  if (st.ram_tier.enabled) {
    std::printf("rill serve: host-RAM cache tier of %lld MiB\n", static_cast<long long>(o.engine.cache_ram_mb));
  }
  if (st.disk_tier.enabled) {
    std::printf("rill serve: disk cache tier %s: %lld entries, %.1f MiB (cap %lld MiB)\n", o.engine.cache_dir.c_str(),
                static_cast<long long>(st.disk_tier.entries), static_cast<double>(st.disk_tier.bytes) / (1 << 20),
                static_cast<long long>(o.engine.cache_disk_mb));
  }
  std::fflush(stdout);
  const int rc = shut_down(signals, **http, **engine, o.shutdown_grace_s);
  // The engine goes first: its destructor ends what still runs and its
  // dispatcher delivers every queued event, whose consumers use ctx, the
  // metrics, the response store and the HTTP server's responders; only
  // then may those go (they were declared after the engine, so they would
  // otherwise be destroyed before it).
  (*engine).reset();
  return rc;
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* sub = app.add_subcommand("serve", "Serve a model over the OpenAI and Anthropic HTTP APIs");
  auto& s = o->server;
  auto& e = o->engine;
  sub->add_option("model", o->model, "a .gguf file or a Hugging Face model directory (default: the default model)");
  sub->add_option("--host", s.host, "address to bind (default 127.0.0.1: this machine only)");
  sub->add_option("--port", s.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  CLI::Option* api_key = sub->add_option("--api-key", s.api_key,
                                         "require this key (Authorization: Bearer or x-api-key); also $RILL_API_KEY");
  sub->add_option("--cors-origin", s.cors_origins, "allow browser requests from this origin (repeatable; * for any)");
  sub->add_option("--max-body-bytes", s.max_body_bytes, "largest request body (413 beyond)");
  sub->add_option("--max-n", s.max_n, "largest n (choices per request)")->check(CLI::Range(1, 128));
  sub->add_option("--max-tokens-cap", s.max_tokens_cap, "largest max_tokens a request may ask for (0: the context)");
  sub->add_option("--default-max-tokens", s.default_max_tokens,
                  "max_tokens when a request sets none (default 4096, or the context left if less; 0: the context)");
  sub->add_option("--response-ttl", s.response_ttl_s, "seconds a stored Responses API response lives");
  sub->add_option("--response-store-mb", s.response_store_mb, "memory cap of the Responses store (LRU beyond)");
  sub->add_option("--io-threads", s.io_threads, "HTTP I/O threads")->check(CLI::Range(1, 64));
  // HTTP connection limits and timeouts (server/http_server.h; docs/limits.md).
  auto& h = o->http;
  sub->add_option("--handler-threads", h.handler_threads,
                  "threads that run request handlers (parse, template, tokenize)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--max-connections", h.max_connections,
                  "open connections beyond which new ones get 503 (0: the fd limit less 64, at most 4096)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--max-header-bytes", h.max_header_bytes, "largest request header block or chunked trailer (431)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 20));
  sub->add_option("--header-timeout", h.header_timeout_s, "seconds to receive a request header (408 beyond)")
      ->check(CLI::Range(0.01, 86400.0));
  sub->add_option("--body-timeout", h.body_timeout_s, "seconds to receive a request body (408 beyond)")
      ->check(CLI::Range(0.01, 86400.0));
  sub->add_option("--idle-timeout", h.idle_timeout_s, "seconds a kept-alive connection may wait for its next request")
      ->check(CLI::Range(0.01, 86400.0));
  sub->add_option("--send-timeout", h.send_timeout_s,
                  "seconds a client may take no response bytes before its response is abandoned")
      ->check(CLI::Range(0.01, 86400.0));
  sub->add_option("--max-write-queue-bytes", h.max_write_queue_bytes,
                  "response bytes queued for a slow client beyond which its response is abandoned")
      ->check(CLI::Range(size_t{4096}, size_t{1} << 32));
  sub->add_option("--model-id", s.model_id, "the model name clients see (default: the file name)");
  sub->add_option("--temperature", s.temperature, "default temperature");
  sub->add_option("--top-p", s.top_p, "default top_p");
  sub->add_option("--top-k", s.top_k, "default top_k");
  sub->add_option("--min-p", s.min_p, "default min_p");
  sub->add_option("--repeat-penalty", s.repetition_penalty, "default repetition penalty");
  sub->add_option("--threads,-t", e.n_threads, "CPU threads (default: one per core)");
  sub->add_option("--ctx-size,-c", e.n_ctx, "context tokens per sequence (default: the model's)")
      ->check(CLI::Range(16, 1 << 22));
  sub->add_option("--max-batch-tokens", e.max_batch_tokens, "token budget of one engine step")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--max-running", e.max_running, "most requests in one step")->check(CLI::Range(1, 4096));
  sub->add_option("--max-step-ms", e.max_step_ms,
                  "ms a step may take while requests decode: longer prefills are chunked to fit (default: 2.5x the "
                  "measured decode step; 0: no limit)")
      ->check(CLI::Range(0.0, 600000.0));
  sub->add_option("--kv-cache-mb", e.kv_cache_mb, "KV cache size in MiB (default: four full contexts)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--kv-cache-fraction", e.kv_cache_fraction, "KV cache as a fraction of RAM")
      ->check(CLI::Range(0.0, 0.95));
  sub->add_option("--shutdown-grace", o->shutdown_grace_s,
                  "seconds running requests get to finish after SIGTERM/SIGINT before they end with an error")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_flag("--serial-steps", o->serial_steps,
                "with --device cuda: plan each decode step only once the step before it returned its tokens, "
                "instead of while it runs (for comparing the two: the same tokens with --batch-invariant; without it "
                "the last bits of the logits, and so near-tied tokens, may differ)");
  o->device.add_to(sub);
  o->spec.add_to(sub);
  add_cache_tier_options(*sub, e);
  return {sub, [o, api_key]() -> int {
            o->api_key_given = api_key->count() > 0;
            return run_serve(*o);
          }};
}

}  // namespace rill::cli
