#!/bin/bash
# Assembles the carry folders of the quantized-weights device run (issue 6):
# the model file (98 MB) is larger than one call may carry (64 MiB), so it
# travels in two halves over two back-to-back calls on the same warm machine:
#   DEST/p1: bins.tar.xz (GPU test binaries and rill from BUILD_DIR, the
#            Debian libraries they need, the HF goldens) + model half 1
#   DEST/p2: model half 2
# each with run_q.sh. Then, with carry [".cuda-carry-q/p1"] and right after
# it [".cuda-carry-q/p2"]:
#   bash .cuda-carry-q/p1/run_q.sh stash   # unpack into /tmp/q6, kernel tests
#   bash .cuda-carry-q/p2/run_q.sh all     # join the model, every GPU test, timings
# Usage: make_carry_q.sh BUILD_DIR [DEST] (DEST default: /work/main/.cuda-carry-q)
set -euo pipefail
B=$(realpath "$1")
D=${2:-/work/main/.cuda-carry-q}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SHARED=${RILL_SHARED_DIR:-/work/shared}
MODEL=${MODEL:-$SRC/models/SmolLM2-135M-Instruct.Q4_1.gguf}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin" "$T/lib" "$T/shared/goldens/hf"
for t in test_cuda_cuda_quant_test test_cuda_llama_cuda_quant_test test_cuda_llama_cuda_test \
         test_cuda_cuda_ops_test; do
  cp "$B/tests/$t" "$T/bin/"
done
cp "$B/rill" "$T/bin/"
strip "$T"/bin/*
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0; do cp -L /lib/x86_64-linux-gnu/$l "$T/lib/"; done
for g in llama llama3-tied mistral-swa qwen2 qwen3; do cp -r "$SHARED/goldens/hf/$g" "$T/shared/goldens/hf/"; done
rm -rf "$D" && mkdir -p "$D/p1" "$D/p2"
tar cJf "$D/p1/bins.tar.xz" -C "$T" bin lib shared
half=$(( ($(stat -c %s "$MODEL") + 1) / 2 ))
head -c $half "$MODEL" > "$D/p1/model.part1"
tail -c +$((half + 1)) "$MODEL" > "$D/p2/model.part2"
sha256sum "$MODEL" | cut -d' ' -f1 > "$D/p2/model.sha256"
cp "$SRC/bench/cuda/run_q.sh" "$D/p1/" && cp "$SRC/bench/cuda/run_q.sh" "$D/p2/"
du -sh "$D/p1" "$D/p2"
