/*
 * check.c - the invariant checker: walks the whole cache and verifies that the index, the
 * pool's free list and LRU ring, the reference counts, the requests and (in collision-proof
 * mode) the interned namespaces agree with each other.
 *
 * Invariants checked:
 *  1. Each block's state word (internal.h) is well formed and says free (on the free list),
 *     cached (indexed; under LRU its word is the slot of exactly one live entry in the LRU
 *     ring's window, outside a cleaning pass's gap; under another policy KVP__ST_CACHED; on
 *     a retention queue KVP__SLOT_RETAINED) or in use (a pin count of at least 1, in
 *     neither); the free list is acyclic, and n_free + n_lru + n_retained + n_in_use ==
 *     n_blocks.
 *  2. The index's bucket chains hold exactly the indexed blocks plus its sentinel, each
 *     once, each in the bucket of its key, with sound back links and bucket counts and no
 *     cycle or link out of the pool; a key is indexed once, except in verify mode, where
 *     blocks sharing a key must differ in tokens or provenance (none could be told apart
 *     from another by verification). (The table points at the key inside its block, so a
 *     key is stored once: its entry's bucket and hash are cross-checked, the key's upper
 *     64 bits have no copy to check.)
 *  3. Every block's pin count equals the number of times it appears in active requests'
 *     block tables (plus the store orders that hold it); each request has n_committed <= n_blocks
 * <= cap_blocks.
 *  4. Verify mode: each interned namespace's refs equals the requests and indexed first
 *     blocks that name it; slots and records agree.
 *  5. Structure: the index keeps the bucket count its pool size gives (it never grows); keys
 *     fit the test-only truncation; no state word holds count_unpinned's mark; requests carry
 *     no namespace or parent reference outside verify mode; in verify mode an unindexed
 *     block names no namespace and an indexed later block names a parent in the pool.
 *  6. Quotas (quota.c, kvp__quota_check): each quota scope's group is filed under its own
 *     key, its list of cached blocks is exact and within its quota, and its counts (cached
 *     blocks, references) agree with a recount from the blocks and requests alone
 *     (tests/lib/test_scope.c corrupts each).
 *  7. Eviction policy (policy.c, kvp__policy_check, then kvp__policy_slru_check or
 *     kvp__policy_s3fifo_check): under SLRU or S3-FIFO the LRU ring of invariant 1 is
 *     empty and the cached blocks are exactly those on the policy's lists.
 *  8. Retention (retention.c, kvp__retention_check): cached blocks of non-default priority
 *     are on their priority's queue instead of the ring or the policy's lists, counted in
 *     pool.n_retained; the queues, the expiry heap and the records agree.
 * Tests and fuzzers call it after every mutation; tests/lib/test_check.c corrupts each structure
 * above in turn and shows the checker catching it. O(n_blocks + held blocks); it allocates
 * its counter arrays through the cache's hooks (a deployment that gives the cache an arena
 * gets no hidden malloc), frees them before returning, and reports KVP_ENOMEM when they
 * cannot be had. kvp_cache_check runs it under the cache's exclusive lock, since the
 * allocator's live-byte count changes while it runs.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tier.h"

/* A failed invariant names its checker and the condition that held (for kvp_errmsg). */
#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond) {                                                                                \
            rc = kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Lists: returns the number of nodes, or UINT32_MAX on a cycle or bad link. */
static uint32_t walk_free(const kvp__pool *pool)
{
    uint32_t n = 0;
    for (uint32_t id = pool->free_head; id != KVP_NIL; id = pool->blocks[id].next) {
        if (id >= pool->n_blocks || n >= pool->n_blocks)
            return UINT32_MAX;
        if (!kvp__block_is_free(pool, id))
            return UINT32_MAX;
        n++;
    }
    return n;
}

/* Is absolute ring position p in the window, outside a cleaning pass's gap? */
static bool in_window(const kvp__pool *pool, uint64_t p)
{
    if (p < pool->lru_head || p >= pool->lru_tail)
        return false;
    return !pool->cleaning || p < pool->clean_w || p >= pool->clean_r;
}

/* The LRU ring: returns the number of live entries, or UINT32_MAX when the window or the
 * cleaning cursors are out of shape, an entry names no block, or a cached block has no live
 * entry in the window outside the gap (or an uncached one claims a slot). */
static uint32_t walk_lru(const kvp__pool *pool)
{
    uint64_t head = pool->lru_head, tail = pool->lru_tail, cap = pool->lru_cap;
    if (tail < head || tail - head >= cap || cap < pool->n_blocks)
        return UINT32_MAX;
    if (pool->cleaning &&
        !(head <= pool->clean_w && pool->clean_w <= pool->clean_r && pool->clean_r <= tail))
        return UINT32_MAX;
    uint32_t n = 0;
    for (uint64_t p = head; p < tail; p++) {
        uint32_t s = (uint32_t)(p % cap), id = pool->lru[s];
        if (!in_window(pool, p))
            continue; /* the gap: stale by construction, checked below */
        if (id >= pool->n_blocks)
            return UINT32_MAX;
        n += kvp__lru_entry_live(pool, id, s);
    }
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        uint32_t w = pool->state[id];
        if (!kvp__st_is_cached(w) || w == KVP__SLOT_RETAINED)
            continue; /* not cached, or on a retention queue (kvp__retention_check) */
        if (w >= cap) /* KVP__ST_CACHED, a mark, or out of range: no slot */
            return UINT32_MAX;
        uint64_t s = w, offset = (s + cap - head % cap) % cap;
        if (pool->lru[s] != id || !in_window(pool, head + offset))
            return UINT32_MAX;
    }
    return n;
}

/* Under SLRU or S3-FIFO the ring is empty and unused: the cached blocks, counted, each
 * with no ring slot (their lists are kvp__policy_check's), or UINT32_MAX. */
static uint32_t count_cached(const kvp__pool *pool)
{
    if (pool->lru_head != pool->lru_tail || pool->cleaning)
        return UINT32_MAX;
    uint32_t n = 0;
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        uint32_t w = pool->state[id];
        if (w == KVP__SLOT_RETAINED)
            continue; /* on a retention queue (kvp__retention_check) */
        if (kvp__st_is_cached(w) && w != KVP__ST_CACHED)
            return UINT32_MAX; /* a ring slot, or a mark */
        n += kvp__st_is_cached(w);
    }
    return n;
}

/* kvp__policy_check's predicate for the device pool: block id is cached and on the
 * policy's lists (not on a retention queue). */
static bool pool_block_listed(const void *ctx, uint32_t id)
{
    const kvp__pool *pool = ctx;
    uint32_t w = kvp__block_state(pool, id);
    return kvp__st_is_cached(w) && w != KVP__SLOT_RETAINED;
}

/* Invariant 7: the device pool's policy (policy.h), its blocks judged by the pool. */
int kvp__pool_policy_check(const kvp_cache *cache)
{
    return kvp__policy_check(&cache->policy, pool_block_listed, &cache->pool);
}

/* Invariant 1 (pool): block states, the free list and the LRU ring agree with the counts. */
int kvp__pool_check(const kvp_cache *cache)
{
    const kvp__pool *pool = &cache->pool;
    int rc = KVP_OK;
    uint32_t n_free = walk_free(pool), n_used = 0;
    uint32_t n_lru = kvp__policy_is_lru(cache) ? walk_lru(pool) : count_cached(pool);
    FAIL_IF(n_free != pool->n_free || n_lru != pool->n_lru);
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        uint32_t w = pool->state[id], c = w & KVP__ST_REFS;
        FAIL_IF(w == KVP__ST_MARK);
        FAIL_IF(kvp__st_is_in_use(w) && c == 0);
        FAIL_IF(kvp__st_is_in_use(w) && c == KVP__ST_REF_SAT &&
                pool->blocks[id].ref_ext < KVP__ST_REF_SAT);
        n_used += kvp__st_is_in_use(w);
    }
    FAIL_IF(n_used != pool->n_in_use ||
            (uint64_t)n_free + n_lru + pool->n_retained + n_used != pool->n_blocks);
out:
    return rc;
}

/* Is indexed block b a candidate under its key, and (verify mode) does no other candidate
 * carry the same tokens and provenance? Outside verify mode b must be the only one. */
static bool indexed_ok(const kvp_cache *cache, const kvp__block *b)
{
    const kvp__block *c = kvp__index_find(&cache->index, b->key);
    if (!kvp__verifying(cache))
        return c == b && !kvp__index_find_next(&cache->index, c, b->key);
    const kvp__verify *v = &cache->verify;
    size_t bs = cache->cfg.block_size;
    uint32_t id = (uint32_t)(b - cache->pool.blocks);
    const kvp__vmeta *mb = &v->meta[id];
    bool seen = false;
    for (; c; c = kvp__index_find_next(&cache->index, c, b->key)) {
        uint32_t cid = (uint32_t)(c - cache->pool.blocks);
        const kvp__vmeta *mc = &v->meta[cid];
        if (c == b) {
            seen = true;
            continue;
        }
        if (mc->parent == mb->parent && mc->parent_gen == mb->parent_gen && mc->ns == mb->ns &&
            memcmp(v->tokens + (size_t)cid * bs, v->tokens + (size_t)id * bs, bs * 4) == 0)
            return false;
    }
    return seen;
}

/* Is handle hh, met in the chain of bucket bkt, a sound entry: the sentinel (in bucket 0),
 * or the handle of an indexed pool block naming its own key and hash? The pointer is
 * range-checked before it is read. */
static bool entry_ok(const kvp_cache *cache, const UT_hash_handle *hh, uint64_t bkt)
{
    const kvp__index *idx = &cache->index;
    const UT_hash_table *tbl = idx->head->hh.tbl;
    if (hh == &idx->sentinel.hh)
        return bkt == 0 && hh->keylen == 1 && hh->hashv == 0;
    const char *p = (const char *)hh, *lo = (const char *)cache->pool.blocks;
    if (p < lo || p >= (const char *)(cache->pool.blocks + cache->pool.n_blocks) ||
        (size_t)(p - lo) % sizeof(kvp__block) != 0)
        return false;
    const kvp__block *b = (const kvp__block *)(const void *)hh;
    /* hh->tbl is not compared: a block's handle keeps ref_ext there (internal.h). */
    return kvp__block_is_indexed(&cache->pool, kvp__block_id(&cache->pool, b)) &&
           hh->key == &b->key && hh->keylen == sizeof(kvp_key) &&
           hh->hashv == (unsigned)b->key.lo && (hh->hashv & (tbl->num_buckets - 1)) == bkt;
}

/* Walk every bucket chain: sound entries (entry_ok) with sound back links, bucket counts
 * that match the chains, n_items + 1 entries in all (the sentinel included; a cycle or a
 * repeated block exceeds that), and as many in tbl->num_items. KVP_OK or KVP_ECORRUPT. */
static int walk_chains(const kvp_cache *cache)
{
    const kvp__index *idx = &cache->index;
    const UT_hash_table *tbl = idx->head->hh.tbl;
    int rc = KVP_OK;
    uint64_t n = 0;
    for (uint64_t bkt = 0; bkt < tbl->num_buckets; bkt++) {
        const UT_hash_bucket *bucket = &tbl->buckets[bkt];
        const UT_hash_handle *prev = NULL;
        uint64_t n_chain = 0;
        for (const UT_hash_handle *hh = bucket->hh_head; hh; prev = hh, hh = hh->hh_next) {
            FAIL_IF(n > idx->n_items || !entry_ok(cache, hh, bkt) || hh->hh_prev != prev);
            n++;
            n_chain++;
        }
        /* Counts are not kept (index.c): the sentinel's bucket says 1, every other 0. */
        FAIL_IF(bucket->count != (bkt == 0 ? 1u : 0u) || n_chain > idx->n_items + 1);
    }
    FAIL_IF(n != (uint64_t)idx->n_items + 1 || tbl->num_items != n);
out:
    return rc;
}

/* Invariant 2 (index): exactly the indexed blocks plus the sentinel, each under its own
 * (truncated) key, in a table of the bucket count its pool size gives. The chains are
 * walked before any key is looked up, so a corrupt chain cannot make a lookup loop. */
int kvp__index_check(const kvp_cache *cache)
{
    const kvp__pool *pool = &cache->pool;
    const kvp__index *idx = &cache->index;
    int rc = KVP_OK;
    uint32_t n_indexed = 0;
    FAIL_IF(!idx->head || idx->head != &idx->sentinel || !idx->head->hh.tbl);
    FAIL_IF(idx->log2_buckets != kvp__index_log2_buckets(pool->n_blocks));
    FAIL_IF(idx->head->hh.tbl->num_buckets != 1u << idx->log2_buckets);
    if ((rc = walk_chains(cache)) != KVP_OK)
        goto out; /* walk_chains named the broken chain */
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        const kvp__block *b = &pool->blocks[id];
        if (!kvp__block_is_indexed(pool, id))
            continue;
        n_indexed++;
        FAIL_IF(!indexed_ok(cache, b));
        FAIL_IF(!kvp__key_eq(kvp__key_truncate(b->key, cache->key_bits), b->key));
    }
    FAIL_IF(n_indexed != idx->n_items);
out:
    return rc;
}

/* Invariant 3 (requests): every block's ref count is its number of appearances in the
 * requests' block tables; the tables are in range. KVP_ENOMEM if the counters cannot be
 * allocated. */
int kvp__requests_check(const kvp_cache *cache)
{
    const kvp__pool *pool = &cache->pool;
    int rc = KVP_OK;
    kvp__mem *mem = (kvp__mem *)&cache->mem; /* scratch only: back to its count on return */
    size_t n_refs = pool->n_blocks ? pool->n_blocks : 1;
    uint32_t *refs = kvp__mem_calloc(mem, n_refs, sizeof *refs);
    if (!refs)
        return kvp__fail(KVP_ENOMEM, "out of memory: the checker's %zu reference counters", n_refs);
    const kvp__request *req, *tmp;
    HASH_ITER(hh, cache->requests, req, tmp)
    {
        FAIL_IF(!kvp__request_counts_ok(req));
        FAIL_IF(req->canon.id != KVP_NIL && req->canon.id >= pool->n_blocks);
        FAIL_IF(!kvp__verifying(cache) && (req->ns != KVP_NIL || req->canon.id != KVP_NIL));
        FAIL_IF(kvp__quotas_on(cache) != (req->qg != NULL));
        for (uint32_t i = 0; i < req->n_blocks; i++) {
            FAIL_IF(req->blocks[i] >= pool->n_blocks);
            refs[req->blocks[i]]++;
        }
    }
    kvp__tier_count_pins(cache, refs); /* store orders pin their device blocks */
    for (uint32_t id = 0; id < pool->n_blocks; id++)
        FAIL_IF(refs[id] != kvp__block_ref(pool, id));
out:
    kvp__mem_free(mem, refs, n_refs * sizeof *refs);
    return rc;
}

/* Invariant 4 (verify): provenance of indexed blocks and the interned namespaces' reference
 * counts. KVP_OK at once outside collision-proof mode. */
int kvp__verify_check(const kvp_cache *cache)
{
    if (!kvp__verifying(cache))
        return KVP_OK;
    const kvp__pool *pool = &cache->pool;
    const kvp__verify *v = &cache->verify;
    int rc = KVP_OK;
    kvp__mem *mem = (kvp__mem *)&cache->mem; /* scratch only: back to its count on return */
    size_t n_ns = v->n_slots ? v->n_slots : 1;
    uint32_t *ns_refs = kvp__mem_calloc(mem, n_ns, sizeof *ns_refs);
    if (!ns_refs)
        return kvp__fail(KVP_ENOMEM, "out of memory: the checker's %zu namespace counters", n_ns);
    const kvp__request *req, *tmp;
    HASH_ITER(hh, cache->requests, req, tmp)
    {
        FAIL_IF(req->ns >= v->n_slots || !v->slots[req->ns]);
        ns_refs[req->ns]++;
    }
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        const kvp__vmeta *m = &v->meta[id];
        if (!kvp__block_is_indexed(pool, id)) {
            FAIL_IF(m->ns != KVP_NIL);
            continue;
        }
        FAIL_IF(m->parent != KVP_NIL && m->parent >= pool->n_blocks);
        FAIL_IF((m->parent == KVP_NIL) == (m->ns == KVP_NIL)); /* exactly one of them */
        if (m->ns == KVP_NIL)
            continue;
        FAIL_IF(m->ns >= v->n_slots || !v->slots[m->ns]);
        ns_refs[m->ns]++;
    }
    for (uint32_t s = 0; s < v->n_slots; s++) {
        if (!v->slots[s])
            continue;
        FAIL_IF(kvp__verify_ns_refs(cache, s) != ns_refs[s] || ns_refs[s] == 0);
    }
out:
    kvp__mem_free(mem, ns_refs, n_ns * sizeof *ns_refs);
    return rc;
}

/* Every module's checker in turn; the first failure wins. */
int kvp__cache_check(const kvp_cache *cache)
{
    int rc = kvp__pool_check(cache);
    if (rc == KVP_OK)
        rc = kvp__index_check(cache);
    if (rc == KVP_OK)
        rc = kvp__requests_check(cache);
    if (rc == KVP_OK)
        rc = kvp__verify_check(cache);
    if (rc == KVP_OK)
        rc = kvp__hasher_check(&cache->hasher);
    if (rc == KVP_OK)
        rc = kvp__quota_check(cache);
    if (rc == KVP_OK)
        rc = kvp__pool_policy_check(cache);
    if (rc == KVP_OK)
        rc = kvp__retention_check(cache);
    if (rc == KVP_OK)
        rc = kvp__tier_check(cache);
    return rc;
}
