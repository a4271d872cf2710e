/*
 * testutil.c - helpers shared by the Criterion tests (see testutil.h): the counting
 * allocator, the event recorder, namespace and cache factories, the PRNG and the checked
 * wrappers of public calls.
 */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

/* ---------------------------------------------------------------------------------------- */
/* Counting allocator                                                                       */
/* ---------------------------------------------------------------------------------------- */

/* Each allocation carries a header with its size and a magic word, so that th_free can
 * check the size the cache passes back and catch frees of foreign pointers. */
#define TH_MAGIC UINT64_C(0x6b7670616c6c6f63)
typedef struct th_hdr {
    uint64_t magic;
    uint64_t size;
} th_hdr;

void th_alloc_init(th_alloc *a)
{
    memset(a, 0, sizeof(*a));
    a->fail_at = -1;
}

void th_alloc_arm(th_alloc *a, int64_t fail_at)
{
    a->n_calls = 0;
    a->fail_at = fail_at;
}

static void *th_alloc_fn(void *ud, size_t size)
{
    th_alloc *a = ud;
    uint64_t call = a->n_calls++;
    if (a->fail_at == TH_FAIL_ALL || (a->fail_at >= 0 && call == (uint64_t)a->fail_at)) {
        a->n_failed++;
        return NULL;
    }
    th_hdr *h = malloc(sizeof(th_hdr) + size);
    if (!h)
        return NULL;
    h->magic = TH_MAGIC;
    h->size = size;
    a->live_bytes += (int64_t)size;
    a->n_live++;
    return h + 1;
}

static void th_free_fn(void *ud, void *ptr, size_t size)
{
    th_alloc *a = ud;
    if (!ptr)
        return;
    th_hdr *h = (th_hdr *)ptr - 1;
    if (h->magic != TH_MAGIC || h->size != size) {
        a->n_bad_frees++;
        return; /* leak rather than corrupt: the test will report it */
    }
    h->magic = 0;
    a->live_bytes -= (int64_t)size;
    a->n_live--;
    free(h);
}

kvp_allocator th_alloc_hooks(th_alloc *a)
{
    kvp_allocator al = {th_alloc_fn, th_free_fn, a};
    return al;
}
/* ---------------------------------------------------------------------------------------- */
/* Event recorder                                                                           */
/* ---------------------------------------------------------------------------------------- */

void th_events_fn(void *ud, const kvp_event *ev)
{
    th_events *e = ud;
    if (e->n < TH_MAX_EVENTS)
        e->ev[e->n] = *ev;
    e->n++;
}

size_t th_events_count(const th_events *e, int type, int reason)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n && i < TH_MAX_EVENTS; i++)
        if (e->ev[i].type == type && (reason < 0 || e->ev[i].reason == reason))
            n++;
    return n;
}
/* ---------------------------------------------------------------------------------------- */
/* Namespaces, keys and caches                                                              */
/* ---------------------------------------------------------------------------------------- */

void th_ns(kvp_namespace *ns, const char *model, const char *adapter, const char *tenant,
           const char *salt)
{
    kvp_namespace_init(ns);
    ns->model = kvp_field_str(model);
    ns->adapter = kvp_field_str(adapter);
    ns->tenant = kvp_field_str(tenant);
    ns->salt = kvp_field_str(salt);
}

bool th_key_eq(kvp_key a, kvp_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

kvp_config th_config(uint32_t n_blocks, uint32_t block_size, bool verify, kvp_event_fn on_event,
                     void *ud)
{
    kvp_config cfg;
    kvp_config_init(&cfg);
    /* The tests compare cache keys with kvp_hash_blocks/kvp_namespace_key, which compute
     * the xxh3 profile's keys; test_keys and test_profiles cover the other profiles. */
    cfg.hash_profile = KVP_HASH_XXH3;
    cfg.n_blocks = n_blocks;
    cfg.block_size = block_size;
    cfg.verify_tokens = verify;
    cfg.on_event = on_event;
    cfg.event_ud = ud;
    return cfg;
}

kvp_cache *th_cache_new(const kvp_config *cfg)
{
    kvp_cache *c = NULL;
    int rc = kvp_cache_new(cfg, &c);
    cr_assert_eq(rc, KVP_OK, "kvp_cache_new(n_blocks=%u, block_size=%u): %s", cfg->n_blocks,
                 cfg->block_size, kvp_strerror(rc));
    cr_assert_not_null(c, "kvp_cache_new returned KVP_OK but no cache");
    return c;
}

kvp_cache *th_cache(uint32_t n_blocks, uint32_t block_size, bool verify, kvp_event_fn on_event,
                    void *ud)
{
    kvp_config cfg = th_config(n_blocks, block_size, verify, on_event, ud);
    return th_cache_new(&cfg);
}

uint64_t th_rand(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------------------------------- */
/* Checked calls                                                                            */
/* ---------------------------------------------------------------------------------------- */

kvp_stats th_stats(const kvp_cache *c)
{
    kvp_stats s;
    int rc = kvp_cache_stats(c, &s);
    cr_assert_eq(rc, KVP_OK, "kvp_cache_stats: %s", kvp_strerror(rc));
    cr_assert_eq(s.n_blocks_free + s.n_blocks_cached + s.n_blocks_in_use, s.n_blocks_total,
                 "free %u + cached %u + in use %u != total %u", s.n_blocks_free, s.n_blocks_cached,
                 s.n_blocks_in_use, s.n_blocks_total);
    return s;
}

void th_assert_stats_equal(const kvp_stats *expected, const kvp_stats *got, const char *what)
{
#define F(x)                                                                                       \
    cr_assert_eq(expected->x, got->x, "%s: " #x " is %llu, expected %llu", what,                   \
                 (unsigned long long)got->x, (unsigned long long)expected->x)
    F(n_requests);
    F(n_lookups);
    F(n_tokens_queried);
    F(n_tokens_hit);
    F(n_blocks_hit);
    F(n_blocks_missed);
    F(n_blocks_stored);
    F(n_blocks_deduped);
    F(n_evictions);
    F(n_verify_rejects);
    F(n_blocks_total);
    F(n_blocks_free);
    F(n_blocks_cached);
    F(n_blocks_in_use);
    F(n_requests_active);
#undef F
}

kvp_match th_lookup_ok(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, size_t n)
{
    kvp_match m;
    memset(&m, 0xa5, sizeof m);
    int rc = kvp_lookup(c, ns, t, n, NULL, 0, &m);
    cr_assert_eq(rc, KVP_OK, "kvp_lookup: %s", kvp_strerror(rc));
    return m;
}

kvp_match th_access_ok(kvp_cache *c, const kvp_namespace *ns, const uint32_t *t, size_t n)
{
    kvp_match m;
    int rc = kvp_access(c, ns, t, n, &m);
    cr_assert_eq(rc, KVP_OK, "kvp_access: %s", kvp_strerror(rc));
    TH_CHECK(c);
    return m;
}

kvp_match th_acquire_ok(kvp_cache *c, uint64_t id, const kvp_namespace *ns, const uint32_t *t,
                        size_t n, size_t cap)
{
    kvp_match m;
    int rc = kvp_acquire(c, id, ns, t, n, cap, &m);
    cr_assert_eq(rc, KVP_OK, "kvp_acquire(%llu): %s", (unsigned long long)id, kvp_strerror(rc));
    TH_CHECK(c);
    return m;
}
