/* crowdtrain-agent join: a volunteer's whole collaborative-training loop
 * (seed 000_02cc6b5d62a616fc.txt §3.1-3.3; DESIGN.md "The training
 * protocol"):
 *
 *   session -> access pass -> DHT (bootstrap from the pass) -> catch up
 *   (newest checkpoint from the coordinator, hash verified) -> stream data
 *   -> accumulate gradients, publishing progress in the DHT -> when the
 *   collaboration's samples at this step reach the run's target batch size,
 *   announce for the round, gather the round's members, average with a
 *   butterfly all-reduce -> apply the identical optimizer step -> every K
 *   steps one deterministically chosen peer uploads a checkpoint -> repeat.
 *
 * The run's config (GET /api/v1/runs/{run}) is the training recipe in the
 * format of `train --local` (docs/training.md) plus an optional
 * "collaboration" object read here. Every peer builds its model from the
 * same seed, so all start from identical weights; each streams its own data
 * order. Ctrl-C leaves after the current round (or at once when not in a
 * round); a second Ctrl-C abandons the round. */
#include "agent/client.h"
#include "agent/commands.h"
#include "agent/dp/collab.h"
#include "agent/dp/groups.h"
#include "agent/peer/net.h"
#include "agent/peer/report.h"
#include "agent/dp/sched_follow.h"
#include "agent/train/steplog.h"
#include "agent/train/trainer.h"
#include "ckpt/safetensors.h"
#include "cm_err.h"
#include "cm_log.h"
#include "cm_opts.h"
#include "cm_token.h"
#include "p2p/p2p_transport.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct join_cfg {
    char *coordinator, *run, *config_dir, *device, *listen_ip, *advertise_ip, *export_path,
        *compression, *step_log, *progress;
    int aggregate_only, client_mode, no_eval, delayed_updates;
    long dht_port, ar_port, steps, micro_batch, checkpoint_every, round_timeout_ms, round_window_ms,
        outcome_window_ms, stall_ms;
    double max_upload_mbps, max_download_mbps;
};

#define J(f) offsetof(struct join_cfg, f)
static const struct cm_opt JOIN_OPTS[] = {
    {"run", CM_OPT_STR, J(run), NULL, "RUN", "the run to join", 0},
    {"coordinator", CM_OPT_STR, J(coordinator), NULL, "URL",
     "the coordinator (default: the one you logged in to)", 0},
    {"config-dir", CM_OPT_STR, J(config_dir), NULL, "DIR",
     "state directory (default ~/.config/crowdtrain)", 0},
    {"device", CM_OPT_STR, J(device), NULL, "DEV", "cpu, cuda or auto (default: the run's)", 0},
    {"aggregate-only", CM_OPT_BOOL, J(aggregate_only), NULL, NULL,
     "contribute bandwidth only: aggregate others' gradients, compute none", 0},
    {"client-mode", CM_OPT_BOOL, J(client_mode), NULL, NULL,
     "accept no inbound connections (behind NAT): send and receive, aggregate nothing", 0},
    {"max-upload-mbps", CM_OPT_DBL, J(max_upload_mbps), "0", "MBPS", "upload cap, 0 = none", 0},
    {"max-download-mbps", CM_OPT_DBL, J(max_download_mbps), "0", "MBPS", "download cap, 0 = none", 0},
    {"listen-ip", CM_OPT_STR, J(listen_ip), "0.0.0.0", "IP", "address peers connect to us on", 0},
    {"advertise-ip", CM_OPT_STR, J(advertise_ip), NULL, "IP",
     "address announced to peers (default: --listen-ip, or 127.0.0.1 for 0.0.0.0)", 0},
    {"dht-port", CM_OPT_INT, J(dht_port), "0", "PORT", "DHT port, 0 = any", 0},
    {"ar-port", CM_OPT_INT, J(ar_port), "0", "PORT", "averaging port, 0 = any", 0},
    {"steps", CM_OPT_INT, J(steps), "0", "N", "stop after this global step (default: the run's)", 0},
    {"micro-batch", CM_OPT_INT, J(micro_batch), "0", "N",
     "examples per forward/backward pass (default: the run's micro_batch)", 0},
    {"checkpoint-every", CM_OPT_INT, J(checkpoint_every), "0", "K",
     "upload a checkpoint every K steps when chosen (default: the run's, else 50)", 0},
    {"compression", CM_OPT_STR, J(compression), NULL, "C",
     "none, fp16 or q8 (default: the run's, else none)", 0},
    {"round-timeout-ms", CM_OPT_INT, J(round_timeout_ms), "60000", "MS", "deadline of one averaging round", 0},
    {"round-window-ms", CM_OPT_INT, J(round_window_ms), "300", "MS",
     "a round's members are the peers that announce within this window of the first", 0},
    {"outcome-window-ms", CM_OPT_INT, J(outcome_window_ms), "1500", "MS",
     "members agree on a round's averaged parts from the outcomes published within this window", 0},
    {"delayed-updates", CM_OPT_BOOL, J(delayed_updates), NULL, NULL,
     "overlap averaging with the next accumulation, at one step of staleness (seed 000 §3.2)", 0},
    {"stall-ms", CM_OPT_INT, J(stall_ms), "10000", "MS",
     "silence after which a peer in a round is given up for that round", 0},
    {"step-log", CM_OPT_STR, J(step_log), NULL, "FILE",
     "append one JSON line per step (step, parameter hash, loss, round) to FILE", 0},
    {"export", CM_OPT_STR, J(export_path), NULL, "FILE",
     "write the final parameters as safetensors (default CONFIG-DIR/<run>.safetensors)", 0},
    {"no-eval", CM_OPT_BOOL, J(no_eval), NULL, NULL, "skip the evaluation at the end", 0},
    {"progress", CM_OPT_STR, J(progress), "auto", "MODE",
     "live (one line updated in place), lines (a line per step, at most one per 10 s otherwise: "
     "for logs) or auto (live on a terminal)", 0},
};
static const struct cm_cmd_spec JOIN = {
    "crowdtrain-agent join --run RUN [options]",
    "Joins a collaborative training run with the session of 'crowdtrain-agent login':\n"
    "gets an access pass, finds the other peers through the DHT, catches up from\n"
    "the newest checkpoint, and trains: gradients are accumulated until the whole\n"
    "collaboration reaches the run's target batch size, averaged with the peers of\n"
    "that step, and the same optimizer step is applied everywhere. One progress\n"
    "line per step. Ctrl-C leaves cleanly.",
    JOIN_OPTS, sizeof JOIN_OPTS / sizeof JOIN_OPTS[0], 1};

static volatile sig_atomic_t g_interrupts;
static void on_sigint(int sig)
{
    (void)sig;
    g_interrupts++;
}

/* The collaboration's clock. Announcement windows, progress freshness and
 * outcome windows compare times that peers wrote with their own clocks; a
 * volunteer's clock a second off would put its announcements outside every
 * round window. So every peer uses the coordinator's clock: ours plus the
 * offset clock_sync measures (GET /api/v1/time). */
static int64_t g_clock_offset_ms; /* coordinator's clock minus ours (atomic) */
static int64_t g_test_skew_ms;    /* CROWDTRAIN_TEST_CLOCK_SKEW_MS: a wrong clock, for tests */

static int64_t raw_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000 + g_test_skew_ms;
}

static int64_t now_ms(void)
{
    return raw_ms() + __atomic_load_n(&g_clock_offset_ms, __ATOMIC_RELAXED);
}

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Readings kept per probed pair (see measure_pairs). */
#define PROBE_KEEP 3
#define PROBE_TRIES 4 /* passes over the peers that were busy with another prober */

struct peer_state {
    struct join_cfg o;
    char dir[4096], rundir[4300];
    struct agent_client coord;
    json_t *session, *pass;
    struct cm_ed25519 key;
    const char *token;
    uint8_t coord_keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN];
    size_t n_coord_keys;
    const char *bootstrap[16];
    size_t n_bootstrap;
    double target;
    long steps, ckpt_every;
    enum ar_comp comp;
    char *config_text;
    struct agent_train_config tcfg;
    struct agent_trainer tr;
    int trainer_ready;
    struct peer_net *net;
    char my_addr[COLLAB_ADDR_MAX], st_addr[COLLAB_ADDR_MAX];
    char progress_key[128];
    char hash[65];        /* parameter hash at hash_step */
    int64_t hash_step;
    FILE *steplog;
    uint64_t syncs;       /* states fetched from peers */
    double finished_at;   /* when a peer was first seen at the run's last step (mono_s) */
    int corrupt;          /* CROWDTRAIN_TEST_CORRUPT_GRADIENTS: 1 nan, 2 huge (tests only) */
    struct dp_sched *js;     /* schedules (issue 7), NULL when unavailable */
    struct peer_reporter *rep; /* contribution reports (docs/accounting.md) */
    struct peer_caps caps;     /* last capabilities reported */
    double caps_at, sched_at;  /* mono_s() of the last report / schedule refresh */
    pthread_t probe_th;        /* measures pairwise throughput (probe_main) */
    int probe_started, probe_stop, probe_new;
    int pull_only;             /* this step: the schedule says do not compute; take the
                                  average and step (see start_step_role) */
    double pull_only_off_until; /* mono_s(): compute whatever the schedule says until then */
    int averaging;             /* > 0 while a round or a state transfer uses the link
                                  (atomic; probes count only the time it is 0) */
    pthread_mutex_t probe_mu;
    pthread_cond_t probe_cv;
    struct peer_caps probe_caps; /* its latest measurement (pairs only) */
    struct pair_hist {           /* the probe thread's last readings per pair */
        uint8_t pub[CM_ED25519_PUB_LEN];
        double mbps[PROBE_KEEP]; /* newest first; 0 = none */
    } probe_hist[PEER_CAPS_MAX_PAIRS];
    size_t n_probe_hist;
    uint8_t prev[AR_MAX_MEMBERS][CM_ED25519_PUB_LEN]; /* senders of our last round */
    size_t n_prev;
    pthread_mutex_t js_mu;     /* js is used by the round thread too (delayed updates) */
    double mb_time;            /* seconds per micro-batch (moving average) */
    struct collab_hold hold;   /* delayed updates: our waits for the peers behind our step
                                  (see majority_behind), a bucket of JOIN_HOLD_S */
    double hold_warned;        /* mono_s() of the last "stayed behind" warning */
};

static int fetch_pass_once(struct peer_state *s)
{
    char pk[64], path[256];
    cm_b64url_encode(s->key.pub, CM_ED25519_PUB_LEN, pk);
    snprintf(path, sizeof path, "/api/v1/runs/%s/passes", s->o.run);
    json_t *body = json_pack("{s:s}", "peer_public_key", pk);
    struct agent_reply r;
    int rc = agent_request(&s->coord, "POST", path, body, &r);
    json_decref(body);
    if (rc != CM_OK)
        return rc;
    if (r.status != 201) {
        agent_reply_report("getting an access pass", &r);
        agent_reply_free(&r);
        return CM_EPERM;
    }
    s->pass = r.json;
    s->token = json_string_value(json_object_get(s->pass, "access_token"));
    size_t i;
    json_t *v;
    s->n_coord_keys = 0;
    json_array_foreach(json_object_get(s->pass, "coordinator_keys"), i, v) {
        size_t got = 0;
        const char *k = json_string_value(v);
        if (k && s->n_coord_keys < P2P_MAX_COORD_KEYS &&
            cm_b64url_decode(k, strlen(k), s->coord_keys[s->n_coord_keys], CM_ED25519_PUB_LEN, &got) == CM_OK &&
            got == CM_ED25519_PUB_LEN)
            s->n_coord_keys++;
    }
    s->n_bootstrap = 0;
    json_array_foreach(json_object_get(s->pass, "bootstrap"), i, v)
        if (s->n_bootstrap < 16)
            s->bootstrap[s->n_bootstrap++] = json_string_value(v);
    struct cm_pass_claims c;
    rc = s->token ? cm_token_verify(s->token, strlen(s->token), (const uint8_t(*)[32])s->coord_keys,
                                    s->n_coord_keys, time(NULL), 60, &c)
                  : CM_EPARSE;
    if (rc != CM_OK) {
        fprintf(stderr, "error: the access pass does not verify: %s\n", cm_strerror(rc));
        return rc;
    }
    return CM_OK;
}

/* A pass whose bootstrap list names at least one peer: a run that just
 * opened gets its backbone node within seconds. */
static int fetch_pass(struct peer_state *s)
{
    for (int attempt = 0;; attempt++) {
        json_decref(s->pass);
        s->pass = NULL;
        int rc = fetch_pass_once(s);
        if (rc != CM_OK || s->n_bootstrap > 0 || attempt >= 20)
            return rc;
        if (attempt == 0)
            printf("waiting for the run's DHT backbone to come up...\n");
        sleep(1);
    }
}

/* Measures g_clock_offset_ms: three reads of the coordinator's clock, the
 * one with the shortest round trip, against the midpoint of that trip (so
 * the error is at most half of it). Kept as it was when the coordinator
 * cannot be read (an older one without the endpoint, or a trip over 2 s). */
#define CLOCK_MAX_RTT_MS 2000
static void clock_sync(struct peer_state *s, int verbose)
{
    int64_t best = -1, off = 0;
    for (int i = 0; i < 3; i++) {
        struct agent_reply r = {0};
        int64_t t0 = raw_ms();
        int rc = agent_request(&s->coord, "GET", "/api/v1/time", NULL, &r);
        int64_t t1 = raw_ms();
        json_t *v = rc == CM_OK && r.status == 200 ? json_object_get(r.json, "time_ms") : NULL;
        if (json_is_integer(v) && t1 >= t0 && (best < 0 || t1 - t0 < best)) {
            best = t1 - t0;
            off = (int64_t)json_integer_value(v) - (t0 + (t1 - t0) / 2);
        }
        agent_reply_free(&r);
    }
    if (best < 0 || best > CLOCK_MAX_RTT_MS) {
        if (verbose)
            fprintf(stderr, "warning: could not read the coordinator's clock%s; using this machine's "
                            "(peers whose clocks differ by more than the round window cannot average "
                            "together)\n", best > CLOCK_MAX_RTT_MS ? " (round trip over 2 s)" : "");
        return;
    }
    int64_t was = __atomic_exchange_n(&g_clock_offset_ms, off, __ATOMIC_RELAXED);
    if (verbose ? (off >= 250 || off <= -250) : (off - was >= 250 || was - off >= 250))
        printf("%sclock: this machine's is %.1f s %s the coordinator's (round trip %lld ms); the "
               "collaboration's times follow the coordinator's\n", verbose ? "" : "\n",
               (double)(off < 0 ? -off : off) / 1000.0, off > 0 ? "behind" : "ahead of", (long long)best);
}

/* Renews the pass when a third of its lifetime is left, and hands the new
 * token to the network side; on failure the old pass is kept (and tried
 * again at the next step) until it expires. */
static void renew_pass_if_due(struct peer_state *s)
{
    json_int_t iat = json_integer_value(json_object_get(s->pass, "issued_at"));
    json_int_t exp = json_integer_value(json_object_get(s->pass, "expires_at"));
    time_t now = time(NULL);
    if (exp - now > (exp - iat) / 3)
        return;
    json_t *old = s->pass;
    const char *old_token = s->token;
    s->pass = NULL;
    if (fetch_pass_once(s) != CM_OK || !s->token) {
        fprintf(stderr, "\nwarning: renewing the access pass failed; keeping the current one\n");
        json_decref(s->pass);
        s->pass = old;
        s->token = old_token;
        return;
    }
    if (s->rep)
        peer_reporter_set_token(s->rep, s->token);
    clock_sync(s, 0); /* clocks drift: measure again with each pass */
    if (peer_net_set_token(s->net, s->token) != CM_OK) {
        fprintf(stderr, "\nwarning: could not install the renewed pass\n");
    } else {
        printf("\nrenewed the access pass (pass %s)\n",
               json_string_value(json_object_get(s->pass, "pass_id")));
    }
    json_decref(old);
}

/* The run: target batch size and the training recipe. */
static int fetch_run(struct peer_state *s)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "/api/v1/runs/%s", s->o.run);
    struct agent_reply r;
    int rc = agent_request(&s->coord, "GET", path, NULL, &r);
    if (rc != CM_OK)
        return rc;
    if (r.status != 200) {
        agent_reply_report("reading the run", &r);
        agent_reply_free(&r);
        return CM_ENOTFOUND;
    }
    s->target = (double)json_integer_value(json_object_get(r.json, "target_batch_size"));
    json_t *cfg = json_deep_copy(json_object_get(r.json, "config"));
    agent_reply_free(&r);
    if (!json_is_object(cfg) || !json_object_get(cfg, "model")) {
        fprintf(stderr, "error: run '%s' has no training recipe in its config; an organizer sets "
                        "it with PATCH /api/v1/runs/%s {\"config\": {...}}\n", s->o.run, s->o.run);
        json_decref(cfg);
        return CM_EINVAL;
    }
    /* "collaboration" is ours; the rest is the train --local recipe. */
    json_t *collab = json_object_get(cfg, "collaboration");
    json_incref(collab);
    json_object_del(cfg, "collaboration");
    s->ckpt_every = s->o.checkpoint_every ? s->o.checkpoint_every
                                          : (long)json_integer_value(json_object_get(collab, "checkpoint_every"));
    if (s->ckpt_every <= 0)
        s->ckpt_every = 50;
    char comp_buf[16] = "";
    const char *comp = s->o.compression ? s->o.compression
                                        : json_string_value(json_object_get(collab, "compression"));
    if (comp) {
        snprintf(comp_buf, sizeof comp_buf, "%s", comp);
        comp = comp_buf;
    }
    json_decref(collab);
    s->comp = AR_COMP_NONE;
    if (comp && !strcmp(comp, "fp16"))
        s->comp = AR_COMP_FP16;
    else if (comp && !strcmp(comp, "q8"))
        s->comp = AR_COMP_Q8;
    else if (comp && strcmp(comp, "none") != 0) {
        fprintf(stderr, "error: compression must be none, fp16 or q8\n");
        json_decref(cfg);
        return CM_EINVAL;
    }
    s->config_text = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    if (!s->config_text)
        return CM_ENOMEM;
    rc = agent_train_config_parse(s->config_text, strlen(s->config_text), NULL, &s->tcfg, err, sizeof err);
    if (rc != CM_OK) {
        fprintf(stderr, "error: the run's training recipe: %s\n", err);
        return rc;
    }
    if (s->o.micro_batch > 0)
        s->tcfg.micro_batch = (int)s->o.micro_batch;
    /* one call of compute_grads = one micro-batch; the collaboration sums them */
    s->tcfg.batch_size = s->tcfg.micro_batch;
    if (s->o.device)
        snprintf(s->tcfg.device, sizeof s->tcfg.device, "%s", s->o.device);
    s->steps = s->o.steps > 0 ? s->o.steps : s->tcfg.steps;
    /* every peer its own data order, everyone the same initial weights */
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(s->key.pub, CM_ED25519_PUB_LEN, h);
    memcpy(&s->tcfg.data_seed, h, sizeof s->tcfg.data_seed);
    s->tcfg.data_seed |= 1;
    if (strlen(s->rundir) >= sizeof s->tcfg.ckpt_dir) {
        fprintf(stderr, "error: the state directory path is too long\n");
        return CM_EINVAL;
    }
    memcpy(s->tcfg.ckpt_dir, s->rundir, strlen(s->rundir) + 1);
    s->tcfg.resume = 0;
    return CM_OK;
}

/* Loads the coordinator's newest checkpoint when it is ahead of us. */
static int catch_up_inner(struct peer_state *s, int64_t min_step, int64_t *step_out)
{
    char path[256], dest[4400], sha[65], err[512];
    if (min_step > 0) {
        /* only a checkpoint past min_step is worth loading: loading an
           older one would put our parameters behind our step */
        snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints", s->o.run);
        struct agent_reply r = {0};
        if (agent_request(&s->coord, "GET", path, NULL, &r) != CM_OK)
            return CM_ECONN;
        json_t *first = json_array_get(json_object_get(r.json, "checkpoints"), 0);
        int64_t newest = r.status == 200 && first ? json_integer_value(json_object_get(first, "step")) : -1;
        agent_reply_free(&r);
        if (newest < min_step)
            return CM_ENOTFOUND;
    }
    snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints/latest", s->o.run);
    snprintf(dest, sizeof dest, "%s/latest.ckpt", s->rundir);
    long status = 0;
    int rc = agent_download_file(&s->coord, path, dest, &status, sha);
    if (rc != CM_OK)
        return rc;
    if (status == 404)
        return CM_ENOTFOUND;
    if (status != 200) {
        fprintf(stderr, "error: downloading the newest checkpoint: HTTP %ld\n", status);
        return CM_EPROTO;
    }
    int resumed = 0;
    rc = agent_trainer_resume(&s->tr, &resumed, err, sizeof err);
    if (rc != CM_OK) {
        fprintf(stderr, "error: loading the checkpoint: %s\n", err);
        return rc;
    }
    *step_out = (int64_t)s->tr.opt->step;
    printf("caught up from the coordinator's checkpoint at step %lld (sha256 %.16s...)\n",
           (long long)*step_out, sha);
    return CM_OK;
}

/* Marks the link busy (+1) or frees it (-1) for the probes: they count
 * only the time no round or state transfer of ours runs (peer_net_probe). */
static void link_busy(struct peer_state *s, int d)
{
    __atomic_add_fetch(&s->averaging, d, __ATOMIC_ACQ_REL);
}

static int catch_up(struct peer_state *s, int64_t min_step, int64_t *step_out)
{
    link_busy(s, 1);
    int rc = catch_up_inner(s, min_step, step_out);
    link_busy(s, -1);
    return rc;
}

static int publish_progress(struct peer_state *s, int64_t step, double samples, double sps,
                            double pledged)
{
    struct collab_progress p = {0};
    p.step = step;
    p.samples = samples;
    p.pledged = pledged;
    p.pstep = (int64_t)s->tr.opt->step;
    if (p.pstep > step)
        p.pstep = step;
    else if (p.pstep < step - 1)
        /* a round of ours averages ahead of our parameters (we joined the
           collaboration with a round in flight, see join_bet_check): it
           applies to the parameters of step - 1, which the others hold.
           Saying `step` here made peers behind us ask for a state two
           steps past anyone's and wait 90 s per peer for it. */
        p.pstep = step - 1;
    p.sps = sps;
    p.t_ms = now_ms();
    snprintf(p.addr, sizeof p.addr, "%s", s->my_addr);
    p.client = s->o.client_mode;
    /* A pull-only peer counts as auxiliary for the others' counting (it
       accumulates nothing, must not hold a round back, and a round of one
       sender beside it is still one sender); it publishes its state host and
       hash like any peer with parameters. */
    p.aux = s->o.aggregate_only || s->pull_only;
    if (!s->o.aggregate_only) {
        snprintf(p.st, sizeof p.st, "%s", s->st_addr);
        /* the hash of the parameters it holds (at pstep: with a round in
           flight, one step behind the step it accumulates for) */
        if (s->hash_step == p.pstep)
            snprintf(p.hash, sizeof p.hash, "%.*s", COLLAB_HASH_HEX, s->hash);
    }
    char rec[COLLAB_RECORD_MAX];
    int rc = collab_progress_encode(&p, rec, sizeof rec);
    return rc ? rc : peer_net_put(s->net, s->progress_key, rec, strlen(rec), 60000);
}

/* The parameter hash of the current state (after a step, a catch-up or a
 * state transfer): published with progress so peers notice divergence. */
static void update_hash(struct peer_state *s, int64_t step)
{
    if (s->o.aggregate_only || agent_param_hash(s->tr.model, s->hash) != CM_OK) {
        s->hash_step = -1;
        return;
    }
    s->hash_step = step;
}

/* Serves our state to a peer that asked for it (a late joiner, or a peer
 * behind or diverged), when we hold the step it wants. */
static void serve_state_if_wanted(struct peer_state *s, int64_t step)
{
    int64_t want = peer_net_state_wanted(s->net);
    if (want < 0 || want > step || s->o.aggregate_only || !s->st_addr[0])
        return;
    char err[512], file[4400];
    if (agent_trainer_save(&s->tr, err, sizeof err) != CM_OK) {
        fprintf(stderr, "\nwarning: saving the state for a peer: %s\n", err);
        return;
    }
    snprintf(file, sizeof file, "%s/latest.ckpt", s->rundir);
    FILE *f = fopen(file, "rb");
    if (!f)
        return;
    uint8_t *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len)) && fread(buf, 1, (size_t)len, f) == (size_t)len) {
        peer_net_state_publish(s->net, step, buf, (size_t)len);
        buf = NULL;
    }
    free(buf);
    fclose(f);
}

static int read_progress(struct peer_state *s, struct collab_progress **out, size_t *n)
{
    struct peer_record *r = NULL;
    size_t nr = 0;
    *out = NULL;
    *n = 0;
    int rc = peer_net_get(s->net, s->progress_key, &r, &nr);
    if (rc != CM_OK)
        return rc;
    struct collab_progress *p = calloc(nr ? nr : 1, sizeof *p);
    for (size_t i = 0; p && i < nr; i++)
        if (collab_progress_parse(r[i].value, r[i].len, &p[*n]) == CM_OK) {
            memcpy(p[*n].pub, r[i].author, CM_ED25519_PUB_LEN);
            (*n)++;
        }
    peer_records_free(r, nr);
    *out = p;
    return p ? CM_OK : CM_ENOMEM;
}

/* Announces for the round of `step` and gathers its members: our round is
 * the window our announcement falls in (collab_round_members: a window
 * closes window_ms after its first announcement), and the members are read
 * once its close plus a propagation margin has passed, so every peer that
 * reads after that agrees on them. A peer too late for a window opens the
 * next one (run_round_timed declines to step alone while others
 * accumulate). Announcing again for the same step replaces our earlier
 * announcement (newest record per author). */
#define GATHER_MARGIN_MS 150

static int gather(struct peer_state *s, int64_t step, double weight, int pull_only,
                  struct collab_announce **out, size_t *n)
{
    char key[160], rec[COLLAB_RECORD_MAX];
    snprintf(key, sizeof key, "%s/round/%lld", s->o.run, (long long)step);
    struct collab_announce me = {0};
    memcpy(me.pub, s->key.pub, CM_ED25519_PUB_LEN);
    me.weight = s->o.aggregate_only || pull_only ? 0 : weight;
    me.sends = !s->o.aggregate_only && !pull_only;
    me.pull_only = !s->o.aggregate_only && pull_only;
    me.agg = !s->o.client_mode;
    me.t_ms = now_ms();
    me.sched_version = s->js ? dp_sched_version(s->js) : 0;
    snprintf(me.addr, sizeof me.addr, "%s", s->o.client_mode ? "" : s->my_addr);
    int rc = collab_announce_encode(&me, rec, sizeof rec);
    if (rc || (rc = peer_net_put(s->net, key, rec, strlen(rec), 120000)) != CM_OK)
        return rc;
    struct collab_announce *a = NULL;
    size_t na = 0;
    int64_t close = me.t_ms + s->o.round_window_ms;
    for (;;) {
        int final = now_ms() >= close + GATHER_MARGIN_MS;
        struct peer_record *r = NULL;
        size_t nr = 0;
        if ((rc = peer_net_get(s->net, key, &r, &nr)) != CM_OK) {
            free(a);
            return rc;
        }
        free(a);
        a = calloc(nr + 1, sizeof *a);
        na = 0;
        for (size_t i = 0; a && i < nr; i++)
            if (collab_announce_parse(r[i].value, r[i].len, &a[na]) == CM_OK) {
                memcpy(a[na].pub, r[i].author, CM_ED25519_PUB_LEN);
                na++;
            }
        peer_records_free(r, nr);
        if (!a)
            return CM_ENOMEM;
        a[na++] = me; /* our own view of ourselves; duplicates collapse */
        na = collab_canonical(a, na);
        struct collab_announce *tmp = malloc(na * sizeof *tmp);
        if (!tmp) {
            free(a);
            return CM_ENOMEM;
        }
        memcpy(tmp, a, na * sizeof *tmp);
        size_t nm = collab_round_members(tmp, na, s->o.round_window_ms, me.t_ms, &close);
        free(tmp);
        if (final && now_ms() >= close + GATHER_MARGIN_MS) {
            na = collab_round_members(a, na, s->o.round_window_ms, me.t_ms, &close);
            break;
        }
        (void)nm;
        int64_t wait = close + GATHER_MARGIN_MS - now_ms();
        usleep((useconds_t)(wait > 50 ? 50000 : wait > 0 ? wait * 1000 : 1000));
    }
    size_t k = 0;
    while (k < na && memcmp(a[k].pub, me.pub, CM_ED25519_PUB_LEN))
        k++;
    if (k == na) {
        free(a);
        return CM_EBUSY;
    }
    *out = a;
    *n = na;
    return CM_OK;
}

static int upload_checkpoint(struct peer_state *s, int64_t step)
{
    char err[512], path[256], file[4400], sha[65];
    if (agent_trainer_save(&s->tr, err, sizeof err) != CM_OK) {
        fprintf(stderr, "warning: saving the checkpoint: %s\n", err);
        return CM_EIO;
    }
    snprintf(file, sizeof file, "%s/latest.ckpt", s->rundir);
    if (agent_file_sha256(file, sha) != CM_OK)
        return CM_EIO;
    snprintf(path, sizeof path, "/api/v1/runs/%s/checkpoints/%lld", s->o.run, (long long)step);
    struct agent_reply r;
    int rc = agent_upload_file(&s->coord, path, file, sha, &r);
    if (rc == CM_OK && r.status != 201 && r.status != 200) {
        agent_reply_report("uploading the checkpoint", &r);
        rc = CM_EPROTO;
    }
    agent_reply_free(&r);
    if (rc == CM_OK)
        printf("uploaded the checkpoint of step %lld\n", (long long)step);
    return rc;
}

static int export_model(struct peer_state *s, const char *path)
{
    struct kern_model *m = s->tr.model;
    float *host = malloc(m->nparams * sizeof *host);
    struct cm_st_export *t = calloc((size_t)m->ntensors, sizeof *t);
    int rc = CM_ENOMEM;
    if (host && t && (rc = m->be->download(host, m->params, m->nparams * sizeof *host)) == CM_OK) {
        for (int i = 0; i < m->ntensors; i++) {
            t[i].name = m->tensors[i].name;
            t[i].ndim = (uint32_t)m->tensors[i].ndim;
            for (int d = 0; d < m->tensors[i].ndim; d++)
                t[i].shape[d] = (uint64_t)m->tensors[i].shape[d];
            t[i].data = host + m->tensors[i].off;
        }
        const char *meta[] = {"format", "pt", "run", s->o.run};
        rc = cm_st_write(path, t, (size_t)m->ntensors, meta, 2);
    }
    free(host);
    free(t);
    return rc;
}

static int g_progress_live = 1; /* --progress: 1 live, 0 lines */

static void print_line(long step, double samples, double target, double sps, int pull_only,
                       size_t peers, double loss, double eta)
{
    static long last_step = -1;
    static double last_t;
    if (!g_progress_live) {
        if (step == last_step && mono_s() - last_t < 10)
            return;
        last_step = step;
        last_t = mono_s();
    }
    char etas[32], rate[32], losss[32];
    if (isfinite(eta))
        snprintf(etas, sizeof etas, "%.1fs", eta);
    else
        snprintf(etas, sizeof etas, "?");
    /* a pull-only peer computes nothing: its last rate and loss would mislead */
    if (pull_only)
        snprintf(rate, sizeof rate, "  pull-only (no compute)");
    else
        snprintf(rate, sizeof rate, "%7.1f samples/s", sps);
    if (pull_only || !isfinite(loss))
        snprintf(losss, sizeof losss, "%7s", "-");
    else
        snprintf(losss, sizeof losss, "%7.4f", loss);
    printf("%sstep %6ld | samples %8.0f / %.0f | %s | %2zu peers | loss %s | next step in %s%s",
           g_progress_live ? "\r" : "", step, samples, target, rate, peers, losss, etas,
           g_progress_live ? "   " : "\n");
    fflush(stdout);
}

/* Capabilities for the schedule (docs/schedules.md): re-reported every
 * minute and when they change materially; the schedule is refreshed every
 * 30 s. Bandwidth is the volunteer's cap; without one, 1 Gbit/s is assumed.
 * Pairwise throughput is measured to a few peers (measure_pairs). */
/* The schedule the coordinators' backbone nodes announce in the DHT
 * ("<run>/schedule"), for when the coordinator cannot be reached: verified
 * with the coordinator keys like the REST answer. */
static void sched_from_dht(struct peer_state *s)
{
    char key[160];
    snprintf(key, sizeof key, "%s/schedule", s->o.run);
    struct peer_record *r = NULL;
    size_t nr = 0;
    if (peer_net_get(s->net, key, &r, &nr) != CM_OK)
        return;
    for (size_t i = 0; i < nr; i++) {
        json_t *o = json_loadb((const char *)r[i].value, r[i].len, JSON_REJECT_DUPLICATES, NULL);
        if (o)
            dp_sched_accept(s->js, o, (int64_t)time(NULL), 1);
        json_decref(o);
    }
    peer_records_free(r, nr);
}

/* Pairwise throughput to a sample of peers (up to 3, chosen by
 * SHA-256(our key || theirs), so different peers probe different ones):
 * up to 2 MiB or 2 s of quiet time each over the state hosts, within the volunteer's
 * caps, two 32 KiB messages in flight (peer_net_probe), so a slow link
 * holds little queued behind the probe. Shorter probes (600 ms, best of 3)
 * read slow links high by the token bucket's burst, and the LP then picked
 * another vertex of the same optimum, one that let the slow peers aggregate
 * and took 1.7x its prediction. A thread of its own does it (20-30 s after
 * joining, again 40-60 s later, then every five minutes), so the probes
 * never hold the training loop.
 *
 * A probe reads what the path gives while it runs: when it shares the link
 * with the collaboration's averaging, or with another peer's probe, it reads
 * a fraction of it (tests/integ/test_schedule_follow.c saw 0.6-2.2 Mbit/s on
 * 4 Mbit/s links, the LP then planned around links that were not there and
 * predicted rounds 10-20 % slower than they ran). So a probe counts only
 * the time no round or state transfer of this peer is running (s->averaging;
 * rounds are synchronous, so mostly nobody's is), a state host serves one
 * prober at a time (busy ones are tried again later), the start is
 * jittered, and each pair is reported at the best of its last PROBE_KEEP
 * readings: contention comes and goes, a path's bottleneck stays. */
#define PROBE_PEERS 3
#define PROBE_BYTES (2048u * 1024u)
#define PROBE_BUDGET_MS 2000    /* of quiet time (see peer_net_probe) */
#define PROBE_DEADLINE_MS 60000 /* to find that much quiet time */
#define PROBE_EVERY_S 300
#define PROBE_FIRST_S 20
#define PROBE_SECOND_S 40
#define PROBE_JITTER_S 20

/* Records a reading of the pair to `pub` and returns the pair's best of its
 * last PROBE_KEEP readings. Probe thread only. */
static double pair_best(struct peer_state *s, const uint8_t *pub, double mbps)
{
    size_t i = 0;
    while (i < s->n_probe_hist && memcmp(s->probe_hist[i].pub, pub, CM_ED25519_PUB_LEN))
        i++;
    if (i == s->n_probe_hist) {
        if (i == PEER_CAPS_MAX_PAIRS) /* full: the oldest entry makes room */
            memmove(s->probe_hist, s->probe_hist + 1, --i * sizeof s->probe_hist[0]);
        else
            s->n_probe_hist++;
        memset(&s->probe_hist[i], 0, sizeof s->probe_hist[i]);
        memcpy(s->probe_hist[i].pub, pub, CM_ED25519_PUB_LEN);
    }
    struct pair_hist *h = &s->probe_hist[i];
    memmove(h->mbps + 1, h->mbps, (PROBE_KEEP - 1) * sizeof h->mbps[0]);
    h->mbps[0] = mbps;
    double best = 0;
    for (size_t k = 0; k < PROBE_KEEP; k++)
        best = fmax(best, h->mbps[k]);
    return best;
}

/* Waits `secs` seconds or until the agent stops; 1 when it stops. */
static int probe_pause(struct peer_state *s, int secs)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += secs;
    pthread_mutex_lock(&s->probe_mu);
    while (!s->probe_stop && pthread_cond_timedwait(&s->probe_cv, &s->probe_mu, &dl) == 0)
        ;
    int stop = s->probe_stop;
    pthread_mutex_unlock(&s->probe_mu);
    return stop;
}

/* Seconds in [base, base + PROBE_JITTER_S / 2], drawn afresh each time. */
static int probe_wait(int base)
{
    uint8_t r = 0;
    if (cm_random_bytes(&r, 1) != CM_OK)
        r = 0;
    return base + r % (PROBE_JITTER_S / 2 + 1);
}
static void measure_pairs(struct peer_state *s, struct peer_caps *c)
{
    c->n_pairs = 0;
    struct collab_progress *p = NULL;
    size_t n = 0;
    if (read_progress(s, &p, &n) != CM_OK)
        return;
    int64_t now = now_ms();
    uint8_t best_h[PROBE_PEERS][CM_SHA256_LEN];
    size_t best[PROBE_PEERS], nb = 0;
    for (size_t i = 0; i < n; i++) {
        if (!p[i].st[0] || p[i].aux || p[i].t_ms < now - 30000 ||
            !memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN))
            continue;
        uint8_t buf[2 * CM_ED25519_PUB_LEN], h[CM_SHA256_LEN];
        memcpy(buf, s->key.pub, CM_ED25519_PUB_LEN);
        memcpy(buf + CM_ED25519_PUB_LEN, p[i].pub, CM_ED25519_PUB_LEN);
        cm_sha256(buf, sizeof buf, h);
        size_t at = nb;
        while (at > 0 && memcmp(h, best_h[at - 1], sizeof h) < 0)
            at--;
        if (at >= PROBE_PEERS)
            continue;
        for (size_t k = (nb < PROBE_PEERS ? nb : PROBE_PEERS - 1); k > at; k--) {
            best[k] = best[k - 1];
            memcpy(best_h[k], best_h[k - 1], sizeof h);
        }
        best[at] = i;
        memcpy(best_h[at], h, sizeof h);
        if (nb < PROBE_PEERS)
            nb++;
    }
    /* A peer busy with another prober is tried again after the others,
       a few seconds later, up to PROBE_TRIES times. */
    uint8_t busy[PROBE_PEERS] = {0};
    for (int pass = 0; pass < PROBE_TRIES; pass++) {
        size_t again = 0;
        for (size_t k = 0; k < nb && c->n_pairs < PEER_CAPS_MAX_PAIRS; k++) {
            if (pass > 0 && !busy[k])
                continue;
            busy[k] = 0;
            double mbps = 0;
            int rc = peer_net_probe(s->net, p[best[k]].st, p[best[k]].pub, PROBE_BYTES,
                                    PROBE_BUDGET_MS, PROBE_DEADLINE_MS, &s->averaging, &s->probe_stop, &mbps);
            if (rc == CM_OK && mbps > 0) {
                memcpy(c->pairs[c->n_pairs].pub, p[best[k]].pub, CM_ED25519_PUB_LEN);
                c->pairs[c->n_pairs++].mbps = pair_best(s, p[best[k]].pub, mbps);
                /* reported as they come (a probe may wait long for quiet
                   time), unless that would report fewer pairs than before */
                pthread_mutex_lock(&s->probe_mu);
                if (c->n_pairs >= s->probe_caps.n_pairs) {
                    s->probe_caps = *c;
                    s->probe_new = 1;
                }
                pthread_mutex_unlock(&s->probe_mu);
            } else if (rc == CM_EBUSY) {
                busy[k] = 1;
                again++;
            }
        }
        if (!again || probe_pause(s, probe_wait(1))) /* 1-11 s */
            break;
    }
    free(p);
}

static void *probe_main(void *arg)
{
    struct peer_state *s = arg;
    int wait_s = probe_wait(PROBE_FIRST_S), rounds = 0;
    pthread_mutex_lock(&s->probe_mu);
    while (!s->probe_stop) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += wait_s;
        while (!s->probe_stop && pthread_cond_timedwait(&s->probe_cv, &s->probe_mu, &dl) == 0)
            ;
        if (s->probe_stop)
            break;
        pthread_mutex_unlock(&s->probe_mu);
        struct peer_caps c = {0};
        measure_pairs(s, &c);
        pthread_mutex_lock(&s->probe_mu);
        if (c.n_pairs) {
            s->probe_caps = c;
            s->probe_new = 1;
        }
        rounds += c.n_pairs > 0;
        wait_s = probe_wait(!c.n_pairs ? PROBE_FIRST_S : rounds == 1 ? PROBE_SECOND_S : PROBE_EVERY_S);
    }
    pthread_mutex_unlock(&s->probe_mu);
    return NULL;
}

static void schedule_upkeep(struct peer_state *s, double sps)
{
    if (!s->js)
        return;
    double t = mono_s();
    struct peer_caps c = {0};
    c.sps = s->o.aggregate_only ? 0 : sps;
    c.up_mbps = s->o.max_upload_mbps > 0 ? s->o.max_upload_mbps : 1000;
    c.down_mbps = s->o.max_download_mbps > 0 ? s->o.max_download_mbps : 1000;
    c.inbound = !s->o.client_mode;
    /* the pairs the probe thread measured last */
    pthread_mutex_lock(&s->probe_mu);
    int fresh_pairs = s->probe_new;
    s->probe_new = 0;
    c.n_pairs = s->probe_caps.n_pairs;
    memcpy(c.pairs, s->probe_caps.pairs, sizeof c.pairs);
    pthread_mutex_unlock(&s->probe_mu);
    if ((c.sps > 0 || s->o.aggregate_only) &&
        (s->caps_at == 0 || t - s->caps_at > 60 || fresh_pairs || peer_caps_changed(&s->caps, &c))) {
        if (peer_caps_report(&s->coord, s->o.run, s->key.pub, &c) == CM_OK)
            s->caps = c;
        s->caps_at = t;
    }
    /* every 30 s once a schedule lists us; every 5 s until then, so a new
       peer's capabilities are put to use soon after the coordinator solves */
    const struct sched_schedule *cur = dp_sched_current(s->js);
    int listed = 0;
    for (size_t i = 0; cur && i < cur->n && !listed; i++)
        listed = !memcmp(cur->peers[i].key, s->key.pub, CM_ED25519_PUB_LEN);
    if (s->sched_at == 0 || t - s->sched_at > (listed ? 30 : 5)) {
        if (dp_sched_refresh(s->js, &s->coord) != CM_OK)
            sched_from_dht(s);
        s->sched_at = t;
    }
}

/* The round's aggregation fractions: the schedule version the members
 * announced (the highest), fetched when we lack it; an even split among the
 * members that accept connections when there is none. Returns the version
 * used (0: even). */
static int64_t plan_round(struct peer_state *s, const struct collab_announce *mem, struct ar_member *am,
                          size_t nmem)
{
    int agg_ok[AR_MAX_MEMBERS];
    int64_t v = 0;
    for (size_t i = 0; i < nmem; i++) {
        agg_ok[i] = am[i].fraction > 0;
        if (mem[i].sched_version > v)
            v = mem[i].sched_version;
    }
    if (v > 0 && s->js && !dp_sched_has_version(s->js, v) &&
        dp_sched_fetch_version(s->js, &s->coord, v) != CM_OK &&
        (sched_from_dht(s), !dp_sched_has_version(s->js, v)))
        fprintf(stderr, "\nwarning: could not get schedule version %lld; averaging with even parts\n",
                (long long)v);
    if (s->js && dp_sched_plan_version(s->js, v, am, agg_ok, nmem) == CM_OK)
        return v;
    for (size_t i = 0; i < nmem; i++)
        am[i].fraction = agg_ok[i] ? 1.0 : 0.0;
    return 0;
}

/* The contribution report of a round (queued; sent in the background). */
static void report_round(struct peer_state *s, int64_t step, const uint8_t *rid, double samples,
                         double compute_s, double loss, double sps, const struct peer_round_summary *sum,
                         size_t n_parts, uint64_t agreed, const struct collab_announce *mem,
                         const struct ar_member *am, size_t nmem)
{
    if (!s->rep || s->o.aggregate_only || !(samples > 0)) /* nothing contributed */
        return;
    struct peer_report *r = calloc(1, sizeof *r);
    if (!r)
        return;
    r->step = step;
    snprintf(r->group, sizeof r->group, "all");
    memcpy(r->round_id, rid, sizeof r->round_id);
    r->samples = samples;
    r->compute_s = compute_s;
    r->loss = isfinite(loss) ? loss : 0;
    r->sps = sps;
    r->round_ms = sum->ms_total;
    r->parts = (int)n_parts;
    r->parts_averaged = __builtin_popcountll(agreed);
    for (size_t i = 0; i < nmem && r->n_members < PEER_REPORT_MEMBERS_MAX; i++)
        if (mem[i].sends) {
            memcpy(r->members[r->n_members].pub, mem[i].pub, 32);
            r->members[r->n_members++].samples = mem[i].weight;
        }
    for (size_t i = 0; i < sum->n_excluded && r->n_excluded < 64; i++) {
        memcpy(r->excluded[r->n_excluded].pub, am[sum->excluded[i]].pub, 32);
        snprintf(r->excluded[r->n_excluded++].reason, sizeof r->excluded[0].reason, "%s",
                 ar_excl_reason_name(sum->excluded_reason[i]));
    }
    peer_reporter_submit(s->rep, r);
    free(r);
}

/* Members of the previous round (their keys), for lagging_members. */
#define LAG_WAIT_S 5.0
static int lagging_members(const struct peer_state *s, const struct collab_progress *p, size_t n,
                           int64_t acc_step, int64_t now)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i].step >= acc_step || p[i].aux || p[i].t_ms < now - 10000 ||
            !memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN))
            continue;
        for (size_t k = 0; k < s->n_prev; k++)
            if (!memcmp(s->prev[k], p[i].pub, CM_ED25519_PUB_LEN) && p[i].step == acc_step - 1)
                return 1;
    }
    return 0;
}

/* The hash most fresh peers whose parameters are at `pstep` hold (ties: the
 * smallest), counting ourselves; "" when nobody published one. */
static void majority_hash(const struct collab_progress *p, size_t n, int64_t pstep, int64_t now,
                          char out[COLLAB_HASH_HEX + 1])
{
    size_t best = 0;
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].pstep != pstep || !p[i].hash[0] || p[i].aux || p[i].t_ms < now - 30000)
            continue;
        size_t c = 0;
        for (size_t k = 0; k < n; k++)
            c += p[k].pstep == pstep && p[k].t_ms >= now - 30000 && !strcmp(p[k].hash, p[i].hash);
        if (c > best || (c == best && strcmp(p[i].hash, out) < 0)) {
            best = c;
            snprintf(out, COLLAB_HASH_HEX + 1, "%s", p[i].hash);
        }
    }
}

/* While we wait for a peer's state, others may wait for ours (peers that
 * fell apart at the same step each asked the other): serve it meanwhile.
 * Our parameters do not change during the wait; their step is the
 * optimizer's. Nonzero after Ctrl-C: the fetch stops (a state of 20 MB
 * from a slow peer, or one it prepares for 90 s, would hold us that long). */
static int serve_own_state(void *arg)
{
    if (g_interrupts)
        return 1;
    struct peer_state *s = arg;
    /* the wait can be long: our pass must stay valid, or every peer
       refuses us as "expired token" once the state is ready */
    renew_pass_if_due(s);
    if (s->hash_step >= 0)
        serve_state_if_wanted(s, (int64_t)s->tr.opt->step);
    return 0;
}

/* Fetches the state of a peer at step >= min_step (preferring peers that
 * hold it and the majority hash of their step) and loads it. CM_OK: *step
 * moved. wait_ms (0: 20 s, or 90 s from a peer a step short of it) bounds
 * how long a peer that holds it may take to have it ready, and how long
 * the peers that do not hold it yet may take, together. */
static int sync_from_peer_inner(struct peer_state *s, int64_t min_step, int64_t *step, uint32_t wait_ms)
{
    struct collab_progress *p = NULL;
    size_t n = 0;
    if (read_progress(s, &p, &n) != CM_OK)
        return CM_ECONN;
    int64_t now = now_ms();
    int rc = CM_ENOTFOUND;
    /* Pass 0: the peers that hold such a state (they publish the hash of
       parameters at min_step or later) and agree with the majority of
       their step: ready at once. Asking a peer a step short of it first
       cost up to 90 s when that peer was catching up itself. Pass 1 (not
       when wait_ms): the peers that agree with the majority. Pass 2: the
       others, with wait_ms bounding their waits in all. */
    for (int pass = 0; pass < 3 && rc != CM_OK; pass++) {
        if (pass == 1 && wait_ms)
            continue;
        for (size_t i = 0; i < n && rc != CM_OK && !g_interrupts; i++) {
            if (!p[i].st[0] || p[i].step < min_step - 1 || p[i].t_ms < now - 30000 ||
                !memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN))
                continue;
            char maj[COLLAB_HASH_HEX + 1];
            majority_hash(p, n, p[i].pstep, now, maj);
            int agrees = !strcmp(maj, p[i].hash);
            int holds = p[i].hash[0] && p[i].pstep >= min_step;
            if ((pass == 0 && !(holds && agrees)) || (pass == 1 && !agrees) ||
                (pass == 2 && wait_ms && holds && agrees))
                continue;
            int64_t left = wait_ms ? (int64_t)wait_ms - (now_ms() - now) : 0;
            if (wait_ms && !holds && left <= 0)
                break;
            char dest[4400], err[512];
            int64_t got = -1;
            snprintf(dest, sizeof dest, "%s/latest.ckpt", s->rundir);
            uint32_t wait = p[i].step >= min_step ? 20000 : 90000;
            /* a peer holds the parameters of its pstep when it publishes
               their hash (one whose round averages ahead of its parameters
               publishes none, see publish_progress): it has them ready
               within wait_ms, or it does not say the truth */
            if (wait_ms)
                wait = holds ? wait_ms : (uint32_t)left;
            rc = peer_net_state_fetch(s->net, p[i].st, p[i].pub, min_step, dest, &got,
                                      p[i].step >= min_step ? 20000 : 90000, wait, serve_own_state, s);
            if (rc == CM_ECANCELED)
                break;
            if (rc != CM_OK) {
                fprintf(stderr, "\nwarning: fetching the state of peer at %s: %s\n", p[i].st,
                        cm_strerror(rc));
                continue;
            }
            int resumed = 0;
            if ((rc = agent_trainer_resume(&s->tr, &resumed, err, sizeof err)) != CM_OK) {
                fprintf(stderr, "\nwarning: loading a peer's state: %s\n", err);
                continue;
            }
            *step = (int64_t)s->tr.opt->step;
            update_hash(s, *step);
            s->syncs++;
            printf("\nfetched the state of step %lld from a peer (%s, hash %.16s)\n",
                   (long long)*step, p[i].st, s->hash);
            char line[256];
            snprintf(line, sizeof line, "{\"step\":%lld,\"hash\":\"%s\",\"synced\":true,\"t_ms\":%lld}",
                     (long long)*step, s->hash, (long long)now_ms());
            agent_steplog_write(s->steplog, line);
        }
    }
    free(p);
    return rc;
}

static int sync_from_peer(struct peer_state *s, int64_t min_step, int64_t *step, uint32_t wait_ms)
{
    link_busy(s, 1);
    int rc = sync_from_peer_inner(s, min_step, step, wait_ms);
    link_busy(s, -1);
    return rc;
}

/* Outcome agreement (docs/collaboration.md): every sender of the round
 * publishes which parts it committed; the parts every counted outcome has
 * are applied by everyone, the others are skipped (zero gradient) for this
 * step, so survivors stay bit-identical even when an aggregator died. */
#define OUTCOME_MARGIN_MS 300
/* 1 when the outcomes name another round id more often than ours (ties:
 * the smaller id wins): then our view of the round's members was not the
 * others', and our update would not be theirs. One vote per author. */
static int odd_round(const struct collab_outcome *o, size_t n, const uint8_t rid[16])
{
    size_t mine = 0, best = 0;
    const uint8_t *best_rid = NULL;
    for (size_t i = 0; i < n; i++) {
        int dup = 0;
        for (size_t k = 0; k < i && !dup; k++)
            dup = !memcmp(o[k].pub, o[i].pub, CM_ED25519_PUB_LEN);
        if (dup)
            continue;
        size_t c = 0;
        for (size_t k = 0; k < n; k++) {
            int first = 1;
            for (size_t q = 0; q < k && first; q++)
                first = memcmp(o[q].pub, o[k].pub, CM_ED25519_PUB_LEN) != 0;
            c += first && !memcmp(o[k].rid, o[i].rid, 16);
        }
        if (!memcmp(o[i].rid, rid, 16))
            mine = c;
        else if (c > best || (c == best && best_rid && memcmp(o[i].rid, best_rid, 16) < 0)) {
            best = c;
            best_rid = o[i].rid;
        }
    }
    return best_rid && (best > mine || (best == mine && memcmp(best_rid, rid, 16) < 0));
}

static uint64_t agree_outcome(struct peer_state *s, int64_t step, const uint8_t rid[AR_ROUND_ID_LEN],
                              uint64_t my_mask, const struct ar_member *am, size_t nmem,
                              uint32_t window_ms, size_t *counted, int *odd)
{
    char key[160], rec[COLLAB_RECORD_MAX];
    snprintf(key, sizeof key, "%s/outcome/%lld", s->o.run, (long long)step);
    struct collab_outcome me = {0};
    memcpy(me.pub, s->key.pub, CM_ED25519_PUB_LEN);
    memcpy(me.rid, rid, sizeof me.rid);
    me.mask = my_mask;
    me.t_ms = now_ms();
    uint8_t senders[AR_MAX_MEMBERS][CM_ED25519_PUB_LEN];
    size_t ns = 0;
    for (size_t i = 0; i < nmem; i++)
        if (am[i].sends)
            memcpy(senders[ns++], am[i].pub, CM_ED25519_PUB_LEN);
    if (collab_outcome_encode(&me, rec, sizeof rec) != CM_OK ||
        peer_net_put(s->net, key, rec, strlen(rec), 120000) != CM_OK)
        fprintf(stderr, "\nwarning: step %lld: could not publish the round's outcome\n", (long long)step);
    int64_t give_up = me.t_ms + window_ms + 4 * OUTCOME_MARGIN_MS + 5000;
    uint64_t mask = my_mask;
    *counted = 0;
    for (;;) {
        struct peer_record *r = NULL;
        size_t nr = 0;
        struct collab_outcome *o = NULL;
        size_t no = 0;
        if (peer_net_get(s->net, key, &r, &nr) == CM_OK && (o = calloc(nr + 1, sizeof *o))) {
            for (size_t i = 0; i < nr; i++)
                if (collab_outcome_parse(r[i].value, r[i].len, &o[no]) == CM_OK) {
                    memcpy(o[no].pub, r[i].author, CM_ED25519_PUB_LEN);
                    no++;
                }
            o[no++] = me; /* our own, even before the DHT shows it */
        }
        peer_records_free(r, nr);
        int decided = 0;
        uint64_t m = my_mask;
        size_t c = o ? collab_outcome_final(o, no, rid, (const uint8_t(*)[CM_ED25519_PUB_LEN])senders,
                                            ns, window_ms, OUTCOME_MARGIN_MS, now_ms(),
                                            &m, &decided)
                     : 0;
        int is_odd = o ? odd_round(o, no, rid) : 0;
        free(o);
        if (decided || now_ms() > give_up) {
            *odd = is_odd;
            if (!decided)
                fprintf(stderr, "\nwarning: step %lld: no agreement on the round's outcome; using ours\n",
                        (long long)step);
            else
                mask = m;
            *counted = c;
            break;
        }
        usleep(20000);
    }
    return mask;
}

/* One averaging round: what the accumulation hands over and what comes
 * back. With --delayed-updates it runs on its own thread while the next
 * accumulation goes on (seed 000 §3.2, "delayed parameter updates"). */
struct round_job {
    struct peer_state *s;
    int64_t step;       /* the round's step (parameters' step before it) */
    int pull_only;      /* sends nothing, takes the average (s->pull_only at its start) */
    float *accum;       /* mean gradient in, averaged gradient out (n floats) */
    double samples, loss_sum, loss_n, compute_s, sps;
    /* results */
    int rc;             /* CM_OK; CM_EBUSY: announced too late; CM_ESTATE: no usable round */
    int missed;         /* the others agreed on parts we lack: fetch their state */
    int alone;          /* declined: a minority of the peers (see run_round_timed) */
    int unshared;       /* no other sender's gradient reached us: not stepping */
    size_t others;      /* other peers accumulating for the step when it started */
    size_t present;     /* other compute peers with fresh progress, any step */
    size_t senders;     /* senders in our window */
    uint64_t agreed;
    size_t n_parts, counted, nmem, me;
    struct collab_announce *mem;
    struct ar_member am[AR_MAX_MEMBERS];
    uint8_t rid[AR_ROUND_ID_LEN];
    struct peer_round_summary sum;
    int64_t sched_v;
    size_t group_rounds, group_size; /* rounds of group all-reduce (1: one group), our last group */
    size_t group_senders;            /* most senders in a group of ours */
    size_t group_last;               /* members of our group in the last round */
    double global, t_wait, t_round; /* seconds waited for it / it took (gather to outcome) */
    /* thread */
    pthread_t th;
    int threaded;
    volatile int done;
};

/* Group all-reduce (agent/dp/groups.h; seed 000 §3.2 and Appendix C):
 * the rounds of the layout one after the other, each in our group of that
 * round with its own round id ("g<round>.<group>"). The outcome is kept per
 * block of the gradient (DP_GROUP_BLOCKS equal blocks) rather than per
 * part, since every group cuts its own parts: a block is ours when every
 * round committed the parts over it. The members then agree on the blocks
 * as on parts in one round: a block any member lacks (an aggregator died)
 * is skipped by everyone (zero gradient), so the members stay identical. A
 * sender lost in a round is renormalized away inside its group, whose
 * members all get the same bits; the unit it sent for still carries its
 * announced weight into the next rounds. */
#define DP_GROUP_BLOCKS 64
static uint64_t run_groups(struct round_job *j, const struct dp_groups *G,
                           const struct ar_round_config *base)
{
    struct peer_state *s = j->s;
    size_t n = base->n, nb = n < DP_GROUP_BLOCKS ? n : DP_GROUP_BLOCKS;
    uint64_t blocks = nb >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << nb) - 1);
    uint64_t gone = 0; /* members (global index) an earlier round found unreachable */
    memset(&j->sum, 0, sizeof j->sum);
    size_t r = 0;
    for (; r < G->rounds && !g_interrupts; r++) {
        int grp = G->group[r][j->me];
        if (grp < 0)
            continue; /* our unit waits for the others' rounds */
        struct ar_member gm[AR_MAX_MEMBERS];
        int agg_ok[AR_MAX_MEMBERS];
        uint32_t glob[AR_MAX_MEMBERS];
        size_t ng = G->size[r][grp], me = ng, nsend = 0;
        for (size_t i = 0; i < j->nmem; i++) {
            if (G->group[r][i] != grp)
                continue;
            size_t k = (size_t)G->pos[r][i];
            gm[k] = j->am[i];
            /* a receiver; pull-only and aggregate-only members keep their role */
            gm[k].sends = G->sends[r][i]                  ? AR_SENDS_FULL
                          : j->am[i].sends == AR_SENDS_FULL ? AR_SENDS_PULL
                                                            : j->am[i].sends;
            agg_ok[k] = j->mem[i].agg && j->am[i].addr.ss_family != 0;
            nsend += G->sends[r][i] != 0;
            glob[k] = (uint32_t)i;
            if (i == j->me)
                me = k;
        }
        pthread_mutex_lock(&s->js_mu);
        if (!s->js || dp_sched_plan_version(s->js, j->sched_v, gm, agg_ok, ng) != CM_OK)
            for (size_t k = 0; k < ng; k++)
                gm[k].fraction = agg_ok[k] ? 1.0 : 0.0;
        pthread_mutex_unlock(&s->js_mu);
        char gid[48];
        snprintf(gid, sizeof gid, "g%zu.%d", r + 1, grp);
        struct ar_round_config rc = *base;
        rc.group_id = (const uint8_t *)gid;
        rc.group_id_len = strlen(gid);
        rc.members = gm;
        rc.n_members = ng;
        rc.my_index = me;
        rc.weight = G->sends[r][j->me] ? G->weight[r][j->me] : 0;
        /* a member whose earlier group lost a peer starts this round up to a
           stall per earlier round late: wait that long for it (it answers
           "busy"), not only a stall, or its partners give up on it just as
           it arrives */
        rc.start_wait_ms = base->stall_ms * (uint32_t)(r + 1);
        /* and serves its results at least as long (a receiver is not waited for) */
        rc.linger_ms = rc.start_wait_ms > 10000 ? rc.start_wait_ms : 10000;
        /* and an aggregator that did not answer us in an earlier round is
           not waited for again (its part fails at once) */
        rc.gone = 0;
        for (size_t k = 0; k < ng; k++)
            if (gone >> glob[k] & 1)
                rc.gone |= (uint64_t)1 << k;
        struct peer_round_summary sum;
        memset(&sum, 0, sizeof sum);
        uint8_t grid[AR_ROUND_ID_LEN] = {0};
        if (cm_log_enabled(CM_LOG_DEBUG)) /* a SHA-256 per round only for the log line */
            ar_round_id(&rc, grid);
        CM_LOGD("join", "step %lld: group round %s (round %02x%02x%02x%02x): member %zu of %zu "
                        "(%zu senders, %s)%s",
                (long long)j->step, gid, grid[0], grid[1], grid[2], grid[3], me, ng, nsend,
                G->sends[r][j->me] ? "sending" : "receiving",
                rc.gone ? ", skipping members found gone" : "");
        int rc_ar = peer_net_allreduce(s->net, &rc, &sum);
        if (rc_ar != CM_OK && sum.n_parts == 0)
            blocks = 0; /* nothing committed, nothing known */
        for (size_t k = 0; k < sum.n_parts && k < AR_MAX_MEMBERS; k++) {
            if ((sum.averaged_mask >> k & 1) || sum.part_len[k] == 0)
                continue;
            int st = sum.part_status[k];
            if ((st == CM_ETIMEOUT || st == CM_ECONN || st == CM_ECLOSED) &&
                sum.part_owner[k] < ng && sum.part_owner[k] != me)
                gone |= (uint64_t)1 << glob[sum.part_owner[k]];
            size_t lo = sum.part_off[k], hi = sum.part_off[k] + sum.part_len[k];
            for (size_t b = 0; b < nb; b++) /* the blocks that overlap the part */
                if (b * n / nb < hi && (b + 1) * n / nb > lo)
                    blocks &= ~((uint64_t)1 << b);
        }
        for (size_t i = 0; i < sum.n_excluded && j->sum.n_excluded < AR_MAX_MEMBERS; i++)
            if (sum.excluded[i] < ng) {
                j->sum.excluded[j->sum.n_excluded] = glob[sum.excluded[i]];
                j->sum.excluded_reason[j->sum.n_excluded++] = sum.excluded_reason[i];
            }
        j->sum.ms_total += sum.ms_total;
        j->sum.bytes_sent += sum.bytes_sent;
        j->sum.bytes_received += sum.bytes_received;
        if (r == 0)
            j->group_size = ng;
        j->group_last = ng;
        if (nsend > j->group_senders)
            j->group_senders = nsend;
    }
    if (r < G->rounds)
        blocks = 0; /* interrupted (Ctrl-C): our buffer is half averaged */
    j->sum.n_parts = nb;
    for (size_t b = 0; b < nb; b++) {
        j->sum.part_off[b] = b * n / nb;
        j->sum.part_len[b] = (b + 1) * n / nb - b * n / nb;
    }
    j->sum.averaged_mask = blocks;
    return blocks;
}

/* Gather, plan, average and agree on the outcome; leaves in j->accum the
 * gradient every member applies (parts not agreed zeroed). */
static void run_round_timed(struct round_job *j);
static void run_round(struct round_job *j)
{
    double t0 = mono_s();
    link_busy(j->s, 1);
    run_round_timed(j);
    link_busy(j->s, -1);
    j->t_round = mono_s() - t0;
}

static void run_round_timed(struct round_job *j)
{
    struct peer_state *s = j->s;
    size_t n = s->tr.model->nparams;
    j->rc = gather(s, j->step, j->samples, j->pull_only, &j->mem, &j->nmem);
    if (j->rc != CM_OK)
        return;
    size_t senders = 0;
    for (size_t i = 0; i < j->nmem; i++)
        senders += j->mem[i].sends;
    j->senders = senders;
    if (!s->o.aggregate_only && !j->pull_only &&
        (2 * senders <= j->others + 1 || (senders == 1 && (j->present > 0 || s->finished_at > 0)))) {
        /* Our window holds no majority of the peers accumulating for this
           step (their announcements had not reached us, or ours not them),
           or we would step alone while other peers are about (catching up:
           a peer stepping alone meanwhile would keep them chasing it), or
           the collaboration already finished the run: stepping would split
           the collaboration. Go
           back to accumulating; their round, or the next window, takes
           us in, or the behind check finds them a step ahead. */
        j->alone = 1;
        return;
    }
    if (j->nmem > AR_MAX_MEMBERS)
        j->nmem = AR_MAX_MEMBERS; /* larger collaborations need groups from the schedule */
    struct ar_member *am = j->am;
    size_t naggs = 0;
    j->me = j->nmem;
    memset(am, 0, sizeof j->am);
    for (size_t i = 0; i < j->nmem; i++) {
        const struct collab_announce *mi = &j->mem[i];
        memcpy(am[i].pub, mi->pub, CM_ED25519_PUB_LEN);
        am[i].sends = mi->sends ? AR_SENDS_FULL : mi->pull_only ? AR_SENDS_PULL : AR_SENDS_NONE;
        am[i].fraction = mi->agg ? 1.0 : 0.0;
        if (mi->agg && p2p_addr_parse(mi->addr, &am[i].addr) != CM_OK)
            am[i].fraction = 0;
        naggs += am[i].fraction > 0;
        j->global += mi->sends ? mi->weight : 0;
        if (!memcmp(mi->pub, s->key.pub, CM_ED25519_PUB_LEN))
            j->me = i;
    }
    if (naggs) {
        pthread_mutex_lock(&s->js_mu);
        j->sched_v = plan_round(s, j->mem, am, j->nmem);
        pthread_mutex_unlock(&s->js_mu);
    }
    if (j->me == j->nmem || naggs == 0) {
        fprintf(stderr, "\nwarning: step %lld: no usable round (%zu members, %zu aggregators)\n",
                (long long)j->step, j->nmem, naggs);
        j->rc = CM_ESTATE;
        return;
    }
    float *accum = j->accum;
    if (j->samples > 0)
        for (size_t i = 0; i < n; i++)
            accum[i] /= (float)j->samples;
    if (s->corrupt && j->samples > 0) /* test hook: behave like a broken or malicious peer */
        for (size_t i = 0; i < n; i += 97)
            accum[i] = s->corrupt == 1 ? NAN : 1e30f;
    struct ar_round_config rcfg = {0};
    rcfg.step = (uint64_t)j->step;
    rcfg.group_id = (const uint8_t *)"all";
    rcfg.group_id_len = 3;
    rcfg.members = am;
    rcfg.n_members = j->nmem;
    rcfg.my_index = j->me;
    rcfg.buf = s->o.aggregate_only ? NULL : accum; /* pull-only: zeros in, the average out */
    rcfg.n = n;
    rcfg.weight = s->o.aggregate_only || j->pull_only ? 0 : j->samples;
    rcfg.comp = s->comp;
    rcfg.deadline_ms = (uint32_t)s->o.round_timeout_ms;
    /* generous: on a loaded machine a slow peer must not be mistaken for a
       dead one (the outcome agreement then skips its part for everyone) */
    rcfg.stall_ms = (uint32_t)s->o.stall_ms;
    /* averages straight into accum, no staging copy of the gradient: a part
       not averaged is zeroed below (or its blocks skipped) whatever it holds */
    rcfg.in_place = 1;
    uint32_t owner[AR_MAX_MEMBERS];
    size_t poff[AR_MAX_MEMBERS], plen[AR_MAX_MEMBERS];
    if (ar_round_id(&rcfg, j->rid) != CM_OK ||
        ar_partition(am, j->nmem, n, AR_ALIGN, &j->n_parts, owner, poff, plen) != CM_OK) {
        j->rc = CM_EINTERNAL;
        return;
    }
    /* the schedule's group size (Appendix C): groups of m when it is below
       the members (the round id above, over all members, names the step's
       outcome; each group round has its own) */
    j->group_rounds = 1;
    j->group_size = j->nmem;
    j->group_senders = j->senders;
    j->group_last = j->nmem;
    pthread_mutex_lock(&s->js_mu);
    unsigned gm = j->sched_v > 0 && s->js ? dp_sched_group_size(s->js, j->sched_v) : 0;
    pthread_mutex_unlock(&s->js_mu);
    struct dp_groups *G = gm >= 2 && gm < j->nmem ? malloc(sizeof *G) : NULL;
    if (G) {
        int gs[AR_MAX_MEMBERS], ga[AR_MAX_MEMBERS];
        double gw[AR_MAX_MEMBERS];
        for (size_t i = 0; i < j->nmem; i++) {
            gs[i] = am[i].sends == AR_SENDS_FULL;
            ga[i] = am[i].addr.ss_family != 0;
            gw[i] = j->mem[i].weight;
        }
        if (dp_groups_plan(j->nmem, gs, ga, gw, gm, G) != CM_OK || G->rounds < 2) {
            free(G);
            G = NULL;
        }
    }
    if (G) {
        /* the step's round id says "grouped, m": members that planned one
           all-reduce (or another m) see an odd round, not a mix of part and
           block masks */
        char sgid[32];
        snprintf(sgid, sizeof sgid, "groups/m%u", gm);
        struct ar_round_config idc = rcfg;
        idc.group_id = (const uint8_t *)sgid;
        idc.group_id_len = strlen(sgid);
        if (ar_round_id(&idc, j->rid) != CM_OK) {
            free(G);
            j->rc = CM_EINTERNAL;
            return;
        }
        j->group_rounds = G->rounds;
        j->group_senders = 0;
        run_groups(j, G, &rcfg);
        free(G);
        j->n_parts = j->sum.n_parts;
        memcpy(poff, j->sum.part_off, j->n_parts * sizeof *poff);
        memcpy(plen, j->sum.part_len, j->n_parts * sizeof *plen);
    } else {
        int rc = peer_net_allreduce(s->net, &rcfg, &j->sum);
        if (rc != CM_OK && j->sum.n_parts == 0)
            j->sum.averaged_mask = 0;
    }
    /* one entry per excluded peer (each aggregator of a part reports it) */
    size_t ne = 0;
    for (size_t i = 0; i < j->sum.n_excluded; i++) {
        size_t k = 0;
        while (k < ne && j->sum.excluded[k] != j->sum.excluded[i])
            k++;
        if (k == ne) {
            j->sum.excluded[ne] = j->sum.excluded[i];
            j->sum.excluded_reason[ne++] = j->sum.excluded_reason[i];
        }
    }
    j->sum.n_excluded = ne;
    for (size_t i = 0; i < j->sum.n_excluded; i++) {
        char pk[64];
        cm_b64url_encode(am[j->sum.excluded[i]].pub, CM_ED25519_PUB_LEN, pk);
        fprintf(stderr, "\nwarning: step %lld: peer %s excluded from the round (%s)\n",
                (long long)j->step, pk, ar_excl_reason_name(j->sum.excluded_reason[i]));
    }
    uint64_t all = j->n_parts >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << j->n_parts) - 1);
    uint64_t mine = j->sum.averaged_mask & all;
    j->agreed = mine;
    if (!s->o.aggregate_only && !j->pull_only && j->group_rounds == 1 && j->senders > 1 &&
        j->sum.n_averaged > 0 && j->sum.n_excluded == 0 && j->sum.weight <= j->samples + 0.5) {
        /* Every part we hold averaged only our own gradient: the other
           senders never sent (they declined the round: each member
           decides from its own view of the peers accumulating for the
           step, so one may decline a round another goes on with; or they
           left; a sender excluded for bad data did send). A step with it
           would be a step alone, apart from them.
           Decided before the outcome agreement, so no outcome of ours
           names this round when the step is averaged again. */
        j->unshared = 1;
        return;
    }
    if (!s->o.aggregate_only) {
        int odd = 0;
        /* group rounds: members may finish a stall apart per round after
           the first (a member whose group lost a peer waited for it) */
        uint32_t window = (uint32_t)s->o.outcome_window_ms +
                          (uint32_t)(j->group_rounds - 1) * (uint32_t)s->o.stall_ms;
        j->agreed = agree_outcome(s, j->step, j->rid, mine, am, j->nmem, window, &j->counted, &odd) &
                    all;
        if (odd) {
            fprintf(stderr, "\nwarning: step %lld: the other peers averaged a round with other members "
                            "than we saw; fetching their state\n", (long long)j->step);
            j->missed = 1;
            return;
        }
    }
    if (j->agreed != all && !s->o.aggregate_only) /* an aggregate-only peer holds only its part */
        fprintf(stderr, "\nwarning: step %lld: %d of %zu parts averaged by every member; the others "
                        "are skipped this step\n",
                (long long)j->step, __builtin_popcountll(j->agreed), j->n_parts);
    if (j->pull_only && (j->agreed == 0 || j->counted < 2)) {
        /* A pull-only peer has no gradient of its own: a round that averaged
           nothing, or that no other member reported, is not the round the
           computing peers stepped with (our window saw them, theirs had
           closed without us), and a zero update would split us from them.
           Take their state after the step instead. */
        fprintf(stderr, "\nwarning: step %lld: our pull-only round averaged %s; fetching the "
                        "others' state\n", (long long)j->step,
                j->agreed == 0 ? "nothing" : "with no other member reporting");
        j->missed = 1;
        return;
    }
    if (!s->o.aggregate_only && (j->agreed & ~mine)) {
        /* the others averaged a part we could not get: our update would
           differ from theirs, so take their state after the step instead */
        fprintf(stderr, "\nwarning: step %lld: we missed parts the others averaged; fetching their state\n",
                (long long)j->step);
        j->missed = 1;
        return;
    }
    for (size_t k = 0; k < j->n_parts; k++)
        if (!(j->agreed >> k & 1) && !s->o.aggregate_only)
            memset(accum + poff[k], 0, plen[k] * sizeof *accum);
    j->rc = CM_OK;
}

static void *round_thread(void *arg)
{
    struct round_job *j = arg;
    run_round(j);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int round_done(struct round_job *j)
{
    return __atomic_load_n(&j->done, __ATOMIC_ACQUIRE);
}

/* Fetches the state after `step` from a peer (the round went on without
 * us), falling back to the coordinator's newest checkpoint. */
#define JOIN_AHEAD_WAIT_MS 5000 /* for the state of a round that should be done already, plus
                                   three micro-batches (sync_from_peer's wait_ms) */
#define RESYNC_GIVE_UP_S 20.0
static int64_t resync_after(struct peer_state *s, int64_t step)
{
    int64_t got = step;
    /* Peers that applied the step hold its state at once; peers still
       finishing the round get a few seconds. A round nobody applied (all
       its members missed parts) leaves nobody to produce the state: every
       member used to wait for it from every other, 90 s each. After
       RESYNC_GIVE_UP_S we go back to our own step, and the behind check
       finds the others if they went on after all. */
    double wait = JOIN_AHEAD_WAIT_MS + 3000 * s->mb_time, t0 = mono_s();
    if (wait > 90000)
        wait = 90000;
    for (int tries = 0; tries < 60 && !g_interrupts; tries++) {
        /* this can take a while: the pass must stay valid meanwhile, or
           every peer refuses our requests as "expired token" */
        renew_pass_if_due(s);
        if (sync_from_peer(s, step + 1, &got, (uint32_t)wait) == CM_OK && got > step)
            return got;
        if (catch_up(s, step + 1, &got) == CM_OK && got > step) {
            update_hash(s, got);
            return got;
        }
        if (mono_s() - t0 > RESYNC_GIVE_UP_S) {
            fprintf(stderr, "\nwarning: step %lld: no peer went past the step in %.0f s; going on from "
                            "our own state\n", (long long)step, RESYNC_GIVE_UP_S);
            break;
        }
        sleep(1);
    }
    /* none came: our parameters are where the optimizer left them (on the
       join-ahead path a step before the round's) */
    return s->o.aggregate_only ? got : (int64_t)s->tr.opt->step;
}

/* Applies a finished round: the optimizer step, the hash, the step log, the
 * contribution report, the checkpoint. Returns CM_OK and moves *step, or a
 * fatal error. */
static int finish_round(struct peer_state *s, struct round_job *j, int64_t *step, double *last_loss)
{
    struct kern_model *m = s->tr.model;
    size_t n = m->nparams;
    if (j->threaded) {
        double t0 = mono_s();
        pthread_join(j->th, NULL);
        j->t_wait = mono_s() - t0;
        j->threaded = 0;
    }
    CM_LOGD("join", "round %lld done: rc %d missed %d alone %d unshared %d members %zu senders %zu others %zu "
                    "present %zu, params at %lld, waited %.3f s, took %.3f s",
            (long long)j->step, j->rc, j->missed, j->alone, j->unshared, j->nmem, j->senders, j->others, j->present,
            (long long)*step, j->t_wait, j->t_round);
    if (j->rc == CM_EBUSY || j->missed) {
        if (j->rc == CM_EBUSY)
            printf("\nstep %lld: announced after the round closed; catching up\n", (long long)j->step);
        *step = resync_after(s, j->step);
        return CM_OK;
    }
    if (j->rc == CM_ESTATE) {
        sleep(1);
        return CM_OK;
    }
    if (j->alone) {
        fprintf(stderr, "\nwarning: step %lld: our round had %zu sender%s while %zu other peer%s "
                        "accumulated for the step (%zu about); not stepping without them\n",
                (long long)j->step, j->senders, j->senders == 1 ? "" : "s", j->others,
                j->others == 1 ? "" : "s", j->present);
        usleep(200000);
        return CM_OK;
    }
    if (j->unshared) {
        fprintf(stderr, "\nwarning: step %lld: our round (%zu senders) averaged our gradient alone (the "
                        "others declined it or left); not stepping\n",
                (long long)j->step, j->senders);
        return CM_OK;
    }
    if (j->rc != CM_OK)
        return j->rc;
    if (!s->o.aggregate_only && *step > j->step)
        return CM_OK; /* a state fetched meanwhile already holds this round's update */
    int rc;
    if (!s->o.aggregate_only && *step < j->step) {
        /* We joined this round while our parameters were a step behind it
           (a collaboration with delayed updates: see the catch-up below).
           Its average applies to the parameters of its step: take them from
           a peer; if the peer already applied this round, its state holds
           the very same update. */
        int64_t got = *step;
        /* peers publish a wanted state between micro-batches: give them a
           few of ours (plus the save) on top of the base wait */
        double wait = JOIN_AHEAD_WAIT_MS + 3000 * s->mb_time;
        if (wait > 90000)
            wait = 90000;
        if (sync_from_peer(s, j->step, &got, (uint32_t)wait) != CM_OK || got < j->step) {
            /* Nobody holds those parameters: the round in flight we bet on
               was not applied (its members declined it), and every peer
               that bet with us waits for the same missing state. Drop this
               round; the caller goes back to our own step (join_bet_check)
               and the behind check finds the others if they went on. */
            fprintf(stderr, "\nwarning: step %lld: no peer has the parameters of step %lld that this "
                            "round applies to; dropping it\n", (long long)j->step, (long long)j->step);
            return CM_OK;
        }
        *step = got;
        if (got > j->step)
            return CM_OK; /* the state already includes this round's update */
    }
    if (!s->o.aggregate_only) {
        float gnorm = 0, lr = 0;
        if ((rc = m->be->upload(m->grads, j->accum, n * sizeof *j->accum)) != CM_OK ||
            (rc = agent_trainer_apply(&s->tr, &gnorm, &lr)) != CM_OK)
            return rc;
    } else {
        s->tr.opt->step++; /* the aggregate-only peer follows the step count */
    }
    s->n_prev = 0;
    for (size_t i = 0; i < j->nmem && s->n_prev < AR_MAX_MEMBERS; i++)
        if (j->mem[i].sends)
            memcpy(s->prev[s->n_prev++], j->mem[i].pub, CM_ED25519_PUB_LEN);
    double loss = j->loss_n ? j->loss_sum / j->loss_n : NAN;
    report_round(s, j->step, j->rid, j->samples, j->compute_s, loss, j->sps, &j->sum, j->n_parts,
                 j->agreed, j->mem, j->am, j->nmem);
    *step = j->step + 1;
    update_hash(s, *step);
    if (j->loss_n)
        *last_loss = loss;
    if (s->steplog && !s->o.aggregate_only) {
        char line[1024], ridhex[17], ls[32];
        cm_hex_encode(j->rid, 8, ridhex);
        if (isfinite(loss))
            snprintf(ls, sizeof ls, "%.6f", loss);
        else
            snprintf(ls, sizeof ls, "null");
        snprintf(line, sizeof line,
                 "{\"step\":%lld,\"hash\":\"%s\",\"loss\":%s,\"samples\":%.0f,\"global_samples\":%.0f,"
                 "\"members\":%zu,\"parts\":%zu,\"agreed\":%d,\"outcomes\":%zu,\"round\":\"%s\","
                 "\"round_ms\":%.1f,\"round_s\":%.3f,\"compute_s\":%.3f,\"wait_s\":%.3f,\"sched_version\":%lld,"
                 "\"group_rounds\":%zu,\"group_size\":%zu,\"group_senders\":%zu,\"group_last\":%zu,"
                 "\"t_ms\":%lld}",
                 (long long)*step, s->hash, ls, j->samples, j->global, j->nmem, j->n_parts,
                 __builtin_popcountll(j->agreed), j->counted, ridhex, j->sum.ms_total, j->t_round,
                 j->compute_s, j->t_wait, (long long)j->sched_v, j->group_rounds, j->group_size,
                 j->group_senders, j->group_last, (long long)now_ms());
        agent_steplog_write(s->steplog, line);
    }
    /* every K steps, and the run's final state (for peers that finish
       late: the others may be gone by then) */
    if ((*step % s->ckpt_every == 0 || *step == s->steps) && !s->o.aggregate_only &&
        collab_checkpoint_uploader(j->mem, j->nmem, *step) == j->me)
        upload_checkpoint(s, *step);
    return CM_OK;
}

/* Whether this peer takes the next step pull-only: the newest schedule
 * lists it with compute = false (seed 000 §3.2: the LP's c_i = 0 for a peer
 * whose sending would slow the averaging more than its samples help). It
 * then computes nothing, joins the round with sends = AR_SENDS_PULL, takes
 * the average and applies the step like everyone, so it stays identical and
 * can compute again when a schedule says so. Not while PULL_ONLY_OFF_S runs
 * after no computing peer was seen (the others may be gone and the
 * schedule not re-solved yet): then it computes. */
#define PULL_ONLY_IDLE_S 15.0 /* no computing peer active for this long: compute */
#define PULL_ONLY_OFF_S 120.0
static int start_step_role(struct peer_state *s)
{
    if (s->o.aggregate_only || !s->js || mono_s() < s->pull_only_off_until)
        return 0;
    int compute = 1;
    pthread_mutex_lock(&s->js_mu);
    dp_sched_role(s->js, s->key.pub, !s->o.client_mode, &compute, NULL);
    pthread_mutex_unlock(&s->js_mu);
    if (!compute && !s->pull_only)
        printf("\nthe schedule has this peer average without computing (pull-only)\n");
    else if (compute && s->pull_only)
        printf("\nthe schedule has this peer compute again\n");
    return !compute;
}

static void job_reset(struct round_job *j)
{
    free(j->mem);
    float *keep = j->accum;
    struct peer_state *s = j->s;
    memset(j, 0, sizeof *j);
    j->accum = keep;
    j->s = s;
}

/* Peers accumulating for a step: fresh progress (ACTIVE_MS) with samples
 * or a pledge, compute peers only, ourselves excluded. */
#define ACTIVE_MS 5000
/* How long a peer left behind by a finished collaboration keeps trying to
   fetch the final state from the peers before it turns to the coordinator. */
#define FINISHED_WAIT_S 60.0
static size_t others_active(const struct peer_state *s, const struct collab_progress *p, size_t n,
                            int64_t step, int64_t now)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += p[i].step == step && !p[i].aux && p[i].t_ms >= now - ACTIVE_MS &&
             (p[i].samples > 0 || p[i].pledged > 0) && memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN);
    return c;
}

/* Other compute peers with progress in the last PRESENT_MS, at any step. */
#define PRESENT_MS 10000
static size_t others_present(const struct peer_state *s, const struct collab_progress *p, size_t n,
                             int64_t now)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += !p[i].aux && p[i].t_ms >= now - PRESENT_MS && memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN);
    return c;
}

/* Compute peers whose fresh progress shows a step after `step`: *pending
 * those one step ahead whose parameters are still at `step` (delayed
 * updates, seed 000 §3.2: they announced for the round of our step and
 * accumulate for the next one while it averages; a round of a minority is
 * declined and they come back), *firm the others (they applied our step's
 * round). Returns both together. */
static size_t peers_ahead(const struct collab_progress *p, size_t n, int64_t step, int64_t now,
                          size_t *firm, size_t *pending)
{
    *firm = *pending = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].step <= step || p[i].aux || p[i].t_ms < now - 30000)
            continue;
        if (p[i].step == step + 1 && p[i].pstep == step)
            (*pending)++;
        else
            (*firm)++;
    }
    return *firm + *pending;
}

/* The odd one out ahead: more peers accumulate for one earlier step than
 * for ours (ourselves counted), none of them a member of our last round
 * (those are finishing it). Then we stepped without the collaboration (a
 * round of our own) and must take its state. Returns that step's peer
 * count (0: not so) and the step in *low. */
static size_t majority_below(const struct peer_state *s, const struct collab_progress *p, size_t n,
                             int64_t step, size_t at_step, int64_t now, int64_t *low)
{
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].step >= step || p[i].aux || p[i].t_ms < now - ACTIVE_MS)
            continue;
        size_t c = others_active(s, p, n, p[i].step, now);
        if (c > best) {
            best = c;
            *low = p[i].step;
        }
    }
    if (best <= at_step)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p[i].step == *low && p[i].t_ms >= now - ACTIVE_MS)
            for (size_t k = 0; k < s->n_prev; k++)
                if (!memcmp(s->prev[k], p[i].pub, CM_ED25519_PUB_LEN))
                    return 0;
    return best;
}

/* Delayed updates (seed 000 §3.2): at least half of the present compute
 * peers (fresh progress in the last PRESENT_MS, at any step, ourselves
 * counted) accumulate for a step before `step`. Then starting our round
 * would run ahead of the collaboration rather than with it. */
#define JOIN_HOLD_S 10.0     /* the bucket of waits for the peers behind (collab_hold)... */
#define JOIN_HOLD_REFILL 0.1 /* ...refilled at this many seconds per second not waiting */
static int majority_behind(const struct peer_state *s, const struct collab_progress *p, size_t n,
                           int64_t step, int64_t now)
{
    size_t total = 1, below = 0;
    for (size_t i = 0; i < n; i++)
        if (!p[i].aux && p[i].t_ms >= now - PRESENT_MS && memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN)) {
            total++;
            below += p[i].step < step;
        }
    return below > 0 && 2 * below >= total;
}

/* The announcements of the round of `step` in the DHT (authors' keys in
 * .pub), made no later than until_ms, ours left out when others_only; room
 * for `extra` more entries. NULL (*na 0) when there are none. */
static struct collab_announce *read_announces(struct peer_state *s, int64_t step, int others_only,
                                              int64_t until_ms, size_t extra, size_t *na)
{
    char key[160];
    snprintf(key, sizeof key, "%s/round/%lld", s->o.run, (long long)step);
    struct peer_record *r = NULL;
    size_t nr = 0;
    *na = 0;
    if (peer_net_get(s->net, key, &r, &nr) != CM_OK || nr == 0) {
        peer_records_free(r, nr);
        return NULL;
    }
    struct collab_announce *a = calloc(nr + extra, sizeof *a);
    for (size_t i = 0; a && i < nr; i++)
        if (!(others_only && !memcmp(r[i].author, s->key.pub, CM_ED25519_PUB_LEN)) &&
            collab_announce_parse(r[i].value, r[i].len, &a[*na]) == CM_OK && a[*na].t_ms <= until_ms)
            memcpy(a[(*na)++].pub, r[i].author, CM_ED25519_PUB_LEN);
    peer_records_free(r, nr);
    return a;
}

/* 1 when the round of `step` goes on (collab_round_going: a closed window
 * of its announcements holds more than half of the peers on that step as
 * senders, what its members need not to decline it in run_round_timed).
 * The peers on it: fresh compute peers accumulating for it, or a step past
 * it with their parameters still at it (they announced). */
static int round_going(struct peer_state *s, const struct collab_progress *p, size_t n, int64_t step,
                       int64_t now)
{
    size_t on = 0;
    for (size_t i = 0; i < n; i++)
        on += !p[i].aux && p[i].t_ms >= now - ACTIVE_MS &&
              (p[i].step == step || (p[i].step == step + 1 && p[i].pstep == step));
    size_t na = 0;
    struct collab_announce *a = read_announces(s, step, 0, INT64_MAX, 0, &na);
    int going = a && collab_round_going(a, na, s->o.round_window_ms, GATHER_MARGIN_MS, now, on);
    free(a);
    return going;
}

/* 1 when a fresh compute peer other than us, with a state host, holds
 * parameters of step `pstep` or later (it publishes their hash: its state
 * can be fetched now). */
static int pstep_held(const struct peer_state *s, const struct collab_progress *p, size_t n,
                      int64_t pstep)
{
    int64_t now = now_ms();
    for (size_t i = 0; i < n; i++)
        if (!p[i].aux && p[i].st[0] && p[i].hash[0] && p[i].pstep >= pstep && p[i].t_ms >= now - ACTIVE_MS &&
            memcmp(p[i].pub, s->key.pub, CM_ED25519_PUB_LEN))
            return 1;
    return 0;
}

/* 1 when another peer's announcement for the round of `step` opens a window
 * we can still make: we then join that round with what we have, so peers
 * whose views of the progress differ (records late over a slow link) do not
 * split into rounds of their own. */
static int round_open(struct peer_state *s, int64_t step)
{
    size_t na = 0;
    int64_t mine = now_ms() + 20; /* when our announcement would be made */
    struct collab_announce *a = read_announces(s, step, 1, mine, 1, &na);
    if (!a || na == 0) {
        free(a);
        return 0;
    }
    a[na].t_ms = mine;
    memcpy(a[na].pub, s->key.pub, CM_ED25519_PUB_LEN);
    na++;
    int64_t close = 0;
    size_t nm = collab_round_members(a, na, s->o.round_window_ms, mine, &close);
    free(a);
    return nm > 1;
}

/* After catching up with a round in flight we accumulate for the round
 * after it (join_step) on the parameters before it, betting that the round
 * in flight completes and its state can be fetched. When that round, or
 * ours for join_step, ends without our parameters reaching join_step (it
 * was declined for want of a majority, or went on without us), the bet
 * failed: nobody will produce that state, and waiting for it kept whole
 * collaborations fetching from each other (each wanting a step none had)
 * until their passes expired. Go back to accumulating for our own step. */
static void join_bet_check(const struct round_job *j, int64_t step, int64_t *join_step)
{
    if (*join_step > step && j->step + 1 >= *join_step) {
        printf("\nstep %lld: the round we joined ahead of our parameters (step %lld) did not bring "
               "them there; accumulating for our own step\n", (long long)j->step, (long long)step);
        *join_step = 0;
    }
}

static int train_loop(struct peer_state *s)
{
    struct kern_model *m = s->tr.model;
    size_t n = m->nparams;
    /* two rounds' buffers: one accumulating, one averaging (delayed updates) */
    struct round_job jobs[2];
    memset(jobs, 0, sizeof jobs);
    float *grad = malloc(n * sizeof *grad);
    jobs[0].accum = calloc(n, sizeof(float));
    jobs[1].accum = calloc(n, sizeof(float));
    jobs[0].s = jobs[1].s = s;
    struct round_job *inflight = NULL; /* the averaging round in progress (delayed updates) */
    int rc = CM_OK;
    if (!grad || !jobs[0].accum || !jobs[1].accum) {
        rc = CM_ENOMEM;
        goto out;
    }
    double sps = 0, last_loss = NAN, mb_time = 0;
    int64_t step = (int64_t)s->tr.opt->step;
    /* after catching up with a collaboration whose rounds run one step
       behind their accumulation (delayed updates), the round we accumulate
       for is ahead of our parameters */
    int64_t join_step = 0;
    int cur = 0;
    update_hash(s, step);
    while (!g_interrupts) {
        /* the round we accumulate for: the next one while one is averaging */
        int64_t acc_step = inflight ? inflight->step + 1 : step > join_step ? step : join_step;
        if (acc_step >= s->steps) {
            if (!inflight)
                break;
            if ((rc = finish_round(s, inflight, &step, &last_loss)) != CM_OK)
                goto out;
            join_bet_check(inflight, step, &join_step);
            job_reset(inflight);
            inflight = NULL;
            continue;
        }
        renew_pass_if_due(s);
        if (s->finished_at > 0 && !inflight && mono_s() - s->finished_at > FINISHED_WAIT_S) {
            /* The collaboration finished without us and no peer served
               its final state in time: the coordinator's final checkpoint,
               or an error (never the last steps alone). */
            int64_t got = step;
            if (catch_up(s, s->steps, &got) == CM_OK && got >= s->steps) {
                step = got;
                update_hash(s, step);
                break;
            }
            fprintf(stderr, "\nerror: the collaboration finished the run (step %lld) while we were at "
                            "step %lld, and neither a peer nor the coordinator could give us its final "
                            "state\n", (long long)s->steps, (long long)step);
            rc = CM_ESTATE;
            goto out;
        }
        if (!inflight) {
            pthread_mutex_lock(&s->js_mu);
            schedule_upkeep(s, sps);
            pthread_mutex_unlock(&s->js_mu);
        }
        serve_state_if_wanted(s, step);
        struct round_job *j = &jobs[cur];
        job_reset(j);
        j->step = acc_step;
        j->pull_only = s->pull_only = start_step_role(s);
        float *accum = j->accum;
        memset(accum, 0, n * sizeof *accum);
        double samples = 0, loss_sum = 0, loss_n = 0, compute_s = 0;
        struct collab_progress *seen = NULL;
        size_t nseen = 0;
        struct collab_view view = {0};
        int behind = 0, diverged = 0, restart = 0, held = 0, going = 0;
        int64_t low = -1;
        size_t ahead_now = 0, npresent = 1;
        int holding = 0; /* not starting our round: most peers are behind (majority_behind) */
        double hold_since = 0, t_pub = 0, lag_since = 0, t_open = 0, po_idle_since = 0, t_prefetch = 0;
        for (;;) {
            if (inflight && !s->o.aggregate_only && step < inflight->step && !round_done(inflight) &&
                mono_s() - t_prefetch > 0.5 && pstep_held(s, seen, nseen, inflight->step)) {
                /* We joined this round ahead of our parameters (we caught
                   up with a round in flight, see join_bet_check). Its
                   average applies to the parameters of its step, which the
                   others hold from the moment they applied the round
                   before: fetch them now, while the round averages, rather
                   than when it is done. Then it is fetched while the
                   others still accumulate; fetched afterwards, it came
                   when their next round had already gathered without us,
                   and we chased the collaboration's rounds forever. */
                t_prefetch = mono_s();
                int64_t got = step;
                if (sync_from_peer(s, inflight->step, &got, 1000) == CM_OK)
                    step = got;
            }
            if (inflight && round_done(inflight)) {
                /* the previous round is averaged: apply it under the
                   accumulation (one step of staleness for what came before) */
                int64_t expect = inflight->step + 1;
                if ((rc = finish_round(s, inflight, &step, &last_loss)) != CM_OK)
                    goto out;
                join_bet_check(inflight, step, &join_step);
                job_reset(inflight);
                inflight = NULL;
                if (step != expect) { /* resynced: what we accumulated is moot */
                    restart = 1;
                    break;
                }
            }
            if (!s->o.aggregate_only && !j->pull_only && hold_since == 0 && lag_since == 0 && !holding) {
                /* Pledge the micro-batch before computing it: the others
                   then start no micro-batch the target does not need (the
                   batch overshoots by about one micro-batch, not one per
                   peer); the round is triggered by samples done. */
                float w = (float)s->tcfg.micro_batch;
                publish_progress(s, acc_step, samples, sps, w);
                struct kern_eval ev;
                double t0 = mono_s();
                if ((rc = agent_trainer_compute_grads(&s->tr, &ev)) != CM_OK)
                    goto out;
                if ((rc = m->be->download(grad, m->grads, n * sizeof *grad)) != CM_OK)
                    goto out;
                for (size_t i = 0; i < n; i++)
                    accum[i] += w * grad[i];
                samples += w;
                loss_sum += ev.loss_sum;
                loss_n += (double)ev.count;
                double dt = mono_s() - t0;
                compute_s += dt;
                if (dt > 0) {
                    sps = sps > 0 ? 0.8 * sps + 0.2 * (w / dt) : w / dt;
                    mb_time = mb_time > 0 ? 0.8 * mb_time + 0.2 * dt : dt;
                    s->mb_time = mb_time;
                }
                publish_progress(s, acc_step, samples, sps, 0);
                t_pub = mono_s();
            } else {
                usleep(s->o.aggregate_only || j->pull_only ? 50000 : 5000);
                if (mono_s() - t_pub > 0.2) {
                    publish_progress(s, acc_step, samples, sps, 0);
                    t_pub = mono_s();
                }
            }
            if (g_interrupts)
                break;
            serve_state_if_wanted(s, step);
            free(seen);
            if (read_progress(s, &seen, &nseen) != CM_OK)
                continue;
            /* our own record may not be visible yet: count ourselves from memory */
            struct collab_progress self = {0};
            memcpy(self.pub, s->key.pub, CM_ED25519_PUB_LEN);
            int have_self = 0;
            for (size_t i = 0; i < nseen; i++)
                if (!memcmp(seen[i].pub, s->key.pub, CM_ED25519_PUB_LEN)) {
                    seen[i].samples = samples;
                    seen[i].pledged = 0;
                    seen[i].step = acc_step;
                    seen[i].pstep = step;
                    seen[i].t_ms = now_ms();
                    seen[i].hash[0] = 0;
                    if (s->hash_step == step)
                        snprintf(seen[i].hash, sizeof seen[i].hash, "%.*s", COLLAB_HASH_HEX, s->hash);
                    have_self = 1;
                }
            if (!have_self) {
                struct collab_progress *g = realloc(seen, (nseen + 1) * sizeof *seen);
                if (g) {
                    seen = g;
                    self.step = acc_step;
                    self.pstep = step;
                    self.samples = samples;
                    self.sps = sps;
                    self.t_ms = now_ms();
                    self.aux = s->o.aggregate_only || j->pull_only;
                    if (s->hash_step == step)
                        snprintf(self.hash, sizeof self.hash, "%.*s", COLLAB_HASH_HEX, s->hash);
                    seen[nseen++] = self;
                }
            }
            int64_t now = now_ms();
            collab_estimate(seen, nseen, acc_step, now, 30000, s->target, &view);
            if (view.max_step >= s->steps && s->finished_at == 0)
                s->finished_at = mono_s();
            print_line((long)acc_step, view.samples, s->target, sps, j->pull_only, view.peers,
                       loss_n ? loss_sum / loss_n : last_loss, view.eta_s);
            /* A round of our step gathering (its window still takes us):
               join it, whatever the progress records say. With delayed
               updates the peers that announced first already publish the
               next step; counting them as ahead sent the others catching
               up instead of into the round, which then had no majority. */
            int open = 0;
            int follower = s->o.aggregate_only || j->pull_only; /* joins without samples */
            if ((samples > 0 || follower) && mono_s() - t_open > 0.02) {
                open = round_open(s, acc_step);
                t_open = mono_s();
            }
            /* Behind: as many peers are ahead of us as accumulate for our
               step, ourselves counted (one peer that ran ahead alone is
               not the collaboration). Peers whose round of our step is in
               flight (pending) count only when someone is past it or they
               are more than we are: a tie's round is declined (2 senders
               of 4 peers) and they come back to our step. Ahead: see
               majority_below. */
            size_t firm = 0, pending = 0;
            ahead_now = peers_ahead(seen, nseen, acc_step, now, &firm, &pending);
            if (!open && view.max_step > acc_step && ahead_now >= view.at_step &&
                (firm > 0 || (pending > view.at_step && round_going(s, seen, nseen, acc_step, now)))) {
                /* A round averaging now (its parameters are the newest a
                   peer holds) is one to catch up with by joining the round
                   after it only when its window held a majority: peers
                   whose rounds were then declined also publish the next
                   step for a moment, and betting on such a round had
                   every peer wait for parameters nobody would have. */
                going = view.max_pstep >= 0 && view.max_pstep < view.max_step &&
                        round_going(s, seen, nseen, view.max_pstep, now);
                /* the parameters of the round in flight: we may hold them */
                char maj[COLLAB_HASH_HEX + 1];
                majority_hash(seen, nseen, step, now, maj);
                held = s->hash_step == step && maj[0] && !strncmp(maj, s->hash, COLLAB_HASH_HEX);
                if (!(going && held && view.max_pstep == step && acc_step == step + 1 && !inflight)) {
                    behind = 1;
                    npresent = others_present(s, seen, nseen, now) + 1;
                    break;
                }
                /* else we accumulate for the round after it already */
            }
            if (!s->o.aggregate_only && !inflight &&
                majority_below(s, seen, nseen, acc_step, view.at_step, now, &low) > 0) {
                behind = 1;
                break;
            }
            low = -1;
            /* Compared at the parameters' step, so it also runs while a
               round is in flight (delayed updates: the parameters are a
               step behind the accumulation, and a split at start-up used
               to persist because no check ever saw two hashes of one step). */
            if (!s->o.aggregate_only && s->hash_step == step) {
                char maj[COLLAB_HASH_HEX + 1];
                majority_hash(seen, nseen, step, now, maj);
                if (maj[0] && strncmp(maj, s->hash, COLLAB_HASH_HEX) != 0) {
                    diverged = 1;
                    break;
                }
            }
            j->others = others_active(s, seen, nseen, acc_step, now);
            j->present = others_present(s, seen, nseen, now);
            if (j->pull_only) {
                if (j->present > 0 || view.samples > 0)
                    po_idle_since = 0;
                else if (po_idle_since == 0)
                    po_idle_since = mono_s();
                else if (mono_s() - po_idle_since > PULL_ONLY_IDLE_S) {
                    fprintf(stderr, "\nwarning: step %lld: no computing peer for %.0f s; computing "
                                    "although the schedule says not to\n",
                            (long long)acc_step, PULL_ONLY_IDLE_S);
                    s->pull_only_off_until = mono_s() + PULL_ONLY_OFF_S;
                    restart = 1;
                    break;
                }
            }
            if (open)
                break; /* a round of our step is gathering: join it */
            if (view.samples >= s->target && (samples > 0 || follower)) {
                /* Members of our last round still finishing it (their
                   progress shows its step) are waited for, up to
                   LAG_WAIT_S: a peer quicker out of a round must not run
                   the next ones alone while the others are a step behind. */
                if (lagging_members(s, seen, nseen, acc_step, now) &&
                    (lag_since == 0 || mono_s() - lag_since < LAG_WAIT_S)) {
                    if (lag_since == 0)
                        lag_since = mono_s();
                    continue;
                }
                /* Delayed updates (seed 000 §3.2): the rounds follow each
                   other at once (the next accumulation is done when a round
                   ends), so peers that fell behind load a state while the
                   next round gathers, and a pair that went on without the
                   two others kept them chasing it. While at least half of
                   the present peers are behind our step, wait for them:
                   they take our current state meanwhile (`lone` below) and
                   join this round. The waits come from a bucket of
                   JOIN_HOLD_S that refills at JOIN_HOLD_REFILL (a dead or
                   lying peer, or peers that go back and forth between
                   behind and level, cannot hold us up for longer). */
                if (s->o.delayed_updates && !s->o.aggregate_only) {
                    int most_behind = majority_behind(s, seen, nseen, acc_step, now);
                    int was = s->hold.waiting;
                    if (collab_hold_update(&s->hold, most_behind, mono_s(), JOIN_HOLD_S,
                                           JOIN_HOLD_REFILL)) {
                        if (!was && s->hold.tokens >= 1)
                            printf("\nstep %lld: most peers are behind us; waiting up to %.0f s for "
                                   "them\n", (long long)acc_step, s->hold.tokens);
                        holding = 1;
                        continue;
                    }
                    if (most_behind && holding && mono_s() - s->hold_warned > 60) {
                        fprintf(stderr, "\nwarning: step %lld: most peers stayed behind us; going on\n",
                                (long long)acc_step);
                        s->hold_warned = mono_s();
                    }
                }
                holding = 0;
                break;
            }
            /* Micro-batches in flight will reach the target: wait for them
               rather than start another, unless they take far longer than
               ours do (their peer may have died). */
            if (samples > 0 && view.samples + view.pledged >= s->target) {
                if (hold_since == 0)
                    hold_since = mono_s();
                else if (mono_s() - hold_since > 1.0 + 3 * mb_time)
                    hold_since = 0;
            } else {
                hold_since = 0;
            }
        }
        free(seen);
        seen = NULL;
        if (restart)
            continue;
        if (g_interrupts || behind || diverged) {
            /* finish the round in flight first: its step is ours too */
            if (inflight) {
                int64_t expect = inflight->step + 1;
                if ((rc = finish_round(s, inflight, &step, &last_loss)) != CM_OK)
                    goto out;
                join_bet_check(inflight, step, &join_step);
                job_reset(inflight);
                inflight = NULL;
                held = 0; /* it was about the parameters before this round */
                if (!g_interrupts && step == expect && !diverged && view.max_step <= step)
                    continue; /* that was all we were behind by */
            }
            if (g_interrupts)
                break;
            /* Ask for the parameters after the collaboration's next step:
               they are served the moment that step is applied, which leaves
               us the whole of the following accumulation to load them and
               join in (the current one is too far along to make). With
               delayed updates the peers' parameters are one step behind
               the round they accumulate for, and the next parameters are
               those of that round. */
            int64_t want = step;
            /* a collaboration with a round in flight: its parameters are a
               step behind the round it accumulates for, which is complete
               by the time the next parameters exist; take the current
               parameters and accumulate for that round at once (the round's
               average is then applied to the parameters of its step) */
            int in_flight = behind && low < 0 && going;
            /* one peer ahead does not step alone while we are about: its
               current state, not the one after its next step */
            /* peers ahead that are no majority of the present peers wait
               for us when they run delayed updates (majority_behind) */
            int lone = behind && low < 0 &&
                       (ahead_now <= 1 || (s->o.delayed_updates && 2 * ahead_now <= npresent));
            if (behind && low >= 0) {
                want = low + 1; /* the majority's next step */
            } else if (behind) {
                want = (view.max_pstep >= 0 ? view.max_pstep : view.max_step) + (in_flight || lone ? 0 : 1);
                if (want > s->steps)
                    want = s->steps;
            }
            if (diverged)
                printf("\nour parameters differ from the other peers' at step %lld: fetching their state\n",
                       (long long)step);
            else if (low >= 0)
                printf("\nahead of the collaboration (step %lld > %lld) after a round without it: "
                       "fetching its state\n", (long long)step, (long long)low);
            else
                printf("\nbehind the collaboration (step %lld < %lld): catching up\n", (long long)step,
                       (long long)view.max_step);
            CM_LOGD("join", "%s at acc %lld params %lld: max_step %lld max_pstep %lld ahead %zu at_step %zu "
                            "low %lld: want %lld (in_flight %d held %d lone %d)",
                    diverged ? "diverged" : low >= 0 ? "ahead" : "behind", (long long)acc_step,
                    (long long)step, (long long)view.max_step, (long long)view.max_pstep, ahead_now,
                    view.at_step, (long long)low, (long long)want, in_flight, held, lone);
            int64_t got = step;
            if (in_flight && want == step && held) {
                /* we hold the parameters the round in flight applies to
                   (we missed its window): accumulate for the round after
                   it at once, a state transfer would only cost time */
                if (want + 1 < s->steps)
                    join_step = want + 1;
            } else if (sync_from_peer(s, want, &got, 0) == CM_OK) {
                step = got;
                /* the round after the one in flight (not the highest step
                   published: a peer that joined ahead publishes the step
                   after its own round) */
                if (in_flight && got == want && want + 1 < s->steps)
                    join_step = want + 1;
            } else if (catch_up(s, step + 1, &got) == CM_OK && got > step)
                step = got, update_hash(s, step);
            else
                sleep(1); /* nobody could serve us yet */
            CM_LOGD("join", "after catching up: params at %lld, join_step %lld", (long long)step,
                    (long long)join_step);
            continue;
        }
        /* the accumulation is complete: the previous round must be applied
           before this one starts (one step of staleness at most) */
        if (inflight) {
            int64_t expect = inflight->step + 1;
            if ((rc = finish_round(s, inflight, &step, &last_loss)) != CM_OK)
                goto out;
            join_bet_check(inflight, step, &join_step);
            job_reset(inflight);
            inflight = NULL;
            if (step != expect)
                continue;
        }
        CM_LOGD("join", "round %lld starts: %.0f samples (view %.0f at %zu peers), params at %lld, "
                        "others %zu present %zu join_step %lld",
                (long long)j->step, samples, view.samples, view.at_step, (long long)step, j->others,
                j->present, (long long)join_step);
        j->samples = samples;
        j->loss_sum = loss_sum;
        j->loss_n = loss_n;
        j->compute_s = compute_s;
        j->sps = sps;
        if (s->o.delayed_updates && !s->o.aggregate_only &&
            pthread_create(&j->th, NULL, round_thread, j) == 0) {
            j->threaded = 1;
            inflight = j;
            cur ^= 1;
            continue;
        }
        run_round(j);
        if ((rc = finish_round(s, j, &step, &last_loss)) != CM_OK)
            goto out;
        join_bet_check(j, step, &join_step);
    }
    if (inflight) {
        rc = finish_round(s, inflight, &step, &last_loss);
        inflight = NULL;
    }
out:
    if (inflight && inflight->threaded)
        pthread_join(inflight->th, NULL);
    printf("\n");
    free(jobs[0].mem);
    free(jobs[1].mem);
    free(jobs[0].accum);
    free(jobs[1].accum);
    free(grad);
    return rc;
}

/* After the last step: peers still behind may need our final state; serve
 * it while any of them shows up (fresh progress below the last step, or a
 * request), for at most a minute. */
#define AUX_LINGER_S 10.0 /* the engine's default linger_ms */
static void linger(struct peer_state *s, int64_t step)
{
    if (s->o.aggregate_only) {
        /* the members may still be fetching our part of the last round:
           our engine serves it until they have it or its linger ends, but
           only while we run (without this, every member skipped our part
           of the last step) */
        double t0 = mono_s();
        while (!g_interrupts && mono_s() - t0 < AUX_LINGER_S)
            usleep(100000);
        return;
    }
    if (!s->st_addr[0])
        return;
    double t0 = mono_s(), quiet_since = t0;
    while (!g_interrupts && mono_s() - t0 < 60 && mono_s() - quiet_since < 3) {
        publish_progress(s, step, 0, 0, 0);
        serve_state_if_wanted(s, step);
        struct collab_progress *p = NULL;
        size_t n = 0;
        int busy = peer_net_state_wanted(s->net) >= 0;
        if (read_progress(s, &p, &n) == CM_OK) {
            int64_t now = now_ms();
            for (size_t i = 0; i < n; i++)
                busy |= !p[i].aux && p[i].step < step && p[i].t_ms > now - 3000;
        }
        free(p);
        if (busy)
            quiet_since = mono_s();
        usleep(100000);
    }
}

int agent_cmd_join(int argc, char **argv)
{
    struct peer_state *s = calloc(1, sizeof *s);
    if (!s)
        return 1;
    pthread_mutex_init(&s->js_mu, NULL);
    collab_hold_init(&s->hold, JOIN_HOLD_S);
    pthread_mutex_init(&s->probe_mu, NULL);
    pthread_cond_init(&s->probe_cv, NULL);
    int rc = cm_opts_parse(&JOIN, &s->o, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&JOIN, &s->o);
        free(s);
        return rc == 1 ? 0 : 2;
    }
    int status = 2;
    if (!s->o.run || !cm_name_valid(s->o.run)) {
        fprintf(stderr, "error: --run RUN is required (see --help)\n");
        goto out;
    }
    if (s->o.stall_ms < 500 || s->o.stall_ms > 600000 || s->o.round_timeout_ms < 1000 ||
        s->o.outcome_window_ms < 50 || s->o.round_window_ms < 10) {
        fprintf(stderr, "error: --stall-ms must be in [500, 600000], --round-timeout-ms >= 1000, "
                        "--outcome-window-ms >= 50, --round-window-ms >= 10\n");
        goto out;
    }
    /* every option checked before anything is contacted or written */
    const char *bad = NULL;
    if (!strcmp(s->o.progress, "live"))
        g_progress_live = 1;
    else if (!strcmp(s->o.progress, "lines"))
        g_progress_live = 0;
    else if (!strcmp(s->o.progress, "auto"))
        g_progress_live = isatty(STDOUT_FILENO);
    else
        bad = "--progress must be live, lines or auto";
    double up = s->o.max_upload_mbps, down = s->o.max_download_mbps;
    if (!bad && s->o.device && strcmp(s->o.device, "cpu") && strcmp(s->o.device, "cuda") &&
        strcmp(s->o.device, "auto"))
        bad = "--device must be cpu, cuda or auto";
    else if (!bad && s->o.compression && strcmp(s->o.compression, "none") && strcmp(s->o.compression, "fp16") &&
             strcmp(s->o.compression, "q8"))
        bad = "--compression must be none, fp16 or q8";
    else if (!bad && (!(up == 0 || (up >= 0.1 && up <= 1e6)) || !(down == 0 || (down >= 0.1 && down <= 1e6))))
        bad = "--max-upload-mbps and --max-download-mbps must be 0 (no cap) or from 0.1 to 1000000";
    else if (!bad && (s->o.dht_port < 0 || s->o.dht_port > 65535 || s->o.ar_port < 0 || s->o.ar_port > 65535))
        bad = "--dht-port and --ar-port must be from 0 (any) to 65535";
    else if (!bad && (s->o.steps < 0 || s->o.micro_batch < 0 || s->o.checkpoint_every < 0))
        bad = "--steps, --micro-batch and --checkpoint-every must be 0 (the run's) or positive";
    if (bad) {
        fprintf(stderr, "error: %s\n", bad);
        goto out;
    }
    const char *skew = getenv("CROWDTRAIN_TEST_CLOCK_SKEW_MS");
    if (skew && *skew) {
        char *end;
        long long v = strtoll(skew, &end, 10);
        if (*end || v < -3600000 || v > 3600000) {
            fprintf(stderr, "error: CROWDTRAIN_TEST_CLOCK_SKEW_MS must be an integer within an hour\n");
            goto out;
        }
        g_test_skew_ms = v;
        fprintf(stderr, "warning: CROWDTRAIN_TEST_CLOCK_SKEW_MS=%lld: this peer's clock is set wrong "
                        "(a test of the clock correction)\n", v);
    }
    const char *corrupt = getenv("CROWDTRAIN_TEST_CORRUPT_GRADIENTS");
    if (corrupt && *corrupt) {
        s->corrupt = !strcmp(corrupt, "nan") ? 1 : !strcmp(corrupt, "huge") ? 2 : 0;
        if (!s->corrupt) {
            fprintf(stderr, "error: CROWDTRAIN_TEST_CORRUPT_GRADIENTS must be nan or huge\n");
            goto out;
        }
        fprintf(stderr, "warning: CROWDTRAIN_TEST_CORRUPT_GRADIENTS=%s: this peer sends corrupt "
                        "gradients (a test of the others' defences)\n", corrupt);
    }
    if (s->o.aggregate_only && s->o.client_mode) {
        fprintf(stderr, "error: an --aggregate-only peer must accept connections (not --client-mode)\n");
        goto out;
    }
    status = 1;
    if (agent_state_dir(s->o.config_dir, s->dir, sizeof s->dir) != CM_OK)
        goto out;
    snprintf(s->rundir, sizeof s->rundir, "%s/%s", s->dir, s->o.run);
    mkdir(s->rundir, 0700);
    s->session = agent_state_read(s->dir, "session.json");
    if (!s->session) {
        fprintf(stderr, "error: not logged in; run 'crowdtrain-agent login' first\n");
        goto out;
    }
    s->coord.url = s->o.coordinator ? s->o.coordinator
                                    : (char *)json_string_value(json_object_get(s->session, "coordinator"));
    s->coord.ca_cert = (char *)json_string_value(json_object_get(s->session, "ca_cert"));
    s->coord.token = (char *)json_string_value(json_object_get(s->session, "token"));
    char keypath[4200], err[512];
    snprintf(keypath, sizeof keypath, "%s/peer-ed25519.pem", s->dir);
    if (!s->coord.url || !s->coord.token ||
        cm_ed25519_load_or_create(&s->key, keypath, NULL) != CM_OK) {
        fprintf(stderr, "error: incomplete state in %s; log in again\n", s->dir);
        goto out;
    }
    if (fetch_pass(s) != CM_OK || fetch_run(s) != CM_OK)
        goto out;
    clock_sync(s, 1);
    if (agent_trainer_init(&s->tr, &s->tcfg, s->config_text, strlen(s->config_text), err, sizeof err) != CM_OK) {
        fprintf(stderr, "error: %s\n", err);
        goto out;
    }
    s->trainer_ready = 1;
    s->tr.resume_keeps_stream = 1; /* our own data order, whoever's state we load */
    int64_t step = 0;
    rc = catch_up(s, 0, &step);
    if (rc != CM_OK && rc != CM_ENOTFOUND)
        goto out;

    struct peer_net_config nc = {0};
    nc.key = &s->key;
    nc.token = s->token;
    nc.run = s->o.run;
    nc.coord_keys = (const uint8_t(*)[CM_ED25519_PUB_LEN])s->coord_keys;
    nc.n_coord_keys = s->n_coord_keys;
    nc.listen_ip = s->o.client_mode ? NULL : s->o.listen_ip;
    nc.dht_port = (uint16_t)s->o.dht_port;
    nc.ar_port = (uint16_t)s->o.ar_port;
    nc.max_upload_mbps = s->o.max_upload_mbps;
    nc.max_download_mbps = s->o.max_download_mbps;
    nc.bootstrap = s->bootstrap;
    nc.n_bootstrap = s->n_bootstrap;
    if ((rc = peer_net_start(&nc, &s->net)) != CM_OK) {
        fprintf(stderr, "error: starting the peer-to-peer node: %s\n", cm_strerror(rc));
        goto out;
    }
    const char *adv = s->o.advertise_ip ? s->o.advertise_ip
                      : strcmp(s->o.listen_ip, "0.0.0.0") ? s->o.listen_ip : "127.0.0.1";
    if (!s->o.client_mode) {
        snprintf(s->my_addr, sizeof s->my_addr, strchr(adv, ':') ? "[%s]:%u" : "%s:%u", adv,
                 peer_net_ar_port(s->net));
        snprintf(s->st_addr, sizeof s->st_addr, strchr(adv, ':') ? "[%s]:%u" : "%s:%u", adv,
                 peer_net_state_port(s->net));
    }
    if (dp_sched_open(s->rundir, s->o.run, (const uint8_t(*)[CM_ED25519_PUB_LEN])s->coord_keys,
                        s->n_coord_keys, &s->js) != CM_OK) {
        fprintf(stderr, "warning: schedules unavailable; averaging with even parts\n");
        s->js = NULL;
    }
    if (peer_reporter_start(s->coord.url, s->coord.ca_cert, s->o.run, &s->key, s->token, &s->rep) !=
        CM_OK) {
        fprintf(stderr, "warning: contribution reports unavailable for this session\n");
        s->rep = NULL;
    }
    if (s->o.step_log && !(s->steplog = fopen(s->o.step_log, "a"))) {
        fprintf(stderr, "error: cannot open the step log %s\n", s->o.step_log);
        goto out;
    }
    snprintf(s->progress_key, sizeof s->progress_key, "%s/progress", s->o.run);
    char pk[64];
    cm_b64url_encode(s->key.pub, CM_ED25519_PUB_LEN, pk);
    printf("joined run '%s' as %s (peer %.12s..., %s%s), target batch %.0f, %ld steps, model %zu parameters\n",
           s->o.run, json_string_value(json_object_get(s->pass, "username")), pk,
           s->o.aggregate_only ? "aggregate-only" : s->tr.be->name,
           s->o.client_mode ? ", client mode" : "", s->target, s->steps, s->tr.model->nparams);

    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (s->js && !s->o.client_mode && pthread_create(&s->probe_th, NULL, probe_main, s) == 0)
        s->probe_started = 1;
    rc = train_loop(s);
    if (rc != CM_OK) {
        fprintf(stderr, "error: training stopped: %s\n", cm_strerror(rc));
        goto out;
    }
    if (g_interrupts)
        printf("left the run at step %llu (Ctrl-C)\n", (unsigned long long)s->tr.opt->step);
    else
        linger(s, (int64_t)s->tr.opt->step);
    if (!s->o.aggregate_only && !s->o.no_eval && s->tcfg.eval_manifest[0]) {
        struct kern_eval ev;
        if (agent_trainer_evaluate(&s->tr, s->tcfg.eval_batches, &ev, err, sizeof err) == CM_OK && ev.count)
            printf("evaluation at step %llu: loss %.4f, accuracy %.2f%% (%ld examples)\n",
                   (unsigned long long)s->tr.opt->step, ev.loss_sum / (double)ev.count,
                   100.0 * (double)ev.correct / (double)ev.count, ev.count);
        else
            fprintf(stderr, "warning: evaluation failed: %s\n", err);
    }
    if (!s->o.aggregate_only) {
        char out_path[4400];
        snprintf(out_path, sizeof out_path, "%s", s->o.export_path ? s->o.export_path : "");
        if (!out_path[0])
            snprintf(out_path, sizeof out_path, "%s/%s.safetensors", s->dir, s->o.run);
        if (export_model(s, out_path) == CM_OK)
            printf("exported the model: %s\n", out_path);
        else
            fprintf(stderr, "warning: exporting the model to %s failed\n", out_path);
    }
    status = 0;
out:
    if (s->probe_started) {
        pthread_mutex_lock(&s->probe_mu);
        __atomic_store_n(&s->probe_stop, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&s->probe_cv);
        pthread_mutex_unlock(&s->probe_mu);
        pthread_join(s->probe_th, NULL);
    }
    if (s->rep) {
        struct peer_reporter_stats rs;
        peer_reporter_stats(s->rep, &rs);
        size_t left = peer_reporter_stop(s->rep, 5000);
        printf("contribution reports: %llu accepted, %llu refused, %llu dropped%s\n",
               (unsigned long long)rs.sent, (unsigned long long)rs.refused,
               (unsigned long long)rs.dropped, left ? " (some still queued at exit)" : "");
        if (left)
            fprintf(stderr, "warning: %zu contribution reports could not be sent\n", left);
    }
    if (s->js)
        dp_sched_close(s->js);
    if (s->net)
        peer_net_stop(s->net);
    if (s->steplog)
        fclose(s->steplog);
    if (s->trainer_ready)
        agent_trainer_cleanup(&s->tr);
    cm_ed25519_cleanup(&s->key);
    json_decref(s->session);
    json_decref(s->pass);
    free(s->config_text);
    cm_opts_free(&JOIN, &s->o);
    pthread_mutex_destroy(&s->js_mu);
    pthread_mutex_destroy(&s->probe_mu);
    pthread_cond_destroy(&s->probe_cv);
    free(s);
    return status;
}
