/* The agent's side of adaptive averaging (seed 000_02cc6b5d62a616fc.txt,
 * §3.2; docs/schedules.md, "Agents following a schedule"): fetch and verify the
 * signed schedule, keep the last valid ones (in memory and in the state
 * directory), and turn a schedule into the roles and aggregation fractions
 * of one averaging round.
 *
 * Every member of a round must plan with the same schedule version (the
 * round id hashes the fractions), so dp_sched_plan_version() takes the
 * version explicitly: the round's members agree on one (e.g. the highest
 * version any of them announced), and a member lacking it fetches it with
 * dp_sched_fetch_version(). dp_sched_plan() is the same with the newest
 * version held.
 *
 * dp_sched_open() takes the run name (the cache is per run). Capability
 * reports are the runtime's (agent/peer/caps.h).
 *
 * Not thread-safe: one struct dp_sched per thread, or a lock around it. */
#ifndef AGENT_DP_SCHED_FOLLOW_H
#define AGENT_DP_SCHED_FOLLOW_H

#include <stddef.h>
#include <stdint.h>

#include "agent/client.h"
#include "ar/ar.h"
#include "cm_crypto.h"
#include "sched/sched.h"

#define DP_SCHED_KEEP 4        /* schedule versions held (newest first) */
#define DP_SCHED_SKEW_S 60     /* clock skew tolerated on valid_from / valid_until */
#define DP_SCHED_FILE_PREFIX "schedule-" /* state_dir/schedule-<run>.json */

struct dp_sched;

/* Creates the follower for `run`, verifying schedules with the coordinator
 * keys given (copied). Loads state_dir/schedule-<run>.json when present:
 * every version in it whose signature verifies with these keys is held
 * again (expired ones too: they are what "the last valid schedule" means
 * when the coordinator is unreachable; fresh ones replace them). state_dir
 * may be NULL: nothing is persisted. */
int dp_sched_open(const char *state_dir, const char *run,
                    const uint8_t (*coord_keys)[CM_ED25519_PUB_LEN], size_t n_keys,
                    struct dp_sched **out);
void dp_sched_close(struct dp_sched *js);

/* GET /api/v1/runs/{run}/schedule; verifies the signature (before parsing),
 * the format, the run and the validity window (within DP_SCHED_SKEW_S);
 * on any failure keeps what it holds and says why on stderr (once per
 * distinct reason). A newly accepted version is persisted atomically (0600).
 * Returns CM_OK when a schedule within its validity window is held,
 * CM_EEXPIRED when only expired ones are held (still used by the planners),
 * CM_ENOTFOUND when none is held. */
int dp_sched_refresh(struct dp_sched *js, const struct agent_client *coord);

/* GET /api/v1/runs/{run}/schedules/{version} (public form: payload and
 * signature). Verified like refresh, except the validity window (an older
 * version is fetched to agree with the other members of a round). CM_OK
 * when that version is held afterwards. */
int dp_sched_fetch_version(struct dp_sched *js, const struct agent_client *coord,
                             int64_t version);

/* Accepts one schedule answer (the JSON object of either endpoint above):
 * the pure part of refresh/fetch, for tests and for schedules that arrive
 * another way (e.g. the DHT). now: Unix seconds; check_window: 1 to refuse
 * a schedule outside its validity window. CM_OK (held now, or already
 * held), CM_EBADSIG, CM_EPARSE, CM_EINVAL (another run), CM_EEXPIRED. */
int dp_sched_accept(struct dp_sched *js, const json_t *answer, int64_t now, int check_window);

/* Newest version held; 0: none. */
int64_t dp_sched_version(const struct dp_sched *js);
/* 1 when that version is held. */
int dp_sched_has_version(const struct dp_sched *js, int64_t version);
/* The group size m of that version (Appendix C; agent/dp/groups.h);
 * 0 when it is not held. */
unsigned dp_sched_group_size(const struct dp_sched *js, int64_t version);
/* The newest schedule held, or NULL (borrowed; valid until the next call). */
const struct sched_schedule *dp_sched_current(const struct dp_sched *js);

/* My role in the newest schedule. Not held or not listed: compute = 1,
 * aggregate = inbound. Listed: compute as scheduled, aggregate = inbound and
 * share > 0. A peer told not to compute still needs the average when it has
 * an accelerator (the LP counts it as a receiver). */
void dp_sched_role(const struct dp_sched *js, const uint8_t pub[CM_ED25519_PUB_LEN],
                     int inbound, int *compute, int *aggregate);

/* Fills am[i].fraction for a round whose members am[0..n) (canonical order,
 * pub filled; agg_ok[i]: member i accepts connections and its addr is set)
 * follow schedule `version`; am[i].sends is left as the caller set it (what
 * each member announced). Identical on every member with the same inputs:
 *  - a member listed with share > 0 and agg_ok aggregates share / 1e9;
 *  - shares of listed aggregators absent from the round (or not agg_ok) are
 *    dropped: the parts of the present ones keep their proportions (the
 *    engine normalizes fractions), members not in the schedule get none;
 *  - if the present aggregators hold less than half of the schedule's
 *    shares, or none, the plan is too far from the schedule: even split
 *    among the agg_ok members.
 * version 0 (or no schedule held): even split among the agg_ok members.
 * CM_ENOTFOUND when `version` > 0 is not held (fetch it, or plan with 0 on
 * every member); CM_EINVAL when no member is agg_ok. */
int dp_sched_plan_version(const struct dp_sched *js, int64_t version, struct ar_member *am,
                            const int *agg_ok, size_t n);
/* The same, and: a member whose announced averaging address (am[i].addr)
 * is not at the address the schedule gives for its key (sched_entry.ip,
 * when it gives one) aggregates nothing, as if agg_ok[i] were 0; *refused
 * (may be NULL) gets bit i for each such member. n <= AR_MAX_MEMBERS.
 * dp_sched_plan_version is this with refused NULL. */
int dp_sched_plan_checked(const struct dp_sched *js, int64_t version, struct ar_member *am,
                          const int *agg_ok, size_t n, uint64_t *refused);
/* The address a version of the schedule gives for pub ("" when none). */
const char *dp_sched_ip_of(const struct dp_sched *js, int64_t version, const uint8_t pub[CM_ED25519_PUB_LEN]);
/* dp_sched_plan_version with the newest version held (0 when none). */
int dp_sched_plan(const struct dp_sched *js, struct ar_member *am, const int *agg_ok,
                    size_t n);

#endif
