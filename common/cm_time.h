/* Absolute times for timed waits (pthread_cond_timedwait and friends). */
#ifndef CM_TIME_H
#define CM_TIME_H

#include <stdint.h>
#include <time.h>

/* Now on clock clk (the clock the condition variable waits on) plus ms
 * milliseconds (ms >= 0). */
static inline struct timespec cm_time_after_ms(clockid_t clk, int64_t ms)
{
    struct timespec t;
    clock_gettime(clk, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

#endif
