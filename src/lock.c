/*
 * lock.c - the public entry points of a cache: the callback guard, the cache's lock, and
 * event emission. Every public call that takes a cache comes through here, checks that this
 * thread is not inside one of the cache's callbacks, takes the lock, runs the body
 * (kvp__*_locked in lifecycle.c and cache.c) and lets go.
 *
 * Locking design. One reader/writer lock per cache:
 *
 *   shared (many threads at once)      exclusive (one thread, no readers)
 *   kvp_lookup, kvp_lookup_ids,        kvp_acquire(_keys), kvp_commit(_keys), kvp_grow,
 *   kvp_lookup_keys, kvp_cache_stats,  kvp_release(_all), kvp_access(_keys, _ids),
 *   kvp_request_blocks,                kvp_cache_reset, kvp_cache_check (its scratch
 *   kvp_cache_requests
 *                                      memory goes through the cache's allocator)
 *
 *   lock-free: kvp_cache_keys (reads only the immutable config), kvp_hash_blocks,
 *   kvp_namespace_key, kvp_external_key; kvp_cache_new/kvp_cache_free are not concurrent
 *   with anything on the same cache.
 *
 * Lookups only read the index, pool and verify store; the two counters they bump
 * (n_lookups, n_verify_rejects) are relaxed atomics, so counts are exact under any
 * interleaving. Mutations are linearizable: each runs alone between two consistent states.
 * The lock prefers writers (glibc's PREFER_WRITER_NONRECURSIVE kind) so a stream of
 * lookups cannot starve an event thread's updates; a thread must therefore never take the
 * shared lock twice (nothing here does: no entry point calls another).
 *
 * Callbacks run on the thread that made the mutating call, with the exclusive lock held.
 * A callback may call any other cache, but a call on its own cache returns KVP_EBUSY (the
 * thread-local frame list below says so without touching the lock, which would deadlock),
 * and it must not wait for another thread that is calling this cache.
 *
 * kvp_config.single_threaded skips the lock (the callback guard stays): for engines that
 * serialize every call themselves. The lock costs two uncontended atomic operations per
 * call: under 1% of workload (c) (bench/bench_threads).
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: writer preference */
#endif
#include <pthread.h>

#include "internal.h"
#include "tier.h"

KVP__TLS kvp__cb_frame *kvp__cb_top;

void kvp__emit(kvp_cache *cache, const kvp_event *ev)
{
    if (!cache->cfg.on_event)
        return;
    kvp__cb_frame frame = {cache, kvp__cb_top};
    kvp__cb_top = &frame;
    cache->cfg.on_event(cache->cfg.event_ud, ev);
    kvp__cb_top = frame.up;
}

/* Initialise the cache's lock. KVP_OK or KVP_ENOMEM (the system refused). */
int kvp__lock_init(kvp_cache *cache)
{
    pthread_rwlockattr_t attr;
    int err = pthread_rwlockattr_init(&attr);
    if (err != 0)
        return kvp__fail(KVP_ENOMEM, "the system refused the cache's lock attributes (error %d)",
                         err);
#if defined(__GLIBC__)
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    err = pthread_rwlock_init(&cache->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (err != 0)
        return kvp__fail(KVP_ENOMEM, "the system refused to initialise the cache's lock (error %d)",
                         err);
    cache->lock_ready = true;
    return KVP_OK;
}

void kvp__lock_destroy(kvp_cache *cache)
{
    if (cache->lock_ready)
        pthread_rwlock_destroy(&cache->lock);
    cache->lock_ready = false;
}

enum { SHARED, EXCLUSIVE };

/* Enter a public call on cache: KVP_OK with the lock held in the given mode, or
 * KVP_EINVAL (NULL cache) / KVP_EBUSY (inside the cache's own callback on this thread).
 * The lock is a mutable part of a const cache: taking it changes no observable state. */
static int enter(const kvp_cache *cache, int mode)
{
    if (!cache)
        return kvp__fail(KVP_EINVAL, "cache is NULL");
    if (kvp__in_callback(cache))
        return kvp__fail(KVP_EBUSY, "called from inside this cache's own event callback");
    if (cache->cfg.single_threaded)
        return KVP_OK;
    pthread_rwlock_t *lock = (pthread_rwlock_t *)&cache->lock;
    int err = mode == SHARED ? pthread_rwlock_rdlock(lock) : pthread_rwlock_wrlock(lock);
    if (err != 0) /* EDEADLK/EAGAIN: a caller bug, reported */
        return kvp__fail(KVP_EBUSY, "taking the cache's %s lock failed (error %d)",
                         mode == SHARED ? "shared" : "exclusive", err);
    return KVP_OK;
}

static int leave(const kvp_cache *cache, int rc)
{
    if (!cache->cfg.single_threaded)
        pthread_rwlock_unlock((pthread_rwlock_t *)&cache->lock);
    return rc;
}

/* Run BODY (an expression giving a status) under the lock in MODE; a failure leaves its
 * detail for kvp_errmsg (kvp__public). */
#define LOCKED(cache, mode, body)                                                                  \
    do {                                                                                           \
        int rc_ = enter((cache), (mode));                                                          \
        if (rc_ != KVP_OK)                                                                         \
            return kvp__fail_done(rc_);                                                            \
        return kvp__public(leave((cache), (body)));                                                \
    } while (0)

KVP_EXPORT void kvp_cache_free(kvp_cache *cache)
{
    /* Inside its own callback the cache is mid-operation: freeing it there would pull the
     * memory from under the call that is running, so the request is ignored. */
    if (cache && !kvp__in_callback(cache))
        kvp__cache_destroy(cache);
}

KVP_EXPORT int kvp_lookup(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                          size_t n_tokens, uint32_t *block_ids, size_t cap, kvp_match *out)
{
    LOCKED(cache, SHARED, kvp__lookup_locked(cache, ns, tokens, n_tokens, block_ids, cap, out));
}

KVP_EXPORT int kvp_lookup_ids(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                              size_t n_ids, size_t n_tokens, uint32_t *block_ids, size_t cap,
                              kvp_match *out)
{
    LOCKED(cache, SHARED,
           kvp__lookup_ids_locked(cache, ns, ids, n_ids, n_tokens, block_ids, cap, out));
}

KVP_EXPORT int kvp_lookup_keys(kvp_cache *cache, const kvp_namespace *ns, kvp_key root,
                               const kvp_key *keys, const uint32_t *tokens, size_t n_tokens,
                               uint32_t *block_ids, size_t cap, kvp_match *out)
{
    LOCKED(cache, SHARED,
           kvp__lookup_keys_locked(cache, ns, root, keys, tokens, n_tokens, block_ids, cap, out));
}

KVP_EXPORT int kvp_acquire(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                           const uint32_t *tokens, size_t n_tokens, size_t n_capacity,
                           kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE,
           kvp__acquire_locked(cache, req_id, ns, NULL, NULL, tokens, n_tokens, n_capacity, out));
}

KVP_EXPORT int kvp_acquire_keys(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                                kvp_key root, const kvp_key *keys, const uint32_t *tokens,
                                size_t n_tokens, size_t n_capacity, kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE,
           kvp__acquire_locked(cache, req_id, ns, &root, keys, tokens, n_tokens, n_capacity, out));
}

KVP_EXPORT int kvp_grow(kvp_cache *cache, uint64_t req_id, size_t n_capacity)
{
    LOCKED(cache, EXCLUSIVE, kvp__grow_locked(cache, req_id, n_capacity));
}

KVP_EXPORT int kvp_request_blocks(const kvp_cache *cache, uint64_t req_id, const uint32_t **ids,
                                  size_t *n)
{
    LOCKED(cache, SHARED, kvp__request_blocks_locked(cache, req_id, ids, n));
}

KVP_EXPORT int kvp_commit(kvp_cache *cache, uint64_t req_id, const uint32_t *tokens,
                          size_t n_tokens, size_t *n_stored)
{
    LOCKED(cache, EXCLUSIVE, kvp__commit_locked(cache, req_id, NULL, tokens, n_tokens, n_stored));
}

KVP_EXPORT int kvp_commit_keys(kvp_cache *cache, uint64_t req_id, const kvp_key *keys,
                               const uint32_t *tokens, size_t n_tokens, size_t *n_stored)
{
    LOCKED(cache, EXCLUSIVE, kvp__commit_locked(cache, req_id, keys, tokens, n_tokens, n_stored));
}

KVP_EXPORT int kvp_release(kvp_cache *cache, uint64_t req_id)
{
    LOCKED(cache, EXCLUSIVE, kvp__release_locked(cache, req_id));
}

KVP_EXPORT int kvp_cache_requests(const kvp_cache *cache, uint64_t *ids, size_t cap,
                                  size_t *n_active)
{
    LOCKED(cache, SHARED, kvp__requests_locked(cache, ids, cap, n_active));
}

KVP_EXPORT int kvp_release_all(kvp_cache *cache, size_t *n_released)
{
    LOCKED(cache, EXCLUSIVE, kvp__release_all_locked(cache, n_released));
}

KVP_EXPORT int kvp_access(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                          size_t n_tokens, kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE, kvp__access_locked(cache, ns, NULL, NULL, tokens, n_tokens, out));
}

KVP_EXPORT int kvp_access_keys(kvp_cache *cache, const kvp_namespace *ns, kvp_key root,
                               const kvp_key *keys, const uint32_t *tokens, size_t n_tokens,
                               kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE, kvp__access_locked(cache, ns, &root, keys, tokens, n_tokens, out));
}

KVP_EXPORT int kvp_access_ids(kvp_cache *cache, const kvp_namespace *ns, const kvp_key *ids,
                              size_t n_ids, size_t n_tokens, kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE, kvp__access_ids_locked(cache, ns, ids, n_ids, n_tokens, out));
}

KVP_EXPORT int kvp_request_set_retention(kvp_cache *cache, uint64_t req_id, const kvp_retention *r)
{
    LOCKED(cache, EXCLUSIVE, kvp__request_set_retention_locked(cache, req_id, r));
}

KVP_EXPORT int kvp_access_retained(kvp_cache *cache, const kvp_namespace *ns,
                                   const uint32_t *tokens, size_t n_tokens, const kvp_retention *r,
                                   kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE, kvp__access_retained_locked(cache, ns, tokens, n_tokens, r, out));
}

KVP_EXPORT int kvp_access_ids_retained(kvp_cache *cache, const kvp_namespace *ns,
                                       const kvp_key *ids, size_t n_ids, size_t n_tokens,
                                       const kvp_retention *r, kvp_match *out)
{
    LOCKED(cache, EXCLUSIVE,
           kvp__access_ids_retained_locked(cache, ns, ids, n_ids, n_tokens, r, out));
}

KVP_EXPORT int kvp_block_retention(const kvp_cache *cache, uint32_t block_id, int *priority)
{
    LOCKED(cache, SHARED, kvp__block_retention_locked(cache, block_id, priority));
}

KVP_EXPORT int kvp_cache_set_quota(kvp_cache *cache, const kvp_namespace *ns,
                                   uint32_t max_cached_blocks)
{
    LOCKED(cache, EXCLUSIVE, kvp__set_quota_locked(cache, ns, max_cached_blocks));
}

KVP_EXPORT int kvp_cache_reset(kvp_cache *cache)
{
    LOCKED(cache, EXCLUSIVE, kvp__cache_reset_locked(cache));
}

KVP_EXPORT int kvp_cache_stats(const kvp_cache *cache, kvp_stats *out)
{
    LOCKED(cache, SHARED, kvp__cache_stats_locked(cache, out));
}

KVP_EXPORT int kvp_cache_check(const kvp_cache *cache)
{
    /* Exclusive: the checker's scratch goes through the cache's allocator. */
    LOCKED(cache, EXCLUSIVE, kvp__cache_check(cache));
}

/* Tiers (tier.c, tier_orders.c): the same lock discipline. */
KVP_EXPORT int kvp_cache_add_tier(kvp_cache *cache, const kvp_tier_config *tc, int *tier)
{
    LOCKED(cache, EXCLUSIVE, kvp__tier_add_locked(cache, tc, tier));
}

KVP_EXPORT int kvp_acquire_tiers(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                                 const uint32_t *tokens, size_t n_tokens, size_t n_capacity,
                                 kvp_match *out, kvp_tier_order *loads, size_t cap, size_t *n_loads)
{
    LOCKED(cache, EXCLUSIVE,
           kvp__acquire_tiers_locked(cache, req_id, ns, tokens, n_tokens, n_capacity, out, loads,
                                     cap, n_loads));
}

KVP_EXPORT int kvp_tier_orders(kvp_cache *cache, kvp_tier_order *out, size_t cap, size_t *n,
                               size_t *n_left)
{
    LOCKED(cache, EXCLUSIVE, kvp__tier_orders_locked(cache, out, cap, n, n_left));
}

KVP_EXPORT int kvp_tier_confirm(kvp_cache *cache, uint64_t order_id, bool ok)
{
    LOCKED(cache, EXCLUSIVE, kvp__tier_confirm_locked(cache, order_id, ok));
}

KVP_EXPORT int kvp_lookup_tiers(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                                size_t n_tokens, uint8_t *where, size_t cap, kvp_tier_match *out)
{
    LOCKED(cache, SHARED, kvp__lookup_tiers_locked(cache, ns, tokens, n_tokens, where, cap, out));
}

KVP_EXPORT int kvp_cache_tier_stats(const kvp_cache *cache, int tier, kvp_tier_stats *out,
                                    int *n_tiers)
{
    LOCKED(cache, SHARED, kvp__tier_stats_locked(cache, tier, out, n_tiers));
}

KVP_EXPORT const char *kvp_cache_tier_medium(const kvp_cache *cache, int tier)
{
    /* Inside the cache's callback this thread holds the exclusive lock already. */
    if (!cache)
        return NULL;
    if (kvp__in_callback(cache) || cache->cfg.single_threaded)
        return kvp__tier_medium(cache, tier);
    pthread_rwlock_t *lock = (pthread_rwlock_t *)&cache->lock;
    if (pthread_rwlock_rdlock(lock) != 0)
        return NULL;
    const char *m = kvp__tier_medium(cache, tier);
    pthread_rwlock_unlock(lock);
    return m;
}
