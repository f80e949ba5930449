#!/bin/bash
# Device run of make_carry_verify.sh's pack: every GPU test in one binary
# (FILTER: a gtest filter, default all; PART=i/n: the i-th of n shares of
# the suites instead; LIMIT: its timeout, default 400 s,
# capped by BUDGET, default 570 s). The log goes to /tmp/verify-logs;
# $OUT gets it packed (logs.tar.gz) and as tests.log, and the verdict block
# (rc, gtest summary, FAILED names) is printed last (device_out.sh), also
# when the script is cut short. The repo root is the cwd.
T0=$(date +%s)
R=$PWD; V=$R/.device/verify
BUDGET=${BUDGET:-570}
L=/tmp/verify-logs
. "$([ -f "$V/device_out.sh" ] && echo "$V" || echo "$R/bench/cuda")/device_out.sh"
mkdir -p /work
# The link to the repo root, unless /work/main is a real folder (off the device).
{ [ -d /work/main ] && [ ! -L /work/main ]; } || ln -sfn "$R" /work/main
(cd /work && tar xJf "$V/shared.tar.xz")
xz -d "$V/tests.xz" && chmod +x "$V/tests"
export LD_LIBRARY_PATH=$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} RILL_SHARED_DIR=/work/shared
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cd /tmp
out_key "$L/tests.log"
FILTER=${FILTER:-*}
# PART=i/n: the i-th of n shares of the test suites (in the binary's
# order, split by suite count), so that the whole suite, which outgrew one
# call (2026-12-06: cut at 230 s), runs in n calls (n = 3 since the second
# session of 2026-12-06: part 1 of 2 ran past 250 s); its filter replaces
# FILTER's positive part.
if [ -n "${PART:-}" ]; then
  i=${PART%/*}; n=${PART#*/}
  mapfile -t suites < <("$V/tests" --gtest_list_tests 2> /dev/null | grep -E '^[A-Za-z0-9_/]+\.' | sed 's/\..*//')
  per=$(( (${#suites[@]} + n - 1) / n ))
  FILTER=$(printf '%s.*:' "${suites[@]:$(( (i - 1) * per )):$per}")
  FILTER=${FILTER%:}
  echo "part $PART: ${#suites[@]} suites, these $(( $(tr -cd ':' <<< "$FILTER" | wc -c) + 1 ))"
fi
tmo "${LIMIT:-400}" "$V/tests" --gtest_filter="$FILTER" > "$L/tests.log" 2>&1; RC=$?
out_rc tests $RC
echo "tests rc=$RC"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED|tests ran" "$L/tests.log" | sort | uniq -c | sort -rn | head -40
grep -B2 -A12 "Failure" "$L/tests.log" | cut -c1-200 | head -60
date -u
exit "$RC"
