/* Averaging messages (common/ar/ar.proto): pure, bounded parsers and
 * builders, separate from any I/O so each parser has a round-trip test and a
 * libFuzzer target (tests/fuzz/fuzz_ar_*.c). Data and Result, which carry
 * the chunks, are read in place: their payload points into the input buffer
 * (no copy), so it lives as long as that buffer; _cleanup releases nothing
 * but is kept so callers need not know. */
#ifndef AR_MSG_H
#define AR_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "ar/ar.h"

struct ar_data_msg {
    uint8_t round[AR_ROUND_ID_LEN];
    uint32_t part, chunk;
    double weight;
    uint32_t encoding, count;
    const uint8_t *payload;
    size_t payload_len;
    int has_round; /* parse: round/part/chunk are valid even on failure */
    void *pb_;
};

struct ar_fetch_msg {
    uint8_t round[AR_ROUND_ID_LEN];
    uint32_t part, chunk;
};

struct ar_result_msg {
    uint8_t round[AR_ROUND_ID_LEN];
    uint32_t part, chunk;
    double weight;
    uint64_t counted, dropped, excluded;
    size_t n_exclusions;
    struct ar_exclusion exclusions[AR_MAX_MEMBERS]; /* .part is left 0 */
    uint32_t encoding, count;
    const uint8_t *payload;
    size_t payload_len;
    uint32_t ready; /* leading final chunks of the part (0: not told) */
    void *pb_;
};

/* Parsers. CM_EPARSE: not a message of that type, round id not 32 bytes,
 * unknown encoding, too many exclusions or a bad member/reason in them, a
 * weight that is not finite and >= 0 (Result only). CM_ERANGE: count 0 or
 * above AR_CHUNK_MAX, payload above AR_PAYLOAD_MAX or not the encoded size of count
 * values (a length that lies). On CM_OK call the matching _cleanup.
 * ar_data_parse sets has_round (with round, part, chunk) whenever the round
 * id decoded, even if a later field failed, so the receiver can attribute a
 * bad chunk to its sender; nothing needs cleaning up after a failure. */
int ar_data_parse(const uint8_t *buf, size_t len, struct ar_data_msg *m);
void ar_data_cleanup(struct ar_data_msg *m);
int ar_fetch_parse(const uint8_t *buf, size_t len, struct ar_fetch_msg *m);
int ar_result_parse(const uint8_t *buf, size_t len, struct ar_result_msg *m);
void ar_result_cleanup(struct ar_result_msg *m);

/* Ack: the response body to Data (status 0) and to a Fetch that is not
 * ready (CM_EBUSY). CM_EPARSE when undecodable or without in_round (an
 * empty body is not an Ack: it is how "round unknown here" looks). */
int ar_ack_parse(const uint8_t *buf, size_t len, uint32_t *ready);
int ar_ack_build(uint32_t ready, uint8_t **out, size_t *out_len);

/* Builders: *out is heap memory the caller frees. The payload is copied. */
int ar_data_build(const struct ar_data_msg *m, uint8_t **out, size_t *out_len);
int ar_fetch_build(const struct ar_fetch_msg *m, uint8_t **out, size_t *out_len);
int ar_result_build(const struct ar_result_msg *m, uint8_t **out, size_t *out_len);
/* The same messages without copying the payload: *out receives every other
 * field and then the payload's key and length, so head followed by
 * m->payload is the whole message (the same fields as the full builder's;
 * for Result, `ready` comes before the payload on the wire). */
int ar_data_build_head(const struct ar_data_msg *m, uint8_t **out, size_t *out_len);
int ar_result_build_head(const struct ar_result_msg *m, uint8_t **out, size_t *out_len);

#endif
