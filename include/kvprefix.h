/*
 * kvprefix.h - the public API of kvprefix, an automatic prefix cache for LLM serving.
 *
 * An engine keeps the keys and values (KV) of every processed token in fixed-size blocks.
 * When a new request starts with exactly the same tokens as an earlier one, under the same
 * model, adapter, tenant and cache salt, the KV of the shared full blocks can be reused and
 * that part of prefill skipped. kvprefix decides what is reusable; the engine owns the KV
 * memory itself and only learns block ids (0 .. n_blocks-1) from the cache.
 *
 * Keys. A request's namespace (model, adapter, tenant, salt) is encoded as typed,
 * length-prefixed fields and hashed with XXH3-128 into a 128-bit root key. Block i of the
 * token sequence gets the key XXH3-128(key of block i-1 (the root for block 0) || the
 * block's tokens as little-endian uint32), with the cache's 64-bit seed. Equal keys
 * therefore mean equal namespace and equal tokens up to and including the block.
 * docs/design.md gives the byte layout and test vectors. That is the xxh3 hash profile; a
 * cache's profile (kvp_config.hash_profile) may instead be keyed (the default: unforgeable
 * without the cache's secret key), siphash, or vLLM's exact block hash
 * (docs/hash-profiles.md). kvp_namespace_key, kvp_hash_blocks and kvp_external_key always
 * compute the xxh3 profile's keys; kvp_hasher computes any profile's.
 *
 * Request lifecycle (what an engine calls):
 *   kvp_lookup   read-only query: the longest reusable cached prefix;
 *   kvp_acquire  pin the hit blocks and allocate the rest of the request's blocks;
 *   kvp_commit   register newly full blocks under their keys (after prefill, during decode);
 *   kvp_grow     allocate more blocks as decode goes on;
 *   kvp_release  unpin the request's blocks, tail first, so chains are evicted tail first.
 * kvp_access does lookup + insert + release at once, for replay and simulation.
 *
 * Conventions. Every function that can fail returns int: KVP_OK (0) or a negative KVP_E*
 * code, described by kvp_strerror(); kvp_errmsg() then says which argument or limit and why
 * ("n_blocks must be at least 1"). Results come back through out-parameters that are left
 * untouched on failure, and a failed call leaves the cache exactly as it was (ENOMEM
 * included). A cache miss is not an error. The library never prints, exits or aborts.
 *
 * Threads. One cache may be used from many threads at once. Lookups (kvp_lookup*,
 * kvp_cache_stats, kvp_request_blocks, kvp_cache_check) share a reader/writer lock and run
 * in parallel; every mutation (acquire, commit, grow, release, access, reset) takes it
 * exclusively and is linearizable; counters are exact. Keys can be computed outside any lock
 * (kvp_cache_keys) and passed to the *_keys forms. kvp_cache_new and kvp_cache_free must not
 * race with other calls on the same cache. Distinct caches are independent.
 * kvp_config.single_threaded drops the lock for engines that serialize calls themselves.
 * docs/design.md ("Threads") has the picture.
 *
 * Callbacks run synchronously, on the thread whose call caused them, with the cache's
 * exclusive lock held and the cache between two consistent states. They may call other
 * caches, but not their own: every function taking that cache returns KVP_EBUSY there
 * (kvp_cache_free is ignored); and they must not wait for a thread that calls this cache.
 */
#ifndef KVPREFIX_H
#define KVPREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KVP_EXPORT
#elif defined(__GNUC__)
#define KVP_EXPORT __attribute__((visibility("default")))
#else
#define KVP_EXPORT
#endif

/* Marks calls whose status must be checked: ignoring the result is a compiler warning
 * (GCC and Clang). With GCC even a (void) cast does not silence it; test the code. */
#if defined(__GNUC__)
#define KVP_NODISCARD __attribute__((warn_unused_result))
#else
#define KVP_NODISCARD
#endif

/* ---------------------------------------------------------------------------------------- */
/* Status codes                                                                             */
/* ---------------------------------------------------------------------------------------- */

enum {
    KVP_OK = 0,         /* success (a cache miss is a success too) */
    KVP_EINVAL = -1,    /* an argument is invalid: NULL pointer, zero size, bad range */
    KVP_ENOMEM = -2,    /* memory allocation failed; nothing was changed */
    KVP_ENOSPC = -3,    /* the pool cannot supply the blocks: too many are pinned */
    KVP_ENOENT = -4,    /* no active request has this id */
    KVP_EEXIST = -5,    /* a request with this id is already active */
    KVP_EOVERFLOW = -6, /* a token or block count does not fit the cache's limits */
    KVP_ERANGE = -7,    /* the call refers to tokens beyond what the request allocated */
    KVP_EBUSY = -8,     /* called from inside one of this cache's callbacks */
    KVP_ECORRUPT = -9,  /* the invariant checker found an inconsistency (a bug) */
    KVP_ETOKEN = -10,   /* a token id is at or above the configured vocab_size */
    KVP_ENOTSUP = -11,  /* the hash profile cannot express this namespace (or no random
                           source for a key): refused rather than a field dropped */
    KVP_ETOOBIG = -12   /* the request needs more blocks than the whole pool has: it can
                           never be served by this cache (unlike KVP_ENOSPC, retrying after
                           other requests end will not help) */
};

/* Status codes added by libkvprefix-events (kvprefix_events.h); kvp_strerror knows them. */
enum {
    KVP_EFORMAT = -13, /* malformed input: not a valid KV-event payload or message */
    KVP_EIO =
        -14 /* a ZeroMQ or Redis call failed (bind, connect, send, timeout): see the call's notes */
};

/* Return a static, human-readable description of a status code. Never NULL; unknown codes
 * give "unknown error". Cannot fail. */
KVP_EXPORT const char *kvp_strerror(int code);

/* The detail of the calling thread's most recent failed call, as sqlite3_errmsg gives it:
 * which argument or limit, and why, with the values involved, in one line of English with
 * no final period, e.g. "n_blocks must be at least 1", "label name 'state' is reserved",
 * "tokens[16..32) differ from the acquired prompt". Pair it with the code the call
 * returned: kvp_strerror(rc) says what kind of error, kvp_errmsg() which and why.
 *
 *   Which calls set it: every function of this header that returns a negative KVP_E* code
 *   sets it before returning (a path with nothing more specific to say sets the code's
 *   kvp_strerror text), so after a failure it always describes that failure, never an
 *   earlier one. Functions that cannot fail, and calls that succeed, leave it unchanged:
 *   like errno, it is meaningful right after a call that failed, and after a success it
 *   still holds the last failure's detail. Before the thread's first failure it is ""
 *   (empty). Functions of libkvprefix-events (kvprefix_events.h) do not set it.
 *   Lifetime: the text is in a thread-local buffer owned by the library, at most 255 bytes
 *   (a longer detail is cut); it is valid until this thread's next call of a function of
 *   this header (kvp_errmsg and kvp_strerror excepted) or the thread's exit. Copy it to
 *   keep it.
 *   Threads: each thread has its own detail, so two threads failing on one shared cache
 *   each read their own, and kvp_cache_new failures (no cache yet) are covered alike.
 * Never NULL, never allocates, cannot fail. (Nor does a failing call allocate to write the
 * detail; only when the library was loaded with dlopen may the C library allocate a
 * thread's thread-local storage when the thread first touches it, as for any such library.) */
KVP_EXPORT const char *kvp_errmsg(void);

/* Versions and compatibility. kvprefix follows semantic versioning, MAJOR.MINOR.PATCH, and
 * the shared library's soname carries MAJOR (libkvprefix.so.MAJOR).
 *   patch (0.1.0 -> 0.1.1)  bug fixes only: no declaration, struct layout, constant or
 *                           documented behaviour changes; API and ABI are identical, either
 *                           library can replace the other.
 *   minor (0.1.x -> 0.2.0)  additions only, source and binary compatible: new functions,
 *                           new KVP_* constants, status, event and reason codes (code that
 *                           switches on them keeps a default case). Existing functions keep
 *                           their signatures and meaning, and every public struct keeps its
 *                           size and layout, so a program built against an older minor runs
 *                           unchanged on a newer library (not the reverse).
 *   major                   may change or remove anything, struct layouts included; the
 *                           soname changes with it.
 * Value structs (kvp_config, kvp_namespace) grow only through their kvp_*_init: the init
 * function fills every field with its default, so code that calls it and then sets fields
 * by name keeps its meaning when a major release adds fields, with a recompile and no edit.
 * A struct grows only in a major release because the caller allocates it: a larger
 * sizeof would be an ABI break under the same soname. While MAJOR is 0 the soname stays
 * libkvprefix.so.0, so 0.x minor releases keep the minor-release promise above; the
 * layouts are fixed by the first tagged release (0.1.0 has not been tagged yet, and
 * kvp_config has grown since: eviction policies, quota scopes). Status codes
 * keep their values forever. Symbols not declared here are private and may change in any
 * release. KVP_VERSION_* describe the header a program was compiled with; kvp_version() and
 * kvp_version_number() the library it runs with. */

/* Return the library version as "MAJOR.MINOR.PATCH" (static string). Compare with
 * KVP_VERSION_STRING to detect a header/library mismatch. Cannot fail. */
KVP_EXPORT const char *kvp_version(void);

/* Return the library version as one number, MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0 is
 * 100), the value of KVP_VERSION_NUMBER in the library's own header, so run-time checks
 * can compare: kvp_version_number() >= KVP_VERSION_NUMBER means the library is at least
 * as new as the header. MINOR and PATCH stay below 100. Cannot fail. */
KVP_EXPORT int kvp_version_number(void);

/* ---------------------------------------------------------------------------------------- */
/* Keys and namespaces                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* A 128-bit block key or namespace root: the XXH3-128 digest, lo = low 64 bits. */
typedef struct kvp_key {
    uint64_t lo; /* low 64 bits of the digest */
    uint64_t hi; /* high 64 bits of the digest */
} kvp_key;

/* One namespace field: ptr == NULL means "absent", which differs from every present value,
 * the empty one included. The bytes are arbitrary (embedded NULs allowed); the caller owns
 * them and they are only read during the call. */
typedef struct kvp_field {
    const void *ptr; /* field bytes, or NULL when the field is absent */
    size_t len;      /* number of bytes at ptr; must be 0 when ptr is NULL */
} kvp_field;

/* Who a request belongs to. Two requests can share a block only if all four fields are
 * equal (same presence, same bytes). Fields are framed by type and length before hashing,
 * so ("ab","c") never encodes like ("a","bc"). */
typedef struct kvp_namespace {
    kvp_field model;   /* base model name or revision */
    kvp_field adapter; /* LoRA or other adapter id; absent for the base model */
    kvp_field tenant;  /* tenant or user isolation domain */
    kvp_field salt;    /* optional per-request cache salt (vLLM's cache_salt) */
} kvp_namespace;

/* Set every field of *ns to absent. Cannot fail (does nothing if ns is NULL). */
KVP_EXPORT void kvp_namespace_init(kvp_namespace *ns);

/* A field for a NUL-terminated string (absent if s is NULL). Cannot fail. */
KVP_EXPORT kvp_field kvp_field_str(const char *s);

/* The default hash seed: 0, so keys are reproducible across processes and machines.
 * Deployments that do not want keys to be predictable from outside set their own seed. */
#define KVP_DEFAULT_SEED UINT64_C(0)

/* Largest supported block size, in tokens. */
#define KVP_MAX_BLOCK_SIZE 65536u

/* Compute the namespace root key for seed. Returns KVP_OK, or KVP_EINVAL if ns or out is
 * NULL or a field has ptr == NULL with len != 0. */
KVP_NODISCARD KVP_EXPORT int kvp_namespace_key(uint64_t seed, const kvp_namespace *ns,
                                               kvp_key *out);

/* Chain-hash the full blocks of tokens[0 .. n_tokens): keys[i] is the key of block i given
 * the key of the block before the first one (the namespace root when tokens start the
 * sequence). The partial tail is ignored. Writes min(n_tokens / block_size, cap) keys and
 * stores that count in *n_keys. Returns KVP_OK; KVP_EINVAL for NULL pointers (tokens may be
 * NULL when n_tokens is 0, keys when cap is 0) or block_size outside 1..KVP_MAX_BLOCK_SIZE. */
KVP_NODISCARD KVP_EXPORT int kvp_hash_blocks(uint64_t seed, kvp_key parent, const uint32_t *tokens,
                                             size_t n_tokens, uint32_t block_size, kvp_key *keys,
                                             size_t cap, size_t *n_keys);

/* The key under which an externally computed block id is cached in a namespace: a router
 * that receives engine block hashes, or a trace whose hash ids already name whole prefixes.
 * The external id is scoped by the namespace root (and domain-separated from token keys), so
 * two namespaces never share blocks even when their external ids are equal. Equal external
 * ids must mean equal prefixes; the cache cannot check that. Cannot fail. */
KVP_EXPORT kvp_key kvp_external_key(uint64_t seed, kvp_key root, kvp_key external_id);

/* ---------------------------------------------------------------------------------------- */
/* Hash profiles and hashers (docs/hash-profiles.md)                                        */
/* ---------------------------------------------------------------------------------------- */

/* How block keys are computed (kvp_config.hash_profile). docs/hash-profiles.md gives each
 * profile's byte layout, speed and what it promises. */
enum {
    KVP_HASH_KEYED = 1,       /* default: roots by keyed BLAKE2b, blocks by XXH3-128 with a
                                 192-byte secret derived from the key; unforgeable without
                                 the key */
    KVP_HASH_XXH3 = 2,        /* XXH3-128 with the public 64-bit seed (the kvp_hash_blocks
                                 chain): fast, safe only when every tenant is trusted */
    KVP_HASH_SIPHASH = 3,     /* every block key is SipHash-2-4-128 of (parent, tokens): a
                                 keyed PRF per block, about 4x slower than keyed */
    KVP_HASH_VLLM_SHA256 = 4, /* vLLM's sha256_cbor hash_block_tokens, bit for bit */
    KVP_HASH_VLLM_XXHASH = 5  /* vLLM's xxhash_cbor hash_block_tokens, bit for bit */
};

/* Return codes the profile fields add to every call (on top of each call's own list):
 *   kvp_cache_new      KVP_EINVAL for an unknown hash_profile or a hash_key_len outside
 *                      0 or 16..32; KVP_ENOTSUP when a random key is needed and the system
 *                      has no random source;
 *   calls taking a namespace (kvp_lookup, kvp_acquire, kvp_access, kvp_lookup_ids,
 *                      kvp_access_ids): KVP_ENOTSUP when the profile cannot express it
 *                      (vllm-*: model or tenant present, empty salt, non-UTF-8 names);
 *   calls taking tokens (kvp_lookup, kvp_acquire, kvp_commit, kvp_access): KVP_ETOKEN when
 *                      vocab_size is set and an id is at or above it.
 * As with every error, the cache is left unchanged. */
#define KVP_HASH_KEY_MIN      16u /* smallest accepted kvp_config.hash_key_len (128 bits) */
#define KVP_HASH_KEY_MAX      32u /* largest: the size of kvp_config.hash_key */
#define KVP_VLLM_SEED_DEFAULT "vllm-none-hash" /* vLLM's default NONE_HASH seed string */

/* The profile's name as the tools spell it ("keyed", "xxh3", "siphash", "vllm-sha256-cbor",
 * "vllm-xxhash-cbor"); NULL for an unknown profile. Cannot fail. */
KVP_EXPORT const char *kvp_hash_profile_name(int profile);

/* Parse a profile name into *out. Returns KVP_OK or KVP_EINVAL (NULL or unknown name). */
KVP_EXPORT int kvp_hash_profile_parse(const char *name, int *out);

/* The state of a key chain after some blocks: what the next block hashes as its parent.
 * A plain value: copy it freely. */
typedef struct kvp_chain {
    kvp_key key;       /* index key of the last block (the chain start before block 0) */
    kvp_key high;      /* vllm-sha256-cbor: high 128 bits of the 256-bit digest; else 0 */
    kvp_key root;      /* the namespace root (scopes external ids; see kvp_hasher_root) */
    uint64_t n_blocks; /* blocks hashed since the root: 0 means the next one is block 0 */
} kvp_chain;

/* A key function (profile, key, seeds, block size, vocab_size) outside any cache: a router
 * or a second thread computes exactly the keys the cache computes. Immutable once made, so
 * one hasher may be used by many threads at once. */
typedef struct kvp_hasher kvp_hasher;
struct kvp_config; /* defined below */
struct kvp_cache;  /* opaque, below */

/* Make a hasher from cfg's hash fields (hash_profile, seed, hash_key, hash_key_len,
 * vllm_seed, block_size, vocab_size, alloc); n_blocks is ignored. With hash_key_len 0
 * under keyed/siphash the key is random, so it equals no other hasher: processes that
 * must agree on keys (engine and router, replicas sharing an index) must share one key.
 * On KVP_OK *out is owned by the caller (kvp_hasher_free). Returns KVP_EINVAL (NULL, bad
 * block size, profile or key length), KVP_ENOMEM, KVP_ENOTSUP (no random source). */
KVP_EXPORT int kvp_hasher_new(const struct kvp_config *cfg, kvp_hasher **out);

/* Free a hasher made by kvp_hasher_new. Accepts NULL. */
KVP_EXPORT void kvp_hasher_free(kvp_hasher *h);

/* The hasher of a cache, equal to it in every key it computes (also with a random key).
 * Owned by the cache, valid until kvp_cache_free. NULL if cache is NULL. */
KVP_EXPORT const kvp_hasher *kvp_cache_hasher(const struct kvp_cache *cache);

/* The chain start of namespace ns: *out gets the root and n_blocks = 0. Returns KVP_OK,
 * KVP_EINVAL (NULL, bad field), KVP_ENOTSUP (vllm-*: model or tenant present, empty salt,
 * or a name that is not UTF-8: vLLM keys cannot express it). */
KVP_EXPORT int kvp_hasher_root(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *out);

/* Hash the full blocks of tokens[0 .. n_tokens) continuing *chain (from kvp_hasher_root or
 * an earlier call with the same ns): out[i] is the chain after block i. Writes
 * min(n_tokens / block_size, cap) states, stores the count in *n_out and advances *chain
 * to the last one. Returns KVP_OK, KVP_EINVAL (NULL pointers), KVP_ENOTSUP (as
 * kvp_hasher_root), KVP_ETOKEN (an id >= vocab_size; nothing written). */
KVP_EXPORT int kvp_hasher_blocks(const kvp_hasher *h, const kvp_namespace *ns, kvp_chain *chain,
                                 const uint32_t *tokens, size_t n_tokens, kvp_chain *out,
                                 size_t cap, size_t *n_out);

/* The key an external id is cached under in the namespace whose root is root (as the
 * cache's _ids calls compute it). Cannot fail (NULL h gives a zero key). */
KVP_EXPORT kvp_key kvp_hasher_external_key(const kvp_hasher *h, kvp_key root, kvp_key external_id);

/* Write the chain's digest in its canonical form (XXH3-128 canonical big-endian, SipHash
 * and BLAKE2b output bytes, or vLLM's digest bytes) to out and return its length: 16, or 32
 * for vllm-sha256-cbor. The event integer (vLLM's KV event form) is the last 8 bytes read
 * big-endian, which is always chain->key.lo. Returns 0 for NULL arguments. */
KVP_EXPORT size_t kvp_chain_digest(const kvp_hasher *h, const kvp_chain *chain, uint8_t out[32]);

/* ---------------------------------------------------------------------------------------- */
/* Cache configuration                                                                      */
/* ---------------------------------------------------------------------------------------- */

/* Memory hooks. alloc returns NULL on failure; free receives the size given to alloc and
 * must accept NULL. Every byte the cache holds goes through these. Both hooks or neither:
 * a free hook without an alloc hook is ignored (malloc/free are used). */
typedef struct kvp_allocator {
    void *(*alloc)(void *ud, size_t size);          /* NULL: malloc */
    void (*free)(void *ud, void *ptr, size_t size); /* NULL: free */
    void *ud;                                       /* passed to both */
} kvp_allocator;

enum {
    KVP_EVENT_STORED = 1,  /* a block was registered under a key (kvp_commit, kvp_access) */
    KVP_EVENT_REMOVED = 2, /* a block left the index: evicted for reuse, or dropped by reset */
    KVP_EVENT_CLEARED = 3  /* the index is now empty (after kvp_cache_reset) */
};

enum {
    KVP_REMOVED_EVICTED = 1, /* recycled for another request; the engine may overwrite it */
    KVP_REMOVED_RESET = 2,   /* dropped by kvp_cache_reset; the block is now free */
    KVP_REMOVED_REPLACED = 3 /* no longer emitted: in 0.1.0 a block that failed
                                verification handed its key to a newly stored block. Now
                                several blocks may share a key in collision-proof mode and
                                a failing block is never removed (see verify_tokens). The
                                value stays so that existing code compiles. */
};

/* One cache event. The pointer passed to the callback is valid only during the call. */
typedef struct kvp_event {
    int type;            /* KVP_EVENT_* */
    int reason;          /* REMOVED only: KVP_REMOVED_*; 0 otherwise */
    uint32_t block_id;   /* STORED/REMOVED: the physical block; 0 for CLEARED */
    uint32_t n_tokens;   /* STORED: tokens in the block (the block size); 0 otherwise */
    kvp_key key;         /* STORED/REMOVED: the block key; zero for CLEARED */
    kvp_key parent;      /* STORED: the parent block's key, or the namespace root */
    bool parent_is_root; /* STORED: true when parent is the namespace root (first block) */
    uint8_t tier;        /* the tier the event is about: 0 for the device pool; 1 ..
                            KVP_MAX_TIERS - 1 for a lower tier (kvp_cache_add_tier), whose
                            block ids block_id then names and whose medium
                            kvp_cache_tier_medium gives (it sits in the padding after
                            parent_is_root, so kvp_event keeps its size) */
    /* STORED: the block's block_size tokens when the cache knows them (NULL for the _ids
     * forms, which have no tokens); valid during the callback only. */
    const uint32_t *tokens;
} kvp_event;

typedef void (*kvp_event_fn)(void *ud, const kvp_event *ev);

/* Cache parameters; fill with kvp_config_init() first, then set what you need. */
typedef struct kvp_config {
    uint32_t n_blocks;     /* physical KV blocks in the pool; 1 .. 2^30 (no default: 0) */
    uint32_t block_size;   /* tokens per block; 1 .. KVP_MAX_BLOCK_SIZE (default 16) */
    uint64_t seed;         /* xxh3 hash seed (default KVP_DEFAULT_SEED); unused by keyed */
    bool verify_tokens;    /* collision-proof mode: keep tokens, compare on every hit.
                              Several blocks may then share one key: a probe accepts only
                              the candidate whose tokens, parent instance and namespace
                              match, and a block that fails is never removed, replaced or
                              touched (a colliding commit is stored beside it), so no
                              request can observe or disturb another namespace's blocks
                              through a collision (docs/security.md) */
    uint32_t ns_quota;     /* per-namespace quotas on cached blocks: 0 = off (default);
                              else the default quota of every namespace (KVP_QUOTA_UNLIMITED:
                              none by default, set per namespace with kvp_cache_set_quota) */
    kvp_allocator alloc;   /* memory hooks (default: malloc/free) */
    kvp_event_fn on_event; /* optional event callback (default NULL) */
    void *event_ud;        /* passed to on_event */
    int hash_profile;      /* KVP_HASH_* (default KVP_HASH_KEYED) */
    uint8_t hash_key[KVP_HASH_KEY_MAX]; /* keyed, siphash: the secret key's bytes */
    uint32_t hash_key_len;       /* bytes of hash_key used, 16..32; 0 (default): a random key */
    const char *vllm_seed;       /* vllm-*: NONE_HASH seed string (PYTHONHASHSEED or vLLM's
                                    default); NULL: KVP_VLLM_SEED_DEFAULT. Read at creation only */
    uint32_t vocab_size;         /* token ids must be below it (KVP_ETOKEN); 0 = unchecked */
    bool single_threaded;        /* the caller serializes every call: skip the cache's lock
                                    (default false: the cache is thread-safe) */
    uint8_t quota_scope;         /* KVP_QUOTA_SCOPE_*: what one quota counts (default
                                    KVP_QUOTA_SCOPE_NAMESPACE); only with ns_quota != 0. It sits
                                    in the padding after single_threaded */
    int eviction;                /* KVP_EVICT_* (default KVP_EVICT_LRU): which cached block the
                                    pool recycles when no free block is left (docs/design.md) */
    uint32_t slru_protected_pct; /* KVP_EVICT_SLRU: the protected segment's share of the
                                    pool in percent, 0..100 (default 80) */
    uint32_t s3fifo_small_pct;   /* KVP_EVICT_S3FIFO: the small FIFO's share of the pool in
                                    percent, 1..100 (default 10) */
    uint32_t s3fifo_ghost_pct;   /* KVP_EVICT_S3FIFO: keys the ghost FIFO remembers, in
                                    percent of the main FIFO's share, 0..1000 (default 100) */
    uint64_t block_bytes;        /* tiers: bytes of one block's KV, for the bytes-moved
                                    counters of kvp_tier_stats (default 0: those count blocks) */
    uint32_t cdecay_tau;         /* KVP_EVICT_CDECAY: block releases per e-fold of a block's
                                    learned reuse odds in its eviction key, 1..10^9 (0, the
                                    default: 20000) */
    uint32_t cdecay_ghost_pct;   /* KVP_EVICT_CDECAY: evicted keys whose history is kept, in
                                    percent of the pool, 1..10000 (0, the default: 1600) */
    bool count_orphans;          /* count cached blocks whose parent block is not indexed in
                                    kvp_stats.n_blocks_orphaned (default false: 0 is reported).
                                    Costs 24 bytes per block, a write per released block and a
                                    walk of the pool in kvp_cache_stats */
} kvp_config;

/* kvp_config.eviction: the eviction policies. Free blocks are always used first, pinned
 * blocks are never evicted, and per-namespace quotas hold under each. */
enum {
    KVP_EVICT_LRU = 0,    /* least recently released first (the default) */
    KVP_EVICT_SLRU = 1,   /* segmented LRU: probation and protected segments */
    KVP_EVICT_S3FIFO = 2, /* S3-FIFO (Yang et al., SOSP'23): small, main and ghost FIFOs */
    KVP_EVICT_CDECAY = 3  /* chain-closed decay: learned reuse odds per class of touch, decayed
                             by age, a parent kept at least as long as the child it was
                             released with (docs/design.md, "Eviction policies") */
};

/* kvp_config.ns_quota / kvp_cache_set_quota: no limit on a scope's cached blocks. */
#define KVP_QUOTA_UNLIMITED UINT32_MAX

/* Quota scopes (kvp_config.quota_scope): which namespaces share one quota. A scope's key is
 * the namespace root (under the cache's hash profile and key) of the namespace with every
 * field outside the scope made absent, so a field outside the scope cannot change which
 * quota a request counts against (docs/security.md section 5). */
enum {
    KVP_QUOTA_SCOPE_NAMESPACE = 0, /* default: each full namespace (model, adapter, tenant,
                                      salt) has its own quota. A requester that chooses its
                                      salt or adapter gets a new quota with each value, so
                                      this does not isolate tenants that choose them */
    KVP_QUOTA_SCOPE_TENANT = 1,    /* one quota per tenant field, across every model, adapter
                                      and salt it is used with (namespaces with no tenant
                                      share one quota). For tenants that may choose salts,
                                      adapters or models: the tenant field must come from the
                                      server's authentication, never from the request */
    KVP_QUOTA_SCOPE_MODEL = 2      /* one quota per model field, shared by every tenant,
                                      adapter and salt of that model: capacity split between
                                      models (a router's cache), not isolation of tenants */
};

/* Fill *cfg with the defaults above. Cannot fail (does nothing if cfg is NULL). */
KVP_EXPORT void kvp_config_init(kvp_config *cfg);

typedef struct kvp_cache kvp_cache;

/* Create a cache. On KVP_OK, *out is a new cache owned by the caller (kvp_cache_free).
 * Returns KVP_EINVAL (NULL pointer, n_blocks or block_size out of range, quota_scope not a
 * KVP_QUOTA_SCOPE_*, or not KVP_QUOTA_SCOPE_NAMESPACE while ns_quota is 0), KVP_ENOMEM. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_new(const kvp_config *cfg, kvp_cache **out);

/* Free a cache and everything it owns, active requests included. Accepts NULL. Emits no
 * events. */
KVP_EXPORT void kvp_cache_free(kvp_cache *cache);

/* ---------------------------------------------------------------------------------------- */
/* Lookups and the request lifecycle                                                        */
/* ---------------------------------------------------------------------------------------- */

/* The result of matching a prompt against the cache. */
typedef struct kvp_match {
    uint64_t n_tokens;        /* prompt tokens given */
    uint32_t n_blocks_full;   /* full blocks in the prompt: n_tokens / block_size */
    uint32_t n_blocks_cached; /* longest run of cached blocks from the start */
    uint32_t n_blocks_hit;    /* blocks the engine may reuse: n_blocks_cached, capped so at
                                 least one prompt token is computed (see kvp_lookup) */
    uint64_t n_tokens_hit;    /* prefill tokens skipped: n_blocks_hit * block_size */
    uint32_t n_blocks_stored; /* kvp_access*: full prompt blocks this call newly cached
                                 (fewer than n_blocks_full - n_blocks_cached when the pool is
                                 pinned full or the prompt is longer than the pool); 0 for
                                 lookups and acquires */
} kvp_match;

/* Find the longest reusable prefix of tokens[0 .. n_tokens) in namespace ns. Hashes lazily:
 * keys are computed in batches ahead of their probes, never more than about twice the
 * cached run (a miss at the first block hashes one block). Writes the ids of the n_blocks_hit
 * reused blocks, in order, to block_ids[0 .. min(n_blocks_hit, cap)) (block_ids may be NULL when
 * cap is 0).
 *
 * At least one prompt token is always computed: the engine needs a forward pass over the
 * last prompt token to produce the first output token, and a cached full block cannot be
 * partially recomputed in place. So only blocks inside the first n_tokens - 1 tokens count:
 * n_blocks_hit = min(n_blocks_cached, (n_tokens - 1) / block_size). A prompt whose length
 * is a multiple of the block size and that is fully cached therefore reuses one block less.
 *
 * Read-only on the cache contents and LRU order; only the n_lookups counter (and, with
 * verify_tokens, n_verify_rejects) changes. The ids are a snapshot: a later mutating call may evict
 * them unless kvp_acquire pins them. Returns KVP_OK (also on a miss), KVP_EINVAL (NULL pointer,
 * n_tokens == 0), KVP_EOVERFLOW (2^32 - 1 or more full blocks), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_lookup(kvp_cache *cache, const kvp_namespace *ns,
                                        const uint32_t *tokens, size_t n_tokens,
                                        uint32_t *block_ids, size_t cap, kvp_match *out);

/* Start request req_id (any caller-chosen id not currently active): match the prompt like
 * kvp_lookup, pin the n_blocks_hit reused blocks, and allocate fresh blocks so the request
 * holds ceil(max(n_tokens, n_capacity) / block_size) blocks (n_capacity may be 0: prompt
 * only). Fresh blocks come from never-used/free blocks first, then from the least recently
 * used cached block (each eviction emits KVP_EVENT_REMOVED with KVP_REMOVED_EVICTED).
 * The first n_blocks_hit blocks of the request are already committed.
 * Returns KVP_OK; KVP_EINVAL, KVP_EOVERFLOW as kvp_lookup; KVP_EEXIST (req_id active);
 * KVP_ETOOBIG (the request needs more blocks than the pool has: it can never fit);
 * KVP_ENOSPC (free + evictable blocks are too few now; retry after a release); KVP_ENOMEM;
 * KVP_EBUSY. Nothing changes on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_acquire(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                                         const uint32_t *tokens, size_t n_tokens, size_t n_capacity,
                                         kvp_match *out);

/* Make request req_id hold enough blocks for n_capacity tokens (decode growth). Does nothing
 * if it already does. Returns KVP_OK, KVP_EINVAL (NULL cache), KVP_ENOENT, KVP_EOVERFLOW,
 * KVP_ETOOBIG (more blocks than the pool has), KVP_ENOSPC, KVP_ENOMEM (the request and the
 * cache unchanged on failure), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_grow(kvp_cache *cache, uint64_t req_id, size_t n_capacity);

/* The request's block table: *ids points at its n block ids in token order. The array is
 * owned by the cache and valid until the next kvp_grow or kvp_release of the same request
 * (from any thread), or kvp_cache_free; calls for other requests do not move it. Its
 * contents do not change while it is valid.
 * Returns KVP_OK, KVP_EINVAL (NULL pointer), KVP_ENOENT, KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_request_blocks(const kvp_cache *cache, uint64_t req_id,
                                                const uint32_t **ids, size_t *n);

/* Register the request's newly full blocks. tokens[0 .. n_tokens) is the request's whole
 * sequence so far (prompt, then generated tokens) and must begin with the tokens given to
 * kvp_acquire (or with their first n_tokens, for a prefill committed in chunks): the cache
 * keeps a 64-bit fingerprint of each prompt block not yet committed and compares it, so a
 * mismatch is KVP_EINVAL and stores nothing (an engine mistake slips through with odds of
 * about 2^-32 per block at worst; src/blockhash.h). Blocks already committed are not hashed
 * again. Each new
 * full block gets its key; if no cached block holds that key it is indexed
 * (KVP_EVENT_STORED); if one does, the key stays with the existing block and this block is
 * a private duplicate that returns to the free pool on release (counted in
 * n_blocks_deduped, not n_blocks_stored). With verify_tokens, "holds that key" means a block
 * under the key that verifies (same tokens, same parent instance, or same namespace for a
 * first block); blocks under the key that do not verify are left alone and this block is
 * indexed beside them. *n_stored (may be NULL) receives the number of blocks newly indexed.
 * Returns KVP_OK, KVP_EINVAL (NULL pointer, n_tokens shorter than already committed, tokens
 * that do not begin with the acquired prompt), KVP_ENOENT, KVP_ERANGE (n_tokens / block_size
 * exceeds the blocks held), KVP_EBUSY. Nothing changes on failure. For tokens that do not
 * begin with the prompt, kvp_errmsg() names the first prompt block not yet committed whose
 * fingerprint differs, as "tokens[a..b) differ from the acquired prompt" (a = k * block_size;
 * b = a + block_size, or the prompt's end for its partial last block): some token in that
 * range differs; which one is not known, as only fingerprints are kept. */
KVP_NODISCARD KVP_EXPORT int kvp_commit(kvp_cache *cache, uint64_t req_id, const uint32_t *tokens,
                                        size_t n_tokens, size_t *n_stored);

/* End request req_id: unpin its blocks from the last to the first, so within a chain the
 * tail becomes least recently used and is evicted before its parents. Indexed blocks whose
 * count drops to 0 join the LRU order; others return to the free pool. Cannot fail for an
 * active request. Returns KVP_OK, KVP_ENOENT, KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_release(kvp_cache *cache, uint64_t req_id);

/* Replay/simulation in one call: match tokens like kvp_lookup (*out), then make every full
 * block of the prompt cached, touching them from the last to the first so a parent is
 * always at least as recent as its children. Blocks that do not fit because the pool is
 * full of pinned blocks are not cached; when the prompt has more full blocks than the pool
 * can hold, its first blocks are kept; out->n_blocks_stored says how many were newly
 * cached. Nothing stays pinned. Returns as kvp_lookup, plus KVP_ENOMEM. */
KVP_NODISCARD KVP_EXPORT int kvp_access(kvp_cache *cache, const kvp_namespace *ns,
                                        const uint32_t *tokens, size_t n_tokens, kvp_match *out);

/* kvp_lookup and kvp_access for precomputed block keys (see kvp_external_key): ids[i] names
 * the whole prefix up to block i; each is scoped by the namespace before use. n_tokens is
 * the prompt length the ids cover (used for the at-least-one-token cap; pass
 * n_ids * block_size when unknown), and it must satisfy n_ids == ceil(n_tokens/block_size)
 * or n_ids == n_tokens / block_size (a trailing partial block's id is never cached).
 * Collision-proof mode cannot verify external ids (there are no tokens): these calls return
 * KVP_EINVAL on a cache with verify_tokens. Otherwise return as kvp_lookup / kvp_access. */
KVP_NODISCARD KVP_EXPORT int kvp_lookup_ids(kvp_cache *cache, const kvp_namespace *ns,
                                            const kvp_key *ids, size_t n_ids, size_t n_tokens,
                                            uint32_t *block_ids, size_t cap, kvp_match *out);
KVP_NODISCARD KVP_EXPORT int kvp_access_ids(kvp_cache *cache, const kvp_namespace *ns,
                                            const kvp_key *ids, size_t n_ids, size_t n_tokens,
                                            kvp_match *out);

/* Recovery, e.g. for a frontend restarting its scheduler. kvp_cache_requests writes the
 * ids of up to cap active requests (in no particular order) to ids[] and their total number
 * to *n_active (ids may be NULL when cap is 0: ask for the count first). kvp_release_all
 * releases every active request, as kvp_release would (blocks already committed stay
 * cached; requests are released in no particular order, so their blocks enter the LRU order
 * in that order), and stores how many it released in *n_released (may be NULL). Neither
 * frees the cache. Return KVP_OK, KVP_EINVAL (NULL pointer), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_requests(const kvp_cache *cache, uint64_t *ids, size_t cap,
                                                size_t *n_active);
KVP_NODISCARD KVP_EXPORT int kvp_release_all(kvp_cache *cache, size_t *n_released);

/* Hashing outside the lock. kvp_cache_keys computes, without taking the cache's lock,
 * the namespace root of ns and the keys of the full blocks of tokens[0 .. n_tokens) exactly
 * as the cache would (its seed and block size): min(n_tokens / block_size, cap) keys in
 * keys[], their count in *n_keys. Returns KVP_OK, KVP_EINVAL (NULL pointer, invalid ns),
 * KVP_EBUSY (inside the cache's callback).
 *
 * The *_keys forms then do what kvp_lookup, kvp_acquire, kvp_commit and kvp_access do with
 * those keys instead of hashing under the lock. keys[i] must be the key of full block i
 * (all n_tokens / block_size of them; kvp_commit_keys may take keys == NULL to hash here)
 * computed by kvp_cache_keys for the same cache and ns, and root the root it returned: the
 * cache cannot tell other keys from these, and wrong keys make wrong matches (except in
 * collision-proof mode, where tokens are verified: there tokens is required; elsewhere
 * only kvp_commit_keys reads it). Returns as the token forms. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_keys(const kvp_cache *cache, const kvp_namespace *ns,
                                            const uint32_t *tokens, size_t n_tokens, kvp_key *root,
                                            kvp_key *keys, size_t cap, size_t *n_keys);
KVP_NODISCARD KVP_EXPORT int kvp_lookup_keys(kvp_cache *cache, const kvp_namespace *ns,
                                             kvp_key root, const kvp_key *keys,
                                             const uint32_t *tokens, size_t n_tokens,
                                             uint32_t *block_ids, size_t cap, kvp_match *out);
KVP_NODISCARD KVP_EXPORT int kvp_acquire_keys(kvp_cache *cache, uint64_t req_id,
                                              const kvp_namespace *ns, kvp_key root,
                                              const kvp_key *keys, const uint32_t *tokens,
                                              size_t n_tokens, size_t n_capacity, kvp_match *out);
KVP_NODISCARD KVP_EXPORT int kvp_commit_keys(kvp_cache *cache, uint64_t req_id, const kvp_key *keys,
                                             const uint32_t *tokens, size_t n_tokens,
                                             size_t *n_stored);
KVP_NODISCARD KVP_EXPORT int kvp_access_keys(kvp_cache *cache, const kvp_namespace *ns,
                                             kvp_key root, const kvp_key *keys,
                                             const uint32_t *tokens, size_t n_tokens,
                                             kvp_match *out);

/* Drop every cached block that no request pins: each emits KVP_EVENT_REMOVED with
 * KVP_REMOVED_RESET, and KVP_EVENT_CLEARED follows if the index is then empty. Pinned blocks
 * stay cached. Returns KVP_OK, KVP_EINVAL (NULL), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_reset(kvp_cache *cache);

/* ---------------------------------------------------------------------------------------- */
/* Statistics and checks                                                                    */
/* ---------------------------------------------------------------------------------------- */

/* Counters since creation. Hit counters count requests (kvp_acquire, kvp_access and their
 * _ids forms); kvp_lookup only counts n_lookups, so a lookup followed by an acquire is not
 * counted twice. */
typedef struct kvp_stats {
    uint64_t n_requests;        /* kvp_acquire + kvp_access calls that succeeded */
    uint64_t n_lookups;         /* kvp_lookup + kvp_lookup_ids calls that succeeded */
    uint64_t n_tokens_queried;  /* prompt tokens of those requests */
    uint64_t n_tokens_hit;      /* prefill tokens skipped (sum of n_tokens_hit) */
    uint64_t n_blocks_hit;      /* reused blocks (sum of n_blocks_hit) */
    uint64_t n_blocks_missed;   /* full prompt blocks not reused */
    uint64_t n_blocks_stored;   /* blocks newly indexed */
    uint64_t n_blocks_deduped;  /* committed blocks whose key was already indexed */
    uint64_t n_evictions;       /* cached blocks recycled for new data */
    uint64_t n_verify_rejects;  /* collision-proof mode: probes of an indexed key under which
                                   no block verified (a hash collision, or a block whose
                                   recorded parent was evicted since), counted by each call
                                   that meets one: a lookup, acquire and commit of one
                                   prompt may each count. Operator-level: it counts other
                                   namespaces' blocks met, so do not show it to tenants */
    uint32_t n_blocks_total;    /* pool size */
    uint32_t n_blocks_free;     /* never used, or holding nothing reusable */
    uint32_t n_blocks_cached;   /* indexed and unpinned: evictable (kvp_config.eviction) */
    uint32_t n_blocks_in_use;   /* pinned by at least one request */
    uint32_t n_requests_active; /* requests between kvp_acquire and kvp_release */
    uint32_t n_blocks_orphaned; /* cached blocks whose parent block (the one before it in the
                                   chain it was last released with) is no longer indexed: no
                                   lookup can reach them until the parent is stored again.
                                   Counted only with kvp_config.count_orphans (else 0), by a
                                   walk of the pool in each kvp_cache_stats call */
} kvp_stats;

/* Quotas (capacity isolation; needs kvp_config.ns_quota != 0). Every namespace belongs to
 * one quota scope (kvp_config.quota_scope: the full namespace, its tenant, or its model),
 * and a scope never holds more than its quota of cached (indexed, unpinned) blocks: when a
 * release would take it over, the scope's own least recently used cached block is evicted
 * at once (KVP_EVENT_REMOVED, KVP_REMOVED_EVICTED), before any other scope's block. Blocks
 * pinned by requests are not counted. If the quotas of all scopes plus the blocks pinned
 * at any one time fit in the pool, no scope's cached blocks ever depend on another scope's
 * requests (no eviction lever, no prime+probe across scopes; see docs/security.md section 5
 * for the guarantee with its conditions, and for what remains, e.g. timing). Under
 * KVP_QUOTA_SCOPE_NAMESPACE a tenant that chooses its cache salt makes as many scopes as it
 * likes, so the pool cannot be sized for them: isolate such tenants with
 * KVP_QUOTA_SCOPE_TENANT. Scopes are told apart by their full 128-bit scope key.
 *
 * Set the quota of ns's scope to max_cached_blocks (0: cache nothing; KVP_QUOTA_UNLIMITED:
 * no limit), overriding ns_quota for the cache's lifetime; the fields of ns outside the
 * scope are ignored (under KVP_QUOTA_SCOPE_TENANT, ns = {tenant "t"} and ns = {model "m",
 * tenant "t", salt "s"} set the same quota). If the scope holds more, its least recently
 * used cached blocks are evicted now. Returns KVP_OK, KVP_EINVAL (NULL cache, invalid ns,
 * quotas off), KVP_ENOMEM (nothing changed), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_set_quota(kvp_cache *cache, const kvp_namespace *ns,
                                                 uint32_t max_cached_blocks);

/* Copy the counters to *out. Returns KVP_OK, KVP_EINVAL (NULL pointer), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_stats(const kvp_cache *cache, kvp_stats *out);

/* Walk the whole cache and check every invariant (index, pool, LRU ring or the eviction
 * policy's lists, free list, reference counts, requests, interned namespaces, lower tiers and
 * their orders). Returns KVP_OK,
 * KVP_ECORRUPT, KVP_EBUSY, KVP_EINVAL (NULL), or KVP_ENOMEM (its scratch array, taken with malloc,
 * not the cache's hooks). O(n_blocks + blocks held by requests). For tests, fuzzers and paranoid
 * deployments. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_check(const kvp_cache *cache);

/* ---------------------------------------------------------------------------------------- */
/* Prometheus metrics                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* One label the caller adds to every sample, e.g. {"model", "llama-3.1-8b"}. Both strings
 * are NUL-terminated and only read during the call. The name must match
 * [a-zA-Z_][a-zA-Z0-9_]*, must not begin with "__" (reserved by Prometheus) and must not be
 * "state" (used by kvprefix_blocks); the value is any UTF-8 text and is escaped (\\, \", \n)
 * as the text format requires. */
typedef struct kvp_label {
    const char *name;  /* label name */
    const char *value; /* label value, UTF-8 */
} kvp_label;

/* A cache with lower tiers (kvp_cache_add_tier) also writes the kvprefix_tier_* families,
 * one sample per lower tier labelled medium="CPU" etc.; there "medium" is a reserved label
 * name too (KVP_EINVAL). */
/* Write the cache's counters and gauges in the Prometheus text exposition format 0.0.4
 * (# HELP and # TYPE lines, counters ending in _total) to buf, NUL-terminated, with
 * labels[0 .. n_labels) on every sample (labels may be NULL when n_labels is 0). Names
 * follow vLLM's where the meaning matches; docs/python.md lists them all. Takes one
 * kvp_cache_stats snapshot, so the figures are consistent with each other.
 *
 * Returns KVP_OK with *n_out = the text length (without the NUL); KVP_ENOSPC when cap bytes
 * do not hold text and NUL: *n_out = the capacity needed (length + 1) and buf holds a
 * truncated, NUL-terminated prefix (call again with that size; buf may be NULL when cap is 0);
 * KVP_EINVAL (NULL cache or n_out, NULL label name or value, invalid or duplicate label name, value
 * not UTF-8), with buf and *n_out untouched; KVP_EBUSY. Never changes the cache. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_metrics(const kvp_cache *cache, const kvp_label *labels,
                                               size_t n_labels, char *buf, size_t cap,
                                               size_t *n_out);

/* ---------------------------------------------------------------------------------------- */
/* Retention priorities (docs/design.md, "Retention priorities")                            */
/* ---------------------------------------------------------------------------------------- */

/* A request, or token ranges of it (a system prompt), may carry a retention priority from
 * 0 to 100, as TensorRT-LLM's KvCacheRetentionConfig does: when the pool must evict, cached
 * blocks of lower priority go first. Blocks no request set have the default priority 35 and
 * stay in the eviction policy's own order (kvp_config.eviction); the others wait in one
 * queue per priority, oldest release first. Eviction takes the lowest non-empty queue below
 * 35, then the policy's victim, then the lowest non-empty queue above 35; so priority 0
 * blocks go before any default block, priority 100 blocks after every other one.
 *
 * A block's priority is set when a request that carries retention releases it (kvp_release,
 * or the end of kvp_access_retained): each full block gets the highest priority among the
 * request's ranges that cover all its tokens, or the request's own priority when no range
 * covers it (a block a range covers only in part holds tokens outside the range, e.g. the
 * first user tokens after a system prompt, so it gets the request's priority). When several
 * requests set one block, the highest priority wins (a later, lower setting is ignored
 * while the higher one lasts), ties keeping the later expiry. Requests without retention
 * leave blocks as they are. A block that leaves the index loses its priority.
 *
 * A duration makes a priority lapse: duration d, set when the cache's retention clock reads
 * t, lapses at t + d, and the block then counts as never set (default priority; it joins the
 * policy's order as if just released, the first time an eviction looks). The retention
 * clock counts requests: it is kvp_stats.n_requests (every kvp_acquire and kvp_access that
 * succeeded; a request's own release reads the clock after it counted, kvp_access_retained's
 * before), so replays are reproducible.
 * Duration 0 never lapses. (TensorRT-LLM counts durations in wall-clock milliseconds.)
 *
 * Quotas keep holding: a scope over its quota evicts its own lowest-priority cached block,
 * the least recently released first among equals.
 *
 * A cache whose requests never carry retention behaves exactly as without this feature. */
#define KVP_RETENTION_PRIORITY_MIN     0u   /* evicted first */
#define KVP_RETENTION_PRIORITY_DEFAULT 35u  /* blocks no request set (TensorRT-LLM's default) */
#define KVP_RETENTION_PRIORITY_MAX     100u /* evicted last */
#define KVP_RETENTION_MAX_RANGES       64u  /* most ranges one kvp_retention may carry */

/* Tokens token_start .. token_end - 1 of the prompt at priority, lapsing after duration
 * requests (0: never). */
typedef struct kvp_retention_range {
    uint64_t token_start; /* first token of the range */
    uint64_t token_end;   /* one past its last token; token_start < token_end <= prompt length */
    uint32_t priority;    /* 0 .. KVP_RETENTION_PRIORITY_MAX */
    uint64_t duration;    /* retention-clock ticks (requests) until it lapses; 0: never */
} kvp_retention_range;

/* What one request asks for: its own priority and duration (for every block no range
 * covers, generated tokens included) and up to KVP_RETENTION_MAX_RANGES ranges of its
 * prompt. The ranges are the caller's, read only during the call that takes them. */
typedef struct kvp_retention {
    uint32_t priority;                 /* default KVP_RETENTION_PRIORITY_DEFAULT */
    uint64_t duration;                 /* default 0: never lapses */
    const kvp_retention_range *ranges; /* n_ranges entries, or NULL when n_ranges is 0 */
    size_t n_ranges;                   /* default 0 */
} kvp_retention;

/* Fill *r with the defaults above (priority 35, no duration, no range). Cannot fail (does
 * nothing if r is NULL). */
KVP_EXPORT void kvp_retention_init(kvp_retention *r);

/* Give active request req_id the retention *r (replacing what an earlier call gave it); it
 * takes effect when the request is released. Ranges refer to the prompt given to
 * kvp_acquire. Returns KVP_OK; KVP_EINVAL (NULL pointer, a priority above 100, more than
 * KVP_RETENTION_MAX_RANGES ranges, ranges NULL with n_ranges > 0, an empty range or one
 * that ends past the prompt; kvp_errmsg names it); KVP_ENOENT; KVP_ENOMEM (the first use
 * allocates about 37 bytes per pool block); KVP_EBUSY. Nothing changes on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_request_set_retention(kvp_cache *cache, uint64_t req_id,
                                                       const kvp_retention *r);

/* kvp_access and kvp_access_ids whose request carries retention *r (ranges refer to the
 * prompt's n_tokens). Return as those, plus the KVP_EINVAL cases of
 * kvp_request_set_retention. */
KVP_NODISCARD KVP_EXPORT int kvp_access_retained(kvp_cache *cache, const kvp_namespace *ns,
                                                 const uint32_t *tokens, size_t n_tokens,
                                                 const kvp_retention *r, kvp_match *out);
KVP_NODISCARD KVP_EXPORT int kvp_access_ids_retained(kvp_cache *cache, const kvp_namespace *ns,
                                                     const kvp_key *ids, size_t n_ids,
                                                     size_t n_tokens, const kvp_retention *r,
                                                     kvp_match *out);

/* The effective retention priority of block block_id now: its set priority while it lasts,
 * else KVP_RETENTION_PRIORITY_DEFAULT (also for free and never-set blocks). For tests and
 * tools. Returns KVP_OK, KVP_EINVAL (NULL pointer, block_id outside the pool), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_block_retention(const kvp_cache *cache, uint32_t block_id,
                                                 int *priority);
/* Tiers: host memory, local disk, remote store (docs/design.md, "Tiers")                   */
/* ---------------------------------------------------------------------------------------- */

/* A cache may have up to KVP_MAX_TIERS tiers: tier 0 is the device pool above, tiers 1 ..
 * KVP_MAX_TIERS - 1 are lower tiers the engine adds (host memory, then disk, then a remote
 * store: lower numbers are tried first). Each lower tier has its own block ids (0 ..
 * n_blocks - 1 of that tier), its own capacity and eviction policy, and a medium name
 * (vLLM's "CPU", "DISK", ...). The engine owns the memory of every tier and moves the
 * bytes; the cache says what to move, where, and when a copy may be relied on.
 *
 * Write policy: write-through. When kvp_commit indexes a block in tier 0, the cache issues
 * one store order per lower tier that does not hold the block's key yet (device block ->
 * a block of that tier, evicting the block that tier's policy picks if needed). Tiers
 * are therefore inclusive only loosely: a block is written to every tier as it is
 * committed, but each tier evicts on its own, so a lower tier may hold blocks the device
 * pool has evicted (that is the point) and the device pool may hold blocks a lower tier
 * dropped. kvp_access does not feed the lower tiers.
 *
 * Order life cycle. A store order pins its device block (it is not evicted or reused) and
 * reserves its tier block, which is *pending*: invisible to lookups. kvp_tier_orders hands
 * store orders out, oldest first, once each; the engine copies and calls kvp_tier_confirm
 * with ok = true, and only then is the block hit-able (KVP_EVENT_STORED with the tier's
 * medium); ok = false (the copy failed or was cancelled) frees the tier block and changes
 * nothing else. Either way the device block is unpinned. kvp_acquire_tiers returns load
 * orders (tier block -> one of the request's fresh device blocks) for the blocks after the
 * device hit that a lower tier holds; each pins its tier block until confirmed. A loaded
 * block is, for the cache, like a computed one: once the load is confirmed the engine
 * commits it with kvp_commit as after prefill (a failed load: the engine computes the
 * block instead). Every order handed out must be confirmed exactly once (ok or not), also
 * after its request was released: until then its blocks stay pinned.
 *
 * Threads: every tier call takes the cache's lock like the other calls (kvp_lookup_tiers
 * and kvp_cache_tier_stats shared, the rest exclusive). Tiers need a cache without
 * verify_tokens (a lower tier keeps keys, not tokens: KVP_ENOTSUP). */

#define KVP_MAX_TIERS       4u  /* tier 0 (the device pool) and up to three lower tiers */
#define KVP_TIER_MEDIUM_MAX 31u /* longest medium name, in bytes */

/* kvp_tier_order.kind */
enum {
    KVP_ORDER_LOAD = 1, /* copy tier block -> device block (from kvp_acquire_tiers) */
    KVP_ORDER_STORE = 2 /* copy device block -> tier block (from kvp_tier_orders) */
};

/* A lower tier's parameters; fill with kvp_tier_config_init() first. */
typedef struct kvp_tier_config {
    const char *medium; /* its name as events carry it, 1 .. KVP_TIER_MEDIUM_MAX bytes of
                           [A-Za-z0-9_.-] (default "CPU"); copied by kvp_cache_add_tier */
    uint32_t n_blocks;  /* its capacity in blocks, 1 .. 2^31 (no default: 0) */
    int eviction;       /* KVP_EVICT_* (default KVP_EVICT_LRU): the tier's own policy, which
                           READY block a new store replaces; any of the device pool's */
    uint32_t slru_protected_pct; /* the policy's parameters for this tier, with kvp_config's */
    uint32_t s3fifo_small_pct;   /*   meanings, ranges and defaults (80, 10, 100, 0, 0); a */
    uint32_t s3fifo_ghost_pct;   /*   tier's policy is its own: it does not read the cache's */
    uint32_t cdecay_tau;
    uint32_t cdecay_ghost_pct;
} kvp_tier_config;

/* Fill *tc with the defaults above. Cannot fail (does nothing if tc is NULL). */
KVP_EXPORT void kvp_tier_config_init(kvp_tier_config *tc);

/* Add a lower tier below the existing ones; *tier (may be NULL) receives its number (1 for
 * the first). The tier starts empty. Its eviction policy sees the tier's own history: a
 * confirmed store is a block's first release, a load order's pin a hit (counted when the
 * order is issued, as a device hit is counted when the lookup pins it), the load's
 * confirmation (ok or failed) the release; a block is released alone (CDECAY: a chain of
 * one, so no chain closure across a tier's blocks). Returns KVP_OK, KVP_EINVAL (NULL cache
 * or tc, bad medium, n_blocks 0 or above 2^31, a medium already used, an unknown policy or a
 * parameter out of range, requests active: add tiers before the first kvp_acquire),
 * KVP_ENOTSUP (a verify_tokens cache), KVP_ENOSPC (already KVP_MAX_TIERS tiers), KVP_ENOMEM,
 * KVP_EBUSY. Nothing changes on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_add_tier(kvp_cache *cache, const kvp_tier_config *tc,
                                                int *tier);

/* One copy the engine must make. A plain value, owned by the caller once written. */
typedef struct kvp_tier_order {
    uint64_t id;           /* pass to kvp_tier_confirm; never 0, never reused while live */
    uint64_t req_id;       /* LOAD: the acquiring request; STORE: the committing request */
    kvp_key key;           /* the block's key */
    int kind;              /* KVP_ORDER_LOAD or KVP_ORDER_STORE */
    int tier;              /* the lower tier, 1 .. KVP_MAX_TIERS - 1 */
    uint32_t tier_block;   /* block id in that tier: the source (LOAD) or destination */
    uint32_t device_block; /* tier-0 block id: the destination (LOAD) or source (STORE) */
    uint32_t block_index;  /* the block's position in its request's block table */
} kvp_tier_order;

/* kvp_acquire, then load orders for the blocks after the device hit: blocks n_blocks_hit,
 * n_blocks_hit + 1, ... of the prompt, as long as each is held (confirmed) by some lower
 * tier (the lowest-numbered one that holds it) and lies inside the first n_tokens - 1
 * tokens (as kvp_lookup's cap), at most cap of them. loads[0 .. *n_loads) receive them in
 * block order (loads may be NULL when cap is 0: then this is kvp_acquire); load k goes into
 * the request's block n_blocks_hit + k. out is kvp_acquire's (n_blocks_hit counts device
 * hits only). Returns as kvp_acquire, plus KVP_EINVAL (loads NULL with cap > 0, n_loads
 * NULL). Nothing changes on failure. */
KVP_NODISCARD KVP_EXPORT int kvp_acquire_tiers(kvp_cache *cache, uint64_t req_id,
                                               const kvp_namespace *ns, const uint32_t *tokens,
                                               size_t n_tokens, size_t n_capacity, kvp_match *out,
                                               kvp_tier_order *loads, size_t cap, size_t *n_loads);

/* Hand out up to cap store orders not handed out before, oldest first, into out[0 .. *n)
 * (out may be NULL when cap is 0; *n_left, which may be NULL, receives how many remain).
 * Returns KVP_OK, KVP_EINVAL (NULL pointer), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_tier_orders(kvp_cache *cache, kvp_tier_order *out, size_t cap,
                                             size_t *n, size_t *n_left);

/* The engine's answer to an order handed out: ok = true when the copy is complete, false
 * when it failed or was cancelled. STORE ok: the tier block becomes hit-able (STORED event
 * with the tier's medium; its parent is the key before it, or the namespace root); STORE
 * failed: the tier block is freed, as if the order had never been. LOAD ok: the tier block
 * becomes the tier's most recently used (under LRU; another policy is told of the release);
 * LOAD failed: nothing changes under LRU (another policy has counted the pin as a hit when
 * the order was issued and is told of the release). Both unpin what the order pinned. Returns
 * KVP_OK, KVP_ENOENT (no live order has this id: unknown, already confirmed, or a store order not
 * handed out yet), KVP_EINVAL (NULL cache), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_tier_confirm(kvp_cache *cache, uint64_t order_id, bool ok);

/* Where the longest prefix lives, block by block. */
typedef struct kvp_tier_match {
    uint32_t n_blocks_full;                /* full blocks in the prompt */
    uint32_t n_blocks_prefix;              /* longest run from the start found in some tier:
                                              the device run, then blocks a lower tier holds */
    uint32_t n_blocks_usable;              /* n_blocks_prefix capped as kvp_lookup caps hits
                                              (at least one prompt token computed) */
    uint32_t n_blocks_tier[KVP_MAX_TIERS]; /* blocks of the prefix found in each tier */
} kvp_tier_match;

/* Like kvp_lookup, across the tiers: the prefix is the device pool's cached run, then each
 * following block as long as a lower tier holds it confirmed (pending stores do not count).
 * where[i] (i < min(n_blocks_prefix, cap)) receives the tier of block i: 0 for the device
 * run, else the lowest-numbered lower tier that holds it (where may be NULL when cap is 0).
 * Read-only (counts nothing). Returns KVP_OK, KVP_EINVAL (NULL pointer, n_tokens 0, where
 * NULL with cap > 0), KVP_EOVERFLOW, KVP_ENOTSUP, KVP_ETOKEN, KVP_EBUSY. Works on a cache
 * without lower tiers too (then it is kvp_lookup's cached run). */
KVP_NODISCARD KVP_EXPORT int kvp_lookup_tiers(kvp_cache *cache, const kvp_namespace *ns,
                                              const uint32_t *tokens, size_t n_tokens,
                                              uint8_t *where, size_t cap, kvp_tier_match *out);

/* Counters of one tier. Bytes are blocks times kvp_config.block_bytes, or blocks when
 * that is 0. */
typedef struct kvp_tier_stats {
    const char *medium;        /* the tier's medium ("GPU" for tier 0); owned by the cache,
                                  valid until kvp_cache_free */
    uint32_t n_blocks_total;   /* capacity */
    uint32_t n_blocks_ready;   /* confirmed, hit-able blocks (tier 0: indexed blocks) */
    uint32_t n_blocks_pending; /* reserved by store orders not confirmed yet (tier 0: 0) */
    uint32_t n_blocks_loading; /* ready blocks pinned by load orders in flight (tier 0: 0) */
    uint64_t n_hits;           /* blocks found: load orders issued (tier 0: kvp_stats
                                  n_blocks_hit) */
    uint64_t n_loads;          /* load orders confirmed ok */
    uint64_t n_loads_failed;   /* load orders confirmed failed or cancelled */
    uint64_t n_stores;         /* store orders confirmed ok */
    uint64_t n_stores_failed;  /* store orders confirmed failed or cancelled */
    uint64_t n_stores_skipped; /* committed blocks not written to this tier: every block of
                                  it was pending or being loaded */
    uint64_t n_evictions;      /* ready blocks evicted for new stores (tier 0: kvp_stats) */
    uint64_t n_bytes_loaded;   /* moved out of this tier by confirmed loads */
    uint64_t n_bytes_stored;   /* moved into this tier by confirmed stores */
} kvp_tier_stats;

/* The medium name of tier (0: "GPU"), or NULL when the cache has no such tier. Owned by
 * the cache, valid until kvp_cache_free. Unlike the other calls it may be called from
 * inside the cache's own event callback (to name an event's tier; the callback's thread
 * holds the lock already). Cannot fail. */
KVP_EXPORT const char *kvp_cache_tier_medium(const kvp_cache *cache, int tier);

/* The number of tiers, tier 0 included, in *n_tiers, and the counters of tier (0 ..
 * *n_tiers - 1) in *out (out may be NULL to ask the count only). Returns KVP_OK,
 * KVP_EINVAL (NULL cache or n_tiers, tier out of range), KVP_EBUSY. */
KVP_NODISCARD KVP_EXPORT int kvp_cache_tier_stats(const kvp_cache *cache, int tier,
                                                  kvp_tier_stats *out, int *n_tiers);

#ifdef __cplusplus
}
#endif

#endif /* KVPREFIX_H */
