#!/bin/bash
# GGUF on CUDA at batch 64 (issue 23, branch gguf23), device side, in one
# call: this build's bench_cuda against a baseline build's on the random
# Llama-3.1-8B as Q4_K_M and Q8_0, written on the device by
# make_bench_model.py --random-blocks (Q4_K_M: llama-quantize's type mix of
# that file type, random blocks: no llama-quantize needed; the kernels'
# speed does not depend on the values).
# The folder (DIR) holds bin.tar.xz (bin/: bench_cuda, bench_cuda_base,
# test_cuda_cuda_quant_test), lib/ (libxxhash, libutf8proc, libpcre2-8)
# and py/ (bench/make_bench_model.py, tools/tools_venv.py, gguf-py's gguf,
# yaml); assembled on the builder:
#   D=DIR; mkdir -p $D/bin $D/lib $D/py/bench $D/py/tools
#   cp build-cpu/bench/bench_cuda build-cpu/tests/test_cuda_cuda_quant_test $D/bin/
#   cp BASE/bench/bench_cuda $D/bin/bench_cuda_base; strip $D/bin/*
#   tar cf - -C $D bin | xz -9 -T1 > $D/bin.tar.xz; rm -r $D/bin
#   cp -L /lib/x86_64-linux-gnu/{libxxhash.so.0,libutf8proc.so.2,libpcre2-8.so.0} $D/lib/
#   cp bench/make_bench_model.py $D/py/bench/; cp tools/tools_venv.py $D/py/tools/
#   cp -r build/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf .venv/lib/python3*/site-packages/yaml $D/py/
#   cp bench/cuda/gguf_dequant_run.sh $D/run.sh
# Then on the device: bash DIR/run.sh (NCU=0: no ncu). Steps: the quant
# test; the two models (side by side); per type bench_cuda_base and
# bench_cuda (--batches 1,8,64 --steps 16: decode after 128-token prompts,
# prefill of 2,048); bench_cuda --quant-kernels 2 (the dequantization
# alone, with the GEMM at 64 tokens, in L2-sized slabs) with
# RILL_CUDA_DEQUANT_TILES=0 (the item kernel) and 1 (the tile kernel, the
# default); ncu on the gate_up dequantization in Q4_K and Q8_0 (item and
# tile kernel), and the kernel times of one Q4_K_M decode step at batch 64
# (this build). TYPES="Q4_K_M" (default "Q4_K_M Q8_0"): those models only;
# QK=0: no --quant-kernels.
cd "$(dirname "$0")"
D=$PWD
W=/dev/shm/gguf23
mkdir -p $W
tar xJf bin.tar.xz -C $W
B=$W/bin
export LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
now() { date +%s.%N; }
step() { awk -v a="$2" -v b="$(now)" -v n="$1" 'BEGIN { printf "time: %-36s %6.1f s\n", n, b - a }'; }
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
t=$(now)
timeout 120 $B/test_cuda_cuda_quant_test > $W/test.log 2>&1
echo "test_cuda_cuda_quant_test rc=$?"
grep -E "^\[  |FAILED|Failure|Expected|Which is|PASSED" $W/test.log | head -40
[ -n "$OUT" ] && cp $W/test.log $OUT/
step test $t
t=$(now)
for q in ${TYPES:-Q4_K_M Q8_0}; do
  PYTHONPATH=$D/py timeout 150 python3 $D/py/bench/make_bench_model.py --shape llama-3.1-8b --random-blocks \
    --no-venv --out-dir $W --types $q > $W/make_$q.log 2>&1 &
done
wait
step "models (random blocks)" $t
ls -la $W/*.gguf | awk '{print $5, $9}'
for q in ${TYPES:-Q4_K_M Q8_0}; do
  M=$W/llama-3.1-8b.$q-random.gguf
  [ -f $M ] || { echo "no $q model"; tail -5 $W/make_$q.log; continue; }
  for b in bench_cuda_base bench_cuda; do
    t=$(now)
    echo "-- $q $b"
    timeout 120 $B/$b $M --batches 1,8,64 --steps 16 2>&1 | grep -E "^(ceilings|model|prefill|decode)|rror"
    step "$q $b" $t
  done
done
t=$(now)
[ "${QK:-1}" = 0 ] || for r in 0 1; do
  echo "-- RILL_CUDA_DEQUANT_TILES=$r"
  RILL_CUDA_DEQUANT_TILES=$r timeout 60 $B/bench_cuda x --quant-kernels 2 2>&1 | tee ${OUT:-$W}/qk_$r.log |
    sed 's/  */ /g; s/ x /x/; s/ (\([0-9.]*\) MB)/(\1MB)/; s/ n=64//; s/dequant+gemm/dq+gemm/; s/slabs of /slab/g; s/ MB/MB/g' | cut -c1-230
done
step "quant kernels" $t
[ "${NCU:-1}" = 0 ] || NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ "${NCU:-0}" != 0 ]; then
  t=$(now)
  m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
  m=$m,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active
  m=$m,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio
  for r in 0 1; do
    for qs in Q4_K:gate_up Q8_0:gate_up; do
      RILL_CUDA_DEQUANT_TILES=$r timeout 60 $NCU --clock-control none --kernel-name regex:dequant --launch-skip 3 \
        --launch-count 1 --metrics $m --csv $B/bench_cuda x --quant-kernels 2 --quant-only $qs 2>/dev/null |
        grep -E '^"[0-9]' | awk -F'","' '{printf "%s=%s ", $(NF-2), $NF}' |
        sed 's/__/_/g; s/.pct_of_peak_sustained_[a-z]*/%/g; s/"//g' | sed "s/^/ncu tiles=$r $qs: /"
      echo
    done
  done
  step "ncu dequant" $t
  t=$(now)
  for b in bench_cuda; do
    timeout 90 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
      $B/$b $W/llama-3.1-8b.Q4_K_M-random.gguf --profile-step 64 --graphs 0 > $W/ncu_step_$b.csv 2>/dev/null
    echo "ncu step $b rc=$?"
    [ -n "$OUT" ] && cp $W/ncu_step_$b.csv $OUT/
    python3 - $W/ncu_step_$b.csv <<'EOF'
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    v = float(r[vi].replace(",", "")) * {"nsecond": 1e-3, "ns": 1e-3, "msecond": 1e3, "ms": 1e3}.get(r[ui], 1.0)
    k = re.sub(r"\(anonymous namespace\)::|rill::cuda::|quant::|^void ", "", r[ki])
    k = (k.split(">(")[0] + ">" if ">(" in k else k.split("(")[0])[:80]; tot[k] += v; cnt[k] += 1
s = sum(tot.values())
print(f"  step total {s:.0f} us in {sum(cnt.values())} kernels")
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:14]:
    print(f"  {v:9.0f} us {100 * v / s:5.1f}% {cnt[k]:5d}x {k}")
EOF
  done
  step "ncu step" $t
fi
rm -rf $W
