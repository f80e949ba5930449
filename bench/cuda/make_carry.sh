#!/bin/bash
# Assembles .cuda-carry/ (ignored by git; add "/.cuda-carry/" to
# .git/info/exclude) for a run on a GPU machine that has CUDA 13 but none of
# rill's Debian libraries: the GPU test binaries, bench_cuda and rill from
# build-cuda/, the shared libraries they need, the HF goldens, the random
# model maker with its tokenizer, and the scripts. Then on the GPU machine:
#   bash .cuda-carry/device_run.sh           # tests, 8B benchmark, transformers baseline
#   bash .cuda-carry/device_run.sh tests     # GPU tests only
# BASE_DIR (optional): a folder with bench_cuda and rill of an earlier build,
# carried as bin/bench_cuda_base and bin/rill_base so that device_run.sh
# measures the earlier build in the same run (before/after on one machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD_DIR:-build-cuda}
C=.cuda-carry
SHARED=${RILL_SHARED_DIR:-../shared}
rm -rf $C && mkdir -p $C/bin $C/lib $C/bench $C/shared/goldens/hf $C/shared/tools $C/shared/tokenizers
cp $B/tests/test_cuda_* $C/bin/ 2>/dev/null || true
rm -f $C/bin/*.cmake
cp $B/bench/bench_cuda $B/rill $C/bin/
if [ -n "${BASE_DIR:-}" ]; then cp $BASE_DIR/bench_cuda $C/bin/bench_cuda_base; cp $BASE_DIR/rill $C/bin/rill_base; fi
strip $C/bin/*
gzip -6 $C/bin/*  # the working tree and the carry travel within 64 MiB; device_run.sh unpacks
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l $C/lib/; done
for g in llama llama3-tied mistral-swa qwen2 qwen3; do cp -r $SHARED/goldens/hf/$g $C/shared/goldens/hf/; done
cp $SHARED/tools/make_random_model.py $C/shared/tools/
cp -r $SHARED/tokenizers/llama3 $C/shared/tokenizers/
cp bench/cuda/hf_baseline.py $C/bench/
cp bench/cuda/device_run.sh $C/
chmod -R u+w $C
du -sh $C
