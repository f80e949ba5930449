#!/bin/bash
# Packs issue 23's prefill-kernel check of BUILD_DIR against MAIN_BENCH
# (main's bench_cuda) into DEST (default /work/main/.device/pf23; carry
# ".device/pf23", run: bash .device/pf23/run.sh): the CUDA ops, attention,
# KV and model tests and the backend ops test linked into one gtest binary,
# the branch's and main's bench_cuda (one xz tar), the Debian libraries,
# goldens and the 8B model maker. BENCH_V1 (optional): an earlier build's
# bench_cuda, carried as bench_cuda_v1 (run.sh's "v1" part).
# Usage: make_carry_pf23.sh BUILD_DIR MAIN_BENCH_CUDA [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=$(realpath "$2")
V=${3:-/work/main/.device/pf23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs="tests/CMakeFiles/test_backend_backend_ops_test.dir/backend/backend_ops_test.cpp.o"
for t in cuda_ops_test cuda_attention_test kv_probe_cuda_test kv_types_cuda_test llama_cuda_test \
  batch_invariant_cuda_test; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda "$V/bench_cuda"
cp "$MAIN_BENCH" "$V/bench_cuda_main"
bins="tests bench_cuda bench_cuda_main"
if [ -n "${BENCH_V1:-}" ]; then cp "$BENCH_V1" "$V/bench_cuda_v1" && bins="$bins bench_cuda_v1"; fi
# shellcheck disable=SC2086
(cd "$V" && strip $bins && XZ_OPT="-9e -T2" tar cJf bins.tar.xz $bins && rm $bins)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md shared/goldens/hf/{llama,qwen3,gemma3,mistral-swa} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_pf23.sh" "$V/run.sh"
du -sh "$V"/*
