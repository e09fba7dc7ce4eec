/* The collaboration's shared state as each peer sees it through the DHT
 * (seed 000_02cc6b5d62a616fc.txt §3.1, "Synchronous large-batch training":
 * peers publish their progress; everyone estimates when the collaboration
 * reaches the target batch size; then the peers of that step form a group
 * and average).
 *
 * Two kinds of DHT records, both dictionary entries authored and signed by
 * the peer (so nobody can overwrite another's):
 *   "<run>/progress"       {"v":1,"step","samples","sps","t","addr","client","aux"[,"st","h","pl","ps"]}
 *   "<run>/round/<step>"   {"v":1,"w","addr","agg","sends","t"[,"sv"][,"po"][,"rl"]}
 *   "<run>/outcome/<step>" {"v":1,"rid","mask","t"}
 * The parsers are pure, strict and bounded (network input; fuzzed). */
#ifndef AGENT_COLLAB_H
#define AGENT_COLLAB_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define COLLAB_RECORD_MAX 512
#define COLLAB_ADDR_MAX 64
#define COLLAB_HASH_HEX 16 /* hex digits of a parameter hash prefix (64 bits) */

struct collab_progress {
    uint8_t pub[CM_ED25519_PUB_LEN]; /* author, from the DHT record */
    int64_t step;                    /* optimizer steps done */
    double samples;                  /* samples accumulated toward step + 1 */
    double sps;                      /* recent samples per second */
    double pledged;                  /* samples of the micro-batch in flight (not in `samples`) */
    int64_t pstep;                   /* step of its parameters: `step`, or `step` - 1 while
                                        the previous round averages (delayed updates) */
    int64_t t_ms;                    /* when it was measured (author's clock) */
    char addr[COLLAB_ADDR_MAX];      /* averaging address "ip:port", "" = client mode */
    int client, aux;                 /* client mode; auxiliary: aggregate-only, pull-only or
                                        paused (counted by nobody as computing) */
    char st[COLLAB_ADDR_MAX];        /* state-transfer address "ip:port", "" = none */
    char hash[COLLAB_HASH_HEX + 1];  /* parameter hash at `pstep` (hex prefix), "" = unknown */
};

#define COLLAB_ON_MAX 1000000 /* the most peers on a step an announcement may say ("on") */

struct collab_announce {
    uint8_t pub[CM_ED25519_PUB_LEN];
    double weight;  /* samples it contributes (0 for aux peers) */
    char addr[COLLAB_ADDR_MAX];
    int agg, sends;
    int pull_only;  /* sends nothing but takes the average and steps (the schedule
                       told it not to compute; "po":1, with sends 0 and w 0) */
    int64_t t_ms;   /* when it announced (author's clock) */
    int64_t sched_version; /* schedule version it holds (0: none) */
    int relayed;    /* addr is a port lent by a relay ("rl":1): others may punch a hole
                       to it (docs/p2p.md, "Hole punching") */
    int on;         /* compute peers it saw accumulating for the step when it announced,
                       itself included when it sends ("on", optional; 0: not said). The
                       members decline a window from the highest of these, so they all
                       decide alike (collab_round_on) */
};

/* What a member of a round reports after it: which parts it committed.
 * The members agree on the parts every reporting member committed
 * (collab_outcome_final); the others are skipped by everyone for that step,
 * so survivors stay identical (docs/collaboration.md, "Outcome agreement"). */
struct collab_outcome {
    uint8_t pub[CM_ED25519_PUB_LEN];
    uint8_t rid[16];  /* round id prefix: outcomes of another round are ignored */
    uint64_t mask;    /* bit k = part k committed */
    int64_t t_ms;
};

/* Encoders write a NUL-terminated record into out (COLLAB_RECORD_MAX). */
int collab_progress_encode(const struct collab_progress *p, char *out, size_t cap);
int collab_announce_encode(const struct collab_announce *a, char *out, size_t cap);
/* Parsers: CM_EPARSE on anything malformed, out of range or unknown. The
 * author key is not in the bytes: the caller copies it from the record. */
int collab_progress_parse(const void *buf, size_t len, struct collab_progress *out);
int collab_announce_parse(const void *buf, size_t len, struct collab_announce *out);
int collab_outcome_encode(const struct collab_outcome *o, char *out, size_t cap);
int collab_outcome_parse(const void *buf, size_t len, struct collab_outcome *out);

/* The agreed parts of a round: the AND of the masks of the outcomes of
 * round `rid` made within window_ms of the first of them (author clocks, as
 * for round members). Outcomes of other rounds and of authors not in
 * members[] are ignored, and so are duplicates by author (first kept).
 * *decided = 1 when the answer cannot change any more: every member has
 * reported, or now_ms is past the close plus margin_ms. Returns the number
 * of outcomes counted (0: *mask = 0). */
size_t collab_outcome_final(const struct collab_outcome *o, size_t n, const uint8_t rid[16],
                            const uint8_t (*members)[CM_ED25519_PUB_LEN], size_t n_members,
                            int64_t window_ms, int64_t margin_ms, int64_t now_ms, uint64_t *mask,
                            int *decided);

struct collab_view {
    int64_t max_step;      /* highest step any fresh peer reports */
    int64_t max_pstep;     /* highest parameter step a fresh peer holds (publishes the hash of;
                              one whose round averages ahead of its parameters publishes
                              none), -1: none */
    size_t peers;          /* fresh peers */
    size_t at_step;        /* fresh peers at `step` (compute peers) */
    double samples;        /* samples accumulated at `step` by fresh peers (reported) */
    double sps;            /* their total throughput */
    double pledged;        /* samples in flight at `step` (micro-batches being computed) */
    double eta_s;          /* estimated seconds until `target` (0 when reached) */
};

/* Summarizes fresh records (t_ms within fresh_ms of now, by the reader's
 * clock, tolerating skew) for the peers at `step`. */
void collab_estimate(const struct collab_progress *p, size_t n, int64_t step, int64_t now_ms,
                     int64_t fresh_ms, double target, struct collab_view *out);

/* The rounds of a step: a window opens with the first announcement and
 * closes window_ms later; the next announcement after a close opens the next
 * window. A peer's round is the window its own announcement (made at
 * mine_ms) falls in: its members are that window's announcements, the same
 * set for every peer that reads after the close (plus propagation). A peer
 * that missed a window so forms the next round instead of none. Filters `a`
 * in place to those members and returns the count; *close_ms receives the
 * window's close. */
size_t collab_round_members(struct collab_announce *a, size_t n, int64_t window_ms, int64_t mine_ms,
                            int64_t *close_ms);

/* Whether the round of a step goes on without the caller: one of its
 * windows (chained as in collab_round_members) closed at least settle_ms
 * before now_ms (its members have read their list) holding more senders
 * than half of `on`, the peers on that step. That is what its members need
 * not to decline it (a window of no majority is declined, and its members
 * accumulate for the step again). */
int collab_round_going(const struct collab_announce *a, size_t n, int64_t window_ms, int64_t settle_ms,
                       int64_t now_ms, size_t on);

/* The peers on the step, as a round's members said in their announcements:
 * the highest `on` among a[0..n) (0 when none said). Every member reads
 * the same announcements, so every member declines a window of no majority
 * of this alike; from a member's own view of the others' progress, one
 * member of a pair declined while the other waited out the stall limit for
 * its parts (test_join_rounds, a fresh clone's run under the sanitizers).
 * collab_round_going uses it for each window when any member said it. */
size_t collab_round_on(const struct collab_announce *a, size_t n);

/* The wait of delayed updates for the peers behind (seed 000 §3.2), as a
 * token bucket: waiting spends seconds from a bucket of at most cap_s,
 * which refills at refill (seconds per second) while we do not wait. So
 * the first wait may take cap_s, and over time waits take at most about
 * refill / (1 + refill) of the time, whatever the peers behind do: staying
 * behind for good (a dead or lying peer), or going back and forth between
 * behind and level (which used to get the whole wait again each time).
 * collab_hold_update: `behind` now, at `now_s`; 1 while we should wait. */
struct collab_hold {
    double tokens; /* seconds of waiting left */
    double last;   /* time of the last update (< 0: none yet) */
    int waiting;   /* the last update said wait */
};
void collab_hold_init(struct collab_hold *h, double cap_s);
int collab_hold_update(struct collab_hold *h, int behind, double now_s, double cap_s, double refill);

/* Orders announcements canonically (by public key) so every member builds
 * the same member list; drops duplicates by key, keeping the first. Returns
 * the new count. */
size_t collab_canonical(struct collab_announce *a, size_t n);

/* The peer that uploads the checkpoint of `step`: the member whose
 * SHA-256(step || pub) is smallest, so the choice is deterministic and
 * rotates. Returns its index, or n when n == 0. */
size_t collab_checkpoint_uploader(const struct collab_announce *a, size_t n, int64_t step);

#endif
