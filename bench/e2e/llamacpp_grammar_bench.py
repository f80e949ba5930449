"""llama.cpp's grammar sampling on the grammars bench/micro/grammar_mask_bench
times for rill, through llama-cpp-python (built from source with the CPU
flags bench/build_llamacpp_tools.sh sets, AMX off):

1. mask time per token: llama_sampler_apply of a grammar sampler over the
   whole vocabulary (what a grammar mask is in llama.cpp), then
   llama_sampler_accept of the document's next token, for each token of the
   same document rill's bench replays; thread CPU time, p50 / p99 / mean,
   after one untimed replay (warm, as rill's "warm").
2. single-stream decode tok/s on the default model, greedy, with and
   without the decode bench's JSON schema grammar (llama.cpp has no batched
   constrained path in this binding: rill's 8-stream figures come from
   bench/e2e/grammar_decode_bench.py).

The Llama-3 vocabulary (128k) is timed too: a vocabulary-only GGUF is
written from ../shared/tokenizers/llama3 with the gguf package (llama
hyperparameters, no tensors) for llama.cpp to load with vocab_only.

Usage (after `RILL_BENCH_DUMP_DIR=DIR build/bench/bench_grammar_mask_bench
--benchmark_filter=warm` wrote DIR/<grammar>.gbnf and .txt):
    .venv-tools/bin/python bench/e2e/llamacpp_grammar_bench.py DIR [MODEL.gguf]
"""
import ctypes
import gzip
import json
import os
import statistics
import sys
import time

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GRAMMARS = ["json_object", "large_schema", "arithmetic"]
# The decode bench's schema (bench/e2e/grammar_decode_bench.py) as rill's converter writes it is
# DIR/decode_schema.gbnf when present; otherwise the json_object grammar.
PROMPT = "<|im_start|>user\nDescribe a person.<|im_end|>\n<|im_start|>assistant\n"


def llama3_vocab_gguf(path):
    """A vocabulary-only GGUF of the Llama-3 tokenizer (../shared/tokenizers/llama3)."""
    import gguf
    shared = os.path.join(os.path.dirname(ROOT), "shared", "tokenizers", "llama3")
    with gzip.open(os.path.join(shared, "tokenizer.json.gz"), "rt", encoding="utf-8") as f:
        tok = json.load(f)
    vocab = dict(tok["model"]["vocab"])
    special = set()
    for t in tok["added_tokens"]:
        vocab[t["content"]] = t["id"]
        special.add(t["id"])
    tokens = [None] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(8192)
    w.add_embedding_length(4096)
    w.add_block_count(1)
    w.add_feed_forward_length(14336)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(128)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128009)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(vocab, text, special=False):
    raw = text.encode()
    buf = (llama_cpp.llama_token * (len(raw) + 16))()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, special)
    assert n >= 0, "tokenize failed"
    return list(buf[:n])


def mask_times(vocab, gbnf, ids):
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    template = (llama_cpp.llama_token_data * n_vocab)()
    for i in range(n_vocab):
        template[i].id, template[i].logit, template[i].p = i, 0.0, 0.0
    data = (llama_cpp.llama_token_data * n_vocab)()
    times = []
    for rep in range(2):  # the first replay warms what llama.cpp caches (nothing, as it turns out)
        smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        assert smpl, "llama.cpp refused the grammar"
        for tok in ids:
            ctypes.memmove(data, template, ctypes.sizeof(data))
            arr = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
            t0 = time.thread_time_ns()
            llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
            t1 = time.thread_time_ns()
            assert data[tok].logit != float("-inf"), "the document's token is masked"
            llama_cpp.llama_sampler_accept(smpl, tok)
            if rep == 1:
                times.append((t1 - t0) / 1e3)
        llama_cpp.llama_sampler_free(smpl)
    times.sort()
    return times


def decode_rate(model_path, gbnf, tokens, threads):
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=1024, n_threads=threads, n_batch=512, verbose=False)
    eos = llm.token_eos()
    grammar = llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False) if gbnf else None
    kwargs = dict(max_tokens=tokens, temperature=0.0, top_k=1)
    if grammar is None:
        kwargs["logit_bias"] = {eos: -1e9}  # ignore_eos, as rill's unconstrained side
    llm.create_completion(PROMPT, **dict(kwargs, max_tokens=8), grammar=grammar)  # warm-up
    t0 = time.time()
    out = llm.create_completion(PROMPT, **kwargs, grammar=grammar)
    dt = time.time() - t0
    n = out["usage"]["completion_tokens"]
    return n, n / dt


def main():
    dump_dir = sys.argv[1]
    model_path = sys.argv[2] if len(sys.argv) > 2 else MODEL
    llama3 = os.path.join(dump_dir, "llama3-vocab.gguf")
    if not os.path.exists(llama3):
        llama3_vocab_gguf(llama3)
    for name, path in (("smollm2", model_path), ("llama3", llama3)):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        assert model, path
        vocab = llama_cpp.llama_model_get_vocab(model)
        print(f"llama-cpp-python {llama_cpp.__version__}, {name}: {llama_cpp.llama_vocab_n_tokens(vocab)} tokens")
        for which in GRAMMARS:
            with open(os.path.join(dump_dir, which + ".gbnf")) as f:
                gbnf = f.read()
            with open(os.path.join(dump_dir, which + ".txt")) as f:
                doc = f.read()
            ids = tokenize(vocab, doc)
            t = mask_times(vocab, gbnf, ids)
            print(f"llama.cpp mask {name}/{which:13s} masks={len(t)} p50_us={t[len(t) // 2]:.1f} "
                  f"p99_us={t[len(t) * 99 // 100]:.1f} mean_us={statistics.fmean(t):.1f}")
        llama_cpp.llama_model_free(model)
    decode = os.path.join(dump_dir, "decode_schema.gbnf")
    gbnf = open(decode).read() if os.path.exists(decode) else None
    threads = int(os.environ.get("THREADS", "2"))
    for constrained in (False, True):
        n, rate = decode_rate(model_path, gbnf if constrained else None, 256, threads)
        print(f"llama.cpp decode {'constrained' if constrained else 'unconstrained':13s} streams=1 tokens={n} "
              f"{rate:.1f} tok/s")


if __name__ == "__main__":
    main()
