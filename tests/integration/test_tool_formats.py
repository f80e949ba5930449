"""Forced tool calls in each template's own call format, end to end: a
random-weight model over the real Qwen3 tokenizer (tests/integration/
test_thinking.py's) served with real templates from ../shared/templates
whose calls are written differently: Qwen3-Coder's XML form, Mistral Small
3.2's [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}, Ministral 3's
[TOOL_CALLS]name[ARGS]{...}, Nemo's [TOOL_CALLS][{...}], Qwen2.5's
Hermes <tool_call>, Command R+'s Action: ```json [...]``` and Granite 3.3's
<|tool_call|>[...]; the text the model wrote (its tokens, through
logprobs) must be in that format. Random weights never write a call by themselves, so a
call whose arguments the Python `jsonschema` package validates is the
grammar's doing, and the call coming back as tool_calls (streamed: the name
first, the argument pieces adding up) is the output parser reading the
format the grammar wrote."""
import json
import os

import jsonschema
import openai
import pytest

from conftest import API_KEY, Server
from test_thinking import TEMPLATES, TOKENIZER, make_model

# (descriptions on every parameter: Command R+'s template prints them)
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12, "description": "City"},
    "unit": {"type": "string", "enum": ["c", "f"], "description": "Unit"},
    "days": {"type": "integer", "minimum": 1, "maximum": 7, "description": "Days"}}, "required": ["city", "unit"],
    "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": {
             "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"], "description": "Zone"}},
             "required": ["zone"], "additionalProperties": False}}}]
# Granite 3.3's template mentions <think>, so the reply may open a thinking
# block first (GenerationRequest::thinking); the random model would, forever.
NO_THINK = {"151667": -100}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
# template: how the model's text must begin (the tokens logprobs reports)
TEMPLATE_FORMATS = {"Qwen3-Coder.jinja": "<tool_call>\n<function=get_weather>\n<parameter=city>\n",
                    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "[TOOL_CALLS]get_weather[CALL_ID]",
                    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "[TOOL_CALLS]get_weather[ARGS]{",
                    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "[TOOL_CALLS][{\"name\": \"get_weather\", ",
                    "Qwen-Qwen2.5-7B-Instruct.jinja": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {",
                    "CohereForAI-c4ai-command-r-plus-tool_use.jinja":
                        "Action:\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": {",
                    "ibm-granite-granite-3.3-2B-Instruct.jinja":
                        "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {"}


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json.gz")):
        pytest.skip("../shared/tokenizers/qwen3 not found")
    root = tmp_path_factory.mktemp("toolformats")
    return str(root), make_model(str(root / "base"), "Qwen3-Coder.jinja")


def model_with_template(base, template):
    root, model = base
    path = os.path.join(root, template.replace(".jinja", ""))
    os.makedirs(path, exist_ok=True)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        if not os.path.exists(os.path.join(path, name)):
            os.symlink(os.path.join(model, name), os.path.join(path, name))
    with open(os.path.join(model, "tokenizer_config.json")) as f:
        config = json.load(f)
    with open(os.path.join(TEMPLATES, template)) as f:
        config["chat_template"] = f.read()
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return path


def check_call(name, arguments):
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("template", TEMPLATE_FORMATS)
def test_forced_calls_in_the_templates_own_format(base_model, template):
    server = Server("--api-key", API_KEY, "--ctx-size", "2048", "--kv-cache-mb", "64", "--temperature", "0",
                    model=model_with_template(base_model, template))
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        # one call of a named function; the text the model wrote, from its tokens
        r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=300,
                                           parallel_tool_calls=False, logprobs=True, logit_bias=NO_THINK,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
        choice = r.choices[0]
        text = "".join(t.token for t in choice.logprobs.content)
        assert text.startswith(TEMPLATE_FORMATS[template]), text
        assert choice.finish_reason == "tool_calls", choice
        assert len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0]
        check_call(call.function.name, call.function.arguments)
        assert not choice.message.content
        # required, streamed: the name first, then argument pieces
        stream = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                max_tokens=300, parallel_tool_calls=False, tool_choice="required",
                                                logit_bias=NO_THINK)
        name, pieces, finish = None, [], None
        for chunk in stream:
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            for d in c.delta.tool_calls or []:
                if d.function.name:
                    assert name is None and not pieces
                    name = d.function.name
                if d.function.arguments:
                    pieces.append(d.function.arguments)
            finish = c.finish_reason or finish
        assert name in SCHEMAS and finish == "tool_calls"
        check_call(name, "".join(pieces))
    finally:
        server.stop()
