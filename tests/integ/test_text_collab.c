/* ct-timeout: 600 */
/* A language model trained by volunteers (issue 20; seed 001, sahajBERT;
 * seed 000 §4.2-4.3 and H.5): PostgreSQL, the coordinator and four real
 * `crowdtrain-agent join` processes, each on a host of its own (network
 * namespaces on one switch, tests/harness/ct_net.h; loopback where they
 * cannot be made), train a tiny ALBERT as published (post-LN, segment
 * embeddings, masked-LM and sentence-order losses) on the Brown corpus,
 * streamed and tokenized on the fly by each agent from the text shards
 * through the run's SentencePiece model (docs/data.md, text-docs).
 *
 * Checked: every agent holds the same parameters at every step (their
 * --step-log hashes), every step's round held at least two agents and
 * averaged every part, the final evaluation reports the sentence-order
 * accuracy, the coordinator's curve carries the sentence-order loss and
 * the masked-token accuracy the agents reported (issue 20: the
 * dashboard's language-model charts), and (normal build) the accuracy
 * rose and the masked-LM loss per window of steps follows `train --local`
 * of the same recipe and global batch within the single-process runs' own
 * seed-to-seed spread (ct_steps_follow). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_harness.h"
#include "ct_net.h"
#include "ct_steps.h"

#define NAGENTS 4
#if defined(__SANITIZE_ADDRESS__)
#define SHORT_RUN 1 /* ~3x slower: memory safety and lockstep, not the curve */
#else
#define SHORT_RUN 0
#endif
#define STEPS (SHORT_RUN ? 10 : 50)
#define WINDOW 10
#define SEEDS 4
#define CORPUS "/usr/local/share/crowdtrain/corpus/brown"

static struct ct_pg g_pg;
static struct ct_coord g_c;
static struct ct_net g_net;
static int g_hosts;
static int g_host[NAGENTS];
static char *g_org;
static char g_dirs[NAGENTS][256];
static char g_cfg[300]; /* the recipe for train --local */
static pid_t g_local[SEEDS];
static int g_teardown_failed;

/* The tiny ALBERT: vocabulary 8,000 (the corpus's tokenizer), T 32, two
 * shared post-LN layers of width 64, E 32; batch 32 in micro-batches of 4
 * (each agent computes about a quarter). 307,170 parameters. */
static json_t *recipe(void)
{
    return json_pack("{s:{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:b},"
                     " s:{s:s, s:f, s:f}, s:{s:s, s:i}, s:i, s:i, s:i, s:i, s:s,"
                     " s:{s:s, s:s, s:i}, s:{s:i}, s:i}",
                     "model", "type", "albert", "vocab", 8000, "context", 32, "layers", 2, "heads", 2, "d_model",
                     64, "d_embed", 32, "d_ff", 128, "share_layers", 1, "post_ln", 1, "sentence_order", 1,
                     "optimizer", "type", "lamb", "lr", 0.05, "clip_norm", 1.0, "schedule", "type", "linear",
                     "warmup_steps", STEPS / 5, "batch_size", 32, "micro_batch", 4, "steps", STEPS, "seed", 5, "device",
                     "cpu", "data", "train", CORPUS "/brown-train.json", "eval", CORPUS "/brown-eval.json",
                     "shuffle_buffer", 1024, "eval", "batches", 4, "log_every", 10);
}

static int setup(void **state)
{
    (void)state;
    if (access(CORPUS "/brown-train.json", R_OK) != 0 || access(CORPUS "/brown-eval.json", R_OK) != 0) {
        printf("SKIP: the Brown corpus manifests are missing (scripts/make-brown-corpus.sh)\n");
        exit(CT_SKIP);
    }
    if (ct_net_collab(&g_net, "text", NAGENTS, g_host, &g_hosts) != 0)
        return -1;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    const char *args[] = {g_hosts ? "--listen" : NULL, "0.0.0.0:8443", "--public-url", "https://10.77.0.10:8443",
                          "--dht-listen-ip", "0.0.0.0", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    json_t *cfg = recipe();
    json_t *run = json_deep_copy(cfg);
    json_object_set_new(run, "collaboration",
                        json_pack("{s:i, s:s, s:i}", "checkpoint_every", 50, "compression", "none",
                                  "model_parameters", 307170));
    char *body = ct_run_body("albert-text", run);
    json_decref(run);
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    if (r.status != 201) {
        fprintf(stderr, "creating the run: %ld %s\n", r.status, r.body ? r.body : "");
        json_decref(cfg);
        return -1;
    }
    ct_resp_free(&r);
    if (g_hosts ? ct_net_volunteers(&g_net, &g_c, g_org, "albert-text", "https://10.77.0.10:8443", 0, NAGENTS,
                                    g_host, g_dirs) != 0
                : ct_volunteers(&g_c, g_org, "albert-text", NAGENTS, g_dirs) != 0) {
        json_decref(cfg);
        return -1;
    }
    snprintf(g_cfg, sizeof g_cfg, "%.250s/local.json", g_dirs[0]);
    rc = json_dump_file(cfg, g_cfg, 0);
    json_decref(cfg);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    for (int k = 0; k < SEEDS; k++)
        if (g_local[k] > 0) {
            kill(g_local[k], SIGKILL);
            ct_wait(g_local[k], 10);
        }
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    if (g_hosts)
        ct_net_destroy(&g_net);
    for (int i = 0; i < NAGENTS; i++)
        if (!getenv("CT_KEEP_LOGS"))
            ct_rmrf(g_dirs[i]);
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

static pid_t spawn_agent(int i, const char *log, const char *steplog)
{
    /* what a volunteer types, plus the round timing of one switch
       (test_join.c says why) */
    const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", "albert-text", "--config-dir", g_dirs[i],
                          "--device", "cpu", "--round-window-ms", "150", "--gather-margin-ms", "50",
                          "--outcome-window-ms", "1000", "--stall-ms", "4000", "--step-log", steplog,
                          g_hosts ? NULL : "--listen-ip", "127.0.0.1", NULL};
    return g_hosts ? ct_net_spawn(&g_net, g_host[i], argv, log) : ct_spawn(argv, log);
}

/* The agents' contribution reports carry ALBERT's heads (issue 20): the
 * coordinator's public curve has the sentence-order loss and the
 * masked-token accuracy at the steps, in bounds, and (normal build) the
 * accuracy of the last fifth of the steps above the first fifth's. */
static void check_curve_heads(void)
{
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/albert-text/curve", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *pts = json_object_get(r.json, "points"), *p;
    size_t i, n = json_array_size(pts);
    int win = STEPS / 5, n_first = 0, n_last = 0;
    double acc_first = 0, acc_last = 0, sop_first = 0, sop_last = 0;
    json_array_foreach(pts, i, p)
    {
        long step = (long)json_integer_value(json_object_get(p, "step"));
        json_t *sop = json_object_get(p, "sop_loss"), *acc = json_object_get(p, "mlm_accuracy");
        if (!json_is_number(sop) || !json_is_number(acc))
            fail_msg("step %ld: no sop_loss or mlm_accuracy in the curve: %s", step, r.body);
        double s = json_number_value(sop), a = json_number_value(acc);
        /* a two-way choice starts near ln 2; the accuracy is a share */
        if (!(s > 0.1 && s < 5) || !(a >= 0 && a <= 1))
            fail_msg("step %ld: sop_loss %g, mlm_accuracy %g", step, s, a);
        if (step < win) {
            acc_first += a;
            sop_first += s;
            n_first++;
        } else if (step >= STEPS - win) {
            acc_last += a;
            sop_last += s;
            n_last++;
        }
    }
    /* the last round's reports may still be in flight when an agent stops */
    if (n < (size_t)STEPS - 1)
        fail_msg("%zu curve points for %d steps: %s", n, STEPS, r.body);
    assert_true(n_first > 0 && n_last > 0);
    acc_first /= n_first;
    acc_last /= n_last;
    printf("curve: %zu steps with sop_loss and mlm_accuracy; steps 0-%d: sop loss %.4f, masked accuracy "
           "%.2f%%; steps %d-%d: %.4f, %.2f%%\n",
           n, win - 1, sop_first / n_first, 100 * acc_first, STEPS - win, STEPS - 1, sop_last / n_last,
           100 * acc_last);
    if (!SHORT_RUN) {
        assert_true(acc_last > 0 && acc_last <= 1);
        assert_true(acc_last > acc_first);
    }
    ct_resp_free(&r);
}

static void test_albert_collab(void **state)
{
    (void)state;
    pid_t pids[NAGENTS];
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/join.log", g_dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/join.steps", g_dirs[i]);
        pids[i] = spawn_agent(i, logs[i], steplogs[i]);
        assert_true(pids[i] > 0);
    }
    /* Single-process runs of the same recipe, one per data seed, in the
       idle scheduling class beside the collaboration (test_join.c,
       test_equivalence: their step logs do not depend on when they run). */
    char slogs[SEEDS][300], llogs[SEEDS][300];
    for (int k = 0; k < SEEDS && !SHORT_RUN; k++) {
        char seed[16];
        snprintf(slogs[k], sizeof slogs[k], "%.250s/local-%d.steps", g_dirs[0], k);
        snprintf(llogs[k], sizeof llogs[k], "%.250s/local-%d.log", g_dirs[0], k);
        snprintf(seed, sizeof seed, "%d", 201 + k);
        const char *argv[] = {"/usr/bin/chrt", "--idle", "0", ct_bin("crowdtrain-agent"), "train", "--local",
                              "--config", g_cfg, "--data-seed", seed, "--threads", "1", "--step-log", slogs[k],
                              NULL};
        g_local[k] = ct_spawn(argv, llogs[k]);
        assert_true(g_local[k] > 0);
    }
    assert_int_equal(ct_wait_agents(pids, (const char (*)[320])logs, NAGENTS, 500), 0);
    static struct ct_steps collab;
    memset(&collab, 0, sizeof collab);
    for (int i = 0; i < NAGENTS; i++)
        ct_steps_fold(steplogs[i], &collab, "collab");
    assert_int_equal(collab.mismatches, 0);
    assert_int_equal(collab.nan_losses, 0);
    int shared = 0, full = 0;
    for (long k = 1; k <= STEPS; k++) {
        if (!collab.hash[k][0])
            fail_msg("no agent logged step %ld", k);
        shared += collab.members[k] >= 2;
        full += collab.full[k] > 0;
    }
    printf("%d of %d steps averaged by two or more agents, %d with every part; %d step-log lines\n", shared,
           STEPS, full, collab.lines);
    assert_int_equal(shared, STEPS);
    assert_int_equal(full, STEPS);
    /* the final models are the same, and the evaluation scored the pairs' order */
    for (int i = 0; i < NAGENTS; i++) {
        char *log = ct_read_file(logs[i], NULL);
        assert_non_null(log);
        const char *ev = strstr(log, "evaluation at step");
        if (!ev || !strstr(ev, "sentence order: loss"))
            fail_msg("agent %d: no sentence-order evaluation:\n%s", i, log);
        if (i == 0)
            printf("agent 0: %.*s\n", (int)strcspn(ev, "\n"), ev);
        free(log);
    }
    check_curve_heads();
    if (SHORT_RUN)
        return;
    static struct ct_steps local[SEEDS];
    for (int k = 0; k < SEEDS; k++) {
        int rc = ct_wait(g_local[k], 300);
        g_local[k] = 0;
        if (rc != 0) {
            char *out = ct_read_file(llogs[k], NULL);
            fail_msg("train --local exited %d:\n%s", rc, out ? out : "");
        }
        memset(&local[k], 0, sizeof local[k]);
        ct_steps_fold(slogs[k], &local[k], "local");
    }
    /* the masked-LM loss fell, and it fell as one process's does */
    double first = collab.loss_sum[1] / collab.samples[1];
    double last = collab.loss_sum[STEPS] / collab.samples[STEPS];
    printf("collaboration: masked-LM loss %.3f at step 1, %.3f at step %d\n", first, last, STEPS);
    assert_true(last < first - 1.0);
    assert_int_equal(ct_steps_follow(&collab, local, SEEDS, STEPS, WINDOW, 0, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_albert_collab),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
