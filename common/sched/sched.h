/* Adaptive averaging schedules (seed 000_02cc6b5d62a616fc.txt, §3.2,
 * Appendix B and Appendix C): the pure library the coordinator uses to turn
 * the peers' reported capabilities into a signed schedule, and the agents use
 * to check and read one.
 *
 *  - sched_solve: the linear program (5) of Appendix B, built and solved
 *    with GLPK (primal simplex; the role search re-solves warm), with the O(n^3) family
 *    g_ij <= a_ki + (1 - c_k) d_i rewritten through one auxiliary variable
 *    per aggregator so the model has O(n^2) rows; binary roles chosen with
 *    its help (sched_roles.c); aggregation shares from (6).
 *  - sched_group_size: the group size m of Appendix C, minimizing the
 *    expected number of averaging iterations to the global average under a
 *    per-round peer failure probability.
 *  - struct sched_schedule: what the coordinator signs and peers follow,
 *    with a strict bounded JSON decoder (it reads bytes from the network),
 *    an encoder, and Ed25519 sign/verify over documented bytes
 *    (docs/protocol.md, "Schedules").
 *
 * Units inside the library: bandwidth in Mbit/s, compute in samples/s, the
 * gradient size in Mbit (parameters x bits per parameter / 1e6), the target
 * batch size in samples. Nothing here touches the network or a database. */
#ifndef SCHED_H
#define SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "cm_crypto.h"

#define SCHED_MAX_PEERS 512        /* LP size grows as n^2; see docs/schedules.md */
#define SCHED_MAX_LINKS 64         /* measured pair throughputs per peer */
#define SCHED_MAX_MBPS 1.0e6       /* 1 Tbit/s: anything above is a bad report */
#define SCHED_MAX_SAMPLES_PER_S 1.0e7
#define SCHED_MAX_BATCH 1.0e9
#define SCHED_MAX_GRADIENT_MBIT 1.0e9
#define SCHED_SHARE_TOTAL 1000000000u /* aggregation shares are parts of 1e9 */
#define SCHED_FORMAT "crowdtrain-schedule/1"
#define SCHED_JSON_MAX (1u << 20) /* largest schedule payload a decoder accepts */

/* Measured throughput from the reporting peer to peer `to` (t_ij of §3.2). */
struct sched_link {
    uint32_t to; /* index into sched_problem.peers */
    double mbps;
};

#define SCHED_IP_MAX 46 /* a numeric IPv4 or IPv6 address and its NUL (INET6_ADDRSTRLEN) */

struct sched_peer {
    uint8_t key[CM_ED25519_PUB_LEN]; /* peer public key; identifies the peer */
    char ip[SCHED_IP_MAX];           /* where peers reach it (the coordinator saw it there,
                                        or its relay's address); "" = not known */
    double samples_per_s;            /* s_i; 0 = cannot compute (no accelerator) */
    double up_mbps, down_mbps;       /* u_i, d_i; both > 0 */
    int inbound;                     /* 0 = client mode: cannot aggregate (§3.3) */
    uint32_t relay;                  /* 1 + index of the peer that relays for it (§3.3,
                                        technique 2): all its traffic with others
                                        crosses that peer's link both ways; 0: none */
    double relay_direct;             /* with a relay: the share of that traffic that skips it
                                        (punched holes), 0..1; 0: all of it crosses */
    const struct sched_link *links;  /* borrowed */
    size_t nlinks;
};

/* The role gain the coordinator asks for (sched_problem.role_gain). */
#define SCHED_ROLE_GAIN 0.05

struct sched_problem {
    const struct sched_peer *peers; /* borrowed */
    size_t n;
    double target_batch;  /* B, samples per optimizer step */
    double gradient_mbit; /* P x bits per parameter / 1e6 */
    int all_compute;      /* 1: every peer with s_i > 0 computes (no role search) */
    double role_gain;     /* >= 0: roles with fewer computing peers than the best found
                             replace it only when their throughput is above (1 + role_gain)
                             times the best's; 0: any strict gain (the exact optimum) */
};

struct sched_peer_plan {
    double c;          /* c_i of the relaxation (5), in [0,1]; informative */
    int compute;       /* the chosen role: computes and sends gradients */
    double fraction;   /* share of the gradient this peer aggregates, (6) */
    uint32_t share;    /* the same in parts of SCHED_SHARE_TOTAL (they sum exactly) */
    double agg_mbps;   /* aggregation rate r_i (the auxiliary variable) */
    double recv_mbps;  /* sum_j g_ji: rate at which it gets the averaged gradient */
    double up_used_mbps, down_used_mbps;
};

struct sched_solution {
    size_t n;
    struct sched_peer_plan *peers; /* owned; sched_solution_cleanup */
    double steps_per_s;   /* min(compute, network) of the final plan */
    double xi;            /* optimum of LP (5) */
    double compute_rate;  /* sum s_i c_i / B, steps/s */
    double network_rate;  /* min over receivers of sum_j g_ji / gradient, steps/s */
    double solve_ms;      /* all of sched_solve */
    double lp_ms;         /* of which building and solving the relaxation (5) */
    double roles_ms;      /* of which the role search and the final plan */
    int iterations;       /* simplex iterations: (5) and every role candidate */
    int rows, cols;       /* size of the model (5) as built */
};

/* Validates `p` (CM_EINVAL / CM_ERANGE / CM_ENUMERIC / CM_ETOOBIG with a
 * sentence in err) and solves. CM_EINTERNAL when GLPK fails (its message is
 * logged once). Equal inputs give equal outputs, bit for bit. */
int sched_solve(const struct sched_problem *p, struct sched_solution *out, char *err, size_t cap);
void sched_solution_cleanup(struct sched_solution *s);

/* Validation alone (what sched_solve checks first). */
int sched_problem_check(const struct sched_problem *p, char *err, size_t cap);

/* Appendix C. Expected averaging iterations to reach the global average
 * with groups of m among n peers when each peer fails a round with
 * probability p_fail: ceil(log_m n) rounds, each repeated until all of its
 * ceil(n/m) groups succeed once (a group succeeds when none of its m peers
 * fails). Returns +inf when p_fail >= 1. */
double sched_expected_iterations(size_t n, unsigned m, double p_fail);
/* The m in [2, n] (1 when n == 1) minimizing it; ties go to the larger m
 * (fewer rounds). CM_EINVAL for n == 0, p_fail outside [0, 1) or NaN. */
int sched_group_size(size_t n, double p_fail, unsigned *m_out, double *expected_out);

/* The signed schedule. Peers are listed in the order of their parts: the
 * flat gradient is cut into consecutive parts of share/1e9 each (rounded
 * down to elements, the last part takes the remainder). */
struct sched_entry {
    uint8_t key[CM_ED25519_PUB_LEN];
    int compute;
    int client_mode;
    uint32_t share;
    /* The address peers may reach it at ("ip" on the wire; "" = not said):
       where the coordinator saw its capability reports come from, or its
       relay's address when relayed. A round member announcing an averaging
       address elsewhere gets no part (docs/p2p.md, "Announced addresses"). */
    char ip[SCHED_IP_MAX];
};

#define SCHED_RUN_MAX 64
struct sched_schedule {
    char run[SCHED_RUN_MAX + 1];
    int64_t version;    /* increases by one per solve in a run */
    int64_t issued_at;  /* Unix seconds */
    int64_t valid_from, valid_until;
    char kid[CM_KID_LEN + 1]; /* coordinator key that signs it */
    uint32_t group_size;
    double steps_per_s;
    int64_t target_batch;
    size_t n;
    struct sched_entry *peers; /* owned; sched_schedule_cleanup */
};

void sched_schedule_cleanup(struct sched_schedule *s);
/* Compact JSON of the schedule (heap string, caller frees). */
int sched_schedule_encode(const struct sched_schedule *s, char **json_out, size_t *len_out);
/* Strict decoder of network bytes: one JSON object of at most
 * SCHED_JSON_MAX bytes, no unknown or duplicate fields, every number
 * bounded, shares summing to SCHED_SHARE_TOTAL, keys distinct. On failure
 * nothing is allocated and err says why. */
int sched_schedule_decode(const char *buf, size_t len, struct sched_schedule *out, char *err,
                          size_t cap);

/* Signed bytes = SCHED_FORMAT "\n" || payload (docs/protocol.md). */
int sched_sign(const struct cm_ed25519 *key, const void *payload, size_t len,
               uint8_t sig[CM_ED25519_SIG_LEN]);
/* CM_OK or CM_EBADSIG. */
int sched_verify(const uint8_t pub[CM_ED25519_PUB_LEN], const void *payload, size_t len,
                 const uint8_t sig[CM_ED25519_SIG_LEN]);

/* Builds the schedule's entries from a solution (same peer order). */
int sched_schedule_from_solution(const struct sched_problem *p, const struct sched_solution *sol,
                                 struct sched_schedule *out);

#endif
