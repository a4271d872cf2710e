/*
 * tokenize.h - approximate tokenizers for OpenAI request text (log_options.tokenizer
 * in logread.h picks one).
 *
 * There is no model tokenizer here: counts are approximate, and only the sharing structure
 * matters to a prefix cache (identical text gives identical tokens, a shared text prefix a
 * shared token prefix up to the token that straddles the divergence). Two tokenizers:
 *
 *   TOK_BYTES  each byte of the UTF-8 text is one token, id = the byte (0..255).
 *                        Overcounts a model's BPE tokens by about 4x.
 *   TOK_WORDS  a token is a maximal run of word bytes (ASCII letters, ASCII
 *                        digits, and every byte >= 0x80, so UTF-8 sequences stay whole)
 *                        together with at most one ASCII space right before it; every other
 *                        byte (punctuation, newline, tab, a space not followed by a word
 *                        byte, the further spaces of a run of spaces) is a token by itself.
 *                        id = XXH32(token bytes, seed 0), and h + 1024 when h < 1024, so
 *                        text never takes a reserved id (0..1023). Undercounts a model's BPE
 *                        tokens by about 1.3x (long words and numbers split in BPE).
 *                        Example: "Hi,  you\n" -> "Hi" "," " " " you" "\n".
 *
 * In both, the chat template's markers are single tokens TOK_IM_START (256) and
 * TOK_IM_END (257), but only where the template wrote them (the caller passes their
 * positions): the same characters inside message text are ordinary text.
 *
 * Cost: one pass over the text, O(len); no allocation.
 */
#ifndef CLI_TOKENIZE_H
#define CLI_TOKENIZE_H

#include <stddef.h>
#include <stdint.h>

/* Tokenizers for OpenAI lines (the rules are above). Both give approximate
 * counts: words typically undercounts a model's BPE tokens by about 1.3x, bytes overcounts
 * them by about 4x. */
enum {
    TOK_WORDS = 1, /* words, punctuation and spaces, ids from XXH32 (default) */
    TOK_BYTES = 2  /* one token per UTF-8 byte, ids 0..255 */
};

/* Token ids of the chat template's markers, the same for both tokenizers. Ids below
 * TOK_N_RESERVED are never produced by the words tokenizer for text. */
enum {
    TOK_IM_START = 256,   /* "<|im_start|>" written by the chat template */
    TOK_IM_END = 257,     /* "<|im_end|>" written by the chat template */
    TOK_N_RESERVED = 1024 /* ids 0..1023: bytes, markers, future use */
};

#define TOK_IM_START_TEXT "<|im_start|>" /* text of TOK_IM_START */
#define TOK_IM_END_TEXT   "<|im_end|>"   /* text of TOK_IM_END */

/* A marker the chat template wrote into the text. */
typedef struct tok_mark {
    uint32_t offset; /* byte offset of the marker's first byte in the text */
    uint32_t id;     /* TOK_IM_START or TOK_IM_END */
} tok_mark;

/* Bytes taken in the text by marker id (12 or 10); 0 for any other id. Cannot fail. */
size_t tok_mark_bytes(uint32_t id);

/* Split text[0, len) into tokens with the given tokenizer (TOK_WORDS or
 * TOK_BYTES; any other value is taken as WORDS). marks lists the template's
 * markers by ascending offset, each lying wholly inside the text and not overlapping the
 * next. Writes token i's id to ids[i] and its starting byte offset to offsets[i]; both
 * arrays need room for as many entries as there are tokens (at most len: a token takes at
 * least one byte). When ids is NULL nothing is written and only the tokens are counted
 * (without hashing), so a caller can size the arrays exactly. len must be below 2^32.
 * Returns the number of tokens (0 only when len is 0). Cannot fail. */
size_t tok_split(int tokenizer, const char *text, size_t len, const tok_mark *marks, size_t n_marks,
                 uint32_t *ids, uint32_t *offsets);

#endif /* CLI_TOKENIZE_H */
