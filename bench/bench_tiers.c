/*
 * bench_tiers.c - the bookkeeping cost of a lower tier, per block moved: a workload like
 * bench_core's (c), scaled down, on a cache with a host-memory tier (write-through).
 *
 * Requests of 512..4096 tokens each start with one of 200 shared system prompts (256..2048
 * tokens, Zipf 0.4 popularity) followed by random tokens; a 20k-block device pool, a CPU
 * tier of --cpu blocks (default 100k; 0: no tier, for comparison) under the eviction policy
 * --tier-eviction (lru, slru, s3fifo, cdecay; default lru); 32 requests in flight.
 * Each request: kvp_acquire_tiers, confirm its loads (all succeed), kvp_commit of the whole
 * prompt, take every store order (kvp_tier_orders) and confirm it, release the oldest
 * request. No bytes move: the figure is the cache's own work. Run it under callgrind and
 * divide the tier functions' instructions by the counts printed at the end (docs/design.md,
 * "Tiers", gives the command and the figure); the wall time printed is for context only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>

#include "kvprefix.h"

#define RING     32u
#define N_SYS    200u
#define MAX_TOK  4096u
#define N_ORDERS 512u

static uint64_t rng_state = 42;

static uint64_t next_rand(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int die(const char *what, int rc)
{
    fprintf(stderr, "bench_tiers: %s: %s (%s)\n", what, kvp_strerror(rc), kvp_errmsg());
    exit(1);
}

int main(int argc, char **argv)
{
    uint32_t n_requests = 5000, n_cpu = 100000;
    int eviction = KVP_EVICT_LRU;
    static const char *const policies[] = {"lru", "slru", "s3fifo", "cdecay"};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--requests")) {
            n_requests = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        } else if (!strcmp(argv[i], "--cpu")) {
            n_cpu = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        } else if (!strcmp(argv[i], "--tier-eviction")) {
            eviction = -1;
            for (int p = 0; p < 4; p++)
                if (!strcmp(argv[i + 1], policies[p]))
                    eviction = (int[]){KVP_EVICT_LRU, KVP_EVICT_SLRU, KVP_EVICT_S3FIFO,
                                       KVP_EVICT_CDECAY}[p];
            if (eviction < 0) {
                fprintf(stderr, "bench_tiers: --tier-eviction: lru, slru, s3fifo or cdecay\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: bench_tiers [--requests N] [--cpu BLOCKS] "
                            "[--tier-eviction lru|slru|s3fifo|cdecay]\n");
            return 2;
        }
    }
    /* Step 1: the system prompts and their Zipf weights. */
    static uint32_t sys_len[N_SYS];
    static double cdf[N_SYS];
    double total = 0;
    for (uint32_t s = 0; s < N_SYS; s++) {
        sys_len[s] = 256 + (uint32_t)(next_rand() % (2048 - 256 + 1));
        total += 1.0 / pow(s + 1, 0.4);
        cdf[s] = total;
    }
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 20000;
    cfg.hash_profile = KVP_HASH_XXH3;
    cfg.block_bytes = 16 * 2 * 80 * 128 * 2; /* a 16-token block of an 80-layer model */
    kvp_cache *c = NULL;
    int rc = kvp_cache_new(&cfg, &c);
    if (rc)
        die("kvp_cache_new", rc);
    if (n_cpu) {
        kvp_tier_config tc;
        kvp_tier_config_init(&tc);
        tc.n_blocks = n_cpu;
        tc.eviction = eviction;
        if ((rc = kvp_cache_add_tier(c, &tc, NULL)))
            die("kvp_cache_add_tier", rc);
    }
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("m");
    static uint32_t tokens[MAX_TOK];
    static kvp_tier_order orders[N_ORDERS];
    uint64_t ring[RING] = {0};
    uint64_t n_loads = 0, n_stores = 0;
    double t0 = now();
    /* Step 2: the requests. */
    for (uint32_t r = 1; r <= n_requests; r++) {
        double u = (double)(next_rand() % 1000000) / 1e6 * total;
        uint32_t s = 0;
        while (s + 1 < N_SYS && cdf[s] < u)
            s++;
        uint32_t n = 512 + (uint32_t)(next_rand() % (MAX_TOK - 512 + 1));
        for (uint32_t i = 0; i < n; i++)
            tokens[i] = i < sys_len[s] ? s * 10000 + i : (uint32_t)next_rand() % 100000;
        if (ring[r % RING]) {
            if ((rc = kvp_release(c, ring[r % RING])))
                die("kvp_release", rc);
            ring[r % RING] = 0;
        }
        kvp_match m;
        size_t n_lo = 0;
        rc = kvp_acquire_tiers(c, r, &ns, tokens, n, 0, &m, orders, N_ORDERS, &n_lo);
        if (rc == KVP_ENOSPC)
            continue;
        if (rc)
            die("kvp_acquire_tiers", rc);
        ring[r % RING] = r;
        for (size_t j = 0; j < n_lo; j++)
            if ((rc = kvp_tier_confirm(c, orders[j].id, true)))
                die("kvp_tier_confirm", rc);
        n_loads += n_lo;
        if ((rc = kvp_commit(c, r, tokens, n, NULL)))
            die("kvp_commit", rc);
        size_t got, left;
        do {
            if ((rc = kvp_tier_orders(c, orders, N_ORDERS, &got, &left)))
                die("kvp_tier_orders", rc);
            for (size_t j = 0; j < got; j++)
                if ((rc = kvp_tier_confirm(c, orders[j].id, true)))
                    die("kvp_tier_confirm", rc);
            n_stores += got;
        } while (left);
    }
    double t1 = now();
    kvp_stats st;
    if ((rc = kvp_cache_stats(c, &st)))
        die("kvp_cache_stats", rc);
    printf("requests %u, device blocks hit %llu, stored %llu; tier loads %llu, stores %llu; "
           "%.3f s\n",
           n_requests, (unsigned long long)st.n_blocks_hit, (unsigned long long)st.n_blocks_stored,
           (unsigned long long)n_loads, (unsigned long long)n_stores, t1 - t0);
    if ((rc = kvp_cache_check(c)))
        die("kvp_cache_check", rc);
    kvp_cache_free(c);
    return 0;
}
