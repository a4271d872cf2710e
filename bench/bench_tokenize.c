/*
 * bench_tokenize.c - the BPE tokenizer (src/cli/tok/bpe.c) against the reference tokenizers
 * on the same text, and `kvprefix replay` on the example log with exact against approximate
 * token counts.
 *
 *   bench_tokenize [--runs N] [--ref DIR] [--corpus DIR]
 *
 * Part 1. The test corpus (tests/cli/data/tok/corpus, files in name order, concatenated: 68 KB
 * of code, CJK, emoji, numbers, whitespace runs and prose), then its prose alone (long.txt,
 * 55 KB: the corpus's 3000-space and 2000-'!' runs cost the references quadratic time, which
 * dominates their figure on the whole corpus), is encoded by each tokenizer
 * (llama3, cl100k, o200k from the rank files scripts/tokref.sh extracted into --ref), once
 * to count the tokens and then N times timed; the same text goes to scripts/tokbench.mjs,
 * which times js-tiktoken / llama3-tokenizer-js the same way in node. Reported: the median
 * MB/s of each side (the corpus is repeated to 1 MB per timed encode so a run lasts long
 * enough to time), their ratio, both token counts (they must agree), and the rank file's
 * load time.
 *
 * Part 2. gen_chatlog --format openai (600 requests, 3.6 MB) is replayed by the kvprefix
 * binary N times with the words stand-in and N times with --tokenizer llama3.tiktoken (the
 * llama3 template); reported: the median wall time of each and their ratio.
 *
 * Needs build-tok/ from scripts/tokref.sh; without node the reference column is left out.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "benchutil.h"
#include "bpe.h"
#include "cli.h"

#ifndef KVP_BENCH_SRCDIR
#define KVP_BENCH_SRCDIR "."
#endif
#ifndef KVP_BENCH_KVPREFIX
#define KVP_BENCH_KVPREFIX "kvprefix"
#endif
#ifndef KVP_BENCH_GEN_CHATLOG
#define KVP_BENCH_GEN_CHATLOG "gen_chatlog"
#endif

#define TARGET_BYTES (1u << 20) /* text per timed encode */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Read the corpus files matching glob (sorted by name) into one buffer. */
static char *read_corpus(const char *dir, const char *glob, size_t *len)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "cat '%s'/%s 2>/dev/null", dir, glob);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return NULL;
    char *b = NULL;
    int r = cli_read_all(p, SIZE_MAX, &b, len);
    pclose(p);
    return r == CLI_READ_OK ? b : NULL;
}

/* Run the reference for kind on file; fills *mbps and *tokens. Returns false without it. */
static bool reference(const char *kind, const char *file, int runs, double *mbps, size_t *tokens)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "node '%s/scripts/tokbench.mjs' '%s/build-tok/npm/node_modules' %s '%s' %d "
             "2>/dev/null",
             KVP_BENCH_SRCDIR, KVP_BENCH_SRCDIR, kind, file, runs);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return false;
    char name[32];
    bool ok = fscanf(p, "%31s %lf %zu", name, mbps, tokens) == 3;
    return pclose(p) == 0 && ok;
}

/* Part 1 for one rank file. */
static void bench_kind(const char *ref_dir, const char *file, const char *kind, const char *text,
                       size_t len, const char *text_file, int runs)
{
    char path[4200], err[512];
    snprintf(path, sizeof path, "%s/%s", ref_dir, file);
    bpe *t = NULL;
    double t0 = now_s();
    if (bpe_load(path, 0, &t, err, sizeof err) != BPE_OK) {
        printf("%-7s %s\n", kind, err);
        return;
    }
    double load_ms = (now_s() - t0) * 1e3;
    bpe_out o = {0};
    bpe_encode(t, text, len, true, 0, &o, err, sizeof err);
    size_t n_tokens = o.n;
    size_t reps = TARGET_BYTES / len + 1;
    double rates[64];
    for (int r = 0; r < runs; r++) {
        double s = now_s();
        for (size_t k = 0; k < reps; k++) {
            o.n = 0;
            bpe_encode(t, text, len, true, 0, &o, err, sizeof err);
        }
        rates[r] = (double)(len * reps) / (now_s() - s) / 1e6;
    }
    double ours = bench_median(rates, runs), theirs = 0;
    size_t ref_tokens = 0;
    if (reference(kind, text_file, runs, &theirs, &ref_tokens))
        printf("%-7s %9zu %9zu %10.2f %10.2f %8.1fx %9.1f\n", kind, n_tokens, ref_tokens, ours,
               theirs, ours / theirs, load_ms);
    else
        printf("%-7s %9zu %9s %10.2f %10s %9s %9.1f\n", kind, n_tokens, "-", ours, "-", "-",
               load_ms);
    bpe_out_free(&o);
    bpe_free(t);
}

/* Median wall time of `kvprefix replay ARGS` over runs. */
static double replay_time(const char *args, int runs)
{
    double t[64];
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' replay --capacity 20000 %s >/dev/null", KVP_BENCH_KVPREFIX,
             args);
    for (int r = 0; r < runs; r++) {
        double s = now_s();
        if (system(cmd) != 0) {
            fprintf(stderr, "bench_tokenize: failed: %s\n", cmd);
            exit(1);
        }
        t[r] = now_s() - s;
    }
    return bench_median(t, runs);
}

int main(int argc, char **argv)
{
    int runs = 7;
    char ref_dir[4096], corpus_dir[4096];
    snprintf(ref_dir, sizeof ref_dir, "%s/build-tok/ref", KVP_BENCH_SRCDIR);
    snprintf(corpus_dir, sizeof corpus_dir, "%s/tests/cli/data/tok/corpus", KVP_BENCH_SRCDIR);
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--ref") == 0)
            snprintf(ref_dir, sizeof ref_dir, "%s", argv[i + 1]);
        else if (strcmp(argv[i], "--corpus") == 0)
            snprintf(corpus_dir, sizeof corpus_dir, "%s", argv[i + 1]);
    }
    runs = runs < 1 ? 1 : runs > 64 ? 64 : runs;
    /* Part 1, twice: the whole corpus, then its prose alone (long.txt), since the corpus's
     * long whitespace and punctuation runs cost the references quadratic time. */
    const char *parts[2][2] = {{"*", "the corpus"}, {"long.txt", "long.txt (prose) alone"}};
    for (int k = 0; k < 2; k++) {
        size_t len = 0;
        char *text = read_corpus(corpus_dir, parts[k][0], &len);
        if (text == NULL || len == 0) {
            fprintf(stderr, "bench_tokenize: no corpus in %s\n", corpus_dir);
            return 1;
        }
        char text_file[] = "/tmp/bench_tokenize_XXXXXX";
        int fd = mkstemp(text_file);
        FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
        if (f == NULL || fwrite(text, 1, len, f) != len || fclose(f) != 0)
            return 1;
        printf("%sPart 1: encode %s (%zu bytes), median of %d runs, specials on\n", k ? "\n" : "",
               parts[k][1], len, runs);
        printf("%-7s %9s %9s %10s %10s %9s %9s\n", "kind", "tokens", "ref tok", "ours MB/s",
               "ref MB/s", "ratio", "load ms");
        bench_kind(ref_dir, "llama3.tiktoken", "llama3", text, len, text_file, runs);
        bench_kind(ref_dir, "cl100k_base.tiktoken", "cl100k", text, len, text_file, runs);
        bench_kind(ref_dir, "o200k_base.tiktoken", "o200k", text, len, text_file, runs);
        remove(text_file);
        free(text);
    }

    char log[] = "/tmp/bench_tokenize_log_XXXXXX", cmd[8192], args[8192];
    int lfd = mkstemp(log);
    if (lfd < 0)
        return 1;
    snprintf(cmd, sizeof cmd, "'%s' --format openai -o '%s'", KVP_BENCH_GEN_CHATLOG, log);
    if (system(cmd) != 0)
        return 1;
    printf("\nPart 2: kvprefix replay --capacity 20000 of the example log (gen_chatlog --format "
           "openai), median wall time of %d runs\n",
           runs);
    snprintf(args, sizeof args, "'%s'", log);
    double approx = replay_time(args, runs);
    snprintf(args, sizeof args, "--tokenizer '%s/llama3.tiktoken' '%s'", ref_dir, log);
    double exact = replay_time(args, runs);
    printf("  approximate (words)        %8.3f s\n  exact (llama3 + template)  %8.3f s   "
           "(%.2fx)\n",
           approx, exact, exact / approx);
    close(lfd);
    remove(log);
    return 0;
}
