#!/bin/bash
# Assembles the carry folder of the CUDA hybrid (Qwen3.5 / Qwen3-Next) device
# run: the gated-DeltaNet GPU tests and the Llama/Gemma/MoE model and
# attention tests (the shared CUDA plumbing changed under them) from
# BUILD_DIR (plus EXTRA_TESTS: more test_cuda_<name> stems), stripped and
# gzipped (a call carries at most 64 MiB), bench_cuda, the Debian libraries
# they need, the HF goldens, make_random_model.py with the qwen3 tokenizer
# (the qwen3.5-4b preset is made on the device) and run_hyb.sh. Then, with
# carry [".carry-hyb"]:
#   bash .carry-hyb/run_hyb.sh          # GPU tests, then the qwen3.5-4b benchmark
#   bash .carry-hyb/run_hyb.sh tests    # GPU tests only
# Usage: make_carry_hyb.sh BUILD_DIR [DEST] (DEST default: /work/main/.carry-hyb,
# which /work/main/.git/info/exclude must ignore: "/.carry-hyb/")
set -euo pipefail
B=$(realpath "$1")
D=${2:-/work/main/.carry-hyb}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/shared/goldens/hf" "$D/shared/tools" "$D/shared/tokenizers"
for n in gated_delta_cuda_test qwen3_next_cuda_test llama_cuda_test gemma_cuda_test moe_cuda_test cuda_attention_test ${EXTRA_TESTS:-}; do
  cp "$B/tests/test_cuda_$n" "$D/bin/"
done
cp "$B/bench/bench_cuda" "$D/bin/"
strip "$D"/bin/*
gzip -6 "$D"/bin/*
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
for g in qwen3_5 qwen3-next llama llama3-tied mistral-swa qwen2 qwen3 gemma2 gemma3 mixtral qwen3-moe; do
  cp -r "$SHARED/goldens/hf/$g" "$D/shared/goldens/hf/"
done
cp "$SHARED/tools/make_random_model.py" "$D/shared/tools/"
cp -r "$SHARED/tokenizers/qwen3" "$D/shared/tokenizers/"
cp "$SRC/bench/cuda/run_hyb.sh" "$D/"
chmod -R u+w "$D"
du -sh "$D"
