#!/bin/bash
# Packs the KV-type GPU tests and the benchmarks of BUILD_DIR into DEST
# (default /work/main/.device/kvcuda22; carry ".device/kvcuda22") beside
# run_kvtypes.sh (as DEST/run.sh): the KV-type test objects and the backend
# ops test linked into one gtest binary (tests), bench_cuda and
# bench_kv_attention, stripped and xz'd, the Debian libraries they need,
# the goldens they read and the 8B model maker (about 18 MB: a call carries
# the tracked tree, 40 MB, too, within 64 MiB).
# Usage: make_carry_kvtypes.sh BUILD_DIR [DEST]
# TABLE_ONLY=1: only what table.sh needs (bench_cuda, the model maker and
# its tokenizer; about 23 MB, default DEST .device/kv22t), so the pack fits
# beside make_carry_verify.sh's in one call (with tests/data moved aside:
# the tracked tree counts toward the 64 MiB too).
set -euo pipefail
B=$(realpath "$1")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
if [ "${TABLE_ONLY:-0}" = 1 ]; then
  V=${2:-/work/main/.device/kv22t}
  rm -rf "$V" && mkdir -p "$V/lib"
  cp "$B/bench/bench_cuda" "$V/" && strip "$V/bench_cuda"
  (cd "$V" && XZ_OPT="-9e -T2" tar cJf bins.tar.xz bench_cuda && rm bench_cuda)
  for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
  (cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/tools/make_random_model.py shared/tokenizers/llama3)
  cp "$SRC/bench/cuda/run_kv22table.sh" "$V/table.sh"
  du -sh "$V"/*
  exit 0
fi
V=${2:-/work/main/.device/kvcuda22}
rm -rf "$V" && mkdir -p "$V/lib"
cd "$B"
objs="tests/CMakeFiles/test_backend_backend_ops_test.dir/backend/backend_ops_test.cpp.o"
for t in kv_types_cuda_test kv_tiers_cuda_test batch_invariant_cuda_test cuda_attention_test gemma4_hd512_cuda_test \
         llama_cuda_test kv_probe_cuda_test kv_store_cuda_test; do
  objs="$objs tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
# shellcheck disable=SC2086
/usr/bin/c++ -O2 $objs -o "$V/tests" -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda bench/bench_kv_attention "$V/"
strip "$V/tests" "$V/bench_cuda" "$V/bench_kv_attention"
# One solid archive: the three binaries hold the same kernels, which xz
# then stores once (12 MB where three .xz files took 27).
(cd "$V" && XZ_OPT="-9e -T2" tar cJf bins.tar.xz tests bench_cuda bench_kv_attention && rm tests bench_cuda bench_kv_attention)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$V/lib/"; done
(cd "$SHARED/.." && tar cJf "$V/shared.tar.xz" shared/goldens/README.md shared/goldens/hf/{llama,qwen3,gemma3,gemma2,qwen3_5,gemma4} \
  shared/tokenizers/llama3 shared/tools/make_random_model.py)
cp "$SRC/bench/cuda/run_kvtypes.sh" "$V/run.sh"
cp "$SRC/bench/cuda/run_kv22table.sh" "$V/table.sh"
cp "$SRC/bench/cuda/run_mmadec22.sh" "$V/mmadec.sh"
cp "$SRC/bench/cuda/run_mmaocc22.sh" "$V/occ.sh"
du -sh "$V"/*
