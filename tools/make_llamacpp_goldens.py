#!/usr/bin/env python3
"""Greedy-decode goldens for the default model from llama.cpp (llama-cpp-python).

Writes tests/data/llamacpp/smollm2_greedy.json, the reference for rill's
GGUF parity test: for each chat-formatted prompt, llama.cpp's token ids of the
prompt and its greedy continuation (argmax of the logits at each step, no
sampler involved), with the top-5 (id, logit) of every step so a reader can
tell a near-tie (rounding in a different kernel) from a real divergence.
Prompt 0 also carries the full logits row at its last prompt position.

Decoding stops after --n-gen tokens or right after an end-of-generation token
(EOS, id 2 `<|im_end|>` for SmolLM2), which is then the last id of greedy_ids;
`stopped_at_eos` says which happened.

    tools/make_llamacpp_goldens.py [--model M] [--out F] [--n-gen 64]

Installs llama-cpp-python and numpy into .venv-tools itself (re-executing
under that interpreter) when they are not importable.
"""
import argparse
import datetime
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tools_venv  # noqa: E402
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "llamacpp", "smollm2_greedy.json")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def ensure_venv():
    tools_venv.ensure(["llama_cpp", "numpy"], ["llama-cpp-python", "numpy"])


def chat(user, system=SYSTEM):
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


PARAGRAPH = (
    "The Great Barrier Reef, off the coast of Queensland in Australia, is the "
    "largest coral reef system in the world. It is made of almost three thousand "
    "individual reefs and nine hundred islands spread over some three hundred and "
    "fifty thousand square kilometres. The reef was built by billions of tiny "
    "organisms called coral polyps, and it supports a wide diversity of life, "
    "including many vulnerable or endangered species. In recent decades rising sea "
    "temperatures have caused several mass bleaching events, in which stressed "
    "corals expel the algae living in their tissues and turn white. Scientists "
    "warn that without large cuts in greenhouse gas emissions, bleaching will "
    "become more frequent and the reef may not have time to recover between events."
)

# (name, text). Varied on purpose: each exercises different tokens and
# different paths through the vocabulary (code, digits, non-Latin script).
PROMPTS = [
    ("short_question", chat("What is the capital of France, and why is it famous?")),
    ("code_request", chat("Write a Python function that checks whether a string is a "
                          "palindrome, ignoring case and spaces.")),
    ("list_request", chat("List ten fruits that are rich in vitamin C, one per line, "
                          "with a short note on each.")),
    ("paragraph_summary", chat("Summarize the following paragraph in three sentences.\n\n"
                               + PARAGRAPH)),
    ("non_english", chat("Explique-moi en français comment fonctionne la photosynthèse "
                         "chez les plantes.")),
    ("math_word_problem", chat("A train leaves a station at 3 pm travelling at 60 km/h. "
                               "A second train leaves the same station at 4 pm travelling "
                               "at 90 km/h on the same track. At what time does the second "
                               "train catch up with the first? Explain step by step.")),
    ("story_no_system", "<|im_start|>user\nTell me a short story about a robot who "
                        "learns to paint.<|im_end|>\n<|im_start|>assistant\n"),
    ("spanish_email", chat("Escribe un correo electrónico breve para pedir un día libre "
                           "en el trabajo.")),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def top_k(row, k, np):
    idx = np.argpartition(-row, k)[:k]
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return [[int(i), round(float(row[i]), 5)] for i in idx]


def main():
    ensure_venv()
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    llm = Llama(model_path=args.model, n_threads=args.threads, n_ctx=2048,
                logits_all=False, seed=0, verbose=False)
    n_vocab = llm.n_vocab()
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def last_logits():
        # Row of the last token of the last llama_decode, [n_vocab] float32.
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

    prompts = []
    for p_index, (name, text) in enumerate(PROMPTS):
        llm.reset()
        prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        llm.eval(prompt_ids)  # one batch (n_batch 512), fresh KV
        greedy, steps, stopped_at_eos = [], [], False
        first_row = None
        for step in range(args.n_gen):
            row = last_logits()
            if step == 0:
                first_row = row
            tok = int(np.argmax(row))  # exact greedy; first index on a tie
            top5 = top_k(row, 5, np)
            steps.append({"top5": top5, "margin": round(top5[0][1] - top5[1][1], 5)})
            greedy.append(tok)
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                stopped_at_eos = True
                break
            llm.eval([tok])
        entry = {
            "name": name,
            "text": text,
            "prompt_ids": prompt_ids,
            "greedy_ids": greedy,
            "n_generated": len(greedy),
            "stopped_at_eos": stopped_at_eos,
            "generated_text": llm.detokenize(greedy, special=True).decode("utf-8", "replace"),
            "min_margin": min(s["margin"] for s in steps),
            "steps": steps,
        }
        if p_index == 0:
            entry["first_step_logits"] = [round(float(x), 5) for x in first_row]
        prompts.append(entry)
        print(f"{name}: {len(prompt_ids)} prompt ids, {len(greedy)} generated"
              f"{' (EOS)' if stopped_at_eos else ''}, min top1-top2 margin "
              f"{entry['min_margin']:.4f}", file=sys.stderr)

    out = {
        "header": {
            "what": "llama.cpp greedy decode of SmolLM2-135M-Instruct Q4_1 (argmax of "
                    "logits each step; prompt evaluated in one batch, then one token per "
                    "decode). greedy_ids ends with the EOS id when stopped_at_eos. "
                    "steps[i].top5 = [[id, logit]...] of the logits that chose "
                    "greedy_ids[i]; margin = top1 - top2 logit. first_step_logits "
                    "(prompt 0 only) = full logits row at the last prompt position.",
            "llama_cpp_python_version": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "n_threads": args.threads,
            "model": os.path.relpath(os.path.abspath(args.model), ROOT),
            "model_sha256": sha256(args.model),
            "n_vocab": n_vocab,
            "eos_id": llm.token_eos(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "tools/make_llamacpp_goldens.py " + " ".join(sys.argv[1:]),
        },
        "prompts": prompts,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        # Header indented, one prompt per line: small diffs, greppable.
        header = json.dumps(out["header"], ensure_ascii=False, indent=2)
        rows = [json.dumps(p, ensure_ascii=False, separators=(",", ":")) for p in prompts]
        f.write('{"header": ' + header + ',\n"prompts": [\n' + ",\n".join(rows) + "\n]}\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
