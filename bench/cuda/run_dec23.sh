#!/bin/bash
# Device run of make_carry_dec23.sh's pack: the tests (FILTER), then on the
# random Llama-3.1-8B made here `bench_cuda ... --steps 16 --batches
# 1,64,128` (BATCHES) of main and of the branch in the settings RUNS names
# (branch: its defaults, with the GEMM timings of RILL_GEMM_TUNE_LOG=1;
# warpsN: RILL_DECODE_WARPS=N, warps8 being main's decode attention), then ncu kernel times of one decode step at
# each of NCU_BATCHES (no graphs) for the branch and main. BUDGET: seconds
# from the start after which no new step starts. Logs under $OUT (one tar).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaAttention.*:GemmTune.*:LlamaFamily/CudaHf.*:Families/CudaBatchInvariant.*'}
BUDGET=${BUDGET:-300}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda $V/bench_cuda_main
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
L=/tmp/logs; mkdir -p $L
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
(t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $L/make.log) &
MK=$!
cd /tmp
timeout ${TEST_LIMIT:-150} $V/tests --gtest_filter="${FILTER}" > $L/tests.log 2>&1; RC=$?
echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is|variants checked" $L/tests.log | head -40
grep -c "^\[       OK" $L/tests.log
wait $MK; tail -2 $L/make.log
B="--steps 16 --batches ${BATCHES:-1,64,128}"
run() {  # name, env..., binary
  local name=$1; shift
  [ $(left) -lt ${MIN_LEFT:-25} ] && { echo "== $name skipped (time)"; return; }
  local t0=$(date +%s)
  env "$@" $M $B > $L/b_$name.log 2> $L/e_$name.log
  echo "== $name rc=$? $(( $(date +%s) - t0 )) s"; grep -E "decode batch|prefill|TTFT" $L/b_$name.log | cut -c1-150
}
for r in ${RUNS:-main branch warps8 warps4 warps2}; do
  case $r in
    main) run main timeout 60 $V/bench_cuda_main ;;
    branch) run branch RILL_GEMM_TUNE_LOG=1 timeout 60 $V/bench_cuda ;;
    warps[248]) run $r RILL_DECODE_WARPS=${r#warps} timeout 60 $V/bench_cuda ;;
  esac
done
for r in branch; do
  [ -f $L/e_$r.log ] && { echo "$r: $(grep -c 'gemm tune' $L/e_$r.log) timings"; grep "gemm tune bf16 \(64\|128\) " $L/e_$r.log | cut -c1-330; }
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in ${NCU_BATCHES:-64 128}; do
  for w in branch main; do
    [ $(left) -lt ${MIN_LEFT:-25} ] && { echo "== ncu $w $b skipped (time)"; continue; }
    bin=$V/bench_cuda; [ $w = main ] && bin=$V/bench_cuda_main
    timeout 60 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv $bin $M --profile-step $b --graphs 0 > $L/ncu_${w}_$b.csv 2>$L/ncu_${w}_$b.err
    echo "== ncu $w $b rc=$? at $(( $(date +%s) - T0 )) s"
  done
done
(cd $L && tar czf $OUT/logs.tar.gz .)
date -u
exit $RC
