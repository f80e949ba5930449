#!/usr/bin/env python3
"""GGUF files and llama.cpp goldens for the hybrid gated-DeltaNet families.

Converts the two tiny Hugging Face goldens (../shared/goldens/hf/qwen3_5 and
qwen3-next) into GGUF files laid out exactly as llama.cpp's converter
(convert_hf_to_gguf.py, conversion/qwen.py: Qwen3NextModel and
Qwen3_5TextModel) writes them, runs llama.cpp (llama-cpp-python) on each file
over the golden prompt, checks that llama.cpp reproduces transformers' logits
and greedy ids (which proves the file is what llama.cpp expects), and writes

    tests/data/gguf_hybrid/<name>.gguf   the converted model (f32, ~1 MB)
    tests/data/gguf_hybrid/<name>.json   llama.cpp's logits at every prompt
                                         position and its greedy ids
    tests/fuzz/corpus/gguf/qwen35_tiny.gguf   a small hybrid fuzz seed

The converter itself needs torch and a tokenizer, neither of which the tiny
goldens have, so its transforms are re-done here with numpy:
  * every (1 + w) RMSNorm weight is stored with the 1 added (input/post-
    attention/final norms, q_norm, k_norm); the gated norm (linear_attn.norm)
    is stored as is
  * A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d squeezed to
    [conv_dim, K]
  * Qwen3-Next: in_proj_qkvz (grouped per key head: q, k, v, z) split into
    attn_qkv [q all heads | k all | v all] and attn_gate (z); in_proj_ba kept
    grouped as ssm_ba
  * Qwen3.5 (n_v_heads != n_k_heads): value heads reordered from grouped by
    key head to tiled (v head j*n_k + g was g*r + j) in in_proj_qkv's v rows,
    in_proj_z, in_proj_b/a, A_log, dt_bias, conv1d's v channels and
    out_proj's columns
  * experts stacked into ffn_{gate,up,down}_exps; MTP layers absent (as with
    --no-mtp)
  * qwen35.rope.dimension_sections scaled to the tiny model's 2 rotary pairs
Metadata follows TextModel / Qwen2MoeModel / Qwen3NextModel.set_gguf_parameters.
The tokenizer is a synthetic 512-token SentencePiece ("llama") vocabulary:
the goldens are token ids, and llama.cpp needs some vocabulary to load.

    tools/make_hybrid_gguf.py [--threads 2]

Installs gguf, numpy, safetensors and llama-cpp-python into .venv-tools
itself (re-executing under that interpreter) when they are not importable.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402
SHARED = os.environ.get("RILL_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
if not os.path.isdir(SHARED):
    SHARED = "/work/shared"
OUT_DIR = os.path.join(ROOT, "tests", "data", "gguf_hybrid")
FUZZ_SEED = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf", "qwen35_tiny.gguf")

# (output name, golden dir, GGUF architecture)
MODELS = [("qwen3_5", "qwen3_5", "qwen35"), ("qwen3_next", "qwen3-next", "qwen3next")]


def ensure_venv():
    tools_venv.ensure(["gguf", "llama_cpp", "numpy", "safetensors"],
                      ["gguf", "numpy", "safetensors", "llama-cpp-python"])


def tiled_order(n_k, r, width, np):
    """Row indices that take value heads from grouped to tiled order: tiled
    head j*n_k + g is grouped head g*r + j; each head is `width` rows."""
    heads = np.arange(n_k * r).reshape(n_k, r).T.reshape(-1)
    return (heads[:, None] * width + np.arange(width)[None, :]).reshape(-1)


def add_vocab(w, n_vocab, bos, eos):
    # <unk> <s> </s>, the 256 byte tokens, then plain pieces.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), n_vocab)]
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens[:n_vocab])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types[:n_vocab])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)


def convert(golden_dir, arch, out_path):
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    with open(os.path.join(golden_dir, "config.json")) as f:
        cfg = json.load(f)
    t = load_file(os.path.join(golden_dir, "model.safetensors"))
    n_layer = cfg["num_hidden_layers"]
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    r = n_v // n_k
    key_dim = n_k * dk
    rope = cfg.get("rope_parameters") or {}
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    moe = "num_experts" in cfg

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name(os.path.basename(golden_dir))
    # TextModel.set_gguf_parameters
    w.add_block_count(n_layer)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if moe:
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    # Qwen2MoeModel
    if moe:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    # Qwen3NextModel
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(n_k)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_inner_size(dv * n_v)
    if cfg.get("layer_types") is not None:
        w.add_array(f"{arch}.attention.recurrent_layers",
                    [lt == "linear_attention" for lt in cfg["layer_types"]])
    w.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    w.add_rope_dimension_count(int(head_dim * partial))
    # _Qwen35MRopeMixin writes the default interleaved-MRoPE sections
    # [11, 11, 10, 0], made for 32 rotary pairs; llama.cpp asserts they fit
    # the rotary dims, and the tiny model has 2 pairs: [1, 1, 0, 0]. Text
    # positions are equal in every section, so the split changes nothing.
    if arch == "qwen35" and "mrope_section" not in rope:
        n_pairs = int(head_dim * partial) // 2
        w.add_rope_dimension_sections([11, 11, 10, 0] if n_pairs >= 32 else [1, 1, 0, 0])
    add_vocab(w, cfg["vocab_size"], cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2))

    def put(name, a):
        w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))

    def norm(a):  # the converter stores (1 + w) norms with the 1 added
        return a + 1.0

    put("token_embd.weight", t["model.embed_tokens.weight"])
    put("output_norm.weight", norm(t["model.norm.weight"]))
    if "lm_head.weight" in t and not cfg.get("tie_word_embeddings", False):
        put("output.weight", t["lm_head.weight"])
    v_rows = tiled_order(n_k, r, dv, np) if arch == "qwen35" and n_k != n_v else None
    v_heads = tiled_order(n_k, r, 1, np) if v_rows is not None else None
    for il in range(n_layer):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        put(b + "attn_norm.weight", norm(t[p + "input_layernorm.weight"]))
        put(b + "post_attention_norm.weight", norm(t[p + "post_attention_layernorm.weight"]))
        la = p + "linear_attn."
        if la + "A_log" in t:
            a_log, dt_bias = t[la + "A_log"], t[la + "dt_bias"]
            conv = t[la + "conv1d.weight"].squeeze()  # [conv_dim, K]
            out = t[la + "out_proj.weight"]            # [E, value_dim]
            if arch == "qwen3next":
                qkvz = t[la + "in_proj_qkvz.weight"]   # [n_k * (2dk + 2r dv), E]
                grp = qkvz.reshape(n_k, 2 * dk + 2 * r * dv, -1)
                q, k = grp[:, :dk], grp[:, dk:2 * dk]
                v, z = grp[:, 2 * dk:2 * dk + r * dv], grp[:, 2 * dk + r * dv:]
                E = qkvz.shape[1]
                qkv = np.concatenate([q.reshape(-1, E), k.reshape(-1, E), v.reshape(-1, E)])
                put(b + "attn_qkv.weight", qkv)
                put(b + "attn_gate.weight", z.reshape(-1, E))
                put(b + "ssm_ba.weight", t[la + "in_proj_ba.weight"])
            else:
                qkv, z = t[la + "in_proj_qkv.weight"], t[la + "in_proj_z.weight"]
                beta, alpha = t[la + "in_proj_b.weight"], t[la + "in_proj_a.weight"]
                if v_rows is not None:
                    qkv = np.concatenate([qkv[:2 * key_dim], qkv[2 * key_dim:][v_rows]])
                    z, beta, alpha = z[v_rows], beta[v_heads], alpha[v_heads]
                    a_log, dt_bias = a_log[v_heads], dt_bias[v_heads]
                    conv = np.concatenate([conv[:2 * key_dim], conv[2 * key_dim:][v_rows]])
                    out = out[:, v_rows]
                put(b + "attn_qkv.weight", qkv)
                put(b + "attn_gate.weight", z)
                put(b + "ssm_beta.weight", beta)
                put(b + "ssm_alpha.weight", alpha)
            put(b + "ssm_conv1d.weight", conv)
            put(b + "ssm_dt.bias", dt_bias)
            put(b + "ssm_a", -np.exp(a_log))
            put(b + "ssm_norm.weight", t[la + "norm.weight"])
            put(b + "ssm_out.weight", out)
        else:
            sa = p + "self_attn."
            put(b + "attn_q.weight", t[sa + "q_proj.weight"])  # per head [query | gate]
            put(b + "attn_k.weight", t[sa + "k_proj.weight"])
            put(b + "attn_v.weight", t[sa + "v_proj.weight"])
            put(b + "attn_output.weight", t[sa + "o_proj.weight"])
            put(b + "attn_q_norm.weight", norm(t[sa + "q_norm.weight"]))
            put(b + "attn_k_norm.weight", norm(t[sa + "k_norm.weight"]))
        mlp = p + "mlp."
        if moe:
            put(b + "ffn_gate_inp.weight", t[mlp + "gate.weight"])
            for proj, name in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                               ("down_proj", "ffn_down_exps")):
                put(b + name + ".weight",
                    np.stack([t[f"{mlp}experts.{e}.{proj}.weight"] for e in range(cfg["num_experts"])]))
            put(b + "ffn_gate_inp_shexp.weight", t[mlp + "shared_expert_gate.weight"])  # [1, E]
            put(b + "ffn_gate_shexp.weight", t[mlp + "shared_expert.gate_proj.weight"])
            put(b + "ffn_up_shexp.weight", t[mlp + "shared_expert.up_proj.weight"])
            put(b + "ffn_down_shexp.weight", t[mlp + "shared_expert.down_proj.weight"])
        else:
            put(b + "ffn_gate.weight", t[mlp + "gate_proj.weight"])
            put(b + "ffn_up.weight", t[mlp + "up_proj.weight"])
            put(b + "ffn_down.weight", t[mlp + "down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_llama_cpp(path, prompt, n_gen, threads):
    """llama.cpp's logits at every prompt position and its greedy ids."""
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    # f32 KV cache: the reference must not round K/V to f16.
    llm = Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=threads, logits_all=True,
                type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, seed=0, verbose=False)
    n_vocab = llm.n_vocab()
    llm.eval(prompt)
    logits = np.array(llm.scores[:len(prompt)], dtype=np.float32).copy()
    greedy = []
    row = logits[-1]
    for _ in range(n_gen):
        tok = int(np.argmax(row))
        greedy.append(tok)
        llm.eval([tok])
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    del llm
    assert logits.shape == (len(prompt), n_vocab)
    return logits, greedy


def fuzz_seed(path):
    """A small qwen35 file: every hybrid metadata key and one tensor of each
    hybrid name, with tiny dims (n_embd 8, 2 layers)."""
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(path, "qwen35")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(4)
    w.add_value_length(4)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_ssm_conv_kernel(4)
    w.add_ssm_state_size(4)
    w.add_ssm_group_count(1)
    w.add_ssm_time_step_rank(2)
    w.add_ssm_inner_size(8)
    w.add_array("qwen35.attention.recurrent_layers", [True, False])
    w.add_full_attention_interval(2)
    w.add_rope_dimension_count(2)
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_vocab_size(16)
    rng = np.random.default_rng(35)
    shapes = {
        "token_embd.weight": (16, 8), "output_norm.weight": (8,),
        "blk.0.attn_norm.weight": (8,), "blk.0.post_attention_norm.weight": (8,),
        "blk.0.attn_qkv.weight": (16, 8), "blk.0.attn_gate.weight": (8, 8),
        "blk.0.ssm_beta.weight": (2, 8), "blk.0.ssm_alpha.weight": (2, 8),
        "blk.0.ssm_ba.weight": (4, 8), "blk.0.ssm_in.weight": (24, 8),
        "blk.0.ssm_conv1d.weight": (16, 4), "blk.0.ssm_dt.bias": (2,), "blk.0.ssm_a": (2,),
        "blk.0.ssm_norm.weight": (4,), "blk.0.ssm_out.weight": (8, 8),
        "blk.1.attn_q.weight": (16, 8), "blk.1.attn_q_norm.weight": (4,),
    }
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {os.path.getsize(path)} bytes", file=sys.stderr)


def main():
    ensure_venv()
    import llama_cpp
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    failed = False
    for name, golden, arch in MODELS:
        gdir = os.path.join(SHARED, "goldens", "hf", golden)
        with open(os.path.join(gdir, "golden.json")) as f:
            g = json.load(f)
        path = os.path.join(OUT_DIR, name + ".gguf")
        convert(gdir, arch, path)
        prompt, ref_ids = g["prompt_ids"], g["greedy_ids"]
        logits, greedy = run_llama_cpp(path, prompt, len(ref_ids), args.threads)
        ref = np.array(g["logits"], dtype=np.float64)
        max_err = float(np.max(np.abs(logits.astype(np.float64) - ref)))
        same_ids = greedy == ref_ids
        print(f"{name}: {arch}, {os.path.getsize(path)} bytes; llama.cpp vs transformers: "
              f"max |logit diff| {max_err:.2e} over {logits.shape[0]} positions, "
              f"greedy ids {'identical' if same_ids else 'DIFFER'}", file=sys.stderr)
        # transformers' golden logits are rounded to 1e-6; f32 sums in a
        # different order stay far below 1e-3.
        if max_err > 1e-3 or not same_ids:
            failed = True
        out = {
            "what": f"llama.cpp on {name}.gguf (GGUF architecture {arch}, converted from "
                    f"goldens/hf/{golden} by tools/make_hybrid_gguf.py): logits at every "
                    "prompt position (f32 KV cache, one batch) and greedy ids (argmax, "
                    "one token per decode).",
            "architecture": arch,
            "llama_cpp_python_version": llama_cpp.__version__,
            "max_abs_diff_vs_transformers": max_err,
            "greedy_matches_transformers": same_ids,
            "prompt_ids": prompt,
            "greedy_ids": greedy,
            "logits": [[round(float(x), 6) for x in row] for row in logits],
        }
        with open(os.path.join(OUT_DIR, name + ".json"), "w") as f:
            head = {k: v for k, v in out.items() if k != "logits"}
            f.write(json.dumps(head, indent=1)[:-2] + ',\n "logits": [\n' +
                    ",\n".join(json.dumps(r, separators=(",", ":")) for r in out["logits"]) + "\n]}\n")
    fuzz_seed(FUZZ_SEED)
    if failed:
        sys.exit("llama.cpp does not reproduce transformers on a converted file")


if __name__ == "__main__":
    main()
