/* safetensors writer and strict reader (format: safetensors.h).
 *
 * The reader treats the file as hostile: the header length is bounded
 * before it is used, the JSON is parsed with duplicate keys rejected, every
 * tensor's byte count must equal its shape times its dtype size (checked
 * without overflow), and the tensors must tile the data buffer exactly, as
 * the reference implementation requires. Exported files put tensors in the
 * order given and pad the header with spaces to a multiple of 8 bytes so
 * the data is aligned, like the reference writer. */
#include "ckpt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"
#include "cm_err.h"
#include "cm_log.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {
    [CM_ST_BOOL] = {"BOOL", 1}, [CM_ST_U8] = {"U8", 1},   [CM_ST_I8] = {"I8", 1},
    [CM_ST_I16] = {"I16", 2},   [CM_ST_U16] = {"U16", 2}, [CM_ST_F16] = {"F16", 2},
    [CM_ST_BF16] = {"BF16", 2}, [CM_ST_I32] = {"I32", 4}, [CM_ST_U32] = {"U32", 4},
    [CM_ST_F32] = {"F32", 4},   [CM_ST_F64] = {"F64", 8}, [CM_ST_I64] = {"I64", 8},
    [CM_ST_U64] = {"U64", 8},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *cm_st_dtype_name(enum cm_st_dtype d)
{
    return (unsigned)d < N_DTYPES ? dtypes[d].name : "?";
}

size_t cm_st_dtype_size(enum cm_st_dtype d)
{
    return (unsigned)d < N_DTYPES ? dtypes[d].size : 0;
}

/* ---- Writer ------------------------------------------------------------ */

static int write_all(int fd, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = write(fd, b, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            CM_LOGE("safetensors", "write: %s", strerror(errno));
            return CM_EIO;
        }
        b += k;
        n -= (uint64_t)k;
    }
    return CM_OK;
}

int cm_st_write(const char *path, const struct cm_st_export *t, size_t n,
                const char *const *meta_kv, size_t n_meta)
{
    if (!path || (n && !t) || (n_meta && !meta_kv) || n > CM_ST_MAX_TENSORS)
        return CM_EINVAL;
    json_t *root = json_object();
    if (!root)
        return CM_ENOMEM;
    int rc = CM_OK;
    uint64_t offset = 0;
    if (n_meta) {
        json_t *meta = json_object();
        if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) {
            json_decref(root);
            return CM_ENOMEM;
        }
        for (size_t i = 0; i < n_meta; i++) {
            if (!meta_kv[2 * i] || !meta_kv[2 * i + 1] ||
                json_object_set_new(meta, meta_kv[2 * i], json_string(meta_kv[2 * i + 1])) != 0) {
                CM_LOGE("safetensors", "%s: bad metadata entry %zu", path, i);
                json_decref(root);
                return CM_EINVAL;
            }
        }
    }
    for (size_t i = 0; i < n && rc == CM_OK; i++) {
        const struct cm_st_export *e = &t[i];
        if (!e->name || !e->name[0] || strlen(e->name) > CM_ST_MAX_NAME ||
            strncmp(e->name, "__", 2) == 0 || json_object_get(root, e->name) ||
            e->ndim > CM_ST_MAX_DIMS || !e->data) {
            CM_LOGE("safetensors",
                    "%s: tensor %zu (%s): empty, reserved or duplicate name, "
                    "too many dimensions or no data",
                    path, i, e->name ? e->name : "(null)");
            rc = CM_EINVAL;
            break;
        }
        json_t *shape = json_array();
        uint64_t numel = 1;
        for (uint32_t d = 0; d < e->ndim; d++) {
            if (e->shape[d] && numel > UINT64_MAX / 4 / e->shape[d]) {
                rc = CM_EINVAL;
                break;
            }
            numel *= e->shape[d];
            json_array_append_new(shape, json_integer((json_int_t)e->shape[d]));
        }
        json_t *offs = json_pack("[II]", (json_int_t)offset, (json_int_t)(offset + 4 * numel));
        json_t *ent =
            json_pack("{s:s, s:o, s:o}", "dtype", "F32", "shape", shape, "data_offsets", offs);
        if (rc != CM_OK || !ent || json_object_set_new(root, e->name, ent) != 0) {
            if (rc == CM_OK)
                rc = CM_ENOMEM;
            break;
        }
        offset += 4 * numel;
    }
    char *hdr = rc == CM_OK ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (rc != CM_OK)
        return rc;
    if (!hdr)
        return CM_ENOMEM;
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(hdr);
        return CM_ENOMEM;
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    /* mkstemp makes 0600; an exported model is meant to be opened by other tools. */
    if (fd >= 0 && fchmod(fd, 0644) != 0) {
        close(fd);
        unlink(tmp);
        fd = -1;
    }
    if (fd < 0) {
        CM_LOGE("safetensors", "%s: cannot create temporary file: %s", path, strerror(errno));
        free(tmp);
        free(hdr);
        return CM_EIO;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    rc = write_all(fd, lenb, 8);
    if (rc == CM_OK)
        rc = write_all(fd, hdr, hlen);
    if (rc == CM_OK && padded > hlen)
        rc = write_all(fd, "       ", padded - hlen);
    free(hdr);
    for (size_t i = 0; i < n && rc == CM_OK; i++) {
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t[i].ndim; d++)
            numel *= t[i].shape[d];
        rc = write_all(fd, t[i].data, 4 * numel);
    }
    if (rc == CM_OK && fsync(fd) != 0)
        rc = CM_EIO;
    if (close(fd) != 0 && rc == CM_OK)
        rc = CM_EIO;
    if (rc == CM_OK && rename(tmp, path) != 0) {
        CM_LOGE("safetensors", "%s: rename: %s", path, strerror(errno));
        rc = CM_EIO;
    }
    if (rc != CM_OK)
        unlink(tmp);
    free(tmp);
    return rc == CM_OK ? cm_ckpt__fsync_dir(path) : rc;
}

/* ---- Reader ------------------------------------------------------------ */

static int cmp_offset(const void *a, const void *b)
{
    const struct cm_st_tensor *x = a, *y = b;
    if (x->data != y->data)
        return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int get_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

#define PFAIL(...)                           \
    do {                                     \
        CM_LOGE("safetensors", __VA_ARGS__); \
        rc = CM_EPARSE;                      \
        goto fail;                           \
    } while (0)

int cm_st_parse(const uint8_t *buf, size_t len, struct cm_st_file *out)
{
    if (!out || (!buf && len))
        return CM_EINVAL;
    memset(out, 0, sizeof *out);
    if (len < 8) {
        CM_LOGE("safetensors", "%zu bytes: too short for the header length", len);
        return CM_EPARSE;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)buf[i] << (8 * i);
    if (hlen > CM_ST_MAX_HEADER) {
        CM_LOGE("safetensors", "header length %" PRIu64 " exceeds %u", hlen, CM_ST_MAX_HEADER);
        return CM_ETOOBIG;
    }
    if (hlen < 2 || hlen > len - 8 || buf[8] != '{') {
        CM_LOGE("safetensors",
                "header length %" PRIu64 " does not fit in %zu bytes or header "
                "is not a JSON object",
                hlen, len);
        return CM_EPARSE;
    }
    const uint8_t *data = buf + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    int rc = CM_OK;
    struct cm_st_file f = {0};
    if (!root || !json_is_object(root)) {
        CM_LOGE("safetensors", "header: %s", root ? "not an object" : jerr.text);
        json_decref(root);
        return CM_EPARSE;
    }
    size_t nkeys = json_object_size(root);
    if (nkeys > CM_ST_MAX_TENSORS + 1) {
        json_decref(root);
        return CM_ETOOBIG;
    }
    f.tensors = calloc(nkeys ? nkeys : 1, sizeof *f.tensors);
    if (!f.tensors) {
        json_decref(root);
        return CM_ENOMEM;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val))
                PFAIL("__metadata__ is not an object");
            size_t nm = json_object_size(val);
            f.meta_kv = calloc(2 * nm + 1, sizeof *f.meta_kv);
            if (!f.meta_kv) {
                rc = CM_ENOMEM;
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv))
                    PFAIL("__metadata__.%s is not a string", mk);
                f.meta_kv[2 * f.n_meta] = strdup(mk);
                f.meta_kv[2 * f.n_meta + 1] = strdup(json_string_value(mv));
                f.n_meta++;
                if (!f.meta_kv[2 * f.n_meta - 2] || !f.meta_kv[2 * f.n_meta - 1]) {
                    rc = CM_ENOMEM;
                    goto fail;
                }
            }
            continue;
        }
        if (strlen(key) == 0 || strlen(key) > CM_ST_MAX_NAME)
            PFAIL("tensor name empty or longer than %d bytes", CM_ST_MAX_NAME);
        if (!json_is_object(val) || json_object_size(val) != 3)
            PFAIL("tensor \"%.64s\": want an object with exactly dtype, shape, data_offsets", key);
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo))
            PFAIL("tensor \"%.64s\": dtype must be a string, shape and data_offsets arrays", key);
        struct cm_st_tensor *t = &f.tensors[f.n];
        size_t di;
        for (di = 0; di < N_DTYPES; di++)
            if (strcmp(json_string_value(jd), dtypes[di].name) == 0)
                break;
        if (di == N_DTYPES)
            PFAIL("tensor \"%.64s\": unknown or unsupported dtype \"%.16s\"", key,
                  json_string_value(jd));
        t->dtype = (enum cm_st_dtype)di;
        if (json_array_size(js) > CM_ST_MAX_DIMS)
            PFAIL("tensor \"%.64s\": more than %d dimensions", key, CM_ST_MAX_DIMS);
        t->ndim = (uint32_t)json_array_size(js);
        uint64_t numel = 1;
        int overflow = 0;
        for (uint32_t d = 0; d < t->ndim; d++) {
            if (!get_u64(json_array_get(js, d), &t->shape[d]))
                PFAIL("tensor \"%.64s\": shape[%u] is not a non-negative integer", key, d);
            if (t->shape[d] && numel > UINT64_MAX / t->shape[d])
                overflow = 1;
            else
                numel *= t->shape[d];
        }
        uint64_t b0, b1;
        if (json_array_size(jo) != 2 || !get_u64(json_array_get(jo, 0), &b0) ||
            !get_u64(json_array_get(jo, 1), &b1) || b0 > b1 || b1 > data_len)
            PFAIL(
                "tensor \"%.64s\": data_offsets must be [begin, end] with begin <= end <= %" PRIu64,
                key, data_len);
        size_t es = dtypes[t->dtype].size;
        if (overflow || numel > UINT64_MAX / es || numel * es != b1 - b0)
            PFAIL("tensor \"%.64s\": %" PRIu64 " bytes do not match its shape and dtype", key,
                  b1 - b0);
        t->numel = numel;
        t->nbytes = b1 - b0;
        t->data = data + b0;
        t->name = strdup(key);
        if (!t->name) {
            rc = CM_ENOMEM;
            goto fail;
        }
        f.n++;
    }
    qsort(f.tensors, f.n, sizeof *f.tensors, cmp_offset);
    const uint8_t *expect = data;
    for (size_t i = 0; i < f.n; i++) {
        if (f.tensors[i].data != expect)
            PFAIL("tensor \"%.64s\": data overlaps another tensor or leaves a hole",
                  f.tensors[i].name);
        expect += f.tensors[i].nbytes;
    }
    if (expect != data + data_len)
        PFAIL("%" PRIu64 " bytes after the last tensor are not indexed",
              (uint64_t)(data + data_len - expect));
    json_decref(root);
    *out = f;
    return CM_OK;
fail:
    json_decref(root);
    cm_st_cleanup(&f);
    return rc;
}

int cm_st_load(const char *path, uint64_t max_bytes, struct cm_st_file *out)
{
    if (!path || !out)
        return CM_EINVAL;
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO must not block us */
    if (fd < 0) {
        CM_LOGE("safetensors", "%s: %s", path, strerror(errno));
        return errno == ENOENT ? CM_ENOTFOUND : CM_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return CM_EIO;
    }
    if ((uint64_t)st.st_size > max_bytes) {
        CM_LOGE("safetensors", "%s: %lld bytes exceeds the limit %" PRIu64, path,
                (long long)st.st_size, max_bytes);
        close(fd);
        return CM_ETOOBIG;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return CM_ENOMEM;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            CM_LOGE("safetensors", "%s: read failed", path);
            free(buf);
            close(fd);
            return CM_EIO;
        }
        got += (size_t)k;
    }
    close(fd);
    int rc = cm_st_parse(buf, n, out);
    if (rc != CM_OK) {
        CM_LOGE("safetensors", "%s: rejected", path);
        free(buf);
        return rc;
    }
    out->owned = buf;
    return CM_OK;
}

void cm_st_cleanup(struct cm_st_file *f)
{
    if (!f)
        return;
    if (f->tensors)
        for (size_t i = 0; i < f->n; i++)
            free(f->tensors[i].name);
    free(f->tensors);
    if (f->meta_kv)
        for (size_t i = 0; i < 2 * f->n_meta; i++)
            free(f->meta_kv[i]);
    free(f->meta_kv);
    free(f->owned);
    memset(f, 0, sizeof *f);
}

const struct cm_st_tensor *cm_st_find(const struct cm_st_file *f, const char *name)
{
    for (size_t i = 0; f && name && i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *cm_st_meta(const struct cm_st_file *f, const char *key)
{
    for (size_t i = 0; f && key && i < f->n_meta; i++)
        if (strcmp(f->meta_kv[2 * i], key) == 0)
            return f->meta_kv[2 * i + 1];
    return NULL;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)man, -24); /* subnormal or zero */
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexpf((float)(man | 0x400), (int)exp - 25);
    return sign ? -v : v;
}

int cm_st_read_f32(const struct cm_st_file *f, const char *name, uint32_t ndim,
                   const uint64_t *shape, float *dst)
{
    const struct cm_st_tensor *t = cm_st_find(f, name);
    if (!t) {
        CM_LOGE("safetensors", "no tensor \"%s\"", name ? name : "(null)");
        return CM_ENOTFOUND;
    }
    if (t->ndim != ndim || (ndim && memcmp(t->shape, shape, ndim * sizeof *shape) != 0)) {
        CM_LOGE("safetensors", "tensor \"%s\": shape differs from the model's", name);
        return CM_EINVAL;
    }
    const uint8_t *p = t->data;
    for (uint64_t i = 0; i < t->numel; i++) {
        switch (t->dtype) {
        case CM_ST_F32: memcpy(&dst[i], p + 4 * i, 4); break;
        case CM_ST_F64: {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
            break;
        }
        case CM_ST_F16: dst[i] = half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8)); break;
        case CM_ST_BF16: {
            uint32_t u = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&dst[i], &u, 4);
            break;
        }
        default:
            CM_LOGE("safetensors", "tensor \"%s\": dtype %s is not a float type", name,
                    cm_st_dtype_name(t->dtype));
            return CM_EUNSUPPORTED;
        }
    }
    return CM_OK;
}
