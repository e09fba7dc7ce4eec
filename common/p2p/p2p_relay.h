/* Circuit relays (seed 000_02cc6b5d62a616fc.txt, section 3.3, technique 2;
 * docs/protocol.md "Relays"; docs/p2p.md "Relays").
 *
 * A peer behind NAT cannot accept connections. A publicly reachable peer
 * (the relay, R) lends it a port: the NAT'ed peer (X) reserves one with
 * RELAY_RESERVE, then keeps a RELAY_WAIT request open at R (R answers it
 * when someone connects, or empty after a while; X asks again at once).
 * A connection that arrives at the lent port is a circuit: R announces its
 * id in the WAIT answer, X opens a fresh connection to R and sends
 * RELAY_ACCEPT with that id, and once R has answered, R forwards bytes
 * between the two connections unchanged. X then serves the frames on its
 * connection exactly as if the dialer had connected to it: the dialer
 * addresses X's key, X signs its answers, sessions are negotiated between
 * the two ends. R forwards sealed frames: it can drop or delay them, and
 * could read them as any router on the path could (frames are
 * authenticated, not encrypted), but it can forge, alter or replay nothing
 * without the receiving end dropping the connection.
 *
 * Nothing changes for the dialer: X announces "relay's address : lent
 * port" and every peer talks to it there with the ordinary transport.
 *
 * Limits (struct p2p_relay_limits) bound what a relay lends: reservations
 * in all and per key, circuits in all and per dialing address, circuits
 * waiting for their accept per reservation, how long a circuit may wait for it. Relayed bytes count
 * against the relay's own upload and download caps (they cross its link
 * twice). */
#ifndef P2P_RELAY_H
#define P2P_RELAY_H

#include <stdint.h>
#include <sys/socket.h>

#include "p2p/p2p_transport.h"

struct p2p_relay_limits {
    uint32_t max_reservations; /* 0: 16 */
    uint32_t max_per_peer;     /* reservations one key may hold; 0: 4 */
    uint32_t max_circuits;     /* circuits of all reservations, waiting or spliced; 0: 128 */
    uint32_t max_pending;      /* circuits waiting for their accept, per reservation; 0: 8 */
    uint32_t max_per_ip;       /* circuits from one address, all reservations; 0: 48 */
    uint32_t accept_ms;        /* a circuit not accepted within this is closed; 0: 5000 */
    uint32_t wait_ms;          /* a WAIT with nothing to announce is answered empty after
                                  this; 0: 15000 */
    uint32_t idle_ms;          /* a reservation without a WAIT for this long is dropped;
                                  0: 20000 */
};

struct p2p_relay_stats {
    /* relay side */
    uint64_t reservations, reservations_refused, circuits, circuits_refused;
    uint64_t circuits_expired; /* not accepted in time */
    uint64_t bytes;            /* forwarded, both directions */
    uint32_t live_reservations, live_circuits;
    /* reserving side */
    uint64_t accepted, accept_failed;
};

/* Makes a listening host a relay (requests of types RELAY_* are served by
 * the transport). Lent ports are bound on the host's listening address.
 * CM_EINVAL when the host does not listen; calling it again changes the
 * limits. */
int p2p_host_relay_enable(struct p2p_host *h, const struct p2p_relay_limits *lim);

/* Reserving side: once reserved, cb(arg, CM_OK, advertised) with the
 * address that now leads to h (the relay's address with the lent port);
 * later, once, cb(arg, status, NULL) when the reservation is lost (the
 * relay went away, refused, or forgot it). A refusal at the start is
 * reported the same way (CM_EBUSY: the relay is full). After a loss the
 * host may reserve again, at this or another relay. One relay per host
 * at a time: CM_ESTATE while one is in use. */
typedef void (*p2p_relay_cb)(void *arg, int status, const struct sockaddr *advertised);
int p2p_host_relay_use(struct p2p_host *h, const struct sockaddr *relay,
                       const uint8_t relay_pub[32], uint32_t timeout_ms, p2p_relay_cb cb,
                       void *arg);
/* Stops using the relay; the callback is not called again. Circuits
 * already open stay until they close. */
void p2p_host_relay_drop(struct p2p_host *h);
/* 1 while h holds a reservation at a relay (peers can reach it there). */
int p2p_host_relay_active(const struct p2p_host *h);

void p2p_host_relay_stats(const struct p2p_host *h, struct p2p_relay_stats *out);

/* Hole punching (p2p_punch.c; seed 000 §3.3, technique 1): a direct TCP
 * connection between two peers behind NAT by simultaneous open, set up
 * through a path both have (the responder's relayed address). Both hosts
 * must know their public address (p2p_host_set_public_ip: what the
 * coordinator saw them at). p2p_host_punch asks the peer with key pub,
 * reached at target, and tries until timeout_ms; cb(arg, CM_OK, direct,
 * ms) once connected: from then on requests from h to target go over the
 * direct connection (when it dies, the next ones take the relay again);
 * otherwise cb(arg, error, NULL, ms) (CM_ETIMEOUT: the NATs did not let
 * the connection through, as a symmetric NAT does not; keep the relay).
 * A host serves PUNCH requests once it knows its public address. */
typedef void (*p2p_punch_cb)(void *arg, int status, const struct sockaddr *direct, int64_t ms);
int p2p_host_set_public_ip(struct p2p_host *h, const struct sockaddr *ip);
/* Our address on our own network (where a socket toward the coordinator
 * leaves from). Offered with each punch: two peers behind one router (the
 * same public address, where a punch would need the router to hairpin)
 * meet on that network instead: the responder listens there for a few
 * seconds and takes one connection, from the initiator's offered address. */
int p2p_host_set_local_ip(struct p2p_host *h, const struct sockaddr *ip);
int p2p_host_punch(struct p2p_host *h, const struct sockaddr *target, const uint8_t pub[32],
                   uint32_t timeout_ms, p2p_punch_cb cb, void *arg);
/* Peers with an open connection of h that a punch made, as initiator or
 * responder (either or both): the peers that reach it (or that it reaches)
 * directly through NAT, or on the network behind the same router. Loop
 * thread. */
size_t p2p_host_punched(const struct p2p_host *h);
/* Whether h holds an open connection that its punch to `target` made (the
 * hole is still there). Loop thread. */
int p2p_host_punched_to(const struct p2p_host *h, const struct sockaddr *target);

#endif
