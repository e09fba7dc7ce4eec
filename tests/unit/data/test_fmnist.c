/* Unit tests for common/data/ over the real Fashion-MNIST files Debian ships
 * (dataset-fashion-mnist): the manifest made by
 * scripts/make-fmnist-manifest.sh parses, the gzip'd IDX shards stream and
 * verify, the splits have 60000 and 10000 examples with 6000 and 1000 per
 * class, pixels are normalized to [0, 1], and the shuffled training stream
 * covers every example once per epoch in a seed-dependent order. */
/* ct-timeout: 300 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "data/data.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct cm_data_manifest *load_manifest(const char *split)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "scripts/make-fmnist-manifest.sh %s", split);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, p);
    assert_int_equal(pclose(p), 0);
    struct cm_data_manifest *m = NULL;
    char err[256];
    int rc = cm_data_manifest_parse(buf, n, &m, err, sizeof err);
    if (rc != CM_OK)
        fail_msg("manifest for %s: %s", split, err);
    return m;
}

/* Reads a whole split in eval mode; checks count, label histogram, pixel range. */
static void check_split(const char *split, size_t want, unsigned per_class, int first_label)
{
    struct cm_data_manifest *m = load_manifest(split);
    assert_int_equal(m->format, CM_DATA_IDX_IMAGES);
    assert_int_equal(m->rows * m->cols, 784);
    struct cm_data_options o;
    cm_data_options_init(&o);
    o.mode = CM_DATA_EVAL;
    struct cm_data_iter *it;
    double t0 = now_s();
    assert_int_equal(cm_data_open(m, 1, &o, &it), CM_OK);
    assert_int_equal(cm_data_example_width(it), 784);
    enum { B = 1000 };
    float *x = malloc(sizeof(float) * B * 784);
    int32_t y[B];
    uint64_t ids[B];
    struct cm_data_batch b = {.capacity = B, .x = x, .y = y, .ids = ids};
    unsigned hist[10] = {0};
    size_t total = 0;
    double sum = 0;
    float lo = 1e9f, hi = -1e9f;
    for (;;) {
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        if (b.n == 0)
            break;
        if (total == 0) {
            assert_int_equal(y[0], first_label);
            assert_int_equal(ids[0], 0);
        }
        for (size_t i = 0; i < b.n; i++) {
            assert_in_range(y[i], 0, 9);
            hist[y[i]]++;
            assert_int_equal(ids[i], total + i); /* eval: manifest order */
        }
        for (size_t i = 0; i < b.n * 784; i++) {
            lo = x[i] < lo ? x[i] : lo;
            hi = x[i] > hi ? x[i] : hi;
            sum += x[i];
        }
        total += b.n;
    }
    double secs = now_s() - t0;
    assert_int_equal(total, want);
    /* A figure, not a check: the whole pass (file:// read, SHA-256, gunzip,
     * IDX decode, normalization to float32), against zlib alone on the
     * images file, measured in the same run. */
    uint8_t *raw = malloc(m->shards[0].data.size), *dec = NULL;
    FILE *fp = fopen(m->shards[0].data.url + 7, "rb");
    assert_non_null(fp);
    assert_int_equal(fread(raw, 1, m->shards[0].data.size, fp), m->shards[0].data.size);
    fclose(fp);
    size_t dlen;
    double g0 = now_s();
    assert_int_equal(cm_data_gunzip(raw, m->shards[0].data.size, 1 << 30, &dec, &dlen), CM_OK);
    double gsecs = now_s() - g0;
    free(raw);
    free(dec);
    printf("figure: %s pass: %zu examples in %.3f s = %.0f examples/s; zlib gunzip of the "
           "images alone %.3f s; ratio pass/gunzip %.2f\n", split, total, secs, total / secs,
           gsecs, secs / gsecs);
    for (int c = 0; c < 10; c++)
        assert_int_equal(hist[c], per_class);
    assert_true(lo == 0.0f && hi == 1.0f);
    /* Fashion-MNIST's mean pixel is about 0.286. */
    double mean = sum / ((double)total * 784);
    assert_true(mean > 0.27 && mean < 0.30);
    struct cm_data_stats st;
    cm_data_get_stats(it, &st);
    assert_int_equal(st.shards_ok, 1);
    assert_int_equal(st.shards_rejected, 0);
    assert_int_equal(st.examples, want);
    /* The pass is over and stays over. */
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, 0);
    cm_data_close(it);
    cm_data_manifest_free(m);
    free(x);
}

static void test_test_split(void **state)
{
    (void)state;
    check_split("test", 10000, 1000, 9);
}

static void test_train_split(void **state)
{
    (void)state;
    check_split("train", 60000, 6000, 9);
}

/* Shuffled stream over the 10000 test images with S = 1000: every example
 * exactly once in epoch 0 and again in epoch 1, seed-dependent order. */
static void test_shuffled_epochs(void **state)
{
    (void)state;
    struct cm_data_manifest *m = load_manifest("test");
    struct cm_data_options o;
    cm_data_options_init(&o);
    o.shuffle_size = 1000;
    enum { N = 10000, B = 500, DRAWS = 3 * N };
    uint32_t *seen = calloc(2 * N, sizeof *seen);
    uint64_t *first = calloc(2 * B, sizeof *first);
    for (int run = 0; run < 2; run++) {
        struct cm_data_iter *it;
        double t0 = now_s();
        assert_int_equal(cm_data_open(m, (uint64_t)run + 7, &o, &it), CM_OK);
        int32_t y[B];
        uint64_t ids[B];
        uint32_t ep[B];
        struct cm_data_batch b = {.capacity = B, .y = y, .ids = ids, .epochs = ep};
        for (int k = 0; k < DRAWS / B; k++) {
            assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
            assert_int_equal(b.n, B);
            if (k == 0)
                memcpy(first + run * B, ids, sizeof ids);
            for (int i = 0; i < B; i++) {
                assert_true(ids[i] < N); /* one shard: shard index 0 */
                assert_true(ep[i] <= 3); /* 30000 draws + 1000 buffered */
                if (ep[i] < 2 && run == 0)
                    seen[ep[i] * N + ids[i]]++;
            }
        }
        printf("figure: shuffled stream (labels and ids only), S=1000, batch %d: %d draws (3 epochs) in %.3f s = "
               "%.0f examples/s\n", B, DRAWS, now_s() - t0, DRAWS / (now_s() - t0));
        struct cm_data_stats st;
        cm_data_get_stats(it, &st);
        assert_int_equal(st.examples, DRAWS);
        assert_true(st.epoch >= 1);
        cm_data_close(it);
    }
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < N; i++)
            if (seen[e * N + i] != 1)
                fail_msg("epoch %d: example %d seen %u times", e, i, seen[e * N + i]);
    /* Different seeds draw differently. */
    int same = 0;
    for (int i = 0; i < B; i++)
        same += first[i] == first[B + i];
    assert_true(same < B / 10);
    free(seen);
    free(first);
    cm_data_manifest_free(m);
}

int main(void)
{
    if (access(FMNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("skipped: %s missing (install dataset-fashion-mnist)\n", FMNIST_DIR);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_test_split),
        cmocka_unit_test(test_train_split),
        cmocka_unit_test(test_shuffled_epochs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
