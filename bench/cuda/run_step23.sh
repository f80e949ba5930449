#!/bin/bash
# Issue 23, one device call with make_carry_step23.sh's pack. PARTS (default
# "tests e2e tl ncu"; also kbench, after the tests) picks, in order:
#  tests  the packed GPU tests under FILTER;
#  e2e    bench_cuda on the random Llama-3.1-8B bf16 (made in /dev/shm in
#         the background while the tests run): --steps 16 --batches
#         BATCHES (default 1,64,128; decode after 128-token prompts), and
#         FP8 (--quantize fp8 --batches FP8_BATCHES, default 1,8,64) unless
#         FP8=0; ROUNDS (default 1) times; with bench_cuda_base packed, the
#         base binary before this one in every round (the A/B);
#  tl     a CUPTI timeline of one decode step (bench_cuda --profile-step B,
#         CUDA graphs on) for each B in TL_BATCHES (default "64 128") and
#         FP8 batch TL_FP8 (default 1; empty skips) under the ENVS indices
#         TL_FP8_ENVS (default 0), and one 2,048-token FP8 prefill (graphs
#         off) under each index in TL_PREFILL_ENVS (default none),
#         summarised by kernel;
#  ncu    ncu over one decode step without graphs at NCU_BATCH (default 64):
#         every kernel's time and DRAM bytes (ENVS' first), then the
#         sections of the kernels matching NCU_KERNELS (default decode
#         attention; NCU_COUNT of them) under ENVS' entry NCU_ENV (default 0).
# ENVS: the environments to compare, separated by ";" (default "X=1": one),
# each a list of VAR=value (GRAPHS=0: the FP8 sweep without CUDA graphs);
# e2e runs each in turn ROUNDS times, tl each
# (or the indices in TL_ENVS, "0 2").
# BUDGET (s, default 540) stops starting parts. Logs in /tmp/step23-logs,
# packed to $OUT; the verdict block prints last (device_out.sh).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-540}
PARTS=${PARTS:-"tests e2e tl ncu"}
L=/tmp/step23-logs
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$R/bench/cuda")/device_out.sh"
has() { [[ " $PARTS " == *" $1 "* ]]; }
verdict_lines() {
  for f in $L/e2e_*.log; do
    [ -f "$f" ] && grep -E "^decode batch|^prefill" "$f" | sed "s|^|$(basename "$f" .log): |" | cut -c1-120 | head -8
  done
}
mkdir -p /work
{ [ -d /work/main ] && [ ! -L /work/main ]; } || ln -sfn $R /work/main
(cd /work && tar xJf $V/shared.tar.xz)
[ -x $V/bench_cuda ] || tar xJf $V/bins.tar.xz -C $V
for f in $V/lib/*.xz; do [ -f "$f" ] && xz -d "$f"; done
chmod +x $V/tests $V/bench_cuda*
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
M=/dev/shm/llama8b
if [ ! -f $M.done ]; then
  (python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1 && touch $M.done) &
  MK=$!
fi
cd /tmp || exit 1
if has tests; then
  out_key $L/tests.log
  tmo ${TEST_LIMIT:-200} $V/tests --gtest_filter="${FILTER:-*}" > $L/tests.log 2>&1
  out_rc tests $?
  grep -E "^\[  FAILED|Failure|Expected|Which is" $L/tests.log | cut -c1-200 | head -20
  out_pack
fi
[ -n "${MK:-}" ] && { wait $MK; echo "model made at $(( $(date +%s) - T0 )) s"; }
e2e() {  # e2e NAME BIN ENV...: one sweep (KINDS: "bf16 fp8" by default)
  local name=$1 bin=$2; shift 2
  [ "$(left)" -lt 40 ] && { echo "== $name skipped (time)"; return; }
  if [[ " ${KINDS:-bf16 fp8} " == *" bf16 "* ]]; then
    tmo 70 env "$@" $bin $M --steps 16 --batches ${BATCHES:-1,64,128} > $L/e2e_$name.log 2>&1
    echo "== $name bf16 rc=$?"; grep -E "^decode batch|^prefill" $L/e2e_$name.log | cut -c1-110
  fi
  [ "${FP8:-1}" = 0 ] || [[ " ${KINDS:-bf16 fp8} " != *" fp8 "* ]] && return
  [ "$(left)" -lt 40 ] && { echo "== $name fp8 skipped (time)"; return; }
  local extra=""  # an entry naming GRAPHS=0 runs without CUDA graphs
  [[ " $* " == *" GRAPHS=0 "* ]] && extra="--graphs 0"
  # shellcheck disable=SC2086
  tmo 80 env "$@" $bin $M --quantize fp8 --steps 16 --batches ${FP8_BATCHES:-1,8,64} $extra > $L/e2e_${name}_fp8.log 2>&1
  echo "== $name fp8 rc=$?"; grep -E "^decode batch|^prefill" $L/e2e_${name}_fp8.log | cut -c1-110
}
IFS=';' read -r -a ENVL <<< "${ENVS:-X=1}"
# KINDS_BY_ENV: per entry of ENVS, which sweeps e2e runs ("bf16;bf16;fp8").
IFS=';' read -r -a KINDS_ENV <<< "${KINDS_BY_ENV:-}"
# kbench: the FP8 kernels' timings (bench_fp8_kernels packed by EXTRA_BINS).
if has kbench && [ -x $V/bench_fp8_kernels ]; then
  tmo ${KBENCH_LIMIT:-90} $V/bench_fp8_kernels ${KBENCH_ARGS:---gemm 0 --mma 0} > $L/kbench.log 2>&1
  echo "== kbench rc=$?"; grep -v "^\s*$" $L/kbench.log | cut -c1-160 | head -${KBENCH_LINES:-60}
  out_pack
fi
if has e2e; then
  for r in $(seq ${ROUNDS:-1}); do
    [ -x $V/bench_cuda_base ] && e2e base_r$r $V/bench_cuda_base X=1
    for i in "${!ENVL[@]}"; do
      echo "== env $i: ${ENVL[$i]}"
      # shellcheck disable=SC2086
      KINDS=${KINDS_ENV[$i]:-"bf16 fp8"} e2e env${i}_r$r $V/bench_cuda ${ENVL[$i]}
    done
  done
  out_pack
fi
if has tl; then
  tl() {  # tl NAME ENV ARGS...
    local name=$1 envs=$2; shift 2
    [ "$(left)" -lt 30 ] && { echo "== timeline $name skipped (time)"; return; }
    # shellcheck disable=SC2086
    tmo 90 env CUDA_INJECTION64_PATH=$V/lib/libkernel_timeline.so RILL_TIMELINE=$L/tl_$name.csv $envs \
      $V/bench_cuda $M "$@" > $L/tl_$name.log 2>&1
    echo "== timeline $name ($envs) rc=$?"
    python3 $V/timeline_report.py $L/tl_$name.csv > $L/tl_$name.txt 2>&1; head -${TL_LINES:-32} $L/tl_$name.txt
  }
  for b in ${TL_BATCHES:-64 128}; do
    for i in ${TL_ENVS:-${!ENVL[@]}}; do tl b${b}_env$i "${ENVL[$i]}" --profile-step $b; done
  done
  if [ -n "${TL_FP8-1}" ]; then
    for i in ${TL_FP8_ENVS:-0}; do tl fp8_b${TL_FP8:-1}_env$i "${ENVL[$i]}" --quantize fp8 --profile-step ${TL_FP8:-1}; done
  fi
  for i in ${TL_PREFILL_ENVS:-}; do
    tl fp8_prefill_env$i "${ENVL[$i]}" --quantize fp8 --profile-prefill 1 --graphs 0 --batches 1
  done
  out_pack
fi
if has ncu; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  b=${NCU_BATCH:-64}
  if [ "$(left)" -gt 40 ]; then
    tmo 120 env ${ENVL[0]} $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum \
      --csv $V/bench_cuda $M --profile-step $b --graphs 0 > $L/ncu_times_$b.csv 2> $L/ncu_times_$b.err
    echo "== ncu times $b rc=$?"
  fi
  if [ "$(left)" -gt 40 ]; then
    tmo 150 env ${ENVL[${NCU_ENV:-0}]} $NCU --clock-control none --profile-from-start off -k "regex:${NCU_KERNELS:-decode}" -c ${NCU_COUNT:-2} \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      $V/bench_cuda $M --profile-step $b --graphs 0 > $L/ncu_sections_$b.txt 2>&1
    echo "== ncu sections $b rc=$?"; grep -E "^  [a-z_]+.*\(|Duration|DRAM Through|Memory Through|Achieved Occ|Theoretical Occ|Registers Per|Block Size|Grid Size|Waves Per|Stall|Warp Cycles Per Issued" $L/ncu_sections_$b.txt | head -50
  fi
  out_pack
fi
date -u
