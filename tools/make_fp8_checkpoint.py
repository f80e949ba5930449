#!/usr/bin/env python3
"""FP8 versions of a Hugging Face golden model, as Hugging Face writes them.

    tools/tools_venv.sh numpy ml_dtypes   # ml_dtypes only cross-checks the rounding
    .venv-tools/bin/python tools/make_fp8_checkpoint.py \
        /work/shared/goldens/hf/llama tests/data/fp8/llama fp8-block ct-channel ct-tensor

For each layout, OUT-LAYOUT/ gets config.json (the golden's plus a
quantization_config), model.safetensors (every attention/MLP projection
"<m>.weight" as F8_E4M3 with its scale; embeddings, norms and lm_head as
they were) and dequantized.safetensors: those projections dequantized here
in f32 (q * scale, numpy's f32 product), the reference the loader must match.

Layouts:
  fp8-block   transformers "fp8": weight_scale_inv f32 per [32, 48] block
              (rows and columns that do not divide make partial blocks)
  ct-channel  compressed-tensors float-quantized, strategy "channel":
              weight_scale BF16 [rows, 1]
  ct-tensor   compressed-tensors, strategy "tensor": weight_scale F32 [1]
  ct-block    compressed-tensors, strategy "block" [32, 32]: weight_scale F32

e4m3 rounding is written out here (nearest, ties to even, saturating at
448); when ml_dtypes is importable it must agree with float8_e4m3fn.
Scales are max |w| / 448 per group (1 for an all-zero group).
"""
import json
import re
import struct
import sys
from pathlib import Path

import numpy as np

E4M3_MAX = 448.0
QUANTIZED = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight$")


def read_safetensors(path):
    raw = Path(path).read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    dtypes = {"F32": np.float32, "F16": np.float16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":
            u = np.frombuffer(data[b:e], dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(data[b:e], dtype=dtypes[info["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (safetensors dtype, shape, bytes)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, blob = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def to_bf16_bits(x):
    """f32 -> bf16 bits, nearest even (no NaNs here)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def e4m3_round(x):
    """x (f32) -> (e4m3fn bytes, their f32 values): nearest, ties to even, saturating."""
    a = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)
    _, e2 = np.frexp(a)  # a = m * 2^e2, m in [0.5, 1)
    exp = np.maximum(e2 - 1, -6)  # normals below 2^-6 are subnormals with quantum 2^-9
    quantum = np.ldexp(1.0, exp - 3)
    mag = np.minimum(np.round(a / quantum) * quantum, E4M3_MAX)  # np.round: ties to even
    _, e2 = np.frexp(mag)
    normal = mag >= 2.0 ** -6
    e_val = np.where(normal, e2 - 1, 0)
    mant = np.where(normal, (mag / np.ldexp(1.0, e_val) - 1) * 8, mag / 2.0 ** -9)
    code = np.where(normal, ((e_val + 7) << 3) | mant.astype(np.int64), mant.astype(np.int64))
    code = code | np.where(np.signbit(x) & (mag > 0), 0x80, 0)
    values = np.where(np.signbit(x), -mag, mag).astype(np.float32)
    try:
        import ml_dtypes
        ref = np.asarray(x, dtype=np.float32).clip(-E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
        assert np.array_equal(ref.astype(np.float32), values), "e4m3 rounding differs from ml_dtypes"
        assert np.array_equal(ref.view(np.uint8)[mag > 0], code.astype(np.uint8)[mag > 0])
    except ImportError:
        pass
    return code.astype(np.uint8), values


def group_scales(w, br, bc):
    """max |w| / 448 per [br, bc] block of w: [ceil(rows / br), ceil(cols / bc)] f32."""
    rows, cols = w.shape
    ni, nj = -(-rows // br), -(-cols // bc)
    s = np.ones((ni, nj), dtype=np.float32)
    for i in range(ni):
        for j in range(nj):
            m = np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max()
            if m > 0:
                s[i, j] = np.float32(m) / np.float32(E4M3_MAX)
    return s


def quantize(w, scales, br, bc):
    """(e4m3 bytes, f32 dequantization q * scale) of w under per-block scales."""
    full = np.repeat(np.repeat(scales, br, axis=0), bc, axis=1)[:w.shape[0], :w.shape[1]]
    q, qv = e4m3_round((w / full).astype(np.float32))
    return q, (qv * full).astype(np.float32)


LAYOUTS = {
    # name: (block rows (None: all rows), block cols (None: whole rows), scale tensor suffix, scale dtype)
    "fp8-block": (32, 48, "weight_scale_inv", "F32"),
    "ct-channel": (1, None, "weight_scale", "BF16"),
    "ct-tensor": (None, None, "weight_scale", "F32"),
    "ct-block": (32, 32, "weight_scale", "F32"),
}


def quantization_config(layout):
    if layout == "fp8-block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 48],
                "modules_to_not_convert": ["lm_head"]}
    strategy = layout.split("-")[1]
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": strategy,
               "block_structure": [32, 32] if strategy == "block" else None, "dynamic": False,
               "actorder": None, "observer": "minmax", "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "kv_cache_scheme": None, "sparsity_config": {},
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": weights, "output_activations": None,
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                      "dynamic": True}}}}


def make(golden, out, layout):
    br, bc, scale_name, scale_dtype = LAYOUTS[layout]
    weights = read_safetensors(Path(golden) / "model.safetensors")
    model, deq = {}, {}
    for name, w in weights.items():
        if not QUANTIZED.match(name):
            model[name] = ("F32", w.shape, w.astype("<f4").tobytes())
            continue
        rows, cols = w.shape
        gr, gc = br or rows, bc or cols
        scales = group_scales(w, gr, gc)
        if scale_dtype == "BF16":
            bits = to_bf16_bits(scales)
            scales = from_bf16_bits(bits)  # quantize against the stored (rounded) scale
            blob = bits.astype("<u2").tobytes()
        else:
            blob = scales.astype("<f4").tobytes()
        q, d = quantize(w, scales, gr, gc)
        shape = [1] if br is None else list(scales.shape)
        model[name] = ("F8_E4M3", w.shape, q.tobytes())
        model[name[:-len("weight")] + scale_name] = (scale_dtype, shape, blob)
        deq[name] = ("F32", w.shape, d.astype("<f4").tobytes())
    config = json.loads((Path(golden) / "config.json").read_text())
    config["quantization_config"] = quantization_config(layout)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(Path(out) / "model.safetensors", model)
    write_safetensors(Path(out) / "dequantized.safetensors", deq)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    golden, out = sys.argv[1], sys.argv[2]
    for layout in sys.argv[3:]:
        make(golden, f"{out}-{layout}", layout)


if __name__ == "__main__":
    main()
