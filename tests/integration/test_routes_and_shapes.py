"""Routes and response shapes clients rely on (issue 18): models.retrieve,
the unprefixed aliases, spec fields (refusal, annotations/logprobs,
usage details), context overflow's code, sampling ranges, CORS preflight
headers and the default max_tokens cap."""
import json

import openai
import pytest

from conftest import API_KEY, Server
from test_http import error_of, request

USER = [{"role": "user", "content": "Say hi."}]


def test_models_retrieve(openai_client):
    listed = openai_client.models.list().data[0]
    m = openai_client.models.retrieve(listed.id)
    assert m.id == listed.id and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        openai_client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_unprefixed_aliases(server):
    root = openai.OpenAI(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=120)
    assert root.models.list().data
    r = root.chat.completions.create(model="m", messages=USER, max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
    assert root.completions.create(model="m", prompt="Hi", max_tokens=2).choices[0].text is not None
    assert root.responses.create(model="m", input="Hi", max_output_tokens=4).output_text is not None
    status, _, raw = request(server, "POST", "/messages", body=json.dumps(
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}))
    assert status == 200 and json.loads(raw)["type"] == "message"


def test_spec_shapes(openai_client):
    r = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=4, temperature=0)
    assert r.choices[0].message.refusal is None
    assert "refusal" in r.choices[0].message.model_dump()
    assert r.usage.prompt_tokens_details.cached_tokens is not None
    resp = openai_client.responses.create(model="m", input="Hi", max_output_tokens=4)
    part = next(o for o in resp.output if o.type == "message").content[0]
    assert part.type == "output_text" and part.annotations == [] and part.logprobs == []


def test_context_overflow_code(openai_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.completions.create(model="m", prompt=[1] * 2048, max_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.completions.create(model="m", prompt="Hi", max_tokens=2047 + 512, temperature=0)
    assert e.value.status_code == 400


def test_sampling_ranges(openai_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.chat.completions.create(model="m", messages=USER, max_tokens=2, temperature=2.5)
    assert e.value.body["param"] == "temperature"
    greedy = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=8, temperature=0)
    top_p0 = openai_client.chat.completions.create(model="m", messages=USER, max_tokens=8, temperature=1.0,
                                                   top_p=0)
    assert top_p0.choices[0].message.content == greedy.choices[0].message.content


def test_cors_preflight_allows_the_requested_headers(server):
    asked = "authorization, content-type, x-stainless-os, x-stainless-retry-count"
    status, headers, _ = request(server, "OPTIONS", "/v1/chat/completions", key=None,
                                 headers={"Origin": "http://example.test", "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": asked})
    assert status == 204
    assert headers.get("Access-Control-Allow-Headers") == asked
    assert headers.get("Access-Control-Allow-Origin") == "http://example.test"


def test_default_max_tokens_caps_a_request_without_one():
    s = Server("--default-max-tokens", 3)
    try:
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="x", max_retries=0, timeout=120)
        r = c.completions.create(model="m", prompt="Once upon a time", temperature=0,
                                 extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    finally:
        s.stop()
