#!/usr/bin/env python3
"""Random-weight Hugging Face model directories of today's MoE families at
their public sizes, for bench_cuda and the transformers peer
(bench/cuda/hf_family_peer.py) to read the same files.

    make_family_model.py PRESET OUT_DIR [--tokenizer DIR] [--seed N]
    make_family_model.py --check GOLDEN_DIR   (layout self-check, see below)

Presets (config.json values of the public checkpoints; docs/perf.md says
where each number came from):
  gemma4-26b-a4b    gemma4_text: 30 layers (5 sliding : 1 full), hidden 2816,
                    16 heads, sliding 8 KV heads of 256, full 2 KV heads of
                    512 with K as V, dense MLP 2112 beside 128 experts of
                    704 (top 8), vocab 262144, tied (25.2 B parameters, 50 GB)
  gpt-oss-20b       gpt_oss: 24 layers alternating sliding (128) / full,
                    hidden 2880, 64 heads / 8 KV heads of 64, 32 experts of
                    2880 (top 4) with biases, vocab 201088 (20.9 B, 42 GB);
                    the experts in bf16: rill reads MXFP4 experts from GGUF
                    files only, not from safetensors (gpt_oss.cpp refuses them)
  deepseek-v2-lite  DeepSeek-V2-Lite's sizes in the deepseek_v3 layout (rill
                    has no deepseek_v2 family): 27 layers, hidden 2048, 16
                    heads, MLA without q compression (q_lora_rank null),
                    kv_lora_rank 512, nope 128 / rope 64 / v 128, first layer
                    dense (10944), then 64 routed experts of 1408 (top 6)
                    plus 2 shared, vocab 102400 (15.7 B, 31 GB); default RoPE
                    and sigmoid routing (deepseek_v3's) instead of V2's YaRN
                    and softmax: the same bytes and FLOPs
  gemma4-26b-a4b-hd256  the Gemma 4 preset with the full layers' head_dim 256
                    instead of 512 (rill's CUDA attention stopped at 256 until
                    2026-12-03; kept for the comparison in docs/perf.md)
  tiny-*            the same three layouts at toy sizes, for CPU checks
  probe-*           Gemma 4 layouts with the real head dims at toy widths

Weights are bf16 N(0, 0.02) drawn once into a pool of 2^20 + 4099 values;
each tensor is a window of the pool at a seeded offset, repeated (the
pool's length is no multiple of any row, so rows differ). Speed does not
depend on the values; the fill is as fast as the disk takes the bytes
(/dev/shm: tens of GB in seconds; one shard per writer process, with
model.safetensors.index.json). Norm weights, Gemma 4's layer and router
scales are 1; DeepSeek's routing correction bias is f32 zeros. The
shards, config.json, and with --tokenizer a tokenizer.json /
tokenizer_config.json copied from DIR (tokenizer.json or .json.gz; the
engines are fed token ids, so its vocabulary need not match).

--check GOLDEN_DIR builds the tensor list from GOLDEN_DIR/config.json (a
tiny model Hugging Face transformers wrote, ../shared/goldens/hf) and
compares names and shapes with its model.safetensors header: the layout
functions here are transformers' own. Python standard library only.
"""
import argparse
import array
import gzip
import json
import os
import random
import shutil
import struct
import sys

POOL = (1 << 20) + 4099

GEMMA4_26B = dict(
    architectures=["Gemma4ForCausalLM"], model_type="gemma4_text", vocab_size=262144, hidden_size=2816,
    intermediate_size=2112, num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
    global_head_dim=512, num_global_key_value_heads=2, attention_k_eq_v=True, enable_moe_block=True,
    num_experts=128, top_k_experts=8, moe_intermediate_size=704, hidden_size_per_layer_input=0,
    num_kv_shared_layers=0, use_double_wide_mlp=False, sliding_window=1024, final_logit_softcapping=30.0,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 5, hidden_activation="gelu_pytorch_tanh",
    rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                        "rope_type": "proportional"},
                     "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
    max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
    bos_token_id=2, eos_token_id=1, pad_token_id=0)

GPT_OSS_20B = dict(
    architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=201088, hidden_size=2880,
    intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
    num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
    layer_types=["sliding_attention", "full_attention"] * 12, attention_bias=True, hidden_act="silu",
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False},
    swiglu_limit=7.0, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
    bos_token_id=199998, eos_token_id=200002, pad_token_id=199999)

DEEPSEEK_V2_LITE = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", vocab_size=102400, hidden_size=2048,
    intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
    num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
    qk_head_dim=192, head_dim=64, v_head_dim=128, n_routed_experts=64, num_experts_per_tok=6,
    n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1, norm_topk_prob=False,
    routed_scaling_factor=1.0, rope_interleave=True, hidden_act="silu",
    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, max_position_embeddings=163840,
    rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, num_nextn_predict_layers=0,
    bos_token_id=100000, eos_token_id=100001, pad_token_id=100001)


def tiny(cfg, **kw):
    c = dict(cfg)
    c.update(kw)
    return c


PRESETS = {
    "gemma4-26b-a4b": GEMMA4_26B,
    "gpt-oss-20b": GPT_OSS_20B,
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
    "tiny-gemma4-26b-a4b": tiny(GEMMA4_26B, vocab_size=512, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                global_head_dim=32, num_global_key_value_heads=1, num_experts=8, top_k_experts=2,
                                moe_intermediate_size=32, sliding_window=8, max_position_embeddings=512,
                                layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    # The same model with the full layers at 256 (what rill's CUDA backend ran
    # before its attention took 512; docs/perf.md compares the two).
    "gemma4-26b-a4b-hd256": tiny(GEMMA4_26B, global_head_dim=256),
    # Small models with the real head dims (256 / 512, and 256 / 256): what
    # each engine accepts, in seconds.
    "probe-gemma4-26b-a4b": tiny(GEMMA4_26B, vocab_size=512, hidden_size=256, intermediate_size=128,
                                 num_hidden_layers=6, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
                                 max_position_embeddings=4096,
                                 layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "probe-gemma4-26b-a4b-hd256": tiny(GEMMA4_26B, vocab_size=512, hidden_size=256, intermediate_size=128,
                                       num_hidden_layers=6, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
                                       global_head_dim=256, max_position_embeddings=4096,
                                       layer_types=["sliding_attention"] * 5 + ["full_attention"]),
    "tiny-gpt-oss-20b": tiny(GPT_OSS_20B, vocab_size=512, hidden_size=64, intermediate_size=32,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                             layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=512,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "tiny-deepseek-v2-lite": tiny(DEEPSEEK_V2_LITE, vocab_size=512, hidden_size=64, intermediate_size=128,
                                  moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                  qk_head_dim=24, head_dim=8, v_head_dim=16, n_routed_experts=8,
                                  num_experts_per_tok=2, n_shared_experts=2, max_position_embeddings=512,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0),
}

ONES = ("norm.weight", "layernorm.weight", "layer_scalar", "router.scale", "per_expert_scale")


def gemma4_tensors(c):
    E, H, V, L = c["hidden_size"], c["num_attention_heads"], c["vocab_size"], c["num_hidden_layers"]
    F, X, FM = c["intermediate_size"], c.get("num_experts") or 0, c.get("moe_intermediate_size") or 0
    moe = bool(c.get("enable_moe_block"))
    if c.get("hidden_size_per_layer_input") or c.get("num_kv_shared_layers"):
        sys.exit("make_family_model.py: Gemma 4 per-layer embeddings and KV sharing are not modelled here")
    plc = c.get("per_layer_config") or {}
    t = [("model.embed_tokens.weight", [V, E])]
    for i in range(L):
        full = c["layer_types"][i] == "full_attention"
        hd, kv = c["head_dim"], c["num_key_value_heads"]
        if full and c.get("global_head_dim"):
            hd = c["global_head_dim"]
        if full and c.get("attention_k_eq_v") and c.get("num_global_key_value_heads"):
            kv = c["num_global_key_value_heads"]
        hd = plc.get(str(i), {}).get("head_dim", hd)
        kv = plc.get(str(i), {}).get("num_key_value_heads", kv)
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", [E]), (p + "layer_scalar", [1]),
              (p + "mlp.down_proj.weight", [E, F]), (p + "mlp.gate_proj.weight", [F, E]),
              (p + "mlp.up_proj.weight", [F, E]), (p + "post_attention_layernorm.weight", [E]),
              (p + "post_feedforward_layernorm.weight", [E]), (p + "pre_feedforward_layernorm.weight", [E]),
              (p + "self_attn.k_norm.weight", [hd]), (p + "self_attn.k_proj.weight", [kv * hd, E]),
              (p + "self_attn.o_proj.weight", [E, H * hd]), (p + "self_attn.q_norm.weight", [hd]),
              (p + "self_attn.q_proj.weight", [H * hd, E])]
        if not (full and c.get("attention_k_eq_v")):
            t.append((p + "self_attn.v_proj.weight", [kv * hd, E]))
        if moe:
            t += [(p + "experts.down_proj", [X, E, FM]), (p + "experts.gate_up_proj", [X, 2 * FM, E]),
                  (p + "post_feedforward_layernorm_1.weight", [E]), (p + "post_feedforward_layernorm_2.weight", [E]),
                  (p + "pre_feedforward_layernorm_2.weight", [E]), (p + "router.per_expert_scale", [X]),
                  (p + "router.proj.weight", [X, E]), (p + "router.scale", [E])]
    t.append(("model.norm.weight", [E]))
    return t


def gpt_oss_tensors(c):
    E, V, L, X, F = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_local_experts"], \
        c["intermediate_size"]
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    t = [("lm_head.weight", [V, E]), ("model.embed_tokens.weight", [V, E])]
    for i in range(L):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", [E]), (p + "mlp.experts.down_proj", [X, F, E]),
              (p + "mlp.experts.down_proj_bias", [X, E]), (p + "mlp.experts.gate_up_proj", [X, E, 2 * F]),
              (p + "mlp.experts.gate_up_proj_bias", [X, 2 * F]), (p + "mlp.router.bias", [X]),
              (p + "mlp.router.weight", [X, E]), (p + "post_attention_layernorm.weight", [E])]
        for n, rows, cols in (("k", KV * hd, E), ("o", E, H * hd), ("q", H * hd, E), ("v", KV * hd, E)):
            t += [(p + f"self_attn.{n}_proj.bias", [rows]), (p + f"self_attn.{n}_proj.weight", [rows, cols])]
        t.append((p + "self_attn.sinks", [H]))
    t.append(("model.norm.weight", [E]))
    return t


def deepseek_tensors(c):
    E, V, L, H = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"], c["num_attention_heads"]
    QL, KL, R = c.get("q_lora_rank"), c["kv_lora_rank"], c["qk_rope_head_dim"]
    NOPE, VD, X, FM = c["qk_nope_head_dim"], c["v_head_dim"], c["n_routed_experts"], c["moe_intermediate_size"]
    S = FM * (c.get("n_shared_experts") or 0)
    t = [("lm_head.weight", [V, E]), ("model.embed_tokens.weight", [V, E])]
    for i in range(L):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", [E]), (p + "post_attention_layernorm.weight", [E]),
              (p + "self_attn.kv_a_layernorm.weight", [KL]), (p + "self_attn.kv_a_proj_with_mqa.weight", [KL + R, E]),
              (p + "self_attn.kv_b_proj.weight", [H * (NOPE + VD), KL]), (p + "self_attn.o_proj.weight", [E, H * VD])]
        if QL:
            t += [(p + "self_attn.q_a_layernorm.weight", [QL]), (p + "self_attn.q_a_proj.weight", [QL, E]),
                  (p + "self_attn.q_b_proj.weight", [H * (NOPE + R), QL])]
        else:
            t.append((p + "self_attn.q_proj.weight", [H * (NOPE + R), E]))
        if i < c.get("first_k_dense_replace", 0):
            F = c["intermediate_size"]
            t += [(p + "mlp.down_proj.weight", [E, F]), (p + "mlp.gate_proj.weight", [F, E]),
                  (p + "mlp.up_proj.weight", [F, E])]
            continue
        for j in range(X):
            q = p + f"mlp.experts.{j}."
            t += [(q + "down_proj.weight", [E, FM]), (q + "gate_proj.weight", [FM, E]), (q + "up_proj.weight", [FM, E])]
        t += [(p + "mlp.gate.e_score_correction_bias", [X]), (p + "mlp.gate.weight", [X, E])]
        if S:
            t += [(p + "mlp.shared_experts.down_proj.weight", [E, S]), (p + "mlp.shared_experts.gate_proj.weight", [S, E]),
                  (p + "mlp.shared_experts.up_proj.weight", [S, E])]
    t.append(("model.norm.weight", [E]))
    return t


LAYOUTS = {"gemma4_text": gemma4_tensors, "gpt_oss": gpt_oss_tensors, "deepseek_v3": deepseek_tensors}


def tensors_of(cfg):
    if cfg["model_type"] not in LAYOUTS:
        sys.exit(f"make_family_model.py: no layout for model_type {cfg['model_type']}")
    return LAYOUTS[cfg["model_type"]](cfg)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def bf16_pool(seed):
    """POOL bf16 values N(0, 0.02) as little-endian bytes (the high half of each f32)."""
    rng = random.Random(seed)
    f = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(POOL)))
    u = array.array("I")
    u.frombytes(f.tobytes())
    h = array.array("H", (x >> 16 for x in u))
    if sys.byteorder != "little":
        h.byteswap()
    return h.tobytes()


def write_shard(path, tensors, pool, starts):
    """One safetensors file holding `tensors` [(name, shape)], written in order."""
    header, at = {}, 0
    for name, shape in tensors:
        dt, es = ("F32", 4) if name.endswith("e_score_correction_bias") else ("BF16", 2)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + numel(shape) * es]}
        at += numel(shape) * es
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    view = memoryview(pool)
    one = struct.pack("<H", 0x3F80)  # bf16 1.0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, _ in tensors:
            b, e = header[name]["data_offsets"]
            if header[name]["dtype"] == "F32":
                f.write(bytes(e - b))
            elif name.endswith(ONES):
                f.write(one * ((e - b) // 2))
            else:  # a window of the pool from a seeded offset, wrapping around
                start, left = starts[name], e - b
                while left:
                    chunk = view[start:start + left]
                    f.write(chunk)
                    left, start = left - len(chunk), 0
    return at


def write_model(cfg, out, seed, tokenizer=None, n_proc=None):
    """Writes the weights as n_proc shards (one writer process each: writes
    to one file serialize on its inode) with model.safetensors.index.json,
    or one model.safetensors when n_proc is 1."""
    tensors = tensors_of(cfg)
    os.makedirs(out, exist_ok=True)
    pool = bf16_pool(seed)
    rng = random.Random(seed + 1)
    starts = {name: rng.randrange(POOL) * 2 for name, _ in tensors}
    n_proc = max(1, min(n_proc or os.cpu_count() or 1, 16, len(tensors)))
    # Shards take the tensors round-robin from the largest down (about even
    # bytes), each keeping the model's tensor order.
    order = sorted(range(len(tensors)), key=lambda i: -numel(tensors[i][1]))
    shares = [sorted(order[k::n_proc]) for k in range(n_proc)]
    files = ["model.safetensors"] if n_proc == 1 else \
        [f"model-{k + 1:05d}-of-{n_proc:05d}.safetensors" for k in range(n_proc)]
    pids = []
    for k in range(1, n_proc):
        pid = os.fork()
        if pid == 0:
            try:
                write_shard(os.path.join(out, files[k]), [tensors[i] for i in shares[k]], pool, starts)
                os._exit(0)
            except BaseException:
                os._exit(1)
        pids.append(pid)
    write_shard(os.path.join(out, files[0]), [tensors[i] for i in shares[0]], pool, starts)
    failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
    if failed:
        sys.exit(f"make_family_model.py: {len(failed)} writer process(es) failed")
    total = sum(numel(s) * (4 if n.endswith("e_score_correction_bias") else 2) for n, s in tensors)
    if n_proc > 1:
        weight_map = {tensors[i][0]: files[k] for k in range(n_proc) for i in shares[k]}
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(cfg, dtype="bfloat16", use_cache=True), f, indent=1)
    if tokenizer:
        src = os.path.join(tokenizer, "tokenizer.json")
        if os.path.exists(src):
            shutil.copy(src, os.path.join(out, "tokenizer.json"))
        else:
            with gzip.open(src + ".gz", "rb") as s, open(os.path.join(out, "tokenizer.json"), "wb") as d:
                shutil.copyfileobj(s, d)
        shutil.copy(os.path.join(tokenizer, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
    return sum(numel(s) for _, s in tensors), total


def check(golden):
    cfg = json.load(open(os.path.join(golden, "config.json")))
    with open(os.path.join(golden, "model.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        want = {k: v["shape"] for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
    got = {k: list(s) for k, s in tensors_of(cfg)}
    missing = sorted(k for k in want if k not in got)
    extra = sorted(k for k in got if k not in want)
    shapes = sorted(k for k in want if k in got and want[k] != got[k])
    for what, names in (("missing", missing), ("not in the golden", extra), ("shape differs", shapes)):
        for k in names[:10]:
            print(f"{golden}: {what}: {k} golden {want.get(k)} here {got.get(k)}")
    ok = not (missing or extra or shapes)
    print(f"{golden}: {len(want)} tensors, layout {'matches' if ok else 'DIFFERS'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("preset", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("out", nargs="?")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer", help="copy tokenizer.json(.gz) and tokenizer_config.json from this folder")
    ap.add_argument("--jobs", type=int, help="writer processes, one shard each (default: the cores, at most 16)")
    ap.add_argument("--check", nargs="+", metavar="GOLDEN_DIR", help="compare the layout with these goldens")
    a = ap.parse_args()
    if a.check:
        sys.exit(0 if all([check(g) for g in a.check]) else 1)
    if not a.preset or not a.out:
        ap.error("PRESET and OUT_DIR are required")
    params, nbytes = write_model(PRESETS[a.preset], a.out, a.seed, a.tokenizer, a.jobs)
    print(json.dumps({"preset": a.preset, "params": params, "bytes": nbytes, "dir": a.out}))


if __name__ == "__main__":
    main()
