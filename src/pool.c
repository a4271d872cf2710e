/*
 * pool.c - the fixed pool of physical KV block ids, its free list and its LRU list.
 *
 *   free list:  free_head -> b -> b -> ... -> NIL        (singly linked through next)
 *   LRU list:   lru_head <-> ... <-> lru_tail            (doubly linked through prev/next)
 *               least recently used            most recently used
 *
 * A block whose last pin is released goes to the tail of the LRU list if it is indexed
 * (its KV can be reused) and to the front of the free list otherwise (a partial tail block,
 * a deduplicated copy). kvp__pool_take hands out free blocks first and only then evicts the
 * LRU head, so a cached prefix is never dropped while never-used space remains.
 *
 * Requests release their blocks from the last to the first, so within one chain the tail
 * reaches the LRU list first and is evicted before its parents.
 *
 * Costs: pin, unpin, take and drop are O(1) and never allocate. Links are 32-bit ids, not
 * pointers, to keep kvp__block small (88 bytes with its uthash handle).
 */
#include "internal.h"

static void lru_unlink(kvp__pool *pool, uint32_t id)
{
    kvp__block *b = &pool->blocks[id];
    if (b->prev != KVP_NIL)
        pool->blocks[b->prev].next = b->next;
    else
        pool->lru_head = b->next;
    if (b->next != KVP_NIL)
        pool->blocks[b->next].prev = b->prev;
    else
        pool->lru_tail = b->prev;
    b->prev = b->next = KVP_NIL;
    pool->n_lru--;
}

static void lru_push_tail(kvp__pool *pool, uint32_t id)
{
    kvp__block *b = &pool->blocks[id];
    b->next = KVP_NIL;
    b->prev = pool->lru_tail;
    if (pool->lru_tail != KVP_NIL)
        pool->blocks[pool->lru_tail].next = id;
    else
        pool->lru_head = id;
    pool->lru_tail = id;
    pool->n_lru++;
}

static void free_push(kvp__pool *pool, uint32_t id)
{
    kvp__block *b = &pool->blocks[id];
    b->prev = KVP_NIL;
    b->next = pool->free_head;
    pool->free_head = id;
    pool->n_free++;
}

/* Allocate the blocks, all free, ids ascending on the free list. KVP_OK or KVP_ENOMEM. */
int kvp__pool_init(kvp_cache *cache)
{
    kvp__pool *pool = &cache->pool;
    uint32_t n = cache->cfg.n_blocks;
    pool->blocks = kvp__mem_calloc(&cache->mem, n, sizeof(kvp__block));
    if (!pool->blocks)
        return KVP_ENOMEM;
    pool->n_blocks = n;
    pool->free_head = pool->lru_head = pool->lru_tail = KVP_NIL;
    pool->n_free = pool->n_lru = pool->n_in_use = 0;
    for (uint32_t i = n; i-- > 0;)
        free_push(pool, i);
    return KVP_OK;
}

void kvp__pool_free(kvp_cache *cache)
{
    kvp__mem_free(&cache->mem, cache->pool.blocks,
                  (size_t)cache->pool.n_blocks * sizeof(kvp__block));
    cache->pool.blocks = NULL;
}

/* Add a pin to block id. A cached block leaves the LRU list. Only indexed or already pinned
 * blocks may be pinned (free blocks are handed out by kvp__pool_take). Cannot fail. */
void kvp__pool_pin(kvp_cache *cache, uint32_t id)
{
    kvp__pool *pool = &cache->pool;
    kvp__block *b = &pool->blocks[id];
    if (b->ref++ == 0) {
        lru_unlink(pool, id);
        pool->n_in_use++;
    }
}

/* Drop one pin. At zero, an indexed block becomes the most recently used cached block and a
 * private one returns to the free list. Cannot fail. */
void kvp__pool_unpin(kvp_cache *cache, uint32_t id)
{
    kvp__pool *pool = &cache->pool;
    kvp__block *b = &pool->blocks[id];
    if (--b->ref > 0)
        return;
    pool->n_in_use--;
    if (b->indexed)
        lru_push_tail(pool, id);
    else
        free_push(pool, id);
}

/* Remove indexed block id from the index and emit KVP_EVENT_REMOVED with reason. */
static void unindex(kvp_cache *cache, uint32_t id, int reason)
{
    kvp__block *b = &cache->pool.blocks[id];
    kvp_event ev = {0};
    ev.type = KVP_EVENT_REMOVED;
    ev.reason = reason;
    ev.block_id = id;
    ev.key = b->key;
    kvp__index_del(&cache->index, b);
    if (kvp__verifying(cache))
        kvp__verify_forget(cache, id);
    kvp__emit(cache, &ev);
}

/* Remove cached (unpinned, indexed) block id from the index and the LRU list, and leave it
 * unlinked and unpinned (the caller pins it or puts it on the free list). Cannot fail. */
static void uncache(kvp_cache *cache, uint32_t id, int reason)
{
    lru_unlink(&cache->pool, id);
    unindex(cache, id, reason);
}

/* Prefetch what evicting cached block id will touch: its bucket, its neighbours in the
 * bucket chain and in uthash's insertion-order list (HASH_DELETE rewrites their links).
 * Reads block id itself, which should have been prefetched one step earlier. */
static void prefetch_eviction(const kvp_cache *cache, uint32_t id)
{
    const kvp__block *b = &cache->pool.blocks[id];
    const UT_hash_table *tbl = cache->index.head->hh.tbl;
    KVP__PREFETCH_W(&tbl->buckets[b->hh.hashv & (tbl->num_buckets - 1)]);
    if (b->hh.prev)
        KVP__PREFETCH_W((const char *)b->hh.prev + tbl->hho);
    if (b->hh.next)
        KVP__PREFETCH_W((const char *)b->hh.next + tbl->hho);
    if (b->hh.hh_prev)
        KVP__PREFETCH_W(b->hh.hh_prev);
    if (b->hh.hh_next)
        KVP__PREFETCH_W(b->hh.hh_next);
}

/* Hand out n blocks into ids[], like n calls of kvp__pool_take (the caller checked that
 * kvp__pool_available >= n). Evictions walk the LRU list, a chain of cache misses, and each
 * touches five more scattered lines; this keeps two victims ahead in flight: the block two
 * steps ahead is prefetched, and the next one's dependents. Cannot fail. */
void kvp__pool_take_n(kvp_cache *cache, uint32_t *ids, uint32_t n)
{
    kvp__pool *pool = &cache->pool;
    for (uint32_t i = 0; i < n; i++) {
        if (pool->free_head == KVP_NIL && pool->lru_head != KVP_NIL) {
            uint32_t next = pool->blocks[pool->lru_head].next;
            if (next != KVP_NIL) {
                prefetch_eviction(cache, next);
                uint32_t after = pool->blocks[next].next;
                if (after != KVP_NIL)
                    KVP__PREFETCH_W(&pool->blocks[after]);
            }
        }
        ids[i] = kvp__pool_take(cache);
    }
}

/* Hand out one block, pinned once (ref == 1) and not indexed: the free-list head if any,
 * else the LRU head, evicted (n_evictions++, KVP_EVENT_REMOVED/EVICTED). Returns KVP_NIL
 * when neither exists; the caller checks kvp__pool_available first. */
uint32_t kvp__pool_take(kvp_cache *cache)
{
    kvp__pool *pool = &cache->pool;
    uint32_t id = pool->free_head;
    if (id != KVP_NIL) {
        pool->free_head = pool->blocks[id].next;
        pool->n_free--;
        pool->blocks[id].next = KVP_NIL;
    } else {
        id = pool->lru_head;
        if (id == KVP_NIL)
            return KVP_NIL;
        uncache(cache, id, KVP_REMOVED_EVICTED);
        cache->stats.n_evictions++;
    }
    pool->blocks[id].ref = 1;
    pool->n_in_use++;
    return id;
}

/* Take block id out of the index (reset, or a verify-mode replacement), emitting
 * KVP_EVENT_REMOVED with reason. A cached block returns to the free list; a pinned one stays
 * with its requests as a private block and returns to the free list on its last unpin.
 * Cannot fail. */
void kvp__pool_unindex(kvp_cache *cache, uint32_t id, int reason)
{
    if (cache->pool.blocks[id].ref == 0) {
        uncache(cache, id, reason);
        free_push(&cache->pool, id);
        return;
    }
    unindex(cache, id, reason);
}
