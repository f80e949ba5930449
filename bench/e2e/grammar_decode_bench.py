"""Decode throughput with and without a grammar, through `rill serve`.

Usage: .venv/bin/python bench/e2e/grammar_decode_bench.py BASE_URL [STREAMS] [TOKENS] [ROUNDS]

Runs STREAMS concurrent chat requests of TOKENS tokens each, unconstrained
(ignore_eos) and constrained by a JSON schema whose unbounded string array
keeps the default model writing until max_tokens, and prints completion
tokens per second of wall time for each (short prompt: decode dominates).
"""
import concurrent.futures
import json
import statistics
import sys
import time
import urllib.request

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "string"}}}, "required": ["name", "tags"], "additionalProperties": False}


def one(base, tokens, constrained):
    body = {"model": "m", "messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": tokens,
            "temperature": 0}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["usage"]["completion_tokens"]


def run(base, streams, tokens, constrained):
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(streams) as ex:
        n = sum(ex.map(lambda _: one(base, tokens, constrained), range(streams)))
    return n, n / (time.time() - t0)


if __name__ == "__main__":
    base = sys.argv[1]
    streams = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    run(base, streams, 16, False)  # warm-up (and the grammar's mask cache)
    run(base, streams, 16, True)
    # Rounds alternate the two sides so that a neighbour's load on this
    # shared machine falls on both; the medians are compared.
    rates = {False: [], True: []}
    for r in range(rounds):
        for constrained in (False, True) if r % 2 == 0 else (True, False):
            n, rate = run(base, streams, tokens, constrained)
            rates[constrained].append(rate)
            print(f"round {r} {'constrained' if constrained else 'unconstrained':13s} streams={streams} "
                  f"tokens={n} {rate:.1f} tok/s")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median unconstrained {med[False]:.1f} tok/s, constrained {med[True]:.1f} tok/s, "
          f"ratio {med[True] / med[False]:.3f}")
