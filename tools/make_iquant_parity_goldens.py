#!/usr/bin/env python3
"""llama.cpp goldens for rill's GGUF parity test of the low-bit types
(tests/engine/iquant_gguf_parity_test.cpp).

For each of Q2_K, Q3_K, IQ4_NL and IQ4_XS: a tiny random llama model (2
layers, hidden 256, 4/2 heads, FFN 512, bench/make_bench_model.py's
synthetic 1,024-token vocabulary) whose every matrix, the token embedding
(tied head) included, is seeded random blocks of the type with small f16
scales, written by the gguf package; and llama.cpp's greedy decoding of
three fixed prompts through its C API (tools/llamacpp_greedy, compiled here
against the static libraries of the llama.cpp inside the llama-cpp-python
source package, built by bench/build_llamacpp_tools.sh; weight repacking
off, so llama.cpp runs its vec_dot kernels). Writes
tests/data/gguf_iquant/tiny.<TYPE>.gguf and tiny.<TYPE>.json.

    tools/make_iquant_parity_goldens.py [--llamacpp-build build/llamacpp/build]

(--llamacpp-build: an existing build of that source whose static libraries
are complete, instead of running the build script.)
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import tools_venv  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "gguf_iquant")
F16_FIELDS = {"Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0]}  # byte offsets of f16 scales
PROMPTS = [[1, 300, 301, 302, 303, 304], [1] + list(range(500, 540)), [1, 700, 260, 900, 1000, 12, 5, 7]]
N_GEN = 16


def write_model(path, type_name, seed):
    import gguf
    import numpy as np
    import make_bench_model
    from gguf.quants import GGML_QUANT_SIZES
    qt = gguf.GGMLQuantizationType[type_name]
    block, type_size = GGML_QUANT_SIZES[qt]
    n_layer, d, n_head, n_kv, ffn, vocab = 2, 256, 4, 2, 512, 1024
    hd = d // n_head
    rng = np.random.default_rng(seed)

    def blocks(rows, cols):
        nb = rows * cols // block
        raw = rng.integers(0, 256, size=(nb, type_size), dtype=np.uint8)
        for off in F16_FIELDS[type_name]:
            raw[:, off:off + 2] = rng.uniform(-0.003, 0.003, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        return raw.reshape(rows, cols // block * type_size)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"random tiny {type_name}")
    w.add_context_length(512)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    make_bench_model.add_vocab(w, vocab)
    w.add_tensor("token_embd.weight", blocks(vocab, d), raw_dtype=qt)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(p + "attn_q.weight", blocks(d, d), raw_dtype=qt)
        w.add_tensor(p + "attn_k.weight", blocks(n_kv * hd, d), raw_dtype=qt)
        w.add_tensor(p + "attn_v.weight", blocks(n_kv * hd, d), raw_dtype=qt)
        w.add_tensor(p + "attn_output.weight", blocks(d, d), raw_dtype=qt)
        w.add_tensor(p + "ffn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(p + "ffn_gate.weight", blocks(ffn, d), raw_dtype=qt)
        w.add_tensor(p + "ffn_up.weight", blocks(ffn, d), raw_dtype=qt)
        w.add_tensor(p + "ffn_down.weight", blocks(d, ffn), raw_dtype=qt)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llamacpp-build")
    args = ap.parse_args()
    tools_venv.ensure(["gguf", "numpy"], ["gguf", "numpy"])
    os.makedirs(OUT, exist_ok=True)
    if args.llamacpp_build:
        build = os.path.abspath(args.llamacpp_build)
    else:
        bindir = subprocess.run([os.path.join(ROOT, "bench", "build_llamacpp_tools.sh")], check=True,
                                capture_output=True, text=True).stdout.strip().splitlines()[-1]
        build = os.path.dirname(os.path.join(ROOT, bindir))  # build/llamacpp/build
    top = os.path.dirname(build)
    src = os.path.join(top, "llama_cpp_python-0.3.36", "vendor", "llama.cpp")
    exe = os.path.join(top, "llamacpp_greedy")
    libs = [os.path.join(build, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                              "ggml/src/libggml-base.a")]
    subprocess.run(["g++", "-O2", "-std=c++17", "-I", os.path.join(src, "include"), "-I",
                    os.path.join(src, "ggml", "include"),
                    os.path.join(ROOT, "tools", "llamacpp_greedy", "llamacpp_greedy.cpp"), *libs, "-fopenmp",
                    "-lpthread", "-lm", "-ldl", "-o", exe], check=True)
    ids_args = [",".join(map(str, p)) for p in PROMPTS]
    for seed, t in enumerate(F16_FIELDS):
        model = os.path.join(OUT, f"tiny.{t}.gguf")
        write_model(model, t, 11 + seed)
        out = subprocess.run([exe, model, str(N_GEN), "2", "0", *ids_args], check=True, capture_output=True,
                             text=True).stdout
        res = json.loads(out)
        golden = {"source": "llama.cpp (llama-cpp-python 0.3.36 source) C API, greedy argmax, use_extra_bufts=0",
                  "type": t, "n_vocab": res["n_vocab"], "prompts": []}
        for p in res["prompts"]:
            steps = p["steps"]
            golden["prompts"].append({
                "prompt_ids": p["prompt_ids"], "greedy_ids": [s["id"] for s in steps],
                "margins": [s["top5"][0][1] - s["top5"][1][1] for s in steps],
                "first_step_logits": steps[0]["logits"]})
        with open(os.path.join(OUT, f"tiny.{t}.json"), "w") as f:
            json.dump(golden, f)
        print("wrote", model)


if __name__ == "__main__":
    main()
