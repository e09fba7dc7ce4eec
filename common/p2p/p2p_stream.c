/* Streams: a large payload (a tensor, a checkpoint part) sent as a
 * sequence of signed STREAM_CHUNK requests with a window of chunks in
 * flight (see p2p_stream_send in p2p_transport.h). Built on p2p_request
 * only; the receiver's side is the transport's on_chunk callback. */
#include "p2p/p2p.pb-c.h"
#include "p2p/p2p_internal.h"
#include "p2p/p2p_transport.h"

#include <stdlib.h>
#include <string.h>

#include "cm_err.h"

struct stream_send {
    struct p2p_host *h;
    struct sockaddr_storage addr;
    uint8_t pub[32];
    uint64_t id;
    const uint8_t *data;
    size_t len, chunk, next_off;
    unsigned window, inflight;
    uint32_t seq, timeout_ms;
    int status, sent_last;
    p2p_response_cb done;
    void *arg;
};

static void stream_pump(struct stream_send *s);

static void stream_chunk_done(void *arg, int status, const struct p2p_peer *from,
                              const uint8_t *body, size_t len)
{
    struct stream_send *s = arg;
    (void)from, (void)body, (void)len;
    s->inflight--;
    if (status && !s->status)
        s->status = status;
    stream_pump(s);
}

static void stream_pump(struct stream_send *s)
{
    while (!s->status && !s->sent_last && s->inflight < s->window) {
        size_t n = s->len - s->next_off;
        if (n > s->chunk)
            n = s->chunk;
        Ctp2p__StreamChunk ch = CTP2P__STREAM_CHUNK__INIT;
        ch.stream_id = s->id;
        ch.seq = s->seq;
        ch.total_len = s->len;
        ch.offset = s->next_off;
        ch.last = s->next_off + n == s->len;
        ch.data.data = (uint8_t *)s->data + s->next_off;
        ch.data.len = n;
        size_t blen = ctp2p__stream_chunk__get_packed_size(&ch);
        uint8_t *b = malloc(blen ? blen : 1);
        if (!b) {
            s->status = CM_ENOMEM;
            break;
        }
        ctp2p__stream_chunk__pack(&ch, b);
        int rc = p2p_request(s->h, (struct sockaddr *)&s->addr, s->pub, P2P_MSG_STREAM_CHUNK, b,
                             blen, s->timeout_ms, stream_chunk_done, s);
        free(b);
        if (rc) {
            s->status = rc;
            break;
        }
        s->inflight++;
        s->seq++;
        s->next_off += n;
        if (ch.last)
            s->sent_last = 1;
    }
    if (s->inflight == 0 && (s->status || s->sent_last)) {
        p2p_response_cb done = s->done;
        void *arg = s->arg;
        int st = s->status;
        free(s);
        done(arg, st, NULL, NULL, 0);
    }
}

static void stream_start_cb(uv_timer_t *t)
{
    struct stream_send *s = t->data;
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
    stream_pump(s);
}

int p2p_stream_send(struct p2p_host *h, const struct sockaddr *addr, const uint8_t *peer_pub,
                    uint64_t stream_id, const uint8_t *data, size_t len, size_t chunk_size,
                    unsigned window, uint32_t chunk_timeout_ms, p2p_response_cb done, void *arg)
{
    if (!peer_pub || !done || (!data && len) || chunk_size > P2P_STREAM_CHUNK_MAX ||
        p2p__addr_len(addr) > sizeof(struct sockaddr_storage))
        return CM_EINVAL;
    struct stream_send *s = calloc(1, sizeof *s);
    uv_timer_t *t = malloc(sizeof *t);
    if (!s || !t) {
        free(s);
        free(t);
        return CM_ENOMEM;
    }
    s->h = h;
    memcpy(&s->addr, addr, p2p__addr_len(addr));
    memcpy(s->pub, peer_pub, 32);
    s->id = stream_id;
    s->data = data;
    s->len = len;
    s->chunk = chunk_size ? chunk_size : 64 * 1024;
    s->window = window ? window : 4;
    s->timeout_ms = chunk_timeout_ms ? chunk_timeout_ms : 30000;
    s->done = done;
    s->arg = arg;
    /* Start on the next loop turn so `done` never runs inside this call. */
    uv_timer_init(p2p_ctx_loop(p2p_host_ctx(h)), t);
    t->data = s;
    uv_timer_start(t, stream_start_cb, 0, 0);
    return CM_OK;
}
