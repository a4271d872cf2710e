/*
 * test_isolation.c - what one namespace can do to another, and learn about it, through a
 * shared cache: per-namespace quotas (capacity isolation) and collision-proof mode under
 * forced key collisions (docs/security.md, attack table rows A5-A8).
 *
 * Quotas: a namespace never holds more cached blocks than its quota, its own least recently
 * used block going first; a flood from one tenant cannot evict another's blocks once the
 * quotas fit in the pool (with a shared LRU and no quotas, it can: the control case).
 *
 * Non-interference: with colliding keys forced (kvp__cache_set_key_bits), verification on
 * and quotas that fit, two runs that differ only in whether the victim sent its requests
 * give the attacker identical observations (match results, return codes, stored counts,
 * and the events of its own calls, keys included). fuzz/fuzz_noninterference.c fuzzes the
 * same property.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "internal.h"
#include "kvprefix.h"
#include "testutil.h"

static kvp_cache *quota_cache(uint32_t n_blocks, uint32_t bs, bool verify, uint32_t ns_quota,
                              kvp_event_fn fn, void *ud)
{
    kvp_config cfg = th_config(n_blocks, bs, verify, fn, ud);
    cfg.ns_quota = ns_quota;
    return th_cache_new(&cfg);
}

/* A one-token prompt numbered k: one block at block size 1 (looked up through
 * n_blocks_cached, since a prompt's last token is never a hit). */
static void one_block(uint32_t k, uint32_t *t)
{
    t[0] = 100 + k;
}

Test(quota, set_quota_arguments)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "a", NULL);
    kvp_cache *off = th_cache(8, 1, false, NULL, NULL);
    cr_assert_eq(kvp_cache_set_quota(off, &ns, 3), KVP_EINVAL, "quotas are off");
    kvp_cache_free(off);
    kvp_cache *c = quota_cache(8, 1, false, KVP_QUOTA_UNLIMITED, NULL, NULL);
    cr_assert_eq(kvp_cache_set_quota(NULL, &ns, 3), KVP_EINVAL);
    cr_assert_eq(kvp_cache_set_quota(c, NULL, 3), KVP_EINVAL);
    kvp_namespace bad = ns;
    bad.salt.ptr = NULL;
    bad.salt.len = 2;
    cr_assert_eq(kvp_cache_set_quota(c, &bad, 3), KVP_EINVAL);
    cr_assert_eq(kvp_cache_set_quota(c, &ns, 3), KVP_OK);
    cr_assert_eq(kvp_cache_set_quota(c, &ns, 2), KVP_OK); /* setting it again is fine */
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(quota, own_least_recent_blocks_go_first)
{
    th_events ev;
    memset(&ev, 0, sizeof ev);
    kvp_cache *c = quota_cache(16, 1, false, 4, th_events_fn, &ev);
    kvp_namespace a;
    th_ns(&a, "m", NULL, "a", NULL);
    uint32_t t[1];
    for (uint32_t k = 0; k < 6; k++) {
        one_block(k, t);
        th_access_ok(c, &a, t, 1);
    }
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 4, "quota 4, %u cached", s.n_blocks_cached);
    cr_assert_eq(s.n_evictions, 2);
    cr_assert_eq(s.n_blocks_free, 12, "quota evictions return blocks to the free list");
    cr_assert_eq(th_events_count(&ev, KVP_EVENT_REMOVED, KVP_REMOVED_EVICTED), 2);
    for (uint32_t k = 0; k < 6; k++) {
        one_block(k, t);
        cr_assert_eq(th_lookup_ok(c, &a, t, 1).n_blocks_cached, k >= 2, "block %u", k);
    }
    /* Lowering the quota evicts at once, least recent first; 0 caches nothing. */
    cr_assert_eq(kvp_cache_set_quota(c, &a, 1), KVP_OK);
    TH_CHECK(c);
    cr_assert_eq(th_stats(c).n_blocks_cached, 1);
    one_block(5, t);
    cr_assert_eq(th_lookup_ok(c, &a, t, 1).n_blocks_cached, 1);
    cr_assert_eq(kvp_cache_set_quota(c, &a, 0), KVP_OK);
    th_access_ok(c, &a, t, 1);
    cr_assert_eq(th_stats(c).n_blocks_cached, 0);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(quota, pinned_blocks_do_not_count_and_reset_works)
{
    kvp_cache *c = quota_cache(16, 1, true, 2, NULL, NULL);
    kvp_namespace a;
    th_ns(&a, "m", NULL, "a", NULL);
    uint32_t t[7] = {1, 2, 3, 4, 5, 6, 7};
    kvp_match m = th_acquire_ok(c, 1, &a, t, 7, 0);
    cr_assert_eq(m.n_blocks_hit, 0);
    cr_assert_eq(kvp_commit(c, 1, t, 7, NULL), KVP_OK);
    cr_assert_eq(th_stats(c).n_blocks_in_use, 7);
    cr_assert_eq(th_lookup_ok(c, &a, t, 7).n_blocks_cached, 7, "pinned blocks are all cached");
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    /* Released tail first: the two blocks left are the prefix. */
    cr_assert_eq(th_stats(c).n_blocks_cached, 2);
    cr_assert_eq(th_lookup_ok(c, &a, t, 7).n_blocks_cached, 2);
    cr_assert_eq(kvp_cache_reset(c), KVP_OK);
    TH_CHECK(c);
    cr_assert_eq(th_stats(c).n_blocks_cached, 0);
    kvp_cache_free(c);
}

/* A caches 8 blocks; B then accesses 200 distinct blocks in a 24-block pool. With a shared
 * LRU (no quotas) A's blocks are gone; with quotas of 8 each, all of them stay. */
static uint32_t flood(uint32_t ns_quota, bool verify)
{
    kvp_cache *c = quota_cache(24, 1, verify, ns_quota, NULL, NULL);
    kvp_namespace a, b;
    th_ns(&a, "m", NULL, "alice", NULL);
    th_ns(&b, "m", NULL, "mallory", NULL);
    uint32_t t[1];
    for (uint32_t k = 0; k < 8; k++) {
        one_block(k, t);
        th_access_ok(c, &a, t, 1);
    }
    for (uint32_t k = 0; k < 200; k++) {
        one_block(1000 + k, t);
        th_access_ok(c, &b, t, 1);
    }
    uint32_t kept = 0;
    for (uint32_t k = 0; k < 8; k++) {
        one_block(k, t);
        kept += th_lookup_ok(c, &a, t, 1).n_blocks_cached;
    }
    TH_CHECK(c);
    kvp_cache_free(c);
    return kept;
}

Test(quota, flood_cannot_evict_another_namespace)
{
    cr_assert_eq(flood(0, false), 0, "control: the shared LRU should have evicted A");
    cr_assert_eq(flood(8, false), 8, "B evicted A's blocks despite quotas");
    cr_assert_eq(flood(8, true), 8, "B evicted A's blocks despite quotas (verify)");
}

/* Prime and probe: B caches 8 blocks, A runs (or not) 40 requests of its own, B probes
 * its blocks. With quotas B's hit count is the same in both worlds; without, A's activity
 * shows in B's hits. */
static uint64_t prime_probe(uint32_t ns_quota, bool victim_active)
{
    kvp_cache *c = quota_cache(24, 1, false, ns_quota, NULL, NULL);
    kvp_namespace a, b;
    th_ns(&a, "m", NULL, "alice", NULL);
    th_ns(&b, "m", NULL, "mallory", NULL);
    uint32_t t[1];
    for (uint32_t k = 0; k < 8; k++) {
        one_block(k, t);
        th_access_ok(c, &b, t, 1);
    }
    for (uint32_t k = 0; victim_active && k < 40; k++) {
        one_block(500 + k, t);
        th_access_ok(c, &a, t, 1);
    }
    uint64_t hits = 0;
    for (uint32_t k = 0; k < 8; k++) {
        one_block(k, t);
        hits += th_lookup_ok(c, &b, t, 1).n_blocks_cached;
    }
    kvp_cache_free(c);
    return hits;
}

Test(quota, prime_and_probe_sees_nothing)
{
    cr_assert_neq(prime_probe(0, true), prime_probe(0, false), "control: no oracle without");
    cr_assert_eq(prime_probe(8, true), prime_probe(8, false));
}

/* ---------------------------------------------------------------- non-interference */

#define NI_BS    2
#define NI_POOL  48
#define NI_QUOTA 16 /* two namespaces: 32 cached + at most 12 pinned (one request) <= 48 */

/* The attacker's view of one world, as a running digest of everything it can observe. */
typedef struct view {
    uint64_t digest;
    bool attacker_call; /* events are recorded only during the attacker's calls */
} view;

static void mix(view *v, uint64_t x)
{
    v->digest = (v->digest ^ x) * UINT64_C(0x100000001b3);
}

static void view_event(void *ud, const kvp_event *ev)
{
    view *v = ud;
    if (!v->attacker_call)
        return;
    mix(v, (uint64_t)ev->type << 8 | (uint64_t)ev->reason);
    mix(v, ev->key.lo);
    mix(v, ev->key.hi);
    mix(v, ev->parent.lo);
    mix(v, ev->parent_is_root);
}

static void view_match(view *v, int rc, const kvp_match *m)
{
    mix(v, (uint64_t)(int64_t)rc);
    if (rc == KVP_OK) {
        mix(v, m->n_blocks_cached);
        mix(v, m->n_blocks_hit);
    }
}

/* Random prompts over a 3-token alphabet (so prefixes repeat and, at 6-bit keys, keys
 * collide all the time) for either tenant; the attacker also replays the victim's prompts
 * in its own namespace (same tokens, colliding or equal keys on its side). */
static uint64_t ni_world(uint64_t seed, bool victim_active, bool verify, uint32_t quota,
                         uint64_t *n_rejects)
{
    view v = {UINT64_C(0xcbf29ce484222325), false};
    kvp_cache *c = quota_cache(NI_POOL, NI_BS, verify, quota, view_event, &v);
    cr_assert_eq(kvp__cache_set_key_bits(c, 6), KVP_OK);
    kvp_namespace a, b;
    th_ns(&a, "m", NULL, "alice", NULL);
    th_ns(&b, "m", NULL, "mallory", NULL);
    uint64_t rng = seed;
    uint32_t t[24];
    for (int step = 0; step < 300; step++) {
        uint64_t r = th_rand(&rng);
        size_t n = 1 + (size_t)(r % 23);
        for (size_t i = 0; i < n; i++)
            t[i] = (uint32_t)(th_rand(&rng) % 3);
        bool victim = (r >> 8) % 2 == 0, lookup = (r >> 9) % 3 == 0;
        kvp_match m;
        if (victim) {
            if (victim_active)
                th_access_ok(c, &a, t, n);
            continue;
        }
        v.attacker_call = true;
        if (lookup) {
            view_match(&v, kvp_lookup(c, &b, t, n, NULL, 0, &m), &m);
        } else {
            int rc = kvp_acquire(c, 1, &b, t, n, 0, &m);
            view_match(&v, rc, &m);
            size_t stored = 0;
            if (rc == KVP_OK) {
                mix(&v, (uint64_t)kvp_commit(c, 1, t, n, &stored));
                mix(&v, stored);
                mix(&v, (uint64_t)kvp_release(c, 1));
            }
        }
        v.attacker_call = false;
        TH_CHECK(c);
    }
    *n_rejects = th_stats(c).n_verify_rejects;
    kvp_cache_free(c);
    return v.digest;
}

Test(noninterference, colliding_keys_verify_and_quotas)
{
    uint64_t met = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        uint64_t r_with, r_without;
        uint64_t with = ni_world(seed, true, true, NI_QUOTA, &r_with);
        uint64_t without = ni_world(seed, false, true, NI_QUOTA, &r_without);
        cr_assert_eq(with, without,
                     "seed %llu: the attacker can tell whether the victim was active",
                     (unsigned long long)seed);
        met += r_with > r_without; /* the victim's blocks were met and rejected */
    }
    cr_assert_geq(met, 15, "the attacker met the victim's colliding blocks in %llu runs only",
                  (unsigned long long)met);
}

/* The property is not vacuous: without verification (false hits) or without quotas (a
 * shared LRU), the attacker's view depends on the victim's activity. */
Test(noninterference, controls_do_leak)
{
    uint32_t leaks_noverify = 0, leaks_noquota = 0;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        uint64_t r;
        leaks_noverify +=
            ni_world(seed, true, false, NI_QUOTA, &r) != ni_world(seed, false, false, NI_QUOTA, &r);
        leaks_noquota += ni_world(seed, true, true, 0, &r) != ni_world(seed, false, true, 0, &r);
    }
    cr_assert_geq(leaks_noverify, 15);
    cr_assert_geq(leaks_noquota, 15);
}

/* ---------------------------------------------------------------- the checkers catch */

/* Each kind of corruption of the quota lists and of the collision-tolerant index is caught
 * by kvp_cache_check, and undoing it makes the cache consistent again. */
Test(checker, quota_and_index_corruption)
{
    kvp_cache *c = quota_cache(16, 1, true, 4, NULL, NULL);
    kvp_namespace a;
    th_ns(&a, "m", NULL, "a", NULL);
    uint32_t t[3] = {1, 2, 3};
    th_access_ok(c, &a, t, 3);
    kvp__qgroup *g = c->quota.by_root; /* the only group */
    cr_assert_not_null(g);
    cr_assert_eq(HASH_COUNT(c->quota.by_root), 1);
    cr_assert_eq(g->n_cached, 3);
    uint32_t head = g->head, second = c->quota.next[head];

    g->n_cached++; /* a count that disagrees with the list */
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    g->n_cached--;
    g->quota = 2; /* a group over its quota */
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    g->quota = 4;
    c->quota.prev[second] = KVP_NIL; /* a broken back link */
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    c->quota.prev[second] = head;
    uint32_t free_id = c->pool.free_head; /* a group on a block that is not indexed */
    c->quota.group[free_id] = g;
    cr_assert_eq(kvp_cache_check(c), KVP_ECORRUPT);
    c->quota.group[free_id] = NULL;
    TH_CHECK(c);

    /* A second block under the same key with the same tokens and provenance: two blocks no
     * verification could tell apart. */
    kvp__block *b = &c->pool.blocks[head];
    kvp__index_add(&c->index, &c->pool.blocks[free_id], b->key);
    /* pinned, so the pool's lists stay consistent */
    c->pool.state[free_id] = KVP__ST_IN_USE | KVP__ST_INDEXED | 1;
    c->pool.n_free--;
    c->pool.n_in_use++;
    c->pool.free_head = c->pool.blocks[free_id].next;
    c->pool.blocks[free_id].next = KVP_NIL;
    c->verify.meta[free_id] = c->verify.meta[head];
    c->verify.meta[free_id].ns = KVP_NIL;
    c->verify.meta[head].ns = KVP_NIL;
    memcpy(c->verify.tokens + free_id, c->verify.tokens + head, sizeof(uint32_t));
    cr_assert_eq(kvp__index_check(c), KVP_ECORRUPT);
    c->verify.tokens[free_id] ^= 1; /* other tokens: a legitimate collision */
    cr_assert_eq(kvp__index_check(c), KVP_OK);
    kvp_cache_free(c);
}
