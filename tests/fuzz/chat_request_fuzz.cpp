// Fuzz target for the /v1/chat/completions and /v1/completions request
// readers: parse_body (parse_json), then parse_chat_request with plain
// limits (no model needed). Input: the request body.
// Checks: parse_json agrees with nlohmann (request_fuzz_util.h); errors are
// 400s naming their field; an accepted request's fields are in range.
#include <cstdint>
#include <string>

#include "request_fuzz_util.h"
#include "server/openai_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rill::server;
  const std::string text(reinterpret_cast<const char*>(data), size);
  rill::fuzz::check_parse_json(text);
  auto body = openai::parse_body(text);
  if (auto* e = std::get_if<ApiError>(&body)) {
    rill::fuzz::check_request_error(*e);
    return 0;
  }
  openai::RequestLimits limits;
  limits.model_id = "fuzz";
  limits.max_n = 4;
  limits.max_tokens_cap = 512;
  limits.n_vocab = 1000;
  auto request = openai::parse_chat_request(limits, std::get<openai::ojson>(body));
  if (auto* e = std::get_if<ApiError>(&request)) {
    rill::fuzz::check_request_error(*e);
    return 0;
  }
  const auto& r = std::get<openai::ChatRequest>(request);
  FUZZ_CHECK(r.common.n >= 1 && r.common.n <= limits.max_n);
  FUZZ_CHECK(r.common.generation.max_tokens >= 0 && r.common.generation.max_tokens <= limits.max_tokens_cap);
  for (const auto& [id, bias] : r.common.logit_bias)
    FUZZ_CHECK(id >= 0 && id < limits.n_vocab && bias >= -100 && bias <= 100);
  FUZZ_CHECK(r.input.tools.is_null() || (r.input.tools.is_array() && !r.input.tools.empty()));
  (void)openai::json_text(r.input.messages);
  (void)openai::json_text(r.input.template_kwargs);
  return 0;
}
