#!/bin/bash
# Packs the wide-head prefill attention run (docs/perf.md, issue 20:
# head_dim 512) into /work/main/.device/$NAME (default g4pf; carry
# ".device/$NAME", run: bash .device/$NAME/run.sh): the CUDA attention and
# Gemma tests linked into one binary, bench_prefill_attention, bench_cuda
# and the family scripts (run_wide.sh says what runs).
#   make_carry_wide.sh [BUILD_DIR]   (built: those test targets, bench_cuda, bench_prefill_attention)
set -euo pipefail
B=$(realpath "${1:-build}")
SRC=$(dirname "$(realpath "$0")")
V=/work/main/.device/${NAME:-g4pf}
rm -rf $V && mkdir -p $V/lib $V/scripts
objs=""
for t in cuda_attention_test gemma4_hd512_cuda_test batch_invariant_cuda_test gemma_cuda_test kv_tiers_cuda_test; do
  objs="$objs $B/tests/CMakeFiles/test_cuda_$t.dir/cuda/$t.cpp.o"
done
cd $B
LIBS="-Wl,-rpath,/usr/local/cuda/lib librill_engine.a librill_cuda.a /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a /usr/lib/x86_64-linux-gnu/libgmock.a librill_kv.a librill_model.a librill_cuda.a /usr/local/cuda/lib/libcublasLt.so librill_backend.a librill_parallel.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/local/cuda/lib/libnccl.so librill_text.a librill_loader.a librill_core.a /usr/lib/x86_64-linux-gnu/libxxhash.so /usr/lib/x86_64-linux-gnu/libutf8proc.so /usr/lib/x86_64-linux-gnu/libpcre2-8.so /usr/lib/x86_64-linux-gnu/libgtest.a -lcudadevrt -lcudart_static -lrt -lpthread -ldl"
/usr/bin/c++ -O2 $objs -o $V/tests -L/usr/local/cuda/targets/x86_64-linux/lib $LIBS
cp bench/bench_cuda bench/bench_prefill_attention $V/
strip $V/tests $V/bench_cuda $V/bench_prefill_attention
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l $V/lib/; done
(cd /work && tar cJf $V/shared.tar.xz shared/goldens shared/tokenizers/qwen3)
cp $SRC/make_family_model.py $SRC/hf_family_peer.py $SRC/family_table.py $V/scripts/
xz -T2 -6 $V/tests $V/bench_cuda $V/bench_prefill_attention
cp $SRC/run_wide.sh $V/run.sh
chmod +x $V/run.sh
du -sh $V/*
