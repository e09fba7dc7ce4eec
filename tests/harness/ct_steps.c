#include "ct_steps.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long ct_steps_fold(const char *path, struct ct_steps *st, const char *who)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    long first = -1;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j)
            continue;
        long step = (long)json_integer_value(json_object_get(j, "step"));
        int64_t t = (int64_t)json_integer_value(json_object_get(j, "t_ms"));
        if (t > 0) {
            if (!st->t_first || t < st->t_first)
                st->t_first = t;
            if (t > st->t_last)
                st->t_last = t;
            st->span_s = (double)(st->t_last - st->t_first) / 1000;
        }
        const char *h = json_string_value(json_object_get(j, "hash"));
        if (step >= 0 && step <= CT_STEPS_MAX && h && strlen(h) == 64) {
            st->lines++;
            if (!st->hash[step][0]) {
                snprintf(st->hash[step], sizeof st->hash[step], "%s", h);
            } else if (strcmp(st->hash[step], h) != 0) {
                st->mismatches++;
                fprintf(stderr, "%s: step %ld hash %.16s differs from %.16s\n", who, step, h, st->hash[step]);
            }
            if (!json_is_true(json_object_get(j, "synced"))) {
                json_t *l = json_object_get(j, "loss");
                double w = json_number_value(json_object_get(j, "samples"));
                if (!json_is_number(l) || !isfinite(json_number_value(l))) {
                    st->nan_losses++;
                } else {
                    st->loss_sum[step] += json_number_value(l) * w;
                    st->samples[step] += w;
                }
                int mem = (int)json_integer_value(json_object_get(j, "members"));
                if (mem > st->members[step])
                    st->members[step] = mem;
                json_int_t parts = json_integer_value(json_object_get(j, "parts"));
                int agreed = json_integer_value(json_object_get(j, "agreed")) == parts;
                if (agreed && parts > 0)
                    st->full[step]++;
                if (agreed)
                    st->global[step] = json_number_value(json_object_get(j, "global_samples"));
                st->round_ms[step] = json_number_value(json_object_get(j, "round_ms"));
                long m = (long)json_integer_value(json_object_get(j, "margin_ms"));
                if (!st->margin_min || m < st->margin_min)
                    st->margin_min = m;
                if (m > st->margin_max)
                    st->margin_max = m;
                if (first < 0)
                    first = step;
            }
        }
        json_decref(j);
    }
    fclose(f);
    return first;
}

int ct_steps_follow(const struct ct_steps *collab, const struct ct_steps *local, int nlocal, long steps,
                    long window, long warm, double warm_tol)
{
    int bad = 0;
    printf("window  collab  local(min..max)  tolerance\n");
    for (long w = 1; w + window - 1 <= steps && w + window - 1 <= CT_STEPS_MAX; w += window) {
        double cl = 0, cs = 0, lo = INFINITY, hi = -INFINITY;
        for (long k = w; k < w + window; k++) {
            cl += collab->loss_sum[k];
            cs += collab->samples[k];
        }
        if (!(cs > 0))
            return -1;
        double c = cl / cs;
        for (int k = 0; k < nlocal; k++) {
            double l = 0, n = 0;
            for (long t = w; t < w + window; t++) {
                l += local[k].loss_sum[t];
                n += local[k].samples[t];
            }
            if (!(n > 0))
                return -1;
            lo = fmin(lo, l / n);
            hi = fmax(hi, l / n);
        }
        double tol = 2 * (hi - lo) + 0.01;
        if (w + window - 1 <= warm && tol < warm_tol)
            tol = warm_tol;
        int in = c >= lo - tol && c <= hi + tol;
        printf("%4ld-%-4ld %.4f  %.4f..%.4f  %.4f%s\n", w, w + window - 1, c, lo, hi, tol, in ? "" : "  OUT");
        bad += !in;
    }
    return bad;
}

int64_t ct_steps_time(const char *path, long step)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int64_t t = -1;
    while (t < 0 && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (j && json_integer_value(json_object_get(j, "step")) == step && json_object_get(j, "members") &&
            !json_is_false(json_object_get(j, "averaged")))
            t = (int64_t)json_integer_value(json_object_get(j, "t_ms"));
        json_decref(j);
    }
    fclose(f);
    return t;
}

static void note_bad(struct ct_failed *o, int *count, const char *line)
{
    (*count)++;
    if (!o->first_bad[0])
        snprintf(o->first_bad, sizeof o->first_bad, "%.500s", line);
}

int ct_steps_failed(const char *path, struct ct_failed *out)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    char (*rids)[20] = NULL;
    size_t nrid = 0, cap = 0;
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) {
            rc = -1;
            break;
        }
        if (json_is_false(json_object_get(j, "averaged"))) {
            out->lines++;
            const char *why = json_string_value(json_object_get(j, "why"));
            const char *rid = json_string_value(json_object_get(j, "round"));
            if (!why || !rid)
                note_bad(out, &out->no_why, line);
            else if (strstr(why, "did not start the round"))
                note_bad(out, &out->not_run, line);
            else if (strcmp(rid, "0000000000000000") != 0) {
                int seen = 0;
                for (size_t k = 0; k < nrid && !seen; k++)
                    seen = !strcmp(rids[k], rid);
                if (seen)
                    note_bad(out, &out->repeated, line);
                else {
                    if (nrid == cap) {
                        size_t nc = cap ? 2 * cap : 64;
                        char (*g)[20] = realloc(rids, nc * sizeof *rids);
                        if (!g) {
                            rc = -1;
                            json_decref(j);
                            break;
                        }
                        rids = g;
                        cap = nc;
                    }
                    snprintf(rids[nrid++], sizeof rids[0], "%s", rid);
                }
            }
        } else if (!json_is_true(json_object_get(j, "synced"))) {
            out->stepped++;
            if (json_integer_value(json_object_get(j, "members")) != 1 ||
                json_integer_value(json_object_get(j, "agreed")) != json_integer_value(json_object_get(j, "parts")))
                note_bad(out, &out->crowded, line);
        }
        json_decref(j);
    }
    free(rids);
    fclose(f);
    return rc;
}
