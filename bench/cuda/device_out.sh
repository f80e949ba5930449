# shellcheck shell=bash
# Sourced by the one-call device scripts (run_*.sh). The device tool hands
# back at most 8 files from $OUT and only the last 12,000 characters of the
# output, so a script writes its logs under $L (a work folder) and, at exit
# (an EXIT trap; TERM, INT and HUP exit through it), out_finish
#  - packs $L into ONE file, $OUT/logs.tar.gz (out_pack: also callable after
#    a part, so a kill -9 still leaves the last pack),
#  - copies the key logs (out_key FILE, at most 5, the test logs) to $OUT,
#  - prints the verdict block as the last lines: each recorded rc (out_rc
#    NAME RC), per key log its gtest summary and FAILED test names, then the
#    script's headline lines (its function verdict_lines, if defined).
# Before sourcing: T0 (start, s), BUDGET (s) and L set. OUT defaults to
# $L.out when unset (a dry run off the device).
# The script itself sources it from its own folder (the carry: make_carry_*
# copies it beside run.sh) or from the repo root (the cwd on the device).
OUT=${OUT:-$L.out}
mkdir -p "$L" "$OUT"
OUT_KEYS=()
OUT_RCS=()
OUT_CHILD=
# The script's stdout, for the verdict: a trap can run inside a call whose
# output goes to a log (tmo CMD > LOG).
exec 9>&1
left() { echo $((BUDGET - ($(date +%s) - T0))); }
# A timeout: the call's worst case $1, or what is left of the budget (at
# least 1 s), never above 590 s (one device command has 600 s).
to() {
  local l
  l=$(left)
  ((l > $1)) && l=$1
  ((l > 590)) && l=590
  ((l < 1)) && l=1
  echo $l
}
# tmo N CMD...: timeout $(to N) CMD..., run in the background and waited
# for, so a TERM to the script is handled at once (bash holds a trap while
# a foreground child runs); the call's redirections and VAR=x prefixes apply.
tmo() {
  local n=$1 rc
  shift
  timeout "$(to "$n")" "$@" &
  OUT_CHILD=$!
  wait $OUT_CHILD
  rc=$?
  OUT_CHILD=
  return $rc
}
out_key() { OUT_KEYS+=("$1"); }
out_rc() { OUT_RCS+=("$1 rc=$2"); }
out_pack() {
  local k
  tar czf "$L.tgz" -C "$(dirname "$L")" "$(basename "$L")" 2>/dev/null && mv -f "$L.tgz" "$OUT/logs.tar.gz"
  for k in "${OUT_KEYS[@]:0:5}"; do
    [ -f "$k" ] && cp -f "$k" "$OUT/"
  done
}
# The gtest verdict of one log: summary lines, FAILED test names, or a note
# (and the log's last lines) when there is no summary (a crash or a timeout).
out_gtest() {
  echo "-- $(basename "$1"):"
  [ -f "$1" ] || {
    echo "   (no log)"
    return
  }
  grep -hE '^\[  (PASSED|FAILED|SKIPPED) \] [0-9]+ tests?' "$1" | head -4
  grep -hE '^\[  FAILED  \] [A-Za-z_]' "$1" | sed 's/ (.*//' | sort -u | head -30
  grep -qE '^\[  PASSED  \] [0-9]' "$1" || {
    echo "   (no PASSED summary: crashed or cut short? its last lines:)"
    tail -4 "$1" | cut -c1-200
  }
}
out_finish() {
  local rc=$? r k
  trap - EXIT INT TERM HUP
  exec 1>&9 2>&9
  # Background parts (the model being made) and a running call: by pid.
  [ -n "$OUT_CHILD" ] && kill "$OUT_CHILD" 2>/dev/null
  for k in $(jobs -p); do kill "$k" 2>/dev/null; done
  out_pack
  echo "===== verdict: $(basename "$(dirname "$0")")/$(basename "$0") rc=$rc after $(($(date +%s) - T0)) s;" \
    "every log in logs.tar.gz ($(ls "$OUT" | tr '\n' ' '))"
  for r in "${OUT_RCS[@]}"; do echo "$r"; done
  for k in "${OUT_KEYS[@]}"; do out_gtest "$k"; done
  if declare -F verdict_lines > /dev/null; then
    echo "-- headline:"
    verdict_lines 2>&1 | cut -c1-220 | head -60
  fi
  echo "===== end of verdict"
  exit $rc
}
trap out_finish EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
