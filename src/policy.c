/*
 * policy.c - the parts every non-LRU eviction policy shares (policy.h): configuration,
 * the per-block records and their allocation, the doubly linked lists, the dispatch of the
 * pool's hooks on cfg.eviction, and the shared invariant checker.
 *
 *   policy.b[id]  {prev, next, depth, n_hits, last_use, key, list, home, freq, hist, cls}
 *                 40 bytes
 *   policy.fp_of[id]  its key's ghost fingerprint, 8 bytes, S3-FIFO and CDECAY only
 *   policy.list[l]: head -> .. -> tail, for l = A, B (SLRU, S3-FIFO), C0 .. C0+26 (CDECAY)
 *   policy.link[id] {parent key, parent id}   24 bytes, with kvp_config.count_orphans only
 *
 * Invariants (kvp__policy_check): under LRU no record is allocated and every list is empty.
 * Otherwise a block is on a list (list != NONE) iff it is cached, and the list is one its
 * policy uses; each list is linked both ways from head to tail without a cycle and its n is
 * its length, the lists' lengths sum to pool.n_lru, and the pool's LRU ring holds no entry.
 * Then each policy's own checker runs.
 *
 * Orphans (count_orphans): kvp__policy_link records, for every block of a chain being
 * released, the block before it and that block's key; kvp__policy_orphans (kvp_cache_stats)
 * counts the cached blocks whose recorded parent is neither still indexed under that key nor
 * stored again elsewhere (one index probe per cached block whose parent block was recycled).
 * Computed on demand rather than kept up to date: an eviction would have to find the
 * evicted block's cached children (a reverse map from a key to its children), a cost on
 * every eviction for a figure read rarely. Under LRU without count_orphans the pool's only
 * cost is one test of link per release call (not per block).
 *
 * Cost: 40 bytes per block (48 under S3-FIFO and CDECAY); every hook O(1) except evict, which is
 * O(1) amortised (see the policies). Nothing allocates after kvp__policy_init.
 */
#include <string.h>

#include "policy_list.h"

/* Validate a policy's parameters: KVP_OK or KVP_EINVAL. */
int kvp__policy_params_check(const kvp__pparams *pp)
{
    if (pp->eviction != KVP_EVICT_LRU && pp->eviction != KVP_EVICT_SLRU &&
        pp->eviction != KVP_EVICT_S3FIFO && pp->eviction != KVP_EVICT_CDECAY)
        return kvp__fail(KVP_EINVAL, "eviction is %d: not a KVP_EVICT_* policy", pp->eviction);
    if (pp->slru_protected_pct > 100)
        return kvp__fail(KVP_EINVAL, "slru_protected_pct is %" PRIu32 ", outside 0..100",
                         pp->slru_protected_pct);
    if (pp->s3fifo_small_pct < 1 || pp->s3fifo_small_pct > 100)
        return kvp__fail(KVP_EINVAL, "s3fifo_small_pct is %" PRIu32 ", outside 1..100",
                         pp->s3fifo_small_pct);
    if (pp->s3fifo_ghost_pct > 1000)
        return kvp__fail(KVP_EINVAL, "s3fifo_ghost_pct is %" PRIu32 ", outside 0..1000",
                         pp->s3fifo_ghost_pct);
    if (pp->cdecay_tau > 1000000000)
        return kvp__fail(KVP_EINVAL, "cdecay_tau is %" PRIu32 ", outside 0..10^9 (0: 20000)",
                         pp->cdecay_tau);
    if (pp->cdecay_ghost_pct > 10000)
        return kvp__fail(KVP_EINVAL, "cdecay_ghost_pct is %" PRIu32 ", outside 0..10000 (0: 1600)",
                         pp->cdecay_ghost_pct);
    return KVP_OK;
}

/* The policy parameters of a cache's config. Cannot fail. */
void kvp__policy_params_of(const kvp_config *cfg, kvp__pparams *pp)
{
    KVP__PPARAMS_FROM(pp, cfg);
}

/* Allocate the ghost of `ghost` keys (with infos under CDECAY) in a table at most 1/spread
 * full. KVP_OK or KVP_ENOMEM. */
static int ghost_init(kvp__policy *p, uint64_t ghost, bool info, uint32_t spread)
{
    if (ghost == 0)
        return KVP_OK;
    if (ghost > UINT32_MAX / 8)
        ghost = UINT32_MAX / 8;
    uint64_t t = 4;
    while (t < spread * ghost)
        t *= 2;
    p->ghost_cap = (uint32_t)ghost;
    p->gtab_mask = (uint32_t)(t - 1);
    if (info) { /* CDECAY's: a ring of table slots, a table of (fingerprint, link, info) */
        p->gring = kvp__mem_alloc(p->mem, ghost * sizeof *p->gring);
        p->gslot = kvp__mem_calloc(p->mem, t, sizeof *p->gslot);
        if (!p->gring || !p->gslot)
            return kvp__fail(KVP_ENOMEM, "out of memory: the ghost of %" PRIu64 " evicted keys",
                             ghost);
        return KVP_OK;
    }
    p->ghost = kvp__mem_alloc(p->mem, ghost * sizeof *p->ghost);
    p->gtab_fp = kvp__mem_calloc(p->mem, t, sizeof *p->gtab_fp);
    p->gtab_n = kvp__mem_calloc(p->mem, t, sizeof *p->gtab_n);
    if (!p->ghost || !p->gtab_fp || !p->gtab_n)
        return kvp__fail(KVP_ENOMEM, "out of memory: the ghost of %" PRIu64 " evicted keys", ghost);
    return KVP_OK;
}

/* Bind *p to a pool of n_blocks blocks (keys and n_cached as in kvp__policy, owned by the
 * pool; mem allocates) under parameters pp (checked), and allocate the per-block records and
 * the ghost unless the policy is LRU; size the segments. KVP_OK or KVP_ENOMEM (nothing
 * kept: *p is then as after kvp__policy_free). */
int kvp__policy_init(kvp__policy *p, const kvp__pparams *pp, uint32_t n_blocks, kvp__mem *mem,
                     const void *keys, size_t key_stride, uint32_t *n_cached)
{
    uint64_t n = n_blocks;
    memset(p, 0, sizeof *p);
    for (int l = 0; l < KVP__PL_N; l++)
        p->list[l].head = p->list[l].tail = KVP_NIL;
    p->eviction = pp->eviction;
    p->n_blocks = n_blocks;
    p->mem = mem;
    if (pp->eviction == KVP_EVICT_LRU)
        return KVP_OK;
    p->keys = keys;
    p->key_stride = key_stride;
    p->n_cached = n_cached;
    p->b = kvp__mem_alloc(mem, n * sizeof *p->b);
    if (!p->b) {
        kvp__policy_free(p);
        return kvp__fail(KVP_ENOMEM, "out of memory: the policy records of %" PRIu64 " blocks", n);
    }
    for (uint64_t i = 0; i < n; i++) {
        memset(&p->b[i], 0, sizeof p->b[i]);
        p->b[i].prev = p->b[i].next = KVP_NIL;
    }
    p->cap_b = (uint32_t)(n * pp->slru_protected_pct / 100);
    uint64_t small = n * pp->s3fifo_small_pct / 100;
    p->cap_a = (uint32_t)(small ? small : 1);
    int rc = KVP_OK;
    if (pp->eviction == KVP_EVICT_S3FIFO || pp->eviction == KVP_EVICT_CDECAY) {
        p->fp_of = kvp__mem_calloc(mem, n, sizeof *p->fp_of);
        if (!p->fp_of) {
            kvp__policy_free(p);
            return kvp__fail(KVP_ENOMEM, "out of memory: the fingerprints of %" PRIu64 " blocks",
                             n);
        }
    }
    if (pp->eviction == KVP_EVICT_S3FIFO) {
        rc = ghost_init(p, (n - p->cap_a) * pp->s3fifo_ghost_pct / 100, false, 8);
    } else if (pp->eviction == KVP_EVICT_CDECAY) {
        uint32_t pct = pp->cdecay_ghost_pct ? pp->cdecay_ghost_pct : 1600;
        p->cd_tau = pp->cdecay_tau ? pp->cdecay_tau : 20000;
        p->cd_chain_depth = UINT32_MAX;
        memset(p->cd_win, 0xff, sizeof p->cd_win);
        memset(p->cd_pos, 0xff, sizeof p->cd_pos);
        memset(p->cd_snap_trials, 0xff, sizeof p->cd_snap_trials);
        memset(p->cd_snap_reused, 0xff, sizeof p->cd_snap_reused);
        rc = ghost_init(p, n * pct / 100, true, 4);
    }
    if (rc != KVP_OK)
        kvp__policy_free(p);
    return rc;
}

/* Free the records and the ghost (any may be NULL). The parent links are the pool's
 * (kvp__policy_links_free). Cannot fail. */
void kvp__policy_free(kvp__policy *p)
{
    size_t n = p->n_blocks, t = p->ghost_cap ? (size_t)p->gtab_mask + 1 : 0;
    if (!p->mem)
        return;
    kvp__mem_free(p->mem, p->b, p->b ? n * sizeof *p->b : 0);
    kvp__mem_free(p->mem, p->fp_of, p->fp_of ? n * sizeof *p->fp_of : 0);
    kvp__mem_free(p->mem, p->ghost, p->ghost ? p->ghost_cap * sizeof *p->ghost : 0);
    kvp__mem_free(p->mem, p->gtab_fp, p->gtab_fp ? t * sizeof *p->gtab_fp : 0);
    kvp__mem_free(p->mem, p->gtab_n, p->gtab_n ? t * sizeof *p->gtab_n : 0);
    kvp__mem_free(p->mem, p->gring, p->gring ? p->ghost_cap * sizeof *p->gring : 0);
    kvp__mem_free(p->mem, p->gslot, p->gslot ? t * sizeof *p->gslot : 0);
    p->b = NULL;
    p->fp_of = NULL;
    p->gring = NULL;
    p->gslot = NULL;
    p->ghost = NULL;
    p->gtab_fp = NULL;
    p->gtab_n = NULL;
    p->ghost_cap = 0;
    p->gtab_mask = 0;
}

/* The device pool's parent links, with kvp_config.count_orphans (else nothing). KVP_OK or
 * KVP_ENOMEM. */
int kvp__policy_links_init(kvp_cache *cache)
{
    kvp__policy *p = &cache->policy;
    uint64_t n = cache->cfg.n_blocks;
    if (!cache->cfg.count_orphans)
        return KVP_OK;
    p->link = kvp__mem_alloc(&cache->mem, n * sizeof *p->link);
    if (!p->link)
        return kvp__fail(KVP_ENOMEM, "out of memory: the parent links of %" PRIu64 " blocks", n);
    for (uint64_t i = 0; i < n; i++)
        p->link[i] = (kvp__plink){{0, 0}, KVP_NIL, 0};
    return KVP_OK;
}

/* Free the parent links (may be NULL). Cannot fail. */
void kvp__policy_links_free(kvp_cache *cache)
{
    kvp__policy *p = &cache->policy;
    kvp__mem_free(&cache->mem, p->link, p->link ? cache->cfg.n_blocks * sizeof *p->link : 0);
    p->link = NULL;
}

/* Block id was just handed out by the pool (free or evicted): a fresh record, on no list
 * and with no home until its first release as an indexed block. Cannot fail. */
void kvp__policy_taken(kvp__policy *p, uint32_t id)
{
    kvp__pblock_taken(p, id);
}

/* Block id is pinned by a hit (before the pool counts the pin): off its list if it was
 * cached; SLRU sends it to protected at its release, S3-FIFO counts it (freq, capped),
 * CDECAY learns at the release. Cannot fail. */
void kvp__policy_hit(kvp__policy *p, uint32_t id)
{
    kvp__pblock_hit(p, id);
}

/* Record each block's parent (ids[i - 1], when indexed) for the orphan count. Cannot fail. */
void kvp__policy_link(kvp_cache *cache, const uint32_t *ids, uint32_t n)
{
    kvp__plink *link = cache->policy.link;
    const kvp__block *blocks = cache->pool.blocks;
    for (uint32_t i = 0; i < n; i++) {
        kvp__plink *k = &link[ids[i]];
        const kvp__block *pb = i ? &blocks[ids[i - 1]] : NULL;
        if (pb && kvp__block_is_indexed(&cache->pool, ids[i - 1])) {
            k->parent = pb->key;
            k->parent_id = ids[i - 1];
        } else {
            k->parent_id = KVP_NIL;
        }
    }
}

/* The chain ids[0 .. n) is about to be released, last block first (before any release
 * hook): CDECAY's per-request state. Cannot fail. */
void kvp__policy_release_begin(kvp__policy *p, const uint32_t *ids, uint32_t n)
{
    if (p->eviction == KVP_EVICT_CDECAY)
        kvp__cdecay_begin(p, ids, n);
}

/* Cached blocks whose recorded parent key is indexed nowhere (count_orphans; else 0).
 * Reads only. Cannot fail. */
uint32_t kvp__policy_orphans(const kvp_cache *cache)
{
    const kvp__plink *link = cache->policy.link;
    const kvp__block *blocks = cache->pool.blocks;
    uint32_t n = 0;
    if (!link)
        return 0;
    for (uint32_t id = 0; id < cache->pool.n_blocks; id++) {
        if (!kvp__block_is_cached(&cache->pool, id) || link[id].parent_id == KVP_NIL)
            continue;
        const kvp__block *pb = &blocks[link[id].parent_id];
        if (kvp__block_is_indexed(&cache->pool, link[id].parent_id) &&
            kvp__key_eq(pb->key, link[id].parent))
            continue;
        n += kvp__index_find(&cache->index, link[id].parent) == NULL;
    }
    return n;
}

/* Indexed block id, block depth of its chain, lost its last pin and is cached. At its first
 * release it is admitted (SLRU: probation unless a hit already sent it to protected;
 * S3-FIFO: main if the ghost remembers its key, else small). Cannot fail. */
void kvp__policy_release(kvp__policy *p, uint32_t id, uint32_t depth)
{
    switch (p->eviction) {
    case KVP_EVICT_S3FIFO:
        kvp__s3fifo_release(p, id, depth);
        return;
    case KVP_EVICT_SLRU:
        kvp__slru_release(p, id, depth);
        return;
    default:
        kvp__cdecay_release(p, id, depth);
        return;
    }
}

/* The device pool's unpin run, for a policy that defines one (kvp__policy_unpins; pool.c,
 * unpin_policy_run; state is pool.state): from the top of the chain ids[0 .. hi) down, while
 * block ids[i]'s pin being dropped is the last of an indexed block, make it cached (its word
 * KVP__ST_CACHED) and release it at depth i, in one walk of the blocks; return lo, the last
 * position released (ids[lo .. hi) were, and lo == 0 or ids[lo - 1] does not become cached).
 * Cannot fail. */
uint32_t kvp__policy_unpin_run(kvp__policy *p, uint32_t *state, const uint32_t *ids, uint32_t hi)
{
    assert(kvp__policy_unpins(p));
    switch (p->eviction) {
    case KVP_EVICT_S3FIFO:
        return kvp__s3fifo_unpin_run(p, state, ids, hi);
    case KVP_EVICT_SLRU:
        return kvp__slru_unpin_run(p, state, ids, hi);
    default:
        return kvp__cdecay_unpin_run(p, state, ids, hi);
    }
}

/* The policy's victim, off its list, or KVP_NIL when nothing is cached. */
uint32_t kvp__policy_evict(kvp__policy *p)
{
    if (*p->n_cached == 0)
        return KVP_NIL;
    switch (p->eviction) {
    case KVP_EVICT_SLRU:
        return kvp__slru_evict(p);
    case KVP_EVICT_S3FIFO:
        return kvp__s3fifo_evict(p);
    default:
        return kvp__cdecay_evict(p);
    }
}

/* n victims into ids[0 .. n) (the caller knows n blocks are cached), each taken: the same
 * victims, in the same order and with the same records, as n rounds of kvp__policy_evict
 * then kvp__policy_taken, in one call (the policy's loop inlines both). Cannot fail. */
void kvp__policy_evict_n(kvp__policy *p, uint32_t *ids, uint32_t n)
{
    assert(*p->n_cached >= n);
    switch (p->eviction) {
    case KVP_EVICT_SLRU:
        kvp__slru_evict_n(p, ids, n);
        return;
    case KVP_EVICT_S3FIFO:
        kvp__s3fifo_evict_n(p, ids, n);
        return;
    default:
        kvp__cdecay_evict_n(p, ids, n);
        return;
    }
}

/* Cached block id leaves the order (evicted for a quota, or replaced). Cannot fail. */
void kvp__policy_unlink(kvp__policy *p, uint32_t id)
{
    kvp__plist_remove(p, id);
}

/* Any cached block, off its list, for kvp_cache_reset: the head of the first nonempty list
 * (A, B, then CDECAY's), else KVP_NIL. No ghost entry, no freq change. Cannot fail. */
uint32_t kvp__policy_drop_one(kvp__policy *p)
{
    for (int l = KVP__PL_A; l < KVP__PL_N; l++) {
        uint32_t id = p->list[l].head;
        if (id != KVP_NIL) {
            kvp__plist_remove(p, id);
            return id;
        }
    }
    return KVP_NIL;
}

/* Walk list l: its length, or UINT32_MAX on a bad link, a cycle or a block that is not
 * cached or names another list. */
static uint32_t walk_list(const kvp__policy *p, uint8_t l,
                          bool (*cached)(const void *ctx, uint32_t id), const void *ctx)
{
    const kvp__plist *L = &p->list[l];
    uint32_t n = 0, prev = KVP_NIL;
    for (uint32_t id = L->head; id != KVP_NIL; id = p->b[id].next) {
        if (id >= p->n_blocks || n >= p->n_blocks)
            return UINT32_MAX;
        const kvp__pblock *b = &p->b[id];
        if (b->list != l || b->prev != prev || !cached(ctx, id))
            return UINT32_MAX;
        prev = id;
        n++;
    }
    return prev == L->tail ? n : UINT32_MAX;
}

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);       \
    } while (0)

/* The shared invariants (top of this file), then the policy's own checker; cached(ctx, id)
 * says whether the pool counts block id cached. KVP_OK, KVP_ECORRUPT or KVP_ENOMEM. */
int kvp__policy_check(const kvp__policy *p, bool (*cached)(const void *ctx, uint32_t id),
                      const void *ctx)
{
    if (p->eviction == KVP_EVICT_LRU) {
        for (int l = KVP__PL_A; l < KVP__PL_N; l++)
            FAIL_IF(p->list[l].n != 0);
        FAIL_IF(p->b != NULL);
        return KVP_OK;
    }
    FAIL_IF(!p->b || !p->n_cached);
    uint64_t n_listed = 0;
    for (int l = KVP__PL_A; l < KVP__PL_N; l++) {
        uint32_t nl = walk_list(p, (uint8_t)l, cached, ctx);
        FAIL_IF(nl == UINT32_MAX || nl != p->list[l].n);
        n_listed += nl;
    }
    FAIL_IF(n_listed != *p->n_cached);
    bool cdecay = p->eviction == KVP_EVICT_CDECAY;
    for (uint32_t id = 0; id < p->n_blocks; id++) {
        const kvp__pblock *b = &p->b[id];
        bool is_cached = cached(ctx, id);
        FAIL_IF(is_cached != (b->list != KVP__PL_NONE));
        FAIL_IF(b->list >= KVP__PL_N ||
                (b->list != KVP__PL_NONE && cdecay != (b->list >= KVP__PL_C0)));
        FAIL_IF(b->last_use > p->clock);
        FAIL_IF(b->home > KVP__PL_B || (is_cached && b->home == KVP__PL_NONE));
    }
    switch (p->eviction) {
    case KVP_EVICT_SLRU:
        return kvp__policy_slru_check(p);
    case KVP_EVICT_S3FIFO:
        return kvp__policy_s3fifo_check(p);
    default:
        return kvp__policy_cdecay_check(p);
    }
}
