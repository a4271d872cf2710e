/*
 * router_redis.h - the Redis store of the router index (src/events/router_redis*.c): the
 * router_store.h interface answered by the in-memory index (the local view) and a Redis
 * database that several routers share. Nothing here is installed or exported.
 *
 *   kvp__rr
 *    |- base            the store interface (ops = the Redis store's, ix = the router's index)
 *    `- the store       one hiredis connection under a mutex, its address, key prefix,
 *                       timeouts, the retry pause and the counters
 *
 * Every batch is validated and applied to the local index exactly as the local store
 * applies it, then sent to Redis in one FCALL (kvprefix_apply of router_redis.lua);
 * scores are one pipelined round trip (one kvprefix_score FCALL per hash group) and fall
 * back to the local index (router_score.c, the local store's score) when Redis fails or is
 * in its retry pause, reported per call as KVP_ROUTER_VIEW_FALLBACK. worker_add and check
 * are the local store's (router_local.h).
 *
 * Locks: router_store.h's protocol. mu is this store's mutex (lock 1): taken before the
 * index lock, never after; the index lock is never held during network I/O. The store
 * takes both itself, through router_base.c: it calls nothing in router.c. The counters
 * are atomics, read by stats without the mutex.
 *
 * Without hiredis (KVP_HAVE_REDIS undefined) kvp__rr_new and kvp__rr_check are inline
 * stubs: a Redis url is KVP_ENOTSUP at creation.
 */
#ifndef KVP_EVENTS_ROUTER_REDIS_H
#define KVP_EVENTS_ROUTER_REDIS_H

#include "router_local.h"

#ifdef KVP_HAVE_REDIS

#include <pthread.h>

#define KVP__RR_LIB        "kvprefix_1" /* the Lua library's name (router_redis.lua) */
#define KVP__RR_PREFIX_MAX 64u          /* longest key prefix */
#define KVP__RR_GID_BYTES  8u           /* a worker's fleet-wide id */

struct redisContext;
struct redisReply;

typedef struct kvp__rr kvp__rr;

struct kvp__rr {
    kvp__rt_store base;                  /* first: a kvp__rt_store * is a kvp__rr * */
    pthread_mutex_t mu;                  /* serializes the connection; taken before the rwlock */
    struct redisContext *c;              /* the connection (hiredis), NULL when not connected */
    char *host;                          /* TCP host (owned), or NULL for a unix socket */
    char *path;                          /* unix socket path (owned), or NULL */
    int port;                            /* TCP port, when host */
    int db;                              /* database SELECTed after connecting (0: none) */
    char prefix[KVP__RR_PREFIX_MAX + 1]; /* key prefix, NUL-terminated */
    uint32_t timeout_ms;                 /* connect and per-command timeout */
    uint32_t retry_ms;                   /* pause after a failure */
    uint64_t ttl_ms;                     /* worker state TTL, 0: none */
    atomic_ullong down_until_ns;         /* no attempt before this (monotonic ns); written
                                            under mu, read without it */
    atomic_bool up;                      /* the last attempt succeeded */
    atomic_ullong n_calls, n_errors, n_connects, n_fallback_scores, n_fallback_applies;
    atomic_ullong n_lost, n_duplicates, n_reseeds;
};

/* A command's arguments, built in one growing buffer (binary safe). */
typedef struct kvp__rr_cmd {
    char *buf;         /* argument bytes, back to back (malloc) */
    size_t len;        /* bytes used */
    size_t cap;        /* bytes allocated */
    size_t *off;       /* argument i starts at buf + off[i] */
    size_t *arg_len;   /* and has arg_len[i] bytes */
    const char **argv; /* set by kvp__rr_cmd_argv */
    size_t argc;       /* arguments */
    size_t arg_cap;    /* room in off, arg_len and argv */
    bool failed;       /* an allocation failed: the command must not be sent */
} kvp__rr_cmd;

void kvp__rr_cmd_init(kvp__rr_cmd *c);
void kvp__rr_cmd_free(kvp__rr_cmd *c);
/* Room for one more argument of len bytes (written by the caller), or NULL (failed). */
char *kvp__rr_cmd_arg(kvp__rr_cmd *c, size_t len);
/* Append a string, or the decimal form of v, as one argument. */
void kvp__rr_cmd_str(kvp__rr_cmd *c, const char *s);
void kvp__rr_cmd_i64(kvp__rr_cmd *c, int64_t v);
/* Append `FCALL fn 0 prefix`. */
void kvp__rr_cmd_fcall(kvp__rr_cmd *c, const kvp__rr *rr, const char *fn);

/* The worker's gid: XXH3-64 of engine id, a 0 byte and dp_rank (8 bytes, little-endian),
 * written big-endian to out. Cannot fail. */
void kvp__rr_gid(const char *engine, size_t engine_len, int64_t dp_rank, unsigned char *out);

/* The deadline of a call starting now: now + 2 x timeout (monotonic ns). */
uint64_t kvp__rr_deadline(const kvp__rr *rr);

/* May Redis be tried now (not in the retry pause)? Without mu: a hint, that the call
 * under mu checks again. */
bool kvp__rr_usable(kvp__rr *rr);

/* Send cmds[0 .. n) in one pipeline (connecting first if needed; reloading the library
 * once if Redis does not know a function) and read their replies before deadline. On
 * KVP_OK replies[0 .. n) are owned by the caller (kvp__rr_replies_free). Returns KVP_OK,
 * KVP_EIO (paused, refused, timed out, an error reply: the connection is dropped, the
 * pause started, the failure counted), KVP_ENOMEM (a command failed to build). mu held. */
int kvp__rr_exec_locked(kvp__rr *rr, kvp__rr_cmd *cmds, size_t n, struct redisReply **replies,
                        uint64_t deadline);

/* Free replies[0 .. n) (NULL entries skipped). */
void kvp__rr_replies_free(struct redisReply **replies, size_t n);

/* Count a reply that did not have the expected shape as a failure (drop the connection,
 * start the pause). mu held. */
void kvp__rr_fail_locked(kvp__rr *rr);

/* A Redis store over ix from cfg (cfg->url not NULL), after one try to connect (a failure
 * only starts the retry pause). Returns KVP_OK with *out set; KVP_EINVAL (a field out of
 * range, a url or key prefix that does not parse); KVP_ENOMEM. */
int kvp__rr_new(kvp__rt_index *ix, const kvp_router_redis *cfg, kvp__rt_store **out);

/* The apply and score operations (router_redis_ops.c) of the store s (a kvp__rr). */
int kvp__rr_apply(kvp__rt_store *s, kvp_router_item *items, size_t n);
int kvp__rr_score(kvp__rt_store *s, const kvp__rt_query *q, size_t *n_rows, int *view);

/* The store's invariant checker (kvprefix_check in router_redis.lua): every key of its
 * prefix, walked with KEYS (tests and debugging only). Returns KVP_OK, KVP_ECORRUPT (*why:
 * a static description), KVP_EIO (Redis failed: counted as any failure), KVP_ENOMEM;
 * KVP_EINVAL when s is not a Redis store. */
int kvp__rr_check(kvp__rt_store *s, const char **why);

#else

typedef struct kvp__rr kvp__rr;

static inline int kvp__rr_new(kvp__rt_index *ix, const kvp_router_redis *cfg, kvp__rt_store **out)
{
    (void)ix;
    (void)cfg;
    (void)out;
    return KVP_ENOTSUP;
}

static inline int kvp__rr_check(kvp__rt_store *s, const char **why)
{
    (void)s;
    (void)why;
    return KVP_EINVAL;
}

#endif /* KVP_HAVE_REDIS */

#endif /* KVP_EVENTS_ROUTER_REDIS_H */
