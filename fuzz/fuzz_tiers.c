/*
 * fuzz_tiers.c - libFuzzer harness: a cache with lower tiers (kvp_cache_add_tier) driven by
 * an engine whose copies complete, fail and arrive late in the order the input chooses,
 * against a model of what each block holds.
 *
 * An input decodes to a shape (device pool of 2..33 blocks of 1..4 or 16 tokens, one to
 * three lower tiers of 1..64 blocks, each with its own eviction policy, events on or off) and up to
 * TR_MAX_STEPS steps: start a request (kvp_acquire_tiers with a cap on its loads), commit it
 * (prompt plus up to 5 decoded tokens), release it, take store orders (kvp_tier_orders), confirm an
 * order in flight (ok or failed, chosen by the input, any of them: late ones wait), confirm a bogus
 * or stale id, look up a prompt (kvp_lookup_tiers), reset, or arm an allocation failure for
 * the next step. Prompts are prefixes of three base sequences, so reuse is common.
 *
 * Oracle. The harness plays the engine and keeps the simulated contents of every device
 * and tier block (the key whose KV it holds), copying only when it confirms an order:
 *   - a load order names a tier block whose contents are its key (so it was confirmed
 *     stored, and nothing overwrote it since), and goes into the request's block
 *     n_blocks_hit + k;
 *   - a store order's device block still holds its key when the copy is made (its pin
 *     held) and its tier block is one the engine holds nothing in (pending or ready) —
 *     without events, a ready one may be reused, since the engine hears of no eviction;
 *   - kvp_lookup_tiers reports in tier k only blocks whose key the engine's copy of tier k
 *     holds ready (never before the store is confirmed), and a request's device hits hold
 *     their keys;
 *   - a second confirmation of an order, and a bogus id, are KVP_ENOENT;
 *   - a call that fails with an injected KVP_ENOMEM changes nothing (kvp_stats and every
 *     tier's kvp_tier_stats compare equal), and KVP_ENOMEM never comes uninjected;
 *   - kvp_cache_check passes after every step; at the end, once every order is answered
 *     and every request released, no device block is pinned and kvp_cache_free returns
 *     every byte.
 * With events on, every REMOVED event of a lower tier names a block the engine holds
 * ready under that key, which then holds nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#define TR_MAX_STEPS 200
#define TR_MAX_DEV   33
#define TR_MAX_TIER  64
#define TR_N_REQ     4
#define TR_MAX_ORD   512
#define TR_MAX_TOK   (12 * 16 + 8)

enum { B_NONE, B_PENDING, B_READY };

typedef struct tblock {
    int state;   /* what the engine was told: B_* */
    kvp_key key; /* pending or ready */
    kvp_key data;
    bool has_data;
} tblock;

typedef struct req {
    uint64_t id;
    bool live;
    size_t n;
    uint32_t tokens[TR_MAX_TOK];
    uint32_t n_loads_open;
} req;

typedef struct held {
    kvp_tier_order o;
    int r; /* the request of a load, else -1 */
} held;

typedef struct world {
    kvp_cache *cache;
    fz_alloc alloc;
    uint32_t bs, n_dev;
    int n_tiers;
    bool events; /* the cache reports events (tier evictions reach the engine) */
    uint32_t tier_blocks[KVP_MAX_TIERS];
    tblock tier[KVP_MAX_TIERS][TR_MAX_TIER];
    kvp_key dev[TR_MAX_DEV];
    bool dev_ok[TR_MAX_DEV];
    req rq[TR_N_REQ];
    held h[TR_MAX_ORD];
    size_t n_held;
    uint64_t next_id, stale_id;
    uint32_t base[3][TR_MAX_TOK];
} world;

static bool key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

static void on_event(void *ud, const kvp_event *ev)
{
    world *w = ud;
    if (ev->tier == 0)
        return;
    FZ_ASSERT(ev->tier < w->n_tiers && ev->block_id < w->tier_blocks[ev->tier],
              "event of tier %d block %u", ev->tier, ev->block_id);
    tblock *b = &w->tier[ev->tier][ev->block_id];
    if (ev->type == KVP_EVENT_REMOVED) {
        FZ_ASSERT(b->state == B_READY && key_eq(b->key, ev->key),
                  "tier %d evicted block %u that the engine does not hold ready", ev->tier,
                  ev->block_id);
        b->state = B_NONE;
        b->has_data = false;
    } else {
        FZ_ASSERT(ev->type == KVP_EVENT_STORED && ev->tokens != NULL, "tier event type %d",
                  ev->type);
    }
}

static void keys_of(world *w, const uint32_t *t, size_t n, kvp_key *keys)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_key root;
    size_t nk;
    FZ_ASSERT(kvp_cache_keys(w->cache, &ns, t, n, &root, keys, TR_MAX_TOK, &nk) == KVP_OK,
              "kvp_cache_keys");
}

/* Every counter the cache shows: kvp_stats and each tier's kvp_tier_stats. */
typedef struct snapshot {
    kvp_stats st;
    kvp_tier_stats ts[KVP_MAX_TIERS];
} snapshot;

static snapshot snap(world *w)
{
    snapshot s;
    memset(&s, 0, sizeof s);
    int n;
    FZ_ASSERT(kvp_cache_stats(w->cache, &s.st) == KVP_OK, "stats");
    for (int k = 0; k < w->n_tiers; k++)
        FZ_ASSERT(kvp_cache_tier_stats(w->cache, k, &s.ts[k], &n) == KVP_OK, "tier stats");
    return s;
}

static bool snap_eq(const snapshot *a, const snapshot *b, int n_tiers)
{
    if (memcmp(&a->st, &b->st, sizeof a->st) != 0)
        return false;
    for (int k = 0; k < n_tiers; k++) {
        kvp_tier_stats x = a->ts[k], y = b->ts[k];
        x.medium = y.medium = NULL;
        if (memcmp(&x, &y, sizeof x) != 0)
            return false;
    }
    return true;
}

/* A call's status: KVP_ENOMEM only when injected, and then nothing changed. */
static bool enomem_ok(world *w, int rc, const snapshot *before, bool armed)
{
    if (rc != KVP_ENOMEM)
        return false;
    FZ_ASSERT(armed, "KVP_ENOMEM without an injected failure");
    snapshot after = snap(w);
    FZ_ASSERT(snap_eq(before, &after, w->n_tiers),
              "a call failing with KVP_ENOMEM changed counters");
    return true;
}

static void confirm(world *w, size_t j, bool ok)
{
    held *hd = &w->h[j];
    const kvp_tier_order *o = &hd->o;
    tblock *b = &w->tier[o->tier][o->tier_block];
    if (o->kind == KVP_ORDER_STORE) {
        FZ_ASSERT(b->state == B_PENDING, "store confirmed into a block not pending");
        FZ_ASSERT(w->dev_ok[o->device_block] && key_eq(w->dev[o->device_block], o->key),
                  "device block %u changed under a store in flight", o->device_block);
        if (ok) {
            b->state = B_READY;
            b->data = o->key;
            b->has_data = true;
        } else {
            b->state = B_NONE;
        }
    } else {
        FZ_ASSERT(b->state == B_READY && b->has_data && key_eq(b->data, o->key),
                  "a load reads tier %d block %u, which does not hold its key", o->tier,
                  o->tier_block);
        if (ok) {
            w->dev[o->device_block] = b->data;
            w->dev_ok[o->device_block] = true;
        }
        w->rq[hd->r].n_loads_open--;
    }
    FZ_ASSERT(kvp_tier_confirm(w->cache, o->id, ok) == KVP_OK, "confirm: %s", kvp_errmsg());
    FZ_ASSERT(kvp_tier_confirm(w->cache, o->id, ok) == KVP_ENOENT, "confirmed twice");
    w->stale_id = o->id;
    w->h[j] = w->h[--w->n_held];
}

static void take_stores(world *w, size_t cap)
{
    kvp_tier_order st[16];
    size_t n = 0, left = 0;
    if (cap > 16)
        cap = 16;
    if (cap > TR_MAX_ORD - w->n_held)
        cap = TR_MAX_ORD - w->n_held;
    FZ_ASSERT(kvp_tier_orders(w->cache, st, cap, &n, &left) == KVP_OK, "tier_orders");
    for (size_t j = 0; j < n; j++) {
        const kvp_tier_order *o = &st[j];
        FZ_ASSERT(o->kind == KVP_ORDER_STORE && o->tier >= 1 && o->tier < w->n_tiers &&
                      o->tier_block < w->tier_blocks[o->tier] && o->device_block < w->n_dev,
                  "store order out of range");
        tblock *b = &w->tier[o->tier][o->tier_block];
        /* Without events the engine is not told of a tier's evictions: a ready block may be
         * reused by a store (its old contents are gone); a pending one never. With events
         * the REMOVED event must have come first. */
        FZ_ASSERT(b->state == B_NONE || (!w->events && b->state == B_READY),
                  "store into tier %d block %u, which the engine holds", o->tier, o->tier_block);
        FZ_ASSERT(w->dev_ok[o->device_block] && key_eq(w->dev[o->device_block], o->key),
                  "store from a device block without its key");
        b->state = B_PENDING;
        b->key = o->key;
        b->has_data = false;
        w->h[w->n_held].o = *o;
        w->h[w->n_held++].r = -1;
    }
}

static size_t make_prompt(world *w, fz_in *in, uint32_t *t)
{
    size_t n = fz_prompt_len(in, w->bs, (TR_MAX_TOK - 8) / w->bs - 1); /* + a tail < bs */
    if (n == 0)
        n = 1;
    memcpy(t, w->base[fz_below(in, 3)], n * sizeof *t);
    if (n > 2 && fz_below(in, 4) == 0)
        t[fz_below(in, n)] ^= 1;
    return n;
}

static void step_start(world *w, fz_in *in, bool armed, const snapshot *before)
{
    int r = (int)fz_below(in, TR_N_REQ);
    req *q = &w->rq[r];
    if (q->live)
        return;
    q->n = make_prompt(w, in, q->tokens);
    size_t cap = fz_below(in, 8);
    if (cap > TR_MAX_ORD - w->n_held)
        cap = TR_MAX_ORD - w->n_held;
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_match m;
    kvp_tier_order lo[TR_MAX_TOK];
    size_t n_lo = 0;
    int rc = kvp_acquire_tiers(w->cache, w->next_id, &ns, q->tokens, q->n, 0, &m, lo, cap, &n_lo);
    if (enomem_ok(w, rc, before, armed) || rc == KVP_ENOSPC || rc == KVP_ETOOBIG)
        return;
    FZ_ASSERT(rc == KVP_OK, "acquire_tiers: %s", kvp_errmsg());
    q->id = w->next_id++;
    q->live = true;
    q->n_loads_open = (uint32_t)n_lo;
    static kvp_key keys[TR_MAX_TOK];
    keys_of(w, q->tokens, q->n, keys);
    const uint32_t *ids;
    size_t n_ids;
    FZ_ASSERT(kvp_request_blocks(w->cache, q->id, &ids, &n_ids) == KVP_OK, "request_blocks");
    for (uint32_t i = 0; i < m.n_blocks_hit; i++)
        FZ_ASSERT(w->dev_ok[ids[i]] && key_eq(w->dev[ids[i]], keys[i]),
                  "device hit %u holds another block", i);
    for (size_t i = m.n_blocks_hit; i < n_ids; i++)
        w->dev_ok[ids[i]] = false;
    FZ_ASSERT(n_lo <= cap, "more loads than the cap");
    for (size_t j = 0; j < n_lo; j++) {
        FZ_ASSERT(lo[j].kind == KVP_ORDER_LOAD && lo[j].block_index == m.n_blocks_hit + j &&
                      lo[j].device_block == ids[m.n_blocks_hit + j] &&
                      key_eq(lo[j].key, keys[m.n_blocks_hit + j]),
                  "load order %zu does not name block n_blocks_hit + %zu", j, j);
        FZ_ASSERT(lo[j].tier >= 1 && lo[j].tier < w->n_tiers &&
                      w->tier[lo[j].tier][lo[j].tier_block].state == B_READY,
                  "a load from a block whose store is not confirmed");
        w->h[w->n_held].o = lo[j];
        w->h[w->n_held++].r = r;
    }
}

static void step_commit(world *w, fz_in *in, bool armed, const snapshot *before)
{
    req *q = &w->rq[fz_below(in, TR_N_REQ)];
    if (!q->live || q->n_loads_open)
        return;
    size_t n = q->n + fz_below(in, 6);
    if (n > TR_MAX_TOK)
        n = TR_MAX_TOK;
    for (size_t i = q->n; i < n; i++)
        q->tokens[i] = 900 + (uint32_t)i;
    static kvp_key keys[TR_MAX_TOK];
    keys_of(w, q->tokens, n, keys);
    const uint32_t *ids;
    size_t n_ids;
    FZ_ASSERT(kvp_request_blocks(w->cache, q->id, &ids, &n_ids) == KVP_OK, "request_blocks");
    if (n / w->bs > n_ids)
        n = n_ids * w->bs;
    kvp_key saved[TR_MAX_TOK];
    bool saved_ok[TR_MAX_TOK];
    for (size_t i = 0; i < n / w->bs; i++) {
        saved[i] = w->dev[ids[i]];
        saved_ok[i] = w->dev_ok[ids[i]];
        if (w->dev_ok[ids[i]])
            FZ_ASSERT(key_eq(w->dev[ids[i]], keys[i]), "block %zu was loaded wrong", i);
        w->dev[ids[i]] = keys[i]; /* prefill or decode computes it */
        w->dev_ok[ids[i]] = true;
    }
    int rc = kvp_commit(w->cache, q->id, q->tokens, n, NULL);
    if (enomem_ok(w, rc, before, armed)) {
        for (size_t i = 0; i < n / w->bs; i++) {
            w->dev[ids[i]] = saved[i];
            w->dev_ok[ids[i]] = saved_ok[i];
        }
        return;
    }
    FZ_ASSERT(rc == KVP_OK, "commit: %s", kvp_errmsg());
    q->n = n;
}

static void step_lookup(world *w, fz_in *in)
{
    uint32_t t[TR_MAX_TOK];
    size_t n = make_prompt(w, in, t);
    static kvp_key keys[TR_MAX_TOK];
    keys_of(w, t, n, keys);
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    uint8_t where[TR_MAX_TOK];
    kvp_tier_match tm;
    FZ_ASSERT(kvp_lookup_tiers(w->cache, &ns, t, n, where, TR_MAX_TOK, &tm) == KVP_OK, "lookup");
    for (uint32_t i = 0; i < tm.n_blocks_prefix; i++) {
        int k = where[i];
        if (k == 0)
            continue;
        bool found = false;
        for (uint32_t b = 0; b < w->tier_blocks[k]; b++)
            found |= w->tier[k][b].state == B_READY && key_eq(w->tier[k][b].key, keys[i]);
        FZ_ASSERT(found, "lookup reports block %u in tier %d before its store is confirmed", i, k);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_harness = "fuzz_tiers";
    fz_in in = {data, size};
    static world w;
    memset(&w, 0, sizeof w);
    fz_alloc_init(&w.alloc);
    uint8_t shape = fz_u8(&in);
    w.bs = shape & 1 ? 16 : 1 + (uint32_t)(shape >> 1 & 3);
    w.n_dev = 2 + (uint32_t)fz_below(&in, 32);
    bool events = shape & 8;
    w.events = events;
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = w.n_dev;
    cfg.block_size = w.bs;
    cfg.hash_profile = KVP_HASH_XXH3;
    cfg.alloc = fz_alloc_hooks(&w.alloc);
    if (events) {
        cfg.on_event = on_event;
        cfg.event_ud = &w;
    }
    FZ_ASSERT(kvp_cache_new(&cfg, &w.cache) == KVP_OK, "cache_new");
    w.n_tiers = 1;
    int n_lower = 1 + (int)fz_below(&in, 3);
    static const char *media[] = {"CPU", "DISK", "REMOTE"};
    for (int k = 1; k <= n_lower; k++) {
        kvp_tier_config tc;
        kvp_tier_config_init(&tc);
        tc.medium = media[k - 1];
        /* One byte: its low 6 bits the size (as before policies), its top 2 the policy. */
        size_t v = fz_below(&in, 256);
        static const int policy[] = {KVP_EVICT_LRU, KVP_EVICT_SLRU, KVP_EVICT_S3FIFO,
                                     KVP_EVICT_CDECAY};
        tc.n_blocks = 1 + (uint32_t)(v % TR_MAX_TIER);
        tc.eviction = policy[v / TR_MAX_TIER];
        int t = 0;
        FZ_ASSERT(kvp_cache_add_tier(w.cache, &tc, &t) == KVP_OK && t == k, "add_tier");
        w.tier_blocks[k] = tc.n_blocks;
        w.n_tiers = k + 1;
    }
    for (int s = 0; s < 3; s++)
        for (size_t i = 0; i < TR_MAX_TOK; i++)
            w.base[s][i] = i < (size_t)(2 + s) * w.bs ? (uint32_t)i : (uint32_t)(s * 1000 + i);
    w.next_id = 1;
    bool armed = false;
    for (int step = 0; step < TR_MAX_STEPS && fz_more(&in); step++) {
        snapshot before = snap(&w);
        uint8_t op = fz_u8(&in);
        switch (op % 10) {
        case 0:
        case 1:
            step_start(&w, &in, armed, &before);
            break;
        case 2:
            step_commit(&w, &in, armed, &before);
            break;
        case 3: {
            req *q = &w.rq[fz_below(&in, TR_N_REQ)];
            if (q->live && q->n_loads_open == 0) {
                int rrc = kvp_release(w.cache, q->id);
                FZ_ASSERT(rrc == KVP_OK, "release %llu: %s", (unsigned long long)q->id,
                          kvp_errmsg());
                q->live = false;
            }
            break;
        }
        case 4:
            take_stores(&w, 1 + fz_below(&in, 16));
            break;
        case 5:
        case 6:
            if (w.n_held)
                confirm(&w, fz_below(&in, w.n_held), fz_below(&in, 4) != 0);
            break;
        case 7:
            step_lookup(&w, &in);
            break;
        case 8:
            FZ_ASSERT(kvp_tier_confirm(w.cache, w.stale_id, true) == KVP_ENOENT, "stale id");
            if (w.n_held == 0) { /* no order handed out is live: any id is unknown */
                uint64_t id = (uint64_t)fz_u8(&in) << 32 | fz_u8(&in);
                FZ_ASSERT(kvp_tier_confirm(w.cache, id, true) == KVP_ENOENT, "bogus id");
            }
            if (fz_below(&in, 4) == 0)
                FZ_ASSERT(kvp_cache_reset(w.cache) == KVP_OK, "reset");
            break;
        default:
            w.alloc.fail_in = (int64_t)fz_below(&in, 4);
            armed = true;
            continue;
        }
        w.alloc.fail_in = -1;
        armed = false;
        FZ_ASSERT(kvp_cache_check(w.cache) == KVP_OK, "check after op %d: %s", op % 10,
                  kvp_errmsg());
    }
    /* Drain: answer every order, release every request; nothing stays pinned. */
    w.alloc.fail_in = -1;
    while (w.n_held)
        confirm(&w, w.n_held - 1, true);
    for (int r = 0; r < TR_N_REQ; r++)
        if (w.rq[r].live)
            FZ_ASSERT(kvp_release(w.cache, w.rq[r].id) == KVP_OK, "release");
    for (;;) {
        take_stores(&w, 16);
        if (w.n_held == 0)
            break;
        while (w.n_held)
            confirm(&w, w.n_held - 1, true);
    }
    kvp_stats st;
    FZ_ASSERT(kvp_cache_stats(w.cache, &st) == KVP_OK && st.n_blocks_in_use == 0,
              "%u device blocks still pinned", st.n_blocks_in_use);
    FZ_ASSERT(kvp_cache_check(w.cache) == KVP_OK, "final check");
    kvp_cache_free(w.cache);
    fz_alloc_check_empty(&w.alloc, "fuzz_tiers");
    return 0;
}
