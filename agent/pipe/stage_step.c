/* One optimizer step of a pipeline stage (stage.c's header comment;
 * docs/pipelines.md, "Stage agents"; seed 003_f3537b728458fcc1.txt §2).
 * The math is the single-process model's: kern_tfm_stage_* chain to the
 * whole model's loss and gradients (tests/unit/kernels/test_tfm_stages.c),
 * the tied embedding's gradient is the sum of the first and the last
 * stage's, and the clipping norm is the whole model's. */
#include "agent/pipe/stage_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "agent/peer/report.h"
#include "agent/train/steplog.h"
#include "ar/ar.h"
#include "cm_crypto.h"
#include "cm_err.h"

static int wte_tensor(const struct kern_model *m)
{
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, "wte"))
            return i;
    return -1;
}

/* The first and the last stage both hold wte: each sends its gradient to
 * the other and adds the other's (a + b = b + a: the same bits on both). */
static int exchange_tied(struct pstage *s, int64_t step, double *t_wait)
{
    struct kern_model *m = s->tr.model;
    const struct kern_backend *be = s->tr.be;
    int w = wte_tensor(m);
    if (w < 0)
        return CM_ESTATE;
    size_t n = m->tensors[w].numel;
    float *g = m->grads + m->tensors[w].off;
    float *mine = malloc(n * sizeof *mine);
    if (!mine)
        return CM_ENOMEM;
    uint32_t other = s->stage == 0 ? s->S - 1 : 0;
    int rc = be->download(mine, g, n * sizeof *mine);
    struct pipe_msg msg = {.type = PIPE_MSG_TIED, .step = step, .replica = s->replica, .stage = s->stage,
                           .total = (uint32_t)n};
    if (rc == CM_OK)
        rc = pipe_send_tensor(s, other, &msg, mine, NULL);
    struct pipe_entry *e = NULL;
    double t0 = peer_mono_s();
    if (rc == CM_OK)
        rc = pipe_take(s, PIPE_MSG_TIED, step, 0, other, &e);
    *t_wait += peer_mono_s() - t0;
    if (rc == CM_OK && e->total != n)
        rc = CM_ERANGE;
    if (rc == CM_OK) {
        for (size_t i = 0; i < n; i++)
            mine[i] += e->values[i];
        rc = be->upload(g, mine, n * sizeof *mine);
    }
    pipe_entry_free(e);
    free(mine);
    return rc;
}

/* The whole model's gradient norm: every stage's squared norm, the last
 * stage's without wte (the first one counts it), summed in stage order on
 * every stage, so all of them clip with the same number. */
static int global_norm(struct pstage *s, int64_t step, double *norm, double *t_wait, int *move)
{
    struct kern_model *m = s->tr.model;
    const struct kern_backend *be = s->tr.be;
    double own;
    int w = wte_tensor(m);
    if (s->S > 1 && s->stage == s->S - 1 && w >= 0) {
        size_t off = m->tensors[w].off, n = m->tensors[w].numel;
        own = be->sumsq(m->grads, off) + be->sumsq(m->grads + off + n, m->nparams - off - n);
    } else {
        own = be->sumsq(m->grads, m->nparams);
    }
    if (!isfinite(own))
        return CM_ENUMERIC;
    double part[PIPE_MAX_STAGES] = {0};
    part[s->stage] = own;
    struct pipe_msg msg = {.type = PIPE_MSG_NORM, .step = step, .replica = s->replica, .stage = s->stage,
                           .flags = *move ? PIPE_FLAG_MOVE : 0, .sumsq = own};
    for (uint32_t j = 0; j < s->S; j++)
        if (j != s->stage) {
            int rc = pipe_send_tensor(s, j, &msg, NULL, NULL);
            if (rc)
                return rc;
        }
    double t0 = peer_mono_s();
    for (uint32_t j = 0; j < s->S; j++)
        if (j != s->stage) {
            struct pipe_entry *e = NULL;
            int rc = pipe_take(s, PIPE_MSG_NORM, step, 0, j, &e);
            if (rc)
                return rc;
            part[j] = e->sumsq;
            *move |= (e->flags & PIPE_FLAG_MOVE) != 0;
            pipe_entry_free(e);
        }
    *t_wait += peer_mono_s() - t0;
    double sum = 0;
    for (uint32_t j = 0; j < s->S; j++)
        sum += part[j];
    *norm = sqrt(sum);
    return CM_OK;
}

/* The averaging's deadline: --stage-timeout-ms for the first under an
 * assignment, then 4 x the longest so far, at least AR_DEADLINE_MIN_MS.
 * It also bounds how long a replica that went on waits for one that moved
 * to a newer assignment (stage.c's loop): the averaging cannot look at
 * the served assignment while it waits. */
#define AR_DEADLINE_MIN_MS 10000.0
static uint32_t ar_deadline_ms(const struct pstage *s)
{
    double d = (double)s->o.stage_timeout_ms;
    if (s->ar_max_ms > 0)
        d = fmin(d, fmax(AR_DEADLINE_MIN_MS, 4 * s->ar_max_ms));
    return (uint32_t)d;
}

/* The replicas of our stage average its gradients (and, on the last stage,
 * the loss sums: two more values) with the butterfly all-reduce, equal
 * weights: each replica's gradient is the mean over its micro-batches, so
 * the average is the step's mean over all of them (seed 003 §2: stage j's
 * data-parallel group C_j). fp32 and member order: the first and the last
 * stage's groups average the same tied sums to the same bits. */
static int average_stage(struct pstage *s, int64_t step, struct kern_eval *ev, double *t_wait, int parts[2],
                         int *move)
{
    struct kern_model *m = s->tr.model;
    const struct kern_backend *be = s->tr.be;
    int last = s->stage == s->S - 1;
    size_t n = m->nparams, extra = last ? 3 : 1; /* [loss sum, count,] move flag */
    float *buf = malloc((n + extra) * sizeof *buf);
    struct ar_member *mem = calloc(s->D, sizeof *mem);
    int rc = buf && mem ? be->download(buf, m->grads, n * sizeof *buf) : CM_ENOMEM;
    if (rc == CM_OK && last) {
        buf[n] = (float)ev->loss_sum;
        buf[n + 1] = (float)ev->count;
    }
    if (rc == CM_OK)
        buf[n + extra - 1] = *move ? 1.0f : 0.0f;
    for (uint32_t k = 0; rc == CM_OK && k < s->D; k++) {
        memcpy(mem[k].pub, s->gkeys[k], CM_ED25519_PUB_LEN);
        if (k == s->replica)
            rc = p2p_addr_parse(s->rt.my_addr, &mem[k].addr);
        else
            mem[k].addr = s->gaddr[k];
        mem[k].fraction = 1.0 / s->D;
        mem[k].sends = AR_SENDS_FULL;
    }
    char gid[AR_GROUP_ID_MAX];
    int gl = snprintf(gid, sizeof gid, "pipe/%lld/%u", (long long)s->version, s->stage);
    struct ar_round_config cfg = {.step = (uint64_t)step,
                                  .group_id = (const uint8_t *)gid,
                                  .group_id_len = (size_t)gl,
                                  .members = mem,
                                  .n_members = s->D,
                                  .my_index = s->replica,
                                  .buf = buf,
                                  .n = n + extra,
                                  .weight = 1.0,
                                  .comp = AR_COMP_NONE,
                                  .deadline_ms = ar_deadline_ms(s)};
    struct peer_round_summary sum;
    double t0 = peer_mono_s();
    if (rc == CM_OK)
        rc = peer_net_allreduce(s->rt.net, &cfg, &sum);
    *t_wait += peer_mono_s() - t0;
    if (rc == CM_OK && sum.status == CM_OK)
        s->ar_max_ms = fmax(s->ar_max_ms, (peer_mono_s() - t0) * 1000);
    if (rc == CM_OK && (sum.status != CM_OK || sum.n_averaged != sum.n_parts)) {
        fprintf(stderr, "error: step %lld: averaging stage %u's gradients with its %u replicas failed (%zu of "
                        "%zu parts averaged): %s\n", (long long)step + 1, s->stage, s->D, sum.n_averaged,
                sum.n_parts, cm_strerror(sum.status));
        for (size_t i = 0; i < sum.n_excluded && sum.excluded[i] < s->D; i++)
            fprintf(stderr, "error: replica %u (%s) was left out\n", sum.excluded[i],
                    s->gaddr_s[sum.excluded[i]]);
        rc = sum.status != CM_OK ? sum.status : CM_ECONN;
    }
    if (rc == CM_OK) {
        parts[0] = (int)sum.n_parts;
        parts[1] = (int)sum.n_averaged;
        s->avg_bytes_sent += sum.bytes_sent;
        rc = be->upload(m->grads, buf, n * sizeof *buf);
    }
    if (rc == CM_OK && last) {
        ev->loss_sum = buf[n];
        ev->count = (long)llround(buf[n + 1]);
    }
    if (rc == CM_OK)
        *move = buf[n + extra - 1] > 0; /* the mean: > 0 when any replica saw it */
    free(buf);
    free(mem);
    return rc;
}

/* Stage 0 reads the step's micro-batches in the stream's order and takes
 * those of its replica (k = replica, replica + D, ...): the D pipelines
 * together see what `train --local` sees in one step. */
static int skip_micro(struct pstage *s, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        struct kern_batch kb;
        int rc = agent_trainer_next_micro(&s->tr, &kb);
        if (rc)
            return rc;
    }
    return CM_OK;
}

/* The step's contribution report (docs/accounting.md, "Pipeline stages"):
 * the S stages of a pipeline are one round (its id hashes run, assignment
 * version, step and replica), each claims its share of the whole model's
 * work, the pipeline's samples / S, and attests the same for the
 * neighbours whose activations or gradients it took for all M
 * micro-batches (the step completed: it took all of them). */
static void report_step(struct pstage *s, int64_t step, int M, double secs, double t_wait, double loss,
                        const int parts[2])
{
    if (!s->rt.rep)
        return;
    struct peer_report *r = calloc(1, sizeof *r);
    if (!r)
        return;
    char seed[256];
    int n = snprintf(seed, sizeof seed, "crowdtrain-pipe-round/1\n%s\n%lld\n%lld\n%u", s->o.run,
                     (long long)s->version, (long long)step, s->replica);
    cm_sha256(seed, (size_t)n, r->round_id);
    double share = (double)M * s->tc.micro_batch / s->S;
    r->step = step;
    snprintf(r->group, sizeof r->group, "pipeline.%lld.%u", (long long)s->version, s->replica);
    r->samples = share;
    r->compute_s = fmax(0, secs - t_wait);
    r->loss = loss; /* NAN (not written) but on the last stage */
    r->sps = secs > 0 ? share / secs : 0;
    r->round_ms = secs * 1000;
    r->parts = parts[0];
    r->parts_averaged = parts[1];
    for (int d = -1; d <= 1; d += 2) {
        int j = (int)s->stage + d;
        if (j < 0 || j >= (int)s->S)
            continue;
        memcpy(r->members[r->n_members].pub, s->keys[j], 32);
        r->members[r->n_members++].samples = share;
    }
    peer_reporter_submit(s->rt.rep, r);
    free(r);
}

/* ---- the micro-batches of one step: 1F1B ----
 *
 * Stage j keeps up to S - j micro-batches in flight (forward done, backward
 * not yet: PipeDream-flush's 1F1B bound; the last stage one, so it runs each
 * backward right after its forward), runs a backward as soon as its
 * gradient is there and a forward as soon as its input is, and hands what
 * it sends to two sender threads (next stage, previous stage), so the
 * stages compute at once on different micro-batches and sending overlaps
 * computing (seed 003 §3.5). Backwards run in micro-batch order, so the
 * gradients add up in the order `train --local` adds them. A stage model
 * holds the activations of one micro-batch (kern_tfm_stage_forward), so a
 * backward whose forward was not the stage's last one first computes that
 * forward again from the kept input (GPipe's re-materialization). */
struct mb_in {
    struct pipe_entry *act; /* stages > 0: what the previous stage sent */
    int *tokens, *targets;  /* stage 0: copies of the micro-batch (B*T) */
    int B, T;
};

struct mbs {
    struct pstage *s;
    int64_t step;
    int M, first, last, held; /* held: the micro-batch whose activations the model holds, -1 */
    size_t act_n;
    float *x_out, *dx_in;
    struct mb_in *in;
    struct pipe_sender *next, *prev;
    struct kern_eval ev;
    int recomputed, in_flight; /* forwards computed again; most micro-batches in flight at once */
};

static void mb_in_clear(struct mb_in *in)
{
    pipe_entry_free(in->act);
    free(in->tokens);
    free(in->targets);
    memset(in, 0, sizeof *in);
}

static struct kern_batch batch_of(const struct mb_in *in)
{
    struct kern_batch kb = {.B = in->B, .T = in->T};
    if (in->act) {
        kb.targets = (const int *)in->act->targets;
    } else {
        kb.tokens = in->tokens;
        kb.targets = in->targets;
    }
    return kb;
}

static int mb_forward(struct mbs *x, int mb)
{
    struct pstage *s = x->s;
    struct mb_in *in = &x->in[mb];
    int rc;
    if (x->first) {
        struct kern_batch kb;
        rc = skip_micro(s, mb == 0 ? s->replica : s->D - 1);
        if (rc == CM_OK)
            rc = agent_trainer_next_micro(&s->tr, &kb);
        if (rc != CM_OK)
            return rc;
        size_t n = (size_t)kb.B * (size_t)kb.T;
        in->B = kb.B;
        in->T = kb.T;
        if (!(in->tokens = malloc(n * sizeof(int))) || !(in->targets = malloc(n * sizeof(int))))
            return CM_ENOMEM;
        memcpy(in->tokens, kb.tokens, n * sizeof(int));
        memcpy(in->targets, kb.targets, n * sizeof(int));
    } else {
        if ((rc = pipe_take(s, PIPE_MSG_ACT, x->step, (uint32_t)mb, s->stage - 1, &in->act)) != CM_OK)
            return rc;
        if (in->act->B != (uint32_t)s->tc.micro_batch || in->act->T != (uint32_t)s->tc.tfm.max_T ||
            in->act->C != (uint32_t)s->tc.tfm.d_model) {
            fprintf(stderr, "error: stage %u sent activations of shape (%u,%u,%u), not this run's\n",
                    s->stage - 1, in->act->B, in->act->T, in->act->C);
            return CM_ERANGE;
        }
        in->B = (int)in->act->B;
        in->T = (int)in->act->T;
    }
    struct kern_batch kb = batch_of(in);
    x->held = -1;
    rc = kern_tfm_stage_forward(s->tr.model, &kb, in->act ? in->act->values : NULL, x->x_out,
                                x->last ? &x->ev : NULL);
    if (rc != CM_OK)
        return rc;
    x->held = mb;
    if (x->last)
        return CM_OK;
    struct pipe_msg msg = {.type = PIPE_MSG_ACT, .step = x->step, .replica = s->replica, .stage = s->stage,
                           .mb = (uint32_t)mb, .B = (uint32_t)kb.B, .T = (uint32_t)kb.T,
                           .C = (uint32_t)s->tc.tfm.d_model, .total = (uint32_t)x->act_n};
    return pipe_sender_push(x->next, &msg, x->x_out, (const int32_t *)kb.targets);
}

static int mb_backward(struct mbs *x, int mb)
{
    struct pstage *s = x->s;
    struct mb_in *in = &x->in[mb];
    struct pipe_entry *grad = NULL;
    int rc = CM_OK;
    if (!x->last)
        rc = pipe_take(s, PIPE_MSG_GRAD, x->step, (uint32_t)mb, s->stage + 1, &grad);
    if (rc == CM_OK && grad &&
        (grad->B != (uint32_t)in->B || grad->T != (uint32_t)in->T || grad->C != (uint32_t)s->tc.tfm.d_model)) {
        /* the backward reads B x T x C of them */
        fprintf(stderr, "error: stage %u sent gradients of shape (%u,%u,%u) for activations of (%d,%d,%d)\n",
                s->stage + 1, grad->B, grad->T, grad->C, in->B, in->T, s->tc.tfm.d_model);
        rc = CM_ERANGE;
    }
    if (rc == CM_OK && x->held != mb) { /* the same inputs, the same ops: the same activations */
        struct kern_batch kb = batch_of(in);
        x->held = -1;
        rc = kern_tfm_stage_forward(s->tr.model, &kb, in->act ? in->act->values : NULL, x->x_out, NULL);
        x->recomputed++;
    }
    if (rc == CM_OK)
        rc = kern_tfm_stage_backward(s->tr.model, x->last ? NULL : grad->values, 1.0f / (float)x->M, x->dx_in);
    x->held = -1;
    if (rc == CM_OK && !x->first) {
        struct pipe_msg msg = {.type = PIPE_MSG_GRAD, .step = x->step, .replica = s->replica, .stage = s->stage,
                               .mb = (uint32_t)mb, .B = (uint32_t)in->B, .T = (uint32_t)in->T,
                               .C = (uint32_t)s->tc.tfm.d_model, .total = (uint32_t)x->act_n};
        rc = pipe_sender_push(x->prev, &msg, x->dx_in, NULL);
    }
    pipe_entry_free(grad);
    mb_in_clear(in);
    return rc;
}

/* Forward and backward of the step's M micro-batches (see above). */
static int run_micro_batches(struct mbs *x, double *t_wait)
{
    struct pstage *s = x->s;
    int limit = x->last ? 1 : (int)(s->S - s->stage);
    int nf = 0, nb = 0, rc = CM_OK;
    struct pipe_sender *senders[2] = {x->next, x->prev};
    while (rc == CM_OK && nb < x->M) {
        int want_b = nb < nf, want_f = nf < x->M && nf - nb < limit;
        struct pipe_want w[2];
        size_t nw = 0, which = 0;
        if (want_b && !x->last)
            w[nw++] = (struct pipe_want){PIPE_MSG_GRAD, x->step, (uint32_t)nb, s->stage + 1};
        if (want_f && !x->first)
            w[nw++] = (struct pipe_want){PIPE_MSG_ACT, x->step, (uint32_t)nf, s->stage - 1};
        agent_cpu_limit_pace(&s->cpu, &pipe_g_interrupts); /* --max-cpu-percent: between micro-batches */
        if (want_b && x->last) {
            rc = mb_backward(x, nb++);
        } else if (want_f && x->first) { /* its input is always there: a backward first if it can */
            if (nw && pipe_inbox_wait_any(s->inbox, w, nw, 0, NULL, &which) == CM_OK)
                rc = mb_backward(x, nb++);
            else
                rc = mb_forward(x, nf++);
        } else {
            double t0 = peer_mono_s();
            rc = pipe_wait_any(s, w, nw, senders, 2, &which);
            *t_wait += peer_mono_s() - t0;
            if (rc == CM_OK)
                rc = w[which].type == PIPE_MSG_GRAD ? mb_backward(x, nb++) : mb_forward(x, nf++);
        }
        if (nf - nb > x->in_flight)
            x->in_flight = nf - nb;
    }
    double t0 = peer_mono_s();
    for (int k = 0; k < 2 && rc == CM_OK; k++)
        if (senders[k])
            rc = pipe_sender_flush(senders[k]);
    *t_wait += peer_mono_s() - t0;
    return rc;
}

int pipe_stage_step(struct pstage *s, int64_t step)
{
    struct agent_trainer *t = &s->tr;
    struct kern_model *m = t->model;
    struct mbs x = {.s = s, .step = step, .first = s->stage == 0, .last = s->stage == s->S - 1, .held = -1};
    x.M = s->tc.batch_size / s->tc.micro_batch / (int)s->D; /* ours: 1/D of the step's */
    x.act_n = (size_t)s->tc.micro_batch * (size_t)s->tc.tfm.max_T * (size_t)s->tc.tfm.d_model;
    x.x_out = x.last ? NULL : malloc(x.act_n * sizeof *x.x_out);
    x.dx_in = x.first ? NULL : malloc(x.act_n * sizeof *x.dx_in);
    x.in = calloc((size_t)x.M, sizeof *x.in);
    int rc = (x.last || x.x_out) && (x.first || x.dx_in) && x.in ? CM_OK : CM_ENOMEM;
    if (rc == CM_OK && !x.last)
        rc = pipe_sender_start(s, s->stage + 1, &x.next);
    if (rc == CM_OK && !x.first)
        rc = pipe_sender_start(s, s->stage - 1, &x.prev);
    double t_start = peer_mono_s(), t_wait = 0;
    uint64_t sent0 = __atomic_load_n(&s->bytes_sent, __ATOMIC_RELAXED), avg0 = s->avg_bytes_sent;
    kern_model_zero_grad(m);
    if (rc == CM_OK)
        rc = run_micro_batches(&x, &t_wait);
    pipe_sender_stop(x.next);
    pipe_sender_stop(x.prev);
    for (int k = 0; x.in && k < x.M; k++)
        mb_in_clear(&x.in[k]);
    free(x.in);
    free(x.x_out);
    free(x.dx_in);
    struct kern_eval ev = x.ev;
    int first = x.first, last = x.last, M = x.M;
    double norm = 0;
    float lr = 0;
    /* phases' seconds for the step log: micro-batches, tied, average, norm */
    double ph[5] = {t_start, peer_mono_s(), 0, 0, 0};
    if (rc == CM_OK && first)
        rc = skip_micro(s, s->D - 1 - s->replica);
    if (rc == CM_OK && s->S > 1 && (first || last))
        rc = exchange_tied(s, step, &t_wait);
    ph[2] = peer_mono_s();
    /* Whether every agent of the assignment moves to a newer one after
       this step: any of them saw one with other slots (the coordinator
       re-solved: a volunteer joined or left). The flags travel with the
       averaging (the replicas of a stage) and then the norms (the stages
       of a pipeline), so every agent reaches the same answer from the same
       messages, and all of them move after the same step. */
    int parts[2] = {0, 0}, move = pipe_newer_assignment(s, 0);
    if (rc == CM_OK && s->D > 1)
        rc = average_stage(s, step, &ev, &t_wait, parts, &move);
    ph[3] = peer_mono_s();
    if (rc == CM_OK)
        rc = global_norm(s, step, &norm, &t_wait, &move);
    ph[4] = peer_mono_s();
    if (rc == CM_OK)
        rc = pipe_snapshot(s); /* what a re-scheduling may go back to */
    if (rc == CM_OK && (rc = kern_optim_step_norm(t->opt, m, norm, &lr)) == CM_ENUMERIC)
        fprintf(stderr, "error: step %lld: this stage's gradients are not finite\n", (long long)step);
    if (rc != CM_OK)
        return rc;
    s->move_after = move;
    char hash[65];
    if ((rc = agent_param_hash(m, hash)) != CM_OK)
        return rc;
    double loss = last && ev.count ? ev.loss_sum / (double)ev.count : NAN;
    double secs = peer_mono_s() - t_start;
    if (s->steplog) {
        char line[768], ls[32];
        if (isfinite(loss))
            snprintf(ls, sizeof ls, "%.6f", loss);
        else
            snprintf(ls, sizeof ls, "null");
        snprintf(line, sizeof line,
                 "{\"step\":%lld,\"stage\":%u,\"stages\":%u,\"replica\":%u,\"version\":%lld,\"loss\":%s,"
                 "\"hash\":\"%.16s\",\"grad_norm\":%.6g,\"lr\":%.6g,\"micro_batches\":%d,\"step_s\":%.3f,"
                 "\"wait_s\":%.3f,\"in_flight\":%d,\"recomputed\":%d,\"micro_s\":%.3f,\"tied_s\":%.3f,\"average_s\":%.3f,\"norm_s\":%.3f,\"sent_kb\":%.1f,\"avg_sent_kb\":%.1f,\"t_ms\":%lld}",
                 (long long)step + 1, s->stage, s->S, s->replica, (long long)s->version, ls, hash, norm, lr, M,
                 secs, t_wait, x.in_flight, x.recomputed, ph[1] - ph[0], ph[2] - ph[1], ph[3] - ph[2], ph[4] - ph[3], (double)(s->bytes_sent - sent0) / 1024,
                 (double)(s->avg_bytes_sent - avg0) / 1024,
                 (long long)peer_rt_now_ms(&s->rt));
        agent_steplog_write(s->steplog, line);
    }
    report_step(s, step, M, secs, t_wait, loss, parts);
    long every = s->tc.log_every > 0 ? s->tc.log_every : 10;
    if ((step + 1) % every == 0 || step == 0) {
        if (last)
            printf("step %lld: loss %.4f, grad norm %.3f, lr %.2e, %.2f s (%.2f s waiting for the other stages)\n",
                   (long long)step + 1, loss, norm, lr, secs, t_wait);
        else
            printf("step %lld: grad norm %.3f, lr %.2e, %.2f s (%.2f s waiting for the other stages)\n",
                   (long long)step + 1, norm, lr, secs, t_wait);
        fflush(stdout);
    }
    return CM_OK;
}
