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

#include "agent/train/steplog.h"
#include "ar/ar.h"
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
static int global_norm(struct pstage *s, int64_t step, double *norm, double *t_wait)
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
                           .sumsq = own};
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
            pipe_entry_free(e);
        }
    *t_wait += peer_mono_s() - t0;
    double sum = 0;
    for (uint32_t j = 0; j < s->S; j++)
        sum += part[j];
    *norm = sqrt(sum);
    return CM_OK;
}

/* The replicas of our stage average its gradients (and, on the last stage,
 * the loss sums: two more values) with the butterfly all-reduce, equal
 * weights: each replica's gradient is the mean over its micro-batches, so
 * the average is the step's mean over all of them (seed 003 §2: stage j's
 * data-parallel group C_j). fp32 and member order: the first and the last
 * stage's groups average the same tied sums to the same bits. */
static int average_stage(struct pstage *s, int64_t step, struct kern_eval *ev, double *t_wait)
{
    struct kern_model *m = s->tr.model;
    const struct kern_backend *be = s->tr.be;
    int last = s->stage == s->S - 1;
    size_t n = m->nparams, extra = last ? 2 : 0;
    float *buf = malloc((n + extra) * sizeof *buf);
    struct ar_member *mem = calloc(s->D, sizeof *mem);
    int rc = buf && mem ? be->download(buf, m->grads, n * sizeof *buf) : CM_ENOMEM;
    if (rc == CM_OK && last) {
        buf[n] = (float)ev->loss_sum;
        buf[n + 1] = (float)ev->count;
    }
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
                                  .deadline_ms = (uint32_t)s->o.stage_timeout_ms};
    struct peer_round_summary sum;
    double t0 = peer_mono_s();
    if (rc == CM_OK)
        rc = peer_net_allreduce(s->rt.net, &cfg, &sum);
    *t_wait += peer_mono_s() - t0;
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
        s->avg_bytes_sent += sum.bytes_sent;
        rc = be->upload(m->grads, buf, n * sizeof *buf);
    }
    if (rc == CM_OK && last) {
        ev->loss_sum = buf[n];
        ev->count = (long)llround(buf[n + 1]);
    }
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

int pipe_stage_step(struct pstage *s, int64_t step)
{
    struct agent_trainer *t = &s->tr;
    struct kern_model *m = t->model;
    int first = s->stage == 0, last = s->stage == s->S - 1;
    int M = s->tc.batch_size / s->tc.micro_batch / (int)s->D; /* ours: 1/D of the step's */
    size_t act_n = (size_t)s->tc.micro_batch * (size_t)s->tc.tfm.max_T * (size_t)s->tc.tfm.d_model;
    float *x_out = last ? NULL : malloc(act_n * sizeof *x_out);
    float *dx_in = first ? NULL : malloc(act_n * sizeof *dx_in);
    if ((!last && !x_out) || (!first && !dx_in)) {
        free(x_out);
        free(dx_in);
        return CM_ENOMEM;
    }
    double t_start = peer_mono_s(), t_wait = 0;
    uint64_t sent0 = s->bytes_sent, avg0 = s->avg_bytes_sent;
    struct kern_eval ev = {0};
    kern_model_zero_grad(m);
    int rc = CM_OK;
    for (int mb = 0; mb < M && rc == CM_OK; mb++) {
        struct kern_batch kb = {0};
        struct pipe_entry *act = NULL, *grad = NULL;
        double t0 = peer_mono_s();
        if (first) {
            rc = skip_micro(s, mb == 0 ? s->replica : s->D - 1);
            if (rc == CM_OK)
                rc = agent_trainer_next_micro(t, &kb);
        } else if ((rc = pipe_take(s, PIPE_MSG_ACT, step, (uint32_t)mb, s->stage - 1, &act)) == CM_OK) {
            if (act->B != (uint32_t)s->tc.micro_batch || act->T != (uint32_t)s->tc.tfm.max_T ||
                act->C != (uint32_t)s->tc.tfm.d_model) {
                fprintf(stderr, "error: stage %u sent activations of shape (%u,%u,%u), not this run's\n",
                        s->stage - 1, act->B, act->T, act->C);
                rc = CM_ERANGE;
            }
            kb.B = (int)act->B;
            kb.T = (int)act->T;
            kb.targets = (const int *)act->targets;
        }
        t_wait += first ? 0 : peer_mono_s() - t0;
        if (rc == CM_OK)
            rc = kern_tfm_stage_forward(m, &kb, first ? NULL : act->values, x_out, last ? &ev : NULL);
        if (rc == CM_OK && !last) {
            struct pipe_msg msg = {.type = PIPE_MSG_ACT, .step = step, .replica = s->replica,
                                   .stage = s->stage, .mb = (uint32_t)mb, .B = (uint32_t)kb.B,
                                   .T = (uint32_t)kb.T, .C = (uint32_t)s->tc.tfm.d_model,
                                   .total = (uint32_t)act_n};
            rc = pipe_send_tensor(s, s->stage + 1, &msg, x_out, (const int32_t *)kb.targets);
            t0 = peer_mono_s();
            if (rc == CM_OK)
                rc = pipe_take(s, PIPE_MSG_GRAD, step, (uint32_t)mb, s->stage + 1, &grad);
            t_wait += peer_mono_s() - t0;
        }
        if (rc == CM_OK)
            rc = kern_tfm_stage_backward(m, last ? NULL : grad->values, 1.0f / (float)M, dx_in);
        if (rc == CM_OK && !first) {
            struct pipe_msg msg = {.type = PIPE_MSG_GRAD, .step = step, .replica = s->replica,
                                   .stage = s->stage, .mb = (uint32_t)mb, .B = (uint32_t)kb.B,
                                   .T = (uint32_t)kb.T, .C = (uint32_t)s->tc.tfm.d_model,
                                   .total = (uint32_t)act_n};
            rc = pipe_send_tensor(s, s->stage - 1, &msg, dx_in, NULL);
        }
        pipe_entry_free(act);
        pipe_entry_free(grad);
    }
    free(x_out);
    free(dx_in);
    double norm = 0;
    float lr = 0;
    if (rc == CM_OK && first)
        rc = skip_micro(s, s->D - 1 - s->replica);
    if (rc == CM_OK && s->S > 1 && (first || last))
        rc = exchange_tied(s, step, &t_wait);
    if (rc == CM_OK && s->D > 1)
        rc = average_stage(s, step, &ev, &t_wait);
    if (rc == CM_OK)
        rc = global_norm(s, step, &norm, &t_wait);
    if (rc == CM_OK)
        rc = pipe_snapshot(s); /* what a re-scheduling may go back to */
    if (rc == CM_OK && (rc = kern_optim_step_norm(t->opt, m, norm, &lr)) == CM_ENUMERIC)
        fprintf(stderr, "error: step %lld: this stage's gradients are not finite\n", (long long)step);
    if (rc != CM_OK)
        return rc;
    char hash[65];
    if ((rc = agent_param_hash(m, hash)) != CM_OK)
        return rc;
    double loss = last && ev.count ? ev.loss_sum / (double)ev.count : NAN;
    double secs = peer_mono_s() - t_start;
    if (s->steplog) {
        char line[640], ls[32];
        if (isfinite(loss))
            snprintf(ls, sizeof ls, "%.6f", loss);
        else
            snprintf(ls, sizeof ls, "null");
        snprintf(line, sizeof line,
                 "{\"step\":%lld,\"stage\":%u,\"stages\":%u,\"replica\":%u,\"version\":%lld,\"loss\":%s,"
                 "\"hash\":\"%.16s\",\"grad_norm\":%.6g,\"lr\":%.6g,\"micro_batches\":%d,\"step_s\":%.3f,"
                 "\"wait_s\":%.3f,\"sent_kb\":%.1f,\"avg_sent_kb\":%.1f,\"t_ms\":%lld}",
                 (long long)step + 1, s->stage, s->S, s->replica, (long long)s->version, ls, hash, norm, lr, M,
                 secs, t_wait, (double)(s->bytes_sent - sent0) / 1024, (double)(s->avg_bytes_sent - avg0) / 1024,
                 (long long)peer_rt_now_ms(&s->rt));
        agent_steplog_write(s->steplog, line);
    }
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
