"""Starts real `rill serve` processes on the default model for the
integration tests (official OpenAI / Anthropic SDKs and raw HTTP)."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RILL = os.environ.get("RILL_BINARY", os.path.join(ROOT, "build", "rill"))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
API_KEY = "test-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *extra, model=MODEL):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        extra = list(map(str, extra))
        defaults = [("--threads", "2"), ("--ctx-size", "2048"), ("--kv-cache-mb", "256"), ("--max-running", "64")]
        args = [RILL, "serve", model, "--port", str(self.port)]
        for flag, value in defaults:  # a test's own value replaces the default
            if flag not in extra:
                args += [flag, value]
        args += extra
        self.log = open(os.path.join(ROOT, "build", f"serve-{self.port}.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rill serve exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("rill serve did not become healthy")

    def stats(self, key=API_KEY):
        req = urllib.request.Request(self.base + "/stats", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def server():
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")
    s = Server("--api-key", API_KEY, "--cors-origin", "http://example.test", "--max-body-bytes", 200000,
               "--max-n", 4, "--max-tokens-cap", 512, "--response-ttl", 2)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def openai_client(server):
    import openai
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def anthropic_client(server):
    import anthropic
    return anthropic.Anthropic(base_url=server.base, api_key=API_KEY, max_retries=0, timeout=120)


def wait_idle(server, timeout=10):
    """Waits until the engine has no active request; returns the last stats."""
    deadline = time.time() + timeout
    while True:
        st = server.stats()
        if st["engine"]["active_requests"] == 0 or time.time() > deadline:
            return st
        time.sleep(0.05)
