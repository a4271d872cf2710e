/*
 * grow.c - the tool's one growable-array helper (replay, its engine and diagnostics, the log
 * reader's arrays, the OpenAI renderer, plan's trace lengths): one doubling realloc with an
 * overflow check, so each array needs only a pointer and a capacity.
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
