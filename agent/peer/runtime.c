/* The peer runtime's lifecycle, session, access pass and clock (API and
 * ownership in runtime.h). Stages start in a fixed order and stop in the
 * reverse one; each start_* below undoes its own partial work on failure,
 * so peer_rt_stop only ever sees whole stages. */
#include "agent/peer/runtime.h"
#include "agent/peer/runtime_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "cm_log.h"
#include "cm_token.h"

static const char *const STAGE_NAMES[] = {"none", "session", "pass", "clock", "net", "reports", "probes"};

const char *peer_stage_name(enum peer_stage st)
{
    return st >= PEER_STAGE_NONE && st <= PEER_STAGE_ALL ? STAGE_NAMES[st] : "?";
}

void peer_rt_init(struct peer_rt *rt, const struct peer_rt_config *cfg, const struct peer_role *role)
{
    memset(rt, 0, sizeof *rt);
    rt->cfg = *cfg;
    rt->flag_client_mode = cfg->client_mode;
    if (role)
        rt->role = *role;
    pthread_mutex_init(&rt->probe_mu, NULL);
    pthread_cond_init(&rt->probe_cv, NULL);
    pthread_mutex_init(&rt->addr_mu, NULL);
    pthread_mutex_init(&rt->relay_mu, NULL);
    pthread_cond_init(&rt->relay_cv, NULL);
}

int peer_rt_interrupted(const struct peer_rt *rt)
{
    return rt->cfg.interrupted && *rt->cfg.interrupted;
}

double peer_mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- clock ----
 * The collaboration's clock. Announcement windows, progress freshness and
 * outcome windows compare times that peers wrote with their own clocks; a
 * volunteer's clock a second off would put its announcements outside every
 * round window. So every peer uses the coordinator's clock: ours plus the
 * offset clock_sync measures (GET /api/v1/time). */
static int64_t raw_ms(const struct peer_rt *rt)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000 + rt->cfg.test_skew_ms;
}

int64_t peer_rt_now_ms(const struct peer_rt *rt)
{
    return raw_ms(rt) + __atomic_load_n(&rt->clock_offset_ms, __ATOMIC_RELAXED);
}

/* Measures the offset: three reads of the coordinator's clock, the one
 * with the shortest round trip, against the midpoint of that trip (so the
 * error is at most half of it). Kept as it was when the coordinator cannot
 * be read (an older one without the endpoint, or a trip over 2 s). */
#define CLOCK_MAX_RTT_MS 2000
static int clock_sync(struct peer_rt *rt, int verbose)
{
    int64_t best = -1, off = 0;
    for (int i = 0; i < 3 && !peer_rt_interrupted(rt); i++) {
        struct agent_reply r = {0};
        int64_t t0 = raw_ms(rt);
        int rc = agent_request(&rt->coord, "GET", "/api/v1/time", NULL, &r);
        int64_t t1 = raw_ms(rt);
        json_t *v = rc == CM_OK && r.status == 200 ? json_object_get(r.json, "time_ms") : NULL;
        if (json_is_integer(v) && t1 >= t0 && (best < 0 || t1 - t0 < best)) {
            best = t1 - t0;
            off = (int64_t)json_integer_value(v) - (t0 + (t1 - t0) / 2);
        }
        agent_reply_free(&r);
    }
    if (peer_rt_interrupted(rt))
        return CM_ECANCELED;
    if (best < 0 || best > CLOCK_MAX_RTT_MS) {
        if (verbose)
            fprintf(stderr, "warning: could not read the coordinator's clock%s; using this machine's "
                            "(peers whose clocks differ by more than the round window cannot average "
                            "together)\n", best > CLOCK_MAX_RTT_MS ? " (round trip over 2 s)" : "");
        return CM_OK;
    }
    int64_t was = __atomic_exchange_n(&rt->clock_offset_ms, off, __ATOMIC_RELAXED);
    if (verbose ? (off >= 250 || off <= -250) : (off - was >= 250 || was - off >= 250))
        printf("%sclock: this machine's is %.1f s %s the coordinator's (round trip %lld ms); the "
               "collaboration's times follow the coordinator's\n", verbose ? "" : "\n",
               (double)(off < 0 ? -off : off) / 1000.0, off > 0 ? "behind" : "ahead of", (long long)best);
    return CM_OK;
}

/* ---- session ---- */
static int start_session(struct peer_rt *rt)
{
    if (agent_state_dir(rt->cfg.config_dir, rt->dir, sizeof rt->dir) != CM_OK)
        return CM_EIO;
    snprintf(rt->rundir, sizeof rt->rundir, "%s/%s", rt->dir, rt->cfg.run);
    snprintf(rt->state_path, sizeof rt->state_path, "%s/latest.ckpt", rt->rundir);
    mkdir(rt->rundir, 0700);
    rt->session = agent_state_read(rt->dir, "session.json");
    if (!rt->session) {
        fprintf(stderr, "error: not logged in; run 'crowdtrain-agent login' first\n");
        return CM_EAUTH;
    }
    rt->coord.url = rt->cfg.coordinator ? (char *)rt->cfg.coordinator
                                        : (char *)json_string_value(json_object_get(rt->session, "coordinator"));
    rt->coord.ca_cert = (char *)json_string_value(json_object_get(rt->session, "ca_cert"));
    rt->coord.token = (char *)json_string_value(json_object_get(rt->session, "token"));
    char keypath[4200];
    snprintf(keypath, sizeof keypath, "%s/peer-ed25519.pem", rt->dir);
    if (!rt->coord.url || !rt->coord.token || cm_ed25519_load_or_create(&rt->key, keypath, NULL) != CM_OK) {
        fprintf(stderr, "error: incomplete state in %s; log in again\n", rt->dir);
        json_decref(rt->session);
        rt->session = NULL;
        memset(&rt->coord, 0, sizeof rt->coord);
        return CM_EINVAL;
    }
    rt->key_loaded = 1;
    return CM_OK;
}

static void stop_session(struct peer_rt *rt)
{
    if (rt->key_loaded)
        cm_ed25519_cleanup(&rt->key);
    rt->key_loaded = 0;
    json_decref(rt->session);
    rt->session = NULL;
    memset(&rt->coord, 0, sizeof rt->coord);
}

/* ---- pass ---- */
static int fetch_pass_once(struct peer_rt *rt)
{
    const char *user = json_string_value(json_object_get(rt->session, "username"));
    if (!user) {
        fprintf(stderr, "error: the saved session names no user; log in again\n");
        return CM_EINVAL;
    }
    struct agent_reply r;
    int rc = agent_request_pass(&rt->coord, rt->cfg.run, user, &rt->key, peer_rt_now_ms(rt) / 1000, &r);
    if (rc != CM_OK)
        return rc;
    if (r.status != 201) {
        agent_reply_report("getting an access pass", &r);
        agent_reply_free(&r);
        return CM_EPERM;
    }
    rt->pass = r.json;
    rt->token = json_string_value(json_object_get(rt->pass, "access_token"));
    size_t i;
    json_t *v;
    rt->n_coord_keys = 0;
    json_array_foreach(json_object_get(rt->pass, "coordinator_keys"), i, v) {
        size_t got = 0;
        const char *k = json_string_value(v);
        if (k && rt->n_coord_keys < P2P_MAX_COORD_KEYS &&
            cm_b64url_decode(k, strlen(k), rt->coord_keys[rt->n_coord_keys], CM_ED25519_PUB_LEN, &got) == CM_OK &&
            got == CM_ED25519_PUB_LEN)
            rt->n_coord_keys++;
    }
    rt->n_bootstrap = 0;
    json_array_foreach(json_object_get(rt->pass, "bootstrap"), i, v)
        if (rt->n_bootstrap < PEER_MAX_BOOTSTRAP)
            rt->bootstrap[rt->n_bootstrap++] = json_string_value(v);
    struct cm_pass_claims c;
    rc = rt->token ? cm_token_verify(rt->token, strlen(rt->token), (const uint8_t(*)[32])rt->coord_keys,
                                     rt->n_coord_keys, time(NULL), 60, &c)
                   : CM_EPARSE;
    if (rc != CM_OK) {
        fprintf(stderr, "error: the access pass does not verify: %s\n", cm_strerror(rc));
        return rc;
    }
    return CM_OK;
}

static void drop_pass(struct peer_rt *rt)
{
    json_decref(rt->pass);
    rt->pass = NULL;
    rt->token = NULL;
    rt->n_bootstrap = 0;
}

/* A pass whose bootstrap list names at least one peer: a run that just
 * opened gets its backbone node within seconds. */
static int start_pass(struct peer_rt *rt)
{
    for (int attempt = 0;; attempt++) {
        drop_pass(rt);
        int rc = fetch_pass_once(rt);
        if (rc != CM_OK) {
            drop_pass(rt);
            return rc;
        }
        if (rt->n_bootstrap > 0 || attempt >= 20)
            return CM_OK;
        if (attempt == 0)
            printf("waiting for the run's DHT backbone to come up...\n");
        for (int i = 0; i < 10; i++) {
            if (peer_rt_interrupted(rt)) {
                drop_pass(rt);
                return CM_ECANCELED;
            }
            usleep(100000);
        }
    }
}

int peer_pass_renew_due(int64_t iat, int64_t exp, int64_t now)
{
    return exp - now <= (exp - iat) / 3;
}

int peer_rt_renew_pass(struct peer_rt *rt)
{
    if (rt->stage < PEER_STAGE_PASS)
        return CM_ESTATE;
    json_t *old = rt->pass;
    const char *old_token = rt->token;
    uint8_t old_keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN];
    size_t old_nkeys = rt->n_coord_keys, old_nboot = rt->n_bootstrap;
    const char *old_boot[PEER_MAX_BOOTSTRAP];
    memcpy(old_keys, rt->coord_keys, sizeof old_keys);
    memcpy(old_boot, rt->bootstrap, sizeof old_boot);
    rt->pass = NULL;
    int rc = fetch_pass_once(rt);
    if (rc != CM_OK || !rt->token) {
        fprintf(stderr, "\nwarning: renewing the access pass failed; keeping the current one\n");
        json_decref(rt->pass);
        rt->pass = old;
        rt->token = old_token;
        memcpy(rt->coord_keys, old_keys, sizeof old_keys);
        rt->n_coord_keys = old_nkeys;
        memcpy(rt->bootstrap, old_boot, sizeof old_boot);
        rt->n_bootstrap = old_nboot;
        return rc != CM_OK ? rc : CM_EPROTO;
    }
    if (rt->rep)
        peer_reporter_set_token(rt->rep, rt->token);
    if (rt->stage >= PEER_STAGE_CLOCK)
        (void)clock_sync(rt, 0); /* clocks drift: measure again with each pass */
    if (rt->net && peer_net_set_token(rt->net, rt->token) != CM_OK)
        fprintf(stderr, "\nwarning: could not install the renewed pass\n");
    else
        printf("\nrenewed the access pass (pass %s)\n", peer_rt_pass_id(rt));
    json_decref(old);
    return CM_OK;
}

/* Renews the pass when a third of its lifetime is left, and hands the new
 * token to the network side; on failure the old pass is kept (and tried
 * again at the next call) until it expires. */
void peer_rt_renew_pass_if_due(struct peer_rt *rt)
{
    if (rt->stage < PEER_STAGE_PASS)
        return;
    json_int_t iat = json_integer_value(json_object_get(rt->pass, "issued_at"));
    json_int_t exp = json_integer_value(json_object_get(rt->pass, "expires_at"));
    if (peer_pass_renew_due(iat, exp, (int64_t)time(NULL)))
        peer_rt_renew_pass(rt);
}

const char *peer_rt_pass_id(const struct peer_rt *rt)
{
    return json_string_value(json_object_get(rt->pass, "pass_id"));
}

const char *peer_rt_username(const struct peer_rt *rt)
{
    return json_string_value(json_object_get(rt->pass, "username"));
}

/* ---- net ---- */
/* How long the net stage spends measuring the link (peers that join
   together measure one after another at the backbone). */
#define LINK_START_DEADLINE_MS 10000

static int net_up(struct peer_rt *rt, const char *listen)
{
    struct peer_net_config nc = {0};
    nc.key = &rt->key;
    nc.token = rt->token;
    nc.run = rt->cfg.run;
    nc.coord_keys = (const uint8_t(*)[CM_ED25519_PUB_LEN])rt->coord_keys;
    nc.n_coord_keys = rt->n_coord_keys;
    nc.listen_ip = rt->cfg.client_mode ? NULL : listen;
    nc.dht_port = rt->cfg.dht_port;
    nc.ar_port = rt->cfg.ar_port;
    nc.max_upload_mbps = rt->cfg.max_upload_mbps;
    nc.max_download_mbps = rt->cfg.max_download_mbps;
    nc.latency_ms = rt->cfg.latency_ms;
    nc.latency_rules = rt->cfg.latency_rules;
    nc.n_latency_rules = rt->cfg.n_latency_rules;
    /* A node that listens joins the DHT only once the coordinator's
       dial-back reached it (start_net): joined before, everyone's routing
       tables kept its address at a router that drops what it did not ask
       for, and every lookup through it waited out a deadline (issue 17:
       with such routers the NAT'ed agents' reads missed the others and the
       collaboration split in two) */
    int defer = !rt->cfg.client_mode && !rt->cfg.advertise_ip;
    nc.bootstrap = defer ? NULL : (const char *const *)rt->bootstrap;
    nc.n_bootstrap = defer ? 0 : rt->n_bootstrap;
    nc.on_other = rt->cfg.on_other;
    nc.on_other_arg = rt->cfg.on_other_arg;
    int rc = peer_net_start(&nc, &rt->net);
    if (rc != CM_OK) {
        fprintf(stderr, "error: starting the peer-to-peer node: %s\n", cm_strerror(rc));
        rt->net = NULL;
    }
    return rc;
}

static int is_wildcard(const char *ip)
{
    return !strcmp(ip, "0.0.0.0") || !strcmp(ip, "::");
}

/* Which address to announce (docs/p2p.md, "Reachability"): --advertise-ip
 * as given; else the address the coordinator sees us at, once its
 * dial-back reached every port there; unreachable, we restart as a
 * client-mode peer. When the coordinator cannot tell (an older one, or an
 * error), the listen address, or for a wildcard the address of the
 * interface that routes to the coordinator. */
static int discover(struct peer_rt *rt, const char *listen, char *adv, size_t cap)
{
    if (rt->cfg.advertise_ip) {
        snprintf(adv, cap, "%s", rt->cfg.advertise_ip);
        rt->reach = PEER_REACH_FLAG_ADDR;
        return CM_OK;
    }
    uint16_t ports[3] = {peer_net_dht_port(rt->net), peer_net_ar_port(rt->net), peer_net_state_port(rt->net)};
    struct peer_reach_result res;
    int rc = peer_reach_check(&rt->coord, rt->cfg.run, rt->key.pub, ports, 3, 8000, rt->cfg.interrupted, &res);
    if (rc == CM_ECANCELED)
        return rc;
    if (rc == CM_OK) {
        snprintf(rt->observed_ip, sizeof rt->observed_ip, "%s", res.observed_ip);
        if (res.reachable) {
            snprintf(adv, cap, "%s", res.observed_ip);
            rt->reach = PEER_REACH_DIRECT;
            printf("reachability: direct at %s (the coordinator dialed back ports %u, %u, %u)\n", adv, ports[0],
                   ports[1], ports[2]);
            fflush(stdout);
            return CM_OK;
        }
        char why[256] = "";
        size_t off = 0;
        for (size_t i = 0; i < res.n && off < sizeof why; i++)
            if (!res.ok[i])
                off += (size_t)snprintf(why + off, sizeof why - off, "%sport %u: %s", off ? ", " : "", res.port[i],
                                        res.error[i]);
        if (rt->cfg.must_accept) {
            fprintf(stderr, "error: peers cannot reach this host at %s (%s), and this role must accept "
                            "connections: forward the ports, or run it on a reachable host\n",
                    res.observed_ip, why);
            return CM_ECONN;
        }
        printf("reachability: not reachable at %s (%s): %s\n", res.observed_ip, why,
               rt->cfg.no_relay ? "continuing as a client-mode peer (sends and receives, aggregates "
                                  "nothing; --no-relay)"
                                : "looking for a relay (until one takes us: a client-mode peer, "
                                  "which sends and receives and aggregates nothing)");
        fflush(stdout);
        peer_net_stop(rt->net);
        rt->net = NULL;
        rt->cfg.client_mode = 1;
        rt->reach = PEER_REACH_CLIENT;
        return net_up(rt, listen);
    }
    rt->reach = PEER_REACH_UNKNOWN;
    if (!is_wildcard(listen))
        snprintf(adv, cap, "%s", listen);
    else if (peer_local_addr_towards(rt->coord.url, adv, cap) != CM_OK)
        snprintf(adv, cap, "127.0.0.1");
    fprintf(stderr, "warning: the coordinator did not check our reachability (%s); announcing %s unchecked "
                    "(--advertise-ip or --client-mode set it by hand)\n", cm_strerror(rc), adv);
    return CM_OK;
}

/* Pacing (cfg.pace): our own traffic capped a little under the link's
 * measured rates, both ways, so that the queue forms in our token bucket
 * and not in the home router's buffer. There, 100 ms of our upload held
 * the acknowledgements of what we download at the same time (an
 * averaging sends and receives at once), and every TCP flow that started
 * after a pause (Linux restarts its window after an idle spell) grew its
 * window over round trips of 100 ms: averaging 0.96 MB between two 20
 * Mbit/s hosts took 0.40-0.86 s for 0.40 s of bytes (bench_pipeline_hosts,
 * docs/pipelines.md "The cost model against real hosts"). The paced rates
 * then serve as the volunteer's caps would: reported, and never measured
 * again (a measurement through our own bucket would read the bucket). */
static void pace_link(struct peer_rt *rt)
{
    pthread_mutex_lock(&rt->probe_mu);
    /* a direction the volunteer capped keeps the cap */
    double up = rt->link_up > 0 ? rt->link_up * rt->cfg.pace : rt->cfg.max_upload_mbps;
    double down = rt->link_down > 0 ? rt->link_down * rt->cfg.pace : rt->cfg.max_download_mbps;
    pthread_mutex_unlock(&rt->probe_mu);
    if (!(up > 0 && down > 0) || peer_net_set_pacing(rt->net, up, down) != CM_OK)
        return;
    pthread_mutex_lock(&rt->probe_mu); /* the reports read the caps under it */
    rt->cfg.max_upload_mbps = up;
    rt->cfg.max_download_mbps = down;
    pthread_mutex_unlock(&rt->probe_mu);
    printf("pacing: this agent sends at most %.1f and receives at most %.1f Mbit/s (%.0f %% of the link), so the "
           "router's buffer stays empty\n", up, down, rt->cfg.pace * 100);
    fflush(stdout);
}

static int start_net(struct peer_rt *rt)
{
    const char *listen = rt->cfg.listen_ip ? rt->cfg.listen_ip : "0.0.0.0";
    double t0 = peer_mono_s();
    rt->probe_stop = 0; /* a stop of the probes before a restart left it set */
    rt->cfg.client_mode = rt->flag_client_mode; /* an earlier start may have found us unreachable */
    rt->reach = rt->cfg.client_mode ? PEER_REACH_FLAG_CLIENT : PEER_REACH_UNKNOWN;
    rt->observed_ip[0] = 0;
    int rc = net_up(rt, listen);
    char adv[64] = "";
    if (rc == CM_OK && !rt->cfg.client_mode)
        rc = discover(rt, listen, adv, sizeof adv);
    /* reachable (or the coordinator could not tell): now into the DHT
       (net_up deferred it; a client-mode restart bootstrapped already) */
    if (rc == CM_OK && !rt->cfg.client_mode && !rt->cfg.advertise_ip && rt->n_bootstrap)
        peer_net_bootstrap(rt->net, (const char *const *)rt->bootstrap, rt->n_bootstrap);
    if (rc != CM_OK) {
        if (rt->net)
            peer_net_stop(rt->net);
        rt->net = NULL;
        return rc;
    }
    rt->reach_ms = (peer_mono_s() - t0) * 1e3;
    /* the link's rates, while nothing of ours uses it yet; a failure is a
       warning (the probe thread tries again). A volunteer who declared a cap
       told us about the link: the caps serve and nothing is measured (at
       join a 2 Mbit/s uploader took 1.7 s to measure, joining after the
       others; mid-run a 4 Mbit/s download read 1.8); nor is an agent on the
       coordinator's machine (loopback: the machine's memory bandwidth) */
    int lrc = peer_rt_link_measurable(rt) ? peer_rt_measure_link(rt, LINK_START_DEADLINE_MS) : CM_ENOTFOUND;
    if (lrc == CM_ECANCELED) {
        peer_net_stop(rt->net);
        rt->net = NULL;
        return CM_ECANCELED;
    }
    if (lrc == CM_OK && rt->cfg.pace > 0)
        pace_link(rt);
    char my[PEER_ADDR_MAX] = "", st[PEER_ADDR_MAX] = "";
    if (!rt->cfg.client_mode) {
        snprintf(my, sizeof my, strchr(adv, ':') ? "[%s]:%u" : "%s:%u", adv, peer_net_ar_port(rt->net));
        snprintf(st, sizeof st, strchr(adv, ':') ? "[%s]:%u" : "%s:%u", adv, peer_net_state_port(rt->net));
    }
    peer__set_addrs(rt, my, st);
    pthread_mutex_lock(&rt->addr_mu);
    rt->relay[0] = 0;
    pthread_mutex_unlock(&rt->addr_mu);
    /* hole punching needs where the Internet sees us, on both sides
       (docs/p2p.md, "Hole punching") */
    if (rt->observed_ip[0] && peer_net_set_public_ip(rt->net, rt->observed_ip) != CM_OK)
        CM_LOGW("peer", "could not set our public address %s for hole punching", rt->observed_ip);
    /* and where our own network sees us: peers behind the same router meet
       there (a punch through the router would need it to hairpin) */
    char lan[PEER_ADDR_MAX];
    if (rt->observed_ip[0] && peer_local_addr_towards(rt->coord.url, lan, sizeof lan) == CM_OK &&
        strcmp(lan, rt->observed_ip) && peer_net_set_local_ip(rt->net, lan) != CM_OK)
        CM_LOGW("peer", "could not set our local address %s for peers behind the same router", lan);
    /* unreachable: a relay at once when one is known (the keeper goes on
       looking otherwise, and replaces one that goes away) */
    if (rt->reach == PEER_REACH_CLIENT && !rt->cfg.no_relay && peer__relay_acquire(rt, NULL, 0) == CM_OK) {
        peer_rt_addrs(rt, my, st);
        printf("reachability: relayed through %s (averaging at %s, state at %s)\n", rt->relay, my, st);
        fflush(stdout);
    }
    peer__relay_keeper_start(rt);
    return CM_OK;
}

/* ---- reports ---- */
static int start_reports(struct peer_rt *rt)
{
    if (peer_reporter_start(rt->coord.url, rt->coord.ca_cert, rt->cfg.run, &rt->key, rt->token, &rt->rep) !=
        CM_OK) {
        fprintf(stderr, "warning: contribution reports unavailable for this session\n");
        rt->rep = NULL;
    }
    return CM_OK;
}

static void stop_reports(struct peer_rt *rt)
{
    if (!rt->rep)
        return;
    struct peer_reporter_stats rs;
    peer_reporter_stats(rt->rep, &rs);
    size_t left = peer_reporter_stop(rt->rep, 5000);
    rt->rep = NULL;
    printf("contribution reports: %llu accepted, %llu refused, %llu dropped%s\n",
           (unsigned long long)rs.sent, (unsigned long long)rs.refused, (unsigned long long)rs.dropped,
           left ? " (some still queued at exit)" : "");
    if (left)
        fprintf(stderr, "warning: %zu contribution reports could not be sent\n", left);
}

/* ---- probes ---- */
static int start_probes(struct peer_rt *rt)
{
    if (!rt->cfg.probes) /* client-mode peers measure too: outbound only */
        return CM_OK;
    rt->probe_stop = 0;
    if (pthread_create(&rt->probe_th, NULL, peer__probe_main, rt) == 0)
        rt->probe_started = 1;
    return CM_OK;
}

static void stop_probes(struct peer_rt *rt)
{
    if (!rt->probe_started)
        return;
    pthread_mutex_lock(&rt->probe_mu);
    __atomic_store_n(&rt->probe_stop, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&rt->probe_cv);
    pthread_mutex_unlock(&rt->probe_mu);
    pthread_join(rt->probe_th, NULL);
    rt->probe_started = 0;
    /* a later start measures its own peers */
    memset(&rt->probe_caps, 0, sizeof rt->probe_caps);
    rt->n_probe_hist = 0;
    rt->probe_new = 0;
    memset(&rt->caps, 0, sizeof rt->caps);
    rt->caps_at = 0;
    rt->link_up = rt->link_down = 0;
}

/* ---- lifecycle ---- */
static int start_stage(struct peer_rt *rt, enum peer_stage st)
{
    switch (st) {
    case PEER_STAGE_SESSION: return start_session(rt);
    case PEER_STAGE_PASS: return start_pass(rt);
    case PEER_STAGE_CLOCK: return clock_sync(rt, 1);
    case PEER_STAGE_NET: return start_net(rt);
    case PEER_STAGE_REPORTS: return start_reports(rt);
    case PEER_STAGE_PROBES: return start_probes(rt);
    default: return CM_EINVAL;
    }
}

int peer_rt_start(struct peer_rt *rt, enum peer_stage upto)
{
    if (upto < PEER_STAGE_NONE || upto > PEER_STAGE_ALL)
        return CM_EINVAL;
    if (!rt->cfg.run || !cm_name_valid(rt->cfg.run))
        return CM_EINVAL;
    int rc = CM_OK;
    while (rt->stage < upto && rc == CM_OK) {
        enum peer_stage next = (enum peer_stage)(rt->stage + 1);
        if (peer_rt_interrupted(rt))
            return CM_ECANCELED;
        if (rt->cfg.on_stage)
            rt->cfg.on_stage(rt->cfg.on_stage_arg, next);
        if (peer_rt_interrupted(rt))
            return CM_ECANCELED;
        /* Ctrl-C abandons the coordinator's requests of the start-up (they
           may wait 30 s for an answer); later ones are the role's to cancel */
        const volatile sig_atomic_t *was = rt->coord.cancel;
        rt->coord.cancel = rt->cfg.interrupted;
        rc = start_stage(rt, next);
        rt->coord.cancel = was;
        if (rc == CM_OK)
            rt->stage = next;
    }
    return rc != CM_OK && peer_rt_interrupted(rt) ? CM_ECANCELED : rc;
}

void peer_rt_stop(struct peer_rt *rt)
{
    peer_rt_stop_to(rt, PEER_STAGE_NONE);
}

void peer_rt_stop_to(struct peer_rt *rt, enum peer_stage keep)
{
    while (rt->stage > keep && rt->stage > PEER_STAGE_NONE) {
        switch (rt->stage) {
        case PEER_STAGE_PROBES: stop_probes(rt); break;
        case PEER_STAGE_REPORTS: stop_reports(rt); break;
        case PEER_STAGE_NET:
            peer__relay_keeper_stop(rt);
            if (rt->net)
                peer_net_stop(rt->net);
            rt->net = NULL;
            peer__set_addrs(rt, "", "");
            break;
        case PEER_STAGE_CLOCK: __atomic_store_n(&rt->clock_offset_ms, 0, __ATOMIC_RELAXED); break;
        case PEER_STAGE_PASS: drop_pass(rt); break;
        case PEER_STAGE_SESSION: stop_session(rt); break;
        default: break;
        }
        rt->stage = (enum peer_stage)(rt->stage - 1);
    }
}

void peer_rt_cleanup(struct peer_rt *rt)
{
    peer_rt_stop(rt);
    pthread_mutex_destroy(&rt->probe_mu);
    pthread_cond_destroy(&rt->probe_cv);
    pthread_mutex_destroy(&rt->addr_mu);
    pthread_mutex_destroy(&rt->relay_mu);
    pthread_cond_destroy(&rt->relay_cv);
}
