/* Checkpoint files: atomic writer, verifying reader (file or buffer), and a
 * streaming verifier for checkpoints that travel over HTTP.
 *
 * The reader has one implementation over a "source" (a buffer or a file
 * descriptor) so that the fuzzed pure parser and the file reader cannot
 * drift apart. Every length is checked against what is left of the file
 * before anything is allocated; the hash is checked last, over the bytes
 * as read. Layout and rationale: docs/checkpoints.md. */
#include "ckpt/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"
#include "ckpt/ckpt_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ckpt.c writes float32 buffers as they are in memory: little-endian hosts only"
#endif

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* Header field offsets (docs/checkpoints.md). */
enum {
    H_MAGIC = 0,
    H_VERSION = 8,
    H_HEADER_SIZE = 12,
    H_TOTAL = 16,
    H_STEP = 24,
    H_NPARAMS = 32,
    H_NOPT = 40,
    H_RNG = 44,
    H_CONFIG = 48,
    H_RESERVED = 52,
};

static int valid_name(const char *name, size_t *len_out)
{
    size_t n = strnlen(name, CM_CKPT_MAX_NAME + 1);
    if (n == 0 || n > CM_CKPT_MAX_NAME)
        return 0;
    *len_out = n;
    return 1;
}

uint64_t cm_ckpt_encoded_size(const struct cm_ckpt *c)
{
    if (!c || c->n_params > CM_CKPT_MAX_FLOATS || (c->n_params && !c->params) ||
        c->n_opt > CM_CKPT_MAX_BUFS || (c->n_opt && !c->opt) || c->rng_len > CM_CKPT_MAX_RNG ||
        (c->rng_len && !c->rng) || c->config_len > CM_CKPT_MAX_CONFIG ||
        (c->config_len && !c->config))
        return 0;
    uint64_t total = CM_CKPT_HEADER_BYTES + (uint64_t)c->config_len + c->rng_len + 4 * c->n_params +
                     CM_CKPT_TRAILER_BYTES;
    for (uint32_t i = 0; i < c->n_opt; i++) {
        size_t nl;
        const struct cm_ckpt_buf *b = &c->opt[i];
        if (!valid_name(b->name, &nl) || b->count > CM_CKPT_MAX_FLOATS || (b->count && !b->data))
            return 0;
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(c->opt[j].name, b->name) == 0)
                return 0;
        total += 4 + nl + 8 + 4 * b->count;
    }
    return total;
}

static void encode_header(const struct cm_ckpt *c, uint64_t total, uint8_t h[CM_CKPT_HEADER_BYTES])
{
    memset(h, 0, CM_CKPT_HEADER_BYTES);
    memcpy(h + H_MAGIC, CM_CKPT_MAGIC, 8);
    put_u32(h + H_VERSION, CM_CKPT_VERSION);
    put_u32(h + H_HEADER_SIZE, CM_CKPT_HEADER_BYTES);
    put_u64(h + H_TOTAL, total);
    put_u64(h + H_STEP, c->step);
    put_u64(h + H_NPARAMS, c->n_params);
    put_u32(h + H_NOPT, c->n_opt);
    put_u32(h + H_RNG, c->rng_len);
    put_u32(h + H_CONFIG, c->config_len);
}

/* ---- Writer ------------------------------------------------------------ */

struct writer {
    int fd;
    struct cm_sha256_ctx body;
    struct cm_sha256_ctx file;
    int err;
};

static void w_raw(struct writer *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (!w->err && n > 0) {
        ssize_t k = write(w->fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            CM_LOGE("ckpt", "checkpoint write: %s", strerror(errno));
            w->err = CM_EIO;
            return;
        }
        b += k;
        n -= (size_t)k;
    }
}

static void w_body(struct writer *w, const void *p, size_t n)
{
    if (w->err || n == 0)
        return;
    if (cm_sha256_update(&w->body, p, n) != CM_OK || cm_sha256_update(&w->file, p, n) != CM_OK) {
        w->err = CM_ECRYPTO;
        return;
    }
    w_raw(w, p, n);
}

int cm_ckpt__fsync_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return CM_ENOMEM;
    const char *dir = dirname(copy);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = CM_OK;
    if (dfd < 0 || fsync(dfd) != 0) {
        CM_LOGE("ckpt", "fsync of directory %s: %s", dir, strerror(errno));
        rc = CM_EIO;
    }
    if (dfd >= 0)
        close(dfd);
    free(copy);
    return rc;
}

int cm_ckpt_write(const char *path, const struct cm_ckpt *c, uint8_t sha256_out[32])
{
    if (!path)
        return CM_EINVAL;
    uint64_t total = cm_ckpt_encoded_size(c);
    if (total == 0) {
        CM_LOGE("ckpt", "checkpoint %s: refusing to write an invalid checkpoint struct", path);
        return CM_EINVAL;
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp)
        return CM_ENOMEM;
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    struct writer w = {.fd = mkostemp(tmp, O_CLOEXEC)};
    /* mkstemp makes 0600; a checkpoint is no secret and other tools read it. */
    if (w.fd >= 0 && fchmod(w.fd, 0644) != 0)
        w.err = CM_EIO;
    if (w.fd < 0) {
        CM_LOGE("ckpt", "checkpoint %s: cannot create temporary file: %s", path, strerror(errno));
        free(tmp);
        return CM_EIO;
    }
    if (cm_sha256_init(&w.body) != CM_OK) {
        w.err = CM_ECRYPTO;
    } else if (cm_sha256_init(&w.file) != CM_OK) {
        cm_sha256_cleanup(&w.body);
        w.err = CM_ECRYPTO;
    }
    int have_ctx = !w.err;

    uint8_t h[CM_CKPT_HEADER_BYTES];
    encode_header(c, total, h);
    w_body(&w, h, sizeof h);
    w_body(&w, c->config, c->config_len);
    w_body(&w, c->rng, c->rng_len);
    w_body(&w, c->params, 4 * c->n_params);
    for (uint32_t i = 0; i < c->n_opt; i++) {
        uint8_t lenb[4], cntb[8];
        size_t nl = strlen(c->opt[i].name);
        put_u32(lenb, (uint32_t)nl);
        put_u64(cntb, c->opt[i].count);
        w_body(&w, lenb, 4);
        w_body(&w, c->opt[i].name, nl);
        w_body(&w, cntb, 8);
        w_body(&w, c->opt[i].data, 4 * c->opt[i].count);
    }
    uint8_t trailer[32], fhash[32];
    if (have_ctx) {
        if (cm_sha256_final(&w.body, trailer) != CM_OK && !w.err)
            w.err = CM_ECRYPTO;
        if (!w.err)
            cm_sha256_update(&w.file, trailer, 32);
        if (cm_sha256_final(&w.file, fhash) != CM_OK && !w.err)
            w.err = CM_ECRYPTO;
    }
    w_raw(&w, trailer, 32);
    if (!w.err && fsync(w.fd) != 0) {
        CM_LOGE("ckpt", "checkpoint %s: fsync: %s", path, strerror(errno));
        w.err = CM_EIO;
    }
    if (close(w.fd) != 0 && !w.err)
        w.err = CM_EIO;
    if (!w.err && rename(tmp, path) != 0) {
        CM_LOGE("ckpt", "checkpoint %s: rename: %s", path, strerror(errno));
        w.err = CM_EIO;
    }
    if (w.err) {
        unlink(tmp);
        free(tmp);
        return w.err;
    }
    free(tmp);
    int rc = cm_ckpt__fsync_dir(path);
    if (rc == CM_OK && sha256_out)
        memcpy(sha256_out, fhash, 32);
    return rc;
}

/* ---- Reader ------------------------------------------------------------ */

struct source {
    const uint8_t *buf; /* buffer source, or NULL for fd */
    int fd;
    uint64_t size; /* whole input */
    uint64_t pos;
    struct cm_sha256_ctx hash;
    const char *what; /* for messages */
};

static int src_read(struct source *s, void *dst, uint64_t n, int hash)
{
    if (n > s->size - s->pos) {
        CM_LOGE("ckpt", "checkpoint %s: truncated at byte %" PRIu64, s->what, s->size);
        return CM_EPARSE;
    }
    if (s->buf) {
        if (n)
            memcpy(dst, s->buf + s->pos, n);
    } else {
        uint8_t *d = dst;
        uint64_t left = n;
        while (left > 0) {
            ssize_t k = pread(s->fd, d, left > (1u << 30) ? (1u << 30) : left,
                              (off_t)(s->pos + (n - left)));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                CM_LOGE("ckpt", "checkpoint %s: read: %s", s->what,
                        k < 0 ? strerror(errno) : "short file");
                return k < 0 ? CM_EIO : CM_EPARSE;
            }
            d += k;
            left -= (uint64_t)k;
        }
    }
    if (hash && n && cm_sha256_update(&s->hash, dst, n) != CM_OK)
        return CM_ECRYPTO;
    s->pos += n;
    return CM_OK;
}

static int parse_header(const uint8_t *h, uint64_t file_size, const char *what)
{
    if (memcmp(h + H_MAGIC, CM_CKPT_MAGIC, 8) != 0) {
        CM_LOGE("ckpt", "checkpoint %s: bad magic (not a Crowdtrain checkpoint)", what);
        return CM_EPARSE;
    }
    uint32_t ver = get_u32(h + H_VERSION);
    if (ver != CM_CKPT_VERSION) {
        CM_LOGE("ckpt", "checkpoint %s: version %u, this build reads %u", what, ver,
                CM_CKPT_VERSION);
        return CM_EVERSION;
    }
    if (get_u32(h + H_HEADER_SIZE) != CM_CKPT_HEADER_BYTES) {
        CM_LOGE("ckpt", "checkpoint %s: header size %u, expected %u", what,
                get_u32(h + H_HEADER_SIZE), CM_CKPT_HEADER_BYTES);
        return CM_EPARSE;
    }
    for (int i = H_RESERVED; i < CM_CKPT_HEADER_BYTES; i++)
        if (h[i]) {
            CM_LOGE("ckpt", "checkpoint %s: reserved header bytes are not zero", what);
            return CM_EPARSE;
        }
    uint64_t total = get_u64(h + H_TOTAL);
    if (file_size != UINT64_MAX && total != file_size) {
        CM_LOGE("ckpt",
                "checkpoint %s: header says %" PRIu64 " bytes, file has %" PRIu64
                " (truncated or trailing data)",
                what, total, file_size);
        return CM_EPARSE;
    }
    if (get_u32(h + H_NOPT) > CM_CKPT_MAX_BUFS || get_u32(h + H_RNG) > CM_CKPT_MAX_RNG ||
        get_u32(h + H_CONFIG) > CM_CKPT_MAX_CONFIG || get_u64(h + H_NPARAMS) > CM_CKPT_MAX_FLOATS) {
        CM_LOGE("ckpt", "checkpoint %s: a header count exceeds the sanity limits", what);
        return CM_ETOOBIG;
    }
    /* The fixed parts must fit in the declared size before anything else. */
    uint64_t minimum = CM_CKPT_HEADER_BYTES + (uint64_t)get_u32(h + H_CONFIG) + get_u32(h + H_RNG) +
                       4 * get_u64(h + H_NPARAMS) + (uint64_t)get_u32(h + H_NOPT) * 13 +
                       CM_CKPT_TRAILER_BYTES;
    if (minimum > total) {
        CM_LOGE("ckpt",
                "checkpoint %s: sections need at least %" PRIu64 " bytes, header says %" PRIu64,
                what, minimum, total);
        return CM_EPARSE;
    }
    return CM_OK;
}

static int read_floats(struct source *s, uint64_t count, float **out)
{
    if (count > (s->size - s->pos) / 4) {
        CM_LOGE("ckpt", "checkpoint %s: buffer of %" PRIu64 " floats runs past the end", s->what,
                count);
        return CM_EPARSE;
    }
    *out = malloc(count ? count * 4 : 1);
    if (!*out)
        return CM_ENOMEM;
    return src_read(s, *out, count * 4, 1);
}

static int parse_source(struct source *s, struct cm_ckpt *out)
{
    memset(out, 0, sizeof *out);
    if (s->size < CM_CKPT_HEADER_BYTES + CM_CKPT_TRAILER_BYTES) {
        CM_LOGE("ckpt", "checkpoint %s: %" PRIu64 " bytes is too short to be a checkpoint", s->what,
                s->size);
        return CM_EPARSE;
    }
    if (cm_sha256_init(&s->hash) != CM_OK)
        return CM_ECRYPTO;
    struct cm_ckpt c = {0};
    uint8_t h[CM_CKPT_HEADER_BYTES];
    int rc = src_read(s, h, sizeof h, 1);
    if (rc == CM_OK)
        rc = parse_header(h, s->size, s->what);
    if (rc != CM_OK)
        goto fail;
    /* Exclude the trailer from what sections may consume. */
    uint64_t full = s->size;
    s->size = full - CM_CKPT_TRAILER_BYTES;
    c.step = get_u64(h + H_STEP);
    c.n_params = get_u64(h + H_NPARAMS);
    c.n_opt = get_u32(h + H_NOPT);
    c.rng_len = get_u32(h + H_RNG);
    c.config_len = get_u32(h + H_CONFIG);
    c.config = malloc((size_t)c.config_len + 1);
    c.rng = malloc(c.rng_len ? c.rng_len : 1);
    c.opt = calloc(c.n_opt ? c.n_opt : 1, sizeof *c.opt);
    if (!c.config || !c.rng || !c.opt) {
        rc = CM_ENOMEM;
        goto fail;
    }
    if ((rc = src_read(s, c.config, c.config_len, 1)) != CM_OK)
        goto fail;
    c.config[c.config_len] = '\0';
    if (memchr(c.config, '\0', c.config_len)) {
        CM_LOGE("ckpt", "checkpoint %s: config contains a NUL byte", s->what);
        rc = CM_EPARSE;
        goto fail;
    }
    if ((rc = src_read(s, c.rng, c.rng_len, 1)) != CM_OK)
        goto fail;
    if ((rc = read_floats(s, c.n_params, &c.params)) != CM_OK)
        goto fail;
    for (uint32_t i = 0; i < c.n_opt; i++) {
        uint8_t b4[4], b8[8];
        if ((rc = src_read(s, b4, 4, 1)) != CM_OK)
            goto fail;
        uint32_t nl = get_u32(b4);
        if (nl == 0 || nl > CM_CKPT_MAX_NAME) {
            CM_LOGE("ckpt", "checkpoint %s: optimizer buffer %u: name length %u not in 1..%d",
                    s->what, i, nl, CM_CKPT_MAX_NAME);
            rc = CM_EPARSE;
            goto fail;
        }
        if ((rc = src_read(s, c.opt[i].name, nl, 1)) != CM_OK)
            goto fail;
        c.opt[i].name[nl] = '\0';
        if (strlen(c.opt[i].name) != nl) {
            CM_LOGE("ckpt", "checkpoint %s: optimizer buffer %u: NUL in name", s->what, i);
            rc = CM_EPARSE;
            goto fail;
        }
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(c.opt[j].name, c.opt[i].name) == 0) {
                CM_LOGE("ckpt", "checkpoint %s: optimizer buffer name \"%s\" appears twice",
                        s->what, c.opt[i].name);
                rc = CM_EPARSE;
                goto fail;
            }
        if ((rc = src_read(s, b8, 8, 1)) != CM_OK)
            goto fail;
        c.opt[i].count = get_u64(b8);
        if (c.opt[i].count > CM_CKPT_MAX_FLOATS) {
            CM_LOGE("ckpt", "checkpoint %s: optimizer buffer \"%s\" too large", s->what,
                    c.opt[i].name);
            rc = CM_ETOOBIG;
            goto fail;
        }
        if ((rc = read_floats(s, c.opt[i].count, &c.opt[i].data)) != CM_OK)
            goto fail;
    }
    if (s->pos != s->size) {
        CM_LOGE("ckpt", "checkpoint %s: %" PRIu64 " unexpected bytes before the trailer", s->what,
                s->size - s->pos);
        rc = CM_EPARSE;
        goto fail;
    }
    s->size = full;
    uint8_t want[32], got[32];
    if ((rc = src_read(s, want, 32, 0)) != CM_OK)
        goto fail;
    rc = cm_sha256_final(&s->hash, got);
    s->hash.md = NULL;
    if (rc != CM_OK)
        goto fail;
    if (!cm_ct_equal(want, got, 32)) {
        CM_LOGE("ckpt", "checkpoint %s: SHA-256 mismatch: the file is corrupt", s->what);
        rc = CM_ECHECKSUM;
        goto fail;
    }
    *out = c;
    return CM_OK;
fail:
    if (s->hash.md)
        cm_sha256_cleanup(&s->hash);
    cm_ckpt_cleanup(&c);
    return rc;
}

int cm_ckpt_parse(const uint8_t *buf, size_t len, struct cm_ckpt *out)
{
    if (!out || (!buf && len))
        return CM_EINVAL;
    struct source s = {
        .buf = buf ? buf : (const uint8_t *)"", .fd = -1, .size = len, .what = "(buffer)"};
    return parse_source(&s, out);
}

int cm_ckpt_read(const char *path, struct cm_ckpt *out)
{
    if (!path || !out)
        return CM_EINVAL;
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) {
        CM_LOGE("ckpt", "checkpoint %s: %s", path, strerror(errno));
        return errno == ENOENT ? CM_ENOTFOUND : CM_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        CM_LOGE("ckpt", "checkpoint %s: not a regular file", path);
        close(fd);
        return CM_EIO;
    }
    struct source s = {.fd = fd, .size = (uint64_t)st.st_size, .what = path};
    int rc = parse_source(&s, out);
    close(fd);
    return rc;
}

void cm_ckpt_cleanup(struct cm_ckpt *c)
{
    if (!c)
        return;
    free(c->params);
    if (c->opt)
        for (uint32_t i = 0; i < c->n_opt; i++)
            free(c->opt[i].data);
    free(c->opt);
    free(c->rng);
    free(c->config);
    memset(c, 0, sizeof *c);
}

const struct cm_ckpt_buf *cm_ckpt_find(const struct cm_ckpt *c, const char *name)
{
    if (!c || !name)
        return NULL;
    for (uint32_t i = 0; i < c->n_opt; i++)
        if (strcmp(c->opt[i].name, name) == 0)
            return &c->opt[i];
    return NULL;
}

/* ---- Streaming verifier ------------------------------------------------- */

static void *hash_new(void)
{
    struct cm_sha256_ctx *h = calloc(1, sizeof *h);
    if (h && cm_sha256_init(h) != CM_OK) {
        free(h);
        h = NULL;
    }
    return h;
}

static void hash_free(void **h)
{
    if (*h) {
        cm_sha256_cleanup(*h);
        free(*h);
        *h = NULL;
    }
}

int cm_ckpt_stream_init(struct cm_ckpt_stream *s, uint64_t max_total)
{
    memset(s, 0, sizeof *s);
    s->max_total = max_total;
    s->sec = CM_CKPT_SEC_HEADER;
    s->body_hash = hash_new();
    s->file_hash = hash_new();
    s->params_hash = hash_new();
    if (!s->body_hash || !s->file_hash || !s->params_hash) {
        cm_ckpt_stream_cleanup(s);
        return CM_ECRYPTO;
    }
    return CM_OK;
}

void cm_ckpt_stream_cleanup(struct cm_ckpt_stream *s)
{
    hash_free(&s->body_hash);
    hash_free(&s->file_hash);
    hash_free(&s->params_hash);
}

/* The current section is complete: enter the next one (skipping empty
 * ones). room = bytes left before the trailer. A section that would run
 * into the trailer is refused here, before its bytes arrive; the checks
 * are those of parse_source, in the same order. */
static int stream_advance(struct cm_ckpt_stream *s, uint64_t room)
{
    const uint8_t *h = s->head;
    for (;;) {
        enum cm_ckpt_section next;
        uint64_t len = 0;
        switch (s->sec) {
        case CM_CKPT_SEC_HEADER:
            next = CM_CKPT_SEC_CONFIG;
            len = get_u32(h + H_CONFIG);
            break;
        case CM_CKPT_SEC_CONFIG:
            next = CM_CKPT_SEC_RNG;
            len = get_u32(h + H_RNG);
            break;
        case CM_CKPT_SEC_RNG:
            next = CM_CKPT_SEC_PARAMS;
            len = 4 * get_u64(h + H_NPARAMS);
            break;
        case CM_CKPT_SEC_PARAMS:
            next = get_u32(h + H_NOPT) ? CM_CKPT_SEC_NAMELEN : CM_CKPT_SEC_DONE;
            len = next == CM_CKPT_SEC_DONE ? 0 : 4;
            break;
        case CM_CKPT_SEC_NAMELEN:
            s->name_len = get_u32(s->field);
            if (s->name_len == 0 || s->name_len > CM_CKPT_MAX_NAME) {
                CM_LOGE("ckpt", "checkpoint stream: optimizer buffer %u: name length %u not in 1..%d",
                        s->opt_i, s->name_len, CM_CKPT_MAX_NAME);
                return CM_EPARSE;
            }
            next = CM_CKPT_SEC_NAME;
            len = s->name_len;
            memset(s->names[s->opt_i], 0, sizeof s->names[0]);
            break;
        case CM_CKPT_SEC_NAME:
            if (strlen(s->names[s->opt_i]) != s->name_len) {
                CM_LOGE("ckpt", "checkpoint stream: optimizer buffer %u: NUL in name", s->opt_i);
                return CM_EPARSE;
            }
            for (uint32_t j = 0; j < s->opt_i; j++)
                if (!strcmp(s->names[j], s->names[s->opt_i])) {
                    CM_LOGE("ckpt", "checkpoint stream: optimizer buffer name \"%s\" appears twice",
                            s->names[j]);
                    return CM_EPARSE;
                }
            next = CM_CKPT_SEC_COUNT;
            len = 8;
            break;
        case CM_CKPT_SEC_COUNT:
            len = get_u64(s->field);
            if (len > CM_CKPT_MAX_FLOATS) {
                CM_LOGE("ckpt", "checkpoint stream: optimizer buffer \"%s\" too large",
                        s->names[s->opt_i]);
                return CM_ETOOBIG;
            }
            len *= 4;
            next = CM_CKPT_SEC_DATA;
            break;
        case CM_CKPT_SEC_DATA:
            s->opt_i++;
            next = s->opt_i < get_u32(h + H_NOPT) ? CM_CKPT_SEC_NAMELEN : CM_CKPT_SEC_DONE;
            len = next == CM_CKPT_SEC_DONE ? 0 : 4;
            break;
        case CM_CKPT_SEC_DONE:
        default:
            return CM_OK;
        }
        if (len > room) {
            CM_LOGE("ckpt", "checkpoint stream: a section of %" PRIu64 " bytes runs past the "
                            "declared size (%" PRIu64 " bytes left)", len, room);
            return CM_EPARSE;
        }
        s->sec = next;
        s->sec_left = len;
        if (len > 0 || next == CM_CKPT_SEC_DONE)
            return CM_OK;
    }
}

/* Body bytes [pos, pos + n) through the section walk. */
static int stream_walk(struct cm_ckpt_stream *s, const uint8_t *p, size_t n, uint64_t pos)
{
    uint64_t body_end = s->total - CM_CKPT_TRAILER_BYTES;
    while (n > 0) {
        if (s->sec == CM_CKPT_SEC_DONE) {
            CM_LOGE("ckpt", "checkpoint stream: %" PRIu64 " unexpected bytes before the trailer",
                    body_end - pos);
            return CM_EPARSE;
        }
        size_t k = n < s->sec_left ? n : (size_t)s->sec_left;
        /* where in the field the bytes go: fields are 4, 8 or name_len bytes */
        uint64_t width = s->sec == CM_CKPT_SEC_NAMELEN ? 4 : s->sec == CM_CKPT_SEC_COUNT ? 8 : s->name_len;
        uint64_t at = width - s->sec_left;
        switch (s->sec) {
        case CM_CKPT_SEC_CONFIG:
            if (memchr(p, '\0', k)) {
                CM_LOGE("ckpt", "checkpoint stream: config contains a NUL byte");
                return CM_EPARSE;
            }
            break;
        case CM_CKPT_SEC_PARAMS:
            if (cm_sha256_update(s->params_hash, p, k) != CM_OK)
                return CM_ECRYPTO;
            break;
        case CM_CKPT_SEC_NAMELEN:
        case CM_CKPT_SEC_COUNT:
            memcpy(s->field + at, p, k);
            break;
        case CM_CKPT_SEC_NAME:
            memcpy(s->names[s->opt_i] + at, p, k);
            break;
        default:
            break;
        }
        s->sec_left -= k;
        p += k;
        n -= k;
        pos += k;
        if (s->sec_left == 0) {
            int rc = stream_advance(s, body_end - pos);
            if (rc != CM_OK)
                return rc;
        }
    }
    return CM_OK;
}

int cm_ckpt_stream_update(struct cm_ckpt_stream *s, const void *data, size_t len)
{
    if (s->failed || !s->body_hash)
        return CM_ESTATE;
    const uint8_t *p = data;
    while (len > 0) {
        if (s->received < CM_CKPT_HEADER_BYTES) {
            size_t k = CM_CKPT_HEADER_BYTES - (size_t)s->received;
            if (k > len)
                k = len;
            memcpy(s->head + s->received, p, k);
            if (cm_sha256_update(s->body_hash, p, k) != CM_OK ||
                cm_sha256_update(s->file_hash, p, k) != CM_OK)
                return s->failed = 1, CM_ECRYPTO;
            s->received += k;
            p += k;
            len -= k;
            if (s->received == CM_CKPT_HEADER_BYTES) {
                int rc = parse_header(s->head, UINT64_MAX, "(stream)");
                uint64_t total = get_u64(s->head + H_TOTAL);
                if (rc == CM_OK && total > s->max_total) {
                    CM_LOGE("ckpt",
                            "checkpoint stream: declared size %" PRIu64 " exceeds limit %" PRIu64,
                            total, s->max_total);
                    rc = CM_ETOOBIG;
                }
                if (rc != CM_OK)
                    return s->failed = 1, rc;
                s->total = total;
                rc = stream_advance(s, total - CM_CKPT_HEADER_BYTES - CM_CKPT_TRAILER_BYTES);
                if (rc != CM_OK)
                    return s->failed = 1, rc;
            }
            continue;
        }
        if (len > s->total - s->received) {
            CM_LOGE("ckpt", "checkpoint stream: more bytes than the declared %" PRIu64, s->total);
            return s->failed = 1, CM_ETOOBIG;
        }
        uint64_t body_end = s->total - CM_CKPT_TRAILER_BYTES;
        size_t k = len;
        if (s->received < body_end) {
            if (k > body_end - s->received)
                k = (size_t)(body_end - s->received);
            if (cm_sha256_update(s->body_hash, p, k) != CM_OK)
                return s->failed = 1, CM_ECRYPTO;
            int rc = stream_walk(s, p, k, s->received);
            if (rc != CM_OK)
                return s->failed = 1, rc;
        } else {
            memcpy(s->tail + (s->received - body_end), p, k);
        }
        if (cm_sha256_update(s->file_hash, p, k) != CM_OK)
            return s->failed = 1, CM_ECRYPTO;
        s->received += k;
        p += k;
        len -= k;
    }
    return CM_OK;
}

int cm_ckpt_stream_header(const struct cm_ckpt_stream *s, uint64_t *step, uint64_t *total)
{
    if (s->failed || s->total == 0)
        return 0;
    if (step)
        *step = get_u64(s->head + H_STEP);
    if (total)
        *total = s->total;
    return 1;
}

int cm_ckpt_stream_final(struct cm_ckpt_stream *s, struct cm_ckpt_stream_info *info)
{
    int rc = CM_OK;
    if (s->failed || !s->body_hash) {
        rc = CM_ESTATE;
    } else if (s->total == 0 || s->received != s->total) {
        CM_LOGE("ckpt", "checkpoint stream: got %" PRIu64 " of %" PRIu64 " bytes", s->received,
                s->total);
        rc = CM_EPARSE;
    } else if (s->sec != CM_CKPT_SEC_DONE) { /* stream_advance makes this unreachable */
        CM_LOGE("ckpt", "checkpoint stream: the sections end after the declared size");
        rc = CM_EPARSE;
    } else {
        uint8_t body[32], file[32], params[32];
        int r1 = cm_sha256_final(s->body_hash, body);
        int r2 = cm_sha256_final(s->file_hash, file);
        int r3 = cm_sha256_final(s->params_hash, params);
        free(s->body_hash);
        free(s->file_hash);
        free(s->params_hash);
        s->body_hash = s->file_hash = s->params_hash = NULL;
        if (r1 != CM_OK || r2 != CM_OK || r3 != CM_OK) {
            rc = CM_ECRYPTO;
        } else if (!cm_ct_equal(body, s->tail, 32)) {
            CM_LOGE("ckpt", "checkpoint stream: SHA-256 mismatch");
            rc = CM_ECHECKSUM;
        } else if (info) {
            memcpy(info->file_sha256, file, 32);
            memcpy(info->params_sha256, params, 32);
            info->step = get_u64(s->head + H_STEP);
            info->n_params = get_u64(s->head + H_NPARAMS);
        }
    }
    cm_ckpt_stream_cleanup(s);
    return rc;
}

int cm_ckpt_file_sha256(const char *path, uint8_t out[32], uint64_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) {
        CM_LOGE("ckpt", "%s: %s", path, strerror(errno));
        return errno == ENOENT ? CM_ENOTFOUND : CM_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        CM_LOGE("ckpt", "%s: not a regular file", path);
        close(fd);
        return CM_EIO;
    }
    struct cm_sha256_ctx h;
    if (cm_sha256_init(&h) != CM_OK) {
        close(fd);
        return CM_ECRYPTO;
    }
    static const size_t bufsz = 1 << 20;
    uint8_t *buf = malloc(bufsz);
    uint64_t n = 0;
    int rc = buf ? CM_OK : CM_ENOMEM;
    while (rc == CM_OK) {
        ssize_t k = read(fd, buf, bufsz);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            CM_LOGE("ckpt", "%s: read: %s", path, strerror(errno));
            rc = CM_EIO;
        } else if (k == 0) {
            break;
        } else if (cm_sha256_update(&h, buf, (size_t)k) != CM_OK) {
            rc = CM_ECRYPTO;
        }
        n += (uint64_t)(k > 0 ? k : 0);
    }
    free(buf);
    close(fd);
    if (rc != CM_OK) {
        cm_sha256_cleanup(&h);
        return rc;
    }
    if (size)
        *size = n;
    return cm_sha256_final(&h, out);
}
