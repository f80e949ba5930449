#!/bin/bash
# Packs issue 23's "where does a decode step go" device call into DEST
# (default /work/main/.device/step23; carry ".device/step23", run: bash
# .device/step23/run.sh, see run_step23.sh): the GPU tests named in TESTS
# linked into one gtest binary, bench_cuda, the CUPTI timeline library
# (kernel_timeline.cpp) with libcupti and its report, the Debian libraries,
# the Llama goldens, the Llama 3 tokenizer and the random-model maker.
# BUILD_DIR needs librill_*.a, bench/bench_cuda and the test objects.
# Usage: make_carry_step23.sh BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
V=${2:-/work/main/.device/step23}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
TESTS=${TESTS:-"fp8_norm_quant_test fp8_glu_test llama_cuda_test fp8_weights_test batch_invariant_cuda_test cuda_attention_test gemma4_hd512_cuda_test"}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs=""
for t in $TESTS; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda "$V/"
bins="tests bench_cuda"
# EXTRA_BINS: more of BUILD_DIR's binaries (paths under it), packed by name.
for e in ${EXTRA_BINS:-}; do
  cp "$e" "$V/" && bins="$bins $(basename "$e")"
done
# BASE_BENCH: another build's bench_cuda, packed as bench_cuda_base for an
# A/B in the same call (run_step23.sh's AB part).
if [ -n "${BASE_BENCH:-}" ]; then
  cp "$BASE_BENCH" "$V/bench_cuda_base"
  bins="$bins bench_cuda_base"
fi
# shellcheck disable=SC2086
(cd "$V" && strip $bins && tar cf - $bins | nice xz --lzma2=preset=9e,dict=256MiB -T1 > bins.tar.xz && rm $bins)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/" && xz -T2 -6 "$V/lib/$l"; done
g++ -O2 -shared -fPIC "$SRC/bench/cuda/kernel_timeline.cpp" -I/usr/local/cuda/include -L/usr/local/cuda/lib -lcupti \
  -o "$V/lib/libkernel_timeline.so"
cp -L /usr/local/cuda/lib/libcupti.so.13 "$V/lib/" && xz -T2 -6 "$V/lib/libcupti.so.13"
cp "$SRC/bench/cuda/timeline_report.py" "$V/"
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md \
  shared/goldens/hf/{llama,llama3-tied,mistral-swa,qwen2,qwen3,mixtral,qwen3-moe,glm4-moe,gemma4} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_step23.sh" "$V/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$V/"
du -sh "$V"/*
TREE=$(cd "$SRC" && git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
CARRY=$(du -cb "$V" | tail -1 | cut -f1)
echo "tree $TREE + carry $CARRY = $((TREE + CARRY)) bytes (limit $((64 << 20)))"
[ $((TREE + CARRY)) -le $((64 << 20)) ] || echo "warning: over the run tool's 64 MiB" >&2
