/* Expert-call messages of decentralized mixture-of-experts (Learning@home,
 * seed 002_2b00836ea4b30f79.txt §3.3 "Runtime": trainers send a batch of
 * inputs to the server hosting an expert and get its outputs; later the
 * output gradients, and get the input gradients). P2P message types 64..66,
 * carried in the transport's signed envelopes; bodies are fixed big-endian
 * headers followed by raw IEEE-754 binary32 values (little-endian), laid
 * out byte for byte in docs/protocol.md, "Experts".
 *
 * Pure, bounded parsers and builders, no I/O: each parser has round-trip
 * and rejection tests (tests/unit/moe/test_moe_msg.c) and a libFuzzer target
 * (tests/fuzz/fuzz_moe_*.c). Parsed values point into the input buffer (not
 * aligned: read them with moe_values_get). */
#ifndef MOE_MSG_H
#define MOE_MSG_H

#include <stddef.h>
#include <stdint.h>

enum moe_msg_type {
    MOE_MSG_FORWARD = 64,  /* inputs (N,C) -> outputs (N,C) */
    MOE_MSG_BACKWARD = 65, /* dL/dy (N,C) of an earlier forward -> dL/dx (N,C) */
    MOE_MSG_INFO = 66,     /* empty -> experts hosted, shapes, limits */
};

#define MOE_MSG_VERSION 1
#define MOE_ENC_FP32 0
#define MOE_UID_MAX 64               /* bytes of an expert uid */
#define MOE_MAX_C 16384              /* largest block width */
/* Values of one message: 256 KiB of fp32, inside the transport's 320 KiB
 * frame with room for the header and the envelope. */
#define MOE_MAX_VALUES 65536u
#define MOE_INFO_MAX_EXPERTS 256
#define MOE_CALL_HDR_LEN 20          /* before the uid */
#define MOE_RESULT_HDR_LEN 12
#define MOE_INFO_HDR_LEN 16
#define MOE_INFO_ENTRY_HDR_LEN 10    /* per expert, before its uid */

/* FORWARD and BACKWARD requests share one layout. */
struct moe_call {
    char uid[MOE_UID_MAX + 1];  /* NUL-terminated */
    uint64_t forward_id;        /* chosen by the caller; BACKWARD names its FORWARD */
    uint32_t n, c;              /* samples, values per sample */
    const uint8_t *values;      /* n*c fp32, into the parsed buffer (or the caller's, to build) */
};

/* The answer to either call (status 0). */
struct moe_result {
    uint32_t n, c;
    const uint8_t *values;
};

struct moe_info_expert {
    char uid[MOE_UID_MAX + 1];
    uint32_t c, f;              /* block width, hidden width (kern_expert.h) */
};

struct moe_info {
    uint32_t max_batch;         /* samples the server computes at once */
    uint32_t max_inflight;      /* requests it holds queued or computing */
    uint32_t max_request;       /* samples in one request */
    uint32_t n_experts;
    struct moe_info_expert experts[MOE_INFO_MAX_EXPERTS];
};

/* 1 when s (len bytes, not necessarily terminated) is a valid uid: 1..64
 * bytes of [A-Za-z0-9._-]. */
int moe_uid_valid(const char *s, size_t len);

/* Parsers. CM_EPARSE: truncated, trailing bytes, wrong version, invalid
 * uid, reserved bytes not zero; CM_EUNSUPPORTED: an encoding other than
 * fp32; CM_ERANGE: n or c of 0, c above MOE_MAX_C, n*c above
 * MOE_MAX_VALUES, or a payload that is not exactly n*c values;
 * CM_ENUMERIC: a value that is NaN or infinite. Nothing to clean up. */
int moe_call_parse(const uint8_t *buf, size_t len, struct moe_call *out);
int moe_result_parse(const uint8_t *buf, size_t len, struct moe_result *out);
/* CM_EPARSE as above, and duplicate uids; CM_ERANGE: more than
 * MOE_INFO_MAX_EXPERTS experts, a width of 0 or above MOE_MAX_C (c) or
 * 1<<20 (f), a limit of 0. */
int moe_info_parse(const uint8_t *buf, size_t len, struct moe_info *out);

/* Builders: *out is heap memory the caller frees; the values are copied
 * from m->values (raw fp32 bytes, e.g. a float array). They check what the
 * parsers check (CM_EINVAL for a bad uid, CM_ERANGE for shapes,
 * CM_ENUMERIC for non-finite values) so nothing unparseable is sent. */
int moe_call_build(const struct moe_call *m, uint8_t **out, size_t *out_len);
int moe_result_build(const struct moe_result *m, uint8_t **out, size_t *out_len);
int moe_info_build(const struct moe_info *m, uint8_t **out, size_t *out_len);
/* The result header alone (the caller appends n*c fp32 values it owns,
 * e.g. as a p2p_reply tail). */
void moe_result_header(uint32_t n, uint32_t c, uint8_t out[MOE_RESULT_HDR_LEN]);

/* Copies count values from wire bytes into dst (any alignment). */
void moe_values_get(float *dst, const uint8_t *src, size_t count);
/* 1 when every one of count wire values is finite. */
int moe_values_finite(const uint8_t *src, size_t count);

#endif
