/* See ct_hostrun.h. */
#include "ct_hostrun.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "ct_harness.h"

double ct_hostrun_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int ct_hostrun_start(struct ct_hostrun *c, const struct ct_net *net, const char *extra0, const char *extra1)
{
    c->t0 = ct_hostrun_now();
    for (int i = 0; i < c->n; i++) {
        c->status[i] = -1;
        snprintf(c->log[i], sizeof c->log[i], "%.250s/join.log", c->dir[i]);
        snprintf(c->steps[i], sizeof c->steps[i], "%.250s/join.steps", c->dir[i]);
        const char *argv[24] = {ct_bin("crowdtrain-agent"), "join", "--run", c->run, "--config-dir", c->dir[i],
                                "--device", "cpu", "--step-log", c->steps[i]};
        int a = 10;
        if (c->eval) {
            argv[a++] = "--round-window-ms";
            argv[a++] = "100";
            argv[a++] = "--gather-margin-ms";
            argv[a++] = "30";
        } else {
            argv[a++] = "--no-eval";
        }
        if (extra0)
            argv[a++] = extra0;
        if (extra1)
            argv[a++] = extra1;
        for (int k = 0; c->extra_of[i][k] && a < 23; k++)
            argv[a++] = c->extra_of[i][k];
        argv[a] = NULL;
        if ((c->pid[i] = ct_net_spawn(net, c->host[i], argv, c->log[i])) <= 0)
            return -1;
    }
    return 0;
}

void ct_hostrun_watch(struct ct_hostrun *c)
{
    for (int i = 0; i < c->n; i++) {
        if (c->reach_at[i] || !c->t0)
            continue;
        char *log = ct_read_file(c->log[i], NULL);
        if (log && strstr(log, "reachability: "))
            c->reach_at[i] = ct_hostrun_now() - c->t0;
        free(log);
    }
}

int ct_hostrun_reap(struct ct_hostrun *c)
{
    int left = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] <= 0)
            continue;
        int st = 0;
        if (waitpid(c->pid[i], &st, WNOHANG) == c->pid[i]) {
            c->status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            c->pid[i] = 0;
        } else {
            left++;
        }
    }
    return left;
}

void ct_hostrun_stop(struct ct_hostrun *c)
{
    for (int i = 0; i < c->n; i++)
        if (c->pid[i] > 0) {
            kill(c->pid[i], SIGKILL);
            ct_wait(c->pid[i], 10);
            c->pid[i] = 0;
        }
}

void ct_hostrun_cleanup(struct ct_hostrun *c)
{
    ct_hostrun_stop(c);
    for (int i = 0; i < CT_HOSTRUN_MAX && !getenv("CT_KEEP_LOGS"); i++)
        if (c->dir[i][0])
            ct_rmrf(c->dir[i]);
}

int ct_punch_log_read(const char *steplog, struct ct_punch_log *out)
{
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(steplog, "r");
    if (!fp)
        return -1;
    char line[2048];
    while (fgets(line, sizeof line, fp)) {
        json_t *j = json_loads(line, 0, NULL);
        long p = j ? (long)json_integer_value(json_object_get(j, "punched")) : 0;
        long r = j ? (long)json_integer_value(json_object_get(j, "relayed_aggs")) : 0;
        if (p > out->most)
            out->most = p;
        if (p > 0 && !out->first)
            out->first = (long)json_integer_value(json_object_get(j, "step"));
        if (out->first) { /* from the first punched step on: through holes still */
            out->after++;
            out->held += p >= 1;
        }
        if (r > out->relayed_aggs)
            out->relayed_aggs = r;
        json_decref(j);
    }
    fclose(fp);
    return 0;
}
