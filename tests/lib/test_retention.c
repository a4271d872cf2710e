/*
 * test_retention.c - retention priorities (kvp_retention): a reference model of the
 * priority rules checked against the library on random call sequences under each eviction
 * policy, with and without quotas; hand cases (a system prompt that survives a scan which
 * evicts it under plain LRU, a duration that lapses, several requests setting one block, the
 * acquire/release path); argument errors; and the checker catching corruptions.
 *
 * The model is written from the contract in kvprefix.h ("Retention priorities"), not from
 * retention.c. It keeps, per prefix node of a small tree of prompts (blocks of one token):
 * whether the node is cached, its record (priority or unset, expiry), and where it waits: in
 * the "default order" (the policy's) or on the queue of its priority, each with the serial of
 * its entry there. A call of kvp_access_retained runs as the contract says: every node of the
 * path is held in order (cached ones pinned, missing ones stored in a free block or in the
 * victim's: first the lapsed queued nodes move to the default order by (expiry, entry),
 * then the victim is the oldest of the lowest queue below 35, else the default order's
 * victim, else the oldest of the lowest queue above 35); then the path is released from its
 * last node to its first, each node noting the request's priority for it (highest covering
 * range, else the request's own; a higher record wins, an equal one keeps the later expiry)
 * and joining its queue or the default order; with quotas, a scope over its quota then loses
 * its lowest-priority cached node, the least recently released first.
 *
 * The library's events say what it did (REMOVED, STORED, in order); the model consumes them
 * step by step. Under LRU the default order's victim is the oldest entry, and the model
 * demands exactly that block; under SLRU and S3-FIFO the policy chooses among the default
 * nodes, so the model accepts any cached default node there (and demands the exact node
 * everywhere else). After each call every node's cached state and every cached block's
 * effective priority (kvp_block_retention) are compared, and kvp_cache_check runs.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "testutil.h"

#define FAN       3
#define DEPTH     4
#define N_NS      2
#define MAX_NODES (FAN + FAN * FAN + FAN * FAN * FAN + FAN * FAN * FAN * FAN)
#define UNSET     255
#define DEF       35

/* ---------------------------------------------------------------------------------------- */
/* The model                                                                                */
/* ---------------------------------------------------------------------------------------- */

enum { W_NONE, W_DEFAULT, W_QUEUE };

typedef struct mnode {
    bool cached;     /* stored and not evicted */
    bool held;       /* pinned by the running call */
    int prio;        /* record: UNSET or 0..100 */
    uint64_t expire; /* record's lapse time, 0: never */
    int where;       /* W_*: where a cached, unheld node waits */
    uint64_t entry;  /* serial of its entry in the default order or its queue */
    uint64_t qseq;   /* serial of its last release (its scope's order) */
    uint32_t block;  /* the library's block id while cached */
} mnode;

typedef struct model {
    mnode node[N_NS][MAX_NODES];
    kvp_key key[N_NS][MAX_NODES]; /* each node's block key (kvp_cache_keys) */
    uint32_t n_free;              /* blocks never used or freed */
    uint64_t serial;              /* entries handed out */
    uint64_t now;                 /* retention clock: requests so far */
    uint32_t quota;               /* 0: quotas off; else each namespace's quota */
    bool exact_default;           /* LRU: the default order's victim is its oldest entry */
} model;

static th_events g_ev;
static size_t g_ev_pos;

static int node_of(const uint32_t *t, size_t d)
{
    int base = 0, level = 1, v = 0;
    for (size_t i = 1; i < d; i++) {
        level *= FAN;
        base += level;
    }
    for (size_t i = 0; i < d; i++)
        v = v * FAN + (int)(t[i] - 1);
    return base + v;
}

static bool is_set(const model *m, const mnode *x)
{
    return x->prio != UNSET && (x->expire == 0 || m->now < x->expire);
}

static int eff(const model *m, const mnode *x)
{
    return is_set(m, x) ? x->prio : DEF;
}

/* The next event the library emitted, which must be of this type. */
static const kvp_event *next_event(int type)
{
    cr_assert(g_ev_pos < g_ev.n, "model expects an event of type %d, the library sent none", type);
    const kvp_event *ev = &g_ev.ev[g_ev_pos++];
    cr_assert_eq(ev->type, type, "model expects event type %d, library sent %d", type, ev->type);
    return ev;
}

static void find_node(const model *m, kvp_key key, int *ns, int *id)
{
    for (int s = 0; s < N_NS; s++)
        for (int i = 0; i < MAX_NODES; i++)
            if (th_key_eq(m->key[s][i], key)) {
                *ns = s;
                *id = i;
                return;
            }
    cr_assert_fail("the library removed a key the model does not know");
}

/* The node the library evicted now (the next REMOVED event), checked against the model's
 * candidates: the exact node want (ns, id) unless want_ns < 0, which accepts any cached,
 * unheld node waiting in the default order. */
static mnode *take_victim(model *m, int want_ns, int want_id)
{
    const kvp_event *ev = next_event(KVP_EVENT_REMOVED);
    cr_assert_eq(ev->reason, KVP_REMOVED_EVICTED);
    int ns = -1, id = -1;
    find_node(m, ev->key, &ns, &id);
    mnode *x = &m->node[ns][id];
    if (want_ns >= 0)
        cr_assert(ns == want_ns && id == want_id,
                  "library evicted node %d/%d, the model's victim is %d/%d", ns, id, want_ns,
                  want_id);
    else
        cr_assert(x->cached && !x->held && x->where == W_DEFAULT,
                  "library evicted node %d/%d, not a cached node of default priority", ns, id);
    cr_assert_eq(ev->block_id, x->block);
    x->cached = false;
    x->where = W_NONE;
    x->prio = UNSET;
    x->expire = 0;
    return x;
}

/* Lapsed queued nodes join the default order, earliest (expiry, entry) first. */
static void refresh(model *m)
{
    for (;;) {
        mnode *best = NULL;
        for (int s = 0; s < N_NS; s++)
            for (int i = 0; i < MAX_NODES; i++) {
                mnode *x = &m->node[s][i];
                if (!x->cached || x->held || x->where != W_QUEUE || x->expire == 0 ||
                    x->expire > m->now)
                    continue;
                if (!best || x->expire < best->expire ||
                    (x->expire == best->expire && x->entry < best->entry))
                    best = x;
            }
        if (!best)
            return;
        best->where = W_DEFAULT;
        best->entry = ++m->serial;
        best->prio = UNSET;
        best->expire = 0;
    }
}

/* The oldest queued node of the lowest priority in [lo, hi], or NULL. */
static mnode *oldest_queued(model *m, int lo, int hi, int *ns_out, int *id_out)
{
    mnode *best = NULL;
    for (int s = 0; s < N_NS; s++)
        for (int i = 0; i < MAX_NODES; i++) {
            mnode *x = &m->node[s][i];
            if (!x->cached || x->held || x->where != W_QUEUE || x->prio < lo || x->prio > hi)
                continue;
            if (!best || x->prio < best->prio ||
                (x->prio == best->prio && x->entry < best->entry)) {
                best = x;
                *ns_out = s;
                *id_out = i;
            }
        }
    return best;
}

/* Make room for one block: a free one, else the victim (checked against the library). */
static void model_take(model *m)
{
    if (m->n_free > 0) {
        m->n_free--;
        return;
    }
    refresh(m);
    int ns = -1, id = -1;
    if (oldest_queued(m, 0, DEF - 1, &ns, &id)) {
        take_victim(m, ns, id);
        return;
    }
    mnode *best = NULL;
    for (int s = 0; s < N_NS; s++)
        for (int i = 0; i < MAX_NODES; i++) {
            mnode *x = &m->node[s][i];
            if (x->cached && !x->held && x->where == W_DEFAULT &&
                (!best || x->entry < best->entry)) {
                best = x;
                ns = s;
                id = i;
            }
        }
    if (best) {
        if (m->exact_default)
            take_victim(m, ns, id);
        else
            take_victim(m, -1, -1);
        return;
    }
    cr_assert(oldest_queued(m, DEF + 1, 100, &ns, &id), "model: nothing to evict");
    take_victim(m, ns, id);
}

/* The priority and duration the options give node depth i (block i: token i). */
static void setting_for(const kvp_retention *r, uint32_t i, int *q, uint64_t *d)
{
    int best = -1;
    uint64_t dur = 0;
    for (size_t k = 0; k < r->n_ranges; k++) {
        const kvp_retention_range *g = &r->ranges[k];
        if (!(g->token_start <= i && i + 1 <= g->token_end))
            continue;
        if ((int)g->priority > best) {
            best = (int)g->priority;
            dur = g->duration;
        } else if ((int)g->priority == best && dur != 0 &&
                   (g->duration == 0 || g->duration > dur)) {
            dur = g->duration;
        }
    }
    if (best < 0) {
        best = (int)r->priority;
        dur = r->duration;
    }
    *q = best;
    *d = dur;
}

static void note(model *m, mnode *x, int q, uint64_t d)
{
    uint64_t e = d ? m->now + d : 0;
    if (!is_set(m, x) || q > x->prio) {
        x->prio = q;
        x->expire = e;
    } else if (q == x->prio && x->expire != 0 && (e == 0 || e > x->expire)) {
        x->expire = e;
    }
}

/* A scope over its quota loses its lowest-priority cached node, oldest release first. */
static void quota_evict(model *m, int ns)
{
    uint32_t n = 0;
    for (int i = 0; i < MAX_NODES; i++)
        n += m->node[ns][i].cached && !m->node[ns][i].held;
    if (!m->quota || n <= m->quota)
        return;
    int best = -1;
    for (int i = 0; i < MAX_NODES; i++) {
        mnode *x = &m->node[ns][i];
        if (!x->cached || x->held)
            continue;
        if (best < 0 || eff(m, x) < eff(m, &m->node[ns][best]) ||
            (eff(m, x) == eff(m, &m->node[ns][best]) && x->qseq < m->node[ns][best].qseq))
            best = i;
    }
    take_victim(m, ns, best);
    m->n_free++;
}

/* One kvp_access_retained (r NULL: kvp_access) of path t[0 .. d) in namespace ns. */
static void model_access(model *m, int ns, const uint32_t *t, size_t d, const kvp_retention *r)
{
    int path[DEPTH];
    size_t n_held = 0;
    for (size_t i = 0; i < d; i++) {
        mnode *x = &m->node[ns][node_of(t, i + 1)];
        path[i] = node_of(t, i + 1);
        if (x->cached) {
            x->held = true;
            x->where = W_NONE;
        } else {
            uint32_t avail = m->n_free;
            for (int s = 0; s < N_NS; s++)
                for (int k = 0; k < MAX_NODES; k++)
                    avail += m->node[s][k].cached && !m->node[s][k].held;
            if (avail == 0)
                break;
            model_take(m);
            const kvp_event *ev = next_event(KVP_EVENT_STORED);
            cr_assert(th_key_eq(ev->key, m->key[ns][path[i]]),
                      "stored key is not the model's node");
            x->cached = true;
            x->held = true;
            x->where = W_NONE;
            x->prio = UNSET;
            x->expire = 0;
            x->block = ev->block_id;
        }
        n_held = i + 1;
    }
    for (size_t i = n_held; i-- > 0;) {
        mnode *x = &m->node[ns][path[i]];
        if (r) {
            int q;
            uint64_t dd;
            setting_for(r, (uint32_t)i, &q, &dd);
            note(m, x, q, dd);
        }
        x->held = false;
        x->qseq = ++m->serial;
        if (is_set(m, x) && x->prio != DEF) {
            x->where = W_QUEUE;
        } else {
            if (!is_set(m, x)) {
                x->prio = UNSET;
                x->expire = 0;
            }
            x->where = W_DEFAULT;
        }
        x->entry = ++m->serial;
        quota_evict(m, ns);
    }
    m->now++;
}

/* ---------------------------------------------------------------------------------------- */
/* The random comparison                                                                    */
/* ---------------------------------------------------------------------------------------- */

static void ns_of(int s, kvp_namespace *ns)
{
    th_ns(ns, "m", NULL, s == 0 ? "alice" : "bob", NULL);
}

/* Compare every node's cached state and every cached block's effective priority. */
static void compare(kvp_cache *c, const model *m)
{
    uint32_t n_cached = 0;
    for (int s = 0; s < N_NS; s++) {
        kvp_namespace ns;
        ns_of(s, &ns);
        for (int i = 0; i < MAX_NODES; i++) {
            const mnode *x = &m->node[s][i];
            cr_assert(!x->held);
            if (!x->cached)
                continue;
            n_cached++;
            int p = -1;
            cr_assert_eq(kvp_block_retention(c, x->block, &p), KVP_OK);
            cr_assert_eq(p, eff(m, x), "node %d/%d: library priority %d, model %d", s, i, p,
                         eff(m, x));
        }
    }
    kvp_stats st = th_stats(c);
    cr_assert_eq(st.n_blocks_cached, n_cached, "library caches %u blocks, the model %u",
                 st.n_blocks_cached, n_cached);
    cr_assert_eq(st.n_blocks_free, m->n_free);
    cr_assert_eq(st.n_requests, m->now);
}

static uint32_t pick_prio(uint64_t *rng)
{
    static const uint32_t common[] = {0, 10, 34, 35, 36, 60, 100};
    uint64_t v = th_rand(rng);
    return v % 3 ? common[v / 3 % 7] : (uint32_t)(v / 3 % 101);
}

static uint64_t pick_duration(uint64_t *rng)
{
    static const uint64_t d[] = {0, 0, 1, 2, 5, 20};
    return d[th_rand(rng) % 6];
}

static void run_random(int eviction, uint32_t quota, uint64_t seed, int steps)
{
    static model m;
    memset(&m, 0, sizeof m);
    const uint32_t n_blocks = 12;
    kvp_config cfg = th_config(n_blocks, 1, false, th_events_fn, &g_ev);
    cfg.eviction = eviction;
    cfg.ns_quota = quota;
    kvp_cache *c = th_cache_new(&cfg);
    m.n_free = n_blocks;
    m.quota = quota;
    m.exact_default = eviction == KVP_EVICT_LRU;
    for (int s = 0; s < N_NS; s++) {
        kvp_namespace ns;
        ns_of(s, &ns);
        for (int i = 0; i < MAX_NODES; i++) {
            /* The node's path: invert node_of by trying every path (the tree is small). */
            uint32_t t[DEPTH];
            for (size_t d = 1; d <= DEPTH; d++) {
                uint32_t count = 1;
                for (size_t k = 0; k < d; k++)
                    count *= FAN;
                for (uint32_t v = 0; v < count; v++) {
                    uint32_t w = v;
                    for (size_t k = d; k-- > 0;) {
                        t[k] = w % FAN + 1;
                        w /= FAN;
                    }
                    if (node_of(t, d) == i) {
                        kvp_key root, keys[DEPTH];
                        size_t n_keys;
                        cr_assert_eq(kvp_cache_keys(c, &ns, t, d, &root, keys, DEPTH, &n_keys),
                                     KVP_OK);
                        m.key[s][i] = keys[d - 1];
                    }
                }
            }
        }
    }
    uint64_t rng = seed;
    for (int step = 0; step < steps; step++) {
        int s = (int)(th_rand(&rng) % N_NS);
        kvp_namespace ns;
        ns_of(s, &ns);
        uint32_t t[DEPTH];
        size_t d = 1 + th_rand(&rng) % DEPTH;
        for (size_t k = 0; k < d; k++)
            t[k] = (uint32_t)(th_rand(&rng) % FAN) + 1;
        kvp_retention r;
        kvp_retention_range ranges[3];
        kvp_retention_init(&r);
        bool with = th_rand(&rng) % 3 != 0;
        if (with) {
            r.priority = pick_prio(&rng);
            r.duration = pick_duration(&rng);
            r.n_ranges = th_rand(&rng) % 4;
            for (size_t k = 0; k < r.n_ranges; k++) {
                uint64_t a = th_rand(&rng) % d, b = a + 1 + th_rand(&rng) % (d - a);
                ranges[k] = (kvp_retention_range){a, b, pick_prio(&rng), pick_duration(&rng)};
            }
            r.ranges = r.n_ranges ? ranges : NULL;
        }
        g_ev.n = 0;
        g_ev_pos = 0;
        kvp_match out;
        int rc =
            with ? kvp_access_retained(c, &ns, t, d, &r, &out) : kvp_access(c, &ns, t, d, &out);
        cr_assert_eq(rc, KVP_OK, "step %d: %s", step, kvp_errmsg());
        model_access(&m, s, t, d, with ? &r : NULL);
        cr_assert_eq(g_ev_pos, g_ev.n, "step %d: the library sent %zu events, the model used %zu",
                     step, g_ev.n, g_ev_pos);
        TH_CHECK(c);
        compare(c, &m);
    }
    kvp_cache_free(c);
}

Test(retention, model_lru)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_random(KVP_EVICT_LRU, 0, seed, 300);
}

Test(retention, model_slru)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_random(KVP_EVICT_SLRU, 0, seed, 300);
}

Test(retention, model_s3fifo)
{
    for (uint64_t seed = 1; seed <= 40; seed++)
        run_random(KVP_EVICT_S3FIFO, 0, seed, 300);
}

Test(retention, model_quotas)
{
    for (uint64_t seed = 1; seed <= 30; seed++) {
        run_random(KVP_EVICT_LRU, 4, seed, 300);
        run_random(KVP_EVICT_SLRU, 5, seed, 200);
        run_random(KVP_EVICT_S3FIFO, 3, seed, 200);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Hand cases                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* Access 64 tokens: a 32-token system prompt (tokens 1..32) and a question unique to q. */
static void prompt(uint32_t *t, uint32_t q)
{
    for (uint32_t i = 0; i < 32; i++)
        t[i] = i + 1;
    for (uint32_t i = 32; i < 64; i++)
        t[i] = 1000 + q * 64 + i;
}

/* The system prompt's hit after a scan of 40 distinct questions through a 48-block pool,
 * with the first request's first 32 tokens at priority prio (35: plain LRU). */
static uint32_t system_prompt_hit(int eviction, uint32_t prio)
{
    kvp_config cfg = th_config(48, 4, false, NULL, NULL);
    cfg.eviction = eviction;
    kvp_cache *c = th_cache_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[64];
    kvp_retention r;
    kvp_retention_range sys = {0, 32, prio, 0};
    kvp_retention_init(&r);
    r.ranges = &sys;
    r.n_ranges = 1;
    kvp_match out;
    prompt(t, 0);
    cr_assert_eq(kvp_access_retained(c, &ns, t, 64, &r, &out), KVP_OK);
    for (uint32_t q = 1; q <= 40; q++) {
        for (uint32_t i = 0; i < 64; i++)
            t[i] = 5000 + q * 64 + i; /* a scan: nothing shared */
        cr_assert_eq(kvp_access(c, &ns, t, 64, &out), KVP_OK);
        TH_CHECK(c);
    }
    prompt(t, 99);
    kvp_match hit = th_lookup_ok(c, &ns, t, 64);
    kvp_cache_free(c);
    return hit.n_blocks_cached;
}

Test(retention, system_prompt_survives_scan)
{
    int policies[] = {KVP_EVICT_LRU, KVP_EVICT_SLRU, KVP_EVICT_S3FIFO};
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(system_prompt_hit(policies[k], DEF), 0,
                     "policy %d: the scan should evict the system prompt", policies[k]);
        cr_assert_eq(system_prompt_hit(policies[k], 90), 8,
                     "policy %d: the retained system prompt (8 blocks) should survive",
                     policies[k]);
    }
}

Test(retention, duration_lapses)
{
    kvp_cache *c = th_cache(8, 1, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_retention r;
    kvp_retention_init(&r);
    r.priority = 90;
    r.duration = 3;
    uint32_t keep[2] = {1, 2};
    kvp_match out;
    cr_assert_eq(kvp_access_retained(c, &ns, keep, 2, &r, &out), KVP_OK); /* clock 0 -> 1 */
    uint32_t ids[2];
    cr_assert_eq(kvp_lookup(c, &ns, keep, 2, ids, 2, &out), KVP_OK);
    cr_assert_eq(out.n_blocks_cached, 2);
    int p;
    cr_assert_eq(kvp_block_retention(c, ids[0], &p), KVP_OK);
    cr_assert_eq(p, 90);
    /* Two more requests (clock 3): still retained; fill the pool so that it must evict. */
    uint32_t a[6] = {10, 11, 12, 13, 14, 15};
    cr_assert_eq(kvp_access(c, &ns, a, 6, &out), KVP_OK);
    cr_assert_eq(kvp_block_retention(c, ids[0], &p), KVP_OK);
    cr_assert_eq(p, 90);
    uint32_t b[2] = {20, 21};
    cr_assert_eq(kvp_access(c, &ns, b, 2, &out), KVP_OK); /* evicts from a's chain */
    cr_assert_eq(th_lookup_ok(c, &ns, keep, 2).n_blocks_cached, 2);
    /* Clock 3 now: the priority lapsed (0 + ... set at clock 0, lapses at 3). */
    cr_assert_eq(kvp_block_retention(c, ids[0], &p), KVP_OK);
    cr_assert_eq(p, DEF);
    /* The lapsed blocks join the LRU order as of the next eviction (clock 3): newer than
     * the rest, so the next evictions take the older default blocks first... */
    uint32_t e[4] = {30, 31, 32, 33};
    cr_assert_eq(kvp_access(c, &ns, e, 4, &out), KVP_OK);
    cr_assert_eq(th_lookup_ok(c, &ns, keep, 2).n_blocks_cached, 2);
    /* ...and then them, like any default block. */
    uint32_t f[8] = {40, 41, 42, 43, 44, 45, 46, 47};
    cr_assert_eq(kvp_access(c, &ns, f, 8, &out), KVP_OK);
    cr_assert_eq(th_lookup_ok(c, &ns, keep, 2).n_blocks_cached, 0);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(retention, highest_setting_wins_and_release_path)
{
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[12];
    for (uint32_t i = 0; i < 12; i++)
        t[i] = i + 1;
    th_acquire_ok(c, 1, &ns, t, 12, 12);
    cr_assert_eq(kvp_commit(c, 1, t, 12, NULL), KVP_OK);
    th_acquire_ok(c, 2, &ns, t, 12, 12); /* shares blocks 0 and 1 (the last is recomputed) */
    kvp_retention r;
    kvp_retention_range first = {0, 6, 80, 0}; /* covers block 0 only (block 1 is 4..7) */
    kvp_retention_init(&r);
    r.priority = 20;
    r.ranges = &first;
    r.n_ranges = 1;
    cr_assert_eq(kvp_request_set_retention(c, 1, &r), KVP_OK);
    kvp_retention r2;
    kvp_retention_init(&r2);
    r2.priority = 50;
    cr_assert_eq(kvp_request_set_retention(c, 2, &r2), KVP_OK);
    const uint32_t *ids;
    size_t n;
    cr_assert_eq(kvp_request_blocks(c, 1, &ids, &n), KVP_OK);
    uint32_t b0 = ids[0], b1 = ids[1], b2 = ids[2];
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    int p;
    cr_assert_eq(kvp_block_retention(c, b0, &p), KVP_OK);
    cr_assert_eq(p, 80);
    cr_assert_eq(kvp_block_retention(c, b1, &p), KVP_OK);
    cr_assert_eq(p, 20);
    cr_assert_eq(kvp_block_retention(c, b2, &p), KVP_OK);
    cr_assert_eq(p, 20);
    cr_assert_eq(kvp_release(c, 2), KVP_OK); /* 50 > 20 on b1, 50 < 80 on b0 */
    TH_CHECK(c);
    cr_assert_eq(kvp_block_retention(c, b0, &p), KVP_OK);
    cr_assert_eq(p, 80);
    cr_assert_eq(kvp_block_retention(c, b1, &p), KVP_OK);
    cr_assert_eq(p, 50);
    /* A request without retention leaves the records alone. */
    th_acquire_ok(c, 3, &ns, t, 12, 12);
    cr_assert_eq(kvp_release(c, 3), KVP_OK);
    cr_assert_eq(kvp_block_retention(c, b1, &p), KVP_OK);
    cr_assert_eq(p, 50);
    /* Reset drops every cached block, retained ones included, and their records. */
    cr_assert_eq(kvp_cache_reset(c), KVP_OK);
    TH_CHECK(c);
    cr_assert_eq(th_stats(c).n_blocks_cached, 0);
    cr_assert_eq(kvp_block_retention(c, b0, &p), KVP_OK);
    cr_assert_eq(p, DEF);
    kvp_cache_free(c);
}

Test(retention, errors)
{
    th_alloc a;
    th_alloc_init(&a);
    kvp_config cfg = th_config(16, 4, false, NULL, NULL);
    cfg.alloc = th_alloc_hooks(&a);
    kvp_cache *c = th_cache_new(&cfg);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    th_acquire_ok(c, 7, &ns, t, 10, 10);
    kvp_retention r;
    kvp_retention_range g = {0, 11, 50, 0};
    kvp_retention_init(&r);
    cr_assert_eq(r.priority, KVP_RETENTION_PRIORITY_DEFAULT);
    r.ranges = &g;
    r.n_ranges = 1;
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_errmsg(), "past the prompt") != NULL, "%s", kvp_errmsg());
    g.token_end = 10;
    g.priority = 101;
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_errmsg(), "priority 101") != NULL, "%s", kvp_errmsg());
    g.priority = 50;
    g.token_start = 10;
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_EINVAL);
    cr_assert(strstr(kvp_errmsg(), "empty") != NULL, "%s", kvp_errmsg());
    g.token_start = 0;
    r.priority = 200;
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_EINVAL);
    r.priority = 35;
    r.ranges = NULL;
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_EINVAL);
    r.ranges = &g;
    r.n_ranges = KVP_RETENTION_MAX_RANGES + 1;
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_EINVAL);
    r.n_ranges = 1;
    cr_assert_eq(kvp_request_set_retention(c, 8, &r), KVP_ENOENT);
    cr_assert_eq(kvp_request_set_retention(c, 7, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_request_set_retention(NULL, 7, &r), KVP_EINVAL);
    cr_assert_eq(kvp_access_retained(c, &ns, t, 5, &r, NULL), KVP_EINVAL); /* range past 5 */
    int p;
    cr_assert_eq(kvp_block_retention(c, 16, &p), KVP_EINVAL);
    cr_assert_eq(kvp_block_retention(c, 0, NULL), KVP_EINVAL);
    /* Failed calls left retention off: no arrays were kept. */
    cr_assert(!c->retention.on);
    /* Every allocation of the first use failing in turn leaves the cache as it was. */
    for (int64_t k = 0; k < 12; k++) {
        int64_t live = a.live_bytes;
        th_alloc_arm(&a, k);
        int rc = kvp_request_set_retention(c, 7, &r);
        th_alloc_arm(&a, -1);
        if (rc == KVP_OK)
            break;
        cr_assert_eq(rc, KVP_ENOMEM);
        cr_assert_eq(a.live_bytes, live);
        cr_assert(!c->retention.on);
        TH_CHECK(c);
    }
    cr_assert(c->retention.on);
    cr_assert_eq(kvp_request_set_retention(c, 7, &r), KVP_OK); /* replaces */
    cr_assert_eq(kvp_release(c, 7), KVP_OK);
    TH_CHECK(c);
    kvp_cache_free(c);
    cr_assert_eq(a.live_bytes, 0);
    cr_assert_eq(a.n_bad_frees, 0);
}

/* The checker catches each kind of corruption of the retention state. */
Test(retention, checker_catches)
{
    kvp_cache *c = th_cache(8, 1, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_retention r;
    kvp_retention_init(&r);
    r.priority = 70;
    r.duration = 100;
    uint32_t t[3] = {1, 2, 3};
    kvp_match out;
    cr_assert_eq(kvp_access_retained(c, &ns, t, 3, &r, &out), KVP_OK);
    TH_CHECK(c);
    uint32_t ids[3];
    cr_assert_eq(kvp_lookup(c, &ns, t, 3, ids, 3, &out), KVP_OK);
    kvp__retention *rt = &c->retention;
    uint32_t id = ids[1];

    rt->q[70].n++;
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    rt->q[70].n--;
    rt->prio[id] = 60; /* on queue 70 with priority 60 */
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    rt->prio[id] = 70;
    c->pool.state[id] = KVP__ST_CACHED; /* queued but unmarked */
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    c->pool.state[id] = KVP__SLOT_RETAINED;
    uint32_t h = rt->hpos[id];
    rt->hpos[id] = KVP_NIL; /* finite expiry, not in the heap */
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    rt->hpos[id] = h;
    rt->nonempty[1] ^= UINT64_C(1) << (70 - 64);
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    rt->nonempty[1] ^= UINT64_C(1) << (70 - 64);
    c->pool.n_retained++;
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    c->pool.n_retained--;
    uint32_t free_id = 7;
    cr_assert(!kvp__block_is_indexed(&c->pool, free_id));
    rt->prio[free_id] = 50; /* a record on an unindexed block */
    cr_assert_eq(kvp__retention_check(c), KVP_ECORRUPT);
    rt->prio[free_id] = KVP__PRIO_UNSET;
    TH_CHECK(c);
    kvp_cache_free(c);
}
