/* Unit tests for agent/dp/sched_follow.c: the round plan (even split
 * without a schedule, the schedule's shares, absent aggregators, determinism,
 * unknown versions), signed schedules accepted and forged / tampered /
 * foreign / expired ones ignored, the cache reloaded (and dropped when the
 * keys change), roles, and refresh / fetch / capability report against a
 * canned HTTP server on loopback (unreachable coordinator: the last valid
 * schedule stays). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/dp/sched_follow.h"
#include "agent/peer/caps.h"
#include "cm_crypto.h"
#include "cm_err.h"

static struct cm_ed25519 g_coord, g_other;

static void key_of(uint8_t k[32], int id)
{
    memset(k, 0, 32);
    k[0] = (uint8_t)id;
    k[31] = 0x77;
}

/* The addresses answer() gives its peers (NULL entries or array: none). */
static const char *const *g_ips;

/* A signed schedule answer as GET /schedule gives it. shares[i] for peer
 * key_of(i + 1); compute[i]. */
static json_t *answer(const struct cm_ed25519 *signer, const char *run, int64_t version,
                      int64_t valid_from, size_t n, const uint32_t *shares, const int *compute)
{
    struct sched_schedule s = {0};
    snprintf(s.run, sizeof s.run, "%s", run);
    s.version = version;
    s.issued_at = valid_from;
    s.valid_from = valid_from;
    s.valid_until = valid_from + 600;
    snprintf(s.kid, sizeof s.kid, "AbCdEfGhIjKlMnOp");
    s.group_size = (uint32_t)n;
    s.steps_per_s = 0.5;
    s.target_batch = 64;
    s.n = n;
    s.peers = calloc(n, sizeof *s.peers);
    assert_non_null(s.peers);
    for (size_t i = 0; i < n; i++) {
        key_of(s.peers[i].key, (int)i + 1);
        s.peers[i].share = shares[i];
        s.peers[i].compute = compute ? compute[i] : 1;
        s.peers[i].client_mode = 0;
        if (g_ips && g_ips[i])
            snprintf(s.peers[i].ip, sizeof s.peers[i].ip, "%s", g_ips[i]);
    }
    char *payload = NULL;
    size_t plen = 0;
    assert_int_equal(sched_schedule_encode(&s, &payload, &plen), CM_OK);
    uint8_t sig[64];
    assert_int_equal(sched_sign(signer, payload, plen, sig), CM_OK);
    char *p64 = malloc(cm_b64url_encoded_len(plen) + 1), s64[128];
    assert_non_null(p64);
    cm_b64url_encode(payload, plen, p64);
    cm_b64url_encode(sig, sizeof sig, s64);
    json_t *o = json_pack("{s:s, s:I, s:s, s:s}", "run", run, "version", (json_int_t)version,
                          "payload", p64, "signature", s64);
    free(p64);
    free(payload);
    sched_schedule_cleanup(&s);
    return o;
}

static struct dp_sched *open_js(const char *dir, const struct cm_ed25519 *key)
{
    struct dp_sched *js = NULL;
    const uint8_t(*keys)[32] = (const uint8_t(*)[32])key->pub;
    assert_int_equal(dp_sched_open(dir, "r1", keys, 1, &js), CM_OK);
    return js;
}

static void members(struct ar_member *am, size_t n, const int *ids)
{
    memset(am, 0, n * sizeof *am);
    for (size_t i = 0; i < n; i++) {
        key_of(am[i].pub, ids[i]);
        am[i].sends = 1;
    }
}

static void test_plan_without_schedule(void **state)
{
    (void)state;
    struct dp_sched *js = open_js(NULL, &g_coord);
    struct ar_member am[4];
    int ids[] = {1, 2, 3, 4}, ok[] = {1, 0, 1, 1}, none[] = {0, 0, 0, 0};
    members(am, 4, ids);
    assert_int_equal(dp_sched_version(js), 0);
    assert_int_equal(dp_sched_plan(js, am, ok, 4), CM_OK);
    assert_true(am[0].fraction == 1.0 / 3 && am[1].fraction == 0 && am[2].fraction == 1.0 / 3 &&
                am[3].fraction == 1.0 / 3);
    assert_int_equal(am[0].sends, 1); /* left as the caller set it */
    assert_int_equal(dp_sched_plan(js, am, none, 4), CM_EINVAL);
    assert_int_equal(dp_sched_plan_version(js, 7, am, ok, 4), CM_ENOTFOUND);
    int c = -1, a = -1;
    dp_sched_role(js, am[0].pub, 1, &c, &a);
    assert_true(c == 1 && a == 1);
    dp_sched_role(js, am[0].pub, 0, &c, &a);
    assert_true(c == 1 && a == 0);
    dp_sched_close(js);
}

static void test_plan_follows_shares(void **state)
{
    (void)state;
    struct dp_sched *js = open_js(NULL, &g_coord);
    int64_t now = (int64_t)time(NULL);
    /* peers 1..4: a parameter server (4) with 70 %, peer 3 with 20 %, peer 2 with 10 % */
    uint32_t shares[] = {0, 100000000, 200000000, 700000000};
    int compute[] = {1, 1, 1, 0};
    json_t *a = answer(&g_coord, "r1", 3, now, 4, shares, compute);
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_OK);
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_OK); /* again: no change */
    json_decref(a);
    assert_int_equal(dp_sched_version(js), 3);

    struct ar_member am[5], am2[5];
    int ids[] = {1, 2, 3, 4, 9}, ok[] = {1, 1, 1, 1, 1};
    members(am, 5, ids);
    assert_int_equal(dp_sched_plan(js, am, ok, 5), CM_OK);
    assert_true(am[0].fraction == 0 && am[1].fraction == 0.1 && am[2].fraction == 0.2 &&
                am[3].fraction == 0.7 && am[4].fraction == 0); /* 9: not in the schedule */
    /* Deterministic: the same inputs give the same bits. */
    members(am2, 5, ids);
    assert_int_equal(dp_sched_plan_version(js, 3, am2, ok, 5), CM_OK);
    assert_memory_equal(am, am2, sizeof am);

    /* Peer 3 absent: the others keep their proportions (10 : 70). */
    int ids2[] = {1, 2, 4, 9};
    members(am, 4, ids2);
    assert_int_equal(dp_sched_plan(js, am, ok, 4), CM_OK);
    assert_true(am[1].fraction == 0.1 && am[2].fraction == 0.7 && am[0].fraction == 0);
    /* The parameter server cannot be reached: 30 % left, below half -> even split. */
    int ok2[] = {1, 1, 0, 1};
    members(am, 4, ids2);
    assert_int_equal(dp_sched_plan(js, am, ok2, 4), CM_OK);
    assert_true(am[0].fraction == 1.0 / 3 && am[1].fraction == 1.0 / 3 && am[2].fraction == 0 &&
                am[3].fraction == 1.0 / 3);
    /* Version 0 on every member: even split even though a schedule is held. */
    members(am, 4, ids2);
    assert_int_equal(dp_sched_plan_version(js, 0, am, ok, 4), CM_OK);
    assert_true(am[0].fraction == 0.25 && am[3].fraction == 0.25);

    int c, ag;
    dp_sched_role(js, am[2].pub, 1, &c, &ag); /* peer 4 */
    assert_true(c == 0 && ag == 1);
    key_of(am[0].pub, 1);
    dp_sched_role(js, am[0].pub, 1, &c, &ag);
    assert_true(c == 1 && ag == 0);
    dp_sched_close(js);
}

static void set_addr(struct ar_member *m, const char *ip, int port)
{
    memset(&m->addr, 0, sizeof m->addr);
    if (strchr(ip, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&m->addr;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        assert_int_equal(inet_pton(AF_INET6, ip, &a6->sin6_addr), 1);
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&m->addr;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        assert_int_equal(inet_pton(AF_INET, ip, &a4->sin_addr), 1);
    }
}

/* Members 1..4 announcing averaging addresses at these hosts (port 7000). */
static void announce4(struct ar_member *am, const int *ids, const char *a0, const char *a1, const char *a2,
                      const char *a3)
{
    const char *ip[4] = {a0, a1, a2, a3};
    members(am, 4, ids);
    for (int i = 0; i < 4; i++)
        set_addr(&am[i], ip[i], 7000);
}

/* A member announcing an averaging address elsewhere than the schedule
 * gives its key (another host's: issue 17) aggregates nothing; the others
 * keep their proportions, or split evenly without it; an IPv4 address
 * matches its IPv4-mapped form; a peer the schedule gives no address is
 * not checked. Every member computes the same plan. */
static void test_plan_refuses_announced_elsewhere(void **state)
{
    (void)state;
    struct dp_sched *js = open_js(NULL, &g_coord);
    int64_t now = (int64_t)time(NULL);
    uint32_t shares[] = {400000000, 300000000, 300000000, 0};
    const char *ips[] = {"10.0.0.1", "10.0.0.2", "2001:db8::3", NULL};
    g_ips = ips;
    json_t *a = answer(&g_coord, "r1", 5, now, 4, shares, NULL);
    g_ips = NULL;
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_OK);
    json_decref(a);
    assert_string_equal(dp_sched_ip_of(js, 5, (const uint8_t[32]){2, [31] = 0x77}), "10.0.0.2");

    struct ar_member am[4], am2[4];
    int ids[] = {1, 2, 3, 4}, ok[] = {1, 1, 1, 1};
    /* peer 4 has no address in the schedule: not checked */
    announce4(am, ids, "10.0.0.1", "::ffff:10.0.0.2", "2001:db8::3", "10.9.9.9");
    uint64_t refused = 99;
    assert_int_equal(dp_sched_plan_checked(js, 5, am, ok, 4, &refused), CM_OK);
    assert_true(refused == 0);
    assert_true(am[0].fraction == 0.4 && am[1].fraction == 0.3 && am[2].fraction == 0.3 && am[3].fraction == 0);

    /* peer 2 announces peer 1's host: refused, 1 and 3 keep 40 : 30 */
    announce4(am, ids, "10.0.0.1", "10.0.0.1", "2001:db8::3", "10.9.9.9");
    assert_int_equal(dp_sched_plan_checked(js, 5, am, ok, 4, &refused), CM_OK);
    assert_true(refused == 2);
    assert_true(am[0].fraction == 0.4 && am[1].fraction == 0 && am[2].fraction == 0.3);
    /* the same through dp_sched_plan_version: the same bits */
    memcpy(am2, am, sizeof am);
    for (int i = 0; i < 4; i++)
        am2[i].fraction = -1;
    assert_int_equal(dp_sched_plan_version(js, 5, am2, ok, 4), CM_OK);
    assert_memory_equal(am, am2, sizeof am);

    /* 1 and 2 both elsewhere (70 % refused): even split over 3 and 4,
       never over a refused one */
    announce4(am, ids, "10.0.0.7", "2001:db8::2", "2001:db8::3", "10.9.9.9");
    assert_int_equal(dp_sched_plan_checked(js, 5, am, ok, 4, &refused), CM_OK);
    assert_true(refused == 3);
    assert_true(am[0].fraction == 0 && am[1].fraction == 0 && am[2].fraction == 0.5 && am[3].fraction == 0.5);
    /* nobody left to aggregate */
    int ok3[] = {1, 1, 0, 0};
    members(am, 4, ids);
    set_addr(&am[0], "10.0.0.7", 7000);
    set_addr(&am[1], "10.0.0.1", 7000);
    assert_int_equal(dp_sched_plan_checked(js, 5, am, ok3, 4, &refused), CM_EINVAL);
    /* version 0 (no schedule agreed): nothing to check against */
    members(am, 4, ids);
    set_addr(&am[0], "10.0.0.7", 7000);
    assert_int_equal(dp_sched_plan_checked(js, 0, am, ok, 4, &refused), CM_OK);
    assert_true(refused == 0 && am[0].fraction == 0.25);
    dp_sched_close(js);
}

static void test_forged_and_stale_ignored(void **state)
{
    (void)state;
    struct dp_sched *js = open_js(NULL, &g_coord);
    int64_t now = (int64_t)time(NULL);
    uint32_t shares[] = {500000000, 500000000};
    json_t *good = answer(&g_coord, "r1", 5, now, 2, shares, NULL);
    assert_int_equal(dp_sched_accept(js, good, now, 1), CM_OK);
    json_decref(good);

    uint32_t evil[] = {0, 1000000000};
    json_t *a = answer(&g_other, "r1", 6, now, 2, evil, NULL); /* another key */
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_EBADSIG);
    json_decref(a);
    /* Signed by the coordinator but tampered with: the payload of version 6 with the
     * signature of another payload. */
    json_t *b = answer(&g_coord, "r1", 6, now, 2, evil, NULL);
    json_t *c = answer(&g_coord, "r1", 7, now, 2, evil, NULL);
    json_object_set(b, "signature", json_object_get(c, "signature"));
    assert_int_equal(dp_sched_accept(js, b, now, 1), CM_EBADSIG);
    json_decref(b);
    json_decref(c);
    a = answer(&g_coord, "other-run", 8, now, 2, evil, NULL);
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_EINVAL);
    json_decref(a);
    a = answer(&g_coord, "r1", 9, now - 3600, 2, evil, NULL); /* expired an hour ago */
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_EEXPIRED);
    json_decref(a);
    a = json_pack("{s:s, s:s}", "payload", "!!", "signature", "AA");
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_EPARSE);
    json_decref(a);
    assert_int_equal(dp_sched_version(js), 5);
    assert_int_equal(dp_sched_current(js)->peers[0].share, 500000000);

    /* An expired version fetched on purpose (check_window 0) is held, and an older
     * one does not become the current schedule. */
    a = answer(&g_coord, "r1", 4, now - 3600, 2, evil, NULL);
    assert_int_equal(dp_sched_accept(js, a, now, 0), CM_OK);
    json_decref(a);
    assert_int_equal(dp_sched_version(js), 5);
    assert_true(dp_sched_has_version(js, 4));
    /* Only DP_SCHED_KEEP versions are kept, the newest. */
    for (int v = 10; v < 10 + DP_SCHED_KEEP; v++) {
        a = answer(&g_coord, "r1", v, now, 2, shares, NULL);
        assert_int_equal(dp_sched_accept(js, a, now, 1), CM_OK);
        json_decref(a);
    }
    assert_int_equal(dp_sched_version(js), 10 + DP_SCHED_KEEP - 1);
    assert_false(dp_sched_has_version(js, 5));
    assert_true(dp_sched_has_version(js, 10));
    dp_sched_close(js);
}

static void test_cache_reload(void **state)
{
    (void)state;
    char dir[] = "/tmp/ct-sched-follow-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int64_t now = (int64_t)time(NULL);
    uint32_t shares[] = {250000000, 750000000};
    struct dp_sched *js = open_js(dir, &g_coord);
    json_t *a = answer(&g_coord, "r1", 12, now, 2, shares, NULL);
    assert_int_equal(dp_sched_accept(js, a, now, 1), CM_OK);
    json_decref(a);
    dp_sched_close(js);

    char path[256];
    snprintf(path, sizeof path, "%s/schedule-r1.json", dir);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    js = open_js(dir, &g_coord);
    assert_int_equal(dp_sched_version(js), 12);
    struct ar_member am[2];
    int ids[] = {1, 2}, ok[] = {1, 1};
    members(am, 2, ids);
    assert_int_equal(dp_sched_plan(js, am, ok, 2), CM_OK);
    assert_true(am[0].fraction == 0.25 && am[1].fraction == 0.75);
    dp_sched_close(js);

    /* Keys rotated away: the cached schedule no longer verifies and is dropped. */
    js = open_js(dir, &g_other);
    assert_int_equal(dp_sched_version(js), 0);
    dp_sched_close(js);
    /* A tampered cache file is dropped too. */
    FILE *f = fopen(path, "r+");
    assert_non_null(f);
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    char *p = strstr(buf, "\"payload\": \"");
    assert_non_null(p);
    p += 14;
    *p = *p == 'A' ? 'B' : 'A';
    rewind(f);
    fwrite(buf, 1, n, f);
    fclose(f);
    js = open_js(dir, &g_coord);
    assert_int_equal(dp_sched_version(js), 0);
    dp_sched_close(js);
    unlink(path);
    rmdir(dir);
}

/* ---- a canned HTTP server on loopback ---- */

struct canned {
    int fd, port;
    pthread_t th;
    int status;
    char body[16384];
    char last_req[16384]; /* request line + body of the last request */
    pthread_mutex_t mu;
    int stop;
};

static void *serve(void *arg)
{
    struct canned *c = arg;
    for (;;) {
        int s = accept(c->fd, NULL, NULL);
        if (s < 0)
            return NULL;
        pthread_mutex_lock(&c->mu);
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (stop) {
            close(s);
            return NULL;
        }
        char req[16384];
        size_t got = 0;
        long clen = -1;
        char *hend = NULL;
        while (got < sizeof req - 1) {
            ssize_t r = recv(s, req + got, sizeof req - 1 - got, 0);
            if (r <= 0)
                break;
            got += (size_t)r;
            req[got] = 0;
            if (!hend && (hend = strstr(req, "\r\n\r\n"))) {
                char *cl = strcasestr(req, "content-length:");
                clen = cl && cl < hend ? strtol(cl + 15, NULL, 10) : 0;
            }
            if (hend && (long)(got - (size_t)(hend + 4 - req)) >= clen)
                break;
        }
        req[got] = 0;
        pthread_mutex_lock(&c->mu);
        snprintf(c->last_req, sizeof c->last_req, "%.*s %s", (int)strcspn(req, "\r"), req,
                 hend ? hend + 4 : "");
        char out[20000];
        int len = snprintf(out, sizeof out,
                           "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: "
                           "%zu\r\nConnection: close\r\n\r\n%s",
                           c->status, strlen(c->body), c->body);
        pthread_mutex_unlock(&c->mu);
        (void)!send(s, out, (size_t)len, MSG_NOSIGNAL);
        close(s);
    }
}

static void canned_start(struct canned *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(c->fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    assert_int_equal(getsockname(c->fd, (struct sockaddr *)&a, &al), 0);
    c->port = ntohs(a.sin_port);
    assert_int_equal(listen(c->fd, 8), 0);
    assert_int_equal(pthread_create(&c->th, NULL, serve, c), 0);
}

static void canned_set(struct canned *c, int status, json_t *body)
{
    char *t = json_dumps(body, JSON_COMPACT);
    assert_non_null(t);
    pthread_mutex_lock(&c->mu);
    c->status = status;
    snprintf(c->body, sizeof c->body, "%s", t);
    pthread_mutex_unlock(&c->mu);
    free(t);
}

static void canned_stop(struct canned *c)
{
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_mutex_unlock(&c->mu);
    int s = socket(AF_INET, SOCK_STREAM, 0); /* wake accept() */
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)c->port);
    (void)!connect(s, (struct sockaddr *)&a, sizeof a);
    close(s);
    pthread_join(c->th, NULL);
    close(c->fd);
    pthread_mutex_destroy(&c->mu);
}

static void test_refresh_and_report(void **state)
{
    (void)state;
    struct canned srv;
    canned_start(&srv);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv.port);
    struct agent_client coord = {url, NULL, "session-token"};
    struct dp_sched *js = open_js(NULL, &g_coord);
    int64_t now = (int64_t)time(NULL);
    uint32_t shares[] = {400000000, 600000000};

    json_t *a = answer(&g_coord, "r1", 2, now, 2, shares, NULL);
    canned_set(&srv, 200, a);
    json_decref(a);
    assert_int_equal(dp_sched_refresh(js, &coord), CM_OK);
    assert_int_equal(dp_sched_version(js), 2);
    assert_non_null(strstr(srv.last_req, "GET /api/v1/runs/r1/schedule "));

    /* A forged newer one: ignored, the last valid one stays. */
    a = answer(&g_other, "r1", 3, now, 2, shares, NULL);
    canned_set(&srv, 200, a);
    json_decref(a);
    assert_int_equal(dp_sched_refresh(js, &coord), CM_OK);
    assert_int_equal(dp_sched_version(js), 2);
    /* An error answer: the same. */
    a = json_pack("{s:{s:s, s:s}}", "error", "code", "no_peers", "message", "nobody");
    canned_set(&srv, 409, a);
    json_decref(a);
    assert_int_equal(dp_sched_refresh(js, &coord), CM_OK);
    assert_int_equal(dp_sched_version(js), 2);

    /* Fetching a version: the answer of /schedules/{version}. */
    a = answer(&g_coord, "r1", 1, now - 7200, 2, shares, NULL);
    canned_set(&srv, 200, a);
    json_decref(a);
    assert_int_equal(dp_sched_fetch_version(js, &coord, 1), CM_OK);
    assert_non_null(strstr(srv.last_req, "GET /api/v1/runs/r1/schedules/1 "));
    assert_true(dp_sched_has_version(js, 1));
    assert_int_equal(dp_sched_version(js), 2);
    /* The server answers another version than asked: refused. */
    assert_int_equal(dp_sched_fetch_version(js, &coord, 4), CM_EPROTO);

    /* Capability report: the body the coordinator expects. */
    struct peer_caps caps = {0};
    caps.sps = 812.5;
    caps.up_mbps = 100;
    caps.down_mbps = 400;
    caps.inbound = 1;
    caps.n_pairs = 1;
    key_of(caps.pairs[0].pub, 2);
    caps.pairs[0].mbps = 55;
    uint8_t me[32];
    key_of(me, 1);
    a = json_pack("{s:s}", "run", "r1");
    canned_set(&srv, 200, a);
    json_decref(a);
    assert_int_equal(peer_caps_report(&coord, "r1", me, &caps), CM_OK);
    char *body = strchr(srv.last_req, '{');
    assert_non_null(strstr(srv.last_req, "POST /api/v1/runs/r1/capabilities "));
    json_t *j = json_loads(body, 0, NULL);
    assert_non_null(j);
    assert_true(json_real_value(json_object_get(j, "samples_per_s")) == 812.5);
    assert_true(json_is_true(json_object_get(j, "accepts_inbound")));
    char k64[64];
    cm_b64url_encode(me, 32, k64);
    assert_string_equal(json_string_value(json_object_get(j, "peer_public_key")), k64);
    assert_int_equal(json_array_size(json_object_get(j, "pairs")), 1);
    json_decref(j);
    a = json_pack("{s:{s:s, s:s}}", "error", "code", "no_pass", "message", "no pass");
    canned_set(&srv, 403, a);
    json_decref(a);
    assert_int_equal(peer_caps_report(&coord, "r1", me, &caps), CM_EAUTH);

    /* Coordinator gone: keep the last valid schedule. */
    canned_stop(&srv);
    assert_int_equal(dp_sched_refresh(js, &coord), CM_OK);
    assert_int_equal(dp_sched_version(js), 2);
    dp_sched_close(js);
}

static void test_caps_changed(void **state)
{
    (void)state;
    struct peer_caps a = {0}, b;
    a.sps = 100;
    a.up_mbps = 100;
    a.down_mbps = 100;
    a.inbound = 1;
    a.n_pairs = 1;
    key_of(a.pairs[0].pub, 3);
    a.pairs[0].mbps = 50;
    b = a;
    assert_false(peer_caps_changed(&a, &b));
    b.up_mbps = 85; /* 15 % */
    assert_false(peer_caps_changed(&a, &b));
    b.up_mbps = 70; /* 30 % */
    assert_true(peer_caps_changed(&a, &b));
    b = a;
    b.inbound = 0;
    assert_true(peer_caps_changed(&a, &b));
    b = a;
    b.pairs[0].mbps = 20;
    assert_true(peer_caps_changed(&a, &b));
    b = a;
    key_of(b.pairs[0].pub, 4);
    assert_true(peer_caps_changed(&a, &b));
    assert_true(peer_caps_changed(NULL, &a));
}

int main(void)
{
    if (cm_ed25519_generate(&g_coord) != CM_OK || cm_ed25519_generate(&g_other) != CM_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_without_schedule),
        cmocka_unit_test(test_plan_follows_shares),
        cmocka_unit_test(test_plan_refuses_announced_elsewhere),
        cmocka_unit_test(test_forged_and_stale_ignored),
        cmocka_unit_test(test_cache_reload),
        cmocka_unit_test(test_refresh_and_report),
        cmocka_unit_test(test_caps_changed),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cm_ed25519_cleanup(&g_coord);
    cm_ed25519_cleanup(&g_other);
    return rc;
}
