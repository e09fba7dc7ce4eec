/* Throughput probes (docs/protocol.md, "Throughput probes"; docs/schedules.md,
 * "Measured links"), shared by the agents' state hosts and the
 * coordinator's backbone nodes:
 *
 *   P2P_MSG_PROBE       request body: 1 to P2P_PROBE_CHUNK bytes, read and
 *                       dropped; empty response. The sender times its
 *                       acknowledged bytes: its upload to the responder.
 *   P2P_MSG_PROBE_PULL  request body: 4 bytes, big-endian, the number of
 *                       bytes wanted (1 to P2P_PROBE_CHUNK); response body:
 *                       that many bytes (zeros). The requester times them:
 *                       its download from the responder.
 *
 * A responder serves a bounded number of probers at a time (below): a
 * probe from another peer while every slot is held gets CM_EBUSY. */
#ifndef P2P_PROBE_H
#define P2P_PROBE_H

#include <stddef.h>
#include <stdint.h>

#define P2P_MSG_PROBE 49
#define P2P_MSG_PROBE_PULL 50
#define P2P_PROBE_CHUNK (128u * 1024u)
#define P2P_PROBE_HOLD_MS 1500

/* Pure: the PROBE_PULL request. CM_OK with *want, or CM_EPARSE (not 4
 * bytes) / CM_ERANGE (0 or over P2P_PROBE_CHUNK). */
int p2p_probe_pull_parse(const uint8_t *body, size_t len, uint32_t *want);
void p2p_probe_pull_encode(uint32_t want, uint8_t out[4]);

/* Who may probe now: up to `slots` probers at once (agents' state hosts: 1,
 * two probes sharing a volunteer's link would each read a part of it; the
 * backbone: a few, its link is usually far fatter than any volunteer's).
 * A prober keeps its slot while its messages come less than
 * P2P_PROBE_HOLD_MS apart. CM_OK, or CM_EBUSY. Not thread-safe (one loop). */
#define P2P_PROBE_MAX_SLOTS 16
struct p2p_probe_hold {
    unsigned slots; /* 0 counts as 1 */
    struct {
        uint8_t pub[32];
        int64_t last_ms;
        int used;
    } s[P2P_PROBE_MAX_SLOTS];
};
int p2p_probe_admit(struct p2p_probe_hold *h, const uint8_t from[32], int64_t now_ms);

#endif
