#!/usr/bin/env bash
# Creates (once) the venv for golden makers and peer benchmarks, .venv-tools,
# and installs the packages named on the command line into it. `make test`
# never needs it: goldens are committed.
#   tools/tools_venv.sh tokenizers jinja2 llama-cpp-python
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-tools/bin/python ] || python3 -m venv .venv-tools
need=()
for pkg in "$@"; do
  mod=$(echo "$pkg" | sed 's/-/_/g; s/llama_cpp_python/llama_cpp/; s/==.*//')
  .venv-tools/bin/python -c "import $mod" 2>/dev/null || need+=("$pkg")
done
if ((${#need[@]})); then .venv-tools/bin/pip install -q --disable-pip-version-check "${need[@]}"; fi
