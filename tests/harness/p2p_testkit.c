/* Test helpers for p2p and dht tests (see p2p_testkit.h). */
#include "tests/harness/p2p_testkit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"

int p2p_tk_init(struct p2p_tk *tk, const char *run)
{
    memset(tk, 0, sizeof *tk);
    int rc = cm_ed25519_generate(&tk->coord);
    if (rc)
        return rc;
    memcpy(tk->coord_pub[0], tk->coord.pub, CM_ED25519_PUB_LEN);
    snprintf(tk->run, sizeof tk->run, "%s", run);
    return CM_OK;
}

void p2p_tk_cleanup(struct p2p_tk *tk)
{
    cm_ed25519_cleanup(&tk->coord);
}

int p2p_tk_peer_new_ex(struct p2p_tk *tk, const char *user, const char *pass_id, const char *run,
                       int64_t iat, int64_t exp, struct p2p_tk_peer *p)
{
    memset(p, 0, sizeof *p);
    int rc = cm_ed25519_generate(&p->key);
    if (rc)
        return rc;
    struct cm_pass_claims c = {.version = 1, .issued_at = iat, .expires_at = exp};
    snprintf(c.username, sizeof c.username, "%s", user);
    snprintf(c.run, sizeof c.run, "%s", run);
    snprintf(c.pass_id, sizeof c.pass_id, "%s", pass_id);
    memcpy(c.peer_public_key, p->key.pub, CM_ED25519_PUB_LEN);
    return cm_token_sign(&tk->coord, &c, &p->token);
}

int p2p_tk_peer_new(struct p2p_tk *tk, const char *user, const char *pass_id, int64_t ttl_s,
                    struct p2p_tk_peer *p)
{
    int64_t now = (int64_t)time(NULL);
    return p2p_tk_peer_new_ex(tk, user, pass_id, tk->run, now - 60, now + ttl_s, p);
}

void p2p_tk_peer_cleanup(struct p2p_tk_peer *p)
{
    cm_ed25519_cleanup(&p->key);
    free(p->token);
    p->token = NULL;
}

struct p2p_auth_config p2p_tk_auth_config(struct p2p_tk *tk)
{
    struct p2p_auth_config a = {.run = tk->run,
                                .coord_keys = (const uint8_t(*)[CM_ED25519_PUB_LEN])tk->coord_pub,
                                .n_coord_keys = 1};
    return a;
}
