/* cm_spm (spm.h) over Debian's libsentencepiece: the one C++ file of the
 * tree. No exception leaves it: the library reports errors as statuses,
 * allocation failures become CM_ENOMEM. */
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

extern "C" {
#include "cm_err.h"
}
#include "data/spm.h"

struct cm_spm {
    sentencepiece::SentencePieceProcessor sp;
};

static int seterr(char *err, size_t errlen, int rc, const char *fmt, const char *a, const char *b)
{
    if (err && errlen)
        snprintf(err, errlen, fmt, a, b);
    return rc;
}

static int finish_load(cm_spm *s, const sentencepiece::util::Status &st, const char *what,
                       struct cm_spm **out, char *err, size_t errlen)
{
    if (!st.ok()) {
        int rc = st.code() == sentencepiece::util::StatusCode::kNotFound ||
                         st.code() == sentencepiece::util::StatusCode::kPermissionDenied
                     ? CM_EIO
                     : CM_EINVAL;
        seterr(err, errlen, rc, "%s: not a usable SentencePiece model (%s)", what,
               st.ToString().c_str());
        delete s;
        return rc;
    }
    if (s->sp.GetPieceSize() <= 0) {
        delete s;
        return seterr(err, errlen, CM_EINVAL, "%s: the model has no pieces%s", what, "");
    }
    *out = s;
    return CM_OK;
}

extern "C" int cm_spm_load(const char *path, struct cm_spm **out, char *err, size_t errlen)
{
    *out = NULL;
    try {
        cm_spm *s = new cm_spm;
        return finish_load(s, s->sp.Load(path), path, out, err, errlen);
    } catch (const std::bad_alloc &) {
        return CM_ENOMEM;
    }
}

extern "C" int cm_spm_load_mem(const void *model, size_t len, struct cm_spm **out, char *err,
                               size_t errlen)
{
    *out = NULL;
    try {
        cm_spm *s = new cm_spm;
        return finish_load(s, s->sp.LoadFromSerializedProto(
                                  std::string_view(static_cast<const char *>(model), len)),
                           "model bytes", out, err, errlen);
    } catch (const std::bad_alloc &) {
        return CM_ENOMEM;
    }
}

extern "C" void cm_spm_free(struct cm_spm *s)
{
    delete s;
}

extern "C" int cm_spm_vocab_size(const struct cm_spm *s)
{
    return s->sp.GetPieceSize();
}

extern "C" int cm_spm_piece_id(const struct cm_spm *s, const char *piece)
{
    int id = s->sp.PieceToId(piece);
    /* PieceToId answers unk_id for a piece it does not have */
    return id == s->sp.unk_id() && s->sp.IdToPiece(id) != piece ? -1 : id;
}

extern "C" int cm_spm_encode(const struct cm_spm *s, const char *text, size_t len, int32_t *ids,
                             size_t cap, size_t *n, char *err, size_t errlen)
{
    *n = 0;
    size_t bad = cm_utf8_invalid_at(text, len);
    if (bad < len) {
        char at[32];
        snprintf(at, sizeof at, "%zu", bad);
        return seterr(err, errlen, CM_EINVAL, "text is not UTF-8 (byte %s%s)", at, "");
    }
    try {
        std::vector<int> v;
        sentencepiece::util::Status st = s->sp.Encode(std::string_view(text, len), &v);
        if (!st.ok())
            return seterr(err, errlen, CM_EINVAL, "encode: %s%s", st.ToString().c_str(), "");
        *n = v.size();
        if (v.size() > cap)
            return CM_ETOOBIG;
        for (size_t i = 0; i < v.size(); i++)
            ids[i] = v[i];
        return CM_OK;
    } catch (const std::bad_alloc &) {
        return CM_ENOMEM;
    }
}

extern "C" int cm_spm_decode(const struct cm_spm *s, const int32_t *ids, size_t n, char **out,
                             size_t *outlen, char *err, size_t errlen)
{
    *out = NULL;
    *outlen = 0;
    int size = s->sp.GetPieceSize();
    try {
        std::vector<int> v(n);
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= size) {
                char id[24];
                snprintf(id, sizeof id, "%d", (int)ids[i]);
                return seterr(err, errlen, CM_EINVAL, "decode: id %s is outside the vocabulary%s",
                              id, "");
            }
            v[i] = ids[i];
        }
        std::string text;
        sentencepiece::util::Status st = s->sp.Decode(v, &text);
        if (!st.ok())
            return seterr(err, errlen, CM_EINVAL, "decode: %s%s", st.ToString().c_str(), "");
        char *buf = static_cast<char *>(malloc(text.size() + 1));
        if (!buf)
            return CM_ENOMEM;
        memcpy(buf, text.data(), text.size());
        buf[text.size()] = '\0';
        *out = buf;
        *outlen = text.size();
        return CM_OK;
    } catch (const std::bad_alloc &) {
        return CM_ENOMEM;
    }
}
