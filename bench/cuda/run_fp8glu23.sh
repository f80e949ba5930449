#!/bin/bash
# Device run of make_carry_fp8glu23.sh's pack: the Fp8Glu tests (fused
# gate_up scale pass + GLU against scale pass then GLU, bit for bit) and the
# Fp8Weights tests but the opt-in 8B one (the HF goldens in FP8 go through
# matmul_glu too), then on the random Llama-3.1-8B made here
# `bench_cuda --quantize fp8` (prefill 2,048 and decode B=1/64) of main and
# of the branch, main first, then each again in the other order, and ncu of
# one FP8 prefill of each (per-kernel sums). BUDGET: seconds from the start
# after which no new step starts. PARTS: which of "tests bench ncu" run
# (default all). Logs come back as one tar (logs.tar.gz).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-300}
PARTS=${PARTS:-"tests bench ncu"}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests_* $V/bench_cuda*
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
O=$OUT; OUT=/tmp/fp8glu23_out; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $O/logs.tar.gz -C /tmp fp8glu23_out' EXIT
M=/tmp/llama8b
[ -f $M/config.json ] || (t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1;
  echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
cd /tmp
RC=0
if has tests; then
  timeout 120 $V/tests_glu > $OUT/tests_glu.log 2>&1; RC=$?
  echo "Fp8Glu tests rc=$RC at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is|differ|fp8 glu\] fused|OK \]" $OUT/tests_glu.log | head -40
  timeout 120 $V/tests_fp8 --gtest_filter='Fp8Weights.*:-Fp8Weights.LargeModelAgainstBf16' > $OUT/tests_fp8.log 2>&1
  r=$?; [ $r -ne 0 ] && RC=$r
  echo "Fp8Weights tests rc=$r at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|OK \]" $OUT/tests_fp8.log | head -30
fi
wait $MK; tail -2 $OUT/make.log 2>/dev/null
run() {  # name, limit, command...
  local name=$1 lim=$2; shift 2
  [ $(left) -lt 15 ] && { echo "== $name skipped (time)"; return; }
  timeout $lim "$@" > $OUT/$name.log 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "decode|prefill" $OUT/$name.log | cut -c1-170
}
B="--steps 12 --batches 1,64 --quantize fp8"
if has bench; then
  run main 60 $V/bench_cuda_main $M $B
  run branch 60 $V/bench_cuda $M $B
  run branch2 60 $V/bench_cuda $M $B
  run main2 60 $V/bench_cuda_main $M $B
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
summ() {
  python3 - $1 <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    k = r[ki].replace("void ", "").replace("(anonymous namespace)::", "").replace("rill::cuda::", "")
    k = k.split("(")[0].split("<")[0][:70]; tot[k] += v; cnt[k] += 1
s = sum(tot.values())
print(f"total {s/1e6:.3f} ms over {sum(cnt.values())} kernels")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:16]:
    print(f"{v/1e6:8.3f} ms {100*v/s:5.1f}% {cnt[k]:4d}x {v/cnt[k]/1e3:8.1f} us  {k}")
PY
}
prof() {  # name, binary
  [ $(left) -lt 30 ] && { echo "== ncu $1 skipped (time)"; return; }
  timeout 70 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --print-units base \
    --csv $2 $M --quantize fp8 --graphs 0 --profile-prefill 1 > $OUT/ncu_$1.csv 2>$OUT/ncu_$1.err
  echo "== ncu $1 rc=$? at $(( $(date +%s) - T0 )) s"; summ $OUT/ncu_$1.csv
}
if has ncu; then
  prof main_prefill $V/bench_cuda_main
  prof branch_prefill $V/bench_cuda
fi
date -u
exit $RC
