"""KV pair k4a through `rill serve` (issue 22): its K widths are calibrated
at load, so a restarted server on the same cache directory must compute
the same widths, resume the prefix from disk and answer as the cold server
did; and the calibration flag is refused where it would be ignored."""
import os
import subprocess
import time

import pytest

from conftest import API_KEY, MODEL, RILL, Server
from test_cache_restart import CacheServer, long_prompt


@pytest.fixture()
def model():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")


class K4aServer(CacheServer):
    """CacheServer's `rill serve` (8k context, disk tier on cache_dir) with
    KV pair k4a, and `extra` flags."""

    def __init__(self, cache_dir, *extra):
        Server.__init__(self, "--ctx-size", "8192", "--kv-cache-mb", "512", "--api-key", API_KEY, "--cache-dir",
                        cache_dir, "--kv-type", "k4a", *extra)


def wait_written(server, n):
    deadline = time.time() + 120
    disk = server.disk()
    while (disk["queued"] > 0 or disk["written"] < n) and time.time() < deadline:
        time.sleep(0.1)
        disk = server.disk()
    return disk


def test_k4a_prefix_survives_a_restart(model, tmp_path):
    cache_dir = str(tmp_path / "kv")
    prompt = long_prompt(1500)
    first = K4aServer(cache_dir)
    try:
        cold_text, n_prompt, cold_cached = first.complete(prompt)
        assert n_prompt > 1400 and cold_cached == 0
        disk = wait_written(first, 1)
        assert disk["written"] == 1 and disk["dropped"] == 0, disk
    finally:
        first.stop()
    second = K4aServer(cache_dir)
    try:
        warm_text, _, warm_cached = second.complete(prompt)
        assert warm_cached >= n_prompt - 64, (warm_cached, n_prompt)
        assert warm_text == cold_text
    finally:
        second.stop()


def test_another_calibration_text_is_not_resumed(model, tmp_path):
    cache_dir = str(tmp_path / "kv")
    prompt = long_prompt(1500)
    first = K4aServer(cache_dir)
    try:
        first.complete(prompt)
        assert wait_written(first, 1)["written"] == 1
    finally:
        first.stop()
    text = tmp_path / "calibration.txt"
    text.write_text("".join(f"Line {i}: a different text to calibrate the widths on, said plainly.\n"
                            for i in range(60)))
    second = K4aServer(cache_dir, "--kv-calibration", str(text))
    try:
        _, _, cached = second.complete(prompt)
        assert cached == 0  # other widths: the file made under the first is not resumed
    finally:
        second.stop()


def test_kv_calibration_without_q4a_is_refused(model, tmp_path):
    text = tmp_path / "calibration.txt"
    text.write_text("some text\n" * 100)
    r = subprocess.run([RILL, "run", MODEL, "--prompt", "hi", "-n", "2", "--kv-calibration", str(text)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "--kv-calibration" in r.stderr and "q4a" in r.stderr, r.stderr


def test_kv_calibration_from_a_fifo_is_refused_not_awaited(model, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = subprocess.run([RILL, "run", MODEL, "--prompt", "hi", "-n", "2", "--kv-type", "k4a", "--kv-calibration",
                        str(fifo)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert str(fifo) in r.stderr and "regular file" in r.stderr, r.stderr


def test_a_short_calibration_is_reported(model):
    # A 128-token context holds half of the 256 calibration tokens: the
    # widths come from fewer statistics, and the load says so.
    short = subprocess.run([RILL, "run", MODEL, "--prompt", "hi", "-n", "2", "--kv-type", "k4a", "--ctx-size", "128"],
                           capture_output=True, text=True, timeout=120)
    assert short.returncode == 0, short.stderr
    assert "calibrated its widths on 128 tokens, not 256" in short.stderr, short.stderr
    full = subprocess.run([RILL, "run", MODEL, "--prompt", "hi", "-n", "2", "--kv-type", "k4a"], capture_output=True,
                          text=True, timeout=120)
    assert full.returncode == 0, full.stderr
    assert "calibrated its widths on" not in full.stderr, full.stderr
