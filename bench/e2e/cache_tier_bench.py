#!/usr/bin/env python3
"""Time to first token with a long shared prefix, by where its KV comes from.

`rill serve` on the default model, a P-token prefix (default 2,048 random
ids) followed by a 16-token suffix that differs per request; every request
is POST /v1/completions with the prompt as ids, max_tokens 1, temperature 0,
not streamed, so the request's wall time is its TTFT (+ local HTTP, well
under a millisecond). Each row is the median over --runs fresh prefixes:

  cold    a server without tiers: prefix + suffix a, nothing cached
  device  the same server, prefix + suffix b: the prefix is in the device
          (in-process) KV cache
  ram     a server with --cache-ram-mb and --kv-cache-mb small enough that
          one other prompt of the same length evicts the prefix (it spills
          to the RAM tier); then prefix + suffix b is restored from RAM.
          The pool is full of cached blocks then, so the restore also evicts
          (and spills) the other prompt: that copy is part of this TTFT.
  disk    a server with --cache-dir warms every prefix (POST
          /v1/cache/warm), stops; a new server on the same directory serves
          prefix + suffix b from disk (the file mapped and copied in).
          The files were just written, so they are in the OS page cache.
          These servers' pools (--kv-cache-mb) hold every run, so nothing
          is evicted (and written to disk) while they are measured.
  disk+verify  the same after another restart with --kv-verify (every
          tensor hash checked on load)

Every hit is checked (usage.prompt_tokens_details.cached_tokens >= P) and
the tiers' own restore times (lookup to KV in device blocks) come from
/stats. Prints a markdown table and
writes JSON (date, machine, load average, commands, every sample) to --out.
Python 3 standard library only.
"""
import argparse
import datetime
import http.client
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from bench_common import cpu_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIX = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, rill, model, threads, ctx, extra, log_dir):
        self.port = free_port()
        self.argv = [rill, "serve", model, "--port", str(self.port), "--threads", str(threads), "--ctx-size",
                     str(ctx), *map(str, extra)]
        self.log = open(os.path.join(log_dir, f"cache-tier-serve-{self.port}.log"), "w")
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rill serve exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("rill serve did not become healthy")

    def post(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        t0 = time.perf_counter()
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        dt = time.perf_counter() - t0
        conn.close()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}: {raw[:300]!r}")
        return dt, json.loads(raw)

    def complete(self, ids):
        """(seconds, cached tokens) of a 1-token completion of `ids`."""
        dt, body = self.post("/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0,
                                                 "ignore_eos": True})
        return dt, body["usage"]["prompt_tokens_details"]["cached_tokens"]

    def stats(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default=os.path.join(ROOT, "build", "rill"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix", type=int, default=2048, help="shared prefix tokens")
    ap.add_argument("--runs", type=int, default=5, help="prefixes per row (the median is reported)")
    ap.add_argument("--ram-kv-cache-mb", type=int, default=64,
                    help="device KV pool of the RAM-tier server: must hold one prompt, not two")
    ap.add_argument("--cache-ram-mb", type=int, default=1024)
    ap.add_argument("--kv-cache-mb", type=int, default=1024,
                    help="device KV pool of the other servers: room for every run, so none evicts (or spills)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="where every server runs the model (the tiers export KV on both)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "cache_tier_bench.json"))
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    log_dir = os.path.dirname(a.out)
    rng = random.Random(a.seed)

    def ids(n):
        return [rng.randrange(100, 49000) for _ in range(n)]

    ctx = a.prefix + 2 * SUFFIX + 64
    prefixes = [ids(a.prefix) for _ in range(a.runs)]
    warm_up = ids(32)  # pages the weights in; shares nothing with the prefixes
    samples = {k: [] for k in ("cold", "device", "ram", "disk", "disk_verify")}
    cached = {k: [] for k in samples}
    servers = {}
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)

    def serve(name, *extra):
        s = Server(a.rill, a.model, a.threads, ctx, ("--device", a.device, *extra), log_dir)
        servers[name] = " ".join(s.argv[1:])
        s.complete(warm_up)
        return s

    def record(row, result):
        samples[row].append(result[0])
        cached[row].append(result[1])

    # cold and device: one server without tiers.
    s = serve("cold/device", "--kv-cache-mb", a.kv_cache_mb)
    try:
        for p in prefixes:
            record("cold", s.complete(p + ids(SUFFIX)))
            record("device", s.complete(p + ids(SUFFIX)))
    finally:
        s.stop()

    # ram: a small device pool under a RAM tier.
    s = serve("ram", "--kv-cache-mb", a.ram_kv_cache_mb, "--cache-ram-mb", a.cache_ram_mb)
    try:
        for p in prefixes:
            s.complete(p + ids(SUFFIX))               # computed
            s.complete(ids(a.prefix + SUFFIX))        # evicts it: it spills to RAM
            record("ram", s.complete(p + ids(SUFFIX)))
        ram_stats = s.stats()["kv"]["tiers"]
    finally:
        s.stop()

    # disk: warm, restart, request; then once more with --kv-verify.
    cache_dir = tempfile.mkdtemp(prefix="rill-cache-tier-bench-")
    try:
        s = serve("disk warm", "--kv-cache-mb", a.kv_cache_mb, "--cache-dir", cache_dir)
        try:
            warm_s = [s.post("/v1/cache/warm", {"prompt": p})[0] for p in prefixes]
        finally:
            s.stop()
        s = serve("disk", "--kv-cache-mb", a.kv_cache_mb, "--cache-dir", cache_dir)
        try:
            for p in prefixes:
                record("disk", s.complete(p + ids(SUFFIX)))
            disk_stats = s.stats()["kv"]["tiers"]
        finally:
            s.stop()
        s = serve("disk+verify", "--kv-cache-mb", a.kv_cache_mb, "--cache-dir", cache_dir, "--kv-verify")
        try:
            for p in prefixes:
                record("disk_verify", s.complete(p + ids(SUFFIX)))
            verify_stats = s.stats()["kv"]["tiers"]
        finally:
            s.stop()
        file_bytes = sum(os.path.getsize(os.path.join(cache_dir, f)) for f in os.listdir(cache_dir)
                         if f.endswith(".rkv"))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)

    med = {k: statistics.median(v) * 1000 for k, v in samples.items()}
    hits_ok = {k: all(c >= a.prefix for c in cached[k]) for k in ("device", "ram", "disk", "disk_verify")}
    hits_ok["cold"] = all(c == 0 for c in cached["cold"])

    def per_load(t):
        return t["load_seconds"] / t["loads"] * 1000 if t["loads"] else 0.0

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    report = {
        "date": started.isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "device": a.device},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "command": " ".join(sys.argv),
        "servers": servers,
        "prefix_tokens": a.prefix,
        "suffix_tokens": SUFFIX,
        "runs": a.runs,
        "ttft_ms_median": med,
        "ttft_ms_each": {k: [x * 1000 for x in v] for k, v in samples.items()},
        "cached_tokens_each": cached,
        "hits_as_expected": hits_ok,
        "warm_request_ms_each": [x * 1000 for x in warm_s],
        "disk_bytes_per_prefix": file_bytes / max(1, a.runs),
        "tier_load_ms_per_hit": {"ram": per_load(ram_stats["ram"]), "disk": per_load(disk_stats["disk"]),
                                 "disk_verify": per_load(verify_stats["disk"])},
        "tier_stats": {"ram": ram_stats, "disk": disk_stats, "disk_verify": verify_stats},
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)

    print(f"{a.prefix}-token shared prefix + {SUFFIX}-token suffix, max_tokens 1, {a.threads} threads, "
          f"median of {a.runs}; {report['date']}, {report['machine']['cpu']} ({report['machine']['cores']} cores), "
          f"load average {load_before[0]:.2f} before / {report['load_average_after'][0]:.2f} after, commit {commit}")
    print()
    print("| KV of the prefix from | TTFT ms (median) | runs (ms) | vs cold | tier load ms / hit | hits ok |")
    print("|---|---:|---|---:|---:|---|")
    names = {"cold": "nowhere (cold)", "device": "device cache", "ram": "RAM tier", "disk": "disk tier, restarted",
             "disk_verify": "disk tier, restarted, --kv-verify"}
    for k in ("cold", "device", "ram", "disk", "disk_verify"):
        each = ", ".join(f"{x * 1000:.0f}" for x in samples[k])
        load = report["tier_load_ms_per_hit"].get(k)
        print(f"| {names[k]} | {med[k]:.1f} | {each} | {med[k] / med['cold']:.3f} | "
              f"{'' if load is None else f'{load:.1f}'} | {'yes' if hits_ok[k] else 'NO'} |")
    print()
    print(f"disk hit / cold = {med['disk'] / med['cold']:.3f} (target <= 0.2); "
          f"RAM hit / device hit = {med['ram'] / med['device']:.2f}; "
          f"file per prefix {report['disk_bytes_per_prefix'] / 2**20:.1f} MiB; JSON: {a.out}")


if __name__ == "__main__":
    main()
