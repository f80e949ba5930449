#!/bin/bash
# Device run of make_carry_fp823.sh's pack: the FP8 weights tests (and
# ModelsRunInFp8 under each FP8 GEMM configuration), then on the random
# Llama-3.1-8B made here, `bench_cuda --quantize fp8` of main and of the
# branch in its FP8 GEMM configurations (RILL_FP8_FAST_ACCUM x
# RILL_FP8_BF16_D), ncu of one FP8 prefill and one B=64 FP8 step (main and
# the branch's CONF), and the 8B's logits against bf16
# (Fp8Weights.LargeModelAgainstBf16). BUDGET: seconds from the start after
# which no new step starts. PARTS: which of "tests golden bench ncu acc
# bench2" run (default all); CONF: the branch's configuration for ncu
# ("1 1"); FILTER: the tests run. LAYERS (optional): a model of that many
# of the 8B's layers (make_llama8b_layers.py) instead of the 8B, for
# per-layer profiles. The logs go back as one tar (logs.tar.gz).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-250}
PARTS=${PARTS:-"tests golden bench ncu acc bench2"}
FILTER=${FILTER:-'Fp8Weights.*'}
CONF=${CONF:-"1 1"}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p /work && ln -sfn $R /work/main && ln -sfn $R /work/wt-fp823 && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda*
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
O=$OUT; OUT=/tmp/fp823_out; rm -rf $OUT; mkdir -p $OUT
trap 'tar czf $O/logs.tar.gz -C /tmp fp823_out' EXIT
M=/tmp/llama8b; MAKE="python3 /work/shared/tools/make_random_model.py llama-3.1-8b"
if [ -n "${LAYERS:-}" ]; then M=/tmp/llama8b_${LAYERS}l; MAKE="python3 $V/make_llama8b_layers.py $LAYERS"; fi
[ -f $M/config.json ] || (t0=$(date +%s); $MAKE $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
cd /tmp
RC=0
if has tests; then
  timeout 90 $V/tests --gtest_filter="$FILTER" > $OUT/tests.log 2>&1; RC=$?
  echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is|\[ fp8|OK \]" $OUT/tests.log | head -70
fi
if has golden; then
  for c in "0 0" "1 0" "1 1"; do
    set -- $c
    RILL_FP8_FAST_ACCUM=$1 RILL_FP8_BF16_D=$2 timeout 40 $V/tests --gtest_filter='Fp8Weights.ModelsRunInFp8' > $OUT/golden_$1$2.log 2>&1
    echo "== ModelsRunInFp8 fast $1 bf16 D $2: rc=$?"; grep -E "\[ fp8|FAILED|Failure" $OUT/golden_$1$2.log
  done
fi
wait $MK; tail -2 $OUT/make.log 2>/dev/null
run() {  # name, limit, command...
  local name=$1 lim=$2; shift 2
  [ $(left) -lt 15 ] && { echo "== $name skipped (time)"; return; }
  timeout $lim "$@" > $OUT/$name.log 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "decode|prefill|TTFT|copy|GEMM" $OUT/$name.log | cut -c1-170
}
B="--steps 12 --batches 1,8,64 --quantize fp8"
if has bench; then
  run main 60 $V/bench_cuda_main $M $B
  run branch_f1d1 60 env RILL_FP8_FAST_ACCUM=1 RILL_FP8_BF16_D=1 $V/bench_cuda $M $B
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
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:24]:
    print(f"{v/1e6:8.3f} ms {100*v/s:5.1f}% {cnt[k]:4d}x {v/cnt[k]/1e3:8.1f} us  {k}")
PY
}
prof() {  # name, binary, args...
  local name=$1 bin=$2; shift 2
  [ $(left) -lt 30 ] && { echo "== ncu $name skipped (time)"; return; }
  set -- $CONF "$@"
  local fa=$1 bd=$2; shift 2
  RILL_FP8_FAST_ACCUM=$fa RILL_FP8_BF16_D=$bd timeout 70 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --print-units base --csv $bin $M --quantize fp8 --graphs 0 "$@" > $OUT/ncu_$name.csv 2>$OUT/ncu_$name.err
  echo "== ncu $name rc=$? at $(( $(date +%s) - T0 )) s"; summ $OUT/ncu_$name.csv
}
if has ncu; then
  prof main_prefill $V/bench_cuda_main --profile-prefill 1
  prof branch_prefill $V/bench_cuda --profile-prefill 1
  prof main_b64 $V/bench_cuda_main --profile-step 64
  prof branch_b64 $V/bench_cuda --profile-step 64
fi
if has acc && [ $(left) -gt 40 ]; then
  RILL_FP8_ACCURACY_MODEL=$M timeout 100 $V/tests --gtest_filter='Fp8Weights.LargeModelAgainstBf16' > $OUT/acc.log 2>&1
  echo "== accuracy rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "\[ fp8|FAILED|Failure|SKIPPED" $OUT/acc.log
fi
if has bench2; then
  run branch_f0d1 60 env RILL_FP8_FAST_ACCUM=0 RILL_FP8_BF16_D=1 $V/bench_cuda $M $B
  run branch_f1d0 60 env RILL_FP8_FAST_ACCUM=1 RILL_FP8_BF16_D=0 $V/bench_cuda $M $B
fi
date -u
exit $RC
