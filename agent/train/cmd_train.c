/* `crowdtrain-agent train --local --config FILE`: single-process training
 * with the same building blocks the collaborative agent uses (trainer.h),
 * printing one progress line every log_every steps and evaluating at the
 * end. It is the reference that collaborative training must match. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/commands.h"
#include "agent/cpu_limit.h"
#include "agent/train/steplog.h"
#include "agent/train/trainer.h"
#include "cm_err.h"
#include "cm_log.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: crowdtrain-agent train --local --config FILE [--device cpu|cuda|auto]\n"
               "                              [--threads N] [--steps N] [--data-seed N] [--step-log FILE]\n"
               "                              [--max-cpu-percent P] [--export FILE]\n\n"
               "Trains the model FILE describes in this process (docs/training.md).\n"
               "  --device   overrides the config's device (auto: CUDA when a GPU is present)\n"
               "  --threads  CPU threads (0 = all cores)\n"
               "  --steps    overrides the config's step count (the schedule keeps its length)\n"
               "  --data-seed N  seed of the training data order (default: the config's seed)\n"
               "  --export FILE  write the trained model as safetensors at the end (what\n"
               "             `finetune --model` and other tools read)\n"
               "  --step-log FILE  append one JSON line per step: step, parameter hash, loss\n"
               "  --max-cpu-percent P  use at most about P%% of the machine's CPU time, all cores\n"
               "             counted (fewer threads, and pauses between steps); 0 = no limit\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fmt_dur(double s, char *out, size_t n)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, n, "%lds", t);
}

static void print_eval(const struct agent_trainer *t, const char *when, const struct kern_eval *ev)
{
    double loss = ev->count ? ev->loss_sum / ev->count : NAN;
    printf("eval %s: loss %.4f | accuracy %.2f%% (%ld/%ld)", when, loss,
           ev->count ? 100.0 * ev->correct / ev->count : 0.0, ev->correct, ev->count);
    if (t->cfg.kind != KERN_MODEL_MLP && t->data_vocab == 256)
        printf(" | %s %.4f", t->cfg.kind == KERN_MODEL_GPT ? "bits/byte" : "bits/masked byte",
               loss / log(2.0));
    if (t->docs)
        printf(" | unigram baseline %.2f%%", 100.0 * t->eval_baseline);
    if (ev->sop_count)
        printf(" | sentence order: loss %.4f, accuracy %.2f%% (%ld/%ld)", ev->sop_loss_sum / ev->sop_count,
               100.0 * ev->sop_correct / ev->sop_count, ev->sop_correct, ev->sop_count);
    printf("\n");
    fflush(stdout);
}

/* What the experts did over the whole run, evaluations included. */
static void print_dmoe_stats(const struct agent_trainer *t)
{
    struct kern_dmoe_stats st;
    if (t->cfg.kind != KERN_MODEL_DMOE || kern_dmoe_get_stats(t->model, &st))
        return;
    printf("experts: %ld forward calls, %ld failed (%.2f%%); %ld backward calls, %ld failed "
           "(%.2f%%); %ld non-finite answers; %ld of %ld routed slots answered; %ld samples "
           "with no expert\n",
           st.calls_fwd, st.failed_fwd, st.calls_fwd ? 100.0 * st.failed_fwd / st.calls_fwd : 0.0,
           st.calls_bwd, st.failed_bwd, st.calls_bwd ? 100.0 * st.failed_bwd / st.calls_bwd : 0.0,
           st.nonfinite, st.answered, st.slots, st.empty);
    fflush(stdout);
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc((1 << 20) + 1);
    size_t n = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    if (buf)
        buf[n] = 0;
    *len = n;
    return buf;
}

struct train_opts {
    const char *config, *device, *step_log;
    unsigned long long data_seed;
    int local, threads;
    long steps;
    double max_cpu_percent;
    const char *export_path;
};

/* 0: go on; otherwise the exit status (--help: 0 after printing it, as -1). */
static int parse_opts(int argc, char **argv, struct train_opts *o)
{
    static const struct option opts[] = {
        {"local", no_argument, NULL, 'l'},      {"config", required_argument, NULL, 'c'},
        {"device", required_argument, NULL, 'd'}, {"threads", required_argument, NULL, 't'},
        {"steps", required_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'},
        {"step-log", required_argument, NULL, 'g'}, {"data-seed", required_argument, NULL, 'r'},
        {"max-cpu-percent", required_argument, NULL, 'p'}, {"export", required_argument, NULL, 'x'},
        {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof *o);
    o->threads = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'l': o->local = 1; break;
        case 'c': o->config = optarg; break;
        case 'd': o->device = optarg; break;
        case 't':
            o->threads = (int)strtol(optarg, &end, 10);
            if (*end || o->threads < 0 || o->threads > 1024) {
                fprintf(stderr, "train: --threads must be an integer in [0, 1024]\n");
                return 2;
            }
            break;
        case 's':
            o->steps = strtol(optarg, &end, 10);
            if (*end || o->steps < 1) {
                fprintf(stderr, "train: --steps must be a positive integer\n");
                return 2;
            }
            break;
        case 'g': o->step_log = optarg; break;
        case 'x': o->export_path = optarg; break;
        case 'p':
            o->max_cpu_percent = strtod(optarg, &end);
            if (*end || !*optarg ||
                (o->max_cpu_percent != 0 && !(o->max_cpu_percent >= 1 && o->max_cpu_percent <= 100))) {
                fprintf(stderr, "train: --max-cpu-percent must be 0 (no limit) or from 1 to 100\n");
                return 2;
            }
            break;
        case 'r':
            o->data_seed = strtoull(optarg, &end, 10);
            if (*end || !*optarg || o->data_seed == 0) {
                fprintf(stderr, "train: --data-seed must be a positive integer\n");
                return 2;
            }
            break;
        case 'h': usage(stdout); return -1;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "train: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (!o->local || !o->config) {
        fprintf(stderr, "train: only local training is available here: --local --config FILE "
                        "(collaborative training is 'crowdtrain-agent join')\n");
        usage(stderr);
        return 2;
    }
    if (o->device && strcmp(o->device, "cpu") && strcmp(o->device, "cuda") && strcmp(o->device, "auto")) {
        fprintf(stderr, "train: --device must be cpu, cuda or auto\n");
        return 2;
    }
    return 0;
}

/* The steps from the trainer's step to cfg->steps, with the log line every
 * log_every steps, checkpoints and evaluations on the way. */
static int train_steps(struct agent_trainer *t, const struct agent_train_config *cfg, FILE *slog,
                       struct agent_cpu_limit *lim, char *err, size_t cap)
{
    int rc;
    struct kern_eval ev;
    double t0 = now_s(), tlast = t0;
    double samples_last = 0;
    long first = t->opt->step;
    double win_loss = 0, win_sop = 0;
    long win_count = 0, win_sop_n = 0;
    while (t->opt->step < cfg->steps) {
        struct kern_eval bev;
        float gnorm = 0, lr = 0;
        if ((rc = agent_trainer_compute_grads(t, &bev))) {
            snprintf(err, cap, "step %ld: %s", t->opt->step, cm_strerror(rc));
            return rc;
        }
        if ((rc = agent_trainer_apply(t, &gnorm, &lr))) {
            snprintf(err, cap, "step %ld: optimizer: %s", t->opt->step, cm_strerror(rc));
            return rc;
        }
        win_loss += bev.loss_sum;
        win_count += bev.count;
        win_sop += bev.sop_loss_sum;
        win_sop_n += bev.sop_count;
        agent_cpu_limit_pace(lim, NULL); /* the volunteer's CPU limit, between steps */
        long s = t->opt->step;
        if (slog) {
            char hash[65], line[320], sop[48] = "";
            if ((rc = agent_param_hash(t->model, hash)))
                return rc;
            if (bev.sop_count)
                snprintf(sop, sizeof sop, ",\"sop_loss\":%.6f", bev.sop_loss_sum / (double)bev.sop_count);
            snprintf(line, sizeof line, "{\"step\":%ld,\"hash\":\"%s\",\"loss\":%.6f%s,\"samples\":%ld}", s,
                     hash, bev.count ? bev.loss_sum / (double)bev.count : 0.0, sop, bev.count);
            agent_steplog_write(slog, line);
        }
        if (s % cfg->log_every == 0 || s == cfg->steps) {
            double now = now_s();
            double sps = (t->samples - samples_last) / (now - tlast);
            double eta = (now - t0) / (double)(s - first) * (double)(cfg->steps - s);
            char etas[32];
            fmt_dur(eta, etas, sizeof etas);
            char sop[40] = "";
            if (win_sop_n)
                snprintf(sop, sizeof sop, " | sop loss %.4f", win_sop / (double)win_sop_n);
            printf("step %ld/%ld | loss %.4f%s | lr %.2e | grad norm %.3f | %.0f samples/s | "
                   "ETA %s\n",
                   s, cfg->steps, win_count ? win_loss / win_count : NAN, sop, lr, gnorm, sps, etas);
            fflush(stdout);
            tlast = now;
            samples_last = t->samples;
            win_loss = win_sop = 0;
            win_count = win_sop_n = 0;
        }
        if (cfg->ckpt_every && s % cfg->ckpt_every == 0 && s != cfg->steps &&
            (rc = agent_trainer_save(t, err, cap)))
            return rc;
        if (cfg->eval_every && s % cfg->eval_every == 0 && s != cfg->steps) {
            if ((rc = agent_trainer_evaluate(t, cfg->eval_batches, &ev, err, cap)))
                return rc;
            char when[48];
            snprintf(when, sizeof when, "at step %ld", s);
            print_eval(t, when, &ev);
        }
    }
    printf("train: %ld steps in %.1f s\n", cfg->steps - first, now_s() - t0);
    return CM_OK;
}

int agent_cmd_train(int argc, char **argv)
{
    struct train_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    FILE *slog = NULL;
    struct agent_train_config cfg;
    char err[512] = "";
    rc = agent_train_config_load(o.config, &cfg, err, sizeof err);
    if (rc) {
        fprintf(stderr, "train: %s: %s\n", o.config, err);
        return 1;
    }
    if (o.device)
        snprintf(cfg.device, sizeof cfg.device, "%s", o.device);
    if (o.threads >= 0)
        cfg.threads = o.threads;
    struct agent_cpu_limit lim;
    agent_cpu_limit_init(&lim, o.max_cpu_percent, agent_cpu_count());
    if (o.max_cpu_percent > 0) {
        /* no more compute threads than the budget's cores (cpu_limit.h) */
        int lt = agent_cpu_limit_threads(o.max_cpu_percent, agent_cpu_count());
        if (cfg.threads == 0 || cfg.threads > lt)
            cfg.threads = lt;
    }
    if (o.steps)
        cfg.steps = o.steps;
    if (o.data_seed)
        cfg.data_seed = o.data_seed;
    if (o.step_log && !(slog = fopen(o.step_log, "a"))) {
        fprintf(stderr, "train: cannot open the step log %s\n", o.step_log);
        return 1;
    }
    size_t text_len = 0;
    char *text = read_all(o.config, &text_len);
    struct agent_trainer t;
    rc = agent_trainer_init(&t, &cfg, text, text_len, err, sizeof err);
    int resumed = 0;
    if (!rc)
        rc = agent_trainer_resume(&t, &resumed, err, sizeof err);
    if (rc) {
        fprintf(stderr, "train: %s\n", err);
        agent_trainer_cleanup(&t);
        free(text);
        if (slog)
            fclose(slog);
        return 1;
    }
    /* the CPU's thread count, or the GPU's matrix-product precision */
    char bedesc[48];
    if (t.be->dev == KERN_DEV_CPU)
        snprintf(bedesc, sizeof bedesc, "%d threads", kern_cpu_threads());
    else
        snprintf(bedesc, sizeof bedesc, "%s matmuls", cfg.precision);
    printf("train: %s model, %zu parameters, %s backend (%s), batch %d (micro %d), %ld steps\n",
           cfg.kind == KERN_MODEL_MLP    ? "mlp"
           : cfg.kind == KERN_MODEL_GPT  ? "gpt"
           : cfg.kind == KERN_MODEL_DMOE ? "dmoe"
                                         : "albert",
           t.model->nparams, t.be->name, bedesc, cfg.batch_size, cfg.micro_batch, cfg.steps);
    if (cfg.kind == KERN_MODEL_DMOE)
        printf("train: dmoe: grid %d^%d local experts (width %d, hidden %d; %zu parameters "
               "not averaged), top-%d, each call fails with p = %g\n",
               cfg.dmoe.grid_m, cfg.dmoe.grid_d, cfg.experts.C, cfg.experts.F,
               kern_dmoe_local_param_count(t.experts), cfg.dmoe.k, cfg.experts.fail_prob);
    if (resumed)
        printf("train: resumed from %s/latest.ckpt at step %ld\n", cfg.ckpt_dir, t.opt->step);
    fflush(stdout);
    struct kern_eval ev;
    if (cfg.eval_at_start && !resumed) {
        if ((rc = agent_trainer_evaluate(&t, cfg.eval_batches, &ev, err, sizeof err)))
            goto fail;
        print_eval(&t, "before", &ev);
    }
    if ((rc = train_steps(&t, &cfg, slog, &lim, err, sizeof err)))
        goto fail;
    if (*cfg.ckpt_dir) {
        if ((rc = agent_trainer_save(&t, err, sizeof err)))
            goto fail;
        printf("train: checkpoint %s/latest.ckpt (step %ld)\n", cfg.ckpt_dir, t.opt->step);
    }
    if (*cfg.eval_manifest) {
        if ((rc = agent_trainer_evaluate(&t, cfg.eval_batches, &ev, err, sizeof err)))
            goto fail;
        print_eval(&t, "after", &ev);
    }
    if (o.export_path) {
        const char *meta[] = {"format", "pt"};
        if ((rc = agent_model_export(t.model, o.export_path, meta, 1))) {
            snprintf(err, sizeof err, "exporting the model to %s: %s", o.export_path, cm_strerror(rc));
            goto fail;
        }
        printf("train: exported the model to %s\n", o.export_path);
    }
    print_dmoe_stats(&t);
    agent_trainer_cleanup(&t);
    free(text);
    if (slog)
        fclose(slog);
    return 0;
fail:
    if (slog)
        fclose(slog);
    fprintf(stderr, "train: %s\n", err);
    agent_trainer_cleanup(&t);
    free(text);
    return 1;
}
