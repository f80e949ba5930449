#pragma once
// Structured outputs and forced tool calls: the request fields that
// constrain what the model writes, turned into grammars for the engine
// (GenerationRequest::grammar, text/grammar).
//
//   chat / completions  response_format {type: text | json_object |
//                       json_schema, json_schema: {name, schema, strict}};
//                       json_object also takes llama.cpp's `schema` (an
//                       object); rill / llama.cpp extensions: grammar (GBNF
//                       text), regex (the whole output), choice (one of the
//                       strings). At most one of them per request.
//   Responses           text.format {type: text | json_object | json_schema,
//                       name, schema, strict}.
//   tool_choice         required / a named function (Anthropic any / tool):
//                       the output is one call (or several, unless
//                       parallel_tool_calls is false) whose arguments match
//                       the tool's parameters schema, in the call format the
//                       output parser reads back (text/output_parser.h).
// Schemas are enforced whatever `strict` says. A schema feature the
// converter cannot enforce is a 400 naming the keyword and the field.
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/field_reader.h"
#include "text/grammar/compiled_grammar.h"
#include "text/output_parser.h"

namespace rill {
class ChatTemplate;
class Tokenizer;
}  // namespace rill

namespace rill::server {

struct OutputConstraint {
  std::string gbnf;   // "": unconstrained
  std::string param;  // the field it came from ("response_format"), named by errors
  bool empty() const { return gbnf.empty(); }
};

// `response_format` of chat and completions.
std::optional<ApiError> read_response_format(const FieldReader& body, OutputConstraint& out);
// Responses `text.format` (`text` is the reader over the request's `text`).
std::optional<ApiError> read_text_format(const FieldReader& text, OutputConstraint& out);
// The extensions `grammar`, `regex` and `choice`; 400 when `out` is already
// set (by response_format) or more than one is given.
std::optional<ApiError> read_grammar_fields(const FieldReader& body, OutputConstraint& out);

// The compiled grammar (shared between requests: GrammarCache::shared());
// null for an empty constraint; a 400 naming c.param when it does not compile.
// A grammar that names a special token (<|channel|>) the tokenizer lacks is a
// 400; *names_tokens tells whether the compiled grammar names any (the
// reply's text must then keep special tokens).
// `harmony` (gpt-oss): the constraint is the answer's, in the final channel,
// after the reasoning, as after </think> for <think> models:
//   root     ::= analysis? <|channel|> "final" <|message|> CONSTRAINT
//   analysis ::= <|channel|> "analysis" <|message|> TEXT <|end|> <|start|> "assistant"
// (TEXT: any text, which no special token is; one analysis message, as
// gpt-oss writes before its answer, so the answer must follow it). A grammar
// that names special tokens itself constrains the whole reply as written.
std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> compile_constraint(
    const OutputConstraint& c, const Tokenizer* tokenizer = nullptr, bool* names_tokens = nullptr,
    bool harmony = false);

// How the model writes tool calls (what the output parser reads back):
//   kHermes         <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, calls joined by "\n"
//   kLlama3Json     {"name": "f", "parameters": {...}}, calls joined by "; "
//   kGeneric        {"name": "f", "arguments": {...}}, calls joined by "\n": rill's format for
//                   templates that render no tools (described to the model in a system message),
//                   and the forced form for templates whose own call syntax the parser does not
//                   read (Apertus, LFM2, Nemotron Nano v2, MiniMax, functionary...)
//   kMistralArgs    [TOOL_CALLS]f[ARGS]{...} per call (Ministral 3, Devstral, Magistral)
//   kMistralCallId  [TOOL_CALLS]f[CALL_ID]<9 alphanumerics>[ARGS]{...} per call (Mistral Small 3.2)
//   kMistralJson    [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "<9>"}, ...] (Nemo)
//   kQwenXml        <tool_call>\n<function=f>\n<parameter=p>\nVALUE\n</parameter>\n...</function>\n
//                   </tool_call>, calls joined by "\n" (Qwen3-Coder, Qwen3.5, Nemotron 3, Step 3.5)
//   kGlm            <tool_call>f\n<arg_key>p</arg_key>\n<arg_value>VALUE</arg_value>\n...</tool_call>
//                   (GLM 4.5 / 4.6; kGlmCompact: GLM 4.7, without the newlines); values bare as kQwenXml's
//   kDeepSeekV31    <｜tool▁calls▁begin｜>(<｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>)+
//                   <｜tool▁calls▁end｜>
//   kDsml           DeepSeek V3.2: <｜DSML｜function_calls>\n(<｜DSML｜invoke name="f">\n(<｜DSML｜parameter
//                   name="p" string="true|false">VALUE</｜DSML｜parameter>\n)*</｜DSML｜invoke>\n)+
//                   </｜DSML｜function_calls>; values bare as kQwenXml's
//   kKimi           <|tool_calls_section_begin|>(<|tool_call_begin|>functions.f:N
//                   <|tool_call_argument_begin|>{...}<|tool_call_end|>)+<|tool_calls_section_end|>
//   kCommandR7b     <|START_ACTION|>[\n    {"tool_call_id": "N", "tool_name": "f", "parameters": {...}},...
//                   \n]<|END_ACTION|>
//   kCommandR       Command R / R+ (08-2024): Action:\n```json\n[\n    {\n        "tool_name": "f",\n
//                           "parameters": {...}\n    },\n...\n]```
//   kGranite        Granite 3.3: <|tool_call|>[{"name": "f", "arguments": {...}}, ...]
//   kHarmony        gpt-oss: <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}
//                   then <|call|> (an end-of-generation token); one call per turn
//   kGemma4         <|tool_call>call:f{p:<|"|>text<|"|>,n:3}<tool_call|> per call; tools with
//                   object or array parameters are forced in the kGeneric form instead
enum class ToolCallFormat {
  kHermes,
  kLlama3Json,
  kGeneric,
  kMistralArgs,
  kMistralCallId,
  kMistralJson,
  kQwenXml,
  kGlm,
  kGlmCompact,
  kDeepSeekV31,
  kDsml,
  kKimi,
  kCommandR7b,
  kCommandR,
  kGranite,
  kHarmony,
  kGemma4,
};
const char* tool_call_format_name(ToolCallFormat format);
// The template's own format when it renders tools, judged by the markers
// its source prints (tests/server/template_corpus_test.cpp holds each of
// ../shared/templates to it); kGeneric when it renders none or its syntax is
// not one of the above.
ToolCallFormat tool_call_format(const ChatTemplate* chat_template, bool template_renders_tools);
ToolCallFormat tool_call_format_of_source(const std::string& template_source);

// The grammar of forced tool calls over `tools` (OpenAI shape, validated):
// one call, or one or more when `parallel`. A tool without parameters takes
// any JSON object (kQwenXml: no parameters). 400 naming
// tools[i].function.parameters for a schema the converter refuses. kQwenXml
// writes values bare, so its parameters schema must be an object of
// properties, each with a "type" (after one local $ref), a string one
// limited to enum / const / pattern / minLength / maxLength (its text has no
// '<'); other keywords are 400s naming them.
// Markers the tokenizer has as one special token ([TOOL_CALLS], <|channel|>,
// GLM's <arg_key>, ...) are named as that token (text/grammar/grammar_ast.h),
// others spelled as text; no tokenizer: all text.
std::variant<std::shared_ptr<const grammar::CompiledGrammar>, ApiError> tool_call_grammar(
    const nlohmann::ordered_json& tools, ToolCallFormat format, bool parallel, const Tokenizer* tokenizer = nullptr);

// The system-message text that describes `tools` and the kGeneric call
// format to a model whose template renders no tools.
std::string generic_tools_prompt(const nlohmann::ordered_json& tools);
// {name: {parameter: JSON Schema type}} of `tools` (OpenAI shape,
// validated): what the output parser needs to read the XML call form's bare
// values back (OutputParserOptions::parameter_types). A list of types gives
// its first that is not "null"; a parameter without a type is left out.
std::shared_ptr<const ToolParameterTypes> tool_parameter_types(const nlohmann::ordered_json& tools);

// An assistant turn's earlier calls (OpenAI tool_calls, arguments parsed or
// text) written in the kGeneric format, for templates that render no tools.
std::string generic_tool_calls_text(const nlohmann::ordered_json& tool_calls);
// The same in Granite 3.3's syntax (kGranite), whose template renders tools
// but drops an assistant turn's tool_calls: <|tool_call|>[{"name", "arguments"}, ...].
std::string granite_tool_calls_text(const nlohmann::ordered_json& tool_calls);

}  // namespace rill::server
