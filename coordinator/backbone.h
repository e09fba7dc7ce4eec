/* The coordinator's DHT backbone (seed 000 §3.3, H.4; seed 002 §3.3): for
 * every open run, a Kademlia node in its own thread that new peers bootstrap
 * from. A manager thread keeps the set in step with the runs table every
 * few seconds: starts nodes for newly opened runs (bootstrapping from the
 * other coordinators' nodes of the same run), stops them for runs no longer
 * open, feeds each node's receivers the run's revocation list, re-mints the
 * nodes' own access tokens before they expire, and records the nodes'
 * addresses in dht_backbones so that every coordinator's passes list them.
 *
 * The nodes use their own Ed25519 key (DATA-DIR/dht-ed25519.pem), not the
 * coordinator's signing key, and a token the coordinator signs for it with
 * username "_coordinator". */
#ifndef COORD_BACKBONE_H
#define COORD_BACKBONE_H

#include <sys/socket.h>

#include "cm_crypto.h"
#include "coordinator/server.h"

struct coord_backbone;

/* Starts the manager (which starts the nodes). CM_OK also when the DHT is
 * disabled (--dht-port -1): then *out is NULL. */
int coord_backbone_start(struct coord_server *srv, struct coord_backbone **out);
void coord_backbone_stop(struct coord_backbone *b);
/* Wakes the manager now (a run was created or its status changed). */
void coord_backbone_poke(void);

/* Dial-back (docs/p2p.md, "Reachability"): the run's backbone node pings
 * every address, each answered only by the holder of pub (dht_ping).
 * CM_ENOTFOUND when this coordinator runs no node for the run (not open,
 * DHT disabled, or not started yet). Any thread; blocks up to timeout_ms
 * plus a margin. */
int coord_backbone_dialback(const char *run, const struct sockaddr_storage *addrs, size_t naddrs,
                            const uint8_t pub[CM_ED25519_PUB_LEN], uint32_t timeout_ms, int *status,
                            uint32_t *ms);

/* Which servers declare each expert of a dmoe run's grid now (docs/experts.md,
 * "The experts page"): the run's backbone node reads every leaf key of the
 * grid (moe_dht_get_prefix; up to COORD_MOE_MAX_LEAVES keys, each within
 * what is left of deadline_ms, 2 s at most). *out: an array, in grid
 * order, of {"uid", "servers": [{"addr", "peer" (base64url key),
 * "expires_in_s"}]}, uids without a live declaration absent; *complete 0 when a read failed or the deadline cut
 * the reads short. CM_ENOTFOUND: no node for the run here; CM_ERANGE: a
 * grid of more leaf keys. Any thread; blocks. */
#define COORD_MOE_MAX_LEAVES 256
struct moe_grid;
int coord_backbone_moe_servers(const char *run, const struct moe_grid *g, uint32_t deadline_ms, json_t **out,
                               int *complete);

/* The run's fresh backbone addresses ("host:port"), from every coordinator
 * of the database, as a JSON array (owned by the caller). Cached briefly. */
json_t *coord_backbone_bootstrap(struct coord_req *req);

#endif
