/* Unit tests for common/ckpt/safetensors.c: export/import round trip with
 * metadata and views into one flat buffer, and the strict parser refusing
 * every malformed header we can think of plus every truncation of a valid
 * file (the parser reads untrusted files). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "cm_err.h"

static char tmpdir[64];

/* A file: 8-byte length, header (padded with spaces to pad_to), data_len bytes. */
static uint8_t *mk(const char *hdr, size_t data_len, size_t *len)
{
    size_t h = strlen(hdr);
    *len = 8 + h + data_len;
    uint8_t *b = calloc(1, *len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    for (size_t i = 0; i < data_len; i++)
        b[8 + h + i] = (uint8_t)i;
    return b;
}

static void test_roundtrip(void **state)
{
    (void)state;
    float flat[2 * 3 + 3 + 1];
    for (int i = 0; i < 10; i++)
        flat[i] = (float)i - 4.5f;
    struct cm_st_export t[] = {
        {.name = "w", .ndim = 2, .shape = {2, 3}, .data = flat},
        {.name = "b", .ndim = 1, .shape = {3}, .data = flat + 6},
        {.name = "empty", .ndim = 2, .shape = {0, 5}, .data = flat},
        {.name = "s", .ndim = 0, .data = flat + 9},
    };
    const char *meta[] = {"model", "mlp", "step", "12"};
    char path[128];
    snprintf(path, sizeof path, "%s/m.safetensors", tmpdir);
    assert_int_equal(cm_st_write(path, t, 4, meta, 2), CM_OK);
    struct cm_st_file f;
    assert_int_equal(cm_st_load(path, 1 << 20, &f), CM_OK);
    assert_int_equal(f.n, 4);
    assert_string_equal(cm_st_meta(&f, "model"), "mlp");
    assert_string_equal(cm_st_meta(&f, "step"), "12");
    assert_null(cm_st_meta(&f, "nope"));
    float got[10];
    uint64_t sw[] = {2, 3}, sb[] = {3}, se[] = {0, 5};
    assert_int_equal(cm_st_read_f32(&f, "w", 2, sw, got), CM_OK);
    assert_memory_equal(got, flat, 6 * 4);
    assert_int_equal(cm_st_read_f32(&f, "b", 1, sb, got), CM_OK);
    assert_memory_equal(got, flat + 6, 3 * 4);
    assert_int_equal(cm_st_read_f32(&f, "s", 0, NULL, got), CM_OK);
    assert_true(got[0] == flat[9]);
    assert_int_equal(cm_st_read_f32(&f, "empty", 2, se, got), CM_OK);
    assert_int_equal(cm_st_read_f32(&f, "x", 0, NULL, got), CM_ENOTFOUND);
    const struct cm_st_tensor *w = cm_st_find(&f, "w");
    assert_int_equal(w->dtype, CM_ST_F32);
    assert_int_equal(w->numel, 6);
    /* Data starts 8-aligned: the header is padded. */
    assert_int_equal((w->data - f.owned) % 8, 0);
    cm_st_cleanup(&f);
    /* Too small a size limit is refused before reading. */
    assert_int_equal(cm_st_load(path, 16, &f), CM_ETOOBIG);
}

static void test_writer_refuses_bad_names(void **state)
{
    (void)state;
    float x = 1;
    char path[128];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    struct cm_st_export dup[] = {{.name = "a", .ndim = 0, .data = &x},
                                 {.name = "a", .ndim = 0, .data = &x}};
    assert_int_equal(cm_st_write(path, dup, 2, NULL, 0), CM_EINVAL);
    struct cm_st_export reserved[] = {{.name = "__metadata__", .ndim = 0, .data = &x}};
    assert_int_equal(cm_st_write(path, reserved, 1, NULL, 0), CM_EINVAL);
    struct cm_st_export empty[] = {{.name = "", .ndim = 0, .data = &x}};
    assert_int_equal(cm_st_write(path, empty, 1, NULL, 0), CM_EINVAL);
    assert_int_not_equal(access(path, F_OK), 0); /* nothing written */
}

/* A failed export (file size limit standing in for a full disk) leaves the
 * previous file and no temporary file. */
static void test_failed_write_keeps_old_file(void **state)
{
    (void)state;
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/full", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    float small[2] = {1, 2}, big[4096] = {0};
    struct cm_st_export t1[] = {{.name = "a", .ndim = 1, .shape = {2}, .data = small}};
    struct cm_st_export t2[] = {{.name = "a", .ndim = 1, .shape = {4096}, .data = big}};
    assert_int_equal(cm_st_write(path, t1, 1, NULL, 0), CM_OK);
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 1000;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = cm_st_write(path, t2, 1, NULL, 0);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, CM_EIO);
    struct cm_st_file f;
    assert_int_equal(cm_st_load(path, 1 << 20, &f), CM_OK);
    uint64_t shape[] = {2};
    float got[2];
    assert_int_equal(cm_st_read_f32(&f, "a", 1, shape, got), CM_OK);
    assert_memory_equal(got, small, sizeof small);
    cm_st_cleanup(&f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_parser_strict(void **state)
{
    (void)state;
    static const struct {
        const char *hdr;
        size_t data;
        int rc;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, CM_OK},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ", 8, CM_OK},
        {"{}", 0, CM_OK},
        {"{\"__metadata__\":{\"k\":\"v\"}}", 0, CM_OK},
        {"[]", 0, CM_EPARSE},
        {"{\"a\":1}", 0, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 9, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8,
         CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
         "\"data_offsets\":[0,8]}}", 8, CM_EPARSE},
        /* overlap, hole, duplicate */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, CM_EPARSE},
        {"{\"__metadata__\":{\"k\":1}}", 0, CM_EPARSE},
        {"{\"__metadata__\":[]}", 0, CM_EPARSE},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CM_EPARSE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, CM_EPARSE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        uint8_t *b = mk(cases[i].hdr, cases[i].data, &len);
        struct cm_st_file f;
        int rc = cm_st_parse(b, len, &f);
        if (rc != cases[i].rc)
            fail_msg("case %zu (%s): %s, want %s", i, cases[i].hdr, cm_err_name(rc),
                     cm_err_name(cases[i].rc));
        cm_st_cleanup(&f);
        free(b);
    }
    /* Header length larger than the file, and absurdly large. */
    uint8_t small[16] = {200};
    struct cm_st_file f;
    assert_int_equal(cm_st_parse(small, sizeof small, &f), CM_EPARSE);
    uint8_t huge[16] = {0, 0, 0, 0, 0, 0, 0, 1};
    assert_int_equal(cm_st_parse(huge, sizeof huge, &f), CM_ETOOBIG);
    assert_int_equal(cm_st_parse(small, 7, &f), CM_EPARSE);
}

static void test_every_truncation_rejected(void **state)
{
    (void)state;
    float flat[6] = {1, 2, 3, 4, 5, 6};
    struct cm_st_export t[] = {{.name = "w", .ndim = 2, .shape = {2, 2}, .data = flat},
                               {.name = "b", .ndim = 1, .shape = {2}, .data = flat + 4}};
    char path[128];
    snprintf(path, sizeof path, "%s/t.safetensors", tmpdir);
    assert_int_equal(cm_st_write(path, t, 2, NULL, 0), CM_OK);
    FILE *fp = fopen(path, "rb");
    uint8_t buf[4096];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    struct cm_st_file f;
    assert_int_equal(cm_st_parse(buf, len, &f), CM_OK);
    cm_st_cleanup(&f);
    for (size_t n = 0; n < len; n++)
        if (cm_st_parse(buf, n, &f) == CM_OK)
            fail_msg("truncation to %zu of %zu bytes accepted", n, len);
}

static void test_half_conversions(void **state)
{
    (void)state;
    /* F16: 1.0 = 0x3c00, -2 = 0xc000, smallest subnormal 0x0001, inf 0x7c00;
     * BF16: 1.0 = 0x3f80, -0.5 = 0xbf00. */
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                      "\"g\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
                      "\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[12,16]}}";
    size_t len;
    uint8_t *b = mk(hdr, 16, &len);
    uint8_t *d = b + len - 16;
    const uint8_t vals[16] = {0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00, 0x00, 0x7c,
                              0x80, 0x3f, 0x00, 0xbf, 1, 0, 0, 0};
    memcpy(d, vals, 16);
    struct cm_st_file f;
    assert_int_equal(cm_st_parse(b, len, &f), CM_OK);
    float h[4], g[2], x;
    uint64_t s4[] = {4}, s2[] = {2}, s1[] = {1};
    assert_int_equal(cm_st_read_f32(&f, "h", 1, s4, h), CM_OK);
    assert_true(h[0] == 1.0f && h[1] == -2.0f && h[2] == 5.9604645e-8f && h[3] > 1e38f);
    assert_int_equal(cm_st_read_f32(&f, "g", 1, s2, g), CM_OK);
    assert_true(g[0] == 1.0f && g[1] == -0.5f);
    assert_int_equal(cm_st_read_f32(&f, "i", 1, s1, &x), CM_EUNSUPPORTED);
    cm_st_cleanup(&f);
    free(b);
}

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/ct-st-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_writer_refuses_bad_names),
        cmocka_unit_test(test_failed_write_keeps_old_file),
        cmocka_unit_test(test_parser_strict),
        cmocka_unit_test(test_every_truncation_rejected),
        cmocka_unit_test(test_half_conversions),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
