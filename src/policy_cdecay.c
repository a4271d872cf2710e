/*
 * policy_cdecay.c - chain-closed decay eviction (kvp_config.eviction = KVP_EVICT_CDECAY), the
 * project's prefix-aware policy: it learns from the cache's own history which kinds of
 * block touches are followed by another touch, decays that by age, and keeps a parent at
 * least as long as the child it was released with.
 *
 *   list[KVP__PL_C0 + c], c < 27:  class c's FIFO, head (oldest) .. tail
 *   cd_trials[c], cd_reused[c]:    the learned odds of class c
 *   ghost G:                       the last ghost_cap evicted keys (policy_ghost.c), each with
 *                                  its block's history (hist << 8 | cls)
 *
 * Rules. Time is the count of block releases (cd_clock). Every release of a cached-to-be
 * block is a touch, in one of 27 classes: min(known earlier touches, 2) x 9 + min(bits(N), 8),
 * where N is the number of the request's blocks that are new (at their first release, the
 * request's chain past its hit) and bits(N) the bit length of N. Known earlier touches: those
 * of a block still cached, or of a key the ghost remembers (its count at its eviction, read
 * once: a second readmission of the key before its next eviction knows none), else none. When a
 * block is touched again, its previous touch's class counts a reuse. At the start of each request's
 * release, every class's offset is set to floor(tau ln p), p = (reused + 1) / (trials + 2) (tau =
 * kvp_config.cdecay_tau, default 20000). Then each block released, last first:
 *  1. its class c is counted a trial (and the class of its previous touch a reuse, if any);
 *  2. its key is cd_clock + off[c] (cd_clock ticks first), and it joins class c's FIFO;
 *  3. chain closure: if the block released just before in this request was its child (one
 *     deeper) and that child's key is greater, the block takes the child's key and joins the
 *     child's FIFO instead, right behind it.
 * The victim is the least key among the FIFOs' heads, the deeper block on a tie, then the
 * lower class; its key enters G with its history. A block's key ranks it as p e^(age / tau)
 * would: a higher learned chance of reuse buys tau ln(p'/p) releases more. Each FIFO is in
 * key order except where a class's offset moved between requests (the offsets change slowly
 * once learned), so its head stands for it.
 *
 * Why: reuse in LLM request logs comes late (docs/replay.md, "Eviction policies against the
 * optimum"), so recency alone (LRU) wastes slots on blocks that never return; a block's
 * history and how far its request extended the chain tell, per class, how likely a touch is
 * to be followed by another, and the cache learns those odds from its own log. Chain closure
 * removed every loss to LRU the same scoring had without it (children outranked parents).
 * Lab figures (bench_policies, "cfifo2-g16"), replay figures: docs/replay.md.
 *
 * Chain rule. A request releases its chain tail first and each parent's key is at least its
 * child's (step 3), so within what a request released together a parent never leaves before
 * its child. A later request that touches the parent alone gives it a fresh key, which can be
 * below the key its child keeps from an earlier request (a low-odds class): the parent can then
 * be evicted first and the child becomes an orphan (its parent key not indexed; no lookup
 * reaches it until the parent is stored again). Orphans are not evicted eagerly (they age out
 * by their key); kvp_config.count_orphans counts them (policy.c).
 *
 * Quotas: as under the other policies, a scope over its quota loses its least recently
 * released cached block (quota.c); that eviction does not enter G.
 *
 * Invariants (kvp__policy_cdecay_check): a cached block is on a class FIFO with hist >= 1, a
 * class < 27, a key <= cd_clock and its key's fingerprint in fp_of (a block's key does not
 * change while it is indexed); SLRU's and S3-FIFO's lists are empty; every offset is <= 0;
 * the ghost's own (policy_ghost.c).
 *
 * Cost: a release O(1) (at most 27 logarithms per request, not per block: a class's offset is
 * recomputed only when its counts moved; the count of a request's new blocks stops at 128,
 * where the column is 8); an eviction O(1): the nonempty FIFOs are kept in the order of their
 * heads' ranks (cd_win), the first FIFO's head is the victim, and a FIFO whose head changes
 * moves to its new place (at most 27, usually a place or two: an evicted head's successor is
 * next in key order; none while it stays first). The batched paths (kvp__cdecay_unpin_run,
 * _evict_n) keep the policy's fields in locals (cd_run), evict by runs of one FIFO and then
 * add the victims to G in a second pass, and read each victim's key fingerprint from fp_of
 * (set at its first release) rather than hashing its key again. Memory: 48 bytes per block
 * (policy.c: the record and fp_of) plus the ghost: 4 bytes per key and 16 per table slot (4 to
 * 8 per key), ghost_cap = n_blocks * cdecay_ghost_pct / 100 keys (default 16 per block: 1.1 to
 * 2.1 KB per pool block, small beside a KV block of any model: 2 MB for 16 tokens of an 8B
 * model). bench_core (c): 1.220x LRU's instructions per request (136.0k against 111.5k; the
 * device pool's released chains walked here, kvp__cdecay_unpin_run; docs/performance.md,
 * "S3-FIFO within 1.25x after the state words"), with a ghost that never fills in (c); with a
 * full one 1.243x (--cdecay-ghost-pct 10: 138.6k; 100: 138.8k, 1.246x; docs/performance.md,
 * "CDECAY with a full ghost": the oldest key leaves the ghost with no probe, by runs of ring
 * slots, into one array of 16-byte table slots probed by byte offsets).
 */
#include "policy_ghost.h"
#include "policy_list.h"

/* ln x for x > 0, to about 1e-15 relative: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
 * ln m = 2 atanh((m - 1) / (m + 1)) by its series (the library does not link libm). */
static double ln(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    int e = (int)((u >> 52) & 0x7ff) - 1023;
    u = (u & ~(UINT64_C(0x7ff) << 52)) | (UINT64_C(1023) << 52);
    double m;
    memcpy(&m, &u, sizeof m);
    if (m > 1.4142135623730951) {
        m /= 2;
        e++;
    }
    double s = (m - 1) / (m + 1), s2 = s * s, term = s, sum = 0;
    for (int k = 1; k < 25; k += 2) { /* |s| <= 0.172: s^25 / 25 < 1e-20 */
        sum += term / k;
        term *= s2;
    }
    return 2 * sum + e * 0.69314718055994530942;
}

static inline uint32_t bit_length(uint32_t v)
{
    return v ? 32 - (uint32_t)__builtin_clz(v) : 0;
}

/* The request whose chain is ids[0 .. n) starts releasing: its class column and the
 * offsets of every class, learned so far. Cannot fail. */
void kvp__cdecay_begin(kvp__policy *p, const uint32_t *ids, uint32_t n)
{
    /* The column is min(bits(N), 8), 8 for any N >= 128: the count stops there. New blocks
     * are mostly the chain's tail (past its hit), so it runs from the tail, four at a time. */
    const kvp__pblock *B = p->b;
    uint32_t n_new = 0, i = n; /* ids may be NULL when n is 0 */
    for (; i >= 4 && n_new < 128; i -= 4)
        n_new += (uint32_t)(B[ids[i - 1]].home == KVP__PL_NONE) +
                 (B[ids[i - 2]].home == KVP__PL_NONE) + (B[ids[i - 3]].home == KVP__PL_NONE) +
                 (B[ids[i - 4]].home == KVP__PL_NONE);
    for (; i > 0 && n_new < 128; i--)
        n_new += B[ids[i - 1]].home == KVP__PL_NONE;
    uint32_t bits = bit_length(n_new);
    p->cd_col = bits > 8 ? 8 : bits;
    for (int c = 0; c < KVP__CD_N_CLS; c++) {
        /* Unchanged counts give the offset already there (the snapshot starts at all ones,
         * which no count reaches, so the first request computes every class). */
        if (p->cd_trials[c] == p->cd_snap_trials[c] && p->cd_reused[c] == p->cd_snap_reused[c])
            continue;
        p->cd_snap_trials[c] = p->cd_trials[c];
        p->cd_snap_reused[c] = p->cd_reused[c];
        double odds = ((double)p->cd_reused[c] + 1.0) / ((double)p->cd_trials[c] + 2.0);
        double off = p->cd_tau * ln(odds);
        p->cd_off[c] = (int64_t)off - ((double)(int64_t)off > off); /* floor */
    }
    p->cd_chain_depth = UINT32_MAX;
}

static inline void cdecay_head(kvp__policy *p, uint32_t c);

/* What a run of releases keeps in locals, read once (run_load) and written back once
 * (run_store): the fields the releases read (the per-block records' byte-wide fields may
 * alias anything, so after a store to one the compiler would reload every field of *p), the
 * clocks, and the releases of a class other than cd_col (a touch with a known history: the
 * others add to cd_trials[cd_col] at the end). The chain closure's last block is its record,
 * whose depth, key and list are cd_chain_depth, cd_chain_key and cd_chain_list (at the start,
 * *seed: a copy of those, a local of the caller's). Nothing that runs in between needs them in *p:
 * a FIFO's new head (cdecay_head) reads only the records and the order. */
typedef struct cd_run {
    kvp__pblock *b;            /* p->b */
    uint64_t *fp;              /* p->fp_of */
    const unsigned char *keys; /* p->keys */
    size_t key_stride;         /* p->key_stride */
    kvp__gview g;              /* the ghost (only its infos change in a release) */
    uint64_t clock;            /* p->clock */
    uint64_t cd_clock;         /* p->cd_clock */
    const kvp__pblock *chain;  /* the block released just before (or seed) */
    uint32_t col;              /* p->cd_col */
    int64_t off_col;           /* p->cd_off[p->cd_col] */
    kvp__plist *list_col;      /* &p->list[KVP__PL_C0 + p->cd_col] */
    uint32_t known;            /* releases of a block with a known history */
} cd_run;

/* A ghost table of one empty slot: a probe finds nothing (run_take), so that a release need
 * not test for a ghost. Never written. */
static kvp__gslot no_ghost_slot[1];

static KVP__ALWAYS_INLINE void run_load(kvp__policy *p, cd_run *r, kvp__pblock *seed)
{
    r->b = p->b;
    r->fp = p->fp_of;
    r->keys = p->keys;
    r->key_stride = p->key_stride;
    kvp__gview_load(p, &r->g);
    if (r->g.cap == 0) {
        r->g.slot = no_ghost_slot;
        r->g.mask = 0;
    }
    r->clock = p->clock;
    r->cd_clock = p->cd_clock;
    r->col = p->cd_col;
    r->off_col = p->cd_off[p->cd_col];
    r->list_col = &p->list[KVP__PL_C0 + p->cd_col];
    r->known = 0;
    seed->depth = p->cd_chain_depth;
    seed->key = p->cd_chain_key;
    seed->list = p->cd_chain_list;
    r->chain = seed;
}

/* Write back run r of m releases. */
static KVP__ALWAYS_INLINE void run_store(kvp__policy *p, const cd_run *r, uint32_t m)
{
    p->clock = r->clock;
    p->cd_clock = r->cd_clock;
    p->cd_chain_key = r->chain->key;
    p->cd_chain_depth = r->chain->depth;
    p->cd_chain_list = r->chain->list;
    p->cd_trials[r->col] += m - r->known;
    *p->n_cached += m;
}

/* Block id's key (kvp__policy_key). */
static KVP__ALWAYS_INLINE kvp_key run_key(const cd_run *r, uint32_t id)
{
    kvp_key k;
    memcpy(&k, r->keys + (size_t)id * r->key_stride, sizeof k);
    return k;
}

/* Is the key of fingerprint f in G? Then *info is its history, spent there: until the key is
 * added again, a find gives info 0, so that the history one eviction left is learned from
 * once. No test for a ghost: run_load's no_ghost_slot stands in for none. */
static KVP__ALWAYS_INLINE bool run_take(cd_run *r, uint64_t f, uint16_t *info)
{
    kvp__gslot *e = kvp__gview_at(&r->g, kvp__gview_find_off(&r->g, f));
    if (e->fp == 0)
        return false;
    *info = e->info;
    e->info = 0;
    return true;
}

/* Indexed block id, block depth of its chain, lost its last pin and is cached: steps 1-3
 * at the top of this file, in run r (*n_cached is counted by run_store). Cannot fail. */
static KVP__ALWAYS_INLINE void release_one(kvp__policy *restrict p, cd_run *r, uint32_t id,
                                           uint32_t depth)
{
    kvp__pblock *const B = r->b, *b = &B[id];
    b->last_use = ++r->clock;
    b->depth = depth;
    /* Step 1: the touch's class, and the previous touch's reuse. */
    uint32_t known = 0, prev_cls = 0;
    if (b->home == KVP__PL_NONE) {
        uint16_t info;
        b->home = KVP__PL_A;
        uint64_t f = kvp__ghost_fp(run_key(r, id));
        r->fp[id] = f;
        if (run_take(r, f, &info)) {
            known = info >> 8;
            prev_cls = info & 0xff;
        }
    } else {
        known = b->hist;
        prev_cls = b->cls;
    }
    uint32_t c = r->col;
    int64_t off = r->off_col;
    kvp__plist *L = r->list_col;
    if (known != 0) {
        r->known++;
        p->cd_reused[prev_cls]++;
        c += (known > 2 ? 2 : known) * 9;
        p->cd_trials[c]++;
        off = p->cd_off[c];
        L = &p->list[KVP__PL_C0 + c];
    }
    b->cls = (uint8_t)c;
    b->hist = (uint8_t)(known < 255 ? known + 1 : 255);
    /* Step 2: the key. */
    int64_t key = (int64_t)++r->cd_clock + off;
    uint8_t l = (uint8_t)(KVP__PL_C0 + c);
    /* Step 3: chain closure. */
    const kvp__pblock *ch = r->chain;
    if (depth + 1 == ch->depth && key < ch->key) {
        key = ch->key;
        l = ch->list;
        L = &p->list[l];
    }
    r->chain = b;
    b->key = key;
    /* At the tail of FIFO l (kvp__plist_push_in, but for *n_cached). */
    uint32_t tail = L->tail;
    b->list = l;
    b->prev = tail;
    b->next = KVP_NIL;
    L->n++;
    if (tail != KVP_NIL) {
        B[tail].next = id;
        L->tail = id;
    } else { /* the FIFO was empty: its new head plays (kvp__plist_push) */
        L->head = id;
        L->tail = id;
        cdecay_head(p, l - KVP__PL_C0);
    }
}

/* One block (kvp__policy_release). Cannot fail. */
void kvp__cdecay_release(kvp__policy *p, uint32_t id, uint32_t depth)
{
    cd_run r;
    kvp__pblock seed;
    run_load(p, &r, &seed);
    release_one(p, &r, id, depth);
    run_store(p, &r, 1);
}

/* Blocks becoming cached from the top of a released chain (kvp__policy_unpin_run): the walk
 * of KVP__POLICY_DEFINE_UNPIN_RUN (policy_list.h) in one run r, each block by release_one.
 * The chain closure's last block is carried from one run to the next in *p (run_store,
 * run_load), as from one kvp__cdecay_release to the next: a block that does not become
 * cached is skipped. Cannot fail. */
uint32_t kvp__cdecay_unpin_run(kvp__policy *restrict p, uint32_t *restrict state,
                               const uint32_t *ids, uint32_t hi)
{
    cd_run r;
    kvp__pblock seed;
    run_load(p, &r, &seed);
    uint32_t top = hi;
    while (hi > 0) {
        uint32_t id = ids[hi - 1];
        if (!KVP__LIKELY(state[id] == (KVP__ST_IN_USE | KVP__ST_INDEXED | 1)))
            break;
        state[id] = KVP__ST_CACHED;
        hi--;
        release_one(p, &r, id, hi);
    }
    run_store(p, &r, top - hi);
    return hi;
}

/* The rank of a head with this key and depth in class c (policy.h, kvp__cdrank). */
static inline kvp__cdrank rank_of(int64_t key, uint32_t depth, uint32_t c)
{
    kvp__cdrank r = {(uint64_t)key ^ (UINT64_C(1) << 63), (uint64_t)(UINT32_MAX - depth) << 32 | c};
    return r;
}

static inline bool rank_less(kvp__cdrank a, kvp__cdrank b)
{
    return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}

static const kvp__cdrank no_rank = {UINT64_MAX, UINT64_MAX};

/* Class c's FIFO head now ranks r (no_rank: the FIFO is empty): move c to its place in the
 * order of the nonempty FIFOs (cd_win), shifting the classes it passes. A head usually moves
 * a few places at most (an evicted head's successor comes soon after it in key order), so
 * this costs less than replaying a tournament. Cannot fail. */
static inline void set_head(kvp__policy *p, uint32_t c, kvp__cdrank r)
{
    assert(c < KVP__CD_N_CLS && p->cd_n_win <= KVP__CD_N_CLS);
    if (c >= KVP__CD_N_CLS) /* never: tells the compiler the arrays' bounds hold */
        return;
    uint32_t k = p->cd_pos[c], n = p->cd_n_win;
    bool empty = r.hi == UINT64_MAX && r.lo == UINT64_MAX;
    if (k == 0xff) { /* was empty */
        if (empty)
            return;
        k = n++;
        p->cd_n_win = (uint8_t)n;
    } else if (empty) { /* leaves the order */
        for (; k + 1 < n; k++) {
            uint8_t d = p->cd_win[2 + k];
            p->cd_win[1 + k] = d;
            p->cd_pos[d] = (uint8_t)k;
        }
        p->cd_win[n] = 0xff;
        p->cd_n_win = (uint8_t)(n - 1);
        p->cd_pos[c] = 0xff;
        return;
    }
    p->cd_hrank[c] = r;
    while (k > 0 && rank_less(r, p->cd_hrank[p->cd_win[k]])) { /* up, past a greater head */
        uint8_t d = p->cd_win[k];
        p->cd_win[1 + k] = d;
        p->cd_pos[d] = (uint8_t)k;
        k--;
    }
    while (k + 1 < n && rank_less(p->cd_hrank[p->cd_win[2 + k]], r)) { /* down */
        uint8_t d = p->cd_win[2 + k];
        p->cd_win[1 + k] = d;
        p->cd_pos[d] = (uint8_t)k;
        k++;
    }
    p->cd_win[1 + k] = (uint8_t)c;
    p->cd_pos[c] = (uint8_t)k;
}

/* The rank of class c's FIFO head `head` (KVP_NIL: the FIFO is empty). */
static inline kvp__cdrank head_rank(const kvp__policy *p, uint32_t c, uint32_t head)
{
    return head != KVP_NIL ? rank_of(p->b[head].key, p->b[head].depth, c) : no_rank;
}

/* Class c's FIFO has a new head (or became empty): its leaf and the matches above it. Cannot
 * fail. */
static inline void cdecay_head(kvp__policy *p, uint32_t c)
{
    set_head(p, c, head_rank(p, c, p->list[KVP__PL_C0 + c].head));
}

void kvp__cdecay_head(kvp__policy *p, uint32_t c)
{
    cdecay_head(p, c);
}

/* Take class c's head v off its FIFO (its list, *n_cached) without reordering the FIFOs,
 * and remember its key and history in G: the new head of the FIFO, or KVP_NIL. */
static KVP__ALWAYS_INLINE uint32_t pop_head(kvp__policy *p, uint32_t c, uint32_t v)
{
    kvp__plist *L = &p->list[KVP__PL_C0 + c];
    kvp__pblock *b = &p->b[v];
    assert(L->head == v && b->list == KVP__PL_C0 + c && b->prev == KVP_NIL && *p->n_cached > 0);
    uint32_t next = b->next;
    L->head = next;
    L->n--;
    (*p->n_cached)--;
    if (next != KVP_NIL)
        p->b[next].prev = KVP_NIL;
    else
        L->tail = KVP_NIL;
    b->list = KVP__PL_NONE;
    b->next = KVP_NIL;
    kvp__ghost_add(p, kvp__policy_key(p, v), (uint16_t)(b->hist << 8 | b->cls), true);
    return next;
}

/* The victim, off its list (pool.n_lru > 0): the head of the first FIFO in cd_win's order,
 * the least key among the FIFOs' heads (the deeper block on a tie, then the lower class); its
 * key and history enter G. Its FIFO's new head takes its place in the order (set_head). */
uint32_t kvp__cdecay_evict(kvp__policy *p)
{
    uint8_t c = p->cd_win[1];
    assert(c < KVP__CD_N_CLS);
    uint32_t v = p->list[KVP__PL_C0 + c].head;
    set_head(p, c, head_rank(p, c, pop_head(p, c, v)));
    return v;
}

/* Victim b, off its list (it was a head: no predecessor), as kvp__pblock_taken leaves it,
 * last used at clock: its history (hist << 8 | cls) before. */
static KVP__ALWAYS_INLINE uint16_t reset_victim(kvp__pblock *b, uint64_t clock)
{
    uint16_t info = (uint16_t)(b->hist << 8 | b->cls);
    b->prev = KVP_NIL;
    b->next = KVP_NIL;
    b->list = KVP__PL_NONE;
    kvp__pblock_clear(b, clock);
    return info;
}

/* n victims into ids[0 .. n) (n blocks are cached), each as kvp__policy_taken leaves it: the
 * same victims in the same order as n calls of kvp__cdecay_evict, each followed by
 * kvp__policy_taken. In two passes, each with fewer values to keep in registers than one:
 * first the victims come off their FIFOs (the first FIFO's class and the second FIFO's head
 * rank in locals until the order changes), then, in the same order, each enters G and its
 * record is reset. The first pass reads no victim's record but its link to the next block
 * (a head's rank is read while it is listed), the second no list, and neither the ghost's
 * adds nor the resets touch the lists, the order or the ghost's membership as the first pass
 * sees it: the same as one pass. */
void kvp__cdecay_evict_n(kvp__policy *restrict p, uint32_t *ids, uint32_t n)
{
    kvp__pblock *const B = p->b;
    /* Pass 1, by runs: the first FIFO gives its heads while each next head still ranks
     * ahead of the second FIFO's head (any, when there is none; the key decides unless the
     * keys tie: a rank's hi word is its key, sign flipped, and no key is INT64_MAX, the key of
     * no_rank's), then its head sinks to its place in the order (set_head, knowing it starts
     * first and moves only down), or the FIFO leaves the order. */
    uint32_t nw = p->cd_n_win;
    for (uint32_t k = 0; k < n;) {
        uint32_t c = p->cd_win[1], first = k;
        if (c >= KVP__CD_N_CLS) /* never (n blocks are cached): the arrays' bounds hold */
            break;
        kvp__plist *L = &p->list[KVP__PL_C0 + c];
        kvp__cdrank second = nw > 1 ? p->cd_hrank[p->cd_win[2]] : no_rank, r = no_rank;
        int64_t second_key = (int64_t)(second.hi ^ (UINT64_C(1) << 63));
        uint32_t v = L->head;
        for (;;) {
            assert(v != KVP_NIL && B[v].list == KVP__PL_C0 + c);
            ids[k++] = v;
            v = B[v].next;
            if (v == KVP_NIL)
                break;
            int64_t key = B[v].key;
            assert(key < INT64_MAX);
            if (key < second_key && k < n)
                continue;
            r = rank_of(key, B[v].depth, c);
            if (k == n || !rank_less(r, second))
                break;
        }
        /* The victims ids[first .. k) left from the head: v heads what remains. Their own
         * links are reset in pass 2. */
        L->head = v;
        L->n -= k - first;
        if (v == KVP_NIL) { /* c leaves the order */
            L->tail = KVP_NIL;
            for (uint32_t j = 1; j < nw; j++) {
                uint8_t d = p->cd_win[1 + j];
                p->cd_win[j] = d;
                p->cd_pos[d] = (uint8_t)(j - 1);
            }
            p->cd_win[nw--] = 0xff;
            p->cd_pos[c] = 0xff;
            continue;
        }
        B[v].prev = KVP_NIL;
        p->cd_hrank[c] = r;
        uint32_t j = 0;
        for (; j + 1 < nw; j++) {
            uint8_t d = p->cd_win[2 + j];
            if (d >= KVP__CD_N_CLS || !rank_less(p->cd_hrank[d], r))
                break;
            p->cd_win[1 + j] = d;
            p->cd_pos[d] = (uint8_t)j;
        }
        p->cd_win[1 + j] = (uint8_t)c;
        p->cd_pos[c] = (uint8_t)j;
    }
    p->cd_n_win = (uint8_t)nw;
    /* Pass 2: each victim's record is reset and it enters G (while G fills, then full). */
    cd_run run;
    kvp__pblock seed;
    run_load(p, &run, &seed);
    uint32_t k = 0;
    if (run.g.cap == 0)
        for (; k < n; k++)
            reset_victim(&B[ids[k]], ++run.clock);
    for (; k < n && run.g.count < run.g.cap; k++) {
        uint32_t v = ids[k];
        uint16_t info = reset_victim(&B[v], ++run.clock);
        kvp__gview_add_linked(&run.g, run.fp[v], info);
    }
    while (k < n) { /* G full: by runs of ring slots up to its end */
        uint32_t at = run.g.head, end = run.g.cap - at < n - k ? k + (run.g.cap - at) : n;
        for (; k < end; k++, at++) {
            uint32_t v = ids[k];
            uint16_t info = reset_victim(&B[v], ++run.clock);
            kvp__gview_put_full(&run.g, at, run.fp[v], info);
        }
        run.g.head = at == run.g.cap ? 0 : at;
    }
    p->clock = run.clock;
    kvp__gview_store(p, &run.g);
    *p->n_cached -= n;
}

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);       \
    } while (0)

/* Invariants above. KVP_OK, KVP_ECORRUPT or KVP_ENOMEM (the ghost checker's scratch). */
int kvp__policy_cdecay_check(const kvp__policy *p)
{
    FAIL_IF(p->list[KVP__PL_A].n || p->list[KVP__PL_B].n);
    for (int c = 0; c < KVP__CD_N_CLS; c++)
        FAIL_IF(p->cd_off[c] > 0);
    for (uint32_t id = 0; id < p->n_blocks; id++) {
        const kvp__pblock *b = &p->b[id];
        if (b->list == KVP__PL_NONE)
            continue;
        FAIL_IF(b->list < KVP__PL_C0 || b->hist == 0 || b->cls >= KVP__CD_N_CLS);
        FAIL_IF(b->key > (int64_t)p->cd_clock);
        FAIL_IF(p->fp_of[id] != kvp__ghost_fp(kvp__policy_key(p, id)));
    }
    uint32_t n = 0;
    for (uint32_t c = 0; c < KVP__CD_N_CLS; c++) {
        uint32_t head = p->list[KVP__PL_C0 + c].head;
        if (head == KVP_NIL) {
            FAIL_IF(p->cd_pos[c] != 0xff);
            continue;
        }
        n++;
        kvp__cdrank r = rank_of(p->b[head].key, p->b[head].depth, c);
        FAIL_IF(p->cd_pos[c] >= p->cd_n_win || p->cd_win[1 + p->cd_pos[c]] != c);
        FAIL_IF(p->cd_hrank[c].hi != r.hi || p->cd_hrank[c].lo != r.lo);
    }
    FAIL_IF(n != p->cd_n_win || p->cd_win[0] != 0xff);
    for (uint32_t k = 0; k + 1 < n; k++) /* every class listed once (above): ranks ascend */
        FAIL_IF(!rank_less(p->cd_hrank[p->cd_win[1 + k]], p->cd_hrank[p->cd_win[2 + k]]));
    for (uint32_t k = n; k < KVP__CD_N_CLS; k++)
        FAIL_IF(p->cd_win[1 + k] != 0xff);
    return kvp__ghost_check(p);
}
