#!/usr/bin/env python3
"""Goldens for tests/server/template_corpus_test.cpp: every chat template in
../shared/templates (57 vendors' templates) rendered by jinja2 configured as
transformers does (tools/make_template_goldens.py: make_env) over tool
conversations, and the text each template writes for an assistant turn that
calls one tool, and two (what the model writes: the render of [user, assistant(tool_calls)] minus
the generation prompt of [user], end-of-turn markers stripped).

Cases per template (bos_token "<s>", eos_token "</s>", strftime_now pinned):
  plain        system, user, assistant, user; generation prompt
  tools        system, user with tools; generation prompt
  no_tools     the same without tools (tells whether the template renders them)
  tool_result  user, assistant calling one tool, its result; generation prompt
  two_results  user, assistant calling two tools, both results, an answer, user

Writes tests/data/templates/corpus.json = [{template, cases: [{name, context,
expected | error}], call_texts: [one call, two calls]}], each call text
{text, starts_in_reasoning} or null (the template cannot write that turn).

    tools/make_template_corpus_goldens.py
"""
import copy
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

OUT = os.path.join(ROOT, "tests", "data", "templates", "corpus.json")
BOS, EOS = "<s>", "</s>"
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}, "filters": {"type": "object"}}}}},
]
CALLS = [
    {"id": "abc0def0g", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": {"city": "Paris", "days": 3}}},
    {"id": "abc1def1g", "type": "function", "function": {"name": "search", "arguments": {
        "query": "caf\u00e9 \"quoted\"", "filters": {"n": [1, 2.5, True, None]}}}},
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Weather in Paris, and search for cafes?"}
# End-of-turn markers the call text ends with (whatever the template closes the turn with).
END_MARKERS = ["</s>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "<|return|>", "<|call|>", "<turn|>", "<|END_OF_TURN_TOKEN|>", "<sep>",
               "<｜end▁of▁sentence｜>"]
# End-of-turn tokens after which a template writes the next turn's opening (Command R7B): cut there.
CUT_AT = ["<|END_OF_TURN_TOKEN|>"]


def assistant(n_calls, content=""):
    return {"role": "assistant", "content": content, "tool_calls": copy.deepcopy(CALLS[:n_calls])}


def result(i, text):
    return {"role": "tool", "tool_call_id": CALLS[i]["id"], "name": CALLS[i]["function"]["name"], "content": text}


def contexts():
    base = {"bos_token": BOS, "eos_token": EOS}
    return [
        ("plain", dict(base, add_generation_prompt=True, messages=[
            SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"}])),
        ("tools", dict(base, add_generation_prompt=True, tools=TOOLS, messages=[SYSTEM, USER])),
        ("no_tools", dict(base, add_generation_prompt=True, messages=[SYSTEM, USER])),
        ("tool_result", dict(base, add_generation_prompt=True, tools=TOOLS, messages=[
            USER, assistant(1), result(0, "{\"temp_c\": 21}")])),
        ("two_results", dict(base, add_generation_prompt=True, tools=TOOLS, messages=[
            SYSTEM, USER, assistant(2), result(0, "sunny"), result(1, "3 cafes"),
            {"role": "assistant", "content": "Sunny; 3 cafes."}, {"role": "user", "content": "Thanks"}])),
    ]


def render(env, source, context):
    try:
        return {"expected": env.from_string(source).render(**copy.deepcopy(context))}
    except Exception as e:  # noqa: BLE001 - every failure is a golden
        return {"error": f"{type(e).__name__}: {e}"}


def ends_inside_think(text):
    return text.rfind("<think>") > text.rfind("</think>")


def call_text(env, source, n_calls):
    """{text, starts_in_reasoning}: what the template writes for an assistant
    turn with n_calls calls after a user turn, or None."""
    # Command R+ needs a description on every parameter (and an object's value
    # type): a second try has them.
    for tools in (TOOLS, described(TOOLS)):
        base = {"bos_token": BOS, "eos_token": EOS, "tools": tools}
        try:
            template = env.from_string(source)
            prompt = template.render(messages=[USER], add_generation_prompt=True, **base)
            history = template.render(messages=[USER], add_generation_prompt=False, **base)
            full = template.render(messages=[USER, assistant(n_calls)], add_generation_prompt=False, **base)
            break
        except Exception:  # noqa: BLE001 - a template that cannot render the turn has no call text
            if tools is not TOOLS:
                return None
    in_think = ends_inside_think(prompt)
    if full.startswith(prompt):
        text = full[len(prompt):]
    elif full.startswith(history):
        # The generation prompt opens a think block the history form does
        # not write: the turn without its opening, read outside reasoning.
        text = full[len(history):]
        opening = prompt[len(history):]
        header = opening[:opening.find("<think>")] if "<think>" in opening else opening
        if not text.startswith(header):
            return None
        text = text[len(header):]
        # The history form closes an empty think block the prompt opened (GLM 4.7).
        in_think = text.startswith("</think>")
    elif prompt.startswith(history) and trailer_split(history, full):
        # The template writes a trailer after the messages (Command R+'s
        # closing instruction): the turn is what full adds before it.
        head, tail = trailer_split(history, full)
        text = full[len(head):len(full) - len(tail)]
        opening = prompt[len(history):]
        if not text.startswith(opening):
            return None
        text = text[len(opening):]
    else:
        return None
    for m in CUT_AT:
        if m in text:
            text = text[:text.index(m)]
    changed = True
    while changed:
        changed = False
        text = text.rstrip()
        for m in END_MARKERS:
            if text.endswith(m):
                text = text[:-len(m)]
                changed = True
    return {"text": text, "starts_in_reasoning": in_think}


def described(tools):
    out = copy.deepcopy(tools)
    for t in out:
        for name, p in t["function"]["parameters"]["properties"].items():
            p["description"] = "The " + name
            if p["type"] == "object":
                p["additionalProperties"] = {"type": "string"}
    return out


def trailer_split(history, full):
    """(head, tail) with history == head + tail and full == head + turn + tail,
    tail the longest common suffix, or None."""
    n = 0
    while n < min(len(history), len(full)) and history[-1 - n] == full[-1 - n]:
        n += 1
    if n == 0 or n == len(history):
        return None
    head = history[:len(history) - n]
    return (head, history[len(head):]) if full.startswith(head) else None


def main():
    env = make_env()
    names = sorted(n for n in os.listdir(os.path.join(SHARED, "templates")) if n.endswith(".jinja"))
    goldens = []
    for name in names:
        with open(os.path.join(SHARED, "templates", name), encoding="utf-8") as f:
            source = f.read()
        cases = [dict({"name": case, "context": context}, **render(env, source, context))
                 for case, context in contexts()]
        texts = [call_text(env, source, 1), call_text(env, source, 2)]
        if texts[1] == texts[0]:
            texts[1] = None  # the template writes only the first call (gpt-oss: one per turn)
        goldens.append({"template": name, "cases": cases, "call_texts": texts})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(goldens, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_errors = sum("error" in c for g in goldens for c in g["cases"])
    print(f"{OUT}: {len(goldens)} templates, {len(goldens) * len(contexts())} renders ({n_errors} jinja2 errors)")


if __name__ == "__main__":
    main()
