#include "server/web/chat_page.h"

namespace rill::server {

const std::string& chat_page_html() {
  static const std::string kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rill</title>
<style>
  :root { --bg: #f7f7f8; --fg: #1d1d1f; --muted: #6e6e73; --user: #dbeafe; --bot: #ffffff; --accent: #2563eb; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg); color: var(--fg);
         display: flex; flex-direction: column; height: 100vh; }
  header { padding: 10px 16px; border-bottom: 1px solid #e5e5ea; display: flex; gap: 12px; align-items: center; }
  header h1 { font-size: 16px; margin: 0; }
  header .model, header .speed { color: var(--muted); font-size: 13px; }
  header .speed { margin-left: auto; }
  #log { flex: 1; overflow-y: auto; padding: 16px; display: flex; flex-direction: column; gap: 10px; }
  .msg { max-width: 780px; padding: 10px 14px; border-radius: 12px; white-space: pre-wrap; word-wrap: break-word; }
  .user { align-self: flex-end; background: var(--user); }
  .assistant { align-self: flex-start; background: var(--bot); border: 1px solid #e5e5ea; }
  .error { align-self: center; color: #b91c1c; font-size: 13px; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid #e5e5ea; }
  textarea { flex: 1; resize: none; font: inherit; padding: 8px 10px; border-radius: 8px; border: 1px solid #d1d1d6; height: 60px; }
  button { font: inherit; padding: 0 18px; border-radius: 8px; border: 0; background: var(--accent); color: white; cursor: pointer; }
  button.secondary { background: #e5e5ea; color: var(--fg); }
  button:disabled { opacity: .5; cursor: default; }
</style>
</head>
<body>
<header><h1>rill</h1><span class="model" id="model"></span><span class="speed" id="speed"></span></header>
<div id="log" aria-live="polite"></div>
<form id="form">
  <textarea id="input" placeholder="Send a message (Enter to send, Shift+Enter for a new line)" autofocus></textarea>
  <button id="send" type="submit">Send</button>
  <button id="stop" type="button" class="secondary" disabled>Stop</button>
  <button id="clear" type="button" class="secondary">New chat</button>
</form>
<script>
const log = document.getElementById('log'), input = document.getElementById('input');
const sendBtn = document.getElementById('send'), stopBtn = document.getElementById('stop');
const speed = document.getElementById('speed');
let history = [], controller = null, model = '';
const key = new URLSearchParams(location.search).get('key');
const headers = { 'Content-Type': 'application/json' };
if (key) headers['Authorization'] = 'Bearer ' + key;

fetch('/v1/models', { headers }).then(r => r.json()).then(j => {
  model = j.data[0].id; document.getElementById('model').textContent = model;
}).catch(() => {});

function add(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role; div.textContent = text;
  log.appendChild(div); log.scrollTop = log.scrollHeight;
  return div;
}

async function send(text) {
  history.push({ role: 'user', content: text });
  add('user', text);
  const out = add('assistant', '');
  out.dataset.streaming = '1';
  controller = new AbortController();
  sendBtn.disabled = true; stopBtn.disabled = false;
  // Decode speed: tokens after the first over the time since the first
  // arrived (the wait for the first token is prompt processing, not decode).
  let reply = '', n = 0, t0 = 0, t1 = 0, failed = false;
  const showSpeed = tokens => {
    const s = (t1 - t0) / 1000;
    if (tokens > 1 && s > 0) speed.textContent = ((tokens - 1) / s).toFixed(1) + ' tok/s';
  };
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers, signal: controller.signal,
      body: JSON.stringify({ model, messages: history, stream: true, stream_options: { include_usage: true } })
    });
    if (!r.ok) { const j = await r.json().catch(() => ({})); throw new Error((j.error && j.error.message) || r.statusText); }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const frame = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!frame.startsWith('data: ')) continue;
        const data = frame.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const d = j.choices && j.choices[0] && j.choices[0].delta;
        if (d && d.content) {
          t1 = performance.now();
          if (!t0) t0 = t1;
          reply += d.content; n++; out.textContent = reply; log.scrollTop = log.scrollHeight;
          showSpeed(n);
        }
        // The usage chunk counts tokens exactly (a delta may hold several).
        if (j.usage && j.usage.completion_tokens) showSpeed(j.usage.completion_tokens);
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError') { failed = true; add('error', 'error: ' + e.message); }
  } finally {
    // A turn that failed, or was stopped before any text, leaves the history
    // so that the next request does not carry it (an empty assistant turn).
    if (failed || !reply) history.pop(); else history.push({ role: 'assistant', content: reply });
    delete out.dataset.streaming; out.dataset.done = '1';
    controller = null; sendBtn.disabled = false; stopBtn.disabled = true; input.focus();
  }
}

document.getElementById('form').addEventListener('submit', e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || controller) return;
  input.value = ''; send(text);
});
input.addEventListener('keydown', e => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); document.getElementById('form').requestSubmit(); }
});
stopBtn.addEventListener('click', () => controller && controller.abort());
document.getElementById('clear').addEventListener('click', () => { if (!controller) { history = []; log.innerHTML = ''; speed.textContent = ''; } });
</script>
</body>
</html>
)HTML";
  return kPage;
}

}  // namespace rill::server
