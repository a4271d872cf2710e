/*
 * router.h - kvp_router, the handle of the router index, and the map of its source files
 * (src/events/router*.c). Nothing here is installed or exported.
 *
 *   kvp_router (router.c: validate, dispatch)
 *    |- ix              kvp__rt_index, the in-memory index (router_workers.h):
 *    |   |- mem, lock     allocator, writer-preferring rwlock + version (router_base.h)
 *    |   |- table         block hash -> holder set (router_table.h):
 *    |   |                  slots[cap]: {key, hv}, open addressing, robin hood order
 *    |   |                  hv inline:  up to 3 holders of 21 bits (worker 15 | media 6)
 *    |   |                  hv spill:   class, count, record index into arenas[class]
 *    |   |- workers[n_slots] engine id, dp rank, group, sequence state; token mode:
 *    |   |                  tmap, engine block hash -> own key (router_tmap.h)
 *    |   |- names[]       interned engine ids, kept until kvp_router_free
 *    |   |- groups[]      one kvp_hasher per (hash configuration, model)
 *    |   `- media[]       tier names and weights; weight_of_mask[] per media bit set
 *    `- store           kvp__rt_store *, the interface of router_store.h:
 *                         local (router_local.c) or Redis (router_redis*.c)
 *
 * Layers, each file including only its own header and the headers of the layers below it
 * (no file calls up):
 *
 *   router.c                                   public entry points
 *   router_redis_ops.c                         the Redis store (its operations)
 *   router_redis.c                             the Redis store's transport: connection,
 *                                              commands, pipeline with a deadline
 *   router_local.c                             the local store
 *   (router_store.h)                           the store interface, the lock protocol
 *   router_apply.c, router_score.c             apply a batch, score a prompt
 *   router_workers.c                           the index: workers, names, groups, media,
 *                                              stats, checker
 *   router_table.c, router_tmap.c              the hash table; token mode's maps
 *   router_base.c                              allocator and lock
 *
 * Files: router.c (configuration, argument checks, creation, dispatch to the store),
 * router_base.c (allocator, lock), router_table.c (the table), router_tmap.c (token
 * mode's engine hash -> own key maps), router_workers.c (the index: lifecycle, workers,
 * interned names, hash groups, media, stats, checker), router_apply.c (batch validation,
 * sequence numbers, apply; token mode's own keys), router_score.c (scoring, prompt keys,
 * the engine-hash key check), router_local.c (the local store), router_redis.c (the Redis
 * store's transport: configuration, connection, commands), router_redis_ops.c (the Redis
 * store: creation, apply, score, worker operations, stats, checker, its operations table),
 * router_redis.lua (its Lua library).
 */
#ifndef KVP_EVENTS_ROUTER_H
#define KVP_EVENTS_ROUTER_H

#include "router_local.h"
#include "router_redis_ops.h"

struct kvp_router {
    kvp__rt_index ix;     /* the in-memory index (the local view) */
    kvp__rt_store *store; /* what answers the dispatched calls (set at creation, constant) */
};

#endif /* KVP_EVENTS_ROUTER_H */
