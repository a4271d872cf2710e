/*
 * fuzz_util.c - the helpers shared by the fuzz harnesses (see fuzz_util.h): failure
 * reports, the checking allocator and the adversarial namespace table.
 *
 * The allocator prefixes each block with a 16-byte header holding the requested size and a
 * magic word, so a free with a wrong size or of a foreign pointer is caught at once rather
 * than as heap corruption later. The header keeps the 16-byte alignment malloc gives.
 */
#include "fuzz_util.h"

#include <xxhash.h> /* not XXH_INLINE_ALL: the oracle calls libxxhash's own XXH3 */

#include "internal.h" /* kvp__cache_set_key_bits, the test-only truncation hook */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *fz_harness = "fuzz";

void fz_fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz: %s: ", fz_harness);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

/* ---------------------------------------------------------------------------------------- */
/* Checking allocator                                                                       */
/* ---------------------------------------------------------------------------------------- */

#define FZ_MAGIC UINT64_C(0x6b76707a66757a7a) /* "kvpzfuzz" */

typedef struct fz_header {
    uint64_t size;  /* bytes requested */
    uint64_t magic; /* FZ_MAGIC while allocated */
} fz_header;

void fz_alloc_init(fz_alloc *a)
{
    memset(a, 0, sizeof *a);
    a->fail_in = -1;
}

static void *fz_alloc_fn(void *ud, size_t size)
{
    fz_alloc *a = ud;
    if (a->fail_in == 0) {
        a->fail_in = -1;
        a->n_failed++;
        return NULL;
    }
    if (a->fail_in > 0)
        a->fail_in--;
    FZ_ASSERT(size > 0, "the library asked for 0 bytes");
    if (size > ((size_t)1 << 30))
        return NULL; /* bounded memory per input: an absurd request simply fails */
    fz_header *h = malloc(sizeof *h + size);
    if (!h)
        return NULL;
    h->size = size;
    h->magic = FZ_MAGIC;
    a->live_bytes += size;
    a->n_live++;
    return h + 1;
}

static void fz_free_fn(void *ud, void *ptr, size_t size)
{
    fz_alloc *a = ud;
    if (!ptr)
        return;
    fz_header *h = (fz_header *)ptr - 1;
    FZ_ASSERT(h->magic == FZ_MAGIC, "free of a pointer the allocator did not hand out");
    FZ_ASSERT(h->size == size, "free with size %zu of a block of %llu bytes", size,
              (unsigned long long)h->size);
    FZ_ASSERT(a->n_live > 0 && a->live_bytes >= size, "more frees than allocations");
    h->magic = 0;
    a->live_bytes -= size;
    a->n_live--;
    free(h);
}

kvp_allocator fz_alloc_hooks(fz_alloc *a)
{
    kvp_allocator hooks = {fz_alloc_fn, fz_free_fn, a};
    return hooks;
}

void fz_alloc_check_empty(const fz_alloc *a, const char *what)
{
    FZ_ASSERT(a->n_live == 0 && a->live_bytes == 0, "%s: %zu blocks (%zu bytes) not freed", what,
              a->n_live, a->live_bytes);
}

/* ---------------------------------------------------------------------------------------- */
/* Namespaces                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Two distinct addresses for an empty present field: equal namespaces either way. */
static const char empty_a[1] = "";
static const char empty_b[2] = "x";

/* Field initializers (without their braces, which the table writes). */
#define F(s)     (s), sizeof(s) - 1
#define FN(s, n) (s), (n)
#define ABSENT   NULL, 0
#define EMPTY_A  empty_a, 0
#define EMPTY_B  empty_b + 1, 0

/* Entries next to each other are the adversarial pairs; comments say which must differ. */
static const kvp_namespace table[] = {
    {{F("ab")}, {F("c")}, {ABSENT}, {ABSENT}},           /* 0 vs 1: framing of model/adapter */
    {{F("a")}, {F("bc")}, {ABSENT}, {ABSENT}},           /* 1 */
    {{F("abc")}, {ABSENT}, {ABSENT}, {ABSENT}},          /* 2: concatenation of 0 and 1 */
    {{F("m")}, {ABSENT}, {ABSENT}, {ABSENT}},            /* 3 vs 4: absent vs empty tenant */
    {{F("m")}, {ABSENT}, {EMPTY_A}, {ABSENT}},           /* 4 */
    {{F("m")}, {ABSENT}, {EMPTY_B}, {ABSENT}},           /* 5: equal to 4 (other address) */
    {{FN("m\0x", 3)}, {ABSENT}, {ABSENT}, {ABSENT}},     /* 6 vs 7: after an embedded NUL */
    {{FN("m\0y", 3)}, {ABSENT}, {ABSENT}, {ABSENT}},     /* 7 */
    {{FN("m\0", 2)}, {ABSENT}, {ABSENT}, {ABSENT}},      /* 8 vs 3: a trailing NUL is data */
    {{F("m")}, {FN("\0", 1)}, {ABSENT}, {ABSENT}},       /* 9 vs 3: a one-NUL adapter */
    {{F("m")}, {ABSENT}, {F("t")}, {ABSENT}},            /* 10 vs 11 vs 12: same value, */
    {{F("m")}, {ABSENT}, {ABSENT}, {F("t")}},            /* 11    other field */
    {{F("m")}, {F("t")}, {ABSENT}, {ABSENT}},            /* 12 */
    {{F("mt")}, {ABSENT}, {ABSENT}, {ABSENT}},           /* 13 vs 10: model+tenant joined */
    {{ABSENT}, {ABSENT}, {ABSENT}, {ABSENT}},            /* 14: all absent */
    {{EMPTY_A}, {ABSENT}, {ABSENT}, {ABSENT}},           /* 15 vs 14, 16: empty model */
    {{ABSENT}, {EMPTY_A}, {ABSENT}, {ABSENT}},           /* 16: empty adapter */
    {{F("m")}, {ABSENT}, {F("t")}, {EMPTY_A}},           /* 17 vs 10: empty salt */
    {{F("m")}, {ABSENT}, {F("t")}, {EMPTY_B}},           /* 18: equal to 17 */
    {{F("m")}, {F("a")}, {F("t")}, {F("s")}},            /* 19: all present */
    {{F("m")}, {F("a")}, {F("ts")}, {ABSENT}},           /* 20 vs 19: tenant+salt joined */
    {{FN("\0\0", 2)}, {ABSENT}, {ABSENT}, {ABSENT}},     /* 21 vs 22: NUL counts */
    {{FN("\0", 1)}, {FN("\0", 1)}, {ABSENT}, {ABSENT}},  /* 22 */
    {{FN("\x01\x01", 2)}, {ABSENT}, {ABSENT}, {ABSENT}}, /* 23: looks like a present-flag */
};

size_t fz_ns_table_size(void)
{
    return sizeof table / sizeof table[0];
}

static kvp_field *field_of(kvp_namespace *ns, int i)
{
    switch (i) {
    case 0:
        return &ns->model;
    case 1:
        return &ns->adapter;
    case 2:
        return &ns->tenant;
    default:
        return &ns->salt;
    }
}

void fz_ns_decode(fz_in *in, fz_ns *out)
{
    uint8_t sel = fz_u8(in);
    memset(out, 0, sizeof *out);
    if (sel < 192) {
        out->table_index = (int)(sel % fz_ns_table_size());
        out->ns = table[out->table_index];
        return;
    }
    out->table_index = -1;
    for (int i = 0; i < 4; i++) {
        uint8_t b = fz_u8(in);
        kvp_field *f = field_of(&out->ns, i);
        switch (b & 3) {
        case 0:
            f->ptr = NULL;
            f->len = 0;
            break;
        case 1:
            f->ptr = (b & 4) ? empty_a : empty_b + 1;
            f->len = 0;
            break;
        default: {
            size_t len = 1 + (size_t)(b >> 2) % (FZ_FIELD_MAX - 1);
            for (size_t k = 0; k < len; k++)
                out->bytes[i][k] = fz_u8(in) & 0x63; /* small alphabet, NULs included */
            f->ptr = out->bytes[i];
            f->len = len;
            break;
        }
        }
    }
}

void fz_ns_decode_set(fz_in *in, fz_ns *set, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t rel = i ? fz_u8(in) : 255;
        if (rel < 64 && set[i - 1].table_index >= 0) {
            memset(&set[i], 0, sizeof set[i]);
            set[i].table_index = (int)((size_t)(set[i - 1].table_index + 1) % fz_ns_table_size());
            set[i].ns = table[set[i].table_index];
        } else if (rel < 96) {
            set[i] = set[i - 1];
        } else {
            fz_ns_decode(in, &set[i]);
        }
    }
}

static bool field_equal(const kvp_field *a, const kvp_field *b)
{
    if ((a->ptr == NULL) != (b->ptr == NULL))
        return false;
    return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
}

bool fz_ns_equal(const kvp_namespace *a, const kvp_namespace *b)
{
    return field_equal(&a->model, &b->model) && field_equal(&a->adapter, &b->adapter) &&
           field_equal(&a->tenant, &b->tenant) && field_equal(&a->salt, &b->salt);
}

/* ---------------------------------------------------------------------------------------- */
/* Cache shapes and keys                                                                    */
/* ---------------------------------------------------------------------------------------- */

uint32_t fz_block_size(fz_in *in)
{
    static const uint32_t sizes[8] = {1, 2, 3, 4, 16, 16, 1021, FZ_MAX_BLOCK_SIZE};
    return sizes[fz_u8(in) % 8];
}

size_t fz_prompt_len(fz_in *in, uint32_t bs, size_t max_blocks)
{
    uint8_t b = fz_u8(in);
    size_t n_full = (b & 63) % (max_blocks + 1);
    size_t tail;
    switch (b >> 6) {
    case 0:
        tail = 0;
        break;
    case 1:
        tail = 1;
        break;
    case 2:
        tail = bs - 1;
        break;
    default:
        tail = fz_below(in, bs);
        break;
    }
    if (tail >= bs)
        tail = 0;
    size_t n = n_full * bs + tail;
    return n ? n : 1;
}

void fz_keys_decode(fz_in *in, fz_keys *k)
{
    k->seed = 0;
    for (int i = 0; i < 8; i++)
        k->seed |= (uint64_t)fz_u8(in) << (8 * i);
    k->bits = 128;
}

void fz_keys_apply(const fz_keys *k, kvp_config *cfg)
{
    /* The oracle reproduces the seeded XXH3-128 chain, so the harnesses ask for that profile
     * explicitly (the default, keyed, draws a random key per cache). */
    cfg->hash_profile = KVP_HASH_XXH3;
    cfg->seed = k->seed;
}

void fz_keys_truncate_cache(const fz_keys *k, kvp_cache *cache)
{
    if (k->bits < 128)
        FZ_ASSERT(kvp__cache_set_key_bits(cache, k->bits) == KVP_OK, "kvp__cache_set_key_bits");
}

/* ---------------------------------------------------------------------------------------- */
/* Key oracle                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The largest hash input the oracle builds: a block of FZ_MAX_BLOCK_SIZE tokens after its
 * parent key (namespaces of the harnesses are far smaller). */
#define ORACLE_BYTES (16 + 4 * FZ_MAX_BLOCK_SIZE)

typedef struct oracle_buf {
    size_t n;                      /* bytes written */
    unsigned char b[ORACLE_BYTES]; /* the hash input */
} oracle_buf;

static void ob_byte(oracle_buf *o, unsigned v)
{
    FZ_ASSERT(o->n < ORACLE_BYTES, "oracle: hash input over %u bytes", (unsigned)ORACLE_BYTES);
    o->b[o->n++] = (unsigned char)(v & 0xff);
}

/* n_bytes bytes of v, least significant first. */
static void ob_le(oracle_buf *o, uint64_t v, int n_bytes)
{
    for (int i = 0; i < n_bytes; i++)
        ob_byte(o, (unsigned)(v >> (8 * i)));
}

static void ob_key(oracle_buf *o, kvp_key k)
{
    ob_le(o, k.lo, 8);
    ob_le(o, k.hi, 8);
}

static void ob_text(oracle_buf *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ob_byte(o, (unsigned char)s[i]);
}

static kvp_key ob_hash(const oracle_buf *o, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(o->b, o->n, seed);
    kvp_key k = {h.low64, h.high64};
    return k;
}

kvp_key fz_key_trunc(kvp_key k, unsigned bits)
{
    for (unsigned i = bits; i < 128; i++) {
        if (i < 64)
            k.lo &= ~(UINT64_C(1) << i);
        else
            k.hi &= ~(UINT64_C(1) << (i - 64));
    }
    return k;
}

static void ob_field(oracle_buf *o, unsigned number, const kvp_field *f)
{
    ob_byte(o, number);
    ob_byte(o, f->ptr != NULL);
    if (f->ptr == NULL)
        return;
    ob_le(o, (uint64_t)f->len, 8);
    ob_text(o, f->ptr, f->len);
}

kvp_key fz_oracle_root(uint64_t seed, const kvp_namespace *ns)
{
    static oracle_buf o; /* large: kept off the stack */
    o.n = 0;
    ob_text(&o, "KVPNS1\0\0", 8);
    ob_field(&o, 1, &ns->model);
    ob_field(&o, 2, &ns->adapter);
    ob_field(&o, 3, &ns->tenant);
    ob_field(&o, 4, &ns->salt);
    return ob_hash(&o, seed);
}

kvp_key fz_oracle_block(uint64_t seed, kvp_key parent, const uint32_t *tokens, size_t n)
{
    static oracle_buf o;
    o.n = 0;
    ob_key(&o, parent);
    for (size_t i = 0; i < n; i++)
        ob_le(&o, tokens[i], 4);
    return ob_hash(&o, seed);
}

kvp_key fz_oracle_external(uint64_t seed, kvp_key root, kvp_key id)
{
    static oracle_buf o;
    o.n = 0;
    ob_text(&o, "KVPEXT1\0", 8);
    ob_key(&o, root);
    ob_key(&o, id);
    return ob_hash(&o, seed);
}

size_t fz_oracle_chain(uint64_t seed, unsigned bits, kvp_key parent, const uint32_t *tokens,
                       size_t n_tokens, uint32_t bs, kvp_key *keys, size_t cap)
{
    size_t n = n_tokens / bs;
    if (n > cap)
        n = cap;
    for (size_t i = 0; i < n; i++)
        keys[i] = parent = fz_key_trunc(fz_oracle_block(seed, parent, tokens + i * bs, bs), bits);
    return n;
}
