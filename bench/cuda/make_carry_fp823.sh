#!/bin/bash
# Packs issue 23's FP8 check of BUILD_DIR against MAIN_BENCH (main's
# bench_cuda) into DEST (default /work/main/.device/fp823; carry
# ".device/fp823", run: bash .device/fp823/run.sh): the FP8 weights test
# binary, the branch's and main's bench_cuda (one xz tar), the Debian
# libraries, the HF goldens and the 8B model makers (the whole 8B, and
# make_llama8b_layers.py: fewer layers of it).
# Usage: make_carry_fp823.sh BUILD_DIR MAIN_BENCH_CUDA [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=$(realpath "$2")
V=${3:-/work/main/.device/fp823}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cp "$B/tests/test_cuda_fp8_weights_test" "$V/tests"
cp "$B/bench/bench_cuda" "$V/bench_cuda"
cp "$MAIN_BENCH" "$V/bench_cuda_main"
(cd "$V" && strip tests bench_cuda bench_cuda_main && XZ_OPT="-9 -T2" tar cJf bins.tar.xz tests bench_cuda bench_cuda_main &&
  rm tests bench_cuda bench_cuda_main)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md shared/goldens/hf/{llama,qwen3,gemma3} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_fp823.sh" "$V/run.sh"
cp "$SRC/bench/cuda/make_llama8b_layers.py" "$V/"
du -sh "$V"/*
