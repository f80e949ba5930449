#!/bin/bash
# Device run of branch kvcuda22 (iq4_nlh on CUDA): the KV-type GPU tests, then
# the random Llama-3.1-8B bf16 decode / prefill / KV-fit per KV type. The
# repo root is the cwd.
# FILTER: the gtest filter of the KV-type tests (default: the ones that hold
# iq4_nlh and the rotated types).
T0=$(date +%s)
R=$PWD; V=$R/.device/kvcuda22
FILTER=${FILTER:-'*CudaKvQ8.RotatedTypes*:CudaKvRotated.*:CudaKvTypes.*:CudaAttention.StoredKvTypes*:CudaAttention.HeadDim512*:*CudaKvTiers.*iq4_nlh*:*CudaKvTiersRam.*iq4_nlh*:CudaKvExport.RotatedKvHasTheCpuLayout:*CudaBatchInvariant.*iq4_nlh*:CudaGemma4Hd512.QuantizedKv*:*CudaHf.KvTypeIsTheOne*'}
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
for f in $V/*.xz; do [ "${f##*/}" = shared.tar.xz ] || xz -d $f; done
chmod +x $V/tests $V/bench_cuda
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
M=/tmp/llama8b
# The model is made on the CPU while the tests use the GPU.
(t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
show() { grep -E "^\[ cuda|^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | head -${2:-80}; }
cd /tmp
timeout 60 $V/tests --gtest_filter='*BackendOps.RotatedKvStore*:*BackendOps.AttentionOverPagedKv*:*BackendOps.RopeQkNormAndKvStore*' > $OUT/ops.log 2>&1; RC_OPS=$?; echo "ops rc=$RC_OPS"; show $OUT/ops.log 30
timeout 150 $V/tests --gtest_filter="${FILTER}" > $OUT/tests.log 2>&1; RC_TESTS=$?; echo "tests rc=$RC_TESTS"; show $OUT/tests.log 120
grep -c "^\[       OK" $OUT/tests.log $OUT/ops.log; echo "tests done at $(( $(date +%s) - T0 )) s"
wait $MK; cat $OUT/make.log | tail -2
B=$V/bench_cuda
for t in f16 q8_0 q4_0h iq4_nlh; do
  timeout 45 $B $M --steps 16 --batches 1,64 --context 1024 --kv-type $t --kv-fit 0.9 > $OUT/b1024_$t.log 2>&1
  echo "== $t ctx 1024 rc=$?"; grep -E "KV|decode|prefill|TTFT|batch +[0-9]" $OUT/b1024_$t.log | cut -c1-220
done
for t in f16 q8_0 q4_0h iq4_nlh; do
  [ $(( $(date +%s) - T0 )) -gt ${LONG_BY:-250} ] && { echo "== $t ctx 8192 skipped (time)"; continue; }
  timeout 40 $B $M --steps 16 --batches 1,16 --context 8192 --kv-type $t > $OUT/b8192_$t.log 2>&1
  echo "== $t ctx 8192 rc=$?"; grep -E "decode|batch +[0-9]" $OUT/b8192_$t.log | cut -c1-220
done
date -u
# The benchmarks' own failures show in their logs; the tests decide the status.
[ "$RC_OPS" -eq 0 ] && [ "$RC_TESTS" -eq 0 ]
