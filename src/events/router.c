/*
 * router.c - kvp_router's public entry points: configuration, creation and destruction,
 * the lock, statistics and the invariant checker. The index itself is router_table.c;
 * workers, groups and media router_workers.c; batches router_apply.c; scores
 * router_score.c. With a Redis store (kvp_router_config.redis.url), apply, apply_many,
 * mark_stale, resync, worker_remove and the scores go through router_redis*.c, which call
 * back into the local index; without one, nothing here touches it.
 *
 * Locking. One reader/writer lock per router, preferring writers (glibc's
 * PREFER_WRITER_NONRECURSIVE kind, as src/lock.c does for a cache) so that a stream of
 * scores cannot starve the event threads:
 *
 *   exclusive: worker_add, worker_get, worker_remove, apply, apply_many (once for all its
 *              batches), mark_stale, resync
 *   shared:    worker_find, score (per group, hashing outside the lock), stats_get,
 *              worker_stats_get, check
 *
 * Every mutation runs alone between two consistent states; a score's rows for one hash
 * group come from one such state. The only counter written under the shared lock
 * (n_scores) is a relaxed atomic. No call takes the lock twice.
 *
 * Memory: every byte the router holds goes through its allocator (kvp__rt_alloc), the
 * hashers' included, so stats report a measurement: total_bytes is the allocator's live
 * count. Only score's key scratch for prompts above 1024 blocks and the checker's scratch
 * use malloc directly (they live for one call, under the shared lock).
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np: writer preference */
#endif
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "router.h"
#include "router_redis.h"

#define MAX_WEIGHT 1000.0

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

/* size bytes, or NULL. Counted in live_bytes. */
void *kvp__rt_alloc(kvp__rt_mem *mem, size_t size)
{
    void *p = mem->hooks.alloc(mem->hooks.ud, size ? size : 1);
    if (p)
        mem->live_bytes += size ? size : 1;
    return p;
}

/* Free ptr, allocated with size bytes. Accepts NULL. Cannot fail. */
void kvp__rt_free(kvp__rt_mem *mem, void *ptr, size_t size)
{
    if (!ptr)
        return;
    mem->live_bytes -= size ? size : 1;
    mem->hooks.free(mem->hooks.ud, ptr, size ? size : 1);
}

/* ---------------------------------------------------------------- lock */

void kvp__rt_rdlock(kvp_router *r)
{
    int err = pthread_rwlock_rdlock(&r->lock);
    assert(err == 0);
    (void)err;
}

/* Take the lock exclusively and bump the version: whatever the section does, a score that
 * saw the previous version knows that the index may have changed. */
void kvp__rt_wrlock(kvp_router *r)
{
    int err = pthread_rwlock_wrlock(&r->lock);
    assert(err == 0);
    (void)err;
    r->version++;
}

void kvp__rt_unlock(kvp_router *r)
{
    pthread_rwlock_unlock(&r->lock);
}

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

/* Media, default medium and default hash config of a new router. */
static int router_setup(kvp_router *r, const kvp_router_config *cfg)
{
    for (size_t i = 0; i < cfg->n_tiers; i++)
        (void)kvp__rt_medium_add(r, cfg->tiers[i].medium, cfg->tiers[i].weight);
    const char *dm = cfg->default_medium ? cfg->default_medium : "GPU";
    r->default_medium = kvp__rt_medium_find(r, dm);
    if (r->default_medium == KVP__RT_NIL) {
        if (r->n_media >= KVP_ROUTER_MAX_MEDIA)
            return KVP_EINVAL;
        r->default_medium = kvp__rt_medium_add(r, dm, cfg->unknown_weight);
    }
    r->unknown_weight = cfg->unknown_weight;
    r->kv_group = cfg->kv_group;
    int rc = kvp__rt_hash_copy(&r->mem, &cfg->hash, &r->default_hash, &r->default_vllm_seed,
                               &r->default_vllm_seed_len);
    if (rc != KVP_OK)
        return rc;
    kvp_hasher *probe = NULL; /* refuse a default the hasher refuses, now, not at an event */
    rc = kvp_hasher_new(&r->default_hash, &probe);
    kvp_hasher_free(probe);
    return rc;
}

KVP_EXPORT void kvp_router_free(kvp_router *r)
{
    if (!r)
        return;
    kvp__rr_free(r->rr);
    kvp__rt_workers_destroy(r);
    kvp__rt_table_destroy(&r->table);
    kvp__rt_free(&r->mem, r->default_vllm_seed, r->default_vllm_seed_len);
    pthread_rwlock_destroy(&r->lock);
    kvp__rt_mem mem = r->mem;
    kvp__rt_free(&mem, r, sizeof *r);
}

/* The lock, writer-preferring. KVP_OK or KVP_ENOMEM. */
static int lock_init(kvp_router *r)
{
    pthread_rwlockattr_t attr;
    if (pthread_rwlockattr_init(&attr) != 0)
        return KVP_ENOMEM;
#if defined(__GLIBC__)
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int err = pthread_rwlock_init(&r->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    return err == 0 ? KVP_OK : KVP_ENOMEM;
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
    kvp__rt_mem mem;
    kvp__rt_mem_init(&mem, &cfg->alloc);
    kvp_router *r = kvp__rt_alloc(&mem, sizeof *r);
    if (!r)
        return KVP_ENOMEM;
    memset(r, 0, sizeof *r);
    r->mem = mem;
    if (lock_init(r) != KVP_OK) {
        kvp__rt_free(&mem, r, sizeof *r);
        return KVP_ENOMEM;
    }
    atomic_init(&r->n_scores, 0);
    kvp__rt_table_init(&r->table, &r->mem, seed);
    r->default_group = KVP__RT_NIL;
    rc = router_setup(r, cfg);
    if (rc == KVP_OK && cfg->redis.url)
        rc = kvp__rr_new(r, &cfg->redis);
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
    kvp__rt_wrlock(r);
    int rc = kvp__rt_worker_add_locked(r, wc, id);
    kvp__rt_unlock(r);
    return rc;
}

KVP_EXPORT int kvp_router_worker_find(kvp_router *r, const char *engine_id, int64_t dp_rank,
                                      uint32_t *id)
{
    if (!r || !engine_id || !id)
        return KVP_EINVAL;
    kvp__rt_rdlock(r);
    int rc = kvp__rt_worker_find_locked(r, engine_id, dp_rank, id);
    kvp__rt_unlock(r);
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
    kvp__rt_wrlock(r);
    wc.hash = r->default_hash;
    int rc = kvp__rt_worker_find_locked(r, engine_id, dp_rank, id);
    if (rc == KVP_ENOENT)
        rc = kvp__rt_worker_add_locked(r, &wc, id);
    kvp__rt_unlock(r);
    return rc;
}

KVP_EXPORT int kvp_router_worker_remove(kvp_router *r, uint32_t id)
{
    if (!r)
        return KVP_EINVAL;
    if (r->rr)
        return kvp__rr_worker_op(r, id, KVP__RR_REMOVE);
    kvp__rt_wrlock(r);
    int rc = kvp__rt_worker_remove_locked(r, id);
    kvp__rt_unlock(r);
    return rc;
}

/* ---------------------------------------------------------------- events */

int kvp__rt_apply_one_locked(kvp_router *r, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                             kvp_router_apply_result *res)
{
    memset(res, 0, sizeof *res);
    res->bad_event = SIZE_MAX;
    if (!b) {
        res->why = "NULL batch";
        return KVP_EINVAL;
    }
    return kvp__rt_worker_ok(r, id) ? kvp__rt_apply_locked(r, id, seq, b, res) : KVP_ENOENT;
}

KVP_EXPORT int kvp_router_apply(kvp_router *r, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                                kvp_router_apply_result *res)
{
    kvp_router_apply_result local;
    if (!res)
        res = &local;
    if (!r) {
        memset(res, 0, sizeof *res);
        res->bad_event = SIZE_MAX;
        res->why = "NULL router";
        return KVP_EINVAL;
    }
    if (r->rr) {
        kvp_router_item it = {.worker = id, .seq = seq, .batch = b};
        int rc = kvp__rr_apply(r, &it, 1);
        *res = it.res;
        return rc;
    }
    kvp__rt_wrlock(r);
    int rc = kvp__rt_apply_one_locked(r, id, seq, b, res);
    kvp__rt_unlock(r);
    return rc;
}

KVP_EXPORT int kvp_router_apply_many(kvp_router *r, kvp_router_item *items, size_t n)
{
    if (!r || (!items && n > 0))
        return KVP_EINVAL;
    if (r->rr)
        return kvp__rr_apply(r, items, n);
    int first = KVP_OK;
    kvp__rt_wrlock(r);
    for (size_t i = 0; i < n; i++) {
        kvp_router_item *it = &items[i];
        it->rc = kvp__rt_apply_one_locked(r, it->worker, it->seq, it->batch, &it->res);
        if (first == KVP_OK)
            first = it->rc;
    }
    kvp__rt_unlock(r);
    return first;
}

void kvp__rt_mark_stale_locked(kvp_router *r, uint32_t id)
{
    kvp__rt_worker_clear(r, id);
    r->workers[id].stale = true;
    r->workers[id].partial = true;
    r->workers[id].seq_known = false;
}

KVP_EXPORT int kvp_router_mark_stale(kvp_router *r, uint32_t id)
{
    if (!r)
        return KVP_EINVAL;
    if (r->rr)
        return kvp__rr_worker_op(r, id, KVP__RR_MARK_STALE);
    kvp__rt_wrlock(r);
    int rc = KVP_ENOENT;
    if (kvp__rt_worker_ok(r, id)) {
        kvp__rt_mark_stale_locked(r, id);
        rc = KVP_OK;
    }
    kvp__rt_unlock(r);
    return rc;
}

KVP_EXPORT int kvp_router_resync(kvp_router *r, uint32_t id)
{
    if (!r)
        return KVP_EINVAL;
    if (r->rr)
        return kvp__rr_worker_op(r, id, KVP__RR_RESYNC);
    kvp__rt_wrlock(r);
    int rc = KVP_ENOENT;
    if (kvp__rt_worker_ok(r, id)) {
        r->workers[id].stale = false;
        rc = KVP_OK;
    }
    kvp__rt_unlock(r);
    return rc;
}

/* ---------------------------------------------------------------- scores */

static bool field_ok(kvp_field f)
{
    return f.ptr || f.len == 0;
}

KVP_EXPORT int kvp_router_score(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens,
                                size_t n_tokens, kvp_router_row *rows, size_t cap, size_t *n_rows)
{
    if (!r || !ns || !n_rows || (!tokens && n_tokens > 0) || (!rows && cap > 0))
        return KVP_EINVAL;
    if (!field_ok(ns->model) || !field_ok(ns->adapter) || !field_ok(ns->tenant) ||
        !field_ok(ns->salt))
        return KVP_EINVAL;
    if (r->rr)
        return kvp__rr_score(r, ns, tokens, n_tokens, NULL, 0, rows, cap, n_rows);
    return kvp__rt_score(r, ns, tokens, n_tokens, rows, cap, n_rows);
}

KVP_EXPORT int kvp_router_score_hashes(kvp_router *r, const uint64_t *hashes, size_t n_hashes,
                                       kvp_router_row *rows, size_t cap, size_t *n_rows)
{
    if (!r || !n_rows || (!hashes && n_hashes > 0) || (!rows && cap > 0))
        return KVP_EINVAL;
    if (r->rr)
        return kvp__rr_score(r, NULL, NULL, 0, hashes, n_hashes, rows, cap, n_rows);
    return kvp__rt_score_hashes(r, hashes, n_hashes, rows, cap, n_rows);
}

/* ---------------------------------------------------------------- statistics */

KVP_EXPORT int kvp_router_stats_get(kvp_router *r, kvp_router_stats *out)
{
    if (!r || !out)
        return KVP_EINVAL;
    kvp_router_stats st;
    memset(&st, 0, sizeof st);
    kvp__rt_rdlock(r);
    st.n_workers = r->n_workers;
    for (uint32_t i = 0; i < r->n_slots; i++)
        st.n_stale += r->workers[i].live && r->workers[i].stale;
    st.n_groups = r->n_groups;
    st.n_media = r->n_media;
    st.n_blocks = r->table.n_entries;
    st.n_holders = r->table.n_holders;
    st.n_holder_media = r->table.n_holder_media;
    st.n_slots = r->table.cap;
    st.index_bytes = kvp__rt_table_bytes(&r->table);
    st.total_bytes = r->mem.live_bytes;
    st.bytes_per_holder = st.n_holders ? (double)st.total_bytes / (double)st.n_holders : 0;
    st.n_batches = r->n_batches;
    st.n_events_stored = r->n_events_stored;
    st.n_events_removed = r->n_events_removed;
    st.n_events_cleared = r->n_events_cleared;
    st.n_events_skipped = r->n_events_skipped;
    st.n_duplicates = r->n_duplicates;
    st.n_gaps = r->n_gaps;
    st.n_restarts = r->n_restarts;
    st.n_malformed = r->n_malformed;
    kvp__rt_unlock(r);
    st.n_scores = atomic_load_explicit(&r->n_scores, memory_order_relaxed);
    if (r->rr)
        kvp__rr_stats(r->rr, &st);
    *out = st;
    return KVP_OK;
}

KVP_EXPORT int kvp_router_worker_stats_get(kvp_router *r, uint32_t id, kvp_router_worker_stats *out)
{
    if (!r || !out)
        return KVP_EINVAL;
    kvp__rt_rdlock(r);
    int rc = KVP_ENOENT;
    if (kvp__rt_worker_ok(r, id)) {
        const kvp__rt_worker *w = &r->workers[id];
        kvp_router_worker_stats ws = {
            .dp_rank = w->dp_rank,
            .group = w->group,
            .stale = w->stale,
            .seq_known = w->seq_known,
            .expected = w->expected,
            .n_blocks = w->n_blocks,
            .n_batches = w->n_batches,
            .n_gaps = w->n_gaps,
            .n_restarts = w->n_restarts,
            .n_malformed = w->n_malformed,
        };
        *out = ws;
        rc = KVP_OK;
    }
    kvp__rt_unlock(r);
    return rc;
}

/* ---------------------------------------------------------------- checker */

/* Workers, rows, groups and media. KVP_OK or KVP_ECORRUPT. */
static int check_workers_locked(const kvp_router *r, bool *live)
{
    if (r->n_slots > r->cap_workers || r->n_groups > KVP_ROUTER_MAX_GROUPS ||
        r->n_media > KVP_ROUTER_MAX_MEDIA || r->default_medium >= r->n_media)
        return KVP_ECORRUPT;
    uint32_t n_live = 0;
    for (uint32_t i = 0; i < r->n_slots; i++) {
        const kvp__rt_worker *w = &r->workers[i];
        live[i] = w->live;
        if (!w->live) {
            if (w->engine_id || w->n_blocks != 0)
                return KVP_ECORRUPT;
            continue;
        }
        if (!w->engine_id || strlen(w->engine_id) != w->engine_len || w->group >= r->n_groups ||
            w->row != n_live)
            return KVP_ECORRUPT;
        for (uint32_t j = 0; j < i; j++) {
            const kvp__rt_worker *o = &r->workers[j];
            if (o->live && o->dp_rank == w->dp_rank && strcmp(o->engine_id, w->engine_id) == 0)
                return KVP_ECORRUPT;
        }
        n_live++;
    }
    if (n_live != r->n_workers)
        return KVP_ECORRUPT;
    for (uint32_t g = 0; g < r->n_groups; g++) {
        if (!r->groups[g] || !r->groups[g]->hasher || r->groups[g]->hash.block_size == 0)
            return KVP_ECORRUPT;
    }
    for (uint32_t m = 1; m < (1u << KVP__RT_MEDIA_BITS); m++) {
        double best = 0;
        for (uint32_t b = 0; b < r->n_media; b++) {
            if ((m >> b & 1u) && r->media[b].weight > best)
                best = r->media[b].weight;
        }
        if (r->weight_of_mask[m] != best)
            return KVP_ECORRUPT;
    }
    return KVP_OK;
}

KVP_EXPORT int kvp_router_check(kvp_router *r)
{
    if (!r)
        return KVP_EINVAL;
    kvp__rt_rdlock(r);
    uint32_t n = r->n_slots;
    uint64_t *counts = calloc((size_t)n + 1, sizeof *counts);
    bool *live = calloc((size_t)n + 1, sizeof *live);
    int rc = counts && live ? check_workers_locked(r, live) : KVP_ENOMEM;
    uint32_t media_ok = (1u << r->n_media) - 1;
    if (rc == KVP_OK)
        rc = kvp__rt_table_check(&r->table, counts, live, n, media_ok);
    for (uint32_t i = 0; rc == KVP_OK && i < n; i++) {
        if (live[i] && counts[i] != r->workers[i].n_blocks)
            rc = KVP_ECORRUPT;
    }
    kvp__rt_unlock(r);
    free(counts);
    free(live);
    return rc;
}
