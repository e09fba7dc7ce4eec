#!/bin/sh
# Writes a dataset manifest (docs/data.md) for Debian's Fashion-MNIST files
# to stdout, with file:// URLs, sizes and SHA-256 hashes computed from the
# files themselves.
#   scripts/make-fmnist-manifest.sh train|test [DIR] > fmnist-train.json
# DIR defaults to /usr/share/datasets/fashion-mnist (package
# dataset-fashion-mnist). Each split is one shard: the images file paired
# with its labels file, both gzip-compressed as Debian ships them.
set -eu
split=${1:-}
dir=${2:-/usr/share/datasets/fashion-mnist}
case "$split" in
  train) prefix=train; n=60000 ;;
  test) prefix=t10k; n=10000 ;;
  *) echo "usage: $0 train|test [DIR]" >&2; exit 2 ;;
esac
dir=$(cd "$dir" && pwd)
case "$dir" in
  *'"'*|*'\'*|*' '*) echo "$0: $dir: quotes, backslashes or spaces would need escaping in JSON and URLs" >&2; exit 1 ;;
esac
img="$dir/$prefix-images-idx3-ubyte.gz"
lab="$dir/$prefix-labels-idx1-ubyte.gz"
for f in "$img" "$lab"; do
  [ -r "$f" ] || { echo "$0: cannot read $f (install dataset-fashion-mnist)" >&2; exit 1; }
done
entry() {
  printf '"url": "file://%s", "size": %s, "sha256": "%s", "compression": "gzip"' \
    "$1" "$(stat -c %s "$1")" "$(sha256sum "$1" | cut -d' ' -f1)"
}
cat <<JSON
{
  "name": "fashion-mnist-$split",
  "description": "Fashion-MNIST $split split (Zalando Research), from $dir",
  "format": "idx-images",
  "image": {"rows": 28, "cols": 28, "classes": 10},
  "shards": [
    {$(entry "$img"), "examples": $n,
     "labels": {$(entry "$lab")}}
  ]
}
JSON
