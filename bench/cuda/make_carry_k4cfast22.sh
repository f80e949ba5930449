#!/bin/bash
# Packs branch k4cfast22's device check (issue 22: the fast k4c / k4a CUDA
# attention, attention_chan.h chan_attention_fast, written without a GPU)
# into DEST (default /work/main/.device/k4cfast22; carry
# ".device/k4cfast22", run: bash .device/k4cfast22/run.sh): the GPU tests of
# the fast kernel (against the reference kernel: tolerance, batch
# invariance, determinism), of the reference itself, and the k4c and k4a
# Llama models against the CPU's (which now run the fast kernel) linked into
# one gtest binary, the branch's bench_cuda (one solid xz tar), the Debian
# libraries, the llama golden, the Llama 3 tokenizer and the random-model
# maker (the run tool's limit: tree + carry <= 64 MiB; the tree is ~41 MB).
# BUILD_DIR needs: librill_*.a, bench/bench_cuda and the four test objects
# (ninja -C BUILD_DIR rill_cuda bench_cuda test_cuda_attention_chan_fast_cuda_test
#  test_cuda_attention_chan_cuda_test test_cuda_k4c_cuda_test test_cuda_k4a_cuda_test
#  test_cuda_gemma_k4c_cuda_test test_cuda_kv_chan_cuda_test).
# Usage: make_carry_k4cfast22.sh BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
BASE=${BASE_TESTS:+$(realpath "$BASE_TESTS")}
V=${2:-/work/main/.device/k4cfast22}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs=""
for t in attention_chan_fast_cuda_test attention_chan_cuda_test k4c_cuda_test k4a_cuda_test gemma_k4c_cuda_test kv_chan_cuda_test; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda "$V/bench_cuda"
strip "$V/tests" "$V/bench_cuda"
# BASE_TESTS: another build's test binary (the same link, stripped) packed
# beside as tests_base, for a before / after kernel timing (KERNEL_AB=1).
bins="tests bench_cuda"
if [ -n "$BASE" ]; then
  cp "$BASE" "$V/tests_base" && strip "$V/tests_base"
  bins="$bins tests_base"
fi
# One thread and a 256 MiB window: the binaries compress against each other.
# shellcheck disable=SC2086
(cd "$V" && tar cf - $bins | nice xz --lzma2=preset=9e,dict=256MiB -T1 > bins.tar.xz && rm $bins)
# The Debian libraries travel xz'd (run.sh unpacks every lib/*.xz).
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/" && xz -T2 -6 "$V/lib/$l"; done
# The llama golden (the k4c / k4a model tests widen it) and gemma4 (the
# refusal of KV sharing), within ~20 MB.
# GEMMA4=0 leaves gemma4 out (1.1 MB) when the carry runs short.
g4=shared/goldens/hf/gemma4
[ "${GEMMA4:-1}" = 1 ] || g4=
# shellcheck disable=SC2086
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/hf/llama $g4 shared/tokenizers/llama3 \
  shared/tools/make_random_model.py)
# TIMELINE=1: the CUPTI timeline library (kernel_timeline.cpp), libcupti
# (xz'd) and its report, for run.sh's TIMELINE=1 (about 1.2 MB more).
if [ "${TIMELINE:-0}" = 1 ]; then
  g++ -O2 -shared -fPIC "$SRC/bench/cuda/kernel_timeline.cpp" -I/usr/local/cuda/include -L/usr/local/cuda/lib -lcupti \
    -o "$V/lib/libkernel_timeline.so"
  cp -L /usr/local/cuda/lib/libcupti.so.13 "$V/lib/" && xz -T2 -6 "$V/lib/libcupti.so.13"
  cp "$SRC/bench/cuda/timeline_report.py" "$V/"
fi
cp "$SRC/bench/cuda/run_k4cfast22.sh" "$V/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$V/"
du -sh "$V"/*
# The run tool carries the tracked tree and this folder, 64 MiB in all.
TREE=$(cd "$SRC" && git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
CARRY=$(du -cb "$V" | tail -1 | cut -f1)
echo "tree $TREE + carry $CARRY = $((TREE + CARRY)) bytes (limit $((64 << 20)))"
[ $((TREE + CARRY)) -le $((64 << 20)) ] || echo "warning: over the run tool's 64 MiB" >&2
