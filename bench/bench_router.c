/*
 * bench_router.c - the router index (kvp_router) against the anchors: events
 * applied per second, score latency p50/p99 for 8k- and 128k-token prompts against 64
 * workers with 1M blocks indexed, and bytes per (block, worker).
 *
 * (a) Apply rate. 64 workers, each fed batches of one BlockStored of 16-token blocks with
 *     random 64-bit hashes (apply never hashes tokens, so the values do not matter), in
 *     sequence, until 1M blocks are indexed: 1 block per event (vLLM in decode) and 16
 *     per event (a prefill). Then a steady state at 1M blocks: each batch stores one block
 *     and removes the worker's oldest (eviction), 2 events per batch. Reported as events
 *     per second and blocks per second, one event thread.
 * (b) Score latency. 128 prompts of 128k random tokens, keys computed with the profile's
 *     hasher; prompt p is stored whole on worker p % 64 and its first half on worker
 *     (p + 17) % 64: 1,048,576 blocks, 1.5 holders per block. Scored: the first 8k tokens
 *     of a stored prompt (512 blocks cached on 2 workers), a whole 128k prompt (8192 cached
 *     blocks: the worst case, every block hashed and probed), and a 128k prompt nobody
 *     holds (hashing stops after the first 32 blocks). p50/p99 over the calls of a run; the
 *     hashing alone (kvp_hasher_blocks over the same tokens) is shown beside, so the index's
 *     own share is visible. Run for xxh3 (what Dynamo's router computes: XXH3-64 with its
 *     seed), vllm-xxhash-cbor and vllm-sha256-cbor.
 * (c) Concurrency: the 8k score's p50/p99 while an event thread applies as fast as it can,
 *     and the apply rate meanwhile, against each alone (same run); and two event threads
 *     on disjoint halves of the workers against one (the lock serializes them); and, as
 *     the control for cores shared with the rest of the machine, one event thread beside
 *     a thread that only spins.
 * (e) The cost of clearing one worker (AllBlocksCleared, a restart, mark_stale): a scan of
 *     the whole table under the exclusive lock, at the 1M-block state of (b).
 * (d) Memory: kvp_router_stats's total_bytes (every byte the router holds, through its
 *     allocator) divided by its (block, worker) pairs, at the 1M-block state of (b).
 *
 * Every figure is the median of RUNS runs. Anchors: Dynamo's indexer on the Mooncake trace
 * 18k-40k ops/s unsharded, 248k ops/s sharded with p99 773 us; an SGLang gateway's 26.9 B
 * per holder-block.
 *
 * --index=tokens runs every figure on a router in token mode (KVP_ROUTER_INDEX_TOKENS): apply
 * computes the router's own xxh3 key of every stored block and keeps the engine hash ->
 * own key maps; (b) scores with the router's own keys (the profile then only names the
 * engines' keys, which the router never computes); (d) includes the maps; (e) clears
 * through the worker's map. Events carry their parent (the previous event's last block),
 * and each event's first token is distinct so that (a)'s blocks are distinct in token mode
 * as they are by their random hashes.
 *
 * Usage: bench_router [runs] [--score=PROFILE] [--prompts=N] [--calls=N] [--index=MODE]
 *   runs          runs per figure, 1..16 (default 5)
 *   --score=P     only (b) and (d) for profile P (xxh3, vllm-xxhash-cbor, vllm-sha256-cbor)
 *   --prompts=N   prompts stored in (b), 6..128 (default 128: 1M blocks); fewer for a small
 *                 fixed workload, e.g. under valgrind --tool=callgrind
 *                 --toggle-collect=kvp_router_score
 *   --calls=N     scores per figure and run in (b), 1..400 (default 400; 128k prompts 300,
 *                 100 for vllm-sha256-cbor)
 *   --index=M     engine-hash (default) or tokens
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "benchutil.h"
#include "kvprefix_events.h"

#define N_WORKERS     64
#define BLOCK         16
#define N_PROMPTS     128
#define LONG_TOKENS   (128 * 1024)
#define LONG_BLOCKS   (LONG_TOKENS / BLOCK)
#define SHORT_TOKENS  (8 * 1024)
#define TARGET_BLOCKS (1u << 20)
#define MAX_CALLS     400

static int runs = 5;
static int n_prompts = N_PROMPTS;                   /* --prompts */
static int calls_b = MAX_CALLS;                     /* --calls */
static int index_by = KVP_ROUTER_INDEX_ENGINE_HASH; /* --index */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_router: %s: %s\n", what, kvp_strerror(rc));
    exit(1);
}

static kvp_config profile_cfg(int profile)
{
    kvp_config c;
    kvp_config_init(&c);
    c.hash_profile = profile;
    c.block_size = BLOCK;
    return c;
}

static kvp_router *router_with_workers(kvp_config hash, uint32_t *ids)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.hash = hash;
    cfg.index_by = index_by;
    kvp_router *r = NULL;
    int rc = kvp_router_new(&cfg, &r);
    if (rc != KVP_OK)
        die("kvp_router_new", rc);
    char name[32];
    for (int w = 0; w < N_WORKERS; w++) {
        snprintf(name, sizeof name, "pod-%02d", w);
        rc = kvp_router_worker_get(r, name, 0, &ids[w]);
        if (rc != KVP_OK)
            die("kvp_router_worker_get", rc);
    }
    return r;
}

static void apply_or_die(kvp_router *r, uint32_t id, uint64_t seq, const kvp_kv_event *ev, size_t n)
{
    kvp_kv_batch b = {1.0, ev, n, false, 0};
    kvp_router_apply_result res;
    int rc = kvp_router_apply(r, id, seq, &b, &res);
    if (rc != KVP_OK || res.status != KVP_ROUTER_APPLIED) {
        fprintf(stderr, "bench_router: apply: %s %s\n", kvp_strerror(rc), res.why ? res.why : "");
        exit(1);
    }
}

static kvp_kv_event stored(const uint64_t *h, size_t n, const uint32_t *tokens)
{
    kvp_kv_event e;
    memset(&e, 0, sizeof e);
    e.type = KVP_EVENT_STORED;
    e.hashes = h;
    e.n_hashes = n;
    e.tokens = tokens;
    e.n_tokens = n * BLOCK;
    e.block_size = BLOCK;
    e.medium = "GPU";
    e.group_idx = -1;
    return e;
}

/* ---------------------------------------------------------------- (a) apply rate */

typedef struct apply_rates {
    double fill_events_s, fill_blocks_s; /* filling to 1M blocks */
    double steady_events_s;              /* store one + evict one per batch, at 1M */
} apply_rates;

/* Fill to TARGET_BLOCKS with `per` blocks per event; then steady state. */
static apply_rates apply_run(int per, uint64_t seed)
{
    uint32_t ids[N_WORKERS];
    kvp_router *r = router_with_workers(profile_cfg(KVP_HASH_XXH3), ids);
    uint64_t *h = malloc((size_t)TARGET_BLOCKS * sizeof *h);
    uint32_t *tok = calloc((size_t)per * BLOCK, sizeof *tok);
    for (uint32_t i = 0; i < TARGET_BLOCKS; i++)
        h[i] = rnd(&seed);
    uint64_t seq[N_WORKERS] = {0};
    apply_rates out;
    double t0 = now();
    uint64_t n_events = 0;
    for (uint32_t i = 0; i < TARGET_BLOCKS; i += (uint32_t)per, n_events++) {
        uint32_t w = (uint32_t)(n_events % N_WORKERS);
        tok[0] = i; /* distinct blocks in token mode too */
        kvp_kv_event e = stored(h + i, (size_t)per, tok);
        apply_or_die(r, ids[w], seq[w]++, &e, 1);
    }
    double dt = now() - t0;
    out.fill_events_s = (double)n_events / dt;
    out.fill_blocks_s = (double)TARGET_BLOCKS / dt;
    /* Steady state: worker w evicts its oldest block while storing a new one. Worker w
     * stored the blocks of events w, w + 64, ... in order. */
    uint64_t next_old[N_WORKERS];
    for (int w = 0; w < N_WORKERS; w++)
        next_old[w] = (uint64_t)w;
    const uint32_t steady = 400000;
    t0 = now();
    for (uint32_t i = 0; i < steady; i++) {
        uint32_t w = i % N_WORKERS;
        uint64_t fresh = rnd(&seed), old = h[(next_old[w] * (uint64_t)per) % TARGET_BLOCKS];
        next_old[w] += N_WORKERS;
        tok[0] = TARGET_BLOCKS + i;
        kvp_kv_event ev[2] = {stored(&fresh, 1, tok), stored(&old, 1, tok)};
        ev[1].type = KVP_EVENT_REMOVED;
        apply_or_die(r, ids[w], seq[w]++, ev, 2);
    }
    dt = now() - t0;
    out.steady_events_s = 2.0 * steady / dt;
    kvp_router_free(r);
    free(h);
    free(tok);
    return out;
}

static void bench_apply(void)
{
    double f1[16], b1[16], f16[16], b16[16], s1[16];
    for (int i = 0; i < runs; i++) {
        apply_rates a = apply_run(1, 1000 + (uint64_t)i);
        apply_rates c = apply_run(16, 2000 + (uint64_t)i);
        f1[i] = a.fill_events_s;
        b1[i] = a.fill_blocks_s;
        s1[i] = a.steady_events_s;
        f16[i] = c.fill_events_s;
        b16[i] = c.fill_blocks_s;
    }
    printf("(a) apply, one event thread, 64 workers, 16-token blocks (median of %d runs)\n", runs);
    printf("    fill to 1M blocks, 1 block/event:   %10.0f events/s  %10.0f blocks/s\n",
           bench_median(f1, runs), bench_median(b1, runs));
    printf("    fill to 1M blocks, 16 blocks/event: %10.0f events/s  %10.0f blocks/s\n",
           bench_median(f16, runs), bench_median(b16, runs));
    printf("    steady at 1M, store 1 + remove 1:   %10.0f events/s\n", bench_median(s1, runs));
}

/* ---------------------------------------------------------------- (b) score latency */

typedef struct score_setup {
    kvp_router *r;
    kvp_config hash;
    uint32_t ids[N_WORKERS];
    uint32_t *tokens;       /* N_PROMPTS * LONG_TOKENS */
    uint32_t *miss;         /* LONG_TOKENS nobody holds */
    kvp_router_stats stats; /* after the fill */
} score_setup;

/* Keys of prompt tokens[0 .. n) under hash, into out. */
static void keys_of(const kvp_hasher *hs, const uint32_t *tokens, size_t n, uint64_t *out)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_chain chain, st[256];
    if (kvp_hasher_root(hs, &ns, &chain) != KVP_OK)
        die("kvp_hasher_root", KVP_EINVAL);
    for (size_t b = 0; b < n / BLOCK; b += 256) {
        size_t got = 0, want = n / BLOCK - b < 256 ? n / BLOCK - b : 256;
        int rc =
            kvp_hasher_blocks(hs, &ns, &chain, tokens + b * BLOCK, want * BLOCK, st, want, &got);
        if (rc != KVP_OK)
            die("kvp_hasher_blocks", rc);
        for (size_t i = 0; i < got; i++)
            out[b + i] = st[i].key.lo;
    }
}

static void score_setup_init(score_setup *s, int profile)
{
    s->hash = profile_cfg(profile);
    s->r = router_with_workers(s->hash, s->ids);
    uint64_t seed = 42;
    s->tokens = malloc((size_t)n_prompts * LONG_TOKENS * sizeof *s->tokens);
    s->miss = malloc((size_t)LONG_TOKENS * sizeof *s->miss);
    for (size_t i = 0; i < (size_t)n_prompts * LONG_TOKENS; i++)
        s->tokens[i] = (uint32_t)(rnd(&seed) % 150000);
    for (size_t i = 0; i < LONG_TOKENS; i++)
        s->miss[i] = (uint32_t)(rnd(&seed) % 150000);
    kvp_hasher *hs = NULL;
    int rc = kvp_hasher_new(&s->hash, &hs);
    if (rc != KVP_OK)
        die("kvp_hasher_new", rc);
    uint64_t *k = malloc(LONG_BLOCKS * sizeof *k);
    uint64_t seq[N_WORKERS] = {0};
    for (int p = 0; p < n_prompts; p++) {
        const uint32_t *t = s->tokens + (size_t)p * LONG_TOKENS;
        keys_of(hs, t, LONG_TOKENS, k);
        uint32_t a = (uint32_t)p % N_WORKERS, b = (uint32_t)(p + 17) % N_WORKERS;
        for (size_t i = 0; i < LONG_BLOCKS; i += 64) {
            kvp_kv_event e = stored(k + i, 64, t + i * BLOCK);
            e.has_parent = i > 0;
            e.parent = i > 0 ? k[i - 1] : 0;
            apply_or_die(s->r, s->ids[a], seq[a]++, &e, 1);
            if (i < LONG_BLOCKS / 2)
                apply_or_die(s->r, s->ids[b], seq[b]++, &e, 1);
        }
    }
    free(k);
    kvp_hasher_free(hs);
    rc = kvp_router_stats_get(s->r, &s->stats);
    if (rc != KVP_OK)
        die("kvp_router_stats_get", rc);
}

static void score_setup_free(score_setup *s)
{
    kvp_router_free(s->r);
    free(s->tokens);
    free(s->miss);
}

/* p50 and p99 (microseconds) of n_calls scores of tokens[0 .. n); checks the run length. */
static void score_latency(score_setup *s, const uint32_t *tokens, size_t n, int n_calls,
                          uint32_t want_blocks, double *p50, double *p99)
{
    static double lat[MAX_CALLS];
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_router_row rows[N_WORKERS];
    for (int c = 0; c < n_calls; c++) {
        size_t n_rows = 0;
        double t0 = now();
        int rc = kvp_router_score(s->r, &ns, tokens, n, rows, N_WORKERS, &n_rows);
        lat[c] = (now() - t0) * 1e6;
        if (rc != KVP_OK)
            die("kvp_router_score", rc);
        uint32_t best = 0;
        for (size_t i = 0; i < n_rows; i++)
            best = rows[i].n_blocks > best ? rows[i].n_blocks : best;
        if (best != want_blocks) {
            fprintf(stderr, "bench_router: best run %u, expected %u\n", best, want_blocks);
            exit(1);
        }
    }
    qsort(lat, (size_t)n_calls, sizeof lat[0], bench_cmp_double);
    *p50 = lat[n_calls / 2];
    *p99 = lat[(n_calls * 99) / 100];
}

/* Microseconds to hash tokens[0 .. n) alone (median of 9). */
static double hash_only(const score_setup *s, const uint32_t *tokens, size_t n)
{
    kvp_hasher *hs = NULL;
    if (kvp_hasher_new(&s->hash, &hs) != KVP_OK)
        die("kvp_hasher_new", KVP_EINVAL);
    uint64_t *k = malloc((n / BLOCK + 1) * sizeof *k);
    double v[9];
    for (int i = 0; i < 9; i++) {
        double t0 = now();
        keys_of(hs, tokens, n, k);
        v[i] = (now() - t0) * 1e6;
    }
    free(k);
    kvp_hasher_free(hs);
    return bench_median(v, 9);
}

/* ---------------------------------------------------------------- (c) concurrency */

typedef struct writer {
    kvp_router *r;
    const uint32_t *ids;
    atomic_bool stop;
    atomic_ullong n_events; /* events applied */
    uint64_t seq[N_WORKERS], last[N_WORKERS], rng;
    uint32_t first, count; /* the workers it feeds: first .. first + count - 1 */
    bool many;             /* MANY batches per kvp_router_apply_many call */
} writer;

#define MANY 32 /* batches per kvp_router_apply_many call in (c) */

/* Store a fresh block and remove the worker's previous one, until told to stop; one batch
 * per kvp_router_apply call, or MANY per kvp_router_apply_many when wr->many. */
static void *writer_main(void *arg)
{
    writer *wr = arg;
    uint32_t tok[BLOCK] = {0};
    uint64_t fresh[MANY];
    kvp_kv_event ev[MANY][2];
    kvp_kv_batch b[MANY];
    kvp_router_item items[MANY];
    size_t per_call = wr->many ? MANY : 1;
    for (uint32_t i = 0; !atomic_load_explicit(&wr->stop, memory_order_relaxed);) {
        for (size_t j = 0; j < per_call; j++, i++) {
            uint32_t w = wr->first + i % wr->count;
            fresh[j] = rnd(&wr->rng);
            ev[j][0] = stored(&fresh[j], 1, tok);
            ev[j][1] = stored(&wr->last[w], 1, tok);
            ev[j][1].type = KVP_EVENT_REMOVED;
            b[j] = (kvp_kv_batch){1.0, ev[j], 2, false, 0};
            items[j] = (kvp_router_item){wr->ids[w], wr->seq[w]++, &b[j], 0, {0}};
            wr->last[w] = fresh[j];
        }
        int rc = kvp_router_apply_many(wr->r, items, per_call);
        if (rc != KVP_OK || items[0].res.status != KVP_ROUTER_APPLIED)
            die("kvp_router_apply_many", rc);
        atomic_fetch_add_explicit(&wr->n_events, 2 * per_call, memory_order_relaxed);
    }
    return NULL;
}

static void writer_init(writer *wr, score_setup *s)
{
    memset(wr, 0, sizeof *wr);
    wr->r = s->r;
    wr->ids = s->ids;
    wr->rng = 7;
    wr->first = 0;
    wr->count = N_WORKERS;
    atomic_init(&wr->stop, false);
    atomic_init(&wr->n_events, 0);
    for (int w = 0; w < N_WORKERS; w++) {
        kvp_router_worker_stats ws;
        if (kvp_router_worker_stats_get(s->r, s->ids[w], &ws) != KVP_OK)
            die("kvp_router_worker_stats_get", KVP_EINVAL);
        wr->seq[w] = ws.expected;
    }
}

/* Events per second of n_writers writers on disjoint halves of the workers, over about
 * 0.3 s. */
static double writers_alone(score_setup *s, int n_writers, bool many)
{
    static writer wr[2];
    pthread_t t[2];
    double t0 = now();
    for (int i = 0; i < n_writers; i++) {
        writer_init(&wr[i], s);
        wr[i].count = N_WORKERS / (uint32_t)n_writers;
        wr[i].first = (uint32_t)i * wr[i].count;
        wr[i].rng = 7 + (uint64_t)i;
        wr[i].many = many;
        pthread_create(&t[i], NULL, writer_main, &wr[i]);
    }
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    uint64_t n = 0;
    for (int i = 0; i < n_writers; i++)
        atomic_store(&wr[i].stop, true);
    for (int i = 0; i < n_writers; i++) {
        pthread_join(t[i], NULL);
        n += atomic_load(&wr[i].n_events);
    }
    return (double)n / (now() - t0);
}

static atomic_bool spin_stop;

/* Burns a core without touching the router: the control for core sharing. */
static void *spin_main(void *arg)
{
    volatile uint64_t x = (uint64_t)(uintptr_t)arg;
    while (!atomic_load_explicit(&spin_stop, memory_order_relaxed))
        x = x * 6364136223846793005u + 1;
    return NULL;
}

/* Events per second of one writer while another thread only spins. */
static double writer_with_spinner(score_setup *s)
{
    pthread_t t;
    atomic_store(&spin_stop, false);
    pthread_create(&t, NULL, spin_main, NULL);
    double rate = writers_alone(s, 1, false);
    atomic_store(&spin_stop, true);
    pthread_join(t, NULL);
    return rate;
}

/* The 8k score's p50/p99 (*p50, *p99) while one writer runs; returns its events/s. */
static double score_with_writer(score_setup *s, bool many, double *p50, double *p99)
{
    const uint32_t *hit = s->tokens + (size_t)5 * LONG_TOKENS;
    writer wr;
    writer_init(&wr, s);
    wr.many = many;
    pthread_t t;
    pthread_create(&t, NULL, writer_main, &wr);
    double t0 = now();
    score_latency(s, hit, SHORT_TOKENS, MAX_CALLS, SHORT_TOKENS / BLOCK, p50, p99);
    double dt = now() - t0;
    uint64_t n = atomic_load(&wr.n_events);
    atomic_store(&wr.stop, true);
    pthread_join(t, NULL);
    return (double)n / dt;
}

static void bench_concurrent(score_setup *s)
{
    const uint32_t *hit = s->tokens + (size_t)5 * LONG_TOKENS;
    double a50[16], a99[16], b50[16], b99[16], c50[16], c99[16];
    double wa[16], wb[16], w2[16], ws[16], ma[16], mb[16], m2[16];
    for (int i = 0; i < runs; i++) {
        score_latency(s, hit, SHORT_TOKENS, MAX_CALLS, SHORT_TOKENS / BLOCK, &a50[i], &a99[i]);
        wa[i] = writers_alone(s, 1, false);
        w2[i] = writers_alone(s, 2, false);
        ws[i] = writer_with_spinner(s);
        wb[i] = score_with_writer(s, false, &b50[i], &b99[i]);
        ma[i] = writers_alone(s, 1, true);
        m2[i] = writers_alone(s, 2, true);
        mb[i] = score_with_writer(s, true, &c50[i], &c99[i]);
    }
    double sa50 = bench_median(a50, runs), sa99 = bench_median(a99, runs);
    double sb50 = bench_median(b50, runs), sb99 = bench_median(b99, runs);
    double sc50 = bench_median(c50, runs), sc99 = bench_median(c99, runs);
    double mwa = bench_median(wa, runs), mwb = bench_median(wb, runs);
    double mw2 = bench_median(w2, runs), mws = bench_median(ws, runs);
    double mma = bench_median(ma, runs), mmb = bench_median(mb, runs);
    double mm2 = bench_median(m2, runs);
    printf("(c) event threads (store 1 + remove 1 per batch) and a scoring thread (8k prompt)\n");
    printf("    score alone                         p50 %7.1f us  p99 %7.1f us\n", sa50, sa99);
    printf("    score with a writer (apply)         p50 %7.1f us  p99 %7.1f us  (x%.2f, x%.2f)\n",
           sb50, sb99, sb50 / sa50, sb99 / sa99);
    printf("    score with a writer (apply_many %d) p50 %7.1f us  p99 %7.1f us  (x%.2f, x%.2f)\n",
           MANY, sc50, sc99, sc50 / sa50, sc99 / sa99);
    printf("    events/s            apply        apply_many %d\n", MANY);
    printf("    one writer      %10.0f      %10.0f\n", mwa, mma);
    printf("    with the scorer %10.0f x%.2f %10.0f x%.2f\n", mwb, mwb / mwa, mmb, mmb / mma);
    printf("    two writers     %10.0f x%.2f %10.0f x%.2f  (disjoint workers, one lock)\n", mw2,
           mw2 / mwa, mm2, mm2 / mma);
    printf("    with a spinning thread, no lock (core-sharing control) %10.0f x%.2f\n", mws,
           mws / mwa);
}

static void bench_score(int profile)
{
    score_setup s;
    double t0 = now();
    score_setup_init(&s, profile);
    double setup = now() - t0;
    const uint32_t *hit = s.tokens + (size_t)5 * LONG_TOKENS;
    double p50s[3][16], p99s[3][16];
    int calls_long = profile == KVP_HASH_VLLM_SHA256 ? 100 : 300;
    calls_long = calls_long < calls_b ? calls_long : calls_b;
    for (int i = 0; i < runs; i++) {
        score_latency(&s, hit, SHORT_TOKENS, calls_b, SHORT_TOKENS / BLOCK, &p50s[0][i],
                      &p99s[0][i]);
        score_latency(&s, hit, LONG_TOKENS, calls_long, LONG_BLOCKS, &p50s[1][i], &p99s[1][i]);
        score_latency(&s, s.miss, LONG_TOKENS, calls_b, 0, &p50s[2][i], &p99s[2][i]);
    }
    printf("(b) score, %s, 64 workers, %llu blocks indexed, %.2f holders/block (setup %.1f s; "
           "median of %d runs)\n",
           kvp_hash_profile_name(profile), (unsigned long long)s.stats.n_blocks,
           (double)s.stats.n_holders / (double)s.stats.n_blocks, setup, runs);
    static const char *names[3] = {"8k tokens, 512 blocks cached  ", "128k tokens, 8192 cached    ",
                                   "128k tokens, nothing cached  "};
    double hash_s = hash_only(&s, hit, SHORT_TOKENS), hash_l = hash_only(&s, hit, LONG_TOKENS);
    double hash_m = hash_only(&s, s.miss, 32 * BLOCK);
    double hashes[3] = {hash_s, hash_l, hash_m};
    for (int c = 0; c < 3; c++)
        printf("    %s p50 %9.1f us  p99 %9.1f us   (hashing alone %8.1f us)\n", names[c],
               bench_median(p50s[c], runs), bench_median(p99s[c], runs), hashes[c]);
    printf("(d) memory at this state: %.2f bytes per (block, worker): %llu bytes for %llu pairs "
           "(index %llu B, table %llu slots)\n",
           s.stats.bytes_per_holder, (unsigned long long)s.stats.total_bytes,
           (unsigned long long)s.stats.n_holders, (unsigned long long)s.stats.index_bytes,
           (unsigned long long)s.stats.n_slots);
    kvp_router_token_stats ts;
    if (index_by == KVP_ROUTER_INDEX_TOKENS &&
        kvp_router_token_stats_get(s.r, KVP_ROUTER_ALL_WORKERS, &ts) == KVP_OK)
        printf("    token maps: %llu entries, %llu bytes: %.2f bytes per entry, %.2f per (block, "
               "worker) without them\n",
               (unsigned long long)ts.n_map_entries, (unsigned long long)ts.map_bytes,
               (double)ts.map_bytes / (double)ts.n_map_entries,
               (double)(s.stats.total_bytes - ts.map_bytes) / (double)s.stats.n_holders);
    if (profile == KVP_HASH_XXH3 && n_prompts == N_PROMPTS) {
        bench_concurrent(&s);
        /* Clearing a worker scans the table under the exclusive lock. */
        kvp_router_worker_stats ws;
        if (kvp_router_worker_stats_get(s.r, s.ids[5], &ws) != KVP_OK)
            die("kvp_router_worker_stats_get", KVP_EINVAL);
        double c0 = now();
        int rc = kvp_router_mark_stale(s.r, s.ids[5]);
        if (rc != KVP_OK)
            die("kvp_router_mark_stale", rc);
        printf("(e) clearing one worker (mark_stale, %llu of its blocks) at this state: %.2f ms\n",
               (unsigned long long)ws.n_blocks, (now() - c0) * 1e3);
    }
    score_setup_free(&s);
}

/* The value of option `name` ("--name=") in arg, or NULL. */
static const char *opt_value(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 ? arg + n : NULL;
}

/* An integer lo..hi, or exit with a usage message. */
static int int_in(const char *s, int lo, int hi)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!end || *end != '\0' || end == s || v < lo || v > hi) {
        fprintf(stderr, "bench_router: '%s' is not an integer %d..%d\n", s, lo, hi);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv)
{
    int only = -1; /* --score: the one profile, else all of (a)-(e) */
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = opt_value(argv[i], "--score=")) != NULL) {
            if (kvp_hash_profile_parse(v, &only) != KVP_OK) {
                fprintf(stderr, "bench_router: unknown profile '%s'\n", v);
                return 2;
            }
        } else if ((v = opt_value(argv[i], "--prompts=")) != NULL) {
            n_prompts = int_in(v, 6, N_PROMPTS);
        } else if ((v = opt_value(argv[i], "--calls=")) != NULL) {
            calls_b = int_in(v, 1, MAX_CALLS);
        } else if ((v = opt_value(argv[i], "--index=")) != NULL) {
            if (strcmp(v, "tokens") != 0 && strcmp(v, "engine-hash") != 0) {
                fprintf(stderr, "bench_router: --index: '%s' is not tokens or engine-hash\n", v);
                return 2;
            }
            index_by =
                strcmp(v, "tokens") == 0 ? KVP_ROUTER_INDEX_TOKENS : KVP_ROUTER_INDEX_ENGINE_HASH;
        } else {
            runs = int_in(argv[i], 1, 16);
        }
    }
    printf("index by %s\n", index_by == KVP_ROUTER_INDEX_TOKENS ? "tokens" : "engine hash");
    if (only >= 0) {
        bench_score(only);
        return 0;
    }
    bench_apply();
    bench_score(KVP_HASH_XXH3);
    bench_score(KVP_HASH_VLLM_XXHASH);
    bench_score(KVP_HASH_VLLM_SHA256);
    return 0;
}
