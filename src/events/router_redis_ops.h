/*
 * router_redis_ops.h - the Redis store of the router index (router_redis_ops.c): the
 * router_store.h interface answered by the in-memory index (the local view) and a Redis
 * database that several routers share, over the transport of router_redis.h. Nothing here
 * is installed or exported.
 *
 * Every batch is validated and applied to the local index exactly as the local store
 * applies it, then sent to Redis in one FCALL (kvprefix_apply of router_redis.lua);
 * scores are one pipelined round trip (one kvprefix_score FCALL per hash group) and fall
 * back to the local index (router_score.c, the local store's score) when Redis fails or is
 * in its retry pause, reported per call as KVP_ROUTER_VIEW_FALLBACK. worker_add and check
 * are the local store's (router_local.h). The store takes the locks itself, in
 * router_store.h's order, through router_base.c: it calls nothing in router.c.
 *
 * Without hiredis (KVP_HAVE_REDIS undefined) the two functions are inline stubs: a Redis
 * url is KVP_ENOTSUP at creation.
 */
#ifndef KVP_EVENTS_ROUTER_REDIS_OPS_H
#define KVP_EVENTS_ROUTER_REDIS_OPS_H

#include "router_local.h"

#ifdef KVP_HAVE_REDIS

#include "router_redis.h"

/* A Redis store over ix from cfg (cfg->url not NULL), after one try to connect (a failure
 * only starts the retry pause). Returns KVP_OK with *out set; KVP_EINVAL (a field out of
 * range, a url or key prefix that does not parse); KVP_ENOMEM. */
int kvp__rr_new(kvp__rt_index *ix, const kvp_router_redis *cfg, kvp__rt_store **out);

/* The store's invariant checker (kvprefix_check in router_redis.lua): every key of its
 * prefix, walked with KEYS (tests and debugging only). Returns KVP_OK, KVP_ECORRUPT (*why:
 * a static description), KVP_EIO (Redis failed: counted as any failure), KVP_ENOMEM;
 * KVP_EINVAL when s is not a Redis store. */
int kvp__rr_check(kvp__rt_store *s, const char **why);

#else

static inline int kvp__rr_new(kvp__rt_index *ix, const kvp_router_redis *cfg, kvp__rt_store **out)
{
    (void)ix;
    (void)cfg;
    (void)out;
    return KVP_ENOTSUP;
}

static inline int kvp__rr_check(kvp__rt_store *s, const char **why)
{
    (void)s;
    (void)why;
    return KVP_EINVAL;
}

#endif /* KVP_HAVE_REDIS */

#endif /* KVP_EVENTS_ROUTER_REDIS_OPS_H */
