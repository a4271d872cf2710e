/*
 * threads.c - a standalone stress test of one cache shared by many threads (not a Criterion
 * test: ThreadSanitizer runs it in CI's TSan build, and Criterion's forked workers would
 * hide races from it).
 *
 * N_THREADS threads hammer one cache with every public call that takes it: lookups in all
 * three forms, acquire and commit with and without precomputed keys, grow, request_blocks,
 * release, access in all three forms, stats, the invariant checker and (rarely) reset, on
 * prompts that share prefixes across three tenants, in a pool small enough to evict all the
 * time. An event callback counts events and checks that a call on its own cache from inside
 * it returns KVP_EBUSY. Each thread counts what its own calls returned. After the threads
 * join, the cache's counters must equal those sums exactly (n_requests, n_lookups,
 * n_tokens_queried, n_tokens_hit, n_blocks_stored vs STORED events, n_evictions vs REMOVED
 * events), and kvp_cache_check must pass. It runs once without and once with collision-proof
 * mode, then once with single_threaded set and one thread.
 *
 * Prints "N passed, M failed" and exits 0 when every check held, 1 otherwise.
 * Usage: threads [ops per thread] (default 20000).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvprefix.h"

#define N_THREADS  8
#define BLOCK_SIZE 4
#define N_BLOCKS   384
#define MAX_PROMPT 96
#define MAX_ACTIVE 4

static int n_passed, n_failed;

static void check(int ok, const char *what)
{
    if (ok) {
        n_passed++;
    } else {
        n_failed++;
        fprintf(stderr, "threads: FAILED: %s\n", what);
    }
}

/* Counted by the event callback (any thread). */
typedef struct events {
    kvp_cache *cache;         /* set once the cache exists */
    atomic_ullong n_stored;   /* STORED events */
    atomic_ullong n_evicted;  /* REMOVED, reason EVICTED */
    atomic_ullong n_removed;  /* REMOVED, any reason */
    atomic_ullong n_cleared;  /* CLEARED events */
    atomic_ullong n_not_busy; /* own-cache calls from a callback that did not say EBUSY */
} events;

static void on_event(void *ud, const kvp_event *ev)
{
    events *e = ud;
    kvp_stats st;
    if (kvp_cache_stats(e->cache, &st) != KVP_EBUSY)
        atomic_fetch_add(&e->n_not_busy, 1);
    if (ev->type == KVP_EVENT_STORED)
        atomic_fetch_add(&e->n_stored, 1);
    if (ev->type == KVP_EVENT_REMOVED) {
        atomic_fetch_add(&e->n_removed, 1);
        if (ev->reason == KVP_REMOVED_EVICTED)
            atomic_fetch_add(&e->n_evicted, 1);
    }
    if (ev->type == KVP_EVENT_CLEARED)
        atomic_fetch_add(&e->n_cleared, 1);
}

/* What one thread's calls returned. */
typedef struct tally {
    uint64_t n_requests;       /* acquire + access calls that succeeded */
    uint64_t n_lookups;        /* lookup calls that succeeded */
    uint64_t n_tokens_queried; /* prompt tokens of the requests */
    uint64_t n_tokens_hit;     /* their n_tokens_hit */
    uint64_t n_errors;         /* unexpected status codes */
} tally;

typedef struct active {
    uint64_t id;                 /* request id */
    kvp_namespace ns;            /* its namespace (fields point at static strings) */
    uint32_t tokens[MAX_PROMPT]; /* prompt, then "generated" tokens */
    size_t n_prompt;             /* prompt length */
    size_t n_capacity;           /* tokens the request holds blocks for */
    size_t n_committed;          /* tokens given to the last commit (commits never shrink) */
} active;

typedef struct worker {
    kvp_cache *cache;
    unsigned index;         /* thread number */
    unsigned ops;           /* operations to run */
    bool ids_ok;            /* the _ids forms are allowed (not in verify mode) */
    uint64_t rng;           /* xorshift state */
    active act[MAX_ACTIVE]; /* this thread's active requests */
    unsigned n_act;         /* entries used in act */
    uint64_t next_id;       /* next request id (thread number in the high bits) */
    tally t;                /* what the calls returned */
} worker;

static uint32_t rnd(worker *w, uint32_t n)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return (uint32_t)(w->rng % n);
}

static const char *tenants[3] = {"acme", "globex", "initech"};

/* A prompt: one of 6 shared heads, then a random tail. Returns its length. */
static size_t make_prompt(worker *w, kvp_namespace *ns, uint32_t *tokens)
{
    kvp_namespace_init(ns);
    ns->model = kvp_field_str("m");
    ns->tenant = kvp_field_str(tenants[rnd(w, 3)]);
    uint32_t head = rnd(w, 6), n_head = 8 + head * 4;
    size_t n = n_head + 1 + rnd(w, MAX_PROMPT / 2);
    for (size_t i = 0; i < n; i++)
        tokens[i] = i < n_head ? head * 1000 + (uint32_t)i : rnd(w, 50);
    return n;
}

static void expect(worker *w, int rc, int ok1, int ok2)
{
    if (rc != KVP_OK && rc != ok1 && rc != ok2) {
        if (w->t.n_errors++ == 0)
            fprintf(stderr, "threads: thread %u: unexpected %s\n", w->index, kvp_strerror(rc));
    }
}

static void count_request(worker *w, const kvp_match *m)
{
    w->t.n_requests++;
    w->t.n_tokens_queried += m->n_tokens;
    w->t.n_tokens_hit += m->n_tokens_hit;
}

/* The three lookup forms. */
static void op_lookup(worker *w, int form)
{
    kvp_namespace ns;
    uint32_t tokens[MAX_PROMPT], ids[MAX_PROMPT];
    kvp_key keys[MAX_PROMPT], root;
    size_t n = make_prompt(w, &ns, tokens), n_keys;
    kvp_match m;
    int rc;
    if (form == 0) {
        rc = kvp_lookup(w->cache, &ns, tokens, n, ids, MAX_PROMPT, &m);
    } else if (form == 1 || !w->ids_ok) {
        rc = kvp_cache_keys(w->cache, &ns, tokens, n, &root, keys, MAX_PROMPT, &n_keys);
        expect(w, rc, KVP_OK, KVP_OK);
        rc = kvp_lookup_keys(w->cache, &ns, root, keys, tokens, n, ids, MAX_PROMPT, &m);
    } else {
        for (size_t i = 0; i < n / BLOCK_SIZE; i++)
            keys[i] = (kvp_key){tokens[i * BLOCK_SIZE] + 1, i};
        rc = kvp_lookup_ids(w->cache, &ns, keys, n / BLOCK_SIZE, n, ids, MAX_PROMPT, &m);
    }
    expect(w, rc, KVP_OK, KVP_OK);
    if (rc == KVP_OK)
        w->t.n_lookups++;
}

/* The three access forms. */
static void op_access(worker *w, int form)
{
    kvp_namespace ns;
    uint32_t tokens[MAX_PROMPT];
    kvp_key keys[MAX_PROMPT], root;
    size_t n = make_prompt(w, &ns, tokens), n_keys;
    kvp_match m;
    int rc;
    if (form == 0) {
        rc = kvp_access(w->cache, &ns, tokens, n, &m);
    } else if (form == 1 || !w->ids_ok) {
        rc = kvp_cache_keys(w->cache, &ns, tokens, n, &root, keys, MAX_PROMPT, &n_keys);
        expect(w, rc, KVP_OK, KVP_OK);
        rc = kvp_access_keys(w->cache, &ns, root, keys, tokens, n, &m);
    } else {
        for (size_t i = 0; i < n / BLOCK_SIZE; i++)
            keys[i] = (kvp_key){tokens[i * BLOCK_SIZE] + 1, i};
        rc = kvp_access_ids(w->cache, &ns, keys, n / BLOCK_SIZE, n, &m);
    }
    expect(w, rc, KVP_OK, KVP_OK);
    if (rc == KVP_OK)
        count_request(w, &m);
}

/* Start a request (token or key form); ENOSPC is expected when the pool is pinned. */
static void op_acquire(worker *w, bool with_keys)
{
    if (w->n_act == MAX_ACTIVE)
        return;
    active *a = &w->act[w->n_act];
    kvp_namespace ns;
    kvp_key keys[MAX_PROMPT], root;
    size_t n_keys;
    a->n_prompt = make_prompt(w, &ns, a->tokens);
    a->ns = ns;
    a->n_committed = 0;
    a->n_capacity = a->n_prompt + rnd(w, (uint32_t)(MAX_PROMPT - a->n_prompt) / 2 + 1);
    a->id = w->next_id++;
    kvp_match m;
    int rc;
    if (with_keys) {
        rc =
            kvp_cache_keys(w->cache, &ns, a->tokens, a->n_prompt, &root, keys, MAX_PROMPT, &n_keys);
        expect(w, rc, KVP_OK, KVP_OK);
        rc = kvp_acquire_keys(w->cache, a->id, &ns, root, keys, a->tokens, a->n_prompt,
                              a->n_capacity, &m);
    } else {
        rc = kvp_acquire(w->cache, a->id, &ns, a->tokens, a->n_prompt, a->n_capacity, &m);
    }
    expect(w, rc, KVP_ENOSPC, KVP_OK);
    if (rc != KVP_OK)
        return;
    count_request(w, &m);
    for (size_t i = a->n_prompt; i < MAX_PROMPT; i++)
        a->tokens[i] = rnd(w, 50);
    w->n_act++;
}

/* Commit, grow, inspect or release one of this thread's requests. */
static void op_request(worker *w, int what)
{
    if (w->n_act == 0)
        return;
    unsigned k = rnd(w, w->n_act);
    active *a = &w->act[k];
    const uint32_t *blocks;
    size_t n_blocks, n_stored, base = a->n_committed > a->n_prompt ? a->n_committed : a->n_prompt;
    size_t n = base + rnd(w, (uint32_t)(a->n_capacity - base) + 1);
    int rc;
    if (what == 0) {
        rc = kvp_commit(w->cache, a->id, a->tokens, n, &n_stored);
    } else if (what == 1) {
        kvp_key keys[MAX_PROMPT], root;
        size_t n_keys;
        rc = kvp_cache_keys(w->cache, &a->ns, a->tokens, n, &root, keys, MAX_PROMPT, &n_keys);
        expect(w, rc, KVP_OK, KVP_OK);
        rc = kvp_commit_keys(w->cache, a->id, keys, a->tokens, n, &n_stored);
    } else if (what == 2) {
        size_t cap = a->n_capacity + rnd(w, 8);
        if (cap > MAX_PROMPT)
            cap = MAX_PROMPT;
        rc = kvp_grow(w->cache, a->id, cap);
        if (rc == KVP_OK)
            a->n_capacity = cap;
        expect(w, rc, KVP_ENOSPC, KVP_OK);
        return;
    } else if (what == 3) {
        rc = kvp_request_blocks(w->cache, a->id, &blocks, &n_blocks);
        if (rc == KVP_OK && n_blocks * BLOCK_SIZE < a->n_capacity)
            w->t.n_errors++;
    } else {
        rc = kvp_release(w->cache, a->id);
        expect(w, rc, KVP_OK, KVP_OK);
        w->act[k] = w->act[--w->n_act];
        return;
    }
    expect(w, rc, KVP_OK, KVP_OK);
    if (rc == KVP_OK && what < 2)
        a->n_committed = n;
}

static void *run_worker(void *arg)
{
    worker *w = arg;
    kvp_stats st;
    for (unsigned i = 0; i < w->ops; i++) {
        uint32_t r = rnd(w, 100);
        if (r < 24)
            op_lookup(w, (int)rnd(w, 3));
        else if (r < 38)
            op_access(w, (int)rnd(w, 3));
        else if (r < 52)
            op_acquire(w, rnd(w, 2));
        else if (r < 96)
            op_request(w, (int)rnd(w, 5));
        else if (r < 98)
            expect(w, kvp_cache_stats(w->cache, &st), KVP_OK, KVP_OK);
        else if (r < 100 - (i % 997 == 0))
            expect(w, kvp_cache_check(w->cache), KVP_OK, KVP_OK);
        else
            expect(w, kvp_cache_reset(w->cache), KVP_OK, KVP_OK);
    }
    while (w->n_act > 0)
        op_request(w, 4);
    return NULL;
}

/* One run: n_threads workers on one cache, then the exact-count checks. */
static void run(const char *name, bool verify, bool single, unsigned n_threads, unsigned ops)
{
    events ev;
    memset(&ev, 0, sizeof ev);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = N_BLOCKS;
    cfg.block_size = BLOCK_SIZE;
    cfg.verify_tokens = verify;
    cfg.single_threaded = single;
    cfg.on_event = on_event;
    cfg.event_ud = &ev;
    kvp_cache *cache;
    if (kvp_cache_new(&cfg, &cache) != KVP_OK) {
        check(0, "kvp_cache_new");
        return;
    }
    ev.cache = cache;
    static worker ws[N_THREADS];
    pthread_t th[N_THREADS];
    for (unsigned i = 0; i < n_threads; i++) {
        memset(&ws[i], 0, sizeof ws[i]);
        ws[i] = (worker){
            cache, i, ops, !verify, 0x9e3779b97f4a7c15u * (i + 1), {{0}}, 0, (uint64_t)i << 32,
            {0}};
        if (pthread_create(&th[i], NULL, run_worker, &ws[i]) != 0)
            check(0, "pthread_create");
    }
    tally sum = {0};
    for (unsigned i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        sum.n_requests += ws[i].t.n_requests;
        sum.n_lookups += ws[i].t.n_lookups;
        sum.n_tokens_queried += ws[i].t.n_tokens_queried;
        sum.n_tokens_hit += ws[i].t.n_tokens_hit;
        sum.n_errors += ws[i].t.n_errors;
    }
    kvp_stats st;
    char what[160];
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        snprintf(what, sizeof what, "%s: %s", name, #cond);                                        \
        check((cond), what);                                                                       \
    } while (0)
    CHECK(kvp_cache_stats(cache, &st) == KVP_OK);
    CHECK(kvp_cache_check(cache) == KVP_OK);
    CHECK(sum.n_errors == 0);
    CHECK(st.n_requests == sum.n_requests);
    CHECK(st.n_lookups == sum.n_lookups);
    CHECK(st.n_tokens_queried == sum.n_tokens_queried);
    CHECK(st.n_tokens_hit == sum.n_tokens_hit);
    CHECK(st.n_blocks_stored == atomic_load(&ev.n_stored));
    CHECK(st.n_evictions == atomic_load(&ev.n_evicted));
    CHECK(st.n_blocks_cached == atomic_load(&ev.n_stored) - atomic_load(&ev.n_removed));
    CHECK(st.n_requests_active == 0 && st.n_blocks_in_use == 0);
    CHECK(atomic_load(&ev.n_not_busy) == 0);
    CHECK(st.n_tokens_hit > 0 && st.n_evictions > 0);
    printf("threads: %s: %u threads x %u ops: %llu requests, %llu lookups, %llu hit tokens, "
           "%llu evictions\n",
           name, n_threads, ops, (unsigned long long)st.n_requests,
           (unsigned long long)st.n_lookups, (unsigned long long)st.n_tokens_hit,
           (unsigned long long)st.n_evictions);
    kvp_cache_free(cache);
}

int main(int argc, char **argv)
{
    unsigned ops = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 20000;
    run("plain", false, false, N_THREADS, ops);
    run("verify", true, false, N_THREADS, ops);
    run("single_threaded", false, true, 1, ops);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
