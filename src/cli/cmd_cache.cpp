// rill cache: the prefix cache's disk tier from the command line.
//
//   rill cache warm MODEL --file PROMPT.txt --cache-dir DIR [--chat]
//       computes the file's text once and stores its KV in DIR, so the next
//       request (rill serve --cache-dir DIR) that starts with it is a hit.
//       --chat stores it as a system message rendered by the chat template
//       (no generation prompt), for chat requests that begin with it.
//   rill cache ls --cache-dir DIR      one line per entry (works while a
//                                      server owns DIR)
//   rill cache clear --cache-dir DIR   removes every entry (refused while a
//                                      server owns DIR)
#include <cstdio>
#include <ctime>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cache_tier_options.h"
#include "cli/commands.h"
#include "cli/loaded_model.h"
#include "kv/kv_dir.h"
#include "rill/engine.h"
#include "server/cache_warm.h"
#include "server/server_context.h"

namespace rill::cli {
namespace {

struct CacheOptions {
  std::string model;
  std::string file;
  bool chat = false;
  EngineOptions engine;  // cache_dir, cache_disk_mb, kv_verify, n_threads, n_ctx
};

std::string utc_time(int64_t t) {
  const std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int run_warm(const CacheOptions& o) {
  std::ifstream in(o.file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "rill cache warm: %s: cannot read the file\n", o.file.c_str());
    return 1;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto path = resolve_model_path(o.model);
  if (!path.ok()) {
    std::fprintf(stderr, "rill cache warm: %s\n", path.error().message.c_str());
    return 1;
  }
  auto engine = Engine::load(*path, o.engine);
  if (!engine.ok()) {
    std::fprintf(stderr, "rill cache warm: %s\n", engine.error().message.c_str());
    return 1;
  }
  Engine& e = **engine;
  Result<std::vector<int32_t>> ids = Error{""};
  if (o.chat) {
    const server::ServerContext ctx{e, e.chat_template(), server::ServerOptions{}};
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "system"}, {"content", text}});
    ids = server::cache_warm_chat_ids(ctx, messages);
  } else {
    ids = server::cache_warm_text_ids(e, text);
  }
  if (!ids.ok()) {
    std::fprintf(stderr, "rill cache warm: %s: %s\n", o.file.c_str(), ids.error().message.c_str());
    return 1;
  }
  std::promise<Result<server::CacheWarmResult>> promise;
  auto future = promise.get_future();
  Status st = server::submit_cache_warm(
      e, std::move(ids).value(), [&promise](Result<server::CacheWarmResult> r) { promise.set_value(std::move(r)); });
  if (!st.ok()) {
    std::fprintf(stderr, "rill cache warm: %s: %s\n", o.file.c_str(), st.error().message.c_str());
    return 1;
  }
  Result<server::CacheWarmResult> r = future.get();
  if (!r.ok()) {
    std::fprintf(stderr, "rill cache warm: %s\n", r.error().message.c_str());
    return 1;
  }
  std::printf("rill cache warm: stored %d of %d tokens in %s\n", r->cached_tokens, r->tokens,
              o.engine.cache_dir.c_str());
  return 0;
}

int run_ls(const CacheOptions& o) {
  auto entries = list_kv_dir(o.engine.cache_dir);
  if (!entries.ok()) {
    std::fprintf(stderr, "rill cache ls: %s\n", entries.error().message.c_str());
    return 1;
  }
  if (kv_dir_locked(o.engine.cache_dir)) {
    std::fprintf(stderr, "rill cache ls: %s is in use by a running rill process (listing may change)\n",
                 o.engine.cache_dir.c_str());
  }
  std::printf("%-24s %8s %12s  %s\n", "file", "tokens", "bytes", "created");
  uint64_t total = 0;
  for (const KvDirEntry& e : *entries) {
    total += e.bytes;
    if (!e.error.empty()) {
      std::printf("%-24s %8s %12llu  invalid: %s\n", e.file.c_str(), "-", static_cast<unsigned long long>(e.bytes),
                  e.error.c_str());
    } else {
      std::printf("%-24s %8lld %12llu  %s\n", e.file.c_str(), static_cast<long long>(e.tokens),
                  static_cast<unsigned long long>(e.bytes), utc_time(e.created_at).c_str());
    }
  }
  std::printf("%zu entries, %.1f MiB\n", entries->size(), static_cast<double>(total) / (1 << 20));
  return 0;
}

int run_clear(const CacheOptions& o) {
  auto n = clear_kv_dir(o.engine.cache_dir);
  if (!n.ok()) {
    std::fprintf(stderr, "rill cache clear: %s\n", n.error().message.c_str());
    return 1;
  }
  std::printf("rill cache clear: removed %lld files from %s\n", static_cast<long long>(*n), o.engine.cache_dir.c_str());
  return 0;
}

}  // namespace

Command add_cache_command(CLI::App& app) {
  auto o = std::make_shared<CacheOptions>();
  CLI::App* sub = app.add_subcommand("cache", "Warm up, list or clear the prefix cache's disk tier (--cache-dir)");
  sub->require_subcommand(1);
  CLI::App* warm = sub->add_subcommand("warm", "Compute a prompt file's KV once and store it in the cache directory");
  warm->add_option("model", o->model, "a .gguf file or a Hugging Face model directory (default: the default model)");
  warm->add_option("--file", o->file, "the prompt text")->required();
  warm->add_option("--cache-dir", o->engine.cache_dir, "the disk tier's directory")->required();
  warm->add_flag("--chat", o->chat, "store the text as a system message through the model's chat template");
  warm->add_option("--threads,-t", o->engine.n_threads, "CPU threads (default: one per core)");
  warm->add_option("--ctx-size,-c", o->engine.n_ctx, "context tokens (default: the model's)")
      ->check(CLI::Range(16, 1 << 22));
  add_cache_tier_options(*warm, o->engine, /*with_dir=*/false);
  CLI::App* ls = sub->add_subcommand("ls", "List the entries of a cache directory");
  ls->add_option("--cache-dir", o->engine.cache_dir, "the disk tier's directory")->required();
  CLI::App* clear = sub->add_subcommand("clear", "Remove every entry of a cache directory");
  clear->add_option("--cache-dir", o->engine.cache_dir, "the disk tier's directory")->required();
  return {sub, [o, warm, ls]() -> int {
            if (warm->parsed()) return run_warm(*o);
            if (ls->parsed()) return run_ls(*o);
            return run_clear(*o);
          }};
}

}  // namespace rill::cli
