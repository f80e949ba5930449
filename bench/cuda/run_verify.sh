#!/bin/bash
# Device run of make_carry_verify.sh's pack: every GPU test in one binary
# (FILTER: a gtest filter, default all), its summary and failures under
# $OUT. The repo root is the cwd.
R=$PWD; V=$R/.device/verify
mkdir -p /work && ln -sfn "$R" /work/main && (cd /work && tar xJf "$V/shared.tar.xz")
xz -d "$V/tests.xz" && chmod +x "$V/tests"
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cd /tmp
timeout "${LIMIT:-400}" "$V/tests" --gtest_filter="${FILTER:-*}" > "$OUT/tests.log" 2>&1; RC=$?
echo "tests rc=$RC"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran" "$OUT/tests.log" | sort | uniq -c | sort -rn | head -60
grep -B2 -A12 "Failure" "$OUT/tests.log" | head -120
date -u
exit $RC
