#!/bin/sh
# The Brown corpus's genre task for `crowdtrain-agent finetune` (issue 20,
# seed 000 H.6: a downstream evaluation from the same corpus): each document
# of brown-train.txt / brown-eval.txt (made by scripts/make-brown-corpus.sh,
# documents separated by blank lines, in the order of brown-docs.tsv's rows
# of that split) is cut into examples of consecutive sentences holding at
# least WORDS words (default 60; a document's last, shorter piece is kept
# when it has at least WORDS / 2), each labeled with its document's genre:
#   genre<TAB>text
# Held-out examples come from held-out documents only (the corpus's split).
#   scripts/make-brown-genre.sh [CORPUS_DIR] [OUT_DIR] [WORDS]
# writes OUT_DIR/brown-genre-train.tsv and brown-genre-eval.tsv and prints
# their example counts.
set -eu
corpus=${1:-/usr/local/share/crowdtrain/corpus/brown}
out=${2:-$corpus}
words=${3:-60}
for f in brown-docs.tsv brown-train.txt brown-eval.txt; do
  [ -r "$corpus/$f" ] || { echo "make-brown-genre: $corpus/$f is missing (scripts/make-brown-corpus.sh makes it)" >&2; exit 1; }
done
case $words in ''|*[!0-9]*) echo "make-brown-genre: WORDS must be a positive integer" >&2; exit 2 ;; esac
mkdir -p "$out"
tmp=
trap '[ -n "$tmp" ] && rm -f "$tmp"' EXIT
for split in train eval; do
  tmp="$out/.brown-genre-$split.tsv.$$"
  awk -F'\t' -v part="$split" -v words="$words" -v docs="$corpus/brown-docs.tsv" '
    BEGIN {
      n = 0
      while ((getline line < docs) > 0) {
        split(line, f, "\t")
        if (f[3] == part) genre[n++] = f[2]
      }
      d = 0; text = ""; nw = 0; ex = 0
    }
    function flush(force) {
      if (nw >= words || (force && nw >= words / 2)) { print genre[d] "\t" text; ex++ }
      text = ""; nw = 0
    }
    /^$/ { flush(1); d++; next }
    {
      gsub(/\t/, " ")
      text = text == "" ? $0 : text " " $0
      nw += split($0, w, " ")
      if (nw >= words) flush(0)
    }
    END {
      flush(1)
      if (d + 1 != n) { printf "make-brown-genre: %d documents in the %s text, %d in brown-docs.tsv\n", d + 1, part, n > "/dev/stderr"; exit 1 }
    }' "$corpus/brown-$split.txt" > "$tmp"
  mv "$tmp" "$out/brown-genre-$split.tsv"
  tmp=
  echo "brown-genre-$split.tsv: $(wc -l < "$out/brown-genre-$split.tsv") examples"
done
