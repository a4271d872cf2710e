/*
 * bench_hash.c - the cost of each hash profile, measured side by side in one run
 * (docs/hash-profiles.md quotes its output).
 *
 *   (a) per block  ns per 16-token block over a 128k-token prompt (8192 chained blocks,
 *                  tokens uniform below 2^17): raw XXH3-128 with a seed on the same 80-byte
 *                  inputs (parent || tokens, assembled the same way) as the reference, then
 *                  each profile as the cache's lookup loop hashes it (kvp__hash_block16 and
 *                  kvp__hash_block16_secret for xxh3 and keyed, kvp__cache_chain for the
 *                  others) and through the public kvp_hasher_blocks,
 *                  and the two keyed PRFs of design (a) called raw on the same bytes:
 *                  libsodium's SipHash-2-4-128 (crypto_shorthash_siphashx24) and keyed
 *                  BLAKE2b-128 (crypto_generichash). The ratio column divides by the raw XXH3
 *                  median of the same run.
 *   (b) lookup     per profile: a 1M-block cache (block size 16) filled to the last block
 *                  with 128 distinct 128k-token prompts after the free list was shuffled (so
 *                  a prompt's blocks are scattered as after eviction), then kvp_lookup of
 *                  every prompt once per rep in a shuffled order (each lookup fully cached).
 *                  All five caches exist at once and the reps interleave the profiles, so a
 *                  busy machine slows them alike (their ratio is the figure to read).
 *   (c) memory     per profile: live bytes of a cache with every block cached, counted by a
 *                  kvp_allocator hook, divided by the cached blocks.
 *
 * Every figure is the median of --reps runs (default 5) after a warm-up; min beside it.
 * Options: --reps N, --pool N (blocks of (b) and (c), default 1048576), --quick (pool 64k).
 * Links the internal library for kvp__cache_chain (the exact hashing of the lookup loop).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#define BENCH_PROG "bench_hash"
#include "benchutil.h"

#include "blockhash.h" /* internal.h, and xxhash.h with XXH_INLINE_ALL */

#define BS          16u
#define LONG_TOKENS 131072u /* 128k tokens: 8192 blocks */
#define LONG_BLOCKS (LONG_TOKENS / BS)
#define MAX_REPS    64

static const int profiles[] = {KVP_HASH_XXH3, KVP_HASH_KEYED, KVP_HASH_SIPHASH,
                               KVP_HASH_VLLM_XXHASH, KVP_HASH_VLLM_SHA256};
#define N_PROFILES (int)(sizeof profiles / sizeof profiles[0])

typedef struct opts {
    int reps;      /* repetitions per figure */
    uint32_t pool; /* blocks in the caches of (b) and (c) */
} opts;

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void fill_tokens(uint64_t *s, uint32_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = (uint32_t)rng_next(s) & 0x1ffffu;
}

static void shuffle_u32(uint64_t *s, uint32_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rng_next(s) % i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static kvp_config profile_config(int profile, uint32_t n_blocks)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = n_blocks;
    cfg.block_size = BS;
    cfg.hash_profile = profile;
    return cfg;
}

static void bench_namespace(int profile, kvp_namespace *ns)
{
    kvp_namespace_init(ns);
    if (profile == KVP_HASH_VLLM_SHA256 || profile == KVP_HASH_VLLM_XXHASH) {
        ns->salt = kvp_field_str("tenant-0"); /* vLLM keys have no model/tenant field */
        return;
    }
    ns->model = kvp_field_str("bench-model-8b");
    ns->tenant = kvp_field_str("tenant-0");
}

/* ------------------------------------------------------------------ (a) per block */

static volatile uint64_t sink; /* keeps the chains' results alive */

/* The methods of (a): 0 raw XXH3, 1..5 profiles via the cache, 6..10 via kvp_hasher_blocks,
 * 11 raw SipHash, 12 raw BLAKE2b. Returns ns per block of one 8192-block chain. */
static double time_chain(int method, kvp_cache **caches, const uint32_t *t, kvp_chain *out)
{
    static const unsigned char k16[16] = {1, 2, 3};
    kvp_key key = {1, 2}, high = {0, 0};
    unsigned char buf[80], o16[16];
    kvp_namespace ns;
    uint64_t t0 = now_ns();
    if (method == 0) {
        for (uint32_t i = 0; i < LONG_BLOCKS; i++) {
            kvp__put_key(buf, key);
            memcpy(buf + 16, t + i * BS, 64);
            key = kvp__from_xxh(XXH3_128bits_withSeed(buf, 80, 0));
        }
    } else if (method <= N_PROFILES) {
        kvp_cache *c = caches[method - 1];
        bench_namespace(profiles[method - 1], &ns);
        kvp__vctx vx = kvp__hasher_vctx(&ns);
        /* As match_mode() in lifecycle.c: 16-token xxh3 and keyed blocks are specialised. */
        if (c->hasher.profile == KVP_HASH_XXH3) {
            for (uint32_t i = 0; i < LONG_BLOCKS; i++)
                key = kvp__hash_block16(c->hasher.seed, key, t + i * BS);
        } else if (c->hasher.profile == KVP_HASH_KEYED) {
            for (uint32_t i = 0; i < LONG_BLOCKS; i++)
                key = kvp__hash_block16_secret(c->hasher.secret, key, t + i * BS);
        } else {
            for (uint32_t i = 0; i < LONG_BLOCKS; i++)
                kvp__cache_chain(c, &vx, &key, &high, t + i * BS, i);
        }
    } else if (method <= 2 * N_PROFILES) {
        const kvp_hasher *h = kvp_cache_hasher(caches[method - 1 - N_PROFILES]);
        bench_namespace(profiles[method - 1 - N_PROFILES], &ns);
        kvp_chain c;
        size_t n;
        check(kvp_hasher_root(h, &ns, &c), "kvp_hasher_root");
        check(kvp_hasher_blocks(h, &ns, &c, t, LONG_TOKENS, out, LONG_BLOCKS, &n), "blocks");
        key = c.key;
    } else {
        for (uint32_t i = 0; i < LONG_BLOCKS; i++) {
            kvp__put_key(buf, key);
            memcpy(buf + 16, t + i * BS, 64);
            if (method == 2 * N_PROFILES + 1)
                crypto_shorthash_siphashx24(o16, buf, 80, k16);
            else
                crypto_generichash(o16, 16, buf, 80, k16, 16);
            memcpy(&key, o16, 16);
        }
    }
    uint64_t t1 = now_ns();
    sink ^= key.lo;
    return (double)(t1 - t0) / LONG_BLOCKS;
}

static const char *method_name(int m, char *tmp)
{
    if (m == 0)
        return "raw XXH3-128 (seed), 80-byte inputs";
    if (m <= N_PROFILES)
        sprintf(tmp, "%s (cache's lookup loop)", kvp_hash_profile_name(profiles[m - 1]));
    else if (m <= 2 * N_PROFILES)
        sprintf(tmp, "%s (kvp_hasher_blocks)", kvp_hash_profile_name(profiles[m - 1 - N_PROFILES]));
    else
        return m == 2 * N_PROFILES + 1 ? "raw SipHash-2-4-128 (libsodium)"
                                       : "raw BLAKE2b-128 keyed (libsodium)";
    return tmp;
}

static void bench_blocks(const opts *o)
{
    enum { N_METHODS = 2 * N_PROFILES + 3 };
    uint64_t s = 0xa;
    uint32_t *t = xmalloc(LONG_TOKENS * sizeof *t);
    kvp_chain *out = xmalloc(LONG_BLOCKS * sizeof *out);
    fill_tokens(&s, t, LONG_TOKENS);
    kvp_cache *caches[N_PROFILES];
    for (int p = 0; p < N_PROFILES; p++) {
        kvp_config cfg = profile_config(profiles[p], 16);
        check(kvp_cache_new(&cfg, &caches[p]), "kvp_cache_new");
    }
    static double v[N_METHODS][MAX_REPS];
    for (int m = 0; m < N_METHODS; m++)
        time_chain(m, caches, t, out); /* warm-up */
    for (int r = 0; r < o->reps; r++)
        for (int m = 0; m < N_METHODS; m++)
            v[m][r] = time_chain(m, caches, t, out);
    printf("(a) ns per 16-token block, 8192-block chain, median of %d (min)\n", o->reps);
    double raw = 0;
    for (int m = 0; m < N_METHODS; m++) {
        char tmp[96];
        double mn = v[m][0];
        for (int r = 1; r < o->reps; r++)
            mn = v[m][r] < mn ? v[m][r] : mn;
        double med = bench_median(v[m], o->reps);
        if (m == 0)
            raw = med;
        printf("  %-44s %8.1f ns (%6.1f)  x%.2f of raw XXH3\n", method_name(m, tmp), med, mn,
               med / raw);
    }
    for (int p = 0; p < N_PROFILES; p++)
        kvp_cache_free(caches[p]);
    free(t);
    free(out);
}

/* ------------------------------------------------------------------ (b) lookup, (c) memory */

typedef struct counter {
    size_t live; /* bytes allocated and not freed */
} counter;

static void *count_alloc(void *ud, size_t size)
{
    counter *c = ud;
    void *p = malloc(size);
    if (p)
        c->live += size;
    return p;
}

static void count_free(void *ud, void *ptr, size_t size)
{
    counter *c = ud;
    if (ptr) {
        c->live -= size;
        free(ptr);
    }
}

/* Shuffle the free list through one-block requests released in a random order. */
static void scramble_pool(kvp_cache *cache, const kvp_namespace *ns, uint32_t n_pool, uint64_t *s)
{
    uint32_t one = 1;
    kvp_match m;
    uint32_t *order = xmalloc((size_t)n_pool * sizeof *order);
    for (uint32_t i = 0; i < n_pool; i++) {
        check(kvp_acquire(cache, i, ns, &one, 1, BS, &m), "kvp_acquire (scramble)");
        order[i] = i;
    }
    shuffle_u32(s, order, n_pool);
    for (uint32_t i = 0; i < n_pool; i++)
        check(kvp_release(cache, order[i]), "kvp_release (scramble)");
    free(order);
}

/* One profile's cache for (b): filled to the last block, its allocator's live bytes. */
typedef struct lcache {
    kvp_cache *cache;   /* the cache */
    kvp_namespace ns;   /* the namespace every prompt was cached in */
    counter cnt;        /* live bytes through the cache's hooks */
    double fill_ns;     /* kvp_access time per block while filling */
    double v[MAX_REPS]; /* us per lookup, per rep */
} lcache;

static void fill_profile(const opts *o, int profile, const uint32_t *prompts, uint32_t n_prompts,
                         lcache *lc)
{
    kvp_config cfg = profile_config(profile, o->pool);
    cfg.alloc.alloc = count_alloc;
    cfg.alloc.free = count_free;
    cfg.alloc.ud = &lc->cnt;
    check(kvp_cache_new(&cfg, &lc->cache), "kvp_cache_new");
    bench_namespace(profile, &lc->ns);
    uint64_t s = 0xb;
    scramble_pool(lc->cache, &lc->ns, o->pool, &s);
    kvp_match m;
    uint64_t f0 = now_ns();
    for (uint32_t i = 0; i < n_prompts; i++)
        check(kvp_access(lc->cache, &lc->ns, prompts + (size_t)i * LONG_TOKENS, LONG_TOKENS, &m),
              "kvp_access");
    lc->fill_ns = (double)(now_ns() - f0) / ((double)n_prompts * LONG_BLOCKS);
}

/* One pass: every prompt looked up once, in the order ord. Returns us per lookup. */
static double lookup_pass(lcache *lc, const uint32_t *prompts, const uint32_t *ord,
                          uint32_t n_prompts, uint32_t *ids)
{
    kvp_match m;
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < n_prompts; i++) {
        check(kvp_lookup(lc->cache, &lc->ns, prompts + (size_t)ord[i] * LONG_TOKENS, LONG_TOKENS,
                         ids, LONG_BLOCKS, &m),
              "kvp_lookup");
        if (m.n_blocks_cached != LONG_BLOCKS) {
            fprintf(stderr, "bench_hash: lookup found %u blocks\n", m.n_blocks_cached);
            exit(1);
        }
    }
    return (double)(now_ns() - t0) / n_prompts / 1000.0;
}

/* All profiles' caches are built first, then every rep runs one pass per profile, the
 * profile order rotating per rep, so that load from other processes falls on all alike. */
static void bench_lookup(const opts *o)
{
    uint32_t n_prompts = o->pool / LONG_BLOCKS;
    uint64_t s = 0xc;
    uint32_t *prompts = xmalloc((size_t)n_prompts * LONG_TOKENS * sizeof *prompts);
    uint32_t *ord = xmalloc(n_prompts * sizeof *ord);
    uint32_t *ids = xmalloc(LONG_BLOCKS * sizeof *ids);
    fill_tokens(&s, prompts, (size_t)n_prompts * LONG_TOKENS);
    for (uint32_t i = 0; i < n_prompts; i++)
        ord[i] = i;
    printf("\n(b)+(c) %u-block cache, %u x 128k-token prompts (block ids scattered): cached "
           "128k lookup, median of %d interleaved passes (min); bytes per cached block\n",
           o->pool, n_prompts, o->reps);
    static lcache lc[N_PROFILES];
    for (int p = 0; p < N_PROFILES; p++)
        fill_profile(o, profiles[p], prompts, n_prompts, &lc[p]);
    for (int p = 0; p < N_PROFILES; p++)
        lookup_pass(&lc[p], prompts, ord, n_prompts, ids); /* warm-up */
    for (int r = 0; r < o->reps; r++) {
        shuffle_u32(&s, ord, n_prompts);
        for (int k = 0; k < N_PROFILES; k++) {
            int p = (k + r) % N_PROFILES;
            lc[p].v[r] = lookup_pass(&lc[p], prompts, ord, n_prompts, ids);
        }
    }
    for (int p = 0; p < N_PROFILES; p++) {
        kvp_stats st;
        check(kvp_cache_stats(lc[p].cache, &st), "kvp_cache_stats");
        double mn = lc[p].v[0];
        for (int r = 1; r < o->reps; r++)
            mn = lc[p].v[r] < mn ? lc[p].v[r] : mn;
        printf("  %-18s %10.1f us (%7.1f)  fill %6.0f ns/block  %8.1f bytes/cached block\n",
               kvp_hash_profile_name(profiles[p]), bench_median(lc[p].v, o->reps), mn,
               lc[p].fill_ns, (double)lc[p].cnt.live / (double)st.n_blocks_cached);
        kvp_cache_free(lc[p].cache);
    }
    free(prompts);
    free(ord);
    free(ids);
}

int main(int argc, char **argv)
{
    opts o = {5, 1u << 20};
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            o.reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--pool") == 0 && i + 1 < argc)
            o.pool = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--quick") == 0)
            o.pool = 1u << 16;
        else {
            fprintf(stderr, "usage: bench_hash [--reps N] [--pool BLOCKS] [--quick]\n");
            return 2;
        }
    }
    if (o.reps < 1 || o.reps > MAX_REPS || o.pool < LONG_BLOCKS) {
        fprintf(stderr, "bench_hash: --reps 1..%d, --pool >= %u\n", MAX_REPS, LONG_BLOCKS);
        return 2;
    }
    if (sodium_init() < 0)
        return 1;
    bench_blocks(&o);
    bench_lookup(&o);
    return 0;
}
