/*
 * test_lifecycle.c - prefix semantics and the request lifecycle through the public API.
 *
 * Prefix semantics (block sizes 1 and 16): partial tails are never cached, one differing
 * token in block k stops the hit at k, a differing first token shares nothing, namespaces
 * never share. The skipped-prefill rule (at least one prompt token is computed). The
 * lifecycle: kvp_acquire's block table, kvp_commit (with decode growth through kvp_grow and
 * deduplication of concurrent identical prompts), kvp_release, kvp_access, the _ids forms,
 * and exact statistics counters. Every mutation is followed by kvp_cache_check.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvprefix.h"
#include "testutil.h"

static size_t commit_ok(kvp_cache *c, uint64_t id, const uint32_t *t, size_t n)
{
    size_t stored = 12345;
    int rc = kvp_commit(c, id, t, n, &stored);
    cr_assert_eq(rc, KVP_OK, "kvp_commit(%llu, %zu tokens): %s", (unsigned long long)id, n,
                 kvp_strerror(rc));
    TH_CHECK(c);
    return stored;
}

static void release_ok(kvp_cache *c, uint64_t id)
{
    int rc = kvp_release(c, id);
    cr_assert_eq(rc, KVP_OK, "kvp_release(%llu): %s", (unsigned long long)id, kvp_strerror(rc));
    TH_CHECK(c);
}

static void table(const kvp_cache *c, uint64_t id, const uint32_t **ids, size_t *n)
{
    int rc = kvp_request_blocks(c, id, ids, n);
    cr_assert_eq(rc, KVP_OK, "kvp_request_blocks: %s", kvp_strerror(rc));
}

static void seq(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

static const uint32_t sizes[] = {1, 16};

/* ------------------------------------------------------------------ prefix semantics */

Test(prefix, partial_tail_not_cached)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(64, 16, false, NULL, NULL);
    uint32_t t[48];
    seq(t, 48, 1000);
    kvp_match m = th_access_ok(c, &ns, t, 40); /* 2 full blocks + 8 tokens */
    cr_assert_eq(m.n_blocks_full, 2);
    cr_assert_eq(th_stats(c).n_blocks_cached, 2, "the partial tail block was cached");
    m = th_lookup_ok(c, &ns, t, 48); /* the same 40 tokens, then 8 more: block 2 is now full */
    cr_assert_eq(m.n_blocks_full, 3);
    cr_assert_eq(m.n_blocks_cached, 2, "a block cached only partially was reported (%u)",
                 m.n_blocks_cached);
    cr_assert_eq(m.n_blocks_hit, 2);
    cr_assert_eq(m.n_tokens_hit, 32);
    kvp_cache_free(c);
}

Test(prefix, differing_token_stops_hit_at_its_block)
{
    for (size_t s = 0; s < 2; s++) {
        uint32_t bs = sizes[s];
        kvp_namespace ns;
        th_ns(&ns, "m", NULL, NULL, NULL);
        kvp_cache *c = th_cache(64, bs, false, NULL, NULL);
        size_t n = 5 * bs + 1;
        uint32_t *t = malloc(n * sizeof *t), *u = malloc(n * sizeof *u);
        seq(t, n, 7);
        th_access_ok(c, &ns, t, n);
        for (uint32_t k = 0; k < 5; k++) {
            memcpy(u, t, n * sizeof *u);
            u[k * bs + bs / 2] = 999999; /* one token inside block k */
            kvp_match m = th_lookup_ok(c, &ns, u, n);
            cr_assert_eq(m.n_blocks_cached, k, "bs %u: token changed in block %u, %u cached", bs, k,
                         m.n_blocks_cached);
            cr_assert_eq(m.n_blocks_hit, k);
            cr_assert_eq(m.n_tokens_hit, (uint64_t)k * bs);
        }
        kvp_match m = th_lookup_ok(c, &ns, t, n);
        cr_assert_eq(m.n_blocks_cached, n / bs, "bs %u: unchanged prompt", bs);
        free(t);
        free(u);
        kvp_cache_free(c);
    }
}

Test(prefix, different_first_token_shares_nothing)
{
    for (size_t s = 0; s < 2; s++) {
        uint32_t bs = sizes[s];
        kvp_namespace ns;
        th_ns(&ns, "m", NULL, NULL, NULL);
        kvp_cache *c = th_cache(64, bs, false, NULL, NULL);
        size_t n = 4 * bs;
        uint32_t *t = malloc((n + 1) * sizeof *t), *u = malloc((n + 1) * sizeof *u);
        t[0] = 1700000000; /* a timestamp up front */
        seq(t + 1, n, 50);
        u[0] = 1700000001;
        seq(u + 1, n, 50);
        th_access_ok(c, &ns, t, n + 1);
        kvp_match m = th_lookup_ok(c, &ns, u, n + 1);
        cr_assert_eq(m.n_blocks_cached, 0, "bs %u: a different first token shared %u blocks", bs,
                     m.n_blocks_cached);
        cr_assert_eq(m.n_tokens_hit, 0);
        free(t);
        free(u);
        kvp_cache_free(c);
    }
}

Test(prefix, shared_prefix_of_four_tokens)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(64, 1, false, NULL, NULL);
    const uint32_t a[] = {10, 11, 12, 13, 100, 101};
    const uint32_t b[] = {10, 11, 12, 13, 200};
    const uint32_t b2[] = {999, 10, 11, 12, 13, 200};
    th_access_ok(c, &ns, a, 6);
    kvp_match m = th_lookup_ok(c, &ns, b, 5);
    cr_assert_eq(m.n_blocks_cached, 4, "expected 4 shared tokens, got %u", m.n_blocks_cached);
    cr_assert_eq(m.n_blocks_hit, 4);
    cr_assert_eq(m.n_tokens_hit, 4);
    m = th_lookup_ok(c, &ns, b2, 6);
    cr_assert_eq(m.n_blocks_cached, 0, "a differing token put first still shares %u",
                 m.n_blocks_cached);
    cr_assert_eq(m.n_tokens_hit, 0);
    kvp_cache_free(c);
}

Test(prefix, namespaces_never_share)
{
    static const char nul_salt[] = {'s', 0};
    kvp_namespace base, v[8];
    th_ns(&base, "m", "lora", "t", "s");
    th_ns(&v[0], "m2", "lora", "t", "s");
    th_ns(&v[1], "m", "lora2", "t", "s");
    th_ns(&v[2], "m", "lora", "t2", "s");
    th_ns(&v[3], "m", "lora", "t", "s2");
    th_ns(&v[4], "m", NULL, "t", "s");
    th_ns(&v[5], "m", "lora", "t", NULL);
    th_ns(&v[6], "m", "lora", "t", "");
    th_ns(&v[7], "m", "lora", "t", NULL);
    v[7].salt.ptr = nul_salt; /* "s\0": differs from "s" only by a NUL byte */
    v[7].salt.len = 2;
    for (size_t s = 0; s < 2; s++) {
        uint32_t bs = sizes[s];
        kvp_cache *c = th_cache(64, bs, false, NULL, NULL);
        size_t n = 3 * bs + 1;
        uint32_t *t = malloc(n * sizeof *t);
        seq(t, n, 3);
        th_access_ok(c, &base, t, n);
        cr_assert_eq(th_lookup_ok(c, &base, t, n).n_blocks_cached, n / bs);
        for (int i = 0; i < 8; i++) {
            kvp_match m = th_lookup_ok(c, &v[i], t, n);
            cr_assert_eq(m.n_blocks_cached, 0, "bs %u: namespace variant %d shares %u blocks", bs,
                         i, m.n_blocks_cached);
            m = th_acquire_ok(c, 100 + (uint64_t)i, &v[i], t, n, 0);
            cr_assert_eq(m.n_blocks_hit, 0, "bs %u: variant %d acquire hit", bs, i);
            release_ok(c, 100 + (uint64_t)i);
        }
        free(t);
        kvp_cache_free(c);
    }
}

/* ------------------------------------------------------------------ skipped prefill */

Test(prefill, at_least_one_token_is_computed)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    for (size_t s = 0; s < 2; s++) {
        uint32_t bs = sizes[s];
        kvp_cache *c = th_cache(64, bs, false, NULL, NULL);
        size_t n = 3 * bs; /* a multiple of the block size */
        uint32_t *t = malloc((n + bs + 1) * sizeof *t);
        seq(t, n + bs + 1, 77);
        th_access_ok(c, &ns, t, n);
        kvp_match m = th_lookup_ok(c, &ns, t, n);
        cr_assert_eq(m.n_blocks_full, 3);
        cr_assert_eq(m.n_blocks_cached, 3, "bs %u: full run must be reported", bs);
        cr_assert_eq(m.n_blocks_hit, 2, "bs %u: full-prompt hit must reuse one block less", bs);
        cr_assert_eq(m.n_tokens_hit, 2 * (uint64_t)bs);
        /* One more token: all three blocks are reusable. */
        m = th_lookup_ok(c, &ns, t, n + 1);
        cr_assert_eq(m.n_blocks_cached, 3);
        cr_assert_eq(m.n_blocks_hit, 3, "bs %u: n + 1 tokens", bs);
        /* General rule over every length up to one block past the cached run. */
        for (size_t len = 1; len <= n + bs; len++) {
            m = th_lookup_ok(c, &ns, t, len);
            size_t cached = len / bs < 3 ? len / bs : 3;
            size_t cap = (len - 1) / bs;
            size_t hit = cached < cap ? cached : cap;
            cr_assert_eq(m.n_tokens, len);
            cr_assert_eq(m.n_blocks_full, len / bs);
            cr_assert_eq(m.n_blocks_cached, cached, "bs %u len %zu: cached %u", bs, len,
                         m.n_blocks_cached);
            cr_assert_eq(m.n_blocks_hit, hit, "bs %u len %zu: hit %u, expected %zu", bs, len,
                         m.n_blocks_hit, hit);
            cr_assert_eq(m.n_tokens_hit, hit * bs);
        }
        /* kvp_acquire applies the same rule and allocates the block it could not reuse. */
        m = th_acquire_ok(c, 1, &ns, t, n, 0);
        cr_assert_eq(m.n_blocks_cached, 3);
        cr_assert_eq(m.n_blocks_hit, 2);
        const uint32_t *ids;
        size_t nb;
        table(c, 1, &ids, &nb);
        cr_assert_eq(nb, 3, "bs %u: request holds %zu blocks, expected 3", bs, nb);
        uint32_t hit_ids[3];
        kvp_match lm;
        cr_assert_eq(kvp_lookup(c, &ns, t, n + 1, hit_ids, 3, &lm), KVP_OK);
        cr_assert_eq(lm.n_blocks_hit, 3);
        cr_assert_eq(ids[0], hit_ids[0]);
        cr_assert_eq(ids[1], hit_ids[1]);
        cr_assert_neq(ids[2], hit_ids[2], "bs %u: the last cached block was pinned as a hit", bs);
        /* Committing the recomputed last block finds its key taken: a duplicate. */
        size_t st = commit_ok(c, 1, t, n);
        cr_assert_eq(st, 0, "bs %u: stored %zu", bs, st);
        cr_assert_eq(th_stats(c).n_blocks_deduped, 1);
        release_ok(c, 1);
        free(t);
        kvp_cache_free(c);
    }
}

Test(prefill, single_token_prompt_reuses_nothing)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(8, 1, false, NULL, NULL);
    const uint32_t t[] = {5};
    th_access_ok(c, &ns, t, 1);
    kvp_match m = th_lookup_ok(c, &ns, t, 1);
    cr_assert_eq(m.n_blocks_cached, 1);
    cr_assert_eq(m.n_blocks_hit, 0);
    cr_assert_eq(m.n_tokens_hit, 0);
    kvp_cache_free(c);
}

/* ------------------------------------------------------------------ lifecycle */

Test(lifecycle, acquire_block_table)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    uint32_t p[14], q[10];
    seq(p, 14, 1);
    seq(q, 10, 500);
    th_access_ok(c, &ns, p, 12); /* caches 3 blocks */
    uint32_t hit_ids[8];
    kvp_match lm;
    cr_assert_eq(kvp_lookup(c, &ns, p, 14, hit_ids, 8, &lm), KVP_OK);
    cr_assert_eq(lm.n_blocks_hit, 3);

    kvp_match m = th_acquire_ok(c, 1, &ns, p, 14, 20); /* 5 blocks: 3 hits, 2 fresh */
    cr_assert_eq(m.n_blocks_hit, 3);
    cr_assert_eq(m.n_tokens_hit, 12);
    const uint32_t *a;
    size_t na;
    table(c, 1, &a, &na);
    cr_assert_eq(na, 5, "ceil(max(14, 20) / 4) = 5 blocks, got %zu", na);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(a[i], hit_ids[i], "block %zu of the table is not the hit block", i);
    uint32_t a_copy[5];
    memcpy(a_copy, a, sizeof a_copy);

    m = th_acquire_ok(c, 2, &ns, q, 10, 0); /* 3 fresh blocks */
    cr_assert_eq(m.n_blocks_hit, 0);
    const uint32_t *b;
    size_t nb;
    table(c, 2, &b, &nb);
    cr_assert_eq(nb, 3);
    uint32_t all[8];
    memcpy(all, a_copy, 5 * sizeof *all);
    memcpy(all + 5, b, 3 * sizeof *all);
    for (int i = 0; i < 8; i++) {
        cr_assert_lt(all[i], 16, "block id %u out of range", all[i]);
        for (int j = i + 1; j < 8; j++)
            cr_assert_neq(all[i], all[j], "block %u held twice by pinned requests", all[i]);
    }
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 8);
    cr_assert_eq(s.n_blocks_cached, 0, "hit blocks must be pinned, not evictable");
    cr_assert_eq(s.n_blocks_free, 8);
    cr_assert_eq(s.n_requests_active, 2);
    release_ok(c, 2);
    release_ok(c, 1);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 0);
    cr_assert_eq(s.n_blocks_cached, 3);
    cr_assert_eq(s.n_requests_active, 0);
    kvp_cache_free(c);
}

Test(lifecycle, commit_grow_release)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    uint32_t t[20];
    seq(t, 20, 40);
    th_acquire_ok(c, 9, &ns, t, 10, 0); /* 3 blocks */
    cr_assert_eq(th_lookup_ok(c, &ns, t, 11).n_blocks_cached, 0, "cached before commit");
    cr_assert_eq(commit_ok(c, 9, t, 10), 2, "10 tokens: 2 full blocks stored");
    kvp_match m = th_lookup_ok(c, &ns, t, 11);
    cr_assert_eq(m.n_blocks_cached, 2, "committed blocks are visible while pinned");
    cr_assert_eq(commit_ok(c, 9, t, 10), 0, "recommitting the same tokens stored again");
    cr_assert_eq(commit_ok(c, 9, t, 11), 0);
    cr_assert_eq(commit_ok(c, 9, t, 12), 1, "block 2 just became full");
    cr_assert_eq(commit_ok(c, 9, t, 13), 0);
    cr_assert_eq(kvp_commit(c, 9, t, 16, NULL), KVP_ERANGE, "block 3 is not held yet");
    TH_CHECK(c);
    cr_assert_eq(kvp_grow(c, 9, 12), KVP_OK, "grow to what is held is a no-op");
    const uint32_t *ids;
    size_t n;
    table(c, 9, &ids, &n);
    cr_assert_eq(n, 3);
    cr_assert_eq(kvp_grow(c, 9, 17), KVP_OK);
    TH_CHECK(c);
    table(c, 9, &ids, &n);
    cr_assert_eq(n, 5, "17 tokens need 5 blocks, got %zu", n);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            cr_assert_neq(ids[i], ids[j]);
    cr_assert_eq(commit_ok(c, 9, t, 17), 1, "block 3 became full");
    cr_assert_eq(commit_ok(c, 9, t, 20), 1, "block 4 became full");
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_stored, 5);
    cr_assert_eq(s.n_blocks_in_use, 5);
    cr_assert_eq(s.n_blocks_cached, 0);
    m = th_lookup_ok(c, &ns, t, 20);
    cr_assert_eq(m.n_blocks_cached, 5);
    cr_assert_eq(m.n_blocks_hit, 4);
    release_ok(c, 9);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 0);
    cr_assert_eq(s.n_blocks_cached, 5, "released committed blocks must stay cached");
    cr_assert_eq(s.n_blocks_free, 11);
    cr_assert_eq(kvp_release(c, 9), KVP_ENOENT, "double release");
    /* A second request reuses the decode blocks too. */
    m = th_acquire_ok(c, 10, &ns, t, 20, 0);
    cr_assert_eq(m.n_blocks_hit, 4);
    release_ok(c, 10);
    kvp_cache_free(c);
}

Test(lifecycle, concurrent_identical_prompts_dedup)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    uint32_t t[9];
    seq(t, 9, 300);
    th_acquire_ok(c, 1, &ns, t, 9, 0); /* 3 blocks each, no hits: nothing is committed yet */
    kvp_match m = th_acquire_ok(c, 2, &ns, t, 9, 0);
    cr_assert_eq(m.n_blocks_hit, 0);
    const uint32_t *ia, *ib;
    size_t na, nb;
    table(c, 1, &ia, &na);
    uint32_t a[3];
    memcpy(a, ia, sizeof a);
    table(c, 2, &ib, &nb);
    uint32_t b[3];
    memcpy(b, ib, sizeof b);
    cr_assert_eq(th_stats(c).n_blocks_in_use, 6);

    cr_assert_eq(commit_ok(c, 1, t, 9), 2);
    cr_assert_eq(commit_ok(c, 2, t, 9), 0, "the second commit must dedup, not store");
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_stored, 2);
    cr_assert_eq(s.n_blocks_deduped, 2, "n_blocks_deduped is %llu",
                 (unsigned long long)s.n_blocks_deduped);
    uint32_t hit[2];
    cr_assert_eq(kvp_lookup(c, &ns, t, 9, hit, 2, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_hit, 2);
    cr_assert(hit[0] == a[0] && hit[1] == a[1], "the key must stay with the first block");

    release_ok(c, 2);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_in_use, 3, "request 1 still holds 3");
    cr_assert_eq(s.n_blocks_cached, 0);
    cr_assert_eq(s.n_blocks_free, 13, "the duplicates must return to the free pool");
    release_ok(c, 1);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 2);
    cr_assert_eq(s.n_blocks_free, 14);
    (void)b;
    kvp_cache_free(c);
}

Test(lifecycle, access_inserts_and_caches)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    uint32_t t[13];
    seq(t, 13, 9);
    kvp_match m = th_access_ok(c, &ns, t, 13);
    cr_assert_eq(m.n_blocks_full, 3);
    cr_assert_eq(m.n_blocks_cached, 0, "the first access must report the state before it");
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_stored, 3);
    cr_assert_eq(s.n_blocks_cached, 3);
    cr_assert_eq(s.n_blocks_in_use, 0, "kvp_access left blocks pinned");
    cr_assert_eq(s.n_requests_active, 0);
    m = th_access_ok(c, &ns, t, 13);
    cr_assert_eq(m.n_blocks_cached, 3);
    cr_assert_eq(m.n_blocks_hit, 3);
    cr_assert_eq(th_stats(c).n_blocks_stored, 3, "a repeated access stored again");
    /* A longer prompt extends the chain. */
    uint32_t u[17];
    seq(u, 17, 9);
    m = th_access_ok(c, &ns, u, 17);
    cr_assert_eq(m.n_blocks_cached, 3);
    cr_assert_eq(th_stats(c).n_blocks_cached, 4);
    kvp_cache_free(c);
}

Test(lifecycle, ids_forms)
{
    kvp_namespace ns, other;
    th_ns(&ns, "m", NULL, NULL, NULL);
    th_ns(&other, "m", NULL, "t", NULL);
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    kvp_key ids[4] = {{1, 1}, {2, 2}, {3, 3}, {4, 4}};
    kvp_match m;
    cr_assert_eq(kvp_access_ids(c, &ns, ids, 4, 13, &m), KVP_OK); /* 3 full + partial id */
    TH_CHECK(c);
    cr_assert_eq(m.n_blocks_full, 3);
    cr_assert_eq(th_stats(c).n_blocks_cached, 3, "the partial block's id must not be cached");
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 4, 13, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 3);
    cr_assert_eq(m.n_blocks_hit, 3);
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 3, 12, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 3);
    cr_assert_eq(m.n_blocks_hit, 2, "n_tokens 12 with 3 cached blocks reuses 2");
    cr_assert_eq(kvp_lookup_ids(c, &other, ids, 3, 12, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 0, "external ids shared across namespaces");
    kvp_key changed[3] = {{1, 1}, {9, 9}, {3, 3}};
    cr_assert_eq(kvp_lookup_ids(c, &ns, changed, 3, 12, NULL, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_cached, 1);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_lookups, 4);
    cr_assert_eq(s.n_requests, 1);
    kvp_cache_free(c);
}

/* ------------------------------------------------------------------ statistics */

Test(stats, counters_follow_a_scenario)
{
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_cache *c = th_cache(4, 2, false, NULL, NULL);
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_blocks_total, 4);
    cr_assert_eq(s.n_blocks_free, 4);
    cr_assert_eq(s.n_requests + s.n_lookups + s.n_tokens_queried + s.n_blocks_stored, 0);

    uint32_t a[7] = {1, 2, 3, 4, 5, 6, 7};
    uint32_t b[5] = {1, 2, 3, 4, 9};
    uint32_t d[5] = {8, 8, 8, 8, 8};
    th_access_ok(c, &ns, a, 7);        /* 3 full blocks missed, 3 stored */
    th_lookup_ok(c, &ns, b, 5);        /* 2 cached, n_lookups only */
    th_acquire_ok(c, 1, &ns, b, 5, 0); /* 2 hit, 0 missed; holds 3 (1 fresh) */
    kvp_stats s1 = th_stats(c);
    cr_assert_eq(s1.n_requests, 2);
    cr_assert_eq(s1.n_lookups, 1);
    cr_assert_eq(s1.n_tokens_queried, 12);
    cr_assert_eq(s1.n_tokens_hit, 4);
    cr_assert_eq(s1.n_blocks_hit, 2);
    cr_assert_eq(s1.n_blocks_missed, 3);
    cr_assert_eq(s1.n_blocks_stored, 3);
    cr_assert_eq(s1.n_evictions, 0, "a free block existed");
    cr_assert_eq(s1.n_blocks_in_use, 3);
    cr_assert_eq(s1.n_blocks_cached, 1, "block 2 of a stays cached");
    cr_assert_eq(s1.n_blocks_free, 0);
    cr_assert_eq(s1.n_requests_active, 1);
    cr_assert_eq(commit_ok(c, 1, b, 5), 0, "b has 2 full blocks, both hits");

    th_acquire_ok(c, 2, &ns, d, 1, 0); /* needs 1 block: evicts block 2 of a */
    kvp_stats s2 = th_stats(c);
    cr_assert_eq(s2.n_evictions, 1);
    cr_assert_eq(s2.n_requests, 3);
    cr_assert_eq(s2.n_tokens_queried, 13);
    cr_assert_eq(s2.n_blocks_missed, 3, "a 1-token prompt has no full block to miss");
    cr_assert_eq(s2.n_blocks_in_use, 4);
    cr_assert_eq(s2.n_blocks_cached, 0);
    cr_assert_eq(s2.n_requests_active, 2);
    cr_assert_eq(kvp_acquire(c, 3, &ns, d, 3, 0, &(kvp_match){0}), KVP_ENOSPC);
    kvp_stats s3 = th_stats(c);
    cr_assert_eq(s3.n_requests, 3, "a failed acquire was counted");
    cr_assert_eq(s3.n_tokens_queried, 13);
    release_ok(c, 2);
    release_ok(c, 1);
    s = th_stats(c);
    cr_assert_eq(s.n_blocks_cached, 2);
    cr_assert_eq(s.n_blocks_free, 2);
    cr_assert_eq(s.n_blocks_in_use, 0);
    cr_assert_eq(s.n_requests_active, 0);
    cr_assert_eq(s.n_blocks_deduped, 0);
    cr_assert_eq(s.n_verify_rejects, 0);
    kvp_cache_free(c);
}
