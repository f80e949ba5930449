#!/bin/bash
# Packs the q8dp4a23 device run (issue 23: the Q8_0 dp4a decode GEMV beside
# main and llama.cpp CUDA) into DEST (default .device/q8dp4a23 of this
# checkout; carry ".device/q8dp4a23", run `bash .device/q8dp4a23/run.sh`):
#  bin/  bench_new (BUILD_DIR's bench_cuda: has q8_dp4a and RILL_Q8_DP4A),
#        bench_main (MAIN_BUILD's bench_cuda: the baseline), test_q8_dp4a
#        (tests/cuda/q8_dp4a_test.cpp; TESTS=1 only), llama-quantize (CPU build) and
#        llama-batched-bench
#        (CUDA build) from LLAMACPP (default /work/main/build/llamacpp,
#        bench/build_llamacpp_tools.sh [--cuda]), py/ (make_bench_model.py,
#        tools_venv.py, llama.cpp's gguf-py, PyYAML's pure-Python part);
#        stripped, one tar | xz -9e with a 256 MiB window (the binaries
#        compress against each other: 2.6 MB less than the 64 MiB default)
#  lib/  the Debian libraries the device lacks (libgomp for llama-quantize);
#  run.sh  bench/cuda/run_q8dp4a23.sh.
# Usage: make_carry_q8dp4a23.sh BUILD_DIR MAIN_BUILD [DEST]
set -euo pipefail
B=$(realpath "$1")
M=$(realpath "$2")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
D=${3:-$SRC/.device/q8dp4a23}
L=${LLAMACPP:-/work/main/build/llamacpp}
GGUF_PY=$L/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin/py/bench" "$T/bin/py/tools" "$T/bin/py/fallback/yaml"
# RILL=0 leaves rill's benchmark out (a carry for llama.cpp's side only,
# run with PARTS="model llama": with both, the carry and the tree pass the
# run tool's 64 MiB).
if [ "${RILL:-1}" = 1 ]; then
  cp "$B/bench/bench_cuda" "$T/bin/bench_new"
  # The same build as the baseline (after the merge, main is the branch and
  # RILL_Q8_DP4A=0 is main's path): a hard link, which tar stores once.
  [ "$B" = "$M" ] || cp "$M/bench/bench_cuda" "$T/bin/bench_main"
fi
# The kernel's tests: with TESTS=1 only (the verify call runs them too).
[ "${TESTS:-0}" = 1 ] && cp "$B/tests/test_cuda_q8_dp4a_test" "$T/bin/test_q8_dp4a"
# RANDOM_BLOCKS=1 leaves llama-quantize out (6 MB): the device then writes
# the Q8_0 file as random blocks (make_bench_model.py --random-blocks; the
# same tensors and bytes, for speed only), which keeps the carry and the
# tree under the run tool's 64 MiB.
[ "${RANDOM_BLOCKS:-0}" = 1 ] || cp "$L/build/bin/llama-quantize" "$T/bin/"
# LLAMA_BINS="" leaves llama.cpp's CUDA benchmark out (the run tool counts
# more than this script's sum; run it in a call of its own, KEEP_MODEL=1).
for b in ${LLAMA_BINS-llama-batched-bench}; do
  if [ -x "$L/build-cuda/bin/$b" ]; then cp "$L/build-cuda/bin/$b" "$T/bin/"; else echo "no $b: rill only" >&2; fi
done
strip "$T"/bin/bench_* "$T"/bin/llama-* 2> /dev/null || true  # whichever are there

[ -f "$T/bin/test_q8_dp4a" ] && strip "$T/bin/test_q8_dp4a"
[ "$B" = "$M" ] && [ -f "$T/bin/bench_new" ] && ln "$T/bin/bench_new" "$T/bin/bench_main"
cp "$SRC/bench/make_bench_model.py" "$T/bin/py/bench/"
cp "$SRC/tools/tools_venv.py" "$T/bin/py/tools/"
cp -r "$GGUF_PY" "$T/bin/py/gguf"
rm -rf "$T/bin/py/gguf/scripts"  # gguf's command-line tools: not imported
Y=$(ls -d "$SRC"/.venv-tools/lib/python3*/site-packages/yaml | head -1)
cp "$Y"/*.py "$T/bin/py/fallback/yaml/"
find "$T/bin/py" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$D" && mkdir -p "$D/lib"
tar cf - -C "$T" bin | nice xz --lzma2=preset=9e,dict=256MiB -T1 > "$D/bin.tar.xz"
for l in libxxhash.so.0 libutf8proc.so.2 libpcre2-8.so.0 libgomp.so.1; do cp -L /lib/x86_64-linux-gnu/$l "$D/lib/"; done
cp "$SRC/bench/cuda/run_q8dp4a23.sh" "$D/run.sh"
cp "$SRC/bench/cuda/device_out.sh" "$D/"
du -sh "$D" "$D"/*
# The run tool carries the tracked tree and this folder, 64 MiB in all.
TREE=$(cd "$SRC" && git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
CARRY=$(du -cb "$D" | tail -1 | cut -f1)
echo "tree $TREE + carry $CARRY = $((TREE + CARRY)) bytes (limit $((64 << 20)))"
[ $((TREE + CARRY)) -le $((64 << 20)) ] || echo "warning: over the run tool's 64 MiB" >&2
