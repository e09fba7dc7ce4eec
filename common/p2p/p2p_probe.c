/* Throughput probes: see p2p_probe.h. */
#include "p2p/p2p_probe.h"

#include <string.h>

#include "cm_err.h"

int p2p_probe_pull_parse(const uint8_t *body, size_t len, uint32_t *want)
{
    if (!body || len != 4)
        return CM_EPARSE;
    uint32_t w = (uint32_t)body[0] << 24 | (uint32_t)body[1] << 16 | (uint32_t)body[2] << 8 | body[3];
    if (w == 0 || w > P2P_PROBE_CHUNK)
        return CM_ERANGE;
    *want = w;
    return CM_OK;
}

void p2p_probe_pull_encode(uint32_t want, uint8_t out[4])
{
    out[0] = (uint8_t)(want >> 24);
    out[1] = (uint8_t)(want >> 16);
    out[2] = (uint8_t)(want >> 8);
    out[3] = (uint8_t)want;
}

int p2p_probe_admit(struct p2p_probe_hold *h, const uint8_t from[32], int64_t now_ms)
{
    unsigned n = h->slots == 0 ? 1 : h->slots > P2P_PROBE_MAX_SLOTS ? P2P_PROBE_MAX_SLOTS : h->slots;
    int free_slot = -1;
    for (unsigned i = 0; i < n; i++) {
        if (h->s[i].used && !memcmp(h->s[i].pub, from, 32)) {
            h->s[i].last_ms = now_ms;
            return CM_OK;
        }
        if (free_slot < 0 && (!h->s[i].used || now_ms - h->s[i].last_ms >= P2P_PROBE_HOLD_MS))
            free_slot = (int)i;
    }
    if (free_slot < 0)
        return CM_EBUSY;
    memcpy(h->s[free_slot].pub, from, 32);
    h->s[free_slot].last_ms = now_ms;
    h->s[free_slot].used = 1;
    return CM_OK;
}
