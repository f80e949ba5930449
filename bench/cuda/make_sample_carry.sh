#!/bin/bash
# Assembles .cuda-carry-s/ (git-ignored) for a device run of the sampling
# work: the GPU sampling and llama tests, rill, the Debian libraries they
# need, the tiny HF goldens, the Llama-3 tokenizer, the small-model
# maker and sample_run.sh. Then on the GPU machine:
#   bash .cuda-carry-s/sample_run.sh            # tests, kernel times, engine bench
# BUILD_DIR: the CUDA build (default build-cuda); RILL_SHARED_DIR: ../shared.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD_DIR:-build-cuda}
C=${CARRY_DIR:-.cuda-carry-s}
SHARED=${RILL_SHARED_DIR:-../shared}
rm -rf $C && mkdir -p $C/bin $C/lib $C/shared/goldens/hf $C/shared/tokenizers
cp $B/tests/test_cuda_cuda_sampling_test $B/tests/test_cuda_llama_cuda_test $B/rill $C/bin/
strip $C/bin/*
gzip -6 $C/bin/*  # the carry travels within 64 MiB; sample_run.sh unpacks
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l $C/lib/; done
for g in llama llama3-tied mistral-swa qwen2 qwen3; do cp -r $SHARED/goldens/hf/$g $C/shared/goldens/hf/; done
cp -r $SHARED/tokenizers/llama3 $C/shared/tokenizers/
cp bench/cuda/make_small_model.py bench/cuda/sample_run.sh $C/
chmod -R u+w $C
du -sh $C
