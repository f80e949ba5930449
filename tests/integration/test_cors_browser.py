"""CORS in a real browser: a page served from another origin (a tiny
http.server on another port) calls `rill serve --cors-origin <that origin>`
with the headers the official JS SDKs send (Authorization or x-api-key,
x-stainless-*, anthropic-*, content-type), which makes Chromium send a
preflight first. The preflight must pass and the request succeed; the same
page from an origin not allowed must be refused by the browser (the request
never reaches the engine)."""
import http.server
import json
import os
import threading

import pytest

from conftest import API_KEY, MODEL, Server, free_port, wait_idle

CHROMIUM = "/usr/bin/chromium"
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"{CHROMIUM} not found (scripts/setup.sh installs Debian chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (scripts/setup.sh)")

# The headers openai-node and anthropic-sdk-typescript send from a browser
# (dangerouslyAllowBrowser / anthropic-dangerous-direct-browser-access):
# every x-stainless-* one is non-safelisted, so each request is preflighted.
STAINLESS = {
    "X-Stainless-Lang": "js",
    "X-Stainless-Package-Version": "4.104.0",
    "X-Stainless-OS": "Unknown",
    "X-Stainless-Arch": "unknown",
    "X-Stainless-Runtime": "browser:chrome",
    "X-Stainless-Runtime-Version": "156.0.0",
    "X-Stainless-Retry-Count": "0",
    "X-Stainless-Timeout": "600",
}
OPENAI_HEADERS = {"Accept": "application/json", "Content-Type": "application/json",
                  "Authorization": f"Bearer {API_KEY}", **STAINLESS}
ANTHROPIC_HEADERS = {"Accept": "application/json", "Content-Type": "application/json", "x-api-key": API_KEY,
                     "anthropic-version": "2023-06-01", "anthropic-dangerous-direct-browser-access": "true",
                     **STAINLESS}

PAGE = b"<!doctype html><html><head><title>other origin</title></head><body>an app on another origin</body></html>"

# Runs in the page: a fetch to rill; returns the status and JSON, or the
# browser's error (a CORS refusal is a TypeError with no status).
CALL = """async ([url, headers, body]) => {
  try {
    const r = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) });
    return { status: r.status, json: await r.json() };
  } catch (e) {
    return { error: e.name + ': ' + e.message };
  }
}"""
STREAM = """async ([url, headers, body]) => {
  const r = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, type: r.headers.get('content-type'), text };
}"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def app_port():
    """The other origin: http://127.0.0.1:<port> (allowed) and
    http://localhost:<port> (the same server, a different origin: refused)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server(app_port):
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")
    s = Server("--api-key", API_KEY, "--temperature", 0, "--cors-origin", f"http://127.0.0.1:{app_port}")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


def open_app(browser, origin):
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(origin + "/")
    assert page.title() == "other origin"
    return ctx, page


def test_allowed_origin_passes_preflight_with_sdk_headers(server, browser, app_port):
    ctx, page = open_app(browser, f"http://127.0.0.1:{app_port}")
    try:
        chat = {"model": "any", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
        r = page.evaluate(CALL, [server.base + "/v1/chat/completions", OPENAI_HEADERS, chat])
        assert r.get("status") == 200, r
        assert r["json"]["object"] == "chat.completion" and r["json"]["usage"]["completion_tokens"] > 0

        # Streaming through the same preflighted route.
        r = page.evaluate(STREAM, [server.base + "/v1/chat/completions", OPENAI_HEADERS,
                                   {**chat, "stream": True}])
        assert r["status"] == 200 and r["type"].startswith("text/event-stream"), r
        assert r["text"].rstrip().endswith("data: [DONE]")

        # The Anthropic SDK's headers on its route.
        msg = {"model": "any", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi"}]}
        r = page.evaluate(CALL, [server.base + "/v1/messages", ANTHROPIC_HEADERS, msg])
        assert r.get("status") == 200, r
        assert r["json"]["type"] == "message"

        # A GET with the SDK's headers (models.list) is preflighted too.
        r = page.evaluate("""async ([url, headers]) => {
            const r = await fetch(url, { headers }); return { status: r.status, json: await r.json() }; }""",
                          [server.base + "/v1/models", {k: v for k, v in OPENAI_HEADERS.items()
                                                        if k != "Content-Type"}])
        assert r["status"] == 200 and r["json"]["data"], r
    finally:
        ctx.close()


def test_other_origin_is_refused_by_the_browser(server, browser, app_port):
    before = wait_idle(server)["engine"]["requests_submitted"]
    # Same server and port, but "localhost" is another origin than "127.0.0.1".
    ctx, page = open_app(browser, f"http://localhost:{app_port}")
    try:
        chat = {"model": "any", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8}
        r = page.evaluate(CALL, [server.base + "/v1/chat/completions", OPENAI_HEADERS, chat])
        assert "status" not in r and r["error"].startswith("TypeError"), r
        # A simple request (no preflight) is sent, but its answer is hidden
        # from the page.
        r = page.evaluate("""async url => { try { await fetch(url); return 'read'; }
                                            catch (e) { return e.name; } }""", server.base + "/health")
        assert r == "TypeError"
    finally:
        ctx.close()
    # The preflight failed, so the POST was never sent.
    assert server.stats()["engine"]["requests_submitted"] == before
