/*
 * router_workers.c - the router's in-memory index (router_workers.h): its lifecycle, its
 * workers, their hash groups and interned names, the storage tiers, its statistics and its
 * invariant checker. Calls only router_table.c and router_base.c.
 *
 *   workers[0 .. n_slots)   one slot per worker ever added; a removed worker's slot is
 *                           free (live == false) and given to the next worker added. The
 *                           slot number is the worker id and the 15-bit worker field of
 *                           the table's holders.
 *   names[0 .. n_names)     every distinct engine id ever added, interned: a worker's
 *                           engine_id points here. A name is never freed before the index,
 *                           so a score row's engine id (kvp_router_score_result.engine_ids)
 *                           stays valid after its worker is removed by another thread; a
 *                           worker added again under a name seen before takes the same copy.
 *   groups[0 .. n_groups)   one kvp_hasher per distinct (hash fields, model). Never freed
 *                           before the index, and immutable once published, so score can
 *                           hash a prompt with them outside the lock.
 *   media[0 .. n_media)     tier names (matched ignoring ASCII case) and weights, with the
 *                           best weight of every media mask precomputed for score.
 *
 * Invariants (kvp__rt_index_check_locked): n_workers live slots, each with an engine id
 * among names[], a group below n_groups and row = its rank among live slots; free slots
 * hold no engine id and no block; (engine id, dp rank) unique among live workers; names
 * distinct; weight_of_mask[] the best weight of each mask; the table's own invariants and
 * each worker's block count. Token mode: each worker's maps against the table (every entry
 * names an own key the worker holds, in at least its media, exactly them when no other
 * entry names it; refs counts the entries of shared own keys; the block count is the
 * number of distinct own keys); engine-hash mode: no map.
 *
 * Cost: finding a worker by name is a linear scan (O(workers), at setup; the hot calls take
 * the id), and interning one O(names). Adding or removing a worker renumbers the rows
 * (O(slots)); removal also scans the table (O(slots of the table)). Names of removed
 * workers stay: a fleet that cycles through N distinct engine ids holds N names (about
 * 50 bytes each for pod names, counted in total_bytes) until kvp_router_free.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "router_workers.h"

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
static int group_new(kvp__rt_index *ix, const kvp_config *hash, const char *model,
                     kvp__rt_group **out)
{
    kvp__rt_group *g = kvp__rt_alloc(&ix->mem, sizeof *g);
    if (!g)
        return KVP_ENOMEM;
    memset(g, 0, sizeof *g);
    int rc = kvp__rt_hash_copy(&ix->mem, hash, &g->hash, &g->vllm_seed_copy, &g->vllm_seed_len);
    if (rc == KVP_OK && model) {
        g->model_len = strlen(model);
        g->model = copy_str(&ix->mem, model, g->model_len);
        rc = g->model ? KVP_OK : KVP_ENOMEM;
    }
    if (rc == KVP_OK)
        rc = kvp_hasher_new(&g->hash, &g->hasher);
    if (rc != KVP_OK) {
        group_free(&ix->mem, g);
        return rc;
    }
    g->is_vllm =
        hash->hash_profile == KVP_HASH_VLLM_SHA256 || hash->hash_profile == KVP_HASH_VLLM_XXHASH;
    g->own = ix->by_tokens;
    *out = g;
    return KVP_OK;
}

/* The index of the group for (hash, model), or n_groups when none matches. */
static uint32_t group_find(const kvp__rt_index *ix, const kvp_config *hash, const char *model)
{
    uint32_t i = 0;
    while (i < ix->n_groups &&
           !(hash_equal(&ix->groups[i]->hash, hash) && model_equal(ix->groups[i]->model, model)))
        i++;
    return i;
}

/* ---------------------------------------------------------------- workers */

int kvp__rt_worker_find_locked(const kvp__rt_index *ix, const char *engine_id, int64_t dp_rank,
                               uint32_t *id)
{
    size_t n = strlen(engine_id);
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        const kvp__rt_worker *w = &ix->workers[i];
        if (w->live && w->dp_rank == dp_rank && w->engine_len == n &&
            memcmp(w->engine_id, engine_id, n) == 0) {
            *id = i;
            return KVP_OK;
        }
    }
    return KVP_ENOENT;
}

/* The interned copy of engine id s (n bytes): an existing one, else a new one appended to
 * names[]. NULL when memory ran out (names unchanged). */
static const kvp__rt_name *name_intern(kvp__rt_index *ix, const char *s, size_t n)
{
    for (uint32_t i = 0; i < ix->n_names; i++) {
        if (ix->names[i].len == n && memcmp(ix->names[i].s, s, n) == 0)
            return &ix->names[i];
    }
    if (ix->n_names == ix->cap_names) {
        if (ix->cap_names > UINT32_MAX / 2)
            return NULL;
        uint32_t cap = ix->cap_names ? ix->cap_names * 2 : 16;
        kvp__rt_name *nn = kvp__rt_alloc(&ix->mem, (size_t)cap * sizeof *nn);
        if (!nn)
            return NULL;
        if (ix->names)
            memcpy(nn, ix->names, (size_t)ix->n_names * sizeof *nn);
        kvp__rt_free(&ix->mem, ix->names, (size_t)ix->cap_names * sizeof *nn);
        ix->names = nn;
        ix->cap_names = cap;
    }
    char *c = copy_str(&ix->mem, s, n);
    if (!c)
        return NULL;
    ix->names[ix->n_names] = (kvp__rt_name){c, n};
    return &ix->names[ix->n_names++];
}

/* Number the live workers 0, 1, ... in slot order (score rows). Cannot fail. */
static void renumber_rows(kvp__rt_index *ix)
{
    uint32_t row = 0;
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        if (ix->workers[i].live)
            ix->workers[i].row = row++;
    }
    assert(row == ix->n_workers);
}

/* A free slot: the first removed one, else a new one (growing the array). KVP_OK or
 * KVP_ENOMEM (array unchanged); KVP_ENOSPC at KVP_ROUTER_MAX_WORKERS. */
static int slot_take(kvp__rt_index *ix, uint32_t *slot)
{
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        if (!ix->workers[i].live) {
            *slot = i;
            return KVP_OK;
        }
    }
    if (ix->n_slots >= KVP_ROUTER_MAX_WORKERS)
        return KVP_ENOSPC;
    if (ix->n_slots == ix->cap_workers) {
        uint32_t cap = ix->cap_workers ? ix->cap_workers * 2 : 16;
        if (cap > KVP_ROUTER_MAX_WORKERS)
            cap = KVP_ROUTER_MAX_WORKERS;
        kvp__rt_worker *w = kvp__rt_alloc(&ix->mem, (size_t)cap * sizeof *w);
        if (!w)
            return KVP_ENOMEM;
        memset(w, 0, (size_t)cap * sizeof *w);
        if (ix->workers)
            memcpy(w, ix->workers, (size_t)ix->n_slots * sizeof *w);
        kvp__rt_free(&ix->mem, ix->workers, (size_t)ix->cap_workers * sizeof *w);
        ix->workers = w;
        ix->cap_workers = cap;
    }
    *slot = ix->n_slots;
    return KVP_OK;
}

/* Validate a worker config. KVP_OK or KVP_EINVAL. */
static int worker_config_ok(const kvp__rt_index *ix, const kvp_router_worker_config *wc)
{
    if (!wc || !wc->engine_id)
        return KVP_EINVAL;
    if (ix->by_tokens)
        return KVP_OK; /* the engine's key is not needed: the router's keys are its own */
    int p = wc->hash.hash_profile;
    if ((p == KVP_HASH_KEYED || p == KVP_HASH_SIPHASH) && wc->hash.hash_key_len == 0)
        return KVP_EINVAL; /* a random key would equal no engine's */
    return KVP_OK;
}

int kvp__rt_worker_add_locked(kvp__rt_index *ix, const kvp_router_worker_config *wc, uint32_t *id)
{
    int rc = worker_config_ok(ix, wc);
    if (rc != KVP_OK)
        return rc;
    if (kvp__rt_worker_find_locked(ix, wc->engine_id, wc->dp_rank, id) == KVP_OK)
        return KVP_EEXIST;
    if (ix->n_workers >= KVP_ROUTER_MAX_WORKERS)
        return KVP_ENOSPC;
    /* Token mode: every worker keys by the router's own function, at its block size. */
    kvp_config hash = wc->hash;
    if (ix->by_tokens) {
        hash = ix->token_hash;
        hash.block_size = wc->hash.block_size;
        hash.vocab_size = wc->hash.vocab_size;
    }
    uint32_t g = group_find(ix, &hash, wc->model);
    kvp__rt_group *fresh = NULL;
    if (g == ix->n_groups) {
        if (ix->n_groups >= KVP_ROUTER_MAX_GROUPS)
            return KVP_ENOSPC;
        rc = group_new(ix, &hash, wc->model, &fresh);
        if (rc != KVP_OK)
            return rc;
    }
    uint32_t slot = 0;
    rc = slot_take(ix, &slot); /* may grow the slot array: no contents change */
    const kvp__rt_name *name = NULL;
    if (rc == KVP_OK)
        name = name_intern(ix, wc->engine_id, strlen(wc->engine_id));
    if (rc == KVP_OK && !name)
        rc = KVP_ENOMEM;
    if (rc != KVP_OK) {
        group_free(&ix->mem, fresh);
        return rc;
    }
    if (fresh)
        ix->groups[ix->n_groups++] = fresh;
    kvp__rt_worker *w = &ix->workers[slot];
    memset(w, 0, sizeof *w);
    w->engine_id = name->s;
    w->engine_len = name->len;
    w->dp_rank = wc->dp_rank;
    w->group = g;
    w->live = true;
    w->seq_known = true;                                  /* a new worker expects batch 0 */
    w->tmap.seed = ix->table.seed ^ UINT64_C(0x746d6170); /* "tmap" */
    w->refs.seed = ix->table.seed ^ UINT64_C(0x72656673); /* "refs" */
    if (slot == ix->n_slots)
        ix->n_slots++;
    ix->n_workers++;
    ix->epoch++;
    renumber_rows(ix);
    *id = slot;
    return KVP_OK;
}

/* Token mode: remove worker id from the own key of every entry of its map (O(entries),
 * not O(table slots) as kvp__rt_clear_worker), then empty the maps. Cannot fail. */
static void clear_by_map(kvp__rt_index *ix, uint32_t id)
{
    kvp__rt_worker *w = &ix->workers[id];
    uint64_t n = 0;
    for (uint32_t i = 0; i < w->tmap.cap; i++) {
        if (w->tmap.e[i].mask != 0)
            n +=
                kvp__rt_remove(&ix->table, w->tmap.e[i].own_lo, id, (1u << KVP__RT_MEDIA_BITS) - 1);
    }
    assert(n == w->n_blocks);
    (void)n;
    kvp__rt_tmap_reset(&w->tmap);
    kvp__rt_tmap_reset(&w->refs);
    w->n_blocks = 0;
}

void kvp__rt_worker_reset_locked(kvp__rt_index *ix, uint32_t id)
{
    kvp__rt_worker *w = &ix->workers[id];
    if (ix->by_tokens) {
        clear_by_map(ix, id);
        return;
    }
    uint64_t n = kvp__rt_clear_worker(&ix->table, id);
    assert(n == w->n_blocks);
    (void)n;
    w->n_blocks = 0;
}

void kvp__rt_worker_clear_locked(kvp__rt_index *ix, uint32_t id)
{
    kvp__rt_worker_reset_locked(ix, id);
    kvp__rt_tmap_clear(&ix->workers[id].tmap, &ix->mem);
    kvp__rt_tmap_clear(&ix->workers[id].refs, &ix->mem);
}

int kvp__rt_worker_remove_locked(kvp__rt_index *ix, uint32_t id)
{
    if (!kvp__rt_worker_ok(ix, id))
        return KVP_ENOENT;
    kvp__rt_worker_clear_locked(ix, id);
    kvp__rt_worker *w = &ix->workers[id];
    memset(w, 0, sizeof *w); /* its name stays in names[]: rows handed out may point at it */
    ix->n_workers--;
    ix->epoch++;
    renumber_rows(ix);
    return KVP_OK;
}

int kvp__rt_worker_get_locked(kvp__rt_index *ix, const char *engine_id, int64_t dp_rank,
                              uint32_t *id)
{
    int rc = kvp__rt_worker_find_locked(ix, engine_id, dp_rank, id);
    if (rc != KVP_ENOENT)
        return rc;
    kvp_router_worker_config wc;
    memset(&wc, 0, sizeof wc);
    wc.engine_id = engine_id;
    wc.dp_rank = dp_rank;
    wc.hash = ix->default_hash;
    return kvp__rt_worker_add_locked(ix, &wc, id);
}

void kvp__rt_mark_stale_locked(kvp__rt_index *ix, uint32_t id)
{
    kvp__rt_worker_clear_locked(ix, id);
    ix->workers[id].stale = true;
    ix->workers[id].partial = true;
    ix->workers[id].seq_known = false;
}

int kvp__rt_resync_locked(kvp__rt_index *ix, uint32_t id)
{
    if (!kvp__rt_worker_ok(ix, id))
        return KVP_ENOENT;
    ix->workers[id].stale = false;
    return KVP_OK;
}

/* ---------------------------------------------------------------- media */

uint32_t kvp__rt_medium_find(const kvp__rt_index *ix, const char *name)
{
    for (uint32_t i = 0; i < ix->n_media; i++) {
        if (strcasecmp(ix->media[i].name, name) == 0)
            return i;
    }
    return KVP__RT_NIL;
}

uint32_t kvp__rt_medium_add(kvp__rt_index *ix, const char *name, double weight)
{
    assert(ix->n_media < KVP_ROUTER_MAX_MEDIA && strlen(name) <= KVP_ROUTER_MEDIUM_MAX);
    assert(kvp__rt_medium_find(ix, name) == KVP__RT_NIL);
    uint32_t i = ix->n_media++;
    snprintf(ix->media[i].name, sizeof ix->media[i].name, "%s", name);
    ix->media[i].weight = weight;
    for (uint32_t m = 0; m < (1u << KVP__RT_MEDIA_BITS); m++) {
        double best = 0;
        for (uint32_t b = 0; b < ix->n_media; b++) {
            if ((m >> b & 1u) && ix->media[b].weight > best)
                best = ix->media[b].weight;
        }
        ix->weight_of_mask[m] = best;
    }
    return i;
}

/* ---------------------------------------------------------------- lifecycle */

int kvp__rt_index_init(kvp__rt_index *ix, const kvp__rt_mem *mem, const kvp_router_config *cfg,
                       uint64_t seed)
{
    memset(ix, 0, sizeof *ix);
    ix->mem = *mem;
    atomic_init(&ix->n_scores, 0);
    if (kvp__rt_lock_init(&ix->lock) != KVP_OK)
        return KVP_ENOMEM;
    kvp__rt_table_init(&ix->table, &ix->mem, seed);
    ix->default_group = KVP__RT_NIL;
    for (size_t i = 0; i < cfg->n_tiers; i++)
        (void)kvp__rt_medium_add(ix, cfg->tiers[i].medium, cfg->tiers[i].weight);
    const char *dm = cfg->default_medium ? cfg->default_medium : "GPU";
    ix->default_medium = kvp__rt_medium_find(ix, dm);
    if (ix->default_medium == KVP__RT_NIL) {
        if (ix->n_media >= KVP_ROUTER_MAX_MEDIA)
            return KVP_EINVAL;
        ix->default_medium = kvp__rt_medium_add(ix, dm, cfg->unknown_weight);
    }
    ix->unknown_weight = cfg->unknown_weight;
    ix->kv_group = cfg->kv_group;
    ix->by_tokens = cfg->index_by == KVP_ROUTER_INDEX_TOKENS;
    ix->token_hash = cfg->token_hash;
    ix->token_hash.vllm_seed = NULL;
    ix->token_hash.alloc.alloc = NULL;
    ix->token_hash.alloc.free = NULL;
    int rc = kvp__rt_hash_copy(&ix->mem, &cfg->hash, &ix->default_hash, &ix->default_vllm_seed,
                               &ix->default_vllm_seed_len);
    if (rc != KVP_OK)
        return rc;
    kvp_hasher *probe = NULL; /* refuse a default the hasher refuses, now, not at an event */
    rc = kvp_hasher_new(&ix->default_hash, &probe);
    kvp_hasher_free(probe);
    return rc;
}

void kvp__rt_index_destroy(kvp__rt_index *ix)
{
    for (uint32_t i = 0; ix->workers && i < ix->n_slots; i++) {
        kvp__rt_tmap_clear(&ix->workers[i].tmap, &ix->mem);
        kvp__rt_tmap_clear(&ix->workers[i].refs, &ix->mem);
    }
    kvp__rt_free(&ix->mem, ix->workers, (size_t)ix->cap_workers * sizeof *ix->workers);
    ix->workers = NULL;
    for (uint32_t i = 0; i < ix->n_names; i++)
        kvp__rt_free(&ix->mem, ix->names[i].s, ix->names[i].len + 1);
    kvp__rt_free(&ix->mem, ix->names, (size_t)ix->cap_names * sizeof *ix->names);
    ix->names = NULL;
    for (uint32_t g = 0; g < ix->n_groups; g++)
        group_free(&ix->mem, ix->groups[g]);
    ix->n_groups = 0;
    kvp__rt_table_destroy(&ix->table);
    kvp__rt_free(&ix->mem, ix->default_vllm_seed, ix->default_vllm_seed_len);
    kvp__rt_lock_destroy(&ix->lock);
}

/* ---------------------------------------------------------------- statistics */

void kvp__rt_index_stats_locked(const kvp__rt_index *ix, kvp_router_stats *st)
{
    st->n_workers = ix->n_workers;
    for (uint32_t i = 0; i < ix->n_slots; i++)
        st->n_stale += ix->workers[i].live && ix->workers[i].stale;
    st->n_groups = ix->n_groups;
    st->n_media = ix->n_media;
    st->n_blocks = ix->table.n_entries;
    st->n_holders = ix->table.n_holders;
    st->n_holder_media = ix->table.n_holder_media;
    st->n_slots = ix->table.cap;
    st->index_bytes = kvp__rt_table_bytes(&ix->table);
    st->total_bytes = ix->mem.live_bytes;
    st->bytes_per_holder = st->n_holders ? (double)st->total_bytes / (double)st->n_holders : 0;
    st->n_batches = ix->n_batches;
    st->n_events_stored = ix->n_events_stored;
    st->n_events_removed = ix->n_events_removed;
    st->n_events_cleared = ix->n_events_cleared;
    st->n_events_skipped = ix->n_events_skipped;
    st->n_duplicates = ix->n_duplicates;
    st->n_gaps = ix->n_gaps;
    st->n_restarts = ix->n_restarts;
    st->n_malformed = ix->n_malformed;
    st->n_scores = atomic_load_explicit(&ix->n_scores, memory_order_relaxed);
}

int kvp__rt_worker_stats_locked(const kvp__rt_index *ix, uint32_t id, kvp_router_worker_stats *out)
{
    if (!kvp__rt_worker_ok(ix, id))
        return KVP_ENOENT;
    const kvp__rt_worker *w = &ix->workers[id];
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
    return KVP_OK;
}

int kvp__rt_token_stats_locked(const kvp__rt_index *ix, uint32_t id, kvp_router_token_stats *out)
{
    if (id != KVP_ROUTER_ALL_WORKERS && !kvp__rt_worker_ok(ix, id))
        return KVP_ENOENT;
    kvp_router_token_stats ts;
    memset(&ts, 0, sizeof ts);
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        const kvp__rt_worker *w = &ix->workers[i];
        if (!w->live || (id != KVP_ROUTER_ALL_WORKERS && i != id))
            continue;
        ts.n_map_entries += w->tmap.n;
        ts.map_bytes += kvp__rt_tmap_bytes(&w->tmap) + kvp__rt_tmap_bytes(&w->refs);
        ts.n_keyed += w->n_keyed;
        ts.n_unresolved += w->n_unresolved;
        ts.n_unkeyable += w->n_unkeyable;
        ts.n_unknown_removed += w->n_unknown_removed;
    }
    *out = ts;
    return KVP_OK;
}

/* ---------------------------------------------------------------- checker */

/* Is s one of the interned names (the very pointer)? */
static bool name_interned(const kvp__rt_index *ix, const char *s)
{
    for (uint32_t i = 0; i < ix->n_names; i++) {
        if (ix->names[i].s == s)
            return true;
    }
    return false;
}

/* Names, workers, rows, groups and media. KVP_OK or KVP_ECORRUPT. */
static int check_workers_locked(const kvp__rt_index *ix, bool *live)
{
    if (ix->n_slots > ix->cap_workers || ix->n_groups > KVP_ROUTER_MAX_GROUPS ||
        ix->n_media > KVP_ROUTER_MAX_MEDIA || ix->default_medium >= ix->n_media ||
        ix->n_names > ix->cap_names)
        return KVP_ECORRUPT;
    for (uint32_t i = 0; i < ix->n_names; i++) {
        const kvp__rt_name *nm = &ix->names[i];
        if (!nm->s || strlen(nm->s) != nm->len)
            return KVP_ECORRUPT;
        for (uint32_t j = 0; j < i; j++) {
            if (ix->names[j].len == nm->len && memcmp(ix->names[j].s, nm->s, nm->len) == 0)
                return KVP_ECORRUPT;
        }
    }
    uint32_t n_live = 0;
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        const kvp__rt_worker *w = &ix->workers[i];
        live[i] = w->live;
        if (!w->live) {
            if (w->engine_id || w->n_blocks != 0 || w->tmap.n != 0 || w->refs.n != 0)
                return KVP_ECORRUPT;
            continue;
        }
        if (!ix->by_tokens && (w->tmap.cap != 0 || w->refs.cap != 0))
            return KVP_ECORRUPT;
        if (ix->by_tokens && !ix->groups[w->group]->own)
            return KVP_ECORRUPT;
        if (!w->engine_id || !name_interned(ix, w->engine_id) ||
            strlen(w->engine_id) != w->engine_len || w->group >= ix->n_groups || w->row != n_live)
            return KVP_ECORRUPT;
        for (uint32_t j = 0; j < i; j++) {
            const kvp__rt_worker *o = &ix->workers[j];
            if (o->live && o->dp_rank == w->dp_rank && strcmp(o->engine_id, w->engine_id) == 0)
                return KVP_ECORRUPT;
        }
        n_live++;
    }
    if (n_live != ix->n_workers)
        return KVP_ECORRUPT;
    for (uint32_t g = 0; g < ix->n_groups; g++) {
        if (!ix->groups[g] || !ix->groups[g]->hasher || ix->groups[g]->hash.block_size == 0)
            return KVP_ECORRUPT;
    }
    for (uint32_t m = 1; m < (1u << KVP__RT_MEDIA_BITS); m++) {
        double best = 0;
        for (uint32_t b = 0; b < ix->n_media; b++) {
            if ((m >> b & 1u) && ix->media[b].weight > best)
                best = ix->media[b].weight;
        }
        if (ix->weight_of_mask[m] != best)
            return KVP_ECORRUPT;
    }
    return KVP_OK;
}

/* Token mode: worker id's maps against the table. Every entry names an own key the worker
 * holds in (at least) the entry's media, in exactly those media when no other entry names
 * it; refs counts exactly the entries of each own key it holds (two or more, or what is
 * left of them), and the worker's block count is the number of distinct own keys. KVP_OK,
 * KVP_ECORRUPT. */
static int check_maps_locked(const kvp__rt_index *ix, uint32_t id, uint32_t media_ok)
{
    const kvp__rt_worker *w = &ix->workers[id];
    if (kvp__rt_tmap_check(&w->tmap) != KVP_OK || kvp__rt_tmap_check(&w->refs) != KVP_OK)
        return KVP_ECORRUPT;
    uint32_t *seen = calloc((size_t)w->refs.cap + 1, sizeof *seen);
    if (!seen)
        return KVP_ENOMEM;
    int rc = KVP_OK;
    uint64_t extra = 0; /* entries beyond the first of each shared own key */
    for (uint32_t i = 0; rc == KVP_OK && i < w->tmap.cap; i++) {
        const kvp__rt_tentry *e = &w->tmap.e[i];
        if (e->mask == 0)
            continue;
        uint32_t held = kvp__rt_held_mask(&ix->table, e->own_lo, id);
        const kvp__rt_tentry *r = kvp__rt_tmap_find(&w->refs, e->own_lo);
        if ((e->mask & ~media_ok) != 0 || (held & e->mask) != e->mask || (!r && held != e->mask))
            rc = KVP_ECORRUPT;
        if (r)
            seen[r - w->refs.e]++;
    }
    for (uint32_t i = 0; rc == KVP_OK && i < w->refs.cap; i++) {
        if (w->refs.e[i].mask == 0)
            continue;
        if (w->refs.e[i].aux == 0 || seen[i] != w->refs.e[i].aux)
            rc = KVP_ECORRUPT;
        extra += w->refs.e[i].aux - 1;
    }
    if (rc == KVP_OK && w->tmap.n - extra != w->n_blocks)
        rc = KVP_ECORRUPT;
    free(seen);
    return rc;
}

int kvp__rt_index_check_locked(const kvp__rt_index *ix)
{
    uint32_t n = ix->n_slots;
    uint64_t *counts = calloc((size_t)n + 1, sizeof *counts);
    bool *live = calloc((size_t)n + 1, sizeof *live);
    int rc = counts && live ? check_workers_locked(ix, live) : KVP_ENOMEM;
    uint32_t media_ok = (1u << ix->n_media) - 1;
    if (rc == KVP_OK)
        rc = kvp__rt_table_check(&ix->table, counts, live, n, media_ok);
    for (uint32_t i = 0; rc == KVP_OK && i < n; i++) {
        if (live[i] && counts[i] != ix->workers[i].n_blocks)
            rc = KVP_ECORRUPT;
        if (rc == KVP_OK && live[i] && ix->by_tokens)
            rc = check_maps_locked(ix, i, media_ok);
    }
    free(counts);
    free(live);
    return rc;
}
