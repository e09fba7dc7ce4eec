/* ct-timeout: 600 */
/* Volunteers on separate hosts (issue 17), with the command lines a
 * volunteer types and default flags: PostgreSQL and the coordinator on one
 * host of a test bed of network namespaces (tests/harness/ct_net.h), agents
 * on others, each logged in at the coordinator's public address.
 *
 *  - public: four agents on four public hosts. Every agent is dialed back
 *    at its own host's address and announces it (before this, an agent
 *    listening on 0.0.0.0 announced 127.0.0.1 and the hosts never averaged);
 *    every round holds all four, every part is averaged, the parameters are
 *    identical at every step and the loss falls.
 *  - behind NAT: two public agents and four behind two home routers (two
 *    per router; one port-preserving "cone-like" MASQUERADE, one
 *    --random-fully "symmetric-like"). The NAT'ed agents find out by
 *    themselves, within 10 s, that peers cannot reach them (the coordinator
 *    sees them at their router's address and its dial-back fails there),
 *    reserve ports at a public agent (a circuit relay, docs/p2p.md
 *    "Relays") and announce those; the schedule gives them parts and they
 *    aggregate through their relays (their step logs say so). Same checks:
 *    all six in every round, all parts averaged, identical parameters, the
 *    loss falls; the organizer sees them as relayed, at their router. In
 *    the normal build this run trains the recipe's 500 steps and every
 *    agent's test accuracy reaches 88.5 %, as on public hosts.
 *  - a relay killed: two public agents and two NAT'ed ones; once the
 *    NAT'ed ones are relayed and at step 8, the public agent relaying for
 *    the first is killed (SIGKILL). Its NAT'ed agents say the relay was
 *    lost, reserve at the other public agent and take part through it; the
 *    survivors finish every step with identical parameters, having lost
 *    only the rounds in flight (at most 4 each).
 *  - all behind NAT: two agents, one behind each router, and nobody
 *    reachable but the coordinator, whose backbone node relays for them
 *    (--relay-reservations): the same checks as the public run.
 *  - another host's address: three agents and a fourth that announces
 *    the first one's host with the same ports (--advertise-ip). Everything
 *    sent to it reaches the first agent, which refuses it (addressed to
 *    another key); the schedule gives every peer the address its reports
 *    come from, so every member refuses the liar as an aggregator and says
 *    so, the liar is told, and the rest trains as if it were not there.
 *  - lost: three agents that announce the coordinator's host
 *    (--advertise-ip), where nothing listens for them, so every round fails.
 *    No round that averaged nothing (or only part) is a step or credited; a
 *    step taken alone is the most a peer does (when it no longer sees the
 *    others, stuck fetching a state nobody has); the console and the step
 *    log say why per part, and the coordinator's stats (the dashboard's
 *    banner) say the run is not averaging within a minute.
 *
 * The collaborations run at once (separate runs, same coordinator). Needs
 * root, ip and iptables (skips otherwise) and Fashion-MNIST. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_hostrun.h"
#include "ct_join.h"
#include "ct_net.h"
#include "ct_steps.h"

#if defined(__SANITIZE_ADDRESS__)
#define STEPS 24
#else
#define STEPS 30
#endif
/* The links' run trains only as long as its checks need: the links are
   measured before its first step and its schedule comes by step 3 (12: the
   least a run with the recipe's 10 warm-up steps may have); its 30 steps at
   the 10 Mbit/s host's pace took ~60 s, the longest of the file's runs,
   and checked nothing more */
#define LINK_STEPS 12
/* The NAT run trains the recipe's 500 steps to its accuracy (issue 17:
   >= 88.5 % on every agent, as on public hosts) in the normal build; under
   the sanitizers it trains STEPS, with the same checks but the accuracy */
#if defined(__SANITIZE_ADDRESS__)
#define NAT_STEPS STEPS
#else
#define NAT_STEPS 500
#endif
#define NAT_ACCURACY 88.5
/* every agent of a run in its rounds within this many seconds of the run's
   first step (the 10 s to know a peer's reachability): 2.6-2.9 s
   in the normal build */
#define ALL_IN_S 10.0
_Static_assert(NAT_STEPS <= CT_STEPS_MAX, "the step logs' fold holds every step of the NAT run");
#define PORT "8443"
#define NPUB 4
#define NNAT_PUB 2
#define NNAT_PRIV 4
#define NLOST 3
#define NLINKS 3
#define NKILL 4 /* two public agents, two behind the cone-like router */
#define KILL_AT_STEP 8
#define NALLNAT 2 /* behind the two routers, nobody reachable but the coordinator */
#define NLIAR 4   /* three honest agents and one announcing the first one's host */
#define LIAR_AR_PORT "7411"
#define LIAR_DHT_PORT "7412"
#define MAXA CT_HOSTRUN_MAX

static struct ct_net g_net;
static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static int g_coord_host;
/* The NAT runs check that agents behind NAT aggregate through relays and
   punched holes: their schedules ignore what relaying costs the relays'
   links (relay_traffic "ignored"); counted, as by default, the schedule
   gives these equal links' relayed agents no part (docs/schedules.md) */
static struct ct_hostrun g_pub = {.run = "hosts-public"},
                     g_nat = {.run = "hosts-nat", .nsteps = NAT_STEPS, .eval = NAT_STEPS > STEPS, .relay_free = 1},
                     g_lost = {.run = "hosts-lost"},
                     g_links = {.run = "hosts-links", .nsteps = LINK_STEPS};
static struct ct_hostrun g_kill = {.run = "hosts-relaykill", .relay_free = 1}, g_allnat = {.run = "hosts-allnat"};
/* The liar run trains in the normal build only: beside the other runs its
   four more agents under the sanitizers left the 24-step NAT run's rounds
   without one of its agents in 12 of 24 steps (a fresh clone); what it
   exercises runs under the sanitizers in test_sched_follow and
   test_schedule. */
#if defined(__SANITIZE_ADDRESS__)
#define LIAR_RUN 0
#else
#define LIAR_RUN 1
#endif
static struct ct_hostrun g_liar = {.run = "hosts-liar"};
/* The cone-like router drops unsolicited connections and the NAT run checks
   that the public agents punched holes to the agents behind it: in the
   normal build (setup says why not under the sanitizers) */
#if defined(__SANITIZE_ADDRESS__)
#define PUNCH_CHECKED 0
#else
#define PUNCH_CHECKED 1
#endif
static char g_liar_ip[40]; /* the host whose address the liar announces (g_liar's agent 0) */
static const double LINK_CAPS[] = {10, 50, 200}; /* Mbit/s, tc tbf, both directions */
#define LINK_UP_CAP0 "8" /* --max-upload-mbps of the first links agent (Mbit/s) */
static int g_vol; /* volunteers made so far */
static int g_teardown_failed;

static int prepare(struct ct_hostrun *c)
{
    json_t *recipe = ct_fmnist_recipe(c->nsteps ? c->nsteps : STEPS);
    if (recipe && c->relay_free)
        json_object_set_new(json_object_get(recipe, "collaboration"), "relay_traffic", json_string("ignored"));
    char *body = ct_run_body(c->run, recipe);
    json_decref(recipe);
    if (!body)
        return -1;
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    long st = r.status;
    ct_resp_free(&r);
    if (st != 201)
        return -1;
    char url[64];
    snprintf(url, sizeof url, "https://%s:" PORT, g_net.h[g_coord_host].ip);
    if (ct_net_volunteers(&g_net, &g_c, g_org, c->run, url, g_vol, c->n, c->host, c->dir) != 0)
        return -1;
    g_vol += c->n;
    return 0;
}

static int start(struct ct_hostrun *c, const char *extra0, const char *extra1)
{
    return ct_hostrun_start(c, &g_net, extra0, extra1);
}

static int setup(void **state)
{
    (void)state;
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("skipped: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        exit(CT_SKIP);
    }
    int rc = ct_net_init(&g_net);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (rc != 0 || (g_coord_host = ct_net_public(&g_net, "coord")) < 0)
        return -1;
    g_pub.n = NPUB;
    for (int i = 0; i < NPUB; i++) {
        char name[16];
        snprintf(name, sizeof name, "pub%d", i);
        if ((g_pub.host[i] = ct_net_public(&g_net, name)) < 0)
            return -1;
    }
    g_lost.n = NLOST;
    for (int i = 0; i < NLOST; i++) {
        char name[16];
        snprintf(name, sizeof name, "lost%d", i);
        if ((g_lost.host[i] = ct_net_public(&g_net, name)) < 0)
            return -1;
    }
    g_links.n = NLINKS;
    for (int i = 0; i < NLINKS; i++) {
        char name[16];
        snprintf(name, sizeof name, "link%.0f", LINK_CAPS[i]);
        if ((g_links.host[i] = ct_net_public(&g_net, name)) < 0 || ct_net_cap(&g_net, g_links.host[i], LINK_CAPS[i]))
            return -1;
    }
    /* the slowest volunteer declares an upload cap under its link's and
       nothing else: the cap is reported, the download still measured */
    g_links.extra_of[0][0] = "--max-upload-mbps";
    g_links.extra_of[0][1] = LINK_UP_CAP0;
    /* the second one paces itself at 0.9 of what it measured */
    g_links.extra_of[1][0] = "--pace";
    g_links.extra_of[1][1] = "0.9";
    int cone = ct_net_router(&g_net, 0), sym = ct_net_router(&g_net, 1);
    /* the cone-like router drops what nobody behind it asked for, as most
       home routers do (a reset would end a hole punch's try: test_punch).
       Not under the sanitizers: the two agents behind it learn their
       reachability after the dial-back's 3 s deadline, then reserve at a
       relay and fetch the collaboration's state, and the sanitizer build's
       24 steps went faster: all six were in the rounds from step 13, past
       the check's half of the run (identical parameters throughout: late
       newcomers take the collaboration's state, accum.c) */
    if (cone < 0 || sym < 0 || (PUNCH_CHECKED && ct_net_router_stealth(&g_net, cone) != 0))
        return -1;
    g_kill.n = NKILL;
    for (int i = 0; i < NKILL; i++) {
        char name[16];
        snprintf(name, sizeof name, "rk%d", i);
        g_kill.host[i] = i < 2 ? ct_net_public(&g_net, name) : ct_net_private(&g_net, name, cone);
        if (g_kill.host[i] < 0)
            return -1;
    }
    g_liar.n = NLIAR;
    for (int i = 0; i < NLIAR; i++) {
        char name[16];
        snprintf(name, sizeof name, "liar%d", i);
        if ((g_liar.host[i] = ct_net_public(&g_net, name)) < 0)
            return -1;
        /* every agent of the run on the same ports; the last announces
           agent 0's host as its own */
        g_liar.extra_of[i][0] = "--ar-port";
        g_liar.extra_of[i][1] = LIAR_AR_PORT;
        g_liar.extra_of[i][2] = "--dht-port";
        g_liar.extra_of[i][3] = LIAR_DHT_PORT;
    }
    snprintf(g_liar_ip, sizeof g_liar_ip, "%s", g_net.h[g_liar.host[0]].ip);
    g_liar.extra_of[NLIAR - 1][4] = "--advertise-ip";
    g_liar.extra_of[NLIAR - 1][5] = g_liar_ip;
    g_allnat.n = NALLNAT;
    for (int i = 0; i < NALLNAT; i++) {
        char name[16];
        snprintf(name, sizeof name, "an%d", i);
        if ((g_allnat.host[i] = ct_net_private(&g_net, name, i == 0 ? cone : sym)) < 0)
            return -1;
    }
    g_nat.n = NNAT_PUB + NNAT_PRIV;
    for (int i = 0; i < g_nat.n; i++) {
        char name[16];
        snprintf(name, sizeof name, "nat%d", i);
        g_nat.host[i] = i < NNAT_PUB ? ct_net_public(&g_net, name)
                                     : ct_net_private(&g_net, name, i < NNAT_PUB + 2 ? cone : sym);
        if (g_nat.host[i] < 0)
            return -1;
    }
    /* PostgreSQL and the coordinator live on the coordinator's host: this
       process moves there (before any thread starts) */
    if (ct_net_enter(&g_net, g_coord_host) != 0)
        return -1;
    rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    char public_url[64];
    snprintf(public_url, sizeof public_url, "https://%s:" PORT, g_net.h[g_coord_host].ip);
    /* The backbone measures as many links at once as the NAT run has
       agents (its default of 4 queued the last two: under the sanitizers
       they joined 8-14 steps after the others, and the run of 24 steps had
       all six in every round only from step 15 on; the coordinator's link
       here is uncapped, unlike the hosts') */
    /* --relay-reservations: the run whose agents are all behind NAT
       relays through the coordinator's backbone node */
    const char *args[] = {"--listen", "0.0.0.0:" PORT, "--public-url", public_url, "--dht-listen-ip", "0.0.0.0",
                          "--probe-slots", "8", "--relay-reservations", "8", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    /* the lost ones announce the coordinator's host, where nobody listens
       for them: every round they try fails */
    if (!g_org || prepare(&g_pub) != 0 || prepare(&g_nat) != 0 || prepare(&g_lost) != 0 || prepare(&g_kill) != 0 ||
        prepare(&g_allnat) != 0 || (LIAR_RUN && prepare(&g_liar) != 0) ||
        prepare(&g_links) != 0 ||
        start(&g_links, NULL, NULL) != 0)
        return -1;
    /* The backbone measures one link at a time (agents that join together
       queue, and give up after 10 s to try again later): the capped hosts
       measure theirs first, then the others join. */
    for (double t0 = ct_hostrun_now(); ct_hostrun_now() - t0 < 40;) {
        int measured = 0;
        for (int i = 0; i < g_links.n; i++) {
            char *log = ct_read_file(g_links.log[i], NULL);
            measured += log && (strstr(log, "\nlink: ") || !strncmp(log, "link: ", 6) ||
                                strstr(log, "the link could not be measured"));
            free(log);
        }
        if (measured == g_links.n)
            break;
        usleep(200000);
    }
    if (start(&g_lost, "--advertise-ip", g_net.h[g_coord_host].ip) != 0 || start(&g_pub, NULL, NULL) != 0 ||
        (!g_nat.eval && start(&g_nat, NULL, NULL) != 0) || start(&g_kill, NULL, NULL) != 0 ||
        start(&g_allnat, NULL, NULL) != 0 || (LIAR_RUN && start(&g_liar, NULL, NULL) != 0))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    struct ct_hostrun *all[] = {&g_pub, &g_nat, &g_lost, &g_links, &g_kill, &g_allnat, &g_liar};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        ct_hostrun_cleanup(all[k]);
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    ct_net_destroy(&g_net);
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

/* When the coordinator's stats of the lost run first said it is not
 * averaging (seconds after its agents started; 0: not yet), and why. */
static double g_lost_flagged;
static char g_lost_reason[400];

static void watch_lost_stats(void)
{
    if (g_lost_flagged || !g_lost.t0)
        return;
    struct ct_resp r;
    if (ct_http(&g_c, "GET", "/api/v1/runs/hosts-lost/stats", NULL, NULL, &r) == 0 && r.status == 200) {
        json_t *a = json_object_get(r.json, "averaging");
        if (json_is_true(json_object_get(a, "not_averaging"))) {
            g_lost_flagged = ct_hostrun_now() - g_lost.t0;
            const char *why = json_string_value(json_object_get(a, "reason"));
            snprintf(g_lost_reason, sizeof g_lost_reason, "%s", why ? why : "");
        }
    }
    ct_resp_free(&r);
}

/* The relay-kill run: once the NAT'ed agents are relayed and the first of
 * them logged step KILL_AT_STEP, the public agent that relays for it is
 * killed (SIGKILL). */
static int g_killed = -1;     /* the agent killed (index in g_kill) */
static double g_killed_at;    /* when (monotonic s) */
static char g_killed_ip[40];

static void watch_kill(void)
{
    if (g_killed >= 0 || !g_kill.t0 || g_kill.pid[2] <= 0)
        return;
    char *log = ct_read_file(g_kill.log[2], NULL), *steps = ct_read_file(g_kill.steps[2], NULL);
    const char *l = log ? strstr(log, "reachability: relayed through ") : NULL;
    char want[32];
    snprintf(want, sizeof want, "\"step\":%d,", KILL_AT_STEP);
    if (l && steps && strstr(steps, want)) {
        l += strlen("reachability: relayed through ");
        for (int i = 0; i < 2; i++) {
            const char *ip = g_net.h[g_kill.host[i]].ip;
            if (!strncmp(l, ip, strlen(ip)) && l[strlen(ip)] == ':' && g_kill.pid[i] > 0) {
                kill(g_kill.pid[i], SIGKILL);
                g_killed = i;
                g_killed_at = ct_hostrun_now();
                snprintf(g_killed_ip, sizeof g_killed_ip, "%s", ip);
                printf("killed the relay %s (%s) at step %d of its NAT'ed agent\n", g_net.h[g_kill.host[i]].name,
                       ip, KILL_AT_STEP);
            }
        }
    }
    free(log);
    free(steps);
}

/* Waits for every agent of c to exit, watching the collaborations'
 * reachability lines and the lost run's stats meanwhile (they run at
 * once). */
static void wait_all(struct ct_hostrun *c, int timeout_s)
{
    double end = ct_hostrun_now() + timeout_s;
    struct ct_hostrun *all[] = {&g_pub, &g_nat, &g_lost, &g_links, &g_kill, &g_allnat, &g_liar};
    while (ct_hostrun_reap(c) > 0 && ct_hostrun_now() < end) {
        for (size_t k = 0; k < sizeof all / sizeof *all; k++)
            ct_hostrun_watch(all[k]);
        watch_kill();
        watch_lost_stats();
        usleep(100000);
    }
    ct_hostrun_watch(c);
    ct_hostrun_stop(c);
}

/* The collaboration's checks: every agent finished, its reachability line
 * says `want` (for agents [0, n_direct): "direct at <its host's IP>", the
 * rest "not reachable at <its router's address>", within 10 s), every step
 * was averaged by all n members with every part agreed, identical hashes,
 * and the loss fell. */
static void check(struct ct_hostrun *c, int n_direct)
{
    const int n = c->nsteps ? (int)c->nsteps : STEPS;
    wait_all(c, c->eval ? 480 : 300);
    static struct ct_steps f;
    memset(&f, 0, sizeof f);
    for (int i = 0; i < c->n; i++) {
        const struct ct_net_host *h = &g_net.h[c->host[i]];
        char *log = ct_read_file(c->log[i], NULL);
        assert_non_null(log);
        const char *line = strstr(log, "reachability: ");
        char want[96];
        if (i < n_direct)
            snprintf(want, sizeof want, "reachability: direct at %s ", h->ip);
        else
            snprintf(want, sizeof want, "reachability: not reachable at %s ", g_net.r[h->router].wan_ip);
        printf("%s (%s): exit %d, reachability known after %.1f s: %.*s\n", h->name, h->ip, c->status[i],
               c->reach_at[i], line ? (int)strcspn(line, "\n") : 4, line ? line : "none");
        if (c->status[i] != 0)
            fprintf(stderr, "%s's log:\n%s\n", h->name, log);
        assert_int_equal(c->status[i], 0);
        assert_non_null(line);
        assert_true(!strncmp(line, want, strlen(want)));
        assert_true(c->reach_at[i] > 0 && c->reach_at[i] < 10.0);
        if (i >= n_direct) /* and reserved ports at a relay (the public agents lend them) */
            assert_non_null(strstr(log, "reachability: relayed through 10.77.0."));
        free(log);
        ct_steps_fold(c->steps[i], &f, h->name);
    }
    assert_int_equal(f.mismatches, 0);
    /* every step had every part averaged by all; once all agents were in
       (they join over the first seconds: each measures its link at the
       backbone first), every round held all of them */
    int full = 0, all_in = 0, first_all = 0;
    for (int s = 1; s <= n; s++) {
        if (!first_all && f.members[s] == c->n)
            first_all = s;
        all_in += first_all && f.members[s] == c->n;
        full += f.full[s] > 0;
    }
    /* The agents come in over the first seconds (each measures its link at
       the backbone first; the NAT'ed ones look for a relay): the last two
       behind the cone-like router came 2.6 s after the first step in every
       run, and were in the next round. How many steps the others took
       meanwhile is their pace, not the newcomers': 9 to 16 of them
       (2026-11-28; 17 failed "at most STEPS / 2", which measured that). */
    int64_t t_all = first_all ? ct_steps_time(c->steps[0], first_all) : -1;
    double all_after = t_all >= 0 && f.t_first > 0 ? (double)(t_all - f.t_first) / 1000 : -1;
    printf("%s: all %d agents in every round from step %d on (%d of %d steps, %.1f s after the first step "
           "log line), %d steps had every part averaged; %d step-log lines\n",
           c->run, c->n, first_all, all_in, n, all_after, full, f.lines);
    assert_true(f.hash[n][0] != 0);
    assert_true(first_all >= 1 && first_all <= n / 2);
    assert_true(all_after >= 0 && all_after <= ALL_IN_S);
    /* Over a long run a peer sometimes misses a round's window and joins
       the next (its micro-batch ran over the window): 3 to 14 of 500 in
       runs beside the others. A short run must hold all in every round. */
    if (n > STEPS)
        assert_true(all_in >= 0.95 * (n - first_all + 1));
    else
        assert_int_equal(all_in, n - first_all + 1);
    assert_int_equal(full, n);
    double first = f.samples[1] > 0 ? f.loss_sum[1] / f.samples[1] : NAN, last = f.samples[n] > 0 ? f.loss_sum[n] / f.samples[n] : NAN;
    printf("%s: loss %.3f at step 1, %.3f at step %d\n", c->run, first, last, n);
    assert_true(isfinite(first) && isfinite(last) && last < 0.7 * first);
    /* trained to the end: every agent's test accuracy (join's evaluation of
       the final parameters, which are identical) */
    for (int i = 0; c->eval && i < c->n; i++) {
        char *log = ct_read_file(c->log[i], NULL);
        double acc = log ? ct_join_accuracy(log) : -1;
        printf("%s: test accuracy %.2f %%\n", g_net.h[c->host[i]].name, acc);
        free(log);
        assert_true(acc >= NAT_ACCURACY);
    }
}

static void test_public_hosts(void **state)
{
    (void)state;
    check(&g_pub, NPUB);
}

static void test_behind_nat(void **state)
{
    (void)state;
    /* the long run starts once the others ended: beside them (25 agents on
       2 cores) its 100 ms windows made their rounds miss members, and its
       own missed 12 of its first 30 */
    if (g_nat.eval)
        assert_int_equal(start(&g_nat, NULL, NULL), 0);
    check(&g_nat, NNAT_PUB);
    /* the NAT'ed agents aggregated parts through their relays, and their
       step logs say so */
    int relayed_agg = 0, cone_aggs = 0;
    for (int i = NNAT_PUB; i < g_nat.n; i++) {
        FILE *fp = fopen(g_nat.steps[i], "r");
        assert_non_null(fp);
        char line[2048];
        int agg = 0, via = 0;
        while (fgets(line, sizeof line, fp)) {
            json_t *j = json_loads(line, 0, NULL);
            const char *reach = j ? json_string_value(json_object_get(j, "reach")) : NULL;
            if (j && json_object_get(j, "hash") && reach && !strcmp(reach, "relayed")) {
                via++;
                const char *relay = json_string_value(json_object_get(j, "relay"));
                assert_non_null(relay);
                assert_true(!strncmp(relay, g_net.h[g_nat.host[0]].ip, strlen(g_net.h[g_nat.host[0]].ip)) ||
                            !strncmp(relay, g_net.h[g_nat.host[1]].ip, strlen(g_net.h[g_nat.host[1]].ip)));
                agg += json_is_true(json_object_get(j, "aggregated")) &&
                       json_integer_value(json_object_get(j, "agreed")) ==
                           json_integer_value(json_object_get(j, "parts"));
            }
            json_decref(j);
        }
        fclose(fp);
        printf("%s: %d steps reached through a relay, %d of them aggregating a part\n",
               g_net.h[g_nat.host[i]].name, via, agg);
        relayed_agg += agg;
        /* hosts 2 and 3 are behind the cone-like router: others punch a
           hole to those the schedule has aggregate */
        cone_aggs += i < NNAT_PUB + 2 && agg > 0;
    }
    assert_true(relayed_agg >= 1);
    /* the public agents punched holes to the agents behind the cone-like
       router (their relays carry their rounds no more) and not to those
       behind the symmetric-like one, which stay relayed. The cone agents
       come last (the dial-back waits out its 3 s at their router) and
       aggregate once a schedule has them (re-solved 5 s after peers
       change): the first punched step is bounded from their first step,
       and the holes then stay open. */
    long cone_first = LONG_MAX;
    for (int i = NNAT_PUB; i < NNAT_PUB + 2; i++) { /* hosts 2, 3: behind the cone-like router */
        static struct ct_steps one;
        memset(&one, 0, sizeof one);
        long f = ct_steps_fold(g_nat.steps[i], &one, g_net.h[g_nat.host[i]].name);
        cone_first = f > 0 && f < cone_first ? f : cone_first;
    }
    for (int i = 0; PUNCH_CHECKED && i < NNAT_PUB; i++) {
        struct ct_punch_log pl;
        assert_int_equal(ct_punch_log_read(g_nat.steps[i], &pl), 0);
        long most = pl.most, first = pl.first, relayed_aggs = pl.relayed_aggs, held = pl.held, after = pl.after;
        printf("%s: up to %ld of %ld relayed aggregators reached through a punched hole, from step %ld (the "
               "cone-like NAT's agents came at step %ld); punched in %ld of %ld steps since\n",
               g_net.h[g_nat.host[i]].name, most, relayed_aggs, first, cone_first, held, after);
        assert_true(cone_first < LONG_MAX);
        /* the cone agents the schedule had aggregate (the LP may leave
           one of them without a part: 1 of 2 in a run) */
        assert_true(cone_aggs >= 1);
        assert_true(most >= 1 && most <= cone_aggs);
        assert_true(first >= cone_first && first <= cone_first + 60);
        assert_true(held >= 0.9 * after);
    }
    /* the two agents behind the symmetric-like router meet on its network
       (docs/p2p.md, "Peers behind the same router"): each step one of them
       aggregates, the other reaches it directly there, and no one else */
    long sym_lan = 0;
    for (int i = NNAT_PUB + 2; i < NNAT_PUB + 4; i++) { /* hosts 4, 5: behind the symmetric-like router */
        struct ct_punch_log pl;
        assert_int_equal(ct_punch_log_read(g_nat.steps[i], &pl), 0);
        printf("%s (behind the symmetric-like router): up to %ld relayed aggregators reached directly, from "
               "step %ld\n",
               g_net.h[g_nat.host[i]].name, pl.most, pl.first);
        assert_true(pl.most <= 1);
        sym_lan += pl.most;
    }
    assert_true(sym_lan >= 1);
    /* the organizer's live-peers list says how each is reached, and where */
    struct ct_resp r;
    assert_int_equal(ct_http(&g_c, "GET", "/api/v1/runs/hosts-nat/peers", g_org, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *peers = json_object_get(r.json, "peers");
    assert_int_equal(json_array_size(peers), g_nat.n);
    int direct = 0, relayed = 0, cone_punched = 0, sym_punched_far = 0;
    for (size_t i = 0; i < json_array_size(peers); i++) {
        json_t *p = json_array_get(peers, i);
        const char *reach = json_string_value(json_object_get(p, "reachability"));
        const char *addr = json_string_value(json_object_get(p, "address"));
        const char *relay = json_string_value(json_object_get(p, "relay"));
        json_int_t punched = json_integer_value(json_object_get(p, "punched"));
        printf("live peer %s: %s at %s%s%s, %lld punched connections\n",
               json_string_value(json_object_get(p, "username")), reach ? reach : "?", addr ? addr : "?",
               relay ? " via " : "", relay ? relay : "", (long long)punched);
        if (addr && !strcmp(addr, g_net.r[0].wan_ip))
            cone_punched += punched > 0;
        /* behind the symmetric-like router: a connection made with the
           neighbour behind the same router (on the router's network) at
           most, none with anyone farther */
        if (addr && !strcmp(addr, g_net.r[1].wan_ip))
            sym_punched_far += punched > 1;
        assert_non_null(reach);
        assert_non_null(addr);
        if (!strcmp(reach, "direct")) {
            direct++;
            assert_true(!strcmp(addr, g_net.h[g_nat.host[0]].ip) || !strcmp(addr, g_net.h[g_nat.host[1]].ip));
        } else {
            relayed++;
            assert_string_equal(reach, "relayed");
            assert_true(!strcmp(addr, g_net.r[0].wan_ip) || !strcmp(addr, g_net.r[1].wan_ip));
            assert_non_null(relay);
            assert_true(!strncmp(relay, g_net.h[g_nat.host[0]].ip, strlen(g_net.h[g_nat.host[0]].ip)) ||
                        !strncmp(relay, g_net.h[g_nat.host[1]].ip, strlen(g_net.h[g_nat.host[1]].ip)));
        }
    }
    assert_int_equal(direct, NNAT_PUB);
    assert_int_equal(relayed, NNAT_PRIV);
    /* their reports say so: agents behind the cone-like router hold
       punched connections, the two behind the symmetric-like one none
       beyond each other (they meet on their router's network). A
       snapshot at the end: a hole to an agent the newest schedule gives no
       part goes idle and the transport closes it (nat2 aggregated 109 of
       490 steps, early, and reported 0 at the end of a run) */
    if (PUNCH_CHECKED)
        assert_true(cone_punched >= 1);
    assert_int_equal(sym_punched_far, 0);
    ct_resp_free(&r);
}

/* A relay killed mid-run (SIGKILL): the NAT'ed agents it relayed for say
 * so, reserve at the other public agent and aggregate there again; the run
 * finishes on the three survivors with identical parameters, and only the
 * rounds in flight at the kill are lost. */
static void test_relay_killed(void **state)
{
    (void)state;
    wait_all(&g_kill, 300);
    assert_true(g_killed >= 0);
    int other = 1 - g_killed;
    const char *other_ip = g_net.h[g_kill.host[other]].ip;
    char final_hash[65] = "";
    for (int i = 0; i < NKILL; i++) {
        const struct ct_net_host *h = &g_net.h[g_kill.host[i]];
        if (i == g_killed) {
            assert_int_equal(g_kill.status[i], 128 + SIGKILL);
            continue;
        }
        char *log = ct_read_file(g_kill.log[i], NULL);
        assert_non_null(log);
        if (g_kill.status[i] != 0)
            fprintf(stderr, "%s's log:\n%s\n", h->name, log);
        assert_int_equal(g_kill.status[i], 0);
        int lost_relay = 0;
        char by_killed[96];
        snprintf(by_killed, sizeof by_killed, "reachability: relayed through %s:", g_killed_ip);
        if (i >= 2 && strstr(log, by_killed)) { /* it was relayed by the killed agent */
            char lost[96], again[96];
            snprintf(lost, sizeof lost, "reachability: relay %s:", g_killed_ip);
            snprintf(again, sizeof again, "reachability: relayed through %s:", other_ip);
            const char *a = strstr(log, lost), *b = a ? strstr(a, again) : NULL;
            printf("%s: %s; %s\n", h->name, a ? "said its relay was lost" : "did not say its relay was lost",
                   b ? "then relayed through the other" : "no other relay");
            assert_non_null(a);
            assert_non_null(b);
            lost_relay = 1;
        }
        free(log);
        /* its steps after the kill: the rounds in flight failed, the rest
           averaged; a NAT'ed agent aggregates again through the new relay */
        FILE *fp = fopen(g_kill.steps[i], "r");
        assert_non_null(fp);
        char line[2048];
        int failed_after = 0, last = 0, agg_new = 0, via_new = 0;
        while (fgets(line, sizeof line, fp)) {
            json_t *j = json_loads(line, 0, NULL);
            if (!j)
                continue;
            int step = (int)json_integer_value(json_object_get(j, "step"));
            if (json_is_false(json_object_get(j, "averaged")) && step >= KILL_AT_STEP)
                failed_after++;
            const char *hsh = json_string_value(json_object_get(j, "hash"));
            if (hsh && step >= last) {
                last = step;
                if (step == STEPS) {
                    if (!final_hash[0])
                        snprintf(final_hash, sizeof final_hash, "%s", hsh);
                    assert_string_equal(final_hash, hsh);
                }
            }
            const char *relay = json_string_value(json_object_get(j, "relay"));
            int on_new = lost_relay && hsh && relay && !strncmp(relay, other_ip, strlen(other_ip));
            via_new += on_new;
            agg_new += on_new && json_is_true(json_object_get(j, "aggregated"));
            json_decref(j);
        }
        fclose(fp);
        printf("%s: last step %d, %d rounds failed from step %d on%s", h->name, last, failed_after, KILL_AT_STEP,
               lost_relay ? "" : "\n");
        if (lost_relay)
            printf(", %d steps reached through the new relay, %d of them aggregating a part (as the "
                   "schedule says)\n", via_new, agg_new);
        assert_int_equal(last, STEPS);
        assert_true(failed_after <= 4);
        if (lost_relay) /* it took the new relay, and others reached it there */
            assert_true(via_new >= STEPS - KILL_AT_STEP - 6);
    }
    assert_true(final_hash[0] != 0);
}

/* Every agent behind NAT (one behind each router): the coordinator's
 * backbone node relays for them (--relay-reservations), and they train
 * together as the others do. */
static void test_all_behind_nat(void **state)
{
    (void)state;
    check(&g_allnat, 0);
    char want[64];
    snprintf(want, sizeof want, "reachability: relayed through %s:", g_net.h[g_coord_host].ip);
    for (int i = 0; i < NALLNAT; i++) {
        char *log = ct_read_file(g_allnat.log[i], NULL);
        assert_non_null(log);
        assert_non_null(strstr(log, want));
        free(log);
    }
}

/* A volunteer announcing another host's address (--advertise-ip with the
 * ports the honest agents use, so everything sent to it reaches agent 0,
 * whose transport refuses what is addressed to another key). The schedule
 * gives each peer the address the coordinator sees its reports come from;
 * every member then refuses the liar as an aggregator, each says so, the
 * liar is told, and the rest goes on as if nothing happened: every round
 * holds all four (the victim too) from the first that refused the liar on,
 * every part is averaged once a schedule is agreed, parameters identical,
 * the loss falls. Before the run's first schedule there is nothing to
 * check announcements against: the liar gets a part, which fails (skipped
 * by everyone: the first 1-3 steps), and the liar, whose own part then
 * held only its gradient, does not step and catches up. */
static void test_announces_another_host(void **state)
{
    (void)state;
    if (!LIAR_RUN) {
        printf("the liar run trains in the normal build only (load beside the other runs)\n");
        return;
    }
    wait_all(&g_liar, 300);
    const char *liar_ip = g_net.h[g_liar.host[NLIAR - 1]].ip;
    char told[160], seen[160];
    snprintf(seen, sizeof seen, "announces its averaging address as %s:" LIAR_AR_PORT
             ", but the coordinator sees it at %s: it aggregates no part", g_liar_ip, liar_ip);
    snprintf(told, sizeof told, "we announce our averaging address as %s:" LIAR_AR_PORT
             ", but the coordinator sees us at %s", g_liar_ip, liar_ip);
    static struct ct_steps f;
    memset(&f, 0, sizeof f);
    int refused_steps = 0, failed_parts_scheduled = 0, failed_parts_early = 0, victim_agg = 0, liar_agg = 0;
    int first_refused = 0;
    for (int i = 0; i < NLIAR; i++) {
        const struct ct_net_host *h = &g_net.h[g_liar.host[i]];
        char *log = ct_read_file(g_liar.log[i], NULL);
        assert_non_null(log);
        int said = strstr(log, i < NLIAR - 1 ? seen : told) != NULL;
        printf("%s (%s): exit %d, %s\n", h->name, h->ip, g_liar.status[i],
               said ? (i < NLIAR - 1 ? "said the liar aggregates no part" : "was told it aggregates no part")
                    : "said nothing of the liar");
        if (g_liar.status[i] != 0 || !said)
            fprintf(stderr, "%s's log:\n%s\n", h->name, log);
        assert_int_equal(g_liar.status[i], 0);
        assert_true(said);
        free(log);
        ct_steps_fold(g_liar.steps[i], &f, h->name);
        FILE *fp = fopen(g_liar.steps[i], "r");
        assert_non_null(fp);
        char line[2048];
        while (fgets(line, sizeof line, fp)) {
            json_t *j = json_loads(line, 0, NULL);
            if (j && json_object_get(j, "hash") && !json_is_true(json_object_get(j, "synced"))) {
                long refused = (long)json_integer_value(json_object_get(j, "refused"));
                long sv = (long)json_integer_value(json_object_get(j, "sched_version"));
                int all = json_integer_value(json_object_get(j, "agreed")) ==
                          json_integer_value(json_object_get(j, "parts"));
                int agg = json_is_true(json_object_get(j, "aggregated"));
                long stp = (long)json_integer_value(json_object_get(j, "step"));
                if (i == 0) {
                    refused_steps += refused > 0;
                    victim_agg += refused > 0 && agg;
                    if (refused > 0 && (!first_refused || stp < first_refused))
                        first_refused = (int)stp;
                }
                if (i == NLIAR - 1)
                    liar_agg += sv > 0 && agg;
                if (!all && sv > 0)
                    failed_parts_scheduled++;
                failed_parts_early += !all && sv == 0;
            }
            json_decref(j);
        }
        fclose(fp);
    }
    /* from the first round that refused the liar on */
    int all_in = 0;
    for (int st = first_refused; first_refused && st <= STEPS; st++)
        all_in += f.members[st] == NLIAR;
    double first = f.samples[1] > 0 ? f.loss_sum[1] / f.samples[1] : NAN, last = f.samples[STEPS] > 0 ? f.loss_sum[STEPS] / f.samples[STEPS] : NAN;
    printf("hosts-liar: %d steps refused the liar (the victim aggregated a part in %d of them), the liar aggregated "
           "%d parts under a schedule; parts not averaged: %d before a schedule, %d under one; from step %d "
           "(the first refusing it) all 4 in %d rounds; loss %.3f -> %.3f\n",
           refused_steps, victim_agg, liar_agg, failed_parts_early, failed_parts_scheduled, first_refused, all_in,
           first, last);
    assert_int_equal(f.mismatches, 0);
    assert_true(f.hash[STEPS][0] != 0);
    assert_true(refused_steps >= STEPS / 2);
    assert_int_equal(liar_agg, 0);
    assert_int_equal(failed_parts_scheduled, 0);
    assert_true(first_refused >= 1 && first_refused <= STEPS / 2);
    assert_int_equal(all_in, STEPS - first_refused + 1);
    assert_true(isfinite(first) && isfinite(last) && last < 0.7 * first);
}

/* Three agents that announce the coordinator's host (--advertise-ip),
 * where nothing listens for them: every round fails. No step may count. */
static void test_no_step_without_averaging(void **state)
{
    (void)state;
    while (ct_hostrun_now() - g_lost.t0 < 60 && !g_lost_flagged) {
        watch_lost_stats();
        usleep(500000);
    }
    printf("the coordinator's stats said the run is not averaging %.1f s after its agents started (%s)\n",
           g_lost_flagged, g_lost_reason);
    for (int i = 0; i < g_lost.n; i++)
        kill(g_lost.pid[i], SIGINT);
    wait_all(&g_lost, 30);
    int failed_lines = 0, warned = 0, solo = 0;
    for (int i = 0; i < g_lost.n; i++) {
        const char *name = g_net.h[g_lost.host[i]].name;
        char *log = ct_read_file(g_lost.log[i], NULL);
        assert_non_null(log);
        int declined = strstr(log, "not a step") || strstr(log, "not stepping");
        if (g_lost.status[i] != 0 || !declined)
            fprintf(stderr, "%s (exit %d):\n%s\n", name, g_lost.status[i], log);
        assert_int_equal(g_lost.status[i], 0); /* Ctrl-C while training: a clean exit */
        /* the console says so */
        assert_true(declined);
        warned += strstr(log, "the collaboration is not averaging") != NULL;
        free(log);
        /* the step log: each failed round there with why; a step, if any,
           only one that a peer took alone (when the others, stuck fetching
           a state nobody has, were not about), never one that averaged
           nothing or only part; each try of a step a round of its own (the
           window is in its id: with the last try's id, every engine refused
           it as finished at once, and agents retried a step for minutes) */
        struct ct_failed fr;
        assert_int_equal(ct_steps_failed(g_lost.steps[i], &fr), 0);
        if (fr.first_bad[0])
            fprintf(stderr, "%s: %d failed rounds without why, %d the engine did not run, %d tried twice, %d "
                            "steps with others; the first: %s", name, fr.no_why, fr.not_run, fr.repeated,
                    fr.crowded, fr.first_bad);
        assert_int_equal(fr.no_why, 0);
        assert_int_equal(fr.not_run, 0);
        assert_int_equal(fr.repeated, 0);
        assert_int_equal(fr.crowded, 0);
        failed_lines += fr.lines;
        solo += fr.stepped;
    }
    printf("%d failed rounds in the lost agents' step logs, %d steps taken alone, %d agents warned that the "
           "collaboration is not averaging\n", failed_lines, solo, warned);
    assert_true(failed_lines >= 2);
    assert_true(warned >= 1);
    /* nothing credited for a round that averaged nothing or only part, and
       no round with others at all */
    long bad = -1;
    assert_int_equal(ct_pg_scalar(&g_pg,
                                  "SELECT count(*) FROM contrib_reports WHERE run_id = "
                                  "(SELECT id FROM runs WHERE name = 'hosts-lost') "
                                  "AND (parts_averaged < parts OR n_members > 1)",
                                  &bad),
                     0);
    assert_int_equal(bad, 0);
    /* the organizer saw it within a minute, with a reason naming an address */
    assert_true(g_lost_flagged > 0 && g_lost_flagged < 60);
    assert_non_null(strstr(g_lost_reason, "10.77.0."));
}

/* Three hosts capped at 10, 50 and 200 Mbit/s: each measures its link
 * against the coordinator's backbone node, reports it within 15 % of its
 * cap, and the schedule gives the 200 Mbit/s host the largest share. The
 * 10 Mbit/s volunteer declared an upload cap of 8 only: its upload is
 * reported as 8 and its download measured (it was 1 Gbit/s, unmeasured).
 * The 50 Mbit/s one paces itself (--pace 0.9): it reports 0.9 of what it
 * measured, the rates its traffic now keeps to. */
static void test_measured_links(void **state)
{
    (void)state;
    wait_all(&g_links, 300);
    char key[NLINKS][16];
    for (int i = 0; i < NLINKS; i++) {
        const char *name = g_net.h[g_links.host[i]].name;
        char *log = ct_read_file(g_links.log[i], NULL);
        assert_non_null(log);
        const char *l = !strncmp(log, "link: upload ", 13) ? log : strstr(log, "\nlink: upload ");
        const char *pk = strstr(log, "(peer ");
        double up = 0, down = 0;
        if (l && *l == '\n')
            l++;
        if (g_links.status[i] != 0 || !l || !pk || sscanf(l, "link: upload %lf Mbit/s, download %lf Mbit/s", &up, &down) != 2)
            fprintf(stderr, "%s (exit %d):\n%s\n", name, g_links.status[i], log);
        assert_int_equal(g_links.status[i], 0);
        assert_non_null(l);
        assert_non_null(pk);
        snprintf(key[i], sizeof key[i], "%.12s", pk + 6);
        printf("%s: capped at %.0f Mbit/s, %s upload %.1f (%+.1f %%), download %.1f (%+.1f %%)\n", name,
               LINK_CAPS[i], i == 0 ? "declared" : "measured", up, 100 * (up / LINK_CAPS[i] - 1), down,
               100 * (down / LINK_CAPS[i] - 1));
        if (i == 0) { /* declared upload, measured download */
            assert_true(fabs(up - atof(LINK_UP_CAP0)) < 0.05);
            assert_non_null(strstr(l, "(download measured against "));
        } else {
            assert_true(fabs(up / LINK_CAPS[i] - 1) <= 0.15);
        }
        assert_true(fabs(down / LINK_CAPS[i] - 1) <= 0.15);
        const char *pl = strstr(log, "pacing: this agent sends at most ");
        double pup = 0, pdown = 0;
        if (i == 1) {
            assert_non_null(pl);
            assert_int_equal(sscanf(pl, "pacing: this agent sends at most %lf and receives at most %lf", &pup,
                                    &pdown), 2);
            assert_true(fabs(pup - 0.9 * up) < 0.1 && fabs(pdown - 0.9 * down) < 0.1);
            up = pup; /* what it reports from then on */
        } else {
            assert_null(pl); /* join does not pace unless asked */
        }
        free(log);
        /* what the coordinator holds is the measurement */
        char q[512];
        long rep = -1;
        snprintf(q, sizeof q,
                 "SELECT round((report->>'upload_mbps')::numeric * 10) FROM capabilities c JOIN runs r ON "
                 "r.id = c.run_id WHERE r.name = 'hosts-links' AND "
                 "translate(encode(c.peer_public_key, 'base64'), '+/', '-_') LIKE '%s%%'",
                 key[i]);
        assert_int_equal(ct_pg_scalar(&g_pg, q, &rep), 0);
        if (labs(rep - lround(up * 10)) > 1)
            fprintf(stderr, "%s: the coordinator holds upload %.1f Mbit/s\n", name, rep / 10.0);
        assert_true(labs(rep - lround(up * 10)) <= 1);
    }
    /* the newest schedule: the fastest link aggregates the most */
    long share[NLINKS];
    for (int i = 0; i < NLINKS; i++) {
        char q[600];
        snprintf(q, sizeof q,
                 "SELECT (p->>'share')::bigint FROM schedules s JOIN runs r ON r.id = s.run_id, "
                 "jsonb_array_elements(s.result->'peers') p WHERE r.name = 'hosts-links' AND "
                 "p->>'peer_public_key' LIKE '%s%%' ORDER BY s.version DESC LIMIT 1",
                 key[i]);
        assert_int_equal(ct_pg_scalar(&g_pg, q, &share[i]), 0);
        printf("%s: share %ld\n", g_net.h[g_links.host[i]].name, share[i]);
    }
    assert_true(share[2] > share[1] && share[2] > share[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_public_hosts),
        cmocka_unit_test(test_relay_killed),
        cmocka_unit_test(test_all_behind_nat),
        cmocka_unit_test(test_announces_another_host),
        cmocka_unit_test(test_no_step_without_averaging),
        cmocka_unit_test(test_measured_links),
        /* last: the NAT run trains longest (in the normal build it starts
           once the others ended) */
        cmocka_unit_test(test_behind_nat),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed || g_teardown_failed ? 1 : 0;
}
