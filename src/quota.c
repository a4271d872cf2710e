/*
 * quota.c - per-namespace quotas on cached blocks (kvp_config.ns_quota,
 * kvp_cache_set_quota): capacity isolation between the tenants of one shared pool.
 *
 * A shared LRU lets one namespace evict another's blocks at will and learn, from its own
 * hit counts, whether the other touched them (prime and probe). With quotas each namespace
 * is a group, and a group never holds more cached (indexed, unpinned) blocks than its
 * quota: the moment a release would take it over, its own least recently used cached block
 * is evicted (KVP_REMOVED_EVICTED). Pinned blocks are not counted (they are bounded by the
 * requests in flight). When the quotas of all namespaces plus the blocks pinned at once fit
 * in the pool, the pool never has to evict from the shared LRU order, and a namespace's
 * cached blocks then depend only on its own requests (docs/security.md).
 *
 *   groups: uthash by namespace root  ->  kvp__qgroup {quota, n_cached, head .. tail}
 *   group[b]  the group of indexed block b (NULL when b is not indexed)
 *   prev[b], next[b]  b's neighbours in its group's list of cached blocks, least recent
 *                     first: the order of the shared LRU ring restricted to the group
 *
 * Groups are keyed by the namespace's full 128-bit root key (never the test-only
 * truncation), so two namespaces share a quota only if their roots collide, which would
 * already merge their keys. A group lives while active requests, indexed blocks or an
 * explicit quota reference it, so the table stays bounded by what the cache holds.
 *
 * Cost when quotas are on: 16 bytes per pool block, one table probe per acquire or access,
 * O(1) list updates per pin, unpin and eviction. When off (ns_quota == 0), nothing is
 * allocated and every hook is one NULL test.
 */
#include <string.h>

#include "internal.h"

#undef uthash_malloc
#undef uthash_free
#define uthash_malloc(sz)    kvp__mem_alloc(&cache->mem, (sz))
#define uthash_free(ptr, sz) kvp__mem_free(&cache->mem, (ptr), (sz))

/* Allocate the per-block arrays when cfg.ns_quota != 0. KVP_OK or KVP_ENOMEM (nothing
 * kept). */
int kvp__quota_init(kvp_cache *cache)
{
    kvp__quota *q = &cache->quota;
    size_t n = cache->cfg.n_blocks;
    memset(q, 0, sizeof *q);
    if (cache->cfg.ns_quota == 0)
        return KVP_OK;
    q->group = kvp__mem_calloc(&cache->mem, n, sizeof *q->group);
    q->prev = kvp__mem_alloc(&cache->mem, n * sizeof *q->prev);
    q->next = kvp__mem_alloc(&cache->mem, n * sizeof *q->next);
    if (!q->group || !q->prev || !q->next) {
        kvp__quota_free(cache);
        return kvp__fail(KVP_ENOMEM, "out of memory: the quota lists of %zu blocks", n);
    }
    return KVP_OK;
}

/* Free the groups and the arrays. Cannot fail. */
void kvp__quota_free(kvp_cache *cache)
{
    kvp__quota *q = &cache->quota;
    size_t n = cache->cfg.n_blocks;
    kvp__qgroup *g, *tmp;
    HASH_ITER(hh, q->by_root, g, tmp)
    {
        HASH_DELETE(hh, q->by_root, g);
        kvp__mem_free(&cache->mem, g, sizeof *g);
    }
    kvp__mem_free(&cache->mem, q->group, q->group ? n * sizeof *q->group : 0);
    kvp__mem_free(&cache->mem, q->prev, q->prev ? n * sizeof *q->prev : 0);
    kvp__mem_free(&cache->mem, q->next, q->next ? n * sizeof *q->next : 0);
    memset(q, 0, sizeof *q);
}

/* The namespace's full root key under the cache's hash profile (the group key), whatever
 * the test-only truncation: under keyed it is a keyed PRF, so group keys are not
 * predictable from outside either. ns was validated. Cannot fail. */
static kvp_key group_root(const kvp_cache *cache, const kvp_namespace *ns)
{
    return kvp__hasher_root(&cache->hasher, ns);
}

/* Find or create ns's group and take one reference for the caller (*out). Returns KVP_OK
 * or KVP_ENOMEM (nothing changed). Quotas must be on. */
int kvp__quota_intern(kvp_cache *cache, const kvp_namespace *ns, kvp__qgroup **out)
{
    kvp__quota *q = &cache->quota;
    kvp_key root = group_root(cache, ns);
    kvp__qgroup *g;
    HASH_FIND(hh, q->by_root, &root, sizeof root, g);
    if (!g) {
        g = kvp__mem_calloc(&cache->mem, 1, sizeof *g);
        if (!g)
            return kvp__fail(KVP_ENOMEM, "out of memory: the namespace's quota group");
        g->root = root;
        g->quota = cache->cfg.ns_quota;
        g->head = g->tail = KVP_NIL;
        HASH_ADD(hh, q->by_root, root, sizeof g->root, g);
        if (g->hh.tbl == NULL) {
            kvp__mem_free(&cache->mem, g, sizeof *g);
            return kvp__fail(KVP_ENOMEM, "out of memory: the table of quota groups");
        }
    }
    g->refs++;
    *out = g;
    return KVP_OK;
}

/* Drop one reference; the last frees the group (uthash deletes never allocate). Cannot
 * fail. */
void kvp__quota_unref(kvp_cache *cache, kvp__qgroup *g)
{
    if (--g->refs > 0)
        return;
    HASH_DELETE(hh, cache->quota.by_root, g);
    kvp__mem_free(&cache->mem, g, sizeof *g);
}

/* Block id was just indexed for group g (NULL: nothing to do). Cannot fail. */
void kvp__quota_tag(kvp_cache *cache, uint32_t id, kvp__qgroup *g)
{
    if (!g)
        return;
    cache->quota.group[id] = g;
    g->refs++;
}

/* Block id left the index: drop its group reference. Cannot fail. */
void kvp__quota_untag(kvp_cache *cache, uint32_t id)
{
    kvp__qgroup *g = cache->quota.group[id];
    if (!g)
        return;
    cache->quota.group[id] = NULL;
    kvp__quota_unref(cache, g);
}

/* Block id became cached: append it to its group's list. Cannot fail. */
void kvp__quota_link(kvp_cache *cache, uint32_t id)
{
    kvp__quota *q = &cache->quota;
    kvp__qgroup *g = q->group[id];
    if (!g)
        return;
    q->prev[id] = g->tail;
    q->next[id] = KVP_NIL;
    if (g->tail != KVP_NIL)
        q->next[g->tail] = id;
    else
        g->head = id;
    g->tail = id;
    g->n_cached++;
}

/* Block id stops being cached (pinned, evicted or dropped): unlink it. Cannot fail. */
void kvp__quota_unlink(kvp_cache *cache, uint32_t id)
{
    kvp__quota *q = &cache->quota;
    kvp__qgroup *g = q->group[id];
    if (!g)
        return;
    uint32_t p = q->prev[id], n = q->next[id];
    if (p != KVP_NIL)
        q->next[p] = n;
    else
        g->head = n;
    if (n != KVP_NIL)
        q->prev[n] = p;
    else
        g->tail = p;
    g->n_cached--;
}

/* The group's least recently used cached block when it holds more than its quota, else
 * KVP_NIL (the pool evicts it). Cannot fail. */
uint32_t kvp__quota_victim(const kvp_cache *cache, uint32_t id)
{
    const kvp__qgroup *g = cache->quota.group ? cache->quota.group[id] : NULL;
    return g && g->n_cached > g->quota ? g->head : KVP_NIL;
}

int kvp__set_quota_locked(kvp_cache *cache, const kvp_namespace *ns, uint32_t max_cached_blocks)
{
    int rc = kvp__ns_valid(ns);
    if (rc != KVP_OK)
        return rc;
    if (!cache->quota.group)
        return kvp__fail(KVP_EINVAL, "quotas are off: the cache was made with ns_quota 0");
    kvp__qgroup *g;
    rc = kvp__quota_intern(cache, ns, &g);
    if (rc != KVP_OK)
        return rc;
    if (g->explicit_quota)
        g->refs--; /* the explicit setting holds one reference, taken the first time */
    g->explicit_quota = true;
    g->quota = max_cached_blocks;
    kvp__pool_enforce_quota(cache, g);
    return KVP_OK;
}

/* Invariant 6 (quotas): each group's list holds exactly its cached blocks, linked both
 * ways, within its quota; each group's refs cover its indexed blocks; unindexed blocks
 * have no group. KVP_OK at once when quotas are off. */
int kvp__quota_check(const kvp_cache *cache)
{
    const kvp__quota *q = &cache->quota;
    if (!q->group && HASH_COUNT(q->by_root) != 0)
        return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: quota groups with quotas off",
                         __func__);
    if (!q->group)
        return KVP_OK;
    const kvp__pool *pool = &cache->pool;
    uint32_t n_tagged_cached = 0, n_listed = 0;
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        const kvp__block *b = &pool->blocks[id];
        if (!b->indexed && q->group[id])
            return kvp__fail(KVP_ECORRUPT,
                             "invariant violated in %s: block %" PRIu32 " has a group, not indexed",
                             __func__, id);
        n_tagged_cached += q->group[id] && b->indexed && b->ref == 0;
    }
    const kvp__qgroup *g, *tmp;
    HASH_ITER(hh, q->by_root, g, tmp)
    {
        uint32_t n = 0, prev = KVP_NIL;
        for (uint32_t id = g->head; id != KVP_NIL; prev = id, id = q->next[id]) {
            if (id >= pool->n_blocks || n >= pool->n_blocks || q->group[id] != g ||
                q->prev[id] != prev || pool->blocks[id].ref || !pool->blocks[id].indexed)
                return kvp__fail(
                    KVP_ECORRUPT,
                    "invariant violated in %s: a group's list is broken at block %" PRIu32,
                    __func__, id);
            n++;
        }
        if (prev != g->tail || n != g->n_cached || n > g->quota || g->refs < n + g->explicit_quota)
            return kvp__fail(KVP_ECORRUPT,
                             "invariant violated in %s: a group's tail, count, quota or references "
                             "disagree with its list of %" PRIu32 " blocks",
                             __func__, n);
        n_listed += n;
    }
    if (n_listed != n_tagged_cached)
        return kvp__fail(KVP_ECORRUPT,
                         "invariant violated in %s: %" PRIu32 " blocks listed, %" PRIu32
                         " cached blocks in groups",
                         __func__, n_listed, n_tagged_cached);
    return KVP_OK;
}
