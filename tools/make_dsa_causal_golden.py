#!/usr/bin/env python3
"""The GLM-5 (glm_moe_dsa) golden under a causal top-k, from a numpy reference.

transformers picks each query's index_topk keys with torch.topk over a row
that spans the whole forward call: in a prefill the row also holds the
masked (later) positions, and torch's CPU topk (std::nth_element over the
row) breaks exact ties by where its pivots fall, so a key's selection among
equal scores depends on how many tokens the call had. The tiny golden in
../shared/goldens/hf/glm-5 has such ties (two indexer heads: a key whose
both ReLU'd scores are 0 scores exactly 0), so transformers itself gives
other logits for the same prompt fed in another split (max 1.26 apart when
fed token by token). rill selects by a total order over the keys [0, pos]
alone (the higher score, equal scores: the later key), the same whatever
the split or a prefix-cache hit.

This script holds its numpy model to transformers first: with transformers'
rule (the masked row, libstdc++'s nth_element as torch's CPU topk runs it)
it must reproduce golden.json's logits (1e-4) and greedy ids. Then it
writes golden.json for rill's rule: OUT/golden.json with the same fields.
  .venv-tools/bin/python tools/make_dsa_causal_golden.py ../shared/goldens/hf/glm-5 tests/data/glm-5-causal
(tools/tools_venv.sh numpy makes the venv.)
"""
import json
import os
import struct
import sys

import numpy as np


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    raw = open(os.path.join(d, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    w = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        assert v["dtype"] == "F32", k
        w[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"]).astype(np.float64)
    return cfg, w


def nth_element_greater(q, k):
    """libstdc++'s std::nth_element(q, q + k - 1, greater-by-value) (introselect), as torch's CPU topk runs it."""
    comp = lambda x, y: x[0] > y[0]
    n, nth, first, last = len(q), k - 1, 0, len(q)
    depth = 2 * (n.bit_length() - 1)
    while last - first > 3:
        assert depth > 0, "heap_select fallback not modelled"
        depth -= 1
        mid = first + (last - first) // 2
        a, b, c = first + 1, mid, last - 1
        if comp(q[a], q[b]):
            s = b if comp(q[b], q[c]) else (c if comp(q[a], q[c]) else a)
        elif comp(q[a], q[c]):
            s = a
        else:
            s = c if comp(q[b], q[c]) else b
        q[first], q[s] = q[s], q[first]
        lo, hi = first + 1, last
        while True:
            while comp(q[lo], q[first]):
                lo += 1
            hi -= 1
            while comp(q[first], q[hi]):
                hi -= 1
            if not lo < hi:
                break
            q[lo], q[hi] = q[hi], q[lo]
            lo += 1
        if lo <= nth:
            first = lo
        else:
            last = lo
    for i in range(first + 1, last):  # insertion sort
        v = q[i]
        if comp(v, q[first]):
            q[first + 1:i + 1] = q[first:i]
            q[first] = v
        else:
            j = i
            while comp(v, q[j - 1]):
                q[j] = q[j - 1]
                j -= 1
            q[j] = v
    return q


class Model:
    def __init__(self, cfg, w):
        self.c, self.w = cfg, w
        self.rope_dim = cfg["qk_rope_head_dim"]
        theta = cfg["rope_parameters"]["rope_theta"]
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
        c, W = self.c, self.w
        assert c["n_group"] == 1 and c["topk_group"] == 1
        sc = 1 / (1 + np.exp(-(x @ W[p + "gate.weight"].T)))
        choice = sc + W[p + "gate.e_score_correction_bias"]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            idx = np.argsort(-choice[t], kind="stable")[:c["num_experts_per_tok"]]
            wt = sc[t, idx] / (sc[t, idx].sum() + 1e-20) * c["routed_scaling_factor"]
            for e, we in zip(idx, wt):
                out[t] += we * self.mlp(x[t:t + 1], p + "experts.%d." % e)[0]
        return out + self.mlp(x, p + "shared_experts.")

    def select(self, scores, t, tail):
        """The keys token t attends to: tail None: rill's rule; else transformers' with `tail` masked entries."""
        k = self.c["index_topk"]
        if tail is None:
            order = sorted(range(t + 1), key=lambda j: (-scores[j], -j))
            return order[:k]
        row = [(scores[j] if j <= t else -np.inf, j) for j in range(t + 1 + tail)]
        kk = min(k, len(row))
        return [j for _, j in nth_element_greater(row, kk)[:kk] if j <= t]

    def forward(self, ids, tails):
        c, W = self.c, self.w
        S, H, R = len(ids), c["num_attention_heads"], self.rope_dim
        L, nope, vd = c["kv_lora_rank"], c["qk_nope_head_dim"], c["v_head_dim"]
        IH, ID = c["index_n_heads"], c["index_head_dim"]
        pos = np.arange(S)
        x = W["model.embed_tokens.weight"][ids]
        sel = None
        for il in range(c["num_hidden_layers"]):
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
            if c["indexer_types"][il] == "full":
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
                    sel[t, self.select(scores[t], t, tails[t] if tails else None)] = True
            att = np.einsum("hsd,htd->hst", q, k) * (nope + R) ** -0.5
            att = np.where(sel[None], att, -np.inf)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = np.einsum("hst,htd->shd", att, kvb[..., nope:]).reshape(S, H * vd)
            x = x + o @ W[a + "o_proj.weight"].T
            h2 = self.rms(x, W[p + "post_attention_layernorm.weight"])
            dense = c["mlp_layer_types"][il] == "dense"
            x = x + (self.mlp(h2, p + "mlp.") if dense else self.moe(h2, p + "mlp."))
        x = self.rms(x, W["model.norm.weight"])
        return (x @ W["lm_head.weight"].T).astype(np.float32)

    def greedy(self, prompt, n, tails_for):
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(np.argmax(self.forward(ids, tails_for(len(ids)))[-1])))
        return ids[len(prompt):]


def main():
    src, out = sys.argv[1], sys.argv[2]
    cfg, w = load(src)
    gold = json.load(open(os.path.join(src, "golden.json")))
    m = Model(cfg, w)
    prompt = gold["prompt_ids"]
    S = len(prompt)
    # transformers: the prompt in one call (tails to its end), then one token a call.
    hf_tails = lambda n: [S - 1 - t if t < S else 0 for t in range(n)]
    err = np.abs(m.forward(prompt, hf_tails(S)) - np.array(gold["logits"])).max()
    hf_greedy = m.greedy(prompt, len(gold["greedy_ids"]), hf_tails)
    print("transformers' rule: max |logit - golden| = %.3g, greedy ids %s" % (err, hf_greedy == gold["greedy_ids"]))
    assert err < 1e-4 and hf_greedy == gold["greedy_ids"], "the numpy model does not reproduce transformers"
    logits = m.forward(prompt, None)
    greedy = m.greedy(prompt, len(gold["greedy_ids"]), lambda n: None)
    diff = np.abs(logits - np.array(gold["logits"])).max(-1)
    print("causal rule: first prompt position off the golden:", int(np.argmax(diff > 1e-4)), "greedy", greedy)
    os.makedirs(out, exist_ok=True)
    json.dump({"model_type": gold["model_type"], "prompt_ids": prompt,
               "logits": [[round(float(v), 6) for v in row] for row in logits],
               "greedy_ids": greedy,
               "note": "numpy reference held to ../shared/goldens/hf/glm-5 (tools/make_dsa_causal_golden.py); "
                       "index top-k over keys [0, pos], ties to the later key"},
              open(os.path.join(out, "golden.json"), "w"))


if __name__ == "__main__":
    main()
