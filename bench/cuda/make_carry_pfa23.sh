#!/bin/bash
# Packs issue 23's prefill check of BUILD_DIR against MAIN_BENCH (main's
# bench_cuda) into DEST (default /work/main/.device/pfa23; carry
# ".device/pfa23", run: bash .device/pfa23/run.sh): make_carry_pf23.sh's
# pack (the CUDA ops, attention, KV and model tests and the backend ops test
# in one gtest binary, both bench_cuda, the Debian libraries, goldens, the
# 8B model maker) plus the CUPTI timeline library (kernel_timeline.cpp, with
# libcupti) and its report (timeline_report.py).
# Usage: make_carry_pfa23.sh BUILD_DIR MAIN_BENCH_CUDA [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=$(realpath "$2")
V=${3:-/work/main/.device/pfa23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
bash "$SRC/bench/cuda/make_carry_pf23.sh" "$B" "$MAIN_BENCH" "$V"
g++ -O2 -shared -fPIC "$SRC/bench/cuda/kernel_timeline.cpp" -I/usr/local/cuda/include -L/usr/local/cuda/lib -lcupti \
  -o "$V/lib/libkernel_timeline.so"
cp -L /usr/local/cuda/lib/libcupti.so.13 "$V/lib/"
xz -T2 -6 "$V/lib/libcupti.so.13"
cp "$SRC/bench/cuda/timeline_report.py" "$V/"
cp "$SRC/bench/cuda/run_pfa23.sh" "$V/run.sh"
du -sh "$V" "$V"/*
