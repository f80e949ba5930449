#!/usr/bin/env python3
"""Hugging Face transformers on a model directory, timed the way bench_cuda
times rill (same run, same device, same files): the peer column of
docs/perf.md's model-family table.

  python3 hf_family_peer.py MODEL_DIR [--batches 1,64] [--steps 8] [--prompt 128]
                            [--prefill 2048] [--budget S] [--json OUT]

AutoModelForCausalLM, bf16 weights on the GPU, the default attention
implementation, eager PyTorch (no torch.compile: compiling these 24 to 30
layer MoE graphs takes minutes per shape), the dynamic KV cache, and the
experts backend "grouped_mm" (transformers' fastest without compilation;
the default when from_pretrained refuses it, "eager" when the first forward
fails with it; the JSON names the one used).
  prefill: one --prefill-token prompt of random ids, one forward (logits of
           the last position only), median of 3 after a warm-up
  decode:  B prompts of --prompt random ids in one forward, then greedy
           one-token steps (argmax on the GPU, fed back); 2 warm-up steps,
           then --steps timed as a whole: tok/s = B * steps / time
Stages past --budget seconds (from the start) are skipped and said so.
"""
import argparse
import json
import time

import torch


def log(*a):
    print(*a, flush=True)


def load(path):
    """The model, and the experts backend its first forward ran with."""
    from transformers import AutoModelForCausalLM
    kw = dict(dtype=torch.bfloat16, device_map="cuda")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="grouped_mm", **kw)
    except Exception as e:  # an older transformers, or a model without the experts interface
        log(f"experts_implementation='grouped_mm' refused ({type(e).__name__}: {str(e)[:200]}); default")
        model = AutoModelForCausalLM.from_pretrained(path, **kw)
    model.eval()
    ids = torch.arange(1, 9, device="cuda")[None]
    try:
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1)
    except Exception as e:  # grouped_mm needs torch 2.9+: fall back to the reference loop
        log(f"first forward failed ({type(e).__name__}: {str(e)[:200]}); experts 'eager'")
        for m in model.modules():
            cfg = getattr(m, "config", None)
            if cfg is not None and hasattr(cfg, "_experts_implementation"):
                cfg._experts_implementation = "eager"
        with torch.inference_mode():
            model(input_ids=ids, logits_to_keep=1)
    return model, getattr(model.config, "_experts_implementation", None)


@torch.inference_mode()
def prefill(model, vocab, n):
    ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(1)).cuda()
    ts = []
    for _ in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts[1:])[1]


@torch.inference_mode()
def decode(model, vocab, B, prompt, steps):
    ids = torch.randint(0, vocab, (B, prompt), generator=torch.Generator().manual_seed(B)).cuda()
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    for i in range(2 + steps):
        if i == 2:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, nxt[0].item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--budget", type=float, default=150.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    import transformers
    T0 = time.time()
    res = {"transformers": transformers.__version__, "torch": torch.__version__, "decode": [], "notes": []}

    def dump():
        res["total_s"] = time.time() - T0
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)

    try:
        model, experts = load(a.model)
    except Exception as e:  # transformers cannot run this model: say why
        res["notes"].append(f"load failed: {type(e).__name__}: {str(e)[:400]}")
        log("hf peer:", res["notes"][-1])
        dump()
        return
    res["experts_implementation"] = experts
    res["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    res["load_s"] = time.time() - T0
    vocab = model.config.get_text_config().vocab_size
    log(f"hf peer: transformers {transformers.__version__}, torch {torch.__version__}, load {res['load_s']:.1f} s, "
        f"experts {experts}, attention {res['attn_implementation']}, "
        f"{torch.cuda.memory_allocated() / 1e9:.1f} GB on the GPU")
    dump()
    stages = [("prefill", a.prefill)] + [("decode", int(b)) for b in a.batches.split(",")]
    for kind, n in stages:
        if time.time() - T0 > a.budget:
            res["notes"].append(f"{kind} {n}: skipped, past the {a.budget:.0f} s budget")
            log("hf peer:", res["notes"][-1])
            continue
        try:
            if kind == "prefill":
                s = prefill(model, vocab, n)
                res["prefill"] = {"tokens": n, "ms": s * 1e3, "tok_s": n / s}
                log(f"hf peer prefill {n}: {s * 1e3:.1f} ms, {n / s:.0f} tok/s")
            else:
                s, _ = decode(model, vocab, n, a.prompt, a.steps)
                r = {"batch": n, "steps": a.steps, "ms_per_step": s / a.steps * 1e3, "tok_s": n * a.steps / s}
                res["decode"].append(r)
                log(f"hf peer decode batch {n:3d}: {r['ms_per_step']:.2f} ms/step, {r['tok_s']:.1f} tok/s")
        except Exception as e:  # report and go on (out of memory, an unsupported path)
            res["notes"].append(f"{kind} {n}: failed: {type(e).__name__}: {str(e)[:300]}")
            log("hf peer:", res["notes"][-1])
        torch.cuda.empty_cache()
        dump()
    dump()


if __name__ == "__main__":
    main()
