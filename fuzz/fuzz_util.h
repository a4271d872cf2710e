/*
 * fuzz_util.h - what the fuzz harnesses share (fz_*): an input reader, a failure report, a
 * checking allocator with failure injection, and a table of adversarial namespaces.
 *
 * Each harness (fuzz/fuzz_<target>.c) defines LLVMFuzzerTestOneInput and is linked either
 * with libFuzzer (meson -Dfuzzing=true under clang) or with fuzz/driver.c, which replays a
 * corpus directory as an ordinary test. Nothing here keeps state between inputs.
 *
 * Input reader: bytes are consumed from the front; reading past the end yields zeros, so
 * every input, the empty one included, decodes to a valid (if boring) program. Harnesses
 * read a byte per decision, so a mutation of one byte changes one decision.
 *
 * Allocator: every block handed to the library carries a 16-byte header with its size; a
 * free with another size, or with a pointer the allocator never gave, is a failure.
 * live_bytes and n_live must be zero after kvp_cache_free (no leaks, even after injected
 * failures). fail_in counts down allocations: the one made when it is 0 fails.
 */
#ifndef KVP_FUZZ_UTIL_H
#define KVP_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix.h"

/* The libFuzzer entry point every harness defines. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Report a violated property on stderr ("fuzz: <harness>: <message>") and abort, which
 * libFuzzer and the driver both treat as a crash. Never returns. */
void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define FZ_ASSERT(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fz_fail(__VA_ARGS__);                                                                  \
    } while (0)

/* The harness name printed by fz_fail; each harness sets it once per input. */
extern const char *fz_harness;

/* ---------------------------------------------------------------------------------------- */
/* Input reader                                                                             */
/* ---------------------------------------------------------------------------------------- */

typedef struct fz_in {
    const uint8_t *p; /* next unread byte */
    size_t n;         /* bytes left */
} fz_in;

static inline uint8_t fz_u8(fz_in *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

/* A value in 0 .. n-1 (n >= 1) from one byte, or two when n > 256. */
static inline size_t fz_below(fz_in *in, size_t n)
{
    size_t v = fz_u8(in);
    if (n > 256)
        v = v << 8 | fz_u8(in);
    return v % n;
}

static inline bool fz_more(const fz_in *in)
{
    return in->n > 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Checking allocator                                                                       */
/* ---------------------------------------------------------------------------------------- */

typedef struct fz_alloc {
    int64_t fail_in;   /* allocations to let through before failing one; -1: never fail */
    uint64_t n_failed; /* allocations failed on purpose */
    size_t live_bytes; /* bytes handed out and not freed */
    size_t n_live;     /* blocks handed out and not freed */
} fz_alloc;

/* Start with nothing live and no failure armed. */
void fz_alloc_init(fz_alloc *a);

/* Hooks for kvp_config.alloc that use *a. */
kvp_allocator fz_alloc_hooks(fz_alloc *a);

/* Fail unless everything allocated through *a has been freed. */
void fz_alloc_check_empty(const fz_alloc *a, const char *what);

/* ---------------------------------------------------------------------------------------- */
/* Namespaces                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* A decoded namespace and the storage its fields may point into (so an fz_ns must not be
 * copied by value once decoded). */
#define FZ_FIELD_MAX 6
typedef struct fz_ns {
    kvp_namespace ns;               /* the namespace; its fields point into bytes */
    uint8_t bytes[4][FZ_FIELD_MAX]; /* field bytes read from the input */
    int table_index;                /* adversarial table entry, or -1 when decoded */
} fz_ns;

/* Number of entries in the built-in adversarial table (see fuzz_util.c): pairs that must
 * stay apart, ("ab","c") / ("a","bc"), absent / empty, embedded and trailing NULs, one value
 * moved to another field; and pairs that must coincide (empty fields at distinct
 * addresses). */
size_t fz_ns_table_size(void);

/* Decode one namespace: usually (3 times in 4) a table entry, otherwise each field absent,
 * empty (at one of two addresses) or 1..5 input bytes that may contain NULs. Cannot fail. */
void fz_ns_decode(fz_in *in, fz_ns *out);

/* Decode n namespaces with fz_ns_decode, except that each one after the first is often (a
 * byte below 96) related to the one before: the next entry of the adversarial table (its
 * pair), or an exact copy - then both are one namespace and may share blocks. The copies
 * point into the set's own storage, so the set must stay where it is while it is used. */
void fz_ns_decode_set(fz_in *in, fz_ns *set, size_t n);

/* True when a and b are the same namespace for the cache: every field equal in presence and
 * bytes (the field addresses do not matter). */
bool fz_ns_equal(const kvp_namespace *a, const kvp_namespace *b);

#endif /* KVP_FUZZ_UTIL_H */
