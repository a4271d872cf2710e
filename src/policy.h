/*
 * policy.h - the eviction-policy interface: which cached block the pool recycles when no
 * free block is left (kvp_config.eviction).
 *
 * The pool (pool.c) owns the block states and the free list; a policy owns the order of the
 * cached (indexed, unpinned) blocks. The pool calls it at five points:
 *
 *   taken(id)                block id was handed out (free or evicted): a fresh record
 *   hit(id)                  block id is pinned by a lookup hit (every pin is one), cached
 *                            (it leaves its list) or held by other requests
 *   release(id, depth)       indexed block id, block `depth` of its chain, lost its last
 *                            pin: it becomes cached; at its first release it is admitted
 *   evict()                  the victim: a cached block, taken out of the order, or KVP_NIL
 *   unlink(id)               cached block id leaves the order (evicted by a quota,
 *                            replaced)
 *   drop_one()               any cached block, off its list, with no side effect (reset)
 *
 * Dispatch is a switch on cfg.eviction, not a table of function pointers, and LRU is not
 * behind it at all: pool.c tests kvp__policy_is_lru() (one load and compare of a field on
 * the cache's first line) and, when true, runs exactly the code it ran before policies
 * existed (its LRU ring, unchanged). The other policies' calls are out of line. bench_core
 * workload (c) under callgrind: see docs/performance.md ("Eviction policies").
 *
 * Every non-LRU policy keeps one kvp__pblock per pool block (32 bytes, allocated only when
 * the policy is not LRU) and up to two doubly linked lists through it, least recently
 * queued at the head (evicted first):
 *
 *   list[KVP__PL_A]:  SLRU probation      S3-FIFO small FIFO S
 *   list[KVP__PL_B]:  SLRU protected      S3-FIFO main FIFO M
 *   S3-FIFO ghost G:  a FIFO ring of key fingerprints + an open-addressing multiset of them
 *
 * Hooks for a prefix-aware policy: each kvp__pblock carries the block's chain depth, its
 * hit count since it was taken and the policy clock (one tick per take, hit or release)
 * of its last use. Whether a block has cached children is not tracked yet (it needs a
 * reverse map from a key to the indexed blocks whose parent key it is; see
 * docs/design.md, "Eviction policies").
 *
 * Invariants shared by every non-LRU policy (kvp__policy_check, then each policy's own):
 * a block is on a list iff it is cached; each list is doubly linked without a cycle, its
 * count is its length, and the lists' counts sum to pool.n_lru; the LRU ring is empty.
 *
 * Files: policy.c (allocation, the shared lists, the dispatch and the shared checker),
 * policy_slru.c, policy_s3fifo.c. LRU stays in pool.c.
 */
#ifndef KVP_POLICY_H
#define KVP_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "kvprefix.h"

typedef struct kvp_cache kvp_cache;

enum {
    KVP__PL_NONE = 0, /* on no list: not cached */
    KVP__PL_A = 1,    /* SLRU probation; S3-FIFO small FIFO */
    KVP__PL_B = 2     /* SLRU protected; S3-FIFO main FIFO */
};

typedef struct kvp__pblock {
    uint32_t prev;     /* on a list: the block queued before it (nearer eviction), or KVP_NIL */
    uint32_t next;     /* on a list: the block queued after it, or KVP_NIL */
    uint32_t depth;    /* chain depth, 0 for a first block; set at each release (valid while
                          cached) */
    uint32_t n_hits;   /* hits (pins) since it was taken; valid while indexed */
    uint64_t last_use; /* policy clock at its last take, hit or release */
    uint8_t list;      /* KVP__PL_* it is on: NONE unless cached */
    uint8_t home;      /* the list it joins at its next release; NONE until its first */
    uint8_t freq;      /* S3-FIFO: hits while queued, 0..3 (KVP__S3_FREQ_MAX) */
    uint8_t pad[5];    /* keeps the record at 32 bytes */
} kvp__pblock;

typedef struct kvp__plist {
    uint32_t head; /* first block (evicted first), KVP_NIL when empty */
    uint32_t tail; /* last block queued, KVP_NIL when empty */
    uint32_t n;    /* blocks on the list */
} kvp__plist;

typedef struct kvp__policy {
    kvp__pblock *b;      /* n_blocks entries; NULL under LRU */
    kvp__plist list[3];  /* list[KVP__PL_A], list[KVP__PL_B]; list[0] unused */
    uint32_t cap_a;      /* S3-FIFO: the small FIFO's target size */
    uint32_t cap_b;      /* SLRU: the protected segment's capacity */
    uint64_t clock;      /* logical time: ticks at each take, hit and release */
    uint64_t *ghost;     /* S3-FIFO: ring of ghost_cap key fingerprints, or NULL */
    uint32_t ghost_cap;  /* entries the ghost ring holds (0: no ghost) */
    uint32_t ghost_head; /* slot of the oldest fingerprint */
    uint32_t ghost_n;    /* fingerprints in the ring */
    uint64_t *gtab_fp;   /* multiset of the ring's fingerprints: open addressing, 0 empty */
    uint32_t *gtab_n;    /* gtab_fp's multiplicities */
    uint32_t gtab_mask;  /* table size - 1 (a power of two >= 2 ghost_cap) */
} kvp__policy;

#define KVP__S3_FREQ_MAX 3

int kvp__policy_config_check(const kvp_config *cfg);
int kvp__policy_init(kvp_cache *cache);
void kvp__policy_free(kvp_cache *cache);

/* The hooks (policy.c dispatches on cfg.eviction; never called under LRU). */
void kvp__policy_taken(kvp_cache *cache, uint32_t id);
void kvp__policy_hit(kvp_cache *cache, uint32_t id);
void kvp__policy_release(kvp_cache *cache, uint32_t id, uint32_t depth);
uint32_t kvp__policy_evict(kvp_cache *cache);
void kvp__policy_unlink(kvp_cache *cache, uint32_t id);
uint32_t kvp__policy_drop_one(kvp_cache *cache);
int kvp__policy_check(const kvp_cache *cache);

/* Shared list operations (policy.c). Cannot fail. */
void kvp__plist_push(kvp_cache *cache, uint8_t l, uint32_t id);
void kvp__plist_remove(kvp_cache *cache, uint32_t id);

/* The policies (policy_slru.c, policy_s3fifo.c). */
void kvp__slru_release(kvp_cache *cache, uint32_t id);
uint32_t kvp__slru_evict(kvp_cache *cache);
int kvp__policy_slru_check(const kvp_cache *cache);
uint8_t kvp__s3fifo_admit(kvp_cache *cache, kvp_key key);
uint32_t kvp__s3fifo_evict(kvp_cache *cache);
int kvp__policy_s3fifo_check(const kvp_cache *cache);
bool kvp__s3fifo_ghost_has(const kvp_cache *cache, kvp_key key);

#endif /* KVP_POLICY_H */
