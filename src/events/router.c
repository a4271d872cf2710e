/*
 * router.c - kvp_router's public entry points (include/kvprefix_events.h): configuration,
 * argument checks, creation and destruction, and dispatch. Every mutating call and every
 * score goes to the router's store through the interface of router_store.h (the local
 * store, or the Redis store when kvp_router_config.redis.url is set); worker find, worker
 * stats and the index half of stats are the index's whatever the store, and are answered
 * here under the index lock (the protocol is router_store.h's). Nothing here knows which
 * store it talks to: there is no store-specific branch in this file.
 */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "router.h"

#define MAX_WEIGHT 1000.0

/* ---------------------------------------------------------------- configuration */

KVP_EXPORT void kvp_router_config_init(kvp_router_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->tiers[0] = (kvp_router_tier){"GPU", 1.0};
    cfg->tiers[1] = (kvp_router_tier){"CPU", 0.8};
    cfg->n_tiers = 2;
    cfg->unknown_weight = 0.5;
    cfg->default_medium = "GPU";
    cfg->kv_group = 0;
    kvp_config_init(&cfg->hash);
    cfg->hash.hash_profile = KVP_HASH_VLLM_SHA256;
    cfg->hash.block_size = 16;
    cfg->index_by = KVP_ROUTER_INDEX_ENGINE_HASH;
    kvp_config_init(&cfg->token_hash);
    cfg->token_hash.hash_profile = KVP_HASH_XXH3;
    cfg->redis.key_prefix = "kvp";
    cfg->redis.timeout_ms = 250;
    cfg->redis.retry_ms = 1000;
}

KVP_EXPORT void kvp_router_worker_config_init(kvp_router_worker_config *wc)
{
    if (!wc)
        return;
    memset(wc, 0, sizeof *wc);
    kvp_config_init(&wc->hash);
    wc->hash.hash_profile = KVP_HASH_VLLM_SHA256;
    wc->hash.block_size = 16;
}

static inline bool weight_ok(double w)
{
    return isfinite(w) && w >= 0 && w <= MAX_WEIGHT;
}

static inline bool medium_name_ok(const char *m)
{
    return m && m[0] != '\0' && strnlen(m, KVP_ROUTER_MEDIUM_MAX + 1) <= KVP_ROUTER_MEDIUM_MAX;
}

/* Validate cfg. KVP_OK or KVP_EINVAL. */
static int config_ok(const kvp_router_config *cfg)
{
    if (cfg->n_tiers > KVP_ROUTER_MAX_MEDIA || !weight_ok(cfg->unknown_weight))
        return KVP_EINVAL;
    for (size_t i = 0; i < cfg->n_tiers; i++) {
        if (!medium_name_ok(cfg->tiers[i].medium) || !weight_ok(cfg->tiers[i].weight))
            return KVP_EINVAL;
        for (size_t j = 0; j < i; j++) {
            if (strcasecmp(cfg->tiers[i].medium, cfg->tiers[j].medium) == 0)
                return KVP_EINVAL;
        }
    }
    if (cfg->default_medium && !medium_name_ok(cfg->default_medium))
        return KVP_EINVAL;
    int p = cfg->hash.hash_profile;
    if ((p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH) && cfg->hash.hash_key_len == 0)
        return KVP_EINVAL;
    if (cfg->index_by != KVP_ROUTER_INDEX_ENGINE_HASH && cfg->index_by != KVP_ROUTER_INDEX_TOKENS)
        return KVP_EINVAL;
    if (cfg->index_by == KVP_ROUTER_INDEX_TOKENS) {
        /* The own chain continues from a 128-bit key: the vllm-* profiles need more state. */
        int t = cfg->token_hash.hash_profile;
        if (t != KVP_HASH_XXH3 && t != KVP_HASH_KEYED && t != KVP_HASH_SIPHASH)
            return KVP_EINVAL;
        if (cfg->token_hash.hash_key_len > KVP_HASH_KEY_MAX ||
            (cfg->token_hash.hash_key_len != 0 && cfg->token_hash.hash_key_len < KVP_HASH_KEY_MIN))
            return KVP_EINVAL;
    }
    return KVP_OK;
}

/* A random table seed: KVP_OK or KVP_ENOTSUP. */
static int random_seed(uint64_t *seed)
{
    size_t got = 0;
    unsigned char b[8];
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return KVP_ENOTSUP;
        got += (size_t)n;
    }
    memcpy(seed, b, sizeof b);
    *seed |= 1; /* 0 means "random" in the config; keep the seed visibly set */
    return KVP_OK;
}

/* ---------------------------------------------------------------- lifecycle */

KVP_EXPORT void kvp_router_free(kvp_router *r)
{
    if (!r)
        return;
    if (r->store)
        r->store->ops->free(r->store);
    kvp__rt_index_destroy(&r->ix);
    kvp__rt_mem mem = r->ix.mem;
    kvp__rt_free(&mem, r, sizeof *r);
}

/* The store of a new router: Redis when cfg names one, else local. */
static int store_new(kvp_router *r, const kvp_router_config *cfg)
{
    if (cfg->redis.url)
        return kvp__rr_new(&r->ix, &cfg->redis, &r->store);
    return kvp__rt_local_new(&r->ix, &r->store);
}

KVP_EXPORT int kvp_router_new(const kvp_router_config *cfg, kvp_router **out)
{
    if (!cfg || !out)
        return KVP_EINVAL;
    int rc = config_ok(cfg);
    uint64_t seed = cfg->table_seed;
    if (rc == KVP_OK && seed == 0)
        rc = random_seed(&seed);
    if (rc != KVP_OK)
        return rc;
    if (cfg->index_by == KVP_ROUTER_INDEX_TOKENS && cfg->redis.url)
        return KVP_ENOTSUP; /* the shared store keeps engine hashes (docs/routing.md) */
    kvp__rt_mem mem;
    kvp__rt_mem_init(&mem, &cfg->alloc);
    kvp_router *r = kvp__rt_alloc(&mem, sizeof *r);
    if (!r)
        return KVP_ENOMEM;
    memset(r, 0, sizeof *r);
    rc = kvp__rt_index_init(&r->ix, &mem, cfg, seed);
    if (rc == KVP_OK)
        rc = store_new(r, cfg);
    if (rc != KVP_OK) {
        kvp_router_free(r);
        return rc;
    }
    *out = r;
    return KVP_OK;
}

/* ---------------------------------------------------------------- workers */

KVP_EXPORT int kvp_router_worker_add(kvp_router *r, const kvp_router_worker_config *wc,
                                     uint32_t *id)
{
    if (!r || !wc || !id)
        return KVP_EINVAL;
    return r->store->ops->worker_add(r->store, wc, false, id);
}

KVP_EXPORT int kvp_router_worker_find(kvp_router *r, const char *engine_id, int64_t dp_rank,
                                      uint32_t *id)
{
    if (!r || !engine_id || !id)
        return KVP_EINVAL;
    kvp__rt_rdlock(&r->ix.lock);
    int rc = kvp__rt_worker_find_locked(&r->ix, engine_id, dp_rank, id);
    kvp__rt_unlock(&r->ix.lock);
    return rc;
}

KVP_EXPORT int kvp_router_worker_get(kvp_router *r, const char *engine_id, int64_t dp_rank,
                                     uint32_t *id)
{
    if (!r || !engine_id || !id)
        return KVP_EINVAL;
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = engine_id;
    wc.dp_rank = dp_rank;
    return r->store->ops->worker_add(r->store, &wc, true, id);
}

KVP_EXPORT int kvp_router_worker_remove(kvp_router *r, uint32_t id)
{
    if (!r)
        return KVP_EINVAL;
    return r->store->ops->worker_remove(r->store, id);
}

/* ---------------------------------------------------------------- events */

KVP_EXPORT int kvp_router_apply(kvp_router *r, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                                kvp_router_apply_result *res)
{
    kvp_router_item it = {.worker = id, .seq = seq, .batch = b};
    if (!r) {
        memset(&it.res, 0, sizeof it.res);
        it.res.bad_event = SIZE_MAX;
        it.res.why = "NULL router";
        it.rc = KVP_EINVAL;
    } else {
        (void)r->store->ops->apply(r->store, &it, 1);
    }
    if (res)
        *res = it.res;
    return it.rc;
}

KVP_EXPORT int kvp_router_apply_many(kvp_router *r, kvp_router_item *items, size_t n)
{
    if (!r || (!items && n > 0))
        return KVP_EINVAL;
    return r->store->ops->apply(r->store, items, n);
}

KVP_EXPORT int kvp_router_mark_stale(kvp_router *r, uint32_t id)
{
    if (!r)
        return KVP_EINVAL;
    return r->store->ops->mark_stale(r->store, id);
}

KVP_EXPORT int kvp_router_resync(kvp_router *r, uint32_t id)
{
    if (!r)
        return KVP_EINVAL;
    return r->store->ops->resync(r->store, id);
}

/* ---------------------------------------------------------------- scores */

KVP_EXPORT void kvp_router_score_result_init(kvp_router_score_result *res)
{
    if (!res)
        return;
    memset(res, 0, sizeof *res);
}

KVP_EXPORT const char *kvp_router_view_name(int view)
{
    switch (view) {
    case KVP_ROUTER_VIEW_LOCAL:
        return "local";
    case KVP_ROUTER_VIEW_REDIS:
        return "redis";
    case KVP_ROUTER_VIEW_FALLBACK:
        return "fallback";
    default:
        return NULL;
    }
}

static bool field_ok(kvp_field f)
{
    return f.ptr || f.len == 0;
}

/* Both scores after their own checks: the store answers; res (may be NULL) gets the view. */
static int score_dispatch(kvp_router *r, const kvp__rt_query *q, size_t *n_rows,
                          kvp_router_score_result *res)
{
    int view = 0;
    int rc = r->store->ops->score(r->store, q, n_rows, &view);
    if (res)
        res->view = rc == KVP_OK ? view : 0;
    return rc;
}

KVP_EXPORT int kvp_router_score_v2(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens,
                                   size_t n_tokens, kvp_router_row *rows, size_t cap,
                                   size_t *n_rows, kvp_router_score_result *res)
{
    if (!r || !ns || !n_rows || (!tokens && n_tokens > 0) || (!rows && cap > 0))
        return KVP_EINVAL;
    if (!field_ok(ns->model) || !field_ok(ns->adapter) || !field_ok(ns->tenant) ||
        !field_ok(ns->salt))
        return KVP_EINVAL;
    kvp__rt_query q = {.ns = ns,
                       .tokens = tokens,
                       .n_tokens = n_tokens,
                       .rows = rows,
                       .cap = cap,
                       .engine_ids = res ? res->engine_ids : NULL};
    return score_dispatch(r, &q, n_rows, res);
}

KVP_EXPORT int kvp_router_score(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens,
                                size_t n_tokens, kvp_router_row *rows, size_t cap, size_t *n_rows)
{
    return kvp_router_score_v2(r, ns, tokens, n_tokens, rows, cap, n_rows, NULL);
}

KVP_EXPORT int kvp_router_score_hashes_v2(kvp_router *r, const uint64_t *hashes, size_t n_hashes,
                                          kvp_router_row *rows, size_t cap, size_t *n_rows,
                                          kvp_router_score_result *res)
{
    if (!r || !n_rows || (!hashes && n_hashes > 0) || (!rows && cap > 0))
        return KVP_EINVAL;
    kvp__rt_query q = {.hashes = hashes,
                       .n_hashes = n_hashes,
                       .rows = rows,
                       .cap = cap,
                       .engine_ids = res ? res->engine_ids : NULL};
    return score_dispatch(r, &q, n_rows, res);
}

KVP_EXPORT int kvp_router_score_hashes(kvp_router *r, const uint64_t *hashes, size_t n_hashes,
                                       kvp_router_row *rows, size_t cap, size_t *n_rows)
{
    return kvp_router_score_hashes_v2(r, hashes, n_hashes, rows, cap, n_rows, NULL);
}

/* ---------------------------------------------------------------- statistics, checker */

KVP_EXPORT int kvp_router_stats_get(kvp_router *r, kvp_router_stats *out)
{
    if (!r || !out)
        return KVP_EINVAL;
    kvp_router_stats st;
    memset(&st, 0, sizeof st);
    kvp__rt_rdlock(&r->ix.lock);
    kvp__rt_index_stats_locked(&r->ix, &st);
    kvp__rt_unlock(&r->ix.lock);
    r->store->ops->stats(r->store, &st);
    *out = st;
    return KVP_OK;
}

KVP_EXPORT int kvp_router_worker_stats_get(kvp_router *r, uint32_t id, kvp_router_worker_stats *out)
{
    if (!r || !out)
        return KVP_EINVAL;
    kvp__rt_rdlock(&r->ix.lock);
    int rc = kvp__rt_worker_stats_locked(&r->ix, id, out);
    kvp__rt_unlock(&r->ix.lock);
    return rc;
}

KVP_EXPORT int kvp_router_token_stats_get(kvp_router *r, uint32_t id, kvp_router_token_stats *out)
{
    if (!r || !out)
        return KVP_EINVAL;
    kvp__rt_rdlock(&r->ix.lock);
    int rc = kvp__rt_token_stats_locked(&r->ix, id, out);
    kvp__rt_unlock(&r->ix.lock);
    return rc;
}

KVP_EXPORT int kvp_router_check_keys(kvp_router *r, uint32_t id, const kvp_kv_batch *b,
                                     kvp_router_key_check *out)
{
    if (!r || !b || !out || (b->n_events > 0 && !b->events))
        return KVP_EINVAL;
    memset(out, 0, sizeof *out);
    kvp__rt_rdlock(&r->ix.lock);
    bool ok = kvp__rt_worker_ok(&r->ix, id);
    const kvp__rt_group *g = ok ? r->ix.groups[r->ix.workers[id].group] : NULL;
    kvp__rt_unlock(&r->ix.lock);
    if (!ok)
        return KVP_ENOENT;
    if (r->ix.by_tokens)
        return KVP_OK;
    /* Groups are immutable and outlive their workers: hash outside the lock. */
    return kvp__rt_group_check_keys(g, r->ix.kv_group, b, out);
}

KVP_EXPORT int kvp_router_check(kvp_router *r)
{
    if (!r)
        return KVP_EINVAL;
    return r->store->ops->check(r->store);
}
