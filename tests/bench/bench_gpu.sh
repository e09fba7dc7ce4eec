#!/bin/sh
# Our GPU training step in bf16 for the two example recipes (GPT-2 small with
# AdamW, ALBERT-large with LAMB; bench_gpu_train.c) with tokens/s and model
# FLOPs utilisation, and PyTorch's GPT-2 small step measured in the same run
# (bench_gpu_torch.py: bf16 autocast, SDPA, fused AdamW). Ratio > 1 means
# ours is faster.
#   tests/bench/bench_gpu.sh
# Environment: BENCH_PYTHON (python3) runs the PyTorch reference;
# BENCH_STEPS (10) timed steps; BENCH_GPT_BATCH (8), BENCH_ALBERT_BATCH (16)
# micro batches; BENCH_PEAK_TFLOPS (989.4) the peak MFU is taken against.
# Without a usable GPU it prints bench_gpu_train's "SKIP: <reason>" line and
# exits 0: scripts/bench.sh counts every other status as a failure, and a
# CPU-only machine running `make bench` has nothing wrong with it.
set -u
build=${BUILD:-build}
ours=$build/tests/bench/bench_gpu_train
torch_py=$(dirname "$0")/bench_gpu_torch.py
py=${BENCH_PYTHON:-python3}
steps=${BENCH_STEPS:-10}
gb=${BENCH_GPT_BATCH:-8}
ab=${BENCH_ALBERT_BATCH:-16}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

"$ours" gpt2-small "$gb" "$steps" >"$tmp/gpt" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
  grep '^SKIP' "$tmp/gpt" || echo "SKIP: bench_gpu_train found no usable GPU"
  exit 0
fi
sed 's/^/gpt2-small: /' "$tmp/gpt"
[ "$rc" -eq 0 ] || { echo "bench_gpu: gpt2-small failed (exit $rc)"; fail=1; }

"$ours" albert-large "$ab" "$steps" >"$tmp/albert" 2>&1
rc=$?
sed 's/^/albert-large: /' "$tmp/albert"
[ "$rc" -eq 0 ] || { echo "bench_gpu: albert-large failed (exit $rc)"; fail=1; }

if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "bench_gpu: $py has no PyTorch with CUDA (set BENCH_PYTHON): no reference"
  exit 1
fi
"$py" "$torch_py" gpt2-small "$gb" "$steps" >"$tmp/torch" 2>&1
rc=$?
sed 's/^/gpt2-small: /' "$tmp/torch"
[ "$rc" -eq 0 ] || { echo "bench_gpu: PyTorch reference failed (exit $rc)"; exit 1; }

o=$(sed -n 's/^tokens_per_s //p' "$tmp/gpt")
t=$(awk '$1 == "torch" && $2 == "tokens_per_s" {print $3}' "$tmp/torch")
if [ -z "$o" ] || [ -z "$t" ]; then
  echo "bench_gpu: no tokens/s to compare"
  exit 1
fi
awk -v o="$o" -v t="$t" -v b="$gb" 'BEGIN {
  printf "gpt2-small bf16 train step (micro batch %d x 1024): ours %.0f tokens/s, PyTorch %.0f tokens/s, speed ratio (ours/PyTorch) %.2f\n", b, o, t, o / t }'
exit "$fail"
