/*
 * tok_util.h - what the tokenizer harnesses (fuzz_tokenize, fuzz_template) share (tku_*):
 * small tiktoken rank files written to a temporary directory, the tokenizers bpe_load makes
 * of them, and a reference encoder that checks every token id they produce.
 *
 * Fixed tokenizers. tku_fixed(kind) loads, once per process, a tokenizer of each kind from
 * one small vocabulary: the 256 single bytes (ranks 0..255, in a shuffled order as real
 * files have them) and about sixty merges chosen to make the merge loop work (runs of one
 * letter, overlapping pairs, runs of spaces and newlines, digits, pieces of multi-byte
 * UTF-8 characters, a token no merge reaches, the template's control words), with gaps in
 * the ranks. llama3 is loaded by kind and has only its built-in specials; cl100k takes its
 * kind from a sidecar that adds <|im_start|>, <|im_end|>, Mistral's control words, <s>,
 * </s> and "[TOOL_CALLS] [" (which extends "[TOOL_CALLS]": the longest special wins) as
 * specials and names <s>/</s> as bos/eos; o200k's sidecar moves <|endofprompt|> to
 * another id. bpe_check must pass after every load.
 *
 * Reference encoder. tku_ref holds its own copy of what the harness wrote (the vocabulary
 * sorted for binary search, the special tokens as bpe.h documents each kind's, plus the
 * sidecar's) and encodes as bpe.h describes, sharing no code with bpe.c: specials by a
 * scan of every special at every byte (the longest wins); pre-tokenization by the kind's
 * expression (bpe_pattern) run through PCRE2's interpreter (bpe.c uses the JIT when it
 * can); merging by tiktoken's rule written plainly (a whole-piece token first, then the
 * lowest-ranked adjacent pair, leftmost on a tie, until none is a token). Its ids and
 * offsets must equal bpe_encode's exactly.
 *
 * Nothing here is freed before exit except through tku_vocab_free/tku_ref_free: the fixed
 * tokenizers live for the process (LeakSanitizer sees them as reachable), and the
 * temporary directory is removed at exit.
 */
#ifndef KVP_FUZZ_TOK_UTIL_H
#define KVP_FUZZ_TOK_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* One token of a vocabulary: bytes[off, off + len) of its arena, and its rank. */
typedef struct tku_entry {
    uint32_t off;  /* first byte in the arena */
    uint32_t len;  /* bytes (at least 1) */
    uint32_t rank; /* the token's id */
} tku_entry;

/* A vocabulary as the harness writes it; zero it before use. */
typedef struct tku_vocab {
    unsigned char *arena; /* every token's bytes */
    size_t arena_len;     /* bytes used at arena */
    size_t arena_cap;     /* bytes allocated at arena */
    tku_entry *e;         /* tokens, in the order added until tku_vocab_seal sorts them */
    size_t n;             /* tokens */
    size_t cap;           /* entries allocated at e */
    bool sealed;          /* e is sorted by bytes (tku_vocab_seal) */
} tku_vocab;

/* A special token. */
typedef struct tku_special {
    char text[48]; /* NUL-terminated */
    size_t len;    /* bytes of text */
    uint32_t id;   /* token id */
} tku_special;

/* The reference encoder of one tokenizer. */
typedef struct tku_ref {
    int kind;             /* BPE_* */
    const tku_vocab *v;   /* the ordinary tokens (sealed), not owned */
    tku_special *sp;      /* special tokens */
    size_t n_sp;          /* entries of sp */
    size_t sp_cap;        /* entries allocated at sp */
    pcre2_code *re;       /* the kind's expression, without JIT */
    pcre2_match_data *md; /* its match data */
    uint32_t *ids;        /* output of tku_ref_encode */
    uint32_t *offs;       /* its token offsets */
    size_t n_out;         /* tokens at ids and offs */
    size_t out_cap;       /* entries allocated at each */
    uint32_t *st;         /* merge scratch: part starts */
    uint32_t *rk;         /* merge scratch: pair ranks */
    size_t st_cap;        /* entries allocated at st and rk */
} tku_ref;

/* Add token bytes p[0, n) with rank to v (before sealing). Cannot fail (aborts on OOM). */
void tku_vocab_add(tku_vocab *v, const void *p, size_t n, uint32_t rank);

/* Whether v holds a token with bytes p[0, n) (sealed or not). Cannot fail. */
bool tku_vocab_has(const tku_vocab *v, const void *p, size_t n);

/* Sort v by bytes for tku_vocab_rank. Cannot fail. */
void tku_vocab_seal(tku_vocab *v);

/* Rank of the token with bytes p[0, n) in sealed v, or UINT32_MAX. Cannot fail. */
uint32_t tku_vocab_rank(const tku_vocab *v, const void *p, size_t n);

/* Write v as a tiktoken rank file ("BASE64 RANK" lines, in the order added) to path. */
void tku_vocab_write(const tku_vocab *v, const char *path);

void tku_vocab_free(tku_vocab *v);

/* The temporary directory (made on first call, removed with what is in it at exit). */
const char *tku_dir(void);

/* Write text to path (a file in tku_dir()) and remember to remove it at exit. */
void tku_write_file(const char *path, const char *text, size_t len);

/* The fixed tokenizer of kind (see above) and its reference; loaded on first call. */
bpe *tku_fixed(int kind, tku_ref **ref);

/* A reference for kind over sealed vocabulary v, with the kind's built-in specials as
 * bpe.h lists them. */
void tku_ref_init(tku_ref *r, int kind, const tku_vocab *v);

/* Add special text -> id, or move an existing one to id (as a sidecar does). */
void tku_ref_special(tku_ref *r, const char *text, uint32_t id);

/* Encode valid UTF-8 text[0, len) into r->ids / r->offs (r->n_out), offsets plus base. */
void tku_ref_encode(tku_ref *r, const char *text, size_t len, bool specials, uint32_t base);

void tku_ref_free(tku_ref *r);

/* Offset of the first byte of s[0, n) that does not belong to a valid UTF-8 sequence
 * (shortest form, no surrogates, at most U+10FFFF), or n. Cannot fail. */
size_t tku_utf8_invalid_at(const unsigned char *s, size_t n);

/* Check tokens ids/offs[0, n) of text[0, len) encoded with base: offsets start at base,
 * ascend strictly and tile the text, and each token's bytes (bpe_token_bytes) are the
 * text it spans, so the ids decode back to exactly the text. what names the call in a
 * failure. */
void tku_check_tiling(const bpe *t, const char *text, size_t len, uint32_t base,
                      const uint32_t *ids, const uint32_t *offs, size_t n, const char *what);

/* Check that bpe_encode's tokens ids/offs[0, n) equal the reference's (r->ids, r->offs). */
void tku_check_ref(const tku_ref *r, const uint32_t *ids, const uint32_t *offs, size_t n,
                   const char *what);

#endif /* KVP_FUZZ_TOK_UTIL_H */
