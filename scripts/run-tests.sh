#!/bin/bash
# Runs test binaries, each in its own process with a timeout, and prints one
# line per test and a summary "N passed, N failed, N skipped".
#   scripts/run-tests.sh [--suite NAME] [--jobs N] BIN...
# A test exits 0 (pass), 77 (skipped: says why on stdout; counted and shown,
# never silent) or anything else (fail). The per-test timeout is
# CT_TEST_TIMEOUT seconds (default 600); a test file may override it with a
# line "/* ct-timeout: N */". Full output goes to build/test-logs/<name>.log
# and is printed for failures.
#
# --jobs N runs up to N tests at once (make test: the unit suites, whose
# tests each use one core or wait on their own deadlines, on both cores of
# CI). A test file with a line "/* ct-serial */" runs alone even then (it
# measures time or throughput). Lines are printed as tests end, so with
# --jobs their order may differ from the command line's.
set -u
suite=tests
jobs=1
while [ $# -gt 0 ]; do
  case $1 in
    --suite) suite=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) break ;;
  esac
done
case $jobs in ''|*[!0-9]*|0) echo "run-tests.sh: --jobs wants a positive number, not '$jobs'" >&2; exit 2 ;; esac
logdir=${CT_TEST_LOGDIR:-build/test-logs}
mkdir -p "$logdir"
resdir=$(mktemp -d "${TMPDIR:-/tmp}/ct-run-tests.XXXXXX") || exit 2
trap 'rm -rf "$resdir"' EXIT
pass=0; fail=0; skip=0; failed=""

src_of() { echo "$1" | sed 's|^[^/]*/||'; }

# One test: runs it and leaves "rc secs" in $resdir/<name>.
run_one() {
  local bin=$1 name=$2 src t o start rc
  src=$(src_of "$bin").c
  t=${CT_TEST_TIMEOUT:-600}
  if [ -f "$src" ]; then
    o=$(sed -n 's|.*ct-timeout: *\([0-9][0-9]*\).*|\1|p' "$src" | head -n1)
    [ -n "$o" ] && t=$o
  fi
  start=$(date +%s)
  timeout -k 10 "$t" "$bin" >"$logdir/$name.log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - start )) $t" >"$resdir/$name.tmp"
  mv "$resdir/$name.tmp" "$resdir/$name"
}

# Prints a finished test's line and counts it.
report() {
  local name=$1 rc secs t log
  read -r rc secs t <"$resdir/$name"
  rm -f "$resdir/$name"
  log="$logdir/$name.log"
  case $rc in
    0) pass=$((pass + 1)); printf '  PASS  %-50s %4ss\n' "$name" "$secs" ;;
    77) skip=$((skip + 1)); printf '  SKIP  %-50s %s\n' "$name" "$(tail -n 1 "$log")" ;;
    124|137) fail=$((fail + 1)); failed="$failed $name"
        printf '  FAIL  %-50s timed out after %ss\n' "$name" "$t"; tail -n 40 "$log" | sed 's/^/        /' ;;
    *) fail=$((fail + 1)); failed="$failed $name"
        printf '  FAIL  %-50s exit %s\n' "$name" "$rc"; tail -n 60 "$log" | sed 's/^/        /' ;;
  esac
}

running=""  # names of the tests in flight
reap() {    # waits for one test of $running to end and reports it
  local n left
  while :; do
    for n in $running; do
      if [ -f "$resdir/$n" ]; then
        wait "$(cat "$resdir/$n.pid")" 2>/dev/null
        rm -f "$resdir/$n.pid"
        report "$n"
        left=""
        for m in $running; do [ "$m" != "$n" ] && left="$left $m"; done
        running=$left
        return
      fi
    done
    wait -n 2>/dev/null || sleep 0.2
  done
}
in_flight() { set -- $running; echo $#; }

for bin in "$@"; do
  name=$(echo "$bin" | sed 's|^[^/]*/tests/||; s|/|_|g')
  serial=0
  if [ "$jobs" -gt 1 ] && grep -q 'ct-serial' "$(src_of "$bin").c" 2>/dev/null; then serial=1; fi
  limit=$jobs
  [ $serial -eq 1 ] && limit=1
  while [ "$(in_flight)" -ge "$limit" ]; do reap; done
  run_one "$bin" "$name" &
  echo $! >"$resdir/$name.pid"
  running="$running $name"
  # a serial test also runs alone: wait for it before starting the next
  [ $serial -eq 1 ] && while [ "$(in_flight)" -gt 0 ]; do reap; done
done
while [ "$(in_flight)" -gt 0 ]; do reap; done
echo "$suite: $pass passed, $fail failed, $skip skipped"
[ -n "$failed" ] && echo "$suite: failed:$failed"
[ "$fail" -eq 0 ]
