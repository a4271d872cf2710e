/*
 * router_redis.c - the Redis store's transport (router_redis.h): configuration, the
 * connection, building and running commands with timeouts. It knows nothing of the index:
 * the store itself (its operations: apply, score, worker operations, stats, checker) is
 * router_redis_ops.c, which calls down into this file and never the other way. The Redis
 * side is the Lua library router_redis.lua, embedded at build time (router_redis_lua.h,
 * generated).
 *
 * One hiredis connection per router, under rr->mu (hiredis contexts are not thread-safe):
 * scores and batches serialize on it for their round trip. Life of the connection:
 *
 *   none --connect (timeout), SELECT db, FUNCTION LOAD REPLACE--> connected
 *   connected --any failure: I/O, timeout, error reply, unexpected reply--> none + pause
 *   none + pause --retry_ms later, at the next call--> connect again
 *
 * During the pause no call touches the network: scores answer from the local index at
 * once, batches are applied locally only (both counted). Every call has a deadline of
 * 2 x timeout_ms from its start: the connect timeout and each read's socket timeout
 * (SO_RCVTIMEO, through redisSetTimeout) are cut to what remains of it, so a stopped
 * server (SIGSTOP: connects succeed, replies never come) costs one timeout_ms.
 *
 * hiredis 0.14 writes with write(2): a peer that closed its socket raises SIGPIPE, which
 * would kill a process that did not ignore it. Each network section blocks SIGPIPE in the
 * calling thread and consumes one raised meanwhile (the approach of libcurl and OpenSSL's
 * docs for libraries that cannot own the process's signal dispositions).
 *
 * The library (router_redis.lua, "kvprefix_1") is loaded with FUNCTION LOAD REPLACE at
 * every connection, and again once when a call finds it missing (FUNCTION FLUSH, or a
 * server restarted behind a proxy that kept the connection). FCALL names no key
 * (numkeys 0): a standalone Redis, not a Cluster.
 */
#define _GNU_SOURCE /* memrchr, strndup */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "router_redis.h"
#include "router_redis_lua.h"

#define MAX_TIMEOUT_MS 60000u
#define MAX_RETRY_MS   600000u

/* ---------------------------------------------------------------- time */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t kvp__rr_deadline(const kvp__rr *rr)
{
    return now_ns() + 2u * (uint64_t)rr->timeout_ms * 1000000u;
}

/* What remains until deadline, at most timeout_ms, as a timeval; false when nothing. */
static bool remaining(const kvp__rr *rr, uint64_t deadline, struct timeval *tv)
{
    uint64_t now = now_ns();
    if (now + 1000000u > deadline)
        return false;
    uint64_t left = deadline - now, cap = (uint64_t)rr->timeout_ms * 1000000u;
    if (left > cap)
        left = cap;
    tv->tv_sec = (time_t)(left / 1000000000u);
    tv->tv_usec = (suseconds_t)(left % 1000000000u / 1000u);
    return true;
}

/* ---------------------------------------------------------------- SIGPIPE */

typedef struct sigpipe_guard {
    sigset_t old;     /* the thread's mask before */
    bool was_pending; /* a SIGPIPE was pending before (not ours to consume) */
} sigpipe_guard;

static void sigpipe_block(sigpipe_guard *g)
{
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &s, &g->old);
}

static void sigpipe_restore(const sigpipe_guard *g)
{
    sigset_t s, pending;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    sigpending(&pending);
    if (!g->was_pending && sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&s, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* ---------------------------------------------------------------- commands */

void kvp__rr_cmd_init(kvp__rr_cmd *c)
{
    memset(c, 0, sizeof *c);
}

void kvp__rr_cmd_free(kvp__rr_cmd *c)
{
    free(c->buf);
    free(c->off);
    free(c->arg_len);
    free(c->argv);
    memset(c, 0, sizeof *c);
}

/* Grow the argument arrays for one more. false when memory ran out. */
static bool cmd_grow_args(kvp__rr_cmd *c)
{
    if (c->argc < c->arg_cap)
        return true;
    size_t cap = c->arg_cap ? c->arg_cap * 2 : 32;
    size_t *off = realloc(c->off, cap * sizeof *off);
    if (off)
        c->off = off;
    size_t *len = realloc(c->arg_len, cap * sizeof *len);
    if (len)
        c->arg_len = len;
    if (!off || !len)
        return false;
    c->arg_cap = cap;
    return true;
}

char *kvp__rr_cmd_arg(kvp__rr_cmd *c, size_t len)
{
    if (c->failed || !cmd_grow_args(c)) {
        c->failed = true;
        return NULL;
    }
    if (c->len + len + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->len + len + 1)
            cap *= 2;
        char *b = realloc(c->buf, cap);
        if (!b) {
            c->failed = true;
            return NULL;
        }
        c->buf = b;
        c->cap = cap;
    }
    c->off[c->argc] = c->len;
    c->arg_len[c->argc++] = len;
    char *p = c->buf + c->len;
    c->len += len;
    return p;
}

void kvp__rr_cmd_str(kvp__rr_cmd *c, const char *s)
{
    size_t n = strlen(s);
    char *p = kvp__rr_cmd_arg(c, n);
    if (p)
        memcpy(p, s, n);
}

void kvp__rr_cmd_i64(kvp__rr_cmd *c, int64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%lld", (long long)v);
    kvp__rr_cmd_str(c, b);
}

void kvp__rr_cmd_fcall(kvp__rr_cmd *c, const kvp__rr *rr, const char *fn)
{
    kvp__rr_cmd_str(c, "FCALL");
    kvp__rr_cmd_str(c, fn);
    kvp__rr_cmd_str(c, "0");
    kvp__rr_cmd_str(c, rr->prefix);
}

/* The argv pointers into the buffer (valid until the next append), or NULL. */
static const char **cmd_argv(kvp__rr_cmd *c)
{
    if (c->failed)
        return NULL;
    free(c->argv);
    c->argv = malloc((c->argc ? c->argc : 1) * sizeof *c->argv);
    if (!c->argv) {
        c->failed = true;
        return NULL;
    }
    for (size_t i = 0; i < c->argc; i++)
        c->argv[i] = c->buf + c->off[i];
    return c->argv;
}

void kvp__rr_gid(const char *engine, size_t engine_len, int64_t dp_rank, unsigned char *out)
{
    unsigned char tail[9] = {0};
    uint64_t dp = (uint64_t)dp_rank;
    for (int i = 0; i < 8; i++)
        tail[1 + i] = (unsigned char)(dp >> (8 * i));
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, engine, engine_len);
    XXH3_64bits_update(&st, tail, sizeof tail);
    uint64_t h = XXH3_64bits_digest(&st);
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(h >> (56 - 8 * i));
}

/* ---------------------------------------------------------------- connection */

void kvp__rr_fail_locked(kvp__rr *rr)
{
    if (rr->c)
        redisFree(rr->c);
    rr->c = NULL;
    atomic_store(&rr->down_until_ns, now_ns() + (uint64_t)rr->retry_ms * 1000000u);
    atomic_fetch_add(&rr->n_errors, 1);
    atomic_store(&rr->up, false);
}

bool kvp__rr_usable(kvp__rr *rr)
{
    return now_ns() >= atomic_load(&rr->down_until_ns);
}

/* Run one command (argv strings) on the connection and check its reply: a status "OK"
 * or a string equal to want. true on success. */
static bool simple_command(kvp__rr *rr, int argc, const char **argv, const char *want,
                           uint64_t deadline)
{
    struct timeval tv;
    if (!remaining(rr, deadline, &tv) || redisSetTimeout(rr->c, tv) != REDIS_OK)
        return false;
    size_t lens[4];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisReply *rep = redisCommandArgv(rr->c, argc, argv, lens);
    bool ok = rep && (rep->type == REDIS_REPLY_STATUS || rep->type == REDIS_REPLY_STRING) &&
              strcmp(rep->str, want) == 0;
    if (rep)
        freeReplyObject(rep);
    return ok;
}

/* FUNCTION LOAD REPLACE the library. true on success. */
static bool load_library(kvp__rr *rr, uint64_t deadline)
{
    const char *argv[3] = {"FUNCTION", "LOAD", "REPLACE"};
    const char *all[4] = {argv[0], argv[1], argv[2], kvp__rr_lua};
    return simple_command(rr, 4, all, KVP__RR_LIB, deadline);
}

/* Connect, SELECT, load. KVP_OK or KVP_EIO (counted, paused). mu held, not connected. */
static int connect_locked(kvp__rr *rr, uint64_t deadline)
{
    struct timeval tv;
    if (!remaining(rr, deadline, &tv)) {
        kvp__rr_fail_locked(rr);
        return KVP_EIO;
    }
    rr->c = rr->path ? redisConnectUnixWithTimeout(rr->path, tv)
                     : redisConnectWithTimeout(rr->host, rr->port, tv);
    bool ok = rr->c && rr->c->err == 0;
    if (ok && rr->db != 0) {
        char db[16];
        snprintf(db, sizeof db, "%d", rr->db);
        const char *argv[2] = {"SELECT", db};
        ok = simple_command(rr, 2, argv, "OK", deadline);
    }
    ok = ok && load_library(rr, deadline);
    if (!ok) {
        kvp__rr_fail_locked(rr);
        return KVP_EIO;
    }
    atomic_fetch_add(&rr->n_connects, 1);
    return KVP_OK;
}

/* ---------------------------------------------------------------- running commands */

void kvp__rr_replies_free(redisReply **replies, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (replies[i])
            freeReplyObject(replies[i]);
        replies[i] = NULL;
    }
}

/* Does an error reply say that the library is not loaded? */
static bool missing_function(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_ERROR &&
           (strstr(rep->str, "Function not found") || strstr(rep->str, "NOSCRIPT"));
}

/* One pipeline attempt: 0 done (replies set, none an error), 1 an error reply says the
 * library is missing, -1 failed. Connected. */
static int pipeline(kvp__rr *rr, kvp__rr_cmd *cmds, size_t n, redisReply **replies,
                    uint64_t deadline)
{
    for (size_t i = 0; i < n; i++) {
        const char **argv = cmd_argv(&cmds[i]);
        if (!argv ||
            redisAppendCommandArgv(rr->c, (int)cmds[i].argc, argv, cmds[i].arg_len) != REDIS_OK)
            return -1;
    }
    int result = 0;
    for (size_t i = 0; i < n; i++) {
        struct timeval tv;
        void *rep = NULL;
        if (!remaining(rr, deadline, &tv) || redisSetTimeout(rr->c, tv) != REDIS_OK ||
            redisGetReply(rr->c, &rep) != REDIS_OK || !rep)
            return -1;
        replies[i] = rep;
        if (replies[i]->type == REDIS_REPLY_ERROR)
            result = missing_function(replies[i]) && result == 0 ? 1 : -1;
    }
    return result;
}

int kvp__rr_exec_locked(kvp__rr *rr, kvp__rr_cmd *cmds, size_t n, redisReply **replies,
                        uint64_t deadline)
{
    for (size_t i = 0; i < n; i++) {
        replies[i] = NULL;
        if (cmds[i].failed)
            return KVP_ENOMEM;
    }
    if (!kvp__rr_usable(rr))
        return KVP_EIO;
    sigpipe_guard g;
    sigpipe_block(&g);
    int rc = rr->c ? KVP_OK : connect_locked(rr, deadline);
    int res = -1;
    if (rc == KVP_OK) {
        atomic_fetch_add(&rr->n_calls, 1);
        res = pipeline(rr, cmds, n, replies, deadline);
        if (res == 1) {
            kvp__rr_replies_free(replies, n);
            res = load_library(rr, deadline) ? pipeline(rr, cmds, n, replies, deadline) : -1;
        }
        if (res != 0) {
            kvp__rr_replies_free(replies, n);
            kvp__rr_fail_locked(rr);
            rc = KVP_EIO;
        }
    }
    sigpipe_restore(&g);
    if (rc == KVP_OK)
        atomic_store(&rr->up, true);
    return rc;
}

/* ---------------------------------------------------------------- configuration */

static bool prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > KVP__RR_PREFIX_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' || ch == '-';
        if (!ok)
            return false;
    }
    return true;
}

/* A decimal integer lo..hi filling s[0 .. n), or -1. */
static long parse_int(const char *s, size_t n, long lo, long hi)
{
    if (n == 0 || n > 9)
        return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= lo && v <= hi ? v : -1;
}

/* "HOST:PORT[/DB]" (after an optional redis:// scheme; HOST may be a bracketed IPv6
 * address; no user or password: AUTH is not supported) into rr. KVP_OK, KVP_EINVAL,
 * KVP_ENOMEM. */
static int parse_tcp(kvp__rr *rr, const char *s, bool scheme)
{
    const char *slash = strchr(s, '/');
    size_t hp = slash ? (size_t)(slash - s) : strlen(s);
    if (memchr(s, '@', hp) ||
        (slash &&
         (!scheme || (rr->db = (int)parse_int(slash + 1, strlen(slash + 1), 0, 1000000)) < 0)))
        return KVP_EINVAL;
    const char *close = s[0] == '[' ? memchr(s, ']', hp) : NULL;
    const char *from = close ? close : s;
    const char *colon = memrchr(from, ':', hp - (size_t)(from - s));
    size_t host_len = colon ? (size_t)(colon - s) : hp;
    rr->port = colon ? (int)parse_int(colon + 1, hp - host_len - 1, 1, 65535) : 6379;
    if (rr->port < 0 || host_len == 0 || (!colon && !scheme))
        return KVP_EINVAL;
    if (s[0] == '[' && host_len >= 2 && s[host_len - 1] == ']') {
        s++;
        host_len -= 2;
    }
    rr->host = strndup(s, host_len);
    return rr->host ? KVP_OK : KVP_ENOMEM;
}

/* The url into rr. KVP_OK, KVP_EINVAL, KVP_ENOMEM. */
static int parse_url(kvp__rr *rr, const char *url)
{
    if (strncmp(url, "unix:", 5) == 0) {
        if (url[5] == '\0')
            return KVP_EINVAL;
        rr->path = strdup(url + 5);
        return rr->path ? KVP_OK : KVP_ENOMEM;
    }
    if (strncmp(url, "redis://", 8) == 0)
        return parse_tcp(rr, url + 8, true);
    return parse_tcp(rr, url, false);
}

/* Validate cfg's numbers and prefix into rr. KVP_OK or KVP_EINVAL. */
static int config_into(kvp__rr *rr, const kvp_router_redis *cfg)
{
    const char *prefix = cfg->key_prefix ? cfg->key_prefix : "kvp";
    if (!prefix_ok(prefix) || cfg->timeout_ms < 1 || cfg->timeout_ms > MAX_TIMEOUT_MS ||
        cfg->retry_ms > MAX_RETRY_MS)
        return KVP_EINVAL;
    snprintf(rr->prefix, sizeof rr->prefix, "%s", prefix);
    rr->timeout_ms = cfg->timeout_ms;
    rr->retry_ms = cfg->retry_ms;
    rr->ttl_ms = (uint64_t)cfg->worker_ttl_s * 1000u;
    return KVP_OK;
}

void kvp__rr_conn_close(kvp__rr *rr)
{
    if (rr->c)
        redisFree(rr->c);
    rr->c = NULL;
    free(rr->host);
    free(rr->path);
    rr->host = NULL;
    rr->path = NULL;
}

int kvp__rr_conn_open(kvp__rr *rr, const kvp_router_redis *cfg)
{
    int rc = config_into(rr, cfg);
    if (rc == KVP_OK)
        rc = parse_url(rr, cfg->url);
    if (rc != KVP_OK)
        return rc;
    sigpipe_guard g;
    sigpipe_block(&g);
    (void)connect_locked(rr, kvp__rr_deadline(rr));
    sigpipe_restore(&g);
    atomic_store(&rr->up, rr->c != NULL);
    return KVP_OK;
}
