/*
 * router_redis_ops.c - the Redis store (router_redis_ops.h): the router_store.h
 * operations over the index and the transport of router_redis.c (which it calls; nothing
 * calls back up): creation, batches, scores, the worker operations, stats and the store's
 * checker.
 *
 * redis_apply (kvp_router_apply, kvp_router_apply_many), under rr->mu:
 *   1. under the exclusive lock: apply every item to the local index as without a store
 *      (validation, sequence state, counters) and build one kvprefix_apply FCALL with the
 *      items the local index accepted (rc KVP_OK, whatever their local status);
 *   2. without the lock: send it (one round trip, one atomic call for all the items);
 *   3. merge: an item's status, expected and stale become Redis's (the fleet's sequence
 *      state); n_stored... stay the local ones. A local GAP that Redis did not see (this
 *      router missed batches that another router applied) is followed locally: the
 *      worker's local view restarts from this batch (cleared, applied, a partial view
 *      that under-reports), so the caller is not sent to replay what the fleet has;
 *   4. on a Redis failure (or in the retry pause) the local results stand, counted as
 *      fallback applies. When Redis returns, its sequence state reports a GAP for the
 *      batches it missed and the caller replays them (local DUPLICATEs, Redis APPLIED);
 *   5. re-seed: the router that finds a worker lost (Redis restarted, flushed or expired
 *      its state; kvprefix_apply remade it from this batch alone) puts its local view back
 *      if that view is at the same batch and not stale, whole or partial (a partial view
 *      holds only blocks stored since it restarted, all held); and while the shared view
 *      is not whole (remade after a loss and not yet re-seeded from a whole view, or stale
 *      and resynced since), a router whose local view is whole (kvp__rt_worker.partial
 *      false) at the same batch puts it back too. kvprefix_reseed (one more round trip,
 *      rare) adds the blocks only if no other router moved the worker's state meanwhile,
 *      and marks the shared view whole when the sender's is. Nothing is lost across a
 *      Redis restart then, for workers that some router followed from their batch 0.
 *
 * redis_score (kvp_router_score, kvp_router_score_hashes and their _v2):
 *   1. under the shared lock: the rows, each live worker's gid, group and block size;
 *   2. without the lock: each group's keys (router_score.c's hashing: every full block of
 *      the prompt; see docs/routing.md for why all of them), or the given hashes for all
 *      workers at once;
 *   3. under rr->mu: one pipeline, one kvprefix_score FCALL per group (a group's rows come
 *      from one atomic call: one consistent state of the store);
 *   4. under the shared lock: rows from the replies, each block weighted by the local
 *      weight of its media (global medium bits mapped to names by the reply's medium
 *      table, then to this router's tiers; a name unknown here weighs unknown_weight),
 *      added block by block in order, as router_score.c adds them; if the worker set
 *      changed meanwhile, start again.
 *   On a Redis failure, or in the retry pause, the local index answers (router_score.c),
 *   counted as a fallback score and reported to the caller of this very call as
 *   KVP_ROUTER_VIEW_FALLBACK (a Redis answer: KVP_ROUTER_VIEW_REDIS). Each row's engine id
 *   is the interned name of router_workers.h, set at step 1 (or by the fallback).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "router_redis_ops.h"

/* What redis_worker_op does, in the store, after the local call. */
enum {
    OP_MARK_STALE = 1, /* kvp_router_mark_stale */
    OP_RESYNC = 2,     /* kvp_router_resync */
    OP_REMOVE = 3      /* kvp_router_worker_remove */
};

static const kvp__rt_store_ops redis_ops;

/* ---------------------------------------------------------------- apply */

/* Per item, what step 1 learned for steps 2-3. */
typedef struct sent_item {
    size_t item;      /* index in items */
    int local;        /* the local status */
    bool local_stale; /* the local view of the worker is stale after the batch */
    bool whole;       /* and it is whole (not partial): see kvp__rt_worker.partial */
    bool reseed;      /* step 5: re-seed the shared view from the local one */
    uint64_t epoch;   /* worker set epoch when built (a follow needs the same worker) */
} sent_item;

/* An event of another KV cache group: skipped, as router_apply.c skips it. */
static inline bool event_skipped(const kvp__rt_index *ix, const kvp_kv_event *e)
{
    return e->group_idx >= 0 && e->group_idx != ix->kv_group;
}

static void put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (56 - 8 * i));
}

/* One event's three arguments: type, medium, hashes (8 bytes each, big-endian). */
static void add_event(kvp__rr_cmd *cmd, const kvp__rt_index *ix, const kvp_kv_event *e)
{
    kvp__rr_cmd_str(cmd, e->type == KVP_EVENT_STORED    ? "S"
                         : e->type == KVP_EVENT_REMOVED ? "R"
                                                        : "C");
    bool dflt = !e->medium || e->medium[0] == '\0';
    kvp__rr_cmd_str(cmd, e->type == KVP_EVENT_CLEARED ? ""
                         : dflt                       ? ix->media[ix->default_medium].name
                                                      : e->medium);
    size_t n = e->type == KVP_EVENT_CLEARED ? 0 : e->n_hashes;
    unsigned char *p = (unsigned char *)kvp__rr_cmd_arg(cmd, 8 * n);
    for (size_t k = 0; p && k < n; k++)
        put_be64(p + 8 * k, e->hashes[k]);
}

/* One batch's arguments (see router_redis.lua, apply_batch). knew: the local index had
 * applied a batch of this worker before this one. Exclusive lock held. */
static void add_batch(kvp__rr_cmd *cmd, const kvp__rt_index *ix, const kvp_router_item *it,
                      bool knew)
{
    const kvp__rt_worker *w = &ix->workers[it->worker];
    const kvp_kv_batch *b = it->batch;
    char *p = kvp__rr_cmd_arg(cmd, KVP__RR_GID_BYTES);
    if (p)
        kvp__rr_gid(w->engine_id, w->engine_len, w->dp_rank, (unsigned char *)p);
    char seq[17];
    snprintf(seq, sizeof seq, "%016llx", (unsigned long long)it->seq);
    kvp__rr_cmd_str(cmd, seq);
    uint64_t ts_bits;
    memcpy(&ts_bits, &b->ts, sizeof ts_bits);
    p = kvp__rr_cmd_arg(cmd, 8);
    if (p)
        put_be64((unsigned char *)p, ts_bits);
    kvp__rr_cmd_str(cmd, knew ? "1" : "0");
    kvp__rr_cmd_str(cmd, w->engine_id);
    kvp__rr_cmd_i64(cmd, w->dp_rank);
    size_t n_ev = 0;
    for (size_t i = 0; i < b->n_events; i++)
        n_ev += !event_skipped(ix, &b->events[i]);
    kvp__rr_cmd_i64(cmd, (int64_t)n_ev);
    for (size_t i = 0; i < b->n_events; i++) {
        const kvp_kv_event *e = &b->events[i];
        if (!event_skipped(ix, e))
            add_event(cmd, ix, e);
    }
}

/* Step 1. Returns the number of items to send (their indexes in sent). */
static size_t apply_local(kvp__rt_index *ix, kvp_router_item *items, size_t n, bool send,
                          kvp__rr_cmd *cmd, sent_item *sent)
{
    size_t n_sent = 0;
    kvp__rt_wrlock(&ix->lock);
    for (size_t i = 0; i < n; i++) {
        kvp_router_item *it = &items[i];
        bool knew = kvp__rt_worker_ok(ix, it->worker) && ix->workers[it->worker].n_batches > 0;
        it->rc = kvp__rt_apply_one_locked(ix, it->worker, it->seq, it->batch, &it->res);
        if (it->rc == KVP_OK && send) {
            bool whole = kvp__rt_worker_ok(ix, it->worker) && !ix->workers[it->worker].partial;
            sent[n_sent] = (sent_item){i, it->res.status, it->res.stale, whole, false, ix->epoch};
            add_batch(cmd, ix, it, knew);
            n_sent++;
        }
    }
    kvp__rt_unlock(&ix->lock);
    return n_sent;
}

/* One batch's result in a kvprefix_apply reply. */
typedef struct store_result {
    int status;        /* KVP_ROUTER_* in the store */
    uint64_t expected; /* the store's next sequence number for the worker */
    bool stale;        /* the shared view is stale */
    bool lost;         /* the store had lost the worker's state: remade by this batch */
    bool full;         /* the shared view is whole (not remade after a loss, not stale since) */
} store_result;

/* A reply element {status, expected (16 hex), stale, lost, full}; false when malformed. */
static bool parse_result(const redisReply *e, store_result *out)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 5 ||
        e->element[0]->type != REDIS_REPLY_INTEGER || e->element[1]->type != REDIS_REPLY_STRING ||
        e->element[1]->len != 16 || e->element[2]->type != REDIS_REPLY_INTEGER ||
        e->element[3]->type != REDIS_REPLY_INTEGER || e->element[4]->type != REDIS_REPLY_INTEGER)
        return false;
    out->status = (int)e->element[0]->integer;
    char *end = NULL;
    out->expected = strtoull(e->element[1]->str, &end, 16);
    out->stale = e->element[2]->integer != 0;
    out->lost = e->element[3]->integer != 0;
    out->full = e->element[4]->integer != 0;
    return out->status >= KVP_ROUTER_APPLIED && out->status <= KVP_ROUTER_GAP && end &&
           *end == '\0';
}

/* Step 3's local follow of item it: restart the worker's local view from this batch. */
static void follow_locked(kvp__rt_index *ix, kvp_router_item *it)
{
    kvp_router_apply_result res;
    kvp__rt_mark_stale_locked(ix, it->worker);
    if (kvp__rt_apply_one_locked(ix, it->worker, it->seq, it->batch, &res) != KVP_OK)
        return;
    ix->workers[it->worker].stale = false;
    it->res.n_stored = res.n_stored;
    it->res.n_removed = res.n_removed;
    it->res.n_cleared = res.n_cleared;
    it->res.n_skipped = res.n_skipped;
}

/* Step 3. false when the reply is malformed (nothing merged). */
static bool merge(kvp__rr *rr, kvp_router_item *items, sent_item *sent, size_t n_sent,
                  const redisReply *rep)
{
    kvp__rt_index *ix = rr->base.ix;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n_sent)
        return false;
    bool follow = false;
    store_result sr;
    for (size_t s = 0; s < n_sent; s++) {
        if (!parse_result(rep->element[s], &sr))
            return false;
    }
    for (size_t s = 0; s < n_sent; s++) {
        (void)parse_result(rep->element[s], &sr);
        kvp_router_item *it = &items[sent[s].item];
        int local = sent[s].local;
        bool local_step = local == KVP_ROUTER_APPLIED || local == KVP_ROUTER_RESTARTED;
        /* Another router applied it first: counted whatever the local view did with it,
         * a gap included (a router that started late); a local DUPLICATE is this
         * router's own repeat, not another router's work. */
        if (sr.status == KVP_ROUTER_DUPLICATE && local != KVP_ROUTER_DUPLICATE)
            atomic_fetch_add(&rr->n_duplicates, 1);
        atomic_fetch_add(&rr->n_lost, sr.lost);
        /* Step 5, at the same batch (checked again, with the local expected, when the
         * re-seed is built): the router that found the loss puts back what it has, whole
         * or partial (every block of a partial view is held); a whole view also repairs a
         * shared view that is not whole, found so by another router. */
        sent[s].reseed = !sr.stale && !sent[s].local_stale && local_step &&
                         sr.status != KVP_ROUTER_GAP && (sr.lost || (!sr.full && sent[s].whole));
        it->res.status = sr.status;
        it->res.expected = sr.expected;
        it->res.stale = sr.stale;
        follow |= local == KVP_ROUTER_GAP && sr.status != KVP_ROUTER_GAP;
    }
    if (!follow)
        return true;
    kvp__rt_wrlock(&ix->lock);
    for (size_t s = 0; s < n_sent; s++) {
        kvp_router_item *it = &items[sent[s].item];
        if (sent[s].local == KVP_ROUTER_GAP && it->res.status != KVP_ROUTER_GAP &&
            ix->epoch == sent[s].epoch)
            follow_locked(ix, it);
    }
    kvp__rt_unlock(&ix->lock);
    return true;
}

/* The FCALL: header, batch count, then the batches' arguments from body. */
static void build_apply(const kvp__rr *rr, const kvp__rr_cmd *body, size_t n_sent, kvp__rr_cmd *cmd)
{
    kvp__rr_cmd_fcall(cmd, rr, "kvprefix_apply");
    kvp__rr_cmd_i64(cmd, (int64_t)rr->ttl_ms);
    kvp__rr_cmd_i64(cmd, (int64_t)n_sent);
    for (size_t a = 0; a < body->argc && !body->failed; a++) {
        char *p = kvp__rr_cmd_arg(cmd, body->arg_len[a]);
        if (p)
            memcpy(p, body->buf + body->off[a], body->arg_len[a]);
    }
    cmd->failed |= body->failed;
}

/* Step 5's blocks of worker id: per local medium, its name and one argument of its
 * blocks (8 bytes each). Two walks of the local table: count, then write (the arguments
 * are all made before any is written: making one may move the others). Shared lock
 * held. */
static void add_worker_blocks_locked(const kvp__rt_index *ix, uint32_t id, kvp__rr_cmd *cmd)
{
    const kvp__rt_table *t = &ix->table;
    size_t n[KVP_ROUTER_MAX_MEDIA] = {0}, at[KVP_ROUTER_MAX_MEDIA] = {0};
    size_t arg[KVP_ROUTER_MAX_MEDIA];
    kvp__rt_holders hs;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t slot = 0; slot < t->cap; slot++) {
            if (t->slots[slot].hv == 0)
                continue;
            kvp__rt_holders_of(t, slot, &hs);
            for (uint32_t j = 0; j < hs.n; j++) {
                if (kvp__rt_holder_worker(hs.h[j]) != id)
                    continue;
                for (uint32_t m = 0; m < ix->n_media; m++) {
                    if (!(kvp__rt_holder_mask(hs.h[j]) >> m & 1u))
                        continue;
                    if (pass == 0)
                        n[m]++;
                    else
                        put_be64((unsigned char *)cmd->buf + cmd->off[arg[m]] + 8 * at[m]++,
                                 t->slots[slot].key);
                }
            }
        }
        for (uint32_t m = 0; pass == 0 && m < ix->n_media; m++) {
            kvp__rr_cmd_str(cmd, ix->media[m].name);
            arg[m] = cmd->argc;
            (void)kvp__rr_cmd_arg(cmd, 8 * n[m]);
        }
        if (cmd->failed)
            return;
    }
}

/* Step 5: re-seed worker it->worker's shared view from the local one, at the same batch:
 * kvprefix_reseed, one more round trip. mu held. */
static void reseed_locked(kvp__rr *rr, const kvp_router_item *it, const sent_item *sent)
{
    kvp__rt_index *ix = rr->base.ix;
    kvp__rr_cmd cmd;
    kvp__rr_cmd_init(&cmd);
    kvp__rr_cmd_fcall(&cmd, rr, "kvprefix_reseed");
    kvp__rr_cmd_i64(&cmd, (int64_t)rr->ttl_ms);
    kvp__rt_rdlock(&ix->lock);
    bool same = ix->epoch == sent->epoch && kvp__rt_worker_ok(ix, it->worker) &&
                ix->workers[it->worker].expected == it->res.expected &&
                !ix->workers[it->worker].stale;
    if (same) {
        const kvp__rt_worker *w = &ix->workers[it->worker];
        char *p = kvp__rr_cmd_arg(&cmd, KVP__RR_GID_BYTES);
        if (p)
            kvp__rr_gid(w->engine_id, w->engine_len, w->dp_rank, (unsigned char *)p);
        char seq[17];
        snprintf(seq, sizeof seq, "%016llx", (unsigned long long)it->res.expected);
        kvp__rr_cmd_str(&cmd, seq);
        kvp__rr_cmd_i64(&cmd, !w->partial);
        kvp__rr_cmd_i64(&cmd, (int64_t)ix->n_media);
        add_worker_blocks_locked(ix, it->worker, &cmd);
    }
    kvp__rt_unlock(&ix->lock);
    redisReply *rep = NULL;
    if (same && kvp__rr_exec_locked(rr, &cmd, 1, &rep, kvp__rr_deadline(rr)) == KVP_OK) {
        if (rep->type != REDIS_REPLY_INTEGER)
            kvp__rr_fail_locked(rr);
        else
            atomic_fetch_add(&rr->n_reseeds, rep->integer == 1);
        kvp__rr_replies_free(&rep, 1);
    }
    kvp__rr_cmd_free(&cmd);
}

/* Steps 2-3 (and 5) with the batches' arguments in body. true when Redis applied them.
 * mu held. */
static bool apply_store_locked(kvp__rr *rr, kvp_router_item *items, sent_item *sent, size_t n_sent,
                               const kvp__rr_cmd *body)
{
    kvp__rr_cmd cmd;
    kvp__rr_cmd_init(&cmd);
    build_apply(rr, body, n_sent, &cmd);
    redisReply *rep = NULL;
    bool applied = false;
    if (kvp__rr_exec_locked(rr, &cmd, 1, &rep, kvp__rr_deadline(rr)) == KVP_OK) {
        applied = merge(rr, items, sent, n_sent, rep);
        if (!applied)
            kvp__rr_fail_locked(rr);
        kvp__rr_replies_free(&rep, 1);
    }
    kvp__rr_cmd_free(&cmd);
    for (size_t s = 0; applied && s < n_sent; s++) {
        if (sent[s].reseed)
            reseed_locked(rr, &items[sent[s].item], &sent[s]);
    }
    return applied;
}

static int redis_apply(kvp__rt_store *st, kvp_router_item *items, size_t n)
{
    kvp__rr *rr = (kvp__rr *)st;
    kvp__rt_index *ix = st->ix;
    sent_item *sent = n ? malloc(n * sizeof *sent) : NULL;
    kvp__rr_cmd body;
    kvp__rr_cmd_init(&body);
    pthread_mutex_lock(&rr->mu);
    /* Step 1: local, and the batches' arguments. */
    bool send = sent && kvp__rr_usable(rr);
    size_t n_sent = apply_local(ix, items, n, send, &body, sent);
    /* Steps 2 and 3. */
    bool applied = n_sent > 0 && apply_store_locked(rr, items, sent, n_sent, &body);
    pthread_mutex_unlock(&rr->mu);
    /* Step 4: batches the store did not take. */
    if (!applied && n_sent > 0)
        atomic_fetch_add(&rr->n_fallback_applies, n_sent);
    else if (!send) {
        for (size_t i = 0; i < n; i++)
            atomic_fetch_add(&rr->n_fallback_applies, items[i].rc == KVP_OK);
    }
    kvp__rr_cmd_free(&body);
    free(sent);
    int first = KVP_OK;
    for (size_t i = 0; i < n && first == KVP_OK; i++)
        first = items[i].rc;
    return first;
}

/* ---------------------------------------------------------------- score */

/* A live worker as step 1 saw it. */
typedef struct score_worker {
    unsigned char gid[KVP__RR_GID_BYTES]; /* fleet-wide id */
    uint32_t row;                         /* its row */
    uint32_t group;                       /* its hash group */
    uint32_t block_size;                  /* its group's block size */
    bool stale;                           /* stale in the local index */
} score_worker;

/* One FCALL: a group's workers (or all workers, for score_hashes) and keys. */
typedef struct score_call {
    const kvp__rt_group *grp; /* the group (NULL: score_hashes) */
    int state;                /* KVP_ROUTER_ROW_SCORED: sent; else the rows' state */
    const uint64_t *keys;     /* the keys probed */
    uint64_t *owned;          /* keys when computed here (malloc), else NULL */
    size_t n_keys;            /* entries at keys */
    size_t first, n;          /* its workers: ws[first .. first + n) */
    size_t cmd;               /* its command and reply, when sent */
} score_call;

typedef struct score_ctx {
    score_worker *ws;      /* live workers, by group */
    size_t n_ws;           /* how many */
    score_call *calls;     /* calls[0 .. n_calls) */
    size_t n_calls;        /* how many */
    kvp__rr_cmd *cmds;     /* commands sent, n_cmds */
    redisReply **replies;  /* their replies */
    size_t n_cmds;         /* how many */
    uint64_t epoch;        /* the worker set's epoch at step 1 */
    double unknown_weight; /* weight of a medium this router does not know */
} score_ctx;

static void ctx_free(score_ctx *c)
{
    for (size_t i = 0; i < c->n_calls; i++)
        free(c->calls[i].owned);
    if (c->replies)
        kvp__rr_replies_free(c->replies, c->n_cmds);
    for (size_t i = 0; c->cmds && i < c->n_cmds; i++)
        kvp__rr_cmd_free(&c->cmds[i]);
    free(c->ws);
    free(c->calls);
    free(c->cmds);
    free(c->replies);
    memset(c, 0, sizeof *c);
}

static int by_group(const void *a, const void *b)
{
    const score_worker *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* Step 1: rows and workers; one call per group (one for all with hashes). Shared lock
 * held. KVP_OK, KVP_ENOSPC (*n_rows set), KVP_ENOMEM. */
static int snapshot_locked(kvp__rt_index *ix, const kvp__rt_query *q, size_t *n_rows, score_ctx *c)
{
    bool all = q->ns == NULL;
    kvp_router_row *rows = q->rows;
    if (q->cap < ix->n_workers) {
        *n_rows = ix->n_workers;
        return KVP_ENOSPC;
    }
    c->epoch = ix->epoch;
    c->unknown_weight = ix->unknown_weight;
    c->ws = malloc((ix->n_workers ? ix->n_workers : 1) * sizeof *c->ws);
    c->calls = malloc((all || ix->n_groups == 0 ? 1 : ix->n_groups) * sizeof *c->calls);
    if (!c->ws || !c->calls)
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < ix->n_slots; i++) {
        const kvp__rt_worker *w = &ix->workers[i];
        if (!w->live)
            continue;
        score_worker *sw = &c->ws[c->n_ws++];
        kvp__rr_gid(w->engine_id, w->engine_len, w->dp_rank, sw->gid);
        sw->row = w->row;
        sw->group = all ? 0 : w->group;
        sw->block_size = ix->groups[w->group]->hash.block_size;
        sw->stale = w->stale;
        kvp_router_row *row = &rows[w->row];
        memset(row, 0, sizeof *row); /* padding too: rows compare with memcmp */
        row->worker = i;
        row->dp_rank = w->dp_rank;
        row->state = w->stale ? KVP_ROUTER_ROW_STALE : KVP_ROUTER_ROW_SCORED;
        if (q->engine_ids)
            q->engine_ids[w->row] = w->engine_id; /* interned: outlives the worker */
    }
    qsort(c->ws, c->n_ws, sizeof *c->ws, by_group);
    for (size_t i = 0; i < c->n_ws; i++) {
        if (i == 0 || c->ws[i].group != c->ws[i - 1].group) {
            score_call *call = &c->calls[c->n_calls++];
            memset(call, 0, sizeof *call);
            call->grp = all ? NULL : ix->groups[c->ws[i].group];
            call->first = i;
        }
        c->calls[c->n_calls - 1].n++;
    }
    *n_rows = ix->n_workers;
    return KVP_OK;
}

/* Step 2: each call's keys. KVP_OK, KVP_EINVAL, KVP_ENOMEM. */
static int compute_keys(score_ctx *c, const kvp_namespace *ns, const uint32_t *tokens,
                        size_t n_tokens, const uint64_t *hashes, size_t n_hashes)
{
    for (size_t i = 0; i < c->n_calls; i++) {
        score_call *call = &c->calls[i];
        call->state = KVP_ROUTER_ROW_SCORED;
        if (!call->grp) {
            call->keys = hashes;
            call->n_keys = n_hashes;
            continue;
        }
        size_t n = n_tokens / call->grp->hash.block_size;
        call->owned = malloc((n ? n : 1) * sizeof *call->owned);
        if (!call->owned)
            return KVP_ENOMEM;
        int rc = kvp__rt_group_keys(call->grp, ns, tokens, n_tokens, call->owned, &call->state);
        if (rc != KVP_OK)
            return rc;
        call->keys = call->owned;
        call->n_keys = call->state == KVP_ROUTER_ROW_SCORED ? n : 0;
    }
    return KVP_OK;
}

/* Step 3's commands: kvprefix_score P gids blocks, for each call to send. */
static int build_scores(const kvp__rr *rr, score_ctx *c)
{
    c->cmds = calloc(c->n_calls ? c->n_calls : 1, sizeof *c->cmds);
    c->replies = calloc(c->n_calls ? c->n_calls : 1, sizeof(redisReply *));
    if (!c->cmds || !c->replies)
        return KVP_ENOMEM;
    for (size_t i = 0; i < c->n_calls; i++) {
        score_call *call = &c->calls[i];
        if (call->state != KVP_ROUTER_ROW_SCORED)
            continue;
        call->cmd = c->n_cmds++;
        kvp__rr_cmd *cmd = &c->cmds[call->cmd];
        kvp__rr_cmd_init(cmd);
        kvp__rr_cmd_fcall(cmd, rr, "kvprefix_score");
        unsigned char *p = (unsigned char *)kvp__rr_cmd_arg(cmd, KVP__RR_GID_BYTES * call->n);
        for (size_t w = 0; p && w < call->n; w++)
            memcpy(p + KVP__RR_GID_BYTES * w, c->ws[call->first + w].gid, KVP__RR_GID_BYTES);
        p = (unsigned char *)kvp__rr_cmd_arg(cmd, 8 * call->n_keys);
        for (size_t k = 0; p && k < call->n_keys; k++)
            put_be64(p + 8 * k, call->keys[k]);
        if (cmd->failed)
            return KVP_ENOMEM;
    }
    return KVP_OK;
}

/* The local weight of each global medium bit, from a reply's medium table (name, bit
 * pairs). false when malformed. Shared lock held. */
static bool media_weights_locked(const kvp__rt_index *ix, const redisReply *m, double unknown,
                                 double *w_bit)
{
    for (uint32_t b = 0; b < KVP_ROUTER_MAX_MEDIA; b++)
        w_bit[b] = unknown;
    if (m->type != REDIS_REPLY_ARRAY || m->elements % 2 != 0)
        return false;
    for (size_t i = 0; i < m->elements; i += 2) {
        const redisReply *name = m->element[i], *bit = m->element[i + 1];
        if (name->type != REDIS_REPLY_STRING || bit->type != REDIS_REPLY_STRING)
            return false;
        long b = strtol(bit->str, NULL, 10);
        if (b < 0 || b >= (long)KVP_ROUTER_MAX_MEDIA)
            return false;
        uint32_t idx = kvp__rt_medium_find(ix, name->str);
        w_bit[b] = idx == KVP__RT_NIL ? unknown : ix->media[idx].weight;
    }
    return true;
}

/* The best weight of a global media mask (as the index's weight_of_mask). */
static double mask_weight(const double *w_bit, long long mask)
{
    double best = 0;
    for (uint32_t b = 0; b < KVP_ROUTER_MAX_MEDIA; b++) {
        if ((mask >> b & 1) && w_bit[b] > best)
            best = w_bit[b];
    }
    return best;
}

/* One worker's row from its reply element {state, n_blocks, mask, count ...}. false when
 * malformed. */
static bool fill_row(const score_worker *sw, const redisReply *e, size_t n_keys,
                     const double *w_bit, kvp_router_row *row)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->elements % 2 != 0)
        return false;
    for (size_t i = 0; i < e->elements; i++) {
        if (e->element[i]->type != REDIS_REPLY_INTEGER || e->element[i]->integer < 0)
            return false;
    }
    long long n_blocks = e->element[1]->integer, seen = 0;
    if (n_blocks > (long long)n_keys)
        return false;
    row->state = e->element[0]->integer == 1 ? KVP_ROUTER_ROW_STALE : KVP_ROUTER_ROW_SCORED;
    row->n_blocks = 0;
    row->n_tokens = 0;
    row->score = 0;
    if (row->state == KVP_ROUTER_ROW_STALE)
        return true;
    for (size_t i = 2; i < e->elements; i += 2) {
        double w = mask_weight(w_bit, e->element[i]->integer);
        long long count = e->element[i + 1]->integer;
        for (long long k = 0; k < count && seen < n_blocks; k++, seen++)
            row->score += w; /* block by block, as router_score.c adds them */
    }
    row->n_blocks = (uint32_t)n_blocks;
    row->n_tokens = (uint64_t)n_blocks * sw->block_size;
    return seen == n_blocks;
}

/* Step 4 for one call. false when its reply is malformed. Shared lock held. */
static bool fill_call_locked(const kvp__rt_index *ix, const score_ctx *c, const score_call *call,
                             kvp_router_row *rows)
{
    if (call->state != KVP_ROUTER_ROW_SCORED) {
        for (size_t w = 0; w < call->n; w++) {
            const score_worker *sw = &c->ws[call->first + w];
            rows[sw->row].state = sw->stale ? KVP_ROUTER_ROW_STALE : call->state;
        }
        return true;
    }
    const redisReply *rep = c->replies[call->cmd];
    double w_bit[KVP_ROUTER_MAX_MEDIA];
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        !media_weights_locked(ix, rep->element[0], c->unknown_weight, w_bit) ||
        rep->element[1]->type != REDIS_REPLY_ARRAY || rep->element[1]->elements != call->n)
        return false;
    for (size_t w = 0; w < call->n; w++) {
        const score_worker *sw = &c->ws[call->first + w];
        if (!fill_row(sw, rep->element[1]->element[w], call->n_keys, w_bit, &rows[sw->row]))
            return false;
    }
    return true;
}

/* Steps 1-4 once. Returns KVP_OK, a failure code of the call, 1 (start again: the worker
 * set changed) or 2 (Redis failed: answer locally). */
static int score_once(kvp__rr *rr, const kvp__rt_query *q, size_t *n_rows)
{
    kvp__rt_index *ix = rr->base.ix;
    score_ctx c;
    memset(&c, 0, sizeof c);
    /* Step 1: rows and workers. */
    kvp__rt_rdlock(&ix->lock);
    int rc = snapshot_locked(ix, q, n_rows, &c);
    kvp__rt_unlock(&ix->lock);
    /* Step 2: keys. */
    if (rc == KVP_OK)
        rc = compute_keys(&c, q->ns, q->tokens, q->n_tokens, q->hashes, q->n_hashes);
    if (rc == KVP_OK)
        rc = build_scores(rr, &c);
    /* Step 3: one round trip. */
    if (rc == KVP_OK && c.n_cmds > 0) {
        pthread_mutex_lock(&rr->mu);
        rc = kvp__rr_exec_locked(rr, c.cmds, c.n_cmds, c.replies, kvp__rr_deadline(rr));
        pthread_mutex_unlock(&rr->mu);
        rc = rc == KVP_EIO ? 2 : rc;
    }
    /* Step 4: rows. */
    bool malformed = false;
    if (rc == KVP_OK) {
        kvp__rt_rdlock(&ix->lock);
        rc = ix->epoch != c.epoch ? 1 : KVP_OK;
        for (size_t i = 0; rc == KVP_OK && i < c.n_calls; i++)
            malformed |= !fill_call_locked(ix, &c, &c.calls[i], q->rows);
        kvp__rt_unlock(&ix->lock);
    }
    if (malformed) {
        pthread_mutex_lock(&rr->mu);
        kvp__rr_fail_locked(rr);
        pthread_mutex_unlock(&rr->mu);
        rc = 2;
    }
    ctx_free(&c);
    return rc;
}

static int redis_score(kvp__rt_store *s, const kvp__rt_query *q, size_t *n_rows, int *view)
{
    kvp__rr *rr = (kvp__rr *)s;
    int rc = 2;
    while (kvp__rr_usable(rr)) {
        rc = score_once(rr, q, n_rows);
        if (rc != 1)
            break;
    }
    if (rc == KVP_OK) {
        atomic_fetch_add_explicit(&s->ix->n_scores, 1, memory_order_relaxed);
        *view = KVP_ROUTER_VIEW_REDIS;
        return KVP_OK;
    }
    if (rc != 2)
        return rc;
    /* Redis failed or is paused: the local view answers, and this call says so. */
    atomic_fetch_add(&rr->n_fallback_scores, 1);
    *view = KVP_ROUTER_VIEW_FALLBACK;
    return kvp__rt_score(s->ix, q, n_rows);
}

/* ---------------------------------------------------------------- lifecycle, stats */

/* Close the connection and free the store. */
static void rr_free(kvp__rr *rr)
{
    kvp__rr_conn_close(rr);
    pthread_mutex_destroy(&rr->mu);
    free(rr);
}

static void redis_free(kvp__rt_store *s)
{
    rr_free((kvp__rr *)s);
}

int kvp__rr_new(kvp__rt_index *ix, const kvp_router_redis *cfg, kvp__rt_store **out)
{
    kvp__rr *rr = calloc(1, sizeof *rr);
    if (!rr)
        return KVP_ENOMEM;
    if (pthread_mutex_init(&rr->mu, NULL) != 0) {
        free(rr);
        return KVP_ENOMEM;
    }
    rr->base.ops = &redis_ops;
    rr->base.ix = ix;
    int rc = kvp__rr_conn_open(rr, cfg);
    if (rc != KVP_OK) {
        rr_free(rr);
        return rc;
    }
    *out = &rr->base;
    return KVP_OK;
}

static void redis_stats(kvp__rt_store *s, kvp_router_stats *st)
{
    kvp__rr *rr = (kvp__rr *)s;
    st->redis = true;
    st->redis_up = atomic_load(&rr->up);
    st->n_redis_calls = atomic_load(&rr->n_calls);
    st->n_redis_errors = atomic_load(&rr->n_errors);
    st->n_redis_connects = atomic_load(&rr->n_connects);
    st->n_fallback_scores = atomic_load(&rr->n_fallback_scores);
    st->n_fallback_applies = atomic_load(&rr->n_fallback_applies);
    st->n_redis_lost = atomic_load(&rr->n_lost);
    st->n_redis_duplicates = atomic_load(&rr->n_duplicates);
    st->n_redis_reseeds = atomic_load(&rr->n_reseeds);
}

/* ---------------------------------------------------------------- worker operations */

/* The local part of redis_worker_op; copies the worker's gid and identity first.
 * Exclusive lock held. */
static int local_op_locked(kvp__rt_index *ix, uint32_t id, int op, unsigned char *gid,
                           char **engine, int64_t *dp)
{
    if (!kvp__rt_worker_ok(ix, id))
        return KVP_ENOENT;
    const kvp__rt_worker *w = &ix->workers[id];
    kvp__rr_gid(w->engine_id, w->engine_len, w->dp_rank, gid);
    *engine = strdup(w->engine_id);
    *dp = w->dp_rank;
    if (op == OP_MARK_STALE)
        kvp__rt_mark_stale_locked(ix, id);
    else if (op == OP_RESYNC)
        return kvp__rt_resync_locked(ix, id);
    else
        return kvp__rt_worker_remove_locked(ix, id);
    return KVP_OK;
}

/* The Redis part: one FCALL. mu held. */
static void store_op_locked(kvp__rr *rr, int op, const unsigned char *gid, const char *engine,
                            int64_t dp)
{
    static const char *const fn[] = {"", "kvprefix_mark_stale", "kvprefix_resync",
                                     "kvprefix_remove"};
    kvp__rr_cmd cmd;
    kvp__rr_cmd_init(&cmd);
    kvp__rr_cmd_fcall(&cmd, rr, fn[op]);
    if (op == OP_MARK_STALE)
        kvp__rr_cmd_i64(&cmd, (int64_t)rr->ttl_ms);
    char *p = kvp__rr_cmd_arg(&cmd, KVP__RR_GID_BYTES);
    if (p)
        memcpy(p, gid, KVP__RR_GID_BYTES);
    if (op == OP_MARK_STALE) {
        kvp__rr_cmd_str(&cmd, engine);
        kvp__rr_cmd_i64(&cmd, dp);
    }
    redisReply *rep = NULL;
    if (kvp__rr_exec_locked(rr, &cmd, 1, &rep, kvp__rr_deadline(rr)) == KVP_OK) {
        if (rep->type != REDIS_REPLY_INTEGER)
            kvp__rr_fail_locked(rr);
        kvp__rr_replies_free(&rep, 1);
    }
    kvp__rr_cmd_free(&cmd);
}

/* mark_stale, resync or worker_remove (op): the local call, then the same in Redis when
 * the local one succeeded. Returns the local call's code. */
static int redis_worker_op(kvp__rr *rr, uint32_t id, int op)
{
    kvp__rt_index *ix = rr->base.ix;
    unsigned char gid[KVP__RR_GID_BYTES];
    char *engine = NULL;
    int64_t dp = 0;
    pthread_mutex_lock(&rr->mu);
    kvp__rt_wrlock(&ix->lock);
    int rc = local_op_locked(ix, id, op, gid, &engine, &dp);
    kvp__rt_unlock(&ix->lock);
    if (rc == KVP_OK && engine)
        store_op_locked(rr, op, gid, engine, dp);
    pthread_mutex_unlock(&rr->mu);
    free(engine);
    return rc;
}

static int redis_worker_remove(kvp__rt_store *s, uint32_t id)
{
    return redis_worker_op((kvp__rr *)s, id, OP_REMOVE);
}

static int redis_mark_stale(kvp__rt_store *s, uint32_t id)
{
    return redis_worker_op((kvp__rr *)s, id, OP_MARK_STALE);
}

static int redis_resync(kvp__rt_store *s, uint32_t id)
{
    return redis_worker_op((kvp__rr *)s, id, OP_RESYNC);
}

/* ---------------------------------------------------------------- checker */

/* The checker's verdicts, as static strings (the reply's own text dies with the reply). */
static const char *const check_whys[] = {
    "media: a bit outside 0..5",
    "media: a bit given twice",
    "media: a name not in upper case",
    "worker state: expected is not 16 hex digits",
    "worker state: known, stale or full is not 0 or 1",
    "worker state: n differs from the blocks held",
    "blocks: a block key is not 8 bytes",
    "blocks: a mask is 0 or names an unregistered medium",
};

static const char *static_why(const char *s, size_t len)
{
    for (size_t i = 0; i < sizeof check_whys / sizeof *check_whys; i++) {
        if (strlen(check_whys[i]) == len && memcmp(check_whys[i], s, len) == 0)
            return check_whys[i];
    }
    return "the store's checker returned an unknown verdict";
}

int kvp__rr_check(kvp__rt_store *s, const char **why)
{
    if (!s || s->ops != &redis_ops)
        return KVP_EINVAL;
    kvp__rr *rr = (kvp__rr *)s;
    kvp__rr_cmd cmd;
    kvp__rr_cmd_init(&cmd);
    kvp__rr_cmd_fcall(&cmd, rr, "kvprefix_check");
    redisReply *rep = NULL;
    pthread_mutex_lock(&rr->mu);
    int rc = kvp__rr_exec_locked(rr, &cmd, 1, &rep, kvp__rr_deadline(rr));
    if (rc == KVP_OK) {
        bool ok = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                  rep->element[0]->type == REDIS_REPLY_INTEGER &&
                  rep->element[1]->type == REDIS_REPLY_STRING;
        if (!ok)
            kvp__rr_fail_locked(rr);
        rc = !ok ? KVP_EIO : rep->element[0]->integer == 1 ? KVP_OK : KVP_ECORRUPT;
        if (rc == KVP_ECORRUPT && why)
            *why = static_why(rep->element[1]->str, rep->element[1]->len);
        kvp__rr_replies_free(&rep, 1);
    }
    pthread_mutex_unlock(&rr->mu);
    kvp__rr_cmd_free(&cmd);
    return rc;
}

/* ---------------------------------------------------------------- the store */

static const kvp__rt_store_ops redis_ops = {
    .name = "redis",
    .apply = redis_apply,
    .score = redis_score,
    .worker_add = kvp__rt_local_worker_add, /* workers reach Redis with their first batch */
    .worker_remove = redis_worker_remove,
    .mark_stale = redis_mark_stale,
    .resync = redis_resync,
    .stats = redis_stats,
    .check = kvp__rt_local_check, /* kvp_router_check is about the local view */
    .free = redis_free,
};
