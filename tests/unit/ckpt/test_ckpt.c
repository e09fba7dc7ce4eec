/* Unit tests for common/ckpt/ckpt.c: round trips through a file and a
 * buffer, rejection of every truncation and every flipped byte of a real
 * checkpoint, the streaming verifier under every chunking, and the
 * guarantee that a failed write or read leaves the caller's state alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "cm_crypto.h"
#include "cm_err.h"
#include "cm_log.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/ct-ckpt-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A small but complete checkpoint: params, two optimizer buffers, RNG, config. */
struct fixture {
    float params[37];
    float m[37], v[37];
    uint8_t rng[16];
    struct cm_ckpt_buf bufs[2];
    struct cm_ckpt c;
};

static void fixture_init(struct fixture *f)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 37; i++) {
        f->params[i] = (float)i * 0.25f - 3.0f;
        f->m[i] = (float)i * 1e-3f;
        f->v[i] = (float)(i * i) * 1e-6f;
    }
    for (int i = 0; i < 16; i++)
        f->rng[i] = (uint8_t)(i * 11 + 1);
    strcpy(f->bufs[0].name, "adam.m");
    f->bufs[0].data = f->m;
    f->bufs[0].count = 37;
    strcpy(f->bufs[1].name, "adam.v");
    f->bufs[1].data = f->v;
    f->bufs[1].count = 37;
    static char config[] = "{\"model\":\"mlp\",\"lr\":0.001}";
    f->c = (struct cm_ckpt){.step = 1234567, .params = f->params, .n_params = 37, .opt = f->bufs,
                            .n_opt = 2, .rng = f->rng, .rng_len = 16, .config = config,
                            .config_len = (uint32_t)strlen(config)};
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return b;
}

static void assert_same(const struct cm_ckpt *a, const struct cm_ckpt *b)
{
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->n_params, b->n_params);
    assert_memory_equal(a->params, b->params, 4 * a->n_params);
    assert_int_equal(a->n_opt, b->n_opt);
    for (uint32_t i = 0; i < a->n_opt; i++) {
        assert_string_equal(a->opt[i].name, b->opt[i].name);
        assert_int_equal(a->opt[i].count, b->opt[i].count);
        assert_memory_equal(a->opt[i].data, b->opt[i].data, 4 * a->opt[i].count);
    }
    assert_int_equal(a->rng_len, b->rng_len);
    assert_memory_equal(a->rng, b->rng, a->rng_len);
    assert_int_equal(a->config_len, b->config_len);
    assert_memory_equal(a->config, b->config, a->config_len);
}

static void test_roundtrip_file(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    char path[128];
    snprintf(path, sizeof path, "%s/a.ckpt", tmpdir);
    uint8_t h[32], h2[32];
    assert_int_equal(cm_ckpt_write(path, &f.c, h), CM_OK);
    uint64_t size = 0;
    assert_int_equal(cm_ckpt_file_sha256(path, h2, &size), CM_OK);
    assert_memory_equal(h, h2, 32);
    assert_int_equal(size, cm_ckpt_encoded_size(&f.c));
    struct cm_ckpt r;
    assert_int_equal(cm_ckpt_read(path, &r), CM_OK);
    assert_same(&f.c, &r);
    assert_string_equal(r.config, f.c.config); /* NUL-terminated on read */
    assert_non_null(cm_ckpt_find(&r, "adam.v"));
    assert_null(cm_ckpt_find(&r, "adam.x"));
    cm_ckpt_cleanup(&r);
    /* No temporary files left behind. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) -eq 1", tmpdir);
    assert_int_equal(system(cmd), 0);
}

static void test_empty_sections(void **state)
{
    (void)state;
    struct cm_ckpt c = {.step = 0};
    char path[128];
    snprintf(path, sizeof path, "%s/empty.ckpt", tmpdir);
    assert_int_equal(cm_ckpt_encoded_size(&c), CM_CKPT_HEADER_BYTES + CM_CKPT_TRAILER_BYTES);
    assert_int_equal(cm_ckpt_write(path, &c, NULL), CM_OK);
    struct cm_ckpt r;
    assert_int_equal(cm_ckpt_read(path, &r), CM_OK);
    assert_int_equal(r.n_params, 0);
    assert_int_equal(r.n_opt, 0);
    assert_string_equal(r.config, "");
    cm_ckpt_cleanup(&r);
}

static void test_every_truncation_rejected(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    char path[128];
    snprintf(path, sizeof path, "%s/t.ckpt", tmpdir);
    assert_int_equal(cm_ckpt_write(path, &f.c, NULL), CM_OK);
    size_t len;
    uint8_t *b = slurp(path, &len);
    struct cm_ckpt r;
    assert_int_equal(cm_ckpt_parse(b, len, &r), CM_OK);
    cm_ckpt_cleanup(&r);
    for (size_t n = 0; n < len; n++) {
        int rc = cm_ckpt_parse(b, n, &r);
        if (rc == CM_OK)
            fail_msg("truncation to %zu of %zu bytes accepted", n, len);
        assert_int_equal(rc, CM_EPARSE);
        assert_null(r.params);
    }
    /* Truncated on disk, too, and one trailing byte. */
    assert_int_equal(truncate(path, (off_t)len - 1), 0);
    assert_int_equal(cm_ckpt_read(path, &r), CM_EPARSE);
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, b, len);
    longer[len] = 0;
    assert_int_equal(cm_ckpt_parse(longer, len + 1, &r), CM_EPARSE);
    free(longer);
    free(b);
}

static void test_every_flipped_byte_rejected(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    char path[128];
    snprintf(path, sizeof path, "%s/f.ckpt", tmpdir);
    assert_int_equal(cm_ckpt_write(path, &f.c, NULL), CM_OK);
    size_t len;
    uint8_t *b = slurp(path, &len);
    struct cm_ckpt r;
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 7) {
            b[i] ^= (uint8_t)(1u << bit);
            int rc = cm_ckpt_parse(b, len, &r);
            if (rc == CM_OK)
                fail_msg("flipping bit %d of byte %zu was not detected", bit, i);
            b[i] ^= (uint8_t)(1u << bit);
        }
    }
    /* Corruption in the body specifically reports a checksum mismatch. */
    b[len - 40] ^= 0x10;
    assert_int_equal(cm_ckpt_parse(b, len, &r), CM_ECHECKSUM);
    b[len - 40] ^= 0x10;
    /* Wrong version is named as such. */
    b[8] = 2;
    assert_int_equal(cm_ckpt_parse(b, len, &r), CM_EVERSION);
    free(b);
}

static void test_corrupt_file_leaves_old_state(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    char path[128];
    snprintf(path, sizeof path, "%s/c.ckpt", tmpdir);
    assert_int_equal(cm_ckpt_write(path, &f.c, NULL), CM_OK);
    /* An invalid struct is refused and the existing file stays intact. */
    struct cm_ckpt bad = f.c;
    struct cm_ckpt_buf dup[2];
    memcpy(dup, f.bufs, sizeof dup);
    strcpy(dup[1].name, "adam.m");
    bad.opt = dup;
    assert_int_equal(cm_ckpt_write(path, &bad, NULL), CM_EINVAL);
    struct cm_ckpt r;
    assert_int_equal(cm_ckpt_read(path, &r), CM_OK);
    assert_same(&f.c, &r);
    cm_ckpt_cleanup(&r);
    /* Writing into a missing directory fails without side effects. */
    char nodir[160];
    snprintf(nodir, sizeof nodir, "%s/missing/x.ckpt", tmpdir);
    assert_int_equal(cm_ckpt_write(nodir, &f.c, NULL), CM_EIO);
    assert_int_equal(cm_ckpt_read(nodir, &r), CM_ENOTFOUND);
    /* A FIFO (or anything but a regular file) is refused without blocking. */
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/fifo", tmpdir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(cm_ckpt_read(fifo, &r), CM_EIO);
    uint8_t h[32];
    assert_int_equal(cm_ckpt_file_sha256(fifo, h, NULL), CM_EIO);
    unlink(fifo);
}

/* A write that fails half-way (file size limit standing in for a full disk)
 * reports CM_EIO, leaves the previous checkpoint intact and no temporary
 * file behind. */
static void test_failed_write_keeps_old_file(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    char dir[128], path[160];
    snprintf(dir, sizeof dir, "%s/full", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/x.ckpt", dir);
    assert_int_equal(cm_ckpt_write(path, &f.c, NULL), CM_OK);
    float big[4096] = {0};
    struct cm_ckpt c2 = f.c;
    c2.params = big;
    c2.n_params = 4096;
    c2.step = 99;
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 1000;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = cm_ckpt_write(path, &c2, NULL);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, CM_EIO);
    struct cm_ckpt r;
    assert_int_equal(cm_ckpt_read(path, &r), CM_OK);
    assert_same(&f.c, &r);
    cm_ckpt_cleanup(&r);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_limits(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    struct cm_ckpt c = f.c;
    c.n_opt = CM_CKPT_MAX_BUFS + 1;
    assert_int_equal(cm_ckpt_encoded_size(&c), 0);
    c = f.c;
    c.rng_len = CM_CKPT_MAX_RNG + 1;
    assert_int_equal(cm_ckpt_encoded_size(&c), 0);
    c = f.c;
    f.bufs[0].name[0] = '\0';
    assert_int_equal(cm_ckpt_encoded_size(&c), 0);
    /* A header claiming a huge parameter count is refused before allocating. */
    fixture_init(&f);
    char path[128];
    snprintf(path, sizeof path, "%s/l.ckpt", tmpdir);
    assert_int_equal(cm_ckpt_write(path, &f.c, NULL), CM_OK);
    size_t len;
    uint8_t *b = slurp(path, &len);
    struct cm_ckpt r;
    b[32 + 4] = 0xff; /* n_params high bytes */
    assert_int_equal(cm_ckpt_parse(b, len, &r), CM_ETOOBIG);
    b[32 + 4] = 0;
    b[32] = (uint8_t)(b[32] + 1); /* one more param than the file holds */
    assert_int_equal(cm_ckpt_parse(b, len, &r), CM_EPARSE);
    free(b);
}

static void test_stream_verifier(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    char path[128];
    snprintf(path, sizeof path, "%s/s.ckpt", tmpdir);
    uint8_t want[32];
    assert_int_equal(cm_ckpt_write(path, &f.c, want), CM_OK);
    size_t len;
    uint8_t *b = slurp(path, &len);
    size_t chunks[] = {1, 3, 7, 32, 64, 65, 100, 1 << 20};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        struct cm_ckpt_stream s;
        assert_int_equal(cm_ckpt_stream_init(&s, 1 << 20), CM_OK);
        for (size_t off = 0; off < len; off += chunks[ci]) {
            size_t k = len - off < chunks[ci] ? len - off : chunks[ci];
            assert_int_equal(cm_ckpt_stream_update(&s, b + off, k), CM_OK);
        }
        struct cm_ckpt_stream_info info;
        assert_int_equal(cm_ckpt_stream_final(&s, &info), CM_OK);
        assert_memory_equal(info.file_sha256, want, 32);
        assert_int_equal(info.step, f.c.step);
        assert_int_equal(info.n_params, f.c.n_params);
        uint8_t ph[32];
        cm_sha256(f.c.params, 4 * f.c.n_params, ph);
        assert_memory_equal(info.params_sha256, ph, 32);
    }
    struct cm_ckpt_stream s;
    /* Truncated upload. */
    assert_int_equal(cm_ckpt_stream_init(&s, 1 << 20), CM_OK);
    assert_int_equal(cm_ckpt_stream_update(&s, b, len - 1), CM_OK);
    assert_int_equal(cm_ckpt_stream_final(&s, NULL), CM_EPARSE);
    /* Extra byte. */
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, b, len);
    longer[len] = 0;
    assert_int_equal(cm_ckpt_stream_init(&s, 1 << 20), CM_OK);
    assert_int_equal(cm_ckpt_stream_update(&s, longer, len + 1), CM_ETOOBIG);
    assert_int_equal(cm_ckpt_stream_final(&s, NULL), CM_ESTATE);
    free(longer);
    /* Corrupted body byte. */
    b[100] ^= 1;
    assert_int_equal(cm_ckpt_stream_init(&s, 1 << 20), CM_OK);
    assert_int_equal(cm_ckpt_stream_update(&s, b, len), CM_OK);
    assert_int_equal(cm_ckpt_stream_final(&s, NULL), CM_ECHECKSUM);
    b[100] ^= 1;
    /* Declared size above the limit is refused once the header is in. */
    assert_int_equal(cm_ckpt_stream_init(&s, len - 1), CM_OK);
    assert_int_equal(cm_ckpt_stream_update(&s, b, 64), CM_ETOOBIG);
    cm_ckpt_stream_cleanup(&s);
    /* Bad magic is refused at once. */
    b[0] = 'X';
    assert_int_equal(cm_ckpt_stream_init(&s, 1 << 20), CM_OK);
    assert_int_equal(cm_ckpt_stream_update(&s, b, 64), CM_EPARSE);
    cm_ckpt_stream_cleanup(&s);
    b[0] = 'C';
    /* Structure broken under a valid trailer (what an uploader who writes
       his own hash can send): the sections are walked, not only hashed. */
    struct {
        size_t at;
        uint8_t v;
        int rc;
    } broken[] = {
        {40, 1, CM_EPARSE},                        /* n_opt 1: a buffer's bytes left over */
        {64 + 3, 0, CM_EPARSE},                    /* a NUL in the config */
        {len - 32 - 37 * 4 - 8 - 6, 0, CM_EPARSE}, /* a NUL in the second buffer's name */
        {len - 32 - 37 * 4 - 8 - 1, 'm', CM_EPARSE}, /* the second name equals the first */
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        uint8_t *c = malloc(len);
        memcpy(c, b, len);
        c[broken[i].at] = broken[i].v;
        cm_sha256(c, len - 32, c + len - 32);
        struct cm_ckpt r;
        assert_int_not_equal(cm_ckpt_parse(c, len, &r), CM_OK);
        assert_int_equal(cm_ckpt_stream_init(&s, 1 << 20), CM_OK);
        int rc = cm_ckpt_stream_update(&s, c, len);
        if (rc == CM_OK)
            rc = cm_ckpt_stream_final(&s, NULL);
        cm_ckpt_stream_cleanup(&s);
        assert_int_equal(rc, broken[i].rc);
        free(c);
    }
    free(b);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A figure, not a check beyond the round trip: 1M parameters with two
 * AdamW buffers (12 MB), written (hash, fsync, rename) and read back
 * (verify), against a plain write()+fsync() and read() of the same bytes
 * in the same directory. */
static void test_throughput_figure(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    float *p = malloc(3 * sizeof(float) * N);
    for (size_t i = 0; i < 3 * (size_t)N; i++)
        p[i] = (float)i * 1e-6f;
    struct cm_ckpt_buf bufs[2] = {{"adam.m", p + N, N}, {"adam.v", p + 2 * N, N}};
    struct cm_ckpt c = {.step = 1, .params = p, .n_params = N, .opt = bufs, .n_opt = 2};
    char path[128], ref[128];
    snprintf(path, sizeof path, "%s/big.ckpt", tmpdir);
    snprintf(ref, sizeof ref, "%s/big.raw", tmpdir);
    double t0 = now_s();
    assert_int_equal(cm_ckpt_write(path, &c, NULL), CM_OK);
    double tw = now_s() - t0;
    t0 = now_s();
    struct cm_ckpt r;
    assert_int_equal(cm_ckpt_read(path, &r), CM_OK);
    double tr = now_s() - t0;
    assert_memory_equal(r.opt[1].data, p + 2 * N, 4 * (size_t)N);
    cm_ckpt_cleanup(&r);
    t0 = now_s();
    int fd = open(ref, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_int_equal(write(fd, p, 12 * (size_t)N), 12 * (ssize_t)N);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    double rw = now_s() - t0;
    t0 = now_s();
    fd = open(ref, O_RDONLY);
    assert_int_equal(read(fd, p, 12 * (size_t)N), 12 * (ssize_t)N);
    close(fd);
    double rr = now_s() - t0;
    double mb = 12.0 * N / 1e6;
    printf("figure: checkpoint %.1f MB: write %.3f s (%.0f MB/s), plain write+fsync %.3f s, "
           "ratio %.2f; read+verify %.3f s (%.0f MB/s), plain read %.3f s, ratio %.2f\n",
           mb, tw, mb / tw, rw, tw / rw, tr, mb / tr, rr, tr / rr);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_file),
        cmocka_unit_test(test_empty_sections),
        cmocka_unit_test(test_every_truncation_rejected),
        cmocka_unit_test(test_every_flipped_byte_rejected),
        cmocka_unit_test(test_corrupt_file_leaves_old_state),
        cmocka_unit_test(test_failed_write_keeps_old_file),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_stream_verifier),
        cmocka_unit_test(test_throughput_figure),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
