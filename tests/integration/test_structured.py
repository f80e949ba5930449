"""Structured outputs and forced tool calls with the official SDKs (and
openai-agents / LangChain) on the default model. SmolLM2-135M cannot write
schema-valid JSON by luck: everything asserted here is what the grammar
guarantees (valid JSON matching the schema, tool calls whose arguments
validate), never what the model chose to say. Strings have a maxLength:
left free, this model repeats a word until max_tokens, which the grammar
allows (and the SDK's parse() then refuses as a length finish)."""
import json
from enum import Enum
from typing import Annotated, List, Optional

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from conftest import API_KEY

MSG = [{"role": "user", "content": "Describe a person who likes the sea."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 16}}, "required": ["zone"], "additionalProperties": False}},
}


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str = Field(max_length=24)
    zip_code: Optional[str] = Field(max_length=8)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    favorite_color: Color
    tags: List[Annotated[str, Field(max_length=12)]] = Field(max_length=3)
    address: Address
    nickname: Optional[str] = Field(max_length=12)


class Node(BaseModel):
    label: str = Field(max_length=8)
    children: List["Node"] = Field(max_length=2)


def test_chat_parse_pydantic(openai_client):
    r = openai_client.chat.completions.parse(model="m", messages=MSG, response_format=Person, max_tokens=400,
                                             temperature=0)
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    p = c.message.parsed
    assert isinstance(p, Person) and isinstance(p.favorite_color, Color) and 0 <= p.age <= 120
    jsonschema.validate(json.loads(c.message.content), Person.model_json_schema())


def test_chat_parse_recursive_ref(openai_client):
    # The grammar allows any depth and this model, left alone, nests until
    # max_tokens; an example to copy gives it a reason to close the tree.
    example = '{"label": "root", "children": [{"label": "leaf", "children": []}]}'
    r = openai_client.chat.completions.parse(model="m", messages=[{"role": "user", "content": "Repeat exactly: " + example}],
                                             response_format=Node, max_tokens=300, temperature=0.7, seed=3)
    c = r.choices[0]
    assert c.finish_reason == "stop", c.message.content
    assert isinstance(c.message.parsed, Node)
    jsonschema.validate(json.loads(c.message.content), Node.model_json_schema())


def test_responses_parse(openai_client):
    r = openai_client.responses.parse(model="m", input="Describe a person.", text_format=Person,
                                      max_output_tokens=400, temperature=0)
    assert isinstance(r.output_parsed, Person)
    assert r.text.format.type == "json_schema"


def test_json_schema_streamed(openai_client):
    schema = Person.model_json_schema()
    stream = openai_client.chat.completions.create(
        model="m", messages=MSG, max_tokens=400, temperature=0.8, seed=5, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}})
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)


def test_json_object_grammar_regex_choice(openai_client):
    r = openai_client.chat.completions.create(model="m", messages=MSG, max_tokens=300, temperature=0,
                                              response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still a prefix of an object
        assert r.choices[0].message.content.startswith("{")
    g = openai_client.completions.create(model="m", prompt="Fruits:", max_tokens=40, temperature=0.9, seed=1,
                                         extra_body={"grammar": 'root ::= ("- " [a-z]{2,8} "\\n"){1,3}'})
    assert g.choices[0].finish_reason == "stop"
    lines = g.choices[0].text.split("\n")
    assert lines[-1] == "" and 1 <= len(lines) - 1 <= 3
    assert all(l.startswith("- ") and l[2:].isalpha() and l[2:].islower() for l in lines[:-1])
    x = openai_client.chat.completions.create(model="m", messages=MSG, max_tokens=20,
                                              extra_body={"regex": "[0-9]{3}-[0-9]{4}"})
    import re
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", x.choices[0].message.content)
    y = openai_client.chat.completions.create(model="m", messages=MSG, max_tokens=20, temperature=1.0,
                                              extra_body={"choice": ["sunny", "rainy", "cloudy"]})
    assert y.choices[0].message.content in ("sunny", "rainy", "cloudy")


@pytest.mark.parametrize("fmt,param", [
    ({"type": "json_object", "schema": 123}, "response_format.schema"),
    ({"type": "xml"}, "response_format.type"),
    ({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "number", "multipleOf": 5}}},
     "response_format.json_schema.schema"),
])
def test_response_format_errors(openai_client, fmt, param):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="m", messages=MSG, max_tokens=5, response_format=fmt)
    assert e.value.body["param"] == param
    if "multipleOf" in json.dumps(fmt):
        assert "multipleOf" in e.value.body["message"]


def check_call(name, arguments):
    tool = {"get_weather": WEATHER, "get_time": TIME}[name]
    jsonschema.validate(json.loads(arguments) if isinstance(arguments, str) else arguments,
                        tool["function"]["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_chat_tool_choice(openai_client, choice):
    for stream in (False, True):
        kwargs = dict(model="m", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, TIME],
                      tool_choice=choice, max_tokens=200, temperature=0, parallel_tool_calls=False)
        if not stream:
            c = openai_client.chat.completions.create(**kwargs).choices[0]
            assert c.finish_reason == "tool_calls"
            calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
        else:
            calls, finish = {}, None
            for chunk in openai_client.chat.completions.create(stream=True, **kwargs):
                for t in chunk.choices[0].delta.tool_calls or []:
                    entry = calls.setdefault(t.index, ["", ""])
                    entry[0] += t.function.name or ""
                    entry[1] += t.function.arguments or ""
                finish = chunk.choices[0].finish_reason or finish
            assert finish == "tool_calls"
            calls = list(calls.values())
        assert len(calls) == 1
        for name, args in calls:
            if isinstance(choice, dict):
                assert name == "get_time"
            check_call(name, args)


def test_responses_tool_choice_required(openai_client):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}]
    r = openai_client.responses.create(model="m", input="Weather in Paris?", tools=tools, tool_choice="required",
                                       max_output_tokens=200, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    check_call(calls[0].name, calls[0].arguments)


def test_anthropic_tool_choice_any(anthropic_client):
    tools = [{"name": f["function"]["name"], "input_schema": f["function"]["parameters"]} for f in (WEATHER, TIME)]
    # One call each (disable_parallel_tool_use): the grammar then ends after
    # the call, so stop_reason is tool_use whatever the model samples. With
    # parallel calls allowed, the grammar lets this model add calls until
    # max_tokens (test_anthropic_parallel_calls_validate).
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        choice = dict(choice, disable_parallel_tool_use=True)
        m = anthropic_client.messages.create(model="m", max_tokens=200, tools=tools, tool_choice=choice,
                                             messages=[{"role": "user", "content": "Weather in Paris?"}])
        assert m.stop_reason == "tool_use"
        uses = [b for b in m.content if b.type == "tool_use"]
        assert uses
        for u in uses:
            check_call(u.name, u.input)
        if choice["type"] == "tool":
            assert {u.name for u in uses} == {"get_weather"}
        assert len(uses) == 1
    with anthropic_client.messages.stream(model="m", max_tokens=200, tools=tools,
                                          tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                          messages=[{"role": "user", "content": "Time in Tokyo?"}]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1
    check_call(uses[0].name, uses[0].input)


def test_anthropic_parallel_calls_validate(anthropic_client):
    # Parallel calls allowed: however many calls the model writes before it
    # stops or runs out of tokens, every complete one validates, and a run
    # that ends by itself ends with a call (stop_reason tool_use).
    tools = [{"name": f["function"]["name"], "input_schema": f["function"]["parameters"]} for f in (WEATHER, TIME)]
    for prompt in ("Weather in Paris and Rome?", "Time in Tokyo?"):
        m = anthropic_client.messages.create(model="m", max_tokens=120, tools=tools, tool_choice={"type": "any"},
                                             messages=[{"role": "user", "content": prompt}],
                                             extra_body={"temperature": 0})
        assert m.stop_reason in ("tool_use", "max_tokens")
        uses = [b for b in m.content if b.type == "tool_use"]
        if m.stop_reason == "tool_use":
            assert uses
        for u in uses:
            check_call(u.name, u.input)


def test_tools_are_described_when_the_template_renders_none(openai_client):
    # SmolLM2's template prints no tools: rill describes them in a system
    # message, so the prompt grows with the tools.
    base = openai_client.chat.completions.create(model="m", messages=MSG, max_tokens=1)
    with_tools = openai_client.chat.completions.create(model="m", messages=MSG, max_tokens=1, tools=[WEATHER])
    assert with_tools.usage.prompt_tokens > base.usage.prompt_tokens + 20


def test_openai_agents_required_tool(server):
    agents = pytest.importorskip("agents")
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                        function_tool, set_tracing_disabled)
    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    for model in (OpenAIChatCompletionsModel("m", client), OpenAIResponsesModel("m", client)):
        # stop_on_first_tool: the run ends with the forced call's result (left
        # to itself after the call, this model copies the call it sees in the
        # history until max_turns).
        agent = Agent(name="w", instructions="Answer about weather.", tools=[get_weather], model=model,
                      model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0),
                      tool_use_behavior="stop_on_first_tool")
        n = len(seen)
        result = Runner.run_sync(agent, "Weather in Paris?", max_turns=3)
        assert len(seen) == n + 1 and isinstance(seen[-1], str)
        assert result.final_output == f"sunny in {seen[-1]}"


def test_langchain_bind_tools_and_structured_output(server):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model="m", base_url=server.base + "/v1", api_key=API_KEY, temperature=0, max_tokens=300,
                     max_retries=0)
    msg = llm.bind_tools([WEATHER], tool_choice="required").invoke("Weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    check_call("get_weather", msg.tool_calls[0]["args"])
    person = llm.with_structured_output(Person, method="json_schema").invoke("Describe a person.")
    assert isinstance(person, Person)
