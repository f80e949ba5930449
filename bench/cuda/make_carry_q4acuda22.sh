#!/bin/bash
# Packs branch q4acuda22's device check (k4a: q4a K with iq4_nlh64 V on
# CUDA, written without a GPU) into DEST (default
# /work/main/.device/q4acuda22; carry ".device/q4acuda22", run: bash
# .device/q4acuda22/run.sh): the GPU tests of k4a and of the k4c code it
# shares (the per-channel encoders, the reference attention, the step
# plan, the k4c and k4a Llama models against the CPU's) linked into one
# gtest binary, the branch's bench_cuda and main's (one solid xz tar), the
# Debian libraries, the llama golden, the Llama 3 tokenizer and the
# random-model maker (about 19 MB).
# Usage: make_carry_q4acuda22.sh BUILD_DIR MAIN_BENCH_CUDA [DEST]
set -euo pipefail
B=$(realpath "$1")
MAIN_BENCH=$(realpath "$2")
V=${3:-/work/main/.device/q4acuda22}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs=""
for t in kv_chan_cuda_test attention_chan_cuda_test kv_chan_step_test k4c_cuda_test k4a_cuda_test; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda "$V/bench_cuda"
# MAIN_BENCH_CUDA the same file as BUILD_DIR's (main after the merge): a hard
# link, which tar stores once, and run.sh skips main's runs.
if cmp -s "$MAIN_BENCH" bench/bench_cuda; then SAME=1; else SAME=; cp "$MAIN_BENCH" "$V/bench_cuda_main"; fi
strip "$V/tests" "$V/bench_cuda"
[ -n "$SAME" ] || strip "$V/bench_cuda_main"
[ -n "$SAME" ] && ln "$V/bench_cuda" "$V/bench_cuda_main"
# One thread and a 256 MiB window: the binaries compress against each other.
(cd "$V" && tar cf - tests bench_cuda bench_cuda_main |
  nice xz --lzma2=preset=9e,dict=256MiB -T1 > bins.tar.xz &&
  rm tests bench_cuda bench_cuda_main)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
# The llama golden alone (the k4c / k4a model tests widen it), within ~20 MB.
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/hf/llama shared/tokenizers/llama3 \
  shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_q4acuda22.sh" "$V/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$V/"
du -sh "$V"/*
# The run tool carries the tracked tree and this folder, 64 MiB in all.
TREE=$(cd "$SRC" && git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
CARRY=$(du -cb "$V" | tail -1 | cut -f1)
echo "tree $TREE + carry $CARRY = $((TREE + CARRY)) bytes (limit $((64 << 20)))"
[ $((TREE + CARRY)) -le $((64 << 20)) ] || echo "warning: over the run tool's 64 MiB" >&2
