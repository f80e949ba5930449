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
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || bash scripts/setup.sh
tools/tools_venv.sh llama-cpp-python numpy gguf
OUT=${OUT:-build/bench/cpu_vs_llamacpp.json}
mkdir -p "$(dirname "$OUT")"
exec .venv-tools/bin/python bench/e2e/cpu_vs_llamacpp.py --out "$OUT" "$@"
