#!/usr/bin/env python3
"""An MXFP4 checkpoint of the gpt-oss golden, laid out as OpenAI ships
gpt-oss on Hugging Face, and its dense dequantization.

From ../shared/goldens/hf/gpt-oss (f32) it writes tests/data/gpt_oss_mxfp4/:

    config.json        the golden's, plus gpt-oss-20b's quantization_config
                       {"quant_method": "mxfp4", "modules_to_not_convert":
                       [self_attn, router, embed_tokens, lm_head]}
    model-00001-of-00002.safetensors   every tensor but the experts (f32, as
                       in the golden)
    model-00002-of-00002.safetensors   per layer mlp.experts.
                       gate_up_proj_blocks U8 [X, 2F, E/32, 16],
                       gate_up_proj_scales U8 [X, 2F, E/32],
                       down_proj_blocks U8 [X, E, F/32, 16],
                       down_proj_scales U8 [X, E, F/32] and the f32 biases
    model.safetensors.index.json       the weight map (gpt-oss ships sharded)
    dequantized.safetensors   gate_up_proj [X, E, 2F] / down_proj [X, F, E]
                       f32 per layer: transformers' own dequantization of
                       those blocks (convert_moe_packed_tensors, ported to
                       numpy below: low nibble element 2k, high 2k + 1, times
                       2^(scale - 127), then transposed), exact in f32

Transformers' layout (transformers 5.25 integrations/mxfp4.py,
Mxfp4GptOssExperts): rows are the expert's outputs (gate_up_proj: gate in
the even rows, up in the odd ones), 32 weights a group along the inputs,
16 bytes of e2m1 codes a group (element 2k in the low nibble of byte k)
and one e8m0 scale a group. The values are chosen by gguf-py's MXFP4
quantizer (ggml's rule: scale exponent floor(log2 amax) - 2), so the
weights are those of tests/data/gguf_families/gpt_oss_mxfp4.gguf
(tools/make_family_gguf.py).

Checks, each of which fails the tool:
  * transformers' dequantization of the blocks equals gguf-py's
    dequantization of ggml's blocks of the same weights (bit for bit);
  * llama.cpp's converter (convert_hf_to_gguf.py of the llama-cpp-python
    0.3.36 source package, conversion/gpt_oss.py: GptOssModel.
    generate_extra_tensors, repack_mxfp4, transform_nibble_layout, ported
    to numpy line by line, and base.py's generic repack_mxfp4_blocks,
    ported too: both must agree) turns the checkpoint's blocks into GGUF
    MXFP4 tensors; with the rest of the file written as
    tools/make_family_gguf.py writes the converter's gpt-oss output, the
    GGUF is byte for byte tests/data/gguf_families/gpt_oss_mxfp4.gguf, on
    which llama.cpp's logits are gpt_oss_mxfp4.json.
The converter itself imports torch (and a tokenizer), which this machine
cannot install (PyPI's torch is the CUDA build; the CPU index is not
reachable), hence the ports, as in make_family_gguf.py.

    tools/make_mxfp4_checkpoint.py
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402

SHARED = os.environ.get("RILL_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
if not os.path.isdir(SHARED):
    SHARED = "/work/shared"
GOLDEN = os.path.join(SHARED, "goldens", "hf", "gpt-oss")
OUT = os.path.join(ROOT, "tests", "data", "gpt_oss_mxfp4")
GGUF_REF = os.path.join(ROOT, "tests", "data", "gguf_families", "gpt_oss_mxfp4.gguf")
VERSION = "0.3.36"
# gpt-oss-20b's config.json
QUANT_CONFIG = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
# transformers integrations/mxfp4.py FP4_VALUES
FP4_VALUES = [+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def llamacpp_source():
    """The llama.cpp of the llama-cpp-python source package (as
    bench/build_llamacpp_tools.sh fetches it), unpacked under build/llamacpp."""
    top = os.path.join(ROOT, "build", "llamacpp")
    src = os.path.join(top, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")
    if not os.path.isfile(os.path.join(src, "conversion", "gpt_oss.py")):
        os.makedirs(top, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-binary", ":all:", "-d", top, f"llama-cpp-python=={VERSION}"], check=True)
        subprocess.run(["tar", "xzf", os.path.join(top, f"llama_cpp_python-{VERSION}.tar.gz"), "-C", top],
                       check=True)
    return src


def ggml_to_hf(q, np):
    """ggml block_mxfp4 rows [..., G * 17] -> transformers' (blocks [..., G,
    16], scales [..., G]): the same codes, element j of a group low in ggml's
    byte j (j < 16) and high in byte j - 16, moved to byte j // 2 (low for
    even j)."""
    q = q.reshape(*q.shape[:-1], q.shape[-1] // 17, 17)
    scales, qs = q[..., 0], q[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [..., G, 32] in element order
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(scales)


def transformers_dequantize(blocks, scales, np):
    """transformers' _convert_moe_packed_tensors (integrations/mxfp4.py) in
    numpy, f32 (the parameter dtype of the f32 golden): [X, R, G, 16] and
    [X, R, G] -> [X, G * 32, R]."""
    scales = scales.astype(np.int32) - 127
    assert blocks.shape[:-1] == scales.shape
    lut = np.array(FP4_VALUES, dtype=np.float32)
    *prefix_shape, G, B = blocks.shape
    rows_total = int(np.prod(prefix_shape)) * G
    blk = blocks.reshape(rows_total, B)
    exp = scales.reshape(rows_total, 1)
    out = np.empty((rows_total, B * 2), dtype=np.float32)
    out[:, 0::2] = lut[(blk & 0x0F).astype(np.int64)]
    out[:, 1::2] = lut[(blk >> 4).astype(np.int64)]
    out = np.ldexp(out, exp).astype(np.float32)
    out = out.reshape(*prefix_shape, G, B * 2).reshape(*prefix_shape, G * B * 2)
    return np.ascontiguousarray(out.transpose(0, 2, 1))


def transform_nibble_layout(tensor, np):
    """conversion/gpt_oss.py GptOssModel.transform_nibble_layout, torch -> numpy."""
    assert tensor.dtype == np.uint8
    assert tensor.shape[-1] == 16
    # swap nibbles
    t_lo = tensor & 0x0F
    t_hi = tensor & 0xF0
    t_swapped = (t_lo << 4) | (t_hi >> 4)
    tensor = t_swapped
    # transform aaaa...bbbb... to abababab...
    blk_a, blk_b = tensor[..., :8], tensor[..., 8:]  # tensor.chunk(2, dim=-1)
    # get a_
    blk_a0 = (blk_a & 0xF0).reshape(-1, 1)
    blk_a1 = (blk_a << 4).reshape(-1, 1)
    blk_a = np.stack((blk_a0, blk_a1), axis=2).reshape(tensor.shape)
    # get _b
    blk_b0 = (blk_b >> 4).reshape(-1, 1)
    blk_b1 = (blk_b & 0x0F).reshape(-1, 1)
    blk_b = np.stack((blk_b0, blk_b1), axis=2).reshape(tensor.shape)
    # swap once more
    out = blk_a | blk_b
    out_h = out & 0xF0
    out_l = out & 0x0F
    out = (out_h >> 4) | (out_l << 4)
    return out


def repack_mxfp4(blocks, scales, np):
    """GptOssModel.repack_mxfp4: the bytes it hands gguf_writer.add_tensor
    (raw_dtype MXFP4), [X, R, G * 17]."""
    assert blocks.dtype == np.uint8
    assert scales.dtype == np.uint8
    scales = scales[..., None]
    assert len(blocks.shape) == 4
    assert len(scales.shape) == 4
    blocks = transform_nibble_layout(blocks, np)
    new_data = np.concatenate((scales, blocks), axis=-1)
    return new_data.reshape(new_data.shape[0], new_data.shape[1], new_data.shape[2] * new_data.shape[3])


def repack_mxfp4_blocks(packed, scale, np):
    """conversion/base.py ModelBase.repack_mxfp4_blocks (the generic path,
    2-D: packed [rows, cols / 2], scale [rows, cols / 32]), torch -> numpy."""
    rows, packed_cols = packed.shape
    cols = packed_cols * 2
    n_blocks = cols // 32
    assert cols % 32 == 0 and scale.shape == (rows, n_blocks)
    src = packed.reshape(rows, n_blocks, 16)
    lo = src & 0x0F
    hi = (src >> 4) & 0x0F
    vals = np.stack((lo, hi), axis=-1).reshape(rows, n_blocks, 32)
    qs = vals[:, :, :16] | (vals[:, :, 16:] << 4)
    raw = np.concatenate((scale[..., None], qs.astype(np.uint8)), axis=-1)
    return raw.reshape(rows, n_blocks * 17)


def converter_experts(hf, n_layer, np):
    """GptOssModel.generate_extra_tensors over the checkpoint's tensors:
    {HF name of the converter's tensor: MXFP4 bytes}."""
    out = {}
    for il in range(n_layer):
        p = f"model.layers.{il}.mlp.experts."
        gub, gus = hf[p + "gate_up_proj_blocks"], hf[p + "gate_up_proj_scales"]
        out[p + "gate_proj.weight"] = repack_mxfp4(gub[:, ::2, :, :], gus[:, ::2, :], np)
        out[p + "up_proj.weight"] = repack_mxfp4(gub[:, 1::2, :, :], gus[:, 1::2, :], np)
        out[p + "down_proj.weight"] = repack_mxfp4(hf[p + "down_proj_blocks"], hf[p + "down_proj_scales"], np)
    # base.py's generic repacking must give the same bytes, expert by expert.
    for il in range(n_layer):
        p = f"model.layers.{il}.mlp.experts."
        for proj in ("gate_up_proj", "down_proj"):
            b, s = hf[p + proj + "_blocks"], hf[p + proj + "_scales"]
            for e in range(b.shape[0]):
                generic = repack_mxfp4_blocks(b[e].reshape(b.shape[1], -1), s[e], np)
                if proj == "down_proj":
                    ours = out[p + "down_proj.weight"][e]
                else:
                    ours = np.empty_like(generic)
                    ours[0::2] = out[p + "gate_proj.weight"][e]
                    ours[1::2] = out[p + "up_proj.weight"][e]
                if not np.array_equal(generic, ours):
                    sys.exit(f"{p}{proj}: GptOssModel.repack_mxfp4 and ModelBase.repack_mxfp4_blocks differ")
    return out


def main():
    tools_venv.ensure(["numpy", "safetensors", "yaml"], ["numpy", "safetensors", "pyyaml"])
    import numpy as np
    from safetensors.numpy import load_file, save_file

    src = llamacpp_source()
    sys.path.insert(0, os.path.join(src, "gguf-py"))  # the converter's gguf package
    import gguf
    import make_family_gguf

    with open(os.path.join(GOLDEN, "config.json")) as f:
        cfg = json.load(f)
    t = load_file(os.path.join(GOLDEN, "model.safetensors"))
    n_layer = cfg["num_hidden_layers"]
    MX = gguf.GGMLQuantizationType.MXFP4

    shard1, shard2, dense = {}, {}, {}
    for name, a in t.items():
        if ".mlp.experts." not in name:
            shard1[name] = a
        elif name.endswith(("gate_up_proj_bias", "down_proj_bias")):
            shard2[name] = a
        else:  # gate_up_proj [X, E, 2F] / down_proj [X, F, E], for x @ W: rows are W^T's
            rows = np.ascontiguousarray(a.transpose(0, 2, 1))  # [X, outputs, inputs]
            q = gguf.quants.quantize(rows, MX)  # [X, R, G * 17]
            blocks, scales = ggml_to_hf(q, np)
            shard2[name + "_blocks"], shard2[name + "_scales"] = blocks, scales
            dense[name] = transformers_dequantize(blocks, scales, np)
            ggml = gguf.quants.dequantize(q, MX).astype(np.float32).transpose(0, 2, 1)
            if dense[name].shape != a.shape or not np.array_equal(dense[name], ggml):
                sys.exit(f"{name}: transformers' and gguf-py's dequantizations differ")
            err = float(np.max(np.abs(dense[name] - a)))
            print(f"{name}: {list(blocks.shape)} blocks, max |MXFP4 - f32| {err:.3g} (max |w| "
                  f"{float(np.max(np.abs(a))):.3g})", file=sys.stderr)

    os.makedirs(OUT, exist_ok=True)
    qcfg = dict(cfg)
    qcfg["quantization_config"] = QUANT_CONFIG
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(qcfg, f, indent=2, sort_keys=True)
        f.write("\n")
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file(shard1, os.path.join(OUT, names[0]), metadata={"format": "pt"})
    save_file(shard2, os.path.join(OUT, names[1]), metadata={"format": "pt"})
    weight_map = {k: names[0] for k in shard1}
    weight_map.update({k: names[1] for k in shard2})
    size = sum(a.nbytes for a in list(shard1.values()) + list(shard2.values()))
    with open(os.path.join(OUT, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    save_file(dense, os.path.join(OUT, "dequantized.safetensors"), metadata={"format": "pt"})

    # llama.cpp's converter on the checkpoint just written.
    hf = {}
    for n in names:
        hf.update(load_file(os.path.join(OUT, n)))
    raw = converter_experts(hf, n_layer, np)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "gpt-oss")
    name_map = gguf.get_tensor_name_map(arch_enum, n_layer)
    raw = {name_map.get_name(k, try_suffixes=(".weight", ".bias")): v for k, v in raw.items()}
    # The rest of the converter's output as make_family_gguf.py writes it
    # (the non-expert tensors are the golden's; the expert matrices given
    # here only carry their names there: raw_experts replaces them).
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gpt_oss_mxfp4.gguf")
        tensors = {k: v for k, v in hf.items() if not k.endswith(("_blocks", "_scales"))}
        tensors.update(dense)
        tensors = dict(sorted(tensors.items()))  # the order load_file gives make_family_gguf.py
        make_family_gguf.convert(GOLDEN, cfg, tensors, "gpt-oss", path, gguf, mxfp4_experts=True, raw_experts=raw)
        with open(path, "rb") as a, open(GGUF_REF, "rb") as b:
            same = a.read() == b.read()
    if not same:
        sys.exit(f"the converter's GGUF of {OUT} differs from {GGUF_REF}")
    print(f"wrote {OUT}; llama.cpp's converter turns it into {os.path.relpath(GGUF_REF, ROOT)} byte for byte",
          file=sys.stderr)


if __name__ == "__main__":
    main()
