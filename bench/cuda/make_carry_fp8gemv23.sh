#!/bin/bash
# Packs the fp8gemv23 device run (issue 23: the streaming FP8 GEMV,
# RILL_FP8_GEMV=v2, beside fp8_gemv) into DEST (default .device/fp8gemv23
# of this checkout; carry ".device/fp8gemv23", run
# `bash .device/fp8gemv23/run.sh`):
#  bin.tar.xz  one tar, stripped, xz -9e (the binaries share most of their
#              bytes, which xz's 64 MiB window finds): BUILD_DIR's
#              bench_cuda, bench_fp8_kernels, test_fp8_gemv_stream
#              (tests/cuda/fp8_gemv_stream_test.cpp), test_fp8_weights
#              (fp8_weights_test.cpp), and with MAIN_BENCH main's bench_cuda
#              (bench_main: the baseline binary beside the branch's);
#  shared.tar.xz  make_random_model.py and the llama3 tokenizer (the random
#              Llama-3.1-8B is made on the device: torch + transformers);
#  lib/        the Debian libraries the device lacks;
#  run.sh      bench/cuda/run_fp8gemv23.sh.
# Usage: make_carry_fp8gemv23.sh BUILD_DIR [MAIN_BENCH_CUDA] [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=${2:-}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
D=${3:-$SRC/.device/fp8gemv23}
SHARED=${RILL_SHARED_DIR:-/work/shared}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin"
cp "$B/bench/bench_cuda" "$T/bin/bench_new"
cp "$B/bench/bench_fp8_kernels" "$T/bin/"
cp "$B/tests/test_cuda_fp8_gemv_stream_test" "$T/bin/test_fp8_gemv_stream"
cp "$B/tests/test_cuda_fp8_weights_test" "$T/bin/test_fp8_weights"
if [ -n "$MAIN_BENCH" ]; then cp "$(realpath "$MAIN_BENCH")" "$T/bin/bench_main"; fi
strip "$T"/bin/*
rm -rf "$D" && mkdir -p "$D/lib"
tar cf - -C "$T" bin | nice xz -9e -T1 > "$D/bin.tar.xz"
(cd "$SHARED/.." && tar cJf "$D/shared.tar.xz" shared/tokenizers/llama3 shared/tools/make_random_model.py)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
cp "$SRC/bench/cuda/run_fp8gemv23.sh" "$D/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$D/"
du -sh "$D" "$D"/*
