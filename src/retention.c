/*
 * retention.c - retention priorities: which cached blocks a request asked the pool to keep
 * longer (or drop sooner), in the manner of TensorRT-LLM's KvCacheRetentionConfig
 * (kvprefix.h, "Retention priorities", gives the contract; docs/design.md the reasons).
 *
 *   record[b]   (prio[b], expire[b])   prio KVP__PRIO_UNSET or 0..100; expire 0: never
 *   q[0..34]    head -> .. -> tail     cached blocks below the default, oldest release first
 *   policy      the ring (LRU) or the policy's lists: every cached block of default priority
 *   q[36..100]  head -> .. -> tail     cached blocks above the default
 *   heap        the queued blocks whose record lapses, min (expire, seq) on top
 *   by_req      uthash: options of active requests (kvp_request_set_retention)
 *
 * Eviction (pool.c, retained_victim) takes the head of the lowest non-empty queue below 35,
 * else the policy's victim, else the head of the lowest non-empty queue above 35. Within a
 * non-default priority the order is least recently released first: the policy orders only
 * the default blocks (most blocks), so SLRU or S3-FIFO keep their own state untouched.
 *
 * Records. The effective priority of block b at retention-clock time t is prio[b] when it is
 * set and (expire[b] == 0 or t < expire[b]), else the default 35. A request with options
 * that releases b (kvp_release, or kvp_access_retained's final unpin) notes its priority q
 * for b (kvp__retention_note): the highest priority of its ranges covering all of b's
 * tokens, else its own priority, with that source's duration d. If b's effective record is
 * unset or below q, the record becomes (q, t + d); if equal, the later expiry is kept (0
 * counts as latest); if above, nothing changes. A record is cleared when b leaves the index
 * and when it lapses. The clock t is kvp_stats.n_requests: durations count requests.
 *
 * Lapses are lazy: before each eviction kvp__retention_refresh moves every queued block whose
 * record has lapsed to the policy's order (as a default block released then), in
 * (expire, seq) order, clearing its record. A lapsed block not yet moved still sits on its
 * queue; the quota victim and kvp_block_retention read effective priorities directly.
 *
 * Invariants (kvp__retention_check): off, nothing is allocated, no block is marked and
 * pool.n_retained is 0. On: a block is on a queue iff its state word is KVP__SLOT_RETAINED;
 * queued blocks are cached, their record set and not 35, on queue q[prio[b]]; each queue is
 * doubly linked without a cycle, its n is its length, its nonempty bit says n > 0, and the
 * lengths sum to pool.n_retained; an unindexed block has no record; the heap holds exactly
 * the queued blocks with expire != 0, each once, hpos naming its slot, parents ordered
 * before children; no options are pending between calls; every options record names an
 * active request.
 *
 * Cost: nothing until a request carries retention. Then 37 bytes per pool block (allocated
 * once, at the first kvp_request_set_retention or kvp_access_retained), O(1) queue updates
 * per pin and release, O(log n) per heap update, O(n_ranges) per noted block, and per quota
 * eviction a walk of the scope's cached blocks (it stops at the first of priority 0).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#undef uthash_malloc
#undef uthash_free
#define uthash_malloc(sz)    kvp__mem_alloc(&cache->mem, (sz))
#define uthash_free(ptr, sz) kvp__mem_free(&cache->mem, (ptr), (sz))

#define DEFAULT_PRIO KVP_RETENTION_PRIORITY_DEFAULT

static inline uint64_t clock_now(const kvp_cache *cache)
{
    return cache->stats.n_requests;
}

/* Block id's effective priority at time now: 0..100. Cannot fail. */
static inline uint32_t effective(const kvp__retention *r, uint32_t id, uint64_t now)
{
    uint8_t p = r->prio[id];
    if (p == KVP__PRIO_UNSET || (r->expire[id] != 0 && now >= r->expire[id]))
        return DEFAULT_PRIO;
    return p;
}

static inline bool is_set(const kvp__retention *r, uint32_t id, uint64_t now)
{
    return r->prio[id] != KVP__PRIO_UNSET && (r->expire[id] == 0 || now < r->expire[id]);
}

KVP_EXPORT void kvp_retention_init(kvp_retention *r)
{
    if (!r)
        return;
    memset(r, 0, sizeof *r);
    r->priority = KVP_RETENTION_PRIORITY_DEFAULT;
}

/* ---------------------------------------------------------------- allocation */

static size_t per_block_bytes(void)
{
    return sizeof(uint8_t) + 2 * sizeof(uint64_t) + 5 * sizeof(uint32_t);
}

/* Free the arrays and every options record; retention is off afterwards. Cannot fail. */
void kvp__retention_free(kvp_cache *cache)
{
    kvp__retention *r = &cache->retention;
    size_t n = cache->cfg.n_blocks;
    kvp__ropts *o, *tmp;
    HASH_ITER(hh, r->by_req, o, tmp)
    {
        HASH_DELETE(hh, r->by_req, o);
        kvp__mem_free(&cache->mem, o, sizeof *o + o->n_ranges * sizeof(kvp_retention_range));
    }
    kvp__mem_free(&cache->mem, r->prio, r->prio ? n * sizeof *r->prio : 0);
    kvp__mem_free(&cache->mem, r->expire, r->expire ? n * sizeof *r->expire : 0);
    kvp__mem_free(&cache->mem, r->seq, r->seq ? n * sizeof *r->seq : 0);
    kvp__mem_free(&cache->mem, r->prev, r->prev ? n * sizeof *r->prev : 0);
    kvp__mem_free(&cache->mem, r->next, r->next ? n * sizeof *r->next : 0);
    kvp__mem_free(&cache->mem, r->depth, r->depth ? n * sizeof *r->depth : 0);
    kvp__mem_free(&cache->mem, r->hpos, r->hpos ? n * sizeof *r->hpos : 0);
    kvp__mem_free(&cache->mem, r->heap, r->heap ? n * sizeof *r->heap : 0);
    memset(r, 0, sizeof *r);
    cache->pool.general = !kvp__policy_is_lru(cache);
}

/* Turn retention on (allocate the arrays) unless it is. KVP_OK or KVP_ENOMEM (still off). */
static int enable(kvp_cache *cache)
{
    kvp__retention *r = &cache->retention;
    if (r->on)
        return KVP_OK;
    size_t n = cache->cfg.n_blocks;
    r->prio = kvp__mem_alloc(&cache->mem, n * sizeof *r->prio);
    r->expire = kvp__mem_calloc(&cache->mem, n, sizeof *r->expire);
    r->seq = kvp__mem_calloc(&cache->mem, n, sizeof *r->seq);
    r->prev = kvp__mem_alloc(&cache->mem, n * sizeof *r->prev);
    r->next = kvp__mem_alloc(&cache->mem, n * sizeof *r->next);
    r->depth = kvp__mem_calloc(&cache->mem, n, sizeof *r->depth);
    r->hpos = kvp__mem_alloc(&cache->mem, n * sizeof *r->hpos);
    r->heap = kvp__mem_alloc(&cache->mem, n * sizeof *r->heap);
    if (!r->prio || !r->expire || !r->seq || !r->prev || !r->next || !r->depth || !r->hpos ||
        !r->heap) {
        kvp__retention_free(cache);
        return kvp__fail(KVP_ENOMEM,
                         "out of memory: the retention records of %zu blocks (%zu bytes)", n,
                         n * per_block_bytes());
    }
    memset(r->prio, KVP__PRIO_UNSET, n * sizeof *r->prio);
    for (size_t i = 0; i < n; i++) {
        r->prev[i] = r->next[i] = r->hpos[i] = KVP_NIL;
    }
    for (int p = 0; p < (int)KVP__N_PRIO; p++)
        r->q[p].head = r->q[p].tail = KVP_NIL;
    r->on = true;
    cache->pool.general = true;
    return KVP_OK;
}

/* ---------------------------------------------------------------- options */

/* Validate r for a prompt of n_tokens tokens. KVP_OK or KVP_EINVAL (naming the field). */
static int check_options(const kvp_retention *r, uint64_t n_tokens)
{
    if (!r)
        return kvp__fail(KVP_EINVAL, "retention is NULL");
    if (r->priority > KVP_RETENTION_PRIORITY_MAX)
        return kvp__fail(KVP_EINVAL, "retention priority is %" PRIu32 ", above %u", r->priority,
                         KVP_RETENTION_PRIORITY_MAX);
    if (r->n_ranges > KVP_RETENTION_MAX_RANGES)
        return kvp__fail(KVP_EINVAL, "retention has %zu ranges, more than %u", r->n_ranges,
                         KVP_RETENTION_MAX_RANGES);
    if (r->n_ranges && !r->ranges)
        return kvp__fail(KVP_EINVAL, "retention ranges is NULL but n_ranges is %zu", r->n_ranges);
    for (size_t i = 0; i < r->n_ranges; i++) {
        const kvp_retention_range *g = &r->ranges[i];
        if (g->priority > KVP_RETENTION_PRIORITY_MAX)
            return kvp__fail(KVP_EINVAL, "retention ranges[%zu] has priority %" PRIu32 ", above %u",
                             i, g->priority, KVP_RETENTION_PRIORITY_MAX);
        if (g->token_start >= g->token_end)
            return kvp__fail(KVP_EINVAL,
                             "retention ranges[%zu] is [%" PRIu64 ", %" PRIu64 "): empty", i,
                             g->token_start, g->token_end);
        if (g->token_end > n_tokens)
            return kvp__fail(KVP_EINVAL,
                             "retention ranges[%zu] ends at token %" PRIu64
                             ", past the prompt's %" PRIu64 " tokens",
                             i, g->token_end, n_tokens);
    }
    return KVP_OK;
}

/* The priority (*q) and duration (*d) that options o give block i of its request: the
 * highest priority among the ranges covering the whole block (the longest duration among
 * those, 0 counting as longest), else o's own. Cannot fail. */
static void block_setting(const kvp__ropts *o, uint64_t bs, uint32_t i, uint32_t *q, uint64_t *d)
{
    uint64_t lo = (uint64_t)i * bs, hi = lo + bs;
    bool found = false;
    for (size_t k = 0; k < o->n_ranges; k++) {
        const kvp_retention_range *g = &o->ranges[k];
        if (g->token_start > lo || g->token_end < hi)
            continue;
        if (!found || g->priority > *q) {
            *q = g->priority;
            *d = g->duration;
        } else if (g->priority == *q && *d != 0 && (g->duration == 0 || g->duration > *d)) {
            *d = g->duration;
        }
        found = true;
    }
    if (!found) {
        *q = o->priority;
        *d = o->duration;
    }
}

int kvp__request_set_retention_locked(kvp_cache *cache, uint64_t req_id, const kvp_retention *opt)
{
    /* Step 1: validate. */
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    kvp__request *req = kvp__request_find(cache, req_id);
    if (!req)
        return kvp__fail(KVP_ENOENT, "req_id %" PRIu64 " is not an active request", req_id);
    int rc = check_options(opt, req->n_prompt);
    if (rc != KVP_OK)
        return rc;

    /* Step 2: allocate the record (and the arrays, the first time). */
    size_t ranges_bytes = opt->n_ranges * sizeof(kvp_retention_range);
    kvp__ropts *o = kvp__mem_alloc(&cache->mem, sizeof *o + ranges_bytes);
    if (!o)
        return kvp__fail(KVP_ENOMEM, "out of memory: the request's retention options");
    memset(o, 0, sizeof *o);
    bool was_on = cache->retention.on;
    if ((rc = enable(cache)) != KVP_OK) {
        kvp__mem_free(&cache->mem, o, sizeof *o + ranges_bytes);
        return rc;
    }
    kvp__retention *r = &cache->retention;
    o->req_id = req_id;
    o->priority = opt->priority;
    o->duration = opt->duration;
    o->n_ranges = opt->n_ranges;
    o->ranges = opt->n_ranges ? (const kvp_retention_range *)(const void *)(o + 1) : NULL;
    if (opt->n_ranges)
        memcpy(o + 1, opt->ranges, ranges_bytes);
    kvp__ropts *old;
    HASH_FIND(hh, r->by_req, &req_id, sizeof req_id, old);
    if (!old) {
        HASH_ADD(hh, r->by_req, req_id, sizeof o->req_id, o);
        if (o->hh.tbl == NULL) {
            kvp__mem_free(&cache->mem, o, sizeof *o + ranges_bytes);
            if (!was_on)
                kvp__retention_free(cache);
            return kvp__fail(KVP_ENOMEM, "out of memory: the table of retention options");
        }
        return KVP_OK;
    }

    /* Step 3: replace the earlier options (cannot fail). */
    HASH_REPLACE(hh, r->by_req, req_id, sizeof o->req_id, o, old);
    assert(old);
    kvp__mem_free(&cache->mem, old, sizeof *old + old->n_ranges * sizeof(kvp_retention_range));
    return KVP_OK;
}

/* Unpin req's blocks as kvp__pool_unpin_tail_first does, noting its options (if any) on each
 * block, then drop the options. Cannot fail. */
void kvp__retention_release(kvp_cache *cache, kvp__request *req)
{
    kvp__retention *r = &cache->retention;
    kvp__ropts *o;
    HASH_FIND(hh, r->by_req, &req->id, sizeof req->id, o);
    r->pending = o;
    kvp__pool_unpin_tail_first(cache, req->blocks, req->n_blocks);
    r->pending = NULL;
    if (o) {
        HASH_DELETE(hh, r->by_req, o);
        kvp__mem_free(&cache->mem, o, sizeof *o + o->n_ranges * sizeof(kvp_retention_range));
    }
}

/* The retained forms of kvp_access: validate, turn retention on, run the access with the
 * options pending. ids NULL: the token form. */
static int access_retained(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                           const kvp_key *ids, size_t n_ids, size_t n_tokens,
                           const kvp_retention *opt, kvp_match *out)
{
    int rc = check_options(opt, n_tokens);
    if (rc != KVP_OK)
        return rc;
    bool was_on = cache->retention.on;
    if ((rc = enable(cache)) != KVP_OK)
        return rc;
    kvp__ropts o = {.priority = opt->priority,
                    .duration = opt->duration,
                    .ranges = opt->ranges,
                    .n_ranges = opt->n_ranges};
    cache->retention.pending = &o;
    rc = ids || !tokens ? kvp__access_ids_locked(cache, ns, ids, n_ids, n_tokens, out)
                        : kvp__access_locked(cache, ns, NULL, NULL, tokens, n_tokens, out);
    cache->retention.pending = NULL;
    if (rc != KVP_OK && !was_on)
        kvp__retention_free(cache); /* a failed call leaves the cache as it was */
    return rc;
}

int kvp__access_retained_locked(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                                size_t n_tokens, const kvp_retention *r, kvp_match *out)
{
    if (!tokens)
        return kvp__fail(KVP_EINVAL, "tokens is NULL");
    return access_retained(cache, ns, tokens, NULL, 0, n_tokens, r, out);
}

int kvp__access_ids_retained_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                                    size_t n_ids, size_t n_tokens, const kvp_retention *r,
                                    kvp_match *out)
{
    return access_retained(cache, ns, NULL, ids, n_ids, n_tokens, r, out);
}

int kvp__block_retention_locked(const kvp_cache *cache, uint32_t block_id, int *priority)
{
    if (!priority)
        return kvp__fail(KVP_EINVAL, "priority is NULL");
    if (block_id >= cache->pool.n_blocks)
        return kvp__fail(KVP_EINVAL, "block_id %" PRIu32 " is outside the pool of %" PRIu32,
                         block_id, cache->pool.n_blocks);
    const kvp__retention *r = &cache->retention;
    *priority = r->on ? (int)effective(r, block_id, clock_now(cache)) : (int)DEFAULT_PRIO;
    return KVP_OK;
}

/* ---------------------------------------------------------------- the heap */

/* Does heap entry a come before b: earlier expiry, then earlier queueing? */
static inline bool heap_less(const kvp__retention *r, uint32_t a, uint32_t b)
{
    return r->expire[a] < r->expire[b] || (r->expire[a] == r->expire[b] && r->seq[a] < r->seq[b]);
}

static void heap_set(kvp__retention *r, uint32_t pos, uint32_t id)
{
    r->heap[pos] = id;
    r->hpos[id] = pos;
}

static void heap_up(kvp__retention *r, uint32_t pos)
{
    uint32_t id = r->heap[pos];
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2;
        if (!heap_less(r, id, r->heap[parent]))
            break;
        heap_set(r, pos, r->heap[parent]);
        pos = parent;
    }
    heap_set(r, pos, id);
}

static void heap_down(kvp__retention *r, uint32_t pos)
{
    uint32_t id = r->heap[pos];
    for (;;) {
        uint32_t c = 2 * pos + 1;
        if (c >= r->n_heap)
            break;
        if (c + 1 < r->n_heap && heap_less(r, r->heap[c + 1], r->heap[c]))
            c++;
        if (!heap_less(r, r->heap[c], id))
            break;
        heap_set(r, pos, r->heap[c]);
        pos = c;
    }
    heap_set(r, pos, id);
}

static void heap_remove(kvp__retention *r, uint32_t id)
{
    uint32_t pos = r->hpos[id], last = r->heap[--r->n_heap];
    r->hpos[id] = KVP_NIL;
    if (last == id)
        return;
    heap_set(r, pos, last);
    heap_up(r, pos);
    heap_down(r, r->hpos[last]);
}

/* ---------------------------------------------------------------- the queues */

static void bit_set(kvp__retention *r, uint32_t p, bool on)
{
    uint64_t m = UINT64_C(1) << (p % 64);
    if (on)
        r->nonempty[p / 64] |= m;
    else
        r->nonempty[p / 64] &= ~m;
}

/* Note the pending options' setting on indexed block id, block i of the releasing request's
 * chain (before its pin is dropped). No options pending: nothing. Cannot fail. */
void kvp__retention_note(kvp_cache *cache, uint32_t id, uint32_t i)
{
    kvp__retention *r = &cache->retention;
    const kvp__ropts *o = r->pending;
    if (!o)
        return;
    uint32_t q = DEFAULT_PRIO;
    uint64_t d = 0, now = clock_now(cache);
    block_setting(o, cache->cfg.block_size, i, &q, &d);
    uint64_t e = d == 0 ? 0 : (now + d < now ? UINT64_MAX : now + d);
    if (!is_set(r, id, now) || q > r->prio[id]) {
        r->prio[id] = (uint8_t)q;
        r->expire[id] = e;
    } else if (q == r->prio[id] && r->expire[id] != 0 && (e == 0 || e > r->expire[id])) {
        r->expire[id] = e;
    }
}

/* Block id just became cached at chain depth depth: if its effective priority is not the
 * default, queue it (oldest release first) and return true; else clear a lapsed record and
 * return false (the pool puts it in the policy's order). Cannot fail. */
bool kvp__retention_queue(kvp_cache *cache, uint32_t id, uint32_t depth)
{
    kvp__retention *r = &cache->retention;
    kvp__pool *pool = &cache->pool;
    uint64_t now = clock_now(cache);
    assert(pool->state[id] == KVP__ST_CACHED);
    if (!is_set(r, id, now)) {
        r->prio[id] = KVP__PRIO_UNSET;
        r->expire[id] = 0;
        return false;
    }
    uint32_t p = r->prio[id];
    if (p == DEFAULT_PRIO)
        return false;
    kvp__rqueue *Q = &r->q[p];
    r->prev[id] = Q->tail;
    r->next[id] = KVP_NIL;
    if (Q->tail != KVP_NIL)
        r->next[Q->tail] = id;
    else
        Q->head = id;
    Q->tail = id;
    if (Q->n++ == 0)
        bit_set(r, p, true);
    r->seq[id] = ++r->serial;
    r->depth[id] = depth;
    if (r->expire[id] != 0) {
        r->heap[r->n_heap] = id;
        r->hpos[id] = r->n_heap++;
        heap_up(r, r->hpos[id]);
    }
    pool->state[id] = KVP__SLOT_RETAINED;
    pool->n_retained++;
    return true;
}

/* Queued block id leaves its queue (pinned, evicted or dropped); its record stays. Cannot
 * fail. */
void kvp__retention_unlink(kvp_cache *cache, uint32_t id)
{
    kvp__retention *r = &cache->retention;
    kvp__pool *pool = &cache->pool;
    assert(r->on && pool->state[id] == KVP__SLOT_RETAINED && pool->n_retained > 0);
    uint32_t p = r->prio[id];
    assert(p < KVP__N_PRIO && p != DEFAULT_PRIO);
    kvp__rqueue *Q = &r->q[p];
    if (r->prev[id] != KVP_NIL)
        r->next[r->prev[id]] = r->next[id];
    else
        Q->head = r->next[id];
    if (r->next[id] != KVP_NIL)
        r->prev[r->next[id]] = r->prev[id];
    else
        Q->tail = r->prev[id];
    if (--Q->n == 0)
        bit_set(r, p, false);
    r->prev[id] = r->next[id] = KVP_NIL;
    if (r->hpos[id] != KVP_NIL)
        heap_remove(r, id);
    pool->state[id] = KVP__ST_CACHED;
    pool->n_retained--;
}

/* Block id left the index: its record goes with its content. Cannot fail. */
void kvp__retention_forget(kvp_cache *cache, uint32_t id)
{
    kvp__retention *r = &cache->retention;
    assert(cache->pool.state[id] != KVP__SLOT_RETAINED);
    r->prio[id] = KVP__PRIO_UNSET;
    r->expire[id] = 0;
}

/* Move every queued block whose record has lapsed to the policy's order, earliest expiry
 * (then earliest queueing) first, clearing its record. Cannot fail. */
void kvp__retention_refresh(kvp_cache *cache)
{
    kvp__retention *r = &cache->retention;
    uint64_t now = clock_now(cache);
    while (r->n_heap > 0 && r->expire[r->heap[0]] <= now) {
        uint32_t id = r->heap[0];
        kvp__retention_unlink(cache, id);
        r->prio[id] = KVP__PRIO_UNSET;
        r->expire[id] = 0;
        kvp__pool_requeue(cache, id, r->depth[id]);
    }
}

/* The oldest block of the lowest non-empty queue below the default (below) or above it,
 * off its queue, or KVP_NIL. Cannot fail. */
uint32_t kvp__retention_pop(kvp_cache *cache, bool below)
{
    kvp__retention *r = &cache->retention;
    for (unsigned w = 0; w < 2; w++) {
        uint64_t bits = r->nonempty[w];
        while (bits) {
            unsigned p = w * 64 + (unsigned)__builtin_ctzll(bits);
            if (below ? p >= DEFAULT_PRIO : p <= DEFAULT_PRIO) {
                if (below)
                    return KVP_NIL;
                bits &= bits - 1;
                continue;
            }
            uint32_t id = r->q[p].head;
            kvp__retention_unlink(cache, id);
            return id;
        }
    }
    return KVP_NIL;
}

/* Any queued block, off its queue (kvp_cache_reset), or KVP_NIL. Cannot fail. */
uint32_t kvp__retention_drop_one(kvp_cache *cache)
{
    kvp__retention *r = &cache->retention;
    for (unsigned w = 0; w < 2; w++) {
        if (r->nonempty[w]) {
            uint32_t id = r->q[w * 64 + (unsigned)__builtin_ctzll(r->nonempty[w])].head;
            kvp__retention_unlink(cache, id);
            return id;
        }
    }
    return KVP_NIL;
}

/* Quota group g's victim: its cached block of lowest effective priority, the least recently
 * released first among equals (its list's order). g holds a cached block. Cannot fail. */
uint32_t kvp__retention_group_victim(const kvp_cache *cache, const kvp__qgroup *g)
{
    const kvp__retention *r = &cache->retention;
    uint64_t now = clock_now(cache);
    uint32_t best = g->head, best_p = effective(r, g->head, now);
    for (uint32_t id = cache->quota.next[g->head]; id != KVP_NIL && best_p > 0;
         id = cache->quota.next[id]) {
        uint32_t p = effective(r, id, now);
        if (p < best_p) {
            best = id;
            best_p = p;
        }
    }
    return best;
}

/* ---------------------------------------------------------------- the checker */

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);       \
    } while (0)

/* The invariants at the top of this file. KVP_OK or KVP_ECORRUPT. O(n_blocks). */
int kvp__retention_check(const kvp_cache *cache)
{
    const kvp__retention *r = &cache->retention;
    const kvp__pool *pool = &cache->pool;
    FAIL_IF(r->pending != NULL);
    if (!r->on) {
        FAIL_IF(r->prio || r->heap || r->by_req || pool->n_retained != 0);
        for (uint32_t id = 0; id < pool->n_blocks; id++)
            FAIL_IF(pool->state[id] == KVP__SLOT_RETAINED);
        return KVP_OK;
    }
    uint64_t total = 0;
    for (uint32_t p = 0; p < KVP__N_PRIO; p++) {
        const kvp__rqueue *Q = &r->q[p];
        bool bit = (r->nonempty[p / 64] >> (p % 64)) & 1;
        FAIL_IF(bit != (Q->n > 0));
        FAIL_IF(p == DEFAULT_PRIO && Q->n != 0);
        uint32_t n = 0, prev = KVP_NIL;
        for (uint32_t id = Q->head; id != KVP_NIL; prev = id, id = r->next[id]) {
            FAIL_IF(id >= pool->n_blocks || n >= pool->n_blocks);
            FAIL_IF(r->prio[id] != p || r->prev[id] != prev);
            FAIL_IF(pool->state[id] != KVP__SLOT_RETAINED);
            n++;
        }
        FAIL_IF(prev != Q->tail || n != Q->n);
        total += n;
    }
    FAIL_IF(r->nonempty[1] >> (KVP__N_PRIO - 64) != 0);
    FAIL_IF(total != pool->n_retained);
    uint32_t n_finite = 0;
    for (uint32_t id = 0; id < pool->n_blocks; id++) {
        uint32_t w = pool->state[id];
        bool queued = w == KVP__SLOT_RETAINED;
        FAIL_IF(r->prio[id] != KVP__PRIO_UNSET && r->prio[id] > KVP_RETENTION_PRIORITY_MAX);
        FAIL_IF(!kvp__st_is_indexed(w) && (r->prio[id] != KVP__PRIO_UNSET || r->expire[id]));
        FAIL_IF(queued && (!kvp__st_is_cached(w) || r->prio[id] == KVP__PRIO_UNSET ||
                           r->prio[id] == DEFAULT_PRIO));
        FAIL_IF(!queued && r->hpos[id] != KVP_NIL);
        if (queued && r->expire[id] != 0) {
            n_finite++;
            FAIL_IF(r->hpos[id] >= r->n_heap || r->heap[r->hpos[id]] != id);
        }
        FAIL_IF(queued && r->expire[id] == 0 && r->hpos[id] != KVP_NIL);
    }
    FAIL_IF(n_finite != r->n_heap);
    for (uint32_t pos = 1; pos < r->n_heap; pos++)
        FAIL_IF(heap_less(r, r->heap[pos], r->heap[(pos - 1) / 2]));
    const kvp__ropts *o, *tmp;
    HASH_ITER(hh, r->by_req, o, tmp)
    {
        FAIL_IF(kvp__request_find(cache, o->req_id) == NULL);
        FAIL_IF(o->n_ranges > KVP_RETENTION_MAX_RANGES);
    }
    return KVP_OK;
}
