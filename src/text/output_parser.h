#pragma once
// OutputParser: splits a chat model's generated text, as it streams, into
// reasoning (<think>...</think>), visible content and tool calls, in the
// formats chat templates teach models:
//   Hermes / Qwen   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (one or more)
//   Llama 3.x       the whole reply is {"name": ..., "parameters"|"arguments": {...}}
//                   (optionally after <|python_tag|>), or several separated by ';'
//   rill generic    the same JSON objects, one per line (structured_output.h)
//   Mistral         [TOOL_CALLS]name[ARGS]{...} (Ministral 3, Devstral, Magistral),
//                   [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} (Mistral Small 3.2), one
//                   marker per call; [TOOL_CALLS][{"name", "arguments", "id"}, ...] (Nemo).
//                   The name streams once [ARGS] follows it; the model's call id is
//                   replaced by the server's.
//   Qwen3-Coder /   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
//   Qwen3.5 XML     </function>\n</tool_call>: the name streams at its '>', then
//                   "{", each parameter's "\"P\":" at its '>', its value (bare
//                   text made JSON: OutputParserOptions::parameter_types) at
//                   </parameter> or, typed "string", as it comes; "}" at </function>.
//   Gemma 4         <|tool_call>call:NAME{key:value,...}<tool_call|>, values as its
//                   template writes them (<|"|>string<|"|>, bare numbers and
//                   true/false, {..} and [..] nested); read whole at <tool_call|>,
//                   then name and arguments (as JSON) stream at once.
//   DeepSeek V3.1   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//                   ...<｜tool▁calls▁end｜>; the arguments stream as Mistral's.
//   Kimi K2         <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//                   <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
//   Granite 3.3     <|tool_call|>[{"name": ..., "arguments": {...}}, ...]: read as Nemo's list.
//   GLM 4.5-4.7,    <tool_call>NAME<arg_key>..., <｜DSML｜function_calls>...,
//   DeepSeek V3.2,  <|START_ACTION|>[...]<|END_ACTION|>, Action: ```json
//   Command R7B,    [{"tool_name": ..., "parameters": {...}}, ...]``` (the
//   Command R / R+  closing fence the first after the list; "Action:" without
//                   the fence is content): read whole at the closing marker
//                   (text/tool_call_blocks.h), then each call streams at once.
// Reasoning: <think>...</think>, or Gemma 4's <|channel>thought...<channel|>,
// at the start of the reply.
// Text that might still turn into a marker is held back (never streamed as
// content and then taken back). Text that looked like a call but is not
// valid JSON with a string "name" stays content (Llama-3 form: also needs
// "parameters" or "arguments", so a plain JSON answer with a "name" key
// stays content).
//
// Tool calls stream (OutputDelta::tool_call_deltas): a call's first delta
// carries its index, id and name as soon as the name's string has closed
// (Llama-3 / generic form: and the arguments value has begun as an object
// or a string, which tells a call from a JSON answer); the next ones carry
// the arguments text as it is read (text/json_call_reader.h: nlohmann's
// compact form of the arguments object, built piece by piece, or the decoded
// arguments string). When the call ends it also comes whole in
// OutputDelta::tool_calls, its arguments equal to the concatenated pieces
// byte for byte, and the same as parse_tool_call_json gives for the object.
//
// A call whose name has streamed stays a call. If its text then breaks (a
// JSON syntax error, arguments that are not an object or a string, nesting
// past kMaxJsonDepth, XML that is not <parameter=...> or </function>, or the
// reply ends inside it), the call ends with the arguments streamed so far
// ("{}" when none had streamed; what did stream may not parse, as with any
// server that streams calls) and the rest of its text is dropped: Hermes
// and XML forms through </tool_call> (or up to the next <tool_call>), JSON
// and Mistral forms to the end of the reply. With forced tool calls
// (tool_choice required) the grammar makes every call whole.
//
// Contract: the result does not depend on how the text is split into push()
// calls; concatenating every delta's content (reasoning, tool calls, call
// deltas) gives the same text for any split (tests/text/output_parser_test.cpp
// checks it).
//
// Whitespace: reasoning is trimmed at both ends; content drops the
// whitespace right after </think> and after a tool call. With tool parsing
// on, trailing whitespace of content is held until more content follows (so
// the "\n" before a <tool_call> never streams) and dropped at the end when
// the reply made tool calls. With both reasoning and tool parsing off, the
// content is exactly the input. Text between a Hermes call's JSON and its
// </tool_call> is dropped.
//
// A <tool_call> block the stream ends inside is still a call when its name
// has been read (models sometimes stop at EOS before the closing tag);
// otherwise it ends as content. An unfinished think block ends as reasoning.
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/json_call_reader.h"

namespace rill {

struct ToolCall {
  std::string id;  // "call_<random>", assigned by the parser
  std::string name;
  std::string arguments;  // JSON object text (compact)
};

// A piece of a streamed tool call. The call's first piece has its id and
// name (arguments ""); later ones have arguments text only (id, name "").
struct ToolCallDelta {
  size_t index = 0;  // the call's position among the reply's calls, from 0
  std::string id, name;
  std::string arguments;
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  // Calls that ended, whole (after their deltas, in an earlier or this delta).
  std::vector<ToolCall> tool_calls;
  // Pieces of the calls being written, in order; consecutive argument pieces
  // of one call within one delta are merged.
  std::vector<ToolCallDelta> tool_call_deltas;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty() && tool_call_deltas.empty(); }
};

// {tool name: {parameter: its JSON Schema "type"}} of the offered tools.
using ToolParameterTypes = std::map<std::string, std::map<std::string, std::string>>;

struct OutputParserOptions {
  bool parse_reasoning = true;       // split <think>...</think>
  bool starts_in_reasoning = false;  // the prompt already opened <think>
  bool parse_tool_calls = false;     // tools were offered to the model
  // For the XML form, whose values are bare text: a parameter typed
  // "string" stays a string. Without it (or for other types) a value that
  // is JSON other than a string (or Python's True / False / None) is that
  // value, anything else a string.
  std::shared_ptr<const ToolParameterTypes> parameter_types;
  // OpenAI's harmony format (gpt-oss; text/harmony_parser.h): channels and
  // recipients instead of the markers above. The reply's text must keep the
  // harmony special tokens (<|channel|>, <|message|>, ...).
  bool harmony = false;
};

class HarmonyParser;
struct FramedCallFormat;  // output_parser.cpp

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;
  // Feeds decoded text; appends to `out` what became final.
  void push(std::string_view text, OutputDelta& out);
  // End of the stream: releases held text (an unfinished call or think block
  // ends as what it was: content or reasoning).
  void finish(OutputDelta& out);
  bool saw_tool_calls() const;

 private:
  enum class Mode {
    kStart,  // only whitespace so far: <think>, <|python_tag|> or '{' may open the reply
    kContent,
    kReasoning,     // inside <think>
    kToolCall,      // inside <tool_call>; buf_ holds the body not yet read (all of it until the call opens)
    kToolCallText,  // a <tool_call> block that is no call: content once </tool_call> (or the end) comes
    kToolCallEnd,   // after a Hermes call's JSON: dropped through </tool_call>
    kJsonCalls,     // Llama-3 JSON calls; buf_ holds the raw text since they began (until a call opens)
    kXmlCall,       // <tool_call><function=...>: buf_ holds the text not yet read
    kMistralCalls,  // after [TOOL_CALLS]; buf_ holds the marker and what follows (until a call opens)
    kDropRest,      // a JSON-form call broke: the rest of the reply is dropped
    kGemmaCall,     // after <|tool_call>: buf_ holds the call until <tool_call|>
    kBlockCalls,    // after block_open_: buf_ holds the block until block_close_ (tool_call_blocks.h)
    kFramedCalls,   // after framed_->section_open (DeepSeek V3.1, Kimi K2)
  };
  enum class BlockKind { kGlm, kDsml, kAction, kCommandR };
  // Consumes buf_ as far as it is decided; `final`: no more text comes.
  void drain(bool final, OutputDelta& out);
  // One step of each mode; true when the mode changed and draining goes on.
  bool step_start(bool final, OutputDelta& out);
  bool step_content(bool final, OutputDelta& out);
  bool step_reasoning(bool final, OutputDelta& out);
  bool step_tool_call(bool final, OutputDelta& out);
  bool step_tool_call_text(bool final, OutputDelta& out);
  bool step_tool_call_end(bool final);
  bool step_json_calls(bool final, OutputDelta& out);
  bool step_mistral_calls(bool final, OutputDelta& out);
  bool step_xml_call(bool final, OutputDelta& out);
  bool step_gemma_call(bool final, OutputDelta& out);
  bool step_block_calls(bool final, OutputDelta& out);
  bool step_framed_calls(bool final, OutputDelta& out);
  void start_block(BlockKind kind, std::string_view open, std::string_view close);
  // A parameter's bare text as JSON (OutputParserOptions::parameter_types).
  std::string xml_value_json(const std::string& parameter, std::string_view value) const;
  const std::string* parameter_type(const std::string& parameter) const;  // of the open call; null: unknown
  void start_tool_call();                                                 // after <tool_call>
  // The reader found a call: its first delta (and the arguments read so far).
  void open_call(const std::string& name, OutputDelta& out);
  void stream_arguments(OutputDelta& out);
  void append_arguments(std::string_view piece, OutputDelta& out);
  // The reader ended (complete or broken): the whole call goes out.
  void close_call(OutputDelta& out);
  void close_call(bool complete, OutputDelta& out);
  void emit_content(std::string_view s, OutputDelta& out);
  void emit_reasoning(std::string_view s, OutputDelta& out);

  OutputParserOptions options_;
  Mode mode_ = Mode::kStart;
  std::string buf_;                                // undecided text
  std::string_view reasoning_close_ = "</think>";  // what ends the reasoning block
  std::string content_ws_;                         // trailing whitespace of content not yet emitted
  std::string reasoning_ws_;                       // trailing whitespace of reasoning not yet emitted
  bool trim_content_ = false;                      // drop the next leading whitespace of content
  bool trim_reasoning_ = true;                     // drop the next leading whitespace of reasoning
  bool saw_tool_calls_ = false;
  // The call object being read (kToolCall, kJsonCalls).
  std::optional<JsonCallReader> reader_;
  size_t json_scan_ = 0;                    // next byte of buf_ for the reader (before a call opens)
  size_t json_object_ = std::string::npos;  // kJsonCalls: '{' of the object being read, npos between objects
  bool json_any_call_ = false;              // kJsonCalls: a call opened in this run of calls
  bool json_array_ = false;                 // kJsonCalls inside Mistral's [TOOL_CALLS][...]: ',' between, ']' ends
  bool call_open_ = false;                  // a call's first delta went out; call_ is being streamed
  ToolCall call_;                           // the open call (arguments: streamed so far)
  size_t call_index_ = 0, n_calls_ = 0;
  size_t n_xml_parameters_ = 0;                // parameters of the open XML call written so far
  std::string xml_parameter_;                  // the parameter whose value is being read
  bool xml_in_value_ = false;                  // between <parameter=...> and </parameter>
  bool xml_value_started_ = false;             // its leading "\n" is dealt with
  bool xml_string_value_ = false;              // typed "string": its text streams as it comes
  BlockKind block_kind_ = BlockKind::kGlm;     // kBlockCalls
  std::string_view block_open_, block_close_;  // its markers (static strings)
  size_t block_scanned_ = 0;                   // kCommandR: closing fences before this offset were tried
  int block_tries_ = 0;                        // kCommandR: fences tried (each parses the block)
  const FramedCallFormat* framed_ = nullptr;   // kFramedCalls
  std::unique_ptr<HarmonyParser> harmony_;     // options_.harmony: the whole reply goes through it
};

// Parses one tool call object {"name": "...", "arguments"|"parameters": {...}}
// into `call` (id left empty). `require_arguments`: the Llama-3 form, where
// a JSON answer without arguments must stay content. False when it is not
// valid JSON, not an object or has no non-empty string "name".
bool parse_tool_call_json(std::string_view json_text, bool require_arguments, ToolCall& call);

// "call_" + 24 random alphanumerics.
std::string make_tool_call_id();

}  // namespace rill
