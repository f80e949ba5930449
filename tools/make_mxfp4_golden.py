#!/usr/bin/env python3
"""Goldens for rill's MXFP4 blocks (ggml type 39, gpt-oss's expert weights
as GGUF ships them), from the `gguf` package's numpy reference
(gguf.quants, maintained with llama.cpp).

Writes tests/data/quants/mxfp4.json: seeded random MXFP4 blocks (raw bytes
in hex; the e8m0 exponents cover the subnormal 0 and 1, ordinary scales
and 250) with their dequantized values, Q8_0 activation rows quantized by
gguf.quants.quantize, and the dot product of each weight row with each
activation row computed in float64 from the two dequantized rows.

    tools/make_mxfp4_golden.py
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
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "quants", "mxfp4.json")
N_COLS = 128  # 4 blocks per row


def main():
    rng = np.random.default_rng(39)
    block_size, type_size = GGML_QUANT_SIZES[T.MXFP4]
    assert (block_size, type_size) == (32, 17)
    n_rows = 3
    n_blocks = n_rows * N_COLS // block_size
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    exps = [0, 1, 2, 250] + list(rng.integers(110, 135, size=n_blocks - 4))
    raw[:, 0] = np.array(exps[:n_blocks], dtype=np.uint8)
    w = dequantize(raw.reshape(-1), T.MXFP4).astype(np.float32).reshape(n_rows, N_COLS)
    # Rows of ordinary magnitude for the dot products (row 0 holds the extreme scales).
    acts = rng.normal(0.0, 1.0, size=(2, N_COLS)).astype(np.float32)
    q8 = quantize(acts, T.Q8_0)  # [2, row bytes]
    a = dequantize(q8, T.Q8_0).astype(np.float64).reshape(2, N_COLS)
    dots = [[float(np.dot(w[r].astype(np.float64), a[i])) for i in range(2)] for r in range(1, n_rows)]
    out = {
        "source": "gguf.quants (numpy reference): dequantize MXFP4, quantize Q8_0; dots in float64",
        "n_cols": N_COLS,
        "weights": {"n_rows": n_rows, "hex": raw.tobytes().hex(), "values": [float(v) for v in w.reshape(-1)]},
        "q8_0": {"n_rows": 2, "hex": q8.tobytes().hex()},
        "dots": {"weight_rows": [1, 2], "values": dots},
    }
    with open(OUT, "w") as f:
        json.dump(out, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
