#!/bin/bash
# Screens K encodings for issue 22 by fake quantization (docs/perf.md,
# "k4c's K error by channel: bits allocated by query energy"): K and V are
# stored in f32 and overwritten where k4c would store them by what k4c's
# encoders give back (the newest partial block in q8_0, older K blocks per
# channel over 32 tokens, older V rows in iq4_nlh64), so a K encoding can be
# scored without attention kernels.
#
# Needs a bench_kv_quality built from a tree with fake_quant_screen.patch
# applied (`git apply bench/kv_quality/fake_quant_screen.patch`, made
# against main 8dba833; not for committing: it reads environment switches
# per token). The hook acts on the f32 KV run, so each result is the row
# named f32, scored in steps of 32 tokens (--chunk 32: every block is then
# completed by one step and encoded before the next, as k4c's tails do).
#
# usage: screen_alloc.sh BIN MODEL CALIBRATION_TEXT OUT_DIR TEXT...
# For MODEL: the calibration text's statistics (query energy and K range
# per layer and channel) are written once, then every TEXT is scored with
#   U4:  every channel 4 bits, k4c's encoder (reproduces k4c);
#   S:   each layer's 4 * width code bits spread over its channels by the
#        calibration's query energy x K range^2 (greedy, 0..8 bits), the
#        same encoder's search with 2^b levels.
# Switches of the hook: RILL_SCREEN_K=post|pre|none (K after RoPE, before
# it, or exact), RILL_SCREEN_BITS=u|d|dr|dq|ds|dt|dc, RILL_SCREEN_FMT=1
# (f16 z and e4m3 d as k4c stores them), RILL_SCREEN_STATS_OUT / _IN,
# RILL_SCREEN_VEXACT=1 (V exact), RILL_SCREEN_VSINK=1 (position 0's V exact);
# for V (docs/perf.md, "V after k4a"): RILL_SCREEN_V=s|t|u (V per channel
# over the block, RILL_SCREEN_VBUDGET bits a channel, default 3.5: iq4_nlh64's
# bytes; widths by W_o column energy RILL_SCREEN_VW_IN, tools/kv_wo_energy.py,
# times the calibration's range^2 RILL_SCREEN_VSTATS_IN (s) or the block's (t)),
# RILL_SCREEN_VSTATS_OUT (V's calibration statistics), RILL_SCREEN_VEQ=1 (V
# scaled per channel by (W_o energy / range^2)^RILL_SCREEN_VEQ_P, default
# 0.25, before its rotation and iq4_nlh64, divided back after).
set -euo pipefail
BIN=$1 MODEL=$2 CAL=$3 OUT=$4
shift 4
mkdir -p "$OUT"
stats=$OUT/stats_$(basename "$MODEL").txt
row() { grep '^f32 ' "$1" | sed 's/^f32 *//'; }
RILL_SCREEN_K=post RILL_SCREEN_BITS=d RILL_SCREEN_STATS_OUT=$stats \
  "$BIN" --chunk 32 "$MODEL" "$CAL" 2048 f16 > "$OUT/calibration.txt"
for text in "$@"; do
  name=$(basename "$text")
  RILL_SCREEN_K=post RILL_SCREEN_BITS=u RILL_SCREEN_FMT=1 \
    "$BIN" --chunk 32 "$MODEL" "$text" 2048 f16 > "$OUT/u4_$name.txt"
  RILL_SCREEN_K=post RILL_SCREEN_BITS=ds RILL_SCREEN_FMT=1 RILL_SCREEN_STATS_IN=$stats \
    "$BIN" --chunk 32 "$MODEL" "$text" 2048 f16 > "$OUT/s_$name.txt"
  echo "$name U4 $(row "$OUT/u4_$name.txt")"
  echo "$name S  $(row "$OUT/s_$name.txt")"
done
