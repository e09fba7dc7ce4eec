/* Name resolution with a deadline (see cm_resolve.h). */
#include "cm_resolve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cm_err.h"
#include "cm_time.h"

struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc;
    char host[256], service[16];
    int has_service;
    struct addrinfo hints;
    struct addrinfo *res;
};

static void job_unref(struct job *j)
{
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last)
        return;
    if (j->res)
        freeaddrinfo(j->res);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *lookup(void *arg)
{
    struct job *j = arg;
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(j->host, j->has_service ? j->service : NULL, &j->hints, &res);
    pthread_mutex_lock(&j->mu);
    j->rc = rc == 0 && res ? CM_OK : rc == EAI_MEMORY ? CM_ENOMEM : CM_ENOTFOUND;
    j->res = rc == 0 ? res : NULL;
    j->done = 1;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
    return NULL;
}

int cm_resolve(const char *host, const char *service, const struct addrinfo *hints, uint32_t timeout_ms,
               struct addrinfo **res)
{
    *res = NULL;
    if (!host || strlen(host) >= sizeof ((struct job *)0)->host ||
        (service && strlen(service) >= sizeof ((struct job *)0)->service))
        return CM_EINVAL;
    struct addrinfo h = hints ? *hints : (struct addrinfo){0};
    unsigned char b[16];
    if (inet_pton(AF_INET, host, b) == 1 || inet_pton(AF_INET6, host, b) == 1) {
        h.ai_flags |= AI_NUMERICHOST;
        int rc = getaddrinfo(host, service, &h, res);
        return rc == 0 && *res ? CM_OK : rc == EAI_MEMORY ? CM_ENOMEM : CM_ENOTFOUND;
    }
    struct job *j = calloc(1, sizeof *j);
    if (!j)
        return CM_ENOMEM;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    strcpy(j->host, host);
    if (service) {
        strcpy(j->service, service);
        j->has_service = 1;
    }
    j->hints = h;
    j->hints.ai_canonname = NULL;
    j->hints.ai_addr = NULL;
    j->hints.ai_next = NULL;
    j->refs = 2;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int tr = pthread_create(&th, &at, lookup, j);
    pthread_attr_destroy(&at);
    if (tr != 0) {
        j->refs = 1;
        job_unref(j);
        return CM_ENOMEM;
    }
    struct timespec until = cm_time_after_ms(CLOCK_MONOTONIC, timeout_ms);
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &until) == ETIMEDOUT)
            break;
    int rc = j->done ? j->rc : CM_ETIMEOUT;
    if (j->done && rc == CM_OK) {
        *res = j->res; /* ours now */
        j->res = NULL;
    }
    pthread_mutex_unlock(&j->mu);
    job_unref(j);
    return rc;
}
