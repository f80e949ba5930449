#!/usr/bin/env python3
"""Tiny random MiniCPM checkpoints (model_type "minicpm", MiniCPMForCausalLM:
MiniCPM 1/2/4's dense muP design on Llama attention) and their reference
logits, for rill's parity tests of the `minicpm` family.

transformers has no MiniCPM class (the checkpoints ship their own
modeling_minicpm.py as remote code, which needs torch), so the reference here
is an independent float64 numpy implementation of that modeling:

    h      = embed_tokens[ids] * scale_emb
    layer  : h = h + o_proj(attn(rms_norm(h))) * scale_depth / sqrt(n_layers)
             h = h + down(silu(gate(x)) * up(x)), x = rms_norm(h), times the same scale
    logits = lm_head(rms_norm(h) / (hidden_size / dim_model_base))

attention: Llama's (q/k/v/o without bias, RoPE rotate_half over head_dim with
inv_freq = theta^(-2i/head_dim), grouped KV heads, causal softmax of q.k /
sqrt(head_dim)); RMSNorm x / sqrt(mean(x^2) + eps) * w; lm_head is the
embedding when tie_word_embeddings (no lm_head.weight in the file).

LongRoPE (MiniCPM 4, rope_scaling.rope_type "longrope"): each rotated pair's
frequency divided by short_factor (long_factor past
original_max_position_embeddings), cos and sin scaled when
max_position_embeddings exceeds that (here it equals it, as in MiniCPM4).

Writes, for each variant (untied: tests/data/minicpm, tied:
tests/data/minicpm-tied, LongRoPE: tests/data/minicpm-longrope, the untied
weights with random short and long factors):
    config.json         the MiniCPM config (GQA: 4 heads over 2 KV heads)
    model.safetensors   f32 weights under the Hugging Face names
    golden.json         prompt_ids, logits at every prompt position (float64
                        model, 6 decimals), greedy_ids (16 tokens, each the
                        argmax of a full recompute), as tools/make_hf_goldens.py
                        lays goldens out

    tools/make_minicpm_golden.py

Installs numpy and safetensors into .venv-tools itself (re-executing under
that interpreter) when they are not importable.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402

N_GREEDY = 16
PROMPT_LEN = 24


def make_config(tied, longrope_seed=None, np=None):
    cfg = {
        "architectures": ["MiniCPMForCausalLM"],
        "model_type": "minicpm",
        "vocab_size": 320,  # the GGUF files' synthetic vocabulary needs 259 byte / control tokens
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": tied,
        # MiniCPM-2B's scale_emb and scale_depth untied; other values tied, where
        # the embedding (also the head) must not drown the layers' output.
        "scale_emb": 2.5 if tied else 12,
        "scale_depth": 2.0 if tied else 1.4,
        "dim_model_base": 16 if tied else 8,  # logits are lm_head(h) / (32 / dim_model_base)
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if longrope_seed is not None:  # MiniCPM 4's LongRoPE: one divisor per rotated pair
        rng = np.random.default_rng(longrope_seed)
        half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
        cfg["rope_scaling"] = {
            "rope_type": "longrope",
            "short_factor": [round(float(f), 4) for f in rng.uniform(1.0, 8.0, half)],
            "long_factor": [round(float(f), 4) for f in rng.uniform(1.0, 32.0, half)],
            "original_max_position_embeddings": cfg["max_position_embeddings"],
        }
    return cfg


def make_weights(cfg, seed, np):
    rng = np.random.default_rng(seed)
    E, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = E // cfg["num_attention_heads"]
    Q, KV = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def mat(rows, cols, std):
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(n):  # not all ones, so a dropped norm weight shows
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(V, E, 0.08)}
    for il in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{il}."
        t[p + "input_layernorm.weight"] = norm(E)
        t[p + "self_attn.q_proj.weight"] = mat(Q, E, 0.25)
        t[p + "self_attn.k_proj.weight"] = mat(KV, E, 0.25)
        t[p + "self_attn.v_proj.weight"] = mat(KV, E, 0.25)
        t[p + "self_attn.o_proj.weight"] = mat(E, Q, 0.25)
        t[p + "post_attention_layernorm.weight"] = norm(E)
        t[p + "mlp.gate_proj.weight"] = mat(F, E, 0.25)
        t[p + "mlp.up_proj.weight"] = mat(F, E, 0.25)
        t[p + "mlp.down_proj.weight"] = mat(E, F, 0.2)
    t["model.norm.weight"] = norm(E)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = mat(V, E, 0.5)
    return t


def rms_norm(x, w, eps, np):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, cfg, np):
    """x [n, heads, hd]: rotate_half RoPE at positions pos (MiniCPM's
    apply_rotary_pos_emb). LongRoPE (MiniCPMLongRoPE): the short factors
    divide each pair's frequency while the sequence is within
    original_max_position_embeddings (the long ones beyond), cos and sin
    times sqrt(1 + ln(max / original) / ln(original)) at every length (1
    here: max_position_embeddings equals the original, the only case rill
    runs)."""
    hd = x.shape[-1]
    inv_freq = 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    scale = 1.0
    s = cfg.get("rope_scaling") or {}
    if s.get("rope_type") == "longrope":
        orig, max_pos = s["original_max_position_embeddings"], cfg["max_position_embeddings"]
        seq = max(max_pos, len(pos))  # the cache MiniCPM builds covers max_position_embeddings
        inv_freq = inv_freq / np.array(s["long_factor"] if seq > orig else s["short_factor"], dtype=np.float64)
        scale = np.sqrt(1 + np.log(max_pos / orig) / np.log(orig))  # unclamped, as MiniCPM's
    ang = np.outer(pos, inv_freq)  # [n, hd/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :] * scale
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :] * scale
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def forward(cfg, t, ids, np):
    """float64 logits [len(ids), V] of the whole sequence (causal)."""
    w = {k: v.astype(np.float64) for k, v in t.items()}
    E, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, L, eps = E // H, cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    n = len(ids)
    pos = np.arange(n, dtype=np.float64)
    residual_scale = cfg["scale_depth"] / np.sqrt(L)
    h = w["model.embed_tokens.weight"][ids] * cfg["scale_emb"]
    mask = np.triu(np.full((n, n), -np.inf), k=1)
    for il in range(L):
        p = f"model.layers.{il}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps, np)
        q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, H, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, Hkv, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(n, Hkv, hd)
        q, k = rope(q, pos, cfg, np), rope(k, pos, cfg, np)
        out = np.empty((n, H, hd))
        for head in range(H):
            kv = head // (H // Hkv)
            s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, head, :] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, kv, :]
        h = h + (out.reshape(n, H * hd) @ w[p + "self_attn.o_proj.weight"].T) * residual_scale
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps, np)
        g = x @ w[p + "mlp.gate_proj.weight"].T
        u = x @ w[p + "mlp.up_proj.weight"].T
        h = h + ((g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T) * residual_scale
    h = rms_norm(h, w["model.norm.weight"], eps, np)
    head = w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else w["lm_head.weight"]
    return (h / (cfg["hidden_size"] / cfg["dim_model_base"])) @ head.T


def main():
    tools_venv.ensure(["numpy", "safetensors"], ["numpy", "safetensors"])
    import numpy as np
    from safetensors.numpy import save_file

    for name, tied, seed, longrope in (("minicpm", False, 20, False), ("minicpm-tied", True, 21, False),
                                       ("minicpm-longrope", False, 20, True)):
        cfg = make_config(tied, seed + 200 if longrope else None, np)
        t = make_weights(cfg, seed, np)
        prompt = [int(i) for i in np.random.default_rng(seed + 100).integers(3, cfg["vocab_size"], PROMPT_LEN)]
        logits = forward(cfg, t, prompt, np)
        ids, margins = list(prompt), []
        for _ in range(N_GREEDY):  # each token from a full recompute, as transformers' goldens without a cache
            row = forward(cfg, t, ids, np)[-1]
            top2 = np.sort(row)[-2:]
            margins.append(float(top2[1] - top2[0]))
            ids.append(int(np.argmax(row)))
        greedy = ids[len(prompt):]
        # The greedy ids must not hinge on rounding: rill (f32) is ~1e-6 from this model.
        if min(margins) < 1e-3:
            sys.exit(f"{name}: a greedy step's top-2 margin is {min(margins):.2e}; pick another seed")
        out_dir = os.path.join(ROOT, "tests", "data", name)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        save_file(t, os.path.join(out_dir, "model.safetensors"))
        golden = {
            "model_type": "minicpm",
            "what": "tools/make_minicpm_golden.py: the float64 numpy MiniCPM model's logits at every prompt "
                    "position (6 decimals) and its greedy ids (argmax, full recompute per token)",
            "prompt_ids": prompt,
            "logits": [[round(float(x), 6) for x in row] for row in logits],
            "greedy_ids": greedy,
        }
        with open(os.path.join(out_dir, "golden.json"), "w") as f:
            head = {k: v for k, v in golden.items() if k != "logits"}
            f.write(json.dumps(head, indent=1)[:-2] + ',\n "logits": [\n' +
                    ",\n".join(json.dumps(r, separators=(",", ":")) for r in golden["logits"]) + "\n]}\n")
        print(f"{name}: {os.path.getsize(os.path.join(out_dir, 'model.safetensors'))} bytes of weights, "
              f"logits |max| {np.abs(logits).max():.3f}, greedy {greedy}, min top-2 margin {min(margins):.2e}")


if __name__ == "__main__":
    main()
