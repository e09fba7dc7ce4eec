/* Signed pass requests for bench_coordinator.sh: wrk cannot sign, and a
 * signed request is accepted once (docs/protocol.md, "Pass requests"), so
 * the benchmark replays a file of distinct requests made here beforehand.
 *
 *     bench_passreq RUN USER N  >  one JSON body per line, N lines
 *
 * All N are for one fresh key, timed now (the coordinator accepts them for
 * 300 s), each with its own nonce. The key's private part is not kept. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_passreq.h"

int main(int argc, char **argv)
{
    long n = argc == 4 ? strtol(argv[3], NULL, 10) : 0;
    if (n <= 0 || n > 10000000) {
        fprintf(stderr, "usage: bench_passreq RUN USER N (1..10000000)\n");
        return 2;
    }
    struct cm_ed25519 key;
    if (cm_ed25519_generate(&key) != CM_OK)
        return 1;
    int64_t now = (int64_t)time(NULL);
    for (long i = 0; i < n; i++) {
        struct cm_passreq r;
        if (cm_passreq_sign(&key, argv[1], argv[2], now, &r) != CM_OK) {
            fprintf(stderr, "bench_passreq: cannot sign for run '%s', user '%s'\n", argv[1], argv[2]);
            return 1;
        }
        json_t *j = cm_passreq_to_json(&r);
        if (!j || json_dumpf(j, stdout, JSON_COMPACT) != 0)
            return 1;
        json_decref(j);
        putchar('\n');
    }
    cm_ed25519_cleanup(&key);
    return fflush(stdout) == 0 ? 0 : 1;
}
