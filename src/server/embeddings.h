#pragma once
// POST /v1/embeddings (OpenAI's shape). The request's inputs become one
// engine request each (GenerationRequest::embed), so they batch with each
// other and with generation in the same steps; the reply is
//   {object: "list", data: [{object: "embedding", index, embedding}], model,
//    usage: {prompt_tokens, total_tokens}}
// with each embedding a list of floats, or with encoding_format "base64"
// the base64 of its little-endian float32 bytes (the official SDKs ask for
// base64 by default).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/http.h"
#include "server/server_context.h"

namespace rill::server {

// What reading a request needs from the served model (so the reader runs,
// and is fuzzed, without one).
struct EmbeddingLimits {
  std::string model_id;  // reported when the request names no model
  int64_t n_vocab = 0;   // token ids are in [0, n_vocab)
  int64_t n_dims = 0;    // the embedding's width
  bool truncatable = false;
  size_t max_inputs = 2048;  // OpenAI's limit on inputs per request
};

struct EmbeddingsRequest {
  std::string model;
  // Each input as text or as token ids (used as given: no special tokens added).
  std::vector<std::variant<std::string, std::vector<int32_t>>> inputs;
  bool base64 = false;
  int64_t dimensions = 0;  // the reply's width: n_dims unless the model allows truncation
};

// input: a non-empty string, a non-empty list of non-empty strings, a
// non-empty list of token ids, or a non-empty list of such lists;
// encoding_format: "float" (default) or "base64"; dimensions: n_dims, or
// 1..n_dims when the model is truncatable; model, user: strings. Errors
// are 400s naming the field ("input[2]", "dimensions", ...).
std::variant<EmbeddingsRequest, ApiError> parse_embeddings_request(const EmbeddingLimits& limits,
                                                                   const nlohmann::ordered_json& body);

// Standard base64 (RFC 4648, with padding) of `n` bytes.
std::string base64_encode(const void* data, size_t n);

// The route itself: handle_embeddings (server/api_handlers.h).

}  // namespace rill::server
