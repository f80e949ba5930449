"""A restart of `rill serve` with --cache-dir is warm for ordinary traffic:
a ~3,800-token prompt served once (no warm-up, nothing evicted) is written
behind to the disk tier, and after SIGTERM and a new process on the same
directory the same greedy request is answered from disk (cached tokens in
usage) with the text the cold server gave."""
import json
import os
import time
import urllib.request

import pytest

from conftest import API_KEY, MODEL, Server

WORDS = ("river stone light maps quiet engine north paper salt glass harbor field winter copper garden "
         "signal lantern market thread orchard").split()


def long_prompt(n_words=3700):
    # Deterministic plain words: about one token each on the default model.
    body = " ".join(WORDS[(i * 7 + i // 5) % len(WORDS)] for i in range(n_words))
    return "Notes for the assistant. " + body + "\nQuestion: which word comes first? Answer:"


class CacheServer(Server):
    """`rill serve` with a context long enough for the prompt (the shared
    fixture's server uses 2,048 tokens) on `cache_dir`."""

    def __init__(self, cache_dir):
        super().__init__("--ctx-size", "8192", "--kv-cache-mb", "512", "--api-key", API_KEY,
                         "--cache-dir", cache_dir)

    def request(self, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {API_KEY}"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def disk(self):
        return self.request("/stats")["kv"]["tiers"]["disk"]

    def complete(self, prompt):
        body = self.request("/v1/completions", {"model": "m", "prompt": prompt, "max_tokens": 16,
                                                "temperature": 0, "ignore_eos": True})
        usage = body["usage"]
        return body["choices"][0]["text"], usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]

    def stop(self):
        super().stop()  # SIGTERM: the graceful shutdown flushes the disk tier


@pytest.fixture()
def model():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")


def test_a_long_prompt_is_served_from_disk_after_a_restart(model, tmp_path):
    cache_dir = str(tmp_path / "kv")
    prompt = long_prompt()

    first = CacheServer(cache_dir)
    try:
        cold_text, n_prompt, cold_cached = first.complete(prompt)
        assert 3500 <= n_prompt <= 4000, n_prompt
        assert cold_cached == 0
        # Written behind, off the request path: wait for the writer (the
        # server may still end abruptly on SIGTERM, so do not rely on it).
        deadline = time.time() + 120
        disk = first.disk()
        while (disk["queued"] > 0 or disk["written"] < 1) and time.time() < deadline:
            time.sleep(0.1)
            disk = first.disk()
        assert disk["written"] == 1 and disk["queued"] == 0 and disk["dropped"] == 0, disk
        # The same request again is a device-cache hit and is not written twice.
        again_text, _, again_cached = first.complete(prompt)
        assert again_cached > 0 and again_text == cold_text
        assert first.disk()["written"] == 1
    finally:
        first.stop()
    assert [f for f in os.listdir(cache_dir) if f.endswith(".rkv")]

    restarted = CacheServer(cache_dir)
    try:
        assert restarted.disk()["entries"] >= 1
        warm_text, _, warm_cached = restarted.complete(prompt)
        disk = restarted.disk()
    finally:
        restarted.stop()
    assert warm_cached >= n_prompt - 32, (warm_cached, n_prompt)
    assert disk["hits"] == 1 and disk["errors"] == 0, disk
    assert warm_text == cold_text
