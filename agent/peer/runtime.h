/* The peer runtime: what every role of a volunteer's agent needs once it
 * has joined a run (DESIGN.md "Agent layout"; docs/architecture.md "The
 * agent"). A role (agent/dp/ today; agent/moe/ and agent/pipe/ next)
 * includes this header and nothing else of agent/peer/ except the services
 * it uses (peer/net.h for DHT records and rounds, peer/report.h for the
 * report type).
 *
 * The runtime owns, one owner each:
 *   session    state directory, session, peer key, coordinator client
 *   pass       the access pass (token, coordinator keys, DHT bootstrap),
 *              renewed when a third of its lifetime is left
 *   clock      the coordinator's clock (the collaboration's times)
 *   net        the p2p node: transport with the volunteer's caps, DHT,
 *              averaging engine, state host (peer/net.h; its own thread)
 *   reports    the contribution reporter (peer/report.h; its own thread)
 *   probes     pairwise throughput and capability reports (peer/caps.h;
 *              its own thread)
 *   state sync catch-up from the coordinator's newest checkpoint or from a
 *              peer, and serving our own state to peers that ask
 *
 * Stages start in that fixed order and stop in the reverse one.
 * peer_rt_start(rt, upto) starts every stage up to `upto` that is not
 * running yet, so a role can start a few stages, do its own set-up (read
 * the run, build its model, catch up) and start the rest; peer_rt_stop()
 * stops whatever runs, in any state, and may be called again. Ctrl-C
 * (cfg.interrupted) is checked before each stage and in the stages' waits
 * (the coordinator's requests are abandoned, the pass's wait for a DHT
 * backbone stops; the DHT bootstrap of the net stage runs its 3 s): start
 * then returns CM_ECANCELED with the earlier stages running. cfg.run must
 * be a valid run name (cm_name_valid).
 *
 * The role gives the runtime what only it knows through struct peer_role:
 * how to save and load its state, which step that state is at, and which
 * peers of the run it sees. Threads: the role's calls into the runtime
 * come from one thread (the role's main thread) unless a function says
 * otherwise; the runtime calls the role's callbacks from that thread too,
 * except `peers`, which the probe thread calls (it must be thread-safe). */
#ifndef AGENT_PEER_RUNTIME_H
#define AGENT_PEER_RUNTIME_H

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/client.h"
#include "agent/peer/caps.h"
#include "agent/peer/net.h"
#include "agent/peer/reach.h"
#include "agent/peer/report.h"
#include "cm_crypto.h"
#include "p2p/p2p_transport.h"

#define PEER_ADDR_MAX 64
#define PEER_HASH_HEX 16 /* hex digits of a published parameter hash (64 bits) */
#define PEER_MAX_BOOTSTRAP 16

enum peer_stage {
    PEER_STAGE_NONE = 0,
    PEER_STAGE_SESSION, /* state dir, session, peer key, coordinator client */
    PEER_STAGE_PASS,    /* access pass (waits up to 20 s for the run's DHT backbone) */
    PEER_STAGE_CLOCK,   /* the coordinator's clock offset */
    PEER_STAGE_NET,     /* the p2p node and our advertised addresses */
    PEER_STAGE_REPORTS, /* contribution reporter (a failure here is a warning, not fatal) */
    PEER_STAGE_PROBES,  /* probe thread (only with cfg.probes): the link, then pairs */
    PEER_STAGE_ALL = PEER_STAGE_PROBES
};
const char *peer_stage_name(enum peer_stage st);

struct peer_rt_config {
    const char *run;          /* required; borrowed, outlives the runtime */
    const char *coordinator;  /* NULL: the one of the session */
    const char *config_dir;   /* NULL: agent_state_dir's default */
    const char *listen_ip;    /* NULL: "0.0.0.0" */
    const char *advertise_ip; /* NULL: discovered (reach.h): the address the coordinator
                                 sees us at when it reaches us there */
    int client_mode;          /* accept no inbound connections; set by the net stage when
                                 the dial-back finds us unreachable */
    int must_accept;          /* the role cannot work in client mode: unreachable is an error */
    int no_relay;             /* neither lend relay ports (reachable) nor use a relay
                                 (unreachable): --no-relay */
    uint16_t dht_port, ar_port;                /* 0: any */
    double max_upload_mbps, max_download_mbps; /* 0: no cap */
    double pace;              /* (0, 1]: without caps, cap our traffic at this fraction of the
                                 link measured at the net stage (its caps from then on); 0: off */
    int probes;               /* measure pairwise throughput (PEER_STAGE_PROBES); a role may
                                 clear it before that stage starts */
    int64_t test_skew_ms;     /* a wrong clock, for tests of the clock correction */
    double caps_every_s;      /* a capability report at least this often (0: every 60 s); a
                                 pipeline run's reports expire sooner (pipeline.liveness_s) */
    uint32_t latency_ms;      /* emulated one-way delay of every frame sent (tests; 0: none) */
    const struct p2p_latency_rule *latency_rules; /* or toward some networks (borrowed) */
    size_t n_latency_rules;
    const volatile sig_atomic_t *interrupted; /* Ctrl-C count, may be NULL */
    /* Called before each stage starts (progress, tests); may be NULL. */
    void (*on_stage)(void *arg, enum peer_stage st);
    void *on_stage_arg;
    /* The role's own message types on the state host (peer/net.h,
       peer_net_config.on_other: the expert server's, docs/experts.md); runs
       on the net's loop thread; NULL: such requests are refused. */
    p2p_request_cb on_other;
    void *on_other_arg;
};

/* A peer of the run as a role sees it (for state sync and probes). */
struct peer_info {
    uint8_t pub[CM_ED25519_PUB_LEN];
    char st[PEER_ADDR_MAX];        /* its state host "ip:port", "" = none */
    int64_t step;                  /* the step it works toward */
    int64_t pstep;                 /* the step of the parameters it holds */
    char hash[PEER_HASH_HEX + 1];  /* hash of those parameters, "" = unknown */
    int64_t t_ms;                  /* when it said so (coordinator's clock) */
    int aux;                       /* computes nothing (holds no state to compare) */
};

struct peer_role {
    const char *name;
    void *ctx;
    /* Writes the role's state to peer_rt_state_path() (a checkpoint file).
       NULL: the role has no state to serve. */
    int (*save_state)(void *ctx, char *err, size_t cap);
    /* Loads peer_rt_state_path(); *step gets its step. */
    int (*load_state)(void *ctx, int64_t *step, char *err, size_t cap);
    /* The step of the state it could serve now, -1 when none. */
    int64_t (*state_step)(void *ctx);
    /* The run's peers as last seen (*out heap, freed by the caller).
       Called from the probe thread too. */
    int (*peers)(void *ctx, struct peer_info **out, size_t *n);
    /* Called while a peer's state comes to us (before each chunk's request,
       once the peer had it ready), so that the role can tell the others it
       is still about: a transfer takes as long as the serving peer's upload
       needs (2.8 MB from a 2 Mbit/s peer: 12 s). Not while the peer has yet
       to make that state (the step after its current one): it may be the
       one compute peer left, which steps only when nobody else is about.
       NULL: nothing. */
    void (*fetching)(void *ctx);
};

/* Readings kept per probed pair (see caps.c). */
#define PEER_PROBE_KEEP 3

struct peer_rt {
    struct peer_rt_config cfg;
    struct peer_role role;
    enum peer_stage stage; /* the highest stage running */
    /* session */
    char dir[4096], rundir[4300], state_path[4400];
    json_t *session;
    struct agent_client coord;
    struct cm_ed25519 key;
    int key_loaded;
    /* pass */
    json_t *pass;
    const char *token; /* into pass */
    uint8_t coord_keys[P2P_MAX_COORD_KEYS][CM_ED25519_PUB_LEN];
    size_t n_coord_keys;
    const char *bootstrap[PEER_MAX_BOOTSTRAP]; /* into pass */
    size_t n_bootstrap;
    /* clock: the coordinator's minus ours (atomic) */
    int64_t clock_offset_ms;
    /* net */
    struct peer_net *net;
    /* our addresses, "" in client mode; they change at run time when a
       relay comes or goes (read them with peer_rt_addrs) */
    pthread_mutex_t addr_mu;
    char my_addr[PEER_ADDR_MAX], st_addr[PEER_ADDR_MAX];
    char relay[PEER_ADDR_MAX];              /* relayed: the relay's state host, else "" */
    uint8_t relay_pub[CM_ED25519_PUB_LEN];
    /* the relay keeper (relay_keep.c) */
    pthread_t relay_th;
    pthread_mutex_t relay_mu;
    pthread_cond_t relay_cv;
    int relay_started, relay_stop, relay_offer;
    int flag_client_mode;    /* cfg.client_mode as the role gave it (--client-mode) */
    enum peer_reach reach;   /* how peers reach us (reach.h) */
    char observed_ip[64];    /* our address as the coordinator sees it ("" unknown) */
    double reach_ms;         /* from the net stage's start until reachability was known */
    int averaging; /* > 0 while a round or state transfer uses the link (atomic) */
    /* reports */
    struct peer_reporter *rep;
    /* probes and capability reports (caps.c) */
    pthread_t probe_th;
    int probe_started, probe_stop, probe_new;
    pthread_mutex_t probe_mu;
    pthread_cond_t probe_cv;
    struct peer_caps probe_caps; /* the probe thread's latest measurement (pairs) */
    double link_up, link_down;   /* the link's measured rates, Mbit/s (0: not yet) */
    struct peer_pair_hist {
        uint8_t pub[CM_ED25519_PUB_LEN];
        double mbps[PEER_PROBE_KEEP]; /* newest first; 0 = none */
    } probe_hist[PEER_CAPS_MAX_PAIRS];
    size_t n_probe_hist;
    struct peer_caps caps; /* last reported */
    int failing_rounds;    /* the role's rounds in a row that averaged nothing (atomic) */
    char failing_why[160]; /* under probe_mu */
    double caps_at;        /* mono of the last report */
    int punched;           /* open connections punches made (peer_net_punched), */
    double punched_at;     /* asked of the net's loop at most every few seconds */
    /* state sync */
    uint64_t syncs; /* states fetched from peers */
};

/* Caller-owned: init copies cfg (its strings are borrowed) and sets the role. */
void peer_rt_init(struct peer_rt *rt, const struct peer_rt_config *cfg, const struct peer_role *role);
int peer_rt_start(struct peer_rt *rt, enum peer_stage upto);
void peer_rt_stop(struct peer_rt *rt);
/* Stops the stages above `keep` (a role that must release its own
   resources between two stages: the probes read the role's records). */
void peer_rt_stop_to(struct peer_rt *rt, enum peer_stage keep);
/* peer_rt_stop, then frees what init set up. */
void peer_rt_cleanup(struct peer_rt *rt);

int peer_rt_interrupted(const struct peer_rt *rt);

/* Our addresses as peers reach them now ("ip:port", copied; either may be
 * NULL): the averaging host and the state host, direct or through a relay.
 * Returns 1 when we accept connections (we may aggregate and serve
 * state), 0 in client mode (both ""). They change when a relay comes or
 * goes. Any thread. */
int peer_rt_addrs(struct peer_rt *rt, char my[PEER_ADDR_MAX], char st[PEER_ADDR_MAX]);
/* The same for the averaging address alone, and in *relayed (may be NULL)
 * whether it is a port lent by a relay, read together. */
int peer_rt_my_addr(struct peer_rt *rt, char my[PEER_ADDR_MAX], int *relayed);

/* Pairs a role measured itself, for the capability reports from the next
 * one on (sent at once when they differ from the last): a role that runs
 * no probe thread (pipeline stages measure round trips only, with mbps 0).
 * Any thread. */
void peer_rt_set_pairs(struct peer_rt *rt, const struct peer_caps *pairs);

/* ---- clock ---- */
/* The collaboration's time in ms (the coordinator's clock). Any thread. */
int64_t peer_rt_now_ms(const struct peer_rt *rt);
/* CLOCK_MONOTONIC in seconds. */
double peer_mono_s(void);

/* ---- pass ---- */
/* 1 when a pass issued at iat, expiring at exp (Unix s) should be renewed at `now`. */
int peer_pass_renew_due(int64_t iat, int64_t exp, int64_t now);
/* Renews the pass now: CM_OK with the new pass and its token handed to the
   reporter and the p2p node (a node that refuses it is a warning), or an
   error with the current pass kept, untouched. */
int peer_rt_renew_pass(struct peer_rt *rt);
/* Renews when due (a third of the lifetime left); failures are warnings. */
void peer_rt_renew_pass_if_due(struct peer_rt *rt);
const char *peer_rt_pass_id(const struct peer_rt *rt);
const char *peer_rt_username(const struct peer_rt *rt);

/* ---- state sync (state.c) ---- */
const char *peer_rt_state_path(const struct peer_rt *rt);
/* Marks the link busy (+1) or free (-1) for the probes. Any thread. */
void peer_rt_link_busy(struct peer_rt *rt, int d);
/* Loads the coordinator's newest checkpoint (only one at min_step or later
   when min_step > 0) with role.load_state. CM_ENOTFOUND: none (worth
   loading). */
int peer_rt_catch_up(struct peer_rt *rt, int64_t min_step, int64_t *step);
/* Fetches a peer's state at step >= min_step and loads it (rules in
   state.c). CM_OK: *step moved, from_addr (PEER_ADDR_MAX) names the peer. */
int peer_rt_sync_from_peer(struct peer_rt *rt, int64_t min_step, int64_t *step, uint32_t wait_ms,
                           char *from_addr);
/* Serves our state of `step` when a peer asked for it and we hold it. */
void peer_rt_serve_state(struct peer_rt *rt, int64_t step);
/* The hash most fresh peers at parameter step `pstep` hold (ties: the
   smallest), among the hashes that fresh compute peers published; "" when
   none did. */
void peer_majority_hash(const struct peer_info *p, size_t n, int64_t pstep, int64_t now,
                        char out[PEER_HASH_HEX + 1]);

/* ---- capabilities (caps.c) ---- */
/* Reports our capabilities (sps: samples/s, 0 for a peer that computes
   nothing) with the probe thread's pairs: every minute, and at once when
   they changed materially or new pairs came in. aux: the role computes
   nothing by choice (then sps 0 is reported too). */
void peer_rt_report_caps(struct peer_rt *rt, double sps, int aux);
/* Measures the link's upload and download against the run's backbone
   (caps.c, docs/schedules.md "Measured links"), trying a busy backbone
   again until deadline_ms; CM_OK with rt->link_up/down set (and printed),
   or why not (a warning). Called by the net stage and the probe thread. */
int peer_rt_measure_link(struct peer_rt *rt, uint32_t deadline_ms);
/* Whether the link is measured at all: not when the volunteer declared
   caps both ways (taken at its word; with one cap only the other direction
   is measured), nor on the coordinator's machine (loopback). */
int peer_rt_link_measurable(const struct peer_rt *rt);
/* The role's rounds keep averaging nothing (rounds in a row, why; 0 when it
   averages again): capability reports carry it (failing_rounds,
   failing_reason) at once and every 15 s while it lasts, so the
   organizer sees a run that is not learning (docs/collaboration.md). */
void peer_rt_set_failing(struct peer_rt *rt, int rounds, const char *why);

#endif
