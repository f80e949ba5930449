#!/usr/bin/env python3
"""Speculative decoding on the CPU: prompt lookup (`--spec ngram`, or a draft
model with `--spec draft=PATH`) on and off in the same run, on the same
server, request by request.

One `rill serve MODEL --spec SPEC --spec-tokens K` process; every prompt is
sent twice per repeat, once with "speculative": false (off) and once with
speculation (on), alternating which goes first, greedy (temperature 0),
streamed. A fresh prefix-cache namespace is not needed: decode speed is
measured from the first streamed token to the last, so a prefill served from
the cache does not count. Per workload:
  decode tok/s   (completion_tokens - 1) / (first text chunk -> finish), median
  speedup        on / off decode tok/s
  acceptance     accepted / drafted tokens (usage.completion_tokens_details:
                 accepted_prediction_tokens, rejected_prediction_tokens)
  same output    the on and off texts are identical (greedy is lossless)
Workloads: edit (rewrite a passage with small changes), code (rename a
function in a snippet), chat (free-form questions).
Prints a markdown table and writes JSON (date, machine, load, results) to --out.
Python 3 standard library only.
"""
import argparse
import datetime
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from bench_common import cpu_name

PASSAGE = ("The old colour photographs were kept in a grey box in the attic. Every summer, my grandmother would "
           "take the box down and sort the photographs by colour, saying that the grey ones reminded her of the "
           "harbour in winter. She labelled each one carefully with the year and the name of the neighbour who "
           "had taken it, and she never let anyone else organise them.")
CODE = '''def calc(items, tax):
    total = 0
    for item in items:
        total += item.price * item.quantity
    total = total * (1 + tax)
    return round(total, 2)


def report(orders, tax):
    lines = []
    for order in orders:
        lines.append(f"{order.id}: {calc(order.items, tax)}")
    return "\\n".join(lines)
'''
WORKLOADS = {
    "edit": [
        "Rewrite the following paragraph in American spelling (colour -> color, grey -> gray, harbour -> harbor, "
        "neighbour -> neighbor, labelled -> labeled, organise -> organize). Change nothing else and output only "
        "the paragraph.\n\n" + PASSAGE,
        "Copy the following paragraph, replacing 'grandmother' with 'grandfather' and 'She' with 'He'. Output "
        "only the paragraph.\n\n" + PASSAGE,
    ],
    "code": [
        "Rename the function `calc` to `compute_total` everywhere in this code and output the whole code:\n\n"
        "```python\n" + CODE + "```",
        "Add type hints to this code (items: list, tax: float, orders: list) and output the whole code:\n\n"
        "```python\n" + CODE + "```",
    ],
    "chat": [
        "Tell me about the history of the bicycle.",
        "What are three good habits for staying healthy? Explain each briefly.",
    ],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(rill, model, threads, k, spec):
    port = free_port()
    cmd = [rill, "serve", model, "--port", str(port), "--threads", str(threads), "--spec", spec,
           "--spec-tokens", str(k), "--ctx-size", "2048", "--kv-cache-mb", "128"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port, cmd
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("rill serve did not start")


def run_one(port, prompt, max_tokens, speculative):
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
            "speculative": speculative}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    text, usage, first, last = "", None, None, None
    buf = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                j = json.loads(line[6:])
                if j.get("usage"):
                    usage = j["usage"]
                for ch in j.get("choices", []):
                    piece = ch.get("delta", {}).get("content") or ""
                    if piece:
                        if first is None:
                            first = time.perf_counter()
                        last = time.perf_counter()
                        text += piece
                    if ch.get("finish_reason"):
                        last = time.perf_counter()
    n = usage["completion_tokens"]
    d = usage["completion_tokens_details"]
    tps = (n - 1) / (last - first) if first and last > first else 0.0
    return {"text": text, "tokens": n, "decode_tps": tps, "accepted": d["accepted_prediction_tokens"],
            "drafted": d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rill", default="build/rill")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spec", default="ngram", help="ngram or draft=PATH")
    ap.add_argument("--spec-tokens", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="build/bench/spec_bench.json")
    a = ap.parse_args()
    load_before = os.getloadavg()
    proc, port, cmd = start(a.rill, a.model, a.threads, a.spec_tokens, a.spec)
    results = {}
    try:
        run_one(port, "Hello", 8, False)  # warm-up
        for name, prompts in WORKLOADS.items():
            on_tps, off_tps, acc, drafted, same = [], [], 0, 0, True
            for rep in range(a.repeats):
                for p in prompts:
                    order = (False, True) if rep % 2 == 0 else (True, False)
                    got = {s: run_one(port, p, a.max_tokens, s) for s in order}
                    off_tps.append(got[False]["decode_tps"])
                    on_tps.append(got[True]["decode_tps"])
                    acc += got[True]["accepted"]
                    drafted += got[True]["drafted"]
                    same = same and got[True]["text"] == got[False]["text"]
            off_m, on_m = statistics.median(off_tps), statistics.median(on_tps)
            results[name] = {"off_decode_tps": off_m, "on_decode_tps": on_m, "speedup": on_m / off_m,
                             "acceptance": acc / drafted if drafted else 0.0, "drafted": drafted, "accepted": acc,
                             "same_output": same, "samples": len(on_tps)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "cpu": cpu_name(),
              "load_before": load_before, "load_after": os.getloadavg(), "command": cmd,
              "spec": a.spec, "max_tokens": a.max_tokens, "results": results}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"CPU: {report['cpu']}, load {load_before[0]:.1f} -> {report['load_after'][0]:.1f}, "
          f"--spec {a.spec} --spec-tokens {a.spec_tokens}, greedy, max_tokens {a.max_tokens}\n")
    print("| workload | off tok/s | on tok/s | speedup | acceptance | same output |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['off_decode_tps']:.1f} | {r['on_decode_tps']:.1f} | {r['speedup']:.2f}x | "
              f"{r['acceptance']:.2f} ({r['accepted']}/{r['drafted']}) | {'yes' if r['same_output'] else 'NO'} |")
    return 0 if all(r["same_output"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
