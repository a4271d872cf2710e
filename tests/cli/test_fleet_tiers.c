/*
 * test_fleet_tiers.c - `kvprefix fleet --tiers / --shared-tier` (src/cli/cmd/fleet/fl_tiers.c):
 * the load-or-recompute rule by hand, and the binary's tier figures against `kvprefix replay`
 * on random Mooncake logs, where the two must agree:
 *
 *   - one replica served in order: its GPU pool plus inclusive cpu and disk tiers of C1 < C2
 *     blocks hit what a single LRU cache of C1 (gpu + cpu) and C2 (gpu + cpu + disk) blocks
 *     hits, which replay computes from its stack distances;
 *   - a shared tier larger than the log's distinct blocks makes every block seen before a hit
 *     whatever the routing: every policy's total equals replay's cold-miss ceiling.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cliutil.h"
#include "fleet.h"

static char out[1 << 20], errs[8192];

Test(fleet_tiers, delta_by_hand)
{
    /* 1 ms a token computed, 16-token blocks of 1 MB; cpu 1 GB/s + 1 ms (2 ms a block),
     * disk 100 MB/s + 10 ms (a 16-token run is slower to load than to compute, 32 is not),
     * shared 10 MB/s (never pays: 100 ms a block). */
    fl_tier_setup s;
    memset(&s, 0, sizeof s);
    s.block_bytes = 1000000;
    s.block_size = 16;
    s.prefill_ns = 1000000;
    s.bw[0] = 1e9, s.latency[0] = 1e-3;
    s.bw[1] = 1e8, s.latency[1] = 10e-3;
    s.bw[2] = 1e7, s.latency[2] = 0;
    int c;
    uint32_t h1[3] = {1, 1, 0}; /* cpu: 2 - 16 = -14 ms; disk: +20 - 16: not loaded */
    cr_assert_eq(fl_tiers_delta(&s, h1, &c), -14000000);
    cr_assert_eq(c, 1);
    uint32_t h2[3] = {1, 2, 0}; /* disk: 30 - 32 = -2 ms more */
    cr_assert_eq(fl_tiers_delta(&s, h2, &c), -16000000);
    cr_assert_eq(c, 2);
    uint32_t h3[3] = {0, 0, 5}; /* shared: 500 ms to load 80 ms of compute: recomputed */
    cr_assert_eq(fl_tiers_delta(&s, h3, &c), 0);
    cr_assert_eq(c, 0);
}

/* A random Mooncake log: paths in a 3-ary tree of ids (shared prefixes), 1..8 blocks of 4
 * tokens, increasing timestamps, 1 output token. Returns its path. */
static const char *random_log(unsigned seed, int n)
{
    static char path[512];
    const char *dir = getenv("TOK_TEST_DIR");
    snprintf(path, sizeof path, "%s/fleet_tiers_%u.jsonl", dir ? dir : ".", seed);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    srand(seed);
    for (int i = 0; i < n; i++) {
        int k = 1 + rand() % 8;
        uint64_t node = 1 + (uint64_t)(rand() % 2);
        fprintf(f,
                "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": 1, \"hash_ids\": [",
                i * 1000, k * 4);
        for (int j = 0; j < k; j++) {
            fprintf(f, "%s%llu", j ? ", " : "", (unsigned long long)node);
            node = node * 3 + (uint64_t)(rand() % 3);
        }
        fprintf(f, "]}\n");
    }
    fclose(f);
    return path;
}

static json_t *run_json(const char *sub, const char *args)
{
    int rc = cli_run(sub, args, errs, sizeof errs, out, sizeof out);
    cr_assert_eq(rc, 0, "%s %s: %s", sub, args, errs);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    return j;
}

static json_int_t get_int(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    cr_assert(json_is_integer(v), "no integer '%s'", k);
    return json_integer_value(v);
}

static json_int_t replay_hits(const char *log, const char *cap)
{
    char args[1024];
    snprintf(args, sizeof args, "--trace-block-size 4 --json %s %s", cap, log);
    json_t *j = run_json("replay", args);
    json_t *m = json_object_get(j, strstr(cap, "capacity") ? "capacity" : "ceiling");
    json_int_t h = get_int(m, "hit_tokens");
    json_decref(j);
    return h;
}

Test(fleet_tiers, one_replica_tiers_equal_replay_capacities)
{
    for (unsigned seed = 1; seed <= 4; seed++) {
        const char *log = random_log(seed, 400);
        char args[1024];
        snprintf(args, sizeof args,
                 "--trace-block-size 4 --model Llama-3.1-8B --replicas 1 --policies round-robin "
                 "--capacity 20 --tiers cpu=40,disk=80 --json %s",
                 log);
        json_t *j = run_json("fleet", args);
        json_t *t = json_array_get(json_object_get(j, "tiers"), 0);
        cr_assert_not_null(t);
        json_int_t gpu = get_int(t, "gpu_hit_tokens"), cpu = get_int(t, "cpu_hit_tokens"),
                   disk = get_int(t, "disk_hit_tokens");
        cr_assert_eq(gpu + cpu, replay_hits(log, "--capacity 40"), "seed %u", seed);
        cr_assert_eq(gpu + cpu + disk, replay_hits(log, "--capacity 80"), "seed %u", seed);
        cr_assert(disk > 0 && cpu > 0, "seed %u: the log must reach both tiers", seed);
        /* One replica serving in order: every loaded hit shortens a service, so no start is
         * later and the mean TTFT drops (cpu loads pay at the default 50 GB/s). */
        json_t *m = json_object_get(t, "ttft_mean_ms"),
               *b = json_object_get(t, "ttft_mean_ms_without_tiers");
        cr_assert(get_int(t, "cpu_loaded_tokens") > 0);
        cr_assert_lt(json_real_value(m), json_real_value(b), "seed %u", seed);
        json_decref(j);
        remove(log);
    }
}

Test(fleet_tiers, shared_tier_reaches_the_ceiling_under_every_policy)
{
    const char *log = random_log(7, 400);
    char args[1024];
    snprintf(args, sizeof args,
             "--trace-block-size 4 --model Llama-3.1-8B --replicas 4 --capacity 20 "
             "--shared-tier 1M --json %s",
             log);
    json_t *j = run_json("fleet", args);
    json_int_t ceiling = replay_hits(log, "--sweep=2");
    json_t *tiers = json_object_get(j, "tiers");
    cr_assert_eq(json_array_size(tiers), FL_N_POLICIES);
    for (size_t i = 0; i < json_array_size(tiers); i++) {
        json_t *t = json_array_get(tiers, i);
        cr_assert_eq(get_int(t, "gpu_hit_tokens") + get_int(t, "shared_hit_tokens"), ceiling, "%s",
                     json_string_value(json_object_get(t, "policy")));
    }
    json_decref(j);
    remove(log);
}

Test(fleet_tiers, refusals)
{
    static const struct {
        const char *args;
        int status;
        const char *msg;
    } cases[] = {
        {"--capacity 20 --tiers cpu=40", 2, "need --model"},
        {"--capacity 20 --model Llama-3.1-8B --tiers gpu=40", 2, "no tier 'gpu'"},
        {"--capacity 20 --model Llama-3.1-8B --tiers disk=80,cpu=40", 2, "top down"},
        {"--capacity 20 --model Llama-3.1-8B --tiers cpu=80,disk=40", 1, "not larger than cpu"},
        {"--capacity 20 --model Llama-3.1-8B --shared-tier lots", 2, "not a positive size"},
        {"--capacity 20 --tier-bw cpu=1GB/s", 2, "add --tiers or --shared-tier"},
        {"--capacity 20 --model Llama-3.1-8B --tiers cpu=40 --tier-latency cpu=soon", 2,
         "not a duration"},
    };
    const char *log = random_log(9, 20);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char full[1024];
        snprintf(full, sizeof full, "--trace-block-size 4 %s %s", cases[i].args, log);
        int rc = cli_run("fleet", full, errs, sizeof errs, out, sizeof out);
        cr_expect_eq(rc, cases[i].status, "%s: %d (%s)", cases[i].args, rc, errs);
        cr_expect(strstr(errs, cases[i].msg), "%s: %s", cases[i].args, errs);
    }
    remove(log);
}
