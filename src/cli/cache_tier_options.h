#pragma once
// The prefix-cache tier flags `rill serve`, `rill bench` and `rill cache warm`
// share (engine/kv_tiers.h): --cache-ram-mb, --cache-dir, --cache-disk-mb,
// --cache-write-behind-min-tokens, --kv-verify, written straight into EngineOptions.
#include <CLI/CLI.hpp>

#include <cstdint>

#include "rill/engine.h"

namespace rill::cli {

// `with_dir` false leaves --cache-dir out (a command that declares it itself).
inline void add_cache_tier_options(CLI::App& sub, EngineOptions& e, bool with_dir = true) {
  sub.add_option("--cache-ram-mb", e.cache_ram_mb,
                 "host-RAM tier of the prefix cache in MiB: evicted prefixes spill here (0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  if (with_dir) {
    sub.add_option("--cache-dir", e.cache_dir,
                   "disk tier of the prefix cache: a directory owned by this process, kept across restarts");
  }
  sub.add_option("--cache-disk-mb", e.cache_disk_mb, "cap of the disk tier in MiB (least recently used out)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub.add_option("--cache-write-behind-min-tokens", e.cache_write_behind_min_tokens,
                 "disk tier: write a finished request's KV of at least this many tokens to disk behind it, so a "
                 "restart finds it (0: off; only evicted prefixes and warm-ups reach disk)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  sub.add_flag("--kv-verify", e.kv_verify,
               "at start, read every disk-tier file and remove those whose tensor hashes fail (slower start; "
               "every load checks its file's tensor hashes anyway)");
}

}  // namespace rill::cli
