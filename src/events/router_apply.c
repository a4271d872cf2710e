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

/* Step 3: media, holder room, table slots. Only keys absent now can add entries: a
 * present key that step 4 deletes and stores again takes back the slot it left. KVP_OK or
 * KVP_ENOMEM (contents unchanged). */
static int make_room(kvp__rt_index *ix, uint32_t id, const kvp_kv_batch *b, const pending_media *pm)
{
    for (uint32_t i = 0; i < pm->n; i++)
        (void)kvp__rt_medium_add(ix, pm->names[i], ix->unknown_weight);
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
        kvp__rt_worker_clear_locked(ix, id);
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
    /* Step 3: make room. */
    rc = make_room(ix, id, b, &pm);
    if (rc != KVP_OK) {
        res->status = 0;
        return rc;
    }
    /* Step 4: apply. */
    bool exact = seq == 0;
    if (status == KVP_ROUTER_RESTARTED)
        kvp__rt_worker_clear_locked(ix, id);
    for (size_t i = 0; i < b->n_events; i++) {
        if (event_skipped(ix, &b->events[i]))
            res->n_skipped++;
        else if (apply_event(ix, id, &b->events[i], res))
            exact = true;
    }
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
