/*
 * test_replay_opt.c - the offline optimum (src/cli/cmd/replay/replay_opt.c) against an
 * exhaustive search over every eviction choice and against the LRU engine (replay_sim.c).
 *
 * The exhaustive search shares nothing with MIN: a memoised recursion over (request, set of
 * cached blocks as a bit mask) that, after each request, keeps the request's first
 * min(blocks, C) blocks and tries every subset of the other cached blocks that fits (voluntary
 * evictions included), counting hits by the documented rule (the longest cached prefix of
 * the full prompt blocks, at most (tokens - 1) / block size of them). The logs are random
 * token logs of a few short prompts over a tiny alphabet, so prefixes are shared, prompts
 * of a whole number of blocks occur (their last block can never hit) and, with cached
 * output, blocks are touched that no request of theirs can reuse.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kvprefix.h"
#include "replay_opt.h"
#include "replay_sim.h"

/* Sanitizer builds run a quarter of the random logs below (the same property, within the
 * ASan step's time in scripts/test.sh, where this file took a minute); gcc runs them all. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifdef SANITIZED
#define RANDOM_LOGS(n) ((n) / 4)
#else
#define RANDOM_LOGS(n) (n)
#endif

static char err[512];

#define MAX_REQ  10
#define MAX_TOK  12
#define MAX_BITS 14

typedef struct log_t {
    uint32_t bs;                    /* block size */
    size_t n_req;                   /* requests */
    uint32_t tok[MAX_REQ][MAX_TOK]; /* prompt then output tokens */
    size_t n_tok[MAX_REQ], n_out[MAX_REQ];
} log_t;

/* Replay lg through a fresh engine and a fresh MIN log. */
static void load(const log_t *lg, rp_sim **sp, rp_opt **op)
{
    rp_sim_config c = {lg->bs, 0, 0, NULL};
    rp_sim *s = rp_sim_new(&c, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    rp_opt *o = rp_opt_new(lg->bs);
    cr_assert_not_null(o);
    for (size_t r = 0; r < lg->n_req; r++) {
        rp_request q;
        memset(&q, 0, sizeof q);
        kvp_namespace_init(&q.ns);
        q.tokens = lg->tok[r];
        q.n_tokens = lg->n_tok[r];
        q.n_output_tokens = lg->n_out[r];
        q.line_no = r + 1;
        cr_assert_eq(rp_sim_add(s, &q, err, sizeof err), RP_OK, "%s", err);
        const size_t *blocks;
        size_t n = rp_sim_last_blocks(s, &blocks);
        cr_assert_eq(n, (lg->n_tok[r] + lg->n_out[r]) / lg->bs);
        cr_assert_eq(rp_opt_add(o, lg->n_tok[r], (uint32_t)(lg->n_tok[r] / lg->bs), blocks, n), 0);
    }
    *sp = s;
    *op = o;
}

static uint64_t opt_hits(rp_opt *o, uint64_t cap, int rule)
{
    rp_opt_result res;
    cr_assert_eq(rp_opt_eval(o, cap, rule, &res), 0);
    return res.n_hit_tokens;
}

static uint64_t lru_hits(const rp_sim *s, uint64_t cap)
{
    rp_metrics m;
    cr_assert_eq(rp_sim_eval(s, cap, &m, NULL), RP_OK);
    return m.n_hit_tokens;
}

/* ---- exhaustive search ---------------------------------------------------------------- */

typedef struct brute {
    const rp_opt *o;
    uint64_t cap, bs;
    int32_t *memo; /* [request][mask]: best hit blocks from that request on; -1 unknown */
} brute;

static int32_t best(brute *b, size_t r, uint32_t mask)
{
    size_t n_req = rp_opt_n_requests(b->o);
    if (r == n_req)
        return 0;
    int32_t *m = &b->memo[r * ((size_t)1 << MAX_BITS) + mask];
    if (*m >= 0)
        return *m;
    const uint32_t *blk;
    uint64_t n_tokens;
    uint32_t n_full;
    size_t n_touch = rp_opt_request(b->o, r, &blk, &n_tokens, &n_full);
    size_t n = n_touch < b->cap ? n_touch : (size_t)b->cap;
    size_t h = 0;
    while (h < n_full && h < n && (mask >> blk[h] & 1))
        h++;
    uint64_t lim = (n_tokens - 1) / b->bs;
    int32_t hit = (int32_t)(h < lim ? h : lim);
    uint32_t keep = 0;
    for (size_t i = 0; i < n; i++)
        keep |= UINT32_C(1) << blk[i];
    uint32_t rest = mask & ~keep;
    int room = (int)b->cap - __builtin_popcount(keep);
    int32_t top = 0;
    /* Every subset of the other cached blocks that fits, the empty one included. */
    for (uint32_t x = rest;; x = (x - 1) & rest) {
        if (__builtin_popcount(x) <= room) {
            int32_t v = best(b, r + 1, keep | x);
            top = v > top ? v : top;
        }
        if (x == 0)
            break;
    }
    *m = hit + top;
    return *m;
}

static uint64_t brute_hits(const rp_opt *o, uint64_t cap, uint32_t bs)
{
    size_t n_req = rp_opt_n_requests(o);
    brute b = {o, cap, bs, malloc(n_req * ((size_t)1 << MAX_BITS) * sizeof(int32_t))};
    cr_assert_not_null(b.memo);
    memset(b.memo, 0xff, n_req * ((size_t)1 << MAX_BITS) * sizeof(int32_t));
    uint64_t v = (uint64_t)best(&b, 0, 0) * bs;
    free(b.memo);
    return v;
}

/* ---- hand cases ------------------------------------------------------------------------- */

/* The worked example of docs/replay.md (block size 2): LRU skips 6, 8, 10 tokens at
 * capacities 2, 3, 4, and so does MIN: R4's own blocks A' B' must be stored, so at capacity
 * 3 one of A B goes (MIN drops the deeper, B, as LRU does) and at 2 both go. */
Test(replay_opt, worked_example)
{
    log_t lg = {.bs = 2, .n_req = 5};
    const uint32_t t[5][5] = {
        {1, 2, 3, 4, 5}, {1, 2, 3, 4, 9}, {1, 2, 3, 4}, {7, 1, 2, 3, 4}, {1, 2, 3, 4, 5}};
    const size_t n[5] = {5, 5, 4, 5, 5};
    for (int r = 0; r < 5; r++) {
        memcpy(lg.tok[r], t[r], sizeof t[r]);
        lg.n_tok[r] = n[r];
    }
    rp_sim *s;
    rp_opt *o;
    load(&lg, &s, &o);
    cr_assert_eq(lru_hits(s, 2), 6);
    cr_assert_eq(lru_hits(s, 3), 8);
    cr_assert_eq(opt_hits(o, 2, RP_OPT_USEFUL), 6);
    cr_assert_eq(opt_hits(o, 3, RP_OPT_USEFUL), 8);
    cr_assert_eq(opt_hits(o, 4, RP_OPT_USEFUL), 10);
    for (uint64_t c = 1; c <= 5; c++)
        cr_assert_eq(opt_hits(o, c, RP_OPT_USEFUL), brute_hits(o, c, 2), "capacity %llu",
                     (unsigned long long)c);
    rp_opt_free(o);
    rp_sim_free(s);
}

/* Textbook Belady is not optimal under the one-token rule. Block size 2, capacity 2:
 *   R1 [1 2 9] A   R2 [3 4 9] B   R3 [5 6 9] D   R4 [1 2] A (cannot hit: 1 token is computed)
 *   R5 [3 4 9] B   R6 [1 2 9] A
 * At R3 plain Belady evicts B (next touch R5) and keeps A (next touch R4, useless): one hit
 * in all (R6). MIN sees that R4's touch re-admits A for free, keeps B: hits at R5 and R6. */
Test(replay_opt, plain_belady_is_not_optimal)
{
    log_t lg = {.bs = 2, .n_req = 6};
    const uint32_t t[6][3] = {{1, 2, 9}, {3, 4, 9}, {5, 6, 9}, {1, 2, 0}, {3, 4, 9}, {1, 2, 9}};
    const size_t n[6] = {3, 3, 3, 2, 3, 3};
    for (int r = 0; r < 6; r++) {
        memcpy(lg.tok[r], t[r], sizeof t[r]);
        lg.n_tok[r] = n[r];
    }
    rp_sim *s;
    rp_opt *o;
    load(&lg, &s, &o);
    cr_assert_eq(opt_hits(o, 2, RP_OPT_PLAIN), 2);
    cr_assert_eq(opt_hits(o, 2, RP_OPT_USEFUL), 4);
    cr_assert_eq(brute_hits(o, 2, 2), 4);
    cr_assert_eq(lru_hits(s, 2), 2);
    rp_opt_free(o);
    rp_sim_free(s);
}

/* ---- random logs ------------------------------------------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint32_t rnd(uint32_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

/* A random log: each prompt continues a random prefix of an earlier one (or starts anew)
 * with tokens from {1, 2, 3}. */
static void gen(log_t *lg)
{
    lg->bs = 1 + rnd(2);
    lg->n_req = 3 + rnd(MAX_REQ - 2);
    for (size_t r = 0; r < lg->n_req; r++) {
        size_t n = 1 + rnd(7), keep = 0;
        if (r > 0 && rnd(4) != 0) {
            size_t from = rnd((uint32_t)r);
            keep = rnd((uint32_t)lg->n_tok[from] + 1);
            keep = keep < n ? keep : n;
            memcpy(lg->tok[r], lg->tok[from], keep * sizeof lg->tok[r][0]);
        }
        for (size_t i = keep; i < n; i++)
            lg->tok[r][i] = 1 + rnd(3);
        lg->n_tok[r] = n;
        lg->n_out[r] = rnd(3) == 0 ? rnd(4) : 0;
        for (size_t i = n; i < n + lg->n_out[r]; i++)
            lg->tok[r][i] = 1 + rnd(3);
    }
}

/* MIN equals the exhaustive optimum wherever it is feasible (at most MAX_BITS distinct
 * blocks) and is never below LRU; textbook Belady never beats it and falls short on some. */
Test(replay_opt, random_logs_against_brute_force_and_lru, .timeout = 300)
{
    int n_checked = 0, n_plain_short = 0, n_min_above_lru = 0;
    for (int iter = 0; iter < RANDOM_LOGS(1500); iter++) {
        log_t lg;
        gen(&lg);
        rp_sim *s;
        rp_opt *o;
        load(&lg, &s, &o);
        size_t n_blocks = rp_opt_n_blocks(o);
        for (uint64_t cap = 1; cap <= n_blocks + 1; cap++) {
            uint64_t min = opt_hits(o, cap, RP_OPT_USEFUL);
            uint64_t plain = opt_hits(o, cap, RP_OPT_PLAIN);
            uint64_t lru = lru_hits(s, cap);
            cr_assert_geq(min, lru, "iter %d cap %llu", iter, (unsigned long long)cap);
            cr_assert_geq(min, plain, "iter %d cap %llu", iter, (unsigned long long)cap);
            n_min_above_lru += min > lru;
            if (n_blocks <= MAX_BITS) {
                uint64_t bf = brute_hits(o, cap, lg.bs);
                cr_assert_eq(min, bf, "iter %d cap %llu: MIN %llu, exhaustive %llu", iter,
                             (unsigned long long)cap, (unsigned long long)min,
                             (unsigned long long)bf);
                n_checked++;
                n_plain_short += plain < bf;
            }
        }
        rp_opt_free(o);
        rp_sim_free(s);
    }
    cr_log_info("%d (log, capacity) pairs against the exhaustive search; MIN above LRU on %d; "
                "textbook Belady short of the optimum on %d",
                n_checked, n_min_above_lru, n_plain_short);
    cr_assert_gt(n_checked, RANDOM_LOGS(4000));
    cr_assert_gt(n_min_above_lru, 0);
    cr_assert_gt(n_plain_short, 0);
}
