"""Streamed tool calls as each official SDK expects them, on the default
model with tool_choice required (the grammar makes every call whole): the
name first, then the arguments in several pieces as the model writes them,
which add up to arguments that parse and match the tool's schema.
"""
import json

import jsonschema

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
# strict: the SDK's stream helpers parse arguments only for strict tools.
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": WEATHER_PARAMS, "strict": True}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def test_chat_stream_sends_the_name_first_then_argument_pieces(openai_client):
    kwargs = dict(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=200, temperature=0)
    chunks = list(openai_client.chat.completions.create(stream=True, **kwargs))
    # Each tool_calls entry comes in its own chunk.
    assert all(len(c.choices[0].delta.tool_calls or []) <= 1 for c in chunks if c.choices)
    pieces = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    calls = {}
    for p in pieces:
        if p.index not in calls:  # the call's first chunk: id, type, name, arguments ""
            assert p.index == len(calls) and p.type == "function" and p.id.startswith("call_")
            assert p.function.name == "get_weather" and p.function.arguments == ""
            calls[p.index] = [p.id, p.function.name, []]
        else:  # then arguments only, for the call being written
            assert p.index == len(calls) - 1
            assert p.id is None and p.type is None and p.function.name is None and p.function.arguments
            calls[p.index][2].append(p.function.arguments)
    assert calls
    for _, _, arguments in calls.values():
        assert len(arguments) > 1  # the arguments arrive in several pieces
        jsonschema.validate(json.loads("".join(arguments)), WEATHER_PARAMS)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # The same request unstreamed gives the same calls (greedy), byte for byte.
    message = openai_client.chat.completions.create(**kwargs).choices[0].message
    assert [(t.function.name, t.function.arguments) for t in message.tool_calls] == [
        (name, "".join(arguments)) for _, name, arguments in calls.values()]


def test_chat_stream_helper_argument_delta_events(openai_client):
    helpers = [openai_client.chat.completions.stream]
    if hasattr(openai_client, "beta") and hasattr(getattr(openai_client.beta, "chat", None), "completions"):
        helpers.append(openai_client.beta.chat.completions.stream)
    for stream in helpers:
        with stream(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=200,
                    temperature=0, parallel_tool_calls=False) as s:
            events = list(s)
            final = s.get_final_completion()
        deltas = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
        done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
        assert len(deltas) > 1
        assert all(e.name == "get_weather" and e.index == 0 for e in deltas)
        assert len(done) == 1
        assert "".join(e.arguments_delta for e in deltas) == done[0].arguments == deltas[-1].arguments
        jsonschema.validate(done[0].parsed_arguments, WEATHER_PARAMS)
        call = final.choices[0].message.tool_calls[0]
        assert call.function.arguments == done[0].arguments
        assert call.function.parsed_arguments == json.loads(done[0].arguments)


def test_responses_stream_function_call_arguments_events(openai_client):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMS, "strict": True}]
    kwargs = dict(model="m", input="Weather in Paris?", tools=tools, tool_choice="required", max_output_tokens=200,
                  temperature=0, parallel_tool_calls=False)
    events = list(openai_client.responses.create(stream=True, **kwargs))
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(added) == 1
    item, index = added[0].item, added[0].output_index
    assert item.name == "get_weather" and item.arguments == "" and item.status == "in_progress"
    position = events.index(added[0])
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 1
    assert all(events.index(e) > position and e.output_index == index and e.item_id == item.id for e in deltas)
    arguments = "".join(e.delta for e in deltas)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == arguments
    item_done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert item_done[0].item.arguments == arguments and item_done[0].item.call_id == item.call_id
    final = events[-1].response
    assert [o.arguments for o in final.output if o.type == "function_call"] == [arguments]
    jsonschema.validate(json.loads(arguments), WEATHER_PARAMS)
    # The SDK's stream helper checks the items' identities as they stream.
    with openai_client.responses.stream(**kwargs) as s:
        helper_deltas = [e for e in s if e.type == "response.function_call_arguments.delta"]
        response = s.get_final_response()
    assert len(helper_deltas) > 1 and helper_deltas[-1].snapshot == arguments
    assert [o.arguments for o in response.output if o.type == "function_call"] == [arguments]


def test_anthropic_stream_input_json_events(anthropic_client):
    tools = [{"name": "get_weather", "input_schema": WEATHER_PARAMS}]
    with anthropic_client.messages.stream(model="m", max_tokens=200, tools=tools, messages=ASK,
                                          tool_choice={"type": "any", "disable_parallel_tool_use": True}) as s:
        events = list(s)
        final = s.get_final_message()
    starts = [e for e in events if e.type == "content_block_start" and e.content_block.type == "tool_use"]
    assert len(starts) == 1
    assert starts[0].content_block.name == "get_weather" and starts[0].content_block.input == {}
    pieces = [e for e in events if e.type == "input_json"]
    assert len(pieces) > 1
    partial_json = "".join(e.partial_json for e in pieces)
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    assert uses[0].input == json.loads(partial_json)
    jsonschema.validate(uses[0].input, WEATHER_PARAMS)
    assert final.stop_reason == "tool_use"
