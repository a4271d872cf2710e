/*
 * tier_orders.c - the copy orders between the device pool and the lower tiers: load orders
 * made by kvp_acquire_tiers, store orders made as kvp_commit indexes blocks (write-through),
 * their hand-out (kvp_tier_orders), their confirmation (kvp_tier_confirm) and the per-tier
 * counters. The tier tables are in tier.c; the picture and invariants in tier.h.
 *
 * An order lives in a slot of ts->orders from its creation to its confirmation; its id is
 * serial << 32 | slot, so kvp_tier_confirm finds it in O(1) and a stale or repeated id (the
 * serial differs) is refused with KVP_ENOENT. Slots are reserved before the mutating call
 * changes anything (kvp__tier_reserve_orders: every block the call could order, times the
 * lower tiers), so making orders never allocates and cannot fail, which keeps acquire's and
 * commit's "nothing changes on failure".
 *
 * Cost. Without tiers, kvp_commit pays one test of cache->tiers before and after its walk
 * (no per-block work) and kvp_acquire nothing. With tiers, each newly indexed block costs
 * one slot probe per lower tier, and a store order (reserve a tier block, pin the device
 * block); docs/design.md ("Tiers") gives the callgrind figure.
 */
#include <string.h>

#include "blockhash.h"
#include "tier.h"

/* Make room for n more live orders. KVP_OK or KVP_ENOMEM (nothing changed). */
int kvp__tier_reserve_orders(kvp_cache *cache, size_t n)
{
    kvp__tiers *ts = cache->tiers;
    if ((size_t)(ts->cap_orders - ts->n_orders) >= n)
        return KVP_OK;
    uint64_t want = ts->cap_orders ? (uint64_t)ts->cap_orders * 2 : 64;
    while (want < (uint64_t)ts->n_orders + n)
        want *= 2;
    if (want >= KVP_NIL)
        return kvp__fail(KVP_ENOMEM, "%zu more orders do not fit the order table", n);
    const size_t bs = cache->cfg.block_size;
    kvp__order *o = kvp__mem_alloc(&cache->mem, (size_t)want * sizeof *o);
    uint32_t *tok = NULL;
    if (o && cache->cfg.on_event &&
        !(tok = kvp__mem_alloc(&cache->mem, (size_t)want * bs * sizeof *tok))) {
        kvp__mem_free(&cache->mem, o, (size_t)want * sizeof *o);
        o = NULL;
    }
    if (!o)
        return kvp__fail(KVP_ENOMEM, "out of memory: the order table (%" PRIu64 " slots)", want);
    if (tok && ts->cap_orders)
        memcpy(tok, ts->tokens, (size_t)ts->cap_orders * bs * sizeof *tok);
    kvp__mem_free(&cache->mem, ts->tokens, (size_t)ts->cap_orders * bs * sizeof *tok);
    ts->tokens = tok;
    if (ts->cap_orders)
        memcpy(o, ts->orders, (size_t)ts->cap_orders * sizeof *o);
    memset(o + ts->cap_orders, 0, (size_t)(want - ts->cap_orders) * sizeof *o);
    for (uint32_t s = (uint32_t)want; s-- > ts->cap_orders;) {
        o[s].next = ts->free_slot;
        ts->free_slot = s;
    }
    kvp__mem_free(&cache->mem, ts->orders, (size_t)ts->cap_orders * sizeof *o);
    ts->orders = o;
    ts->cap_orders = (uint32_t)want;
    return KVP_OK;
}

/* A new live order in a reserved slot (its fields but id and next zeroed). Cannot fail. */
static kvp__order *order_new(kvp__tiers *ts)
{
    uint32_t s = ts->free_slot;
    assert(s != KVP_NIL);
    kvp__order *o = &ts->orders[s];
    ts->free_slot = o->next;
    if (++ts->serial == 0)
        ts->serial = 1;
    memset(o, 0, sizeof *o);
    o->id = (uint64_t)ts->serial << 32 | s;
    o->next = KVP_NIL;
    ts->n_orders++;
    return o;
}

static void order_free(kvp__tiers *ts, kvp__order *o)
{
    uint32_t s = (uint32_t)o->id;
    o->id = 0;
    o->next = ts->free_slot;
    ts->free_slot = s;
    ts->n_orders--;
}

static kvp_tier_order order_out(const kvp__order *o)
{
    kvp_tier_order r;
    r.id = o->id;
    r.req_id = o->req_id;
    r.key = o->key;
    r.kind = o->kind;
    r.tier = o->tier;
    r.tier_block = o->tier_block;
    r.device_block = o->device_block;
    r.block_index = o->block_index;
    return r;
}

/* Bytes of n blocks for the counters: block_bytes each, or 1 when block_bytes is 0. */
static inline uint64_t moved(const kvp_cache *cache, uint64_t n)
{
    return cache->cfg.block_bytes ? n * cache->cfg.block_bytes : n;
}

/* Write-through after kvp_commit (with orders reserved for every block it could store):
 * for each of req's blocks first .. n_committed - 1 that the commit indexed (a deduplicated
 * one is private and skipped: its key's block was ordered when it was committed), order a
 * store to every lower tier that does not hold its key, pinning the device block once per
 * order. A tier whose blocks are all pending or loading skips the block (counted). Cannot
 * fail. */
static void tier_committed(kvp_cache *cache, const kvp__request *req, uint32_t first,
                           const uint32_t *tokens)
{
    const size_t bs = cache->cfg.block_size;
    kvp__tiers *ts = cache->tiers;
    kvp_key parent = first == 0 ? req->root : req->last_key;
    bool parent_known = first == 0;
    if (first > 0) {
        const kvp__block *pb = &cache->pool.blocks[req->blocks[first - 1]];
        parent_known = kvp__block_is_indexed(&cache->pool, req->blocks[first - 1]);
        parent = parent_known ? pb->key : parent;
    }
    for (uint32_t i = first; i < req->n_committed; i++) {
        uint32_t dev = req->blocks[i];
        const kvp__block *b = &cache->pool.blocks[dev];
        if (!kvp__block_is_indexed(&cache->pool, dev)) {
            parent_known = false;
            continue;
        }
        for (int k = 1; k < ts->n_tiers; k++) {
            kvp__tier *t = &ts->tier[k];
            if (kvp__tier_find(t, b->key) != KVP_NIL)
                continue;
            uint32_t tb = kvp__tier_reserve_block(cache, k, b->key);
            if (tb == KVP_NIL) {
                t->stats.n_stores_skipped++;
                continue;
            }
            kvp__order *o = order_new(ts);
            o->req_id = req->id;
            o->key = b->key;
            o->parent = parent_known ? parent : (kvp_key){0, 0};
            o->parent_is_root = i == 0;
            o->tier_block = tb;
            o->device_block = dev;
            o->block_index = i;
            o->kind = KVP_ORDER_STORE;
            o->tier = (uint8_t)k;
            uint32_t s = (uint32_t)o->id;
            if (ts->tokens)
                memcpy(ts->tokens + (size_t)s * bs, tokens + (size_t)i * bs, bs * sizeof *tokens);
            if (ts->new_tail != KVP_NIL)
                ts->orders[ts->new_tail].next = s;
            else
                ts->new_head = s;
            ts->new_tail = s;
            ts->n_new++;
            kvp__pool_hold(cache, dev); /* not a hit: the request holds it */
        }
        parent = b->key;
        parent_known = true;
    }
}

/* kvp_commit on a cache with lower tiers (kvp__commit_locked sends it here, so a cache
 * without tiers pays one test of cache->tiers per commit and nothing else):
 *   1. reserve an order per block the commit may store and per lower tier (KVP_ENOMEM:
 *      nothing changed; the reservation is only spare capacity);
 *   2. commit (kvp__commit_body; nothing changed if it fails);
 *   3. order the stores of the blocks it indexed (cannot fail). */
int kvp__tier_commit(kvp_cache *cache, uint64_t req_id, const kvp_key *keys, const uint32_t *tokens,
                     size_t n_tokens, size_t *n_stored)
{
    /* Step 1: reserve. */
    kvp__request *req = kvp__request_find(cache, req_id);
    uint32_t first = req ? req->n_committed : 0;
    int rc = KVP_OK;
    if (req && cache->tiers->n_tiers > 1) {
        size_t n_full = n_tokens / cache->cfg.block_size;
        if (n_full > req->n_blocks)
            n_full = req->n_blocks; /* the commit refuses more (KVP_ERANGE) */
        if (n_full > first)
            rc = kvp__tier_reserve_orders(cache,
                                          (n_full - first) * (size_t)(cache->tiers->n_tiers - 1));
    }
    /* Step 2: commit. */
    if (rc == KVP_OK)
        rc = kvp__commit_body(cache, req_id, keys, tokens, n_tokens, n_stored);
    /* Step 3: the store orders. */
    if (rc == KVP_OK && cache->tiers->n_tiers > 1 && req->n_committed > first)
        tier_committed(cache, req, first, tokens);
    return rc;
}

/* The body of kvp_acquire_tiers: 1. validate; 2. reserve an order per possible load;
 * 3. kvp_acquire (nothing changed if it fails); 4. walk the keys after the device hit and
 * order a load for each block a lower tier holds (cannot fail). */
int kvp__acquire_tiers_locked(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                              const uint32_t *tokens, size_t n_tokens, size_t n_capacity,
                              kvp_match *out, kvp_tier_order *loads, size_t cap, size_t *n_loads)
{
    /* Step 1: validate (acquire checks the rest). */
    if (!n_loads)
        return kvp__fail(KVP_EINVAL, "n_loads is NULL");
    if (!loads && cap)
        return kvp__fail(KVP_EINVAL, "loads is NULL but cap is %zu", cap);
    const size_t bs = cache->cfg.block_size;
    const bool tiers = kvp__tiers_on(cache) && cap > 0 && tokens && n_tokens > 0;

    /* Step 2: reserve the orders. */
    size_t n_max = tiers ? (n_tokens - 1) / bs : 0;
    if (n_max > cap)
        n_max = cap;
    int rc = n_max ? kvp__tier_reserve_orders(cache, n_max) : KVP_OK;

    /* Step 3: acquire. */
    kvp_match m;
    if (rc == KVP_OK)
        rc = kvp__acquire_locked(cache, req_id, ns, NULL, NULL, tokens, n_tokens, n_capacity, &m);
    if (rc != KVP_OK)
        return rc;

    /* Step 4: the loads. */
    size_t n = 0;
    if (n_max) {
        kvp__tiers *ts = cache->tiers;
        kvp__request *req = kvp__request_find(cache, req_id);
        kvp_key key = req->last_key, high = req->last_high;
        for (uint32_t i = m.n_blocks_hit; n < n_max && i < (n_tokens - 1) / bs; i++) {
            kvp__cache_chain(cache, &req->vx, &key, &high, tokens + (size_t)i * bs, i);
            int k;
            uint32_t tb = kvp__tier_find_ready(ts, key, &k);
            if (tb == KVP_NIL)
                break;
            kvp__tier *t = &ts->tier[k];
            kvp__tier_pin(t, tb);
            t->stats.n_hits++;
            kvp__order *o = order_new(ts);
            o->req_id = req_id;
            o->key = key;
            o->tier_block = tb;
            o->device_block = req->blocks[i];
            o->block_index = i;
            o->kind = KVP_ORDER_LOAD;
            o->tier = (uint8_t)k;
            o->handed_out = true;
            loads[n++] = order_out(o);
        }
    }
    *out = m;
    *n_loads = n;
    return KVP_OK;
}

int kvp__tier_orders_locked(kvp_cache *cache, kvp_tier_order *out, size_t cap, size_t *n,
                            size_t *n_left)
{
    if (!n)
        return kvp__fail(KVP_EINVAL, "n is NULL");
    if (!out && cap)
        return kvp__fail(KVP_EINVAL, "out is NULL but cap is %zu", cap);
    kvp__tiers *ts = cache->tiers;
    size_t c = 0;
    while (ts && c < cap && ts->new_head != KVP_NIL) {
        kvp__order *o = &ts->orders[ts->new_head];
        ts->new_head = o->next;
        if (ts->new_head == KVP_NIL)
            ts->new_tail = KVP_NIL;
        o->next = KVP_NIL;
        o->handed_out = true;
        ts->n_new--;
        out[c++] = order_out(o);
    }
    *n = c;
    if (n_left)
        *n_left = ts ? ts->n_new : 0;
    return KVP_OK;
}

/* Emit STORED for the tier block order o has just made READY. */
static void emit_tier_stored(kvp_cache *cache, const kvp__order *o)
{
    kvp_event ev = {0};
    ev.type = KVP_EVENT_STORED;
    ev.block_id = o->tier_block;
    ev.n_tokens = cache->cfg.block_size;
    ev.key = o->key;
    ev.parent = o->parent;
    ev.parent_is_root = o->parent_is_root;
    ev.tier = o->tier;
    ev.tokens = cache->tiers->tokens + (size_t)(uint32_t)o->id * cache->cfg.block_size;
    kvp__emit(cache, &ev);
}

/* The body of kvp_tier_confirm. Cannot fail for a live order handed out. */
int kvp__tier_confirm_locked(kvp_cache *cache, uint64_t order_id, bool ok)
{
    kvp__tiers *ts = cache->tiers;
    uint32_t s = (uint32_t)order_id;
    if (!ts || s >= ts->cap_orders || order_id == 0 || ts->orders[s].id != order_id)
        return kvp__fail(KVP_ENOENT, "order %" PRIu64 " is not a live order", order_id);
    kvp__order *o = &ts->orders[s];
    if (!o->handed_out)
        return kvp__fail(KVP_ENOENT, "order %" PRIu64 " has not been handed out yet", order_id);
    kvp__tier *t = &ts->tier[o->tier];
    if (o->kind == KVP_ORDER_STORE) {
        uint32_t dev = o->device_block;
        if (ok) {
            kvp__tier_ready(t, o->tier_block, o->block_index);
            t->stats.n_stores++;
            t->stats.n_bytes_stored += moved(cache, 1);
        } else {
            kvp__tier_drop(t, o->tier_block);
            t->stats.n_stores_failed++;
        }
        kvp__order copy = *o;
        order_free(ts, o);
        kvp__pool_unhold(cache, dev, copy.block_index);
        if (ok && cache->cfg.on_event)
            emit_tier_stored(cache, &copy);
        return KVP_OK;
    }
    kvp__tier_unpin(t, o->tier_block, o->block_index, ok);
    if (ok) {
        t->stats.n_loads++;
        t->stats.n_bytes_loaded += moved(cache, 1);
    } else {
        t->stats.n_loads_failed++;
    }
    order_free(ts, o);
    return KVP_OK;
}

int kvp__tier_stats_locked(const kvp_cache *cache, int tier, kvp_tier_stats *out, int *n_tiers)
{
    if (!n_tiers)
        return kvp__fail(KVP_EINVAL, "n_tiers is NULL");
    int n = cache->tiers ? cache->tiers->n_tiers : 1;
    if (out && (tier < 0 || tier >= n))
        return kvp__fail(KVP_EINVAL, "tier %d: the cache has tiers 0 to %d", tier, n - 1);
    *n_tiers = n;
    if (!out)
        return KVP_OK;
    kvp_tier_stats st;
    if (tier == 0) {
        memset(&st, 0, sizeof st);
        st.medium = "GPU";
        st.n_blocks_total = cache->pool.n_blocks;
        st.n_blocks_ready = cache->index.n_items;
        st.n_hits = cache->stats.n_blocks_hit;
        st.n_evictions = cache->stats.n_evictions;
    } else {
        const kvp__tier *t = &cache->tiers->tier[tier];
        st = t->stats;
        st.medium = t->medium;
        st.n_blocks_total = t->n_blocks;
        st.n_blocks_ready = t->n_ready;
        st.n_blocks_pending = t->n_pending;
        st.n_blocks_loading = t->n_loading;
    }
    *out = st;
    return KVP_OK;
}
