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
 *
 * Cache shapes: fz_block_size draws from 1..4 (short inputs, many blocks), 16 (the default,
 * which the library hashes on its own inlined 80-byte path) and 1021 and 1500 (over 1020
 * tokens the library streams a block through XXH3's state in chunks of 1024 tokens: one
 * chunk, then two). fz_prompt_len picks whole blocks plus a tail that is often empty, one
 * token or one short of a block, so exactly-full prompts and commits that complete a block
 * are common at every block size.
 *
 * Keys: fz_keys holds how a harness's caches derive keys - the hash profile (keyed, xxh3,
 * siphash and, where the harness can follow vLLM's namespaces, vllm-sha256-cbor and
 * vllm-xxhash-cbor), a 64-bit seed, a 16..32-byte key or a vLLM seed string, all from the
 * input, and for forced collisions the number of key bits kept - and fz_keys_apply is the
 * only place that writes them into a kvp_config.
 *
 * Key oracle: fz_oracle_* is a second, deliberately naive implementation of every
 * profile's byte layout as docs/hash-profiles.md and docs/test-vectors.md document it,
 * written from that text and sharing no code with the library: each hash input is built
 * byte by byte (integers by shifts, so little-endian on every host; vLLM's tuples by a
 * small CBOR writer of the oracle's own) into one buffer and hashed with one call of a
 * separately compiled primitive: Debian's libxxhash (XXH3_128bits_withSeed, _withSecret,
 * XXH3_128bits; not the copy the library inlines), libsodium's crypto_generichash (BLAKE2b)
 * and crypto_shorthash_siphashx24, OpenSSL's one-shot SHA256(). A bug in the library's
 * framing, chaining, seeding, key derivation, CBOR or byte order - even one shared by
 * chaining and lookup, which would cancel out when the library is compared with itself -
 * shows up as a key that differs from the oracle's.
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

/* ---------------------------------------------------------------------------------------- */
/* Cache shapes and keys                                                                    */
/* ---------------------------------------------------------------------------------------- */

#define FZ_MAX_BLOCK_SIZE 1500u /* largest block size fz_block_size returns */

/* A block size from one byte: 1, 2, 3, 4 (half the time), 16 (a quarter), 1021 or 1500
 * (an eighth each). Cannot fail. */
uint32_t fz_block_size(fz_in *in);

/* A prompt length of 0..max_blocks full blocks of bs tokens plus a tail (none, one token,
 * bs - 1 tokens or any), at least 1 and at most (max_blocks + 1) * bs - 1. Cannot fail. */
size_t fz_prompt_len(fz_in *in, uint32_t bs, size_t max_blocks);

/* Which hash profiles fz_keys_decode may draw (a harness whose namespaces or reference
 * model cannot follow vLLM's restricted namespaces leaves the vLLM profiles out). */
#define FZ_PROFILES_ALL     1 /* keyed, xxh3, siphash, vllm-sha256-cbor, vllm-xxhash-cbor */
#define FZ_PROFILES_NO_VLLM 0 /* keyed, xxh3, siphash */

#define FZ_VLLM_SEED_MAX 8u   /* longest vLLM seed string fz_keys_decode writes */
#define FZ_SECRET_BYTES  192u /* the keyed profile's XXH3 secret */

/* How a cache derives its keys: the profile and its key material, drawn from the input. */
typedef struct fz_keys {
    int profile;                          /* KVP_HASH_*: the cache's hash profile */
    uint64_t seed;                        /* xxh3 chain, and the scope roots of vllm-* */
    uint8_t key[KVP_HASH_KEY_MAX];        /* keyed, siphash: the secret key K */
    uint32_t key_len;                     /* bytes of key: 16..32 (keyed, siphash), else 0 */
    bool vllm_default;                    /* vllm-*: seed string NULL (vLLM's default) */
    char vllm_seed[FZ_VLLM_SEED_MAX + 1]; /* vllm-*: the seed string when not default */
    unsigned bits;                        /* key bits the cache keeps: 128, or 1..16 */
    uint8_t secret[FZ_SECRET_BYTES];      /* keyed: the oracle's derivation of secret(K) */
    uint8_t sip_key[16];                  /* siphash: the oracle's derivation of k_sip */
} fz_keys;

/* Read a seed (8 bytes, little-endian), a profile (one byte; `profiles` is FZ_PROFILES_*),
 * and for keyed/siphash a key of 16..32 input bytes, for vllm-* a seed string (vLLM's
 * default, or 0..8 printable characters); set bits to 128 and derive the oracle's secret
 * and SipHash key from K with libsodium. Cannot fail. */
void fz_keys_decode(fz_in *in, fz_keys *k, int profiles);

static inline bool fz_keys_vllm(const fz_keys *k)
{
    return k->profile == KVP_HASH_VLLM_SHA256 || k->profile == KVP_HASH_VLLM_XXHASH;
}

/* Make cfg derive keys as k says (profile, seed, key, vLLM seed; key truncation needs the
 * cache, see fz_keys_truncate_cache). Every harness configures its caches' keys through
 * this function only. Cannot fail. */
void fz_keys_apply(const fz_keys *k, kvp_config *cfg);

/* Apply k->bits to a new, empty cache (the test-only truncation hook); fails the input if
 * the library refuses. */
void fz_keys_truncate_cache(const fz_keys *k, kvp_cache *cache);

/* True when profile k can express ns (docs/hash-profiles.md, namespace mapping): always,
 * except under vllm-* with a model or tenant present or an empty salt. The harnesses'
 * field bytes are all below 0x80, so UTF-8 validity never decides. */
bool fz_ns_expressible(const fz_keys *k, const kvp_namespace *ns);

/* Under vllm-*, rewrite every namespace of set[0 .. n) into one vLLM can express: the
 * model dropped (one engine serves one model), a tenant moved into an absent salt (as
 * docs/hash-profiles.md advises) or dropped, an empty salt dropped. orig[i] receives the
 * namespace as decoded (its fields still point into set[i]). Other profiles: orig[i] =
 * set[i].ns, nothing rewritten. Cannot fail. */
void fz_ns_map_profile(const fz_keys *k, fz_ns *set, size_t n, kvp_namespace *orig);

/* True when two expressible namespaces get the same block-0 key under vllm-* for equal
 * tokens: their extra-keys tuples (LoRA name if any, then cache_salt if any) are equal. So
 * adapter "x" without salt and salt "x" without adapter share block 0, as in vLLM. */
bool fz_ns_vllm_block0_equal(const kvp_namespace *a, const kvp_namespace *b);

/* ---------------------------------------------------------------------------------------- */
/* Key oracle (independent of the library's hashing code)                                   */
/* ---------------------------------------------------------------------------------------- */

/* Keep the low bits of a 128-bit key (bits >= 128: unchanged). */
kvp_key fz_key_trunc(kvp_key k, unsigned bits);

static inline bool fz_key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* A chain value: the index key and, for vllm-sha256-cbor, the digest's high 128 bits. */
typedef struct fz_chain {
    kvp_key key;  /* the block's (or chain start's) key */
    kvp_key high; /* vllm-sha256-cbor: digest bytes 0..15 read big-endian; else 0 */
} fz_chain;

/* The namespace root (what kvp_hasher_root returns as chain.root): the framed encoding
 * "KVPNS1\0\0", then per field (model 1, adapter 2, tenant 3, salt 4) its number, a
 * presence byte and, when present, its length as u64 LE and its bytes; hashed with
 * XXH3-128(seed) (xxh3, vllm-*) or BLAKE2b-128 keyed with K (keyed, siphash). */
kvp_key fz_oracle_root(const fz_keys *k, const kvp_namespace *ns);

/* Where a namespace's chain starts: its root (already truncated as the cache keeps it),
 * or NONE_HASH = H(cbor(seed string)) under vllm-*. */
fz_chain fz_oracle_start(const fz_keys *k, kvp_key root);

/* Block `index` of a chain after parent: n tokens under profile k in namespace ns. */
fz_chain fz_oracle_block(const fz_keys *k, const kvp_namespace *ns, fz_chain parent,
                         const uint32_t *tokens, size_t n, size_t index);

/* An external key: "KVPEXT1\0" || root key bytes || external id key bytes, hashed with
 * XXH3-128(seed) (xxh3, vllm-*), XXH3-128 with secret(K) (keyed) or SipHash (siphash). */
kvp_key fz_oracle_external(const fz_keys *k, kvp_key root, kvp_key id);

/* The chain of tokens[0 .. n_tokens) in namespace ns (may be NULL outside vllm-*) from
 * fz_oracle_start(k, root) (root already truncated), as a cache keeping `bits` key bits
 * sees it: each block's key is truncated before it becomes the next parent (the high half
 * is not). Writes min(n_tokens / bs, cap) keys, and their high halves to highs unless it is
 * NULL; returns the count. */
size_t fz_oracle_chain(const fz_keys *k, unsigned bits, const kvp_namespace *ns, kvp_key root,
                       const uint32_t *tokens, size_t n_tokens, uint32_t bs, kvp_key *keys,
                       kvp_key *highs, size_t cap);

#endif /* KVP_FUZZ_UTIL_H */
