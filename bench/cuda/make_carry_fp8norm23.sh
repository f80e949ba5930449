#!/bin/bash
# Packs the FP8 norm-quantization fusion's device run (issue 23,
# rms_norm_fp8 in backend/cuda/ops.h) into DEST (default
# /work/main/.device/fp8norm23; carry ".device/fp8norm23", run: bash
# .device/fp8norm23/run.sh): the FP8 and Llama GPU tests linked into one
# gtest binary and bench_cuda
# (stripped, one xz archive), the Debian libraries they need, the Llama
# goldens, the 8B model maker and its tokenizer, run_fp8norm23.sh as run.sh.
# Usage: make_carry_fp8norm23.sh BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
V=${2:-/work/main/.device/fp8norm23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs=""
for t in fp8_norm_quant_test fp8_glu_test llama_cuda_test fp8_weights_test batch_invariant_cuda_test; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda "$V/"
strip "$V/tests" "$V/bench_cuda"
(cd "$V" && XZ_OPT="-9e -T2" tar cJf bins.tar.xz tests bench_cuda && rm tests bench_cuda)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md \
  shared/goldens/hf/{llama,llama3-tied,mistral-swa,qwen2,qwen3,mixtral,qwen3-moe,glm4-moe} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_fp8norm23.sh" "$V/run.sh"
du -sh "$V"/*
