/* Pure decoders for shard contents: IDX files (Fashion-MNIST), llm.c token
 * shards, and gzip. Each takes the caller's bytes, checks every length
 * against the buffer before using it, and points into the buffer rather
 * than copying, so the iterator decodes a verified shard once and the fuzz
 * targets (tests/fuzz/fuzz_idx.c) exercise exactly this code. */
#include "data/data.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cm_err.h"
#include "cm_log.h"

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int cm_data_idx_parse(const uint8_t *buf, size_t len, struct cm_data_idx *out)
{
    if (!out || (!buf && len))
        return CM_EINVAL;
    memset(out, 0, sizeof *out);
    if (len < 4 || buf[0] != 0 || buf[1] != 0) {
        CM_LOGE("data", "IDX: bad magic");
        return CM_EPARSE;
    }
    if (buf[2] != 0x08) {
        CM_LOGE("data", "IDX: element type 0x%02x, only unsigned bytes (0x08) are supported",
                buf[2]);
        return CM_EUNSUPPORTED;
    }
    uint32_t ndim = buf[3];
    if (ndim < 1 || ndim > 4 || len < 4 + 4 * (size_t)ndim) {
        CM_LOGE("data", "IDX: %u dimensions (1..4 supported) or truncated header", ndim);
        return CM_EPARSE;
    }
    uint64_t count = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        uint32_t d = be32(buf + 4 + 4 * i);
        /* A zero dimension is legal (an empty set); cap the product at the
         * buffer size so it cannot overflow. */
        if (d && count > (uint64_t)len / d) {
            CM_LOGE("data", "IDX: dimensions exceed the data present");
            return CM_EPARSE;
        }
        count *= d;
        out->dims[i] = d;
    }
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (count != len - hdr) {
        CM_LOGE("data", "IDX: header promises %llu bytes of data, %zu present",
                (unsigned long long)count, len - hdr);
        return CM_EPARSE;
    }
    out->ndim = ndim;
    out->count = count;
    out->data = buf + hdr;
    return CM_OK;
}

int cm_data_tokens_parse(const uint8_t *buf, size_t len, struct cm_data_tokens *out)
{
    if (!out || (!buf && len))
        return CM_EINVAL;
    memset(out, 0, sizeof *out);
    if (len < CM_DATA_TOKENS_HEADER_BYTES) {
        CM_LOGE("data", "token shard: %zu bytes is shorter than the 1024-byte header", len);
        return CM_EPARSE;
    }
    if (le32(buf) != CM_DATA_TOKENS_MAGIC) {
        CM_LOGE("data", "token shard: bad magic %u (want %u)", le32(buf), CM_DATA_TOKENS_MAGIC);
        return CM_EPARSE;
    }
    if (le32(buf + 4) != 1) {
        CM_LOGE("data", "token shard: version %u; only version 1 (uint16 tokens) is supported",
                le32(buf + 4));
        return CM_EVERSION;
    }
    uint64_t n = le32(buf + 8);
    if (n != (len - CM_DATA_TOKENS_HEADER_BYTES) / 2 || (len - CM_DATA_TOKENS_HEADER_BYTES) % 2) {
        CM_LOGE("data", "token shard: header says %llu tokens, %zu bytes of tokens present",
                (unsigned long long)n, len - CM_DATA_TOKENS_HEADER_BYTES);
        return CM_EPARSE;
    }
    out->count = n;
    out->tokens = buf + CM_DATA_TOKENS_HEADER_BYTES;
    return CM_OK;
}

int cm_data_gunzip(const uint8_t *in, size_t len, size_t max_out, uint8_t **out, size_t *out_len)
{
    if (!out || !out_len || (!in && len))
        return CM_EINVAL;
    *out = NULL;
    *out_len = 0;
    if (len < 18 || in[0] != 0x1f || in[1] != 0x8b) {
        CM_LOGE("data", "gzip: not a gzip stream");
        return CM_EPARSE;
    }
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return CM_ENOMEM;
    /* Room for one byte past the limit tells "exactly max_out" from "more". */
    size_t limit = max_out < SIZE_MAX ? max_out + 1 : max_out;
    size_t cap = len < 32768 ? 65536 : len * 2;
    if (cap > limit)
        cap = limit;
    uint8_t *buf = malloc(cap);
    size_t used = 0;
    int rc = buf ? CM_OK : CM_ENOMEM;
    z.next_in = (Bytef *)in;
    while (rc == CM_OK) {
        if (used == cap) {
            if (cap >= limit) {
                rc = CM_ETOOBIG;
                break;
            }
            size_t ncap = cap > limit / 2 ? limit : cap * 2;
            uint8_t *nb = realloc(buf, ncap);
            if (!nb) {
                rc = CM_ENOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t in_left = len - (size_t)(z.next_in - in);
        z.avail_in = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
        z.next_out = buf + used;
        z.avail_out = cap - used > (1u << 30) ? (1u << 30) : (uInt)(cap - used);
        uInt before = z.avail_out;
        int zr = inflate(&z, Z_NO_FLUSH);
        used += before - z.avail_out;
        if (zr == Z_STREAM_END) {
            size_t rest = len - (size_t)(z.next_in - in);
            if (rest == 0)
                break;
            /* Another gzip member follows (concatenated files are valid gzip). */
            if (rest < 18 || z.next_in[0] != 0x1f || z.next_in[1] != 0x8b) {
                CM_LOGE("data", "gzip: %zu bytes of trailing garbage", rest);
                rc = CM_EPARSE;
                break;
            }
            if (inflateReset(&z) != Z_OK)
                rc = CM_EPARSE;
            continue;
        }
        if (zr == Z_BUF_ERROR && z.avail_out > 0) {
            CM_LOGE("data", "gzip: truncated stream");
            rc = CM_EPARSE;
        } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
            CM_LOGE("data", "gzip: corrupt stream (%s)", z.msg ? z.msg : "?");
            rc = CM_EPARSE;
        }
    }
    inflateEnd(&z);
    if (rc == CM_OK && used > max_out)
        rc = CM_ETOOBIG;
    if (rc == CM_ETOOBIG)
        CM_LOGE("data", "gzip: decompressed size exceeds the limit of %zu bytes", max_out);
    if (rc != CM_OK) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = used;
    return CM_OK;
}
