#!/bin/bash
# Device side of make_carry_g.sh: unpacks the GPU test binaries into /tmp/g7
# and runs every one (logs under $OUT), then prints the measured errors and
# a pass/fail line per binary. The llama_cuda_quant test skips itself (its
# 98 MB model does not travel here; see make_carry_q.sh).
cd "$(dirname "$0")"
G=/tmp/g7
mkdir -p $G/bin && tar -C $G/bin -xJf bins.tar.xz && chmod +x $G/bin/*
NCCL_DIR=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$NCCL_DIR
export NCCL_NVLS_ENABLE=0
export RILL_SHARED_DIR=$PWD/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
summary=""
for t in $G/bin/test_cuda_*; do
  n=$(basename $t)
  start=$(date +%s%N)
  timeout ${TEST_TIMEOUT:-120} $t > $OUT/$n.log 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  summary="$summary$(printf '%-36s rc=%-3s %6d ms  %s' $n $rc $ms "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $OUT/$n.log | tr '\n' ' ')")\n"
done
grep -h -E "^\[ cuda" $OUT/*.log
grep -h -E "FAILED|Failure|Expected|Which is|error" $OUT/*.log | head -40
printf "$summary"
