#!/usr/bin/env python3
"""An f32 copy of a GGUF model: every tensor dequantized with the `gguf`
package's numpy reference (gguf.quants.dequantize), every metadata key kept.

The copy computes the same function as the original weights but without
the 8-bit activation blocks (Q8_0/Q8_1) that a quantized weight's matmul
rounds its input to. Those roundings are discontinuous, so on the quantized
model any small change upstream (f16 instead of f32 KV, say) flips some of
them and is amplified: a KV type's accuracy (bench_kv_quality) is best
measured on the copy too (docs/perf.md, "Quantized KV cache").

    tools/dequantize_gguf.py IN.gguf OUT.gguf
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
subprocess.run([os.path.join(ROOT, "tools", "tools_venv.sh"), "gguf", "numpy"], check=True)
if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    venv_python = os.path.join(ROOT, ".venv-tools", "bin", "python")
    os.execv(venv_python, [venv_python, *sys.argv])

import gguf  # noqa: E402
import numpy as np  # noqa: E402
from gguf.quants import dequantize  # noqa: E402


def main(src, dst):
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer adds these
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), kind, field.types[1] if len(field.types) > 1 else None)
        else:
            writer.add_key_value(name, field.contents(), kind)
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]  # GGUF lists the fastest axis first
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            values = np.array(t.data, dtype=np.float32)
        else:
            values = dequantize(t.data, t.tensor_type).astype(np.float32)
        writer.add_tensor(t.name, values.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
