/* safetensors export and import, so a trained model opens in standard tools.
 *
 * Format (https://github.com/huggingface/safetensors): 8-byte little-endian
 * header length N, N bytes of JSON {"name": {"dtype", "shape",
 * "data_offsets": [begin, end]}, "__metadata__": {str: str}} (may be padded
 * with spaces), then the raw little-endian tensor bytes, offsets relative to
 * the end of the header. The parser reads untrusted files: it is strict
 * (known dtypes, byte counts equal to the shape's, the data buffer covered
 * exactly, without holes or overlaps, no duplicate names) and bounded (header
 * at most 100 MB as in the reference implementation, at most
 * CM_ST_MAX_TENSORS tensors, CM_ST_MAX_DIMS dimensions). */
#ifndef CM_SAFETENSORS_H
#define CM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define CM_ST_MAX_DIMS 8
#define CM_ST_MAX_TENSORS 65536
#define CM_ST_MAX_NAME 1024
#define CM_ST_MAX_HEADER (100u * 1000 * 1000)

enum cm_st_dtype {
    CM_ST_BOOL, CM_ST_U8, CM_ST_I8, CM_ST_I16, CM_ST_U16, CM_ST_F16, CM_ST_BF16,
    CM_ST_I32, CM_ST_U32, CM_ST_F32, CM_ST_F64, CM_ST_I64, CM_ST_U64,
};
const char *cm_st_dtype_name(enum cm_st_dtype d);
size_t cm_st_dtype_size(enum cm_st_dtype d);

/* A tensor to export: name, shape, and a pointer into the caller's flat
 * float32 buffer (borrowed). ndim may be 0 (a scalar, one value). */
struct cm_st_export {
    const char *name;
    uint32_t ndim;
    uint64_t shape[CM_ST_MAX_DIMS];
    const float *data;
};

/* Writes F32 tensors to path atomically (temporary file, fsync, rename).
 * meta_kv is n_meta pairs of strings {key0, value0, key1, value1, ...} for
 * __metadata__ (NULL/0 for none). Tensors are laid out in the order given.
 * CM_EINVAL for duplicate/empty names or names starting with "__". */
int cm_st_write(const char *path, const struct cm_st_export *t, size_t n,
                const char *const *meta_kv, size_t n_meta);

/* One tensor of a parsed file. */
struct cm_st_tensor {
    char *name;               /* owned by the cm_st_file */
    enum cm_st_dtype dtype;
    uint32_t ndim;
    uint64_t shape[CM_ST_MAX_DIMS];
    uint64_t numel;
    const uint8_t *data;      /* into the file bytes (borrowed from the cm_st_file) */
    uint64_t nbytes;
};

struct cm_st_file {
    size_t n;
    struct cm_st_tensor *tensors; /* sorted by data offset */
    size_t n_meta;
    char **meta_kv;               /* 2 * n_meta strings, owned */
    uint8_t *owned;               /* file bytes when loaded by cm_st_load */
};

/* Pure parser: buf must outlive *out (tensor data points into it). Returns
 * CM_EPARSE (with a logged reason), CM_ETOOBIG or CM_ENOMEM. */
int cm_st_parse(const uint8_t *buf, size_t len, struct cm_st_file *out);
/* Reads path (at most max_bytes) and parses it; *out owns the bytes. */
int cm_st_load(const char *path, uint64_t max_bytes, struct cm_st_file *out);
void cm_st_cleanup(struct cm_st_file *f);

const struct cm_st_tensor *cm_st_find(const struct cm_st_file *f, const char *name);
/* Copies tensor `name` into dst as float32 (converting F16, BF16, F64, F32),
 * after checking its shape equals (ndim, shape). CM_ENOTFOUND, CM_EINVAL
 * (shape differs), CM_EUNSUPPORTED (integer dtype). */
int cm_st_read_f32(const struct cm_st_file *f, const char *name, uint32_t ndim,
                   const uint64_t *shape, float *dst);
/* Value of a __metadata__ key, borrowed, or NULL. */
const char *cm_st_meta(const struct cm_st_file *f, const char *key);

#endif
