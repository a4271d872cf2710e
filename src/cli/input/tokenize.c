/*
 * tokenize.c - the approximate bytes and words tokenizers (rules in tokenize.h).
 *
 * Both walk the text once, left to right. The next marker's offset is kept at hand: at that
 * offset a single marker token is emitted and its bytes skipped; everywhere else the text
 * rules apply, and a word run never extends past the next marker (a marker begins with '<',
 * not a word byte, so this only guards against a caller's odd marker placement).
 *
 * Invariant: offsets[] ascend strictly and each token is at least one byte, so at most len
 * tokens come out. Cost: O(len) plus one XXH32 per words token, which dominates; logread
 * runs a counting pass first (no hashing, no writes) to size its arrays exactly, since
 * reserving len entries would cost 8 bytes per byte of text where words give about one
 * token per 4-5 bytes.
 */
#include "tokenize.h"

#include <stdbool.h>
#include <xxhash.h>

size_t tok_mark_bytes(uint32_t id)
{
    switch (id) {
    case TOK_IM_START:
        return sizeof TOK_IM_START_TEXT - 1;
    case TOK_IM_END:
        return sizeof TOK_IM_END_TEXT - 1;
    default:
        return 0;
    }
}

static inline bool is_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

/* The id of a words token: XXH32 with seed 0, moved out of the reserved range. */
static inline uint32_t word_id(const char *p, size_t n)
{
    uint32_t h = XXH32(p, n, 0);
    return h < TOK_N_RESERVED ? h + TOK_N_RESERVED : h;
}

size_t tok_split(int tokenizer, const char *text, size_t len, const tok_mark *marks, size_t n_marks,
                 uint32_t *ids, uint32_t *offsets)
{
    const unsigned char *u = (const unsigned char *)text;
    bool bytes = tokenizer == TOK_BYTES;
    size_t n = 0, m = 0, i = 0;
    while (i < len) {
        while (m < n_marks && marks[m].offset < i)
            m++; /* only a misplaced (overlapping) marker is ever skipped */
        size_t next_mark = m < n_marks ? marks[m].offset : len;
        if (i == next_mark) {
            size_t w = tok_mark_bytes(marks[m].id);
            if (ids != NULL) {
                ids[n] = marks[m].id;
                offsets[n] = (uint32_t)i;
            }
            n++;
            i += w > 0 ? w : 1;
            m++;
            continue;
        }
        if (bytes) {
            if (ids != NULL) {
                ids[n] = u[i];
                offsets[n] = (uint32_t)i;
            }
            n++;
            i++;
            continue;
        }
        size_t start = i, j = i;
        if (u[j] == ' ' && j + 1 < next_mark && is_word_byte(u[j + 1]))
            j++;
        if (is_word_byte(u[j])) {
            while (j < next_mark && is_word_byte(u[j]))
                j++;
        } else {
            j = i + 1;
        }
        if (ids != NULL) {
            ids[n] = word_id(text + start, j - start);
            offsets[n] = (uint32_t)start;
        }
        n++;
        i = j;
    }
    return n;
}
