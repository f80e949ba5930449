"""The chat page at / in headless Chromium (Debian `chromium`, driven by
Playwright from pip; no `playwright install`): it loads, shows the model,
streams a reply with a tok/s indicator, sends the history on the next turn,
and its Stop button cancels the request on the server. A screenshot is kept
in build/artifacts/chat_page.png."""
import json
import os
import re
import time
import urllib.request

import pytest

from conftest import API_KEY, MODEL, ROOT, Server, wait_idle

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = os.path.join(ROOT, "build", "artifacts")

if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"{CHROMIUM} not found (scripts/setup.sh installs Debian chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (scripts/setup.sh)")

# Installed in the page before a message is sent: every time the last
# assistant message's text changes, record its length, the time, and whether
# the page still marks it as streaming. Mutation callbacks run once per
# rendered batch, so distinct lengths are the steps a user would see.
OBSERVE = """() => {
  window.__steps = [];
  const log = document.getElementById('log');
  new MutationObserver(() => {
    const all = log.querySelectorAll('.msg.assistant');
    const out = all[all.length - 1];
    if (!out) return;
    window.__steps.push({ n: out.textContent.length, t: performance.now(),
                          streaming: out.dataset.streaming === '1', done: out.dataset.done === '1' });
  }).observe(log, { childList: true, subtree: true, characterData: true, attributes: true });
}"""


def model_id(server):
    req = urllib.request.Request(server.base + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


@pytest.fixture(scope="module")
def server():
    """A server of its own with greedy sampling: the page sends no sampling
    fields or max_tokens, so the server defaults decide, and greedy makes the
    replies (a short one, then a long one to stop) the same on every run."""
    if not os.path.exists(MODEL):
        pytest.skip(f"{MODEL} not found (run scripts/setup.sh)")
    s = Server("--api-key", API_KEY, "--temperature", 0)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        pg = browser.new_page(viewport={"width": 1000, "height": 700})
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        # The page's own API calls must authenticate through ?key= (checked
        # below); the navigation itself carries the key only because the
        # server may guard / (test_page_is_served_without_credentials says
        # whether it does).
        pg.route(f"{server.base}/?key=*", lambda route: route.continue_(
            headers={**route.request.headers, "authorization": f"Bearer {API_KEY}"}))
        pg.goto(f"{server.base}/?key={API_KEY}")
        pg.errors = errors
        yield pg
        os.makedirs(ARTIFACTS, exist_ok=True)
        pg.screenshot(path=os.path.join(ARTIFACTS, "chat_page.png"), full_page=True)
        browser.close()


def assistant(page, i):
    return page.locator(".msg.assistant").nth(i)


def test_page_is_served_without_credentials(server):
    # A browser cannot send a Bearer header when it opens a page, so the
    # static chat page (no secrets in it) must be open like /health; the
    # page then sends the key from ?key= on its API calls.
    with urllib.request.urlopen(f"{server.base}/?key={API_KEY}", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        assert b"<title>rill</title>" in r.read()


def test_page_loads_and_shows_model(server, page):
    assert page.title() == "rill"
    sync_api.expect(page.locator("#model")).to_have_text(model_id(server), timeout=5000)
    assert page.locator("#send").is_enabled()
    assert page.locator("#stop").is_disabled()
    assert page.errors == []


def test_message_gets_streamed_reply(server, page):
    page.evaluate(OBSERVE)
    chats = []
    page.on("request", lambda r: chats.append(r) if r.url.endswith("/v1/chat/completions") else None)
    page.fill("#input", "Hi! Tell me three facts about the moon.")
    page.press("#input", "Enter")
    done = page.locator('.msg.assistant[data-done="1"]')
    done.wait_for(timeout=20000)

    text = assistant(page, 0).text_content()
    assert text.strip(), "the assistant reply is empty"
    assert page.locator(".msg.user").nth(0).text_content() == "Hi! Tell me three facts about the moon."
    assert page.locator(".msg.error").count() == 0
    assert assistant(page, 0).get_attribute("data-streaming") is None
    assert page.locator("#input").input_value() == ""

    body = json.loads(chats[0].post_data)
    assert body["stream"] is True and body["model"] == model_id(server)
    assert body["messages"] == [{"role": "user", "content": "Hi! Tell me three facts about the moon."}]
    assert "max_tokens" not in body

    # The text grew while the page marked it as streaming, and ended at the
    # final reply. A reply of a few tokens may arrive in one batch; a longer
    # one must have been rendered in several steps.
    steps = page.evaluate("window.__steps")
    growing = [s for s in steps if s["streaming"] and s["n"] > 0]
    assert growing, steps
    lengths = sorted({s["n"] for s in growing})
    assert lengths[-1] == len(text)
    if len(text) >= 40:
        assert len(lengths) > 1, f"the reply ({len(text)} chars) appeared in one step"
    assert steps[-1]["done"] and not steps[-1]["streaming"]

    # tok/s indicator: shown once tokens have arrived over measurable time.
    if len(lengths) > 1:
        speed = page.locator("#speed").text_content()
        m = re.fullmatch(r"(\d+(?:\.\d+)?) tok/s", speed)
        assert m, f"speed indicator reads {speed!r}"
        assert float(m.group(1)) > 0
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    assert wait_idle(server)["engine"]["active_requests"] == 0
    assert page.errors == []


def test_failed_request_shows_error_and_leaves_history(server, page):
    # The server answers with an OpenAI error (stubbed here: no generation).
    error = {"error": {"message": "messages: stubbed failure", "type": "invalid_request_error"}}
    url = f"{server.base}/v1/chat/completions"
    page.route(url, lambda route: route.fulfill(status=400, content_type="application/json", body=json.dumps(error)))
    try:
        page.fill("#input", "this one fails")
        page.press("#input", "Enter")
        sync_api.expect(page.locator(".msg.error")).to_have_text("error: messages: stubbed failure", timeout=5000)
        sync_api.expect(assistant(page, 1)).to_have_attribute("data-done", "1", timeout=5000)
        assert assistant(page, 1).text_content() == ""
        assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    finally:
        page.unroute(url)
    page.evaluate("document.querySelectorAll('.msg.error, .msg.assistant:empty').forEach(e => e.remove()); "
                  "document.querySelectorAll('.msg.user')[1].remove()")
    assert page.errors == []


def test_stop_cancels_long_request(server, page):
    chats = []
    page.on("request", lambda r: chats.append(r) if r.url.endswith("/v1/chat/completions") else None)
    first_reply = assistant(page, 0).text_content()
    before = wait_idle(server)["engine"]
    prompt = "Write a very long story about a dragon who learns to bake bread. Make it as long as you can."
    page.fill("#input", prompt)
    page.press("#input", "Enter")

    # Multi-turn: the history goes with the new message.
    page.wait_for_function("document.querySelectorAll('.msg.assistant').length == 2")
    body = json.loads(chats[0].post_data)
    assert body["messages"] == [{"role": "user", "content": "Hi! Tell me three facts about the moon."},
                                {"role": "assistant", "content": first_reply},
                                {"role": "user", "content": prompt}]

    # Stop once the reply is visibly streaming.
    out = assistant(page, 1)
    page.wait_for_function("() => { const m = document.querySelectorAll('.msg.assistant')[1];"
                           " return m.dataset.streaming === '1' && m.textContent.length >= 20; }", timeout=20000)
    assert page.locator("#stop").is_enabled() and page.locator("#send").is_disabled()
    assert server.stats()["engine"]["active_requests"] >= 1, "the story finished before Stop could be tested"
    page.click("#stop")

    sync_api.expect(out).to_have_attribute("data-done", "1", timeout=5000)
    stopped_at = out.text_content()
    assert stopped_at.strip()
    assert out.get_attribute("data-streaming") is None
    assert page.locator(".msg.error").count() == 0, "an abort must not show as an error"
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()

    deadline = time.time() + 5
    while server.stats()["engine"]["active_requests"] != 0:
        assert time.time() < deadline, "the engine still runs the request 5 s after Stop"
        time.sleep(0.05)
    time.sleep(0.2)
    assert out.text_content() == stopped_at, "text kept arriving after Stop"
    # Greedy, this story runs for hundreds of tokens; Stop cut it short.
    after = server.stats()["engine"]
    assert after["requests_finished"] == before["requests_finished"] + 1
    assert after["completion_tokens"] - before["completion_tokens"] < 200
    assert page.errors == []
