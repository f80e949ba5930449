#!/usr/bin/env python3
"""Goldens for rill's quantized KV cache (issue 22), from the `gguf` package's
numpy reference (gguf.quants, maintained with llama.cpp).

Writes tests/data/quants/kv_quant.json: seeded rows of f32 K/V-like values
(a few large outlier channels, a zero block, a constant block, ties at the
block maximum) and, for each KV type, the blocks gguf.quants.quantize makes
of them (hex bytes) and the values gguf.quants.dequantize reads back. rill's
store path (cpu::ref::quantize_kv_row) must give the same bytes; its
attention dequantizers the same values.

    tools/make_kv_quant_goldens.py
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
from gguf.quants import dequantize, quantize  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "quants", "kv_quant.json")
TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]


def rows(rng):
    n_rows, width = 4, 256
    x = rng.normal(0.0, 1.0, size=(n_rows, width)).astype(np.float32)
    x[:, 7] *= 12.0  # outlier channels, as K has
    x[:, 131] *= -9.0
    x[1, 32:64] = 0.0  # an all-zero block
    x[2, 64:96] = 0.75  # a constant block
    x[3, 0:32] = np.linspace(-1.0, 1.0, 32, dtype=np.float32)  # ties at +-max
    return x


def main():
    rng = np.random.default_rng(2222)
    x = rows(rng)
    out = {"source": "gguf.quants.quantize / dequantize (numpy reference)", "n_rows": int(x.shape[0]),
           "width": int(x.shape[1]), "input_hex": x.tobytes().hex(), "types": {}}
    for name in TYPES:
        q = quantize(x, T[name])
        values = dequantize(q, T[name]).astype(np.float32)
        out["types"][name] = {"hex": q.tobytes().hex(), "values_hex": values.tobytes().hex()}
    with open(OUT, "w") as f:
        json.dump(out, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
