/*
 * hftok_int.h - what hftok.c (the file, added tokens, BPE) and hftok_pre.c (normalizers
 * and pre-tokenizers) share inside the Hugging Face tokenizer: the text buffer that
 * carries each byte's origin, and the parsed normalizer and pre-tokenizer steps.
 *
 * hf_buf invariants: s[0, n) is the text being worked on, org[i] the byte of the original
 * input that s[i] came from (non-decreasing), and cut[0, ncut) the piece boundaries:
 * cut[0] == 0, cut[ncut - 1] == n, strictly ascending (no empty piece), ncut >= 1.
 */
#ifndef CLI_HFTOK_INT_H
#define CLI_HFTOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hf_buf {
    char *s;       /* text (owned) */
    uint32_t *org; /* origin of each byte (owned) */
    size_t n, cap; /* bytes used / allocated in s and org */
    uint32_t *cut; /* piece boundaries (owned) */
    size_t ncut, cutcap;
} hf_buf;

enum { HN_NFC = 1, HN_NFKC, HN_NFD, HN_NFKD, HN_REPLACE, HN_PREPEND };
enum { HP_SPLIT = 1, HP_BYTELEVEL, HP_DIGITS, HP_METASPACE };
enum { HB_REMOVED = 1, HB_ISOLATED, HB_PREV, HB_NEXT, HB_CONTIG };
enum { MS_ALWAYS = 1, MS_FIRST, MS_NEVER };

typedef struct hf_norm {
    int type;    /* HN_* */
    char *a, *b; /* Replace: pattern, content; Prepend: a the text (owned) */
    size_t alen, blen;
} hf_norm;

typedef struct hf_pre {
    int type;       /* HP_* */
    pcre2_code *re; /* Split with a Regex; ByteLevel with use_regex (owned) */
    pcre2_match_data *md;
    char *lit; /* Split with a String; Metaspace's replacement (owned) */
    size_t litlen;
    int behavior;      /* Split: HB_* */
    bool invert;       /* Split */
    bool prefix_space; /* ByteLevel add_prefix_space */
    bool individual;   /* Digits individual_digits */
    int prepend;       /* Metaspace: MS_* */
    bool split;        /* Metaspace split */
} hf_pre;

/* Grow b to hold need bytes / cuts. Return false when out of memory. */
bool hfb_reserve(hf_buf *b, size_t need);
bool hfb_reserve_cuts(hf_buf *b, size_t need);
void hfb_free(hf_buf *b);

/* Parse a normalizer / pre-tokenizer JSON value (null allowed) into a growing array of
 * steps (Sequence flattened). Return 0, or -1 with `unsupported normalizer "X"` (or the
 * malformed field) in err, -3 out of memory. */
int hfp_parse_norm(const json_t *j, hf_norm **v, size_t *n, char *err, size_t err_size);
int hfp_parse_pre(const json_t *j, hf_pre **v, size_t *n, char *err, size_t err_size);
void hfp_free_norm(hf_norm *v, size_t n);
void hfp_free_pre(hf_pre *v, size_t n);

/* Apply the normalizer steps to b (one piece, cut rebuilt to [0, n)); tmp is scratch.
 * Returns 0, -3 out of memory. */
int hfp_normalize(const hf_norm *v, size_t n, hf_buf *b, hf_buf *tmp);

/* Apply the pre-tokenizer steps to b's pieces. first: b starts the whole input (Metaspace's
 * prepend_scheme "first"). Returns 0, -1 with a message (PCRE2 failure), -3. */
int hfp_pretokenize(hf_pre *v, size_t n, hf_buf *b, hf_buf *tmp, bool first, char *err,
                    size_t err_size);

/* Compile a pattern (PCRE2_UTF | PCRE2_UCP); NULL with the message in err. */
pcre2_code *hfp_compile(const char *pat, size_t len, char *err, size_t err_size);

/* GPT-2's byte-to-character table: the UTF-8 of byte b's character (1 or 2 bytes). */
size_t hfp_byte_char(unsigned char b, char out[2]);

#endif /* CLI_HFTOK_INT_H */
