/*
 * keys.c - namespace root keys, chained block keys and scoped external keys.
 *
 * All keys are XXH3-128 digests with the cache's 64-bit seed (default 0), so they are the
 * same on every process and machine for the same seed. A kvp_key is the digest as two
 * 64-bit halves: lo = XXH128_hash_t.low64, hi = .high64. Written out as bytes (the "key
 * bytes" below) a key is lo then hi, each little-endian: 16 bytes.
 *
 * Namespace root: XXH3-128 over
 *
 *   "KVPNS1\0\0"                       8-byte domain tag
 *   then for each field, in the order model (1), adapter (2), tenant (3), salt (4):
 *     u8 field number, u8 present (0 or 1),
 *     if present: u64 little-endian byte length, then the bytes
 *
 * The type byte and length prefix make the framing unambiguous: ("ab","c") and ("a","bc")
 * encode differently, an absent field differs from an empty one, and NUL bytes are data.
 *
 * Block key i: XXH3-128 over  key bytes of block i-1 (the root for i = 0)
 *                           || the block's block_size tokens, each as u32 little-endian
 * so equal keys imply equal namespace and equal tokens up to and including the block (up to
 * a 2^-128-scale chance of collision; collision-proof mode removes even that).
 *
 * External key: XXH3-128 over "KVPEXT1\0" || root key bytes || external id key bytes
 * (40 bytes): the id is scoped by the namespace, and the tag separates these keys from
 * token keys (whose inputs are 16 + 4 * block_size bytes and start with a key, not a tag).
 *
 * Cost: a block key hashes 16 + 4 * block_size contiguous bytes; for block sizes up to
 * 1020 tokens the input is assembled in a stack buffer (one memcpy, then one XXH3 call), so
 * hashing costs about as much as raw XXH3 over the same bytes (bench/bench_core (a)).
 * Larger blocks use XXH3's streaming state. Nothing here allocates. The block hash itself
 * is in blockhash.h, inlined into the lookup loop.
 */
#include <string.h>

#include "blockhash.h"

static inline bool field_valid(const kvp_field *f)
{
    return f->ptr != NULL || f->len == 0;
}

/* Name the field of ns that kvp__ns_valid refused: the first in namespace order. */
static KVP__COLD int ns_invalid(const kvp_namespace *ns)
{
    if (!ns)
        return kvp__fail(KVP_EINVAL, "ns is NULL");
    const kvp_field *fields[4] = {&ns->model, &ns->adapter, &ns->tenant, &ns->salt};
    static const char *const names[4] = {"model", "adapter", "tenant", "salt"};
    size_t i = 0;
    while (i < 3 && field_valid(fields[i]))
        i++;
    return kvp__fail(KVP_EINVAL, "ns->%s.ptr is NULL but ns->%s.len is %zu", names[i], names[i],
                     fields[i]->len);
}

int kvp__ns_valid(const kvp_namespace *ns)
{
    if (!ns || !field_valid(&ns->model) || !field_valid(&ns->adapter) ||
        !field_valid(&ns->tenant) || !field_valid(&ns->salt))
        return ns_invalid(ns);
    return KVP_OK;
}

static void hash_field(XXH3_state_t *state, unsigned char number, const kvp_field *f)
{
    unsigned char head[10];
    head[0] = number;
    head[1] = f->ptr != NULL;
    if (!f->ptr) {
        XXH3_128bits_update(state, head, 2);
        return;
    }
    kvp__put_u64le(head + 2, (uint64_t)f->len);
    XXH3_128bits_update(state, head, 10);
    if (f->len)
        XXH3_128bits_update(state, f->ptr, f->len);
}

/* The root key of a namespace that kvp__ns_valid accepted. Cannot fail. */
kvp_key kvp__ns_root_xxh3(uint64_t seed, const kvp_namespace *ns)
{
    static const unsigned char tag[8] = {'K', 'V', 'P', 'N', 'S', '1', 0, 0};
    XXH3_state_t state;
    memset(&state, 0, sizeof state); /* quiets gcc's may-be-uninitialized in reset */
    XXH3_128bits_reset_withSeed(&state, seed);
    XXH3_128bits_update(&state, tag, sizeof tag);
    hash_field(&state, 1, &ns->model);
    hash_field(&state, 2, &ns->adapter);
    hash_field(&state, 3, &ns->tenant);
    hash_field(&state, 4, &ns->salt);
    return kvp__from_xxh(XXH3_128bits_digest(&state));
}

static kvp_key external_key(uint64_t seed, kvp_key root, kvp_key id)
{
    unsigned char buf[40] = {'K', 'V', 'P', 'E', 'X', 'T', '1', 0};
    kvp__put_key(buf + 8, root);
    kvp__put_key(buf + 24, id);
    return kvp__from_xxh(XXH3_128bits_withSeed(buf, sizeof buf, seed));
}

KVP_EXPORT void kvp_namespace_init(kvp_namespace *ns)
{
    if (ns)
        memset(ns, 0, sizeof *ns);
}

KVP_EXPORT kvp_field kvp_field_str(const char *s)
{
    kvp_field f = {s, s ? strlen(s) : 0};
    return f;
}

KVP_EXPORT int kvp_namespace_key(uint64_t seed, const kvp_namespace *ns, kvp_key *out)
{
    if (!out)
        return kvp__fail_done(kvp__fail(KVP_EINVAL, "out is NULL"));
    int rc = kvp__ns_valid(ns);
    if (rc != KVP_OK)
        return kvp__fail_done(rc);
    *out = kvp__ns_root_xxh3(seed, ns);
    return KVP_OK;
}

/* Say which argument of kvp_hash_blocks is invalid (hash_blocks_ok refused them). */
static KVP__COLD int hash_blocks_refused(const uint32_t *tokens, size_t n_tokens,
                                         uint32_t block_size, const kvp_key *keys, size_t cap,
                                         const size_t *n_keys)
{
    if (!n_keys)
        return kvp__fail(KVP_EINVAL, "n_keys is NULL");
    if (!tokens && n_tokens)
        return kvp__fail(KVP_EINVAL, "tokens is NULL but n_tokens is %zu", n_tokens);
    if (!keys && cap)
        return kvp__fail(KVP_EINVAL, "keys is NULL but cap is %zu", cap);
    return kvp__fail(KVP_EINVAL, "block_size is %" PRIu32 ", outside 1..%u", block_size,
                     KVP_MAX_BLOCK_SIZE);
}

KVP_EXPORT int kvp_hash_blocks(uint64_t seed, kvp_key parent, const uint32_t *tokens,
                               size_t n_tokens, uint32_t block_size, kvp_key *keys, size_t cap,
                               size_t *n_keys)
{
    if (!n_keys || (!tokens && n_tokens) || (!keys && cap) || block_size == 0 ||
        block_size > KVP_MAX_BLOCK_SIZE)
        return kvp__fail_done(hash_blocks_refused(tokens, n_tokens, block_size, keys, cap, n_keys));
    size_t n = n_tokens / block_size;
    if (n > cap)
        n = cap;
    if (block_size == 16) {
        for (size_t i = 0; i < n; i++) {
            /* The chain serializes the hashes; fetching tokens ahead keeps their loads off
             * its critical path (one line of 16 tokens per block). */
            if (i + 8 < n)
                KVP__PREFETCH(tokens + (i + 8) * 16);
            keys[i] = parent = kvp__hash_block16(seed, parent, tokens + i * 16);
        }
    } else {
        for (size_t i = 0; i < n; i++)
            keys[i] = parent = kvp__hash_block(seed, parent, tokens + i * block_size, block_size);
    }
    *n_keys = n;
    return KVP_OK;
}

KVP_EXPORT kvp_key kvp_external_key(uint64_t seed, kvp_key root, kvp_key external_id)
{
    return external_key(seed, root, external_id);
}

/* The cache-level variants use the cache's profile and apply the test-only truncation. */
kvp_key kvp__cache_root(const kvp_cache *cache, const kvp_namespace *ns)
{
    assert(kvp__ns_valid(ns) == KVP_OK); /* the entry points validate it first */
    return kvp__key_truncate(kvp__hasher_root(&cache->hasher, ns), cache->key_bits);
}

kvp_key kvp__cache_external_key(const kvp_cache *cache, kvp_key root, kvp_key id)
{
    return kvp__key_truncate(kvp__hasher_external(&cache->hasher, root, id), cache->key_bits);
}

static int cache_keys(const kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                      size_t n_tokens, kvp_key *root, kvp_key *keys, size_t cap, size_t *n_keys)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    if (!root)
        return kvp__fail(KVP_EINVAL, "root is NULL");
    if (!n_keys)
        return kvp__fail(KVP_EINVAL, "n_keys is NULL");
    if (!tokens && n_tokens)
        return kvp__fail(KVP_EINVAL, "tokens is NULL but n_tokens is %zu", n_tokens);
    if (!keys && cap)
        return kvp__fail(KVP_EINVAL, "keys is NULL but cap is %zu", cap);
    int rc = kvp__ns_valid(ns);
    if (rc != KVP_OK)
        return rc;
    if (kvp__in_callback(cache))
        return kvp__fail(KVP_EBUSY, "called from inside this cache's own event callback");
    size_t bs = cache->cfg.block_size, n = n_tokens / bs;
    if (n > cap)
        n = cap;
    rc = kvp__hasher_ns_check(&cache->hasher, ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_tokens_check(&cache->hasher, tokens, n_tokens);
    if (rc != KVP_OK)
        return rc;
    *root = kvp__cache_root(cache, ns);
    kvp_key parent, high;
    kvp__hasher_start(&cache->hasher, *root, &parent, &high);
    kvp__vctx vx = kvp__hasher_vctx(ns);
    for (size_t i = 0; i < n; i++) {
        kvp__cache_chain(cache, &vx, &parent, &high, tokens + i * bs, i);
        keys[i] = parent;
    }
    *n_keys = n;
    return KVP_OK;
}

KVP_EXPORT int kvp_cache_keys(const kvp_cache *cache, const kvp_namespace *ns,
                              const uint32_t *tokens, size_t n_tokens, kvp_key *root, kvp_key *keys,
                              size_t cap, size_t *n_keys)
{
    return kvp__public(cache_keys(cache, ns, tokens, n_tokens, root, keys, cap, n_keys));
}
