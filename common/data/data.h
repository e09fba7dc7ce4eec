/* Datasets: manifests of shards, streamed through a shuffle buffer.
 *
 * A dataset is a JSON manifest listing shards (URL, size, SHA-256) and the
 * format of their contents (docs/data.md has the schema and examples). An
 * iterator streams the shards through libcurl (file://, http://, https://)
 * in a background thread, each peer in its own random order derived from its
 * seed, verifies every shard's size and SHA-256 before any of its examples
 * are released (verify-then-release, bounded by max_shard_bytes; or chunk
 * by chunk when the manifest lists chunk hashes), decodes it, and feeds the
 * examples through a shuffle buffer of S examples from which batches are
 * drawn (seed 000_02cc6b5d62a616fc.txt, §3.3 and Appendix H.3). After the last shard the order is reshuffled and a new epoch starts:
 * the training stream never ends. The eval mode reads the shards in manifest
 * order, without shuffling, exactly once.
 *
 * Everything is deterministic for a given (manifest, seed, options): the
 * background thread only prefetches, the consumer sees examples in an order
 * that does not depend on timing.
 *
 * The parsers (manifest, IDX, llm.c token files, gzip, text-docs) are pure functions
 * over caller bytes, bounded, and fuzzed (tests/fuzz/). */
#ifndef CM_DATA_H
#define CM_DATA_H

#include <stddef.h>
#include <stdint.h>

/* ---- Manifest ---------------------------------------------------------- */

enum cm_data_format {
    CM_DATA_IDX_IMAGES = 1, /* IDX ubyte images (N,rows,cols) + IDX labels (N) */
    CM_DATA_TEXT_BYTES = 2, /* raw bytes; vocabulary 256 */
    CM_DATA_TOKENS_U16 = 3, /* llm.c token shards: 256 x int32 header + uint16 tokens */
    CM_DATA_TEXT_DOCS = 4,  /* UTF-8 text, one sentence per line, documents separated by
                               blank lines; tokenized on the fly into ALBERT sentence pairs */
};

enum cm_data_compression {
    CM_DATA_COMP_NONE = 0,
    CM_DATA_COMP_GZIP = 1,
};

/* Limits the manifest parser enforces (absurd values are errors). */
#define CM_DATA_MAX_SHARDS 1000000
#define CM_DATA_MAX_URL 4096
#define CM_DATA_MAX_NAME 256
#define CM_DATA_MAX_SHARD_SIZE (1ull << 40) /* 1 TiB: a manifest field bound */
#define CM_DATA_MAX_IMAGE_PIXELS (1u << 20)

#define CM_DATA_MAX_CHUNKS (1u << 20)

/* One file of a shard: where it is and what it must hash to. With chunk
 * hashes (text-bytes and tokens-u16, uncompressed only), the examples of
 * each verified chunk are released while the rest of the file is still
 * arriving; without them, the whole file is verified first. */
struct cm_data_file {
    char *url;                          /* owned, NUL-terminated */
    uint64_t size;                      /* bytes as stored (compressed if gzip) */
    uint8_t sha256[32];                 /* of the stored bytes */
    enum cm_data_compression compression;
    uint32_t chunk_size;                /* 0 = no chunk hashes */
    uint32_t n_chunks;                  /* ceil(size / chunk_size) */
    uint8_t (*chunk_sha256)[32];        /* owned, n_chunks hashes of consecutive chunks */
};

struct cm_data_shard {
    struct cm_data_file data;   /* images (idx) / bytes (text) / tokens */
    struct cm_data_file labels; /* idx-images only; url NULL otherwise */
    uint64_t examples;          /* declared example count, 0 = not declared */
};

struct cm_data_manifest {
    char *name;                 /* owned */
    enum cm_data_format format;
    /* idx-images */
    uint32_t rows, cols;        /* image shape, both >= 1 */
    uint32_t classes;           /* labels must be < classes */
    float mean, std;            /* x = (pixel / 255 - mean) / std; default 0, 1 */
    /* tokens-u16: tokens must be < vocab_size; text-bytes: 256; text-docs: the
       tokenizer's piece count */
    uint32_t vocab_size;
    /* text-docs: the SentencePiece model (common/data/spm.h); url NULL otherwise */
    struct cm_data_file tokenizer;
    size_t n_shards;
    struct cm_data_shard *shards; /* owned, n_shards entries, n_shards >= 1 */
};

/* Parses and validates a manifest (pure: bytes in, struct out). On error
 * returns CM_EPARSE (bad JSON, missing field, wrong type, unknown key or
 * format, bad hex), CM_ERANGE (negative or absurd number) or CM_ENOMEM, and
 * writes a message naming the field ("shards[2].sha256: ...") into err
 * (errlen may be 0). *out is set only on success; free it with
 * cm_data_manifest_free. */
int cm_data_manifest_parse(const char *json, size_t len, struct cm_data_manifest **out,
                           char *err, size_t errlen);
/* Same, resolving relative shard URLs (no "scheme://", not starting with
 * '/') against base, a file://, http:// or https:// URL ending in '/'
 * (CM_EINVAL otherwise). Without a base, relative URLs are an error. */
int cm_data_manifest_parse_base(const char *json, size_t len, const char *base,
                                struct cm_data_manifest **out, char *err, size_t errlen);
/* Reads a manifest file (at most 64 MiB) and parses it; relative shard URLs
 * resolve against the file's directory (file://, percent-encoded). */
int cm_data_manifest_load(const char *path, struct cm_data_manifest **out, char *err,
                          size_t errlen);
void cm_data_manifest_free(struct cm_data_manifest *m);
const char *cm_data_format_name(enum cm_data_format f);

/* ---- Pure shard decoders (used by the iterator; exposed for tests/fuzz) -- */

/* An IDX file (big-endian header: 0,0,type,ndim, then ndim u32 dims).
 * Only unsigned-byte data (type 0x08) is accepted. data points into the
 * caller's buffer (borrowed). */
struct cm_data_idx {
    uint32_t ndim;          /* 1..4 */
    uint32_t dims[4];
    uint64_t count;         /* product of dims */
    const uint8_t *data;    /* borrowed */
};
int cm_data_idx_parse(const uint8_t *buf, size_t len, struct cm_data_idx *out);

/* An llm.c token shard: 256 little-endian int32 header (magic 20240520,
 * version 1, token count), then count uint16 tokens; nothing after them.
 * tokens points into the caller's buffer (borrowed, maybe unaligned: read
 * with memcpy or cm_data_tokens_get). */
#define CM_DATA_TOKENS_MAGIC 20240520
#define CM_DATA_TOKENS_HEADER_BYTES (256 * 4)
struct cm_data_tokens {
    uint64_t count;
    const uint8_t *tokens;  /* borrowed, count * 2 bytes, little-endian */
};
int cm_data_tokens_parse(const uint8_t *buf, size_t len, struct cm_data_tokens *out);

/* Decompresses a gzip stream (one or more members) into a new malloc'd
 * buffer of at most max_out bytes (CM_ETOOBIG beyond, CM_EPARSE if corrupt
 * or truncated). *out is owned by the caller (free()). */
int cm_data_gunzip(const uint8_t *in, size_t len, size_t max_out, uint8_t **out,
                   size_t *out_len);

/* text-docs, tokenized: every sentence's ids, the sentences of each document.
 * cm_data_docs_tokenize splits buf into lines ('\n', a trailing '\r' is
 * dropped); a blank line ends a document; every other line must be UTF-8
 * (CM_EPARSE "line N: ..." otherwise) and is one sentence, encoded by enc
 * (cm_spm_encode's contract: CM_ETOOBIG with *n = the ids needed when cap
 * is too small). Empty documents are dropped. */
struct cm_data_docs {
    int32_t *tok;     /* all ids, sentence after sentence */
    size_t ntok;
    size_t *sent;     /* nsent + 1 offsets into tok */
    size_t nsent;
    size_t *doc;      /* ndoc + 1 sentence indexes */
    size_t ndoc;
};
typedef int (*cm_data_encode_fn)(void *ctx, const char *text, size_t len, int32_t *ids,
                                 size_t cap, size_t *n);
int cm_data_docs_tokenize(const uint8_t *buf, size_t len, cm_data_encode_fn enc, void *ctx,
                          struct cm_data_docs *d, char *err, size_t errlen);
void cm_data_docs_free(struct cm_data_docs *d);

/* ALBERT's pretraining examples from tokenized documents (Lan et al. 2020,
 * sentence-order prediction; seed 000 Appendix H): a document's sentences
 * are gathered into chunks of up to T - 3 tokens (10 % of the chunks aim
 * shorter, at a random length), a chunk is split at a random sentence
 * boundary into segments A and B (a one-sentence chunk inside the
 * sentence), the longer segment is trimmed at a random end until the pair
 * fits, and half of the pairs are swapped. Record k of *out (malloc'ed,
 * *n records of T + 1 uint16): [CLS] A [SEP] B [SEP], then pad up to T,
 * then the label (1: swapped, B came before A in the text). Deterministic
 * for (docs, spec, seed). Ids must be < 65536. */
struct cm_data_sop_spec {
    size_t T;                     /* window, >= 8 */
    uint16_t cls, sep, pad;
};
int cm_data_sop_build(const struct cm_data_docs *d, const struct cm_data_sop_spec *sp,
                      uint64_t seed, uint16_t **out, size_t *n);

/* ---- Iterator ---------------------------------------------------------- */

enum cm_data_mode {
    CM_DATA_TRAIN = 0, /* per-seed shard order, shuffle buffer, endless epochs */
    CM_DATA_EVAL = 1,  /* manifest order, no shuffling, one pass, then end */
};

struct cm_data_options {
    enum cm_data_mode mode;
    size_t shuffle_size;       /* S, examples in the shuffle buffer (default 10000) */
    size_t seq_len;            /* T for text/tokens: examples are T+1 tokens (required) */
    uint64_t max_shard_bytes;  /* stored and decoded size limit per shard file (512 MiB) */
    unsigned prefetch_shards;  /* shard buffers held (queued or in use) besides the one
                                  downloading: bounds memory (default 2) */
    long connect_timeout_s;    /* libcurl connect deadline (default 15) */
    long low_speed_bytes;      /* abort a transfer slower than this ... (default 1024 B/s) */
    long low_speed_time_s;     /* ... for this long (default 30 s) */
    long transfer_timeout_s;   /* whole-shard deadline, 0 = none (default 0) */
    unsigned retries;          /* extra attempts for a failed download (default 2) */
    int skip_bad_shards;       /* train mode: skip a rejected shard and go on (default 1);
                                  eval mode always fails on a rejected shard */
    const char *ca_file;       /* https: CA bundle to trust instead of the system's (borrowed) */
    const char *cache_dir;     /* verified shard cache, files named by SHA-256; NULL = none.
                                  Later epochs (and runs) read shards from it, re-hashing
                                  them; shards with chunk hashes are not cached (borrowed) */
};

/* Fills in the defaults above (mode TRAIN, seq_len 0). */
void cm_data_options_init(struct cm_data_options *o);

/* A batch the consumer asks for. Caller-owned buffers sized for `capacity`
 * examples; pointers a format does not use, and optional ones, may be NULL.
 * Layout is row-major:
 *   idx-images:   x is (capacity, rows*cols) float32, y is (capacity) int32
 *   text/tokens:  tokens is (capacity, T+1) int32, and/or tokens_u16 the same in uint16
 *   text-docs:    tokens as text (the sentence pair in the first T, pad at T),
 *                 segments and sop below
 * Optional for every format: ids (capacity) = shard_index << 32 | example
 * index within the shard; epochs (capacity) = epoch the example was drawn in
 * (0-based). */
struct cm_data_batch {
    size_t capacity;
    float *x;
    int32_t *y;
    int32_t *tokens;
    uint16_t *tokens_u16;
    int32_t *segments;         /* text-docs: (capacity, T) 0 for [CLS] A [SEP] and padding,
                                  1 for B [SEP] */
    int32_t *sop;              /* text-docs: (capacity) 1 when A and B were swapped */
    uint64_t *ids;
    uint32_t *epochs;
    size_t n;                  /* out: examples written */
};

struct cm_data_stats {
    uint64_t epoch;             /* epoch of the last example handed out */
    uint64_t examples;          /* examples handed out */
    uint64_t shards_ok;         /* shards verified and used */
    uint64_t shards_rejected;   /* shards refused (hash, size, format, download) */
    uint64_t bytes_downloaded;
    char last_error[256];       /* why the last shard was rejected, "" if none */
    uint64_t cache_hits;        /* shard files read from cache_dir instead of downloaded */
};

/* An iterator has one consumer: next_batch, skip, get_stats and close are
 * called from one thread (the training loop); the download thread inside
 * is the iterator's own business. */
struct cm_data_iter;

/* Opens an iterator over manifest m (borrowed: it must outlive the iterator)
 * and starts the background download thread. Returns at once; the first
 * next_batch blocks until the shuffle buffer holds min(S, available)
 * examples. CM_EINVAL for bad options (seq_len 0 for text), CM_ETOOBIG if a
 * shard's declared size exceeds max_shard_bytes. */
int cm_data_open(const struct cm_data_manifest *m, uint64_t seed,
                 const struct cm_data_options *o, struct cm_data_iter **out);
/* Same, loading the manifest from a file; the iterator owns it. */
int cm_data_open_file(const char *manifest_path, uint64_t seed,
                      const struct cm_data_options *o, struct cm_data_iter **out);

/* Fills up to b->capacity examples (always exactly capacity in train mode).
 * In eval mode, b->n < capacity only at the end of the pass or just before
 * an error (the good examples come first, the error on the next call);
 * b->n == 0 means the pass is over. Errors, when a shard is rejected and
 * cannot be skipped (eval mode, skip_bad_shards 0, or no shard of an epoch
 * yielded an example): CM_ECHECKSUM (size or hash), CM_EPARSE / CM_ERANGE
 * (content), CM_ETIMEOUT / CM_ECONN / CM_EIO / CM_ENOTFOUND (download),
 * CM_EAUTH (TLS certificate), CM_ETOOBIG (gunzip limit); the reason is in
 * stats.last_error. After an error the iterator stays failed. */
int cm_data_next_batch(struct cm_data_iter *it, struct cm_data_batch *b);

/* Draws and discards n examples, exactly as n next_batch calls' worth would
 * (same errors). With the same manifest, seed and options the stream is
 * deterministic, so a trainer resuming from a checkpoint taken after n
 * examples can skip them and continue with the very examples it would have
 * seen. */
int cm_data_skip(struct cm_data_iter *it, uint64_t n);

/* Shape of one example: values per x row (rows*cols) or tokens per window
 * (T+1). */
size_t cm_data_example_width(const struct cm_data_iter *it);
const struct cm_data_manifest *cm_data_iter_manifest(const struct cm_data_iter *it);
void cm_data_get_stats(struct cm_data_iter *it, struct cm_data_stats *st);

/* text-docs: the tokenizer's special ids ([MASK] is -1 when the model has
 * none), known once next_batch has handed out an example (CM_ESTATE
 * before; CM_EINVAL for the other formats). */
struct cm_data_specials {
    int cls, sep, pad, mask;
};
int cm_data_specials(const struct cm_data_iter *it, struct cm_data_specials *out);

/* Stops the thread (aborting a transfer in progress) and frees everything. */
void cm_data_close(struct cm_data_iter *it);

#endif
