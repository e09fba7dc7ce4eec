/* ct-timeout: 300 */
/* `crowdtrain-agent finetune` (issue 20, seed 000 H.6): a classifier on the
 * pooled [CLS] position of a run's ALBERT, its encoder from a pretrained
 * export or from scratch, trained on `label<TAB>text` files tokenized with
 * the run's SentencePiece model (the Brown corpus's, checked by hash).
 *
 *  - learning: on a task a small encoder can learn from scratch (each
 *    label's examples share words the others never use), the held-out
 *    accuracy goes from chance to at least 90 %, far above the majority
 *    label's 50 %;
 *  - --model: a `train --local --export` of the same config is loaded: every
 *    tensor but the fresh classifier (26: the encoder, the pooler, and the
 *    masked-LM head the model keeps), the sentence-order head (2 tensors)
 *    left out, and the evaluation before any step differs from the
 *    from-scratch one;
 *  - the Brown genre task (scripts/make-brown-genre.sh) runs: 15 labels;
 *  - bad input changes nothing and says why: an eval label the training
 *    file lacks, a line without a tab, text that is not UTF-8, a model of
 *    another shape, a tokenizer that is not the run's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ct_harness.h"

#define CORPUS "/usr/local/share/crowdtrain/corpus/brown"

static char g_dir[128];
static char g_cfg[256], g_train[256], g_eval[256];

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The tiny ALBERT of test_text_collab.c (T 32, width 64); d_model lets a
 * test make another shape. */
static void write_config(const char *path, int d_model)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model\": {\"type\": \"albert\", \"vocab\": 8000, \"context\": 32, \"layers\": 2, \"heads\": 2,"
             " \"d_model\": %d, \"d_embed\": 32, \"d_ff\": 128, \"post_ln\": true, \"sentence_order\": true},"
             " \"optimizer\": {\"type\": \"lamb\", \"lr\": 0.02}, \"batch_size\": 16, \"micro_batch\": 8,"
             " \"steps\": 4, \"seed\": 3, \"device\": \"cpu\", \"data\": {\"train\": \"" CORPUS
             "/brown-train.json\", \"shuffle_buffer\": 256}}",
             d_model);
    write_file(path, text);
}

/* Two labels whose examples use disjoint words: learnable from scratch. */
static void write_task(const char *path, int n, unsigned seed)
{
    static const char *const a[] = {"river", "mountain", "forest", "valley", "lake", "meadow", "stone", "cliff"};
    static const char *const b[] = {"market", "price", "bank", "trade", "money", "profit", "stock", "loan"};
    static const char *const common[] = {"the", "a", "was", "near", "and", "of", "with", "by"};
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    srand(seed);
    for (int i = 0; i < n; i++) {
        int lab = i % 2;
        fputs(lab ? "finance\t" : "nature\t", f);
        for (int w = 0; w < 12; w++)
            fprintf(f, "%s%s", w ? " " : "", w % 2 ? common[rand() % 8] : (lab ? b : a)[rand() % 8]);
        fputc('\n', f);
    }
    assert_int_equal(fclose(f), 0);
}

static int setup(void **state)
{
    (void)state;
    if (access(CORPUS "/brown-train.json", R_OK) != 0) {
        printf("SKIP: the Brown corpus is missing (scripts/make-brown-corpus.sh)\n");
        exit(CT_SKIP);
    }
    if (ct_tempdir("finetune", g_dir, sizeof g_dir) != 0)
        return -1;
    snprintf(g_cfg, sizeof g_cfg, "%s/tiny.json", g_dir);
    snprintf(g_train, sizeof g_train, "%s/task-train.tsv", g_dir);
    snprintf(g_eval, sizeof g_eval, "%s/task-eval.tsv", g_dir);
    write_config(g_cfg, 64);
    write_task(g_train, 600, 1);
    write_task(g_eval, 100, 2);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (!getenv("CT_KEEP_LOGS"))
        ct_rmrf(g_dir);
    return 0;
}

/* Runs finetune with extra args; returns the exit status, output in *out. */
static int finetune(const char *const *extra, char **out)
{
    const char *argv[32] = {ct_bin("crowdtrain-agent"), "finetune", "--config", g_cfg, "--threads", "2"};
    size_t n = 6;
    for (size_t k = 0; extra[k] && n < 31; k++)
        argv[n++] = extra[k];
    argv[n] = NULL;
    return ct_run(argv, NULL, out, 240);
}

static double accuracy(const char *out, const char *when)
{
    char key[64];
    snprintf(key, sizeof key, "eval %s: accuracy ", when);
    const char *p = strstr(out, key);
    return p ? atof(p + strlen(key)) : -1;
}

static void test_learns_from_scratch(void **state)
{
    (void)state;
    char *out = NULL;
    const char *args[] = {"--train", g_train, "--eval", g_eval, "--steps", "120", "--batch", "16", "--lr", "3e-3", NULL};
    int rc = finetune(args, &out);
    printf("%s", out ? out : "");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "encoder from scratch"));
    assert_non_null(strstr(out, "2 labels, 600 training and 100 held-out examples"));
    assert_non_null(strstr(out, "majority label 50.00%"));
    assert_true(accuracy(out, "after") >= 90.0);
    free(out);
}

static void test_pretrained_encoder(void **state)
{
    (void)state;
    char model[300], *out = NULL;
    snprintf(model, sizeof model, "%s/pre.safetensors", g_dir);
    const char *targv[] = {ct_bin("crowdtrain-agent"), "train", "--local", "--config", g_cfg, "--export", model, NULL};
    int rc = ct_run(targv, NULL, &out, 120);
    if (rc != 0)
        fail_msg("train --local --export: %d\n%s", rc, out ? out : "");
    assert_non_null(strstr(out, "exported the model"));
    free(out);
    const char *scratch[] = {"--train", g_train, "--eval", g_eval, "--steps", "1", NULL};
    assert_int_equal(finetune(scratch, &out), 0);
    const char *b = strstr(out, "eval before:");
    assert_non_null(b);
    char before_scratch[160];
    snprintf(before_scratch, sizeof before_scratch, "%.*s", (int)strcspn(b, "\n"), b);
    free(out);
    const char *pre[] = {"--train", g_train, "--eval", g_eval, "--steps", "1", "--model", model, NULL};
    assert_int_equal(finetune(pre, &out), 0);
    printf("%s", out);
    /* 26 tensors: encoder, pooler, masked-LM head; the sentence-order head's 2 unused */
    assert_non_null(strstr(out, "(26 tensors; 2 of its tensors not in this model"));
    b = strstr(out, "eval before:");
    assert_non_null(b);
    assert_true(strncmp(b, before_scratch, strlen(before_scratch)) != 0);
    free(out);
    /* a model of another shape: refused, naming the tensor */
    char other[300];
    snprintf(other, sizeof other, "%s/wide.json", g_dir);
    write_config(other, 96);
    const char *oargv[] = {ct_bin("crowdtrain-agent"), "finetune", "--config", other, "--train", g_train, "--eval",
                           g_eval, "--steps", "1", "--model", model, NULL};
    assert_int_equal(ct_run(oargv, NULL, &out, 60), 1);
    printf("%s", out);
    assert_non_null(strstr(out, "not this model's shape"));
    free(out);
}

static void test_brown_genres(void **state)
{
    (void)state;
    const char *margv[] = {"scripts/make-brown-genre.sh", CORPUS, g_dir, NULL};
    char *out = NULL;
    assert_int_equal(ct_run(margv, NULL, &out, 60), 0);
    printf("%s", out);
    free(out);
    char tr[300], ev[300];
    snprintf(tr, sizeof tr, "%s/brown-genre-train.tsv", g_dir);
    snprintf(ev, sizeof ev, "%s/brown-genre-eval.tsv", g_dir);
    const char *args[] = {"--train", tr, "--eval", ev, "--steps", "4", NULL};
    assert_int_equal(finetune(args, &out), 0);
    printf("%s", out);
    assert_non_null(strstr(out, "15 labels"));
    assert_true(accuracy(out, "after") >= 0);
    free(out);
}

static void test_bad_input(void **state)
{
    (void)state;
    char path[300], *out = NULL;
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"unknown\tthe river and the lake\n", "is not one of the training file's"},
        {"nature the river and the lake\n", "not `label<TAB>text`"},
        {"nature\tthe river \xff and the lake\n", ":1:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/bad-%zu.tsv", g_dir, i);
        write_file(path, bad[i].text);
        const char *args[] = {"--train", g_train, "--eval", path, "--steps", "1", NULL};
        int rc = finetune(args, &out);
        printf("bad eval file %zu: exit %d: %s", i, rc, out ? out : "");
        assert_int_equal(rc, 1);
        assert_non_null(strstr(out, bad[i].want));
        free(out);
    }
    /* a tokenizer that is not the run's */
    snprintf(path, sizeof path, "%s/other.model", g_dir);
    write_file(path, "not a sentencepiece model");
    const char *args[] = {"--train", g_train, "--eval", g_eval, "--tokenizer", path, NULL};
    assert_int_equal(finetune(args, &out), 1);
    assert_non_null(strstr(out, "is not the tokenizer of"));
    free(out);
    /* a GPT config: refused */
    snprintf(path, sizeof path, "%s/gpt.json", g_dir);
    write_file(path, "{\"model\": {\"type\": \"gpt\", \"vocab\": 300, \"context\": 16, \"layers\": 1, \"heads\": 2,"
                     " \"d_model\": 32}, \"batch_size\": 4, \"steps\": 1, \"data\": {\"train\": \"" CORPUS
                     "/brown-train.json\"}}");
    const char *gargv[] = {ct_bin("crowdtrain-agent"), "finetune", "--config", path, "--train", g_train, "--eval",
                           g_eval, NULL};
    assert_int_equal(ct_run(gargv, NULL, &out, 60), 1);
    assert_non_null(strstr(out, "not an albert"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_learns_from_scratch),
        cmocka_unit_test(test_pretrained_encoder),
        cmocka_unit_test(test_brown_genres),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
