/* crowdtrain-agent finetune: the downstream evaluation of a pretrained
 * encoder (seed 000 H.6; seed 001 fine-tunes sahajBERT on NER and news
 * category classification). The ALBERT of a run's config gets a classifier
 * of the task's labels on its pooled [CLS] position (the sentence-order
 * head's pooler, then a fresh classifier.*: kern_tfm.c, seq_classes), its
 * encoder loaded from --model (safetensors, `train --local --export` or
 * `join --export`) or, without --model, left at the config's random
 * initialization: the from-scratch baseline the pretrained encoder is
 * compared with. The task is two TSV files of `label<TAB>text` lines (one
 * example each; scripts/make-brown-genre.sh makes the Brown corpus's genre
 * task), tokenized with the run's SentencePiece model into [CLS] text [SEP]
 * (cut to the context). AdamW with linear warm-up and decay; the held-out
 * accuracy is printed beside the majority-label baseline. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/commands.h"
#include "agent/train/train_config.h"
#include "agent/train/trainer.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "data/data.h"
#include "data/spm.h"
#include "kern_backend.h"
#include "kern_model.h"
#include "kern_optim.h"

#define FT_MAX_LABELS 1024
#define FT_MAX_LINE (1 << 20)
#define FT_MAX_EXAMPLES 2000000

struct ft_opts {
    const char *config, *train, *eval, *model, *tokenizer, *step_log;
    long steps, batch, seed, eval_every, threads, context;
    double lr, weight_decay;
};

struct ft_set {
    size_t n;
    int *label;        /* (n) */
    int *tok;          /* (n, T): [CLS] text [SEP] <pad>... */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: crowdtrain-agent finetune --config RUN.json --train TASK.tsv --eval TASK.tsv\n"
            "                                 [--model FILE.safetensors] [--tokenizer FILE.model]\n"
            "                                 [--steps N] [--batch N] [--lr X] [--seed N]\n"
            "                                 [--context N] [--eval-every N] [--threads N]\n"
            "                                 [--step-log FILE]\n\n"
            "Fine-tunes the ALBERT of RUN.json on a sequence-classification task and prints\n"
            "its accuracy on the held-out examples (docs/training.md, \"Downstream evaluation\").\n"
            "  --train, --eval  lines `label<TAB>text`, one example each (UTF-8); the labels are\n"
            "             the training file's (an eval label it lacks is an error)\n"
            "  --model    the pretrained encoder (safetensors of this config's model: every\n"
            "             tensor but the task's classifier.* is loaded); without it the encoder\n"
            "             starts from the config's random initialization (the baseline)\n"
            "  --tokenizer  the SentencePiece model (default: the tokenizer of the config's\n"
            "             training data, a text-docs manifest on this machine; checked by hash)\n"
            "  --steps    optimizer steps (default 300)      --batch  examples per step (32)\n"
            "  --context N  tokens per example, [CLS] and [SEP] included (default and at most:\n"
            "             the config's context); longer text keeps its first N - 2 tokens\n"
            "  --lr       AdamW peak learning rate (1e-3), 10%% warm-up, linear decay to 0\n"
            "  --seed     initialization of the classifier (and the encoder without --model)\n"
            "             and the example order (default 1)\n"
            "  --eval-every N  held-out accuracy every N steps too (default: at the end)\n"
            "  --step-log FILE  one JSON line per step: step, loss, accuracy of the batch\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || !*s || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* 0 to go on; otherwise the exit status (--help: -1). */
static int parse_opts(int argc, char **argv, struct ft_opts *o)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"train", required_argument, NULL, 't'},
        {"eval", required_argument, NULL, 'e'},   {"model", required_argument, NULL, 'm'},
        {"tokenizer", required_argument, NULL, 'k'}, {"steps", required_argument, NULL, 's'},
        {"batch", required_argument, NULL, 'b'},  {"lr", required_argument, NULL, 'l'},
        {"seed", required_argument, NULL, 'r'},   {"eval-every", required_argument, NULL, 'v'},
        {"threads", required_argument, NULL, 'j'}, {"step-log", required_argument, NULL, 'g'},
        {"context", required_argument, NULL, 'x'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof *o);
    o->steps = 300;
    o->batch = 32;
    o->seed = 1;
    o->lr = 1e-3;
    o->weight_decay = 0.01;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c': o->config = optarg; break;
        case 't': o->train = optarg; break;
        case 'e': o->eval = optarg; break;
        case 'm': o->model = optarg; break;
        case 'k': o->tokenizer = optarg; break;
        case 'g': o->step_log = optarg; break;
        case 's':
            if (parse_long(optarg, 1, 10000000, &o->steps)) {
                fprintf(stderr, "finetune: --steps must be an integer in [1, 10000000]\n");
                return 2;
            }
            break;
        case 'b':
            if (parse_long(optarg, 1, 65536, &o->batch)) {
                fprintf(stderr, "finetune: --batch must be an integer in [1, 65536]\n");
                return 2;
            }
            break;
        case 'r':
            if (parse_long(optarg, 1, 1L << 40, &o->seed)) {
                fprintf(stderr, "finetune: --seed must be a positive integer\n");
                return 2;
            }
            break;
        case 'v':
            if (parse_long(optarg, 0, 10000000, &o->eval_every)) {
                fprintf(stderr, "finetune: --eval-every must be a non-negative integer\n");
                return 2;
            }
            break;
        case 'x':
            if (parse_long(optarg, 3, 65536, &o->context)) {
                fprintf(stderr, "finetune: --context must be an integer of at least 3\n");
                return 2;
            }
            break;
        case 'j':
            if (parse_long(optarg, 0, 1024, &o->threads)) {
                fprintf(stderr, "finetune: --threads must be an integer in [0, 1024]\n");
                return 2;
            }
            break;
        case 'l':
            o->lr = strtod(optarg, &end);
            if (*end || !*optarg || !(o->lr > 0 && o->lr <= 1)) {
                fprintf(stderr, "finetune: --lr must be a number in (0, 1]\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return -1;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "finetune: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o->config || !o->train || !o->eval) {
        fprintf(stderr, "finetune: --config, --train and --eval are required (see --help)\n");
        return 2;
    }
    return 0;
}

static char *read_file(const char *path, size_t max, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, f);
        n += r;
        if (n < cap)
            break;
        if (cap >= max) {
            snprintf(err, errlen, "%s: larger than %zu bytes", path, max);
            free(b);
            b = NULL;
            break;
        }
        char *g = realloc(b, cap * 2 + 1);
        if (!g) {
            free(b);
            b = NULL;
            break;
        }
        b = g;
        cap *= 2;
    }
    if (b && ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        free(b);
        b = NULL;
    } else if (!b && !*err) {
        snprintf(err, errlen, "%s: out of memory", path);
    }
    fclose(f);
    if (b) {
        b[n] = '\0';
        *len = n;
    }
    return b;
}

/* The tokenizer: --tokenizer, or the config's training manifest's (a file://
 * URL on this machine), its hash checked against that manifest's. */
static int load_tokenizer(const struct ft_opts *o, const struct agent_train_config *cfg, struct cm_spm **spm,
                          char *err, size_t errlen)
{
    struct cm_data_manifest *m = NULL;
    char merr[256] = "";
    int rc = cm_data_manifest_load(cfg->train_manifest, &m, merr, sizeof merr);
    if (rc) {
        snprintf(err, errlen, "%.700s: %.250s", cfg->train_manifest, merr);
        return rc;
    }
    if (m->format != CM_DATA_TEXT_DOCS || !m->tokenizer.url) {
        snprintf(err, errlen, "%.900s: not text-docs data with a tokenizer", cfg->train_manifest);
        cm_data_manifest_free(m);
        return CM_EINVAL;
    }
    char path[4096];
    if (o->tokenizer) {
        snprintf(path, sizeof path, "%s", o->tokenizer);
    } else if (!strncmp(m->tokenizer.url, "file://", 7)) {
        /* percent-decoded */
        const char *u = m->tokenizer.url + 7;
        size_t k = 0;
        for (; *u && k + 1 < sizeof path; u++) {
            unsigned v;
            if (u[0] == '%' && sscanf(u + 1, "%2x", &v) == 1) {
                path[k++] = (char)v;
                u += 2;
            } else {
                path[k++] = *u;
            }
        }
        path[k] = '\0';
    } else {
        snprintf(err, errlen, "the tokenizer is at %s: download it and pass --tokenizer FILE", m->tokenizer.url);
        cm_data_manifest_free(m);
        return CM_EINVAL;
    }
    size_t len = 0;
    char *bytes = read_file(path, (size_t)64 << 20, &len, err, errlen);
    if (!bytes) {
        cm_data_manifest_free(m);
        return CM_EIO;
    }
    uint8_t h[CM_SHA256_LEN];
    cm_sha256(bytes, len, h);
    if (memcmp(h, m->tokenizer.sha256, sizeof h) != 0) {
        snprintf(err, errlen, "%.400s is not the tokenizer of %.400s (its SHA-256 differs): the ids would mean "
                 "other pieces", path, cfg->train_manifest);
        rc = CM_EINVAL;
    } else if ((rc = cm_spm_load_mem(bytes, len, spm, merr, sizeof merr)) != CM_OK) {
        snprintf(err, errlen, "%.700s: %.250s", path, merr);
    }
    free(bytes);
    cm_data_manifest_free(m);
    return rc;
}

static int label_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Reads a TSV task file into set. With *nlabels == 0 (the training file) the
 * labels are collected (sorted by name); otherwise each must be one of them. */
static int read_task(const char *path, const struct cm_spm *spm, int T, const int sp[3], char **labels,
                     int *nlabels, struct ft_set *set, char *err, size_t errlen)
{
    size_t len = 0;
    char *text = read_file(path, (size_t)1 << 30, &len, err, errlen);
    if (!text)
        return CM_EIO;
    int collect = *nlabels == 0, rc = CM_OK;
    memset(set, 0, sizeof *set);
    /* pass 0: count lines and (training file) collect labels; pass 1: tokenize */
    size_t lines = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        if (ll > 0)
            lines++;
        p += ll + (nl != NULL);
    }
    if (lines == 0 || lines > FT_MAX_EXAMPLES) {
        snprintf(err, errlen, "%s: %zu examples (1 to %d expected)", path, lines, FT_MAX_EXAMPLES);
        free(text);
        return CM_EINVAL;
    }
    set->label = malloc(lines * sizeof *set->label);
    set->tok = malloc(lines * (size_t)T * sizeof *set->tok);
    int32_t *ids = malloc(FT_MAX_LINE * sizeof *ids);
    if (!set->label || !set->tok || !ids) {
        snprintf(err, errlen, "out of memory");
        rc = CM_ENOMEM;
        goto out;
    }
    size_t lineno = 0;
    for (char *p = text; *p && rc == CM_OK;) {
        char *nl = strchr(p, '\n');
        size_t ll = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        char *line = p;
        p += ll + (nl != NULL);
        if (ll == 0)
            continue;
        if (ll > FT_MAX_LINE) {
            snprintf(err, errlen, "%s:%zu: a line longer than %d bytes", path, lineno, FT_MAX_LINE);
            rc = CM_EINVAL;
            break;
        }
        char *tab = memchr(line, '\t', ll);
        if (!tab || tab == line || tab == line + ll - 1) {
            snprintf(err, errlen, "%s:%zu: not `label<TAB>text`", path, lineno);
            rc = CM_EINVAL;
            break;
        }
        *tab = '\0';
        int id = -1;
        for (int k = 0; k < *nlabels && id < 0; k++)
            if (!strcmp(labels[k], line))
                id = k;
        if (id < 0 && collect) {
            if (*nlabels >= FT_MAX_LABELS) {
                snprintf(err, errlen, "%s:%zu: more than %d labels", path, lineno, FT_MAX_LABELS);
                rc = CM_EINVAL;
                break;
            }
            labels[*nlabels] = strdup(line);
            id = (*nlabels)++;
        } else if (id < 0) {
            snprintf(err, errlen, "%s:%zu: label \"%.64s\" is not one of the training file's", path, lineno, line);
            rc = CM_EINVAL;
            break;
        }
        size_t n = 0;
        char serr[160] = "";
        const char *body = tab + 1;
        size_t blen = ll - (size_t)(body - line);
        if ((rc = cm_spm_encode(spm, body, blen, ids, FT_MAX_LINE, &n, serr, sizeof serr)) != CM_OK) {
            snprintf(err, errlen, "%s:%zu: %s", path, lineno, serr[0] ? serr : cm_strerror(rc));
            break;
        }
        int *row = set->tok + set->n * (size_t)T;
        size_t keep = n < (size_t)T - 2 ? n : (size_t)T - 2; /* longer text: its first T - 2 tokens */
        row[0] = sp[0];
        for (size_t i = 0; i < keep; i++)
            row[1 + i] = ids[i];
        row[1 + keep] = sp[1];
        for (size_t i = keep + 2; i < (size_t)T; i++)
            row[i] = sp[2];
        set->label[set->n++] = id;
    }
    if (rc == CM_OK && collect) {
        /* label ids by name, so the same files give the same ids */
        char *old[FT_MAX_LABELS];
        memcpy(old, labels, (size_t)*nlabels * sizeof *old);
        qsort(labels, (size_t)*nlabels, sizeof *labels, label_cmp);
        int map[FT_MAX_LABELS];
        for (int a = 0; a < *nlabels; a++)
            for (int b = 0; b < *nlabels; b++)
                if (old[a] == labels[b])
                    map[a] = b;
        for (size_t i = 0; i < set->n; i++)
            set->label[i] = map[set->label[i]];
    }
out:
    free(ids);
    free(text);
    return rc;
}

static void set_free(struct ft_set *s)
{
    free(s->label);
    free(s->tok);
    memset(s, 0, sizeof *s);
}

/* Accuracy over the whole set, in batches of mb. */
static int evaluate(struct kern_model *m, const struct ft_set *s, int mb, int T, const int *seg0, struct kern_eval *ev)
{
    memset(ev, 0, sizeof *ev);
    int *tgt = malloc((size_t)mb * T * sizeof *tgt);
    if (!tgt)
        return CM_ENOMEM;
    for (size_t i = 0; i < (size_t)mb * T; i++)
        tgt[i] = -1;
    int rc = CM_OK;
    for (size_t at = 0; at < s->n && rc == CM_OK; at += (size_t)mb) {
        int B = (int)(s->n - at < (size_t)mb ? s->n - at : (size_t)mb);
        struct kern_batch b = {.B = B, .T = T, .tokens = s->tok + at * T, .targets = tgt, .segments = seg0,
                               .sop = s->label + at};
        rc = kern_model_eval(m, &b, ev);
    }
    free(tgt);
    return rc;
}

static void print_eval(const char *when, const struct kern_eval *ev, double majority)
{
    printf("finetune: eval %s: accuracy %.2f%% (%ld/%ld), loss %.4f | majority label %.2f%%\n", when,
           ev->sop_count ? 100.0 * ev->sop_correct / ev->sop_count : 0.0, ev->sop_correct, ev->sop_count,
           ev->sop_count ? ev->sop_loss_sum / ev->sop_count : NAN, 100.0 * majority);
    fflush(stdout);
}

int agent_cmd_finetune(int argc, char **argv)
{
    struct ft_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    struct agent_train_config cfg;
    char err[1024] = "";
    if (agent_train_config_load(o.config, &cfg, err, sizeof err)) {
        fprintf(stderr, "finetune: %s: %s\n", o.config, err);
        return 1;
    }
    if (cfg.kind != KERN_MODEL_ALBERT) {
        fprintf(stderr, "finetune: %s: the model is not an albert (fine-tuning puts a classifier on ALBERT's "
                        "pooled [CLS] position)\n", o.config);
        return 1;
    }
    struct cm_spm *spm = NULL;
    if (load_tokenizer(&o, &cfg, &spm, err, sizeof err)) {
        fprintf(stderr, "finetune: %s\n", err);
        return 1;
    }
    if (o.context > cfg.tfm.max_T) {
        fprintf(stderr, "finetune: --context %ld is longer than the model's context (%d)\n", o.context,
                cfg.tfm.max_T);
        cm_spm_free(spm);
        return 2;
    }
    int T = o.context ? (int)o.context : cfg.tfm.max_T;
    int sp[3] = {cm_spm_piece_id(spm, "[CLS]"), cm_spm_piece_id(spm, "[SEP]"), cm_spm_piece_id(spm, "<pad>")};
    char *labels[FT_MAX_LABELS];
    int nlabels = 0;
    struct ft_set tr = {0}, ev = {0};
    struct kern_model *m = NULL;
    struct kern_optim *opt = NULL;
    int *seg0 = NULL, *tgt = NULL, *btok = NULL, *blab = NULL;
    size_t *order = NULL;
    FILE *slog = NULL;
    rc = 1;
    if (sp[0] < 0 || sp[1] < 0 || sp[2] < 0) {
        fprintf(stderr, "finetune: the tokenizer has no [CLS], [SEP] or <pad> piece\n");
        goto out;
    }
    if (cm_spm_vocab_size(spm) > cfg.tfm.vocab) {
        fprintf(stderr, "finetune: the tokenizer has %d pieces, the model's vocabulary %d\n", cm_spm_vocab_size(spm),
                cfg.tfm.vocab);
        goto out;
    }
    if (read_task(o.train, spm, T, sp, labels, &nlabels, &tr, err, sizeof err) ||
        read_task(o.eval, spm, T, sp, labels, &nlabels, &ev, err, sizeof err)) {
        fprintf(stderr, "finetune: %s\n", err);
        goto out;
    }
    if (nlabels < 2) {
        fprintf(stderr, "finetune: %s has %d label(s); a task needs at least 2\n", o.train, nlabels);
        goto out;
    }
    /* the model: the config's encoder with the pooler and a classifier of the labels */
    struct kern_tfm_config tc = cfg.tfm;
    tc.sop = 1;
    tc.seq_classes = nlabels;
    if (o.threads)
        kern_cpu_set_threads((int)o.threads);
    const struct kern_backend *be = kern_backend_cpu();
    int mb = (int)o.batch;
    if (kern_tfm_new(be, &tc, mb, (uint64_t)o.seed, &m) != CM_OK) {
        fprintf(stderr, "finetune: the model of %s with %d labels could not be made\n", o.config, nlabels);
        goto out;
    }
    if (o.model) {
        int loaded = 0, ignored = 0;
        if (agent_model_import(m, o.model, "classifier.", &loaded, &ignored, err, sizeof err)) {
            fprintf(stderr, "finetune: %s\n", err);
            goto out;
        }
        printf("finetune: encoder from %s (%d tensors; %d of its tensors not in this model: another task's head); "
               "classifier.* fresh\n", o.model, loaded, ignored);
    } else {
        printf("finetune: encoder from scratch (the config's initialization, seed %ld)\n", o.seed);
    }
    long count[FT_MAX_LABELS] = {0}, best = 0;
    for (size_t i = 0; i < ev.n; i++)
        count[ev.label[i]]++;
    for (int k = 0; k < nlabels; k++)
        best = count[k] > best ? count[k] : best;
    double majority = (double)best / (double)ev.n;
    printf("finetune: %d labels, %zu training and %zu held-out examples, T %d, %zu parameters, batch %ld, "
           "%ld steps, lr %g\n", nlabels, tr.n, ev.n, T, m->nparams, o.batch, o.steps, o.lr);
    struct kern_optim_config oc;
    kern_optim_config_default(&oc);
    oc.kind = KERN_OPT_ADAMW;
    oc.lr = (float)o.lr;
    oc.weight_decay = (float)o.weight_decay;
    oc.clip_norm = 1.0f;
    oc.total_steps = o.steps;
    oc.warmup_steps = o.steps / 10;
    oc.sched = KERN_SCHED_LINEAR;
    oc.min_lr_ratio = 0;
    seg0 = calloc((size_t)mb * T, sizeof *seg0);
    tgt = malloc((size_t)mb * T * sizeof *tgt);
    btok = malloc((size_t)mb * T * sizeof *btok);
    blab = malloc((size_t)mb * sizeof *blab);
    order = malloc(tr.n * sizeof *order);
    if (!seg0 || !tgt || !btok || !blab || !order || kern_optim_new(be, &oc, m->nparams, &opt) != CM_OK) {
        fprintf(stderr, "finetune: out of memory\n");
        goto out;
    }
    if (o.step_log && !(slog = fopen(o.step_log, "a"))) {
        fprintf(stderr, "finetune: cannot open %s: %s\n", o.step_log, strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < (size_t)mb * T; i++)
        tgt[i] = -1;
    for (size_t i = 0; i < tr.n; i++)
        order[i] = i;
    struct kern_eval e;
    if (evaluate(m, &ev, mb, T, seg0, &e) != CM_OK)
        goto out;
    print_eval("before", &e, majority);
    uint64_t rng = (uint64_t)o.seed * 0x9E3779B97F4A7C15ULL + 7;
    size_t at = tr.n; /* a fresh shuffle at the first step */
    double t0 = (double)clock() / CLOCKS_PER_SEC, loss_win = 0;
    long n_win = 0, correct_win = 0;
    for (long s = 1; s <= o.steps; s++) {
        for (int b = 0; b < mb; b++) {
            if (at == tr.n) { /* an epoch: Fisher-Yates */
                for (size_t i = tr.n - 1; i > 0; i--) {
                    size_t j = (size_t)(kern_rng_u64(&rng) % (i + 1)), x = order[i];
                    order[i] = order[j];
                    order[j] = x;
                }
                at = 0;
            }
            size_t k = order[at++];
            memcpy(btok + (size_t)b * T, tr.tok + k * T, (size_t)T * sizeof *btok);
            blab[b] = tr.label[k];
        }
        struct kern_batch kb = {.B = mb, .T = T, .tokens = btok, .targets = tgt, .segments = seg0, .sop = blab};
        struct kern_eval be_ev = {0};
        kern_model_zero_grad(m);
        if (kern_model_fwd_bwd(m, &kb, 1.0f, &be_ev) != CM_OK || kern_optim_step(opt, m, NULL, NULL) != CM_OK) {
            fprintf(stderr, "finetune: step %ld failed\n", s);
            goto out;
        }
        loss_win += be_ev.sop_loss_sum;
        n_win += be_ev.sop_count;
        correct_win += be_ev.sop_correct;
        if (slog)
            fprintf(slog, "{\"step\":%ld,\"loss\":%.6f,\"accuracy\":%.4f}\n", s,
                    be_ev.sop_loss_sum / be_ev.sop_count, (double)be_ev.sop_correct / be_ev.sop_count);
        if (s % 50 == 0 || s == o.steps) {
            printf("finetune: step %ld/%ld | loss %.4f | batch accuracy %.1f%% | %.1f CPU-s\n", s, o.steps,
                   loss_win / n_win, 100.0 * correct_win / n_win, (double)clock() / CLOCKS_PER_SEC - t0);
            fflush(stdout);
            loss_win = 0;
            n_win = correct_win = 0;
        }
        if (o.eval_every && s % o.eval_every == 0 && s != o.steps) {
            char when[40];
            snprintf(when, sizeof when, "at step %ld", s);
            if (evaluate(m, &ev, mb, T, seg0, &e) != CM_OK)
                goto out;
            print_eval(when, &e, majority);
        }
    }
    if (evaluate(m, &ev, mb, T, seg0, &e) != CM_OK)
        goto out;
    print_eval("after", &e, majority);
    rc = 0;
out:
    if (slog)
        fclose(slog);
    free(seg0);
    free(tgt);
    free(btok);
    free(blab);
    free(order);
    kern_optim_free(opt);
    kern_model_free(m);
    set_free(&tr);
    set_free(&ev);
    for (int k = 0; k < nlabels; k++)
        free(labels[k]);
    cm_spm_free(spm);
    return rc;
}
