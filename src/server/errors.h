#pragma once
// Error replies in the OpenAI shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// (the Anthropic routes use anthropic_error() instead).
#include <string>

#include <nlohmann/json.hpp>

#include "server/http.h"

namespace rill::server {

struct ApiError {
  ApiError() = default;
  ApiError(int status_, std::string message_, std::string type_ = "invalid_request_error", std::string param_ = "",
           std::string code_ = "")
      : status(status_),
        message(std::move(message_)),
        type(std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}

  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" when none
  std::string code;   // "" when none
};

// s with every invalid UTF-8 sequence replaced by U+FFFD: error messages
// quote request bytes (a field name, a value), and a body must serialize.
inline std::string valid_utf8_text(const std::string& s) {
  const std::string quoted = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return nlohmann::json::parse(quoted).get<std::string>();
}

inline nlohmann::json openai_error_body(const ApiError& e) {
  nlohmann::json err = {{"message", valid_utf8_text(e.message)}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(valid_utf8_text(e.param));
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return {{"error", err}};
}

inline void send_error(Responder& r, const ApiError& e) {
  r.send(e.status, "application/json", openai_error_body(e).dump());
}

// Anthropic: {"type": "error", "error": {"type": ..., "message": ...}}.
inline void send_anthropic_error(Responder& r, const ApiError& e) {
  std::string type = e.type;
  if (e.status == 400) type = "invalid_request_error";
  if (e.status == 401) type = "authentication_error";
  if (e.status == 404) type = "not_found_error";
  if (e.status == 413) type = "request_too_large";
  if (e.status >= 500) type = "api_error";
  nlohmann::json body = {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
  r.send(e.status, "application/json", body.dump());
}

}  // namespace rill::server
