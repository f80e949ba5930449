#pragma once
// OutputParser: splits a chat model's generated text, as it streams, into
// reasoning (<think>...</think>), visible content and tool calls, in the
// formats chat templates teach models:
//   Hermes / Qwen   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (one or more)
//   Llama 3.x       the whole reply is {"name": ..., "parameters"|"arguments": {...}}
//                   (optionally after <|python_tag|>), or several separated by ';'
// Text that might still turn into a marker is held back (never streamed as
// content and then taken back). A tool call is emitted whole once its JSON
// is complete. Text that looked like a call but is not valid JSON with a
// string "name" stays content (Llama-3 form: also needs "parameters" or
// "arguments", so a plain JSON answer with a "name" key stays content).
//
// Contract: the result does not depend on how the text is split into push()
// calls; concatenating every delta's content (reasoning, tool calls) gives
// the same text for any split (tests/text/output_parser_test.cpp checks it).
//
// Whitespace: reasoning is trimmed at both ends; content drops the
// whitespace right after </think> and after a tool call. With tool parsing
// on, trailing whitespace of content is held until more content follows (so
// the "\n" before a <tool_call> never streams) and dropped at the end when
// the reply made tool calls. With both reasoning and tool parsing off, the
// content is exactly the input.
//
// A <tool_call> block the stream ends inside is still a call when its JSON
// is complete and valid (models sometimes stop at EOS before the closing
// tag); otherwise it ends as content. An unfinished think block ends as
// reasoning.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace rill {

struct ToolCall {
  std::string id;  // "call_<random>", assigned by the parser
  std::string name;
  std::string arguments;  // JSON object text (compact)
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

struct OutputParserOptions {
  bool parse_reasoning = true;       // split <think>...</think>
  bool starts_in_reasoning = false;  // the prompt already opened <think>
  bool parse_tool_calls = false;     // tools were offered to the model
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  // Feeds decoded text; appends to `out` what became final.
  void push(std::string_view text, OutputDelta& out);
  // End of the stream: releases held text (an unfinished call or think block
  // ends as what it was: content or reasoning).
  void finish(OutputDelta& out);
  bool saw_tool_calls() const { return saw_tool_calls_; }

 private:
  enum class Mode {
    kStart,  // only whitespace so far: <think>, <|python_tag|> or '{' may open the reply
    kContent,
    kReasoning,  // inside <think>
    kToolCall,   // inside <tool_call>; buf_ holds the body
    kJsonCalls,  // Llama-3 JSON calls; buf_ holds the raw text since they began
  };
  // Consumes buf_ as far as it is decided; `final`: no more text comes.
  void drain(bool final, OutputDelta& out);
  // One step of each mode; true when the mode changed and draining goes on.
  bool step_start(bool final, OutputDelta& out);
  bool step_content(bool final, OutputDelta& out);
  bool step_reasoning(bool final, OutputDelta& out);
  bool step_tool_call(bool final, OutputDelta& out);
  bool step_json_calls(bool final, OutputDelta& out);
  void emit_content(std::string_view s, OutputDelta& out);
  void emit_reasoning(std::string_view s, OutputDelta& out);

  OutputParserOptions options_;
  Mode mode_ = Mode::kStart;
  std::string buf_;             // undecided text
  std::string content_ws_;      // trailing whitespace of content not yet emitted
  std::string reasoning_ws_;    // trailing whitespace of reasoning not yet emitted
  bool trim_content_ = false;   // drop the next leading whitespace of content
  bool trim_reasoning_ = true;  // drop the next leading whitespace of reasoning
  bool saw_tool_calls_ = false;
  // kJsonCalls scanner over buf_.
  size_t json_scan_ = 0;                    // next byte of buf_ to look at
  size_t json_object_ = std::string::npos;  // '{' of the object being read, npos between objects
  int json_depth_ = 0;
  bool json_in_string_ = false, json_escape_ = false;
  bool json_any_call_ = false;  // a call was emitted in this run of calls
};

// Parses one tool call object {"name": "...", "arguments"|"parameters": {...}}
// into `call` (id left empty). `require_arguments`: the Llama-3 form, where
// a JSON answer without arguments must stay content. False when it is not
// valid JSON, not an object or has no non-empty string "name".
bool parse_tool_call_json(std::string_view json_text, bool require_arguments, ToolCall& call);

// "call_" + 24 random alphanumerics.
std::string make_tool_call_id();

}  // namespace rill
