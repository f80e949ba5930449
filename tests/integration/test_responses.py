"""The OpenAI SDK's Responses API against a live `rill serve`: plain,
streamed events, previous_response_id chains, instructions carry-over and
expiry through a short --response-ttl (2 s in conftest)."""
import time

import openai
import pytest


def test_plain(openai_client):
    r = openai_client.responses.create(model="m", input="What is the capital of France?", max_output_tokens=16,
                                       temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0


def test_stream_event_grammar(openai_client):
    types, text, final = [], "", None
    with openai_client.responses.stream(model="m", input="Say hello.", max_output_tokens=12, temperature=0) as s:
        for ev in s:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            if ev.type in ("response.completed", "response.incomplete"):
                final = ev.response
    assert types[0] == "response.created"
    assert "response.output_item.added" in types and "response.output_text.done" in types
    assert types[-1] in ("response.completed", "response.incomplete")
    assert text == final.output_text


def test_previous_response_chain_and_instructions(openai_client):
    first = openai_client.responses.create(model="m", input="My name is Ada.", instructions="Answer briefly.",
                                           max_output_tokens=12, temperature=0)
    second = openai_client.responses.create(model="m", input="What is my name?", previous_response_id=first.id,
                                            max_output_tokens=12, temperature=0)
    assert second.previous_response_id == first.id
    assert second.instructions == "Answer briefly."  # carried over
    assert second.usage.input_tokens > first.usage.input_tokens  # the first exchange is in the prompt
    assert second.usage.input_tokens_details.cached_tokens > 0
    fetched = openai_client.responses.retrieve(second.id)
    assert fetched.id == second.id and fetched.output_text == second.output_text


def test_unknown_and_expired_ids_are_404(openai_client):
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.create(model="m", input="hi", previous_response_id="resp_doesnotexist",
                                       max_output_tokens=4)
    r = openai_client.responses.create(model="m", input="hi", max_output_tokens=4, temperature=0)
    time.sleep(2.5)  # --response-ttl 2
    with pytest.raises(openai.NotFoundError) as e:
        openai_client.responses.create(model="m", input="again", previous_response_id=r.id, max_output_tokens=4)
    assert e.value.body["type"] == "invalid_request_error"
