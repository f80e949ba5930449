#!/usr/bin/env python3
"""A tiny random Gemma 4 target (gemma4_text) and Gemma 4 assistant
(gemma4_assistant, Gemma4AssistantForCausalLM) pair with transformers 5.25.0,
and the assistant's draft logits and the assisted greedy output as goldens.

The assistant (transformers' models/gemma4_assistant and
generation/candidate_generator.py: SinglePositionMultiTokenCandidateGenerator)
drafts from the target's state after a step: its last hidden state h (after
the final norm, hidden_states[-1]) at the last position p it computed, the
token t after it and the KV of the target's last full and last sliding layer
that are not KV-shared (shared_kv_states). Draft step j:
    x    = pre_projection([target_embed(t_j) * sqrt(E_target); h_j])
    o    = 4 Gemma 4 decoder layers over x, every one a KV-shared reader of
           the target's layer of its kind (query at position p + 1, keys
           0..p; a sliding layer's the last window + 1 of them)
    logits_j = the centroid-masked lm_head of final_norm(o)
    t_{j+1} = argmax(logits_j), h_{j+1} = post_projection(final_norm(o))
with t_1 = t, h_1 = h, every step at the same position.

The target here: 6 layers (sliding, sliding, full, sliding, sliding, full),
the last 2 KV-shared (so the assistant reads layers 3 and 2), per-layer
embeddings, wider full-layer heads with proportional RoPE, window 6. The
assistant: hidden 24 (the target's 32), 4 layers (sliding, full, sliding,
full), ordered embeddings with 16 centroids of 16 tokens, top 4.

Writes OUT/target/{config.json, model.safetensors},
OUT/assistant/{config.json, model.safetensors} and OUT/golden.json:
  prompt_ids; next_token (the target's greedy pick after the prompt);
  draft_logits [K][vocab] (f32, the assistant's steps 1..K after the
  prompt's prefill, driven by transformers' own candidate generator);
  draft_tokens (their argmaxes); greedy (the target's greedy continuation,
  plain generate) and assisted (generate with the assistant; equal to it);
  n_assisted_steps: the target forwards the assisted run took.
  .venv-tools/bin/python tools/make_gemma4_assistant_golden.py tests/data/gemma4-assistant
With --medium OUT it writes only a larger random pair in bf16 for
bench/micro/assistant_speculator_bench.cpp (not committed): target hidden
512, 12 layers (window 128, the last 4 KV-shared), vocabulary 32768;
assistant hidden 256, 4 layers, 256 centroids of 128 tokens, top 32 (the
4096 scored tokens of google's E2B assistant: 2048 x 128, top 32).
(tools/tools_venv.sh makes the venv: torch, safetensors, numpy and
transformers==5.25.0, installed with --no-deps beside huggingface_hub,
tokenizers, pyyaml, regex, tqdm, packaging, filelock.)
"""
import json
import os
import sys

import torch
import transformers
from transformers import (Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM,
                          Gemma4TextConfig)
from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

assert transformers.__version__ == "5.25.0", transformers.__version__

K = 4
N_NEW = 24
PROMPT_LEN = 20


def randomize(model, gen):
    """Every parameter random (HF's init leaves norms at one and the logits
    nearly flat): matrices N(0, 0.15^2), norm scales 1 + N(0, 0.1^2)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.8 + 0.4 * torch.rand(b.shape, generator=gen))


def medium(out):
    gen = torch.Generator().manual_seed(22)
    full = lambda n: ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    tcfg = Gemma4TextConfig(
        vocab_size=32768, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
        layer_types=full(12), num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        global_head_dim=128, sliding_window=128, num_kv_shared_layers=4, hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=32768, final_logit_softcapping=30.0, max_position_embeddings=4096,
        pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=True)
    target = Gemma4ForCausalLM(tcfg).eval()
    acfg = Gemma4AssistantConfig(
        text_config=Gemma4TextConfig(
            vocab_size=32768, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
            layer_types=["sliding_attention"] * 3 + ["full_attention"], num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, global_head_dim=128, sliding_window=128,
            num_kv_shared_layers=4, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
            max_position_embeddings=4096, pad_token_id=0, bos_token_id=2, eos_token_id=1),
        backbone_hidden_size=512, use_ordered_embeddings=True, num_centroids=256,
        centroid_intermediate_top_k=32)
    assistant = Gemma4AssistantForCausalLM(acfg).eval()
    for m in (target, assistant):
        randomize(m, gen)
    with torch.no_grad():
        assistant.masked_embedding.token_ordering.copy_(torch.randperm(32768, generator=gen))
    for name, m in (("target", target), ("assistant", assistant)):
        m.to(torch.bfloat16).save_pretrained(os.path.join(out, name), safe_serialization=True)


def main(out):
    gen = torch.Generator().manual_seed(21)
    tcfg = Gemma4TextConfig(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "sliding_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        sliding_window=6, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=256, final_logit_softcapping=30.0, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=2, eos_token_id=1, tie_word_embeddings=True)
    tcfg._attn_implementation = "eager"
    target = Gemma4ForCausalLM(tcfg).eval()
    randomize(target, gen)

    acfg_text = Gemma4TextConfig(
        vocab_size=256, hidden_size=24, intermediate_size=48, num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        sliding_window=6, num_kv_shared_layers=4, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, max_position_embeddings=256, pad_token_id=0,
        bos_token_id=2, eos_token_id=1)
    acfg = Gemma4AssistantConfig(text_config=acfg_text, backbone_hidden_size=32,
                                 use_ordered_embeddings=True, num_centroids=16,
                                 centroid_intermediate_top_k=4)
    acfg._attn_implementation = "eager"
    acfg.text_config._attn_implementation = "eager"
    assistant = Gemma4AssistantForCausalLM(acfg).eval()
    randomize(assistant, gen)
    with torch.no_grad():
        perm = torch.randperm(256, generator=gen)
        assistant.masked_embedding.token_ordering.copy_(perm)
    assistant.generation_config.num_assistant_tokens = K
    assistant.generation_config.num_assistant_tokens_schedule = "constant"

    prompt = torch.randint(3, 256, (1, PROMPT_LEN), generator=gen)

    # Draft logits after the prompt's prefill, through transformers' own
    # candidate generator (its first call after prefill).
    with torch.no_grad():
        tout = target(input_ids=prompt, output_hidden_states=True, return_shared_kv_states=True,
                      use_cache=True)
    next_token = int(tout.logits[0, -1].argmax())
    gcfg = transformers.GenerationConfig(max_length=PROMPT_LEN + 1 + K + 1, do_sample=False)
    cg = SinglePositionMultiTokenCandidateGenerator(
        assistant_model=assistant, target_model_input_embeddings=target.get_input_embeddings(),
        generation_config=gcfg)
    ids = torch.cat([prompt, torch.tensor([[next_token]])], dim=1)
    cand_ids, cand_logits = cg.get_candidates(ids, {"attention_mask": torch.ones_like(ids)}, tout,
                                              is_first_iteration=False, n_last_matches=0)
    draft_tokens = cand_ids[0, ids.shape[1]:].tolist()
    assert len(draft_tokens) == K and cand_logits.shape == (1, K, 256)

    with torch.no_grad():
        plain = target.generate(prompt, max_new_tokens=N_NEW, do_sample=False, min_new_tokens=N_NEW)
        steps = {"n": 0}
        hook = target.register_forward_hook(lambda *a: steps.__setitem__("n", steps["n"] + 1))
        assisted = target.generate(prompt, assistant_model=assistant, max_new_tokens=N_NEW,
                                   do_sample=False, min_new_tokens=N_NEW)
        hook.remove()
    greedy = plain[0, PROMPT_LEN:].tolist()
    assisted_ids = assisted[0, PROMPT_LEN:].tolist()
    assert greedy == assisted_ids, (greedy, assisted_ids)
    assert greedy[0] == next_token

    os.makedirs(out, exist_ok=True)
    target.save_pretrained(os.path.join(out, "target"), safe_serialization=True)
    assistant.save_pretrained(os.path.join(out, "assistant"), safe_serialization=True)
    for d in ("target", "assistant"):
        gc = os.path.join(out, d, "generation_config.json")
        if os.path.exists(gc):
            os.remove(gc)
    golden = {
        "transformers": transformers.__version__,
        "prompt_ids": prompt[0].tolist(),
        "next_token": next_token,
        "draft_tokens": draft_tokens,
        "draft_logits": [[round(float(v), 6) for v in row] for row in cand_logits[0]],
        "greedy": greedy,
        "assisted": assisted_ids,
        "n_assisted_steps": steps["n"],
    }
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f)
    print("next", next_token, "drafts", draft_tokens, "greedy", greedy[:8], "assisted steps", steps["n"])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--medium":
        medium(sys.argv[2])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/gemma4-assistant")
