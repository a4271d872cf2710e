/*
 * test_router_redis.c - the router index's shared store on Redis (src/events/router_redis*.c),
 * run by tests/support/with_redis.py (KVP_TEST_REDIS_URL names a private redis-server).
 *
 * Two routers on one Redis return the same rows whichever applied; a batch one applied is
 * a DUPLICATE for the other, and a router that missed a batch follows the fleet; a score
 * is one round trip whatever the number of hash groups; key prefixes isolate fleets;
 * worker state expires (blocks stop counting, leftovers cleaned when the worker returns);
 * the library is reloaded after FUNCTION FLUSH. Failures, on a server of the test's own
 * (port of its own, so it can be stopped, killed and restarted): a stopped server (SIGSTOP)
 * times out and the local view answers within about 2 x timeout_ms; a killed one, then
 * restarted empty: lost workers counted, partial views, new blocks scored right, the
 * connection restored after retry_ms. A randomized run drives an in-memory router and a
 * Redis router with the same operations and compares every score. The same behavioural
 * suite as the in-memory router runs as test_router_redis (test_router.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>

#include "kvprefix_events.h"
#include "router.h"
#include "router_redis_ops.h"
#include "testutil.h"

#define BS 16u /* block size of every worker here */

/* The store's checker on r's prefix (a macro: failures point at the caller's line). */
#define STORE_CHECK(r)                                                                             \
    do {                                                                                           \
        const char *why_ = NULL;                                                                   \
        int rc_ = kvp__rr_check(r->store, &why_);                                                  \
        cr_assert_eq(rc_, KVP_OK, "store check: %s (%s)", kvp_strerror(rc_), why_ ? why_ : "");    \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static const char *env_or_fail(const char *name)
{
    const char *v = getenv(name);
    cr_assert(v, "%s is not set (run under tests/support/with_redis.py)", name);
    return v;
}

static kvp_router *router_on(const char *url, const char *prefix, uint32_t ttl_s,
                             uint32_t timeout_ms, uint32_t retry_ms)
{
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.table_seed = 7;
    cfg.redis.url = url;
    cfg.redis.key_prefix = prefix;
    cfg.redis.worker_ttl_s = ttl_s;
    cfg.redis.timeout_ms = timeout_ms;
    cfg.redis.retry_ms = retry_ms;
    kvp_router *r = NULL;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_OK);
    return r;
}

/* A router on the suite's Redis under prefix (made unique per test process). */
static kvp_router *shared_router(const char *prefix)
{
    char p[64];
    snprintf(p, sizeof p, "%s_%ld", prefix, (long)getpid());
    return router_on(env_or_fail("KVP_TEST_REDIS_URL"), p, 0, 5000, 1000);
}

static uint32_t worker(kvp_router *r, const char *name)
{
    uint32_t id = 0;
    cr_assert_eq(kvp_router_worker_get(r, name, 0, &id), KVP_OK);
    return id;
}

static kvp_router_stats stats_of(kvp_router *r)
{
    kvp_router_stats st;
    cr_assert_eq(kvp_router_stats_get(r, &st), KVP_OK);
    return st;
}

static const uint32_t zero_tokens[64 * BS];

/* Apply one batch: store keys[0 .. n) on medium (and clear first when clear). */
static kvp_router_apply_result apply_keys(kvp_router *r, uint32_t id, uint64_t seq,
                                          const uint64_t *keys, size_t n, const char *medium,
                                          bool clear)
{
    cr_assert_leq(n, 64);
    kvp_kv_event ev[2];
    memset(ev, 0, sizeof ev);
    size_t ne = 0;
    if (clear) {
        ev[ne].type = KVP_EVENT_CLEARED;
        ev[ne++].group_idx = -1;
    }
    ev[ne] = (kvp_kv_event){.type = KVP_EVENT_STORED,
                            .hashes = keys,
                            .n_hashes = n,
                            .tokens = zero_tokens,
                            .n_tokens = n * BS,
                            .block_size = BS,
                            .medium = medium,
                            .group_idx = -1};
    ne++;
    kvp_kv_batch b = {.ts = 100.0 + (double)seq, .events = ev, .n_events = ne};
    kvp_router_apply_result res;
    int rc = kvp_router_apply(r, id, seq, &b, &res);
    cr_assert_eq(rc, KVP_OK, "apply: %s (%s)", kvp_strerror(rc), res.why ? res.why : "");
    cr_assert_eq(kvp_router_check(r), KVP_OK);
    if (stats_of(r).redis_up)
        STORE_CHECK(r);
    return res;
}

/* Score keys[0 .. n) into rows (cap 16); returns the number of rows. */
static size_t score_keys(kvp_router *r, const uint64_t *keys, size_t n, kvp_router_row *rows)
{
    size_t n_rows = 0;
    cr_assert_eq(kvp_router_score_hashes(r, keys, n, rows, 16, &n_rows), KVP_OK);
    return n_rows;
}

/* As score_keys, and the view that answered this call (kvp_router_score_hashes_v2), with
 * each row's engine id checked against the worker's. */
static int score_keys_view(kvp_router *r, const uint64_t *keys, size_t n, kvp_router_row *rows)
{
    size_t n_rows = 0;
    const char *ids[16];
    kvp_router_score_result res;
    kvp_router_score_result_init(&res);
    res.engine_ids = ids;
    cr_assert_eq(kvp_router_score_hashes_v2(r, keys, n, rows, 16, &n_rows, &res), KVP_OK);
    for (size_t i = 0; i < n_rows; i++) {
        uint32_t id = UINT32_MAX;
        cr_assert_eq(kvp_router_worker_find(r, ids[i], rows[i].dp_rank, &id), KVP_OK);
        cr_assert_eq(id, rows[i].worker, "row %zu names its own worker", i);
    }
    return res.view;
}

static void rows_equal(const kvp_router_row *a, const kvp_router_row *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(a[i].state, b[i].state, "%s: row %zu state", what, i);
        cr_assert_eq(a[i].n_blocks, b[i].n_blocks, "%s: row %zu: %u vs %u blocks", what, i,
                     a[i].n_blocks, b[i].n_blocks);
        cr_assert_eq(a[i].n_tokens, b[i].n_tokens, "%s: row %zu tokens", what, i);
        cr_assert_eq(a[i].score, b[i].score, "%s: row %zu score %g vs %g", what, i, a[i].score,
                     b[i].score);
    }
}

/* A hiredis connection to the suite's server (for inspection). */
static redisContext *inspect(void)
{
    int port = atoi(env_or_fail("KVP_TEST_REDIS_PORT"));
    redisContext *c = redisConnect("127.0.0.1", port);
    cr_assert(c && !c->err, "cannot connect to the test server");
    return c;
}

static long long int_reply(redisContext *c, redisReply *rep)
{
    (void)c;
    cr_assert(rep && rep->type == REDIS_REPLY_INTEGER, "integer reply expected");
    long long v = rep->integer;
    freeReplyObject(rep);
    return v;
}

/* ---------------------------------------------------------------------------------------- */
/* A server of the test's own                                                               */
/* ---------------------------------------------------------------------------------------- */

/* A TCP port nothing listens on now (the kernel's choice). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static bool ping(int port)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    bool ok = false;
    if (c && !c->err) {
        redisReply *rep = redisCommand(c, "PING");
        ok = rep && rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0;
        if (rep)
            freeReplyObject(rep);
    }
    if (c)
        redisFree(c);
    return ok;
}

static pid_t server_start(int port)
{
    const char *server = env_or_fail("KVP_TEST_REDIS_SERVER");
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        execl(server, server, "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly",
              "no", "--loglevel", "warning", "--logfile", "/dev/null", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && !ping(port); i++)
        sleep_ms(25);
    cr_assert(ping(port), "redis-server on port %d did not start", port);
    return pid;
}

static void server_kill(pid_t pid)
{
    kill(pid, SIGCONT);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Several routers, one store                                                               */
/* ---------------------------------------------------------------------------------------- */

Test(redis_fleet, two_routers_return_the_same_rows)
{
    kvp_router *r1 = shared_router("same"), *r2 = shared_router("same");
    uint32_t a1 = worker(r1, "e1"), b1 = worker(r1, "e2");
    uint32_t a2 = worker(r2, "e1"), b2 = worker(r2, "e2");
    (void)b1;
    (void)a2;
    uint64_t k[6] = {101, 102, 103, 104, 105, 106};
    apply_keys(r1, a1, 0, k, 5, "GPU", false);
    apply_keys(r2, b2, 0, k, 3, "CPU", false);
    kvp_router_row x[16], y[16];
    for (size_t n = 0; n <= 6; n++) {
        size_t nx = score_keys(r1, k, n, x), ny = score_keys(r2, k, n, y);
        cr_assert_eq(nx, 2);
        cr_assert_eq(ny, 2);
        rows_equal(x, y, 2, "r1 vs r2");
    }
    cr_assert_eq(x[0].n_blocks, 5, "e1, applied by r1, seen through r2 too");
    cr_assert_eq(x[1].n_blocks, 3);
    cr_assert_float_eq(x[1].score, 3 * 0.8, 1e-12);
    /* r2's local view has only what r2 applied. */
    cr_assert_eq(stats_of(r2).n_holders, 3);
    cr_assert(stats_of(r1).redis_up && stats_of(r2).redis_up);
    cr_assert_eq(stats_of(r1).n_fallback_scores, 0);
    kvp_router_free(r1);
    kvp_router_free(r2);
}

Test(redis_fleet, batch_of_one_router_is_a_duplicate_for_the_other)
{
    kvp_router *r1 = shared_router("dup"), *r2 = shared_router("dup");
    uint32_t w1 = worker(r1, "e"), w2 = worker(r2, "e");
    uint64_t k[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    /* (Batch 0 arriving after batch 1 was applied would read as a publisher restart, as
     * in memory: router_apply.c's rule, which the store keeps.) */
    cr_assert_eq(apply_keys(r1, w1, 0, k, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    cr_assert_eq(apply_keys(r2, w2, 0, k, 1, "GPU", false).status, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(apply_keys(r1, w1, 1, k + 1, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    cr_assert_eq(apply_keys(r1, w1, 2, k + 2, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    kvp_router_apply_result res = apply_keys(r2, w2, 1, k + 1, 1, "GPU", false);
    cr_assert_eq(res.status, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(res.expected, 3, "the fleet's sequence state");
    cr_assert_eq(apply_keys(r2, w2, 2, k + 2, 1, "GPU", false).status, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(apply_keys(r2, w2, 3, k + 3, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    cr_assert_eq(apply_keys(r1, w1, 3, k + 3, 1, "GPU", false).status, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(stats_of(r2).n_redis_duplicates, 3);
    cr_assert_eq(stats_of(r1).n_redis_duplicates, 1);
    /* r2 misses batch 4 (r1 applies 4 and 5): its local GAP is followed, not reported. */
    apply_keys(r1, w1, 4, k + 4, 1, "GPU", false);
    apply_keys(r1, w1, 5, k + 5, 1, "GPU", false);
    res = apply_keys(r2, w2, 5, k + 5, 1, "GPU", false);
    cr_assert_eq(res.status, KVP_ROUTER_DUPLICATE);
    kvp_router_worker_stats ws;
    cr_assert_eq(kvp_router_worker_stats_get(r2, w2, &ws), KVP_OK);
    cr_assert_eq(ws.expected, 6, "the local view follows the fleet");
    cr_assert(!ws.stale);
    cr_assert_eq(ws.n_blocks, 1, "a partial local view: the blocks since the gap");
    kvp_router_row rows[16];
    score_keys(r2, k, 8, rows);
    cr_assert_eq(rows[0].n_blocks, 6, "the shared view is whole");
    kvp_router_free(r1);
    kvp_router_free(r2);
}

/* Three hash groups; a score (tokens) and a score_hashes each cost one round trip. */
Test(redis_fleet, one_round_trip_per_score)
{
    kvp_router *r = shared_router("rtt");
    kvp_router_worker_config wc;
    const char *names[3] = {"g1", "g2", "g3"};
    int profiles[3] = {KVP_HASH_VLLM_SHA256, KVP_HASH_XXH3, KVP_HASH_VLLM_SHA256};
    uint32_t sizes[3] = {16, 16, 32}, ids[3];
    uint32_t tokens[256];
    for (uint32_t i = 0; i < 256; i++)
        tokens[i] = 1000 + i;
    for (int g = 0; g < 3; g++) {
        kvp_router_worker_config_init(&wc);
        wc.engine_id = names[g];
        wc.hash.hash_profile = profiles[g];
        wc.hash.block_size = sizes[g];
        cr_assert_eq(kvp_router_worker_add(r, &wc, &ids[g]), KVP_OK);
    }
    cr_assert_eq(stats_of(r).n_groups, 3);
    uint64_t k[4] = {9, 8, 7, 6};
    apply_keys(r, ids[0], 0, k, 4, "GPU", false);
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    kvp_router_row rows[16];
    size_t n = 0;
    uint64_t before = stats_of(r).n_redis_calls;
    for (int i = 0; i < 10; i++)
        cr_assert_eq(kvp_router_score(r, &ns, tokens, 256, rows, 16, &n), KVP_OK);
    cr_assert_eq(stats_of(r).n_redis_calls, before + 10, "one round trip per score");
    for (int i = 0; i < 10; i++)
        score_keys(r, k, 4, rows);
    cr_assert_eq(stats_of(r).n_redis_calls, before + 20);
    cr_assert_eq(rows[0].n_blocks, 4);
    /* apply_many: one round trip (one atomic FCALL) for all its batches. */
    kvp_kv_event ev[3];
    kvp_kv_batch bt[3];
    kvp_router_item items[3];
    for (int i = 0; i < 3; i++) {
        ev[i] = (kvp_kv_event){.type = KVP_EVENT_STORED,
                               .hashes = k,
                               .n_hashes = 1,
                               .tokens = zero_tokens,
                               .n_tokens = sizes[i],
                               .block_size = sizes[i],
                               .medium = "GPU",
                               .group_idx = -1};
        bt[i] = (kvp_kv_batch){.ts = 1, .events = &ev[i], .n_events = 1};
        items[i] = (kvp_router_item){.worker = ids[i], .seq = i == 0 ? 1 : 0, .batch = &bt[i]};
    }
    before = stats_of(r).n_redis_calls;
    cr_assert_eq(kvp_router_apply_many(r, items, 3), KVP_OK);
    cr_assert_eq(stats_of(r).n_redis_calls, before + 1);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(items[i].res.status, KVP_ROUTER_APPLIED);
    cr_assert_eq(stats_of(r).n_fallback_scores, 0);
    kvp_router_free(r);
}

Test(redis_fleet, key_prefixes_isolate_fleets)
{
    kvp_router *a = shared_router("fleetA"), *b = shared_router("fleetB");
    uint32_t wa = worker(a, "e"), wb = worker(b, "e");
    uint64_t k[3] = {5, 6, 7};
    apply_keys(a, wa, 0, k, 3, "GPU", false);
    kvp_router_row rows[16];
    score_keys(b, k, 3, rows);
    cr_assert_eq(rows[0].n_blocks, 0, "fleet B never sees fleet A's blocks");
    cr_assert_eq(apply_keys(b, wb, 0, k, 1, "GPU", false).status, KVP_ROUTER_APPLIED,
                 "nor its sequence numbers");
    score_keys(a, k, 3, rows);
    cr_assert_eq(rows[0].n_blocks, 3);
    score_keys(b, k, 3, rows);
    cr_assert_eq(rows[0].n_blocks, 1);
    kvp_router_free(a);
    kvp_router_free(b);
}

/* Blocks stop counting when the worker's state expires, and its block hash expires with
 * it; a leftover block hash (a state lost alone) is deleted when the worker comes back (a
 * lost worker: its shared view restarts from that batch). */
Test(redis_fleet, worker_ttl_expiry, .timeout = 30)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "ttl_%ld", (long)getpid());
    kvp_router *r = router_on(env_or_fail("KVP_TEST_REDIS_URL"), prefix, 1, 5000, 1000);
    uint32_t w = worker(r, "e");
    uint64_t k[4] = {41, 42, 43, 44};
    apply_keys(r, w, 0, k, 3, "CPU", false);
    kvp_router_row rows[16];
    score_keys(r, k, 3, rows);
    cr_assert_eq(rows[0].n_blocks, 3);
    redisContext *c = inspect();
    unsigned char gid[KVP__RR_GID_BYTES];
    kvp__rr_gid("e", 1, 0, gid);
    char wm[128], wk[128];
    size_t n_wm = (size_t)snprintf(wm, sizeof wm, "%s:wm:", prefix);
    size_t n_wk = (size_t)snprintf(wk, sizeof wk, "%s:w:", prefix);
    memcpy(wm + n_wm, gid, 8);
    memcpy(wk + n_wk, gid, 8);
    n_wm += 8;
    n_wk += 8;
    cr_assert_gt(int_reply(c, redisCommand(c, "PTTL %b", wm, n_wm)), 0);
    sleep_ms(1500);
    score_keys(r, k, 3, rows);
    cr_assert_eq(rows[0].state, KVP_ROUTER_ROW_SCORED);
    cr_assert_eq(rows[0].n_blocks, 0, "an expired worker holds nothing");
    cr_assert_eq(int_reply(c, redisCommand(c, "EXISTS %b", wm, n_wm)), 0, "expired together");
    /* The worker returns: a lost state (the router knew it), the batch applied, and the
     * shared view re-seeded from this router's local one (exact: it saw every batch). */
    apply_keys(r, w, 1, k + 3, 1, "GPU", false);
    cr_assert_eq(stats_of(r).n_redis_lost, 1);
    cr_assert_eq(stats_of(r).n_redis_reseeds, 1);
    score_keys(r, k, 4, rows);
    cr_assert_eq(rows[0].n_blocks, 4);
    cr_assert_float_eq(rows[0].score, 3 * 0.8 + 1.0, 1e-12, "tiers re-seeded too");
    /* A state lost alone leaves a leftover block hash: deleted before the state is made
     * (a block the worker never held disappears), then the local view re-seeds it. */
    cr_assert_eq(int_reply(c, redisCommand(c, "DEL %b", wk, n_wk)), 1);
    cr_assert_eq(int_reply(c, redisCommand(c, "HSET %b zzzzzzzz 1", wm, n_wm)), 1);
    apply_keys(r, w, 2, k, 1, "GPU", false);
    cr_assert_eq(stats_of(r).n_redis_lost, 2);
    cr_assert_eq(int_reply(c, redisCommand(c, "HEXISTS %b zzzzzzzz", wm, n_wm)), 0, "cleaned");
    cr_assert_eq(int_reply(c, redisCommand(c, "HLEN %b", wm, n_wm)), 4, "re-seeded");
    redisFree(c);
    kvp_router_free(r);
}

/* FUNCTION FLUSH: the next call reloads the library once and succeeds. */
Test(redis_fleet, library_reloaded_after_function_flush)
{
    kvp_router *r = shared_router("flush");
    uint32_t w = worker(r, "e");
    uint64_t k[2] = {3, 4};
    apply_keys(r, w, 0, k, 2, "GPU", false);
    redisContext *c = inspect();
    redisReply *rep = redisCommand(c, "FUNCTION FLUSH");
    cr_assert(rep && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    redisFree(c);
    kvp_router_row rows[16];
    score_keys(r, k, 2, rows);
    cr_assert_eq(rows[0].n_blocks, 2);
    kvp_router_stats st = stats_of(r);
    cr_assert_eq(st.n_redis_errors, 0);
    cr_assert_eq(st.n_fallback_scores, 0);
    cr_assert(st.redis_up);
    kvp_router_free(r);
}

Test(redis_fleet, unix_socket_and_config_errors)
{
    char url[512];
    snprintf(url, sizeof url, "unix:%s", env_or_fail("KVP_TEST_REDIS_SOCK"));
    kvp_router *r = router_on(url, "unix_test", 0, 1000, 1000);
    cr_assert(stats_of(r).redis_up);
    uint32_t w = worker(r, "e");
    uint64_t k[1] = {77};
    cr_assert_eq(apply_keys(r, w, 0, k, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    kvp_router_free(r);
    kvp_router_config cfg;
    const char *bad_urls[] = {"",           "unix:",         "host",  "host:", "host:0",
                              "host:70000", "redis://h:1/x", "h:1/2", ":6379", "redis://u:p@h:1"};
    for (size_t i = 0; i < sizeof bad_urls / sizeof *bad_urls; i++) {
        kvp_router_config_init(&cfg);
        cfg.redis.url = bad_urls[i];
        cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL, "url '%s'", bad_urls[i]);
    }
    char too_long[66];
    memset(too_long, 'a', 65);
    too_long[65] = '\0';
    const char *bad_prefixes[] = {"", "a b", "x/y", too_long};
    for (size_t i = 0; i < sizeof bad_prefixes / sizeof *bad_prefixes; i++) {
        kvp_router_config_init(&cfg);
        cfg.redis.url = "127.0.0.1:1";
        cfg.redis.key_prefix = bad_prefixes[i];
        cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL, "prefix '%s'", bad_prefixes[i]);
    }
    kvp_router_config_init(&cfg);
    cfg.redis.url = "127.0.0.1:1";
    cfg.redis.timeout_ms = 0;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
    cfg.redis.timeout_ms = 100;
    cfg.redis.retry_ms = 600001;
    cr_assert_eq(kvp_router_new(&cfg, &r), KVP_EINVAL);
}

/* The store's checker catches each kind of corruption (made by hand with hiredis). */
Test(redis_fleet, store_checker_catches_each_corruption)
{
    static const char *const cases[][2] = {
        {"HSET %s:media DISK 9", "media: a bit outside 0..5"},
        {"HSET %s:media DISK 0", "media: a bit given twice"},
        {"HSET %s:media disk 3", "media: a name not in upper case"},
        {"HSET %s:w:12345678 expected zz known 1 stale 0 full 1 n 0",
         "worker state: expected is not 16 hex digits"},
        {"HSET %s:w:12345678 expected 0000000000000001 known 2 stale 0 full 1 n 0",
         "worker state: known, stale or full is not 0 or 1"},
        {"HSET %s:w:12345678 expected 0000000000000001 known 1 stale 0 full 1 n 5",
         "worker state: n differs from the blocks held"},
        {"HSET %s:wm:12345678 short 1", "blocks: a block key is not 8 bytes"},
        {"HSET %s:wm:12345678 abcdefgh 0", "blocks: a mask is 0 or names an unregistered medium"},
        {"HSET %s:wm:12345678 abcdefgh 32", "blocks: a mask is 0 or names an unregistered medium"},
    };
    redisContext *c = inspect();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "chk%zu_%ld", i, (long)getpid());
        kvp_router *r = router_on(env_or_fail("KVP_TEST_REDIS_URL"), prefix, 0, 5000, 1000);
        uint32_t w = worker(r, "e");
        uint64_t k[2] = {1, 2};
        apply_keys(r, w, 0, k, 2, "GPU", false); /* registers GPU as bit 0; checks */
        redisReply *rep = redisCommand(c, cases[i][0], prefix);
        cr_assert(rep && rep->type == REDIS_REPLY_INTEGER, "%s", cases[i][0]);
        freeReplyObject(rep);
        const char *why = NULL;
        cr_assert_eq(kvp__rr_check(r->store, &why), KVP_ECORRUPT, "case %zu not caught", i);
        cr_assert_str_eq(why, cases[i][1]);
        kvp_router_free(r);
    }
    redisFree(c);
}

/* kvprefix_reseed adds blocks only to the state it expects (fresh, at `expected`): a
 * worker that another router moved meanwhile keeps its partial view. */
Test(redis_fleet, reseed_only_onto_the_expected_state)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "reseed_%ld", (long)getpid());
    kvp_router *r = router_on(env_or_fail("KVP_TEST_REDIS_URL"), prefix, 0, 5000, 1000);
    uint32_t w = worker(r, "e");
    uint64_t k[1] = {5};
    apply_keys(r, w, 0, k, 1, "GPU", false);
    unsigned char gid[KVP__RR_GID_BYTES];
    kvp__rr_gid("e", 1, 0, gid);
    redisContext *c = inspect();
    const char *block = "ABCDEFGH";
    long long got = int_reply(c, redisCommand(c, "FCALL kvprefix_reseed 0 %s 0 %b %s 1 1 GPU %s",
                                              prefix, gid, (size_t)8, "0000000000000005", block));
    cr_assert_eq(got, 0, "another expected: refused");
    kvp_router_row rows[16];
    uint64_t b8 = 0x4142434445464748u;
    score_keys(r, &b8, 1, rows);
    cr_assert_eq(rows[0].n_blocks, 0);
    got = int_reply(c, redisCommand(c, "FCALL kvprefix_reseed 0 %s 0 %b %s 1 1 GPU %s", prefix, gid,
                                    (size_t)8, "0000000000000001", block));
    cr_assert_eq(got, 1);
    score_keys(r, &b8, 1, rows);
    cr_assert_eq(rows[0].n_blocks, 1);
    cr_assert_eq(kvp_router_mark_stale(r, w), KVP_OK);
    got = int_reply(c, redisCommand(c, "FCALL kvprefix_reseed 0 %s 0 %b %s 1 1 GPU %s", prefix, gid,
                                    (size_t)8, "0000000000000001", block));
    cr_assert_eq(got, 0, "a stale worker: refused");
    STORE_CHECK(r);
    redisFree(c);
    kvp_router_free(r);
}

/* Delete every key of prefix p (a store that lost this fleet's data). */
static void drop_prefix(redisContext *c, const char *p)
{
    char pat[96];
    snprintf(pat, sizeof pat, "%s:*", p);
    redisReply *rep = redisCommand(c, "KEYS %s", pat);
    cr_assert(rep && rep->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < rep->elements; i++)
        freeReplyObject(
            redisCommand(c, "DEL %b", rep->element[i]->str, (size_t)rep->element[i]->len));
    freeReplyObject(rep);
}

/* After the store loses a worker, a router whose local view is partial (it missed batches
 * 0-2 and followed from batch 3) finds the loss first and puts back what it has; the
 * other router, whose view is whole at the same batch, re-seeds the rest when its copy of
 * the batch arrives (a DUPLICATE in the store): every block is back, and no further
 * re-seed is sent. */
Test(redis_fleet, whole_view_reseeds_after_a_partial_one_found_the_loss)
{
    kvp_router *r1 = shared_router("whole"), *r2 = shared_router("whole");
    uint32_t w1 = worker(r1, "e"), w2 = worker(r2, "e");
    uint64_t k[5] = {901, 902, 903, 904, 905};
    for (uint64_t seq = 0; seq < 4; seq++)
        apply_keys(r1, w1, seq, k + seq, 1, "GPU", false);
    kvp_router_apply_result res = apply_keys(r2, w2, 3, k + 3, 1, "GPU", false);
    cr_assert_eq(res.status, KVP_ROUTER_DUPLICATE, "r2 followed from batch 3");
    char p[64];
    snprintf(p, sizeof p, "whole_%ld", (long)getpid());
    redisContext *c = inspect();
    drop_prefix(c, p);
    res = apply_keys(r2, w2, 4, k + 4, 1, "GPU", false);
    cr_assert_eq(res.status, KVP_ROUTER_APPLIED);
    cr_assert_eq(stats_of(r2).n_redis_lost, 1);
    cr_assert_eq(stats_of(r2).n_redis_reseeds, 1, "r2 found the loss: its partial view back");
    kvp_router_row rows[16];
    score_keys(r1, k, 5, rows);
    cr_assert_eq(rows[0].n_blocks, 0, "the shared view holds blocks 3 and 4 only");
    score_keys(r1, k + 3, 2, rows);
    cr_assert_eq(rows[0].n_blocks, 2);
    res = apply_keys(r1, w1, 4, k + 4, 1, "GPU", false);
    cr_assert_eq(res.status, KVP_ROUTER_DUPLICATE);
    cr_assert_eq(stats_of(r1).n_redis_reseeds, 1, "r1's view is whole at batch 4");
    score_keys(r2, k, 5, rows);
    cr_assert_eq(rows[0].n_blocks, 5, "every block back, scored by either router");
    res = apply_keys(r2, w2, 5, k, 1, "GPU", false);
    cr_assert_eq(stats_of(r2).n_redis_reseeds, 1, "the shared view is whole again");
    cr_assert_eq(stats_of(r1).n_redis_reseeds, 1);
    STORE_CHECK(r1);
    redisFree(c);
    kvp_router_free(r1);
    kvp_router_free(r2);
}

/* ---------------------------------------------------------------------------------------- */
/* Failures                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/* A stopped server (SIGSTOP: connections accepted, no reply) times out; the local view
 * answers within about 2 x timeout_ms, then at once during the pause; when the server
 * continues, its sequence state reports the gap and a replay fills it. */
Test(redis_failure, stopped_server_times_out_to_the_local_view, .timeout = 60)
{
    int port = free_port();
    pid_t pid = server_start(port);
    char url[64];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    kvp_router *r = router_on(url, "stop", 0, 100, 300);
    uint32_t w = worker(r, "e");
    uint64_t k[4] = {61, 62, 63, 64};
    apply_keys(r, w, 0, k, 3, "GPU", false);
    kvp_router_row rows[16];
    cr_assert_eq(score_keys_view(r, k, 4, rows), KVP_ROUTER_VIEW_REDIS);
    cr_assert_eq(rows[0].n_blocks, 3);
    kill(pid, SIGSTOP);
    double t0 = now_s();
    cr_assert_eq(score_keys_view(r, k, 4, rows), KVP_ROUTER_VIEW_FALLBACK, "this very call");
    double dt = now_s() - t0;
    cr_assert_lt(dt, 0.3, "a stopped server cost %.3f s (timeout 0.1 s)", dt);
    cr_assert_eq(rows[0].n_blocks, 3, "the local view answers");
    kvp_router_stats st = stats_of(r);
    cr_assert(!st.redis_up);
    cr_assert_eq(st.n_redis_errors, 1);
    cr_assert_eq(st.n_fallback_scores, 1);
    t0 = now_s();
    cr_assert_eq(score_keys_view(r, k, 4, rows), KVP_ROUTER_VIEW_FALLBACK, "in the pause");
    cr_assert_lt(now_s() - t0, 0.05, "no network during the pause");
    cr_assert_eq(apply_keys(r, w, 1, k + 3, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    st = stats_of(r);
    cr_assert_eq(st.n_fallback_scores, 2);
    cr_assert_eq(st.n_fallback_applies, 1);
    kill(pid, SIGCONT);
    sleep_ms(400);
    kvp_router_apply_result res = apply_keys(r, w, 2, k, 1, "GPU", false);
    cr_assert_eq(res.status, KVP_ROUTER_GAP, "Redis missed batch 1");
    cr_assert_eq(res.expected, 1);
    cr_assert_eq(apply_keys(r, w, 1, k + 3, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    cr_assert_eq(apply_keys(r, w, 2, k, 1, "GPU", false).status, KVP_ROUTER_APPLIED);
    cr_assert_eq(score_keys_view(r, k, 4, rows), KVP_ROUTER_VIEW_REDIS, "Redis again");
    cr_assert_eq(rows[0].n_blocks, 4);
    st = stats_of(r);
    cr_assert(st.redis_up);
    cr_assert_eq(st.n_fallback_scores, 2, "answered by Redis again");
    cr_assert_eq(st.n_redis_connects, 2);
    kvp_router_free(r);
    server_kill(pid);
}

/* The view is the call's own: while one router's server is stopped, its scores say
 * FALLBACK and, in the same moments and process, a router on the shared server says REDIS
 * (a counter read around the call, as the daemon once did, could not tell them apart). */
typedef struct view_thread {
    kvp_router *r;        /* the router scored */
    const uint64_t *keys; /* its keys */
    int want;             /* the view every call must report */
    int n_calls;          /* calls to make */
    atomic_int n_wrong;   /* calls that reported another view */
} view_thread;

static void *view_main(void *arg)
{
    view_thread *v = arg;
    for (int i = 0; i < v->n_calls; i++) {
        kvp_router_row rows[16];
        size_t n = 0;
        kvp_router_score_result res;
        kvp_router_score_result_init(&res);
        if (kvp_router_score_hashes_v2(v->r, v->keys, 3, rows, 16, &n, &res) != KVP_OK ||
            res.view != v->want || rows[0].n_blocks != 3)
            atomic_fetch_add(&v->n_wrong, 1);
    }
    return NULL;
}

Test(redis_failure, view_is_per_call_beside_a_healthy_router, .timeout = 60)
{
    int port = free_port();
    pid_t pid = server_start(port);
    char url[64];
    snprintf(url, sizeof url, "127.0.0.1:%d", port);
    kvp_router *down = router_on(url, "vstop", 0, 100, 60000);
    kvp_router *up = shared_router("vshared");
    uint64_t k[3] = {91, 92, 93};
    apply_keys(down, worker(down, "d"), 0, k, 3, "GPU", false);
    apply_keys(up, worker(up, "u"), 0, k, 3, "GPU", false);
    kill(pid, SIGSTOP);
    view_thread vt[2] = {{.r = down, .keys = k, .want = KVP_ROUTER_VIEW_FALLBACK, .n_calls = 200},
                         {.r = up, .keys = k, .want = KVP_ROUTER_VIEW_REDIS, .n_calls = 200}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        atomic_init(&vt[i].n_wrong, 0);
        cr_assert_eq(pthread_create(&th[i], NULL, view_main, &vt[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&vt[0].n_wrong), 0, "the stopped server's router said FALLBACK");
    cr_assert_eq(atomic_load(&vt[1].n_wrong), 0, "the healthy router said REDIS");
    cr_assert_eq(stats_of(down).n_fallback_scores, 200);
    cr_assert_eq(stats_of(up).n_fallback_scores, 0);
    kill(pid, SIGCONT);
    kvp_router_free(down);
    kvp_router_free(up);
    server_kill(pid);
}

/* A killed server: the local view answers, no crash (no SIGPIPE); restarted empty: lost
 * workers counted, partial shared views (never a block not held), new blocks scored
 * right, the connection restored after retry_ms. */
Test(redis_failure, killed_then_restarted_empty, .timeout = 60)
{
    int port = free_port();
    pid_t pid = server_start(port);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d/0", port);
    kvp_router *r = router_on(url, "kill", 0, 200, 300);
    uint32_t e1 = worker(r, "e1"), e2 = worker(r, "e2");
    uint64_t k[4] = {71, 72, 73, 74}, p[3] = {81, 82, 83};
    apply_keys(r, e1, 0, k, 4, "GPU", false);
    apply_keys(r, e2, 0, k, 2, "GPU", false);
    server_kill(pid);
    kvp_router_row rows[16];
    double t0 = now_s();
    score_keys(r, k, 4, rows);
    cr_assert_lt(now_s() - t0, 0.5);
    cr_assert_eq(rows[0].n_blocks, 4);
    cr_assert_eq(rows[1].n_blocks, 2);
    cr_assert(!stats_of(r).redis_up);
    sleep_ms(350);
    apply_keys(r, e2, 1, p, 1, "GPU", false); /* tries Redis: refused */
    cr_assert_eq(stats_of(r).n_fallback_applies, 1);
    pid = server_start(port);
    sleep_ms(350);
    cr_assert_eq(apply_keys(r, e1, 1, p, 3, "GPU", false).status, KVP_ROUTER_APPLIED);
    kvp_router_stats st = stats_of(r);
    cr_assert_eq(st.n_redis_lost, 1);
    cr_assert(st.redis_up);
    cr_assert_eq(st.n_redis_connects, 2);
    cr_assert_eq(st.n_redis_reseeds, 1, "e1's local view was exact: put back");
    score_keys(r, k, 4, rows);
    cr_assert_eq(rows[0].n_blocks, 4, "nothing lost for e1");
    cr_assert_eq(rows[1].n_blocks, 0, "e2 has no state in the new store yet");
    score_keys(r, p, 3, rows);
    cr_assert_eq(rows[0].n_blocks, 3, "blocks stored after the restart score right");
    cr_assert_eq(stats_of(r).n_holders, 4 + 3 + 2 + 1, "the local view kept everything");
    /* e2's next batch: lost, then re-seeded with what it stored during the outage too. */
    apply_keys(r, e2, 2, p + 1, 1, "GPU", false);
    cr_assert_eq(stats_of(r).n_redis_reseeds, 2);
    score_keys(r, p, 3, rows);
    cr_assert_eq(rows[1].n_blocks, 2, "p[0] stored while Redis was down, p[1] after");
    cr_assert_eq(kvp_router_check(r), KVP_OK);
    STORE_CHECK(r);
    kvp_router_free(r);
    server_kill(pid);
}

/* No server at all: kvp_router_new succeeds, every call answers locally. */
Test(redis_failure, no_server_at_creation)
{
    char url[64];
    snprintf(url, sizeof url, "127.0.0.1:%d", free_port());
    kvp_router *r = router_on(url, "none", 0, 100, 60000);
    uint32_t w = worker(r, "e");
    uint64_t k[2] = {1, 2};
    cr_assert_eq(apply_keys(r, w, 0, k, 2, "GPU", false).status, KVP_ROUTER_APPLIED);
    kvp_router_row rows[16];
    score_keys(r, k, 2, rows);
    cr_assert_eq(rows[0].n_blocks, 2);
    cr_assert_eq(kvp_router_mark_stale(r, w), KVP_OK);
    cr_assert_eq(kvp_router_resync(r, w), KVP_OK);
    cr_assert_eq(kvp_router_worker_remove(r, w), KVP_OK);
    kvp_router_stats st = stats_of(r);
    cr_assert(st.redis && !st.redis_up);
    cr_assert_eq(st.n_redis_errors, 1, "one attempt, then the pause");
    cr_assert_eq(st.n_redis_calls, 0);
    cr_assert_eq(st.n_fallback_scores, 1);
    cr_assert_eq(st.n_fallback_applies, 1);
    kvp_router_free(r);
}

/* ---------------------------------------------------------------------------------------- */
/* The same operations on an in-memory router and a Redis router                          */
/* ---------------------------------------------------------------------------------------- */

#define MODEL_WORKERS 6
#define MODEL_KEYS    48

typedef struct model {
    kvp_router *mem, *red;       /* the two routers, same workers in the same order */
    uint32_t id[MODEL_WORKERS];  /* worker ids (equal in both) */
    uint64_t seq[MODEL_WORKERS]; /* next sequence number per worker */
    uint64_t keys[MODEL_KEYS];   /* the key pool: prompts are runs of it */
    uint64_t rng;                /* xorshift state */
    double ts;                   /* batch timestamps, always new */
    size_t n_nonzero;            /* rows compared that held blocks */
} model;

static uint64_t rnd(model *m, uint64_t n)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return m->rng % n;
}

/* Apply one batch to both; statuses and sequence states must agree. */
static void both_apply(model *m, int w, uint64_t seq, const kvp_kv_event *ev, size_t n)
{
    kvp_kv_batch b = {.ts = m->ts, .events = ev, .n_events = n};
    m->ts += 1;
    kvp_router_apply_result a, c;
    cr_assert_eq(kvp_router_apply(m->mem, m->id[w], seq, &b, &a), KVP_OK);
    cr_assert_eq(kvp_router_apply(m->red, m->id[w], seq, &b, &c), KVP_OK);
    cr_assert_eq(a.status, c.status, "seq %llu: status %d in memory, %d on Redis",
                 (unsigned long long)seq, a.status, c.status);
    cr_assert_eq(a.expected, c.expected);
    cr_assert_eq(a.stale, c.stale);
    if (a.status == KVP_ROUTER_APPLIED || a.status == KVP_ROUTER_RESTARTED)
        m->seq[w] = seq + 1;
}

static void model_compare(model *m)
{
    size_t start = (size_t)rnd(m, MODEL_KEYS), len = (size_t)rnd(m, 24);
    if (start + len > MODEL_KEYS)
        len = MODEL_KEYS - start;
    kvp_router_row a[16], b[16];
    size_t na = score_keys(m->mem, m->keys + start, len, a);
    size_t nb = score_keys(m->red, m->keys + start, len, b);
    cr_assert_eq(na, nb);
    rows_equal(a, b, na, "in memory vs Redis");
    for (size_t i = 0; i < na; i++)
        m->n_nonzero += a[i].n_blocks > 0;
}

/* One random step. */
static void model_step(model *m)
{
    static const char *media[4] = {"GPU", "CPU", NULL, "disk"};
    int w = (int)rnd(m, MODEL_WORKERS);
    uint64_t op = rnd(m, 100);
    size_t start = (size_t)rnd(m, MODEL_KEYS), len = 1 + (size_t)rnd(m, 12);
    if (start + len > MODEL_KEYS)
        len = MODEL_KEYS - start;
    kvp_kv_event ev[2];
    memset(ev, 0, sizeof ev);
    ev[0] = (kvp_kv_event){.type = KVP_EVENT_STORED,
                           .hashes = m->keys + start,
                           .n_hashes = len,
                           .tokens = zero_tokens,
                           .n_tokens = len * BS,
                           .block_size = BS,
                           .medium = media[rnd(m, 4)],
                           .group_idx = -1};
    ev[1] = ev[0];
    ev[1].type = KVP_EVENT_CLEARED;
    if (op < 50) {
        both_apply(m, w, m->seq[w], ev, 1);
    } else if (op < 68) {
        ev[0].type = KVP_EVENT_REMOVED;
        ev[0].n_hashes = 1 + (size_t)rnd(m, len);
        both_apply(m, w, m->seq[w], ev, 1);
    } else if (op < 71) {
        both_apply(m, w, m->seq[w], ev + 1, 1); /* AllBlocksCleared */
    } else if (op < 74) {
        cr_assert_eq(kvp_router_mark_stale(m->mem, m->id[w]), KVP_OK);
        cr_assert_eq(kvp_router_mark_stale(m->red, m->id[w]), KVP_OK);
    } else if (op < 77) {
        cr_assert_eq(kvp_router_resync(m->mem, m->id[w]), KVP_OK);
        cr_assert_eq(kvp_router_resync(m->red, m->id[w]), KVP_OK);
    } else if (op < 79) {
        both_apply(m, w, m->seq[w] + 1 + rnd(m, 3), ev, 1); /* a gap (or a stale's take) */
    } else if (op < 81) {
        both_apply(m, w, rnd(m, m->seq[w] + 1), ev, 1); /* duplicate or restart */
    } else {
        model_compare(m);
    }
}

Test(redis_model, random_operations_match_in_memory, .timeout = 300)
{
    model *m = calloc(1, sizeof *m);
    kvp_router_config cfg;
    kvp_router_config_init(&cfg);
    cfg.table_seed = 3;
    cr_assert_eq(kvp_router_new(&cfg, &m->mem), KVP_OK);
    m->red = shared_router("model");
    char name[16];
    for (int w = 0; w < MODEL_WORKERS; w++) {
        snprintf(name, sizeof name, "w%d", w);
        m->id[w] = worker(m->mem, name);
        cr_assert_eq(worker(m->red, name), m->id[w]);
    }
    m->rng = 0x9e3779b97f4a7c15u;
    m->ts = 1.0;
    for (int i = 0; i < MODEL_KEYS; i++)
        m->keys[i] = 1000u + (uint64_t)rnd(m, 64);
    for (int step = 0; step < 3000; step++) {
        model_step(m);
        if (step % 100 == 0) {
            cr_assert_eq(kvp_router_check(m->red), KVP_OK);
            STORE_CHECK(m->red);
        }
    }
    for (int i = 0; i < 200; i++)
        model_compare(m);
    cr_assert_gt(m->n_nonzero, 500, "the comparisons saw runs (%zu)", m->n_nonzero);
    kvp_router_stats st = stats_of(m->red);
    cr_assert_eq(st.n_fallback_scores, 0);
    cr_assert_eq(st.n_fallback_applies, 0);
    cr_assert_eq(st.n_redis_errors, 0);
    kvp_router_free(m->mem);
    kvp_router_free(m->red);
    free(m);
}

/* ---------------------------------------------------------------------------------------- */
/* Threads                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct thread_arg {
    kvp_router *r;     /* the shared router */
    uint32_t ids[3];   /* an event thread's workers */
    uint64_t keys[32]; /* the key pool */
    atomic_bool *stop; /* set when the event threads are done */
    int n_batches;     /* per event thread */
    bool failed;       /* a call returned an error */
} thread_arg;

/* Event thread: random stores, removals and clears on its workers, apply_many by twos. */
static void *event_thread(void *p)
{
    thread_arg *a = p;
    uint64_t seq[3] = {0, 0, 0}, x = a->ids[0] * 7919u + 1;
    for (int i = 0; i < a->n_batches; i++) {
        kvp_kv_event ev[2];
        kvp_router_item items[2];
        kvp_kv_batch b[2];
        for (int j = 0; j < 2; j++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            int w = (int)(x >> 60) % 3;
            size_t start = (size_t)(x >> 40) % 24, len = 1 + (size_t)(x >> 20) % 8;
            ev[j] = (kvp_kv_event){.type = (x >> 8) % 5 == 0 ? KVP_EVENT_REMOVED : KVP_EVENT_STORED,
                                   .hashes = a->keys + start,
                                   .n_hashes = len,
                                   .tokens = zero_tokens,
                                   .n_tokens = len * BS,
                                   .block_size = BS,
                                   .medium = (x >> 4) % 2 ? "GPU" : "CPU",
                                   .group_idx = -1};
            b[j] = (kvp_kv_batch){.ts = 1, .events = &ev[j], .n_events = 1};
            items[j] = (kvp_router_item){.worker = a->ids[w], .seq = seq[w]++, .batch = &b[j]};
        }
        if (kvp_router_apply_many(a->r, items, 2) != KVP_OK ||
            items[0].res.status != KVP_ROUTER_APPLIED || items[1].res.status != KVP_ROUTER_APPLIED)
            a->failed = true;
    }
    return NULL;
}

/* Scoring thread: scores until the event threads are done. */
static void *score_thread(void *p)
{
    thread_arg *a = p;
    kvp_router_row rows[16];
    size_t n = 0;
    while (!atomic_load(a->stop)) {
        if (kvp_router_score_hashes(a->r, a->keys, 24, rows, 16, &n) != KVP_OK || n != 6)
            a->failed = true;
    }
    return NULL;
}

/* Two event threads (apply_many) and two scoring threads on one Redis router; then the
 * store's view equals the router's local view (no fallback: both saw every batch). */
Test(redis_threads, events_and_scores_then_views_agree, .timeout = 120)
{
    kvp_router *r = shared_router("threads");
    atomic_bool stop;
    atomic_init(&stop, false);
    thread_arg ev[2], sc[2];
    char name[16];
    for (int t = 0; t < 2; t++) {
        memset(&ev[t], 0, sizeof ev[t]);
        ev[t].r = r;
        ev[t].stop = &stop;
        ev[t].n_batches = 300;
        for (int w = 0; w < 3; w++) {
            snprintf(name, sizeof name, "t%dw%d", t, w);
            ev[t].ids[w] = worker(r, name);
        }
        for (int i = 0; i < 32; i++)
            ev[t].keys[i] = 500u + (uint64_t)i;
        sc[t] = ev[t];
    }
    pthread_t th[4];
    for (int t = 0; t < 2; t++) {
        cr_assert_eq(pthread_create(&th[t], NULL, event_thread, &ev[t]), 0);
        cr_assert_eq(pthread_create(&th[2 + t], NULL, score_thread, &sc[t]), 0);
    }
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    atomic_store(&stop, true);
    pthread_join(th[2], NULL);
    pthread_join(th[3], NULL);
    for (int t = 0; t < 2; t++)
        cr_assert(!ev[t].failed && !sc[t].failed, "thread %d failed", t);
    cr_assert_eq(kvp_router_check(r), KVP_OK);
    STORE_CHECK(r);
    kvp_router_row red[16], loc[16];
    size_t n_held = 0;
    for (size_t start = 0; start < 24; start++) {
        size_t n = 0;
        score_keys(r, ev[0].keys + start, 24 - start, red);
        kvp__rt_query q = {
            .hashes = ev[0].keys + start, .n_hashes = 24 - start, .rows = loc, .cap = 16};
        cr_assert_eq(kvp__rt_score(&r->ix, &q, &n), KVP_OK); /* the local index alone */
        rows_equal(red, loc, n, "Redis vs local");
        for (size_t i = 0; i < n; i++)
            n_held += red[i].n_blocks;
    }
    cr_assert_gt(n_held, 0, "the comparison saw runs");
    kvp_router_stats st = stats_of(r);
    cr_assert_eq(st.n_fallback_scores + st.n_fallback_applies + st.n_redis_errors, 0);
    kvp_router_free(r);
}
