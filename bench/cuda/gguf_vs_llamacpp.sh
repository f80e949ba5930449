#!/bin/bash
# GGUF on CUDA, rill vs llama.cpp (issue 23), device side: the run.sh of a
# request folder that make_gguf_request.sh assembled (bin/: bench_cuda,
# llama-quantize, llama-bench and llama-batched-bench when built, the GPU
# tests, py/ with make_bench_model.py and llama.cpp's gguf-py). In one call:
#  0. the GPU test binaries in bin/ (test_*), each run whole;
#  1. the random Llama-3.1-8B in F16 (make_bench_model.py --fast-random,
#     seed 1) into /dev/shm, quantized with llama-quantize (16 threads each,
#     side by side) to Q4_K_M and Q8_0; timed; the F16 file removed after;
#  2. per type: llama-bench (CUDA, -ngl 99, -p 2048 -n 128, -b/-ub at their
#     defaults, flash attention on: what "auto" picks on CUDA, and the only
#     attention a LLAMACPP_CUDA_MINIMAL build has) and llama-batched-bench (128-token
#     prompts, 128 generated tokens, 1 / 8 / 64 sequences: S_TG is decode
#     tok/s at that batch) when bin/ has them; rill's bench_cuda on the same
#     file (decode B = 1 / 8 / 64 after 128-token prompts, prefill of 2,048
#     tokens), with RILL_CUDA_QUANT_MMA=0 (the f32 GEMV / dequantize + GEMM
#     paths) and then with the int8 tensor-core path (quant.h);
#  3. bench_cuda --quant-kernels 1: the quantized kernels alone.
cd "$(dirname "$0")"
[ -f env.sh ] && source ./env.sh
set +e
B=$PWD/bin
D=/dev/shm/ggufcuda
mkdir -p $D
lscpu | grep -E "^Model name|^CPU\(s\)" | tr -s ' '
now() { date +%s.%N; }
step() { awk -v a="$2" -v b="$(now)" -v n="$1" 'BEGIN { printf "time: %-36s %6.1f s\n", n, b - a }'; }
for t in $B/test_*; do
  [ -x "$t" ] || continue
  s=$(now)
  timeout 60 $t > $D/$(basename $t).log 2>&1
  echo "$(basename $t) rc=$?"
  grep -E "^\[ cuda|FAILED|Failure|Expected|Which is|error:|PASSED|SKIPPED" $D/$(basename $t).log | head -40
  step "$(basename $t)" $s
done
mk() {
  PYTHONPATH=$B/py:$B/py/fallback timeout 150 python3 $B/py/bench/make_bench_model.py --shape ${SHAPE:-llama-3.1-8b} \
    --fast-random --no-venv --threads 16 --out-dir $D --llama-quantize $B/llama-quantize --types "$1" \
    2>$D/make_$1.log | tail -1
}
t=$(now); mk F16 > /dev/null; step "F16 GGUF written (16 GB, numpy)" $t
t=$(now)
mk Q4_K_M > /dev/null &
mk Q8_0 > /dev/null
wait
step "llama-quantize Q4_K_M and Q8_0 (side by side)" $t
for q in Q4_K_M Q8_0; do
  [ -f $D/${SHAPE:-llama-3.1-8b}.$q.gguf ] || { echo "no $q file"; tail -5 $D/make_$q.log; tail -3 $D/make_F16.log; }
done
rm -f $D/${SHAPE:-llama-3.1-8b}.F16.gguf
ls -la $D/*.gguf | awk '{print $5, $9}'
for q in Q4_K_M Q8_0; do
  M=$D/${SHAPE:-llama-3.1-8b}.$q.gguf
  [ -f $M ] || continue
  echo "======== $q"
  if [ -x $B/llama-bench ]; then
    ldd $B/llama-bench | grep "not found"
    t=$(now)
    timeout 100 $B/llama-bench -m $M -ngl 99 -fa on -p 2048 -n 128 -r 2 2>&1 | grep -E "^\| |error|failed"
    step "llama-bench $q" $t
  fi
  if [ -x $B/llama-batched-bench ]; then
    t=$(now)
    timeout 100 $B/llama-batched-bench -m $M -ngl 99 -fa on -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,64 \
      2>$D/bb_$q.log | grep -E "^\|"
    grep -E "error|failed" $D/bb_$q.log | head -3
    step "llama-batched-bench $q" $t
  fi
  for mma in 0 1; do
    t=$(now)
    echo "-- rill bench_cuda, RILL_CUDA_QUANT_MMA=$mma ($([ $mma = 0 ] && echo "f32 GEMV / dequantize + GEMM: the baseline" || echo "default: the int8 path where quant_matmul picks it"))"
    RILL_CUDA_QUANT_MMA=$mma timeout 100 $B/bench_cuda $M --batches 1,8,64 --steps ${STEPS:-16} 2>&1 |
      grep -E "^(ceilings|model|prefill|decode|TTFT)|rror"
    step "rill bench_cuda $q mma=$mma" $t
  done
done
t=$(now)
timeout 60 $B/bench_cuda x --quant-kernels 1 2>&1 | cut -c1-420
step "bench_cuda --quant-kernels" $t
rm -rf $D
