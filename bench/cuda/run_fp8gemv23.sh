#!/bin/bash
# Issue 23, branch fp8gemv23, device side (carry .device/fp8gemv23, made by
# make_carry_fp8gemv23.sh; run `bash .device/fp8gemv23/run.sh`): the
# streaming FP8 GEMV (fp8_gemv_stream, RILL_FP8_GEMV=v2) beside fp8_gemv,
# in one call. Logs go to /dev/shm/f8g/logs as PART.log; $OUT gets them
# packed (logs.tar.gz) and the two test logs, and the verdict block is
# printed last (device_out.sh), also when the script is cut short.
#  tests   test_fp8_gemv_stream whole (bit for bit against the host
#          restatement of the order and against fp8_gemv; batch
#          invariance; accumulate; odd shapes; every bench configuration),
#          and test_fp8_weights' GEMV tests with RILL_FP8_GEMV=v2 (fp8_gemv
#          through the new kernel: the f64 bound, 1..8 tokens, quant_matmul);
#  model   the random Llama-3.1-8B (make_random_model.py, bf16, 16 GB) into
#          /dev/shm, in the background from the start;
#  kernels bench_fp8_kernels --gemm 0: per 8B shape, fp8_gemv's
#          configurations (R4U2 is what main runs), the stream kernel's
#          (v2 R.D.), then fp8_gemv and fp8_gemv_stream at 1..8 tokens, the
#          bf16 GEMV; GB/s of weight bytes against the measured copy rate;
#  rill    bench_cuda MODEL --quantize fp8 --batches 1,8 --steps 16: main's
#          binary (if carried), this branch with RILL_FP8_GEMV unset and
#          =v2, then both again in the other order (drift);
#  ncu     one launch of fp8_gemv16_kernel and of fp8_gemv_stream_kernel at
#          one token (bench_fp8_kernels --profile 1) on NCU_SHAPES (default
#          "qkv o"; NCU=0: none): SOL, memory, compute pipes, instructions,
#          scheduler and warp states, occupancy, launch; caches flushed.
# Order: tests while the model is made (CPU work), then kernels, rill and
# ncu on a quiet host. PARTS picks (default all), BUDGET (s, default 570)
# stops starting parts. If the tests fail the rest still runs (rc
# printed): then do not turn the switch on.
T0=$(date +%s)
V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-570}
PARTS=${PARTS:-"tests model kernels rill ncu"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set +e
W=/dev/shm/f8g
L=$W/logs
O=$L
# left, to (a timeout capped by the budget), tmo (timeout in the
# background), out_key, out_rc; the EXIT trap packs $L and prints the verdict.
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$PWD/bench/cuda")/device_out.sh"
verdict_lines() {
  grep -hE "^GEMV|R4U2 |fp8_gemv n[18] |stream n[18] |bf16 gemv" $O/kernels.log 2> /dev/null | sed "s/  */ /g" | head -32
  for f in $O/rill_*.log; do
    [ -f "$f" ] && grep -E "decode" "$f" | sed "s|^|$(basename "$f" .log): |" | head -3
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
  out_key $O/test_stream.log
  out_key $O/test_weights_v2.log
  tmo 150 $B/test_fp8_gemv_stream > $O/test_stream.log 2>&1
  r=$?
  out_rc test_fp8_gemv_stream $r
  echo "== test_fp8_gemv_stream rc=$r at $(($(date +%s) - T0)) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is|differing|OK \]" $O/test_stream.log | head -40
  RILL_FP8_GEMV=v2 tmo 120 $B/test_fp8_weights --gtest_filter='Fp8Weights.Gemv*:Fp8Weights.QuantMatmul*' \
    > $O/test_weights_v2.log 2>&1
  r=$?
  out_rc "test_fp8_weights (v2)" $r
  echo "== test_fp8_weights (RILL_FP8_GEMV=v2, GEMV tests) rc=$r at $(($(date +%s) - T0)) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is|OK \]" $O/test_weights_v2.log | head -20
  out_pack
fi
if [ -n "$MK" ]; then
  wait $MK
  tail -2 $O/model.log
  echo "model done at $(($(date +%s) - T0)) s"
fi
if has kernels; then
  tmo 120 $B/bench_fp8_kernels --gemm 0 > $O/kernels.log 2>&1
  echo "== bench_fp8_kernels --gemm 0 rc=$? at $(($(date +%s) - T0)) s"
  grep -E "GEMV|R4U2 |ring8B|v2 |fp8_gemv n1|fp8_gemv n8|stream n1 |stream n8|bf16 gemv" $O/kernels.log | cut -c1-160 | head -60
fi
if has rill && [ -f $M/config.json ]; then
  RUNS="new_off new_v2 new_v2b new_offb"
  [ -x $B/bench_main ] && RUNS="main $RUNS"
  for r in $RUNS; do
    [ "$(left)" -lt 70 ] && { echo "== rill $r skipped (time)"; continue; }
    case $r in
      main) bin=$B/bench_main sw= ;;
      new_off*) bin=$B/bench_new sw= ;;
      new_v2*) bin=$B/bench_new sw=v2 ;;
    esac
    echo "== $r: RILL_FP8_GEMV=$sw bench_cuda --quantize fp8 --batches 1,8 --steps 16"
    RILL_FP8_GEMV=$sw tmo 100 $bin $M --quantize fp8 --batches 1,8 --steps 16 > $O/rill_$r.log 2>&1
    echo "rc=$?"
    grep -E "^(ceilings|model)|decode|rror" $O/rill_$r.log | cut -c1-200
  done
  echo "rill done at $(($(date +%s) - T0)) s"
fi
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
has ncu && [ -z "$NCU_BIN" ] && echo "== ncu: not on this machine"
if has ncu && [ "${NCU:-1}" != 0 ] && [ -n "$NCU_BIN" ]; then
  # --profile 1 runs, per shape (qkv o gate_up down lm_head), fp8_gemv and
  # fp8_gemv_stream at 1 then 8 tokens: shape k's one-token launch of
  # either kernel is that kernel's launch 2 k.
  for s in ${NCU_SHAPES:-qkv o}; do
    case $s in qkv) k=0 ;; o) k=1 ;; gate_up) k=2 ;; down) k=3 ;; *) k=4 ;; esac
    for kern in fp8_gemv16_kernel fp8_gemv_stream_kernel; do
      [ "$(left)" -lt 40 ] && { echo "== ncu $s $kern skipped (time)"; continue; }
      tmo 90 $NCU_BIN --clock-control none -k regex:$kern --launch-skip $((2 * k)) --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        --section InstructionStats --section SchedulerStats --section WarpStateStats --section Occupancy \
        --section LaunchStats $B/bench_fp8_kernels --profile 1 > $O/ncu_${s}_$kern.txt 2>&1
      echo "== ncu $s $kern rc=$?"
      grep -E "^  [a-z_0-9]+<|Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit|Compute \(SM\)|Executed Ipc A|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Executed Instructions  |Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Theoretical Occ|SM Frequency|Waves Per SM|Grid Size" \
        $O/ncu_${s}_$kern.txt | sed 's/  */ /g' | head -16
    done
  done
fi
echo "total $(($(date +%s) - T0)) s"
rm -rf "${W:?}/bin" "$M"
