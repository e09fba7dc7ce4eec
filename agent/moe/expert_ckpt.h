/* An expert server's side of expert checkpoints (docs/checkpoints.md,
 * "Expert checkpoints"; seed 002_2b00836ea4b30f79.txt §3.3: servers leave,
 * their experts must not be lost): saving a hosted expert's state from the
 * running server (moe_server_save: between two batches) and uploading it to
 * the coordinator, and fetching the newest checkpoint of a uid, checking it
 * (common/moe/moe_ckpt.h) and loading it into the server. All calls block
 * on the coordinator (agent/client.h: every request has its timeouts);
 * call them from the role's main thread. */
#ifndef AGENT_MOE_EXPERT_CKPT_H
#define AGENT_MOE_EXPERT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "agent/client.h"
#include "ckpt/ckpt.h"
#include "agent/moe/moe_server.h"
#include "moe/moe_grid.h"

/* What a checkpoint was (uploaded or loaded). */
struct moe_xckpt_info {
    long step;               /* the expert's optimizer steps */
    char sha256[65];         /* the file's */
    char params_sha256[65];  /* of the parameter bytes (the same hash as the coordinator's) */
};

/* Saves expert uid (width C, hidden F) of srv to dir/expert-upload.ckpt and
 * PUTs it to /api/v1/runs/{run}/experts/{uid}/checkpoint. CM_OK when
 * stored (201) or already stored (200); CM_EPROTO with the coordinator's
 * message in err otherwise. */
int moe_xckpt_upload(const struct agent_client *coord, const char *run, const char *dir,
                     struct moe_server *srv, const char *uid, int C, int F, struct moe_xckpt_info *info,
                     char *err, size_t cap);

/* The uids of run that have a checkpoint (GET /api/v1/runs/{run}/experts),
 * parsed with grid; at most cap. */
int moe_xckpt_list(const struct agent_client *coord, const char *run, const struct moe_grid *grid,
                   struct moe_uid *uids, size_t cap, size_t *n);

/* Downloads the newest checkpoint of uid to dir/expert-download.ckpt,
 * checks it against the expert's layout and loads it into srv (which must
 * host uid already). CM_ENOTFOUND when the uid has none (nothing changed);
 * any failure leaves the expert as it was, with the reason in err. */
int moe_xckpt_load(const struct agent_client *coord, const char *run, const char *dir,
                   struct moe_server *srv, const char *uid, int C, int F, struct moe_xckpt_info *info,
                   char *err, size_t cap);

/* The two halves of moe_xckpt_load, so a server taking over a uid checks
 * the checkpoint before it hosts the expert: fetch downloads and checks
 * (*out owned on CM_OK: cm_ckpt_cleanup), apply loads a fetched checkpoint
 * into srv. */
int moe_xckpt_fetch(const struct agent_client *coord, const char *run, const char *dir, const char *uid,
                    int C, int F, struct cm_ckpt *out, struct moe_xckpt_info *info, char *err, size_t cap);
int moe_xckpt_apply(struct moe_server *srv, const char *uid, const struct cm_ckpt *c);

#endif
