#!/usr/bin/env python3
"""A MiniCPM3-4B-shaped model with random bf16 weights (N(0, 0.02), norms 1)
for bench_cuda: config from the tiny golden's with MiniCPM3-4B's sizes
(default RoPE: rill takes default and yarn only). Needs torch (on the GPU).
  python3 bench/cuda/make_minicpm3_model.py ../shared/goldens/hf/minicpm3/config.json OUT_DIR"""
import json, os, struct, sys
import torch

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
cfg = json.load(open(src))
E, L, H, QL, KL, NOPE, ROPE, VD, F, V = 2560, 62, 40, 768, 256, 64, 32, 64, 6400, 73448
cfg.update(hidden_size=E, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=QL,
           kv_lora_rank=KL, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, qk_head_dim=NOPE + ROPE, head_dim=ROPE,
           v_head_dim=VD, intermediate_size=F, vocab_size=V, dim_model_base=256, max_position_embeddings=32768,
           dtype="bfloat16", rms_norm_eps=1e-5)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
shapes = {"model.embed_tokens.weight": [V, E], "lm_head.weight": [V, E], "model.norm.weight": [E]}
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": [E], p + "post_attention_layernorm.weight": [E],
                   p + "mlp.gate_proj.weight": [F, E], p + "mlp.up_proj.weight": [F, E],
                   p + "mlp.down_proj.weight": [E, F], p + "self_attn.kv_a_layernorm.weight": [KL],
                   p + "self_attn.kv_a_proj_with_mqa.weight": [KL + ROPE, E],
                   p + "self_attn.kv_b_proj.weight": [H * (NOPE + VD), KL], p + "self_attn.o_proj.weight": [E, H * VD],
                   p + "self_attn.q_a_layernorm.weight": [QL], p + "self_attn.q_a_proj.weight": [QL, E],
                   p + "self_attn.q_b_proj.weight": [H * (NOPE + ROPE), QL]})
header, at = {}, 0
for k, s in shapes.items():
    n = 2
    for d in s: n *= d
    header[k] = {"dtype": "BF16", "shape": s, "data_offsets": [at, at + n]}
    at += n
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
torch.manual_seed(0)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for k, s in shapes.items():
        t = torch.ones(s, dtype=torch.bfloat16, device="cuda") if len(s) == 1 else \
            torch.randn(s, dtype=torch.bfloat16, device="cuda") * 0.02
        f.write(t.cpu().view(torch.int16).numpy().tobytes())
print("made", out, at / 1e9, "GB")
