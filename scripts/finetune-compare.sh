#!/bin/sh
# The downstream comparison of issue 20 (seed 000 H.6): a pretrained encoder
# fine-tuned on the Brown genre task against the same config trained from
# scratch on the task alone, over several seeds each; prints every run's
# held-out accuracy and each side's mean and spread (min..max).
#   scripts/finetune-compare.sh CONFIG MODEL.safetensors [SEEDS] [-- FINETUNE ARGS...]
# CONFIG is the pretraining run's config (its model and tokenizer), MODEL
# its export (`train --local --export`, `join --export`). SEEDS defaults to
# "1 2 3"; arguments after -- go to every `crowdtrain-agent finetune`
# (default: --context 96 --steps 200 --batch 16). The task files are made
# by scripts/make-brown-genre.sh into a temporary directory.
set -eu
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
config=$1; model=$2; shift 2
seeds="1 2 3"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then seeds=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
[ $# -gt 0 ] || set -- --context 96 --steps 200 --batch 16
bin=${BUILD:-build}/bin/crowdtrain-agent
corpus=${CORPUS:-/usr/local/share/crowdtrain/corpus/brown}
dir=$(mktemp -d /tmp/ct-finetune-cmp-XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$(dirname "$0")/make-brown-genre.sh" "$corpus" "$dir" >/dev/null
for side in pretrained scratch; do
  for s in $seeds; do
    if [ $side = pretrained ]; then m="--model $model"; else m=; fi
    # shellcheck disable=SC2086
    out=$("$bin" finetune --config "$config" $m --train "$dir/brown-genre-train.tsv" \
          --eval "$dir/brown-genre-eval.tsv" --seed "$s" "$@") || { echo "$out" >&2; exit 1; }
    acc=$(echo "$out" | sed -n 's/^finetune: eval after: accuracy \([0-9.]*\)%.*/\1/p')
    maj=$(echo "$out" | sed -n 's/.*majority label \([0-9.]*\)%.*/\1/p' | tail -n 1)
    echo "$side seed $s: held-out accuracy $acc % (majority label $maj %)"
    echo "$side $acc" >> "$dir/results"
  done
done
awk '{ n[$1]++; s[$1] += $2; if (!($1 in lo) || $2 < lo[$1]) lo[$1] = $2; if (!($1 in hi) || $2 > hi[$1]) hi[$1] = $2 }
     END { for (k in n) printf "%s: mean %.2f %% over %d seeds (%.2f..%.2f)\n", k, s[k] / n[k], n[k], lo[k], hi[k]
           printf "margin (pretrained - scratch): %.2f points\n", s["pretrained"] / n["pretrained"] - s["scratch"] / n["scratch"] }' \
  "$dir/results"
