/*
 * test_replay_tiers.c - `kvprefix replay --tiers` (src/cli/cmd/replay/replay_tiers.c,
 * replay_time.c): the one-pass tier split against an independent simulation of inclusive
 * write-through LRU tiers on random logs, the time model on hand-checked cases, the
 * break-even rule, and the binary's report on a fixture.
 *
 * The independent simulation shares nothing with the engine: each tier is its own array of
 * block ids with last-use stamps, searched linearly; a request looks its blocks up in order
 * and stops at the first one no tier holds, each found block being served by the first tier
 * that holds it; then every tier touches the request's blocks from the last to the first,
 * evicting its least recently used block when full (write-through: every tier sees every
 * block). Nothing there assumes inclusion or stack distances: the test checks that the
 * stack-distance split (rp_sim_scan) gives the same blocks per tier, request by request.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cliutil.h"
#include "kvprefix.h"
#include "replay_sim.h"
#include "replay_tiers.h"
#include "replay_time.h"

static char err[512];

/* ---- the independent simulation ----------------------------------------------------------- */

typedef struct lru_tier {
    uint64_t *id;    /* blocks held */
    uint64_t *stamp; /* their last use */
    size_t n, cap;
} lru_tier;

static long tier_find(const lru_tier *t, uint64_t id)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->id[i] == id)
            return (long)i;
    return -1;
}

static void tier_touch(lru_tier *t, uint64_t id, uint64_t now)
{
    long i = tier_find(t, id);
    if (i >= 0) {
        t->stamp[i] = now;
        return;
    }
    if (t->n == t->cap) {
        size_t old = 0;
        for (size_t j = 1; j < t->n; j++)
            if (t->stamp[j] < t->stamp[old])
                old = j;
        t->id[old] = id;
        t->stamp[old] = now;
        return;
    }
    t->id[t->n] = id;
    t->stamp[t->n++] = now;
}

/* Per request of a random log: its ids and the blocks each tier served. */
typedef struct per_req {
    uint32_t hits[RP_MAX_TIERS];
} per_req;

typedef struct scan_check {
    const per_req *want;
    size_t n_tiers, i;
    int failures;
} scan_check;

static void check_one(void *ctx, const rp_scan_req *q)
{
    scan_check *c = ctx;
    uint32_t prev = 0;
    for (size_t k = 0; k < c->n_tiers; k++) {
        uint32_t cached = q->n_below[k] < q->limit ? q->n_below[k] : q->limit;
        if (cached - prev != c->want[c->i].hits[k])
            c->failures++;
        prev = cached;
    }
    c->i++;
}

/* One random log of hash-id requests (paths in a random 4-ary tree, so prefixes are shared)
 * replayed through the engine once, then checked against the independent simulation at
 * several random tier configurations. */
static void check_random_log(unsigned seed)
{
    srand(seed);
    const uint32_t bs = 4;
    size_t n_req = 150 + (size_t)(rand() % 150);
    uint64_t **ids = calloc(n_req, sizeof *ids);
    size_t *n_ids = calloc(n_req, sizeof *n_ids);
    uint64_t *len = calloc(n_req, sizeof *len);
    cr_assert(ids && n_ids && len);
    rp_sim_config cfg = {bs, 0, 0, NULL};
    rp_sim *s = rp_sim_new(&cfg, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    for (size_t r = 0; r < n_req; r++) {
        n_ids[r] = 1 + (size_t)(rand() % 10);
        ids[r] = malloc(n_ids[r] * sizeof **ids);
        uint64_t node = 1 + (uint64_t)(rand() % 3); /* a few roots */
        for (size_t j = 0; j < n_ids[r]; j++) {
            ids[r][j] = node;
            node = node * 4 + (uint64_t)(rand() % (j < 3 ? 2 : 4));
        }
        len[r] = (uint64_t)(n_ids[r] - 1) * bs + 1 + (uint64_t)(rand() % bs);
        rp_request q;
        memset(&q, 0, sizeof q);
        kvp_namespace_init(&q.ns);
        q.hash_ids = ids[r];
        q.n_hash_ids = n_ids[r];
        q.input_length = len[r];
        q.line_no = r + 1;
        cr_assert_eq(rp_sim_add(s, &q, err, sizeof err), RP_OK, "%s", err);
    }
    cr_assert(rp_sim_check(s));

    for (int trial = 0; trial < 6; trial++) {
        size_t K = 1 + (size_t)(rand() % RP_MAX_TIERS);
        uint64_t cap[RP_MAX_TIERS];
        cap[0] = 1 + (uint64_t)(rand() % 12);
        for (size_t k = 1; k < K; k++)
            cap[k] = cap[k - 1] + 1 + (uint64_t)(rand() % (k * 40));
        /* Step 1: the independent simulation. */
        lru_tier t[RP_MAX_TIERS];
        for (size_t k = 0; k < K; k++) {
            t[k].id = malloc(cap[k] * sizeof(uint64_t));
            t[k].stamp = malloc(cap[k] * sizeof(uint64_t));
            t[k].n = 0;
            t[k].cap = cap[k];
        }
        per_req *want = calloc(n_req, sizeof *want);
        uint64_t now = 0, tot[RP_MAX_TIERS] = {0}, prompt = 0;
        for (size_t r = 0; r < n_req; r++) {
            size_t n_full = (size_t)(len[r] / bs), limit = (size_t)((len[r] - 1) / bs);
            for (size_t j = 0; j < n_full && j < limit; j++) {
                size_t k = 0;
                while (k < K && tier_find(&t[k], ids[r][j]) < 0)
                    k++;
                if (k == K)
                    break;
                want[r].hits[k]++;
                tot[k] += bs;
            }
            prompt += len[r];
            for (size_t j = n_full; j-- > 0;) {
                now++;
                for (size_t k = 0; k < K; k++)
                    tier_touch(&t[k], ids[r][j], now);
            }
        }
        /* Step 2: the one-pass split, request by request. */
        scan_check c = {want, K, 0, 0};
        cr_assert_eq(rp_sim_scan(s, cap, K, check_one, &c), RP_OK);
        cr_assert_eq(c.i, n_req);
        cr_assert_eq(c.failures, 0, "seed %u trial %d: %d requests differ", seed, trial,
                     c.failures);
        /* Step 3: the totals of rp_tiers_figs, with every tier paying (loaded = hit). */
        rp_time_model tm;
        memset(&tm, 0, sizeof tm);
        tm.prefill_tok_s = 1000;
        tm.block_size = bs;
        tm.block_bytes = 1;
        tm.n_tiers = K;
        for (size_t k = 1; k < K; k++)
            tm.bw_bytes_s[k] = 1e12;
        rp_tier_figs f;
        cr_assert_eq(rp_tiers_figs(s, &tm, cap, K, &f), RP_OK);
        cr_assert_eq(f.n_prompt_tokens, prompt);
        cr_assert_eq(f.n_requests, n_req);
        for (size_t k = 0; k < K; k++) {
            cr_assert_eq(f.hit_tokens[k], tot[k], "seed %u tier %zu", seed, k);
            cr_assert_eq(f.loaded_tokens[k], tot[k]);
        }
        /* The whole stack equals one LRU cache of the last tier's capacity. */
        rp_metrics m;
        cr_assert_eq(rp_sim_eval(s, cap[K - 1], &m, NULL), RP_OK);
        uint64_t sum = 0;
        for (size_t k = 0; k < K; k++)
            sum += f.hit_tokens[k];
        cr_assert_eq(sum, m.n_hit_tokens);
        for (size_t k = 0; k < K; k++) {
            free(t[k].id);
            free(t[k].stamp);
        }
        free(want);
    }
    for (size_t r = 0; r < n_req; r++)
        free(ids[r]);
    free(ids);
    free(n_ids);
    free(len);
    rp_sim_free(s);
}

Test(replay_tiers, one_pass_split_equals_independent_tier_simulation)
{
    for (unsigned seed = 1; seed <= 40; seed++)
        check_random_log(seed);
}

/* The knee is the least capacity within one point of the ceiling: checked against every
 * capacity of random logs, and only because the hit rate never decreases with capacity is
 * bisection enough (also checked). */
Test(replay_tiers, knee_is_the_least_capacity_near_the_ceiling)
{
    for (unsigned seed = 100; seed < 110; seed++) {
        srand(seed);
        rp_sim_config cfg = {4, 0, 0, NULL};
        rp_sim *s = rp_sim_new(&cfg, err, sizeof err);
        cr_assert_not_null(s);
        for (int r = 0; r < 200; r++) {
            uint64_t ids[12];
            size_t n = 1 + (size_t)(rand() % 12);
            uint64_t node = 1 + (uint64_t)(rand() % 3);
            for (size_t j = 0; j < n; j++) {
                ids[j] = node;
                node = node * 4 + (uint64_t)(rand() % 4);
            }
            rp_request q;
            memset(&q, 0, sizeof q);
            kvp_namespace_init(&q.ns);
            q.hash_ids = ids;
            q.n_hash_ids = n;
            q.input_length = n * 4;
            q.line_no = (uint64_t)r + 1;
            cr_assert_eq(rp_sim_add(s, &q, err, sizeof err), RP_OK, "%s", err);
        }
        rp_metrics ceil_m, m;
        cr_assert_eq(rp_sim_eval(s, RP_CAP_INF, &ceil_m, NULL), RP_OK);
        double ceil = (double)ceil_m.n_hit_tokens / (double)ceil_m.n_prompt_tokens;
        uint64_t k;
        cr_assert_eq(rp_knee(s, ceil, &k), RP_OK);
        double prev = -1.0;
        uint64_t least = 0;
        for (uint64_t c = 1; c <= rp_sim_distinct(s); c++) {
            cr_assert_eq(rp_sim_eval(s, c, &m, NULL), RP_OK);
            double h = (double)m.n_hit_tokens / (double)m.n_prompt_tokens;
            cr_assert_geq(h, prev, "the hit rate never decreases");
            prev = h;
            if (!least && h >= ceil - 0.01)
                least = c;
        }
        cr_assert_eq(k, least, "seed %u: knee %llu, exhaustive %llu", seed, (unsigned long long)k,
                     (unsigned long long)least);
        rp_sim_free(s);
    }
}

Test(replay_tiers, scan_refuses_unordered_capacities)
{
    rp_sim_config cfg = {4, 0, 0, NULL};
    rp_sim *s = rp_sim_new(&cfg, err, sizeof err);
    cr_assert_not_null(s);
    uint64_t caps[2] = {10, 5};
    cr_assert_eq(rp_sim_scan(s, caps, 2, check_one, NULL), RP_EINPUT);
    uint64_t many[RP_SCAN_MAX_CAPS + 1] = {0};
    cr_assert_eq(rp_sim_scan(s, many, RP_SCAN_MAX_CAPS + 1, check_one, NULL), RP_EINPUT);
    rp_sim_free(s);
}

/* ---- the time model ------------------------------------------------------------------------ */

/* 1000 tokens/s (1 ms a token), blocks of 16 tokens and 1 MB; cpu 1 GB/s and 1 ms a load
 * (1 ms + 1 ms a block: 62.5 us a token), disk 100 MB/s and 10 ms (10 ms + 10 ms a block:
 * 625 us a token, break-even 10 ms / (1 ms - 0.625 ms) = 26.67 tokens). */
static rp_time_model hand_model(void)
{
    rp_time_model m;
    memset(&m, 0, sizeof m);
    m.prefill_tok_s = 1000;
    m.block_size = 16;
    m.block_bytes = 1e6;
    m.n_tiers = 3;
    m.bw_bytes_s[1] = 1e9;
    m.latency_s[1] = 1e-3;
    m.bw_bytes_s[2] = 1e8;
    m.latency_s[2] = 10e-3;
    return m;
}

Test(replay_tiers, time_model_by_hand)
{
    rp_time_model m = hand_model();
    cr_assert(rp_time_valid(&m));
    size_t c = 99;
    /* 100 tokens, 2 blocks in the GPU, 1 in cpu, 1 in disk:
     *   c = 0: (100 - 32) ms = 68 ms
     *   c = 1: (100 - 48) ms + (1 + 1) ms = 54 ms
     *   c = 2: (100 - 64) ms + 2 ms + (10 + 10) ms = 58 ms      -> 54 ms, cpu loaded only */
    uint32_t h[3] = {2, 1, 1};
    cr_assert_float_eq(rp_time_request(&m, 100, h, &c), 0.054, 1e-12);
    cr_assert_eq(c, 1);
    /* Two disk blocks: 32 tokens > 26.67, so the disk pays: (100 - 80) + 2 + (10 + 20) = 52
     * ms against 68 ms (c = 1) and 84 ms (c = 0). */
    uint32_t h2[3] = {2, 1, 2};
    cr_assert_float_eq(rp_time_request(&m, 100, h2, &c), 0.052, 1e-12);
    cr_assert_eq(c, 2);
    /* Nothing cached: the whole prompt computed. */
    uint32_t h0[3] = {0, 0, 0};
    cr_assert_float_eq(rp_time_request(&m, 100, h0, &c), 0.1, 1e-12);
    cr_assert_eq(c, 0);
    /* The rate from FLOPs: 8 x 989 TFLOP/s x 0.5 / (2 x 70e9) = 28,257.14 tokens/s. */
    cr_assert_float_eq(rp_time_prefill_rate(70000000000ull, 8, 989e12, 0.5), 28257.142857, 1e-4);
    cr_assert_eq(rp_time_prefill_rate(0, 8, 989e12, 0.5), 0.0);
    cr_assert_eq(rp_time_prefill_rate(1000, 0, 989e12, 0.5), 0.0);
    /* Attention at 1 us per unit of n^2 - R^2 (R the tokens reused):
     *   c = 0: R = 32: 68 ms + (10000 - 1024) us = 76.976 ms
     *   c = 1: R = 48: 52 ms + (10000 - 2304) us + 2 ms = 61.696 ms
     *   c = 2: R = 64: 36 ms + (10000 - 4096) us + 22 ms = 63.904 ms      -> c = 1 */
    m.attn_s = 1e-6;
    cr_assert_float_eq(rp_time_request(&m, 100, h, &c), 0.061696, 1e-12);
    cr_assert_eq(c, 1);
    /* 2 x 80 layers x 64 heads x 128 / (8 x 989e12 x 0.5) s (Llama-3.1-70B on 8 H100s). */
    cr_assert_float_eq(rp_time_attn(80, 64, 128, 8, 989e12, 0.5), 1310720.0 / 3.956e15, 1e-20);
    cr_assert_eq(rp_time_attn(0, 64, 128, 8, 989e12, 0.5), 0.0);
    m.attn_s = -1;
    cr_assert(!rp_time_valid(&m));
    m.attn_s = 0;
    m.bw_bytes_s[2] = 0;
    cr_assert(!rp_time_valid(&m));
}

Test(replay_tiers, break_even_rule)
{
    rp_time_model m = hand_model();
    double be;
    cr_assert(rp_time_tier_pays(&m, 1, &be));
    cr_assert_float_eq(be, 1e-3 / (1e-3 - 62.5e-6), 1e-9);
    cr_assert(rp_time_tier_pays(&m, 2, &be));
    cr_assert_float_eq(be, 10e-3 / (1e-3 - 625e-6), 1e-9);
    /* A run of one disk block (16 tokens) is below the break-even: recomputed; two (32) are
     * above: loaded. The choice is the rule's, request by request. */
    size_t c;
    uint32_t one[3] = {0, 0, 1}, two[3] = {0, 0, 2};
    rp_time_request(&m, 100, one, &c);
    cr_assert_eq(c, 0);
    rp_time_request(&m, 100, two, &c);
    cr_assert_eq(c, 2);
    /* A disk slower per token than computing never pays, however long the run. */
    m.bw_bytes_s[2] = 1e7; /* 6.25 ms a token */
    cr_assert(!rp_time_tier_pays(&m, 2, &be));
    cr_assert(isinf(be));
    uint32_t many[3] = {0, 0, 6};
    cr_assert_float_eq(rp_time_request(&m, 100, many, &c), 0.1, 1e-12);
    cr_assert_eq(c, 0);
    /* With latency 0, a tier faster per token pays for any run. */
    m.latency_s[1] = 0;
    cr_assert(rp_time_tier_pays(&m, 1, &be));
    cr_assert_eq(be, 0.0);
}

/* ---- the binary ------------------------------------------------------------------------------ */

static char out[1 << 17], errs[4096];

static json_t *run_json(const char *args)
{
    char full[1024];
    snprintf(full, sizeof full, "%s --json %s", args, cli_data("replay_trace.jsonl"));
    int rc = cli_run("replay", full, errs, sizeof errs, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", errs);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    return j;
}

static uint64_t jint(json_t *o, const char *path0, size_t i, const char *k)
{
    json_t *a = json_object_get(o, path0);
    return (uint64_t)json_integer_value(json_object_get(json_array_get(a, i), k));
}

/* The fixture at block size 4 (docs/replay.md's trace example): with the gpu tier of 1 block
 * and cpu of 2, the tiers' hits add up to the pool of 2 blocks, the gpu's to the pool of 1. */
Test(replay_tiers, binary_tiers_add_up_to_single_capacities)
{
    json_t *t = run_json("--model Llama-3.1-8B --trace-block-size 4 --tiers gpu=1,cpu=2");
    json_t *one = run_json("--model Llama-3.1-8B --trace-block-size 4 --capacity 1");
    json_t *two = run_json("--model Llama-3.1-8B --trace-block-size 4 --capacity 2");
    json_t *tiers = json_object_get(t, "tiers");
    json_t *ladder = json_object_get(tiers, "ladder");
    json_t *both = json_array_get(ladder, 1);
    uint64_t gpu = jint(both, "tiers", 0, "hit_tokens"), cpu = jint(both, "tiers", 1, "hit_tokens");
    uint64_t hit1 = (uint64_t)json_integer_value(
        json_object_get(json_object_get(one, "capacity"), "hit_tokens"));
    uint64_t hit2 = (uint64_t)json_integer_value(
        json_object_get(json_object_get(two, "capacity"), "hit_tokens"));
    cr_assert_eq(gpu, hit1);
    cr_assert_eq(gpu + cpu, hit2);
    cr_assert(cpu > 0, "the fixture has a hit only the second block of capacity gives");
    /* 524,288 bytes a block (Llama-3.1-8B: 128 KiB a token, 4 tokens). */
    cr_assert_eq(jint(both, "tiers", 1, "capacity_bytes"), 2 * 524288);
    json_decref(t);
    json_decref(one);
    json_decref(two);
}

/* The CSV field of row (0: the header) and column col, copied into buf (no quoting occurs in
 * these rows); the count of fields of that row in *n_fields. */
static const char *csv_field(const char *csv, int row, int col, char *buf, size_t size,
                             int *n_fields)
{
    const char *p = csv;
    for (int r = 0; r < row && p; r++)
        p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL;
    cr_assert(p && *p, "no row %d", row);
    const char *end = strchr(p, '\n');
    int c = 0;
    buf[0] = '\0';
    for (const char *q = p; q <= end; q++) {
        const char *e = q;
        while (e < end && *e != ',')
            e++;
        if (c == col)
            snprintf(buf, size, "%.*s", (int)(e - q), q);
        c++;
        q = e;
    }
    *n_fields = c;
    return buf;
}

/* --tiers with --csv: the tier rows carry the JSON report's figures, and every row of the
 * table has the header's columns. */
Test(replay_tiers, binary_csv_has_the_tier_rows)
{
    const char *a = "--model Llama-3.1-8B --trace-block-size 4 --tiers gpu=1,cpu=2,disk=3";
    json_t *j = run_json(a);
    char full[1024];
    snprintf(full, sizeof full, "%s --csv %s", a, cli_data("replay_trace.jsonl"));
    cr_assert_eq(cli_run("replay", full, errs, sizeof errs, out, sizeof out), 0, "%s", errs);
    char buf[128];
    int n_head, n;
    csv_field(out, 0, 0, buf, sizeof buf, &n_head);
    cr_assert_eq(n_head, 19 + 21, "replay's 19 columns and the tiers' 21");
    int rows = 0, col_cpu_hit = -1, col_cpu_blocks = -1, col_ttft = -1;
    for (int c = 0; c < n_head; c++) {
        csv_field(out, 0, c, buf, sizeof buf, &n);
        col_cpu_hit = strcmp(buf, "cpu_hit_tokens") == 0 ? c : col_cpu_hit;
        col_cpu_blocks = strcmp(buf, "cpu_blocks") == 0 ? c : col_cpu_blocks;
        col_ttft = strcmp(buf, "ttft_mean_s") == 0 ? c : col_ttft;
    }
    cr_assert(col_cpu_hit > 0 && col_cpu_blocks > 0 && col_ttft > 0);
    json_t *ladder = json_object_get(json_object_get(j, "tiers"), "ladder");
    bool seen_knee = false;
    for (const char *p = out; *p; p = strchr(p, '\n') + 1, rows++) {
        csv_field(out, rows, 0, buf, sizeof buf, &n);
        cr_assert_eq(n, n_head, "row %d has %d fields, the header %d", rows, n, n_head);
        if (strcmp(buf, "tiers:ladder") == 0) {
            csv_field(out, rows, 1, buf, sizeof buf, &n);
            size_t k = strcmp(buf, "gpu") == 0 ? 0 : strcmp(buf, "gpu+cpu") == 0 ? 1 : 2;
            json_t *x = json_array_get(ladder, k);
            csv_field(out, rows, 7, buf, sizeof buf, &n);
            cr_assert_eq(strtoull(buf, NULL, 10),
                         (unsigned long long)json_integer_value(json_object_get(x, "hit_tokens")));
            if (k >= 1) {
                csv_field(out, rows, col_cpu_hit, buf, sizeof buf, &n);
                cr_assert_eq(strtoull(buf, NULL, 10), jint(x, "tiers", 1, "hit_tokens"));
                csv_field(out, rows, col_cpu_blocks, buf, sizeof buf, &n);
                cr_assert_str_eq(buf, "2");
            }
            csv_field(out, rows, col_ttft, buf, sizeof buf, &n);
            cr_assert_float_eq(strtod(buf, NULL),
                               json_real_value(json_object_get(x, "ttft_mean_s")), 1e-6);
        }
        seen_knee |= strcmp(buf, "tiers:knee") == 0;
    }
    cr_assert(seen_knee, "%s", out);
    json_decref(j);
}

Test(replay_tiers, binary_done_when_command)
{
    char args[1024], plot[512];
    snprintf(plot, sizeof plot, "%s/tiers_test.svg",
             getenv("TOK_TEST_DIR") ? getenv("TOK_TEST_DIR") : ".");
    snprintf(args, sizeof args,
             "--model Llama-3.1-70B --gpu-mem 80GiB --tp 8 --tiers cpu=1TiB,disk=8TiB --sweep "
             "--trace-block-size 4 --plot '%s' %s",
             plot, cli_data("replay_trace.jsonl"));
    int rc = cli_run("replay", args, errs, sizeof errs, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", errs);
    cr_assert(strstr(out, "gpu+cpu+disk"), "%s", out);
    cr_assert(strstr(out, "within 1 point of it at"), "%s", out);
    cr_assert(strstr(out, "after weights"), "%s", out);
    cr_assert(strstr(out, "Sweep of the disk tier"), "%s", out);
    FILE *f = fopen(plot, "r");
    cr_assert_not_null(f);
    static char svg[1 << 16];
    size_t n = fread(svg, 1, sizeof svg - 1, f);
    svg[n] = '\0';
    fclose(f);
    remove(plot);
    cr_assert(strstr(svg, "GiB of KV"), "the axis is in memory units");
    /* The plain sweep too: its axis in GiB with a model, its knee named. */
    snprintf(args, sizeof args,
             "--model Llama-3.1-8B --sweep=4 --trace-block-size 4 --plot '%s' %s", plot,
             cli_data("replay_trace.jsonl"));
    rc = cli_run("replay", args, errs, sizeof errs, out, sizeof out);
    cr_assert_eq(rc, 0, "%s", errs);
    cr_assert(strstr(out, "within 1 point of the ceiling"), "%s", out);
    f = fopen(plot, "r");
    cr_assert_not_null(f);
    n = fread(svg, 1, sizeof svg - 1, f);
    svg[n] = '\0';
    fclose(f);
    remove(plot);
    cr_assert(strstr(svg, "cache capacity (GiB of KV, log scale)"), "the plain sweep's axis");
}

Test(replay_tiers, binary_refusals)
{
    static const struct {
        const char *args;
        int status;
        const char *msg;
    } cases[] = {
        {"--model Llama-3.1-8B --trace-block-size 4 --tiers gpu=2,cpu=1", 1, "not larger than gpu"},
        {"--trace-block-size 4 --tiers gpu=2,cpu=3", 2, "needs --model"},
        {"--trace-block-size 4 --sweep --tp 2", 2, "add --tiers"},
        {"--model Llama-3.1-8B --tiers gpu=2,ssd=3", 2, "no tier 'ssd'"},
        {"--model Llama-3.1-8B --tiers cpu=2,gpu=3", 2, "top down"},
        {"--model Llama-3.1-8B --tiers cpu=2TiB", 2, "give gpu=SIZE"},
        {"--model Llama-3.1-8B --tiers gpu=2,cpu=3 --tier-bw gpu=1GB", 2, "loads nothing"},
        {"--model Llama-3.1-8B --tiers gpu=2,cpu=3 --tier-latency cpu=fast", 2, "not a duration"},
        {"--model Llama-3.1-8B --tiers gpu=2,cpu=3 --tier-bw cpu=fast", 2, "not a bandwidth"},
        {"--model Llama-3.1-8B --tiers gpu=2,cpu=3 --gpu Z80", 2, "no preset 'Z80'"},
        {"--model Llama-3.1-70B --tiers cpu=1TiB --gpu-mem 8GiB", 1, "no GPU memory"},
        {"--model Llama-3.1-8B --tiers gpu=2,cpu=3 --prefill-rate -1", 2, "not a positive rate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char full[1024];
        snprintf(full, sizeof full, "%s --trace-block-size 4 %s", cases[i].args,
                 cli_data("replay_trace.jsonl"));
        int rc = cli_run("replay", full, errs, sizeof errs, out, sizeof out);
        cr_expect_eq(rc, cases[i].status, "%s: %d (%s)", cases[i].args, rc, errs);
        cr_expect(strstr(errs, cases[i].msg), "%s: %s", cases[i].args, errs);
    }
}
