#!/bin/bash
# Packs every GPU test of BUILD_DIR into DEST (default
# /work/main/.device/verify; carry ".device/verify", run: bash
# .device/verify/run.sh): the objects of tests/cuda/*_test.cpp and the
# backend ops test linked into one gtest binary, stripped and xz'd, the
# Debian libraries it needs and the HF goldens (about 20 MB). The default
# model is not carried (64 MiB limit): its tests skip, naming the file.
# Usage: make_carry_verify.sh BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
V=${2:-/work/main/.device/verify}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs="tests/CMakeFiles/test_backend_backend_ops_test.dir/backend/backend_ops_test.cpp.o"
for f in "$SRC"/tests/cuda/*_test.cpp; do
  t=$(basename "$f" .cpp)
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
strip "$V/tests"
xz -T2 -9 "$V/tests"
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens)
cp "$SRC/bench/cuda/run_verify.sh" "$V/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$V/"
du -sh "$V"/*
