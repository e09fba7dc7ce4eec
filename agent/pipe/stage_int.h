/* Internals of `crowdtrain-agent pipeline` (stage.c: options, set-up and
 * the command; stage_net.c: messages to and from the other stages;
 * stage_step.c: one training step). */
#ifndef AGENT_PIPE_STAGE_INT_H
#define AGENT_PIPE_STAGE_INT_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "agent/peer/runtime.h"
#include "agent/pipe/inbox.h"
#include "agent/train/trainer.h"
#include "sched/pipe_msg.h"

struct stage_opts {
    char *run, *coordinator, *config_dir, *device, *listen_ip, *advertise_ip, *step_log;
    long steps, dht_port, ar_port, stage_timeout_ms, wait_s, latency_ms;
};

struct pstage {
    struct stage_opts o;
    struct peer_rt rt;
    struct agent_train_config tc;
    uint32_t S, D, replica, stage;
    uint8_t keys[PIPE_MAX_STAGES][CM_ED25519_PUB_LEN]; /* our pipeline's stages (row `replica`) */
    struct sockaddr_storage addr[PIPE_MAX_STAGES];     /* their message (state host) addresses */
    char addr_s[PIPE_MAX_STAGES][PEER_ADDR_MAX];
    uint8_t gkeys[PIPE_MAX_STAGES][CM_ED25519_PUB_LEN]; /* our stage's replicas (column `stage`) */
    struct sockaddr_storage gaddr[PIPE_MAX_STAGES];     /* their averaging addresses */
    char gaddr_s[PIPE_MAX_STAGES][PEER_ADDR_MAX];
    int64_t version;
    struct kern_tfm_stage st;
    struct agent_trainer tr;
    int have_tr;
    struct pipe_inbox *inbox; /* read by the loop thread once set */
    FILE *steplog;
    double sps;
    uint64_t bytes_sent;     /* stage messages (the step log's sent_kb) */
    uint64_t avg_bytes_sent; /* averaging with the replicas (avg_sent_kb) */
};

extern volatile sig_atomic_t pipe_g_interrupts;

/* stage_net.c */
int pipe_stage_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                          const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen);
/* Sends m (values, and targets for ACT) to stage j in chunks, again for the
 * chunks refused or lost, until --stage-timeout-ms; says why on stderr. */
int pipe_send_tensor(struct pstage *s, uint32_t j, struct pipe_msg *m, const float *values,
                     const int32_t *targets);
/* The complete message (type, step, mb) from stage `from`, waited for up
 * to --stage-timeout-ms; says why on stderr. */
int pipe_take(struct pstage *s, uint32_t type, int64_t step, uint32_t mb, uint32_t from, struct pipe_entry **e);

/* stage.c: reads the addresses the other agents announced on the run's
 * DHT ("RUN/pipe/peers", newest per author: "MSG_ADDR AR_ADDR") into
 * s->addr (the other stages of our pipeline) and s->gaddr (the other
 * replicas of our stage): all of them (only < 0), or stage `only`'s of our
 * pipeline. A stage agent that restarted has a new address; a sender that
 * cannot reach a neighbour reads it again. */
int pipe_resolve(struct pstage *s, int only);

/* stage_step.c: one optimizer step (docs/pipelines.md, "Stage agents"). */
int pipe_stage_step(struct pstage *s, int64_t step);

#endif
