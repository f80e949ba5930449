"""The prefix cache's disk tier across a restart of `rill serve`: a long
prompt warmed with POST /v1/cache/warm is served from disk by a new server
process on the same --cache-dir (cached tokens in usage), with the same
greedy output as a server that has no cache at all. Also: a second process
cannot take the directory, `rill cache ls` lists it while the server runs,
`rill cache clear` is refused then and works after."""
import json
import os
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import API_KEY, MODEL, RILL, Server

WORDS = ("river stone light maps quiet engine north paper salt glass harbor field winter copper garden "
         "signal lantern market thread orchard").split()


def long_text(n_words=600):
    # Deterministic plain words: about one token each on the default model.
    return "Notes for the assistant. " + " ".join(WORDS[(i * 7 + i // 5) % len(WORDS)] for i in range(n_words))


def post(server, path, body):
    req = urllib.request.Request(server.base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def complete(server, prompt):
    status, body = post(server, "/v1/completions",
                        {"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0, "seed": 7,
                         "ignore_eos": True})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 12
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def rill_cache(*args):
    return subprocess.run([RILL, "cache", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture()
def model():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")


def test_warmed_prefix_is_served_from_disk_after_a_restart(model, tmp_path):
    cache_dir = str(tmp_path / "kv")
    text = long_text()
    prompt = text + "\nQuestion: which word comes first? Answer:"

    first = Server("--api-key", API_KEY, "--cache-dir", cache_dir)
    try:
        status, warm = post(first, "/v1/cache/warm", {"prompt": text})
        assert status == 200, warm
        assert warm["tokens"] >= 500
        assert warm["tokens"] - 16 < warm["cached_tokens"] <= warm["tokens"]
        # The directory belongs to this server: a second one refuses to start.
        second = subprocess.run([RILL, "serve", MODEL, "--port", "0", "--threads", "1", "--cache-dir", cache_dir],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0
        assert "in use by another rill process" in second.stderr
        listing = rill_cache("ls", "--cache-dir", cache_dir)
        assert listing.returncode == 0, listing.stderr
        assert f" {warm['cached_tokens']} " in listing.stdout
        refused = rill_cache("clear", "--cache-dir", cache_dir)
        assert refused.returncode != 0 and "in use" in refused.stderr
    finally:
        first.stop()

    restarted = Server("--api-key", API_KEY, "--cache-dir", cache_dir)
    try:
        assert restarted.stats()["kv"]["tiers"]["disk"]["entries"] == 1
        warm_text, cached = complete(restarted, prompt)
        assert cached >= warm["cached_tokens"] - 16, cached
        tiers = restarted.stats()["kv"]["tiers"]
        assert tiers["disk"]["hits"] == 1 and tiers["restored_tokens"] >= cached
    finally:
        restarted.stop()

    cold = Server("--api-key", API_KEY)
    try:
        cold_text, cold_cached = complete(cold, prompt)
        assert cold_cached == 0
    finally:
        cold.stop()
    assert warm_text == cold_text

    cleared = rill_cache("clear", "--cache-dir", cache_dir)
    assert cleared.returncode == 0, cleared.stderr
    assert not [f for f in os.listdir(cache_dir) if f.endswith(".rkv")]


def test_warm_needs_a_cache_dir_and_valid_input(model):
    server = Server("--api-key", API_KEY)
    try:
        status, body = post(server, "/v1/cache/warm", {"prompt": "hello"})
        assert status == 400 and "--cache-dir" in body["error"]["message"]
        status, body = post(server, "/v1/cache/warm", {})
        assert status == 400 and body["error"]["param"] == "prompt"
    finally:
        server.stop()
