#!/usr/bin/env python3
"""Gemma checkpoints with heads of 64 for the k4c / k4a tests on Gemma.

The tiny HF goldens (../shared/goldens/hf/gemma2, gemma3) have heads of 16,
which hold no iq4_nlh64 block (V's type in k4c and k4a needs head_dim a
multiple of 64), so k4c's V never ran on a Gemma model. This writes, for
each, the same config with head_dim 64 (and query_pre_attn_scalar 64) and
random attention weights of the new shapes (q/k/v/o projections, q/k
norms), every other tensor copied from the golden, into
tests/data/gemma-hd64/<family>/ (config.json, model.safetensors, f32).

There are no logits to compare with: the tests hold rill's k4c / k4a KV
to rill's own f32 KV on these checkpoints (tests/model/gemma_kv_tails_test.cpp).
numpy only (tools/f32_safetensors.py reads and writes the files). Deterministic (seed per family).

    python3 tools/make_wide_gemma_golden.py [SHARED_DIR]
"""
import json
import os
import sys

import numpy as np

from f32_safetensors import read_f32_safetensors, write_f32_safetensors

HEAD_DIM = 64


def widen(src, dst, seed):
    cfg = json.load(open(os.path.join(src, "config.json")))
    old = cfg["head_dim"]
    n_head, n_kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    cfg["head_dim"] = HEAD_DIM
    if "query_pre_attn_scalar" in cfg:
        cfg["query_pre_attn_scalar"] = HEAD_DIM
    rng = np.random.default_rng(seed)
    t = read_f32_safetensors(os.path.join(src, "model.safetensors"))
    for name in list(t):
        a = t[name]
        std = float(a.std()) or 0.02
        if name.endswith("self_attn.q_proj.weight"):
            t[name] = rng.normal(0, std, (n_head * HEAD_DIM, hidden))
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            t[name] = rng.normal(0, std, (n_kv * HEAD_DIM, hidden))
        elif name.endswith("self_attn.o_proj.weight"):
            # 4x the inputs: the same output variance at half the std.
            t[name] = rng.normal(0, std * (old / HEAD_DIM) ** 0.5, (hidden, n_head * HEAD_DIM))
        elif name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            t[name] = np.resize(a, HEAD_DIM) + rng.normal(0, 0.01, HEAD_DIM)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
        f.write("\n")
    write_f32_safetensors(os.path.join(dst, "model.safetensors"), t)
    print(dst, {k: v.shape for k, v in t.items() if ".layers.0.self_attn." in k})


def main():
    shared = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "shared")
    out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gemma-hd64")
    for seed, family in enumerate(["gemma2", "gemma3"]):
        widen(os.path.join(shared, "goldens", "hf", family), os.path.join(out, family), 1000 + seed)


if __name__ == "__main__":
    main()
