/*
 * bench_threads.c - one cache shared by threads: how lookups scale with a concurrent
 * writer, and what mutations cost when threads contend for the lock.
 *
 *   (t1) lookups/s on one cache: R reader threads (R = 1, 2, 4) each looking up 2048-token
 *        prompts (one of 256 shared 1024-token heads + a random tail, so about half of
 *        every prompt hits), while one writer thread runs kvp_access on prompts of the
 *        same shape without pause. Lookups take the shared lock and run in parallel; the
 *        writer's accesses take it exclusively.
 *   (t2) mutations/s: W threads (W = 1, 2, 4) each running acquire + commit + release of
 *        such prompts (every call exclusive).
 * Keys are hashed inside the calls (token forms). Each figure is the median of --reps runs
 * (default 5) of --seconds each (default 0.5). The machine's core count bounds what more
 * threads can give: on 2 cores, 4 readers cannot beat 2.
 *
 * Usage: bench_threads [--reps N] [--seconds S]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h> /* sysconf */

#include "benchutil.h"
#include "kvprefix.h"

#define BS       16
#define N_HEADS  256
#define HEAD_LEN 1024
#define LEN      2048
#define POOL     262144

typedef struct shared {
    kvp_cache *cache;       /* the one cache */
    uint32_t *heads;        /* N_HEADS * HEAD_LEN tokens */
    atomic_bool stop;       /* set when the run's time is up */
    atomic_ullong n_done;   /* measured operations (readers or mutators) */
    atomic_ullong n_writer; /* the writer's accesses (t1) */
} shared;

typedef struct thr {
    shared *sh;   /* what all threads share */
    uint64_t rng; /* xorshift state */
    uint64_t id;  /* next request id (t2), thread number in the high bits */
    int role;     /* 0 reader, 1 writer (t1), 2 mutator (t2) */
} thr;

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void make_prompt(thr *t, uint32_t *p)
{
    const uint32_t *head = t->sh->heads + (size_t)(rnd(&t->rng) % N_HEADS) * HEAD_LEN;
    memcpy(p, head, HEAD_LEN * sizeof *p);
    for (size_t i = HEAD_LEN; i < LEN; i++)
        p[i] = (uint32_t)(rnd(&t->rng) % 128000);
}

static void must(int rc, const char *what)
{
    if (rc != KVP_OK) {
        fprintf(stderr, "bench_threads: %s: %s\n", what, kvp_strerror(rc));
        exit(1);
    }
}

static void *run_thread(void *arg)
{
    thr *t = arg;
    shared *sh = t->sh;
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = kvp_field_str("bench");
    uint32_t p[LEN];
    kvp_match m;
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        make_prompt(t, p);
        if (t->role == 0) {
            must(kvp_lookup(sh->cache, &ns, p, LEN, NULL, 0, &m), "kvp_lookup");
            atomic_fetch_add_explicit(&sh->n_done, 1, memory_order_relaxed);
        } else if (t->role == 1) {
            must(kvp_access(sh->cache, &ns, p, LEN, &m), "kvp_access");
            atomic_fetch_add_explicit(&sh->n_writer, 1, memory_order_relaxed);
        } else {
            uint64_t id = t->id++;
            must(kvp_acquire(sh->cache, id, &ns, p, LEN, 0, &m), "kvp_acquire");
            must(kvp_commit(sh->cache, id, p, LEN, NULL), "kvp_commit");
            must(kvp_release(sh->cache, id), "kvp_release");
            atomic_fetch_add_explicit(&sh->n_done, 1, memory_order_relaxed);
        }
    }
    return NULL;
}

/* One timed run: n threads of `role` (plus a writer when role is 0). Returns ops/s; the
 * writer's accesses/s go to *writer_rate. */
static double run_once(shared *sh, int role, int n, double seconds, double *writer_rate)
{
    thr ts[9];
    pthread_t th[9];
    int total = n + (role == 0);
    atomic_store(&sh->stop, false);
    atomic_store(&sh->n_done, 0);
    atomic_store(&sh->n_writer, 0);
    for (int i = 0; i < total; i++) {
        ts[i] =
            (thr){sh, 0x9e3779b97f4a7c15u * (uint64_t)(i + 7), (uint64_t)i << 40, i < n ? role : 1};
        if (pthread_create(&th[i], NULL, run_thread, &ts[i]) != 0)
            must(KVP_ENOMEM, "pthread_create");
    }
    double t0 = now_s();
    struct timespec nap = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&nap, NULL);
    atomic_store(&sh->stop, true);
    for (int i = 0; i < total; i++)
        pthread_join(th[i], NULL);
    double dt = now_s() - t0;
    *writer_rate = (double)atomic_load(&sh->n_writer) / dt;
    return (double)atomic_load(&sh->n_done) / dt;
}

static void row(shared *sh, int role, int n, int reps, double seconds)
{
    double ops[32], wr[32];
    for (int r = 0; r < reps; r++)
        ops[r] = run_once(sh, role, n, seconds, &wr[r]);
    double m = bench_median(ops, reps), w = bench_median(wr, reps);
    if (role == 0)
        printf("  %d reader%s + 1 writer   %12.0f lookups/s   %10.0f writer accesses/s\n", n,
               n > 1 ? "s" : " ", m, w);
    else
        printf("  %d mutator%s              %12.0f requests/s (acquire+commit+release)\n", n,
               n > 1 ? "s" : " ", m);
}

int main(int argc, char **argv)
{
    int reps = 5;
    double seconds = 0.5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[i + 1]);
    }
    if (reps < 1 || reps > 32 || seconds <= 0) {
        fprintf(stderr, "usage: bench_threads [--reps 1..32] [--seconds S]\n");
        return 2;
    }
    shared sh;
    memset(&sh, 0, sizeof sh);
    sh.heads = malloc((size_t)N_HEADS * HEAD_LEN * sizeof *sh.heads);
    uint64_t s = 42;
    for (size_t i = 0; i < (size_t)N_HEADS * HEAD_LEN; i++)
        sh.heads[i] = (uint32_t)(rnd(&s) % 128000);
    kvp_config cfg;
    kvp_config_init(&cfg);
    cfg.n_blocks = POOL;
    cfg.block_size = BS;
    must(kvp_cache_new(&cfg, &sh.cache), "kvp_cache_new");
    printf("bench_threads: one cache of %d blocks of %d tokens, %d-token prompts (half a shared "
           "head), %ld online cores, medians of %d x %.2f s\n",
           POOL, BS, LEN, sysconf(_SC_NPROCESSORS_ONLN), reps, seconds);
    printf("(t1) lookups with a concurrent writer\n");
    for (int n = 1; n <= 4; n *= 2)
        row(&sh, 0, n, reps, seconds);
    printf("(t2) mutations\n");
    for (int n = 1; n <= 4; n *= 2)
        row(&sh, 2, n, reps, seconds);
    must(kvp_cache_check(sh.cache), "kvp_cache_check");
    kvp_cache_free(sh.cache);
    free(sh.heads);
    return 0;
}
