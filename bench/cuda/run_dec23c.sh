#!/bin/bash
# Device run of make_carry_dec23c.sh's pack: the tests (FILTER, at most
# TEST_LIMIT s) while the random Llama-3.1-8B is made, then `bench_cuda
# /tmp/llama8b --steps 16 --batches 1,64,128` (BATCHES) of main and of the
# branch, one after the other, then the branch's `bench_cuda none
# --mixed-attention 1` (decode attention on steps mixing one long context
# with short ones, the block chosen by the grid and by its working
# blocks), then, time allowing, ncu kernel times of one decode step at
# NCU_BATCHES (no graphs) for the branch. BUDGET: seconds from the start
# after which no new step starts. Logs under $OUT (one tar).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaAttention.*:LlamaFamily/CudaHf.*:Families/CudaBatchInvariant.*llama*'}
BUDGET=${BUDGET:-230}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda $V/bench_cuda_main
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
L=/tmp/logs; mkdir -p $L
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
(t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $L/make.log) &
MK=$!
cd /tmp
timeout ${TEST_LIMIT:-100} $V/tests --gtest_filter="${FILTER}" > $L/tests.log 2>&1; RC=$?
echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is" $L/tests.log | head -40
echo "OK: $(grep -c '^\[       OK' $L/tests.log)"; tail -3 $L/tests.log
wait $MK; tail -2 $L/make.log
B="--steps 16 --batches ${BATCHES:-1,64,128}"
run() {  # name, env..., binary
  local name=$1; shift
  [ $(left) -lt ${MIN_LEFT:-25} ] && { echo "== $name skipped (time)"; return; }
  local t0=$(date +%s)
  env "$@" $M $B > $L/b_$name.log 2> $L/e_$name.log
  echo "== $name rc=$? $(( $(date +%s) - t0 )) s"; grep -E "decode batch|prefill|TTFT|roofline" $L/b_$name.log | cut -c1-160
}
for r in ${RUNS:-main branch}; do
  case $r in
    main) run main timeout 60 $V/bench_cuda_main ;;
    branch) run branch timeout 60 $V/bench_cuda ;;
  esac
done
if [ $(left) -gt 15 ]; then
  t0=$(date +%s); timeout 30 $V/bench_cuda none --mixed-attention 1 > $L/mixed.log 2>&1
  echo "== mixed rc=$? $(( $(date +%s) - t0 )) s"; cat $L/mixed.log | cut -c1-260
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in ${NCU_BATCHES:-64}; do
  [ $(left) -lt ${MIN_LEFT:-25} ] && { echo "== ncu $b skipped (time)"; continue; }
  timeout $(( $(left) - 5 )) $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $V/bench_cuda $M --profile-step $b --graphs 0 > $L/ncu_branch_$b.csv 2>$L/ncu_branch_$b.err
  echo "== ncu branch $b rc=$? at $(( $(date +%s) - T0 )) s"
done
(cd $L && tar czf $OUT/logs.tar.gz .)
date -u
exit $RC
