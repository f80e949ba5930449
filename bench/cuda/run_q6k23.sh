#!/bin/bash
# Issue 23: Q6_K in quant_mmq (RILL_QUANT_MMQ_Q6K) and the cluster K split
# (RILL_QUANT_MMQ_SPLIT), device side, one call: the verify pack's
# CudaQuant tests (bit for bit against quant_mma, and DeviceTimingMmq's
# kernel times) while the random Llama-3.1-8B is written as Q4_K_M random
# blocks, then bench_cuda on it at batches 1, 8 and 64 with Q6_K off, on,
# and on with the split. Packs (both, with tests/data moved aside):
#   bash bench/cuda/make_carry_verify.sh build-cpu
#   LLAMA_BINS="" RANDOM_BLOCKS=1 bash bench/cuda/make_carry_q8dp4a23.sh build-cpu build-cpu
#   run: bash bench/cuda/run_q6k23.sh   (carry [".device/verify", ".device/q8dp4a23"])
V=.device/q8dp4a23
(KEEP_MODEL=1 QTYPE=Q4_K_M PARTS=model bash $V/run.sh > /tmp/q6k_model.txt 2>&1) &
MK=$!
FILTER='CudaQuant.DeviceTimingMmq:CudaQuant.MmaMatchesTheCpuReferenceAndIsBatchInvariant' LIMIT=200 BUDGET=220 \
  bash .device/verify/run.sh 2>&1 | tail -8
grep -h "quant mmq" /tmp/verify-logs/tests.log | cut -c1-420
wait $MK
grep -E "rc=|model done|gguf" /tmp/q6k_model.txt | tail -3
KEEP_MODEL=${KEEP_MODEL:-0} QTYPE=Q4_K_M PARTS=rill BUDGET=${RILL_BUDGET:-330} BATCHES=1,8,64 \
  RILL_CONFIGS="new:1:1:RILL_QUANT_MMQ_Q6K=0 new:1:1:RILL_QUANT_MMQ_Q6K=1 new:1:1:RILL_QUANT_MMQ_Q6K=1,RILL_QUANT_MMQ_SPLIT=1" \
  bash $V/run.sh 2>&1 | grep -E "^==|^decode|^prefill|^ceilings|rror|total"
