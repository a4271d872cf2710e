/*
 * blockhash.h - the block-key hash, XXH3-128(parent key bytes || tokens as little-endian
 * u32), as an inline function so the lookup loop (lifecycle.c) and keys.c share one
 * definition with no call in between. xxHash is included with XXH_INLINE_ALL: its
 * implementation is compiled into the callers from Debian's libxxhash-dev header (no
 * vendored copy), which lets the compiler specialise the 80-byte case of the default block
 * size. The byte layout is documented in keys.c.
 */
#ifndef KVP_BLOCKHASH_H
#define KVP_BLOCKHASH_H

#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "internal.h"

#define KVP__STACK_BLOCK_BYTES 4096u /* key + up to 1020 tokens */

static inline void kvp__put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void kvp__put_key(unsigned char *p, kvp_key k)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(p, &k.lo, 8);
    memcpy(p + 8, &k.hi, 8);
#else
    kvp__put_u64le(p, k.lo);
    kvp__put_u64le(p + 8, k.hi);
#endif
}

static inline kvp_key kvp__from_xxh(XXH128_hash_t h)
{
    kvp_key k = {h.low64, h.high64};
    return k;
}

/* Copy n tokens as little-endian u32 to dst. */
static inline void kvp__put_tokens(unsigned char *dst, const uint32_t *tokens, size_t n)
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

/* A 64-bit fingerprint of n tokens (a block, or a prompt's partial last block) for
 * kvp_commit's check that it was given the acquired prompt. The check never leaves the
 * process, so byte order does not matter, and it is not meant to stop an adversary (the
 * engine is trusted): it catches engine mistakes. On x86-64 CPUs with SSE4.2 it is two
 * interleaved CRC32C lanes over alternate 8-byte words (the hardware instruction: 8 of
 * them for a 16-token block, about a fifth of XXH3-64's instructions, which this check
 * paid twice per prompt block, at acquire and at commit: 14% of the library's
 * instructions in workload (c)). CRC32C is linear, so a mismatch confined to one lane's
 * words passes with probability about 2^-32 (and never when it flips at most 3 bits);
 * elsewhere, XXH3-64 (about 2^-64). The choice is made per call from the CPU, so acquire
 * and commit always agree. Cannot fail. */
#if defined(__x86_64__) && defined(__GNUC__)
#define KVP__HAVE_CRC_FP 1
/* Two CRC32C lanes: a over words 0, 2, 4..., b over words 1, 3, 5... of n_words 8-byte
 * words at p, then a over the odd 4-byte tail word if any. */
#define KVP__CRC_LANES(p, n_words, a, b)                                                           \
    for (size_t w_ = 0; w_ < (n_words); w_ += 2) {                                                 \
        uint64_t w0_, w1_;                                                                         \
        memcpy(&w0_, (p) + 8 * w_, 8);                                                             \
        memcpy(&w1_, (p) + 8 * w_ + 8, 8);                                                         \
        (a) = __builtin_ia32_crc32di((a), w0_);                                                    \
        (b) = __builtin_ia32_crc32di((b), w1_);                                                    \
    }

__attribute__((target("sse4.2"))) static uint64_t kvp__tokens_crc16(const uint32_t *t)
{
    const unsigned char *p = (const unsigned char *)t;
    uint64_t a = 0xffffffffu, b = 0x9e3779b9u;
    KVP__CRC_LANES(p, 8, a, b) /* constant trip count: unrolled */
    return (a << 32 | b) ^ 16u;
}

__attribute__((target("sse4.2"))) static uint64_t kvp__tokens_crc(const uint32_t *t, size_t n)
{
    const unsigned char *p = (const unsigned char *)t;
    uint64_t a = 0xffffffffu, b = 0x9e3779b9u;
    size_t n_pairs = n / 4;
    KVP__CRC_LANES(p, 2 * n_pairs, a, b)
    for (size_t i = 4 * n_pairs; i < n; i++)
        a = __builtin_ia32_crc32si((uint32_t)a, t[i]);
    return (a << 32 | b) ^ (uint64_t)n;
}
#endif

static inline uint64_t kvp__tokens_fp(const uint32_t *t, size_t n)
{
#ifdef KVP__HAVE_CRC_FP
    if (__builtin_cpu_supports("sse4.2"))
        return n == 16 ? kvp__tokens_crc16(t) : kvp__tokens_crc(t, n);
#endif
    return XXH3_64bits(t, n * sizeof *t);
}

#ifdef KVP__HAVE_CRC_FP
__attribute__((target("sse4.2"))) static size_t
kvp__crc_blocks(const uint32_t *t, size_t bs, size_t n, uint64_t *out, const uint64_t *want)
{
    for (size_t j = 0; j < n; j++) {
        uint64_t fp = bs == 16 ? kvp__tokens_crc16(t + j * 16) : kvp__tokens_crc(t + j * bs, bs);
        if (out)
            out[j] = fp;
        else if (fp != want[j])
            return j;
    }
    return n;
}
#endif

/* The fingerprints of n consecutive full blocks of bs tokens at t: written to out when out
 * is not NULL (and n returned); else compared with want[0 .. n), returning the index of the
 * first that differs, or n. One CPU dispatch per call rather than per block, so the CRC
 * loop inlines its 16-token case. Cannot fail. */
static inline size_t kvp__tokens_fp_blocks(const uint32_t *t, size_t bs, size_t n, uint64_t *out,
                                           const uint64_t *want)
{
#ifdef KVP__HAVE_CRC_FP
    if (__builtin_cpu_supports("sse4.2"))
        return kvp__crc_blocks(t, bs, n, out, want);
#endif
    for (size_t j = 0; j < n; j++) {
        uint64_t fp = XXH3_64bits(t + j * bs, bs * sizeof *t);
        if (out)
            out[j] = fp;
        else if (fp != want[j])
            return j;
    }
    return n;
}

/* Hash one block of the default size, 16 tokens: the input is always 80 bytes, and
 * `flatten` inlines XXH3 into this function so it compiles to its 17..128-byte case alone,
 * with no length dispatch (about 2x faster than the generic call). Cannot fail. */
static inline KVP__FLATTEN kvp_key kvp__hash_block16(uint64_t seed, kvp_key parent,
                                                     const uint32_t *tokens)
{
    unsigned char buf[16 + 64];
    kvp__put_key(buf, parent);
    kvp__put_tokens(buf + 16, tokens, 16);
    return kvp__from_xxh(XXH3_128bits_withSeed(buf, sizeof buf, seed));
}

/* Hash one block given its parent key. Cannot fail. */
static inline kvp_key kvp__hash_block(uint64_t seed, kvp_key parent, const uint32_t *tokens,
                                      uint32_t block_size)
{
    assert(block_size >= 1 && block_size <= KVP_MAX_BLOCK_SIZE && tokens);
    size_t n_bytes = 16 + (size_t)block_size * 4;
    if (block_size == 16)
        return kvp__hash_block16(seed, parent, tokens);
    if (n_bytes <= KVP__STACK_BLOCK_BYTES) {
        unsigned char buf[KVP__STACK_BLOCK_BYTES];
        kvp__put_key(buf, parent);
        kvp__put_tokens(buf + 16, tokens, block_size);
        return kvp__from_xxh(XXH3_128bits_withSeed(buf, n_bytes, seed));
    }
    /* Cold path: very large blocks stream the tokens in chunks. */
    XXH3_state_t state;
    memset(&state, 0, sizeof state); /* quiets gcc's may-be-uninitialized in reset */
    unsigned char buf[KVP__STACK_BLOCK_BYTES];
    XXH3_128bits_reset_withSeed(&state, seed);
    kvp__put_key(buf, parent);
    XXH3_128bits_update(&state, buf, 16);
    for (size_t done = 0; done < block_size;) {
        size_t n = block_size - done;
        if (n > KVP__STACK_BLOCK_BYTES / 4)
            n = KVP__STACK_BLOCK_BYTES / 4;
        kvp__put_tokens(buf, tokens + done, n);
        XXH3_128bits_update(&state, buf, n * 4);
        done += n;
    }
    return kvp__from_xxh(XXH3_128bits_digest(&state));
}

/* The keyed profile's 16-token block: as kvp__hash_block16 with the 192-byte secret in
 * place of the seed (XXH3's 17..128-byte case reads its secret words from memory instead
 * of deriving them from the seed). Cannot fail. */
static inline KVP__FLATTEN kvp_key kvp__hash_block16_secret(const unsigned char *secret,
                                                            kvp_key parent, const uint32_t *tokens)
{
    unsigned char buf[16 + 64];
    kvp__put_key(buf, parent);
    kvp__put_tokens(buf + 16, tokens, 16);
    return kvp__from_xxh(XXH3_128bits_withSecret(buf, sizeof buf, secret, KVP__SECRET_BYTES));
}

/* The keyed profile's block key for any block size (see kvp__hash_block). Cannot fail. */
static inline kvp_key kvp__hash_block_secret(const unsigned char *secret, kvp_key parent,
                                             const uint32_t *tokens, uint32_t block_size)
{
    size_t n_bytes = 16 + (size_t)block_size * 4;
    if (block_size == 16)
        return kvp__hash_block16_secret(secret, parent, tokens);
    unsigned char buf[KVP__STACK_BLOCK_BYTES];
    if (n_bytes <= KVP__STACK_BLOCK_BYTES) {
        kvp__put_key(buf, parent);
        kvp__put_tokens(buf + 16, tokens, block_size);
        return kvp__from_xxh(XXH3_128bits_withSecret(buf, n_bytes, secret, KVP__SECRET_BYTES));
    }
    XXH3_state_t state;
    memset(&state, 0, sizeof state);
    XXH3_128bits_reset_withSecret(&state, secret, KVP__SECRET_BYTES);
    kvp__put_key(buf, parent);
    XXH3_128bits_update(&state, buf, 16);
    for (size_t done = 0; done < block_size;) {
        size_t n = block_size - done;
        if (n > KVP__STACK_BLOCK_BYTES / 4)
            n = KVP__STACK_BLOCK_BYTES / 4;
        kvp__put_tokens(buf, tokens + done, n);
        XXH3_128bits_update(&state, buf, n * 4);
        done += n;
    }
    return kvp__from_xxh(XXH3_128bits_digest(&state));
}

/* The scoped key of an external id (keys.c gives the 40-byte layout: "KVPEXT1\0" || root ||
 * id) under the xxh3 profile's seed or the keyed profile's secret. Inline and flattened so a
 * lookup by ids hashes each id with XXH3's 17..128-byte case compiled in, with no call and no
 * length or profile dispatch per id: as two out-of-line calls (keys.c, hash_profile.c) the
 * keyed profile's ids made kvp_lookup_ids 1.3-1.8x slower than the seeded call of 309f247
 * (docs/performance.md). Cannot fail. */
static inline KVP__FLATTEN kvp_key kvp__external_key_seed(uint64_t seed, kvp_key root, kvp_key id)
{
    unsigned char buf[40] = {'K', 'V', 'P', 'E', 'X', 'T', '1', 0};
    kvp__put_key(buf + 8, root);
    kvp__put_key(buf + 24, id);
    return kvp__from_xxh(XXH3_128bits_withSeed(buf, sizeof buf, seed));
}

static inline KVP__FLATTEN kvp_key kvp__external_key_secret(const unsigned char *secret,
                                                            kvp_key root, kvp_key id)
{
    unsigned char buf[40] = {'K', 'V', 'P', 'E', 'X', 'T', '1', 0};
    kvp__put_key(buf + 8, root);
    kvp__put_key(buf + 24, id);
    return kvp__from_xxh(XXH3_128bits_withSecret(buf, sizeof buf, secret, KVP__SECRET_BYTES));
}

/* Advance a cache's chain value (*key, *high) over block `index` of a prompt in the
 * namespace whose vLLM extra keys are vx, and apply the test-only truncation. The xxh3
 * and keyed profiles are inlined; the others call kvp__hasher_next. Cannot fail. */
static inline void kvp__cache_chain(const kvp_cache *cache, const kvp__vctx *vx, kvp_key *key,
                                    kvp_key *high, const uint32_t *tokens, uint64_t index)
{
    const kvp_hasher *h = &cache->hasher;
    if (h->profile == KVP_HASH_XXH3)
        *key = kvp__hash_block(h->seed, *key, tokens, h->block_size);
    else if (h->profile == KVP_HASH_KEYED)
        *key = kvp__hash_block_secret(h->secret, *key, tokens, h->block_size);
    else
        kvp__hasher_next(h, vx, key, high, tokens, index);
    *key = kvp__key_truncate(*key, cache->key_bits);
}

#endif /* KVP_BLOCKHASH_H */
