/* text-docs (issue 20): documents of sentences into ALBERT sentence-order
 * pairs. The pure parts (line splitting, UTF-8 refusal, the pair builder)
 * with a byte tokenizer and synthetic documents whose token ids give their
 * position in the text, so the test can check that every segment is a run
 * of consecutive text, that a swapped pair really has B before A, that
 * pairs never cross documents; then the iterator end to end on the Brown
 * corpus's evaluation half with a SentencePiece model trained by our recipe
 * (skipped without the corpus): every example decodes to two pieces of the
 * text, segments and labels as documented; a tokenizer that does not match
 * the manifest's vocab_size or hash, and a shard that is not UTF-8, are
 * errors that name the cause. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cm_crypto.h"
#include "cm_err.h"
#include "ct_harness.h"
#include "data/data.h"
#include "data/spm.h"

/* ids: byte + 5 (0-4 are the special pieces) */
static int byte_enc(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n)
{
    (void)ctx;
    *n = len;
    if (len > cap)
        return CM_ETOOBIG;
    for (size_t i = 0; i < len; i++)
        ids[i] = (unsigned char)text[i] + 5;
    return CM_OK;
}

static void test_docs_tokenize(void **state)
{
    (void)state;
    const char *t = "Hello world.\nSecond line.\n\n\n\nDoc two.\r\nline 2\n\nthree";
    struct cm_data_docs d;
    char err[160] = "";
    assert_int_equal(cm_data_docs_tokenize((const uint8_t *)t, strlen(t), byte_enc, NULL, &d, err,
                                           sizeof err),
                     CM_OK);
    assert_int_equal(d.ndoc, 3);
    assert_int_equal(d.nsent, 5);
    assert_int_equal(d.doc[1], 2);
    assert_int_equal(d.doc[2], 4);
    assert_int_equal(d.sent[1], 12);                   /* "Hello world." */
    assert_int_equal(d.sent[3] - d.sent[2], 8);         /* "Doc two.", the \r dropped */
    assert_int_equal(d.tok[d.sent[4]], 't' + 5);        /* "three" without a final newline */
    cm_data_docs_free(&d);
    /* blank input: no documents */
    assert_int_equal(cm_data_docs_tokenize((const uint8_t *)"\n\n", 2, byte_enc, NULL, &d, err,
                                           sizeof err),
                     CM_OK);
    assert_int_equal(d.ndoc, 0);
    cm_data_docs_free(&d);
    /* not UTF-8 on line 3: refused, naming the line */
    const char *bad = "fine\nalso fine\nbroken \xc3\x28 here\n";
    assert_int_equal(cm_data_docs_tokenize((const uint8_t *)bad, strlen(bad), byte_enc, NULL, &d,
                                           err, sizeof err),
                     CM_EPARSE);
    assert_non_null(strstr(err, "line 3"));
    assert_null(d.tok);
}

/* Documents of random sentences whose ids are their positions in the
 * text (10, 11, 12, ...): a segment is consecutive text iff its ids are
 * consecutive. */
static void synth(struct cm_data_docs *d, uint64_t seed, size_t ndoc)
{
    memset(d, 0, sizeof *d);
    size_t cap = 200000;
    d->tok = malloc(cap * sizeof *d->tok);
    d->sent = malloc(20000 * sizeof *d->sent);
    d->doc = malloc((ndoc + 1) * sizeof *d->doc);
    assert_true(d->tok && d->sent && d->doc);
    d->sent[0] = 0;
    d->doc[0] = 0;
    int32_t next = 10;
    for (size_t k = 0; k < ndoc; k++) {
        size_t ns = 1 + ((seed = seed * 6364136223846793005ull + 1) >> 33) % 9; /* 1..9 sentences */
        for (size_t i = 0; i < ns; i++) {
            size_t len = 1 + (((seed = seed * 6364136223846793005ull + 1) >> 40) & 63); /* 1..64 */
            for (size_t j = 0; j < len && d->ntok < cap; j++)
                d->tok[d->ntok++] = next++;
            d->sent[++d->nsent] = d->ntok;
        }
        d->doc[++d->ndoc] = d->nsent;
    }
    assert_true(next < 65536);
}

static int doc_of(const struct cm_data_docs *d, int32_t id)
{
    size_t pos = (size_t)(id - 10);
    for (size_t k = 0; k < d->ndoc; k++)
        if (pos < d->sent[d->doc[k + 1]])
            return (int)k;
    return -1;
}

static void test_sop_pairs(void **state)
{
    (void)state;
    struct cm_data_docs d;
    synth(&d, 7, 300);
    const size_t Ts[] = {8, 40, 128};
    for (size_t ti = 0; ti < 3; ti++) {
        size_t T = Ts[ti], W = T + 1;
        struct cm_data_sop_spec sp = {.T = T, .cls = 2, .sep = 3, .pad = 0};
        uint16_t *r = NULL;
        size_t n = 0, swapped = 0, trimmed = 0;
        assert_int_equal(cm_data_sop_build(&d, &sp, 42, &r, &n), CM_OK);
        assert_true(n > 300);
        for (size_t k = 0; k < n; k++) {
            const uint16_t *e = r + k * W;
            assert_int_equal(e[0], 2);
            size_t s1 = 1;
            while (s1 < T && e[s1] != 3)
                s1++;
            size_t s2 = s1 + 1;
            while (s2 < T && e[s2] != 3)
                s2++;
            assert_true(s2 < T);            /* two [SEP] within the window */
            assert_true(s1 > 1 && s2 > s1 + 1); /* A and B not empty */
            for (size_t i = s2 + 1; i < T; i++)
                assert_int_equal(e[i], 0);  /* padding */
            assert_true(e[T] == 0 || e[T] == 1);
            swapped += e[T];
            /* each segment is consecutive text */
            for (size_t i = 2; i < s1; i++)
                assert_int_equal(e[i], e[i - 1] + 1);
            for (size_t i = s1 + 2; i < s2; i++)
                assert_int_equal(e[i], e[i - 1] + 1);
            uint16_t a0 = e[1], a1 = e[s1 - 1], b0 = e[s1 + 1], b1 = e[s2 - 1];
            /* label 0: A before B in the text; 1: swapped */
            if (e[T])
                assert_true(b1 < a0);
            else
                assert_true(a1 < b0);
            trimmed += e[T] ? a0 != b1 + 1 : b0 != a1 + 1;
            /* one document */
            assert_int_equal(doc_of(&d, a0), doc_of(&d, b1));
            assert_true(s2 + 1 <= T);
        }
        double frac = (double)swapped / (double)n;
        printf("T %3zu: %zu pairs, %.1f %% swapped, %zu with a gap at the join\n", T, n,
               100 * frac, trimmed);
        assert_true(frac > 0.4 && frac < 0.6);
        /* deterministic for a seed, another seed another set */
        uint16_t *r2 = NULL;
        size_t n2 = 0;
        assert_int_equal(cm_data_sop_build(&d, &sp, 42, &r2, &n2), CM_OK);
        assert_int_equal(n2, n);
        assert_memory_equal(r, r2, n * W * sizeof *r);
        free(r2);
        assert_int_equal(cm_data_sop_build(&d, &sp, 43, &r2, &n2), CM_OK);
        assert_true(n2 != n || memcmp(r, r2, n * W * sizeof *r) != 0);
        free(r2);
        free(r);
    }
    struct cm_data_sop_spec tiny = {.T = 7, .cls = 2, .sep = 3, .pad = 0};
    uint16_t *r = NULL;
    size_t n = 0;
    assert_int_equal(cm_data_sop_build(&d, &tiny, 1, &r, &n), CM_EINVAL);
    cm_data_docs_free(&d);
}

/* ---- the iterator on the Brown corpus ------------------------------------ */

static char g_dir[256], g_model[320], g_eval[400];
static char *g_text;
static size_t g_text_len;

static int file_sha(const char *path, char hex[65], size_t *size)
{
    size_t n = 0;
    char *b = ct_read_file(path, &n);
    if (!b)
        return -1;
    uint8_t h[32];
    cm_sha256(b, n, h);
    cm_hex_encode(h, 32, hex);
    *size = n;
    free(b);
    return 0;
}

/* A text-docs manifest for one shard; vocab 0: the tokenizer's. */
static void write_manifest(const char *path, const char *shard, long vocab, const char *tok_sha)
{
    char hs[65], ht[65];
    size_t ns, nt;
    assert_int_equal(file_sha(shard, hs, &ns), 0);
    assert_int_equal(file_sha(g_model, ht, &nt), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"name\": \"brown\", \"format\": \"text-docs\", \"vocab_size\": %ld,"
            " \"tokenizer\": {\"url\": \"file://%s\", \"size\": %zu, \"sha256\": \"%s\"},"
            " \"shards\": [{\"url\": \"file://%s\", \"size\": %zu, \"sha256\": \"%s\"}]}\n",
            vocab, g_model, nt, tok_sha ? tok_sha : ht, shard, ns, hs);
    fclose(f);
}

static int have_corpus(void)
{
    const char *corpus = getenv("CT_BROWN_DIR");
    if (!corpus)
        corpus = "/usr/local/share/crowdtrain/corpus/brown";
    snprintf(g_eval, sizeof g_eval, "%s/brown-eval.txt", corpus);
    if (access(g_eval, R_OK) != 0 || system("command -v spm_train >/dev/null") != 0) {
        printf("(the Brown corpus or spm_train is missing: scripts/make-brown-corpus.sh; the "
               "iterator tests are skipped)\n");
        return 0;
    }
    if (g_model[0])
        return 1;
    assert_int_equal(ct_tempdir("textdocs", g_dir, sizeof g_dir), 0);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s/tok", g_dir);
    snprintf(g_model, sizeof g_model, "%s.model", prefix);
    const char *argv[] = {"scripts/train-tokenizer.sh", g_eval, "2000", prefix, NULL};
    char *out = NULL;
    int rc = ct_run(argv, NULL, &out, 300);
    if (rc != 0)
        fprintf(stderr, "%s\n", out ? out : "");
    free(out);
    assert_int_equal(rc, 0);
    g_text = ct_read_file(g_eval, &g_text_len);
    assert_non_null(g_text);
    /* Sentences are encoded line by line, each with SentencePiece's leading
       word boundary, so a segment of several sentences decodes with a space
       where the text has a line break. */
    for (size_t i = 0; i < g_text_len; i++)
        if (g_text[i] == '\n')
            g_text[i] = ' ';
    return 1;
}

static void test_iter_brown(void **state)
{
    (void)state;
    if (!have_corpus())
        return;
    char man[400];
    snprintf(man, sizeof man, "%s/eval.json", g_dir);
    write_manifest(man, g_eval, 2000, NULL);
    struct cm_spm *sp = NULL;
    char err[200];
    assert_int_equal(cm_spm_load(g_model, &sp, err, sizeof err), CM_OK);
    const size_t T = 64, B = 32;
    struct cm_data_options o;
    cm_data_options_init(&o);
    o.mode = CM_DATA_EVAL;
    o.seq_len = T;
    struct cm_data_iter *it = NULL;
    assert_int_equal(cm_data_open_file(man, 5, &o, &it), CM_OK);
    assert_int_equal(cm_data_example_width(it), T + 1);
    int32_t tok[32 * 65], seg[32 * 64], sop[32];
    struct cm_data_batch b = {.capacity = B, .tokens = tok, .segments = seg, .sop = sop};
    size_t total = 0, swapped = 0, checked = 0, ntok = 0;
    for (;;) {
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        if (b.n == 0)
            break;
        for (size_t k = 0; k < b.n; k++) {
            const int32_t *e = tok + k * (T + 1), *s = seg + k * T;
            assert_int_equal(e[0], 2);
            assert_int_equal(e[T], 0); /* pad after the window */
            size_t s1 = 1, s2;
            while (e[s1] != 3)
                s1++;
            for (s2 = s1 + 1; e[s2] != 3; s2++)
                ;
            for (size_t i = 0; i < T; i++)
                assert_int_equal(s[i], i > s1 && i <= s2 ? 1 : 0);
            for (size_t i = s2 + 1; i < T; i++)
                assert_int_equal(e[i], 0);
            swapped += sop[k] == 1;
            ntok += s2 + 1;
            /* both segments decode to text of the corpus (spot-check every 7th) */
            if ((total + k) % 7 == 0) {
                for (int part = 0; part < 2; part++) {
                    size_t from = part ? s1 + 1 : 1, to = part ? s2 : s1;
                    char *txt = NULL;
                    size_t tl = 0;
                    assert_int_equal(cm_spm_decode(sp, e + from, to - from, &txt, &tl, err,
                                                   sizeof err),
                                     CM_OK);
                    if (!memmem(g_text, g_text_len, txt, tl))
                        fail_msg("segment \"%s\" is not in the text", txt);
                    free(txt);
                }
                checked++;
            }
        }
        total += b.n;
    }
    printf("%zu pairs of the eval half at T %zu (%.1f tokens used per window), %.1f %% swapped, "
           "%zu decoded and found in the text\n",
           total, T, (double)ntok / (double)total, 100.0 * (double)swapped / (double)total,
           checked);
    assert_true(total > 1000);
    assert_true(swapped > total * 4 / 10 && swapped < total * 6 / 10);
    cm_data_close(it);
    /* train mode: shuffled, endless, the same kind of examples */
    o.mode = CM_DATA_TRAIN;
    o.shuffle_size = 512;
    assert_int_equal(cm_data_open_file(man, 5, &o, &it), CM_OK);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(cm_data_next_batch(it, &b), CM_OK);
        assert_int_equal(b.n, B);
        assert_int_equal(tok[0], 2);
    }
    cm_data_close(it);
    cm_spm_free(sp);
}

static int first_batch(const char *man, struct cm_data_stats *st)
{
    struct cm_data_options o;
    cm_data_options_init(&o);
    o.mode = CM_DATA_EVAL;
    o.seq_len = 64;
    struct cm_data_iter *it = NULL;
    int rc = cm_data_open_file(man, 1, &o, &it);
    if (rc != CM_OK)
        return rc;
    int32_t tok[4 * 65];
    struct cm_data_batch b = {.capacity = 4, .tokens = tok};
    rc = cm_data_next_batch(it, &b);
    if (rc == CM_OK && b.n == 0)
        rc = 1;
    cm_data_get_stats(it, st);
    cm_data_close(it);
    return rc;
}

static void test_iter_errors(void **state)
{
    (void)state;
    if (!have_corpus())
        return;
    char man[400];
    struct cm_data_stats st;
    snprintf(man, sizeof man, "%s/bad.json", g_dir);
    /* the tokenizer does not have the manifest's vocabulary size */
    write_manifest(man, g_eval, 1999, NULL);
    assert_int_equal(first_batch(man, &st), CM_ERANGE);
    printf("vocab_size 1999: %s\n", st.last_error);
    assert_non_null(strstr(st.last_error, "2000 pieces"));
    /* the tokenizer's hash is not the manifest's */
    write_manifest(man, g_eval, 2000,
                   "0000000000000000000000000000000000000000000000000000000000000000");
    assert_int_equal(first_batch(man, &st), CM_ECHECKSUM);
    /* a shard that is not UTF-8 on its third line */
    char shard[400];
    snprintf(shard, sizeof shard, "%s/latin1.txt", g_dir);
    FILE *f = fopen(shard, "w");
    assert_non_null(f);
    fputs("A first sentence.\nA second one.\nCaf\xe9 au lait.\n", f);
    fclose(f);
    write_manifest(man, shard, 2000, NULL);
    assert_int_equal(first_batch(man, &st), CM_EPARSE);
    printf("latin-1 shard: %s\n", st.last_error);
    assert_non_null(strstr(st.last_error, "line 3"));
    /* a window too small for [CLS] A [SEP] B [SEP] */
    struct cm_data_options o;
    cm_data_options_init(&o);
    o.seq_len = 7;
    struct cm_data_iter *it = NULL;
    write_manifest(man, g_eval, 2000, NULL);
    assert_int_equal(cm_data_open_file(man, 1, &o, &it), CM_EINVAL);
    /* manifests: a tokenizer is required, and only for text-docs */
    struct cm_data_manifest *m = NULL;
    char err[200];
    const char *no_tok = "{\"name\":\"x\",\"format\":\"text-docs\",\"vocab_size\":10,\"shards\":"
                         "[{\"url\":\"file:///a\",\"size\":1,\"sha256\":\"" \
                         "00000000000000000000000000000000000000000000000000000000000000ff\"}]}";
    assert_int_equal(cm_data_manifest_parse(no_tok, strlen(no_tok), &m, err, sizeof err), CM_EPARSE);
    assert_non_null(strstr(err, "tokenizer"));
    const char *stray = "{\"name\":\"x\",\"format\":\"text-bytes\",\"tokenizer\":{\"url\":\"file:///t\","
                        "\"size\":1,\"sha256\":\"" \
                        "00000000000000000000000000000000000000000000000000000000000000ff\"},"
                        "\"shards\":[{\"url\":\"file:///a\",\"size\":1,\"sha256\":\"" \
                        "00000000000000000000000000000000000000000000000000000000000000ff\"}]}";
    assert_int_equal(cm_data_manifest_parse(stray, strlen(stray), &m, err, sizeof err), CM_EPARSE);
    assert_non_null(strstr(err, "only allowed for text-docs"));
}

static int teardown(void **state)
{
    (void)state;
    free(g_text);
    if (g_dir[0] && !getenv("CT_KEEP_LOGS"))
        ct_rmrf(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_tokenize),
        cmocka_unit_test(test_sop_pairs),
        cmocka_unit_test(test_iter_brown),
        cmocka_unit_test(test_iter_errors),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
