/* Token bucket arithmetic (see p2p_rate.h). */
#include "p2p/p2p_rate.h"

void p2p_rate_init(struct p2p_rate *r, double mbps, uint64_t now_ns)
{
    p2p_rate_init_burst(r, mbps, P2P_RATE_BURST_S, now_ns);
}

void p2p_rate_init_burst(struct p2p_rate *r, double mbps, double burst_s, uint64_t now_ns)
{
    r->bytes_per_s = mbps > 0 ? mbps * 1e6 / 8.0 : 0;
    /* The bucket starts empty (no head start to inflate a measurement) and
     * holds up to burst_s of traffic (100 ms by default), so a timer that
     * fires late on a busy machine does not lose the tokens that accrued
     * meanwhile. */
    r->burst = r->bytes_per_s * (burst_s > 0 ? burst_s : P2P_RATE_BURST_S);
    if (r->bytes_per_s > 0 && r->burst < 1500)
        r->burst = 1500;
    r->tokens = 0;
    r->last_ns = now_ns;
}

int p2p_rate_limited(const struct p2p_rate *r)
{
    return r->bytes_per_s > 0;
}

static void refill(struct p2p_rate *r, uint64_t now_ns)
{
    if (now_ns > r->last_ns) {
        r->tokens += (double)(now_ns - r->last_ns) * 1e-9 * r->bytes_per_s;
        if (r->tokens > r->burst)
            r->tokens = r->burst;
    }
    r->last_ns = now_ns;
}

size_t p2p_rate_available(struct p2p_rate *r, uint64_t now_ns)
{
    if (!p2p_rate_limited(r))
        return SIZE_MAX;
    refill(r, now_ns);
    return r->tokens >= 1 ? (size_t)r->tokens : 0;
}

void p2p_rate_consume(struct p2p_rate *r, size_t n)
{
    if (p2p_rate_limited(r))
        r->tokens -= (double)n;
}

uint64_t p2p_rate_wait_ms(struct p2p_rate *r, size_t want, uint64_t now_ns)
{
    if (!p2p_rate_limited(r))
        return 0;
    refill(r, now_ns);
    double need = (double)want > r->burst ? r->burst : (double)want;
    if (r->tokens >= need)
        return 0;
    double ms = (need - r->tokens) / r->bytes_per_s * 1000.0;
    return (uint64_t)ms + 1;
}
