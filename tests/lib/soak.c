/*
 * soak.c - a standalone randomized soak of the whole public API (not a Criterion test).
 *
 * Criterion runs each test in a forked worker that LeakSanitizer does not inspect, so this
 * plain program is what the sanitizer build relies on for leaks: it creates many caches of
 * random shapes (verification on and off, keys truncated to force collisions), runs random
 * lookups, acquires, commits, grows, releases, accesses and resets with allocation failures
 * injected at random, and after every call checks that
 *   - kvp_cache_check passes,
 *   - a call that failed with KVP_ENOMEM left the statistics exactly as they were,
 *   - the library's memory is all returned: the counting allocator ends at zero live bytes.
 * It exits 0 and prints "N passed, 0 failed" when every round holds, 1 otherwise.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define N_ROUNDS   400
#define N_OPS      1500
#define MAX_ACTIVE 12

typedef struct soak_alloc {
    long fail_at;      /* allocation number that fails, or -1 */
    long n_calls;      /* allocations since fail_at was set */
    size_t live_bytes; /* bytes currently allocated */
} soak_alloc;

static void *soak_malloc(void *ud, size_t size)
{
    soak_alloc *a = ud;
    if (a->fail_at >= 0 && a->n_calls++ == a->fail_at)
        return NULL;
    void *p = malloc(size);
    if (p)
        a->live_bytes += size;
    return p;
}

static void soak_free(void *ud, void *ptr, size_t size)
{
    soak_alloc *a = ud;
    if (ptr)
        a->live_bytes -= size;
    free(ptr);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

/* One round on one cache; returns 0 when every invariant held. */
static int soak_round(int round, bool verify, unsigned key_bits)
{
    soak_alloc alloc = {-1, 0, 0};
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = 4 + rnd(60);
    cfg.block_size = 1 + rnd(4);
    cfg.verify_tokens = verify;
    cfg.alloc.alloc = soak_malloc;
    cfg.alloc.free = soak_free;
    cfg.alloc.ud = &alloc;
    kvp_cache *c;
    if (kvp_cache_new(&cfg, &c) != KVP_OK) {
        fprintf(stderr, "soak: round %d: kvp_cache_new failed\n", round);
        return 1;
    }
    if (key_bits < 128 && kvp__cache_set_key_bits(c, key_bits) != KVP_OK)
        return 1;
    static const char *const tenants[] = {"a", "b", "ab", ""};
    uint64_t active[MAX_ACTIVE];
    int n_active = 0;
    uint64_t next_id = 1;
    for (int op = 0; op < N_OPS; op++) {
        uint32_t tokens[80];
        size_t n = 1 + rnd(60);
        for (size_t i = 0; i < n; i++)
            tokens[i] = rnd(3);
        kvp_namespace ns;
        kvp_namespace_init(&ns);
        ns.tenant = kvp_field_str(tenants[rnd(4)]);
        if (rnd(4) == 0)
            ns.salt = kvp_field_str("s");
        kvp_match m;
        kvp_stats before, after;
        if (kvp_cache_stats(c, &before) != KVP_OK) {
            fprintf(stderr, "soak: round %d op %d: kvp_cache_stats failed\n", round, op);
            return 1;
        }
        alloc.fail_at = rnd(8) == 0 ? (long)rnd(4) : -1;
        alloc.n_calls = 0;
        int rc = KVP_OK, kind = (int)rnd(7);
        switch (kind) {
        case 0:
            rc = kvp_lookup(c, &ns, tokens, n, NULL, 0, &m);
            break;
        case 1:
            if (n_active < MAX_ACTIVE) {
                rc = kvp_acquire(c, next_id, &ns, tokens, n, n + rnd(12), &m);
                if (rc == KVP_OK) {
                    active[n_active++] = next_id;
                    /* Commit part of the prompt, but never less than what was reused. */
                    size_t hit = (size_t)m.n_tokens_hit;
                    rc = kvp_commit(c, next_id, tokens, hit + rnd((unsigned)(n - hit + 1)), NULL);
                }
                next_id++;
            }
            break;
        case 2:
            if (n_active) {
                int k = (int)rnd((unsigned)n_active);
                rc = kvp_release(c, active[k]);
                active[k] = active[--n_active];
            }
            break;
        case 3:
            rc = kvp_access(c, &ns, tokens, n, &m);
            break;
        case 4:
            if (n_active)
                rc = kvp_grow(c, active[rnd((unsigned)n_active)], rnd(90));
            break;
        case 5:
            if (!verify) {
                kvp_key ids[80];
                for (size_t i = 0; i < n; i++)
                    ids[i].lo = tokens[i] + 7 * (i > 0 ? ids[i - 1].lo : 0), ids[i].hi = 0;
                rc = kvp_access_ids(c, &ns, ids, n, n * cfg.block_size, &m);
            }
            break;
        default:
            if (rnd(25) == 0)
                rc = kvp_cache_reset(c);
            break;
        }
        alloc.fail_at = -1;
        if (kvp_cache_stats(c, &after) != KVP_OK) {
            fprintf(stderr, "soak: round %d op %d: kvp_cache_stats failed\n", round, op);
            return 1;
        }
        if (rc == KVP_ENOMEM && memcmp(&before, &after, sizeof before) != 0) {
            fprintf(stderr, "soak: round %d op %d (kind %d): ENOMEM changed the stats\n", round, op,
                    kind);
            return 1;
        }
        if (rc != KVP_OK && rc != KVP_ENOMEM && rc != KVP_ENOSPC && rc != KVP_ERANGE &&
            rc != KVP_ETOOBIG) {
            fprintf(stderr, "soak: round %d op %d (kind %d): unexpected %s\n", round, op, kind,
                    kvp_strerror(rc));
            return 1;
        }
        if (kvp_cache_check(c) != KVP_OK) {
            fprintf(stderr, "soak: round %d op %d (kind %d): invariant check failed\n", round, op,
                    kind);
            return 1;
        }
    }
    kvp_cache_free(c);
    if (alloc.live_bytes != 0) {
        fprintf(stderr, "soak: round %d: %zu bytes not freed\n", round, alloc.live_bytes);
        return 1;
    }
    return 0;
}

int main(void)
{
    static const unsigned bits[] = {128, 128, 4, 2};
    int passed = 0, failed = 0;
    for (int round = 0; round < N_ROUNDS; round++) {
        bool verify = round % 2 == 1;
        if (soak_round(round, verify, bits[(round / 2) % 4]) == 0)
            passed++;
        else
            failed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
