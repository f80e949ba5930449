#!/usr/bin/env python3
"""Goldens for rill's block dequantizers, from the `gguf` package's numpy
reference (gguf.quants, maintained with llama.cpp).

Writes tests/data/quants/blocks.json: for each quant type, a few seeded
random blocks (raw bytes in hex, with sane f16 scales) and their dequantized
values; and tests/data/quants/smollm2_rows.json: the first rows of a Q4_1
tensor and of the Q8_0 token embedding of the default model, raw bytes and
dequantized values.

    tools/make_quant_goldens.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
subprocess.run([os.path.join(ROOT, "tools", "tools_venv.sh"), "gguf", "numpy"], check=True)
if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    venv_python = os.path.join(ROOT, ".venv-tools", "bin", "python")
    os.execv(venv_python, [venv_python, *sys.argv])

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from gguf.quants import GGML_QUANT_SIZES, dequantize  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "quants")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Byte offsets of the f16 scale fields in each block layout (must hold sane values).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}


def random_blocks(name, n_blocks, rng):
    qtype = T[name]
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        vals = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(1234)
    blocks = {}
    for name in F16_FIELDS:
        raw = random_blocks(name, 3, rng)
        values = dequantize(raw.reshape(-1), T[name]).astype(np.float32)
        blocks[name] = {"hex": raw.tobytes().hex(), "values": [float(v) for v in values]}
    with open(os.path.join(OUT, "blocks.json"), "w") as f:
        json.dump({"source": "gguf.quants.dequantize (numpy reference)", "types": blocks}, f)

    if os.path.exists(MODEL):
        reader = GGUFReader(MODEL)
        rows = {}
        for t in reader.tensors:
            if t.name not in ("blk.0.attn_q.weight", "token_embd.weight"):
                continue
            data = np.asarray(t.data)  # [n_rows, row_bytes] uint8
            n_cols = int(t.shape[0])
            sel = data[:2]
            values = dequantize(sel, t.tensor_type).astype(np.float32).reshape(-1)
            rows[t.name] = {"type": t.tensor_type.name, "n_cols": n_cols, "n_rows": 2,
                            "hex": sel.tobytes().hex(), "values": [float(v) for v in values]}
        with open(os.path.join(OUT, "smollm2_rows.json"), "w") as f:
            json.dump({"source": "gguf.quants.dequantize of " + os.path.basename(MODEL), "tensors": rows}, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
