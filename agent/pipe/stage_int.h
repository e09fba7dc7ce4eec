/* Internals of `crowdtrain-agent pipeline` (stage.c: options, set-up and
 * the command; stage_net.c: messages to and from the other stages;
 * stage_step.c: one training step). */
#ifndef AGENT_PIPE_STAGE_INT_H
#define AGENT_PIPE_STAGE_INT_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "agent/cpu_limit.h"
#include "agent/peer/runtime.h"
#include "agent/pipe/inbox.h"
#include "agent/train/trainer.h"
#include "sched/pipe_msg.h"

/* The run's DHT key under which stage agents announce "MSG_ADDR AR_ADDR" */
#define PIPE_PEERS_KEY_FMT "%s/pipe/peers"

#define PIPE_MAX_SLOTS 256  /* stages x replicas (DTFM_PAYLOAD_MAX_SLOTS) */
#define PIPE_MAX_SPARES 256 /* DTFM_PAYLOAD_MAX_SPARES */

struct stage_opts {
    char *run, *coordinator, *config_dir, *device, *listen_ip, *advertise_ip, *step_log;
    char *latency_to;
    long steps, dht_port, ar_port, stage_timeout_ms, wait_s, latency_ms;
    double samples_per_s, max_cpu_percent, max_upload_mbps, max_download_mbps, pace;
};

struct pstage {
    struct stage_opts o;
    struct peer_rt rt;
    struct agent_train_config tc;
    struct agent_cpu_limit cpu; /* --max-cpu-percent (cores 0: none) */
    uint32_t S, D, replica, stage;
    uint32_t act_enc;  /* activations' and their gradients' encoding (pipeline.compression) */
    uint8_t keys[PIPE_MAX_STAGES][CM_ED25519_PUB_LEN]; /* our pipeline's stages (row `replica`) */
    struct sockaddr_storage addr[PIPE_MAX_STAGES];     /* their message (state host) addresses */
    pthread_mutex_t addr_mu; /* addr, addr_s, gaddr, gaddr_s: pipe_resolve writes, senders read */
    char addr_s[PIPE_MAX_STAGES][PEER_ADDR_MAX];
    uint8_t gkeys[PIPE_MAX_STAGES][CM_ED25519_PUB_LEN]; /* our stage's replicas (column `stage`) */
    struct sockaddr_storage gaddr[PIPE_MAX_STAGES];     /* their averaging addresses */
    char gaddr_s[PIPE_MAX_STAGES][PEER_ADDR_MAX];
    int64_t version;         /* of the assignment we work under */
    uint32_t D_cfg, min_replicas; /* the run's pipeline.replicas and min_replicas */
    /* the assignment's members, row-major (replica, stage), then its spares */
    uint8_t all[PIPE_MAX_SLOTS + PIPE_MAX_SPARES][CM_ED25519_PUB_LEN];
    size_t n_members, n_spares;
    int64_t spare_served;    /* the newest assignment we were a spare of and served our state in */
    int run_finished;        /* a spare saw every member finish the run */
    double next_announce;    /* mono s of our addresses' next put on the DHT */
    double next_version;     /* mono s of the next look at the served version */
    double ar_max_ms;        /* the longest averaging under it so far (0: none yet) */
    int move_after;          /* the step just taken agreed to move to a newer assignment */
    pthread_t caps_th;       /* renews our capability report (stage.c) */
    pthread_mutex_t caps_mu;
    pthread_cond_t caps_cv;
    int caps_started, caps_stop;
    int64_t state_version;   /* the assignment our stage state was trained under */
    uint32_t had_stage;      /* its stage */
    float *snap;             /* params, adam.m, adam.v before the last step's update */
    size_t snap_n;
    int64_t snap_step;
    struct kern_tfm_stage st;
    struct agent_trainer tr;
    int have_tr;
    struct pipe_inbox *inbox; /* read by the loop thread once set */
    FILE *steplog;
    double sps;
    uint64_t bytes_sent;     /* stage messages (the step log's sent_kb); atomic: the senders add */
    uint64_t avg_bytes_sent; /* averaging with the replicas (avg_sent_kb) */
    /* the served assignment as the caps thread last saw it (pipe_watch_version) */
    pthread_mutex_t watch_mu;
    int64_t watch_version;
    size_t watch_n;
    uint8_t watch_assign[PIPE_MAX_SLOTS][CM_ED25519_PUB_LEN];
    double watch_next; /* caps thread only */
    struct p2p_latency_rule lat_rules[P2P_MAX_LATENCY_RULES]; /* --latency-to */
    size_t n_lat_rules;
    /* round trips to the other stage agents (rtt.c; the caps thread's
       after the first report) */
    struct pipe_rtt_peer {
        uint8_t pub[CM_ED25519_PUB_LEN];
        double best_ms; /* smallest reading so far, 0: none */
        double next;    /* mono s of the next reading */
    } rtt[PEER_CAPS_MAX_PAIRS];
    size_t n_rtt;
    double rtt_next; /* mono s of the caps thread's next pipe_rtt_tick */
};

extern volatile sig_atomic_t pipe_g_interrupts;

/* stage_net.c */
int pipe_stage_on_request(void *arg, struct p2p_host *h, const struct p2p_peer *from, uint32_t type,
                          const uint8_t *body, size_t len, uint8_t **resp, size_t *rlen);
/* Sends m (values, and targets for ACT) to stage j in chunks, again for the
 * chunks refused or lost, until --stage-timeout-ms; says why on stderr. */
int pipe_send_tensor(struct pstage *s, uint32_t j, struct pipe_msg *m, const float *values,
                     const int32_t *targets);
/* A sender: a thread that sends the messages pushed to it to stage `to`,
 * one after the other in push order, while the stage's thread computes
 * (seed 003 §3.5: a sending slot beside the computing one). A message that
 * cannot be sent (pipe_send_tensor's error) stops it: later pushes and
 * pipe_sender_flush return that error. */
struct pipe_sender;
int pipe_sender_start(struct pstage *s, uint32_t to, struct pipe_sender **out);
/* Queues a copy of m with its values (m->total floats, none for NORM) and
 * targets (B*T for ACT); returns the sender's first error, if any. */
int pipe_sender_push(struct pipe_sender *q, const struct pipe_msg *m, const float *values,
                     const int32_t *targets);
/* Its first error (CM_OK so far), without waiting. */
int pipe_sender_error(struct pipe_sender *q);
/* Waits until everything pushed was sent (or failed); the first error. */
int pipe_sender_flush(struct pipe_sender *q);
/* Stops the thread (what was not sent yet is dropped) and frees q. */
void pipe_sender_stop(struct pipe_sender *q);

/* The first of w[0..n-1] complete in the inbox (*which), waited for up to
 * --stage-timeout-ms, or until a sender in senders[0..ns-1] (NULLs
 * skipped) fails: its error; CM_EVERSION when the coordinator serves a
 * newer assignment meanwhile (the others may have moved to it). Says why
 * on stderr on a timeout. */
int pipe_wait_any(struct pstage *s, const struct pipe_want *w, size_t n, struct pipe_sender *const *senders,
                  size_t ns, size_t *which);

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

/* stage.c: waits for an assignment newer than after_version that gives us
 * a slot (printing why while there is none), sets s's slot, keys and
 * addresses from it. As a spare of an assignment while holding state, it
 * serves that state to the members (pipe_spare_serve). CM_OK with
 * s->run_finished set: we were a spare and every member finished. */
int pipe_wait_assignment(struct pstage *s, int64_t after_version);

/* rtt.c: Pings the agents announced on the run's DHT that are due for a
 * reading (new ones at once, each again every 60 s) and hands the round
 * trips to the capability reports (peer_rt_set_pairs); the number of
 * agents with one, -1 when the DHT could not be read. */
int pipe_rtt_tick(struct pstage *s);
/* rtt.c: before the first capability report: pipe_rtt_tick until S x D - 1
 * agents have a round trip, or PIPE_RTT_FIRST_WAIT_S passed. */
#define PIPE_RTT_FIRST_WAIT_S 20.0
#define PIPE_RTT_READ_EVERY_S 5.0 /* then the caps thread's pipe_rtt_tick */
int pipe_rtt_first(struct pstage *s);

/* stage.c: puts our addresses on the run's DHT when due (every 10 s). */
void pipe_keep_announced(struct pstage *s);

/* stage.c: the version of the assignment the coordinator serves now
 * (verified), -1 when none or unreadable. */
int64_t pipe_served_version(struct pstage *s);
/* stage.c: 1 when the coordinator serves an assignment newer than ours
 * whose slots differ (it re-solved: a volunteer joined or left), as the
 * caps thread last saw it (no request: the step's path); with gone_only,
 * asked of the coordinator (at most every PIPE_VERSION_EVERY_S seconds, 0
 * in between), and only when it no longer holds an agent of our pipeline
 * or of our stage's replicas (one left). */
#define PIPE_VERSION_EVERY_S 2.0
#define PIPE_VERSION_TIMEOUT_MS 2000L /* one ask; a failed one waits PIPE_VERSION_BACKOFF_S */
#define PIPE_VERSION_BACKOFF_S 30.0
int pipe_newer_assignment(struct pstage *s, int gone_only);
/* stage.c: the caps thread's part of it: asks the coordinator for the
 * served version when due (every PIPE_VERSION_EVERY_S); without gone_only,
 * pipe_newer_assignment answers from what this saw last. */
void pipe_watch_version(struct pstage *s);

/* stage_step.c: one optimizer step (docs/pipelines.md, "Stage agents"). */
int pipe_stage_step(struct pstage *s, int64_t step);

/* resched.c: enters the next assignment (newer than after_version): the
 * first one, or one after a stage agent left; every stage of it goes on
 * from the same step (*from_step) with the run's state there
 * (docs/pipelines.md, "Re-scheduling"). */
int pipe_enter(struct pstage *s, int64_t after_version, int64_t *from_step);
/* Keeps params and optimizer state before a step's update (the state a
 * re-scheduling may have to go back to). */
int pipe_snapshot(struct pstage *s);
/* As a spare of assignment s->version holding state: says what we hold and
 * serves our stage's state at the step its members go on from. */
int pipe_spare_serve(struct pstage *s);
/* After the last step: says so on the run's DHT and waits (up to a
 * minute) until every member of the assignment did, so that none of them
 * still needs us (the last averaging's parts, the last norms). */
void pipe_finish(struct pstage *s, int64_t steps);
/* 1 when every member of assignment s->version said it finished `steps`. */
int pipe_all_finished(struct pstage *s, int64_t steps);

#endif
