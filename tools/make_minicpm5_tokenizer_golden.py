#!/usr/bin/env python3
"""llama.cpp's token ids under the `minicpm5` pre-tokenizer (MiniCPM5's GGUF
files: tokenizer.ggml.pre "minicpm5", llama.cpp's LLAMA_VOCAB_PRE_TYPE_MINICPM5)
for rill's tokenizer test, on a synthetic byte-level BPE vocabulary: no
MiniCPM5 tokenizer is at hand, and what the pre-type decides (how text is cut
before the merges: digit runs in threes, contractions, letters, punctuation,
newlines, spaces; whole-token pieces skipping the merges) shows on any
vocabulary that has the pieces' tokens.

Writes
    tests/data/tokenizer/minicpm5_vocab.gguf   a vocabulary-only GGUF (general.architecture
                                               minicpm, no tensors): 256 byte tokens, merges
                                               for digits, common words and contractions,
                                               a few whole-word tokens without merges
    tests/data/tokenizer/minicpm5_gguf.json    texts and llama.cpp's ids (no BOS, specials
                                               not parsed)

llama.cpp is the one bench/build_llamacpp_tools.sh builds from the
llama-cpp-python 0.3.36 source package; tools/llamacpp_tokenize is compiled
against it here.

    tools/make_minicpm5_tokenizer_golden.py
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402
VERSION = "0.3.36"
OUT_DIR = os.path.join(ROOT, "tests", "data", "tokenizer")

TEXTS = [
    "Hello world",
    "1234567 and 89, 1000000",
    "I'm sure they'll say it's 3.14159",
    "DON'T SHOUT'S",
    "  leading spaces\n\n\ttabs\r\nand lines  ",
    "x=12+345*6789;",
    "numbers: ١٢٣٤ and ²³ and 12ab34",
    "你好，世界！ 2026年12月3日",
    "émigré café naïve",
    "end with spaces   ",
    "hello  world   again\n",
    "the thermometer read 98.6 degrees",
]

# Merges in rank order (byte-level strings: "Ġ" is a space). Digits merge
# pairwise and into threes, so digit runs longer than three show the
# pre-tokenizer's cut; words and contractions merge to whole tokens.
MERGES = [
    ("1", "2"), ("12", "3"), ("3", "4"), ("5", "6"), ("56", "7"), ("8", "9"), ("1", "0"), ("10", "0"),
    ("0", "0"), ("00", "0"),
    ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("Ġwor", "l"),
    ("Ġworl", "d"), ("Ġ", "t"), ("Ġt", "he"), ("'", "s"), ("'", "ll"), ("'", "m"), ("'", "t"), ("'", "S"),
    ("'", "T"), ("Ġ", "a"), ("Ġa", "n"), ("Ġan", "d"), ("i", "n"), ("Ġ", "s"), ("Ġs", "a"), ("Ġsa", "y"),
    ("Ġ", "Ġ"), ("Ċ", "Ċ"), ("e", "r"), ("Ġthe", "r"),
]
# Whole tokens the merges cannot build: with merges ignored (llama.cpp's
# minicpm5) a piece equal to one is that token.
WHOLE = ["Ġmeter", "Ġdegrees", "Ġagain", "sure"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_llamacpp_tokenize():
    bindir = subprocess.run([os.path.join(ROOT, "bench", "build_llamacpp_tools.sh")], check=True,
                            env={**os.environ, "TARGETS": "llama ggml"}, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    build = os.path.dirname(os.path.join(ROOT, bindir))
    top = os.path.dirname(build)
    src = os.path.join(top, f"llama_cpp_python-{VERSION}", "vendor", "llama.cpp")
    exe = os.path.join(top, "llamacpp_tokenize")
    libs = [os.path.join(build, p) for p in ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a",
                                              "ggml/src/libggml-base.a")]
    subprocess.run(["g++", "-O2", "-std=c++17", "-I", os.path.join(src, "include"), "-I",
                    os.path.join(src, "ggml", "include"),
                    os.path.join(ROOT, "tools", "llamacpp_tokenize", "llamacpp_tokenize.cpp"), *libs, "-fopenmp",
                    "-lpthread", "-lm", "-ldl", "-o", exe], check=True)
    return exe, src


def main():
    tools_venv.ensure(["numpy", "yaml"], ["numpy", "pyyaml"])
    exe, src = build_llamacpp_tokenize()
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    import gguf

    byte_chars = list(bytes_to_unicode().values())
    tokens = ["<s>", "</s>"] + byte_chars
    for a, b in MERGES:
        assert a in tokens and b in tokens, (a, b)
        if a + b not in tokens:
            tokens.append(a + b)
    tokens += WHOLE
    types = [3, 3] + [1] * (len(tokens) - 2)

    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, "minicpm5_vocab.gguf")
    w = gguf.GGUFWriter(path, "minicpm")
    w.add_name("minicpm5 tokenizer golden")
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("minicpm5")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in MERGES])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    run = subprocess.run([exe, path], input="\0".join(TEXTS).encode(), capture_output=True, check=True)
    ids = [json.loads(line) for line in run.stdout.decode().splitlines()]
    assert len(ids) == len(TEXTS), run.stderr.decode()
    golden = {
        "what": "llama.cpp (llama-cpp-python " + VERSION + ") token ids of each text under tokenizer.ggml.pre "
                "minicpm5 with minicpm5_vocab.gguf (tools/make_minicpm5_tokenizer_golden.py): no BOS, "
                "special tokens not parsed",
        "cases": [{"text": t, "ids": i} for t, i in zip(TEXTS, ids)],
    }
    with open(os.path.join(OUT_DIR, "minicpm5_gguf.json"), "w") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for t, i in zip(TEXTS, ids):
        print(repr(t), [tokens[k] for k in i])


if __name__ == "__main__":
    main()
