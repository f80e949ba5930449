#!/usr/bin/env python3
"""Goldens for rill's Q2_K, Q3_K, IQ4_NL and IQ4_XS dequantizers, from the
`gguf` package's numpy reference (gguf.quants, maintained with llama.cpp).

Writes tests/data/quants/iquant_blocks.json: for each type, seeded random
blocks (raw bytes in hex, the f16 scale fields set to sane values) and
their dequantized values.

    tools/make_iquant_goldens.py
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
from gguf.quants import GGML_QUANT_SIZES, dequantize  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "quants", "iquant_blocks.json")

# Byte offsets of the f16 scale fields in each block layout (ggml-common.h).
F16_FIELDS = {"Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0]}
N_BLOCKS = {"Q2_K": 3, "Q3_K": 3, "IQ4_NL": 5, "IQ4_XS": 3}


def random_blocks(name, n_blocks, rng):
    _, type_size = GGML_QUANT_SIZES[T[name]]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        vals = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return raw


def main():
    rng = np.random.default_rng(4321)
    blocks = {}
    for name in F16_FIELDS:
        raw = random_blocks(name, N_BLOCKS[name], rng)
        values = dequantize(raw.reshape(-1), T[name]).astype(np.float32)
        blocks[name] = {"hex": raw.tobytes().hex(), "values": [float(v) for v in values]}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"source": "gguf.quants.dequantize (numpy reference)", "types": blocks}, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
