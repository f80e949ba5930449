#!/bin/bash
# Device side of make_carry_table23.sh: issue 23's table in one call on the
# random Llama-3.1-8B (made here, bf16), each line's command in the log:
#   bf16     bench_cuda --batches 1,64,128 (decode after 128-token prompts,
#            prefill of 2,048 tokens)
#   long     bench_cuda --prefill 16384 and 32768
#   fp8      bench_cuda --quantize fp8 --batches 1,8,64
#   serve    rill bench c=64, serve_bench.py c=64 (one and eight client
#            processes), rill bench c=64 again: served / direct
#   sat      rill bench at 256 and 512 concurrent 128-in/128-out requests
#   peer     peer_torch.py (compiled PyTorch) at batch 1/64/128 + prefill
#   ceil     gpu_ceilings.py (copy GB/s, bf16 GEMM TFLOP/s)
#   glu      the 16-bit gate/up route's A/B (glu_narrow.h): bench_cuda
#            --batches 1 (its prefill of 2,048 tokens) with RILL_GLU_NARROW
#            =0 then =1, three times interleaved (not in the default PARTS)
# PARTS picks (default all but peer), BUDGET (s) stops starting new parts
# and caps every timeout. Logs go to /tmp/table23-logs (NAME.log, NAME.err,
# summary.txt: each part's command, rc and headline); $OUT gets them packed
# (logs.tar.gz), and the verdict block (every rc, summary.txt) is printed
# last (device_out.sh), also when the script is cut short.
T0=$(date +%s)
R=$PWD; V=$(cd "$(dirname "$0")" && pwd)
BUDGET=${BUDGET:-420}
PARTS=${PARTS:-"ceil bf16 long fp8 serve sat"}
L=/tmp/table23-logs
# left, to (a timeout capped by the budget), tmo (timeout in the
# background); the EXIT trap packs $L and prints the verdict.
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$R/bench/cuda")/device_out.sh"
verdict_lines() { cut -c1-200 $L/summary.txt 2> /dev/null | tail -60; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p /work && (cd /work && tar xJf $V/shared.tar.xz)
tar xJf $V/bins.tar.xz -C $V && chmod +x $V/rill $V/bench_cuda
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
lscpu | grep -E "^Model name|^CPU\(s\)" | tr -s ' '
M=/tmp/llama8b
[ -f $M/config.json ] || { tmo 300 python3 /work/shared/tools/make_random_model.py llama-3.1-8b $M > $L/make.log 2>&1; echo "model rc=$?"; }
cd /tmp
run() {  # name, limit, command...
  local name=$1 lim=$2; shift 2
  [ $(left) -lt 20 ] && { echo "== $name skipped (time)"; return; }
  echo "== $name: $*" | sed "s|$V/||g" | tee -a $L/summary.txt
  tmo $lim "$@" > $L/$name.log 2> $L/$name.err
  local rc=$?
  echo "   rc=$rc at $(( $(date +%s) - T0 )) s" | tee -a $L/summary.txt
  [ $rc = 0 ] || tail -3 $L/$name.err | cut -c1-200
  if [ "$1" = "$V/rill" ]; then  # rill bench --json: one summary line
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("   output %.0f tok/s, decode %.0f tok/s, ITL p50/p99 %.2f/%.2f ms, TTFT p50 %.0f ms, steps %d (pipelined %d)" % (d["output_tok_s"], d["decode_tok_s"], d["itl_ms"]["p50"], d["itl_ms"]["p99"], d["ttft_ms"]["p50"], d["steps"], d["steps_pipelined"]))' $L/$name.log 2>&1 | tail -1
  else
    cat $L/$name.err $L/$name.log | grep -E "^(ceilings|prefill|decode|TTFT)|copy|GEMM|tok/s|^\{|\| [0-9]" | cut -c1-200 | head -20
  fi | tee -a $L/summary.txt
  out_pack
}
has ceil && run ceil 60 python3 $V/py/gpu_ceilings.py
has bf16 && run bf16 60 $V/bench_cuda $M --steps 16 --batches 1,64,128
has long && run long16k 60 $V/bench_cuda $M --prefill 16384 --batches 1 --steps 2
has long && run long32k 80 $V/bench_cuda $M --prefill 32768 --batches 1 --steps 2
if has glu; then
  for i in 1 2 3; do
    for g in 0 1; do RILL_GLU_NARROW=$g run glu${g}_$i 45 $V/bench_cuda $M --steps 4 --batches 1; done
  done
fi
has fp8 && run fp8 80 $V/bench_cuda $M --quantize fp8 --steps 16 --batches 1,8,64
B64="--device cuda --concurrency 64 --requests 128 --prompt-tokens 128 --gen-tokens 128 --json"
if has serve; then
  run direct64a 60 $V/rill bench $M $B64
  for p in 8 1; do
    run served64_p$p 120 python3 $V/py/serve_bench.py --rill $V/rill --model $M --threads 8 --skip compare,idle \
      --levels 64 --load-gen-tokens 128 --prompt-tokens 128 --client-procs $p --out $L/serve_p$p.json \
      --server-args "--device cuda --max-running 64"
  done
  run direct64b 60 $V/rill bench $M $B64
fi
if has sat; then
  run sat256 60 $V/rill bench $M --device cuda --concurrency 256 --requests 512 --prompt-tokens 128 --gen-tokens 128 --json
  run sat512 60 $V/rill bench $M --device cuda --concurrency 512 --requests 1024 --prompt-tokens 128 --gen-tokens 128 --json
fi
has peer && run peer 200 python3 $V/py/peer_torch.py $M --json $L/peer.json --batches 1,64,128 --budget 180
date -u
