/*
 * test_tiers.c - lower tiers (kvp_cache_add_tier): load and store orders, confirmation,
 * lookups by tier, events with the medium, per-tier counters, and a randomized engine
 * checked against a reference model of the tiers.
 *
 * The reference model keeps, for every block of every lower tier, what the engine has been
 * told about it (free, pending under a key, ready under a key) from the orders it received,
 * the confirmations it gave and the REMOVED events of the tier; and the simulated contents
 * of every device and tier block (the key whose KV it holds). The randomized engine copies
 * contents only when it confirms an order, in random order and with random failures, and
 * keeps some orders unanswered for many steps. After every step: kvp_cache_check; the
 * cache's tier counters equal the model's; every ready block of the model is found by the
 * cache under its key (none is lost); and after each lookup, every block reported in a
 * lower tier is ready in the model (none is hit before its store is confirmed). Each load
 * order must read a tier block whose contents are the order's key, and each store order's
 * device block must still hold its key when the copy is made (the pin held).
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"
#include "tier.h"

#define BS      4u
#define N_DEV   40u
#define N_CPU   64u
#define N_DISK  96u
#define MAX_REQ 4
#define MAX_ORD 512

enum { M_FREE, M_PENDING, M_READY };

typedef struct mblock {
    int state;    /* M_* as the engine knows it */
    kvp_key key;  /* pending or ready: the key */
    kvp_key data; /* simulated contents: the key whose KV the block holds */
    bool has_data;
} mblock;

typedef struct model {
    mblock tier[KVP_MAX_TIERS][128]; /* [1..2] used */
    uint32_t n_tier[KVP_MAX_TIERS];
    kvp_key dev[N_DEV]; /* device contents */
    bool dev_ok[N_DEV];
    kvp_cache *cache; /* for kvp_cache_tier_medium inside the callback */
    uint64_t n_removed_events;
    bool bad_event; /* a tier event the model did not expect */
} model;

static void on_event(void *ud, const kvp_event *ev)
{
    model *m = ud;
    if (ev->tier == 0)
        return;
    if (ev->tier < 1 || ev->tier > 2 || ev->block_id >= m->n_tier[ev->tier]) {
        m->bad_event = true;
        return;
    }
    const char *want = ev->tier == 1 ? "CPU" : "DISK";
    const char *medium = kvp_cache_tier_medium(m->cache, ev->tier);
    if (!medium || strcmp(medium, want) != 0)
        m->bad_event = true;
    if ((ev->type == KVP_EVENT_STORED) != (ev->tokens != NULL))
        m->bad_event = true; /* a tier's BlockStored carries its tokens, as vLLM's */
    mblock *b = &m->tier[ev->tier][ev->block_id];
    if (ev->type == KVP_EVENT_REMOVED) {
        /* Only a ready block is ever evicted from a tier. */
        if (b->state != M_READY || !th_key_eq(b->key, ev->key))
            m->bad_event = true;
        b->state = M_FREE;
        b->has_data = false;
        m->n_removed_events++;
    } else if (ev->type == KVP_EVENT_STORED) {
        /* Emitted on confirmation: the test marks the block ready before confirming. */
        if (b->state != M_READY || !th_key_eq(b->key, ev->key))
            m->bad_event = true;
    }
}

/* A cache with a CPU tier (eviction policy ev_cpu) and, when n_disk > 0, a DISK tier
 * (ev_disk). */
static kvp_cache *tier_cache_ev(model *m, uint32_t n_cpu, uint32_t n_disk, int ev_cpu, int ev_disk)
{
    memset(m, 0, sizeof *m);
    kvp_config cfg = th_config(N_DEV, BS, false, on_event, m);
    cfg.block_bytes = 1000;
    kvp_cache *c = th_cache_new(&cfg);
    m->cache = c;
    kvp_tier_config tc;
    kvp_tier_config_init(&tc);
    tc.n_blocks = n_cpu;
    tc.eviction = ev_cpu;
    int t = -1;
    cr_assert_eq(kvp_cache_add_tier(c, &tc, &t), KVP_OK, "%s", kvp_errmsg());
    cr_assert_eq(t, 1);
    m->n_tier[1] = n_cpu;
    if (n_disk) {
        tc.medium = "DISK";
        tc.n_blocks = n_disk;
        tc.eviction = ev_disk;
        cr_assert_eq(kvp_cache_add_tier(c, &tc, &t), KVP_OK, "%s", kvp_errmsg());
        cr_assert_eq(t, 2);
        m->n_tier[2] = n_disk;
    }
    return c;
}

static kvp_cache *tier_cache(model *m, uint32_t n_cpu, uint32_t n_disk)
{
    return tier_cache_ev(m, n_cpu, n_disk, KVP_EVICT_LRU, KVP_EVICT_LRU);
}

static void keys_of(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, size_t n,
                    kvp_key *keys, size_t cap)
{
    kvp_key root;
    size_t nk;
    cr_assert_eq(kvp_cache_keys(c, ns, t, n, &root, keys, cap, &nk), KVP_OK);
}

/* A store order just handed out: the model reserves its tier block. */
static void model_store_issued(model *m, const kvp_tier_order *o)
{
    cr_assert_eq(o->kind, KVP_ORDER_STORE);
    cr_assert(o->tier >= 1 && o->tier <= 2 && o->tier_block < m->n_tier[o->tier]);
    cr_assert_lt(o->device_block, N_DEV);
    mblock *b = &m->tier[o->tier][o->tier_block];
    cr_assert_eq(b->state, M_FREE, "store order into tier %d block %u, which the engine holds",
                 o->tier, o->tier_block);
    cr_assert(m->dev_ok[o->device_block] && th_key_eq(m->dev[o->device_block], o->key),
              "store order from a device block that does not hold the key");
    b->state = M_PENDING;
    b->key = o->key;
}

/* The engine finishes order o (ok: the copy is made now) and confirms it. */
static void model_confirm(kvp_cache *c, model *m, const kvp_tier_order *o, bool ok)
{
    mblock *b = &m->tier[o->tier][o->tier_block];
    if (o->kind == KVP_ORDER_STORE) {
        cr_assert_eq(b->state, M_PENDING);
        /* The device block was pinned: it still holds the key. */
        cr_assert(m->dev_ok[o->device_block] && th_key_eq(m->dev[o->device_block], o->key),
                  "device block %u changed under a store order in flight", o->device_block);
        if (ok) {
            b->state = M_READY;
            b->data = o->key;
            b->has_data = true;
        } else {
            b->state = M_FREE;
        }
    } else {
        cr_assert_eq(b->state, M_READY, "load from a tier block that is not ready");
        cr_assert(b->has_data && th_key_eq(b->data, o->key), "load reads the wrong contents");
        if (ok) {
            m->dev[o->device_block] = b->data;
            m->dev_ok[o->device_block] = true;
        }
    }
    cr_assert_eq(kvp_tier_confirm(c, o->id, ok), KVP_OK, "%s", kvp_errmsg());
    cr_assert_eq(kvp_tier_confirm(c, o->id, ok), KVP_ENOENT, "a second confirmation");
    cr_assert(!m->bad_event, "unexpected tier event");
}

/* The cache agrees with the model: checker, counters, and every ready block findable. */
static void model_agrees(kvp_cache *c, const model *m)
{
    cr_assert_eq(kvp_cache_check(c), KVP_OK, "check: %s", kvp_errmsg());
    int n_tiers = 0;
    cr_assert_eq(kvp_cache_tier_stats(c, 0, NULL, &n_tiers), KVP_OK);
    for (int k = 1; k < n_tiers; k++) {
        uint32_t ready = 0, pending = 0;
        for (uint32_t id = 0; id < m->n_tier[k]; id++) {
            const mblock *b = &m->tier[k][id];
            ready += b->state == M_READY;
            pending += b->state == M_PENDING;
            if (b->state == M_FREE)
                continue;
            const kvp__tier *t = &c->tiers->tier[k];
            cr_assert_eq(kvp__tier_find(t, b->key), id, "tier %d lost block %u", k, id);
            cr_assert_eq(t->blocks[id].state,
                         b->state == M_READY ? KVP__TB_READY : KVP__TB_PENDING);
        }
        kvp_tier_stats st;
        cr_assert_eq(kvp_cache_tier_stats(c, k, &st, &n_tiers), KVP_OK);
        cr_assert_eq(st.n_blocks_ready, ready, "tier %d: %u ready, model %u", k, st.n_blocks_ready,
                     ready);
        /* Store orders not handed out yet hold pending blocks the engine does not know. */
        const kvp__tiers *ts = c->tiers;
        for (uint32_t s = ts->new_head; s != KVP_NIL; s = ts->orders[s].next)
            pending += ts->orders[s].tier == k;
        cr_assert_eq(st.n_blocks_pending, pending);
    }
}

static const kvp_namespace *test_ns(void)
{
    static _Thread_local kvp_namespace ns; /* the threads test calls it from several */
    th_ns(&ns, "m", NULL, NULL, NULL);
    return &ns;
}

Test(tiers, add_tier_errors)
{
    kvp_cache *c = th_cache(8, BS, false, NULL, NULL);
    kvp_tier_config tc;
    kvp_tier_config_init(&tc);
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL, "n_blocks 0");
    tc.n_blocks = 4;
    tc.medium = "";
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL, "empty medium");
    tc.medium = "a b";
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL, "space in medium");
    tc.medium = "CPU";
    tc.eviction = 99;
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL, "no such policy");
    tc.eviction = KVP_EVICT_S3FIFO;
    tc.s3fifo_small_pct = 0;
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL, "s3fifo_small_pct 0");
    cr_assert_str_eq(kvp_errmsg(), "s3fifo_small_pct is 0, outside 1..100");
    tc.s3fifo_small_pct = 10;
    tc.eviction = KVP_EVICT_LRU;
    cr_assert_eq(kvp_cache_add_tier(NULL, &tc, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_cache_add_tier(c, NULL, NULL), KVP_EINVAL);
    int n = 0;
    cr_assert_eq(kvp_cache_tier_stats(c, 0, NULL, &n), KVP_OK);
    cr_assert_eq(n, 1, "failed adds added nothing");
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_OK);
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL, "a medium twice");
    tc.medium = "DISK";
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_OK);
    tc.medium = "REMOTE";
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_OK);
    tc.medium = "MORE";
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_ENOSPC);
    cr_assert_eq(kvp_cache_tier_stats(c, 0, NULL, &n), KVP_OK);
    cr_assert_eq(n, 4);
    kvp_tier_stats st;
    cr_assert_eq(kvp_cache_tier_stats(c, 4, &st, &n), KVP_EINVAL);
    cr_assert_eq(kvp_cache_tier_stats(c, 2, &st, &n), KVP_OK);
    cr_assert_str_eq(st.medium, "DISK");
    cr_assert_eq(st.n_blocks_total, 4);
    cr_assert_str_eq(kvp_cache_tier_medium(c, 0), "GPU");
    cr_assert_str_eq(kvp_cache_tier_medium(c, 3), "REMOTE");
    cr_assert_null(kvp_cache_tier_medium(c, 4));
    cr_assert_null(kvp_cache_tier_medium(c, -1));
    cr_assert_null(kvp_cache_tier_medium(NULL, 0));
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_cache_free(c);

    kvp_cache *v = th_cache(8, BS, true, NULL, NULL);
    tc.medium = "CPU";
    cr_assert_eq(kvp_cache_add_tier(v, &tc, NULL), KVP_ENOTSUP, "verify_tokens");
    kvp_cache_free(v);

    /* Not while requests are active. */
    c = th_cache(8, BS, false, NULL, NULL);
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvp_match mm;
    cr_assert_eq(kvp_acquire(c, 1, test_ns(), t, 8, 0, &mm), KVP_OK);
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_OK);
    kvp_cache_free(c);
}

/* The whole life of a block: stored on commit, hit-able only after confirmation, evicted
 * from the device pool, loaded back, committed again. */
Test(tiers, store_confirm_load)
{
    model m;
    kvp_cache *c = tier_cache(&m, 8, 0);
    const kvp_namespace *ns = test_ns();
    uint32_t p[17];
    for (uint32_t i = 0; i < 17; i++)
        p[i] = 100 + i;
    kvp_match mm;
    kvp_tier_order loads[8];
    size_t n_loads = 99;
    cr_assert_eq(kvp_acquire_tiers(c, 1, ns, p, 17, 0, &mm, loads, 8, &n_loads), KVP_OK);
    cr_assert_eq(n_loads, 0);
    size_t n_stored;
    cr_assert_eq(kvp_commit(c, 1, p, 17, &n_stored), KVP_OK);
    cr_assert_eq(n_stored, 4);
    kvp_tier_order st[8];
    size_t n, left;
    cr_assert_eq(kvp_tier_orders(c, st, 3, &n, &left), KVP_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(left, 1);
    cr_assert_eq(kvp_tier_orders(c, st + 3, 8, &n, &left), KVP_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(left, 0);
    kvp_key keys[4];
    keys_of(c, ns, p, 17, keys, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(st[i].kind, KVP_ORDER_STORE);
        cr_assert_eq(st[i].tier, 1);
        cr_assert_eq(st[i].block_index, (uint32_t)i);
        cr_assert(th_key_eq(st[i].key, keys[i]));
    }
    /* Pending: the device pool still has it, CPU does not count yet. */
    uint8_t where[8];
    kvp_tier_match tm;
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 4, "the store orders pin their device blocks");
    /* Confirm 0, 1 and fail 3; 2 stays pending. */
    cr_assert_eq(kvp_tier_confirm(c, st[0].id, true), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, st[1].id, true), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, st[3].id, false), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, st[3].id, true), KVP_ENOENT);
    cr_assert_eq(kvp_tier_confirm(c, 0, true), KVP_ENOENT);
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 1);

    /* Evict everything from the device pool: fill it with another request. */
    uint32_t q[N_DEV * BS];
    for (uint32_t i = 0; i < N_DEV * BS; i++)
        q[i] = 9000 + i;
    cr_assert_eq(kvp_acquire(c, 2, ns, q, (N_DEV - 1) * BS, 0, &mm), KVP_OK);
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    cr_assert_eq(kvp_lookup_tiers(c, ns, p, 17, where, 8, &tm), KVP_OK);
    /* Block 2 is pinned by its store (still on device) but block 0 and 1 are evicted from
     * the device and ready in CPU; block 2 is not ready in CPU and the device run broke. */
    cr_assert_eq(tm.n_blocks_full, 4);
    cr_assert_eq(tm.n_blocks_prefix, 2);
    cr_assert_eq(tm.n_blocks_tier[1], 2);
    cr_assert_eq(where[0], 1);
    cr_assert_eq(where[1], 1);
    cr_assert_eq(kvp_tier_confirm(c, st[2].id, true), KVP_OK);
    cr_assert_eq(kvp_lookup_tiers(c, ns, p, 17, where, 8, &tm), KVP_OK);
    cr_assert_eq(tm.n_blocks_prefix, 3);
    cr_assert_eq(tm.n_blocks_usable, 3);

    /* Acquire: loads for blocks 0..2 into the request's fresh blocks. */
    cr_assert_eq(kvp_acquire_tiers(c, 3, ns, p, 17, 0, &mm, loads, 8, &n_loads), KVP_OK);
    cr_assert_eq(mm.n_blocks_hit, 0);
    cr_assert_eq(n_loads, 3);
    const uint32_t *ids;
    size_t n_ids;
    cr_assert_eq(kvp_request_blocks(c, 3, &ids, &n_ids), KVP_OK);
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(loads[i].kind, KVP_ORDER_LOAD);
        cr_assert_eq(loads[i].block_index, i);
        cr_assert_eq(loads[i].device_block, ids[i]);
        cr_assert(th_key_eq(loads[i].key, keys[i]));
        cr_assert_eq(loads[i].tier_block, st[i].tier_block);
    }
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, loads[0].id, true), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, loads[1].id, true), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, loads[2].id, false), KVP_OK);
    cr_assert_eq(kvp_commit(c, 3, p, 17, &n_stored), KVP_OK);
    /* Block 2's device copy was cached again when its store was confirmed: deduplicated. */
    cr_assert_eq(n_stored, 3);
    /* Blocks 0..2 are in CPU already; block 3's store failed before: ordered again. */
    cr_assert_eq(kvp_tier_orders(c, st, 8, &n, &left), KVP_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(st[0].block_index, 3);
    cr_assert_eq(kvp_tier_confirm(c, st[0].id, true), KVP_OK);
    cr_assert_eq(kvp_release(c, 3), KVP_OK);

    kvp_tier_stats ts;
    int n_tiers;
    cr_assert_eq(kvp_cache_tier_stats(c, 1, &ts, &n_tiers), KVP_OK);
    cr_assert_str_eq(ts.medium, "CPU");
    cr_assert_eq(ts.n_stores, 4);
    cr_assert_eq(ts.n_stores_failed, 1);
    cr_assert_eq(ts.n_hits, 3);
    cr_assert_eq(ts.n_loads, 2);
    cr_assert_eq(ts.n_loads_failed, 1);
    cr_assert_eq(ts.n_bytes_loaded, 2000);
    cr_assert_eq(ts.n_bytes_stored, 4000);
    cr_assert_eq(ts.n_blocks_ready, 4);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 0, "every pin was dropped");
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_cache_free(c);
}

/* A cache without tiers: orders and lookups answer as an empty tier set. */
Test(tiers, no_tiers)
{
    kvp_cache *c = th_cache(8, BS, false, NULL, NULL);
    uint32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvp_match mm;
    kvp_tier_order lo[4];
    size_t n;
    cr_assert_eq(kvp_acquire_tiers(c, 1, test_ns(), p, 9, 0, &mm, lo, 4, &n), KVP_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(kvp_acquire_tiers(c, 2, test_ns(), p, 9, 0, &mm, NULL, 4, &n), KVP_EINVAL);
    cr_assert_eq(kvp_acquire_tiers(c, 1, test_ns(), p, 9, 0, &mm, lo, 4, &n), KVP_EEXIST);
    cr_assert_eq(kvp_commit(c, 1, p, 9, NULL), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    size_t left;
    cr_assert_eq(kvp_tier_orders(c, lo, 4, &n, &left), KVP_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(kvp_tier_confirm(c, 1, true), KVP_ENOENT);
    kvp_tier_match tm;
    uint8_t where[4];
    cr_assert_eq(kvp_lookup_tiers(c, test_ns(), p, 9, where, 4, &tm), KVP_OK);
    cr_assert_eq(tm.n_blocks_prefix, 2);
    cr_assert_eq(tm.n_blocks_tier[0], 2);
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_cache_free(c);
}

typedef struct sreq {
    uint64_t id;
    bool live, committed;
    uint32_t n_tokens;
    uint32_t tokens[64];
    uint32_t n_loads_open; /* its load orders not confirmed yet */
} sreq;

typedef struct held {
    kvp_tier_order o;
    int req; /* load: the sreq slot; -1 for stores */
} held;

/* A prompt from a few families that share prefixes, so tiers see reuse. */
static uint32_t make_prompt(uint64_t *rng, uint32_t *t)
{
    uint32_t fam = (uint32_t)(th_rand(rng) % 5);
    uint32_t n = 5 + (uint32_t)(th_rand(rng) % 40);
    uint32_t shared = (uint32_t)(th_rand(rng) % (n + 1));
    for (uint32_t i = 0; i < n; i++)
        t[i] = i < shared ? fam * 1000 + i : (uint32_t)(th_rand(rng) % 7) + 50000;
    return n;
}

static void run_random_ev(uint64_t seed, uint32_t n_cpu, uint32_t n_disk, int steps, int ev_cpu,
                          int ev_disk)
{
    model *m = calloc(1, sizeof *m);
    held *h = calloc(MAX_ORD, sizeof *h);
    sreq *rq = calloc(MAX_REQ, sizeof *rq);
    cr_assert(m && h && rq);
    kvp_cache *c = tier_cache_ev(m, n_cpu, n_disk, ev_cpu, ev_disk);
    const kvp_namespace *ns = test_ns();
    uint64_t rng = seed, next_id = 1;
    size_t n_held = 0;
    uint64_t n_hits_seen = 0;
    for (int step = 0; step < steps; step++) {
        int r = (int)(th_rand(&rng) % MAX_REQ);
        sreq *q = &rq[r];
        uint64_t act = th_rand(&rng) % 10;
        if (act < 2 && !q->live) {
            /* Start a request: acquire with loads. */
            q->n_tokens = make_prompt(&rng, q->tokens);
            kvp_key keys[16];
            keys_of(c, ns, q->tokens, q->n_tokens, keys, 16);
            kvp_match mm;
            kvp_tier_order lo[16];
            size_t n_lo = 0;
            size_t cap = th_rand(&rng) % 4 == 0 ? 1 : 16;
            int rc =
                kvp_acquire_tiers(c, next_id, ns, q->tokens, q->n_tokens, 0, &mm, lo, cap, &n_lo);
            if (rc == KVP_ENOSPC)
                continue;
            cr_assert_eq(rc, KVP_OK, "%s", kvp_errmsg());
            q->id = next_id++;
            q->live = true;
            q->committed = false;
            q->n_loads_open = (uint32_t)n_lo;
            const uint32_t *ids;
            size_t n_ids;
            cr_assert_eq(kvp_request_blocks(c, q->id, &ids, &n_ids), KVP_OK);
            for (uint32_t i = 0; i < mm.n_blocks_hit; i++)
                cr_assert(m->dev_ok[ids[i]] && th_key_eq(m->dev[ids[i]], keys[i]),
                          "a device hit holds other contents");
            for (uint32_t i = mm.n_blocks_hit; i < n_ids; i++)
                m->dev_ok[ids[i]] = false; /* fresh: contents undefined */
            for (size_t j = 0; j < n_lo; j++) {
                cr_assert_eq(lo[j].block_index, mm.n_blocks_hit + j);
                cr_assert(th_key_eq(lo[j].key, keys[mm.n_blocks_hit + j]));
                cr_assert_eq(m->tier[lo[j].tier][lo[j].tier_block].state, M_READY,
                             "a load from a block whose store is not confirmed");
                cr_assert_lt(n_held, MAX_ORD);
                h[n_held].o = lo[j];
                h[n_held++].req = r;
                n_hits_seen++;
            }
        } else if (act < 4 && q->live && !q->committed && q->n_loads_open == 0) {
            /* Prefill: compute what was not hit or loaded, then commit. */
            kvp_key keys[16];
            keys_of(c, ns, q->tokens, q->n_tokens, keys, 16);
            const uint32_t *ids;
            size_t n_ids;
            cr_assert_eq(kvp_request_blocks(c, q->id, &ids, &n_ids), KVP_OK);
            for (uint32_t i = 0; i < q->n_tokens / BS; i++) {
                if (m->dev_ok[ids[i]])
                    cr_assert(th_key_eq(m->dev[ids[i]], keys[i]), "loaded the wrong block");
                m->dev[ids[i]] = keys[i];
                m->dev_ok[ids[i]] = true;
            }
            cr_assert_eq(kvp_commit(c, q->id, q->tokens, q->n_tokens, NULL), KVP_OK, "%s",
                         kvp_errmsg());
            q->committed = true;
        } else if (act < 5 && q->live && q->n_loads_open == 0) {
            cr_assert_eq(kvp_release(c, q->id), KVP_OK);
            q->live = false;
        } else if (act < 7) {
            /* Take some store orders. */
            kvp_tier_order st[8];
            size_t n, left;
            size_t cap = 1 + th_rand(&rng) % 8;
            if (cap > MAX_ORD - n_held)
                cap = MAX_ORD - n_held;
            cr_assert_eq(kvp_tier_orders(c, st, cap, &n, &left), KVP_OK);
            for (size_t j = 0; j < n; j++) {
                model_store_issued(m, &st[j]);
                h[n_held].o = st[j];
                h[n_held++].req = -1;
            }
        } else if (n_held) {
            /* Finish a random order: late ones wait, some fail. */
            size_t j = th_rand(&rng) % n_held;
            bool ok = th_rand(&rng) % 5 != 0;
            model_confirm(c, m, &h[j].o, ok);
            if (h[j].req >= 0)
                rq[h[j].req].n_loads_open--;
            h[j] = h[--n_held];
        }
        model_agrees(c, m);
        if (step % 8 == 0) {
            /* Lookups: nothing is reported in a tier before its store is confirmed. */
            uint32_t t[64];
            uint32_t n = make_prompt(&rng, t);
            kvp_key keys[16];
            keys_of(c, ns, t, n, keys, 16);
            uint8_t where[16];
            kvp_tier_match tm;
            cr_assert_eq(kvp_lookup_tiers(c, ns, t, n, where, 16, &tm), KVP_OK);
            for (uint32_t i = 0; i < tm.n_blocks_prefix; i++) {
                if (where[i] == 0)
                    continue;
                cr_assert(where[i] <= 2);
                const kvp__tier *kt = &c->tiers->tier[where[i]];
                uint32_t id = kvp__tier_find(kt, keys[i]);
                cr_assert_neq(id, KVP_NIL);
                cr_assert_eq(m->tier[where[i]][id].state, M_READY,
                             "lookup reports a block whose store is not confirmed");
            }
        }
    }
    /* Drain: every order answered, every request released: no pin is left. */
    while (n_held) {
        model_confirm(c, m, &h[n_held - 1].o, true);
        n_held--;
    }
    for (int r = 0; r < MAX_REQ; r++)
        if (rq[r].live)
            cr_assert_eq(kvp_release(c, rq[r].id), KVP_OK);
    kvp_tier_order st[8];
    size_t n, left;
    do {
        cr_assert_eq(kvp_tier_orders(c, st, 8, &n, &left), KVP_OK);
        for (size_t j = 0; j < n; j++) {
            model_store_issued(m, &st[j]);
            model_confirm(c, m, &st[j], true);
        }
    } while (n);
    model_agrees(c, m);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 0);
    uint64_t hits = 0;
    for (int k = 1; k <= (n_disk ? 2 : 1); k++) {
        kvp_tier_stats ts;
        int n_tiers;
        cr_assert_eq(kvp_cache_tier_stats(c, k, &ts, &n_tiers), KVP_OK);
        cr_assert_eq(ts.n_blocks_loading, 0);
        cr_assert_eq(ts.n_blocks_pending, 0);
        hits += ts.n_hits;
    }
    cr_assert_eq(hits, n_hits_seen);
    cr_assert(n_hits_seen > 0, "the workload never hit a lower tier (seed %llu)",
              (unsigned long long)seed);
    kvp_cache_free(c);
    free(m);
    free(h);
    free(rq);
}

static void run_random(uint64_t seed, uint32_t n_cpu, uint32_t n_disk, int steps)
{
    run_random_ev(seed, n_cpu, n_disk, steps, KVP_EVICT_LRU, KVP_EVICT_LRU);
}

Test(tiers, random_two_tiers)
{
    for (uint64_t seed = 1; seed <= 12; seed++)
        run_random(seed, N_CPU, 0, 3000);
}

Test(tiers, random_three_tiers)
{
    for (uint64_t seed = 100; seed <= 110; seed++)
        run_random(seed, 12, N_DISK, 3000);
}

/* The same engine model with lower tiers under every other policy (each tier its own):
 * no block is hit before its copy is confirmed, none is lost, every load reads what its
 * store wrote, kvp_cache_check after every step. */
Test(tiers, random_tier_policies)
{
    static const int ev[] = {KVP_EVICT_SLRU, KVP_EVICT_S3FIFO, KVP_EVICT_CDECAY, KVP_EVICT_LRU};
    for (uint64_t seed = 200; seed < 209; seed++) {
        int a = ev[seed % 3], b = ev[(seed / 3 + seed) % 4];
        run_random_ev(seed, seed % 2 ? 12 : N_CPU, seed % 2 ? N_DISK : 0, 2000, a, b);
    }
}

/* A cache (device policy eviction) with a 16-block CPU tier, after one request of 17 tokens
 * (base, base + 1, ...; retention r unless NULL) acquired, committed and released before its
 * 4 store orders, handed out into st[], are answered; dev[] its device blocks. */
static kvp_cache *stored_request(int eviction, uint32_t base, const kvp_retention *r,
                                 uint32_t dev[4], kvp_tier_order st[4])
{
    kvp_config cfg = th_config(N_DEV, BS, false, NULL, NULL);
    cfg.eviction = eviction;
    kvp_cache *c = th_cache_new(&cfg);
    kvp_tier_config tc;
    kvp_tier_config_init(&tc);
    tc.n_blocks = 16;
    cr_assert_eq(kvp_cache_add_tier(c, &tc, NULL), KVP_OK);
    uint32_t p[17];
    for (uint32_t i = 0; i < 17; i++)
        p[i] = base + i;
    kvp_match mm;
    size_t n_loads, n_stored, n, n_ids;
    cr_assert_eq(kvp_acquire_tiers(c, 1, test_ns(), p, 17, 0, &mm, NULL, 0, &n_loads), KVP_OK);
    if (r)
        cr_assert_eq(kvp_request_set_retention(c, 1, r), KVP_OK);
    cr_assert_eq(kvp_commit(c, 1, p, 17, &n_stored), KVP_OK);
    const uint32_t *ids;
    cr_assert_eq(kvp_request_blocks(c, 1, &ids, &n_ids), KVP_OK);
    memcpy(dev, ids, 4 * sizeof *dev);
    cr_assert_eq(kvp_release(c, 1), KVP_OK); /* before the stores are answered */
    cr_assert_eq(kvp_tier_orders(c, st, 4, &n, NULL), KVP_OK);
    cr_assert_eq(n, 4);
    return c;
}

/* A store order's pin of its device block is not a use: under a device policy other than
 * LRU, writing a block through to a tier counts no hit (SLRU would promote every stored
 * block to protected, S3-FIFO would send every one to its main FIFO), and the block's
 * release, when the store is answered after the request's, is at its own chain depth. */
Test(tiers, store_pins_are_not_hits)
{
    static const int ev[] = {KVP_EVICT_SLRU, KVP_EVICT_S3FIFO, KVP_EVICT_CDECAY};
    for (int e = 0; e < 3; e++) {
        uint32_t dev[4];
        kvp_tier_order st[4];
        kvp_cache *c = stored_request(ev[e], 500, NULL, dev, st);
        for (int i = 3; i >= 0; i--)
            cr_assert_eq(kvp_tier_confirm(c, st[i].id, true), KVP_OK);
        for (uint32_t i = 0; i < 4; i++) {
            const kvp__pblock *b = &c->policy.b[dev[i]];
            cr_assert_eq(b->n_hits, 0, "policy %d block %u: the store's pin counted a hit", ev[e],
                         i);
            cr_assert_eq(b->depth, i, "policy %d block %u released at depth %u", ev[e], i,
                         b->depth);
            if (ev[e] == KVP_EVICT_SLRU)
                cr_assert_eq(b->list, KVP__PL_A, "SLRU: a stored block stays on probation");
            if (ev[e] == KVP_EVICT_S3FIFO)
                cr_assert(b->list == KVP__PL_A && b->freq == 0, "S3-FIFO: in S, freq 0");
        }
        cr_assert_eq(kvp_cache_check(c), KVP_OK);
        kvp_cache_free(c);
    }
}

/* Retention priorities with tiers: a request's retention is noted at its release even when
 * a store order still holds its blocks, and the blocks join their priority's queue when the
 * store is answered (a store's hold carries no retention of its own). */
Test(tiers, retention_survives_store_holds)
{
    for (int ev = KVP_EVICT_LRU; ev <= KVP_EVICT_S3FIFO; ev += KVP_EVICT_S3FIFO - KVP_EVICT_LRU) {
        kvp_retention_range rr = {0, 8, 90, 0};
        kvp_retention r;
        kvp_retention_init(&r);
        r.ranges = &rr;
        r.n_ranges = 1;
        uint32_t dev[4];
        kvp_tier_order st[4];
        kvp_cache *c = stored_request(ev, 700, &r, dev, st);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(kvp_tier_confirm(c, st[i].id, true), KVP_OK);
        for (uint32_t i = 0; i < 4; i++) {
            int prio = -1;
            cr_assert_eq(kvp_block_retention(c, dev[i], &prio), KVP_OK);
            cr_assert_eq(prio, i < 2 ? 90 : 35, "policy %d block %u: priority %d", ev, i, prio);
            cr_assert_eq(c->pool.state[dev[i]] == KVP__SLOT_RETAINED, i < 2);
        }
        cr_assert_eq(kvp_cache_check(c), KVP_OK);
        kvp_cache_free(c);
    }
}

/* The checker catches a corrupted tier. */
Test(tiers, checker_catches)
{
    model m;
    kvp_cache *c = tier_cache(&m, 8, 0);
    uint32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvp_match mm;
    size_t n, left;
    kvp_tier_order lo[4], st[4];
    cr_assert_eq(kvp_acquire_tiers(c, 1, test_ns(), p, 9, 0, &mm, lo, 4, &n), KVP_OK);
    cr_assert_eq(kvp_commit(c, 1, p, 9, NULL), KVP_OK);
    cr_assert_eq(kvp_tier_orders(c, st, 4, &n, &left), KVP_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(kvp_tier_confirm(c, st[0].id, true), KVP_OK);
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp__tier *t = &c->tiers->tier[1];
    /* A pending block whose order is gone. */
    t->blocks[st[1].tier_block].state = KVP__TB_READY;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    t->blocks[st[1].tier_block].state = KVP__TB_PENDING;
    /* A load pin without an order. */
    t->blocks[st[0].tier_block].ref = 1;
    t->n_loading = 1;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    t->blocks[st[0].tier_block].ref = 0;
    t->n_loading = 0;
    /* A device pin the store order does not account for. */
    c->pool.state[st[1].device_block]++;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    c->pool.state[st[1].device_block]--;
    /* A wrong key under a slot. */
    t->blocks[st[0].tier_block].key.lo ^= 1;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    t->blocks[st[0].tier_block].key.lo ^= 1;
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    cr_assert_eq(kvp_tier_confirm(c, st[1].id, true), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    kvp_cache_free(c);
}

/* Threads: two schedulers acquire (with loads), commit and release while a copier thread
 * takes store orders and answers every order (some failed), and a reader looks up; the
 * lock makes every call linearizable, so at the end every order is answered, nothing is
 * pinned, and the counters add up. */
/* A prompt of one of 12 families sharing 8 blocks each (more than the device pool holds,
 * less than the CPU tier), then a few random tokens. */
static uint32_t family_prompt(uint64_t *rng, uint32_t *t)
{
    uint32_t fam = (uint32_t)(th_rand(rng) % 12), n = 8 * BS + 1 + (uint32_t)(th_rand(rng) % 8);
    for (uint32_t i = 0; i < n; i++)
        t[i] = i < 8 * BS ? fam * 1000 + i : 70000 + (uint32_t)(th_rand(rng) % 100);
    return n;
}

/* Let the other threads run (20 microseconds). */
static void nap(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

typedef struct tshared {
    kvp_cache *c;
    pthread_mutex_t mu;     /* guards the queue of load orders */
    kvp_tier_order q[4096]; /* load orders waiting for the copier */
    size_t n_q;
    atomic_int n_sched_done;      /* schedulers finished */
    atomic_ullong n_loads_issued; /* load orders handed to the copier */
    atomic_ullong n_stores_taken; /* store orders the copier took */
    atomic_ullong n_answered;     /* orders the copier answered */
    atomic_int loads_open[2];     /* per scheduler: its loads not answered yet */
    atomic_int n_nospace;         /* acquires refused with KVP_ENOSPC */
} tshared;

typedef struct targ {
    tshared *s;
    int who;
} targ;

static void *sched_thread(void *p)
{
    targ *a = p;
    tshared *s = a->s;
    uint64_t rng = 77 + (uint64_t)a->who;
    for (int i = 0; i < 150; i++) {
        uint32_t t[64];
        uint32_t n = family_prompt(&rng, t);
        uint64_t id = (uint64_t)a->who << 32 | (uint64_t)i;
        kvp_match mm;
        kvp_tier_order lo[16];
        size_t n_lo = 0;
        int rc = kvp_acquire_tiers(s->c, id, test_ns(), t, n, 0, &mm, lo, 16, &n_lo);
        if (rc == KVP_ENOSPC) { /* pending stores pin the pool: wait for the copier */
            cr_assert_lt(atomic_fetch_add(&s->n_nospace, 1), 1000000, "no progress");
            nap();
            i--;
            continue;
        }
        cr_assert_eq(rc, KVP_OK, "%s", kvp_errmsg());
        pthread_mutex_lock(&s->mu);
        for (size_t j = 0; j < n_lo && s->n_q < 4096; j++)
            s->q[s->n_q++] = lo[j];
        pthread_mutex_unlock(&s->mu);
        atomic_fetch_add(&s->n_loads_issued, n_lo);
        atomic_fetch_add(&s->loads_open[a->who], (int)n_lo);
        while (atomic_load(&s->loads_open[a->who]) > 0)
            nap(); /* wait for the copier: loads before prefill */
        cr_assert_eq(kvp_commit(s->c, id, t, n, NULL), KVP_OK, "%s", kvp_errmsg());
        cr_assert_eq(kvp_release(s->c, id), KVP_OK);
    }
    atomic_fetch_add(&s->n_sched_done, 1);
    return NULL;
}

static void *copier_thread(void *p)
{
    tshared *s = p;
    uint64_t n = 0;
    for (;;) {
        bool done = atomic_load(&s->n_sched_done) == 2;
        kvp_tier_order st[32];
        size_t got = 0, left = 0;
        cr_assert_eq(kvp_tier_orders(s->c, st, 32, &got, &left), KVP_OK);
        atomic_fetch_add(&s->n_stores_taken, got);
        for (size_t j = 0; j < got; j++, n++) {
            cr_assert_eq(kvp_tier_confirm(s->c, st[j].id, n % 7 != 3), KVP_OK);
            atomic_fetch_add(&s->n_answered, 1);
        }
        pthread_mutex_lock(&s->mu);
        size_t nq = s->n_q;
        kvp_tier_order lq[4096];
        memcpy(lq, s->q, nq * sizeof *lq);
        s->n_q = 0;
        pthread_mutex_unlock(&s->mu);
        for (size_t j = 0; j < nq; j++, n++) {
            cr_assert_eq(kvp_tier_confirm(s->c, lq[j].id, n % 5 != 2), KVP_OK);
            atomic_fetch_add(&s->n_answered, 1);
            atomic_fetch_sub(&s->loads_open[lq[j].req_id >> 32], 1);
        }
        if (done && got == 0 && nq == 0 && left == 0)
            return NULL;
        if (got == 0 && nq == 0)
            nap();
    }
}

static void *reader_thread(void *p)
{
    tshared *s = p;
    uint64_t rng = 5;
    while (atomic_load(&s->n_sched_done) < 2) {
        uint32_t t[64];
        uint32_t n = make_prompt(&rng, t);
        kvp_tier_match tm;
        cr_assert_eq(kvp_lookup_tiers(s->c, test_ns(), t, n, NULL, 0, &tm), KVP_OK);
        cr_assert_leq(tm.n_blocks_prefix, tm.n_blocks_full);
        kvp_tier_stats ts;
        int n_tiers;
        cr_assert_eq(kvp_cache_tier_stats(s->c, 1, &ts, &n_tiers), KVP_OK);
    }
    return NULL;
}

Test(tiers, threads)
{
    model m;
    kvp_cache *c = tier_cache(&m, 128, 0);
    static tshared s;
    memset(&s, 0, sizeof s);
    s.c = c;
    pthread_mutex_init(&s.mu, NULL);
    pthread_t th[4];
    targ a[2] = {{&s, 0}, {&s, 1}};
    cr_assert_eq(pthread_create(&th[0], NULL, sched_thread, &a[0]), 0);
    cr_assert_eq(pthread_create(&th[1], NULL, sched_thread, &a[1]), 0);
    cr_assert_eq(pthread_create(&th[2], NULL, copier_thread, &s), 0);
    cr_assert_eq(pthread_create(&th[3], NULL, reader_thread, &s), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(kvp_cache_check(c), KVP_OK);
    kvp_stats st = th_stats(c);
    cr_assert_eq(st.n_blocks_in_use, 0, "every pin was answered");
    kvp_tier_stats ts;
    int n_tiers;
    cr_assert_eq(kvp_cache_tier_stats(c, 1, &ts, &n_tiers), KVP_OK);
    cr_assert_eq(ts.n_stores + ts.n_stores_failed, atomic_load(&s.n_stores_taken));
    cr_assert_eq(ts.n_loads + ts.n_loads_failed, atomic_load(&s.n_loads_issued));
    cr_assert_eq(ts.n_hits, atomic_load(&s.n_loads_issued));
    cr_assert_gt(ts.n_loads, 0,
                 "the workload never loaded from the CPU tier (hits %llu stores %llu skipped %llu "
                 "ready %u, requests %llu,  device hits %llu, nospace %d)",
                 (unsigned long long)ts.n_hits, (unsigned long long)ts.n_stores,
                 (unsigned long long)ts.n_stores_skipped, ts.n_blocks_ready,
                 (unsigned long long)st.n_requests, (unsigned long long)st.n_blocks_hit,
                 atomic_load(&s.n_nospace));
    cr_assert_eq(ts.n_blocks_pending + ts.n_blocks_loading, 0);
    pthread_mutex_destroy(&s.mu);
    kvp_cache_free(c);
}

/* Prometheus: a cache with tiers writes one sample per lower tier; one without writes none
 * of the tier families, and only a cache with tiers reserves the "medium" label. */
Test(tiers, metrics)
{
    model m;
    kvp_cache *c = tier_cache(&m, 16, 8);
    uint32_t p[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    kvp_match mm;
    size_t n, left;
    kvp_tier_order st[8];
    cr_assert_eq(kvp_acquire_tiers(c, 1, test_ns(), p, 9, 0, &mm, NULL, 0, &n), KVP_OK);
    cr_assert_eq(kvp_commit(c, 1, p, 9, NULL), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    cr_assert_eq(kvp_tier_orders(c, st, 8, &n, &left), KVP_OK);
    cr_assert_eq(n, 4); /* 2 blocks, 2 tiers */
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(kvp_tier_confirm(c, st[i].id, st[i].tier == 1), KVP_OK);
    static char buf[16384];
    size_t len;
    kvp_label lab = {"engine", "e1"};
    cr_assert_eq(kvp_cache_metrics(c, &lab, 1, buf, sizeof buf, &len), KVP_OK, "%s", kvp_errmsg());
    cr_assert(strstr(buf, "kvprefix_tier_stores_total{engine=\"e1\",medium=\"CPU\"} 2\n"), "%s",
              buf);
    cr_assert(strstr(buf, "kvprefix_tier_stores_failed_total{engine=\"e1\",medium=\"DISK\"} 2\n"));
    cr_assert(strstr(buf, "kvprefix_tier_stored_bytes_total{engine=\"e1\",medium=\"CPU\"} 2000\n"));
    cr_assert(
        strstr(buf, "kvprefix_tier_blocks{engine=\"e1\",medium=\"CPU\",state=\"ready\"} 2\n"));
    cr_assert(
        strstr(buf, "kvprefix_tier_blocks{engine=\"e1\",medium=\"DISK\",state=\"free\"} 8\n"));
    kvp_label bad = {"medium", "x"};
    cr_assert_eq(kvp_cache_metrics(c, &bad, 1, buf, sizeof buf, &len), KVP_EINVAL);
    kvp_cache_free(c);

    c = th_cache(8, BS, false, NULL, NULL);
    cr_assert_eq(kvp_cache_metrics(c, &bad, 1, buf, sizeof buf, &len), KVP_OK);
    cr_assert_null(strstr(buf, "kvprefix_tier"), "a cache without tiers writes no tier family");
    kvp_cache_free(c);
}
