/*
 * cbor.h - the canonical CBOR subset that vLLM's block hashes are computed over (RFC 8949,
 * section 4.2.1 "core deterministic encoding"): unsigned integers, byte strings, text
 * strings, arrays and null, every head in its shortest form.
 *
 * Encoding goes through a kvp__cbor_out writer: a caller-provided buffer and an optional
 * flush function. With no flush function the caller must have sized the buffer with the
 * kvp__cbor_*_len helpers (the fast path: one buffer, one one-shot hash); with one, the
 * buffer is handed to flush whenever it fills (the streaming path for large inputs), so
 * encoding never allocates and cannot fail.
 */
#ifndef KVP_CBOR_H
#define KVP_CBOR_H

#include <stddef.h>
#include <stdint.h>

/* CBOR major types used here (the top 3 bits of a head byte). */
enum {
    KVP__CBOR_UINT = 0,  /* unsigned integer */
    KVP__CBOR_BYTES = 2, /* byte string */
    KVP__CBOR_TEXT = 3,  /* UTF-8 text string */
    KVP__CBOR_ARRAY = 4  /* array of n items */
};

#define KVP__CBOR_NULL 0xf6 /* the simple value null */

typedef struct kvp__cbor_out {
    unsigned char *buf; /* output buffer */
    size_t n;           /* bytes written to buf and not yet flushed */
    size_t cap;         /* size of buf; >= 9 (one head) when flush is set */
    void (*flush)(void *ud, const unsigned char *p, size_t n); /* NULL: buf is big enough */
    void *ud;                                                  /* passed to flush */
} kvp__cbor_out;

/* Bytes of the shortest head for argument v: 1, 2, 3, 5 or 9. Cannot fail. */
size_t kvp__cbor_head_len(uint64_t v);

/* Write a head (major type, argument) in its shortest form. Cannot fail. */
void kvp__cbor_head(kvp__cbor_out *o, unsigned major, uint64_t v);

/* Write raw bytes (a string's payload). Cannot fail. */
void kvp__cbor_raw(kvp__cbor_out *o, const void *p, size_t n);

/* Write a byte or text string: its head then its bytes. Cannot fail. */
void kvp__cbor_string(kvp__cbor_out *o, unsigned major, const void *p, size_t n);

/* Write an array of n unsigned integers (token ids). Cannot fail. */
void kvp__cbor_uint_array(kvp__cbor_out *o, const uint32_t *v, size_t n);

/* Bytes kvp__cbor_uint_array would write. Cannot fail. */
size_t kvp__cbor_uint_array_len(const uint32_t *v, size_t n);

/* Hand the unflushed bytes to flush (does nothing without one). Cannot fail. */
void kvp__cbor_finish(kvp__cbor_out *o);

/* Is p[0 .. n) well-formed UTF-8 (what a CBOR text string must hold)? Cannot fail. */
int kvp__utf8_valid(const unsigned char *p, size_t n);

#endif /* KVP_CBOR_H */
