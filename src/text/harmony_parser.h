#pragma once
// HarmonyParser: the output side of OpenAI's harmony format (gpt-oss), as
// the model writes it after the template's `<|start|>assistant`:
//
//   <|channel|>analysis<|message|>THINKING<|end|>
//   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{ARGS}<|call|>
//
// Each message is a header (role, `<|channel|>` and its name, a recipient
// `to=...` before or after the channel, a content type) up to
// `<|message|>`, then its body up to `<|end|>`, `<|return|>`, `<|call|>` or
// the next `<|start|>`. The analysis channel's bodies are reasoning; a body
// addressed to `functions.NAME` is a tool call (when tools were offered;
// its name streams once the header ends, its arguments when the body ends:
// the compact JSON object, or the body text as it is when it is not JSON);
// every other body (final, commentary without a recipient) is content.
// Headers and markers are never emitted; text that might still be the
// start of a marker is held back. The result does not depend on how the
// text is split into push() calls. A body the stream ends inside ends as
// what it was (<|return|> and <|call|> are end-of-sequence tokens, so a
// stream usually ends without them).
#include <string>
#include <string_view>

#include "text/output_parser.h"

namespace rill {

class HarmonyParser {
 public:
  explicit HarmonyParser(bool parse_tool_calls) : parse_tool_calls_(parse_tool_calls) {}
  void push(std::string_view text, OutputDelta& out);
  void finish(OutputDelta& out);
  bool saw_tool_calls() const { return n_calls_ > 0; }

 private:
  enum class Body { kContent, kReasoning, kToolCall };
  void drain(bool final, OutputDelta& out);
  void start_body(const std::string& header, OutputDelta& out);
  void end_body(OutputDelta& out);
  void emit(std::string_view text, OutputDelta& out);

  bool parse_tool_calls_;
  bool in_body_ = false;
  Body body_ = Body::kContent;
  std::string buf_;        // undecided text (a header, or body text that may start a marker)
  std::string call_body_;  // the open tool call's arguments text
  ToolCall call_;
  size_t n_calls_ = 0;
  size_t n_messages_ = 0;
};

}  // namespace rill
