/* Choosing a relay (docs/p2p.md, "Relays in the agent"; seed
 * 000_02cc6b5d62a616fc.txt §3.3, technique 2): the entries relays put
 * under "<run>/relays" and the order an unreachable agent tries them in.
 * Pure: relay_keep.c reads the DHT and measures, this decides. */
#ifndef PEER_RELAY_RANK_H
#define PEER_RELAY_RANK_H

#include <stddef.h>
#include <stdint.h>

#include "agent/peer/runtime.h"
#include "cm_crypto.h"

#define PEER_RELAY_LOAD_MAX 65535u

struct peer_relay_cand {
    uint8_t pub[CM_ED25519_PUB_LEN];
    char addr[PEER_ADDR_MAX]; /* "ip:port" (a volunteer's) or "host:port" (a backbone's) */
    unsigned load;            /* reservations it holds, as its entry said (0: none or not said) */
    int backbone;             /* the coordinator's node: the last resort */
    double mbps;              /* throughput we measured to it; 0: not measured */
    double rtt_ms;            /* round trip; >= 1e9: unknown */
    /* set by peer_relay_rank */
    int tier_, bucket_;
    uint64_t tie_;
};

/* A relay's entry: "ip:port", "ip:port n=LOAD" (LOAD 0..65535: the
 * reservations it holds) or "host:port backbone", the address shorter
 * than PEER_ADDR_MAX. Fills addr, load and backbone of c; 0, or -1 when
 * the value is none of these. */
int peer_relay_entry_parse(const uint8_t *val, size_t len, struct peer_relay_cand *c);
/* The entry a volunteer relay puts: "<state host> n=<load>". */
void peer_relay_entry_format(char *out, size_t cap, const char *st_addr, unsigned load);

/* Orders candidates best first: volunteers before the backbone; measured
 * throughput before round trips alone; then the share of the relay a new
 * client would get, throughput / (1 + load) (or round trip x (1 + load)),
 * compared in steps of 25 % (throughput) or half an octave (round trip),
 * so that measurement noise does not decide; equal ones in an order of
 * their own for each client (a hash of the client's key and the relay's),
 * so that agents arriving together, who all read the same entries, spread
 * over the relays instead of all taking the first. */
void peer_relay_rank(struct peer_relay_cand *c, size_t n, const uint8_t self[CM_ED25519_PUB_LEN]);

#endif
