#!/bin/bash
# Packs the fp8mma23 device run (issue 23: fp8_mma, the FP8 GEMM of our own
# for 2..64 tokens with the scales in its epilogue, RILL_FP8_MMA=1, beside
# cuBLASLt's FP8 GEMM and its scale pass) into DEST (default
# .device/fp8mma23 of this checkout; carry ".device/fp8mma23", run
# `bash .device/fp8mma23/run.sh`):
#  bin.tar.xz  one tar, stripped, xz -9e (the binaries share most of their
#              bytes): BUILD_DIR's bench_cuda (bench_new), bench_fp8_kernels,
#              test_fp8_mma (tests/cuda/fp8_mma_test.cpp), test_fp8_glu
#              (fp8_glu_test.cpp), and with MAIN_BENCH main's bench_cuda
#              (bench_main: the baseline binary beside the branch's);
#  shared.tar.xz  make_random_model.py and the llama3 tokenizer (the random
#              Llama-3.1-8B is made on the device: torch + transformers);
#  lib/        the Debian libraries the device lacks;
#  run.sh      bench/cuda/run_fp8mma23.sh.
# Usage: make_carry_fp8mma23.sh BUILD_DIR [MAIN_BENCH_CUDA] [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=${2:-}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
D=${3:-$SRC/.device/fp8mma23}
SHARED=${RILL_SHARED_DIR:-/work/shared}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin"
cp "$B/bench/bench_cuda" "$T/bin/bench_new"
cp "$B/bench/bench_fp8_kernels" "$T/bin/"
cp "$B/tests/test_cuda_fp8_mma_test" "$T/bin/test_fp8_mma"
cp "$B/tests/test_cuda_fp8_glu_test" "$T/bin/test_fp8_glu"
if [ -n "$MAIN_BENCH" ]; then cp "$(realpath "$MAIN_BENCH")" "$T/bin/bench_main"; fi
strip "$T"/bin/*
rm -rf "$D" && mkdir -p "$D/lib"
tar cf - -C "$T" bin | nice xz -9e -T1 > "$D/bin.tar.xz"
(cd "$SHARED/.." && tar cJf "$D/shared.tar.xz" shared/tokenizers/llama3 shared/tools/make_random_model.py)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
cp "$SRC/bench/cuda/run_fp8mma23.sh" "$D/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$D/"
du -sh "$D" "$D"/*
