/*
 * tokref_hf_check.c - the Hugging Face tokenizer reference check: every token id of
 * kvprefix's tokenizer.json reader (src/cli/tok/hftok.c, through bpe.h) against the npm
 * reference (@lenml/tokenizers, a fork of transformers.js's tokenizers, with the model
 * packages that bundle each model's tokenizer.json) on the corpus in
 * tests/cli/data/tok/corpus.
 *
 *   tokref_hf_check REF_DIR CORPUS_DIR
 *
 * REF_DIR is what scripts/tokref.sh wrote: hf/MODEL/ (tokenizer.json and
 * tokenizer_config.json copied from the package) and expected_hf.txt, one line per model,
 * mode and corpus file:
 *
 *   MODEL MODE FILE N id id ...
 *
 * MODE "plain" is the text alone (bpe_encode, added tokens matched), "post" adds the
 * post-processor's tokens (bpe_encode_post), "sp" is the SentencePiece library's own ids
 * (its WebAssembly build) for a SentencePiece .model (hf/llama2_spm/tokenizer.model,
 * Llama 2's), read here through spm_shim.h, compared with special tokens off (SentencePiece
 * knows no added tokens); a build without libsentencepiece skips those lines (fails under
 * KVPREFIX_TOKREF_REQUIRED=1). Each model is loaded by its folder, as
 * `--tokenizer DIR` does, and checked with bpe_check. A mismatch prints the first differing
 * position with the text of both tokens. Every model must have a "plain" and a "post" line
 * for every corpus file, or only "sp" lines, one per file; token offsets must ascend within
 * the text.
 *
 * Exit status: 0 every id matches; 1 a mismatch or a malformed reference; 77 (SKIP) when
 * REF_DIR has no expected_hf.txt, unless KVPREFIX_TOKREF_REQUIRED=1 (CI): then 1.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "cli.h"
#include "spm_shim.h"

#define SKIP       77
#define MAX_MODELS 16

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *b = NULL;
    int r = cli_read_all(f, SIZE_MAX, &b, len);
    fclose(f);
    return r == CLI_READ_OK ? b : NULL;
}

typedef struct model {
    char name[64];
    bpe *tok;
    unsigned n_mode[3]; /* lines checked: plain, post, sp */
} model;

static model models[MAX_MODELS];
static size_t n_models;

/* The model named name, loaded from REF_DIR/hf/NAME on first use; NULL after a message. */
static model *get_model(const char *ref_dir, const char *name)
{
    for (size_t i = 0; i < n_models; i++)
        if (strcmp(models[i].name, name) == 0)
            return &models[i];
    if (n_models == MAX_MODELS) {
        printf("more than %d models in the reference\n", MAX_MODELS);
        return NULL;
    }
    model *m = &models[n_models];
    snprintf(m->name, sizeof m->name, "%s", name);
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/hf/%s", ref_dir, name);
    if (bpe_load(path, 0, &m->tok, err, sizeof err) != BPE_OK) {
        printf("%s\n", err);
        return NULL;
    }
    if (bpe_kind(m->tok) != BPE_HF && bpe_kind(m->tok) != BPE_SPM) {
        printf("%s: not read as a tokenizer.json or SentencePiece tokenizer\n", path);
        return NULL;
    }
    if (bpe_check(m->tok, err, sizeof err) != 0) {
        printf("%s: bpe_check: %s\n", path, err);
        return NULL;
    }
    printf("loaded %s: %s, %zu tokens\n", name, bpe_form(m->tok), bpe_n_ranks(m->tok));
    n_models++;
    return m;
}

static void show_token(const bpe *t, uint32_t id)
{
    const char *p;
    size_t n;
    if (!bpe_token_bytes(t, id, &p, &n)) {
        printf("%u(?)", id);
        return;
    }
    printf("%u \"", id);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c < 0x20 || c == '"' || c == '\\' || c >= 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static bool required; /* KVPREFIX_TOKREF_REQUIRED=1: nothing may be skipped */

static int check_line(char *line, const char *ref_dir, const char *corpus_dir, bpe_out *o)
{
    char name[64], mode[16], file[256];
    size_t n_exp;
    int used = 0;
    if (sscanf(line, "%63s %15s %255s %zu%n", name, mode, file, &n_exp, &used) != 4 ||
        (strcmp(mode, "plain") != 0 && strcmp(mode, "post") != 0 && strcmp(mode, "sp") != 0)) {
        printf("malformed reference line: %.80s\n", line);
        return 1;
    }
    if (strcmp(mode, "sp") == 0 && !spm_available()) {
        static bool said;
        if (!said)
            printf("SKIP the sp lines: this build has no SentencePiece (libsentencepiece)\n");
        said = true;
        return required;
    }
    model *m = get_model(ref_dir, name);
    if (m == NULL)
        return 1;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", corpus_dir, file);
    size_t len;
    char *text = slurp(path, &len);
    if (text == NULL) {
        printf("%s: cannot read\n", path);
        return 1;
    }
    char err[256];
    o->n = 0;
    int k = strcmp(mode, "plain") == 0 ? 0 : strcmp(mode, "post") == 0 ? 1 : 2;
    int rc = k == 1 ? bpe_encode_post(m->tok, text, len, 0, o, err, sizeof err)
                    : bpe_encode(m->tok, text, len, k == 0, 0, o, err, sizeof err);
    int bad = 0;
    if (rc != BPE_OK) {
        printf("%s %s %s: encode failed: %s\n", name, mode, file, err);
        bad = 1;
    }
    char *p = line + used;
    for (size_t i = 0; !bad && i < n_exp; i++) {
        char *e;
        unsigned long id = strtoul(p, &e, 10);
        if (e == p) {
            printf("%s %s %s: reference ends after %zu of %zu ids\n", name, mode, file, i, n_exp);
            bad = 1;
            break;
        }
        p = e;
        if (i >= o->n || o->ids[i] != id) {
            printf("%s %s %s: token %zu (byte %u): expected ", name, mode, file, i,
                   i < o->n ? o->offsets[i] : (unsigned)len);
            show_token(m->tok, (uint32_t)id);
            printf(", got ");
            if (i < o->n)
                show_token(m->tok, o->ids[i]);
            else
                printf("the end");
            printf("\n");
            bad = 1;
        }
    }
    if (!bad && o->n != n_exp) {
        printf("%s %s %s: %zu tokens, the reference has %zu\n", name, mode, file, o->n, n_exp);
        bad = 1;
    }
    for (size_t i = 0; !bad && i < o->n; i++)
        if (o->offsets[i] > len || (i > 0 && o->offsets[i] < o->offsets[i - 1])) {
            printf("%s %s %s: token %zu's offset %u is out of order\n", name, mode, file, i,
                   o->offsets[i]);
            bad = 1;
        }
    if (!bad)
        printf("ok %s %s %s: %zu tokens, %zu bytes\n", name, mode, file, n_exp, len);
    m->n_mode[k]++;
    free(text);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tokref_hf_check REF_DIR CORPUS_DIR\n");
        return 2;
    }
    const char *req = getenv("KVPREFIX_TOKREF_REQUIRED");
    required = req != NULL && strcmp(req, "1") == 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/expected_hf.txt", argv[1]);
    size_t len;
    char *exp = slurp(path, &len);
    if (exp == NULL) {
        printf("SKIP: %s is missing: run scripts/tokref.sh (it needs node, npm and the npm "
               "registry) to fetch the reference tokenizers\n",
               path);
        return required ? 1 : SKIP;
    }
    int bad = 0;
    unsigned n_lines = 0;
    bpe_out o = {0};
    for (char *line = exp; *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (*line) {
            bad |= check_line(line, argv[1], argv[2], &o);
            n_lines++;
        }
        line = nl ? nl + 1 : line + strlen(line);
    }
    unsigned n_files = 0;
    DIR *dir = opendir(argv[2]);
    for (struct dirent *e; dir != NULL && (e = readdir(dir)) != NULL;)
        n_files += e->d_name[0] != '.';
    if (dir != NULL)
        closedir(dir);
    for (size_t i = 0; i < n_models; i++) {
        const unsigned *c = models[i].n_mode;
        bool full = c[0] == n_files && c[1] == n_files && (c[2] == 0 || c[2] == n_files);
        bool sp_only = c[0] == 0 && c[1] == 0 && c[2] == n_files;
        if (!full && !sp_only) {
            printf("%s: %u plain, %u post, %u sp lines for %u corpus files: the reference is "
                   "incomplete\n",
                   models[i].name, c[0], c[1], c[2], n_files);
            bad = 1;
        }
    }
    if (n_models == 0) {
        printf("no model in %s\n", path);
        bad = 1;
    }
    for (size_t i = 0; i < n_models; i++)
        bpe_free(models[i].tok);
    bpe_out_free(&o);
    free(exp);
    printf("%s: %u reference lines, %zu models\n", bad ? "FAIL" : "PASS", n_lines, n_models);
    return bad;
}
