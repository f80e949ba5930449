#!/usr/bin/env python3
"""rill vs llama.cpp per quant type on a random-weight model of a real
shape (bench/make_bench_model.py; default Llama-3.2-1B), one run, same
machine, same thread count.

For each type (default Q4_K_M, Q5_K_M, Q6_K, Q8_0 and IQ4_XS; llama-quantize
makes IQ4_XS without an importance matrix), engines alternating per repeat:
  - prefill tok/s of a 512-token prompt in one batch;
  - decode tok/s of 128 tokens after that prompt (KV depth 512).
llama.cpp is its own llama-bench (built from the llama.cpp inside the
llama-cpp-python source package by bench/build_llamacpp_tools.sh, explicit
CPU flags, AMX off):
  llama-bench -m M -t T -p 512 -n 0 -r 1 -o json          (prefill)
  llama-bench -m M -t T -p 0 -n 128 -d 512 -r 1 -o json   (decode at depth 512)
rill is
  rill run M --prompt-ids <512 seeded random ids> --max-tokens 129 --json --threads T --ignore-eos
(prefill_s and decode_s of its timings). Medians over --repeats; the
markdown table goes to stdout, JSON to --out.

    bench/e2e/quant_types_vs_llamacpp.py [--types Q4_K_M,IQ4_XS] [--threads 2] [--repeats 3] [--out r.json]
"""
import argparse
import datetime
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TYPES = "Q4_K_M,Q5_K_M,Q6_K,Q8_0,IQ4_XS"


def cpu_model():
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def llama_bench(bindir, model, threads, prefill, gen, depth):
    cmd = [os.path.join(bindir, "llama-bench"), "-m", model, "-t", str(threads), "-p", str(prefill),
           "-n", str(gen), "-d", str(depth), "-r", "1", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise RuntimeError(f"llama-bench exited {p.returncode}: {p.stderr.strip()[-600:]}")
    rows = json.loads(p.stdout)
    return float(rows[0]["avg_ts"]), " ".join(shlex.quote(c) for c in cmd)


def rill_run(rill, model, threads, ids, gen):
    cmd = [rill, "run", model, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", str(gen + 1),
           "--json", "--threads", str(threads), "--ignore-eos", "--temperature", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if p.returncode != 0:
        raise RuntimeError(f"rill exited {p.returncode}: {p.stderr.strip()[-600:]}")
    t = json.loads(p.stdout.strip().splitlines()[-1])["timings"]
    shown = " ".join(shlex.quote(c) for c in cmd[:4]) + f" <{len(ids)} ids> " + " ".join(cmd[5:])
    return t["prompt_tokens"] / t["prefill_s"], t["decode_tokens"] / t["decode_s"], shown


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=DEFAULT_TYPES)
    ap.add_argument("--shape", default="llama-3.2-1b")
    ap.add_argument("--rill", default=os.path.join(ROOT, "build", "rill"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--wait-quiet", type=int, default=0, metavar="S",
                    help="wait up to S seconds for the 1-minute load average to fall below 0.5")
    ap.add_argument("--rill-baseline", metavar="PATH",
                    help="a second rill binary (e.g. the previous commit's build) run in the same alternation")
    ap.add_argument("--out")
    args = ap.parse_args()

    models = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "make_bench_model.py"), "--types",
                             args.types, "--shape", args.shape], check=True, capture_output=True,
                            text=True).stdout.split()
    # Only the two tools this needs (llama-server takes tens of minutes more on 2 cores).
    env = dict(os.environ, TARGETS=os.environ.get("TARGETS", "llama-quantize llama-bench"))
    bindir = subprocess.run([os.path.join(ROOT, "bench", "build_llamacpp_tools.sh")], check=True,
                            capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
    deadline = time.time() + args.wait_quiet
    while os.getloadavg()[0] >= 0.5 and time.time() < deadline:
        time.sleep(10)
    rng = random.Random(7)
    ids = [rng.randrange(259, 128000) for _ in range(args.prompt_tokens)]
    load0 = os.getloadavg()
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "cpu": cpu_model(), "threads": args.threads, "repeats": args.repeats,
           "loadavg_at_start": load0, "command": " ".join(shlex.quote(a) for a in sys.argv), "types": {}}
    for t, model in zip(args.types.split(","), models):
        r = {"model": os.path.relpath(model, ROOT), "rill_prefill": [], "rill_decode": [],
             "llamacpp_prefill": [], "llamacpp_decode": []}
        if args.rill_baseline:
            r.update({"baseline": args.rill_baseline, "baseline_prefill": [], "baseline_decode": []})
        # Into the page cache first: rill maps the file and times its first forward pass, so a
        # file read from disk would land in its prefill (llama-bench loads and warms up first).
        with open(model, "rb") as f:
            while f.read(1 << 24):
                pass
        for _ in range(args.repeats):
            if args.rill_baseline:
                bp, bd, _ = rill_run(args.rill_baseline, model, args.threads, ids, args.gen_tokens)
                r["baseline_prefill"].append(bp)
                r["baseline_decode"].append(bd)
                print(f"{t}: baseline rill {bp:.1f}/{bd:.1f} tok/s (prefill/decode)", file=sys.stderr)
            pf, dc, r["rill_command"] = rill_run(args.rill, model, args.threads, ids, args.gen_tokens)
            r["rill_prefill"].append(pf)
            r["rill_decode"].append(dc)
            lp, r["llamacpp_prefill_command"] = llama_bench(bindir, model, args.threads, args.prompt_tokens, 0, 0)
            ld, r["llamacpp_decode_command"] = llama_bench(bindir, model, args.threads, 0, args.gen_tokens,
                                                           args.prompt_tokens)
            r["llamacpp_prefill"].append(lp)
            r["llamacpp_decode"].append(ld)
            print(f"{t}: rill {pf:.1f}/{dc:.1f}, llama.cpp {lp:.1f}/{ld:.1f} tok/s (prefill/decode)",
                  file=sys.stderr)
        for k in ("rill_prefill", "rill_decode", "llamacpp_prefill", "llamacpp_decode", "baseline_prefill",
                  "baseline_decode"):
            if k in r:
                r[k + "_median"] = statistics.median(r[k])
        res["types"][t] = r
    res["loadavg_at_end"] = os.getloadavg()

    lines = [f"# rill vs llama.cpp per quant type, random {args.shape}, {args.threads} threads", "",
             "| type | rill prefill | llama.cpp prefill | ratio | rill decode | llama.cpp decode | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for t, r in res["types"].items():
        lines.append(f"| {t} | {r['rill_prefill_median']:.1f} | {r['llamacpp_prefill_median']:.1f} | "
                     f"{r['rill_prefill_median'] / r['llamacpp_prefill_median']:.2f}x | "
                     f"{r['rill_decode_median']:.1f} | {r['llamacpp_decode_median']:.1f} | "
                     f"{r['rill_decode_median'] / r['llamacpp_decode_median']:.2f}x |")
    lines += ["", f"- tok/s, median of {args.repeats} (engines alternating); prefill {args.prompt_tokens} tokens, "
              f"decode {args.gen_tokens} tokens at KV depth {args.prompt_tokens}",
              f"- date {res['date']}; CPU {res['cpu']}; load average at start "
              f"{', '.join(f'{x:.2f}' for x in load0)}, at end {', '.join(f'{x:.2f}' for x in res['loadavg_at_end'])}"]
    for t, r in res["types"].items():
        lines.append(f"- {t}: rill `{r['rill_command']}`; llama.cpp `{r['llamacpp_prefill_command']}` and "
                     f"`{r['llamacpp_decode_command']}`")
    if args.rill_baseline:
        lines += ["", f"Baseline rill (`{args.rill_baseline}`), same alternation:", "",
                  "| type | baseline prefill | rill prefill | rill/baseline | baseline decode | rill decode | "
                  "rill/baseline |", "|---|---:|---:|---:|---:|---:|---:|"]
        for t, r in res["types"].items():
            lines.append(f"| {t} | {r['baseline_prefill_median']:.1f} | {r['rill_prefill_median']:.1f} | "
                         f"{r['rill_prefill_median'] / r['baseline_prefill_median']:.2f}x | "
                         f"{r['baseline_decode_median']:.1f} | {r['rill_decode_median']:.1f} | "
                         f"{r['rill_decode_median'] / r['baseline_decode_median']:.2f}x |")
    text = "\n".join(lines)
    res["markdown"] = text
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
