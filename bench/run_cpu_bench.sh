#!/usr/bin/env bash
# One command for the CPU comparison: rill vs llama.cpp on the default model,
# same machine, same thread count, one run. Creates .venv-tools (llama-cpp-python
# compiled here with its default native flags, numpy, gguf) when needed,
# fetches the model when missing, and writes the markdown table to stdout and
# the JSON to $OUT (default build/bench/cpu_vs_llamacpp.json).
#   bench/run_cpu_bench.sh [--threads 2] [--rill build/rill] [--skip-rill] [--wait-quiet 600] ...
# Build rill first (make build); without a working build/rill the script still
# reports llama.cpp's numbers and names rill's failure. Run it on a quiet
# machine: the report prints the load average it started under.
#
# With --types LIST (e.g. Q4_K_M,Q8_0; `make bench-cpu BENCH_TYPES=...`) it
# instead compares per quant type on a random-weight Llama-3.2-1B-shape model
# (bench/make_bench_model.py) against llama.cpp's llama-bench, both built here
# (bench/build_llamacpp_tools.sh); JSON in build/bench/quant_types_vs_llamacpp.json.
#
# llama-cpp-python is compiled with explicit CPU flags and AMX off (the same
# as build_llamacpp_tools.sh): a -march=native build dies with SIGILL in
# ggml's AMX matmul on the Xeon hosts this runs on.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --types "* ]]; then
  tools/tools_venv.sh numpy gguf
  args=()
  while (($#)); do
    case "$1" in
      --skip-rill) shift ;;
      *) args+=("$1"); shift ;;
    esac
  done
  OUT=${OUT:-build/bench/quant_types_vs_llamacpp.json}
  mkdir -p "$(dirname "$OUT")"
  exec .venv-tools/bin/python bench/e2e/quant_types_vs_llamacpp.py --out "$OUT" "${args[@]}"
fi
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || bash scripts/setup.sh
CMAKE_ARGS="${CMAKE_ARGS:-$(bench/build_llamacpp_tools.sh --cmake-flags)}" tools/tools_venv.sh llama-cpp-python numpy gguf
OUT=${OUT:-build/bench/cpu_vs_llamacpp.json}
mkdir -p "$(dirname "$OUT")"
exec .venv-tools/bin/python bench/e2e/cpu_vs_llamacpp.py --out "$OUT" "$@"
