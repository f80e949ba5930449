#!/bin/bash
# Packs issue 23's whole table for one device call (run_table23.sh): the
# Release build's bench_cuda and rill (stripped, one xz tar: they share
# the CUDA kernels' bytes), the serving benchmark, the compiled-PyTorch
# peer and the 8B model maker from ../shared/tools, and the Debian
# libraries the device lacks. Carry ".device/table23", run
# `bash .device/table23/run.sh` (PARTS and BUDGET there).
# Usage: make_carry_table23.sh BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
V=${2:-/work/main/.device/table23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib" "$V/py"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cp "$B/rill" "$B/bench/bench_cuda" "$T/" && strip "$T/rill" "$T/bench_cuda"
(cd "$T" && tar cf - rill bench_cuda) | xz -9e -T2 > "$V/bins.tar.xz"
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0 libspdlog.so.1.10 libfmt.so.9; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
cp "$SRC/bench/e2e/serve_bench.py" "$SRC/bench/e2e/bench_common.py" "$SHARED/tools/peer_torch.py" \
  "$SHARED/tools/gpu_ceilings.py" "$V/py/"
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_table23.sh" "$V/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$V/"
du -sh "$V"/*
