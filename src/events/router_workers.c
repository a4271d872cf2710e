/*
 * router_workers.c - the router's workers, hash groups and storage tiers.
 *
 *   workers[0 .. n_slots)   one slot per worker ever added; a removed worker's slot is
 *                           free (live == false) and given to the next worker added. The
 *                           slot number is the worker id and the 15-bit worker field of
 *                           the table's holders.
 *   groups[0 .. n_groups)   one kvp_hasher per distinct (hash fields, model). Never freed
 *                           before the router, and immutable once published, so score can
 *                           hash a prompt with them outside the lock.
 *   media[0 .. n_media)     tier names (matched ignoring ASCII case) and weights, with the
 *                           best weight of every media mask precomputed for score.
 *
 * Invariants (router.c's checker): n_workers live slots, each with an engine id, a group
 * below n_groups and row = its rank among live slots; free slots hold no engine id and no
 * block; (engine id, dp rank) unique among live workers.
 *
 * Cost: finding a worker by name is a linear scan (O(workers), at setup; the hot calls take
 * the id). Adding or removing a worker renumbers the rows (O(slots)); removal also scans
 * the table (O(slots of the table)).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "router.h"

/* kvp_hasher_new allocates through these, so the router's live-byte count includes its
 * hashers. */
static void *hook_alloc(void *ud, size_t size)
{
    return kvp__rt_alloc(ud, size);
}

static void hook_free(void *ud, void *ptr, size_t size)
{
    kvp__rt_free(ud, ptr, size);
}

/* ---------------------------------------------------------------- strings */

/* An owned copy of s (n bytes plus a NUL), or NULL. */
static char *copy_str(kvp__rt_mem *mem, const char *s, size_t n)
{
    char *c = kvp__rt_alloc(mem, n + 1);
    if (c) {
        memcpy(c, s, n);
        c[n] = '\0';
    }
    return c;
}

int kvp__rt_hash_copy(kvp__rt_mem *mem, const kvp_config *src, kvp_config *dst, char **seed_copy,
                      size_t *seed_len)
{
    *dst = *src;
    *seed_copy = NULL;
    *seed_len = 0;
    if (src->vllm_seed) {
        size_t n = strlen(src->vllm_seed);
        *seed_copy = copy_str(mem, src->vllm_seed, n);
        if (!*seed_copy)
            return KVP_ENOMEM;
        *seed_len = n + 1;
    }
    dst->vllm_seed = *seed_copy;
    dst->alloc.alloc = hook_alloc;
    dst->alloc.free = hook_free;
    dst->alloc.ud = mem;
    dst->on_event = NULL;
    dst->event_ud = NULL;
    return KVP_OK;
}

/* ---------------------------------------------------------------- hash groups */

static const char *seed_or_default(const char *s)
{
    return s ? s : KVP_VLLM_SEED_DEFAULT;
}

static bool hash_equal(const kvp_config *a, const kvp_config *b)
{
    return a->hash_profile == b->hash_profile && a->seed == b->seed &&
           a->block_size == b->block_size && a->vocab_size == b->vocab_size &&
           a->hash_key_len == b->hash_key_len &&
           memcmp(a->hash_key, b->hash_key,
                  a->hash_key_len <= KVP_HASH_KEY_MAX ? a->hash_key_len : KVP_HASH_KEY_MAX) == 0 &&
           strcmp(seed_or_default(a->vllm_seed), seed_or_default(b->vllm_seed)) == 0;
}

static bool model_equal(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static void group_free(kvp__rt_mem *mem, kvp__rt_group *g)
{
    if (!g)
        return;
    kvp_hasher_free(g->hasher);
    kvp__rt_free(mem, g->vllm_seed_copy, g->vllm_seed_len);
    kvp__rt_free(mem, g->model, g->model ? g->model_len + 1 : 0);
    kvp__rt_free(mem, g, sizeof *g);
}

/* A new, unpublished group for (hash, model): KVP_OK, KVP_EINVAL (kvp_hasher_new refuses
 * the fields), KVP_ENOMEM, KVP_ENOTSUP. */
static int group_new(kvp_router *r, const kvp_config *hash, const char *model, kvp__rt_group **out)
{
    kvp__rt_group *g = kvp__rt_alloc(&r->mem, sizeof *g);
    if (!g)
        return KVP_ENOMEM;
    memset(g, 0, sizeof *g);
    int rc = kvp__rt_hash_copy(&r->mem, hash, &g->hash, &g->vllm_seed_copy, &g->vllm_seed_len);
    if (rc == KVP_OK && model) {
        g->model_len = strlen(model);
        g->model = copy_str(&r->mem, model, g->model_len);
        rc = g->model ? KVP_OK : KVP_ENOMEM;
    }
    if (rc == KVP_OK)
        rc = kvp_hasher_new(&g->hash, &g->hasher);
    if (rc != KVP_OK) {
        group_free(&r->mem, g);
        return rc;
    }
    g->is_vllm =
        hash->hash_profile == KVP_HASH_VLLM_SHA256 || hash->hash_profile == KVP_HASH_VLLM_XXHASH;
    *out = g;
    return KVP_OK;
}

/* The index of the group for (hash, model), or n_groups when none matches. */
static uint32_t group_find(const kvp_router *r, const kvp_config *hash, const char *model)
{
    uint32_t i = 0;
    while (i < r->n_groups &&
           !(hash_equal(&r->groups[i]->hash, hash) && model_equal(r->groups[i]->model, model)))
        i++;
    return i;
}

/* ---------------------------------------------------------------- workers */

int kvp__rt_worker_find_locked(const kvp_router *r, const char *engine_id, int64_t dp_rank,
                               uint32_t *id)
{
    size_t n = strlen(engine_id);
    for (uint32_t i = 0; i < r->n_slots; i++) {
        const kvp__rt_worker *w = &r->workers[i];
        if (w->live && w->dp_rank == dp_rank && w->engine_len == n &&
            memcmp(w->engine_id, engine_id, n) == 0) {
            *id = i;
            return KVP_OK;
        }
    }
    return KVP_ENOENT;
}

/* Number the live workers 0, 1, ... in slot order (score rows). Cannot fail. */
static void renumber_rows(kvp_router *r)
{
    uint32_t row = 0;
    for (uint32_t i = 0; i < r->n_slots; i++) {
        if (r->workers[i].live)
            r->workers[i].row = row++;
    }
    assert(row == r->n_workers);
}

/* A free slot: the first removed one, else a new one (growing the array). KVP_OK or
 * KVP_ENOMEM (array unchanged); KVP_ENOSPC at KVP_ROUTER_MAX_WORKERS. */
static int slot_take(kvp_router *r, uint32_t *slot)
{
    for (uint32_t i = 0; i < r->n_slots; i++) {
        if (!r->workers[i].live) {
            *slot = i;
            return KVP_OK;
        }
    }
    if (r->n_slots >= KVP_ROUTER_MAX_WORKERS)
        return KVP_ENOSPC;
    if (r->n_slots == r->cap_workers) {
        uint32_t cap = r->cap_workers ? r->cap_workers * 2 : 16;
        if (cap > KVP_ROUTER_MAX_WORKERS)
            cap = KVP_ROUTER_MAX_WORKERS;
        kvp__rt_worker *w = kvp__rt_alloc(&r->mem, (size_t)cap * sizeof *w);
        if (!w)
            return KVP_ENOMEM;
        memset(w, 0, (size_t)cap * sizeof *w);
        if (r->workers)
            memcpy(w, r->workers, (size_t)r->n_slots * sizeof *w);
        kvp__rt_free(&r->mem, r->workers, (size_t)r->cap_workers * sizeof *w);
        r->workers = w;
        r->cap_workers = cap;
    }
    *slot = r->n_slots;
    return KVP_OK;
}

/* Validate a worker config. KVP_OK or KVP_EINVAL. */
static int worker_config_ok(const kvp_router_worker_config *wc)
{
    if (!wc || !wc->engine_id)
        return KVP_EINVAL;
    int p = wc->hash.hash_profile;
    if ((p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH) && wc->hash.hash_key_len == 0)
        return KVP_EINVAL; /* a random key would equal no engine's */
    return KVP_OK;
}

int kvp__rt_worker_add_locked(kvp_router *r, const kvp_router_worker_config *wc, uint32_t *id)
{
    int rc = worker_config_ok(wc);
    if (rc != KVP_OK)
        return rc;
    if (kvp__rt_worker_find_locked(r, wc->engine_id, wc->dp_rank, id) == KVP_OK)
        return KVP_EEXIST;
    if (r->n_workers >= KVP_ROUTER_MAX_WORKERS)
        return KVP_ENOSPC;
    uint32_t g = group_find(r, &wc->hash, wc->model);
    kvp__rt_group *fresh = NULL;
    if (g == r->n_groups) {
        if (r->n_groups >= KVP_ROUTER_MAX_GROUPS)
            return KVP_ENOSPC;
        rc = group_new(r, &wc->hash, wc->model, &fresh);
        if (rc != KVP_OK)
            return rc;
    }
    size_t n = strlen(wc->engine_id);
    char *name = copy_str(&r->mem, wc->engine_id, n);
    uint32_t slot = 0;
    rc = name ? slot_take(r, &slot) : KVP_ENOMEM;
    if (rc != KVP_OK) {
        kvp__rt_free(&r->mem, name, name ? n + 1 : 0);
        group_free(&r->mem, fresh);
        return rc;
    }
    if (fresh)
        r->groups[r->n_groups++] = fresh;
    kvp__rt_worker *w = &r->workers[slot];
    memset(w, 0, sizeof *w);
    w->engine_id = name;
    w->engine_len = n;
    w->dp_rank = wc->dp_rank;
    w->group = g;
    w->live = true;
    w->seq_known = true; /* a new worker expects batch 0 */
    if (slot == r->n_slots)
        r->n_slots++;
    r->n_workers++;
    r->epoch++;
    renumber_rows(r);
    *id = slot;
    return KVP_OK;
}

void kvp__rt_worker_clear(kvp_router *r, uint32_t id)
{
    kvp__rt_worker *w = &r->workers[id];
    uint64_t n = kvp__rt_clear_worker(&r->table, id);
    assert(n == w->n_blocks);
    (void)n;
    w->n_blocks = 0;
}

int kvp__rt_worker_remove_locked(kvp_router *r, uint32_t id)
{
    if (!kvp__rt_worker_ok(r, id))
        return KVP_ENOENT;
    kvp__rt_worker_clear(r, id);
    kvp__rt_worker *w = &r->workers[id];
    kvp__rt_free(&r->mem, w->engine_id, w->engine_len + 1);
    memset(w, 0, sizeof *w);
    r->n_workers--;
    r->epoch++;
    renumber_rows(r);
    return KVP_OK;
}

void kvp__rt_workers_destroy(kvp_router *r)
{
    for (uint32_t i = 0; i < r->n_slots; i++) {
        kvp__rt_worker *w = &r->workers[i];
        if (w->live)
            kvp__rt_free(&r->mem, w->engine_id, w->engine_len + 1);
    }
    kvp__rt_free(&r->mem, r->workers, (size_t)r->cap_workers * sizeof *r->workers);
    r->workers = NULL;
    for (uint32_t g = 0; g < r->n_groups; g++)
        group_free(&r->mem, r->groups[g]);
    r->n_groups = 0;
}

/* ---------------------------------------------------------------- media */

uint32_t kvp__rt_medium_find(const kvp_router *r, const char *name)
{
    for (uint32_t i = 0; i < r->n_media; i++) {
        if (strcasecmp(r->media[i].name, name) == 0)
            return i;
    }
    return KVP__RT_NIL;
}

uint32_t kvp__rt_medium_add(kvp_router *r, const char *name, double weight)
{
    assert(r->n_media < KVP_ROUTER_MAX_MEDIA && strlen(name) <= KVP_ROUTER_MEDIUM_MAX);
    assert(kvp__rt_medium_find(r, name) == KVP__RT_NIL);
    uint32_t i = r->n_media++;
    snprintf(r->media[i].name, sizeof r->media[i].name, "%s", name);
    r->media[i].weight = weight;
    for (uint32_t m = 0; m < (1u << KVP__RT_MEDIA_BITS); m++) {
        double best = 0;
        for (uint32_t b = 0; b < r->n_media; b++) {
            if ((m >> b & 1u) && r->media[b].weight > best)
                best = r->media[b].weight;
        }
        r->weight_of_mask[m] = best;
    }
    return i;
}
