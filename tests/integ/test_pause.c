/* ct-timeout: 420 */
/* The limits a volunteer expects (issue 21): PostgreSQL, the coordinator
 * and real `crowdtrain-agent join` processes on loopback train the
 * Fashion-MNIST MLP of examples/fmnist-collab.json.
 *
 *  - pause and resume: three agents train; `crowdtrain-agent pause` pauses
 *    the third. It must log no step while paused, `status` must say
 *    "paused", the two others must go on without waiting for it (their
 *    steps advance, each round has two members) and the paused agent must
 *    renew its access pass meanwhile (passes live 30 s here and the pause
 *    lasts until it renewed; under the sanitizers only until the others
 *    went 8 steps on). `crowdtrain-agent resume` brings it back:
 *    within two steps after its catch-up it takes part in every round with
 *    the others' parameter hash. Throughout, the chaos test's invariants:
 *    one parameter hash per step across every agent's step log, no NaN
 *    loss; Ctrl-C still ends every agent cleanly.
 *  - --max-cpu-percent 25: one agent alone, on a run whose target batch
 *    makes it compute most of the time (without the limit it would use
 *    most of the machine), uses at most the budget over a 15 s window
 *    (its utime + stime from /proc), within the bound of agent/cpu_limit.h
 *    plus a margin for one micro-batch. A measurement of time: in the
 *    normal build only. Setup starts that agent, and its window runs while
 *    test_pause_resume waits on the pass renewal (each test's polling
 *    loops also watch the window, cpu_watch): measured one after the
 *    other, the two took ~48 s, most of it waiting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fnmatch.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ct_harness.h"

#define NAGENTS 3
#define PAUSED 2 /* the agent paused */
#define RUN "fmnist-pause"
#define CPU_RUN "fmnist-cpu"
#define MAXSTEPS 500
#define MAXLINES 1200

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define SLOW 3 /* the agents run about 3x slower */
#else
#define SLOW 1
#endif

static struct ct_pg g_pg;
static struct ct_coord g_c;
static char *g_org;
static int g_teardown_failed;
static char g_dirs[NAGENTS][256], g_cpu_dir[1][256];
static pid_t g_pids[NAGENTS + 1];

/* The CPU-limited agent of test_max_cpu_percent (g_pids[NAGENTS]) and its
 * measured window: utime + stime from /proc at the window's ends. */
#define CPU_WINDOW_S 15.0
static struct {
    char log[320], steplog[320];
    int phase; /* 0: not training yet; 1: in the window; 2: measured (Ctrl-C sent) */
    long s0, s1;
    double c0, c1, w0, w1;
} g_cpu;
static int start_cpu_agent(void);
static void cpu_watch(void);

static int create_run(const char *name, long target)
{
    json_t *cfg = ct_fmnist_recipe(0);
    if (!cfg)
        return -1;
    if (target)
        json_object_set_new(cfg, "batch_size", json_integer(target));
    char *body = ct_run_body(name, cfg);
    json_decref(cfg);
    if (!body)
        return -1;
    struct ct_resp r;
    ct_http(&g_c, "POST", "/api/v1/runs", g_org, body, &r);
    free(body);
    long st = r.status;
    ct_resp_free(&r);
    return st == 201 ? 0 : -1;
}

/* A volunteer `name` on `run`, logged in with the state dir `dir`. */
static int volunteer(const char *name, const char *run, char *dir)
{
    if (ct_volunteer_account(&g_c, g_org, run, name, dir) != 0)
        return -1;
    const char *argv[] = {ct_bin("crowdtrain-agent"), "login", "--coordinator", g_c.url, "--ca-cert", g_c.ca,
                          "--username", name, "--password-stdin", "--config-dir", dir, NULL};
    char *out = NULL;
    int rc = ct_run(argv, "volunteer-pw\n", &out, 60);
    if (rc != 0)
        fprintf(stderr, "login of %s: %s\n", name, out ? out : "");
    free(out);
    return rc == 0 ? 0 : -1;
}

static int setup(void **state)
{
    (void)state;
    int rc = ct_pg_start(&g_pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        exit(CT_SKIP);
    }
    /* passes of 30 s (the least the coordinator issues): renewed every 20 s,
       so a pause of that long must renew one */
    const char *args[] = {"--pass-ttl", "30", NULL};
    if (rc != 0 || ct_create_user(g_pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&g_c, g_pg.url, NULL, args) != 0)
        return -1;
    g_org = ct_login(&g_c, "org", "organizer-password");
    /* the CPU run: 16 x the recipe's global batch, so that computing takes
       most of a step (a round on loopback takes ~0.6 s) and a step still
       fits the 15 s window at the budget */
    if (!g_org || create_run(RUN, 0) != 0 || create_run(CPU_RUN, 2048 * 16) != 0 ||
        ct_volunteers(&g_c, g_org, RUN, NAGENTS, g_dirs) != 0 ||
        volunteer("cpuvol", CPU_RUN, g_cpu_dir[0]) != 0)
        return -1;
    return start_cpu_agent();
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < NAGENTS + 1; i++)
        if (g_pids[i] > 0) { /* a test that failed before waiting for it */
            kill(g_pids[i], SIGKILL);
            waitpid(g_pids[i], NULL, 0);
        }
    int rc = ct_coord_cleanup(&g_c);
    ct_pg_stop(&g_pg);
    if (!getenv("CT_KEEP_LOGS")) {
        for (int i = 0; i < NAGENTS; i++)
            ct_rmrf(g_dirs[i]);
        ct_rmrf(g_cpu_dir[0]);
    }
    free(g_org);
    g_teardown_failed = rc != 0;
    return rc;
}

static pid_t spawn_agent(const char *run, const char *dir, const char *log, const char *steplog,
                         const char *const *extra)
{
    const char *argv[32] = {ct_bin("crowdtrain-agent"), "join", "--run", run, "--config-dir", dir,
                            "--listen-ip", "127.0.0.1", "--device", "cpu", "--round-window-ms", "400",
                            "--outcome-window-ms", "1000", "--stall-ms", "8000", "--no-eval",
                            "--step-log", steplog};
    int n = 0;
    while (argv[n])
        n++;
    for (int k = 0; extra && extra[k] && n < 31; k++)
        argv[n++] = extra[k];
    argv[n] = NULL;
    return ct_spawn(argv, log);
}

/* ---- step logs ---- */

struct line {
    long step;
    int synced, members, nan;
    char hash[65];
    int64_t t_ms;
};

struct slog {
    struct line l[MAXLINES];
    size_t n;
};

static void read_slog(const char *path, struct slog *s)
{
    s->n = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char buf[2048];
    while (s->n < MAXLINES && fgets(buf, sizeof buf, f)) {
        json_t *j = json_loads(buf, 0, NULL);
        if (!j)
            continue;
        const char *h = json_string_value(json_object_get(j, "hash"));
        if (h && strlen(h) == 64) { /* rounds that averaged nothing carry no hash */
            struct line *x = &s->l[s->n++];
            memset(x, 0, sizeof *x);
            x->step = (long)json_integer_value(json_object_get(j, "step"));
            x->synced = json_is_true(json_object_get(j, "synced"));
            x->members = (int)json_integer_value(json_object_get(j, "members"));
            json_t *loss = json_object_get(j, "loss");
            x->nan = !x->synced && !(json_is_number(loss) && isfinite(json_number_value(loss)));
            x->t_ms = (int64_t)json_integer_value(json_object_get(j, "t_ms"));
            snprintf(x->hash, sizeof x->hash, "%s", h);
        }
        json_decref(j);
    }
    fclose(f);
}

/* The highest step a step log shows taken (not synced), or -1. */
static long top_step(const struct slog *s)
{
    long m = -1;
    for (size_t i = 0; i < s->n; i++)
        if (!s->l[i].synced && s->l[i].step > m)
            m = s->l[i].step;
    return m;
}

static long top_step_of(const char *path)
{
    static struct slog s;
    read_slog(path, &s);
    return top_step(&s);
}

static int count_of(const char *text, const char *needle)
{
    int c = 0;
    for (const char *p = text; p && (p = strstr(p, needle)); p += strlen(needle))
        c++;
    return c;
}

/* Renewals the agent's log shows after its last "paused at step" line. */
static int renewals_while_paused(const char *log)
{
    char *t = ct_read_file(log, NULL);
    if (!t)
        return 0;
    const char *p = NULL;
    for (const char *q = t; (q = strstr(q, "paused at step")); q++)
        p = q;
    int n = p ? count_of(p, "renewed the access pass") : 0;
    free(t);
    return n;
}

static int run_cli(const char *cmd, const char *dir, char **out)
{
    const char *argv[] = {ct_bin("crowdtrain-agent"), cmd, "--config-dir", dir, NULL};
    return ct_run(argv, NULL, out, 90 * SLOW);
}

static double mono_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void test_pause_resume(void **state)
{
    (void)state;
    char logs[NAGENTS][320], steplogs[NAGENTS][320];
    for (int i = 0; i < NAGENTS; i++) {
        snprintf(logs[i], sizeof logs[i], "%.250s/join.log", g_dirs[i]);
        snprintf(steplogs[i], sizeof steplogs[i], "%.250s/pause.steps", g_dirs[i]);
        g_pids[i] = spawn_agent(RUN, g_dirs[i], logs[i], steplogs[i], NULL);
        assert_true(g_pids[i] > 0);
    }
    /* all three in step a few rounds */
    int ready = 0;
    for (int t = 0; t < 1200 * SLOW && !ready; t++) {
        ready = 1;
        for (int i = 0; i < NAGENTS; i++)
            ready &= top_step_of(steplogs[i]) >= 5;
        cpu_watch();
        if (!ready)
            usleep(100000);
    }
    assert_true(ready);

    /* pause the third */
    char *out = NULL;
    int rc = run_cli("pause", g_dirs[PAUSED], &out);
    printf("pause: %s", out ? out : "(nothing)\n");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "paused:"));
    free(out);
    double t_paused = mono_s();
    static struct slog p0, o0;
    read_slog(steplogs[PAUSED], &p0);
    read_slog(steplogs[0], &o0);
    long paused_at = top_step(&p0), others_at = top_step(&o0);
    out = NULL;
    rc = run_cli("status", g_dirs[PAUSED], &out);
    assert_int_equal(rc, 0); /* alive and well, for scripts */
    assert_non_null(out);
    assert_non_null(strstr(out, "state:     paused"));
    free(out);

    /* paused until the two others advanced 8 steps and it renewed its pass */
    long need = others_at + 8;
    int advanced = 0, renewed = 0;
    for (int t = 0; t < 900 * SLOW && !(advanced && renewed); t++) {
        advanced = top_step_of(steplogs[0]) >= need && top_step_of(steplogs[1]) >= need;
        /* under the sanitizers the pause ends with the others' steps: the
           renewal is the same code, checked in the normal build */
        renewed = SLOW > 1 || renewals_while_paused(logs[PAUSED]) > 0;
        cpu_watch();
        if (!(advanced && renewed))
            usleep(100000);
    }
    printf("paused at step %ld for %.1f s: the others went from step %ld to %ld; pass renewals while "
           "paused: %d\n", paused_at, mono_s() - t_paused, others_at, top_step_of(steplogs[0]),
           renewals_while_paused(logs[PAUSED]));
    assert_true(advanced);
    assert_true(renewed);
    static struct slog p1;
    read_slog(steplogs[PAUSED], &p1);
    assert_int_equal(p1.n, p0.n); /* not one step (or state fetch) while paused */
    static struct slog held[2];
    for (int i = 0; i < 2; i++)
        read_slog(steplogs[i], &held[i]);
    long resumed_from = top_step(&held[0]);

    out = NULL;
    rc = run_cli("resume", g_dirs[PAUSED], &out);
    printf("resume: %s", out ? out : "(nothing)\n");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "resumed:"));
    free(out);

    /* back: wait for 8 steps of its own after the resume */
    static struct slog p2;
    int back = 0;
    for (int t = 0; t < 900 * SLOW && !back; t++) {
        read_slog(steplogs[PAUSED], &p2);
        int own = 0;
        for (size_t i = p0.n; i < p2.n; i++)
            own += !p2.l[i].synced;
        back = own >= 8;
        cpu_watch();
        if (!back)
            usleep(100000);
    }
    assert_true(back);

    /* Ctrl-C ends every agent cleanly */
    for (int i = 0; i < NAGENTS; i++)
        kill(g_pids[i], SIGINT);
    for (int i = 0; i < NAGENTS; i++) {
        int st = ct_wait(g_pids[i], 60 * SLOW);
        g_pids[i] = 0;
        if (st != 0)
            fprintf(stderr, "agent %d exited with %d; its log: %s\n", i, st, logs[i]);
        assert_int_equal(st, 0);
    }

    /* the chaos invariants: one hash per step across all logs, no NaN */
    static char hash[MAXSTEPS + 1][65];
    static struct slog all[NAGENTS];
    memset(hash, 0, sizeof hash);
    int mismatches = 0, nans = 0;
    for (int i = 0; i < NAGENTS; i++) {
        read_slog(steplogs[i], &all[i]);
        for (size_t k = 0; k < all[i].n; k++) {
            struct line *x = &all[i].l[k];
            nans += x->nan;
            if (x->step < 0 || x->step > MAXSTEPS)
                continue;
            if (!hash[x->step][0])
                memcpy(hash[x->step], x->hash, 65);
            else if (strcmp(hash[x->step], x->hash)) {
                mismatches++;
                fprintf(stderr, "agent %d: step %ld hash %.16s differs from %.16s\n", i, x->step, x->hash,
                        hash[x->step]);
            }
        }
    }
    assert_int_equal(mismatches, 0);
    assert_int_equal(nans, 0);

    /* while it was paused, the others' rounds had the two of them only */
    int without = 0;
    for (int i = 0; i < 2; i++)
        for (size_t k = 0; k < held[i].n; k++)
            if (!held[i].l[k].synced && held[i].l[k].step > paused_at) {
                if (held[i].l[k].members != 2)
                    fprintf(stderr, "agent %d: step %ld had %d members while agent %d was paused\n", i,
                            held[i].l[k].step, held[i].l[k].members, PAUSED);
                assert_int_equal(held[i].l[k].members, 2);
                without++;
            }
    assert_true(without >= 2 * 8);
    /* and did not wait for it: the longest gap between two of their steps
       while it was paused (a departure costs a stall, 8 s here, at worst) */
    double gap = 0;
    for (size_t k = 1; k < held[0].n; k++)
        if (held[0].l[k].step > paused_at && !held[0].l[k].synced && !held[0].l[k - 1].synced)
            gap = fmax(gap, (double)(held[0].l[k].t_ms - held[0].l[k - 1].t_ms) / 1000);
    printf("longest step of the others while agent %d was paused: %.2f s\n", PAUSED, gap);
    assert_true(gap < 8.0 * SLOW);

    /* after the resume: its catch-up (the first line after the pause), and
       from two steps after it every step taken with the others, same hash
       (checked above), rounds of three */
    struct slog *p = &all[PAUSED];
    assert_true(p->n > p0.n);
    long caught = p->l[p0.n].step, last = top_step(p);
    printf("resumed with the others at step %ld; its first step after the pause: %ld (%s), last %ld\n",
           resumed_from, caught, p->l[p0.n].synced ? "a state fetched from a peer" : "a round", last);
    assert_true(caught > paused_at);
    assert_true(last >= caught + 6);
    /* the Ctrl-C above reaches the agents one after the other: once the
       first left, the rounds of the two still running have two members */
    long together = last;
    for (int i = 0; i < 2; i++)
        together = top_step(&all[i]) < together ? top_step(&all[i]) : together;
    assert_true(together >= caught + 6);
    static int took[MAXSTEPS + 1];
    memset(took, 0, sizeof took);
    for (size_t k = p0.n; k < p->n; k++)
        if (!p->l[k].synced && p->l[k].step >= 0 && p->l[k].step <= MAXSTEPS) {
            took[p->l[k].step] = 1;
            if (p->l[k].step > caught + 2 && p->l[k].step <= together && p->l[k].members != NAGENTS) {
                fprintf(stderr, "agent %d: step %ld had %d members (all three took steps up to %ld)\n", PAUSED,
                        p->l[k].step, p->l[k].members, together);
                assert_int_equal(p->l[k].members, NAGENTS);
            }
        }
    for (long s = caught + 3; s <= last; s++) {
        if (!took[s])
            fprintf(stderr, "agent %d missed step %ld after its catch-up at %ld\n", PAUSED, s, caught);
        assert_true(took[s]);
    }
}

/* utime + stime of a process, seconds (all its threads) */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* after the command name, which may hold spaces */
    if (!p)
        return -1;
    unsigned long long ut = 0, st = 0;
    /* fields 3.. after ") ": state ppid pgrp session tty tpgid flags minflt
       cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int selected(const char *test)
{
    const char *f = getenv("CT_TEST_FILTER");
    return !f || fnmatch(f, test, 0) == 0;
}

/* Starts test_max_cpu_percent's agent (normal build, test selected). */
static int start_cpu_agent(void)
{
    if (SLOW > 1 || !selected("test_max_cpu_percent"))
        return 0;
    snprintf(g_cpu.log, sizeof g_cpu.log, "%.250s/join.log", g_cpu_dir[0]);
    snprintf(g_cpu.steplog, sizeof g_cpu.steplog, "%.250s/cpu.steps", g_cpu_dir[0]);
    const char *limit[] = {"--max-cpu-percent", "25", NULL};
    g_pids[NAGENTS] = spawn_agent(CPU_RUN, g_cpu_dir[0], g_cpu.log, g_cpu.steplog, limit);
    return g_pids[NAGENTS] > 0 ? 0 : -1;
}

/* Opens the CPU agent's window once it trains (its start-up, the data and
 * the model, is not limited), and closes it CPU_WINDOW_S later with Ctrl-C.
 * Called from every polling loop of this file. */
static void cpu_watch(void)
{
    pid_t pid = g_pids[NAGENTS];
    if (pid <= 0 || g_cpu.phase == 2)
        return;
    if (g_cpu.phase == 0) {
        if (top_step_of(g_cpu.steplog) >= 1) {
            g_cpu.s0 = top_step_of(g_cpu.steplog);
            g_cpu.c0 = proc_cpu_s(pid);
            g_cpu.w0 = mono_s();
            g_cpu.phase = 1;
        }
        return;
    }
    if (mono_s() - g_cpu.w0 < CPU_WINDOW_S)
        return;
    g_cpu.c1 = proc_cpu_s(pid);
    g_cpu.w1 = mono_s();
    g_cpu.s1 = top_step_of(g_cpu.steplog);
    kill(pid, SIGINT);
    g_cpu.phase = 2;
}

static void test_max_cpu_percent(void **state)
{
    (void)state;
    if (SLOW > 1) {
        printf("the CPU limit is measured in the normal build only (a measurement of time)\n");
        return;
    }
    pid_t pid = g_pids[NAGENTS];
    assert_true(pid > 0);
    /* the window, if test_pause_resume did not see it through: training
       within 120 s, then CPU_WINDOW_S */
    for (double t0 = mono_s(); g_cpu.phase < 2 && mono_s() - t0 < 120 + CPU_WINDOW_S;) {
        cpu_watch();
        if (g_cpu.phase < 2)
            usleep(100000);
    }
    assert_int_equal(g_cpu.phase, 2);
    int st = ct_wait(pid, 60 * SLOW);
    g_pids[NAGENTS] = 0;
    assert_int_equal(st, 0);
    double c0 = g_cpu.c0, c1 = g_cpu.c1, w0 = g_cpu.w0, w1 = g_cpu.w1;
    long s0 = g_cpu.s0, s1 = g_cpu.s1;
    assert_true(c0 >= 0 && c1 >= c0);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double budget = 0.25 * (double)ncpu, used = (c1 - c0) / (w1 - w0);
    /* the bound of agent/cpu_limit.h: budget x (T + 1 s of burst) plus one
       unit of work; a micro-batch of 256 on one thread takes ~25 ms here
       (0.1 s allowed: the clock ticks of /proc are 10 ms) */
    double bound = (budget * (w1 - w0 + 1.0) + 0.1) / (w1 - w0);
    printf("--max-cpu-percent 25 on %ld cores: %.3f cores used over %.1f s (budget %.2f, bound %.3f), "
           "steps %ld -> %ld\n", ncpu, used, w1 - w0, budget, bound, s0, s1);
    char *text = ct_read_file(g_cpu.log, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "CPU limit: 25% of"));
    free(text);
    assert_true(used <= bound);
    assert_true(s1 >= s0 + 1); /* it trains, slower */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pause_resume),
        cmocka_unit_test(test_max_cpu_percent),
    };
    if (getenv("CT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("CT_TEST_FILTER"));
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    return failed ? failed : g_teardown_failed;
}
