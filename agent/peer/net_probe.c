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
 * with up to `window` messages of msg bytes in flight; grow_ms > 0: starting
 * with 2 and growing to about grow_ms of the rate measured so far, so a slow
 * link never holds seconds of probe queued in front of the collaboration's
 * messages (a 2 Mbit/s uploader with 2 MiB in flight held its DHT records
 * back 8 s and missed its rounds), and a fast one still fills; `adaptive`:
 * a link probe (one long quiet spell, segments from an acknowledgement). */
static int probe_run(struct peer_net *n, const char *addr, const uint8_t pub[CM_ED25519_PUB_LEN], int pull,
                     size_t msg, size_t window, int adaptive, uint32_t grow_ms, size_t bytes, uint32_t budget_ms,
                     uint32_t deadline_ms,
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
    size_t counted = 0, seg_bytes = 0, h = 0, nin = 0, cur = grow_ms ? 2 : window, acked = 0, spell_acked = 0;
    int64_t t_start = p2p_now_ms(), spell_t0 = -1, seg_t0 = -1, seg_t1 = -1, measured = 0;
    /* The other side's quiet counts too (push probes: a state host answers
       1 while it averages or moves state, docs/protocol.md). While it is
       busy, or not yet known to be quiet at the start of each spell of
       ours, only 1-byte polls go out, PROBE_POLL_MS apart, none counted,
       until one is answered 0 (or empty: the backbone's). Without this a
       fast peer done with its round probed a slow one still in it: the
       slow peer's round took up to the two chunks longer (64 KiB at 4
       Mbit/s: 130 ms) and the probe read what the round left of the link. */
    const int64_t PROBE_POLL_MS = 50;
    int far_busy = !pull;
    int64_t poll_at = 0;
    int poll[PROBE_WINDOW_MAX] = {0}; /* a poll, not a chunk */
    for (;;) {
        int64_t now = p2p_now_ms();
        int own_quiet = !busy || !__atomic_load_n(busy, __ATOMIC_ACQUIRE);
        if (!own_quiet && !pull)
            far_busy = 1; /* ask again when our round is over */
        int quiet = own_quiet && !far_busy;
        if (!quiet) {
            /* the spell ended: close its segment, taint what is in flight */
            if (seg_t0 >= 0 && seg_t1 > seg_t0) {
                counted += seg_bytes;
                measured += seg_t1 - seg_t0;
            }
            spell_t0 = seg_t0 = seg_t1 = -1;
            seg_bytes = spell_acked = 0;
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
            poll[at] = 0;
            sent_at[at] = p2p_now_ms();
            if (spell_t0 < 0)
                spell_t0 = sent_at[at];
        }
        if (own_quiet && far_busy && more && nin == 0 && now >= poll_at && rc == CM_OK) {
            struct job *j = calloc(1, sizeof *j);
            if (!j || !(j->addrs = malloc(sizeof *j->addrs)) || !(j->value = calloc(1, 1))) {
                if (j)
                    free(j->addrs);
                free(j);
                rc = CM_ENOMEM;
                break;
            }
            j->kind = JOB_REQ;
            *j->addrs = sa;
            memcpy(j->peer_pub, pub, CM_ED25519_PUB_LEN);
            j->type = PEER_MSG_PROBE;
            j->timeout_ms = 10000;
            j->len = 1;
            if ((rc = net__enqueue(n, j)) != CM_OK) {
                net__release(n, j);
                break;
            }
            size_t at = (h + nin++) % window;
            win[at] = j;
            dirty[at] = poll[at] = 1;
            sent_at[at] = p2p_now_ms();
        }
        if (nin == 0) {
            if (!more)
                break;
            usleep(own_quiet ? 10000 : 20000); /* busy: wait for a quiet spell */
            continue;
        }
        struct job *j = win[h];
        int64_t j_sent = sent_at[h];
        int jr = net__wait_job(n, j);
        /* bytes that crossed the link: ours, or the peer's answer */
        size_t len = pull ? (jr == CM_OK ? j->resp_len : 0) : j->len;
        if (pull && jr == CM_OK && len != msg)
            jr = CM_EPROTO;
        int said_busy = !pull && jr == CM_OK && j->resp_len >= 1 && j->resp[0] == 1;
        net__release(n, j);
        win[h] = NULL;
        int was_poll = poll[h];
        int was_dirty = dirty[h] || said_busy || (busy && __atomic_load_n(busy, __ATOMIC_ACQUIRE));
        if (said_busy) {
            far_busy = 1; /* the next pass closes the spell and taints the rest */
            poll_at = p2p_now_ms() + PROBE_POLL_MS;
        } else if (was_poll && jr == CM_OK) {
            far_busy = 0;
        }
        h = (h + 1) % window;
        nin--;
        if (jr != CM_OK) {
            /* CM_EBUSY: another prober took the host while we were busy
               (its hold is PEER_PROBE_HOLD_MS); what we measured stands */
            rc = jr;
            continue; /* drain the other one */
        }
        if (was_poll)
            continue;
        int64_t t = p2p_now_ms();
        acked += len;
        spell_acked += len;
        /* in flight: about grow_ms of the rate so far (link probes: since
           the start, one long quiet spell; pair probes: in this spell) */
        int64_t since = adaptive ? t_start : spell_t0;
        if (grow_ms && since >= 0 && t - since >= 20) {
            double per_ms = (double)(adaptive ? acked : spell_acked) / (double)(t - since);
            size_t want = (size_t)(per_ms * grow_ms / (double)msg) + 1;
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
                   double rtt_ms, size_t bytes, uint32_t budget_ms, uint32_t deadline_ms,
                   const int *busy, const int *stop, double *mbps)
{
    /* 8 KiB messages, in flight about the round trip + 20 ms of the rate:
       what is in flight when our next round starts goes out ahead of the
       round's own bytes (two 32 KiB chunks held a 4 Mbit/s peer's rounds
       130 ms longer, 2 of every 5 steps while it probed), and the window
       still covers the path's round trip on the Internet */
    double g = rtt_ms > 0 && rtt_ms < 2000 ? rtt_ms + 20 : 20;
    return probe_run(n, addr, pub, 0, 8u * 1024u, PROBE_WINDOW_MAX, 0, (uint32_t)g, bytes, budget_ms, deadline_ms,
                     busy, stop, mbps);
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
    return probe_run(n, addr, pub, down, 32u * 1024u, PROBE_WINDOW_MAX, 1, 50, bytes, budget_ms, deadline_ms, busy,
                     stop, mbps);
}

