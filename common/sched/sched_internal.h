/* Internal interface between the parts of common/sched/: the LP of
 * sched_lp.c hands the role search of sched_roles.c what both need. Not for
 * use outside common/sched/. */
#ifndef SCHED_INTERNAL_H
#define SCHED_INTERNAL_H

#include <stddef.h>

#include <jansson.h>
#include <stdint.h>

#include "cm_json.h"
#include "sched/sched.h"

/* All rates are divided by the gradient size G (steps per second). */
struct sched__ctx {
    const struct sched_problem *p;
    const double *scale_s; /* [n] s_i / B */
    const double *M;       /* [n] upper bound of h_i (aggregators) */
    const double *tmin;    /* [n*n] smallest measured t_ij / G, INFINITY when unmeasured */
    int iters;             /* simplex iterations, accumulated */
    int evals;             /* fixed-role LPs solved */
};

/* Relayed peer q's traffic through its relay R (sched_peer.relay) for
 * fixed roles: T_q = cH H + cR h_R + cq h_q (rates per gradient), i.e. what
 * q sends to and receives from everyone but R, which crosses R's link both
 * ways: on_q (H - h_q - h_R) + (receivers other than q, R) h_q out, and
 * (computing peers other than q, R) h_q + [q receives] (H - h_q - h_R) in. */
static inline void sched__relay_coefs(const struct sched_problem *p, const unsigned char *on,
                                      size_t ncomp, size_t nrecv, size_t q, double *cH, double *cR,
                                      double *cq)
{
    size_t R = p->peers[q].relay - 1;
    int on_q = on[q] != 0, on_r = on[R] != 0;
    int recv_q = p->peers[q].samples_per_s > 0, recv_r = p->peers[R].samples_per_s > 0;
    *cH = on_q + recv_q;
    *cR = -(double)(on_q + recv_q);
    *cq = -(double)on_q + ((double)nrecv - recv_q - recv_r) + ((double)ncomp - on_q - on_r) - recv_q;
}

/* The peers each peer relays for (sched_peer.relay) as lists, so that a
 * relay's rows find them without a pass over every peer: head[i] = 1 + the
 * first peer that i relays for (0: none), next[q] = 1 + the one after q;
 * both n long, ascending. */
static inline void sched__relay_lists(const struct sched_problem *p, uint32_t *head, uint32_t *next)
{
    for (size_t i = 0; i < p->n; i++)
        head[i] = next[i] = 0;
    for (size_t q = p->n; q-- > 0;)
        if (p->peers[q].relay) {
            next[q] = head[p->peers[q].relay - 1];
            head[p->peers[q].relay - 1] = (uint32_t)q + 1;
        }
}

/* Throughput-maximal plan for fixed roles (on[i]: peer i computes): the
 * network rate sum h_i and, when h is non-NULL, each aggregator's h_i.
 * Must run inside sched_solve's GLPK error hook. */
int sched__roles_eval(struct sched__ctx *x, const unsigned char *on, double *h, double *net);

/* The same value as sched__roles_eval, for a sequence of role assignments
 * re-solved warm from the previous basis (the role search). Must run inside
 * sched_solve's GLPK error hook. */
struct sched__warm;
int sched__warm_new(struct sched__ctx *x, struct sched__warm **out);
int sched__warm_eval(struct sched__warm *w, const unsigned char *on, double *net);
void sched__warm_free(struct sched__warm *w);

/* Picks binary roles from the relaxation's c (see sched_roles.c); fills
 * on_out, h_out (the plan for those roles) and *net_out. */
int sched__roles_choose(struct sched__ctx *x, const double *c_relaxed, unsigned char *on_out,
                        double *h_out, double *net_out);

/* The wire codecs' shared pieces (sched_json.c): err gets a sentence;
 * base64url of a 32-byte key (43 characters); a key id; and the front of
 * the strict decoders: 1..max bytes, one JSON object without duplicate keys
 * with exactly the `top` fields, "format" equal to `format` (CM_EVERSION
 * otherwise). NULL with *rc and err, or the parsed root (*rc CM_OK). */
void sched__seterr(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int sched__b64_key(const char *s, uint8_t key[CM_ED25519_PUB_LEN]);
int sched__kid_ok(const char *s);
/* A numeric IPv4 or IPv6 address (inet_pton), shorter than SCHED_IP_MAX. */
int sched__ip_ok(const char *s);
json_t *sched__parse_doc(const char *buf, size_t len, size_t max, const char *what, const char *format,
                         const struct cm_json_field *top, size_t ntop, int *rc, char *err, size_t cap);

/* Ed25519 over prefix || payload (domain separation: averaging schedules
 * sign under "crowdtrain-schedule/1\n", pipeline assignments under
 * "crowdtrain-pipeline/1\n"); payloads over max bytes are CM_ETOOBIG.
 * sched_json.c. */
int sched__sign_prefixed(const struct cm_ed25519 *key, const char *prefix, size_t max, const void *payload,
                         size_t len, uint8_t sig[CM_ED25519_SIG_LEN]);
int sched__verify_prefixed(const uint8_t pub[CM_ED25519_PUB_LEN], const char *prefix, size_t max,
                           const void *payload, size_t len, const uint8_t sig[CM_ED25519_SIG_LEN]);

#endif
