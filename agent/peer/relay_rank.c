/* Relay entries and their ranking (see relay_rank.h). */
#include "agent/peer/relay_rank.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int peer_relay_entry_parse(const uint8_t *val, size_t len, struct peer_relay_cand *c)
{
    char v[PEER_ADDR_MAX + 16];
    if (len == 0 || len >= sizeof v || memchr(val, 0, len))
        return -1;
    memcpy(v, val, len);
    v[len] = 0;
    c->load = 0;
    c->backbone = 0;
    char *sp = strchr(v, ' ');
    if (sp) {
        *sp++ = 0;
        if (!strcmp(sp, "backbone")) {
            c->backbone = 1;
        } else {
            if (strncmp(sp, "n=", 2) || !sp[2] || strlen(sp + 2) > 5)
                return -1;
            unsigned long n = 0;
            for (const char *d = sp + 2; *d; d++) {
                if (*d < '0' || *d > '9')
                    return -1;
                n = n * 10 + (unsigned long)(*d - '0');
            }
            if (n > PEER_RELAY_LOAD_MAX)
                return -1;
            c->load = (unsigned)n;
        }
    }
    size_t al = strlen(v);
    if (al == 0 || al >= sizeof c->addr)
        return -1;
    memcpy(c->addr, v, al + 1);
    return 0;
}

void peer_relay_entry_format(char *out, size_t cap, const char *st_addr, unsigned load)
{
    snprintf(out, cap, "%s n=%u", st_addr, load > PEER_RELAY_LOAD_MAX ? PEER_RELAY_LOAD_MAX : load);
}

static int cand_cmp(const void *a, const void *b)
{
    const struct peer_relay_cand *x = a, *y = b;
    if (x->tier_ != y->tier_)
        return x->tier_ < y->tier_ ? -1 : 1;
    if (x->bucket_ != y->bucket_)
        return x->bucket_ < y->bucket_ ? -1 : 1;
    return x->tie_ < y->tie_ ? -1 : x->tie_ > y->tie_;
}

void peer_relay_rank(struct peer_relay_cand *c, size_t n, const uint8_t self[CM_ED25519_PUB_LEN])
{
    for (size_t i = 0; i < n; i++) {
        double share = 1.0 + c[i].load;
        if (c[i].backbone) {
            c[i].tier_ = 2;
            c[i].bucket_ = 0;
        } else if (c[i].mbps > 0 && isfinite(c[i].mbps)) {
            c[i].tier_ = 0; /* more throughput per client first: minus log base 1.25 */
            c[i].bucket_ = (int)fmax(-1e6, fmin(1e6, -floor(log(c[i].mbps / share) / log(1.25))));
        } else {
            c[i].tier_ = 1; /* shorter round trip per client first: half-octaves */
            double r = c[i].rtt_ms >= 0 && c[i].rtt_ms < 1e9 ? c[i].rtt_ms : 1e9;
            c[i].bucket_ = (int)floor(2 * log2((r + 1) * share));
        }
        uint8_t buf[2 * CM_ED25519_PUB_LEN], h[CM_SHA256_LEN];
        memcpy(buf, self, CM_ED25519_PUB_LEN);
        memcpy(buf + CM_ED25519_PUB_LEN, c[i].pub, CM_ED25519_PUB_LEN);
        cm_sha256(buf, sizeof buf, h);
        uint64_t t = 0;
        for (int k = 0; k < 8; k++)
            t = t << 8 | h[k];
        c[i].tie_ = t;
    }
    qsort(c, n, sizeof *c, cand_cmp);
}
