/* What a running agent is doing, for `crowdtrain-agent status`: the agent
 * writes a small JSON file, status.json, in its state directory whenever
 * its progress line is updated (agent/dp/status_note.c), and `status` reads
 * it, so a volunteer whose agent runs as a service sees the run, step,
 * peers and last error without reading logs, and whether the file is
 * fresh and its writer alive. The file is replaced atomically (a temporary
 * file renamed over it): a reader sees the old or the new one, whole. */
#ifndef AGENT_STATUS_H
#define AGENT_STATUS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define AGENT_STATUS_FILE "status.json"
/* The state directory of the crowdtrain-agent service (its unit's
   --config-dir; packaging/systemd/crowdtrain-agent.service.in). */
#define AGENT_STATUS_SYSTEM_DIR "/var/lib/crowdtrain/agent"
/* A training agent refreshes the file at least this often (each progress
   update, throttled to AGENT_STATUS_MIN_INTERVAL_MS); older is stale. A
   round may wait for its peers up to --round-timeout-ms (60 s). */
#define AGENT_STATUS_STALE_MS 120000
#define AGENT_STATUS_MIN_INTERVAL_MS 1000

/* One snapshot, as the writer knows it. Strings are borrowed. */
struct agent_status {
    const char *run;
    const char *state;      /* "training", "paused" (crowdtrain-agent pause), or at exit
                               "finished", "stopped", "failed" */
    long step, steps;       /* the global step being accumulated (-1: the last written);
                               the run's last */
    double samples, target; /* the collaboration's samples toward this step / needed */
    double samples_per_s;   /* ours */
    size_t peers;
    double loss;            /* NAN: none yet */
    double eta_s;           /* NAN: unknown */
    int pull_only;
    const char *error;      /* the current trouble ("" or NULL: none) */
    int exit_status;        /* with a final state */
};

/* Writes DIR/status.json (mode 0644: the service's volunteer reads it
 * without root; it holds no secret). A write within
 * AGENT_STATUS_MIN_INTERVAL_MS of the last, at the same step and state, is
 * skipped unless force. Remembers the last non-empty error and when it was
 * first seen. Failures are said once on stderr and otherwise ignored:
 * training does not depend on this file. Not thread-safe (the training
 * thread calls it). */
void agent_status_write(const char *dir, const struct agent_status *st, int force);

/* A status file as read back. */
struct agent_status_view {
    char run[128], state[32], last_error[512];
    long step, steps;
    double samples, target, samples_per_s, loss, eta_s; /* loss, eta_s NAN when absent */
    size_t peers;
    int pull_only, exit_status;
    long pid;
    int64_t started_ms, updated_ms, last_error_ms; /* Unix ms; last_error_ms 0: none */
};

/* Parses a status file's bytes (pure). CM_EPARSE when it is not one. */
int agent_status_parse(const char *text, size_t len, struct agent_status_view *out);

/* Liveness of the writer as `status` judges it. */
enum agent_status_alive { AGENT_ALIVE_NO = 0, AGENT_ALIVE_YES = 1, AGENT_ALIVE_UNKNOWN = 2 };
/* Whether pid is a running crowdtrain-agent (its /proc entry names one). */
enum agent_status_alive agent_status_pid_alive(long pid);

/* Prints the human summary of v, read from path at now_ms. Returns 0 when
 * the agent is training or paused with a fresh file, 1 otherwise (stale,
 * not running, finished or failed), for scripts. */
int agent_status_print(FILE *f, const char *path, const struct agent_status_view *v, int64_t now_ms,
                       enum agent_status_alive alive);

/* Reads DIR/status.json into *v (path: the file's name, for messages).
 * 0; 3 when there is none (said on stdout unless quiet_absent); 4 when it
 * cannot be read or parsed (said on stdout). */
int agent_status_read(const char *dir, int quiet_absent, struct agent_status_view *v, char *path,
                      size_t cap);
/* The state directories whose status files `status`, `pause` and `resume`
 * look at: config_dir when given, else the user's own (written into mine,
 * cap bytes) and the service's. Returns how many (dirs[] borrowed). */
size_t agent_status_dirs(const char *config_dir, char *mine, size_t cap, const char *dirs[2]);
/* The wall clock in Unix ms, as the status file's times. */
int64_t agent_status_now_ms(void);

#endif
