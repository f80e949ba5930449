#!/usr/bin/env python3
# The noise floor of a quantized KV type's logits on the CPU (issue 22,
# docs/perf.md "gemma3's bound"): how far f32-level noise moves them. For
# each seed, a copy of the f32 checkpoint with every nonzero f32 weight
# moved by -1, 0 or +1 ulp (uniformly at random), scored by `rill score`
# with f32 KV and with the KV type on the same ids as the original; printed
# per seed: the f32 logits' rms difference (the noise's own size, to set
# beside the CUDA f32 run's difference from the CPU's) and the KV type's,
# over all positions and over positions 0-31, as a share of the type's own
# change (its logits against f32 KV's). A CUDA run of the type whose
# difference from the CPU's sits within this spread is at the noise floor.
# IDS: "spread" (default: (7919 i + 13) mod vocab) or "test" (the CUDA k4c
# tests' prompt, tests/cuda/chan_model_test_util.h prompt(n, vocab)); ULPS:
# the largest move a weight takes (default 1: -1, 0 or +1 ulp).
# usage: .venv-tools/bin/python tools/kv_noise_floor.py RILL MODEL_DIR KV_TYPE [SEEDS] [N_IDS] [IDS] [ULPS]
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np


def perturbed_copy(src, dst, seed, ulps):
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)
    raw = open(os.path.join(src, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = bytearray(raw[8 + n:])
    rng = np.random.default_rng(seed)
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        bits = np.frombuffer(bytes(data[a:b]), dtype=np.uint32).astype(np.int64)
        step = rng.integers(-ulps, ulps + 1, size=bits.shape)
        moved = np.where((bits & 0x7FFFFFFF) != 0, bits + step, bits)
        data[a:b] = moved.astype(np.uint32).tobytes()
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(raw[:8 + n] + bytes(data))


def logits(rill, model, ids, kv):
    out = subprocess.run([rill, "score", model, "--ids", ids, "--json", "--kv-type", kv, "--threads", "2"],
                         check=True, capture_output=True, text=True).stdout
    return np.array(json.loads(out)["logits"], dtype=np.float64)


def rms(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


def main():
    rill, model, kv = sys.argv[1], sys.argv[2], sys.argv[3]
    seeds = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    n_ids = int(sys.argv[5]) if len(sys.argv) > 5 else 100
    which = sys.argv[6] if len(sys.argv) > 6 else "spread"
    ulps = int(sys.argv[7]) if len(sys.argv) > 7 else 1
    vocab = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
    if which == "test":
        ids = ",".join(str((i * 53 + 7 + (i * i) % 11) % vocab) for i in range(n_ids))
    else:
        ids = ",".join(str((i * 7919 + 13) % vocab) for i in range(n_ids))
    f32, q = logits(rill, model, ids, "f32"), logits(rill, model, ids, kv)
    own = rms(q, f32)
    print(f"{model} {kv} ({which} ids, up to {ulps} ulp): own change against f32 KV rms {own:.5f}")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(1, seeds + 1):
            copy = os.path.join(tmp, f"s{seed}")
            perturbed_copy(model, copy, seed, ulps)
            pf, pq = logits(rill, copy, ids, "f32"), logits(rill, copy, ids, kv)
            d = rms(pq, q)
            print(f"  seed {seed}: f32 rms {rms(pf, f32):.3g}; {kv} rms {d:.5f} ({100 * d / own:.1f}% of own), "
                  f"positions 0-31 {rms(pq[:32], q[:32]):.5f}")
            shutil.rmtree(copy)


if __name__ == "__main__":
    main()
