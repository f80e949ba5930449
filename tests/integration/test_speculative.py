"""Speculative decoding through the server: `--spec ngram` gives the same
output as a server without it, greedy and seeded (chat, completions,
Anthropic messages); usage reports the drafts that held and did not
(completion_tokens_details accepted / rejected_prediction_tokens); a
request's "speculative": false opts out (no drafts, same output); a
non-boolean "speculative" is a 400 naming it (chat, completions,
messages, responses); /metrics counts the drafts
per speculator; `--spec draft=PATH` (the default model drafting for
itself) gives the same output."""
import json
import urllib.error
import urllib.request

import pytest

from conftest import MODEL, Server

import os

EDIT = ("Rewrite the text, replacing 'cat' with 'dog'.\n"
        "Text: The cat sat on the mat. The cat was happy and the cat purred at the other cat.\n"
        "Rewritten:")


@pytest.fixture(scope="module")
def servers():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")
    on = Server("--spec", "ngram", "--spec-tokens", "6", "--ctx-size", "1024", "--kv-cache-mb", "64")
    off = Server("--ctx-size", "1024", "--kv-cache-mb", "64")
    yield on, off
    on.stop()
    off.stop()


def post(server, path, body):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def chat(server, **extra):
    body = {"model": "m", "messages": [{"role": "user", "content": EDIT}], "max_tokens": 48, "temperature": 0}
    body.update(extra)
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 200, out
    return out


def test_chat_output_matches_and_usage_counts_drafts(servers):
    on, off = servers
    a, b = chat(on), chat(off)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    details = a["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
    assert details["rejected_prediction_tokens"] >= 0
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    plain = b["usage"]["completion_tokens_details"]
    assert plain["accepted_prediction_tokens"] == 0 and plain["rejected_prediction_tokens"] == 0


def test_seeded_sampling_matches(servers):
    on, off = servers
    a = chat(on, temperature=0.8, seed=42)
    b = chat(off, temperature=0.8, seed=42)
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_request_opt_out(servers):
    on, off = servers
    a = chat(on, speculative=False)
    details = a["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] == 0 and details["rejected_prediction_tokens"] == 0
    assert a["choices"][0]["message"]["content"] == chat(off)["choices"][0]["message"]["content"]


def test_completions_and_anthropic(servers):
    on, off = servers
    body = {"model": "m", "prompt": EDIT, "max_tokens": 40, "temperature": 0}
    sa, a = post(on, "/v1/completions", body)
    sb, b = post(off, "/v1/completions", body)
    assert sa == 200 and sb == 200
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    msg = {"model": "m", "max_tokens": 40, "temperature": 0, "messages": [{"role": "user", "content": EDIT}]}
    sa, a = post(on, "/v1/messages", msg)
    sb, b = post(off, "/v1/messages", dict(msg, speculative=False))
    assert sa == 200 and sb == 200, (a, b)
    assert a["content"][0]["text"] == b["content"][0]["text"]
    resp = {"model": "m", "input": EDIT, "max_output_tokens": 40, "temperature": 0}
    sa, a = post(on, "/v1/responses", resp)
    sb, b = post(off, "/v1/responses", dict(resp, speculative=False))
    assert sa == 200 and sb == 200, (a, b)
    assert a["output"][-1]["content"][0]["text"] == b["output"][-1]["content"][0]["text"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"input": "hi"}),
])
def test_speculative_must_be_a_boolean(servers, path, body):
    on, _ = servers
    status, out = post(on, path, dict(body, model="m", speculative="no"))
    assert status == 400
    assert "speculative" in json.dumps(out)


def test_metrics_count_drafts_per_speculator(servers):
    on, off = servers
    chat(on)
    with urllib.request.urlopen(on.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    drafted = accepted = None
    for line in text.splitlines():
        if line.startswith('rill_spec_draft_tokens_total{speculator="ngram"}'):
            drafted = float(line.split()[-1])
        if line.startswith('rill_spec_accepted_tokens_total{speculator="ngram"}'):
            accepted = float(line.split()[-1])
    assert drafted and drafted > 0 and accepted is not None and 0 < accepted <= drafted
    assert 'rill_spec_acceptance_rate{speculator="ngram"}' in text
    with urllib.request.urlopen(off.base + "/metrics", timeout=10) as r:
        assert "rill_spec_draft_tokens_total" not in r.read().decode()
    spec = on.stats()["engine"]["speculative"]
    assert spec["speculator"] == "ngram" and spec["draft_tokens"] == drafted
    assert spec["accepted_tokens"] == accepted
    assert off.stats()["engine"]["speculative"] is None


def test_unknown_speculator_refuses_to_start():
    if not os.path.exists(MODEL):
        pytest.skip("no model")
    with pytest.raises(RuntimeError):
        Server("--spec", "draft=missing.gguf").stop()


def test_mtp_without_mtp_layers_refuses_to_start():
    # The default model carries no multi-token-prediction layers.
    if not os.path.exists(MODEL):
        pytest.skip("no model")
    with pytest.raises(RuntimeError):
        Server("--spec", "mtp").stop()


def test_draft_model_speculator(servers):
    # The default model drafting for itself (`--spec draft=PATH`): the same
    # output, its drafts held, /metrics labelled "draft".
    _, off = servers
    on = Server("--spec", f"draft={MODEL}", "--spec-tokens", "4", "--ctx-size", "1024", "--kv-cache-mb", "64")
    try:
        a, b = chat(on), chat(off)
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        assert a["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
        with urllib.request.urlopen(on.base + "/metrics", timeout=10) as r:
            assert 'rill_spec_draft_tokens_total{speculator="draft"}' in r.read().decode()
    finally:
        on.stop()


def test_logprobs_stop_strings_and_max_tokens_as_without(servers):
    on, off = servers
    # Logprobs of the accepted tokens come from the target's rows: the same
    # values as without speculation.
    a = chat(on, logprobs=True, top_logprobs=2)
    b = chat(off, logprobs=True, top_logprobs=2)
    assert a["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]
    # A stop string inside an accepted run of drafts ends the output there.
    a, b = chat(on, stop=["happy"]), chat(off, stop=["happy"])
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"] == "stop"
    assert "happy" not in a["choices"][0]["message"]["content"]
    # max_tokens is never overrun by a run of accepted drafts.
    for n in (1, 2, 5, 9):
        a, b = chat(on, max_tokens=n), chat(off, max_tokens=n)
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] <= n
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_k4c_kv_with_ngram_drafts_matches_k4c_without():
    """k4c KV (the engine ends drafts before each KV block does): a served
    edit, greedy and seeded, is the same with and without drafts, and drafts
    were accepted."""
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")
    common = ("--kv-type", "k4c", "--ctx-size", "1024", "--kv-cache-mb", "64")
    on = Server("--spec", "ngram", "--spec-tokens", "6", *common)
    off = Server(*common)
    try:
        a, b = chat(on, max_tokens=96), chat(off, max_tokens=96)
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        assert a["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
        a, b = chat(on, max_tokens=64, temperature=0.8, seed=11), chat(off, max_tokens=64, temperature=0.8, seed=11)
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    finally:
        on.stop()
        off.stop()
