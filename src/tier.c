/*
 * tier.c - the table of one lower tier (host memory, disk, remote store): its blocks, the
 * key slots that find them, its free list and LRU list; adding a tier, the lookup across
 * tiers, and the checker. Orders (what moves between tiers) are in tier_orders.c; the
 * picture and invariants are in tier.h.
 *
 * A lower tier keeps keys only, never tokens, so it needs no verification mode (tiers are
 * refused on verify_tokens caches). Its key slots are an open-addressing table of block
 * ids, sized once at 2 to 4 slots per block, probed linearly from the key's low bits and
 * emptied by backward shift, so nothing allocates after kvp_cache_add_tier and every
 * change is O(1) expected. Eviction is the tier's own policy (kvp_tier_config.eviction).
 * LRU, the default, is this file's list: a confirmed store or load makes the block the
 * newest; a block pinned by a load in flight stays in the list and is skipped by the
 * victim search (loads are short-lived and few next to a tier's size, so the skip is
 * cheap), so a failed load leaves the order exactly as it was. Any other policy runs
 * through the policy interface (policy.h), as the device pool's does, over the tier's own
 * block ids: a reserved block is taken, a confirmed store its first release, a load's pin
 * a hit (the block leaves the policy's lists, so it cannot be the victim), the load's
 * confirmation, ok or failed, its release. Each block is released alone, at the depth its
 * order names (CDECAY sees a chain of one per release: no chain closure in a tier).
 */
#include <string.h>

#include "blockhash.h"
#include "tier.h"

/* The tier rides in kvp_event's padding: adding it did not grow the event, so no emitter
 * builds a larger one (kvp_event is zeroed on every eviction, tiers or not). */
_Static_assert(sizeof(void *) != 8 || sizeof(kvp_event) == 64, "kvp_event grew");

/* The slot where key's probe starts. */
static inline uint32_t slot_of(const kvp__tier *t, kvp_key key)
{
    return (uint32_t)(key.lo ^ (key.hi >> 7)) & t->mask;
}

/* The block of tier t holding key (PENDING or READY), or KVP_NIL. Cannot fail. */
uint32_t kvp__tier_find(const kvp__tier *t, kvp_key key)
{
    for (uint32_t s = slot_of(t, key);; s = (s + 1) & t->mask) {
        uint32_t id = t->slots[s];
        if (id == KVP_NIL)
            return KVP_NIL;
        if (kvp__key_eq(t->blocks[id].key, key))
            return id;
    }
}

/* The READY block holding key in the lowest-numbered lower tier that has one (its tier in
 * *tier), or KVP_NIL. Cannot fail. */
uint32_t kvp__tier_find_ready(const kvp__tiers *ts, kvp_key key, int *tier)
{
    for (int k = 1; k < ts->n_tiers; k++) {
        const kvp__tier *t = &ts->tier[k];
        uint32_t id = kvp__tier_find(t, key);
        if (id != KVP_NIL && t->blocks[id].state == KVP__TB_READY) {
            *tier = k;
            return id;
        }
    }
    return KVP_NIL;
}

static void slot_insert(kvp__tier *t, uint32_t id)
{
    uint32_t s = slot_of(t, t->blocks[id].key);
    while (t->slots[s] != KVP_NIL)
        s = (s + 1) & t->mask;
    t->slots[s] = id;
}

/* Remove block id's slot, shifting later entries of the run back so no probe breaks. */
static void slot_remove(kvp__tier *t, uint32_t id)
{
    uint32_t s = slot_of(t, t->blocks[id].key);
    while (t->slots[s] != id) {
        assert(t->slots[s] != KVP_NIL);
        s = (s + 1) & t->mask;
    }
    uint32_t hole = s;
    for (s = (s + 1) & t->mask; t->slots[s] != KVP_NIL; s = (s + 1) & t->mask) {
        uint32_t home = slot_of(t, t->blocks[t->slots[s]].key);
        /* The entry at s may move to the hole if its home is not in (hole, s]. */
        bool stays = hole <= s ? (home > hole && home <= s) : (home > hole || home <= s);
        if (!stays) {
            t->slots[hole] = t->slots[s];
            hole = s;
        }
    }
    t->slots[hole] = KVP_NIL;
}

static void lru_unlink(kvp__tier *t, uint32_t id)
{
    kvp__tblock *b = &t->blocks[id];
    if (b->prev != KVP_NIL)
        t->blocks[b->prev].next = b->next;
    else
        t->lru_head = b->next;
    if (b->next != KVP_NIL)
        t->blocks[b->next].prev = b->prev;
    else
        t->lru_tail = b->prev;
}

static void lru_append(kvp__tier *t, uint32_t id)
{
    kvp__tblock *b = &t->blocks[id];
    b->prev = t->lru_tail;
    b->next = KVP_NIL;
    if (t->lru_tail != KVP_NIL)
        t->blocks[t->lru_tail].next = id;
    else
        t->lru_head = id;
    t->lru_tail = id;
}

static void free_push(kvp__tier *t, uint32_t id)
{
    kvp__tblock *b = &t->blocks[id];
    b->state = KVP__TB_FREE;
    b->ref = 0;
    b->prev = KVP_NIL;
    b->next = t->free_head;
    t->free_head = id;
    t->n_free++;
}

/* Evict READY block id of tier k (unpinned): emit REMOVED with the tier's medium. */
static void evict(kvp_cache *cache, int k, uint32_t id)
{
    kvp__tier *t = &cache->tiers->tier[k];
    kvp__tblock *b = &t->blocks[id];
    assert(b->state == KVP__TB_READY && b->ref == 0);
    kvp_key key = b->key;
    if (t->pol.eviction == KVP_EVICT_LRU)
        lru_unlink(t, id); /* another policy took it off its lists (kvp__policy_evict) */
    slot_remove(t, id);
    t->n_ready--;
    free_push(t, id);
    t->stats.n_evictions++;
    if (cache->cfg.on_event) {
        kvp_event ev = {0};
        ev.type = KVP_EVENT_REMOVED;
        ev.reason = KVP_REMOVED_EVICTED;
        ev.block_id = id;
        ev.key = key;
        ev.tier = (uint8_t)k;
        kvp__emit(cache, &ev);
    }
}

/* Reserve a block of tier k for key (not held by the tier): a FREE one, else the least
 * recently used READY block no load pins (evicted). The block becomes PENDING under key.
 * Returns its id, or KVP_NIL when every block is PENDING or pinned (nothing changed).
 * Cannot fail otherwise. */
uint32_t kvp__tier_reserve_block(kvp_cache *cache, int k, kvp_key key)
{
    kvp__tier *t = &cache->tiers->tier[k];
    assert(kvp__tier_find(t, key) == KVP_NIL);
    if (t->free_head == KVP_NIL) {
        uint32_t v;
        if (t->pol.eviction == KVP_EVICT_LRU) {
            v = t->lru_head;
            while (v != KVP_NIL && t->blocks[v].ref > 0)
                v = t->blocks[v].next;
        } else {
            v = kvp__policy_evict(&t->pol); /* pinned blocks are on none of its lists */
        }
        if (v == KVP_NIL)
            return KVP_NIL;
        evict(cache, k, v);
    }
    uint32_t id = t->free_head;
    kvp__tblock *b = &t->blocks[id];
    t->free_head = b->next;
    t->n_free--;
    b->state = KVP__TB_PENDING;
    b->key = key;
    b->prev = b->next = KVP_NIL;
    slot_insert(t, id);
    t->n_pending++;
    if (t->pol.eviction != KVP_EVICT_LRU)
        kvp__policy_taken(&t->pol, id);
    return id;
}

/* The policy's release of block id, block depth of its chain, alone (a chain of one). */
static void policy_release(kvp__tier *t, uint32_t id, uint32_t depth)
{
    kvp__policy_release_begin(&t->pol, &id, 1);
    kvp__policy_release(&t->pol, id, depth);
}

/* PENDING block id, block depth of its chain, has been copied: make it READY, the newest
 * under LRU, released (admitted) under another policy. Cannot fail. */
void kvp__tier_ready(kvp__tier *t, uint32_t id, uint32_t depth)
{
    assert(t->blocks[id].state == KVP__TB_PENDING);
    t->blocks[id].state = KVP__TB_READY;
    t->n_pending--;
    t->n_ready++;
    if (t->pol.eviction == KVP_EVICT_LRU)
        lru_append(t, id);
    else
        policy_release(t, id, depth);
}

/* PENDING block id's copy failed: free it, as if it had never been reserved. */
void kvp__tier_drop(kvp__tier *t, uint32_t id)
{
    assert(t->blocks[id].state == KVP__TB_PENDING);
    slot_remove(t, id);
    t->n_pending--;
    free_push(t, id);
}

/* READY block id is pinned by a load order: under another policy than LRU every pin is a
 * hit (as in the device pool), and the first takes it off the policy's lists. Cannot
 * fail. */
void kvp__tier_pin(kvp__tier *t, uint32_t id)
{
    kvp__tblock *b = &t->blocks[id];
    assert(b->state == KVP__TB_READY);
    t->n_loading += b->ref++ == 0;
    if (t->pol.eviction != KVP_EVICT_LRU)
        kvp__policy_hit(&t->pol, id);
}

/* A load order of READY block id (block depth of its chain) is confirmed (ok: the copy was
 * made): its pin goes; under LRU a confirmed load makes the block the newest (a failed one
 * changes nothing), under another policy the last pin's going is the block's release.
 * Cannot fail. */
void kvp__tier_unpin(kvp__tier *t, uint32_t id, uint32_t depth, bool ok)
{
    kvp__tblock *b = &t->blocks[id];
    assert(b->state == KVP__TB_READY && b->ref > 0);
    bool last = --b->ref == 0;
    t->n_loading -= last;
    if (t->pol.eviction != KVP_EVICT_LRU) {
        if (last)
            policy_release(t, id, depth);
    } else if (ok) {
        lru_unlink(t, id);
        lru_append(t, id);
    }
}

/* A medium name: 1 .. KVP_TIER_MEDIUM_MAX bytes of [A-Za-z0-9_.-]. */
static bool medium_ok(const char *m)
{
    size_t n = 0;
    for (; m[n]; n++) {
        char c = m[n];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok || n >= KVP_TIER_MEDIUM_MAX)
            return false;
    }
    return n > 0;
}

static void tier_free(kvp_cache *cache, kvp__tier *t)
{
    kvp__policy_free(&t->pol);
    kvp__mem_free(&cache->mem, t->blocks, (size_t)t->n_blocks * sizeof *t->blocks);
    kvp__mem_free(&cache->mem, t->slots, ((size_t)t->mask + 1) * sizeof *t->slots);
    t->blocks = NULL;
    t->slots = NULL;
}

KVP_EXPORT void kvp_tier_config_init(kvp_tier_config *tc)
{
    if (!tc)
        return;
    memset(tc, 0, sizeof *tc);
    tc->medium = "CPU";
    tc->eviction = KVP_EVICT_LRU;
    kvp_config cfg;
    kvp_config_init(&cfg);
    tc->slru_protected_pct = cfg.slru_protected_pct;
    tc->s3fifo_small_pct = cfg.s3fifo_small_pct;
    tc->s3fifo_ghost_pct = cfg.s3fifo_ghost_pct;
    tc->cdecay_tau = cfg.cdecay_tau;
    tc->cdecay_ghost_pct = cfg.cdecay_ghost_pct;
}

/* A tier config's policy parameters. Cannot fail. */
static void tier_params(const kvp_tier_config *tc, kvp__pparams *pp)
{
    KVP__PPARAMS_FROM(pp, tc);
}
/* The body of kvp_cache_add_tier: 1. validate; 2. allocate the tier set (first tier) and
 * the tier's arrays; 3. fill them and link the tier in (cannot fail). */
int kvp__tier_add_locked(kvp_cache *cache, const kvp_tier_config *tc, int *tier)
{
    /* Step 1: validate. */
    if (!tc)
        return kvp__fail(KVP_EINVAL, "tc is NULL");
    if (kvp__verifying(cache))
        return kvp__fail(KVP_ENOTSUP, "a verify_tokens cache cannot have lower tiers: they keep "
                                      "keys, not the tokens to verify");
    kvp__pparams pp;
    tier_params(tc, &pp);
    int rc = kvp__policy_params_check(&pp);
    if (rc != KVP_OK)
        return rc;
    if (!tc->medium || !medium_ok(tc->medium))
        return kvp__fail(KVP_EINVAL,
                         "medium must be 1 to %u bytes of letters, digits, '_', '.' or '-'",
                         KVP_TIER_MEDIUM_MAX);
    if (tc->n_blocks == 0 || tc->n_blocks > (UINT32_C(1) << 31))
        return kvp__fail(KVP_EINVAL, "n_blocks is %" PRIu32 ": a tier holds 1 to 2^31 blocks",
                         tc->n_blocks);
    if (cache->requests)
        return kvp__fail(KVP_EINVAL, "requests are active: add tiers before the first acquire");
    kvp__tiers *ts = cache->tiers;
    int n = ts ? ts->n_tiers : 1;
    if (n >= (int)KVP_MAX_TIERS)
        return kvp__fail(KVP_ENOSPC, "the cache already has %u tiers", KVP_MAX_TIERS);
    for (int k = 1; k < n; k++)
        if (strcmp(ts->tier[k].medium, tc->medium) == 0)
            return kvp__fail(KVP_EINVAL, "medium '%s' is tier %d's already", tc->medium, k);

    /* Step 2: allocate. */
    bool made = false;
    if (!ts) {
        ts = kvp__mem_calloc(&cache->mem, 1, sizeof *ts);
        if (!ts)
            return kvp__fail(KVP_ENOMEM, "out of memory: the tier table");
        ts->n_tiers = 1;
        ts->free_slot = ts->new_head = ts->new_tail = KVP_NIL;
        made = true;
    }
    kvp__tier *t = &ts->tier[n];
    memset(t, 0, sizeof *t);
    uint64_t n_slots = 2;
    while (n_slots < 2 * (uint64_t)tc->n_blocks)
        n_slots *= 2;
    t->n_blocks = tc->n_blocks;
    t->mask = (uint32_t)(n_slots - 1);
    t->blocks = kvp__mem_alloc(&cache->mem, (size_t)tc->n_blocks * sizeof *t->blocks);
    t->slots = kvp__mem_alloc(&cache->mem, (size_t)n_slots * sizeof *t->slots);
    rc = !t->blocks || !t->slots
             ? kvp__fail(KVP_ENOMEM, "out of memory: a tier of %" PRIu32 " blocks", tc->n_blocks)
             : kvp__policy_init(&t->pol, &pp, tc->n_blocks, &cache->mem, &t->blocks[0].key,
                                sizeof *t->blocks, &t->n_listed);
    if (rc != KVP_OK) {
        tier_free(cache, t);
        if (made)
            kvp__mem_free(&cache->mem, ts, sizeof *ts);
        return rc;
    }

    /* Step 3: fill and link in. */
    memset(t->slots, 0xff, (size_t)n_slots * sizeof *t->slots);
    t->free_head = KVP_NIL;
    for (uint32_t id = tc->n_blocks; id-- > 0;)
        free_push(t, id);
    t->lru_head = t->lru_tail = KVP_NIL;
    strcpy(t->medium, tc->medium);
    t->stats.medium = t->medium;
    ts->n_tiers = n + 1;
    cache->tiers = ts;
    if (tier)
        *tier = n;
    return KVP_OK;
}

/* The medium of tier k, or NULL. Cannot fail. */
const char *kvp__tier_medium(const kvp_cache *cache, int k)
{
    if (k == 0)
        return "GPU";
    if (!cache->tiers || k < 0 || k >= cache->tiers->n_tiers)
        return NULL;
    return cache->tiers->tier[k].medium;
}

/* Free every lower tier and the order table (kvp_cache_free). Cannot fail. */
void kvp__tiers_free(kvp_cache *cache)
{
    kvp__tiers *ts = cache->tiers;
    if (!ts)
        return;
    for (int k = 1; k < ts->n_tiers; k++)
        tier_free(cache, &ts->tier[k]);
    kvp__mem_free(&cache->mem, ts->orders, (size_t)ts->cap_orders * sizeof *ts->orders);
    kvp__mem_free(&cache->mem, ts->tokens,
                  (size_t)ts->cap_orders * cache->cfg.block_size * sizeof *ts->tokens);
    kvp__mem_free(&cache->mem, ts, sizeof *ts);
    cache->tiers = NULL;
}

/* The body of kvp_lookup_tiers (shared lock: reads only). Walks the prompt's keys block by
 * block: the device pool's run first, then each block a lower tier holds READY. */
int kvp__lookup_tiers_locked(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                             size_t n_tokens, uint8_t *where, size_t cap, kvp_tier_match *out)
{
    if (!tokens)
        return kvp__fail(KVP_EINVAL, "tokens is NULL");
    if (!out)
        return kvp__fail(KVP_EINVAL, "out is NULL");
    if (!where && cap)
        return kvp__fail(KVP_EINVAL, "where is NULL but cap is %zu", cap);
    if (n_tokens == 0)
        return kvp__fail(KVP_EINVAL, "n_tokens is 0: a prompt has at least one token");
    int rc = kvp__ns_valid(ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_ns_check(&cache->hasher, ns);
    if (rc == KVP_OK)
        rc = kvp__hasher_tokens_check(&cache->hasher, tokens, n_tokens);
    if (rc != KVP_OK)
        return rc;
    const size_t bs = cache->cfg.block_size;
    if (n_tokens / bs >= KVP_NIL)
        return kvp__fail(KVP_EOVERFLOW, "n_tokens is %zu: 2^32 - 1 or more full blocks", n_tokens);
    if (kvp__verifying(cache))
        return kvp__fail(KVP_ENOTSUP, "a verify_tokens cache has no tiers to look up: use "
                                      "kvp_lookup");
    kvp_tier_match m;
    memset(&m, 0, sizeof m);
    m.n_blocks_full = (uint32_t)(n_tokens / bs);
    kvp_key root = kvp__cache_root(cache, ns), key, high;
    kvp__hasher_start(&cache->hasher, root, &key, &high);
    kvp__vctx vx = kvp__hasher_vctx(ns);
    const kvp__tiers *ts = kvp__tiers_on(cache) ? cache->tiers : NULL;
    bool device_run = true;
    for (uint32_t i = 0; i < m.n_blocks_full; i++) {
        kvp__cache_chain(cache, &vx, &key, &high, tokens + (size_t)i * bs, i);
        int k = 0;
        if (!(device_run && kvp__index_find(&cache->index, key))) {
            device_run = false;
            if (!ts || kvp__tier_find_ready(ts, key, &k) == KVP_NIL)
                break;
        }
        if (i < cap)
            where[i] = (uint8_t)k;
        m.n_blocks_tier[k]++;
        m.n_blocks_prefix++;
    }
    uint32_t limit = (uint32_t)((n_tokens - 1) / bs);
    m.n_blocks_usable = m.n_blocks_prefix < limit ? m.n_blocks_prefix : limit;
    *out = m;
    return KVP_OK;
}

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "tier check failed: %s (%s:%d)", #cond, __FILE__,       \
                             __LINE__);                                                            \
    } while (0)

/* kvp__policy_check's predicate for a tier: block id is READY and no load pins it. */
static bool tier_block_listed(const void *ctx, uint32_t id)
{
    const kvp__tblock *b = &((const kvp__tier *)ctx)->blocks[id];
    return b->state == KVP__TB_READY && b->ref == 0;
}

/* One tier's table: states and counts, free list, LRU list or policy, slots (without the
 * orders: kvp__tier_check adds them). KVP_OK, KVP_ECORRUPT or KVP_ENOMEM. */
int kvp__tier_table_check(const kvp__tier *t)
{
    uint32_t n[3] = {0, 0, 0}, n_loading = 0;
    for (uint32_t id = 0; id < t->n_blocks; id++) {
        const kvp__tblock *b = &t->blocks[id];
        FAIL_IF(b->state > KVP__TB_READY);
        n[b->state]++;
        FAIL_IF(b->state != KVP__TB_READY && b->ref != 0);
        n_loading += b->ref > 0;
        if (b->state != KVP__TB_FREE)
            FAIL_IF(kvp__tier_find(t, b->key) != id);
    }
    FAIL_IF(n[KVP__TB_FREE] != t->n_free || n[KVP__TB_PENDING] != t->n_pending ||
            n[KVP__TB_READY] != t->n_ready || n_loading != t->n_loading);
    uint32_t c = 0;
    for (uint32_t id = t->free_head; id != KVP_NIL; id = t->blocks[id].next) {
        FAIL_IF(id >= t->n_blocks || t->blocks[id].state != KVP__TB_FREE || ++c > t->n_free);
    }
    FAIL_IF(c != t->n_free);
    c = 0;
    uint32_t prev = KVP_NIL;
    for (uint32_t id = t->lru_head; id != KVP_NIL; id = t->blocks[id].next) {
        FAIL_IF(id >= t->n_blocks || t->blocks[id].state != KVP__TB_READY || ++c > t->n_ready);
        FAIL_IF(t->blocks[id].prev != prev);
        prev = id;
    }
    bool lru = t->pol.eviction == KVP_EVICT_LRU;
    FAIL_IF(c != (lru ? t->n_ready : 0) || prev != t->lru_tail);
    FAIL_IF(t->pol.n_blocks != t->n_blocks);
    if (!lru) {
        FAIL_IF(t->n_listed != t->n_ready - t->n_loading);
        int rc = kvp__policy_check(&t->pol, tier_block_listed, t);
        if (rc != KVP_OK)
            return rc;
    }
    c = 0;
    for (uint32_t s = 0; s <= t->mask; s++) {
        uint32_t id = t->slots[s];
        if (id == KVP_NIL)
            continue;
        FAIL_IF(id >= t->n_blocks || t->blocks[id].state == KVP__TB_FREE);
        c++;
    }
    FAIL_IF(c != t->n_pending + t->n_ready);
    return KVP_OK;
}

/* Each block of tier k: ref == the live load orders reading it. KVP_ENOMEM when the
 * counters cannot be allocated (through the cache's allocator: back to its count after). */
static int check_load_refs(const kvp_cache *cache, int k)
{
    const kvp__tiers *ts = cache->tiers;
    const kvp__tier *t = &ts->tier[k];
    kvp__mem *mem = (kvp__mem *)&cache->mem;
    uint32_t *refs = kvp__mem_calloc(mem, t->n_blocks, sizeof *refs);
    if (!refs)
        return kvp__fail(KVP_ENOMEM, "out of memory: the checker's %" PRIu32 " counters",
                         t->n_blocks);
    int rc = KVP_OK;
    for (uint32_t s = 0; s < ts->cap_orders; s++) {
        const kvp__order *o = &ts->orders[s];
        if (o->id && o->kind == KVP_ORDER_LOAD && o->tier == k)
            refs[o->tier_block]++;
    }
    for (uint32_t id = 0; id < t->n_blocks && rc == KVP_OK; id++)
        if (refs[id] != t->blocks[id].ref)
            rc = kvp__fail(KVP_ECORRUPT,
                           "tier check failed: tier %d block %" PRIu32 " has %" PRIu32
                           " load pins for %" PRIu32 " orders",
                           k, id, t->blocks[id].ref, refs[id]);
    kvp__mem_free(mem, refs, (size_t)t->n_blocks * sizeof *refs);
    return rc;
}

/* Checker of the tiers and orders (invariants in tier.h). KVP_OK at once without tiers;
 * KVP_ENOMEM when the counters cannot be allocated. */
int kvp__tier_check(const kvp_cache *cache)
{
    const kvp__tiers *ts = cache->tiers;
    if (!ts)
        return KVP_OK;
    FAIL_IF(ts->n_tiers < 2 || ts->n_tiers > (int)KVP_MAX_TIERS);
    for (int k = 1; k < ts->n_tiers; k++) {
        int rc = kvp__tier_table_check(&ts->tier[k]);
        if (rc != KVP_OK)
            return rc;
    }
    /* Orders: each pending block has one store order, each load pin one load order. */
    uint32_t n_live = 0, n_new = 0, n_stores[KVP_MAX_TIERS] = {0};
    for (uint32_t s = 0; s < ts->cap_orders; s++) {
        const kvp__order *o = &ts->orders[s];
        if (o->id == 0)
            continue;
        n_live++;
        FAIL_IF((uint32_t)o->id != s || o->tier < 1 || o->tier >= ts->n_tiers);
        FAIL_IF(o->device_block >= cache->pool.n_blocks);
        const kvp__tier *t = &ts->tier[o->tier];
        FAIL_IF(o->tier_block >= t->n_blocks);
        const kvp__tblock *b = &t->blocks[o->tier_block];
        FAIL_IF(!kvp__key_eq(b->key, o->key));
        if (o->kind == KVP_ORDER_STORE) {
            FAIL_IF(b->state != KVP__TB_PENDING);
            FAIL_IF(!kvp__block_is_in_use(&cache->pool, o->device_block));
            n_stores[o->tier]++;
            n_new += !o->handed_out;
        } else {
            FAIL_IF(o->kind != KVP_ORDER_LOAD || !o->handed_out);
            FAIL_IF(b->state != KVP__TB_READY || b->ref == 0);
        }
    }
    FAIL_IF(n_live != ts->n_orders || n_new != ts->n_new);
    for (int k = 1; k < ts->n_tiers; k++) {
        int rc = check_load_refs(cache, k);
        if (rc != KVP_OK)
            return rc;
        FAIL_IF(n_stores[k] != ts->tier[k].n_pending);
    }
    uint32_t c = 0;
    for (uint32_t s = ts->new_head; s != KVP_NIL; s = ts->orders[s].next) {
        FAIL_IF(s >= ts->cap_orders || ts->orders[s].id == 0 || ts->orders[s].handed_out ||
                ++c > ts->n_new);
    }
    FAIL_IF(c != ts->n_new);
    return KVP_OK;
}

/* Add the device pins of live store orders to refs (kvp__requests_check's counters). */
void kvp__tier_count_pins(const kvp_cache *cache, uint32_t *refs)
{
    const kvp__tiers *ts = cache->tiers;
    if (!ts)
        return;
    for (uint32_t s = 0; s < ts->cap_orders; s++) {
        const kvp__order *o = &ts->orders[s];
        if (o->id != 0 && o->kind == KVP_ORDER_STORE && o->device_block < cache->pool.n_blocks)
            refs[o->device_block]++;
    }
}
