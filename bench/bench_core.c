/*
 * bench_core.c - the core performance figures of kvprefix, measured side by side in one run.
 *
 *   (a) hashing   raw XXH3-128 chain over pre-laid-out 80-byte records (16-byte parent key ||
 *                 64 token bytes) versus kvp_hash_blocks() over the plain token array: the
 *                 same bytes, the same chain, the same digests (checked), so ours/raw is the
 *                 whole overhead of assembling each block's input and storing its key. Both
 *                 sides run the same XXH3 code: this file includes src/blockhash.h, which
 *                 includes Debian's xxhash.h with XXH_INLINE_ALL, so raw_chain's
 *                 XXH3_128bits_withSeed is the inlined header implementation too, not the
 *                 shared libxxhash.
 *   (b) lookup    a 1M-block cache filled to the last block with distinct prompts (120
 *                 prompts of 128k tokens, 128 of 8k); kvp_lookup of fully cached 128k and 8k
 *                 prompts, round-robin over all of them in a shuffled order (each lookup
 *                 touches memory the previous one did not, as in serving), the same prompt
 *                 repeated (cache-warm, for context), and a 128k full miss. The free list is
 *                 shuffled first so a prompt's blocks are scattered over the pool the way
 *                 they are after eviction has run for a while (--no-scramble: contiguous).
 *                 The floor printed beside it is 8192 raw XXH3-128 chain steps plus 8192
 *                 independent probes of the library's own index (kvp__index_find) with the
 *                 keys known in advance and no prefetching. kvp_lookup hashes ahead and
 *                 prefetches buckets and entries (match() in lifecycle.c), so it can come in
 *                 under this "floor": the floor is the cost of the two parts done naively.
 *   (c) workload  100k requests, lengths uniform 512..8192 tokens, each starting with one of
 *                 1,000 shared system prompts (256..2048 tokens, Zipf popularity) followed by
 *                 random tokens; 200k-block pool; 32 requests in flight. Each request does
 *                 kvp_acquire, kvp_commit of the whole prompt, then the oldest in-flight one
 *                 is released. Prompts are generated in batches of 256 outside the timed
 *                 region. A second run adds kvp_lookup before kvp_acquire.
 *   (d) memory    live bytes of a 1M-block cache, every block cached, counted by a
 *                 kvp_allocator hook, divided by the cached blocks; with and without
 *                 verify_tokens.
 *
 * Every figure is repeated --reps times (default 7; (c) splits its requests into that many
 * chunks) after a warm-up, and printed as median and min (for rates: median and best).
 * The run ends with a table of figures, targets and PASS/MISS, and one SUMMARY line that
 * scripts can parse. Default runtime is about 20 s on a 2-core VM; --quick takes a few.
 *
 * This program links the internal static library: it uses internal.h (via blockhash.h) only
 * for the probe floor of (b) and to cross-check (d) against the library's own live-byte
 * count.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define BENCH_PROG "bench_core"
#include "benchutil.h"
#include "blockhash.h" /* internal.h, and xxhash.h with XXH_INLINE_ALL (see (a) above) */

#ifndef KVP_BENCH_BUILDTYPE
#define KVP_BENCH_BUILDTYPE "unknown"
#endif

#define BS             16u      /* block size used by every figure */
#define VOCAB_MASK     0x1ffffu /* tokens are uniform in 0 .. 2^17 - 1 */
#define LONG_TOKENS    131072u  /* (b) long prompt: 128k tokens, 8192 blocks */
#define SHORT_TOKENS   8192u    /* (b) short prompt: 8k tokens, 512 blocks */
#define RING           32u      /* (c) requests in flight */
#define BATCH          256u     /* (c) prompts generated per untimed batch */
#define MAX_REQ_TOKENS 8192u    /* (c) longest request */

/* ---------------------------------------------------------------------------------- */
/* Options and results                                                                */
/* ---------------------------------------------------------------------------------- */

typedef struct opts {
    int reps;             /* repetitions per figure (chunks for (c)) */
    bool quick;           /* smaller sizes and fewer repetitions */
    const char *only;     /* subset of "abcd" to run */
    size_t hash_tokens;   /* (a) token array length */
    uint32_t lookup_pool; /* (b) pool size */
    bool scramble;        /* (b) shuffle the free list before filling */
    uint32_t n_requests;  /* (c) measured requests */
    uint32_t n_warmup;    /* (c) untimed requests first */
    uint32_t wl_pool;     /* (c) pool size */
    double zipf;          /* (c) popularity exponent of the system prompts */
    uint32_t mem_pool;    /* (d) pool size */
    uint64_t seed;        /* PRNG seed */
} opts;

typedef struct results {
    bool ran_a, ran_b, ran_c, ran_d;
    double a_raw_ns_tok, a_ours_ns_tok, a_ratio, a_ratio_min, a_hot_ratio;
    double b_long_us, b_long_min_us, b_short_us, b_miss_us, b_floor_us, b_long_hot_us;
    double c_rps, c_rps_best, c_rps_lookup, c_rps_lookup_best, c_hit;
    double d_bpb, d_bpb_verify;
} results;

/* ---------------------------------------------------------------------------------- */
/* Helpers                                                                            */
/* ---------------------------------------------------------------------------------- */

/* splitmix64: cheap, good enough for token streams. */
typedef struct rng {
    uint64_t s; /* state */
} rng;

static inline uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in lo .. hi inclusive. */
static inline uint32_t rng_range(rng *r, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(rng_next(r) % ((uint64_t)hi - lo + 1));
}

static void fill_tokens(rng *r, uint32_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 1 < n; i += 2) {
        uint64_t x = rng_next(r);
        dst[i] = (uint32_t)x & VOCAB_MASK;
        dst[i + 1] = (uint32_t)(x >> 32) & VOCAB_MASK;
    }
    if (i < n)
        dst[i] = (uint32_t)rng_next(r) & VOCAB_MASK;
}

static void shuffle_u32(rng *r, uint32_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rng_next(r) % i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and minimum of v[0 .. n) (reorders v). */
static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double min_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static double max_of(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

static bool want(const opts *o, char part)
{
    return strchr(o->only, part) != NULL;
}

static void bench_namespace(kvp_namespace *ns)
{
    kvp_namespace_init(ns);
    ns->model = kvp_field_str("bench-model-8b");
    ns->tenant = kvp_field_str("tenant-0");
}

static bool g_single_threaded; /* (c): create caches with kvp_config.single_threaded */

static int g_profile = KVP_HASH_KEYED; /* the profile of the caches made next */

static int g_eviction = KVP_EVICT_LRU; /* --eviction: kvp_config.eviction of every cache */

static uint32_t g_cdecay_ghost_pct; /* --cdecay-ghost-pct: kvp_config.cdecay_ghost_pct (0: its
                                       default) */

static void new_cache(uint32_t n_blocks, bool verify, const kvp_allocator *alloc, kvp_cache **out)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.single_threaded = g_single_threaded;
    cfg.hash_profile = g_profile;
    cfg.eviction = g_eviction;
    cfg.cdecay_ghost_pct = g_cdecay_ghost_pct;
    cfg.n_blocks = n_blocks;
    cfg.block_size = BS;
    cfg.verify_tokens = verify;
    if (alloc)
        cfg.alloc = *alloc;
    check(kvp_cache_new(&cfg, out), "kvp_cache_new");
}

/* ---------------------------------------------------------------------------------- */
/* Machine info                                                                       */
/* ---------------------------------------------------------------------------------- */

static void print_header(const opts *o)
{
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                const char *p = strchr(line, ':');
                if (p) {
                    p += 1 + (p[1] == ' ');
                    snprintf(model, sizeof model, "%s", p);
                    model[strcspn(model, "\n")] = '\0';
                }
                break;
            }
        }
        fclose(f);
    }
    struct utsname u;
    if (uname(&u) != 0)
        memset(&u, 0, sizeof u);
    printf("kvprefix bench_core\n");
    printf("  machine   : %ld online CPUs (nproc), %s\n", sysconf(_SC_NPROCESSORS_ONLN), model);
    printf("  kernel    : %s %s %s\n", u.sysname, u.release, u.machine);
    printf("  build     : buildtype=%s, %s, __OPTIMIZE__=%s, NDEBUG=%s\n", KVP_BENCH_BUILDTYPE,
#ifdef __VERSION__
           "cc " __VERSION__,
#else
           "cc unknown",
#endif
#ifdef __OPTIMIZE__
           "yes",
#else
           "no",
#endif
#ifdef NDEBUG
           "yes"
#else
           "no"
#endif
    );
    printf("  libraries : kvprefix %s, xxHash %u\n", kvp_version(), XXH_versionNumber());
    printf("  options   : reps=%d%s, only=%s, seed=%llu, block_size=%u\n", o->reps,
           o->quick ? " (quick)" : "", o->only, (unsigned long long)o->seed, BS);
    printf("  clock     : clock_gettime(CLOCK_MONOTONIC); figures are median / min over reps\n");
}

/* ---------------------------------------------------------------------------------- */
/* (a) hashing                                                                        */
/* ---------------------------------------------------------------------------------- */

/* The raw chain: rec holds n_blk records of 80 bytes (16-byte parent slot, then the block's
 * 64 token bytes). Writes each digest into the next record's slot and into out[]. */
__attribute__((noinline)) static void raw_chain(unsigned char *rec, size_t n_blk, kvp_key parent,
                                                uint64_t seed, kvp_key *out)
{
    const size_t rec_bytes = 16 + 4 * BS;
    for (size_t i = 0; i < n_blk; i++) {
        unsigned char *p = rec + i * rec_bytes;
        memcpy(p, &parent.lo, 8); /* little-endian host: the key bytes are lo, hi */
        memcpy(p + 8, &parent.hi, 8);
        XXH128_hash_t h = XXH3_128bits_withSeed(p, rec_bytes, seed);
        parent.lo = h.low64;
        parent.hi = h.high64;
        out[i] = parent;
    }
}

/* Lay tokens out as raw_chain's records. */
static unsigned char *make_records(const uint32_t *tokens, size_t n_blk)
{
    const size_t rec_bytes = 16 + 4 * BS;
    unsigned char *rec = xmalloc(n_blk * rec_bytes);
    for (size_t i = 0; i < n_blk; i++) {
        memset(rec + i * rec_bytes, 0, 16);
        memcpy(rec + i * rec_bytes + 16, tokens + i * BS, 4 * BS);
    }
    return rec;
}

static void bench_hash(const opts *o, results *res)
{
    size_t n_tok = o->hash_tokens, n_blk = n_tok / BS;
    rng r = {o->seed ^ 0xa};
    uint32_t *tokens = xmalloc(n_tok * sizeof *tokens);
    fill_tokens(&r, tokens, n_tok);
    unsigned char *rec = make_records(tokens, n_blk);
    kvp_key *k_raw = xmalloc(n_blk * sizeof *k_raw), *k_ours = xmalloc(n_blk * sizeof *k_ours);
    kvp_namespace ns;
    bench_namespace(&ns);
    kvp_key root;
    check(kvp_namespace_key(KVP_DEFAULT_SEED, &ns, &root), "kvp_namespace_key");

    printf("\n(a) hashing: %zu tokens = %zu blocks of %u (%.0f MiB of tokens), seed %llu\n", n_tok,
           n_blk, BS, (double)(n_tok * 4) / 1048576.0, (unsigned long long)KVP_DEFAULT_SEED);

    /* Warm up both (page faults, caches, frequency), then alternate so drift hits both. */
    size_t n_keys = 0;
    raw_chain(rec, n_blk, root, KVP_DEFAULT_SEED, k_raw);
    check(kvp_hash_blocks(KVP_DEFAULT_SEED, root, tokens, n_tok, BS, k_ours, n_blk, &n_keys),
          "kvp_hash_blocks");
    double t_raw[64], t_ours[64], ratio[64];
    for (int i = 0; i < o->reps; i++) {
        uint64_t t0 = now_ns();
        raw_chain(rec, n_blk, root, KVP_DEFAULT_SEED, k_raw);
        uint64_t t1 = now_ns();
        check(kvp_hash_blocks(KVP_DEFAULT_SEED, root, tokens, n_tok, BS, k_ours, n_blk, &n_keys),
              "kvp_hash_blocks");
        uint64_t t2 = now_ns();
        t_raw[i] = (double)(t1 - t0);
        t_ours[i] = (double)(t2 - t1);
        ratio[i] = t_ours[i] / t_raw[i];
    }
    bool same = n_keys == n_blk && memcmp(k_raw, k_ours, n_blk * sizeof *k_raw) == 0;
    double raw_min = min_of(t_raw, o->reps), ours_min = min_of(t_ours, o->reps);
    double raw_med = median_of(t_raw, o->reps), ours_med = median_of(t_ours, o->reps);
    double ratio_min = min_of(ratio, o->reps), ratio_med = median_of(ratio, o->reps);
    printf("  %-34s %10s %10s %10s %10s\n", "", "ns/token", "(min)", "ns/block", "(min)");
    printf("  %-34s %10.3f %10.3f %10.2f %10.2f\n", "raw XXH3_128bits_withSeed chain",
           raw_med / (double)n_tok, raw_min / (double)n_tok, raw_med / (double)n_blk,
           raw_min / (double)n_blk);
    printf("  %-34s %10.3f %10.3f %10.2f %10.2f\n", "kvp_hash_blocks", ours_med / (double)n_tok,
           ours_min / (double)n_tok, ours_med / (double)n_blk, ours_min / (double)n_blk);
    printf("  ours/raw: median of per-rep ratios %.3fx (min %.3fx); digests identical: %s\n",
           ratio_med, ratio_min, same ? "yes" : "NO");
    if (!same) {
        fprintf(stderr, "bench_core: raw and library digests differ\n");
        exit(1);
    }
    /* The same comparison with 32k tokens (128 KiB, L2-resident), 64 passes per rep: what
     * is left when DRAM streaming does not hide the per-block instruction overhead. */
    size_t h_tok = 32768 < n_tok ? 32768 : n_tok, h_blk = h_tok / BS;
    double h_raw[64], h_ours[64], h_ratio[64];
    for (int i = 0; i < o->reps; i++) {
        uint64_t t0 = now_ns();
        for (int k = 0; k < 64; k++)
            raw_chain(rec, h_blk, root, KVP_DEFAULT_SEED, k_raw);
        uint64_t t1 = now_ns();
        for (int k = 0; k < 64; k++)
            check(
                kvp_hash_blocks(KVP_DEFAULT_SEED, root, tokens, h_tok, BS, k_ours, h_blk, &n_keys),
                "kvp_hash_blocks");
        uint64_t t2 = now_ns();
        h_raw[i] = (double)(t1 - t0) / 64.0;
        h_ours[i] = (double)(t2 - t1) / 64.0;
        h_ratio[i] = h_ours[i] / h_raw[i];
    }
    double hr = median_of(h_raw, o->reps), ho = median_of(h_ours, o->reps);
    printf("  L2-resident (%zu tokens): raw %.2f ns/block, ours %.2f ns/block, ours/raw %.3fx "
           "(min %.3fx)\n",
           h_tok, hr / (double)h_blk, ho / (double)h_blk, median_of(h_ratio, o->reps),
           min_of(h_ratio, o->reps));
    res->a_hot_ratio = median_of(h_ratio, o->reps);
    res->ran_a = true;
    res->a_raw_ns_tok = raw_med / (double)n_tok;
    res->a_ours_ns_tok = ours_med / (double)n_tok;
    res->a_ratio = ratio_med;
    res->a_ratio_min = ratio_min;
    free(tokens);
    free(rec);
    free(k_raw);
    free(k_ours);
}

/* ---------------------------------------------------------------------------------- */
/* (b) lookup latency                                                                 */
/* ---------------------------------------------------------------------------------- */

/* Shuffle the free list: take every block through one-block requests, release them in a
 * random order. Afterwards consecutive fresh blocks have unrelated ids. */
static void scramble_pool(kvp_cache *cache, const kvp_namespace *ns, uint32_t n_pool, rng *r)
{
    uint32_t one = 1;
    kvp_match m;
    uint32_t *order = xmalloc((size_t)n_pool * sizeof *order);
    for (uint32_t i = 0; i < n_pool; i++) {
        check(kvp_acquire(cache, i, ns, &one, 1, BS, &m), "kvp_acquire (scramble)");
        order[i] = i;
    }
    shuffle_u32(r, order, n_pool);
    for (uint32_t i = 0; i < n_pool; i++)
        check(kvp_release(cache, order[i]), "kvp_release (scramble)");
    free(order);
}

/* Time n lookups of the prompts prompts[idx[k]] (k = 0 .. n), each of len tokens; ns each. */
__attribute__((noinline)) static double time_lookups(kvp_cache *cache, const kvp_namespace *ns,
                                                     const uint32_t *base, size_t len,
                                                     const uint32_t *idx, size_t n, uint32_t *ids,
                                                     size_t cap, uint32_t expect)
{
    kvp_match m;
    uint64_t t0 = now_ns();
    for (size_t k = 0; k < n; k++)
        check(kvp_lookup(cache, ns, base + (size_t)idx[k] * len, len, ids, cap, &m), "kvp_lookup");
    uint64_t t1 = now_ns();
    if (m.n_blocks_cached != expect) {
        fprintf(stderr, "bench_core: lookup found %u cached blocks, expected %u\n",
                m.n_blocks_cached, expect);
        exit(1);
    }
    return (double)(t1 - t0) / (double)n;
}

static void print_lat(const char *what, double *v, int n, double *med_out, double *min_out)
{
    double mn = min_of(v, n), med = median_of(v, n);
    printf("  %-46s %10.2f %10.2f\n", what, med / 1000.0, mn / 1000.0);
    if (med_out)
        *med_out = med / 1000.0;
    if (min_out)
        *min_out = mn / 1000.0;
}

static void bench_lookup(const opts *o, results *res)
{
    uint32_t n_pool = o->lookup_pool;
    uint32_t long_blk = LONG_TOKENS / BS, short_blk = SHORT_TOKENS / BS;
    uint32_t n_long = (uint32_t)((uint64_t)n_pool * 15 / 16 / long_blk);
    uint32_t n_short = (n_pool - n_long * long_blk) / short_blk;
    uint32_t n_rest = n_pool - n_long * long_blk - n_short * short_blk;
    if (n_long < 1 || n_short < 1) {
        fprintf(stderr, "bench_core: (b) needs a pool of at least 16 long prompts\n");
        exit(1);
    }
    printf("\n(b) lookup: pool %u blocks, filled with %u x 128k-token + %u x 8k-token prompts"
           "%s%s\n",
           n_pool, n_long, n_short, n_rest ? " + one filler" : "",
           o->scramble ? ", block ids scattered (free list shuffled first)"
                       : ", block ids contiguous per prompt (--no-scramble)");
    rng r = {o->seed ^ 0xb};
    size_t long_tok = (size_t)n_long * LONG_TOKENS, short_tok = (size_t)n_short * SHORT_TOKENS;
    uint32_t *longs = xmalloc(long_tok * sizeof *longs);
    uint32_t *shorts = xmalloc(short_tok * sizeof *shorts);
    uint32_t *rest = xmalloc(((size_t)n_rest * BS + 1) * sizeof *rest);
    fill_tokens(&r, longs, long_tok);
    fill_tokens(&r, shorts, short_tok);
    fill_tokens(&r, rest, (size_t)n_rest * BS);

    kvp_namespace ns;
    bench_namespace(&ns);
    kvp_cache *cache;
    /* (b) measures the xxh3 profile: its floor below is raw seeded XXH3 with the probes'
     * keys from kvp_hash_blocks (bench_hash times the 128k lookup under every profile). */
    g_profile = KVP_HASH_XXH3;
    new_cache(n_pool, false, NULL, &cache);
    g_profile = KVP_HASH_KEYED;
    uint64_t t0 = now_ns();
    if (o->scramble)
        scramble_pool(cache, &ns, n_pool, &r);
    uint64_t t1 = now_ns();
    kvp_match m;
    for (uint32_t i = 0; i < n_long; i++)
        check(kvp_access(cache, &ns, longs + (size_t)i * LONG_TOKENS, LONG_TOKENS, &m),
              "kvp_access");
    for (uint32_t i = 0; i < n_short; i++)
        check(kvp_access(cache, &ns, shorts + (size_t)i * SHORT_TOKENS, SHORT_TOKENS, &m),
              "kvp_access");
    if (n_rest)
        check(kvp_access(cache, &ns, rest, (size_t)n_rest * BS, &m), "kvp_access");
    uint64_t t2 = now_ns();
    kvp_stats st;
    check(kvp_cache_stats(cache, &st), "kvp_cache_stats");
    printf("  setup: scramble %.2f s, fill %.2f s (%.0f ns/block via kvp_access); "
           "cached blocks %u of %u, evictions %llu\n",
           (double)(t1 - t0) / 1e9, (double)(t2 - t1) / 1e9, (double)(t2 - t1) / (double)n_pool,
           st.n_blocks_cached, st.n_blocks_total, (unsigned long long)st.n_evictions);

    /* Query orders: every long (short) prompt once per rep, shuffled per rep. */
    int reps = o->reps;
    uint32_t n_hot = o->quick ? 5 : 20, n_miss = 2000;
    uint32_t *ids = xmalloc((size_t)long_blk * sizeof *ids);
    uint32_t *ord_long = xmalloc((size_t)n_long * sizeof *ord_long);
    uint32_t *ord_short = xmalloc((size_t)n_short * sizeof *ord_short);
    uint32_t *zeros = calloc(n_hot > n_miss ? n_hot : n_miss, sizeof *zeros);
    for (uint32_t i = 0; i < n_long; i++)
        ord_long[i] = i;
    for (uint32_t i = 0; i < n_short; i++)
        ord_short[i] = i;
    /* The miss prompt: the first long prompt with its first token changed. */
    uint32_t *miss = xmalloc(LONG_TOKENS * sizeof *miss);
    memcpy(miss, longs, LONG_TOKENS * sizeof *miss);
    miss[0] ^= 0x80000000u;

    double v_long[64], v_short[64], v_hot[64], v_shot[64], v_miss[64];
    /* Warm-up: one pass of each kind. */
    time_lookups(cache, &ns, longs, LONG_TOKENS, ord_long, n_long, ids, long_blk, long_blk);
    time_lookups(cache, &ns, shorts, SHORT_TOKENS, ord_short, n_short, ids, short_blk, short_blk);
    for (int i = 0; i < reps; i++) {
        shuffle_u32(&r, ord_long, n_long);
        shuffle_u32(&r, ord_short, n_short);
        v_long[i] =
            time_lookups(cache, &ns, longs, LONG_TOKENS, ord_long, n_long, ids, long_blk, long_blk);
        v_short[i] = time_lookups(cache, &ns, shorts, SHORT_TOKENS, ord_short, n_short, ids,
                                  short_blk, short_blk);
        v_hot[i] =
            time_lookups(cache, &ns, longs, LONG_TOKENS, zeros, n_hot, ids, long_blk, long_blk);
        v_shot[i] = time_lookups(cache, &ns, shorts, SHORT_TOKENS, zeros, n_hot * 10, ids,
                                 short_blk, short_blk);
        v_miss[i] = time_lookups(cache, &ns, miss, LONG_TOKENS, zeros, n_miss, ids, long_blk, 0);
    }

    /* The floor: 8192 raw chain steps over one long prompt's records (hot), plus 8192
     * independent probes per prompt with precomputed keys, round-robin over all prompts. */
    kvp_key root;
    check(kvp_namespace_key(KVP_DEFAULT_SEED, &ns, &root), "kvp_namespace_key");
    kvp_key *keys = xmalloc((size_t)n_long * long_blk * sizeof *keys);
    size_t n_keys;
    for (uint32_t i = 0; i < n_long; i++)
        check(kvp_hash_blocks(KVP_DEFAULT_SEED, root, longs + (size_t)i * LONG_TOKENS, LONG_TOKENS,
                              BS, keys + (size_t)i * long_blk, long_blk, &n_keys),
              "kvp_hash_blocks");
    unsigned char *rec = make_records(longs, long_blk);
    kvp_key *k_raw = xmalloc((size_t)long_blk * sizeof *k_raw);
    double v_fh[64], v_fp[64];
    raw_chain(rec, long_blk, root, KVP_DEFAULT_SEED, k_raw);
    size_t found = 0;
    for (int i = 0; i < reps; i++) {
        uint64_t a = now_ns();
        for (uint32_t k = 0; k < n_hot; k++)
            raw_chain(rec, long_blk, root, KVP_DEFAULT_SEED, k_raw);
        uint64_t b = now_ns();
        shuffle_u32(&r, ord_long, n_long);
        found = 0;
        uint64_t c = now_ns();
        for (uint32_t p = 0; p < n_long; p++) {
            const kvp_key *kp = keys + (size_t)ord_long[p] * long_blk;
            for (uint32_t k = 0; k < long_blk; k++)
                found += kvp__index_find(&cache->index, kp[k]) != NULL;
        }
        uint64_t d = now_ns();
        v_fh[i] = (double)(b - a) / n_hot;
        v_fp[i] = (double)(d - c) / n_long;
    }
    if (found != (size_t)n_long * long_blk || memcmp(k_raw, keys, long_blk * sizeof *keys)) {
        fprintf(stderr, "bench_core: floor keys disagree with the cache\n");
        exit(1);
    }

    printf("  %-46s %10s %10s\n", "us per kvp_lookup", "median", "min");
    print_lat("128k cached, round-robin over all (headline)", v_long, reps, &res->b_long_us,
              &res->b_long_min_us);
    print_lat("128k cached, same prompt repeated (warm)", v_hot, reps, &res->b_long_hot_us, NULL);
    print_lat("8k cached, round-robin over all", v_short, reps, &res->b_short_us, NULL);
    print_lat("8k cached, same prompt repeated (warm)", v_shot, reps, NULL, NULL);
    print_lat("128k full miss (first block absent)", v_miss, reps, &res->b_miss_us, NULL);
    double fh_med = median_of(v_fh, reps), fp_med = median_of(v_fp, reps);
    double fh_min = min_of(v_fh, reps), fp_min = min_of(v_fp, reps);
    printf("  floor for 128k: %u x raw XXH3-128 of 80 B (chained) %.1f us (min %.1f) "
           "+ %u x probe kvp__index_find %.1f us (min %.1f) = %.1f us\n",
           long_blk, fh_med / 1000.0, fh_min / 1000.0, long_blk, fp_med / 1000.0, fp_min / 1000.0,
           (fh_med + fp_med) / 1000.0);
    printf("  per block: lookup %.1f ns; serial parts: hash %.1f ns + unprefetched probe %.1f ns "
           "(lookup overlaps them, so it can be lower than their sum)\n",
           res->b_long_us * 1000.0 / long_blk, fh_med / long_blk, fp_med / long_blk);
    res->b_floor_us = (fh_med + fp_med) / 1000.0;
    res->ran_b = true;
    kvp_cache_free(cache);
    free(longs);
    free(shorts);
    free(rest);
    free(ids);
    free(ord_long);
    free(ord_short);
    free(zeros);
    free(miss);
    free(keys);
    free(rec);
    free(k_raw);
}

/* ---------------------------------------------------------------------------------- */
/* (c) steady-state workload                                                          */
/* ---------------------------------------------------------------------------------- */

typedef struct workload {
    uint32_t n_sys;       /* shared system prompts */
    uint32_t *sys_tokens; /* all system prompts back to back */
    size_t *sys_off;      /* offset of prompt s in sys_tokens */
    uint32_t *sys_len;    /* its length, 256 .. 2048 */
    double *cdf;          /* popularity: cdf[s] = P(pick <= s) */
    rng r;                /* the request stream */
    uint32_t *buf;        /* BATCH prompts, MAX_REQ_TOKENS apart */
    uint32_t len[BATCH];  /* length of each prompt in buf */
} workload;

static void workload_init(workload *w, const opts *o)
{
    w->n_sys = 1000;
    w->r.s = o->seed ^ 0xc;
    w->sys_off = xmalloc(w->n_sys * sizeof *w->sys_off);
    w->sys_len = xmalloc(w->n_sys * sizeof *w->sys_len);
    w->cdf = xmalloc(w->n_sys * sizeof *w->cdf);
    size_t total = 0;
    for (uint32_t s = 0; s < w->n_sys; s++) {
        w->sys_len[s] = rng_range(&w->r, 256, 2048);
        w->sys_off[s] = total;
        total += w->sys_len[s];
    }
    w->sys_tokens = xmalloc(total * sizeof *w->sys_tokens);
    fill_tokens(&w->r, w->sys_tokens, total);
    double sum = 0;
    for (uint32_t s = 0; s < w->n_sys; s++)
        sum += 1.0 / pow((double)s + 1.0, o->zipf);
    double acc = 0;
    for (uint32_t s = 0; s < w->n_sys; s++) {
        acc += 1.0 / pow((double)s + 1.0, o->zipf) / sum;
        w->cdf[s] = acc;
    }
    w->cdf[w->n_sys - 1] = 1.0;
    w->buf = xmalloc((size_t)BATCH * MAX_REQ_TOKENS * sizeof *w->buf);
}

static void workload_free(workload *w)
{
    free(w->sys_tokens);
    free(w->sys_off);
    free(w->sys_len);
    free(w->cdf);
    free(w->buf);
}

/* Generate n prompts into w->buf: length uniform 512..8192, the picked system prompt (or
 * its first `length` tokens), then random tokens. */
static void workload_gen(workload *w, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t len = rng_range(&w->r, 512, MAX_REQ_TOKENS);
        double u = (double)(rng_next(&w->r) >> 11) * 0x1.0p-53;
        uint32_t lo = 0, hi = w->n_sys - 1;
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (w->cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        uint32_t s = lo, pre = w->sys_len[s] < len ? w->sys_len[s] : len;
        uint32_t *dst = w->buf + (size_t)k * MAX_REQ_TOKENS;
        memcpy(dst, w->sys_tokens + w->sys_off[s], pre * sizeof *dst);
        fill_tokens(&w->r, dst + pre, len - pre);
        w->len[k] = len;
    }
}

/* The timed region: requests first_id .. first_id + n - 1 from w->buf. Each does
 * [kvp_lookup], kvp_acquire, kvp_commit of the whole prompt, then releases the request
 * RING places older, so RING requests stay in flight. */
__attribute__((noinline)) static void run_batch(kvp_cache *cache, const kvp_namespace *ns,
                                                const workload *w, uint32_t n, uint64_t first_id,
                                                bool with_lookup, uint32_t *ids)
{
    kvp_match m;
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t *tok = w->buf + (size_t)k * MAX_REQ_TOKENS;
        uint64_t id = first_id + k;
        if (with_lookup)
            check(kvp_lookup(cache, ns, tok, w->len[k], ids, MAX_REQ_TOKENS / BS, &m),
                  "kvp_lookup");
        check(kvp_acquire(cache, id, ns, tok, w->len[k], 0, &m), "kvp_acquire");
        check(kvp_commit(cache, id, tok, w->len[k], NULL), "kvp_commit");
        if (id >= RING)
            check(kvp_release(cache, id - RING), "kvp_release");
    }
}

typedef struct wl_result {
    double rps_med, rps_best, rps_all; /* requests/s: median/best chunk, whole run */
    double hit;                        /* token hit rate over the measured requests */
    double gen_s, timed_s;             /* untimed generation, timed region (seconds) */
    uint64_t evictions;                /* over the measured requests */
} wl_result;

static wl_result run_workload(const opts *o, bool with_lookup)
{
    workload w;
    workload_init(&w, o);
    kvp_namespace ns;
    bench_namespace(&ns);
    kvp_cache *cache;
    new_cache(o->wl_pool, false, NULL, &cache);
    uint32_t *ids = xmalloc((MAX_REQ_TOKENS / BS) * sizeof *ids);
    uint64_t id = 0;

    /* Warm-up: fill the pool and reach steady state (evicting), untimed. */
    for (uint32_t done = 0; done < o->n_warmup;) {
        uint32_t n = o->n_warmup - done < BATCH ? o->n_warmup - done : BATCH;
        workload_gen(&w, n);
        run_batch(cache, &ns, &w, n, id, with_lookup, ids);
        id += n;
        done += n;
    }
    kvp_stats s0, s1;
    check(kvp_cache_stats(cache, &s0), "kvp_cache_stats");

    int reps = o->reps;
    double rps[64];
    double gen_s = 0, timed_s = 0;
    for (int c = 0; c < reps; c++) {
        uint32_t chunk =
            o->n_requests / (uint32_t)reps + (c < (int)(o->n_requests % (uint32_t)reps));
        uint64_t chunk_ns = 0;
        for (uint32_t done = 0; done < chunk;) {
            uint32_t n = chunk - done < BATCH ? chunk - done : BATCH;
            uint64_t g0 = now_ns();
            workload_gen(&w, n);
            uint64_t t0 = now_ns();
            run_batch(cache, &ns, &w, n, id, with_lookup, ids);
            uint64_t t1 = now_ns();
            gen_s += (double)(t0 - g0) / 1e9;
            chunk_ns += t1 - t0;
            id += n;
            done += n;
        }
        rps[c] = (double)chunk / ((double)chunk_ns / 1e9);
        timed_s += (double)chunk_ns / 1e9;
    }
    check(kvp_cache_stats(cache, &s1), "kvp_cache_stats");
    wl_result res;
    res.rps_best = max_of(rps, reps);
    res.rps_med = median_of(rps, reps);
    res.rps_all = (double)o->n_requests / timed_s;
    res.hit = (double)(s1.n_tokens_hit - s0.n_tokens_hit) /
              (double)(s1.n_tokens_queried - s0.n_tokens_queried);
    res.gen_s = gen_s;
    res.timed_s = timed_s;
    res.evictions = s1.n_evictions - s0.n_evictions;
    check(kvp_cache_check(cache), "kvp_cache_check");
    kvp_cache_free(cache);
    free(ids);
    workload_free(&w);
    return res;
}

static void bench_workload(const opts *o, results *res)
{
    printf("\n(c) workload: %u requests (+%u warm-up), lengths 512..8192, 1000 system prompts "
           "of 256..2048 (Zipf s=%.2f), pool %u blocks, %u in flight\n",
           o->n_requests, o->n_warmup, o->zipf, o->wl_pool, RING);
    printf("  prompt generation: outside the timed region (batches of %u, cheap PRNG)\n", BATCH);
    printf("  %-36s %10s %10s %10s %8s %9s %9s\n", "flow", "req/s med", "best", "overall",
           "hit rate", "timed s", "gen s");
    wl_result a = run_workload(o, false);
    printf("  %-36s %10.0f %10.0f %10.0f %8.4f %9.2f %9.2f\n", "acquire+commit+release", a.rps_med,
           a.rps_best, a.rps_all, a.hit, a.timed_s, a.gen_s);
    wl_result b = run_workload(o, true);
    printf("  %-36s %10.0f %10.0f %10.0f %8.4f %9.2f %9.2f\n", "lookup+acquire+commit+release",
           b.rps_med, b.rps_best, b.rps_all, b.hit, b.timed_s, b.gen_s);
    g_single_threaded = true;
    wl_result u = run_workload(o, false);
    g_single_threaded = false;
    printf("  %-36s %10.0f %10.0f %10.0f %8.4f %9.2f %9.2f\n", "same, single_threaded (no lock)",
           u.rps_med, u.rps_best, u.rps_all, u.hit, u.timed_s, u.gen_s);
    printf("  thread-safe / single_threaded req/s: %.3f (median chunks, same run)\n",
           a.rps_med / u.rps_med);
    printf("  evictions during the measured requests: %llu (steady state: the pool is full)\n",
           (unsigned long long)a.evictions);
    res->ran_c = true;
    res->c_rps = a.rps_med;
    res->c_rps_best = a.rps_best;
    res->c_rps_lookup = b.rps_med;
    res->c_rps_lookup_best = b.rps_best;
    res->c_hit = a.hit;
}

/* ---------------------------------------------------------------------------------- */
/* (d) memory per cached block                                                        */
/* ---------------------------------------------------------------------------------- */

typedef struct counter {
    size_t live;      /* bytes currently allocated */
    size_t peak;      /* highest live */
    uint64_t n_alloc; /* allocations */
} counter;

static void *count_alloc(void *ud, size_t size)
{
    counter *c = ud;
    void *p = malloc(size);
    if (p) {
        c->live += size;
        c->peak = c->live > c->peak ? c->live : c->peak;
        c->n_alloc++;
    }
    return p;
}

static void count_free(void *ud, void *ptr, size_t size)
{
    counter *c = ud;
    if (!ptr)
        return;
    c->live -= size;
    free(ptr);
}

static double measure_memory(const opts *o, bool verify)
{
    counter cnt = {0, 0, 0};
    kvp_allocator hooks = {count_alloc, count_free, &cnt};
    kvp_namespace ns;
    bench_namespace(&ns);
    kvp_cache *cache;
    uint32_t n_pool = o->mem_pool;
    new_cache(n_pool, verify, &hooks, &cache);
    size_t after_new = cnt.live;
    rng r = {o->seed ^ 0xd};
    uint32_t *tok = xmalloc(SHORT_TOKENS * sizeof *tok);
    kvp_match m;
    for (uint32_t filled = 0; filled < n_pool;) {
        uint32_t blocks = n_pool - filled < SHORT_TOKENS / BS ? n_pool - filled : SHORT_TOKENS / BS;
        fill_tokens(&r, tok, (size_t)blocks * BS);
        check(kvp_access(cache, &ns, tok, (size_t)blocks * BS, &m), "kvp_access");
        filled += blocks;
    }
    kvp_stats st;
    check(kvp_cache_stats(cache, &st), "kvp_cache_stats");
    double bpb = (double)cnt.live / (double)st.n_blocks_cached;
    printf("  %-20s %12zu %12zu %12u %10.1f %13s\n",
           verify ? "verify_tokens=true" : "verify_tokens=false", after_new, cnt.live,
           st.n_blocks_cached, bpb, cnt.live == cache->mem.live_bytes ? "agrees" : "DISAGREES");
    if (st.n_blocks_cached != n_pool) {
        fprintf(stderr, "bench_core: (d) cached %u of %u blocks\n", st.n_blocks_cached, n_pool);
        exit(1);
    }
    kvp_cache_free(cache);
    if (cnt.live != 0)
        printf("  warning: %zu bytes still live after kvp_cache_free\n", cnt.live);
    free(tok);
    return bpb;
}

static void bench_memory(const opts *o, results *res)
{
    printf("\n(d) memory: pool %u blocks, every block cached (kvp_access of 8k-token prompts), "
           "bytes counted by a kvp_allocator hook\n",
           o->mem_pool);
    printf("  %-20s %12s %12s %12s %10s %13s\n", "mode", "live@new", "live@full", "cached",
           "B/block", "library count");
    res->d_bpb = measure_memory(o, false);
    res->d_bpb_verify = measure_memory(o, true);
    printf("  layout: sizeof(kvp__block) = %zu, uthash bucket = %zu B per bucket "
           "(buckets = next power of two >= pool)\n",
           sizeof(kvp__block), sizeof(UT_hash_bucket));
    res->ran_d = true;
}

/* ---------------------------------------------------------------------------------- */
/* Summary                                                                            */
/* ---------------------------------------------------------------------------------- */

static void row(const char *what, const char *fmt_val, double val, const char *target, int verdict)
{
    char v[32];
    snprintf(v, sizeof v, "%.3f", val);
    if (fmt_val[0] == '0')
        snprintf(v, sizeof v, "%.0f", val);
    else if (fmt_val[0] == '1')
        snprintf(v, sizeof v, "%.1f", val);
    else if (fmt_val[0] == '2')
        snprintf(v, sizeof v, "%.2f", val);
    printf("  %-44s %12s  %-12s %s\n", what, v, target,
           verdict < 0 ? "-"
           : verdict   ? "PASS"
                       : "MISS");
}

static void print_summary(const results *r)
{
    printf("\nSummary (medians of this run)\n");
    printf("  %-44s %12s  %-12s %s\n", "figure", "value", "target", "result");
    if (r->ran_a) {
        row("(a) hashing ours/raw (x)", "3", r->a_ratio, "<= 1.30", r->a_ratio <= 1.3);
        row("(a) ours/raw, L2-resident 32k tokens (x)", "3", r->a_hot_ratio, "", -1);
        row("(a) kvp_hash_blocks ns/token", "3", r->a_ours_ns_tok, "", -1);
        row("(a) raw XXH3 chain ns/token", "3", r->a_raw_ns_tok, "", -1);
    }
    if (r->ran_b) {
        row("(b) lookup 128k cached (us)", "1", r->b_long_us, "< 800", r->b_long_us < 800.0);
        row("(b) lookup 128k cached, warm (us)", "1", r->b_long_hot_us, "", -1);
        row("(b) lookup 8k cached (us)", "2", r->b_short_us, "", -1);
        row("(b) lookup 128k full miss (us)", "3", r->b_miss_us, "", -1);
        row("(b) floor 8192 x (hash + probe) (us)", "1", r->b_floor_us, "", -1);
    }
    if (r->ran_c) {
        row("(c) req/s acquire+commit+release", "0", r->c_rps, "> 25000", r->c_rps > 25000.0);
        row("(c) req/s lookup+acquire+commit+release", "0", r->c_rps_lookup, "> 25000",
            r->c_rps_lookup > 25000.0);
        row("(c) token hit rate", "3", r->c_hit, "~0.14", fabs(r->c_hit - 0.14) <= 0.02);
    }
    if (r->ran_d) {
        row("(d) bytes/cached block", "1", r->d_bpb, "<= 128", r->d_bpb <= 128.0);
        row("(d) bytes/cached block, verify_tokens", "1", r->d_bpb_verify, "", -1);
    }
    printf("SUMMARY a_ratio=%.4f a_ours_ns_tok=%.4f a_raw_ns_tok=%.4f b_128k_us=%.2f "
           "b_128k_warm_us=%.2f a_hot_ratio=%.4f b_8k_us=%.3f "
           "b_miss_us=%.4f b_floor_us=%.2f c_rps=%.0f "
           "c_rps_lookup=%.0f c_hit=%.4f d_bpb=%.2f d_bpb_verify=%.2f\n",
           r->a_ratio, r->a_ours_ns_tok, r->a_raw_ns_tok, r->b_long_us, r->b_long_hot_us,
           r->a_hot_ratio, r->b_short_us, r->b_miss_us, r->b_floor_us, r->c_rps, r->c_rps_lookup,
           r->c_hit, r->d_bpb, r->d_bpb_verify);
}

/* ---------------------------------------------------------------------------------- */
/* main                                                                               */
/* ---------------------------------------------------------------------------------- */

static void usage(void)
{
    printf("usage: bench_core [--quick] [--reps N] [--only abcd] [--no-scramble]\n"
           "                  [--requests N] [--warmup N] [--zipf S] [--seed N]\n"
           "                  [--lookup-pool N] [--mem-pool N] [--hash-tokens N]\n"
           "                  [--eviction lru|slru|s3fifo|cdecay] [--cdecay-ghost-pct N]\n"
           "  --quick        smaller (a) and (c), 3 reps: a few seconds\n"
           "  --reps N       repetitions per figure, 3..63 (default 7)\n"
           "  --only LIST    run only these parts, e.g. --only bc\n"
           "  --no-scramble  (b): keep each prompt's block ids contiguous\n"
           "  --requests N   (c) measured requests (default 100000); --warmup N (10000)\n"
           "  --zipf S       (c) popularity exponent of the system prompts (default 0.4)\n"
           "  --eviction P   every cache's eviction policy (default lru)\n"
           "  --cdecay-ghost-pct N  kvp_config.cdecay_ghost_pct (default 0: the library's)\n");
}

int main(int argc, char **argv)
{
    opts o = {7,     false,  "abcd", (size_t)8 << 20, 1u << 20, true, 100000,
              10000, 200000, 0.4,    1u << 20,        42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o.quick = true;
            o.reps = 3;
            o.hash_tokens = (size_t)2 << 20;
            o.n_requests = 15000;
            o.n_warmup = 3000;
        } else if (!strcmp(a, "--no-scramble")) {
            o.scramble = false;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        } else if (v && !strcmp(a, "--reps")) {
            o.reps = atoi(v), i++;
        } else if (v && !strcmp(a, "--only")) {
            o.only = v, i++;
        } else if (v && !strcmp(a, "--requests")) {
            o.n_requests = (uint32_t)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--warmup")) {
            o.n_warmup = (uint32_t)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--zipf")) {
            o.zipf = strtod(v, NULL), i++;
        } else if (v && !strcmp(a, "--seed")) {
            o.seed = strtoull(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--lookup-pool")) {
            o.lookup_pool = (uint32_t)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--mem-pool")) {
            o.mem_pool = (uint32_t)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--eviction")) {
            g_eviction = !strcmp(v, "slru")     ? KVP_EVICT_SLRU
                         : !strcmp(v, "s3fifo") ? KVP_EVICT_S3FIFO
                         : !strcmp(v, "cdecay") ? KVP_EVICT_CDECAY
                         : !strcmp(v, "lru")    ? KVP_EVICT_LRU
                                                : -1;
            if (g_eviction < 0) {
                fprintf(stderr, "bench_core: --eviction takes lru, slru, s3fifo or cdecay\n");
                return 2;
            }
            i++;
        } else if (v && !strcmp(a, "--cdecay-ghost-pct")) {
            g_cdecay_ghost_pct = (uint32_t)strtoul(v, NULL, 10), i++;
        } else if (v && !strcmp(a, "--hash-tokens")) {
            o.hash_tokens = (size_t)strtoull(v, NULL, 10), i++;
        } else {
            fprintf(stderr, "bench_core: unknown or incomplete option %s\n", a);
            usage();
            return 2;
        }
    }
    if (o.reps < 3 || o.reps > 63 || o.hash_tokens < BS || o.n_requests < (uint32_t)o.reps ||
        o.mem_pool == 0) {
        fprintf(stderr, "bench_core: bad option value\n");
        return 2;
    }
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    fprintf(stderr, "bench_core: the raw hashing baseline assumes a little-endian host\n");
    return 2;
#endif
    print_header(&o);
    results res;
    memset(&res, 0, sizeof res);
    uint64_t t0 = now_ns();
    if (want(&o, 'a'))
        bench_hash(&o, &res);
    if (want(&o, 'b'))
        bench_lookup(&o, &res);
    if (want(&o, 'c'))
        bench_workload(&o, &res);
    if (want(&o, 'd'))
        bench_memory(&o, &res);
    print_summary(&res);
    printf("total runtime %.1f s\n", (double)(now_ns() - t0) / 1e9);
    return 0;
}
