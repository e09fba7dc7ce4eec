/* Interoperability of our safetensors files with an independent reader and
 * writer: tests/scripts/safetensors_interop.py (Debian's /usr/bin/python3
 * with numpy, and torch when present) checks the values we export, and
 * writes a file (F32, F16, F64 tensors, metadata) that we import. Skips,
 * saying why, when /usr/bin/python3 or numpy is missing. Run from the
 * repository root (as scripts/run-tests.sh does). */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "cm_err.h"

#define PY "/usr/bin/python3"
#define SCRIPT "tests/scripts/safetensors_interop.py"

static char tmpdir[64];

static void test_python_reads_our_export(void **state)
{
    (void)state;
    float w[12], b[4], s = 42.0f;
    for (int i = 0; i < 12; i++)
        w[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 4; i++)
        b[i] = (float)(i * i) / 8.0f - 3.0f;
    /* Views into one flat buffer, as the training code holds them. */
    float flat[17];
    memcpy(flat, w, sizeof w);
    memcpy(flat + 12, b, sizeof b);
    flat[16] = s;
    struct cm_st_export t[] = {
        {.name = "layer1.weight", .ndim = 2, .shape = {3, 4}, .data = flat},
        {.name = "layer1.bias", .ndim = 1, .shape = {4}, .data = flat + 12},
        {.name = "scale", .ndim = 0, .data = flat + 16},
    };
    const char *meta[] = {"format", "pt", "step", "17"};
    char path[128], cmd[512];
    snprintf(path, sizeof path, "%s/ours.safetensors", tmpdir);
    assert_int_equal(cm_st_write(path, t, 3, meta, 2), CM_OK);
    snprintf(cmd, sizeof cmd, PY " " SCRIPT " check %s", path);
    assert_int_equal(system(cmd), 0);
}

static void test_we_read_python_export(void **state)
{
    (void)state;
    char path[128], cmd[512];
    snprintf(path, sizeof path, "%s/theirs.safetensors", tmpdir);
    snprintf(cmd, sizeof cmd, PY " " SCRIPT " write %s", path);
    assert_int_equal(system(cmd), 0);
    struct cm_st_file f;
    assert_int_equal(cm_st_load(path, 1 << 20, &f), CM_OK);
    assert_int_equal(f.n, 3);
    assert_string_equal(cm_st_meta(&f, "source"), "numpy");
    float emb[6], half[5], dbl[4];
    uint64_t s_emb[] = {2, 3}, s_half[] = {5}, s_dbl[] = {2, 2};
    assert_int_equal(cm_st_read_f32(&f, "emb", 2, s_emb, emb), CM_OK);
    for (int i = 0; i < 6; i++)
        assert_true(emb[i] == (float)i * 0.25f);
    assert_int_equal(cm_st_find(&f, "half")->dtype, CM_ST_F16);
    assert_int_equal(cm_st_read_f32(&f, "half", 1, s_half, half), CM_OK);
    const float want_half[] = {0, 1, -2, 0.5f, 65504};
    assert_memory_equal(half, want_half, sizeof half);
    assert_int_equal(cm_st_read_f32(&f, "dbl", 2, s_dbl, dbl), CM_OK);
    const float want_dbl[] = {1e-3f, -2.5f, 3.0f, 1e10f};
    assert_memory_equal(dbl, want_dbl, sizeof dbl);
    /* Wrong expected shape is refused. */
    uint64_t wrong[] = {3, 2};
    assert_int_equal(cm_st_read_f32(&f, "emb", 2, wrong, emb), CM_EINVAL);
    cm_st_cleanup(&f);
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
    if (access(PY, X_OK) != 0) {
        printf("skipped: " PY " not found (Debian python3 with python3-numpy needed)\n");
        return 77;
    }
    if (system(PY " -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("skipped: numpy is not importable by " PY " (install python3-numpy)\n");
        return 77;
    }
    if (access(SCRIPT, R_OK) != 0) {
        printf("%s not found: run from the repository root\n", SCRIPT);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_reads_our_export),
        cmocka_unit_test(test_we_read_python_export),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
