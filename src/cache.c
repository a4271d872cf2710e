/*
 * cache.c - creating, resetting and freeing a cache; statistics; events.
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

KVP_EXPORT void kvp_config_init(kvp_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->n_blocks = 0;
    cfg->block_size = 16;
    cfg->seed = KVP_DEFAULT_SEED;
}

void kvp__emit(kvp_cache *cache, const kvp_event *ev)
{
    if (!cache->cfg.on_event)
        return;
    cache->in_callback = true;
    cache->cfg.on_event(cache->cfg.event_ud, ev);
    cache->in_callback = false;
}

static void cache_destroy(kvp_cache *cache)
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
    kvp__index_free(&cache->index, &cache->mem);
    kvp__pool_free(cache);
    kvp__mem_free(&cache->mem, cache->scratch_keys, cache->scratch_cap * sizeof(kvp_key));
    kvp__mem_free(&cache->mem, cache->scratch_ids, cache->scratch_cap * sizeof(uint32_t));
    mem = cache->mem;
    kvp__mem_free(&mem, cache, sizeof *cache);
}

KVP_EXPORT int kvp_cache_new(const kvp_config *cfg, kvp_cache **out)
{
    if (!cfg || !out || cfg->n_blocks == 0 || cfg->n_blocks > (UINT32_C(1) << 31) ||
        cfg->block_size == 0 || cfg->block_size > KVP_MAX_BLOCK_SIZE)
        return KVP_EINVAL;
    kvp__mem mem;
    kvp__mem_init(&mem, &cfg->alloc);
    kvp_cache *cache = kvp__mem_calloc(&mem, 1, sizeof *cache);
    if (!cache)
        return KVP_ENOMEM;
    cache->mem = mem;
    cache->cfg = *cfg;
    cache->key_bits = 128;
    int rc = kvp__pool_init(cache);
    if (rc == KVP_OK)
        rc = kvp__index_init(&cache->index, &cache->mem, cfg->n_blocks);
    if (rc == KVP_OK && cfg->verify_tokens)
        rc = kvp__verify_init(cache);
    if (rc == KVP_OK)
        rc = kvp__quota_init(cache);
    if (rc != KVP_OK) {
        if (cfg->verify_tokens && cache->verify.meta)
            kvp__verify_free(cache);
        cache->cfg.verify_tokens = false; /* verify_init cleaned up after itself */
        cache_destroy(cache);
        return rc;
    }
    cache->stats.n_blocks_total = cfg->n_blocks;
    *out = cache;
    return KVP_OK;
}

KVP_EXPORT void kvp_cache_free(kvp_cache *cache)
{
    /* Inside its own callback the cache is mid-operation: freeing it there would pull the
     * memory from under the call that is running, so the request is ignored. */
    if (cache && !cache->in_callback)
        cache_destroy(cache);
}

KVP_EXPORT int kvp_cache_stats(const kvp_cache *cache, kvp_stats *out)
{
    if (!cache || !out)
        return KVP_EINVAL;
    if (cache->in_callback)
        return KVP_EBUSY;
    *out = cache->stats;
    out->n_blocks_total = cache->pool.n_blocks;
    out->n_blocks_free = cache->pool.n_free;
    out->n_blocks_cached = cache->pool.n_lru;
    out->n_blocks_in_use = cache->pool.n_in_use;
    out->n_requests_active = HASH_COUNT(cache->requests);
    return KVP_OK;
}

/* Drop every cached, unpinned block (least recently used first), then report CLEARED if
 * nothing is indexed any more. */
KVP_EXPORT int kvp_cache_reset(kvp_cache *cache)
{
    if (!cache)
        return KVP_EINVAL;
    if (cache->in_callback)
        return KVP_EBUSY;
    kvp__pool_drop_cached(cache, KVP_REMOVED_RESET);
    if (cache->index.n_items == 0) {
        kvp_event ev = {0};
        ev.type = KVP_EVENT_CLEARED;
        kvp__emit(cache, &ev);
    }
    return KVP_OK;
}

KVP_EXPORT int kvp_cache_check(const kvp_cache *cache)
{
    if (!cache)
        return KVP_EINVAL;
    if (cache->in_callback)
        return KVP_EBUSY;
    return kvp__cache_check(cache);
}

int kvp__cache_set_key_bits(kvp_cache *cache, unsigned bits)
{
    if (!cache || bits == 0 || bits > 128 || cache->index.n_items || cache->requests)
        return KVP_EINVAL;
    cache->key_bits = bits;
    return KVP_OK;
}
