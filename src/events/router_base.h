/*
 * router_base.h - the bottom layer of the router index (src/events/router*.c): its
 * allocator and its lock. Every other router file builds on these two; this header includes
 * no other router header, and router_base.c calls no other router file.
 *
 *   kvp__rt_mem    the caller's allocator hooks (or malloc/free) and the bytes live through
 *                  them, so that kvp_router_stats.total_bytes is a measurement
 *   kvp__rt_lock   one writer-preferring reader/writer lock and the version that every
 *                  exclusive section bumps (a score that saw the version unchanged knows
 *                  that no writer ran in between)
 *
 * Who takes the lock, and in which order with the stores' own locks, is stated once, in
 * router_store.h. Nothing here is installed or exported.
 */
#ifndef KVP_EVENTS_ROUTER_BASE_H
#define KVP_EVENTS_ROUTER_BASE_H

#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix_events.h"

#define KVP__RT_NIL UINT32_MAX /* "no slot / no record / no index" */

/* The router's allocator: the caller's hooks (or malloc/free) plus a live-byte count. */
typedef struct kvp__rt_mem {
    kvp_allocator hooks; /* alloc/free never NULL after kvp__rt_mem_init */
    size_t live_bytes;   /* bytes currently allocated through the hooks (writer-owned) */
} kvp__rt_mem;

/* Take hooks (NULL, or alloc NULL: malloc/free). Cannot fail. */
void kvp__rt_mem_init(kvp__rt_mem *mem, const kvp_allocator *hooks);

/* size bytes (1 for 0), or NULL. Counted in live_bytes. */
void *kvp__rt_alloc(kvp__rt_mem *mem, size_t size);

/* Free ptr, allocated with size bytes. Accepts NULL. Cannot fail. */
void kvp__rt_free(kvp__rt_mem *mem, void *ptr, size_t size);

/* The index lock. */
typedef struct kvp__rt_lock {
    pthread_rwlock_t rw; /* writer-preferring (glibc PREFER_WRITER_NONRECURSIVE) */
    uint64_t version;    /* bumped by kvp__rt_wrlock; read with the lock held */
} kvp__rt_lock;

/* Make the lock, version 0. KVP_OK or KVP_ENOMEM. */
int kvp__rt_lock_init(kvp__rt_lock *l);

/* Destroy an unheld lock. Cannot fail. */
void kvp__rt_lock_destroy(kvp__rt_lock *l);

/* Take the lock shared. Cannot fail (the lock is never taken twice by one thread). */
void kvp__rt_rdlock(kvp__rt_lock *l);

/* Take the lock exclusively and bump the version. Cannot fail. */
void kvp__rt_wrlock(kvp__rt_lock *l);

/* Release either hold. Cannot fail. */
void kvp__rt_unlock(kvp__rt_lock *l);

#endif /* KVP_EVENTS_ROUTER_BASE_H */
