/*
 * fuzz_hftok.c - libFuzzer harness: Hugging Face tokenizer.json loading and encoding
 * (src/cli/tok/hftok.h).
 *
 * The input is a tokenizer.json, optionally followed by a NUL byte and a text. Inputs over
 * 64 KiB are skipped. Asserted:
 *   - loading either succeeds or fails with a message that starts with the file's name;
 *   - a loaded tokenizer passes hf_check;
 *   - the text (cut at its first invalid UTF-8 byte, at most 4 KiB) encodes with specials
 *     on and off and with the post-processor's tokens, each without error; every id decodes
 *     (hf_token_bytes), offsets ascend and stay within the text plus base; encoding again
 *     gives the same tokens.
 * No crash, no sanitizer report, no leak; a deeply nested or huge file costs what jansson's
 * parse costs (bounded by the input).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "hftok.h"

#define MAX_INPUT (64u << 10)
#define MAX_TEXT  4096u

/* The length of the longest valid UTF-8 prefix of s[0, n). */
static size_t valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        size_t l = c < 0x80                  ? 1
                   : (c >= 0xc2 && c < 0xe0) ? 2
                   : (c >= 0xe0 && c < 0xf0) ? 3
                   : (c >= 0xf0 && c < 0xf5) ? 4
                                             : 0;
        if (l == 0 || i + l > n)
            return i;
        for (size_t k = 1; k < l; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
        if (l == 3 && ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0)))
            return i;
        if (l == 4 && ((c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90)))
            return i;
        i += l;
    }
    return i;
}

static void encode_checked(hftok *t, const char *text, size_t len, bool specials, bool post)
{
    uint32_t *ids = NULL, *offs = NULL, *ids2 = NULL, *offs2 = NULL;
    size_t n = 0, cap = 0, n2 = 0, cap2 = 0;
    char err[256] = "";
    const uint32_t base = 5;
    int rc = hf_encode(t, text, len, specials, post, base, &ids, &offs, &n, &cap, err, sizeof err);
    FZ_ASSERT(rc == 0 || rc == -1, "hf_encode: %d %s", rc, err);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) {
            const char *p;
            size_t l;
            FZ_ASSERT(hf_token_bytes(t, ids[i], &p, &l), "token %zu: id %u does not decode", i,
                      ids[i]);
            FZ_ASSERT(offs[i] >= base && offs[i] <= base + len, "token %zu: offset %u", i, offs[i]);
            FZ_ASSERT(i == 0 || offs[i] >= offs[i - 1], "token %zu: offsets descend", i);
        }
        rc = hf_encode(t, text, len, specials, post, base, &ids2, &offs2, &n2, &cap2, err,
                       sizeof err);
        FZ_ASSERT(rc == 0 && n2 == n && (n == 0 || memcmp(ids, ids2, n * sizeof *ids) == 0),
                  "encoding again differs");
    }
    free(ids);
    free(offs);
    free(ids2);
    free(offs2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_hftok";
    if (size > MAX_INPUT)
        return 0;
    const char *d = (const char *)data;
    const char *nul = memchr(d, 0, size);
    size_t jlen = nul ? (size_t)(nul - d) : size;
    hftok *t = NULL;
    char err[512] = "";
    int rc = hf_load_mem("fz.json", d, jlen, &t, err, sizeof err);
    if (rc != 0) {
        FZ_ASSERT(t == NULL && strncmp(err, "fz.json", 7) == 0, "a refusal without the name: %s",
                  err);
        return 0;
    }
    FZ_ASSERT(hf_check(t, err, sizeof err) == 0, "hf_check: %s", err);
    const char *text = nul ? nul + 1 : "Hello world, 123 <s> \xc3\xa9\xe4\xb8\xad  x";
    size_t tlen = nul ? size - jlen - 1 : strlen(text);
    if (tlen > MAX_TEXT)
        tlen = MAX_TEXT;
    tlen = valid_prefix((const unsigned char *)text, tlen);
    encode_checked(t, text, tlen, true, false);
    encode_checked(t, text, tlen, false, false);
    encode_checked(t, text, tlen, true, true);
    hf_free(t);
    return 0;
}
