/* Probes of the peer-to-peer links (docs/schedules.md, "Measured links";
 * net.h): pairwise throughput against another peer's state host, the link's
 * own rate against the backbone, and a pair's round trip. They run as jobs
 * of the network thread (net.c) from the caller's thread. */
#include "agent/peer/net_int.h"
#include "cm_err.h"
#include "p2p/p2p_transport.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_WINDOW_MAX 64

/* A probe in either direction (pull: the peer sends, P2P_MSG_PROBE_PULL),
 * with up to `window` messages of msg bytes in flight; `adaptive`: starting
 * with 2 and growing to about 50 ms of the rate measured so far, so a slow
 * link never holds seconds of probe queued in front of the collaboration's
 * messages (a 2 Mbit/s uploader with 2 MiB in flight held its DHT records
 * back 8 s and missed its rounds), and a fast one still fills. */
static int probe_run(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN], int pull,
                     size_t msg, size_t window, int adaptive, size_t bytes, uint32_t budget_ms, uint32_t deadline_ms,
                     const int *busy, const int *stop, double *mbps)
{
    struct sockaddr_storage sa;
    *mbps = 0;
    if (p2p_addr_parse(addr, &sa) != CM_OK || bytes == 0 || bytes > 512u * PEER_PROBE_CHUNK || window < 1 ||
        window > PROBE_WINDOW_MAX || msg < 1 || msg > PEER_PROBE_CHUNK)
        return CM_EINVAL;
    /* one small request first, so the connection (and its handshake) is
       not part of the measurement */
    uint8_t one[4] = {0}, *r = NULL;
    size_t rl = 0;
    if (pull)
        p2p_probe_pull_encode(1, one);
    int rc = net__request(n, &sa, pub, pull ? P2P_MSG_PROBE_PULL : PEER_MSG_PROBE, one, pull ? 4 : 1, 10000, &r,
                         &rl);
    free(r);
    if (rc != CM_OK)
        return rc;
    /* Then messages of `msg` bytes, `cur` in flight (the round trip is
       hidden behind the next one): two for pair probes, and for link probes
       from two up to about 50 ms of the rate so far, so what a capped link
       holds queued stays small and the collaboration's own messages are not
       held up for seconds behind a probe on a slow link.

       Only quiet time counts. While *busy (this peer averages or moves
       state), the link carries the collaboration's traffic and a probe
       would read what is left of it: no new chunk goes out, the chunks in
       flight are not counted, and the probe waits. Each quiet spell starts
       with the link idle, so its first PROBE_SETTLE_MS go out in a burst
       (a token bucket's, a shaper's, the socket buffers'): a spell's
       measured segment leaves them out (quiet spells of 0.5 s read a 40
       Mbit/s cap as 71 Mbit/s with the burst in) and ends with the spell's
       last acknowledgement. Pair probes (two chunks in flight, often in
       the short quiet spells of a busy collaboration) start the segment
       when the first chunk sent PROBE_SETTLE_MS or more into the spell is
       handed to the transport, and count it: starting at an
       acknowledgement would let a late one (the peer's loop busy for a
       moment, then two answers at once) shorten the segment, and a 4
       Mbit/s cap once read 6.7 Mbit/s that way; from a send, the segment is
       never shorter than the transfers it counts, so the reading errs low,
       by at most the one chunk queued ahead. Link probes (up to 64 in
       flight, where that queue is long, in one long quiet spell at
       start-up) start at the first acknowledgement after PROBE_SETTLE_MS
       and count what is acknowledged after it. The rate is the bytes of the
       segments over their time. The probe ends when `bytes` are counted, budget_ms of segments
       are measured, or deadline_ms have passed (no reading when nothing was
       measured). */
    const int64_t PROBE_SETTLE_MS = 150;
    struct job *win[PROBE_WINDOW_MAX] = {0}; /* in flight, oldest at win[h] */
    int dirty[PROBE_WINDOW_MAX] = {0};       /* sent, or acknowledged, outside the quiet spell */
    int64_t sent_at[PROBE_WINDOW_MAX] = {0}; /* when each was handed to the transport */
    size_t counted = 0, seg_bytes = 0, h = 0, nin = 0, cur = adaptive ? 2 : window, acked = 0;
    int64_t t_start = p2p_now_ms(), spell_t0 = -1, seg_t0 = -1, seg_t1 = -1, measured = 0;
    for (;;) {
        int64_t now = p2p_now_ms();
        int quiet = !busy || !__atomic_load_n(busy, __ATOMIC_ACQUIRE);
        if (!quiet) {
            /* the spell ended: close its segment, taint what is in flight */
            if (seg_t0 >= 0 && seg_t1 > seg_t0) {
                counted += seg_bytes;
                measured += seg_t1 - seg_t0;
            }
            spell_t0 = seg_t0 = seg_t1 = -1;
            seg_bytes = 0;
            for (size_t k = 0; k < window; k++)
                dirty[k] = 1;
        }
        int more = rc == CM_OK && !(stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) &&
                   counted + seg_bytes < bytes &&
                   measured + (seg_t0 >= 0 ? now - seg_t0 : 0) < (int64_t)budget_ms &&
                   now - t_start < (int64_t)deadline_ms;
        while (quiet && more && nin < cur) {
            struct job *j = calloc(1, sizeof *j);
            if (!j || !(j->addrs = malloc(sizeof *j->addrs)) || !(j->value = calloc(1, pull ? 4 : msg))) {
                if (j)
                    free(j->addrs);
                free(j);
                rc = CM_ENOMEM;
                break;
            }
            j->kind = JOB_REQ;
            *j->addrs = sa;
            memcpy(j->peer_pub, pub, CM_ED25519_PUB_LEN);
            j->type = pull ? P2P_MSG_PROBE_PULL : PEER_MSG_PROBE;
            j->timeout_ms = 10000;
            j->len = pull ? 4 : msg;
            if (pull)
                p2p_probe_pull_encode((uint32_t)msg, j->value);
            if ((rc = net__enqueue(n, j)) != CM_OK) {
                net__release(n, j);
                break;
            }
            size_t at = (h + nin++) % window;
            win[at] = j;
            dirty[at] = 0;
            sent_at[at] = p2p_now_ms();
            if (spell_t0 < 0)
                spell_t0 = sent_at[at];
        }
        if (nin == 0) {
            if (!more)
                break;
            usleep(20000); /* busy: wait for a quiet spell */
            continue;
        }
        struct job *j = win[h];
        int64_t j_sent = sent_at[h];
        int jr = net__wait_job(n, j);
        /* bytes that crossed the link: ours, or the peer's answer */
        size_t len = pull ? (jr == CM_OK ? j->resp_len : 0) : j->len;
        if (pull && jr == CM_OK && len != msg)
            jr = CM_EPROTO;
        net__release(n, j);
        win[h] = NULL;
        int was_dirty = dirty[h] || (busy && __atomic_load_n(busy, __ATOMIC_ACQUIRE));
        h = (h + 1) % window;
        nin--;
        if (jr != CM_OK) {
            /* CM_EBUSY: another prober took the host while we were busy
               (its hold is PEER_PROBE_HOLD_MS); what we measured stands */
            rc = jr;
            continue; /* drain the other one */
        }
        int64_t t = p2p_now_ms();
        acked += len;
        if (adaptive && t - t_start >= 50) {
            double per_ms = (double)acked / (double)(t - t_start);
            size_t want = (size_t)(per_ms * 50 / (double)msg) + 1;
            cur = want < 2 ? 2 : want > window ? window : want;
        }
        if (!was_dirty && spell_t0 >= 0) {
            if (seg_t0 >= 0) {
                seg_bytes += len;
                seg_t1 = t;
            } else if (!adaptive && j_sent - spell_t0 >= PROBE_SETTLE_MS) {
                seg_t0 = j_sent; /* pair probes: from this chunk's send, counted */
                seg_bytes += len;
                seg_t1 = t;
            } else if (adaptive && t - spell_t0 >= PROBE_SETTLE_MS) {
                seg_t0 = t; /* link probes: from this acknowledgement, not counted */
            }
        }
    }
    if (seg_t0 >= 0 && seg_t1 > seg_t0) {
        counted += seg_bytes;
        measured += seg_t1 - seg_t0;
    }
    if (rc != CM_OK && !(rc == CM_EBUSY && counted > 0 && measured > 0))
        return rc;
    if (counted == 0 || measured <= 0)
        return CM_ETIMEOUT; /* never quiet long enough to measure */
    *mbps = (double)counted * 8 / 1e6 / ((double)measured / 1000.0);
    return CM_OK;
}

int peer_net_probe(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN],
                   size_t bytes, uint32_t budget_ms, uint32_t deadline_ms, const int *busy,
                   const int *stop, double *mbps)
{
    return probe_run(n, addr, pub, 0, 32u * 1024u, 2, 0, bytes, budget_ms, deadline_ms, busy, stop, mbps);
}

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int peer_net_rtt(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN], int count,
                 double *rtt_ms)
{
    struct sockaddr_storage sa;
    *rtt_ms = 0;
    if (p2p_addr_parse(addr, &sa) != CM_OK || count < 1 || count > 16)
        return CM_EINVAL;
    double best = -1;
    int rc = CM_OK;
    /* one more than counted: the first may open the connection (a TCP and
       session handshake), which is not the path's round trip */
    for (int i = 0; i <= count; i++) {
        uint8_t *r = NULL;
        size_t rl = 0;
        double t0 = mono_ms();
        rc = net__request(n, &sa, pub, P2P_MSG_PING, NULL, 0, PEER_RTT_TIMEOUT_MS, &r, &rl);
        double dt = mono_ms() - t0;
        free(r);
        if (rc != CM_OK)
            break;
        if (i > 0 && (best < 0 || dt < best))
            best = dt;
    }
    if (best < 0)
        return rc != CM_OK ? rc : CM_ETIMEOUT;
    *rtt_ms = best;
    return CM_OK;
}

int peer_net_link_probe(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN], int down,
                        size_t bytes, uint32_t budget_ms, uint32_t deadline_ms, const int *busy,
                        const int *stop, double *mbps)
{
    return probe_run(n, addr, pub, down, 32u * 1024u, PROBE_WINDOW_MAX, 1, bytes, budget_ms, deadline_ms, busy,
                     stop, mbps);
}

