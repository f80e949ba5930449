#!/bin/bash
# Assembles the carry folder of a run of every GPU test (issues 6, 7, 8):
# every test_cuda_* binary of BUILD_DIR (stripped, in one tar.xz: a call
# carries at most 64 MiB, and the binaries share most of their bytes), the
# Debian libraries they need (libxxhash, libutf8proc, libpcre2-8; NCCL comes
# from the device's CUDA install), every HF golden and run_g.sh. Then, with carry [".cuda-carry-g"] (on
# nvidia-h200-x2 the tensor-parallel tests run too; with one GPU they skip):
#   bash .cuda-carry-g/run_g.sh     # every GPU test, a summary table last
# Usage: make_carry_g.sh BUILD_DIR [DEST] (DEST default: /work/main/.cuda-carry-g,
# which /work/main/.git/info/exclude must ignore: "/.cuda-carry-g/")
set -euo pipefail
B=$(realpath "$1")
D=${2:-/work/main/.cuda-carry-g}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/shared/goldens/hf"
for t in "$B"/tests/test_cuda_*; do
  case "$t" in *.cmake) continue ;; esac
  cp "$t" "$D/bin/"
done
strip "$D"/bin/*
tar -C "$D/bin" -cJf "$D/bins.tar.xz" . && rm -rf "$D/bin"
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
for g in "$SHARED"/goldens/hf/*/; do cp -r "$g" "$D/shared/goldens/hf/"; done
cp "$SRC/bench/cuda/run_g.sh" "$D/"
chmod -R u+w "$D"
du -sh "$D"
