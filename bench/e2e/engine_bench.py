#!/usr/bin/env python3
"""Continuous-batching benchmark of the rill engine (`rill bench`), one run.

Scenarios on one model, same machine, same thread count:
  single      1 stream                      -> decode tok/s of one stream
  batched     N streams at once             -> aggregate decode tok/s (steady state,
                                               every stream decoding), ratio to single
              (single and batched alternate --repeats times; medians count)
  prefix      a cold request, then a warm one sharing a long prefix
                                            -> TTFT of each, cached tokens, speed-up
  long        streams decoding while a long prompt prefills
                                            -> the streams' largest inter-token gap vs
                                               two normal steps + one prefill chunk
Prints a markdown table and writes the raw JSON (with the machine, date and
commands) to --out. Needs only the rill binary (no Python packages).
"""
import argparse
import datetime
import json
import os
import sys

from bench_common import cpu_name, rill_bench


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rill", default="build/rill")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--long-prompt", type=int, default=4096)
    ap.add_argument("--budget", type=int, default=512, help="token budget per step")
    ap.add_argument("--repeats", type=int, default=3, help="runs of single and batched (median counts)")
    ap.add_argument("--out", default="build/bench/engine_bench.json")
    a = ap.parse_args()

    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs", "threads": a.threads,
           "load_avg_at_start": os.getloadavg(), "runs": {}}
    pg = ["--prompt-tokens", a.prompt_tokens, "--gen-tokens", a.gen_tokens, "--max-batch-tokens", a.budget]
    runs = res["runs"]
    # Single and batched alternate, a.repeats times each; the median run of
    # each counts (the machine's other load hits both alike).
    singles, batches = [], []
    for _ in range(a.repeats):
        singles.append(rill_bench(a.rill, a.model, a.threads, "--concurrency", 1, *pg))
        batches.append(rill_bench(a.rill, a.model, a.threads, "--concurrency", a.streams, *pg))
    median = lambda rs: sorted(rs, key=lambda r: r[1]["decode_tok_s"])[len(rs) // 2]
    runs["single"], runs["batched"] = median(singles), median(batches)
    res["single_decode_tok_s_all"] = [r[1]["decode_tok_s"] for r in singles]
    res["batched_decode_tok_s_all"] = [r[1]["decode_tok_s"] for r in batches]
    runs["prefix"] = rill_bench(a.rill, a.model, a.threads, "--concurrency", 1, "--requests", 2,
                                "--prompt-tokens", a.prefix_tokens + 16, "--shared-prefix", a.prefix_tokens,
                                "--gen-tokens", 16, "--max-batch-tokens", a.budget)
    runs["long"] = rill_bench(a.rill, a.model, a.threads, "--concurrency", 4, "--prompt-tokens", 64,
                              "--gen-tokens", 256, "--long-prompt", a.long_prompt, "--max-batch-tokens", a.budget)
    single, batched = runs["single"][1], runs["batched"][1]
    prefix, long_ = runs["prefix"][1], runs["long"][1]
    ratio = batched["decode_tok_s"] / single["decode_tok_s"]
    cold, warm = prefix["ttft_ms_each"]
    lp = long_["long_prompt"]
    # The engine reports the longest step that computed part of the long
    # prompt (that step also carried the streams' decode tokens).
    last_chunk_ms = lp["longest_chunk_step_ms"]
    bound = 2 * lp["normal_step_ms"] + last_chunk_ms
    res["summary"] = {
        "single_decode_tok_s": single["decode_tok_s"],
        "batched_decode_tok_s": batched["decode_tok_s"],
        "batched_over_single": ratio,
        "prefix_cold_ttft_ms": cold, "prefix_warm_ttft_ms": warm, "prefix_speedup": cold / warm,
        "prefix_cached_tokens": prefix["cached_tokens_each"],
        "long_streams_max_gap_ms": lp["streams_max_gap_ms"], "long_gap_bound_ms": bound,
        "long_longest_chunk_step_ms": last_chunk_ms, "long_prefill_ms": lp["prefill_ms"],
    }
    for k in runs:
        runs[k] = {"command": " ".join(map(str, runs[k][0])), "result": runs[k][1]}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)

    s = res["summary"]
    print(f"{res['date']} | {res['machine']} | {a.threads} threads | load {res['load_avg_at_start'][0]:.2f}")
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| decode, 1 stream | {s['single_decode_tok_s']:.1f} tok/s (runs: "
          f"{', '.join(f'{x:.1f}' for x in res['single_decode_tok_s_all'])}) |")
    print(f"| decode, {a.streams} streams (aggregate) | {s['batched_decode_tok_s']:.1f} tok/s "
          f"({ratio:.2f}x one stream; runs: {', '.join(f'{x:.1f}' for x in res['batched_decode_tok_s_all'])}) |")
    print(f"| TTFT, cold {a.prefix_tokens + 16}-token prompt | {cold:.1f} ms |")
    print(f"| TTFT, same {a.prefix_tokens}-token prefix warm | {warm:.1f} ms ({cold / warm:.1f}x faster; "
          f"cached {prefix['cached_tokens_each'][1]} tokens) |")
    print(f"| streams' largest gap while a {a.long_prompt}-token prompt prefills | {lp['streams_max_gap_ms']:.1f} ms "
          f"(bound: 2 normal steps x {lp['normal_step_ms']:.1f} + its longest chunk step {last_chunk_ms:.1f} = "
          f"{bound:.1f} ms; the whole prefill took {lp['prefill_ms']:.0f} ms) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
