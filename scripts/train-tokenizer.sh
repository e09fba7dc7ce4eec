#!/bin/sh
# Trains a SentencePiece Unigram tokenizer for a language-model run (issue
# 20), the recipe of docs/data.md ("Tokenizer"):
#
#   scripts/train-tokenizer.sh TEXT VOCAB_SIZE OUT_PREFIX [THREADS]
#
# writes OUT_PREFIX.model (what runs name in their config) and
# OUT_PREFIX.vocab (the pieces with their log probabilities, for reading).
# Unigram LM as ALBERT and sahajBERT (seed 001); ids 0-4 are <pad>, <unk>,
# [CLS], [SEP], [MASK] (ALBERT's order); no normalization and whitespace
# kept as it is, with byte fallback for characters outside the vocabulary,
# so decode(encode(text)) == text for any UTF-8 text. Every sentence is used
# in file order with a fixed seed: the same text (and the same paths, which
# the model records) gives the same model, byte for byte. For corpora too
# large to hold in memory, SPM_EXTRA="--input_sentence_size=N
# --shuffle_input_sentence=true" samples N sentences.
set -eu
[ $# -ge 3 ] || { echo "usage: $0 TEXT VOCAB_SIZE OUT_PREFIX [THREADS]" >&2; exit 2; }
command -v spm_train >/dev/null 2>&1 ||
    { echo "train-tokenizer: spm_train not found (apt-get install sentencepiece)" >&2; exit 1; }
exec spm_train --input="$1" --vocab_size="$2" --model_prefix="$3" \
    --model_type=unigram --character_coverage=1.0 \
    --normalization_rule_name=identity --remove_extra_whitespaces=false --byte_fallback=true \
    --pad_id=0 --unk_id=1 --bos_id=-1 --eos_id=-1 --user_defined_symbols='[CLS],[SEP],[MASK]' \
    --input_sentence_size=0 --shuffle_input_sentence=false --random_seed=1 \
    --num_threads="${4:-2}" --minloglevel=1 ${SPM_EXTRA:-}
