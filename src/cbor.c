/*
 * cbor.c - canonical CBOR encoding of unsigned integers, strings, arrays and null (see
 * cbor.h): the byte layout vLLM hashes for its block keys, written by hand because the
 * subset is five head forms and a library would add a dependency for nothing.
 *
 * A head is the major type in the top 3 bits of the first byte and an argument: below 24
 * in the low 5 bits, else 24/25/26/27 followed by 1/2/4/8 big-endian bytes, always the
 * shortest form that holds the argument (canonical). A token id is a uint head; a string is
 * a head whose argument is its byte length, then the bytes; an array is a head whose
 * argument is the item count, then the items.
 */
#include <string.h>

#include "cbor.h"

size_t kvp__cbor_head_len(uint64_t v)
{
    if (v < 24)
        return 1;
    if (v <= UINT8_MAX)
        return 2;
    if (v <= UINT16_MAX)
        return 3;
    if (v <= UINT32_MAX)
        return 5;
    return 9;
}

static void out_flush(kvp__cbor_out *o)
{
    if (o->flush && o->n) {
        o->flush(o->ud, o->buf, o->n);
        o->n = 0;
    }
}

/* Room for n more bytes, n <= 9 (flushes first when needed). */
static unsigned char *out_room(kvp__cbor_out *o, size_t n)
{
    if (o->n + n > o->cap)
        out_flush(o);
    unsigned char *p = o->buf + o->n;
    o->n += n;
    return p;
}

void kvp__cbor_head(kvp__cbor_out *o, unsigned major, uint64_t v)
{
    size_t len = kvp__cbor_head_len(v);
    unsigned char *p = out_room(o, len);
    unsigned char mt = (unsigned char)(major << 5);
    if (len == 1) {
        p[0] = (unsigned char)(mt | v);
        return;
    }
    static const unsigned char info[10] = {0, 0, 24, 25, 0, 26, 0, 0, 0, 27};
    p[0] = (unsigned char)(mt | info[len]);
    for (size_t i = 1; i < len; i++)
        p[i] = (unsigned char)(v >> (8 * (len - 1 - i)));
}

void kvp__cbor_raw(kvp__cbor_out *o, const void *p, size_t n)
{
    const unsigned char *s = p;
    while (n > 0) {
        if (o->n == o->cap)
            out_flush(o);
        size_t k = o->cap - o->n < n ? o->cap - o->n : n;
        memcpy(o->buf + o->n, s, k);
        o->n += k;
        s += k;
        n -= k;
    }
}

void kvp__cbor_string(kvp__cbor_out *o, unsigned major, const void *p, size_t n)
{
    kvp__cbor_head(o, major, n);
    kvp__cbor_raw(o, p, n);
}

/* Write the uint head of v at p (room for 5 bytes); returns the bytes written. */
static inline size_t put_uint32(unsigned char *p, uint32_t v)
{
    if (v < 24) {
        p[0] = (unsigned char)v;
        return 1;
    }
    if (v <= UINT8_MAX) {
        p[0] = 24;
        p[1] = (unsigned char)v;
        return 2;
    }
    if (v <= UINT16_MAX) {
        p[0] = 25;
        p[1] = (unsigned char)(v >> 8);
        p[2] = (unsigned char)v;
        return 3;
    }
    p[0] = 26;
    p[1] = (unsigned char)(v >> 24);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 8);
    p[4] = (unsigned char)v;
    return 5;
}

/* Token ids are most of a block's encoding: when the buffer has room for the worst case
 * (5 bytes each) they are written in one tight loop, else head by head with flushes. */
void kvp__cbor_uint_array(kvp__cbor_out *o, const uint32_t *v, size_t n)
{
    kvp__cbor_head(o, KVP__CBOR_ARRAY, n);
    if (o->cap - o->n >= 5 * n) {
        unsigned char *p = o->buf + o->n;
        for (size_t i = 0; i < n; i++)
            p += put_uint32(p, v[i]);
        o->n = (size_t)(p - o->buf);
        return;
    }
    for (size_t i = 0; i < n; i++)
        kvp__cbor_head(o, KVP__CBOR_UINT, v[i]);
}

size_t kvp__cbor_uint_array_len(const uint32_t *v, size_t n)
{
    size_t len = kvp__cbor_head_len(n);
    for (size_t i = 0; i < n; i++)
        len += kvp__cbor_head_len(v[i]);
    return len;
}

void kvp__cbor_finish(kvp__cbor_out *o)
{
    out_flush(o);
}

/* Length of the UTF-8 sequence led by byte c, 0 if c cannot lead one. */
static size_t utf8_seq_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef)
        return 3;
    if (c >= 0xf0 && c <= 0xf4)
        return 4;
    return 0;
}

/* Rejects overlong forms, surrogates and code points above U+10FFFF, as Python's encoder
 * never produces them (a vLLM name is a Python str). */
int kvp__utf8_valid(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t len = utf8_seq_len(p[i]);
        if (len == 0 || len > n - i)
            return 0;
        uint32_t cp = len == 1 ? p[i] : (uint32_t)(p[i] & (0x7f >> len));
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += len;
    }
    return 1;
}
