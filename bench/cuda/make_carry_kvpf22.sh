#!/bin/bash
# Packs branch kvpf22's device run (quantized-KV prefill attention) into
# DEST (default /work/main/.device/kvpf22; carry ".device/kvpf22") beside
# run_kvpf22.sh: the KV-type GPU tests of BUILD_DIR linked into one gtest
# binary (as make_carry_kvtypes.sh), its bench_cuda and
# bench_prefill_attention, and the baseline from MAIN_BUILD_DIR (main's
# build): its bench_cuda, and BUILD_DIR's bench_prefill_attention object
# linked against its libraries (main's kernels), all stripped, in one tar
# under xz with a 256 MiB dictionary (the binaries share most of their
# bytes: 14 MB together where each alone is 5-10), the Debian libraries
# they need, the goldens and the 8B model maker.
# Usage: make_carry_kvpf22.sh BUILD_DIR MAIN_BUILD_DIR [DEST]
set -euo pipefail
B=$(realpath "$1")
MB=$(realpath "$2")
V=${3:-/work/main/.device/kvpf22}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$V" && mkdir -p "$V/lib" "$V/bin"
cd "$B"
objs="tests/CMakeFiles/test_backend_backend_ops_test.dir/backend/backend_ops_test.cpp.o"
for t in kv_types_cuda_test kv_tiers_cuda_test batch_invariant_cuda_test cuda_attention_test gemma4_hd512_cuda_test \
         llama_cuda_test; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/bin/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda bench/bench_prefill_attention "$V/bin/"
cp "$MB/bench/bench_cuda" "$V/bin/bench_cuda_main"
/usr/bin/c++ -O2 bench/CMakeFiles/bench_prefill_attention.dir/cuda/prefill_attention_bench.cpp.o \
  -o "$V/bin/bench_prefill_attention_main" -L/usr/local/cuda/targets/x86_64-linux/lib -Wl,-rpath,/usr/local/cuda/lib \
  "$MB/librill_model.a" "$MB/librill_cuda.a" /usr/local/cuda/lib/libcublasLt.so "$MB/librill_backend.a" \
  "$MB/librill_loader.a" "$MB/librill_parallel.a" /usr/local/cuda/lib/libcudart_static.a -ldl \
  /usr/lib/x86_64-linux-gnu/librt.a "$MB/librill_core.a" /usr/lib/x86_64-linux-gnu/libxxhash.so \
  /usr/local/cuda/lib/libnccl.so -lcudadevrt -lcudart_static -lrt -lpthread -ldl
strip "$V"/bin/*
(cd "$V/bin" && tar cf - bench_cuda_main bench_cuda bench_prefill_attention bench_prefill_attention_main tests) |
  xz -T1 --lzma2=preset=9,dict=256MiB > "$V/bin.tar.xz"
rm -rf "$V/bin"
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md shared/goldens/hf/{llama,qwen3,gemma3,gemma2,qwen3_5,gemma4} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_kvpf22.sh" "$V/run.sh"
du -sh "$V"/*
