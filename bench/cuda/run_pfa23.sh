#!/bin/bash
# Device run of make_carry_pfa23.sh's pack: the tests (FILTER), then main's
# and the branch's bench_cuda side by side on the random Llama-3.1-8B made
# here (`--steps 16 --batches 1`: the 2,048-token prefill), the branch with
# RILL_CUDA_FLASH_WGMMA=0 (the mma.sync flash kernel), the SM clock, power
# and throttle reasons sampled every 50 ms meanwhile (smi.csv), a CUPTI
# timeline of one 2,048-token forward of each build (kernel_timeline.cpp,
# summarised by timeline_report.py), and long prompts (16,384 and 32,768
# tokens, both builds).
# Also: "pair": main's binary twice with the GEMM tuner and twice without
# (RILL_GEMM_TUNE=0: cuBLASLt's heuristic's first), interleaved, the first
# tuned run logging its timings (RILL_GEMM_TUNE_LOG=1); "timeline16": main's
# timeline of a 16,384-token forward; "ncuflash": ncu's speed-of-light,
# memory and warp-state sections for one launch of main's flash kernel.
# MAIN_ONLY=1: the long parts run main's binary alone.
# BUDGET: seconds from the start after which no new step starts. PARTS:
# which of "tests bench nowg timeline timeline_main long long32 pair
# timeline16 ncuflash" run.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaOps.*:CudaAttention.*:*KvProbe*:*Rope*:*Attention*:LlamaCuda*:*BatchInvariant*:CudaKvTypes.*'}
BUDGET=${BUDGET:-200}
PARTS=${PARTS:-"tests bench nowg timeline timeline_main long long32"}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
[ -f $V/lib/libcupti.so.13.xz ] && xz -d $V/lib/libcupti.so.13.xz
chmod +x $V/tests $V/bench_cuda*
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader
M=/tmp/llama8b
[ -f $M/config.json ] || (t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
cd /tmp
RC=0
if has tests; then
  timeout ${TEST_LIMIT:-90} $V/tests --gtest_filter="${FILTER}" > $OUT/tests.log 2>&1; RC=$?
  echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is" $OUT/tests.log | head -30
  grep -c "^\[       OK" $OUT/tests.log
  grep -E "WgmmaFlash" $OUT/tests.log | head -3
fi
wait $MK; tail -2 $OUT/make.log 2>/dev/null
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 50 > $OUT/smi.csv 2>&1 &
SMI=$!
run() {  # name, limit, command...
  local name=$1 lim=$2; shift 2
  [ $(left) -lt 15 ] && { echo "== $name skipped (time)"; return; }
  echo "$(date +%H:%M:%S.%N | cut -c1-12) start $name" >> $OUT/smi_marks.txt
  timeout $lim "$@" > $OUT/$name.log 2>&1
  local rc=$?
  echo "$(date +%H:%M:%S.%N | cut -c1-12) end $name" >> $OUT/smi_marks.txt
  echo "== $name rc=$rc at $(( $(date +%s) - T0 )) s"; grep -E "decode|prefill|TTFT|copy|GEMM" $OUT/$name.log | cut -c1-170
}
if has bench; then
  run main 50 $V/bench_cuda_main $M --steps 16 --batches 1
  run branch 50 $V/bench_cuda $M --steps 16 --batches 1
fi
has nowg && run branch_nowg 50 env RILL_CUDA_FLASH_WGMMA=0 $V/bench_cuda $M --steps 16 --batches 1
for b in timeline timeline_main; do
  has $b || continue
  bin=$V/bench_cuda; [ $b = timeline_main ] && bin=$V/bench_cuda_main
  run $b 50 env CUDA_INJECTION64_PATH=$V/lib/libkernel_timeline.so RILL_TIMELINE=$OUT/$b.csv $bin $M --profile-prefill 1 --graphs 0 --batches 1
  python3 $V/timeline_report.py $OUT/$b.csv 2>&1 | head -40
done
if has pair; then
  run pair_tuned_a 50 env RILL_GEMM_TUNE_LOG=1 $V/bench_cuda_main $M --steps 16 --batches 1
  grep "gemm tune" $OUT/pair_tuned_a.log | grep -v " 1 x \| 8 x \| 16 x " | cut -c1-250 | head -12
  run pair_notune_a 50 env RILL_GEMM_TUNE=0 $V/bench_cuda_main $M --steps 16 --batches 1
  run pair_tuned_b 50 $V/bench_cuda_main $M --steps 16 --batches 1
  run pair_notune_b 50 env RILL_GEMM_TUNE=0 $V/bench_cuda_main $M --steps 16 --batches 1
fi
if has timeline16; then
  run timeline16 60 env CUDA_INJECTION64_PATH=$V/lib/libkernel_timeline.so RILL_TIMELINE=$OUT/timeline16.csv $V/bench_cuda_main $M --prefill 16384 --profile-prefill 1 --graphs 0 --batches 1
  python3 $V/timeline_report.py $OUT/timeline16.csv 2>&1 | head -24
fi
if has ncuflash; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  run ncuflash 70 $NCU --clock-control none --profile-from-start off -k regex:flash_prefill -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy $V/bench_cuda_main $M --profile-prefill 1 --graphs 0 --batches 1
  grep -E "Throughput|Duration|Busy|Stall|Warp Cycles|Issued|Occupancy|Bandwidth|Hit Rate|Pipe|SM Frequency|Registers|Shared Memory" $OUT/ncuflash.log | grep -v "^==PROF" | head -60
fi
if has long; then
  run long_main 60 $V/bench_cuda_main $M --prefill 16384 --batches 1 --steps 2
  [ "${MAIN_ONLY:-0}" = 1 ] || run long_branch 60 $V/bench_cuda $M --prefill 16384 --batches 1 --steps 2
fi
if has long32; then
  run long32_main 60 $V/bench_cuda_main $M --prefill 32768 --batches 1 --steps 2
  [ "${MAIN_ONLY:-0}" = 1 ] || run long32_branch 60 $V/bench_cuda $M --prefill 32768 --batches 1 --steps 2
fi
kill $SMI 2>/dev/null
python3 - $OUT/smi.csv $OUT/smi_marks.txt <<'PY'
import sys
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
marks = [l.split() for l in open(sys.argv[2])]
def t(s): h, m, x = s.split(":"); return int(h) * 3600 + int(m) * 60 + float(x)
pts = []
for r in rows:
    try: pts.append((t(r[0].split()[-1]), float(r[1].split()[0]), float(r[3].split()[0]), r[5]))
    except Exception: pass
for i in range(0, len(marks) - 1, 2):
    a, b, name = t(marks[i][0]), t(marks[i + 1][0]), marks[i][2]
    sel = [p for p in pts if a <= p[0] <= b]
    if not sel: continue
    busy = [p for p in sel if p[2] > 250]
    clk = sorted(p[1] for p in busy) or [0]
    pw = [p[2] for p in busy] or [0]
    reasons = sorted(set(p[3] for p in busy))
    print(f"smi {name}: {len(sel)} samples, {len(busy)} over 250 W: SM clock min {clk[0]:.0f} median {clk[len(clk)//2]:.0f} max {clk[-1]:.0f} MHz, power max {max(pw):.0f} W, throttle reasons {reasons}")
PY
(cd $OUT && xz -T4 timeline*.csv 2>/dev/null)
date -u
exit $RC
