#!/usr/bin/env python3
"""Hugging Face transformers `generate` on the same model and device, the
baseline next to bench_cuda's numbers (same run, same machine).

  python3 hf_baseline.py MODEL_DIR [--batches 1,8,32,64,128] [--prompt 128] [--new 128] [--json OUT]

Random prompt ids (seeded), greedy, exactly --new tokens (min_new_tokens),
bf16 weights, default attention implementation. tok/s = batch * new tokens /
wall time of generate (prefill included, as the issue's reference numbers).
"""
import argparse, json, time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--json")
    a = ap.parse_args()
    import transformers
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).cuda().eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, load {time.time() - t0:.1f} s", flush=True)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "runs": []}
    for b in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(0, vocab, (b, a.prompt), generator=g).cuda()
        mask = torch.ones_like(ids)
        kw = dict(attention_mask=mask, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                  pad_token_id=0)
        with torch.no_grad():
            model.generate(ids, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
            torch.cuda.synchronize()
            t = time.time()
            res = model.generate(ids, **kw)
            torch.cuda.synchronize()
            dt = time.time() - t
        n_new = res.shape[1] - a.prompt
        r = {"batch": b, "new_tokens": int(n_new), "s": dt, "tok_s": b * n_new / dt}
        out["runs"].append(r)
        print(f"hf generate batch {b:3d}: {r['tok_s']:.1f} tok/s ({dt:.2f} s for {n_new} new tokens)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
