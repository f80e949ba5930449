#!/bin/bash
# Packs the KV store's device timing (issue 22: where a k4c decode step's
# extra RoPE + store time goes) into DEST (default
# /work/main/.device/kvstore22; carry ".device/kvstore22", run: bash
# .device/kvstore22/run.sh): the CudaKvChan tests (test_cuda_kv_chan_cuda_test,
# DeviceTimingOfTheStore among them) and the Debian libraries it loads.
# BUILD_DIR needs tests/test_cuda_kv_chan_cuda_test. BASE_TESTS: another
# build's binary of the same test, packed beside as tests_base (an A/B).
# Usage: make_carry_kvstore22.sh BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
BASE=${BASE_TESTS:+$(realpath "$BASE_TESTS")}
V=${2:-/work/main/.device/kvstore22}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$V" && mkdir -p "$V/lib"
cp "$B/tests/test_cuda_kv_chan_cuda_test" "$V/tests"
bins=tests
if [ -n "$BASE" ]; then
  cp "$BASE" "$V/tests_base"
  bins="$bins tests_base"
fi
# shellcheck disable=SC2086
(cd "$V" && strip $bins && tar cf - $bins | xz -T2 -6 > bins.tar.xz && rm $bins)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/" && xz -T2 -6 "$V/lib/$l"; done
cp "$SRC/bench/cuda/run_kvstore22.sh" "$V/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$V/"
du -sh "$V"/*
