/* ct-timeout: 300 */
/* The peer runtime's lifecycle (agent/peer/runtime.h; runtime.c, caps.c)
 * against a real PostgreSQL, the real coordinator and the run's DHT
 * backbone, with volunteers logged in by the real `crowdtrain-agent login`:
 *  - start and stop in every order a role can ask for: up to each stage
 *    (and the stage's resources really exist: session and key, pass with a
 *    bootstrap list, a p2p node that stores and finds our DHT record, the
 *    probe thread), in steps, restarted on the same struct, a start to a
 *    lower stage (a no-op), a stop without a start, a second stop, bad
 *    arguments, a start that fails at its first stage;
 *  - pass renewal failing (the volunteer was taken off the allowlist: the
 *    current pass is kept, untouched) and recovering (put back: a new pass,
 *    whose token the p2p node uses: the DHT backbone, which by then refuses
 *    the old, revoked pass, serves us again); when renewal is due;
 *  - Ctrl-C (a real SIGINT and handler) at each stage of start-up: start
 *    returns CM_ECANCELED with the earlier stages running, stop takes them
 *    down, and start resumes once the interrupt is cleared; and inside the
 *    pass and clock stages' requests to a coordinator that stopped
 *    answering (SIGSTOP): abandoned within a second, not at the request's
 *    30 s deadline.
 * Each case runs in a forked child of its own with a deadline (SIGALRM), so
 * a hang in start or stop fails that case instead of the whole file, and
 * under ASan LeakSanitizer checks at the child's exit that the runtime
 * released everything it took. The child reports failures on stderr and
 * exits 1 (cmocka's asserts would longjmp into the parent's copy of the
 * runner); the parent asserts it exited 0. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/peer/net.h"
#include "agent/peer/runtime.h"
#include "cm_err.h"
#include "ct_harness.h"

#define PW "organizer-password"
#define RUN "rt"
/* One volunteer per kind of case: renewal takes its volunteer off the
   allowlist, which revokes every pass of that volunteer for the run. */
enum { VOL_LIFE, VOL_RENEW, VOL_INT, NVOL };
#define DEADLINE_S 60 /* per case (child); the sanitizer build needs about 3x the normal one */

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[NVOL][256];
static int g_teardown_failed;

/* ---- the child's checks -------------------------------------------------- */

#define CHECK(cond)                                                                                     \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                    \
            fflush(NULL);                                                                               \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)
#define CHECK_RC(expr, want)                                                                            \
    do {                                                                                                \
        int rc_ = (expr);                                                                               \
        if (rc_ != (want)) {                                                                            \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr,          \
                    cm_err_name(rc_), cm_err_name(want));                                               \
            fflush(NULL);                                                                               \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)
#define CHECK_STR(a, b)                                                                                 \
    do {                                                                                                \
        const char *a_ = (a), *b_ = (b);                                                                \
        if (!a_ || !b_ || strcmp(a_, b_)) {                                                             \
            fprintf(stderr, "%s:%d: %s is \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a,           \
                    a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                            \
            fflush(NULL);                                                                               \
            exit(1);                                                                                    \
        }                                                                                               \
    } while (0)

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Runs fn in a child with a deadline and asserts it exited 0. The child
 * never returns into cmocka: it exits, so LeakSanitizer checks it. */
static void in_child(const char *name, void (*fn)(void))
{
    fflush(NULL);
    double t0 = mono_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* cmocka's handlers for these longjmp into the runner's copy; a
           crash must end the child instead. */
        int sigs[] = {SIGSEGV, SIGILL, SIGFPE, SIGBUS, SIGABRT, SIGALRM};
        for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
            signal(sigs[i], SIG_DFL);
        alarm(DEADLINE_S); /* SIGALRM's default action ends the child */
        fn();
        fflush(NULL);
        exit(0);
    }
    int st = ct_wait(pid, DEADLINE_S + 15);
    printf("[%s: %.1f s]\n", name, mono_s() - t0);
    if (st == 128 + SIGALRM)
        fail_msg("%s: past its %d s deadline", name, DEADLINE_S);
    if (st != 0)
        fail_msg("%s: the child exited with %d%s (its report is above)", name, st,
                 st > 128 ? ", killed by a signal" : "");
}

static struct peer_rt *new_rt(void)
{
    struct peer_rt *rt = malloc(sizeof *rt);
    CHECK(rt);
    memset(rt, 0xa5, sizeof *rt); /* init must set every field it relies on */
    return rt;
}

static void base_cfg(struct peer_rt_config *cfg, int vol)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->run = RUN;
    cfg->config_dir = g_dirs[vol];
    cfg->listen_ip = "127.0.0.1";
}

static long org_req(const char *method, const char *path)
{
    struct ct_resp r;
    ct_http(&g_c, method, path, g_org, NULL, &r);
    long s = r.status;
    ct_resp_free(&r);
    return s;
}

/* Stores a fresh record of ours in the DHT and reads it back: CM_OK when
 * the read returns it with our key as its author, CM_ENOTFOUND when it
 * does not, or the error of the put or get. */
static int dht_round_trip(struct peer_rt *rt, const char *tag)
{
    static int seq;
    char key[128], val[160];
    snprintf(key, sizeof key, "peer-rt-test/%s/%d/%d", tag, (int)getpid(), seq++);
    snprintf(val, sizeof val, "value of %s", key);
    int rc = peer_net_put(rt->net, key, val, strlen(val), 60000);
    if (rc != CM_OK)
        return rc;
    struct peer_record *r = NULL;
    size_t n = 0;
    if ((rc = peer_net_get(rt->net, key, &r, &n)) != CM_OK)
        return rc;
    int found = 0;
    for (size_t i = 0; i < n; i++)
        found |= r[i].len == strlen(val) && !memcmp(r[i].value, val, r[i].len) &&
                 !memcmp(r[i].author, rt->key.pub, CM_ED25519_PUB_LEN);
    peer_records_free(r, n);
    return found ? CM_OK : CM_ENOTFOUND;
}

/* What runs at `st` (and nothing of the stages above it). */
static void check_resources(struct peer_rt *rt, enum peer_stage st, const char *user)
{
    CHECK(rt->stage == st);
    if (st >= PEER_STAGE_SESSION) {
        CHECK(rt->session != NULL);
        CHECK(rt->key_loaded);
        CHECK(rt->coord.url && rt->coord.token);
    }
    if (st >= PEER_STAGE_PASS) {
        CHECK(rt->pass != NULL);
        CHECK(rt->token && rt->token[0]);
        CHECK(rt->n_bootstrap > 0 && rt->bootstrap[0] && strchr(rt->bootstrap[0], ':'));
        CHECK(rt->n_coord_keys > 0);
        CHECK(peer_rt_pass_id(rt) && peer_rt_pass_id(rt)[0]);
        CHECK_STR(peer_rt_username(rt), user);
    } else {
        CHECK(rt->pass == NULL && rt->token == NULL && peer_rt_pass_id(rt) == NULL);
    }
    if (st >= PEER_STAGE_CLOCK) {
        /* the coordinator runs on this machine: its clock is ours */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        int64_t d = peer_rt_now_ms(rt) - ((int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000);
        CHECK(d > -2000 && d < 2000);
    }
    if (st >= PEER_STAGE_NET) {
        CHECK(rt->net != NULL);
        CHECK(rt->my_addr[0] && strchr(rt->my_addr, ':'));
        CHECK(rt->st_addr[0] && strchr(rt->st_addr, ':'));
        CHECK(strcmp(rt->my_addr, rt->st_addr) != 0);
        /* the coordinator dialed us back where it sees us */
        CHECK(rt->reach == PEER_REACH_DIRECT);
        CHECK_STR(rt->observed_ip, "127.0.0.1");
        CHECK(!strncmp(rt->my_addr, "127.0.0.1:", 10));
        CHECK_RC(dht_round_trip(rt, peer_stage_name(st)), CM_OK);
    } else {
        CHECK(rt->net == NULL && !rt->my_addr[0] && !rt->st_addr[0]);
    }
    if (st >= PEER_STAGE_REPORTS)
        CHECK(rt->rep != NULL);
    else
        CHECK(rt->rep == NULL);
    CHECK(rt->probe_started == (st >= PEER_STAGE_PROBES && rt->cfg.probes));
}

static void check_stopped(struct peer_rt *rt)
{
    CHECK(rt->stage == PEER_STAGE_NONE);
    CHECK(rt->session == NULL && !rt->key_loaded);
    CHECK(rt->pass == NULL && rt->token == NULL && rt->n_bootstrap == 0);
    CHECK(rt->net == NULL && !rt->my_addr[0] && !rt->st_addr[0]);
    CHECK(rt->rep == NULL);
    CHECK(!rt->probe_started);
}

/* ---- start and stop in every order ------------------------------------- */

static enum peer_stage g_upto;

static void child_start_stop(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_LIFE);
    cfg.probes = 1;
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    check_stopped(rt);
    CHECK_RC(peer_rt_start(rt, g_upto), CM_OK);
    check_resources(rt, g_upto, "vol0");
    peer_rt_stop(rt);
    check_stopped(rt);
    peer_rt_stop(rt); /* a second stop is harmless */
    check_stopped(rt);
    peer_rt_cleanup(rt);
    free(rt);
}

static void start_stop(enum peer_stage upto)
{
    g_upto = upto;
    char name[64];
    snprintf(name, sizeof name, "start to %s, stop", peer_stage_name(upto));
    in_child(name, child_start_stop);
}

#define START_STOP_TEST(STAGE, name)                                                                    \
    static void test_start_stop_##name(void **state)                                                    \
    {                                                                                                   \
        (void)state;                                                                                    \
        start_stop(STAGE);                                                                              \
    }
START_STOP_TEST(PEER_STAGE_SESSION, session)
START_STOP_TEST(PEER_STAGE_PASS, pass)
START_STOP_TEST(PEER_STAGE_CLOCK, clock)
START_STOP_TEST(PEER_STAGE_NET, net)
START_STOP_TEST(PEER_STAGE_REPORTS, reports)
START_STOP_TEST(PEER_STAGE_PROBES, probes)

/* ---- reachability (reach.h, POST /api/v1/runs/{run}/reachability) ------- */

/* POSTs body (a JSON text) to the run's reachability check as the runtime's
 * volunteer; returns the status, *out the answer (may be NULL). */
static long reach_post(struct peer_rt *rt, const char *run, const char *body, json_t **out)
{
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/reachability", run);
    json_t *b = json_loads(body, 0, NULL);
    CHECK(b);
    struct agent_reply r = {0};
    CHECK_RC(agent_request(&rt->coord, "POST", path, b, &r), CM_OK);
    json_decref(b);
    long st = r.status;
    if (out)
        *out = json_incref(r.json);
    agent_reply_free(&r);
    return st;
}

static int port_reachable(json_t *ans, size_t i)
{
    return json_is_true(json_object_get(json_array_get(json_object_get(ans, "ports"), i), "reachable"));
}

static void child_reachability(void)
{
    struct peer_rt_config cfg, cfg2;
    base_cfg(&cfg, VOL_LIFE);
    cfg.listen_ip = NULL; /* the default, 0.0.0.0: what to announce is discovered */
    struct peer_rt *rt = new_rt(), *other = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_NET), CM_OK);
    CHECK(rt->reach == PEER_REACH_DIRECT);
    CHECK_STR(rt->observed_ip, "127.0.0.1");
    CHECK(!strncmp(rt->my_addr, "127.0.0.1:", 10) && !strncmp(rt->st_addr, "127.0.0.1:", 10));
    CHECK(rt->reach_ms < 5000);
    printf("reachability known %.0f ms after the net stage started\n", rt->reach_ms);
    /* another peer (another key) listening on this host */
    base_cfg(&cfg2, VOL_INT);
    peer_rt_init(other, &cfg2, NULL);
    CHECK_RC(peer_rt_start(other, PEER_STAGE_NET), CM_OK);

    char k64[64], body[512];
    cm_b64url_encode(rt->key.pub, CM_ED25519_PUB_LEN, k64);
    unsigned dht = peer_net_dht_port(rt->net), ar = peer_net_ar_port(rt->net), st = peer_net_state_port(rt->net);
    unsigned theirs = peer_net_ar_port(other->net);
    /* a port nobody listens on: bind one and close it */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
          getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
    unsigned closed = ntohs(sa.sin_port);
    close(fd);

    json_t *ans = NULL;
    snprintf(body, sizeof body, "{\"peer_public_key\":\"%s\",\"ports\":[%u,%u,%u,%u]}", k64, dht, ar, closed,
             theirs);
    CHECK(reach_post(rt, RUN, body, &ans) == 200);
    CHECK_STR(json_string_value(json_object_get(ans, "observed_ip")), "127.0.0.1");
    CHECK(port_reachable(ans, 0) && port_reachable(ans, 1));
    CHECK(!port_reachable(ans, 2)); /* nothing there */
    CHECK(!port_reachable(ans, 3)); /* someone else's key answers there */
    CHECK(json_is_false(json_object_get(ans, "reachable")));
    CHECK(json_string_value(json_object_get(json_array_get(json_object_get(ans, "ports"), 2), "error")));
    struct peer_reach_result res;
    CHECK_RC(peer_reach_parse(ans, &res), CM_OK);
    CHECK(!res.reachable && res.n == 4 && res.ok[0] && res.ok[1] && !res.ok[2] && !res.ok[3]);
    json_decref(ans);
    snprintf(body, sizeof body, "{\"peer_public_key\":\"%s\",\"ports\":[%u,%u,%u]}", k64, dht, ar, st);
    CHECK(reach_post(rt, RUN, body, &ans) == 200);
    CHECK(json_is_true(json_object_get(ans, "reachable")));
    json_decref(ans);

    /* bad input: refused, nothing dialed */
    const char *bad[] = {
        "{\"peer_public_key\":\"%s\",\"ports\":[]}",
        "{\"peer_public_key\":\"%s\",\"ports\":[0]}",
        "{\"peer_public_key\":\"%s\",\"ports\":[70000]}",
        "{\"peer_public_key\":\"%s\",\"ports\":[\"80\"]}",
        "{\"peer_public_key\":\"%s\",\"ports\":[1,2,3,4,5]}",
        "{\"peer_public_key\":\"%s\",\"ports\":[7,7]}",
        "{\"peer_public_key\":\"%s\",\"ports\":80}",
        "{\"peer_public_key\":\"%s\",\"ports\":[1],\"ip\":\"10.0.0.1\"}",
        "{\"peer_public_key\":\"%.42s!\",\"ports\":[1]}",
        "{\"ports\":[1],\"x\":\"%s\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(body, sizeof body, bad[i], k64);
        long code = reach_post(rt, RUN, body, NULL);
        if (code != 400)
            fprintf(stderr, "bad body %s: status %ld\n", body, code);
        CHECK(code == 400);
    }
    /* a key this volunteer holds no pass for, a run that does not exist */
    uint8_t stranger[CM_ED25519_PUB_LEN];
    memset(stranger, 7, sizeof stranger);
    char s64[64];
    cm_b64url_encode(stranger, CM_ED25519_PUB_LEN, s64);
    snprintf(body, sizeof body, "{\"peer_public_key\":\"%s\",\"ports\":[%u]}", s64, ar);
    CHECK(reach_post(rt, RUN, body, NULL) == 403);
    snprintf(body, sizeof body, "{\"peer_public_key\":\"%s\",\"ports\":[%u]}", k64, ar);
    CHECK(reach_post(rt, "no-such-run", body, NULL) == 404);

    /* --advertise-ip is taken as given, unchecked */
    peer_rt_stop(rt);
    cfg.advertise_ip = "10.9.8.7";
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_NET), CM_OK);
    CHECK(rt->reach == PEER_REACH_FLAG_ADDR && !strncmp(rt->my_addr, "10.9.8.7:", 9));
    peer_rt_cleanup(rt);
    peer_rt_cleanup(other);
    free(rt);
    free(other);
}

static void test_reachability(void **state)
{
    (void)state;
    in_child("reachability", child_reachability);
}

/* A role starts a few stages, does its own set-up, starts the rest. */
static void child_steps(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_LIFE);
    cfg.probes = 1;
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_SESSION), CM_OK);
    check_resources(rt, PEER_STAGE_SESSION, "vol0");
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_PASS), CM_OK);
    check_resources(rt, PEER_STAGE_PASS, "vol0");
    char *pass_id = strdup(peer_rt_pass_id(rt));
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_OK);
    check_resources(rt, PEER_STAGE_ALL, "vol0");
    CHECK_STR(peer_rt_pass_id(rt), pass_id); /* the stages already running were left alone */
    free(pass_id);
    peer_rt_stop(rt);
    check_stopped(rt);
    peer_rt_cleanup(rt);
    free(rt);
}

static void test_start_in_steps(void **state)
{
    (void)state;
    in_child("start in steps", child_steps);
}

/* A role that leaves and joins again reuses its struct. */
static void child_restart(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_LIFE);
    cfg.probes = 1;
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_OK);
    check_resources(rt, PEER_STAGE_ALL, "vol0");
    char *pass_id = strdup(peer_rt_pass_id(rt));
    peer_rt_stop(rt);
    check_stopped(rt);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_OK);
    check_resources(rt, PEER_STAGE_ALL, "vol0");
    CHECK(strcmp(peer_rt_pass_id(rt), pass_id) != 0); /* a new pass for the new session */
    free(pass_id);
    peer_rt_stop(rt);
    check_stopped(rt);
    peer_rt_cleanup(rt);
    free(rt);
}

static void test_restart(void **state)
{
    (void)state;
    in_child("restart", child_restart);
}

/* Starting to a stage at or below the current one changes nothing. */
static void child_lower(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_LIFE);
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_NET), CM_OK);
    struct peer_net *net = rt->net;
    char *pass_id = strdup(peer_rt_pass_id(rt));
    const enum peer_stage lower[] = {PEER_STAGE_NONE, PEER_STAGE_SESSION, PEER_STAGE_PASS,
                                     PEER_STAGE_CLOCK, PEER_STAGE_NET};
    for (size_t i = 0; i < sizeof lower / sizeof *lower; i++) {
        CHECK_RC(peer_rt_start(rt, lower[i]), CM_OK);
        CHECK(rt->stage == PEER_STAGE_NET);
        CHECK(rt->net == net);
        CHECK_STR(peer_rt_pass_id(rt), pass_id);
    }
    check_resources(rt, PEER_STAGE_NET, "vol0");
    free(pass_id);
    peer_rt_cleanup(rt); /* cleanup stops what runs */
    check_stopped(rt);
    free(rt);
}

static void test_start_lower_is_noop(void **state)
{
    (void)state;
    in_child("start to a lower stage", child_lower);
}

static void child_stop_without_start(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_LIFE);
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    peer_rt_stop(rt);
    check_stopped(rt);
    peer_rt_stop(rt);
    check_stopped(rt);
    CHECK_RC(peer_rt_renew_pass(rt), CM_ESTATE); /* no pass to renew yet */
    peer_rt_renew_pass_if_due(rt);
    check_stopped(rt);
    peer_rt_cleanup(rt);
    free(rt);
    /* and init then cleanup alone */
    rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    peer_rt_cleanup(rt);
    free(rt);
}

static void test_stop_without_start(void **state)
{
    (void)state;
    in_child("stop without start", child_stop_without_start);
}

static void child_bad_args(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_LIFE);
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, (enum peer_stage)99), CM_EINVAL);
    CHECK_RC(peer_rt_start(rt, (enum peer_stage)(PEER_STAGE_ALL + 1)), CM_EINVAL);
    check_stopped(rt);
    /* an invalid stage once running changes nothing either */
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_SESSION), CM_OK);
    CHECK_RC(peer_rt_start(rt, (enum peer_stage)99), CM_EINVAL);
    CHECK(rt->stage == PEER_STAGE_SESSION);
    peer_rt_cleanup(rt);
    check_stopped(rt);
    free(rt);

    /* no run */
    cfg.run = NULL;
    rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_EINVAL);
    check_stopped(rt);
    peer_rt_cleanup(rt);
    cfg.run = "";
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_SESSION), CM_EINVAL);
    check_stopped(rt);
    peer_rt_cleanup(rt);

    /* a state directory nobody logged in to: the first stage fails, and
       nothing is left running (or allocated) */
    char dir[256];
    CHECK(ct_tempdir("rt-nologin", dir, sizeof dir) == 0);
    base_cfg(&cfg, VOL_LIFE);
    cfg.config_dir = dir;
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_EAUTH);
    check_stopped(rt);
    peer_rt_stop(rt);
    peer_rt_cleanup(rt);
    free(rt);
    ct_rmrf(dir);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    in_child("bad arguments", child_bad_args);
}

/* ---- pass renewal -------------------------------------------------------- */

static void child_renew_due(void)
{
    CHECK(!peer_pass_renew_due(0, 90, 0));
    CHECK(!peer_pass_renew_due(0, 90, 59));
    CHECK(peer_pass_renew_due(0, 90, 60)); /* a third of the lifetime left */
    CHECK(peer_pass_renew_due(0, 90, 89));
    CHECK(peer_pass_renew_due(0, 90, 90));
    CHECK(peer_pass_renew_due(0, 90, 100)); /* expired: still due */
    CHECK(!peer_pass_renew_due(1000, 1000 + 14400, 1000 + 9599));
    CHECK(peer_pass_renew_due(1000, 1000 + 14400, 1000 + 9600));
}

static void test_renew_due(void **state)
{
    (void)state;
    in_child("renewal due", child_renew_due);
}

/* The round trip through the backbone while the backbone accepts our pass;
 * client mode (below) makes the backbone the only node that stores our
 * records, so a round trip proves that it took the put and answered. */
static int round_trip_until(struct peer_rt *rt, int want_ok, double secs)
{
    double t0 = mono_s();
    for (;;) {
        int rc = dht_round_trip(rt, "renew"), ok = rc == CM_OK;
        if (ok == want_ok) {
            printf("DHT round trip: %s after %.1f s\n", cm_err_name(rc), mono_s() - t0);
            return 1;
        }
        if (mono_s() - t0 > secs)
            return 0;
        usleep(250000);
    }
}

static void child_renewal(void)
{
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_RENEW);
    /* A serving node keeps a copy of its own records (it is among the k
       closest), so a read could find ours without the backbone; a client
       stores only on others. */
    cfg.client_mode = 1;
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_REPORTS), CM_OK);
    CHECK(rt->net && rt->rep && rt->n_bootstrap > 0);
    CHECK(!rt->my_addr[0]); /* client mode advertises nothing */
    CHECK_RC(dht_round_trip(rt, "renew"), CM_OK);
    char *id1 = strdup(peer_rt_pass_id(rt)), *tok1 = strdup(rt->token), *boot0 = strdup(rt->bootstrap[0]);
    size_t nboot = rt->n_bootstrap, nkeys = rt->n_coord_keys;

    /* a fresh pass (the coordinator's default lifetime: 4 h) is not due */
    peer_rt_renew_pass_if_due(rt);
    CHECK_STR(peer_rt_pass_id(rt), id1);

    /* Off the allowlist: no new pass, and the current one is kept whole
       (a role keeps working with it until it expires). */
    char path[128];
    snprintf(path, sizeof path, "/api/v1/runs/%s/allowlist/vol%d", RUN, VOL_RENEW);
    CHECK(org_req("DELETE", path) == 200);
    int rc = peer_rt_renew_pass(rt);
    CHECK(rc != CM_OK);
    printf("renewal while off the allowlist: %s\n", cm_err_name(rc));
    CHECK(rt->pass != NULL);
    CHECK_STR(peer_rt_pass_id(rt), id1);
    CHECK_STR(rt->token, tok1);
    CHECK(rt->n_bootstrap == nboot && rt->n_coord_keys == nkeys);
    CHECK_STR(rt->bootstrap[0], boot0);
    CHECK(rt->stage == PEER_STAGE_REPORTS && rt->net && rt->rep);

    /* Taking the volunteer off also revoked that pass; once the backbone
       has refreshed its revocation list (every 5 s) it refuses us, so the
       round trip after the renewal below shows the new token is in use. */
    CHECK(round_trip_until(rt, 0, 20));

    CHECK(org_req("PUT", path) / 100 == 2);
    CHECK_RC(peer_rt_renew_pass(rt), CM_OK);
    CHECK(peer_rt_pass_id(rt) && strcmp(peer_rt_pass_id(rt), id1) != 0);
    CHECK(rt->token && strcmp(rt->token, tok1) != 0);
    CHECK_STR(peer_rt_username(rt), "vol1");
    CHECK(rt->n_bootstrap > 0 && rt->bootstrap[0] && strchr(rt->bootstrap[0], ':'));
    CHECK(rt->stage == PEER_STAGE_REPORTS && rt->net && rt->rep);
    if (!round_trip_until(rt, 1, 10)) {
        fprintf(stderr, "the DHT refuses the renewed pass\n");
        CHECK_RC(dht_round_trip(rt, "renew"), CM_OK);
    }
    free(id1);
    free(tok1);
    free(boot0);
    peer_rt_stop(rt);
    check_stopped(rt);
    peer_rt_cleanup(rt);
    free(rt);
}

static void test_renewal_fails_and_recovers(void **state)
{
    (void)state;
    in_child("pass renewal fails and recovers", child_renewal);
}

/* ---- Ctrl-C at each stage of start-up ---------------------------------- */

static volatile sig_atomic_t g_sigint;
static enum peer_stage g_int_at;
static enum peer_stage g_seen[16];
static size_t g_nseen;

static void on_sigint(int sig)
{
    (void)sig;
    g_sigint++;
}

static void hook(void *arg, enum peer_stage st)
{
    CHECK(arg == &g_int_at);
    if (g_nseen < sizeof g_seen / sizeof *g_seen)
        g_seen[g_nseen++] = st;
    if (st == g_int_at)
        raise(SIGINT);
}

static void child_interrupt(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGINT, &sa, NULL) == 0);

    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_INT);
    cfg.probes = 1;
    cfg.interrupted = &g_sigint;
    cfg.on_stage = hook;
    cfg.on_stage_arg = &g_int_at;
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    double t0 = mono_s();
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_ECANCELED);
    CHECK(g_sigint == 1);
    /* the hook ran before each stage, in order, up to the interrupted one */
    CHECK(g_nseen == (size_t)g_int_at);
    for (size_t i = 0; i < g_nseen; i++)
        CHECK(g_seen[i] == (enum peer_stage)(PEER_STAGE_SESSION + i));
    enum peer_stage before = (enum peer_stage)(g_int_at - 1);
    check_resources(rt, before, "vol2");
    /* still interrupted: nothing more starts */
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_ECANCELED);
    CHECK(rt->stage == before);
    peer_rt_stop(rt);
    check_stopped(rt);
    double took = mono_s() - t0;
    printf("interrupted before %s: start and stop took %.1f s\n", peer_stage_name(g_int_at), took);
    CHECK(took < DEADLINE_S / 3);

    /* Once the interrupt is handled, the same struct starts again. */
    g_sigint = 0;
    g_int_at = PEER_STAGE_NONE;
    CHECK_RC(peer_rt_start(rt, PEER_STAGE_ALL), CM_OK);
    check_resources(rt, PEER_STAGE_ALL, "vol2");
    peer_rt_cleanup(rt);
    check_stopped(rt);
    free(rt);
}

static void interrupt_at(enum peer_stage st)
{
    g_int_at = st;
    g_nseen = 0;
    g_sigint = 0;
    char name[64];
    snprintf(name, sizeof name, "Ctrl-C before %s", peer_stage_name(st));
    in_child(name, child_interrupt);
}

#define INTERRUPT_TEST(STAGE, name)                                                                     \
    static void test_interrupt_at_##name(void **state)                                                  \
    {                                                                                                   \
        (void)state;                                                                                    \
        interrupt_at(STAGE);                                                                            \
    }
INTERRUPT_TEST(PEER_STAGE_SESSION, session)
INTERRUPT_TEST(PEER_STAGE_PASS, pass)
INTERRUPT_TEST(PEER_STAGE_CLOCK, clock)
INTERRUPT_TEST(PEER_STAGE_NET, net)
INTERRUPT_TEST(PEER_STAGE_REPORTS, reports)
INTERRUPT_TEST(PEER_STAGE_PROBES, probes)

/* ---- Ctrl-C inside a stage's wait ----------------------------------------
 * The coordinator stops answering (SIGSTOP) as the stage starts, so the
 * stage's request would wait up to its 30 s deadline; Ctrl-C half a second
 * later must abandon it: CM_ECANCELED within seconds, that stage not
 * running. */

static void *sigint_later(void *arg)
{
    (void)arg;
    usleep(500000);
    kill(getpid(), SIGINT);
    return NULL;
}

static void stall_hook(void *arg, enum peer_stage st)
{
    (void)arg;
    if (st != g_int_at)
        return;
    CHECK(kill(g_c.pid, SIGSTOP) == 0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, sigint_later, NULL) == 0);
    pthread_detach(th);
}

static void child_interrupt_wait(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGINT, &sa, NULL) == 0);
    struct peer_rt_config cfg;
    base_cfg(&cfg, VOL_INT);
    cfg.interrupted = &g_sigint;
    cfg.on_stage = stall_hook;
    struct peer_rt *rt = new_rt();
    peer_rt_init(rt, &cfg, NULL);
    double t0 = mono_s();
    int rc = peer_rt_start(rt, PEER_STAGE_ALL);
    double took = mono_s() - t0;
    kill(g_c.pid, SIGCONT);
    printf("Ctrl-C in the %s stage's request: %s after %.1f s\n", peer_stage_name(g_int_at), cm_strerror(rc),
           took);
    CHECK_RC(rc, CM_ECANCELED);
    CHECK(rt->stage == (enum peer_stage)(g_int_at - 1));
    CHECK(took < 5); /* not the request's deadline */
    peer_rt_cleanup(rt);
    check_stopped(rt);
    free(rt);
}

static void interrupt_wait_at(enum peer_stage st)
{
    g_int_at = st;
    g_sigint = 0;
    char name[64];
    snprintf(name, sizeof name, "Ctrl-C in %s's request", peer_stage_name(st));
    in_child(name, child_interrupt_wait);
    kill(g_c.pid, SIGCONT); /* also when the child died before it could */
}

static void test_interrupt_in_pass_request(void **state)
{
    (void)state;
    interrupt_wait_at(PEER_STAGE_PASS);
}

static void test_interrupt_in_clock_request(void **state)
{
    (void)state;
    interrupt_wait_at(PEER_STAGE_CLOCK);
}

/* ---- set-up -------------------------------------------------------------- */

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", PW) != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, NULL) != 0 || !(g_org = ct_login(&g_c, "org", PW)))
        return -1;
    /* A run opens as it is created and gets its DHT backbone node within
       seconds; the pass stage waits for it. */
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org,
            "{\"name\":\"" RUN "\",\"target_batch_size\":64,\"config\":{\"model_parameters\":1000}}", &r);
    long st = r.status;
    ct_resp_free(&r);
    if (st != 201 || ct_volunteers(&g_c, g_org, RUN, NVOL, g_dirs) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NVOL; i++)
        if (g_dirs[i][0])
            ct_rmrf(g_dirs[i]);
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_stop_session),
        cmocka_unit_test(test_start_stop_pass),
        cmocka_unit_test(test_start_stop_clock),
        cmocka_unit_test(test_start_stop_net),
        cmocka_unit_test(test_start_stop_reports),
        cmocka_unit_test(test_start_stop_probes),
        cmocka_unit_test(test_reachability),
        cmocka_unit_test(test_start_in_steps),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_start_lower_is_noop),
        cmocka_unit_test(test_stop_without_start),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_renew_due),
        cmocka_unit_test(test_renewal_fails_and_recovers),
        cmocka_unit_test(test_interrupt_at_session),
        cmocka_unit_test(test_interrupt_at_pass),
        cmocka_unit_test(test_interrupt_at_clock),
        cmocka_unit_test(test_interrupt_at_net),
        cmocka_unit_test(test_interrupt_at_reports),
        cmocka_unit_test(test_interrupt_at_probes),
        cmocka_unit_test(test_interrupt_in_pass_request),
        cmocka_unit_test(test_interrupt_in_clock_request),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
