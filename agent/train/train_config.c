/* Strict parsing of the training config (see train_config.h). Every object
 * lists the keys it accepts; numbers are range-checked before any model is
 * built, so an impossible config fails here with the field's name. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/train/train_config.h"
#include "agent/train/async.h"
#include "cm_err.h"

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

struct ctx {
    char *err;
    size_t errlen;
};

#define FAIL(c, ...) fail((c)->err, (c)->errlen, CM_EINVAL, __VA_ARGS__)

static int check_keys(struct ctx *c, json_t *o, const char *where, const char *const *keys)
{
    if (!json_is_object(o))
        return FAIL(c, "%s: must be an object", where);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        int ok = 0;
        for (const char *const *p = keys; *p; p++)
            if (!strcmp(*p, k))
                ok = 1;
        if (!ok)
            return FAIL(c, "%s.%.64s: unknown field", where, k);
    }
    return CM_OK;
}

/* Integer field in [lo, hi]; absent -> def, or an error when required. */
static int get_long(struct ctx *c, json_t *o, const char *where, const char *key, int required,
                    long lo, long hi, long def, long *out)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (required)
            return FAIL(c, "%s.%s: missing", where, key);
        *out = def;
        return CM_OK;
    }
    if (!json_is_integer(v))
        return FAIL(c, "%s.%s: must be an integer", where, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return FAIL(c, "%s.%s: %lld is out of range [%ld, %ld]", where, key, (long long)x, lo, hi);
    *out = (long)x;
    return CM_OK;
}

static int get_int(struct ctx *c, json_t *o, const char *where, const char *key, int required,
                   long lo, long hi, long def, int *out)
{
    long x;
    int rc = get_long(c, o, where, key, required, lo, hi, def, &x);
    if (!rc)
        *out = (int)x;
    return rc;
}

static int get_float(struct ctx *c, json_t *o, const char *where, const char *key, double lo,
                     double hi, double def, float *out)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        *out = (float)def;
        return CM_OK;
    }
    if (!json_is_number(v))
        return FAIL(c, "%s.%s: must be a number", where, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi)
        return FAIL(c, "%s.%s: %g is out of range [%g, %g]", where, key, x, lo, hi);
    *out = (float)x;
    return CM_OK;
}

static int get_bool(struct ctx *c, json_t *o, const char *where, const char *key, int def,
                    int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        *out = def;
        return CM_OK;
    }
    if (!json_is_boolean(v))
        return FAIL(c, "%s.%s: must be true or false", where, key);
    *out = json_is_true(v);
    return CM_OK;
}

/* String field; absent -> def (may be NULL = required). */
static int get_str(struct ctx *c, json_t *o, const char *where, const char *key, const char *def,
                   const char **out)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (!def)
            return FAIL(c, "%s.%s: missing", where, key);
        *out = def;
        return CM_OK;
    }
    if (!json_is_string(v))
        return FAIL(c, "%s.%s: must be a string", where, key);
    *out = json_string_value(v);
    return CM_OK;
}

static int pick(struct ctx *c, const char *where, const char *s, const char *const *names,
                int *out)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return CM_OK;
        }
    return FAIL(c, "%s: \"%.32s\" is not a known value", where, s);
}

static int set_path(struct ctx *c, const char *where, const char *base, const char *p,
                    char out[AGENT_TRAIN_PATH_MAX])
{
    int n;
    if (!*p)
        return FAIL(c, "%s: empty path", where);
    if (p[0] == '/' || !base || !*base)
        n = snprintf(out, AGENT_TRAIN_PATH_MAX, "%s", p);
    else
        n = snprintf(out, AGENT_TRAIN_PATH_MAX, "%s/%s", base, p);
    if (n < 0 || n >= AGENT_TRAIN_PATH_MAX)
        return FAIL(c, "%s: path too long", where);
    return CM_OK;
}

static int parse_dmoe(struct ctx *c, json_t *m, struct agent_train_config *o);

static int parse_model(struct ctx *c, json_t *m, struct agent_train_config *o)
{
    const char *type = "";
    int rc;
    if (!json_is_object(m))
        return FAIL(c, "model: must be an object");
    if ((rc = get_str(c, m, "model", "type", NULL, &type)))
        return rc;
    if (!strcmp(type, "mlp")) {
        static const char *const keys[] = {"type", "inputs", "hidden", "classes", NULL};
        if ((rc = check_keys(c, m, "model", keys)))
            return rc;
        o->kind = KERN_MODEL_MLP;
        struct kern_mlp_config *mc = &o->mlp;
        if ((rc = get_int(c, m, "model", "inputs", 1, 1, KERN_MAX_DIM, 0, &mc->in_dim)) ||
            (rc = get_int(c, m, "model", "classes", 1, 2, KERN_MAX_DIM, 0, &mc->nclass)))
            return rc;
        json_t *h = json_object_get(m, "hidden");
        if (!h || !json_is_array(h))
            return FAIL(c, "model.hidden: must be an array of layer widths");
        if (json_array_size(h) > KERN_MLP_MAX_HIDDEN)
            return FAIL(c, "model.hidden: at most %d hidden layers", KERN_MLP_MAX_HIDDEN);
        mc->nhidden = (int)json_array_size(h);
        for (int i = 0; i < mc->nhidden; i++) {
            json_t *w = json_array_get(h, i);
            if (!json_is_integer(w) || json_integer_value(w) < 1 ||
                json_integer_value(w) > KERN_MAX_DIM)
                return FAIL(c, "model.hidden[%d]: must be an integer in [1, %d]", i, KERN_MAX_DIM);
            mc->hidden[i] = (int)json_integer_value(w);
        }
        const char *why;
        if (kern_mlp_config_check(mc, &why))
            return FAIL(c, "model: %s", why);
        return CM_OK;
    }
    if (!strcmp(type, "gpt") || !strcmp(type, "albert")) {
        static const char *const keys[] = {"type",    "vocab", "context",     "layers",
                                           "heads",   "d_model", "d_embed",   "d_ff",
                                           "share_layers", "mask_prob", "post_ln", "sentence_order",
                                           NULL};
        if ((rc = check_keys(c, m, "model", keys)))
            return rc;
        int alb = !strcmp(type, "albert");
        struct kern_tfm_config *t = &o->tfm;
        o->kind = t->kind = alb ? KERN_MODEL_ALBERT : KERN_MODEL_GPT;
        if ((rc = get_int(c, m, "model", "vocab", 1, 2, KERN_MAX_VOCAB, 0, &t->vocab)) ||
            (rc = get_int(c, m, "model", "context", 1, 1, KERN_MAX_DIM, 0, &t->max_T)) ||
            (rc = get_int(c, m, "model", "layers", 1, 1, KERN_MAX_LAYERS, 0, &t->n_layer)) ||
            (rc = get_int(c, m, "model", "heads", 1, 1, KERN_MAX_DIM, 0, &t->n_head)) ||
            (rc = get_int(c, m, "model", "d_model", 1, 1, KERN_MAX_DIM, 0, &t->d_model)) ||
            (rc = get_int(c, m, "model", "d_embed", 0, 1, KERN_MAX_DIM, t->d_model,
                          &t->d_embed)) ||
            (rc = get_int(c, m, "model", "d_ff", 0, 1, KERN_MAX_DIM, 4L * t->d_model,
                          &t->d_ff)) ||
            (rc = get_bool(c, m, "model", "share_layers", alb, &t->share_layers)) ||
            (rc = get_bool(c, m, "model", "post_ln", 0, &t->post_ln)) ||
            (rc = get_bool(c, m, "model", "sentence_order", 0, &t->sop)) ||
            (rc = get_float(c, m, "model", "mask_prob", 0.01, 0.9, 0.15, &o->mask_prob)))
            return rc;
        if (!alb && json_object_get(m, "mask_prob"))
            return FAIL(c, "model.mask_prob: only for albert");
        if (!alb && (t->post_ln || t->sop))
            return FAIL(c, "model.%s: only for albert", t->post_ln ? "post_ln" : "sentence_order");
        const char *why;
        if (kern_tfm_config_check(t, &why))
            return FAIL(c, "model: %s", why);
        return CM_OK;
    }
    if (!strcmp(type, "dmoe"))
        return parse_dmoe(c, m, o);
    return FAIL(c, "model.type: \"%.32s\" is not mlp, gpt, albert or dmoe", type);
}

/* "optimizer" and "schedule" objects of root (the config, or a DMoE
 * model's "experts"); pre is "" or "model.experts." for the messages. */
static int parse_optim_in(struct ctx *c, json_t *root, const char *pre, long total,
                          struct kern_optim_config *oc)
{
    kern_optim_config_default(oc);
    char wo[64], ws[64], wt[80];
    snprintf(wo, sizeof wo, "%soptimizer", pre);
    snprintf(ws, sizeof ws, "%sschedule", pre);
    int rc;
    json_t *op = json_object_get(root, "optimizer");
    if (op) {
        static const char *const keys[] = {"type", "lr", "beta1", "beta2", "eps",
                                           "weight_decay", "clip_norm", NULL};
        static const char *const kinds[] = {"adamw", "lamb", NULL};
        const char *type = "";
        int k;
        snprintf(wt, sizeof wt, "%s.type", wo);
        if ((rc = check_keys(c, op, wo, keys)) ||
            (rc = get_str(c, op, wo, "type", "adamw", &type)) ||
            (rc = pick(c, wt, type, kinds, &k)) ||
            (rc = get_float(c, op, wo, "lr", 1e-9, 10, 1e-3, &oc->lr)) ||
            (rc = get_float(c, op, wo, "beta1", 0, 0.999999, 0.9, &oc->beta1)) ||
            (rc = get_float(c, op, wo, "beta2", 0, 0.999999, 0.999, &oc->beta2)) ||
            (rc = get_float(c, op, wo, "eps", 1e-12, 0.1, 1e-8, &oc->eps)) ||
            (rc = get_float(c, op, wo, "weight_decay", 0, 0.5, 0, &oc->weight_decay)) ||
            (rc = get_float(c, op, wo, "clip_norm", 0, 1e6, 0, &oc->clip_norm)))
            return rc;
        oc->kind = k == 0 ? KERN_OPT_ADAMW : KERN_OPT_LAMB;
    }
    json_t *s = json_object_get(root, "schedule");
    oc->total_steps = total;
    if (s) {
        static const char *const keys[] = {"type", "warmup_steps", "min_lr_ratio", NULL};
        static const char *const kinds[] = {"constant", "linear", "cosine", NULL};
        const char *type = "";
        int k;
        snprintf(wt, sizeof wt, "%s.type", ws);
        if ((rc = check_keys(c, s, ws, keys)) ||
            (rc = get_str(c, s, ws, "type", "constant", &type)) ||
            (rc = pick(c, wt, type, kinds, &k)) ||
            (rc = get_long(c, s, ws, "warmup_steps", 0, 0, total, 0, &oc->warmup_steps)) ||
            (rc = get_float(c, s, ws, "min_lr_ratio", 0, 1, 0, &oc->min_lr_ratio)))
            return rc;
        oc->sched = k;
    }
    const char *why;
    if (kern_optim_config_check(oc, &why))
        return FAIL(c, "%s%s", pre, why);
    return CM_OK;
}

static int parse_optim(struct ctx *c, json_t *root, struct agent_train_config *o)
{
    return parse_optim_in(c, root, "", o->steps, &o->opt);
}

/* "model.experts.serve" (optional): the expert servers' settings. */
static int parse_serve(struct ctx *c, json_t *e, struct agent_moe_serve_config *sc)
{
    static const char *const keys[] = {"prefix", "max_batch", "max_wait_ms", "declare_ttl_s",
                                       "replicas", "checkpoint_every_s", NULL};
    static const char *const w = "model.experts.serve";
    json_t *v = json_object_get(e, "serve");
    const char *prefix = "ffn";
    int rc;
    if (v && (rc = check_keys(c, v, w, keys)))
        return rc;
    if ((rc = get_str(c, v, w, "prefix", "ffn", &prefix)) ||
        (rc = get_int(c, v, w, "max_batch", 0, 1, 65536, 256, &sc->max_batch)) ||
        (rc = get_int(c, v, w, "max_wait_ms", 0, 1, 10000, 5, &sc->max_wait_ms)) ||
        (rc = get_int(c, v, w, "declare_ttl_s", 0, 3, 86400, 30, &sc->declare_ttl_s)) ||
        (rc = get_int(c, v, w, "replicas", 0, 1, 64, 1, &sc->replicas)) ||
        (rc = get_int(c, v, w, "checkpoint_every_s", 0, 1, 86400, 60, &sc->checkpoint_every_s)))
        return rc;
    size_t n = strlen(prefix);
    int ok = n >= 1 && n < sizeof sc->prefix;
    for (size_t i = 0; ok && i < n; i++)
        ok = (prefix[i] >= 'a' && prefix[i] <= 'z') || (prefix[i] >= '0' && prefix[i] <= '9') ||
             prefix[i] == '_';
    if (!ok)
        return FAIL(c, "%s.prefix: must be 1 to 32 of [a-z0-9_]", w);
    memcpy(sc->prefix, prefix, n + 1);
    return CM_OK;
}

/* The experts of a DMoE model in train --local: each steps once per
 * micro-batch it is called in, so its schedule spans steps * micro-batches. */
static int parse_experts(struct ctx *c, json_t *m, struct agent_train_config *o)
{
    json_t *e = json_object_get(m, "experts");
    static const char *const keys[] = {"hidden", "optimizer", "schedule", "fail_prob",
                                       "seed", "serve", "max_inflight_batches", NULL};
    struct kern_dmoe_local_config *lc = &o->experts;
    int rc;
    long seed;
    if (!e)
        return FAIL(c, "model.experts: missing");
    if ((rc = check_keys(c, e, "model.experts", keys)) ||
        (rc = get_int(c, e, "model.experts", "hidden", 1, 1, KERN_MAX_DIM, 0, &lc->F)) ||
        (rc = get_float(c, e, "model.experts", "fail_prob", 0, 0.99, 0, &lc->fail_prob)) ||
        (rc = get_int(c, e, "model.experts", "max_inflight_batches", 0, 1, AGENT_ASYNC_MAX, 4,
                      &o->max_inflight)) ||
        (rc = get_long(c, e, "model.experts", "seed", 0, 0, 0x7fffffffffffffffL,
                       (long)(o->seed + 1), &seed)) ||
        (rc = parse_optim_in(c, e, "model.experts.",
                             o->steps * (o->batch_size / o->micro_batch), &lc->opt)) ||
        (rc = parse_serve(c, e, &o->serve)))
        return rc;
    lc->seed = (uint64_t)seed;
    lc->d = o->dmoe.grid_d;
    lc->M = o->dmoe.grid_m;
    lc->C = o->dmoe.trunk[o->dmoe.ntrunk - 1];
    lc->max_rows = o->micro_batch;
    const char *why;
    if (kern_dmoe_local_config_check(lc, &why))
        return FAIL(c, "model.experts: %s", why);
    return CM_OK;
}

static int parse_dmoe(struct ctx *c, json_t *m, struct agent_train_config *o)
{
    static const char *const keys[] = {"type", "inputs", "hidden", "classes", "grid_dims",
                                       "grid_size", "k", "experts", NULL};
    int rc;
    if ((rc = check_keys(c, m, "model", keys)))
        return rc;
    o->kind = KERN_MODEL_DMOE;
    struct kern_dmoe_config *dc = &o->dmoe;
    if ((rc = get_int(c, m, "model", "inputs", 1, 1, KERN_MAX_DIM, 0, &dc->in_dim)) ||
        (rc = get_int(c, m, "model", "classes", 1, 2, KERN_MAX_DIM, 0, &dc->nclass)) ||
        (rc = get_int(c, m, "model", "grid_dims", 1, 1, KERN_DMOE_MAX_D, 0, &dc->grid_d)) ||
        (rc = get_int(c, m, "model", "grid_size", 1, 2, 65536, 0, &dc->grid_m)) ||
        (rc = get_int(c, m, "model", "k", 1, 1, KERN_DMOE_MAX_K, 0, &dc->k)))
        return rc;
    json_t *h = json_object_get(m, "hidden");
    if (!h || !json_is_array(h) || json_array_size(h) < 1 ||
        json_array_size(h) > KERN_DMOE_MAX_TRUNK)
        return FAIL(c, "model.hidden: must be an array of 1 to %d trunk widths (the last is "
                       "the experts' width)", KERN_DMOE_MAX_TRUNK);
    dc->ntrunk = (int)json_array_size(h);
    for (int i = 0; i < dc->ntrunk; i++) {
        json_t *w = json_array_get(h, i);
        if (!json_is_integer(w) || json_integer_value(w) < 1 ||
            json_integer_value(w) > KERN_MAX_DIM)
            return FAIL(c, "model.hidden[%d]: must be an integer in [1, %d]", i, KERN_MAX_DIM);
        dc->trunk[i] = (int)json_integer_value(w);
    }
    const char *why;
    if (kern_dmoe_config_check(dc, &why))
        return FAIL(c, "model: %s", why);
    if (o->micro_batch > (1 << 16))
        return FAIL(c, "micro_batch: at most 65536 for a dmoe model");
    return parse_experts(c, m, o);
}

int agent_train_config_parse(const char *json, size_t len, const char *base,
                             struct agent_train_config *out, char *err, size_t errlen)
{
    struct ctx cx = {err, errlen}, *c = &cx;
    struct agent_train_config o;
    memset(&o, 0, sizeof o);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return fail(err, errlen, CM_EPARSE, "line %d: %s", je.line, je.text);
    int rc;
    static const char *const keys[] = {"model", "optimizer", "schedule", "batch_size",
                                       "micro_batch", "steps", "seed", "device", "precision",
                                       "threads", "data", "eval", "log_every", "checkpoint",
                                       /* the coordinator's, for schedules (docs/schedules.md) */
                                       "model_parameters", NULL};
    static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
    static const char *const precs[] = {"fp32", "tf32", "bf16", "fp16", NULL};
    const char *dev = "auto", *prec = "bf16";
    long seed;
    int k;
    if ((rc = check_keys(c, root, "config", keys)) ||
        (rc = get_long(c, root, "config", "steps", 1, 1, 100000000L, 0, &o.steps)) ||
        (rc = get_int(c, root, "config", "batch_size", 1, 1, 1 << 20, 0, &o.batch_size)) ||
        (rc = get_int(c, root, "config", "micro_batch", 0, 1, 1 << 20, o.batch_size,
                      &o.micro_batch)) ||
        (rc = get_long(c, root, "config", "seed", 0, 0, 0x7fffffffffffffffL, 1, &seed)) ||
        (rc = get_str(c, root, "config", "device", "auto", &dev)) ||
        (rc = pick(c, "device", dev, devices, &k)) ||
        (rc = get_str(c, root, "config", "precision", "bf16", &prec)) ||
        (rc = pick(c, "precision", prec, precs, &k)) ||
        (rc = get_int(c, root, "config", "threads", 0, 0, 1024, 0, &o.threads)) ||
        (rc = get_long(c, root, "config", "log_every", 0, 1, 100000000L, 100, &o.log_every)))
        goto done;
    o.seed = (uint64_t)seed;
    snprintf(o.device, sizeof o.device, "%s", dev);
    snprintf(o.precision, sizeof o.precision, "%s", prec);
    if (o.batch_size % o.micro_batch) {
        rc = FAIL(c, "micro_batch: %d does not divide batch_size %d", o.micro_batch,
                  o.batch_size);
        goto done;
    }
    json_t *m = json_object_get(root, "model");
    if (!m) {
        rc = FAIL(c, "model: missing");
        goto done;
    }
    if ((rc = parse_model(c, m, &o)) || (rc = parse_optim(c, root, &o)))
        goto done;
    if (o.kind != KERN_MODEL_MLP && o.kind != KERN_MODEL_DMOE && o.micro_batch > (1 << 14)) {
        rc = FAIL(c, "micro_batch: too large for a transformer");
        goto done;
    }
    /* data */
    json_t *d = json_object_get(root, "data");
    static const char *const dkeys[] = {"train", "eval", "shuffle_buffer", "mix", NULL};
    const char *tr = "", *ev = "";
    if (!d) {
        rc = FAIL(c, "data: missing");
        goto done;
    }
    if ((rc = check_keys(c, d, "data", dkeys)) || (rc = get_str(c, d, "data", "train", NULL, &tr)) ||
        (rc = get_str(c, d, "data", "eval", "", &ev)) ||
        (rc = get_long(c, d, "data", "shuffle_buffer", 0, 1, 10000000L, 10000,
                       &o.shuffle_buffer)) ||
        (rc = set_path(c, "data.train", base, tr, o.train_manifest)) ||
        (*ev && (rc = set_path(c, "data.eval", base, ev, o.eval_manifest))))
        goto done;
    /* data.mix: [{"train": PATH, "weight": W}, ...] */
    json_t *mix = json_object_get(d, "mix");
    o.mix_weight[0] = 1.0;
    if (mix) {
        if (!json_is_array(mix) || json_array_size(mix) < 1 || json_array_size(mix) > AGENT_TRAIN_MIX_MAX - 1) {
            rc = FAIL(c, "data.mix: must be an array of 1 to %d {\"train\", \"weight\"} objects",
                      AGENT_TRAIN_MIX_MAX - 1);
            goto done;
        }
        static const char *const mkeys[] = {"train", "weight", NULL};
        for (size_t mi = 0; mi < json_array_size(mix); mi++) {
            json_t *e = json_array_get(mix, mi);
            char where[32];
            const char *mp = "";
            float w = 0;
            snprintf(where, sizeof where, "data.mix[%zu]", mi);
            if (!json_is_object(e)) {
                rc = FAIL(c, "%s: must be an object", where);
                goto done;
            }
            if ((rc = check_keys(c, e, where, mkeys)) || (rc = get_str(c, e, where, "train", NULL, &mp)) ||
                (rc = get_float(c, e, where, "weight", 1e-6, 1, 0, &w)) ||
                (rc = set_path(c, where, base, mp, o.mix_manifest[mi + 1])))
                goto done;
            o.mix_weight[mi + 1] = w;
            o.mix_weight[0] -= w;
            o.n_mix++;
        }
        if (!(o.mix_weight[0] > 1e-6)) {
            rc = FAIL(c, "data.mix: the weights add up to %.6g; data.train gets 1 minus them, which must be "
                         "above 0", 1.0 - o.mix_weight[0]);
            goto done;
        }
    }
    /* eval */
    json_t *e = json_object_get(root, "eval");
    o.eval_at_start = 0;
    if (e) {
        static const char *const ekeys[] = {"batches", "at_start", "every", NULL};
        if ((rc = check_keys(c, e, "eval", ekeys)) ||
            (rc = get_long(c, e, "eval", "batches", 0, 0, 100000000L, 0, &o.eval_batches)) ||
            (rc = get_bool(c, e, "eval", "at_start", 0, &o.eval_at_start)) ||
            (rc = get_long(c, e, "eval", "every", 0, 0, 100000000L, 0, &o.eval_every)))
            goto done;
        if (!*o.eval_manifest) {
            rc = FAIL(c, "eval: given but data.eval names no eval set");
            goto done;
        }
    }
    /* checkpoint */
    json_t *ck = json_object_get(root, "checkpoint");
    if (ck && o.kind == KERN_MODEL_DMOE) {
        /* a checkpoint holds the trainer's parameters only; the local
         * experts' weights and optimizer state would be lost on resume */
        rc = FAIL(c, "checkpoint: not supported for a dmoe model yet (the experts' state is "
                     "not saved)");
        goto done;
    }
    if (ck) {
        static const char *const ckeys[] = {"dir", "every", "resume", NULL};
        const char *dir = "";
        if ((rc = check_keys(c, ck, "checkpoint", ckeys)) ||
            (rc = get_str(c, ck, "checkpoint", "dir", NULL, &dir)) ||
            (rc = set_path(c, "checkpoint.dir", base, dir, o.ckpt_dir)) ||
            (rc = get_long(c, ck, "checkpoint", "every", 0, 0, 100000000L, 0, &o.ckpt_every)) ||
            (rc = get_bool(c, ck, "checkpoint", "resume", 1, &o.resume)))
            goto done;
    }
    *out = o;
    rc = CM_OK;
done:
    json_decref(root);
    return rc;
}

int agent_train_config_load(const char *path, struct agent_train_config *out, char *err,
                            size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, CM_EIO, "%s", strerror(errno));
    size_t cap = 1 << 20;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return CM_ENOMEM;
    }
    size_t n = fread(buf, 1, cap + 1, f);
    int rderr = ferror(f);
    fclose(f);
    if (rderr) {
        free(buf);
        return fail(err, errlen, CM_EIO, "read error");
    }
    if (n > cap) {
        free(buf);
        return fail(err, errlen, CM_ETOOBIG, "larger than 1 MiB");
    }
    char base[AGENT_TRAIN_PATH_MAX];
    snprintf(base, sizeof base, "%s", path);
    char *slash = strrchr(base, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(base, sizeof base, ".");
    int rc = agent_train_config_parse(buf, n, base, out, err, errlen);
    free(buf);
    return rc;
}
