#!/bin/bash
# Packs issue 23's fused FP8 gate_up + GLU check (branch fp8glu23) of
# BUILD_DIR against MAIN_BENCH (main's bench_cuda) into DEST (default
# /work/main/.device/fp8glu23; carry ".device/fp8glu23", run: bash
# .device/fp8glu23/run.sh): the Fp8Glu and Fp8Weights test binaries, the
# branch's and main's bench_cuda (one xz tar), the Debian libraries, the HF
# goldens the FP8 model tests read and the random 8B's maker.
# Usage: make_carry_fp8glu23.sh BUILD_DIR MAIN_BENCH_CUDA [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=$(realpath "$2")
V=${3:-/work/main/.device/fp8glu23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cp "$B/tests/test_cuda_fp8_glu_test" "$V/tests_glu"
cp "$B/tests/test_cuda_fp8_weights_test" "$V/tests_fp8"
cp "$B/bench/bench_cuda" "$V/bench_cuda"
cp "$MAIN_BENCH" "$V/bench_cuda_main"
(cd "$V" && strip tests_glu tests_fp8 bench_cuda bench_cuda_main &&
  XZ_OPT="-9 -T2" tar cJf bins.tar.xz tests_glu tests_fp8 bench_cuda bench_cuda_main &&
  rm tests_glu tests_fp8 bench_cuda bench_cuda_main)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md shared/goldens/hf/{llama,qwen3,gemma3} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_fp8glu23.sh" "$V/run.sh"
du -sh "$V"/*
