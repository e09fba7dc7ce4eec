/* The values of the stage agents' DHT records (docs/protocol.md, "DHT
 * records of stage agents"): pure, bounded parsers of bytes other agents
 * wrote, fuzzed by tests/fuzz/fuzz_pipe_records.c. */
#ifndef AGENT_PIPE_RECORDS_H
#define AGENT_PIPE_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "agent/peer/runtime.h"

/* "MSG_ADDR AR_ADDR": two addresses p2p_addr_parse takes, one space, each
 * shorter than PEER_ADDR_MAX. CM_OK with st and ar set, or CM_EPARSE. */
int pipe_peers_parse(const uint8_t *v, size_t len, char st[PEER_ADDR_MAX], char ar[PEER_ADDR_MAX]);

/* "HAD_VERSION HAD_STAGE DONE" written for assignment `version` of a run
 * of S stages: canonical decimals (what "%lld %d %lld" prints), 0 <=
 * HAD_VERSION < version, -1 <= HAD_STAGE < S, 0 <= DONE. CM_OK or
 * CM_EPARSE. */
int pipe_ready_parse(const uint8_t *v, size_t len, int64_t version, uint32_t S, int64_t *had_version,
                     int *had_stage, int64_t *done);

#endif
