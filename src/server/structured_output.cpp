#include "server/structured_output.h"

#include <set>
#include <vector>

#include "text/chat_template.h"
#include "text/grammar/gbnf_parser.h"
#include "text/grammar/grammar_cache.h"
#include "text/grammar/json_schema_grammar.h"
#include "text/grammar/regex_grammar.h"
#include "text/tokenizer.h"

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

// Literals for a format's markers: a spelling the tokenizer has as one
// special token is that token (the model writes it so), otherwise its text;
// `bits` records each choice (a grammar's cache key must hold them). No
// tokenizer: all text.
struct Markers {
  const Tokenizer* tokenizer = nullptr;
  std::string bits;
  grammar::Expr operator()(std::string_view spelling) {
    bool special = false;
    if (tokenizer != nullptr) {
      const std::vector<int32_t> ids = tokenizer->encode(spelling, /*add_special=*/false, /*parse_special=*/true);
      special = ids.size() == 1 && tokenizer->is_special(ids[0]);
    }
    bits += special ? '1' : '0';
    return literal(special ? grammar::special_token_literal(spelling) : std::string(spelling));
  }
};

// gpt-oss (compile_constraint's `harmony`): `gbnf` over the final channel's
// text, after an analysis message of free text or none.
Result<grammar::GrammarAst> harmony_answer_ast(const std::string& gbnf, Markers& marker);

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

namespace {

// The special tokens a grammar's literals name (grammar_ast.h), appended to `out`.
void named_tokens(const grammar::Expr& e, std::vector<std::string>& out) {
  if (e.kind == grammar::Expr::Kind::kLiteral && e.text.size() >= 2 && e.text.front() == grammar::kTokenMark) {
    out.push_back(e.text.substr(1, e.text.size() - 2));
  }
  for (const grammar::Expr& c : e.children) named_tokens(c, out);
}

}  // namespace

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> compile_constraint(const OutputConstraint& c,
                                                                                           const Tokenizer* tokenizer,
                                                                                           bool* names_tokens,
                                                                                           bool harmony) {
  if (names_tokens != nullptr) *names_tokens = false;
  if (c.empty()) return std::shared_ptr<const grammar::CompiledGrammar>();
  bool named = false;
  // Only GBNF text names special tokens (<|channel|>): each must be one of
  // this model's, or the grammar could never be followed.
  if (c.gbnf.find('<') != std::string::npos) {
    auto ast = grammar::parse_gbnf(c.gbnf);
    if (ast.ok()) {
      std::vector<std::string> names;
      for (const grammar::Rule& r : ast->rules) named_tokens(r.body, names);
      for (const std::string& name : names) {
        const std::vector<int32_t> ids =
            tokenizer != nullptr ? tokenizer->encode(name, false, true) : std::vector<int32_t>{};
        if (ids.size() != 1 || !tokenizer->is_special(ids[0])) {
          return field_error(c.param.empty() ? "grammar" : c.param,
                             "the grammar names " + name + ", which is not a special token of this model");
        }
      }
      named = !names.empty();
    }
  }
  if (names_tokens != nullptr) *names_tokens = named;
  if (harmony && !named) {
    Markers marker{tokenizer, {}};
    auto ast = harmony_answer_ast(c.gbnf, marker);
    if (!ast.ok()) return field_error(c.param.empty() ? "grammar" : c.param, ast.error().message);
    if (names_tokens != nullptr) *names_tokens = true;
    auto g = grammar::GrammarCache::shared().get_built("harmony final\n" + marker.bits + "\n" + c.gbnf,
                                                       [&]() -> Result<grammar::GrammarAst> { return *ast; });
    if (!g.ok()) return field_error(c.param.empty() ? "grammar" : c.param, g.error().message);
    return std::move(g).value();
  }
  auto g = grammar::GrammarCache::shared().get(c.gbnf);
  if (!g.ok()) return field_error(c.param.empty() ? "grammar" : c.param, g.error().message);
  return std::move(g).value();
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3-json";
    case ToolCallFormat::kGeneric:
      return "generic";
    case ToolCallFormat::kMistralArgs:
      return "mistral-args";
    case ToolCallFormat::kMistralCallId:
      return "mistral-call-id";
    case ToolCallFormat::kMistralJson:
      return "mistral-json";
    case ToolCallFormat::kQwenXml:
      return "qwen-xml";
    case ToolCallFormat::kGlm:
      return "glm";
    case ToolCallFormat::kGlmCompact:
      return "glm-compact";
    case ToolCallFormat::kDeepSeekV31:
      return "deepseek-v3.1";
    case ToolCallFormat::kDsml:
      return "deepseek-dsml";
    case ToolCallFormat::kKimi:
      return "kimi-k2";
    case ToolCallFormat::kCommandR7b:
      return "command-r7b";
    case ToolCallFormat::kCommandR:
      return "command-r";
    case ToolCallFormat::kGranite:
      return "granite";
    case ToolCallFormat::kHarmony:
      return "harmony";
    case ToolCallFormat::kGemma4:
      return "gemma4";
  }
  return "?";
}

ToolCallFormat tool_call_format_of_source(const std::string& src) {
  auto has = [&](std::string_view marker) { return src.find(marker) != std::string::npos; };
  if (has("[TOOL_CALLS]")) {
    if (has("[CALL_ID]")) return ToolCallFormat::kMistralCallId;
    return has("[ARGS]") ? ToolCallFormat::kMistralArgs : ToolCallFormat::kMistralJson;
  }
  if (has("<|channel|>") && has("<|call|>")) return ToolCallFormat::kHarmony;
  if (has("<|tool_call>call:")) return ToolCallFormat::kGemma4;
  if (has("｜DSML｜")) return ToolCallFormat::kDsml;
  if (has("<｜tool▁calls▁begin｜>") && has("<｜tool▁sep｜>") && !has("```json")) return ToolCallFormat::kDeepSeekV31;
  if (has("<|tool_calls_section_begin|>")) return ToolCallFormat::kKimi;
  if (has("<|START_ACTION|>")) return ToolCallFormat::kCommandR7b;
  // Command R / R+: "Action:" and a ```json list of {"tool_name", "parameters"}.
  if (has("Action:") && has("```json") && has("\"tool_name\"")) return ToolCallFormat::kCommandR;
  if (has("<|tool_call|>")) return ToolCallFormat::kGranite;
  if (has("<tool_call>")) {
    if (has("<function=")) return ToolCallFormat::kQwenXml;
    // GLM writes <tool_call>name<arg_key>... (4.5 / 4.6 on lines of their own).
    if (has("<arg_key>")) return has("\n<arg_key>") ? ToolCallFormat::kGlm : ToolCallFormat::kGlmCompact;
    // Apriel 1.5: a list in one block.
    if (has("list of json objects within <tool_call>")) return ToolCallFormat::kGeneric;
    return ToolCallFormat::kHermes;
  }
  // functionary v3.1 prints <|python_tag|> but calls as <function=f>{...}</function>.
  if ((has("<|python_tag|>") || has("ipython")) && !has("<function=")) return ToolCallFormat::kLlama3Json;
  return ToolCallFormat::kGeneric;
}

ToolCallFormat tool_call_format(const ChatTemplate* chat_template, bool template_renders_tools) {
  if (chat_template == nullptr || !template_renders_tools) return ToolCallFormat::kGeneric;
  return tool_call_format_of_source(chat_template->source());
}

namespace {

// `schema` itself, or what its local "$ref" ("#/$defs/X", "#/definitions/X")
// names in `root`; null when the ref does not resolve.
const Json* resolve_local_ref(const Json& root, const Json& schema) {
  if (!schema.is_object() || !schema.contains("$ref") || !schema["$ref"].is_string()) return &schema;
  const std::string ref = schema["$ref"].get<std::string>();
  for (const char* dir : {"#/$defs/", "#/definitions/"}) {
    const std::string_view d(dir);
    if (ref.rfind(d, 0) != 0) continue;
    const auto defs = root.find(std::string(d.substr(2, d.size() - 3)));
    if (defs == root.end() || !defs->is_object()) return nullptr;
    const auto found = defs->find(ref.substr(d.size()));
    return found == defs->end() ? nullptr : &*found;
  }
  return nullptr;
}

// The JSON Schema "type" a parameter's value is read back as (the first of
// a list that is not "null"); "" when it has none.
std::string parameter_type_of(const Json& property) {
  if (!property.is_object() || !property.contains("type")) return "";
  const Json& type = property["type"];
  if (type.is_string()) return type.get<std::string>();
  if (type.is_array()) {
    for (const Json& t : type) {
      if (t.is_string() && t != "null") return t.get<std::string>();
    }
  }
  return "";
}

std::set<std::string> types_of(const Json& property) {
  std::set<std::string> out;
  const Json& type = property["type"];
  if (type.is_string()) out.insert(type.get<std::string>());
  if (type.is_array()) {
    for (const Json& t : type) {
      if (t.is_string()) out.insert(t.get<std::string>());
    }
  }
  return out;
}

const std::set<std::string, std::less<>> kXmlRootKeys = {"type",    "properties",  "required", "additionalProperties",
                                                         "$defs",   "definitions", "title",    "description",
                                                         "$schema", "$id",         "$comment", "examples",
                                                         "default", "strict"};
const std::set<std::string, std::less<>> kXmlStringKeys = {
    "type",        "enum",    "const",    "pattern",  "minLength",  "maxLength", "title",
    "description", "default", "examples", "$comment", "deprecated", "readOnly",  "writeOnly"};

// The bare text of a string parameter in the XML form, as a GBNF grammar:
// `property` is typed "string" (or a list whose first non-null is).
Result<std::string> xml_string_gbnf(const Json& property, const std::string& path) {
  for (auto it = property.begin(); it != property.end(); ++it) {
    if (!kXmlStringKeys.count(it.key())) {
      return Error{"'" + it.key() + "' at " + path + " is not supported in the XML tool-call form (bare values)"};
    }
  }
  std::vector<std::string> options;
  if (property.contains("const")) {
    if (!property["const"].is_string()) return Error{"'const' at " + path + " must be a string for a string value"};
    options.push_back(property["const"].get<std::string>());
  } else if (property.contains("enum")) {
    if (!property["enum"].is_array()) return Error{"'enum' at " + path + " must be an array"};
    for (const Json& v : property["enum"]) {
      if (v.is_string()) options.push_back(v.get<std::string>());
    }
    if (options.empty()) return Error{"'enum' at " + path + " has no string for a string value"};
  }
  if (!options.empty()) return grammar::choice_gbnf(options);
  const bool has_length = property.contains("minLength") || property.contains("maxLength");
  if (property.contains("pattern")) {
    if (has_length || !property["pattern"].is_string()) {
      return Error{"'pattern' at " + path + " is not supported with minLength / maxLength in the XML tool-call form"};
    }
    RILL_ASSIGN_OR_RETURN(std::string expr, grammar::regex_to_gbnf_expression(property["pattern"].get<std::string>(),
                                                                              grammar::RegexAnchoring::kSearch,
                                                                              grammar::RegexOutput::kRaw));
    return "root ::= " + expr + "\n";
  }
  uint64_t lo = 0, hi = grammar::kUnbounded;
  for (const char* key : {"minLength", "maxLength"}) {
    if (!property.contains(key)) continue;
    const Json& v = property[key];
    if (!v.is_number_unsigned() || v.get<uint64_t>() > grammar::kMaxRepeat) {
      return Error{"'" + std::string(key) + "' at " + path + " must be an integer from 0 to " +
                   std::to_string(grammar::kMaxRepeat)};
    }
    (std::string_view(key) == "minLength" ? lo : hi) = v.get<uint64_t>();
  }
  if (lo > hi) return Error{"'minLength' at " + path + " is above its maxLength"};
  const std::string upper = hi == grammar::kUnbounded ? "" : std::to_string(hi);
  return "root ::= [^<]{" + std::to_string(lo) + "," + upper + "}\n";
}

}  // namespace

namespace {

// One parameter of the XML call form: its bare value's grammar.
struct XmlParameter {
  std::string name;
  std::string gbnf;
  bool required = false;
  bool is_string = false;  // typed "string": bare text (else JSON of its schema)
};

// The parameters of a tool in the XML call form, in the schema's order.
Result<std::vector<XmlParameter>> xml_parameters(const Json& params) {
  std::vector<XmlParameter> out;
  if (!params.is_object()) return Error{"expected a JSON Schema object"};
  for (auto it = params.begin(); it != params.end(); ++it) {
    if (!kXmlRootKeys.count(it.key())) {
      return Error{"'" + it.key() + "' at # is not supported in the XML tool-call form (one parameter per property)"};
    }
  }
  if (params.contains("type") && params["type"] != "object") return Error{"'type' at # must be \"object\""};
  if (!params.contains("properties")) return out;
  const Json& properties = params["properties"];
  if (!properties.is_object()) return Error{"'properties' at # must be an object"};
  std::set<std::string> required;
  if (params.contains("required")) {
    if (!params["required"].is_array()) return Error{"'required' at # must be an array"};
    for (const Json& r : params["required"]) {
      if (r.is_string()) required.insert(r.get<std::string>());
    }
  }
  for (const auto& [name, declared] : properties.items()) {
    const std::string path = "#/properties/" + name;
    if (name.empty() || name.find_first_of("<>\n") != std::string::npos) {
      return Error{"property name at " + path + " cannot be written in the XML tool-call form"};
    }
    const Json* property = resolve_local_ref(params, declared);
    if (property == nullptr) return Error{"$ref at " + path + " does not resolve"};
    const std::string type = parameter_type_of(*property);
    if (type.empty()) {
      return Error{"the property at " + path +
                   " needs a 'type' in the XML tool-call form (its bare value is read by it)"};
    }
    XmlParameter p{name, "", required.count(name) > 0, type == "string"};
    if (type == "string") {
      RILL_ASSIGN_OR_RETURN(p.gbnf, xml_string_gbnf(*property, path));
    } else {
      if (types_of(*property).count("string")) {
        return Error{"'type' at " + path +
                     " mixes \"string\" with other types, which the XML tool-call form cannot tell apart"};
      }
      Json sub = *property;  // keeps the root's definitions for its $refs
      for (const char* defs : {"$defs", "definitions"}) {
        if (params.contains(defs) && !sub.contains(defs)) sub[defs] = params[defs];
      }
      RILL_ASSIGN_OR_RETURN(p.gbnf, grammar::json_schema_to_gbnf(sub));
    }
    out.push_back(std::move(p));
  }
  return out;
}

// Parses `gbnf`, renames its rules with `prefix` into `ast`; the expression
// of its root.
Result<grammar::Expr> splice(grammar::GrammarAst& ast, const std::string& gbnf, const std::string& prefix) {
  RILL_ASSIGN_OR_RETURN(grammar::GrammarAst part, grammar::parse_gbnf(gbnf));
  for (grammar::Rule& r : part.rules) {
    r.name = prefix + r.name;
    prefix_refs(r.body, prefix);
    ast.rules.push_back(std::move(r));
  }
  return ref(prefix + "root");
}

grammar::Expr repeat(grammar::Expr e, uint32_t min, uint32_t max) {
  grammar::Expr r = node(grammar::Expr::Kind::kRepeat, {std::move(e)});
  r.min = min;
  r.max = max;
  return r;
}

Result<grammar::GrammarAst> harmony_answer_ast(const std::string& gbnf, Markers& marker) {
  using Kind = grammar::Expr::Kind;
  grammar::GrammarAst ast;
  RILL_ASSIGN_OR_RETURN(grammar::Expr answer, splice(ast, gbnf, "answer-"));
  grammar::Expr any_char;  // text: no special token can be spelled by it (grammar_ast.h)
  any_char.kind = Kind::kClass;
  any_char.ranges = {{0, grammar::kMaxCodepoint}};
  grammar::Expr analysis = node(Kind::kSeq, {marker("<|channel|>"), literal("analysis"), marker("<|message|>"),
                                             repeat(std::move(any_char), 0, grammar::kUnbounded), marker("<|end|>"),
                                             marker("<|start|>"), literal("assistant")});
  grammar::Expr root = node(Kind::kSeq, {repeat(ref("analysis"), 0, 1), marker("<|channel|>"), literal("final"),
                                         marker("<|message|>"), std::move(answer)});
  ast.rules.insert(ast.rules.begin(),
                   {grammar::Rule{"root", std::move(root), 0}, {"analysis", std::move(analysis), 0}});
  return ast;
}

// Nine alphanumerics: a Mistral call id (the server replaces it).
grammar::Expr mistral_call_id() {
  grammar::Expr c;
  c.kind = grammar::Expr::Kind::kClass;
  c.ranges = {{'0', '9'}, {'A', 'Z'}, {'a', 'z'}};
  return repeat(std::move(c), 9, 9);
}

}  // namespace

namespace {

// Formats whose values are bare text, one parameter at a time.
bool bare_values(ToolCallFormat format) {
  return format == ToolCallFormat::kQwenXml || format == ToolCallFormat::kGlm ||
         format == ToolCallFormat::kGlmCompact || format == ToolCallFormat::kDsml || format == ToolCallFormat::kGemma4;
}

// Gemma 4 writes strings <|"|>quoted<|"|> and other values in its own
// syntax; JSON scalars read the same in it, objects and arrays do not.
// True when every tool's parameters are strings or JSON scalars under
// plain keys, so the forced form can be Gemma's own.
bool gemma_writable(const Json& tools) {
  for (const Json& tool : tools) {
    const Json& fn = tool["function"];
    const auto params = fn.find("parameters");
    if (params == fn.end() || params->is_null() || params->empty()) continue;
    auto r = xml_parameters(*params);
    if (!r.ok()) return false;
    for (const XmlParameter& p : r.value()) {
      if (p.name.find_first_of(":,{}[]<|\" ") != std::string::npos) return false;
      if (p.is_string) continue;
      const Json* property = resolve_local_ref(*params, (*params)["properties"][p.name]);
      for (const std::string& t : types_of(*property)) {
        if (t != "integer" && t != "number" && t != "boolean" && t != "null") return false;
      }
    }
  }
  return true;
}

grammar::Expr digits() {
  grammar::Expr d;
  d.kind = grammar::Expr::Kind::kClass;
  d.ranges = {{'0', '9'}};
  return repeat(std::move(d), 1, 4);
}

}  // namespace

std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> tool_call_grammar(const Json& tools,
                                                                                          ToolCallFormat format,
                                                                                          bool parallel,
                                                                                          const Tokenizer* tokenizer) {
  // Gemma 4's syntax cannot carry nested values: those tools are forced in
  // rill's generic JSON form (the parser reads both).
  if (format == ToolCallFormat::kGemma4 && !gemma_writable(tools)) format = ToolCallFormat::kGeneric;
  // Each tool's arguments grammar (bare-value forms: each parameter's),
  // converted first: a refused schema is a 400 before anything is built or cached.
  const bool xml = bare_values(format);
  std::vector<std::string> args_gbnf;
  std::vector<std::vector<XmlParameter>> xml_params;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& fn = tools[i]["function"];
    const auto params = fn.find("parameters");
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    const bool any = params == fn.end() || params->is_null() || params->empty();
    if (xml) {
      std::vector<XmlParameter> p;
      if (!any) {
        auto r = xml_parameters(*params);
        if (!r.ok()) return converter_error(param, r.error());
        p = std::move(r).value();
      }
      xml_params.push_back(std::move(p));
      continue;
    }
    if (any) {
      args_gbnf.push_back(grammar::json_object_gbnf());
      continue;
    }
    auto g = grammar::json_schema_to_gbnf(*params);
    if (!g.ok()) return converter_error(param, g.error());
    args_gbnf.push_back(std::move(g).value());
  }
  // A marker the tokenizer has as one special token is that token (the
  // model writes it so); otherwise its text. The choice is in the cache key.
  Markers marker{tokenizer, {}};
  auto build = [&]() -> Result<grammar::GrammarAst> {
    using Kind = grammar::Expr::Kind;
    grammar::GrammarAst ast;
    std::vector<grammar::Expr> calls;
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string prefix = "t" + std::to_string(i) + "-";
      const Json name_json = tools[i]["function"]["name"];
      const std::string name = name_json.get<std::string>();
      if (xml) {
        const bool glm = format == ToolCallFormat::kGlm || format == ToolCallFormat::kGlmCompact;
        const std::string nl = format == ToolCallFormat::kGlmCompact ? "" : "\n";
        if (format == ToolCallFormat::kGemma4) {
          // key:value pairs in schema order, optional ones optional, a ','
          // between: rule a-J writes parameters J... after one was written,
          // b-J before any was.
          const size_t n = xml_params[i].size();
          for (size_t j = n + 1; j-- > 0;) {
            const std::string a = prefix + "a-" + std::to_string(j), b = prefix + "b-" + std::to_string(j);
            if (j == n) {
              ast.rules.push_back({a, node(Kind::kSeq, {}), 0});
              ast.rules.push_back({b, node(Kind::kSeq, {}), 0});
              continue;
            }
            const XmlParameter& p = xml_params[i][j];
            RILL_ASSIGN_OR_RETURN(grammar::Expr value, splice(ast, p.gbnf, prefix + "p" + std::to_string(j) + "-"));
            if (p.is_string) value = node(Kind::kSeq, {marker("<|\"|>"), std::move(value), marker("<|\"|>")});
            const std::string item = prefix + "i-" + std::to_string(j);
            ast.rules.push_back({item, node(Kind::kSeq, {literal(p.name + ":"), std::move(value)}), 0});
            const std::string next_a = prefix + "a-" + std::to_string(j + 1);
            const std::string next_b = prefix + "b-" + std::to_string(j + 1);
            grammar::Expr after = node(Kind::kSeq, {literal(","), ref(item), ref(next_a)});
            grammar::Expr first = node(Kind::kSeq, {ref(item), ref(next_a)});
            ast.rules.push_back(
                {a, p.required ? std::move(after) : node(Kind::kAlt, {std::move(after), ref(next_a)}), 0});
            ast.rules.push_back(
                {b, p.required ? std::move(first) : node(Kind::kAlt, {std::move(first), ref(next_b)}), 0});
          }
          calls.push_back(node(Kind::kSeq, {marker("<|tool_call>"), literal("call:" + name + "{"), ref(prefix + "b-0"),
                                            literal("}"), marker("<tool_call|>")}));
          continue;
        }
        std::vector<grammar::Expr> seq;
        if (format == ToolCallFormat::kQwenXml) {
          seq = {marker("<tool_call>"), literal("\n<function=" + name + ">\n")};
        } else if (glm) {
          seq = {marker("<tool_call>"), literal(name)};
        } else {
          seq = {literal("<｜DSML｜invoke name=\"" + name + "\">\n")};
        }
        for (size_t j = 0; j < xml_params[i].size(); ++j) {
          const XmlParameter& p = xml_params[i][j];
          RILL_ASSIGN_OR_RETURN(grammar::Expr value, splice(ast, p.gbnf, prefix + "p" + std::to_string(j) + "-"));
          grammar::Expr one;
          if (format == ToolCallFormat::kQwenXml) {
            one = node(Kind::kSeq,
                       {literal("<parameter=" + p.name + ">\n"), std::move(value), literal("\n</parameter>\n")});
          } else if (glm) {
            one = node(Kind::kSeq, {literal(nl), marker("<arg_key>"), literal(p.name), marker("</arg_key>"),
                                    literal(nl), marker("<arg_value>"), std::move(value), marker("</arg_value>")});
          } else {
            one = node(Kind::kSeq, {literal("<｜DSML｜parameter name=\"" + p.name + "\" string=\"" +
                                            (p.is_string ? "true" : "false") + "\">"),
                                    std::move(value), literal("</｜DSML｜parameter>\n")});
          }
          seq.push_back(p.required ? std::move(one) : repeat(std::move(one), 0, 1));
        }
        if (format == ToolCallFormat::kQwenXml) {
          seq.push_back(literal("</function>\n"));
          seq.push_back(marker("</tool_call>"));
        } else if (glm) {
          seq.push_back(literal(nl));
          seq.push_back(marker("</tool_call>"));
        } else {
          seq.push_back(literal("</｜DSML｜invoke>\n"));
        }
        calls.push_back(node(Kind::kSeq, std::move(seq)));
        continue;
      }
      RILL_ASSIGN_OR_RETURN(grammar::Expr args, splice(ast, args_gbnf[i], prefix));
      switch (format) {
        case ToolCallFormat::kMistralArgs:
          calls.push_back(node(Kind::kSeq, {marker("[TOOL_CALLS]"), literal(name), marker("[ARGS]"), std::move(args)}));
          break;
        case ToolCallFormat::kMistralCallId:
          calls.push_back(node(Kind::kSeq, {marker("[TOOL_CALLS]"), literal(name), marker("[CALL_ID]"),
                                            mistral_call_id(), marker("[ARGS]"), std::move(args)}));
          break;
        case ToolCallFormat::kMistralJson:
          calls.push_back(
              node(Kind::kSeq, {literal("{\"name\": " + name_json.dump() + ", \"arguments\": "), std::move(args),
                                literal(", \"id\": \""), mistral_call_id(), literal("\"}")}));
          break;
        case ToolCallFormat::kDeepSeekV31:
          calls.push_back(node(Kind::kSeq, {marker("<｜tool▁call▁begin｜>"), literal(name), marker("<｜tool▁sep｜>"),
                                            std::move(args), marker("<｜tool▁call▁end｜>")}));
          break;
        case ToolCallFormat::kKimi:
          calls.push_back(
              node(Kind::kSeq, {marker("<|tool_call_begin|>"), literal("functions." + name + ":"), digits(),
                                marker("<|tool_call_argument_begin|>"), std::move(args), marker("<|tool_call_end|>")}));
          break;
        case ToolCallFormat::kCommandR7b:
          calls.push_back(node(Kind::kSeq, {literal("{\"tool_call_id\": \""), digits(),
                                            literal("\", \"tool_name\": " + name_json.dump() + ", \"parameters\": "),
                                            std::move(args), literal("}")}));
          break;
        case ToolCallFormat::kCommandR:  // as the template writes a call (its tojson indents the arguments)
          calls.push_back(node(
              Kind::kSeq, {literal("    {\n        \"tool_name\": " + name_json.dump() + ",\n        \"parameters\": "),
                           std::move(args), literal("\n    }")}));
          break;
        case ToolCallFormat::kGranite:
          calls.push_back(node(Kind::kSeq, {literal("{\"name\": " + name_json.dump() + ", \"arguments\": "),
                                            std::move(args), literal("}")}));
          break;
        case ToolCallFormat::kHarmony:
          // The model's own header form (the template writes the recipient
          // first in history; the parser reads both). <|call|> ends it as EOS.
          calls.push_back(
              node(Kind::kSeq, {marker("<|channel|>"), literal("commentary to=functions." + name + " "),
                                marker("<|constrain|>"), literal("json"), marker("<|message|>"), std::move(args)}));
          break;
        default: {
          const bool hermes = format == ToolCallFormat::kHermes;
          const char* args_key = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
          std::vector<grammar::Expr> seq;
          if (hermes) seq.push_back(marker("<tool_call>"));
          seq.push_back(
              literal(std::string(hermes ? "\n" : "") + "{\"name\": " + name_json.dump() + ", \"" + args_key + "\": "));
          seq.push_back(std::move(args));
          seq.push_back(literal(hermes ? "}\n" : "}"));
          if (hermes) seq.push_back(marker("</tool_call>"));
          calls.push_back(node(Kind::kSeq, std::move(seq)));
        }
      }
    }
    std::string separator = "\n";
    if (format == ToolCallFormat::kLlama3Json) separator = "; ";
    if (format == ToolCallFormat::kMistralJson) separator = ", ";
    if (format == ToolCallFormat::kCommandR7b) separator = ",\n    ";
    if (format == ToolCallFormat::kCommandR) separator = ",\n";
    if (format == ToolCallFormat::kGranite) separator = ", ";
    if (format == ToolCallFormat::kMistralArgs || format == ToolCallFormat::kMistralCallId ||
        format == ToolCallFormat::kGlmCompact || format == ToolCallFormat::kGemma4 ||
        format == ToolCallFormat::kDeepSeekV31 || format == ToolCallFormat::kKimi || format == ToolCallFormat::kDsml) {
      separator = "";
    }
    grammar::Rule call{"call", node(Kind::kAlt, std::move(calls)), 0};
    grammar::Expr root_body = ref("call");
    if (parallel && format != ToolCallFormat::kHarmony) {  // harmony: one call per turn
      root_body =
          node(Kind::kSeq,
               {ref("call"), repeat(node(Kind::kSeq, {literal(separator), ref("call")}), 0, grammar::kUnbounded)});
    }
    switch (format) {
      case ToolCallFormat::kMistralJson:
        root_body = node(Kind::kSeq, {marker("[TOOL_CALLS]"), literal("["), std::move(root_body), literal("]")});
        break;
      case ToolCallFormat::kDeepSeekV31:
        root_body =
            node(Kind::kSeq, {marker("<｜tool▁calls▁begin｜>"), std::move(root_body), marker("<｜tool▁calls▁end｜>")});
        break;
      case ToolCallFormat::kKimi:
        root_body = node(Kind::kSeq, {marker("<|tool_calls_section_begin|>"), std::move(root_body),
                                      marker("<|tool_calls_section_end|>")});
        break;
      case ToolCallFormat::kDsml:
        root_body = node(Kind::kSeq, {literal("<｜DSML｜function_calls>\n"), std::move(root_body),
                                      literal("</｜DSML｜function_calls>")});
        break;
      case ToolCallFormat::kCommandR:
        root_body = node(Kind::kSeq, {literal("Action:\n```json\n[\n"), std::move(root_body), literal("\n]```")});
        break;
      case ToolCallFormat::kGranite:
        root_body = node(Kind::kSeq, {marker("<|tool_call|>"), literal("["), std::move(root_body), literal("]")});
        break;
      case ToolCallFormat::kCommandR7b:
        root_body = node(Kind::kSeq, {marker("<|START_ACTION|>"), literal("[\n    "), std::move(root_body),
                                      literal("\n]"), marker("<|END_ACTION|>")});
        break;
      default:
        break;
    }
    ast.rules.insert(ast.rules.begin(), {grammar::Rule{"root", std::move(root_body), 0}, std::move(call)});
    return ast;
  };
  // The key: everything the grammar depends on; the markers' choices are
  // known once the AST is built, so it is built first (cheap next to compiling).
  auto ast = build();
  if (!ast.ok()) return field_error("tools", ast.error().message);
  std::string key =
      "tools\n" + std::to_string(static_cast<int>(format)) + (parallel ? "p\n" : "1\n") + marker.bits + "\n";
  for (size_t i = 0; i < tools.size(); ++i) {
    key += tools[i]["function"]["name"].get<std::string>() + "\n";
    if (!xml) {
      key += args_gbnf[i] + "\n";
      continue;
    }
    for (const XmlParameter& p : xml_params[i]) key += p.name + (p.required ? "\n1\n" : "\n0\n") + p.gbnf + "\n";
  }
  auto g = grammar::GrammarCache::shared().get_built(key, [&]() -> Result<grammar::GrammarAst> { return *ast; });
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
    for (const auto& [name, declared] : properties.items()) {
      const Json* property = resolve_local_ref(*schema, declared);
      const std::string type = property == nullptr ? "" : parameter_type_of(*property);
      if (!type.empty()) params[name] = type;
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

std::string granite_tool_calls_text(const Json& tool_calls) {
  // Spaced as the forced form writes it (tool_call_grammar).
  std::string text = "<|tool_call|>[";
  for (const Json& c : tool_calls) {
    const Json& fn = c["function"];
    const Json args = fn.contains("arguments") ? fn["arguments"] : Json::object();
    if (text.back() != '[') text += ", ";
    text += "{\"name\": " + Json(fn.value("name", "")).dump(-1, ' ', false, Json::error_handler_t::replace) +
            ", \"arguments\": " + args.dump(-1, ' ', false, Json::error_handler_t::replace) + "}";
  }
  return text + "]";
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
