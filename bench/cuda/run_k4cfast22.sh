#!/bin/bash
# Device run of make_carry_k4cfast22.sh's pack (branch k4cfast22: the fast
# k4c / k4a CUDA attention, written without a GPU), in one call:
#  1. the tests (FILTER): the fast kernel against the reference kernel
#     (`[ k4c fast ]` lines: the worst max |diff| / scale, limit 2e-3; batch
#     invariance and determinism bit for bit), the reference against the
#     CPU's, and the k4c and k4a Llama models against the CPU's (through the
#     backend's default, the reference kernel, then once more with
#     RILL_K4C_ATTENTION=fast);
#  2. the random Llama-3.1-8B bf16 made into /dev/shm in the background
#     (on the CPU while the tests run);
#  3. with RILL_K4C_ATTENTION=fast, bench_cuda decode at batches 1 and 64 after CTXS-token prompts
#     (default "1024 4096") for f16, k4c and k4a, then k4c with
#     RILL_K4C_ATTENTION=ref (the reference kernel) at batch 1 for
#     comparison (REF=0 skips it; TMO seconds each, default 120; TYPES
#     narrows the types; FAST_MODE sets the model tests' kernel; WARP=1 adds
#     k4c with RILL_K4C_ATTENTION=rows, the earlier row softmax: the
#     default is now the one-phase warp softmax);
#  (KERNEL_AB=1: the kernel timings of the packed baseline build and this
#  one in turn; NCU=1: ncu of the fast kernel's decode at batch 64 and
#  tiled prefill, and of the flash prefill kernel;)
#  4. with time left, issue 23's FP8 band (FP8=0 skips): --quantize fp8
#     decode at 8..48 sequences, RILL_FP8_MMA=0 and RILL_FP8_MMA=2
#     RILL_FP8_MMA_TOKENS=9-32 in turn, twice.
# BUDGET: seconds from the start after which no new benchmark starts
# (default 420); MIN_LEFT: the seconds a benchmark needs left to start
# (default 40). The repo root is the cwd; the script runs from the carried
# folder. Logs go to /tmp/k4cfast22-logs; $OUT gets them packed
# (logs.tar.gz) and the test log, and the verdict block is printed last
# (device_out.sh), also when the script is cut short.
# Usage (the run tool, timeout 600):
#   bash .device/k4cfast22/run.sh            (carry [".device/k4cfast22"])
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
# (the fast kernel's host runs, checked off the device, left out)
FILTER=${FILTER:-'CudaChanFastAttention.*:CudaChanAttention.*:CudaK4c.*:K4cHd64.*:CudaK4a.*:K4aHd64.*:*CudaGemmaK4c*-CudaChanFastAttention.HostRun*'}
CTXS=${CTXS:-"1024 4096"}
BUDGET=${BUDGET:-420}
L=/tmp/k4cfast22-logs
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$R/bench/cuda")/device_out.sh"
verdict_lines() {
  grep -h "^\[ k4c fast \]\|^\[ cuda k4a \]\|^\[ k4a hd64 \]\|^\[ cuda gemma\|^\[ kv store \]" $L/tests.log 2> /dev/null | cut -c1-200 | head -36
  for f in $L/b_*.log; do
    [ -f "$f" ] && grep -E "^decode batch|^prefill" "$f" | sed "s|^|$(basename "$f" .log): |" | cut -c1-120 | head -6
  done
}
mkdir -p /work
{ [ -d /work/main ] && [ ! -L /work/main ]; } || ln -sfn $R /work/main
(cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
for f in $V/lib/*.xz; do xz -d "$f"; done
chmod +x $V/tests $V/bench_cuda
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/dev/shm/llama8b
(t0=$(date +%s); timeout $(to 300) python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $L/make.log) &
MK=$!
show() { grep -E "^\[ k4|^\[ cuda|^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | head -${2:-80}; }
cd /tmp || exit 1
out_key $L/tests.log
tmo 240 $V/tests --gtest_filter="${FILTER}" > $L/tests.log 2>&1; RC_TESTS=$?; out_rc tests $RC_TESTS; echo "tests rc=$RC_TESTS"; show $L/tests.log 60
out_pack
grep -c "^\[       OK" $L/tests.log; echo "tests done at $(( $(date +%s) - T0 )) s"
# The backend's k4c path (the model tests above ran the default, the
# reference kernel): the model tests once more through the fast kernel.
out_key $L/tests_fast.log
RILL_K4C_ATTENTION=${FAST_MODE:-fast} tmo 180 $V/tests --gtest_filter="${FAST_FILTER:-CudaK4c.*:CudaK4a.*:*CudaGemmaK4c*}" > $L/tests_fast.log 2>&1
RC_FAST=$?; out_rc "model tests (RILL_K4C_ATTENTION=${FAST_MODE:-fast})" $RC_FAST; echo "model tests, fast kernel rc=$RC_FAST"; show $L/tests_fast.log 30
export RILL_K4C_ATTENTION=fast
# NCU=1: Nsight Compute's view of the fast kernel, k4c, Llama-3.1-8B's
# shape: DeviceTiming's first batch-64 call after 1,024 keys (its 22nd
# launch) and DeviceTimingPrefill's first tiled call (also its 22nd); and
# of the flash prefill kernel (chan_attention_flash): its second launch in
# CudaChanFlashAttention.DeviceTimingPrefill (k4c, 512 tokens after 1,536).
ncu_kernel() {  # NAME TEST [KERNEL SKIP]
  [ $(left) -gt 150 ] || { echo "== ncu $1 skipped (time)"; return; }
  local k=${3:-chan_fast_kernel}
  tmo 100 ncu --clock-control none --kernel-name regex:$k --launch-skip ${4:-21} --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis $V/tests --gtest_filter="$2" > $L/ncu_$1.log 2>&1
  echo "== ncu $1 rc=$?"
  grep -E "$k|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Dynamic Shared|Warp Cycles Per Issued|Issue Slots Busy|Eligible Warps|No Eligible|One or More" $L/ncu_$1.log | cut -c1-150 | head -30
  out_pack
}
# KERNEL_AB=1: the fast kernel's timings by the packed baseline build
# (tests_base) and this one, in turn, twice.
if [ "${KERNEL_AB:-0}" = 1 ] && [ -x $V/tests_base ]; then
  for i in $(seq 1 ${AB_RUNS:-2}); do
    for b in tests_base tests; do
      tmo 60 $V/$b --gtest_filter='CudaChanFastAttention.DeviceTiming*:CudaChanFlashAttention.DeviceTiming*' > $L/ab_${b}_$i.log 2>&1
      echo "== kernel $b run $i rc=$?"; grep -E "^\[ k4c (fast|flash) \]" $L/ab_${b}_$i.log | cut -c1-150
    done
  done
  out_pack
fi
if [ "${NCU:-0}" = 1 ]; then
  ncu_kernel decode_b64 CudaChanFastAttention.DeviceTiming
  ncu_kernel prefill_tiled CudaChanFastAttention.DeviceTimingPrefill
  ncu_kernel prefill_flash CudaChanFlashAttention.DeviceTimingPrefill chan_flash_kernel 1
fi
wait $MK; tail -2 $L/make.log
# bench NAME ENV... -- ARGS...: one bench_cuda run into $L/b_NAME.log.
bench() {
  local name=$1; shift
  if [ $(left) -lt ${MIN_LEFT:-40} ]; then echo "== $name skipped (time)"; return; fi
  tmo ${TMO:-120} env "$@" > $L/b_$name.log 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "KV|^decode|prefill:|load" $L/b_$name.log | cut -c1-200
  out_pack
}
for c in $CTXS; do
  pf=$(( c > 2048 ? c : 2048 ))
  for t in ${TYPES:-f16 k4c k4a}; do
    bench ${t}_ctx$c $V/bench_cuda $M --steps 16 --batches 1,64 --context $c --prefill $pf --kv-type $t
  done
  [ "${WARP:-0}" = 0 ] || bench k4crows_ctx$c RILL_K4C_ATTENTION=rows $V/bench_cuda $M --steps 16 --batches 1,64 --context $c --prefill $pf --kv-type k4c
  # TILES=1: k4c's prefill through the fast kernel's token tiles (the path
  # before chan_attention_flash), for the same call's A/B.
  [ "${TILES:-0}" = 0 ] || bench k4ctiles_ctx$c RILL_K4C_ATTENTION=tiles $V/bench_cuda $M --steps 4 --batches 1 --context $c --prefill $pf --kv-type k4c
  [ "${REF:-1}" = 0 ] || bench k4cref_ctx$c RILL_K4C_ATTENTION=ref $V/bench_cuda $M --steps 16 --batches 1 --context $c --prefill $pf --kv-type k4c
done
# TIMELINE=1 (a carry made with TIMELINE=1): a CUPTI timeline of one
# decode step of each batch in TL_BATCHES (default 1) after 1,024 tokens
# (bench_cuda --profile-step B, CUDA graphs on) for each type in TL_TYPES
# (default f16 k4c), each summarised by kernel (timeline_report.py):
# where k4c's extra time a step goes, and where batch 64's time goes
# against its bytes.
if [ "${TIMELINE:-0}" = 1 ] && [ -f $V/lib/libkernel_timeline.so ]; then
  for b in ${TL_BATCHES:-1}; do
    for t in ${TL_TYPES:-f16 k4c}; do
      tmo 90 env CUDA_INJECTION64_PATH=$V/lib/libkernel_timeline.so RILL_TIMELINE=$L/timeline_${t}_b$b.csv \
        $V/bench_cuda $M --profile-step $b --context 1024 --kv-type $t > $L/timeline_${t}_b$b.log 2>&1
      echo "== timeline $t batch $b rc=$?"; tail -2 $L/timeline_${t}_b$b.log
      python3 $V/timeline_report.py $L/timeline_${t}_b$b.csv 2>&1 | head -40
    done
  done
  out_pack
fi
# LONG=N: f16, k4c and k4a at batch 1 after N-token prompts (the long
# context a batch of 64 would take minutes to prefill).
if [ -n "${LONG:-}" ]; then
  for t in f16 k4c k4a; do
    bench ${t}_long$LONG $V/bench_cuda $M --steps 16 --batches 1 --context $LONG --prefill $LONG --kv-type $t
  done
fi
# With time left (FP8=0 skips): issue 23's FP8 band, cuBLASLt's FP8 GEMM
# (RILL_FP8_MMA=0) against fp8_mma's bf16-x form for 9..32 tokens, in
# turn, decode at 8..48 sequences.
if [ "${FP8:-1}" != 0 ]; then
  unset RILL_K4C_ATTENTION
  for i in 1 2; do
    bench fp8_off_$i RILL_FP8_MMA=0 $V/bench_cuda $M --quantize fp8 --steps 16 --batches 8,16,24,32,48 --prefill 512
    bench fp8_band_$i RILL_FP8_MMA=2 RILL_FP8_MMA_TOKENS=9-32 $V/bench_cuda $M --quantize fp8 --steps 16 \
      --batches 8,16,24,32,48 --prefill 512
  done
fi
date -u
[ "$RC_TESTS" -eq 0 ]
