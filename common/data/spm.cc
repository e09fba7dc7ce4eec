/* cm_spm (spm.h) over Debian's libsentencepiece: the one C++ file of the
 * tree. No exception leaves it: the library reports most errors as
 * statuses, allocation failures become CM_ENOMEM, and what it throws on
 * some malformed models (tests/fuzz/fuzz_spm_model.c found one) CM_EINVAL. */
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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

/* ---- a guard in front of the library ------------------------------------ */

/* One protobuf field of buf[*pos..len): its number, wire type and, for a
 * length-delimited one, where its bytes are. -1 when malformed. */
static int pb_field(const uint8_t *buf, size_t len, size_t *pos, uint64_t *num, int *type,
                    size_t *off, size_t *flen)
{
    uint64_t v = 0;
    for (int sh = 0;; sh += 7) {
        if (*pos >= len || sh > 63)
            return -1;
        uint8_t b = buf[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80))
            break;
    }
    *num = v >> 3;
    *type = (int)(v & 7);
    *off = *pos;
    *flen = 0;
    switch (*type) {
    case 0: /* varint */
        for (int k = 0;; k++) {
            if (*pos >= len || k > 9)
                return -1;
            if (!(buf[(*pos)++] & 0x80))
                break;
        }
        return 0;
    case 1: /* 64-bit */
        if (len - *pos < 8)
            return -1;
        *pos += 8;
        return 0;
    case 5: /* 32-bit */
        if (len - *pos < 4)
            return -1;
        *pos += 4;
        return 0;
    case 2: { /* length-delimited */
        uint64_t n = 0;
        for (int sh = 0;; sh += 7) {
            if (*pos >= len || sh > 63)
                return -1;
            uint8_t b = buf[(*pos)++];
            n |= (uint64_t)(b & 0x7f) << sh;
            if (!(b & 0x80))
                break;
        }
        if (n > len - *pos)
            return -1;
        *off = *pos;
        *flen = (size_t)n;
        *pos += (size_t)n;
        return 0;
    }
    default: /* groups: not in a SentencePiece model */
        return -1;
    }
}

/* Our recipe's models normalize nothing (scripts/train-tokenizer.sh). A
 * model with a normalization rule carries a precompiled character map
 * that libsentencepiece 0.1.97 (Debian 12) uses without checking: a
 * crafted one made its normalizer read past the map (found by
 * tests/fuzz/fuzz_spm_model.c). The tokenizer comes from a dataset server,
 * so such models are refused: the top-level protobuf must parse, and the
 * normalizer and denormalizer specs (ModelProto fields 3 and 5) must have
 * no precompiled_charsmap (their field 2). */
static int check_model_bytes(const uint8_t *buf, size_t len, char *err, size_t errlen,
                             const char *what)
{
    size_t pos = 0;
    while (pos < len) {
        uint64_t num;
        int type;
        size_t off, flen;
        if (pb_field(buf, len, &pos, &num, &type, &off, &flen) != 0)
            return seterr(err, errlen, CM_EINVAL, "%s: not a SentencePiece model (malformed%s)",
                          what, ")");
        if ((num == 3 || num == 5) && type == 2) {
            size_t p2 = 0;
            while (p2 < flen) {
                uint64_t n2;
                int t2;
                size_t o2, l2;
                if (pb_field(buf + off, flen, &p2, &n2, &t2, &o2, &l2) != 0)
                    return seterr(err, errlen, CM_EINVAL,
                                  "%s: not a SentencePiece model (malformed normalizer%s)", what,
                                  ")");
                if (n2 == 2 && t2 == 2 && l2 > 0)
                    return seterr(err, errlen, CM_EUNSUPPORTED,
                                  "%s: the model normalizes text (a character map); only models "
                                  "without one are accepted (scripts/train-tokenizer.sh makes%s",
                                  what, " such models)");
            }
        }
    }
    return CM_OK;
}

extern "C" int cm_spm_load(const char *path, struct cm_spm **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return seterr(err, errlen, CM_EIO, "%s: cannot be read%s", path, "");
    std::string bytes;
    char chunk[65536];
    size_t got;
    try {
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0 && bytes.size() < (256u << 20))
            bytes.append(chunk, got);
    } catch (const std::bad_alloc &) {
        fclose(f);
        return CM_ENOMEM;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || bytes.size() >= (256u << 20))
        return seterr(err, errlen, CM_EIO, "%s: a read error, or larger than 256 MiB%s", path, "");
    int rc = check_model_bytes(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size(), err,
                               errlen, path);
    if (rc != CM_OK)
        return rc;
    try {
        std::unique_ptr<cm_spm> s(new cm_spm); /* freed if the library throws */
        sentencepiece::util::Status st = s->sp.LoadFromSerializedProto(bytes);
        return finish_load(s.release(), st, path, out, err, errlen);
    } catch (const std::bad_alloc &) {
        return CM_ENOMEM;
    } catch (...) { /* the library throws on some malformed models (Darts) */
        return seterr(err, errlen, CM_EINVAL, "the tokenizer library refused the model%s%s", "",
                      "");
    }
}

extern "C" int cm_spm_load_mem(const void *model, size_t len, struct cm_spm **out, char *err,
                               size_t errlen)
{
    *out = NULL;
    int rc = check_model_bytes(static_cast<const uint8_t *>(model), len, err, errlen,
                               "model bytes");
    if (rc != CM_OK)
        return rc;
    try {
        std::unique_ptr<cm_spm> s(new cm_spm); /* freed if the library throws */
        sentencepiece::util::Status st = s->sp.LoadFromSerializedProto(
            std::string_view(static_cast<const char *>(model), len));
        return finish_load(s.release(), st, "model bytes", out, err, errlen);
    } catch (const std::bad_alloc &) {
        return CM_ENOMEM;
    } catch (...) { /* the library throws on some malformed models (Darts) */
        return seterr(err, errlen, CM_EINVAL, "the tokenizer library refused the model%s%s", "",
                      "");
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
    } catch (...) { /* the library throws on some malformed models (Darts) */
        return seterr(err, errlen, CM_EINVAL, "the tokenizer library refused the model%s%s", "",
                      "");
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
    } catch (...) { /* the library throws on some malformed models (Darts) */
        return seterr(err, errlen, CM_EINVAL, "the tokenizer library refused the model%s%s", "",
                      "");
    }
}
