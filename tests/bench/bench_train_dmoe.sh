#!/bin/sh
# End-to-end accuracy of the DMoE model (docs/training.md, "DMoE model"):
# `crowdtrain-agent train --local` on examples/fmnist-dmoe.json (trunk
# 784-256-128, 4x4 grid of local experts, top-4, 9000 steps of batch 128)
# must reach >= 88.5 % Fashion-MNIST test accuracy, and
# examples/fmnist-dmoe-fail10.json (each expert call failing with
# probability 0.1, seed 002 §4.2) >= 88 % with no non-finite loss. Prints the
# accuracy, the wall time and the experts' failure counts. About 3.5 minutes
# per run on this 2-core machine, hence `make bench`.
set -u
build=${BUILD:-build}
rc=0
run() { # config goal name
  log=$build/bench/train_$3.log
  mkdir -p "$(dirname "$log")"
  start=$(date +%s)
  if ! "$build/bin/crowdtrain-agent" train --local --config "$1" >"$log" 2>&1; then
    tail -n 20 "$log"; echo "bench_train_dmoe: $3: training failed"; rc=1; return
  fi
  secs=$(( $(date +%s) - start ))
  acc=$(sed -n 's/^eval after: .*accuracy \([0-9.]*\)%.*/\1/p' "$log")
  if [ -z "$acc" ] || grep -qi 'loss \(-\{0,1\}nan\|-\{0,1\}inf\)' "$log"; then
    tail -n 20 "$log"; echo "bench_train_dmoe: $3: no final eval line or a non-finite loss"; rc=1; return
  fi
  experts=$(sed -n 's/^experts: //p' "$log")
  awk -v a="$acc" -v s="$secs" -v g="$2" -v n="$3" 'BEGIN {
    printf "fashion-mnist %s: test accuracy %.2f%% in %d s (goal %.2f%%)\n", n, a, s, g
    exit !(a >= g) }' || { echo "bench_train_dmoe: $3: below $2%"; rc=1; }
  echo "  experts: $experts"
}
run examples/fmnist-dmoe.json 88.5 dmoe
run examples/fmnist-dmoe-fail10.json 88.0 dmoe-fail10
exit $rc
