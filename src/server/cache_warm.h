#pragma once
// Cache warm-up (POST /v1/cache/warm, `rill cache warm`): a prompt's KV is
// computed once and written to the disk tier (--cache-dir), so the next
// request that starts with it is a prefix-cache hit, even after a restart.
// The prompt is tokenized exactly as the request that should hit it will be:
// text as /v1/completions does, messages as /v1/chat/completions does but
// without the generation prompt (the later request adds its own turns).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "rill/engine.h"
#include "server/server_context.h"

namespace rill::server {

struct CacheWarmResult {
  int32_t tokens = 0;         // the prompt's tokens
  int32_t cached_tokens = 0;  // of those, written to the disk tier (whole KV blocks)
};

// Text with BOS as the model adds it and special tokens recognised.
// Errors: no tokenizer, an empty prompt.
Result<std::vector<int32_t>> cache_warm_text_ids(const Engine& engine, const std::string& text);
// OpenAI chat messages through the model's chat template (ChatML without
// one), no generation prompt. Errors name the field ("messages[0].role: ...").
Result<std::vector<int32_t>> cache_warm_chat_ids(const ServerContext& ctx, const nlohmann::ordered_json& messages);

// Computes `ids` (one greedy output token) and persists the prefix. `done`
// runs exactly once, on the engine's event dispatcher thread, with the result or the engine's
// error. A refused submission (e.g. the prompt does not fit) is returned and
// `done` never runs.
Status submit_cache_warm(Engine& engine, std::vector<int32_t> ids, std::function<void(Result<CacheWarmResult>)> done);

}  // namespace rill::server
