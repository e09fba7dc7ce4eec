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
/* Evicts every cached session of user_id but `keep` (NULL: all). */
void coord_session_forget_user(int64_t user_id, const uint8_t keep[32]);

/* Appends a row to the audit log (in the caller's transaction when open). */
int coord_audit(struct coord_req *req, const char *action, const char *target, json_t *details);

/* Creates a local account (create-user, POST /users). CM_EEXISTS when taken. */
int coord_user_create(struct coord_db_conn *db, const char *username, unsigned role,
                      const char *password, int64_t *id_out);

/* What an account change did (coord_user_set_disabled, coord_user_sessions_end). */
struct coord_user_change {
    int64_t user_id;
    int changed;          /* the account was not in that state before / sessions were ended */
    long sessions_ended;  /* sessions deleted */
    long passes_revoked;  /* live passes revoked ("account disabled") */
};

/* Disables (or enables) the account `username` in one statement (in the
 * caller's transaction when open). Disabling deletes all its sessions and
 * revokes all its live passes, so they appear on every run's revocation
 * list; enabling restores logins, not passes. actor_id 0: the command line.
 * CM_ENOTFOUND when there is no such account. After the commit, the caller
 * evicts the user's cached sessions (coord_session_forget_user). */
int coord_user_set_disabled(struct coord_db_conn *db, const char *username, int disabled,
                            int64_t actor_id, struct coord_user_change *out);
/* Ends every session of `username` (the caller then evicts them from the
 * cache). CM_ENOTFOUND when there is no such account. */
int coord_user_sessions_end(struct coord_db_conn *db, const char *username,
                            struct coord_user_change *out);

#endif
