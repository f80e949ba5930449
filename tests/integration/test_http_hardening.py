"""Issue 15, the HTTP layer of a real `rill serve`: what a client sends can
neither end the process nor change other clients' service. Oversized
trailers and headers (431), bad Transfer-Encoding (400), HEAD, /health's
methods, 405's Allow header, HTTP/1.0 streams, Expect: 100-continue, and
/metrics labels (route templates, escaped, bounded)."""
import http.client
import json
import socket

from conftest import API_KEY

AUTH = f"Authorization: Bearer {API_KEY}\r\n"


def raw(server, data, timeout=30, until=None):
    """Sends raw bytes; reads until the server closes (or `until` appears)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data if isinstance(data, bytes) else data.encode())
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
            if until is not None and until in out:
                break
        return out


def health_ok(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/health")
    r = conn.getresponse()
    r.read()
    conn.close()
    return r.status == 200


def test_huge_trailer_is_431_before_auth_and_the_server_lives(server):
    body = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            "2\r\n{}\r\n0\r\nX-Trailer: " + "t" * (70 << 10) + "\r\n\r\n")
    out = raw(server, body)
    assert out.startswith(b"HTTP/1.1 431"), out[:200]
    assert server.proc.poll() is None
    assert health_ok(server)


def test_huge_header_is_431_not_413(server):
    out = raw(server, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + "h" * (70 << 10) + "\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431"), out[:200]
    assert b"header" in out


def test_transfer_encoding_not_ending_in_chunked_is_400(server):
    # A valid request body: read by Content-Length (the old behaviour) it
    # would be answered 200.
    body = json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    out = raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
              f"Transfer-Encoding: xchunked\r\nContent-Length: {len(body)}\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert b"Transfer-Encoding" in out
    out = raw(server, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
              "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    assert b"Transfer-Encoding" in out


def test_head_sends_headers_only(server):
    out = raw(server, "HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out
    assert b"Content-Length: 15" in head  # the length of {"status":"ok"}
    assert rest == b""


def test_health_takes_get_and_head_only_and_405_has_allow(server):
    for method in ("POST", "DELETE", "PUT"):
        out = raw(server, f"{method} /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 405"), out[:200]
        assert b"Allow: GET, HEAD, OPTIONS\r\n" in out
    out = raw(server, "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH + "Connection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405"), out[:200]
    assert b"Allow: POST, OPTIONS\r\n" in out


def test_http10_stream_is_not_chunked(server):
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]})
    out = raw(server, "POST /v1/chat/completions HTTP/1.0\r\n" + AUTH +
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n" + body, timeout=120)
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), out[:300]
    assert b"Transfer-Encoding" not in head
    assert b"Connection: close" in head
    assert rest.startswith(b"data: ") and rest.rstrip().endswith(b"data: [DONE]"), rest[-200:]


def test_expect_100_continue_is_answered(server):
    body = json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH +
                   f"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n")
                  .encode())
        s.settimeout(5)
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), first
        s.sendall(body.encode())
        s.settimeout(120)
        out = first
        while b"\r\n\r\n" not in out[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]:
            out += s.recv(4096)
        assert b"HTTP/1.1 200" in out, out[:300]


def metrics_text(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
    r = conn.getresponse()
    text = r.read().decode()
    conn.close()
    assert r.status == 200
    return text


def test_metrics_labels_are_route_templates(server):
    for i in range(50):
        raw(server, f'GET /junk/{i}/"quoted"{"x" * 500} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
    raw(server, "GET /v1/responses/resp_abc HTTP/1.1\r\nHost: x\r\n" + AUTH + "Connection: close\r\n\r\n")
    text = metrics_text(server)
    assert "/junk/" not in text and '"quoted"' not in text
    routes = set()
    for line in text.splitlines():
        if line.startswith("rill_http_requests_total{"):
            labels = line[line.index("{") + 1:line.rindex("}")]
            route = labels.split('route="', 1)[1].split('",status=', 1)[0]
            routes.add(route)
            value = float(line.rsplit(" ", 1)[1])
            assert value >= 1
    assert "other" in routes
    assert "/v1/responses/{id}" in routes
    assert all(r == "other" or r.startswith("/") for r in routes)
    assert len(routes) <= 13
