#!/bin/bash
# Issue 23, branch q8dp4a23, device side (carry .device/q8dp4a23, made by
# make_carry_q8dp4a23.sh; run `bash .device/q8dp4a23/run.sh`): the Q8_0
# dp4a decode GEMV (RILL_Q8_DP4A=1) beside main's paths and llama.cpp CUDA,
# in one call. Logs go to /dev/shm/q8d/logs as PART.log; $OUT gets them
# packed (logs.tar.gz) and the test log, and the verdict block is printed
# last (device_out.sh), also when the script is cut short.
#  tests   test_q8_dp4a (the new kernel against its host restatement, bit
#          for bit; the f64 bound; batch invariance; quant_matmul's switch)
#          (cuda_quant_test, every quantized path, runs in the general
#          verify call: make_carry_verify.sh; the carry has no room for it);
#  model   the random Llama-3.1-8B in F16 (make_bench_model.py
#          --fast-random, seed 1) into /dev/shm, llama-quantize to Q8_0 (in
#          the background from the start; the F16 file removed after), or,
#          with no llama-quantize in the carry, Q8_0 random blocks;
#  kernels bench_cuda x --quant-kernels 1 --quant-only Q8_0:SHAPE per 8B
#          shape, this branch (f32 GEMV, quant_mma, dp4a from the GGUF
#          blocks and from repacked rows; single calls and 16 back to back)
#          and main (its GEMV and quant_mma: the same call's baseline);
#  llama   llama-batched-bench -npp 128 -ntg 128 -npl 1,8,64 (decode) and
#          -npp 2048 -ntg 8 -npl 1 (prefill) on the file (llama-bench left
#          out: with it the carry and the tree pass the 64 MiB limit);
#  rill    bench_cuda FILE --batches 1,8,64 --steps 16: main, this branch
#          with RILL_Q8_DP4A=0 (main's paths) and =1 (dp4a at 1 and 8), or
#          the runs RILL_CONFIGS names (below: e.g. quant_mmq off / on);
#  ncu     one launch each of the Q8_0:qkv kernels at 1 token (quant_gemv,
#          q8_dp4a from blocks, from rows) and 8 (quant_mma, q8_dp4a both
#          layouts): SOL, memory, instructions, warp states (NCU_SHAPE,
#          default qkv; NCU=0: none).
# Order: tests (while the model is made: CPU work only), then rill, llama,
# kernels, ncu on a quiet host. PARTS picks (default all), BUDGET (s,
# default 570) stops starting parts.
T0=$(date +%s)
V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-570}
PARTS=${PARTS:-"tests model kernels llama rill ncu"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set +e
W=/dev/shm/q8d
L=$W/logs
O=$L
# left, to (a timeout capped by the budget), tmo (timeout in the
# background), out_key, out_rc; the EXIT trap packs $L and prints the verdict.
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$PWD/bench/cuda")/device_out.sh"
verdict_lines() {
  grep -hE "^decode" $O/rill_*.log 2> /dev/null | head -12
  grep -hE "^\| +[0-9]" $O/llama_batched.log $O/llama_prefill.log 2> /dev/null | head -8
  for f in $O/k_*_*.log; do
    [ -f "$f" ] && grep -E "^quant" "$f" | sed "s/  */ /g; s|^|$(basename "$f" .log): |" | cut -c1-200 | head -3
  done
}
tar xJf $V/bin.tar.xz -C $W
B=$W/bin
# bench_main is bench_new when the carry was made from one build (main after
# the merge: RILL_Q8_DP4A=0 is main's path); its runs are then skipped.
SAME=$(cmp -s $B/bench_main $B/bench_new && echo 1)
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
lscpu | grep -E "^Model name|^CPU\(s\)" | tr -s ' '
echo "unpacked at $(($(date +%s) - T0)) s"
# Without llama-quantize in the carry (RANDOM_BLOCKS=1 there), the Q8_0
# file is random blocks (the same tensors and bytes: speed only).
# QTYPE (default Q8_0): the file's type (Q4_K_M too; random blocks: any
# type make_bench_model.py --random-blocks knows).
Q=${QTYPE:-Q8_0}
F=$W/llama-3.1-8b.$Q.gguf
QUANT="--fast-random --llama-quantize $B/llama-quantize"
[ -x $B/llama-quantize ] || { QUANT=--random-blocks; F=$W/llama-3.1-8b.$Q-random.gguf; }
if has model && [ ! -f $F ]; then
  (PYTHONPATH=$B/py:$B/py/fallback timeout $(to 200) python3 $B/py/bench/make_bench_model.py --shape llama-3.1-8b \
    $QUANT --no-venv --threads 16 --out-dir $W --types $Q \
    > $O/model.log 2>&1
  echo "rc=$?" >> $O/model.log
  rm -f $W/llama-3.1-8b.F16.gguf) &
  MK=$!
fi
# The carry holds test_q8_dp4a only when made with TESTS=1 (the verify
# call runs it with every other GPU test; without it the carry keeps a
# margin under the 64 MiB limit).
if has tests && [ -x $B/test_q8_dp4a ]; then
  for t in test_q8_dp4a; do
    out_key $O/$t.log
    tmo 120 $B/$t > $O/$t.log 2>&1
    r=$?
    out_rc $t $r
    echo "== $t rc=$r at $(($(date +%s) - T0)) s"
    grep -E "^\[ cuda|FAILED|Failure|Expected|Which is|error:|PASSED|SKIPPED" $O/$t.log | head -30
  done
  out_pack
fi
if [ -n "$MK" ]; then
  wait $MK
  tail -3 $O/model.log
  ls -la $W/*.gguf
  echo "model done at $(($(date +%s) - T0)) s"
fi
# RILL_CONFIGS: the runs, each BIN:DP4A:MMQ[:EXTRA] (RILL_Q8_DP4A,
# RILL_QUANT_MMQ; a trailing b: again at the end, only with time to spare,
# for drift; EXTRA: more VAR=VALUE settings, comma-separated);
# BATCHES: bench_cuda's --batches (default 1,8,64).
if has rill && [ -f $F ]; then
  for c in ${RILL_CONFIGS:-main:0:0 new:0:0 new:1:0 main:0:0b}; do
    IFS=: read -r bin dp mmq extra <<< "$c"
    [ -n "$SAME" ] && [ "$bin" = main ] && continue
    [ "$(left)" -lt 50 ] && { echo "== rill $c skipped (time)"; continue; }
    [ "${mmq%b}" != "$mmq" ] && [ "$(left)" -lt 140 ] && continue
    echo "== bench_$bin RILL_Q8_DP4A=$dp RILL_QUANT_MMQ=${mmq%b} ${extra//,/ } --batches ${BATCHES:-1,8,64} --steps 16"
    lg=$O/rill_${bin}_${dp}_$mmq${extra:+_${extra//[=,]/_}}.log
    env ${extra//,/ } RILL_Q8_DP4A=$dp RILL_QUANT_MMQ=${mmq%b} tmo 90 $B/bench_$bin $F --batches ${BATCHES:-1,8,64} \
      --steps 16 > "$lg" 2>&1
    grep -E "^(ceilings|model|prefill|decode)|rror" "$lg"
  done
  echo "rill done at $(($(date +%s) - T0)) s"
fi
if has llama && [ -f $F ] && [ -x $B/llama-batched-bench ]; then
  if [ "$(left)" -lt 120 ]; then
    echo "== llama skipped (time)"
  else
    echo "== llama-batched-bench -npp 128 -ntg 128 -npl 1,8,64 (S_TG: decode tok/s)"
    tmo 120 $B/llama-batched-bench -m $F -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 \
      -npl 1,8,64 > $O/llama_batched.log 2>&1
    grep -E "^\||error|failed" $O/llama_batched.log
    echo "== llama-batched-bench -npp 2048 -ntg 8 -npl 1 (S_PP: prefill tok/s)"
    tmo 60 $B/llama-batched-bench -m $F -ngl 99 -fa on -c 4096 -b 2048 -ub 512 -npp 2048 -ntg 8 \
      -npl 1 > $O/llama_prefill.log 2>&1
    grep -E "^\||error|failed" $O/llama_prefill.log
    echo "llama done at $(($(date +%s) - T0)) s"
  fi
fi
if has kernels; then
  for s in qkv o gate_up down lm_head; do
    [ "$(left)" -lt 60 ] && { echo "== kernels $s skipped (time)"; continue; }
    for b in main new; do
      [ -n "$SAME" ] && [ $b = main ] && continue
      echo "== $b Q8_0:$s"
      tmo 60 $B/bench_$b x --quant-kernels 1 --quant-only Q8_0:$s > $O/k_${b}_$s.log 2>&1
      grep -E "^quant|^  x16" $O/k_${b}_$s.log | sed 's/  */ /g' | cut -c1-300
    done
  done
  echo "kernels done at $(($(date +%s) - T0)) s"
fi
NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
has ncu && [ -z "$NCU_BIN" ] && echo "== ncu: not on this machine"
if has ncu && [ "${NCU:-1}" != 0 ] && [ -n "$NCU_BIN" ]; then
  S=${NCU_SHAPE:-qkv}
  # Per kernel name, the launch to profile: each variant runs 24 times
  # (bench_cuda's time()), in the order n=1 then n=8 (dp4a: blocks n=1,
  # n=8, then rows n=1, n=8).
  for k in "quant_gemv_kernel 3 gemv_n1" "q8_dp4a_kernel 3 dp4a_n1" "q8_dp4a_kernel 51 rows_n1" \
    "quant_mma_kernel 27 mma_n8" "q8_dp4a_kernel 27 dp4a_n8" "q8_dp4a_kernel 75 rows_n8"; do
    set -- $k
    [ "$(left)" -lt 40 ] && { echo "== ncu $3 skipped (time)"; continue; }
    tmo 60 $NCU_BIN --clock-control none -k regex:$1 --launch-skip $2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section InstructionStats --section WarpStateStats --section Occupancy --section LaunchStats \
      $B/bench_new x --quant-kernels 1 --quant-only Q8_0:$S > $O/ncu_${S}_$3.txt 2>&1
    echo "== ncu Q8_0:$S $3 rc=$?"
    grep -E "^  [a-z_0-9]+<|Duration|DRAM Throughput|Memory Throughput|L1/TEX Cache Throughput|L1/TEX Hit|Compute \(SM\)|Executed Ipc A|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Theoretical Occ" \
      $O/ncu_${S}_$3.txt | sed 's/  */ /g' | head -12
  done
fi
echo "total $(($(date +%s) - T0)) s"
# KEEP_MODEL=1 keeps the GGUF in /dev/shm for a next call on the warm machine.
rm -rf "${W:?}/bin"
[ "${KEEP_MODEL:-0}" = 1 ] || rm -f "$W"/*.gguf
