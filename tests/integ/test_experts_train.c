/* ct-timeout: 240 */
/* DMoE training end to end (issue 18; Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.1-3.3; docs/experts.md "Trainers"):
 * PostgreSQL, the coordinator, two expert servers (`crowdtrain-agent
 * serve-experts --run RUN --experts 8`: together the 16 experts of a 4x4
 * grid, declared in the run's DHT) and two trainers (`crowdtrain-agent
 * join`) of a small Fashion-MNIST dmoe run, all on loopback. The trainers
 * find the experts by beam search, call them over the network, and average
 * the trunk, gate and head with DeDLOC rounds. Asserts, from the trainers'
 * --step-log files: rounds held both trainers, the loss fell, most steps'
 * expert calls were answered (the servers processed the trainers' samples:
 * an answered call is one a server computed), no loss was NaN; and from
 * the coordinator's accounting (docs/accounting.md, "Expert servers"):
 * each server's owner was credited expert samples by the trainers'
 * attestations, at most k x the trainers' verified samples in all.
 *
 * Skips (loudly) without PostgreSQL, without the Fashion-MNIST package, or
 * while `crowdtrain-agent serve-experts` does not exist in this build (it is
 * another slice of issue 18). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ct_harness.h"

#define RUN "fmnist-dmoe"
#define STEPS 24
#define NTRAIN 2
#define NSERVE 2

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static char g_dirs[NTRAIN + NSERVE][256];

/* The Fashion-MNIST recipe with the dmoe model of examples/fmnist-dmoe.json,
 * small batches so a few dozen steps show learning. */
static char *run_body(void)
{
    json_t *cfg = ct_fmnist_recipe(STEPS);
    if (!cfg)
        return NULL;
    json_t *model = json_pack(
        "{s:s, s:i, s:[i,i], s:i, s:i, s:i, s:i, s:{s:i}}", "type", "dmoe", "inputs", 784,
        "hidden", 128, 64, "classes", 10, "grid_dims", 2, "grid_size", 4, "k", 4, "experts",
        "hidden", 128);
    json_object_set_new(cfg, "model", model);
    json_object_set_new(cfg, "batch_size", json_integer(256));
    json_object_set_new(cfg, "micro_batch", json_integer(64));
    json_object_set_new(json_object_get(cfg, "optimizer"), "lr", json_real(0.003));
    json_object_set_new(cfg, "schedule",
                        json_pack("{s:s, s:i, s:f}", "type", "cosine", "warmup_steps", 2,
                                  "min_lr_ratio", 0.1));
    /* the trainers' parameters (trunk, gate, head; kern_dmoe_param_count) */
    json_object_set_new(cfg, "collaboration",
                        json_pack("{s:i, s:s, s:i}", "checkpoint_every", 50, "compression", "none",
                                  "model_parameters", 109906));
    json_t *body = json_pack("{s:s, s:i, s:s, s:O}", "name", RUN, "target_batch_size", 256,
                             "model_summary", "DMoE 784-128-64, 4x4 experts, top-4", "config", cfg);
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    json_decref(cfg);
    return s;
}

static int setup(void **state)
{
    (void)state;
    const char *help[] = {ct_bin("crowdtrain-agent"), "serve-experts", "--help", NULL};
    char *out = NULL;
    int hrc = ct_run(help, NULL, &out, 20);
    free(out);
    if (hrc != 0) {
        printf("SKIP: `crowdtrain-agent serve-experts --help` failed (exit %d): the expert "
               "servers' command is not in this build (issue 18, slice D)\n", hrc);
        exit(CT_SKIP);
    }
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        exit(CT_SKIP);
    }
    const char *args[] = {"--dht-listen-ip", "127.0.0.1", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    char *body = run_body();
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    if (r.status != 201) {
        printf("creating the run: HTTP %ld: %s\n", r.status, r.body ? r.body : "");
        return -1;
    }
    ct_resp_free(&r);
    return ct_volunteers(&g_c, g_org, RUN, NTRAIN + NSERVE, g_dirs);
}

static int teardown(void **state)
{
    (void)state;
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    for (int i = 0; i < NTRAIN + NSERVE; i++)
        if (!getenv("CT_KEEP_LOGS"))
            ct_rmrf(g_dirs[i]);
    free(g_org);
    return rc;
}

struct fold {
    int lines, two_members, nan_losses, experts_ok, with_calls;
    double first_loss, last_loss; /* means of the first and last 4 logged steps */
    double loss[STEPS + 8];
    int nloss;
    long calls, failed;
};

/* Reads one trainer's step log. */
static void fold_steplog(const char *path, struct fold *f)
{
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char line[4096];
    while (fgets(line, sizeof line, fp)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j)
            continue;
        json_t *loss = json_object_get(j, "loss");
        if (!json_object_get(j, "hash")) { /* a round that averaged nothing */
            json_decref(j);
            continue;
        }
        f->lines++;
        f->two_members += json_integer_value(json_object_get(j, "members")) == 2;
        if (json_is_number(loss) && f->nloss < (int)(sizeof f->loss / sizeof f->loss[0]))
            f->loss[f->nloss++] = json_number_value(loss);
        else if (!json_is_number(loss))
            f->nan_losses++;
        json_t *ex = json_object_get(j, "experts");
        if (ex) {
            long c = (long)json_integer_value(json_object_get(ex, "calls"));
            long fl = (long)json_integer_value(json_object_get(ex, "failed"));
            f->calls += c;
            f->failed += fl;
            f->with_calls += c > 0;
            f->experts_ok += c > 0 && fl * 10 <= c; /* at most a tenth failed */
        }
        json_decref(j);
    }
    fclose(fp);
    int n = f->nloss < 4 ? f->nloss : 4;
    for (int i = 0; i < n; i++) {
        f->first_loss += f->loss[i] / n;
        f->last_loss += f->loss[f->nloss - 1 - i] / n;
    }
}

static void test_experts_train(void **state)
{
    (void)state;
    char logs[NTRAIN + NSERVE][320], steplogs[NTRAIN][320];
    pid_t srv[NSERVE], tr[NTRAIN];
    for (int i = 0; i < NSERVE; i++) {
        snprintf(logs[NTRAIN + i], sizeof logs[0], "%s/serve.log", g_dirs[NTRAIN + i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "serve-experts", "--run", RUN,
                              "--config-dir", g_dirs[NTRAIN + i], "--experts", "8",
                              "--listen-ip", "127.0.0.1", NULL};
        srv[i] = ct_spawn(argv, logs[NTRAIN + i]);
        assert_true(srv[i] > 0);
    }
    /* the servers log in, start and declare their experts: each says so
       once its declarations are stored (what the trainers' beam search reads) */
    for (int i = 0; i < NSERVE; i++) {
        char serving[128];
        snprintf(serving, sizeof serving, "serving 8 experts of run '%s' at ", RUN);
        int up = 0;
        for (int t = 0; t < 600 && !up; t++) {
            char *text = ct_read_file(logs[NTRAIN + i], NULL);
            up = text && strstr(text, serving);
            free(text);
            int st;
            if (!up && waitpid(srv[i], &st, WNOHANG) == srv[i]) {
                char *l = ct_read_file(logs[NTRAIN + i], NULL);
                fail_msg("server %d exited during start-up:\n%s", i, l ? l : "");
            }
            if (!up)
                usleep(100000);
        }
        if (!up)
            fail_msg("server %d did not declare its experts within 60 s (log %s)", i, logs[NTRAIN + i]);
    }
    for (int i = 0; i < NTRAIN; i++) {
        snprintf(logs[i], sizeof logs[0], "%s/join.log", g_dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[0], "%s/steps.jsonl", g_dirs[i]);
        const char *argv[] = {ct_bin("crowdtrain-agent"), "join", "--run", RUN, "--config-dir",
                              g_dirs[i], "--device", "cpu", "--listen-ip", "127.0.0.1",
                              "--round-window-ms", "150", "--outcome-window-ms", "1000",
                              "--stall-ms", "4000", "--no-eval", "--progress", "lines",
                              "--step-log", steplogs[i], NULL};
        tr[i] = ct_spawn(argv, logs[i]);
        assert_true(tr[i] > 0);
    }
    int failed = 0;
    for (int i = 0; i < NTRAIN; i++) {
        int st = ct_wait(tr[i], 150);
        if (st != 0) {
            char *l = ct_read_file(logs[i], NULL);
            printf("trainer %d exited %d:\n%s\n", i, st, l ? l : "(no log)");
            free(l);
            failed = 1;
        }
    }
    for (int i = 0; i < NSERVE; i++) {
        kill(srv[i], SIGINT);
        int st = ct_wait(srv[i], 20);
        char *l = ct_read_file(logs[NTRAIN + i], NULL);
        if (st != 0 && st != 128 + SIGINT) {
            printf("expert server %d exited %d:\n%s\n", i, st, l ? l : "(no log)");
            failed = 1;
        }
        free(l);
    }
    assert_false(failed);
    for (int i = 0; i < NTRAIN; i++) {
        struct fold f = {0};
        fold_steplog(steplogs[i], &f);
        printf("trainer %d: %d steps logged, %d with 2 members, loss %.4f -> %.4f, expert calls %ld "
               "(%ld failed), %d of %d steps with calls mostly answered\n",
               i, f.lines, f.two_members, f.first_loss, f.last_loss, f.calls, f.failed,
               f.experts_ok, f.with_calls);
        assert_true(f.lines >= STEPS / 2);
        assert_true(f.two_members * 2 >= f.lines); /* most rounds held both trainers */
        assert_int_equal(f.nan_losses, 0);
        assert_true(f.nloss >= 8);
        assert_true(f.last_loss < f.first_loss * 0.8);
        assert_true(f.calls > 0);
        assert_true(f.experts_ok * 4 >= f.with_calls * 3); /* most steps' calls answered */
        assert_true(f.with_calls * 2 >= f.lines);
    }
    /* The servers' credit: vol0 and vol1 trained, vol2 and vol3 served. */
    struct ct_resp r;
    ct_http(&g_c, "GET", "/api/v1/runs/" RUN "/contributions", g_org, NULL, &r);
    assert_int_equal(r.status, 200);
    double trained = 0, served = 0, clipped = 0;
    size_t i;
    json_t *u;
    json_array_foreach(json_object_get(r.json, "users"), i, u)
    {
        const char *name = json_string_value(json_object_get(u, "username"));
        double es = json_number_value(json_object_get(u, "expert_samples"));
        double vs = json_number_value(json_object_get(u, "verified_samples"));
        clipped += json_number_value(json_object_get(u, "expert_samples_clipped"));
        printf("%s: verified samples %.0f, expert samples %.0f\n", name, vs, es);
        if (!strcmp(name, "vol2") || !strcmp(name, "vol3"))
            assert_true(es > 0);
        else
            assert_true(es == 0);
        trained += vs;
        served += es;
    }
    ct_resp_free(&r);
    printf("expert samples %.0f (clipped %.0f) for %.0f verified training samples, top-4\n", served,
           clipped, trained);
    /* top-4: each trained sample is at most 4 expert samples (the cap), and
       with most calls answered, well over half of that */
    assert_true(served <= 4 * trained);
    assert_true(served * 2 >= 4 * trained);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_train),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
