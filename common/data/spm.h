/* SentencePiece tokenizer models (issue 20; seed 001: sahajBERT's Unigram
 * tokenizer; ALBERT's own is a SentencePiece Unigram model), through
 * Debian's libsentencepiece: the model file spm_train writes is read by the
 * same library, so our ids are spm_encode's for the same text (tested on
 * the Brown corpus's evaluation half, tests/unit/data/test_spm.c).
 * docs/data.md, "Tokenizer", has the training recipe (scripts/train-
 * tokenizer.sh): Unigram, no normalization, whitespace kept, byte
 * fallback, so that decode(encode(text)) == text for any UTF-8 text.
 *
 * Models that normalize text (a precompiled character map) are refused:
 * the library reads that map unchecked (spm.cc, check_model_bytes).
 *
 * A loaded model is read-only: encode and decode may run on several threads
 * at once. The text must be UTF-8: anything else is refused with the byte
 * offset, never replaced or skipped. */
#ifndef CM_SPM_H
#define CM_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cm_spm;

/* Loads a model from a file, or from its bytes (a model fetched from the
 * coordinator). CM_EINVAL or CM_EIO with a message in err; CM_ENOMEM. */
int cm_spm_load(const char *path, struct cm_spm **out, char *err, size_t errlen);
int cm_spm_load_mem(const void *model, size_t len, struct cm_spm **out, char *err, size_t errlen);
void cm_spm_free(struct cm_spm *s);

/* Pieces in the vocabulary (ids 0 .. size-1). */
int cm_spm_vocab_size(const struct cm_spm *s);
/* A piece's id ("[MASK]", "<pad>"), or -1 when the vocabulary lacks it. */
int cm_spm_piece_id(const struct cm_spm *s, const char *piece);

/* Offset of the first byte of text that is not part of valid UTF-8
 * (overlong forms, surrogates and code points above U+10FFFF count as
 * invalid), or len when all of it is valid. */
size_t cm_utf8_invalid_at(const char *text, size_t len);

/* Encodes len bytes of UTF-8 text into ids (up to cap); *n gets the count.
 * CM_TOOBIG when cap is too small (*n then says how many are needed),
 * CM_EINVAL with a message for text that is not UTF-8. */
int cm_spm_encode(const struct cm_spm *s, const char *text, size_t len, int32_t *ids, size_t cap,
                  size_t *n, char *err, size_t errlen);

/* Decodes ids into a malloc'ed, NUL-terminated string (*out, *outlen bytes
 * without the NUL). CM_EINVAL for an id outside the vocabulary. */
int cm_spm_decode(const struct cm_spm *s, const int32_t *ids, size_t n, char **out,
                  size_t *outlen, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
