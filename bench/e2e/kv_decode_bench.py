#!/usr/bin/env python3
"""Decode tok/s at a KV depth, per KV cache type, one run (issue 22).

For each --depths D and each --kv-types T, types alternating within a repeat:
  rill run MODEL --prompt-ids <D seeded ids> --max-tokens G+1 --ignore-eos --json
           --threads N --kv-type T --ctx-size D+G+16
decode tok/s = decode_tokens / decode_s of its timings (the prefill of the D
prompt tokens is timed apart and reported too). Medians over --repeats;
markdown to stdout, JSON (date, machine, load, commands) to --out.

    bench/e2e/kv_decode_bench.py [--model M] [--depths 1024,4096,8000] [--kv-types f16,q8_0,...]
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import cpu_name  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rill_run(a, kv_type, ids):
    # The context holds the prompt, the generated tokens and a margin (the
    # default context, 4096, is too small past depth ~4000).
    cmd = [a.rill, "run", a.model, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(a.gen_tokens + 1),
           "--ignore-eos", "--json", "--threads", str(a.threads), "--kv-type", kv_type,
           "--ctx-size", str(len(ids) + a.gen_tokens + 16)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"rill exited {p.returncode}: {p.stderr.strip()[-400:]}")
    t = json.loads(p.stdout.strip().splitlines()[-1])["timings"]
    return t["decode_tokens"] / t["decode_s"], t["prompt_tokens"] / t["prefill_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rill", default=os.path.join(ROOT, "build", "rill"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--depths", default="1024,4096,8000")
    ap.add_argument("--kv-types", default="f16,q8_0,q8_0h,q5_1,q5_0,q4_1,q4_0,q4_0h")
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "kv_decode_bench.json"))
    a = ap.parse_args()
    types = a.kv_types.split(",")
    depths = [int(d) for d in a.depths.split(",")]
    inspect = json.loads(subprocess.run([a.rill, "inspect", a.model, "--json"], check=True, capture_output=True,
                                        text=True).stdout)
    rng = random.Random(11)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{cpu_name()}, {os.cpu_count()} logical CPUs", "threads": a.threads, "model": a.model,
           "gen_tokens": a.gen_tokens, "load_avg_at_start": os.getloadavg(), "command": " ".join(sys.argv),
           "runs": {}}
    for d in depths:
        ids = [rng.randrange(int(inspect["n_vocab"])) for _ in range(d)]
        runs = {t: {"decode": [], "prefill": []} for t in types}
        for rep in range(a.repeats):
            for t in (types if rep % 2 == 0 else list(reversed(types))):
                dec, pre = rill_run(a, t, ids)
                runs[t]["decode"].append(dec)
                runs[t]["prefill"].append(pre)
                print(f"depth {d} {t}: decode {dec:.1f} tok/s, prefill {pre:.0f} tok/s", file=sys.stderr, flush=True)
        res["runs"][str(d)] = runs
    res["load_avg_at_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    la0, la1 = res["load_avg_at_start"][0], res["load_avg_at_end"][0]
    print(f"{res['date']} | {res['machine']} | {a.threads} threads | load {la0:.2f} -> {la1:.2f} | "
          f"{os.path.basename(a.model)} | decode {a.gen_tokens} tokens after D prompt ids, median of {a.repeats}\n")
    print("| KV type | " + " | ".join(f"decode tok/s at {d}" for d in depths) + " | "
          + " | ".join(f"prefill tok/s {d}" for d in depths) + " |")
    print("|---|" + "---:|" * (2 * len(depths)))
    for t in types:
        dec = [statistics.median(res["runs"][str(d)][t]["decode"]) for d in depths]
        pre = [statistics.median(res["runs"][str(d)][t]["prefill"]) for d in depths]
        print(f"| {t} | " + " | ".join(f"{x:.1f}" for x in dec) + " | " + " | ".join(f"{x:.0f}" for x in pre) + " |")


if __name__ == "__main__":
    main()
