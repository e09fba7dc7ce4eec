/* Unit tests for the pure parsers of common/data/: manifest validation
 * (every bad field gives a clear error naming it), IDX files, llm.c token
 * shards, and bounded gzip decompression. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "cm_err.h"
#include "data/data.h"

#define H64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define SHARD "{\"url\": \"file:///tmp/a\", \"size\": 10, \"sha256\": \"" H64 "\"}"

static const char *good_idx =
    "{\"name\": \"fm\", \"format\": \"idx-images\", \"description\": \"x\","
    " \"image\": {\"rows\": 28, \"cols\": 28, \"classes\": 10, \"mean\": 0.5, \"std\": 0.25},"
    " \"shards\": [{\"url\": \"https://h/i.gz\", \"size\": 100, \"sha256\": \"" H64 "\","
    " \"compression\": \"gzip\", \"examples\": 5, \"labels\": " SHARD "}]}";

static void test_good_manifests(void **state)
{
    (void)state;
    struct cm_data_manifest *m;
    char err[256];
    assert_int_equal(cm_data_manifest_parse(good_idx, strlen(good_idx), &m, err, sizeof err), CM_OK);
    assert_string_equal(m->name, "fm");
    assert_int_equal(m->format, CM_DATA_IDX_IMAGES);
    assert_int_equal(m->rows, 28);
    assert_int_equal(m->classes, 10);
    assert_true(m->mean == 0.5f && m->std == 0.25f);
    assert_int_equal(m->n_shards, 1);
    assert_string_equal(m->shards[0].data.url, "https://h/i.gz");
    assert_int_equal(m->shards[0].data.size, 100);
    assert_int_equal(m->shards[0].data.compression, CM_DATA_COMP_GZIP);
    assert_int_equal(m->shards[0].data.sha256[0], 0x01);
    assert_int_equal(m->shards[0].data.sha256[31], 0xef);
    assert_int_equal(m->shards[0].examples, 5);
    assert_string_equal(m->shards[0].labels.url, "file:///tmp/a");
    assert_int_equal(m->shards[0].labels.compression, CM_DATA_COMP_NONE);
    cm_data_manifest_free(m);

    const char *tok = "{\"name\": \"t\", \"format\": \"tokens-u16\", \"vocab_size\": 50257,"
                      " \"shards\": [" SHARD ", " SHARD "]}";
    assert_int_equal(cm_data_manifest_parse(tok, strlen(tok), &m, err, sizeof err), CM_OK);
    assert_int_equal(m->format, CM_DATA_TOKENS_U16);
    assert_int_equal(m->vocab_size, 50257);
    assert_int_equal(m->n_shards, 2);
    assert_null(m->shards[1].labels.url);
    cm_data_manifest_free(m);

    const char *txt = "{\"name\": \"t\", \"format\": \"text-bytes\", \"shards\": [" SHARD "]}";
    assert_int_equal(cm_data_manifest_parse(txt, strlen(txt), &m, err, sizeof err), CM_OK);
    assert_int_equal(m->vocab_size, 256);
    assert_int_equal(m->shards[0].data.chunk_size, 0);
    cm_data_manifest_free(m);

    const char *ch = "{\"name\": \"t\", \"format\": \"text-bytes\", \"shards\": [{\"url\": "
                     "\"file:///a\", \"size\": 2049, \"sha256\": \"" H64 "\", \"chunk_size\": 1024, "
                     "\"chunk_sha256\": [\"" H64 "\", \"" H64 "\", \"ffffffffffffffffffffffffffffffff"
                     "ffffffffffffffffffffffffffffffff\"]}]}";
    assert_int_equal(cm_data_manifest_parse(ch, strlen(ch), &m, err, sizeof err), CM_OK);
    assert_int_equal(m->shards[0].data.chunk_size, 1024);
    assert_int_equal(m->shards[0].data.n_chunks, 3);
    assert_int_equal(m->shards[0].data.chunk_sha256[2][31], 0xff);
    cm_data_manifest_free(m);
}

struct bad {
    const char *json;
    int rc;
    const char *msg; /* substring the error must contain */
};

static void test_bad_manifests(void **state)
{
    (void)state;
    static const struct bad cases[] = {
        {"", CM_EPARSE, "not valid JSON"},
        {"[1]", CM_EPARSE, "must be a JSON object"},
        {"{\"format\": \"text-bytes\", \"shards\": [" SHARD "]}", CM_EPARSE, "name: missing"},
        {"{\"name\": 3, \"format\": \"text-bytes\", \"shards\": [" SHARD "]}", CM_EPARSE, "name:"},
        {"{\"name\": \"\", \"format\": \"text-bytes\", \"shards\": [" SHARD "]}", CM_EPARSE, "name:"},
        {"{\"name\": \"a\", \"shards\": [" SHARD "]}", CM_EPARSE, "format: missing"},
        {"{\"name\": \"a\", \"format\": 1, \"shards\": [" SHARD "]}", CM_EPARSE, "format: must be"},
        {"{\"name\": \"a\", \"format\": \"jpeg\", \"shards\": [" SHARD "]}", CM_EPARSE,
         "format: \"jpeg\" is not one of"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\"}", CM_EPARSE, "shards: missing"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": {}}", CM_EPARSE,
         "shards: must be an array"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": []}", CM_ERANGE, "shards:"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [" SHARD "], \"x\": 1}",
         CM_EPARSE, "x: unknown field"},
        {"{\"name\": \"a\", \"name\": \"b\", \"format\": \"text-bytes\", \"shards\": [" SHARD "]}",
         CM_EPARSE, "duplicate"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [1]}", CM_EPARSE,
         "shards[0]: must be an object"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [" SHARD ", {\"size\": 1, "
         "\"sha256\": \"" H64 "\"}]}", CM_EPARSE, "shards[1].url: missing"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": 5, \"size\": 1, "
         "\"sha256\": \"" H64 "\"}]}", CM_EPARSE, "shards[0].url: must be a string"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"ftp://x\", "
         "\"size\": 1, \"sha256\": \"" H64 "\"}]}", CM_EPARSE, "shards[0].url: scheme"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"http://a b\", "
         "\"size\": 1, \"sha256\": \"" H64 "\"}]}", CM_EPARSE, "shards[0].url: contains"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"sha256\": \"" H64 "\"}]}", CM_EPARSE, "shards[0].size: missing"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": -5, \"sha256\": \"" H64 "\"}]}", CM_ERANGE, "shards[0].size: -5"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 0, \"sha256\": \"" H64 "\"}]}", CM_ERANGE, "shards[0].size: 0"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1e3, \"sha256\": \"" H64 "\"}]}", CM_EPARSE, "shards[0].size: must be an integer"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 9999999999999999, \"sha256\": \"" H64 "\"}]}", CM_ERANGE, "shards[0].size"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1}]}", CM_EPARSE, "shards[0].sha256: missing"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1, \"sha256\": \"abc\"}]}", CM_EPARSE, "shards[0].sha256: must be 64 hex"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1, \"sha256\": \"" "z123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
         "\"}]}", CM_EPARSE, "shards[0].sha256"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1, \"sha256\": \"" H64 "\", \"compression\": \"xz\"}]}", CM_EPARSE,
         "shards[0].compression"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1, \"sha256\": \"" H64 "\", \"sha\": 1}]}", CM_EPARSE,
         "shards[0].sha: unknown field"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1, \"sha256\": \"" H64 "\", \"examples\": 3}]}", CM_EPARSE,
         "shards[0].examples: only allowed"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1, \"sha256\": \"" H64 "\", \"labels\": " SHARD "}]}", CM_EPARSE,
         "shards[0].labels: only allowed"},
        {"{\"name\": \"a\", \"format\": \"tokens-u16\", \"shards\": [" SHARD "]}", CM_EPARSE,
         "vocab_size: missing"},
        {"{\"name\": \"a\", \"format\": \"tokens-u16\", \"vocab_size\": 70000, \"shards\": ["
         SHARD "]}", CM_ERANGE, "vocab_size: 70000"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"vocab_size\": 100, \"shards\": ["
         SHARD "]}", CM_ERANGE, "vocab_size"},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"shards\": [" SHARD "]}", CM_EPARSE,
         "image: missing"},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"image\": {\"rows\": 28, \"classes\": 10},"
         " \"shards\": [" SHARD "]}", CM_EPARSE, "image.cols: missing"},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"image\": {\"rows\": 28, \"cols\": \"28\","
         " \"classes\": 10}, \"shards\": [" SHARD "]}", CM_EPARSE, "image.cols: must be an integer"},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"image\": {\"rows\": 60000, \"cols\": 60000,"
         " \"classes\": 10}, \"shards\": [" SHARD "]}", CM_ERANGE, "image:"},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"image\": {\"rows\": 2, \"cols\": 2,"
         " \"classes\": 10, \"std\": 0}, \"shards\": [" SHARD "]}", CM_ERANGE, "image.std"},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"image\": {\"rows\": 2, \"cols\": 2,"
         " \"classes\": 10}, \"shards\": [" SHARD "]}", CM_EPARSE, "shards[0].labels: missing"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"image\": {\"rows\": 2}, \"shards\": ["
         SHARD "]}", CM_EPARSE, "image: only allowed"},
        /* chunk hashes */
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 2048, \"sha256\": \"" H64 "\", \"chunk_size\": 1024}]}", CM_EPARSE,
         "shards[0]: chunk_size and chunk_sha256 go together"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 2049, \"sha256\": \"" H64 "\", \"chunk_size\": 1024, \"chunk_sha256\": [\""
         H64 "\", \"" H64 "\"]}]}", CM_EPARSE, "shards[0].chunk_sha256: needs 3 hashes"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 2048, \"sha256\": \"" H64 "\", \"chunk_size\": 100, \"chunk_sha256\": []}]}",
         CM_ERANGE, "shards[0].chunk_size: 100 is outside"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1024, \"sha256\": \"" H64 "\", \"chunk_size\": 1024, \"chunk_sha256\": [\"x\"]}]}",
         CM_EPARSE, "shards[0].chunk_sha256[0]: must be 64"},
        {"{\"name\": \"a\", \"format\": \"text-bytes\", \"shards\": [{\"url\": \"file:///a\", "
         "\"size\": 1024, \"sha256\": \"" H64 "\", \"compression\": \"gzip\", \"chunk_size\": 1024, "
         "\"chunk_sha256\": [\"" H64 "\"]}]}", CM_EPARSE, "compression\": \"none\""},
        {"{\"name\": \"a\", \"format\": \"idx-images\", \"image\": {\"rows\": 2, \"cols\": 2,"
         " \"classes\": 10}, \"shards\": [{\"url\": \"file:///a\", \"size\": 1024, \"sha256\": \""
         H64 "\", \"chunk_size\": 1024, \"chunk_sha256\": [\"" H64 "\"], \"labels\": " SHARD "}]}",
         CM_EPARSE, "shards[0].chunk_size: chunk hashes are for text-bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cm_data_manifest *m = (void *)0x1;
        char err[256] = "";
        int rc = cm_data_manifest_parse(cases[i].json, strlen(cases[i].json), &m, err, sizeof err);
        if (rc != cases[i].rc || !strstr(err, cases[i].msg))
            fail_msg("case %zu: rc %s, error \"%s\"; want %s and \"%s\"", i, cm_err_name(rc), err,
                     cm_err_name(cases[i].rc), cases[i].msg);
        assert_null(m);
    }
}

static void test_relative_urls(void **state)
{
    (void)state;
    const char *rel = "{\"name\": \"r\", \"format\": \"text-bytes\", \"shards\": [{\"url\": "
                      "\"part/a.txt\", \"size\": 10, \"sha256\": \"" H64 "\"}, " SHARD "]}";
    struct cm_data_manifest *m = NULL;
    char err[256];
    assert_int_equal(cm_data_manifest_parse_base(rel, strlen(rel), "https://h.example/d/", &m, err,
                                                 sizeof err), CM_OK);
    assert_string_equal(m->shards[0].data.url, "https://h.example/d/part/a.txt");
    assert_string_equal(m->shards[1].data.url, "file:///tmp/a"); /* absolute stays */
    cm_data_manifest_free(m);
    assert_int_equal(cm_data_manifest_parse(rel, strlen(rel), &m, err, sizeof err), CM_EPARSE);
    assert_non_null(strstr(err, "shards[0].url: relative URL"));
    assert_null(m);
    const char *abs = "{\"name\": \"r\", \"format\": \"text-bytes\", \"shards\": [{\"url\": "
                      "\"/etc/passwd\", \"size\": 10, \"sha256\": \"" H64 "\"}]}";
    assert_int_equal(cm_data_manifest_parse_base(abs, strlen(abs), "file:///d/", &m, err,
                                                 sizeof err), CM_EPARSE);
    assert_non_null(strstr(err, "must not start with '/'"));
    assert_int_equal(cm_data_manifest_parse_base(rel, strlen(rel), "https://h/d", &m, err,
                                                 sizeof err), CM_EINVAL);
    assert_int_equal(cm_data_manifest_parse_base(rel, strlen(rel), "ftp://h/d/", &m, err,
                                                 sizeof err), CM_EINVAL);
}

static void test_manifest_load_errors(void **state)
{
    (void)state;
    struct cm_data_manifest *m;
    char err[256];
    assert_int_equal(cm_data_manifest_load("/nonexistent/m.json", &m, err, sizeof err),
                     CM_ENOTFOUND);
    assert_non_null(strstr(err, "/nonexistent/m.json"));
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static void test_idx(void **state)
{
    (void)state;
    uint8_t buf[16 + 2 * 3 * 4] = {0, 0, 8, 3};
    be32(buf + 4, 2);
    be32(buf + 8, 3);
    be32(buf + 12, 4);
    for (int i = 0; i < 24; i++)
        buf[16 + i] = (uint8_t)i;
    struct cm_data_idx x;
    assert_int_equal(cm_data_idx_parse(buf, sizeof buf, &x), CM_OK);
    assert_int_equal(x.ndim, 3);
    assert_int_equal(x.dims[2], 4);
    assert_int_equal(x.count, 24);
    assert_ptr_equal(x.data, buf + 16);
    for (size_t n = 0; n < sizeof buf; n++)
        assert_int_not_equal(cm_data_idx_parse(buf, n, &x), CM_OK);
    buf[2] = 0x0d; /* float data */
    assert_int_equal(cm_data_idx_parse(buf, sizeof buf, &x), CM_EUNSUPPORTED);
    buf[2] = 8;
    buf[3] = 5;
    assert_int_equal(cm_data_idx_parse(buf, sizeof buf, &x), CM_EPARSE);
    buf[3] = 3;
    be32(buf + 4, 0xffffffffu); /* a product far beyond the buffer */
    assert_int_equal(cm_data_idx_parse(buf, sizeof buf, &x), CM_EPARSE);
}

static void le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

static void test_tokens(void **state)
{
    (void)state;
    size_t n = 1024 + 2 * 5;
    uint8_t *buf = calloc(1, n);
    le32(buf, 20240520);
    le32(buf + 4, 1);
    le32(buf + 8, 5);
    for (int i = 0; i < 5; i++)
        buf[1024 + 2 * i] = (uint8_t)(i + 1), buf[1024 + 2 * i + 1] = 1;
    struct cm_data_tokens t;
    assert_int_equal(cm_data_tokens_parse(buf, n, &t), CM_OK);
    assert_int_equal(t.count, 5);
    assert_int_equal(t.tokens[0] | t.tokens[1] << 8, 257);
    assert_int_equal(cm_data_tokens_parse(buf, n - 1, &t), CM_EPARSE);
    assert_int_equal(cm_data_tokens_parse(buf, 1000, &t), CM_EPARSE);
    le32(buf + 8, 6);
    assert_int_equal(cm_data_tokens_parse(buf, n, &t), CM_EPARSE);
    le32(buf + 8, 5);
    le32(buf + 4, 2); /* llm.c version 2: uint32 tokens */
    assert_int_equal(cm_data_tokens_parse(buf, n, &t), CM_EVERSION);
    le32(buf + 4, 1);
    le32(buf, 20240521);
    assert_int_equal(cm_data_tokens_parse(buf, n, &t), CM_EPARSE);
    free(buf);
}

static size_t gz(const uint8_t *in, size_t n, uint8_t *out, size_t cap)
{
    z_stream z = {0};
    assert_int_equal(deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t len = z.total_out;
    deflateEnd(&z);
    return len;
}

static void test_gunzip(void **state)
{
    (void)state;
    uint8_t plain[5000], comp[6000], two[12000];
    for (size_t i = 0; i < sizeof plain; i++)
        plain[i] = (uint8_t)((i * i) % 251);
    size_t c = gz(plain, sizeof plain, comp, sizeof comp);
    uint8_t *out;
    size_t olen;
    assert_int_equal(cm_data_gunzip(comp, c, 1 << 20, &out, &olen), CM_OK);
    assert_int_equal(olen, sizeof plain);
    assert_memory_equal(out, plain, olen);
    free(out);
    /* Exactly at the limit is fine, one byte less is too big. */
    assert_int_equal(cm_data_gunzip(comp, c, sizeof plain, &out, &olen), CM_OK);
    free(out);
    assert_int_equal(cm_data_gunzip(comp, c, sizeof plain - 1, &out, &olen), CM_ETOOBIG);
    assert_null(out);
    /* Two members concatenated decode to both. */
    memcpy(two, comp, c);
    memcpy(two + c, comp, c);
    assert_int_equal(cm_data_gunzip(two, 2 * c, 1 << 20, &out, &olen), CM_OK);
    assert_int_equal(olen, 2 * sizeof plain);
    free(out);
    /* Every truncation and trailing garbage are refused. */
    for (size_t n = 0; n < c; n++) {
        int rc = cm_data_gunzip(comp, n, 1 << 20, &out, &olen);
        if (rc == CM_OK)
            fail_msg("truncated gzip of %zu/%zu bytes accepted", n, c);
    }
    two[c] = 'x';
    assert_int_equal(cm_data_gunzip(two, c + 20, 1 << 20, &out, &olen), CM_EPARSE);
    comp[c - 5] ^= 0xff; /* CRC/length trailer */
    assert_int_equal(cm_data_gunzip(comp, c, 1 << 20, &out, &olen), CM_EPARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_manifests),
        cmocka_unit_test(test_bad_manifests),
        cmocka_unit_test(test_relative_urls),
        cmocka_unit_test(test_manifest_load_errors),
        cmocka_unit_test(test_idx),
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_gunzip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
