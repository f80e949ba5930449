#!/usr/bin/env python3
"""Writes the GGUF fuzz seeds (tests/fuzz/corpus/gguf/*.gguf) with the
reference writer (the `gguf` package from llama.cpp), so the seeds also test
rill's reader against an independent implementation (gguf_test.cpp parses
them). Each seed stays well under 20 KB.

    tools/make_gguf_fuzz_seeds.py [out_dir]
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")

if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), "gguf", "numpy"])
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q, GGUFValueType as V, GGUFWriter  # noqa: E402

N_EMBD, N_VOCAB, N_FF = 32, 16, 64
rng = np.random.default_rng(7)


def raw_bytes(n):
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def finish(w, path):
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes")


def add_tokens(w):
    w.add_token_list([f"tok{i}" for i in range(N_VOCAB)])
    w.add_token_types([1] * N_VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def llama_tiny(path):
    w = GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // 4)
    w.add_vocab_size(N_VOCAB)
    add_tokens(w)
    # Q8_0 block: 34 bytes per 32 values; Q4_1: 20 bytes per 32 values.
    w.add_tensor("token_embd.weight", raw_bytes(N_VOCAB * 34).reshape(N_VOCAB, 34), raw_dtype=Q.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((N_EMBD, N_EMBD)).astype(np.float16))
    w.add_tensor("blk.0.ffn_down.weight", raw_bytes(N_EMBD * 2 * 20).reshape(N_EMBD, 40), raw_dtype=Q.Q4_1)
    w.add_tensor("rope_freqs.weight", np.ones(N_EMBD // 8, dtype=np.float32))
    w.add_tensor("output.weight", raw_bytes(N_VOCAB * 34).reshape(N_VOCAB, 34), raw_dtype=Q.Q8_0)
    finish(w, path)


def qwen2_yarn(path):
    w = GGUFWriter(path, "qwen2")
    w.add_custom_alignment(64)
    w.add_block_count(1)
    w.add_context_length(1024)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(2)
    w.add_rope_scaling_type(__import__("gguf").RopeScalingType.YARN)
    w.add_rope_scaling_factor(4.0)
    w.add_rope_scaling_orig_ctx_len(256)
    w.add_sliding_window(128)
    add_tokens(w)
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    w.add_tensor("blk.0.attn_q.bias", np.zeros(N_EMBD, dtype=np.float32))
    w.add_tensor("blk.0.attn_k.weight", rng.standard_normal((16, N_EMBD)).astype(np.float16))
    # A Q2_K tensor (84 bytes per 256 values; recorded without data before rill read Q2_K).
    w.add_tensor("blk.0.ffn_up.weight", raw_bytes(84).reshape(1, 84), raw_dtype=Q.Q2_K)
    finish(w, path)


def glm_dsa_tiny(path):
    """llama.cpp's glm-dsa (GLM-5): MLA, routed-MoE and lightning-indexer keys
    (indexer.types, one per decoder layer) and an MTP block, with a few of its
    tensors, so the fuzzer reaches gguf_names.cpp's read_dsa."""
    a = "glm-dsa"
    w = GGUFWriter(path, a)
    for key, value in [("block_count", 3), ("context_length", 512), ("embedding_length", N_EMBD),
                       ("feed_forward_length", N_FF), ("attention.head_count", 4), ("attention.head_count_kv", 1),
                       ("attention.q_lora_rank", 16), ("attention.kv_lora_rank", 8), ("attention.key_length", 12),
                       ("attention.value_length", 8), ("attention.key_length_mla", 12),
                       ("attention.value_length_mla", 8), ("rope.dimension_count", 4), ("expert_count", 4),
                       ("expert_used_count", 2), ("expert_feed_forward_length", 16), ("expert_shared_count", 1),
                       ("leading_dense_block_count", 1), ("nextn_predict_layers", 1),
                       ("attention.indexer.head_count", 2), ("attention.indexer.key_length", 8),
                       ("attention.indexer.top_k", 4), ("vocab_size", N_VOCAB)]:
        w.add_key_value(f"{a}.{key}", value, V.UINT32)
    w.add_key_value(f"{a}.attention.layer_norm_rms_epsilon", 1e-6, V.FLOAT32)
    w.add_key_value(f"{a}.expert_weights_scale", 2.5, V.FLOAT32)
    w.add_key_value(f"{a}.expert_weights_norm", True, V.BOOL)
    w.add_array(f"{a}.attention.indexer.types", [True, False])
    add_tokens(w)
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float32))
    w.add_tensor("blk.0.attn_k_b.weight", rng.standard_normal((4, 8, 8)).astype(np.float16))
    w.add_tensor("blk.0.indexer.attn_q_b.weight", rng.standard_normal((16, 16)).astype(np.float32))
    w.add_tensor("blk.0.indexer.k_norm.bias", np.zeros(8, dtype=np.float32))
    w.add_tensor("blk.1.exp_probs_b.bias", np.zeros(4, dtype=np.float32))
    w.add_tensor("blk.2.nextn.eh_proj.weight", rng.standard_normal((N_EMBD, 2 * N_EMBD)).astype(np.float16))
    finish(w, path)


def all_types(path):
    w = GGUFWriter(path, "test")
    w.add_key_value("t.u8", 200, V.UINT8)
    w.add_key_value("t.i8", -100, V.INT8)
    w.add_key_value("t.u16", 60000, V.UINT16)
    w.add_key_value("t.i16", -30000, V.INT16)
    w.add_key_value("t.u32", 4000000000, V.UINT32)
    w.add_key_value("t.i32", -2000000000, V.INT32)
    w.add_key_value("t.f32", 0.5, V.FLOAT32)
    w.add_key_value("t.bool", True, V.BOOL)
    w.add_key_value("t.string", "héllo", V.STRING)
    w.add_key_value("t.u64", 2**63 + 5, V.UINT64)
    w.add_key_value("t.i64", -(2**62), V.INT64)
    w.add_key_value("t.f64", -1.25, V.FLOAT64)
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_str", ["a", "", "ccc"])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    w.add_array("t.arr_empty", [])
    finish(w, path)


def minicpm_longrope_tiny(path):
    """llama.cpp's minicpm (MiniCPM 4) with its muP scale keys and LongRoPE's
    factor tensors, so the fuzzer reaches gguf_names.cpp's read_minicpm and
    read_longrope."""
    w = GGUFWriter(path, "minicpm")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(N_EMBD // 4)
    w.add_float32("minicpm.embedding_scale", 12.0)
    w.add_float32("minicpm.residual_scale", 1.4)
    w.add_float32("minicpm.logit_scale", 0.125)
    w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LONGROPE)
    w.add_rope_scaling_orig_ctx_len(256)
    add_tokens(w)
    w.add_tensor("token_embd.weight", rng.standard_normal((N_VOCAB, N_EMBD)).astype(np.float16))
    w.add_tensor("rope_factors_short.weight", np.full(N_EMBD // 8, 1.5, dtype=np.float32))
    w.add_tensor("rope_factors_long.weight", np.full(N_EMBD // 8, 4.0, dtype=np.float32))
    w.add_tensor("blk.0.attn_output.weight", rng.standard_normal((N_EMBD, N_EMBD)).astype(np.float16))
    finish(w, path)


def empty(path):
    w = GGUFWriter(path, "llama")
    finish(w, path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")
    os.makedirs(out, exist_ok=True)
    llama_tiny(os.path.join(out, "llama_tiny.gguf"))
    qwen2_yarn(os.path.join(out, "qwen2_yarn.gguf"))
    all_types(os.path.join(out, "all_types.gguf"))
    empty(os.path.join(out, "arch_only.gguf"))
    glm_dsa_tiny(os.path.join(out, "glm_dsa_tiny.gguf"))
    minicpm_longrope_tiny(os.path.join(out, "minicpm_longrope_tiny.gguf"))
    # GGUF v2 differs from v3 only in the version field for little-endian files.
    with open(os.path.join(out, "all_types.gguf"), "rb") as f:
        data = bytearray(f.read())
    data[4:8] = (2).to_bytes(4, "little")
    with open(os.path.join(out, "all_types_v2.gguf"), "wb") as f:
        f.write(data)


if __name__ == "__main__":
    main()
