/* crowdtrain-agent join: a volunteer's collaborative training (seed
 * 000_02cc6b5d62a616fc.txt §3.1-3.3; DESIGN.md "The training protocol"),
 * the data-parallel role on the peer runtime (agent/peer/runtime.h):
 *
 *   session -> access pass -> (the run's recipe) -> the coordinator's clock
 *   -> model -> catch up (newest checkpoint from the coordinator, hash
 *   verified) -> p2p node (DHT bootstrap from the pass) -> schedules,
 *   reports, probes -> the training loop (loop.c): accumulate gradients,
 *   publishing progress in the DHT; when the collaboration's samples at
 *   this step reach the run's target batch size, announce for the round,
 *   gather its members, average with a butterfly all-reduce, apply the
 *   identical optimizer step; every K steps one deterministically chosen
 *   peer uploads a checkpoint -> linger for peers behind -> evaluate and
 *   export.
 *
 * This file is the command: options, the run's recipe, the role's
 * callbacks for the runtime, start and stop. The run's config (GET
 * /api/v1/runs/{run}) is the training recipe in the format of `train
 * --local` (docs/training.md) plus an optional "collaboration" object read
 * here. Every peer builds its model from the same seed, so all start from
 * identical weights; each streams its own data order. Ctrl-C leaves after
 * the current round (or at once when not in a round); a second Ctrl-C
 * abandons the round. */
#include "agent/commands.h"
#include "agent/dp/dp.h"
#include "ckpt/safetensors.h"
#include "cm_err.h"
#include "cm_opts.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define J(f) offsetof(struct dp_opts, f)
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
     "accept no inbound connections: send and receive, aggregate nothing (automatic when the "
     "coordinator cannot reach us)", 0},
    {"max-upload-mbps", CM_OPT_DBL, J(max_upload_mbps), "0", "MBPS", "upload cap, 0 = none", 0},
    {"max-download-mbps", CM_OPT_DBL, J(max_download_mbps), "0", "MBPS", "download cap, 0 = none", 0},
    {"pace", CM_OPT_DBL, J(pace), "0", "F",
     "after measuring the link (against the coordinator's node), send and receive at most F x its "
     "rates, so that the queue stays in this agent and not in a home router's buffer, where it delays "
     "everything else (0.92 on such a line: headers and acknowledgements take the rest; 0 = off, the "
     "default: a coordinator on a slower link than "
     "yours would read as your link)", 0},
    {"max-cpu-percent", CM_OPT_DBL, J(max_cpu_percent), "0", "P",
     "use at most about P% of this machine's CPU time, all cores counted (25 on 8 cores: two "
     "cores' worth), 0 = no limit", 0},
    {"no-relay", CM_OPT_BOOL, J(no_relay), NULL, NULL,
     "neither lend relay ports to unreachable peers (when reachable) nor use a relay (when not: "
     "then a client-mode peer); by default a reachable agent relays for a few unreachable ones "
     "and an unreachable one aggregates through such an agent", 0},
    {"listen-ip", CM_OPT_STR, J(listen_ip), "0.0.0.0", "IP", "address peers connect to us on", 0},
    {"advertise-ip", CM_OPT_STR, J(advertise_ip), NULL, "IP",
     "address announced to peers, unchecked (default: the address the coordinator sees us at, "
     "once it reached us there; unreachable peers go through a relay, see --no-relay)", 0},
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
    {"gather-margin-ms", CM_OPT_INT, J(gather_margin_ms), "150", "MS",
     "a round's members are read this long after its window closed (at least 3x this peer's slowest recent "
     "announcement to the DHT); raise it on links of long round trips",
     0},
    {"outcome-window-ms", CM_OPT_INT, J(outcome_window_ms), "1500", "MS",
     "members agree on a round's averaged parts from the outcomes published within this window", 0},
    {"delayed-updates", CM_OPT_BOOL, J(delayed_updates), NULL, NULL,
     "overlap averaging with the next accumulation, at one step of staleness (seed 000 §3.2)", 0},
    {"stall-ms", CM_OPT_INT, J(stall_ms), "10000", "MS",
     "silence after which a peer in a round is given up for that round", 0},
    {"expert-timeout-ms", CM_OPT_INT, J(expert_timeout_ms), "2000", "MS",
     "dmoe runs: deadline of each expert call and of the expert search (docs/experts.md, \"Trainers\")", 0},
    {"max-inflight-batches", CM_OPT_INT, J(max_inflight), "0", "N",
     "dmoe runs: micro-batches in flight at once, 1 to 256 (default: the run's "
     "model.experts.max_inflight_batches, 4; seed 002 §3.3 asynchronous trainers)", 0},
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
    "line per step. Ctrl-C leaves cleanly. 'crowdtrain-agent pause' (SIGUSR1)\n"
    "pauses it without leaving the run, 'crowdtrain-agent resume' (SIGUSR2) goes on.",
    JOIN_OPTS, sizeof JOIN_OPTS / sizeof JOIN_OPTS[0], 1};


/* Ctrl-C (and SIGTERM, alike). During start-up the runtime and start()
 * stop at the next stage (exit status 128 + the signal, as if it had
 * killed us, with a line saying so); a second one there exits at once (a
 * model build may take long, and nothing is committed yet: a partial
 * download is a .part file that is never loaded). Once training, the loop
 * leaves after the current round, or abandons it at the second. */
static volatile sig_atomic_t g_interrupts, g_starting, g_signal;
static void on_sigint(int sig)
{
    g_interrupts++;
    g_signal = sig;
    if (g_starting && g_interrupts >= 2)
        _exit(128 + sig);
}

/* Pause (SIGUSR1) and resume (SIGUSR2): `crowdtrain-agent pause|resume`
 * sends them (agent/control.c); the loop acts on the flag (pause.c). The
 * handlers are installed first thing, before anything else can take long:
 * SIGUSR1's default action would end the agent. */
static volatile sig_atomic_t g_pause;
static void on_pause(int sig)
{
    g_pause = sig == SIGUSR1;
}

/* ---- the role's callbacks for the runtime (struct peer_role) ---- */
static int role_save(void *ctx, char *err, size_t cap)
{
    struct dp_state *s = ctx;
    return agent_trainer_save(&s->tr, err, cap);
}

static int role_load(void *ctx, int64_t *step, char *err, size_t cap)
{
    struct dp_state *s = ctx;
    int resumed = 0;
    int rc = agent_trainer_resume(&s->tr, &resumed, err, cap);
    if (rc == CM_OK)
        *step = (int64_t)s->tr.opt->step;
    return rc;
}

/* Our parameters can be served once their hash is known (-1 before the
 * first hash, and for an aggregate-only peer, which holds none). */
static int64_t role_state_step(void *ctx)
{
    struct dp_state *s = ctx;
    return s->hash_step >= 0 ? (int64_t)s->tr.opt->step : -1;
}

/* ---- the run's recipe ---- */
/* "collaboration" is ours; the rest is the train --local recipe. */
static int read_collab(struct dp_state *s, json_t *cfg)
{
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
        return CM_EINVAL;
    }
    return CM_OK;
}

/* The run: target batch size and the training recipe. */
static int fetch_run(struct dp_state *s)
{
    char err[512];
    json_t *cfg = NULL;
    int rc = agent_run_config(&s->rt.coord, s->o.run, &cfg, &s->target);
    if (rc != CM_OK)
        return rc;
    if (!json_is_object(cfg) || !json_object_get(cfg, "model")) {
        fprintf(stderr, "error: run '%s' has no training recipe in its config; an organizer sets "
                        "it with PATCH /api/v1/runs/%s {\"config\": {...}}\n", s->o.run, s->o.run);
        json_decref(cfg);
        return CM_EINVAL;
    }
    if ((rc = read_collab(s, cfg)) != CM_OK) {
        json_decref(cfg);
        return rc;
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
    if (s->o.max_inflight > 0)
        s->tcfg.max_inflight = (int)s->o.max_inflight;
    /* one call of compute_grads = one micro-batch; the collaboration sums them */
    s->tcfg.batch_size = s->tcfg.micro_batch;
    if (s->o.device)
        snprintf(s->tcfg.device, sizeof s->tcfg.device, "%s", s->o.device);
    if (s->o.max_cpu_percent > 0)
        agent_cpu_limit_apply(&s->cpu, s->o.max_cpu_percent, &s->tcfg.threads);
    s->steps = s->o.steps > 0 ? s->o.steps : s->tcfg.steps;
    /* every peer its own data order, everyone the same initial weights */
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(s->rt.key.pub, CM_ED25519_PUB_LEN, h);
    memcpy(&s->tcfg.data_seed, h, sizeof s->tcfg.data_seed);
    s->tcfg.data_seed |= 1;
    if (strlen(s->rt.rundir) >= sizeof s->tcfg.ckpt_dir) {
        fprintf(stderr, "error: the state directory path is too long\n");
        return CM_EINVAL;
    }
    memcpy(s->tcfg.ckpt_dir, s->rt.rundir, strlen(s->rt.rundir) + 1);
    s->tcfg.resume = 0;
    return CM_OK;
}

static int export_model(struct dp_state *s, const char *path)
{
    const char *meta[] = {"format", "pt", "run", s->o.run};
    return agent_model_export(s->tr.model, path, meta, 2);
}

/* Every option checked before anything is contacted or written. 0: fine. */
static int check_opts(struct dp_state *s)
{
    if (!s->o.run || !cm_name_valid(s->o.run)) {
        fprintf(stderr, "error: --run RUN is required (see --help)\n");
        return -1;
    }
    if (s->o.stall_ms < 500 || s->o.stall_ms > 600000 || s->o.round_timeout_ms < 1000 ||
        s->o.outcome_window_ms < 50 || s->o.round_window_ms < 10 || s->o.gather_margin_ms < 10 ||
        s->o.gather_margin_ms > DP_GATHER_MARGIN_MAX_MS) {
        fprintf(stderr, "error: --stall-ms must be in [500, 600000], --round-timeout-ms >= 1000, "
                        "--outcome-window-ms >= 50, --round-window-ms >= 10, --gather-margin-ms in "
                        "[10, %d]\n", DP_GATHER_MARGIN_MAX_MS);
        return -1;
    }
    const char *bad = NULL;
    if (!strcmp(s->o.progress, "live"))
        s->progress_live = 1;
    else if (!strcmp(s->o.progress, "lines"))
        s->progress_live = 0;
    else if (!strcmp(s->o.progress, "auto"))
        s->progress_live = isatty(STDOUT_FILENO);
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
    else if (!bad && !(s->o.pace == 0 || (s->o.pace >= 0.5 && s->o.pace <= 1)))
        bad = "--pace must be 0 (off) or from 0.5 to 1";
    else if (!bad && (s->o.dht_port < 0 || s->o.dht_port > 65535 || s->o.ar_port < 0 || s->o.ar_port > 65535))
        bad = "--dht-port and --ar-port must be from 0 (any) to 65535";
    else if (!bad && s->o.max_cpu_percent != 0 && !(s->o.max_cpu_percent >= 1 && s->o.max_cpu_percent <= 100))
        bad = "--max-cpu-percent must be 0 (no limit) or from 1 to 100";
    else if (!bad && (s->o.expert_timeout_ms < 1 || s->o.expert_timeout_ms > 600000))
        bad = "--expert-timeout-ms must be from 1 to 600000";
    else if (!bad && (s->o.max_inflight < 0 || s->o.max_inflight > AGENT_ASYNC_MAX))
        bad = "--max-inflight-batches must be 0 (the run's) or from 1 to 256";
    else if (!bad && (s->o.steps < 0 || s->o.micro_batch < 0 || s->o.checkpoint_every < 0))
        bad = "--steps, --micro-batch and --checkpoint-every must be 0 (the run's) or positive";
    if (bad) {
        fprintf(stderr, "error: %s\n", bad);
        return -1;
    }
    return 0;
}

/* Test-only behaviours, from the environment (said loudly when set). */
static int test_hooks(struct dp_state *s, int64_t *skew_ms)
{
    const char *skew = getenv("CROWDTRAIN_TEST_CLOCK_SKEW_MS");
    if (skew && *skew) {
        char *end;
        long long v = strtoll(skew, &end, 10);
        if (*end || v < -3600000 || v > 3600000) {
            fprintf(stderr, "error: CROWDTRAIN_TEST_CLOCK_SKEW_MS must be an integer within an hour\n");
            return -1;
        }
        *skew_ms = v;
        fprintf(stderr, "warning: CROWDTRAIN_TEST_CLOCK_SKEW_MS=%lld: this peer's clock is set wrong "
                        "(a test of the clock correction)\n", v);
    }
    const char *lat = getenv("CROWDTRAIN_TEST_LATENCY_MS");
    if (lat && *lat) {
        char *end;
        long v = strtol(lat, &end, 10);
        if (*end || v < 0 || v > 10000) {
            fprintf(stderr, "error: CROWDTRAIN_TEST_LATENCY_MS must be an integer from 0 to 10000\n");
            return -1;
        }
        s->rt.cfg.latency_ms = (uint32_t)v;
        fprintf(stderr, "warning: CROWDTRAIN_TEST_LATENCY_MS=%ld: every frame this peer sends waits %ld ms "
                        "(latency emulation for tests)\n", v, v);
    }
    const char *corrupt = getenv("CROWDTRAIN_TEST_CORRUPT_GRADIENTS");
    if (corrupt && *corrupt) {
        s->corrupt = !strcmp(corrupt, "nan") ? 1 : !strcmp(corrupt, "huge") ? 2 : 0;
        if (!s->corrupt) {
            fprintf(stderr, "error: CROWDTRAIN_TEST_CORRUPT_GRADIENTS must be nan or huge\n");
            return -1;
        }
        fprintf(stderr, "warning: CROWDTRAIN_TEST_CORRUPT_GRADIENTS=%s: this peer sends corrupt "
                        "gradients (a test of the others' defences)\n", corrupt);
    }
    return 0;
}

/* The runtime's stages with the role's set-up between them (order in
 * runtime.h): the recipe needs the session, the model the recipe, the
 * catch-up the model, the probes a schedule. 0, or 1 on failure. */
static int start_stages(struct dp_state *s)
{
    char err[512];
    if (peer_rt_start(&s->rt, PEER_STAGE_PASS) != CM_OK || g_interrupts || fetch_run(s) != CM_OK ||
        peer_rt_start(&s->rt, PEER_STAGE_CLOCK) != CM_OK || g_interrupts)
        return 1;
    /* a DMoE model calls experts served by others (seed 002 §3.3), found in
       the DHT under this run's name; its trunk, gate and head are averaged
       like any model's parameters (docs/experts.md, "Trainers") */
    struct moe_remote_config mrc;
    moe_remote_config_default(&mrc);
    snprintf(mrc.run, sizeof mrc.run, "%s", s->o.run);
    mrc.timeout_ms = mrc.search_ms = (uint32_t)s->o.expert_timeout_ms;
    if (agent_trainer_init_ex(&s->tr, &s->tcfg, s->config_text, strlen(s->config_text),
                              s->tcfg.kind == KERN_MODEL_DMOE ? &mrc : NULL, err, sizeof err) != CM_OK) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    s->trainer_ready = 1;
    s->tr.resume_keeps_stream = 1; /* our own data order, whoever's state we load */
    int64_t step = 0;
    int rc = g_interrupts ? CM_ECANCELED : peer_rt_catch_up(&s->rt, 0, &step);
    if ((rc != CM_OK && rc != CM_ENOTFOUND) || peer_rt_start(&s->rt, PEER_STAGE_NET) != CM_OK)
        return 1;
    dp_experts_attach(s);
    /* the net stage may have found us unreachable (reach.h) */
    s->o.client_mode = s->rt.cfg.client_mode;
    if (dp_sched_open(s->rt.rundir, s->o.run, (const uint8_t(*)[CM_ED25519_PUB_LEN])s->rt.coord_keys,
                      s->rt.n_coord_keys, &s->js) != CM_OK) {
        fprintf(stderr, "warning: schedules unavailable; averaging with even parts\n");
        s->js = NULL;
    }
    if (peer_rt_start(&s->rt, PEER_STAGE_REPORTS) != CM_OK)
        return 1;
    if (s->o.step_log && !(s->steplog = fopen(s->o.step_log, "a"))) {
        fprintf(stderr, "error: cannot open the step log %s\n", s->o.step_log);
        return 1;
    }
    snprintf(s->progress_key, sizeof s->progress_key, "%s/progress", s->o.run);
    char pk[64];
    cm_b64url_encode(s->rt.key.pub, CM_ED25519_PUB_LEN, pk);
    printf("joined run '%s' as %s (peer %.12s..., %s%s), target batch %.0f, %ld steps, model %zu parameters\n",
           s->o.run, peer_rt_username(&s->rt), pk, s->o.aggregate_only ? "aggregate-only" : s->tr.be->name,
           !s->o.client_mode                     ? ""
           : peer_rt_addrs(&s->rt, NULL, NULL)   ? ", through a relay"
           : s->o.no_relay || s->rt.flag_client_mode ? ", client mode"
                                                 : ", client mode until a relay takes us",
           s->target, s->steps, s->tr.model->nparams);
    s->rt.cfg.probes = s->js != NULL; /* they measure for the schedules */
    s->joined_at = peer_mono_s();
    return peer_rt_start(&s->rt, PEER_STAGE_PROBES) != CM_OK;
}

/* Start-up, where Ctrl-C also abandons a request to the coordinator in
 * flight (the recipe, the checkpoint download); once training, requests
 * run to their end (a checkpoint upload is not cut by the first Ctrl-C). */
static int start(struct dp_state *s)
{
    s->rt.coord.cancel = &g_interrupts;
    int rc = start_stages(s);
    s->rt.coord.cancel = NULL;
    return rc;
}

/* After the loop: linger for peers behind, evaluate, export. */
static void finish(struct dp_state *s)
{
    char err[512] = "";
    if (g_interrupts)
        printf("left the run at step %llu (Ctrl-C)\n", (unsigned long long)s->tr.opt->step);
    else
        dp_linger(s, (int64_t)s->tr.opt->step);
    if (!s->o.aggregate_only && !s->o.no_eval && s->tcfg.eval_manifest[0]) {
        struct kern_eval ev;
        if (agent_trainer_evaluate(&s->tr, s->tcfg.eval_batches, &ev, err, sizeof err) == CM_OK && ev.count) {
            printf("evaluation at step %llu: loss %.4f, accuracy %.2f%% (%ld examples)",
                   (unsigned long long)s->tr.opt->step, ev.loss_sum / (double)ev.count,
                   100.0 * (double)ev.correct / (double)ev.count, ev.count);
            if (ev.sop_count)
                printf("; sentence order: loss %.4f, accuracy %.2f%% (%ld pairs)",
                       ev.sop_loss_sum / (double)ev.sop_count,
                       100.0 * (double)ev.sop_correct / (double)ev.sop_count, ev.sop_count);
            printf("\n");
        } else
            fprintf(stderr, "warning: evaluation failed: %s\n", err);
    }
    if (!s->o.aggregate_only) {
        char out_path[4400];
        snprintf(out_path, sizeof out_path, "%s", s->o.export_path ? s->o.export_path : "");
        if (!out_path[0])
            snprintf(out_path, sizeof out_path, "%s/%s.safetensors", s->rt.dir, s->o.run);
        if (export_model(s, out_path) == CM_OK)
            printf("exported the model: %s\n", out_path);
        else
            fprintf(stderr, "warning: exporting the model to %s failed\n", out_path);
    }
}

int agent_cmd_join(int argc, char **argv)
{
    struct dp_state *s = calloc(1, sizeof *s);
    if (!s)
        return 1;
    struct sigaction sp = {0};
    sp.sa_handler = on_pause;
    sp.sa_flags = SA_RESTART; /* a volunteer's pause must not fail a read or a wait */
    sigaction(SIGUSR1, &sp, NULL);
    sigaction(SIGUSR2, &sp, NULL);
    s->pause_req = &g_pause;
    pthread_mutex_init(&s->js_mu, NULL);
    collab_hold_init(&s->hold, DP_HOLD_S);
    int rc = cm_opts_parse(&JOIN, &s->o, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&JOIN, &s->o);
        pthread_mutex_destroy(&s->js_mu);
        free(s);
        return rc == 1 ? 0 : 2;
    }
    struct peer_rt_config rc_cfg = {0};
    struct peer_role role = {"data-parallel", s, s->o.aggregate_only ? NULL : role_save, role_load,
                             role_state_step, dp_peers, dp_still_here};
    rc_cfg.run = s->o.run;
    rc_cfg.coordinator = s->o.coordinator;
    rc_cfg.config_dir = s->o.config_dir;
    rc_cfg.listen_ip = s->o.listen_ip;
    rc_cfg.advertise_ip = s->o.advertise_ip;
    rc_cfg.client_mode = s->o.client_mode;
    rc_cfg.no_relay = s->o.no_relay;
    rc_cfg.must_accept = s->o.aggregate_only;
    rc_cfg.dht_port = (uint16_t)s->o.dht_port;
    rc_cfg.ar_port = (uint16_t)s->o.ar_port;
    rc_cfg.max_upload_mbps = s->o.max_upload_mbps;
    rc_cfg.max_download_mbps = s->o.max_download_mbps;
    rc_cfg.pace = s->o.pace;
    rc_cfg.interrupted = &g_interrupts;
    peer_rt_init(&s->rt, &rc_cfg, &role);
    int status = 2;
    if (check_opts(s) != 0 || test_hooks(s, &s->rt.cfg.test_skew_ms) != 0)
        goto out;
    if (s->o.aggregate_only && s->o.client_mode) {
        fprintf(stderr, "error: an --aggregate-only peer must accept connections (not --client-mode)\n");
        goto out;
    }
    status = 1;
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    g_starting = 1;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int failed = start(s);
    g_starting = 0;
    if (g_interrupts) { /* also one that came after the last stage started */
        printf("left during start-up (%s)\n", g_signal == SIGTERM ? "SIGTERM" : "Ctrl-C");
        status = 128 + g_signal;
        goto out;
    }
    if (failed)
        goto out;
    if ((rc = dp_train_loop(s)) != CM_OK) {
        fprintf(stderr, "error: training stopped: %s\n", cm_strerror(rc));
        goto out;
    }
    finish(s);
    status = 0;
out:
    dp_status_exit(s, status, g_interrupts != 0);
    /* the probe thread reads the role's records, the reporter says what it
       sent: they stop first; then the role's schedules, then the rest */
    peer_rt_stop_to(&s->rt, PEER_STAGE_NET);
    if (s->js)
        dp_sched_close(s->js);
    peer_rt_cleanup(&s->rt);
    if (s->steplog)
        fclose(s->steplog);
    if (s->trainer_ready)
        agent_trainer_cleanup(&s->tr);
    free(s->config_text);
    cm_opts_free(&JOIN, &s->o);
    pthread_mutex_destroy(&s->js_mu);
    free(s);
    return status;
}
