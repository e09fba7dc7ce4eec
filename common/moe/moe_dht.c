/* Expert declarations on the DHT: the record codec, the set of records one
 * server publishes, the blocking and in-loop declare calls and the read
 * side (see moe_dht.h; seed 002_2b00836ea4b30f79.txt, Appendix C). */
#include "moe/moe_dht.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_log.h"

/* ---- codec ---------------------------------------------------------------- */

int moe_rec_has(const struct moe_rec *r, int i)
{
    return (int)((r->child[i >> 6] >> (i & 63)) & 1u);
}

static int host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '-';
}

static int v6_char(char c)
{
    return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || (c >= '0' && c <= '9') ||
           c == ':' || c == '.';
}

static int addr_check_n(const char *a, size_t len)
{
    if (len < 3 || len > MOE_ADDR_MAX)
        return CM_EPARSE;
    size_t colon = len;
    while (colon > 0 && a[colon - 1] != ':')
        colon--;
    if (colon < 2) /* no ':' or an empty host */
        return CM_EPARSE;
    size_t hl = colon - 1; /* host length */
    const char *port = a + colon;
    size_t pl = len - colon;
    if (pl == 0 || pl > 5 || port[0] == '0')
        return CM_EPARSE;
    unsigned v = 0;
    for (size_t i = 0; i < pl; i++) {
        if (port[i] < '0' || port[i] > '9')
            return CM_EPARSE;
        v = v * 10 + (unsigned)(port[i] - '0');
    }
    if (v > 65535)
        return CM_EPARSE;
    if (a[0] == '[') {
        if (hl < 3 || a[hl - 1] != ']')
            return CM_EPARSE;
        for (size_t i = 1; i + 1 < hl; i++)
            if (!v6_char(a[i]))
                return CM_EPARSE;
        return CM_OK;
    }
    for (size_t i = 0; i < hl; i++)
        if (!host_char(a[i]))
            return CM_EPARSE;
    return CM_OK;
}

int moe_addr_check(const char *addr)
{
    if (!addr)
        return CM_EINVAL;
    return addr_check_n(addr, strnlen(addr, MOE_ADDR_MAX + 1));
}

int moe_rec_encode(const struct moe_rec *r, uint8_t *out, size_t cap, size_t *len)
{
    if (!r || !out || !len)
        return CM_EINVAL;
    if (r->kind != MOE_REC_INNER && r->kind != MOE_REC_LEAF)
        return CM_EINVAL;
    if (r->size < MOE_MIN_SIZE || r->size > MOE_MAX_SIZE)
        return CM_ERANGE;
    size_t al = 0;
    if (r->kind == MOE_REC_LEAF) {
        if (moe_addr_check(r->server.addr))
            return CM_EINVAL;
        al = strlen(r->server.addr);
    }
    int count = 0;
    for (int i = 0; i < r->size; i++)
        count += moe_rec_has(r, i);
    for (int i = r->size; i < MOE_MAX_SIZE; i++)
        if (moe_rec_has(r, i))
            return CM_ERANGE;
    if (count == 0)
        return CM_EINVAL;
    size_t need = 6 + 2 * (size_t)count + (r->kind == MOE_REC_LEAF ? 1 + al + 32 : 0);
    if (need > cap)
        return CM_ETOOBIG;
    uint8_t *p = out;
    *p++ = MOE_REC_VERSION;
    *p++ = (uint8_t)r->kind;
    *p++ = (uint8_t)(r->size >> 8);
    *p++ = (uint8_t)r->size;
    *p++ = (uint8_t)(count >> 8);
    *p++ = (uint8_t)count;
    for (int i = 0; i < r->size; i++)
        if (moe_rec_has(r, i)) {
            *p++ = (uint8_t)(i >> 8);
            *p++ = (uint8_t)i;
        }
    if (r->kind == MOE_REC_LEAF) {
        *p++ = (uint8_t)al;
        memcpy(p, r->server.addr, al);
        p += al;
        memcpy(p, r->server.pub, 32);
        p += 32;
    }
    *len = (size_t)(p - out);
    return CM_OK;
}

int moe_rec_decode(const uint8_t *buf, size_t len, struct moe_rec *out)
{
    if (!buf || !out)
        return CM_EINVAL;
    if (len < 6)
        return CM_EPARSE;
    if (len > MOE_REC_MAX)
        return CM_ETOOBIG;
    if (buf[0] != MOE_REC_VERSION)
        return CM_EVERSION;
    struct moe_rec r;
    memset(&r, 0, sizeof r);
    r.kind = buf[1];
    if (r.kind != MOE_REC_INNER && r.kind != MOE_REC_LEAF)
        return CM_EPARSE;
    r.size = buf[2] << 8 | buf[3];
    r.count = buf[4] << 8 | buf[5];
    if (r.size < MOE_MIN_SIZE || r.size > MOE_MAX_SIZE || r.count < 1 || r.count > r.size)
        return CM_ERANGE;
    size_t off = 6;
    if (len - off < 2 * (size_t)r.count)
        return CM_EPARSE;
    int prev = -1;
    for (int i = 0; i < r.count; i++, off += 2) {
        int v = buf[off] << 8 | buf[off + 1];
        if (v <= prev)
            return CM_EPARSE; /* unsorted or duplicated */
        if (v >= r.size)
            return CM_ERANGE;
        r.child[v >> 6] |= 1ull << (v & 63);
        prev = v;
    }
    if (r.kind == MOE_REC_LEAF) {
        if (len - off < 1)
            return CM_EPARSE;
        size_t al = buf[off++];
        if (al > MOE_ADDR_MAX || len - off < al + 32)
            return CM_EPARSE;
        if (memchr(buf + off, 0, al) || addr_check_n((const char *)buf + off, al))
            return CM_EPARSE;
        memcpy(r.server.addr, buf + off, al);
        r.server.addr[al] = 0;
        off += al;
        memcpy(r.server.pub, buf + off, 32);
        off += 32;
    }
    if (off != len)
        return CM_EPARSE; /* trailing bytes */
    *out = r;
    return CM_OK;
}

/* ---- the records of one declaration -------------------------------------- */

static int prefix_cmp(const struct moe_uid *a, const struct moe_uid *b)
{
    if (a->n != b->n)
        return a->n < b->n ? -1 : 1;
    for (int i = 0; i < a->n; i++)
        if (a->idx[i] != b->idx[i])
            return a->idx[i] < b->idx[i] ? -1 : 1;
    return 0;
}

static int uid_qcmp(const void *a, const void *b)
{
    return prefix_cmp(a, b);
}

void moe_decl_cleanup(struct moe_decl *d)
{
    if (!d)
        return;
    free(d->items);
    d->items = NULL;
    d->n = 0;
}

int moe_decl_build(const char *run, const struct moe_grid *g, const struct moe_uid *uids,
                   size_t n, const struct moe_server *srv, struct moe_decl *out)
{
    if (!out || !srv || (n && !uids) || moe_grid_check(g) || moe_run_check(run) || n == 0)
        return CM_EINVAL;
    if (moe_addr_check(srv->addr))
        return CM_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (moe_uid_check(g, &uids[i]))
            return CM_EINVAL;
    struct moe_uid *s = malloc(n * sizeof *s);
    if (!s)
        return CM_ENOMEM;
    memcpy(s, uids, n * sizeof *s);
    qsort(s, n, sizeof *s, uid_qcmp);
    for (size_t i = 1; i < n; i++)
        if (!prefix_cmp(&s[i - 1], &s[i])) {
            free(s);
            return CM_EINVAL; /* duplicate uid */
        }
    /* Prefix lengths published: 1 .. d-1, or only the root for d = 1. */
    int lo = g->dims == 1 ? 0 : 1, hi = g->dims - 1;
    size_t cap = n * (size_t)(hi - lo + 1);
    struct moe_decl_item *it = calloc(cap, sizeof *it);
    if (!it) {
        free(s);
        return CM_ENOMEM;
    }
    size_t m = 0;
    int rc = CM_OK;
    for (int len = lo; len <= hi && rc == CM_OK; len++) {
        /* s is sorted, so uids sharing a prefix of length len are adjacent. */
        for (size_t i = 0; i < n && rc == CM_OK;) {
            struct moe_uid p;
            moe_uid_prefix(&s[i], len, &p);
            struct moe_rec r;
            memset(&r, 0, sizeof r);
            r.kind = len == g->dims - 1 ? MOE_REC_LEAF : MOE_REC_INNER;
            r.size = g->size;
            if (r.kind == MOE_REC_LEAF)
                r.server = *srv;
            size_t j = i;
            for (; j < n; j++) {
                struct moe_uid q;
                moe_uid_prefix(&s[j], len, &q);
                if (prefix_cmp(&p, &q))
                    break;
                int c = s[j].idx[len];
                r.child[c >> 6] |= 1ull << (c & 63);
            }
            struct moe_decl_item *d = &it[m++];
            d->prefix = p;
            rc = moe_key_format(run, g, &p, d->key, sizeof d->key, &d->klen);
            if (rc == CM_OK)
                rc = moe_rec_encode(&r, d->value, sizeof d->value, &d->vlen);
            i = j;
        }
    }
    free(s);
    if (rc) {
        free(it);
        return rc;
    }
    out->items = it;
    out->n = m;
    return CM_OK;
}

/* ---- declaring, blocking -------------------------------------------------- */

#define DECLARE_THREADS 16

struct declare_job {
    struct dht_node *node;
    const struct moe_decl *d;
    int64_t expires_ms, end_ms;
    pthread_mutex_t mu;
    size_t next, ok;
    int first_err;
};

static void *declare_worker(void *arg)
{
    struct declare_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        size_t i = j->next++;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->d->n)
            return NULL;
        const struct moe_decl_item *it = &j->d->items[i];
        int64_t left = j->end_ms - p2p_now_ms();
        int stored = 0;
        int rc = left <= 0 ? CM_ETIMEOUT
                           : dht_put(j->node, it->key, it->klen, MOE_DHT_SUBKEY,
                                     strlen(MOE_DHT_SUBKEY), it->value, it->vlen, j->expires_ms,
                                     (uint32_t)left, &stored);
        if (rc == CM_OK && stored == 0)
            rc = CM_ENOTFOUND;
        pthread_mutex_lock(&j->mu);
        if (rc == CM_OK)
            j->ok++;
        else if (j->first_err == CM_OK)
            j->first_err = rc;
        pthread_mutex_unlock(&j->mu);
        if (rc)
            CM_LOGW("moe", "declaring %s failed: %s", it->key, cm_strerror(rc));
    }
}

int moe_dht_declare(struct dht_node *node, const char *run, const struct moe_grid *g,
                    const struct moe_uid *uids, size_t n, const struct moe_server *srv,
                    int64_t expires_ms, uint32_t deadline_ms, size_t *keys_ok)
{
    if (!node || deadline_ms == 0 || expires_ms <= p2p_now_ms())
        return CM_EINVAL;
    struct moe_decl d;
    int rc = moe_decl_build(run, g, uids, n, srv, &d);
    if (rc)
        return rc;
    struct declare_job j = {.node = node, .d = &d, .expires_ms = expires_ms,
                            .end_ms = p2p_now_ms() + deadline_ms};
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th[DECLARE_THREADS];
    size_t nt = d.n < DECLARE_THREADS ? d.n : DECLARE_THREADS, started = 0;
    for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, declare_worker, &j))
            break;
    if (started == 0)
        declare_worker(&j); /* no thread: do it here */
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);
    if (keys_ok)
        *keys_ok = j.ok;
    rc = j.ok == d.n ? CM_OK : j.first_err;
    moe_decl_cleanup(&d);
    return rc;
}

/* ---- declaring, in-loop --------------------------------------------------- */

struct declare_async {
    struct moe_decl d;
    size_t pending, ok;
    int first_err;
    moe_declare_cb cb;
    void *arg;
};

static void declare_async_release(struct declare_async *a)
{
    if (--a->pending)
        return;
    int status = a->ok == a->d.n ? CM_OK : a->first_err;
    a->cb(a->arg, status, a->ok);
    moe_decl_cleanup(&a->d);
    free(a);
}

static void declare_async_done(void *arg, const struct dht_result *res)
{
    struct declare_async *a = arg;
    int rc = res->status;
    if (rc == CM_OK && res->stored == 0)
        rc = CM_ENOTFOUND;
    if (rc == CM_OK)
        a->ok++;
    else if (a->first_err == CM_OK)
        a->first_err = rc;
    declare_async_release(a);
}

int moe_dht_declare_async(struct dht_node *node, const char *run, const struct moe_grid *g,
                          const struct moe_uid *uids, size_t n, const struct moe_server *srv,
                          int64_t expires_ms, moe_declare_cb cb, void *arg)
{
    if (!node || !cb || expires_ms <= p2p_now_ms())
        return CM_EINVAL;
    struct declare_async *a = calloc(1, sizeof *a);
    if (!a)
        return CM_ENOMEM;
    int rc = moe_decl_build(run, g, uids, n, srv, &a->d);
    if (rc) {
        free(a);
        return rc;
    }
    a->cb = cb;
    a->arg = arg;
    /* Count every put as pending first, so an early completion cannot
       finish the declaration before the rest are issued. */
    a->pending = a->d.n + 1;
    for (size_t i = 0; i < a->d.n; i++) {
        const struct moe_decl_item *it = &a->d.items[i];
        rc = dht_put_async(node, it->key, it->klen, MOE_DHT_SUBKEY, strlen(MOE_DHT_SUBKEY),
                           it->value, it->vlen, expires_ms, declare_async_done, a);
        if (rc) {
            struct dht_result fail = {.status = rc};
            declare_async_done(a, &fail);
        }
    }
    declare_async_release(a);
    return CM_OK;
}

/* ---- reading -------------------------------------------------------------- */

int moe_dht_entries(const struct moe_grid *g, const struct moe_uid *prefix,
                    const struct dht_result *res, struct moe_entry **out, size_t *n,
                    size_t *skipped)
{
    if (!res || !out || !n || moe_prefix_check(g, prefix))
        return CM_EINVAL;
    *out = NULL;
    *n = 0;
    size_t skip = 0, m = 0;
    struct moe_entry *e = res->nrec ? calloc(res->nrec, sizeof *e) : NULL;
    if (res->nrec && !e)
        return CM_ENOMEM;
    int want = prefix->n == g->dims - 1 ? MOE_REC_LEAF : MOE_REC_INNER;
    size_t sl = strlen(MOE_DHT_SUBKEY);
    for (size_t i = 0; i < res->nrec; i++) {
        const struct dht_record *r = &res->rec[i];
        if (r->subkey_len != sl || memcmp(r->subkey, MOE_DHT_SUBKEY, sl) ||
            moe_rec_decode(r->value, r->value_len, &e[m].rec) || e[m].rec.kind != want ||
            e[m].rec.size != g->size) {
            skip++;
            continue;
        }
        memcpy(e[m].author, r->author, 32);
        e[m].expires_ms = r->expires_ms;
        m++;
    }
    if (m == 0) {
        free(e);
        e = NULL;
    }
    *out = e;
    *n = m;
    if (skipped)
        *skipped = skip;
    return CM_OK;
}

int moe_dht_get_prefix(struct dht_node *node, const char *run, const struct moe_grid *g,
                       const struct moe_uid *prefix, uint32_t deadline_ms,
                       struct moe_entry **out, size_t *n)
{
    char key[MOE_KEY_MAX];
    size_t kl;
    if (!node || !out || !n)
        return CM_EINVAL;
    int rc = moe_key_format(run, g, prefix, key, sizeof key, &kl);
    if (rc)
        return rc;
    if (prefix->n >= g->dims)
        return CM_EINVAL;
    struct dht_result r;
    if ((rc = dht_get(node, key, kl, deadline_ms, &r)))
        return rc;
    rc = r.status;
    if (rc == CM_OK)
        rc = moe_dht_entries(g, prefix, &r, out, n, NULL);
    dht_result_cleanup(&r);
    return rc;
}

int moe_dht_find_expert(struct dht_node *node, const char *run, const struct moe_grid *g,
                        const struct moe_uid *uid, uint32_t deadline_ms,
                        struct moe_server *out, size_t max, size_t *n)
{
    if (!out || !n || moe_uid_check(g, uid))
        return CM_EINVAL;
    struct moe_uid p;
    moe_uid_prefix(uid, g->dims - 1, &p);
    struct moe_entry *e;
    size_t ne;
    int rc = moe_dht_get_prefix(node, run, g, &p, deadline_ms, &e, &ne);
    if (rc)
        return rc;
    int last = uid->idx[g->dims - 1];
    *n = 0;
    /* freshest first: repeated selection, ne is at most a few dozen */
    while (*n < max) {
        int best = -1;
        for (size_t i = 0; i < ne; i++)
            if (moe_rec_has(&e[i].rec, last) &&
                (best < 0 || e[i].expires_ms > e[best].expires_ms))
                best = (int)i;
        if (best < 0)
            break;
        out[(*n)++] = e[best].rec.server;
        e[best].rec.child[last >> 6] &= ~(1ull << (last & 63));
    }
    free(e);
    return *n ? CM_OK : CM_ENOTFOUND;
}
