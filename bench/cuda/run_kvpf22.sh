#!/bin/bash
# Device run of branch kvpf22 (quantized-KV prefill on the register-fragment
# kernel): one layer's prefill attention per KV type at Llama-3.1-8B's
# shape (main's kernels; the branch's; the branch's WMMA), ncu of the q8_0 flash launch, the KV-type GPU
# tests, then bench_cuda on the random Llama-3.1-8B bf16 per KV type, main's
# binary and the branch's back to back. The repo root is the cwd.
# LIMIT: seconds after which no further bench_cuda pair starts (default 175);
# BENCH_TYPES: the KV types of the bench_cuda pairs, in order (default
# "q8_0 f16 iq4_nlh q4_0h q8_0h"); PROFILE=0: no ncu; WMMA=0: no WMMA-kernel
# runs (bench_prefill_attention and the attention tests under
# RILL_CUDA_FLASH_PREFILL=0); FILTER: the gtest filter of the KV-type
# tests (default below); BENCH_TYPES=none: no model, no bench_cuda; MAIN=0:
# the bench_cuda pairs without main's binary.
T0=$(date +%s)
R=$PWD; V=$R/.device/kvpf22
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
mkdir -p /tmp/kb && (cd /tmp/kb && xz -dc $V/bin.tar.xz | tar xf -)
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
echo "unpacked at $(el) s"
M=/tmp/llama8b
[ "${BENCH_TYPES:-}" = none ] || (t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
cd /tmp
P=/tmp/kb/bench_prefill_attention
TY=f16,q8_0,q8_0h,q4_0h,iq4_nlh,fp8,q4_0
{ echo "# main"; ${P}_main --shapes llama --types $TY; echo "# branch"; $P --shapes llama --types $TY
  if [ "${WMMA:-1}" = 1 ]; then
    echo "# branch, RILL_CUDA_FLASH_PREFILL=0"; RILL_CUDA_FLASH_PREFILL=0 $P --shapes llama --types $TY
  fi; } > $OUT/pa.log 2>&1
echo "prefill attention rc=$? at $(el) s"; cut -c1-150 $OUT/pa.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ "${PROFILE:-1}" = 1 ] && timeout 40 $NCU --clock-control none -k regex:flash_prefill -c 2 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats $P --shapes llama --types q8_0,f16 > $OUT/ncu.log 2>&1
echo "ncu rc=$? at $(el) s"
grep -E "flash_prefill_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots|Block Limit Shared|Block Limit Reg" $OUT/ncu.log | cut -c1-120 | head -40
show() { grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | head -${2:-40}; }
T=/tmp/kb/tests
timeout 40 $T --gtest_filter='*BackendOps.RotatedKvStore*:*BackendOps.AttentionOverPagedKv*:*BackendOps.RopeQkNormAndKvStore*' > $OUT/tests_ops.log 2>&1; RC1=$?
echo "ops rc=$RC1 at $(el) s"; show $OUT/tests_ops.log 20
F='CudaAttention.*:*CudaKvQ8.*:CudaKvRotated.*:CudaKvTypes.*:CudaKvExport.*KvHasTheCpuLayout:*CudaKvTiers.*nlh*:*CudaKvTiers.*q4_0h*:*CudaKvTiers.*q8_0*:*CudaKvTiersRam.*:*CudaBatchInvariant.*_kv_*:CudaGemma4Hd512.QuantizedKv*:*CudaHf.KvTypeIsTheOne*'
timeout 100 $T --gtest_filter="${FILTER:-$F}" > $OUT/tests.log 2>&1; RC2=$?
echo "tests rc=$RC2 at $(el) s"; show $OUT/tests.log 40
RC3=0
if [ "${WMMA:-1}" = 1 ]; then
  RILL_CUDA_FLASH_PREFILL=0 timeout 30 $T --gtest_filter='CudaAttention.StoredKvTypes*:CudaAttention.MatchesCpuOnPagedKv:CudaAttention.SinksMatchCpuOnEveryPath' > $OUT/tests_wmma.log 2>&1
  RC3=$?
fi
echo "wmma tests rc=$RC3 at $(el) s"; show $OUT/tests_wmma.log 20
grep -c "^\[       OK" $OUT/tests_*.log
wait $MK; tail -1 $OUT/make.log 2>/dev/null; echo "model at $(el) s"
BT=${BENCH_TYPES:-q8_0 f16 iq4_nlh q4_0h q8_0h}; [ "$BT" = none ] && BT=
BINS="main branch"; [ "${MAIN:-1}" = 0 ] && BINS=branch
for t in $BT; do
  for b in $BINS; do
    [ $(el) -gt ${LIMIT:-175} ] && { echo "== $t $b skipped at $(el) s"; continue; }
    bin=/tmp/kb/bench_cuda; [ $b = main ] && bin=/tmp/kb/bench_cuda_main
    timeout 40 $bin $M --steps 16 --batches 1,64 --context 1024 --kv-type $t > $OUT/b_${t}_$b.log 2>&1
    echo "== $t $b rc=$? at $(el) s"; grep -E "prefill|TTFT|batch|decode|KV cache|ceilings" $OUT/b_${t}_$b.log | cut -c1-160
  done
done
(cd $OUT && tar czf logs.tgz *.log && rm -f b_*.log)
date -u
[ "$RC1" -eq 0 ] && [ "$RC2" -eq 0 ] && [ "$RC3" -eq 0 ]
