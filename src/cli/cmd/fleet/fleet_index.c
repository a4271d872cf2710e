/*
 * fleet_index.c - the router index of `kvprefix fleet --index memory|redis` (fleet.h): a
 * kvp_router (libkvprefix-events) fed with the replicas' own cache events, asked by the
 * cache-aware policies instead of the replicas' caches (docs/routing.md, "Fleet
 * simulation", "Routing through a router index").
 *
 *   kvp_cache of replica r ──on_event──> collector r ──step end──> batch (seq, due) ──┐
 *     (STORED / REMOVED / CLEARED)        recs, hashes, lens, tokens                   │
 *                                                                                      v
 *   cache-aware pick <──fl_index_score── kvp_router_score_hashes <──fl_index_sync── FIFO queue
 *                                                                  kvp_router_apply (due <= now)
 *
 * Collect. Each replica's cache calls ix_on_event once per block. A STORED event extends the
 * open BlockStored when its parent is the full key of that event's last block (one
 * BlockStored per commit, as vLLM and the publisher send them), else it opens one whose
 * parent is nil for a namespace's first block; consecutive REMOVED share one BlockRemoved;
 * CLEARED is AllBlocksCleared. Hashes are key.lo (the event integer). token_ids are the
 * event's tokens, or block_size zeros per block when the event carries none: the router
 * only checks that there are n_hashes x block_size of them. A block's tokens are kept up to
 * their last non-zero one (lens[] per block) and padded with zeros when the batch is applied:
 * a synthesized Mooncake block (two id words, then zeros) costs 8 bytes, not 2 KiB, so a
 * long --event-delay-ms holds about 20 bytes per waiting block of a trace.
 *
 * Batch. At the end of each simulation step (fl_index_step) every replica that collected
 * events turns them into one kvp_kv_batch (ts = the simulated time in seconds, dp_rank 0,
 * the replica's next sequence number from 0), queued with its due time now + event_delay.
 * Due times never decrease, so the queue is a FIFO. fl_index_sync applies what is due
 * before each score; with zero delay a step's events are therefore visible to the next
 * routing decision, exactly what the oracle sees, and the decisions are the oracle's.
 *
 * Invariants (fl_index_check): every collector's records account for exactly its hashes, and
 * its lens for exactly its kept tokens (at most block_size per stored hash, none for the
 * others); the queue's head is within it and its due times are non-decreasing; the router
 * passes kvp_router_check.
 *
 * Cost: one copy of each event's hash (and block's kept tokens) into the collector and once
 * more into its batch, the padding to block_size at apply; one kvp_router_apply per replica
 * and step with events; one kvp_router_score_hashes per cache-aware routing decision. Only the
 * calls to the router are timed (CLOCK_MONOTONIC), so the figures are the index's, not the
 * simulation's.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "fleet.h"
#include "fleet_index.h"

/* Round trips to Redis so far (0 without Redis). Cannot fail on a valid router. */
static uint64_t redis_calls(fl_index *x)
{
    kvp_router_stats st;
    if (x->cfg.mode != FL_INDEX_REDIS || kvp_router_stats_get(x->router, &st) != KVP_OK)
        return 0;
    return st.n_redis_calls;
}

bool fl_index_available(void)
{
    return true;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static inline bool key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

/* ---- collecting ---------------------------------------------------------------------------- */

/* The tokens of ev's block up to its last non-zero one (0 without tokens). */
static uint32_t kept(const ix_rep *p, const kvp_event *ev)
{
    uint32_t n = ev->type == KVP_EVENT_STORED && ev->tokens ? p->x->bs : 0;
    while (n > 0 && ev->tokens[n - 1] == 0)
        n--;
    return n;
}

/* Does ev continue the last collected wire event (same kind, and for STORED the chain)? */
static bool continues(const ix_rep *p, const kvp_event *ev)
{
    if (p->n_recs == 0)
        return false;
    const ix_rec *last = &p->recs[p->n_recs - 1];
    if (last->type != ev->type || ev->type == KVP_EVENT_CLEARED)
        return false;
    return ev->type == KVP_EVENT_REMOVED ||
           (!ev->parent_is_root && key_eq(p->last_key, ev->parent));
}

/* Take in one cache event (the caches' kvp_event_fn). Every reservation is made before
 * anything is written, so running out of memory drops exactly this event; the loss is
 * reported by the next fl_index_step. */
static void ix_on_event(void *ud, const kvp_event *ev)
{
    ix_rep *p = ud;
    fl_index *x = p->x;
    bool join = continues(p, ev);
    uint32_t n_kept = kept(p, ev);
    size_t cap = p->cap_hashes;
    if ((!join && !cli_grow((void **)&p->recs, &p->cap_recs, p->n_recs + 1, sizeof *p->recs)) ||
        !cli_grow((void **)&p->tokens, &p->cap_tokens, p->n_tokens + n_kept, sizeof *p->tokens) ||
        !cli_grow((void **)&p->lens, &cap, p->n_hashes + 1, sizeof *p->lens) ||
        !cli_grow((void **)&p->hashes, &p->cap_hashes, p->n_hashes + 1, sizeof *p->hashes)) {
        x->lost = true; /* lens may have grown alone: harmless, it is only larger */
        return;
    }
    if (n_kept > 0)
        memcpy(p->tokens + p->n_tokens, ev->tokens, n_kept * sizeof *p->tokens);
    p->n_tokens += n_kept;
    if (!join) {
        ix_rec r = {ev->type, ev->type == KVP_EVENT_STORED && !ev->parent_is_root,
                    ev->type == KVP_EVENT_STORED ? ev->parent.lo : 0, 0};
        p->recs[p->n_recs++] = r;
    }
    if (ev->type != KVP_EVENT_CLEARED) {
        p->lens[p->n_hashes] = n_kept;
        p->hashes[p->n_hashes++] = ev->key.lo;
        p->recs[p->n_recs - 1].n_hashes++;
    }
    if (ev->type == KVP_EVENT_STORED)
        p->last_key = ev->key;
    if (!p->listed) {
        p->listed = true;
        x->dirty[x->n_dirty++] = (uint32_t)(p - x->reps);
    }
}

void fl_index_attach(fl_index *x, uint32_t r, kvp_config *kc)
{
    kc->on_event = ix_on_event;
    kc->event_ud = &x->reps[r];
}

/* ---- batches ------------------------------------------------------------------------------- */

static void batch_free(ix_batch *q)
{
    free(q->events);
    free(q->hashes);
    free(q->lens);
    free(q->tokens);
}

/* Make replica r's collected events one queued batch due at due, and empty the collector.
 * Returns FL_OK or FL_ENOMEM (the collector and the queue unchanged). */
static int make_batch(fl_index *x, uint32_t r, fl_time now, fl_time due)
{
    ix_rep *p = &x->reps[r];
    if (!cli_grow((void **)&x->queue, &x->cap_queue, x->n_queue + 1, sizeof *x->queue))
        return FL_ENOMEM;
    ix_batch q;
    memset(&q, 0, sizeof q);
    q.events = calloc(p->n_recs, sizeof *q.events);
    q.hashes = malloc((p->n_hashes ? p->n_hashes : 1) * sizeof *q.hashes);
    q.lens = malloc((p->n_hashes ? p->n_hashes : 1) * sizeof *q.lens);
    q.tokens = malloc((p->n_tokens ? p->n_tokens : 1) * sizeof *q.tokens);
    if (!q.events || !q.hashes || !q.lens || !q.tokens) {
        batch_free(&q);
        return FL_ENOMEM;
    }
    if (p->n_hashes > 0) {
        memcpy(q.hashes, p->hashes, p->n_hashes * sizeof *q.hashes);
        memcpy(q.lens, p->lens, p->n_hashes * sizeof *q.lens);
    }
    if (p->n_tokens > 0)
        memcpy(q.tokens, p->tokens, p->n_tokens * sizeof *q.tokens);
    size_t h = 0;
    for (size_t i = 0; i < p->n_recs; i++) {
        const ix_rec *rec = &p->recs[i];
        kvp_kv_event *e = &q.events[i];
        e->type = rec->type;
        e->group_idx = -1;
        e->hashes = rec->n_hashes ? q.hashes + h : NULL;
        e->n_hashes = rec->n_hashes;
        if (rec->type == KVP_EVENT_STORED) {
            e->has_parent = rec->has_parent;
            e->parent = rec->parent;
            e->n_tokens = rec->n_hashes * x->bs; /* tokens: pad_tokens, at apply */
            e->block_size = x->bs;
        }
        h += rec->n_hashes;
    }
    q.due = due;
    q.replica = r;
    q.seq = p->seq++;
    q.b.ts = (double)now / 1e9;
    q.b.events = q.events;
    q.b.n_events = p->n_recs;
    q.b.has_dp_rank = true;
    q.b.dp_rank = 0;
    x->queue[x->n_queue++] = q;
    p->n_recs = p->n_hashes = p->n_tokens = 0;
    p->listed = false;
    return FL_OK;
}

int fl_index_step(fl_index *x, fl_time now, char *err, size_t err_size)
{
    if (x->lost) {
        cli_errf(err, err_size, "out of memory: the router index lost cache events");
        return FL_ENOMEM;
    }
    fl_time due = now + x->cfg.event_delay;
    while (x->n_dirty > 0) {
        if (make_batch(x, x->dirty[x->n_dirty - 1], now, due) != FL_OK) {
            cli_errf(err, err_size, "out of memory");
            return FL_ENOMEM;
        }
        x->n_dirty--;
    }
    return FL_OK;
}

static const char *status_name(int status)
{
    switch (status) {
    case KVP_ROUTER_DUPLICATE:
        return "a duplicate";
    case KVP_ROUTER_GAP:
        return "a gap";
    default:
        return "not applied";
    }
}

/* Point q's BlockStored events at their token_ids: each block's kept tokens, then zeros up
 * to block_size, in x->pad. Returns FL_OK or FL_ENOMEM. */
static int pad_tokens(fl_index *x, ix_batch *q)
{
    size_t need = 0;
    for (size_t i = 0; i < q->b.n_events; i++)
        need += q->events[i].n_tokens;
    if (!cli_grow((void **)&x->pad, &x->cap_pad, need ? need : 1, sizeof *x->pad))
        return FL_ENOMEM;
    uint32_t *out = x->pad;
    const uint32_t *in = q->tokens;
    size_t h = 0;
    for (size_t i = 0; i < q->b.n_events; i++) {
        kvp_kv_event *e = &q->events[i];
        if (e->type == KVP_EVENT_STORED)
            e->tokens = out;
        for (size_t k = 0; e->type == KVP_EVENT_STORED && k < e->n_hashes; k++, h++) {
            memcpy(out, in, q->lens[h] * sizeof *out);
            memset(out + q->lens[h], 0, (x->bs - q->lens[h]) * sizeof *out);
            in += q->lens[h];
            out += x->bs;
        }
        h += e->type == KVP_EVENT_STORED ? 0 : e->n_hashes;
    }
    return FL_OK;
}

/* Apply the queue's head batch. Returns FL_OK or FL_EINTERNAL / FL_ENOMEM with a message. */
static int apply_head(fl_index *x, char *err, size_t err_size)
{
    ix_batch *q = &x->queue[x->head];
    if (pad_tokens(x, q) != FL_OK) {
        cli_errf(err, err_size, "out of memory");
        return FL_ENOMEM;
    }
    kvp_router_apply_result res;
    memset(&res, 0, sizeof res);
    uint64_t calls = redis_calls(x), t0 = now_ns();
    int rc = kvp_router_apply(x->router, x->reps[q->replica].worker, q->seq, &q->b, &res);
    x->apply_ns += now_ns() - t0;
    x->apply_calls += redis_calls(x) - calls;
    x->n_applies++;
    if (rc != KVP_OK) {
        cli_errf(err, err_size, "kvp_router_apply (replica %u, batch %llu): %s%s%s", q->replica,
                 (unsigned long long)q->seq, kvp_strerror(rc), res.why ? ": " : "",
                 res.why ? res.why : "");
        return rc == KVP_ENOMEM ? FL_ENOMEM : FL_EINTERNAL;
    }
    /* RESTARTED: an explicit --redis-prefix reused from an earlier run held this worker. */
    if (res.status != KVP_ROUTER_APPLIED && res.status != KVP_ROUTER_RESTARTED) {
        cli_errf(err, err_size, "kvp_router_apply (replica %u, batch %llu): %s", q->replica,
                 (unsigned long long)q->seq, status_name(res.status));
        return FL_EINTERNAL;
    }
    x->n_events += q->b.n_events;
    for (size_t i = 0; i < q->b.n_events; i++)
        x->n_blocks += q->events[i].n_hashes;
    batch_free(q);
    x->head++;
    return FL_OK;
}

int fl_index_sync(fl_index *x, fl_time now, char *err, size_t err_size)
{
    while (x->head < x->n_queue && x->queue[x->head].due <= now) {
        int rc = apply_head(x, err, err_size);
        if (rc != FL_OK)
            return rc;
    }
    if (x->head == x->n_queue) {
        x->head = x->n_queue = 0;
    } else if (x->head > x->n_queue / 2) {
        memmove(x->queue, x->queue + x->head, (x->n_queue - x->head) * sizeof *x->queue);
        x->n_queue -= x->head;
        x->head = 0;
    }
    return FL_OK;
}

/* ---- scores -------------------------------------------------------------------------------- */

int fl_index_score(fl_index *x, const kvp_key *keys, uint32_t n_keys, uint32_t *cached,
                   uint64_t *ns, char *err, size_t err_size)
{
    if (!cli_grow((void **)&x->hashes, &x->cap_hashes, n_keys ? n_keys : 1, sizeof *x->hashes)) {
        cli_errf(err, err_size, "out of memory");
        return FL_ENOMEM;
    }
    for (uint32_t k = 0; k < n_keys; k++)
        x->hashes[k] = keys[k].lo;
    size_t n_rows = 0;
    uint64_t calls = redis_calls(x), t0 = now_ns();
    int rc = kvp_router_score_hashes(x->router, x->hashes, n_keys, x->rows, x->n, &n_rows);
    *ns = now_ns() - t0;
    x->score_calls += redis_calls(x) - calls;
    if (rc != KVP_OK || n_rows != x->n) {
        cli_errf(err, err_size, "kvp_router_score_hashes: %s (%zu rows for %u replicas)",
                 kvp_strerror(rc), n_rows, x->n);
        return rc == KVP_ENOMEM ? FL_ENOMEM : FL_EINTERNAL;
    }
    for (uint32_t i = 0; i < x->n; i++) {
        const kvp_router_row *row = &x->rows[i];
        if (row->worker >= x->n_map || x->replica[row->worker] >= x->n) {
            cli_errf(err, err_size, "kvp_router_score_hashes: a row for unknown worker %u",
                     row->worker);
            return FL_EINTERNAL;
        }
        cached[x->replica[row->worker]] = row->state == KVP_ROUTER_ROW_SCORED ? row->n_blocks : 0;
    }
    return FL_OK;
}

int fl_index_stats_get(fl_index *x, fl_index_stats *st)
{
    kvp_router_stats rs;
    if (kvp_router_stats_get(x->router, &rs) != KVP_OK)
        return FL_EINTERNAL;
    st->n_applies = x->n_applies;
    st->apply_ns = x->apply_ns;
    st->n_events = x->n_events;
    st->n_blocks = x->n_blocks;
    st->n_redis_calls = rs.n_redis_calls;
    st->n_score_calls = x->score_calls;
    st->n_apply_calls = x->apply_calls;
    st->n_redis_errors = rs.n_redis_errors;
    st->n_fallback_scores = rs.n_fallback_scores;
    st->n_fallback_applies = rs.n_fallback_applies;
    return FL_OK;
}

/* ---- invariants ---------------------------------------------------------------------------- */

/* A collector's records account for exactly its hashes, its lens for its kept tokens. */
static bool rep_check(const fl_index *x, const ix_rep *p)
{
    size_t h = 0, t = 0;
    for (size_t i = 0; i < p->n_recs; i++) {
        const ix_rec *r = &p->recs[i];
        if (r->type == KVP_EVENT_CLEARED ? r->n_hashes != 0 : r->n_hashes == 0)
            return false;
        for (size_t k = h; k < h + r->n_hashes; k++) {
            if (p->lens[k] > (r->type == KVP_EVENT_STORED ? x->bs : 0))
                return false;
            t += p->lens[k];
        }
        h += r->n_hashes;
    }
    return h == p->n_hashes && t == p->n_tokens && p->listed == (p->n_recs > 0);
}

bool fl_index_check(fl_index *x)
{
    uint32_t listed = 0;
    for (uint32_t r = 0; r < x->n; r++) {
        if (!rep_check(x, &x->reps[r]))
            return false;
        listed += x->reps[r].listed;
    }
    if (listed != x->n_dirty || x->head > x->n_queue)
        return false;
    for (size_t i = x->head; i + 1 < x->n_queue; i++)
        if (x->queue[i].due > x->queue[i + 1].due)
            return false;
    return kvp_router_check(x->router) == KVP_OK;
}

/* ---- life ---------------------------------------------------------------------------------- */

/* The router and its n workers. Returns FL_OK or an error with a message. */
static int make_router(fl_index *x, char *err, size_t err_size)
{
    kvp_router_config rc;
    kvp_router_config_init(&rc);
    rc.hash.hash_profile = KVP_HASH_XXH3;
    rc.hash.block_size = x->bs;
    rc.table_seed = UINT64_C(0x726f7574652d6978); /* reproducible table layout */
    if (x->cfg.mode == FL_INDEX_REDIS) {
        rc.redis.url = x->cfg.redis_url;
        rc.redis.key_prefix = x->cfg.key_prefix;
    }
    int e = kvp_router_new(&rc, &x->router);
    if (e != KVP_OK) {
        cli_errf(err, err_size, "kvp_router_new%s%s: %s%s",
                 x->cfg.mode == FL_INDEX_REDIS ? " with --redis " : "",
                 x->cfg.mode == FL_INDEX_REDIS ? x->cfg.redis_url : "", kvp_strerror(e),
                 e == KVP_ENOTSUP ? " (this build has no Redis support: meson option redis, "
                                    "libhiredis-dev)"
                                  : "");
        return e == KVP_ENOMEM ? FL_ENOMEM : FL_EINPUT;
    }
    for (uint32_t r = 0; r < x->n; r++) {
        char name[32];
        snprintf(name, sizeof name, "replica-%u", r);
        kvp_router_worker_config wc;
        kvp_router_worker_config_init(&wc);
        wc.engine_id = name;
        wc.dp_rank = 0;
        wc.hash = rc.hash;
        if ((e = kvp_router_worker_add(x->router, &wc, &x->reps[r].worker)) != KVP_OK) {
            cli_errf(err, err_size, "kvp_router_worker_add (%s): %s", name, kvp_strerror(e));
            return e == KVP_ENOMEM ? FL_ENOMEM : FL_EINTERNAL;
        }
        x->n_map = x->reps[r].worker >= x->n_map ? x->reps[r].worker + 1 : x->n_map;
        x->n_added++;
    }
    return FL_OK;
}

/* The worker id -> replica map. Returns FL_OK or FL_ENOMEM. */
static int make_map(fl_index *x)
{
    x->replica = malloc(x->n_map * sizeof *x->replica);
    if (!x->replica)
        return FL_ENOMEM;
    memset(x->replica, 0xff, x->n_map * sizeof *x->replica);
    for (uint32_t r = 0; r < x->n; r++)
        x->replica[x->reps[r].worker] = r;
    return FL_OK;
}

int fl_index_new(const fl_index_config *cfg, uint32_t n_replicas, uint32_t block_size,
                 fl_index **out, char *err, size_t err_size)
{
    if (cfg->mode != FL_INDEX_MEMORY && cfg->mode != FL_INDEX_REDIS) {
        cli_errf(err, err_size, "invalid index mode %d", cfg->mode);
        return FL_EINTERNAL;
    }
    fl_index *x = calloc(1, sizeof *x);
    if (!x) {
        cli_errf(err, err_size, "out of memory");
        return FL_ENOMEM;
    }
    x->cfg = *cfg;
    x->n = n_replicas;
    x->bs = block_size;
    x->reps = calloc(n_replicas, sizeof *x->reps);
    x->dirty = calloc(n_replicas, sizeof *x->dirty);
    x->rows = calloc(n_replicas, sizeof *x->rows);
    int rc = x->reps && x->dirty && x->rows ? FL_OK : FL_ENOMEM;
    for (uint32_t r = 0; rc == FL_OK && r < n_replicas; r++)
        x->reps[r].x = x;
    if (rc == FL_OK)
        rc = make_router(x, err, err_size);
    else
        cli_errf(err, err_size, "out of memory");
    if (rc == FL_OK && (rc = make_map(x)) != FL_OK)
        cli_errf(err, err_size, "out of memory");
    if (rc != FL_OK) {
        fl_index_free(x);
        return rc;
    }
    *out = x;
    return FL_OK;
}

void fl_index_free(fl_index *x)
{
    if (!x)
        return;
    /* A removal that fails leaves keys behind under the simulation's own prefix, which no
     * other run reads; there is nobody to tell at this point. */
    for (uint32_t r = 0; x->router && x->reps && r < x->n_added; r++)
        if (kvp_router_worker_remove(x->router, x->reps[r].worker) != KVP_OK)
            continue;
    kvp_router_free(x->router);
    for (size_t i = x->head; i < x->n_queue; i++)
        batch_free(&x->queue[i]);
    for (uint32_t r = 0; x->reps && r < x->n; r++) {
        free(x->reps[r].recs);
        free(x->reps[r].hashes);
        free(x->reps[r].lens);
        free(x->reps[r].tokens);
    }
    free(x->queue);
    free(x->reps);
    free(x->dirty);
    free(x->replica);
    free(x->rows);
    free(x->hashes);
    free(x->pad);
    free(x);
}
