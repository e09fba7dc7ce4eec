/* crowdtrain-agent pipeline: a volunteer runs one stage of a pipeline run
 * (DT-FM, seed 003_f3537b728458fcc1.txt §2: tasklet t_ij is stage j of
 * micro-batch i; docs/pipelines.md, "Stage agents"). A role of the peer
 * runtime (agent/peer/runtime.h), started up to its net stage:
 *
 *   session -> access pass -> the run's config (its GPT recipe and its
 *   `pipeline` object) -> p2p node (must accept connections: neighbours
 *   send to us) -> our address on the run's DHT ("RUN/pipe/peers"), the
 *   round trips to the other stage agents (rtt.c) and a capability report
 *   with our measured speed and those round trips -> the coordinator's signed
 *   assignment (GET /runs/RUN/pipeline, verified with the pass's
 *   coordinator keys before it is parsed) -> our stage's model (the same
 *   initial parameters as the whole model's: kern_tfm_stage_new) -> steps.
 *
 * One step, for M = batch_size / micro_batch micro-batches:
 *   stage 0 reads micro-batch i, runs its layers and sends the activations
 *   (and the targets) to stage 1; each stage runs its layers on what it is
 *   sent and passes the result on; the last one computes the loss, starts
 *   the backward pass (gradient scale 1/M) and sends the gradients of its
 *   input back; each stage runs its backward pass and sends its input's
 *   gradients on, to stage 0 (stage_step.c interleaves the micro-batches
 *   1F1B).
 *   Then the first and the last stage exchange the tied embedding's
 *   gradient (each adds the other's: both hold wte), every stage sends the
 *   squared norm of its gradients to every other (the last stage without
 *   wte, counted once), and each applies its optimizer with the global norm
 *   (kern_optim_step_norm): every stage takes the step the single-process
 *   model would take, so the loss per step is that of `train --local`.
 *
 * With D replicas (pipeline.replicas), pipeline i takes micro-batches i,
 * i + D, ... of the step, and the D agents of each stage average its
 * gradients with the butterfly all-reduce before the norm and the step
 * (seed 003 §2: stage j's data-parallel group).
 *
 * stage_step.c runs a replica's micro-batches 1F1B with sender threads;
 * resched.c re-schedules when a stage agent leaves; rtt.c measures the
 * round trips the schedule's delays come from. Not yet (docs/pipelines.md,
 * "What is not there yet"): stage checkpoints on the coordinator. */
#include "agent/pipe/stage_int.h"
#include "agent/pipe/records.h"

#include "agent/commands.h"
#include "agent/train/steplog.h"
#include "cm_err.h"
#include "cm_opts.h"
#include "ar/ar.h"
#include "sched/dtfm_payload.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define O(f) offsetof(struct stage_opts, f)
static const struct cm_opt STAGE_OPTS[] = {
    {"run", CM_OPT_STR, O(run), NULL, "RUN", "the pipeline run (its config has a pipeline object)", 0},
    {"steps", CM_OPT_INT, O(steps), "0", "N", "optimizer steps to train (0: the run's)", 0},
    {"device", CM_OPT_STR, O(device), NULL, "DEV", "cpu, cuda or auto (default: the run's)", 0},
    {"step-log", CM_OPT_STR, O(step_log), NULL, "FILE",
     "append one JSON line per step: stage, loss (last stage), parameter hash, norm, times", 0},
    {"stage-timeout-ms", CM_OPT_INT, O(stage_timeout_ms), "60000", "MS",
     "longest wait for a neighbour stage's activations, gradients or norm before giving up", 0},
    {"wait-s", CM_OPT_INT, O(wait_s), "600", "S",
     "longest wait for an assignment that gives us a stage, and for the other stages' addresses", 0},
    {"coordinator", CM_OPT_STR, O(coordinator), NULL, "URL",
     "the coordinator (default: the one you logged in to)", 0},
    {"config-dir", CM_OPT_STR, O(config_dir), NULL, "DIR", "state directory (default ~/.config/crowdtrain)", 0},
    {"listen-ip", CM_OPT_STR, O(listen_ip), "0.0.0.0", "IP", "address the other stages connect to us on", 0},
    {"advertise-ip", CM_OPT_STR, O(advertise_ip), NULL, "IP",
     "address announced to the other stages, unchecked (default: the address the coordinator sees us "
     "at, once it reached us there)", 0},
    {"dht-port", CM_OPT_INT, O(dht_port), "0", "PORT", "DHT port, 0 = any", 0},
    {"ar-port", CM_OPT_INT, O(ar_port), "0", "PORT", "averaging port, 0 = any", 0},
    {"samples-per-s", CM_OPT_DBL, O(samples_per_s), "0", "X",
     "declare this device's speed (samples per second of the whole model) instead of measuring it; the "
     "coordinator gives stages to the fastest devices", 0},
    {"max-cpu-percent", CM_OPT_DBL, O(max_cpu_percent), "0", "P",
     "use at most about P% of this machine's CPU time, all cores counted (25 on 8 cores: two cores' worth), "
     "0 = no limit; the speed reported is the limited one", 0},
    {"max-upload-mbps", CM_OPT_DBL, O(max_upload_mbps), "0", "MBPS",
     "upload cap, 0 = none (the coordinator plans with it; a little under a home line's rate also keeps "
     "the router's buffer from filling)", 0},
    {"max-download-mbps", CM_OPT_DBL, O(max_download_mbps), "0", "MBPS", "download cap, 0 = none", 0},
    {"pace", CM_OPT_DBL, O(pace), "0.92", "F",
     "without caps: after measuring the link, send and receive at most F x its rates, so that the queue "
     "stays in this agent and not in the router's buffer (where it delays everything else); 0 = off", 0},
    {"latency-ms", CM_OPT_INT, O(latency_ms), "0", "MS",
     "add this one-way delay to every frame sent (latency emulation for tests and benchmarks)", 0},
    {"latency-to", CM_OPT_STR, O(latency_to), NULL, "NET=MS,...",
     "add a one-way delay to the frames sent to these networks instead (e.g. 10.77.0.128/25=40: "
     "benchmarks of regions; up to 8 rules, the first match wins, --latency-ms elsewhere)", 0},
};
static const struct cm_cmd_spec STAGE_SPEC = {
    "crowdtrain-agent pipeline --run RUN [options]",
    "Runs one stage of a pipeline run (DT-FM) with the session of\n"
    "'crowdtrain-agent login': the model is cut into the run's pipeline.stages\n"
    "consecutive stages, and the coordinator assigns each stage to one\n"
    "volunteer from the capability reports (measured speed and links). This\n"
    "agent reports its speed, waits for an assignment that gives it a stage\n"
    "(printing why while there is none: too few volunteers yet), builds that\n"
    "stage's part of the model, and trains: activations go to the next stage,\n"
    "their gradients come back, and every stage applies the same optimizer step\n"
    "the whole model would. The other stages must reach us: a host the\n"
    "coordinator cannot dial back is refused (forward the ports, or give\n"
    "--advertise-ip). With pipeline.replicas D, D pipelines each take 1/D of the\n"
    "step's micro-batches and the D agents of each stage average its gradients\n"
    "before the step. A stage whose neighbour is gone for --stage-timeout-ms\n"
    "waits for the coordinator's next assignment without that agent and goes on\n"
    "from the newest state the stage's holders have. Before its first capability\n"
    "report the agent measures its round trips to the other stage agents (up to\n"
    "20 s) so that the schedule sees every link's delay. Ctrl-C stops.",
    STAGE_OPTS, sizeof STAGE_OPTS / sizeof STAGE_OPTS[0], 1};

volatile sig_atomic_t pipe_g_interrupts;
static volatile sig_atomic_t g_signal;
static void on_signal(int sig)
{
    pipe_g_interrupts++;
    g_signal = sig;
}

/* --latency-to's rules into s; 1 (and why) when they do not parse. */
static int latency_to_bad(struct pstage *s, char *why, size_t cap)
{
    char err[160];
    if (p2p_latency_rules_parse(s->o.latency_to, s->lat_rules, P2P_MAX_LATENCY_RULES, &s->n_lat_rules, err,
                                sizeof err) == CM_OK)
        return 0;
    snprintf(why, cap, "--latency-to: %s", err);
    return 1;
}

static int check_opts(struct pstage *s)
{
    const char *bad = NULL;
    char why[200] = "";
    if (!s->o.run || !cm_name_valid(s->o.run))
        bad = "--run RUN is required (see --help)";
    else if (s->o.steps < 0)
        bad = "--steps must be 0 (the run's) or positive";
    else if (s->o.device && strcmp(s->o.device, "cpu") && strcmp(s->o.device, "cuda") &&
             strcmp(s->o.device, "auto"))
        bad = "--device must be cpu, cuda or auto";
    else if (s->o.dht_port < 0 || s->o.dht_port > 65535 || s->o.ar_port < 0 || s->o.ar_port > 65535)
        bad = "--dht-port and --ar-port must be from 0 (any) to 65535";
    else if (s->o.stage_timeout_ms < 1000 || s->o.stage_timeout_ms > 3600000)
        bad = "--stage-timeout-ms must be from 1000 to 3600000";
    else if (s->o.wait_s < 1 || s->o.wait_s > 86400)
        bad = "--wait-s must be from 1 to 86400";
    else if (s->o.latency_ms < 0 || s->o.latency_ms > 10000)
        bad = "--latency-ms must be from 0 to 10000";
    else if (s->o.latency_to && latency_to_bad(s, why, sizeof why))
        bad = why;
    else if (!(s->o.max_upload_mbps == 0 || (s->o.max_upload_mbps >= 0.1 && s->o.max_upload_mbps <= 1e6)) ||
             !(s->o.max_download_mbps == 0 || (s->o.max_download_mbps >= 0.1 && s->o.max_download_mbps <= 1e6)))
        bad = "--max-upload-mbps and --max-download-mbps must be 0 (no cap) or from 0.1 to 1000000";
    else if (!(s->o.pace == 0 || (s->o.pace >= 0.5 && s->o.pace <= 1)))
        bad = "--pace must be 0 (off) or from 0.5 to 1";
    else if (!(s->o.samples_per_s >= 0 && s->o.samples_per_s <= 1e9))
        bad = "--samples-per-s must be from 0 (measure) to 1e9";
    else if (s->o.max_cpu_percent != 0 && !(s->o.max_cpu_percent >= 1 && s->o.max_cpu_percent <= 100))
        bad = "--max-cpu-percent must be 0 (no limit) or from 1 to 100";
    if (bad)
        fprintf(stderr, "error: %s\n", bad);
    return bad ? -1 : 0;
}

/* The run's config (GET /api/v1/runs/{run}): its GPT recipe and its
 * pipeline object (docs/pipelines.md, "The run's config"). */
static int fetch_run(struct pstage *s)
{
    char err[512];
    json_t *cfg = NULL;
    int rc = agent_run_config(&s->rt.coord, s->o.run, &cfg, NULL);
    if (rc != CM_OK)
        return rc;
    json_t *pl = json_object_get(cfg, "pipeline");
    json_t *js = json_object_get(pl, "stages"), *jd = json_object_get(pl, "replicas");
    if (!json_is_object(pl) || !json_is_integer(js) || !json_is_integer(jd)) {
        fprintf(stderr, "error: run '%s' is not a pipeline run (its config has no pipeline object with "
                        "stages and replicas; docs/pipelines.md)\n", s->o.run);
        json_decref(cfg);
        return CM_EINVAL;
    }
    json_int_t S = json_integer_value(js), D = json_integer_value(jd);
    json_t *jm = json_object_get(pl, "min_replicas"), *jl = json_object_get(pl, "liveness_s");
    json_int_t minD = json_is_integer(jm) ? json_integer_value(jm) : D;
    json_int_t live = json_is_integer(jl) ? json_integer_value(jl) : 120;
    /* activations and their gradients on the wire (docs/pipelines.md,
       "The run's config"): fp32, or fp16 with "compression": "fp16" */
    json_t *jc = json_object_get(pl, "compression");
    const char *comp = json_is_string(jc) ? json_string_value(jc) : "none";
    if (jc && !(json_is_string(jc) && (!strcmp(comp, "none") || !strcmp(comp, "fp16")))) {
        fprintf(stderr, "error: run '%s': pipeline.compression must be \"none\" or \"fp16\"\n", s->o.run);
        json_decref(cfg);
        return CM_EINVAL;
    }
    s->act_enc = !strcmp(comp, "fp16") ? PIPE_ENC_FP16 : PIPE_ENC_FP32;
    json_object_del(cfg, "pipeline");
    json_object_del(cfg, "collaboration");
    char *text = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    if (!text)
        return CM_ENOMEM;
    rc = agent_train_config_parse(text, strlen(text), NULL, &s->tc, err, sizeof err);
    free(text);
    if (rc != CM_OK) {
        fprintf(stderr, "error: the run's training recipe: %s\n", err);
        return rc;
    }
    if (s->tc.kind != KERN_MODEL_GPT) {
        fprintf(stderr, "error: run '%s': only a gpt model runs as pipeline stages\n", s->o.run);
        return CM_EINVAL;
    }
    if (S < 1 || S > s->tc.tfm.n_layer || S > PIPE_MAX_STAGES) {
        fprintf(stderr, "error: run '%s': pipeline.stages %lld: from 1 to the model's %d layers\n", s->o.run,
                (long long)S, s->tc.tfm.n_layer);
        return CM_EINVAL;
    }
    int M = s->tc.batch_size / s->tc.micro_batch;
    if (D < 1 || D > PIPE_MAX_STAGES || D > AR_MAX_MEMBERS || M % D) {
        fprintf(stderr, "error: run '%s': pipeline.replicas %lld: each replica takes the same share of the "
                        "step's %d micro-batches (batch_size / micro_batch), so it must divide them\n",
                s->o.run, (long long)D, M);
        return CM_EINVAL;
    }
    if (minD < 1 || minD > D || live < 10) {
        fprintf(stderr, "error: run '%s': pipeline.min_replicas must be from 1 to replicas, liveness_s at "
                        "least 10\n", s->o.run);
        return CM_EINVAL;
    }
    s->S = (uint32_t)S;
    s->D = s->D_cfg = (uint32_t)D;
    s->min_replicas = (uint32_t)minD;
    /* our capability report must not expire while we are alive */
    s->rt.cfg.caps_every_s = (double)live / 3;
    if (s->o.steps > 0)
        s->tc.steps = s->o.steps;
    if (s->o.device)
        snprintf(s->tc.device, sizeof s->tc.device, "%s", s->o.device);
    if (s->o.max_cpu_percent > 0) /* paced between micro-batches (stage_step.c) */
        agent_cpu_limit_apply(&s->cpu, s->o.max_cpu_percent, &s->tc.threads);
    return CM_OK;
}

#define SPEED_TRIES 6

static double process_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Samples per second of the whole model on this device, from timing
 * micro-batches of the first stage of an even split (a stage is 1/S of the
 * layers), for the capability report the coordinator assigns stages from. */
static int measure_speed(struct pstage *s)
{
    struct kern_tfm_stage st[PIPE_MAX_STAGES];
    struct agent_trainer t;
    char err[512];
    int rc = kern_tfm_stages_split(&s->tc.tfm, (int)s->S, st);
    if (rc == CM_OK && (rc = agent_trainer_init_stage(&t, &s->tc, &st[0], err, sizeof err)) != CM_OK)
        fprintf(stderr, "error: %s\n", err);
    if (rc != CM_OK)
        return rc;
    size_t n = (size_t)s->tc.micro_batch * (size_t)s->tc.tfm.max_T * (size_t)s->tc.tfm.d_model;
    float *x = st[0].has_head ? NULL : calloc(n, sizeof *x);
    float *dx = st[0].has_head ? NULL : calloc(n, sizeof *dx);
    /* the fastest of SPEED_TRIES micro-batches after a warm-up one: the
       others were slowed by whatever else ran (other processes, caches) */
    double secs = INFINITY, cpu = INFINITY;
    for (int i = 0; i <= SPEED_TRIES && rc == CM_OK; i++) {
        struct kern_batch kb;
        struct kern_eval ev = {0};
        if ((rc = agent_trainer_next_micro(&t, &kb)) != CM_OK)
            break;
        double t0 = peer_mono_s(), c0 = process_cpu_s();
        if (!st[0].has_head && (!x || !dx))
            rc = CM_ENOMEM;
        if (rc == CM_OK)
            rc = kern_tfm_stage_forward(t.model, &kb, NULL, x, st[0].has_head ? &ev : NULL);
        if (rc == CM_OK)
            rc = kern_tfm_stage_backward(t.model, dx, 1.0f, NULL);
        if (i > 0) { /* the first one warms up */
            secs = fmin(secs, peer_mono_s() - t0);
            cpu = fmin(cpu, process_cpu_s() - c0);
        }
    }
    free(x);
    free(dx);
    agent_trainer_cleanup(&t);
    if (rc != CM_OK) {
        fprintf(stderr, "error: timing this device: %s\n", cm_strerror(rc));
        return rc;
    }
    /* Under --max-cpu-percent the budget, not the wall clock, sets the
       pace: the CPU time they took, spread over the budget's cores (the
       wall time would count other processes' use of the cores too). */
    if (s->cpu.cores > 0)
        secs = cpu / s->cpu.cores;
    s->sps = s->tc.micro_batch / fmax(secs, 1e-6) / s->S;
    return CM_OK;
}

/* Our address on the run's DHT, for the other stages. */
static int announce(struct pstage *s)
{
    char key[160], val[2 * PEER_ADDR_MAX + 2];
    snprintf(key, sizeof key, PIPE_PEERS_KEY_FMT, s->o.run);
    snprintf(val, sizeof val, "%s %s", s->rt.st_addr, s->rt.my_addr);
    return peer_net_put(s->rt.net, key, val, strlen(val), 120000);
}

/* Our addresses again every ANNOUNCE_EVERY_S: a record stored while few
 * agents had joined lives on those nodes only, and a lookup answers from
 * the first sources it finds; putting it again stores it on the nodes
 * closest to the key now (and keeps it from expiring). */
#define ANNOUNCE_EVERY_S 10.0
void pipe_keep_announced(struct pstage *s)
{
    double now = peer_mono_s();
    if (now < s->next_announce)
        return;
    if (announce(s) != CM_OK)
        fprintf(stderr, "warning: announcing our addresses on the run's DHT failed; trying again\n");
    s->next_announce = now + ANNOUNCE_EVERY_S;
}

/* Sets *sa and str from text when it is a valid address other than the
 * one held; 1 when it changed. */
static int set_addr(const char *text, struct sockaddr_storage *sa, char *str, const char *what, uint32_t j)
{
    struct sockaddr_storage a;
    if (p2p_addr_parse(text, &a) != CM_OK || !strcmp(text, str))
        return 0;
    if (str[0])
        printf("%s %u is now at %s (was %s)\n", what, j, text, str);
    *sa = a;
    snprintf(str, PEER_ADDR_MAX, "%s", text);
    return 1;
}

int pipe_resolve(struct pstage *s, int only)
{
    char key[160];
    snprintf(key, sizeof key, PIPE_PEERS_KEY_FMT, s->o.run);
    struct peer_record *r = NULL;
    size_t nr = 0;
    int rc = peer_net_get(s->rt.net, key, &r, &nr);
    if (rc != CM_OK)
        return rc;
    pthread_mutex_lock(&s->addr_mu); /* the senders' threads read them */
    for (size_t i = 0; i < nr; i++) {
        char st[PEER_ADDR_MAX], ar[PEER_ADDR_MAX];
        if (pipe_peers_parse(r[i].value, r[i].len, st, ar) != CM_OK)
            continue;
        for (uint32_t j = 0; j < s->S; j++)
            if (j != s->stage && (only < 0 || j == (uint32_t)only) &&
                !memcmp(r[i].author, s->keys[j], CM_ED25519_PUB_LEN))
                set_addr(st, &s->addr[j], s->addr_s[j], "stage", j);
        for (uint32_t k = 0; only < 0 && k < s->D; k++)
            if (k != s->replica && !memcmp(r[i].author, s->gkeys[k], CM_ED25519_PUB_LEN))
                set_addr(ar, &s->gaddr[k], s->gaddr_s[k], "replica", k);
    }
    pthread_mutex_unlock(&s->addr_mu);
    peer_records_free(r, nr);
    return CM_OK;
}

/* The coordinator's newest assignment, verified and decoded: CM_OK with
 * *p filled, CM_EBUSY (none yet: why on stdout when it changed), or an
 * error. */
static int fetch_assignment_with(struct pstage *s, const struct agent_client *coord, struct dtfm_payload *p,
                                 char *why, size_t cap)
{
    char path[256];
    snprintf(path, sizeof path, "/api/v1/runs/%s/pipeline", s->o.run);
    struct agent_reply r;
    int rc = agent_request(coord, "GET", path, NULL, &r);
    if (rc != CM_OK)
        return rc;
    if (r.status == 409 || r.status == 503) {
        const char *m = json_string_value(json_object_get(r.json, "message"));
        snprintf(why, cap, "%s", m ? m : "no assignment yet");
        agent_reply_free(&r);
        return CM_EBUSY;
    }
    if (r.status != 200) {
        agent_reply_report("reading the pipeline assignment", &r);
        agent_reply_free(&r);
        return CM_EPROTO;
    }
    const char *pb = json_string_value(json_object_get(r.json, "payload"));
    const char *sb = json_string_value(json_object_get(r.json, "signature"));
    uint8_t *payload = malloc(DTFM_PAYLOAD_MAX), sig[CM_ED25519_SIG_LEN];
    size_t plen = 0, slen = 0;
    rc = CM_EPARSE;
    if (payload && pb && sb && cm_b64url_decode(pb, strlen(pb), payload, DTFM_PAYLOAD_MAX, &plen) == CM_OK &&
        cm_b64url_decode(sb, strlen(sb), sig, sizeof sig, &slen) == CM_OK && slen == sizeof sig) {
        rc = CM_EBADSIG;
        for (size_t k = 0; k < s->rt.n_coord_keys && rc != CM_OK; k++)
            rc = dtfm_payload_verify(s->rt.coord_keys[k], payload, plen, sig);
    }
    agent_reply_free(&r);
    char err[256] = "";
    if (rc == CM_OK)
        rc = dtfm_payload_decode((const char *)payload, plen, p, err, sizeof err);
    free(payload);
    if (rc != CM_OK) {
        fprintf(stderr, "error: the pipeline assignment %s: %s\n",
                rc == CM_EBADSIG ? "is not signed by a key of this run's coordinator" : "is malformed",
                err[0] ? err : cm_strerror(rc));
        return rc;
    }
    int64_t now = peer_rt_now_ms(&s->rt) / 1000;
    if (strcmp(p->run, s->o.run) || p->stages != s->S || p->replicas > s->D_cfg ||
        p->replicas < s->min_replicas || now < p->valid_from - 60 || now >= p->valid_until) {
        fprintf(stderr, "error: the pipeline assignment is for run '%s' (%zu stages x %zu), valid %lld..%lld, "
                        "not for this run now\n", p->run, p->stages, p->replicas, (long long)p->valid_from,
                (long long)p->valid_until);
        dtfm_payload_cleanup(p);
        return CM_EINVAL;
    }
    return CM_OK;
}

static int fetch_assignment(struct pstage *s, struct dtfm_payload *p, char *why, size_t cap)
{
    return fetch_assignment_with(s, &s->rt.coord, p, why, cap);
}

int64_t pipe_served_version(struct pstage *s)
{
    struct dtfm_payload p;
    char why[256];
    if (fetch_assignment(s, &p, why, sizeof why) != CM_OK)
        return -1;
    int64_t v = p.version;
    dtfm_payload_cleanup(&p);
    return v;
}

/* The served assignment when *next (mono s) is due: asked every
 * PIPE_VERSION_EVERY_S, with a short timeout (a coordinator slower than
 * that is asked again later, not waited for), after a failure only in
 * PIPE_VERSION_BACKOFF_S. CM_OK with *p filled. */
static int fetch_when_due(struct pstage *s, double *next, struct dtfm_payload *p)
{
    double now = peer_mono_s();
    if (now < *next)
        return CM_EBUSY;
    *next = now + PIPE_VERSION_EVERY_S;
    struct agent_client quick = s->rt.coord;
    quick.timeout_ms = PIPE_VERSION_TIMEOUT_MS;
    char why[256];
    int rc = fetch_assignment_with(s, &quick, p, why, sizeof why);
    if (rc != CM_OK && rc != CM_EBUSY)
        *next = now + PIPE_VERSION_BACKOFF_S;
    return rc;
}

/* The served assignment's version and slots, asked of the coordinator
 * every PIPE_VERSION_EVERY_S by the capability reports' thread, so that a
 * step never waits for the coordinator: the check sat before the
 * averaging, and the other replicas waited out its HTTPS request every
 * other step (bench_pipeline_hosts). */
void pipe_watch_version(struct pstage *s)
{
    struct dtfm_payload p;
    if (fetch_when_due(s, &s->watch_next, &p) != CM_OK)
        return;
    size_t n = p.stages * p.replicas;
    pthread_mutex_lock(&s->watch_mu);
    if (n <= PIPE_MAX_SLOTS) {
        s->watch_version = p.version;
        s->watch_n = n;
        memcpy(s->watch_assign, p.assign, n * CM_ED25519_PUB_LEN);
    }
    pthread_mutex_unlock(&s->watch_mu);
    dtfm_payload_cleanup(&p);
}

/* Whether a served assignment (version, n slots' keys) is newer than ours
 * with other slots. A re-solve that gives every slot to the same agent (the
 * coordinator solves again when an assignment ages, or figures moved)
 * changes nothing for the stages: they keep working under the version they
 * entered, which names their averaging groups. Only new slots move them. */
typedef const uint8_t (*pipe_keys)[CM_ED25519_PUB_LEN];
static int other_slots(const struct pstage *s, int64_t version, size_t n, pipe_keys assign)
{
    return version > s->version && (n != s->n_members || memcmp(assign, s->all, n * CM_ED25519_PUB_LEN) != 0);
}

int pipe_newer_assignment(struct pstage *s, int gone_only)
{
    if (!gone_only) {
        /* the step's path: what the watcher saw last (pipe_watch_version) */
        pthread_mutex_lock(&s->watch_mu);
        int moved = other_slots(s, s->watch_version, s->watch_n, (pipe_keys)s->watch_assign);
        pthread_mutex_unlock(&s->watch_mu);
        return moved;
    }
    /* while waiting for a neighbour */
    struct dtfm_payload p;
    if (fetch_when_due(s, &s->next_version, &p) != CM_OK)
        return 0;
    int moved = other_slots(s, p.version, p.stages * p.replicas, (pipe_keys)p.assign);
    if (moved && gone_only) {
        /* only when an agent of our pipeline or of our stage's replicas is
           in it no more (dropped: it left) */
        int gone = 0;
        for (uint32_t j = 0; j < s->S + s->D && !gone; j++) {
            const uint8_t *k = j < s->S ? s->keys[j] : s->gkeys[j - s->S];
            size_t r, st;
            int spare = 0;
            for (size_t i = 0; i < p.nspares; i++)
                spare |= !memcmp(p.spares[i], k, CM_ED25519_PUB_LEN);
            gone = !spare && dtfm_payload_find(&p, k, &r, &st) != CM_OK;
        }
        moved = gone;
    }
    dtfm_payload_cleanup(&p);
    return moved;
}

int pipe_wait_assignment(struct pstage *s, int64_t after_version)
{
    double end = peer_mono_s() + (double)s->o.wait_s;
    char why[256], said[256] = "";
    int found = 0;
    while (!found) {
        if (pipe_g_interrupts)
            return CM_ECANCELED;
        if (peer_mono_s() > end) {
            fprintf(stderr, "error: no stage for this agent after %ld s (%s)\n", s->o.wait_s,
                    said[0] ? said : "no assignment");
            return CM_ETIMEOUT;
        }
        pipe_keep_announced(s);
        peer_rt_renew_pass_if_due(&s->rt);
        struct dtfm_payload p;
        int rc = fetch_assignment(s, &p, why, sizeof why);
        if (rc == CM_OK && p.version <= after_version) {
            snprintf(why, sizeof why, "the coordinator still serves assignment %lld", (long long)p.version);
            dtfm_payload_cleanup(&p);
            rc = CM_EBUSY;
        } else if (rc == CM_OK) {
            size_t replica, stage;
            int M = s->tc.batch_size / s->tc.micro_batch;
            if (M % (int)p.replicas) {
                fprintf(stderr, "error: assignment %lld has %zu pipelines, which do not divide the step's %d "
                                "micro-batches (choose pipeline.replicas and min_replicas so that every "
                                "count between them does)\n", (long long)p.version, p.replicas, M);
                dtfm_payload_cleanup(&p);
                return CM_EINVAL;
            }
            /* who is in it: its members, then its spares (who may hold state to serve) */
            s->n_members = p.stages * p.replicas;
            s->n_spares = p.nspares;
            memcpy(s->all, p.assign, s->n_members * CM_ED25519_PUB_LEN);
            if (s->n_spares)
                memcpy(s->all + s->n_members, p.spares, s->n_spares * CM_ED25519_PUB_LEN);
            s->version = p.version;
            s->ar_max_ms = 0; /* no averaging timed under it yet */
            if (dtfm_payload_find(&p, s->rt.key.pub, &replica, &stage) == CM_OK) {
                s->D = (uint32_t)p.replicas;
                s->replica = (uint32_t)replica;
                s->stage = (uint32_t)stage;
                s->version = p.version;
                for (uint32_t j = 0; j < s->S; j++)
                    memcpy(s->keys[j], p.assign[replica * s->S + j], CM_ED25519_PUB_LEN);
                for (uint32_t k = 0; k < s->D; k++)
                    memcpy(s->gkeys[k], p.assign[k * s->S + stage], CM_ED25519_PUB_LEN);
                memset(s->addr_s, 0, sizeof s->addr_s);
                memset(s->gaddr_s, 0, sizeof s->gaddr_s);
                printf("assignment version %lld: stage %u of %u of pipeline %u of %u (predicted %.2f s per "
                       "step, random assignment %.2f s)\n", (long long)p.version, s->stage, s->S, s->replica,
                       s->D, p.total_s, p.random_mean_s);
                fflush(stdout);
                found = 1;
            } else {
                snprintf(why, sizeof why, "assignment version %lld has no slot for us (a spare)",
                         (long long)p.version);
                rc = CM_EBUSY;
                if (s->have_tr && s->spare_served < p.version && pipe_spare_serve(s) == CM_OK)
                    s->spare_served = p.version;
                if (pipe_all_finished(s, s->tc.steps)) {
                    dtfm_payload_cleanup(&p);
                    s->run_finished = 1;
                    return CM_OK;
                }
            }
            dtfm_payload_cleanup(&p);
        }
        if (rc == CM_EBUSY && strcmp(why, said)) {
            printf("waiting for a stage: %s\n", why);
            fflush(stdout);
            snprintf(said, sizeof said, "%s", why);
        } else if (rc != CM_OK && rc != CM_EBUSY && rc != CM_ECONN && rc != CM_ETIMEOUT) {
            return rc;
        }
        if (!found)
            usleep(1000000);
    }
    /* the other stages' addresses */
    for (;;) {
        size_t missing = 0;
        pipe_keep_announced(s);
        pipe_resolve(s, -1);
        for (uint32_t j = 0; j < s->S; j++)
            missing += j != s->stage && !s->addr_s[j][0];
        for (uint32_t k = 0; k < s->D; k++)
            missing += k != s->replica && !s->gaddr_s[k][0];
        if (!missing)
            return CM_OK;
        if (pipe_g_interrupts)
            return CM_ECANCELED;
        if (peer_mono_s() > end) {
            fprintf(stderr, "error: %zu of the other agents of our pipeline and stage have no address on the "
                            "run's DHT after %ld s\n",
                    missing, s->o.wait_s);
            return CM_ETIMEOUT;
        }
        usleep(500000);
    }
}

/* Our capability report, renewed by a thread of its own every second (it
 * sends when a third of pipeline.liveness_s passed, or the figures
 * changed): a stage waiting on its neighbours or on an averaging round must
 * not look gone to the coordinator, which drops agents whose report
 * expired and re-schedules without them. */
static void *caps_thread(void *arg)
{
    struct pstage *s = arg;
    pthread_mutex_lock(&s->caps_mu);
    while (!s->caps_stop) {
        pthread_mutex_unlock(&s->caps_mu);
        /* the report first: it keeps us live (pipeline.liveness_s, as short
           as 10 s), and the Pings and the version check below may wait out
           their deadlines */
        peer_rt_report_caps(&s->rt, s->sps, 0);
        /* the run's agents read from the DHT every few seconds, not every
           second (64 agents would ask 64 times a second) */
        if (peer_mono_s() >= s->rtt_next) {
            pipe_rtt_tick(s);
            s->rtt_next = peer_mono_s() + PIPE_RTT_READ_EVERY_S;
        }
        pipe_watch_version(s);
        pthread_mutex_lock(&s->caps_mu);
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += 1;
        if (!s->caps_stop)
            pthread_cond_timedwait(&s->caps_cv, &s->caps_mu, &t);
    }
    pthread_mutex_unlock(&s->caps_mu);
    return NULL;
}

static void caps_stop(struct pstage *s)
{
    if (!s->caps_started)
        return;
    pthread_mutex_lock(&s->caps_mu);
    s->caps_stop = 1;
    pthread_cond_broadcast(&s->caps_cv);
    pthread_mutex_unlock(&s->caps_mu);
    pthread_join(s->caps_th, NULL);
    s->caps_started = 0;
}

/* Everything before the steps; 0, or 1 on failure (said on stderr). */
static int start(struct pstage *s)
{
    if (peer_rt_start(&s->rt, PEER_STAGE_PASS) != CM_OK || pipe_g_interrupts || fetch_run(s) != CM_OK ||
        peer_rt_start(&s->rt, PEER_STAGE_NET) != CM_OK || pipe_g_interrupts)
        return 1;
    if (!s->rt.st_addr[0] || !s->rt.my_addr[0]) {
        fprintf(stderr, "error: no address the other stages can reach this agent at\n");
        return 1;
    }
    if (peer_rt_start(&s->rt, PEER_STAGE_REPORTS) != CM_OK) /* contribution reports (stage_step.c) */
        return 1;
    if (s->o.samples_per_s > 0)
        s->sps = s->o.samples_per_s;
    else if (measure_speed(s) != CM_OK)
        return 1;
    printf("pipeline run '%s': %u stages, this device %s%.1f samples/s for the whole model; at %s\n", s->o.run,
           s->S, s->o.samples_per_s > 0 ? "(declared) " : "~", s->sps, s->rt.st_addr);
    fflush(stdout);
    /* our addresses first, then the round trips to the others (rtt.c), then
       the first capability report: the first assignment has every pair's
       delay */
    pipe_keep_announced(s);
    pipe_rtt_first(s);
    if (pipe_g_interrupts)
        return 1;
    if (pthread_create(&s->caps_th, NULL, caps_thread, s) != 0) {
        fprintf(stderr, "error: starting the capability reports' thread\n");
        return 1;
    }
    s->caps_started = 1;
    fflush(stdout);
    /* what may wait at once: the activations of as many micro-batches as
       the previous stage keeps in flight (S - stage + 1 <= S + 1, stage_step.c)
       and the gradients of ours (<= S), the tied gradient, the norms */
    size_t act = (size_t)s->tc.micro_batch * (size_t)s->tc.tfm.max_T * ((size_t)s->tc.tfm.d_model + 1) * 4;
    size_t tied = (size_t)s->tc.tfm.vocab * (size_t)s->tc.tfm.d_model * 4;
    struct pipe_inbox *ib;
    if (pipe_inbox_new(8 + 4 * (size_t)s->S, (2 * (size_t)s->S + 4) * act + 2 * tied + (1u << 20), &ib) != CM_OK)
        return 1;
    __atomic_store_n(&s->inbox, ib, __ATOMIC_RELEASE);
    return 0;
}

/* What the stage is, once an assignment was entered. */
static void say_stage(const struct pstage *s, int64_t from)
{
    printf("stage %u of pipeline %u: layers %d..%d%s%s, %zu parameters, from step %lld; previous stage %s, next "
           "stage %s\n", s->stage, s->replica, s->st.first_layer, s->st.first_layer + s->st.n_layers - 1,
           s->st.has_embed ? ", embedding" : "", s->st.has_head ? ", head and loss" : "", s->tr.model->nparams,
           (long long)from + 1, s->stage > 0 ? s->addr_s[s->stage - 1] : "(none: reads the data)",
           s->stage + 1 < s->S ? s->addr_s[s->stage + 1] : "(none: computes the loss)");
    fflush(stdout);
}

/* Whether a step's failure is a peer's (a stage agent left, a link broke):
 * then the agents re-schedule; otherwise this agent stops. */
static int peer_failure(int rc)
{
    /* CM_EAUTH: a neighbour that moved on to a newer assignment refuses us */
    /* CM_EVERSION: the coordinator serves a newer assignment */
    return rc == CM_ETIMEOUT || rc == CM_ECONN || rc == CM_ECLOSED || rc == CM_EBUSY || rc == CM_EPROTO ||
           rc == CM_EAUTH || rc == CM_EVERSION;
}

int agent_cmd_pipeline(int argc, char **argv)
{
    struct pstage *s = calloc(1, sizeof *s);
    if (!s)
        return 1;
    pthread_mutex_init(&s->caps_mu, NULL);
    pthread_mutex_init(&s->addr_mu, NULL);
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_cond_init(&s->caps_cv, NULL);
    int status = 2, rc = cm_opts_parse(&STAGE_SPEC, &s->o, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        status = rc == 1 ? 0 : 2;
        goto done;
    }
    struct peer_rt_config cfg = {0};
    struct peer_role role = {"pipeline", s, NULL, NULL, NULL, NULL, NULL};
    cfg.run = s->o.run;
    cfg.coordinator = s->o.coordinator;
    cfg.config_dir = s->o.config_dir;
    cfg.listen_ip = s->o.listen_ip;
    cfg.advertise_ip = s->o.advertise_ip;
    cfg.must_accept = 1; /* the other stages send to us */
    cfg.dht_port = (uint16_t)s->o.dht_port;
    cfg.ar_port = (uint16_t)s->o.ar_port;
    cfg.latency_ms = (uint32_t)s->o.latency_ms;
    cfg.interrupted = &pipe_g_interrupts;
    cfg.on_other = pipe_stage_on_request;
    cfg.on_other_arg = s;
    peer_rt_init(&s->rt, &cfg, &role);
    if (check_opts(s) != 0)
        goto out;
    s->rt.cfg.max_upload_mbps = s->o.max_upload_mbps;
    s->rt.cfg.max_download_mbps = s->o.max_download_mbps;
    s->rt.cfg.pace = s->o.pace;
    s->rt.cfg.latency_rules = s->lat_rules;
    s->rt.cfg.n_latency_rules = s->n_lat_rules;
    status = 1;
    if (s->o.step_log && !(s->steplog = fopen(s->o.step_log, "a"))) {
        perror(s->o.step_log);
        goto out;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s->rt.coord.cancel = &pipe_g_interrupts;
    int failed = start(s);
    int64_t step = 0;
    rc = failed ? CM_EINVAL : pipe_enter(s, 0, &step);
    failed = failed || rc != CM_OK;
    if (!failed && !s->run_finished)
        say_stage(s, step);
    s->rt.coord.cancel = NULL;
    while (!failed && !s->run_finished && step < s->tc.steps && !pipe_g_interrupts) {
        rc = pipe_stage_step(s, step);
        pipe_keep_announced(s);
        peer_rt_renew_pass_if_due(&s->rt);
        if (rc == CM_OK) {
            pipe_inbox_set_step(s->inbox, ++step);
            /* every agent of the assignment agreed in the step whether to
               move (stage_step.c) */
            if (step >= s->tc.steps || !s->move_after)
                continue;
            rc = CM_EVERSION; /* a volunteer joined or left: the coordinator re-solved */
        }
        if (!peer_failure(rc) || pipe_g_interrupts)
            break;
        if (rc == CM_EVERSION) {
            /* every agent of the new assignment goes on from the same step */
            printf("after step %lld: the coordinator serves a newer assignment; moving to it\n", (long long)step);
        } else {
            /* a stage agent left or a link broke: the coordinator re-solves
               once its capability report expires */
            printf("step %lld failed (%s): waiting for a new assignment (the coordinator drops agents that "
                   "stop reporting)\n", (long long)step + 1, cm_strerror(rc));
        }
        fflush(stdout);
        pipe_inbox_set_peers(s->inbox, NULL, 0, 0, 0);
        s->rt.coord.cancel = &pipe_g_interrupts;
        rc = pipe_enter(s, s->version, &step);
        s->rt.coord.cancel = NULL;
        if (rc != CM_OK)
            break;
        if (!s->run_finished) {
            printf("re-scheduled: assignment version %lld\n", (long long)s->version);
            say_stage(s, step);
        }
    }
    if (s->run_finished)
        printf("done: every stage finished the run's %ld steps while this agent was a spare\n", s->tc.steps);
    else if (!failed && rc == CM_OK && !pipe_g_interrupts)
        pipe_finish(s, s->tc.steps);
    if (!failed && rc == CM_OK && !pipe_g_interrupts && !s->run_finished)
        printf("done: stage %u trained %lld steps\n", s->stage, (long long)step);
    else if (!failed && rc != CM_ECANCELED && rc != CM_OK)
        fprintf(stderr, "error: stage %u stopped at step %lld: %s\n", s->stage, (long long)step + 1,
                cm_strerror(rc));
    if (pipe_g_interrupts)
        printf("stopping (%s)\n", g_signal == SIGTERM ? "SIGTERM" : "Ctrl-C");
    status = !failed && rc == CM_OK && !pipe_g_interrupts ? 0 : pipe_g_interrupts ? 128 + g_signal : 1;
out:
    caps_stop(s);
    peer_rt_cleanup(&s->rt); /* the net's thread is gone: nothing puts into the inbox */
done:
    if (s->steplog)
        fclose(s->steplog);
    if (s->have_tr)
        agent_trainer_cleanup(&s->tr);
    pipe_inbox_free(s->inbox);
    free(s->snap);
    cm_opts_free(&STAGE_SPEC, &s->o);
    pthread_mutex_destroy(&s->caps_mu);
    pthread_mutex_destroy(&s->addr_mu);
    pthread_mutex_destroy(&s->watch_mu);
    pthread_cond_destroy(&s->caps_cv);
    free(s);
    return status;
}
