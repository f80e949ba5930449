"""The official OpenAI Python SDK against a live `rill serve`: chat (plain,
streamed, multi-turn, tools round trip, logprobs, stop, seed), completions
and models."""
import json

import openai
import pytest

from conftest import wait_idle

USER = [{"role": "user", "content": "What is the capital of France?"}]


def test_models(openai_client):
    models = openai_client.models.list()
    assert len(models.data) == 1 and models.data[0].id


def test_chat_plain(openai_client):
    r = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=16, temperature=0)
    assert r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_equals_non_stream(openai_client):
    full = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=16, temperature=0)
    stream = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=16, temperature=0,
                                                  stream=True, stream_options={"include_usage": True})
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        text += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert roles == ["assistant"]
    assert text == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    # The same prompt again is a prefix-cache hit.
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_multi_turn(openai_client):
    first = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=12, temperature=0)
    messages = USER + [{"role": "assistant", "content": first.choices[0].message.content},
                       {"role": "user", "content": "And of Germany?"}]
    second = openai_client.chat.completions.create(model="m", messages=messages, max_tokens=12, temperature=0)
    assert second.choices[0].message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens > 0


def test_seed_reproducibility(openai_client):
    kw = dict(model="m", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=20,
              temperature=1.0, seed=1234)
    a = openai_client.chat.completions.create(**kw).choices[0].message.content
    b = openai_client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_n_choices(openai_client):
    r = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=8, n=3, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]


def test_stop_string_is_never_returned(openai_client):
    full = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=24, temperature=0)
    text = full.choices[0].message.content
    words = text.split()
    if len(words) < 3:
        pytest.skip("reply too short to pick a stop string")
    stop = " " + words[2]
    r = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].message.content
    assert text.startswith(r.choices[0].message.content)
    stream = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=24, temperature=0,
                                                  stop=stop, stream=True)
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert streamed == r.choices[0].message.content


def test_logprobs(openai_client):
    r = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=5, temperature=0, logprobs=True,
                                              top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for lp in content:
        assert lp.logprob <= 0
        assert len(lp.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert lp.top_logprobs[0].logprob == pytest.approx(lp.logprob, abs=1e-5)


def test_tools_round_trip(openai_client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"},
    ]
    r = openai_client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=16,
                                              temperature=0)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.finish_reason == "tool_calls":
        assert c.message.tool_calls[0].function.name
    else:
        assert c.message.content is not None


def test_completions(openai_client):
    r = openai_client.completions.create(model="m", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    stream = openai_client.completions.create(model="m", prompt="The capital of France is", max_tokens=8,
                                              temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == r.choices[0].text


def test_errors_surface_as_sdk_exceptions(openai_client, server):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    assert e.value.body["param"] == "messages[0].role"
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert wait_idle(server)["engine"]["active_requests"] == 0
