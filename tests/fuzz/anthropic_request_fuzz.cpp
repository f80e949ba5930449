// Fuzz target for the Anthropic Messages request reader
// (parse_anthropic_request), for /v1/messages and /v1/messages/count_tokens.
// Input: byte 0 bit 0 = count_tokens; the rest = the request body.
// Checks: errors are 400s naming their field; an accepted request has
// messages in the OpenAI shape and max_tokens >= 1 (unless count_tokens).
#include <cstdint>
#include <string>

#include "request_fuzz_util.h"
#include "server/anthropic_convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rill::server;
  if (size < 1) return 0;
  const bool count_tokens = data[0] & 1;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto parsed = parse_anthropic_request(text, count_tokens);
  if (auto* e = std::get_if<ApiError>(&parsed)) {
    rill::fuzz::check_request_error(*e);
    return 0;
  }
  const AnthropicRequest& req = std::get<AnthropicRequest>(parsed);
  if (!count_tokens) FUZZ_CHECK(req.chat.generation.max_tokens >= 1);
  FUZZ_CHECK(req.chat.messages.is_array());
  for (const auto& m : req.chat.messages) {
    FUZZ_CHECK(m.is_object() && m.contains("role") && m["content"].is_string());
  }
  (void)dump_json(req.chat.messages);
  (void)dump_json(req.chat.tools);
  return 0;
}
