#!/bin/bash
# Assembles a GPU request folder for bench/cuda/gguf_vs_llamacpp.sh (GGUF on
# CUDA, rill vs llama.cpp, issue 23): bin.tar.xz with bin/ = bench_cuda from
# BUILD_DIR, llama-bench and llama-batched-bench (bench/build_llamacpp_tools.sh
# --cuda), llama-quantize (the CPU build), the GPU test binaries named in
# $TESTS (run first by run.sh, each `./bin/NAME`), and py/ = make_bench_model.py,
# tools_venv.py, gguf-py from the same llama.cpp source package and PyYAML's
# pure-Python part (gguf imports yaml; the device may have no PyYAML);
# libgomp beside the common libraries.
# Usage: make_gguf_request.sh BUILD_DIR DEST (DEST gets bin.tar.xz, lib/,
# env.sh, goldens.tar.xz and run.sh; touch DEST/READY yourself).
set -euo pipefail
B=$(realpath "$1")
D=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
L=$SRC/build/llamacpp
GGUF_PY=$L/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf
QUANTIZE=${QUANTIZE:-$L/build/bin/llama-quantize}
COMMON=${GPU_COMMON:-/work/gpu_common}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/bin/py/bench" "$T/bin/py/tools" "$T/bin/py/fallback"
cp "$B/bench/bench_cuda" "$QUANTIZE" "$T/bin/"
for b in llama-bench llama-batched-bench; do  # absent: rill only (say so)
  if [ -x "$L/build-cuda/bin/$b" ]; then cp "$L/build-cuda/bin/$b" "$T/bin/"; else echo "no $b (bench/build_llamacpp_tools.sh --cuda)" >&2; fi
done
for t in ${TESTS:-}; do cp "$B/tests/$t" "$T/bin/"; done
strip "$T"/bin/bench_cuda "$T"/bin/llama-* ${TESTS:+$(printf "$T/bin/%s " $TESTS)}
cp "$SRC/bench/make_bench_model.py" "$T/bin/py/bench/"
cp "$SRC/tools/tools_venv.py" "$T/bin/py/tools/"
cp -r "$GGUF_PY" "$T/bin/py/gguf"
Y=$(ls -d "$SRC"/.venv-tools/lib/python3*/site-packages/yaml | head -1)
mkdir -p "$T/bin/py/fallback/yaml" && cp "$Y"/*.py "$T/bin/py/fallback/yaml/"
find "$T/bin/py" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$D" && mkdir -p "$D"
tar cf - -C "$T" bin | xz -9 -T1 > "$D/bin.tar.xz"  # -9: a 64 MiB window, the two llama tools share most bytes
cp -r "$COMMON/lib" "$D/lib" && cp -L /lib/x86_64-linux-gnu/libgomp.so.1 "$D/lib/"
cp "$COMMON/goldens.tar.xz" "$COMMON/env.sh" "$D/"
cp "$SRC/bench/cuda/gguf_vs_llamacpp.sh" "$D/run.sh"
du -sh "$D" "$D/bin.tar.xz"
