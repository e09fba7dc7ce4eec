/* Capability reports (docs/schedules.md; seed 000_02cc6b5d62a616fc.txt
 * §3.2): what this peer can do for the run's schedules (samples/s,
 * bandwidth after the volunteer's caps, inbound connections, and the
 * throughput measured to a few peers), posted to the coordinator. The
 * runtime's probe thread measures the pairs (caps.c). */
#ifndef AGENT_PEER_CAPS_H
#define AGENT_PEER_CAPS_H

#include <stddef.h>
#include <stdint.h>

#include "agent/client.h"
#include "cm_crypto.h"

#define PEER_CAPS_MAX_PAIRS 64 /* SCHED_MAX_LINKS: what the coordinator accepts */

#define PEER_CAPS_MAX_PUNCHED 4096 /* what the coordinator accepts */
struct peer_caps {
    double sps;                 /* samples/s on this device for the run's model; 0: none */
    double up_mbps, down_mbps;  /* after the volunteer's caps */
    int inbound;                /* accepts inbound connections */
    int failing;                /* the role's rounds in a row that averaged nothing (0: fine) */
    char reach[16];             /* "direct", "client", "relayed" or "unknown" (reach.h); "" = not said */
    char relay[64];             /* relayed: the relay's address ("ip:port") */
    char addr[64];              /* the address the coordinator saw us at, or --advertise-ip */
    char failing_why[160];      /* and why, when failing */
    int punched;                /* open connections a hole punch made (net_punch.c) */
    size_t n_pairs;
    struct {
        uint8_t pub[CM_ED25519_PUB_LEN];
        double mbps;            /* measured throughput from this peer to that one; 0: not
                                   measured (a round trip alone: pipeline stages) */
        double rtt_ms;          /* measured round trip (peer_net_rtt); 0: not measured */
    } pairs[PEER_CAPS_MAX_PAIRS];
};

/* POST /api/v1/runs/{run}/capabilities with the session of `coord`
 * (coordinator/api_sched.c; the report lives 120 s there: re-report every
 * ~60 s and whenever peer_caps_changed says so). CM_OK on 200; otherwise
 * the server's message is printed once per call and CM_EAUTH (401/403),
 * CM_ENOTFOUND (404), CM_ESTATE (409), CM_EINVAL (400) or the transport's
 * error is returned. The coordinator checks the caller's session and that
 * it holds a valid pass for the key. */
int peer_caps_report(const struct agent_client *coord, const char *run,
                     const uint8_t peer_pub[CM_ED25519_PUB_LEN], const struct peer_caps *c);

/* 1 when a figure moved by more than 20 % (or inbound / the set of pairs
 * changed), so the report is worth sending before its time. */
int peer_caps_changed(const struct peer_caps *old, const struct peer_caps *now);

#endif
