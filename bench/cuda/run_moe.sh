#!/bin/bash
# Device side of make_carry_moe.sh. Makes the moe-7b-a1b random model
# (make_random_model.py, bf16, 14.6 GB) in the background while the GPU
# tests run (logs under $OUT; their measured errors and pass/fail lines are
# printed), then bench_cuda on that model: prefill of a 2,048-token prompt,
# decode at batch 1, 8, 32, 64 and 128; then VARIANTS (environment
# settings, "A=1+B=2" for two in one row) timed at VARIANT_BATCHES.
# $1 = "tests": the tests only.
cd "$(dirname "$0")"
G=/tmp/gmoe
M=/tmp/moe-7b-a1b
mkdir -p $G/bin && cp bin/*.gz $G/bin/ && gunzip -f $G/bin/*.gz && chmod +x $G/bin/*
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$1" != tests ]; then
  (t0=$(date +%s); python3 shared/tools/make_random_model.py moe-7b-a1b $M > $OUT/make.log 2>&1
   echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/make.log) &
  maker=$!
fi
for n in test_cuda_cuda_moe_ops_test test_cuda_moe_cuda_test test_cuda_llama_cuda_test; do
  start=$(date +%s%N)
  timeout ${TEST_TIMEOUT:-150} $G/bin/$n > $OUT/$n.log 2>&1
  echo "$n rc=$? $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
grep -h -E "^\[ cuda" $OUT/test_*.log
grep -h -E "FAILED|Failure|Expected|Which is|error|differ" $OUT/test_*.log | head -40
grep -h -E "^\[  (PASSED|FAILED|SKIPPED) " $OUT/test_*.log
[ "$1" = tests ] && exit 0
wait $maker
tail -3 $OUT/make.log
timeout ${BENCH_TIMEOUT:-200} $G/bin/bench_cuda $M --steps 32 --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
for v in ${VARIANTS-}; do  # environment settings ("A=1+B=2": two in one row)
  env ${v//+/ } timeout 90 $G/bin/bench_cuda $M --steps 32 --batches ${VARIANT_BATCHES:-1,8,16,64} 2>&1 | grep -E "decode" | sed "s/^/$v: /"
done
exit 0
