/*
 * policy.h - the eviction-policy interface: which cached block a block pool recycles when no
 * free block is left. Two kinds of pool run a policy: the device pool (pool.c, policy from
 * kvp_config.eviction) and each lower tier (tier.c, from kvp_tier_config.eviction). A policy
 * is a kvp__policy value bound at kvp__policy_init to its pool's block count, its blocks'
 * keys (read at keys + id * key_stride) and its count of cached blocks; it knows nothing
 * else of the pool, so one implementation serves both.
 *
 * The pool owns the block states and the free list; a policy owns the order of the cached
 * (unpinned, evictable) blocks. The pool calls it at these points:
 *
 *   taken(id)                block id was handed out (free or evicted): a fresh record
 *   hit(id)                  block id is pinned by a hit (every pin is one), cached (it
 *                            leaves its list) or held by other requests
 *   release(id, depth)       block id, block `depth` of its chain, lost its last pin: it
 *                            becomes cached; at its first release it is admitted
 *   evict()                  the victim: a cached block, taken out of the order, or KVP_NIL
 *   unlink(id)               cached block id leaves the order (evicted by a quota, replaced)
 *   drop_one()               any cached block, off its list, with no side effect (reset)
 *
 * and, where nothing can observe the pool in between (no quota, no retention, and for
 * evictions no event callback), in batches with the same effect: evict_n(ids, n) is n rounds
 * of evict then taken (pool.c's take_policy_batch; each policy's loop inlines the single
 * step), and every policy but LRU walks the device pool's released chain itself
 * (kvp__policy_unpins, kvp__policy_unpin_run: it tests and writes the blocks' state words,
 * pool.state, as it releases them in order; pool.c's unpin_policy_run), so that the blocks
 * are walked once.
 *
 * The device pool: dispatch is a switch on the policy's eviction field, not a table of
 * function pointers, and LRU is not behind it at all: pool.c tests kvp__policy_is_lru()
 * (one load and compare of a field on the cache's first line) and, when true, runs exactly
 * the code it ran before policies existed (its LRU ring, unchanged). The other policies'
 * calls are out of line. bench_core workload (c) under callgrind: see docs/performance.md
 * ("Eviction policies"). A lower tier likewise keeps its own LRU list and uses a kvp__policy
 * only for another policy (tier.c: a pin by a load order is a hit, the load's confirmation
 * or failure the release, a confirmed store the first release).
 *
 * Every non-LRU policy keeps one kvp__pblock per pool block (40 bytes, allocated only when
 * the policy is not LRU) and doubly linked lists through it, least recently queued at the
 * head (evicted first):
 *
 *   list[KVP__PL_A]:  SLRU probation      S3-FIFO small FIFO S
 *   list[KVP__PL_B]:  SLRU protected      S3-FIFO main FIFO M
 *   list[KVP__PL_C0 + c], c < 27:                                  CDECAY class c's FIFO
 *   ghost G:          S3-FIFO's and CDECAY's: a FIFO ring of key fingerprints + an
 *                     open-addressing multiset of them (CDECAY: with each key's history);
 *                     each cached block's fingerprint is kept from its first release
 *                     (fp_of, 8 bytes per block), so that its eviction need not read and
 *                     hash its key again
 *
 * Every non-LRU policy is also told, before a request's blocks are released, the whole
 * chain (release_begin(ids, n): block i of the chain is ids[i]); CDECAY uses it to see how
 * many of the request's blocks are new and which block is whose parent. (A lower tier
 * releases its blocks one confirmation at a time: a chain of one.)
 *
 * Each kvp__pblock carries the block's chain depth, its hit count since it was taken and the
 * policy clock (one tick per take, hit or release) of its last use; CDECAY adds its eviction
 * key, its known touches and its class. Whether a block has cached children is not tracked
 * (it needs a reverse map from a key to the indexed blocks whose parent key it is).
 *
 * Orphans (kvp_config.count_orphans, device pool only, any policy, LRU included): link[id]
 * records, at each release of block id, its parent's block id and key (the block before it
 * in the released chain); kvp__policy_orphans counts the cached blocks whose recorded parent
 * key is no longer indexed (neither in that block nor re-stored in another: a parent stored
 * again re-adopts its children at once). Chain rule of each policy: see its file. LRU
 * (pool.c) never orphans a block by evicting: a request that touches a child touches its
 * parent and releases it after the child, so a cached child's parent is cached and more
 * recent, or pinned; orphans under LRU come only from removals outside the order (a
 * verify-mode replacement).
 *
 * Invariants shared by every non-LRU policy (kvp__policy_check, then each policy's own):
 * a block is on a list iff its pool says it is cached (the pool's predicate), and only on a
 * list its policy uses (SLRU, S3-FIFO: A and B; CDECAY: the class FIFOs); each list is doubly
 * linked without a cycle, its count is its length, and the lists' counts sum to *n_cached.
 *
 * Files: policy.c (allocation, the shared lists, the dispatch and the shared checker),
 * policy_ghost.c (the ghost of evicted keys: S3-FIFO's and CDECAY's), policy_slru.c,
 * policy_s3fifo.c, policy_cdecay.c. The device pool's LRU stays in pool.c, a tier's in tier.c.
 */
#ifndef KVP_POLICY_H
#define KVP_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include <stddef.h>
#include <string.h>

#include "kvprefix.h"

typedef struct kvp_cache kvp_cache;
typedef struct kvp__mem kvp__mem;

#define KVP__CD_N_CLS 27 /* CDECAY's classes: 3 levels of known touches x 9 of new blocks */

enum {
    KVP__PL_NONE = 0, /* on no list: not cached */
    KVP__PL_A = 1,    /* SLRU probation; S3-FIFO small FIFO; CDECAY: only as a home */
    KVP__PL_B = 2,    /* SLRU protected; S3-FIFO main FIFO */
    KVP__PL_C0 = 3,   /* CDECAY: class c's FIFO is list KVP__PL_C0 + c */
    KVP__PL_N = KVP__PL_C0 + KVP__CD_N_CLS /* lists in all (list[0] unused) */
};

typedef struct kvp__pblock {
    uint32_t prev;     /* on a list: the block queued before it (nearer eviction), or KVP_NIL */
    uint32_t next;     /* on a list: the block queued after it, or KVP_NIL */
    uint32_t depth;    /* chain depth, 0 for a first block; set at each release (valid while
                          cached) */
    uint32_t n_hits;   /* hits (pins) since it was taken; valid while indexed */
    uint64_t last_use; /* policy clock at its last take, hit or release */
    int64_t key;       /* CDECAY: eviction key (least first), set at each release */
    uint8_t list;      /* KVP__PL_* it is on: NONE unless cached */
    uint8_t home;      /* the list it joins at its next release; NONE until its first
                          (CDECAY: KVP__PL_A once admitted) */
    uint8_t freq;      /* S3-FIFO: hits while queued, 0..3 (KVP__S3_FREQ_MAX) */
    uint8_t hist;      /* CDECAY: touches known (this one included, capped at 255), from
                          its first release on */
    uint8_t cls;       /* CDECAY: class of its last release, < KVP__CD_N_CLS */
    uint8_t pad[3];    /* keeps the record at 40 bytes */
} kvp__pblock;

typedef struct kvp__plink {
    kvp_key parent;     /* the parent block's key when last released; valid iff parent_id
                           is not KVP_NIL */
    uint32_t parent_id; /* the parent block at that time, or KVP_NIL (a first block, or a
                           parent that was not indexed) */
    uint32_t pad;
} kvp__plink;

typedef struct kvp__plist {
    uint32_t head; /* first block (evicted first), KVP_NIL when empty */
    uint32_t tail; /* last block queued, KVP_NIL when empty */
    uint32_t n;    /* blocks on the list */
} kvp__plist;

/* A policy's parameters (from kvp_config or kvp_tier_config, same meanings and ranges). */
typedef struct kvp__pparams {
    int eviction;                /* KVP_EVICT_* */
    uint32_t slru_protected_pct; /* 0..100 */
    uint32_t s3fifo_small_pct;   /* 1..100 */
    uint32_t s3fifo_ghost_pct;   /* 0..1000 */
    uint32_t cdecay_tau;         /* 0 (default 20000) .. 10^9 */
    uint32_t cdecay_ghost_pct;   /* 0 (default 1600) .. 10000 */
} kvp__pparams;

/* Fill kvp__pparams *pp from *src, any config with the same field names (kvp_config,
 * kvp_tier_config). */
#define KVP__PPARAMS_FROM(pp, src)                                                                 \
    do {                                                                                           \
        (pp)->eviction = (src)->eviction;                                                          \
        (pp)->slru_protected_pct = (src)->slru_protected_pct;                                      \
        (pp)->s3fifo_small_pct = (src)->s3fifo_small_pct;                                          \
        (pp)->s3fifo_ghost_pct = (src)->s3fifo_ghost_pct;                                          \
        (pp)->cdecay_tau = (src)->cdecay_tau;                                                      \
        (pp)->cdecay_ghost_pct = (src)->cdecay_ghost_pct;                                          \
    } while (0)

/* CDECAY's rank of a class FIFO's head, least first: the key, then the deeper block, then the
 * lower class, as one 128-bit number compared word by word: hi = key with its sign bit
 * flipped, lo = (UINT32_MAX - depth) << 32 | class (distinct for distinct classes). All ones
 * stands for an empty FIFO (no head's lo is all ones: it ends in its class, < 27). */
typedef struct kvp__cdrank {
    uint64_t hi;
    uint64_t lo;
} kvp__cdrank;

/* One slot of CDECAY's ghost table (policy_ghost.c): a key's fingerprint, its link to the
 * ring and its history, on one cache line. */
typedef struct kvp__gslot {
    uint64_t fp;   /* the key's fingerprint (0: empty) */
    uint32_t link; /* 1 + the ring slot of the key's latest addition (0: empty) */
    uint16_t info; /* the history of the key's last eviction (hist << 8 | cls) */
    uint16_t pad;
} kvp__gslot;

typedef struct kvp__policy {
    kvp__pblock *b;             /* n_blocks entries; NULL under LRU */
    int eviction;               /* KVP_EVICT_* */
    uint32_t n_blocks;          /* the pool's blocks */
    uint32_t *n_cached;         /* the pool's count of listed blocks (pool.n_lru, a tier's
                                   n_listed): the lists keep it; NULL under LRU */
    const unsigned char *keys;  /* block id's kvp_key is at keys + id * key_stride (the pool's
                                   records, owned by the pool) */
    size_t key_stride;          /* bytes between two blocks' keys */
    kvp__mem *mem;              /* the allocator of b, the ghost and the checkers' scratch */
    kvp__plist list[KVP__PL_N]; /* list[KVP__PL_A] ...; list[0] unused */
    uint32_t cap_a;             /* S3-FIFO: the small FIFO's target size */
    uint32_t cap_b;             /* SLRU: the protected segment's capacity */
    uint64_t clock;             /* logical time: ticks at each take, hit and release */
    uint64_t *ghost;            /* S3-FIFO: ring of ghost_cap keys' fingerprints, or NULL */
    uint32_t ghost_cap;         /* entries the ghost ring holds (0: no ghost) */
    uint32_t ghost_head;        /* slot of the oldest fingerprint */
    uint32_t ghost_n;           /* fingerprints in the ring */
    uint64_t *gtab_fp;          /* S3-FIFO: multiset of the ring's fingerprints: open
                                   addressing, 0 empty */
    uint32_t *gtab_n;           /* S3-FIFO: gtab_fp's multiplicities */
    uint32_t *gring;            /* CDECAY: ring of ghost_cap keys' table slots, or NULL */
    kvp__gslot *gslot;  /* CDECAY: the table (fingerprint, link, info per slot; policy_ghost.c),
                           or NULL */
    uint32_t gtab_mask; /* table size - 1 (a power of two >= 2 ghost_cap) */
    kvp__plink *link;   /* kvp_config.count_orphans: n_blocks parent links, else NULL */
    uint64_t *fp_of;    /* S3-FIFO, CDECAY: per block, its key's ghost fingerprint
                           (kvp__ghost_fp), set at its first release (valid while it is
                           cached): its eviction adds it to G without reading the key
                           again; else NULL */
    /* CDECAY (policy_cdecay.c) */
    uint64_t cd_trials[KVP__CD_N_CLS];      /* releases of each class so far */
    uint64_t cd_reused[KVP__CD_N_CLS];      /* ... that a later release of the block followed */
    int64_t cd_off[KVP__CD_N_CLS];          /* floor(tau ln p) per class, p = (reused + 1) /
                                               (trials + 2) as of the current request's start */
    uint64_t cd_clock;                      /* releases so far (the keys' time) */
    double cd_tau;                          /* kvp_config.cdecay_tau or its default */
    uint32_t cd_col;                        /* the current request's class column: bits of its
                                               new blocks' count, at most 8 */
    uint32_t cd_chain_depth;                /* depth of the block released just before in this
                                               request, or UINT32_MAX */
    int64_t cd_chain_key;                   /* its key */
    uint8_t cd_chain_list;                  /* its list */
    uint8_t cd_win[KVP__CD_N_CLS + 1];      /* the nonempty class FIFOs by their heads' ranks,
                                               least first: cd_win[1 + k], k < cd_n_win (cd_win[1]
                                               is the victim's); 0xff past them and at [0] */
    uint8_t cd_n_win;                       /* nonempty class FIFOs */
    uint8_t cd_pos[KVP__CD_N_CLS];          /* class c is cd_win[1 + cd_pos[c]] (0xff: empty) */
    kvp__cdrank cd_hrank[KVP__CD_N_CLS];    /* rank of each nonempty FIFO's head */
    uint64_t cd_snap_trials[KVP__CD_N_CLS]; /* cd_trials and cd_reused when cd_off was last */
    uint64_t cd_snap_reused[KVP__CD_N_CLS]; /* computed (an offset is recomputed only when
                                               its counts moved: the same formula, the same
                                               inputs, the same value) */
} kvp__policy;

#define KVP__S3_FREQ_MAX 3

/* Block id's key in the pool's records. Cannot fail. */
static inline kvp_key kvp__policy_key(const kvp__policy *p, uint32_t id)
{
    kvp_key k;
    memcpy(&k, p->keys + (size_t)id * p->key_stride, sizeof k);
    return k;
}

int kvp__policy_params_check(const kvp__pparams *pp);
void kvp__policy_params_of(const kvp_config *cfg, kvp__pparams *pp);
int kvp__policy_init(kvp__policy *p, const kvp__pparams *pp, uint32_t n_blocks, kvp__mem *mem,
                     const void *keys, size_t key_stride, uint32_t *n_cached);
void kvp__policy_free(kvp__policy *p);
/* The device pool's parts: the parent links (count_orphans) and the orphan count. */
int kvp__policy_links_init(kvp_cache *cache);
void kvp__policy_links_free(kvp_cache *cache);
void kvp__policy_link(kvp_cache *cache, const uint32_t *ids, uint32_t n);
uint32_t kvp__policy_orphans(const kvp_cache *cache);

/* The hooks (policy.c dispatches on p->eviction; never called under LRU). */
void kvp__policy_release_begin(kvp__policy *p, const uint32_t *ids, uint32_t n);
void kvp__policy_taken(kvp__policy *p, uint32_t id);
void kvp__policy_hit(kvp__policy *p, uint32_t id);
void kvp__policy_release(kvp__policy *p, uint32_t id, uint32_t depth);
uint32_t kvp__policy_unpin_run(kvp__policy *p, uint32_t *state, const uint32_t *ids, uint32_t hi);
/* Does the policy walk the device pool's released chains itself (kvp__policy_unpin_run, the
 * walk of KVP__POLICY_DEFINE_UNPIN_RUN in policy_list.h)? Every policy but LRU does (SLRU by
 * the macro, S3-FIFO and CDECAY by loops of their own on locals), and the pool relies on it
 * (pool.c, unpin_policy_run); a tier releases one block at a time (kvp__policy_release). */
static inline bool kvp__policy_unpins(const kvp__policy *p)
{
    return p->eviction == KVP_EVICT_SLRU || p->eviction == KVP_EVICT_S3FIFO ||
           p->eviction == KVP_EVICT_CDECAY;
}
uint32_t kvp__policy_evict(kvp__policy *p);
void kvp__policy_evict_n(kvp__policy *p, uint32_t *ids, uint32_t n);
void kvp__policy_unlink(kvp__policy *p, uint32_t id);
uint32_t kvp__policy_drop_one(kvp__policy *p);
/* The checker: cached(ctx, id) is the pool's word on whether block id is cached (on the
 * policy's lists). KVP_OK, KVP_ECORRUPT or KVP_ENOMEM. */
int kvp__policy_check(const kvp__policy *p, bool (*cached)(const void *ctx, uint32_t id),
                      const void *ctx);

/* Shared list operations: policy_list.h (inline). */

/* The ghost (policy_ghost.c; add and find inline in policy_ghost.h): a FIFO of ghost_cap
 * evicted keys and a table of their fingerprints (S3-FIFO: a multiset; CDECAY: gslot, each
 * linked to its key's latest ring slot, with its latest info). */
int kvp__ghost_check(const kvp__policy *p);

/* The policies (policy_slru.c, policy_s3fifo.c, policy_cdecay.c). */
void kvp__slru_release(kvp__policy *p, uint32_t id, uint32_t depth);
uint32_t kvp__slru_unpin_run(kvp__policy *p, uint32_t *state, const uint32_t *ids, uint32_t hi);
uint32_t kvp__slru_evict(kvp__policy *p);
void kvp__slru_evict_n(kvp__policy *p, uint32_t *ids, uint32_t n);
int kvp__policy_slru_check(const kvp__policy *p);
void kvp__s3fifo_release(kvp__policy *p, uint32_t id, uint32_t depth);
uint32_t kvp__s3fifo_unpin_run(kvp__policy *p, uint32_t *state, const uint32_t *ids, uint32_t hi);
uint32_t kvp__s3fifo_evict(kvp__policy *p);
void kvp__s3fifo_evict_n(kvp__policy *p, uint32_t *ids, uint32_t n);
int kvp__policy_s3fifo_check(const kvp__policy *p);
void kvp__cdecay_begin(kvp__policy *p, const uint32_t *ids, uint32_t n);
void kvp__cdecay_head(kvp__policy *p, uint32_t c);
void kvp__cdecay_release(kvp__policy *p, uint32_t id, uint32_t depth);
uint32_t kvp__cdecay_unpin_run(kvp__policy *p, uint32_t *state, const uint32_t *ids, uint32_t hi);
uint32_t kvp__cdecay_evict(kvp__policy *p);
void kvp__cdecay_evict_n(kvp__policy *p, uint32_t *ids, uint32_t n);
int kvp__policy_cdecay_check(const kvp__policy *p);

#endif /* KVP_POLICY_H */
