/*
 * test_keys.c - namespace root keys, chained block keys and external keys
 * (kvp_namespace_key, kvp_hash_blocks, kvp_external_key).
 *
 * Covers determinism, the framing of namespace fields (concatenation ambiguity, absent vs
 * empty, embedded NULs, field positions), seeds, the chain property of block keys, the
 * partial tail, the cap on written keys, block size bounds, external-key scoping and domain
 * separation, and fixed test vectors (also in docs/test-vectors.md). One vector is rebuilt
 * independently from the byte layout in src/keys.c with XXH3_128bits_withSeed, so the keys
 * are checked against the specification and not only against themselves.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <xxhash.h>

#include "kvprefix.h"
#include "testutil.h"

static kvp_key root_of(uint64_t seed, const kvp_namespace *ns)
{
    kvp_key k = {0, 0};
    int rc = kvp_namespace_key(seed, ns, &k);
    cr_assert_eq(rc, KVP_OK, "kvp_namespace_key: %s", kvp_strerror(rc));
    return k;
}

static kvp_field bytes_field(const void *p, size_t n)
{
    kvp_field f = {p, n};
    return f;
}

/* ------------------------------------------------------------------ namespace root keys */

Test(keys, namespace_key_is_deterministic)
{
    kvp_namespace a, b;
    char m1[] = "llama", m2[] = "llama";
    kvp_namespace_init(&a);
    kvp_namespace_init(&b);
    a.model = kvp_field_str(m1);
    b.model = kvp_field_str(m2); /* equal bytes at another address */
    kvp_key k1 = root_of(0, &a), k2 = root_of(0, &a), k3 = root_of(0, &b);
    cr_assert(th_key_eq(k1, k2), "same namespace hashed twice gives different keys");
    cr_assert(th_key_eq(k1, k3), "equal bytes at different addresses give different keys");
    cr_assert(k1.lo != 0 || k1.hi != 0, "root key is all zero");
}

Test(keys, framing_is_unambiguous)
{
    kvp_namespace a, b;
    th_ns(&a, "ab", NULL, "c", NULL);
    th_ns(&b, "a", NULL, "bc", NULL);
    cr_assert(!th_key_eq(root_of(0, &a), root_of(0, &b)),
              "model \"ab\" + tenant \"c\" must differ from model \"a\" + tenant \"bc\"");
    /* The same across adjacent fields, and with the other fields present. */
    th_ns(&a, "x", "ab", "c", "s");
    th_ns(&b, "x", "a", "bc", "s");
    cr_assert(!th_key_eq(root_of(0, &a), root_of(0, &b)), "adapter/tenant framing is ambiguous");
    th_ns(&a, "x", "y", "z", "ab");
    th_ns(&b, "x", "y", "za", "b");
    cr_assert(!th_key_eq(root_of(0, &a), root_of(0, &b)), "tenant/salt framing is ambiguous");
}

Test(keys, absent_differs_from_empty)
{
    for (int field = 0; field < 4; field++) {
        kvp_namespace absent, empty;
        th_ns(&absent, "m", NULL, NULL, NULL);
        empty = absent;
        kvp_field *f = field == 0   ? &empty.model
                       : field == 1 ? &empty.adapter
                       : field == 2 ? &empty.tenant
                                    : &empty.salt;
        if (field == 0)
            absent.model = kvp_field_str(NULL);
        *f = kvp_field_str("");
        cr_assert_not_null(f->ptr);
        cr_assert(!th_key_eq(root_of(0, &absent), root_of(0, &empty)),
                  "field %d: absent and empty give the same key", field);
    }
    /* All absent is a valid namespace with its own key. */
    kvp_namespace none, all_empty;
    kvp_namespace_init(&none);
    th_ns(&all_empty, "", "", "", "");
    cr_assert(!th_key_eq(root_of(0, &none), root_of(0, &all_empty)), "all absent equals all empty");
}

Test(keys, embedded_nul_bytes_matter)
{
    static const char a[] = {'a', 0, 'b'};
    static const char b[] = {'a', 0, 'c'};
    kvp_namespace n1, n2, n3, n4;
    kvp_namespace_init(&n1);
    n2 = n3 = n4 = n1;
    n1.tenant = bytes_field(a, 3);
    n2.tenant = bytes_field(b, 3);
    n3.tenant = bytes_field(a, 1); /* "a" */
    n4.tenant = bytes_field(a, 2); /* "a\0" */
    kvp_key k1 = root_of(0, &n1), k2 = root_of(0, &n2), k3 = root_of(0, &n3), k4 = root_of(0, &n4);
    cr_assert(!th_key_eq(k1, k2), "bytes after a NUL are ignored");
    cr_assert(!th_key_eq(k1, k3), "\"a\\0b\" hashes like \"a\"");
    cr_assert(!th_key_eq(k3, k4), "a trailing NUL byte is ignored");
    cr_assert(!th_key_eq(k1, k4), "\"a\\0b\" hashes like \"a\\0\"");
}

Test(keys, field_position_matters)
{
    kvp_namespace ns[4];
    th_ns(&ns[0], "x", NULL, NULL, NULL);
    th_ns(&ns[1], NULL, "x", NULL, NULL);
    th_ns(&ns[2], NULL, NULL, "x", NULL);
    th_ns(&ns[3], NULL, NULL, NULL, "x");
    kvp_key k[4];
    for (int i = 0; i < 4; i++)
        k[i] = root_of(0, &ns[i]);
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            cr_assert(!th_key_eq(k[i], k[j]), "the same bytes in field %d and %d give one key", i,
                      j);
}

Test(keys, seed_changes_every_key)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    kvp_key r0 = root_of(0, &ns), r1 = root_of(1, &ns);
    cr_assert(!th_key_eq(r0, r1), "seeds 0 and 1 give the same root");
    uint32_t tok[4] = {1, 2, 3, 4};
    kvp_key b0, b1;
    size_t n = 0;
    cr_assert_eq(kvp_hash_blocks(0, r0, tok, 4, 4, &b0, 1, &n), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(1, r0, tok, 4, 4, &b1, 1, &n), KVP_OK);
    cr_assert(!th_key_eq(b0, b1), "seeds 0 and 1 give the same block key for the same parent");
    kvp_key id = {5, 6};
    cr_assert(!th_key_eq(kvp_external_key(0, r0, id), kvp_external_key(1, r0, id)),
              "seeds 0 and 1 give the same external key");
}

/* ------------------------------------------------------------------ block keys */

Test(keys, hash_blocks_ignores_partial_tail)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_key root = root_of(0, &ns);
    uint32_t tok[11];
    for (int i = 0; i < 11; i++)
        tok[i] = (uint32_t)(100 + i);
    kvp_key a[4], b[4];
    size_t na = 99, nb = 99;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 8, 4, a, 4, &na), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 11, 4, b, 4, &nb), KVP_OK);
    cr_assert_eq(na, 2, "8 tokens in blocks of 4 give %zu keys, expected 2", na);
    cr_assert_eq(nb, 2, "11 tokens in blocks of 4 give %zu keys, expected 2", nb);
    cr_assert(th_key_eq(a[0], b[0]) && th_key_eq(a[1], b[1]), "the partial tail changed a key");
    size_t n0 = 99;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 3, 4, a, 4, &n0), KVP_OK);
    cr_assert_eq(n0, 0, "3 tokens in blocks of 4 give %zu keys, expected 0", n0);
    cr_assert_eq(kvp_hash_blocks(0, root, NULL, 0, 4, NULL, 0, &n0), KVP_OK,
                 "no tokens and no room must be accepted");
    cr_assert_eq(n0, 0);
}

Test(keys, chain_property)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_key root = root_of(0, &ns);
    uint32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t y[8] = {9, 2, 3, 4, 5, 6, 7, 8}; /* differs only in block 0 */
    uint32_t z[8] = {1, 2, 3, 4, 5, 6, 7, 9}; /* differs only in block 1 */
    kvp_key kx[2], ky[2], kz[2];
    size_t n;
    cr_assert_eq(kvp_hash_blocks(0, root, x, 8, 4, kx, 2, &n), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(0, root, y, 8, 4, ky, 2, &n), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(0, root, z, 8, 4, kz, 2, &n), KVP_OK);
    cr_assert(!th_key_eq(kx[0], ky[0]), "block 0 key ignores its tokens");
    cr_assert(!th_key_eq(kx[1], ky[1]), "block 1 key does not depend on block 0's tokens");
    cr_assert(th_key_eq(kx[0], kz[0]), "block 0 key depends on block 1's tokens");
    cr_assert(!th_key_eq(kx[1], kz[1]), "block 1 key ignores its tokens");
    /* The same tokens under another namespace root share nothing. */
    kvp_namespace other;
    th_ns(&other, "m", NULL, "t", NULL);
    kvp_key ko[2];
    cr_assert_eq(kvp_hash_blocks(0, root_of(0, &other), x, 8, 4, ko, 2, &n), KVP_OK);
    cr_assert(!th_key_eq(kx[0], ko[0]) && !th_key_eq(kx[1], ko[1]), "namespace root ignored");
    /* Hashing block 1 alone from block 0's key gives the same key (incremental). */
    kvp_key k1;
    cr_assert_eq(kvp_hash_blocks(0, kx[0], x + 4, 4, 4, &k1, 1, &n), KVP_OK);
    cr_assert_eq(n, 1);
    cr_assert(th_key_eq(k1, kx[1]), "incremental hashing differs from hashing the whole run");
    /* Identical blocks at different positions get different keys. */
    uint32_t rep[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    kvp_key kr[2];
    cr_assert_eq(kvp_hash_blocks(0, root, rep, 8, 4, kr, 2, &n), KVP_OK);
    cr_assert(!th_key_eq(kr[0], kr[1]), "a repeated block gets the key of its first copy");
}

Test(keys, hash_blocks_respects_cap)
{
    kvp_key root = {1, 2};
    uint32_t tok[12] = {0};
    kvp_key all[3], some[3];
    const kvp_key sentinel = {0xdeadbeef, 0xfeedface};
    size_t n = 99;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 12, 4, all, 3, &n), KVP_OK);
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++)
        some[i] = sentinel;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 12, 4, some, 2, &n), KVP_OK);
    cr_assert_eq(n, 2, "cap 2: n_keys is %zu", n);
    cr_assert(th_key_eq(some[0], all[0]) && th_key_eq(some[1], all[1]), "capped keys differ");
    cr_assert(th_key_eq(some[2], sentinel), "a key was written beyond cap");
    n = 99;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 12, 4, NULL, 0, &n), KVP_OK,
                 "keys may be NULL when cap is 0");
    cr_assert_eq(n, 0, "cap 0: n_keys is %zu", n);
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 12, 4, some, 100, &n), KVP_OK);
    cr_assert_eq(n, 3, "a large cap must not write more than the full blocks");
}

Test(keys, hash_blocks_block_size_bounds)
{
    kvp_key root = {3, 4};
    uint32_t *tok = calloc(KVP_MAX_BLOCK_SIZE + 1, sizeof(uint32_t));
    cr_assert_not_null(tok);
    kvp_key k[2];
    const kvp_key sentinel = {11, 12};
    k[0] = sentinel;
    size_t n = 77;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 8, 0, k, 2, &n), KVP_EINVAL, "block_size 0");
    cr_assert_eq(
        kvp_hash_blocks(0, root, tok, KVP_MAX_BLOCK_SIZE + 1, KVP_MAX_BLOCK_SIZE + 1, k, 2, &n),
        KVP_EINVAL, "block_size KVP_MAX_BLOCK_SIZE + 1");
    cr_assert_eq(n, 77, "n_keys written on failure");
    cr_assert(th_key_eq(k[0], sentinel), "keys written on failure");
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 3, 1, k, 2, &n), KVP_OK, "block_size 1");
    cr_assert_eq(n, 2);
    cr_assert_eq(
        kvp_hash_blocks(0, root, tok, KVP_MAX_BLOCK_SIZE + 1, KVP_MAX_BLOCK_SIZE, k, 2, &n), KVP_OK,
        "block_size KVP_MAX_BLOCK_SIZE");
    cr_assert_eq(n, 1);
    free(tok);
}

/* ------------------------------------------------------------------ external keys */

Test(keys, external_key_scoped_by_namespace)
{
    kvp_namespace a, b;
    th_ns(&a, "m", NULL, "tenant-a", NULL);
    th_ns(&b, "m", NULL, "tenant-b", NULL);
    kvp_key ra = root_of(0, &a), rb = root_of(0, &b);
    kvp_key id = {0x1234, 0x5678}, id2 = {0x1235, 0x5678};
    kvp_key ea = kvp_external_key(0, ra, id), eb = kvp_external_key(0, rb, id);
    cr_assert(!th_key_eq(ea, eb), "equal external ids in two namespaces give one key");
    cr_assert(th_key_eq(ea, kvp_external_key(0, ra, id)), "external key is not deterministic");
    cr_assert(!th_key_eq(ea, kvp_external_key(0, ra, id2)), "external ids 0x1234/0x1235 collide");
    cr_assert(!th_key_eq(ea, id), "the external id is used unscoped");
}

Test(keys, external_key_domain_separated_from_token_keys)
{
    /* Four tokens whose little-endian bytes are exactly the id's key bytes: a token key
     * computed without a domain tag would coincide with the external key. */
    kvp_key root = {0x0102030405060708, 0x1112131415161718};
    kvp_key id = {0x2122232425262728, 0x3132333435363738};
    uint32_t tok[4] = {(uint32_t)id.lo, (uint32_t)(id.lo >> 32), (uint32_t)id.hi,
                       (uint32_t)(id.hi >> 32)};
    kvp_key tk;
    size_t n;
    cr_assert_eq(kvp_hash_blocks(0, root, tok, 4, 4, &tk, 1, &n), KVP_OK);
    cr_assert(!th_key_eq(tk, kvp_external_key(0, root, id)),
              "external key equals the token key over the same bytes");
}

/* ------------------------------------------------------------------ test vectors */

/* The vectors of docs/test-vectors.md: vectors[0] is its vector 1, vectors[1] vector 2. */
typedef struct vector {
    uint64_t seed;
    const char *model, *adapter, *tenant, *salt; /* NULL: absent */
    size_t salt_len;                             /* salt bytes (may contain NUL) */
    uint32_t tokens[8];
    size_t n_tokens;
    uint32_t block_size;
    kvp_key root;
    kvp_key keys[4];
    size_t n_keys;
} vector;

static const vector vectors[] = {
    {
        .seed = 0,
        .model = "llama-3-8b",
        .tenant = "acme",
        .tokens = {1, 2, 3, 4, 5, 6, 7, 8},
        .n_tokens = 8,
        .block_size = 4,
        .root = {UINT64_C(0x520a43a757991def), UINT64_C(0x7cf4452c4652cb72)},
        .keys = {{UINT64_C(0x22ae81c4990da453), UINT64_C(0x7eb36c02c47560cc)},
                 {UINT64_C(0x9fd0c0aaa84e4406), UINT64_C(0x41febf7dde5bef7c)}},
        .n_keys = 2,
    },
    {
        .seed = UINT64_C(0x0123456789abcdef),
        .model = "m",
        .adapter = "lora-7",
        .tenant = "",
        .salt = "s\0x",
        .salt_len = 3,
        .tokens = {0, 1, 0xffffffffu, 0x80000000u, 42, 7, 9},
        .n_tokens = 7,
        .block_size = 2,
        .root = {UINT64_C(0x242dc0839917b1e3), UINT64_C(0x93887479efec721d)},
        .keys = {{UINT64_C(0xdc8a99c4c757f972), UINT64_C(0xaab0756f377ef7a6)},
                 {UINT64_C(0xd0d260130b17529d), UINT64_C(0x4a6bc432d5e3c04f)},
                 {UINT64_C(0x2772a4dad8ff4618), UINT64_C(0xff7d621cdbc1b9f1)}},
        .n_keys = 3,
    },
};

/* External id {lo = 1, hi = 2} under vectors[0]'s root, seed 0. */
static const kvp_key vector_external = {UINT64_C(0xa13a3328d25b8d28), UINT64_C(0x6bece96c98a4dc8f)};

static void vector_ns(const vector *v, kvp_namespace *ns)
{
    th_ns(ns, v->model, v->adapter, v->tenant, NULL);
    if (v->salt)
        ns->salt = bytes_field(v->salt, v->salt_len);
}

Test(keys, test_vectors)
{
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        const vector *v = &vectors[i];
        kvp_namespace ns;
        vector_ns(v, &ns);
        kvp_key root = root_of(v->seed, &ns);
        cr_assert(th_key_eq(root, v->root),
                  "vector %zu root: got lo=0x%016llx hi=0x%016llx, expected lo=0x%016llx "
                  "hi=0x%016llx",
                  i, (unsigned long long)root.lo, (unsigned long long)root.hi,
                  (unsigned long long)v->root.lo, (unsigned long long)v->root.hi);
        kvp_key keys[4];
        size_t n = 0;
        cr_assert_eq(
            kvp_hash_blocks(v->seed, root, v->tokens, v->n_tokens, v->block_size, keys, 4, &n),
            KVP_OK);
        cr_assert_eq(n, v->n_keys, "vector %zu: %zu keys", i, n);
        for (size_t j = 0; j < n; j++)
            cr_assert(th_key_eq(keys[j], v->keys[j]),
                      "vector %zu key %zu: got lo=0x%016llx hi=0x%016llx, expected "
                      "lo=0x%016llx hi=0x%016llx",
                      i, j, (unsigned long long)keys[j].lo, (unsigned long long)keys[j].hi,
                      (unsigned long long)v->keys[j].lo, (unsigned long long)v->keys[j].hi);
    }
    kvp_namespace ns;
    vector_ns(&vectors[0], &ns);
    kvp_key id = {1, 2};
    kvp_key e = kvp_external_key(0, root_of(0, &ns), id);
    cr_assert(th_key_eq(e, vector_external), "external vector: got lo=0x%016llx hi=0x%016llx",
              (unsigned long long)e.lo, (unsigned long long)e.hi);
}

/* Independent rebuild of the byte strings that src/keys.c documents. */
static size_t put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
    return 8;
}

static size_t put_field(unsigned char *p, unsigned char number, const char *s, size_t len)
{
    size_t o = 0;
    p[o++] = number;
    p[o++] = s != NULL;
    if (s) {
        o += put_u64le(p + o, len);
        memcpy(p + o, s, len);
        o += len;
    }
    return o;
}

static kvp_key xxh(const unsigned char *buf, size_t n, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(buf, n, seed);
    kvp_key k = {h.low64, h.high64};
    return k;
}

static kvp_key spec_block_key(uint64_t seed, kvp_key parent, const uint32_t *tok, size_t bs)
{
    unsigned char *buf = malloc(16 + 4 * bs);
    cr_assert_not_null(buf);
    put_u64le(buf, parent.lo);
    put_u64le(buf + 8, parent.hi);
    for (size_t i = 0; i < bs; i++)
        for (int b = 0; b < 4; b++)
            buf[16 + 4 * i + b] = (unsigned char)(tok[i] >> (8 * b));
    kvp_key k = xxh(buf, 16 + 4 * bs, seed);
    free(buf);
    return k;
}

Test(keys, vector_matches_byte_layout_spec)
{
    const vector *v = &vectors[1]; /* every field present: one empty, one with a NUL byte */
    unsigned char buf[256];
    size_t o = 0;
    memcpy(buf, "KVPNS1\0\0", 8);
    o = 8;
    o += put_field(buf + o, 1, v->model, strlen(v->model));
    o += put_field(buf + o, 2, v->adapter, strlen(v->adapter));
    o += put_field(buf + o, 3, v->tenant, strlen(v->tenant));
    o += put_field(buf + o, 4, v->salt, v->salt_len);
    kvp_key root = xxh(buf, o, v->seed);
    kvp_namespace ns;
    vector_ns(v, &ns);
    cr_assert(th_key_eq(root, root_of(v->seed, &ns)), "root differs from the documented layout");
    cr_assert(th_key_eq(root, v->root), "the vector's root differs from the documented layout");

    kvp_key parent = root;
    for (size_t j = 0; j < v->n_keys; j++) {
        kvp_key k = spec_block_key(v->seed, parent, v->tokens + j * v->block_size, v->block_size);
        cr_assert(th_key_eq(k, v->keys[j]), "vector key %zu differs from the documented layout", j);
        parent = k;
    }

    /* vectors[0] has absent fields: check the 2-byte absent encoding too. */
    const vector *v0 = &vectors[0];
    o = 8;
    o += put_field(buf + o, 1, v0->model, strlen(v0->model));
    o += put_field(buf + o, 2, NULL, 0);
    o += put_field(buf + o, 3, v0->tenant, strlen(v0->tenant));
    o += put_field(buf + o, 4, NULL, 0);
    kvp_key root0 = xxh(buf, o, v0->seed);
    cr_assert(th_key_eq(root0, v0->root), "vectors[0] root differs from the documented layout");

    /* External key: "KVPEXT1\0" || root || id. */
    kvp_key id = {1, 2};
    memcpy(buf, "KVPEXT1\0", 8);
    put_u64le(buf + 8, root0.lo);
    put_u64le(buf + 16, root0.hi);
    put_u64le(buf + 24, id.lo);
    put_u64le(buf + 32, id.hi);
    cr_assert(th_key_eq(xxh(buf, 40, 0), vector_external),
              "external vector differs from the documented layout");
}

Test(keys, large_block_matches_byte_layout_spec)
{
    /* Blocks above 1020 tokens take another code path in keys.c; both must agree with the
     * documented layout. */
    const uint32_t sizes[] = {1, 1020, 1021, 4096, KVP_MAX_BLOCK_SIZE};
    uint32_t *tok = malloc(2 * (size_t)KVP_MAX_BLOCK_SIZE * sizeof(uint32_t));
    cr_assert_not_null(tok);
    uint64_t rs = 7;
    for (size_t i = 0; i < 2 * (size_t)KVP_MAX_BLOCK_SIZE; i++)
        tok[i] = (uint32_t)th_rand(&rs);
    kvp_key root = {0xabcdef, 0x123456};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t bs = sizes[s];
        kvp_key k[2];
        size_t n;
        cr_assert_eq(kvp_hash_blocks(42, root, tok, 2 * (size_t)bs, bs, k, 2, &n), KVP_OK);
        cr_assert_eq(n, 2);
        kvp_key e0 = spec_block_key(42, root, tok, bs);
        kvp_key e1 = spec_block_key(42, e0, tok + bs, bs);
        cr_assert(th_key_eq(k[0], e0) && th_key_eq(k[1], e1),
                  "block size %u: keys differ from the documented layout", bs);
    }
    free(tok);
}
