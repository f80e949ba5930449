#!/bin/bash
# Assembles the carry folder of the speculative-decoding + cache-tier device
# run (issues 21 and 16): rill and the GPU test binaries from BUILD_DIR
# (stripped, xz-compressed: a call carries at most 64 MiB), the Debian
# libraries they need, the HF goldens the GPU tests read, the random model
# maker with its tokenizer, cache_tier_bench.py and run_spec.sh. Then on an
# nvidia-h200 machine, with carry [".carry-spec"]:
#   bash .carry-spec/run_spec.sh          # GPU tests, replay-draft bench, CUDA tier bench
#   bash .carry-spec/run_spec.sh bench    # skip the tests
# Usage: make_carry_spec.sh BUILD_DIR [DEST] (DEST default: /work/main/.carry-spec,
# which .git/info/exclude must ignore). TESTS: the test binaries to carry
# (default: every tests/test_cuda_* but the multi-GPU ones).
set -euo pipefail
B=$(realpath "$1")
D=${2:-/work/main/.carry-spec}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
rm -rf "$D" && mkdir -p "$D/bin" "$D/lib" "$D/bench" "$D/shared/goldens/hf" "$D/shared/tools" "$D/shared/tokenizers"
TESTS=${TESTS:-$(cd "$B/tests" && ls test_cuda_* | grep -v -E "cmake|_tp_test|nccl_group")}
for t in $TESTS; do cp "$B/tests/$t" "$D/bin/"; done
[ -n "${NO_RILL:-}" ] || cp "$B/rill" "$D/bin/"
strip "$D"/bin/*
(cd "$D" && tar cJf bin.tar.xz bin && rm -rf bin)
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0 libspdlog.so.1.10 libfmt.so.9; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
(cd "$SHARED/goldens/hf" && tar cJf "$D/shared/goldens.tar.xz" --exclude='*.gguf' .)
cp "$SHARED/tools/make_random_model.py" "$D/shared/tools/"
cp -r "$SHARED/tokenizers/llama3" "$D/shared/tokenizers/"
cp "$SRC/bench/e2e/cache_tier_bench.py" "$SRC/bench/e2e/bench_common.py" "$D/bench/"
cp "$SRC/bench/cuda/run_spec.sh" "$D/"
du -sh "$D"
