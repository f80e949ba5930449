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
// string "name" stays content.
#include <string>
#include <string_view>
#include <vector>

namespace rill {

struct ToolCall {
  std::string id;         // "call_<random>", assigned by the parser
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
  bool saw_tool_calls() const;
};

}  // namespace rill
