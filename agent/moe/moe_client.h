/* The trainer's side of expert calls (Learning@home, seed
 * 002_2b00836ea4b30f79.txt §3.3: a trainer sends its batch to each chosen
 * expert's server, and later the gradients of the outputs): FORWARD,
 * BACKWARD and INFO requests (common/moe/moe_msg.h) over a p2p host, each
 * with a deadline, asynchronous with callbacks on the host's loop, plus
 * blocking versions for a caller that runs that loop itself.
 *
 * The answer is checked before the callback sees it: CM_EPARSE (not a
 * result), CM_EPROTO (a result of another shape than the request's),
 * CM_ENUMERIC (NaN or infinity in it), CM_EUNSUPPORTED (another encoding).
 * Otherwise the status is the server's (moe_server.h lists them) or the
 * transport's (CM_ETIMEOUT past the deadline, CM_ECONN, CM_ECLOSED,
 * CM_EAUTH...). Every call completes exactly once, never from inside the
 * call that started it, at the latest at its deadline. */
#ifndef AGENT_MOE_CLIENT_H
#define AGENT_MOE_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "moe/moe_msg.h"
#include "p2p/p2p_transport.h"

/* out: (n,c) values, borrowed for the call (NULL on error). */
typedef void (*moe_client_cb)(void *arg, int status, const float *out, uint32_t n, uint32_t c);
/* info: borrowed for the call (NULL on error). */
typedef void (*moe_client_info_cb)(void *arg, int status, const struct moe_info *info);

/* Sends x (n,c) to expert uid at addr (the server's key is pub) as forward
 * fid. Local errors (CM_EINVAL bad uid or shape, CM_ENUMERIC non-finite
 * input, CM_ENOMEM, the transport's) return at once and no callback runs. */
int moe_client_forward(struct p2p_host *h, const struct sockaddr *addr,
                       const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                       const float *x, uint32_t n, uint32_t c, uint32_t timeout_ms,
                       moe_client_cb cb, void *arg);
/* Sends dy = dL/dy (n,c) of forward fid; the answer is dL/dx (n,c). */
int moe_client_backward(struct p2p_host *h, const struct sockaddr *addr,
                        const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                        const float *dy, uint32_t n, uint32_t c, uint32_t timeout_ms,
                        moe_client_cb cb, void *arg);
int moe_client_info(struct p2p_host *h, const struct sockaddr *addr,
                    const uint8_t pub[CM_ED25519_PUB_LEN], uint32_t timeout_ms,
                    moe_client_info_cb cb, void *arg);

/* Blocking versions: run the host's loop (uv_run, UV_RUN_ONCE) until the
 * answer, so call them from the thread that runs that loop and outside
 * any of its callbacks. out (n*c floats) receives the answer. */
int moe_client_forward_sync(struct p2p_host *h, const struct sockaddr *addr,
                            const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                            const float *x, uint32_t n, uint32_t c, uint32_t timeout_ms,
                            float *out);
int moe_client_backward_sync(struct p2p_host *h, const struct sockaddr *addr,
                             const uint8_t pub[CM_ED25519_PUB_LEN], const char *uid, uint64_t fid,
                             const float *dy, uint32_t n, uint32_t c, uint32_t timeout_ms,
                             float *out);
int moe_client_info_sync(struct p2p_host *h, const struct sockaddr *addr,
                         const uint8_t pub[CM_ED25519_PUB_LEN], uint32_t timeout_ms,
                         struct moe_info *out);

#endif
