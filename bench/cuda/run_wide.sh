#!/bin/bash
# Device side of make_carry_wide.sh (run from the repo root; results under
# $OUT): (1) the attention and Gemma tests; (2) bench_prefill_attention
# with the WMMA kernel, the wide kernel at 512 only, and at 256 and 512
# (NCU=1: then ncu's view of the 512 f16 kernel);
# (3) when the tests passed, Gemma-4 26B-A4B as shipped (random bf16
# weights made here) through bench_cuda in the same three settings, then
# transformers' prefill and batch-1 decode on the same files
# (hf_family_peer.py) and the table rows (family_table.py).
R=$PWD
V=$(dirname "$(realpath "$0")")
# Device side only: it links /work/main (and BUILT_IN, the checkout the
# binaries were built in, when not /work/main) to this tree and unpacks
# /work/shared, the binaries' compiled-in paths; never run it on a dev host.
[ -n "${OUT:-}" ] || { echo "run_wide.sh: \$OUT unset: this runs on the device machine only" >&2; exit 2; }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
[ -z "${BUILT_IN:-}" ] || ln -sfn $R "$BUILT_IN"
xz -d $V/*.xz && chmod +x $V/tests $V/bench_cuda $V/bench_prefill_attention
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "== tests $(date -u +%T)"
(cd /tmp && timeout ${TEST_TMO:-240} $V/tests ${FILTER:+--gtest_filter=$FILTER} > $OUT/tests.log 2>&1)
trc=$?
echo "tests rc=$trc, $(grep -c '^\[       OK' $OUT/tests.log) OK"
grep -E "^\[  PASSED|^\[  FAILED|^\[  SKIPPED|tests? ran|FAILED TEST" $OUT/tests.log | head -40
echo "== kernel bench $(date -u +%T)"
RILL_CUDA_FLASH_PREFILL=0 $V/bench_prefill_attention > $OUT/bench_wmma.txt 2>&1
RILL_CUDA_WIDE_PREFILL=512 $V/bench_prefill_attention --shapes full256,sliding > $OUT/bench_wide512.txt 2>&1
$V/bench_prefill_attention > $OUT/bench_wide.txt 2>&1
cat $OUT/bench_wmma.txt $OUT/bench_wide512.txt $OUT/bench_wide.txt
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then  # the 512 f16 kernel's profile (SM activity, issue rate)
  timeout 60 ncu -k regex:wide_prefill -s 3 -c 1 --section SpeedOfLight --section SchedulerStats --section Occupancy \
    $V/bench_prefill_attention --shapes full --types f16 > $OUT/ncu.txt 2>&1
  grep -E "Duration|SM Active|Elapsed Cycles|Issued Warp|Eligible Warps|Registers Per|Achieved Active" $OUT/ncu.txt
fi
[ "$trc" = 0 ] || [ "${E2E_ANYWAY:-0}" = 1 ] || exit 0
echo "== end to end $(date -u +%T)"
P=gemma4-26b-a4b M=/dev/shm/fam-gemma4-26b-a4b
timeout 120 python3 $V/scripts/make_family_model.py $P $M --jobs 16 --tokenizer /work/shared/tokenizers/qwen3 \
  > $OUT/make.log 2>&1
echo "made rc=$?: $(tail -1 $OUT/make.log | cut -c1-200)"
for setting in ${SETTINGS:-wide:1:x wide512:1:512 wmma:0:x}; do
  IFS=: read name flash wide <<< "$setting"
  [ "$flash" = 0 ] && export RILL_CUDA_FLASH_PREFILL=0 || unset RILL_CUDA_FLASH_PREFILL
  [ "$wide" = 512 ] && export RILL_CUDA_WIDE_PREFILL=512 || unset RILL_CUDA_WIDE_PREFILL
  timeout ${RILL_TMO:-120} $V/bench_cuda $M --batches ${BATCHES:-1} --steps ${STEPS:-8} --prefill 2048 \
    --json $OUT/rill-$name.json > $OUT/rill-$name.log 2>&1
  echo "-- rill $name rc=$? $(date -u +%T)"
  grep -E "^(device|ceilings|model|KV cache|prefill|decode)|rror" $OUT/rill-$name.log | cut -c1-300
done
unset RILL_CUDA_FLASH_PREFILL RILL_CUDA_WIDE_PREFILL
timeout ${PEER_TMO:-200} python3 $V/scripts/hf_family_peer.py $M --batches ${BATCHES:-1} --steps 4 --prefill 2048 \
  --budget ${PEER_BUDGET:-150} --json $OUT/peer.json > $OUT/peer.log 2>&1
echo "-- transformers rc=$? $(date -u +%T)"
grep -E "^hf peer|Error|rror:" $OUT/peer.log | cut -c1-300 | tail -12
python3 $V/scripts/family_table.py $P $M $OUT/rill-wide.json $OUT/peer.json 2>&1 | tail -12
rm -rf $M
echo "== done $(date -u +%T)"
