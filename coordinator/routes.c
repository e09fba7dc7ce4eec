/* The coordinator's route table: every endpoint, who may call it, and how
 * large a body it accepts. docs/api.md and the OpenAPI document
 * (coordinator/openapi.json) describe the same list; tests/integ checks
 * that every route here appears in the OpenAPI document. */
#include "coordinator/api.h"

#define KiB 1024
#define BODY_SMALL (16 * KiB)
#define BODY_RUN (256 * KiB) /* run config objects */

const struct coord_route coord_routes[] = {
    {"GET", "/api/v1/health", api_health, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/time", api_time, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/openapi.json", api_openapi, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/keys", api_keys, COORD_PUBLIC, 0, 0},
    {"GET", "/metrics", api_metrics, COORD_PUBLIC, 0, 0},
    {"GET", "/", api_web_index, COORD_PUBLIC, 0, 0},
    {"GET", "/app/{}", api_web_file, COORD_PUBLIC, 0, 0},
    {"POST", "/api/v1/session", api_session_create, COORD_PUBLIC, BODY_SMALL, 1},
    {"DELETE", "/api/v1/session", api_session_delete, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/me", api_me, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/me/passes", api_me_passes, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/me/sessions", api_me_sessions, COORD_ROLES_ANY, 0, 0},
    {"DELETE", "/api/v1/me/sessions", api_me_sessions_end, COORD_ROLES_ANY, 0, 0},
    {"PUT", "/api/v1/me/password", api_me_password, COORD_ROLES_ANY, BODY_SMALL, 1},
    {"POST", "/api/v1/users", api_users_create, COORD_ROLE_ORGANIZER, BODY_SMALL, 1},
    {"GET", "/api/v1/users", api_users_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"PATCH", "/api/v1/users/{}", api_users_update, COORD_ROLE_ORGANIZER, BODY_SMALL, 1},
    {"DELETE", "/api/v1/users/{}/sessions", api_users_sessions_end, COORD_ROLE_ORGANIZER, 0, 0},
    {"GET", "/api/v1/audit", api_audit_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"GET", "/api/v1/runs", api_runs_list, COORD_PUBLIC, 0, 0},
    {"POST", "/api/v1/runs", api_runs_create, COORD_ROLE_ORGANIZER, BODY_RUN, 1},
    {"GET", "/api/v1/runs/{}", api_runs_get, COORD_PUBLIC, 0, 0},
    {"PATCH", "/api/v1/runs/{}", api_runs_update, COORD_ROLE_ORGANIZER, BODY_RUN, 1},
    {"GET", "/api/v1/runs/{}/allowlist", api_allowlist_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"PUT", "/api/v1/runs/{}/allowlist/{}", api_allowlist_put, COORD_ROLE_ORGANIZER, 0, 0},
    {"DELETE", "/api/v1/runs/{}/allowlist/{}", api_allowlist_delete, COORD_ROLE_ORGANIZER, 0, 0},
    {"POST", "/api/v1/runs/{}/passes", api_passes_create, COORD_ROLES_ANY, BODY_SMALL, 1},
    {"GET", "/api/v1/runs/{}/passes", api_passes_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"POST", "/api/v1/runs/{}/passes/{}/revoke", api_passes_revoke, COORD_ROLE_ORGANIZER,
     BODY_SMALL, 2},
    {"GET", "/api/v1/runs/{}/revocations", api_revocations, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/peer-keys/{}", api_peer_key_get, COORD_ROLES_READ_ADMIN, 0, 0},
    {"POST", "/api/v1/peer-keys/{}/revoke", api_peer_key_revoke, COORD_ROLE_ORGANIZER, BODY_SMALL, 2},
    {"POST", "/api/v1/peer-keys/{}/release", api_peer_key_release, COORD_ROLE_ORGANIZER, 0, 0},
    {"GET", "/api/v1/runs/{}/leaderboard", api_leaderboard, COORD_ROLES_ANY, 0, 0},
    {"POST", "/api/v1/runs/{}/capabilities", api_capabilities_post, COORD_ROLES_ANY, BODY_SMALL, 1},
    {"POST", "/api/v1/runs/{}/reachability", api_reachability_post, COORD_ROLES_ANY, BODY_SMALL, 1},
    {"GET", "/api/v1/runs/{}/schedule", api_schedule_get, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/runs/{}/pipeline", api_pipeline_get, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/runs/{}/pipeline/stages", api_pipeline_stages, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/runs/{}/schedules", api_schedules_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"GET", "/api/v1/runs/{}/peers", api_peers_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"GET", "/api/v1/runs/{}/schedules/{}", api_schedules_get, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/runs/{}/checkpoints", api_checkpoints_list, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/runs/{}/checkpoints/{}", api_checkpoints_get, COORD_ROLES_ANY, 0, 0},
    /* Contribution accounting (api_contrib*.c, docs/accounting.md). Reports
     * authenticate with the access pass and the peer's signature, not a session. */
    /* reports parse their own body (api_contrib.c: the agents' form without a generic parse) */
    {"POST", "/api/v1/runs/{}/reports", api_reports_post, COORD_PUBLIC, 64 * KiB, 0},
    {"POST", "/api/v1/runs/{}/contributions", api_reports_post, COORD_PUBLIC, 64 * KiB, 0},
    {"GET", "/api/v1/runs/{}/contributions", api_contrib_list, COORD_ROLES_READ_ADMIN, 0, 0},
    {"GET", "/api/v1/runs/{}/contributions/steps", api_contrib_steps, COORD_ROLES_READ_ADMIN, 0, 0},
    {"GET", "/api/v1/runs/{}/flags", api_contrib_flags, COORD_ROLES_READ_ADMIN, 0, 0},
    {"GET", "/api/v1/me/contributions", api_me_contrib, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/runs/{}/curve", api_run_curve, COORD_PUBLIC, 0, 0},
    {"GET", "/api/v1/runs/{}/stats", api_run_stats, COORD_PUBLIC, 0, 0},
    /* The size limit is --checkpoint-max-mb, enforced by the stream handler. */
    {"PUT", "/api/v1/runs/{}/checkpoints/{}", NULL, COORD_ROLES_ANY, (size_t)1 << 50, 0,
     &api_checkpoint_upload},
    /* One expert's checkpoint (api_expert_ckpt.c): bounded by the expert's
     * size from the run's config, enforced by the stream handler. */
    {"PUT", "/api/v1/runs/{}/experts/{}/checkpoint", NULL, COORD_ROLES_ANY, (size_t)1 << 40, 0,
     &api_expert_ckpt_upload},
    {"GET", "/api/v1/runs/{}/experts/{}/checkpoint", api_expert_ckpt_get, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/runs/{}/experts", api_expert_ckpt_list, COORD_ROLES_ANY, 0, 0},
    {"GET", "/api/v1/runs/{}/experts/servers", api_expert_servers, COORD_ROLES_ANY, 0, 0},
};
const size_t coord_nroutes = sizeof coord_routes / sizeof coord_routes[0];
