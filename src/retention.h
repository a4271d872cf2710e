/*
 * retention.h - retention priorities (kvp_retention): the per-block priority records, the
 * per-priority queues of cached blocks whose priority is not the default, the expiry heap,
 * and the requests' retention options. Implemented in retention.c; the pool (pool.c) calls
 * it behind one test of kvp__retention_on, so a cache whose requests never set a priority
 * runs exactly the code it ran before.
 *
 *   record[b]  = (prio, expire)     prio KVP__PRIO_UNSET, or 0..100 set by a request
 *   queue[p]   head -> .. -> tail   cached blocks of effective priority p != 35, oldest
 *                                   release first (p in 0..34 and 36..100)
 *   heap       queued blocks with a finite expiry, min (expire, seq) on top
 *   by_req     uthash req id -> kvp__ropts (the options kvp_request_set_retention gave)
 *
 * A queued block is marked in the pool by its state word == KVP__SLOT_RETAINED and counted in
 * pool.n_retained (not in pool.n_lru, which stays the policy's count).
 */
#ifndef KVP_RETENTION_H
#define KVP_RETENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "kvprefix.h"

typedef struct kvp_cache kvp_cache;
typedef struct kvp__request kvp__request;
typedef struct kvp__qgroup kvp__qgroup;

#define KVP__SLOT_RETAINED                                                                         \
    UINT32_C(0x7ffffffc)      /* the state word of a block on a retention queue                    \
                                 (internal.h) */
#define KVP__PRIO_UNSET 0xFFu /* record of a block no request set */
#define KVP__N_PRIO     (KVP_RETENTION_PRIORITY_MAX + 1)

typedef struct kvp__rqueue {
    uint32_t head; /* first block (evicted first), KVP_NIL when empty */
    uint32_t tail; /* last block queued, KVP_NIL when empty */
    uint32_t n;    /* blocks on the queue */
} kvp__rqueue;

/* One request's retention options (a copy of the caller's kvp_retention). */
typedef struct kvp__ropts {
    UT_hash_handle hh;                 /* retention.by_req linkage; unused for a pending access */
    uint64_t req_id;                   /* the request */
    uint32_t priority;                 /* blocks outside every range */
    uint64_t duration;                 /* their duration, 0: never lapses */
    const kvp_retention_range *ranges; /* n_ranges ranges (a copy after this record, or the
                                          caller's during one kvp_access_retained call) */
    size_t n_ranges;                   /* entries in ranges */
} kvp__ropts;

typedef struct kvp__retention {
    bool on;                    /* arrays allocated: some request has carried retention */
    uint8_t *prio;              /* n_blocks: record priority, or KVP__PRIO_UNSET */
    uint64_t *expire;           /* n_blocks: clock at which the record lapses, 0: never */
    uint64_t *seq;              /* n_blocks: serial of the block's last queueing */
    uint32_t *prev;             /* n_blocks: queue links (valid while queued) */
    uint32_t *next;             /* n_blocks */
    uint32_t *depth;            /* n_blocks: chain depth at its last queueing */
    uint32_t *hpos;             /* n_blocks: position in heap, or KVP_NIL */
    uint32_t *heap;             /* n_blocks entries, n_heap used: a binary min-heap */
    uint32_t n_heap;            /* entries in heap */
    uint64_t serial;            /* last seq handed out */
    uint64_t nonempty[2];       /* bit p set iff queue[p] is not empty */
    kvp__rqueue q[KVP__N_PRIO]; /* the queues; q[KVP_RETENTION_PRIORITY_DEFAULT] unused */
    kvp__ropts *by_req;         /* uthash head: options of active requests */
    const kvp__ropts *pending;  /* during a release or a retained access: whose options
                                   set the records of the blocks being unpinned, or NULL */
} kvp__retention;

/* Bodies of the public calls (lock.c). */
int kvp__request_set_retention_locked(kvp_cache *cache, uint64_t req_id, const kvp_retention *r);
int kvp__access_retained_locked(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                                size_t n_tokens, const kvp_retention *r, kvp_match *out);
int kvp__access_ids_retained_locked(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                                    size_t n_ids, size_t n_tokens, const kvp_retention *r,
                                    kvp_match *out);
int kvp__block_retention_locked(const kvp_cache *cache, uint32_t block_id, int *priority);

/* Hooks (pool.c, lifecycle.c, cache.c). None allocates; none can fail. */
void kvp__retention_free(kvp_cache *cache);
void kvp__retention_release(kvp_cache *cache, kvp__request *req);
void kvp__retention_note(kvp_cache *cache, uint32_t id, uint32_t i);
bool kvp__retention_queue(kvp_cache *cache, uint32_t id, uint32_t depth);
void kvp__retention_unlink(kvp_cache *cache, uint32_t id);
void kvp__retention_forget(kvp_cache *cache, uint32_t id);
void kvp__retention_refresh(kvp_cache *cache);
uint32_t kvp__retention_pop(kvp_cache *cache, bool below);
uint32_t kvp__retention_drop_one(kvp_cache *cache);
uint32_t kvp__retention_group_victim(const kvp_cache *cache, const kvp__qgroup *g);
int kvp__retention_check(const kvp_cache *cache);

#endif /* KVP_RETENTION_H */
