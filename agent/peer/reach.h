/* Address discovery and reachability (docs/p2p.md, "Reachability";
 * issue 17; seed 000_02cc6b5d62a616fc.txt §3.3 and Appendix D: most
 * volunteers sit behind NAT). The runtime's net stage asks the coordinator
 * to dial back the ports it listens on (POST /api/v1/runs/{run}/reachability):
 * the answer is the address the coordinator sees us at and whether the
 * holder of our key answered there on every port. */
#ifndef AGENT_PEER_REACH_H
#define AGENT_PEER_REACH_H

#include <jansson.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/client.h"
#include "cm_crypto.h"

enum peer_reach {
    PEER_REACH_UNKNOWN = 0, /* not checked (the coordinator could not say) */
    PEER_REACH_DIRECT,      /* dial-back reached every port at the observed address */
    PEER_REACH_CLIENT,      /* not reachable: sends and receives, accepts nothing */
    PEER_REACH_FLAG_CLIENT, /* --client-mode */
    PEER_REACH_FLAG_ADDR,   /* --advertise-ip, taken as given */
    PEER_REACH_RELAYED,     /* not reachable, reached through a relay (docs/p2p.md "Relays") */
};
const char *peer_reach_name(enum peer_reach r);

#define PEER_REACH_MAX_PORTS 4

struct peer_reach_result {
    char observed_ip[64];
    int reachable;                       /* every port answered */
    size_t n;
    uint16_t port[PEER_REACH_MAX_PORTS];
    int ok[PEER_REACH_MAX_PORTS];
    char error[PEER_REACH_MAX_PORTS][64]; /* why not, as the coordinator said */
};

/* Asks the coordinator to dial back `ports` (1..4, nonzero). Retries a busy
 * coordinator (503) for up to deadline_ms; stops early with CM_ECANCELED when
 * *interrupted becomes nonzero. CM_OK with *out filled, or the failure (a
 * message on stderr for refusals). */
int peer_reach_check(const struct agent_client *c, const char *run, const uint8_t pub[CM_ED25519_PUB_LEN],
                     const uint16_t *ports, size_t n, uint32_t deadline_ms,
                     const volatile sig_atomic_t *interrupted, struct peer_reach_result *out);

/* The local address of the interface that routes to the URL's host (what a
 * public host announces when the coordinator cannot tell): connects a UDP
 * socket, sends nothing. CM_OK or an error. */
int peer_local_addr_towards(const char *url, char *out, size_t cap);

/* Pure: reads the coordinator's answer (tests, fuzzing). CM_EPARSE when a
 * field is missing, of the wrong type or out of bounds. */
int peer_reach_parse(const json_t *j, struct peer_reach_result *out);

#endif
