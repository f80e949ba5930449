#!/bin/bash
# Assembles a GPU queue request folder for the model-family table
# (family_run.sh on the device): bin.tar.xz with the stripped bench_cuda,
# scripts/ (the maker, the transformers peer, the table), the common
# env.sh / lib / goldens, and run.sh, which runs family_run.sh with the
# given settings under one overall timeout (NOTE: a line for its header,
# say what each step costs).
#   make_family_request.sh BUILD_DIR DEST TIMEOUT_S [VAR=VALUE ...]
#   (e.g. MODELS="deepseek-v2-lite" BATCHES=1; see family_run.sh)
set -euo pipefail
B=$(realpath "$1") D=$2 TMO=$3
shift 3
SRC=$(cd "$(dirname "$0")" && pwd)
COMMON_DIR=${GPU_COMMON:-/work/gpu_common}
rm -rf "$D"/bin.tar.xz "$D"/bin "$D"/scripts "$D"/lib "$D"/run.sh "$D"/READY "$D"/DONE "$D"/result.txt
mkdir -p "$D/bin" "$D/scripts"
cp "$B/bench/bench_cuda" "$D/bin/" && strip "$D/bin/bench_cuda"
(cd "$D" && tar cJf bin.tar.xz bin && rm -rf bin)
cp "$SRC"/make_family_model.py "$SRC"/hf_family_peer.py "$SRC"/family_table.py "$SRC"/family_run.sh "$D/scripts/"
cp -r "$COMMON_DIR/lib" "$D/lib"
cp "$COMMON_DIR/goldens.tar.xz" "$COMMON_DIR/env.sh" "$D/"
{
  echo "#!/bin/bash"
  echo "# famlbench: the model-family table (docs/perf.md): per model, make the random"
  echo "# weights, bench_cuda (rill), transformers on the same files, the table rows."
  [ -n "${NOTE:-}" ] && echo "# $NOTE"
  echo "# Hard limit: the whole request is killed after $TMO s."
  echo "source ./env.sh"
  echo "set +e"
  printf 'export %q\n' "$@"
  echo "timeout -k 5 $TMO bash scripts/family_run.sh"
  echo "echo \"famlbench rc \$? after \$SECONDS s\""
  echo "rm -rf /dev/shm/fam-* /tmp/fam-*"
} > "$D/run.sh"
chmod +x "$D/run.sh"
du -sh "$D"
