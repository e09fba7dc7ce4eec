#!/bin/sh
# Our CPU training step against PyTorch's CPU step for the same model and
# batch, measured in this run with the same thread count: the Fashion-MNIST
# MLP (784-256-128-10, batch 128), the tiny byte-level GPT (2 layers,
# d_model 128, T 64, batch 32) and the tiny ALBERT of
# examples/albert-tiny-brown.json (vocabulary 8,000, T 128, batch 16: post-LN,
# segment embeddings, masked-LM on 15 % of positions + sentence order).
# Ratio > 1 means ours is faster.
#   tests/bench/bench_train.sh [THREADS]     (default: all cores)
set -u
build=${BUILD:-build}
threads=${1:-$(nproc)}
ours=$build/tests/bench/bench_train_step
torch_py=$(dirname "$0")/bench_train_torch.py
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "bench_train: PyTorch missing (/usr/bin/python3 with python3-torch; scripts/install-deps.sh --torch)"
  exit 1
fi
for model in mlp:300 gpt:20 albert:5; do
  m=${model%%:*}; steps=${model#*:}
  o=$("$ours" "$m" "$threads" "$steps" | sed -n 's/^ms_per_step //p')
  t=$(/usr/bin/python3 "$torch_py" "$m" "$threads" "$steps" | sed -n 's/^ms_per_step //p')
  if [ -z "$o" ] || [ -z "$t" ]; then echo "bench_train: $m: a run failed"; exit 1; fi
  awk -v m="$m" -v o="$o" -v t="$t" -v n="$threads" 'BEGIN {
    printf "train step %-4s (%d threads): ours %8.2f ms, PyTorch %8.2f ms, speed ratio (PyTorch/ours) %.2f\n", m, n, o, t, t / o }'
done
