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
    if (getaddrinfo(host, NULL, &hints, &res) || !res)
        return CM_ENOTFOUND;
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

