#!/usr/bin/env python3
"""Random-weight GGUF models for benchmarks, in any llama.cpp quant type.

Writes a Llama-architecture GGUF of a real model's shape (default
Llama-3.2-1B: 16 layers, hidden 2048, 32 query / 8 KV heads of 64, FFN 8192,
vocab 128256, tied embeddings) in F16 with seeded random weights (normal,
std 0.02; norms 1), and a synthetic 128256-token SentencePiece vocabulary
(the benchmarks feed token ids; both engines need some vocabulary to load).
Then quantizes it with llama.cpp's llama-quantize, built from the llama.cpp
inside the llama-cpp-python source package (bench/build_llamacpp_tools.sh),
so the quantized files are exactly what llama.cpp users download. Files are
cached under --out-dir (default build/bench/models):

    <shape>.F16.gguf, <shape>.<TYPE>.gguf for each --types entry

    bench/make_bench_model.py [--types Q4_K_M,Q8_0] [--shape llama-3.2-1b] [--out-dir DIR]

Shapes: llama-3.2-1b (tied embeddings), llama-3.1-8b (32 layers, hidden
4096, 32 / 8 heads of 128, FFN 14336, vocab 128256, its own output.weight,
rope theta 500000) and tiny. --fast-random fills the F16 weights from one
seeded pool of 2^24 + 4099 normal values, each tensor a window of it at a
seeded offset (the pool's length is no multiple of a row, so rows differ):
the 8B's 16 GB in seconds instead of minutes of normal draws, for speed
runs (bench/cuda/gguf_vs_llamacpp.sh); the values are as random as a
quantizer can tell, but not independent.
--llama-quantize PATH uses that binary instead of building one, and
--no-venv imports gguf/numpy from the running Python (PYTHONPATH) only: the
device machine has no package index.

Types whose tensors llama-quantize makes only with an importance matrix
(the files IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ3_XXS, IQ3_XS,
Q2_K_S; llama-quant.cpp's tensor_requires_imatrix) are refused: a
random-weight model has no calibration text to compute one from. IQ4_XS,
IQ4_NL, IQ3_S/IQ3_M and the K-quants need none.

--random-blocks writes, instead of quantizing, <shape>.<TYPE>-random.gguf
with every 2-D weight random blocks of that one GGML type (Q4_K, Q5_K,
Q6_K, Q8_0, IQ4_XS, IQ4_NL; d = 1e-3): for speed comparisons when
llama-quantize is not at hand (both engines read the same file; the
values mean nothing, and the type mix differs from llama-quantize's).
--random-blocks Q4_K_M writes llama-quantize's Q4_K_M type mix instead
(llama_tensor_get_type for that file type on these shapes): output.weight
Q6_K, attn_v and ffn_down Q6_K on the layers where use_more_bits holds
(i < n/8, i >= 7n/8, (i - n/8) % 3 == 2: 16 of the 8B's 32), every other
2-D weight Q4_K: the same tensor types, shapes and bytes as the quantized
file, random values.

Prints the quantized files' paths, one a line. Needs the gguf and numpy
packages (installed into .venv-tools when missing).
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402

SHAPES = {
    # name: (layers, hidden, heads, kv heads, ffn, vocab, rope theta, rms eps, tied embeddings)
    "llama-3.2-1b": (16, 2048, 32, 8, 8192, 128256, 500000.0, 1e-5, True),
    "llama-3.1-8b": (32, 4096, 32, 8, 14336, 128256, 500000.0, 1e-5, False),
    # Small enough for a quick check of the tool itself.
    "tiny": (2, 256, 4, 2, 512, 1024, 10000.0, 1e-5, True),
}
POOL_ELEMS = (1 << 24) + 4099  # --fast-random's pool (see the docstring)


# llama-quantize refuses these without --imatrix (see the docstring).
NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}


def add_vocab(w, n_vocab):
    # <unk> <s> </s>, the 256 byte tokens, then plain pieces.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), n_vocab)]
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)


# --random-blocks: ggml type -> (block bytes, block size, offset of the f16 d field(s)).
RANDOM_BLOCK_TYPES = {"Q4_K": (144, 256, (0, 2)), "Q5_K": (176, 256, (0, 2)), "Q6_K": (210, 256, (208,)),
                      "Q8_0": (34, 32, (0,)), "IQ4_XS": (136, 256, (0,)), "IQ4_NL": (18, 32, (0,))}


RANDOM_MIXES = {"Q4_K_M"}


def mix_type(mix, name, n_layer):
    """The block type of tensor `name` in random-blocks mix `mix`."""
    if mix not in RANDOM_MIXES:
        return mix
    if name == "output.weight":
        return "Q6_K"
    if name.endswith("attn_v.weight") or name.endswith("ffn_down.weight"):
        i = int(name.split(".")[1])
        if i < n_layer // 8 or i >= 7 * n_layer // 8 or (i - n_layer // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def random_blocks(rng, shape, qtype):
    """[rows, bytes per row] uint8: random quant bytes, every d (and dmin) 1e-3."""
    import numpy as np
    bb, bs, d_offsets = RANDOM_BLOCK_TYPES[qtype]
    rows, cols = shape
    blocks = rng.integers(0, 256, size=(rows, cols // bs, bb), dtype=np.uint8)
    d = np.frombuffer(np.float16(1e-3).tobytes(), dtype=np.uint8)
    for off in d_offsets:
        blocks[:, :, off:off + 2] = d
    return blocks.reshape(rows, -1)


def write_f16(path, shape_name, seed, qtype=None, fast=False):
    """F16 weights (norms f32); with qtype every 2-D weight is instead random
    blocks of that type (speed only: the values mean nothing); fast: F16
    windows of one random pool (--fast-random)."""
    import gguf
    import numpy as np
    n_layer, d, n_head, n_kv, ffn, vocab, theta, eps, tied = SHAPES[shape_name]
    head_dim = d // n_head
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random {shape_name}")
    w.add_context_length(4096)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if qtype is None else
                    gguf.LlamaFileType.MOSTLY_Q4_K_M if qtype == "Q4_K_M" else
                    getattr(gguf.LlamaFileType, "MOSTLY_" + {"Q4_K": "Q4_K_S", "Q5_K": "Q5_K_S"}.get(qtype, qtype)))
    add_vocab(w, vocab)

    # (name, numpy shape [rows, cols], is_norm), in llama.cpp's tensor order.
    tensors = [("token_embd.weight", (vocab, d), False)]
    for i in range(n_layer):
        p = f"blk.{i}."
        tensors += [(p + "attn_norm.weight", (d,), True), (p + "attn_q.weight", (d, d), False),
                    (p + "attn_k.weight", (n_kv * head_dim, d), False),
                    (p + "attn_v.weight", (n_kv * head_dim, d), False),
                    (p + "attn_output.weight", (d, d), False), (p + "ffn_norm.weight", (d,), True),
                    (p + "ffn_gate.weight", (ffn, d), False), (p + "ffn_up.weight", (ffn, d), False),
                    (p + "ffn_down.weight", (d, ffn), False)]
    tensors.append(("output_norm.weight", (d,), True))
    if not tied:
        tensors.append(("output.weight", (vocab, d), False))
    for name, shape, norm in tensors:
        if qtype is not None and not norm:
            tt = mix_type(qtype, name, n_layer)
            bb, bs, _ = RANDOM_BLOCK_TYPES[tt]
            byte_shape = (shape[0], shape[1] // bs * bb)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1],
                              raw_dtype=getattr(gguf.GGMLQuantizationType, tt))
            continue
        dt = np.float32 if norm else np.float16
        nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
        w.add_tensor_info(name, shape, np.dtype(dt), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL_ELEMS, dtype=np.float32) * 0.02).astype(np.float16) if fast else None
    for name, shape, norm in tensors:  # streamed: one tensor in memory at a time
        if norm:
            t = np.ones(shape, dtype=np.float32)
        elif qtype is not None:
            t = random_blocks(rng, shape, mix_type(qtype, name, n_layer))
        elif fast:
            n = int(np.prod(shape))
            start = int(rng.integers(0, POOL_ELEMS))
            t = np.tile(pool, (start + n) // POOL_ELEMS + 1)[start:start + n].reshape(shape)
        else:
            t = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        w.write_tensor_data(t)
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="Q4_K_M,Q8_0",
                    help="comma-separated llama-quantize types (F16 = no quantization)")
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "build", "bench", "models"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="llama-quantize threads")
    ap.add_argument("--fast-random", action="store_true",
                    help="F16 weights as windows of one seeded random pool (see the docstring)")
    ap.add_argument("--llama-quantize", help="this llama-quantize binary (default: build one)")
    ap.add_argument("--no-venv", action="store_true", help="gguf and numpy from the running Python only")
    ap.add_argument("--random-blocks", action="store_true",
                    help="no llama-quantize: every 2-D weight random blocks of the one type, "
                    f"<shape>.<TYPE>-random.gguf (speed only; types {','.join(RANDOM_BLOCK_TYPES)}, "
                    f"mixes {','.join(RANDOM_MIXES)})")
    args = ap.parse_args()
    if not args.no_venv:
        tools_venv.ensure(["gguf", "numpy"], ["gguf", "numpy"])
    os.makedirs(args.out_dir, exist_ok=True)
    if args.random_blocks:
        for t in [t.strip() for t in args.types.split(",") if t.strip()]:
            if t not in RANDOM_BLOCK_TYPES and t not in RANDOM_MIXES:
                sys.exit(f"make_bench_model.py: --random-blocks knows {', '.join(RANDOM_BLOCK_TYPES)} and the mixes "
                         f"{', '.join(RANDOM_MIXES)}, not {t}")
            out = os.path.join(args.out_dir, f"{args.shape}.{t}-random.gguf")
            if not os.path.exists(out):
                write_f16(out + ".tmp", args.shape, args.seed, t)
                os.replace(out + ".tmp", out)
            print(out)
        return

    os.makedirs(args.out_dir, exist_ok=True)
    f16 = os.path.join(args.out_dir, f"{args.shape}.F16.gguf")
    if not os.path.exists(f16):
        print(f"writing {f16} ...", file=sys.stderr)
        write_f16(f16 + ".tmp", args.shape, args.seed, fast=args.fast_random)
        os.replace(f16 + ".tmp", f16)
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    refused = [t for t in types if t in NEEDS_IMATRIX]
    if refused:
        sys.exit(f"make_bench_model.py: {', '.join(refused)} need an importance matrix (llama-quantize "
                 "--imatrix), which a random-weight model cannot provide; use IQ4_XS, IQ4_NL or a K-quant")
    bindir = None
    for t in types:
        out = os.path.join(args.out_dir, f"{args.shape}.{t}.gguf")
        if t == "F16":
            out = f16
        elif not os.path.exists(out):
            if bindir is None and not args.llama_quantize:
                bindir = subprocess.run([os.path.join(ROOT, "bench", "build_llamacpp_tools.sh")], check=True,
                                        capture_output=True, text=True).stdout.strip().splitlines()[-1]
            print(f"quantizing {t} ...", file=sys.stderr)
            quantize = args.llama_quantize or os.path.join(bindir, "llama-quantize")
            subprocess.run([quantize, f16, out + ".tmp", t, str(args.threads)],
                           check=True, stdout=subprocess.DEVNULL)
            os.replace(out + ".tmp", out)
        print(out)


if __name__ == "__main__":
    main()
