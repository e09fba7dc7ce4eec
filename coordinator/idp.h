/* External identity provider: the coordinator is configured with a
 * provider's name and its OpenID-Connect-style userinfo URL. A volunteer
 * presents the provider's access token; the coordinator asks the provider
 * who it is (GET userinfo with "Authorization: Bearer <token>", libcurl,
 * with deadlines and a size limit) and maps the answer to an account,
 * creating a volunteer account on first login (the allowlist still decides
 * who gets a pass). */
#ifndef COORD_IDP_H
#define COORD_IDP_H

#include <stdint.h>

#include "cm_token.h"
#include "coordinator/server.h"

struct coord_idp_identity {
    char subject[256];
    char username[CM_NAME_MAX + 1];
};

/* CM_OK; CM_EAUTH when the provider rejects the token (401/403);
 * CM_ECONN/CM_ETIMEOUT when it cannot be reached; CM_EPARSE when its
 * answer lacks a usable "sub" or username. */
int coord_idp_userinfo(const struct coord_config *cfg, const char *token,
                       struct coord_idp_identity *out);

/* Finds or creates the account for (provider, subject). CM_EEXISTS when a
 * new identity's username is already a different account; CM_EPERM when the
 * account is disabled. */
int coord_idp_map(struct coord_req *req, const char *provider, const struct coord_idp_identity *id,
                  int64_t *uid, char username[CM_NAME_MAX + 1], char role[16]);

#endif
