#!/bin/bash
# Device side of make_carry_q.sh (see there). $1: "stash" (call 1: unpack, the kernel tests
# under compute-sanitizer memcheck) or "all" (call 2: join the model, its GPU test and the
# binaries named in $TESTS, e.g. "test_cuda_llama_cuda_test test_cuda_cuda_ops_test", rill run
# and rill bench timings).
cd "$(dirname "$0")"
Q=/tmp/q6
M=$Q/models/SmolLM2-135M-Instruct.Q4_1.gguf
export LD_LIBRARY_PATH=$Q/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export RILL_SHARED_DIR=$Q/shared RILL_MODEL_DIR=$Q/models
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
show() { grep -E "^\[ cuda|FAILED|Failure|Expected|Which is|error|PASSED|Skipped|SKIPPED" "$1" | head -${2:-60}; }
if [ "$1" = "stash" ]; then
  mkdir -p $Q/models && tar xJf bins.tar.xz -C $Q && cp model.part1 $Q/ || exit 2
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  timeout 200 $CS --tool memcheck $Q/bin/test_cuda_cuda_quant_test > $OUT/quant_memcheck.log 2>&1
  echo "quant kernels under memcheck rc=$?"; show $OUT/quant_memcheck.log; grep -E "ERROR SUMMARY" $OUT/quant_memcheck.log
  exit 0
fi
[ -f $Q/model.part1 ] || { echo "part 1 is not on this machine (a fresh one?)"; exit 3; }
cat $Q/model.part1 model.part2 > $M
[ "$(sha256sum $M | cut -d' ' -f1)" = "$(cat model.sha256)" ] || { echo "model checksum differs"; exit 4; }
for t in test_cuda_llama_cuda_quant_test ${TESTS:-}; do
  timeout 240 $Q/bin/$t > $OUT/$t.log 2>&1; echo "$t rc=$?"; show $OUT/$t.log 40
done
timeout 60 $Q/bin/rill run $M --device cuda --prompt "The capital of France is" --max-tokens 24 --temperature 0 2>&1 | tail -4
for c in 1 8; do
  timeout 90 $Q/bin/rill bench $M --device cuda --concurrency $c --prompt-tokens 128 --gen-tokens 128 --json > /tmp/rb.json 2>/tmp/rb.err
  echo "bench c=$c rc=$?"; python3 -c "import json;d=json.load(open('/tmp/rb.json'));print({k:d.get(k) for k in ['decode_tok_s','output_tok_s','ttft_ms','itl_ms']})" || tail -3 /tmp/rb.err
done
timeout 90 $Q/bin/rill bench $M --device cuda --concurrency 1 --requests 3 --prompt-tokens 2048 --gen-tokens 4 \
  --max-batch-tokens 2048 --ctx-size 4096 --json > /tmp/rb.json 2>/tmp/rb.err
echo "bench prefill 2048 rc=$?"; python3 -c "import json;d=json.load(open('/tmp/rb.json'));t=d['ttft_ms_each'];print('ttft ms each', t, 'prefill tok/s (best)', round(2048e3/min(t)))" || tail -3 /tmp/rb.err
exit 0
