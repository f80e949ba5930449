#!/bin/bash
# Issue 22, the tensor-core decode kernel for the quantized KV types
# (attention_decode_mma.cu), device side, one call: its tests, one layer's
# decode attention with it and without it (RILL_DECODE_MMA=0: the fast
# kernel's f32 path) beside f16, the random Llama-3.1-8B end to end per type
# and context, and ncu of both kernels on q8_0 at 8,192 keys x 64. Uses
# make_carry_kvtypes.sh's full pack (tests, bench_cuda, bench_kv_attention):
#   bash bench/cuda/make_carry_kvtypes.sh build-cpu
#   run: bash .device/kvcuda22/mmadec.sh   (carry [".device/kvcuda22"])
# PARTS picks and orders (default "tests attn e2e ncu"); FILTER / OPS_FILTER the tests;
# CELLS the end-to-end runs as type:context:mma (mma 0 or 1); BUDGET (s,
# default 570) stops starting steps; RUN_S caps an end-to-end run (50);
# TESTS_S the tests (200); NCU_BATCHES the batches ncu profiles (64).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-570}
PARTS=${PARTS:-"tests attn e2e ncu"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
FILTER=${FILTER:-'CudaAttention.*:CudaKvTypes.*:*CudaBatchInvariant*:*CudaKvTiers*:CudaGemma4Hd512.*:*CudaHf.*'}
OPS_FILTER=${OPS_FILTER:-'*BackendOps.*Attention*:*BackendOps.RotatedKvStore*'}
mkdir -p /work && ln -sfn "$R" /work/main && (cd /work && tar xJf "$V/shared.tar.xz")
[ -x "$V/tests" ] || tar xJf "$V/bins.tar.xz" -C "$V"
chmod +x "$V/tests" "$V/bench_cuda" "$V/bench_kv_attention"
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
if has e2e && [ ! -f $M.done ]; then  # made on the CPU while the tests use the GPU
  (t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > "$OUT/make.log" 2>&1 &&
    touch $M.done; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/make.log") &
  MK=$!
fi
show() { grep -E "^\[ cuda|^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | cut -c1-220 | head -"${2:-80}"; }
cd /tmp
RC=0
part_tests() {
  # The tests with the kernel on (RILL_DECODE_MMA=1; TEST_MMA=0: off).
  export RILL_DECODE_MMA=${TEST_MMA:-1}
  timeout 90 "$V/tests" --gtest_filter="$OPS_FILTER" > "$OUT/ops.log" 2>&1; r=$?; RC=$((RC | r)); echo "ops rc=$r"; show "$OUT/ops.log" 20
  timeout "${TESTS_S:-200}" "$V/tests" --gtest_filter="$FILTER" > "$OUT/tests.log" 2>&1; r=$?; RC=$((RC | r)); echo "tests rc=$r"
  show "$OUT/tests.log" 90
  echo "tests done at $(( $(date +%s) - T0 )) s"
  unset RILL_DECODE_MMA
}
part_attn() {
  for mma in 1 0; do
    RILL_DECODE_MMA=$mma timeout 60 "$V/bench_kv_attention" --contexts 1024,4096,8192 --batches 1,64 \
      --types ${ATTN_TYPES:-f16,fp8,q8_0,q4_0,q4_1,q5_1,iq4_nl} > "$OUT/attn_mma$mma.log" 2>&1
    echo "== attention alone, RILL_DECODE_MMA=$mma rc=$?"; cut -c1-150 "$OUT/attn_mma$mma.log"
  done
}
part_e2e() {
  [ -n "${MK:-}" ] && wait "$MK"; tail -2 "$OUT/make.log" 2> /dev/null
  for cell in ${CELLS:-q8_0:4096:1 q8_0:4096:0 f16:4096:1 fp8:4096:1 q4_0:4096:1 q8_0:8192:1 f16:8192:1 fp8:8192:1}; do
    IFS=: read -r t c mma <<< "$cell"
    [ "$(left)" -lt "${RUN_S:-50}" ] && { echo "== $cell skipped (time)"; continue; }
    log=$OUT/e2e_${t}_${c}_$mma.log
    RILL_DECODE_MMA=$mma timeout "${RUN_S:-50}" "$V/bench_cuda" $M --steps 16 --batches 1,64 --context "$c" \
      --kv-type "$t" > "$log" 2>&1
    echo "== $t ctx $c RILL_DECODE_MMA=$mma rc=$? at $(( $(date +%s) - T0 )) s"
    grep -E "decode|prefill|batch +[0-9]|rror" "$log" | cut -c1-200
  done
}
part_ncu() {
  local NCU
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
  [ -n "$NCU" ] || { echo "== no ncu"; return; }
  for nb in ${NCU_BATCHES:-64}; do for k in decode_mma_kernel decode_fast_kernel; do
    [ "$(left)" -lt 30 ] && break
    mma=$([ $k = decode_mma_kernel ] && echo 1 || echo 0)
    RILL_DECODE_MMA=$mma timeout 40 "$NCU" --clock-control none -k regex:$k -c 1 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats \
      --section SchedulerStats "$V/bench_kv_attention" --contexts 8192 --batches "$nb" --types q8_0 > "$OUT/ncu_${k}_$nb.log" 2>&1
    echo "== ncu $k batch $nb rc=$?"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Block Limit|Stall|Warp Cycles Per Issued" \
      "$OUT/ncu_${k}_$nb.log" | head -18
  done; done
}
for p in $PARTS; do "part_$p"; done  # in the order PARTS names them
date -u
exit $RC
