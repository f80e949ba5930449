#!/bin/bash
# Device side of make_carry_tp.sh. Starts making the random Llama-3.1-8B
# (bf16) in the background, runs the GPU tests (the split model's against
# transformers and one GPU, then the one-GPU tests as a regression check;
# logs under $OUT), a `rill run --tensor-parallel 2` smoke test, then, once
# the model is made, bench_cuda at N = 1, 2 (and 4 with 4 GPUs) in one
# process (decode at batch 1 and 64, the scaling table last) and the engine
# (`rill bench`) at N = 1 and 2. $1 = "tests": stop after the tests.
# VARIANTS (default "NCCL_PROTO=LL --graphs=0"): settings, each timed at N=2,
# batch 1 and 64 (NAME=VALUE an environment setting, --flag=VALUE a
# bench_cuda flag; "A=1+--flag=2": two settings in one row).
# One split-model case runs first; if it fails, it runs again with NCCL's
# graph buffer registration off, to locate the fault, and the run stops
# there (a step runs eagerly before it is captured, so a fault in eager
# steps fails before any graph is made).
cd "$(dirname "$0")"
G=/tmp/tp
mkdir -p $G/bin && cp bin/*.gz $G/bin/ && gunzip -f $G/bin/*.gz && chmod +x $G/bin/*
NCCL_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$NCCL_DIR
export RILL_SHARED_DIR=$PWD/shared NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
M=/tmp/llama8b
VARIANTS=${VARIANTS-"NCCL_PROTO=LL --graphs=0"}
NG=$(nvidia-smi -L | wc -l)
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m | head -6
ldd $G/bin/bench_cuda | grep -E "nccl|not found"
if [ "$1" != "tests" ]; then
  (t0=$(date +%s); python3 shared/tools/make_random_model.py llama-3.1-8b $M > /tmp/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" > /tmp/make.done) &
fi
# One split-model case first (prefill, decode graphs with the collectives
# inside); if it fails or hangs, locate the fault and skip the rest.
T=$G/bin/test_cuda_llama_cuda_tp_test
NCCL_DEBUG=WARN timeout 60 $T --gtest_filter='*LogitsAndGreedy*/llama_N2' > $OUT/tp_first.log 2>&1; rc=$?
echo "tp first case rc=$rc"; grep -E "^\[ cuda|OK \]|FAILED|rror|NCCL WARN" $OUT/tp_first.log | head -20
if [ $rc != 0 ]; then
  NCCL_GRAPH_REGISTER=0 NCCL_DEBUG=INFO timeout 45 $T --gtest_filter='*LogitsAndGreedy*/llama_N2' > $OUT/tp_noreg.log 2>&1; echo "NCCL_GRAPH_REGISTER=0 rc=$?"
  grep -h -E "FAILED|rror|NCCL WARN" $OUT/tp_noreg.log | head -20
  exit 0
fi
summary=""
for n in test_cuda_llama_cuda_tp_test test_cuda_nccl_group_test test_cuda_llama_cuda_test; do
  start=$(date +%s%N)
  NCCL_DEBUG=VERSION timeout ${TEST_TIMEOUT:-150} $G/bin/$n > $OUT/$n.log 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  summary="$summary$(printf '%-32s rc=%-3s %6d ms  %s' $n $rc $ms "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $OUT/$n.log | tr '\n' ' ')")\n"
done
grep -h "NCCL version" $OUT/*.log | head -1
grep -h -E "^\[ cuda" $OUT/test_cuda_llama_cuda_tp_test.log $OUT/test_cuda_llama_cuda_test.log
grep -h -E "FAILED|Failure|Expected|Which is|rror" $OUT/*.log | grep -v CudaTpErrors | head -30
printf "$summary"
$G/bin/rill run shared/goldens/hf/llama --device cuda --tensor-parallel 2 --prompt-ids 1,5,9,200,7 --max-tokens 8 --temperature 0 --json 2>&1 | tail -2
$G/bin/rill run shared/goldens/hf/llama --device cuda --tensor-parallel $((NG + 1)) --prompt-ids 1,5 --max-tokens 2 2>&1 | tail -1
[ "$1" = "tests" ] && exit 0
while [ ! -f /tmp/make.done ]; do sleep 2; done; cat /tmp/make.done; tail -2 /tmp/make.log
TPS=1,2; [ "$NG" -ge 4 ] && TPS=1,2,4
timeout 300 $G/bin/bench_cuda $M --steps 32 --batches ${BATCHES:-1,8,32,64,128} --tensor-parallel $TPS --json $OUT/bench_tp.json 2>&1 | tee $OUT/bench_tp.log
for v in $VARIANTS; do
  envs=""; flags=""; for p in ${v//+/ }; do case $p in --*) flags="$flags ${p/=/ }" ;; *) envs="$envs $p" ;; esac; done
  env $envs timeout 60 $G/bin/bench_cuda $M --steps 32 --batches 1,64 --tensor-parallel 2 $flags 2>&1 | grep decode | sed "s/^/$v N=2: /"
done
if [ "${ENGINE:-1}" = 1 ]; then
  for tp in 1 2; do for c in 1 64; do
    timeout 90 $G/bin/rill bench $M --device cuda --tensor-parallel $tp --concurrency $c --prompt-tokens 128 --gen-tokens 128 --json > /tmp/rb.json 2>/tmp/rb.err
    echo "rill bench --tensor-parallel $tp --concurrency $c rc=$? $(python3 -c "import json;d=json.load(open('/tmp/rb.json'));print({k:d[k] for k in ['decode_tok_s','output_tok_s','ttft_ms','itl_ms']})" 2>&1 | tail -1)"
  done; done
fi
exit 0
