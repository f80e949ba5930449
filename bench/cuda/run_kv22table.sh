#!/bin/bash
# Device run for issue 22's GPU table: the random Llama-3.1-8B bf16 decode
# at batches 1 and 64 per KV type and context, prefill 2,048, and how many
# 4,096-token sequences the pool rill serve would make holds
# (bench_cuda --kv-fit), every type in one call on one card. Uses
# make_carry_kvtypes.sh's pack (it copies this script as table.sh):
#   bash bench/cuda/make_carry_kvtypes.sh build-cpu
#   run: bash .device/kvcuda22/table.sh   (carry [".device/kvcuda22"]; or the
#   smaller TABLE_ONLY=1 pack: .device/kv22t/table.sh)
# TYPES: the KV types (default every CUDA type); CTXS: the contexts, in the
# order they run (default 4,096 then 8,192 then 1,024: the cells perf.md
# lacks first); FIT: --kv-fit's memory fraction (default 0.90); CELLS:
# type:context pairs instead of the grid; BUDGET:
# seconds after which no new run starts (default 540); a run gets at most
# RUN_S seconds (default 45). A batch that does not fit the card (f16 at
# 64 x 8,192 on an 80 GB card) fails its run alone, named in its log.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
TYPES=${TYPES:-"f16 q8_0 q4_0 fp8 q8_0h q4_0h iq4_nlh q8_0h64 k4c k4a"}
CTXS=${CTXS:-"4096 8192 1024"}
FIT=${FIT:-0.90}
BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn "$R" /work/main && (cd /work && tar xJf "$V/shared.tar.xz")
tar xJf "$V/bins.tar.xz" -C "$V"
chmod +x "$V/bench_cuda"
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
# A warm machine keeps /tmp: the second call of a split table reuses the model.
if [ ! -f $M.done ]; then
  t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > "$OUT/make.log" 2>&1
  rc=$?; echo "make model rc=$rc $(( $(date +%s) - t0 )) s"; [ $rc -eq 0 ] && touch $M.done
else
  echo "model: reusing $M"
fi
cd /tmp
# CELLS ("type:context ..."), when set, replaces the TYPES x CTXS grid: the
# cells a table still lacks, in the order given.
if [ -z "${CELLS:-}" ]; then
  for c in $CTXS; do for t in $TYPES; do CELLS="${CELLS:-} $t:$c"; done; done
fi
for cell in $CELLS; do
  t=${cell%:*}; c=${cell#*:}
  {
    if [ "$(left)" -lt "${RUN_S:-45}" ]; then echo "== $t ctx $c skipped (time)"; continue; fi
    log=$OUT/ctx${c}_$t.log
    timeout "${RUN_S:-45}" "$V/bench_cuda" $M --steps 16 --batches 1,64 --context "$c" --kv-type "$t" --kv-fit "$FIT" \
      > "$log" 2>&1
    echo "== $t ctx $c rc=$? at $(( $(date +%s) - T0 )) s"
    grep -E "KV cache|KV pool|KV tails|decode|prefill|batch +[0-9]|rror" "$log" | cut -c1-200
  }
done
date -u
