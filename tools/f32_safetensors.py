"""Reading and writing f32 safetensors files with numpy alone.

The golden makers in tools/ work on the tiny f32 checkpoints of
../shared/goldens/hf and write new ones, without torch or the safetensors
package: an 8-byte little-endian header length, the JSON header (tensor name
to dtype, shape and data offsets, padded with spaces to 8 bytes), then the
raw little-endian data, tensors in name order.
"""
import json
import struct

import numpy as np


def read_f32_safetensors(path):
    """{name: float32 array} of the file at path (every tensor must be F32)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"]).copy()
    return out


def write_f32_safetensors(path, tensors, metadata=None):
    """Writes {name: array} as F32 to path, with an optional __metadata__."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
