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


def test_input_items_list_the_conversation(openai_client):
    first = openai_client.responses.create(model="m", input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = openai_client.responses.create(model="m", input=[{"role": "user", "content": "And yours?"}],
                                            previous_response_id=first.id, max_output_tokens=8, temperature=0)
    items = openai_client.responses.input_items.list(second.id, order="asc")
    # The first input, the first response's output, then the new input.
    assert [i.type for i in items.data] == ["message", "message", "message"]
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    assert items.data[0].content[0].text == "My name is Ada."
    assert items.data[1].id == first.output[0].id
    assert items.data[2].content[0].text == "And yours?"
    assert items.first_id == items.data[0].id and items.last_id == items.data[-1].id and not items.has_more
    # Ids are stable, and pages follow them (the SDK's auto-pagination too).
    again = openai_client.responses.input_items.list(second.id, order="asc")
    assert [i.id for i in again.data] == [i.id for i in items.data]
    paged = [i.id for i in openai_client.responses.input_items.list(second.id, order="asc", limit=1)]
    assert paged == [i.id for i in items.data]
    newest = openai_client.responses.input_items.list(second.id, limit=1)  # desc by default
    assert newest.data[0].id == items.data[-1].id and newest.has_more
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.responses.input_items.list(second.id, limit=500)
    assert e.value.body["param"] == "limit"
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.input_items.list("resp_doesnotexist")
