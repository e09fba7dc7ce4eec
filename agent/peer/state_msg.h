/* The state-transfer messages (PEER_MSG_STATE, docs/protocol.md "State
 * transfer"): pure, bounded encoders and parsers of the network bytes,
 * shared by the serving and the fetching side and fuzzed
 * (tests/fuzz/fuzz_state_msg.c). */
#ifndef AGENT_PEER_STATE_MSG_H
#define AGENT_PEER_STATE_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define PEER_STATE_REQ_LEN 20
#define PEER_STATE_HDR_LEN 49
#define PEER_STATE_MAX_TOTAL ((uint64_t)1 << 36) /* largest snapshot accepted */

struct peer_state_req {
    int64_t min_step;
    uint64_t offset;
    uint32_t max_len;
};

struct peer_state_resp {
    int ready;                       /* 0: not yet, ask again */
    int64_t step;
    uint64_t total;                  /* snapshot length */
    uint8_t sha[CM_SHA256_LEN];      /* of the whole snapshot */
    const uint8_t *data;             /* into the parsed buffer */
    size_t len;
};

void peer_state_req_encode(const struct peer_state_req *q, uint8_t out[PEER_STATE_REQ_LEN]);
/* CM_EPROTO on a wrong length, CM_EINVAL on a negative step or max_len 0. */
int peer_state_req_parse(const uint8_t *b, size_t len, struct peer_state_req *out);
/* Writes the header (the caller appends the bytes). */
void peer_state_resp_header(const struct peer_state_resp *r, uint8_t out[PEER_STATE_HDR_LEN]);
/* CM_EPROTO when short, `ready` not 0/1, a ready answer with a negative
 * step, a zero or oversized total, or bytes beyond the total, or a "not
 * yet" answer carrying bytes. */
int peer_state_resp_parse(const uint8_t *b, size_t len, struct peer_state_resp *out);

#endif
