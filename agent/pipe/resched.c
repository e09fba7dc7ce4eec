/* Entering an assignment, the first one or a later one after a stage agent
 * left (docs/pipelines.md, "Re-scheduling"; seed 003 lists "scheduling
 * over a dynamic environment and fault tolerance" as future work):
 *
 *   1. wait for an assignment newer than the one we trained under that
 *      gives us a slot;
 *   2. say on the run's DHT what state we hold: "RUN/pipe/ready/VERSION" =
 *      "HAD_VERSION HAD_STAGE DONE" (the assignment our state was trained
 *      under, 0 for none; its stage; the steps it completed);
 *   3. once every member of the new assignment said so: the holders are
 *      the members whose state is of the newest earlier assignment, and
 *      the step to go on from is the fewest steps any of them completed (a
 *      step in progress when the agent left may have been completed by
 *      some: they go back one, from the snapshot taken before each step);
 *      nobody holding state means a fresh start at step 0;
 *   4. every holder serves its stage's state at that step (a checkpoint
 *      file, common/ckpt, on its state host); every member loads the state
 *      of its new stage from a holder of that stage (itself when it keeps
 *      its stage);
 *   5. the first stages read the training stream again up to that step.
 *
 * So every stage of the new assignment goes on from the same step with the
 * parameters and optimizer state the run had there, and the data the
 * single process would see next. */
#include "agent/pipe/stage_int.h"
#include "agent/pipe/records.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "cm_err.h"

#define READY_KEY_FMT "%s/pipe/ready/%lld"
#define STATE_FORMAT "crowdtrain-pipeline-stage/1"
#define FETCH_MS 120000
#define FETCH_READY_MS 30000

/* ---- snapshot before each step's update ---- */

int pipe_snapshot(struct pstage *s)
{
    struct kern_model *m = s->tr.model;
    struct kern_optim *o = s->tr.opt;
    size_t n = m->nparams;
    if (s->snap_n != n) {
        free(s->snap);
        s->snap = malloc(3 * n * sizeof *s->snap);
        s->snap_n = s->snap ? n : 0;
        if (!s->snap)
            return CM_ENOMEM;
    }
    const struct kern_backend *be = s->tr.be;
    int rc = be->download(s->snap, m->params, n * sizeof(float));
    if (rc == CM_OK)
        rc = be->download(s->snap + n, o->m, n * sizeof(float));
    if (rc == CM_OK)
        rc = be->download(s->snap + 2 * n, o->v, n * sizeof(float));
    s->snap_step = rc == CM_OK ? o->step : -1;
    return rc;
}

/* ---- the state of our stage as a checkpoint ---- */

/* Our stage's state after `step` steps (now, or from the snapshot) as the
 * bytes of a checkpoint file (heap). */
static int state_bytes(struct pstage *s, int64_t step, uint8_t **out, size_t *len)
{
    struct kern_model *m = s->tr.model;
    struct kern_optim *o = s->tr.opt;
    size_t n = m->nparams;
    float *host = malloc(3 * n * sizeof *host);
    if (!host)
        return CM_ENOMEM;
    int rc = CM_OK;
    if (o->step == step) {
        const struct kern_backend *be = s->tr.be;
        rc = be->download(host, m->params, n * sizeof(float));
        if (rc == CM_OK)
            rc = be->download(host + n, o->m, n * sizeof(float));
        if (rc == CM_OK)
            rc = be->download(host + 2 * n, o->v, n * sizeof(float));
    } else if (s->snap && s->snap_step == step && s->snap_n == n) {
        memcpy(host, s->snap, 3 * n * sizeof *host);
    } else {
        rc = CM_ESTATE;
    }
    char cfg[256], path[4500];
    snprintf(cfg, sizeof cfg,
             "{\"format\":\"" STATE_FORMAT "\",\"version\":%lld,\"stage\":%u,\"stages\":%u,\"first_layer\":%d,"
             "\"n_layers\":%d}",
             (long long)s->state_version, s->had_stage, s->S, s->st.first_layer, s->st.n_layers);
    snprintf(path, sizeof path, "%s/pipeline-stage-out.ckpt", s->rt.rundir);
    struct cm_ckpt_buf bufs[2] = {{"adam.m", host + n, n}, {"adam.v", host + 2 * n, n}};
    struct cm_ckpt c = {.step = (uint64_t)step, .params = host, .n_params = n, .opt = bufs, .n_opt = 2,
                        .config = cfg, .config_len = (uint32_t)strlen(cfg)};
    if (rc == CM_OK)
        rc = cm_ckpt_write(path, &c, NULL);
    free(host);
    if (rc == CM_OK) {
        FILE *f = fopen(path, "rb");
        long sz = -1;
        if (f && fseek(f, 0, SEEK_END) == 0)
            sz = ftell(f);
        uint8_t *b = sz > 0 ? malloc((size_t)sz) : NULL;
        rc = b && fseek(f, 0, SEEK_SET) == 0 && fread(b, 1, (size_t)sz, f) == (size_t)sz ? CM_OK : CM_EIO;
        if (f)
            fclose(f);
        if (rc == CM_OK) {
            *out = b;
            *len = (size_t)sz;
        } else {
            free(b);
        }
    }
    unlink(path);
    return rc;
}

/* Loads stage `stage`'s state of `step` from the checkpoint at path into
 * the trainer (whose model is that stage's). */
static int load_state(struct pstage *s, const char *path, uint32_t stage, int64_t step, char *err, size_t cap)
{
    struct cm_ckpt c;
    int rc = cm_ckpt_read(path, &c);
    if (rc != CM_OK) {
        snprintf(err, cap, "unreadable: %s", cm_strerror(rc));
        return rc;
    }
    struct kern_model *m = s->tr.model;
    struct kern_optim *o = s->tr.opt;
    size_t n = m->nparams;
    json_t *j = c.config ? json_loads(c.config, 0, NULL) : NULL;
    const char *fmt = json_string_value(json_object_get(j, "format"));
    const struct cm_ckpt_buf *bm = cm_ckpt_find(&c, "adam.m"), *bv = cm_ckpt_find(&c, "adam.v");
    rc = CM_EINVAL;
    if (!fmt || strcmp(fmt, STATE_FORMAT))
        snprintf(err, cap, "not a pipeline stage's state");
    else if (json_integer_value(json_object_get(j, "stage")) != stage ||
             json_integer_value(json_object_get(j, "stages")) != s->S)
        snprintf(err, cap, "the state of stage %lld of %lld, not of stage %u of %u",
                 (long long)json_integer_value(json_object_get(j, "stage")),
                 (long long)json_integer_value(json_object_get(j, "stages")), stage, s->S);
    else if ((int64_t)c.step != step)
        snprintf(err, cap, "the state after step %llu, not %lld", (unsigned long long)c.step, (long long)step);
    else if (c.n_params != n || !bm || !bv || bm->count != n || bv->count != n)
        snprintf(err, cap, "%llu parameters, the stage has %zu", (unsigned long long)c.n_params, n);
    else
        rc = CM_OK;
    const struct kern_backend *be = s->tr.be;
    if (rc == CM_OK && !(be->all_finite(c.params, n) && be->all_finite(bm->data, n) && be->all_finite(bv->data, n))) {
        snprintf(err, cap, "values that are not finite");
        rc = CM_ENUMERIC;
    }
    if (rc == CM_OK)
        rc = be->upload(m->params, c.params, n * sizeof(float));
    if (rc == CM_OK)
        rc = be->upload(o->m, bm->data, n * sizeof(float));
    if (rc == CM_OK)
        rc = be->upload(o->v, bv->data, n * sizeof(float));
    if (rc == CM_OK)
        o->step = (long)step;
    json_decref(j);
    cm_ckpt_cleanup(&c);
    return rc;
}

/* ---- who holds what ---- */

struct ready {
    uint8_t pub[CM_ED25519_PUB_LEN];
    int64_t had_version, done;
    int had_stage, seen;
};

/* Reads the "ready" records of everyone in assignment s->version (members
 * and spares) until all are there. CM_EBUSY when the coordinator serves a
 * newer assignment meanwhile (one of them is gone: it re-solved). */
static int gather_ready(struct pstage *s, struct ready *r, size_t n, double end, const char *mine)
{
    double next_check = peer_mono_s() + 2;
    char key[200];
    snprintf(key, sizeof key, READY_KEY_FMT, s->o.run, (long long)s->version);
    for (;;) {
        struct peer_record *rec = NULL;
        size_t nr = 0, seen = 0;
        if (peer_net_get(s->rt.net, key, &rec, &nr) == CM_OK)
            for (size_t i = 0; i < nr; i++)
                for (size_t k = 0; k < n; k++) {
                    int64_t hv, done;
                    int hs;
                    if (!memcmp(rec[i].author, r[k].pub, CM_ED25519_PUB_LEN) &&
                        pipe_ready_parse(rec[i].value, rec[i].len, s->version, s->S, &hv, &hs, &done) == CM_OK) {
                        r[k].had_version = hv;
                        r[k].had_stage = hs;
                        r[k].done = done;
                        r[k].seen = 1;
                    }
                }
        peer_records_free(rec, nr);
        for (size_t k = 0; k < n; k++)
            seen += r[k].seen;
        if (seen == n)
            return CM_OK;
        if (pipe_g_interrupts)
            return CM_ECANCELED;
        if (peer_mono_s() > end) {
            fprintf(stderr, "error: %zu of the %zu agents of assignment %lld did not say what state they hold "
                            "within %ld s\n", n - seen, n, (long long)s->version, s->o.wait_s);
            return CM_ETIMEOUT;
        }
        if (peer_mono_s() >= next_check) {
            /* ours again (stored on the nodes closest to the key now: see
               pipe_keep_announced), our addresses too */
            peer_net_put(s->rt.net, key, mine, strlen(mine), 600000);
            pipe_keep_announced(s);
            if (pipe_served_version(s) > s->version) {
                printf("assignment %lld is already replaced (%zu of its %zu agents did not answer)\n",
                       (long long)s->version, n - seen, n);
                return CM_EBUSY;
            }
            next_check = peer_mono_s() + 2;
        }
        usleep(300000);
    }
}

static int fetch_idle(void *arg, int moving)
{
    (void)arg;
    (void)moving;
    return pipe_g_interrupts != 0;
}

/* The state host address of a peer, from its record on the run's DHT. */
static int addr_of(struct pstage *s, const uint8_t pub[CM_ED25519_PUB_LEN], char out[PEER_ADDR_MAX])
{
    char key[160];
    snprintf(key, sizeof key, PIPE_PEERS_KEY_FMT, s->o.run);
    struct peer_record *r = NULL;
    size_t nr = 0;
    int rc = peer_net_get(s->rt.net, key, &r, &nr);
    if (rc != CM_OK)
        return rc;
    rc = CM_ENOTFOUND;
    char ar[PEER_ADDR_MAX];
    for (size_t i = 0; i < nr && rc != CM_OK; i++)
        if (!memcmp(r[i].author, pub, CM_ED25519_PUB_LEN) && pipe_peers_parse(r[i].value, r[i].len, out, ar) == CM_OK)
            rc = CM_OK;
    peer_records_free(r, nr);
    return rc;
}

/* Steps 2 and 3 for assignment s->version: says what we hold, reads what
 * everyone in it holds (*r: members, then spares; heap), the newest
 * earlier assignment anyone's state is of (*hv, 0: none) and the step to go
 * on from; then, when we hold state of *hv, serves it at that step. */
static int agree(struct pstage *s, struct ready **rout, int64_t *hv_out, int64_t *step_out)
{
    double end = peer_mono_s() + (double)s->o.wait_s;
    int64_t done = s->have_tr ? s->tr.opt->step : 0;
    char key[200], val[96];
    snprintf(key, sizeof key, READY_KEY_FMT, s->o.run, (long long)s->version);
    snprintf(val, sizeof val, "%lld %d %lld", (long long)(s->have_tr ? s->state_version : 0),
             s->have_tr ? (int)s->had_stage : -1, (long long)done);
    int rc = peer_net_put(s->rt.net, key, val, strlen(val), 600000);
    if (rc != CM_OK) {
        fprintf(stderr, "error: saying what state this agent holds on the run's DHT: %s\n", cm_strerror(rc));
        return rc;
    }
    size_t n = s->n_members + s->n_spares;
    struct ready *r = calloc(n, sizeof *r);
    if (!r)
        return CM_ENOMEM;
    for (size_t k = 0; k < n; k++)
        memcpy(r[k].pub, s->all[k], CM_ED25519_PUB_LEN);
    if ((rc = gather_ready(s, r, n, end, val)) != CM_OK) {
        free(r);
        return rc;
    }
    int64_t hv = 0, step = -1;
    for (size_t k = 0; k < n; k++)
        hv = r[k].had_version > hv ? r[k].had_version : hv;
    for (size_t k = 0; hv > 0 && k < n; k++)
        if (r[k].had_version == hv && (step < 0 || r[k].done < step))
            step = r[k].done;
    if (hv == 0)
        step = 0;
    if (s->have_tr && s->state_version == hv && hv > 0) {
        uint8_t *bytes = NULL;
        size_t len = 0;
        if ((rc = state_bytes(s, step, &bytes, &len)) != CM_OK) {
            fprintf(stderr, "error: this agent's state after step %lld: %s\n", (long long)step, cm_strerror(rc));
            free(r);
            return rc;
        }
        peer_net_state_publish(s->rt.net, step, bytes, len);
    }
    *rout = r;
    *hv_out = hv;
    *step_out = step;
    return CM_OK;
}

int pipe_spare_serve(struct pstage *s)
{
    struct ready *r = NULL;
    int64_t hv, step;
    int rc = agree(s, &r, &hv, &step);
    if (rc == CM_OK && s->have_tr && s->state_version == hv && hv > 0)
        printf("serving stage %u's state after step %lld to assignment %lld (this agent is its spare)\n",
               s->had_stage, (long long)step, (long long)s->version);
    free(r);
    return rc;
}

#define FINISHED_KEY_FMT "%s/pipe/finished/%lld"

int pipe_all_finished(struct pstage *s, int64_t steps)
{
    char key[200];
    snprintf(key, sizeof key, FINISHED_KEY_FMT, s->o.run, (long long)s->version);
    struct peer_record *rec = NULL;
    size_t nr = 0, seen = 0;
    if (peer_net_get(s->rt.net, key, &rec, &nr) != CM_OK)
        return 0;
    for (size_t k = 0; k < s->n_members; k++)
        for (size_t i = 0; i < nr; i++) {
            char v[32];
            if (memcmp(rec[i].author, s->all[k], CM_ED25519_PUB_LEN) || rec[i].len >= sizeof v)
                continue;
            memcpy(v, rec[i].value, rec[i].len);
            v[rec[i].len] = 0;
            if (strtoll(v, NULL, 10) == steps) {
                seen++;
                break;
            }
        }
    peer_records_free(rec, nr);
    return s->n_members > 0 && seen == s->n_members;
}

void pipe_finish(struct pstage *s, int64_t steps)
{
    char key[200], val[32];
    snprintf(key, sizeof key, FINISHED_KEY_FMT, s->o.run, (long long)s->version);
    snprintf(val, sizeof val, "%lld", (long long)steps);
    if (peer_net_put(s->rt.net, key, val, strlen(val), 600000) != CM_OK)
        return;
    double end = peer_mono_s() + 60, again = peer_mono_s() + 2;
    while (!pipe_g_interrupts && peer_mono_s() < end && !pipe_all_finished(s, steps)) {
        usleep(200000);
        if (peer_mono_s() >= again) { /* stored where lookups look now */
            peer_net_put(s->rt.net, key, val, strlen(val), 600000);
            again = peer_mono_s() + 2;
        }
    }
}

int pipe_enter(struct pstage *s, int64_t after_version, int64_t *from_step)
{
    struct ready *r = NULL;
    int64_t hv = 0, step = 0;
    int rc;
    for (;;) {
        if ((rc = pipe_wait_assignment(s, after_version)) != CM_OK || s->run_finished)
            return rc;
        if ((rc = agree(s, &r, &hv, &step)) != CM_EBUSY)
            break;
        after_version = s->version; /* replaced while we agreed: the next one */
    }
    if (rc != CM_OK)
        return rc;
    size_t n = s->n_members + s->n_spares;
    uint32_t old_stage = s->had_stage;
    if (!s->have_tr || old_stage != s->stage) {
        char err[512];
        struct kern_tfm_stage st[PIPE_MAX_STAGES];
        if (s->have_tr)
            agent_trainer_cleanup(&s->tr);
        s->have_tr = 0;
        if ((rc = kern_tfm_stages_split(&s->tc.tfm, (int)s->S, st)) != CM_OK ||
            (rc = agent_trainer_init_stage(&s->tr, &s->tc, &st[s->stage], err, sizeof err)) != CM_OK) {
            fprintf(stderr, "error: stage %u: %s\n", s->stage, err);
            free(r);
            return rc ? rc : CM_EINVAL;
        }
        s->st = st[s->stage];
        s->have_tr = 1;
    }
    if (hv > 0) {
        /* a holder of our new stage: ourselves first, else the first in the assignment's order */
        size_t h = n;
        for (size_t k = 0; k < n && h == n; k++)
            if (r[k].had_version == hv && r[k].had_stage == (int)s->stage &&
                !memcmp(r[k].pub, s->rt.key.pub, CM_ED25519_PUB_LEN))
                h = k;
        for (size_t k = 0; k < n && h == n; k++)
            if (r[k].had_version == hv && r[k].had_stage == (int)s->stage)
                h = k;
        if (h == n) {
            fprintf(stderr, "error: no agent of assignment %lld holds stage %u any more: the run cannot go on "
                            "(stage checkpoints are not there yet)\n", (long long)s->version, s->stage);
            free(r);
            return CM_ENOTFOUND;
        }
        char addr[PEER_ADDR_MAX], path[4500], err[256] = "";
        snprintf(path, sizeof path, "%s/pipeline-stage-in.ckpt", s->rt.rundir);
        int64_t got = -1;
        rc = addr_of(s, r[h].pub, addr);
        double until = peer_mono_s() + FETCH_MS / 1000.0;
        /* a holder may still serve an earlier state of the same step: try until ours */
        while (rc == CM_OK) {
            rc = peer_net_state_fetch(s->rt.net, addr, r[h].pub, step, path, &got, FETCH_MS, FETCH_READY_MS,
                                      fetch_idle, NULL);
            if (rc == CM_OK && (rc = load_state(s, path, s->stage, step, err, sizeof err)) == CM_OK)
                break;
            if (rc == CM_ECANCELED || peer_mono_s() > until)
                break;
            rc = CM_OK;
            usleep(300000);
        }
        unlink(path);
        if (rc != CM_OK) {
            fprintf(stderr, "error: stage %u's state after step %lld from %s: %s%s%s\n", s->stage,
                    (long long)step, addr, cm_strerror(rc), err[0] ? ": " : "", err);
            free(r);
            return rc;
        }
        if (memcmp(r[h].pub, s->rt.key.pub, CM_ED25519_PUB_LEN))
            printf("loaded stage %u's state after step %lld from %s\n", s->stage, (long long)step, addr);
    }
    free(r);
    s->state_version = s->version;
    s->had_stage = s->stage;
    /* 5: the data the single process reads next */
    if (s->stage == 0 && step > 0) {
        char err[512];
        uint64_t skip = (uint64_t)step * (uint64_t)(s->tc.batch_size / s->tc.micro_batch);
        if ((rc = agent_trainer_seek_micro(&s->tr, skip, err, sizeof err)) != CM_OK) {
            fprintf(stderr, "error: %s\n", err);
            return rc;
        }
    }
    pipe_inbox_set_peers(s->inbox, (const uint8_t(*)[CM_ED25519_PUB_LEN])s->keys, s->S, s->replica, s->stage);
    pipe_inbox_set_step(s->inbox, step);
    *from_step = step;
    return CM_OK;
}
