// rill's chat page. Conversations and settings live in this browser's
// localStorage; replies stream from /v1/chat/completions. Model output is
// untrusted: it is rendered as markdown (marked), then sanitized (DOMPurify)
// before it reaches the DOM, and the page's Content-Security-Policy runs no
// script but the page's own files.
'use strict';

const $ = id => document.getElementById(id);
const log = $('log'), input = $('input'), sendBtn = $('send'), stopBtn = $('stop'), speed = $('speed');

// ---- storage -------------------------------------------------------------

const kSettingsKey = 'rill.settings', kConversationsKey = 'rill.conversations', kCurrentKey = 'rill.current';
// Empty sampling fields leave the choice to the server (its flags, then the
// model's generation_config); max_tokens has a default so that a reply ends.
const kDefaultSettings = { system: '', temperature: '', top_p: '', max_tokens: 1024, thinking: '' };

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}
function save(key, value) {
  try { localStorage.setItem(key, JSON.stringify(value)); } catch (e) { /* full or disabled: keep going in memory */ }
}

let settings = Object.assign({}, kDefaultSettings, load(kSettingsKey, {}));
// conversation: { id, title, updated, messages: [message] }
// message: { role: 'user' | 'assistant', content, reasoning?, stats?, stopped?, finish?, error? }
let conversations = load(kConversationsKey, []);
if (!Array.isArray(conversations)) conversations = [];
let current = conversations.find(c => c.id === load(kCurrentKey, null)) || null;

function persist() {
  save(kConversationsKey, conversations);
  save(kCurrentKey, current ? current.id : null);
}

// ---- API -----------------------------------------------------------------

const key = new URLSearchParams(location.search).get('key');
const headers = { 'Content-Type': 'application/json' };
if (key) headers['Authorization'] = 'Bearer ' + key;
let model = '';

fetch('/v1/models', { headers }).then(r => r.json()).then(j => {
  model = j.data[0].id;
  $('model').textContent = model;
  $('model').title = j.data[0].context_length ? 'context: ' + j.data[0].context_length + ' tokens' : '';
}).catch(() => {});

// The messages the API sees: the system prompt, then the turns. A turn that
// failed before any text (the error shown in its place) is left out, with
// the user message that asked for it, so that roles keep alternating.
function api_messages(conv) {
  const out = [];
  if (settings.system.trim()) out.push({ role: 'system', content: settings.system });
  const m = conv.messages;
  for (let i = 0; i < m.length; i++) {
    const failed = next => next && next.role === 'assistant' && !next.content;
    if (m[i].role === 'user' && failed(m[i + 1])) { i++; continue; }
    if (m[i].role === 'assistant' && !m[i].content) continue;
    out.push({ role: m[i].role, content: m[i].content });
  }
  return out;
}

function request_body(conv) {
  const body = { model, messages: api_messages(conv), stream: true, stream_options: { include_usage: true } };
  const number = v => (v === '' || v === null || v === undefined || isNaN(Number(v))) ? null : Number(v);
  if (number(settings.temperature) !== null) body.temperature = number(settings.temperature);
  if (number(settings.top_p) !== null) body.top_p = number(settings.top_p);
  if (number(settings.max_tokens) !== null) body.max_tokens = Math.round(number(settings.max_tokens));
  if (settings.thinking === 'on' || settings.thinking === 'off') {
    body.chat_template_kwargs = { enable_thinking: settings.thinking === 'on' };
  } else if (settings.thinking) {
    body.reasoning_effort = settings.thinking;
  }
  return body;
}

// ---- markdown ------------------------------------------------------------

const kPurify = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select', 'dialog'],
  FORBID_ATTR: ['style', 'id', 'name'],
};
let markdown_ready = false;

function setup_markdown() {
  if (!window.marked || !window.DOMPurify || !window.hljs) return;
  // Links from model output open elsewhere and tell the target nothing.
  DOMPurify.addHook('afterSanitizeAttributes', node => {
    if (node.tagName === 'A') {
      node.setAttribute('target', '_blank');
      node.setAttribute('rel', 'noopener noreferrer');
    }
  });
  markdown_ready = true;
}

// Highlighting with a named language is cheap; guessing the language
// (highlightAuto tries every grammar) waits until the reply is complete.
function highlight(code, lang, final) {
  try {
    if (lang && hljs.getLanguage(lang)) return hljs.highlight(lang, code, true).value;
    if (final && code.length < 20000) return hljs.highlightAuto(code).value;
  } catch (e) { /* fall through to plain text */ }
  return null;  // marked escapes it
}

// Sanitizing is the last step: whatever marked or highlight.js produce from
// the model's text passes DOMPurify before it becomes HTML.
function render_markdown(el, text, final) {
  if (!markdown_ready) { el.textContent = text; el.classList.add('plain'); return; }
  const html = marked.parse(text, {
    gfm: true, breaks: false, headerIds: false, mangle: false,
    langPrefix: 'hljs language-', highlight: (code, lang) => highlight(code, lang, final),
  });
  el.innerHTML = DOMPurify.sanitize(html, kPurify);
  for (const pre of el.querySelectorAll('pre')) {
    const code = pre.querySelector('code');
    if (!code) continue;
    const bar = document.createElement('div');
    bar.className = 'code-bar';
    const lang = document.createElement('span');
    const m = /language-([\w+#.-]+)/.exec(code.className);
    lang.textContent = m ? m[1] : 'text';
    const copy = document.createElement('button');
    copy.type = 'button';
    copy.className = 'copy';
    copy.textContent = 'Copy';
    bar.append(lang, copy);
    pre.prepend(bar);
  }
}

async function copy_text(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try { await navigator.clipboard.writeText(text); return true; } catch (e) { /* fall back below */ }
  }
  const area = document.createElement('textarea');
  area.value = text;
  area.setAttribute('readonly', '');
  area.className = 'offscreen';
  document.body.appendChild(area);
  area.select();
  let ok = false;
  try { ok = document.execCommand('copy'); } catch (e) { ok = false; }
  area.remove();
  return ok;
}

log.addEventListener('click', async e => {
  const btn = e.target.closest('button.copy');
  if (!btn) return;
  let text;
  if (btn.dataset.copy === 'message') {
    const i = Number(btn.closest('.msg').dataset.index);
    text = current && current.messages[i] ? current.messages[i].content : '';
  } else {
    const code = btn.closest('pre').querySelector('code');
    text = code ? code.textContent : '';
  }
  const ok = await copy_text(text);
  btn.textContent = ok ? 'Copied' : 'Copy failed';
  setTimeout(() => { btn.textContent = 'Copy'; }, 1500);
});

// ---- rendering -----------------------------------------------------------

function format_stats(s) {
  if (!s) return '';
  const parts = [];
  if (s.tokens_per_s) parts.push(s.tokens_per_s.toFixed(1) + ' tok/s');
  if (s.ttft_ms !== undefined) parts.push('TTFT ' + Math.round(s.ttft_ms) + ' ms');
  if (s.completion_tokens !== undefined) parts.push(s.completion_tokens + ' tokens');
  if (s.prompt_tokens !== undefined) {
    parts.push((s.cached_tokens || 0) + ' of ' + s.prompt_tokens + ' prompt tokens cached');
  }
  return parts.join(' · ');
}

function message_element(msg, index) {
  const div = document.createElement('div');
  div.className = 'msg ' + msg.role;
  div.dataset.index = index;
  if (msg.role === 'user') {
    const body = document.createElement('div');
    body.className = 'body';
    body.textContent = msg.content;
    div.appendChild(body);
    return div;
  }
  const reasoning = document.createElement('details');
  reasoning.className = 'reasoning';
  const summary = document.createElement('summary');
  summary.textContent = 'Reasoning';
  const rbody = document.createElement('div');
  rbody.className = 'reasoning-body';
  reasoning.append(summary, rbody);
  const body = document.createElement('div');
  body.className = 'body markdown';
  const meta = document.createElement('div');
  meta.className = 'meta';
  const badge = document.createElement('span');
  badge.className = 'badge';
  const stats = document.createElement('span');
  stats.className = 'stats';
  const copy = document.createElement('button');
  copy.type = 'button';
  copy.className = 'copy';
  copy.dataset.copy = 'message';
  copy.textContent = 'Copy';
  meta.append(badge, stats, copy);
  div.append(reasoning, body, meta);
  update_message(div, msg, true);
  return div;
}

// Brings an assistant message's element up to date with `msg`.
function update_message(div, msg, final) {
  const reasoning = div.querySelector('.reasoning');
  reasoning.hidden = !msg.reasoning;
  reasoning.querySelector('.reasoning-body').textContent = msg.reasoning || '';
  reasoning.querySelector('summary').textContent =
      !final && !msg.content ? 'Thinking…' : 'Reasoning';
  const body = div.querySelector('.body');
  render_markdown(body, msg.content, final);
  body.hidden = !msg.content && (final || msg.reasoning);  // streaming, an empty body shows the cursor
  const badge = div.querySelector('.badge');
  badge.textContent = msg.stopped ? 'stopped' : msg.finish === 'length' ? 'cut at max tokens' : '';
  badge.hidden = !badge.textContent;
  div.dataset.stopped = msg.stopped ? '1' : '';
  if (!msg.stopped) delete div.dataset.stopped;
  div.querySelector('.stats').textContent = format_stats(msg.stats);
  div.querySelector('.meta').hidden = !final || (!msg.content && !msg.stopped && !msg.reasoning);
  div.querySelector('.meta .copy').hidden = !msg.content;
  let err = div.nextElementSibling && div.nextElementSibling.classList.contains('error') ? div.nextElementSibling : null;
  if (msg.error && !err) {
    err = document.createElement('div');
    err.className = 'msg error';
    div.after(err);
  }
  if (err) {
    if (msg.error) err.textContent = 'error: ' + msg.error; else err.remove();
  }
}

function render_log() {
  log.replaceChildren();
  if (!current || !current.messages.length) {
    const empty = document.createElement('div');
    empty.className = 'empty';
    empty.textContent = 'Ask anything.';
    log.appendChild(empty);
    return;
  }
  current.messages.forEach((m, i) => {
    const el = message_element(m, i);
    el.dataset.done = '1';
    log.appendChild(el);
  });
  log.scrollTop = log.scrollHeight;
}

function render_sidebar() {
  const nav = $('conversations');
  nav.replaceChildren();
  const sorted = conversations.slice().sort((a, b) => b.updated - a.updated);
  for (const c of sorted) {
    const item = document.createElement('div');
    item.className = 'conversation' + (current && c.id === current.id ? ' current' : '');
    item.dataset.id = c.id;
    const title = document.createElement('button');
    title.type = 'button';
    title.className = 'title';
    title.textContent = c.title || 'New chat';
    title.title = c.title || '';
    const del = document.createElement('button');
    del.type = 'button';
    del.className = 'delete';
    del.textContent = '×';
    del.title = 'Delete this conversation';
    del.setAttribute('aria-label', 'Delete conversation');
    item.append(title, del);
    nav.appendChild(item);
  }
}

$('conversations').addEventListener('click', e => {
  const item = e.target.closest('.conversation');
  if (!item) return;
  const id = item.dataset.id;
  if (e.target.closest('.delete')) {
    if (current && current.id === id) { abort_stream(); current = null; }
    conversations = conversations.filter(c => c.id !== id);
  } else if (!current || current.id !== id) {
    abort_stream();
    current = conversations.find(c => c.id === id) || null;
  }
  persist();
  render_sidebar();
  render_log();
});

// ---- streaming -----------------------------------------------------------

// The reply being streamed: { controller, conv, msg, el }. Aborting it
// (Stop, New chat, switching or deleting a conversation) closes the
// connection, which cancels the generation on the server.
let stream = null;

function abort_stream() {
  if (!stream) return;
  const s = stream;
  stream = null;  // the page is free for the next message at once
  s.msg.stopped = true;
  s.controller.abort();
  set_busy(false);
}

function set_busy(busy) {
  sendBtn.disabled = busy;
  stopBtn.disabled = !busy;
}

function near_bottom() {
  return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
}

async function send(text) {
  if (!current) {
    current = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: '', updated: 0, messages: [] };
    conversations.push(current);
  }
  const conv = current;
  if (!conv.title) conv.title = text.replace(/\s+/g, ' ').slice(0, 60);
  conv.messages.push({ role: 'user', content: text });
  const body = request_body(conv);
  const msg = { role: 'assistant', content: '', reasoning: '' };
  conv.messages.push(msg);
  conv.updated = Date.now();
  persist();
  render_sidebar();
  render_log();
  const el = log.lastElementChild;
  el.dataset.streaming = '1';
  delete el.dataset.done;
  update_message(el, msg, false);

  const controller = new AbortController();
  stream = { controller, conv, msg, el };
  set_busy(true);
  const t_sent = performance.now();
  let t_first = 0, t_last = 0, n_deltas = 0, usage = null, pending = false;
  const visible = () => current === conv && el.isConnected;
  // Renders at most once per frame: markdown of a long reply is re-parsed
  // whole, so per-delta rendering would fall behind a fast model.
  const schedule = () => {
    if (pending || !visible()) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (!visible() || !stream || stream.msg !== msg) return;
      const follow = near_bottom();
      update_message(el, msg, false);
      if (follow) log.scrollTop = log.scrollHeight;
    });
  };
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers, signal: controller.signal, body: JSON.stringify(body),
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || r.status + ' ' + r.statusText);
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      // Deltas are timed by the read that brought them: a burst that came
      // in one read has no measurable speed.
      const t_read = performance.now();
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const frame = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (!frame.startsWith('data: ')) continue;
        const data = frame.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) throw new Error(j.error.message);
        const choice = j.choices && j.choices[0];
        const d = choice && choice.delta;
        if (d && (d.content || d.reasoning_content)) {
          t_last = t_read;
          if (!t_first) t_first = t_read;
          n_deltas++;
          if (d.reasoning_content) msg.reasoning += d.reasoning_content;
          if (d.content) msg.content += d.content;
          schedule();
        }
        if (choice && choice.finish_reason) msg.finish = choice.finish_reason;
        if (j.usage) usage = j.usage;
      }
    }
  } catch (e) {
    if (e.name === 'AbortError') msg.stopped = true;
    else if (!msg.stopped) msg.error = e.message;
  } finally {
    // Decode speed: tokens after the first over the time since the first
    // arrived (the wait for the first token is prompt processing).
    const n_tokens = usage && usage.completion_tokens ? usage.completion_tokens : n_deltas;
    const stats = {};
    if (t_first) stats.ttft_ms = t_first - t_sent;
    if (n_tokens > 1 && t_last > t_first) stats.tokens_per_s = (n_tokens - 1) / ((t_last - t_first) / 1000);
    if (usage) {
      stats.completion_tokens = usage.completion_tokens;
      stats.prompt_tokens = usage.prompt_tokens;
      stats.cached_tokens = (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0;
    }
    msg.stats = stats;
    if (stats.tokens_per_s && current === conv) speed.textContent = stats.tokens_per_s.toFixed(1) + ' tok/s';
    conv.updated = Date.now();
    if (stream && stream.msg === msg) stream = null;
    persist();
    if (el.isConnected) {
      update_message(el, msg, true);
      delete el.dataset.streaming;
      el.dataset.done = '1';
      if (near_bottom() || msg.error) log.scrollTop = log.scrollHeight;
    }
    set_busy(stream !== null);
    if (current === conv) input.focus();
  }
}

// ---- controls ------------------------------------------------------------

$('form').addEventListener('submit', e => {
  e.preventDefault();
  const text = input.value.trim();
  if (!text || stream) return;
  input.value = '';
  send(text);
});
input.addEventListener('keydown', e => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $('form').requestSubmit();
  }
});
stopBtn.addEventListener('click', abort_stream);
$('new-chat').addEventListener('click', () => {
  abort_stream();
  current = null;
  speed.textContent = '';
  persist();
  render_sidebar();
  render_log();
  input.focus();
});

// Settings apply from the next request on and are saved as they change.
const kSettingFields = {
  system: $('set-system'), temperature: $('set-temperature'), top_p: $('set-top-p'),
  max_tokens: $('set-max-tokens'), thinking: $('set-thinking'),
};
function show_settings() {
  for (const [k, el] of Object.entries(kSettingFields)) el.value = settings[k] === undefined ? '' : settings[k];
}
for (const [k, el] of Object.entries(kSettingFields)) {
  el.addEventListener('input', () => {
    settings[k] = el.value;
    save(kSettingsKey, settings);
  });
}
$('open-settings').addEventListener('click', () => { show_settings(); $('settings').showModal(); });
$('close-settings').addEventListener('click', () => $('settings').close());
$('reset-settings').addEventListener('click', () => {
  settings = Object.assign({}, kDefaultSettings);
  save(kSettingsKey, settings);
  show_settings();
});

setup_markdown();
render_sidebar();
render_log();
