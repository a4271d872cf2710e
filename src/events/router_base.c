/*
 * router_base.c - the router index's allocator and lock (router_base.h), the bottom of the
 * router's files: it calls none of them.
 *
 * Memory: every byte the router holds goes through kvp__rt_alloc, the hashers' included
 * (router_workers.c hands the same hooks to kvp_hasher_new), so live_bytes is what
 * kvp_router_stats reports as total_bytes. live_bytes is written only by exclusive
 * sections (creation, destruction, mutations under the exclusive lock).
 *
 * The lock prefers writers (glibc's PREFER_WRITER_NONRECURSIVE kind, as src/lock.c does
 * for a cache) so that a stream of scores cannot starve the event threads; the price is
 * that a thread must never take it twice (a reader waiting behind a queued writer would
 * wait for itself). The protocol (who takes it, for how long, in which order with a
 * store's mutex) is router_store.h's.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: writer preference */
#endif
#include <stdlib.h>

#include "router_base.h"

/* ---------------------------------------------------------------- memory */

static void *default_alloc(void *ud, size_t size)
{
    (void)ud;
    return malloc(size);
}

static void default_free(void *ud, void *ptr, size_t size)
{
    (void)ud;
    (void)size;
    free(ptr);
}

void kvp__rt_mem_init(kvp__rt_mem *mem, const kvp_allocator *hooks)
{
    mem->hooks.alloc = hooks && hooks->alloc ? hooks->alloc : default_alloc;
    mem->hooks.free = hooks && hooks->alloc && hooks->free ? hooks->free : default_free;
    mem->hooks.ud = hooks && hooks->alloc ? hooks->ud : NULL;
    mem->live_bytes = 0;
}

void *kvp__rt_alloc(kvp__rt_mem *mem, size_t size)
{
    void *p = mem->hooks.alloc(mem->hooks.ud, size ? size : 1);
    if (p)
        mem->live_bytes += size ? size : 1;
    return p;
}

void kvp__rt_free(kvp__rt_mem *mem, void *ptr, size_t size)
{
    if (!ptr)
        return;
    mem->live_bytes -= size ? size : 1;
    mem->hooks.free(mem->hooks.ud, ptr, size ? size : 1);
}

/* ---------------------------------------------------------------- lock */

int kvp__rt_lock_init(kvp__rt_lock *l)
{
    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr) != 0)
        return KVP_ENOMEM;
#if defined(__GLIBC__)
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int err = pthread_rwlock_init(&l->rw, &attr);
    pthread_rwlockattr_destroy(&attr);
    l->version = 0;
    return err == 0 ? KVP_OK : KVP_ENOMEM;
}

void kvp__rt_lock_destroy(kvp__rt_lock *l)
{
    pthread_rwlock_destroy(&l->rw);
}

void kvp__rt_rdlock(kvp__rt_lock *l)
{
    int err = pthread_rwlock_rdlock(&l->rw);
    assert(err == 0);
    (void)err;
}

/* Whatever the section does, a score that saw the previous version knows that the index
 * may have changed. */
void kvp__rt_wrlock(kvp__rt_lock *l)
{
    int err = pthread_rwlock_wrlock(&l->rw);
    assert(err == 0);
    (void)err;
    l->version++;
}

void kvp__rt_unlock(kvp__rt_lock *l)
{
    pthread_rwlock_unlock(&l->rw);
}
