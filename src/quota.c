/*
 * quota.c - quotas on cached blocks (kvp_config.ns_quota, kvp_config.quota_scope,
 * kvp_cache_set_quota): capacity isolation between the tenants of one shared pool.
 *
 * A shared LRU lets one tenant evict another's blocks at will and learn, from its own hit
 * counts, whether the other touched them (prime and probe). With quotas every namespace
 * belongs to a group, its quota scope, and a group never holds more cached (indexed,
 * unpinned) blocks than its quota: the moment a release would take it over, its own least
 * recently used cached block is evicted (KVP_REMOVED_EVICTED). Pinned blocks are not
 * counted (they are bounded by the requests in flight). When the quotas of all groups plus
 * the blocks pinned at once fit in the pool, the pool never has to evict from the shared
 * LRU order, and a group's cached blocks then depend only on its own requests
 * (docs/security.md section 5).
 *
 * The scope decides which namespaces share a group, through the group key:
 *
 *   KVP_QUOTA_SCOPE_NAMESPACE  root of (model, adapter, tenant, salt)   the namespace root
 *   KVP_QUOTA_SCOPE_TENANT     root of (-, -, tenant, -)                 one per tenant
 *   KVP_QUOTA_SCOPE_MODEL      root of (model, -, -, -)                  one per model
 *
 * ("-": absent.) Why the tenant scope exists: the threat model lets a tenant choose its
 * salt (and often its adapter), and per namespace each new salt was a new quota, so the
 * groups were unbounded and never fit a pool (tests/lib/test_scope.c: with 50 salts a
 * tenant took all 8 of a victim's 8 blocks). Made from the tenant field alone, the key
 * cannot be moved by anything a request chooses, provided the server sets the tenant from
 * authentication; the number of groups is then the number of tenants, which the
 * deployment controls. The tenant scope spans models too: a model name is often a request
 * parameter as well, and one engine's pool holds one model's KV anyway.
 *
 *   groups: uthash by group key  ->  kvp__qgroup {quota, n_cached, head .. tail}
 *   group[b]  the group of indexed block b (NULL when b is not indexed)
 *   prev[b], next[b]  b's neighbours in its group's list of cached blocks, least recent
 *                     first: the order of the shared LRU ring restricted to the group
 *
 * Group keys are full 128-bit roots under the cache's hash profile (never the test-only
 * truncation), so two scopes share a quota only if their keys collide, which under the
 * namespace scope would already merge their blocks' keys and under the tenant scope needs
 * two server-chosen tenant names to collide. A group lives while active requests, indexed
 * blocks or an explicit quota reference it, so the table stays bounded by what the cache
 * holds.
 *
 * Cost when quotas are on: 16 bytes per pool block; per acquire or access one group key
 * (a namespace root of at most four fields: one keyed BLAKE2b-128 block under keyed, one
 * XXH3 under xxh3 - whatever the scope, the same as the namespace root the scopes
 * replaced, and a shorter input for the tenant and model scopes) and one table probe; O(1)
 * list updates per pin, unpin and eviction. When off (ns_quota == 0), nothing is allocated
 * and every hook is one NULL test; the scope is then never read.
 */
#include <stdlib.h>
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

/* The key of ns's quota group: the full root key, under the cache's hash profile and
 * whatever the test-only truncation, of ns with the fields outside the cache's scope made
 * absent (under keyed a keyed PRF, so group keys are not predictable from outside either).
 * ns was validated. Cannot fail. */
kvp_key kvp__quota_key(const kvp_cache *cache, const kvp_namespace *ns)
{
    if (cache->cfg.quota_scope == KVP_QUOTA_SCOPE_NAMESPACE)
        return kvp__hasher_root(&cache->hasher, ns);
    kvp_namespace scope = {{NULL, 0}, {NULL, 0}, {NULL, 0}, {NULL, 0}}; /* all absent */
    if (cache->cfg.quota_scope == KVP_QUOTA_SCOPE_TENANT)
        scope.tenant = ns->tenant;
    else
        scope.model = ns->model;
    return kvp__hasher_root(&cache->hasher, &scope);
}

/* Find or create the group of ns's scope and take one reference for the caller (*out).
 * Returns KVP_OK or KVP_ENOMEM (nothing changed). Quotas must be on. */
int kvp__quota_intern(kvp_cache *cache, const kvp_namespace *ns, kvp__qgroup **out)
{
    kvp__quota *q = &cache->quota;
    kvp_key root = kvp__quota_key(cache, ns);
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
 * KVP_NIL (the pool evicts it); once retention is on, its lowest-priority one, the least
 * recently used first among equals (retention.c). Cannot fail. */
uint32_t kvp__quota_victim(const kvp_cache *cache, uint32_t id)
{
    const kvp__qgroup *g = cache->quota.group ? cache->quota.group[id] : NULL;
    if (!g || g->n_cached <= g->quota)
        return KVP_NIL;
    return KVP__LIKELY(!kvp__retention_on(cache)) ? g->head : kvp__retention_group_victim(cache, g);
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

/* One group's counts recomputed from the blocks and the requests (kvp__quota_check). */
typedef struct qcount {
    const kvp__qgroup *g; /* the group (sorted by address) */
    uint32_t n_tagged;    /* indexed blocks whose group it is, pinned or not */
    uint32_t n_cached;    /* of those, the cached (unpinned) ones */
    uint32_t n_requests;  /* active requests that hold it */
} qcount;

static int qcount_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const qcount *)a)->g, y = (uintptr_t)((const qcount *)b)->g;
    return (x > y) - (x < y);
}

/* The entry of group g in counts[0 .. n) (sorted), or NULL when g is not a group. */
static qcount *qcount_find(qcount *counts, size_t n, const kvp__qgroup *g)
{
    qcount key = {g, 0, 0, 0};
    return g ? bsearch(&key, counts, n, sizeof *counts, qcount_cmp) : NULL;
}

/* Invariant 6 (quotas): each group is filed under its own key; each group's list holds
 * exactly its cached blocks, linked both ways, within its quota; each group's counts agree
 * with a count made from the blocks and the requests alone: n_cached is the number of its
 * cached blocks, refs exactly its indexed blocks + the requests that hold it + one for an
 * explicit quota; every block and request points to a group of the table; unindexed
 * blocks have no group. KVP_OK at once when quotas are off; KVP_ENOMEM when the count
 * array (one entry per group, through the cache's hooks, freed before returning) cannot be
 * allocated. O(n_blocks log n_groups + requests). */
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
        uint32_t w = kvp__block_state(pool, id);
        if (!kvp__st_is_indexed(w) && q->group[id])
            return kvp__fail(KVP_ECORRUPT,
                             "invariant violated in %s: block %" PRIu32 " has a group, not indexed",
                             __func__, id);
        n_tagged_cached += q->group[id] && kvp__st_is_cached(w);
    }
    const kvp__qgroup *g, *tmp;
    HASH_ITER(hh, q->by_root, g, tmp)
    {
        const kvp__qgroup *found;
        HASH_FIND(hh, q->by_root, &g->root, sizeof g->root, found);
        if (found != g)
            return kvp__fail(KVP_ECORRUPT,
                             "invariant violated in %s: a group is not found under its own key",
                             __func__);
        uint32_t n = 0, prev = KVP_NIL;
        for (uint32_t id = g->head; id != KVP_NIL; prev = id, id = q->next[id]) {
            if (id >= pool->n_blocks || n >= pool->n_blocks || q->group[id] != g ||
                q->prev[id] != prev || !kvp__block_is_cached(pool, id))
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

    /* The per-group counts again, from the blocks and the requests alone. */
    kvp__mem *mem = (kvp__mem *)&cache->mem; /* scratch only: back to its count on return */
    size_t n_groups = HASH_COUNT(q->by_root), k = 0, n_alloc = n_groups ? n_groups : 1;
    qcount *counts = kvp__mem_alloc(mem, n_alloc * sizeof *counts);
    if (!counts)
        return kvp__fail(KVP_ENOMEM, "out of memory: the checker's counts of %zu quota groups",
                         n_groups);
    HASH_ITER(hh, q->by_root, g, tmp)
    {
        counts[k++] = (qcount){g, 0, 0, 0};
    }
    qsort(counts, n_groups, sizeof *counts, qcount_cmp);
    int rc = KVP_OK;
    for (uint32_t id = 0; id < pool->n_blocks && rc == KVP_OK; id++) {
        if (!q->group[id])
            continue;
        qcount *c = qcount_find(counts, n_groups, q->group[id]);
        if (!c)
            rc = kvp__fail(KVP_ECORRUPT,
                           "invariant violated in %s: block %" PRIu32 " points to no quota group",
                           __func__, id);
        else {
            c->n_tagged++;
            c->n_cached += !kvp__block_is_in_use(pool, id);
        }
    }
    const kvp__request *req, *rtmp;
    HASH_ITER(hh, cache->requests, req, rtmp)
    {
        qcount *c = qcount_find(counts, n_groups, req->qg);
        if (rc == KVP_OK && !c)
            rc = kvp__fail(KVP_ECORRUPT,
                           "invariant violated in %s: request %" PRIu64 " holds no quota group",
                           __func__, req->id);
        else if (c)
            c->n_requests++;
    }
    for (k = 0; k < n_groups && rc == KVP_OK; k++) {
        const qcount *c = &counts[k];
        if (c->n_cached != c->g->n_cached ||
            c->g->refs != c->n_tagged + c->n_requests + c->g->explicit_quota)
            rc = kvp__fail(KVP_ECORRUPT,
                           "invariant violated in %s: a quota group counts %" PRIu32
                           " cached blocks and %" PRIu32 " references; its blocks and requests "
                           "give %" PRIu32 " cached, %" PRIu32 " indexed, %" PRIu32 " requests",
                           __func__, c->g->n_cached, c->g->refs, c->n_cached, c->n_tagged,
                           c->n_requests);
    }
    kvp__mem_free(mem, counts, n_alloc * sizeof *counts);
    return rc;
}
