/* Token buckets for the per-process upload and download caps
 * (--max-upload-mbps / --max-download-mbps). Pure arithmetic over a clock
 * the caller passes in, so the pacing is testable without sockets; the
 * transport (p2p_transport.c) slices writes and pauses reads with them.
 * Benchmarks emulate home connections with these caps, so the long-run rate
 * must be exact: the bucket starts empty, holds at most 100 ms of traffic
 * (or the burst the caller sets), and debt is carried, never forgiven. */
#ifndef P2P_RATE_H
#define P2P_RATE_H

#include <stddef.h>
#include <stdint.h>

struct p2p_rate {
    double bytes_per_s; /* 0: unlimited */
    double burst;       /* bucket size in bytes */
    double tokens;      /* may go negative (debt) */
    uint64_t last_ns;
};

/* mbps: megabits per second (10^6 bit/s); 0 or less means unlimited. The
 * bucket holds P2P_RATE_BURST_S of traffic (100 ms); _burst sets that
 * (pacing just under a link's rate wants a short one: see
 * p2p_ctx_set_pacing). */
#define P2P_RATE_BURST_S 0.1
void p2p_rate_init(struct p2p_rate *r, double mbps, uint64_t now_ns);
void p2p_rate_init_burst(struct p2p_rate *r, double mbps, double burst_s, uint64_t now_ns);
int p2p_rate_limited(const struct p2p_rate *r);
/* Refills for the time elapsed and returns how many bytes may go now
 * (SIZE_MAX when unlimited, 0 when the bucket is empty or in debt). */
size_t p2p_rate_available(struct p2p_rate *r, uint64_t now_ns);
void p2p_rate_consume(struct p2p_rate *r, size_t n);
/* Milliseconds until at least `want` bytes (capped at the burst) are
 * available; 0 when they are now. */
uint64_t p2p_rate_wait_ms(struct p2p_rate *r, size_t want, uint64_t now_ns);

#endif
