"""Graceful shutdown: SIGTERM/SIGINT stop accepting, let running requests
finish within --shutdown-grace, end what is left with each API's error event
(OpenAI error chunk + [DONE], Anthropic `error`, Responses
`response.failed`) and exit 0; a second signal exits at once."""
import http.client
import json
import signal
import socket
import threading
import time

from conftest import Server


def open_stream(port, path, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    h = {"Content-Type": "application/json", "anthropic-version": "2023-06-01"}
    h.update(headers or {})
    conn.request("POST", path, body=json.dumps(body), headers=h)
    r = conn.getresponse()
    assert r.status == 200, r.read()
    return conn, r


def read_until_first_data(r):
    """Reads SSE lines until the first data line; returns the lines read."""
    lines = []
    while True:
        line = r.readline()
        assert line, "stream ended before its first event"
        lines.append(line)
        if line.startswith(b"data: "):
            return lines


def read_rest(r):
    out = []
    while True:
        line = r.readline()
        if not line:
            return out
        out.append(line)


def wait_exit(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except Exception:
        proc.kill()
        raise


def test_sigterm_lets_a_running_stream_finish_and_exits_0():
    s = Server("--shutdown-grace", "60")
    try:
        conn, r = open_stream(s.port, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Tell me about rivers."}],
                               "max_tokens": 120, "ignore_eos": True, "stream": True})
        read_until_first_data(r)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # No new connection is served once the signal arrived.
        with socket.socket() as c:
            c.settimeout(5)
            try:
                c.connect(("127.0.0.1", s.port))
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                reply = c.recv(100)
                assert reply == b"" or reply.startswith(b"HTTP/1.1 503"), reply
            except (ConnectionRefusedError, ConnectionResetError):
                pass
        rest = b"".join(read_rest(r))
        conn.close()
        assert b'"finish_reason":"length"' in rest, rest[-400:]
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert b'"error"' not in rest
        assert wait_exit(s.proc, 30) == 0
    finally:
        s.stop()


def test_grace_over_ends_each_api_stream_with_its_error_event_and_exits_0():
    s = Server("--shutdown-grace", "0")
    try:
        long_story = "Write a long story about a lighthouse keeper and the sea."
        streams = {
            "openai": open_stream(s.port, "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": long_story}],
                                   "max_tokens": 1500, "ignore_eos": True, "stream": True}),
            "anthropic": open_stream(s.port, "/v1/messages",
                                     {"model": "m", "max_tokens": 1500, "stream": True,
                                      "messages": [{"role": "user", "content": long_story}]}),
            "responses": open_stream(s.port, "/v1/responses",
                                     {"input": long_story, "max_output_tokens": 1500, "stream": True}),
        }
        for _, r in streams.values():
            read_until_first_data(r)
        s.proc.send_signal(signal.SIGINT)
        rest = {name: b"".join(read_rest(r)) for name, (_, r) in streams.items()}
        for conn, _ in streams.values():
            conn.close()
        assert b'"error"' in rest["openai"] and b"shutting down" in rest["openai"], rest["openai"][-400:]
        assert rest["openai"].rstrip().endswith(b"data: [DONE]")
        assert b"event: error" in rest["anthropic"] and b"shutting down" in rest["anthropic"], rest["anthropic"][-400:]
        assert b"event: message_stop" not in rest["anthropic"]
        assert b"event: response.failed" in rest["responses"], rest["responses"][-400:]
        assert b"shutting down" in rest["responses"]
        assert wait_exit(s.proc, 30) == 0
    finally:
        s.stop()


def test_a_second_signal_exits_at_once():
    s = Server("--shutdown-grace", "120")
    try:
        conn, r = open_stream(s.port, "/v1/chat/completions",
                              {"messages": [{"role": "user", "content": "Tell me about rivers."}],
                               "max_tokens": 1800, "ignore_eos": True, "stream": True})
        read_until_first_data(r)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert s.proc.poll() is None  # still draining the stream
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        code = wait_exit(s.proc, 10)
        assert time.time() - t0 < 5
        assert code != 0
        conn.close()
    finally:
        s.stop()
