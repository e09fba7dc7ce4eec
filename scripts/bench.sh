#!/bin/sh
# Runs each benchmark (a binary or a script under tests/bench/) in turn and
# collects what they print into build/bench/results.txt. Every benchmark
# prints its own figures with a ratio against a reference measured in the
# same run (PyTorch for kernels, wrk against our own server, the bandwidth
# bound for averaging).
set -u
# The all-reduce benchmark compares with PyTorch's gloo in the same run:
# Debian's python3-torch (for /usr/bin/python3) is installed when missing and
# we are root; otherwise that comparison prints why it was skipped.
case " $* " in
  *bench_allreduce_gloo*)
    ./scripts/install-deps.sh --torch >/dev/null 2>&1 ||
      echo "bench: python3-torch is missing (scripts/install-deps.sh --torch): no gloo comparison" ;;
esac
mkdir -p build/bench
out=build/bench/results.txt
: >"$out"
fail=0
for b in "$@"; do
  name=$(basename "$b")
  echo "== $name" | tee -a "$out"
  if ! "$b" 2>&1 | tee -a "$out"; then
    echo "bench: $name FAILED" | tee -a "$out"; fail=$((fail + 1))
  fi
done
echo "bench: results in $out"
[ "$fail" -eq 0 ]
