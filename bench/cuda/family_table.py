#!/usr/bin/env python3
"""docs/perf.md's model-family rows from one device run: bench_cuda's JSON
(rill), hf_family_peer.py's JSON (transformers) and the model's config.json.

  family_table.py NAME MODEL_DIR RILL_JSON PEER_JSON

Rooflines, per model and point:
  decode   bytes a step must read (bench_cuda's bytes_per_step: every
           non-expert weight, the lm_head, the routed experts a batch of B
           touches under uniform routing, X (1 - (1 - K/X)^B) of X, and the
           KV of B sequences at the measured context) over the copy
           bandwidth bench_cuda measured in the same run; roofline tok/s =
           B / that time
  prefill  FLOPs of one N-token prompt (every matmul at its routed share,
           K/X of the experts; the lm_head for the last position only; the
           attention's QK and PV products over the causal (and sliding)
           pairs, MLA un-absorbed: qk 192 / v 128 per head) over the bf16
           GEMM rate bench_cuda measured in the same run
KV bytes per token: rill's (Model::kv_bytes_per_token, as /stats reports)
and computed here at 2 bytes an element: GQA K and V per KV head (Gemma 4's
K-as-V layers too: V is the projection before K's norm and RoPE, another
row), MLA the latent plus the rope key,
and what MLA's model would store as per-head K and V.
Prints markdown rows and a JSON line.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_family_model as mfm  # noqa: E402


def routed_share(c):
    if c["model_type"] == "gemma4_text":
        return c["top_k_experts"] / c["num_experts"]
    if c["model_type"] == "gpt_oss":
        return c["num_experts_per_tok"] / c["num_local_experts"]
    return c["num_experts_per_tok"] / c["n_routed_experts"]


def is_expert(name):
    return ".experts." in name


def pairs(T, window):
    """Query-key pairs of a causal prompt of T tokens, each query seeing at most `window` keys."""
    w = window or T
    return sum(min(i + 1, w) for i in range(T))


def attention_layers(c):
    """[(heads, qk dim, v dim, window or None)] per layer."""
    L, H = c["num_hidden_layers"], c["num_attention_heads"]
    if c["model_type"] == "deepseek_v3":
        return [(H, c["qk_nope_head_dim"] + c["qk_rope_head_dim"], c["v_head_dim"], None)] * L
    out = []
    for i in range(L):
        sliding = c["layer_types"][i] == "sliding_attention"
        hd = c["head_dim"] if sliding or not c.get("global_head_dim") else c["global_head_dim"]
        out.append((H, hd, hd, c["sliding_window"] if sliding else None))
    return out


def prefill_flops(c, T):
    share = routed_share(c)
    lin = 0.0
    for name, shape in mfm.tensors_of(c):
        if len(shape) < 2 or "bias" in name or name == "model.embed_tokens.weight" or name == "lm_head.weight":
            continue
        lin += mfm.numel(shape) * (share if is_expert(name) else 1.0)
    att = sum(2.0 * H * (dqk + dv) * pairs(T, w) for H, dqk, dv, w in attention_layers(c))
    head = 2.0 * c["vocab_size"] * c["hidden_size"]  # the last position's logits
    return 2.0 * lin * T + att + head, 2.0 * lin * T, att


def kv_bytes(c):
    """(bytes per token as this model stores K/V or the latent, per-head K and V of the same attention)."""
    L = c["num_hidden_layers"]
    if c["model_type"] == "deepseek_v3":
        mla = L * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
        per_head = L * c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]) * 2
        return mla, per_head
    total = 0
    for i in range(L):
        full = c["layer_types"][i] == "full_attention"
        hd, kv = c["head_dim"], c["num_key_value_heads"]
        if full and c.get("global_head_dim"):
            hd = c["global_head_dim"]
        if full and c.get("attention_k_eq_v") and c.get("num_global_key_value_heads"):
            kv = c["num_global_key_value_heads"]
        total += 2 * kv * hd * 2  # K and V: with K as V the two rows still differ (K normed and rotated)
    return total, total


def main():
    name, model, rill_json, peer_json = sys.argv[1:5]
    c = json.load(open(os.path.join(model, "config.json")))
    r = json.load(open(rill_json)) if os.path.exists(rill_json) else {}
    p = json.load(open(peer_json)) if os.path.exists(peer_json) else {}
    bw, peak = r.get("copy_gb_s"), r.get("gemm_tflops")
    rows = []
    peer_dec = {d["batch"]: d for d in p.get("decode", [])}
    for d in r.get("decode", []):
        B = d["batch"]
        roof = B * bw * 1e9 / d["bytes_per_step"]
        pt = peer_dec.get(B, {}).get("tok_s")
        rows.append({"point": f"decode batch {B}", "rill": d["tok_s"], "peer": pt, "roofline": roof,
                     "basis": f"{d['bytes_per_step'] / 1e9:.2f} GB/step at {bw:.0f} GB/s"})
    if "prefill" in r:
        T = r["prefill"]["tokens"]
        flops, lin, att = prefill_flops(c, T)
        roof = T / (flops / (peak * 1e12))
        pt = p.get("prefill", {}).get("tok_s")
        rows.append({"point": f"prefill {T}", "rill": r["prefill"]["tok_s"], "peer": pt, "roofline": roof,
                     "basis": f"{flops / 1e12:.2f} TFLOP ({att / 1e12:.2f} attention) at {peak:.0f} TFLOP/s"})
    kv, per_head = kv_bytes(c)
    fmt = lambda x: "-" if x is None else f"{x:,.0f}"  # noqa: E731
    frac = lambda x, roof: "-" if x is None else f"{100 * x / roof:.0f}%"  # noqa: E731
    for row in rows:
        print(f"| {name} | {row['point']} | {fmt(row['rill'])} | {frac(row['rill'], row['roofline'])} | "
              f"{fmt(row['peer'])} | {frac(row['peer'], row['roofline'])} | {fmt(row['roofline'])} | {row['basis']} |")
    print(f"KV {name}: rill {r.get('kv_bytes_per_token')} bytes/token; computed {kv} (2-byte elements)"
          + (f"; per-head K and V of the same attention {per_head}" if per_head != kv else ""))
    print("JSON " + json.dumps({"name": name, "rows": rows, "kv_rill": r.get("kv_bytes_per_token"), "kv_computed": kv,
                                "kv_per_head": per_head, "peer_notes": p.get("notes"),
                                "peer": {k: p.get(k) for k in ("transformers", "torch", "experts_implementation",
                                                                "attn_implementation", "load_s")}}))


if __name__ == "__main__":
    main()
