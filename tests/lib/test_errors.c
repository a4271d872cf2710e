/*
 * test_errors.c - every error path of the public API, and allocation failure.
 *
 * Argument errors: NULL pointers, n_tokens 0, block_size / n_blocks out of range, unknown
 * (KVP_ENOENT) and duplicate (KVP_EEXIST) request ids, commits beyond the held blocks
 * (KVP_ERANGE) or shorter than what is committed (KVP_EINVAL), invalid namespace fields,
 * external ids on a verify_tokens cache, overflowing counts; out-parameters stay untouched
 * and the cache unchanged on failure. kvp_strerror and kvp_version.
 *
 * ENOMEM injection: an allocator that fails its Nth call, for N = 0, 1, 2, ... until the
 * call under test succeeds without hitting the failure, for kvp_cache_new, kvp_acquire,
 * kvp_grow and kvp_access (plain and verify_tokens). After each KVP_ENOMEM the stats are
 * identical and kvp_cache_check passes; retrying with a working allocator gives exactly the
 * result of a run that never failed; at the end every byte allocated through the hook has
 * been freed with the size it was allocated with. Functions whose contract has no KVP_ENOMEM
 * must work with an allocator that fails every call.
 */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "kvprefix.h"
#include "testutil.h"

static bool match_untouched(const kvp_match *m)
{
    kvp_match s;
    memset(&s, 0x5a, sizeof s);
    return memcmp(m, &s, sizeof s) == 0;
}

#define SENTINEL_MATCH(m) memset(&(m), 0x5a, sizeof(m))

/* ------------------------------------------------------------------ strings */

Test(errors, strerror_codes)
{
    const int codes[] = {KVP_OK,     KVP_EINVAL,    KVP_ENOMEM,  KVP_ENOSPC,  KVP_ENOENT,
                         KVP_EEXIST, KVP_EOVERFLOW, KVP_ERANGE,  KVP_EBUSY,   KVP_ECORRUPT,
                         KVP_ETOKEN, KVP_ENOTSUP,   KVP_ETOOBIG, KVP_EFORMAT, KVP_EIO};
    const size_t n = sizeof codes / sizeof codes[0];
    const char *unknown = kvp_strerror(-1000);
    cr_assert_not_null(unknown);
    cr_assert_str_eq(unknown, "unknown error");
    cr_assert_str_eq(kvp_strerror(1), "unknown error");
    cr_assert_str_eq(kvp_strerror(-15), "unknown error");
    for (size_t i = 0; i < n; i++) {
        const char *s = kvp_strerror(codes[i]);
        cr_assert_not_null(s, "kvp_strerror(%d) is NULL", codes[i]);
        cr_assert_gt(strlen(s), 0, "kvp_strerror(%d) is empty", codes[i]);
        cr_assert_str_neq(s, unknown, "code %d is described as unknown", codes[i]);
        for (size_t j = i + 1; j < n; j++)
            cr_assert_str_neq(s, kvp_strerror(codes[j]), "codes %d and %d share \"%s\"", codes[i],
                              codes[j], s);
    }
}

Test(errors, version)
{
    cr_assert_str_eq(kvp_version(), KVP_VERSION_STRING);
    cr_assert_eq(KVP_VERSION_NUMBER,
                 KVP_VERSION_MAJOR * 10000 + KVP_VERSION_MINOR * 100 + KVP_VERSION_PATCH);
}

/* The numeric version: the library's kvp_version_number() equals the header's
 * KVP_VERSION_NUMBER, and both decode to the numbers of the version string. */
Test(errors, version_number)
{
    unsigned major, minor, patch;
    char tail;
    cr_assert_eq(sscanf(kvp_version(), "%u.%u.%u%c", &major, &minor, &patch, &tail), 3,
                 "kvp_version() \"%s\" is not MAJOR.MINOR.PATCH", kvp_version());
    cr_assert_eq(major, KVP_VERSION_MAJOR);
    cr_assert_eq(minor, KVP_VERSION_MINOR);
    cr_assert_eq(patch, KVP_VERSION_PATCH);
    cr_assert_lt(minor, 100, "MINOR must stay below 100 for the numeric encoding");
    cr_assert_lt(patch, 100, "PATCH must stay below 100 for the numeric encoding");
    int n = kvp_version_number();
    cr_assert_eq(n, KVP_VERSION_NUMBER);
    cr_assert_eq(n, (int)(major * 10000 + minor * 100 + patch));
    cr_assert_eq(n / 10000, (int)major);
    cr_assert_eq(n / 100 % 100, (int)minor);
    cr_assert_eq(n % 100, (int)patch);
}

/* ------------------------------------------------------------------ keys and config */

Test(errors, namespace_and_key_arguments)
{
    kvp_namespace ns;
    kvp_namespace_init(NULL); /* must not crash */
    kvp_config_init(NULL);
    memset(&ns, 0x77, sizeof ns);
    kvp_namespace_init(&ns);
    cr_assert(ns.model.ptr == NULL && ns.model.len == 0 && ns.salt.ptr == NULL &&
                  ns.salt.len == 0 && ns.adapter.ptr == NULL && ns.tenant.ptr == NULL,
              "kvp_namespace_init must make every field absent");
    kvp_field f = kvp_field_str(NULL);
    cr_assert(f.ptr == NULL && f.len == 0);
    f = kvp_field_str("abc");
    cr_assert_eq(f.len, 3);

    const kvp_key sentinel = {0x1111, 0x2222};
    kvp_key k = sentinel;
    cr_assert_eq(kvp_namespace_key(0, NULL, &k), KVP_EINVAL);
    cr_assert_eq(kvp_namespace_key(0, &ns, NULL), KVP_EINVAL);
    for (int field = 0; field < 4; field++) {
        kvp_namespace bad;
        kvp_namespace_init(&bad);
        kvp_field *bf = field == 0   ? &bad.model
                        : field == 1 ? &bad.adapter
                        : field == 2 ? &bad.tenant
                                     : &bad.salt;
        bf->len = 3; /* ptr NULL with a length */
        cr_assert_eq(kvp_namespace_key(0, &bad, &k), KVP_EINVAL, "field %d", field);
        cr_assert(k.lo == sentinel.lo && k.hi == sentinel.hi, "key written on failure");
    }

    uint32_t t[4] = {1, 2, 3, 4};
    kvp_key keys[2] = {sentinel, sentinel};
    size_t n = 999;
    kvp_key root = {1, 2};
    cr_assert_eq(kvp_hash_blocks(0, root, NULL, 4, 2, keys, 2, &n), KVP_EINVAL, "tokens NULL");
    cr_assert_eq(kvp_hash_blocks(0, root, t, 4, 2, NULL, 2, &n), KVP_EINVAL, "keys NULL");
    cr_assert_eq(kvp_hash_blocks(0, root, t, 4, 2, keys, 2, NULL), KVP_EINVAL, "n_keys NULL");
    cr_assert_eq(kvp_hash_blocks(0, root, t, 4, 0, keys, 2, &n), KVP_EINVAL, "block_size 0");
    cr_assert_eq(kvp_hash_blocks(0, root, t, 4, KVP_MAX_BLOCK_SIZE + 1, keys, 2, &n), KVP_EINVAL);
    cr_assert_eq(n, 999, "n_keys written on failure");
    cr_assert(keys[0].lo == sentinel.lo && keys[1].hi == sentinel.hi, "keys written");
}

Test(errors, cache_new_arguments)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    cr_assert_eq(cfg.n_blocks, 0, "n_blocks has no default");
    cr_assert_eq(cfg.block_size, 16);
    cr_assert_eq(cfg.seed, KVP_DEFAULT_SEED);
    cr_assert(!cfg.verify_tokens);
    cr_assert_null(cfg.on_event);
    cr_assert_null(cfg.alloc.alloc);
    cr_assert_null(cfg.alloc.free);

    kvp_cache *sentinel = (kvp_cache *)&cfg;
    kvp_cache *c = sentinel;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL, "n_blocks 0");
    cr_assert_eq(c, sentinel, "out written on failure");
    cfg.n_blocks = 8;
    cr_assert_eq(kvp_cache_new(NULL, &c), KVP_EINVAL);
    cr_assert_eq(kvp_cache_new(&cfg, NULL), KVP_EINVAL);
    cfg.block_size = 0;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL, "block_size 0");
    cfg.block_size = KVP_MAX_BLOCK_SIZE + 1;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL, "block_size too large");
    cfg.block_size = 4;
    cfg.n_blocks = UINT32_C(0x40000001);
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_EINVAL, "n_blocks above 2^30");
    cr_assert_eq(c, sentinel, "out written on failure");
    cfg.n_blocks = 1;
    cfg.block_size = KVP_MAX_BLOCK_SIZE;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_OK, "1 block of the largest size");
    kvp_cache_free(c);
    kvp_cache_free(NULL);
}

/* ------------------------------------------------------------------ cache calls */

Test(errors, null_and_empty_arguments)
{
    kvp_cache *c = th_cache(8, 2, false, NULL, NULL);
    kvp_namespace ns, bad;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_namespace_init(&bad);
    bad.tenant.len = 1;
    uint32_t t[4] = {1, 2, 3, 4};
    kvp_key ids[2] = {{1, 1}, {2, 2}};
    uint32_t bid[2];
    kvp_match m;
    SENTINEL_MATCH(m);

    cr_assert_eq(kvp_lookup(NULL, &ns, t, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup(c, NULL, t, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup(c, &bad, t, 4, NULL, 0, &m), KVP_EINVAL, "invalid field");
    cr_assert_eq(kvp_lookup(c, &ns, NULL, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup(c, &ns, t, 0, NULL, 0, &m), KVP_EINVAL, "n_tokens 0");
    cr_assert_eq(kvp_lookup(c, &ns, t, 4, NULL, 2, &m), KVP_EINVAL, "block_ids NULL, cap 2");
    cr_assert_eq(kvp_lookup(c, &ns, t, 4, bid, 2, NULL), KVP_EINVAL);

    cr_assert_eq(kvp_acquire(NULL, 1, &ns, t, 4, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_acquire(c, 1, NULL, t, 4, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_acquire(c, 1, &bad, t, 4, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_acquire(c, 1, &ns, NULL, 4, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 0, 8, &m), KVP_EINVAL, "n_tokens 0");
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 4, 0, NULL), KVP_EINVAL);

    cr_assert_eq(kvp_access(NULL, &ns, t, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access(c, NULL, t, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access(c, &bad, t, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access(c, &ns, NULL, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access(c, &ns, t, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access(c, &ns, t, 4, NULL), KVP_EINVAL);

    cr_assert_eq(kvp_lookup_ids(NULL, &ns, ids, 2, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup_ids(c, NULL, ids, 2, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup_ids(c, &ns, NULL, 2, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 2, 4, NULL, 0, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 2, 4, NULL, 1, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 1, 4, NULL, 0, &m), KVP_EINVAL,
                 "1 id for 4 tokens in blocks of 2");
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 2, 0, NULL, 0, &m), KVP_EINVAL, "n_tokens 0");
    cr_assert_eq(kvp_access_ids(NULL, &ns, ids, 2, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access_ids(c, NULL, ids, 2, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access_ids(c, &ns, NULL, 2, 4, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access_ids(c, &ns, ids, 2, 4, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_access_ids(c, &ns, ids, 2, 9, &m), KVP_EINVAL, "2 ids for 9 tokens");
    cr_assert(match_untouched(&m), "match written by a failing call");

    const uint32_t *tab = (const uint32_t *)t;
    size_t n = 77;
    cr_assert_eq(kvp_request_blocks(NULL, 1, &tab, &n), KVP_EINVAL);
    cr_assert_eq(kvp_request_blocks(c, 1, NULL, &n), KVP_EINVAL);
    cr_assert_eq(kvp_request_blocks(c, 1, &tab, NULL), KVP_EINVAL);
    cr_assert_eq(kvp_request_blocks(c, 1, &tab, &n), KVP_ENOENT);
    cr_assert(tab == t && n == 77, "out-parameters written on failure");

    cr_assert_eq(kvp_cache_reset(NULL), KVP_EINVAL);
    cr_assert_eq(kvp_cache_stats(NULL, &(kvp_stats){0}), KVP_EINVAL);
    cr_assert_eq(kvp_cache_stats(c, NULL), KVP_EINVAL);

    /* Not listed in their contracts, but the conventions make a NULL cache KVP_EINVAL. */
    cr_assert_eq(kvp_grow(NULL, 1, 4), KVP_EINVAL);
    cr_assert_eq(kvp_release(NULL, 1), KVP_EINVAL);
    cr_assert_eq(kvp_commit(NULL, 1, t, 4, NULL), KVP_EINVAL);

    /* Nothing of the above changed the cache. */
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_requests + s.n_lookups + s.n_blocks_stored + s.n_tokens_queried, 0,
                 "a failed call was counted");
    cr_assert_eq(s.n_requests_active, 0);
    cr_assert_eq(s.n_blocks_free, 8);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(errors, request_ids)
{
    kvp_cache *c = th_cache(8, 2, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[5] = {1, 2, 3, 4, 5};
    kvp_match m;
    size_t stored = 4242;
    cr_assert_eq(kvp_grow(c, 5, 10), KVP_ENOENT);
    cr_assert_eq(kvp_commit(c, 5, t, 4, &stored), KVP_ENOENT);
    cr_assert_eq(stored, 4242, "n_stored written on failure");
    cr_assert_eq(kvp_release(c, 5), KVP_ENOENT);

    cr_assert_eq(kvp_acquire(c, 5, &ns, t, 3, 0, &m), KVP_OK);
    kvp_stats before = th_stats(c);
    SENTINEL_MATCH(m);
    cr_assert_eq(kvp_acquire(c, 5, &ns, t, 5, 0, &m), KVP_EEXIST);
    cr_assert(match_untouched(&m), "match written on EEXIST");
    kvp_stats after = th_stats(c);
    th_assert_stats_equal(&before, &after, "EEXIST");
    const uint32_t *ids;
    size_t n;
    cr_assert_eq(kvp_request_blocks(c, 5, &ids, &n), KVP_OK);
    cr_assert_eq(n, 2, "EEXIST replaced the request");
    cr_assert_eq(kvp_release(c, 5), KVP_OK);
    cr_assert_eq(kvp_acquire(c, 5, &ns, t, 5, 0, &m), KVP_OK, "a released id is reusable");
    /* Extreme ids are ordinary ids. */
    cr_assert_eq(kvp_acquire(c, 0, &ns, t, 1, 0, &m), KVP_OK);
    cr_assert_eq(kvp_acquire(c, UINT64_MAX, &ns, t, 1, 0, &m), KVP_OK);
    cr_assert_eq(th_stats(c).n_requests_active, 3);
    TH_CHECK(c);
    kvp_cache_free(c); /* frees active requests */
}

Test(errors, commit_ranges)
{
    kvp_cache *c = th_cache(16, 4, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[16];
    for (int i = 0; i < 16; i++)
        t[i] = (uint32_t)i;
    kvp_match m;
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 5, 0, &m), KVP_OK); /* 2 blocks */
    size_t stored = 4242;
    kvp_stats before = th_stats(c);
    cr_assert_eq(kvp_commit(c, 1, t, 12, &stored), KVP_ERANGE, "3 full blocks, 2 held");
    cr_assert_eq(stored, 4242);
    kvp_stats after = th_stats(c);
    th_assert_stats_equal(&before, &after, "ERANGE");
    TH_CHECK(c);
    cr_assert_eq(kvp_commit(c, 1, NULL, 8, &stored), KVP_EINVAL, "tokens NULL");
    cr_assert_eq(kvp_commit(c, 1, t, 8, &stored), KVP_OK, "2 full blocks, 2 held");
    cr_assert_eq(stored, 2);
    before = th_stats(c);
    cr_assert_eq(kvp_commit(c, 1, t, 7, &stored), KVP_EINVAL, "shorter than committed");
    cr_assert_eq(kvp_commit(c, 1, t, 3, &stored), KVP_EINVAL, "shorter than committed");
    after = th_stats(c);
    th_assert_stats_equal(&before, &after, "EINVAL commit");
    TH_CHECK(c);
    /* A request that starts with hits has those blocks committed already. */
    cr_assert_eq(kvp_acquire(c, 2, &ns, t, 9, 0, &m), KVP_OK);
    cr_assert_eq(m.n_blocks_hit, 2);
    cr_assert_eq(kvp_commit(c, 2, t, 4, &stored), KVP_EINVAL, "shorter than the hit blocks");
    cr_assert_eq(kvp_commit(c, 2, t, 9, &stored), KVP_OK);
    cr_assert_eq(stored, 0);
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(errors, overflowing_counts)
{
    kvp_cache *c = th_cache(16, 1, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[4] = {1, 2, 3, 4};
    kvp_match m;
    cr_assert_eq(kvp_acquire(c, 1, &ns, t, 4, 0, &m), KVP_OK);
    kvp_stats before = th_stats(c);
    cr_assert_eq(kvp_grow(c, 1, SIZE_MAX), KVP_EOVERFLOW, "SIZE_MAX tokens in blocks of 1");
    cr_assert_eq(kvp_grow(c, 1, 17), KVP_ETOOBIG, "17 blocks in a pool of 16");
    kvp_stats after = th_stats(c);
    th_assert_stats_equal(&before, &after, "grow failures");
#if SIZE_MAX > UINT32_MAX
    /* 2^32 tokens in blocks of 1 have 2^32 full blocks: too many. The cache is empty, so a
     * lazy lookup would read at most the first token of this 4-token buffer. */
    SENTINEL_MATCH(m);
    cr_assert_eq(kvp_lookup(c, &ns, t, (size_t)UINT32_MAX + 1, NULL, 0, &m), KVP_EOVERFLOW);
    cr_assert(match_untouched(&m));
    cr_assert_eq(kvp_acquire(c, 2, &ns, t, (size_t)UINT32_MAX + 1, 0, &m), KVP_EOVERFLOW);
    cr_assert_eq(kvp_access(c, &ns, t, (size_t)UINT32_MAX + 1, &m), KVP_EOVERFLOW);
    cr_assert(match_untouched(&m));
#endif
    TH_CHECK(c);
    kvp_cache_free(c);
}

Test(errors, ids_forms_on_verify_cache)
{
    kvp_cache *c = th_cache(8, 2, true, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    kvp_key ids[2] = {{1, 1}, {2, 2}};
    kvp_match m;
    SENTINEL_MATCH(m);
    cr_assert_eq(kvp_lookup_ids(c, &ns, ids, 2, 4, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access_ids(c, &ns, ids, 2, 4, &m), KVP_EINVAL);
    cr_assert(match_untouched(&m));
    kvp_stats s = th_stats(c);
    cr_assert_eq(s.n_requests + s.n_lookups + s.n_blocks_stored, 0);
    TH_CHECK(c);
    kvp_cache_free(c);
}

/* ------------------------------------------------------------------ allocation failure */

static void assert_no_leak(const th_alloc *a, const char *what)
{
    cr_assert_eq(a->live_bytes, 0, "%s: %lld bytes still allocated", what,
                 (long long)a->live_bytes);
    cr_assert_eq(a->n_live, 0, "%s: %llu allocations not freed", what,
                 (unsigned long long)a->n_live);
    cr_assert_eq(a->n_bad_frees, 0, "%s: %llu frees with a wrong size or pointer", what,
                 (unsigned long long)a->n_bad_frees);
}

/* kvp_config.ns_quota of the caches hooked_config makes (the quota tests set it). */
static uint32_t hooked_quota;

static kvp_config hooked_config(th_alloc *a, uint32_t n_blocks, uint32_t bs, bool verify)
{
    kvp_config cfg = th_config(n_blocks, bs, verify, NULL, NULL);
    cfg.alloc = th_alloc_hooks(a);
    cfg.ns_quota = hooked_quota;
    return cfg;
}

Test(enomem, cache_new)
{
    for (int verify = 0; verify < 2; verify++) {
        uint64_t n_failures = 0;
        for (int64_t n = 0;; n++) {
            cr_assert_lt(n, 10000, "kvp_cache_new never succeeded");
            th_alloc a;
            th_alloc_init(&a);
            kvp_config cfg = hooked_config(&a, 64, 4, verify);
            th_alloc_arm(&a, n);
            kvp_cache *sentinel = (kvp_cache *)&a, *c = sentinel;
            int rc = kvp_cache_new(&cfg, &c);
            if (rc == KVP_ENOMEM) {
                n_failures++;
                cr_assert_eq(a.n_failed, 1, "ENOMEM without a failed allocation");
                cr_assert_eq(c, sentinel, "out written on ENOMEM");
                assert_no_leak(&a, "kvp_cache_new failure");
                continue;
            }
            cr_assert_eq(rc, KVP_OK, "kvp_cache_new with alloc %lld failing: %s", (long long)n,
                         kvp_strerror(rc));
            cr_assert_eq(a.n_failed, 0, "an allocation failed but kvp_cache_new succeeded");
            cr_assert_gt(a.live_bytes, 0, "the cache holds no memory from the hooks");
            th_alloc_arm(&a, -1); /* the checker's scratch comes from the hooks too */
            TH_CHECK(c);
            kvp_cache_free(c);
            assert_no_leak(&a, "kvp_cache_free");
            break;
        }
        cr_assert_gt(n_failures, 0, "no allocation was ever failed (verify %d)", verify);
    }
}

/* One operation under test, run on a cache prepared by setup(). Its observable result: */
typedef struct outcome {
    int rc;
    kvp_match match;
    uint32_t table[64]; /* block table of request 100, when active */
    size_t n_table;
    uint32_t runs[8]; /* cached runs of a few probe prompts afterwards */
    kvp_stats stats;
} outcome;

typedef struct scenario {
    const char *name;
    uint32_t n_blocks, block_size;
    bool verify;
    void (*setup)(kvp_cache *c);
    int (*op)(kvp_cache *c, kvp_match *m);
} scenario;

static void ns_k(kvp_namespace *ns, int k)
{
    static const char *tenants[] = {"t0", "t1", "t2", "t3", "t4", "t5"};
    th_ns(ns, "model", NULL, tenants[k], NULL);
}

static void prompt(uint32_t *t, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        t[i] = seed * 1000 + (uint32_t)(i % 7 == 6 ? seed : i);
}

static void setup_common(kvp_cache *c)
{
    kvp_namespace ns;
    uint32_t t[40];
    kvp_match m;
    for (int k = 0; k < 3; k++) {
        ns_k(&ns, k);
        prompt(t, 40, 1);
        cr_assert_eq(kvp_access(c, &ns, t, 17 + (size_t)k * 5, &m), KVP_OK);
    }
    ns_k(&ns, 0);
    prompt(t, 40, 2);
    cr_assert_eq(kvp_acquire(c, 7, &ns, t, 10, 12, &m), KVP_OK);
    cr_assert_eq(kvp_commit(c, 7, t, 10, NULL), KVP_OK);
}

static int op_acquire(kvp_cache *c, kvp_match *m)
{
    kvp_namespace ns;
    ns_k(&ns, 1);
    uint32_t t[40];
    prompt(t, 40, 1);
    t[30] = 5; /* hits the first blocks, misses the rest */
    return kvp_acquire(c, 100, &ns, t, 36, 50, m);
}

static int op_acquire_new_ns(kvp_cache *c, kvp_match *m)
{
    kvp_namespace ns;
    ns_k(&ns, 4);
    uint32_t t[40];
    prompt(t, 40, 3);
    return kvp_acquire(c, 100, &ns, t, 33, 0, m);
}

static void setup_grow(kvp_cache *c)
{
    setup_common(c);
    kvp_namespace ns;
    ns_k(&ns, 2);
    uint32_t t[40];
    prompt(t, 40, 1);
    kvp_match m;
    cr_assert_eq(kvp_acquire(c, 100, &ns, t, 9, 0, &m), KVP_OK);
}

static int op_grow(kvp_cache *c, kvp_match *m)
{
    (void)m;
    return kvp_grow(c, 100, 40);
}

static int op_access(kvp_cache *c, kvp_match *m)
{
    kvp_namespace ns;
    ns_k(&ns, 5); /* a namespace the cache has not seen */
    uint32_t t[40];
    prompt(t, 40, 4);
    return kvp_access(c, &ns, t, 40, m);
}

static int op_access_known_ns(kvp_cache *c, kvp_match *m)
{
    kvp_namespace ns;
    ns_k(&ns, 2);
    uint32_t t[40];
    prompt(t, 40, 1);
    return kvp_access(c, &ns, t, 40, m);
}

static int op_access_ids(kvp_cache *c, kvp_match *m)
{
    kvp_namespace ns;
    ns_k(&ns, 3);
    kvp_key ids[10];
    for (int i = 0; i < 10; i++)
        ids[i] = (kvp_key){(uint64_t)i + 1, 77};
    return kvp_access_ids(c, &ns, ids, 10, 40, m);
}

static void observe(kvp_cache *c, int rc, const kvp_match *m, outcome *o)
{
    memset(o, 0, sizeof *o);
    o->rc = rc;
    o->match = *m;
    const uint32_t *ids;
    size_t n;
    if (kvp_request_blocks(c, 100, &ids, &n) == KVP_OK) {
        cr_assert_leq(n, 64);
        memcpy(o->table, ids, n * sizeof *ids);
        o->n_table = n;
    }
    kvp_namespace ns;
    uint32_t t[40];
    kvp_match pm;
    for (int k = 0; k < 6; k++) {
        ns_k(&ns, k);
        prompt(t, 40, k < 3 ? 1 : (uint32_t)k);
        cr_assert_eq(kvp_lookup(c, &ns, t, 40, NULL, 0, &pm), KVP_OK);
        o->runs[k] = pm.n_blocks_cached;
    }
    o->stats = th_stats(c); /* after the probe lookups, so they count the same in both runs */
}

static void assert_same_outcome(const outcome *ref, const outcome *got, const char *name)
{
    cr_assert_eq(got->rc, ref->rc, "%s: rc %d, expected %d", name, got->rc, ref->rc);
    const kvp_match *g = &got->match, *r = &ref->match;
    cr_assert(g->n_tokens == r->n_tokens && g->n_blocks_full == r->n_blocks_full &&
                  g->n_blocks_cached == r->n_blocks_cached && g->n_blocks_hit == r->n_blocks_hit &&
                  g->n_tokens_hit == r->n_tokens_hit,
              "%s: match differs from a run without failures", name);
    cr_assert_eq(got->n_table, ref->n_table, "%s: block table length", name);
    for (size_t i = 0; i < ref->n_table; i++)
        cr_assert_eq(got->table[i], ref->table[i], "%s: block table entry %zu is %u, not %u", name,
                     i, got->table[i], ref->table[i]);
    for (int k = 0; k < 6; k++)
        cr_assert_eq(got->runs[k], ref->runs[k], "%s: cached run of probe %d", name, k);
    th_assert_stats_equal(&ref->stats, &got->stats, name);
}

static void run_scenario(const scenario *sc)
{
    /* The reference run: a hooked allocator that never fails. */
    th_alloc a;
    th_alloc_init(&a);
    kvp_config cfg = hooked_config(&a, sc->n_blocks, sc->block_size, sc->verify);
    kvp_cache *c = NULL;
    cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_OK);
    sc->setup(c);
    kvp_match m;
    memset(&m, 0, sizeof m);
    int rc = sc->op(c, &m);
    cr_assert_eq(rc, KVP_OK, "%s: reference run: %s", sc->name, kvp_strerror(rc));
    outcome ref;
    observe(c, rc, &m, &ref);
    kvp_cache_free(c);
    assert_no_leak(&a, sc->name);

    uint64_t n_failures = 0;
    for (int64_t n = 0;; n++) {
        cr_assert_lt(n, 100000, "%s never succeeded", sc->name);
        th_alloc_init(&a);
        cfg = hooked_config(&a, sc->n_blocks, sc->block_size, sc->verify);
        c = NULL;
        cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_OK);
        sc->setup(c);
        kvp_stats before = th_stats(c);
        SENTINEL_MATCH(m);
        th_alloc_arm(&a, n);
        rc = sc->op(c, &m);
        th_alloc_arm(&a, -1);
        bool failed = rc == KVP_ENOMEM;
        if (failed) {
            n_failures++;
            cr_assert_eq(a.n_failed, 1, "%s: ENOMEM without a failed allocation", sc->name);
            cr_assert(match_untouched(&m), "%s: match written on ENOMEM", sc->name);
            TH_CHECK(c);
            kvp_stats after = th_stats(c);
            th_assert_stats_equal(&before, &after, sc->name);
            memset(&m, 0, sizeof m);
            rc = sc->op(c, &m); /* retry with a working allocator */
        } else {
            if (sc->op == op_grow)
                memset(&m, 0, sizeof m); /* kvp_grow has no match to write */
            cr_assert_eq(rc, KVP_OK, "%s with alloc %lld failing: %s", sc->name, (long long)n,
                         kvp_strerror(rc));
        }
        TH_CHECK(c);
        outcome got;
        observe(c, rc, &m, &got);
        assert_same_outcome(&ref, &got, sc->name);
        kvp_cache_free(c);
        assert_no_leak(&a, sc->name);
        if (!failed && a.n_failed == 0)
            break; /* the op made fewer than n + 1 allocations: all failure points covered */
    }
    cr_log_info("%s: %llu injected failures\n", sc->name, (unsigned long long)n_failures);
}

static const scenario scenarios[] = {
    {"acquire", 64, 4, false, setup_common, op_acquire},
    {"acquire (verify)", 64, 4, true, setup_common, op_acquire},
    {"acquire new namespace", 64, 4, false, setup_common, op_acquire_new_ns},
    {"acquire new namespace (verify)", 64, 4, true, setup_common, op_acquire_new_ns},
    {"grow", 64, 1, false, setup_grow, op_grow},
    {"grow (verify)", 64, 1, true, setup_grow, op_grow},
    {"access", 16, 2, false, setup_common, op_access},
    {"access (verify)", 16, 2, true, setup_common, op_access},
    {"access known namespace", 64, 1, false, setup_common, op_access_known_ns},
    {"access known namespace (verify)", 64, 1, true, setup_common, op_access_known_ns},
    {"access_ids", 64, 4, false, setup_common, op_access_ids},
};

Test(enomem, every_failure_point)
{
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        run_scenario(&scenarios[i]);
}

/* The same with per-namespace quotas on (quota groups are allocated per new namespace),
 * small enough that the scenarios' releases evict by quota. */
Test(enomem, every_failure_point_with_quotas)
{
    hooked_quota = 3;
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        run_scenario(&scenarios[i]);
}

Test(enomem, cache_new_with_quotas)
{
    hooked_quota = KVP_QUOTA_UNLIMITED;
    for (int64_t n = 0;; n++) {
        cr_assert_lt(n, 10000, "kvp_cache_new never succeeded");
        th_alloc a;
        th_alloc_init(&a);
        kvp_config cfg = hooked_config(&a, 64, 4, true);
        th_alloc_arm(&a, n);
        kvp_cache *c = NULL;
        int rc = kvp_cache_new(&cfg, &c);
        if (rc == KVP_ENOMEM) {
            assert_no_leak(&a, "kvp_cache_new failure");
            continue;
        }
        cr_assert_eq(rc, KVP_OK);
        kvp_cache_free(c);
        assert_no_leak(&a, "kvp_cache_free");
        cr_assert_gt(n, 4, "the quota arrays were never failed");
        break;
    }
}

Test(enomem, set_quota)
{
    hooked_quota = 5;
    for (int64_t n = 0;; n++) {
        cr_assert_lt(n, 100, "kvp_cache_set_quota never succeeded");
        th_alloc a;
        th_alloc_init(&a);
        kvp_config cfg = hooked_config(&a, 64, 1, false);
        kvp_cache *c = th_cache_new(&cfg);
        setup_common(c);
        kvp_stats before = th_stats(c);
        kvp_namespace ns;
        ns_k(&ns, 5); /* a namespace never seen: its group is allocated */
        th_alloc_arm(&a, n);
        int rc = kvp_cache_set_quota(c, &ns, 1);
        th_alloc_arm(&a, -1); /* the checker's scratch comes from the hooks too */
        TH_CHECK(c);
        if (rc == KVP_ENOMEM) {
            kvp_stats after = th_stats(c);
            th_assert_stats_equal(&before, &after, "set_quota failure");
            kvp_cache_free(c);
            assert_no_leak(&a, "set_quota failure");
            continue;
        }
        cr_assert_eq(rc, KVP_OK);
        kvp_cache_free(c);
        assert_no_leak(&a, "kvp_cache_free");
        cr_assert_gt(n, 0, "no allocation was ever failed");
        break;
    }
}

Test(enomem, calls_without_enomem_do_not_allocate)
{
    /* kvp_lookup, kvp_commit, kvp_release, kvp_cache_reset and the read-only calls list no
     * KVP_ENOMEM, so they must succeed with an allocator that fails every call. */
    for (int verify = 0; verify < 2; verify++) {
        th_alloc a;
        th_alloc_init(&a);
        kvp_config cfg = hooked_config(&a, 64, 4, verify);
        kvp_cache *c = NULL;
        cr_assert_eq(kvp_cache_new(&cfg, &c), KVP_OK);
        setup_common(c);
        kvp_namespace ns;
        ns_k(&ns, 0);
        uint32_t t[40];
        prompt(t, 40, 2);
        th_alloc_arm(&a, TH_FAIL_ALL);
        kvp_match m;
        cr_assert_eq(kvp_lookup(c, &ns, t, 40, NULL, 0, &m), KVP_OK, "lookup (verify %d)", verify);
        cr_assert_eq(kvp_commit(c, 7, t, 12, NULL), KVP_OK, "commit (verify %d)", verify);
        cr_assert_eq(kvp_release(c, 7), KVP_OK, "release (verify %d)", verify);
        cr_assert_eq(kvp_cache_reset(c), KVP_OK, "reset (verify %d)", verify);
        kvp_stats s;
        cr_assert_eq(kvp_cache_stats(c, &s), KVP_OK);
        /* The checker takes its scratch from the cache's hooks, so it reports ENOMEM here
         * and passes once they work again, leaving the live-byte count where it was. */
        cr_assert_eq(kvp_cache_check(c), KVP_ENOMEM);
        th_alloc_arm(&a, -1);
        int64_t live = a.live_bytes;
        uint64_t calls = a.n_calls;
        cr_assert_eq(kvp_cache_check(c), KVP_OK);
        cr_assert_gt(a.n_calls, calls, "kvp_cache_check allocated outside the hooks");
        cr_assert_eq(a.live_bytes, live, "kvp_cache_check kept memory");
        kvp_cache_free(c);
        assert_no_leak(&a, "no-ENOMEM calls");
    }
}
