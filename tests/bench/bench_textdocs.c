/* The language-model data pipeline's speed (issue 20): the Brown corpus's
 * training half (5.5 MB) through what an agent does to a text-docs shard on
 * the fly, on one thread: SentencePiece encoding line by line
 * (cm_data_docs_tokenize over cm_spm_encode), ALBERT's sentence-order pairs
 * (cm_data_sop_build, T = 128) and BERT masking of every pair
 * (kern_mlm_mask, 15 %); against Debian's `spm_encode` on the same file in
 * the same run (the reference: SentencePiece's own command-line encoder,
 * one process, ids to /dev/null). The tokenizer is trained first with
 * scripts/train-tokenizer.sh (8,000 pieces, our recipe).
 *   bench_textdocs [CORPUS_DIR]     (default /usr/local/share/crowdtrain/corpus/brown)
 * Prints tokens/s of each and their ratio; without the corpus or
 * sentencepiece it prints why and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cm_err.h"
#include "data/data.h"
#include "data/spm.h"
#include "kern_model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int enc(void *ctx, const char *text, size_t len, int32_t *ids, size_t cap, size_t *n)
{
    return cm_spm_encode(ctx, text, len, ids, cap, n, NULL, 0);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/usr/local/share/crowdtrain/corpus/brown";
    char train[512], cmd[2048], tmpl[] = "/tmp/ct-bench-textdocs-XXXXXX";
    snprintf(train, sizeof train, "%s/brown-train.txt", dir);
    if (access(train, R_OK) != 0 || system("command -v spm_encode >/dev/null") != 0) {
        printf("SKIP: needs %s (scripts/make-brown-corpus.sh) and sentencepiece\n", train);
        return 0;
    }
    if (!mkdtemp(tmpl))
        return 1;
    snprintf(cmd, sizeof cmd, "scripts/train-tokenizer.sh '%s' 8000 '%s/tok' >/dev/null 2>&1", train,
             tmpl);
    if (system(cmd) != 0) {
        fprintf(stderr, "bench_textdocs: train-tokenizer.sh failed\n");
        return 1;
    }
    char model[600];
    snprintf(model, sizeof model, "%s/tok.model", tmpl);
    FILE *f = fopen(train, "rb");
    if (!f)
        return 1;
    fseek(f, 0, SEEK_END);
    size_t len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *text = malloc(len);
    if (!text || fread(text, 1, len, f) != len)
        return 1;
    fclose(f);
    struct cm_spm *sp = NULL;
    char err[256];
    if (cm_spm_load(model, &sp, err, sizeof err) != CM_OK) {
        fprintf(stderr, "bench_textdocs: %s\n", err);
        return 1;
    }
    int mask = cm_spm_piece_id(sp, "[MASK]"), V = cm_spm_vocab_size(sp);
    struct cm_data_sop_spec spec = {.T = 128,
                                    .cls = (uint16_t)cm_spm_piece_id(sp, "[CLS]"),
                                    .sep = (uint16_t)cm_spm_piece_id(sp, "[SEP]"),
                                    .pad = (uint16_t)cm_spm_piece_id(sp, "<pad>")};
    double best = 1e30, best_tok = 0, best_pairs = 0;
    size_t ntok = 0, npairs = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        struct cm_data_docs d;
        if (cm_data_docs_tokenize(text, len, enc, sp, &d, err, sizeof err) != CM_OK) {
            fprintf(stderr, "bench_textdocs: %s\n", err);
            return 1;
        }
        double t1 = now_s();
        uint16_t *rec = NULL;
        if (cm_data_sop_build(&d, &spec, (uint64_t)rep, &rec, &npairs) != CM_OK)
            return 1;
        double t2 = now_s();
        int tok[128], tgt[128];
        uint64_t rng = 1;
        for (size_t k = 0; k < npairs; k++) {
            for (size_t i = 0; i < 128; i++)
                tok[i] = rec[k * 129 + i];
            kern_mlm_mask(tok, tgt, 128, 0.15f, mask, V, &rng);
        }
        double t3 = now_s();
        ntok = d.ntok;
        cm_data_docs_free(&d);
        free(rec);
        if (t3 - t0 < best) {
            best = t3 - t0;
            best_tok = t1 - t0;
            best_pairs = t3 - t1;
        }
        (void)t2;
    }
    /* spm_encode, same text, same model, best of 3 */
    double ref = 1e30;
    snprintf(cmd, sizeof cmd, "spm_encode --model='%s' --output_format=id < '%s' > /dev/null", model,
             train);
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        if (system(cmd) != 0)
            return 1;
        double t = now_s() - t0;
        if (t < ref)
            ref = t;
    }
    printf("text: %s, %.1f MB, %zu tokens (8,000-piece Unigram), %zu pairs at T 128\n", train,
           len / 1e6, ntok, npairs);
    printf("ours, one thread: encode %.2f s, pairs + masking %.3f s: %.0f tokens/s\n", best_tok,
           best_pairs, ntok / best);
    printf("spm_encode (same text and model, its own process): %.2f s: %.0f tokens/s\n", ref,
           ntok / ref);
    printf("ratio (ours / spm_encode): %.2f\n", ref / best);
    cm_spm_free(sp);
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpl);
    return system(cmd) == 0 ? 0 : 1;
}
