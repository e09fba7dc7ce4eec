/* The coordinator's revocation list on the peer side (seed 000, Appendix
 * H.4; docs/protocol.md, "Revocation list"): a pure parser of the JSON
 * document, and a refresher thread that fetches
 *     GET {coordinator}/api/v1/runs/{run}/revocations
 * with libcurl every interval (TLS verified against a pinned CA file when
 * given, a deadline on every fetch, a cap on the body) and installs the list
 * into a struct p2p_auth, so revoked passes are refused by every host of
 * the process. A failed fetch keeps the previous list and is logged. */
#ifndef P2P_REVOKE_H
#define P2P_REVOKE_H

#include <stddef.h>
#include <stdint.h>

#include "p2p/p2p_envelope.h"

#define P2P_REVOKE_MAX_ENTRIES 100000
#define P2P_REVOKE_MAX_BODY (8u << 20)

struct p2p_revocations {
    char **pass_ids; /* owned */
    size_t n;
    int64_t generated_at;
};

/* Pure parser: {"run","generated_at","revoked":[{"pass_id","revoked_at",
 * "expires_at"}]}. Rejects a document for another run (CM_EAUTH), missing or
 * mistyped fields, pass ids longer than CM_PASS_ID_MAX, more than
 * P2P_REVOKE_MAX_ENTRIES entries (CM_EPARSE / CM_ETOOBIG). */
int p2p_revocations_parse(const char *json, size_t len, const char *run,
                          struct p2p_revocations *out);
void p2p_revocations_cleanup(struct p2p_revocations *r);

struct p2p_revoke_config {
    const char *coordinator_url; /* "https://host:port" (http:// accepted for tests) */
    const char *run;
    const char *ca_file;         /* NULL: system CAs */
    uint32_t interval_s;         /* 0: 60 */
    uint32_t timeout_ms;         /* 0: 10000, whole fetch */
};

/* One fetch-and-install, in the calling thread. */
int p2p_revoke_fetch(struct p2p_auth *auth, const struct p2p_revoke_config *cfg);

struct p2p_revoke_refresher;
/* Fetches once now (its result is returned, but the thread starts either
 * way), then every interval until stopped. Strings are copied. */
int p2p_revoke_refresher_start(struct p2p_auth *auth, const struct p2p_revoke_config *cfg,
                               struct p2p_revoke_refresher **out);
void p2p_revoke_refresher_stop(struct p2p_revoke_refresher *r);

#endif
