/* The fixture of the contribution-accounting tests (tests/integ/test_contrib.c):
 * PostgreSQL, the coordinator, users, runs r1-r3, NPEERS peer keys with
 * passes (one revoked, one of another run), and helpers that build, sign
 * and post reports with the agent's own encoder (agent/peer/report.c).
 * Include after <cmocka.h>. */
#ifndef CT_CONTRIB_H
#define CT_CONTRIB_H

#include <jansson.h>
#include <stdint.h>

#include "agent/peer/report.h"
#include "cm_crypto.h"
#include "ct_harness.h"

#define PW "a-long-password"
#define NPEERS 10
enum { V1A, V1B, V1C, V2A, V2B, MAL, REVOKED, OTHER_RUN, F1, F2 };

extern struct ct_pg g_pg;
extern struct ct_coord g_c;
extern char *g_org, *g_aud, *g_vol1, *g_vol2, *g_mal;
extern struct cm_ed25519 g_key[NPEERS];
extern char *g_tok[NPEERS];
extern char g_pass_id[NPEERS][24];

long ctc_req(const char *method, const char *path, const char *bearer, const char *body);
json_t *ctc_get_json(const char *path, const char *bearer);
char *ctc_make_user(const char *name, const char *role);
int ctc_get_pass(int i, const char *run, const char *bearer, const char *user);
int ct_contrib_setup(void **state);
int ct_contrib_teardown(void **state);
void ctc_round_id(int n, uint8_t out[32]);
void ctc_build(struct peer_report *r, int me, int64_t step, int rnd, double samples,
               const int *members, const double *seen, size_t n);
long ctc_post_raw(const char *run, int signer, int pass_of, const char *payload, char code[40]);
char *ctc_encode(const struct peer_report *r, const char *run, int me);
long ctc_post(const struct peer_report *r, int me, char code[40]);
void ctc_expect_post(const struct peer_report *r, int me, long status, const char *code);
long ctc_scalar(const char *sql);
json_t *ctc_step_row(int64_t step, int peer);
double ctc_num(json_t *o, const char *k);

#endif
