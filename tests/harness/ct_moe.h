/* Helpers of the expert (DMoE) integration tests: the dmoe run of
 * examples/fmnist-dmoe.json (a 4 x 4 grid "ffn" of experts of width 128) on
 * the real coordinator, `crowdtrain-agent serve-experts` processes, and a
 * test-side peer runtime that reads the run's DHT and sends FORWARD and
 * BACKWARD requests to the servers.
 *
 *  - ct_moe_setup: PostgreSQL, the coordinator, the organizer and the run.
 *  - ct_moe_start_server: one server, up and parsed from its start-up line.
 *  - ct_moe_client, ct_moe_read_grid: the test's peer and what the DHT's
 *    leaf records say about each uid.
 *  - ct_moe_fwd_*, ct_moe_aim, ct_moe_forward: a request to one expert.
 *
 * The functions that check something fail the running cmocka test (its
 * assert_* and fail_msg), so only call them from a cmocka test; a test
 * that uses them links the agent library (tests/module.mk, INTEG_LIBS_*). */
#ifndef CT_MOE_H
#define CT_MOE_H

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "ct_harness.h"
#include "moe/moe_dht.h"

#define CT_MOE_GRID 4 /* the recipe's grid: CT_MOE_GRID x CT_MOE_GRID */
#define CT_MOE_C 128  /* the recipe's trunk ends at 128: the experts' width */

struct peer_rt;

/* Seconds on the monotonic clock. */
double ct_moe_mono_s(void);
/* Sleeps ms milliseconds. */
void ct_moe_sleep_ms(long ms);

/* Starts PostgreSQL (exits the process with CT_SKIP when it is not
 * installed) and the coordinator, creates the organizer "org" with password
 * pw and logs it in (*org, heap), then creates the run `run` from
 * examples/fmnist-dmoe.json with its model.experts.serve set to serve (the
 * call takes that reference). Run from the repository root. 0, or -1. */
int ct_moe_setup(struct ct_pg *pg, struct ct_coord *c, const char *pw, char **org, const char *run,
                 json_t *serve);

/* What a server's start-up line says: its address and uids. */
struct ct_moe_srv {
    char addr[MOE_ADDR_MAX + 1];
    char uids[16][16];
    int n;
};

/* Starts server number i: `crowdtrain-agent serve-experts --run RUN
 * --config-dir DIR --experts 8 --device cpu --listen-ip 127.0.0.1` and the
 * NULL-terminated extra args, its output in DIR/serve.log (the path into
 * log, logcap bytes). *pid is the server's from its spawn on (for the
 * teardown to kill it), -1 again when it exits during start-up. Waits up to
 * 30 s for its line "serving 8 experts of run 'RUN' at ADDR ...s: UID...",
 * prints it as "server <i>: <line>" and parses it into info (8 uids).
 * Returns the pid; fails the test otherwise. */
pid_t ct_moe_start_server(int i, const char *run, const char *dir, const char *const *extra, char *log,
                          size_t logcap, pid_t *pid, struct ct_moe_srv *info);

/* The test's client: a peer of run with a real pass (state in dir, where
 * `crowdtrain-agent login` ran), started up to its network stage. Heap;
 * ct_moe_client_free stops and frees it. */
struct peer_rt *ct_moe_client(const char *run, const char *dir);
void ct_moe_client_free(struct peer_rt *rt);

/* What the DHT says about each cell a + CT_MOE_GRID b (uid "ffn.a.b"): the
 * address of a server that declares it ("" none) and how many do; and how
 * many entries are not records (tombstones of withdrawn declarations). */
struct ct_moe_view {
    char addr[CT_MOE_GRID * CT_MOE_GRID][MOE_ADDR_MAX + 1];
    int count[CT_MOE_GRID * CT_MOE_GRID];
    int tombstones;
};
/* Reads every leaf key of run's grid g into v; every record there must be
 * a leaf signed by the server it names. */
void ct_moe_read_grid(struct peer_rt *rt, const char *run, const struct moe_grid *g, struct ct_moe_view *v);
/* uid "ffn.a.b" -> its cell a + CT_MOE_GRID b */
int ct_moe_cell(const char *uid);
/* How many cells of v the server at addr declares. */
int ct_moe_servers_in(const struct ct_moe_view *v, const char *addr);

/* A FORWARD (BACKWARD when backward is set: x is then dL/dy) of x (2, C)
 * to expert uid of the server at sa with key pub, sent from the client's
 * host on its loop (through peer_net_call); the answer lands in y (n, c)
 * and status. */
struct ct_moe_fwd {
    struct sockaddr_storage sa;
    uint8_t pub[32];
    const char *uid;
    float x[2 * CT_MOE_C], y[2 * CT_MOE_C];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status, start_rc, backward;
    uint32_t n, c;
};
/* A zeroed request (heap), its lock and condition ready; ct_moe_fwd_free
 * destroys them and frees it. */
struct ct_moe_fwd *ct_moe_fwd_new(void);
void ct_moe_fwd_free(struct ct_moe_fwd *f);
/* Aims f at uid on the server at addr ("host:port"), with the key that the
 * server's leaf record of uid in run's grid g declares. */
void ct_moe_aim(struct peer_rt *rt, const char *run, const struct moe_grid *g, struct ct_moe_fwd *f,
                const char *addr, const char *uid);
/* Sends f and waits for its answer (the client's 5 s deadline bounds it);
 * returns the request's status (CM_OK: f->y, f->n, f->c hold the answer),
 * or the error that kept it from being sent. */
int ct_moe_forward(struct peer_rt *rt, struct ct_moe_fwd *f);

#endif
