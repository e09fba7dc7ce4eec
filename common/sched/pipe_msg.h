/* Pipeline-stage messages (DT-FM, seed 003_f3537b728458fcc1.txt §2 and
 * §3.5: stage j of a pipeline sends the activations of each micro-batch to
 * stage j+1 and receives their gradients back; the first and the last stage
 * share the tied embedding; every stage needs the global gradient norm to
 * clip). P2P message types 80..83, carried in the transport's signed
 * envelopes; bodies are fixed big-endian headers followed by raw values
 * (int32 targets and IEEE-754 binary32 values, little-endian), laid out
 * byte for byte in docs/protocol.md, "Pipeline stages".
 *
 * A tensor larger than one message travels in chunks: each message names
 * the whole tensor's size (total) and where its values go (offset, count).
 *
 * Pure, bounded parsers and builders, no I/O: round-trip and rejection
 * tests in tests/unit/sched/test_pipe_msg.c, a libFuzzer target in
 * tests/fuzz/fuzz_pipe_msg.c. Parsed value pointers point into the input
 * buffer (not aligned: copy them with memcpy). */
#ifndef PIPE_MSG_H
#define PIPE_MSG_H

#include <stddef.h>
#include <stdint.h>

enum pipe_msg_type {
    PIPE_MSG_ACT = 80,  /* stage j -> j+1: activations (B,T,C) of micro-batch mb; the
                           chunk at offset 0 also carries the targets (B,T) */
    PIPE_MSG_GRAD = 81, /* stage j+1 -> j: d loss / d activations (B,T,C) of micro-batch mb */
    PIPE_MSG_TIED = 82, /* first <-> last stage: the tied embedding's gradient (total values) */
    PIPE_MSG_NORM = 83, /* every stage -> every other: the squared norm of its gradients */
};

#define PIPE_MSG_VERSION 1
#define PIPE_ENC_FP32 0
#define PIPE_ENC_FP16 1 /* ACT and GRAD only (pipeline.compression "fp16"): IEEE binary16 values */
/* Items (targets + values) in one message: 256 KiB, inside the transport's
 * 320 KiB frame with room for the header and the envelope. */
#define PIPE_MAX_ITEMS 65536u
#define PIPE_MAX_TOTAL (1u << 30) /* values of one tensor */
#define PIPE_MAX_DIM (1u << 20)   /* B, T and C each */
#define PIPE_MAX_STAGES 64
#define PIPE_MAX_MB 65536         /* micro-batches of one step */
#define PIPE_HDR_LEN 64           /* every message: see docs/protocol.md */
/* NORM's flags: the sender, or a replica of its stage, saw a newer
 * assignment with other slots; every stage moves to it after this step. */
#define PIPE_FLAG_MOVE 1u

struct pipe_msg {
    uint32_t type;      /* PIPE_MSG_*: the p2p type, repeated in byte 2 of the body (set
                           by the caller before building; the parser requires the body's
                           to equal the p2p type it is given, and sets this to it) */
    int64_t step;       /* the optimizer step this belongs to, 0 .. 2^62 */
    uint32_t replica;   /* the sender's pipeline (0 .. PIPE_MAX_STAGES-1) */
    uint32_t stage;     /* the sender's stage (0 .. PIPE_MAX_STAGES-1) */
    uint32_t mb;        /* ACT, GRAD: micro-batch index (< PIPE_MAX_MB); TIED, NORM: 0 */
    uint32_t B, T, C;   /* ACT, GRAD: the micro-batch's shape, each 1 .. PIPE_MAX_DIM, and
                           B*T*C == total; TIED, NORM: 0 */
    uint32_t total;     /* ACT, GRAD, TIED: values of the whole tensor, 1 .. PIPE_MAX_TOTAL;
                           NORM: 0 */
    uint32_t offset;    /* first value of this chunk; offset + count <= total */
    uint32_t count;     /* values in this chunk; >= 1 for ACT, GRAD, TIED; 0 for NORM */
    uint32_t ntargets;  /* ACT at offset 0: B*T; otherwise 0. The targets travel only in
                           the first chunk, which needs at least one value too, so a
                           micro-batch with B*T >= PIPE_MAX_ITEMS cannot be sent */
    uint32_t flags;     /* NORM: PIPE_FLAG_MOVE or 0; otherwise 0 */
    uint32_t enc;       /* PIPE_ENC_FP32, or PIPE_ENC_FP16 for ACT and GRAD: the values'
                           wire encoding (byte 1 of the body) */
    double sumsq;       /* NORM: the squared L2 norm, finite and >= 0; otherwise 0 */
    const uint8_t *targets; /* ntargets int32 (-1 = no loss, else >= 0) */
    const uint8_t *values;  /* count values in `enc` (fp32 or fp16), little-endian */
};

/* Values per encoding on the wire: 4 (fp32) or 2 (fp16). */
size_t pipe_enc_size(uint32_t enc);
/* m's values as floats into dst (m->count of them). */
void pipe_msg_values(const struct pipe_msg *m, float *dst);
/* n floats as fp16 (round to nearest even) into dst (2n bytes); CM_ENUMERIC
 * when one is not finite or beyond fp16's range (65504), dst then
 * unspecified. */
int pipe_f16_encode(const float *src, size_t n, uint8_t *dst);

/* Parses the body of a message of p2p type `type`. CM_EPARSE: shorter
 * than the header, a length other than PIPE_HDR_LEN + 4*ntargets +
 * pipe_enc_size(enc)*count
 * (truncated, trailing bytes), a type that is not a pipe type or a body
 * whose type byte is not `type`, wrong version, reserved bytes not zero;
 * CM_EUNSUPPORTED: an encoding other than fp32 and fp16 (fp16 on TIED or
 * NORM: CM_ERANGE); CM_ERANGE: any field
 * outside what is written above (including shapes that do not multiply to
 * total, a chunk past total, targets on a message that must have none,
 * more than PIPE_MAX_ITEMS items, a target below -1, a negative sumsq, a
 * non-zero sumsq outside NORM); CM_ENUMERIC: a value (or sumsq) that is
 * NaN or infinite. *out is filled only on CM_OK (zeroed otherwise); its
 * targets and values are NULL when there are none; nothing to clean up. */
int pipe_msg_parse(uint32_t type, const uint8_t *buf, size_t len, struct pipe_msg *out);

/* Builds the body of m (values and targets copied from m->values and
 * m->targets: raw little-endian bytes in m->enc, e.g. float (or
 * pipe_f16_encode's) and int32_t arrays).
 * *out is heap memory the caller frees. Checks what the parser checks
 * (CM_EINVAL for a bad type or a NULL targets/values with a non-zero
 * ntargets/count, CM_ERANGE for fields and targets, CM_ENUMERIC for
 * non-finite values or sumsq) so nothing unparseable is sent; CM_ENOMEM. */
int pipe_msg_build(const struct pipe_msg *m, uint8_t **out, size_t *out_len);

/* The chunks a tensor of `total` values needs when the first one carries
 * `ntargets` targets too: ceil((total + ntargets) / PIPE_MAX_ITEMS) with
 * the targets counted in the first, which holds the targets and up to
 * PIPE_MAX_ITEMS - ntargets values; every later chunk up to PIPE_MAX_ITEMS
 * values. 0 when total is 0, or when ntargets >= PIPE_MAX_ITEMS (a caller
 * error: chunk 0 would have no room for a value; such a micro-batch cannot
 * be sent). The values of chunk k (k < pipe_chunks()) start at
 * pipe_chunk_offset(k, ntargets) (saturated at UINT32_MAX past any tensor,
 * 0 when ntargets >= PIPE_MAX_ITEMS). */
uint32_t pipe_chunks(uint32_t total, uint32_t ntargets);
uint32_t pipe_chunk_offset(uint32_t k, uint32_t ntargets);
/* Values in chunk k of a tensor of `total`; 0 for k >= pipe_chunks(). */
uint32_t pipe_chunk_count(uint32_t k, uint32_t total, uint32_t ntargets);

#endif
