#!/bin/bash
# One device run for sampling on the device (see make_sample_carry.sh): the
# GPU sampling tests and the llama CUDA tests, the sampler's kernel times at
# a 128k vocabulary, then `rill bench --device cuda` on a small 128k-vocab
# Llama (make_small_model.py): greedy, temperature sampling on the device,
# and the same with --host-sampling (logits to the host, host sampler).
# $1 = "tests": stop after the tests.
cd "$(dirname "$0")"
ls bin/*.gz > /dev/null 2>&1 && gunzip -f bin/*.gz
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M=/tmp/small128k
( python3 make_small_model.py $M shared/tokenizers/llama3 > /tmp/make.log 2>&1; echo "make model rc=$?" ) &
maker=$!
for t in bin/test_cuda_*; do
  timeout 150 $t --gtest_also_run_disabled_tests > /tmp/$(basename $t).log 2>&1; rc=$?
  echo "$t rc=$rc"; cp /tmp/$(basename $t).log $OUT/
  grep -E "^\[ (cuda|sample)|FAILED|Failure|Expected|Which is|differ|PASSED|mismatch" /tmp/$(basename $t).log | head -60
done
wait $maker
[ "$1" = "tests" ] && exit 0
bench() {  # label, env, flags
  env $2 timeout 90 bin/rill bench $M --device cuda --concurrency $C --prompt-tokens 128 --gen-tokens 32 --json $3 \
    > /tmp/rb.json 2>/tmp/rb.err
  echo -n "c=$C $1 rc=$? "
  python3 -c "import json;d=json.load(open('/tmp/rb.json'));print('decode_tok_s %.0f output_tok_s %.0f itl_p50_ms %.2f' % (d['decode_tok_s'], d['output_tok_s'], d['itl_ms']['p50']))" \
    || tail -3 /tmp/rb.err
}
for C in 1 64; do
  bench greedy "" ""
  bench "T0.8 p0.95 device" "" "--temperature 0.8 --top-p 0.95"
  bench "T0.8 p0.95 host" "" "--temperature 0.8 --top-p 0.95 --host-sampling"
done
exit 0
