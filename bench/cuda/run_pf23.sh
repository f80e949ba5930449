#!/bin/bash
# Device run of make_carry_pf23.sh's pack: the tests (FILTER), then main's
# and the branch's bench_cuda side by side on the random Llama-3.1-8B made
# here (decode 1/64/128 and the 2,048-token prefill), the branch with
# RILL_CUDA_FLASH_BLOCKS=2, ncu of one 2,048-token prefill's changed
# kernels (both builds), and one long prompt (LONG tokens, both builds).
# BUDGET: seconds from the start after which no new step starts. PARTS:
# which of "tests bench ncu ncu_main long long32 blocks2 v1" run (default
# all but long32); "ncu" profiles the branch, "ncu_main" main; the model is
# made once per machine (kept in /tmp while the machine stays warm).
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaOps.*:CudaAttention.*:*KvProbe*:*Rope*:*Attention*:LlamaCuda*:*BatchInvariant*:CudaKvTypes.*'}
BUDGET=${BUDGET:-280}
LONG=${LONG:-16384}
PARTS=${PARTS:-"tests bench ncu ncu_main long blocks2 v1"}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p /work && ln -sfn $R /work/main && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda*
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
[ -f $M/config.json ] || (t0=$(date +%s); python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $OUT/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
MK=$!
cd /tmp
RC=0
if has tests; then
  timeout ${TEST_LIMIT:-100} $V/tests --gtest_filter="${FILTER}" > $OUT/tests.log 2>&1; RC=$?
  echo "tests rc=$RC at $(( $(date +%s) - T0 )) s"
  grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran|Failure|Expected|Which is" $OUT/tests.log | head -40
  grep -c "^\[       OK" $OUT/tests.log
fi
wait $MK; tail -2 $OUT/make.log 2>/dev/null
run() {  # name, limit, command...
  local name=$1 lim=$2; shift 2
  [ $(left) -lt 15 ] && { echo "== $name skipped (time)"; return; }
  timeout $lim "$@" > $OUT/$name.log 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "decode|prefill|TTFT|copy|GEMM" $OUT/$name.log | cut -c1-170
}
if has bench; then
  run branch 60 $V/bench_cuda $M --steps 16 --batches 1,64,128
  run main 60 $V/bench_cuda_main $M --steps 16 --batches 1,64,128
fi
has blocks2 && run branch_blocks2 40 env RILL_CUDA_FLASH_BLOCKS=2 $V/bench_cuda $M --steps 4 --batches 1
has v1 && [ -x $V/bench_cuda_v1 ] && run v1 40 $V/bench_cuda_v1 $M --steps 4 --batches 1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in branch main; do
  if [ $b = main ]; then has ncu_main || continue; else has ncu || continue; fi
  bin=$V/bench_cuda; [ $b = main ] && bin=$V/bench_cuda_main
  [ $(left) -lt 30 ] && { echo "== ncu $b skipped (time)"; continue; }
  timeout 70 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --print-units base --csv $bin $M --profile-prefill 1 --graphs 0 > $OUT/ncu_$b.csv 2>$OUT/ncu_$b.err
  echo "== ncu $b rc=$? at $(( $(date +%s) - T0 )) s"
  python3 - $OUT/ncu_$b.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit()
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    k = r[ki].split("(")[0].split("<")[0][:60]; tot[k] += v; cnt[k] += 1
s = sum(tot.values())
print(f"total {s/1e6:.2f} ms over {sum(cnt.values())} kernels")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:14]:
    print(f"{v/1e6:8.3f} ms {100*v/s:5.1f}% {cnt[k]:4d}x {v/cnt[k]/1e3:8.1f} us  {k}")
PY
done
if has long; then
  run long_branch 90 $V/bench_cuda $M --prefill $LONG --batches 1 --steps 2
  run long_main 90 $V/bench_cuda_main $M --prefill $LONG --batches 1 --steps 2
fi
if has long32; then
  run long32_branch 90 $V/bench_cuda $M --prefill 32768 --batches 1 --steps 2
  run long32_main 90 $V/bench_cuda_main $M --prefill 32768 --batches 1 --steps 2
fi
date -u
exit $RC
