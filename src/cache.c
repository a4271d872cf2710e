/*
 * cache.c - creating, resetting and freeing a cache; statistics. (The public entry points
 * that take the cache's lock, and event emission, are in lock.c.)
 *
 * A cache is one allocation for struct kvp_cache, the pool's block array, the index's
 * bucket array, and in collision-proof mode the token store and provenance table; all are
 * made by kvp_cache_new. The steady state allocates only per request (kvp__request, its
 * block table when kvp_grow outgrows it, and the request table when it grows), when a
 * prompt longer than any before it reaches kvp_access (the scratch arrays), and in
 * collision-proof mode when a namespace is seen for the first time (verify.c).
 * The request lifecycle lives in lifecycle.c; the invariant checker in check.c.
 */
#include <string.h>

#include "internal.h"
#include "tier.h"

KVP_EXPORT void kvp_config_init(kvp_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->n_blocks = 0;
    cfg->block_size = 16;
    cfg->seed = KVP_DEFAULT_SEED;
    cfg->hash_profile = KVP_HASH_KEYED;
    cfg->quota_scope = KVP_QUOTA_SCOPE_NAMESPACE;
    cfg->eviction = KVP_EVICT_LRU;
    cfg->slru_protected_pct = 80;
    cfg->s3fifo_small_pct = 10;
    cfg->s3fifo_ghost_pct = 100;
}

/* Free the cache and all it owns (kvp_cache_free, in lock.c, calls it outside any of the
 * cache's callbacks; kvp_cache_new on a failed creation). Cannot fail. */
void kvp__cache_destroy(kvp_cache *cache)
{
    kvp__request *req, *tmp;
    kvp__mem mem = cache->mem;
    HASH_ITER(hh, cache->requests, req, tmp)
    {
        /* Freed without unpinning: the whole pool goes away below. */
        kvp__request_delete(cache, req);
    }
    if (kvp__verifying(cache))
        kvp__verify_free(cache);
    kvp__quota_free(cache);
    kvp__retention_free(cache);
    kvp__policy_free(&cache->policy);
    kvp__policy_links_free(cache);
    kvp__tiers_free(cache);
    kvp__index_free(&cache->index, &cache->mem);
    kvp__pool_free(cache);
    kvp__mem_free(&cache->mem, cache->scratch_keys, cache->scratch_cap * sizeof(kvp_key));
    kvp__mem_free(&cache->mem, cache->scratch_ids, cache->scratch_cap * sizeof(uint32_t));
    kvp__lock_destroy(cache);
    mem = cache->mem;
    kvp__hasher_wipe(&cache->hasher); /* the key does not outlive the cache */
    kvp__mem_free(&mem, cache, sizeof *cache);
}

/* The body of kvp_cache_new (which reports its failures, see kvp__public). */
static int cache_new(const kvp_config *cfg, kvp_cache **out)
{
    if (!cfg)
        return kvp__fail(KVP_EINVAL, "cfg is NULL");
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    if (cfg->n_blocks == 0)
        return kvp__fail(KVP_EINVAL, "n_blocks must be at least 1");
    if (cfg->n_blocks > KVP__POOL_MAX)
        return kvp__fail(KVP_EINVAL, "n_blocks is %" PRIu32 ", above the largest pool, 2^30",
                         cfg->n_blocks);
    if (cfg->block_size == 0 || cfg->block_size > KVP_MAX_BLOCK_SIZE)
        return kvp__fail(KVP_EINVAL, "block_size is %" PRIu32 ", outside 1..%u", cfg->block_size,
                         KVP_MAX_BLOCK_SIZE);
    if (cfg->quota_scope > KVP_QUOTA_SCOPE_MODEL)
        return kvp__fail(KVP_EINVAL, "quota_scope is %u, not a KVP_QUOTA_SCOPE_*",
                         (unsigned)cfg->quota_scope);
    if (cfg->quota_scope != KVP_QUOTA_SCOPE_NAMESPACE && cfg->ns_quota == 0)
        return kvp__fail(KVP_EINVAL, "quota_scope is %u but quotas are off (ns_quota 0)",
                         (unsigned)cfg->quota_scope);
    kvp__pparams pp;
    kvp__policy_params_of(cfg, &pp);
    int rc0 = kvp__policy_params_check(&pp);
    if (rc0 != KVP_OK)
        return rc0;
    kvp__mem mem;
    kvp__mem_init(&mem, &cfg->alloc);
    kvp_cache *cache = kvp__mem_calloc(&mem, 1, sizeof *cache);
    if (!cache)
        return kvp__fail(KVP_ENOMEM, "out of memory: the cache record (%zu bytes)", sizeof *cache);
    cache->mem = mem;
    cache->cfg = *cfg;
    cache->cfg.vllm_seed = NULL; /* read by kvp__hasher_init only; the caller owns it */
    memset(cache->cfg.hash_key, 0, sizeof cache->cfg.hash_key); /* one copy: the hasher's */
    cache->key_bits = 128;
    int rc = kvp__hasher_init(&cache->hasher, cfg);
    if (rc != KVP_OK) {
        kvp__mem_free(&mem, cache, sizeof *cache); /* not &cache->mem: it is freed here */
        return rc;
    }
    rc = kvp__lock_init(cache);
    if (rc == KVP_OK)
        rc = kvp__pool_init(cache);
    if (rc == KVP_OK)
        rc = kvp__index_init(&cache->index, &cache->mem, cfg->n_blocks);
    if (rc == KVP_OK && cfg->verify_tokens)
        rc = kvp__verify_init(cache);
    if (rc == KVP_OK)
        rc = kvp__quota_init(cache);
    if (rc == KVP_OK)
        rc = kvp__policy_init(&cache->policy, &pp, cfg->n_blocks, &cache->mem,
                              &cache->pool.blocks[0].key, sizeof(kvp__block), &cache->pool.n_lru);
    if (rc == KVP_OK)
        rc = kvp__policy_links_init(cache);
    if (rc != KVP_OK) {
        if (cfg->verify_tokens && cache->verify.meta)
            kvp__verify_free(cache);
        cache->cfg.verify_tokens = false; /* verify_init cleaned up after itself */
        kvp__cache_destroy(cache);
        return rc;
    }
    cache->stats.n_blocks_total = cfg->n_blocks;
    *out = cache;
    return KVP_OK;
}

KVP_EXPORT int kvp_cache_new(const kvp_config *cfg, kvp_cache **out)
{
    return kvp__public(cache_new(cfg, out));
}

int kvp__cache_stats_locked(const kvp_cache *cache, kvp_stats *out)
{
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    *out = cache->stats;
    out->n_lookups = atomic_load_explicit(&cache->n_lookups, memory_order_relaxed);
    out->n_verify_rejects = atomic_load_explicit(&cache->n_verify_rejects, memory_order_relaxed);
    out->n_blocks_total = cache->pool.n_blocks;
    out->n_blocks_free = cache->pool.n_free;
    out->n_blocks_cached = cache->pool.n_lru + cache->pool.n_retained;
    out->n_blocks_in_use = cache->pool.n_in_use;
    out->n_requests_active = HASH_COUNT(cache->requests);
    out->n_blocks_orphaned = kvp__policy_orphans(cache);
    return KVP_OK;
}

/* Drop every cached, unpinned block (least recently used first), then report CLEARED if
 * nothing is indexed any more. */
int kvp__cache_reset_locked(kvp_cache *cache)
{
    kvp__pool_drop_cached(cache, KVP_REMOVED_RESET);
    if (cache->index.n_items == 0) {
        kvp_event ev = {0};
        ev.type = KVP_EVENT_CLEARED;
        kvp__emit(cache, &ev);
    }
    return KVP_OK;
}

int kvp__cache_set_key_bits(kvp_cache *cache, unsigned bits)
{
    if (!cache || bits == 0 || bits > 128 || cache->index.n_items || cache->requests)
        return kvp__fail(KVP_EINVAL, "key bits %u: 1..128, on an empty cache only", bits);
    cache->key_bits = bits;
    return KVP_OK;
}
