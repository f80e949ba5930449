#!/usr/bin/env python3
"""A tiny DeepSeek-V3, GLM-4.5 (glm4_moe), GLM-5 (glm_moe_dsa) or Qwen3-Next
checkpoint with a multi-token-prediction (MTP) layer, and the MTP head's
draft logits from a numpy reference.

GLM-5 (DsaModel) is held to tests/data/glm-5-causal (rill's causal index
selection, tools/make_dsa_causal_golden.py) instead of transformers'
golden, and its MTP layer gets its own lightning indexer. Qwen3-Next
(QwenNextMtp, main_qwen_next) has no numpy gated DeltaNet: its golden gives
the hidden rows the head reads.

The Hugging Face goldens drop MTP weights (transformers does not run them), so
there is no transformers reference for the MTP head. This script:
  1. holds its numpy DeepSeek-V3 (MLA attention, dense and group-limited MoE
     layers) or GLM-4.5 (GlmModel: Llama attention with q/k norms and
     partial RoPE, the same MoE) to ../shared/goldens/hf/{deepseek-v3,
     glm4-moe}/golden.json: every prompt position's logits within 1e-4 and
     the greedy continuation;
  2. adds one MTP layer with random weights (seeded) under the names the
     DeepSeek-V3 checkpoints use, model.layers.{num_hidden_layers}.*:
     embed_tokens, enorm, hnorm, eh_proj, a whole decoder layer
     (input_layernorm, self_attn.*, post_attention_layernorm, mlp.*: an MoE
     layer, as the layer index is past first_k_dense_replace) and
     shared_head.{norm,head}; embed_tokens and shared_head.head are copies of
     the main model's (DeepSeek-V3 stores them so);
  3. writes OUT/config.json, OUT/model.safetensors and OUT/golden.json.

The MTP head (DeepSeek-V3 technical report, section 2.2, with k = 1): for
position i with the main model's hidden state h_i and the next token t_{i+1},
    h'_i = eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)])     (embedding first,
           as the released weights, vLLM, SGLang and llama.cpp order it; the
           report's equation writes the hidden state first)
    o_i  = DecoderLayer(h'_0..h'_i)[i]   (causal attention over the MTP
           layer's own keys of positions 0..i, RoPE at position i)
    logits_i = shared_head.head(shared_head.norm(o_i)), a guess of t_{i+2}.
h_i is the main model's last hidden state after its final norm (model.norm),
as vLLM, SGLang and llama.cpp feed the MTP layer. No position is masked
(vLLM zeroes the embedding at position 0; that is not part of the report).

golden.json: prompt_ids (the golden's), next_token (the main model's greedy
pick after the prompt), mtp_logits [len(prompt)][n_vocab]: row i is the MTP
head at position i with t_{i+1} = prompt[i + 1], the last row with
t_{S} = next_token (the first draft a speculator would propose), and
mtp_greedy: each row's argmax, mtp_chain: the first 4 drafts with the MTP
layer chained on its own output (Model.mtp_chain).
  .venv-tools/bin/python tools/make_mtp_golden.py ../shared/goldens/hf/deepseek-v3 tests/data/mtp-deepseek-v3
  .venv-tools/bin/python tools/make_mtp_golden.py ../shared/goldens/hf/glm4-moe tests/data/mtp-glm4-moe
  .venv-tools/bin/python tools/make_mtp_golden.py ../shared/goldens/hf/glm-5 tests/data/mtp-glm-5
  .venv-tools/bin/python tools/make_mtp_golden.py ../shared/goldens/hf/qwen3-next tests/data/mtp-qwen3-next
(tools/tools_venv.sh numpy makes the venv.)
"""
import json
import os
import sys

import numpy as np

from f32_safetensors import read_f32_safetensors, write_f32_safetensors


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    return cfg, read_f32_safetensors(os.path.join(d, "model.safetensors"))


class Model:
    def __init__(self, cfg, w):
        self.c = cfg
        self.w = {k: v.astype(np.float64) for k, v in w.items()}
        self.rope_dim = cfg["qk_rope_head_dim"]
        theta = cfg["rope_parameters"]["rope_theta"]
        assert cfg["rope_parameters"]["rope_type"] == "default" and cfg["rope_interleave"]
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.rope_dim, 2) / self.rope_dim)

    def rope(self, x, pos):  # pairs (2i, 2i+1) of the last axis; x [..., S, rope_dim]
        f = np.outer(pos, self.inv_freq)
        c, s = np.cos(f), np.sin(f)
        o = np.empty_like(x)
        o[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        o[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return o

    def rms(self, x, w):
        return w * x / np.sqrt((x * x).mean(-1, keepdims=True) + self.c["rms_norm_eps"])

    def mlp(self, x, p):
        W = self.w
        g = x @ W[p + "gate_proj.weight"].T
        return (g / (1 + np.exp(-g)) * (x @ W[p + "up_proj.weight"].T)) @ W[p + "down_proj.weight"].T

    def moe(self, x, p):
        """DeepSeek-V3's router: sigmoid scores, the correction bias for the
        choice only, the best topk_group groups by the sum of their top-2
        biased scores, top-k experts among them, weights normalized and
        scaled by routed_scaling_factor; plus the shared expert."""
        c, W = self.c, self.w
        E, G = c["n_routed_experts"], c["n_group"]
        sc = 1 / (1 + np.exp(-(x @ W[p + "gate.weight"].T)))
        choice = sc + W[p + "gate.e_score_correction_bias"]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            groups = choice[t].reshape(G, E // G)
            gscore = np.sort(groups, -1)[:, -2:].sum(-1)
            keep = np.argsort(-gscore, kind="stable")[:c["topk_group"]]
            masked = np.zeros(E)  # transformers fills the other groups with 0
            for g in keep:
                masked[g * (E // G):(g + 1) * (E // G)] = groups[g]
            idx = np.argsort(-masked, kind="stable")[:c["num_experts_per_tok"]]
            wt = sc[t, idx]
            if c["norm_topk_prob"]:
                wt = wt / (wt.sum() + 1e-20)
            wt = wt * c["routed_scaling_factor"]
            for e, we in zip(idx, wt):
                out[t] += we * self.mlp(x[t:t + 1], p + "experts.%d." % e)[0]
        return out + self.mlp(x, p + "shared_experts.")

    def layer(self, x, il):
        """Decoder layer `il` over x [S, E] at positions 0..S-1, causal."""
        c, W = self.c, self.w
        S, H, R = x.shape[0], c["num_attention_heads"], self.rope_dim
        L, nope, vd = c["kv_lora_rank"], c["qk_nope_head_dim"], c["v_head_dim"]
        pos = np.arange(S)
        p = "model.layers.%d." % il
        a = p + "self_attn."
        h = self.rms(x, W[p + "input_layernorm.weight"])
        qr = self.rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"])
        q = (qr @ W[a + "q_b_proj.weight"].T).reshape(S, H, nope + R).transpose(1, 0, 2)
        q = np.concatenate([q[..., :nope], self.rope(q[..., nope:], pos)], -1)
        kv = h @ W[a + "kv_a_proj_with_mqa.weight"].T
        lat = self.rms(kv[:, :L], W[a + "kv_a_layernorm.weight"])
        kvb = (lat @ W[a + "kv_b_proj.weight"].T).reshape(S, H, nope + vd).transpose(1, 0, 2)
        k = np.concatenate([kvb[..., :nope], np.broadcast_to(self.rope(kv[:, L:], pos), (H, S, R))], -1)
        att = np.einsum("hsd,htd->hst", q, k) * (nope + R) ** -0.5
        att = np.where(np.tril(np.ones((S, S), bool))[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hst,htd->shd", att, kvb[..., nope:]).reshape(S, H * vd)
        x = x + o @ W[a + "o_proj.weight"].T
        h2 = self.rms(x, W[p + "post_attention_layernorm.weight"])
        dense = il < c["first_k_dense_replace"]
        return x + (self.mlp(h2, p + "mlp.") if dense else self.moe(h2, p + "mlp."))

    def hidden(self, ids):
        """The main model's last hidden states after model.norm: [S, E]."""
        x = self.w["model.embed_tokens.weight"][ids]
        for il in range(self.c["num_hidden_layers"]):
            x = self.layer(x, il)
        return self.rms(x, self.w["model.norm.weight"])

    def logits(self, ids):
        return self.hidden(ids) @ self.w["lm_head.weight"].T

    def mtp_layer(self, h, next_ids):
        """The MTP layer at positions 0..S-1: h [S, E] the hidden rows,
        next_ids[i] = t_{i+1}. Returns its output before shared_head.norm
        [S, E] and the head's logits [S, n_vocab]."""
        W = self.w
        p = "model.layers.%d." % self.c["num_hidden_layers"]
        e = W[p + "embed_tokens.weight"][next_ids]
        x = np.concatenate([self.rms(e, W[p + "enorm.weight"]), self.rms(h, W[p + "hnorm.weight"])], -1)
        x = x @ W[p + "eh_proj.weight"].T
        x = self.layer(x, self.c["num_hidden_layers"])
        return x, self.rms(x, W[p + "shared_head.norm.weight"]) @ W[p + "shared_head.head.weight"].T

    def mtp_logits(self, h, next_ids):
        """The MTP head (k = 1) at positions 0..S-1: h [S, E] the main model's
        hidden states, next_ids[i] = t_{i+1}. Returns [S, n_vocab]."""
        return self.mtp_layer(h, next_ids)[1]

    def mtp_chain(self, h, next_ids, k):
        """k greedy drafts after position S-1 with the one MTP layer chained:
        d_1 is the head's argmax at S-1; d_{j+1} its argmax at position
        S-1+j, whose token is d_j and whose hidden row is the layer's own
        output at S-2+j (mtp_layer's first result: before shared_head.norm
        for DeepSeek and GLM, after mtp.norm for Qwen3-Next, as vLLM and
        SGLang chain them; causal, so earlier rows never change)."""
        h, ids, drafts = np.array(h), list(next_ids), []
        for _ in range(k):
            out, logits = self.mtp_layer(h, ids)
            drafts.append(int(np.argmax(logits[-1])))
            h = np.concatenate([h, out[-1:]], 0)
            ids.append(drafts[-1])
        return drafts


class GlmModel(Model):
    """GLM-4.5 (glm4_moe): Llama attention (q/k/v with optional biases,
    q_norm / k_norm over head_dim, GQA, RoPE on the first
    partial_rotary_factor of each head in the rotate-half form), a dense
    first_k_dense_replace prefix, then DeepSeek-V3's router and shared
    experts (Model.moe). Its nextn (MTP) layer is the same scheme as
    DeepSeek-V3's, around a glm4_moe decoder layer."""

    def __init__(self, cfg, w):
        self.c = cfg
        self.w = {k: v.astype(np.float64) for k, v in w.items()}
        rp = cfg["rope_parameters"]
        assert rp["rope_type"] == "default"
        self.hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        self.rope_dim = int(self.hd * rp.get("partial_rotary_factor", 1.0))
        self.inv_freq = 1.0 / rp["rope_theta"] ** (np.arange(0, self.rope_dim, 2) / self.rope_dim)

    def rope(self, x, pos):  # rotate-half over the first rope_dim dims of the last axis; x [..., S, hd]
        R, f = self.rope_dim, np.outer(pos, self.inv_freq)
        c, s = np.cos(f), np.sin(f)
        o = np.array(x)
        a, b = x[..., :R // 2], x[..., R // 2:R]
        o[..., :R // 2] = a * c - b * s
        o[..., R // 2:R] = b * c + a * s
        return o

    def layer(self, x, il):
        c, W = self.c, self.w
        S, H, KV, hd = x.shape[0], c["num_attention_heads"], c["num_key_value_heads"], self.hd
        pos = np.arange(S)
        p = "model.layers.%d." % il
        a = p + "self_attn."
        h = self.rms(x, W[p + "input_layernorm.weight"])

        def proj(n, heads):
            y = h @ W[a + n + "_proj.weight"].T
            if a + n + "_proj.bias" in W:
                y = y + W[a + n + "_proj.bias"]
            return y.reshape(S, heads, hd).transpose(1, 0, 2)

        q, k, v = proj("q", H), proj("k", KV), proj("v", KV)
        if a + "q_norm.weight" in W:
            q, k = self.rms(q, W[a + "q_norm.weight"]), self.rms(k, W[a + "k_norm.weight"])
        q, k = self.rope(q, pos), self.rope(k, pos)
        k, v = np.repeat(k, H // KV, 0), np.repeat(v, H // KV, 0)
        att = np.einsum("hsd,htd->hst", q, k) * hd ** -0.5
        att = np.where(np.tril(np.ones((S, S), bool))[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hst,htd->shd", att, v).reshape(S, H * hd)
        x = x + o @ W[a + "o_proj.weight"].T
        h2 = self.rms(x, W[p + "post_attention_layernorm.weight"])
        dense = il < c["first_k_dense_replace"]
        return x + (self.mlp(h2, p + "mlp.") if dense else self.moe(h2, p + "mlp."))


class DsaModel(Model):
    """GLM-5 (glm_moe_dsa): DeepSeek-V3's MLA and MoE plus the lightning
    indexer of DeepSeek sparse attention, with rill's causal selection
    (tools/make_dsa_causal_golden.py: top index_topk keys of [0, t], ties to
    the later key; a "shared" layer reuses the selection of the layer
    before). Its MTP layer is an MLA layer with its own indexer (a "full"
    one: the files hold its indexer weights)."""

    def __init__(self, cfg, w):
        self.c = cfg
        self.w = {k: v.astype(np.float64) for k, v in w.items()}
        self.rope_dim = cfg["qk_rope_head_dim"]
        theta = cfg["rope_parameters"]["rope_theta"]
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.rope_dim, 2) / self.rope_dim)

    def dsa_layer(self, x, il, sel):
        """Decoder layer il over x [S, E]; sel: the selection a shared layer
        reuses. Returns (x, the layer's selection)."""
        c, W = self.c, self.w
        S, H, R = x.shape[0], c["num_attention_heads"], self.rope_dim
        L, nope, vd = c["kv_lora_rank"], c["qk_nope_head_dim"], c["v_head_dim"]
        IH, ID = c["index_n_heads"], c["index_head_dim"]
        pos = np.arange(S)
        p = "model.layers.%d." % il
        a = p + "self_attn."
        h = self.rms(x, W[p + "input_layernorm.weight"])
        qr = self.rms(h @ W[a + "q_a_proj.weight"].T, W[a + "q_a_layernorm.weight"])
        q = (qr @ W[a + "q_b_proj.weight"].T).reshape(S, H, nope + R).transpose(1, 0, 2)
        q = np.concatenate([q[..., :nope], self.rope(q[..., nope:], pos)], -1)
        kv = h @ W[a + "kv_a_proj_with_mqa.weight"].T
        lat = self.rms(kv[:, :L], W[a + "kv_a_layernorm.weight"])
        kvb = (lat @ W[a + "kv_b_proj.weight"].T).reshape(S, H, nope + vd).transpose(1, 0, 2)
        k = np.concatenate([kvb[..., :nope], np.broadcast_to(self.rope(kv[:, L:], pos), (H, S, R))], -1)
        if a + "indexer.wq_b.weight" in W:
            iq = (qr @ W[a + "indexer.wq_b.weight"].T).reshape(S, IH, ID).transpose(1, 0, 2)
            iq = np.concatenate([self.rope(iq[..., :R], pos), iq[..., R:]], -1).transpose(1, 0, 2)
            ik = h @ W[a + "indexer.wk.weight"].T
            m = ik.mean(-1, keepdims=True)
            ik = (ik - m) / np.sqrt(((ik - m) ** 2).mean(-1, keepdims=True) + 1e-6)
            ik = ik * W[a + "indexer.k_norm.weight"] + W[a + "indexer.k_norm.bias"]
            ik = np.concatenate([self.rope(ik[:, :R], pos), ik[:, R:]], -1)
            hw = (h @ W[a + "indexer.weights_proj.weight"].T) * IH ** -0.5
            sc = np.maximum(np.einsum("shd,td->sht", iq, ik) * ID ** -0.5, 0)
            scores = np.einsum("sht,sh->st", sc, hw)
            sel = np.zeros((S, S), bool)
            for t in range(S):
                order = sorted(range(t + 1), key=lambda j: (-scores[t][j], -j))
                sel[t, order[:c["index_topk"]]] = True
        att = np.einsum("hsd,htd->hst", q, k) * (nope + R) ** -0.5
        att = np.where(sel[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hst,htd->shd", att, kvb[..., nope:]).reshape(S, H * vd)
        x = x + o @ W[a + "o_proj.weight"].T
        h2 = self.rms(x, W[p + "post_attention_layernorm.weight"])
        types = c["mlp_layer_types"]
        dense = il < len(types) and types[il] == "dense"
        return x + (self.mlp(h2, p + "mlp.") if dense else self.moe(h2, p + "mlp.")), sel

    def hidden(self, ids):
        x, sel = self.w["model.embed_tokens.weight"][ids], None
        for il in range(self.c["num_hidden_layers"]):
            x, sel = self.dsa_layer(x, il, sel)
        return self.rms(x, self.w["model.norm.weight"])

    def layer(self, x, il):
        return self.dsa_layer(x, il, None)[0]  # the MTP layer: its own indexer


def add_dsa_indexer(cfg, w, rng):
    """The MTP layer's own lightning indexer: the first full layer's
    indexer tensor names, resampled at each tensor's scale."""
    src = "model.layers.%d.self_attn.indexer." % cfg["indexer_types"].index("full")
    dst = "model.layers.%d.self_attn.indexer." % cfg["num_hidden_layers"]
    for k in [k for k in w if k.startswith(src)]:
        v = w[k]
        if k.endswith("k_norm.weight"):
            w[dst + k[len(src):]] = (1 + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
        elif k.endswith("k_norm.bias"):
            w[dst + k[len(src):]] = (0.1 * rng.standard_normal(v.shape)).astype(np.float32)
        else:
            w[dst + k[len(src):]] = (rng.standard_normal(v.shape) * v.std()).astype(np.float32)


class QwenNextMtp(GlmModel):
    """Qwen3-Next's MTP block (mtp.*, as vLLM's qwen3_next_mtp runs it):
    x = fc([pre_fc_norm_embedding(emb(t)); pre_fc_norm_hidden(h)]), one
    full-attention decoder layer mtp.layers.0 (gated attention: q_proj
    yields per head [query | gate], q/k norms, partial RoPE, out =
    o_proj(attn * sigmoid(gate)); the softmax top-k MoE with a sigmoid-gated
    shared expert), then o = mtp.norm(x) and logits = lm_head(o). Every
    RMSNorm scales by (1 + w). The chain feeds o (normed) back. There is no
    numpy gated DeltaNet here: the main model's hidden rows are given."""

    def rms(self, x, w):
        return (1 + w) * x / np.sqrt((x * x).mean(-1, keepdims=True) + self.c["rms_norm_eps"])

    def moe(self, x, p):
        c, W = self.c, self.w
        logits = x @ W[p + "gate.weight"].T
        prob = np.exp(logits - logits.max(-1, keepdims=True))
        prob /= prob.sum(-1, keepdims=True)
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            idx = np.argsort(-prob[t], kind="stable")[:c["num_experts_per_tok"]]
            wt = prob[t, idx]
            if c["norm_topk_prob"]:
                wt = wt / wt.sum()
            for e, we in zip(idx, wt):
                out[t] += we * self.mlp(x[t:t + 1], p + "experts.%d." % e)[0]
        gate = 1 / (1 + np.exp(-(x @ W[p + "shared_expert_gate.weight"].T)))
        return out + gate * self.mlp(x, p + "shared_expert.")

    def layer(self, x, p):
        c, W = self.c, self.w
        S, H, KV, hd = x.shape[0], c["num_attention_heads"], c["num_key_value_heads"], self.hd
        pos = np.arange(S)
        a = p + "self_attn."
        h = self.rms(x, W[p + "input_layernorm.weight"])
        qg = (h @ W[a + "q_proj.weight"].T).reshape(S, H, 2 * hd)
        q, gate = qg[..., :hd].transpose(1, 0, 2), qg[..., hd:].reshape(S, H * hd)
        k = (h @ W[a + "k_proj.weight"].T).reshape(S, KV, hd).transpose(1, 0, 2)
        v = (h @ W[a + "v_proj.weight"].T).reshape(S, KV, hd).transpose(1, 0, 2)
        q, k = self.rms(q, W[a + "q_norm.weight"]), self.rms(k, W[a + "k_norm.weight"])
        q, k = self.rope(q, pos), self.rope(k, pos)
        k, v = np.repeat(k, H // KV, 0), np.repeat(v, H // KV, 0)
        att = np.einsum("hsd,htd->hst", q, k) * hd ** -0.5
        att = np.where(np.tril(np.ones((S, S), bool))[None], att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hst,htd->shd", att, v).reshape(S, H * hd)
        x = x + (o / (1 + np.exp(-gate))) @ W[a + "o_proj.weight"].T
        return x + self.moe(self.rms(x, W[p + "post_attention_layernorm.weight"]), p + "mlp.")

    def mtp_layer(self, h, next_ids):
        W = self.w
        e = W["model.embed_tokens.weight"][next_ids]
        x = np.concatenate([self.rms(e, W["mtp.pre_fc_norm_embedding.weight"]),
                            self.rms(h, W["mtp.pre_fc_norm_hidden.weight"])], -1)
        o = self.rms(self.layer(x @ W["mtp.fc.weight"].T, "mtp.layers.0."), W["mtp.norm.weight"])
        return o, o @ W["lm_head.weight"].T


def add_qwen_mtp(cfg, w, rng):
    """Random weights for mtp.*: the last (full-attention) layer's tensor
    names under mtp.layers.0., resampled at each tensor's scale, plus fc and
    the three norms ((1 + w) norms: w near 0)."""
    E = cfg["hidden_size"]
    src = "model.layers.%d." % (cfg["num_hidden_layers"] - 1)
    assert cfg["layer_types"][-1] == "full_attention"
    for k in [k for k in w if k.startswith(src)]:
        v = w[k]
        scale = 0.1 if k.endswith("norm.weight") else v.std()
        w["mtp.layers.0." + k[len(src):]] = (rng.standard_normal(v.shape) * scale).astype(np.float32)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        w["mtp.%s.weight" % n] = (0.1 * rng.standard_normal(E)).astype(np.float32)
    w["mtp.fc.weight"] = (rng.standard_normal((E, 2 * E)) * (2 * E) ** -0.5).astype(np.float32)


def main_qwen_next(src, out, cfg, w, gold):
    """Qwen3-Next: the golden gives the main model's hidden rows (seeded
    normal values, `hidden`), which the test feeds to forward_mtp, and the
    next token is the transformers golden's greedy pick."""
    prompt = gold["prompt_ids"]
    cfg["mtp_num_hidden_layers"] = 1
    rng = np.random.default_rng(21)
    add_qwen_mtp(cfg, w, rng)
    m = QwenNextMtp(cfg, w)
    h = rng.standard_normal((len(prompt), cfg["hidden_size"]))
    next_token = gold["greedy_ids"][0]
    mtp = m.mtp_logits(h, prompt[1:] + [next_token]).astype(np.float32)
    mtp_greedy = [int(v) for v in np.argmax(mtp, -1)]
    chain = m.mtp_chain(h, prompt[1:] + [next_token], 4)
    assert chain[0] == mtp_greedy[-1]
    print("Qwen3-Next MTP head: %d rows, first draft %d, chain (k = 4) %s" % (len(mtp), mtp_greedy[-1], chain))
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    write_f32_safetensors(os.path.join(out, "model.safetensors"), w, {"format": "pt"})
    json.dump({"model_type": cfg["model_type"], "prompt_ids": prompt, "next_token": next_token,
               "hidden": [[round(float(v), 6) for v in row] for row in h.astype(np.float32)],
               "mtp_logits": [[round(float(v), 6) for v in row] for row in mtp],
               "mtp_greedy": mtp_greedy, "mtp_chain": chain,
               "note": "tools/make_mtp_golden.py: %s plus a random mtp.* block; numpy reference of the Qwen3-Next "
                       "MTP head (k = 1) and its chain over the given hidden rows"
                       % os.path.basename(os.path.normpath(src))},
              open(os.path.join(out, "golden.json"), "w"))


FAMILIES = {"deepseek_v3": ("DeepSeek-V3", Model), "glm4_moe": ("GLM-4.5", GlmModel), "glm_moe_dsa": ("GLM-5", DsaModel)}


def add_mtp_layer(cfg, w, rng):
    """Random weights for model.layers.{num_hidden_layers}: a copy of the last
    layer's tensor names (an MoE layer), resampled at the scale of each
    tensor, plus the MTP tensors."""
    L, E = cfg["num_hidden_layers"], cfg["hidden_size"]
    src, dst = "model.layers.%d." % (L - 1), "model.layers.%d." % L
    assert L - 1 >= cfg["first_k_dense_replace"], "the last layer must be an MoE layer to copy its names"
    for k in [k for k in w if k.startswith(src)]:
        v = w[k]
        if k.endswith("norm.weight") or k.endswith("layernorm.weight"):
            w[dst + k[len(src):]] = (1 + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
        elif k.endswith("e_score_correction_bias"):
            w[dst + k[len(src):]] = (0.05 * rng.standard_normal(v.shape)).astype(np.float32)
        else:
            w[dst + k[len(src):]] = (rng.standard_normal(v.shape) * v.std()).astype(np.float32)
    w[dst + "embed_tokens.weight"] = w["model.embed_tokens.weight"].copy()
    w[dst + "shared_head.head.weight"] = w["lm_head.weight"].copy()
    for n in ("enorm", "hnorm", "shared_head.norm"):
        w[dst + n + ".weight"] = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    w[dst + "eh_proj.weight"] = (rng.standard_normal((E, 2 * E)) * (2 * E) ** -0.5).astype(np.float32)


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg, w = load(src)
    gold = json.load(open(os.path.join(src, "golden.json")))
    if cfg["model_type"] == "qwen3_next":
        return main_qwen_next(src, out, cfg, w, gold)
    name, Family = FAMILIES[cfg["model_type"]]
    if cfg["model_type"] == "glm_moe_dsa":
        # transformers breaks index ties by the whole call's top-k; rill's
        # causal rule is tests/data/glm-5-causal's (make_dsa_causal_golden.py).
        gold = json.load(open(os.path.join(os.path.dirname(__file__), "../tests/data/glm-5-causal/golden.json")))
    prompt = gold["prompt_ids"]
    m = Family(cfg, w)
    err = np.abs(m.logits(prompt) - np.array(gold["logits"])).max()
    ids = list(prompt)
    for _ in range(len(gold["greedy_ids"])):
        ids.append(int(np.argmax(m.logits(ids)[-1])))
    greedy = ids[len(prompt):]
    print("numpy %s vs %s: max |logit - golden| = %.3g, greedy ids %s" %
          (name, "tests/data/glm-5-causal" if cfg["model_type"] == "glm_moe_dsa" else "transformers", err,
           greedy == gold["greedy_ids"]))
    assert err < 1e-4 and greedy == gold["greedy_ids"], "the numpy model does not reproduce transformers"

    cfg["num_nextn_predict_layers"] = 1
    rng = np.random.default_rng(21)
    add_mtp_layer(cfg, w, rng)
    if cfg["model_type"] == "glm_moe_dsa":
        add_dsa_indexer(cfg, w, rng)
    m = Family(cfg, w)
    h = m.hidden(prompt)
    next_token = int(np.argmax(h[-1] @ m.w["lm_head.weight"].T))
    mtp = m.mtp_logits(h, prompt[1:] + [next_token]).astype(np.float32)
    mtp_greedy = [int(v) for v in np.argmax(mtp, -1)]
    # How often the head's guess of t_{i+2} is the prompt's (random weights: chance).
    hits = sum(mtp_greedy[i] == prompt[i + 2] for i in range(len(prompt) - 2))
    print("MTP head: %d rows, guesses matching the prompt %d/%d, first draft %d" %
          (len(mtp), hits, len(prompt) - 2, mtp_greedy[-1]))

    chain = m.mtp_chain(h, prompt[1:] + [next_token], 4)
    assert chain[0] == mtp_greedy[-1]
    print("MTP chain after the prompt (k = 4): %s" % chain)

    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    write_f32_safetensors(os.path.join(out, "model.safetensors"), w, {"format": "pt"})
    json.dump({"model_type": cfg["model_type"], "prompt_ids": prompt, "next_token": next_token,
               "mtp_logits": [[round(float(v), 6) for v in row] for row in mtp],
               "mtp_greedy": mtp_greedy, "mtp_chain": chain,
               "note": "tools/make_mtp_golden.py: %s plus one random MTP layer; numpy reference of the %s "
                       "MTP head (k = 1) and its chain" % (os.path.basename(os.path.normpath(src)), name)},
              open(os.path.join(out, "golden.json"), "w"))


if __name__ == "__main__":
    main()
