#!/usr/bin/env python3
"""GGUF files and llama.cpp goldens for the model families of issue 20.

Converts the tiny Hugging Face goldens (../shared/goldens/hf/<golden>) into
GGUF files laid out exactly as llama.cpp's converter (convert_hf_to_gguf.py
of the llama-cpp-python 0.3.36 source package, conversion/*.py) writes
them, runs llama.cpp on each over the golden prompt (tools/llamacpp_logits,
compiled here against the llama.cpp that bench/build_llamacpp_tools.sh
builds from the same source package), compares llama.cpp with transformers,
and writes

    tests/data/gguf_families/<name>.gguf   the converted model (f32)
    tests/data/gguf_families/<name>.json   llama.cpp's logits at every prompt
                                           position and its greedy ids

The converter needs torch, transformers and a tokenizer, none of which the
tiny goldens have, so its tensor transforms are re-done with numpy here;
names go through the converter's own map (gguf-py's get_tensor_name_map
from the same source package) and metadata follows each model class's
set_gguf_parameters:
  * deepseek2 (DeepseekV2Model, DeepSeek-V3): kv_b_proj split per head into
    attn_k_b [n_head, kv_lora, nope] (transposed) and attn_v_b [n_head, v,
    kv_lora]; head_count_kv 1; key/value_length the latent's, *_mla the
    heads'; experts stacked; e_score_correction_bias -> exp_probs_b.bias.
    DeepSeek-V3's own config.json says scoring_func "sigmoid", which the
    converter writes as expert_gating_func; the golden's config (transformers
    5 drops the field) does not, so it is written here as the converter
    writes it for the real checkpoint (without it llama.cpp routes with a
    softmax, DeepSeek-V2's).
  * minicpm3 (MiniCPM3Model): tensors as they are (attn_kv_b unsplit);
    llama.cpp's graph hard-codes MiniCPM3-4B's scale_emb 12, scale_depth 1.4
    and dim_model_base 256 (no GGUF keys); the golden's dim_model_base is 32,
    so llama.cpp's logits are transformers' times 256 / 32 = 8 (checked
    here; the argmax is the same).
  * glm4moe (Glm4MoeModel, --no-mtp: the goldens hold no MTP layer):
    experts stacked, rope.dimension_count head_dim * partial_rotary_factor,
    gating func sigmoid, expert_weights_scale/norm.
  * gpt-oss (GptOssModel, the f32 golden: not MXFP4): gate_up_proj
    transposed and split into gate (even rows) and up (odd), down_proj
    transposed, the biases split alike; sinks -> attn_sinks.weight.
    llama.cpp's YaRN rounds the correction range where transformers'
    gpt-oss (truncate false) does not, so llama.cpp differs from
    transformers here (reported, not checked). gpt_oss_mxfp4 is the same
    file with the expert matrices in MXFP4, as gpt-oss's GGUF files ship
    them (quantized by gguf-py's MXFP4.quantize_blocks; file type
    MOSTLY_MXFP4_MOE).
  * gemma4 (Gemma4Model, norm_shift 0): layer_scalar -> layer_output_scale,
    router.scale -> ffn_gate_inp.scale, per_expert_scale ->
    ffn_down_exps.scale, experts.* + ".weight"; rope_freqs [full head / 2]:
    1 on the rotated pairs, 1e30 on the rest (proportional RoPE); freq_base
    the full layers', freq_base_swa the sliding ones'; key_length (full) and
    key_length_swa; head_count_kv per layer when the full layers have their
    own. llama.cpp's CPU GELU goes through a table of f16 values, so its
    Gemma 4 logits are ~2e-3 from transformers' (checked within 5e-3).
    llama.cpp cannot run the gemma4 golden: its KV sharing takes layers
    n_layer_kv_from_start - 2 (sliding) and - 1 (full) as the donors, and
    the golden's last unshared layers are full then sliding (GGML_ASSERT in
    llama-kv-cache.cpp); its file is written, without a llama.cpp golden.
  * glm-dsa (GlmMoeDsaModel: DeepseekV2Model's MLA and MoE layout, --no-mtp):
    rope.dimension_count qk_rope_head_dim * partial_rotary_factor,
    attention.indexer.{head_count, key_length, top_k} from index_n_heads,
    index_head_dim, index_topk, attention.indexer.types (true: "full") from
    indexer_types; indexer.{wq_b, wk, k_norm, weights_proj} ->
    blk.N.indexer.{attn_q_b, attn_k, k_norm, proj}; no expert_gating_func
    (the golden's config has no scoring_func; llama.cpp's glm-dsa then uses
    a sigmoid). llama.cpp's graph does apply the index top-k (it unmasks the
    selected keys of the KQ mask), but it multiplies indexer queries and keys
    by Hadamard matrices of 64 x 64 and up, so it aborts on the golden's
    16-wide indexer (glm_dsa has no llama.cpp golden); glm_dsa_ix64 is the
    same model with an indexer 64 wide that selects the same keys
    (widen_indexer). Index scores tie exactly (0) on this golden, and
    llama.cpp, transformers and rill break ties differently, so llama.cpp
    is compared over the prompt positions before the first tie at a top-k
    cut only (dsa_tie_free_positions; 11 of 24), written to the JSON as
    determined_positions (counted over the prompt and the greedy ids).
    glm_dsa_h8 also gives the indexer 8 heads (add_indexer_heads): no ties
    on the prompt or the greedy continuation, so llama.cpp is compared at
    every position and on its greedy ids, against the numpy model of
    tools/make_dsa_causal_golden.py (no transformers golden: another model).
  * minicpm (MiniCPMModel: MiniCPM 1/2/4, dense, from the tiny checkpoints of
    tools/make_minicpm_golden.py in tests/data/minicpm and minicpm-tied,
    whose reference is that tool's float64 numpy model: transformers has no
    MiniCPM class): TextModel's keys plus embedding_scale (scale_emb),
    residual_scale (scale_depth / sqrt(n_layers)) and logit_scale
    (hidden_size / dim_model_base); q_proj / k_proj permuted as
    LlamaModel.permute does (llama.cpp's minicpm RoPE pairs (2i, 2i+1));
    tied embeddings: no output.weight. minicpm_longrope (MiniCPM 4's
    LongRoPE): rope.scaling.type longrope and the factors as the tensors
    rope_factors_long / rope_factors_short (generate_extra_tensors, written
    before the model's); llama.cpp rotates by the short ones while the
    context is within context_length.
<name>_f16 files are --outtype f16 (F16 matrices; 1-D tensors, norms and
routers F32, as ModelBase.prepare_tensors picks).
The tokenizer is a synthetic 512-token SentencePiece ("llama") vocabulary:
the goldens are token ids, and llama.cpp needs some vocabulary to load.

    tools/make_family_gguf.py [--threads 2] [--only deepseek2,...]

Installs numpy, safetensors and pyyaml into .venv-tools itself (re-executing
under that interpreter) when they are not importable.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402
SHARED = os.environ.get("RILL_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
if not os.path.isdir(SHARED):
    SHARED = "/work/shared"
OUT_DIR = os.path.join(ROOT, "tests", "data", "gguf_families")
VERSION = "0.3.36"

# (output name, golden dir, GGUF architecture)
MODELS = [("deepseek2", "deepseek-v3", "deepseek2"), ("minicpm3", "minicpm3", "minicpm3"),
          ("glm4moe", "glm4-moe", "glm4moe"), ("gpt_oss", "gpt-oss", "gpt-oss"),
          ("gpt_oss_mxfp4", "gpt-oss", "gpt-oss"), ("gemma4", "gemma4", "gemma4"),
          ("gemma4_moe", "gemma4-moe", "gemma4"), ("deepseek2_f16", "deepseek-v3", "deepseek2"),
          ("glm4moe_f16", "glm4-moe", "glm4moe"), ("glm_dsa", "glm-5", "glm-dsa"),
          ("glm_dsa_ix64", "glm-5", "glm-dsa"), ("glm_dsa_h8", "glm-5", "glm-dsa"),
          ("minicpm", "tests/data/minicpm", "minicpm"), ("minicpm_tied", "tests/data/minicpm-tied", "minicpm"),
          ("minicpm_longrope", "tests/data/minicpm-longrope", "minicpm")]


def golden_path(golden):
    """A golden under ../shared/goldens/hf, or (tests/...) one of this repository's."""
    return os.path.join(ROOT, golden) if golden.startswith("tests/") else os.path.join(SHARED, "goldens", "hf", golden)


def permute_rope_rows(a, n_head, n_head_kv):
    """LlamaModel.permute: each head's rows from rotate_half order to the
    pairs (2i, 2i+1) llama.cpp's NORM RoPE rotates."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


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


def text_model_params(w, cfg, gguf, n_head_kv=None):
    """TextModel.set_gguf_parameters for the keys these goldens have."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}  # v5, or v4 (the MiniCPM goldens)
    rope = rope.get("full_attention", rope)  # Gemma 4: per layer type; the full layers' here
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(n_head_kv or cfg["num_key_value_heads"])
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        if "beta_fast" in rope:
            w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        if "beta_slow" in rope:
            w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    elif rope.get("rope_type") == "longrope":
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    n_exp = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if n_exp:
        w.add_expert_count(n_exp)
    n_used = cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or cfg.get("top_k_experts")
    if n_used:
        w.add_expert_used_count(n_used)
    if cfg.get("n_group") is not None:
        w.add_expert_group_count(cfg["n_group"])
    if cfg.get("topk_group") is not None:
        w.add_expert_group_used_count(cfg["topk_group"])
    if cfg.get("head_dim") is not None:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


MXFP4_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def hf_tensors(cfg, t, arch, np):
    """The (Hugging Face name, array) pairs each converter class hands to
    the name map, after its modify_tensors transforms."""
    n_layer = cfg["num_hidden_layers"]
    out = []
    stacked = set()
    for name in t:
        a = t[name]
        if name.endswith("e_score_correction_bias"):  # ModelBase.filter_tensors
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        if name.startswith("model.layers."):
            bid = int(name.split(".")[2])
            if bid >= n_layer:
                continue  # MTP layers (skip_mtp / --no-mtp)
        if arch in ("deepseek2", "glm4moe", "glm-dsa") and ".mlp.experts." in name:
            prefix = name[:name.index(".mlp.experts.")]
            if prefix in stacked:
                continue
            stacked.add(prefix)
            for proj in ("down_proj", "gate_proj", "up_proj"):
                out.append((f"{prefix}.mlp.experts.{proj}.weight",
                            np.stack([t[f"{prefix}.mlp.experts.{e}.{proj}.weight"]
                                      for e in range(cfg["n_routed_experts"])])))
            continue
        if arch in ("deepseek2", "glm-dsa") and name.endswith("kv_b_proj.weight"):
            H, v, nope = cfg["num_key_value_heads"], cfg["v_head_dim"], cfg["qk_nope_head_dim"]
            kv_b = a.reshape(H, nope + v, a.shape[-1])
            out.append((name.replace("kv_b_proj", "k_b_proj"), kv_b[:, :nope].transpose(0, 2, 1)))
            out.append((name.replace("kv_b_proj", "v_b_proj"), kv_b[:, nope:]))
            continue
        if arch == "gpt-oss":
            if "sinks" in name:
                name += ".weight"
            if name.endswith("down_proj_bias"):
                name = name.replace("down_proj_bias", "down_proj.bias")
            elif name.endswith("mlp.experts.down_proj"):
                name, a = name + ".weight", a.transpose(0, 2, 1)
            elif name.endswith("gate_up_proj_bias"):
                out.append((name.replace("gate_up_proj_bias", "gate_proj.bias"), a[..., ::2]))
                out.append((name.replace("gate_up_proj_bias", "up_proj.bias"), a[..., 1::2]))
                continue
            elif name.endswith("gate_up_proj"):
                a = a.transpose(0, 2, 1)
                out.append((name.replace("gate_up_proj", "gate_proj.weight"), a[:, ::2, :]))
                out.append((name.replace("gate_up_proj", "up_proj.weight"), a[:, 1::2, :]))
                continue
        if arch == "minicpm":  # MiniCPMModel.modify_tensors
            H = cfg["num_attention_heads"]
            if name.endswith("q_proj.weight"):
                a = permute_rope_rows(a, H, H)
            elif name.endswith("k_proj.weight"):
                a = permute_rope_rows(a, H, cfg.get("num_key_value_heads"))
        if arch == "gemma4":  # Gemma4Model.filter_tensors / modify_tensors (norm_shift 0)
            if name.endswith(("per_dim_scale", "layer_scalar")):
                name += ".weight"
            if ".experts." in name and not name.endswith(".weight"):
                name += ".weight"
            if name.endswith("router.scale"):
                out.append((f"blk.{name.split('.')[2]}.ffn_gate_inp.scale", a))
                continue
            if name.endswith(".per_expert_scale"):
                out.append((f"blk.{name.split('.')[2]}.ffn_down_exps.scale", a))
                continue
        out.append((name, a))
    return out


def widen_indexer(cfg, t, width, np):
    """GLM-5's lightning indexer with head size `width` (a multiple of the
    golden's D) computing the same selection: wk, k_norm's weight and bias
    tiled width / D times (so k's LayerNorm sees the same mean and variance
    and k is [k | k | ...]), each wq_b head padded with zero rows (q is [q |
    0 | ...]). q . k is unchanged, RoPE still turns the first
    qk_rope_head_dim dims of both, and the indexer's score scale
    (width * n_heads)^-1/2 only scales every score alike, which leaves the
    top-k selection as it was. llama.cpp's glm-dsa multiplies indexer
    queries and keys by a Hadamard matrix of at least 64 x 64, so it runs
    only indexers whose head size is a multiple of 64."""
    D, H = cfg["index_head_dim"], cfg["index_n_heads"]
    assert width % D == 0
    cfg["index_head_dim"] = width
    for name in list(t):
        if ".self_attn.indexer." not in name:
            continue
        a = t[name]
        if name.endswith(("indexer.wk.weight", "indexer.k_norm.weight", "indexer.k_norm.bias")):
            t[name] = np.concatenate([a] * (width // D), axis=0)
        elif name.endswith("indexer.wq_b.weight"):
            q = np.zeros((H, width, a.shape[1]), dtype=a.dtype)
            q[:, :D] = a.reshape(H, D, a.shape[1])
            t[name] = q.reshape(H * width, a.shape[1])


def add_indexer_heads(cfg, t, n_heads, np):
    """GLM-5's lightning indexer with n_heads heads: the golden's, then new
    ones (wq_b and weights_proj rows drawn at the scale of the golden's,
    seed 20). A key scores exactly 0 only where every head's ReLU is 0, so
    with 8 heads the index top-k meets no ties on the golden's prompt and
    its greedy continuation (checked: dsa_tie_free_positions), and every
    implementation must select the same keys at every position: a model for
    holding rill to llama.cpp beyond the golden's first tie. It is not the
    golden's model (no transformers reference); the numpy reference of
    tools/make_dsa_causal_golden.py checks llama.cpp on it."""
    D, H = cfg["index_head_dim"], cfg["index_n_heads"]
    rng = np.random.default_rng(20)
    cfg["index_n_heads"] = n_heads
    for name in sorted(t):
        a = t[name]
        if name.endswith("indexer.wq_b.weight"):
            new = rng.standard_normal(((n_heads - H) * D, a.shape[1])) * a.std()
            t[name] = np.concatenate([a, new.astype(a.dtype)], axis=0)
        elif name.endswith("indexer.weights_proj.weight"):
            new = rng.standard_normal((n_heads - H, a.shape[1])) * a.std()
            t[name] = np.concatenate([a, new.astype(a.dtype)], axis=0)


def gemma4_params(w, cfg, gguf):
    """Gemma3Model then Gemma4Model.set_gguf_parameters; returns the
    rope_freqs tensor of generate_extra_tensors (the full layers'
    proportional RoPE: factor 1 on the rotated pairs, 1e30 on the rest)."""
    import numpy as np
    rope = cfg["rope_parameters"]
    text_model_params(w, cfg, gguf)
    w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if cfg.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    w.add_sliding_window(cfg["sliding_window"])
    w.add_shared_kv_layers(cfg["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(cfg.get("hidden_size_per_layer_input") or 0)
    swa = [t == "sliding_attention" for t in cfg["layer_types"]]
    w.add_sliding_window_pattern(swa)
    plc = cfg.get("per_layer_config") or {}
    hd_full = cfg.get("global_head_dim")
    kv_full = cfg.get("num_global_key_value_heads")
    for idx, lc in plc.items():
        if cfg["layer_types"][int(idx)] == "full_attention":
            hd_full = hd_full or lc.get("head_dim")
            kv_full = kv_full or lc.get("num_key_value_heads")
    w.add_key_length(hd_full)
    w.add_value_length(hd_full)
    w.add_key_length_swa(cfg["head_dim"])
    w.add_value_length_swa(cfg["head_dim"])
    if cfg.get("moe_intermediate_size") is not None:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if kv_full is not None:
        w.add_head_count_kv([cfg["num_key_value_heads"] if s else kv_full for s in swa])
    w.add_rope_dimension_count(hd_full)
    w.add_rope_dimension_count_swa(int(cfg["head_dim"] * rope["sliding_attention"].get("partial_rotary_factor", 1.0)))
    n_rot = int(hd_full * rope["full_attention"]["partial_rotary_factor"] / 2)
    return np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32)


def f16_type(new_name, a, gguf):
    """ModelBase.prepare_tensors' type for --outtype f16: F32 for 1-D tensors,
    norms, routers and non-.weight tensors, F16 for the rest."""
    keep = (new_name.endswith("_norm.weight") or ".ffn_gate_inp." in new_name or
            ".ffn_gate_inp_shexp." in new_name or not new_name.endswith(".weight"))
    return gguf.GGMLQuantizationType.F32 if a.ndim <= 1 or keep else gguf.GGMLQuantizationType.F16


def load_golden(golden_dir, name, np):
    """The golden's config and f32 tensors, as the output `name` changes
    them: *_ix64 widens GLM-5's indexer to 64, *_h8 also gives it 8 heads."""
    from safetensors.numpy import load_file

    with open(os.path.join(golden_dir, "config.json")) as f:
        cfg = json.load(f)
    t = load_file(os.path.join(golden_dir, "model.safetensors"))
    if name.endswith("_h8"):
        add_indexer_heads(cfg, t, 8, np)
    if name.endswith(("_ix64", "_h8")):
        widen_indexer(cfg, t, 64, np)
    return cfg, t


def convert(golden_dir, cfg, t, arch, out_path, gguf, mxfp4_experts=False, f16=False, raw_experts=None):
    """raw_experts: {GGUF name: MXFP4 bytes} written as they are in place of
    quantizing those tensors (tools/make_mxfp4_checkpoint.py: the blocks the
    converter repacks from an MXFP4 Hugging Face checkpoint)."""
    import numpy as np

    rope = cfg.get("rope_parameters") or {}
    w = gguf.GGUFWriter(out_path, arch)
    w.add_name(os.path.basename(golden_dir))
    if arch in ("deepseek2", "glm-dsa"):  # DeepseekV2Model.set_gguf_parameters
        text_model_params(w, cfg, gguf, n_head_kv=1)
        kv_lora = cfg["kv_lora_rank"]
        w.add_leading_dense_block_count(cfg.get("first_k_dense_replace", 0))
        w.add_vocab_size(cfg["vocab_size"])
        if cfg.get("q_lora_rank") is not None:
            w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(kv_lora)
        w.add_key_length(kv_lora + cfg["qk_rope_head_dim"])
        w.add_value_length(kv_lora)
        w.add_key_length_mla(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
        w.add_value_length_mla(cfg["v_head_dim"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg.get("n_shared_experts", 0))
        if cfg.get("routed_scaling_factor") is not None:
            w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        if cfg.get("norm_topk_prob"):
            w.add_expert_weights_norm(True)
        w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
        if arch == "deepseek2":
            # TextModel's scoring_func -> expert_gating_func (DeepSeek-V3's config says sigmoid).
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        else:  # GlmMoeDsaModel.set_gguf_parameters (--no-mtp: the golden has no MTP layer)
            w.add_rope_dimension_count(int(cfg["qk_rope_head_dim"] * rope.get("partial_rotary_factor", 1.0)))
            w.add_indexer_head_count(cfg["index_n_heads"])
            w.add_indexer_key_length(cfg["index_head_dim"])
            w.add_indexer_top_k(cfg["index_topk"])
            if cfg.get("indexer_types") is not None:
                w.add_indexer_types([t == "full" for t in cfg["indexer_types"]])
    elif arch == "minicpm3":  # MiniCPM3Model.set_gguf_parameters (not TextModel's)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        w.add_vocab_size(cfg["vocab_size"])
        if cfg.get("q_lora_rank") is not None:
            w.add_q_lora_rank(cfg["q_lora_rank"])
        w.add_kv_lora_rank(cfg["kv_lora_rank"])
        w.add_key_length(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
        w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
    elif arch == "glm4moe":  # Glm4MoeModel.set_gguf_parameters, --no-mtp
        text_model_params(w, cfg, gguf)
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.5)))
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(cfg["routed_scaling_factor"])
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
    elif arch == "gpt-oss":  # GptOssModel.set_gguf_parameters
        text_model_params(w, cfg, gguf)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_expert_feed_forward_length(cfg["intermediate_size"])
        if mxfp4_experts:
            w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    elif arch == "gemma4":
        w.add_tensor("rope_freqs.weight", gemma4_params(w, cfg, gguf))
    elif arch == "minicpm":  # MiniCPMModel.set_gguf_parameters: TextModel's, then the muP scales
        text_model_params(w, cfg, gguf)
        w.add_embedding_scale(float(cfg["scale_emb"]))
        w.add_residual_scale(cfg["scale_depth"] / cfg["num_hidden_layers"] ** 0.5)
        w.add_logit_scale(cfg["hidden_size"] / cfg["dim_model_base"])
        longrope = cfg.get("rope_scaling") or {}
        if longrope.get("long_factor") or longrope.get("short_factor"):  # MiniCPMModel.generate_extra_tensors
            w.add_tensor("rope_factors_long.weight", np.array(longrope["long_factor"], dtype=np.float32))
            w.add_tensor("rope_factors_short.weight", np.array(longrope["short_factor"], dtype=np.float32))
    if f16:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_vocab(w, cfg["vocab_size"], cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2))

    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, cfg["num_hidden_layers"])
    for name, a in hf_tensors(cfg, t, arch, np):
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings", False):
            continue
        new_name = name if name.startswith("blk.") else name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"cannot map {name!r}")
        a = np.ascontiguousarray(a, dtype=np.float32)
        if raw_experts is not None and new_name in raw_experts:
            w.add_tensor(new_name, raw_experts[new_name], raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        elif mxfp4_experts and new_name.endswith(MXFP4_EXPERTS):
            q = gguf.GGMLQuantizationType.MXFP4
            w.add_tensor(new_name, gguf.quants.quantize(a, q), raw_dtype=q)
        elif f16 and f16_type(new_name, a, gguf) == gguf.GGMLQuantizationType.F16:
            w.add_tensor(new_name, a.astype(np.float16))
        else:
            w.add_tensor(new_name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def dsa_tie_free_positions(cfg, t, ids, np):
    """GLM-5: the number of leading positions of `ids` whose logits do not
    depend on how index top-k breaks ties, and the numpy reference's logits
    at every position (float64, rill's causal rule). Index scores tie
    exactly where every indexer head's ReLU is 0 (two heads in the golden),
    and llama.cpp (std::partial_sort over its whole KV row), transformers
    (torch.topk over the masked row) and rill (the later key) each break
    ties their own way; position t's logits read only tokens 0..t, so they
    agree up to the first token whose selection in any indexer layer has
    (near-)equal scores on both sides of the top-k cut. The model is
    tools/make_dsa_causal_golden.py's."""
    import make_dsa_causal_golden as ref

    w = {k: v.astype(np.float64) for k, v in t.items()}
    k = cfg["index_topk"]
    first_tie = [len(ids)]

    class Probe(ref.Model):
        def select(self, scores, t, tail):
            s = np.sort(np.asarray(scores[:t + 1], dtype=np.float64))[::-1]
            if len(s) > k and s[k - 1] - s[k] <= 1e-6 * max(abs(s[0]), 1e-30):
                first_tie[0] = min(first_tie[0], t)
            return super().select(scores, t, tail)

    causal = Probe(cfg, w).forward(ids, None)
    return first_tie[0], causal


def build_llamacpp_logits():
    """Builds llama.cpp (bench/build_llamacpp_tools.sh) and links
    tools/llamacpp_logits against it; returns (the tool, the llama.cpp source)."""
    bindir = subprocess.run([os.path.join(ROOT, "bench", "build_llamacpp_tools.sh")], check=True,
                            env={**os.environ, "TARGETS": "llama ggml"}, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    build = os.path.dirname(os.path.join(ROOT, bindir))  # build/llamacpp/build
    top = os.path.dirname(build)
    src = os.path.join(top, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")
    exe = os.path.join(top, "llamacpp_logits")
    libs = [os.path.join(build, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                              "ggml/src/libggml-base.a")]
    subprocess.run(["g++", "-O2", "-std=c++17", "-I", os.path.join(src, "include"), "-I",
                    os.path.join(src, "ggml", "include"),
                    os.path.join(ROOT, "tools", "llamacpp_logits", "llamacpp_logits.cpp"), *libs, "-fopenmp",
                    "-lpthread", "-lm", "-ldl", "-o", exe], check=True)
    return exe, src


def main():
    tools_venv.ensure(["numpy", "safetensors", "yaml"], ["numpy", "safetensors", "pyyaml"])
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated output names")
    args = ap.parse_args()
    exe, src = build_llamacpp_logits()
    sys.path.insert(0, os.path.join(src, "gguf-py"))  # the converter's gguf package
    import gguf

    os.makedirs(OUT_DIR, exist_ok=True)
    failed = False
    for name, golden, arch in MODELS:
        if args.only and name not in args.only.split(","):
            continue
        gdir = golden_path(golden)
        with open(os.path.join(gdir, "golden.json")) as f:
            g = json.load(f)
        path = os.path.join(OUT_DIR, name + ".gguf")
        cfg, t = load_golden(gdir, name, np)
        convert(gdir, cfg, t, arch, path, gguf, mxfp4_experts=name.endswith("_mxfp4"), f16=name.endswith("_f16"))
        prompt, ref_ids = g["prompt_ids"], g["greedy_ids"]
        run = subprocess.run([exe, path, str(len(ref_ids)), str(args.threads), ",".join(map(str, prompt))],
                             capture_output=True, text=True)
        if run.returncode != 0:
            # gemma4: llama.cpp's KV sharing reuses layers n_layer_kv_from_start - 2 (sliding)
            # and - 1 (full); the golden's last unshared layers are full then sliding.
            print(f"{name}: llama.cpp cannot run {name}.gguf: "
                  f"{[l for l in run.stderr.splitlines() if 'GGML_ASSERT' in l or 'error' in l][:1]}",
                  file=sys.stderr)
            json_path = os.path.join(OUT_DIR, name + ".json")
            if os.path.exists(json_path):
                os.remove(json_path)
            continue
        res = json.loads(run.stdout)
        logits = np.array(res["logits"], dtype=np.float64)
        greedy = res["greedy_ids"]
        ref = np.array(g["logits"], dtype=np.float64)
        # Positions of prompt + greedy ids whose logits every implementation must agree on.
        determined = len(prompt) + len(greedy)
        numpy_err = None
        if arch == "glm-dsa":
            determined, causal = dsa_tie_free_positions(cfg, t, prompt + greedy, np)
            n = min(determined, len(prompt))
            numpy_err = float(np.max(np.abs(logits[:n] - causal[:n])))
            # llama.cpp's greedy ids are the argmax of the reference's rows where no tie intervened.
            numpy_ids = [int(np.argmax(r)) for r in causal[len(prompt) - 1:-1]]
            whole = determined == len(prompt) + len(greedy)
            print(f"{name}: index top-k tie-free positions {determined} of {len(prompt)} + {len(greedy)}; "
                  f"llama.cpp vs the numpy reference over prompt positions [0, {n}): max |logit diff| "
                  f"{numpy_err:.2e}, greedy ids {'identical' if numpy_ids == greedy else 'DIFFER'}"
                  f"{'' if whole else ' (not comparable: past a tie)'}", file=sys.stderr)
            if numpy_err > 1e-3 or (whole and numpy_ids != greedy):
                failed = True
            logits_cmp, ref = logits[:n], ref[:n]
            same_ids = True  # the golden's own ids come from transformers' tie rule
            if name.endswith("_h8"):  # not the golden's model: the numpy reference is the reference
                ref = causal[:n]
        # MiniCPM3: llama.cpp's hard-coded dim_model_base (256) against the golden's.
        scale = 1.0
        if arch == "minicpm3":
            with open(os.path.join(gdir, "config.json")) as f:
                scale = 256.0 / json.load(f)["dim_model_base"]
        if arch != "glm-dsa":
            logits_cmp, same_ids = logits, greedy == ref_ids
        max_err = float(np.max(np.abs(logits_cmp / scale - ref)))
        print(f"{name}: {arch}, {os.path.getsize(path)} bytes; llama.cpp vs "
              f"{'the numpy reference' if name.endswith('_h8') or arch == 'minicpm' else 'transformers'}"
              f"{f' (llama.cpp / {scale:g})' if scale != 1 else ''}: max |logit diff| {max_err:.2e} over "
              f"{logits_cmp.shape[0]} positions, greedy ids "
              f"{'as above' if arch == 'glm-dsa' else 'identical' if same_ids else 'DIFFER'}", file=sys.stderr)
        # ggml's CPU GELU reads a table of f16 values at f16(x): Gemma 4's MLPs drift ~1e-3.
        # --outtype f16 files: the weights rounded to f16.
        bound = 5e-3 if arch == "gemma4" else 1e-2 if name.endswith("_f16") else 1e-3
        if arch != "gpt-oss" and (max_err > bound or not same_ids):
            failed = True
        out = {
            "what": f"llama.cpp on {name}.gguf (GGUF architecture {arch}, converted from "
                    f"{golden if golden.startswith('tests/') else 'goldens/hf/' + golden} "
                    "by tools/make_family_gguf.py): logits at every prompt position (f32 KV cache, one "
                    "batch) and greedy ids (argmax, one token per decode)" +
                    (f"; positions [0, determined_positions) of the prompt followed by the greedy ids are "
                     "free of index top-k ties (GLM-5's sparse attention: llama.cpp, transformers and rill "
                     "break exact ties differently): only their logits, and the greedy ids when all are, "
                     "are comparable" + (". The golden's indexer widened to 8 heads (add_indexer_heads): "
                                         "max_abs_diff_vs_transformers is against the numpy reference"
                                         if name.endswith("_h8") else "") + "."
                     if arch == "glm-dsa" else
                     "; max_abs_diff_vs_transformers is against tools/make_minicpm_golden.py's float64 numpy "
                     "model (transformers has no MiniCPM class)." if arch == "minicpm" else "."),
            "architecture": arch,
            "llama_cpp_python_version": VERSION,
            "logit_scale_vs_transformers": scale,
            "max_abs_diff_vs_transformers": max_err,
            "greedy_matches_transformers": greedy == ref_ids,
            **({"determined_positions": determined, "max_abs_diff_vs_numpy_reference": numpy_err}
               if arch == "glm-dsa" else {}),
            "prompt_ids": prompt,
            "greedy_ids": greedy,
            "logits": [[round(float(x), 6) for x in row] for row in logits],
        }
        with open(os.path.join(OUT_DIR, name + ".json"), "w") as f:
            head = {k: v for k, v in out.items() if k != "logits"}
            f.write(json.dumps(head, indent=1)[:-2] + ',\n "logits": [\n' +
                    ",\n".join(json.dumps(r, separators=(",", ":")) for r in out["logits"]) + "\n]}\n")
    if failed:
        sys.exit("llama.cpp does not reproduce transformers on a converted file")


if __name__ == "__main__":
    main()
