#!/usr/bin/env python3
"""Writes tests/data/tokenizer/{llama3,qwen3,gemma3,smollm2}.json.

References: Hugging Face `tokenizers` for the tokenizer.json files in
/work/shared/tokenizers (llama3, qwen3, gemma3) and llama.cpp (through
llama-cpp-python, vocab only) for SmolLM2's GGUF tokenizer. Each file holds
encodings of a fixed corpus (with/without special tokens added, with/without
special-token parsing) and decodings of id sequences, including ones that
decode to ill-formed UTF-8.

Run from anywhere:  tools/make_tokenizer_goldens.py
(re-executes itself inside .venv-tools, installing what it needs).
"""
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-tools", "bin", "python")
SHARED = os.environ.get("RILL_SHARED_DIR", os.path.join(os.path.dirname(ROOT), "shared"))
OUT_DIR = os.path.join(ROOT, "tests", "data", "tokenizer")
SMOLLM_GGUF = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

if os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv-tools")):
    subprocess.check_call([os.path.join(ROOT, "tools", "tools_venv.sh"), "tokenizers", "llama-cpp-python", "gguf"])
    os.execv(VENV_PY, [VENV_PY] + sys.argv)

CORPUS = [
    "",
    " ",
    "Hello",
    "Hello world",
    " Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "In 1492, Columbus sailed the ocean blue; in 2024 we wrote 12345678901234567890.",
    "Pi is 3.14159265358979 and e is 2.71828.",
    "I'm sure it's fine, they're here, we'll go, you've seen, he'd know.",
    "I'M SURE IT'S FINE, THEY'RE HERE, WE'LL GO, YOU'VE SEEN, HE'D KNOW.",
    "don't won't can't shouldn't 's 'S 'll 'LL 'Re",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "class Foo:\n\tdef bar(self):\n\t\tpass\n",
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  for (auto& x : v) x *= 2;\n  return 0;\n}\n",
    "if (a && b || !c) { x->y[i] = (z << 2) >> 1; }",
    "    leading spaces and trailing spaces    ",
    "tabs\tand\t\ttabs\t",
    "line one\nline two\r\nline three\n\n\nend",
    "\n\n\n",
    "  \n  \n",
    "trailing newline\n",
    "a  b   c    d     e",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "Emoji: 😀🎉👍🏽 and a family 👨‍👩‍👧‍👦 and a flag 🇫🇷.",
    "❤️ ✨ ☕ ⚡",
    "Café naïve résumé coöperate façade",
    "e\u0301 combining acute vs \u00e9 precomposed",
    "A\u030a and \u212b (angstrom sign)",
    "Привет, мир! Ελληνικά κείμενα. مرحبا بالعالم. שלום עולם.",
    "हिन्दी पाठ और ไทย ภาษา",
    "Mixed: English, 中文, русский, 123, and 🚀!",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<bos>text after bos",
    "text with <|endoftext|> inside and <pad> too",
    "not special: <|im_start and im_end|> <|unknown|>",
    "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
    "https://example.com/path?query=1&x=y#frag",
    "email@example.org, @handle, #hashtag, $100.00, 50%",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "snake_case camelCase PascalCase kebab-case SCREAMING_CASE",
    "....!!!???;;;:::",
    "---===+++***///\\\\\\",
    "\u00a0non-breaking\u00a0space and\u2003em space\u3000ideographic",
    "next line\u0085char and zero\u200bwidth",
    "a" * 64,
    "ab" * 40,
    " " * 17 + "x",
    "word " * 30,
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "ﬁ ligature and ½ fraction and ² superscript",
    "Ǆ ǅ ǆ title case and ß ẞ",
    "\U0001F468\u200D\U0001F4BB coding, \U0001F3F3\uFE0F\u200D\U0001F308",
]


def gunzip_to(src, dst_dir, name):
    path = os.path.join(dst_dir, name)
    with gzip.open(src, "rb") as f, open(path, "wb") as g:
        g.write(f.read())
    return path


def hf_goldens(name, tmp):
    from tokenizers import Tokenizer

    src_dir = os.path.join(SHARED, "tokenizers", name)
    path = gunzip_to(os.path.join(src_dir, "tokenizer.json.gz"), tmp, "tokenizer.json")
    tok = Tokenizer.from_file(path)

    def enc(text, add_special, parse_special):
        tok.encode_special_tokens = not parse_special
        return tok.encode(text, add_special_tokens=add_special).ids

    encode = []
    for text in CORPUS:
        encode.append({
            "text": text,
            "ids": enc(text, False, True),
            "ids_add_special": enc(text, True, True),
            "ids_no_parse": enc(text, False, False),
        })
    tok.encode_special_tokens = False

    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    decode = decode_cases(tok, n_vocab, lambda ids, skip: tok.decode(ids, skip_special_tokens=skip),
                          byte_ids=byte_token_ids(tok, name))
    return {"reference": "tokenizers " + __import__("tokenizers").__version__,
            "n_vocab": n_vocab, "encode": encode, "decode": decode}


def byte_token_ids(tok, name):
    """Ids of single-byte tokens for bytes E2 82 AC (the UTF-8 of U+20AC) and F0."""
    if name == "gemma3":
        return [tok.token_to_id("<0x%02X>" % b) for b in (0xE2, 0x82, 0xAC, 0xF0)]
    # Byte-level alphabet: byte b is the character bytes_to_unicode()[b].
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [tok.token_to_id(chr(m[b])) for b in (0xE2, 0x82, 0xAC, 0xF0)]


def decode_cases(tok, n_vocab, decode, byte_ids):
    e2, x82, xac, f0 = byte_ids
    seqs = [
        [e2], [e2, x82], [e2, x82, xac], [x82], [e2, e2, x82, xac], [f0, e2, x82, xac, x82],
        [e2, x82, xac, xac], [f0], [f0, f0],
    ]
    # Encodings of part of the corpus, cut at every token boundary.
    for text in ["Emoji: 😀🎉👍🏽 and a family 👨‍👩‍👧‍👦", "你好，世界！", "Café naïve"]:
        ids = tok.encode(text, add_special_tokens=False).ids
        seqs.append(ids)
        seqs.extend([ids[:k] for k in range(1, len(ids))])
    rng = random.Random(1234)
    for _ in range(40):
        seqs.append([rng.randrange(n_vocab) for _ in range(rng.randrange(1, 12))])
    specials = [t for t in ("<|im_start|>", "<|begin_of_text|>", "<bos>", "<start_of_turn>", "<|eot_id|>",
                            "<think>", "<end_of_turn>", "<|im_end|>") if tok.token_to_id(t) is not None]
    sp = [tok.token_to_id(t) for t in specials]
    hello = tok.encode(" Hello world", add_special_tokens=False).ids
    seqs.append(sp + hello + sp)
    seqs.append(hello[:1] + sp[:1] + hello[1:] + [e2] + sp[-1:] + [x82, xac])
    out = []
    for ids in seqs:
        for skip in (False, True):
            out.append({"ids": ids, "skip_special": skip, "text": decode(ids, skip)})
    return out


def smollm_goldens():
    import ctypes
    import llama_cpp

    llm = llama_cpp.Llama(model_path=SMOLLM_GGUF, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()

    def enc(text, add_special, parse_special):
        return llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detok(ids, skip):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, skip, not skip)
        assert n >= 0
        return buf.raw[:n]

    encode = []
    for text in CORPUS:
        encode.append({
            "text": text,
            "ids": enc(text, False, True),
            "ids_add_special": enc(text, True, True),
            "ids_no_parse": enc(text, False, False),
        })

    class Shim:
        def encode(self, text, add_special_tokens=False):
            class R:
                pass
            r = R()
            r.ids = enc(text, add_special_tokens, True)
            return r

        def token_to_id(self, t):
            ids = enc(t, False, True)
            return ids[0] if len(ids) == 1 else None

    # Single-byte tokens for E2 82 AC F0, found by their byte-level text.
    bl = {}
    for i in range(n_vocab):
        t = llama_cpp.llama_vocab_get_text(vocab, i)
        bl[t] = i
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    byte_ids = [bl[chr(m[b]).encode("utf-8")] for b in (0xE2, 0x82, 0xAC, 0xF0)]

    raw = {}

    def decode(ids, skip):
        b = detok(ids, skip)
        raw[(tuple(ids), skip)] = b.hex()
        return b.decode("utf-8", errors="replace")

    decode_list = decode_cases(Shim(), n_vocab, decode, byte_ids)
    for d in decode_list:
        d["bytes_hex"] = raw[(tuple(d["ids"]), d["skip_special"])]

    rng = random.Random(99)
    piece_ids = list(range(0, 40)) + [rng.randrange(n_vocab) for _ in range(200)]
    pieces = []
    for i in piece_ids:
        buf = ctypes.create_string_buffer(256)
        k = llama_cpp.llama_token_to_piece(vocab, i, buf, 256, 0, True)
        pieces.append({"id": i, "hex": buf.raw[:k].hex()})
    return {"reference": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
            "n_vocab": n_vocab, "bos": llama_cpp.llama_vocab_bos(vocab), "eos": llama_cpp.llama_vocab_eos(vocab),
            "encode": encode, "decode": decode_list, "pieces": pieces}


def spm_gguf_goldens(tmp):
    """llama.cpp's SPM ("llama") tokenizer on a vocabulary-only GGUF built from
    Gemma 3's tokens: type CONTROL for special added tokens, BYTE for <0xXX>,
    NORMAL otherwise; score of token i = -i. tests/text/tokenizer_spm_test.cpp
    builds the same GGUF in memory."""
    import re
    import gguf
    import llama_cpp

    with gzip.open(os.path.join(SHARED, "tokenizers", "gemma3", "tokenizer.json.gz"), "rb") as f:
        j = json.load(f)
    vocab = j["model"]["vocab"]
    added = {a["id"]: a for a in j["added_tokens"]}
    n = max(max(vocab.values()), max(added)) + 1
    toks = [""] * n
    for t, i in vocab.items():
        toks[i] = t
    for i, a in added.items():
        toks[i] = a["content"]
    types = []
    for i, t in enumerate(toks):
        if i in added and added[i]["special"]:
            types.append(3)
        elif re.fullmatch(r"<0x[0-9A-F]{2}>", t):
            types.append(6)
        else:
            types.append(1)
    path = os.path.join(tmp, "spm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    # Minimal hyperparameters so llama.cpp accepts the file (vocab only).
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_scores([-float(i) for i in range(n)])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    encode = []
    for text in CORPUS:
        b = text.encode("utf-8")
        encode.append({
            "text": text,
            "ids": llm.tokenize(b, add_bos=False, special=True),
            "ids_add_special": llm.tokenize(b, add_bos=True, special=True),
            "ids_no_parse": llm.tokenize(b, add_bos=False, special=False),
        })
    import ctypes
    lv = llama_cpp.llama_model_get_vocab(llm.model)

    def detok(ids, skip):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(size)
        k = llama_cpp.llama_detokenize(lv, arr, len(ids), buf, size, skip, not skip)
        assert k >= 0
        return buf.raw[:k].decode("utf-8", errors="replace")

    seqs = [e["ids_add_special"] for e in encode] + [e["ids"] for e in encode[:20]]
    byte_ids = [toks.index("<0x%02X>" % b) for b in (0xE2, 0x82, 0xAC)]
    seqs += [byte_ids[:1], byte_ids[:2], byte_ids, byte_ids[:2] + encode[3]["ids"]]
    decode = [{"ids": ids, "skip_special": skip, "text": detok(ids, skip)} for ids in seqs for skip in (False, True)]
    return {"reference": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
            "n_vocab": llm.n_vocab(), "encode": encode, "decode": decode}


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("llama3", "qwen3", "gemma3"):
            data = hf_goldens(name, tmp)
            with open(os.path.join(OUT_DIR, name + ".json"), "w") as f:
                json.dump(data, f, ensure_ascii=True, indent=0)
            print(name, len(data["encode"]), "encodings,", len(data["decode"]), "decodings")
        data = spm_gguf_goldens(tmp)
        with open(os.path.join(OUT_DIR, "gemma3_spm_gguf.json"), "w") as f:
            json.dump(data, f, ensure_ascii=True, indent=0)
        print("gemma3_spm_gguf", len(data["encode"]), "encodings")
    data = smollm_goldens()
    with open(os.path.join(OUT_DIR, "smollm2.json"), "w") as f:
        json.dump(data, f, ensure_ascii=True, indent=0)
    print("smollm2", len(data["encode"]), "encodings,", len(data["decode"]), "decodings")


if __name__ == "__main__":
    main()
