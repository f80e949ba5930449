#!/bin/bash
# Device run of make_carry_k4ccuda22.sh's pack (branch k4ccuda22: iq4_nlh64
# KV on CUDA, written without a GPU), in one call:
#  1. the tests that hold iq4_nlh64 (OPS_FILTER: the backend ops against
#     the CPU Backend, store bytes included; FILTER: the CUDA tests, k4c's
#     among them: CudaKvChanStep, CudaK4c from branch k4cwire22);
#  2. one layer's decode attention alone per KV type (bench_kv_attention);
#  3. the random Llama-3.1-8B bf16 made here: decode batch 1 / 64 after
#     1,024-token prompts and prefill of 2,048 tokens per type (TYPES,
#     default "f16 iq4_nlh iq4_nlh64 k4c"), main's bench_cuda then the
#     branch's for the types main has (iq4_nlh64, k4c: the branch only);
#     k4c runs first, at a cheap shape of its own (batches 1 and 9 after
#     256-token prompts, a 256-token prefill; K4C_TMO seconds, default 90),
#     and is left out of step 2 (bench_kv_attention has no k4c);
#  4. optional (NCU=1): ncu of the fast decode kernel, iq4_nlh vs iq4_nlh64.
# BUDGET: seconds from the start after which no new benchmark starts;
# MIN_LEFT: the seconds a benchmark needs left to start (default 40).
# The repo root is the cwd; the script runs from the carried folder. Logs
# go to /tmp/k4ccuda22-logs; $OUT gets them packed (logs.tar.gz) and the two
# test logs, and the verdict block is printed last (device_out.sh), also
# when the script is cut short. Every timeout is capped by the BUDGET.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaKvTypes.*:CudaAttention.StoredKvTypes*:CudaAttention.HeadDim512*:CudaAttention.DecodeTokensAreBatchInvariant:*CudaKvTiers.*nlh64*:*CudaKvTiers.*q8_0h64*:CudaKvExport.*:*CudaBatchInvariant.*nlh64*:CudaGemma4Hd512.QuantizedKv*:*CudaHf.KvTypeIsTheOne*:KvProbe*:CudaKvChan.*:CudaChanAttention.*:CudaKvChanStep.*:CudaK4c.*:K4cHd64.*'}
OPS_FILTER=${OPS_FILTER:-'*BackendOps.RotatedKvStore*:*BackendOps.AttentionOverPagedKv*:*BackendOps.RopeQkNormAndKvStore*'}
TYPES=${TYPES:-"f16 iq4_nlh iq4_nlh64 k4c"}
BUDGET=${BUDGET:-420}
L=/tmp/k4ccuda22-logs
# left, to (a timeout capped by the budget), tmo (timeout in the
# background), out_key, out_rc; the EXIT trap packs $L and prints the verdict.
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$R/bench/cuda")/device_out.sh"
verdict_lines() {
  grep -hE "^kv " $L/attn.log 2> /dev/null | cut -c1-110 | head -12
  for f in $L/b_*.log; do
    [ -f "$f" ] && grep -E "decode|prefill" "$f" | sed "s|^|$(basename "$f" .log): |" | head -3
  done
}
mkdir -p /work
# The link to the repo root, unless /work/main is a real folder (off the device).
{ [ -d /work/main ] && [ ! -L /work/main ]; } || ln -sfn $R /work/main
(cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V
chmod +x $V/tests $V/bench_cuda $V/bench_kv_attention $V/bench_cuda_main
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
M=/tmp/llama8b
# The model is made on the CPU while the tests use the GPU.
(t0=$(date +%s); timeout $(to 300) python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $L/make.log) &
MK=$!
show() { grep -E "^\[ cuda|^\[  FAILED|^\[  PASSED|Failure|Expected|Which is|actual|error" "$1" | head -${2:-80}; }
cd /tmp
out_key $L/ops.log; out_key $L/tests.log
tmo 90 $V/tests --gtest_filter="${OPS_FILTER}" > $L/ops.log 2>&1; RC_OPS=$?; out_rc ops $RC_OPS; echo "ops rc=$RC_OPS"; show $L/ops.log 30
tmo 210 $V/tests --gtest_filter="${FILTER}" > $L/tests.log 2>&1; RC_TESTS=$?; out_rc tests $RC_TESTS; echo "tests rc=$RC_TESTS"; show $L/tests.log 50
out_pack
grep -c "^\[       OK" $L/tests.log $L/ops.log; echo "tests done at $(( $(date +%s) - T0 )) s"
# The benchmarks below take every CUDA KV type but k4c (bench_kv_attention).
# k4c is no CUDA KV type of bench_kv_attention's (it exits 1 naming it): the pair runs in bench_cuda only.
csv=$(echo $TYPES | tr ' ' '\n' | grep -vx k4c | paste -sd,)
[ -n "$csv" ] && tmo 60 $V/bench_kv_attention --contexts 1024,8192 --batches 1,64 --types $csv > $L/attn.log 2>&1
echo "attn rc=$?"; cut -c1-120 $L/attn.log
wait $MK; tail -2 $L/make.log
# k4c first (branch k4cwire22, the branch's build only: main refuses it), at a
# cheap shape of its own: its attention is the reference's arithmetic, slow
# by design (an end-to-end smoke on the 8B, not a speed to compare): decode
# batch 1 and 9 (9: a decode graph padded to 16) after 256-token prompts,
# a 256-token prefill, within K4C_TMO (default 90) seconds.
if echo " $TYPES " | grep -q " k4c "; then
  if [ $(left) -lt ${MIN_LEFT:-40} ]; then echo "== k4c branch skipped (time)"; else
    tmo ${K4C_TMO:-90} $V/bench_cuda $M --steps 16 --batches 1,9 --context 256 --prefill 256 --kv-type k4c > $L/b_k4c_branch.log 2>&1
    echo "== k4c branch rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "KV|decode|prefill|TTFT|batch +[0-9]" $L/b_k4c_branch.log | cut -c1-200
  fi
fi
for t in $TYPES; do
  [ $t = k4c ] && continue  # above
  for b in main branch; do
    [ $t = iq4_nlh64 ] && [ $b = main ] && continue  # main refuses it
    # One build packed as both (the carry made after the merge): no main runs.
    [ $b = main ] && cmp -s $V/bench_cuda $V/bench_cuda_main && continue
    [ $(left) -lt ${MIN_LEFT:-40} ] && { echo "== $t $b skipped (time)"; continue; }
    bin=$V/bench_cuda; [ $b = main ] && bin=$V/bench_cuda_main
    tmo 45 $bin $M --steps 16 --batches 1,64 --context 1024 --kv-type $t > $L/b_${t}_$b.log 2>&1
    echo "== $t $b rc=$? at $(( $(date +%s) - T0 )) s"; grep -E "KV|decode|prefill|TTFT|batch +[0-9]" $L/b_${t}_$b.log | cut -c1-200
  done
done
NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ "${NCU:-0}" = 1 ] && [ $(left) -gt 30 ] && [ -n "$NCU_BIN" ]; then
  for t in iq4_nlh iq4_nlh64; do
    tmo 25 $NCU_BIN --clock-control none -k regex:decode_fast_kernel -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section LaunchStats --section Occupancy $V/bench_kv_attention --contexts 8192 --batches 64 --types $t > $L/ncu_$t.log 2>&1
    echo "== ncu $t rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Dynamic Shared|L2 Hit" $L/ncu_$t.log | head -12
  done
fi
date -u
# The benchmarks' own failures show in their logs; the tests decide the status.
[ "$RC_OPS" -eq 0 ] && [ "$RC_TESTS" -eq 0 ]
