"""`suffix` (fill-in-the-middle) on /v1/completions: the default model
(SmolLM2) has no FIM tokens, so it is a clear 400 naming `suffix`; the
rendering for vocabularies that have them is tests/text/fim_test.cpp."""
import openai
import pytest


def test_suffix_without_fim_tokens_is_a_400(openai_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.completions.create(model="m", prompt="def add(a, b):\n", suffix="\n    return c", max_tokens=4)
    assert e.value.body["param"] == "suffix"
    assert "fill-in-the-middle" in e.value.body["message"]
    # An empty suffix is no suffix.
    r = openai_client.completions.create(model="m", prompt="def add(a, b):\n", suffix="", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
