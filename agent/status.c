/* `crowdtrain-agent status` and the status file behind it (API in
 * status.h). The writer keeps what it needs between calls in one static
 * record: the training thread is its only caller. The file is not fsynced:
 * it is rewritten every second or so, and after a crash a missing or older
 * file is what `status` should see anyway. */
#include "agent/status.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/commands.h"
#include "cm_err.h"
#include "cm_opts.h"

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static struct {
    int64_t started_ms, written_ms, last_error_ms;
    long step;
    char state[32], last_error[512];
    int warned;
} g_w = {.step = -1};

static json_t *num_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

void agent_status_write(const char *dir, const struct agent_status *st, int force)
{
    int64_t now = now_ms();
    if (!g_w.started_ms)
        g_w.started_ms = now;
    const char *state = st->state ? st->state : "training";
    long step = st->step >= 0 ? st->step : g_w.step;
    if (st->error && st->error[0] && strcmp(st->error, g_w.last_error)) {
        snprintf(g_w.last_error, sizeof g_w.last_error, "%s", st->error);
        g_w.last_error_ms = now;
    }
    if (!force && step == g_w.step && !strcmp(state, g_w.state) &&
        now - g_w.written_ms < AGENT_STATUS_MIN_INTERVAL_MS)
        return;
    json_t *j = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:I, s:o, s:o, s:b}",
                          "version", 1, "run", st->run ? st->run : "", "state", state, "pid",
                          (json_int_t)getpid(), "started_ms", (json_int_t)g_w.started_ms,
                          "updated_ms", (json_int_t)now, "step", (json_int_t)step, "steps",
                          (json_int_t)st->steps, "samples", num_or_null(st->samples), "target",
                          num_or_null(st->target), "samples_per_s", num_or_null(st->samples_per_s),
                          "peers", (json_int_t)st->peers, "loss", num_or_null(st->loss), "eta_s",
                          num_or_null(st->eta_s), "pull_only", st->pull_only);
    if (!j)
        return;
    json_object_set_new(j, "error", json_string(st->error ? st->error : ""));
    if (g_w.last_error_ms) {
        json_object_set_new(j, "last_error", json_string(g_w.last_error));
        json_object_set_new(j, "last_error_ms", json_integer(g_w.last_error_ms));
    }
    if (strcmp(state, "training") && strcmp(state, "paused"))
        json_object_set_new(j, "exit_status", json_integer(st->exit_status));
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", dir, AGENT_STATUS_FILE);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int ok = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        ok = fchmod(fd, 0644) == 0 && json_dumpfd(j, fd, JSON_INDENT(2)) == 0 && write(fd, "\n", 1) == 1;
        ok = close(fd) == 0 && ok;
        ok = ok && rename(tmp, path) == 0;
        if (!ok)
            unlink(tmp);
    }
    json_decref(j);
    if (!ok && !g_w.warned) {
        g_w.warned = 1;
        fprintf(stderr, "warning: cannot write %s (crowdtrain-agent status will not see this agent): %s\n",
                path, strerror(errno));
    }
    if (ok) {
        g_w.written_ms = now;
        g_w.step = step;
        snprintf(g_w.state, sizeof g_w.state, "%s", state);
    }
}

/* ---- reading ---- */

static double num(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static int64_t integer(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

static void str(json_t *o, const char *k, char *out, size_t cap)
{
    const char *s = json_string_value(json_object_get(o, k));
    snprintf(out, cap, "%s", s ? s : "");
}

int agent_status_parse(const char *text, size_t len, struct agent_status_view *out)
{
    memset(out, 0, sizeof *out);
    json_t *j = json_loadb(text, len, 0, NULL);
    if (!json_is_object(j) || integer(j, "version") != 1 || !json_is_string(json_object_get(j, "state")) ||
        !json_is_integer(json_object_get(j, "updated_ms")) || !json_is_integer(json_object_get(j, "pid"))) {
        json_decref(j);
        return CM_EPARSE;
    }
    str(j, "run", out->run, sizeof out->run);
    str(j, "state", out->state, sizeof out->state);
    str(j, "last_error", out->last_error, sizeof out->last_error);
    out->step = (long)integer(j, "step");
    out->steps = (long)integer(j, "steps");
    out->samples = num(j, "samples");
    out->target = num(j, "target");
    out->samples_per_s = num(j, "samples_per_s");
    out->loss = num(j, "loss");
    out->eta_s = num(j, "eta_s");
    out->peers = (size_t)integer(j, "peers");
    out->pull_only = json_is_true(json_object_get(j, "pull_only"));
    out->exit_status = (int)integer(j, "exit_status");
    out->pid = (long)integer(j, "pid");
    out->started_ms = integer(j, "started_ms");
    out->updated_ms = integer(j, "updated_ms");
    out->last_error_ms = out->last_error[0] ? integer(j, "last_error_ms") : 0;
    json_decref(j);
    return CM_OK;
}

enum agent_status_alive agent_status_pid_alive(long pid)
{
    if (pid <= 0)
        return AGENT_ALIVE_NO;
    char p[64], comm[64] = "";
    snprintf(p, sizeof p, "/proc/%ld/comm", pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return errno == ENOENT ? AGENT_ALIVE_NO : AGENT_ALIVE_UNKNOWN;
    if (!fgets(comm, sizeof comm, f))
        comm[0] = '\0';
    fclose(f);
    /* the kernel keeps 15 characters of the name: "crowdtrain-agen"; a
       reused pid names another program */
    return strncmp(comm, "crowdtrain-agen", 15) == 0 ? AGENT_ALIVE_YES : AGENT_ALIVE_NO;
}

static void ago(int64_t ms, char *out, size_t cap)
{
    long s = (long)(ms / 1000);
    if (s < 120)
        snprintf(out, cap, "%ld s ago", s < 0 ? 0 : s);
    else if (s < 7200)
        snprintf(out, cap, "%ld min ago", s / 60);
    else if (s < 172800)
        snprintf(out, cap, "%ld h ago", s / 3600);
    else
        snprintf(out, cap, "%ld days ago", s / 86400);
}

static void utc(int64_t ms, char *out, size_t cap)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

int agent_status_print(FILE *f, const char *path, const struct agent_status_view *v, int64_t now,
                       enum agent_status_alive alive)
{
    char a[64], when[64];
    ago(now - v->updated_ms, a, sizeof a);
    utc(v->updated_ms, when, sizeof when);
    int training = !strcmp(v->state, "training"), paused = !strcmp(v->state, "paused");
    int live = training || paused; /* a paused agent runs, and keeps the file fresh */
    int stale = now - v->updated_ms > AGENT_STATUS_STALE_MS;
    fprintf(f, "%s\n  updated:   %s (%s)\n", path, when, a);
    utc(v->started_ms, when, sizeof when);
    if (alive == AGENT_ALIVE_YES)
        fprintf(f, "  agent:     running (pid %ld, started %s)\n", v->pid, when);
    else if (alive == AGENT_ALIVE_UNKNOWN)
        fprintf(f, "  agent:     pid %ld, cannot tell whether it runs (started %s)\n", v->pid, when);
    else if (live)
        fprintf(f, "  agent:     NOT RUNNING: pid %ld is gone and left no final state (killed, or "
                   "the machine stopped?)\n", v->pid);
    else
        fprintf(f, "  agent:     not running (pid %ld exited)\n", v->pid);
    fprintf(f, "  run:       %s\n", v->run[0] ? v->run : "?");
    if (training)
        fprintf(f, "  state:     training%s\n", v->pull_only ? " (pull-only: the schedule says not to compute)" : "");
    else if (paused)
        fprintf(f, "  state:     paused: in the run, computing and averaging nothing "
                   "(crowdtrain-agent resume goes on)\n");
    else
        fprintf(f, "  state:     %s (exit status %d)\n", v->state, v->exit_status);
    fprintf(f, "  step:      %ld of %ld", v->step, v->steps);
    if (training && isfinite(v->samples) && isfinite(v->target) && v->target > 0)
        fprintf(f, ", samples %.0f of %.0f (%.0f%%)", v->samples, v->target, 100.0 * v->samples / v->target);
    fprintf(f, "\n  peers:     %zu\n", v->peers);
    if (training) {
        fprintf(f, "  speed:     %.1f samples/s", isfinite(v->samples_per_s) ? v->samples_per_s : 0.0);
        if (isfinite(v->loss))
            fprintf(f, ", loss %.4f", v->loss);
        if (isfinite(v->eta_s))
            fprintf(f, ", next step in %.1f s", v->eta_s);
        fprintf(f, "\n");
    }
    if (v->last_error_ms) {
        ago(now - v->last_error_ms, a, sizeof a);
        fprintf(f, "  last error: %s: %s\n", a, v->last_error);
    } else {
        fprintf(f, "  last error: none\n");
    }
    if (live && alive != AGENT_ALIVE_NO && stale)
        fprintf(f, "  warning:   no update for more than %d s: the agent may be stuck "
                   "(journalctl -u crowdtrain-agent, or its terminal)\n", AGENT_STATUS_STALE_MS / 1000);
    return live && alive != AGENT_ALIVE_NO && !stale ? 0 : 1;
}

/* ---- the command ---- */

struct status_cfg {
    char *config_dir;
};
static const struct cm_opt STATUS_OPTS[] = {
    {"config-dir", CM_OPT_STR, offsetof(struct status_cfg, config_dir), NULL, "DIR",
     "the agent's state directory (default: yours, ~/.config/crowdtrain, and the service's, "
     AGENT_STATUS_SYSTEM_DIR ")", 0},
};
static const struct cm_cmd_spec STATUS = {
    "crowdtrain-agent status [--config-dir DIR]",
    "Says what an agent is doing (run, step, peers, speed, last error) from the\n"
    "status file a training agent keeps in its state directory, how fresh that\n"
    "file is and whether the agent that wrote it still runs. Without\n"
    "--config-dir it looks in your own state directory and the service's.\n"
    "Exit status: 0 training or paused, 1 not training (stopped, finished,\n"
    "stale), 3 no status file.",
    STATUS_OPTS, sizeof STATUS_OPTS / sizeof STATUS_OPTS[0], 0};

int agent_status_read(const char *dir, int quiet_absent, struct agent_status_view *v, char *path,
                      size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, AGENT_STATUS_FILE);
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) {
            if (!quiet_absent)
                printf("%s: absent: no agent has trained with this state directory yet (the file "
                       "appears once training starts)\n", path);
            return 3;
        }
        printf("%s: cannot read it: %s%s\n", path, strerror(errno),
               errno == EACCES ? " (try with sudo)" : "");
        return 4;
    }
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    if (agent_status_parse(buf, n, v) != CM_OK) {
        printf("%s: not a status file this agent understands\n", path);
        return 4;
    }
    return 0;
}

size_t agent_status_dirs(const char *config_dir, char *mine, size_t cap, const char *dirs[2])
{
    if (config_dir) {
        dirs[0] = config_dir;
        return 1;
    }
    /* the same default as agent_state_dir (client.h), without creating it */
    mine[0] = '\0';
    const char *env = getenv("CROWDTRAIN_CONFIG_DIR"), *xdg = getenv("XDG_CONFIG_HOME"),
               *home = getenv("HOME");
    if (env && *env)
        snprintf(mine, cap, "%s", env);
    else if (xdg && *xdg)
        snprintf(mine, cap, "%s/crowdtrain", xdg);
    else if (home && *home)
        snprintf(mine, cap, "%s/.config/crowdtrain", home);
    size_t n = 0;
    if (mine[0] && strcmp(mine, AGENT_STATUS_SYSTEM_DIR))
        dirs[n++] = mine;
    dirs[n++] = AGENT_STATUS_SYSTEM_DIR;
    return n;
}

int64_t agent_status_now_ms(void)
{
    return now_ms();
}

/* 0/1 as agent_status_print, 3 when there is no file, 4 when it cannot be read. */
static int show(const char *dir, int quiet_absent)
{
    char path[4200];
    struct agent_status_view v;
    int rc = agent_status_read(dir, quiet_absent, &v, path, sizeof path);
    if (rc)
        return rc;
    return agent_status_print(stdout, path, &v, now_ms(), agent_status_pid_alive(v.pid));
}

int agent_cmd_status(int argc, char **argv)
{
    struct status_cfg cfg = {0};
    int rc = cm_opts_parse(&STATUS, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(&STATUS, &cfg);
        return rc == 1 ? 0 : 2;
    }
    int status;
    if (cfg.config_dir) {
        status = show(cfg.config_dir, 0);
    } else {
        char mine[4096];
        const char *dirs[2];
        size_t nd = agent_status_dirs(NULL, mine, sizeof mine, dirs);
        int best = 3, shown = 0;
        for (size_t i = 0; i < nd; i++) {
            int r = show(dirs[i], 1);
            if (r == 3)
                continue;
            shown++;
            if (r < best)
                best = r;
        }
        if (!shown)
            printf("no agent status: neither %s%s%s has a %s (it appears once an agent trains; for "
                   "the service: systemctl status crowdtrain-agent)\n",
                   nd > 1 ? dirs[0] : "", nd > 1 ? " nor " : "", AGENT_STATUS_SYSTEM_DIR,
                   AGENT_STATUS_FILE);
        status = best;
    }
    cm_opts_free(&STATUS, &cfg);
    return status;
}
