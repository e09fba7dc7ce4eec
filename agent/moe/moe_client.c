/* Expert calls from a trainer (moe_client.h): build the message, send it
 * with the transport's deadline, check the answer's shape and values
 * before the caller sees them. */
#include "agent/moe/moe_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

struct call {
    uint32_t n, c;
    moe_client_cb cb;
    moe_client_info_cb icb;
    void *arg;
};

static void on_result(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                      size_t len)
{
    struct call *k = arg;
    (void)from;
    float *out = NULL;
    struct moe_result r;
    if (status == CM_OK)
        status = moe_result_parse(body, len, &r);
    if (status == CM_OK && (r.n != k->n || r.c != k->c))
        status = CM_EPROTO;
    if (status == CM_OK && !(out = malloc((size_t)r.n * r.c * sizeof(float))))
        status = CM_ENOMEM;
    if (status == CM_OK)
        moe_values_get(out, r.values, (size_t)r.n * r.c);
    k->cb(k->arg, status, status == CM_OK ? out : NULL, k->n, k->c);
    free(out);
    free(k);
}

static int call(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *pub, uint32_t type,
                const char *uid, uint64_t fid, const float *v, uint32_t n, uint32_t c,
                uint32_t timeout_ms, moe_client_cb cb, void *arg)
{
    if (!h || !addr || !pub || !uid || !cb)
        return CM_EINVAL;
    struct moe_call m = {.forward_id = fid, .n = n, .c = c, .values = (const uint8_t *)v};
    if (strnlen(uid, MOE_UID_MAX + 1) > MOE_UID_MAX)
        return CM_EINVAL;
    snprintf(m.uid, sizeof m.uid, "%s", uid);
    uint8_t *body;
    size_t blen;
    int rc = moe_call_build(&m, &body, &blen);
    if (rc)
        return rc == CM_ERANGE ? CM_EINVAL : rc;
    struct call *k = calloc(1, sizeof *k);
    if (!k) {
        free(body);
        return CM_ENOMEM;
    }
    *k = (struct call){.n = n, .c = c, .cb = cb, .arg = arg};
    rc = p2p_request(h, addr, pub, type, body, blen, timeout_ms, on_result, k);
    free(body);
    if (rc)
        free(k);
    return rc;
}

int moe_client_forward(struct p2p_host *h, const struct sockaddr *addr,
                       const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                       const float *x, uint32_t n, uint32_t c, uint32_t timeout_ms,
                       moe_client_cb cb, void *arg)
{
    return call(h, addr, pub, MOE_MSG_FORWARD, uid, fid, x, n, c, timeout_ms, cb, arg);
}

int moe_client_backward(struct p2p_host *h, const struct sockaddr *addr,
                        const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                        const float *dy, uint32_t n, uint32_t c, uint32_t timeout_ms,
                        moe_client_cb cb, void *arg)
{
    return call(h, addr, pub, MOE_MSG_BACKWARD, uid, fid, dy, n, c, timeout_ms, cb, arg);
}

static void on_info(void *arg, int status, const struct p2p_peer *from, const uint8_t *body,
                    size_t len)
{
    struct call *k = arg;
    (void)from;
    struct moe_info *in = NULL;
    if (status == CM_OK && !(in = malloc(sizeof *in)))
        status = CM_ENOMEM;
    if (status == CM_OK)
        status = moe_info_parse(body, len, in);
    k->icb(k->arg, status, status == CM_OK ? in : NULL);
    free(in);
    free(k);
}

int moe_client_info(struct p2p_host *h, const struct sockaddr *addr,
                    const uint8_t pub[CM_ED25519_PUB_LEN], uint32_t timeout_ms,
                    moe_client_info_cb cb, void *arg)
{
    if (!h || !addr || !pub || !cb)
        return CM_EINVAL;
    struct call *k = calloc(1, sizeof *k);
    if (!k)
        return CM_ENOMEM;
    k->icb = cb;
    k->arg = arg;
    int rc = p2p_request(h, addr, pub, MOE_MSG_INFO, NULL, 0, timeout_ms, on_info, k);
    if (rc)
        free(k);
    return rc;
}

/* ---- blocking ----------------------------------------------------------- */

struct waiter {
    int done, status;
    float *out;
    struct moe_info *info;
};

static void sync_cb(void *arg, int status, const float *out, uint32_t n, uint32_t c)
{
    struct waiter *w = arg;
    w->done = 1;
    w->status = status;
    if (status == CM_OK)
        memcpy(w->out, out, (size_t)n * c * sizeof(float));
}

static void sync_info_cb(void *arg, int status, const struct moe_info *info)
{
    struct waiter *w = arg;
    w->done = 1;
    w->status = status;
    if (status == CM_OK)
        *w->info = *info;
}

/* The transport completes every request by its deadline, so this ends. */
static int wait_done(struct p2p_host *h, struct waiter *w)
{
    uv_loop_t *loop = p2p_ctx_loop(p2p_host_ctx(h));
    while (!w->done)
        uv_run(loop, UV_RUN_ONCE);
    return w->status;
}

int moe_client_forward_sync(struct p2p_host *h, const struct sockaddr *addr,
                            const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                            const float *x, uint32_t n, uint32_t c, uint32_t timeout_ms,
                            float *out)
{
    struct waiter w = {.out = out};
    if (!out)
        return CM_EINVAL;
    int rc = moe_client_forward(h, addr, pub, uid, fid, x, n, c, timeout_ms, sync_cb, &w);
    return rc ? rc : wait_done(h, &w);
}

int moe_client_backward_sync(struct p2p_host *h, const struct sockaddr *addr,
                             const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                             const float *dy, uint32_t n, uint32_t c, uint32_t timeout_ms,
                             float *out)
{
    struct waiter w = {.out = out};
    if (!out)
        return CM_EINVAL;
    int rc = moe_client_backward(h, addr, pub, uid, fid, dy, n, c, timeout_ms, sync_cb, &w);
    return rc ? rc : wait_done(h, &w);
}

int moe_client_info_sync(struct p2p_host *h, const struct sockaddr *addr,
                         const uint8_t pub[CM_ED25519_PUB_LEN], uint32_t timeout_ms,
                         struct moe_info *out)
{
    struct waiter w = {.info = out};
    if (!out)
        return CM_EINVAL;
    int rc = moe_client_info(h, addr, pub, timeout_ms, sync_info_cb, &w);
    return rc ? rc : wait_done(h, &w);
}
