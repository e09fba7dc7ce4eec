/* Error codes shared by every Crowdtrain module.
 *
 * Fallible functions return int: 0 (CM_OK) on success, a negative CM_E* code
 * on failure, results through out-parameters. Library errors (OpenSSL, libpq,
 * GLPK, CUDA, cuBLAS, libcurl) are mapped to these codes at the module
 * boundary, after logging the library's own message once. The list lives in
 * one X-macro so the enum, the names and the messages cannot drift apart. */
#ifndef CM_ERR_H
#define CM_ERR_H

#define CM_ERRNO_MAP(X)                                                   \
    X(NOMEM, "out of memory")                                             \
    X(INVAL, "invalid argument")                                          \
    X(IO, "input/output error")                                           \
    X(NOTFOUND, "not found")                                              \
    X(EXISTS, "already exists")                                           \
    X(PERM, "permission denied")                                          \
    X(AUTH, "authentication failed")                                      \
    X(EXPIRED, "expired")                                                 \
    X(REVOKED, "revoked")                                                 \
    X(BADSIG, "bad signature")                                            \
    X(PARSE, "malformed input")                                           \
    X(TOOBIG, "input too large")                                          \
    X(RANGE, "value out of range")                                        \
    X(TIMEOUT, "deadline exceeded")                                       \
    X(CONN, "connection failed")                                          \
    X(PROTO, "protocol violation")                                        \
    X(VERSION, "unsupported version")                                     \
    X(DB, "database error")                                               \
    X(CRYPTO, "cryptographic library error")                              \
    X(BUSY, "resource busy, try again")                                   \
    X(THROTTLED, "too many attempts, try again later")                    \
    X(STATE, "operation not valid in the current state")                  \
    X(CHECKSUM, "checksum mismatch")                                      \
    X(REPLAY, "replayed message")                                         \
    X(UNSUPPORTED, "not supported")                                       \
    X(CLOSED, "closed")                                                   \
    X(DEVICE, "device error")                                             \
    X(NUMERIC, "non-finite or out-of-bound numeric value")                \
    X(INTERNAL, "internal error")                                         \
    X(CANCELED, "canceled")

enum cm_err {
    CM_OK = 0,
#define CM__ERR_ENUM(name, msg) CM_E##name,
    CM__ERR_FIRST = -1000,
    CM_ERRNO_MAP(CM__ERR_ENUM)
#undef CM__ERR_ENUM
    CM__ERR_LAST
};

/* Human-readable message for a code; never NULL, static storage. */
const char *cm_strerror(int err);
/* Symbolic name ("CM_EINVAL") for a code; never NULL, static storage. */
const char *cm_err_name(int err);

#endif
