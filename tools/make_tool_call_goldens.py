#!/usr/bin/env python3
"""Tool-call goldens for tests/text/output_parser_test.cpp: what each
vendor's chat template (../shared/templates) writes for an assistant turn
that calls tools, rendered by jinja2 configured as transformers does
(tools/make_template_goldens.py: make_env). The turn's text is the render of
[user, assistant(tool_calls)] minus the render of [user], without the
assistant turn's opening and end markers: what the model writes.
The parser must read it back to the same calls.

Writes tests/data/tool_calls/goldens.json = [{template, text, calls: [{name,
arguments}]}], arguments as compact JSON text (nlohmann's dump of the
object, which json.dumps with these separators matches for these values).

    tools/make_tool_call_goldens.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), "jinja2"])
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

sys.path.insert(0, os.path.join(ROOT, "tools"))
from make_template_goldens import SHARED, make_env  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "tool_calls", "goldens.json")
# template: (bos, eos, the assistant turn's opening, its end)
TEMPLATES = {
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>", "", "</s>"),  # [TOOL_CALLS][{...}, ...]
    # [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>", "", "</s>"),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("<s>", "</s>", "", "</s>"),  # [TOOL_CALLS]name[ARGS]{...}
    "unsloth-mistral-Devstral-Small-2507.jinja": ("<s>", "</s>", "", "</s>"),
    # <tool_call>\n<function=name>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
    "Qwen3-Coder.jinja": ("", "<|im_end|>", "<|im_start|>assistant\n", "<|im_end|>\n"),
    "Qwen3.5-4B.jinja": ("", "<|im_end|>", "<|im_start|>assistant\n", "<|im_end|>\n"),
    # <|tool_call>call:name{key:value,...}<tool_call|>; the turn ends where the tool's response goes
    "google-gemma-4-31B-it.jinja": ("<bos>", "<eos>", "<|turn>model\n", "<|tool_response>"),
    # <tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call> (4.7: no newlines,
    # after the </think> that closes the prompt's <think>)
    "GLM-4.6.jinja": ("", "", "<|assistant|>", ""),
    "GLM-4.7-Flash.jinja": ("", "", "<|assistant|></think>", ""),
    # <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
    "deepseek-ai-DeepSeek-V3.1.jinja": ("", "", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
    # <｜DSML｜function_calls> <｜DSML｜invoke name=...> <｜DSML｜parameter name=... string=...>
    "deepseek-ai-DeepSeek-V3.2.jinja": ("", "", "<｜Assistant｜></think>", "<｜end▁of▁sentence｜>"),
    # <|tool_calls_section_begin|><|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{...}...
    "moonshotai-Kimi-K2.jinja": ("", "", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
    # <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}, ...]<|END_ACTION|>, then the next turn's opening
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": (
        "", "", "", "<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>"),
}
# Templates that write arguments with their keys sorted (dictsort).
SORTED_KEYS = {"google-gemma-4-31B-it.jinja"}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}},
]
CALLS = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("search", {"query": "caf\u00e9 \"quoted\" \u00fc\u00df \U0001F600", "filters": {"n": [1, 2.5, True, None]}}),
]


def turn_text(env, source, specials, n_calls):
    bos, eos, opening, end = specials
    user = {"role": "user", "content": "Weather in Paris, and search for cafes?"}
    calls = [{"id": f"abc{i}def{i}g", "type": "function", "function": {"name": name, "arguments": args}}
             for i, (name, args) in enumerate(CALLS[:n_calls])]
    assistant = {"role": "assistant", "content": "", "tool_calls": calls}
    template = env.from_string(source)
    context = dict(tools=TOOLS, add_generation_prompt=False, bos_token=bos, eos_token=eos)
    prefix = template.render(messages=[user], **context)
    full = template.render(messages=[user, assistant], **context)
    assert full.startswith(prefix), "the assistant turn does not extend the prompt"
    text = full[len(prefix):]
    assert text.startswith(opening) and text.endswith(end), text
    return text[len(opening):len(text) - len(end)]


def main():
    env = make_env()
    goldens = []
    for name, specials in TEMPLATES.items():
        with open(os.path.join(SHARED, "templates", name), encoding="utf-8") as f:
            source = f.read()
        for n_calls in (1, 2):
            goldens.append({
                "template": name,
                "text": turn_text(env, source, specials, n_calls),
                "calls": [{"name": n, "arguments": json.dumps(a, ensure_ascii=False, separators=(",", ":"),
                                                              sort_keys=name in SORTED_KEYS)}
                          for n, a in CALLS[:n_calls]],
            })
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(goldens, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{OUT}: {len(goldens)} tool-call turns")


if __name__ == "__main__":
    main()
