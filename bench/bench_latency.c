/*
 * bench_latency.c - the worst single call, not the average: what a scheduler thread can be
 * stalled by. A pool of --blocks blocks (default 1M, 16 tokens each) is filled with cached
 * prompts of 2048 tokens; then --calls (default 40000) kvp_access calls each re-use one of
 * those prompts at random (every block hit: pinned, then unpinned, so every call leaves
 * stale entries in the LRU ring and pushes new ones; the ring must be cleaned as it fills),
 * and one in eight brings a new prompt (evictions). Each call is timed alone, in this
 * thread's CPU time (so that time the shared machine gives to other processes does not
 * count as the library's); the report
 * gives the mean, median, p99, p99.9 and the maximum in microseconds, over --reps runs (default 3:
 * the medians of each statistic across runs, and the largest maximum).
 *
 * Usage: bench_latency [--blocks N] [--calls N] [--reps N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchutil.h"
#include "kvprefix.h"

#define BS  16
#define LEN 2048

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Prompt number k: its tokens are a pure function of k. */
static void make_prompt(uint64_t k, uint32_t *p)
{
    uint64_t s = k * 0x9e3779b97f4a7c15u + 1;
    for (size_t i = 0; i < LEN; i++)
        p[i] = (uint32_t)(rnd(&s) % 128000);
}

static void must(int rc, const char *what)
{
    if (rc != KVP_OK) {
        fprintf(stderr, "bench_latency: %s: %s\n", what, kvp_strerror(rc));
        exit(1);
    }
}

typedef struct stats {
    double mean, p50, p99, p999, max; /* microseconds */
} stats;

static stats run_once(uint32_t n_blocks, uint32_t n_calls, uint64_t seed)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = n_blocks;
    cfg.block_size = BS;
    kvp_cache *c;
    must(kvp_cache_new(&cfg, &c), "kvp_cache_new");
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("bench");
    uint32_t *p = malloc(LEN * sizeof *p);
    uint64_t n_prompts = n_blocks / (LEN / BS), next = n_prompts;
    kvp_match m;
    for (uint64_t k = 0; k < n_prompts; k++) {
        make_prompt(k, p);
        must(kvp_access(c, &ns, p, LEN, &m), "fill");
    }
    double *t = malloc(n_calls * sizeof *t);
    for (uint32_t i = 0; i < n_calls; i++) {
        uint64_t k = rnd(&seed) % 8 == 0 ? next++ : next - 1 - rnd(&seed) % n_prompts;
        make_prompt(k, p);
        double t0 = now_us();
        must(kvp_access(c, &ns, p, LEN, &m), "kvp_access");
        t[i] = now_us() - t0;
    }
    must(kvp_cache_check(c), "kvp_cache_check");
    double sum = 0;
    for (uint32_t i = 0; i < n_calls; i++)
        sum += t[i];
    qsort(t, n_calls, sizeof *t, bench_cmp_double);
    stats s = {sum / n_calls, t[n_calls / 2], t[(size_t)(n_calls * 0.99)],
               t[(size_t)(n_calls * 0.999)], t[n_calls - 1]};
    free(t);
    free(p);
    kvp_cache_free(c);
    return s;
}

int main(int argc, char **argv)
{
    uint32_t n_blocks = 1u << 20, n_calls = 40000;
    int reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--blocks"))
            n_blocks = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--calls"))
            n_calls = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (n_blocks < LEN / BS || n_calls < 1000 || reps < 1 || reps > 15) {
        fprintf(stderr, "usage: bench_latency [--blocks >= 128] [--calls >= 1000] "
                        "[--reps 1..15]\n");
        return 2;
    }
    double mean[15], p50[15], p99[15], p999[15], mx = 0;
    for (int r = 0; r < reps; r++) {
        stats s = run_once(n_blocks, n_calls, 0x1234567u + (uint64_t)r);
        mean[r] = s.mean;
        p50[r] = s.p50;
        p99[r] = s.p99;
        p999[r] = s.p999;
        mx = s.max > mx ? s.max : mx;
    }
    printf("bench_latency: kvp_access of %d-token prompts on a full pool of %u blocks, %u calls "
           "x %d runs\n",
           LEN, n_blocks, n_calls, reps);
    printf("  per call, us: mean %.1f  median %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
           bench_median(mean, reps), bench_median(p50, reps), bench_median(p99, reps),
           bench_median(p999, reps), mx);
    return 0;
}
