#!/bin/bash
# Device run of make_carry_kvstore22.sh's pack: the CudaKvChan tests
# (FILTER; DeviceTimingOfTheStore prints `[ kv store ]` lines: one layer's
# RoPE + KV store at Llama-3.1-8B's shape, a token and 64, per store), the
# packed baseline's timing too when there is one (tests_base), then
# (NCU=1) Nsight Compute on the general RoPE kernel of k4c's store at one
# token: its duration, issue and stall picture. Logs under
# /tmp/kvstore22-logs, packed into $OUT (device_out.sh); the verdict last.
# Usage (the run tool): bash .device/kvstore22/run.sh   (carry [".device/kvstore22"])
T0=$(date +%s)
V=$(cd "$(dirname "$0")" && pwd)
FILTER=${FILTER:-'CudaKvChan.*-*HostRun*'}
BUDGET=${BUDGET:-200}
L=/tmp/kvstore22-logs
. "$V/device_out.sh"
verdict_lines() { grep -h "^\[ kv store \]" $L/tests*.log 2> /dev/null | head -30; }
tar xJf $V/bins.tar.xz -C $V
for f in $V/lib/*.xz; do xz -d "$f"; done
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
cd /tmp
tmo 120 $V/tests --gtest_filter="$FILTER" > $L/tests.log 2>&1
out_rc tests $?
out_key $L/tests.log
if [ -f $V/tests_base ]; then
  tmo 60 $V/tests_base --gtest_filter='*DeviceTimingOfTheStore*' > $L/tests_base.log 2>&1
  out_rc tests_base $?
  sed -i 's/^\[ kv store \]/[ kv store ] base:/' $L/tests_base.log
fi
if [ "${NCU:-0}" = 1 ]; then
  # At 1 token, a warm-up + 100 back-to-back + 50 single calls a variant;
  # f16 takes the warp kernel, so the general kernel's launches 0-603 are
  # q8_0, q8_0h, q8_0h64 and iq4_nlh64's, and 605 is k4c's first timed call.
  tmo 120 ncu --clock-control none --kernel-name regex:rope_kv_kernel --launch-skip ${NCU_SKIP:-605} --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters --import-source no -o $L/rope \
    $V/tests --gtest_filter='*DeviceTimingOfTheStore*' > $L/ncu.log 2>&1
  out_rc ncu $?
  ncu -i $L/rope.ncu-rep > $L/ncu_details.log 2>&1
  grep -E "rope_kv_kernel|Duration|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc|No Eligible|Issued Instructions  " $L/ncu_details.log | cut -c1-160 | head -20
  # Per SASS instruction: its samples and stall reasons, the 40 most sampled.
  ncu -i $L/rope.ncu-rep --page source --csv --print-source sass > $L/sass_source.csv 2> $L/sass_source.err
  out_rc sass_source $?
  python3 - "$L/sass_source.csv" > $L/sass_top.txt 2>&1 << 'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if any("Source" == c or "Address" in c for c in r))
cols = rows[head]
print("columns:", cols)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
samp = [i for i, c in enumerate(cols) if "Sampling" in c and "All" in c]
k = samp[0] if samp else None
body = [r for r in rows[head + 1:] if len(r) == len(cols)]
total = sum(num(r[k]) for r in body) if k is not None else 0
print("instructions", len(body), "samples", total)
if k is not None:
    for r in sorted(body, key=lambda r: -num(r[k]))[:40]:
        print(" | ".join(r[:3]), "|", r[k], "|", " ".join(f"{cols[i]}={r[i]}" for i in range(len(cols)) if "stall" in cols[i].lower() and num(r[i]) > 0)[:300])
PY
  out_key $L/sass_top.txt
  # The kernel's SASS (cuobjdump), for reading the chains.
  cuobjdump -sass -fun '_ZN4rill4cuda38_GLOBAL__N__56fc64be_6_ops_cu_bc2c551e14rope_kv_kernelINS0_6detail9KvIq4Nl64EEEvNS0_10RopeKvArgsE' \
    $V/tests > $L/rope_iq4nl64.sass 2>&1 || cuobjdump -sass $V/tests 2>/dev/null | awk '/Function : .*rope_kv_kernel.*KvIq4Nl64/,/\.\.\.\.\.\.\.\.\.\./' > $L/rope_iq4nl64.sass
  wc -l $L/rope_iq4nl64.sass
  out_key $L/rope_iq4nl64.sass
fi
