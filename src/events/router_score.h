/*
 * router_score.h - scoring a prompt on the in-memory index (router_score.c), and the
 * prompt hashing that the Redis store reuses. Builds on router_workers.h. The functions
 * here take the index lock themselves, shared, as router_store.h states (hashing runs
 * outside it).
 */
#ifndef KVP_EVENTS_ROUTER_SCORE_H
#define KVP_EVENTS_ROUTER_SCORE_H

#include "router_workers.h"

/* One score call's arguments, checked by router.c: a prompt (ns set) or block hashes (ns
 * NULL), and where the rows go. */
typedef struct kvp__rt_query {
    const kvp_namespace *ns; /* the request's namespace; NULL: score hashes[] */
    const uint32_t *tokens;  /* the prompt, when ns */
    size_t n_tokens;         /* its tokens */
    const uint64_t *hashes;  /* block hashes, block 0 first, when !ns */
    size_t n_hashes;         /* how many */
    kvp_router_row *rows;    /* room for cap rows (the caller's) */
    size_t cap;              /* rows' room */
    const char **engine_ids; /* NULL, or room for cap pointers: engine_ids[i] receives
                                rows[i]'s interned engine id (router_workers.h) */
} kvp__rt_query;

/* kvp_router_score (q->ns set) or kvp_router_score_hashes (q->ns NULL) on the index:
 * rows[0 .. n_workers) and their engine ids filled, *n_rows = n_workers, n_scores counted.
 * Returns as those calls: KVP_OK, KVP_ENOSPC (*n_rows = the rows needed), KVP_EINVAL (a
 * namespace the hasher refuses), KVP_ENOMEM (key scratch above 1024 blocks). Takes the
 * shared lock (per group for a prompt, hashing between holds; once for hashes). */
int kvp__rt_score(kvp__rt_index *ix, const kvp__rt_query *q, size_t *n_rows);

/* Group g's keys of tokens[0 .. n_tokens) under namespace ns, for a caller that probes
 * them elsewhere (the Redis store): keys[0 .. n_tokens / block size) (room given by the
 * caller), *state KVP_ROUTER_ROW_SCORED; or *state MODEL, NOTSUP or TOKEN (no keys) as
 * kvp_router_score marks the group's rows. g is a published group (immutable: no lock
 * needed). Returns KVP_OK or KVP_EINVAL (a namespace the hasher refuses). */
int kvp__rt_group_keys(const kvp__rt_group *g, const kvp_namespace *ns, const uint32_t *tokens,
                       size_t n_tokens, uint64_t *keys, int *state);

/* kvp_router_check_keys's body for a worker of group g (engine-hash mode): the first block
 * of every parentless BlockStored of b (in KV cache group kv_group, without extra_keys or
 * LoRA) hashed with g's hasher and compared with the event's hash; *out filled (zeroed
 * first). g is a published group (no lock needed). KVP_OK (cannot fail otherwise: a cause
 * that needs a hasher it cannot make is left unnamed). */
int kvp__rt_group_check_keys(const kvp__rt_group *g, int32_t kv_group, const kvp_kv_batch *b,
                             kvp_router_key_check *out);

#endif /* KVP_EVENTS_ROUTER_SCORE_H */
