/* crowdtrain-agent serve-experts: a volunteer hosts experts of a run's
 * decentralized mixture-of-experts layer (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.3 "Runtime": expert servers, DHT nodes and
 * trainers are the same kind of volunteer; docs/experts.md, "Expert
 * servers"). A role of the peer runtime (agent/peer/runtime.h), started up
 * to its net stage:
 *
 *   session -> access pass -> the run's config (moe_runcfg.h) -> clock ->
 *   p2p node (must accept connections: trainers call us) -> which experts
 *   (--uids, or --experts N: the N with the fewest live servers on the DHT)
 *   -> the expert server (agent/moe/moe_server.h) on the node's state host
 *   -> DHT declarations (seed 002 §3.3 "DHT Node", Appendix C), renewed
 *   every declare_ttl_s / 3 -> status lines -> on Ctrl-C/SIGTERM: stop
 *   taking requests, withdraw the declarations, stop.
 *
 * Every replica of a uid starts from the same parameters (a seed from the
 * run's and the uid: moe_runcfg_expert_seed), or from the uid's newest
 * checkpoint on the coordinator when it has one. Every
 * model.experts.serve.checkpoint_every_s each expert whose state changed is
 * uploaded (agent/moe/expert_ckpt.h), and with --max-experts M the server
 * takes over, up to M experts in all, uids with fewer live servers than
 * model.experts.serve.replicas that have a checkpoint: what a server that
 * left (or crashed) learned is not lost (seed 002 §3.3; docs/experts.md,
 * "Checkpoints and takeover"). */
#include "agent/commands.h"
#include "agent/moe/expert_ckpt.h"
#include "agent/moe/moe_runcfg.h"
#include "agent/moe/moe_server.h"
#include "agent/peer/runtime.h"
#include "cm_err.h"
#include "cm_opts.h"
#include "cm_time.h"
#include "moe/moe_dht.h"
#include "moe/moe_msg.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SERVE_MAX_EXPERTS 256 /* MOE_INFO_MAX_EXPERTS: what one Info answer lists */
#define SERVE_MAX_LEAF_KEYS 4096 /* prefix keys --experts reads (a dmoe grid has <= 4096 cells) */
#define DECLARE_WAIT_MS 15000    /* one declaration's puts (each bounded by its RPC deadlines) */
#define WITHDRAW_WAIT_MS 5000    /* Ctrl-C: best effort, bounded */
#define READ_WAIT_MS 15000

struct serve_opts {
    char *run, *coordinator, *config_dir, *device, *listen_ip, *advertise_ip, *uids;
    long experts, max_experts, dht_port, ar_port, max_batch, max_wait_ms, status_every, delay_ms;
    double fail_prob;
};

#define O(f) offsetof(struct serve_opts, f)
static const struct cm_opt SERVE_OPTS[] = {
    {"run", CM_OPT_STR, O(run), NULL, "RUN", "the run whose experts to serve (its model must be dmoe)", 0},
    {"experts", CM_OPT_INT, O(experts), "0", "N",
     "serve N experts: those with the fewest live servers on the DHT (ties at random), so servers "
     "started one after another cover the grid", 0},
    {"uids", CM_OPT_STR, O(uids), NULL, "LIST", "serve exactly these experts, e.g. ffn.0.1,ffn.2.3", 0},
    {"max-experts", CM_OPT_INT, O(max_experts), "0", "M",
     "take over experts whose servers left, up to M in all: every third of declare_ttl_s, uids with "
     "fewer live servers than the run's replicas that have a checkpoint are loaded from it and "
     "declared (0: never)", 0},
    {"device", CM_OPT_STR, O(device), NULL, "DEV", "cpu, cuda or auto (default: the run's)", 0},
    {"coordinator", CM_OPT_STR, O(coordinator), NULL, "URL",
     "the coordinator (default: the one you logged in to)", 0},
    {"config-dir", CM_OPT_STR, O(config_dir), NULL, "DIR", "state directory (default ~/.config/crowdtrain)", 0},
    {"listen-ip", CM_OPT_STR, O(listen_ip), "0.0.0.0", "IP", "address trainers connect to us on", 0},
    {"advertise-ip", CM_OPT_STR, O(advertise_ip), NULL, "IP",
     "address declared on the DHT, unchecked (default: the address the coordinator sees us at, once "
     "it reached us there)", 0},
    {"dht-port", CM_OPT_INT, O(dht_port), "0", "PORT", "DHT port, 0 = any", 0},
    {"ar-port", CM_OPT_INT, O(ar_port), "0", "PORT", "averaging port, 0 = any", 0},
    {"max-batch", CM_OPT_INT, O(max_batch), "0", "N",
     "samples per batch and per request (default: the run's model.experts.serve.max_batch, 256)", 0},
    {"max-wait-ms", CM_OPT_INT, O(max_wait_ms), "0", "MS",
     "longest wait for a batch to fill (default: the run's, 5)", 0},
    {"fail-prob", CM_OPT_DBL, O(fail_prob), "0", "P",
     "fail each call with probability P (fault injection for tests, seed 002 §4.2)", 0},
    {"delay-ms", CM_OPT_INT, O(delay_ms), "0", "MS",
     "hold every answer back for an exponentially distributed delay of mean MS (latency emulation "
     "for tests and benchmarks, seed 002 §4.1)", 0},
    {"status-every", CM_OPT_INT, O(status_every), "10", "S", "a status line every S seconds", 0},
};
static const struct cm_cmd_spec SERVE = {
    "crowdtrain-agent serve-experts --run RUN (--experts N | --uids LIST) [options]",
    "Hosts experts of a run's mixture-of-experts layer (Learning@home) for its\n"
    "trainers, with the session of 'crowdtrain-agent login'. The experts are\n"
    "those of --uids, or with --experts N the N that the fewest servers host now\n"
    "(read from the DHT). Each starts from its newest checkpoint on the\n"
    "coordinator, else from the run's initial parameters for its uid, learns from\n"
    "the trainers' backward calls, and is uploaded again every\n"
    "model.experts.serve.checkpoint_every_s (default 60 s) when it changed. With\n"
    "--max-experts M the server also takes over, up to M experts, those whose\n"
    "servers left (fewer live servers than the run's replicas) from their\n"
    "checkpoints. The server declares its experts on the run's DHT (renewed\n"
    "every third of model.experts.serve.declare_ttl_s, default 30 s) so\n"
    "trainers' beam searches find it, and prints\n"
    "a status line every --status-every seconds: experts, requests, samples,\n"
    "mean batch, failures, timeouts. Trainers must reach it: a host the\n"
    "coordinator cannot dial back is refused (forward the ports, or give\n"
    "--advertise-ip). Ctrl-C or SIGTERM stops taking requests, withdraws the\n"
    "declarations at once, and exits; a server that dies just stops being found\n"
    "once its declarations expire.",
    SERVE_OPTS, sizeof SERVE_OPTS / sizeof SERVE_OPTS[0], 1};

struct serve {
    struct serve_opts o;
    struct peer_rt rt;
    struct moe_runcfg rc;
    struct moe_uid uids[SERVE_MAX_EXPERTS];
    char uid_str[SERVE_MAX_EXPERTS][MOE_UID_TEXT_MAX];
    size_t n;
    struct moe_server addr; /* where we are, as declared */
    struct moe_server *srv; /* set and cleared on the net's loop thread */
    int64_t declared_until; /* expiry of our newest declaration (p2p_now_ms), 0: none */
    /* one asynchronous DHT operation at a time, waited for by the main thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy, op_status;
    size_t op_pending, op_ok;
    /* --experts and takeover: live servers per grid cell (other than us) */
    uint16_t *live;
    size_t n_keys;
    /* the step of each expert's last stored checkpoint, -1: none yet */
    long ckpt_step[SERVE_MAX_EXPERTS];
};

static volatile sig_atomic_t g_interrupts, g_signal;
static void on_signal(int sig)
{
    g_interrupts++;
    g_signal = sig;
}

/* ---- the net's loop thread ---- */

/* The state host's handler for types it does not serve itself: ours. */
static int serve_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                            const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen)
{
    struct serve *s = arg;
    if (!s->srv)
        /* the experts' types, before the server starts or once it stopped */
        return type == MOE_MSG_FORWARD || type == MOE_MSG_BACKWARD || type == MOE_MSG_INFO
                   ? CM_ECLOSED
                   : CM_EUNSUPPORTED;
    return moe_server_on_request(s->srv, h, from, type, body, len, resp, rlen);
}

static void op_done(struct serve *s, int status, size_t ok)
{
    pthread_mutex_lock(&s->mu);
    if (status != CM_OK && s->op_status == CM_OK)
        s->op_status = status;
    s->op_ok += ok;
    if (s->op_pending && --s->op_pending == 0) {
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Starts an operation of `parts` completions; 0 when one is still pending. */
static int op_begin(struct serve *s, size_t parts)
{
    pthread_mutex_lock(&s->mu);
    int ok = !s->busy;
    if (ok) {
        s->busy = 1;
        s->op_status = CM_OK;
        s->op_pending = parts;
        s->op_ok = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Waits for the pending operation; CM_ETIMEOUT when it outlives wait_ms
 * (it then completes later, on its own: s outlives the net). */
static int op_wait(struct serve *s, uint32_t wait_ms, size_t *ok)
{
    struct timespec dl = cm_time_after_ms(CLOCK_REALTIME, wait_ms);
    pthread_mutex_lock(&s->mu);
    int rc = CM_OK;
    while (s->busy && rc == CM_OK)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl))
            rc = CM_ETIMEOUT;
    if (rc == CM_OK)
        rc = s->op_status;
    if (ok)
        *ok = s->op_ok;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void declared(void *arg, int status, size_t keys_ok)
{
    op_done(arg, status, keys_ok);
}

struct declare_job {
    struct serve *s;
    int64_t expires_ms;
    int rc;
};
static void declare_on_loop(void *arg, struct peer_net *n)
{
    struct declare_job *j = arg;
    j->rc = moe_dht_declare_async(peer_net_dht(n), j->s->o.run, &j->s->rc.grid, j->s->uids, j->s->n,
                                  &j->s->addr, j->expires_ms, declared, j->s);
}

/* Withdrawal: the DHT keeps one entry per author and subkey, the one with
 * the later expiry, and refuses expiries in the past, so an entry cannot be
 * shortened. We replace ours with a tombstone (one byte 0: no reader
 * decodes it, moe_dht_entries skips it) that expires 1 ms after the
 * declaration would have. */
struct withdraw_job {
    struct serve *s;
    struct moe_decl d;
    int64_t expires_ms;
    size_t started;
};
static void withdrawn(void *arg, const struct dht_result *res)
{
    op_done(arg, res->status, res->status == CM_OK && res->stored > 0);
}
static void withdraw_on_loop(void *arg, struct peer_net *n)
{
    struct withdraw_job *j = arg;
    static const uint8_t tomb[1] = {0};
    for (size_t i = 0; i < j->d.n; i++)
        if (dht_put_async(peer_net_dht(n), j->d.items[i].key, j->d.items[i].klen, MOE_DHT_SUBKEY,
                          strlen(MOE_DHT_SUBKEY), tomb, sizeof tomb, j->expires_ms, withdrawn, j->s) == CM_OK)
            j->started++;
}

/* --experts: the leaf keys of the grid, read all at once. */
struct read_job {
    struct serve *s;
    struct moe_uid *prefixes;
    size_t n, started;
};
struct read_one {
    struct serve *s;
    struct moe_uid prefix;
};
static void read_done(void *arg, const struct dht_result *res)
{
    struct read_one *r = arg;
    struct serve *s = r->s;
    struct moe_entry *e = NULL;
    size_t ne = 0;
    if (res->status == CM_OK && moe_dht_entries(&s->rc.grid, &r->prefix, res, &e, &ne, NULL) == CM_OK) {
        const struct moe_grid *g = &s->rc.grid;
        /* the cell index of prefix.j, as moe_runcfg_expert_seed counts: sum u_i M^i */
        size_t base = 0, mul = 1;
        for (int i = 0; i < r->prefix.n; i++, mul *= (size_t)g->size)
            base += (size_t)r->prefix.idx[i] * mul;
        for (size_t k = 0; k < ne; k++) {
            if (!memcmp(e[k].author, s->rt.key.pub, 32))
                continue; /* our own earlier declaration (a restart with the same key) */
            for (int j = 0; j < g->size; j++)
                if (moe_rec_has(&e[k].rec, j) && s->live[base + (size_t)j * mul] < UINT16_MAX)
                    s->live[base + (size_t)j * mul]++;
        }
    }
    free(e);
    free(r);
    /* a missing key is no server: not a failure of the read */
    op_done(s, res->status == CM_ENOTFOUND ? CM_OK : res->status, 1);
}
static void read_on_loop(void *arg, struct peer_net *n)
{
    struct read_job *j = arg;
    for (size_t i = 0; i < j->n; i++) {
        char key[MOE_KEY_MAX];
        struct read_one *r = malloc(sizeof *r);
        if (!r || moe_key_format(j->s->o.run, &j->s->rc.grid, &j->prefixes[i], key, sizeof key, NULL) != CM_OK) {
            free(r);
            continue;
        }
        r->s = j->s;
        r->prefix = j->prefixes[i];
        if (dht_get_async(peer_net_dht(n), key, strlen(key), read_done, r) != CM_OK) {
            free(r);
            continue;
        }
        j->started++;
    }
}

struct server_job {
    struct serve *s;
    struct moe_server_config cfg;
    const struct kern_backend *be;
    int rc;
    char uid[MOE_UID_TEXT_MAX]; /* the expert that failed */
    struct moe_server_stats st;
};
static void server_start_on_loop(void *arg, struct peer_net *n)
{
    struct server_job *j = arg;
    struct serve *s = j->s;
    struct moe_server *srv = NULL;
    uv_loop_t *loop = p2p_ctx_loop(p2p_host_ctx(peer_net_host(n)));
    j->rc = moe_server_new(&j->cfg, loop, &srv);
    for (size_t i = 0; j->rc == CM_OK && i < s->n; i++) {
        j->rc = moe_server_add_expert(srv, s->uid_str[i], s->rc.C, s->rc.F,
                                      moe_runcfg_expert_seed(&s->rc, &s->uids[i]));
        if (j->rc != CM_OK)
            snprintf(j->uid, sizeof j->uid, "%s", s->uid_str[i]);
    }
    if (j->rc == CM_OK)
        j->rc = moe_server_start(srv);
    if (j->rc != CM_OK) {
        if (srv)
            moe_server_free(srv);
        return;
    }
    s->srv = srv;
}
/* Takeover: one more expert on the running server (not declared yet). */
struct add_job {
    struct serve *s;
    const char *uid;
    uint64_t seed;
    int rc;
};
static void server_add_on_loop(void *arg, struct peer_net *n)
{
    (void)n;
    struct add_job *j = arg;
    j->rc = j->s->srv ? moe_server_add_expert(j->s->srv, j->uid, j->s->rc.C, j->s->rc.F, j->seed) : CM_ESTATE;
}

/* Stops taking requests (those held are answered) and frees the server. */
static void server_stop_on_loop(void *arg, struct peer_net *n)
{
    (void)n;
    struct server_job *j = arg;
    struct serve *s = j->s;
    if (!s->srv)
        return;
    moe_server_stop(s->srv);
    moe_server_stats(s->srv, &j->st);
    moe_server_free(s->srv);
    s->srv = NULL;
}

/* ---- the role's main thread ---- */

static int declare(struct serve *s)
{
    struct declare_job j = {s, p2p_now_ms() + (int64_t)s->rc.serve.declare_ttl_s * 1000, CM_OK};
    if (!op_begin(s, 1)) {
        fprintf(stderr, "warning: the previous declaration is still in flight; not re-declaring yet\n");
        return CM_EBUSY;
    }
    int rc = peer_net_call(s->rt.net, declare_on_loop, &j);
    if (rc == CM_OK)
        rc = j.rc;
    if (rc != CM_OK) {
        op_done(s, rc, 0);
        op_wait(s, 0, NULL);
        return rc;
    }
    size_t ok = 0;
    rc = op_wait(s, DECLARE_WAIT_MS, &ok);
    /* a key stored on some node is found by readers: the declaration counts from here */
    if (ok > 0 && j.expires_ms > s->declared_until)
        s->declared_until = j.expires_ms;
    return rc;
}

static int withdraw(struct serve *s)
{
    if (!s->declared_until)
        return CM_OK;
    struct withdraw_job j = {.s = s, .expires_ms = s->declared_until + 1};
    int rc = moe_decl_build(s->o.run, &s->rc.grid, s->uids, s->n, &s->addr, &j.d);
    if (rc != CM_OK)
        return rc;
    /* a declaration still in flight completes first (bounded) */
    op_wait(s, WITHDRAW_WAIT_MS, NULL);
    if (!op_begin(s, j.d.n)) {
        moe_decl_cleanup(&j.d);
        return CM_EBUSY;
    }
    rc = peer_net_call(s->rt.net, withdraw_on_loop, &j);
    /* the puts that did not start complete here */
    for (size_t i = rc == CM_OK ? j.started : 0; i < j.d.n; i++)
        op_done(s, rc == CM_OK ? CM_EINTERNAL : rc, 0);
    size_t ok = 0;
    int wrc = op_wait(s, WITHDRAW_WAIT_MS, &ok);
    if (rc == CM_OK)
        rc = wrc;
    printf("withdrew the declarations: %zu of %zu keys replaced%s%s\n", ok, j.d.n, rc ? ": " : "",
           rc ? cm_strerror(rc) : "");
    moe_decl_cleanup(&j.d);
    return rc;
}

/* --experts N: reads every leaf key (prefixes of length d - 1) and picks the
 * N cells with the fewest live servers, ties at random; cells below
 * `replicas` servers come first by construction (fewest first). */
static size_t grid_cells(const struct moe_grid *g)
{
    size_t cells = 1;
    for (int i = 0; i < g->dims; i++)
        cells *= (size_t)g->size;
    return cells;
}

/* Reads every leaf key of the grid into s->live (servers per cell other
 * than us), all at once on the net's loop. */
static int read_live(struct serve *s)
{
    const struct moe_grid *g = &s->rc.grid;
    size_t cells = grid_cells(g), nkeys = cells / (size_t)g->size;
    if (nkeys > SERVE_MAX_LEAF_KEYS)
        return CM_ERANGE;
    if (!s->live && !(s->live = calloc(cells, sizeof *s->live)))
        return CM_ENOMEM;
    memset(s->live, 0, cells * sizeof *s->live);
    struct moe_uid *pre = calloc(nkeys, sizeof *pre);
    if (!pre)
        return CM_ENOMEM;
    for (size_t k = 0; k < nkeys; k++) {
        pre[k].n = g->dims - 1;
        size_t x = k;
        for (int i = 0; i < g->dims - 1; i++, x /= (size_t)g->size)
            pre[k].idx[i] = (uint16_t)(x % (size_t)g->size);
    }
    struct read_job j = {s, pre, nkeys, 0};
    if (!op_begin(s, nkeys)) {
        free(pre);
        return CM_EBUSY; /* a declaration still in flight */
    }
    int rc = peer_net_call(s->rt.net, read_on_loop, &j);
    for (size_t i = rc == CM_OK ? j.started : 0; i < nkeys; i++)
        op_done(s, rc == CM_OK ? CM_EINTERNAL : rc, 0);
    rc = op_wait(s, READ_WAIT_MS, NULL);
    free(pre);
    return rc;
}

/* The cell index of uid u (sum u_i M^i, as read_done counts). */
static size_t cell_of(const struct moe_grid *g, const struct moe_uid *u)
{
    size_t x = 0, mul = 1;
    for (int i = 0; i < g->dims; i++, mul *= (size_t)g->size)
        x += (size_t)u->idx[i] * mul;
    return x;
}

static int pick_experts(struct serve *s)
{
    const struct moe_grid *g = &s->rc.grid;
    size_t cells = grid_cells(g);
    if ((size_t)s->o.experts > cells) {
        fprintf(stderr, "error: --experts %ld: the grid has %zu experts\n", s->o.experts, cells);
        return CM_EINVAL;
    }
    int rc = read_live(s);
    if (rc == CM_ERANGE)
        return rc;
    if (rc != CM_OK) {
        fprintf(stderr, "error: reading the grid's declarations from the DHT: %s\n", cm_strerror(rc));
        return rc;
    }
    /* random order, then a stable sort by live count: ties at random */
    size_t *ord = malloc(cells * sizeof *ord);
    if (!ord)
        return CM_ENOMEM;
    uint64_t r;
    cm_random_bytes(&r, sizeof r);
    for (size_t i = 0; i < cells; i++)
        ord[i] = i;
    for (size_t i = cells - 1; i > 0; i--) {
        r = r * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t k = (size_t)((r >> 33) % (i + 1)), t = ord[i];
        ord[i] = ord[k];
        ord[k] = t;
    }
    for (size_t i = 1; i < cells; i++) { /* insertion sort: stable, cells <= 4096 */
        size_t v = ord[i], k = i;
        for (; k > 0 && s->live[ord[k - 1]] > s->live[v]; k--)
            ord[k] = ord[k - 1];
        ord[k] = v;
    }
    s->n = (size_t)s->o.experts;
    size_t full = 0;
    for (size_t i = 0; i < s->n; i++) {
        size_t x = ord[i];
        s->uids[i].n = g->dims;
        for (int d = 0; d < g->dims; d++, x /= (size_t)g->size)
            s->uids[i].idx[d] = (uint16_t)(x % (size_t)g->size);
        if (s->live[ord[i]] >= (uint16_t)s->rc.serve.replicas)
            full++;
    }
    if (full)
        printf("note: %zu of the chosen experts already have %d server%s (model.experts.serve.replicas): "
               "this server adds replicas\n", full, s->rc.serve.replicas, s->rc.serve.replicas == 1 ? "" : "s");
    free(ord);
    return CM_OK;
}

static int parse_uids(struct serve *s)
{
    char *copy = strdup(s->o.uids), *save = NULL;
    if (!copy)
        return CM_ENOMEM;
    int rc = CM_OK;
    s->n = 0;
    for (char *t = strtok_r(copy, ",", &save); t && rc == CM_OK; t = strtok_r(NULL, ",", &save)) {
        if (s->n == SERVE_MAX_EXPERTS) {
            fprintf(stderr, "error: --uids: at most %d experts per server\n", SERVE_MAX_EXPERTS);
            rc = CM_EINVAL;
        } else if (moe_uid_parse(&s->rc.grid, t, &s->uids[s->n]) != CM_OK) {
            fprintf(stderr, "error: --uids: \"%.40s\" is not an expert of the run's grid %s (%d dimension%s of "
                    "%d)\n", t, s->rc.grid.name, s->rc.grid.dims, s->rc.grid.dims == 1 ? "" : "s",
                    s->rc.grid.size);
            rc = CM_EINVAL;
        } else {
            for (size_t i = 0; i < s->n && rc == CM_OK; i++)
                if (moe_uid_equal(&s->uids[i], &s->uids[s->n])) {
                    fprintf(stderr, "error: --uids: %s is given twice\n", t);
                    rc = CM_EINVAL;
                }
            s->n++;
        }
    }
    if (rc == CM_OK && s->n == 0) {
        fprintf(stderr, "error: --uids: no expert given\n");
        rc = CM_EINVAL;
    }
    free(copy);
    return rc;
}

/* The run's config from the coordinator (GET /api/v1/runs/{run}). */
static int fetch_run(struct serve *s)
{
    char err[512];
    json_t *cfg = NULL;
    int rc = agent_run_config(&s->rt.coord, s->o.run, &cfg, NULL);
    if (rc != CM_OK)
        return rc;
    char *text = json_is_object(cfg) ? json_dumps(cfg, JSON_COMPACT) : NULL;
    json_decref(cfg);
    if (!text) {
        fprintf(stderr, "error: run '%s' has no config\n", s->o.run);
        return CM_EINVAL;
    }
    rc = moe_runcfg_parse(text, strlen(text), &s->rc, err, sizeof err);
    free(text);
    if (rc != CM_OK)
        fprintf(stderr, "error: the run's config: %s\n", err);
    return rc;
}

static int check_opts(struct serve *s)
{
    const char *bad = NULL;
    if (!s->o.run || !cm_name_valid(s->o.run) || moe_run_check(s->o.run) != CM_OK)
        bad = "--run RUN is required (see --help)";
    else if ((s->o.experts > 0) == (s->o.uids != NULL))
        bad = "give exactly one of --experts N and --uids LIST";
    else if (s->o.experts < 0 || s->o.experts > SERVE_MAX_EXPERTS)
        bad = "--experts must be from 1 to 256";
    else if (s->o.max_experts < 0 || s->o.max_experts > SERVE_MAX_EXPERTS)
        bad = "--max-experts must be from 0 (no takeover) to 256";
    else if (s->o.device && strcmp(s->o.device, "cpu") && strcmp(s->o.device, "cuda") &&
             strcmp(s->o.device, "auto"))
        bad = "--device must be cpu, cuda or auto";
    else if (s->o.dht_port < 0 || s->o.dht_port > 65535 || s->o.ar_port < 0 || s->o.ar_port > 65535)
        bad = "--dht-port and --ar-port must be from 0 (any) to 65535";
    else if (s->o.max_batch < 0 || s->o.max_batch > 65536 || s->o.max_wait_ms < 0 || s->o.max_wait_ms > 10000)
        bad = "--max-batch must be from 1 to 65536 and --max-wait-ms from 1 to 10000 (0: the run's)";
    else if (!(s->o.fail_prob >= 0 && s->o.fail_prob < 1))
        bad = "--fail-prob must be in [0, 1)";
    else if (s->o.delay_ms < 0 || s->o.delay_ms > 600000)
        bad = "--delay-ms must be from 0 to 600000";
    else if (s->o.status_every < 1 || s->o.status_every > 86400)
        bad = "--status-every must be from 1 to 86400 seconds";
    if (bad)
        fprintf(stderr, "error: %s\n", bad);
    return bad ? -1 : 0;
}

static void status_line(struct serve *s, const struct moe_server_stats *st, const char *what)
{
    printf("%s: %zu experts (%s%s), %llu requests, %llu samples, mean batch %.1f, %llu failures "
           "(%llu injected), %llu timeouts, %llu updates\n",
           what, s->n, s->uid_str[0], s->n > 1 ? ", ..." : "", (unsigned long long)st->requests,
           (unsigned long long)st->samples, st->mean_batch, (unsigned long long)st->failures,
           (unsigned long long)st->injected, (unsigned long long)st->timeouts,
           (unsigned long long)st->updates);
    fflush(stdout);
}

/* Everything before serving; 0 or 1 on failure. */
static int start(struct serve *s)
{
    if (peer_rt_start(&s->rt, PEER_STAGE_PASS) != CM_OK || g_interrupts || fetch_run(s) != CM_OK ||
        peer_rt_start(&s->rt, PEER_STAGE_NET) != CM_OK || g_interrupts)
        return 1;
    if (!s->rt.st_addr[0] || snprintf(s->addr.addr, sizeof s->addr.addr, "%s", s->rt.st_addr) >=
                                 (int)sizeof s->addr.addr || moe_addr_check(s->addr.addr) != CM_OK) {
        fprintf(stderr, "error: no address trainers can reach this server at (\"%s\")\n", s->rt.st_addr);
        return 1;
    }
    memcpy(s->addr.pub, s->rt.key.pub, 32);
    int rc = s->o.uids ? parse_uids(s) : pick_experts(s);
    if (rc == CM_ERANGE)
        fprintf(stderr, "error: --experts reads every prefix key of the grid, too many here: give --uids\n");
    if (rc != CM_OK)
        return 1;
    if (s->o.max_experts && (size_t)s->o.max_experts < s->n) {
        fprintf(stderr, "error: --max-experts %ld is below the %zu experts this server starts with\n",
                s->o.max_experts, s->n);
        return 1;
    }
    for (size_t i = 0; i < s->n; i++) {
        moe_uid_format(&s->rc.grid, &s->uids[i], s->uid_str[i], sizeof s->uid_str[i]);
        s->ckpt_step[i] = -1;
    }

    struct server_job j = {.s = s};
    moe_server_config_default(&j.cfg);
    char why[256] = "";
    const char *dev = s->o.device ? s->o.device : s->rc.tc.device;
    if ((rc = kern_backend_pick_for(dev, NULL, &j.cfg.be, why, sizeof why)) != CM_OK) {
        fprintf(stderr, "error: --device %s: %s\n", dev, why);
        return 1;
    }
    j.cfg.max_batch = (uint32_t)(s->o.max_batch ? s->o.max_batch : s->rc.serve.max_batch);
    j.cfg.max_wait_ms = (uint32_t)(s->o.max_wait_ms ? s->o.max_wait_ms : s->rc.serve.max_wait_ms);
    j.cfg.optim = s->rc.optim;
    j.cfg.fail_p = s->o.fail_prob;
    j.cfg.delay_mean_ms = (uint32_t)s->o.delay_ms;
    if (s->o.delay_ms > 0)
        fprintf(stderr, "warning: --delay-ms %ld: this server delays its answers on purpose (a test)\n",
                s->o.delay_ms);
    cm_random_bytes(&j.cfg.seed, sizeof j.cfg.seed);
    if (s->o.fail_prob > 0)
        fprintf(stderr, "warning: --fail-prob %g: this server fails calls on purpose (a test)\n", s->o.fail_prob);
    rc = peer_net_call(s->rt.net, server_start_on_loop, &j);
    if (rc == CM_OK)
        rc = j.rc;
    if (rc != CM_OK) {
        fprintf(stderr, "error: starting the expert server%s%s: %s\n", j.uid[0] ? " at " : "", j.uid,
                cm_strerror(rc));
        return 1;
    }
    /* each expert from its newest checkpoint when the uid has one */
    size_t loaded = 0;
    for (size_t i = 0; i < s->n && !g_interrupts; i++) {
        struct moe_xckpt_info in;
        char err[512];
        rc = moe_xckpt_load(&s->rt.coord, s->o.run, s->rt.rundir, s->srv, s->uid_str[i], s->rc.C, s->rc.F, &in,
                            err, sizeof err);
        if (rc == CM_OK) {
            printf("loaded %s from its checkpoint of step %ld (sha256 %.16s..., params sha256 %.16s...)\n",
                   s->uid_str[i], in.step, in.sha256, in.params_sha256);
            s->ckpt_step[i] = in.step;
            loaded++;
        } else if (rc != CM_ENOTFOUND) {
            fprintf(stderr, "warning: %s starts from the run's initial parameters: its checkpoint: %s\n",
                    s->uid_str[i], err);
        }
    }
    if (loaded < s->n)
        printf("%zu of %zu experts start from the run's initial parameters (no checkpoint of theirs)\n",
               s->n - loaded, s->n);
    if ((rc = declare(s)) != CM_OK && !s->declared_until) {
        fprintf(stderr, "error: declaring the experts on the DHT: %s\n", cm_strerror(rc));
        return 1;
    }
    printf("serving %zu experts of run '%s' at %s (%s, width %d, hidden %d, batch <= %u, wait <= %u ms), "
           "declared for %d s:", s->n, s->o.run, s->addr.addr, j.cfg.be->name, s->rc.C, s->rc.F,
           j.cfg.max_batch, j.cfg.max_wait_ms, s->rc.serve.declare_ttl_s);
    for (size_t i = 0; i < s->n; i++)
        printf(" %s", s->uid_str[i]);
    printf("\n");
    fflush(stdout);
    return 0;
}

/* Uploads each expert whose state changed since its last stored
 * checkpoint (model.experts.serve.checkpoint_every_s). */
static void checkpoint_all(struct serve *s)
{
    size_t up = 0, failed = 0;
    long lo = -1, hi = -1;
    for (size_t i = 0; i < s->n && !g_interrupts; i++) {
        size_t n = 0;
        long step = -1;
        /* the step says whether the expert changed: one update per backward batch */
        if (moe_server_expert_size(s->srv, s->uid_str[i], &n, &step) == CM_OK && step == s->ckpt_step[i])
            continue;
        struct moe_xckpt_info in;
        char err[512];
        int rc = moe_xckpt_upload(&s->rt.coord, s->o.run, s->rt.rundir, s->srv, s->uid_str[i], s->rc.C,
                                  s->rc.F, &in, err, sizeof err);
        if (rc != CM_OK) {
            if (!failed++)
                fprintf(stderr, "warning: checkpointing %s: %s\n", s->uid_str[i], err);
            continue;
        }
        if (in.step != s->ckpt_step[i])
            up++;
        s->ckpt_step[i] = in.step;
        lo = lo < 0 || in.step < lo ? in.step : lo;
        hi = in.step > hi ? in.step : hi;
    }
    if (up || failed)
        printf("checkpoints: %zu of %zu experts uploaded (steps %ld..%ld), %zu failed\n", up, s->n, lo, hi, failed);
    fflush(stdout);
}

/* --max-experts: adopts uids that have fewer live servers than the run's
 * replicas (counted from the DHT's leaf records, other servers only) and a
 * checkpoint on the coordinator, up to the capacity; each is fetched and
 * checked before it is hosted, loaded, then the whole set is declared.
 * Returns how many it took. */
static size_t take_over(struct serve *s)
{
    size_t room = (size_t)s->o.max_experts > s->n ? (size_t)s->o.max_experts - s->n : 0;
    if (!room)
        return 0;
    struct moe_uid *have = calloc(SERVE_MAX_LEAF_KEYS, sizeof *have);
    size_t nh = 0, took = 0;
    int rc = have ? moe_xckpt_list(&s->rt.coord, s->o.run, &s->rc.grid, have, SERVE_MAX_LEAF_KEYS, &nh)
                  : CM_ENOMEM;
    if (rc == CM_OK && nh)
        rc = read_live(s);
    if (rc != CM_OK) {
        fprintf(stderr, "warning: looking for experts to take over: %s\n", cm_strerror(rc));
        free(have);
        return 0;
    }
    for (size_t k = 0; k < nh && took < room && !g_interrupts; k++) {
        int ours = 0;
        for (size_t i = 0; i < s->n && !ours; i++)
            ours = moe_uid_equal(&s->uids[i], &have[k]);
        if (ours || s->live[cell_of(&s->rc.grid, &have[k])] >= (uint16_t)s->rc.serve.replicas)
            continue;
        char uid[MOE_UID_TEXT_MAX], err[512];
        moe_uid_format(&s->rc.grid, &have[k], uid, sizeof uid);
        struct cm_ckpt c;
        struct moe_xckpt_info in;
        if ((rc = moe_xckpt_fetch(&s->rt.coord, s->o.run, s->rt.rundir, uid, s->rc.C, s->rc.F, &c, &in, err,
                                  sizeof err)) != CM_OK) {
            fprintf(stderr, "warning: not taking over %s: its checkpoint: %s\n", uid, err);
            continue;
        }
        struct add_job j = {s, uid, moe_runcfg_expert_seed(&s->rc, &have[k]), CM_OK};
        rc = peer_net_call(s->rt.net, server_add_on_loop, &j);
        if (rc == CM_OK)
            rc = j.rc;
        if (rc == CM_OK)
            rc = moe_xckpt_apply(s->srv, uid, &c);
        cm_ckpt_cleanup(&c);
        if (rc != CM_OK) {
            /* hosted but never declared: no trainer finds it */
            fprintf(stderr, "warning: taking over %s: %s\n", uid, cm_strerror(rc));
            continue;
        }
        s->uids[s->n] = have[k];
        snprintf(s->uid_str[s->n], sizeof s->uid_str[0], "%s", uid);
        s->ckpt_step[s->n] = in.step;
        s->n++;
        took++;
        printf("took over %s from its checkpoint of step %ld (sha256 %.16s..., params sha256 %.16s...): "
               "%d live server%s had it, the run wants %d\n", uid, in.step, in.sha256, in.params_sha256,
               s->live[cell_of(&s->rc.grid, &have[k])], s->live[cell_of(&s->rc.grid, &have[k])] == 1 ? "" : "s",
               s->rc.serve.replicas);
    }
    free(have);
    fflush(stdout);
    return took;
}

static void serve_loop(struct serve *s)
{
    double t0 = peer_mono_s(), next_status = t0 + (double)s->o.status_every;
    double period = (double)s->rc.serve.declare_ttl_s / 3.0, next_declare = t0 + period;
    /* the first checkpoints at once: a server killed early still leaves them */
    double next_ckpt = t0;
    while (!g_interrupts) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        double now = peer_mono_s();
        if (now >= next_ckpt) {
            checkpoint_all(s);
            next_ckpt = peer_mono_s() + (double)s->rc.serve.checkpoint_every_s;
        }
        if (now >= next_declare) {
            /* adopted experts are declared with the others, at once */
            if (take_over(s) > 0)
                printf("declaring %zu experts\n", s->n);
            int rc = declare(s);
            if (rc != CM_OK)
                fprintf(stderr, "warning: re-declaring the experts: %s (declared until %.1f s from now)\n",
                        cm_strerror(rc), (double)(s->declared_until - p2p_now_ms()) / 1000.0);
            next_declare = peer_mono_s() + period;
        }
        if (now >= next_status) {
            struct moe_server_stats st;
            moe_server_stats(s->srv, &st);
            status_line(s, &st, "status");
            next_status = now + (double)s->o.status_every;
        }
        peer_rt_renew_pass_if_due(&s->rt);
    }
}

int agent_cmd_serve_experts(int argc, char **argv)
{
    struct serve *s = calloc(1, sizeof *s);
    if (!s)
        return 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    int status = 2, rc = cm_opts_parse(&SERVE, &s->o, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        status = rc == 1 ? 0 : 2;
        goto done;
    }
    struct peer_rt_config cfg = {0};
    struct peer_role role = {"serve-experts", s, NULL, NULL, NULL, NULL};
    cfg.run = s->o.run;
    cfg.coordinator = s->o.coordinator;
    cfg.config_dir = s->o.config_dir;
    cfg.listen_ip = s->o.listen_ip;
    cfg.advertise_ip = s->o.advertise_ip;
    cfg.must_accept = 1; /* trainers must reach us */
    cfg.dht_port = (uint16_t)s->o.dht_port;
    cfg.ar_port = (uint16_t)s->o.ar_port;
    cfg.interrupted = &g_interrupts;
    cfg.on_other = serve_on_request;
    cfg.on_other_arg = s;
    peer_rt_init(&s->rt, &cfg, &role);
    if (check_opts(s) != 0)
        goto out;
    status = 1;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s->rt.coord.cancel = &g_interrupts;
    int failed = start(s);
    s->rt.coord.cancel = NULL;
    if (!failed && !g_interrupts)
        serve_loop(s);
    if (g_interrupts)
        printf("stopping (%s)\n", g_signal == SIGTERM ? "SIGTERM" : "Ctrl-C");
    if (s->rt.net) {
        struct server_job j = {.s = s};
        int had = s->srv != NULL;
        peer_net_call(s->rt.net, server_stop_on_loop, &j);
        withdraw(s);
        if (had)
            status_line(s, &j.st, "stopped");
    }
    /* Ctrl-C while serving is the normal end; during start-up it is not */
    status = !failed ? 0 : g_interrupts ? 128 + g_signal : 1;
out:
    peer_rt_cleanup(&s->rt);
done:
    cm_opts_free(&SERVE, &s->o);
    free(s->live);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return status;
}
