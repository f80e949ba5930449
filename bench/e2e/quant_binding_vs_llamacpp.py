#!/usr/bin/env python3
"""rill builds vs llama.cpp through its Python binding (llama-cpp-python,
whose llama.cpp .venv-tools builds for the host CPU), on one GGUF: prefill
of a 512-token prompt in one batch, then decode, engines alternating per
repeat. For when llama-bench (bench/build_llamacpp_tools.sh, an hour-long
build on a shared 2-core machine) is not at hand; quant_types_vs_llamacpp.py
is the side by side with llama-bench.

Each run reports wall tok/s and CPU seconds: rill's whole process (load,
prefill, decode), llama.cpp's prefill and decode alone (time.process_time
in the binding's process; its OpenMP threads spin while they wait, so on
a loaded machine its wall figures collapse first). llama.cpp gets a
32-token warm-up eval before the timed prefill (every weight touched, the
threads started), as llama-bench warms up; the timed prefill is one
llama_decode of the 512 ids (n_batch = n_ubatch = 512), decode one eval a
token after it.

    bench/e2e/quant_binding_vs_llamacpp.py MODEL --rill build-cpu/rill [--rill OTHER] [--repeats 2] [--gen 128]
"""
import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prompt_ids(n, max_id):
    rng = random.Random(7)
    return [rng.randrange(259, max_id) for _ in range(n)]


def llama_child(model, threads, n_prompt, n_gen, max_id):
    import llama_cpp
    ids = prompt_ids(n_prompt, max_id)
    rng = random.Random(8)
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_prompt + n_gen + 16, n_batch=n_prompt, n_ubatch=n_prompt,
                          n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.eval(ids[:32])
    llm.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    llm.eval(ids)
    t1, c1 = time.perf_counter(), time.process_time()
    for _ in range(n_gen):
        llm.eval([rng.randrange(259, max_id)])
    t2, c2 = time.perf_counter(), time.process_time()
    print(json.dumps({"prefill_tps": n_prompt / (t1 - t0), "decode_tps": n_gen / (t2 - t1) if n_gen else 0.0,
                      "prefill_cpu_s": c1 - c0, "decode_cpu_s": c2 - c1}))


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rill", action="append", default=[], help="a rill binary (repeatable)")
    ap.add_argument("--llama-python", default=os.path.join(ROOT, ".venv-tools", "bin", "python"),
                    help="a python with llama_cpp installed")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-id", type=int, default=128000, help="prompt ids are drawn from [259, max-id)")
    ap.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_child:
        return llama_child(args.model, args.threads, args.prompt, args.gen, args.max_id)
    ids = prompt_ids(args.prompt, args.max_id)

    def run_rill(binary):
        c0 = child_cpu()
        p = subprocess.run([binary, "run", args.model, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens",
                            str(args.gen + 1), "--json", "--threads", str(args.threads), "--ignore-eos",
                            "--temperature", "0"], capture_output=True, text=True, check=True)
        t = json.loads(p.stdout.strip().splitlines()[-1])["timings"]
        return {"prefill_tps": t["prompt_tokens"] / t["prefill_s"],
                "decode_tps": t["decode_tokens"] / t["decode_s"] if t["decode_s"] else 0.0,
                "process_cpu_s": child_cpu() - c0}

    def run_llama():
        p = subprocess.run([args.llama_python, os.path.abspath(__file__), "--llama-child", args.model, "--threads",
                            str(args.threads), "--prompt", str(args.prompt), "--gen", str(args.gen), "--max-id",
                            str(args.max_id)],
                           capture_output=True, text=True, check=True)
        return json.loads(p.stdout.strip().splitlines()[-1])

    res = {k: [] for k in args.rill + ["llama.cpp"]}
    for _ in range(args.repeats):
        for k in res:
            load1 = os.getloadavg()[0]
            r = run_rill(k) if k != "llama.cpp" else run_llama()
            r["load1"] = load1
            res[k].append(r)
            print(os.path.basename(args.model), k, json.dumps(r), flush=True)
    print(json.dumps({"model": args.model, "results": res}))


if __name__ == "__main__":
    main()
