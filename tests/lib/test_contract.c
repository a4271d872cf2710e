/*
 * test_contract.c - the contract points an embedding frontend relies on:
 *  - a request larger than the whole pool is KVP_ETOOBIG (never fits), distinct from
 *    KVP_ENOSPC (fits once other requests release); both change nothing;
 *  - kvp_access reports how many blocks it newly cached (n_blocks_stored), which is fewer
 *    than the uncached full blocks when the pool is pinned full or the prompt is too long;
 *  - kvp_commit refuses a sequence that does not begin with the acquired prompt (also for a
 *    prefill committed in chunks, and in the prompt's partial last block), changing nothing;
 *  - kvp_cache_requests lists the active requests; kvp_release_all ends them all and keeps
 *    what they committed cached;
 *  - kvp_request_blocks' table stays put while other requests come and go.
 */
#include "testutil.h"

static void prompt(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

Test(contract, too_big_is_not_no_space)
{
    th_events ev = {0};
    kvp_cache *c = th_cache(8, 4, false, th_events_fn, &ev);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[64];
    prompt(t, 64, 1);
    kvp_match m;
    kvp_stats before = th_stats(c);
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 33, 0, &m), KVP_ETOOBIG, "9 blocks, pool of 8");
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 8, 40, &m), KVP_ETOOBIG, "capacity counts too");
    kvp_stats after = th_stats(c);
    th_assert_stats_equal(&before, &after, "ETOOBIG changes nothing");
    th_acquire_ok(c, 1, &ns, t, 24, 0); /* 6 of 8 blocks pinned */
    cr_assert_eq(kvp_acquire(c, 2, &ns, t + 30, 12, 0, &m), KVP_ENOSPC, "3 blocks, 2 left");
    cr_assert_eq(kvp_grow(c, 1, 36), KVP_ETOOBIG, "grow to 9 blocks");
    cr_assert_eq(kvp_grow(c, 1, 32), KVP_OK, "grow to all 8 blocks");
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    cr_assert_eq(kvp_acquire(c, 2, &ns, t + 30, 12, 0, &m), KVP_OK, "fits after the release");
    cr_assert_eq(ev.n, 0, "no block was ever committed, so no events");
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(contract, access_reports_blocks_stored)
{
    kvp_cache *c = th_cache(6, 2, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[32];
    prompt(t, 32, 100);
    kvp_match m = th_access_ok(c, &ns, t, 9);
    cr_assert_eq(m.n_blocks_stored, 4, "4 full blocks, all new");
    m = th_access_ok(c, &ns, t, 11);
    cr_assert_eq(m.n_blocks_cached, 4);
    cr_assert_eq(m.n_blocks_stored, 1, "only the fifth block is new");
    kvp_stats s0 = th_stats(c);
    m = th_access_ok(c, &ns, t + 12, 20); /* 10 full blocks, pool of 6 */
    cr_assert_eq(m.n_blocks_stored, 6, "a prompt longer than the pool keeps its first 6");
    cr_assert_eq(th_stats(c).n_blocks_stored - s0.n_blocks_stored, 6);
    /* Pin 5 of the 6 blocks: an access can cache one block at most. */
    th_acquire_ok(c, 7, &ns, t, 10, 0);
    m = th_access_ok(c, &ns, t + 20, 8);
    cr_assert_eq(m.n_blocks_full, 4);
    cr_assert_eq(m.n_blocks_stored, 1, "the pool is pinned but for one block");
    kvp_match l = th_lookup_ok(c, &ns, t, 10);
    cr_assert_eq(l.n_blocks_stored, 0, "lookups store nothing");
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(contract, commit_checks_the_prompt)
{
    th_events ev = {0};
    kvp_cache *c = th_cache(32, 4, false, th_events_fn, &ev);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t p[18], seq[30];
    prompt(p, 18, 1);
    th_acquire_ok(c, 1, &ns, p, 18, 30);
    memcpy(seq, p, sizeof p);
    for (int i = 18; i < 30; i++)
        seq[i] = 900 + (uint32_t)i;
    kvp_stats before = th_stats(c);
    seq[5] = 77; /* inside the prompt's second block */
    cr_assert_eq(kvp_commit(c, 1, seq, 18, NULL), KVP_EINVAL, "a different prompt token");
    seq[5] = p[5];
    seq[17] = 77; /* in the prompt's partial last block */
    cr_assert_eq(kvp_commit(c, 1, seq, 20, NULL), KVP_EINVAL, "the partial block differs");
    kvp_stats after = th_stats(c);
    th_assert_stats_equal(&before, &after, "refused commits change nothing");
    cr_assert_eq(ev.n, 0, "refused commits emit nothing");
    seq[17] = p[17];
    size_t n_stored;
    cr_assert_eq(kvp_commit(c, 1, seq, 9, &n_stored), KVP_OK, "a first prefill chunk");
    cr_assert_eq(n_stored, 2);
    seq[12] = 5;
    cr_assert_eq(kvp_commit(c, 1, seq, 16, NULL), KVP_EINVAL, "the second chunk differs");
    seq[12] = p[12];
    cr_assert_eq(kvp_commit(c, 1, seq, 16, &n_stored), KVP_OK);
    cr_assert_eq(n_stored, 2);
    cr_assert_eq(kvp_commit(c, 1, seq, 30, &n_stored), KVP_OK, "the rest, with generated tokens");
    cr_assert_eq(n_stored, 3);
    cr_assert_eq(kvp_release(c, 1), KVP_OK);
    TH_CHECK(c);
    /* A request whose prompt is fully cached keeps nothing beyond its hits to compare. */
    th_acquire_ok(c, 2, &ns, p, 17, 24);
    seq[16] = 555;
    cr_assert_eq(kvp_commit(c, 2, seq, 24, NULL), KVP_EINVAL, "token 16 is the prompt's last");
    seq[16] = p[16];
    cr_assert_eq(kvp_commit(c, 2, seq, 24, &n_stored), KVP_OK);
    cr_assert_eq(n_stored, 0, "all blocks were cached already: deduplicated");
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(contract, list_and_release_all)
{
    th_events ev = {0};
    kvp_cache *c = th_cache(64, 4, true, th_events_fn, &ev);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[40];
    prompt(t, 40, 3);
    size_t n;
    cr_assert_eq(kvp_cache_requests(c, NULL, 0, &n), KVP_OK);
    cr_assert_eq(n, 0);
    for (uint64_t id = 10; id < 15; id++)
        th_acquire_ok(c, id, &ns, t, 8 + (size_t)id, 0);
    cr_assert_eq(kvp_commit(c, 14, t, 22, NULL), KVP_OK);
    uint64_t ids[8] = {0};
    cr_assert_eq(kvp_cache_requests(c, ids, 3, &n), KVP_OK);
    cr_assert_eq(n, 5, "the count is the total, whatever cap is");
    cr_assert_eq(kvp_cache_requests(c, ids, 8, &n), KVP_OK);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += ids[i];
    cr_assert_eq(sum, 10 + 11 + 12 + 13 + 14, "every id once");
    cr_assert_eq(kvp_cache_requests(c, NULL, 1, &n), KVP_EINVAL);
    size_t n_released = 0;
    cr_assert_eq(kvp_release_all(c, &n_released), KVP_OK);
    cr_assert_eq(n_released, 5);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_requests_active, 0);
    cr_assert_eq(s.n_blocks_in_use, 0);
    cr_assert_eq(s.n_blocks_cached, 5, "request 14's committed blocks stay cached");
    cr_assert_eq(th_lookup_ok(c, &ns, t, 22).n_blocks_cached, 5);
    cr_assert_eq(kvp_release_all(c, NULL), KVP_OK, "nothing to release is fine");
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(contract, block_table_stays_while_others_change)
{
    kvp_cache *c = th_cache(64, 4, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[40];
    prompt(t, 40, 9);
    th_acquire_ok(c, 1, &ns, t, 12, 0);
    const uint32_t *ids, *again;
    size_t n, n2;
    cr_assert_eq(kvp_request_blocks(c, 1, &ids, &n), KVP_OK);
    uint32_t copy[3];
    memcpy(copy, ids, sizeof copy);
    th_acquire_ok(c, 2, &ns, t, 40, 0);
    cr_assert_eq(kvp_grow(c, 2, 80), KVP_OK);
    cr_assert_eq(kvp_commit(c, 2, t, 40, NULL), KVP_OK);
    cr_assert_eq(kvp_release(c, 2), KVP_OK);
    cr_assert_eq(kvp_request_blocks(c, 1, &again, &n2), KVP_OK);
    cr_assert_eq(again, ids, "another request's calls moved the table");
    cr_assert_eq(n2, n);
    cr_assert_eq(memcmp(ids, copy, sizeof copy), 0, "its contents changed");
    kvp_cache_free(c);
}
