#!/usr/bin/env python3
"""Benchmark of `rill serve` against the engine driven directly (`rill bench`), one run.

Same machine, same model, same thread count; P prompt ids, G generated:
  compare  direct and served at concurrency 1, interleaved, median of --repeats:
           direct   `rill bench --concurrency 1 --json` (random ids, EOS
                    ignored): decode tok/s from a one-request process, TTFT
                    from requests 2-3 of a `--requests 3` process (warm, as
                    the server is; the cold first TTFT is reported too)
           served   `rill serve` (warmed up by one request), POST
                    /v1/completions, a fresh random P-id prompt (no prefix
                    cache hit), max_tokens G, ignore_eos, temperature 0,
                    stream: TTFT = request sent -> first text chunk; decode
                    tok/s = (completion_tokens - 1) / (first text chunk ->
                    finish chunk), as `rill bench` counts it
           -> served/direct decode ratio and TTFT difference
  load     concurrency 1, 8, 32 streaming clients (threads), max(4, 2 x c)
           requests per level, --load-gen-tokens each
           -> aggregate output tok/s, TTFT / ITL / request latency p50 p99
              (ITL is between SSE text chunks, normally one token each),
              and the engine steps the level took (/stats). --client-procs N
              spreads the clients over N processes: at c=64 on an H200 one
              Python process read the ITL 13% long (docs/perf.md)
  idle     a second server with --max-running 8 and 1,024 streaming
           requests open at once (8 decode, the rest wait in the queue);
           -> server RSS before / while open (VmRSS, RssAnon), the cost per
              stream, and after closing every connection /stats must show
              no active request and no open stream
Prints a markdown table and writes JSON (date, machine, commands, results)
to --out. Python 3 standard library only: raw sockets, HTTP/1.1 chunked
SSE parsed here, so it runs anywhere the rill binary runs.
"""
import argparse
import asyncio
import datetime
import http.client
import json
import multiprocessing
import os
import random
import re
import resource
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time

from bench_common import cpu_name

now = time.perf_counter


# ---------------------------------------------------------------- utilities

def percentile(v, p):
    """Linear interpolation between closest ranks (as `rill bench` does)."""
    if not v:
        return 0.0
    v = sorted(v)
    idx = p * (len(v) - 1)
    lo = int(idx)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (idx - lo)


def proc_mem_kb(pid):
    """VmRSS, RssAnon, RssFile and VmHWM of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = need if hard == resource.RLIM_INFINITY else min(max(soft, need), hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ------------------------------------------------------- HTTP / SSE parsing

class SseParser:
    """Incremental parser of one HTTP/1.1 response carrying SSE.

    feed(bytes) returns the complete SSE `data:` payloads seen so far (str).
    Handles chunked and close-delimited bodies; `done` once the body ended
    or `data: [DONE]` arrived."""

    def __init__(self):
        self.buf = b""
        self.status = None
        self.headers = {}
        self.chunked = False
        self.chunk_left = None  # bytes left in the current chunk; None: at a size line
        self.sse = b""
        self.done = False

    def feed(self, data):
        self.buf += data
        events = []
        if self.status is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return events
            head = self.buf[:end].decode("latin-1").split("\r\n")
            self.buf = self.buf[end + 4:]
            self.status = int(head[0].split()[1])
            for line in head[1:]:
                k, _, v = line.partition(":")
                self.headers[k.strip().lower()] = v.strip()
            self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if self.chunked:
            while not self.done:
                if self.chunk_left is None:  # at a chunk-size line
                    eol = self.buf.find(b"\r\n")
                    if eol < 0:
                        break
                    size = int(self.buf[:eol].split(b";")[0], 16)
                    self.buf = self.buf[eol + 2:]
                    if size == 0:
                        self.done = True
                        break
                    self.chunk_left = size
                elif self.chunk_left > 0:  # inside a chunk's data
                    if not self.buf:
                        break
                    take = min(self.chunk_left, len(self.buf))
                    self.sse += self.buf[:take]
                    self.buf = self.buf[take:]
                    self.chunk_left -= take
                else:  # the CRLF after a chunk's data
                    if len(self.buf) < 2:
                        break
                    self.buf = self.buf[2:]
                    self.chunk_left = None
        else:
            self.sse += self.buf
            self.buf = b""
        while True:
            sep = self.sse.find(b"\n\n")
            if sep < 0:
                break
            block, self.sse = self.sse[:sep], self.sse[sep + 2:]
            data = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if data:
                payload = b"\n".join(data).decode("utf-8", "replace")
                if payload == "[DONE]":
                    self.done = True
                events.append(payload)
        return events

    def close(self):
        self.done = True


def request_bytes(port, path, body):
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    return head.encode() + payload


class Trace:
    """Timings of one streamed completion (perf_counter seconds)."""

    def __init__(self):
        self.sent = self.first = self.finish = self.end = None
        self.text_times = []
        self.usage = None
        self.finish_reason = None
        self.status = None
        self.error = None

    def on_event(self, t, payload):
        if payload == "[DONE]":
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.error = f"bad SSE payload: {payload[:200]}"
            return
        if "error" in obj:
            self.error = json.dumps(obj["error"])[:300]
            return
        if obj.get("usage"):
            self.usage = obj["usage"]
        for ch in obj.get("choices") or []:
            if ch.get("text"):
                self.text_times.append(t)
                if self.first is None:
                    self.first = t
            if ch.get("finish_reason") is not None:
                self.finish = t
                self.finish_reason = ch["finish_reason"]

    def completion_tokens(self):
        return (self.usage or {}).get("completion_tokens", 0)

    def ok(self):
        return self.error is None and self.status == 200 and self.first is not None and self.finish is not None


def stream_completion(port, body, timeout):
    """One streamed /v1/completions over a fresh blocking socket."""
    tr = Trace()
    parser = SseParser()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            req = request_bytes(port, "/v1/completions", body)
            deadline = now() + timeout
            tr.sent = now()
            s.sendall(req)
            while not parser.done:
                s.settimeout(max(0.1, deadline - now()))
                data = s.recv(65536)
                t = now()
                if not data:
                    break
                for ev in parser.feed(data):
                    tr.on_event(t, ev)
            tr.end = now()
    except (OSError, ValueError) as e:
        tr.error = f"{type(e).__name__}: {e}"
    tr.status = parser.status
    if tr.status not in (None, 200) and tr.error is None:
        tr.error = f"HTTP {tr.status}: {(parser.sse + parser.buf)[:300]!r}"
    return tr


def get_json(port, path, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return json.loads(r.read())
    finally:
        c.close()


# ------------------------------------------------------------------ server

class Server:
    """A `rill serve` child on a free port (--port 0, the port read back from stdout)."""

    def __init__(self, rill, model, threads, extra, log_path, start_timeout=300):
        self.cmd = [rill, "serve", model, "--port", "0", "--threads", str(threads), *map(str, extra)]
        self.log = open(log_path, "a")
        self.log.write(f"\n$ {' '.join(self.cmd)}\n")
        self.log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        got = threading.Event()

        def pump():  # keep reading stdout so the pipe never fills
            for line in self.proc.stdout:
                if self.log.closed:  # stop() closed the log; the child's last lines go nowhere
                    break
                self.log.write(line)
                self.log.flush()
                m = re.search(r"listening on http://[^:\s]+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    got.set()
            got.set()

        threading.Thread(target=pump, daemon=True).start()
        if not got.wait(start_timeout) or self.port is None:
            self.stop()
            raise RuntimeError(f"rill serve did not start (see {log_path})")
        deadline = time.time() + 30
        while True:
            try:
                if get_json(self.port, "/health") is not None:
                    break
            except (OSError, ValueError):
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("rill serve: /health never answered")
            time.sleep(0.1)

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ----------------------------------------------------------------- phases

def rill_json(cmd, timeout):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout).stdout
    return json.loads(out)


def completion_body(rng, n_vocab, prompt_tokens, max_tokens):
    return {"prompt": [rng.randrange(n_vocab) for _ in range(prompt_tokens)], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


def check(tr, want_tokens):
    if not tr.ok():
        raise RuntimeError(f"a streamed request failed: {tr.error or 'no text/finish chunk'} (HTTP {tr.status})")
    if want_tokens and tr.completion_tokens() != want_tokens:
        raise RuntimeError(f"expected {want_tokens} completion tokens, got {tr.completion_tokens()} "
                           f"(finish_reason {tr.finish_reason})")


def run_compare(a, srv, rng, n_vocab):
    """Direct and served at concurrency 1, interleaved so both see the same machine load.

    Each repeat: (1) `rill bench --requests 1` -> direct decode tok/s (and its
    cold TTFT, the first request of a fresh process); (2) `rill bench
    --requests 3 --gen-tokens 2` -> direct warm TTFT (median of requests 2 and
    3: the first request of a process pays ~200 ms of first-use costs the
    warmed-up server does not); (3) one streamed request to the server."""
    base = [a.rill, "bench", a.model, "--concurrency", "1", "--prompt-tokens", str(a.prompt_tokens),
            "--threads", str(a.threads), "--json"]
    decode_cmd = base + ["--gen-tokens", str(a.gen_tokens)]
    ttft_cmd = base + ["--requests", "3", "--gen-tokens", "2"]
    check(stream_completion(srv.port, completion_body(rng, n_vocab, a.prompt_tokens, a.gen_tokens), a.timeout),
          a.gen_tokens)  # warm-up
    direct, served = [], []
    for i in range(a.repeats):
        d = rill_json(decode_cmd + ["--seed", str(1000 + i)], a.timeout)
        t = rill_json(ttft_cmd + ["--seed", str(2000 + i)], a.timeout)
        direct.append({"decode_tok_s": d["decode_tok_s"], "itl_ms_p50": d["itl_ms"]["p50"],
                       "cold_ttft_ms": d["ttft_ms"]["p50"], "ttft_ms": statistics.median(t["ttft_ms_each"][1:]),
                       "ttft_ms_each": t["ttft_ms_each"]})
        tr = stream_completion(srv.port, completion_body(rng, n_vocab, a.prompt_tokens, a.gen_tokens), a.timeout)
        check(tr, a.gen_tokens)
        served.append({"decode_tok_s": (tr.completion_tokens() - 1) / (tr.finish - tr.first),
                       "ttft_ms": (tr.first - tr.sent) * 1e3,
                       "text_chunks": len(tr.text_times),
                       "cached_tokens": tr.usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)})
    med = lambda runs, k: statistics.median(r[k] for r in runs)
    return ({"decode_command": " ".join(decode_cmd) + " --seed <1000+i>",
             "ttft_command": " ".join(ttft_cmd) + " --seed <2000+i>", "runs": direct,
             "decode_tok_s": med(direct, "decode_tok_s"), "ttft_ms": med(direct, "ttft_ms"),
             "cold_ttft_ms": med(direct, "cold_ttft_ms")},
            {"command": " ".join(srv.cmd), "request": "POST /v1/completions {prompt: [P random ids], max_tokens: G, "
             "temperature: 0, ignore_eos: true, stream: true}", "runs": served,
             "decode_tok_s": med(served, "decode_tok_s"), "ttft_ms": med(served, "ttft_ms")})


def _load_worker_process(port, bodies, timeout, n_threads, counter, out):
    """One client process of a load level: n_threads streaming clients that take
    the next request index from the shared counter; sends (index, Trace) pairs."""
    def worker():
        while True:
            with counter.get_lock():
                i = counter.value
                counter.value += 1
            if i >= len(bodies):
                return
            out.put((i, stream_completion(port, bodies[i], timeout)))

    ths = [threading.Thread(target=worker) for _ in range(n_threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    out.put(None)


def run_load_level(a, srv, n_vocab, conc, n_req, seed):
    rng = random.Random(seed)
    bodies = [completion_body(rng, n_vocab, a.prompt_tokens, a.load_gen_tokens) for _ in range(n_req)]
    traces = [None] * n_req
    procs = max(1, min(a.client_procs, conc))
    st0 = get_json(srv.port, "/stats")["engine"]
    t0 = now()
    if procs == 1:
        lock = threading.Lock()
        next_i = [0]

        def worker():
            while True:
                with lock:
                    i = next_i[0]
                    next_i[0] += 1
                if i >= n_req:
                    return
                traces[i] = stream_completion(srv.port, bodies[i], a.timeout)

        ths = [threading.Thread(target=worker) for _ in range(conc)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
    else:
        # One Python process runs out of interpreter time parsing ~10k SSE
        # chunks a second at c=64 on a fast GPU, and its delays would count as
        # the server's ITL; spread the clients over processes (perf_counter is
        # CLOCK_MONOTONIC, comparable across them).
        ctx = multiprocessing.get_context("fork")
        counter, out = ctx.Value("l", 0), ctx.Queue()
        ps = [ctx.Process(target=_load_worker_process,
                          args=(srv.port, bodies, a.timeout, conc // procs + (k < conc % procs), counter, out))
              for k in range(procs)]
        for p in ps:
            p.start()
        finished = 0
        while finished < procs:
            item = out.get()
            if item is None:
                finished += 1
            else:
                traces[item[0]] = item[1]
        for p in ps:
            p.join()
    wall = now() - t0
    for tr in traces:
        check(tr, a.load_gen_tokens)
    ttft = [(t.first - t.sent) * 1e3 for t in traces]
    lat = [(t.finish - t.sent) * 1e3 for t in traces]
    itl = [(y - x) * 1e3 for t in traces for x, y in zip(t.text_times, t.text_times[1:])]
    n_tok = sum(t.completion_tokens() for t in traces)
    pct = lambda v: {"p50": percentile(v, 0.5), "p99": percentile(v, 0.99), "max": max(v) if v else 0}
    st1 = get_json(srv.port, "/stats")["engine"]
    return {"concurrency": conc, "requests": n_req, "gen_tokens": a.load_gen_tokens, "wall_s": wall,
            "client_procs": procs, "engine_steps": st1["steps"] - st0["steps"],
            "engine_steps_pipelined": st1["steps_pipelined"] - st0["steps_pipelined"],
            "output_tok_s": n_tok / wall, "requests_per_s": n_req / wall,
            "ttft_ms": pct(ttft), "itl_ms": pct(itl), "latency_ms": pct(lat)}


async def _idle(port, n, body_fn, open_timeout, hold_s, pid, stats_fn):
    """Opens n streams (headers received), samples memory while all are open, closes them."""
    opened = 0
    all_open = asyncio.Event()
    stop = asyncio.Event()
    sem = asyncio.Semaphore(64)  # connection set-up in waves of 64
    failures = []

    async def one(i):
        nonlocal opened
        writer = None
        try:
            async with sem:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
                writer.write(request_bytes(port, "/v1/completions", body_fn(i)))
                await writer.drain()
                p = SseParser()
                while p.status is None:
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionError("closed before the headers")
                    p.feed(data)
                if p.status != 200:
                    raise ConnectionError(f"HTTP {p.status}")
            opened += 1
            if opened == n:
                all_open.set()
            while not stop.is_set():  # drain what the decoding streams send
                read = asyncio.ensure_future(reader.read(65536))
                stopper = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait({read, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if read in done:
                    if not read.result():
                        raise ConnectionError("closed early")
                    stopper.cancel()
                else:
                    read.cancel()
        except Exception as e:  # noqa: BLE001 (reported, not fatal to the others)
            failures.append(f"stream {i}: {type(e).__name__}: {e}")
            all_open.set() if len(failures) + opened >= n else None
        finally:
            if writer is not None:
                writer.close()

    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    t0 = now()
    try:
        await asyncio.wait_for(all_open.wait(), open_timeout)
    except asyncio.TimeoutError:
        pass
    open_s = now() - t0
    samples = []
    queued_s = None
    if not failures and opened == n:
        # The engine publishes its stats after each step: wait until it shows every request.
        loop = asyncio.get_running_loop()
        while now() - t0 < open_timeout:
            st = await loop.run_in_executor(None, stats_fn)
            if st["engine"]["running"] + st["engine"]["waiting"] >= n:
                queued_s = now() - t0
                break
            await asyncio.sleep(0.1)
        for _ in range(max(1, int(hold_s / 0.5))):
            st = await asyncio.get_running_loop().run_in_executor(None, stats_fn)
            samples.append({"t_s": now() - t0, "mem_kb": proc_mem_kb(pid), "open_streams": st["http"]["open_streams"],
                            "running": st["engine"]["running"], "waiting": st["engine"]["waiting"],
                            "kv_blocks_used": st["kv"]["blocks_used"],
                            "kv_block_size": st["kv"]["block_size"]})
            await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"opened": opened, "open_s": open_s, "in_engine_s": queued_s, "failures": failures[:10],
            "n_failures": len(failures),
            "samples": samples}


def run_idle(a, n_vocab, inspect, log_path):
    extra = ["--max-running", a.idle_max_running]
    with Server(a.rill, a.model, a.threads, extra, log_path) as srv:
        rng = random.Random(7)
        check(stream_completion(srv.port, completion_body(rng, n_vocab, a.idle_prompt_tokens, 8), a.timeout), 8)
        time.sleep(0.5)
        before = proc_mem_kb(srv.pid)
        bodies = [completion_body(rng, n_vocab, a.idle_prompt_tokens, a.idle_max_tokens) for _ in range(a.idle_streams)]
        res = asyncio.run(_idle(srv.port, a.idle_streams, lambda i: bodies[i], a.timeout, a.idle_hold_s,
                                srv.pid, lambda: get_json(srv.port, "/stats")))
        # After every client went away: no active request, no open stream.
        deadline = time.time() + 30
        while True:
            st = get_json(srv.port, "/stats")
            clean = st["engine"]["active_requests"] == 0 and st["http"]["open_streams"] == 0
            if clean or time.time() > deadline:
                break
            time.sleep(0.2)
        after = proc_mem_kb(srv.pid)
        res.update({"command": " ".join(srv.cmd), "streams": a.idle_streams, "prompt_tokens": a.idle_prompt_tokens,
                    "max_tokens": a.idle_max_tokens, "mem_before_kb": before, "mem_after_close_kb": after,
                    "stats_after_close": {"active_requests": st["engine"]["active_requests"],
                                          "open_streams": st["http"]["open_streams"],
                                          "open_connections": st["http"]["open_connections"],
                                          "requests_finished": st["engine"]["requests_finished"]},
                    "clean_after_close": clean})
        if res["samples"]:
            first = res["samples"][0]
            peak = max(s["mem_kb"]["VmRSS"] for s in res["samples"])
            res["rss_open_kb"] = first["mem_kb"]["VmRSS"]
            res["rss_open_peak_kb"] = peak
            res["rss_delta_kb"] = first["mem_kb"]["VmRSS"] - before["VmRSS"]
            res["anon_delta_kb"] = first["mem_kb"].get("RssAnon", 0) - before.get("RssAnon", 0)
            res["per_stream_kb"] = res["rss_delta_kb"] / a.idle_streams
            # The decoding streams' KV (f16 K and V per layer, per position) is part of the delta.
            hd = inspect["n_embd"] // inspect["n_head"]
            kv_pos = inspect["n_layer"] * inspect["n_head_kv"] * hd * 2 * 2
            res["kv_bytes_per_position_f16"] = kv_pos
            res["kv_used_kb_at_first_sample"] = first["kv_blocks_used"] * first["kv_block_size"] * kv_pos / 1024
        return res


# -------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rill", default="build/rill")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="direct / served measurements (median)")
    ap.add_argument("--levels", default="1,8,32", help="load generator concurrencies")
    ap.add_argument("--load-gen-tokens", type=int, default=64)
    ap.add_argument("--client-procs", type=int, default=1,
                    help="load generator processes (threads split over them); 1: all threads in this process")
    ap.add_argument("--idle-streams", type=int, default=1024)
    ap.add_argument("--idle-max-running", type=int, default=8)
    ap.add_argument("--idle-prompt-tokens", type=int, default=16)
    ap.add_argument("--idle-max-tokens", type=int, default=4096)
    ap.add_argument("--idle-hold-s", type=float, default=2.0, help="how long the idle streams stay open")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for any one request or command")
    ap.add_argument("--skip", default="", help="comma list of phases to skip: compare,load,idle")
    ap.add_argument("--server-args", default="", help="extra `rill serve` flags for the compare/load server, "
                    "e.g. '--max-step-ms 0'")
    ap.add_argument("--out", default="build/bench/serve_bench.json")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    log_path = os.path.splitext(a.out)[0] + ".server.log"
    open(log_path, "w").close()
    fd_limit = raise_fd_limit(a.idle_streams + 512)

    inspect = rill_json([a.rill, "inspect", a.model, "--json"], a.timeout)
    n_vocab = int(inspect["n_vocab"])
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs", "threads": a.threads,
           "model": a.model, "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens,
           "load_avg_at_start": os.getloadavg(), "fd_limit": fd_limit, "server_log": log_path,
           "command": " ".join(sys.argv)}

    if not {"compare", "load"} <= skip:
        with Server(a.rill, a.model, a.threads, shlex.split(a.server_args), log_path) as srv:
            rng = random.Random(42)
            if "compare" not in skip:
                print("direct (rill bench) vs served (/v1/completions), concurrency 1 ...", file=sys.stderr)
                res["direct"], res["served"] = run_compare(a, srv, rng, n_vocab)
            if "load" not in skip:
                res["load"] = {"command": " ".join(srv.cmd), "levels": []}
                for c in map(int, a.levels.split(",")):
                    print(f"load: concurrency {c} ...", file=sys.stderr)
                    res["load"]["levels"].append(run_load_level(a, srv, n_vocab, c, max(4, 2 * c), 100 + c))
            st = get_json(srv.port, "/stats")
            res["server_stats_end"] = {"engine": st["engine"], "http": st["http"]}
            res["server_mem_end_kb"] = proc_mem_kb(srv.pid)
    if "idle" not in skip:
        print(f"idle: {a.idle_streams} open streams ...", file=sys.stderr)
        res["idle"] = run_idle(a, n_vocab, inspect, log_path)
    res["load_avg_at_end"] = os.getloadavg()

    if "direct" in res and "served" in res:
        d, s = res["direct"], res["served"]
        res["summary"] = {"decode_served_over_direct": s["decode_tok_s"] / d["decode_tok_s"],
                          "ttft_served_minus_direct_ms": s["ttft_ms"] - d["ttft_ms"]}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)

    la = res["load_avg_at_start"]
    print(f"{res['date']} | {res['machine']} | {a.threads} threads | load {la[0]:.2f} at start, "
          f"{res['load_avg_at_end'][0]:.2f} at end | {a.model}")
    print()
    if "direct" in res or "served" in res:
        print(f"P={a.prompt_tokens} prompt ids, G={a.gen_tokens} generated, concurrency 1, median of {a.repeats}")
        print()
        print("| | decode tok/s | TTFT ms |")
        print("|---|---|---|")
        d = res["direct"]
        print(f"| direct (rill bench) | {d['decode_tok_s']:.1f} | {d['ttft_ms']:.1f} (first request of a process: "
              f"{d['cold_ttft_ms']:.1f}) |")
        print(f"| served (HTTP, streamed) | {res['served']['decode_tok_s']:.1f} | {res['served']['ttft_ms']:.1f} |")
        if "summary" in res:
            sm = res["summary"]
            print(f"| served vs direct | {100 * sm['decode_served_over_direct']:.1f}% (target >= 98%) "
                  f"| {sm['ttft_served_minus_direct_ms']:+.1f} ms (target <= 5) |")
        print()
    if "load" in res:
        print(f"Load generator: P={a.prompt_tokens}, {a.load_gen_tokens} generated per request, streaming")
        print()
        print("| concurrency | client processes | requests | output tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms "
              "| latency p50 / p99 ms | engine steps (pipelined) |")
        print("|---|---|---|---|---|---|---|---|")
        for lv in res["load"]["levels"]:
            print(f"| {lv['concurrency']} | {lv['client_procs']} | {lv['requests']} | {lv['output_tok_s']:.1f} "
                  f"| {lv['ttft_ms']['p50']:.1f} / {lv['ttft_ms']['p99']:.1f} "
                  f"| {lv['itl_ms']['p50']:.1f} / {lv['itl_ms']['p99']:.1f} "
                  f"| {lv['latency_ms']['p50']:.0f} / {lv['latency_ms']['p99']:.0f} "
                  f"| {lv['engine_steps']} ({lv['engine_steps_pipelined']}) |")
        print()
    if "idle" in res:
        i = res["idle"]
        print(f"Idle streams: {i['streams']} streaming requests open at once (--max-running {a.idle_max_running}: "
              f"{a.idle_max_running} decode, the rest queued)")
        print()
        print("| measure | value |")
        print("|---|---|")
        print(f"| streams open | {i['opened']} of {i['streams']} in {i['open_s']:.2f} s, all in the engine at "
              f"{i['in_engine_s'] or float('nan'):.2f} s"
              f"{' (%d failed: %s)' % (i['n_failures'], i['failures'][:1]) if i['n_failures'] else ''} |")
        if "rss_open_kb" in i:
            print(f"| server RSS before / all open | {i['mem_before_kb']['VmRSS'] / 1024:.1f} / "
                  f"{i['rss_open_kb'] / 1024:.1f} MiB (peak while held {i['rss_open_peak_kb'] / 1024:.1f}) |")
            kv = i["kv_used_kb_at_first_sample"]
            print(f"| cost per open stream | {i['per_stream_kb']:.1f} KiB RSS (anon {i['anon_delta_kb'] / i['streams']:.1f} KiB); "
                  f"{(i['rss_delta_kb'] - kv) / i['streams']:.1f} KiB without the {kv / 1024:.1f} MiB of KV "
                  f"the {a.idle_max_running} decoding streams hold |")
        sa = i["stats_after_close"]
        print(f"| after closing all: /stats active_requests, open_streams | {sa['active_requests']}, "
              f"{sa['open_streams']} ({'clean' if i['clean_after_close'] else 'NOT clean'}) |")
        print(f"| server RSS after close | {i['mem_after_close_kb']['VmRSS'] / 1024:.1f} MiB |")
    print(f"\nJSON: {a.out}")
    ok = res.get("idle", {}).get("clean_after_close", True) and not res.get("idle", {}).get("n_failures", 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
