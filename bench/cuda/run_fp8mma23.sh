#!/bin/bash
# Issue 23, branch fp8mma23, device side (carry .device/fp8mma23, made by
# make_carry_fp8mma23.sh; run `bash .device/fp8mma23/run.sh`): fp8_mma (the
# FP8 GEMM of our own, RILL_FP8_MMA=1) beside cuBLASLt's FP8 GEMM and its
# scale pass, in one call. Logs go to /dev/shm/f8m/logs as PART.log; $OUT
# gets them packed (logs.tar.gz) and the test logs, and the verdict block
# is printed last (device_out.sh), also when the script is cut short.
#  tests   test_fp8_mma whole (the f64 sum of the e4m3 products, cuBLASLt,
#          batch invariance bit for bit, accumulate, odd shapes, the GLU
#          epilogue; e4m3 x and bf16 x), then its switched-on test and
#          test_fp8_glu (the backend's matmul_glu == matmul then glu, bit
#          for bit) with RILL_FP8_MMA=1 and =2;
#  model   the random Llama-3.1-8B (make_random_model.py, bf16, 16 GB) into
#          /dev/shm, in the background from the start;
#  kernels bench_fp8_kernels --mma-only 1: per 8B shape at 16/32/64/128
#          tokens, cuBLASLt FP8 + scale pass against fp8_mma and
#          fp8_mma_bf16x (weights from HBM), fp8_mma by column parts at 64,
#          the GLU forms for gate_up;
#  rill    bench_cuda MODEL --quantize fp8 --batches 1,8,64,128 --steps 16
#          --prefill 512: this branch with RILL_FP8_MMA=0, =1, =2, =0, =1,
#          =2 (interleaved), then main's binary (if carried and time is left);
#  ncu     one launch of fp8_mma_kernel at 64 tokens (bench_fp8_kernels
#          --profile 2) on NCU_SHAPES (default "o gate_up"; NCU=0: none).
# Order: tests while the model is made (CPU work), then kernels, rill and
# ncu on a quiet host. PARTS picks (default all), BUDGET (s, default 480)
# stops starting parts. If the tests fail the rest still runs (rc
# printed): then do not turn the switch on.
T0=$(date +%s)
V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-480}
PARTS=${PARTS:-"tests model kernels rill ncu"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set +e
W=/dev/shm/f8m
L=$W/logs
O=$L
# left, to (a timeout capped by the budget), tmo (timeout in the
# background), out_key, out_rc; the EXIT trap packs $L and prints the verdict.
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$PWD/bench/cuda")/device_out.sh"
verdict_lines() {
  grep -hE "^\[ fp8 mma \].*worst" $O/test_mma.log 2> /dev/null | sort -t= -k2 -g | tail -3
  grep -hE "^\[ fp8 mma \] against cuBLASLt" $O/test_mma.log 2> /dev/null
  grep -hE "n=64 |GLU" $O/kernels.log 2> /dev/null | sed "s/  */ /g" | head -24
  for f in $O/rill_*.log; do
    [ -f "$f" ] && grep -E "decode" "$f" | sed "s|^|$(basename "$f" .log): |" | head -4
  done
}
tar xJf $V/bin.tar.xz -C $W
tar xJf $V/shared.tar.xz -C $W
B=$W/bin
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm --format=csv,noheader
echo "unpacked at $(($(date +%s) - T0)) s"
M=$W/llama8b
if has model || has rill; then
  (t0=$(date +%s)
  timeout $(to 240) python3 $W/shared/tools/make_random_model.py llama-3.1-8b $M > $O/model.log 2>&1
  echo "make model rc=$? $(($(date +%s) - t0)) s" >> $O/model.log) &
  MK=$!
fi
if has tests; then
  out_key $O/test_mma.log
  out_key $O/test_mma_on1.log
  out_key $O/test_glu_on1.log
  out_key $O/test_mma_on2.log
  out_key $O/test_glu_on2.log
  tmo 150 $B/test_fp8_mma > $O/test_mma.log 2>&1
  r=$?
  out_rc test_fp8_mma $r
  echo "== test_fp8_mma rc=$r at $(($(date +%s) - T0)) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is|differ|OK \]" \
    $O/test_mma.log | head -40
  echo "-- the three largest errors of the f64 comparisons:"
  grep -E "^\[ fp8 mma \].*worst" $O/test_mma.log | sort -t= -k2 -g | tail -3
  for sw in 1 2; do
    RILL_FP8_MMA=$sw tmo 60 $B/test_fp8_mma --gtest_filter='Fp8Mma.Fp8MatmulTakesItWhenSwitchedOn' \
      > $O/test_mma_on$sw.log 2>&1
    r=$?
    out_rc "test_fp8_mma (RILL_FP8_MMA=$sw)" $r
    echo "== test_fp8_mma switched on (RILL_FP8_MMA=$sw) rc=$r at $(($(date +%s) - T0)) s"
    grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|Expected|Which is|differ|OK \]" $O/test_mma_on$sw.log | head -20
    RILL_FP8_MMA=$sw tmo 120 $B/test_fp8_glu > $O/test_glu_on$sw.log 2>&1
    r=$?
    out_rc "test_fp8_glu (RILL_FP8_MMA=$sw)" $r
    echo "== test_fp8_glu (RILL_FP8_MMA=$sw) rc=$r at $(($(date +%s) - T0)) s"
    grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|Failure|Expected|Which is|fused|OK \]" $O/test_glu_on$sw.log | head -30
  done
  out_pack
fi
if has kernels; then
  tmo 120 $B/bench_fp8_kernels --mma-only 1 > $O/kernels.log 2>&1
  echo "== bench_fp8_kernels --mma-only 1 rc=$? at $(($(date +%s) - T0)) s"
  cut -c1-200 $O/kernels.log | head -60
  out_pack
fi
if [ -n "$MK" ]; then
  wait $MK
  tail -2 $O/model.log
  echo "model done at $(($(date +%s) - T0)) s"
fi
if has rill && [ -f $M/config.json ]; then
  RUNS="off1 on1 bx1 off2 on2 bx2"
  [ -x $B/bench_main ] && RUNS="$RUNS main"
  for r in $RUNS; do
    [ "$(left)" -lt 60 ] && { echo "== rill $r skipped (time)"; continue; }
    case $r in
      main) bin=$B/bench_main sw= ;;
      off*) bin=$B/bench_new sw=0 ;;
      on*) bin=$B/bench_new sw=1 ;;
      bx*) bin=$B/bench_new sw=2 ;;
    esac
    echo "== $r: RILL_FP8_MMA=$sw $(basename $bin) --quantize fp8 --batches 1,8,64,128 --steps 16 --prefill 512"
    RILL_FP8_MMA=$sw tmo 110 $bin $M --quantize fp8 --batches 1,8,64,128 --steps 16 --prefill 512 \
      > $O/rill_$r.log 2>&1
    echo "rc=$? at $(($(date +%s) - T0)) s"
    grep -E "^(ceilings|model)|decode|rror" $O/rill_$r.log | cut -c1-200
    out_pack
  done
  echo "rill done at $(($(date +%s) - T0)) s"
fi
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2> /dev/null | head -1)
has ncu && [ -z "$NCU_BIN" ] && echo "== ncu: not on this machine"
if has ncu && [ "${NCU:-1}" != 0 ] && [ -n "$NCU_BIN" ]; then
  # --profile 2 runs fp8_mma once per shape (qkv o gate_up down lm_head) at
  # 64 tokens: shape k's launch of fp8_mma_kernel is launch k.
  for s in ${NCU_SHAPES:-o gate_up}; do
    case $s in qkv) k=0 ;; o) k=1 ;; gate_up) k=2 ;; down) k=3 ;; *) k=4 ;; esac
    [ "$(left)" -lt 40 ] && { echo "== ncu $s skipped (time)"; continue; }
    tmo 90 $NCU_BIN --clock-control none -k regex:fp8_mma_kernel --launch-skip $k --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section InstructionStats --section SchedulerStats --section WarpStateStats --section Occupancy \
      --section LaunchStats $B/bench_fp8_kernels --profile 2 > $O/ncu_$s.txt 2>&1
    echo "== ncu $s fp8_mma_kernel rc=$?"
    grep -E "^  [a-z_0-9]+<|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|Compute \(SM\)|Executed Ipc A|Issue Slots Busy|No Eligible|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Theoretical Occ|SM Frequency|Waves Per SM|Grid Size|Dynamic Shared" \
      $O/ncu_$s.txt | sed 's/  */ /g' | head -18
    out_pack
  done
fi
echo "total $(($(date +%s) - T0)) s"
rm -rf "${W:?}/bin" "$M"
