/* `crowdtrain-agent pause` and `crowdtrain-agent resume`: a volunteer takes
 * the machine back for a while without leaving the run (docs/collaboration.md,
 * "Pause and resume"). They find the training agent through the status file
 * it keeps in its state directory (agent/status.h: its pid, and whether it
 * trains or is paused), check that the pid is still a crowdtrain-agent, send
 * it SIGUSR1 (pause) or SIGUSR2 (resume), and wait for the status file to
 * say the agent did it. The agent's side is agent/dp/pause.c. */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/commands.h"
#include "agent/status.h"
#include "cm_err.h"
#include "cm_opts.h"

struct control_cfg {
    char *config_dir;
    long wait_s;
};

static const struct cm_opt CONTROL_OPTS[] = {
    {"config-dir", CM_OPT_STR, offsetof(struct control_cfg, config_dir), NULL, "DIR",
     "the agent's state directory (default: yours, ~/.config/crowdtrain, and the service's, "
     AGENT_STATUS_SYSTEM_DIR ")", 0},
    {"wait", CM_OPT_INT, offsetof(struct control_cfg, wait_s), "30", "S",
     "wait up to S seconds for the agent to say it did (0: do not wait)", 0},
};

static const struct cm_cmd_spec PAUSE = {
    "crowdtrain-agent pause [--config-dir DIR] [--wait S]",
    "Pauses a training agent without leaving its run, to have the machine back\n"
    "for a while: the agent finishes the averaging round it is in (or the\n"
    "micro-batch it computes), leaves the collaboration's counting at once so\n"
    "that no peer waits for it, then computes and averages nothing; it keeps\n"
    "its access pass renewed and says \"paused\" on its console and in\n"
    "'crowdtrain-agent status'. 'crowdtrain-agent resume' goes on. The agent is\n"
    "found by the status file in its state directory; this sends it SIGUSR1\n"
    "(kill -USR1 PID does the same). The service's agent runs as another user:\n"
    "sudo crowdtrain-agent pause.\n"
    "Exit status: 0 the agent got the signal (paused, or pausing after its\n"
    "round when --wait ran out), 1 no running agent found or not allowed to\n"
    "signal it, 3 no status file.",
    CONTROL_OPTS, sizeof CONTROL_OPTS / sizeof CONTROL_OPTS[0], 0};

static const struct cm_cmd_spec RESUME = {
    "crowdtrain-agent resume [--config-dir DIR] [--wait S]",
    "Resumes an agent paused by 'crowdtrain-agent pause': it catches up with the\n"
    "collaboration (a peer's state after the collaboration's next step, as any\n"
    "peer behind) and joins its rounds again. Sends SIGUSR2 (kill -USR2 PID does\n"
    "the same). Exit status as for pause.",
    CONTROL_OPTS, sizeof CONTROL_OPTS / sizeof CONTROL_OPTS[0], 0};

/* Signals the agent whose status file is in dir; 0 done, 1 failed, 3 no file. */
static int control_one(const char *dir, int quiet_absent, int pause, long wait_s)
{
    struct agent_status_view v;
    char path[4200];
    int rc = agent_status_read(dir, quiet_absent, &v, path, sizeof path);
    if (rc == 3)
        return 3;
    if (rc)
        return 1;
    const char *verb = pause ? "pause" : "resume";
    if (strcmp(v.state, "training") && strcmp(v.state, "paused")) {
        printf("%s: the agent is not running (%s, exit status %d): nothing to %s\n", path, v.state,
               v.exit_status, verb);
        return 1;
    }
    if (agent_status_pid_alive(v.pid) != AGENT_ALIVE_YES) {
        printf("%s: pid %ld is not a running crowdtrain-agent (it stopped without a final word): "
               "nothing to %s\n", path, v.pid, verb);
        return 1;
    }
    const char *want = pause ? "paused" : "training";
    int64_t t0 = agent_status_now_ms();
    /* signalled even when the file already says so: a pause asked for a
       moment ago may not show yet, and this resume must still cancel it */
    if (kill((pid_t)v.pid, pause ? SIGUSR1 : SIGUSR2) != 0) {
        printf("%s: cannot signal pid %ld: %s%s\n", path, v.pid, strerror(errno),
               errno == EPERM ? " (the service's agent runs as its own user: sudo crowdtrain-agent "
                                "pause|resume)" : "");
        return 1;
    }
    if (!strcmp(v.state, want) && !pause) {
        printf("the agent (pid %ld) was not paused (training, step %ld)\n", v.pid, v.step);
        return 0;
    }
    /* the agent rewrites its status file when its state changes; a pause
       waits for the round in progress (up to --round-timeout-ms) */
    for (long i = 0; i < wait_s * 10; i++) {
        if (agent_status_read(dir, 1, &v, path, sizeof path) == 0 && !strcmp(v.state, want) &&
            v.updated_ms >= t0) {
            if (pause)
                printf("paused: the agent (pid %ld) is out of the collaboration's rounds at step %ld "
                       "and keeps its place in the run; crowdtrain-agent resume goes on\n", v.pid, v.step);
            else
                printf("resumed: the agent (pid %ld) catches up with the collaboration and trains "
                       "again (from step %ld)\n", v.pid, v.step);
            return 0;
        }
        usleep(100000);
    }
    if (pause)
        printf("asked the agent (pid %ld) to pause: it does once the round or state transfer it is in "
               "ends (crowdtrain-agent status says when)\n", v.pid);
    else
        printf("asked the agent (pid %ld) to resume (crowdtrain-agent status says when it trains)\n", v.pid);
    return 0;
}

static int control(const struct cm_cmd_spec *spec, int pause, int argc, char **argv)
{
    struct control_cfg cfg = {0};
    int rc = cm_opts_parse(spec, &cfg, argc, argv, NULL, NULL, stderr);
    if (rc != CM_OK) {
        cm_opts_free(spec, &cfg);
        return rc == 1 ? 0 : 2;
    }
    if (cfg.wait_s < 0 || cfg.wait_s > 3600) {
        fprintf(stderr, "error: --wait must be from 0 to 3600 seconds\n");
        cm_opts_free(spec, &cfg);
        return 2;
    }
    char mine[4096];
    const char *dirs[2];
    size_t nd = agent_status_dirs(cfg.config_dir, mine, sizeof mine, dirs);
    int status = 3, done = 0;
    for (size_t i = 0; i < nd; i++) {
        int r = control_one(dirs[i], cfg.config_dir == NULL, pause, cfg.wait_s);
        done += r == 0;
        if (r != 3 && status == 3)
            status = r;
    }
    if (done)
        status = 0;
    else if (status == 3 && !cfg.config_dir)
        printf("no agent to %s: neither %s%s%s has a %s (an agent writes it once it trains)\n",
               pause ? "pause" : "resume", nd > 1 ? dirs[0] : "", nd > 1 ? " nor " : "",
               AGENT_STATUS_SYSTEM_DIR, AGENT_STATUS_FILE);
    cm_opts_free(spec, &cfg);
    return status;
}

int agent_cmd_pause(int argc, char **argv)
{
    return control(&PAUSE, 1, argc, argv);
}

int agent_cmd_resume(int argc, char **argv)
{
    return control(&RESUME, 0, argc, argv);
}
