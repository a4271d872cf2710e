/*
 * router_apply.h - applying event batches to the in-memory index (router_apply.c):
 * validation, sequence numbers, all-or-nothing application. Builds on router_workers.h;
 * called by the stores (router_local.c, router_redis_ops.c) with the index lock held
 * exclusively (router_store.h).
 */
#ifndef KVP_EVENTS_ROUTER_APPLY_H
#define KVP_EVENTS_ROUTER_APPLY_H

#include "router_workers.h"

/* kvp_router_apply's body on the index: res filled (zeroed first, bad_event SIZE_MAX).
 * Returns as kvp_router_apply: KVP_OK (res->status says what happened), KVP_EINVAL (b NULL
 * or malformed: res->why), KVP_ENOENT (no worker id), KVP_ENOMEM (nothing changed).
 * Exclusive lock. */
int kvp__rt_apply_one_locked(kvp__rt_index *ix, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                             kvp_router_apply_result *res);

#endif /* KVP_EVENTS_ROUTER_APPLY_H */
