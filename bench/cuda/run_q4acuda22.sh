#!/bin/bash
# Device run of make_carry_q4acuda22.sh's pack (branch q4acuda22: k4a KV on
# CUDA, written without a GPU), in one call:
#  1. the tests (FILTER: the q4c / q4a encoders against the CPU's bytes,
#     the reference attention over q4c and q4a blocks, the step plan, the
#     k4c and k4a Llama models against the CPU's);
#  2. the random Llama-3.1-8B bf16 made here (on the CPU while the tests
#     run): k4a and then k4c, the branch's bench_cuda, at a cheap shape of
#     their own (decode batch 1 and 9 after 256-token prompts, a 256-token
#     prefill; CHAN_TMO seconds each, default 90): the reference attention
#     is slow by design, so these are end-to-end smokes (k4a's load runs
#     its calibration pass on the GPU), not speeds to compare with f16;
#  3. the 8B benchmark per type of TYPES (default "f16"): decode batch 1 /
#     64 after 1,024-token prompts and a 2,048-token prefill, main's
#     bench_cuda then the branch's (f16 is untouched by the branch: the
#     two should agree within noise).
# BUDGET: seconds from the start after which no new benchmark starts;
# MIN_LEFT: the seconds a benchmark needs left to start (default 40).
# The repo root is the cwd; the script runs from the carried folder. Logs
# go to /tmp/q4acuda22-logs; $OUT gets them packed (logs.tar.gz) and the
# test log, and the verdict block is printed last (device_out.sh), also
# when the script is cut short. Every timeout is capped by the BUDGET.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaKvChan.*:CudaChanAttention.*:CudaKvChanStep.*:CudaK4c.*:K4cHd64.*:CudaK4a.*:K4aHd64.*'}
TYPES=${TYPES:-"f16"}
BUDGET=${BUDGET:-450}
L=/tmp/q4acuda22-logs
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$R/bench/cuda")/device_out.sh"
verdict_lines() {
  grep -h "^\[ cuda k4a \]\|^\[ k4a hd64 \]" $L/tests.log 2> /dev/null | cut -c1-160 | head -12
  for f in $L/b_*.log; do
    [ -f "$f" ] && grep -E "k4a:|decode|prefill" "$f" | sed "s|^|$(basename "$f" .log): |" | head -4
  done
}
mkdir -p /work
{ [ -d /work/main ] && [ ! -L /work/main ]; } || ln -sfn $R /work/main
(cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda $V/bench_cuda_main
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
(t0=$(date +%s); timeout $(to 300) python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $L/make.log) &
MK=$!
show() { grep -E "^\[ cuda|^\[ k4|^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | head -${2:-80}; }
cd /tmp
out_key $L/tests.log
tmo 240 $V/tests --gtest_filter="${FILTER}" > $L/tests.log 2>&1; RC_TESTS=$?; out_rc tests $RC_TESTS; echo "tests rc=$RC_TESTS"; show $L/tests.log 60
out_pack
grep -c "^\[       OK" $L/tests.log; echo "tests done at $(( $(date +%s) - T0 )) s"
wait $MK; tail -2 $L/make.log
for t in k4a k4c; do
  if [ $(left) -lt ${MIN_LEFT:-40} ]; then echo "== $t branch skipped (time)"; continue; fi
  tmo ${CHAN_TMO:-90} $V/bench_cuda $M --steps 16 --batches 1,9 --context 256 --prefill 256 --kv-type $t > $L/b_${t}_branch.log 2>&1
  echo "== $t branch rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "k4a:|KV|decode|prefill|TTFT|batch +[0-9]|load" $L/b_${t}_branch.log | cut -c1-200
done
out_pack
for t in $TYPES; do
  for b in main branch; do
    [ $b = main ] && cmp -s $V/bench_cuda $V/bench_cuda_main && continue
    [ $(left) -lt ${MIN_LEFT:-40} ] && { echo "== $t $b skipped (time)"; continue; }
    bin=$V/bench_cuda; [ $b = main ] && bin=$V/bench_cuda_main
    tmo 45 $bin $M --steps 16 --batches 1,64 --context 1024 --kv-type $t > $L/b_${t}_$b.log 2>&1
    echo "== $t $b rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "KV|decode|prefill|TTFT|batch +[0-9]" $L/b_${t}_$b.log | cut -c1-200
  done
done
date -u
[ "$RC_TESTS" -eq 0 ]
