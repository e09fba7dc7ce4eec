/* Pause and resume without leaving the run (docs/collaboration.md, "Pause
 * and resume"): a volunteer who wants the machine back for a while sends
 * SIGUSR1 (`crowdtrain-agent pause`), and SIGUSR2 (`crowdtrain-agent
 * resume`) to go on. join.c turns the signals into s->pause_req; the loop
 * (loop.c, accum.c) comes here at its next phase boundary: after the
 * micro-batch in progress, or after the round it is in (a round the others
 * wait for is never left half done: its end is our step too).
 *
 * Paused, the agent leaves the collaboration's counting at once (a
 * progress record as an auxiliary peer with nothing done: records.c), as a
 * departure would after its records went stale, but without the wait for
 * that; computes and averages nothing, stops its probe thread, keeps its
 * access pass renewed and its DHT node up, and says "paused" on its
 * console and in its status file. Resumed, it looks at the collaboration
 * before computing anything: behind it (it went on without us), the loop
 * takes a peer's state after the collaboration's next step, as any peer
 * behind does (loop.c, phase_resync), and joins the rounds from there. */
#include "agent/dp/dp.h"

#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "cm_err.h"

int dp_pause_wanted(const struct dp_state *s)
{
    return s->pause_req && *s->pause_req && !dp_interrupted(s);
}

/* What the status file and the console say while paused. */
static void paused_line(const struct dp_state *s, int64_t step, size_t peers)
{
    dp_status_note(s, (long)step, NAN, 0, 0, peers, NAN, NAN);
    if (s->progress_live) {
        printf("\rstep %6lld | paused (crowdtrain-agent resume, or SIGUSR2 to pid %ld, resumes)   ",
               (long long)step, (long)getpid());
        fflush(stdout);
    }
}

enum dp_phase dp_pause(struct dp_loop *l)
{
    struct dp_state *s = l->s;
    /* The round in flight (delayed updates) has our gradient and the
       others count on it: finish it first. Its step is ours too. */
    if (l->inflight && (l->rc = dp_finish_inflight(l)) != CM_OK)
        return DP_STOP;
    if (!dp_pause_wanted(s))
        return DP_BEGIN; /* resumed meanwhile (or Ctrl-C: BEGIN ends the loop) */
    double t0 = peer_mono_s();
    size_t peers = l->a.view.peers;
    s->paused = 1;
    int64_t acc = l->step > l->join_step ? l->step : l->join_step;
    dp_publish_progress(s, acc, 0, 0, 0);
    int probes = s->rt.stage >= PEER_STAGE_PROBES;
    if (probes)
        peer_rt_stop_to(&s->rt, PEER_STAGE_REPORTS); /* no measuring traffic while paused */
    printf("\npaused at step %lld: computing and averaging nothing, the pass kept renewed "
           "(crowdtrain-agent resume, or SIGUSR2 to pid %ld, resumes)\n",
           (long long)l->step, (long)getpid());
    fflush(stdout);
    /* Our paused record is not renewed: it lives 60 s in the DHT, and then
       the run's peers no longer list us at all. */
    while (dp_pause_wanted(s)) {
        peer_rt_renew_pass_if_due(&s->rt);
        /* a peer that asked for our state before we paused still gets it */
        peer_rt_serve_state(&s->rt, l->step);
        paused_line(s, l->step, peers);
        fflush(stdout); /* what the renewal said, for a service's log */
        usleep(100000);
    }
    s->paused = 0;
    if (dp_interrupted(s))
        return DP_END;
    printf("\nresumed at step %lld after %.0f s paused: catching up with the collaboration\n",
           (long long)l->step, peer_mono_s() - t0);
    fflush(stdout);
    if (probes && peer_rt_start(&s->rt, PEER_STAGE_PROBES) != CM_OK)
        fprintf(stderr, "warning: the probe thread did not restart; the schedules get no new "
                        "measurements from us\n");
    agent_cpu_limit_restart(&s->cpu);
    l->resumed = 1;
    return DP_BEGIN;
}
