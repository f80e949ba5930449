"""gpt-oss's harmony format through the server: the analysis channel as
reasoning (chat reasoning_content, Responses reasoning items), the final
channel as content, and commentary to=functions.NAME as tool calls on chat,
Responses and Anthropic, streamed and not, with forced calls (tool_choice
required / named / any) written with harmony's special tokens as single ids.

The model: random weights at a tiny width (the Qwen3 graph) over the real
Qwen3 tokenizer with harmony's special tokens added (<|start|>, <|channel|>,
<|message|>, <|constrain|>, <|end|>, <|return|>, <|call|>), served with the
real gpt-oss template from ../shared/templates, so the server picks the
harmony parser from the template. A random model writes no harmony by
itself: a grammar (the `grammar` extension naming the special tokens, or
the forced tool call) makes it, and what comes back is the parser's work.
A response_format (or regex, choice) constrains the final channel only: the
grammar lets the model write an analysis message of any text first, which
these tests end by making <|end|> likely (logit_bias), since the random
model would otherwise write analysis until max_tokens."""
import json
import os
import re

import anthropic
import jsonschema
import openai
import pytest

from conftest import API_KEY
from test_thinking import TEMPLATES, TOKENIZER, make_model, serve

HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>"]
FIRST_ID = 151700  # past Qwen3's tokens, inside its embedding rows
END_ID, RETURN_ID, CALL_ID = FIRST_ID + 4, FIRST_ID + 5, FIRST_ID + 6

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time",
                                           "parameters": {"type": "object", "properties": {},
                                                          "additionalProperties": False}}}]
# Both tools' arguments are bounded (closed objects): a forced call ends within
# max_tokens whichever tool the random model picks (an open object lets it write
# keys until the limit, as it did on one machine's kernels).
MSG = [{"role": "user", "content": "Weather in Paris?"}]  # (the template needs tool descriptions)
# Reasoning, then the answer, as gpt-oss writes them after <|start|>assistant.
ANSWER = ('root ::= <|channel|> "analysis" <|message|> "Let me think." <|end|> <|start|> "assistant" '
          '<|channel|> "final" <|message|> "Hello there!"')


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json.gz")):
        pytest.skip("../shared/tokenizers/qwen3 not found")
    root = make_model(str(tmp_path_factory.mktemp("harmony") / "m"), "openai-gpt-oss-120b.jinja")
    path = os.path.join(root, "tokenizer.json")
    with open(path) as f:
        tok = json.load(f)
    for i, text in enumerate(HARMONY_TOKENS):
        tok["added_tokens"].append({"id": FIRST_ID + i, "content": text, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    with open(path, "w") as f:
        json.dump(tok, f)
    with open(os.path.join(root, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [RETURN_ID, CALL_ID, 151643]}, f)
    server = serve(root)
    yield server
    server.stop()


def clients(server):
    return (anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=120),
            openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120))


def test_forced_calls_are_harmony_commentary_with_special_token_ids(harmony):
    _, oai = clients(harmony)
    r = oai.chat.completions.create(model="m", max_tokens=60, messages=MSG, tools=TOOLS, tool_choice="required",
                                    logprobs=True)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.content in (None, "")
    assert len(c.message.tool_calls) == 1  # harmony: one call per turn
    call = c.message.tool_calls[0]
    tokens = [t.token for t in c.logprobs.content]
    # The header's markers are one token each, not their spelling in pieces.
    assert tokens[0] == "<|channel|>", tokens
    assert "<|constrain|>" in tokens and "<|message|>" in tokens, tokens
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    else:
        assert call.function.name == "get_time"
        assert json.loads(call.function.arguments) == {}
    named = oai.chat.completions.create(
        model="m", max_tokens=60, messages=MSG, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    args = json.loads(named.choices[0].message.tool_calls[0].function.arguments)
    jsonschema.validate(args, WEATHER)


def test_streamed_forced_call_matches(harmony):
    _, oai = clients(harmony)
    name, pieces, finish = None, [], None
    for chunk in oai.chat.completions.create(
            model="m", max_tokens=60, messages=MSG, tools=TOOLS, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        for d in ch.delta.tool_calls or []:
            if d.function.name:
                name = d.function.name
            pieces.append(d.function.arguments or "")
        assert not ch.delta.content
        finish = ch.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls"
    jsonschema.validate(json.loads("".join(pieces)), WEATHER)


def test_analysis_is_reasoning_and_final_is_content(harmony):
    _, oai = clients(harmony)
    r = oai.chat.completions.create(model="m", max_tokens=60, messages=MSG, extra_body={"grammar": ANSWER})
    m = r.choices[0].message
    assert m.reasoning_content == "Let me think."
    assert m.content == "Hello there!"
    reasoning, content = "", ""
    for chunk in oai.chat.completions.create(model="m", max_tokens=60, messages=MSG, stream=True,
                                             extra_body={"grammar": ANSWER}):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert (reasoning, content) == ("Let me think.", "Hello there!")
    resp = oai.responses.create(model="m", input="Weather in Paris?", max_output_tokens=60,
                                extra_body={"grammar": ANSWER})
    kinds = [item.type for item in resp.output]
    assert kinds == ["reasoning", "message"], kinds
    assert resp.output_text == "Hello there!"


def test_tool_calls_on_responses_and_anthropic(harmony):
    claude, oai = clients(harmony)
    resp = oai.responses.create(
        model="m", input="Weather in Paris?", max_output_tokens=60, tool_choice="required",
        tools=[{"type": "function", "name": "get_weather", "description": "Weather", "parameters": WEATHER,
                "strict": True}])
    calls = [item for item in resp.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    msg = claude.messages.create(model="m", max_tokens=60, messages=MSG, tool_choice={"type": "any"},
                                 tools=[{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}])
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) == 1
    jsonschema.validate(uses[0].input, WEATHER)


def test_a_grammar_naming_a_token_the_model_lacks_is_a_400(harmony):
    _, oai = clients(harmony)
    # <think> is one of Qwen3's tokens but not a special one; <|nope|> is none.
    for name in ("<think>", "<|nope|>"):
        with pytest.raises(openai.BadRequestError) as e:
            oai.chat.completions.create(model="m", max_tokens=4, messages=MSG,
                                        extra_body={"grammar": f'root ::= {name} "x"'})
        assert e.value.body["param"] == "grammar" and name in e.value.body["message"]
    # Completions keep the named special tokens in their text.
    r = oai.completions.create(model="m", prompt="hi", max_tokens=8,
                               extra_body={"grammar": 'root ::= <|channel|> "final" <|message|> "ok"'})
    assert r.choices[0].text == "<|channel|>final<|message|>ok"


PERSON = {"type": "object", "properties": {"name": {"type": "string", "enum": ["Ada", "Alan"]},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def test_response_format_constrains_the_final_channel_not_the_analysis(harmony):
    _, oai = clients(harmony)
    reasonings = []
    for bias in (9, 10, 12):  # <|end|>: how soon the analysis ends
        r = oai.chat.completions.create(model="m", max_tokens=80, messages=MSG, temperature=0, logprobs=True,
                                        logit_bias={str(END_ID): bias}, response_format=PERSON_FORMAT)
        c = r.choices[0]
        tokens = [t.token for t in c.logprobs.content]
        assert c.finish_reason == "stop", tokens
        jsonschema.validate(json.loads(c.message.content), PERSON)
        # The reply is harmony: an analysis message, then the answer in the final channel
        # (the markers single tokens).
        text = "".join(tokens)
        analysis = text[len("<|channel|>analysis<|message|>"):text.index("<|end|>")]
        assert text == ("<|channel|>analysis<|message|>" + analysis +
                        "<|end|><|start|>assistant<|channel|>final<|message|>" + c.message.content), text
        assert [tokens.count(m) for m in ("<|channel|>", "<|message|>", "<|end|>", "<|start|>")] == [2, 2, 1, 1]
        reasonings.append(getattr(c.message, "reasoning_content", None) or "")
    # Free text in the analysis: what the random model writes, not JSON.
    free = [t for t in reasonings if t]
    assert free, reasonings
    for text in free:
        with pytest.raises(ValueError):
            json.loads(text)
    # Streamed: the same reasoning and answer.
    reasoning, content = "", ""
    for chunk in oai.chat.completions.create(model="m", max_tokens=80, messages=MSG, temperature=0, stream=True,
                                             logit_bias={str(END_ID): 9}, response_format=PERSON_FORMAT):
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert reasoning == reasonings[0]
    jsonschema.validate(json.loads(content), PERSON)


def test_choice_and_regex_apply_to_the_answer(harmony):
    _, oai = clients(harmony)
    bias = {str(END_ID): 9}
    r = oai.chat.completions.create(model="m", max_tokens=80, messages=MSG, temperature=0, logit_bias=bias,
                                    extra_body={"choice": ["sunny", "rainy"]})
    assert r.choices[0].message.content in ("sunny", "rainy")
    r = oai.chat.completions.create(model="m", max_tokens=80, messages=MSG, temperature=0, logit_bias=bias,
                                    extra_body={"regex": "[0-9]{3}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.choices[0].message.content), r.choices[0].message.content
