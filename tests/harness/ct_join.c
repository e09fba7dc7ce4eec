/* See ct_join.h. */
#include "ct_join.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ct_join_setup(struct ct_join *j, const char *run, long steps)
{
    /* separate hosts where we may make them: the coordinator's first (this
       process moves there, with PostgreSQL), then one per agent */
    if (ct_net_collab(&j->net, "agent", CT_JOIN_AGENTS, j->host, &j->hosts) != 0)
        return -1;
    int rc = ct_pg_start(&j->pg);
    if (rc == CT_SKIP)
        exit(CT_SKIP);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
        exit(CT_SKIP);
    }
    /* Passes live 90 s, so the agents must renew theirs (at a third left)
       several times during the run, or their peers would refuse them. */
    const char *args[] = {"--pass-ttl", "90", j->hosts ? "--listen" : NULL, "0.0.0.0:8443", "--public-url",
                          "https://10.77.0.10:8443", "--dht-listen-ip", "0.0.0.0", NULL};
    if (rc != 0 || ct_create_user(j->pg.url, "org", "organizer", "organizer-password") != 0 ||
        ct_coord_start(&j->c, j->pg.url, NULL, args) != 0)
        return -1;
    j->org = ct_login(&j->c, "org", "organizer-password");
    char *body = ct_join_run_body(j, run, steps);
    struct ct_resp r;
    ct_http(&j->c, "POST", "/api/v1/runs", j->org, body, &r);
    free(body);
    if (r.status != 201)
        return -1;
    ct_resp_free(&r);
    return j->hosts ? ct_net_volunteers(&j->net, &j->c, j->org, run, "https://10.77.0.10:8443", 0, CT_JOIN_AGENTS,
                                        j->host, j->dirs)
                    : ct_volunteers(&j->c, j->org, run, CT_JOIN_AGENTS, j->dirs);
}

int ct_join_teardown(struct ct_join *j)
{
    int rc = ct_coord_cleanup(&j->c);
    ct_pg_stop(&j->pg);
    if (j->hosts)
        ct_net_destroy(&j->net);
    for (int i = 0; i < CT_JOIN_AGENTS; i++)
        if (j->dirs[i][0] && !getenv("CT_KEEP_LOGS"))
            ct_rmrf(j->dirs[i]);
    free(j->org);
    j->org = NULL;
    return rc;
}

char *ct_join_run_body(const struct ct_join *j, const char *name, long steps)
{
    json_t *cfg = ct_fmnist_recipe(steps);
    if (!cfg)
        return NULL;
    if (j->target)
        json_object_set_new(cfg, "batch_size", json_integer(j->target));
    if (j->lr > 0)
        json_object_set_new(json_object_get(cfg, "optimizer"), "lr", json_real(j->lr));
    char *s = ct_run_body(name, cfg);
    json_decref(cfg);
    return s;
}

static int allow_all(struct ct_join *j, const char *run)
{
    for (int i = 0; i < CT_JOIN_AGENTS; i++) {
        char path[128];
        struct ct_resp r;
        snprintf(path, sizeof path, "/api/v1/runs/%s/allowlist/vol%d", run, i);
        ct_http(&j->c, "PUT", path, j->org, NULL, &r);
        int st = (int)r.status;
        ct_resp_free(&r);
        if (st != 200 && st != 201 && st != 204)
            return -1;
    }
    return 0;
}

int ct_join_create_run(struct ct_join *j, const char *name, long steps)
{
    char *body = ct_join_run_body(j, name, steps);
    struct ct_resp r;
    ct_http(&j->c, "POST", "/api/v1/runs", j->org, body, &r);
    free(body);
    int st = (int)r.status;
    ct_resp_free(&r);
    return st == 201 ? allow_all(j, name) : -1;
}

pid_t ct_join_spawn(const struct ct_join *j, const char *dir, int i, const char *run, const char *log,
                    const char *steplog, const char *const *extra, const char *window_ms, const char *margin_ms)
{
    const char *argv[40] = {ct_bin("crowdtrain-agent"), "join", "--run", run, "--config-dir", dir,
                            "--device", "cpu", "--round-window-ms", window_ms, "--gather-margin-ms", margin_ms,
                            "--outcome-window-ms", "1000", "--stall-ms", "4000", "--step-log", steplog};
    size_t n = 18;
    if (!j->hosts) {
        argv[n++] = "--listen-ip";
        argv[n++] = "127.0.0.1";
    }
    for (size_t k = 0; extra && extra[k] && n < 38; k++)
        argv[n++] = extra[k];
    argv[n] = NULL;
    return j->hosts ? ct_net_spawn(&j->net, j->host[i], argv, log) : ct_spawn(argv, log);
}

long ct_join_last_step(const char *log)
{
    char *t = ct_read_file(log, NULL);
    long best = -1;
    for (char *p = t; p && (p = strstr(p, "step ")) != NULL; p += 5) {
        char *end;
        long v = strtol(p + 5, &end, 10);
        if (end != p + 5 && *end == ' ' && v > best)
            best = v;
    }
    free(t);
    return best;
}

int ct_join_wait_step(const char *log, long step, int timeout_s)
{
    for (int i = 0; i < timeout_s * 10; i++) {
        if (ct_join_last_step(log) >= step)
            return 1;
        usleep(100000);
    }
    return 0;
}

double ct_join_accuracy(const char *log)
{
    const char *p = strstr(log, "evaluation at step");
    const char *a = p ? strstr(p, "accuracy ") : NULL;
    return a ? atof(a + 9) : -1;
}
