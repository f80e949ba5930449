#!/bin/bash
# Device run of the KV-type GPU tests, then one layer's decode attention per
# KV type and the random Llama-3.1-8B bf16 decode / prefill per KV type (all
# types side by side in one call). The repo root is the cwd; the script
# runs from the carried folder (make_carry_kvtypes.sh's DEST) it lies in.
# FILTER: the gtest filter of the KV-type tests (default: the ones that hold
# q8_0h64 and the rotated types); OPS_FILTER: the backend ops tests' filter;
# TYPES: the KV types benchmarked (default "f16 q8_0h q8_0h64");
# BUDGET: seconds from the start after which no new step starts (the
# benchmarks' steps are skipped in order of priority: tests, attention
# alone, context 1,024, context 8,192, ncu); MIN_LEFT: the seconds a
# benchmark step needs left to start (default 40).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaKvTypes.*:CudaAttention.StoredKvTypes*:CudaAttention.HeadDim512*:CudaAttention.DecodeTokensAreBatchInvariant:*CudaKvTiers.*q8_0h64*:CudaKvExport.Q8_0h64*:*CudaBatchInvariant.*q8_0h64*:CudaGemma4Hd512.QuantizedKv*:*CudaHf.KvTypeIsTheOne*'}
OPS_FILTER=${OPS_FILTER:-'*BackendOps.RotatedKvStore*:*BackendOps.AttentionOverPagedKv*'}
TYPES=${TYPES:-"f16 q8_0h q8_0h64"}
BUDGET=${BUDGET:-300}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda $V/bench_kv_attention
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
# The model is made on the CPU while the tests use the GPU.
(t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
show() { grep -E "^\[ cuda|^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | head -${2:-80}; }
cd /tmp
timeout 60 $V/tests --gtest_filter="${OPS_FILTER}" > $OUT/ops.log 2>&1; RC_OPS=$?; echo "ops rc=$RC_OPS"; show $OUT/ops.log 30
timeout 120 $V/tests --gtest_filter="${FILTER}" > $OUT/tests.log 2>&1; RC_TESTS=$?; echo "tests rc=$RC_TESTS"; show $OUT/tests.log 60
grep -c "^\[       OK" $OUT/tests.log $OUT/ops.log; echo "tests done at $(( $(date +%s) - T0 )) s"
csv=$(echo $TYPES | tr ' ' ,)
timeout 60 $V/bench_kv_attention --contexts 1024,8192 --batches 1,64 --types $csv > $OUT/attn.log 2>&1
echo "attn rc=$?"; cut -c1-120 $OUT/attn.log
wait $MK; tail -2 $OUT/make.log
B=$V/bench_cuda
for t in $TYPES; do
  [ $(left) -lt ${MIN_LEFT:-40} ] && { echo "== $t ctx 1024 skipped (time)"; continue; }
  timeout 45 $B $M --steps 16 --batches 1,64 --context 1024 --kv-type $t > $OUT/b1024_$t.log 2>&1
  echo "== $t ctx 1024 rc=$?"; grep -E "KV|decode|prefill|TTFT|batch +[0-9]" $OUT/b1024_$t.log | cut -c1-200
done
for t in $TYPES; do
  [ $(left) -lt ${MIN_LEFT:-40} ] && { echo "== $t ctx 8192 skipped (time)"; continue; }
  timeout 40 $B $M --steps 16 --batches 1,16 --context 8192 --kv-type $t > $OUT/b8192_$t.log 2>&1
  echo "== $t ctx 8192 rc=$?"; grep -E "decode|batch +[0-9]" $OUT/b8192_$t.log | cut -c1-200
done
# ncu: the fast decode kernel per type (one layer, context 8,192, batch 64).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ $(left) -gt 30 ] && [ -n "$NCU" ]; then
  for t in ${NCU_TYPES:-q8_0h q8_0h64}; do
    timeout 25 $NCU --clock-control none -k regex:decode_fast_kernel -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section LaunchStats --section Occupancy $V/bench_kv_attention --contexts 8192 --batches 64 --types $t > $OUT/ncu_$t.log 2>&1
    echo "== ncu $t rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Dynamic Shared|L1/TEX Hit|L2 Hit" $OUT/ncu_$t.log | head -12
  done
fi
date -u
# The benchmarks' own failures show in their logs; the tests decide the status.
[ "$RC_OPS" -eq 0 ] && [ "$RC_TESTS" -eq 0 ]
