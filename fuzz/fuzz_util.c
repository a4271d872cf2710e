/*
 * fuzz_util.c - the helpers shared by the fuzz harnesses (see fuzz_util.h): failure
 * reports, the checking allocator, the adversarial namespace table, the cache shapes and
 * hash profiles drawn from the input, and the independent key oracle of every profile.
 *
 * The allocator prefixes each block with a 16-byte header holding the requested size and a
 * magic word, so a free with a wrong size or of a foreign pointer is caught at once rather
 * than as heap corruption later. The header keeps the 16-byte alignment malloc gives.
 */
#include "fuzz_util.h"

#include <openssl/sha.h> /* the oracle's SHA-256: the one-shot SHA256() */
#include <sodium.h>      /* the oracle's BLAKE2b and SipHash */
#include <xxhash.h>      /* not XXH_INLINE_ALL: the oracle calls libxxhash's own XXH3 */

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

/* Profiles by input byte (mod 8): xxh3, keyed and siphash twice, each vLLM profile once. */
static const int profile_table[8] = {
    KVP_HASH_XXH3,        KVP_HASH_KEYED, KVP_HASH_SIPHASH, KVP_HASH_VLLM_SHA256,
    KVP_HASH_VLLM_XXHASH, KVP_HASH_XXH3,  KVP_HASH_KEYED,   KVP_HASH_SIPHASH,
};

static void oracle_derive(fz_keys *k);

static void decode_vllm_seed(fz_in *in, fz_keys *k)
{
    uint8_t b = fz_u8(in);
    k->vllm_default = b < 96;
    size_t len = k->vllm_default ? 0 : b % (FZ_VLLM_SEED_MAX + 1);
    for (size_t i = 0; i < len; i++)
        k->vllm_seed[i] = (char)(0x20 + fz_u8(in) % 95); /* printable ASCII, a Python str */
    k->vllm_seed[len] = '\0';
}

void fz_keys_decode(fz_in *in, fz_keys *k, int profiles)
{
    memset(k, 0, sizeof *k);
    for (int i = 0; i < 8; i++)
        k->seed |= (uint64_t)fz_u8(in) << (8 * i);
    k->bits = 128;
    uint8_t p = fz_u8(in);
    k->profile = profile_table[p % 8];
    if (profiles == FZ_PROFILES_NO_VLLM && fz_keys_vllm(k))
        k->profile = k->profile == KVP_HASH_VLLM_SHA256 ? KVP_HASH_KEYED : KVP_HASH_XXH3;
    if (k->profile == KVP_HASH_KEYED || k->profile == KVP_HASH_SIPHASH) {
        k->key_len =
            KVP_HASH_KEY_MIN + (uint32_t)fz_below(in, KVP_HASH_KEY_MAX - KVP_HASH_KEY_MIN + 1);
        for (uint32_t i = 0; i < k->key_len; i++)
            k->key[i] = fz_u8(in);
        oracle_derive(k);
    } else if (fz_keys_vllm(k)) {
        decode_vllm_seed(in, k);
    }
}

void fz_keys_apply(const fz_keys *k, kvp_config *cfg)
{
    cfg->hash_profile = k->profile;
    cfg->seed = k->seed;
    cfg->hash_key_len = k->key_len;
    memcpy(cfg->hash_key, k->key, sizeof cfg->hash_key);
    cfg->vllm_seed = fz_keys_vllm(k) && !k->vllm_default ? k->vllm_seed : NULL;
}

bool fz_ns_expressible(const fz_keys *k, const kvp_namespace *ns)
{
    if (!fz_keys_vllm(k))
        return true;
    return !ns->model.ptr && !ns->tenant.ptr && !(ns->salt.ptr && ns->salt.len == 0);
}

void fz_ns_map_profile(const fz_keys *k, fz_ns *set, size_t n, kvp_namespace *orig)
{
    for (size_t i = 0; i < n; i++) {
        kvp_namespace *ns = &set[i].ns;
        orig[i] = *ns;
        if (!fz_keys_vllm(k))
            continue;
        if (ns->salt.ptr && ns->salt.len == 0)
            ns->salt.ptr = NULL;
        if (!ns->salt.ptr && ns->tenant.ptr && ns->tenant.len > 0)
            ns->salt = ns->tenant;
        ns->tenant.ptr = NULL;
        ns->tenant.len = 0;
        ns->model.ptr = NULL;
        ns->model.len = 0;
    }
}

/* The i-th string of ns's block-0 extra keys (adapter first, then salt), or NULL. */
static const kvp_field *extra0(const kvp_namespace *ns, int i)
{
    const kvp_field *list[2];
    int n = 0;
    if (ns->adapter.ptr)
        list[n++] = &ns->adapter;
    if (ns->salt.ptr)
        list[n++] = &ns->salt;
    return i < n ? list[i] : NULL;
}

bool fz_ns_vllm_block0_equal(const kvp_namespace *a, const kvp_namespace *b)
{
    for (int i = 0; i < 2; i++) {
        const kvp_field *fa = extra0(a, i), *fb = extra0(b, i);
        if (!fa || !fb) {
            if (fa != fb)
                return false;
            continue;
        }
        if (fa->len != fb->len || (fa->len && memcmp(fa->ptr, fb->ptr, fa->len) != 0))
            return false;
    }
    return true;
}

void fz_keys_truncate_cache(const fz_keys *k, kvp_cache *cache)
{
    if (k->bits < 128)
        FZ_ASSERT(kvp__cache_set_key_bits(cache, k->bits) == KVP_OK, "kvp__cache_set_key_bits");
}

/* ---------------------------------------------------------------------------------------- */
/* Key oracle                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* The largest hash input the oracle builds: a vLLM block of FZ_MAX_BLOCK_SIZE tokens at 5
 * CBOR bytes each after a 32-byte parent, plus two short names (and the harnesses'
 * namespaces and seeds are far smaller). */
#define ORACLE_BYTES (64 + 5 * FZ_MAX_BLOCK_SIZE + 64)

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

/* n_bytes bytes of v, most significant first. */
static void ob_be(oracle_buf *o, uint64_t v, int n_bytes)
{
    for (int i = n_bytes; i-- > 0;)
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

/* Read 8 bytes at p as an integer, little- or big-endian. */
static uint64_t rd_le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint64_t rd_be(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (56 - 8 * i);
    return v;
}

/* The 16 output bytes of BLAKE2b or SipHash as a key: lo is the first 8, little-endian. */
static kvp_key key_le(const unsigned char *d)
{
    kvp_key k = {rd_le(d), rd_le(d + 8)};
    return k;
}

static kvp_key xxh_key(XXH128_hash_t h)
{
    kvp_key k = {h.low64, h.high64};
    return k;
}

/* One hash of the whole buffer under profile k (xxh3, keyed, siphash). */
static kvp_key ob_hash(const oracle_buf *o, const fz_keys *k)
{
    unsigned char d[16];
    switch (k->profile) {
    case KVP_HASH_KEYED:
        return xxh_key(XXH3_128bits_withSecret(o->b, o->n, k->secret, FZ_SECRET_BYTES));
    case KVP_HASH_SIPHASH:
        crypto_shorthash_siphashx24(d, o->b, o->n, k->sip_key);
        return key_le(d);
    default:
        return xxh_key(XXH3_128bits_withSeed(o->b, o->n, k->seed));
    }
}

/* The keyed profiles' derived keys: secret(K) = BLAKE2b-512(K, "KVP-XXH3-SECRET-v1" || i)
 * for i = 0, 1, 2 (i as one byte), k_sip = BLAKE2b-128(K, "KVP-SIPHASH-KEY-v1"). */
static void oracle_derive(fz_keys *k)
{
    static const char secret_tag[] = "KVP-XXH3-SECRET-v1", sip_tag[] = "KVP-SIPHASH-KEY-v1";
    FZ_ASSERT(sodium_init() >= 0, "oracle: sodium_init");
    oracle_buf o;
    for (unsigned i = 0; i < FZ_SECRET_BYTES / 64; i++) {
        o.n = 0;
        ob_text(&o, secret_tag, sizeof secret_tag - 1);
        ob_byte(&o, i);
        crypto_generichash(k->secret + 64 * i, 64, o.b, o.n, k->key, k->key_len);
    }
    crypto_generichash(k->sip_key, 16, (const unsigned char *)sip_tag, sizeof sip_tag - 1, k->key,
                       k->key_len);
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

kvp_key fz_oracle_root(const fz_keys *k, const kvp_namespace *ns)
{
    static oracle_buf o; /* large: kept off the stack */
    o.n = 0;
    ob_text(&o, "KVPNS1\0\0", 8);
    ob_field(&o, 1, &ns->model);
    ob_field(&o, 2, &ns->adapter);
    ob_field(&o, 3, &ns->tenant);
    ob_field(&o, 4, &ns->salt);
    if (k->profile == KVP_HASH_KEYED || k->profile == KVP_HASH_SIPHASH) {
        unsigned char d[16];
        crypto_generichash(d, sizeof d, o.b, o.n, k->key, k->key_len);
        return key_le(d);
    }
    return xxh_key(XXH3_128bits_withSeed(o.b, o.n, k->seed));
}

/* ------------------------------------------------------------------ the vLLM oracle */

/* A CBOR head: major type (0 uint, 2 bytes, 3 text, 4 array) and its argument, in the
 * shortest form (canonical CBOR). */
static void cbor_head(oracle_buf *o, unsigned major, uint64_t v)
{
    if (v < 24) {
        ob_byte(o, major << 5 | (unsigned)v);
    } else if (v <= 0xff) {
        ob_byte(o, major << 5 | 24);
        ob_be(o, v, 1);
    } else if (v <= 0xffff) {
        ob_byte(o, major << 5 | 25);
        ob_be(o, v, 2);
    } else if (v <= 0xffffffff) {
        ob_byte(o, major << 5 | 26);
        ob_be(o, v, 4);
    } else {
        ob_byte(o, major << 5 | 27);
        ob_be(o, v, 8);
    }
}

static void cbor_text(oracle_buf *o, const char *s, size_t n)
{
    cbor_head(o, 3, n);
    ob_text(o, s, n);
}

/* H(buffer) under a vLLM profile, as a chain value: SHA-256's bytes 0..15 are the high
 * half and 16..31 the key; XXH3-128 (seed 0) is its canonical big-endian digest. Both
 * halves read big-endian (hi first). */
static fz_chain vllm_hash(const oracle_buf *o, const fz_keys *k)
{
    unsigned char d[32];
    fz_chain c;
    memset(&c, 0, sizeof c);
    if (k->profile == KVP_HASH_VLLM_SHA256) {
        SHA256(o->b, o->n, d);
        c.high.hi = rd_be(d);
        c.high.lo = rd_be(d + 8);
        c.key.hi = rd_be(d + 16);
        c.key.lo = rd_be(d + 24);
    } else {
        XXH128_canonical_t can;
        XXH128_canonicalFromHash(&can, XXH3_128bits(o->b, o->n));
        c.key.hi = rd_be(can.digest);
        c.key.lo = rd_be(can.digest + 8);
    }
    return c;
}

fz_chain fz_oracle_start(const fz_keys *k, kvp_key root)
{
    fz_chain c;
    memset(&c, 0, sizeof c);
    c.key = root;
    if (!fz_keys_vllm(k))
        return c;
    static oracle_buf o;
    o.n = 0;
    const char *seed = k->vllm_default ? KVP_VLLM_SEED_DEFAULT : k->vllm_seed;
    cbor_text(&o, seed, strlen(seed));
    return vllm_hash(&o, k);
}

/* vLLM's hash_block_tokens: cbor([parent digest, [tokens], extra keys]), extra keys the
 * LoRA name (every block) then cache_salt (block 0 only), or null when there is neither. */
static fz_chain vllm_block(const fz_keys *k, const kvp_namespace *ns, fz_chain parent,
                           const uint32_t *tokens, size_t n, size_t index)
{
    static oracle_buf o;
    o.n = 0;
    cbor_head(&o, 4, 3);
    bool wide = k->profile == KVP_HASH_VLLM_SHA256;
    cbor_head(&o, 2, wide ? 32 : 16);
    if (wide) {
        ob_be(&o, parent.high.hi, 8);
        ob_be(&o, parent.high.lo, 8);
    }
    ob_be(&o, parent.key.hi, 8);
    ob_be(&o, parent.key.lo, 8);
    cbor_head(&o, 4, n);
    for (size_t i = 0; i < n; i++)
        cbor_head(&o, 0, tokens[i]);
    bool lora = ns->adapter.ptr != NULL, salt = index == 0 && ns->salt.ptr && ns->salt.len > 0;
    if (!lora && !salt) {
        ob_byte(&o, 0xf6); /* null */
    } else {
        cbor_head(&o, 4, (uint64_t)lora + (uint64_t)salt);
        if (lora)
            cbor_text(&o, ns->adapter.ptr, ns->adapter.len);
        if (salt)
            cbor_text(&o, ns->salt.ptr, ns->salt.len);
    }
    return vllm_hash(&o, k);
}

/* ------------------------------------------------------------------ blocks and chains */

#define SIP_CHUNK 1020u /* siphash: tokens per SipHash call in a cascade (larger blocks) */

fz_chain fz_oracle_block(const fz_keys *k, const kvp_namespace *ns, fz_chain parent,
                         const uint32_t *tokens, size_t n, size_t index)
{
    if (fz_keys_vllm(k))
        return vllm_block(k, ns, parent, tokens, n, index);
    static oracle_buf o;
    fz_chain c;
    memset(&c, 0, sizeof c);
    c.key = parent.key;
    /* siphash: blocks over 1020 tokens are a cascade, c = SipHash(c || next 1020 tokens);
     * the other profiles hash the whole block in one call (one "chunk"). */
    size_t chunk = k->profile == KVP_HASH_SIPHASH ? SIP_CHUNK : n;
    size_t done = 0;
    do {
        size_t m = n - done < chunk ? n - done : chunk;
        o.n = 0;
        ob_key(&o, c.key);
        for (size_t i = 0; i < m; i++)
            ob_le(&o, tokens[done + i], 4);
        c.key = ob_hash(&o, k);
        done += m;
    } while (done < n);
    return c;
}

kvp_key fz_oracle_external(const fz_keys *k, kvp_key root, kvp_key id)
{
    static oracle_buf o;
    o.n = 0;
    ob_text(&o, "KVPEXT1\0", 8);
    ob_key(&o, root);
    ob_key(&o, id);
    if (fz_keys_vllm(k)) {
        fz_keys x = {.profile = KVP_HASH_XXH3, .seed = k->seed}; /* "as xxh3" */
        return ob_hash(&o, &x);
    }
    return ob_hash(&o, k);
}

size_t fz_oracle_chain(const fz_keys *k, unsigned bits, const kvp_namespace *ns, kvp_key root,
                       const uint32_t *tokens, size_t n_tokens, uint32_t bs, kvp_key *keys,
                       kvp_key *highs, size_t cap)
{
    size_t n = n_tokens / bs;
    if (n > cap)
        n = cap;
    fz_chain c = fz_oracle_start(k, root);
    for (size_t i = 0; i < n; i++) {
        c = fz_oracle_block(k, ns, c, tokens + i * bs, bs, i);
        c.key = fz_key_trunc(c.key, bits);
        keys[i] = c.key;
        if (highs)
            highs[i] = c.high;
    }
    return n;
}
