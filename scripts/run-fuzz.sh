#!/bin/sh
# Runs each libFuzzer binary for SECONDS over its seed corpus.
#   scripts/run-fuzz.sh SECONDS build-fuzz/tests/fuzz/fuzz_x ...
# New inputs go to build-fuzz/corpus/<name>/ (the committed seeds stay as
# they are); crashes are written to build-fuzz/crashes/ and fail the run.
set -u
secs=$1; shift
mkdir -p build-fuzz/crashes
fail=0; pass=0
for bin in "$@"; do
  name=$(basename "$bin" | sed 's/^fuzz_//')
  seeds=tests/fuzz/corpus/$name
  work=build-fuzz/corpus/$name
  mkdir -p "$work" "$seeds"
  dict=""
  [ -f "tests/fuzz/$name.dict" ] && dict="-dict=tests/fuzz/$name.dict"
  echo "fuzz: $name for ${secs}s"
  if "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 $dict \
       -artifact_prefix=build-fuzz/crashes/"$name"- "$work" "$seeds" >build-fuzz/"$name".log 2>&1; then
    pass=$((pass + 1)); tail -n 1 build-fuzz/"$name".log
  else
    fail=$((fail + 1)); echo "fuzz: $name FAILED"; tail -n 40 build-fuzz/"$name".log
  fi
done
echo "fuzz: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
