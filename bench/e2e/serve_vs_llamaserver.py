#!/usr/bin/env python3
"""`rill serve` against llama.cpp's `llama-server`, served output at N streams, one run.

Same machine, same model file, same thread count, both servers started here
and driven by the same streaming client (serve_bench.py's raw-socket SSE
reader). Each level: c client threads, each sending POST /v1/completions
{prompt: [P random ids], max_tokens: G, temperature: 0, ignore_eos: true,
stream: true, stream_options: {include_usage: true}} back to back until
--requests-per-stream x c requests are done (closed loop: a new prompt
arrives whenever one ends). The same seeded prompts go to both servers.
Servers alternate per repeat; medians over --repeats.

  llama-server -m M -t T -tb T -np c -c c*(P+G+16) --cont-batching --port X
               (built by bench/build_llamacpp_tools.sh: explicit CPU flags, AMX off)
  rill serve M --threads T --port 0

Reported per server and level: aggregate output tok/s (completion tokens /
wall time), TTFT and inter-token gap p50/p99 (gap between SSE text chunks),
request latency p50. Markdown to stdout, JSON (date, machine, commands,
runs) to --out.

    bench/e2e/serve_vs_llamaserver.py --model M [--levels 8] [--repeats 3] [--out r.json]
"""
import argparse
import datetime
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import cpu_name  # noqa: E402
from serve_bench import Server, check, completion_body, get_json, percentile, stream_completion  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server child on a free port; ready when GET /health answers 200."""

    def __init__(self, binary, model, threads, slots, ctx, log_path, start_timeout=300):
        self.port = free_port()
        self.cmd = [binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(ctx),
                    "--cont-batching", "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = open(log_path, "a")
        self.log.write(f"\n$ {' '.join(self.cmd)}\n")
        self.log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=self.log)
        deadline = time.time() + start_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} (see {log_path})")
            try:
                if get_json(self.port, "/health").get("status") == "ok":
                    break
            except (OSError, ValueError, AttributeError):
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server did not become healthy (see {log_path})")
            time.sleep(0.2)

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


def run_level(port, bodies, conc, gen_tokens, timeout):
    traces = [None] * len(bodies)
    lock = threading.Lock()
    next_i = [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(bodies):
                return
            traces[i] = stream_completion(port, bodies[i], timeout)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=worker) for _ in range(conc)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.perf_counter() - t0
    for tr in traces:
        check(tr, gen_tokens)
    ttft = [(t.first - t.sent) * 1e3 for t in traces]
    itl = [(y - x) * 1e3 for t in traces for x, y in zip(t.text_times, t.text_times[1:])]
    lat = [(t.finish - t.sent) * 1e3 for t in traces]
    n_tok = sum(t.completion_tokens() for t in traces)
    return {"wall_s": wall, "output_tok_s": n_tok / wall, "completion_tokens": n_tok,
            "ttft_ms": {"p50": percentile(ttft, 0.5), "p99": percentile(ttft, 0.99)},
            "itl_ms": {"p50": percentile(itl, 0.5), "p99": percentile(itl, 0.99)},
            "latency_ms": {"p50": percentile(lat, 0.5)}}


def n_vocab_of(rill, model):
    out = subprocess.run([rill, "inspect", model, "--json"], check=True, capture_output=True, text=True).stdout
    return int(json.loads(out)["n_vocab"])


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rill", default=os.path.join(ROOT, "build", "rill"))
    ap.add_argument("--llama-server", default=os.path.join(ROOT, "build", "llamacpp", "build", "bin", "llama-server"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="8")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--n-vocab", type=int, default=0, help="prompt ids drawn below this (default: the model's)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "serve_vs_llamaserver.json"))
    a = ap.parse_args()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    log_path = os.path.splitext(a.out)[0] + ".log"
    # Random ids over the whole vocabulary (serve_bench's prompts); the same ids go to both servers.
    n_vocab = a.n_vocab or n_vocab_of(a.rill, a.model)
    levels = [int(x) for x in a.levels.split(",")]
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": cpu_name(), "cpus": os.cpu_count(), "model": a.model, "threads": a.threads,
              "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "levels": {}}
    for conc in levels:
        n_req = a.requests_per_stream * conc
        rng = random.Random(1234 + conc)
        bodies = [completion_body(rng, n_vocab, a.prompt_tokens, a.gen_tokens) for _ in range(n_req)]
        runs = {"rill": [], "llama.cpp": []}
        cmds = {}
        for rep in range(a.repeats):
            for name in (("rill", "llama.cpp") if rep % 2 == 0 else ("llama.cpp", "rill")):
                load0 = loadavg()
                if name == "rill":
                    srv = Server(a.rill, a.model, a.threads, [], log_path)
                else:
                    srv = LlamaServer(a.llama_server, a.model, a.threads, conc,
                                      conc * (a.prompt_tokens + a.gen_tokens + 16), log_path)
                try:
                    cmds[name] = " ".join(srv.cmd)
                    # Warm-up: one request at the level's shape (first-use costs out of the timing).
                    check(stream_completion(srv.port, bodies[0], a.timeout), a.gen_tokens)
                    r = run_level(srv.port, bodies, conc, a.gen_tokens, a.timeout)
                finally:
                    srv.stop()
                r["load_avg_start_end"] = [load0, loadavg()]
                runs[name].append(r)
                print(f"c={conc} repeat {rep} {name}: {r['output_tok_s']:.1f} tok/s "
                      f"(itl p50 {r['itl_ms']['p50']:.0f} ms, load {load0:.1f})", file=sys.stderr, flush=True)
        med = {n: statistics.median(r["output_tok_s"] for r in v) for n, v in runs.items()}
        result["levels"][str(conc)] = {"requests": n_req, "runs": runs, "commands": cmds,
                                       "median_output_tok_s": med, "ratio": med["rill"] / med["llama.cpp"]}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\n{result['machine']}, {a.threads} threads, {os.path.basename(a.model)}, "
          f"P={a.prompt_tokens} G={a.gen_tokens}, median of {a.repeats}\n")
    print("| streams | rill tok/s | llama-server tok/s | ratio | rill ITL p50/p99 ms | llama-server ITL p50/p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for conc, lv in result["levels"].items():
        m = lv["median_output_tok_s"]
        it = {n: statistics.median(r["itl_ms"]["p50"] for r in lv["runs"][n]) for n in lv["runs"]}
        i99 = {n: statistics.median(r["itl_ms"]["p99"] for r in lv["runs"][n]) for n in lv["runs"]}
        print(f"| {conc} | {m['rill']:.1f} | {m['llama.cpp']:.1f} | {lv['ratio']:.2f}x | "
              f"{it['rill']:.0f} / {i99['rill']:.0f} | {it['llama.cpp']:.0f} / {i99['llama.cpp']:.0f} |")


if __name__ == "__main__":
    main()
