/*
 * router_local.h - the local store (router_local.c): the router_store.h interface answered
 * by the in-memory index alone, the store of every router without a Redis url. Its
 * worker_add and check are also the Redis store's (they touch only the index).
 */
#ifndef KVP_EVENTS_ROUTER_LOCAL_H
#define KVP_EVENTS_ROUTER_LOCAL_H

#include "router_apply.h"
#include "router_store.h"

/* A local store over ix (allocated through ix->mem). KVP_OK or KVP_ENOMEM. */
int kvp__rt_local_new(kvp__rt_index *ix, kvp__rt_store **out);

/* The local store's worker_add and check operations, for any store over s->ix. */
int kvp__rt_local_worker_add(kvp__rt_store *s, const kvp_router_worker_config *wc, bool get,
                             uint32_t *id);
int kvp__rt_local_check(kvp__rt_store *s);

#endif /* KVP_EVENTS_ROUTER_LOCAL_H */
