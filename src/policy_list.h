/*
 * policy_list.h - the doubly linked lists every non-LRU policy keeps through its per-block
 * records (policy.h), inline in each policy's file: out of line they cost S3-FIFO about 3%
 * of its instructions per request on bench_core (c) (its eviction moves blocks between
 * FIFOs). Cannot fail.
 */
#ifndef KVP_POLICY_LIST_H
#define KVP_POLICY_LIST_H

#include "internal.h"

/* The fields of a fresh record (kvp__pblock_taken below, and the policies' batched
 * evictions, which keep the clock in a local): no history, no home, last used at clock.
 * Its list links are the caller's. Cannot fail. */
static KVP__ALWAYS_INLINE void kvp__pblock_clear(kvp__pblock *b, uint64_t clock)
{
    b->depth = 0;
    b->n_hits = 0;
    b->freq = 0;
    b->hist = 0;
    b->cls = 0;
    b->key = 0;
    b->home = KVP__PL_NONE;
    b->last_use = clock;
}

/* Block id was just handed out by the pool (free or evicted): a fresh record, on no list
 * and with no home until its first release as an indexed block (kvp__policy_taken, and the
 * policies' batched evictions). Cannot fail. */
static inline void kvp__pblock_taken(kvp__policy *p, uint32_t id)
{
    kvp__pblock *b = &p->b[id];
    assert(b->list == KVP__PL_NONE);
    kvp__pblock_clear(b, ++p->clock);
}

/* The shared part of a release (kvp__policy_release): block id's clock and depth. */
static inline kvp__pblock *kvp__pblock_released(kvp__policy *p, uint32_t id, uint32_t depth)
{
    kvp__pblock *b = &p->b[id];
    b->last_use = ++p->clock;
    b->depth = depth;
    return b;
}

/* Queue cached block id at the tail of list l and count it cached (*n_cached: pool.n_lru or a
 * tier's n_listed). A new head of a CDECAY FIFO takes its place in CDECAY's order of the
 * FIFOs (kvp__cdecay_head) unless cdecay is false (l is not a CDECAY FIFO, or the caller
 * places the head itself). */
static inline void kvp__plist_push_in(kvp__policy *p, uint8_t l, uint32_t id, bool cdecay)
{
    kvp__pblock *b = &p->b[id];
    kvp__plist *L = &p->list[l];
    assert(l != KVP__PL_NONE && b->list == KVP__PL_NONE);
    b->list = l;
    b->prev = L->tail;
    b->next = KVP_NIL;
    if (L->tail != KVP_NIL)
        p->b[L->tail].next = id;
    else
        L->head = id;
    L->tail = id;
    L->n++;
    (*p->n_cached)++;
    if (cdecay && l >= KVP__PL_C0 && L->head == id)
        kvp__cdecay_head(p, l - KVP__PL_C0);
}

static inline void kvp__plist_push(kvp__policy *p, uint8_t l, uint32_t id)
{
    kvp__plist_push_in(p, l, id, true);
}

/* Take block id off its list; it no longer counts as cached (*n_cached) (cdecay: the policy
 * may be CDECAY; false skips the test). A CDECAY FIFO
 * that loses its head moves in CDECAY's order of the FIFOs. */
static inline void kvp__plist_remove_in(kvp__policy *p, uint32_t id, bool cdecay)
{
    kvp__pblock *b = &p->b[id];
    assert(b->list != KVP__PL_NONE && *p->n_cached > 0);
    uint8_t l = b->list;
    kvp__plist *L = &p->list[l];
    bool was_head = L->head == id;
    if (b->prev != KVP_NIL)
        p->b[b->prev].next = b->next;
    else
        L->head = b->next;
    if (b->next != KVP_NIL)
        p->b[b->next].prev = b->prev;
    else
        L->tail = b->prev;
    L->n--;
    b->list = KVP__PL_NONE;
    b->prev = b->next = KVP_NIL;
    (*p->n_cached)--;
    if (cdecay && l >= KVP__PL_C0 && was_head)
        kvp__cdecay_head(p, l - KVP__PL_C0);
}

/* Take the head of nonempty list l, which is not a CDECAY FIFO, off it: kvp__plist_remove
 * knowing the block has no predecessor. Cannot fail. */
static inline uint32_t kvp__plist_pop(kvp__policy *p, uint8_t l)
{
    kvp__plist *L = &p->list[l];
    uint32_t id = L->head;
    kvp__pblock *b = &p->b[id];
    assert(l < KVP__PL_C0 && id != KVP_NIL && b->list == l && b->prev == KVP_NIL);
    assert(*p->n_cached > 0);
    uint32_t next = b->next;
    L->head = next;
    if (next != KVP_NIL)
        p->b[next].prev = KVP_NIL;
    else
        L->tail = KVP_NIL;
    L->n--;
    b->list = KVP__PL_NONE;
    b->next = KVP_NIL;
    (*p->n_cached)--;
    return id;
}

static inline void kvp__plist_remove(kvp__policy *p, uint32_t id)
{
    kvp__plist_remove_in(p, id, true);
}

/* Block id is pinned by a hit (kvp__policy_hit, and the device pool's pin, which inlines it):
 * off its list if it was cached; SLRU sends it to protected at its release, S3-FIFO counts
 * it (freq, capped), CDECAY learns at the release. Cannot fail. */
static inline void kvp__pblock_hit(kvp__policy *p, uint32_t id)
{
    kvp__pblock *b = &p->b[id];
    int ev = p->eviction;
    if (b->list != KVP__PL_NONE)
        kvp__plist_remove(p, id);
    b->n_hits++;
    b->last_use = ++p->clock;
    if (ev == KVP_EVICT_SLRU)
        b->home = KVP__PL_B;
    else if (ev == KVP_EVICT_S3FIFO && b->freq < KVP__S3_FREQ_MAX)
        b->freq++;
}

/* Define a policy's unpin run, uint32_t name(p, state, ids, hi) (kvp__policy_unpin_run's
 * case for it), with release_one(p, id, depth) its inline single release: walk ids[hi - 1],
 * ids[hi - 2], ... while the block's state word (the device pool's, internal.h) says the pin
 * being dropped is the last of an indexed block, make each cached (KVP__ST_CACHED) and
 * release it at its depth; return lo, the last position released (ids[lo .. hi) were;
 * lo == 0, or block ids[lo - 1] does not become cached: the pool drops its pin and walks on
 * below it). The same releases in the same order as kvp__policy_release on each block, in one
 * walk of the blocks (pool.c, unpin_policy_run). */
#define KVP__POLICY_DEFINE_UNPIN_RUN(name, release_one)                                            \
    uint32_t name(kvp__policy *restrict p, uint32_t *restrict state, const uint32_t *ids,          \
                  uint32_t hi)                                                                     \
    {                                                                                              \
        while (hi > 0) {                                                                           \
            uint32_t id = ids[hi - 1];                                                             \
            if (!KVP__LIKELY(state[id] == (KVP__ST_IN_USE | KVP__ST_INDEXED | 1)))                 \
                break;                                                                             \
            state[id] = KVP__ST_CACHED;                                                            \
            hi--;                                                                                  \
            release_one(p, id, hi);                                                                \
        }                                                                                          \
        return hi;                                                                                 \
    }

#endif /* KVP_POLICY_LIST_H */
