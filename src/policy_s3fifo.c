/*
 * policy_s3fifo.c - S3-FIFO eviction (Yang et al., "FIFO queues are all you need for cache
 * eviction", SOSP'23; kvp_config.eviction = KVP_EVICT_S3FIFO).
 *
 *   small S (list A):  head (oldest) .. tail     target cap_a = n_blocks * s3fifo_small_pct
 *                                                 / 100 (at least 1)
 *   main  M (list B):  head (oldest) .. tail
 *   ghost G:           ring[ghost_head ..] of key fingerprints, oldest first, at most
 *                      ghost_cap = (n_blocks - cap_a) * s3fifo_ghost_pct / 100; plus the
 *                      multiset gtab of the same fingerprints (open addressing, linear
 *                      probing, backward-shift deletion) for O(1) membership
 *
 * Rules. A block is inserted at its first release as an indexed block (the moment it can
 * first be evicted): into M if its key is in G then, else into S. A hit adds one to its freq
 * (capped at 3). Eviction (one victim):
 *  1. if S holds at least cap_a blocks, or M is empty: take S's head; with freq > 0 it
 *     moves to M's tail (freq kept) and the step repeats while S is not empty; with
 *     freq 0 it is the victim and its key enters G (G's oldest key leaves when G is full);
 *  2. otherwise take M's head; with freq > 0 it goes back to M's tail with freq - 1, else
 *     it is the victim (not remembered in G).
 * One-hit wonders thus leave from S after a short stay, and a key evicted from S that
 * comes back soon goes straight to M.
 *
 * Pinned blocks cannot be evicted, so a block leaves its FIFO while pinned and re-enters
 * at its queue's tail on its release: its position is the time of its last release (the
 * paper's FIFO of insertion times, with pinning counted as use). Quotas: a namespace over
 * its quota loses its least recently released cached block (quota.c's list, the same rule
 * as under LRU and SLRU; see policy_slru.c for why).
 *
 * Chain rule: S3-FIFO orphans blocks and leaves them. A chain released together enters S tail
 * first, so its tail is evicted first while its blocks are all in S; but frequencies are
 * per block (a parent shared by many requests gets hits its children do not, and a block
 * moved to M is reinserted by its own freq), so a parent can leave before its child: the
 * child is an orphan (its parent key not indexed; no lookup reaches it until the parent is
 * stored again, which re-adopts it). Orphans are not evicted eagerly (they age out through
 * the FIFOs); kvp_config.count_orphans counts them (policy.c).
 *
 * Invariants (kvp__policy_s3fifo_check): every cached block's list is its home; freq <= 3;
 * its key's fingerprint is in fp_of (a block's key does not change while it is indexed);
 * the ghost's own (policy_ghost.c, which holds G's ring and table).
 *
 * Cost: a hit and a release O(1); an eviction O(1) amortised: each block moved from S to M
 * or reinserted into M was paid for by a hit; 48 bytes per block (policy.c) plus 8 bytes per
 * ghost key and 12 per ghost table slot (8 to 16 per key; policy_ghost.c). bench_core (c):
 * 1.221x LRU's instructions per request (136.0k against 111.5k; docs/performance.md, "S3-FIFO
 * within 1.25x after the state words"): the device pool's released chains walked here
 * (kvp__s3fifo_unpin_run), evictions batched (kvp__s3fifo_evict_n), both loops on locals.
 */
#include "policy_ghost.h"
#include "policy_list.h"

/* Indexed block id, block depth of its chain, became cached: to its home's tail; at its
 * first release its home is M if G remembers its key, else S. Cannot fail. */
static inline void release_one(kvp__policy *p, uint32_t id, uint32_t depth)
{
    kvp__pblock *b = kvp__pblock_released(p, id, depth);
    if (b->home == KVP__PL_NONE) {
        uint64_t f = kvp__ghost_fp(kvp__policy_key(p, id));
        p->fp_of[id] = f;
        b->home = kvp__ghost_has_fp(p, f) ? KVP__PL_B : KVP__PL_A;
    }
    kvp__plist_push_in(p, b->home, id, false);
}

/* One block (kvp__policy_release). Cannot fail. */
void kvp__s3fifo_release(kvp__policy *p, uint32_t id, uint32_t depth)
{
    release_one(p, id, depth);
}

/* Blocks becoming cached from the top of a released chain (kvp__policy_unpin_run): the walk
 * of KVP__POLICY_DEFINE_UNPIN_RUN (policy_list.h) with release_one written out on locals. A
 * store to a per-block record may alias any field of *p, so release_one on *p reloads the
 * records' base, the clock, the lists' tails and counts and the ghost's table at every block
 * and stores them back; here they live in locals and go back once, at the end (the lists'
 * heads are written at once: only an empty list's changes). The same releases, in the same
 * order, with the same result. Cannot fail. */
uint32_t kvp__s3fifo_unpin_run(kvp__policy *restrict p, uint32_t *restrict state,
                               const uint32_t *ids, uint32_t hi)
{
    kvp__pblock *const B = p->b;
    uint64_t *const fp_of = p->fp_of;
    kvp__gview g;
    kvp__gview_load(p, &g);
    uint64_t clock = p->clock;
    uint32_t s_tail = p->list[KVP__PL_A].tail, s_n = p->list[KVP__PL_A].n;
    uint32_t m_tail = p->list[KVP__PL_B].tail, m_n = p->list[KVP__PL_B].n;
    uint32_t n_pushed = 0;
    while (hi > 0) {
        uint32_t id = ids[hi - 1];
        if (!KVP__LIKELY(state[id] == (KVP__ST_IN_USE | KVP__ST_INDEXED | 1)))
            break;
        state[id] = KVP__ST_CACHED;
        hi--;
        kvp__pblock *b = &B[id];
        b->last_use = ++clock;
        b->depth = hi;
        uint8_t h = b->home;
        if (h == KVP__PL_NONE) {
            uint64_t f = kvp__ghost_fp(kvp__policy_key(p, id));
            fp_of[id] = f;
            h = g.cap != 0 && g.fp[kvp__gview_find(&g, f)] != 0 ? KVP__PL_B : KVP__PL_A;
            b->home = h;
        }
        assert(b->list == KVP__PL_NONE);
        b->list = h;
        b->next = KVP_NIL;
        uint32_t t;
        if (h == KVP__PL_A) {
            t = s_tail;
            s_tail = id;
            s_n++;
        } else {
            t = m_tail;
            m_tail = id;
            m_n++;
        }
        b->prev = t;
        if (t != KVP_NIL)
            B[t].next = id;
        else
            p->list[h].head = id;
        n_pushed++;
    }
    p->clock = clock;
    p->list[KVP__PL_A].tail = s_tail;
    p->list[KVP__PL_A].n = s_n;
    p->list[KVP__PL_B].tail = m_tail;
    p->list[KVP__PL_B].n = m_n;
    *p->n_cached += n_pushed;
    return hi;
}

/* The victim, off its list (pool.n_lru > 0). Steps as at the top of this file. */
static KVP__ALWAYS_INLINE uint32_t evict_one(kvp__policy *p)
{
    kvp__plist *S = &p->list[KVP__PL_A], *M = &p->list[KVP__PL_B];
    /* Step 1: from S while it is at its target size (or M is empty). */
    if (S->n >= p->cap_a || M->n == 0) {
        while (S->n > 0) {
            uint32_t id = kvp__plist_pop(p, KVP__PL_A);
            if (p->b[id].freq > 0) {
                p->b[id].home = KVP__PL_B;
                kvp__plist_push_in(p, KVP__PL_B, id, false);
                continue;
            }
            kvp__ghost_add_fp(p, p->fp_of[id], 0, false);
            return id;
        }
    }
    /* Step 2: from M, giving each block with freq > 0 another round. */
    for (;;) {
        assert(M->head != KVP_NIL);
        uint32_t id = kvp__plist_pop(p, KVP__PL_B);
        if (p->b[id].freq == 0)
            return id;
        p->b[id].freq--;
        kvp__plist_push_in(p, KVP__PL_B, id, false);
    }
}

uint32_t kvp__s3fifo_evict(kvp__policy *p)
{
    return evict_one(p);
}

/* n victims into ids[0 .. n) (n blocks are cached), each as kvp__policy_taken leaves it: the
 * same victims in the same order as n calls of kvp__s3fifo_evict, each followed by
 * kvp__policy_taken (a take does not touch the FIFOs or the ghost). evict_one's steps written
 * out on locals, as in kvp__s3fifo_unpin_run: the records' base, the clock, the FIFOs' ends
 * and counts and the ghost's fields, written back once (S's tail at once: it changes only
 * when S empties); n_cached loses n (a move from S to M leaves it as it was). Cannot fail. */
void kvp__s3fifo_evict_n(kvp__policy *restrict p, uint32_t *ids, uint32_t n)
{
    kvp__pblock *const B = p->b;
    const uint64_t *const fp_of = p->fp_of;
    const uint32_t cap_a = p->cap_a;
    kvp__gview g;
    kvp__gview_load(p, &g);
    uint64_t clock = p->clock;
    uint32_t s_head = p->list[KVP__PL_A].head, s_n = p->list[KVP__PL_A].n;
    uint32_t m_head = p->list[KVP__PL_B].head, m_tail = p->list[KVP__PL_B].tail;
    uint32_t m_n = p->list[KVP__PL_B].n;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t v;
        kvp__pblock *b;
        /* Step 1: from S while it is at its target size (or M is empty). */
        if (s_n >= cap_a || m_n == 0) {
            while (s_n > 0) {
                v = s_head;
                b = &B[v];
                assert(b->list == KVP__PL_A && b->prev == KVP_NIL);
                uint32_t nx = b->next;
                s_head = nx;
                if (nx != KVP_NIL)
                    B[nx].prev = KVP_NIL;
                else
                    p->list[KVP__PL_A].tail = KVP_NIL;
                s_n--;
                b->next = KVP_NIL;
                if (b->freq > 0) { /* to M's tail */
                    b->home = KVP__PL_B;
                    b->list = KVP__PL_B;
                    b->prev = m_tail;
                    if (m_tail != KVP_NIL)
                        B[m_tail].next = v;
                    else
                        m_head = v;
                    m_tail = v;
                    m_n++;
                    continue;
                }
                b->list = KVP__PL_NONE;
                kvp__gview_add_fp(&g, fp_of[v], 0, false);
                goto taken;
            }
        }
        /* Step 2: from M, giving each block with freq > 0 another round. */
        for (;;) {
            assert(m_head != KVP_NIL);
            v = m_head;
            b = &B[v];
            assert(b->list == KVP__PL_B && b->prev == KVP_NIL);
            uint32_t nx = b->next;
            m_head = nx;
            if (nx != KVP_NIL)
                B[nx].prev = KVP_NIL;
            else
                m_tail = KVP_NIL;
            m_n--;
            b->next = KVP_NIL;
            if (b->freq == 0) {
                b->list = KVP__PL_NONE;
                break;
            }
            b->freq--;
            b->prev = m_tail; /* back to M's tail */
            if (m_tail != KVP_NIL)
                B[m_tail].next = v;
            else
                m_head = v;
            m_tail = v;
            m_n++;
        }
    taken: /* kvp__pblock_taken */
        kvp__pblock_clear(b, ++clock);
        ids[k] = v;
    }
    p->clock = clock;
    p->list[KVP__PL_A].head = s_head;
    p->list[KVP__PL_A].n = s_n;
    p->list[KVP__PL_B].head = m_head;
    p->list[KVP__PL_B].tail = m_tail;
    p->list[KVP__PL_B].n = m_n;
    assert(*p->n_cached >= n);
    *p->n_cached -= n;
    kvp__gview_store(p, &g);
}

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);       \
    } while (0)

/* Invariants above. KVP_OK or KVP_ECORRUPT. */
int kvp__policy_s3fifo_check(const kvp__policy *p)
{
    for (uint32_t id = 0; id < p->n_blocks; id++) {
        const kvp__pblock *b = &p->b[id];
        FAIL_IF(b->list != KVP__PL_NONE && b->list != b->home);
        FAIL_IF(b->freq > KVP__S3_FREQ_MAX);
        FAIL_IF(b->list != KVP__PL_NONE && p->fp_of[id] != kvp__ghost_fp(kvp__policy_key(p, id)));
    }
    return kvp__ghost_check(p);
}
