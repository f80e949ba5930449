#pragma once
// --spec and --spec-tokens (speculative decoding), shared by rill serve and
// bench.
#include <CLI/CLI.hpp>

#include <string>

#include "rill/engine.h"

namespace rill::cli {

struct SpecFlags {
  std::string spec = "off";
  int32_t spec_tokens = 4;

  void add_to(CLI::App* app) {
    app->add_option(
           "--spec", spec,
           "speculative decoding: ngram (prompt lookup: drafts copied from the prompt and output, for "
           "edits and code), draft=PATH (a smaller model with the same tokenizer drafts greedily), mtp (the "
           "model's own multi-token-prediction layer drafts: DeepSeek-V3, GLM-4.5/5, Qwen3-Next checkpoints "
           "that carry it), assistant=PATH (a Gemma 4 target's assistant checkpoint drafts, reading the target's "
           "KV) or off; requests opt out with \"speculative\": false (output is the same "
           "either way; replay=FILE[:A] replays the continuations `rill bench --record-tokens FILE` "
           "recorded, a benchmark of the mechanism)")
        ->check([](const std::string& v) -> std::string {
          if (v == "off" || v == "ngram" || v == "mtp" || v.rfind("draft=", 0) == 0 || v.rfind("replay=", 0) == 0 ||
              v.rfind("assistant=", 0) == 0)
            return {};
          return "expected ngram, off, draft=MODEL, mtp, assistant=PATH or replay=FILE[:A]";
        });
    app->add_option("--spec-tokens", spec_tokens, "most draft tokens per request per step (default 4)")
        ->check(CLI::Range(1, 64));
  }
  void apply(EngineOptions& e) const {
    e.spec = spec;
    e.spec_tokens = spec_tokens;
  }
};

}  // namespace rill::cli
