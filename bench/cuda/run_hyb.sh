#!/bin/bash
# Device side of make_carry_hyb.sh: unpacks the binaries into /tmp/hyb, runs
# each GPU test (logs under $OUT) and prints the measured errors and a
# pass/fail line per binary; then (unless $1 is "tests") makes the
# qwen3.5-4b preset (bf16, random weights) and runs bench_cuda on it at
# batch 1 and 64 (prefill 2,048 tokens), the table last. $2 = "ncu": then
# ncu kernel times (summed per kernel name) of one 2,048-token prefill and
# of one decode step at batch 1 and 64 (no graphs; ncu serializes kernels).
cd "$(dirname "$0")"
G=/tmp/hyb
mkdir -p $G/bin && cp bin/*.gz $G/bin/ && gunzip -f $G/bin/*.gz && chmod +x $G/bin/*
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
M=/tmp/q35
if [ "$1" != "tests" ]; then  # the model is made in the background while the tests run
  (t0=$(date +%s); python3 shared/tools/make_random_model.py qwen3.5-4b $M > /tmp/make.log 2>&1; \
   echo "make model rc=$? $(( $(date +%s) - t0 )) s" >> /tmp/make.log) &
  MAKER=$!
fi
summary=""
for n in test_cuda_gated_delta_cuda_test test_cuda_qwen3_next_cuda_test ${TESTS:-test_cuda_llama_cuda_test test_cuda_gemma_cuda_test test_cuda_moe_cuda_test test_cuda_cuda_attention_test}; do
  t=$G/bin/$n
  start=$(date +%s%N)
  timeout ${TEST_TIMEOUT:-120} $t > $OUT/$n.log 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  summary="$summary$(printf '%-34s rc=%-3s %6d ms  %s' $n $rc $ms "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $OUT/$n.log | tr '\n' ' ')")\n"
done
grep -h -E "^\[ cuda" $OUT/*.log
grep -h -E "FAILED|Failure|Expected|Which is|error|rror:" $OUT/*.log | head -40
printf "$summary"
[ "$1" = "tests" ] && exit 0
wait $MAKER; tail -2 /tmp/make.log
timeout ${BENCH_TIMEOUT:-240} $G/bin/bench_cuda $M --steps 32 --batches 1,64 --json $OUT/bench.json 2>&1 | tee $OUT/bench.log
for v in ${VARIANTS-}; do  # "A=1+B=2": two settings in one row
  env ${v//+/ } timeout 120 $G/bin/bench_cuda $M --steps 32 --batches 1,64 2>&1 | grep -E "^(prefill|decode|TTFT)" | sed "s/^/$v: /"
done
if [ "$2" = "ncu" ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  summarize() {  # kernel name -> total ms, launches; the largest first
    python3 -c "
import csv,sys,collections
t=collections.defaultdict(float);c=collections.Counter()
rows=[r for r in csv.reader(open(sys.argv[1])) if len(r)>14]
h=rows[0];k=h.index('Kernel Name');v=h.index('Metric Value');u=h.index('Metric Unit')
for r in rows[1:]:
  if r[v].replace(',','').replace('.','',1).isdigit():
    x=float(r[v].replace(',',''));x=x/1e6 if r[u]=='nsecond' else x/1e3 if r[u]=='usecond' else x
    n=r[k].split('(')[0].split('<')[0][-40:];t[n]+=x;c[n]+=1
tot=sum(t.values());print('%s: %.2f ms in %d kernels'%(sys.argv[2],tot,sum(c.values())))
for n,x in sorted(t.items(),key=lambda e:-e[1])[:14]: print('  %8.3f ms %5d  %s'%(x,c[n],n))
" $1 $2; }
  timeout 120 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
    $G/bin/bench_cuda $M --profile-prefill 1 > $OUT/ncu_prefill.csv 2>/dev/null; echo "ncu prefill rc=$?"
  summarize $OUT/ncu_prefill.csv prefill
  for b in 1 64; do
    timeout 90 $NCU --clock-control none --profile-from-start off --metrics gpu__time_duration.sum \
      --csv $G/bin/bench_cuda $M --profile-step $b --graphs 0 > $OUT/ncu_b$b.csv 2>/dev/null; echo "ncu b=$b rc=$?"
    summarize $OUT/ncu_b$b.csv "decode b=$b"
  done
fi
exit 0
