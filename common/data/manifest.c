/* Dataset manifests: the JSON that lists a dataset's shards (schema in
 * docs/data.md).
 *
 * The parser is a pure function from bytes to a struct, written to be
 * fuzzed: duplicate keys, unknown keys, wrong types, unknown formats,
 * negative or absurd numbers and malformed hashes are all errors, and the
 * message names the field ("shards[3].labels.sha256: ..."), so whoever wrote
 * the manifest can fix it. Unknown keys are refused rather than ignored
 * because a misspelt optional field ("compresion") would otherwise silently
 * change how a shard is read. */
#include "data/data.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"

const char *cm_data_format_name(enum cm_data_format f)
{
    switch (f) {
    case CM_DATA_IDX_IMAGES: return "idx-images";
    case CM_DATA_TEXT_BYTES: return "text-bytes";
    case CM_DATA_TEXT_DOCS: return "text-docs";
    case CM_DATA_TOKENS_U16: return "tokens-u16";
    }
    return "?";
}

struct perr {
    char *buf;
    size_t len;
};

static int fail(struct perr *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct perr *e, int code, const char *fmt, ...)
{
    if (e->buf && e->len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->buf, e->len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Refuses keys of obj that are not in allowed (NULL-terminated). */
static int check_keys(json_t *obj, const char *const *allowed, const char *where, struct perr *e)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, k) == 0)
                ok = 1;
        if (!ok)
            return fail(e, CM_EPARSE, "%s%s%.64s: unknown field", where, *where ? "." : "", k);
    }
    return CM_OK;
}

static int get_uint(json_t *obj, const char *key, const char *where, int required, uint64_t lo,
                    uint64_t hi, uint64_t *out, struct perr *e)
{
    json_t *v = json_object_get(obj, key);
    const char *dot = *where ? "." : "";
    if (!v) {
        if (required)
            return fail(e, CM_EPARSE, "%s%s%s: missing", where, dot, key);
        return CM_OK;
    }
    if (!json_is_integer(v))
        return fail(e, CM_EPARSE, "%s%s%s: must be an integer", where, dot, key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || (uint64_t)x < lo || (uint64_t)x > hi)
        return fail(e, CM_ERANGE, "%s%s%s: %lld is outside %llu..%llu", where, dot, key,
                    (long long)x, (unsigned long long)lo, (unsigned long long)hi);
    *out = (uint64_t)x;
    return CM_OK;
}

static int get_real(json_t *obj, const char *key, const char *where, double lo, double hi,
                    float *out, struct perr *e)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return CM_OK;
    if (!json_is_number(v))
        return fail(e, CM_EPARSE, "%s.%s: must be a number", where, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return fail(e, CM_ERANGE, "%s.%s: %g is outside %g..%g", where, key, x, lo, hi);
    *out = (float)x;
    return CM_OK;
}

/* Optional per-chunk hashes: "chunk_size" and "chunk_sha256" together. */
static int parse_chunks(json_t *o, const char *where, struct cm_data_file *f, struct perr *e)
{
    json_t *cs = json_object_get(o, "chunk_size"), *ch = json_object_get(o, "chunk_sha256");
    if (!cs && !ch)
        return CM_OK;
    if (!cs || !ch)
        return fail(e, CM_EPARSE, "%s: chunk_size and chunk_sha256 go together", where);
    uint64_t size = 0;
    int rc = get_uint(o, "chunk_size", where, 1, 1024, 1u << 30, &size, e);
    if (rc)
        return rc;
    if (f->compression != CM_DATA_COMP_NONE)
        return fail(e, CM_EPARSE, "%s.chunk_size: chunk hashes need \"compression\": \"none\"",
                    where);
    uint64_t n = (f->size + size - 1) / size;
    if (!json_is_array(ch))
        return fail(e, CM_EPARSE, "%s.chunk_sha256: must be an array", where);
    if (n > CM_DATA_MAX_CHUNKS || json_array_size(ch) != n)
        return fail(e, CM_EPARSE,
                    "%s.chunk_sha256: needs %llu hashes (size / chunk_size, "
                    "rounded up, at most %u), has %zu",
                    where, (unsigned long long)n, CM_DATA_MAX_CHUNKS, json_array_size(ch));
    f->chunk_sha256 = malloc(n * sizeof *f->chunk_sha256);
    if (!f->chunk_sha256)
        return fail(e, CM_ENOMEM, "out of memory");
    f->chunk_size = (uint32_t)size;
    f->n_chunks = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_t *h = json_array_get(ch, i);
        size_t got = 0;
        if (!json_is_string(h) || json_string_length(h) != 64 ||
            cm_hex_decode(json_string_value(h), 64, f->chunk_sha256[i], 32, &got) != CM_OK ||
            got != 32)
            return fail(e, CM_EPARSE, "%s.chunk_sha256[%zu]: must be 64 hexadecimal characters",
                        where, i);
    }
    return CM_OK;
}

static int valid_url_chars(const char *u, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)u[i] <= 0x20 || u[i] == 0x7f)
            return 0;
    return 1;
}

static int has_scheme(const char *u)
{
    return strncmp(u, "file://", 7) == 0 || strncmp(u, "http://", 7) == 0 ||
           strncmp(u, "https://", 8) == 0;
}

static int parse_file(json_t *o, const char *where, const char *base, struct cm_data_file *f,
                      struct perr *e)
{
    static const char *const keys[] = {"url",         "size",         "sha256",
                                       "compression", "examples",     "labels",
                                       "chunk_size",  "chunk_sha256", NULL};
    if (!json_is_object(o))
        return fail(e, CM_EPARSE, "%s: must be an object", where);
    int rc = check_keys(o, keys, where, e);
    if (rc)
        return rc;
    json_t *url = json_object_get(o, "url");
    if (!url)
        return fail(e, CM_EPARSE, "%s.url: missing", where);
    if (!json_is_string(url))
        return fail(e, CM_EPARSE, "%s.url: must be a string", where);
    const char *u = json_string_value(url);
    size_t ul = json_string_length(url);
    if (ul == 0 || ul > CM_DATA_MAX_URL || strlen(u) != ul)
        return fail(e, CM_EPARSE, "%s.url: empty, longer than %d bytes or contains NUL", where,
                    CM_DATA_MAX_URL);
    if (!valid_url_chars(u, ul))
        return fail(e, CM_EPARSE, "%s.url: contains a space or control character", where);
    char *joined = NULL;
    if (!strstr(u, "://")) {
        /* A relative URL: resolved against the manifest's own location. */
        if (!base)
            return fail(e, CM_EPARSE,
                        "%s.url: relative URL, but the manifest has no base "
                        "(load it from a file, or give a base URL)",
                        where);
        if (u[0] == '/')
            return fail(e, CM_EPARSE, "%s.url: a relative URL must not start with '/'", where);
        size_t bl = strlen(base);
        if (bl + ul > CM_DATA_MAX_URL)
            return fail(e, CM_EPARSE, "%s.url: longer than %d bytes once resolved", where,
                        CM_DATA_MAX_URL);
        joined = malloc(bl + ul + 1);
        if (!joined)
            return fail(e, CM_ENOMEM, "out of memory");
        memcpy(joined, base, bl);
        memcpy(joined + bl, u, ul + 1);
        u = joined;
    } else if (!has_scheme(u)) {
        return fail(e, CM_EPARSE, "%s.url: scheme must be file://, http:// or https://", where);
    }
    f->url = joined;
    if ((rc = get_uint(o, "size", where, 1, 1, CM_DATA_MAX_SHARD_SIZE, &f->size, e)))
        return rc;
    json_t *h = json_object_get(o, "sha256");
    if (!h)
        return fail(e, CM_EPARSE, "%s.sha256: missing", where);
    size_t got = 0;
    if (!json_is_string(h) || json_string_length(h) != 64 ||
        cm_hex_decode(json_string_value(h), 64, f->sha256, 32, &got) != CM_OK || got != 32)
        return fail(e, CM_EPARSE, "%s.sha256: must be 64 hexadecimal characters", where);
    json_t *c = json_object_get(o, "compression");
    f->compression = CM_DATA_COMP_NONE;
    if (c) {
        if (!json_is_string(c))
            return fail(e, CM_EPARSE, "%s.compression: must be a string", where);
        if (strcmp(json_string_value(c), "gzip") == 0)
            f->compression = CM_DATA_COMP_GZIP;
        else if (strcmp(json_string_value(c), "none") != 0)
            return fail(e, CM_EPARSE, "%s.compression: \"%.32s\" is not \"none\" or \"gzip\"",
                        where, json_string_value(c));
    }
    if ((rc = parse_chunks(o, where, f, e)))
        return rc;
    if (!f->url)
        f->url = strdup(u);
    return f->url ? CM_OK : fail(e, CM_ENOMEM, "out of memory");
}

static int parse_image(json_t *root, struct cm_data_manifest *m, struct perr *e)
{
    static const char *const keys[] = {"rows", "cols", "classes", "mean", "std", NULL};
    json_t *img = json_object_get(root, "image");
    if (!img)
        return fail(e, CM_EPARSE, "image: missing (required for idx-images)");
    if (!json_is_object(img))
        return fail(e, CM_EPARSE, "image: must be an object");
    int rc = check_keys(img, keys, "image", e);
    uint64_t rows = 0, cols = 0, classes = 0;
    if (rc || (rc = get_uint(img, "rows", "image", 1, 1, 65535, &rows, e)) ||
        (rc = get_uint(img, "cols", "image", 1, 1, 65535, &cols, e)) ||
        (rc = get_uint(img, "classes", "image", 1, 1, 256, &classes, e)))
        return rc;
    if (rows * cols > CM_DATA_MAX_IMAGE_PIXELS)
        return fail(e, CM_ERANGE, "image: %llu x %llu pixels exceeds %u", (unsigned long long)rows,
                    (unsigned long long)cols, CM_DATA_MAX_IMAGE_PIXELS);
    m->rows = (uint32_t)rows;
    m->cols = (uint32_t)cols;
    m->classes = (uint32_t)classes;
    m->mean = 0.0f;
    m->std = 1.0f;
    if ((rc = get_real(img, "mean", "image", -1e6, 1e6, &m->mean, e)) ||
        (rc = get_real(img, "std", "image", 1e-6, 1e6, &m->std, e)))
        return rc;
    return CM_OK;
}

int cm_data_manifest_parse(const char *json, size_t len, struct cm_data_manifest **out, char *err,
                           size_t errlen)
{
    return cm_data_manifest_parse_base(json, len, NULL, out, err, errlen);
}

int cm_data_manifest_parse_base(const char *json, size_t len, const char *base,
                                struct cm_data_manifest **out, char *err, size_t errlen)
{
    struct perr e = {err, errlen};
    if (err && errlen)
        err[0] = '\0';
    if (!out || (!json && len))
        return fail(&e, CM_EINVAL, "invalid arguments");
    *out = NULL;
    if (base && (!has_scheme(base) || strlen(base) > CM_DATA_MAX_URL ||
                 !valid_url_chars(base, strlen(base)) || base[strlen(base) - 1] != '/'))
        return fail(&e, CM_EINVAL,
                    "base URL must be file://, http:// or https://, end with '/' "
                    "and hold no spaces");
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fail(&e, CM_EPARSE, "not valid JSON (line %d, column %d): %s", jerr.line,
                    jerr.column, jerr.text);
    struct cm_data_manifest *m = calloc(1, sizeof *m);
    int rc = CM_OK;
    if (!m) {
        rc = fail(&e, CM_ENOMEM, "out of memory");
        goto done;
    }
    if (!json_is_object(root)) {
        rc = fail(&e, CM_EPARSE, "manifest: must be a JSON object");
        goto done;
    }
    static const char *const keys[] = {"name",       "description", "format",    "image",
                                       "vocab_size", "shards",      "tokenizer", NULL};
    if ((rc = check_keys(root, keys, "", &e)))
        goto done;
    json_t *name = json_object_get(root, "name");
    if (!name) {
        rc = fail(&e, CM_EPARSE, "name: missing");
        goto done;
    }
    if (!json_is_string(name) || json_string_length(name) == 0 ||
        json_string_length(name) > CM_DATA_MAX_NAME ||
        strlen(json_string_value(name)) != json_string_length(name)) {
        rc = fail(&e, CM_EPARSE, "name: must be a non-empty string of at most %d bytes",
                  CM_DATA_MAX_NAME);
        goto done;
    }
    json_t *desc = json_object_get(root, "description");
    if (desc && !json_is_string(desc)) {
        rc = fail(&e, CM_EPARSE, "description: must be a string");
        goto done;
    }
    json_t *fmt = json_object_get(root, "format");
    if (!fmt) {
        rc = fail(&e, CM_EPARSE, "format: missing");
        goto done;
    }
    if (!json_is_string(fmt)) {
        rc = fail(&e, CM_EPARSE, "format: must be a string");
        goto done;
    }
    const char *fs = json_string_value(fmt);
    if (strcmp(fs, "idx-images") == 0)
        m->format = CM_DATA_IDX_IMAGES;
    else if (strcmp(fs, "text-bytes") == 0)
        m->format = CM_DATA_TEXT_BYTES;
    else if (strcmp(fs, "tokens-u16") == 0)
        m->format = CM_DATA_TOKENS_U16;
    else if (strcmp(fs, "text-docs") == 0)
        m->format = CM_DATA_TEXT_DOCS;
    else {
        rc = fail(&e, CM_EPARSE,
                  "format: \"%.32s\" is not one of idx-images, text-bytes, tokens-u16, text-docs",
                  fs);
        goto done;
    }
    if (m->format == CM_DATA_IDX_IMAGES) {
        if ((rc = parse_image(root, m, &e)))
            goto done;
    } else if (json_object_get(root, "image")) {
        rc = fail(&e, CM_EPARSE, "image: only allowed for idx-images");
        goto done;
    }
    json_t *tokz = json_object_get(root, "tokenizer");
    if (m->format == CM_DATA_TEXT_DOCS) {
        if (!tokz) {
            rc = fail(&e, CM_EPARSE, "tokenizer: missing (text-docs names its SentencePiece model)");
            goto done;
        }
        if (json_is_object(tokz) &&
            (json_object_get(tokz, "labels") || json_object_get(tokz, "examples") ||
             json_object_get(tokz, "chunk_size") || json_object_get(tokz, "chunk_sha256"))) {
            rc = fail(&e, CM_EPARSE, "tokenizer: only url, size, sha256, compression allowed");
            goto done;
        }
        if ((rc = parse_file(tokz, "tokenizer", base, &m->tokenizer, &e)))
            goto done;
    } else if (tokz) {
        rc = fail(&e, CM_EPARSE, "tokenizer: only allowed for text-docs");
        goto done;
    }
    uint64_t vocab = 0;
    if (m->format == CM_DATA_TOKENS_U16 || m->format == CM_DATA_TEXT_DOCS) {
        if ((rc = get_uint(root, "vocab_size", "", 1, 1, 65536, &vocab, &e)))
            goto done;
    } else if (m->format == CM_DATA_TEXT_BYTES) {
        vocab = 256;
        if ((rc = get_uint(root, "vocab_size", "", 0, 256, 256, &vocab, &e)))
            goto done;
    } else if (json_object_get(root, "vocab_size")) {
        rc = fail(&e, CM_EPARSE, "vocab_size: not allowed for idx-images");
        goto done;
    }
    m->vocab_size = (uint32_t)vocab;

    json_t *shards = json_object_get(root, "shards");
    if (!shards) {
        rc = fail(&e, CM_EPARSE, "shards: missing");
        goto done;
    }
    if (!json_is_array(shards)) {
        rc = fail(&e, CM_EPARSE, "shards: must be an array");
        goto done;
    }
    size_t n = json_array_size(shards);
    if (n == 0 || n > CM_DATA_MAX_SHARDS) {
        rc = fail(&e, CM_ERANGE, "shards: must hold 1..%d entries, has %zu", CM_DATA_MAX_SHARDS, n);
        goto done;
    }
    m->shards = calloc(n, sizeof *m->shards);
    if (!m->shards) {
        rc = fail(&e, CM_ENOMEM, "out of memory");
        goto done;
    }
    m->n_shards = n;
    for (size_t i = 0; i < n; i++) {
        char where[48];
        snprintf(where, sizeof where, "shards[%zu]", i);
        json_t *s = json_array_get(shards, i);
        struct cm_data_shard *sh = &m->shards[i];
        if ((rc = parse_file(s, where, base, &sh->data, &e)))
            goto done;
        if ((rc = get_uint(s, "examples", where, 0, 1, UINT32_MAX, &sh->examples, &e)))
            goto done;
        if (sh->examples && m->format != CM_DATA_IDX_IMAGES) {
            rc = fail(&e, CM_EPARSE,
                      "%s.examples: only allowed for idx-images (text windows "
                      "depend on the consumer's sequence length)",
                      where);
            goto done;
        }
        if (sh->data.chunk_size && m->format == CM_DATA_TEXT_DOCS) {
            rc = fail(&e, CM_EPARSE,
                      "%s.chunk_size: a text-docs shard is tokenized whole (no chunk hashes)",
                      where);
            goto done;
        }
        if (sh->data.chunk_size && m->format == CM_DATA_IDX_IMAGES) {
            rc = fail(&e, CM_EPARSE,
                      "%s.chunk_size: chunk hashes are for text-bytes and "
                      "tokens-u16 (idx images need their labels file)",
                      where);
            goto done;
        }
        json_t *lab = json_object_get(s, "labels");
        if (m->format == CM_DATA_IDX_IMAGES) {
            char lw[64];
            snprintf(lw, sizeof lw, "%s.labels", where);
            if (!lab) {
                rc = fail(&e, CM_EPARSE, "%s: missing (idx-images pairs images with labels)", lw);
                goto done;
            }
            if (json_is_object(lab) &&
                (json_object_get(lab, "labels") || json_object_get(lab, "examples") ||
                 json_object_get(lab, "chunk_size") || json_object_get(lab, "chunk_sha256"))) {
                rc = fail(&e, CM_EPARSE, "%s: only url, size, sha256, compression allowed", lw);
                goto done;
            }
            if ((rc = parse_file(lab, lw, base, &sh->labels, &e)))
                goto done;
        } else if (lab) {
            rc = fail(&e, CM_EPARSE, "%s.labels: only allowed for idx-images", where);
            goto done;
        }
    }
    m->name = strdup(json_string_value(name));
    if (!m->name)
        rc = fail(&e, CM_ENOMEM, "out of memory");
done:
    json_decref(root);
    if (rc != CM_OK) {
        cm_data_manifest_free(m);
        return rc;
    }
    *out = m;
    return CM_OK;
}

int cm_data_manifest_load(const char *path, struct cm_data_manifest **out, char *err, size_t errlen)
{
    struct perr e = {err, errlen};
    if (!path || !out)
        return fail(&e, CM_EINVAL, "invalid arguments");
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return fail(&e, errno == ENOENT ? CM_ENOTFOUND : CM_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) {
        fclose(fp);
        return fail(&e, CM_ETOOBIG, "%s: not a regular file of at most 64 MiB", path);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n ? n : 1);
    if (!buf) {
        fclose(fp);
        return fail(&e, CM_ENOMEM, "out of memory");
    }
    size_t got = fread(buf, 1, n, fp);
    fclose(fp);
    if (got != n) {
        free(buf);
        return fail(&e, CM_EIO, "%s: short read", path);
    }
    /* Relative shard URLs resolve against the manifest's directory,
     * percent-encoded so that any path makes a valid file:// URL. */
    char *real = realpath(path, NULL);
    char *base = real ? malloc(7 + 3 * strlen(real) + 2) : NULL;
    if (!base) {
        free(real);
        free(buf);
        return fail(&e, CM_ENOMEM, "%s: cannot resolve its directory", path);
    }
    char *slash = strrchr(real, '/');
    slash[1] = '\0';
    char *w = base + sprintf(base, "file://");
    for (const unsigned char *c = (const unsigned char *)real; *c; c++) {
        if ((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') ||
            strchr("/-._~", *c))
            *w++ = (char)*c;
        else
            w += sprintf(w, "%%%02X", *c);
    }
    *w = '\0';
    free(real);
    char inner[256] = "";
    int rc = strlen(base) <= CM_DATA_MAX_URL
                 ? cm_data_manifest_parse_base(buf, n, base, out, inner, sizeof inner)
                 : cm_data_manifest_parse(buf, n, out, inner, sizeof inner);
    free(base);
    free(buf);
    if (rc != CM_OK)
        return fail(&e, rc, "%s: %s", path, inner);
    return CM_OK;
}

static void file_free(struct cm_data_file *f)
{
    free(f->url);
    f->url = NULL;
    free(f->chunk_sha256);
    f->chunk_sha256 = NULL;
}

void cm_data_manifest_free(struct cm_data_manifest *m)
{
    if (!m)
        return;
    file_free(&m->tokenizer);
    if (m->shards)
        for (size_t i = 0; i < m->n_shards; i++) {
            file_free(&m->shards[i].data);
            file_free(&m->shards[i].labels);
        }
    free(m->shards);
    free(m->name);
    free(m);
}
