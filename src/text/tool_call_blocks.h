#pragma once
// Readers of tool-call formats that the output parser (text/output_parser.h)
// takes whole: it holds the block from its opening marker to its closing
// one, then reads every call in it here. Each returns false when the text
// is not that format (the parser then leaves it as content). Arguments come
// out as compact JSON objects (nlohmann's dump); ids are left empty.
//
//   GLM 4.5-4.7   <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
//                 (4.7 without the newlines); V bare text: a string when the
//                 tool's schema types K "string", else JSON (or a string).
//   DeepSeek V3.2 <｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
//                 <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n
//                 ...</｜DSML｜invoke>...</｜DSML｜function_calls>; string="true": V is
//                 the string, else JSON.
//   Command R7B   <|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME,
//                 "parameters": {...}}, ...]<|END_ACTION|>
#include <string>
#include <string_view>
#include <vector>

#include "text/output_parser.h"

namespace rill {

// The body between <tool_call> and </tool_call> (GLM).
bool parse_glm_call(std::string_view body, const ToolParameterTypes* types, ToolCall& call);
// The body between <｜DSML｜function_calls> and </｜DSML｜function_calls>.
bool parse_dsml_calls(std::string_view body, std::vector<ToolCall>& calls);
// The body between <|START_ACTION|> and <|END_ACTION|>.
bool parse_action_calls(std::string_view body, std::vector<ToolCall>& calls);

// A bare parameter value as JSON: a string when `type` is "string";
// otherwise JSON other than a string as itself (Python's True / False /
// None as JSON), anything else as a string. `type` may be null (unknown).
std::string bare_value_json(const std::string* type, std::string_view value);

}  // namespace rill
