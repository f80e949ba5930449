#pragma once
// The one JSON parser for everything a client sends: request bodies and the
// JSON strings inside them that the server parses (tool-call arguments).
//
// Guarantees, whatever the input:
// - Nesting is at most max_depth containers (the body object counts as 1):
//   a deeper value is refused with the JSON path where the limit was
//   crossed ("messages[0].tool_calls[0].function.arguments.a.a: ..."), so
//   everything downstream (copies, dumps, the template's values, the
//   response store) recurses at most that deep.
// - Linear time: a SAX handler builds the tree bottom-up, appending object
//   members in order without ordered_json's per-insert key scan; duplicate
//   keys resolve as nlohmann and Python do (the first position keeps the
//   last value), found by a per-object hash index once an object has more
//   than a few keys.
// - No recursion over the input (nlohmann's lexer/parser are iterative).
#include <cstddef>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

namespace rill {

// 128 levels: the deepest thing real clients send is a JSON Schema in tool
// parameters (nested objects/arrays/anyOf: rarely past 20 levels; OpenAI's
// structured outputs allow 10 levels of object nesting), so 128 leaves a wide
// margin, while keeping every recursive walk of a request value (nlohmann's
// copy/dump/==, the template's values, tojson) a few KiB of stack.
inline constexpr int kMaxJsonDepth = 128;

struct JsonParseError {
  enum class Kind { kSyntax, kTooDeep };
  Kind kind = Kind::kSyntax;
  std::string path;     // too deep: where the limit was crossed; "" for the body root
  std::string message;  // kSyntax: "not valid JSON: parse error at line L, column C: ..."; kTooDeep: "<path>: nested
                        // deeper than 128 levels"
};

struct JsonParseOptions {
  std::string_view base_path;  // path of the parsed text inside the request ("" = the body)
  int max_depth = kMaxJsonDepth;
};

// `text` as a JSON value, or why not.
std::variant<nlohmann::ordered_json, JsonParseError> parse_json(std::string_view text,
                                                                const JsonParseOptions& options = {});

// Path helpers shared with the field reader: "a" + "b" -> "a.b", "" + "b" ->
// "b", "a" + 3 -> "a[3]".
std::string json_path_key(std::string_view base, std::string_view key);
std::string json_path_index(std::string_view base, size_t index);

}  // namespace rill
