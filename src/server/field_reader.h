#pragma once
// FieldReader: typed reads of request fields that know the JSON path of the
// value they read ("messages[2].content[0].text"), shared by every API
// (OpenAI chat and completions, Responses, Anthropic Messages), so types,
// ranges, the integer rule and error messages are one rule:
//   - a field that is absent or null reads as unset;
//   - a wrong type: "<path>: expected <what>, got <type>";
//   - a number out of range: "<path>: must be in [lo, hi]" ("(lo, hi]" when
//     lo is excluded; "must be at least lo" when hi is the type's maximum,
//     "must be at most hi" when lo is its minimum);
//   - integers: JSON Schema's rule, an integral float (5.0) is an integer;
//   - a missing required field: "<path>: field required".
// Errors are 400 invalid_request_error ApiErrors with `param` = the path;
// each API turns them into its own error shape.
//
// Lookups are ordered_json::find (linear in the object's size): each API
// reads a fixed set of keys, so a huge object costs O(keys x fields), never
// one scan per member.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/errors.h"

namespace rill::server {

// "null", "a boolean", "a number", "a string", "an array", "an object".
const char* json_type_name(const nlohmann::ordered_json& v);
// 400 invalid_request_error, message "<path>: <message>", param = path.
ApiError field_error(const std::string& path, const std::string& message);
// The integer rule: an integer, or an integral float inside int64; nullopt
// for anything else (strings, 1.5, 1e300, ...).
std::optional<int64_t> json_integer(const nlohmann::ordered_json& v);

// Closed [lo, hi]; with lo_open, (lo, hi].
struct NumberRange {
  double lo = 0, hi = 0;
  bool lo_open = false;
};

class FieldReader {
 public:
  using Json = nlohmann::ordered_json;
  using Check = std::optional<ApiError>;  // nullopt: fine

  // `value` must outlive the reader; `path` is its path in the request
  // ("" for the body itself).
  explicit FieldReader(const Json& value, std::string path = "") : value_(&value), path_(std::move(path)) {}

  const Json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  std::string path_of(std::string_view key) const;
  std::string path_of(size_t index) const;

  // The member `key`, nullptr when absent or null (or when value() is not an object).
  const Json* find(std::string_view key) const;
  // Readers over a member / an element. Require that it exists.
  FieldReader at(std::string_view key) const;
  FieldReader at(size_t index) const;

  ApiError error(const std::string& message) const { return field_error(path_, message); }
  ApiError error(std::string_view key, const std::string& message) const { return field_error(path_of(key), message); }
  // "expected <what>, got <type>" for the value itself / a member.
  ApiError type_error(const char* what) const;
  ApiError type_error(std::string_view key, const char* what) const;

  Check read_bool(std::string_view key, std::optional<bool>& out) const;
  Check read_string(std::string_view key, std::optional<std::string>& out) const;
  Check require_string(std::string_view key, std::string& out) const;
  Check read_number(std::string_view key, NumberRange range, std::optional<float>& out) const;
  Check read_int(std::string_view key, int64_t lo, int64_t hi, std::optional<int64_t>& out) const;
  Check require_int(std::string_view key, int64_t lo, int64_t hi, int64_t& out) const;
  // A member that must be an object / an array when present; `out` is set
  // to a reader over it (left unset when absent or null).
  Check read_object(std::string_view key, std::optional<FieldReader>& out) const;
  Check read_array(std::string_view key, std::optional<FieldReader>& out) const;

  // The checks above on the value itself (for array elements): the integer
  // rule and the range message of read_int.
  Check as_int(int64_t lo, int64_t hi, int64_t& out) const;

 private:
  const Json* value_;
  std::string path_;
};

}  // namespace rill::server
