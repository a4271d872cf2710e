/*
 * test_eviction.c - which block is recycled when the pool runs out.
 *
 * Pinned blocks are never evicted (KVP_ENOSPC with nothing changed when all are pinned);
 * free blocks are taken before LRU victims; a released chain is evicted tail first; kvp_access
 * touches a chain so that parents outlive children; kvp_lookup does not change LRU order; a
 * prompt with more full blocks than the pool keeps its first blocks; kvp_cache_reset drops
 * unpinned blocks and keeps pinned ones. Victims are observed through the event callback.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvprefix.h"
#include "testutil.h"

static uint32_t cached_run(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, size_t n)
{
    return th_lookup_ok(c, ns, t, n).n_blocks_cached;
}

static void keys_of(const kvp_namespace *ns, const uint32_t *t, size_t n, uint32_t bs,
                    kvp_key *keys, size_t cap)
{
    kvp_key root;
    size_t nk;
    cr_assert_eq(kvp_namespace_key(KVP_DEFAULT_SEED, ns, &root), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(KVP_DEFAULT_SEED, root, t, n, bs, keys, cap, &nk), KVP_OK);
}

/* The REMOVED events recorded from index `from` on. */
static size_t removed_since(const th_events *e, size_t from, kvp_event *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = from; i < e->n; i++)
        if (e->ev[i].type == KVP_EVENT_REMOVED && n < cap)
            out[n++] = e->ev[i];
    return n;
}

Test(eviction, pinned_blocks_are_never_evicted)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_events ev = {.n = 0};
    kvp_cache *c = th_cache(4, 2, false, th_events_fn, &ev);
    uint32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint32_t b[3] = {9, 9, 9};
    th_acquire_ok(c, 1, &ns, a, 6, 0); /* 3 blocks pinned */
    cr_assert_eq(kvp_commit(c, 1, a, 6, NULL), KVP_OK);
    th_access_ok(c, &ns, b, 2); /* the 4th block: cached, unpinned */
    kvp_stats before = th_stats(c);
    cr_assert_eq(before.n_blocks_in_use, 3);
    cr_assert_eq(before.n_blocks_cached, 1);
    size_t n_ev = ev.n;

    kvp_match m;
    memset(&m, 0x5a, sizeof m);
    kvp_match sentinel = m;
    cr_assert_eq(kvp_acquire(c, 2, &ns, b, 3, 0, &m), KVP_ENOSPC,
                 "1 fresh block needed; the only evictable block is the hit itself");
    cr_assert(memcmp(&m, &sentinel, sizeof m) == 0, "match written on failure");
    TH_CHECK(c);
    kvp_stats after = th_stats(c);
    th_assert_stats_equal(&before, &after, "failed acquire");
    cr_assert_eq(ev.n, n_ev, "a failed acquire emitted events");
    cr_assert_eq(cached_run(c, &ns, b, 2), 1, "the evictable block was evicted anyway");
    cr_assert_eq(kvp_acquire(c, 2, &ns, b, 3, 0, &m), KVP_ENOSPC, "request 2 was registered");

    cr_assert_eq(kvp_grow(c, 1, 10), KVP_ETOOBIG, "5 blocks in a pool of 4: never, not later");
    TH_CHECK(c);
    const uint32_t *ids;
    size_t n;
    cr_assert_eq(kvp_request_blocks(c, 1, &ids, &n), KVP_OK);
    cr_assert_eq(n, 3, "a failed grow changed the block table");

    /* Now pin the last block too: nothing at all is available. */
    cr_assert_eq(kvp_grow(c, 1, 8), KVP_OK);
    TH_CHECK(c);
    kvp_stats full = th_stats(c);
    cr_assert_eq(full.n_blocks_in_use, 4);
    cr_assert_eq(full.n_evictions, before.n_evictions + 1);
    cr_assert_eq(kvp_acquire(c, 3, &ns, b, 1, 0, &m), KVP_ENOSPC);
    cr_assert_eq(kvp_grow(c, 1, 8), KVP_OK, "already held");
    cr_assert_eq(kvp_grow(c, 1, 9), KVP_ETOOBIG, "5 blocks in a pool of 4");
    TH_CHECK(c);
    kvp_stats full2 = th_stats(c);
    th_assert_stats_equal(&full, &full2, "ENOSPC on a fully pinned pool");
    cr_assert_eq(cached_run(c, &ns, a, 7), 3, "pinned blocks lost their keys");
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    cr_assert_eq(th_stats(c).n_blocks_cached, 3);
    kvp_cache_free(c);
}

Test(eviction, access_on_a_pinned_pool_caches_nothing)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(2, 1, false, NULL, NULL);
    uint32_t a[2] = {1, 2}, b[2] = {3, 4};
    th_acquire_ok(c, 1, &ns, a, 2, 0);
    kvp_match m;
    cr_assert_eq(kvp_access(c, &ns, b, 2, &m), KVP_OK, "a full pool is not an error");
    TH_CHECK(c);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 2);
    cr_assert_eq(s.n_blocks_stored, 0);
    cr_assert_eq(s.n_evictions, 0);
    cr_assert_eq(cached_run(c, &ns, b, 2), 0);
    kvp_cache_free(c);
}

Test(eviction, free_blocks_before_lru_victims)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_events ev = {.n = 0};
    kvp_cache *c = th_cache(8, 2, false, th_events_fn, &ev);
    uint32_t a[4] = {1, 2, 3, 4};
    uint32_t b[12];
    for (int i = 0; i < 12; i++)
        b[i] = 100 + (uint32_t)i;
    th_access_ok(c, &ns, a, 4); /* 2 cached, 6 free */
    size_t n_ev = ev.n;
    th_acquire_ok(c, 1, &ns, b, 12, 0); /* exactly the 6 free blocks */
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_evictions, 0, "evicted while free blocks remained");
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_REMOVED, -1), 0);
    cr_assert_eq(ev.n, n_ev);
    cr_assert_eq(s.n_blocks_free, 0);
    cr_assert_eq(s.n_blocks_cached, 2);
    cr_assert_eq(cached_run(c, &ns, a, 4), 2);
    uint32_t d[1] = {7};
    th_acquire_ok(c, 2, &ns, d, 1, 0);
    s = th_stats(c);
    cr_assert_eq(s.n_evictions, 1);
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_REMOVED, KVP_REMOVED_EVICTED), 1);
    kvp_cache_free(c);
}

Test(eviction, released_chain_is_evicted_tail_first)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    th_events ev = {.n = 0};
    kvp_cache *c = th_cache(5, 2, false, th_events_fn, &ev);
    uint32_t t[9] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
    th_acquire_ok(c, 1, &ns, t, 9, 0); /* 4 full blocks + 1 partial: 5 blocks */
    const uint32_t *ids;
    size_t n;
    cr_assert_eq(kvp_request_blocks(c, 1, &ids, &n), KVP_OK);
    cr_assert_eq(n, 5);
    uint32_t chain[5];
    memcpy(chain, ids, sizeof chain);
    cr_assert_eq(kvp_commit(c, 1, t, 9, NULL), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 4);
    cr_assert_eq(s.n_blocks_free, 1, "the uncommitted partial block must be free");
    kvp_key keys[4];
    keys_of(&ns, t, 9, 2, keys, 4);

    size_t from = ev.n;
    uint32_t one[1];
    one[0] = 1000;
    th_acquire_ok(c, 100, &ns, one, 1, 0); /* takes the free block */
    kvp_event rm[8];
    cr_assert_eq(removed_since(&ev, from, rm, 8), 0, "evicted while a block was free");
    for (int k = 3; k >= 0; k--) {
        from = ev.n;
        one[0] = 1001 + (uint32_t)k;
        th_acquire_ok(c, 101 + (uint64_t)k, &ns, one, 1, 0);
        size_t nr = removed_since(&ev, from, rm, 8);
        cr_assert_eq(nr, 1, "one allocation evicted %zu blocks", nr);
        cr_assert_eq(rm[0].reason, KVP_REMOVED_EVICTED);
        cr_assert_eq(rm[0].block_id, chain[k],
                     "expected block %d of the chain (id %u) to go next, got id %u", k, chain[k],
                     rm[0].block_id);
        cr_assert(th_key_eq(rm[0].key, keys[k]), "evicted key is not block %d's key", k);
        cr_assert_eq(cached_run(c, &ns, t, 9), (uint32_t)k, "chain run after evicting %d", k);
    }
    kvp_cache_free(c);
}

Test(eviction, access_keeps_parents_more_recent)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_events ev = {.n = 0};
    kvp_cache *c = th_cache(4, 1, false, th_events_fn, &ev);
    uint32_t t[4] = {1, 2, 3, 4};
    th_access_ok(c, &ns, t, 4);
    kvp_key keys[4];
    keys_of(&ns, t, 4, 1, keys, 4);
    for (int k = 3; k >= 0; k--) {
        size_t from = ev.n;
        uint32_t one = 50 + (uint32_t)k;
        th_acquire_ok(c, (uint64_t)k, &ns, &one, 1, 0);
        kvp_event rm[4];
        cr_assert_eq(removed_since(&ev, from, rm, 4), 1);
        cr_assert(th_key_eq(rm[0].key, keys[k]), "access chain not evicted tail first at %d", k);
    }
    kvp_cache_free(c);
}

Test(eviction, released_requests_age_in_release_order)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(4, 1, false, NULL, NULL);
    uint32_t a[2] = {1, 2}, b[2] = {3, 4};
    th_acquire_ok(c, 1, &ns, a, 2, 0); /* acquired first, released last */
    th_acquire_ok(c, 2, &ns, b, 2, 0);
    cr_assert_eq(kvp_commit(c, 1, a, 2, NULL), KVP_OK);
    cr_assert_eq(kvp_commit(c, 2, b, 2, NULL), KVP_OK);
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    cr_assert_eq(kvp_release(c, 1), KVP_OK); /* a is now the most recent */
    TH_CHECK(c);
    uint32_t x = 9;
    th_acquire_ok(c, 3, &ns, &x, 1, 0); /* one victim: b's tail */
    cr_assert_eq(cached_run(c, &ns, a, 2), 2, "the most recently released chain was evicted");
    cr_assert_eq(cached_run(c, &ns, b, 2), 1);
    kvp_cache_free(c);
}

/* Fill a pool of 4 with chains A then B (A older), query A with `touch`, then allocate one
 * block; return whether the victim was A's tail. */
static bool victim_is_a(bool touch_with_access)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_events ev = {.n = 0};
    kvp_cache *c = th_cache(4, 1, false, th_events_fn, &ev);
    uint32_t a[2] = {1, 2}, b[2] = {3, 4};
    th_access_ok(c, &ns, a, 2);
    th_access_ok(c, &ns, b, 2);
    kvp_key ka[2], kb[2];
    keys_of(&ns, a, 2, 1, ka, 2);
    keys_of(&ns, b, 2, 1, kb, 2);
    kvp_stats before = th_stats(c);
    if (touch_with_access) {
        th_access_ok(c, &ns, a, 2);
    } else {
        kvp_match m;
        uint32_t ids[2];
        cr_assert_eq(kvp_lookup(c, &ns, a, 2, ids, 2, &m), KVP_OK);
        cr_assert_eq(m.n_blocks_cached, 2);
        kvp_stats after = th_stats(c);
        before.n_lookups++;
        th_assert_stats_equal(&before, &after, "kvp_lookup");
    }
    size_t from = ev.n;
    uint32_t x = 99;
    th_acquire_ok(c, 1, &ns, &x, 1, 0);
    kvp_event rm[2];
    cr_assert_eq(removed_since(&ev, from, rm, 2), 1);
    bool is_a = th_key_eq(rm[0].key, ka[1]);
    cr_assert(is_a || th_key_eq(rm[0].key, kb[1]), "the victim is neither chain's tail");
    kvp_cache_free(c);
    return is_a;
}

Test(eviction, lookup_does_not_touch_lru)
{
    cr_assert(victim_is_a(false), "kvp_lookup made chain A more recent");
    /* Control: kvp_access does touch, so B's tail goes instead. */
    cr_assert(!victim_is_a(true), "kvp_access did not make chain A more recent");
}

Test(eviction, long_prompt_keeps_first_blocks)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[6] = {1, 2, 3, 4, 5, 6};
    uint32_t rest[4] = {3, 4, 5, 6};

    kvp_cache *c = th_cache(4, 1, false, NULL, NULL);
    th_access_ok(c, &ns, t, 6);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 4);
    cr_assert_eq(cached_run(c, &ns, t, 6), 4, "the first 4 blocks must be kept");
    cr_assert_eq(cached_run(c, &ns, rest, 4), 0);
    /* Again, now with the first blocks already cached: they must not be their own victims. */
    th_access_ok(c, &ns, t, 6);
    cr_assert_eq(cached_run(c, &ns, t, 6), 4);
    cr_assert_eq(th_stats(c).n_blocks_stored, 4, "re-access of the kept prefix stored again");
    kvp_cache_free(c);

    /* With a short prefix cached beforehand. */
    c = th_cache(4, 1, false, NULL, NULL);
    th_access_ok(c, &ns, t, 2);
    th_access_ok(c, &ns, t, 6);
    cr_assert_eq(cached_run(c, &ns, t, 6), 4, "the cached prefix was evicted by its extension");
    kvp_cache_free(c);

    /* With one block pinned by a request: 3 blocks fit. */
    c = th_cache(4, 1, false, NULL, NULL);
    uint32_t x = 77;
    th_acquire_ok(c, 1, &ns, &x, 1, 0);
    th_access_ok(c, &ns, t, 6);
    cr_assert_eq(cached_run(c, &ns, t, 6), 3);
    cr_assert_eq(th_stats(c).n_blocks_cached, 3);
    kvp_cache_free(c);
}

Test(eviction, reset_drops_unpinned_keeps_pinned)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_events ev = {.n = 0};
    kvp_cache *c = th_cache(8, 2, false, th_events_fn, &ev);
    uint32_t x[6] = {1, 2, 3, 4, 5, 6};
    uint32_t y[5] = {7, 8, 9, 10, 11};
    th_access_ok(c, &ns, x, 6);        /* 3 cached */
    th_acquire_ok(c, 1, &ns, y, 5, 0); /* 3 blocks pinned, 2 committed below */
    cr_assert_eq(kvp_commit(c, 1, y, 5, NULL), KVP_OK);
    kvp_stats before = th_stats(c);
    size_t from = ev.n;
    cr_assert_eq(kvp_cache_reset(c), KVP_OK);
    TH_CHECK(c);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 0);
    cr_assert_eq(s.n_blocks_in_use, 3);
    cr_assert_eq(s.n_blocks_free, 5);
    cr_assert_eq(s.n_evictions, before.n_evictions, "reset counted as eviction");
    cr_assert_eq(s.n_requests_active, 1);
    cr_assert_eq(cached_run(c, &ns, x, 6), 0, "unpinned blocks survived reset");
    cr_assert_eq(cached_run(c, &ns, y, 5), 2, "pinned blocks lost their keys");
    kvp_event rm[8];
    cr_assert_eq(removed_since(&ev, from, rm, 8), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(rm[i].reason, KVP_REMOVED_RESET);
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_CLEARED, -1), 0,
                 "CLEARED while pinned blocks remain indexed");
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 2, "pinned blocks kept through reset must become cached");
    cr_assert_eq(kvp_cache_reset(c), KVP_OK);
    TH_CHECK(c);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 0);
    cr_assert_eq(s.n_blocks_free, 8);
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_CLEARED, -1), 1);
    /* The cache works normally afterwards. */
    th_access_ok(c, &ns, x, 6);
    cr_assert_eq(cached_run(c, &ns, x, 6), 3);
    kvp_cache_free(c);
}
