#!/usr/bin/env python3
"""rill vs llama.cpp on the CPU, one run, same machine, same thread count.

For the default model (SmolLM2-135M-Instruct Q4_1) it measures, for both
engines, each in its own child process so peak RSS is comparable:
  - prefill tok/s: a 512-token prompt (real text) evaluated in one batch;
  - decode tok/s: greedy decode of 128 tokens, only the decode part timed;
  - peak RSS of the process (getrusage of that child, ru_maxrss);
  - time to first token, for the 512-token prompt and for a short chat prompt
    (rill: from process start, as `rill run` reports it; llama.cpp: from the
    start of model load, Python start-up excluded).
The same 512 prompt ids go to both. llama.cpp runs through llama-cpp-python
(built here, native flags) with its sampler bypassed: argmax of the logits.
rill runs as
  rill run MODEL --prompt-ids <ids> --max-tokens 128 --json --threads T --ignore-eos
which prints {"ids": [...], "text": ..., "timings": {"load_s", "prompt_tokens",
"prefill_s", "decode_tokens", "decode_s", "first_token_s"}}. When rill is
missing or fails, llama.cpp's numbers are still reported and the failure is
named.

Ceiling: decode at batch 1 is bound by memory bandwidth. Bytes read per token
= all tensor bytes (the tied Q8_0 token embedding is read whole as the LM head)
[+ the f16 KV cache read, reported separately]; bandwidth = a single-thread
numpy copy of a 512 MiB array (STREAM convention: 2 x size / time). Roofline
tok/s = bandwidth / bytes per token; each engine's decode is shown as a
fraction of it.

    bench/e2e/cpu_vs_llamacpp.py [--rill build/rill] [--threads 2] [--out r.json]
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

T_START = time.perf_counter()
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
LLAMACPP_N_CTX = 1024  # >= 512 prompt + 128 generated; KV f16: 23 MB for this model
SHORT_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                "<|im_end|>\n<|im_start|>assistant\n")

PARAGRAPH = (
    "The history of the printing press begins in the fifteenth century, when "
    "Johannes Gutenberg combined movable metal type, oil-based ink and a wooden "
    "screw press into a system that could produce books quickly and cheaply. "
    "Before then, most books in Europe were copied by hand, a slow process that "
    "kept them rare and expensive. Within fifty years, printing shops had spread "
    "to more than two hundred cities, and millions of volumes were in circulation. "
    "Cheaper books helped literacy grow, allowed scientists to share results "
    "accurately, and carried new religious and political ideas across borders. "
)


def ensure_venv():
    tools_venv.ensure(["gguf", "llama_cpp", "numpy"], ["llama-cpp-python", "numpy", "gguf"])


def rss_now_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# --------------------------------------------------------------------------
# llama.cpp worker: runs in its own process; prints one JSON object.
# --------------------------------------------------------------------------
def llamacpp_worker(args):
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    with open(args.ids_file) as f:
        prompts = json.load(f)
    ids, short_ids = prompts["long"], prompts["short"]
    rss_baseline_kb = rss_now_kb()  # interpreter + numpy + llama_cpp, no model
    t_load0 = time.perf_counter()
    llm = Llama(model_path=args.model, n_threads=args.threads,
                n_threads_batch=args.threads, n_ctx=LLAMACPP_N_CTX, n_batch=512,
                n_ubatch=512, logits_all=False, seed=0, verbose=False)
    load_s = time.perf_counter() - t_load0
    n_vocab = llm.n_vocab()

    def argmax_last():
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    # Cold first token for a short chat prompt, from the start of model load.
    llm.eval(short_ids)
    argmax_last()
    first_token_short_s = time.perf_counter() - t_load0

    def one_run():
        llm.reset()  # n_tokens = 0; eval() then drops every KV cell: fresh context
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = argmax_last()
        t1 = time.perf_counter()
        out = [tok]
        for _ in range(args.gen_tokens - 1):
            llm.eval([tok])
            tok = argmax_last()
            out.append(tok)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1, out, t1

    prefill_s, decode_s = [], []
    first_prefill, _, gen_ids, _ = one_run()  # warm-up
    for _ in range(args.repeats):
        p, d, ids_out, _ = one_run()
        assert ids_out == gen_ids, "llama.cpp greedy output changed between runs"
        prefill_s.append(p)
        decode_s.append(d)
    n_decode = args.gen_tokens - 1
    print(json.dumps({
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "load_s": load_s,
        "first_token_short_s": first_token_short_s,
        "first_token_s": load_s + statistics.median(prefill_s),
        "first_token_note": "short: measured cold from model load start; 512: load_s + "
                            "median prefill_s; Python start-up excluded from both",
        "n_ctx": LLAMACPP_N_CTX,
        "warmup_prefill_s": first_prefill,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "prompt_tokens": len(ids),
        "decode_tokens": n_decode,
        "prefill_tok_s": len(ids) / statistics.median(prefill_s),
        "decode_tok_s": n_decode / statistics.median(decode_s),
        "ids": gen_ids,
        "rss_baseline_mb": rss_baseline_kb / 1024,
    }))


# --------------------------------------------------------------------------
# Parent: machine facts, roofline, the two engines, the report.
# --------------------------------------------------------------------------
# Spawns the measured command from a small Python process and reports the
# command's own ru_maxrss. Needed because Linux carries the peak RSS across
# fork/vfork + execve: a child spawned straight from this (numpy-laden)
# process would report at least this process's peak.
LAUNCHER = r"""
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
sys.stderr.write("\nRILL_BENCH_MAXRSS_KB=%d\n" % usage.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status) & 0xff)
"""


def run_child(cmd, timeout):
    """Runs cmd; returns (rc, stdout, stderr, wall_s, peak_rss_mb of cmd itself)."""
    import signal
    import tempfile
    import threading
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER] + cmd, stdout=out,
                             stderr=err, text=True, start_new_session=True)
        killed = []
        timer = threading.Timer(timeout, lambda: (killed.append(1), os.killpg(p.pid, signal.SIGKILL)))
        timer.start()
        rc = p.wait()
        timer.cancel()
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rss_kb = 0
    head, sep, tail = stderr.rpartition("RILL_BENCH_MAXRSS_KB=")
    if sep:
        rss_kb, stderr = int(tail.split()[0]), head
    if killed:
        stderr += f"\nkilled after the {timeout}s timeout"
    return rc, stdout, stderr, wall, rss_kb / 1024


def last_json_object(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def machine_info():
    info = {"model_name": platform.processor(), "cpus": os.cpu_count(), "flags": [],
            "l3": None, "mem_total_gb": None, "loadavg_at_start": os.getloadavg()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            key, _, val = line.partition(":")
            val = val.strip()
            if key == "Model name":
                info["model_name"] = val
            elif key == "Flags":
                info["flags"] = sorted(f for f in val.split()
                                       if f in ("avx2", "fma", "f16c") or f.startswith("avx512"))
            elif key == "L3 cache":
                info["l3"] = val
            elif key == "Core(s) per socket":
                info["cores_per_socket"] = int(val)
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                info["mem_total_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    return info


def copy_bandwidth_gbs(np, mib=512, repeats=5):
    """Single-thread numpy copy of a 512 MiB array, best of 5; 2 x size / time."""
    n = mib * 1024 * 1024 // 8
    src = np.ones(n, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault in both arrays
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9


def model_bytes(path):
    """Sum of tensor bytes and the KV bytes per position (f16 K and V)."""
    import gguf
    r = gguf.GGUFReader(path)
    total = sum(int(t.n_bytes) for t in r.tensors)
    by_type = {}
    for t in r.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)

    def field(name):
        f = r.fields[name]
        return int(f.parts[f.data[0]][0])
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_layer = field(f"{arch}.block_count")
    n_head = field(f"{arch}.attention.head_count")
    n_head_kv = field(f"{arch}.attention.head_count_kv")
    head_dim = field(f"{arch}.embedding_length") // n_head
    kv_bytes_per_pos = n_layer * 2 * n_head_kv * head_dim * 2
    tied = not any(t.name == "output.weight" for t in r.tensors)
    return total, by_type, kv_bytes_per_pos, tied


def rill_cmd(args, model, ids, max_tokens):
    return [args.rill, "run", model, "--prompt-ids", ",".join(map(str, ids)),
            "--max-tokens", str(max_tokens), "--json", "--threads", str(args.threads),
            "--ignore-eos", "--temperature", "0"]  # greedy, as llama.cpp's side (argmax)


def run_rill(args, ids, short_ids, model):
    cmd = rill_cmd(args, model, ids, args.gen_tokens)
    shown = " ".join(shlex.quote(c) for c in cmd[:4]) + " <512 ids> " + \
        " ".join(shlex.quote(c) for c in cmd[5:])
    res = {"command": shown}
    if not os.path.isfile(args.rill) or not os.access(args.rill, os.X_OK):
        res["error"] = f"{args.rill}: no such executable (build rill first: make build)"
        return res
    runs = []
    for i in range(args.repeats + 1):  # first run warms the page cache, not counted
        rc, out, err, wall, rss = run_child(cmd, args.timeout)
        obj = last_json_object(out) if rc == 0 else None
        if rc != 0 or not obj or "timings" not in obj:
            res["error"] = (f"rill exited {rc}" if rc != 0 else "rill printed no JSON with timings") \
                + ": " + (err.strip()[-600:] or out.strip()[-600:])
            return res
        if i > 0:
            runs.append((obj, wall, rss))
    # Short chat prompt, one token: the first-token latency a chat user sees.
    short = []
    for _ in range(args.repeats):
        rc, out, err, wall, _ = run_child(rill_cmd(args, model, short_ids, 1), args.timeout)
        obj = last_json_object(out) if rc == 0 else None
        if obj and "timings" in obj:
            short.append(obj["timings"]["first_token_s"])
    if short:
        res["first_token_short_s"] = statistics.median(short)
    tm = [o["timings"] for o, _, _ in runs]
    med = lambda key: statistics.median(t[key] for t in tm)  # noqa: E731
    res.update({
        "load_s": med("load_s"),
        "first_token_s": med("first_token_s"),
        "prefill_s": [t["prefill_s"] for t in tm],
        "decode_s": [t["decode_s"] for t in tm],
        "prompt_tokens": tm[0]["prompt_tokens"],
        "decode_tokens": tm[0]["decode_tokens"],
        "prefill_tok_s": statistics.median(t["prompt_tokens"] / t["prefill_s"] for t in tm),
        "decode_tok_s": statistics.median(t["decode_tokens"] / t["decode_s"] for t in tm),
        "process_wall_s": statistics.median(w for _, w, _ in runs),
        "peak_rss_mb": max(r for _, _, r in runs),
        "ids": runs[0][0].get("ids", []),
    })
    return res


def run_llamacpp(args, ids_file, model):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--ids-file", ids_file,
           "--model", model, "--threads", str(args.threads), "--gen-tokens",
           str(args.gen_tokens), "--repeats", str(args.repeats)]
    rc, out, err, wall, rss = run_child(cmd, args.timeout)
    obj = last_json_object(out) if rc == 0 else None
    if not obj:
        return {"error": f"llama.cpp worker exited {rc}: {err.strip()[-600:]}"}
    obj["peak_rss_mb"] = rss
    obj["process_wall_s"] = wall
    obj["command"] = "python bench/e2e/cpu_vs_llamacpp.py --worker ... (llama-cpp-python)"
    return obj


def fmt(x, nd=1):
    return "—" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def report(res):
    rl, lc, roof, m = res["rill"], res["llamacpp"], res["roofline"], res["machine"]
    rows = [
        ("prefill tok/s (512-token prompt)", "prefill_tok_s", 1),
        ("decode tok/s (128 tokens)", "decode_tok_s", 1),
        ("decode, fraction of roofline (weights only)", "decode_roofline_frac", 2),
        ("decode, fraction of roofline (weights + KV)", "decode_roofline_kv_frac", 2),
        ("peak RSS MB", "peak_rss_mb", 1),
        ("peak RSS MB, engine only (llama.cpp: minus Python baseline)", "engine_rss_mb", 1),
        ("time to first token s, short chat prompt", "first_token_short_s", 3),
        ("time to first token s, 512-token prompt", "first_token_s", 3),
        ("model load s", "load_s", 3),
    ]
    lines = ["| metric | rill | llama.cpp | rill/llama.cpp |", "|---|---:|---:|---:|"]
    for label, key, nd in rows:
        a, b = rl.get(key), lc.get(key)
        ratio = f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "—"
        lines.append(f"| {label} | {fmt(a, nd)} | {fmt(b, nd)} | {ratio} |")
    if "ids" in rl and "ids" in lc:
        same = rl["ids"] == lc["ids"][:len(rl["ids"])]
        lines.append(f"| greedy ids identical ({len(lc['ids'])}) | {same} | | |")
    out = ["# rill vs llama.cpp, CPU, SmolLM2-135M-Instruct Q4_1", ""]
    out += lines + [""]
    if "error" in rl:
        out.append(f"**rill failed**: {rl['error']}")
    if "error" in lc:
        out.append(f"**llama.cpp failed**: {lc['error']}")
    if m["loadavg_at_start"][0] > 0.25 * (m["cpus"] or 1):
        out.append(f"**warning**: load average {m['loadavg_at_start'][0]:.2f} at start on "
                   f"{m['cpus']} CPUs: other work shares the cores, numbers are low and noisy")
    out += [
        f"- date: {res['date']}; threads: {res['threads']}; repeats: {res['repeats']} "
        f"(median, after one warm-up)",
        f"- machine: {m['model_name']}, {m['cpus']} CPUs, L3 {m['l3']}, "
        f"{m['mem_total_gb']} GB RAM; flags: {' '.join(m['flags'])}; "
        f"load average at start {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}",
        f"- llama.cpp: llama-cpp-python {lc.get('version', '?')}; {lc.get('system_info', '')}",
        f"- roofline: weights {roof['weight_bytes'] / 1e6:.1f} MB/token "
        f"({', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in roof['bytes_by_type'].items())}; "
        f"tied embedding read as LM head: {roof['tied_embedding']}), "
        f"KV f16 {roof['kv_bytes_per_token_avg'] / 1e6:.1f} MB/token on average over the decode; "
        f"copy bandwidth {roof['copy_bandwidth_gbs']:.1f} GB/s (single-thread numpy copy, 2x size/time) "
        f"-> {roof['roofline_tok_s']:.0f} tok/s weights only, "
        f"{roof['roofline_kv_tok_s']:.0f} tok/s with KV",
        f"- llama.cpp peak RSS includes the Python interpreter, numpy and llama_cpp "
        f"({fmt(lc.get('rss_baseline_mb'))} MB before the model was loaded); "
        f"llama.cpp first token is timed from model load (no Python start-up); "
        f"rill's from process start",
        f"- rill: `{rl.get('command', '')}`",
        f"- llama.cpp: `{lc.get('command', '')}`",
        f"- this report: `{res['command']}`",
    ]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rill", default=os.path.join(ROOT, "build", "rill"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per child process")
    ap.add_argument("--skip-rill", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--wait-quiet", type=int, default=0, metavar="S",
                    help="wait up to S seconds for the 1-minute load average to fall "
                         "below 0.5 before measuring")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)
    args = ap.parse_args()

    ensure_venv()
    if args.worker:
        return llamacpp_worker(args)

    import numpy as np
    from llama_cpp import Llama
    model = os.path.abspath(args.model)
    deadline = time.time() + args.wait_quiet
    while os.getloadavg()[0] >= 0.5 and time.time() < deadline:
        time.sleep(10)
    machine = machine_info()

    # 512 real-text prompt ids, from llama.cpp's tokenizer; the same for both engines.
    vocab = Llama(model_path=model, vocab_only=True, verbose=False)
    ids = []
    while len(ids) < args.prompt_tokens:
        ids = vocab.tokenize((PARAGRAPH * (len(ids) // 100 + 2)).encode(),
                             add_bos=False, special=False)
    ids = ids[:args.prompt_tokens]
    short_ids = vocab.tokenize(SHORT_PROMPT.encode(), add_bos=False, special=True)
    del vocab
    ids_file = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rill_bench_ids_{os.getpid()}.json")
    with open(ids_file, "w") as f:
        json.dump({"long": ids, "short": short_ids}, f)

    weight_bytes, by_type, kv_per_pos, tied = model_bytes(model)
    bw = copy_bandwidth_gbs(np)
    kv_avg = kv_per_pos * (args.prompt_tokens + args.gen_tokens / 2)
    roof = {
        "weight_bytes": weight_bytes, "bytes_by_type": by_type, "tied_embedding": tied,
        "kv_bytes_per_pos": kv_per_pos, "kv_bytes_per_token_avg": kv_avg,
        "copy_bandwidth_gbs": bw,
        "roofline_tok_s": bw * 1e9 / weight_bytes,
        "roofline_kv_tok_s": bw * 1e9 / (weight_bytes + kv_avg),
    }

    print(f"llama.cpp: {args.threads} threads, {args.repeats} repeats ...", file=sys.stderr)
    lc = run_llamacpp(args, ids_file, model)
    if args.skip_rill:
        rl = {"error": "skipped (--skip-rill)"}
    else:
        print(f"rill: {args.rill} ...", file=sys.stderr)
        rl = run_rill(args, ids, short_ids, model)
    os.unlink(ids_file)
    if "peak_rss_mb" in lc:
        lc["engine_rss_mb"] = lc["peak_rss_mb"] - lc["rss_baseline_mb"]
    if "peak_rss_mb" in rl:
        rl["engine_rss_mb"] = rl["peak_rss_mb"]
    for eng in (lc, rl):
        if "decode_tok_s" in eng:
            eng["decode_roofline_frac"] = eng["decode_tok_s"] / roof["roofline_tok_s"]
            eng["decode_roofline_kv_frac"] = eng["decode_tok_s"] / roof["roofline_kv_tok_s"]

    res = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "model": os.path.relpath(model, ROOT), "threads": args.threads,
        "repeats": args.repeats, "prompt_ids": ids, "short_prompt_ids": short_ids,
        "machine": machine, "roofline": roof,
        "llamacpp": lc, "rill": rl,
    }
    text = report(res)
    res["markdown"] = text
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    return 0 if "error" not in lc else 1


if __name__ == "__main__":
    sys.exit(main() or 0)
