/*
 * hashprof.h - the hasher: one hash profile's parameters (docs/hash-profiles.md), shared by
 * a cache (embedded in struct kvp_cache) and by stand-alone kvp_hasher objects.
 *
 * A chain value is (key, high): key is the 128-bit index key, high the upper 128 bits of a
 * 256-bit digest (vllm-sha256-cbor only, zero otherwise). The index keys on `key` alone; the
 * chain hashes the full digest. Requests keep one chain value (32 bytes); cached blocks keep
 * only their 128-bit key, so the wide profile costs nothing per cached block.
 *
 * vLLM profiles also need the namespace's extra keys at every block (LoRA name) and at
 * block 0 (cache_salt): a kvp__vctx points at those bytes (in the caller's namespace, or in
 * the copy a request keeps).
 */
#ifndef KVP_HASHPROF_H
#define KVP_HASHPROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix.h"

#define KVP__SECRET_BYTES 192 /* XXH3 custom secret of the keyed profile */

struct kvp_hasher {
    unsigned char secret[KVP__SECRET_BYTES]; /* keyed: XXH3 secret = BLAKE2b(key, tag || i) */
    unsigned char key[KVP_HASH_KEY_MAX];     /* keyed, siphash: the master key */
    unsigned char sip_key[16];               /* siphash: block PRF key, BLAKE2b-derived */
    kvp_key none_key;                        /* vllm-*: NONE_HASH as a chain value (key) */
    kvp_key none_high;                       /* vllm-sha256: NONE_HASH's high half */
    uint64_t seed;                           /* xxh3 (and vllm scope roots): XXH3 seed */
    int profile;                             /* KVP_HASH_* */
    uint32_t key_len;                        /* bytes of key in use (16..32) */
    uint32_t block_size;                     /* tokens per block */
    uint32_t vocab_size;                     /* ids must be below it; 0 = unchecked */
    kvp_allocator alloc;                     /* stand-alone hashers: how to free this */
};

/* vLLM extra keys of a namespace: the LoRA name (every block) and cache_salt (block 0). */
typedef struct kvp__vctx {
    const unsigned char *adapter; /* LoRA name bytes; valid when has_adapter */
    const unsigned char *salt;    /* cache_salt bytes; valid when has_salt */
    size_t adapter_len;           /* bytes at adapter */
    size_t salt_len;              /* bytes at salt */
    bool has_adapter;             /* the namespace has an adapter */
    bool has_salt;                /* the namespace has a (non-empty) salt */
} kvp__vctx;

/* Fill h from cfg's hash fields. KVP_OK, KVP_EINVAL, KVP_ENOTSUP (no random source). */
int kvp__hasher_init(kvp_hasher *h, const kvp_config *cfg);

/* KVP_OK if the profile can express ns (kvp__ns_valid already passed), else KVP_ENOTSUP. */
int kvp__hasher_ns_check(const kvp_hasher *h, const kvp_namespace *ns);

/* KVP_OK, or KVP_ETOKEN when a token id is >= vocab_size. */
int kvp__hasher_tokens_check(const kvp_hasher *h, const uint32_t *tokens, size_t n);

/* The namespace root (scope key) of a namespace ns_check accepted. Cannot fail. */
kvp_key kvp__hasher_root(const kvp_hasher *h, const kvp_namespace *ns);

/* The chain value before block 0: the root, or vLLM's NONE_HASH. Cannot fail. */
void kvp__hasher_start(const kvp_hasher *h, kvp_key root, kvp_key *key, kvp_key *high);

/* The vLLM extra keys of ns (pointers into ns). Cannot fail. */
kvp__vctx kvp__hasher_vctx(const kvp_namespace *ns);

/* Advance the chain value (*key, *high) over block `index` (tokens[0 .. block_size)).
 * Any profile and block size; the cache inlines the 16-token xxh3/keyed cases instead.
 * Cannot fail. */
void kvp__hasher_next(const kvp_hasher *h, const kvp__vctx *vx, kvp_key *key, kvp_key *high,
                      const uint32_t *tokens, uint64_t index);

/* The scoped key of an external id. Cannot fail. */
kvp_key kvp__hasher_external(const kvp_hasher *h, kvp_key root, kvp_key id);

/* Zero the hasher, key material included (memory being freed). Cannot fail. */
void kvp__hasher_wipe(kvp_hasher *h);

/* Every field consistent with its profile? KVP_OK or KVP_ECORRUPT. */
int kvp__hasher_check(const kvp_hasher *h);

#endif /* KVP_HASHPROF_H */
