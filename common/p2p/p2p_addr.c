/* Socket addresses for the transport: parsing "host:port" / "[v6]:port"
 * (numeric or resolved), formatting for logs, and the small comparisons the
 * connection cache needs (p2p_internal.h). */
#include "p2p/p2p_internal.h"
#include "p2p/p2p_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"
#include "cm_resolve.h"

int p2p_addr_parse(const char *s, struct sockaddr_storage *out)
{
    char host[256];
    const char *colon, *hs = s;
    size_t hl;
    if (!s)
        return CM_EINVAL;
    if (*s == '[') {
        const char *e = strchr(s, ']');
        if (!e || e[1] != ':')
            return CM_EINVAL;
        hs = s + 1;
        hl = (size_t)(e - hs);
        colon = e + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon)
            return CM_EINVAL;
        hl = (size_t)(colon - s);
    }
    if (hl == 0 || hl >= sizeof host)
        return CM_EINVAL;
    memcpy(host, hs, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535 || colon[1] == 0)
        return CM_EINVAL;
    memset(out, 0, sizeof *out);
    struct sockaddr_in *a4 = (struct sockaddr_in *)out;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)out;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        return CM_OK;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        return CM_OK;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = cm_resolve(host, NULL, &hints, P2P_RESOLVE_MS, &res);
    if (rc != CM_OK)
        return rc;
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (out->ss_family == AF_INET)
        a4->sin_port = htons((uint16_t)port);
    else
        a6->sin6_port = htons((uint16_t)port);
    return CM_OK;
}

void p2p_addr_format(const struct sockaddr *a, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (a->sa_family == AF_INET) {
        const struct sockaddr_in *a4 = (const struct sockaddr_in *)a;
        inet_ntop(AF_INET, &a4->sin_addr, ip, sizeof ip);
        snprintf(out, cap, "%s:%u", ip, ntohs(a4->sin_port));
    } else if (a->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)a;
        inet_ntop(AF_INET6, &a6->sin6_addr, ip, sizeof ip);
        snprintf(out, cap, "[%s]:%u", ip, ntohs(a6->sin6_port));
    } else {
        snprintf(out, cap, "?");
    }
}

int p2p__addr_equal(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return 0;
    if (b->sa_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (b->sa_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, 16);
    }
    return 0;
}

socklen_t p2p__addr_len(const struct sockaddr *a)
{
    return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

void p2p__addr_set_port(struct sockaddr_storage *a, uint16_t port)
{
    if (a->ss_family == AF_INET)
        ((struct sockaddr_in *)a)->sin_port = htons(port);
    else if (a->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)a)->sin6_port = htons(port);
}

/* ---- emulated latency toward networks (p2p_transport.h) ---------------- */

static int rule_parse(const char *s, size_t len, struct p2p_latency_rule *r, char *err, size_t errcap)
{
    char buf[80];
    if (len == 0 || len >= sizeof buf) {
        snprintf(err, errcap, "a rule is NETWORK/BITS=MS (e.g. 10.77.0.0/25=40)");
        return CM_EINVAL;
    }
    memcpy(buf, s, len);
    buf[len] = 0;
    char *eq = strchr(buf, '=');
    if (!eq) {
        snprintf(err, errcap, "'%s': NETWORK/BITS=MS (e.g. 10.77.0.0/25=40)", buf);
        return CM_EINVAL;
    }
    *eq = 0;
    char *end;
    long ms = strtol(eq + 1, &end, 10);
    if (eq[1] == 0 || *end || ms < 0 || ms > 10000) {
        snprintf(err, errcap, "'%s': the delay is whole milliseconds from 0 to 10000", eq + 1);
        return CM_EINVAL;
    }
    char *slash = strchr(buf, '/');
    long bits = -1;
    if (slash) {
        *slash = 0;
        bits = strtol(slash + 1, &end, 10);
        if (slash[1] == 0 || *end || bits < 0) {
            snprintf(err, errcap, "'%s': the prefix length is a number", slash + 1);
            return CM_EINVAL;
        }
    }
    memset(r, 0, sizeof *r);
    if (inet_pton(AF_INET, buf, r->net) == 1)
        r->family = AF_INET;
    else if (inet_pton(AF_INET6, buf, r->net) == 1)
        r->family = AF_INET6;
    else {
        snprintf(err, errcap, "'%s': not an IPv4 or IPv6 address", buf);
        return CM_EINVAL;
    }
    long max = r->family == AF_INET ? 32 : 128;
    if (bits > max) {
        snprintf(err, errcap, "'/%ld': at most /%ld for %s", bits, max, buf);
        return CM_EINVAL;
    }
    r->bits = (uint8_t)(bits < 0 ? max : bits);
    r->ms = (uint32_t)ms;
    return CM_OK;
}

int p2p_latency_rules_parse(const char *s, struct p2p_latency_rule *out, size_t cap, size_t *n, char *err,
                            size_t errcap)
{
    *n = 0;
    if (!s || !*s) {
        snprintf(err, errcap, "no rule");
        return CM_EINVAL;
    }
    for (const char *p = s;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (*n == cap) {
            snprintf(err, errcap, "at most %zu rules", cap);
            return CM_EINVAL;
        }
        if (rule_parse(p, len, &out[*n], err, errcap) != CM_OK)
            return CM_EINVAL;
        (*n)++;
        if (!comma)
            return CM_OK;
        p = comma + 1;
    }
}

static int prefix_match(const uint8_t *a, const uint8_t *net, unsigned bits)
{
    unsigned whole = bits / 8, rest = bits % 8;
    if (memcmp(a, net, whole))
        return 0;
    if (!rest)
        return 1;
    uint8_t mask = (uint8_t)(0xffu << (8 - rest));
    return (a[whole] & mask) == (net[whole] & mask);
}

long p2p_latency_rules_match(const struct p2p_latency_rule *r, size_t n, const struct sockaddr *addr)
{
    static const uint8_t MAPPED[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    const uint8_t *v4 = NULL, *v6 = NULL;
    if (addr->sa_family == AF_INET) {
        v4 = (const uint8_t *)&((const struct sockaddr_in *)(const void *)addr)->sin_addr;
    } else if (addr->sa_family == AF_INET6) {
        v6 = (const uint8_t *)&((const struct sockaddr_in6 *)(const void *)addr)->sin6_addr;
        if (!memcmp(v6, MAPPED, sizeof MAPPED))
            v4 = v6 + 12;
    }
    for (size_t i = 0; i < n; i++) {
        if (r[i].family == AF_INET && v4 && prefix_match(v4, r[i].net, r[i].bits))
            return r[i].ms;
        if (r[i].family == AF_INET6 && v6 && prefix_match(v6, r[i].net, r[i].bits))
            return r[i].ms;
    }
    return -1;
}
