#!/bin/bash
# Packs the q8gemv23 device run (issue 23) into DEST (default
# /work/main/.device/q8gemv23; carry ".device/q8gemv23", run: bash
# .device/q8gemv23/run.sh): this build's bench_cuda (bench_new) and
# cuda_quant_test (test_quant), MAIN_BUILD's bench_cuda (bench_main), py/
# (make_bench_model.py, gguf-py, fallback yaml: from .device/gguf's bin.tar.xz),
# stripped, in one tar xz -9e (the fatbins compress against each other:
# about 13 MB), the Debian libraries, run_q8gemv23.sh as run.sh.
# Usage: make_carry_q8gemv23.sh BUILD_DIR MAIN_BUILD [DEST]
set -euo pipefail
B=$(realpath "$1")
M=$(realpath "$2")
D=${3:-/work/main/.device/q8gemv23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib"
cp "$B/bench/bench_cuda" "$D/bin/bench_new"
cp "$M/bench/bench_cuda" "$D/bin/bench_main"
cp "$B/tests/test_cuda_cuda_quant_test" "$D/bin/test_quant"
strip "$D"/bin/*
tmp=$(mktemp -d)
tar xJf /work/main/.device/gguf/bin.tar.xz -C "$tmp" bin/py
cp -r "$tmp/bin/py" "$D/bin/"
rm -rf "$tmp"
(cd "$D" && tar cf - bin | xz -9e -T1 > bin.tar.xz && rm -rf bin)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
cp "$SRC/bench/cuda/run_q8gemv23.sh" "$D/run.sh"
du -sh "$D"/*
