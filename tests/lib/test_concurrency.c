/*
 * test_concurrency.c - the thread-safety contract that can be checked deterministically:
 * keys computed outside the lock (kvp_cache_keys) and the *_keys forms behave exactly like
 * the token forms (same matches, ids, statistics and events on twin caches, with and without
 * collision-proof mode); verification needs the tokens; a callback's own cache answers
 * KVP_EBUSY while another cache answers normally; and another thread calling the cache
 * while a callback runs waits for it instead of failing. (tests/lib/threads.c is the
 * randomized many-thread stress test; TSan runs it.)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "testutil.h"

#define BS 4

static void fill(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)(i % 7);
}

Test(concurrency, cache_keys_match_public_hash)
{
    kvp_cache *c = th_cache(64, BS, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", "lora", "t", NULL);
    uint32_t t[23];
    fill(t, 23, 5);
    kvp_key root, keys[8], want_root, want[8];
    size_t n, n_want;
    cr_assert_eq(kvp_cache_keys(c, &ns, t, 23, &root, keys, 8, &n), KVP_OK);
    cr_assert_eq(n, 5);
    cr_assert_eq(kvp_namespace_key(KVP_DEFAULT_SEED, &ns, &want_root), KVP_OK);
    cr_assert_eq(kvp_hash_blocks(KVP_DEFAULT_SEED, want_root, t, 23, BS, want, 8, &n_want), KVP_OK);
    cr_assert(th_key_eq(root, want_root));
    for (size_t i = 0; i < n; i++)
        cr_assert(th_key_eq(keys[i], want[i]), "key %zu", i);
    cr_assert_eq(kvp_cache_keys(c, &ns, t, 23, &root, keys, 2, &n), KVP_OK);
    cr_assert_eq(n, 2, "capped by cap");
    kvp_namespace bad = ns;
    bad.tenant.ptr = NULL;
    bad.tenant.len = 3;
    cr_assert_eq(kvp_cache_keys(c, &bad, t, 23, &root, keys, 8, &n), KVP_EINVAL);
    cr_assert_eq(kvp_cache_keys(NULL, &ns, t, 23, &root, keys, 8, &n), KVP_EINVAL);
    kvp_cache_free(c);
}

/* Field by field: the structs have padding, which the library does not write. */
static bool match_eq(const kvp_match *a, const kvp_match *b)
{
    return a->n_tokens == b->n_tokens && a->n_blocks_full == b->n_blocks_full &&
           a->n_blocks_cached == b->n_blocks_cached && a->n_blocks_hit == b->n_blocks_hit &&
           a->n_tokens_hit == b->n_tokens_hit && a->n_blocks_stored == b->n_blocks_stored;
}

static bool event_eq(const kvp_event *a, const kvp_event *b)
{
    return a->type == b->type && a->reason == b->reason && a->block_id == b->block_id &&
           a->n_tokens == b->n_tokens && th_key_eq(a->key, b->key) &&
           th_key_eq(a->parent, b->parent) && a->parent_is_root == b->parent_is_root;
}

/* Run the same script on two caches, token forms on a, key forms on b; compare. */
static void twin_script(bool verify)
{
    th_events ea = {0}, eb = {0};
    kvp_cache *a = th_cache(12, BS, verify, th_events_fn, &ea);
    kvp_cache *b = th_cache(12, BS, verify, th_events_fn, &eb);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[40];
    for (int round = 0; round < 6; round++) {
        fill(t, 40, (uint32_t)(round % 3) * 100);
        size_t n = 9 + (size_t)round * 5, n_keys;
        kvp_key root, keys[16];
        cr_assert_eq(kvp_cache_keys(b, &ns, t, 40, &root, keys, 16, &n_keys), KVP_OK);
        kvp_match ma, mb;
        uint32_t ia[16], ib[16];
        cr_assert_eq(kvp_lookup(a, &ns, t, n, ia, 16, &ma), KVP_OK);
        cr_assert_eq(kvp_lookup_keys(b, &ns, root, keys, t, n, ib, 16, &mb), KVP_OK);
        cr_assert(match_eq(&ma, &mb), "lookup round %d", round);
        cr_assert_eq(memcmp(ia, ib, ma.n_blocks_hit * sizeof *ia), 0);
        uint64_t id = (uint64_t)round;
        cr_assert_eq(kvp_acquire(a, id, &ns, t, n, n + 6, &ma), KVP_OK);
        cr_assert_eq(kvp_acquire_keys(b, id, &ns, root, keys, t, n, n + 6, &mb), KVP_OK);
        cr_assert(match_eq(&ma, &mb), "acquire round %d", round);
        size_t sa, sb;
        cr_assert_eq(kvp_commit(a, id, t, n + 5, &sa), KVP_OK);
        cr_assert_eq(kvp_commit_keys(b, id, keys, t, n + 5, &sb), KVP_OK);
        cr_assert_eq(sa, sb);
        cr_assert_eq(kvp_release(a, id), KVP_OK);
        cr_assert_eq(kvp_release(b, id), KVP_OK);
        fill(t, 40, 1000 + (uint32_t)round);
        cr_assert_eq(kvp_cache_keys(b, &ns, t, 40, &root, keys, 16, &n_keys), KVP_OK);
        cr_assert_eq(kvp_access(a, &ns, t, 17, &ma), KVP_OK);
        cr_assert_eq(kvp_access_keys(b, &ns, root, keys, t, 17, &mb), KVP_OK);
        cr_assert(match_eq(&ma, &mb), "access round %d", round);
        TH_CHECK(a);
        TH_CHECK(b);
    }
    kvp_stats sa = th_stats(a), sb = th_stats(b);
    th_assert_stats_equal(&sa, &sb, verify ? "verify twins" : "twins");
    cr_assert_eq(ea.n, eb.n);
    for (size_t i = 0; i < ea.n; i++)
        cr_assert(event_eq(&ea.ev[i], &eb.ev[i]), "event %zu differs", i);
    cr_assert_gt(sa.n_evictions, 0, "the script should evict");
    kvp_cache_free(a);
    kvp_cache_free(b);
}

Test(concurrency, key_forms_equal_token_forms)
{
    twin_script(false);
}

Test(concurrency, key_forms_equal_token_forms_verify)
{
    twin_script(true);
}

Test(concurrency, key_forms_need_tokens_to_verify)
{
    kvp_cache *c = th_cache(16, BS, true, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, "t", NULL);
    uint32_t t[12];
    fill(t, 12, 1);
    kvp_key root, keys[3];
    size_t n;
    kvp_match m;
    cr_assert_eq(kvp_cache_keys(c, &ns, t, 12, &root, keys, 3, &n), KVP_OK);
    cr_assert_eq(kvp_lookup_keys(c, &ns, root, keys, NULL, 12, NULL, 0, &m), KVP_EINVAL);
    cr_assert_eq(kvp_acquire_keys(c, 1, &ns, root, keys, NULL, 12, 12, &m), KVP_EINVAL);
    cr_assert_eq(kvp_access_keys(c, &ns, root, keys, NULL, 12, &m), KVP_EINVAL);
    cr_assert_eq(kvp_lookup_keys(c, &ns, root, NULL, t, 12, NULL, 0, &m), KVP_EINVAL,
                 "keys NULL with full blocks");
    cr_assert_eq(th_stats(c).n_requests + th_stats(c).n_lookups, 0, "nothing counted");
    kvp_cache_free(c);
}

/* A callback of cache a: its own cache is busy, another cache works. */
typedef struct cb_ctx {
    kvp_cache *self, *other; /* the emitting cache and a second one */
    int rc_self, rc_other;   /* what the calls returned */
    atomic_bool other_done;  /* the other thread's call has returned */
    pthread_t th;            /* the other thread */
    bool started;            /* th was created */
    int rc_thread;           /* what the other thread's call returned */
} cb_ctx;

static void *stats_thread(void *arg)
{
    cb_ctx *x = arg;
    kvp_stats st;
    x->rc_thread = kvp_cache_stats(x->self, &st);
    atomic_store(&x->other_done, true);
    return NULL;
}

static void on_stored(void *ud, const kvp_event *ev)
{
    cb_ctx *x = ud;
    if (ev->type != KVP_EVENT_STORED || x->started)
        return;
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvp_match m;
    x->rc_self = kvp_lookup(x->self, &ns, t, 8, NULL, 0, &m);
    x->rc_other = kvp_access(x->other, &ns, t, 8, &m);
    x->started = pthread_create(&x->th, NULL, stats_thread, x) == 0;
    struct timespec pause = {0, 30 * 1000 * 1000};
    nanosleep(&pause, NULL);
}

Test(concurrency, callback_busy_on_own_cache_others_wait)
{
    cb_ctx x = {0};
    kvp_config cfg = th_config(16, BS, false, on_stored, &x);
    x.self = th_cache_new(&cfg);
    x.other = th_cache(16, BS, false, NULL, NULL);
    kvp_namespace ns;
    th_ns(&ns, "m", NULL, NULL, NULL);
    uint32_t t[9] = {9, 9, 9, 9, 8, 8, 8, 8, 7};
    kvp_match m;
    cr_assert_eq(kvp_access(x.self, &ns, t, 9, &m), KVP_OK);
    cr_assert(x.started);
    cr_assert_eq(x.rc_self, KVP_EBUSY, "own cache from its callback");
    cr_assert_eq(x.rc_other, KVP_OK, "another cache from a callback");
    pthread_join(x.th, NULL);
    cr_assert_eq(x.rc_thread, KVP_OK, "another thread waits for the callback, then runs");
    cr_assert_eq(th_stats(x.other).n_requests, 1);
    kvp_cache_free(x.self);
    kvp_cache_free(x.other);
}
