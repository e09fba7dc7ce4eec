#!/bin/sh
# End-to-end accuracy run: `crowdtrain-agent train --local` on
# examples/fmnist-mlp.json (MLP 784-256-128-10, 9000 steps of batch 128) must
# reach >= 88.5 % Fashion-MNIST test accuracy; prints the accuracy, the wall
# time and the margin over the published 256-128-100 MLP baseline (88.33 %).
# About a minute on 2 idle cores, which is why it lives in `make bench`
# rather than `make test`.
set -u
build=${BUILD:-build}
log=$build/bench/train_fmnist.log
mkdir -p "$(dirname "$log")"
start=$(date +%s)
if ! "$build/bin/crowdtrain-agent" train --local --config examples/fmnist-mlp.json >"$log" 2>&1; then
  tail -n 20 "$log"; echo "bench_train_fmnist: training failed"; exit 1
fi
secs=$(( $(date +%s) - start ))
acc=$(sed -n 's/^eval after: .*accuracy \([0-9.]*\)%.*/\1/p' "$log")
if [ -z "$acc" ]; then tail -n 20 "$log"; echo "bench_train_fmnist: no final eval line"; exit 1; fi
awk -v a="$acc" -v s="$secs" 'BEGIN {
  printf "fashion-mnist mlp: test accuracy %.2f%% in %d s (goal 88.50%%, published MLP baseline 88.33%%: %+.2f points)\n", a, s, a - 88.33
  exit !(a >= 88.5) }' || { echo "bench_train_fmnist: below 88.5%"; exit 1; }
