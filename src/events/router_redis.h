/*
 * router_redis.h - the transport of the router index's Redis store (router_redis.c): the
 * store's struct, its configuration and connection, commands built in one buffer and run
 * in one pipeline with a deadline. The store's operations over the index are
 * router_redis_ops.h's; this layer calls none of them. Nothing here is installed or
 * exported.
 *
 *   kvp__rr
 *    |- base            the store interface (router_store.h): ops, the router's index
 *    `- the transport   one hiredis connection under a mutex, its address, key prefix,
 *                       timeouts, the retry pause and the counters
 *
 * Locks: router_store.h's protocol. mu is this store's mutex (lock 1): taken before the
 * index lock, never after; the index lock is never held during network I/O. The counters
 * are atomics, read by stats without the mutex.
 *
 * Compiled only with hiredis (KVP_HAVE_REDIS); router_redis_ops.h has the stubs of a build
 * without it.
 */
#ifndef KVP_EVENTS_ROUTER_REDIS_H
#define KVP_EVENTS_ROUTER_REDIS_H

#include "router_store.h"

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

/* Configure rr from cfg (cfg->url not NULL) and try to connect once (a failure only starts
 * the retry pause). rr zeroed but for its mutex and base. Returns KVP_OK; KVP_EINVAL (a
 * field out of range, a url or key prefix that does not parse); KVP_ENOMEM. Whatever it
 * returns, kvp__rr_conn_close frees what it made. */
int kvp__rr_conn_open(kvp__rr *rr, const kvp_router_redis *cfg);

/* Close the connection and free the address strings. Cannot fail. */
void kvp__rr_conn_close(kvp__rr *rr);

#endif /* KVP_HAVE_REDIS */

#endif /* KVP_EVENTS_ROUTER_REDIS_H */
