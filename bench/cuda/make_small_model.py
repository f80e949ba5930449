#!/usr/bin/env python3
"""A small Llama with the Llama-3 vocabulary (128,256 tokens) and random bf16
weights, for measuring what sampling costs next to a short decode step
(Llama-3.2-1B shapes: 16 layers, hidden 2048; 2.5 GB). Needs torch +
transformers (the GPU machine has both):
  python3 make_small_model.py OUT_DIR TOKENIZER_DIR
TOKENIZER_DIR holds tokenizer.json.gz and tokenizer_config.json
(../shared/tokenizers/llama3).
"""
import gzip, os, shutil, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM

out, tok = sys.argv[1], sys.argv[2]
cfg = AutoConfig.for_model("llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                           num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                           max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                           tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001)
torch.manual_seed(0)
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
with torch.no_grad():
    for p in model.parameters():
        if p.dim() >= 2:
            p.normal_(0.0, 0.02)
model.save_pretrained(out, safe_serialization=True)
with gzip.open(os.path.join(tok, "tokenizer.json.gz"), "rb") as src, open(os.path.join(out, "tokenizer.json"), "wb") as dst:
    shutil.copyfileobj(src, dst)
shutil.copy(os.path.join(tok, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
print("made", out)
