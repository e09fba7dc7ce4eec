/* text-docs shards (data.h): lines into tokenized sentences and documents,
 * and ALBERT's sentence-order pairs from them. Pure functions over caller
 * bytes (fuzzed: tests/fuzz/fuzz_textdocs.c); the tokenizer is a callback
 * (cm_spm_encode in the iterator). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "data/data.h"
#include "data/spm.h"

size_t cm_utf8_invalid_at(const char *text, size_t len)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF)
            n = 1, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            n = 2, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            n = 3, cp = c & 0x07;
        else
            return i;
        if (len - i <= n)
            return i;
        for (size_t k = 1; k <= n; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return i;
        i += n + 1;
    }
    return len;
}

/* Appends to a growable array of `size`-byte elements. */
static int grow(void **a, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return CM_OK;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    void *p = realloc(*a, c * size);
    if (!p)
        return CM_ENOMEM;
    *a = p;
    *cap = c;
    return CM_OK;
}

void cm_data_docs_free(struct cm_data_docs *d)
{
    if (!d)
        return;
    free(d->tok);
    free(d->sent);
    free(d->doc);
    memset(d, 0, sizeof *d);
}

int cm_data_docs_tokenize(const uint8_t *buf, size_t len, cm_data_encode_fn enc, void *ctx,
                          struct cm_data_docs *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    size_t tcap = 0, scap = 0, dcap = 0;
    int rc = CM_OK;
    if ((rc = grow((void **)&d->sent, &scap, 1, sizeof *d->sent)) ||
        (rc = grow((void **)&d->doc, &dcap, 1, sizeof *d->doc)))
        goto fail;
    d->sent[0] = 0;
    d->doc[0] = 0;
    size_t line = 0, pos = 0;
    while (pos < len) {
        const uint8_t *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len, l = end - pos;
        const char *s = (const char *)buf + pos;
        line++;
        pos = nl ? end + 1 : len;
        if (l > 0 && s[l - 1] == '\r')
            l--;
        if (l == 0) { /* a blank line ends the document (empty ones are dropped) */
            if (d->nsent > d->doc[d->ndoc]) {
                if ((rc = grow((void **)&d->doc, &dcap, d->ndoc + 2, sizeof *d->doc)))
                    goto fail;
                d->doc[++d->ndoc] = d->nsent;
            }
            continue;
        }
        size_t bad = cm_utf8_invalid_at(s, l);
        if (bad < l) {
            rc = CM_EPARSE;
            snprintf(err, errlen, "line %zu: not UTF-8 (byte %zu of the line)", line, bad);
            goto fail;
        }
        size_t n = 0;
        for (;;) {
            size_t room = tcap - d->ntok;
            rc = enc(ctx, s, l, d->tok ? d->tok + d->ntok : NULL, room, &n);
            if (rc != CM_ETOOBIG)
                break;
            if ((rc = grow((void **)&d->tok, &tcap, d->ntok + n + 1, sizeof *d->tok)))
                goto fail;
        }
        if (rc != CM_OK) {
            snprintf(err, errlen, "line %zu: the tokenizer refused it (%s)", line, cm_strerror(rc));
            goto fail;
        }
        if (n == 0)
            continue;
        d->ntok += n;
        if ((rc = grow((void **)&d->sent, &scap, d->nsent + 2, sizeof *d->sent)))
            goto fail;
        d->sent[++d->nsent] = d->ntok;
    }
    if (d->nsent > d->doc[d->ndoc]) {
        if ((rc = grow((void **)&d->doc, &dcap, d->ndoc + 2, sizeof *d->doc)))
            goto fail;
        d->doc[++d->ndoc] = d->nsent;
    }
    return CM_OK;
fail:
    if (rc == CM_ENOMEM)
        snprintf(err, errlen, "out of memory");
    cm_data_docs_free(d);
    return rc;
}

/* ---- sentence-order pairs ---------------------------------------------- */

static uint64_t mix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t below(uint64_t *s, size_t n) /* uniform enough in [0, n) for n << 2^64 */
{
    return (size_t)(mix(s) % n);
}

struct span {
    const int32_t *t;
    size_t n;
};

/* BERT's truncate_seq_pair: trim the longer segment, at its front or back
 * at random, until both fit max tokens. */
static void trim_pair(struct span *a, struct span *b, size_t max, uint64_t *rng)
{
    while (a->n + b->n > max) {
        struct span *l = a->n > b->n ? a : b;
        if (mix(rng) & 1)
            l->t++;
        l->n--;
    }
}

int cm_data_sop_build(const struct cm_data_docs *d, const struct cm_data_sop_spec *sp,
                      uint64_t seed, uint16_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t T = sp->T, max = T >= 8 ? T - 3 : 0, W = T + 1;
    if (!max)
        return CM_EINVAL;
    uint16_t *rec = NULL;
    size_t cap = 0, cnt = 0;
    uint64_t rng = seed ^ 0x50b5eed5ull;
    for (size_t di = 0; di < d->ndoc; di++) {
        size_t s0 = d->doc[di], s1 = d->doc[di + 1];
        size_t target = below(&rng, 10) == 0 ? 2 + below(&rng, max - 1) : max;
        size_t first = s0, len = 0;
        for (size_t si = s0; si < s1; si++) {
            len += d->sent[si + 1] - d->sent[si];
            if (si + 1 < s1 && len < target)
                continue;
            /* the chunk is sentences [first, si] */
            struct span a, b;
            size_t nsent = si + 1 - first;
            if (nsent >= 2) {
                size_t cut = first + 1 + below(&rng, nsent - 1); /* B starts at sentence cut */
                a = (struct span){d->tok + d->sent[first], d->sent[cut] - d->sent[first]};
                b = (struct span){d->tok + d->sent[cut], d->sent[si + 1] - d->sent[cut]};
            } else {
                size_t tn = d->sent[first + 1] - d->sent[first];
                const int32_t *t = d->tok + d->sent[first];
                if (tn < 2) { /* a one-token sentence alone: no pair */
                    first = si + 1;
                    len = 0;
                    continue;
                }
                size_t cut = 1 + below(&rng, tn - 1);
                a = (struct span){t, cut};
                b = (struct span){t + cut, tn - cut};
            }
            trim_pair(&a, &b, max, &rng);
            int swap = (int)(mix(&rng) & 1);
            if (swap) {
                struct span t = a;
                a = b;
                b = t;
            }
            if (cnt == cap) {
                size_t nc = cap ? 2 * cap : 256;
                uint16_t *r = realloc(rec, nc * W * sizeof *rec);
                if (!r) {
                    free(rec);
                    return CM_ENOMEM;
                }
                rec = r;
                cap = nc;
            }
            uint16_t *o = rec + cnt * W;
            size_t k = 0;
            o[k++] = sp->cls;
            for (size_t i = 0; i < a.n; i++)
                o[k++] = (uint16_t)a.t[i];
            o[k++] = sp->sep;
            for (size_t i = 0; i < b.n; i++)
                o[k++] = (uint16_t)b.t[i];
            o[k++] = sp->sep;
            while (k < T)
                o[k++] = sp->pad;
            o[T] = (uint16_t)swap;
            cnt++;
            first = si + 1;
            len = 0;
            target = below(&rng, 10) == 0 ? 2 + below(&rng, max - 1) : max;
        }
    }
    *out = rec;
    *n = cnt;
    return CM_OK;
}
