/* Name resolution with a deadline. getaddrinfo(3) waits as long as the
 * system's resolver does (seconds per server, retries), and a coordinator
 * thread or an agent start must not hang on a slow DNS server: the lookup
 * runs on a detached thread and the caller waits at most timeout_ms
 * (a lookup that finishes later is freed by its thread). Numeric hosts
 * resolve at once, without a thread. */
#ifndef CM_RESOLVE_H
#define CM_RESOLVE_H

#include <netdb.h>
#include <stdint.h>

/* As getaddrinfo(host, service, hints, res), within timeout_ms: CM_OK with
 * *res (freeaddrinfo), CM_ENOTFOUND (no such name, or no address),
 * CM_ETIMEOUT, CM_EINVAL (host too long), CM_ENOMEM. */
int cm_resolve(const char *host, const char *service, const struct addrinfo *hints, uint32_t timeout_ms,
               struct addrinfo **res);

#endif
