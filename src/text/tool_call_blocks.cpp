#include "text/tool_call_blocks.h"

#include <map>
#include <optional>
#include <variant>

#include <nlohmann/json.hpp>

#include "core/json_parse.h"

namespace rill {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kArgKey = "<arg_key>";
constexpr std::string_view kArgKeyEnd = "</arg_key>";
constexpr std::string_view kArgValue = "<arg_value>";
constexpr std::string_view kArgValueEnd = "</arg_value>";
constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke name=\"";
constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kDsmlParameter = "<｜DSML｜parameter name=\"";
constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string dump_compact(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void skip_space(std::string_view s, size_t& i) {
  while (i < s.size() && is_space(s[i])) ++i;
}

// Reads `open` TEXT `close` at s[i...] (after whitespace) into `text`.
bool read_tagged(std::string_view s, size_t& i, std::string_view open, std::string_view close, std::string_view& text) {
  skip_space(s, i);
  if (s.substr(i, open.size()) != open) return false;
  const size_t from = i + open.size();
  const size_t end = s.find(close, from);
  if (end == std::string_view::npos) return false;
  text = s.substr(from, end - from);
  i = end + close.size();
  return true;
}

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (is_space(c) || c == '<' || c == '>' || c == '"') return false;
  }
  return true;
}

// `value` as JSON text, or null when it is not JSON.
std::optional<Json> as_json(std::string_view value) {
  auto parsed = parse_json(value);
  if (auto* j = std::get_if<Json>(&parsed)) return std::move(*j);
  return std::nullopt;
}

}  // namespace

std::string bare_value_json(const std::string* type, std::string_view value) {
  if (type == nullptr || *type != "string") {
    // The templates write numbers, booleans and null with tojson or
    // Python's str(), and objects and arrays as JSON.
    if (auto j = as_json(value); j && !j->is_string()) return dump_compact(*j);
    if (value == "True" || value == "False") return value == "True" ? "true" : "false";
    if (value == "None") return "null";
  }
  return dump_compact(Json(std::string(value)));
}

bool parse_glm_call(std::string_view body, const ToolParameterTypes* types, ToolCall& call) {
  size_t i = 0;
  skip_space(body, i);
  size_t name_end = i;
  while (name_end < body.size() && !is_space(body[name_end]) && body[name_end] != '<') ++name_end;
  const std::string name(body.substr(i, name_end - i));
  if (!valid_name(name)) return false;
  i = name_end;
  const std::map<std::string, std::string>* tool_types = nullptr;
  if (types != nullptr) {
    auto t = types->find(name);
    if (t != types->end()) tool_types = &t->second;
  }
  std::string args = "{";
  for (size_t n = 0;; ++n) {
    skip_space(body, i);
    if (i == body.size()) break;
    std::string_view key, value;
    if (!read_tagged(body, i, kArgKey, kArgKeyEnd, key) || key.empty()) return false;
    if (!read_tagged(body, i, kArgValue, kArgValueEnd, value)) return false;
    const std::string k(key);
    const std::string* type = nullptr;
    if (tool_types != nullptr) {
      auto p = tool_types->find(k);
      if (p != tool_types->end()) type = &p->second;
    }
    if (n > 0) args += ',';
    args += dump_compact(Json(k)) + ':' + bare_value_json(type, value);
  }
  args += '}';
  call.name = name;
  call.arguments = std::move(args);
  return true;
}

bool parse_dsml_calls(std::string_view body, std::vector<ToolCall>& calls) {
  std::vector<ToolCall> out;
  size_t i = 0;
  for (;;) {
    skip_space(body, i);
    if (i == body.size()) break;
    if (body.substr(i, kDsmlInvoke.size()) != kDsmlInvoke) return false;
    i += kDsmlInvoke.size();
    const size_t name_end = body.find("\">", i);
    if (name_end == std::string_view::npos) return false;
    ToolCall call;
    call.name = std::string(body.substr(i, name_end - i));
    if (!valid_name(call.name)) return false;
    i = name_end + 2;
    Json args = Json::object();
    for (;;) {
      skip_space(body, i);
      if (body.substr(i, kDsmlInvokeEnd.size()) == kDsmlInvokeEnd) {
        i += kDsmlInvokeEnd.size();
        break;
      }
      if (body.substr(i, kDsmlParameter.size()) != kDsmlParameter) return false;
      i += kDsmlParameter.size();
      const size_t key_end = body.find('"', i);
      if (key_end == std::string_view::npos || key_end == i) return false;
      const std::string key(body.substr(i, key_end - i));
      i = key_end + 1;
      constexpr std::string_view kStringTrue = " string=\"true\">", kStringFalse = " string=\"false\">";
      bool is_string = false;
      if (body.substr(i, kStringTrue.size()) == kStringTrue) {
        is_string = true;
        i += kStringTrue.size();
      } else if (body.substr(i, kStringFalse.size()) == kStringFalse) {
        i += kStringFalse.size();
      } else {
        return false;
      }
      const size_t value_end = body.find(kDsmlParameterEnd, i);
      if (value_end == std::string_view::npos) return false;
      const std::string_view value = body.substr(i, value_end - i);
      i = value_end + kDsmlParameterEnd.size();
      if (is_string) {
        args[key] = std::string(value);
      } else if (auto j = as_json(value)) {
        args[key] = std::move(*j);
      } else {
        args[key] = std::string(value);
      }
    }
    call.arguments = dump_compact(args);
    out.push_back(std::move(call));
  }
  if (out.empty()) return false;
  for (ToolCall& c : out) calls.push_back(std::move(c));
  return true;
}

bool parse_action_calls(std::string_view body, std::vector<ToolCall>& calls) {
  auto list = as_json(body);
  if (!list || !list->is_array() || list->empty()) return false;
  std::vector<ToolCall> out;
  for (const Json& item : *list) {
    if (!item.is_object()) return false;
    auto name = item.find("tool_name");
    if (name == item.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
    auto params = item.find("parameters");
    ToolCall call;
    call.name = name->get<std::string>();
    if (params == item.end() || params->is_null()) {
      call.arguments = "{}";
    } else if (params->is_object()) {
      call.arguments = dump_compact(*params);
    } else {
      return false;
    }
    out.push_back(std::move(call));
  }
  for (ToolCall& c : out) calls.push_back(std::move(c));
  return true;
}

}  // namespace rill
