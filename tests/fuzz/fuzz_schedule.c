/* libFuzzer target for sched_schedule_decode, the parser every agent runs
 * on the schedule payload it receives from a coordinator (seed 000, §3.2;
 * docs/protocol.md, "Schedules"). Whatever it accepts must satisfy the
 * decoder's promises and survive an encode/decode round trip. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sched_schedule s;
    char err[256];
    if (sched_schedule_decode((const char *)data, size, &s, err, sizeof err) != 0)
        return 0;
    uint64_t total = 0;
    if (s.n == 0 || s.n > SCHED_MAX_PEERS || !s.peers || s.valid_until <= s.valid_from ||
        s.group_size == 0 || s.group_size > s.n)
        __builtin_trap();
    for (size_t i = 0; i < s.n; i++)
        total += s.peers[i].share;
    if (total != SCHED_SHARE_TOTAL)
        __builtin_trap();
    char *json = NULL;
    size_t len = 0;
    struct sched_schedule again;
    if (sched_schedule_encode(&s, &json, &len) != 0 ||
        sched_schedule_decode(json, len, &again, err, sizeof err) != 0 || again.n != s.n ||
        again.version != s.version || memcmp(again.peers, s.peers, s.n * sizeof *s.peers) != 0)
        __builtin_trap();
    free(json);
    sched_schedule_cleanup(&again);
    sched_schedule_cleanup(&s);
    return 0;
}
