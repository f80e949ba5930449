#!/bin/bash
# One device run (see make_carry.sh): GPU tests, then the 8B benchmark (model level and through
# the engine). With bin/bench_cuda_base and bin/rill_base (an earlier build, make_carry.sh's
# BASE_DIR) the same decode measurements of that build follow in the same run.
# $1: "tests" stops after the tests. $2: "short": tests, model, this build's table, the base's
# decode rows; otherwise also the variant rows (VARIANTS: settings of this build, each timed at
# batch 1 and 64: NAME=VALUE is an environment setting, --flag=VALUE a bench_cuda flag), the engine benchmark (ENGINE=0: not) and the kernel table; "ncu" adds ncu kernel times
# of one decode step at batch 1 and 64 (no graphs; ncu serializes kernels); "hf" the transformers
# baseline.
cd "$(dirname "$0")"
ls bin/*.gz > /dev/null 2>&1 && gunzip -f bin/*.gz
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
M=/tmp/llama8b
VARIANTS=${VARIANTS-"--graphs=0"}  # "A=1+--flag=2": two settings in one row
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for t in bin/test_cuda_*; do timeout 120 $t > /tmp/$(basename $t).log 2>&1; rc=$?; echo "$t rc=$rc"; [ $rc != 0 ] && cp /tmp/$(basename $t).log $OUT/; grep -E "^\[ cuda|FAILED|Failure|Expected|Which is|max \||differ|PASSED" /tmp/$(basename $t).log | head -30; done
bin/rill run shared/goldens/hf/llama --device cuda --prompt-ids 1,5,9,200,7 --max-tokens 8 --temperature 0 --json 2>&1 | tail -3
[ "$1" = "tests" ] && exit 0
t0=$(date +%s); python3 shared/tools/make_random_model.py llama-3.1-8b $M > /tmp/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s"
timeout 150 bin/bench_cuda $M --steps 32 --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
[ -x bin/bench_cuda_base ] && timeout 100 bin/bench_cuda_base $M --steps 32 2>&1 | grep decode | sed 's/^/base: /'
if [ "$2" != "short" ]; then
  for v in $VARIANTS; do
    envs=""; flags=""; for p in ${v//+/ }; do case $p in --*) flags="$flags ${p/=/ }" ;; *) envs="$envs $p" ;; esac; done
    env $envs timeout 60 bin/bench_cuda $M --steps 32 --batches 1,64 $flags 2>&1 | grep decode | sed "s/^/$v: /"
  done
  bench() { timeout 60 $1 bench $M --device cuda --concurrency $2 --prompt-tokens 128 --gen-tokens 128 --json > /tmp/rb.json 2>/tmp/rb.err; echo "$1 bench c=$2 rc=$?"; python3 -c "import json;d=json.load(open('/tmp/rb.json'));print({k:d[k] for k in ['decode_tok_s','output_tok_s','ttft_ms','itl_ms']})"; }
  [ "${ENGINE:-1}" = 1 ] && for c in 1 64; do bench bin/rill $c; [ -x bin/rill_base ] && bench bin/rill_base $c; done
  timeout 90 bin/bench_cuda $M --kernels 1 2>&1 | tee $OUT/kernels.log | cut -c1-200
fi
if [ "$2" = "ncu" ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for b in 1 64; do timeout 45 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv bin/bench_cuda $M --profile-step $b --graphs 0 > $OUT/ncu_b$b.csv 2>/dev/null; echo "ncu b=$b rc=$?"; done
fi
[ "$2" = "hf" ] && python3 bench/hf_baseline.py $M --json /tmp/hf.json 2>&1 | grep -v Warning | tee $OUT/hf.log
exit 0
