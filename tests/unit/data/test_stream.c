/* Unit tests for the dataset iterator (common/data/iter.c) over synthetic
 * shards served through file:// and a loopback HTTP server in this process:
 * window contents, per-seed shard and example order, every example once per
 * epoch, rejection of shards whose hash or size does not match (their
 * examples never appear), the first batch arriving while a later shard is
 * still downloading, deadlines on stalled transfers, and close() aborting a
 * transfer in progress. */
/* ct-timeout: 120 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "data/data.h"

static char tmpdir[64];
static pid_t tls_pid; /* openssl s_server of test_https, stopped in teardown if a test failed */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* ---- Shard files ---------------------------------------------------------- */

#define NTOK 101 /* tokens per shard: with T = 10, 10 windows */
#define T 10

static uint16_t tok_value(unsigned shard, unsigned i)
{
    return (uint16_t)(shard * 1000 + i);
}

/* An llm.c token shard with tokens tok_value(shard, 0..NTOK-1). */
static uint8_t *token_shard(unsigned shard, size_t *len)
{
    *len = 1024 + 2 * NTOK;
    uint8_t *b = calloc(1, *len);
    uint32_t hdr[3] = {20240520, 1, NTOK};
    memcpy(b, hdr, sizeof hdr);
    for (unsigned i = 0; i < NTOK; i++) {
        uint16_t v = tok_value(shard, i);
        memcpy(b + 1024 + 2 * i, &v, 2);
    }
    return b;
}

/* A token shard of ntok tokens with values tok_value(shard, i) mod 65536. */
static uint8_t *big_token_shard(unsigned shard, unsigned ntok, size_t *len)
{
    *len = 1024 + 2 * (size_t)ntok;
    uint8_t *b = calloc(1, *len);
    uint32_t hdr[3] = {20240520, 1, ntok};
    memcpy(b, hdr, sizeof hdr);
    for (unsigned i = 0; i < ntok; i++) {
        uint16_t v = tok_value(shard, i);
        memcpy(b + 1024 + 2 * (size_t)i, &v, 2);
    }
    return b;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(p, 1, n, fp), n);
    fclose(fp);
}

/* Appends one shard entry to the manifest text. corrupt_hash flips a hash
 * bit; size_delta misstates the size. */
static void add_entry(char *json, size_t cap, const char *url, const uint8_t *b, size_t n,
                      int corrupt_hash, long size_delta)
{
    uint8_t h[32];
    char hex[65];
    cm_sha256(b, n, h);
    if (corrupt_hash)
        h[5] ^= 1;
    cm_hex_encode(h, 32, hex);
    size_t l = strlen(json);
    snprintf(json + l, cap - l, "%s{\"url\": \"%s\", \"size\": %ld, \"sha256\": \"%s\"}",
             json[l - 1] == '[' ? "" : ", ", url, (long)n + size_delta, hex);
}

/* Like add_entry, with per-chunk hashes; chunk bad_chunk (or -1) gets a wrong one. */
static void add_chunked_entry(char *json, size_t cap, const char *url, const uint8_t *b, size_t n,
                              size_t chunk, int bad_chunk)
{
    add_entry(json, cap, url, b, n, 0, 0);
    size_t l = strlen(json) - 1; /* overwrite the closing brace */
    l += (size_t)snprintf(json + l, cap - l, ", \"chunk_size\": %zu, \"chunk_sha256\": [", chunk);
    for (size_t off = 0, i = 0; off < n; off += chunk, i++) {
        uint8_t h[32];
        char hex[65];
        cm_sha256(b + off, n - off < chunk ? n - off : chunk, h);
        if ((int)i == bad_chunk)
            h[0] ^= 1;
        cm_hex_encode(h, 32, hex);
        l += (size_t)snprintf(json + l, cap - l, "%s\"%s\"", i ? ", " : "", hex);
    }
    snprintf(json + l, cap - l, "]}");
}

static struct cm_data_manifest *finish(char *json, size_t cap)
{
    size_t l = strlen(json);
    snprintf(json + l, cap - l, "]}");
    struct cm_data_manifest *m = NULL;
    char err[256];
    int rc = cm_data_manifest_parse(json, strlen(json), &m, err, sizeof err);
    if (rc != CM_OK)
        fail_msg("manifest: %s\n%s", err, json);
    return m;
}

/* A token dataset of n shards on disk; shard `bad` (or -1) gets a wrong hash. */
static struct cm_data_manifest *token_dataset(unsigned n, int bad, long size_delta)
{
    static char json[65536];
    snprintf(json, sizeof json,
             "{\"name\": \"toks\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    for (unsigned s = 0; s < n; s++) {
        size_t len;
        uint8_t *b = token_shard(s, &len);
        char path[128], url[160];
        snprintf(path, sizeof path, "%s/tok%u.bin", tmpdir, s);
        write_file(path, b, len);
        snprintf(url, sizeof url, "file://%s", path);
        add_entry(json, sizeof json, url, b, len, (int)s == bad, (int)s == bad ? size_delta : 0);
        free(b);
    }
    return finish(json, sizeof json);
}

static void opts(struct cm_data_options *o, enum cm_data_mode mode)
{
    cm_data_options_init(o);
    o->mode = mode;
    o->seq_len = T;
    o->shuffle_size = 16;
}

/* Checks a window against the token values of the shard it came from. */
static void check_window(const int32_t *w, uint64_t id)
{
    unsigned shard = (unsigned)(id >> 32), k = (unsigned)(id & 0xffffffffu);
    assert_true(k < (NTOK - 1) / T);
    for (unsigned i = 0; i <= T; i++)
        if (w[i] != tok_value(shard, k * T + i))
            fail_msg("shard %u window %u token %u: %d", shard, k, i, w[i]);
}

/* ---- Tests over file:// ---------------------------------------------------- */

static void test_text_windows(void **state)
{
    (void)state;
    const char *text = "abcdefghijklmnopqrstuvwxyz";
    char path[128], url[160], json[1024];
    snprintf(path, sizeof path, "%s/text.txt", tmpdir);
    write_file(path, text, 26);
    snprintf(url, sizeof url, "file://%s", path);
    snprintf(json, sizeof json, "{\"name\": \"t\", \"format\": \"text-bytes\", \"shards\": [");
    add_entry(json, sizeof json, url, (const uint8_t *)text, 26, 0, 0);
    struct cm_data_manifest *m = finish(json, sizeof json);
    struct cm_data_options o;
    opts(&o, CM_DATA_EVAL);
    o.seq_len = 8;
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    assert_int_equal(cm_data_example_width(it), 9);
    int32_t tok[4 * 9];
    uint16_t u16[4 * 9];
    struct cm_data_batch b = {.capacity = 4, .tokens = tok, .tokens_u16 = u16};
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, 3); /* (26 - 1) / 8 windows of 9 bytes */
    const char *want[] = {"abcdefghi", "ijklmnopq", "qrstuvwxy"};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < 9; i++) {
            assert_int_equal(tok[w * 9 + i], want[w][i]);
            assert_int_equal(u16[w * 9 + i], want[w][i]);
        }
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, 0);
    cm_data_close(it);
    /* A sequence longer than the text gives no example: an error, not a hang. */
    o.mode = CM_DATA_TRAIN;
    o.seq_len = 100;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    assert_int_equal(cm_data_next_batch(it, &b), CM_ERANGE);
    cm_data_close(it);
    /* Missing sequence length is refused at open. */
    o.seq_len = 0;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_EINVAL);
    cm_data_manifest_free(m);
}

/* Synthetic IDX shards: pixel normalization from the manifest, labels
 * paired in order, and the content checks (label range, declared count,
 * image shape) rejecting a shard. */
static void test_idx_shards(void **state)
{
    (void)state;
    enum { N = 5, R = 2, C = 3 };
    uint8_t img[16 + N * R * C] = {0, 0, 8, 3, 0, 0, 0, N, 0, 0, 0, R, 0, 0, 0, C};
    uint8_t lab[8 + N] = {0, 0, 8, 1, 0, 0, 0, N};
    for (int i = 0; i < N * R * C; i++)
        img[16 + i] = (uint8_t)(i * 8);
    for (int i = 0; i < N; i++)
        lab[8 + i] = (uint8_t)(i % 3);
    char ip[128], lp[128], iu[160], lu[160];
    snprintf(ip, sizeof ip, "%s/img.idx", tmpdir);
    snprintf(lp, sizeof lp, "%s/lab.idx", tmpdir);
    write_file(ip, img, sizeof img);
    write_file(lp, lab, sizeof lab);
    snprintf(iu, sizeof iu, "file://%s", ip);
    snprintf(lu, sizeof lu, "file://%s", lp);
    uint8_t hi[32], hl[32];
    char hexi[65], hexl[65];
    cm_sha256(img, sizeof img, hi);
    cm_sha256(lab, sizeof lab, hl);
    cm_hex_encode(hi, 32, hexi);
    cm_hex_encode(hl, 32, hexl);
    struct {
        int rows, classes, examples, rc;
    } cases[] = {{R, 3, N, CM_OK}, {R, 2, N, CM_ERANGE}, {R, 3, N + 1, CM_EPARSE},
                 {R + 1, 3, N, CM_EPARSE}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char json[2048];
        snprintf(json, sizeof json,
                 "{\"name\": \"img\", \"format\": \"idx-images\", \"image\": {\"rows\": %d, "
                 "\"cols\": %d, \"classes\": %d, \"mean\": 0.5, \"std\": 0.25}, \"shards\": ["
                 "{\"url\": \"%s\", \"size\": %zu, \"sha256\": \"%s\", \"examples\": %d, "
                 "\"labels\": {\"url\": \"%s\", \"size\": %zu, \"sha256\": \"%s\"}}]}",
                 cases[k].rows, C, cases[k].classes, iu, sizeof img, hexi, cases[k].examples, lu,
                 sizeof lab, hexl);
        struct cm_data_manifest *m = NULL;
        char err[256];
        assert_int_equal(cm_data_manifest_parse(json, strlen(json), &m, err, sizeof err), CM_OK);
        struct cm_data_options o;
        opts(&o, CM_DATA_EVAL);
        struct cm_data_iter *it;
        assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
        float x[8 * R * C];
        int32_t y[8];
        struct cm_data_batch b = {.capacity = 8, .x = x, .y = y};
        int rc = cm_data_next_batch(it, &b);
        assert_int_equal(rc, cases[k].rc);
        if (rc == CM_OK) {
            assert_int_equal(b.n, N);
            for (int i = 0; i < N; i++) {
                assert_int_equal(y[i], i % 3);
                for (int j = 0; j < R * C; j++) {
                    float want = ((float)img[16 + i * R * C + j] / 255.0f - 0.5f) / 0.25f;
                    assert_true(x[i * R * C + j] == want);
                }
            }
        }
        cm_data_close(it);
        cm_data_manifest_free(m);
    }
}

enum { NSH = 12, PER = (NTOK - 1) / T, TOTAL = NSH * PER };

/* A manifest file with relative URLs, in a directory whose name needs
 * percent-encoding: shards resolve next to the manifest. */
static void test_relative_manifest_file(void **state)
{
    (void)state;
    char dir[160], path[256], mpath[256];
    snprintf(dir, sizeof dir, "%s/data set%%#", tmpdir);
    assert_int_equal(mkdir(dir, 0755), 0);
    size_t len;
    uint8_t *b0 = token_shard(4, &len);
    snprintf(path, sizeof path, "%s/s0.bin", dir);
    write_file(path, b0, len);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"name\": \"rel\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    add_entry(json, sizeof json, "s0.bin", b0, len, 0, 0);
    snprintf(json + strlen(json), sizeof json - strlen(json), "]}");
    snprintf(mpath, sizeof mpath, "%s/m.json", dir);
    write_file(mpath, json, strlen(json));
    struct cm_data_options o;
    opts(&o, CM_DATA_EVAL);
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open_file(mpath, 0, &o, &it), CM_OK);
    assert_non_null(strstr(cm_data_iter_manifest(it)->shards[0].data.url, "/data%20set%25%23/s0.bin"));
    int32_t tok[PER * (T + 1)];
    uint64_t ids[PER];
    struct cm_data_batch b = {.capacity = PER, .tokens = tok, .ids = ids};
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, PER);
    for (int i = 0; i < PER; i++)
        for (unsigned j = 0; j <= T; j++)
            assert_int_equal(tok[i * (T + 1) + j], tok_value(4, (unsigned)i * T + j));
    cm_data_close(it);
    free(b0);
}


/* Draws `draws` examples; returns ids in order; checks each window. */
static void draw(struct cm_data_manifest *m, uint64_t seed, size_t draws, uint64_t *ids_out,
                 uint32_t *ep_out)
{
    struct cm_data_options o;
    opts(&o, CM_DATA_TRAIN);
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, seed, &o, &it), CM_OK);
    enum { B = 8 };
    int32_t tok[B * (T + 1)];
    struct cm_data_batch b = {.capacity = B, .tokens = tok};
    for (size_t k = 0; k < draws; k += B) {
        b.ids = ids_out + k;
        b.epochs = ep_out + k;
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        assert_int_equal(b.n, B);
        for (int i = 0; i < B; i++)
            check_window(tok + i * (T + 1), ids_out[k + i]);
    }
    cm_data_close(it);
}

static void test_shuffle_statistics(void **state)
{
    (void)state;
    struct cm_data_manifest *m = token_dataset(NSH, -1, 0);
    enum { DRAWS = 4 * TOTAL };
    uint64_t *a = calloc(DRAWS, 8), *a2 = calloc(DRAWS, 8), *c = calloc(DRAWS, 8);
    uint32_t *ea = calloc(DRAWS, 4), *ea2 = calloc(DRAWS, 4), *ec = calloc(DRAWS, 4);
    draw(m, 1, DRAWS, a, ea);
    draw(m, 1, DRAWS, a2, ea2);
    draw(m, 2, DRAWS, c, ec);
    /* Same seed, same stream, whatever the thread timing. */
    assert_memory_equal(a, a2, DRAWS * 8);
    assert_memory_equal(ea, ea2, DRAWS * 4);
    /* Epochs 0..2 are complete within 4 epochs of draws (S = 16 << 120):
     * every example exactly once per epoch, for both seeds. */
    for (int run = 0; run < 2; run++) {
        const uint64_t *ids = run ? c : a;
        const uint32_t *ep = run ? ec : ea;
        for (uint32_t e = 0; e < 3; e++) {
            unsigned seen[NSH][PER] = {{0}};
            for (size_t i = 0; i < DRAWS; i++)
                if (ep[i] == e)
                    seen[ids[i] >> 32][ids[i] & 0xffffffffu]++;
            for (int s = 0; s < NSH; s++)
                for (int k = 0; k < PER; k++)
                    if (seen[s][k] != 1)
                        fail_msg("seed run %d epoch %u: shard %d window %d seen %u times", run, e,
                                 s, k, seen[s][k]);
        }
        /* Epochs advance in order: epoch e+1 never before the buffer fills with it. */
        for (size_t i = 1; i < DRAWS; i++)
            assert_true(ep[i] + 1 >= ep[i - 1]);
    }
    /* Different seeds: different shard order and different draws. */
    int same = 0;
    for (size_t i = 0; i < DRAWS; i++)
        same += a[i] == c[i];
    assert_true(same < DRAWS / 20);
    /* The shard order is a fresh permutation each epoch: compare the order in
     * which shards first appear in epoch 0 and epoch 1. */
    int first_e0[NSH], first_e1[NSH], n0 = 0, n1 = 0, seen0[NSH] = {0}, seen1[NSH] = {0};
    for (size_t i = 0; i < DRAWS; i++) {
        int s = (int)(a[i] >> 32);
        if (ea[i] == 0 && !seen0[s])
            seen0[s] = 1, first_e0[n0++] = s;
        if (ea[i] == 1 && !seen1[s])
            seen1[s] = 1, first_e1[n1++] = s;
    }
    assert_int_equal(n0, NSH);
    assert_int_equal(n1, NSH);
    assert_memory_not_equal(first_e0, first_e1, sizeof first_e0);
    free(a), free(a2), free(c), free(ea), free(ea2), free(ec);
    cm_data_manifest_free(m);
}

/* Skipping n examples lands exactly where n drawn examples would. */
static void test_skip_resumes_stream(void **state)
{
    (void)state;
    struct cm_data_manifest *m = token_dataset(NSH, -1, 0);
    enum { N = 2 * TOTAL + 40 };
    uint64_t *ids = calloc(N, 8);
    uint32_t *ep = calloc(N, 4);
    draw(m, 9, N, ids, ep);
    for (uint64_t skip = 0; skip < N - 8; skip += 97) {
        struct cm_data_options o;
        opts(&o, CM_DATA_TRAIN);
        struct cm_data_iter *it;
        assert_int_equal(cm_data_open(m, 9, &o, &it), CM_OK);
        assert_int_equal(cm_data_skip(it, skip), CM_OK);
        uint64_t got[8];
        int32_t tok[8 * (T + 1)];
        struct cm_data_batch b = {.capacity = 8, .tokens = tok, .ids = got};
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        assert_memory_equal(got, ids + skip, sizeof got);
        struct cm_data_stats st;
        cm_data_get_stats(it, &st);
        assert_int_equal(st.examples, skip + 8);
        cm_data_close(it);
    }
    free(ids);
    free(ep);
    cm_data_manifest_free(m);
}

static void test_hash_mismatch_rejected(void **state)
{
    (void)state;
    struct cm_data_manifest *m = token_dataset(4, 2, 0);
    /* Train mode: shard 2 is skipped, its examples never appear. */
    enum { DRAWS = 3 * 3 * PER };
    uint64_t ids[DRAWS];
    uint32_t ep[DRAWS];
    struct cm_data_options o;
    opts(&o, CM_DATA_TRAIN);
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 5, &o, &it), CM_OK);
    int32_t tok[DRAWS * (T + 1)];
    struct cm_data_batch b = {.capacity = DRAWS, .tokens = tok, .ids = ids, .epochs = ep};
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    for (int i = 0; i < DRAWS; i++) {
        assert_int_not_equal(ids[i] >> 32, 2);
        check_window(tok + i * (T + 1), ids[i]);
    }
    struct cm_data_stats st;
    cm_data_get_stats(it, &st);
    assert_true(st.shards_rejected >= 1);
    assert_non_null(strstr(st.last_error, "SHA-256 mismatch"));
    assert_non_null(strstr(st.last_error, "tok2.bin"));
    cm_data_close(it);
    /* Without skipping, the stream fails with the reason. */
    o.skip_bad_shards = 0;
    assert_int_equal(cm_data_open(m, 5, &o, &it), CM_OK);
    int rc = CM_OK;
    for (int k = 0; k < 10 && rc == CM_OK; k++)
        rc = cm_data_next_batch(it, &b);
    assert_int_equal(rc, CM_ECHECKSUM);
    assert_int_equal(cm_data_next_batch(it, &b), CM_ECHECKSUM); /* stays failed */
    cm_data_close(it);
    /* Eval mode: shards 0 and 1 come through, then the error. */
    opts(&o, CM_DATA_EVAL);
    assert_int_equal(cm_data_open(m, 5, &o, &it), CM_OK);
    b.capacity = PER;
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, PER);
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(ids[0] >> 32, 1);
    assert_int_equal(cm_data_next_batch(it, &b), CM_ECHECKSUM);
    cm_data_close(it);
    cm_data_manifest_free(m);

    /* Declared size off by one either way. */
    for (long d = -1; d <= 1; d += 2) {
        m = token_dataset(2, 1, d);
        opts(&o, CM_DATA_EVAL);
        assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
        b.capacity = 2 * PER;
        /* Shard 0's examples first, then the error for shard 1. */
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        assert_int_equal(b.n, PER);
        assert_int_equal(cm_data_next_batch(it, &b), CM_ECHECKSUM);
        assert_int_equal(b.n, 0);
        cm_data_get_stats(it, &st);
        assert_non_null(strstr(st.last_error, "declare"));
        cm_data_close(it);
        cm_data_manifest_free(m);
    }
}

static void test_all_shards_bad(void **state)
{
    (void)state;
    char json[4096];
    snprintf(json, sizeof json,
             "{\"name\": \"bad\", \"format\": \"tokens-u16\", \"vocab_size\": 100, \"shards\": [");
    size_t len;
    uint8_t *b0 = token_shard(0, &len);
    char path[128], url[160];
    snprintf(path, sizeof path, "%s/vocab.bin", tmpdir);
    write_file(path, b0, len);
    snprintf(url, sizeof url, "file://%s", path);
    add_entry(json, sizeof json, url, b0, len, 0, 0); /* tokens up to 100 >= vocab 100 */
    add_entry(json, sizeof json, "file:///nonexistent/shard.bin", b0, len, 0, 0);
    free(b0);
    struct cm_data_manifest *m = finish(json, sizeof json);
    struct cm_data_options o;
    opts(&o, CM_DATA_TRAIN);
    o.retries = 0;
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    int32_t tok[T + 1];
    struct cm_data_batch b = {.capacity = 1, .tokens = tok};
    int rc = cm_data_next_batch(it, &b);
    assert_true(rc == CM_ERANGE || rc == CM_ENOTFOUND);
    struct cm_data_stats st;
    cm_data_get_stats(it, &st);
    assert_int_equal(st.shards_rejected, 2);
    cm_data_close(it);
    /* Eval mode names the vocabulary problem. */
    opts(&o, CM_DATA_EVAL);
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    assert_int_equal(cm_data_next_batch(it, &b), CM_ERANGE);
    cm_data_get_stats(it, &st);
    assert_non_null(strstr(st.last_error, "vocab_size"));
    cm_data_close(it);
    /* A shard larger than max_shard_bytes is refused at open. */
    o.max_shard_bytes = 100;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_ETOOBIG);
    cm_data_manifest_free(m);
}

/* ---- Loopback HTTP server ------------------------------------------------- */

/* R_DROP_HALF: the first request gets half the body and a closed connection;
 * later ones honour "Range: bytes=N-" (206). R_DROP_NORANGE: the same first,
 * then always the whole body (200), as a server without range support. */
enum route_mode { R_NORMAL, R_STALL_HALF, R_HANG, R_DROP_HALF, R_DROP_NORANGE };

struct route {
    const char *path;
    const uint8_t *body;
    size_t len;
    enum route_mode mode;
    int hits;                /* requests served, under S.mu */
};

static struct srv {
    int lfd, port;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_open, stop;
    size_t stalled_sent;     /* bytes of a stalled body sent so far */
    int stalled_done;
    struct route routes[8];
    int nroutes;
    pthread_t conns[64];
    int nconns;
    long range_start;        /* start of the last Range request, -1 if none */
} S;

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        c += k;
        n -= (size_t)k;
    }
}

static void wait_gate(void)
{
    pthread_mutex_lock(&S.mu);
    while (!S.gate_open && !S.stop)
        pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
}

static void *conn_main(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char req[4096] = "";
    size_t got = 0;
    while (got < sizeof req - 1 && !strstr(req, "\r\n\r\n")) {
        ssize_t k = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
        req[got] = '\0';
    }
    req[got] = '\0';
    char path[256] = "";
    sscanf(req, "GET %255s", path);
    struct route *r = NULL;
    long range = -1;
    const char *rh = strstr(req, "Range: bytes=");
    if (rh)
        range = strtol(rh + 13, NULL, 10);
    int hits = 0;
    pthread_mutex_lock(&S.mu);
    for (int i = 0; i < S.nroutes; i++)
        if (strcmp(S.routes[i].path, path) == 0)
            r = &S.routes[i];
    if (r)
        hits = ++r->hits;
    if (rh)
        S.range_start = range;
    pthread_mutex_unlock(&S.mu);
    if (r && (r->mode == R_DROP_HALF || r->mode == R_DROP_NORANGE)) {
        char h[256];
        if (hits == 1) {
            snprintf(h, sizeof h, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n", r->len);
            send_all(fd, h, strlen(h));
            send_all(fd, r->body, r->len / 2);
        } else if (r->mode == R_DROP_HALF && range >= 0 && (size_t)range < r->len) {
            snprintf(h, sizeof h, "HTTP/1.1 206 Partial Content\r\nContent-Length: %zu\r\n"
                     "Content-Range: bytes %ld-%zu/%zu\r\nConnection: close\r\n\r\n",
                     r->len - (size_t)range, range, r->len - 1, r->len);
            send_all(fd, h, strlen(h));
            send_all(fd, r->body + range, r->len - (size_t)range);
        } else {
            snprintf(h, sizeof h, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n", r->len);
            send_all(fd, h, strlen(h));
            send_all(fd, r->body, r->len);
        }
        close(fd);
        return NULL;
    }
    char hdr[256];
    if (!r) {
        snprintf(hdr, sizeof hdr, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
                 "Connection: close\r\n\r\n");
        send_all(fd, hdr, strlen(hdr));
    } else {
        snprintf(hdr, sizeof hdr, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n", r->len);
        send_all(fd, hdr, strlen(hdr));
        if (r->mode == R_NORMAL) {
            send_all(fd, r->body, r->len);
        } else if (r->mode == R_STALL_HALF) {
            send_all(fd, r->body, r->len / 2);
            pthread_mutex_lock(&S.mu);
            S.stalled_sent = r->len / 2;
            pthread_mutex_unlock(&S.mu);
            wait_gate();
            send_all(fd, r->body + r->len / 2, r->len - r->len / 2);
            pthread_mutex_lock(&S.mu);
            S.stalled_sent = r->len;
            S.stalled_done = 1;
            pthread_mutex_unlock(&S.mu);
        } else {
            wait_gate(); /* sends nothing */
        }
    }
    close(fd);
    return NULL;
}

static void *accept_main(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&S.mu);
        int stop = S.stop;
        pthread_mutex_unlock(&S.mu);
        if (stop)
            break;
        struct pollfd p = {.fd = S.lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(S.lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&S.mu);
        if (S.nconns < 64 &&
            pthread_create(&S.conns[S.nconns], NULL, conn_main, (void *)(intptr_t)fd) == 0)
            S.nconns++;
        else
            close(fd);
        pthread_mutex_unlock(&S.mu);
    }
    return NULL;
}

static void srv_start(void)
{
    memset(&S, 0, sizeof S);
    S.range_start = -1;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);
    S.lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(S.lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(S.lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(S.lfd, 16), 0);
    socklen_t al = sizeof a;
    getsockname(S.lfd, (struct sockaddr *)&a, &al);
    S.port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&S.th, NULL, accept_main, NULL), 0);
}

static void srv_add(const char *path, const uint8_t *body, size_t len, enum route_mode mode)
{
    S.routes[S.nroutes++] = (struct route){path, body, len, mode, 0};
}

static void srv_open_gate(void)
{
    pthread_mutex_lock(&S.mu);
    S.gate_open = 1;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

static void srv_stop(void)
{
    pthread_mutex_lock(&S.mu);
    S.stop = 1;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    pthread_join(S.th, NULL);
    for (int i = 0; i < S.nconns; i++)
        pthread_join(S.conns[i], NULL);
    close(S.lfd);
    pthread_cond_destroy(&S.cv);
    pthread_mutex_destroy(&S.mu);
}

static void http_url(char *out, size_t cap, const char *path)
{
    snprintf(out, cap, "http://127.0.0.1:%d%s", S.port, path);
}

/* The first examples are handed out while a later shard is still arriving. */
static void test_http_first_batch_before_download_ends(void **state)
{
    (void)state;
    size_t la, lb;
    uint8_t *a = token_shard(0, &la), *bb = token_shard(1, &lb);
    srv_start();
    srv_add("/a.bin", a, la, R_NORMAL);
    srv_add("/b.bin", bb, lb, R_STALL_HALF);
    char json[4096], url[128];
    snprintf(json, sizeof json,
             "{\"name\": \"h\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    http_url(url, sizeof url, "/a.bin");
    add_entry(json, sizeof json, url, a, la, 0, 0);
    http_url(url, sizeof url, "/b.bin");
    add_entry(json, sizeof json, url, bb, lb, 0, 0);
    struct cm_data_manifest *m = finish(json, sizeof json);
    struct cm_data_options o;
    opts(&o, CM_DATA_EVAL);
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    int32_t tok[PER * (T + 1)];
    uint64_t ids[PER];
    struct cm_data_batch b = {.capacity = PER, .tokens = tok, .ids = ids};
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, PER);
    for (int i = 0; i < PER; i++)
        check_window(tok + i * (T + 1), ids[i]);
    /* Shard b is still half-sent: the batch did not wait for the whole dataset. */
    pthread_mutex_lock(&S.mu);
    int done = S.stalled_done;
    pthread_mutex_unlock(&S.mu);
    assert_false(done);
    srv_open_gate();
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, PER);
    assert_int_equal(ids[0] >> 32, 1);
    for (int i = 0; i < PER; i++)
        check_window(tok + i * (T + 1), ids[i]);
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, 0);
    struct cm_data_stats st;
    cm_data_get_stats(it, &st);
    assert_int_equal(st.bytes_downloaded, la + lb);
    assert_int_equal(st.shards_ok, 2);
    cm_data_close(it);
    srv_stop();
    cm_data_manifest_free(m);
    free(a);
    free(bb);
}

/* With chunk hashes, the examples of verified chunks are handed out while
 * the same shard is still downloading; a corrupt chunk stops the shard
 * there, and the examples before it stay valid. */
static void test_http_chunked_release(void **state)
{
    (void)state;
    enum { NT = 4001, CH = 1024 }; /* 400 windows of T+1 tokens, 9 KiB, 9 chunks */
    size_t la;
    uint8_t *a = big_token_shard(3, NT, &la);
    srv_start();
    srv_add("/big.bin", a, la, R_STALL_HALF);
    srv_add("/big2.bin", a, la, R_NORMAL);
    char json[8192], url[128];
    snprintf(json, sizeof json,
             "{\"name\": \"c\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    http_url(url, sizeof url, "/big.bin");
    add_chunked_entry(json, sizeof json, url, a, la, CH, -1);
    struct cm_data_manifest *m = finish(json, sizeof json);
    assert_int_equal(m->shards[0].data.n_chunks, (la + CH - 1) / CH);
    struct cm_data_options o;
    opts(&o, CM_DATA_EVAL);
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    enum { B = 100 };
    int32_t tok[B * (T + 1)];
    uint64_t ids[B];
    struct cm_data_batch b = {.capacity = B, .tokens = tok, .ids = ids};
    /* The server has sent half of the shard and waits: 100 windows need
     * 1024 + 2 * 1001 bytes, within the first 4 verified chunks. */
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, B);
    pthread_mutex_lock(&S.mu);
    int done = S.stalled_done;
    pthread_mutex_unlock(&S.mu);
    assert_false(done);
    uint64_t seen = 0;
    for (;;) {
        for (size_t i = 0; i < b.n; i++) {
            assert_int_equal(ids[i], seen); /* shard 0, windows in order */
            for (unsigned j = 0; j <= T; j++)
                assert_int_equal(tok[i * (T + 1) + j], tok_value(3, (unsigned)seen * T + j));
            seen++;
        }
        if (seen == B)
            srv_open_gate();
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        if (b.n == 0)
            break;
    }
    assert_int_equal(seen, (NT - 1) / T);
    cm_data_close(it);
    cm_data_manifest_free(m);

    /* Chunk 4 corrupt: windows wholly inside chunks 0..3 come through, then the error. */
    snprintf(json, sizeof json,
             "{\"name\": \"c\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    http_url(url, sizeof url, "/big2.bin");
    add_chunked_entry(json, sizeof json, url, a, la, CH, 4);
    m = finish(json, sizeof json);
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    uint64_t got = 0;
    int rc;
    while ((rc = cm_data_next_batch(it, &b)) == CM_OK && b.n > 0)
        got += b.n;
    assert_int_equal(rc, CM_ECHECKSUM);
    /* 4 chunks = 4096 bytes = 1536 tokens after the header: windows 0..152. */
    assert_int_equal(got, (4 * CH - 1024) / 2 / T - ((4 * CH - 1024) / 2 % T == 0));
    struct cm_data_stats st;
    cm_data_get_stats(it, &st);
    assert_non_null(strstr(st.last_error, "chunk 4"));
    assert_int_equal(st.shards_rejected, 1);
    cm_data_close(it);
    cm_data_manifest_free(m);
    srv_open_gate();
    srv_stop();
    free(a);
}

/* A connection that drops mid-shard: a chunked shard resumes after its last
 * verified chunk with a range request, and every window arrives exactly
 * once; a server without range support ends the shard where it broke. */
static void test_http_chunked_resume(void **state)
{
    (void)state;
    enum { NT = 4001, CH = 1024 };
    size_t la;
    uint8_t *a = big_token_shard(5, NT, &la);
    srv_start();
    srv_add("/drop.bin", a, la, R_DROP_HALF);
    srv_add("/norange.bin", a, la, R_DROP_NORANGE);
    const char *paths[] = {"/drop.bin", "/norange.bin"};
    for (int k = 0; k < 2; k++) {
        char json[8192], url[128];
        snprintf(json, sizeof json, "{\"name\": \"r\", \"format\": \"tokens-u16\", "
                 "\"vocab_size\": 65536, \"shards\": [");
        http_url(url, sizeof url, paths[k]);
        add_chunked_entry(json, sizeof json, url, a, la, CH, -1);
        struct cm_data_manifest *m = finish(json, sizeof json);
        struct cm_data_options o;
        opts(&o, CM_DATA_EVAL);
        o.retries = 2;
        struct cm_data_iter *it;
        assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
        enum { B = 64 };
        int32_t tok[B * (T + 1)];
        uint64_t ids[B];
        struct cm_data_batch b = {.capacity = B, .tokens = tok, .ids = ids};
        uint64_t seen = 0;
        int rc;
        while ((rc = cm_data_next_batch(it, &b)) == CM_OK && b.n > 0)
            for (size_t i = 0; i < b.n; i++, seen++) {
                assert_int_equal(ids[i], seen);
                for (unsigned j = 0; j <= T; j++)
                    assert_int_equal(tok[i * (T + 1) + j], tok_value(5, (unsigned)seen * T + j));
            }
        pthread_mutex_lock(&S.mu);
        int hits = S.routes[k].hits;
        long range = S.range_start;
        pthread_mutex_unlock(&S.mu);
        /* Half of 9026 bytes = 4513: chunks 0..3 verified, resume at 4096. */
        assert_int_equal(range, 4 * CH);
        if (k == 0) {
            assert_int_equal(rc, CM_OK);
            assert_int_equal(seen, (NT - 1) / T);
            assert_int_equal(hits, 2);
        } else {
            assert_int_equal(rc, CM_EUNSUPPORTED);
            assert_int_equal(seen, ((4 * CH - 1024) / 2 - 1) / T); /* windows in 4 chunks: 153 */
            assert_int_equal(hits, 2);
        }
        struct cm_data_stats st;
        cm_data_get_stats(it, &st);
        /* The refused 200 body is never written: curl stops at the status. */
        assert_int_equal(st.bytes_downloaded, k == 0 ? la / 2 + (la - 4 * CH) : la / 2);
        cm_data_close(it);
        cm_data_manifest_free(m);
    }
    srv_stop();
    free(a);
}

/* With cache_dir, later epochs read verified shards from disk: the server
 * sees one request per shard; a corrupted cache file is downloaded again. */
static void test_http_cache(void **state)
{
    (void)state;
    enum { NC = 3 };
    uint8_t *bufs[NC];
    size_t lens[NC];
    srv_start();
    char json[8192], url[128], paths[NC][16];
    snprintf(json, sizeof json,
             "{\"name\": \"cache\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    for (int i = 0; i < NC; i++) {
        bufs[i] = token_shard((unsigned)i, &lens[i]);
        snprintf(paths[i], sizeof paths[i], "/c%d.bin", i);
        srv_add(paths[i], bufs[i], lens[i], R_NORMAL);
        http_url(url, sizeof url, paths[i]);
        add_entry(json, sizeof json, url, bufs[i], lens[i], 0, 0);
    }
    struct cm_data_manifest *m = finish(json, sizeof json);
    char cache[128];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    struct cm_data_options o;
    opts(&o, CM_DATA_TRAIN);
    o.shuffle_size = 4;
    o.cache_dir = cache;
    for (int run = 0; run < 2; run++) {
        struct cm_data_iter *it;
        assert_int_equal(cm_data_open(m, 1, &o, &it), CM_OK);
        enum { B = 10 };
        int32_t tok[B * (T + 1)];
        uint64_t ids[B];
        struct cm_data_batch b = {.capacity = B, .tokens = tok, .ids = ids};
        for (int k = 0; k < 4 * NC * PER / B; k++) {
            assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
            for (int i = 0; i < B; i++)
                check_window(tok + i * (T + 1), ids[i]);
        }
        struct cm_data_stats st;
        cm_data_get_stats(it, &st);
        cm_data_close(it);
        pthread_mutex_lock(&S.mu);
        int h0 = S.routes[0].hits, h1 = S.routes[1].hits, h2 = S.routes[2].hits;
        pthread_mutex_unlock(&S.mu);
        if (run == 0) {
            /* 4 epochs drawn, each shard fetched from the server once. */
            assert_int_equal(h0, 1);
            assert_int_equal(h1, 1);
            assert_int_equal(h2, 1);
            assert_true(st.cache_hits >= 2 * NC);
            /* Corrupt shard 1's cache file: the next run must fetch it again. */
            uint8_t h[32];
            char hex[65], path[256];
            cm_sha256(bufs[1], lens[1], h);
            cm_hex_encode(h, 32, hex);
            snprintf(path, sizeof path, "%s/%s", cache, hex);
            FILE *fp = fopen(path, "r+b");
            assert_non_null(fp);
            fseek(fp, 1100, SEEK_SET);
            fputc(0x55, fp);
            fclose(fp);
        } else {
            assert_int_equal(h0, 1);
            assert_int_equal(h1, 2);
            assert_int_equal(h2, 1);
        }
    }
    srv_stop();
    cm_data_manifest_free(m);
    for (int i = 0; i < NC; i++)
        free(bufs[i]);
}

/* A server that stops sending trips the low-speed deadline; a 404 and a
 * refused connection are errors too, each with its own code. */
static void test_http_deadlines_and_errors(void **state)
{
    (void)state;
    size_t la;
    uint8_t *a = token_shard(0, &la);
    srv_start();
    srv_add("/hang.bin", a, la, R_HANG);
    const char *paths[] = {"/hang.bin", "/missing.bin"};
    int want[] = {CM_ETIMEOUT, CM_EIO};
    for (int k = 0; k < 2; k++) {
        char json[4096], url[128];
        snprintf(json, sizeof json,
                 "{\"name\": \"h\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
        http_url(url, sizeof url, paths[k]);
        add_entry(json, sizeof json, url, a, la, 0, 0);
        struct cm_data_manifest *m = finish(json, sizeof json);
        struct cm_data_options o;
        opts(&o, CM_DATA_EVAL);
        o.low_speed_bytes = 1;
        o.low_speed_time_s = 1;
        o.retries = 0;
        struct cm_data_iter *it;
        assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
        int32_t tok[T + 1];
        struct cm_data_batch b = {.capacity = 1, .tokens = tok};
        double t0 = now_s();
        assert_int_equal(cm_data_next_batch(it, &b), want[k]);
        assert_true(now_s() - t0 < 10);
        struct cm_data_stats st;
        cm_data_get_stats(it, &st);
        if (k == 1)
            assert_non_null(strstr(st.last_error, "404"));
        cm_data_close(it);
        cm_data_manifest_free(m);
    }
    srv_open_gate();
    srv_stop();

    /* Nobody listening: connection refused, after the configured retries. */
    char json[4096];
    snprintf(json, sizeof json,
             "{\"name\": \"h\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    add_entry(json, sizeof json, "http://127.0.0.1:1/x.bin", a, la, 0, 0);
    struct cm_data_manifest *m = finish(json, sizeof json);
    struct cm_data_options o;
    opts(&o, CM_DATA_EVAL);
    o.retries = 1;
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    int32_t tok[T + 1];
    struct cm_data_batch b = {.capacity = 1, .tokens = tok};
    assert_int_equal(cm_data_next_batch(it, &b), CM_ECONN);
    cm_data_close(it);
    cm_data_manifest_free(m);
    free(a);
}

/* https through a real TLS server (openssl s_server -WWW serving the shard
 * files): accepted with the test CA in ca_file, refused without it. */
static void test_https(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
             "-nodes -keyout key.pem -out cert.pem -days 1 -subj /CN=localhost "
             "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 >/dev/null 2>&1", tmpdir);
    assert_int_equal(system(cmd), 0);
    /* A free port: bind to 0, read it, release it for s_server. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &al);
    int port = ntohs(a.sin_port);
    close(fd);
    char accept_arg[64];
    snprintf(accept_arg, sizeof accept_arg, "127.0.0.1:%d", port);
    pid_t pid = fork();
    assert_true(pid >= 0);
    tls_pid = pid;
    if (pid == 0) {
        if (chdir(tmpdir) != 0)
            _exit(126);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execlp("openssl", "openssl", "s_server", "-accept", accept_arg, "-cert", "cert.pem",
               "-key", "key.pem", "-WWW", "-quiet", (char *)NULL);
        _exit(127);
    }
    int up = 0;
    for (int i = 0; i < 200 && !up; i++) { /* up to 10 s on a loaded machine */
        int c = socket(AF_INET, SOCK_STREAM, 0);
        up = connect(c, (struct sockaddr *)&a, sizeof a) == 0;
        close(c);
        if (!up) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    assert_true(up);
    size_t len;
    uint8_t *b0 = token_shard(0, &len);
    char path[128], url[160], json[4096], ca[128];
    snprintf(path, sizeof path, "%s/tls0.bin", tmpdir);
    write_file(path, b0, len);
    snprintf(url, sizeof url, "https://127.0.0.1:%d/tls0.bin", port);
    snprintf(ca, sizeof ca, "%s/cert.pem", tmpdir);
    snprintf(json, sizeof json,
             "{\"name\": \"tls\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    add_entry(json, sizeof json, url, b0, len, 0, 0);
    struct cm_data_manifest *m = finish(json, sizeof json);
    struct cm_data_options o;
    opts(&o, CM_DATA_EVAL);
    o.retries = 0;
    o.ca_file = ca;
    struct cm_data_iter *it;
    int32_t tok[PER * (T + 1)];
    uint64_t ids[PER];
    struct cm_data_batch b = {.capacity = PER, .tokens = tok, .ids = ids};
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
    assert_int_equal(b.n, PER);
    for (int i = 0; i < PER; i++)
        check_window(tok + i * (T + 1), ids[i]);
    cm_data_close(it);
    /* Without our CA the self-signed certificate is refused. */
    o.ca_file = NULL;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    assert_int_equal(cm_data_next_batch(it, &b), CM_EAUTH);
    struct cm_data_stats st;
    cm_data_get_stats(it, &st);
    assert_non_null(strstr(st.last_error, "certificate"));
    cm_data_close(it);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    tls_pid = 0;
    cm_data_manifest_free(m);
    free(b0);
}

/* close() does not wait for a stalled transfer's deadline. */
static void test_close_aborts_transfer(void **state)
{
    (void)state;
    size_t la;
    uint8_t *a = token_shard(0, &la);
    srv_start();
    srv_add("/hang.bin", a, la, R_HANG);
    char json[4096], url[128];
    snprintf(json, sizeof json,
             "{\"name\": \"h\", \"format\": \"tokens-u16\", \"vocab_size\": 65536, \"shards\": [");
    http_url(url, sizeof url, "/hang.bin");
    add_entry(json, sizeof json, url, a, la, 0, 0);
    struct cm_data_manifest *m = finish(json, sizeof json);
    struct cm_data_options o;
    opts(&o, CM_DATA_TRAIN); /* default deadlines: 30 s low-speed */
    struct cm_data_iter *it;
    assert_int_equal(cm_data_open(m, 0, &o, &it), CM_OK);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    double t0 = now_s();
    cm_data_close(it);
    assert_true(now_s() - t0 < 5);
    srv_open_gate();
    srv_stop();
    cm_data_manifest_free(m);
    free(a);
}

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/ct-data-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    if (tls_pid > 0) {
        kill(tls_pid, SIGTERM);
        waitpid(tls_pid, NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_windows),
        cmocka_unit_test(test_idx_shards),
        cmocka_unit_test(test_relative_manifest_file),
        cmocka_unit_test(test_shuffle_statistics),
        cmocka_unit_test(test_skip_resumes_stream),
        cmocka_unit_test(test_hash_mismatch_rejected),
        cmocka_unit_test(test_all_shards_bad),
        cmocka_unit_test(test_http_first_batch_before_download_ends),
        cmocka_unit_test(test_http_chunked_release),
        cmocka_unit_test(test_http_chunked_resume),
        cmocka_unit_test(test_http_cache),
        cmocka_unit_test(test_http_deadlines_and_errors),
        cmocka_unit_test(test_close_aborts_transfer),
        cmocka_unit_test(test_https),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
