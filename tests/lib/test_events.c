/*
 * test_events.c - the event callback (kvp_config.on_event).
 *
 * STORED events carry the block key, its parent and parent_is_root exactly as
 * kvp_hash_blocks / kvp_external_key compute them with the cache's seed (the parent of block
 * 0 is the namespace root); REMOVED carries reason EVICTED on eviction and RESET on reset;
 * CLEARED follows a reset that empties the index; lookups and kvp_cache_free emit nothing;
 * calling the same cache from inside a callback fails with KVP_EBUSY and changes nothing,
 * while another cache may be used.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvprefix.h"
#include "testutil.h"

#define SEED UINT64_C(0x5eed5eed12345678)

static bool key_zero(kvp_key a)
{
    return a.lo == 0 && a.hi == 0;
}

/* A cache with seed SEED whose events ev records. */
static kvp_cache *seeded_cache(uint32_t n_blocks, uint32_t bs, th_events *ev)
{
    kvp_config cfg = th_config(n_blocks, bs, false, th_events_fn, ev);
    cfg.seed = SEED;
    return th_cache_new(&cfg);
}

/* The STORED event with this key among events [from, e->n), or NULL. */
static const kvp_event *stored_with_key(const th_events *e, size_t from, kvp_key key)
{
    const kvp_event *found = NULL;
    for (size_t i = from; i < e->n; i++)
        if (e->ev[i].type == KVP_EVENT_STORED && th_key_eq(e->ev[i].key, key)) {
            cr_assert_null(found, "two STORED events for one key");
            found = &e->ev[i];
        }
    return found;
}

static void check_chain_events(const th_events *e, size_t from, kvp_key root, const kvp_key *keys,
                               size_t n, uint32_t bs)
{
    for (size_t i = 0; i < n; i++) {
        const kvp_event *ev = stored_with_key(e, from, keys[i]);
        cr_assert_not_null(ev, "no STORED event with the key of block %zu", i);
        cr_assert_eq(ev->reason, 0);
        cr_assert_eq(ev->n_tokens, bs, "STORED n_tokens %u, block size %u", ev->n_tokens, bs);
        cr_assert_eq(ev->parent_is_root, i == 0, "block %zu parent_is_root", i);
        cr_assert(th_key_eq(ev->parent, i == 0 ? root : keys[i - 1]), "block %zu: parent is not %s",
                  i, i == 0 ? "the namespace root" : "the previous block's key");
    }
}

Test(events, stored_matches_hash_blocks)
{
    th_events ev = {.n = 0};
    kvp_cache *c = seeded_cache(16, 4, &ev);
    kvp_namespace ns;
    th_ns(&ns, "model", "adapter", "tenant", NULL);
    kvp_key root, keys[3];
    size_t nk;
    cr_assert_eq(kvp_namespace_key(SEED, &ns, &root), KVP_OK);
    uint32_t t[14];
    for (int i = 0; i < 14; i++)
        t[i] = 1000 + (uint32_t)i;
    cr_assert_eq(kvp_hash_blocks(SEED, root, t, 14, 4, keys, 3, &nk), KVP_OK);

    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, t, 14, &m), KVP_OK);
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_STORED, -1), 3);
    cr_assert_eq(ev.n, 3, "kvp_access emitted %zu events, expected 3 STORED", ev.n);
    check_chain_events(&ev, 0, root, keys, 3, 4);

    /* Through acquire/commit: block ids are the request's table entries. */
    uint32_t u[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};
    kvp_key ku[2];
    cr_assert_eq(kvp_hash_blocks(SEED, root, u, 9, 4, ku, 2, &nk), KVP_OK);
    cr_assert_eq(kvp_acquire(c, 1, &ns, u, 9, 0, &m), KVP_OK);
    const uint32_t *ids;
    size_t n;
    cr_assert_eq(kvp_request_blocks(c, 1, &ids, &n), KVP_OK);
    size_t from = ev.n;
    cr_assert_eq(kvp_commit(c, 1, u, 9, NULL), KVP_OK);
    cr_assert_eq(ev.n - from, 2);
    check_chain_events(&ev, from, root, ku, 2, 4);
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(stored_with_key(&ev, from, ku[i])->block_id, ids[i],
                     "STORED block_id of block %zu is not the table entry", i);

    /* A deduplicated commit stores nothing and says nothing. */
    cr_assert_eq(kvp_acquire(c, 2, &ns, u, 8, 0, &m), KVP_OK);
    from = ev.n;
    cr_assert_eq(kvp_commit(c, 2, u, 8, NULL), KVP_OK);
    cr_assert_eq(ev.n, from, "a duplicate block emitted an event");
    TH_CHECK(c);
    /* Lookups are silent. */
    cr_assert_eq(kvp_lookup(c, &ns, t, 14, NULL, 0, &m), KVP_OK);
    cr_assert_eq(ev.n, from, "kvp_lookup emitted an event");
    kvp_cache_free(c);
    cr_assert_eq(ev.n, from, "kvp_cache_free emitted an event");
}

Test(events, stored_for_external_ids)
{
    th_events ev = {.n = 0};
    kvp_cache *c = seeded_cache(16, 4, &ev);
    kvp_namespace ns;
    th_ns(&ns, "model", NULL, "tenant", NULL);
    kvp_key root;
    cr_assert_eq(kvp_namespace_key(SEED, &ns, &root), KVP_OK);
    kvp_key ids[3] = {{7, 70}, {8, 80}, {9, 90}};
    kvp_key keys[3];
    for (int i = 0; i < 3; i++)
        keys[i] = kvp_external_key(SEED, root, ids[i]);
    kvp_match m;
    cr_assert_eq(kvp_access_ids(c, &ns, ids, 3, 12, &m), KVP_OK);
    cr_assert_eq(ev.n, 3);
    check_chain_events(&ev, 0, root, keys, 3, 4);
    kvp_cache_free(c);
}

Test(events, removed_on_eviction)
{
    th_events ev = {.n = 0};
    kvp_cache *c = seeded_cache(2, 2, &ev);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t a[4] = {1, 2, 3, 4}, b[2] = {5, 6};
    kvp_key root, ka[2];
    size_t nk;
    cr_assert_eq(kvp_namespace_key(SEED, &ns, &root), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(SEED, root, a, 4, 2, ka, 2, &nk), KVP_OK);
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, a, 4, &m), KVP_OK);
    uint32_t stored_id = stored_with_key(&ev, 0, ka[1])->block_id;
    size_t from = ev.n;
    cr_assert_eq(kvp_access(c, &ns, b, 2, &m), KVP_OK); /* evicts a's tail */
    TH_CHECK(c);
    cr_assert_eq(ev.n - from, 2, "expected REMOVED then STORED, got %zu events", ev.n - from);
    const kvp_event *rm = &ev.ev[from];
    cr_assert_eq(rm->type, KVP_EVENT_REMOVED, "the removal must precede the reuse");
    cr_assert_eq(rm->reason, KVP_REMOVED_EVICTED);
    cr_assert(th_key_eq(rm->key, ka[1]), "REMOVED key is not the evicted block's key");
    cr_assert_eq(rm->block_id, stored_id, "REMOVED block_id %u, the block was %u", rm->block_id,
                 stored_id);
    cr_assert_eq(ev.ev[from + 1].type, KVP_EVENT_STORED);
    cr_assert_eq(ev.ev[from + 1].block_id, stored_id, "the victim was not the block reused");
    kvp_cache_free(c);
}

Test(events, removed_and_cleared_on_reset)
{
    th_events ev = {.n = 0};
    kvp_cache *c = seeded_cache(8, 2, &ev);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t a[6] = {1, 2, 3, 4, 5, 6};
    kvp_key root, ka[3];
    size_t nk;
    cr_assert_eq(kvp_namespace_key(SEED, &ns, &root), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(SEED, root, a, 6, 2, ka, 3, &nk), KVP_OK);
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, a, 6, &m), KVP_OK);
    uint32_t id[3];
    for (int i = 0; i < 3; i++)
        id[i] = stored_with_key(&ev, 0, ka[i])->block_id;
    size_t from = ev.n;
    cr_assert_eq(kvp_cache_reset(c), KVP_OK);
    TH_CHECK(c);
    cr_assert_eq(ev.n - from, 4, "expected 3 REMOVED + CLEARED, got %zu events", ev.n - from);
    bool seen[3] = {false, false, false};
    for (size_t i = from; i < from + 3; i++) {
        const kvp_event *e = &ev.ev[i];
        cr_assert_eq(e->type, KVP_EVENT_REMOVED);
        cr_assert_eq(e->reason, KVP_REMOVED_RESET);
        int k = -1;
        for (int j = 0; j < 3; j++)
            if (th_key_eq(e->key, ka[j]))
                k = j;
        cr_assert_geq(k, 0, "REMOVED key is none of the cached keys");
        cr_assert(!seen[k], "block %d removed twice", k);
        seen[k] = true;
        cr_assert_eq(e->block_id, id[k]);
    }
    const kvp_event *cl = &ev.ev[from + 3];
    cr_assert_eq(cl->type, KVP_EVENT_CLEARED, "CLEARED must come last");
    cr_assert_eq(cl->reason, 0);
    cr_assert_eq(cl->block_id, 0);
    cr_assert_eq(cl->n_tokens, 0);
    cr_assert(key_zero(cl->key), "CLEARED key must be zero");
    kvp_cache_free(c);
}

Test(events, reset_of_empty_index_is_cleared)
{
    /* "KVP_EVENT_CLEARED follows if the index is then empty": also when it already was. */
    th_events ev = {.n = 0};
    kvp_cache *c = seeded_cache(8, 2, &ev);
    cr_assert_eq(kvp_cache_reset(c), KVP_OK);
    cr_assert_eq(ev.n, 1, "expected one event, got %zu", ev.n);
    cr_assert_eq(ev.ev[0].type, KVP_EVENT_CLEARED);
    kvp_cache_free(c);
}

/* A callback that calls back into the cache and records what every call returned. */
typedef struct reentry {
    kvp_cache *self;  /* the cache whose callback this is */
    kvp_cache *other; /* another cache, usable from the callback */
    int rc[12];
    int other_rc;
    int n_calls;
} reentry;

static void reentry_fn(void *ud, const kvp_event *ev)
{
    reentry *r = ud;
    if (r->n_calls++ > 0 || !r->self)
        return;
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[4] = {1, 2, 3, 4};
    kvp_key ids[2] = {{1, 2}, {3, 4}};
    kvp_match m;
    size_t stored;
    r->rc[0] = kvp_lookup(r->self, &ns, t, 4, NULL, 0, &m);
    r->rc[1] = kvp_acquire(r->self, 42, &ns, t, 4, 0, &m);
    r->rc[2] = kvp_grow(r->self, 7, 100);
    r->rc[3] = kvp_commit(r->self, 7, t, 4, &stored);
    r->rc[4] = kvp_release(r->self, 7);
    r->rc[5] = kvp_access(r->self, &ns, t, 4, &m);
    r->rc[6] = kvp_lookup_ids(r->self, &ns, ids, 2, 4, NULL, 0, &m);
    r->rc[7] = kvp_access_ids(r->self, &ns, ids, 2, 4, &m);
    r->rc[8] = kvp_cache_reset(r->self);
    r->other_rc = kvp_access(r->other, &ns, t, 4, &m);
    (void)ev;
}

Test(events, reentry_is_busy)
{
    reentry r;
    memset(&r, 0, sizeof r);
    kvp_cache *c = th_cache(16, 2, false, reentry_fn, &r);
    r.other = th_cache(16, 2, false, NULL, NULL);

    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[5] = {9, 8, 7, 6, 5};
    kvp_match m;
    cr_assert_eq(kvp_acquire(c, 7, &ns, t, 5, 0, &m), KVP_OK); /* the callback's target */
    kvp_stats before;
    cr_assert_eq(kvp_cache_stats(c, &before), KVP_OK);
    r.self = c;
    cr_assert_eq(kvp_commit(c, 7, t, 5, NULL), KVP_OK); /* STORED: the callback runs */
    cr_assert_geq(r.n_calls, 1, "the callback did not run");
    static const char *names[] = {"kvp_lookup",     "kvp_acquire",    "kvp_grow",
                                  "kvp_commit",     "kvp_release",    "kvp_access",
                                  "kvp_lookup_ids", "kvp_access_ids", "kvp_cache_reset"};
    for (int i = 0; i < 9; i++)
        cr_assert_eq(r.rc[i], KVP_EBUSY, "%s from inside a callback returned %d (%s)", names[i],
                     r.rc[i], kvp_strerror(r.rc[i]));
    cr_assert_eq(r.other_rc, KVP_OK, "another cache must be usable from a callback");
    TH_CHECK(c);
    kvp_stats after;
    cr_assert_eq(kvp_cache_stats(c, &after), KVP_OK);
    cr_assert_eq(after.n_lookups, before.n_lookups, "a busy lookup was counted");
    cr_assert_eq(after.n_requests, before.n_requests, "a busy acquire/access was counted");
    cr_assert_eq(after.n_requests_active, 1, "a busy call started or ended a request");
    cr_assert_eq(after.n_blocks_stored, before.n_blocks_stored + 2);
    const uint32_t *ids;
    size_t n;
    cr_assert_eq(kvp_request_blocks(c, 7, &ids, &n), KVP_OK);
    cr_assert_eq(n, 3, "a busy grow changed the request");
    /* Outside the callback the cache works again. */
    r.self = NULL;
    cr_assert_eq(kvp_lookup(c, &ns, t, 5, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 2);
    cr_assert_eq(kvp_release(c, 7), KVP_OK);
    TH_CHECK(c);
    kvp_cache_free(c);
    kvp_cache_free(r.other);
}

/* Copies each STORED event's tokens during the callback (the pointer dies with it). */
typedef struct tok_rec {
    size_t n;              /* STORED events seen */
    bool has[8];           /* tokens was non-NULL */
    uint32_t tokens[8][4]; /* the copies (block size 4) */
} tok_rec;

static void tok_fn(void *ud, const kvp_event *ev)
{
    tok_rec *r = ud;
    if (ev->type != KVP_EVENT_STORED || r->n >= 8)
        return;
    r->has[r->n] = ev->tokens != NULL;
    if (ev->tokens)
        memcpy(r->tokens[r->n], ev->tokens, ev->n_tokens * sizeof(uint32_t));
    r->n++;
}

/* STORED carries the block's tokens from kvp_access, kvp_commit and kvp_access_keys with
 * tokens; none from kvp_access_ids, which has no tokens. */
Test(events, stored_carries_the_block_tokens)
{
    for (int verify = 0; verify < 2; verify++) {
        tok_rec r = {0};
        kvp_cache *c = th_cache(16, 4, verify, tok_fn, &r);
        kvp_namespace ns;
        th_ns(&ns, "model", NULL, NULL, NULL);
        uint32_t t[10];
        for (uint32_t i = 0; i < 10; i++)
            t[i] = 300 + i;
        kvp_match m;
        cr_assert_eq(kvp_access(c, &ns, t, 10, &m), KVP_OK);
        cr_assert_eq(r.n, 2);
        for (size_t b = 0; b < 2; b++) {
            cr_assert(r.has[b], "kvp_access: block %zu has no tokens", b);
            cr_assert_arr_eq(r.tokens[b], t + 4 * b, 4 * sizeof(uint32_t));
        }
        uint32_t u[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        cr_assert_eq(kvp_acquire(c, 1, &ns, u, 8, 0, &m), KVP_OK);
        cr_assert_eq(kvp_commit(c, 1, u, 8, NULL), KVP_OK);
        cr_assert_eq(r.n, 4);
        for (size_t b = 0; b < 2; b++) {
            cr_assert(r.has[2 + b], "kvp_commit: block %zu has no tokens", b);
            cr_assert_arr_eq(r.tokens[2 + b], u + 4 * b, 4 * sizeof(uint32_t));
        }
        cr_assert_eq(kvp_release(c, 1), KVP_OK);
        uint32_t w[4] = {9, 9, 9, 9};
        kvp_key root, keys[1];
        size_t nk;
        cr_assert_eq(kvp_cache_keys(c, &ns, w, 4, &root, keys, 1, &nk), KVP_OK);
        cr_assert_eq(kvp_access_keys(c, &ns, root, keys, w, 4, &m), KVP_OK);
        cr_assert_eq(r.n, 5);
        cr_assert(r.has[4], "kvp_access_keys with tokens: no tokens");
        cr_assert_arr_eq(r.tokens[4], w, sizeof w);
        if (!verify) {
            kvp_key ids[1] = {{42, 43}};
            cr_assert_eq(kvp_access_ids(c, &ns, ids, 1, 4, &m), KVP_OK);
            cr_assert_eq(r.n, 6);
            cr_assert_not(r.has[5], "kvp_access_ids has no tokens to give");
        }
        TH_CHECK(c);
        kvp_cache_free(c);
    }
}
