/*
 * test_model.c - differential test of the cache against the naive reference model.
 *
 * Thousands of random operations (lookup, acquire, grow, commit, release, access, reset)
 * over a tiny token alphabet (so prefixes repeat), three namespaces, small pools (4..64
 * blocks) and block sizes 1..4, from fixed seeds. After every operation the return code,
 * the match result, every statistics counter and the request's block count must equal the
 * model's, and kvp_cache_check must pass. Runs with verify_tokens off and on. The model
 * decides hits by exact namespace + token-prefix comparison (tests/lib/refmodel.c).
 *
 * With verify_tokens the model also keeps per-instance provenance (refmodel.h), so the run
 * checks collision-proof mode's exact semantics with full 128-bit keys: which stale blocks
 * (stored after an instance of their parent that has since left the index) stop a match and
 * count a reject, and that commit and access store a new instance beside them instead of
 * replacing them (n_verify_rejects, no KVP_REMOVED_REPLACED event ever, and the
 * free/cached/in-use gauges, which count the stale blocks until they age out). The verify runs
 * must actually reach those paths, or they would prove nothing beyond the plain runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvprefix.h"
#include "refmodel.h"
#include "testutil.h"

#define N_IDS    6  /* request ids 1..N_IDS */
#define MAX_SEQ  64 /* longest request sequence */
#define N_BASES  4  /* prompts are mutated prefixes of these */
#define BASE_LEN 48

typedef struct mreq {
    uint32_t seq[MAX_SEQ]; /* the request's tokens (prompt, then decoded) */
    size_t n_seq;
    const kvp_namespace *ns; /* the request's namespace */
} mreq;

typedef struct world {
    kvp_cache *c;
    uint64_t n_replaced; /* KVP_REMOVED_REPLACED events seen from the cache */
    rm_model *m;
    kvp_namespace nss[3];
    uint32_t bases[N_BASES][BASE_LEN];
    mreq reqs[N_IDS + 1];
    uint64_t rs;
    uint32_t bs;
    bool churn;        /* prompts that make stale blocks (see differential_churn_*) */
    const char *where; /* config description for messages */
    int step;
    const char *op;
} world;

static uint64_t rnd(world *w, uint64_t n)
{
    return th_rand(&w->rs) % n;
}

static void make_prompt(world *w, uint32_t *t, size_t *n)
{
    const uint32_t *base = w->bases[rnd(w, N_BASES)];
    size_t len;
    if (w->churn && rnd(w, 3) == 0)
        len = 1 + rnd(w, 2 * w->bs + 1);
    else
        len = 1 + rnd(w, 40);
    /* Whole blocks only: a fully cached prompt then leaves its last block to the commit. */
    if (w->churn && rnd(w, 2) == 0 && len >= w->bs)
        len -= len % w->bs;
    memcpy(t, base, len * sizeof *t);
    if (rnd(w, 4) == 0)
        t[rnd(w, len)] = (uint32_t)rnd(w, 4);
    *n = len;
}

static void compare_match(world *w, const kvp_match *got, const kvp_match *exp)
{
#define M(x)                                                                                       \
    cr_assert_eq(got->x, exp->x, "%s step %d %s: " #x " %llu, model %llu", w->where, w->step,      \
                 w->op, (unsigned long long)got->x, (unsigned long long)exp->x)
    M(n_tokens);
    M(n_blocks_full);
    M(n_blocks_cached);
    M(n_blocks_hit);
    M(n_tokens_hit);
#undef M
}

static void compare_state(world *w)
{
    kvp_stats s, e;
    cr_assert_eq(kvp_cache_stats(w->c, &s), KVP_OK);
    rm_stats(w->m, &e);
    uint64_t got, want;
    const char *field = rm_stats_diff(&s, &e, &got, &want);
    cr_assert_null(field, "%s step %d %s: stats.%s %llu, model %llu", w->where, w->step, w->op,
                   field ? field : "", (unsigned long long)got, (unsigned long long)want);
    cr_assert_eq(w->n_replaced, rm_n_replaced(w->m),
                 "%s step %d %s: %llu REPLACED events, model %llu", w->where, w->step, w->op,
                 (unsigned long long)w->n_replaced, (unsigned long long)rm_n_replaced(w->m));
    int rc = kvp_cache_check(w->c);
    cr_assert_eq(rc, KVP_OK, "%s step %d %s: kvp_cache_check: %s", w->where, w->step, w->op,
                 kvp_strerror(rc));
    for (uint64_t id = 1; id <= N_IDS; id++) {
        const uint32_t *ids;
        size_t n = 0;
        int r = kvp_request_blocks(w->c, id, &ids, &n);
        bool active = rm_request_active(w->m, id);
        cr_assert_eq(r, active ? KVP_OK : KVP_ENOENT, "%s step %d %s: request %llu", w->where,
                     w->step, w->op, (unsigned long long)id);
        if (active)
            cr_assert_eq(n, rm_request_n_blocks(w->m, id),
                         "%s step %d %s: request %llu holds %zu blocks, model %zu", w->where,
                         w->step, w->op, (unsigned long long)id, n, rm_request_n_blocks(w->m, id));
    }
}

static void on_event(void *ud, const kvp_event *ev)
{
    world *w = ud;
    if (ev->type == KVP_EVENT_REMOVED && ev->reason == KVP_REMOVED_REPLACED)
        w->n_replaced++;
}

static void compare_rc(world *w, int got, int exp)
{
    cr_assert_eq(got, exp, "%s step %d %s: rc %d (%s), model %d (%s)", w->where, w->step, w->op,
                 got, kvp_strerror(got), exp, kvp_strerror(exp));
}

static void step(world *w)
{
    uint64_t dice = rnd(w, 100);
    uint64_t id = 1 + rnd(w, N_IDS);
    mreq *r = &w->reqs[id];
    const kvp_namespace *ns = &w->nss[rnd(w, 3)];
    uint32_t t[MAX_SEQ] = {0};
    size_t n;
    kvp_match got, exp;
    int rc, erc;
    if (dice < 20) {
        w->op = "lookup";
        make_prompt(w, t, &n);
        rc = kvp_lookup(w->c, ns, t, n, NULL, 0, &got);
        erc = rm_lookup(w->m, ns, t, n, &exp);
        compare_rc(w, rc, erc);
        if (rc == KVP_OK)
            compare_match(w, &got, &exp);
    } else if (dice < 40) {
        w->op = "acquire";
        make_prompt(w, t, &n);
        size_t cap = rnd(w, 3) == 0 ? 0 : n + rnd(w, 12);
        rc = kvp_acquire(w->c, id, ns, t, n, cap, &got);
        erc = rm_acquire(w->m, id, ns, t, n, cap, &exp);
        compare_rc(w, rc, erc);
        if (rc == KVP_OK) {
            compare_match(w, &got, &exp);
            memcpy(r->seq, t, n * sizeof *t);
            r->n_seq = n;
            r->ns = ns;
        }
    } else if (dice < 50) {
        w->op = "grow";
        size_t cap = r->n_seq + rnd(w, 16);
        rc = kvp_grow(w->c, id, cap);
        erc = rm_grow(w->m, id, cap);
        compare_rc(w, rc, erc);
    } else if (dice < 65) {
        w->op = "commit";
        if (rm_request_active(w->m, id)) {
            /* Decode a few tokens; sometimes past what the request holds (ERANGE). */
            size_t limit = rm_request_n_blocks(w->m, id) * w->bs;
            size_t add = rnd(w, 4);
            if (rnd(w, 8) == 0)
                limit += w->bs;
            while (add-- > 0 && r->n_seq < limit && r->n_seq < MAX_SEQ)
                r->seq[r->n_seq++] = (uint32_t)rnd(w, 4);
        }
        size_t got_stored = 999, exp_stored = 999;
        rc = kvp_commit(w->c, id, r->n_seq ? r->seq : t, r->n_seq ? r->n_seq : 1, &got_stored);
        erc = rm_commit(w->m, id, r->n_seq ? r->seq : t, r->n_seq ? r->n_seq : 1, &exp_stored);
        compare_rc(w, rc, erc);
        cr_assert_eq(got_stored, exp_stored, "%s step %d commit: n_stored %zu, model %zu", w->where,
                     w->step, got_stored, exp_stored);
    } else if (dice < 80) {
        w->op = "release";
        rc = kvp_release(w->c, id);
        erc = rm_release(w->m, id);
        compare_rc(w, rc, erc);
        if (rc == KVP_OK)
            r->n_seq = 0;
    } else if (dice < 98) {
        w->op = "access";
        if (w->churn && r->n_seq > 0 && rnd(w, 4) != 0) {
            /* A prefix of an active request's sequence, in its namespace: its later commit
             * deduplicates against these unpinned blocks. */
            ns = r->ns;
            n = 1 + rnd(w, r->n_seq);
            memcpy(t, r->seq, n * sizeof *t);
        } else {
            make_prompt(w, t, &n);
        }
        rc = kvp_access(w->c, ns, t, n, &got);
        erc = rm_access(w->m, ns, t, n, &exp);
        compare_rc(w, rc, erc);
        if (rc == KVP_OK)
            compare_match(w, &got, &exp);
    } else {
        w->op = "reset";
        compare_rc(w, kvp_cache_reset(w->c), rm_reset(w->m));
    }
    compare_state(w);
}

/* Totals over the verify runs, to check that they reached the verify-only paths. */
typedef struct totals {
    uint64_t n_verify_rejects;
    uint64_t n_replaced;
} totals;

static void run(uint32_t n_blocks, uint32_t bs, bool verify, bool churn, uint64_t seed, int n_steps,
                totals *tot)
{
    world *w = calloc(1, sizeof *w);
    cr_assert_not_null(w);
    char where[96];
    snprintf(where, sizeof where, "[pool %u, bs %u, verify %d, churn %d, seed %llu]", n_blocks, bs,
             verify, churn, (unsigned long long)seed);
    w->where = where;
    w->churn = churn;
    w->rs = seed;
    w->bs = bs;
    th_ns(&w->nss[0], "model", NULL, NULL, NULL);
    th_ns(&w->nss[1], "model", NULL, "tenant", NULL);
    th_ns(&w->nss[2], "model", "", NULL, NULL); /* empty adapter: differs from absent */
    for (int b = 0; b < N_BASES; b++)
        for (int i = 0; i < BASE_LEN; i++)
            w->bases[b][i] = (uint32_t)rnd(w, 4);
    w->c = th_cache(n_blocks, bs, verify, on_event, w);
    w->m = rm_new(n_blocks, bs, verify);
    for (w->step = 0; w->step < n_steps; w->step++)
        step(w);
    kvp_stats s;
    cr_assert_eq(kvp_cache_stats(w->c, &s), KVP_OK);
    /* The run must have exercised hits, evictions and dedup, or it proves little. */
    cr_assert_gt(s.n_blocks_hit, 0, "%s: no hit in the whole run", where);
    if (n_blocks <= 16)
        cr_assert_gt(s.n_evictions, 0, "%s: no eviction in the whole run", where);
    if (!verify)
        cr_assert_eq(s.n_verify_rejects + w->n_replaced, 0, "%s: verify activity", where);
    tot->n_verify_rejects += s.n_verify_rejects;
    tot->n_replaced += w->n_replaced;
    kvp_cache_free(w->c);
    rm_free(w->m);
    free(w);
}

static const struct {
    uint32_t n_blocks, bs;
} configs[] = {{4, 1}, {5, 2}, {7, 3}, {8, 4}, {12, 1}, {16, 2}, {32, 3}, {64, 4}, {64, 1}};

Test(model, differential_plain)
{
    totals tot = {0, 0};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        run(configs[i].n_blocks, configs[i].bs, false, false, 100 + i, 3000, &tot);
}

Test(model, differential_verify)
{
    totals tot = {0, 0};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        run(configs[i].n_blocks, configs[i].bs, true, false, 200 + i, 3000, &tot);
    cr_assert_gt(tot.n_verify_rejects, 0, "no stale block was ever rejected");
    cr_assert_eq(tot.n_replaced, 0, "a block was replaced");
}

/* Churn: most accesses replay a prefix of an active request's sequence in its namespace, a
 * third of the other prompts are one or two blocks long, and half are whole blocks. The
 * request's commit then deduplicates against unpinned blocks and pins their children; once
 * those parents are evicted and cached again (a new instance), the children are stale in
 * collision-proof mode, so lookups reject them and commits and accesses store new instances
 * beside them. The
 * plain run checks that the same workload agrees without verification. */
Test(model, differential_churn_plain)
{
    totals tot = {0, 0};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        run(configs[i].n_blocks, configs[i].bs, false, true, 300 + i, 3000, &tot);
}

Test(model, differential_churn_verify)
{
    totals tot = {0, 0};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
        run(configs[i].n_blocks, configs[i].bs, true, true, 400 + i, 3000, &tot);
    cr_assert_gt(tot.n_verify_rejects, 20, "only %llu verify rejects",
                 (unsigned long long)tot.n_verify_rejects);
    cr_assert_eq(tot.n_replaced, 0, "%llu replaced blocks", (unsigned long long)tot.n_replaced);
}
