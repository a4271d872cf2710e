/*
 * policy_slru.c - segmented LRU eviction (kvp_config.eviction = KVP_EVICT_SLRU).
 *
 *   probation (list A):  head (evicted first) .. tail (last released)
 *   protected (list B):  head (demoted first) .. tail (last released), at most cap_b blocks
 *                        (cap_b = n_blocks * slru_protected_pct / 100)
 *
 * Rules. A block joins probation's tail at its first release as an indexed block. A block
 * that is hit (pinned by a lookup hit, whether it was cached or held by another request)
 * joins protected's tail at its next release; when protected then holds more than cap_b
 * blocks, its head is demoted to probation's tail (and would need another hit to return).
 * The victim is probation's head, or protected's head when probation is empty. So a scan
 * of blocks seen once only churns probation and never flushes protected.
 *
 * Pinned blocks are on no list (they cannot be evicted); a block's position is the time of
 * its last release, as under LRU. Quotas: a namespace over its quota loses its least
 * recently released cached block (quota.c's list, the same rule as under LRU): the quota
 * promise is about isolation, and that list already orders a namespace's blocks without a
 * second pair of segments per namespace.
 *
 * Chain rule: SLRU never orphans a block by evicting. A request releases its chain tail first,
 * so each parent is released after its child, and a request that touches a child touches
 * (and hits) its parent: a cached child's parent is cached or pinned, and when cached it is in
 * protected if the child is, and behind it in the same segment (released later). Demotions
 * take protected's head and evictions probation's head, so a child always goes before its
 * parent. Orphans come only from removals outside the order (a verify-mode replacement of
 * the parent); kvp_config.count_orphans counts them (policy.c). The quota list keeps the same
 * order, so a quota eviction cannot orphan either.
 *
 * Invariants (kvp__policy_slru_check): protected holds at most cap_b blocks; every cached
 * block's list is its home (a released block sits where its history sends it).
 *
 * Cost: release O(1) (one demotion at most), evict O(1), 40 bytes per block (policy.c).
 * bench_core (c): 1.087x LRU's instructions per request (121.2k against 111.5k;
 * docs/performance.md, "S3-FIFO within 1.25x after the state words").
 */
#include "policy_list.h"

/* Indexed block id, block depth of its chain, became cached: to its segment's tail (at its
 * first release probation, unless a hit already sent it to protected), demoting protected's
 * head when protected overflows. Cannot fail. */
static inline void release_one(kvp__policy *p, uint32_t id, uint32_t depth)
{
    kvp__pblock *b = kvp__pblock_released(p, id, depth);
    if (b->home == KVP__PL_NONE)
        b->home = KVP__PL_A;
    kvp__plist_push_in(p, b->home, id, false);
    if (p->list[KVP__PL_B].n > p->cap_b) {
        uint32_t d = kvp__plist_pop(p, KVP__PL_B);
        p->b[d].home = KVP__PL_A;
        kvp__plist_push(p, KVP__PL_A, d);
    }
}

/* One block (kvp__policy_release). Cannot fail. */
void kvp__slru_release(kvp__policy *p, uint32_t id, uint32_t depth)
{
    release_one(p, id, depth);
}

/* Blocks becoming cached from the top of a released chain (kvp__policy_unpin_run). */
KVP__POLICY_DEFINE_UNPIN_RUN(kvp__slru_unpin_run, release_one)

/* Probation's head, else protected's head, off its list (pool.n_lru > 0). */
static inline uint32_t evict_one(kvp__policy *p)
{
    return kvp__plist_pop(p, p->list[KVP__PL_A].n ? KVP__PL_A : KVP__PL_B);
}

uint32_t kvp__slru_evict(kvp__policy *p)
{
    return evict_one(p);
}

/* n victims into ids[0 .. n) (n blocks are cached), each as kvp__policy_taken leaves it: the
 * same victims in the same order as n calls of kvp__slru_evict, each followed by
 * kvp__policy_taken. */
void kvp__slru_evict_n(kvp__policy *restrict p, uint32_t *ids, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t v = evict_one(p);
        kvp__pblock_taken(p, v);
        ids[k] = v;
    }
}

/* Invariants above. KVP_OK or KVP_ECORRUPT. */
int kvp__policy_slru_check(const kvp__policy *p)
{
    if (p->list[KVP__PL_B].n > p->cap_b)
        return kvp__fail(KVP_ECORRUPT,
                         "invariant violated in %s: protected holds %" PRIu32
                         " blocks, above its capacity %" PRIu32,
                         __func__, p->list[KVP__PL_B].n, p->cap_b);
    for (uint32_t id = 0; id < p->n_blocks; id++) {
        const kvp__pblock *b = &p->b[id];
        if (b->list != KVP__PL_NONE && b->list != b->home)
            return kvp__fail(KVP_ECORRUPT,
                             "invariant violated in %s: block %" PRIu32
                             " is on list %u but its home is %u",
                             __func__, id, b->list, b->home);
    }
    return KVP_OK;
}
