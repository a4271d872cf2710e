/*
 * router_redis.h - the router index's shared store on Redis (src/events/router_redis*.c),
 * as the public router calls in router.c see it. Nothing here is installed or exported.
 *
 *   kvp_router
 *    |- the in-memory router (router.h): workers, groups, media, the local index
 *    `- rr               the store: one hiredis connection under a mutex, its address,
 *                        key prefix, timeouts, the retry pause and the counters
 *
 * Every batch is validated and applied to the local index exactly as without a store,
 * then sent to Redis in one FCALL (kvprefix_apply of src/events/router_redis.lua);
 * scores are one pipelined round trip (one kvprefix_score FCALL per hash group) and fall
 * back to the local index when Redis fails or is in its retry pause.
 *
 * Locks: rr's mutex is always taken before the router's rwlock, never after; the rwlock
 * is never held during network I/O. The counters are atomics, read by stats without the
 * mutex.
 *
 * Without hiredis (KVP_HAVE_REDIS undefined) the functions below are inline stubs: a
 * store is KVP_ENOTSUP at creation and every router has rr == NULL.
 */
#ifndef KVP_EVENTS_ROUTER_REDIS_H
#define KVP_EVENTS_ROUTER_REDIS_H

#include "router.h"

/* What kvp__rr_worker_op does, in the store, after the local call. */
enum {
    KVP__RR_MARK_STALE = 1, /* kvp_router_mark_stale */
    KVP__RR_RESYNC = 2,     /* kvp_router_resync */
    KVP__RR_REMOVE = 3      /* kvp_router_worker_remove */
};

#ifdef KVP_HAVE_REDIS

#include <pthread.h>

#define KVP__RR_LIB        "kvprefix_1" /* the Lua library's name (router_redis.lua) */
#define KVP__RR_PREFIX_MAX 64u          /* longest key prefix */
#define KVP__RR_GID_BYTES  8u           /* a worker's fleet-wide id */

struct redisContext;
struct redisReply;

struct kvp__rr {
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

/* Make r's store from cfg (cfg->url not NULL) and try to connect once (a failure only
 * starts the retry pause). Returns KVP_OK with r->rr set; KVP_EINVAL (a field out of
 * range, a url or key prefix that does not parse); KVP_ENOMEM. */
int kvp__rr_new(kvp_router *r, const kvp_router_redis *cfg);

/* Close the connection and free the store. Accepts NULL. */
void kvp__rr_free(kvp__rr *rr);

/* kvp_router_apply_many with a store (r->rr set; items not NULL when n > 0): each item
 * applied locally as without a store, then the ones the local index accepted in one FCALL.
 * Returns as kvp_router_apply_many. */
int kvp__rr_apply(kvp_router *r, kvp_router_item *items, size_t n);

/* kvp_router_score (hashes NULL) or kvp_router_score_hashes (hashes set, tokens unused)
 * with a store; arguments checked by the caller. Returns as those calls. */
int kvp__rr_score(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens, size_t n_tokens,
                  const uint64_t *hashes, size_t n_hashes, kvp_router_row *rows, size_t cap,
                  size_t *n_rows);

/* kvp_router_mark_stale, _resync or _worker_remove (op) with a store: the local call, then
 * the same in Redis when the local one succeeded. Returns the local call's code. */
int kvp__rr_worker_op(kvp_router *r, uint32_t id, int op);

/* The store's fields of kvp_router_stats. Cannot fail. */
void kvp__rr_stats(kvp__rr *rr, kvp_router_stats *st);

/* The store's invariant checker (kvprefix_check in router_redis.lua): every key of r's
 * prefix, walked with KEYS (tests and debugging only). Returns KVP_OK, KVP_ECORRUPT (*why:
 * a static description), KVP_EIO (Redis failed: counted as any failure), KVP_ENOMEM;
 * KVP_EINVAL for a router without a store. */
int kvp__rr_check(kvp_router *r, const char **why);

#else

static inline int kvp__rr_new(kvp_router *r, const kvp_router_redis *cfg)
{
    (void)r;
    (void)cfg;
    return KVP_ENOTSUP;
}

static inline void kvp__rr_free(kvp__rr *rr)
{
    (void)rr;
}

static inline int kvp__rr_apply(kvp_router *r, kvp_router_item *items, size_t n)
{
    (void)r;
    (void)items;
    (void)n;
    return KVP_ENOTSUP;
}

static inline int kvp__rr_score(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens,
                                size_t n_tokens, const uint64_t *hashes, size_t n_hashes,
                                kvp_router_row *rows, size_t cap, size_t *n_rows)
{
    (void)r;
    (void)ns;
    (void)tokens;
    (void)n_tokens;
    (void)hashes;
    (void)n_hashes;
    (void)rows;
    (void)cap;
    (void)n_rows;
    return KVP_ENOTSUP;
}

static inline int kvp__rr_worker_op(kvp_router *r, uint32_t id, int op)
{
    (void)r;
    (void)id;
    (void)op;
    return KVP_ENOTSUP;
}

static inline void kvp__rr_stats(kvp__rr *rr, kvp_router_stats *st)
{
    (void)rr;
    (void)st;
}

static inline int kvp__rr_check(kvp_router *r, const char **why)
{
    (void)r;
    (void)why;
    return KVP_EINVAL;
}

#endif /* KVP_HAVE_REDIS */

#endif /* KVP_EVENTS_ROUTER_REDIS_H */
