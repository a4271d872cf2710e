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
 * hashing stays within a few percent of raw XXH3 over the same bytes (bench/bench_core).
 * Larger blocks use XXH3's streaming state. Nothing here allocates.
 */
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for the streaming cold paths */
#include <xxhash.h>

#include "internal.h"

#define STACK_BLOCK_BYTES 4096u /* key + up to 1020 tokens */

static inline void put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void put_key(unsigned char *p, kvp_key k)
{
    put_u64le(p, k.lo);
    put_u64le(p + 8, k.hi);
}

static inline kvp_key from_xxh(XXH128_hash_t h)
{
    kvp_key k = {h.low64, h.high64};
    return k;
}

/* Copy n tokens as little-endian u32 to dst. */
static inline void put_tokens(unsigned char *dst, const uint32_t *tokens, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, tokens, n * sizeof(uint32_t));
#else
    for (size_t i = 0; i < n; i++) {
        uint32_t t = tokens[i];
        dst[4 * i] = (unsigned char)t;
        dst[4 * i + 1] = (unsigned char)(t >> 8);
        dst[4 * i + 2] = (unsigned char)(t >> 16);
        dst[4 * i + 3] = (unsigned char)(t >> 24);
    }
#endif
}

/* Hash one block given its parent key. Cannot fail. */
kvp_key kvp__hash_block(uint64_t seed, kvp_key parent, const uint32_t *tokens, uint32_t block_size)
{
    size_t n_bytes = 16 + (size_t)block_size * 4;
    if (n_bytes <= STACK_BLOCK_BYTES) {
        unsigned char buf[STACK_BLOCK_BYTES];
        put_key(buf, parent);
        put_tokens(buf + 16, tokens, block_size);
        return from_xxh(XXH3_128bits_withSeed(buf, n_bytes, seed));
    }
    /* Cold path: very large blocks stream the tokens in chunks. */
    XXH3_state_t state;
    unsigned char buf[STACK_BLOCK_BYTES];
    XXH3_128bits_reset_withSeed(&state, seed);
    put_key(buf, parent);
    XXH3_128bits_update(&state, buf, 16);
    for (size_t done = 0; done < block_size;) {
        size_t n = block_size - done;
        if (n > STACK_BLOCK_BYTES / 4)
            n = STACK_BLOCK_BYTES / 4;
        put_tokens(buf, tokens + done, n);
        XXH3_128bits_update(&state, buf, n * 4);
        done += n;
    }
    return from_xxh(XXH3_128bits_digest(&state));
}

static int field_valid(const kvp_field *f)
{
    return f->ptr != NULL || f->len == 0;
}

int kvp__ns_valid(const kvp_namespace *ns)
{
    if (!ns || !field_valid(&ns->model) || !field_valid(&ns->adapter) ||
        !field_valid(&ns->tenant) || !field_valid(&ns->salt))
        return KVP_EINVAL;
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
    put_u64le(head + 2, (uint64_t)f->len);
    XXH3_128bits_update(state, head, 10);
    if (f->len)
        XXH3_128bits_update(state, f->ptr, f->len);
}

/* The root key of a namespace that kvp__ns_valid accepted. Cannot fail. */
static kvp_key ns_root(uint64_t seed, const kvp_namespace *ns)
{
    static const unsigned char tag[8] = {'K', 'V', 'P', 'N', 'S', '1', 0, 0};
    XXH3_state_t state;
    XXH3_128bits_reset_withSeed(&state, seed);
    XXH3_128bits_update(&state, tag, sizeof tag);
    hash_field(&state, 1, &ns->model);
    hash_field(&state, 2, &ns->adapter);
    hash_field(&state, 3, &ns->tenant);
    hash_field(&state, 4, &ns->salt);
    return from_xxh(XXH3_128bits_digest(&state));
}

static kvp_key external_key(uint64_t seed, kvp_key root, kvp_key id)
{
    unsigned char buf[40] = {'K', 'V', 'P', 'E', 'X', 'T', '1', 0};
    put_key(buf + 8, root);
    put_key(buf + 24, id);
    return from_xxh(XXH3_128bits_withSeed(buf, sizeof buf, seed));
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
    if (!out || kvp__ns_valid(ns) != KVP_OK)
        return KVP_EINVAL;
    *out = ns_root(seed, ns);
    return KVP_OK;
}

KVP_EXPORT int kvp_hash_blocks(uint64_t seed, kvp_key parent, const uint32_t *tokens,
                               size_t n_tokens, uint32_t block_size, kvp_key *keys, size_t cap,
                               size_t *n_keys)
{
    if (!n_keys || (!tokens && n_tokens) || (!keys && cap) || block_size == 0 ||
        block_size > KVP_MAX_BLOCK_SIZE)
        return KVP_EINVAL;
    size_t n = n_tokens / block_size;
    if (n > cap)
        n = cap;
    for (size_t i = 0; i < n; i++) {
        parent = kvp__hash_block(seed, parent, tokens + i * block_size, block_size);
        keys[i] = parent;
    }
    *n_keys = n;
    return KVP_OK;
}

KVP_EXPORT kvp_key kvp_external_key(uint64_t seed, kvp_key root, kvp_key external_id)
{
    return external_key(seed, root, external_id);
}

/* The cache-level variants apply the test-only truncation (key_bits < 128). */
kvp_key kvp__cache_root(const kvp_cache *cache, const kvp_namespace *ns)
{
    return kvp__key_truncate(ns_root(cache->cfg.seed, ns), cache->key_bits);
}

kvp_key kvp__cache_block_key(const kvp_cache *cache, kvp_key parent, const uint32_t *tokens)
{
    kvp_key k = kvp__hash_block(cache->cfg.seed, parent, tokens, cache->cfg.block_size);
    return kvp__key_truncate(k, cache->key_bits);
}

kvp_key kvp__cache_external_key(const kvp_cache *cache, kvp_key root, kvp_key id)
{
    return kvp__key_truncate(external_key(cache->cfg.seed, root, id), cache->key_bits);
}
