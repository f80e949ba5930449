#!/bin/bash
# Device run of make_carry_rotst22.sh's pack: the rotated store's tests
# (FILTER), then bench_cuda of main and of the branch back to back per KV
# type (TYPES) on the random Llama-3.1-8B made here. BUDGET: seconds from
# the start after which no new benchmark starts.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'*BackendOps.RotatedKvStoreIsTheCpuEncodersBytes*:CudaKvRotated.*:CudaKvTypes.*:*RotatedTypes*:CudaAttention.StoredKvTypes*'}
TYPES=${TYPES:-"q8_0h iq4_nlh q4_0h f16"}
BUDGET=${BUDGET:-220}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda $V/bench_cuda_main
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
(t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
cd /tmp
timeout 90 $V/tests --gtest_filter="${FILTER}" > $OUT/tests.log 2>&1; RC=$?
echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is" $OUT/tests.log | head -40
grep -c "^\[       OK" $OUT/tests.log
wait $MK; tail -2 $OUT/make.log
for t in $TYPES; do
  for b in main branch; do
    [ $(left) -lt ${MIN_LEFT:-20} ] && { echo "== $t $b skipped (time)"; continue; }
    bin=$V/bench_cuda; [ $b = main ] && bin=$V/bench_cuda_main
    timeout 40 $bin $M --steps 16 --batches 1,64 --context 1024 --kv-type $t > $OUT/b_${t}_$b.log 2>&1
    echo "== $t $b rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "decode|prefill|TTFT|batch +[0-9]" $OUT/b_${t}_$b.log | cut -c1-160
  done
done
date -u
exit $RC
