/*
 * pool.c - the fixed pool of physical KV block ids, its free list and its LRU order.
 *
 *   free list:  free_head -> b -> b -> ... -> NIL        (singly linked through next)
 *   LRU ring:   lru[head % cap] ... lru[(tail - 1) % cap] block ids in release order
 *               least recently used            most recently used
 *
 * A block whose last pin is released is appended to the LRU ring if it is indexed (its KV
 * can be reused) and pushed on the free list otherwise (a partial tail block, a
 * deduplicated copy). kvp__pool_take hands out free blocks first and only then evicts the
 * least recently used cached block, so a cached prefix is never dropped while never-used
 * space remains.
 *
 * Block states live in pool.state, one 32-bit word per block (internal.h): free, cached
 * (a cached block on the ring holds its slot there), or in use with its pin count and
 * whether it is indexed. Release and the ring's liveness test read and write only that
 * word and the ring, never the block's 64-byte record: the record of a block released 32
 * requests after its commit has usually left a 2 MiB cache, while the state words of a
 * 200,000-block pool (800 KB, 16 blocks a line) mostly stay (docs/performance.md, "The
 * pool at memory speed, part 4"). The record is touched when the block is stored (its key
 * and chain links), found by a probe, and unlinked at its eviction.
 *
 * The LRU order is a ring of ids with lazy deletion rather than a linked list: pinning a
 * cached block only rewrites its state word, leaving a stale entry behind; an entry is live
 * iff its block's state word is that entry's slot (then the block is cached). Eviction pops
 * entries from the head and skips stale ones. (Writing a dead mark into the ring at every
 * pin instead, so that skips need not read the block, cost 15% of bench_latency's median
 * call: a pin of a cached block would touch a random ring line as well.) The reason is
 * speed: walking a linked list through scattered blocks is a chain
 * of dependent cache misses, one per eviction, while the ring is read sequentially and the
 * victims further ahead can be prefetched in parallel (bench_core (c)).
 *
 * Dead slots are reclaimed by an incremental cleaning pass, so no single call stalls on
 * the whole ring (bench_latency: the old stop-the-world compaction of a 1M-block pool's
 * ring took a kvp_access from 12 us to 76 ms once in a while):
 *
 *   head          clean_w        clean_r                tail
 *    | cleaned     |  gap: stale   |  not cleaned yet     |  (free)
 *
 * A pass starts when the ring is 3/4 full; then every push first cleans CLEAN_STEP
 * entries at clean_r, moving live ones down to clean_w (in order, so the LRU order is
 * kept). Pops that reach clean_w jump over the gap. When clean_r meets the tail the gap is
 * at the end and the tail moves back to clean_w. With cap = 2 n_blocks + 16 a pass is done
 * after at most 3/4 cap / (CLEAN_STEP - 1) pushes, before the ring can fill (asserted), and
 * the cleaning work is CLEAN_STEP entries per push at most: bounded per call by the blocks
 * the call releases, never by the pool.
 *
 * Requests release their blocks from the last to the first, so within one chain the tail
 * enters the LRU order first and is evicted before its parents.
 *
 * With per-namespace quotas (quota.c), each cached block is also on its namespace's list,
 * in the same order, and a release that takes a namespace over its quota evicts that
 * namespace's least recently used block at once (kvp__pool_unpin_tail_first), so "a namespace's
 * blocks beyond its quota are evicted first" holds at every moment.
 *
 * Eviction policies (policy.h): the ring is LRU's order. Under SLRU or S3-FIFO
 * (kvp_config.eviction) the ring stays empty and every place that touches it below calls
 * the policy instead, behind one test of kvp__policy_is_lru, so LRU runs the same code as
 * before policies existed (docs/performance.md, "Eviction policies", has the callgrind
 * figures). The free list, the pin counts and the quota lists are the pool's under every
 * policy: free blocks are used before any eviction and pinned blocks are on no list.
 *
 * Retention priorities (retention.c): once a request has carried a kvp_retention, a cached
 * block whose priority is not the default waits on a retention queue instead of the ring
 * (or the policy's lists), marked by the state word KVP__SLOT_RETAINED, and eviction asks
 * retention first (retained_victim). The hot paths test one flag, pool.general (the policy
 * is not LRU, or retention is on), where they tested kvp__policy_is_lru before, and the
 * general cases live in functions of their own: a cache whose requests never carry
 * retention runs LRU's code as before (docs/performance.md, "Retention priorities").
 *
 * Two fast paths skip the per-block hooks above, so each runs only where none applies: on
 * the plain path (LRU, retention never used), kvp__pool_take_n evicts in batches
 * (take_batch: also no quota and no event callback, batch_evictions) and
 * kvp__pool_unpin_tail_first releases in one loop with the ring position in registers
 * (unpin_run: also no quota and no cleaning pass). count_orphans' parent links are recorded
 * once per release call, before either loop; lower tiers hook neither take nor unpin. Under
 * another policy, with no quota and retention never used, takes and unpins call the policy
 * once per batch rather than per block (take_policy_batch, also with no event callback;
 * unpin_policy_run): the same victims and the same order of releases.
 *
 * Costs: pin, unpin and unindex are O(1) (an unpin cleans at most CLEAN_STEP entries);
 * take is O(1) amortized (each stale entry is skipped once); none allocates. The
 * ring costs 8 bytes per block, the state words 4.
 */
#include <assert.h>
#include <string.h>

#include "policy_list.h" /* internal.h, and the policies' inline record updates */

#define CLEAN_STEP 8u /* ring entries cleaned per push during a pass */

static inline uint32_t ring_slot(const kvp__pool *pool, uint64_t pos)
{
    assert(pool->lru_cap > 0);
    return (uint32_t)(pos % pool->lru_cap);
}

/* Is the ring entry at slot s, naming block id, the block's live LRU entry? */
static inline bool ring_live(const kvp__pool *pool, uint32_t id, uint32_t s)
{
    assert(id == KVP_NIL || (id < pool->n_blocks && s < pool->lru_cap));
    return id != KVP_NIL && kvp__lru_entry_live(pool, id, s);
}

/* Clean up to CLEAN_STEP entries of the current pass; end the pass when it reaches the
 * tail. Cannot fail. */
static KVP__ALWAYS_INLINE void ring_clean_step(kvp__pool *pool)
{
    for (unsigned k = 0; k < CLEAN_STEP; k++) {
        if (pool->clean_r == pool->lru_tail) {
            pool->lru_tail = pool->clean_w; /* the gap was the ring's end */
            pool->cleaning = false;
            return;
        }
        uint32_t rs = ring_slot(pool, pool->clean_r++), id = pool->lru[rs];
        if (!ring_live(pool, id, rs))
            continue;
        uint32_t ws = ring_slot(pool, pool->clean_w++);
        pool->lru[ws] = id;
        pool->state[id] = ws;
    }
}

/* Cached block id leaves the LRU order (pinned or uncached): its entry becomes stale, and
 * the block is cached on no slot (KVP__ST_CACHED) until the caller gives it its new state. */
static void lru_remove(kvp__pool *pool, uint32_t id)
{
    uint32_t s = pool->state[id];
    assert(s < pool->lru_cap && pool->lru[s] == id && pool->n_lru > 0);
    (void)s;
    pool->state[id] = KVP__ST_CACHED;
    pool->n_lru--;
}

/* Make indexed, unpinned block id (its state KVP__ST_CACHED, or in use with its last pin
 * being dropped) the most recently used. Cleans first: a pass starts at 3/4 of the ring and
 * always ends before the ring is full. */
static KVP__ALWAYS_INLINE void lru_push_tail(kvp__pool *pool, uint32_t id)
{
    assert(pool->state[id] == KVP__ST_CACHED ||
           pool->state[id] == (KVP__ST_IN_USE | KVP__ST_INDEXED | 1));
    assert(pool->n_lru < pool->n_blocks);
    if (!pool->cleaning && (pool->lru_tail - pool->lru_head) * 4 >= pool->lru_cap * 3) {
        pool->clean_w = pool->clean_r = pool->lru_head;
        pool->cleaning = true;
    }
    if (pool->cleaning)
        ring_clean_step(pool);
    assert(pool->lru_tail - pool->lru_head < pool->lru_cap);
    uint32_t s = ring_slot(pool, pool->lru_tail++);
    pool->lru[s] = id;
    pool->state[id] = s;
    pool->n_lru++;
}

/* The least recently used cached block, removed from the LRU order (its state
 * KVP__ST_CACHED), or KVP_NIL. Inlined:
 * out of line (it has three callers since policies came) it cost 4% of kvp_acquire in
 * workload (c). */
static KVP__ALWAYS_INLINE uint32_t lru_pop_head(kvp__pool *pool)
{
    while (pool->lru_head < pool->lru_tail) {
        if (pool->cleaning && pool->lru_head == pool->clean_w)
            pool->lru_head = pool->clean_w = pool->clean_r; /* jump the gap */
        if (pool->lru_head == pool->lru_tail)
            break;
        uint32_t s = ring_slot(pool, pool->lru_head++), id = pool->lru[s];
        if (pool->cleaning && pool->clean_r < pool->lru_head)
            pool->clean_w = pool->clean_r = pool->lru_head; /* popped past the gap */
        if (ring_live(pool, id, s)) {
            pool->state[id] = KVP__ST_CACHED;
            pool->n_lru--;
            return id;
        }
    }
    return KVP_NIL;
}

/* Block id, just out of the index (its state KVP__ST_FREE: unindex) or a private block
 * losing its last pin, goes on the free list. */
static void free_push(kvp__pool *pool, uint32_t id)
{
    assert(pool->state[id] == KVP__ST_FREE || pool->state[id] == (KVP__ST_IN_USE | 1));
    assert(pool->n_free < pool->n_blocks);
    pool->state[id] = KVP__ST_FREE;
    kvp__block *b = &pool->blocks[id];
    b->next = pool->free_head;
    pool->free_head = id;
    pool->n_free++;
}

/* Allocate the blocks, all free, ids ascending on the free list, and the LRU ring.
 * KVP_OK or KVP_ENOMEM (nothing kept). */
int kvp__pool_init(kvp_cache *cache)
{
    kvp__pool *pool = &cache->pool;
    uint32_t n = cache->cfg.n_blocks;
    memset(pool, 0, sizeof *pool);
    assert(n >= 1 && n <= KVP__POOL_MAX);
    pool->lru_cap = kvp__pool_ring_cap(n);
    pool->blocks_mem = kvp__mem_calloc(&cache->mem, (size_t)n + 1, sizeof(kvp__block));
    pool->state = kvp__mem_alloc(&cache->mem, (size_t)n * sizeof(uint32_t));
    if (pool->blocks_mem) /* one record per cache line: the array starts on a line */
        pool->blocks = (kvp__block *)(void *)((char *)pool->blocks_mem +
                                              (-(uintptr_t)pool->blocks_mem & (KVP__LINE - 1)));
    pool->lru = kvp__mem_alloc(&cache->mem, pool->lru_cap * sizeof(uint32_t));
    if (!pool->blocks || !pool->state || !pool->lru) {
        kvp__pool_free(cache);
        return kvp__fail(KVP_ENOMEM,
                         "out of memory: the pool of %" PRIu32
                         " blocks, their states and its LRU ring (%zu bytes)",
                         n,
                         ((size_t)n + 1) * sizeof(kvp__block) + (size_t)n * sizeof(uint32_t) +
                             (size_t)pool->lru_cap * sizeof(uint32_t));
    }
    pool->n_blocks = n;
    pool->free_head = KVP_NIL;
    pool->general = !kvp__policy_is_lru(cache);
    for (uint32_t i = n; i-- > 0;) {
        pool->state[i] = KVP__ST_FREE;
        free_push(pool, i);
    }
    return KVP_OK;
}

/* Free the block array, the states and the ring (any may be NULL). Cannot fail. */
void kvp__pool_free(kvp_cache *cache)
{
    kvp__pool *pool = &cache->pool;
    kvp__mem_free(&cache->mem, pool->blocks_mem,
                  ((size_t)cache->cfg.n_blocks + 1) * sizeof(kvp__block));
    kvp__mem_free(&cache->mem, pool->state, (size_t)cache->cfg.n_blocks * sizeof(uint32_t));
    kvp__mem_free(&cache->mem, pool->lru, pool->lru_cap * sizeof(uint32_t));
    pool->blocks = NULL;
    pool->blocks_mem = NULL;
    pool->state = NULL;
    pool->lru = NULL;
}

/* Evict cached block id to the free list: the LRU victim of kvp__pool_take, minus the
 * pinning (n_evictions++, KVP_EVENT_REMOVED with KVP_REMOVED_EVICTED). Cannot fail. */
static void evict_to_free(kvp_cache *cache, uint32_t id);

/* A pin of in-use block id under a policy other than LRU: the policy counts the hit (its
 * record update inlined: kvp__pblock_hit). Out of line, taking the cache, so that
 * kvp__pool_pin's LRU path keeps its registers (computing &cache->policy inline cost every
 * pin two instructions on bench_core (c)). */
static KVP__NOINLINE void policy_hit(kvp_cache *cache, uint32_t id)
{
    kvp__pblock_hit(&cache->policy, id);
}

/* The first pin of cached block id, whose state word is w, off the plain LRU path: off its
 * retention queue, the ring or the policy's lists (the policy counts the hit). Out of line
 * for the same reason as policy_hit, and one call rather than two. Cannot fail. */
static KVP__NOINLINE void pin_general(kvp_cache *cache, uint32_t id, uint32_t w)
{
    if (!kvp__policy_is_lru(cache)) {
        if (w == KVP__SLOT_RETAINED)
            kvp__retention_unlink(cache, id);
        kvp__pblock_hit(&cache->policy, id);
    } else if (w == KVP__SLOT_RETAINED) {
        kvp__retention_unlink(cache, id);
    } else {
        lru_remove(&cache->pool, id);
    }
}

/* Pin counts past the state word's (KVP__ST_REF_SAT - 1, about 2^30) live in the record's
 * ref_ext, up to UINT32_MAX - 1 as before the state word (asserted: each pin is a request's
 * block-table entry or a store order, so reaching it takes 2^32 of them). Out of line: only
 * a block pinned 2^30 times gets here. Cannot fail. */
static KVP__NOINLINE void add_pin_saturated(kvp__pool *pool, uint32_t id)
{
    uint32_t w = pool->state[id];
    kvp__block *b = &pool->blocks[id];
    if ((w & KVP__ST_REFS) != KVP__ST_REF_SAT) {
        assert((w & KVP__ST_REFS) == KVP__ST_REF_SAT - 1);
        b->ref_ext = KVP__ST_REF_SAT;
        pool->state[id] = w | KVP__ST_REF_SAT;
        return;
    }
    assert(b->ref_ext >= KVP__ST_REF_SAT && b->ref_ext < UINT32_MAX - 1);
    b->ref_ext++;
}

static KVP__NOINLINE void drop_pin_saturated(kvp__pool *pool, uint32_t id)
{
    kvp__block *b = &pool->blocks[id];
    assert((pool->state[id] & KVP__ST_REFS) == KVP__ST_REF_SAT && b->ref_ext >= KVP__ST_REF_SAT);
    if (--b->ref_ext < KVP__ST_REF_SAT)
        pool->state[id] = (pool->state[id] & ~KVP__ST_REFS) | b->ref_ext;
}

/* One more pin of in-use block id, whose state word is w. Cannot fail. */
static inline void add_pin(kvp__pool *pool, uint32_t id, uint32_t w)
{
    assert(kvp__st_is_in_use(w) && pool->state[id] == w);
    if (KVP__LIKELY((w & KVP__ST_REFS) < KVP__ST_REF_SAT - 1))
        pool->state[id] = w + 1;
    else
        add_pin_saturated(pool, id);
}

/* Drop one pin of in-use block id, whose state word is w; true when it was the last one
 * (the word is then left as it was, for the caller to give the block its next state).
 * Cannot fail. */
static inline bool drop_pin(kvp__pool *pool, uint32_t id, uint32_t w)
{
    assert(kvp__st_is_in_use(w) && pool->state[id] == w);
    uint32_t c = w & KVP__ST_REFS;
    if (c == 1)
        return true;
    if (KVP__LIKELY(c != KVP__ST_REF_SAT))
        pool->state[id] = w - 1;
    else
        drop_pin_saturated(pool, id);
    return false;
}

/* Add a pin to block id. A cached block leaves the LRU order. Only indexed or already
 * pinned blocks may be pinned (free blocks are handed out by kvp__pool_take). Cannot fail. */
void kvp__pool_pin(kvp_cache *cache, uint32_t id)
{
    kvp__pool *pool = &cache->pool;
    assert(id < pool->n_blocks);
    uint32_t w = pool->state[id];
    assert(kvp__st_is_indexed(w) || kvp__st_is_in_use(w));
    if (!kvp__st_is_in_use(w)) {
        if (kvp__quotas_on(cache))
            kvp__quota_unlink(cache, id);
        if (KVP__LIKELY(kvp__pool_plain(cache)))
            lru_remove(pool, id);
        else
            pin_general(cache, id, w);
        pool->state[id] = KVP__ST_IN_USE | KVP__ST_INDEXED | 1;
        pool->n_in_use++;
    } else {
        add_pin(pool, id, w);
        if (!kvp__policy_is_lru(cache))
            policy_hit(cache, id);
    }
}

/* Add a pin that is not a use to block id, which a request holds (in use): a tier store
 * order's (tier_orders.c), so that the block is neither evicted nor reused under the copy.
 * The policy counts no hit. Cannot fail. */
void kvp__pool_hold(kvp_cache *cache, uint32_t id)
{
    assert(id < cache->pool.n_blocks && kvp__block_is_in_use(&cache->pool, id));
    add_pin(&cache->pool, id, cache->pool.state[id]);
}

/* Drop one pin of block id, block depth of its chain. At zero, an indexed block becomes the
 * most recently used cached block (lru: the constant kvp__policy_is_lru, so that each
 * caller's loop is compiled once per case) and a private one returns to the free list. With
 * retain (a constant too: kvp__retention_on), the releasing request's retention is noted
 * first and a block of non-default priority joins its retention queue instead. With quotas,
 * a namespace that now holds more cached blocks than its quota loses its least recently used one
 * (evicted to the free list). Cannot fail. */
static KVP__ALWAYS_INLINE void unpin(kvp_cache *cache, uint32_t id, uint32_t depth, bool lru,
                                     bool retain)
{
    kvp__pool *pool = &cache->pool;
    assert(id < pool->n_blocks);
    uint32_t w = pool->state[id];
    assert(kvp__st_is_in_use(w));
    if (retain && (w & KVP__ST_INDEXED))
        kvp__retention_note(cache, id, depth);
    if (!drop_pin(pool, id, w))
        return;
    assert(pool->n_in_use > 0);
    pool->n_in_use--;
    if (!(w & KVP__ST_INDEXED)) { /* in use: the bit says */
        free_push(pool, id);
        return;
    }
    pool->state[id] = KVP__ST_CACHED;
    if (retain && kvp__retention_queue(cache, id, depth))
        ; /* on its retention queue */
    else if (lru)
        lru_push_tail(pool, id);
    else
        kvp__policy_release(&cache->policy, id, depth);
    if (kvp__quotas_on(cache)) {
        kvp__quota_link(cache, id);
        uint32_t victim = kvp__quota_victim(cache, id);
        if (victim != KVP_NIL)
            evict_to_free(cache, victim);
    }
}

/* Drop a pin of block id (state word w) that does not make it cached: a private block's
 * last pin frees it (returns 1, one block fewer in use), any other pin only lowers the
 * count (returns 0). Shared by the release loops (unpin_run, unpin_policy_run). Cannot
 * fail. */
static KVP__ALWAYS_INLINE uint32_t drop_uncached_pin(kvp__pool *pool, uint32_t id, uint32_t w)
{
    if (w == (KVP__ST_IN_USE | 1)) { /* a private block's last pin */
        free_push(pool, id);
        return 1;
    }
    bool last = drop_pin(pool, id, w);
    assert(!last);
    (void)last;
    return 0;
}

/* kvp__pool_unpin_tail_first on the plain LRU path (retention never used: unpin's
 * retention hooks are not here) when no quota applies and the n pushes cannot start a
 * cleaning pass (none runs, and the ring stays under 3/4 full): the same stores as n
 * unpins, with the ring position and the counts in registers (per block, unpin reloaded
 * them and tested for a pass). A hook added to unpin() must go here too, or into the gate
 * in kvp__pool_unpin_tail_first. Cannot fail. */
static void unpin_run(kvp__pool *pool, const uint32_t *ids, uint32_t n)
{
    uint32_t *const state = pool->state;
    uint32_t *const ring = pool->lru;
    const uint32_t cap = (uint32_t)pool->lru_cap;
    uint64_t tail = pool->lru_tail;
    uint32_t s = ring_slot(pool, tail), n_unpinned = 0, n_cached = 0;
    for (uint32_t i = n; i-- > 0;) {
        if (i >= 8)
            KVP__PREFETCH_W(&state[ids[i - 8]]);
        uint32_t id = ids[i];
        assert(id < pool->n_blocks);
        uint32_t w = state[id];
        if (KVP__LIKELY(w == (KVP__ST_IN_USE | KVP__ST_INDEXED | 1))) { /* its last pin */
            assert(s == ring_slot(pool, tail + n_cached));
            ring[s] = id;
            state[id] = s;
            n_cached++;
            if (++s == cap)
                s = 0;
        } else {
            n_unpinned += drop_uncached_pin(pool, id, w);
        }
    }
    n_unpinned += n_cached;
    tail += n_cached;
    assert(pool->n_in_use >= n_unpinned && tail - pool->lru_head < pool->lru_cap);
    pool->lru_tail = tail;
    pool->n_in_use -= n_unpinned;
    pool->n_lru += n_cached;
}

/* Drop one pin of each of ids[0 .. n), last first, so that a chain's tail becomes less
 * recently used than its parents and is evicted before them. One call per request rather
 * than per block (the call cost 12% of kvp_release in workload (c)); blocks a few steps
 * ahead are prefetched, since a long-running request's blocks have usually left the CPU
 * cache by the time it ends. ids[i] is block i of its chain (a request's block table, or
 * kvp_access's blocks), which tells a policy the block's depth. The policy is tested once
 * per call, not per block: a test per block cost LRU 6% of kvp_release's instructions in
 * workload (c). Cannot fail. */
static void unpin_general(kvp_cache *cache, const uint32_t *ids, uint32_t n);

void kvp__pool_unpin_tail_first(kvp_cache *cache, const uint32_t *ids, uint32_t n)
{
    if (!KVP__LIKELY(kvp__pool_plain(cache))) {
        unpin_general(cache, ids, n);
        return;
    }
    /* kvp_config.count_orphans (policy.c): the parent links, recorded before any block is
     * released, on the fast path (unpin_run) as on the loop below. */
    if (cache->policy.link)
        kvp__policy_link(cache, ids, n);
    kvp__pool *pool = &cache->pool;
    if (!kvp__quotas_on(cache) && !pool->cleaning &&
        (pool->lru_tail - pool->lru_head + n) * 4 < pool->lru_cap * 3) {
        unpin_run(pool, ids, n);
        return;
    }
    for (uint32_t i = n; i-- > 0;) {
        if (i >= 8)
            KVP__PREFETCH_W(&cache->pool.state[ids[i - 8]]);
        unpin(cache, ids[i], i, true, false);
    }
}

/* n unpins under a policy other than LRU with no quota and retention never used, the same
 * releases in the same order as n unpins (kvp__policy_release each). Nothing else happens
 * between two releases (no quota eviction), and the free list and pin counts the pool
 * updates in between are not the policy's, so the result is that of n unpins. Every such
 * policy walks the chain itself (kvp__policy_unpins): from the tail, it makes each block
 * that loses its last pin and is indexed cached and releases it (kvp__policy_unpin_run), in
 * one walk; at a block that does not become cached it stops, the pool drops that pin (a
 * private block's last one: to the free list) and the walk goes on below it.
 * A hook added to unpin() must go here too, or into the gate in unpin_general. Cannot fail. */
static void unpin_policy_run(kvp_cache *cache, const uint32_t *ids, uint32_t n)
{
    kvp__pool *pool = &cache->pool;
    uint32_t *const state = pool->state;
    uint32_t n_unpinned = 0;
    assert(kvp__policy_unpins(&cache->policy));
    for (uint32_t hi = n; hi > 0;) {
        uint32_t lo = kvp__policy_unpin_run(&cache->policy, state, ids, hi);
        n_unpinned += hi - lo;
        if (lo == 0)
            break;
        uint32_t id = ids[--lo], w = state[id];
        assert(id < pool->n_blocks && w != (KVP__ST_IN_USE | KVP__ST_INDEXED | 1));
        n_unpinned += drop_uncached_pin(pool, id, w);
        hi = lo;
    }
    assert(pool->n_in_use >= n_unpinned);
    pool->n_in_use -= n_unpinned;
}

/* kvp__pool_unpin_tail_first off the plain LRU path: another policy, or retention on (then
 * the pending options are noted on each block). Cannot fail. */
static void unpin_general(kvp_cache *cache, const uint32_t *ids, uint32_t n)
{
    if (cache->policy.link) /* kvp_config.count_orphans (policy.c) */
        kvp__policy_link(cache, ids, n);
    if (!kvp__policy_is_lru(cache))
        kvp__policy_release_begin(&cache->policy, ids, n);
    if (!kvp__retention_on(cache) && !kvp__quotas_on(cache)) {
        unpin_policy_run(cache, ids, n);
    } else if (!kvp__retention_on(cache)) {
        for (uint32_t i = n; i-- > 0;)
            unpin(cache, ids[i], i, false, false);
    } else if (kvp__policy_is_lru(cache)) {
        for (uint32_t i = n; i-- > 0;)
            unpin(cache, ids[i], i, true, true);
    } else {
        for (uint32_t i = n; i-- > 0;)
            unpin(cache, ids[i], i, false, true);
    }
}

/* Drop a pin that no request's release accounts for (kvp__pool_hold's) from block id,
 * block depth of its chain. When it was the last pin the block is released alone at its
 * own depth: its parent link (count_orphans) stays as its request's release recorded it,
 * a retention the request set was noted then, and CDECAY sees a chain of one. Cannot
 * fail. */
void kvp__pool_unhold(kvp_cache *cache, uint32_t id, uint32_t depth)
{
    if (KVP__LIKELY(kvp__pool_plain(cache))) {
        unpin(cache, id, depth, true, false);
        return;
    }
    bool lru = kvp__policy_is_lru(cache);
    if (!lru && kvp__block_ref(&cache->pool, id) == 1)
        kvp__policy_release_begin(&cache->policy, &id, 1);
    unpin(cache, id, depth, lru, kvp__retention_on(cache));
}

/* Cached block id, whose retention lapsed (retention.c), joins the policy's order as a
 * block of default priority released now, at chain depth depth. Cannot fail. */
void kvp__pool_requeue(kvp_cache *cache, uint32_t id, uint32_t depth)
{
    assert(cache->pool.state[id] == KVP__ST_CACHED);
    if (kvp__policy_is_lru(cache)) {
        lru_push_tail(&cache->pool, id);
        return;
    }
    /* Released alone: CDECAY must not close it into the chain released just before (its
     * step 3, policy_cdecay.c), nor that chain's next block into it. */
    kvp__policy *p = &cache->policy;
    uint32_t chain_depth = p->cd_chain_depth;
    int64_t chain_key = p->cd_chain_key;
    uint8_t chain_list = p->cd_chain_list;
    p->cd_chain_depth = UINT32_MAX;
    kvp__policy_release(&cache->policy, id, depth);
    p->cd_chain_depth = chain_depth;
    p->cd_chain_key = chain_key;
    p->cd_chain_list = chain_list;
}

/* Evict group g's least recently used cached blocks until it is within its quota. Cannot
 * fail. */
void kvp__pool_enforce_quota(kvp_cache *cache, kvp__qgroup *g)
{
    while (g->n_cached > g->quota)
        evict_to_free(cache,
                      kvp__retention_on(cache) ? kvp__retention_group_victim(cache, g) : g->head);
}

/* Remove block id from the index and emit KVP_EVENT_REMOVED with reason. The block was
 * indexed: in use (it stays in use, private), or cached and off its list (it becomes
 * KVP__ST_FREE, for free_push), or just taken by an eviction (in use, private already). */
static void unindex(kvp_cache *cache, uint32_t id, int reason)
{
    kvp__block *b = &cache->pool.blocks[id];
    uint32_t w = cache->pool.state[id];
    assert(kvp__st_is_in_use(w) || w == KVP__ST_CACHED);
    cache->pool.state[id] = kvp__st_is_in_use(w) ? w & ~KVP__ST_INDEXED : KVP__ST_FREE;
    kvp_event ev = {0};
    ev.type = KVP_EVENT_REMOVED;
    ev.reason = reason;
    ev.block_id = id;
    ev.key = b->key;
    kvp__index_del(&cache->index, b);
    if (kvp__verifying(cache))
        kvp__verify_forget(cache, id);
    if (kvp__quotas_on(cache))
        kvp__quota_untag(cache, id);
    kvp__emit(cache, &ev);
}

/* Remove cached (unpinned, indexed) block id from the index and the LRU ring, and leave it
 * unlinked and unpinned (the caller pins it or puts it on the free list). Cannot fail. */
static void uncache(kvp_cache *cache, uint32_t id, int reason)
{
    assert(kvp__block_is_cached(&cache->pool, id));
    if (kvp__quotas_on(cache))
        kvp__quota_unlink(cache, id);
    if (KVP__LIKELY(kvp__pool_plain(cache)))
        lru_remove(&cache->pool, id);
    else if (cache->pool.state[id] == KVP__SLOT_RETAINED)
        kvp__retention_unlink(cache, id);
    else if (kvp__policy_is_lru(cache))
        lru_remove(&cache->pool, id);
    else
        kvp__policy_unlink(&cache->policy, id);
    assert(cache->pool.state[id] == KVP__ST_CACHED);
    if (!KVP__LIKELY(!kvp__retention_on(cache)))
        kvp__retention_forget(cache, id);
    unindex(cache, id, reason);
}

static void evict_to_free(kvp_cache *cache, uint32_t id)
{
    cache->stats.n_evictions++;
    uncache(cache, id, KVP_REMOVED_EVICTED);
    free_push(&cache->pool, id);
}

/* Prefetch what evicting cached block id will touch: its neighbours in the bucket chain,
 * whose links kvp__index_unlink rewrites (the index keeps no other list), and its bucket
 * when it heads the chain (no other unlink touches the bucket: index.c).
 * Reads block id itself, which should have been prefetched a few evictions earlier. */
static void prefetch_eviction(const kvp_cache *cache, uint32_t id)
{
    const kvp__block *b = &cache->pool.blocks[id];
    const UT_hash_table *tbl = cache->index.head->hh.tbl;
    if (b->hh.hh_prev)
        KVP__PREFETCH_W(b->hh.hh_prev);
    else
        KVP__PREFETCH_W(&tbl->buckets[b->hh.hashv & (tbl->num_buckets - 1)]);
    if (b->hh.hh_next)
        KVP__PREFETCH_W(b->hh.hh_next);
}

#define EVICT_AHEAD 16 /* ring entries ahead of the head whose blocks are prefetched */

/* The ring position k entries after the head, counting over a cleaning pass's gap (whose
 * stale entries the next pops jump), so that prefetching during a pass fetches the next
 * victims rather than stale entries. Cannot fail. */
static inline uint64_t ring_ahead(const kvp__pool *pool, uint64_t k)
{
    uint64_t p = pool->lru_head + k;
    if (pool->cleaning && pool->lru_head <= pool->clean_w && p >= pool->clean_w)
        p += pool->clean_r - pool->clean_w;
    return p;
}

/* The victim once retention is on: the oldest block of the lowest non-empty retention queue
 * below the default priority, else the policy's victim, else the oldest block of the lowest
 * queue above the default; lapsed priorities are first moved to the policy's order
 * (kvp__retention_refresh). The victim's record is cleared. KVP_NIL when nothing is cached.
 * Cannot fail. */
static uint32_t retained_victim(kvp_cache *cache, bool lru);

/* kvp__pool_take for a policy known at compile time (lru: kvp__policy_is_lru; retain:
 * kvp__retention_on). */
static KVP__ALWAYS_INLINE uint32_t take(kvp_cache *cache, bool lru, bool retain)
{
    kvp__pool *pool = &cache->pool;
    uint32_t id = pool->free_head;
    bool evicted = id == KVP_NIL;
    if (!evicted) {
        assert(id < pool->n_blocks && pool->n_free > 0);
        assert(kvp__block_is_free(pool, id));
        pool->free_head = pool->blocks[id].next;
        pool->n_free--;
        pool->blocks[id].next = KVP_NIL;
    } else if ((id = retain ? retained_victim(cache, lru)
                     : lru  ? lru_pop_head(pool)
                            : kvp__policy_evict(&cache->policy)) == KVP_NIL) {
        return KVP_NIL;
    }
    if (!lru)
        kvp__pblock_taken(&cache->policy, id);
    assert(evicted ? pool->state[id] == KVP__ST_CACHED : kvp__block_is_free(pool, id));
    pool->state[id] = KVP__ST_IN_USE | 1;
    pool->n_in_use++;
    if (evicted && kvp__quotas_on(cache))
        kvp__quota_unlink(cache, id);
    if (evicted) {
        /* Counted and pinned before the event, so the cache is consistent when it fires. */
        cache->stats.n_evictions++;
        unindex(cache, id, KVP_REMOVED_EVICTED);
    }
    return id;
}

static uint32_t retained_victim(kvp_cache *cache, bool lru)
{
    kvp__retention_refresh(cache);
    uint32_t id = kvp__retention_pop(cache, true);
    if (id == KVP_NIL)
        id = lru ? lru_pop_head(&cache->pool) : kvp__policy_evict(&cache->policy);
    if (id == KVP_NIL)
        id = kvp__retention_pop(cache, false);
    if (id != KVP_NIL)
        kvp__retention_forget(cache, id);
    return id;
}

/* kvp__pool_take off the plain LRU path. */
static uint32_t take_general(kvp_cache *cache)
{
    if (!kvp__retention_on(cache))
        return take(cache, false, false);
    return kvp__policy_is_lru(cache) ? take(cache, true, true) : take(cache, false, true);
}

/* Hand out one block, pinned once (ref == 1) and not indexed: the free-list head if any,
 * else the policy's victim (under LRU the least recently used cached block), evicted
 * (n_evictions++, KVP_EVENT_REMOVED with KVP_REMOVED_EVICTED). Returns KVP_NIL when neither
 * exists; the caller checks kvp__pool_available first. */
uint32_t kvp__pool_take(kvp_cache *cache)
{
    return KVP__LIKELY(kvp__pool_plain(cache)) ? take(cache, true, false) : take_general(cache);
}

/* May kvp__pool_take_n evict in batches (take_batch)? Only on the plain LRU path (LRU, and
 * retention never used: take_batch has none of take's policy, retention or quota hooks) with
 * no quotas and no event callback: then nothing can observe the cache between a batch's
 * pops and its unlinks, and the result is exactly that of one take per block. Lower tiers
 * add no hook to take (a store order only pins its device block, kvp__pool_pin, and unpins
 * it through kvp__pool_unpin_tail_first), nor does count_orphans (its links are recorded
 * at release, in kvp__pool_unpin_tail_first, and read on demand), so neither needs a
 * condition here. A hook added to take() or unindex() must go into take_batch too, or
 * become a condition here. Cannot fail. */
static inline bool batch_evictions(const kvp_cache *cache)
{
    return kvp__pool_plain(cache) && !kvp__quotas_on(cache) && !cache->cfg.on_event;
}

#define EVICT_BATCH 16 /* victims popped, prefetched and unlinked together */

/* Evict the n least recently used cached blocks into ids[] (the free list is empty, and n
 * cached blocks exist), pinned once, as n calls of take would, in batches:
 *   1. pop a batch of live entries from the ring head (their blocks were prefetched by the
 *      previous batch's step 3, so those misses overlap);
 *   2. prefetch each victim's bucket and chain neighbours, which its unlink rewrites;
 *   3. prefetch the blocks of the next batch's ring entries;
 *   4. unlink the batch from the index and pin each victim.
 * The index's chains end as with one take at a time (unlinks commute), the ring and its
 * cleaning pass move exactly as they would, and no event is built (batch_evictions).
 * Callgrind, bench_core (c): see docs/performance.md ("The pool at memory speed, part 2"). */
static void take_batch(kvp_cache *cache, uint32_t *ids, uint32_t n)
{
    kvp__pool *pool = &cache->pool;
    kvp__block *const blocks = pool->blocks;
    uint32_t *const state = pool->state;
    UT_hash_table *const tbl = cache->index.head->hh.tbl;
    const bool verifying = kvp__verifying(cache);
    for (uint32_t i0 = 0; i0 < n; i0 += EVICT_BATCH) {
        uint32_t m = n - i0 < EVICT_BATCH ? n - i0 : EVICT_BATCH;
        /* Step 1: pop (outside a cleaning pass with the ring position in registers: the
         * same entries lru_pop_head would pop, without its gap tests). */
        if (pool->cleaning) {
            for (uint32_t k = 0; k < m; k++) {
                uint32_t id = lru_pop_head(pool);
                assert(id != KVP_NIL);
                state[id] = KVP__ST_IN_USE | 1;
                ids[i0 + k] = id;
            }
        } else {
            const uint32_t *const ring = pool->lru;
            uint64_t head = pool->lru_head;
            uint32_t s = ring_slot(pool, head), cap = (uint32_t)pool->lru_cap;
            for (uint32_t k = 0; k < m;) {
                assert(head < pool->lru_tail && s == ring_slot(pool, head));
                uint32_t id = ring[s], at = s;
                head++;
                if (++s == cap)
                    s = 0;
                /* A block's state word is a slot only while it is cached there
                 * (internal.h): the word alone tells a live entry from a stale one,
                 * without reading the block's record. The victim is taken at once
                 * (in use, private: nothing observes it before its unlink below). */
                if (id != KVP_NIL && state[id] == at) {
                    state[id] = KVP__ST_IN_USE | 1;
                    ids[i0 + k++] = id;
                }
            }
            pool->lru_head = head;
            pool->n_lru -= m;
        }
        /* Step 2: what the unlinks write. */
        for (uint32_t k = 0; k < m; k++)
            prefetch_eviction(cache, ids[i0 + k]);
        /* Step 3: the next victims' blocks (stale entries included: reading ahead of the
         * liveness test is what lets the misses overlap; the test itself reads only the
         * state word). */
        for (uint64_t k = 0; k < EVICT_BATCH; k++) {
            uint64_t p = ring_ahead(pool, k);
            if (p >= pool->lru_tail)
                break;
            KVP__PREFETCH_W(&blocks[pool->lru[ring_slot(pool, p)]]);
        }
        /* Step 4: unlink and pin. */
        for (uint32_t k = 0; k < m; k++) {
            uint32_t id = ids[i0 + k];
            kvp__block *b = &blocks[id];
            assert(state[id] == (KVP__ST_IN_USE | 1));
            kvp__index_unlink(&cache->index, tbl, b);
            if (verifying)
                kvp__verify_forget(cache, id);
        }
        pool->n_in_use += m;
        cache->stats.n_evictions += m;
    }
}

/* Evict n cached blocks into ids[] under a policy other than LRU (the free list is empty, n
 * cached blocks exist, retention was never used, no quota, no event callback), pinned once,
 * as n calls of take would: the policy hands out its n victims in one call
 * (kvp__policy_evict_n: the same victims in the same order, its records as taken leaves
 * them), then each leaves the index. Nothing can observe the cache in between (no callback),
 * and the policy reads no pool state but the victims' keys, which leaving the index keeps.
 * A hook added to take() or unindex() must go here too, or become a condition in
 * kvp__pool_take_n. Cannot fail. */
static KVP__NOINLINE void take_policy_batch(kvp_cache *cache, uint32_t *ids, uint32_t n)
{
    kvp__pool *pool = &cache->pool;
    kvp__block *const blocks = pool->blocks;
    UT_hash_table *const tbl = cache->index.head->hh.tbl;
    const bool verifying = kvp__verifying(cache);
    uint32_t *const state = pool->state;
    kvp__policy_evict_n(&cache->policy, ids, n);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t id = ids[k];
        assert(state[id] == KVP__ST_CACHED);
        state[id] = KVP__ST_IN_USE | 1;
        kvp__index_unlink(&cache->index, tbl, &blocks[id]);
    }
    if (verifying) /* after the unlinks: verify's forget reads neither the index nor the state */
        for (uint32_t k = 0; k < n; k++)
            kvp__verify_forget(cache, ids[k]);
    pool->n_in_use += n;
    cache->stats.n_evictions += n;
}

/* Hand out up to n free blocks into ids[] under a policy other than LRU, each pinned once
 * and taken by the policy (its record fresh: kvp__pblock_taken), as take would, with the
 * counts updated once: the number handed out (n, or fewer when the free list runs out).
 * Cannot fail. */
static uint32_t take_policy_free(kvp_cache *cache, uint32_t *ids, uint32_t n)
{
    kvp__pool *pool = &cache->pool;
    kvp__block *const blocks = pool->blocks;
    uint32_t *const state = pool->state;
    uint32_t i = 0, id = pool->free_head;
    for (; i < n && id != KVP_NIL; i++) {
        assert(id < pool->n_blocks && kvp__block_is_free(pool, id));
        uint32_t next = blocks[id].next;
        blocks[id].next = KVP_NIL;
        kvp__pblock_taken(&cache->policy, id);
        state[id] = KVP__ST_IN_USE | 1;
        ids[i] = id;
        id = next;
    }
    assert(pool->n_free >= i);
    pool->free_head = id;
    pool->n_free -= i;
    pool->n_in_use += i;
    return i;
}

/* Hand out n blocks into ids[], like n calls of kvp__pool_take (the caller checked that
 * kvp__pool_available >= n): free blocks first, then evictions, in batches when
 * batch_evictions allows. Otherwise, while evicting, the blocks EVICT_AHEAD entries ahead
 * in the ring are prefetched, and the dependents of those half as far ahead (by then their
 * block has arrived), so the misses of several evictions overlap. Cannot fail. */
void kvp__pool_take_n(kvp_cache *cache, uint32_t *ids, uint32_t n)
{
    kvp__pool *pool = &cache->pool;
    assert(kvp__pool_available(pool) >= n);
    if (!KVP__LIKELY(kvp__pool_plain(cache))) {
        if (kvp__retention_on(cache)) {
            for (uint32_t i = 0; i < n; i++)
                ids[i] = take_general(cache);
        } else if (!kvp__quotas_on(cache) && !cache->cfg.on_event) {
            uint32_t i = take_policy_free(cache, ids, n);
            if (i < n)
                take_policy_batch(cache, ids + i, n - i);
        } else {
            for (uint32_t i = 0; i < n; i++)
                ids[i] = take(cache, false, false);
        }
        return;
    }
    if (batch_evictions(cache)) {
        uint32_t i = 0;
        for (; i < n && pool->free_head != KVP_NIL; i++)
            ids[i] = take(cache, true, false);
        if (i < n)
            take_batch(cache, ids + i, n - i);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (pool->free_head == KVP_NIL) {
            uint64_t far = ring_ahead(pool, EVICT_AHEAD), near = ring_ahead(pool, EVICT_AHEAD / 2);
            uint32_t far_id = far < pool->lru_tail ? pool->lru[ring_slot(pool, far)] : KVP_NIL;
            uint32_t near_id = near < pool->lru_tail ? pool->lru[ring_slot(pool, near)] : KVP_NIL;
            if (far_id != KVP_NIL)
                KVP__PREFETCH_W(&pool->blocks[far_id]);
            if (near_id != KVP_NIL)
                prefetch_eviction(cache, near_id);
        }
        ids[i] = take(cache, true, false);
    }
}

/* Take block id out of the index (reset, or a verify-mode replacement), emitting
 * KVP_EVENT_REMOVED with reason. A cached block returns to the free list; a pinned one stays
 * with its requests as a private block and returns to the free list on its last unpin.
 * Cannot fail. */
void kvp__pool_unindex(kvp_cache *cache, uint32_t id, int reason)
{
    assert(id < cache->pool.n_blocks && kvp__block_is_indexed(&cache->pool, id));
    if (kvp__block_is_cached(&cache->pool, id)) {
        uncache(cache, id, reason);
        free_push(&cache->pool, id);
        return;
    }
    if (kvp__retention_on(cache))
        kvp__retention_forget(cache, id);
    unindex(cache, id, reason);
}

/* Drop every cached, unpinned block, least recently used first (under another policy, list
 * by list, each from its head, with no policy side effect such as a ghost entry): each leaves the
 * index (KVP_EVENT_REMOVED with reason) and returns to the free list. Cannot fail. */
void kvp__pool_drop_cached(kvp_cache *cache, int reason)
{
    uint32_t id;
    bool lru = kvp__policy_is_lru(cache);
    while ((id = lru ? lru_pop_head(&cache->pool) : kvp__policy_drop_one(&cache->policy)) !=
           KVP_NIL) {
        if (kvp__quotas_on(cache))
            kvp__quota_unlink(cache, id);
        if (kvp__retention_on(cache))
            kvp__retention_forget(cache, id);
        unindex(cache, id, reason);
        free_push(&cache->pool, id);
    }
    while (kvp__retention_on(cache) && (id = kvp__retention_drop_one(cache)) != KVP_NIL) {
        if (kvp__quotas_on(cache))
            kvp__quota_unlink(cache, id);
        kvp__retention_forget(cache, id);
        unindex(cache, id, reason);
        free_push(&cache->pool, id);
    }
    assert(cache->pool.n_lru == 0 && cache->pool.lru_head == cache->pool.lru_tail);
    assert(cache->pool.n_retained == 0);
}
