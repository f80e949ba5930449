"""POST /v1/embeddings with the official OpenAI SDK against `rill serve` of
all-MiniLM-L6-v2 (bert.cpu), checked against sentence-transformers' vectors
(tests/data/embeddings, made by tools/make_embedding_goldens.py); and the
default decoder (SmolLM2, no declared pooling) refusing clearly."""
import base64
import json
import math
import os
import struct
import urllib.error
import urllib.request

import openai
import pytest

from conftest import API_KEY, MODEL, ROOT, Server

MINILM = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
GOLDEN = os.path.join(ROOT, "tests", "data", "embeddings", "all-minilm-l6-v2.json")


def cosine(a, b):
    ab = sum(x * y for x, y in zip(a, b))
    return ab / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def minilm():
    if not os.path.exists(MINILM):
        pytest.skip(f"{MINILM} not found (run scripts/setup.sh)")
    s = Server("--api-key", API_KEY, model=MINILM)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(minilm):
    return openai.OpenAI(base_url=minilm.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def short_cases(golden):
    return [c for c in golden["cases"] if len(c["ids"]) <= golden["max_seq_length"]]


def test_sdk_default_base64_matches_sentence_transformers(client, golden):
    cases = short_cases(golden)
    # The SDK asks for base64 and decodes it to floats itself.
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=[c["text"] for c in cases])
    assert r.object == "list" and r.model == "all-MiniLM-L6-v2"
    assert [d.index for d in r.data] == list(range(len(cases)))
    for d, c in zip(r.data, cases):
        assert d.object == "embedding"
        assert len(d.embedding) == golden["dimensions"]
        assert cosine(d.embedding, c["embedding"]) >= 0.9999, c["text"]
    assert r.usage.prompt_tokens == sum(len(c["ids"]) for c in cases)
    assert r.usage.total_tokens == r.usage.prompt_tokens


def test_float_and_base64_carry_the_same_vector(client, minilm, golden):
    text = golden["cases"][0]["text"]
    f = client.embeddings.create(model="m", input=text, encoding_format="float")
    raw = client.embeddings.with_raw_response.create(model="m", input=text, encoding_format="base64")
    b64 = json.loads(raw.text)["data"][0]["embedding"]
    assert isinstance(b64, str)
    decoded = struct.unpack(f"<{golden['dimensions']}f", base64.b64decode(b64))
    assert list(decoded) == f.data[0].embedding  # float32 both ways, bit for bit
    assert cosine(f.data[0].embedding, golden["cases"][0]["embedding"]) >= 0.9999


def test_token_id_inputs_equal_their_text(client, golden):
    a, b = golden["cases"][0], golden["cases"][1]
    by_text = client.embeddings.create(model="m", input=[a["text"], b["text"]], encoding_format="float")
    one = client.embeddings.create(model="m", input=a["ids"], encoding_format="float")
    lists = client.embeddings.create(model="m", input=[a["ids"], b["ids"]], encoding_format="float")
    assert one.data[0].embedding == by_text.data[0].embedding
    assert [d.embedding for d in lists.data] == [d.embedding for d in by_text.data]
    assert one.usage.prompt_tokens == len(a["ids"])


def test_dimensions_equal_to_the_model_or_refused(client, golden):
    dims = golden["dimensions"]
    r = client.embeddings.create(model="m", input="hello", dimensions=dims, encoding_format="float")
    assert len(r.data[0].embedding) == dims
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="m", input="hello", dimensions=128)
    assert e.value.body["param"] == "dimensions"


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["a", ""]}, "input[1]"),
    ({"input": [[]]}, "input[0]"),
    ({"input": 5}, "input"),
    ({"input": ["a", 5]}, "input[1]"),
    ({"input": [1, "a"]}, "input[1]"),
    ({"input": [[101, 102], "a"]}, "input[1]"),
    ({"input": [101, 99999999]}, "input[1]"),
    ({"input": [101, -1]}, "input[1]"),
    ({"input": [1.5]}, "input[0]"),
    ({}, "input"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": "384"}, "dimensions"),
    ({"input": "a", "model": 3}, "model"),
])
def test_bad_requests_are_400_naming_the_field(minilm, body, param):
    status, reply = post(minilm, "/v1/embeddings", body)
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply


def test_too_long_input_is_refused(client, golden):
    long = [c for c in golden["cases"] if len(c["ids"]) > golden["max_seq_length"]][0]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="m", input=long["text"])
    assert e.value.body["param"] == "input"
    assert e.value.body["code"] == "context_length_exceeded"
    assert str(golden["max_seq_length"]) in e.value.body["message"]


def test_unprefixed_alias_and_generation_routes_refused(minilm, golden):
    status, reply = post(minilm, "/embeddings", {"input": "hello", "encoding_format": "float"})
    assert status == 200 and len(reply["data"][0]["embedding"]) == golden["dimensions"]
    for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"}),
                       ("/v1/responses", {"input": "hi"}),
                       ("/v1/messages", {"model": "m", "max_tokens": 4,
                                         "messages": [{"role": "user", "content": "hi"}]})]:
        status, reply = post(minilm, path, body)
        assert status == 400, (path, reply)
        assert "embedding" in reply["error"]["message"], (path, reply)


def test_decoder_without_pooling_refuses(server, openai_client):
    # SmolLM2 (the default model) declares no pooling.
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.embeddings.create(model="m", input="hello")
    assert e.value.body["param"] == "model"
    assert "declares no pooling" in e.value.body["message"]


def post(server, path, body):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {API_KEY}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
