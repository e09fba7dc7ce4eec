/* Internal to agent/peer/: what the runtime's files share. Roles do not
 * include it. */
#ifndef AGENT_PEER_RUNTIME_INT_H
#define AGENT_PEER_RUNTIME_INT_H

#include "agent/peer/runtime.h"

/* The probe thread (caps.c), started at PEER_STAGE_PROBES. */
void *peer__probe_main(void *arg);

/* Relays (relay_keep.c): our addresses under addr_mu; one attempt to
 * reserve at a relay found in the DHT (avoid: a relay's key not to use,
 * backbone_ok: the coordinator's node may be the relay;
 * NULL: none); the keeper thread (lends ports when we are reachable, keeps
 * a relay when we are not), started by the net stage, stopped before it. */
void peer__set_addrs(struct peer_rt *rt, const char *my, const char *st);
int peer__relay_acquire(struct peer_rt *rt, const uint8_t *avoid, int backbone_ok);
void peer__relay_keeper_start(struct peer_rt *rt);
void peer__relay_keeper_stop(struct peer_rt *rt);

#endif
