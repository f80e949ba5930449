#!/bin/bash
# Issue 23, branch q8gemv23, device side (carry .device/q8gemv23, made by
# make_carry_q8gemv23.sh): the Q8_0 GEMV through shared memory vs main.
#  0. bin.tar.xz unpacked: bench_new (this branch), bench_main (main's
#     bench_cuda), test_quant (tests/cuda/cuda_quant_test.cpp), py/;
#  1. a Llama-3.1-8B shaped Q8_0 GGUF of random blocks (make_bench_model.py
#     --random-blocks: every 2-D weight Q8_0, d = 1e-3; speed only; FAST=1:
#     each matrix 64 random rows repeated, not 25 s of numpy random bytes)
#     written into /dev/shm in the background while 2. and 3. run;
#  2. test_quant (TESTS: a gtest filter), under each of TILES (the values
#     of RILL_CUDA_Q8_GEMV_TILES, read only by the tile kernel of commit
#     eb3bade, taken back out after: docs/perf.md; default "1");
#  3. bench_cuda x --quant-kernels 1 --quant-only Q8_0:SHAPE, main (unless
#     NO_MAIN_KERNELS=1) then this branch under each of TILES, per
#     Llama-3.1-8B shape;
#  4. bench_cuda FILE --batches 1,8,64 --steps 16, main then this branch
#     under each of TILES.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set +e
now() { date +%s.%N; }
step() { awk -v a="$2" -v b="$(now)" -v n="$1" 'BEGIN { printf "time: %-30s %6.1f s\n", n, b - a }'; }
t=$(now)
tar xJf bin.tar.xz
step unpack $t
B=$PWD/bin
D=/dev/shm/q8g
mkdir -p $D
t0=$(now)
ARGS="--shape llama-3.1-8b --random-blocks --no-venv --out-dir $D --types Q8_0"
if [ "${FAST:-0}" = 1 ]; then
  (cd $B/py/bench && PYTHONPATH=$B/py:$B/py/fallback timeout 120 python3 -c "
import sys
import numpy as np
import make_bench_model as m
def blocks(rng, shape, qtype):
    bb, bs, offs = m.RANDOM_BLOCK_TYPES[qtype]
    rows, cols = shape
    pool = rng.integers(0, 256, size=(64, cols // bs, bb), dtype=np.uint8)
    for off in offs:
        pool[:, :, off:off + 2] = np.frombuffer(np.float16(1e-3).tobytes(), dtype=np.uint8)
    pool = pool.reshape(64, -1)
    return np.tile(pool, (rows // 64 + 1, 1))[:rows]
m.random_blocks = blocks
sys.argv = ['make_bench_model.py'] + '$ARGS'.split()
m.main()" > $D/make.log 2>&1; echo done >> $D/make.log) &
else
  # shellcheck disable=SC2086
  (PYTHONPATH=$B/py:$B/py/fallback timeout 120 python3 $B/py/bench/make_bench_model.py $ARGS > $D/make.log 2>&1
  echo done >> $D/make.log) &
fi
MK=$!
for tl in ${TILES:-1}; do
  t=$(now)
  RILL_CUDA_Q8_GEMV_TILES=$tl timeout 90 $B/test_quant --gtest_filter="${TESTS:-*}" > $D/test.log 2>&1
  echo "test_quant tiles=$tl rc=$?"
  grep -E "^\[ cuda|FAILED|Failure|Expected|Which is|error:|PASSED|SKIPPED|^\[       OK" $D/test.log | head -40
  step test_quant $t
done
t=$(now)
for s in qkv o gate_up down lm_head; do
  [ "${NO_MAIN_KERNELS:-0}" = 1 ] || { echo -n "main "
    timeout 30 $B/bench_main x --quant-kernels 1 --quant-only Q8_0:$s 2>&1 | grep "^quant" | cut -c1-400; }
  for tl in ${TILES:-1}; do
    echo -n "new tiles=$tl "
    RILL_CUDA_Q8_GEMV_TILES=$tl timeout 30 $B/bench_new x --quant-kernels 1 --quant-only Q8_0:$s 2>&1 | grep "^quant" |
      cut -c1-400
  done
done
step "quant kernels" $t
wait $MK
step "model (from start)" $t0
tail -3 $D/make.log
if ! ls $D/*.gguf > /dev/null 2>&1; then
  tail -5 $D/make.log
  echo "FAST model failed: numpy random bytes instead"
  # shellcheck disable=SC2086
  PYTHONPATH=$B/py:$B/py/fallback timeout 120 python3 $B/py/bench/make_bench_model.py $ARGS > $D/make.log 2>&1
fi
M=$(ls $D/*.gguf | head -1)
ls -la $M
for b in main ${TILES:-1}; do
  t=$(now)
  bin=new
  [ $b = main ] && bin=main
  echo "-- bench_$bin $([ $b = main ] || echo "RILL_CUDA_Q8_GEMV_TILES=$b")"
  RILL_CUDA_Q8_GEMV_TILES=$b timeout 60 $B/bench_$bin $M --batches 1,8,64 --steps 16 2>&1 |
    grep -E "^(ceilings|model|prefill|decode|TTFT)|rror"
  step "bench_$bin $b" $t
done
rm -rf $D
