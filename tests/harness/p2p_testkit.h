/* Test helpers for the p2p and dht tests: a throwaway coordinator key, peers
 * with keys and minted access tokens, and an auth config for a run. */
#ifndef P2P_TESTKIT_H
#define P2P_TESTKIT_H

#include <stdint.h>

#include "cm_crypto.h"
#include "cm_token.h"
#include "p2p/p2p_envelope.h"

struct p2p_tk_peer {
    struct cm_ed25519 key;
    char *token;
};

struct p2p_tk {
    struct cm_ed25519 coord;
    uint8_t coord_pub[1][CM_ED25519_PUB_LEN];
    char run[CM_NAME_MAX + 1];
};

int p2p_tk_init(struct p2p_tk *tk, const char *run);
void p2p_tk_cleanup(struct p2p_tk *tk);
/* Mints a token for a fresh key: valid from now-60 s to now+ttl_s. */
int p2p_tk_peer_new(struct p2p_tk *tk, const char *user, const char *pass_id, int64_t ttl_s,
                    struct p2p_tk_peer *p);
/* Mints with explicit claims times and run (for expired / wrong-run tokens). */
int p2p_tk_peer_new_ex(struct p2p_tk *tk, const char *user, const char *pass_id, const char *run,
                       int64_t iat, int64_t exp, struct p2p_tk_peer *p);
void p2p_tk_peer_cleanup(struct p2p_tk_peer *p);
struct p2p_auth_config p2p_tk_auth_config(struct p2p_tk *tk);

#endif
