/* The data-parallel role (DeDLOC, seed 000_02cc6b5d62a616fc.txt §3.1-3.3;
 * docs/collaboration.md): what `crowdtrain-agent join` does on top of the
 * peer runtime (agent/peer/runtime.h). Internal to agent/dp/: the role's
 * state, one averaging round's job, and the functions its files share.
 *
 *   join.c     the command: options, the run's recipe, start and stop
 *   loop.c     the training loop, a driver over named phases
 *   accum.c    the accumulation phase: micro-batches and what the
 *              collaboration's progress says to do next
 *   round.c    one averaging round: gather, plan, average, outcome
 *   apply.c    applying a round, resyncing after one, schedules
 *   records.c  the role's DHT records: progress, announcements, peers
 *   view.c     predicates over the peers' progress
 *   collab.c, groups.c, sched_follow.c: records, group layouts and
 *              schedules (pure or self-contained; unit-tested)
 *
 * Threads: the training thread runs the loop and owns everything here
 * except a job whose round runs on its own thread (--delayed-updates): that
 * thread owns the job until dp_round_done says so, and otherwise shares js
 * (under js_mu), the runtime's thread-safe services, and settings that do
 * not change after start-up (options, the model's size, our key). */
#ifndef AGENT_DP_DP_H
#define AGENT_DP_DP_H

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>

#include "agent/cpu_limit.h"
#include "agent/dp/collab.h"
#include "agent/dp/sched_follow.h"
#include "agent/peer/runtime.h"
#include "agent/train/trainer.h"
#include "ar/ar.h"

struct dp_opts {
    int no_relay; /* --no-relay */
    char *coordinator, *run, *config_dir, *device, *listen_ip, *advertise_ip, *export_path,
        *compression, *step_log, *progress;
    int aggregate_only, client_mode, no_eval, delayed_updates;
    long dht_port, ar_port, steps, micro_batch, checkpoint_every, round_timeout_ms, round_window_ms,
        gather_margin_ms, outcome_window_ms, stall_ms, expert_timeout_ms, max_inflight;
    double max_upload_mbps, max_download_mbps, max_cpu_percent, pace;
};

/* A failed round this long after the last one starts a new count. */
#define DP_FAILING_FORGET_S 120.0

/* A round's members are read --gather-margin-ms (default 150) after its
 * window closed, or DP_GATHER_MARGIN_X times the slowest of our last
 * DP_GATHER_PUTS announcements to the DHT when that is longer (the others'
 * take about as long to land: a slow link or a loaded machine raises the
 * margin by itself). dp_gather_margin. */
#define DP_GATHER_MARGIN_X 3
#define DP_GATHER_PUTS 8
#define DP_GATHER_MARGIN_MAX_MS 5000
/* The gathering marks the link busy for the probes this long before its
 * members are read (the all-reduce starts then): a pair probe's chunks in
 * flight at that moment went out ahead of the round's (two 32 KiB at 4
 * Mbit/s: 130 ms, and 4 Mbit/s peers' rounds were ~190 ms longer in the
 * steps they probed). */
#define DP_PROBE_GUARD_MS 250

#define DP_REFUSED_SLOTS 8

struct dp_state {
    struct dp_opts o;
    struct peer_rt rt;          /* the runtime: session, pass, clock, net, reports, probes */
    double target;
    long steps, ckpt_every;
    enum ar_comp comp;
    char *config_text;
    struct agent_train_config tcfg;
    struct agent_trainer tr;
    int trainer_ready;
    int progress_live;          /* --progress: 1 live line, 0 a line per step */
    char progress_key[128];
    char hash[65];              /* parameter hash at hash_step */
    int64_t hash_step;
    FILE *steplog;
    double finished_at;         /* when a peer was first seen at the run's last step (mono) */
    double joined_at;           /* mono: when we joined (DP_DISCOVERY_S) */
    int discovery_said;         /* the "nobody seen yet" line was printed */
    int corrupt;                /* CROWDTRAIN_TEST_CORRUPT_GRADIENTS: 1 nan, 2 huge (tests only) */
    struct dp_sched *js;        /* schedules (issue 7), NULL when unavailable */
    double sched_at;            /* mono of the last schedule refresh */
    int pull_only;              /* this step: the schedule says do not compute; take the
                                   average and step (see dp_step_role) */
    double pull_only_off_until; /* mono: compute whatever the schedule says until then */
    uint8_t prev[AR_MAX_MEMBERS][CM_ED25519_PUB_LEN]; /* senders of our last round */
    size_t n_prev;
    pthread_mutex_t js_mu;      /* js is used by the round thread too (delayed updates) */
    double mb_time;             /* seconds per micro-batch (moving average) */
    struct collab_hold hold;    /* delayed updates: our waits for the peers behind our step
                                   (see dp_majority_behind), a bucket of DP_HOLD_S */
    double hold_warned;         /* mono of the last "stayed behind" warning */
    int64_t put_ms[DP_GATHER_PUTS]; /* our last announcements' DHT puts (round thread) */
    size_t n_puts;
    int64_t margin_ms;          /* dp_gather_margin (atomic: the loop reads it too) */
    int link_marked;            /* the round thread holds a peer_rt_link_busy (round.c) */
    /* rounds in a row that averaged nothing (not steps), since when, why */
    int failing;
    double failing_since, failing_last;
    char failing_why[320];
    /* the volunteer's limits (docs/collaboration.md, "Resource limits") */
    struct agent_cpu_limit cpu;  /* --max-cpu-percent: paced between micro-batches */
    const volatile sig_atomic_t *pause_req; /* 1 while the volunteer wants us paused
                                               (SIGUSR1 / SIGUSR2, join.c) */
    int paused;                 /* the loop is paused: our records say so (records.c) */
    /* our last progress record (records.c), published again while a state
       transfer of ours runs (dp_still_here) */
    int64_t pub_step;
    double pub_samples, pub_sps, pub_pledged;
    double pub_at;              /* mono: when it was published */
    /* a DMoE model's remote experts (agent/moe/remote.h): their counts at the
       last step log line, for per-step figures; micro-batches dropped */
    struct moe_remote_stats moe_prev;
    long moe_dropped;
    /* members refused as aggregators for announcing an averaging address
       the schedule does not give them (round.c, warn_refused): said once a
       minute per key (round thread) */
    uint8_t refused_key[DP_REFUSED_SLOTS][CM_ED25519_PUB_LEN];
    double refused_at[DP_REFUSED_SLOTS];
    int self_refused;           /* our last round refused us (atomic): the schedule
                                   lags our address (a new relay); refreshed every
                                   5 s meanwhile (dp_schedule_upkeep) */
};

/* One averaging round: what the accumulation hands over and what comes
 * back. With --delayed-updates it runs on its own thread while the next
 * accumulation goes on (seed 000 §3.2, "delayed parameter updates"). */
struct dp_job {
    struct dp_state *s;
    int64_t step;       /* the round's step (parameters' step before it) */
    int pull_only;      /* sends nothing, takes the average (s->pull_only at its start) */
    int finished;       /* a peer was seen at the run's last step (s->finished_at, copied
                           by the training thread: the round thread reads this one) */
    float *accum;       /* mean gradient in, averaged gradient out (n floats) */
    double samples, loss_sum, loss_n, compute_s, sps;
    /* ALBERT's heads over the round's micro-batches (the report's sop_loss
       and mlm_accuracy): the sentence-order loss sum over sop_n sequences,
       and the masked positions predicted right (of loss_n) */
    double sop_sum, sop_n, hits;
    /* results */
    int rc;             /* CM_OK; CM_EBUSY: announced too late; CM_ESTATE: no usable round */
    int missed;         /* the others agreed on parts we lack: fetch their state */
    int alone;          /* declined: a minority of the peers (see round.c) */
    int discovering;    /* declined: alone, and we joined less than DP_DISCOVERY_S ago */
    int short_batch;    /* declined: one sender, with less than the target (see round.c) */
    int unshared;       /* no other sender's gradient reached us: not stepping */
    int unaveraged;     /* no part averaged by every member: not a step (issue 17) */
    char why[320];      /* for unaveraged: each part's aggregator and why it failed */
    size_t others;      /* other peers accumulating for the step when it started */
    size_t on;          /* peers on the step, as the members announced (collab_round_on) */
    int ar_rc;          /* the engine's error when it did not run the round (0: it ran) */
    int64_t close_ms;   /* our window's close (from the announcements: the same for every
                           member); in the round ids, so each try of a step is a round of its own */
    size_t present;     /* other compute peers with fresh progress, any step */
    size_t senders;     /* senders in our window */
    uint64_t agreed;
    size_t n_parts, counted, nmem, me;
    struct collab_announce *mem;
    struct ar_member am[AR_MAX_MEMBERS];
    uint8_t rid[AR_ROUND_ID_LEN];
    struct peer_round_summary sum;
    int64_t sched_v;
    size_t relayed_aggs, punched; /* other aggregators reached through a relay, and
                                     those of them through a punched hole */
    size_t refused;     /* members refused as aggregators (announced elsewhere than
                           the schedule says; round.c, warn_refused) */
    size_t group_rounds, group_size; /* rounds of group all-reduce (1: one group), our last group */
    size_t group_senders;            /* most senders in a group of ours */
    size_t group_last;               /* members of our group in the last round */
    double global, t_wait, t_round;  /* seconds waited for it / it took (gather to outcome) */
    int64_t margin_ms;               /* the gathering's margin (dp_gather_margin) */
    /* thread */
    pthread_t th;
    int threaded;
    volatile int done;
};

/* Delayed updates: the bucket of waits for the peers behind (collab_hold),
 * refilled at DP_HOLD_REFILL seconds per second not waiting. */
#define DP_HOLD_S 10.0
#define DP_HOLD_REFILL 0.1
/* Fresh progress of a peer accumulating / present at any step. */
#define DP_ACTIVE_MS 5000
#define DP_PRESENT_MS 10000
/* A peer to which a state comes republishes its progress this often
 * (dp_still_here): a transfer may take longer than DP_PRESENT_MS, and a
 * peer catching up that dropped out of the others' count let the one
 * compute peer left step alone, so that it never caught up. */
#define DP_STILL_HERE_S 1.0

/* A peer that sees no other peer does not step alone in its first
 * DP_DISCOVERY_S after joining: peers that started with it (or that it
 * joins after a restart) may not have reached its DHT view yet, and a
 * round of its own would fork the collaboration at that step (healed
 * later by fetching the majority's state, but two states of one step, and
 * its gradient lost). A collaboration of one waits that long once. */
#define DP_DISCOVERY_S 5.0

/* A pull-only peer computes after no computing peer was active for
 * DP_PULL_ONLY_IDLE_S, whatever the schedule says, for DP_PULL_ONLY_OFF_S. */
#define DP_PULL_ONLY_IDLE_S 15.0
#define DP_PULL_ONLY_OFF_S 120.0

/* records.c */
int64_t dp_now(const struct dp_state *s);
int dp_interrupted(const struct dp_state *s);
int dp_publish_progress(struct dp_state *s, int64_t step, double samples, double sps, double pledged);
/* Our progress at `step` with nothing accumulated (we dropped it to catch up). */
int dp_publish_idle(struct dp_state *s, int64_t step);
/* Our last progress record again, fresh, when it is DP_STILL_HERE_S old
 * (struct peer_role.fetching: during state transfers). */
void dp_still_here(void *ctx);
int dp_read_progress(struct dp_state *s, struct collab_progress **out, size_t *n);
int dp_peers(void *ctx, struct peer_info **out, size_t *n);
struct peer_info *dp_infos(const struct collab_progress *p, size_t n);
struct collab_announce *dp_read_announces(struct dp_state *s, int64_t step, int others_only,
                                          int64_t until_ms, size_t extra, size_t *na);
/* `on`: the compute peers we see accumulating for the step, ourselves
   included when we send (announced as "on": collab_round_on) */
int dp_gather(struct dp_state *s, int64_t step, double weight, int pull_only, size_t on,
              struct collab_announce **out, size_t *n, int64_t *close_ms);

/* view.c */
int dp_lagging_members(const struct dp_state *s, const struct collab_progress *p, size_t n,
                       int64_t acc_step, int64_t now);
size_t dp_others_active(const struct dp_state *s, const struct collab_progress *p, size_t n,
                        int64_t step, int64_t now);
size_t dp_others_present(const struct dp_state *s, const struct collab_progress *p, size_t n, int64_t now);
size_t dp_peers_ahead(const struct collab_progress *p, size_t n, int64_t step, int64_t now,
                      size_t *firm, size_t *pending);
size_t dp_majority_below(const struct dp_state *s, const struct collab_progress *p, size_t n,
                         int64_t step, size_t at_step, int64_t now, int64_t *low);
int dp_majority_behind(const struct dp_state *s, const struct collab_progress *p, size_t n,
                       int64_t step, int64_t now);
int dp_round_going(struct dp_state *s, const struct collab_progress *p, size_t n, int64_t step,
                   int64_t now);
int dp_pstep_held(const struct dp_state *s, const struct collab_progress *p, size_t n, int64_t pstep);
int dp_round_open(struct dp_state *s, int64_t step);
/* The gathering margin now (see DP_GATHER_MARGIN_X). */
int64_t dp_gather_margin(const struct dp_state *s);
/* Remembers that our announcement took `ms` to land, and moves the margin
   (the round thread; dp_gather does it). */
void dp_gather_note_put(struct dp_state *s, int64_t ms);

/* round.c */
void dp_run_round(struct dp_job *j);
void *dp_round_thread(void *arg);
int dp_round_done(struct dp_job *j);

/* apply.c */
void dp_update_hash(struct dp_state *s, int64_t step);
int dp_sync_from_peer(struct dp_state *s, int64_t min_step, int64_t *step, uint32_t wait_ms);
int64_t dp_resync_after(struct dp_state *s, int64_t step);
int dp_finish_round(struct dp_state *s, struct dp_job *j, int64_t *step, double *last_loss);
void dp_bet_check(const struct dp_job *j, int64_t step, int64_t *join_step);
int dp_step_role(struct dp_state *s);
void dp_schedule_upkeep(struct dp_state *s, double sps);
void dp_sched_from_dht(struct dp_state *s);

/* The training loop (loop.c): a driver over these phases, each a function
 * that returns the next one.
 *   BEGIN       a new accumulation: end of the run? pass, schedule, job
 *   ACCUMULATE  micro-batches until the collaboration reaches the target
 *               (accum.c), or until it shows we are behind or diverged
 *   RESYNC      take the collaboration's state from a peer or checkpoint
 *   AVERAGE     apply the round in flight, then average this one (on its
 *               own thread with --delayed-updates, else here and apply it)
 *   PAUSE       the volunteer paused us (pause.c): finish the round in
 *               flight, leave the counting, wait for resume, catch up
 *   END         the loop is over: apply a round still in flight
 *   STOP        a fatal error (l->rc) */
enum dp_phase { DP_BEGIN, DP_ACCUMULATE, DP_RESYNC, DP_AVERAGE, DP_PAUSE, DP_END, DP_STOP };

struct dp_loop {
    struct dp_state *s;
    struct dp_job jobs[2];  /* one accumulating, one averaging (delayed updates) */
    struct dp_job *inflight; /* the averaging round in progress (delayed updates) */
    int cur;                /* jobs[cur] accumulates */
    float *grad;            /* one micro-batch's gradient */
    int rc;                 /* why the loop stopped (DP_STOP) */
    double sps, last_loss, mb_time;
    int64_t step;           /* the step of our parameters */
    int64_t join_step;      /* > step: we accumulate for this round ahead of our parameters,
                               betting on the round in flight (dp_bet_check) */
    int resumed;            /* just resumed: look at the collaboration before computing */
    int carry;              /* the round just ended declined (jobs[cur].alone): its
                               accumulation goes on (phase_begin) */
    double paced_s;         /* CPU limit: seconds waited since the last micro-batch */
    /* the accumulation in progress (reset by BEGIN; RESYNC reads it) */
    struct dp_acc {
        struct dp_job *j;
        int64_t acc_step;   /* the round we accumulate for */
        double samples, loss_sum, loss_n, compute_s;
        double sop_sum, sop_n, hits; /* as in dp_job */
        struct collab_progress *seen; /* the peers' progress, ourselves from memory */
        struct peer_info *infos;      /* the same as peer_info (nseen) */
        size_t nseen;
        struct collab_view view;
        int behind, diverged, restart, held, going, open, holding;
        int64_t low;        /* >= 0: most peers accumulate for this earlier step */
        int64_t now;        /* when seen was read (the collaboration's clock) */
        size_t ahead_now, npresent;
        double hold_since, t_pub, lag_since, t_open, po_idle_since, t_prefetch;
    } a;
};

/* accum.c */
enum dp_phase dp_accumulate(struct dp_loop *l);

/* pause.c: pause and resume (docs/collaboration.md, "Pause and resume") */
int dp_pause_wanted(const struct dp_state *s);
enum dp_phase dp_pause(struct dp_loop *l);

/* loop.c */
int dp_finish_inflight(struct dp_loop *l);
int dp_train_loop(struct dp_state *s);
void dp_linger(struct dp_state *s, int64_t step);
void dp_print_line(const struct dp_state *s, long step, double samples, double sps, int pull_only,
                   size_t peers, double loss, double eta);
/* experts.c: a DMoE model's remote experts in the progress line and step log */
void dp_experts_attach(struct dp_state *s);
int dp_experts_line(struct dp_state *s, char *out, size_t cap, int consume);
int dp_experts_json(struct dp_state *s, char *out, size_t cap);
struct peer_report;
/* The expert servers' samples since the previous report into rep->experts
 * (the 64 largest, at most k x samples in all: moe_remote_take_served;
 * docs/accounting.md, "Expert servers"); nothing without remote experts. */
void dp_experts_attest(struct dp_state *s, struct peer_report *rep, double samples);
/* status_note.c: the status file of `crowdtrain-agent status` (agent/status.h),
   from the progress line and at exit */
void dp_status_note(const struct dp_state *s, long step, double samples, double sps, int pull_only,
                    size_t peers, double loss, double eta);
void dp_status_exit(const struct dp_state *s, int exit_status, int signaled);

#endif
