#!/bin/bash
# Device side of make_carry_spec.sh. Makes the random Llama-3.1-8B (bf16) in
# the background while the GPU tests run (logs of failures under $OUT), then:
#  - speculative decoding measured with a replay draft (the target's own
#    greedy continuation, recorded by the non-speculative run: acceptance 1),
#    `rill bench` at concurrency 1 (k = 1, 2, 4, 8), 8 and 32 (k = 4), and
#    the acceptance-to-speedup curve at concurrency 1, k = 4 (replay=FILE:A);
#    every run's JSON is a line of $OUT/spec.jsonl;
#  - the cache tiers on CUDA: cache_tier_bench.py --device cuda (cold,
#    device, RAM and disk restore of a 2,048-token prefix) -> $OUT/tiers.json.
# STAGES (default "tests spec tiers"): which parts run; a later call on the
# same (warm) machine reuses the model in /tmp.
cd "$(dirname "$0")"
[ -d bin ] || tar xJf bin.tar.xz; mkdir -p shared/goldens/hf && [ -d shared/goldens/hf/llama ] || tar xJf shared/goldens.tar.xz -C shared/goldens/hf
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RILL_SHARED_DIR=$PWD/shared PYTHONUNBUFFERED=1
M=/tmp/llama8b
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
STAGES=${STAGES:-tests spec tiers}
[[ "$STAGES" == tests ]] || [ -f /tmp/make.done ] || (t0=$(date +%s); python3 shared/tools/make_random_model.py llama-3.1-8b $M > /tmp/make.log 2>&1; echo "make model rc=$? $(( $(date +%s) - t0 )) s" > /tmp/make.done) &
if [[ " $STAGES " == *" tests "* ]]; then
  for t in bin/test_cuda_*; do
    timeout 150 $t > /tmp/$(basename $t).log 2>&1; rc=$?
    echo "$t rc=$rc $(grep -E '^\[  (PASSED|SKIPPED|FAILED) ' /tmp/$(basename $t).log | tr '\n' ' ')"
    [ $rc != 0 ] && cp /tmp/$(basename $t).log $OUT/ && grep -E "FAILED|Failure|Expected|Which is|error" /tmp/$(basename $t).log | head -20
  done
fi
[[ "$STAGES" == tests ]] && exit 0
while [ ! -f /tmp/make.done ]; do sleep 2; done; cat /tmp/make.done
run() {  # name, then rill bench flags
  local name=$1; shift
  timeout 120 bin/rill bench $M --device cuda --prompt-tokens 128 --gen-tokens 256 --json ${BENCH_FLAGS:-} "$@" > /tmp/rb.json 2>/tmp/rb.err
  local rc=$?
  python3 - "$name" "$rc" <<'PY' >> $OUT/spec.jsonl
import json, sys
name, rc = sys.argv[1], int(sys.argv[2])
try: d = json.load(open('/tmp/rb.json'))
except Exception: d = {"error": open('/tmp/rb.err').read()[-400:]}
d.pop("ttft_ms_each", None); d.pop("cached_tokens_each", None)
d["name"], d["rc"] = name, rc
print(json.dumps(d))
PY
  tail -1 $OUT/spec.jsonl | python3 -c "import json,sys;d=json.loads(sys.stdin.read());print(d['name'],'rc',d['rc'],'decode',round(d.get('decode_tok_s',0),1),'out',round(d.get('output_tok_s',0),1),'steps',d.get('steps'),'spec',d.get('spec'),d.get('error',''))"
}
if [[ " $STAGES " == *" spec "* ]]; then
for c in 1 8 32; do
  run off_c$c --concurrency $c --record-tokens /tmp/rec_$c.json
  ks="4"; [ $c = 1 ] && ks="1 2 4 8"
  for k in $ks; do run replay_c${c}_k$k --concurrency $c --spec replay=/tmp/rec_$c.json --spec-tokens $k; done
done
for a in 0.3 0.5 0.7 0.9; do run replay_c1_k4_a$a --concurrency 1 --spec replay=/tmp/rec_1.json:$a --spec-tokens 4; done
fi
[[ " $STAGES " == *" tiers "* ]] || exit 0
timeout 400 python3 bench/cache_tier_bench.py --rill bin/rill --model $M --device cuda --prefix 2048 --runs 3 \
  --ram-kv-cache-mb 400 --kv-cache-mb 4096 --cache-ram-mb 2048 --out /tmp/tiers/tiers.json 2>&1 | tail -20
cp /tmp/tiers/tiers.json $OUT/ 2>/dev/null; grep -h -i -E "error|refus" /tmp/tiers/*.log | head -5
exit 0
