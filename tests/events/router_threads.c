/*
 * router_threads.c - a standalone stress test of one kvp_router shared by threads (not a
 * Criterion test: ThreadSanitizer runs it in CI's TSan build, and Criterion's forked
 * workers would hide races from it).
 *
 * N_EVENT threads each own N_PER workers (one event thread per worker group, as a
 * subscriber daemon shards engines) and apply random batches to them (kvp_router_apply or
 * kvp_router_apply_many): stores, removals per medium, clears, in sequence, with occasional
 * publisher restarts, duplicates, gaps (answered by "replaying" the missed batch, or by marking the
 * worker stale and later resyncing). Each keeps a plain model of its own workers. N_SCORE threads
 * score random prompts all the while, and check what must hold under any interleaving (a row per
 * worker, runs within the prompt, scores between 0.8 and 1.0 per block, valid states, the
 * view each call reports, each row's engine id read after the call). One more thread adds
 * and removes a worker over and over, so scores restart on a changed worker set and hand
 * out the engine id of a worker removed right after, and reads stats and runs the checker.
 *
 * After the join, nothing is concurrent: every worker's block count and every score must
 * equal its owner's model exactly, the router's counters must equal the sums of what the
 * threads did, and kvp_router_check must pass.
 *
 * With KVP_TEST_REDIS_URL set (tests/support/with_redis.py), the router has a Redis store: every
 * batch goes to Redis as well, every score is answered by Redis, the same checks hold, and
 * no call may have fallen back to the local view (that would hide a broken store).
 *
 * With a second argument "tokens", the router indexes by tokens (KVP_ROUTER_INDEX_TOKENS):
 * stores then always start at a prompt's block 0 (a chain's root, as an engine stores a
 * prompt), so that every parent resolves and the model stays exact; removals, clears,
 * restarts and gaps go through the per-worker maps.
 *
 * Prints "N passed, M failed" and exits 0 when every check held, 1 otherwise.
 * Usage: router_threads [batches per event thread (default 4000) [tokens]].
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvprefix_events.h"

#define N_EVENT    2
#define N_PER      6
#define N_SCORE    4
#define N_PROMPTS  16
#define N_TOKENS   96
#define BLOCK_SIZE 4
#define N_KEYS     (N_TOKENS / BLOCK_SIZE)

static atomic_int n_failed;
static bool by_tokens; /* the router indexes by tokens (argv[2] "tokens") */
static int n_passed;

static void check(int ok, const char *what)
{
    if (ok) {
        n_passed++;
    } else {
        atomic_fetch_add(&n_failed, 1);
        fprintf(stderr, "router_threads: FAILED: %s\n", what);
    }
}

/* Thread-safe failure from worker threads (n_passed is only counted on the main thread). */
static void expect(int ok, const char *what)
{
    if (!ok) {
        atomic_fetch_add(&n_failed, 1);
        fprintf(stderr, "router_threads: FAILED: %s\n", what);
    }
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static kvp_router *router;
static kvp_config hash_cfg;
static uint32_t prompts[N_PROMPTS][N_TOKENS];
static uint64_t keys[N_PROMPTS][N_KEYS];
static atomic_bool stop;
static atomic_ullong n_scores_done;

/* One worker as its event thread models it. */
typedef struct model_worker {
    uint32_t id;
    uint64_t held[N_PROMPTS * N_KEYS]; /* keys held */
    uint32_t mask[N_PROMPTS * N_KEYS]; /* their media: GPU 1, CPU 2 */
    size_t n;
    uint64_t expected;
    bool seq_known, stale;
} model_worker;

typedef struct event_thread {
    int index;
    uint64_t rng;
    model_worker w[N_PER];
    uint64_t n_batches, n_restarts, n_gaps, n_duplicates; /* what it saw */
    int batches;
} event_thread;

static long find_key(const model_worker *w, uint64_t k)
{
    for (size_t i = 0; i < w->n; i++) {
        if (w->held[i] == k)
            return (long)i;
    }
    return -1;
}

static void model_apply(model_worker *w, const kvp_kv_event *e, uint32_t bit)
{
    if (e->type == KVP_EVENT_CLEARED) {
        w->n = 0;
        return;
    }
    for (size_t i = 0; i < e->n_hashes; i++) {
        long at = find_key(w, e->hashes[i]);
        if (e->type == KVP_EVENT_STORED) {
            if (at >= 0) {
                w->mask[at] |= bit;
            } else {
                w->held[w->n] = e->hashes[i];
                w->mask[w->n++] = bit;
            }
        } else if (at >= 0) {
            w->mask[at] &= ~bit;
            if (w->mask[at] == 0) {
                w->n--;
                w->held[at] = w->held[w->n];
                w->mask[at] = w->mask[w->n];
            }
        }
    }
}

/* One random event for prompt p. */
static kvp_kv_event random_event(uint64_t *rng, uint32_t *bit)
{
    int p = (int)(rnd(rng) % N_PROMPTS);
    size_t s = rnd(rng) % 3 == 0 ? 0 : rnd(rng) % N_KEYS;
    size_t len = 1 + rnd(rng) % (N_KEYS - s);
    bool cpu = rnd(rng) % 3 == 0;
    uint64_t kind = rnd(rng) % 16;
    if (by_tokens && kind < 10) {
        len += s; /* a store from the prompt's root block */
        s = 0;
    }
    *bit = cpu ? 2 : 1;
    kvp_kv_event e;
    memset(&e, 0, sizeof e);
    e.group_idx = -1;
    e.medium = cpu ? "CPU" : "GPU";
    e.type = kind < 10 ? KVP_EVENT_STORED : kind < 15 ? KVP_EVENT_REMOVED : KVP_EVENT_CLEARED;
    if (e.type != KVP_EVENT_CLEARED) {
        e.hashes = keys[p] + s;
        e.n_hashes = len;
    }
    if (e.type == KVP_EVENT_STORED) {
        e.tokens = prompts[p] + s * BLOCK_SIZE;
        e.n_tokens = len * BLOCK_SIZE;
        e.block_size = BLOCK_SIZE;
    }
    return e;
}

/* Apply one batch at seq and return the result's status (0 on error). */
static int apply(event_thread *t, model_worker *w, uint64_t seq, const kvp_kv_event *ev,
                 const uint32_t *bits, size_t n, double ts)
{
    kvp_kv_batch b = {ts, ev, n, false, 0};
    kvp_router_apply_result res;
    int rc;
    if (rnd(&t->rng) % 2) {
        rc = kvp_router_apply(router, w->id, seq, &b, &res);
    } else {
        kvp_router_item item = {w->id, seq, &b, 0, {0}};
        rc = kvp_router_apply_many(router, &item, 1);
        expect(rc == item.rc, "apply_many returns the item's code");
        res = item.res;
    }
    expect(rc == KVP_OK, "apply returns KVP_OK");
    if (rc != KVP_OK)
        return 0;
    if (res.status == KVP_ROUTER_APPLIED || res.status == KVP_ROUTER_RESTARTED) {
        if (res.status == KVP_ROUTER_RESTARTED) {
            w->n = 0;
            t->n_restarts++;
        }
        bool exact = seq == 0;
        for (size_t i = 0; i < n; i++) {
            model_apply(w, &ev[i], bits[i]);
            exact |= ev[i].type == KVP_EVENT_CLEARED;
        }
        if (exact)
            w->stale = false;
        w->seq_known = true;
        w->expected = seq + 1;
        t->n_batches++;
    } else if (res.status == KVP_ROUTER_GAP) {
        t->n_gaps++;
    } else if (res.status == KVP_ROUTER_DUPLICATE) {
        t->n_duplicates++;
    }
    expect(res.stale == w->stale, "stale flag as modelled");
    return res.status;
}

/* One step for worker w: a batch in order, or a restart, duplicate, gap + replay, or a
 * stale cycle. */
static void event_step(event_thread *t, model_worker *w, double ts)
{
    kvp_kv_event ev[2];
    uint32_t bits[2];
    size_t n = 1 + rnd(&t->rng) % 2;
    for (size_t i = 0; i < n; i++)
        ev[i] = random_event(&t->rng, &bits[i]);
    uint64_t pick = rnd(&t->rng) % 50;
    uint64_t next = w->seq_known ? w->expected : 500;
    if (pick == 0) {
        apply(t, w, 0, ev, bits, n, ts); /* a publisher restart */
    } else if (pick == 1 && next > 1) {
        apply(t, w, next - 1, ev, bits, n, ts); /* a duplicate */
    } else if (pick == 2 && w->seq_known) {
        /* Batch `next` was lost: the next one is a gap, then the replay delivers both. */
        kvp_kv_event lost = random_event(&t->rng, &bits[1]);
        expect(apply(t, w, next + 1, ev, bits, 1, ts) == KVP_ROUTER_GAP, "gap reported");
        uint32_t lost_bit = bits[1];
        expect(apply(t, w, next, &lost, &lost_bit, 1, ts) == KVP_ROUTER_APPLIED, "replay 1");
        expect(apply(t, w, next + 1, ev, bits, 1, ts) == KVP_ROUTER_APPLIED, "replay 2");
    } else if (pick == 3) {
        expect(kvp_router_mark_stale(router, w->id) == KVP_OK, "mark_stale");
        w->n = 0;
        w->stale = true;
        w->seq_known = false;
    } else if (pick == 4) {
        expect(kvp_router_resync(router, w->id) == KVP_OK, "resync");
        w->stale = false;
    } else {
        apply(t, w, next, ev, bits, n, ts);
    }
}

static void *event_main(void *arg)
{
    event_thread *t = arg;
    for (int b = 0; b < t->batches; b++) {
        model_worker *w = &t->w[rnd(&t->rng) % N_PER];
        event_step(t, w, (double)b + 1000.0 * t->index);
    }
    return NULL;
}

/* What holds for any score, whatever runs concurrently. */
static void check_rows(const kvp_router_row *rows, size_t n, size_t n_blocks)
{
    expect(n >= (size_t)N_EVENT * N_PER && n <= (size_t)N_EVENT * N_PER + 1, "row count");
    for (size_t i = 0; i < n; i++) {
        const kvp_router_row *r = &rows[i];
        expect(r->n_blocks <= n_blocks, "run within the prompt");
        expect(r->n_tokens == (uint64_t)r->n_blocks * BLOCK_SIZE, "tokens = blocks * size");
        expect(r->score <= r->n_blocks + 1e-9 && r->score >= 0.8 * r->n_blocks - 1e-9,
               "score between 0.8 and 1.0 per block");
        expect(r->state == KVP_ROUTER_ROW_SCORED || r->state == KVP_ROUTER_ROW_STALE,
               "valid state");
        expect(r->state == KVP_ROUTER_ROW_SCORED || r->n_blocks == 0, "stale rows are zero");
    }
}

/* The view every score must report (REDIS with a store: any fallback fails the test), and
 * the churn worker's engine id as a score handed it out (read again after the join). */
static int want_view = KVP_ROUTER_VIEW_LOCAL;
static _Atomic(const char *) churn_name;

static void *score_main(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg;
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_router_row rows[N_EVENT * N_PER + 1];
    const char *ids[N_EVENT * N_PER + 1];
    while (!atomic_load(&stop)) {
        int p = (int)(rnd(&rng) % N_PROMPTS);
        size_t n_tok = 1 + rnd(&rng) % N_TOKENS, n = 0;
        kvp_router_score_result res;
        kvp_router_score_result_init(&res);
        res.engine_ids = ids;
        int rc = kvp_router_score_v2(router, &ns, prompts[p], n_tok, rows,
                                     sizeof rows / sizeof rows[0], &n, &res);
        expect(rc == KVP_OK, "score returns KVP_OK");
        if (rc == KVP_OK) {
            check_rows(rows, n, n_tok / BLOCK_SIZE);
            expect(res.view == want_view, "the view of this call");
            /* Engine ids are read after the call, while the churn thread may already have
             * removed its worker: the interned string must still be there. */
            for (size_t i = 0; i < n; i++) {
                expect(strcmp(ids[i], "churn") == 0 || ids[i][0] == 'e', "row's engine id");
                if (strcmp(ids[i], "churn") == 0)
                    atomic_store(&churn_name, ids[i]);
            }
            atomic_fetch_add(&n_scores_done, 1);
        }
    }
    return NULL;
}

/* Adds and removes one extra worker, reads stats, runs the checker. */
static void *churn_main(void *arg)
{
    (void)arg;
    kvp_router_worker_config wc;
    kvp_router_worker_config_init(&wc);
    wc.engine_id = "churn";
    wc.hash = hash_cfg;
    while (!atomic_load(&stop)) {
        uint32_t id;
        expect(kvp_router_worker_add(router, &wc, &id) == KVP_OK, "churn add");
        kvp_router_stats st;
        expect(kvp_router_stats_get(router, &st) == KVP_OK, "stats");
        expect(st.n_holders >= st.n_blocks, "holders >= blocks");
        expect(kvp_router_check(router) == KVP_OK, "check while running");
        expect(kvp_router_worker_remove(router, id) == KVP_OK, "churn remove");
    }
    return NULL;
}

/* Single-threaded: every worker's count and score equal its model. */
static void final_checks(event_thread *ev)
{
    check(kvp_router_check(router) == KVP_OK, "kvp_router_check after the run");
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_router_row rows[N_EVENT * N_PER];
    uint64_t batches = 0, restarts = 0, gaps = 0, dups = 0;
    for (int t = 0; t < N_EVENT; t++) {
        batches += ev[t].n_batches;
        restarts += ev[t].n_restarts;
        gaps += ev[t].n_gaps;
        dups += ev[t].n_duplicates;
        for (int i = 0; i < N_PER; i++) {
            const model_worker *w = &ev[t].w[i];
            kvp_router_worker_stats ws;
            check(kvp_router_worker_stats_get(router, w->id, &ws) == KVP_OK, "worker stats");
            check(ws.n_blocks == w->n, "worker block count equals its model");
            check(ws.stale == w->stale, "stale flag equals its model");
        }
    }
    for (int p = 0; p < N_PROMPTS; p++) {
        size_t n = 0;
        check(kvp_router_score(router, &ns, prompts[p], N_TOKENS, rows, N_EVENT * N_PER, &n) ==
                  KVP_OK,
              "final score");
        for (int t = 0; t < N_EVENT; t++) {
            for (int i = 0; i < N_PER; i++) {
                const model_worker *w = &ev[t].w[i];
                uint32_t run = 0;
                while (!w->stale && run < N_KEYS && find_key(w, keys[p][run]) >= 0)
                    run++;
                const kvp_router_row *row = &rows[t * N_PER + i];
                check(row->worker == w->id && row->n_blocks == run, "final score equals model");
            }
        }
    }
    kvp_router_stats st;
    check(kvp_router_stats_get(router, &st) == KVP_OK, "stats");
    check(st.n_batches == batches, "n_batches equals the threads' sum");
    check(st.n_restarts == restarts && st.n_gaps == gaps && st.n_duplicates == dups,
          "restart, gap and duplicate counters equal the threads' sums");
    check(st.n_scores == atomic_load(&n_scores_done) + N_PROMPTS, "n_scores exact");
    check(restarts > 0 && gaps > 0 && dups > 0, "every sequence case happened");
}

/* Prompts sharing prefixes, and their keys under hash_cfg. */
static void make_prompts(void)
{
    uint64_t rng = 99;
    kvp_hasher *h = NULL;
    check(kvp_hasher_new(&hash_cfg, &h) == KVP_OK, "hasher");
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    for (int p = 0; p < N_PROMPTS; p++) {
        size_t cut = rnd(&rng) % N_TOKENS;
        for (size_t i = 0; i < N_TOKENS; i++)
            prompts[p][i] = i < cut ? prompts[0][i] + (p == 0) : (uint32_t)(rnd(&rng) % 5000);
        kvp_chain chain, out[N_KEYS];
        size_t got = 0;
        check(kvp_hasher_root(h, &ns, &chain) == KVP_OK &&
                  kvp_hasher_blocks(h, &ns, &chain, prompts[p], N_TOKENS, out, N_KEYS, &got) ==
                      KVP_OK &&
                  got == N_KEYS,
              "keys");
        for (int k = 0; k < N_KEYS; k++)
            keys[p][k] = out[k].key.lo;
    }
    kvp_hasher_free(h);
}

int main(int argc, char **argv)
{
    int batches = argc > 1 ? atoi(argv[1]) : 4000;
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    kvp_config_init(&hash_cfg);
    hash_cfg.hash_profile = KVP_HASH_VLLM_XXHASH;
    hash_cfg.block_size = BLOCK_SIZE;
    cfg.hash = hash_cfg;
    by_tokens = argc > 2 && strcmp(argv[2], "tokens") == 0;
    if (by_tokens)
        cfg.index_by = KVP_ROUTER_INDEX_TOKENS;
    char prefix[48];
    const char *url = getenv("KVP_TEST_REDIS_URL");
    if (url && *url) {
        snprintf(prefix, sizeof prefix, "threads%ld", (long)getpid());
        cfg.redis.url = url;
        cfg.redis.key_prefix = prefix;
        cfg.redis.timeout_ms = 10000; /* a sanitizer build on a loaded machine is slow */
        want_view = KVP_ROUTER_VIEW_REDIS;
    }
    if (kvp_router_new(&cfg, &router) != KVP_OK) {
        fprintf(stderr, "router_threads: kvp_router_new failed\n");
        return 1;
    }
    make_prompts();

    static event_thread ev[N_EVENT];
    char name[16];
    for (int t = 0; t < N_EVENT; t++) {
        ev[t].index = t;
        ev[t].rng = 1000 + (uint64_t)t;
        ev[t].batches = batches;
        for (int i = 0; i < N_PER; i++) {
            snprintf(name, sizeof name, "e%d", t * N_PER + i);
            check(kvp_router_worker_get(router, name, 0, &ev[t].w[i].id) == KVP_OK, "worker");
            ev[t].w[i].seq_known = true;
        }
    }
    pthread_t et[N_EVENT], st[N_SCORE], ct;
    for (int t = 0; t < N_SCORE; t++)
        pthread_create(&st[t], NULL, score_main, (void *)(uintptr_t)(77 + t));
    pthread_create(&ct, NULL, churn_main, NULL);
    for (int t = 0; t < N_EVENT; t++)
        pthread_create(&et[t], NULL, event_main, &ev[t]);
    for (int t = 0; t < N_EVENT; t++)
        pthread_join(et[t], NULL);
    atomic_store(&stop, true);
    for (int t = 0; t < N_SCORE; t++)
        pthread_join(st[t], NULL);
    pthread_join(ct, NULL);
    const char *cn = atomic_load(&churn_name);
    check(!cn || strcmp(cn, "churn") == 0, "a removed worker's engine id reads back");

    final_checks(ev);
    if (url && *url) {
        kvp_router_stats rs;
        check(kvp_router_stats_get(router, &rs) == KVP_OK && rs.redis && rs.redis_up,
              "Redis reachable throughout");
        check(rs.n_redis_errors == 0 && rs.n_fallback_scores == 0 && rs.n_fallback_applies == 0,
              "no call fell back to the local view");
    }
    kvp_router_free(router);
    int failed = atomic_load(&n_failed);
    printf("router_threads: %d passed, %d failed (%llu scores ran concurrently)\n", n_passed,
           failed, (unsigned long long)atomic_load(&n_scores_done));
    return failed == 0 ? 0 : 1;
}
