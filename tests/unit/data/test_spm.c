/* The SentencePiece tokenizer (common/data/spm.h, issue 20): the Unigram
 * model our recipe (scripts/train-tokenizer.sh, run by make-brown-corpus.sh)
 * trained on the Brown corpus's training half gives, through cm_spm_encode, exactly the ids
 * Debian's `spm_encode` gives for every line of the evaluation half, and
 * decode(encode(line)) == line for each; special pieces sit at ALBERT's ids;
 * bad input (text that is not UTF-8, ids outside the vocabulary, a file
 * that is no model, truncated model bytes, too small an output) gets an
 * error, never a crash. Skipped when the corpus is not installed
 * (scripts/make-brown-corpus.sh, run by scripts/install-deps.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cm_err.h"
#include "ct_harness.h"
#include "data/spm.h"

#define VOCAB 8000

static char g_dir[256], g_model[300], g_eval[512];
static struct cm_spm *g_sp;

static int setup(void **state)
{
    (void)state;
    const char *corpus = getenv("CT_BROWN_DIR");
    if (!corpus)
        corpus = "/usr/local/share/crowdtrain/corpus/brown";
    char train[512];
    snprintf(train, sizeof train, "%s/brown-train.txt", corpus);
    snprintf(g_eval, sizeof g_eval, "%s/brown-eval.txt", corpus);
    if (access(train, R_OK) != 0 || access(g_eval, R_OK) != 0) {
        printf("SKIP: the Brown corpus is not in %s (scripts/make-brown-corpus.sh)\n", corpus);
        exit(CT_SKIP);
    }
    if (system("command -v spm_train >/dev/null && command -v spm_encode >/dev/null") != 0) {
        printf("SKIP: spm_train/spm_encode not installed (apt-get install sentencepiece)\n");
        exit(CT_SKIP);
    }
    if (ct_tempdir("spm", g_dir, sizeof g_dir) != 0)
        return -1;
    /* the corpus's own tokenizer, which scripts/make-brown-corpus.sh made
       with our recipe (scripts/train-tokenizer.sh); trained here when an
       older corpus directory lacks it */
    snprintf(g_model, sizeof g_model, "%s/brown-8k.model", corpus);
    if (access(g_model, R_OK) != 0) {
        snprintf(g_model, sizeof g_model, "%s/brown.model", g_dir);
        char prefix[300], vocab[16];
        snprintf(prefix, sizeof prefix, "%s/brown", g_dir);
        snprintf(vocab, sizeof vocab, "%d", VOCAB);
        const char *argv[] = {"scripts/train-tokenizer.sh", train, vocab, prefix, NULL};
        char *out = NULL;
        int rc = ct_run(argv, NULL, &out, 300);
        if (rc != 0)
            fprintf(stderr, "train-tokenizer.sh exited %d:\n%s\n", rc, out ? out : "");
        free(out);
        if (rc != 0)
            return -1;
    }
    char err[256];
    if (cm_spm_load(g_model, &g_sp, err, sizeof err) != CM_OK) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cm_spm_free(g_sp);
    if (g_dir[0] && !getenv("CT_KEEP_LOGS"))
        ct_rmrf(g_dir);
    return 0;
}

static void test_special_pieces(void **state)
{
    (void)state;
    assert_int_equal(cm_spm_vocab_size(g_sp), VOCAB);
    assert_int_equal(cm_spm_piece_id(g_sp, "<pad>"), 0);
    assert_int_equal(cm_spm_piece_id(g_sp, "<unk>"), 1);
    assert_int_equal(cm_spm_piece_id(g_sp, "[CLS]"), 2);
    assert_int_equal(cm_spm_piece_id(g_sp, "[SEP]"), 3);
    assert_int_equal(cm_spm_piece_id(g_sp, "[MASK]"), 4);
    assert_int_equal(cm_spm_piece_id(g_sp, "no-such-piece-in-any-vocabulary"), -1);
}

/* Our ids against spm_encode's, line by line over the whole evaluation
 * text, and the round trip. */
static void test_same_ids_as_spm_encode(void **state)
{
    (void)state;
    char ref[400], cmd[1400];
    snprintf(ref, sizeof ref, "%s/eval.ids", g_dir);
    snprintf(cmd, sizeof cmd, "spm_encode --model='%s' --output_format=id < '%s' > '%s'", g_model,
             g_eval, ref);
    assert_int_equal(system(cmd), 0);
    size_t tlen = 0, rlen = 0;
    char *text = ct_read_file(g_eval, &tlen), *ids = ct_read_file(ref, &rlen);
    assert_non_null(text);
    assert_non_null(ids);
    size_t cap = 1 << 16, n, lines = 0, tokens = 0, bytes = 0, mismatches = 0, roundtrip_bad = 0;
    int32_t *mine = malloc(cap * sizeof *mine);
    assert_non_null(mine);
    char *t = text, *r = ids, err[200];
    while (*t) {
        char *tn = strchr(t, '\n'), *rn = strchr(r, '\n');
        assert_non_null(tn);
        assert_non_null(rn); /* spm_encode writes one line per input line */
        size_t len = (size_t)(tn - t);
        assert_int_equal(cm_spm_encode(g_sp, t, len, mine, cap, &n, err, sizeof err), CM_OK);
        /* the reference line: ids separated by spaces */
        size_t k = 0;
        int same = 1;
        for (char *p = r; p < rn;) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (k >= n || mine[k] != v)
                same = 0;
            k++;
            p = end;
        }
        if (!same || k != n) {
            if (mismatches++ < 3)
                fprintf(stderr, "line %zu differs: %.*s\n", lines + 1, (int)len, t);
        }
        char *back = NULL;
        size_t blen = 0;
        assert_int_equal(cm_spm_decode(g_sp, mine, n, &back, &blen, err, sizeof err), CM_OK);
        if (blen != len || memcmp(back, t, len) != 0) {
            if (roundtrip_bad++ < 3)
                fprintf(stderr, "line %zu decodes to \"%s\"\n", lines + 1, back);
        }
        free(back);
        lines++;
        tokens += n;
        bytes += len;
        t = tn + 1;
        r = rn + 1;
    }
    printf("%zu lines, %zu bytes, %zu tokens (%.2f bytes/token): %zu differ from spm_encode, "
           "%zu fail the round trip\n",
           lines, bytes, tokens, (double)bytes / (double)tokens, mismatches, roundtrip_bad);
    assert_true(lines > 4000);
    assert_true(tokens > bytes / 8); /* a real subword vocabulary: neither bytes nor whole lines */
    assert_int_equal(mismatches, 0);
    assert_int_equal(roundtrip_bad, 0);
    free(mine);
    free(text);
    free(ids);
}

/* Characters no training text had still round-trip (byte fallback). */
static void test_unseen_characters(void **state)
{
    (void)state;
    const char *s = "Zürich → 東京, naïve café ☕ 🙂";
    int32_t ids[256];
    size_t n;
    char err[200], *back = NULL;
    assert_int_equal(cm_spm_encode(g_sp, s, strlen(s), ids, 256, &n, err, sizeof err), CM_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] != 1); /* never <unk> */
    size_t blen;
    assert_int_equal(cm_spm_decode(g_sp, ids, n, &back, &blen, err, sizeof err), CM_OK);
    assert_string_equal(back, s);
    free(back);
}

static void test_bad_input(void **state)
{
    (void)state;
    int32_t ids[64];
    size_t n;
    char err[200] = "";
    /* not UTF-8: a lone continuation byte, an overlong '/', a surrogate, a
       truncated sequence, a code point above U+10FFFF */
    const char *bad[] = {"abc\x80", "a\xc0\xaf", "x\xed\xa0\x80y", "ok \xe2\x82", "\xf4\x90\x80\x80"};
    size_t at[] = {3, 1, 1, 3, 0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cm_utf8_invalid_at(bad[i], strlen(bad[i])), at[i]);
        assert_int_equal(cm_spm_encode(g_sp, bad[i], strlen(bad[i]), ids, 64, &n, err, sizeof err),
                         CM_EINVAL);
        assert_non_null(strstr(err, "not UTF-8"));
    }
    const char *good = "plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82";
    assert_int_equal(cm_utf8_invalid_at(good, strlen(good)), strlen(good));
    /* too small an output: how many are needed */
    const char *s = "The jury further said in term-end presentments that the City";
    assert_int_equal(cm_spm_encode(g_sp, s, strlen(s), ids, 2, &n, err, sizeof err), CM_ETOOBIG);
    assert_true(n > 2);
    size_t need = n;
    assert_int_equal(cm_spm_encode(g_sp, s, strlen(s), ids, need, &n, err, sizeof err), CM_OK);
    assert_int_equal(n, need);
    /* empty text: no ids */
    assert_int_equal(cm_spm_encode(g_sp, "", 0, ids, 64, &n, err, sizeof err), CM_OK);
    assert_int_equal(n, 0);
    /* ids outside the vocabulary */
    char *back = NULL;
    size_t blen;
    int32_t out_of_range[] = {5, VOCAB, 6};
    assert_int_equal(cm_spm_decode(g_sp, out_of_range, 3, &back, &blen, err, sizeof err),
                     CM_EINVAL);
    assert_null(back);
    int32_t negative[] = {-1};
    assert_int_equal(cm_spm_decode(g_sp, negative, 1, &back, &blen, err, sizeof err), CM_EINVAL);
    /* files and bytes that are no model */
    struct cm_spm *sp = NULL;
    assert_int_not_equal(cm_spm_load("/nonexistent/brown.model", &sp, err, sizeof err), CM_OK);
    assert_null(sp);
    assert_int_not_equal(cm_spm_load(g_eval, &sp, err, sizeof err), CM_OK);
    assert_null(sp);
    size_t mlen = 0;
    char *model = ct_read_file(g_model, &mlen);
    assert_non_null(model);
    assert_int_equal(cm_spm_load_mem(model, mlen, &sp, err, sizeof err), CM_OK);
    assert_int_equal(cm_spm_vocab_size(sp), VOCAB);
    cm_spm_free(sp);
    sp = NULL;
    assert_int_not_equal(cm_spm_load_mem(model, mlen / 2, &sp, err, sizeof err), CM_OK);
    assert_null(sp);
    assert_int_not_equal(cm_spm_load_mem("", 0, &sp, err, sizeof err), CM_OK);
    assert_null(sp);
    /* a model with a normalization rule (spm_train's default nmt_nfkc):
       refused, since libsentencepiece reads its character map unchecked
       (spm.cc, check_model_bytes) */
    assert_int_equal(cm_spm_load("tests/fuzz/corpus/spm_model/unigram-150.model", &sp, err,
                                 sizeof err),
                     CM_EUNSUPPORTED);
    assert_null(sp);
    assert_non_null(strstr(err, "normalizes text"));
    assert_int_equal(cm_spm_load("tests/fuzz/corpus/spm_model/identity-400.model", &sp, err,
                                 sizeof err),
                     CM_OK);
    cm_spm_free(sp);
    sp = NULL;
    free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_pieces),
        cmocka_unit_test(test_same_ids_as_spm_encode),
        cmocka_unit_test(test_unseen_characters),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
