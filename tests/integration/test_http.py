"""Raw HTTP: auth, CORS, limits, errors in the OpenAI shape, /health,
/metrics, /stats, disconnects, many concurrent streams."""
import http.client
import json
import socket
import threading
import time

from conftest import API_KEY, wait_idle


def request(server, method, path, body=None, headers=None, key=API_KEY):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), raw


def error_of(raw):
    body = json.loads(raw)
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


def test_health_is_open_and_the_rest_needs_the_key(server):
    status, _, raw = request(server, "GET", "/health", key=None)
    assert status == 200 and json.loads(raw)["status"] == "ok"
    status, _, raw = request(server, "GET", "/v1/models", key=None)
    assert status == 401
    assert error_of(raw)["type"] == "authentication_error"
    status, _, raw = request(server, "GET", "/v1/models", key="wrong")
    assert status == 401
    status, _, raw = request(server, "GET", "/v1/models", key=None, headers={"x-api-key": API_KEY})
    assert status == 200 and json.loads(raw)["data"][0]["object"] == "model"


def test_cors_preflight_and_headers(server):
    status, headers, _ = request(server, "OPTIONS", "/v1/chat/completions", key=None,
                                 headers={"Origin": "http://example.test",
                                          "Access-Control-Request-Method": "POST"})
    assert status == 204
    assert headers.get("Access-Control-Allow-Origin") == "http://example.test"
    _, headers, _ = request(server, "GET", "/v1/models", headers={"Origin": "http://other.test"})
    assert "Access-Control-Allow-Origin" not in headers


def test_body_cap_is_413(server):
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 300000}]})
    status, _, raw = request(server, "POST", "/v1/chat/completions", body=big)
    assert status == 413
    assert "limit" in error_of(raw)["message"]


def test_malformed_requests_are_400_naming_the_field(server):
    cases = [
        ("{not json", None),
        (json.dumps({"model": "m"}), "messages"),
        (json.dumps({"model": "m", "messages": "hi"}), "messages"),
        (json.dumps({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}), "messages[0].role"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}),
         "temperature"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}), "max_tokens"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 99}), "n"),
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}),
         "max_tokens"),
    ]
    for body, param in cases:
        status, _, raw = request(server, "POST", "/v1/chat/completions", body=body)
        assert status == 400, (body, raw)
        err = error_of(raw)
        assert err["type"] == "invalid_request_error"
        if param:
            assert err["param"] == param, (body, err)


def test_unknown_route_is_404_and_wrong_method_405(server):
    status, _, raw = request(server, "GET", "/v1/nothing")
    assert status == 404
    error_of(raw)
    status, _, _ = request(server, "GET", "/v1/chat/completions")
    assert status == 405


def test_metrics_and_stats(server):
    request(server, "POST", "/v1/chat/completions",
            body={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    status, headers, raw = request(server, "GET", "/metrics")
    text = raw.decode()
    assert status == 200
    for name in ["rill_http_requests_total", "rill_time_to_first_token_seconds_bucket",
                 "rill_inter_token_latency_seconds_count", "rill_kv_blocks_used", "rill_prefix_cache_hit_rate",
                 "rill_requests_running", "rill_batch_size_bucket", "rill_batch_size_count",
                 'rill_kv_tier_enabled{tier="ram"} 0', 'rill_kv_tier_bytes{tier="disk"}',
                 'rill_kv_tier_load_seconds_total{tier="ram"}', "rill_kv_tier_restored_tokens_total"]:
        assert name in text, name
    st = server.stats()
    assert st["engine"]["requests_finished"] >= 1
    assert "response_store" in st and "kv" in st
    assert st["kv"]["tiers"]["disk"]["enabled"] is False and st["kv"]["tiers"]["ram"]["hits"] == 0


def test_client_disconnect_cancels_the_generation(server):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Count to a thousand."}],
                       "max_tokens": 500, "stream": True, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    assert server.stats()["engine"]["active_requests"] >= 1
    s.close()
    st = wait_idle(server)
    assert st["engine"]["active_requests"] == 0


def test_64_concurrent_streaming_clients_all_complete(server, openai_client):
    results, errors = [], []

    def one(i):
        try:
            stream = openai_client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"Say a word about the number {i}."}],
                max_tokens=8, stream=True, temperature=0)
            text, finish = "", None
            for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            results.append((i, text, finish))
        except Exception as e:  # noqa: BLE001 - report every failure
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:3]
    assert len(results) == 64
    assert all(finish in ("stop", "length") for _, _, finish in results)
    assert wait_idle(server)["engine"]["active_requests"] == 0
    print(f"64 streams in {time.time() - t0:.1f} s")
