/* See records.h. */
#include "agent/pipe/records.h"

#include <stdio.h>
#include <string.h>

#include "cm_err.h"
#include "p2p/p2p_transport.h"

int pipe_peers_parse(const uint8_t *v, size_t len, char st[PEER_ADDR_MAX], char ar[PEER_ADDR_MAX])
{
    const uint8_t *sp = v ? memchr(v, ' ', len) : NULL;
    if (!sp)
        return CM_EPARSE;
    size_t a = (size_t)(sp - v), b = len - a - 1;
    if (a == 0 || b == 0 || a >= PEER_ADDR_MAX || b >= PEER_ADDR_MAX)
        return CM_EPARSE;
    memcpy(st, v, a);
    st[a] = 0;
    memcpy(ar, sp + 1, b);
    ar[b] = 0;
    struct sockaddr_storage x;
    if (strlen(st) != a || strlen(ar) != b || p2p_addr_parse(st, &x) != CM_OK || p2p_addr_parse(ar, &x) != CM_OK)
        return CM_EPARSE;
    return CM_OK;
}

int pipe_ready_parse(const uint8_t *v, size_t len, int64_t version, uint32_t S, int64_t *had_version,
                     int *had_stage, int64_t *done)
{
    char in[96], again[96];
    long long hv, dn;
    int hs;
    if (!v || len == 0 || len >= sizeof in)
        return CM_EPARSE;
    memcpy(in, v, len);
    in[len] = 0;
    if (strlen(in) != len || sscanf(in, "%lld %d %lld", &hv, &hs, &dn) != 3)
        return CM_EPARSE;
    /* canonical only: what the writer prints, nothing more or less */
    snprintf(again, sizeof again, "%lld %d %lld", hv, hs, dn);
    if (strcmp(in, again) || hv < 0 || hv >= version || hs < -1 || hs >= (int)S || dn < 0)
        return CM_EPARSE;
    *had_version = hv;
    *had_stage = hs;
    *done = dn;
    return CM_OK;
}
