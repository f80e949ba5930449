#!/bin/bash
# Assembles the carry folder of the CUDA MoE device run (issues 6 and 7):
# the MoE GPU tests and the Llama family's (a regression check of the
# shared files), bench_cuda (gzipped: a call carries at most 64 MiB), the
# Debian libraries they need, the HF goldens of both families, the random
# model maker with the qwen3 tokenizer, and run_moe.sh. Then, with carry
# [".carry-moe"]:
#   bash .carry-moe/run_moe.sh          # tests, then the moe-7b-a1b benchmark
#   bash .carry-moe/run_moe.sh tests    # tests only
# Usage: make_carry_moe.sh BUILD_DIR [DEST] (DEST default: /work/main/.carry-moe,
# which /work/main/.git/info/exclude must ignore)
set -euo pipefail
B=$(realpath "$1")
D=${2:-/work/main/.carry-moe}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/shared/goldens/hf" "$D/shared/tools" "$D/shared/tokenizers"
for t in test_cuda_cuda_moe_ops_test test_cuda_moe_cuda_test test_cuda_llama_cuda_test; do cp "$B/tests/$t" "$D/bin/"; done
cp "$B/bench/bench_cuda" "$D/bin/"
strip "$D"/bin/*
gzip -6 "$D"/bin/*
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
for g in mixtral qwen3-moe llama llama3-tied mistral-swa qwen2 qwen3; do cp -r "$SHARED/goldens/hf/$g" "$D/shared/goldens/hf/"; done
cp "$SHARED/tools/make_random_model.py" "$D/shared/tools/"
cp -r "$SHARED/tokenizers/qwen3" "$D/shared/tokenizers/"
cp "$SRC/bench/cuda/run_moe.sh" "$D/"
chmod -R u+w "$D"
du -sh "$D"
