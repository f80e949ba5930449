"""Prompt scoring through /v1/completions (echo + logprobs, max_tokens 0),
as lm-evaluation-harness's local-completions scores prompts, held to
`rill score`'s logits of the same tokens (log-softmax within 1e-4)."""
import json
import math
import subprocess
from types import SimpleNamespace

import openai
import pytest

from conftest import MODEL, RILL


def rill_json(*args):
    out = subprocess.run([RILL, *map(str, args)], check=True, capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout)


def log_softmax(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


@pytest.fixture(scope="module")
def prompt_ids():
    """Real text as ids: the greedy continuation of a short prompt."""
    r = rill_json("run", MODEL, "--raw", "--prompt", "The capital of France is", "-n", 20, "--temperature", 0,
                  "--ignore-eos", "--json", "--threads", 2)
    assert len(r["ids"]) == 20
    return r["ids"]


@pytest.fixture(scope="module")
def reference(prompt_ids):
    """Per position t >= 1: (logprob of ids[t], {id: logprob} of the whole row) from `rill score`."""
    logits = rill_json("score", MODEL, "--ids", ",".join(map(str, prompt_ids)), "--json", "--threads", 2)["logits"]
    return [log_softmax(row) for row in logits]


def check_against_reference(lp, ids, reference, n_top):
    assert len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for t in range(1, len(ids)):
        row = reference[t - 1]
        assert abs(lp.token_logprobs[t] - row[ids[t]]) < 1e-4, t
        best = sorted(row, reverse=True)[:n_top]
        assert len(lp.top_logprobs[t]) <= n_top
        got = sorted(lp.top_logprobs[t].values(), reverse=True)
        # Distinct tokens may share a piece (the dict keeps one): compare the best.
        assert abs(got[0] - best[0]) < 1e-4, t


def test_id_prompt_scores_match_rill_score(openai_client, prompt_ids, reference):
    r = openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=0, echo=True, logprobs=3)
    c = r.choices[0]
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens == len(prompt_ids)
    check_against_reference(c.logprobs, prompt_ids, reference, 3)
    assert c.text == "".join(c.logprobs.tokens)  # text_offset indexes the echoed text


def test_text_prompt_scores_match_rill_score(openai_client, prompt_ids, reference):
    text = openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=0, echo=True).choices[0].text
    r = openai_client.completions.create(model="m", prompt=text, max_tokens=0, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text == text
    # The text encodes back to the same ids (no BOS for this model), so the same scores.
    assert r.usage.prompt_tokens == len(prompt_ids)
    check_against_reference(c.logprobs, prompt_ids, reference, 2)


def test_batches_of_prompts_score_each_as_alone(openai_client, prompt_ids, reference):
    a, b = prompt_ids[:12], prompt_ids
    r = openai_client.completions.create(model="m", prompt=[a, b, a], max_tokens=0, echo=True, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    check_against_reference(r.choices[0].logprobs, a, reference, 1)
    check_against_reference(r.choices[1].logprobs, b, reference, 1)
    assert r.choices[2].logprobs.token_logprobs == r.choices[0].logprobs.token_logprobs
    texts = [c.text for c in r.choices[:2]]
    rt = openai_client.completions.create(model="m", prompt=texts, max_tokens=0, echo=True, logprobs=1)
    for i in range(2):
        assert rt.choices[i].logprobs.token_logprobs[1:] == pytest.approx(
            r.choices[i].logprobs.token_logprobs[1:], abs=1e-4)


def test_scoring_then_generating(openai_client, prompt_ids, reference):
    r = openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=4, echo=True, logprobs=1,
                                         temperature=0)
    c = r.choices[0]
    n = len(prompt_ids)
    prompt_part = SimpleNamespace(**{k: getattr(c.logprobs, k)[:n] for k in
                                     ("tokens", "token_logprobs", "top_logprobs", "text_offset")})
    check_against_reference(prompt_part, prompt_ids, reference, 1)
    assert len(c.logprobs.tokens) == n + r.usage.completion_tokens
    assert c.logprobs.text_offset[n] == len(c.text) - len("".join(c.logprobs.tokens[n:]))


def test_streamed_echo_carries_the_prompt_logprobs_first(openai_client, prompt_ids, reference):
    stream = openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=2, echo=True, logprobs=1,
                                              temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    first = chunks[0].choices[0]
    check_against_reference(first.logprobs, prompt_ids, reference, 1)
    full = openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=2, echo=True, logprobs=1,
                                            temperature=0)
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text


def test_a_cached_prompt_is_scored_all_the_same(openai_client, prompt_ids, reference):
    openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=2, temperature=0)  # fills the cache
    r = openai_client.completions.create(model="m", prompt=prompt_ids, max_tokens=0, echo=True, logprobs=1)
    check_against_reference(r.choices[0].logprobs, prompt_ids, reference, 1)


def test_max_tokens_zero_needs_echo(openai_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.completions.create(model="m", prompt="hi", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    r = openai_client.completions.create(model="m", prompt="hi there", max_tokens=0, echo=True)
    assert r.choices[0].text == "hi there" and r.choices[0].logprobs is None


def test_a_one_token_prompt_streams_its_echo(openai_client, prompt_ids):
    stream = openai_client.completions.create(model="m", prompt=prompt_ids[:1], max_tokens=1, echo=True, logprobs=1,
                                              temperature=0, stream=True)
    first = next(c for c in stream if c.choices).choices[0]
    assert first.logprobs.token_logprobs == [None] and first.text == first.logprobs.tokens[0]
