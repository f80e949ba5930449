#!/bin/bash
# Issue 22 / 23, the tensor-core decode kernel's two shapes
# (attention_decode_mma.cu: Occ6, the default, and Occ8 =
# RILL_DECODE_MMA_OCC=8), device side, one call: the kernel's tests, one
# layer's decode attention alone in each shape, the random Llama-3.1-8B end
# to end per shape (q8_0 / q4_0 at 4k and 8k, batch 1 and 64), ncu of Occ8
# at 8,192 keys x 64. Uses make_carry_kvtypes.sh's pack (copied as occ.sh):
#   bash bench/cuda/make_carry_kvtypes.sh build-cpu
#   run: bash .device/kvcuda22/occ.sh   (carry [".device/kvcuda22"])
# CELLS: type:context:occ end-to-end runs ("none": no model, no runs);
# BUDGET (s, default 570).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn "$R" /work/main && (cd /work && tar xJf "$V/shared.tar.xz")
[ -x "$V/tests" ] || tar xJf "$V/bins.tar.xz" -C "$V"
chmod +x "$V/tests" "$V/bench_cuda" "$V/bench_kv_attention"
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
M=/tmp/llama8b
if [ "${CELLS:-}" != none ] && [ ! -f $M.done ]; then  # made on the CPU while the tests use the GPU
  (python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > /tmp/make.log 2>&1 && touch $M.done) &
  MK=$!
fi
cd /tmp
timeout 150 "$V/tests" --gtest_filter="${FILTER:-CudaAttention.DecodeOnTheTensorCoresMatchesCpu:CudaAttention.Decode*}" \
  > /tmp/tests.log 2>&1
RC=$?; echo "tests rc=$RC"
grep -E "^\[  FAILED|^\[  PASSED|Failure|Expected|Which is" /tmp/tests.log | cut -c1-200 | head -20
for occ in ${ATTN_OCCS:-6 8 6 8}; do
  RILL_DECODE_MMA_OCC=$occ timeout 60 "$V/bench_kv_attention" --contexts 4096,8192 --batches 1,64 \
    --types q8_0,q4_0,fp8 > /tmp/attn.log 2>&1
  echo "== attention alone, RILL_DECODE_MMA_OCC=$occ rc=$?"; grep -vE "^\s*$" /tmp/attn.log | cut -c1-150 | tail -8
done
[ -n "${MK:-}" ] && wait "$MK"
[ "${CELLS:-}" = none ] && CELLS=" "
for cell in ${CELLS:-q8_0:8192:6 q8_0:8192:8 q4_0:8192:6 q4_0:8192:8 q8_0:4096:6 q8_0:4096:8}; do
  IFS=: read -r t c occ <<< "$cell"
  [ "$(left)" -lt 45 ] && { echo "== $cell skipped (time)"; continue; }
  RILL_DECODE_MMA_OCC=$occ timeout 45 "$V/bench_cuda" $M --steps 16 --batches 1,64 --context "$c" \
    --kv-type "$t" --kv-fit 0.9 > /tmp/e2e.log 2>&1
  echo "== $t ctx $c OCC=$occ rc=$? at $(( $(date +%s) - T0 )) s"
  grep -E "^decode|rror" /tmp/e2e.log | cut -c1-120
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
if [ -n "$NCU" ] && [ "$(left)" -gt 40 ]; then
  RILL_DECODE_MMA_OCC=8 timeout 40 "$NCU" --clock-control none -k regex:decode_mma_kernel -c 1 --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section WarpStateStats \
    "$V/bench_kv_attention" --contexts 8192 --batches 64 --types q8_0 > /tmp/ncu.log 2>&1
  echo "== ncu Occ8 rc=$?"
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Block Limit (Reg|Shared)|Warp Cycles Per Issued" /tmp/ncu.log
fi
date -u
exit $RC
