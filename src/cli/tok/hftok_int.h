/*
 * hftok_int.h - what hftok.c (reading the file), hftok_enc.c (encoding) and hftok_pre.c
 * (normalizers and pre-tokenizers) share inside the Hugging Face tokenizer: the text buffer
 * that carries each byte's origin, the parsed normalizer and pre-tokenizer steps, and the
 * tokenizer's own layout (hftok.c's header comment describes it).
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

#include "hftok.h"

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

/* ---- the tokenizer (hftok.c loads it, hftok_enc.c encodes with it) ---- */

typedef struct added {
    uint32_t id;
    uint32_t off, len; /* content in the arena */
    bool special, lstrip, rstrip, normalized, single_word;
} added;

typedef struct mslot {
    uint64_t key;  /* left << 32 | right; UINT64_MAX empty */
    uint32_t rank; /* merge priority (its index in the file) */
    uint32_t id;   /* the merged token */
} mslot;

typedef struct lens {
    uint32_t *v; /* distinct lengths, descending */
    size_t n;
} lens;

typedef struct sym {
    uint32_t id, off; /* token, origin of its first byte */
    int32_t prev, next;
    bool dead;
} sym;

typedef struct cand {
    uint32_t rank, pos, id;
} cand;

struct hftok {
    char *arena;
    size_t arena_n, arena_cap;
    uint32_t *str_off, *str_len, *dec_off, *dec_len; /* by id */
    size_t n_ids;                                    /* entries of the arrays above */
    size_t n_vocab;                                  /* the model's vocabulary */
    uint32_t *vslot;                                 /* vocab table (id + 1), vmask + 1 slots */
    size_t vmask;
    mslot *mslots; /* merge table, mmask + 1 slots */
    size_t mmask, n_merges;
    added *add; /* added tokens */
    size_t n_add;
    uint32_t *aslot; /* added table (index + 1), amask + 1 slots */
    size_t amask;
    lens alens[2][256]; /* [normalized][first byte] */
    hf_norm *norm;
    size_t n_norm;
    hf_pre *pre;
    size_t n_pre;
    bool byte_level; /* a ByteLevel pre-tokenizer: map bytes to GPT-2 characters */
    bool byte_fallback, fuse_unk, ignore_merges;
    bool split_space; /* not byte-level, no ignore_merges, U+2581 a token, and no token
                         holds U+2581 after another character (hftok_enc.c) */
    bool has_unk;
    uint32_t unk;
    uint32_t byte_id[256];        /* <0xXX> tokens (byte_fallback; UINT32_MAX when missing) */
    uint32_t *pre_ids, *post_ids; /* TemplateProcessing "single" */
    size_t n_pre_ids, n_post_ids;
    char *bos, *eos;
    char *chat_template; /* tokenizer_config.json's, or NULL */
    hf_buf b1, b2, b3;   /* scratch: stretch, its normalized form, scratch */
    char *word;          /* scratch: one piece in model text */
    uint32_t *word_org;
    size_t word_cap;
    sym *syms;
    cand *heap;
    size_t sym_cap;
};

/* Lookups (hftok.c): a vocabulary token's id by its model text (UINT32_MAX when none), the
 * merge of the pair (a, b) (NULL when none), the added token with this content (NULL). */
uint32_t hft_vocab_find(const hftok *t, const char *p, size_t n);
const mslot *hft_merge_find(const hftok *t, uint32_t a, uint32_t b);
const added *hft_added_find(const hftok *t, const char *p, size_t n);

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
