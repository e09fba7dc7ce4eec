#!/bin/sh
# Writes the dataset manifests the example configs use, with the sizes and
# SHA-256 of the files as installed on this machine (Debian packages
# dataset-fashion-mnist and vim-runtime). Rerun it when those packages change
# version: the data stream rejects a shard whose hash does not match.
#   examples/make-manifests.sh [OUTDIR]      (default: examples/)
set -eu
out=${1:-$(dirname "$0")}
fm=/usr/share/datasets/fashion-mnist
vim=$(ls -d /usr/share/vim/vim*/doc 2>/dev/null | sort | tail -n 1)

file_json() { # path compression
  printf '{"url": "file://%s", "size": %s, "sha256": "%s", "compression": "%s"}' \
    "$1" "$(stat -c %s "$1")" "$(sha256sum "$1" | cut -d' ' -f1)" "$2"
}

fmnist() { # name images labels
  d=$(file_json "$2" gzip); l=$(file_json "$3" gzip)
  cat >"$out/$1.manifest.json" <<JSON
{
  "name": "$1",
  "description": "Fashion-MNIST from Debian's dataset-fashion-mnist; pixels scaled to [0,1] and standardized",
  "format": "idx-images",
  "image": {"rows": 28, "cols": 28, "classes": 10, "mean": 0.2860, "std": 0.3530},
  "shards": [
    $(printf '%s' "$d" | sed 's/}$//'), "labels": $l}
  ]
}
JSON
}

if [ -d "$fm" ]; then
  fmnist fmnist-train "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz"
  fmnist fmnist-test "$fm/t10k-images-idx3-ubyte.gz" "$fm/t10k-labels-idx1-ubyte.gz"
  echo "wrote $out/fmnist-train.manifest.json $out/fmnist-test.manifest.json"
else
  echo "skipping Fashion-MNIST: $fm missing (apt-get install dataset-fashion-mnist)" >&2
fi

# Vim's documentation: ~10 MB of real English technical prose in ~150
# files. The user manual chapters usr_2*.txt are held out for evaluation.
textset() { # name files...
  name=$1; shift
  {
    printf '{\n  "name": "%s",\n  "description": "Vim documentation (Debian vim-runtime), raw bytes",\n' "$name"
    printf '  "format": "text-bytes",\n  "shards": [\n'
    sep=""
    for f in "$@"; do printf '%s    %s' "$sep" "$(file_json "$f" none)"; sep=",
"; done
    printf '\n  ]\n}\n'
  } >"$out/$name.manifest.json"
}
if [ -n "$vim" ]; then
  train=$(ls "$vim"/*.txt | grep -v '/usr_2[0-9]\.txt$')
  eval=$(ls "$vim"/usr_2[0-9].txt)
  # shellcheck disable=SC2086
  textset vimdoc-train $train
  # shellcheck disable=SC2086
  textset vimdoc-eval $eval
  echo "wrote $out/vimdoc-train.manifest.json $out/vimdoc-eval.manifest.json"
else
  echo "skipping the text corpus: no /usr/share/vim/vim*/doc (apt-get install vim-runtime)" >&2
fi
