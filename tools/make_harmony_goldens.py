#!/usr/bin/env python3
"""Chat-template goldens for gpt-oss's harmony template
(../shared/templates/openai-gpt-oss-120b.jinja), rendered by Python jinja2
as transformers configures it (make_template_goldens.py's environment and
fixed clock), over conversations that exercise what the template does:
developer instructions, tools, tool calls and results, the thinking field,
reasoning_effort, the final assistant turn and a raised error.

Writes tests/data/templates/gpt_oss.json, which
tests/text/chat_template_test.cpp replays with rill's Jinja.

    tools/make_harmony_goldens.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_template_goldens as mtg  # noqa: E402  (execs into .venv-tools with jinja2)

TEMPLATE = os.path.join(mtg.SHARED, "templates", "openai-gpt-oss-120b.jinja")

U = {"role": "user", "content": "What's the weather in Paris?"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]}
CALL_THINKING = {"role": "assistant", "thinking": "I should call the weather tool.", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 22}"}
ANSWER = {"role": "assistant", "content": "It is 22 °C in Paris."}


def conversations():
    return [
        ("single_user", {"messages": [mtg.U1], "add_generation_prompt": True}),
        ("developer_instructions", {"messages": [mtg.SYSTEM, mtg.U1, mtg.A1, mtg.U2], "add_generation_prompt": True}),
        ("reasoning_effort_high", {"messages": [mtg.U1], "add_generation_prompt": True, "reasoning_effort": "high"}),
        ("reasoning_effort_low", {"messages": [mtg.U1], "add_generation_prompt": True, "reasoning_effort": "low"}),
        ("model_identity", {"messages": [mtg.U1], "add_generation_prompt": True,
                            "model_identity": "You are Rill, a local model."}),
        ("tools_offered", {"messages": [U], "tools": [mtg.WEATHER_TOOL, mtg.TIME_TOOL], "add_generation_prompt": True}),
        ("tool_call_and_result", {"messages": [U, CALL, RESULT], "tools": [mtg.WEATHER_TOOL],
                                  "add_generation_prompt": True}),
        ("tool_call_thinking_kept", {"messages": [U, CALL_THINKING, RESULT], "tools": [mtg.WEATHER_TOOL],
                                     "add_generation_prompt": True}),
        ("tool_call_thinking_dropped", {"messages": [U, CALL_THINKING, RESULT, ANSWER, mtg.U2],
                                        "tools": [mtg.WEATHER_TOOL], "add_generation_prompt": True}),
        ("final_turn_with_thinking", {"messages": [mtg.U1, {"role": "assistant", "content": "Hi!",
                                                            "thinking": "Greet back."}],
                                      "add_generation_prompt": False}),
        ("builtin_tools", {"messages": [mtg.U1], "add_generation_prompt": True, "builtin_tools": ["browser", "python"]}),
        ("non_ascii", {"messages": [{"role": "user", "content": "Grüße! 日本語 😀 {{ not jinja }}"}],
                       "add_generation_prompt": True}),
        ("channel_tags_in_content", {"messages": [mtg.U1, {"role": "assistant",
                                                           "content": "<|channel|>final<|message|>x"}, mtg.U2],
                                     "add_generation_prompt": True}),
        ("tool_without_call", {"messages": [mtg.U1, RESULT], "add_generation_prompt": True}),
    ]


def main():
    with open(TEMPLATE, encoding="utf-8") as f:
        source = f.read()
    cases = []
    for name, conv in conversations():
        context = {"messages": conv["messages"], "tools": conv.get("tools"),
                   "add_generation_prompt": conv["add_generation_prompt"],
                   "bos_token": "<|startoftext|>", "eos_token": "<|return|>"}
        for key in ("reasoning_effort", "model_identity", "builtin_tools"):
            if key in conv:
                context[key] = conv[key]
        case = {"name": name, "context": context}
        case.update(mtg.render_case(source, context))
        cases.append(case)
    path = os.path.join(mtg.OUT_DIR, "gpt_oss.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"template": source, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(cases)} cases ({sum('error' in c for c in cases)} expected errors)")


if __name__ == "__main__":
    main()
