/*
 * bench_router_redis.c - the router index in memory against the same index on Redis
 * (kvp_router_config.redis), in one run on one machine: events applied per second, score
 * latency p50/p99 for 8k- and 128k-token prompts against 64 workers with 1M blocks indexed,
 * round trips per score, Redis memory per (block, worker), and an llm-d-style lookup (one
 * pipelined HKEYS per block) on the same Redis data for comparison.
 *
 * Workload (bench_router's (b), with random 64-bit block hashes instead of hashed tokens so
 * that the index alone is timed): 128 prompts of 8192 blocks (128k tokens of 16); prompt p
 * is stored whole on worker p % 64 and its first half on worker (p + 17) % 64, in batches of
 * one BlockStored of 64 blocks: 1,048,576 blocks, 1,572,864 (block, worker) pairs. The same
 * batches, in the same order, go to an in-memory router and to a Redis router (which applies
 * each batch to its local view and to Redis: its rate is the sum of both).
 *
 *   (a) apply: blocks and batches per second while filling, per backend.
 *   (b) score (kvp_router_score_hashes): the first 512 blocks of a stored prompt (8k
 *       tokens, cached on 2 workers), a whole stored prompt (128k tokens, 8192 blocks), a
 *       prompt nobody holds. p50/p99 over the calls of a run, median over runs; round trips
 *       per score from kvp_router_stats.n_redis_calls. Both backends' rows are compared on
 *       every call (a difference exits 1).
 *   (c) the same prompts looked up the way llm-d's indexer does, on a copy of the same
 *       stores in its layout (one hash per block, field the pod, written by one HSET per
 *       block pipelined per batch): one HKEYS per block key, all pipelined (one round trip,
 *       one reply per block), the longest consecutive prefix per holder computed here.
 *   (d) Redis memory: INFO memory used_memory after the fill minus before, per (block,
 *       worker) pair, for the router's schema and for the llm-d-style copy, against the
 *       in-memory index's bytes per pair.
 *   (e) Redis stopped (SIGSTOP, a hang rather than a refusal): the first score's latency
 *       (it waits for the timeout) and the next ones' (answered from the local view).
 *
 * Redis: a redis-server this program starts on a free loopback port (no persistence) and
 * stops, or the one named by --redis URL (then (e) is skipped). TCP on loopback: a router
 * on another host pays the network's round trip on top of these figures.
 * Usage: bench_router_redis [--runs N] [--prompts N] [--redis URL]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BENCH_PROG "bench_router_redis"
#include "benchutil.h"
#include "kvprefix_events.h"

#define N_WORKERS    64
#define BLOCK        16
#define LONG_BLOCKS  8192
#define SHORT_BLOCKS 512
#define PER_BATCH    64
#define MAX_CALLS    400

extern char **environ;

static int runs = 5;
static int n_prompts = 128;
static const char *redis_url = NULL;
static pid_t server_pid = 0;
static char prefix[64];  /* the Redis router's key prefix */
static char lprefix[80]; /* the llm-d-style copy's */

static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------- the Redis server */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror(BENCH_PROG ": free port");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* Start redis-server on a free loopback port in a fresh temporary directory; wait until it
 * answers. Sets redis_url. */
static void server_start(void)
{
    static char url[64], port_s[16], dir[] = "/tmp/bench-redis-XXXXXX";
    if (!mkdtemp(dir)) {
        perror(BENCH_PROG ": mkdtemp");
        exit(1);
    }
    int port = free_port();
    snprintf(port_s, sizeof port_s, "%d", port);
    /* posix_spawnp takes char *const argv[] but does not write the strings. */
    static const char *const args[] = {
        "redis-server", "--port", NULL,    "--bind", "127.0.0.1", "--save",    "",
        "--appendonly", "no",     "--dir", NULL,     "--logfile", "/dev/null", NULL};
    char *argv[sizeof args / sizeof args[0]];
    memcpy(argv, args, sizeof args);
    argv[2] = port_s;
    argv[10] = dir;
    if (posix_spawnp(&server_pid, "redis-server", NULL, NULL, argv, environ) != 0) {
        fprintf(stderr, BENCH_PROG ": cannot start redis-server (apt-get install redis-server, "
                                   "or pass --redis URL)\n");
        exit(1);
    }
    for (int i = 0; i < 200; i++) {
        struct timeval tv = {0, 100000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        redisReply *rep = c && !c->err ? redisCommand(c, "PING") : NULL;
        bool ok = rep && rep->type == REDIS_REPLY_STATUS;
        freeReplyObject(rep);
        redisFree(c);
        if (ok) {
            snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
            redis_url = url;
            return;
        }
        usleep(50000);
    }
    fprintf(stderr, BENCH_PROG ": redis-server did not answer on port %d\n", port);
    exit(1);
}

static void server_stop(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGCONT);
        kill(server_pid, SIGTERM);
        waitpid(server_pid, NULL, 0);
        server_pid = 0;
    }
}

/* A direct connection (INFO, the llm-d-style lookup) to redis_url's host:port. */
static redisContext *direct(void)
{
    char host[64] = "127.0.0.1";
    int port = 6379;
    const char *hp = strncmp(redis_url, "redis://", 8) == 0 ? redis_url + 8 : redis_url;
    if (sscanf(hp, "%63[^:]:%d", host, &port) < 1) {
        fprintf(stderr, BENCH_PROG ": cannot read host:port from %s\n", redis_url);
        exit(1);
    }
    redisContext *c = redisConnect(host, port);
    if (!c || c->err) {
        fprintf(stderr, BENCH_PROG ": connect %s: %s\n", redis_url, c ? c->errstr : "no memory");
        exit(1);
    }
    return c;
}

static uint64_t used_memory(redisContext *c)
{
    redisReply *rep = redisCommand(c, "INFO memory");
    const char *p =
        rep && rep->type == REDIS_REPLY_STRING ? strstr(rep->str, "used_memory:") : NULL;
    uint64_t v = p ? strtoull(p + 12, NULL, 10) : 0;
    freeReplyObject(rep);
    return v;
}

/* ---------------------------------------------------------------- routers and the fill */

typedef struct setup {
    kvp_router *mem, *red;      /* in-memory; Redis-backed */
    uint32_t ids[2][N_WORKERS]; /* worker ids in each */
    uint64_t *keys;             /* n_prompts * LONG_BLOCKS block hashes */
    uint64_t miss[LONG_BLOCKS]; /* a prompt nobody holds */
    double apply_s[2];          /* seconds spent applying, per backend */
    double llmd_s;              /* seconds spent writing the llm-d-style copy */
    redisContext *c;            /* direct connection (INFO, the llm-d-style copy) */
    uint64_t n_batches, n_blocks_applied;
} setup;

static kvp_router *router_new(bool with_redis, uint32_t *ids)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.hash.hash_profile = KVP_HASH_XXH3;
    cfg.hash.block_size = BLOCK;
    if (with_redis) {
        cfg.redis.url = redis_url;
        cfg.redis.key_prefix = prefix;
        cfg.redis.timeout_ms = 500;
    }
    kvp_router *r = NULL;
    check(kvp_router_new(&cfg, &r), "kvp_router_new");
    char name[32];
    for (int w = 0; w < N_WORKERS; w++) {
        snprintf(name, sizeof name, "pod-%02d", w);
        check(kvp_router_worker_get(r, name, 0, &ids[w]), "kvp_router_worker_get");
    }
    return r;
}

static void apply_timed(setup *s, int which, uint32_t w, uint64_t seq, const kvp_kv_batch *b)
{
    kvp_router *r = which ? s->red : s->mem;
    kvp_router_apply_result res;
    uint64_t t0 = now_ns();
    int rc = kvp_router_apply(r, s->ids[which][w], seq, b, &res);
    s->apply_s[which] += (double)(now_ns() - t0) * 1e-9;
    check(rc, "kvp_router_apply");
    if (res.status != KVP_ROUTER_APPLIED) {
        fprintf(stderr, BENCH_PROG ": apply status %d on backend %d\n", res.status, which);
        exit(1);
    }
}

/* The block key of the llm-d-style copy: lprefix, ':', 8 bytes big-endian; returns its
 * length. */
static size_t llmd_key(char *key, uint64_t h)
{
    size_t plen = strlen(lprefix);
    memcpy(key, lprefix, plen);
    key[plen] = ':';
    for (int b = 0; b < 8; b++)
        key[plen + 1 + (size_t)b] = (char)(h >> (56 - 8 * b));
    return plen + 9;
}

/* What llm-d's indexer writes for a BlockStored: one HSET per block (field: the pod, value:
 * its tier), pipelined, one round trip per batch. */
static void llmd_store(setup *s, uint32_t w, const uint64_t *h, size_t n)
{
    char key[96], pod[16];
    snprintf(pod, sizeof pod, "pod-%04u", w); /* 8 bytes, like a gid */
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < n; i++)
        redisAppendCommand(s->c, "HSET %b %s gpu", key, llmd_key(key, h[i]), pod);
    for (size_t i = 0; i < n; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(s->c, (void **)&rep) != REDIS_OK || rep->type != REDIS_REPLY_INTEGER) {
            fprintf(stderr, BENCH_PROG ": HSET failed\n");
            exit(1);
        }
        freeReplyObject(rep);
    }
    s->llmd_s += (double)(now_ns() - t0) * 1e-9;
}

static void fill(setup *s)
{
    static uint32_t zeros[PER_BATCH * BLOCK];
    uint64_t seq[N_WORKERS] = {0};
    for (int p = 0; p < n_prompts; p++) {
        const uint64_t *k = s->keys + (size_t)p * LONG_BLOCKS;
        uint32_t a = (uint32_t)p % N_WORKERS, b = (uint32_t)(p + 17) % N_WORKERS;
        for (size_t i = 0; i < LONG_BLOCKS; i += PER_BATCH) {
            kvp_kv_event e;
            memset(&e, 0, sizeof e);
            e.type = KVP_EVENT_STORED;
            e.hashes = k + i;
            e.n_hashes = PER_BATCH;
            e.tokens = zeros;
            e.n_tokens = PER_BATCH * BLOCK;
            e.block_size = BLOCK;
            e.medium = "GPU";
            e.group_idx = -1;
            kvp_kv_batch bt = {1.0, &e, 1, false, 0};
            uint32_t ws[2] = {a, b};
            for (int j = 0; j < (i < LONG_BLOCKS / 2 ? 2 : 1); j++) {
                for (int which = 0; which < 2; which++)
                    apply_timed(s, which, ws[j], seq[ws[j]], &bt);
                seq[ws[j]]++;
                s->n_batches++;
                s->n_blocks_applied += PER_BATCH;
            }
        }
    }
}

/* The same stores as fill, in llm-d's layout. */
static void llmd_fill(setup *s)
{
    for (int p = 0; p < n_prompts; p++) {
        const uint64_t *k = s->keys + (size_t)p * LONG_BLOCKS;
        uint32_t a = (uint32_t)p % N_WORKERS, b = (uint32_t)(p + 17) % N_WORKERS;
        for (size_t i = 0; i < LONG_BLOCKS; i += PER_BATCH) {
            llmd_store(s, a, k + i, PER_BATCH);
            if (i < LONG_BLOCKS / 2)
                llmd_store(s, b, k + i, PER_BATCH);
        }
    }
}

/* ---------------------------------------------------------------- (b) score */

typedef struct lat {
    double p50, p99;      /* microseconds */
    double round_trips;   /* per call (Redis router) */
    uint64_t best_blocks; /* longest run found */
} lat;

static uint64_t redis_calls(kvp_router *r)
{
    kvp_router_stats st;
    check(kvp_router_stats_get(r, &st), "kvp_router_stats_get");
    return st.n_redis_calls;
}

static double pct(double *v, int n, int p)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[(n * p) / 100 < n ? (n * p) / 100 : n - 1];
}

/* n_calls scores of keys[0 .. n) on backend `which`; the other backend's rows must equal. */
static lat score_run(setup *s, int which, const uint64_t *keys, size_t n, int n_calls)
{
    static double t[MAX_CALLS];
    kvp_router_row rows[N_WORKERS], other[N_WORKERS];
    kvp_router *r = which ? s->red : s->mem;
    size_t n_rows = 0, n_other = 0;
    check(kvp_router_score_hashes(which ? s->mem : s->red, keys, n, other, N_WORKERS, &n_other),
          "kvp_router_score_hashes");
    uint64_t calls0 = redis_calls(s->red);
    lat out = {0};
    for (int c = 0; c < n_calls; c++) {
        uint64_t t0 = now_ns();
        int rc = kvp_router_score_hashes(r, keys, n, rows, N_WORKERS, &n_rows);
        t[c] = (double)(now_ns() - t0) * 1e-3;
        check(rc, "kvp_router_score_hashes");
        for (size_t i = 0; i < n_rows; i++) {
            if (n_rows != n_other || rows[i].n_blocks != other[i].n_blocks ||
                rows[i].state != other[i].state) {
                fprintf(stderr, BENCH_PROG ": row %zu differs between the backends\n", i);
                exit(1);
            }
            out.best_blocks =
                rows[i].n_blocks > out.best_blocks ? rows[i].n_blocks : out.best_blocks;
        }
    }
    out.round_trips = (double)(redis_calls(s->red) - calls0) / n_calls;
    out.p50 = pct(t, n_calls, 50);
    out.p99 = pct(t, n_calls, 99);
    return out;
}

/* Server time per FCALL since the last CONFIG RESETSTAT (INFO commandstats), in us; 0 when
 * the server is not ours (resetting an operator's statistics is not this program's call). */
static double fcall_server_us(redisContext *c, bool reset)
{
    if (server_pid <= 0)
        return 0;
    redisReply *rep = redisCommand(c, reset ? "CONFIG RESETSTAT" : "INFO commandstats");
    const char *p = !reset && rep && rep->type == REDIS_REPLY_STRING
                        ? strstr(rep->str, "cmdstat_fcall:calls=")
                        : NULL;
    double calls = 0, usec = 0;
    if (p && sscanf(p, "cmdstat_fcall:calls=%lf,usec=%lf", &calls, &usec) != 2)
        calls = 0;
    freeReplyObject(rep);
    return calls > 0 ? usec / calls : 0;
}

/* ---------------------------------------------------------------- (c) llm-d-style lookup */

/* Keep in alive[0 .. *n_alive) the holders (8-byte ids) that are also in reply rep (at
 * block 0: take them all). */
static void intersect(const redisReply *rep, bool first, char (*alive)[8], size_t *n_alive)
{
    size_t keep = 0;
    if (first) {
        for (size_t e = 0; e < rep->elements && keep < N_WORKERS; e++)
            if (rep->element[e]->len == 8)
                memcpy(alive[keep++], rep->element[e]->str, 8);
    } else {
        for (size_t a = 0; a < *n_alive; a++) {
            bool in = false;
            for (size_t e = 0; !in && e < rep->elements; e++)
                in = rep->element[e]->len == 8 && memcmp(rep->element[e]->str, alive[a], 8) == 0;
            if (in)
                memmove(alive[keep++], alive[a], 8);
        }
    }
    *n_alive = keep;
}

/* One HKEYS per block, all pipelined (one round trip, n replies); the longest consecutive
 * run from block 0 over the holders, computed here. */
static lat llmd_run(redisContext *c, const uint64_t *keys, size_t n, int n_calls)
{
    static double t[MAX_CALLS];
    lat out = {0};
    char key[96];
    for (int call = 0; call < n_calls; call++) {
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < n; i++)
            redisAppendCommand(c, "HKEYS %b", key, llmd_key(key, keys[i]));
        char alive[N_WORKERS][8];
        size_t n_alive = 0, run = 0;
        for (size_t i = 0; i < n; i++) {
            redisReply *rep = NULL;
            if (redisGetReply(c, (void **)&rep) != REDIS_OK || rep->type != REDIS_REPLY_ARRAY) {
                fprintf(stderr, BENCH_PROG ": HKEYS failed\n");
                exit(1);
            }
            if (i == 0 || n_alive)
                intersect(rep, i == 0, alive, &n_alive);
            run += n_alive ? 1 : 0;
            freeReplyObject(rep);
        }
        t[call] = (double)(now_ns() - t0) * 1e-3;
        out.best_blocks = run;
    }
    out.round_trips = 1;
    out.p50 = pct(t, n_calls, 50);
    out.p99 = pct(t, n_calls, 99);
    return out;
}

/* ---------------------------------------------------------------- (e) Redis hung */

static void hung(setup *s, const uint64_t *keys)
{
    kvp_router_row rows[N_WORKERS];
    size_t n_rows = 0;
    double t[MAX_CALLS];
    kill(server_pid, SIGSTOP);
    for (int c = 0; c < 100; c++) {
        uint64_t t0 = now_ns();
        check(kvp_router_score_hashes(s->red, keys, SHORT_BLOCKS, rows, N_WORKERS, &n_rows),
              "kvp_router_score_hashes (Redis stopped)");
        t[c] = (double)(now_ns() - t0) * 1e-3;
    }
    kill(server_pid, SIGCONT);
    kvp_router_stats st;
    check(kvp_router_stats_get(s->red, &st), "kvp_router_stats_get");
    double first = t[0];
    printf("(e) Redis stopped (SIGSTOP), 8k prompt: first score %.0f us (waits for the 500 ms "
           "timeout), the next 99 p50 %.1f us (local view); fallback scores %llu, errors %llu\n",
           first, pct(t + 1, 99, 50), (unsigned long long)st.n_fallback_scores,
           (unsigned long long)st.n_redis_errors);
}

/* Delete this run's keys (an external Redis). */
static void drop_keys(redisContext *c, const char *pfx)
{
    char cursor[32] = "0", pat[96];
    snprintf(pat, sizeof pat, "%s:*", pfx);
    do {
        redisReply *rep = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pat);
        if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
            freeReplyObject(rep);
            return;
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        for (size_t i = 0; i < rep->element[1]->elements; i++)
            freeReplyObject(redisCommand(c, "UNLINK %b", rep->element[1]->element[i]->str,
                                         rep->element[1]->element[i]->len));
        freeReplyObject(rep);
    } while (strcmp(cursor, "0") != 0);
}

/* ---------------------------------------------------------------- main */

static void args(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--prompts") == 0)
            n_prompts = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--redis") == 0)
            redis_url = argv[++i];
        else {
            fprintf(stderr, "usage: " BENCH_PROG " [--runs N] [--prompts N] [--redis URL]\n");
            exit(2);
        }
    }
    if (runs < 1 || runs > 16 || n_prompts < 2 || n_prompts > 1024) {
        fprintf(stderr, BENCH_PROG ": --runs 1..16, --prompts 2..1024\n");
        exit(2);
    }
}

static void report_scores(setup *s, redisContext *c)
{
    const uint64_t *hit = s->keys + (size_t)(n_prompts / 2) * LONG_BLOCKS;
    const uint64_t *prompts[3] = {hit, hit, s->miss};
    size_t lens[3] = {SHORT_BLOCKS, LONG_BLOCKS, LONG_BLOCKS};
    uint64_t want[3] = {SHORT_BLOCKS, LONG_BLOCKS, 0};
    int calls[3] = {MAX_CALLS, 100, MAX_CALLS};
    static const char *names[3] = {"8k tokens, 512 blocks cached ", "128k tokens, 8192 cached   ",
                                   "128k tokens, nothing cached "};
    printf("(b) score p50 / p99 in us (median of %d runs; server: Redis's own time per score "
           "FCALL, from INFO commandstats); (c) llm-d-style pipelined HKEYS:\n",
           runs);
    printf("    %-28s %19s %19s %8s %7s %19s\n", "prompt", "in memory", "Redis", "server", "trips",
           "llm-d HKEYS");
    for (int p = 0; p < 3; p++) {
        double v[7][16], trips = 0;
        for (int i = 0; i < runs; i++) {
            lat m = score_run(s, 0, prompts[p], lens[p], calls[p]);
            (void)fcall_server_us(c, true);
            lat r = score_run(s, 1, prompts[p], lens[p], calls[p]);
            v[6][i] = fcall_server_us(c, false);
            lat l = llmd_run(c, prompts[p], lens[p], calls[p] / 4);
            if (m.best_blocks != want[p] || r.best_blocks != want[p] || l.best_blocks != want[p]) {
                fprintf(stderr, BENCH_PROG ": longest run %llu/%llu/%llu, expected %llu\n",
                        (unsigned long long)m.best_blocks, (unsigned long long)r.best_blocks,
                        (unsigned long long)l.best_blocks, (unsigned long long)want[p]);
                exit(1);
            }
            v[0][i] = m.p50, v[1][i] = m.p99, v[2][i] = r.p50, v[3][i] = r.p99;
            v[4][i] = l.p50, v[5][i] = l.p99;
            trips += r.round_trips / runs;
        }
        printf("    %-28s %8.1f / %8.1f %8.1f / %8.1f %8.1f %7.2f %8.1f / %8.1f\n", names[p],
               bench_median(v[0], runs), bench_median(v[1], runs), bench_median(v[2], runs),
               bench_median(v[3], runs), bench_median(v[6], runs), trips, bench_median(v[4], runs),
               bench_median(v[5], runs));
    }
}

int main(int argc, char **argv)
{
    args(argc, argv);
    bool own = redis_url == NULL;
    if (own) {
        server_start();
        atexit(server_stop);
    }
    snprintf(prefix, sizeof prefix, "bench%ld", (long)getpid());
    snprintf(lprefix, sizeof lprefix, "%s-llmd", prefix);
    static setup s;
    uint64_t seed = 42;
    s.keys = xmalloc((size_t)n_prompts * LONG_BLOCKS * sizeof *s.keys);
    for (size_t i = 0; i < (size_t)n_prompts * LONG_BLOCKS; i++)
        s.keys[i] = rnd(&seed);
    for (size_t i = 0; i < LONG_BLOCKS; i++)
        s.miss[i] = rnd(&seed);
    redisContext *c = direct();
    s.c = c;
    uint64_t m0 = used_memory(c);
    s.mem = router_new(false, s.ids[0]);
    s.red = router_new(true, s.ids[1]);
    fill(&s);
    uint64_t m1 = used_memory(c);
    llmd_fill(&s);
    uint64_t m2 = used_memory(c);
    kvp_router_stats st;
    check(kvp_router_stats_get(s.mem, &st), "kvp_router_stats_get");
    printf("%s build; %d workers, %llu blocks indexed, %llu (block, worker) pairs, Redis at %s\n",
           KVP_BENCH_BUILDTYPE, N_WORKERS, (unsigned long long)st.n_blocks,
           (unsigned long long)st.n_holders, redis_url);
    printf("(a) apply, %llu batches of one BlockStored of %d blocks, blocks/s (batches/s):\n"
           "    in memory %.0f (%.0f); Redis router (local view + one FCALL) %.0f (%.0f); "
           "llm-d-style pipelined HSETs %.0f (%.0f)\n",
           (unsigned long long)s.n_batches, PER_BATCH, (double)s.n_blocks_applied / s.apply_s[0],
           (double)s.n_batches / s.apply_s[0], (double)s.n_blocks_applied / s.apply_s[1],
           (double)s.n_batches / s.apply_s[1], (double)s.n_blocks_applied / s.llmd_s,
           (double)s.n_batches / s.llmd_s);
    report_scores(&s, c);
    printf("(d) memory per (block, worker): Redis, this schema %.1f bytes (used_memory +%llu); "
           "llm-d's layout %.1f bytes (+%llu); in memory %.1f bytes\n",
           (double)(m1 - m0) / (double)st.n_holders, (unsigned long long)(m1 - m0),
           (double)(m2 - m1) / (double)st.n_holders, (unsigned long long)(m2 - m1),
           st.bytes_per_holder);
    if (own)
        hung(&s, s.keys);
    else {
        drop_keys(c, prefix);
        drop_keys(c, lprefix);
    }
    redisFree(c);
    kvp_router_free(s.mem);
    kvp_router_free(s.red);
    free(s.keys);
    return 0;
}
