/*
 * router_store.h - the store interface of the router index: what answers kvp_router's
 * mutating calls and scores, behind one table of functions, and the locking protocol of
 * every router file, stated here once.
 *
 *   kvp_router (router.c)                 validates arguments, then dispatches
 *    |- ix      kvp__rt_index              the in-memory index (router_workers.h)
 *    `- store   kvp__rt_store *  --ops-->  router_local.c   the index alone
 *                                          router_redis*.c  the index (local view, fallback)
 *                                                           + a Redis database the fleet
 *                                                           shares
 *
 * Operations (kvp__rt_store_ops). Each receives arguments router.c has checked (non-NULL
 * pointers, namespace fields well formed) and returns what the public call of the same
 * name documents in include/kvprefix_events.h:
 *
 *   apply          kvp_router_apply_many (kvp_router_apply is one item): items[0 .. n)
 *   score          kvp_router_score and _score_hashes (kvp__rt_query), and which view
 *                  answered this very call (KVP_ROUTER_VIEW_*): LOCAL for the local store;
 *                  REDIS, or FALLBACK when Redis failed or is in its retry pause, for Redis
 *   worker_add     kvp_router_worker_add (get false) and _worker_get (get true)
 *   worker_remove, mark_stale, resync      the calls of those names
 *   stats          the store's fields of kvp_router_stats, after router.c filled the index's
 *   check          kvp_router_check: the local view's invariants (both stores)
 *   free           the store itself (the index is router.c's to free, after)
 *
 * Worker find, worker stats and the index half of stats are the same for every store: the
 * index answers them, and router.c calls router_workers.c for them directly.
 *
 * Locks, in the only order they may be taken:
 *
 *   1. a store's own mutex (the Redis store's connection mutex, kvp__rr.mu), if any;
 *   2. the index lock (kvp__rt_index.lock, router_base.h): a writer-preferring rwlock,
 *      never taken twice by one thread.
 *
 * Who takes them: router.c takes the index lock itself around the index-only calls (worker
 * find, worker stats, the index half of stats); a store operation is called with no lock
 * held and takes, through router_base.c, what it needs, in the order above. Hashing a
 * prompt and network I/O never run under the index lock (a long prompt or a slow Redis
 * must not stop the event threads); a store's mutex may be held across its network round
 * trip, never across hashing. Exclusive holds: worker add/get/remove, apply (one hold for
 * all the items of apply_many), mark_stale, resync. Shared holds: score (per hash group),
 * stats, worker find and stats, check. Every exclusive hold bumps the lock's version, so a
 * score that resumes after hashing knows whether a writer ran.
 *
 * Every store keeps these guarantees, whatever its backing: a mutation is all or nothing
 * in the index; each hash group's rows come from one consistent state (of the index, or
 * of the Redis store, where one FCALL answers a group); the rows' engine ids are the
 * interned names of router_workers.h (valid until kvp_router_free).
 */
#ifndef KVP_EVENTS_ROUTER_STORE_H
#define KVP_EVENTS_ROUTER_STORE_H

#include "router_score.h"

typedef struct kvp__rt_store kvp__rt_store;

/* A store's operations; every entry is set (see above for what each does). */
typedef struct kvp__rt_store_ops {
    const char *name; /* "local" or "redis", for messages */
    int (*apply)(kvp__rt_store *s, kvp_router_item *items, size_t n);
    int (*score)(kvp__rt_store *s, const kvp__rt_query *q, size_t *n_rows, int *view);
    int (*worker_add)(kvp__rt_store *s, const kvp_router_worker_config *wc, bool get, uint32_t *id);
    int (*worker_remove)(kvp__rt_store *s, uint32_t id);
    int (*mark_stale)(kvp__rt_store *s, uint32_t id);
    int (*resync)(kvp__rt_store *s, uint32_t id);
    void (*stats)(kvp__rt_store *s, kvp_router_stats *st);
    int (*check)(kvp__rt_store *s);
    void (*free)(kvp__rt_store *s);
} kvp__rt_store_ops;

/* The part every store begins with (a store's struct has it as its first member). */
struct kvp__rt_store {
    const kvp__rt_store_ops *ops; /* the implementation */
    kvp__rt_index *ix;            /* the router's index (not owned: router.c frees it) */
};

#endif /* KVP_EVENTS_ROUTER_STORE_H */
