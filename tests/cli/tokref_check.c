/*
 * tokref_check.c - the tokenizer reference check: every token id of the BPE tokenizer
 * (src/cli/tok/bpe.c) against the npm reference tokenizers on the corpus in
 * tests/cli/data/tok/corpus.
 *
 *   tokref_check REF_DIR CORPUS_DIR
 *
 * REF_DIR is what scripts/tokref.sh wrote: the rank files and sidecars extracted from
 * js-tiktoken (cl100k_base, o200k_base) and llama3-tokenizer-js (Llama 3), and
 * expected.txt, the references' ids for every corpus file in two modes ("special": special
 * token text is the special token; "text": it is ordinary text), one line each:
 *
 *   KIND MODE FILE N id id ...
 *
 * For each line the file is encoded with bpe_encode and compared id by id; a mismatch prints
 * the first differing position with the bytes of both tokens. The run also checks that the
 * corpus lists every kind and mode for every file, that the tokens' bytes join back to the
 * text (offsets ascending, covering it), and the loaded tables with bpe_check.
 *
 * Exit status: 0 every id matches; 1 a mismatch or a malformed reference; 77 (meson's
 * SKIP) when REF_DIR has no expected.txt, that is when scripts/tokref.sh could not reach
 * the npm registry, unless KVPREFIX_TOKREF_REQUIRED=1 (CI), where that is a failure.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "cli.h"

#define SKIP 77

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

typedef struct kind_ref {
    const char *kind; /* name in expected.txt */
    const char *file; /* rank file in REF_DIR */
    bpe *tok;         /* loaded */
    unsigned n_lines; /* expected lines checked */
} kind_ref;

static kind_ref kinds[] = {
    {"cl100k", "cl100k_base.tiktoken", NULL, 0},
    {"o200k", "o200k_base.tiktoken", NULL, 0},
    {"llama3", "llama3.tiktoken", NULL, 0},
};

/* Print token id's bytes, escaped, for a mismatch message. */
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

/* Check that the tokens of text cover it: offsets ascend from 0 and each token's bytes are
 * the text at its offset. Returns true when they do. */
static bool covers(const bpe *t, const char *text, size_t len, const bpe_out *o)
{
    size_t at = 0;
    for (size_t i = 0; i < o->n; i++) {
        const char *p;
        size_t n;
        if (o->offsets[i] != at || !bpe_token_bytes(t, o->ids[i], &p, &n) || n > len - at ||
            memcmp(text + at, p, n) != 0) {
            printf("  token %zu (offset %u) does not continue the text at byte %zu\n", i,
                   o->offsets[i], at);
            return false;
        }
        at += n;
    }
    if (at != len)
        printf("  tokens cover %zu of %zu bytes\n", at, len);
    return at == len;
}

/* Check one expected line. Returns 0 when every id matches, else 1. */
static int check_line(char *line, const char *corpus_dir, bpe_out *o)
{
    char kind[16], mode[16], file[256];
    size_t n_exp;
    int used = 0;
    if (sscanf(line, "%15s %15s %255s %zu%n", kind, mode, file, &n_exp, &used) != 4) {
        printf("malformed reference line: %.80s\n", line);
        return 1;
    }
    kind_ref *k = NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kinds[i].kind, kind) == 0)
            k = &kinds[i];
    if (k == NULL || (strcmp(mode, "special") != 0 && strcmp(mode, "text") != 0)) {
        printf("unknown kind or mode in: %.80s\n", line);
        return 1;
    }
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
    int rc = bpe_encode(k->tok, text, len, strcmp(mode, "special") == 0, 0, o, err, sizeof err);
    int bad = 0;
    if (rc != BPE_OK) {
        printf("%s %s %s: encode failed: %s\n", kind, mode, file, err);
        bad = 1;
    }
    char *p = line + used;
    for (size_t i = 0; !bad && i < n_exp; i++) {
        char *e;
        unsigned long id = strtoul(p, &e, 10);
        if (e == p) {
            printf("%s %s %s: reference ends after %zu of %zu ids\n", kind, mode, file, i, n_exp);
            bad = 1;
            break;
        }
        p = e;
        if (i >= o->n || o->ids[i] != id) {
            printf("%s %s %s: token %zu (byte %u): expected ", kind, mode, file, i,
                   i < o->n ? o->offsets[i] : (unsigned)len);
            show_token(k->tok, (uint32_t)id);
            printf(", got ");
            if (i < o->n)
                show_token(k->tok, o->ids[i]);
            else
                printf("the end");
            printf("\n");
            bad = 1;
        }
    }
    if (!bad && o->n != n_exp) {
        printf("%s %s %s: %zu tokens, the reference has %zu\n", kind, mode, file, o->n, n_exp);
        bad = 1;
    }
    if (!bad && !covers(k->tok, text, len, o)) {
        printf("%s %s %s: the tokens do not join back to the text\n", kind, mode, file);
        bad = 1;
    }
    if (!bad)
        printf("ok %s %s %s: %zu tokens, %zu bytes\n", kind, mode, file, n_exp, len);
    k->n_lines++;
    free(text);
    return bad;
}

static int load_kinds(const char *ref_dir)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char path[4096], err[512];
        snprintf(path, sizeof path, "%s/%s", ref_dir, kinds[i].file);
        if (bpe_load(path, 0, &kinds[i].tok, err, sizeof err) != BPE_OK) {
            printf("%s\n", err);
            return 1;
        }
        if (bpe_check(kinds[i].tok, err, sizeof err) != 0) {
            printf("%s: bpe_check: %s\n", path, err);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tokref_check REF_DIR CORPUS_DIR\n");
        return 2;
    }
    const char *req = getenv("KVPREFIX_TOKREF_REQUIRED");
    bool required = req != NULL && strcmp(req, "1") == 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/expected.txt", argv[1]);
    size_t len;
    char *exp = slurp(path, &len);
    if (exp == NULL) {
        printf("SKIP: %s is missing: run scripts/tokref.sh (it needs node, npm and the npm "
               "registry) to fetch the reference tokenizers\n",
               path);
        return required ? 1 : SKIP;
    }
    int bad = load_kinds(argv[1]);
    bpe_out o = {0};
    unsigned n_lines = 0;
    for (char *line = exp; !bad && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (*line) {
            bad |= check_line(line, argv[2], &o);
            n_lines++;
        }
        line = nl ? nl + 1 : line + strlen(line);
    }
    for (size_t i = 0; !bad && i < sizeof kinds / sizeof kinds[0]; i++)
        if (kinds[i].n_lines == 0 || kinds[i].n_lines * 3 != n_lines) {
            printf("%s: %u reference lines of %u: the reference is incomplete\n", kinds[i].kind,
                   kinds[i].n_lines, n_lines);
            bad = 1;
        }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        bpe_free(kinds[i].tok);
    bpe_out_free(&o);
    free(exp);
    printf("%s: %u reference lines\n", bad ? "FAIL" : "PASS", n_lines);
    return bad;
}
