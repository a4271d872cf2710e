/*
 * router_apply.c - applying one worker's event batch to the index, all or nothing, in
 * sequence.
 *
 * kvp__rt_apply_one_locked, with the index lock held exclusively (router_store.h):
 *   1. validate the whole batch (events, arrays, block size, tokens, dp rank, media);
 *   2. place its sequence number: apply, restart, duplicate or gap (the last two return
 *      without touching the index);
 *   3. make room: register the batch's new media, grow the holder sets it adds this worker
 *      to and reserve a table slot for every stored hash not indexed yet, so step 4
 *      cannot fail (an ENOMEM here leaves the index as it was: room changes no contents);
 *   4. apply: a restart clears the worker first; then each event in order (events of
 *      another KV cache group are skipped);
 *   5. advance the worker's sequence state and counters.
 *
 * Token mode (docs/routing.md, "Token mode"): step 3 also computes the router's own key of
 * every stored block (tk_own_keys(): the chain from the root of the worker's namespace, or
 * from the parent's own key, found in the worker's map or among the batch's earlier
 * blocks) and reserves map entries for them; step 4 indexes each block under its own key
 * and records engine hash -> own key, so that a later child or BlockRemoved, which name
 * engine hashes only, resolve. The own key of a block is a fact about its tokens, so a
 * parent removed meanwhile still resolves; one never seen does not (the block is not
 * indexed: under-reported, never over-reported). Hashing runs under the exclusive lock
 * here (the parent's key is only known there): about 20 ns per 16-token block with xxh3,
 * which is why the own function is a fast one.
 *
 * Sequence numbers (docs/routing.md, "Consistency"): vLLM numbers batches 0, 1, 2 ... per
 * publisher process, so a number below the expected one is a duplicate (a replayed batch
 * already applied), except 0 after a higher one: a new publisher process, whose cache
 * started empty. A number above the expected one means batches were lost; the caller can
 * fetch them from the publisher's replay socket and apply them in order, and only then the
 * newer ones. A stale worker has given up its history: it takes the next batch whatever its
 * number and counts from there.
 */
#include <string.h>
#include <strings.h>

#include "router_apply.h"

#define TK_CHAINS 64u /* kvp_chain states per kvp_hasher_blocks call (stack) */

/* Token mode: one stored block's own key, computed in step 3. */
typedef struct tk_key {
    kvp_key own;  /* the router's own key */
    bool ok;      /* own is known (parent resolved, block keyable) */
    bool keyable; /* false: not indexable whatever the parent (extra_keys, lora_id, vocab) */
} tk_key;

/* Token mode: step 3's results and scratch for one batch. */
typedef struct tk_batch {
    tk_key *k;         /* k[j]: the batch's j-th stored block (events in order) */
    size_t n;          /* stored blocks in the batch */
    kvp__rt_tmap seen; /* engine hash -> own key of the batch's blocks since its last clear */
    kvp__rt_tmap owns; /* own key -> the engine hash (own_lo field) that first produced it */
    uint64_t n_refs;   /* room the worker's refs map needs */
} tk_batch;

typedef struct pending_media {
    const char *names[KVP_ROUTER_MAX_MEDIA]; /* media to register (point into the batch) */
    uint32_t n;                              /* how many */
} pending_media;

static inline bool event_skipped(const kvp__rt_index *ix, const kvp_kv_event *e)
{
    return e->group_idx >= 0 && e->group_idx != ix->kv_group;
}

static inline bool medium_is_default(const char *m)
{
    return !m || m[0] == '\0';
}

/* Fail the batch: record why, count it. Returns KVP_EINVAL. */
static int malformed(kvp__rt_index *ix, kvp__rt_worker *w, kvp_router_apply_result *res,
                     size_t event, const char *why)
{
    ix->n_malformed++;
    w->n_malformed++;
    res->bad_event = event;
    res->why = why;
    return KVP_EINVAL;
}

/* Check a medium name and queue it for registration if new. NULL when fine, else why. */
static const char *check_medium(const kvp__rt_index *ix, const char *m, bool stored,
                                pending_media *pm)
{
    if (medium_is_default(m))
        return NULL;
    if (strnlen(m, KVP_ROUTER_MEDIUM_MAX + 1) > KVP_ROUTER_MEDIUM_MAX)
        return "medium name longer than KVP_ROUTER_MEDIUM_MAX (31) bytes";
    if (!stored || kvp__rt_medium_find(ix, m) != KVP__RT_NIL)
        return NULL; /* a removal from an unknown medium removes nothing */
    for (uint32_t i = 0; i < pm->n; i++) {
        if (strcasecmp(pm->names[i], m) == 0)
            return NULL;
    }
    if (ix->n_media + pm->n >= KVP_ROUTER_MAX_MEDIA)
        return "a new medium, but all KVP_ROUTER_MAX_MEDIA (6) tiers are taken";
    pm->names[pm->n++] = m;
    return NULL;
}

/* One event's shape. NULL when fine, else why. */
static const char *check_event(const kvp__rt_index *ix, uint32_t block_size, const kvp_kv_event *e,
                               pending_media *pm)
{
    if (e->type != KVP_EVENT_STORED && e->type != KVP_EVENT_REMOVED && e->type != KVP_EVENT_CLEARED)
        return "unknown event type";
    if (event_skipped(ix, e) || e->type == KVP_EVENT_CLEARED)
        return NULL;
    if (e->n_hashes > 0 && !e->hashes)
        return "block_hashes NULL with a non-zero count";
    if (e->type == KVP_EVENT_STORED) {
        if (e->block_size != block_size)
            return "BlockStored block_size differs from the worker's hash configuration";
        if (e->n_tokens > 0 && !e->tokens)
            return "token_ids NULL with a non-zero count";
        if (e->n_hashes > SIZE_MAX / block_size || e->n_tokens != e->n_hashes * block_size)
            return "BlockStored token_ids are not len(block_hashes) * block_size tokens";
    }
    return check_medium(ix, e->medium, e->type == KVP_EVENT_STORED, pm);
}

/* Step 1 for the whole batch: KVP_OK or KVP_EINVAL (via malformed()). */
static int validate(kvp__rt_index *ix, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                    kvp_router_apply_result *res, pending_media *pm)
{
    kvp__rt_worker *w = &ix->workers[id];
    if (b->n_events > 0 && !b->events)
        return malformed(ix, w, res, SIZE_MAX, "events NULL with a non-zero count");
    if (b->has_dp_rank && b->dp_rank != w->dp_rank)
        return malformed(ix, w, res, SIZE_MAX, "data_parallel_rank differs from the worker's");
    if (seq == UINT64_MAX)
        return malformed(ix, w, res, SIZE_MAX, "sequence number 2^64-1 is the replay end marker");
    uint32_t block_size = ix->groups[w->group]->hash.block_size;
    for (size_t i = 0; i < b->n_events; i++) {
        const char *why = check_event(ix, block_size, &b->events[i], pm);
        if (why)
            return malformed(ix, w, res, i, why);
    }
    return KVP_OK;
}

/* Step 2: what seq means for worker w. */
static int place_seq(const kvp__rt_worker *w, uint64_t seq, double ts)
{
    if (!w->seq_known || seq == w->expected)
        return KVP_ROUTER_APPLIED;
    if (seq == 0 && (w->expected > 1 || memcmp(&ts, &w->ts0, sizeof ts) != 0))
        return KVP_ROUTER_RESTARTED;
    return seq < w->expected ? KVP_ROUTER_DUPLICATE : KVP_ROUTER_GAP;
}

/* Step 3 (media registered by the caller): holder room, table slots. Only keys absent now
 * can add entries: a present key that step 4 deletes and stores again takes back the slot
 * it left. KVP_OK or KVP_ENOMEM (contents unchanged). */
static int make_room(kvp__rt_index *ix, uint32_t id, const kvp_kv_batch *b)
{
    uint64_t n_new = 0;
    int rc = KVP_OK;
    for (size_t i = 0; rc == KVP_OK && i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        if (e->type != KVP_EVENT_STORED || event_skipped(ix, e))
            continue;
        for (size_t k = 0; rc == KVP_OK && k < e->n_hashes; k++) {
            bool absent = false;
            rc = kvp__rt_prepare_add(&ix->table, e->hashes[k], id, &absent);
            n_new += absent;
        }
    }
    return rc == KVP_OK ? kvp__rt_table_reserve(&ix->table, n_new) : rc;
}

/* The media bit of an event's medium; 0 for a medium never registered. */
static uint32_t medium_bit(const kvp__rt_index *ix, const char *m)
{
    uint32_t i = medium_is_default(m) ? ix->default_medium : kvp__rt_medium_find(ix, m);
    return i == KVP__RT_NIL ? 0 : 1u << i;
}

/* Step 4 for one event. Returns true for AllBlocksCleared. Cannot fail. */
static bool apply_event(kvp__rt_index *ix, uint32_t id, const kvp_kv_event *e,
                        kvp_router_apply_result *res)
{
    kvp__rt_worker *w = &ix->workers[id];
    if (e->type == KVP_EVENT_CLEARED) {
        kvp__rt_worker_reset_locked(ix, id);
        res->n_cleared++;
        return true;
    }
    uint32_t bit = medium_bit(ix, e->medium);
    for (size_t k = 0; bit != 0 && k < e->n_hashes; k++) {
        if (e->type == KVP_EVENT_STORED)
            w->n_blocks += kvp__rt_add(&ix->table, e->hashes[k], id, bit);
        else
            w->n_blocks -= kvp__rt_remove(&ix->table, e->hashes[k], id, bit);
    }
    if (e->type == KVP_EVENT_STORED)
        res->n_stored++;
    else
        res->n_removed++;
    return false;
}

/* ---------------------------------------------------------------- token mode */

static void tk_free(kvp__rt_index *ix, tk_batch *tk)
{
    kvp__rt_free(&ix->mem, tk->k, tk->n * sizeof *tk->k);
    kvp__rt_tmap_clear(&tk->seen, &ix->mem);
    kvp__rt_tmap_clear(&tk->owns, &ix->mem);
}

/* Step 3, token mode: note block h's own key in the batch's scratch maps, and count the
 * reference-map room its insert in step 4 may need (h new to the worker, or re-pointed,
 * while another engine hash names the same own key). Cannot fail (room reserved). */
static void tk_note(const kvp__rt_index *ix, uint32_t id, tk_batch *tk, uint64_t h, kvp_key own)
{
    const kvp__rt_worker *w = &ix->workers[id];
    kvp__rt_tentry *s = kvp__rt_tmap_find(&tk->seen, h);
    if (s) {
        s->own_lo = own.lo;
        s->own_hi = own.hi;
    } else {
        kvp__rt_tentry ne = {h, own.lo, own.hi, 1, 0};
        kvp__rt_tmap_insert(&tk->seen, &ne);
    }
    const kvp__rt_tentry *o = kvp__rt_tmap_find(&tk->owns, own.lo);
    if (!o) {
        kvp__rt_tentry ne = {own.lo, h, 0, 1, 0};
        kvp__rt_tmap_insert(&tk->owns, &ne);
    } else if (o->own_lo != h) {
        tk->n_refs++;
    }
    const kvp__rt_tentry *m = kvp__rt_tmap_find(&w->tmap, h);
    if ((!m || m->own_lo != own.lo || m->own_hi != own.hi) &&
        kvp__rt_held_mask(&ix->table, own.lo, id) != 0)
        tk->n_refs++;
}

/* Step 3, token mode: the own keys of stored event e's blocks into out[0 .. n_hashes).
 * map_valid: the worker's map may resolve the parent (no restart or clear before e in this
 * batch). Cannot fail (the scratch maps have room for every block). */
static void tk_own_keys(const kvp__rt_index *ix, uint32_t id, const kvp_kv_event *e, bool map_valid,
                        tk_batch *tk, tk_key *out)
{
    const kvp__rt_worker *w = &ix->workers[id];
    const kvp__rt_group *g = ix->groups[w->group];
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    if (g->model)
        ns.model = (kvp_field){g->model, g->model_len};
    if (e->lora_name)
        ns.adapter = kvp_field_str(e->lora_name);
    bool keyable = kvp__rt_extra_keys_none(e) && !(e->has_lora_id && !e->lora_name);
    kvp_chain chain;
    if (keyable && kvp_hasher_root(g->hasher, &ns, &chain) != KVP_OK)
        keyable = false;
    bool ok = keyable;
    if (ok && e->has_parent) {
        const kvp__rt_tentry *p = kvp__rt_tmap_find(&tk->seen, e->parent);
        if (!p && map_valid)
            p = kvp__rt_tmap_find(&w->tmap, e->parent);
        if (p) {
            chain.key.lo = p->own_lo;
            chain.key.hi = p->own_hi;
            chain.high.lo = chain.high.hi = 0;
            chain.n_blocks = 1; /* not a root block (the own profiles chain on key only) */
        } else {
            ok = false;
        }
    }
    uint32_t bs = g->hash.block_size;
    kvp_chain states[TK_CHAINS];
    for (size_t k = 0; k < e->n_hashes;) {
        size_t m = e->n_hashes - k < TK_CHAINS ? e->n_hashes - k : TK_CHAINS, got = 0;
        if (ok && kvp_hasher_blocks(g->hasher, &ns, &chain, e->tokens + k * bs, m * bs, states, m,
                                    &got) != KVP_OK)
            ok = keyable = false; /* a token id at or above vocab_size */
        for (size_t q = 0; q < m; q++) {
            tk_key *t = &out[k + q];
            t->ok = ok;
            t->keyable = keyable;
            if (ok) {
                t->own = states[q].key;
                tk_note(ix, id, tk, e->hashes[k + q], t->own);
            }
        }
        k += m;
    }
}

/* Step 3, token mode: media are registered; compute the own keys of every stored block
 * (tk), then make the room step 4 needs: holder sets and table slots for the own keys,
 * map entries and reference-map entries. KVP_OK or KVP_ENOMEM (contents unchanged; tk
 * holds what was allocated: tk_free). */
static int tk_make_room(kvp__rt_index *ix, uint32_t id, const kvp_kv_batch *b, int status,
                        tk_batch *tk)
{
    kvp__rt_worker *w = &ix->workers[id];
    size_t n = 0;
    for (size_t i = 0; i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        if (e->type == KVP_EVENT_STORED && !event_skipped(ix, e))
            n += e->n_hashes;
    }
    if (n == 0)
        return KVP_OK;
    tk->k = kvp__rt_alloc(&ix->mem, n * sizeof *tk->k);
    if (!tk->k)
        return KVP_ENOMEM;
    tk->n = n;
    tk->seen.seed = w->tmap.seed;
    tk->owns.seed = w->refs.seed;
    int rc = kvp__rt_tmap_reserve(&tk->seen, &ix->mem, n);
    if (rc == KVP_OK)
        rc = kvp__rt_tmap_reserve(&tk->owns, &ix->mem, n);
    if (rc != KVP_OK)
        return rc;
    bool map_valid = status != KVP_ROUTER_RESTARTED;
    size_t j = 0;
    for (size_t i = 0; i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        if (event_skipped(ix, e))
            continue;
        if (e->type == KVP_EVENT_CLEARED) {
            map_valid = false;
            kvp__rt_tmap_reset(&tk->seen);
        } else if (e->type == KVP_EVENT_STORED) {
            tk_own_keys(ix, id, e, map_valid, tk, &tk->k[j]);
            j += e->n_hashes;
        }
    }
    uint64_t n_new = 0, n_ok = 0;
    for (j = 0; rc == KVP_OK && j < n; j++) {
        if (!tk->k[j].ok)
            continue;
        bool absent = false;
        rc = kvp__rt_prepare_add(&ix->table, tk->k[j].own.lo, id, &absent);
        n_new += absent;
        n_ok++;
    }
    if (rc == KVP_OK)
        rc = kvp__rt_table_reserve(&ix->table, n_new);
    if (rc == KVP_OK)
        rc = kvp__rt_tmap_reserve(&w->tmap, &ix->mem, n_ok);
    if (rc == KVP_OK)
        rc = kvp__rt_tmap_reserve(&w->refs, &ix->mem, tk->n_refs);
    return rc;
}

/* Step 4, token mode: remove the media in `mask` of engine hash h from worker id. A shared
 * own key (in refs) leaves the table as it is until its last entry goes. Cannot fail. */
static void tk_remove(kvp__rt_index *ix, uint32_t id, uint64_t h, uint32_t mask)
{
    kvp__rt_worker *w = &ix->workers[id];
    kvp__rt_tentry *e = kvp__rt_tmap_find(&w->tmap, h);
    if (!e || (e->mask & mask) == 0) {
        w->n_unknown_removed += !e;
        return;
    }
    uint64_t own_lo = e->own_lo;
    uint32_t drop = e->mask & mask;
    bool gone = (e->mask & ~mask) == 0;
    if (gone)
        kvp__rt_tmap_delete(&w->tmap, h); /* e is no longer valid */
    else
        e->mask &= ~mask;
    kvp__rt_tentry *r = kvp__rt_tmap_find(&w->refs, own_lo);
    if (!r) {
        bool left = kvp__rt_remove(&ix->table, own_lo, id, drop);
        assert(left == gone);
        w->n_blocks -= left;
        return;
    }
    if (gone && --r->aux == 0) {
        kvp__rt_tmap_delete(&w->refs, own_lo);
        w->n_blocks -= kvp__rt_remove(&ix->table, own_lo, id, (1u << KVP__RT_MEDIA_BITS) - 1);
    }
}

/* Step 4, token mode: engine hash h of worker id, own key own, stored in medium bit. Uses
 * the room step 3 made. Cannot fail. */
static void tk_store(kvp__rt_index *ix, uint32_t id, uint64_t h, kvp_key own, uint32_t bit)
{
    kvp__rt_worker *w = &ix->workers[id];
    kvp__rt_tentry *e = kvp__rt_tmap_find(&w->tmap, h);
    if (e && (e->own_lo != own.lo || e->own_hi != own.hi)) {
        tk_remove(ix, id, h, e->mask); /* the engine reused the hash for other tokens */
        e = NULL;
    }
    w->n_keyed++;
    if (e) {
        e->mask |= bit;
        w->n_blocks += kvp__rt_add(&ix->table, own.lo, id, bit);
        return;
    }
    if (kvp__rt_held_mask(&ix->table, own.lo, id) != 0) {
        kvp__rt_tentry *r = kvp__rt_tmap_find(&w->refs, own.lo);
        if (r) {
            r->aux++;
        } else {
            kvp__rt_tentry ne = {own.lo, 0, 0, 1, 2};
            kvp__rt_tmap_insert(&w->refs, &ne);
        }
    }
    kvp__rt_tentry ne = {h, own.lo, own.hi, bit, 0};
    kvp__rt_tmap_insert(&w->tmap, &ne);
    w->n_blocks += kvp__rt_add(&ix->table, own.lo, id, bit);
}

/* Step 4 for one event, token mode; *j is the index in tk of the event's first stored
 * block (advanced past them). Returns true for AllBlocksCleared. Cannot fail. */
static bool tk_apply_event(kvp__rt_index *ix, uint32_t id, const kvp_kv_event *e, tk_batch *tk,
                           size_t *j, kvp_router_apply_result *res)
{
    kvp__rt_worker *w = &ix->workers[id];
    if (e->type == KVP_EVENT_CLEARED) {
        kvp__rt_worker_reset_locked(ix, id);
        res->n_cleared++;
        return true;
    }
    uint32_t bit = medium_bit(ix, e->medium);
    for (size_t k = 0; k < e->n_hashes; k++) {
        if (e->type == KVP_EVENT_REMOVED) {
            if (bit != 0)
                tk_remove(ix, id, e->hashes[k], bit);
            continue;
        }
        const tk_key *t = &tk->k[(*j)++];
        if (!t->ok)
            *(t->keyable ? &w->n_unresolved : &w->n_unkeyable) += 1;
        else if (bit != 0)
            tk_store(ix, id, e->hashes[k], t->own, bit);
    }
    if (e->type == KVP_EVENT_STORED)
        res->n_stored++;
    else
        res->n_removed++;
    return false;
}

/* Steps 1-5 for a live worker id and a batch b. */
static int apply_locked(kvp__rt_index *ix, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                        kvp_router_apply_result *res)
{
    kvp__rt_worker *w = &ix->workers[id];
    pending_media pm = {{NULL}, 0};
    /* Step 1: validate. */
    int rc = validate(ix, id, seq, b, res, &pm);
    if (rc != KVP_OK)
        return rc;
    /* Step 2: place the sequence number. */
    int status = place_seq(w, seq, b->ts);
    res->status = status;
    res->expected = w->expected;
    res->stale = w->stale;
    if (status == KVP_ROUTER_DUPLICATE || status == KVP_ROUTER_GAP) {
        *(status == KVP_ROUTER_GAP ? &ix->n_gaps : &ix->n_duplicates) += 1;
        w->n_gaps += status == KVP_ROUTER_GAP;
        return KVP_OK;
    }
    /* Step 3: make room (media first: the medium bits of the events). */
    for (uint32_t i = 0; i < pm.n; i++)
        (void)kvp__rt_medium_add(ix, pm.names[i], ix->unknown_weight);
    tk_batch tk;
    memset(&tk, 0, sizeof tk);
    rc = ix->by_tokens ? tk_make_room(ix, id, b, status, &tk) : make_room(ix, id, b);
    if (rc != KVP_OK) {
        tk_free(ix, &tk);
        res->status = 0;
        return rc;
    }
    /* Step 4: apply. */
    bool exact = seq == 0;
    if (status == KVP_ROUTER_RESTARTED)
        kvp__rt_worker_reset_locked(ix, id);
    size_t j = 0;
    for (size_t i = 0; i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        if (event_skipped(ix, e))
            res->n_skipped++;
        else if (ix->by_tokens ? tk_apply_event(ix, id, e, &tk, &j, res)
                               : apply_event(ix, id, e, res))
            exact = true;
    }
    assert(j == tk.n);
    tk_free(ix, &tk);
    /* Step 5: sequence state and counters. */
    if (exact) {
        w->stale = false;
        w->partial = false;
    }
    if (seq == 0)
        w->ts0 = b->ts;
    w->seq_known = true;
    w->expected = seq + 1;
    w->n_batches++;
    w->n_restarts += status == KVP_ROUTER_RESTARTED;
    ix->n_restarts += status == KVP_ROUTER_RESTARTED;
    ix->n_batches++;
    ix->n_events_stored += res->n_stored;
    ix->n_events_removed += res->n_removed;
    ix->n_events_cleared += res->n_cleared;
    ix->n_events_skipped += res->n_skipped;
    res->expected = w->expected;
    res->stale = w->stale;
    return KVP_OK;
}

int kvp__rt_apply_one_locked(kvp__rt_index *ix, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                             kvp_router_apply_result *res)
{
    memset(res, 0, sizeof *res);
    res->bad_event = SIZE_MAX;
    if (!b) {
        res->why = "NULL batch";
        return KVP_EINVAL;
    }
    return kvp__rt_worker_ok(ix, id) ? apply_locked(ix, id, seq, b, res) : KVP_ENOENT;
}
