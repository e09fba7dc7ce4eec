/* The data-parallel role's side of `crowdtrain-agent status` (agent/status.h):
 * what the progress line says, plus the run and its trouble, written to the
 * state directory's status file; and the final state when join ends. */
#include <math.h>

#include "agent/dp/dp.h"
#include "agent/status.h"

void dp_status_note(const struct dp_state *s, long step, double samples, double sps, int pull_only,
                    size_t peers, double loss, double eta)
{
    if (!s->rt.dir[0])
        return;
    struct agent_status st = {s->o.run, s->paused ? "paused" : "training", step, s->steps, samples, s->target,
                              pull_only ? NAN : sps, peers, pull_only ? NAN : loss, eta, pull_only,
                              s->failing ? s->failing_why : "", 0};
    agent_status_write(s->rt.dir, &st, 0);
}

void dp_status_exit(const struct dp_state *s, int exit_status, int signaled)
{
    if (!s->rt.dir[0] || !s->o.run)
        return;
    /* the parameters' step; -1 (the last one written) before the trainer exists */
    long step = s->trainer_ready && s->tr.opt ? (long)s->tr.opt->step : -1;
    struct agent_status st = {s->o.run, signaled ? "stopped" : exit_status == 0 ? "finished" : "failed",
                              step, s->steps, NAN, s->target, NAN, 0, NAN, NAN, 0,
                              exit_status == 0 || signaled ? "" : "join ended with an error (see its log: "
                                                                   "journalctl -u crowdtrain-agent)",
                              exit_status};
    agent_status_write(s->rt.dir, &st, 1);
}
