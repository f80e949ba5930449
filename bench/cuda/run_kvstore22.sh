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
  # At 1 token, a warm-up + 100 timed calls a variant; f16 takes the warp
  # kernel, so the general kernel's launches 0-403 are q8_0, q8_0h,
  # q8_0h64 and iq4_nlh64's, and 405 is k4c's first timed call.
  tmo 120 ncu --clock-control none --kernel-name regex:rope_kv_kernel --launch-skip ${NCU_SKIP:-405} --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters \
    $V/tests --gtest_filter='*DeviceTimingOfTheStore*' > $L/ncu.log 2>&1
  out_rc ncu $?
  grep -E "rope_kv_kernel|Duration|Compute \(SM\)|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc|No Eligible|Stall|stall" $L/ncu.log | cut -c1-160 | head -40
fi
