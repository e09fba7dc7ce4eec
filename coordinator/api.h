/* REST handlers of the coordinator, one group per file, all wired in
 * routes.c. Each receives an authenticated request (per its route's roles)
 * and fills the response; none sees transport types. */
#ifndef COORD_API_H
#define COORD_API_H

#include "coordinator/server.h"

/* api_misc.c */
void api_health(struct coord_req *req, struct coord_resp *resp);
void api_time(struct coord_req *req, struct coord_resp *resp);
void api_openapi(struct coord_req *req, struct coord_resp *resp);
void api_metrics(struct coord_req *req, struct coord_resp *resp);
void api_keys(struct coord_req *req, struct coord_resp *resp);
/* api_session.c */
void api_session_create(struct coord_req *req, struct coord_resp *resp);
void api_session_delete(struct coord_req *req, struct coord_resp *resp);
void api_me(struct coord_req *req, struct coord_resp *resp);
void api_me_password(struct coord_req *req, struct coord_resp *resp);
void api_me_sessions_end(struct coord_req *req, struct coord_resp *resp);
/* api_users.c */
void api_users_create(struct coord_req *req, struct coord_resp *resp);
void api_users_list(struct coord_req *req, struct coord_resp *resp);
void api_users_update(struct coord_req *req, struct coord_resp *resp);
void api_users_sessions_end(struct coord_req *req, struct coord_resp *resp);
void api_audit_list(struct coord_req *req, struct coord_resp *resp);
/* api_runs.c */
void api_runs_list(struct coord_req *req, struct coord_resp *resp);
void api_runs_create(struct coord_req *req, struct coord_resp *resp);
void api_runs_get(struct coord_req *req, struct coord_resp *resp);
void api_runs_update(struct coord_req *req, struct coord_resp *resp);
void api_allowlist_list(struct coord_req *req, struct coord_resp *resp);
void api_allowlist_put(struct coord_req *req, struct coord_resp *resp);
void api_allowlist_delete(struct coord_req *req, struct coord_resp *resp);
/* api_passes.c */
void api_passes_create(struct coord_req *req, struct coord_resp *resp);
void api_passes_list(struct coord_req *req, struct coord_resp *resp);
void api_passes_revoke(struct coord_req *req, struct coord_resp *resp);
void api_revocations(struct coord_req *req, struct coord_resp *resp);
/* api_peer_keys.c: GET, and organizers' revoke and release, of one peer key */
void api_peer_key_get(struct coord_req *req, struct coord_resp *resp);
void api_peer_key_revoke(struct coord_req *req, struct coord_resp *resp);
void api_peer_key_release(struct coord_req *req, struct coord_resp *resp);
/* Inside the caller's transaction: blocks peer key pk (a row with no owner
 * when nobody holds it) and revokes its live passes in every run. *newly:
 * the key was not revoked before; *passes: how many passes this revoked. */
int api_peer_key_block(struct coord_req *req, const uint8_t pk[CM_ED25519_PUB_LEN], const char *reason,
                       int *newly, int *passes);
/* 1 when run params[0] exists, else 0 with 404 (or 500) set. Needs req->db. */
int api_run_known(struct coord_req *req, struct coord_resp *resp);
/* The one row stmt ($1 = run params[0]) returns for the run (the caller
 * PQclears it), or NULL with 404 (no row) or 500 set. Needs req->db. */
PGresult *api_run_row(struct coord_req *req, struct coord_resp *resp, struct coord_db_stmt *stmt);
/* Whether the caller holds a valid pass of run params[0] for peer key pk
 * (and is allowlisted, the run open); 1 with the ids, else 0 with the
 * error response set (404, 403 not_allowlisted or no_pass, 409). Needs
 * req->db. */
int api_peer_pass(struct coord_req *req, struct coord_resp *resp, const uint8_t pk[CM_ED25519_PUB_LEN],
                  char pass_id[24], char run_id[24]);

/* api_checkpoints.c */
extern const struct coord_stream_ops api_checkpoint_upload;
void api_checkpoints_list(struct coord_req *req, struct coord_resp *resp);
void api_checkpoints_get(struct coord_req *req, struct coord_resp *resp);
/* At start-up: removes upload temporaries no live upload holds and files
 * no checkpoint row names, in every run directory under dir. */
int coord_checkpoints_sweep(PGconn *pg, const char *dir);
/* ckpt_store.c, shared by both kinds of checkpoint (its header has the
 * upload mechanism): fsync of a directory (0 or -1); the
 * exclusive flock of a directory held from a row's insert to the last
 * unlink (an fd, or -1), released by coord__dir_unlock. */
int coord__fsync_dir(const char *dir);
int coord__dir_lock(const char *dir);
void coord__dir_unlock(int fd);

/* api_expert_ckpt.c: checkpoints of single experts of a dmoe run
 * (docs/checkpoints.md, "Expert checkpoints") */
extern const struct coord_stream_ops api_expert_ckpt_upload;
void api_expert_ckpt_get(struct coord_req *req, struct coord_resp *resp);
void api_expert_ckpt_list(struct coord_req *req, struct coord_resp *resp);
/* GET /runs/{run}/experts/servers: who declares each expert now (the DHT). */
void api_expert_servers(struct coord_req *req, struct coord_resp *resp);
/* At start-up, as coord_checkpoints_sweep for <dir>/<run>/experts/. */
int coord_expert_ckpt_sweep(PGconn *pg, const char *dir);

/* api_sched.c */
void api_schedule_get(struct coord_req *req, struct coord_resp *resp);
void api_schedules_list(struct coord_req *req, struct coord_resp *resp);
void api_schedules_get(struct coord_req *req, struct coord_resp *resp);
/* Queues run for the background solver in delay_ms (a burst of reports is
 * solved once); 0, or nonzero when the queue is full. */
int api_sched_enqueue(struct coord_server *srv, const char *run, double delay_ms);

/* api_pipeline.c: DT-FM pipeline schedules (seed 003 §3; docs/pipelines.md) */
#define API_PIPE_MAX_DEVICES 256 /* stages x replicas a coordinator solves for in a request */
void api_pipeline_get(struct coord_req *req, struct coord_resp *resp);
/* CM_OK when config has no "pipeline" object or a valid one (target_batch:
 * the run's, for the derived activation size; <= 0 when unknown); else
 * CM_EINVAL with a message naming the field in err. */
int api_pipeline_config_check(const json_t *config, long long target_batch, char *err,
                              size_t cap);
/* config.pipeline.liveness_s: how long a capability report of a pipeline
 * run lives, API_PIPE_MIN_LIVENESS_S to API_CAP_TTL_S (its default), so
 * that a stage agent that died stops being live sooner. */
#define API_PIPE_MIN_LIVENESS_S 10
/* The lifetime of a capability report for a run whose config.pipeline has
 * this liveness_s (NULL or anything but a valid one: API_CAP_TTL_S). */
int api_pipeline_liveness_s(const json_t *liveness);
/* api_pipeline_stages.c: GET /runs/{run}/pipeline/stages, the assignment the
 * stage agents run with their measured step times (the dashboard's page) */
void api_pipeline_stages(struct coord_req *req, struct coord_resp *resp);

/* api_caps.c: capability reports and the live peers (organizers, auditors) */
#define API_CAP_TTL_S 120   /* a capability report is live this long */
#define API_SETTLE_MS 5000  /* a report queues a background solve this much later */
void api_capabilities_post(struct coord_req *req, struct coord_resp *resp);
void api_peers_list(struct coord_req *req, struct coord_resp *resp);
/* base64url (no padding) of a 32-byte key; 1 when s is one. */
int api_key_param(const char *s, uint8_t key[CM_ED25519_PUB_LEN]);
/* The address the request came from as peers would dial it: an IPv4
 * client of a dual-stack listener (::ffff:a.b.c.d) as a.b.c.d. */
const char *api_peer_ip(const struct coord_req *req);

/* api_reach.c: dial-back reachability checks (docs/p2p.md, "Reachability") */
void api_reachability_post(struct coord_req *req, struct coord_resp *resp);

/* api_web.c: the dashboard's files and the logged-in user's own records */
void api_web_index(struct coord_req *req, struct coord_resp *resp);
void api_web_file(struct coord_req *req, struct coord_resp *resp);
void api_me_passes(struct coord_req *req, struct coord_resp *resp);
void api_me_sessions(struct coord_req *req, struct coord_resp *resp);
void api_leaderboard(struct coord_req *req, struct coord_resp *resp);
/* The built dashboard next to the binary (../web/dist in a build tree,
 * ../share/crowdtrain/web when installed) or in /usr/share/crowdtrain/web;
 * heap string, or NULL when none holds an index.html. */
char *coord_web_default_dir(void);

/* api_contrib.c, api_contrib_read.c: contribution accounting (docs/accounting.md) */
void api_reports_post(struct coord_req *req, struct coord_resp *resp);
void api_contrib_list(struct coord_req *req, struct coord_resp *resp);
void api_contrib_steps(struct coord_req *req, struct coord_resp *resp);
void api_contrib_flags(struct coord_req *req, struct coord_resp *resp);
void api_me_contrib(struct coord_req *req, struct coord_resp *resp);
void api_run_curve(struct coord_req *req, struct coord_resp *resp);
void api_run_stats(struct coord_req *req, struct coord_resp *resp);
/* api_contrib_experts.c: expert servers' credit added to those documents
 * (expert_samples, expert_samples_clipped on every row; rows for server
 * owners without reports appended). p: run, from, to, step_from, step_to
 * as for the totals. CM_OK or CM_EDB (req->db must be open). */
int api_contrib_experts_list(struct coord_req *req, const char *const p[5], json_t *users,
                             json_t *peers, json_t *totals);
int api_contrib_experts_me(struct coord_req *req, const char *uid, json_t *runs);

/* Validates a {} path parameter that names a run or user; sets 404/400. */
int api_name_param(struct coord_req *req, struct coord_resp *resp, int i, const char *what);

#endif
