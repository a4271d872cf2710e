/*
 * router_local.c - the local store: kvp_router's operations (router_store.h) on the
 * in-memory index alone. Each operation is the index lock, taken the way router_store.h
 * says, around one _locked body of router_workers.c, router_apply.c or router_score.c,
 * and nothing else: the in-memory router pays one indirect call per public call for the
 * interface, and its score p50 is the same as before the interface (docs/routing.md,
 * "Source files").
 */
#include "router_local.h"

static int local_apply(kvp__rt_store *s, kvp_router_item *items, size_t n)
{
    kvp__rt_index *ix = s->ix;
    int first = KVP_OK;
    kvp__rt_wrlock(&ix->lock);
    for (size_t i = 0; i < n; i++) {
        kvp_router_item *it = &items[i];
        it->rc = kvp__rt_apply_one_locked(ix, it->worker, it->seq, it->batch, &it->res);
        if (first == KVP_OK)
            first = it->rc;
    }
    kvp__rt_unlock(&ix->lock);
    return first;
}

static int local_score(kvp__rt_store *s, const kvp__rt_query *q, size_t *n_rows, int *view)
{
    *view = KVP_ROUTER_VIEW_LOCAL;
    return kvp__rt_score(s->ix, q, n_rows);
}

int kvp__rt_local_worker_add(kvp__rt_store *s, const kvp_router_worker_config *wc, bool get,
                             uint32_t *id)
{
    kvp__rt_index *ix = s->ix;
    kvp__rt_wrlock(&ix->lock);
    int rc = get ? kvp__rt_worker_get_locked(ix, wc->engine_id, wc->dp_rank, id)
                 : kvp__rt_worker_add_locked(ix, wc, id);
    kvp__rt_unlock(&ix->lock);
    return rc;
}

static int local_worker_remove(kvp__rt_store *s, uint32_t id)
{
    kvp__rt_wrlock(&s->ix->lock);
    int rc = kvp__rt_worker_remove_locked(s->ix, id);
    kvp__rt_unlock(&s->ix->lock);
    return rc;
}

static int local_mark_stale(kvp__rt_store *s, uint32_t id)
{
    kvp__rt_wrlock(&s->ix->lock);
    int rc = KVP_ENOENT;
    if (kvp__rt_worker_ok(s->ix, id)) {
        kvp__rt_mark_stale_locked(s->ix, id);
        rc = KVP_OK;
    }
    kvp__rt_unlock(&s->ix->lock);
    return rc;
}

static int local_resync(kvp__rt_store *s, uint32_t id)
{
    kvp__rt_wrlock(&s->ix->lock);
    int rc = kvp__rt_resync_locked(s->ix, id);
    kvp__rt_unlock(&s->ix->lock);
    return rc;
}

static void local_stats(kvp__rt_store *s, kvp_router_stats *st)
{
    (void)s;
    (void)st; /* no store fields: redis false, its counters 0 */
}

int kvp__rt_local_check(kvp__rt_store *s)
{
    kvp__rt_rdlock(&s->ix->lock);
    int rc = kvp__rt_index_check_locked(s->ix);
    kvp__rt_unlock(&s->ix->lock);
    return rc;
}

static void local_free(kvp__rt_store *s)
{
    kvp__rt_free(&s->ix->mem, s, sizeof *s);
}

static const kvp__rt_store_ops local_ops = {
    .name = "local",
    .apply = local_apply,
    .score = local_score,
    .worker_add = kvp__rt_local_worker_add,
    .worker_remove = local_worker_remove,
    .mark_stale = local_mark_stale,
    .resync = local_resync,
    .stats = local_stats,
    .check = kvp__rt_local_check,
    .free = local_free,
};

int kvp__rt_local_new(kvp__rt_index *ix, kvp__rt_store **out)
{
    kvp__rt_store *s = kvp__rt_alloc(&ix->mem, sizeof *s);
    if (!s)
        return KVP_ENOMEM;
    s->ops = &local_ops;
    s->ix = ix;
    *out = s;
    return KVP_OK;
}
