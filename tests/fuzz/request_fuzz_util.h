#pragma once
// Checks shared by the request-reader fuzz targets (*_request_fuzz.cpp).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "core/json_parse.h"
#include "server/errors.h"

#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

namespace rill::fuzz {

// A reader's error: a 400 whose message names its param first, and whose
// error body serializes (valid UTF-8).
inline void check_request_error(const server::ApiError& e) {
  FUZZ_CHECK(e.status == 400);
  FUZZ_CHECK(!e.message.empty());
  if (!e.param.empty()) FUZZ_CHECK(e.message.rfind(e.param + ": ", 0) == 0);
  (void)server::openai_error_body(e).dump();  // throws on invalid UTF-8
}

// parse_json against nlohmann's own parser: the same value whenever both
// accept (duplicate keys included), a syntax error exactly when nlohmann
// refuses, and never anything deeper than the limit.
inline void check_parse_json(std::string_view text) {
  auto mine = parse_json(text);
  const auto theirs = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (auto* j = std::get_if<nlohmann::ordered_json>(&mine)) {
    FUZZ_CHECK(!theirs.is_discarded());
    FUZZ_CHECK(*j == theirs);
    FUZZ_CHECK(j->dump() == theirs.dump());  // member order too
    return;
  }
  const auto& e = std::get<JsonParseError>(mine);
  if (e.kind == JsonParseError::Kind::kSyntax) FUZZ_CHECK(theirs.is_discarded());
  (void)nlohmann::json(e.message).dump();  // valid UTF-8
}

}  // namespace rill::fuzz
