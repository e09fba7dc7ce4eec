#!/bin/sh
# Runs test binaries, each in its own process with a timeout, and prints one
# line per test and a summary "N passed, N failed, N skipped".
#   scripts/run-tests.sh [--suite NAME] BIN...
# A test exits 0 (pass), 77 (skipped: says why on stdout; counted and shown,
# never silent) or anything else (fail). The per-test timeout is
# CT_TEST_TIMEOUT seconds (default 600); a test file may override it with a
# line "/* ct-timeout: N */". Full output goes to build/test-logs/<name>.log
# and is printed for failures.
set -u
suite=tests
if [ "${1:-}" = "--suite" ]; then suite=$2; shift 2; fi
logdir=${CT_TEST_LOGDIR:-build/test-logs}
mkdir -p "$logdir"
pass=0; fail=0; skip=0; failed=""
for bin in "$@"; do
  name=$(echo "$bin" | sed 's|^[^/]*/tests/||; s|/|_|g')
  src=$(echo "$bin" | sed 's|^[^/]*/||').c
  t=${CT_TEST_TIMEOUT:-600}
  if [ -f "$src" ]; then
    o=$(sed -n 's|.*ct-timeout: *\([0-9][0-9]*\).*|\1|p' "$src" | head -n1)
    [ -n "$o" ] && t=$o
  fi
  log="$logdir/$name.log"
  start=$(date +%s)
  timeout -k 10 "$t" "$bin" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  case $rc in
    0) pass=$((pass + 1)); printf '  PASS  %-50s %4ss\n' "$name" "$secs" ;;
    77) skip=$((skip + 1)); printf '  SKIP  %-50s %s\n' "$name" "$(tail -n 1 "$log")" ;;
    124|137) fail=$((fail + 1)); failed="$failed $name"
        printf '  FAIL  %-50s timed out after %ss\n' "$name" "$t"; tail -n 40 "$log" | sed 's/^/        /' ;;
    *) fail=$((fail + 1)); failed="$failed $name"
        printf '  FAIL  %-50s exit %s\n' "$name" "$rc"; tail -n 60 "$log" | sed 's/^/        /' ;;
  esac
done
echo "$suite: $pass passed, $fail failed, $skip skipped"
[ -n "$failed" ] && echo "$suite: failed:$failed"
[ "$fail" -eq 0 ]
