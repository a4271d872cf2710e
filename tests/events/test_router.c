/*
 * test_router.c - the router index (kvp_router, src/events/router*.c).
 *
 * Scores against hand-computed expectations (runs, tiers, the stop at the first block no
 * worker holds), removal per medium, publisher restarts, gaps, duplicates, stale workers,
 * malformed batches refused whole with a reason, allocation failures at every point of an
 * apply leaving the index as it was, namespaces (model label, LoRA, cache salt: a salted
 * request never scores another salt's blocks), hash groups, KV cache groups. Keys equal the
 * engine's: a kvp_cache under vllm-sha256-cbor, vllm-xxhash-cbor and xxh3 publishes STORED
 * events whose key.lo the router indexes, and the router's own hashing of the same tokens
 * must find every block (and stop exactly where a prompt diverges). A reference model
 * (plain per-worker arrays) follows random operations on twelve workers in three hash
 * groups, enough holders per block to move sets between inline and spill storage; scores,
 * per-worker counts and holder totals must agree after every step. The memory figure
 * (bytes per (block, worker)) is checked against the 26.9 B anchor. kvp_router_score_v2
 * reports each call's view (local here, redis in test_router_redis) and each row's engine
 * id, which stays readable while another thread removes and adds workers. The checker is
 * shown catching each kind of corruption. kvp_router_check runs after every mutation.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "kvprefix_events.h"
#include "router.h"
#include "testutil.h"

#define CHECK(r) cr_assert_eq(kvp_router_check(r), KVP_OK, "kvp_router_check failed")

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

#ifdef KVP_TEST_REDIS
#include <unistd.h>

/* Built as test_router_redis: every router goes to the Redis at $KVP_TEST_REDIS_URL
 * (tests/support/with_redis.py starts one) under a key prefix of its own (Criterion forks per
 * test: the pid and a counter make it unique), so the same behaviour is checked on the
 * shared store. */
static void use_redis(kvp_router_config *cfg)
{
    static char prefix[64];
    static unsigned counter;
    const char *url = getenv("KVP_TEST_REDIS_URL");
    cr_assert(url, "KVP_TEST_REDIS_URL is not set (run under tests/support/with_redis.py)");
    snprintf(prefix, sizeof prefix, "t%ld_%u", (long)getpid(), counter++);
    cfg->redis.url = url;
    cfg->redis.key_prefix = prefix;
    cfg->redis.timeout_ms = 5000;
}

/* Free a router, after checking that Redis answered every call: a fallback to the local
 * view would give the same answers and hide a broken store. */
static void redis_router_free(kvp_router *r)
{
    kvp_router_stats st;
    if (r && kvp_router_stats_get(r, &st) == KVP_OK && st.redis) {
        cr_assert_eq(st.n_redis_errors, 0, "Redis failed %llu times",
                     (unsigned long long)st.n_redis_errors);
        cr_assert_eq(st.n_fallback_scores + st.n_fallback_applies, 0, "fallbacks");
    }
    kvp_router_free(r);
}
#define kvp_router_free redis_router_free
#endif

static kvp_router *router_new_with(kvp_router_config *cfg)
{
    cfg->table_seed = 42;
#ifdef KVP_TEST_REDIS
    use_redis(cfg);
#endif
    kvp_router *r = NULL;
    cr_assert_eq(kvp_router_new(cfg, &r), KVP_OK);
#ifdef KVP_TEST_REDIS
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert(st.redis && st.redis_up, "the router did not reach Redis");
#endif
    CHECK(r);
    return r;
}

static kvp_router *router_new(void)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    return router_new_with(&cfg);
}

static kvp_config hash_cfg(int profile, uint32_t block_size)
{
    kvp_config c;
    kvp_config_init(&c);
    c.hash_profile = profile;
    c.block_size = block_size;
    c.seed = 7;
    return c;
}

static uint32_t add_worker(kvp_router *r, const char *name, int64_t rank, kvp_config hash,
                           const char *model)
{
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = name;
    wc.dp_rank = rank;
    wc.hash = hash;
    wc.model = model;
    uint32_t id = UINT32_MAX;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_OK, "worker_add %s", name);
    CHECK(r);
    return id;
}

/* Keys (event integers) of the full blocks of tokens under hash config c and ns. */
static size_t keys_of(kvp_config c, const kvp_namespace *ns, const uint32_t *tokens, size_t n,
                      uint64_t *out, size_t cap)
{
    kvp_hasher *h = NULL;
    cr_assert_eq(kvp_hasher_new(&c, &h), KVP_OK);
    kvp_chain chain;
    cr_assert_eq(kvp_hasher_root(h, ns, &chain), KVP_OK);
    kvp_chain *st = calloc(cap ? cap : 1, sizeof *st);
    size_t got = 0;
    cr_assert_eq(kvp_hasher_blocks(h, ns, &chain, tokens, n, st, cap, &got), KVP_OK);
    for (size_t i = 0; i < got; i++)
        out[i] = st[i].key.lo;
    free(st);
    kvp_hasher_free(h);
    return got;
}

static kvp_kv_event ev_stored(const uint64_t *hashes, size_t n, const uint32_t *tokens,
                              uint32_t block_size, const char *medium)
{
    kvp_kv_event e;
    memset(&e, 0, sizeof e);
    e.type = KVP_EVENT_STORED;
    e.hashes = hashes;
    e.n_hashes = n;
    e.tokens = tokens;
    e.n_tokens = n * block_size;
    e.block_size = block_size;
    e.medium = medium;
    e.group_idx = -1;
    return e;
}

static kvp_kv_event ev_removed(const uint64_t *hashes, size_t n, const char *medium)
{
    kvp_kv_event e;
    memset(&e, 0, sizeof e);
    e.type = KVP_EVENT_REMOVED;
    e.hashes = hashes;
    e.n_hashes = n;
    e.medium = medium;
    e.group_idx = -1;
    return e;
}

static kvp_kv_event ev_cleared(void)
{
    kvp_kv_event e;
    memset(&e, 0, sizeof e);
    e.type = KVP_EVENT_CLEARED;
    e.group_idx = -1;
    return e;
}

static kvp_kv_batch batch_of(const kvp_kv_event *ev, size_t n, double ts)
{
    kvp_kv_batch b;
    memset(&b, 0, sizeof b);
    b.ts = ts;
    b.events = ev;
    b.n_events = n;
    return b;
}

/* Apply and expect KVP_OK with the given status. */
static kvp_router_apply_result apply_expect(kvp_router *r, uint32_t id, uint64_t seq,
                                            const kvp_kv_event *ev, size_t n, int status)
{
    kvp_kv_batch b = batch_of(ev, n, 1000.0 + (double)seq);
    kvp_router_apply_result res;
    int rc = kvp_router_apply(r, id, seq, &b, &res);
    cr_assert_eq(rc, KVP_OK, "apply seq %llu: %s (%s)", (unsigned long long)seq, kvp_strerror(rc),
                 res.why ? res.why : "");
    cr_assert_eq(res.status, status, "apply seq %llu: status %d, expected %d",
                 (unsigned long long)seq, res.status, status);
    CHECK(r);
    return res;
}

/* Score and return worker id's row. */
static kvp_router_row score_of(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens,
                               size_t n, uint32_t id)
{
    kvp_router_row rows[64];
    size_t n_rows = 0;
    cr_assert_eq(kvp_router_score(r, ns, tokens, n, rows, 64, &n_rows), KVP_OK);
    for (size_t i = 0; i < n_rows; i++) {
        if (rows[i].worker == id)
            return rows[i];
    }
    cr_assert_fail("no row for worker %u", id);
    kvp_router_row none;
    memset(&none, 0, sizeof none);
    return none;
}

static void seq_tokens(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

static kvp_namespace ns_none(void)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    return ns;
}

/* ---------------------------------------------------------------------------------------- */
/* Scores by hand                                                                           */
/* ---------------------------------------------------------------------------------------- */

Test(router_score, runs_and_tiers_by_hand)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 4);
    uint32_t a = add_worker(r, "pod-a", 0, hc, NULL);
    uint32_t b = add_worker(r, "pod-b", 0, hc, NULL);
    uint32_t c = add_worker(r, "pod-c", 0, hc, NULL);
    uint32_t t[18];
    seq_tokens(t, 18, 100);
    kvp_namespace ns = ns_none();
    uint64_t k[4];
    cr_assert_eq(keys_of(hc, &ns, t, 18, k, 4), 4);

    /* a: blocks 0-1 on GPU, 2-3 on CPU; b: 0-1 (nil medium = GPU); c: 0 and 2, not 1. */
    kvp_kv_event ea[2] = {ev_stored(k, 2, t, 4, "GPU"), ev_stored(k + 2, 2, t + 8, 4, "CPU")};
    apply_expect(r, a, 0, ea, 2, KVP_ROUTER_APPLIED);
    kvp_kv_event eb = ev_stored(k, 2, t, 4, NULL);
    apply_expect(r, b, 0, &eb, 1, KVP_ROUTER_APPLIED);
    kvp_kv_event ec[2] = {ev_stored(k, 1, t, 4, "gpu"), ev_stored(k + 2, 1, t + 8, 4, "GPU")};
    apply_expect(r, c, 0, ec, 2, KVP_ROUTER_APPLIED);

    kvp_router_row ra = score_of(r, &ns, t, 18, a), rb = score_of(r, &ns, t, 18, b),
                   rc = score_of(r, &ns, t, 18, c);
    cr_assert_eq(ra.n_blocks, 4);
    cr_assert_eq(ra.n_tokens, 16);
    cr_assert_float_eq(ra.score, 2 * 1.0 + 2 * 0.8, 1e-12);
    cr_assert_eq(rb.n_blocks, 2);
    cr_assert_float_eq(rb.score, 2.0, 1e-12);
    cr_assert_eq(rc.n_blocks, 1, "c holds block 2 but not block 1: its run is 1");
    cr_assert_float_eq(rc.score, 1.0, 1e-12);
    cr_assert_eq(ra.state, KVP_ROUTER_ROW_SCORED);

    /* A prompt that diverges in block 1 scores 1 for everyone. */
    t[5] = 999999;
    cr_assert_eq(score_of(r, &ns, t, 18, a).n_blocks, 1);
    cr_assert_eq(score_of(r, &ns, t, 18, b).n_blocks, 1);
    /* A prompt shorter than a block scores 0. */
    cr_assert_eq(score_of(r, &ns, t, 3, a).n_blocks, 0);

    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_blocks, 4);
    cr_assert_eq(st.n_holders, 4 + 2 + 2);
    cr_assert_eq(st.n_workers, 3);
    cr_assert_eq(st.n_groups, 1, "three workers with one hash config share a group");
    kvp_router_free(r);
}

Test(router_score, first_block_missing_scores_zero)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_XXHASH, 4);
    uint32_t a = add_worker(r, "a", 0, hc, NULL);
    uint32_t t[16];
    seq_tokens(t, 16, 1);
    kvp_namespace ns = ns_none();
    uint64_t k[4];
    keys_of(hc, &ns, t, 16, k, 4);
    kvp_kv_event e = ev_stored(k + 1, 3, t + 4, 4, "GPU");
    apply_expect(r, a, 0, &e, 1, KVP_ROUTER_APPLIED);
    kvp_router_row row = score_of(r, &ns, t, 16, a);
    cr_assert_eq(row.n_blocks, 0);
    cr_assert_eq(row.score, 0);
    kvp_router_free(r);
}

Test(router_score, removal_per_medium)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 4);
    uint32_t a = add_worker(r, "a", 0, hc, NULL);
    uint32_t t[8];
    seq_tokens(t, 8, 50);
    kvp_namespace ns = ns_none();
    uint64_t k[2];
    keys_of(hc, &ns, t, 8, k, 2);
    kvp_kv_event st[2] = {ev_stored(k, 2, t, 4, "GPU"), ev_stored(k, 2, t, 4, "CPU")};
    apply_expect(r, a, 0, st, 2, KVP_ROUTER_APPLIED);
    kvp_router_row row = score_of(r, &ns, t, 8, a);
    cr_assert_eq(row.n_blocks, 2);
    cr_assert_float_eq(row.score, 2.0, 1e-12, "the best tier counts");

    kvp_kv_event rm = ev_removed(k + 1, 1, "GPU");
    apply_expect(r, a, 1, &rm, 1, KVP_ROUTER_APPLIED);
    row = score_of(r, &ns, t, 8, a);
    cr_assert_eq(row.n_blocks, 2, "block 1 is still on CPU");
    cr_assert_float_eq(row.score, 1.8, 1e-12);

    kvp_kv_event rm2 = ev_removed(k, 1, "CPU");
    apply_expect(r, a, 2, &rm2, 1, KVP_ROUTER_APPLIED);
    row = score_of(r, &ns, t, 8, a);
    cr_assert_float_eq(row.score, 1.8, 1e-12, "block 0 still on GPU");

    kvp_kv_event rm3 = ev_removed(k + 1, 1, "cpu");
    apply_expect(r, a, 3, &rm3, 1, KVP_ROUTER_APPLIED);
    row = score_of(r, &ns, t, 8, a);
    cr_assert_eq(row.n_blocks, 1);
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_router_worker_stats_get(r, a, &ws), KVP_OK);
    cr_assert_eq(ws.n_blocks, 1);

    /* Removing an unknown hash, or from a medium never seen, changes nothing. */
    uint64_t unknown = 12345;
    kvp_kv_event rm4[2] = {ev_removed(&unknown, 1, "GPU"), ev_removed(k, 1, "NVMe")};
    apply_expect(r, a, 4, rm4, 2, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 1);
    kvp_router_stats s;
    cr_assert_eq(kvp_router_stats_get(r, &s), KVP_OK);
    cr_assert_eq(s.n_media, 2, "a removal does not register a medium");
    kvp_router_free(r);
}

Test(router_score, custom_tiers_and_unknown_medium)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.tiers[1].weight = 0.5;
    cfg.tiers[2] = (kvp_router_tier){"DISK", 0.25};
    cfg.n_tiers = 3;
    cfg.unknown_weight = 0.1;
    kvp_router *r = router_new_with(&cfg);
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 2);
    uint32_t a = add_worker(r, "a", 0, hc, NULL);
    uint32_t t[8];
    seq_tokens(t, 8, 7);
    kvp_namespace ns = ns_none();
    uint64_t k[4];
    keys_of(hc, &ns, t, 8, k, 4);
    kvp_kv_event e[4] = {ev_stored(k, 1, t, 2, "GPU"), ev_stored(k + 1, 1, t + 2, 2, "cpu"),
                         ev_stored(k + 2, 1, t + 4, 2, "disk"),
                         ev_stored(k + 3, 1, t + 6, 2, "tape")};
    apply_expect(r, a, 0, e, 4, KVP_ROUTER_APPLIED);
    kvp_router_row row = score_of(r, &ns, t, 8, a);
    cr_assert_eq(row.n_blocks, 4);
    cr_assert_float_eq(row.score, 1.0 + 0.5 + 0.25 + 0.1, 1e-12);
    kvp_router_free(r);
}

Test(router_score, too_many_media_refused)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 1);
    uint32_t a = add_worker(r, "a", 0, hc, NULL);
    uint32_t t[8];
    seq_tokens(t, 8, 1);
    kvp_namespace ns = ns_none();
    uint64_t k[8];
    keys_of(hc, &ns, t, 8, k, 8);
    static const char *names[] = {"m1", "m2", "m3", "m4", "m5"};
    kvp_kv_event e[5];
    for (int i = 0; i < 5; i++)
        e[i] = ev_stored(k + i, 1, t + i, 1, names[i]);
    kvp_kv_batch b = batch_of(e, 5, 1);
    kvp_router_apply_result res;
    cr_assert_eq(kvp_router_apply(r, a, 0, &b, &res), KVP_EINVAL, "GPU, CPU + 5 > 6 media");
    cr_assert_eq(res.bad_event, 4);
    cr_assert_not_null(res.why);
    apply_expect(r, a, 0, e, 4, KVP_ROUTER_APPLIED);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_media, 6);
    kvp_router_free(r);
}

Test(router_score, rows_and_capacity)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 4);
    uint32_t a = add_worker(r, "a", 0, hc, NULL);
    uint32_t b = add_worker(r, "a", 1, hc, NULL);
    cr_assert_neq(a, b, "same engine, another dp rank: another worker");
    kvp_namespace ns = ns_none();
    uint32_t t[4] = {1, 2, 3, 4};
    kvp_router_row rows[2];
    size_t n = 0;
    cr_assert_eq(kvp_router_score(r, &ns, t, 4, rows, 1, &n), KVP_ENOSPC);
    cr_assert_eq(n, 2);
    cr_assert_eq(kvp_router_score(r, &ns, t, 4, rows, 2, &n), KVP_OK);
    cr_assert_eq(rows[1].dp_rank, 1);
    cr_assert_eq(kvp_router_score(r, &ns, NULL, 0, rows, 2, &n), KVP_OK);
    cr_assert_eq(kvp_router_score(r, &ns, NULL, 4, rows, 2, &n), KVP_EINVAL);
    cr_assert_eq(kvp_router_score(r, NULL, t, 4, rows, 2, &n), KVP_EINVAL);
    kvp_namespace bad = ns_none();
    bad.salt.len = 3;
    cr_assert_eq(kvp_router_score(r, &bad, t, 4, rows, 2, &n), KVP_EINVAL);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_scores, 2);
    kvp_router_free(r);
}

/* The view this build's routers answer from: the shared store in test_router_redis. */
#ifdef KVP_TEST_REDIS
#define VIEW_EXPECTED KVP_ROUTER_VIEW_REDIS
#else
#define VIEW_EXPECTED KVP_ROUTER_VIEW_LOCAL
#endif

/* kvp_router_score_v2 and _score_hashes_v2: the rows of the v1 calls, the view of each
 * call in its own result, each row's engine id; a failed call reports no view. */
Test(router_score, v2_reports_view_and_engine_ids)
{
    cr_assert_str_eq(kvp_router_view_name(KVP_ROUTER_VIEW_LOCAL), "local");
    cr_assert_str_eq(kvp_router_view_name(KVP_ROUTER_VIEW_REDIS), "redis");
    cr_assert_str_eq(kvp_router_view_name(KVP_ROUTER_VIEW_FALLBACK), "fallback");
    cr_assert_null(kvp_router_view_name(0));
    kvp_router_score_result_init(NULL);
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_XXH3, 4);
    uint32_t a = add_worker(r, "pod-a", 0, hc, NULL);
    uint32_t b = add_worker(r, "pod-b", 3, hc, NULL);
    uint32_t t[16];
    seq_tokens(t, 16, 100);
    kvp_namespace ns = ns_none();
    uint64_t k[4];
    cr_assert_eq(keys_of(hc, &ns, t, 16, k, 4), 4);
    kvp_kv_event e = ev_stored(k, 3, t, 4, NULL);
    apply_expect(r, b, 0, &e, 1, KVP_ROUTER_APPLIED);

    kvp_router_row rows[4], rows1[4];
    const char *ids[4] = {NULL, NULL, NULL, NULL};
    kvp_router_score_result res;
    kvp_router_score_result_init(&res);
    cr_assert_null(res.engine_ids);
    cr_assert_eq(res.view, 0);
    res.engine_ids = ids;
    size_t n = 0, n1 = 0;
    cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 4, &n, &res), KVP_OK);
    cr_assert_eq(res.view, VIEW_EXPECTED);
    cr_assert_eq(kvp_router_score(r, &ns, t, 16, rows1, 4, &n1), KVP_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(n1, 2);
    cr_assert_eq(memcmp(rows, rows1, sizeof rows[0] * n), 0, "v2 rows equal v1's");
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(ids[i], rows[i].worker == a ? "pod-a" : "pod-b", "row %zu", i);
    cr_assert_eq(rows[1].worker, b);
    cr_assert_eq(rows[1].n_blocks, 3);

    memset(ids, 0, sizeof ids);
    res.view = 0;
    cr_assert_eq(kvp_router_score_hashes_v2(r, k, 4, rows, 4, &n, &res), KVP_OK);
    cr_assert_eq(res.view, VIEW_EXPECTED);
    cr_assert_str_eq(ids[0], "pod-a");
    cr_assert_str_eq(ids[1], "pod-b");
    cr_assert_eq(rows[1].n_blocks, 3);

    res.engine_ids = NULL; /* no engine ids wanted: the view still comes */
    res.view = 0;
    cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 4, &n, &res), KVP_OK);
    cr_assert_eq(res.view, VIEW_EXPECTED);
    cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 4, &n, NULL), KVP_OK);

    res.engine_ids = ids;
    cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 1, &n, &res), KVP_ENOSPC);
    cr_assert_eq(n, 2);
    cr_assert_eq(res.view, 0, "a failed call names no view");
    cr_assert_eq(kvp_router_score_v2(NULL, &ns, t, 16, rows, 4, &n, &res), KVP_EINVAL);
    cr_assert_eq(kvp_router_score_hashes_v2(r, NULL, 2, rows, 4, &n, &res), KVP_EINVAL);

    /* A worker removed and added again under its engine id: the same interned string. */
    res.view = 0;
    cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 4, &n, &res), KVP_OK);
    const char *before = ids[0];
    cr_assert_eq(kvp_router_worker_remove(r, a), KVP_OK);
    cr_assert_str_eq(before, "pod-a", "still readable after the removal");
    uint32_t a2 = add_worker(r, "pod-a", 0, hc, NULL);
    cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 4, &n, &res), KVP_OK);
    for (size_t i = 0; i < n; i++) {
        if (rows[i].worker == a2)
            cr_assert_eq(ids[i], before, "one copy per engine id");
    }
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_scores, 7);
    CHECK(r);
    kvp_router_free(r);
}

/* Engine ids handed out by a score stay valid while another thread removes and adds
 * workers (ASan would report a read of freed memory): each row's id names the worker the
 * row was scored for, and every pointer taken during the churn reads back its name after
 * it. */
typedef struct churn {
    kvp_router *r;
    kvp_config hash;
    atomic_bool stop;
    atomic_int rounds;  /* remove-and-add rounds done */
    atomic_bool failed; /* a removal failed */
} churn;

#define CHURN_SLOTS 6

static void *churn_main(void *arg)
{
    churn *c = arg;
    char name[32];
    for (int i = 0; !atomic_load(&c->stop) || atomic_load(&c->rounds) < 50; i++) {
        uint32_t id = 0;
        snprintf(name, sizeof name, "churn-%d", i % 40); /* names come back: shared copies */
        kvp_router_worker_config wc;
        kvp_router_worker_config_init(&wc);
        wc.engine_id = name;
        wc.hash = c->hash;
        int rc = kvp_router_worker_add(c->r, &wc, &id);
        struct timespec pause = {0, 200000}; /* live for a while: scores see it */
        nanosleep(&pause, NULL);
        if ((rc == KVP_EEXIST || rc == KVP_OK) && kvp_router_worker_remove(c->r, id) != KVP_OK)
            atomic_store(&c->failed, true);
        atomic_fetch_add(&c->rounds, 1);
    }
    return NULL;
}

Test(router_score, rows_keep_engine_ids_across_concurrent_removal, .timeout = 120)
{
    kvp_router *r = router_new();
    churn c = {.r = r, .hash = hash_cfg(KVP_HASH_XXH3, 4)};
    atomic_init(&c.stop, false);
    atomic_init(&c.rounds, 0);
    atomic_init(&c.failed, false);
    for (int w = 0; w < CHURN_SLOTS; w++) {
        char name[16];
        snprintf(name, sizeof name, "fixed-%d", w);
        (void)add_worker(r, name, 0, c.hash, NULL);
    }
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, churn_main, &c), 0);
    uint32_t t[16];
    seq_tokens(t, 16, 7);
    kvp_namespace ns = ns_none();
    enum { KEEP = 64 };
    static const char *kept[KEEP];
    size_t n_kept = 0;
    for (int i = 0; i < 300 || atomic_load(&c.rounds) < 50 || n_kept == 0; i++) {
        kvp_router_row rows[16];
        const char *ids[16];
        kvp_router_score_result res;
        kvp_router_score_result_init(&res);
        res.engine_ids = ids;
        size_t n = 0;
        cr_assert_eq(kvp_router_score_v2(r, &ns, t, 16, rows, 16, &n, &res), KVP_OK);
        cr_assert_eq(res.view, VIEW_EXPECTED);
        cr_assert(n >= CHURN_SLOTS && n <= CHURN_SLOTS + 1, "%zu rows", n);
        for (size_t j = 0; j < n; j++) {
            cr_assert(strncmp(ids[j], "fixed-", 6) == 0 || strncmp(ids[j], "churn-", 6) == 0,
                      "row %zu: engine id '%s'", j, ids[j]);
            if (rows[j].worker < CHURN_SLOTS)
                cr_assert_eq(ids[j][6] - '0', (int)rows[j].worker, "a fixed worker's name");
            else if (n_kept < KEEP)
                kept[n_kept++] = ids[j]; /* a churned worker: removed soon after */
        }
    }
    atomic_store(&c.stop, true);
    pthread_join(th, NULL);
    cr_assert(!atomic_load(&c.failed), "a churn removal failed");
    cr_assert_gt(n_kept, 0, "some rows named a worker that was removed afterwards");
    for (size_t i = 0; i < n_kept; i++)
        cr_assert(strncmp(kept[i], "churn-", 6) == 0, "kept id %zu reads back", i);
    CHECK(r);
    kvp_router_free(r);
}

/* kvp_router_score_hashes equals kvp_router_score when every worker is in one hash group
 * (block runs, tiers, the stop, row order), marks stale workers, and checks its arguments. */
Test(router_score, score_hashes_equals_score)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 4);
    uint32_t w[3];
    w[0] = add_worker(r, "a", 0, hc, NULL);
    w[1] = add_worker(r, "b", 0, hc, NULL);
    w[2] = add_worker(r, "c", 0, hc, NULL);
    kvp_namespace ns = ns_none();
    uint32_t t[40];
    uint64_t k[10];
    seq_tokens(t, 40, 900);
    cr_assert_eq(keys_of(hc, &ns, t, 40, k, 10), 10);
    /* a: blocks 0-5 (0-2 GPU, 3-5 CPU); b: 0-1 and 3 (a hole at 2); c: 0-9 on GPU. */
    kvp_kv_event ea[2] = {ev_stored(k, 3, t, 4, "GPU"), ev_stored(k + 3, 3, t + 12, 4, "CPU")};
    apply_expect(r, w[0], 0, ea, 2, KVP_ROUTER_APPLIED);
    kvp_kv_event eb[2] = {ev_stored(k, 2, t, 4, NULL), ev_stored(k + 3, 1, t + 12, 4, "GPU")};
    apply_expect(r, w[1], 0, eb, 2, KVP_ROUTER_APPLIED);
    kvp_kv_event ec = ev_stored(k, 10, t, 4, "GPU");
    apply_expect(r, w[2], 0, &ec, 1, KVP_ROUTER_APPLIED);
    for (size_t n_blocks = 0; n_blocks <= 10; n_blocks++) {
        kvp_router_row rs[3], rh[3];
        size_t ns_rows = 0, nh_rows = 0;
        cr_assert_eq(kvp_router_score(r, &ns, t, 4 * n_blocks, rs, 3, &ns_rows), KVP_OK);
        cr_assert_eq(kvp_router_score_hashes(r, k, n_blocks, rh, 3, &nh_rows), KVP_OK);
        cr_assert_eq(ns_rows, 3);
        cr_assert_eq(nh_rows, 3);
        for (size_t i = 0; i < 3; i++) {
            cr_assert_eq(rh[i].worker, rs[i].worker);
            cr_assert_eq(rh[i].state, rs[i].state);
            cr_assert_eq(rh[i].dp_rank, rs[i].dp_rank);
            cr_assert_eq(rh[i].n_blocks, rs[i].n_blocks, "%zu blocks, row %zu", n_blocks, i);
            cr_assert_eq(rh[i].n_tokens, rs[i].n_tokens);
            cr_assert_eq(rh[i].score, rs[i].score);
        }
    }
    kvp_router_row rows[3];
    size_t n = 0;
    cr_assert_eq(kvp_router_score_hashes(r, k, 10, rows, 3, &n), KVP_OK);
    cr_assert_eq(rows[0].n_blocks, 6);
    cr_assert_float_eq(rows[0].score, 3 * 1.0 + 3 * 0.8, 1e-12);
    cr_assert_eq(rows[1].n_blocks, 2);
    cr_assert_eq(rows[2].n_blocks, 10);
    cr_assert_eq(rows[2].n_tokens, 40);
    /* A stale worker's row is STALE, the others unchanged. */
    cr_assert_eq(kvp_router_mark_stale(r, w[2]), KVP_OK);
    cr_assert_eq(kvp_router_score_hashes(r, k, 10, rows, 3, &n), KVP_OK);
    cr_assert_eq(rows[2].state, KVP_ROUTER_ROW_STALE);
    cr_assert_eq(rows[2].n_blocks, 0);
    cr_assert_eq(rows[0].n_blocks, 6);
    /* Arguments. */
    cr_assert_eq(kvp_router_score_hashes(r, k, 10, rows, 2, &n), KVP_ENOSPC);
    cr_assert_eq(n, 3);
    cr_assert_eq(kvp_router_score_hashes(r, NULL, 0, rows, 3, &n), KVP_OK);
    cr_assert_eq(rows[0].n_blocks, 0);
    cr_assert_eq(kvp_router_score_hashes(r, NULL, 2, rows, 3, &n), KVP_EINVAL);
    cr_assert_eq(kvp_router_score_hashes(NULL, k, 2, rows, 3, &n), KVP_EINVAL);
    cr_assert_eq(kvp_router_score_hashes(r, k, 2, NULL, 3, &n), KVP_EINVAL);
    cr_assert_eq(kvp_router_score_hashes(r, k, 2, rows, 3, NULL), KVP_EINVAL);
    kvp_router_free(r);
}

/* score_hashes takes the hashes as every worker's own, whatever its group. */
Test(router_score, score_hashes_across_groups)
{
    kvp_router *r = router_new();
    uint32_t a = add_worker(r, "a", 0, hash_cfg(KVP_HASH_VLLM_SHA256, 4), NULL);
    uint32_t b = add_worker(r, "b", 0, hash_cfg(KVP_HASH_XXH3, 16), "m");
    uint64_t k[3] = {11, 22, 33};
    uint32_t t[48] = {0};
    kvp_kv_event ea = ev_stored(k, 2, t, 4, "GPU");
    apply_expect(r, a, 0, &ea, 1, KVP_ROUTER_APPLIED);
    kvp_kv_event eb = ev_stored(k, 3, t, 16, "CPU");
    apply_expect(r, b, 0, &eb, 1, KVP_ROUTER_APPLIED);
    kvp_router_row rows[2];
    size_t n = 0;
    cr_assert_eq(kvp_router_score_hashes(r, k, 3, rows, 2, &n), KVP_OK);
    cr_assert_eq(rows[0].worker, a);
    cr_assert_eq(rows[0].n_blocks, 2);
    cr_assert_eq(rows[0].n_tokens, 8);
    cr_assert_eq(rows[1].worker, b);
    cr_assert_eq(rows[1].n_blocks, 3);
    cr_assert_eq(rows[1].n_tokens, 48, "the worker's own block size");
    cr_assert_float_eq(rows[1].score, 3 * 0.8, 1e-12);
    kvp_router_free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Sequence numbers: restarts, gaps, duplicates, stale workers                              */
/* ---------------------------------------------------------------------------------------- */

typedef struct fixture {
    kvp_router *r;
    kvp_config hc;
    uint32_t id;
    uint32_t t[32];
    uint64_t k[8];
    kvp_namespace ns;
} fixture;

static void fixture_init(fixture *f)
{
    f->r = router_new();
    f->hc = hash_cfg(KVP_HASH_VLLM_SHA256, 4);
    f->id = add_worker(f->r, "pod", 0, f->hc, NULL);
    seq_tokens(f->t, 32, 500);
    f->ns = ns_none();
    keys_of(f->hc, &f->ns, f->t, 32, f->k, 8);
}

/* Store block i (alone) at seq. */
static kvp_router_apply_result store_block(fixture *f, uint64_t seq, int i, int status)
{
    kvp_kv_event e = ev_stored(f->k + i, 1, f->t + 4 * i, 4, "GPU");
    return apply_expect(f->r, f->id, seq, &e, 1, status);
}

static uint32_t run_of(fixture *f)
{
    return score_of(f->r, &f->ns, f->t, 32, f->id).n_blocks;
}

Test(router_seq, in_order_then_duplicate)
{
    fixture f;
    fixture_init(&f);
    store_block(&f, 0, 0, KVP_ROUTER_APPLIED);
    store_block(&f, 0, 6, KVP_ROUTER_DUPLICATE); /* seq 0 again, same ts: a duplicate */
    kvp_router_apply_result res = store_block(&f, 1, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(res.expected, 2);
    cr_assert_eq(res.n_stored, 1);
    res = store_block(&f, 1, 5, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(res.expected, 2);
    cr_assert_eq(run_of(&f), 2);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(f.r, &st), KVP_OK);
    cr_assert_eq(st.n_duplicates, 2);
    cr_assert_eq(st.n_blocks, 2, "duplicates applied nothing");
    kvp_router_free(f.r);
}

Test(router_seq, restart_clears_then_applies)
{
    fixture f;
    fixture_init(&f);
    for (int i = 0; i < 4; i++)
        store_block(&f, (uint64_t)i, i, KVP_ROUTER_APPLIED);
    cr_assert_eq(run_of(&f), 4);
    /* The engine restarts: its cache is empty, and it numbers from 0 again. */
    kvp_kv_event e = ev_stored(f.k + 2, 1, f.t + 8, 4, "GPU");
    kvp_kv_batch b = batch_of(&e, 1, 5000.0);
    kvp_router_apply_result res;
    cr_assert_eq(kvp_router_apply(f.r, f.id, 0, &b, &res), KVP_OK);
    cr_assert_eq(res.status, KVP_ROUTER_RESTARTED);
    cr_assert_eq(res.expected, 1);
    CHECK(f.r);
    cr_assert_eq(run_of(&f), 0, "old blocks gone with the old process");
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_router_worker_stats_get(f.r, f.id, &ws), KVP_OK);
    cr_assert_eq(ws.n_blocks, 1);
    cr_assert_eq(ws.n_restarts, 1);
    /* A restart right after batch 0 is told from a duplicate by its timestamp. */
    b.ts = 6000.0;
    cr_assert_eq(kvp_router_apply(f.r, f.id, 0, &b, &res), KVP_OK);
    cr_assert_eq(res.status, KVP_ROUTER_RESTARTED);
    kvp_router_free(f.r);
}

Test(router_seq, gap_reported_then_replay_fills_it)
{
    fixture f;
    fixture_init(&f);
    store_block(&f, 0, 0, KVP_ROUTER_APPLIED);
    kvp_router_apply_result res = store_block(&f, 3, 3, KVP_ROUTER_GAP);
    cr_assert_eq(res.expected, 1, "replay from the first missing batch");
    cr_assert_eq(run_of(&f), 1);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(f.r, &st), KVP_OK);
    cr_assert_eq(st.n_blocks, 1, "a gap applies nothing");
    cr_assert_eq(st.n_gaps, 1);
    /* The replay socket returns 1, 2, 3; the live 3 then arrives again as a duplicate. */
    store_block(&f, 1, 1, KVP_ROUTER_APPLIED);
    store_block(&f, 2, 2, KVP_ROUTER_APPLIED);
    store_block(&f, 3, 3, KVP_ROUTER_APPLIED);
    store_block(&f, 3, 3, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(run_of(&f), 4);
    kvp_router_free(f.r);
}

Test(router_seq, late_joiner_gets_a_gap_from_zero)
{
    fixture f;
    fixture_init(&f);
    kvp_router_apply_result res = store_block(&f, 57, 0, KVP_ROUTER_GAP);
    cr_assert_eq(res.expected, 0);
    kvp_router_free(f.r);
}

Test(router_seq, stale_until_resync)
{
    fixture f;
    fixture_init(&f);
    store_block(&f, 0, 0, KVP_ROUTER_APPLIED);
    store_block(&f, 1, 1, KVP_ROUTER_APPLIED);
    store_block(&f, 9, 2, KVP_ROUTER_GAP);
    /* The replay buffer no longer reaches back: give up. */
    cr_assert_eq(kvp_router_mark_stale(f.r, f.id), KVP_OK);
    CHECK(f.r);
    kvp_router_row row = score_of(f.r, &f.ns, f.t, 32, f.id);
    cr_assert_eq(row.state, KVP_ROUTER_ROW_STALE);
    cr_assert_eq(row.n_blocks, 0);
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_router_worker_stats_get(f.r, f.id, &ws), KVP_OK);
    cr_assert(ws.stale && !ws.seq_known && ws.n_blocks == 0);
    /* The next batch is taken whatever its number, and counted from. */
    kvp_router_apply_result res = store_block(&f, 10, 0, KVP_ROUTER_APPLIED);
    cr_assert(res.stale);
    cr_assert_eq(res.expected, 11);
    store_block(&f, 11, 1, KVP_ROUTER_APPLIED);
    store_block(&f, 13, 2, KVP_ROUTER_GAP);
    cr_assert_eq(score_of(f.r, &f.ns, f.t, 32, f.id).state, KVP_ROUTER_ROW_STALE);
    cr_assert_eq(kvp_router_resync(f.r, f.id), KVP_OK);
    CHECK(f.r);
    row = score_of(f.r, &f.ns, f.t, 32, f.id);
    cr_assert_eq(row.state, KVP_ROUTER_ROW_SCORED);
    cr_assert_eq(row.n_blocks, 2, "the blocks stored since it went stale");
    kvp_router_free(f.r);
}

Test(router_seq, stale_fresh_again_on_clear_or_zero)
{
    fixture f;
    fixture_init(&f);
    store_block(&f, 0, 0, KVP_ROUTER_APPLIED);
    cr_assert_eq(kvp_router_mark_stale(f.r, f.id), KVP_OK);
    kvp_kv_event e[2] = {ev_cleared(), ev_stored(f.k, 2, f.t, 4, "GPU")};
    kvp_router_apply_result res = apply_expect(f.r, f.id, 40, e, 2, KVP_ROUTER_APPLIED);
    cr_assert_not(res.stale, "after AllBlocksCleared the view is exact");
    cr_assert_eq(res.n_cleared, 1);
    cr_assert_eq(run_of(&f), 2);

    cr_assert_eq(kvp_router_mark_stale(f.r, f.id), KVP_OK);
    res = store_block(&f, 0, 0, KVP_ROUTER_APPLIED);
    cr_assert_not(res.stale, "batch 0: a new publisher, exact from its start");
    cr_assert_eq(run_of(&f), 1);

    cr_assert_eq(kvp_router_mark_stale(f.r, f.id), KVP_OK);
    store_block(&f, 5, 0, KVP_ROUTER_APPLIED);
    res = store_block(&f, 0, 0, KVP_ROUTER_RESTARTED);
    cr_assert_not(res.stale);
    kvp_router_free(f.r);
}

Test(router_seq, cleared_event_clears_only_that_worker)
{
    fixture f;
    fixture_init(&f);
    uint32_t other = add_worker(f.r, "other", 0, f.hc, NULL);
    kvp_kv_event e = ev_stored(f.k, 4, f.t, 4, "GPU");
    apply_expect(f.r, f.id, 0, &e, 1, KVP_ROUTER_APPLIED);
    apply_expect(f.r, other, 0, &e, 1, KVP_ROUTER_APPLIED);
    kvp_kv_event c = ev_cleared();
    apply_expect(f.r, f.id, 1, &c, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(run_of(&f), 0);
    cr_assert_eq(score_of(f.r, &f.ns, f.t, 32, other).n_blocks, 4);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(f.r, &st), KVP_OK);
    cr_assert_eq(st.n_blocks, 4);
    cr_assert_eq(st.n_holders, 4);
    kvp_router_free(f.r);
}

/* ---------------------------------------------------------------------------------------- */
/* Malformed batches                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Apply b at seq 1 and expect KVP_EINVAL naming event bad; then nothing changed. */
static void expect_malformed(fixture *f, const kvp_kv_batch *b, size_t bad, const char *what)
{
    kvp_router_stats before, after;
    cr_assert_eq(kvp_router_stats_get(f->r, &before), KVP_OK);
    kvp_router_apply_result res;
    int rc = kvp_router_apply(f->r, f->id, 1, b, &res);
    cr_assert_eq(rc, KVP_EINVAL, "%s: %s", what, kvp_strerror(rc));
    cr_assert_not_null(res.why, "%s: no reason", what);
    cr_assert_eq(res.bad_event, bad, "%s: bad_event %zu", what, res.bad_event);
    cr_assert_eq(res.status, 0);
    CHECK(f->r);
    cr_assert_eq(kvp_router_stats_get(f->r, &after), KVP_OK);
    cr_assert_eq(after.n_holders, before.n_holders, "%s: applied something", what);
    cr_assert_eq(after.n_holder_media, before.n_holder_media, "%s", what);
    cr_assert_eq(after.n_malformed, before.n_malformed + 1, "%s", what);
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_router_worker_stats_get(f->r, f->id, &ws), KVP_OK);
    cr_assert_eq(ws.expected, 1, "%s: the sequence moved", what);
}

Test(router_malformed, each_kind_refused_whole)
{
    fixture f;
    fixture_init(&f);
    store_block(&f, 0, 0, KVP_ROUTER_APPLIED);
    kvp_kv_event good = ev_stored(f.k + 1, 2, f.t + 4, 4, "GPU");
    kvp_kv_event e[2];
    kvp_kv_batch b;

    e[0] = good;
    e[1] = good;
    e[1].type = 77;
    b = batch_of(e, 2, 1);
    expect_malformed(&f, &b, 1, "unknown event type");

    e[1] = good;
    e[1].block_size = 8;
    e[1].n_tokens = 16;
    expect_malformed(&f, &b, 1, "block size of another hash configuration");

    e[1] = good;
    e[1].n_tokens = 7;
    expect_malformed(&f, &b, 1, "token count");

    e[1] = good;
    e[1].tokens = NULL;
    expect_malformed(&f, &b, 1, "NULL tokens");

    e[1] = good;
    e[1].hashes = NULL;
    expect_malformed(&f, &b, 1, "NULL hashes");

    e[1] = ev_removed(NULL, 3, "GPU");
    expect_malformed(&f, &b, 1, "NULL hashes in BlockRemoved");

    e[1] = good;
    e[1].medium = "a-medium-name-well-over-31-bytes-long";
    expect_malformed(&f, &b, 1, "medium name too long");

    b = batch_of(NULL, 2, 1);
    expect_malformed(&f, &b, SIZE_MAX, "NULL events");

    b = batch_of(&good, 1, 1);
    b.has_dp_rank = true;
    b.dp_rank = 3;
    expect_malformed(&f, &b, SIZE_MAX, "another data-parallel rank");

    kvp_router_apply_result res;
    cr_assert_eq(kvp_router_apply(f.r, f.id, UINT64_MAX, &b, &res), KVP_EINVAL);
    cr_assert_eq(kvp_router_apply(f.r, f.id + 5, 1, &b, &res), KVP_ENOENT);
    cr_assert_eq(kvp_router_apply(f.r, f.id, 1, NULL, &res), KVP_EINVAL);
    cr_assert_eq(kvp_router_apply(NULL, f.id, 1, &b, &res), KVP_EINVAL);

    /* The right rank and the good batch apply. */
    b.dp_rank = 0;
    apply_expect(f.r, f.id, 1, &good, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(run_of(&f), 3);
    kvp_router_free(f.r);
}

Test(router_seq, apply_many_applies_each_as_apply_would)
{
    fixture f;
    fixture_init(&f);
    uint32_t other = add_worker(f.r, "other", 0, f.hc, NULL);
    kvp_kv_event good0 = ev_stored(f.k, 2, f.t, 4, "GPU");
    kvp_kv_event good1 = ev_stored(f.k + 2, 2, f.t + 8, 4, "GPU");
    kvp_kv_event bad = good1;
    bad.block_size = 8;
    kvp_kv_batch b0 = batch_of(&good0, 1, 1), b1 = batch_of(&good1, 1, 2),
                 bb = batch_of(&bad, 1, 3);
    kvp_router_item items[6] = {
        {f.id, 0, &b0, 0, {0}}, {other, 5, &b0, 0, {0}}, {f.id, 1, &bb, 0, {0}},
        {f.id, 1, &b1, 0, {0}}, {77, 0, &b0, 0, {0}},    {f.id, 1, &b1, 0, {0}},
    };
    cr_assert_eq(kvp_router_apply_many(f.r, items, 6), KVP_EINVAL, "the first failure");
    CHECK(f.r);
    cr_assert_eq(items[0].rc, KVP_OK);
    cr_assert_eq(items[0].res.status, KVP_ROUTER_APPLIED);
    cr_assert_eq(items[1].rc, KVP_OK);
    cr_assert_eq(items[1].res.status, KVP_ROUTER_GAP);
    cr_assert_eq(items[2].rc, KVP_EINVAL);
    cr_assert_not_null(items[2].res.why);
    cr_assert_eq(items[3].rc, KVP_OK, "a failing item does not stop the others");
    cr_assert_eq(items[3].res.status, KVP_ROUTER_APPLIED);
    cr_assert_eq(items[4].rc, KVP_ENOENT);
    cr_assert_eq(items[5].res.status, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(run_of(&f), 4);
    cr_assert_eq(score_of(f.r, &f.ns, f.t, 32, other).n_blocks, 0);
    cr_assert_eq(kvp_router_apply_many(f.r, NULL, 0), KVP_OK);
    cr_assert_eq(kvp_router_apply_many(f.r, NULL, 1), KVP_EINVAL);
    cr_assert_eq(kvp_router_apply_many(NULL, items, 1), KVP_EINVAL);
    kvp_router_free(f.r);
}

Test(router_malformed, other_kv_group_skipped)
{
    fixture f;
    fixture_init(&f);
    kvp_kv_event e[2] = {ev_stored(f.k, 1, f.t, 4, "GPU"),
                         ev_stored(f.k + 1, 1, f.t + 4, 4, "GPU")};
    e[1].group_idx = 1;
    e[1].block_size = 32; /* another group may have another block size */
    e[1].n_tokens = 32;
    kvp_router_apply_result res = apply_expect(f.r, f.id, 0, e, 2, KVP_ROUTER_APPLIED);
    cr_assert_eq(res.n_skipped, 1);
    cr_assert_eq(res.n_stored, 1);
    cr_assert_eq(run_of(&f), 1);
    e[0].group_idx = 0;
    kvp_kv_event rm = ev_removed(f.k, 1, "GPU");
    rm.group_idx = 1;
    apply_expect(f.r, f.id, 1, &rm, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(run_of(&f), 1, "group 1's eviction leaves group 0's block");
    kvp_router_free(f.r);
}

/* Random field values in otherwise well-formed memory: every batch is applied or refused
 * whole (KVP_EINVAL with a reason and nothing applied), never anything else. */
Test(router_malformed, random_garbage_batches)
{
    fixture f;
    fixture_init(&f);
    static const char *media[] = {NULL, "",   "GPU", "cpu", "x", "a-medium-name-well-over-31-bytes",
                                  "m1", "m2", "m3",  "m4",  "m5"};
    uint64_t rng = 31337, seq = 0;
    uint64_t hashes[16];
    uint32_t tokens[64];
    int n_ok = 0, n_bad = 0;
    for (int step = 0; step < 3000; step++) {
        kvp_kv_event ev[3];
        size_t n = th_rand(&rng) % 4;
        for (size_t i = 0; i < n; i++) {
            memset(&ev[i], 0, sizeof ev[i]);
            ev[i].type = (int)(th_rand(&rng) % 5);
            ev[i].n_hashes = th_rand(&rng) % 17;
            for (size_t k = 0; k < ev[i].n_hashes; k++)
                hashes[k] = th_rand(&rng) % 8 == 0 ? f.k[k % 8] : th_rand(&rng) % 64;
            ev[i].hashes = th_rand(&rng) % 20 ? hashes : NULL;
            ev[i].block_size = th_rand(&rng) % 4 ? 4 : (uint32_t)(th_rand(&rng) % 9);
            ev[i].n_tokens = th_rand(&rng) % 4 ? ev[i].n_hashes * 4 : th_rand(&rng) % 65;
            if (ev[i].n_tokens > 64)
                ev[i].n_tokens = 64;
            ev[i].tokens = th_rand(&rng) % 20 ? tokens : NULL;
            ev[i].medium = media[th_rand(&rng) % (sizeof media / sizeof media[0])];
            ev[i].group_idx = (int32_t)(th_rand(&rng) % 4) - 1;
        }
        kvp_kv_batch b = batch_of(n && th_rand(&rng) % 30 ? ev : NULL, n, (double)step);
        b.has_dp_rank = th_rand(&rng) % 5 == 0;
        b.dp_rank = (int64_t)(th_rand(&rng) % 2);
        kvp_router_stats before, after;
        cr_assert_eq(kvp_router_stats_get(f.r, &before), KVP_OK);
        kvp_router_apply_result res;
        int rc = kvp_router_apply(f.r, f.id, seq, &b, &res);
        CHECK(f.r);
        cr_assert_eq(kvp_router_stats_get(f.r, &after), KVP_OK);
        if (rc == KVP_OK) {
            cr_assert_eq(res.status, KVP_ROUTER_APPLIED);
            seq++;
            n_ok++;
        } else {
            cr_assert_eq(rc, KVP_EINVAL, "step %d: %s", step, kvp_strerror(rc));
            cr_assert_not_null(res.why);
            cr_assert_eq(after.n_holder_media, before.n_holder_media, "step %d", step);
            cr_assert_eq(after.n_blocks, before.n_blocks);
            n_bad++;
        }
    }
    cr_assert_gt(n_ok, 300, "some garbage is well formed");
    cr_assert_gt(n_bad, 300);
    kvp_router_free(f.r);
}

/* ---------------------------------------------------------------------------------------- */
/* Allocation failures                                                                      */
/* ---------------------------------------------------------------------------------------- */

Test(router_alloc, every_failure_leaves_the_index_unchanged)
{
    th_alloc al;
    th_alloc_init(&al);
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.alloc = th_alloc_hooks(&al);
    kvp_router *r = router_new_with(&cfg);
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_XXHASH, 2);
    uint32_t w[6];
    char name[8];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "w%d", i);
        w[i] = add_worker(r, name, 0, hc, NULL);
    }
    kvp_namespace ns = ns_none();
    uint32_t t[400];
    seq_tokens(t, 400, 3);
    uint64_t k[200];
    keys_of(hc, &ns, t, 400, k, 200);
    /* Workers 0-3 hold blocks 0-99: spill sets of 4, full in class 0. */
    for (int i = 0; i < 4; i++) {
        kvp_kv_event e = ev_stored(k, 100, t, 2, "GPU");
        apply_expect(r, w[i], 0, &e, 1, KVP_ROUTER_APPLIED);
    }
    /* Worker 5's batch adds to 100 full spill sets, inserts 100 new keys (table growth),
     * and registers a medium. Fail each allocation it makes in turn. */
    kvp_kv_event e[2] = {ev_stored(k, 200, t, 2, "GPU"), ev_stored(k, 50, t, 2, "SSD")};
    kvp_kv_batch b = batch_of(e, 2, 1);
    kvp_router_stats before;
    cr_assert_eq(kvp_router_stats_get(r, &before), KVP_OK);
    kvp_router_row rows_before[6], rows[6];
    size_t n = 0;
    cr_assert_eq(kvp_router_score(r, &ns, t, 400, rows_before, 6, &n), KVP_OK);
    int n_failures = 0;
    for (int64_t at = 0;; at++) {
        th_alloc_arm(&al, at);
        kvp_router_apply_result res;
        int rc = kvp_router_apply(r, w[5], 0, &b, &res);
        th_alloc_arm(&al, -1);
        CHECK(r);
        if (rc == KVP_OK)
            break;
        cr_assert_eq(rc, KVP_ENOMEM, "failure at %lld: %s", (long long)at, kvp_strerror(rc));
        n_failures++;
        kvp_router_stats st;
        cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
        cr_assert_eq(st.n_holders, before.n_holders);
        cr_assert_eq(st.n_blocks, before.n_blocks);
        cr_assert_eq(kvp_router_score(r, &ns, t, 400, rows, 6, &n), KVP_OK);
        cr_assert_eq(memcmp(rows, rows_before, sizeof rows), 0, "scores moved at %lld",
                     (long long)at);
        kvp_router_worker_stats ws;
        cr_assert_eq(kvp_router_worker_stats_get(r, w[5], &ws), KVP_OK);
        cr_assert_eq(ws.expected, 0);
    }
    cr_assert_gt(n_failures, 1, "the batch allocated (table and spill records)");
    cr_assert_eq(score_of(r, &ns, t, 400, w[5]).n_blocks, 200);
    cr_assert_eq(score_of(r, &ns, t, 400, w[0]).n_blocks, 100);
    kvp_router_free(r);
    cr_assert_eq(al.n_live, 0, "leak");
    cr_assert_eq(al.n_bad_frees, 0);
}

Test(router_alloc, creation_and_worker_add_failures)
{
    th_alloc al;
    th_alloc_init(&al);
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.alloc = th_alloc_hooks(&al);
    cfg.table_seed = 1;
    for (int64_t at = 0;; at++) {
        th_alloc_arm(&al, at);
        kvp_router *r = NULL;
        int rc = kvp_router_new(&cfg, &r);
        th_alloc_arm(&al, -1);
        if (rc == KVP_ENOMEM) {
            cr_assert_null(r);
            cr_assert_eq(al.n_live, 0);
            continue;
        }
        cr_assert_eq(rc, KVP_OK);
        for (int64_t at2 = 0;; at2++) {
            kvp_router_worker_config wc;
            kvp_router_worker_config_init(&wc);
            wc.engine_id = "engine";
            wc.model = "model";
            uint32_t id;
            th_alloc_arm(&al, at2);
            rc = kvp_router_worker_add(r, &wc, &id);
            th_alloc_arm(&al, -1);
            CHECK(r);
            if (rc == KVP_OK)
                break;
            cr_assert_eq(rc, KVP_ENOMEM);
            kvp_router_stats st;
            cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
            cr_assert_eq(st.n_workers, 0);
            cr_assert_eq(st.n_groups, 0);
        }
        kvp_router_free(r);
        break;
    }
    cr_assert_eq(al.n_live, 0, "leak");
    cr_assert_eq(al.n_bad_frees, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Workers, groups, configuration                                                           */
/* ---------------------------------------------------------------------------------------- */

Test(router_workers, add_find_get_remove)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 16);
    hc.seed = 0; /* the default config's */
    uint32_t a = add_worker(r, "pod-a", 0, hc, NULL);
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = "pod-a";
    uint32_t id = 99;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_EEXIST);
    cr_assert_eq(id, a);
    cr_assert_eq(kvp_router_worker_find(r, "pod-a", 0, &id), KVP_OK);
    cr_assert_eq(id, a);
    cr_assert_eq(kvp_router_worker_find(r, "pod-a", 1, &id), KVP_ENOENT);
    cr_assert_eq(kvp_router_worker_find(r, "pod", 0, &id), KVP_ENOENT);
    uint32_t g = 0;
    cr_assert_eq(kvp_router_worker_get(r, "pod-b", 2, &g), KVP_OK, "added on first event");
    CHECK(r);
    uint32_t g2 = 0;
    cr_assert_eq(kvp_router_worker_get(r, "pod-b", 2, &g2), KVP_OK);
    cr_assert_eq(g, g2);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_groups, 1, "the default config is vllm-sha256-cbor, block size 16");

    /* Removing a worker drops its blocks; its id goes to the next worker. */
    uint32_t t[32];
    seq_tokens(t, 32, 9);
    kvp_namespace ns = ns_none();
    uint64_t k[2];
    keys_of(hc, &ns, t, 32, k, 2);
    kvp_kv_event e = ev_stored(k, 2, t, 16, "GPU");
    apply_expect(r, a, 0, &e, 1, KVP_ROUTER_APPLIED);
    apply_expect(r, g, 0, &e, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(kvp_router_worker_remove(r, a), KVP_OK);
    CHECK(r);
    cr_assert_eq(kvp_router_worker_remove(r, a), KVP_ENOENT);
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_holders, 2);
    cr_assert_eq(st.n_workers, 1);
    uint32_t c = add_worker(r, "pod-c", 0, hc, NULL);
    cr_assert_eq(c, a, "the free slot is reused");
    cr_assert_eq(score_of(r, &ns, t, 32, c).n_blocks, 0, "nothing inherited");
    cr_assert_eq(score_of(r, &ns, t, 32, g).n_blocks, 2);
    cr_assert_eq(kvp_router_worker_remove(r, 12345), KVP_ENOENT);
    kvp_router_free(r);
}

Test(router_workers, config_errors)
{
    kvp_router_config cfg;
    kvp_router *r = NULL;
    cr_assert_eq(kvp_router_new(NULL, &r), KVP_EINVAL);
    kvp_router_config_init(&cfg);
    cr_assert_eq(kvp_router_new(&cfg, NULL), KVP_EINVAL);
    cfg.tiers[1].medium = "gpu";
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL, "repeated tier (case ignored)");
    kvp_router_config_init(&cfg);
    cfg.tiers[0].weight = (double)NAN;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    kvp_router_config_init(&cfg);
    cfg.tiers[0].medium = "";
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    kvp_router_config_init(&cfg);
    cfg.n_tiers = KVP_ROUTER_MAX_MEDIA + 1;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    kvp_router_config_init(&cfg);
    cfg.hash.block_size = 0;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL, "the hasher refuses the default");
    kvp_router_config_init(&cfg);
    cfg.hash.hash_profile = KVP_HASH_KEYED;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL, "a random key equals no engine's");
    cr_assert_null(r);

    r = router_new();
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    uint32_t id;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_EINVAL, "no engine id");
    wc.engine_id = "e";
    wc.hash.hash_profile = KVP_HASH_SIPHASH;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_EINVAL);
    wc.hash.hash_key_len = 16;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_OK, "with the engine's key");
    wc.engine_id = "f";
    wc.hash.hash_profile = 99;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_EINVAL);
    CHECK(r);
    kvp_router_free(r);
    kvp_router_free(NULL);
}

Test(router_workers, hash_groups_limit)
{
    kvp_router *r = router_new();
    char name[16];
    uint32_t id;
    for (unsigned i = 0; i < KVP_ROUTER_MAX_GROUPS; i++) {
        kvp_config hc = hash_cfg(KVP_HASH_XXH3, 4);
        hc.seed = i;
        snprintf(name, sizeof name, "w%u", i);
        add_worker(r, name, 0, hc, NULL);
    }
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = "one-more";
    wc.hash = hash_cfg(KVP_HASH_XXH3, 4);
    wc.hash.seed = 100000;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_ENOSPC);
    wc.hash.seed = 3; /* an existing group still takes workers */
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_OK);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_groups, KVP_ROUTER_MAX_GROUPS);
    CHECK(r);
    kvp_router_free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Keys equal the engine's; namespaces, LoRA, salt, model                                   */
/* ---------------------------------------------------------------------------------------- */

/* Run tokens through a kvp_cache with config c in namespace ns, and return the STORED
 * events' key.lo (in block order: kvp_access stores last to first) in out. */
static size_t engine_keys(kvp_config c, const kvp_namespace *ns, const uint32_t *tokens, size_t n,
                          uint64_t *out)
{
    th_events *rec = calloc(1, sizeof *rec);
    c.n_blocks = 4096;
    c.on_event = th_events_fn;
    c.event_ud = rec;
    kvp_cache *cache = NULL;
    cr_assert_eq(kvp_cache_new(&c, &cache), KVP_OK);
    kvp_match m;
    cr_assert_eq(kvp_access(cache, ns, tokens, n, &m), KVP_OK);
    size_t n_full = n / c.block_size, got = 0;
    cr_assert_eq(m.n_blocks_stored, n_full);
    /* Order by parent links: block 0's parent is the root. */
    kvp_key parent = {0, 0};
    for (size_t i = 0; i < n_full; i++) {
        for (size_t j = 0; j < rec->n; j++) {
            const kvp_event *ev = &rec->ev[j];
            if (ev->type != KVP_EVENT_STORED)
                continue;
            bool first = i == 0 && ev->parent_is_root;
            bool next = i > 0 && !ev->parent_is_root && th_key_eq(ev->parent, parent);
            if (first || next) {
                out[got++] = ev->key.lo;
                parent = ev->key;
                break;
            }
        }
    }
    cr_assert_eq(got, n_full, "STORED chain incomplete");
    kvp_cache_free(cache);
    free(rec);
    return got;
}

/* The engine's STORED keys, fed to the router, must be found by the router's own hashing of
 * the same tokens, block for block. */
static void keys_equal_engine(int profile)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(profile, 16);
    uint32_t a = add_worker(r, "engine", 0, hc, "llama");
    uint32_t t[16 * 40 + 5];
    uint64_t seed = 77;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        t[i] = (uint32_t)(th_rand(&seed) % 150000);
    size_t n = sizeof t / sizeof t[0];
    kvp_namespace ns;
    bool vllm = profile == KVP_HASH_VLLM_SHA256 || profile == KVP_HASH_VLLM_XXHASH;
    /* vLLM keys have no model field: the engine hashes without it, the router too. */
    th_ns(&ns, vllm ? NULL : "llama", "lora-7", NULL, "salt-1");
    uint64_t ek[40];
    cr_assert_eq(engine_keys(hc, &ns, t, n, ek), 40);
    /* Also the router's keys (via the public hasher) equal them. */
    uint64_t hk[40];
    cr_assert_eq(keys_of(hc, &ns, t, n, hk, 40), 40);
    cr_assert_eq(memcmp(ek, hk, sizeof ek), 0, "%s: hasher keys differ from the engine's",
                 kvp_hash_profile_name(profile));
    kvp_kv_event e = ev_stored(ek, 40, t, 16, "GPU");
    apply_expect(r, a, 0, &e, 1, KVP_ROUTER_APPLIED);

    kvp_namespace req;
    th_ns(&req, NULL, "lora-7", NULL, "salt-1"); /* the router fills the worker's model */
    kvp_router_row row = score_of(r, &req, t, n, a);
    cr_assert_eq(row.n_blocks, 40, "%s: router keys differ from the engine's",
                 kvp_hash_profile_name(profile));
    cr_assert_eq(row.n_tokens, 640);
    for (size_t cut = 0; cut < 40; cut += 13) {
        uint32_t saved = t[cut * 16 + 3];
        t[cut * 16 + 3] = 150001;
        cr_assert_eq(score_of(r, &req, t, n, a).n_blocks, cut, "%s: diverged at block %zu",
                     kvp_hash_profile_name(profile), cut);
        t[cut * 16 + 3] = saved;
    }
    /* Another salt, another adapter, no salt: none of these blocks. */
    th_ns(&req, NULL, "lora-7", NULL, "salt-2");
    cr_assert_eq(score_of(r, &req, t, n, a).n_blocks, 0,
                 "a salted request scored another "
                 "salt's blocks");
    th_ns(&req, NULL, NULL, NULL, "salt-1");
    cr_assert_eq(score_of(r, &req, t, n, a).n_blocks, 0, "the LoRA was dropped");
    th_ns(&req, NULL, "lora-7", NULL, NULL);
    cr_assert_eq(score_of(r, &req, t, n, a).n_blocks, 0, "the salt was dropped");
    /* A request naming another model does not score this worker at all. */
    th_ns(&req, "mistral", "lora-7", NULL, "salt-1");
    row = score_of(r, &req, t, n, a);
    cr_assert_eq(row.state, KVP_ROUTER_ROW_MODEL);
    cr_assert_eq(row.n_blocks, 0);
    /* Naming the worker's own model is the same as naming none. */
    th_ns(&req, "llama", "lora-7", NULL, "salt-1");
    cr_assert_eq(score_of(r, &req, t, n, a).n_blocks, 40);
    kvp_router_free(r);
}

Test(router_keys, equal_engine_vllm_sha256_cbor)
{
    keys_equal_engine(KVP_HASH_VLLM_SHA256);
}

Test(router_keys, equal_engine_vllm_xxhash_cbor)
{
    keys_equal_engine(KVP_HASH_VLLM_XXHASH);
}

Test(router_keys, equal_engine_xxh3)
{
    keys_equal_engine(KVP_HASH_XXH3);
}

Test(router_keys, equal_engine_keyed_with_shared_key)
{
    kvp_config hc = hash_cfg(KVP_HASH_KEYED, 16);
    hc.hash_key_len = 32;
    for (int i = 0; i < 32; i++)
        hc.hash_key[i] = (uint8_t)(i * 7 + 1);
    kvp_router *r = router_new();
    uint32_t a = add_worker(r, "engine", 0, hc, NULL);
    uint32_t t[16 * 8];
    seq_tokens(t, 16 * 8, 42);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "tenant-1", NULL);
    uint64_t ek[8];
    engine_keys(hc, &ns, t, 16 * 8, ek);
    kvp_kv_event e = ev_stored(ek, 8, t, 16, NULL);
    apply_expect(r, a, 0, &e, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 16 * 8, a).n_blocks, 8);
    th_ns(&ns, "m", NULL, "tenant-2", NULL);
    cr_assert_eq(score_of(r, &ns, t, 16 * 8, a).n_blocks, 0, "another tenant");
    kvp_router_free(r);
}

Test(router_keys, profile_limits_mark_rows)
{
    kvp_router *r = router_new();
    kvp_config v = hash_cfg(KVP_HASH_VLLM_SHA256, 4);
    v.vocab_size = 1000;
    uint32_t a = add_worker(r, "vllm", 0, v, NULL);
    uint32_t x = add_worker(r, "xxh3", 0, hash_cfg(KVP_HASH_XXH3, 4), NULL);
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvp_namespace ns;
    th_ns(&ns, NULL, NULL, "tenant", NULL);
    cr_assert_eq(score_of(r, &ns, t, 8, a).state, KVP_ROUTER_ROW_NOTSUP,
                 "vLLM keys cannot express a tenant");
    cr_assert_eq(score_of(r, &ns, t, 8, x).state, KVP_ROUTER_ROW_SCORED);
    ns = ns_none();
    t[7] = 5000;
    cr_assert_eq(score_of(r, &ns, t, 8, a).state, KVP_ROUTER_ROW_TOKEN);
    cr_assert_eq(score_of(r, &ns, t, 8, x).state, KVP_ROUTER_ROW_SCORED);
    kvp_router_free(r);
}

Test(router_keys, groups_hash_once_and_score_separately)
{
    kvp_router *r = router_new();
    kvp_config s4 = hash_cfg(KVP_HASH_VLLM_SHA256, 4), s8 = hash_cfg(KVP_HASH_VLLM_SHA256, 8);
    uint32_t a = add_worker(r, "a", 0, s4, NULL);
    uint32_t b = add_worker(r, "b", 0, s4, NULL);
    uint32_t c = add_worker(r, "c", 0, s8, NULL);
    kvp_router_worker_stats wa, wb, wc;
    cr_assert_eq(kvp_router_worker_stats_get(r, a, &wa), KVP_OK);
    cr_assert_eq(kvp_router_worker_stats_get(r, b, &wb), KVP_OK);
    cr_assert_eq(kvp_router_worker_stats_get(r, c, &wc), KVP_OK);
    cr_assert_eq(wa.group, wb.group);
    cr_assert_neq(wa.group, wc.group);
    uint32_t t[32];
    seq_tokens(t, 32, 1);
    kvp_namespace ns = ns_none();
    uint64_t k4[8], k8[4];
    keys_of(s4, &ns, t, 32, k4, 8);
    keys_of(s8, &ns, t, 32, k8, 4);
    kvp_kv_event e4 = ev_stored(k4, 8, t, 4, "GPU"), e8 = ev_stored(k8, 3, t, 8, "GPU");
    apply_expect(r, a, 0, &e4, 1, KVP_ROUTER_APPLIED);
    apply_expect(r, c, 0, &e8, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 32, a).n_blocks, 8);
    cr_assert_eq(score_of(r, &ns, t, 32, b).n_blocks, 0);
    kvp_router_row rc = score_of(r, &ns, t, 32, c);
    cr_assert_eq(rc.n_blocks, 3);
    cr_assert_eq(rc.n_tokens, 24, "tokens let callers compare block sizes");
    /* c's keys in a's group never count for a, even if a stored them. */
    kvp_kv_event mix = ev_stored(k8, 1, t, 4, "GPU");
    mix.n_tokens = 4;
    apply_expect(r, b, 0, &mix, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 32, b).n_blocks, 0);
    kvp_router_free(r);
}

Test(router_alloc, known_keys_take_no_new_slots)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 1);
    uint32_t a = add_worker(r, "a", 0, hc, NULL), b = add_worker(r, "b", 0, hc, NULL);
    uint32_t tok[1] = {0};
    uint64_t seq = 0, key = 1;
    /* Fill the table to its 90% limit exactly, one new key per batch. */
    do {
        kvp_kv_event e = ev_stored(&key, 1, tok, 1, "GPU");
        apply_expect(r, a, seq++, &e, 1, KVP_ROUTER_APPLIED);
        key++;
    } while ((uint64_t)r->ix.table.n_entries * 10 != (uint64_t)r->ix.table.cap * 9);
    uint32_t cap = r->ix.table.cap;
    /* Removing and storing again a key a holds alone, and b storing keys a holds, need no
     * slot: the table must not grow. */
    uint64_t k1 = 1, many[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    uint32_t toks[8] = {0};
    kvp_kv_event ev[2] = {ev_removed(&k1, 1, "GPU"), ev_stored(&k1, 1, tok, 1, "CPU")};
    apply_expect(r, a, seq++, ev, 2, KVP_ROUTER_APPLIED);
    kvp_kv_event eb = ev_stored(many, 8, toks, 1, "GPU");
    apply_expect(r, b, 0, &eb, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(r->ix.table.cap, cap, "the table grew for keys it holds");
    /* One new key does need a slot. */
    kvp_kv_event en = ev_stored(&key, 1, tok, 1, "GPU");
    apply_expect(r, b, 1, &en, 1, KVP_ROUTER_APPLIED);
    cr_assert_gt(r->ix.table.cap, cap);
    kvp_router_free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Memory                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/* n_blocks distinct blocks over 64 workers, each block held by `holders` of them. */
static kvp_router_stats memory_run(uint32_t n_blocks, uint32_t holders)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_SHA256, 16);
    uint32_t ids[64];
    char name[16];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "pod-%02d", i);
        ids[i] = add_worker(r, name, 0, hc, NULL);
    }
    uint64_t *h = malloc(256 * sizeof *h);
    uint32_t *tok = calloc(256 * 16, sizeof *tok);
    uint64_t seq[64] = {0}, state = 5;
    for (uint32_t done = 0; done < n_blocks; done += 256) {
        uint32_t n = n_blocks - done < 256 ? n_blocks - done : 256;
        for (uint32_t i = 0; i < n; i++)
            h[i] = th_rand(&state);
        uint32_t first = (uint32_t)(th_rand(&state) % 64);
        for (uint32_t j = 0; j < holders; j++) {
            uint32_t w = ids[(first + j * 7) % 64];
            kvp_kv_event e = ev_stored(h, n, tok, 16, "GPU");
            kvp_kv_batch b = batch_of(&e, 1, 1);
            kvp_router_apply_result res;
            cr_assert_eq(kvp_router_apply(r, w, seq[w]++, &b, &res), KVP_OK);
        }
    }
    CHECK(r);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_blocks, n_blocks);
    cr_assert_eq(st.n_holders, (uint64_t)n_blocks * holders);
    kvp_router_free(r);
    free(h);
    free(tok);
    return st;
}

Test(router_memory, bytes_per_holder_block_below_anchor)
{
    /* One holder per block is the worst case: the slot is not shared. */
    kvp_router_stats one = memory_run(200000, 1);
    cr_assert_lt(one.bytes_per_holder, 26.9, "1 holder: %.2f B per (block, worker)",
                 one.bytes_per_holder);
    cr_assert_lt(one.index_bytes, one.total_bytes);
    kvp_router_stats two = memory_run(100000, 2);
    cr_assert_lt(two.bytes_per_holder, 26.9 / 2, "2 holders: %.2f", two.bytes_per_holder);
    kvp_router_stats eight = memory_run(20000, 8);
    cr_assert_lt(eight.bytes_per_holder, 26.9 / 2, "8 holders (spill): %.2f",
                 eight.bytes_per_holder);
    printf("bytes per (block, worker): 1 holder %.2f, 2 holders %.2f, 8 holders %.2f\n",
           one.bytes_per_holder, two.bytes_per_holder, eight.bytes_per_holder);
}

/* ---------------------------------------------------------------------------------------- */
/* Reference model on random operations                                                     */
/* ---------------------------------------------------------------------------------------- */

#define RM_WORKERS 12
#define RM_PROMPTS 24
#define RM_TOKENS  64
#define RM_MAXKEYS 64 /* block size 1 in group C */
#define RM_NSV     2  /* namespace variants: none, salt "x" */

typedef struct rm_entry {
    uint64_t key;
    uint32_t mask; /* media bits: GPU 1, CPU 2, disk 4 */
} rm_entry;

typedef struct rm_worker {
    rm_entry *e;
    size_t n, cap;
    bool stale, seq_known;
    uint64_t expected;
    int group;
} rm_worker;

typedef struct rm {
    kvp_router *r;
    kvp_config hc[3];
    uint32_t id[RM_WORKERS];
    rm_worker w[RM_WORKERS];
    uint32_t tok[RM_PROMPTS][RM_TOKENS];
    uint64_t keys[3][RM_NSV][RM_PROMPTS][RM_MAXKEYS];
    size_t n_keys[3];
    kvp_namespace ns[RM_NSV];
    uint64_t rng;
    double ts;
} rm;

static rm_entry *rm_find(rm_worker *w, uint64_t key)
{
    for (size_t i = 0; i < w->n; i++) {
        if (w->e[i].key == key)
            return &w->e[i];
    }
    return NULL;
}

static void rm_store(rm_worker *w, uint64_t key, uint32_t bit)
{
    rm_entry *e = rm_find(w, key);
    if (e) {
        e->mask |= bit;
        return;
    }
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 16;
        w->e = realloc(w->e, w->cap * sizeof *w->e);
    }
    w->e[w->n++] = (rm_entry){key, bit};
}

static void rm_remove(rm_worker *w, uint64_t key, uint32_t bit)
{
    rm_entry *e = rm_find(w, key);
    if (!e)
        return;
    e->mask &= ~bit;
    if (e->mask == 0)
        *e = w->e[--w->n];
}

static double rm_weight(uint32_t mask)
{
    double best = 0;
    if (mask & 1)
        best = 1.0;
    else if (mask & 2)
        best = 0.8;
    else if (mask & 4)
        best = 0.5;
    return best;
}

static void rm_setup(rm *m)
{
    memset(m, 0, sizeof *m);
    m->r = router_new();
    m->rng = 2024;
    m->hc[0] = hash_cfg(KVP_HASH_VLLM_XXHASH, 4);
    m->hc[1] = hash_cfg(KVP_HASH_XXH3, 4);
    m->hc[2] = hash_cfg(KVP_HASH_VLLM_SHA256, 1);
    /* Eight workers in group A (so block sets spill), two each in B and C. */
    char name[16];
    for (int i = 0; i < RM_WORKERS; i++) {
        int g = i < 8 ? 0 : i < 10 ? 1 : 2;
        snprintf(name, sizeof name, "w%d", i);
        m->id[i] = add_worker(m->r, name, 0, m->hc[g], NULL);
        m->w[i].group = g;
        m->w[i].seq_known = true;
    }
    /* Prompts share prefixes: each starts with one of three stems cut at a random length. */
    uint32_t stems[3][RM_TOKENS];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < RM_TOKENS; i++)
            stems[s][i] = (uint32_t)(th_rand(&m->rng) % 1000);
    for (int p = 0; p < RM_PROMPTS; p++) {
        int s = p % 3;
        size_t cut = th_rand(&m->rng) % RM_TOKENS;
        for (size_t i = 0; i < RM_TOKENS; i++)
            m->tok[p][i] = i < cut ? stems[s][i] : (uint32_t)(th_rand(&m->rng) % 1000);
    }
    m->ns[0] = ns_none();
    th_ns(&m->ns[1], NULL, NULL, NULL, "x");
    for (int g = 0; g < 3; g++) {
        m->n_keys[g] = RM_TOKENS / m->hc[g].block_size;
        for (int v = 0; v < RM_NSV; v++)
            for (int p = 0; p < RM_PROMPTS; p++)
                keys_of(m->hc[g], &m->ns[v], m->tok[p], RM_TOKENS, m->keys[g][v][p], RM_MAXKEYS);
    }
}

static const char *rm_medium(uint64_t x, uint32_t *bit)
{
    static const char *names[] = {NULL, "GPU", "CPU", "disk"};
    static const uint32_t bits[] = {1, 1, 2, 4};
    *bit = bits[x % 4];
    return names[x % 4];
}

/* A random batch for worker i, applied to the router and the model. */
static void rm_batch(rm *m, int i)
{
    rm_worker *w = &m->w[i];
    int g = w->group;
    uint32_t bs = m->hc[g].block_size;
    kvp_kv_event ev[3];
    int n_ev = 1 + (int)(th_rand(&m->rng) % 3);
    uint32_t bits[3];
    for (int j = 0; j < n_ev; j++) {
        int p = (int)(th_rand(&m->rng) % RM_PROMPTS), v = (int)(th_rand(&m->rng) % RM_NSV);
        size_t nk = m->n_keys[g];
        size_t s = th_rand(&m->rng) % nk, len = 1 + th_rand(&m->rng) % (nk - s);
        if (th_rand(&m->rng) % 3 == 0)
            s = 0; /* prefixes from block 0 make runs */
        if (s + len > nk)
            len = nk - s;
        const char *med = rm_medium(th_rand(&m->rng), &bits[j]);
        uint64_t kind = th_rand(&m->rng) % 20;
        if (kind < 12)
            ev[j] = ev_stored(m->keys[g][v][p] + s, len, m->tok[p] + s * bs, bs, med);
        else if (kind < 19)
            ev[j] = ev_removed(m->keys[g][v][p] + s, len, med);
        else
            ev[j] = ev_cleared();
    }
    /* Sequence: mostly in order, sometimes a restart, duplicate or gap. */
    uint64_t seq = w->seq_known ? w->expected : 1000 + th_rand(&m->rng) % 50;
    uint64_t pick = th_rand(&m->rng) % 40;
    if (pick == 0)
        seq = 0;
    else if (pick == 1 && w->seq_known && w->expected > 0)
        seq = w->expected - 1;
    else if (pick == 2)
        seq += 2;
    m->ts += 1;
    kvp_kv_batch b = batch_of(ev, (size_t)n_ev, m->ts);
    kvp_router_apply_result res;
    cr_assert_eq(kvp_router_apply(m->r, m->id[i], seq, &b, &res), KVP_OK);
    int expect;
    if (!w->seq_known || seq == w->expected)
        expect = KVP_ROUTER_APPLIED;
    else if (seq == 0)
        expect = KVP_ROUTER_RESTARTED; /* ts always differs here */
    else
        expect = seq < w->expected ? KVP_ROUTER_DUPLICATE : KVP_ROUTER_GAP;
    cr_assert_eq(res.status, expect, "worker %d seq %llu", i, (unsigned long long)seq);
    if (expect == KVP_ROUTER_DUPLICATE || expect == KVP_ROUTER_GAP)
        return;
    bool exact = seq == 0;
    if (expect == KVP_ROUTER_RESTARTED)
        w->n = 0;
    for (int j = 0; j < n_ev; j++) {
        for (size_t k = 0; k < ev[j].n_hashes; k++) {
            if (ev[j].type == KVP_EVENT_STORED)
                rm_store(w, ev[j].hashes[k], bits[j]);
            else
                rm_remove(w, ev[j].hashes[k], bits[j]);
        }
        if (ev[j].type == KVP_EVENT_CLEARED) {
            w->n = 0;
            exact = true;
        }
    }
    if (exact)
        w->stale = false;
    w->seq_known = true;
    w->expected = seq + 1;
    cr_assert_eq(res.stale, w->stale);
}

static void rm_compare(rm *m)
{
    CHECK(m->r);
    uint64_t holders = 0, holder_media = 0;
    for (int i = 0; i < RM_WORKERS; i++) {
        kvp_router_worker_stats ws;
        cr_assert_eq(kvp_router_worker_stats_get(m->r, m->id[i], &ws), KVP_OK);
        cr_assert_eq(ws.n_blocks, m->w[i].n, "worker %d holds %llu, model %zu", i,
                     (unsigned long long)ws.n_blocks, m->w[i].n);
        cr_assert_eq(ws.stale, m->w[i].stale);
        holders += m->w[i].n;
        for (size_t k = 0; k < m->w[i].n; k++)
            holder_media += (uint64_t)__builtin_popcount(m->w[i].e[k].mask);
    }
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(m->r, &st), KVP_OK);
    cr_assert_eq(st.n_holders, holders);
    cr_assert_eq(st.n_holder_media, holder_media);
    for (int q = 0; q < 3; q++) {
        int p = (int)(th_rand(&m->rng) % RM_PROMPTS), v = (int)(th_rand(&m->rng) % RM_NSV);
        kvp_router_row rows[RM_WORKERS];
        size_t n = 0;
        cr_assert_eq(kvp_router_score(m->r, &m->ns[v], m->tok[p], RM_TOKENS, rows, RM_WORKERS, &n),
                     KVP_OK);
        cr_assert_eq(n, RM_WORKERS);
        for (int i = 0; i < RM_WORKERS; i++) {
            rm_worker *w = &m->w[i];
            const uint64_t *k = m->keys[w->group][v][p];
            uint32_t run = 0;
            double score = 0;
            while (!w->stale && run < m->n_keys[w->group]) {
                rm_entry *e = rm_find(w, k[run]);
                if (!e)
                    break;
                score += rm_weight(e->mask);
                run++;
            }
            cr_assert_eq(rows[i].worker, m->id[i]);
            cr_assert_eq(rows[i].state, w->stale ? KVP_ROUTER_ROW_STALE : KVP_ROUTER_ROW_SCORED);
            cr_assert_eq(rows[i].n_blocks, run, "worker %d prompt %d ns %d: %u, model %u", i, p, v,
                         rows[i].n_blocks, run);
            cr_assert_float_eq(rows[i].score, score, 1e-9);
        }
    }
}

Test(router_model, random_operations_match_reference, .timeout = 240)
{
    rm *m = calloc(1, sizeof *m);
    rm_setup(m);
    for (int step = 0; step < 6000; step++) {
        int i = (int)(th_rand(&m->rng) % RM_WORKERS);
        uint64_t op = th_rand(&m->rng) % 100;
        if (op < 2) {
            cr_assert_eq(kvp_router_mark_stale(m->r, m->id[i]), KVP_OK);
            m->w[i].n = 0;
            m->w[i].stale = true;
            m->w[i].seq_known = false;
        } else if (op < 4) {
            cr_assert_eq(kvp_router_resync(m->r, m->id[i]), KVP_OK);
            m->w[i].stale = false;
        } else {
            rm_batch(m, i);
        }
        if (step % 10 == 0)
            rm_compare(m);
    }
    rm_compare(m);
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(m->r, &st), KVP_OK);
    cr_assert_gt(st.n_restarts, 0);
    cr_assert_gt(st.n_gaps, 0);
    cr_assert_gt(st.n_duplicates, 0);
    cr_assert_gt(m->r->ix.table.arenas[0].n_records + m->r->ix.table.arenas[1].n_records, 0,
                 "holder sets went through spill storage");
    kvp_router_free(m->r);
    for (int i = 0; i < RM_WORKERS; i++)
        free(m->w[i].e);
    free(m);
}

/* ---------------------------------------------------------------------------------------- */
/* The checker catches each kind of corruption                                              */
/* ---------------------------------------------------------------------------------------- */

/* A router with 6 workers over 40 blocks: inline and spill sets. */
static kvp_router *corruptible(void)
{
    kvp_router *r = router_new();
    kvp_config hc = hash_cfg(KVP_HASH_VLLM_XXHASH, 1);
    uint64_t k[40];
    uint32_t t[40];
    seq_tokens(t, 40, 1);
    for (int i = 0; i < 40; i++)
        k[i] = (uint64_t)i * 0x9e3779b97f4a7c15u + 1;
    char name[8];
    for (int w = 0; w < 6; w++) {
        snprintf(name, sizeof name, "w%d", w);
        uint32_t id = add_worker(r, name, 0, hc, NULL);
        size_t n = w < 2 ? 40 : w < 4 ? 20 : 10;
        kvp_kv_event e = ev_stored(k, n, t, 1, w % 2 ? "CPU" : "GPU");
        apply_expect(r, id, 0, &e, 1, KVP_ROUTER_APPLIED);
    }
    return r;
}

/* First live slot whose holder set is spill (want_spill) or inline. */
static uint32_t slot_where(kvp_router *r, bool want_spill)
{
    for (uint32_t i = 0; i < r->ix.table.cap; i++) {
        uint64_t hv = r->ix.table.slots[i].hv;
        if (hv != 0 && kvp__rt_hv_is_spill(hv) == want_spill)
            return i;
    }
    cr_assert_fail("no such slot");
    return 0;
}

Test(router_check, catches_each_corruption)
{
    kvp_router *r = corruptible();
    uint32_t s = slot_where(r, false);
    kvp__rt_slot saved = r->ix.table.slots[s];

    r->ix.table.slots[s].key ^= 0x5555; /* 1: a key away from its probe position */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "misplaced key");
    r->ix.table.slots[s] = saved;

    r->ix.table.slots[s].hv &= ~(uint64_t)0x3f; /* 2: an inline holder with no media */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "empty media mask");
    r->ix.table.slots[s] = saved;

    r->ix.table.slots[s].hv |= (uint64_t)0x20; /* 3: an unregistered medium (bit 5) */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "unregistered medium");
    r->ix.table.slots[s] = saved;

    r->ix.table.slots[s].hv = (r->ix.table.slots[s].hv & ~(uint64_t)(0x7fffu << 6)) | (30u << 6);
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "holder names no live worker");
    r->ix.table.slots[s] = saved;

    uint32_t sp = slot_where(r, true);
    kvp__rt_slot ssaved = r->ix.table.slots[sp];
    r->ix.table.slots[sp].hv += UINT64_C(1) << 32; /* 4: spill count off by one */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "spill count");
    r->ix.table.slots[sp] = ssaved;

    uint32_t sp2 = sp + 1;
    while (!kvp__rt_hv_is_spill(r->ix.table.slots[sp2 % r->ix.table.cap].hv))
        sp2++;
    kvp__rt_slot s2saved = r->ix.table.slots[sp2 % r->ix.table.cap];
    r->ix.table.slots[sp2 % r->ix.table.cap].hv = ssaved.hv; /* 5: two slots, one record */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "shared spill record");
    r->ix.table.slots[sp2 % r->ix.table.cap] = s2saved;

    r->ix.workers[0].n_blocks++; /* 6: a worker's block count */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "worker count");
    r->ix.workers[0].n_blocks--;

    r->ix.table.n_holders++; /* 7: totals */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "holder total");
    r->ix.table.n_holders--;

    r->ix.workers[1].row = 5; /* 8: rows */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "row numbering");
    r->ix.workers[1].row = 1;

    r->ix.weight_of_mask[3] = 0.3; /* 9: tier weights */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "weight table");
    r->ix.weight_of_mask[3] = 1.0;

    uint32_t cls = (uint32_t)(ssaved.hv >> 48) & 0x1f; /* 10: a named record on the free list */
    uint32_t fh = r->ix.table.arenas[cls].free_head;
    r->ix.table.arenas[cls].free_head = (uint32_t)ssaved.hv;
    r->ix.table.arenas[cls].n_free++;
    uint32_t *w0 = r->ix.table.arenas[cls].words + (size_t)(uint32_t)ssaved.hv * (4u << cls);
    uint32_t w0saved = *w0;
    *w0 = KVP__RT_NIL;
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "record both named and free");
    *w0 = w0saved;
    r->ix.table.arenas[cls].free_head = fh;
    r->ix.table.arenas[cls].n_free--;

    static char stray[] = "w2"; /* 11: a worker's engine id that is not interned */
    const char *id2 = r->ix.workers[2].engine_id;
    r->ix.workers[2].engine_id = stray;
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "engine id outside names[]");
    r->ix.workers[2].engine_id = id2;

    static char dup[] = "w0"; /* 12: one engine id interned twice */
    kvp__rt_name nm1 = r->ix.names[1];
    r->ix.names[1] = (kvp__rt_name){dup, 2};
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "a name interned twice");
    r->ix.names[1] = nm1;

    CHECK(r);
    kvp_router_free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Token mode: the router's own keys from the events' token_ids                             */
/* ---------------------------------------------------------------------------------------- */

#ifndef KVP_TEST_REDIS /* the shared store keeps engine hashes: token mode is local only */

#define TK_BS     16u   /* block size of the test engines */
#define TK_MAX_EV 8192u /* cache events recorded between two batches */

/* An engine: a kvp_cache whose events become vLLM-style batches for one router worker, one
 * BlockStored per block (parent linked), as a publisher sends them. */
typedef struct tk_engine {
    kvp_cache *cache;
    uint32_t id;  /* the router's worker */
    uint64_t seq; /* next batch number */
    size_t n;     /* events recorded since the last batch */
    int type[TK_MAX_EV];
    bool root[TK_MAX_EV];
    uint64_t key[TK_MAX_EV], parent[TK_MAX_EV];
    uint32_t tok[TK_MAX_EV][TK_BS];
} tk_engine;

static void tk_engine_fn(void *ud, const kvp_event *ev)
{
    tk_engine *e = ud;
    cr_assert_lt(e->n, TK_MAX_EV);
    size_t i = e->n++;
    e->type[i] = ev->type;
    e->root[i] = ev->parent_is_root;
    e->key[i] = ev->key.lo;
    e->parent[i] = ev->parent.lo;
    if (ev->type == KVP_EVENT_STORED) {
        cr_assert(ev->tokens && ev->n_tokens == TK_BS);
        memcpy(e->tok[i], ev->tokens, sizeof e->tok[i]);
    }
}

static tk_engine *tk_engine_new(kvp_router *r, const char *name, kvp_config c, uint32_t n_blocks)
{
    tk_engine *e = calloc(1, sizeof *e);
    cr_assert(e);
    c.n_blocks = n_blocks;
    c.block_size = TK_BS;
    c.on_event = tk_engine_fn;
    c.event_ud = e;
    cr_assert_eq(kvp_cache_new(&c, &e->cache), KVP_OK);
    /* The router knows nothing of the engine's hash: only its block size. */
    e->id = add_worker(r, name, 0, hash_cfg(KVP_HASH_XXH3, TK_BS), NULL);
    return e;
}

static void tk_engine_free(tk_engine *e)
{
    kvp_cache_free(e->cache);
    free(e);
}

/* Send what the engine recorded as one batch (STORED runs ordered parent first). */
static void tk_engine_flush(kvp_router *r, tk_engine *e)
{
    kvp_kv_event *ev = calloc(e->n + 1, sizeof *ev);
    bool *done = calloc(e->n + 1, sizeof *done);
    size_t n_ev = 0;
    for (size_t i = 0; i < e->n;) {
        if (e->type[i] == KVP_EVENT_REMOVED) {
            ev[n_ev++] = ev_removed(&e->key[i], 1, "GPU");
            i++;
            continue;
        }
        if (e->type[i] == KVP_EVENT_CLEARED) {
            ev[n_ev++] = ev_cleared();
            i++;
            continue;
        }
        size_t end = i;
        while (end < e->n && e->type[end] == KVP_EVENT_STORED)
            end++;
        for (size_t left = end - i; left > 0;) {
            for (size_t k = i; k < end; k++) {
                bool ready = !done[k];
                for (size_t p = i; ready && !e->root[k] && p < end; p++)
                    ready = done[p] || e->key[p] != e->parent[k];
                if (!ready)
                    continue;
                kvp_kv_event s = ev_stored(&e->key[k], 1, e->tok[k], TK_BS, "GPU");
                s.has_parent = !e->root[k];
                s.parent = e->parent[k];
                ev[n_ev++] = s;
                done[k] = true;
                left--;
            }
        }
        i = end;
    }
    apply_expect(r, e->id, e->seq, ev, n_ev, e->seq == 0 ? KVP_ROUTER_APPLIED : KVP_ROUTER_APPLIED);
    e->seq++;
    e->n = 0;
    free(ev);
    free(done);
}

static void tk_access(kvp_router *r, tk_engine *e, const uint32_t *t, size_t n)
{
    kvp_namespace ns = ns_none();
    kvp_match m;
    cr_assert_eq(kvp_access(e->cache, &ns, t, n, &m), KVP_OK);
    tk_engine_flush(r, e);
}

/* The router's row for engine e equals the engine's own lookup of t. */
static void tk_expect_exact(kvp_router *r, tk_engine *e, const uint32_t *t, size_t n,
                            const char *what)
{
    kvp_namespace ns = ns_none();
    kvp_match m;
    cr_assert_eq(kvp_lookup(e->cache, &ns, t, n, NULL, 0, &m), KVP_OK);
    kvp_router_row row = score_of(r, &ns, t, n, e->id);
    cr_assert_eq(row.state, KVP_ROUTER_ROW_SCORED);
    cr_assert_eq(row.n_blocks, m.n_blocks_cached, "%s: router %u blocks, engine %u", what,
                 row.n_blocks, m.n_blocks_cached);
}

static kvp_router *tk_router(void)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.index_by = KVP_ROUTER_INDEX_TOKENS;
    return router_new_with(&cfg);
}

/* A prompt: a shared prefix (one of four) and a random tail. */
static size_t tk_prompt(uint32_t *t, uint64_t *rng, int prefix, size_t n_blocks)
{
    size_t n = n_blocks * TK_BS + (size_t)(th_rand(rng) % TK_BS);
    for (size_t i = 0; i < n; i++)
        t[i] =
            i < 2 * TK_BS ? (uint32_t)(prefix * 1000 + (int)i) : (uint32_t)(th_rand(rng) % 50000);
    return n;
}

Test(router_tokens, fleet_of_hash_profiles_and_random_roots_scores_exactly)
{
    kvp_router *r = tk_router();
    uint64_t rng = (uint64_t)time(NULL) * 2654435761u + 1;
    char seed_a[32], seed_b[32];
    snprintf(seed_a, sizeof seed_a, "%016llx", (unsigned long long)th_rand(&rng));
    snprintf(seed_b, sizeof seed_b, "%016llx", (unsigned long long)th_rand(&rng));
    kvp_config ca = hash_cfg(KVP_HASH_VLLM_SHA256, TK_BS),
               cb = hash_cfg(KVP_HASH_VLLM_XXHASH, TK_BS);
    ca.vllm_seed = seed_a; /* vLLM without PYTHONHASHSEED: a NONE_HASH of its own */
    cb.vllm_seed = seed_b;
    kvp_config cc = hash_cfg(KVP_HASH_KEYED, TK_BS); /* a random key nobody else knows */
    kvp_config cd = hash_cfg(KVP_HASH_XXH3, TK_BS);
    cd.seed = th_rand(&rng);
    tk_engine *e[4] = {tk_engine_new(r, "vllm-sha", ca, 4096),
                       tk_engine_new(r, "vllm-xx", cb, 4096), tk_engine_new(r, "keyed", cc, 4096),
                       tk_engine_new(r, "xxh3", cd, 4096)};
    static uint32_t p[24][16 * 12];
    size_t n[24];
    for (int i = 0; i < 24; i++)
        n[i] = tk_prompt(p[i], &rng, i % 4, 3 + (size_t)(th_rand(&rng) % 8));
    /* Each engine serves a different mix: prompt i on engines i % 4 and (i + 1) % 4, and a
     * prefix-only copy on (i + 2) % 4. */
    for (int i = 0; i < 24; i++) {
        tk_access(r, e[i % 4], p[i], n[i]);
        tk_access(r, e[(i + 1) % 4], p[i], n[i]);
        tk_access(r, e[(i + 2) % 4], p[i], 2 * TK_BS + 3);
    }
    for (int i = 0; i < 24; i++) {
        for (int k = 0; k < 4; k++)
            tk_expect_exact(r, e[k], p[i], n[i], "fleet");
    }
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(st.n_groups, 1, "one hash group for the whole fleet");
    kvp_router_token_stats ts;
    cr_assert_eq(kvp_router_token_stats_get(r, KVP_ROUTER_ALL_WORKERS, &ts), KVP_OK);
    cr_assert_eq(ts.n_unresolved, 0);
    cr_assert_eq(ts.n_unkeyable, 0);
    cr_assert_eq(ts.n_map_entries, st.n_holders, "one entry per (block, worker) here");
    CHECK(r);
    for (int k = 0; k < 4; k++)
        tk_engine_free(e[k]);
    kvp_router_free(r);
}

Test(router_tokens, evictions_and_reset_through_the_map)
{
    kvp_router *r = tk_router();
    uint64_t rng = 99;
    kvp_config ca = hash_cfg(KVP_HASH_VLLM_SHA256, TK_BS);
    ca.vllm_seed = "per-process-random";
    tk_engine *e = tk_engine_new(r, "small", ca, 40); /* 40 blocks: evictions galore */
    static uint32_t p[40][16 * 8];
    size_t n[40];
    for (int i = 0; i < 40; i++)
        n[i] = tk_prompt(p[i], &rng, i % 3, 2 + (size_t)(th_rand(&rng) % 6));
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 40; i++) {
            tk_access(r, e, p[(i * 7 + round) % 40], n[(i * 7 + round) % 40]);
            for (int j = 0; j < 40; j += 3)
                tk_expect_exact(r, e, p[j], n[j], "after an eviction");
        }
    }
    kvp_router_token_stats ts;
    cr_assert_eq(kvp_router_token_stats_get(r, e->id, &ts), KVP_OK);
    cr_assert_eq(ts.n_unresolved, 0);
    cr_assert_gt(ts.n_map_entries, 0);
    cr_assert_eq(kvp_cache_reset(e->cache), KVP_OK); /* REMOVED each, then CLEARED */
    tk_engine_flush(r, e);
    cr_assert_eq(kvp_router_token_stats_get(r, e->id, &ts), KVP_OK);
    cr_assert_eq(ts.n_map_entries, 0, "AllBlocksCleared empties the map");
    for (int j = 0; j < 40; j++)
        tk_expect_exact(r, e, p[j], n[j], "after the reset");
    /* The engine goes on after the reset, its keys resolve again. */
    tk_access(r, e, p[5], n[5]);
    tk_expect_exact(r, e, p[5], n[5], "after the reset, stored again");
    tk_engine_free(e);
    kvp_router_free(r);
}

/* By hand: block size 4, own keys shared by two engine hashes (another cache_salt, which
 * events do not carry), media, re-pointed hashes, unknown parents and removals. */
Test(router_tokens, shared_own_keys_media_and_unresolved_parents)
{
    kvp_router *r = tk_router();
    uint32_t a = add_worker(r, "a", 0, hash_cfg(KVP_HASH_VLLM_SHA256, 4), NULL);
    uint32_t t[8], u[8];
    seq_tokens(t, 8, 100);
    seq_tokens(u, 8, 500);
    kvp_namespace ns = ns_none();
    uint64_t h1[2] = {11, 12}, h2[2] = {21, 22};
    kvp_kv_event e1[2] = {ev_stored(h1, 1, t, 4, "GPU"), ev_stored(h1 + 1, 1, t + 4, 4, "GPU")};
    e1[1].has_parent = true;
    e1[1].parent = 11;
    apply_expect(r, a, 0, e1, 2, KVP_ROUTER_APPLIED);
    kvp_kv_event e2 = ev_stored(h2, 2, t, 4, NULL); /* same tokens, other engine hashes */
    apply_expect(r, a, 1, &e2, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 2);
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_router_worker_stats_get(r, a, &ws), KVP_OK);
    cr_assert_eq(ws.n_blocks, 2);
    kvp_router_token_stats ts;
    cr_assert_eq(kvp_router_token_stats_get(r, a, &ts), KVP_OK);
    cr_assert_eq(ts.n_map_entries, 4);
    kvp_kv_event rm1 = ev_removed(h1, 2, NULL);
    apply_expect(r, a, 2, &rm1, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 2, "h2 still holds the blocks");
    kvp_kv_event rm2 = ev_removed(h2, 1, "GPU");
    apply_expect(r, a, 3, &rm2, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 0, "block 0 gone with its last hash");
    /* Tiers: one engine hash in GPU and CPU; removing GPU leaves CPU's weight. */
    uint64_t h3 = 31;
    kvp_kv_event s3[2] = {ev_stored(&h3, 1, u, 4, "GPU"), ev_stored(&h3, 1, u, 4, "CPU")};
    apply_expect(r, a, 4, s3, 2, KVP_ROUTER_APPLIED);
    kvp_kv_event r3 = ev_removed(&h3, 1, "GPU");
    apply_expect(r, a, 5, &r3, 1, KVP_ROUTER_APPLIED);
    kvp_router_row row = score_of(r, &ns, u, 8, a);
    cr_assert_eq(row.n_blocks, 1);
    cr_assert_float_eq(row.score, 0.8, 1e-9);
    /* The engine reuses hash 31 for other tokens: the map follows. */
    kvp_kv_event s4 = ev_stored(&h3, 1, t, 4, "GPU");
    apply_expect(r, a, 6, &s4, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, u, 8, a).n_blocks, 0);
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 2, "block 1 of t was still held (h2)");
    /* A child of a block never seen: not indexed, counted; its removal is unknown. */
    uint64_t h5 = 55;
    kvp_kv_event s5 = ev_stored(&h5, 1, u + 4, 4, "GPU");
    s5.has_parent = true;
    s5.parent = 4242;
    apply_expect(r, a, 7, &s5, 1, KVP_ROUTER_APPLIED);
    kvp_kv_event r5 = ev_removed(&h5, 1, "GPU");
    apply_expect(r, a, 8, &r5, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(kvp_router_token_stats_get(r, a, &ts), KVP_OK);
    cr_assert_eq(ts.n_unresolved, 1);
    cr_assert_eq(ts.n_unknown_removed, 1);
    /* A restart (batch 0 again) clears the map: a parent from before does not resolve. */
    kvp_kv_event s6 = ev_stored(&h5, 1, t + 4, 4, "GPU");
    s6.has_parent = true;
    s6.parent = 31;
    apply_expect(r, a, 0, &s6, 1, KVP_ROUTER_RESTARTED);
    cr_assert_eq(kvp_router_token_stats_get(r, a, &ts), KVP_OK);
    cr_assert_eq(ts.n_unresolved, 2);
    cr_assert_eq(ts.n_map_entries, 0);
    kvp_router_free(r);
}

Test(router_tokens, what_events_omit_is_not_scored)
{
    kvp_router *r = tk_router();
    uint32_t a = add_worker(r, "a", 0, hash_cfg(KVP_HASH_VLLM_SHA256, 4), "llama");
    uint32_t t[8];
    seq_tokens(t, 8, 7);
    uint64_t h[2] = {1, 2}, g[2] = {3, 4}, l[2] = {5, 6}, d[2] = {7, 8};
    /* extra_keys: [["salt"], nil] is not indexed; [nil, nil] is. */
    static const uint8_t salted[] = {0x92, 0x91, 0xa4, 's', 'a', 'l', 't', 0xc0};
    static const uint8_t nils[] = {0x92, 0xc0, 0xc0};
    kvp_kv_event e = ev_stored(h, 2, t, 4, NULL);
    e.extra_keys = salted;
    e.extra_keys_bytes = sizeof salted;
    apply_expect(r, a, 0, &e, 1, KVP_ROUTER_APPLIED);
    kvp_namespace ns = ns_none();
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 0);
    e = ev_stored(g, 2, t, 4, NULL);
    e.extra_keys = nils;
    e.extra_keys_bytes = sizeof nils;
    apply_expect(r, a, 1, &e, 1, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_of(r, &ns, t, 8, a).n_blocks, 2);
    /* A request with a salt or a tenant: the router cannot tell, it says so. */
    kvp_namespace req;
    th_ns(&req, NULL, NULL, NULL, "s");
    kvp_router_row row = score_of(r, &req, t, 8, a);
    cr_assert_eq(row.state, KVP_ROUTER_ROW_NOTSUP);
    cr_assert_eq(row.n_blocks, 0);
    th_ns(&req, NULL, NULL, "tenant", NULL);
    cr_assert_eq(score_of(r, &req, t, 8, a).state, KVP_ROUTER_ROW_NOTSUP);
    /* LoRA by name: scored under the adapter, not without it; a bare lora_id is not. */
    uint32_t u[8];
    seq_tokens(u, 8, 900);
    e = ev_stored(l, 2, u, 4, NULL);
    e.lora_name = "ad-1";
    apply_expect(r, a, 2, &e, 1, KVP_ROUTER_APPLIED);
    th_ns(&req, NULL, "ad-1", NULL, NULL);
    cr_assert_eq(score_of(r, &req, u, 8, a).n_blocks, 2);
    cr_assert_eq(score_of(r, &ns, u, 8, a).n_blocks, 0);
    th_ns(&req, "llama", "ad-1", NULL, NULL);
    cr_assert_eq(score_of(r, &req, u, 8, a).n_blocks, 2, "the worker's model, named");
    th_ns(&req, "mistral", "ad-1", NULL, NULL);
    cr_assert_eq(score_of(r, &req, u, 8, a).state, KVP_ROUTER_ROW_MODEL);
    e = ev_stored(d, 2, t, 4, NULL);
    e.has_lora_id = true;
    e.lora_id = 3;
    apply_expect(r, a, 3, &e, 1, KVP_ROUTER_APPLIED);
    kvp_router_token_stats ts;
    cr_assert_eq(kvp_router_token_stats_get(r, a, &ts), KVP_OK);
    cr_assert_eq(ts.n_unkeyable, 4);
    cr_assert_eq(ts.n_keyed, 4);
    kvp_router_free(r);
}

Test(router_tokens, config_and_api_errors)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cr_assert_eq(cfg.index_by, KVP_ROUTER_INDEX_ENGINE_HASH);
    cr_assert_eq(cfg.token_hash.hash_profile, KVP_HASH_XXH3);
    kvp_router *r = NULL;
    cfg.index_by = 7;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    cfg.index_by = KVP_ROUTER_INDEX_TOKENS;
    cfg.token_hash.hash_profile = KVP_HASH_VLLM_SHA256;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    cfg.token_hash.hash_profile = KVP_HASH_KEYED;
    cfg.token_hash.hash_key_len = 3;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    cfg.token_hash.hash_key_len = 0; /* a key of this router's own */
    cfg.redis.url = "127.0.0.1:1";
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_ENOTSUP);
    cfg.redis.url = NULL;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_OK);
    /* A keyed engine needs no key in token mode. */
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = "k";
    wc.hash.hash_profile = KVP_HASH_KEYED;
    uint32_t id;
    cr_assert_eq(kvp_router_worker_add(r, &wc, &id), KVP_OK);
    kvp_router_token_stats ts;
    cr_assert_eq(kvp_router_token_stats_get(r, id + 1, &ts), KVP_ENOENT);
    cr_assert_eq(kvp_router_token_stats_get(NULL, id, &ts), KVP_EINVAL);
    cr_assert_eq(kvp_router_token_stats_get(r, id, NULL), KVP_EINVAL);
    kvp_router_key_check kc;
    kvp_kv_batch b = batch_of(NULL, 0, 0);
    cr_assert_eq(kvp_router_check_keys(r, id, &b, &kc), KVP_OK);
    cr_assert_eq(kc.n_checked, 0, "token mode checks nothing");
    cr_assert_eq(kvp_router_check_keys(r, id + 1, &b, &kc), KVP_ENOENT);
    cr_assert_eq(kvp_router_check_keys(r, id, NULL, &kc), KVP_EINVAL);
    CHECK(r);
    kvp_router_free(r);
}

Test(router_tokens, every_failure_leaves_the_index_unchanged)
{
    th_alloc al;
    th_alloc_init(&al);
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.index_by = KVP_ROUTER_INDEX_TOKENS;
    cfg.alloc = th_alloc_hooks(&al);
    kvp_router *r = router_new_with(&cfg);
    uint32_t w = add_worker(r, "w", 0, hash_cfg(KVP_HASH_VLLM_SHA256, 2), NULL);
    uint32_t t[400];
    seq_tokens(t, 400, 3);
    uint64_t h[200], g[200];
    for (int i = 0; i < 200; i++) {
        h[i] = 1000 + (uint64_t)i;
        g[i] = 5000 + (uint64_t)i;
    }
    kvp_kv_event e0 = ev_stored(h, 100, t, 2, "GPU");
    apply_expect(r, w, 0, &e0, 1, KVP_ROUTER_APPLIED);
    /* New hashes continuing the chain, a second hash set for shared own keys, a new medium. */
    kvp_kv_event e[3] = {ev_stored(h + 100, 100, t + 200, 2, "GPU"), ev_stored(g, 150, t, 2, "GPU"),
                         ev_stored(h, 50, t, 2, "SSD")};
    e[0].has_parent = true;
    e[0].parent = h[99];
    kvp_kv_batch b = batch_of(e, 3, 1);
    kvp_namespace ns = ns_none();
    kvp_router_row before[1], rows[1];
    size_t n = 0;
    cr_assert_eq(kvp_router_score(r, &ns, t, 400, before, 1, &n), KVP_OK);
    kvp_router_token_stats ts0, ts;
    cr_assert_eq(kvp_router_token_stats_get(r, w, &ts0), KVP_OK);
    int n_failures = 0;
    for (int64_t at = 0;; at++) {
        th_alloc_arm(&al, at);
        kvp_router_apply_result res;
        int rc = kvp_router_apply(r, w, 1, &b, &res);
        th_alloc_arm(&al, -1);
        CHECK(r);
        if (rc == KVP_OK)
            break;
        cr_assert_eq(rc, KVP_ENOMEM);
        n_failures++;
        cr_assert_eq(kvp_router_score(r, &ns, t, 400, rows, 1, &n), KVP_OK);
        cr_assert_eq(memcmp(rows, before, sizeof rows), 0, "scores moved at %lld", (long long)at);
        cr_assert_eq(kvp_router_token_stats_get(r, w, &ts), KVP_OK);
        cr_assert_eq(ts.n_map_entries, ts0.n_map_entries);
    }
    cr_assert_gt(n_failures, 3, "scratch, maps, table");
    cr_assert_eq(score_of(r, &ns, t, 400, w).n_blocks, 200);
    cr_assert_eq(kvp_router_token_stats_get(r, w, &ts), KVP_OK);
    cr_assert_eq(ts.n_map_entries, 350);
    kvp_router_free(r);
    cr_assert_eq(al.n_live, 0, "leak");
    cr_assert_eq(al.n_bad_frees, 0);
}

Test(router_tokens, checker_catches_each_map_corruption)
{
    kvp_router *r = tk_router();
    uint32_t a = add_worker(r, "a", 0, hash_cfg(KVP_HASH_VLLM_SHA256, 4), NULL);
    uint32_t t[400];
    seq_tokens(t, 400, 1);
    uint64_t h[100], g[2] = {9001, 9002};
    for (int i = 0; i < 100; i++)
        h[i] = 100 + (uint64_t)i;
    kvp_kv_event e[2] = {ev_stored(h, 100, t, 4, "GPU"), ev_stored(g, 2, t, 4, "CPU")};
    apply_expect(r, a, 0, e, 2, KVP_ROUTER_APPLIED);
    kvp__rt_worker *w = &r->ix.workers[a];
    cr_assert_eq(w->refs.n, 2);
    uint32_t s = 0;
    while (w->tmap.e[s].mask == 0 || kvp__rt_tmap_find(&w->refs, w->tmap.e[s].own_lo))
        s++;
    kvp__rt_tentry saved = w->tmap.e[s];

    w->tmap.e[s].own_lo ^= 1; /* 1: an entry naming an own key the worker does not hold */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "own key not held");
    w->tmap.e[s] = saved;

    w->tmap.e[s].mask |= 2; /* 2: an entry in a medium the table does not have */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "entry media");
    w->tmap.e[s] = saved;

    w->tmap.e[s].key ^= 0x5555; /* 3: an engine hash away from its probe position */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "misplaced entry");
    w->tmap.e[s] = saved;

    w->tmap.n++; /* 4: the entry count */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "entry count");
    w->tmap.n--;

    uint32_t q = 0;
    while (w->refs.e[q].mask == 0)
        q++;
    w->refs.e[q].aux++; /* 5: a reference count */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "reference count");
    w->refs.e[q].aux--;

    w->n_blocks++; /* 6: blocks against distinct own keys */
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "block count");
    w->n_blocks--;

    kvp__rt_tentry rs = w->refs.e[q]; /* 7: a shared own key without its reference entry */
    kvp__rt_tmap_delete(&w->refs, rs.key);
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "missing reference entry");
    kvp__rt_tmap_insert(&w->refs, &rs);

    bool saved_mode = r->ix.by_tokens; /* 8: maps in an engine-hash index */
    r->ix.by_tokens = false;
    cr_assert_eq(kvp_router_check(r), KVP_ECORRUPT, "maps in engine-hash mode");
    r->ix.by_tokens = saved_mode;

    CHECK(r);
    kvp_router_free(r);
}

Test(router_tokens, map_memory_per_block_and_worker)
{
    kvp_router *r = tk_router();
    uint32_t a = add_worker(r, "a", 0, hash_cfg(KVP_HASH_VLLM_SHA256, 4), NULL);
    enum { N = 200000 };
    uint32_t *t = malloc(N * 4 * sizeof *t);
    uint64_t *h = malloc(N * sizeof *h);
    for (size_t i = 0; i < (size_t)N * 4; i++)
        t[i] = (uint32_t)i;
    for (size_t i = 0; i < N; i++)
        h[i] = 0x9e3779b97f4a7c15u * (i + 1);
    kvp_router_stats st0;
    cr_assert_eq(kvp_router_stats_get(r, &st0), KVP_OK);
    kvp_kv_event e = ev_stored(h, N, t, 4, "GPU");
    apply_expect(r, a, 0, &e, 1, KVP_ROUTER_APPLIED);
    kvp_router_stats st;
    kvp_router_token_stats ts;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    cr_assert_eq(kvp_router_token_stats_get(r, a, &ts), KVP_OK);
    cr_assert_eq(ts.n_map_entries, N);
    double map_pair = (double)ts.map_bytes / (double)ts.n_map_entries;
    double all_pair = (double)(st.total_bytes - st0.total_bytes) / (double)st.n_holders;
    printf("token mode, %d blocks on one worker: map %.2f B per (block, worker), "
           "index + map %.2f B\n",
           N, map_pair, all_pair);
    cr_assert_leq(map_pair, 53.4, "the map stays between 60%% and 90%% full");
    cr_assert_geq(map_pair, 35.5);
    free(t);
    free(h);
    kvp_router_free(r);
}

#endif /* KVP_TEST_REDIS */

/* ---------------------------------------------------------------------------------------- */
/* Engine-hash mode: the key check                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Batch of one parentless BlockStored of tokens t under config c (2 blocks). */
static void keycheck(kvp_router *r, uint32_t id, kvp_config c, const uint32_t *t,
                     kvp_router_key_check *kc)
{
    kvp_namespace ns = ns_none();
    uint64_t k[2];
    cr_assert_eq(keys_of(c, &ns, t, 2 * c.block_size, k, 2), 2);
    kvp_kv_event e = ev_stored(k, 2, t, c.block_size, "GPU");
    kvp_kv_batch b = batch_of(&e, 1, 1);
    cr_assert_eq(kvp_router_check_keys(r, id, &b, kc), KVP_OK);
}

Test(router_keycheck, mismatches_counted_and_named)
{
    kvp_router *r = router_new();
    kvp_config mine = hash_cfg(KVP_HASH_VLLM_SHA256, 16);
    mine.vllm_seed = "fixed-seed";
    uint32_t a = add_worker(r, "a", 0, mine, NULL);
    uint32_t t[32];
    seq_tokens(t, 32, 40);
    kvp_router_key_check kc;
    keycheck(r, a, mine, t, &kc);
    cr_assert_eq(kc.n_checked, 1);
    cr_assert_eq(kc.n_mismatch, 0);
    cr_assert_null(kc.likely);

    kvp_config other = mine;
    other.vllm_seed = "a-random-none-hash";
    keycheck(r, a, other, t, &kc);
    cr_assert_eq(kc.n_mismatch, 1);
    cr_assert_not_null(kc.likely);
    cr_assert(strstr(kc.likely, "seed"), "%s", kc.likely);
    cr_assert_neq(kc.engine_hash, kc.router_hash);

    other = mine;
    other.hash_profile = KVP_HASH_VLLM_XXHASH;
    keycheck(r, a, other, t, &kc);
    cr_assert_eq(kc.n_mismatch, 1);
    cr_assert(strstr(kc.likely, "vllm-xxhash-cbor"), "%s", kc.likely);

    /* Chained events (a parent) and events with extra_keys are not checked. */
    uint64_t k[2] = {1, 2};
    kvp_kv_event e = ev_stored(k, 2, t, 16, NULL);
    e.has_parent = true;
    e.parent = 5;
    kvp_kv_batch b = batch_of(&e, 1, 1);
    cr_assert_eq(kvp_router_check_keys(r, a, &b, &kc), KVP_OK);
    cr_assert_eq(kc.n_checked, 0);
    kvp_router_free(r);
}
