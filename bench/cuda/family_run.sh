#!/bin/bash
# Device side of the model-family table (docs/perf.md, issue 20): for each
# preset named in MODELS (make_family_model.py's), make the random-weight
# model (in /dev/shm when it has room, else /tmp), run bench_cuda on it
# (rill: prefill PREFILL tokens, decode at BATCHES, STEPS steps), then
# hf_family_peer.py (transformers, same files, same batches), print the
# table rows (family_table.py), and delete the model before the next.
# Run from a folder holding bin/bench_cuda and scripts/ (the three .py);
# JSON and logs under out/. Every step has its own timeout; the caller
# sets the overall one. PREFETCH=1: the next model is written (niced,
# PREFETCH_JOBS processes) while the peer runs, when /dev/shm holds both. PEER_ONLY="a b": the peer for those presets only.
#   MODELS="deepseek-v2-lite gpt-oss-20b gemma4-26b-a4b" BATCHES=1,64 bash family_run.sh
set -u
MODELS=${MODELS:-deepseek-v2-lite}
BATCHES=${BATCHES:-1,64}
STEPS=${STEPS:-16}
PEER_STEPS=${PEER_STEPS:-8}
PREFILL=${PREFILL:-2048}
mkdir -p out
export PYTHONUNBUFFERED=1
TOK=${COMMON:-/nonexistent}/shared/tokenizers/qwen3
[ -d "$TOK" ] && TOKARG="--tokenizer $TOK" || TOKARG=""
echo "family_run: $(date -u +%FT%TZ) $(nproc) cores; $(free -g | awk '/Mem:/ {print $2 " GiB RAM, " $7 " available"}')"
df -h /dev/shm /tmp | tail -n +2 | awk '{print "  " $6 ": " $4 " free"}'
python3 -c "import torch, transformers; print('  torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tail -1
# need_gb NAME: GiB the preset's weights take, plus 2.
need_gb() {
  python3 -c "import sys; sys.path.insert(0, 'scripts'); import make_family_model as m
print(sum(m.numel(s) for _, s in m.tensors_of(m.PRESETS['$1'])) * 2 // 2**30 + 2)"
}
shm_free_gb() { df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9; }
# make_dir NAME: writes preset NAME into /dev/shm when it has room (else /tmp)
# and records where in out/path-NAME and how it went in out/made-NAME.
make_dir() {
  local name=$1 M t0 rc
  [ "$(shm_free_gb)" -gt "$(need_gb $name)" ] && M=/dev/shm/fam-$name || M=/tmp/fam-$name
  echo $M > out/path-$name
  t0=$(date +%s)
  timeout 150 python3 scripts/make_family_model.py $name $M $TOKARG ${MAKE_JOBS:+--jobs $MAKE_JOBS} \
    > out/make-$name.log 2>&1
  rc=$?
  echo "== $name: made in $(( $(date +%s) - t0 )) s at $M (rc $rc): $(tail -1 out/make-$name.log | cut -c1-200)" \
    > out/made-$name
}
names=($MODELS)
make_dir ${names[0]}
maker=""
for i in "${!names[@]}"; do
  name=${names[$i]} next=${names[$((i + 1))]:-}
  [ -n "$maker" ] && wait $maker
  maker=""
  cat out/made-$name
  M=$(cat out/path-$name)
  t0=$(date +%s)
  timeout 200 ./bin/bench_cuda $M --batches $BATCHES --steps $STEPS --prefill $PREFILL --json out/rill-$name.json \
    > out/rill-$name.log 2>&1
  rc=$?
  echo "-- rill bench_cuda rc $rc in $(( $(date +%s) - t0 )) s:"
  grep -E "^(device|ceilings|model|MoE|KV cache|prefill|decode)|rror|fail" out/rill-$name.log | cut -c1-330
  [ $rc -ne 0 ] && tail -3 out/rill-$name.log | cut -c1-330
  # The next model, niced, while the peer runs (when /dev/shm holds both).
  if [ -n "$next" ] && [ "${PREFETCH:-0}" = 1 ] && [ "$(shm_free_gb)" -gt "$(need_gb $next)" ]; then
    MAKE_JOBS=${PREFETCH_JOBS:-4} nice -n 19 \
      bash -c "$(declare -f need_gb shm_free_gb make_dir); TOKARG='$TOKARG'; make_dir $next" &
    maker=$!
  fi
  t0=$(date +%s)
  if [ -n "${PEER_ONLY:-}" ] && ! [[ " $PEER_ONLY " == *" $name "* ]]; then
    python3 scripts/family_table.py $name $M out/rill-$name.json none 2>&1 | grep -v "^JSON"
    rm -rf $M
    [ -n "$next" ] && [ -z "$maker" ] && make_dir $next
    continue
  fi
  timeout ${PEER_TIMEOUT:-200} python3 scripts/hf_family_peer.py $M --batches $BATCHES --steps $PEER_STEPS \
    --prefill $PREFILL --budget ${PEER_BUDGET:-120} --json out/peer-$name.json > out/peer-$name.log 2>&1
  rc=$?
  echo "-- transformers peer rc $rc in $(( $(date +%s) - t0 )) s:"
  grep -E "^hf peer|Error|rror:" out/peer-$name.log | cut -c1-330 | tail -12
  [ $rc -ne 0 ] && tail -3 out/peer-$name.log | cut -c1-330
  python3 scripts/family_table.py $name $M out/rill-$name.json out/peer-$name.json 2>&1
  rm -rf $M
  [ -n "$next" ] && [ -z "$maker" ] && make_dir $next
done
