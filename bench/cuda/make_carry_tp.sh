#!/bin/bash
# Assembles the carry folder of the tensor-parallel device run (issue 8):
# the GPU test binaries of the split model (llama_cuda_tp), of one GPU
# (llama_cuda, nccl_group), bench_cuda and rill from BUILD_DIR (stripped and
# gzipped: a call carries at most 64 MiB), the Debian libraries they need
# (libxxhash, libutf8proc, libpcre2-8; NCCL is taken from the device's CUDA
# install or its Python nvidia-nccl package), the HF goldens of the Llama
# family (and qwen3-moe, whose refusal is tested), the random model maker
# with its tokenizer, and run_tp.sh. Then, on an nvidia-h200-x2 (or larger)
# machine, with carry [".carry-tp"]:
#   bash .carry-tp/run_tp.sh          # tests, then the 8B benchmark at N = 1, 2 (, 4)
#   bash .carry-tp/run_tp.sh tests    # tests only
# Usage: make_carry_tp.sh BUILD_DIR [DEST] (DEST default: /work/main/.carry-tp,
# which /work/main/.git/info/exclude or .gitignore must ignore)
set -euo pipefail
B=$(realpath "$1")
D=${2:-/work/main/.carry-tp}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/shared/goldens/hf" "$D/shared/tools" "$D/shared/tokenizers"
for t in test_cuda_llama_cuda_tp_test test_cuda_llama_cuda_test test_cuda_nccl_group_test; do
  cp "$B/tests/$t" "$D/bin/"
done
cp "$B/bench/bench_cuda" "$B/rill" "$D/bin/"
strip "$D"/bin/*
gzip -6 "$D"/bin/*
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
for g in llama llama3-tied mistral-swa qwen2 qwen3 qwen3-moe; do cp -r "$SHARED/goldens/hf/$g" "$D/shared/goldens/hf/"; done
cp "$SHARED/tools/make_random_model.py" "$D/shared/tools/"
cp -r "$SHARED/tokenizers/llama3" "$D/shared/tokenizers/"
cp "$SRC/bench/cuda/run_tp.sh" "$D/"
chmod -R u+w "$D"
du -sh "$D"
