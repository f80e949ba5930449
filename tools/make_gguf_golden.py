#!/usr/bin/env python3
"""Dumps the default model's GGUF header with the reference reader (the `gguf`
package from llama.cpp) to tests/data/gguf/smollm2_summary.json, which
tests/loader/gguf_test.cpp compares rill's reader against.

    tools/make_gguf_golden.py [model.gguf] [out.json]
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")

if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), "gguf"])
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

from gguf import GGUFReader, GGUFValueType  # noqa: E402


def field_value(field):
    types = field.types
    if types[0] == GGUFValueType.ARRAY:
        return None
    if types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    value = field.parts[field.data[0]][0]
    if types[0] == GGUFValueType.BOOL:
        return bool(value)
    if types[0] in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        return float(value)
    return int(value)


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        ROOT, "tests", "data", "gguf", "smollm2_summary.json")
    r = GGUFReader(model)
    scalars, arrays = {}, {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            elem = field.types[1] if len(field.types) > 1 else None
            entry = {"elem_type": int(elem), "length": len(field.data)}
            if elem == GGUFValueType.STRING:  # first and last elements, to check order
                entry["first"] = bytes(field.parts[field.data[0]]).decode("utf-8")
                entry["last"] = bytes(field.parts[field.data[-1]]).decode("utf-8")
            elif elem is not None and len(field.data):
                entry["first"] = field.parts[field.data[0]][0].item()
                entry["last"] = field.parts[field.data[-1]][0].item()
            arrays[key] = entry
        else:
            scalars[key] = {"type": int(field.types[0]), "value": field_value(field)}
    tensors = [{
        "name": t.name,
        "type": int(t.tensor_type),
        "ne": [int(d) for d in t.shape],        # GGML order, ne[0] innermost
        "offset": int(t.data_offset) - int(r.data_offset),  # relative to the data section
        "n_bytes": int(t.n_bytes),
    } for t in r.tensors]
    summary = {
        "file": os.path.basename(model),
        "file_size": os.path.getsize(model),
        "version": int(r.fields["GGUF.version"].parts[-1][0]),
        "alignment": int(r.alignment),
        "data_start": int(r.data_offset),
        "n_kv": len(r.fields) - 3,
        "scalars": scalars,
        "arrays": arrays,
        "tensors": tensors,
    }
    with open(out, "w") as f:
        json.dump(summary, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}: {len(scalars)} scalars, {len(arrays)} arrays, {len(tensors)} tensors")


if __name__ == "__main__":
    main()
