/*
 * bench_verify.c - what collision-proof mode and its collision-tolerant index cost, measured
 * side by side in one run (issue 13 item 3; docs/security.md quotes the figures).
 *
 * A cache of --pool blocks (default 262144) of 16 tokens is filled with distinct 8k-token
 * prompts, then holds one 128k-token prompt P (8192 blocks) of tenant A. Measured, each
 * --reps times (default 7), median and min reported:
 *   (1) lookup of P (8191 blocks hit):
 *       off      verify_tokens off;
 *       verify   verify_tokens on, no collisions;
 *       forced   verify_tokens on, and tenant B has stored a forged chain whose every block
 *                has exactly the key of P's block at the same position (the closed-form
 *                XXH3 collision of tests/lib/forge.c): every probe of P meets B's block first in
 *                its bucket (uthash inserts at the head), fails to verify it and goes on.
 *   (2) store of P: acquire + commit + release of P's 8192 blocks into a cache that does
 *       not hold them (kvp_cache_reset between reps, so the store runs into an emptied
 *       pool; the forged chain is re-stored untimed):
 *       off / verify / forced as above ("forced": every commit probe meets B's block).
 * Ratios are taken against "off" of the same repetition. Run it in a release build:
 *   meson setup build-rel --buildtype=release && ninja -C build-rel bench/bench_verify
 *   build-rel/bench/bench_verify [--pool N] [--reps N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "forge.h"
#define BENCH_PROG "bench_verify"
#include "benchutil.h"
#include "kvprefix.h"

#define BS       16u
#define LONG_TOK 131072u /* P: 8192 blocks */
#define FILL_TOK 8192u   /* filler prompts */
#define SEED     UINT64_C(0)
#define N_MODES  3
#define MAX_REPS 51

static const char *const mode_names[N_MODES] = {"off", "verify", "forced"};

static double minimum(const double *v, int n)
{
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Everything a run needs: the prompts and the three caches. */
typedef struct bench {
    uint32_t pool;
    kvp_namespace ns_a, ns_b, ns_fill;
    uint32_t *p;      /* P: LONG_TOK + 1 tokens */
    uint32_t *forged; /* B's chain: every block keyed like P's */
    kvp_cache *c[N_MODES];
} bench;

/* Forge B's chain: block 0 collides from B's root with P's block 0 from A's root; after
 * it B's chain has A's keys as parents, so each later block collides from the same parent. */
static void forge_chain(bench *b)
{
    kvp_key root_a, root_b;
    check(kvp_namespace_key(SEED, &b->ns_a, &root_a), "namespace_key");
    check(kvp_namespace_key(SEED, &b->ns_b, &root_b), "namespace_key");
    kvp_key parent_a = root_a, parent_b = root_b;
    for (uint32_t i = 0; i < LONG_TOK / BS; i++) {
        forge_collide(SEED, parent_a, b->p + (size_t)i * BS, parent_b, b->forged + (size_t)i * BS);
        kvp_key ka, kb;
        size_t n;
        check(kvp_hash_blocks(SEED, parent_a, b->p + (size_t)i * BS, BS, BS, &ka, 1, &n), "hash");
        check(kvp_hash_blocks(SEED, parent_b, b->forged + (size_t)i * BS, BS, BS, &kb, 1, &n),
              "hash");
        if (ka.lo != kb.lo || ka.hi != kb.hi) {
            fprintf(stderr, "bench_verify: forged block %u does not collide\n", i);
            exit(1);
        }
        parent_a = ka;
        parent_b = kb;
    }
    b->forged[LONG_TOK] = 1;
}

/* Fill cache c with distinct filler prompts, leaving room for two copies of P. */
static void fill(bench *b, kvp_cache *c)
{
    uint32_t *t = xmalloc(FILL_TOK * sizeof *t);
    uint64_t s = 42;
    uint32_t n_fill = (b->pool - 2 * (LONG_TOK / BS) - 64) / (FILL_TOK / BS);
    for (uint32_t k = 0; k < n_fill; k++) {
        for (uint32_t i = 0; i < FILL_TOK; i++)
            t[i] = (uint32_t)splitmix(&s) % 128000;
        kvp_match m;
        check(kvp_access(c, &b->ns_fill, t, FILL_TOK, &m), "fill");
    }
    free(t);
}

static void store_p(bench *b, kvp_cache *c)
{
    kvp_match m;
    check(kvp_acquire(c, 1, &b->ns_a, b->p, LONG_TOK + 1, 0, &m), "acquire");
    check(kvp_commit(c, 1, b->p, LONG_TOK + 1, NULL), "commit");
    check(kvp_release(c, 1), "release");
}

static void store_forged(bench *b, kvp_cache *c)
{
    kvp_match m;
    check(kvp_access(c, &b->ns_b, b->forged, LONG_TOK + 1, &m), "forged access");
    if (m.n_blocks_hit != 0) {
        fprintf(stderr, "bench_verify: the forged chain hit A's blocks in verify mode\n");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    bench b;
    memset(&b, 0, sizeof b);
    b.pool = 262144;
    int reps = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--pool"))
            b.pool = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
    }
    if (reps < 1 || reps > MAX_REPS || b.pool < 4 * (LONG_TOK / BS)) {
        fprintf(stderr, "usage: bench_verify [--pool N >= 32768] [--reps 1..%d]\n", MAX_REPS);
        return 2;
    }
    kvp_namespace_init(&b.ns_a);
    b.ns_a.model = kvp_field_str("bench-model");
    b.ns_b = b.ns_fill = b.ns_a;
    b.ns_a.tenant = kvp_field_str("alice");
    b.ns_b.tenant = kvp_field_str("mallory");
    b.ns_fill.tenant = kvp_field_str("others");
    b.p = xmalloc((LONG_TOK + 1) * sizeof *b.p);
    b.forged = xmalloc((LONG_TOK + 1) * sizeof *b.forged);
    uint64_t s = 7;
    for (uint32_t i = 0; i <= LONG_TOK; i++)
        b.p[i] = (uint32_t)splitmix(&s) % 128000;
    forge_chain(&b);

    printf("kvprefix bench_verify: pool %u blocks of %u tokens, P = %u tokens, %d reps\n", b.pool,
           BS, LONG_TOK, reps);
    for (int k = 0; k < N_MODES; k++) {
        kvp_config cfg;
        kvp_config_init(&cfg);
        cfg.n_blocks = b.pool;
        cfg.block_size = BS;
        cfg.seed = SEED;
        cfg.verify_tokens = k > 0;
        check(kvp_cache_new(&cfg, &b.c[k]), "cache_new");
        fill(&b, b.c[k]);
    }

    /* (1) lookup: P cached, then (forced) B's chain stored after it. */
    static double t_look[N_MODES][MAX_REPS], t_store[N_MODES][MAX_REPS];
    for (int k = 0; k < N_MODES; k++) {
        store_p(&b, b.c[k]);
        if (k == 2)
            store_forged(&b, b.c[k]);
    }
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < N_MODES; k++) {
            kvp_match m;
            uint64_t t0 = now_ns();
            check(kvp_lookup(b.c[k], &b.ns_a, b.p, LONG_TOK + 1, NULL, 0, &m), "lookup");
            t_look[k][r] = (double)(now_ns() - t0) / 1e6;
            if (m.n_blocks_hit != LONG_TOK / BS) {
                fprintf(stderr, "bench_verify: %s lookup hit %u blocks\n", mode_names[k],
                        m.n_blocks_hit);
                return 1;
            }
        }
    }

    /* (2) store: reset, (forced) re-store B's chain untimed, then time P's store. */
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < N_MODES; k++) {
            check(kvp_cache_reset(b.c[k]), "reset");
            if (k == 2)
                store_forged(&b, b.c[k]);
            uint64_t t0 = now_ns();
            store_p(&b, b.c[k]);
            t_store[k][r] = (double)(now_ns() - t0) / 1e6;
        }
    }
    kvp_stats st;
    check(kvp_cache_stats(b.c[2], &st), "stats");

    const char *what[2] = {"(1) lookup of P, 8191 blocks hit", "(2) store of P, 8192 blocks"};
    double(*t[2])[MAX_REPS] = {t_look, t_store};
    for (int f = 0; f < 2; f++) {
        printf("\n%s\n  %-7s %10s %10s %12s %14s\n", what[f], "mode", "median ms", "min ms",
               "ns/block", "x off (med)");
        for (int k = 0; k < N_MODES; k++) {
            double ratio[MAX_REPS];
            for (int r = 0; r < reps; r++)
                ratio[r] = t[f][k][r] / t[f][0][r];
            double med = bench_median(t[f][k], reps);
            printf("  %-7s %10.3f %10.3f %12.1f %14.2f\n", mode_names[k], med,
                   minimum(t[f][k], reps), med * 1e6 / (LONG_TOK / BS), bench_median(ratio, reps));
        }
    }
    printf("\nforced: %llu verification rejects in all (B's blocks met and skipped)\n",
           (unsigned long long)st.n_verify_rejects);
    for (int k = 0; k < N_MODES; k++)
        kvp_cache_free(b.c[k]);
    free(b.p);
    free(b.forged);
    return 0;
}
