#!/bin/bash
# One device run (see make_carry.sh): GPU tests, then the 8B benchmark (model level and through
# the engine) and the transformers baseline. $1: "tests" stops after tests.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for t in bin/test_cuda_*; do $t > /tmp/$(basename $t).log 2>&1; rc=$?; echo "$t rc=$rc"; [ $rc != 0 ] && cp /tmp/$(basename $t).log $OUT/; grep -E "^\[ cuda|FAILED|Failure|Expected|Which is|max \||differ" /tmp/$(basename $t).log | head -30; done
bin/rill run shared/goldens/hf/llama --device cuda --prompt-ids 1,5,9,200,7 --max-tokens 8 --temperature 0 --json 2>&1 | tail -3
[ "$1" = "tests" ] && exit 0
t0=$(date +%s); python3 shared/tools/make_random_model.py llama-3.1-8b /tmp/llama8b > /tmp/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s"
bin/bench_cuda /tmp/llama8b --steps 32 --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
RILL_CUDA_GRAPHS=0 bin/bench_cuda /tmp/llama8b --steps 32 --batches 1,64 2>&1 | grep decode | sed 's/^/no graphs: /'
bin/bench_cuda /tmp/llama8b --kernels 1 2>&1 | tee $OUT/kernels.log | cut -c1-200
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU_ON" ] && for b in 1 64; do RILL_CUDA_GRAPHS=0 timeout 120 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv bin/bench_cuda /tmp/llama8b --profile-step $b > $OUT/ncu_b$b.csv 2>/dev/null; echo "ncu b=$b rc=$?"; done
for c in 1 64; do bin/rill bench /tmp/llama8b --device cuda --concurrency $c --prompt-tokens 128 --gen-tokens 128 --json > /tmp/rill_bench_c$c.json 2>/tmp/rill_bench_c$c.err; echo "rill bench c=$c rc=$?"; python3 -c "import json;d=json.load(open('/tmp/rill_bench_c$c.json'));print({k:d[k] for k in ['decode_tok_s','output_tok_s','ttft_ms','itl_ms']})"; done
[ "$2" = "nohf" ] && exit 0
python3 bench/hf_baseline.py /tmp/llama8b --json /tmp/hf.json 2>&1 | grep -v Warning | tee $OUT/hf.log
