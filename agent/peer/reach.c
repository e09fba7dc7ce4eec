/* Address discovery and reachability: see reach.h. */
#include "agent/peer/reach.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "cm_resolve.h"

const char *peer_reach_name(enum peer_reach r)
{
    switch (r) {
    case PEER_REACH_DIRECT: return "direct";
    case PEER_REACH_CLIENT: return "client (not reachable)";
    case PEER_REACH_FLAG_CLIENT: return "client (--client-mode)";
    case PEER_REACH_FLAG_ADDR: return "direct (--advertise-ip, not checked)";
    case PEER_REACH_RELAYED: return "relayed";
    default: return "unknown";
    }
}

int peer_reach_parse(const json_t *j, struct peer_reach_result *out)
{
    memset(out, 0, sizeof *out);
    const char *ip = json_string_value(json_object_get(j, "observed_ip"));
    json_t *reach = json_object_get(j, "reachable"), *ports = json_object_get(j, "ports");
    unsigned char a[16];
    if (!ip || strlen(ip) >= sizeof out->observed_ip ||
        (inet_pton(AF_INET, ip, a) != 1 && inet_pton(AF_INET6, ip, a) != 1) || !json_is_boolean(reach) ||
        !json_is_array(ports) || json_array_size(ports) < 1 || json_array_size(ports) > PEER_REACH_MAX_PORTS)
        return CM_EPARSE;
    snprintf(out->observed_ip, sizeof out->observed_ip, "%s", ip);
    int all = 1;
    for (size_t i = 0; i < json_array_size(ports); i++) {
        json_t *e = json_array_get(ports, i), *p = json_object_get(e, "port"), *ok = json_object_get(e, "reachable");
        json_int_t pv = json_integer_value(p);
        if (!json_is_integer(p) || pv < 1 || pv > 65535 || !json_is_boolean(ok))
            return CM_EPARSE;
        out->port[i] = (uint16_t)pv;
        out->ok[i] = json_is_true(ok);
        all &= out->ok[i];
        const char *err = json_string_value(json_object_get(e, "error"));
        snprintf(out->error[i], sizeof out->error[i], "%s", out->ok[i] ? "" : err ? err : "unreachable");
        out->n = i + 1;
    }
    /* the summary must agree with the ports */
    if (json_is_true(reach) != all)
        return CM_EPARSE;
    out->reachable = all;
    return CM_OK;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int peer_reach_check(const struct agent_client *c, const char *run, const uint8_t pub[CM_ED25519_PUB_LEN],
                     const uint16_t *ports, size_t n, uint32_t deadline_ms,
                     const volatile sig_atomic_t *interrupted, struct peer_reach_result *out)
{
    if (!n || n > PEER_REACH_MAX_PORTS)
        return CM_EINVAL;
    char k64[64], path[160];
    cm_b64url_encode(pub, CM_ED25519_PUB_LEN, k64);
    snprintf(path, sizeof path, "/api/v1/runs/%s/reachability", run);
    double t0 = mono_ms();
    for (;;) {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < n; i++)
            json_array_append_new(arr, json_integer(ports[i]));
        json_t *body = arr ? json_pack("{s:s, s:o}", "peer_public_key", k64, "ports", arr) : NULL;
        if (!body)
            return CM_ENOMEM;
        struct agent_reply r = {0};
        int rc = agent_request(c, "POST", path, body, &r);
        json_decref(body);
        if (rc != CM_OK)
            return rc;
        if (r.status == 200) {
            rc = peer_reach_parse(r.json, out);
            if (rc != CM_OK)
                fprintf(stderr, "warning: the coordinator's reachability answer is malformed\n");
            agent_reply_free(&r);
            return rc;
        }
        int retry = r.status == 503 && mono_ms() - t0 + 1000 < deadline_ms;
        if (!retry)
            agent_reply_report("reachability check", &r);
        rc = r.status == 404 ? CM_ENOTFOUND : r.status == 401 || r.status == 403 ? CM_EAUTH : CM_EPROTO;
        agent_reply_free(&r);
        if (!retry)
            return rc;
        for (int i = 0; i < 10; i++) {
            if (interrupted && *interrupted)
                return CM_ECANCELED;
            sleep_ms(50);
        }
    }
}

int peer_local_addr_towards(const char *url, char *out, size_t cap)
{
    const char *p = url ? strstr(url, "://") : NULL;
    if (!p)
        return CM_EINVAL;
    p += 3;
    char host[256];
    size_t hl = *p == '[' ? strcspn(p + 1, "]") : strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof host)
        return CM_EINVAL;
    memcpy(host, *p == '[' ? p + 1 : p, hl);
    host[hl] = '\0';
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_DGRAM;
    if (cm_resolve(host, "443", &hints, 5000, &ai) != CM_OK)
        return CM_ECONN;
    int rc = CM_ECONN;
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage me;
    socklen_t ml = sizeof me;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&me, &ml) == 0) {
        const void *a = me.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&me)->sin_addr
                                                : (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr;
        if (inet_ntop(me.ss_family, a, out, (socklen_t)cap))
            rc = CM_OK;
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}
