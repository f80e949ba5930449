"""The official Anthropic Python SDK against a live `rill serve`: messages
(plain, streamed, tools round trip, stop sequences) and count_tokens."""
import anthropic
import pytest

from conftest import wait_idle

MSG = [{"role": "user", "content": "What is the capital of France?"}]


def test_messages_plain(anthropic_client):
    m = anthropic_client.messages.create(model="m", max_tokens=16, messages=MSG, extra_body={"temperature": 0})
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens > 0 and m.usage.input_tokens > 0


def test_messages_stream_matches_and_event_order(anthropic_client):
    plain = anthropic_client.messages.create(model="m", max_tokens=16, messages=MSG, extra_body={"temperature": 0},
                                             system="You are terse.")
    events = []
    with anthropic_client.messages.stream(model="m", max_tokens=16, messages=MSG, extra_body={"temperature": 0},
                                          system="You are terse.") as stream:
        for ev in stream:
            events.append(ev.type)
        final = stream.get_final_message()
    raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop")]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == plain.content[0].text
    assert final.usage.cache_read_input_tokens > 0  # the same prompt twice


def test_stop_sequences(anthropic_client):
    plain = anthropic_client.messages.create(model="m", max_tokens=24, messages=MSG, extra_body={"temperature": 0})
    words = plain.content[0].text.split()
    if len(words) < 3:
        pytest.skip("reply too short")
    m = anthropic_client.messages.create(model="m", max_tokens=24, messages=MSG, extra_body={"temperature": 0},
                                         stop_sequences=[" " + words[2]])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == " " + words[2]
    assert " " + words[2] not in m.content[0].text


def test_tools_round_trip(anthropic_client):
    tools = [{"name": "get_weather", "description": "Weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "18 degrees and sunny"}]},
    ]
    m = anthropic_client.messages.create(model="m", max_tokens=16, messages=messages, tools=tools, extra_body={"temperature": 0})
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    n = anthropic_client.messages.count_tokens(model="m", messages=messages, tools=tools)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_errors(anthropic_client, server):
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client.messages.create(model="m", max_tokens=8, messages=[{"role": "wizard", "content": "x"}])
    assert wait_idle(server)["engine"]["active_requests"] == 0
