#pragma once
// What every API handler shares: the engine, the model's chat template,
// server options and defaults, metrics and the response store.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/model_config.h"
#include "rill/engine.h"
#include "text/chat_template.h"

namespace rill::server {

class Metrics;
class ResponseStore;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                    // empty: no auth
  std::vector<std::string> cors_origins;  // empty: no CORS headers; "*" allowed
  size_t max_body_bytes = 8 << 20;        // larger bodies get 413
  int max_n = 8;                          // choices per request
  int32_t max_tokens_cap = 0;             // 0: up to the context
  int32_t default_max_tokens = 4096;      // requests without max_tokens (or the context left, if less); 0: the context
  double response_ttl_s = 3600;
  int64_t response_store_mb = 64;
  int io_threads = 1;
  std::string model_id;  // name reported in /v1/models and responses
  // Sampling defaults from the command line; unset fields fall back to the
  // model's generation_config.json, then the built-in defaults.
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
};

struct ServerContext {
  Engine& engine;
  const ChatTemplate* chat_template = nullptr;  // null: the model ships none
  ServerOptions options;
  Metrics* metrics = nullptr;
  ResponseStore* responses = nullptr;
  const GenerationDefaults* generation = nullptr;  // the model's generation_config
};

}  // namespace rill::server
