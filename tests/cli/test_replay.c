/*
 * test_replay.c - the replay engine (src/cli/cmd/replay/replay_sim.c) against hand-computed
 * figures, the library's pool and an independent naive LRU list; the sweep's one-pass figures
 * against separate single-capacity replays on random logs.
 *
 * The naive model here shares nothing with the engine: a plain array of keys in recency
 * order, a linear search per block, and the documented rules (look up the longest cached
 * prefix; touch the blocks from the last to the first; a request keeps at most its first C
 * blocks; evict the least recently used).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kvprefix.h"
#include "replay_sim.h"

static char err[512];

static rp_sim *sim_new(uint32_t bs, uint32_t pool)
{
    rp_sim_config c = {bs, 0, pool, NULL};
    rp_sim *s = rp_sim_new(&c, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    return s;
}

static void add_tokens(rp_sim *s, const char *tenant, const uint32_t *t, size_t n, size_t n_out)
{
    rp_request r;
    memset(&r, 0, sizeof r);
    kvp_namespace_init(&r.ns);
    r.ns.tenant = kvp_field_str(tenant);
    r.tokens = t;
    r.n_tokens = n;
    r.n_output_tokens = n_out;
    r.line_no = 1;
    int rc = rp_sim_add(s, &r, err, sizeof err);
    cr_assert_eq(rc, RP_OK, "%s", err);
    cr_assert(rp_sim_check(s));
}

static rp_metrics eval(const rp_sim *s, uint64_t cap)
{
    rp_metrics m;
    cr_assert_eq(rp_sim_eval(s, cap, &m, NULL), RP_OK);
    return m;
}

/* The worked example of docs/replay.md, block size 2:
 *   R1 [1 2 3 4 5]   A B      cold
 *   R2 [1 2 3 4 9]   A B      cached 2, cap (5-1)/2 = 2: 4 tokens skipped
 *   R3 [1 2 3 4]     A B      cached 2, cap (4-1)/2 = 1: 2 tokens (one token computed)
 *   R4 [7 1 2 3 4]   A' B'    cold: a different first token ends all sharing
 *   R5 [1 2 3 4 5]   A B      hit at capacity >= 4; at 3 only A survived R4; at 2 none */
static const uint32_t r1[] = {1, 2, 3, 4, 5}, r2[] = {1, 2, 3, 4, 9}, r3[] = {1, 2, 3, 4},
                      r4[] = {7, 1, 2, 3, 4};

static void add_worked(rp_sim *s)
{
    add_tokens(s, "t", r1, 5, 0);
    add_tokens(s, "t", r2, 5, 0);
    add_tokens(s, "t", r3, 4, 0);
    add_tokens(s, "t", r4, 5, 0);
    add_tokens(s, "t", r1, 5, 0);
}

Test(replay, worked_example_by_hand)
{
    rp_sim *s = sim_new(2, 0);
    add_worked(s);
    cr_assert_eq(rp_sim_distinct(s), 4);

    rp_metrics m = eval(s, 4);
    cr_assert_eq(m.n_requests, 5);
    cr_assert_eq(m.n_prompt_tokens, 24);
    cr_assert_eq(m.n_hit_tokens, 4 + 2 + 4);
    cr_assert_eq(m.n_blocks_full, 10);
    cr_assert_eq(m.n_blocks_cached, 6);
    cr_assert_eq(m.n_blocks_hit, 5);
    cr_assert_eq(m.n_cold_misses, 4);
    cr_assert_eq(m.n_capacity_misses, 0);
    cr_assert_eq(m.n_evicted, 0);
    /* Fractions 0, 0.8, 0.5, 0, 0.8: mean 0.42; nearest rank p50 = 3rd of 5 = 0.5. */
    cr_assert_float_eq(m.mean_hit, 0.42, 1e-12);
    cr_assert_float_eq(m.p50_hit, 0.5, 1e-12);
    cr_assert_float_eq(m.p90_hit, 0.8, 1e-12);

    m = eval(s, 3); /* R4 evicted B; R5 finds A only */
    cr_assert_eq(m.n_hit_tokens, 4 + 2 + 2);
    cr_assert_eq(m.n_blocks_cached, 5);
    cr_assert_eq(m.n_capacity_misses, 1);
    cr_assert_eq(m.n_cold_misses, 4);
    cr_assert_eq(m.n_evicted, 2); /* B by R4, then B' by R5 (to store B) */

    m = eval(s, 2); /* R4 evicted both; R5 misses both */
    cr_assert_eq(m.n_hit_tokens, 4 + 2);
    cr_assert_eq(m.n_capacity_misses, 2);
    cr_assert_eq(m.n_evicted, 4);

    m = eval(s, RP_CAP_INF);
    cr_assert_eq(m.n_hit_tokens, 10);
    cr_assert_eq(m.n_cold_misses, 4);
    rp_sim_free(s);
}

Test(replay, pool_mode_agrees_on_the_worked_example)
{
    for (uint32_t cap = 1; cap <= 5; cap++) {
        rp_sim *s = sim_new(2, cap);
        add_worked(s);
        cr_assert_eq(rp_sim_finish(s, err, sizeof err), RP_OK, "cap %u: %s", cap, err);
        rp_sim_free(s);
    }
}

Test(replay, namespaces_do_not_share)
{
    rp_sim *s = sim_new(2, 8);
    add_tokens(s, "a", r1, 5, 0);
    add_tokens(s, "b", r1, 5, 0);
    rp_metrics m = eval(s, 8);
    cr_assert_eq(m.n_hit_tokens, 0);
    cr_assert_eq(m.n_cold_misses, 4);
    cr_assert_eq(rp_sim_n_groups(s, RP_DIM_TENANT), 2);
    rp_group_metrics g0[1], g1[1], g2[2];
    rp_group_metrics *groups[RP_N_DIMS] = {g0, g1, g2};
    cr_assert_eq(rp_sim_eval(s, 8, &m, groups), RP_OK);
    cr_assert_eq(g2[0].n_requests, 1);
    cr_assert_eq(g2[1].n_cold_misses, 2);
    size_t len;
    cr_assert_str_eq(rp_sim_group_name(s, RP_DIM_TENANT, 1, &len), "b");
    cr_assert_null(rp_sim_group_name(s, RP_DIM_MODEL, 0, &len)); /* absent */
    cr_assert_eq(rp_sim_finish(s, err, sizeof err), RP_OK);
    rp_sim_free(s);
}

static void add_trace(rp_sim *s, const uint64_t *ids, size_t n, uint64_t len, int want)
{
    rp_request r;
    memset(&r, 0, sizeof r);
    kvp_namespace_init(&r.ns);
    r.hash_ids = ids;
    r.n_hash_ids = n;
    r.input_length = len;
    r.line_no = 7;
    int rc = rp_sim_add(s, &r, err, sizeof err);
    cr_assert_eq(rc, want, "%s", err);
    cr_assert(rp_sim_check(s));
}

/* Block size 4: T1 10 tokens [1 2 3] (3 is partial: never cached), T2 8 tokens [1 2]
 * (cached 2, cap (8-1)/4 = 1 block), T3 9 tokens [1 2 5] (cached 2, cap 2: 8 tokens). */
Test(replay, trace_by_hand)
{
    rp_sim *s = sim_new(4, 16);
    const uint64_t t1[] = {1, 2, 3}, t2[] = {1, 2}, t3[] = {1, 2, 5};
    add_trace(s, t1, 3, 10, RP_OK);
    add_trace(s, t2, 2, 8, RP_OK);
    add_trace(s, t3, 3, 9, RP_OK);
    rp_metrics m = eval(s, 16);
    cr_assert_eq(m.n_prompt_tokens, 27);
    cr_assert_eq(m.n_hit_tokens, 4 + 8);
    cr_assert_eq(m.n_blocks_full, 6);
    cr_assert_eq(m.n_blocks_cached, 4);
    cr_assert_eq(m.n_blocks_hit, 3);
    cr_assert_eq(m.n_cold_misses, 2);
    cr_assert_eq(rp_sim_distinct(s), 2);
    cr_assert_eq(rp_sim_finish(s, err, sizeof err), RP_OK, "%s", err);
    rp_sim_free(s);
}

Test(replay, trace_ids_must_name_their_prefix)
{
    rp_sim *s = sim_new(4, 16);
    const uint64_t a[] = {1, 2}, moved[] = {9, 2}, dup[] = {5, 5}, wrong_count[] = {1};
    add_trace(s, a, 2, 8, RP_OK);
    add_trace(s, moved, 2, 8, RP_EINPUT); /* id 2 after 9, but after 1 before */
    cr_assert(strstr(err, "line 7") != NULL, "%s", err);
    add_trace(s, dup, 2, 8, RP_EINPUT);
    cr_assert(strstr(err, "repeats") != NULL, "%s", err);
    add_trace(s, wrong_count, 1, 12, RP_EINPUT);
    /* The refused requests left nothing behind: 9 and 5 are still unknown. */
    cr_assert_eq(rp_sim_distinct(s), 2);
    const uint64_t b[] = {9};
    add_trace(s, b, 1, 4, RP_OK);
    rp_metrics m = eval(s, 16);
    cr_assert_eq(m.n_requests, 2);
    cr_assert_eq(m.n_cold_misses, 3);
    rp_sim_free(s);
}

/* ---- random logs: sweep versus the pool and a naive LRU list ------------------------------ */

typedef struct naive {
    kvp_key *k; /* most recent first */
    size_t n, cap;
    uint64_t evicted;
} naive;

static bool key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

static long naive_find(const naive *v, kvp_key k)
{
    for (size_t i = 0; i < v->n; i++)
        if (key_eq(v->k[i], k))
            return (long)i;
    return -1;
}

static bool in_request(kvp_key k, const kvp_key *keys, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (key_eq(keys[i], k))
            return true;
    return false;
}

/* Returns the cached prefix length, then applies the request. The request's own blocks are
 * in use while it runs (a serving engine pins them), so the victim is the least recently
 * used block of other requests. */
static uint32_t naive_access(naive *v, const kvp_key *keys, uint32_t n_prompt, uint32_t n_touch)
{
    uint32_t cached = 0;
    while (cached < n_prompt && naive_find(v, keys[cached]) >= 0)
        cached++;
    uint32_t keep = n_touch < v->cap ? n_touch : (uint32_t)v->cap;
    for (uint32_t i = keep; i-- > 0;) {
        long at = naive_find(v, keys[i]);
        if (at < 0) {
            if (v->n == v->cap) {
                size_t victim = v->n;
                while (victim-- > 0 && in_request(v->k[victim], keys, keep))
                    ;
                memmove(v->k + victim, v->k + victim + 1, (v->n - victim - 1) * sizeof *v->k);
                v->n--;
                v->evicted++;
            }
            at = (long)v->n++;
        }
        memmove(v->k + 1, v->k, (size_t)at * sizeof *v->k);
        v->k[0] = keys[i];
    }
    return cached;
}

typedef struct rlog {
    uint32_t *tok[200];
    size_t n[200], n_out[200];
    int ns[200];
    size_t count;
} rlog;

/* Requests that share prefixes: each starts from a cut of an earlier one (or of nothing)
 * and continues with random tokens from a small vocabulary. */
static void make_log(rlog *L, unsigned seed, size_t count)
{
    srand(seed);
    L->count = count;
    for (size_t i = 0; i < count; i++) {
        size_t len = 1 + (size_t)(rand() % 40), out = (size_t)(rand() % 3 == 0 ? rand() % 9 : 0);
        L->tok[i] = malloc((len + out) * sizeof(uint32_t));
        L->n[i] = len;
        L->n_out[i] = out;
        L->ns[i] = rand() % 3 == 0;
        size_t from = 0;
        if (i > 0 && rand() % 4 != 0) {
            size_t j = (size_t)rand() % i;
            size_t cut = (size_t)rand() % (L->n[j] + L->n_out[j] + 1);
            from = cut < len + out ? cut : len + out;
            memcpy(L->tok[i], L->tok[j], from * sizeof(uint32_t));
        }
        for (size_t k = from; k < len + out; k++)
            L->tok[i][k] = (uint32_t)(rand() % 5);
    }
}

static void free_log(rlog *L)
{
    for (size_t i = 0; i < L->count; i++)
        free(L->tok[i]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check_random(unsigned seed, uint32_t bs, bool cache_output)
{
    rlog L;
    make_log(&L, seed, 120);
    const char *tenants[2] = {"x", "y"};
    rp_sim *sweep = sim_new(bs, 0);
    for (size_t i = 0; i < L.count; i++)
        add_tokens(sweep, tenants[L.ns[i]], L.tok[i], L.n[i], cache_output ? L.n_out[i] : 0);
    uint64_t distinct = rp_sim_distinct(sweep);
    /* Every small capacity, then about 30 more up to beyond the distinct count. */
    for (uint64_t cap = 1; cap <= distinct + 2; cap = cap < 24 ? cap + 1 : cap + cap / 8) {
        rp_metrics m = eval(sweep, cap);
        /* The library's pool, driven directly. */
        kvp_config c;
        kvp_config_init(&c);
        c.n_blocks = (uint32_t)cap;
        c.block_size = bs;
        kvp_cache *cache;
        cr_assert_eq(kvp_cache_new(&c, &cache), KVP_OK);
        naive nv = {calloc(cap, sizeof(kvp_key)), 0, cap, 0};
        uint64_t hit_tokens = 0, cached_blocks = 0;
        double frac[200];
        for (size_t i = 0; i < L.count; i++) {
            kvp_namespace ns;
            kvp_namespace_init(&ns);
            ns.tenant = kvp_field_str(tenants[L.ns[i]]);
            size_t out = cache_output ? L.n_out[i] : 0;
            kvp_match pm, unused;
            cr_assert_eq(kvp_lookup(cache, &ns, L.tok[i], L.n[i], NULL, 0, &pm), KVP_OK);
            cr_assert_eq(kvp_access(cache, &ns, L.tok[i], L.n[i] + out, &unused), KVP_OK);
            hit_tokens += pm.n_tokens_hit;
            cached_blocks += pm.n_blocks_cached;
            frac[i] = (double)pm.n_tokens_hit / (double)L.n[i];
            kvp_key root, keys[64];
            size_t nk;
            cr_assert_eq(kvp_namespace_key(0, &ns, &root), KVP_OK);
            cr_assert_eq(kvp_hash_blocks(0, root, L.tok[i], L.n[i] + out, bs, keys, 64, &nk),
                         KVP_OK);
            uint32_t nc = naive_access(&nv, keys, (uint32_t)(L.n[i] / bs), (uint32_t)nk);
            cr_assert_eq(nc, pm.n_blocks_cached, "seed %u cap %llu request %zu", seed,
                         (unsigned long long)cap, i);
        }
        /* Percentiles by sorting, nearest rank: ceil(n p / 100)-th smallest. */
        qsort(frac, L.count, sizeof *frac, cmp_double);
        cr_assert_eq(m.p50_hit, frac[(L.count * 50 + 99) / 100 - 1]);
        cr_assert_eq(m.p90_hit, frac[(L.count * 90 + 99) / 100 - 1]);
        cr_assert_eq(m.p99_hit, frac[(L.count * 99 + 99) / 100 - 1]);
        kvp_stats st;
        cr_assert_eq(kvp_cache_stats(cache, &st), KVP_OK);
        cr_assert_eq(m.n_hit_tokens, hit_tokens, "seed %u bs %u cap %llu", seed, bs,
                     (unsigned long long)cap);
        cr_assert_eq(m.n_blocks_cached, cached_blocks);
        cr_assert_eq(m.n_evicted, st.n_evictions, "cap %llu: sweep %llu pool %llu",
                     (unsigned long long)cap, (unsigned long long)m.n_evicted,
                     (unsigned long long)st.n_evictions);
        cr_assert_eq(m.n_evicted, nv.evicted);
        cr_assert_eq(m.n_stored - m.n_evicted, st.n_blocks_cached);
        kvp_cache_free(cache);
        free(nv.k);

        /* A single-capacity replay in pool mode checks itself on every request. */
        if (cap % 7 == 1) {
            rp_sim *single = sim_new(bs, (uint32_t)cap);
            for (size_t i = 0; i < L.count; i++)
                add_tokens(single, tenants[L.ns[i]], L.tok[i], L.n[i],
                           cache_output ? L.n_out[i] : 0);
            cr_assert_eq(rp_sim_finish(single, err, sizeof err), RP_OK, "%s", err);
            rp_metrics s1 = eval(single, cap);
            cr_assert_eq(memcmp(&s1, &m, sizeof m), 0);
            rp_sim_free(single);
        }
    }
    rp_sim_free(sweep);
    free_log(&L);
}

Test(replay, sweep_equals_single_replays_on_random_logs)
{
    for (unsigned seed = 1; seed <= 12; seed++)
        check_random(seed, 1 + seed % 3, seed % 2 == 0);
}

/* Fill out[0 .. len) with a random trace request: two times in three a cut of an earlier
 * request (reqs[0 .. i), of lengths n[]) and then new ids from next_id. Returns the next
 * unused id. Every id thus names one prefix (a growing tree). */
static uint64_t random_ids(uint64_t *out, size_t len, const uint64_t *const *reqs, const size_t *n,
                           size_t i, uint64_t next_id)
{
    size_t from = 0;
    if (i > 0 && rand() % 3 != 0) {
        size_t j = (size_t)rand() % i;
        from = (size_t)rand() % (n[j] + 1);
        from = from < len ? from : len;
        memcpy(out, reqs[j], from * sizeof *out);
    }
    for (size_t k = from; k < len; k++)
        out[k] = next_id++;
    return next_id;
}

/* Random hash-id traces: ids drawn from a growing tree, so every id names one prefix. */
Test(replay, sweep_equals_pool_on_random_traces)
{
    srand(99);
    enum { N = 150 };
    uint64_t *req[N];
    size_t n[N];
    uint64_t next_id = 1;
    for (size_t i = 0; i < N; i++) {
        size_t len = 1 + (size_t)(rand() % 12);
        req[i] = malloc(len * sizeof **req);
        n[i] = len;
        next_id = random_ids(req[i], len, (const uint64_t *const *)req, n, i, next_id);
    }
    rp_sim *sweep = sim_new(8, 0);
    for (size_t i = 0; i < N; i++)
        add_trace(sweep, req[i], n[i], n[i] * 8 - (i % 3), RP_OK);
    for (uint64_t cap = 1; cap <= rp_sim_distinct(sweep) + 1;
         cap = cap < 24 ? cap + 1 : cap + cap / 8) {
        rp_metrics m = eval(sweep, cap);
        kvp_config c;
        kvp_config_init(&c);
        c.n_blocks = (uint32_t)cap;
        c.block_size = 8;
        kvp_cache *cache;
        cr_assert_eq(kvp_cache_new(&c, &cache), KVP_OK);
        uint64_t hit = 0;
        for (size_t i = 0; i < N; i++) {
            kvp_namespace ns;
            kvp_namespace_init(&ns);
            kvp_key ids[16];
            for (size_t k = 0; k < n[i]; k++)
                ids[k] = (kvp_key){req[i][k], 0};
            kvp_match pm;
            cr_assert_eq(kvp_access_ids(cache, &ns, ids, n[i], n[i] * 8 - (i % 3), &pm), KVP_OK);
            hit += pm.n_tokens_hit;
        }
        kvp_stats st;
        cr_assert_eq(kvp_cache_stats(cache, &st), KVP_OK);
        cr_assert_eq(m.n_hit_tokens, hit, "cap %llu", (unsigned long long)cap);
        cr_assert_eq(m.n_evicted, st.n_evictions, "cap %llu", (unsigned long long)cap);
        kvp_cache_free(cache);
    }
    rp_sim_free(sweep);
    for (size_t i = 0; i < N; i++)
        free(req[i]);
}

Test(replay, bad_requests_and_config)
{
    rp_sim_config c = {0, 0, 0, NULL};
    cr_assert_null(rp_sim_new(&c, err, sizeof err));
    cr_assert(strstr(err, "block size") != NULL);
    rp_sim *s = sim_new(4, 0);
    rp_request r;
    memset(&r, 0, sizeof r);
    kvp_namespace_init(&r.ns);
    const uint32_t t[] = {1};
    r.tokens = t;
    r.n_tokens = 0;
    cr_assert_eq(rp_sim_add(s, &r, err, sizeof err), RP_EINPUT);
    cr_assert(strstr(err, "empty") != NULL);
    rp_metrics m = eval(s, 4);
    cr_assert_eq(m.n_requests, 0);
    cr_assert_eq(m.mean_hit, 0.0);
    rp_sim_free(s);
}

/* Many trace requests (beyond the first growth of the key table and of the touch bitmap),
 * a fifth of them refused after they created new entries (an id moved to another prefix at
 * their end): the refused requests leave nothing behind, the invariants hold throughout,
 * and the figures still equal the pool's. */
Test(replay, refused_requests_undo_and_growth)
{
    srand(7);
    enum { N = 3000 };
    rp_sim *sim = sim_new(4, 0);
    kvp_config c;
    kvp_config_init(&c);
    c.n_blocks = 300;
    c.block_size = 4;
    kvp_cache *cache;
    cr_assert_eq(kvp_cache_new(&c, &cache), KVP_OK);
    static uint64_t req[N][12];
    static const uint64_t *bases[N];
    for (size_t i = 0; i < N; i++)
        bases[i] = req[i];
    size_t n[N];
    uint64_t next_id = 1, hit = 0, accepted = 0;
    for (size_t i = 0; i < N; i++) {
        size_t len = 2 + (size_t)(rand() % 10);
        next_id = random_ids(req[i], len, bases, n, i, next_id);
        n[i] = len;
        /* Refused unless id 2 would land right after request 0's first id again. */
        bool refuse = rand() % 5 == 0 && i > 0 && !(len == 2 && req[i][0] == req[0][0]);
        if (refuse)
            req[i][len - 1] = req[0][1]; /* id 2 of request 0 now follows another prefix */
        uint64_t distinct = rp_sim_distinct(sim);
        add_trace(sim, req[i], len, len * 4, refuse ? RP_EINPUT : RP_OK);
        if (refuse) {
            cr_assert_eq(rp_sim_distinct(sim), distinct);
            n[i] = 0; /* never reused as a base */
            continue;
        }
        accepted++;
        kvp_namespace ns;
        kvp_namespace_init(&ns);
        kvp_key ids[12];
        for (size_t k = 0; k < len; k++)
            ids[k] = (kvp_key){req[i][k], 0};
        kvp_match pm;
        cr_assert_eq(kvp_access_ids(cache, &ns, ids, len, len * 4, &pm), KVP_OK);
        hit += pm.n_tokens_hit;
    }
    cr_assert_gt(next_id, 4096);
    rp_metrics m = eval(sim, 300);
    cr_assert_eq(m.n_requests, accepted);
    cr_assert_eq(m.n_hit_tokens, hit);
    kvp_stats st;
    cr_assert_eq(kvp_cache_stats(cache, &st), KVP_OK);
    cr_assert_eq(m.n_evicted, st.n_evictions);
    kvp_cache_free(cache);
    rp_sim_free(sim);
}

/* Percentiles whose bucket holds distinct values: prompts of 70000 + k tokens extending one
 * sequence (block size 1), so request k reuses all but its last token: fractions
 * (L - 1) / L, all within 1.5e-5 of each other, fall in one of the engine's 65536 buckets,
 * and the second pass must pick the right one among them. Checked against a sort, at the
 * ceiling and at capacities that cut the requests short. */
Test(replay, percentiles_inside_one_bucket)
{
    enum { N = 21, BASE = 70000 };
    uint32_t *seq = malloc((BASE + N) * sizeof *seq);
    cr_assert_not_null(seq);
    for (uint32_t i = 0; i < BASE + N; i++)
        seq[i] = i * 2654435761u;
    rp_sim *s = sim_new(1, 0);
    for (size_t k = 0; k < N; k++)
        add_tokens(s, "t", seq, BASE + k, 0);
    const uint64_t caps[] = {RP_CAP_INF, BASE + N, BASE + 5, 1000};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        rp_metrics m = eval(s, caps[c]);
        double frac[N];
        for (size_t k = 0; k < N; k++) {
            /* Request k finds the previous prompt's BASE + k - 1 blocks, of which a cache
             * of C blocks holds the first C (touched last to first, they are the most
             * recent); it reuses all but its own last token at most. */
            uint64_t prev = k ? BASE + k - 1 : 0;
            uint64_t cached = prev < caps[c] ? prev : caps[c];
            uint64_t hit = cached < BASE + k - 1 ? cached : BASE + k - 1;
            frac[k] = (double)hit / (double)(BASE + k);
        }
        qsort(frac, N, sizeof *frac, cmp_double);
        cr_assert_eq(m.p50_hit, frac[(N * 50 + 99) / 100 - 1], "cap %llu: %.17g",
                     (unsigned long long)caps[c], m.p50_hit);
        cr_assert_eq(m.p90_hit, frac[(N * 90 + 99) / 100 - 1]);
        cr_assert_eq(m.p99_hit, frac[(N * 99 + 99) / 100 - 1]);
    }
    rp_sim_free(s);
    free(seq);
}
