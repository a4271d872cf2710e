/*
 * test_fleet.c - `kvprefix fleet` (src/cli/cmd/fleet/): the fleet simulation against
 * hand-computed expectations, the consistent-hash ring and the random stream against
 * independent reimplementations, the simulation against the replay engine where both must
 * agree, random logs under the invariant checker, and the binary's reports and errors.
 *
 * The hand fixture (data/fleet/fleet_hand.jsonl), block size 4, 2 replicas of 16 blocks,
 * prefill 1 ms and decode 1 ms per token, concurrency 1. Blocks A..H are 4 distinct tokens
 * each; x is one more token (so every prompt has a partial last block):
 *
 *   line  t (ms)  prompt       tokens  output  service when cold
 *   L1      0     A B x           9      20      9 + 20 = 29 ms
 *   L2     10     A B E x        13       2     13 +  2 = 15 ms
 *   L3     20     C D x           9       2      9 +  2 = 11 ms
 *   L4     30     C D F x        13       2     13 +  2 = 15 ms
 *   L5    100     A B E G x      17       2     17 +  2 = 19 ms
 *   L6    110     C D F H x      17       2     17 +  2 = 19 ms
 *
 * A request's full prompt blocks become visible to lookups at the end of its prefill
 * (commit); it leaves its slot at the end of its decode. Hits are capped so one prompt token
 * is computed ((n-1)/4 blocks): never binding here. Each policy's walk-through is in the
 * comment of its expectation below.
 *
 * The router index (fleet_index.c, suite fleet_index; fleet_redis against a real Redis):
 * with no event delay, the cache-aware policies asking a kvp_router fed by the replicas'
 * events must route every request exactly as when they ask the caches (the oracle), on the
 * hand fixture, the Mooncake fixture and random logs with evictions, and with --check the
 * simulation compares the two at every decision; with a delay, the index lags as it should.
 * The fleet_redis tests need KVP_TEST_REDIS_URL (tests/support/with_redis.py starts a server); they
 * are skipped without it unless KVPREFIX_REDIS_REQUIRED is set.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cliutil.h"
#include "kvprefix.h"
#include "logread.h"
#include "replay_sim.h"
#include "fleet.h"
#include "fleet_index.h"

#define MS INT64_C(1000000)

static char err[1024];

static const char *data(const char *name)
{
    static char path[4096];
    const char *dir = getenv("KVPREFIX_TEST_DATA");
    if (dir == NULL || *dir == '\0')
        cr_skip_test("KVPREFIX_TEST_DATA is not set");
    snprintf(path, sizeof path, "%s/fleet/%s", dir, name);
    return path;
}

static kvp_config hash_cfg(int profile)
{
    kvp_config c;
    kvp_config_init(&c);
    c.hash_profile = profile;
    return c;
}

static fl_log *load_as(const char *path, uint32_t bs, const kvp_config *kc)
{
    in_opts in;
    in_init(&in);
    in.block_size = bs;
    fl_log_config lc = {
        .path = path, .in = &in, .interarrival = 100 * MS, .default_output = 128, .cache = kc};
    fl_log *log = NULL;
    int rc = fl_log_read(&lc, &log, err, sizeof err);
    cr_assert_eq(rc, FL_OK, "%s", err);
    cr_assert(fl_log_check(log));
    return log;
}

static fl_model hand_model(void)
{
    fl_model m = {.concurrency = 1,
                  .prefill_ns = 1000000,
                  .decode_ns = 1000000,
                  .load_cap = 1.5,
                  .vnodes = 160,
                  .affinity_blocks = 1,
                  .random_seed = 1};
    return m;
}

static fl_result run(const fl_log *log, const kvp_config *kc, int policy, uint32_t n,
                     uint32_t capacity, fl_model m)
{
    fl_sim_config sc = {"test", n, policy, capacity, kc, m, true, true, NULL, NULL};
    fl_result r;
    int rc = fl_sim_run(log, &sc, &r, err, sizeof err);
    cr_assert_eq(rc, FL_OK, "%s", err);
    return r;
}

/* What one policy must do on the hand fixture. */
typedef struct expect {
    uint32_t replica[6]; /* where L1..L6 go */
    uint32_t hit[6];     /* prompt tokens reused */
    fl_time ttft_ms[6];  /* start - arrival + prefill */
    fl_time busy_ms[2];  /* per replica */
    fl_time p50_ms, p99_ms;
} expect;

static void check_expect(const fl_result *r, const expect *e, const char *what)
{
    uint64_t hits = 0;
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(r->per_req[i].replica, e->replica[i], "%s: L%d on replica %u, not %u", what,
                     i + 1, r->per_req[i].replica, e->replica[i]);
        cr_assert_eq(r->per_req[i].hit, e->hit[i], "%s: L%d hit %u, not %u", what, i + 1,
                     r->per_req[i].hit, e->hit[i]);
        cr_assert_eq(r->per_req[i].ttft, e->ttft_ms[i] * MS, "%s: L%d TTFT %lld ns, not %lld ms",
                     what, i + 1, (long long)r->per_req[i].ttft, (long long)e->ttft_ms[i]);
        hits += e->hit[i];
    }
    cr_assert_eq(r->n_requests, 6);
    cr_assert_eq(r->n_prompt_tokens, 78);
    cr_assert_eq(r->n_hit_tokens, hits, "%s", what);
    cr_assert_eq(r->replicas[0].busy, e->busy_ms[0] * MS, "%s: busy %lld", what,
                 (long long)r->replicas[0].busy);
    cr_assert_eq(r->replicas[1].busy, e->busy_ms[1] * MS, "%s: busy %lld", what,
                 (long long)r->replicas[1].busy);
    double busy_max = (double)(e->busy_ms[0] > e->busy_ms[1] ? e->busy_ms[0] : e->busy_ms[1]);
    double mean = (double)(e->busy_ms[0] + e->busy_ms[1]) / 2.0;
    cr_assert_float_eq(r->imbalance, busy_max / mean, 1e-12, "%s", what);
    cr_assert_eq(r->ttft_p50, e->p50_ms * MS, "%s: p50 %lld", what, (long long)r->ttft_p50);
    cr_assert_eq(r->ttft_p99, e->p99_ms * MS, "%s: p99 %lld", what, (long long)r->ttft_p99);
    cr_assert_eq(r->n_oversize, 0);
    cr_assert_eq(r->n_block_waits, 0);
}

/* Round-robin: 0 1 0 1 0 1. Replica 0: L1 0..29 (AB cached at 9); L3 waits 20..29, cold:
 * TTFT 9 + 9 = 18, ends 40; L5 finds AB: hit 8, prefill 9. Replica 1: L2 cold 13; L4 cold
 * (ABE is not CDF) 13; L6 finds CDF: hit 12, prefill 5. Busy 29+11+11 = 51 and 15+15+7 =
 * 37. TTFTs sorted 5 9 9 13 13 18: p50 (rank 3) 9, p99 (rank 6) 18. */
static const expect hand_rr = {
    {0, 1, 0, 1, 0, 1}, {0, 0, 0, 0, 8, 12}, {9, 13, 18, 13, 9, 5}, {51, 37}, 9, 18};

/* Random, seed 1: splitmix64's first outputs are odd, odd, even, odd, odd, even, so 1 1 0 1 1
 * 0. Replica 1: L1 0..29; L2 waits 10..29, hit AB 8, prefill 5: TTFT 24, ends 36; L4 waits
 * 30..36, cold 13: TTFT 19, ends 51; L5 hit ABE 12: 5. Replica 0: L3 cold 9; L6 finds CD
 * (not F): hit 8, prefill 9. Busy 11+11 = 22 and 29+7+15+7 = 58. Sorted 5 9 9 9 19 24. */
static const expect hand_random = {
    {1, 1, 0, 1, 1, 0}, {0, 8, 0, 0, 12, 8}, {9, 24, 9, 19, 5, 9}, {22, 58}, 9, 24};

/* Least-loaded (outstanding work W, ties in turn from the replica after the last pick):
 * L1 -> 0 (all idle, first turn). L2 at 10: W = 19 ms and 0 -> 1, cold 13, ends 25. L3 at
 * 20: W = 9 and 5 -> 1, waits to 25, cold: TTFT 5 + 9 = 14, ends 36. L4 at 30: W = 0 (L1
 * ended at 29) and 6 -> 0, which holds AB only: cold 13, ends 45. L5 at 100: both idle,
 * turn after 0 -> 1, which holds ABE: hit 12. L6 at 110: both idle, turn after 1 -> 0,
 * which holds CDF (from L4): hit 12. Busy 29+15+7 = 51 and 15+11+7 = 33. */
static const expect hand_least = {
    {0, 1, 1, 0, 1, 0}, {0, 0, 0, 0, 12, 12}, {9, 13, 14, 13, 5, 5}, {51, 33}, 9, 14};

/* Cache-aware (longest cached prefix, then W, then turns): L1 -> 0. L2 at 10: replica 0
 * committed AB at 9 -> 0 (score 2 against 0), waits 10..29, hit 8, prefill 5: TTFT 24,
 * commits ABE at 34. L3 at 20: scores 0 and 0, W = 16 (L2's estimate 7 + 9 left of L1) and
 * 0 -> 1, cold 9, commits CD at 29, ends 31. L4 at 30: replica 1 holds CD -> 1, waits to
 * 31, hit 8, prefill 5: TTFT 6. L5 -> 0 (ABE, score 3): hit 12. L6 -> 1 (CDF): hit 12.
 * Busy 29+7+7 = 43 and 11+7+7 = 25. Sorted 5 5 6 9 9 24. */
static const expect hand_cache = {
    {0, 0, 1, 1, 0, 1}, {0, 8, 0, 8, 12, 12}, {9, 24, 9, 6, 5, 5}, {43, 25}, 6, 24};

static void hand_case(int policy, double load_cap, const expect *e, const char *what)
{
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *log = load_as(data("fleet_hand.jsonl"), 4, &kc);
    fl_model m = hand_model();
    m.load_cap = load_cap;
    fl_result r = run(log, &kc, policy, 2, 16, m);
    check_expect(&r, e, what);
    fl_result_free(&r);
    fl_log_free(log);
}

Test(fleet, hand_round_robin)
{
    hand_case(FL_ROUND_ROBIN, 1.5, &hand_rr, "round-robin");
}

Test(fleet, hand_random)
{
    hand_case(FL_RANDOM, 1.5, &hand_random, "random");
}

Test(fleet, hand_least_loaded)
{
    hand_case(FL_LEAST_LOADED, 1.5, &hand_least, "least-loaded");
}

Test(fleet, hand_cache_aware)
{
    hand_case(FL_CACHE_AWARE, 1.5, &hand_cache, "cache-aware");
}

/* Cache-aware-cap at 1.5: L2 at 10 sees W = 19 and 0, mean 9.5, cap 14.25: replica 0 is
 * skipped despite AB, so L2 goes cold to 1. L3: W 9 and 5, cap 10.5, both qualify, scores
 * 0 and 0 -> 1 by W. L4 at 30: W 0 and 6, cap 4.5: replica 1 (which holds CD) is skipped
 * -> 0. L5: both idle, ABE on 1 (3) beats AB on 0 (2) -> 1. L6: CDF on 0 (3) beats CD on 1
 * (2) -> 0. Hence the least-loaded outcome. At 3.0 nothing is ever skipped here (L2: cap
 * 28.5 > 19; L4: W 0 and 6... replica 1 has 6 <= 9) and it is cache-aware's. */
Test(fleet, hand_cache_aware_cap)
{
    hand_case(FL_CACHE_CAP, 1.5, &hand_least, "cache-aware-cap 1.5");
    hand_case(FL_CACHE_CAP, 3.0, &hand_cache, "cache-aware-cap 3");
}

/* The block keys of the hand fixture's first blocks, from kvp_hash_blocks (the xxh3
 * profile, seed 0, no namespace): what the affinity ring hashes. */
static uint64_t first_block_key(const uint32_t *tokens)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_key root, key;
    size_t n = 0;
    cr_assert_eq(kvp_namespace_key(0, &ns, &root), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(0, root, tokens, 4, 4, &key, 1, &n), KVP_OK);
    cr_assert_eq(n, 1);
    return key.lo;
}

/* Affinity: session X (L1 L2 L5, first block A) goes where the ring puts A's key, session Y
 * (L3 L4 L6, block C) where it puts C's. With seed 1 they land apart, and the timeline is
 * cache-aware's: X on one replica (L2 waits for L1, hit 8, TTFT 24; L5 hit 12), Y on the
 * other (L3 cold 9; L4 waits to 31, hit 8, TTFT 6; L6 hit 12). */
Test(fleet, hand_affinity)
{
    static const uint32_t a[] = {1, 2, 3, 4}, c[] = {9, 10, 11, 12};
    fl_ring *ring = fl_ring_new(2, 160, 1);
    cr_assert_not_null(ring);
    uint32_t x = fl_ring_pick(ring, first_block_key(a)), y = fl_ring_pick(ring, first_block_key(c));
    fl_ring_free(ring);
    cr_assert_neq(x, y, "the fixture expects the two sessions on different replicas");
    expect e = {{x, x, y, y, x, y}, {0, 8, 0, 8, 12, 12}, {9, 24, 9, 6, 5, 5}, {0, 0}, 6, 24};
    e.busy_ms[x] = 29 + 7 + 7;
    e.busy_ms[y] = 11 + 7 + 7;
    hand_case(FL_AFFINITY, 1.5, &e, "affinity");
}

/* vllm-sha256-cbor keys cannot continue a request's chain from a kvp_key, so the simulation
 * acquires and commits with the token forms: the figures must not change. */
Test(fleet, hand_vllm_sha256_token_forms)
{
    kvp_config kc = hash_cfg(KVP_HASH_VLLM_SHA256);
    fl_log *log = load_as(data("fleet_hand.jsonl"), 4, &kc);
    fl_result r = run(log, &kc, FL_CACHE_AWARE, 2, 16, hand_model());
    check_expect(&r, &hand_cache, "cache-aware, vllm-sha256-cbor");
    fl_result_free(&r);
    fl_log_free(log);
}

/* Concurrency 2 on one replica: L2 starts at its arrival (10) beside L1 (0..29), which
 * committed AB at 9: hit 8, prefill 5, TTFT 5, ends 17. L3 at 20 takes the slot L2 freed:
 * cold 9, commits CD at 29, ends 31. L4 at 30 finds one slot free (L1 ended at 29) and CD:
 * hit 8, TTFT 5. L5 and L6 run alone: hit 12 each (ABE from L2, CDF from L4), TTFT 5. */
Test(fleet, hand_concurrency_two)
{
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *log = load_as(data("fleet_hand.jsonl"), 4, &kc);
    fl_model m = hand_model();
    m.concurrency = 2;
    fl_result r = run(log, &kc, FL_ROUND_ROBIN, 1, 16, m);
    static const uint32_t hit[6] = {0, 8, 0, 8, 12, 12};
    static const fl_time ttft[6] = {9, 5, 9, 5, 5, 5}, start[6] = {0, 10, 20, 30, 100, 110};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(r.per_req[i].hit, hit[i], "L%d hit %u", i + 1, r.per_req[i].hit);
        cr_assert_eq(r.per_req[i].ttft, ttft[i] * MS, "L%d", i + 1);
        cr_assert_eq(r.per_req[i].start, start[i] * MS, "L%d", i + 1);
    }
    cr_assert_eq(r.replicas[0].busy, (29 + 7 + 11 + 7 + 7 + 7) * MS);
    fl_result_free(&r);
    fl_log_free(log);
}

/* A pool that in-flight requests fill: 8 blocks, concurrency 2. L1 holds ceil(29/4) = 8
 * blocks until 29, so L2 (arriving at 10, 4 blocks) cannot start before L1 ends although a
 * slot is free: one postponed start, TTFT = 29 - 10 + 5 (AB hit) = 24. */
Test(fleet, pinned_blocks_postpone_a_start)
{
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *log = load_as(data("fleet_hand.jsonl"), 4, &kc);
    fl_model m = hand_model();
    m.concurrency = 2;
    fl_result r = run(log, &kc, FL_ROUND_ROBIN, 1, 8, m);
    cr_assert_eq(r.per_req[1].start, 29 * MS);
    cr_assert_eq(r.per_req[1].hit, 8);
    cr_assert_eq(r.per_req[1].ttft, 24 * MS);
    cr_assert_geq(r.n_block_waits, 1);
    cr_assert_eq(r.n_oversize, 0);
    fl_result_free(&r);
    /* 7 blocks: L1 (8 blocks with its output) can never fit and is served without the cache;
     * L2 then finds nothing of AB. */
    r = run(log, &kc, FL_ROUND_ROBIN, 1, 7, m);
    cr_assert(r.per_req[0].oversize);
    cr_assert_eq(r.n_oversize, 1);
    cr_assert_eq(r.per_req[1].hit, 0);
    fl_result_free(&r);
    fl_log_free(log);
}

/* Lines without a timestamp arrive --interarrival-ms after the previous line (the first at
 * 0); a timestamp resets the clock. fleet_no_ts.jsonl: none, none, 1000 ms, none. */
Test(fleet, arrivals_without_timestamps)
{
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *log = load_as(data("fleet_no_ts.jsonl"), 4, &kc);
    static const fl_time want[] = {0, 100, 1000, 1100};
    cr_assert_eq(fl_log_n(log), 4);
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(fl_log_req(log, i)->arrival, want[i] * MS, "line %zu", i + 1);
    cr_assert(!fl_log_all_timestamps(log));
    /* No output tokens given: the default (128) is decoded. */
    cr_assert_eq(fl_log_req(log, 0)->n_output, 128);
    fl_log_free(log);
}

/* ---- the ring and the random stream against independent code ------------------------------ */

static uint64_t ref_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* The owner of h by a linear scan over every point, as the ring's contract states it. */
static uint32_t ref_pick(uint32_t n, uint32_t v, uint64_t seed, uint64_t h)
{
    uint64_t best = UINT64_MAX, first = UINT64_MAX;
    uint32_t owner = 0, first_owner = 0;
    bool found = false;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t k = 0; k < v; k++) {
            uint64_t at = ref_mix(seed ^ ((uint64_t)r << 32 | k));
            if (at >= h && (!found || at < best)) {
                best = at;
                owner = r;
                found = true;
            }
            if (at < first || (at == first && r < first_owner) || (r == 0 && k == 0)) {
                first = at;
                first_owner = r;
            }
        }
    return found ? owner : first_owner;
}

Test(fleet, ring_matches_linear_scan)
{
    fl_ring *ring = fl_ring_new(5, 7, 42);
    cr_assert(fl_ring_check(ring));
    uint64_t h = 1;
    for (int i = 0; i < 2000; i++) {
        h = ref_mix(h);
        cr_assert_eq(fl_ring_pick(ring, h), ref_pick(5, 7, 42, h));
    }
    cr_assert_eq(fl_ring_pick(ring, 0), ref_pick(5, 7, 42, 0));
    cr_assert_eq(fl_ring_pick(ring, UINT64_MAX), ref_pick(5, 7, 42, UINT64_MAX));
    fl_ring_free(ring);
}

/* Adding a fifth replica moves keys only to it, and about a fifth of them. */
Test(fleet, ring_is_consistent)
{
    fl_ring *four = fl_ring_new(4, 160, 1), *five = fl_ring_new(5, 160, 1);
    uint64_t h = 7;
    int moved = 0, per[5] = {0};
    for (int i = 0; i < 20000; i++) {
        h = ref_mix(h);
        uint32_t a = fl_ring_pick(four, h), b = fl_ring_pick(five, h);
        per[b]++;
        if (a != b) {
            cr_assert_eq(b, 4, "a key moved between old replicas");
            moved++;
        }
    }
    cr_assert(moved > 20000 / 5 - 1000 && moved < 20000 / 5 + 1000, "moved %d", moved);
    for (int r = 0; r < 5; r++)
        cr_assert(per[r] > 20000 / 5 / 2, "replica %d owns %d keys", r, per[r]);
    fl_ring_free(four);
    fl_ring_free(five);
}

/* The random policy follows splitmix64 from the seed: replica = output mod N (3 replicas:
 * only the output 0 would be rejected, as 2^64 mod 3 = 1). */
Test(fleet, random_follows_splitmix64)
{
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *log = load_as(data("fleet_hand.jsonl"), 4, &kc);
    for (uint64_t seed = 0; seed < 5; seed++) {
        fl_model m = hand_model();
        m.random_seed = seed;
        fl_result r = run(log, &kc, FL_RANDOM, 3, 16, m);
        uint64_t st = seed;
        for (int i = 0; i < 6; i++) {
            uint64_t z = ref_mix(st);
            st += 0x9e3779b97f4a7c15u;
            cr_assert_eq(r.per_req[i].replica, (uint32_t)(z % 3), "seed %llu, L%d",
                         (unsigned long long)seed, i + 1);
        }
        fl_result_free(&r);
    }
    fl_log_free(log);
}

/* ---- against the replay engine ------------------------------------------------------------ */

/* A random log written to a temporary file: conversations that grow turn by turn (token
 * logs: blocks of 4 tokens from a small alphabet; Mooncake: dense ids), arrivals 0..k ms. */
static void random_log(char path[64], bool mooncake, unsigned seed, int n_req)
{
    snprintf(path, 64, "%s", "/tmp/kvp_fleet_XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    uint64_t rng = seed;
    uint64_t conv[8][40];
    int len[8] = {0};
    uint64_t next_id = 0;
    for (int i = 0; i < n_req; i++) {
        rng = ref_mix(rng);
        int c = (int)(rng % 8);
        if (len[c] < 40 && (len[c] == 0 || rng % 3 != 0))
            conv[c][len[c]++] = mooncake ? next_id++ : (rng >> 8) % 50 + 1;
        int tail = (int)((rng >> 20) % 3);
        fprintf(f, "{\"timestamp\":%d,", i * 3);
        if (mooncake) {
            fprintf(f, "\"input_length\":%d,\"output_length\":%d,\"hash_ids\":[",
                    len[c] * 512 - (tail ? 512 - tail * 100 : 0), (int)(rng % 5));
            for (int k = 0; k < len[c]; k++)
                fprintf(f, "%s%llu", k ? "," : "", (unsigned long long)conv[c][k]);
        } else {
            fprintf(f, "\"tenant\":\"t%d\",\"tokens\":[", c % 2);
            for (int k = 0; k < len[c]; k++)
                fprintf(f, "%s%llu,%d,%d,%d", k ? "," : "", (unsigned long long)conv[c][k], c, k,
                        7);
            for (int k = 0; k < tail; k++)
                fprintf(f, ",%d", 90 + k);
        }
        fprintf(f, "]}\n");
    }
    fclose(f);
}

/* Hit tokens of the replay engine at unbounded capacity (its cold-miss ceiling). */
static uint64_t replay_ceiling(const char *path, uint32_t bs)
{
    rp_sim_config c = {bs, 0, 0, NULL};
    rp_sim *s = rp_sim_new(&c, err, sizeof err);
    cr_assert_not_null(s);
    log_options lo;
    log_options_init(&lo);
    log_reader *rd;
    cr_assert_eq(log_open(path, &lo, &rd, err, sizeof err), 0, "%s", err);
    log_record rec;
    while (log_next(rd, &rec) == LOG_RECORD) {
        rp_request q;
        memset(&q, 0, sizeof q);
        kvp_namespace_init(&q.ns);
        if (rec.tenant)
            q.ns.tenant = kvp_field_str(rec.tenant);
        q.tokens = rec.tokens;
        q.n_tokens = rec.n_tokens;
        q.hash_ids = rec.hash_ids;
        q.n_hash_ids = rec.n_hash_ids;
        q.input_length = rec.input_length;
        cr_assert_eq(rp_sim_add(s, &q, err, sizeof err), RP_OK, "%s", err);
    }
    log_close(rd);
    rp_metrics m;
    cr_assert_eq(rp_sim_eval(s, RP_CAP_INF, &m, NULL), RP_OK);
    rp_sim_free(s);
    return m.n_hit_tokens;
}

/* One replica with instantaneous service and room for everything is the replay engine's
 * unbounded cache: every request starts at its arrival, commits and ends at once, and
 * nothing is evicted. Every policy agrees at N = 1. */
Test(fleet, one_replica_zero_time_is_replay_ceiling)
{
    for (int mooncake = 0; mooncake < 2; mooncake++)
        for (unsigned seed = 1; seed <= 3; seed++) {
            char path[64];
            random_log(path, mooncake, seed, 120);
            uint32_t bs = mooncake ? 512 : 4;
            uint64_t want = replay_ceiling(path, bs);
            kvp_config kc = hash_cfg(KVP_HASH_KEYED);
            memset(kc.hash_key, 7, 32);
            kc.hash_key_len = 32;
            fl_log *log = load_as(path, 4, &kc);
            fl_model m = hand_model();
            m.prefill_ns = m.decode_ns = 0;
            for (int p = 0; p < FL_N_POLICIES; p++) {
                fl_result r = run(log, &kc, p, 1, 4096, m);
                cr_assert_eq(r.n_hit_tokens, want, "%s seed %u %s: %llu, replay %llu",
                             mooncake ? "mooncake" : "tokens", seed, fl_policy_name(p),
                             (unsigned long long)r.n_hit_tokens, (unsigned long long)want);
                cr_assert_eq(r.ttft_p99, 0);
                fl_result_free(&r);
            }
            fl_log_free(log);
            remove(path);
        }
}

/* Random logs on small, busy fleets with the invariant checker after every event: pools
 * that in-flight requests fill, requests larger than a pool, queues. Per-request outcomes
 * must add up to the totals and respect the model. */
Test(fleet, random_logs_under_the_checker)
{
    uint64_t waits = 0, oversize = 0;
    for (int mooncake = 0; mooncake < 2; mooncake++)
        for (unsigned seed = 1; seed <= 2; seed++) {
            char path[64];
            random_log(path, mooncake, seed, 80);
            kvp_config kc = hash_cfg(KVP_HASH_XXH3);
            fl_log *log = load_as(path, 4, &kc);
            uint32_t cap = mooncake ? 12 : 20;
            fl_model m = hand_model();
            m.concurrency = 3;
            m.prefill_ns = mooncake ? 2000 : 200000;
            m.decode_ns = 300000;
            for (uint32_t n = 1; n <= 3; n += 2)
                for (int p = 0; p < FL_N_POLICIES; p++) {
                    fl_result r = run(log, &kc, p, n, cap, m);
                    uint64_t hits = 0, reqs = 0;
                    for (size_t i = 0; i < fl_log_n(log); i++) {
                        const fl_req *q = fl_log_req(log, i);
                        const fl_req_outcome *o = &r.per_req[i];
                        hits += o->hit;
                        cr_assert_lt(o->replica, n);
                        cr_assert_geq(o->start, q->arrival);
                        cr_assert_lt(o->hit, q->n_prompt);
                        cr_assert(!o->oversize || o->hit == 0);
                        cr_assert_eq(o->ttft, o->start - q->arrival +
                                                  (fl_time)(m.prefill_ns * (q->n_prompt - o->hit)));
                    }
                    for (uint32_t k = 0; k < n; k++)
                        reqs += r.replicas[k].n_requests;
                    cr_assert_eq(hits, r.n_hit_tokens);
                    cr_assert_eq(reqs, fl_log_n(log));
                    waits += r.n_block_waits;
                    oversize += r.n_oversize;
                    fl_result_free(&r);
                }
            fl_log_free(log);
            remove(path);
        }
    cr_assert_gt(waits, 0, "no start was ever postponed: the test does not cover it");
    cr_assert_gt(oversize, 0, "no request was oversize: the test does not cover it");
}

/* ---- the router index ---------------------------------------------------------------------- */

static fl_result run_ix(const fl_log *log, const kvp_config *kc, int policy, uint32_t n,
                        uint32_t capacity, fl_model m, const fl_index_config *ic)
{
    fl_sim_config sc = {"test", n, policy, capacity, kc, m, true, true, ic, NULL};
    fl_result r;
    int rc = fl_sim_run(log, &sc, &r, err, sizeof err);
    cr_assert_eq(rc, FL_OK, "%s", err);
    return r;
}

/* The index's run is the oracle's, request by request and in every total. */
static void same_runs(const fl_result *o, const fl_result *x, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        const fl_req_outcome *a = &o->per_req[i], *b = &x->per_req[i];
        cr_assert(a->replica == b->replica && a->hit == b->hit && a->start == b->start &&
                      a->ttft == b->ttft && a->oversize == b->oversize,
                  "%s: request %zu: oracle replica %u hit %u, index replica %u hit %u", what, i,
                  a->replica, a->hit, b->replica, b->hit);
    }
    cr_assert_eq(o->n_hit_tokens, x->n_hit_tokens, "%s", what);
    cr_assert_eq(o->ttft_p50, x->ttft_p50, "%s", what);
    cr_assert_eq(o->ttft_p99, x->ttft_p99, "%s", what);
    cr_assert_eq(o->end, x->end, "%s", what);
    cr_assert_eq(o->n_block_waits, x->n_block_waits, "%s", what);
    cr_assert_eq(o->n_oversize, x->n_oversize, "%s", what);
    cr_assert(o->imbalance == x->imbalance, "%s", what);
    cr_assert_eq(o->index.n_scores, n, "%s", what);
    cr_assert_eq(x->index.n_scores, n, "%s", what);
}

/* Both cache-aware policies on log, fleets of 1..3, oracle against the index of ic. Returns
 * the events the index applied. */
static uint64_t index_equals_oracle(const fl_log *log, const kvp_config *kc, uint32_t cap,
                                    fl_model m, const fl_index_config *ic, const char *what)
{
    uint64_t events = 0;
    int policies[] = {FL_CACHE_AWARE, FL_CACHE_CAP};
    for (uint32_t n = 1; n <= 3; n++)
        for (int k = 0; k < 2; k++) {
            fl_result o = run(log, kc, policies[k], n, cap, m);
            fl_result x = run_ix(log, kc, policies[k], n, cap, m, ic);
            char w[256];
            snprintf(w, sizeof w, "%s, %u replicas, %s, index %s", what, n,
                     fl_policy_name(policies[k]), fl_index_name(ic->mode));
            same_runs(&o, &x, fl_log_n(log), w);
            cr_assert_eq(o.index.mode, FL_INDEX_ORACLE);
            cr_assert_eq(x.index.mode, ic->mode);
            cr_assert_eq(o.index.n_applies, 0);
            cr_assert_eq(x.index.n_applies > 0, x.index.n_events > 0, "%s", w);
            cr_assert_geq(x.index.n_blocks, x.index.n_events, "%s", w);
            cr_assert_geq(x.index.score_max_ns, x.index.score_p99_ns);
            cr_assert_geq(x.index.score_p99_ns, x.index.score_p50_ns);
            events += x.index.n_events;
            fl_result_free(&o);
            fl_result_free(&x);
        }
    return events;
}

/* Other policies never ask for prefixes: no index is made, their figures do not move. */
static void others_unchanged(const fl_log *log, const kvp_config *kc, uint32_t cap, fl_model m,
                             const fl_index_config *ic)
{
    for (int p = 0; p < FL_CACHE_AWARE; p++) {
        fl_result o = run(log, kc, p, 2, cap, m);
        fl_result x = run_ix(log, kc, p, 2, cap, m, ic);
        cr_assert_eq(o.n_hit_tokens, x.n_hit_tokens);
        cr_assert_eq(x.index.n_scores, 0);
        cr_assert_eq(x.index.n_applies, 0);
        fl_result_free(&o);
        fl_result_free(&x);
    }
}

/* The fixtures and random logs (pools small enough to evict, so BlockRemoved is exercised)
 * against the index of ic. */
static void index_cases(fl_index_config *ic, int n_seeds)
{
    if (!fl_index_available())
        cr_skip_test("built without libkvprefix-events");
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *hand = load_as(data("fleet_hand.jsonl"), 4, &kc);
    cr_assert_gt(index_equals_oracle(hand, &kc, 16, hand_model(), ic, "hand"), 0);
    cr_assert_gt(index_equals_oracle(hand, &kc, 8, hand_model(), ic, "hand, 8 blocks"), 0);
    others_unchanged(hand, &kc, 16, hand_model(), ic);
    fl_log_free(hand);
    kvp_config vc = hash_cfg(KVP_HASH_VLLM_SHA256);
    hand = load_as(data("fleet_hand.jsonl"), 4, &vc);
    cr_assert_gt(index_equals_oracle(hand, &vc, 16, hand_model(), ic, "hand, vllm-sha256"), 0);
    fl_log_free(hand);
    fl_log *trace = load_as(data("fleet_trace.jsonl"), 4, &kc);
    cr_assert_gt(index_equals_oracle(trace, &kc, 8, hand_model(), ic, "Mooncake fixture"), 0);
    fl_log_free(trace);
    for (int mooncake = 0; mooncake < 2; mooncake++)
        for (int seed = 1; seed <= n_seeds; seed++) {
            char path[64], what[64];
            random_log(path, mooncake, (unsigned)seed, 80);
            fl_log *log = load_as(path, 4, &kc);
            fl_model m = hand_model();
            m.concurrency = 3;
            m.prefill_ns = mooncake ? 2000 : 200000;
            m.decode_ns = 300000;
            snprintf(what, sizeof what, "random %s log %d", mooncake ? "Mooncake" : "token", seed);
            /* Token lines decode 128 tokens (32 blocks) by default: 60 blocks hold most. */
            cr_assert_gt(index_equals_oracle(log, &kc, mooncake ? 12 : 60, m, ic, what), 0);
            fl_log_free(log);
            remove(path);
        }
}

Test(fleet_index, memory_index_routes_as_the_oracle)
{
    fl_index_config ic = {FL_INDEX_MEMORY, NULL, NULL, 0};
    index_cases(&ic, 3);
}

/* Two requests for the same 2 blocks, 100 ms apart, on 2 replicas: the first goes to
 * replica 0 and commits its 2 blocks 9 ms later. The oracle sends the second to replica 0 (8 tokens
 * hit). An index whose events arrive 50 ms late still does (it learned at 59 ms); one 500 ms
 * late has seen nothing at 100 ms and sends it to the idle replica 1, where nothing is hit. */
Test(fleet_index, delayed_events_lag)
{
    if (!fl_index_available())
        cr_skip_test("built without libkvprefix-events");
    char path[] = "/tmp/kvp_fleet_delayXXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"timestamp\":0,\"tokens\":[1,2,3,4,5,6,7,8,9],\"output_tokens\":[1]}\n"
               "{\"timestamp\":100,\"tokens\":[1,2,3,4,5,6,7,8,10],\"output_tokens\":[1]}\n");
    fclose(f);
    kvp_config kc = hash_cfg(KVP_HASH_XXH3);
    fl_log *log = load_as(path, 4, &kc);
    static const struct {
        fl_time delay;
        uint32_t replica, hit;
        uint64_t events, blocks;
    } cases[] = {{0, 0, 8, 1, 2}, {50 * MS, 0, 8, 1, 2}, {500 * MS, 1, 0, 2, 4}};
    for (size_t c = 0; c < 3; c++) {
        fl_index_config ic = {FL_INDEX_MEMORY, NULL, NULL, cases[c].delay};
        fl_result x = run_ix(log, &kc, FL_CACHE_AWARE, 2, 16, hand_model(), &ic);
        cr_assert_eq(x.per_req[0].replica, 0);
        cr_assert_eq(x.per_req[1].replica, cases[c].replica, "delay %lld ms",
                     (long long)(cases[c].delay / MS));
        cr_assert_eq(x.per_req[1].hit, cases[c].hit);
        /* Every event is applied by the end, late or not: one BlockStored per commit that
         * stored anything (a full hit on replica 0 stores nothing). */
        cr_assert_eq(x.index.n_events, cases[c].events);
        cr_assert_eq(x.index.n_blocks, cases[c].blocks);
        fl_result_free(&x);
    }
    fl_log_free(log);
    remove(path);
}

/* The collector and the queue by hand: chains merge into one BlockStored, removals into one
 * BlockRemoved, tokens are kept up to the last non-zero one, the batches reach the router,
 * and fl_index_check catches each kind of corruption of that state. */
Test(fleet_index, collector_and_checker)
{
    if (!fl_index_available())
        cr_skip_test("built without libkvprefix-events");
    fl_index_config ic = {FL_INDEX_MEMORY, NULL, NULL, 5 * MS};
    fl_index *x = NULL;
    cr_assert_eq(fl_index_new(&ic, 2, 4, &x, err, sizeof err), FL_OK, "%s", err);
    kvp_config kc;
    kvp_config_init(&kc);
    fl_index_attach(x, 1, &kc);
    uint32_t tok[4] = {7, 8, 0, 0};
    kvp_event a = {.type = KVP_EVENT_STORED,
                   .key = {11, 1},
                   .parent_is_root = true,
                   .tokens = tok,
                   .n_tokens = 4};
    kvp_event b = a, c = {.type = KVP_EVENT_REMOVED, .key = {11, 1}};
    b.key = (kvp_key){22, 2};
    b.parent = a.key;
    b.parent_is_root = false;
    kc.on_event(kc.event_ud, &a);
    kc.on_event(kc.event_ud, &b);
    kc.on_event(kc.event_ud, &c);
    ix_rep *p = &x->reps[1];
    cr_assert_eq(p->n_recs, 2, "one BlockStored of 2 blocks, one BlockRemoved");
    cr_assert_eq(p->recs[0].n_hashes, 2);
    cr_assert_eq(p->n_hashes, 3);
    cr_assert_eq(p->n_tokens, 4, "two kept tokens per stored block");
    cr_assert_eq(x->n_dirty, 1);
    cr_assert(fl_index_check(x));

    /* Each corruption of the collector, then put back. */
    p->n_hashes--;
    cr_assert_not(fl_index_check(x), "hash count");
    p->n_hashes++;
    p->lens[0] = 5; /* more than a block, the total unchanged */
    p->lens[1] = 0;
    p->n_tokens = 5;
    cr_assert_not(fl_index_check(x), "a block longer than block_size");
    p->lens[0] = p->lens[1] = 2;
    p->n_tokens = 4;
    p->lens[2] = 1;
    cr_assert_not(fl_index_check(x), "tokens on a removal");
    p->lens[2] = 0;
    p->recs[1].n_hashes = 0;
    cr_assert_not(fl_index_check(x), "an empty BlockRemoved");
    p->recs[1].n_hashes = 1;
    x->n_dirty = 0;
    cr_assert_not(fl_index_check(x), "a replica with events not listed");
    x->n_dirty = 1;
    cr_assert(fl_index_check(x));

    /* Two steps: two batches, due 5 ms after each. */
    cr_assert_eq(fl_index_step(x, 1 * MS, err, sizeof err), FL_OK, "%s", err);
    kvp_event d = a;
    d.key = (kvp_key){33, 3};
    kc.on_event(kc.event_ud, &d);
    cr_assert_eq(fl_index_step(x, 2 * MS, err, sizeof err), FL_OK, "%s", err);
    cr_assert_eq(x->n_queue - x->head, 2);
    cr_assert_eq(x->queue[x->head].due, 6 * MS);
    cr_assert(fl_index_check(x));
    x->queue[x->head].due = 8 * MS;
    cr_assert_not(fl_index_check(x), "due times out of order");
    x->queue[x->head].due = 6 * MS;
    x->head = x->n_queue + 1;
    cr_assert_not(fl_index_check(x), "head past the end");
    x->head = 0;

    /* Not due yet at 5 ms; the first at 6 ms: block 11 stored then removed, 22 kept. */
    cr_assert_eq(fl_index_sync(x, 5 * MS, err, sizeof err), FL_OK, "%s", err);
    cr_assert_eq(x->n_applies, 0);
    cr_assert_eq(fl_index_sync(x, 6 * MS, err, sizeof err), FL_OK, "%s", err);
    cr_assert_eq(x->n_applies, 1);
    cr_assert_eq(x->n_events, 2);
    cr_assert_eq(x->n_blocks, 3);
    kvp_key keys[2] = {{22, 2}, {11, 1}};
    uint32_t cached[2] = {9, 9};
    uint64_t ns = 0;
    cr_assert_eq(fl_index_score(x, keys, 1, cached, &ns, err, sizeof err), FL_OK, "%s", err);
    cr_assert_eq(cached[0], 0);
    cr_assert_eq(cached[1], 1, "replica 1 holds block 22");
    cr_assert_eq(fl_index_score(x, keys + 1, 1, cached, &ns, err, sizeof err), FL_OK);
    cr_assert_eq(cached[1], 0, "block 11 was removed");
    cr_assert_eq(fl_index_sync(x, INT64_MAX, err, sizeof err), FL_OK, "%s", err);
    cr_assert_eq(x->n_applies, 2);
    cr_assert(fl_index_check(x));
    fl_index_free(x);
}

/* KVP_TEST_REDIS_URL, or skip (fail when KVPREFIX_REDIS_REQUIRED is set). */
static const char *redis_url(void)
{
    const char *url = getenv("KVP_TEST_REDIS_URL");
    if ((url == NULL || *url == '\0') && getenv("KVPREFIX_REDIS_REQUIRED"))
        cr_assert_fail("KVPREFIX_REDIS_REQUIRED is set but KVP_TEST_REDIS_URL is not");
    if (url == NULL || *url == '\0')
        cr_skip_test("KVP_TEST_REDIS_URL is not set (tests/support/with_redis.py sets it)");
    return url;
}

Test(fleet_redis, redis_index_routes_as_the_oracle)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "kvptest-fleet-%ld", (long)getpid());
    fl_index_config ic = {FL_INDEX_REDIS, redis_url(), prefix, 0};
    index_cases(&ic, 1);
}

/* ---- the binary ---------------------------------------------------------------------------- */

static char out[1 << 16], errs[8192];

#define HAND_ARGS "--hash xxh3 --capacity 16 --block-size 4 --prefill-us 1000 --decode-us 1000 "

static int fleet(const char *args)
{
    return cli_run("fleet", args, errs, sizeof errs, out, sizeof out);
}

static const json_t *find_run(const json_t *runs, unsigned n, const char *policy)
{
    size_t i;
    const json_t *r;
    json_array_foreach(runs, i, r)
    {
        if (json_integer_value(json_object_get(r, "replicas")) == n &&
            strcmp(json_string_value(json_object_get(r, "policy")), policy) == 0)
            return r;
    }
    cr_assert_fail("no run %u %s", n, policy);
    return NULL;
}

Test(fleet_cli, json_report_of_the_hand_fixture)
{
    char args[8192];
    snprintf(args, sizeof args, HAND_ARGS "--replicas 2 --json '%s'", data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    const json_t *runs = json_object_get(j, "runs");
    cr_assert_eq(json_array_size(runs), FL_N_POLICIES);
    static const struct {
        const char *policy;
        int hits;
        double p50, p99;
    } want[] = {{"round-robin", 20, 9, 18},  {"random", 28, 9, 24},
                {"least-loaded", 24, 9, 14}, {"affinity", 40, 6, 24},
                {"cache-aware", 40, 6, 24},  {"cache-aware-cap", 24, 9, 14}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const json_t *r = find_run(runs, 2, want[i].policy);
        cr_assert_eq(json_integer_value(json_object_get(r, "hit_tokens")), want[i].hits, "%s",
                     want[i].policy);
        cr_assert_float_eq(json_real_value(json_object_get(r, "ttft_p50_ms")), want[i].p50, 1e-9);
        cr_assert_float_eq(json_real_value(json_object_get(r, "ttft_p99_ms")), want[i].p99, 1e-9);
        cr_assert_eq(json_array_size(json_object_get(r, "per_replica")), 2);
    }
    const json_t *g = json_array_get(json_object_get(j, "gain_cache_aware_over_round_robin"), 0);
    cr_assert_float_eq(json_real_value(json_object_get(g, "hit_rate_pp")), 20.0 / 78 * 100, 1e-4);
    cr_assert_float_eq(json_real_value(json_object_get(g, "hit_rate_ratio")), 2.0, 1e-9);
    cr_assert_float_eq(json_real_value(json_object_get(g, "ttft_p50_speedup")), 1.5, 1e-9);
    json_decref(j);
}

Test(fleet_cli, csv_table_and_plot)
{
    char args[8192], svg[] = "/tmp/kvp_fleet_svgXXXXXX";
    int fd = mkstemp(svg);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(args, sizeof args, HAND_ARGS "--replicas 1,2 --csv --plot '%s' '%s'", svg,
             data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 1 + 2 * FL_N_POLICIES, "%s", out);
    cr_assert(strncmp(out, "replicas,policy,", 16) == 0);
    cr_assert_not_null(strstr(out, "\n2,cache-aware,6,78,40,"), "%s", out);
    FILE *f = fopen(svg, "r");
    cr_assert_not_null(f);
    static char doc[1 << 16];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    doc[n] = '\0';
    fclose(f);
    remove(svg);
    int circles = 0;
    for (const char *p = doc; (p = strstr(p, "<circle")) != NULL; p++)
        circles++;
    cr_assert_eq(circles, 2 * FL_N_POLICIES);
    cr_assert_not_null(strstr(doc, "cache-aware-cap"));
    snprintf(args, sizeof args, HAND_ARGS "--replicas 2 '%s'", data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_assert_not_null(strstr(out, "gain of cache-aware over round-robin"));
    cr_assert_not_null(strstr(out, "+25.6 pp (x2.00)"), "%s", out);
}

Test(fleet_cli, mooncake_trace_and_byte_capacity)
{
    char args[8192];
    snprintf(args, sizeof args, "--capacity 40GiB --model Llama-3.1-8B --replicas 1 --json '%s'",
             data("fleet_trace.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j);
    /* 40 GiB / (512 tokens x 128 KiB per token for Llama-3.1-8B fp16) = 640 blocks. */
    cr_assert_eq(json_integer_value(json_object_get(j, "capacity_blocks")), 640);
    cr_assert_eq(json_integer_value(json_object_get(j, "block_size")), 512);
    cr_assert_eq(json_integer_value(json_object_get(j, "requests")), 4);
    /* One replica, every policy the same: line 2 reuses ids 0 1 (1024 tokens; line 1's
     * third block is partial, so never cached), line 4 reuses 4 (512; line 3 has 600
     * tokens: one full block). */
    size_t i;
    const json_t *r;
    json_array_foreach(json_object_get(j, "runs"), i, r)
    {
        cr_assert_eq(json_integer_value(json_object_get(r, "hit_tokens")), 1536);
    }
    json_decref(j);
}

/* OpenAI bodies are read as replay reads them (approximate token counts). */
Test(fleet_cli, openai_bodies)
{
    char args[8192], path[4096];
    snprintf(path, sizeof path, "%s", data("fleet_hand.jsonl"));
    char *cut = strstr(path, "/fleet/fleet_hand.jsonl");
    cr_assert_not_null(cut);
    snprintf(cut, sizeof path - (size_t)(cut - path), "/replay/openai_chat.jsonl");
    snprintf(args, sizeof args, "--capacity 64 --replicas 1,2 --json '%s'", path);
    cr_assert_eq(fleet(args), 0, "%s", errs);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j);
    cr_assert_str_eq(json_string_value(json_object_get(j, "format")),
                     "OpenAI-style request bodies");
    cr_assert_gt(json_integer_value(json_object_get(j, "requests")), 0);
    json_decref(j);
}

/* Prompt tokens of one OpenAI body under `kvprefix tokenize` with rank file rf: the body is
 * line `line` (1-based) of log, written to a temporary file. */
static json_int_t tokenize_line(const char *rf, const char *log, int line)
{
    char tmp[] = "/tmp/kvp_fleet_bodyXXXXXX", buf[4096], args[8192];
    int fd = mkstemp(tmp);
    cr_assert(fd >= 0);
    FILE *in = fopen(log, "r"), *f = fdopen(fd, "w");
    cr_assert(in != NULL && f != NULL);
    for (int i = 1; fgets(buf, sizeof buf, in); i++)
        if (i == line)
            fputs(buf, f);
    fclose(in);
    cr_assert_eq(fclose(f), 0);
    snprintf(args, sizeof args, "--tokenizer '%s' --json '%s'", rf, tmp);
    int rc = cli_run("tokenize", args, errs, sizeof errs, out, sizeof out);
    remove(tmp);
    cr_assert_eq(rc, 0, "%s", errs);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    json_int_t n = json_integer_value(json_object_get(j, "n_tokens"));
    json_decref(j);
    return n;
}

/* OpenAI bodies counted by a model's rank file (fleet_openai.jsonl, the hand-made rank file
 * bytes.tiktoken: the 256 bytes, "Hi", "er", "us", "user", and a sidecar giving kind cl100k
 * and <|im_start|> 300, <|im_end|> 301): exact counts, no APPROXIMATE mark, the prompt
 * tokens those of `kvprefix tokenize` line by line; the same log with words is marked
 * APPROXIMATE. */
Test(fleet_cli, openai_bodies_with_a_rank_file)
{
    char rf[4096], log[4096], args[16384];
    snprintf(rf, sizeof rf, "%s", data("bytes.tiktoken"));
    snprintf(log, sizeof log, "%s", data("fleet_openai.jsonl"));
    /* Line 1 by hand, ChatML (the default for a cl100k file): <|im_start|> user \n Hi
     * <|im_end|> \n <|im_start|> a s s i s t a n t \n = 17 tokens. */
    cr_assert_eq(tokenize_line(rf, log, 1), 17);
    json_int_t want = 0;
    for (int i = 1; i <= 6; i++)
        want += tokenize_line(rf, log, i);
    snprintf(args, sizeof args,
             "--capacity 64 --block-size 4 --replicas 1,2 --json --tokenizer '%s' '%s'", rf, log);
    cr_assert_eq(fleet(args), 0, "%s", errs);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    cr_expect(json_is_false(json_object_get(j, "approximate_tokens")), "%s", out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "tokenizer")),
                     "cl100k tokenizer (260 ranks), chatml template");
    cr_expect_eq(json_integer_value(json_object_get(j, "requests")), 6);
    cr_expect_eq(json_integer_value(json_object_get(j, "prompt_tokens")), want);
    json_decref(j);
    snprintf(args, sizeof args, "--capacity 64 --block-size 4 --replicas 2 --tokenizer '%s' '%s'",
             rf, log);
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_expect_not_null(strstr(out, "exact: cl100k tokenizer (260 ranks), chatml template"), "%s",
                       out);
    cr_expect_null(strstr(out, "APPROXIMATE"), "%s", out);
    /* --template picks another layout: Mistral's [INST] text, so other counts; [INST] is not
     * one token of this tokenizer, so they are approximate (inopts.h). */
    snprintf(args, sizeof args,
             "--capacity 64 --block-size 4 --replicas 2 --json --tokenizer '%s' --template mistral "
             "'%s'",
             rf, log);
    cr_assert_eq(fleet(args), 0, "%s", errs);
    j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    cr_expect_str_eq(json_string_value(json_object_get(j, "tokenizer")),
                     "the mistral template's \"[INST]\" is 6 tokens of the cl100k tokenizer, "
                     "not one");
    cr_expect(json_is_true(json_object_get(j, "approximate_tokens")), "%s", out);
    cr_expect_neq(json_integer_value(json_object_get(j, "prompt_tokens")), want);
    json_decref(j);
    /* The stand-in: the same log is APPROXIMATE, in the table and the JSON. */
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args,
                 "--capacity 64 --block-size 4 --replicas 2 %s--tokenizer %s '%s'",
                 k ? "--json " : "", k ? "bytes" : "words", log);
        cr_assert_eq(fleet(args), 0, "%s", errs);
        cr_expect_not_null(
            strstr(out, k ? "\"approximate_tokens\": true" : "APPROXIMATE: stand-in 'words'"), "%s",
            out);
    }
    /* A token-id log says nothing of tokenizers, and is not approximate. */
    snprintf(args, sizeof args, "--capacity 64 --replicas 2 --json --tokenizer '%s' '%s'", rf,
             data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_expect_not_null(strstr(out, "\"approximate_tokens\": false"), "%s", out);
    cr_expect_null(strstr(out, "\"tokenizer\""), "%s", out);
}

/* The tokenizer flags' mistakes read as replay's: a missing rank file is bad input (1),
 * --tokenizer-kind without a file and an unknown template are usage errors (2). */
Test(fleet_cli, tokenizer_errors)
{
    char args[8192];
    snprintf(args, sizeof args, "--capacity 64 --tokenizer /nonexistent/r.tiktoken '%s'",
             data("fleet_openai.jsonl"));
    cr_assert_eq(fleet(args), 1, "%s", errs);
    cr_expect_not_null(strstr(errs, "kvprefix fleet: --tokenizer: /nonexistent/r.tiktoken"), "%s",
                       errs);
    cr_expect_not_null(strstr(errs, "cannot open"), "%s", errs);
    cr_expect_eq(out[0], '\0');
    snprintf(args, sizeof args, "--capacity 64 --tokenizer-kind llama3 '%s'",
             data("fleet_openai.jsonl"));
    cr_assert_eq(fleet(args), 2);
    cr_expect_not_null(strstr(errs, "--tokenizer-kind needs --tokenizer FILE"), "%s", errs);
    snprintf(args, sizeof args, "--capacity 64 --template jinja '%s'", data("fleet_openai.jsonl"));
    cr_assert_eq(fleet(args), 2);
    cr_expect_not_null(strstr(errs, "--template: 'jinja' is not one of model, llama3, chatml"),
                       "%s", errs);
}

/* A run is a pure function of its input and options: the default keyed profile's key comes
 * from --random-seed, not from a random source, so even the affinity ring (which hashes
 * block keys) places prefixes the same way every time. */
Test(fleet_cli, runs_are_reproducible)
{
    static char first[sizeof out];
    char args[8192];
    snprintf(args, sizeof args, "--capacity 16 --block-size 4 --replicas 1,2,3 --csv '%s'",
             data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    memcpy(first, out, sizeof out);
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_assert_str_eq(out, first);
}

/* Bad input: exit 1 with "FILE:LINE: what is wrong". */
static void bad_input(const char *fixture, const char *extra, int line, const char *what)
{
    char args[8192], prefix[4200];
    snprintf(args, sizeof args, "--capacity 16 %s '%s'", extra, data(fixture));
    cr_assert_eq(fleet(args), 1, "%s: %s", fixture, errs);
    snprintf(prefix, sizeof prefix, "%s:%d: ", data(fixture), line);
    cr_assert(strncmp(errs, prefix, strlen(prefix)) == 0, "%s: got '%s'", fixture, errs);
    cr_assert_not_null(strstr(errs, what), "%s: got '%s'", fixture, errs);
    cr_assert_eq(out[0], '\0');
}

Test(fleet_cli, bad_input_names_file_and_line)
{
    bad_input("fleet_bad_order.jsonl", "", 2, "before line 1");
    bad_input("fleet_bad_empty.jsonl", "", 2, "empty");
    bad_input("fleet_bad_mixed.jsonl", "", 2, "a Mooncake line in a token log");
    bad_input("fleet_bad_json.jsonl", "", 3, "invalid JSON");
    bad_input("fleet_bad_output.jsonl", "", 2, "an output of 99999999 tokens");
    bad_input("fleet_hand.jsonl", "--vocab-size 50", 1, "token 8 is 100");
    bad_input("fleet_bad_vllm.jsonl", "--hash vllm-xxhash-cbor", 1, "model");
    bad_input("fleet_trace.jsonl", "--vocab-size 1000", 1, "a Mooncake trace has none");
    char args[8192];
    snprintf(args, sizeof args, "--capacity 16 --sort --replicas 2 --csv '%s'",
             data("fleet_bad_order.jsonl"));
    cr_assert_eq(fleet(args), 0, "--sort accepts the disorder: %s", errs);
    cr_assert_eq(fleet("--capacity 16 /nonexistent/log.jsonl"), 1);
    snprintf(args, sizeof args, "--capacity 1tok '%s'", data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 1);
    cr_assert_not_null(strstr(errs, "less than one block"), "%s", errs);
}

/* The first run's token hit rate of a --json report, with its "eviction" member checked. */
static double eviction_run_rate(const char *args, const char *eviction)
{
    cr_assert_eq(fleet(args), 0, "%s", errs);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert_not_null(j, "%s", out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "eviction")), eviction);
    const json_t *run = json_array_get(json_object_get(j, "runs"), 0);
    cr_assert_not_null(run);
    double rate = json_real_value(json_object_get(run, "token_hit_rate"));
    json_decref(j);
    return rate;
}

/* --eviction sets every replica cache's policy: LRU by default and named, the library's
 * other policies give other figures on the example log (one replica, 400 blocks: about 54%
 * under LRU, 61% under SLRU, 59% under S3-FIFO), and the report names the policy. */
Test(fleet_cli, eviction_policy_per_replica_cache)
{
    const char *gen = getenv("GEN_CHATLOG_BIN");
    if (gen == NULL || *gen == '\0')
        cr_skip_test("GEN_CHATLOG_BIN is not set");
    char log[] = "/tmp/kvp_fleet_evictXXXXXX", cmd[8192], args[8192];
    int fd = mkstemp(log);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(cmd, sizeof cmd, "'%s' -o '%s'", gen, log);
    cr_assert_eq(system(cmd), 0);
    const char *common = "--json --capacity 400 --replicas 1 --policies round-robin";
    snprintf(args, sizeof args, "%s '%s'", common, log);
    double deflt = eviction_run_rate(args, "lru");
    snprintf(args, sizeof args, "%s --eviction lru '%s'", common, log);
    double lru = eviction_run_rate(args, "lru");
    snprintf(args, sizeof args, "%s --eviction slru '%s'", common, log);
    double slru = eviction_run_rate(args, "slru");
    snprintf(args, sizeof args, "%s --eviction s3fifo '%s'", common, log);
    double s3 = eviction_run_rate(args, "s3fifo");
    unlink(log);
    cr_assert(deflt == lru, "default %.6f, --eviction lru %.6f", deflt, lru);
    cr_assert(lru > 0.0 && lru < 1.0 && slru > 0.0 && slru < 1.0 && s3 > 0.0 && s3 < 1.0);
    cr_assert(slru != lru && s3 != lru, "lru %.6f slru %.6f s3fifo %.6f", lru, slru, s3);
}

/* Usage errors: exit 2, the flags.h message shape, nothing on standard output. */
Test(fleet_cli, usage_errors)
{
    static const struct {
        const char *args, *what;
    } cases[] = {
        {"LOG", "give --capacity"},
        {"--capacity 16", "no log given"},
        {"--capacity 16 --replicas 0 LOG", "--replicas: '0' is not an integer in 1..1024"},
        {"--capacity 16 --replicas 4,2 LOG", "must increase"},
        {"--capacity 16 --replicas 2000 LOG", "--replicas"},
        {"--capacity 16 --policies round-robin,bogus LOG", "'bogus' is not one of"},
        {"--capacity 16 --eviction fifo LOG", "--eviction: 'fifo' is not one of lru, slru, s3fifo"},
        {"--capacity 16 --load-cap 0.5 LOG", "--load-cap: '0.5'"},
        {"--capacity 16 --prefill-us abc LOG", "--prefill-us: 'abc'"},
        {"--capacity 16 --decode-us 1.2345 LOG", "--decode-us: '1.2345'"},
        {"--capacity 16 --concurrency 0 LOG", "--concurrency"},
        {"--capacity 16 --vnodes 0 LOG", "--vnodes"},
        {"--capacity 40GiB LOG", "needs --model"},
        {"--capacity 16 --model NoSuchModel LOG", "no preset"},
        {"--capacity lots LOG", "not a positive capacity"},
        {"--capacity 16 --json --csv LOG", "exclude each other"},
        {"--capacity 16 --plot LOG LOG", "also an input"},
        {"--capacity 16 --seed 3 LOG", "--seed"},
        {"--capacity 16 --bogus LOG", "unknown option"},
    };
    char log[4200];
    snprintf(log, sizeof log, "'%s'", data("fleet_hand.jsonl"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* Every "LOG" stands for the hand fixture's path. */
        char args[8192] = "";
        size_t n = 0;
        for (const char *p = cases[i].args; *p && n + sizeof log < sizeof args;)
            if (strncmp(p, "LOG", 3) == 0) {
                n += (size_t)snprintf(args + n, sizeof args - n, "%s", log);
                p += 3;
            } else {
                args[n++] = *p++;
                args[n] = '\0';
            }
        cr_assert_eq(fleet(args), 2, "%s: %s", args, errs);
        cr_assert_not_null(strstr(errs, cases[i].what), "%s: got '%s'", args, errs);
        cr_assert_eq(out[0], '\0', "%s", args);
    }
    cr_assert_eq(fleet("--help"), 0);
    cr_assert_not_null(strstr(out, "Usage: kvprefix fleet"));
}

/* The index options against each other: exit 2 with the reason. */
Test(fleet_cli, index_usage_errors)
{
    if (!fl_index_available())
        cr_skip_test("built without libkvprefix-events");
    static const struct {
        const char *args, *what;
    } cases[] = {
        {"--index bogus", "'bogus' is not one of"},
        {"--index redis", "--index redis needs --redis URL"},
        {"--index memory --redis 127.0.0.1:1", "--redis URL needs --index redis"},
        {"--redis-prefix abc", "--redis-prefix needs --redis URL"},
        {"--redis 127.0.0.1:1 --redis-prefix 'a b'", "is not 1..48 characters"},
        {"--event-delay-ms 5", "--event-delay-ms needs --index memory or redis"},
        {"--index memory --event-delay-ms -1", "--event-delay-ms: '-1'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[8192];
        snprintf(args, sizeof args, "--capacity 16 %s '%s'", cases[i].args,
                 data("fleet_hand.jsonl"));
        cr_assert_eq(fleet(args), 2, "%s: %s", args, errs);
        cr_assert_not_null(strstr(errs, cases[i].what), "%s: got '%s'", args, errs);
        cr_assert_eq(out[0], '\0', "%s", args);
    }
}

/* The JSON of a run through an index: the same figures as the oracle's, plus the index
 * section of each cache-aware run. */
static json_t *index_json_run(const char *index_args, const char *fixture)
{
    char args[8192];
    snprintf(args, sizeof args,
             HAND_ARGS "--replicas 2 --policies round-robin,cache-aware,cache-aware-cap %s "
                       "--json '%s'",
             index_args, data(fixture));
    cr_assert_eq(fleet(args), 0, "%s: %s", args, errs);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    return j;
}

static void json_same_as_oracle(const char *index_args, const char *mode, const char *fixture)
{
    json_t *o = index_json_run("", fixture), *x = index_json_run(index_args, fixture);
    const char *keys[] = {"hit_tokens", "ttft_p50_ms", "ttft_p99_ms", "ttft_mean_ms", "end_s"};
    const char *policies[] = {"round-robin", "cache-aware", "cache-aware-cap"};
    for (int p = 0; p < 3; p++) {
        const json_t *a = find_run(json_object_get(o, "runs"), 2, policies[p]);
        const json_t *b = find_run(json_object_get(x, "runs"), 2, policies[p]);
        for (int k = 0; k < 5; k++)
            cr_assert(json_equal(json_object_get(a, keys[k]), json_object_get(b, keys[k])),
                      "%s %s %s", mode, policies[p], keys[k]);
        const json_t *ix = json_object_get(b, "router_index");
        if (p == 0) {
            cr_assert_null(ix, "round-robin never scores");
            continue;
        }
        cr_assert_not_null(ix, "%s", policies[p]);
        cr_assert_str_eq(json_string_value(json_object_get(ix, "index")), mode);
        cr_assert_eq(json_integer_value(json_object_get(ix, "scores")),
                     json_integer_value(json_object_get(x, "requests")));
        cr_assert_gt(json_integer_value(json_object_get(ix, "events_applied")), 0);
        cr_assert_gt(json_real_value(json_object_get(ix, "applies_per_second")), 0);
        cr_assert_geq(json_real_value(json_object_get(ix, "score_p99_us")),
                      json_real_value(json_object_get(ix, "score_p50_us")));
        if (strcmp(mode, "redis") == 0) {
            cr_assert_geq(json_real_value(json_object_get(ix, "redis_calls_per_score")), 1.0);
            cr_assert_eq(json_integer_value(json_object_get(ix, "fallback_scores")), 0);
            cr_assert_eq(json_integer_value(json_object_get(ix, "fallback_applies")), 0);
        }
        cr_assert_str_eq(json_string_value(json_object_get(
                             json_object_get(find_run(json_object_get(o, "runs"), 2, policies[p]),
                                             "router_index"),
                             "index")),
                         "oracle");
    }
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(x, "model"), "index")),
                     mode);
    json_decref(o);
    json_decref(x);
}

Test(fleet_cli, index_memory_report)
{
    if (!fl_index_available())
        cr_skip_test("built without libkvprefix-events");
    json_same_as_oracle("--index memory", "memory", "fleet_hand.jsonl");
    json_same_as_oracle("--index memory --check", "memory", "fleet_trace.jsonl");
    char args[8192];
    snprintf(args, sizeof args, HAND_ARGS "--replicas 2 --index memory '%s'",
             data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_assert_not_null(strstr(out, "router index: memory"), "%s", out);
    cr_assert_not_null(strstr(out, "REAL wall-clock"), "%s", out);
    cr_assert_not_null(strstr(out, "applies/s"), "%s", out);
    snprintf(args, sizeof args, HAND_ARGS "--replicas 2 '%s'", data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_assert_not_null(strstr(out, "router index: oracle"), "%s", out);
    /* CSV stays free of real timings: the same bytes with or without an index. */
    static char first[sizeof out];
    snprintf(args, sizeof args, HAND_ARGS "--replicas 1,2,3 --csv '%s'", data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    memcpy(first, out, sizeof out);
    snprintf(args, sizeof args, HAND_ARGS "--replicas 1,2,3 --csv --index memory '%s'",
             data("fleet_hand.jsonl"));
    cr_assert_eq(fleet(args), 0, "%s", errs);
    cr_assert_str_eq(out, first);
}

/* A Redis that never answers: every score and apply falls back to the router's local
 * view, so the decisions are still the oracle's; the report and standard error say so. */
Test(fleet_redis, unreachable_redis_falls_back)
{
    (void)redis_url();
    json_t *o = index_json_run("", "fleet_hand.jsonl");
    json_t *x = index_json_run("--redis unix:/nonexistent/kvp-fleet.sock", "fleet_hand.jsonl");
    const json_t *a = find_run(json_object_get(o, "runs"), 2, "cache-aware");
    const json_t *b = find_run(json_object_get(x, "runs"), 2, "cache-aware");
    cr_assert(json_equal(json_object_get(a, "hit_tokens"), json_object_get(b, "hit_tokens")));
    cr_assert(json_equal(json_object_get(a, "ttft_p99_ms"), json_object_get(b, "ttft_p99_ms")));
    const json_t *ix = json_object_get(b, "router_index");
    cr_assert_eq(json_integer_value(json_object_get(ix, "fallback_scores")), 6); /* 6 requests */
    cr_assert_gt(json_integer_value(json_object_get(ix, "fallback_applies")), 0);
    cr_assert_not_null(strstr(errs, "did not always answer: 12 of 12 scores"), "%s", errs);
    json_decref(o);
    json_decref(x);
}

Test(fleet_redis, index_redis_report)
{
    char a[4096];
    snprintf(a, sizeof a, "--redis '%s'", redis_url());
    json_same_as_oracle(a, "redis", "fleet_hand.jsonl");
    json_same_as_oracle(a, "redis", "fleet_trace.jsonl");
    snprintf(a, sizeof a, "--redis '%s' --redis-prefix kvptest-fleet-cli-%ld", redis_url(),
             (long)getpid());
    json_same_as_oracle(a, "redis", "fleet_hand.jsonl");
}

/* The cache-aware and least-loaded decisions as fleet_sim.c made them before they went
 * through kvp_router_rank (the router daemon's ranking), kept here as the reference: scan
 * from the replica after the previous pick, keep the first strictly better one, skip
 * replicas over load_cap x the mean outstanding work (never the least loaded). */
static uint32_t scan_pick(int policy, double load_cap, const uint32_t *cached, const double *work,
                          uint32_t n, uint32_t last)
{
    bool by_cache = policy == FL_CACHE_AWARE || policy == FL_CACHE_CAP;
    double limit = 1e300;
    uint32_t least = 0, best = UINT32_MAX;
    if (policy == FL_CACHE_CAP) {
        double sum = 0.0;
        for (uint32_t r = 0; r < n; r++) {
            sum += work[r];
            least = work[r] < work[least] ? r : least;
        }
        limit = load_cap * (sum / n);
    }
    for (uint32_t k = 1; k <= n; k++) {
        uint32_t r = (last + k) % n;
        if (work[r] > limit && r != least)
            continue;
        bool better =
            best == UINT32_MAX || (by_cache && cached[r] != cached[best] ? cached[r] > cached[best]
                                                                         : work[r] < work[best]);
        if (better)
            best = r;
    }
    return best;
}

/* fl_rank_pick (kvp_router_rank) decides as the scan did, ties and the cap included, on
 * random replicas whose cached blocks and loads come from small sets (many ties). */
Test(fleet, rank_pick_matches_the_scan)
{
    uint64_t x = 12345;
    static const int policies[] = {FL_LEAST_LOADED, FL_CACHE_AWARE, FL_CACHE_CAP};
    uint32_t cached[24];
    double work[24];
    kvp_router_rank_input scratch[24];
    for (int it = 0; it < 3000; it++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        uint32_t n = 1 + (uint32_t)(x >> 59) % 24;
        for (uint32_t r = 0; r < n; r++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            cached[r] = (uint32_t)(x >> 61);
            work[r] = (double)((x >> 40) % 5) * 1000.0;
        }
        fl_model m;
        memset(&m, 0, sizeof m);
        m.load_cap = 1.0 + (double)(it % 4) * 0.5;
        int policy = policies[it % 3];
        uint32_t last = (uint32_t)(x >> 20) % n, pick = UINT32_MAX;
        cr_assert_eq(fl_rank_pick(&m, policy, 8, cached, work, n, last, scratch, &pick), FL_OK);
        cr_assert_eq(pick, scan_pick(policy, m.load_cap, cached, work, n, last),
                     "iteration %d, %u replicas, policy %d", it, n, policy);
    }
    /* The cost mode (--overlap-weight): by hand. 8 blocks; replica 0 holds 8 with work 4000,
     * 1 holds 4 with 0, 2 holds 0 with 0; at 500 ns per block the costs are 4000, 2000 and
     * 4000, at 2000 ns 4000, 8000, 16000. */
    fl_model m;
    memset(&m, 0, sizeof m);
    uint32_t c3[3] = {8, 4, 0}, pick = 9;
    double w3[3] = {4000.0, 0.0, 0.0};
    m.overlap_weight = 500.0;
    cr_assert_eq(fl_rank_pick(&m, FL_CACHE_AWARE, 8, c3, w3, 3, 2, scratch, &pick), FL_OK);
    cr_assert_eq(pick, 1);
    m.overlap_weight = 2000.0;
    cr_assert_eq(fl_rank_pick(&m, FL_CACHE_AWARE, 8, c3, w3, 3, 2, scratch, &pick), FL_OK);
    cr_assert_eq(pick, 0);
    /* A load that is not a finite number >= 0 is refused, not ranked. */
    w3[1] = -1.0;
    cr_assert_eq(fl_rank_pick(&m, FL_CACHE_AWARE, 8, c3, w3, 3, 2, scratch, &pick), FL_EINTERNAL);
}

/* kvp_router_rank's full order: within the cap first, by the key; its argument checks. */
Test(fleet, router_rank_order_and_errors)
{
    kvp_router_rank_config rc;
    kvp_router_rank_config_init(&rc);
    rc.load_cap = 1.5;
    /* loads 12, 1, 2 (mean 5, limit 7.5): replica 0 is over the cap. */
    kvp_router_rank_input in[3] = {{8, 12}, {4, 1}, {0, 2}};
    uint32_t order[3];
    size_t n = 0, within = 0;
    cr_assert_eq(kvp_router_rank(&rc, 8, in, 3, order, 3, &n, &within), KVP_OK);
    cr_assert(n == 3 && within == 2 && order[0] == 1 && order[1] == 2 && order[2] == 0);
    /* Equal candidates take turns from start. */
    kvp_router_rank_input eq[3] = {{1, 0}, {1, 0}, {1, 0}};
    rc.start = 2;
    cr_assert_eq(kvp_router_rank(&rc, 8, eq, 3, order, 3, &n, NULL), KVP_OK);
    cr_assert(order[0] == 2 && order[1] == 0 && order[2] == 1);
    cr_assert_eq(kvp_router_rank(&rc, 8, eq, 3, order, 1, &n, NULL), KVP_OK);
    cr_assert(n == 1 && order[0] == 2);
    rc.load_cap = 0.5;
    cr_assert_eq(kvp_router_rank(&rc, 8, eq, 3, order, 3, &n, NULL), KVP_EINVAL);
    rc.load_cap = 0.0;
    rc.overlap_weight = -1.0;
    cr_assert_eq(kvp_router_rank(&rc, 8, eq, 3, order, 3, &n, NULL), KVP_EINVAL);
    rc.overlap_weight = 0.0;
    eq[1].cached = 0.0 / 0.0;
    cr_assert_eq(kvp_router_rank(&rc, 8, eq, 3, order, 3, &n, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_router_rank(NULL, 8, eq, 3, order, 3, &n, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_router_rank(&rc, 8, eq, 0, order, 3, &n, NULL), KVP_OK);
    cr_assert_eq(n, 0);
}
