/* Downloading and verifying one shard file for the dataset iterator.
 *
 * libcurl writes into a buffer of exactly the declared size (a server that
 * sends more is cut off), SHA-256 runs over the bytes as they arrive, and
 * the file counts only when size and hash match the manifest. With chunk
 * hashes, each chunk is checked the moment it completes and the windows
 * inside the verified prefix are queued right away (docs/data.md explains
 * both modes). Every transfer has connect and low-speed deadlines, and the
 * progress callback aborts it when the iterator closes. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"
#include "data/data_internal.h"

/* ---- Chunked shards: release windows as chunks verify -------------------- */

/* Queues the windows that lie entirely within the first `prefix` verified
 * bytes and were not queued yet. Windows are a prefix property: window k
 * needs tokens [kT, kT+T], so a longer verified prefix only adds windows. */
static int release_prefix(struct cm_data_iter *it, const struct cm_data_file *f, struct chunked *ck,
                          uint64_t prefix)
{
    size_t T = it->o.seq_len;
    const uint8_t *base = ck->sb->data;
    uint64_t avail;
    if (it->m->format == CM_DATA_TOKENS_U16) {
        if (prefix < CM_DATA_TOKENS_HEADER_BYTES)
            return CM_OK;
        if (!ck->header_ok) {
            struct cm_data_tokens tk; /* reads the header only; checks it against the size */
            int rc = cm_data_tokens_parse(base, f->size, &tk);
            if (rc != CM_OK) {
                cm_data__set_error(it, "%s: not a valid llm.c token shard", f->url);
                return rc;
            }
            ck->total = tk.count > T ? (tk.count - 1) / T : 0;
            ck->header_ok = 1;
        }
        base += CM_DATA_TOKENS_HEADER_BYTES;
        avail = (prefix - CM_DATA_TOKENS_HEADER_BYTES) / 2;
    } else {
        ck->total = f->size > T ? (f->size - 1) / T : 0;
        avail = prefix;
    }
    uint64_t n = avail > T ? (avail - 1) / T : 0;
    if (n > ck->total)
        n = ck->total;
    if (n <= ck->released)
        return CM_OK;
    if (it->m->format == CM_DATA_TOKENS_U16) {
        for (uint64_t i = ck->released * T; i <= n * T; i++) {
            unsigned v = base[2 * i] | (unsigned)base[2 * i + 1] << 8;
            if (v >= it->m->vocab_size) {
                cm_data__set_error(it, "%s: token %u at %" PRIu64 " is not below vocab_size=%u",
                                   f->url, v, i, it->m->vocab_size);
                return CM_ERANGE;
            }
        }
    }
    int rc = cm_data__push_examples(it, ck->sb, ck->shard, ck->epoch, ck->released,
                                    n - ck->released, base + ck->released * it->stride, NULL);
    if (rc == CM_OK)
        ck->released = n;
    return rc;
}

/* ---- Downloading one file ---------------------------------------------- */

struct fetch {
    struct cm_data_iter *it;
    const struct cm_data_file *f;
    uint8_t *buf; /* f->size bytes, owned by the caller */
    uint64_t len;
    struct cm_sha256_ctx hash;
    struct chunked *ck; /* non-NULL: verify and release chunk by chunk */
    int too_big;
    int hash_err;
    int chunk_rc; /* a chunk failed to verify or to release */
};

static size_t on_data(char *p, size_t sz, size_t nm, void *ud)
{
    struct fetch *fe = ud;
    size_t n = sz * nm;
    if (n > fe->f->size - fe->len) {
        fe->too_big = 1;
        return 0; /* aborts the transfer: more bytes than the manifest declares */
    }
    memcpy(fe->buf + fe->len, p, n);
    fe->len += n;
    if (cm_sha256_update(&fe->hash, p, n) != CM_OK) {
        fe->hash_err = 1;
        return 0;
    }
    pthread_mutex_lock(&fe->it->mu);
    fe->it->st.bytes_downloaded += n;
    pthread_mutex_unlock(&fe->it->mu);
    struct chunked *ck = fe->ck;
    while (ck && ck->verified < fe->f->n_chunks) {
        const struct cm_data_file *f = fe->f;
        uint64_t start = (uint64_t)ck->verified * f->chunk_size;
        uint64_t end = start + f->chunk_size < f->size ? start + f->chunk_size : f->size;
        if (fe->len < end)
            break;
        uint8_t h[32];
        cm_sha256(fe->buf + start, end - start, h);
        if (!cm_ct_equal(h, f->chunk_sha256[ck->verified], 32)) {
            cm_data__set_error(fe->it,
                               "shard %s: chunk %u (bytes %" PRIu64 "..%" PRIu64 ") SHA-256 "
                               "mismatch; the rest of the shard is rejected",
                               f->url, ck->verified, start, end);
            fe->chunk_rc = CM_ECHECKSUM;
            return 0;
        }
        ck->verified++;
        int rc = release_prefix(fe->it, f, ck, end);
        if (rc != CM_OK) {
            fe->chunk_rc = rc;
            return 0;
        }
    }
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt, (void)dn, (void)ut, (void)un;
    struct fetch *fe = ud;
    return atomic_load(&fe->it->stop) ? 1 : 0;
}

/* Downloads f into buf (f->size bytes, caller-owned) and checks size and
 * SHA-256, and, with ck, every chunk as it completes. */
static int fetch_once(struct cm_data_iter *it, const struct cm_data_file *f, const char *what,
                      uint8_t *buf, struct chunked *ck)
{
    /* A chunked file resumes after its verified chunks: their bytes are in
     * buf already, and only the whole-file hash has to catch up on them. */
    uint64_t resume = ck ? (uint64_t)ck->verified * f->chunk_size : 0;
    if (resume > f->size)
        resume = f->size;
    struct fetch fe = {.it = it, .f = f, .buf = buf, .ck = ck, .len = resume};
    if (cm_sha256_init(&fe.hash) != CM_OK)
        return CM_ECRYPTO;
    if (resume && cm_sha256_update(&fe.hash, buf, resume) != CM_OK) {
        cm_sha256_cleanup(&fe.hash);
        return CM_ECRYPTO;
    }
    CURL *c = curl_easy_init();
    if (!c) {
        cm_sha256_cleanup(&fe.hash);
        return CM_ENOMEM;
    }
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, f->url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "file,http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &fe);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &fe);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, it->o.connect_timeout_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, it->o.low_speed_bytes);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, it->o.low_speed_time_s);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, it->o.transfer_timeout_s);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "crowdtrain-agent");
    if (it->o.ca_file)
        curl_easy_setopt(c, CURLOPT_CAINFO, it->o.ca_file);
    if (resume)
        curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)resume);
    CURLcode cr = curl_easy_perform(c);
    long http = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_cleanup(c);

    uint8_t digest[32];
    int rc = CM_OK;
    if (atomic_load(&it->stop)) {
        rc = CM_ECLOSED;
    } else if (fe.chunk_rc) {
        rc = fe.chunk_rc; /* already reported */
    } else if (fe.too_big) {
        cm_data__set_error(it, "%s %s: more than the declared %" PRIu64 " bytes", what, f->url,
                           f->size);
        rc = CM_ECHECKSUM;
    } else if (fe.hash_err) {
        rc = CM_ECRYPTO;
    } else if (cr != CURLE_OK) {
        switch (cr) {
        case CURLE_OPERATION_TIMEDOUT: rc = CM_ETIMEOUT; break;
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST: rc = CM_ECONN; break;
        case CURLE_FILE_COULDNT_READ_FILE: rc = CM_ENOTFOUND; break;
        case CURLE_RANGE_ERROR: rc = CM_EUNSUPPORTED; break; /* cannot resume: not retried */
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CACERT_BADFILE: rc = CM_EAUTH; break; /* not retried */
        default: rc = CM_EIO; break;
        }
        cm_data__set_error(it, "%s %s: download failed: %s%s%s (HTTP %ld)", what, f->url,
                           curl_easy_strerror(cr), *cerr ? ": " : "", cerr, http);
    } else if (fe.len != f->size) {
        cm_data__set_error(it, "%s %s: got %" PRIu64 " bytes, the manifest declares %" PRIu64, what,
                           f->url, fe.len, f->size);
        rc = CM_ECHECKSUM;
    }
    if (rc == CM_OK) {
        rc = cm_sha256_final(&fe.hash, digest);
        if (rc == CM_OK && !cm_ct_equal(digest, f->sha256, 32)) {
            char hex[65];
            cm_hex_encode(digest, 32, hex);
            if (ck && ck->released)
                cm_data__set_error(it,
                                   "%s %s: every chunk verified but the file's SHA-256 is %s: the "
                                   "manifest is inconsistent (%" PRIu64 " examples already used)",
                                   what, f->url, hex, ck->released);
            else
                cm_data__set_error(it, "%s %s: SHA-256 mismatch (got %s); shard rejected", what,
                                   f->url, hex);
            rc = CM_ECHECKSUM;
        }
    } else {
        cm_sha256_cleanup(&fe.hash);
    }
    return rc;
}

static void sleep_unless_stopped(struct cm_data_iter *it, unsigned ms)
{
    for (unsigned t = 0; t < ms && !atomic_load(&it->stop); t += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* A whole file restarts from its first byte. A chunked file resumes after
 * its last verified chunk (an HTTP range request), so windows already
 * released never come twice; a server that cannot serve ranges ends the
 * shard there (CM_EUNSUPPORTED). */
int cm_data__fetch_retrying(struct cm_data_iter *it, const struct cm_data_file *f, const char *what,
                            uint8_t *buf, struct chunked *ck)
{
    int rc = CM_EIO;
    for (unsigned attempt = 0; attempt <= it->o.retries; attempt++) {
        if (attempt)
            sleep_unless_stopped(it, 500u * attempt);
        if (atomic_load(&it->stop))
            return CM_ECLOSED;
        if (attempt && ck && ck->verified)
            CM_LOGI("data", "%s %s: resuming after %u verified chunks", what, f->url, ck->verified);
        rc = fetch_once(it, f, what, buf, ck);
        if (rc != CM_ETIMEOUT && rc != CM_ECONN && rc != CM_EIO)
            break;
    }
    return rc;
}

/* ---- Verified cache -------------------------------------------------------
 * <cache_dir>/<sha256 hex of the stored bytes>: content-addressed, so one
 * file serves every manifest listing the same bytes, and re-hashed on every
 * read, so local corruption costs a download, never a bad example. */

static void cache_path(const struct cm_data_iter *it, const struct cm_data_file *f, char *out,
                       size_t cap)
{
    char hex[65];
    cm_hex_encode(f->sha256, 32, hex);
    snprintf(out, cap, "%s/%s", it->o.cache_dir, hex);
}

/* 1 when buf now holds the verified file from the cache. */
static int cache_read(struct cm_data_iter *it, const struct cm_data_file *f, uint8_t *buf)
{
    char path[4200];
    cache_path(it, f, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == f->size;
    uint64_t got = 0;
    while (ok && got < f->size) {
        ssize_t k = pread(fd, buf + got, f->size - got > (1u << 30) ? (1u << 30) : f->size - got,
                          (off_t)got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            ok = 0;
        else
            got += (uint64_t)k;
    }
    close(fd);
    uint8_t h[32];
    if (ok) {
        cm_sha256(buf, f->size, h);
        ok = cm_ct_equal(h, f->sha256, 32);
        if (!ok)
            CM_LOGW("data", "cache file %s is corrupt: downloading %s again", path, f->url);
    }
    if (ok) {
        pthread_mutex_lock(&it->mu);
        it->st.cache_hits++;
        pthread_mutex_unlock(&it->mu);
    }
    return ok;
}

/* Best effort: a cache that cannot be written costs later downloads only. */
static void cache_write(struct cm_data_iter *it, const struct cm_data_file *f, const uint8_t *buf)
{
    char path[4200], tmp[4220];
    cache_path(it, f, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        CM_LOGW("data", "cache %s: %s", it->o.cache_dir, strerror(errno));
        return;
    }
    uint64_t done = 0;
    int ok = fchmod(fd, 0644) == 0;
    while (ok && done < f->size) {
        ssize_t k =
            write(fd, buf + done, f->size - done > (1u << 30) ? (1u << 30) : f->size - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            ok = 0;
        else
            done += (uint64_t)k;
    }
    ok = ok && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        CM_LOGW("data", "cache %s: cannot store %s: %s", it->o.cache_dir, f->url, strerror(errno));
        unlink(tmp);
    }
}

int cm_data__fetch_whole(struct cm_data_iter *it, const struct cm_data_file *f, const char *what,
                         uint8_t **out, size_t *out_len)
{
    uint8_t *raw = malloc(f->size);
    if (!raw)
        return CM_ENOMEM;
    int rc = CM_OK;
    if (!it->o.cache_dir || !cache_read(it, f, raw)) {
        rc = cm_data__fetch_retrying(it, f, what, raw, NULL);
        if (rc == CM_OK && it->o.cache_dir)
            cache_write(it, f, raw);
    }
    if (rc != CM_OK) {
        free(raw);
        return rc;
    }
    if (f->compression == CM_DATA_COMP_GZIP) {
        uint8_t *dec = NULL;
        size_t dlen = 0;
        rc = cm_data_gunzip(raw, f->size, it->o.max_shard_bytes, &dec, &dlen);
        free(raw);
        if (rc != CM_OK) {
            cm_data__set_error(it, "%s %s: gzip data does not decompress: %s", what, f->url,
                               cm_strerror(rc));
            return rc;
        }
        *out = dec;
        *out_len = dlen;
        return CM_OK;
    }
    *out = raw;
    *out_len = f->size;
    return CM_OK;
}
