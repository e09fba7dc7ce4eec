/* libFuzzer target for the DHT records of collaborative training (progress
 * and round announcements, round outcomes), which every peer reads from other peers. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "agent/dp/collab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct collab_progress p;
    struct collab_announce a;
    char rec[COLLAB_RECORD_MAX];
    if (collab_progress_parse(data, size, &p) == 0) {
        if (p.step < 0 || p.samples < 0 || strlen(p.addr) >= COLLAB_ADDR_MAX)
            __builtin_trap();
        /* what parses re-encodes and parses to the same values */
        struct collab_progress q;
        if (collab_progress_encode(&p, rec, sizeof rec) != 0 ||
            collab_progress_parse(rec, strlen(rec), &q) != 0 || q.step != p.step)
            __builtin_trap();
    }
    if (collab_announce_parse(data, size, &a) == 0) {
        if ((a.agg && !a.addr[0]) || (a.pull_only && (a.sends || a.weight != 0)) || a.on < 0)
            __builtin_trap();
        /* and round-trips with its role */
        struct collab_announce b;
        if (collab_announce_encode(&a, rec, sizeof rec) != 0 ||
            collab_announce_parse(rec, strlen(rec), &b) != 0 || b.pull_only != a.pull_only ||
            b.sends != a.sends || b.on != a.on)
            __builtin_trap();
    }
    struct collab_outcome o, o2;
    if (collab_outcome_parse(data, size, &o) == 0 &&
        (collab_outcome_encode(&o, rec, sizeof rec) != 0 ||
         collab_outcome_parse(rec, strlen(rec), &o2) != 0 || o2.mask != o.mask ||
         memcmp(o2.rid, o.rid, sizeof o.rid) != 0))
        __builtin_trap();
    return 0;
}
