/*
 * grow.c - the tool's one growable-array helper (replay, its engine and diagnostics, the log
 * reader's arrays, the OpenAI renderer, plan's trace lengths): one doubling realloc with an
 * overflow check, so each array needs only a pointer and a capacity; and, built on it, the
 * one whole-stream reader (rank files, `kvprefix tokenize`'s input, the tokenizer tests).
 */
#include <stdint.h>
#include <stdlib.h>

#include "cli.h"

bool cli_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 64;
    while (n < need) {
        if (n > SIZE_MAX / 2 / elem)
            return false;
        n *= 2;
    }
    void *q = realloc(*p, n * elem);
    if (!q)
        return false;
    *p = q;
    *cap = n;
    return true;
}

int cli_read_all(FILE *f, size_t max, char **buf, size_t *len)
{
    char *b = NULL;
    size_t cap = 0, n = 0;
    int rc = CLI_READ_OK;
    for (;;) {
        if (!cli_grow((void **)&b, &cap, n + 65536 + 1, 1)) {
            rc = CLI_READ_NOMEM;
            break;
        }
        size_t got = fread(b + n, 1, cap - n - 1, f);
        n += got;
        if (n > max) {
            rc = CLI_READ_TOOBIG;
            break;
        }
        if (got == 0) {
            rc = ferror(f) ? CLI_READ_EIO : CLI_READ_OK;
            break;
        }
    }
    if (rc != CLI_READ_OK) {
        free(b);
        return rc;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return CLI_READ_OK;
}
