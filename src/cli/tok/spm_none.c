/*
 * spm_none.c - spm_shim.h for builds without libsentencepiece (meson's 'sentencepiece'
 * feature off or the library missing): every model is refused with a message that says
 * how to get support; nothing else can be reached, since no spm is ever made.
 */
#include <stdio.h>

#include "spm_shim.h"

bool spm_available(void)
{
    return false;
}

int spm_load(const char *path, spm **out, char *err, size_t err_size)
{
    (void)out;
    snprintf(err, err_size,
             "%s: a SentencePiece model (protobuf), which this build does not read (configure "
             "with libsentencepiece-dev installed, -Dsentencepiece=enabled): give the model's "
             "tokenizer.json",
             path);
    return -1;
}

void spm_free(spm *t)
{
    (void)t;
}

size_t spm_n_pieces(const spm *t)
{
    (void)t;
    return 0;
}

const char *spm_bos(const spm *t)
{
    (void)t;
    return "";
}

const char *spm_eos(const spm *t)
{
    (void)t;
    return "";
}

bool spm_special(const spm *t, const char *text, size_t len, uint32_t *id)
{
    (void)t, (void)text, (void)len, (void)id;
    return false;
}

int spm_encode(spm *t, const char *text, size_t len, bool specials, uint32_t base, uint32_t **ids,
               uint32_t **offs, size_t *n, size_t *cap, char *err, size_t err_size)
{
    (void)t, (void)text, (void)len, (void)specials, (void)base, (void)ids, (void)offs, (void)n;
    (void)cap;
    snprintf(err, err_size, "no SentencePiece support in this build");
    return -1;
}

bool spm_token_bytes(const spm *t, uint32_t id, const char **p, size_t *len)
{
    (void)t, (void)id, (void)p, (void)len;
    return false;
}
