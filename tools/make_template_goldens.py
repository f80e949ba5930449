#!/usr/bin/env python3
"""Chat-template goldens for tests/text/chat_template_test.cpp and
tests/text/jinja_snippets_test.cpp, rendered by Python jinja2 exactly as
Hugging Face transformers configures it (utils/chat_template_utils.py):

    ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                  extensions=[loopcontrols])
    filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=indent,
                                   separators=separators, sort_keys=sort_keys)
    globals["raise_exception"] raises TemplateError(message)
    globals["strftime_now"](fmt) = datetime.now().strftime(fmt)
    extension AssistantTracker: {% generation %}...{% endgeneration %}

strftime_now is pinned to FIXED_NOW (2024-07-26 09:30:00) so the goldens are
deterministic; the C++ test passes the same time via
ChatTemplateRenderOptions::fixed_now.

Writes tests/data/templates/<name>.json = {template, cases: [{name, context,
expected | error}]} for SmolLM2 (GGUF metadata), Llama-3, Qwen3, Gemma-3
(/work/shared/tokenizers/*/tokenizer_config.json) and Llama-3.2-Vision
(tests/data/templates/llama3_2_vision.jinja: tools, tojson(indent=4),
strftime_now), and tests/data/templates/jinja_snippets.json (one small
template per interpreter feature).

    tools/make_template_goldens.py
"""
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), "jinja2", "gguf"])
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

import jinja2  # noqa: E402
import jinja2.ext  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

OUT_DIR = os.path.join(ROOT, "tests", "data", "templates")
SHARED = os.environ.get("RILL_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 30, 0)


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    class AssistantTracker(jinja2.ext.Extension):
        # transformers' {% generation %} tag with tracking off: the body is a
        # call block whose output is returned unchanged.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_generation_support")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _generation_support(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render_case(template_src, context):
    """{expected: text} or {error: "Type: message"}; syntax errors included."""
    try:
        return {"expected": ENV.from_string(template_src).render(**context)}
    except Exception as e:  # noqa: BLE001 - every failure is a golden
        return {"error": f"{type(e).__name__}: {e}"}


# ---- templates and their special tokens ----

def smollm2_template():
    from gguf import GGUFReader
    reader = GGUFReader(MODEL)

    def string_field(key):
        f = reader.fields[key]
        return bytes(f.parts[f.data[0]]).decode("utf-8")

    def token(key):
        f = reader.fields[key]
        tokens = reader.fields["tokenizer.ggml.tokens"]
        tid = int(f.parts[f.data[0]][0])
        return bytes(tokens.parts[tokens.data[tid]]).decode("utf-8")

    specials = {"bos_token": token("tokenizer.ggml.bos_token_id"),
                "eos_token": token("tokenizer.ggml.eos_token_id"),
                "unk_token": token("tokenizer.ggml.unknown_token_id"),
                "pad_token": token("tokenizer.ggml.padding_token_id")}
    return string_field("tokenizer.chat_template"), specials


def hf_template(name):
    with open(os.path.join(SHARED, "tokenizers", name, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    # transformers passes special_tokens_map (unset tokens are left out).
    specials = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            specials[key] = value
    if config.get("additional_special_tokens"):
        specials["additional_special_tokens"] = config["additional_special_tokens"]
    return config["chat_template"], specials


# ---- conversations ----

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "default": 1},
            },
            "required": ["location"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a <timezone> & \"quoted\" 'name'.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": []}}}

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
U1 = {"role": "user", "content": "Hello! What can you do?"}
A1 = {"role": "assistant", "content": "I can answer questions and help with tasks."}
U2 = {"role": "user", "content": "Tell me a joke about compilers."}
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_1", "type": "function",
    "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
               "content": "{\"temperature\": 22, \"condition\": \"sunny\"}"}
A_AFTER_TOOL = {"role": "assistant", "content": "It is 22 °C and sunny in Paris."}


def conversations():
    weather_q = {"role": "user", "content": "What's the weather in Paris?"}
    return [
        ("single_user", {"messages": [U1], "add_generation_prompt": True}),
        ("system_multi_turn", {"messages": [SYSTEM, U1, A1, U2], "add_generation_prompt": True}),
        ("no_generation_prompt", {"messages": [SYSTEM, U1, A1, U2], "add_generation_prompt": False}),
        ("ends_with_assistant", {"messages": [U1, A1], "add_generation_prompt": False}),
        ("whitespace_content", {"messages": [
            {"role": "user", "content": "  \n  padded question \n\n"},
            {"role": "assistant", "content": "\n\nanswer with newlines\n"},
            {"role": "user", "content": "\tnext\t"}], "add_generation_prompt": True}),
        ("non_ascii", {"messages": [
            {"role": "user", "content": "Grüße! 日本語で答えて 😀 — ok? \u00e9\u0301 \u2028x"},
            {"role": "assistant", "content": "はい、わかりました。Ça va 👍"},
            {"role": "user", "content": "Ünïcödé \\ \"quotes\" 'single' {{ not jinja }}"}],
            "add_generation_prompt": True}),
        ("tools_call_and_result", {"messages": [weather_q, TOOL_CALL, TOOL_RESULT, A_AFTER_TOOL],
                                   "tools": [WEATHER_TOOL, TIME_TOOL], "add_generation_prompt": True}),
        ("tools_system_pending_result", {"messages": [SYSTEM, weather_q, TOOL_CALL, TOOL_RESULT],
                                         "tools": [WEATHER_TOOL], "add_generation_prompt": True}),
        ("tools_string_arguments", {"messages": [weather_q, {
            "role": "assistant", "content": "Let me check.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather",
                                                  "arguments": "{\"location\": \"Paris\"}"}},
                {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "CET"}}}]},
            TOOL_RESULT, {"role": "tool", "content": "09:30"}],
            "tools": [WEATHER_TOOL, TIME_TOOL], "add_generation_prompt": True}),
        ("list_content", {"messages": [
            {"role": "system", "content": [{"type": "text", "text": "System as blocks."}]},
            {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": " this."}]}],
            "add_generation_prompt": True}),
        ("thinking_disabled", {"messages": [U1], "add_generation_prompt": True, "enable_thinking": False}),
        ("thinking_enabled", {"messages": [U1], "add_generation_prompt": True, "enable_thinking": True}),
        ("reasoning_history", {"messages": [
            U1, {"role": "assistant", "content": "Sure.", "reasoning_content": "The user greets me.\n"},
            U2, {"role": "assistant", "content": "<think>\nJoke time.\n</think>\n\nWhy did the compiler quit? Too many errors.",
                 "reasoning_content": None},
            {"role": "user", "content": "Another one"},
            {"role": "assistant", "content": "Final answer.", "reasoning_content": "\nthink more\n"}],
            "add_generation_prompt": False}),
        ("inline_think_history", {"messages": [
            U1, {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nvisible"}, U2],
            "add_generation_prompt": True, "enable_thinking": False}),
        ("roles_not_alternating", {"messages": [U1, U2], "add_generation_prompt": True}),
        ("two_tool_calls", {"messages": [weather_q, {"role": "assistant", "content": None, "tool_calls": [
            TOOL_CALL["tool_calls"][0], TOOL_CALL["tool_calls"][0]]}], "tools": [WEATHER_TOOL],
            "add_generation_prompt": False}),
        ("empty_messages", {"messages": [], "add_generation_prompt": True}),
    ]


# Gemma 4's own formats: a rich tool schema (enum, nested object, array
# items, nullable), reasoning before a tool call, legacy tool_responses,
# tool results as content parts, the developer role, media parts.
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the catalogue.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "Words to find"},
        "filters": {"type": "object", "description": "Narrowing", "properties": {
            "color": {"type": "string", "enum": ["red", "blue"]},
            "max_price": {"type": "number", "nullable": True}}, "required": ["color"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "exact": {"type": "boolean"}},
        "required": ["query"]}}}


def gemma4_conversations():
    q = {"role": "user", "content": "Find red shoes under 50."}
    call = {"role": "assistant", "content": "", "reasoning_content": "Use the search tool.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "search", "arguments": {"query": "shoes", "filters": {"color": "red", "max_price": 50},
                                                "tags": ["sale", "new"], "exact": False}}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "2 results"}]}
    return [
        ("gemma4_rich_tools_reasoning_call", {"messages": [q, call, result], "tools": [SEARCH_TOOL, WEATHER_TOOL],
                                              "add_generation_prompt": True}),
        ("gemma4_pending_call", {"messages": [q, call], "tools": [SEARCH_TOOL], "add_generation_prompt": True}),
        ("gemma4_tool_responses", {"messages": [q, {"role": "assistant", "content": "Done.", "tool_responses": [
            {"name": "search", "response": {"count": 2, "items": ["a", "b"]}}]}], "add_generation_prompt": True}),
        ("gemma4_developer_media", {"messages": [{"role": "developer", "content": "Be brief."}, {
            "role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}],
            "add_generation_prompt": True, "enable_thinking": True}),
        ("gemma4_thinking_in_content", {"messages": [U1, {
            "role": "assistant", "content": "<|channel>thought\nhidden<channel|>Visible answer."}, U2],
            "add_generation_prompt": True}),
    ]


def template_goldens(name, source, specials, extra=()):
    cases = []
    for case_name, conv in list(conversations()) + list(extra):
        # As transformers' apply_chat_template: tools is always passed (None
        # when absent), special tokens come from the tokenizer.
        context = {"messages": conv["messages"], "tools": conv.get("tools"),
                   "add_generation_prompt": conv["add_generation_prompt"], **specials}
        for key in ("enable_thinking",):
            if key in conv:
                context[key] = conv[key]
        case = {"name": case_name, "context": context}
        case.update(render_case(source, context))
        cases.append(case)
    path = os.path.join(OUT_DIR, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"template": source, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"{path}: {len(cases)} cases ({n_err} expected errors)")


# ---- interpreter feature snippets ----

SNIPPET_CONTEXT = {
    "xs": [1, 2, 3], "ys": [3, 1, 2], "empty": [], "d": {"a": 1, "b": [1, 2], "c": None},
    "s": "héllo wörld", "n": None, "t": True, "f": 1.5, "i": 7, "neg": -7,
    "words": "  The quick  brown\tfox-jumps (over) the_lazy dog  ",
    "msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
             {"role": "system", "content": "sys"}, {"role": "user", "content": "again"}],
    "people": [{"name": "bob", "age": 30, "tags": ["a"]}, {"name": "Alice", "age": 25},
               {"name": "carl", "age": 30, "tags": []}],
    "nested": {"k": {"v": [10, {"deep": "x"}]}}, "uni": "Ωmega ßtraße ǅ",
}

SNIPPETS = [
    # output, literals, printing of Python values
    "plain text only", "{{ 'a' }}{{ \"b\" }}{{ 'c' 'd' }}", "{{ 42 }} {{ -3 }} {{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }}",
    "{{ 1.0 }} {{ 0.5 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123 }} {{ 0.1 + 0.2 }} {{ 2.5e-3 }} {{ 1E3 }}",
    "{{ 1/3 }} {{ 10/4 }} {{ 4/2 }} {{ -0.0 }} {{ 1e300*1e300 }} {{ 3.0e20 }} {{ 0.0001 }}",
    "{{ true }} {{ false }} {{ True }} {{ none }} {{ None }} {{ n }}",
    "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}", "{{ (1,) }} {{ (1, 2) }} {{ () }}",
    "{{ {'a': 1, 'b': 'x', 1: 2} }}", "{{ d }} {{ xs }} {{ msgs[0] }}",
    "{{ ['it\\'s', \"say \\\"hi\\\"\", 'both \\' \"', 'tab\\tnl\\n', 'back\\\\slash', 'ü€😀', '\\x00\\x7f\\u200b\\u00ad'] }}",
    "{{ 'esc: \\n|\\t|\\\\|\\'|\\x41|\\u00e9|\\U0001F600|\\q|\\101' }}",
    "{{ undefined_var }}|{{ undefined_var is defined }}|{{ d.missing }}|{{ xs[10] }}|{{ n.x }}",
    # whitespace control, trim_blocks, lstrip_blocks
    "a\n  {% if true %}\n  b\n  {% endif %}\n  c\n", "a  {%- if true -%}  b  {%- endif -%}  c",
    "x\n    {%+ if true %}y{% endif %}\n", "{% if true +%}\nkeep\n{% endif %}",
    "line1\n  {# comment #}\nline2\n  {#- c2 -#}  \nline3", "  {{ 'v' }}  \n  {{- 'w' -}}  \n",
    "{% for x in xs %}\n  - {{ x }}\n{% endfor %}\n", "{%- for x in xs -%}\n{{ x }},\n{%- endfor %}",
    "a\n{% raw %}{{ not evaluated }} {% if %}{% endraw %}\nb", "  {% raw %} x {% endraw %}  \n  {%- raw -%}  y  {%- endraw -%}  z",
    "\t\t{% if true %}tabbed{% endif %}\n", "a {% if true %} b {% endif %} c", "x\n{%- if true %}y{% endif %}",
    "{% if true %}  \nnot trimmed\n{% endif %}", "  {#- lead #} x\n  {#+ keep #}\ny", "{{ '\u3000x\u00a0' | trim }}|{{ '\u2003y'.strip() }}|",
    "{% for i in range(2) %}\n    {% for j in range(2) %}\n        {{ i }}{{ j }}\n    {% endfor %}\n{% endfor %}", "trailing newline\n", "crlf\r\nlines\r\n{% if true %}\r\nx\r\n{% endif %}\r\n",
    # control flow
    "{% if n %}A{% elif t %}B{% else %}C{% endif %}", "{% if empty %}A{% elif 0 %}B{% else %}C{% endif %}",
    "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }};{% endfor %}",
    "{% for x in xs %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
    "{% for x in empty %}x{% else %}empty!{% endfor %}", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{% for k in d %}{{ k }}{% endfor %}",
    "{% for a, b in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}", "{% for c in 'héy' %}{{ c }}.{% endfor %}",
    "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in xs %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for row in [[1, 2], [3]] %}{% for v in row %}{{ loop.index }}{{ v }}{% endfor %}|{% endfor %}",
    "{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
    "{% for x in [1, 1, 2] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}",
    "{% for item in [{'c': [{'c': []}]}, {'c': []}] recursive %}<{{ loop.depth }}{{ loop(item.c) }}>{% endfor %}",
    # scoping, set, namespace
    "{% set count = 0 %}{% for i in xs %}{% set count = count + 1 %}{{ count }}{% endfor %}{{ count }}",
    "{% set ns = namespace(total=0, items=[]) %}{% for i in xs %}{% set ns.total = ns.total + i %}{% endfor %}{{ ns.total }} {{ ns }}",
    "{% set y = 5 %}{% for i in xs %}{% if loop.first %}{% set y = 1 %}{% endif %}{{ y }},{% endfor %}{{ y }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, e = 'xy' %}{{ c }}{{ e }}",
    "{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]", "{% set up | upper %}shout{% endset %}{{ up }}",
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}",
    "{% set ns = namespace() %}{% set ns.x = 'set' %}{{ ns.x }}{{ ns.missing }}",
    "{% set x = 3 %}{% set x.attr = 1 %}",
    # macros and call
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', greeting='Hi') }} {{ greet(greeting='Yo', name='Cy') }}",
    "{% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4) }}|{{ m(1, c=5) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{% macro m() %}{{ y }}{% endmacro %}{% set y = 5 %}{{ m() }}",
    "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
    "{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body {{ i }}{% endcall %}",
    "{% macro each(items) %}{% for it in items %}{{ caller(it) }}{% endfor %}{% endmacro %}{% call(v) each(xs) %}[{{ v }}]{% endcall %}",
    "{% filter upper %}shout {{ s }}{% endfilter %}", "{% filter replace('a', 'o') | title %}banana split{% endfilter %}",
    "{% macro m() %}x{% endmacro %}{{ m }}|{{ m.name }}",
    # operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 0.5 }}",
    "{{ 7.5 // 2 }} {{ -7.5 // 2 }} {{ 7.5 % 2 }} {{ -7.5 % 2 }} {{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }}",
    "{{ true + 1 }} {{ true * 3 }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none ~ true }}",
    "{{ -i }} {{ +i }} {{ -f }} {{ not t }} {{ not n }} {{ -xs|length }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ 1 != 2 }}",
    "{{ 1 in xs }} {{ 5 not in xs }} {{ 'ell' in 'hello' }} {{ 'a' in d }} {{ 'z' in d }} {{ 1 in (1, 2) }}",
    "{{ n or 'default' }} {{ 0 and 1 }} {{ '' or 0 or [] }} {{ 'x' and 'y' }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if n else 'no' }} {{ 'a' if false }}|{{ ('a' if false) is defined }}",
    "{{ 'a' + 1 }}", "{{ none + 1 }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 'a' < 1 }}", "{{ undefined_var + 1 }}",
    "{{ undefined_var.attr }}", "{{ d.missing.deeper }}", "{{ xs[10].x }}",
    # subscripts and slices
    "{{ xs[0] }} {{ xs[-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[5:] }} {{ xs[-10:2] }}",
    "{{ s[0] }} {{ s[1] }} {{ s[-1] }} {{ s[::-1] }} {{ s[2:5] }} {{ s[100:] }}|",
    "{{ msgs[0]['role'] }} {{ msgs[0].role }} {{ nested.k.v[1].deep }} {{ nested['k']['v'][0] }} {{ xs.0 }}",
    "{{ d['a'] }} {{ d.a }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d['c'] }} {{ d.c is none }}",
    "{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }}",
    "{{ xs.append }}|{% if xs.append %}T{% else %}F{% endif %}", "{{ xs.append(4) }}", "{{ d.pop('a') }}",
    "{{ xs[1:2:0] }}", "{{ n[0] }}|{{ i.x }}",
    # string methods
    "{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a-b-c'.rsplit('-', 1) }} {{ '</think>x'.split('</think>')[-1] }}",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith('lo') }} {{ 'Hello'.startswith(('x', 'H')) }} {{ s.upper() }} {{ s.lower() }}",
    "{{ 'hello world'.title() }} {{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }} {{ 'a-b c'.replace('-', '+') }} {{ 'aaa'.replace('a', 'b', 2) }}",
    "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'banana'.count('a') }}",
    "{{ '{} and {}'.format('x', 1) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='N') }} {{ '{{x}}'.format() }}",
    "{{ ', '.join(['a', 'b']) }} {{ 'ab'.center(6, '*') }} {{ 'x'.ljust(3) }}| {{ 'x'.rjust(3) }} {{ 'a\\nb'.splitlines() }}",
    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'AB'.isupper() }} {{ 'ab'.islower() }} {{ 'pre_x'.removeprefix('pre_') }}",
    "{{ uni.upper() }} {{ uni.lower() }} {{ uni.title() }} {{ uni | length }}",
    # filters
    "{{ '  x  ' | trim }}|{{ 'xxyxx' | trim('x') }}|{{ s | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title }}|{{ 'hELLO wORLD' | capitalize }}",
    "{{ xs | length }} {{ s | length }} {{ d | length }} {{ '' | count }} {{ undefined_var | length }}",
    "{{ undefined_var | default('dflt') }} {{ n | default('dflt') }} {{ n | default('dflt', true) }} {{ '' | d('e', true) }} {{ 0 | d(5) }}",
    "{{ xs | join }} {{ xs | join(', ') }} {{ people | join('/', attribute='name') }} {{ [1, none, 'a'] | join('-') }}",
    "{{ xs | first }} {{ xs | last }} {{ s | first }} {{ empty | first }}|{{ d | first }}",
    "{{ s | list }} {{ d | list }} {{ 'abc' | list | length }}", "{{ 3 | string }}{{ none | string }}{{ [1] | string }}",
    "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.99 | int }} {{ '0x1A' | int(0, 16) }} {{ ' 12 ' | int }} {{ true | int }} {{ none | int }}",
    "{{ '3.5' | float }} {{ 'x' | float }} {{ 2 | float }} {{ '1e3' | float }} {{ 'nan' | float }}",
    "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 7 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(1, 'floor') }} {{ -2.5 | round }}",
    "{{ -3 | abs }} {{ -2.5 | abs }} {{ ys | sort }} {{ ys | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}",
    "{{ people | sort(attribute='age') | map(attribute='name') | list }} {{ people | sort(attribute='name') | map(attribute='name') | join(',') }}",
    "{{ xs | map('string') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ people | map(attribute='tags') | list }} {{ people | map(attribute='tags', default='-') | list }}",
    "{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ msgs | rejectattr('role', '==', 'user') | list | length }}",
    "{{ people | selectattr('tags') | map(attribute='name') | list }} {{ people | selectattr('tags', 'defined') | list | length }}",
    "{{ xs | select('odd') | list }} {{ xs | reject('odd') | list }} {{ [0, 1, '', 'a', none] | select | list }} {{ xs | select('greaterthan', 1) | list }}",
    "{% if empty | select('odd') %}generator is truthy{% endif %}", "{{ xs | select('odd') | length }}",
    # generators are lazy and single-pass, as in Python
    "{% set g = msgs | selectattr('role', 'eq', 'user') %}{{ g | list | length }} {{ g | list | length }}",
    "{% set g = xs | map('string') %}{{ g | first }} {{ g | list }} {{ '3' in (xs | map('string')) }}",
    "{% set g = xs | select('odd') %}{{ 1 in g }} {{ g | list }}", "{{ 0 | map('upper') | list }} {{ none | select | list }}",
    "{% set g = 3 | unique %}{{ not g }}|{{ g is iterable }}", "{% set g = 3 | unique %}{{ g | list }}",
    "{{ xs | map('nonexistent_filter') | first is defined }}", "{% for x in msgs | map(attribute='role') %}{{ loop.index }}{{ x }}{{ loop.length }} {% endfor %}",
    "{{ 1.5 is odd }} {{ 1.5 is even }} {{ 3 is odd }} {{ -3 is odd }} {{ 4.0 is even }}",
    "{{ 5 | indent }}", "{{ empty | truncate(8) }} {{ xs | truncate(3) }}", "{{ ['b', 'a'] | truncate(1, leeway=0) }}",
    "{{ people | sort(attribute='age,name') | map(attribute='name') | list }} {{ 'A,b' | sort(attribute='age') }}",
    "{{ [1, 2, 1, 3] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ people | unique(attribute='age') | map(attribute='name') | list }}",
    "{{ xs | max }} {{ xs | min }} {{ ['b', 'A'] | max }} {{ people | max(attribute='age') }} {{ empty | max }}|",
    "{{ xs | sum }} {{ people | sum(attribute='age') }} {{ [0.5, 1] | sum(start=10) }}",
    "{{ xs | reverse | list }} {{ s | reverse }} {{ d | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(by='value') }}",
    "{{ 'a-b' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 5 | replace('5', 'five') }}",
    "{{ 'l1\\nl2\\n\\nl3' | indent }}|{{ 'l1\\nl2' | indent(2, true) }}|{{ 'l1\\n\\nl2' | indent('> ', blank=true) }}",
    "{{ 'a <b> & \"c\" \\'d\\'' | escape }} {{ 'x' | safe }} {{ 'x' | e }}",
    "{{ d | items | list }} {{ xs | batch(2) | list }} {{ xs | batch(2, 0) | list }} {{ 'one two  three' | wordcount }} {{ words | wordcount }}",
    "{{ 'hello world foo bar' | truncate(9) }} {{ 'hello world foo bar' | truncate(9, true) }} {{ 'short' | truncate(10) }} {{ 'x' | center(5) }}|",
    "{{ '%s=%d' | format('a', 3) }} {{ '%05.2f|%-4s|%x' | format(3.14159, 'ab', 255) }} {{ '%(k)s' | format(k='v') }} {{ 'n=%s' % 5 }} {{ '%s-%s' % (1, 2) }}",
    "{{ d | attr('a') }}|{{ msgs | map(attribute='role') | unique | join(',') }}",
    "{% set outer = namespace(i=0) %}{% for i in range(2) %}{% set o = loop %}{% for j in range(2) %}{{ o.index }}{{ loop.index }} {% endfor %}{% endfor %}",
    "{{ msgs | selectattr('role', 'eq', 'user') | list | last }} {{ d.values() | list | length }} {{ d.items() | sort | first }}",
    "{{ '%-6s|%6s|' % ('é', 'ü') }} {{ 'é' > 'z' }} {{ 'B' < 'a' }} {{ [1, 'a'] == [1, 'a'] }} {{ (1, 2) == [1, 2] }}",
    "{{ xs | batch(2) | list | tojson }} {{ {'ké': 'vé'} | tojson }} {{ '\u2028\x7f\x1f' | tojson }}",
    "{% set x -%}\n  trimmed block\n{%- endset %}[{{ x }}]", "{{ 'a' ~ xs ~ d.c }}", "{{ xs | string | length }}",
    "{{ '{:>5}|{:<4}|{:^5}|{:.2f}|{:d}|{!r}'.format('ab', 'c', 'x', 3.14159, 7, 'q') }}",
    "{{ 9007199254740993 }} {{ 2 ** 62 }} {{ -(2 ** 62) * 2 }} {{ 7 * -1 // 2 }}",
    "{{ 0.1 * 3 }} {{ 1e22 }} {{ 1e21 + 1 }} {{ 100.0 }} {{ 1.5e-10 }} {{ 123456789012345680.0 }} {{ 2.0 ** 70 }}",
    # tojson (transformers' override: no HTML escaping, ensure_ascii=False)
    "{{ d | tojson }} {{ 'é<>&\\'\"\\n' | tojson }} {{ [1, 1.5, true, none, 'x'] | tojson }}",
    "{{ msgs[0] | tojson(indent=2) }}", "{{ {'b': 1, 'a': [1, {}], 'c': []} | tojson(sort_keys=true) }}",
    "{{ {'a': [1, 2]} | tojson(separators=(',', ':')) }} {{ 'é😀' | tojson(ensure_ascii=true) }} {{ {'a': 1} | tojson(indent='\\t') }}",
    "{{ (1, 2) | tojson }} {{ {1: 'int key', none: 0, 1.5: 1, true: 2} | tojson }}", "{{ undefined_var | tojson }}",
    "{{ 1e16 | tojson }} {{ 0.1 | tojson }} {{ -0.0 | tojson }} {{ 1e-7 | tojson }}",
    # tests
    "{{ n is none }} {{ d is mapping }} {{ xs is iterable }} {{ s is string }} {{ i is number }} {{ f is float }} {{ i is integer }} {{ t is boolean }}",
    "{{ t is true }} {{ t is false }} {{ 1 is true }} {{ xs is sequence }} {{ d is sequence }} {{ s is iterable }} {{ i is iterable }} {{ undefined_var is iterable }}",
    "{{ i is divisibleby 7 }} {{ i is divisibleby(2) }} {{ i is odd }} {{ i is even }} {{ 2 is in xs }} {{ 'x' is in 'xyz' }}",
    "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 2 is gt 1 }} {{ 2 is lt 1 }} {{ 'ABC' is upper }} {{ 'abc' is lower }} {{ n is not none }} {{ undefined_var is not defined }}",
    "{{ true is number }} {{ true is integer }} {{ n is sameas none }} {{ d.upper is callable }} {{ 'tojson' is filter }} {{ 'odd' is test }} {{ undefined_var is undefined }}",
    "{{ msgs[0].content is string and msgs[0].content.startswith('h') }} {{ not msgs[5] is defined }}",
    # globals
    "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }}",
    "{% for i in range(3) %}{{ i }}{% endfor %}", "{{ dict(a=1, b='x') }} {{ namespace(a=1) }} {{ namespace({'k': 'v'}).k }}",
    "{% set j = joiner('|') %}{% for x in xs %}{{ j() }}{{ x }}{% endfor %}", "{{ range(1000000) | length }}",
    "{{ raise_exception('custom failure: ' ~ i) }}", "{{ strftime_now('%Y-%m-%d %H:%M %a %b %d') }}",
    # transformers' {% generation %} tag: a scope whose output passes through
    "{% set v = 1 %}{% generation %}x{{ v }}{% set v = 2 %}{{ v }}{% endgeneration %}{{ v }}",
    # syntax errors
    "{% if %}", "{% for x in xs %}no end", "{{ 1 + }}", "{% endif %}", "{{ 'unterminated }}", "{% unknowntag %}",
    "{% break %}", "{{ x | }}", "{# unclosed comment", "{{ (1, 2 }}", "{% set 1 = 2 %}", "{{ a.1.b }}",
    "{% macro m(a=1, b) %}{% endmacro %}", "{{ 1 is is defined }}",
]


def snippet_goldens():
    cases = []
    for src in SNIPPETS:
        case = {"template": src}
        case.update(render_case(src, SNIPPET_CONTEXT))
        cases.append(case)
    path = os.path.join(OUT_DIR, "jinja_snippets.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"context": SNIPPET_CONTEXT, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(cases)} snippets ({sum('error' in c for c in cases)} expected errors)")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    src, specials = smollm2_template()
    template_goldens("smollm2", src, specials)
    for name in ("llama3", "qwen3", "gemma3"):
        src, specials = hf_template(name)
        template_goldens(name, src, specials)
    with open(os.path.join(OUT_DIR, "llama3_2_vision.jinja"), encoding="utf-8") as f:
        src = f.read()
    template_goldens("llama3_2_vision", src, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    gemma4_goldens()
    snippet_goldens()


def gemma4_goldens():
    with open(os.path.join(SHARED, "templates", "google-gemma-4-31B-it.jinja"), encoding="utf-8") as f:
        src = f.read()
    template_goldens("gemma4", src, {"bos_token": "<bos>", "eos_token": "<eos>"}, gemma4_conversations())
    with open(os.path.join(SHARED, "templates", "google-gemma-4-31B-it-interleaved.jinja"), encoding="utf-8") as f:
        src = f.read()
    template_goldens("gemma4_interleaved", src, {"bos_token": "<bos>", "eos_token": "<eos>"}, gemma4_conversations())


if __name__ == "__main__":
    main()
