/* Accounts and sessions: argon2id password hashes, bearer session tokens
 * (random 32 bytes; the database keeps only their SHA-256), login
 * throttling, and role checks. */
#ifndef COORD_AUTH_H
#define COORD_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "coordinator/server.h"

#define COORD_PASSWORD_MIN 8
#define COORD_PASSWORD_MAX 1024
#define COORD_HASH_MAX 160
#define COORD_SESSION_PREFIX "cts_"

/* argon2id, t=2, m=19 MiB, p=1 (OWASP's minimum), 16-byte random salt. */
int coord_password_hash(const char *password, char out[COORD_HASH_MAX]);
/* CM_OK when it matches, CM_EAUTH when not. */
int coord_password_verify(const char *encoded, const char *password);

/* Creates a session for user_id; token_out receives "cts_<b64url>". */
int coord_session_create(struct coord_db_conn *db, int64_t user_id, long ttl_s,
                         char token_out[64], int64_t *expires_at);

/* Authenticates "Authorization: Bearer <token>"; fills req->user and
 * returns 1, or sets a 401 and returns 0. */
int coord_auth_bearer(struct coord_req *req, struct coord_resp *resp, const char *authz);

/* Evicts a session from this coordinator's short-lived session cache. */
void coord_session_forget(const uint8_t hash[32]);

/* Appends a row to the audit log (in the caller's transaction when open). */
int coord_audit(struct coord_req *req, const char *action, const char *target, json_t *details);

/* Creates a local account (create-user, POST /users). CM_EEXISTS when taken. */
int coord_user_create(struct coord_db_conn *db, const char *username, unsigned role,
                      const char *password, int64_t *id_out);

#endif
