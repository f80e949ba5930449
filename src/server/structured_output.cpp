#include "server/structured_output.h"

#include <set>
#include <vector>

#include "text/chat_template.h"
#include "text/grammar/gbnf_parser.h"
#include "text/grammar/grammar_cache.h"
#include "text/grammar/json_schema_grammar.h"
#include "text/grammar/regex_grammar.h"

namespace rill::server {
namespace {

using Json = nlohmann::ordered_json;

// "json_schema: 'x' at #/p is not supported" -> "<param>: 'x' at #/p is not supported".
ApiError converter_error(const std::string& param, const Error& e) {
  std::string message = e.message;
  for (const char* prefix : {"json_schema: ", "regex: ", "choice: "}) {
    if (message.rfind(prefix, 0) == 0) message.erase(0, std::string_view(prefix).size());
  }
  return field_error(param, message);
}

std::optional<ApiError> schema_constraint(const Json& schema, const std::string& param, OutputConstraint& out) {
  auto gbnf = grammar::json_schema_to_gbnf(schema);
  if (!gbnf.ok()) return converter_error(param, gbnf.error());
  out.gbnf = std::move(gbnf).value();
  out.param = param;
  return std::nullopt;
}

// Fields of an object that are not in `known`: the first is a 400.
std::optional<ApiError> unknown_fields(const FieldReader& r, const std::set<std::string_view>& known,
                                       const std::string& type) {
  for (auto it = r.value().begin(); it != r.value().end(); ++it) {
    if (!known.count(it.key())) return r.error(it.key(), "unknown field for type \"" + type + "\"");
  }
  return std::nullopt;
}

// The schema of a json_schema format: an object (true: any JSON value).
std::optional<ApiError> read_schema(const FieldReader& r, std::string_view key, OutputConstraint& out) {
  const Json* schema = r.find(key);
  const std::string param = r.path_of(key);
  if (schema == nullptr) return r.error(key, "field required");
  if (schema->is_boolean() && schema->get<bool>()) {
    out.gbnf = grammar::json_value_gbnf();
    out.param = param;
    return std::nullopt;
  }
  if (!schema->is_object()) return r.type_error(key, "a JSON Schema object");
  return schema_constraint(*schema, param, out);
}

std::optional<ApiError> read_name(const FieldReader& r) {
  std::string name;
  if (auto e = r.require_string("name", name)) return e;
  if (name.empty()) return r.error("name", "expected a non-empty string");
  std::optional<bool> strict;
  if (auto e = r.read_bool("strict", strict)) return e;
  std::optional<std::string> description;
  return r.read_string("description", description);
}

// Hand-built AST pieces for the tool-call grammar.
grammar::Expr literal(std::string text) {
  grammar::Expr e;
  e.kind = grammar::Expr::Kind::kLiteral;
  e.text = std::move(text);
  return e;
}
grammar::Expr ref(std::string name) {
  grammar::Expr e;
  e.kind = grammar::Expr::Kind::kRef;
  e.text = std::move(name);
  return e;
}
grammar::Expr node(grammar::Expr::Kind kind, std::vector<grammar::Expr> children) {
  grammar::Expr e;
  e.kind = kind;
  e.children = std::move(children);
  return e;
}

void prefix_refs(grammar::Expr& e, const std::string& prefix) {
  if (e.kind == grammar::Expr::Kind::kRef) e.text = prefix + e.text;
  for (grammar::Expr& c : e.children) prefix_refs(c, prefix);
}

}  // namespace

std::optional<ApiError> read_response_format(const FieldReader& body, OutputConstraint& out) {
  std::optional<FieldReader> format;
  if (auto e = body.read_object("response_format", format)) return e;
  if (!format) return std::nullopt;
  std::string type;
  if (auto e = format->require_string("type", type)) return e;
  if (type == "text") return unknown_fields(*format, {"type"}, type);
  if (type == "json_object") {
    if (auto e = unknown_fields(*format, {"type", "schema"}, type)) return e;
    if (format->find("schema") != nullptr) return read_schema(*format, "schema", out);  // llama.cpp's extension
    out.gbnf = grammar::json_object_gbnf();
    out.param = format->path();
    return std::nullopt;
  }
  if (type == "json_schema") {
    if (auto e = unknown_fields(*format, {"type", "json_schema"}, type)) return e;
    std::optional<FieldReader> js;
    if (auto e = format->read_object("json_schema", js)) return e;
    if (!js) return format->error("json_schema", "field required");
    if (auto e = unknown_fields(*js, {"name", "schema", "strict", "description"}, type)) return e;
    if (auto e = read_name(*js)) return e;
    if (js->find("schema") == nullptr) {  // OpenAI: no schema means any JSON object
      out.gbnf = grammar::json_object_gbnf();
      out.param = js->path();
      return std::nullopt;
    }
    return read_schema(*js, "schema", out);
  }
  return format->error("type", "expected \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"");
}

std::optional<ApiError> read_text_format(const FieldReader& text, OutputConstraint& out) {
  std::optional<FieldReader> format;
  if (auto e = text.read_object("format", format)) return e;
  if (!format) return std::nullopt;
  std::string type;
  if (auto e = format->require_string("type", type)) return e;
  if (type == "text") return unknown_fields(*format, {"type"}, type);
  if (type == "json_object") {
    if (auto e = unknown_fields(*format, {"type"}, type)) return e;
    out.gbnf = grammar::json_object_gbnf();
    out.param = format->path();
    return std::nullopt;
  }
  if (type == "json_schema") {
    if (auto e = unknown_fields(*format, {"type", "name", "schema", "strict", "description"}, type)) return e;
    if (auto e = read_name(*format)) return e;
    return read_schema(*format, "schema", out);
  }
  return format->error("type", "expected \"text\", \"json_object\" or \"json_schema\", got \"" + type + "\"");
}

std::optional<ApiError> read_grammar_fields(const FieldReader& body, OutputConstraint& out) {
  auto taken = [&](std::string_view key) -> std::optional<ApiError> {
    if (out.empty()) return std::nullopt;
    return body.error(key, "only one of response_format, grammar, regex and choice may constrain the output (" +
                               out.param + " already does)");
  };
  std::optional<std::string> gbnf, regex;
  if (auto e = body.read_string("grammar", gbnf)) return e;
  if (gbnf) {
    if (auto e = taken("grammar")) return e;
    if (gbnf->empty()) return body.error("grammar", "expected a non-empty GBNF grammar");
    out.gbnf = std::move(*gbnf);
    out.param = body.path_of("grammar");
  }
  if (auto e = body.read_string("regex", regex)) return e;
  if (regex) {
    if (auto e = taken("regex")) return e;
    auto g = grammar::regex_to_gbnf(*regex);
    if (!g.ok()) return converter_error(body.path_of("regex"), g.error());
    out.gbnf = std::move(g).value();
    out.param = body.path_of("regex");
  }
  std::optional<FieldReader> choice;
  if (auto e = body.read_array("choice", choice)) return e;
  if (choice) {
    if (auto e = taken("choice")) return e;
    std::vector<std::string> options;
    for (size_t i = 0; i < choice->value().size(); ++i) {
      const Json& v = choice->value()[i];
      if (!v.is_string()) return choice->at(i).type_error("a string");
      options.push_back(v.get<std::string>());
    }
    if (options.empty()) return choice->error("expected at least one string");
    auto g = grammar::choice_gbnf(options);
    if (!g.ok()) return converter_error(choice->path(), g.error());
    out.gbnf = std::move(g).value();
    out.param = choice->path();
  }
  return std::nullopt;
}

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> compile_constraint(const OutputConstraint& c) {
  if (c.empty()) return std::shared_ptr<const grammar::CompiledGrammar>();
  auto g = grammar::GrammarCache::shared().get(c.gbnf);
  if (!g.ok()) return field_error(c.param.empty() ? "grammar" : c.param, g.error().message);
  return std::move(g).value();
}

ToolCallFormat tool_call_format(const ChatTemplate* chat_template, bool template_renders_tools) {
  if (chat_template == nullptr || !template_renders_tools) return ToolCallFormat::kGeneric;
  const std::string& src = chat_template->source();
  if (src.find("<tool_call>") != std::string::npos) return ToolCallFormat::kHermes;
  if (src.find("<|python_tag|>") != std::string::npos || src.find("ipython") != std::string::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kGeneric;
}

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> tool_call_grammar(const Json& tools,
                                                                                          ToolCallFormat format,
                                                                                          bool parallel) {
  // Each tool's arguments grammar, converted first (a refused schema is a
  // 400 before anything is built or cached).
  std::vector<std::string> args_gbnf;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& fn = tools[i]["function"];
    const auto params = fn.find("parameters");
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    const bool any = params == fn.end() || params->is_null() || params->empty();
    if (any) {
      args_gbnf.push_back(grammar::json_object_gbnf());
      continue;
    }
    auto g = grammar::json_schema_to_gbnf(*params);
    if (!g.ok()) return converter_error(param, g.error());
    args_gbnf.push_back(std::move(g).value());
  }
  const char* args_key = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  const std::string open = format == ToolCallFormat::kHermes ? "<tool_call>\n" : "";
  const std::string close = format == ToolCallFormat::kHermes ? "}\n</tool_call>" : "}";
  const std::string separator = format == ToolCallFormat::kLlama3Json ? "; " : "\n";
  std::string key = "tools\n" + std::to_string(static_cast<int>(format)) + (parallel ? "p\n" : "1\n");
  for (size_t i = 0; i < tools.size(); ++i) {
    key += tools[i]["function"]["name"].get<std::string>() + "\n" + args_gbnf[i] + "\n";
  }
  auto build = [&]() -> Result<grammar::GrammarAst> {
    grammar::GrammarAst ast;
    std::vector<grammar::Expr> calls;
    for (size_t i = 0; i < tools.size(); ++i) {
      RILL_ASSIGN_OR_RETURN(grammar::GrammarAst args, grammar::parse_gbnf(args_gbnf[i]));
      const std::string prefix = "t" + std::to_string(i) + "-";
      for (grammar::Rule& r : args.rules) {
        r.name = prefix + r.name;
        prefix_refs(r.body, prefix);
        ast.rules.push_back(std::move(r));
      }
      const Json name = tools[i]["function"]["name"];
      calls.push_back(
          node(grammar::Expr::Kind::kSeq, {literal(open + "{\"name\": " + name.dump() + ", \"" + args_key + "\": "),
                                           ref(prefix + "root"), literal(close)}));
    }
    grammar::Rule call{"call", node(grammar::Expr::Kind::kAlt, std::move(calls)), 0};
    grammar::Expr root_body = ref("call");
    if (parallel) {
      grammar::Expr more =
          node(grammar::Expr::Kind::kRepeat, {node(grammar::Expr::Kind::kSeq, {literal(separator), ref("call")})});
      more.min = 0;
      more.max = grammar::kUnbounded;
      root_body = node(grammar::Expr::Kind::kSeq, {ref("call"), std::move(more)});
    }
    ast.rules.insert(ast.rules.begin(), {grammar::Rule{"root", std::move(root_body), 0}, std::move(call)});
    return ast;
  };
  auto g = grammar::GrammarCache::shared().get_built(key, build);
  if (!g.ok()) return field_error("tools", g.error().message);
  return std::move(g).value();
}

std::shared_ptr<const ToolParameterTypes> tool_parameter_types(const Json& tools) {
  auto types = std::make_shared<ToolParameterTypes>();
  if (!tools.is_array()) return types;
  for (const Json& tool : tools) {
    const Json* fn = tool.is_object() && tool.contains("function") ? &tool["function"] : nullptr;
    if (fn == nullptr || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) continue;
    auto& params = (*types)[(*fn)["name"].get<std::string>()];
    const Json* schema = fn->contains("parameters") ? &(*fn)["parameters"] : nullptr;
    if (schema == nullptr || !schema->is_object() || !schema->contains("properties")) continue;
    const Json& properties = (*schema)["properties"];
    if (!properties.is_object()) continue;
    for (const auto& [name, property] : properties.items()) {
      if (!property.is_object() || !property.contains("type")) continue;
      const Json& type = property["type"];
      if (type.is_string()) {
        params[name] = type.get<std::string>();
      } else if (type.is_array()) {
        for (const Json& t : type) {
          if (t.is_string() && t != "null") {
            params[name] = t.get<std::string>();
            break;
          }
        }
      }
    }
  }
  return types;
}

std::string generic_tools_prompt(const Json& tools) {
  std::string text =
      "You can call the following tools. To call one, reply with only a JSON object of the form "
      "{\"name\": <tool name>, \"arguments\": <an object of the arguments>} and nothing else; to call several, "
      "write one such object per line. Otherwise answer normally.\n\nTools:";
  for (const Json& t : tools) {
    text += "\n" + t["function"].dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return text;
}

std::string generic_tool_calls_text(const Json& tool_calls) {
  std::string text;
  for (const Json& c : tool_calls) {
    const Json& fn = c["function"];
    Json call = Json::object();
    call["name"] = fn.value("name", "");
    call["arguments"] = fn.contains("arguments") ? fn["arguments"] : Json::object();
    if (!text.empty()) text += "\n";
    text += call.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
  return text;
}

}  // namespace rill::server
