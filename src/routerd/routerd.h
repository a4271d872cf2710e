/*
 * routerd.h - `kvprefix router`, the subscriber daemon (docs/routing.md, "The router
 * daemon"): what its files share.
 *
 *   routerd.c   options, start-up, signals, shut-down (rd_main)
 *   rd_spec.c   --engine specs and the --config JSON file -> rd_source list
 *   rd_events.c the event thread: SUB sockets, decode, kvp_router_apply, gaps -> replay
 *   rd_http.c   libmicrohttpd: POST /score, GET /metrics, GET /healthz (rd_http.h: the
 *               request handling without a socket, per-connection buffers)
 *   rd_req.c    the /score body's push scanner (rd_req.h); rd_limits.h: limits, histograms
 *   rd_redis.c  --redis: the key prefix's shape, the store's state as log lines, metrics
 *   rd_log.c    log lines with levels, text or logfmt (--log-format, --log-level)
 *   rd_load.c   workers' loads (scraped, pushed, per request) and the load-aware ranking
 *   rd_scrape.c the scrape thread: engines' Prometheus /metrics over plain HTTP
 *
 * Threads. One event thread owns every ZeroMQ socket and is the only writer of the index
 * (kvp_router) and of the daemon's counters; libmicrohttpd's threads score (the router is
 * thread-safe) and read the counters. rd_daemon.lock guards the counters and the worker
 * table (rd_worker entries are added, never removed, so a pointer taken under the lock
 * stays valid until rd_events_free). A /score takes its rows' engine ids and view from the
 * score call itself (kvp_router_score_v2), not from the worker table or the counters.
 *
 * Names: rd_ (this folder), cli_ (common/), kvp_ (the library's public API only).
 */
#ifndef CLI_ROUTERD_H
#define CLI_ROUTERD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvprefix_events.h"
#include "rd_limits.h"

/* Engine ids and endpoints longer than this are refused (usage). */
#define RD_NAME_MAX 255u
/* Most engine endpoints (after dp expansion) the daemon subscribes to. */
#define RD_MAX_SOURCES 1024u
/* Live batches held per worker while its replay runs; beyond, they are dropped (the
 * next live batch shows a gap again, which the next replay fills). */
#define RD_QUEUE_MAX 4096u

/* Why a message was refused before reaching the index (rd_source.n_bad[]). */
enum {
    RD_BAD_FRAMES = 0,  /* not 3 frames, or a sequence frame that is not 8 bytes */
    RD_BAD_TOPIC = 1,   /* engine id from the topic, and the topic is not kv@<pod>@<model> */
    RD_BAD_PAYLOAD = 2, /* kvp_kv_decode refused the payload */
    RD_BAD_BATCH = 3,   /* kvp_router_apply refused the batch (KVP_EINVAL) */
    RD_BAD_RANK = 4,    /* the batch names a dp rank its endpoint does not declare */
    RD_BAD_LIMIT = 5,   /* the endpoint is past its worker or block limit (rd_limits) */
    RD_BAD_KINDS = 6
};

/* One endpoint the daemon subscribes to (one --engine, or one dp rank of it). */
typedef struct rd_source {
    char *engine;        /* engine id, or NULL: taken from each message's topic (llm-d) */
    char *endpoint;      /* PUB endpoint of the engine */
    char *replay;        /* ROUTER replay endpoint, or NULL (gaps cannot be filled) */
    char *topic;         /* subscription prefix ("" = everything) */
    int64_t dp_rank;     /* rank of batches that carry none */
    bool bind;           /* bind the SUB socket (publishers connect) instead of connecting */
    char *metrics;       /* the engine's Prometheus URL (metrics=, on its rank-0 source only),
                            or NULL: not scraped */
    uint64_t dp_size;    /* data-parallel size of the engine (its ranks' sources), >= 1 */
    void *sub;           /* the SUB socket (event thread only) */
    uint64_t n_messages; /* messages received */
    uint64_t n_bad[RD_BAD_KINDS]; /* messages refused, by reason */
    uint64_t n_unlogged;          /* refusals since the last log line */
    int64_t last_log_ms;          /* when the last refusal was logged (monotonic ms) */
} rd_source;

/* A queued live batch (while the worker's replay runs). */
typedef struct rd_item {
    uint64_t seq;    /* its sequence number */
    kvp_kv_batch *b; /* owned by the queue */
} rd_item;

/* The load table (rd_load.c), opaque to the other files. */
typedef struct rd_loads rd_loads;

/* One worker the daemon has seen: (engine id, dp rank) on one source. */
typedef struct rd_worker {
    rd_source *src;          /* where its batches come from */
    char *engine;            /* engine id (owned) */
    int64_t dp_rank;         /* data-parallel rank */
    uint32_t id;             /* kvp_router worker id */
    bool has_seen;           /* seen_seq and seen_ts are valid */
    uint64_t seen_seq;       /* highest sequence number seen since the last restart */
    double seen_ts;          /* latest ts seen since the last restart */
    void *dealer;            /* DEALER of the replay in flight, NULL when none */
    int64_t deadline_ms;     /* the replay's deadline (monotonic ms), when dealer */
    uint64_t replay_from;    /* first sequence number asked for, when dealer */
    uint64_t replay_n;       /* replies received in the replay in flight */
    bool replay_done;        /* a replay finished since the last progress */
    uint64_t replay_done_at; /* `expected` when it finished, valid when replay_done */
    rd_item *queue;          /* live batches held while replaying: queue[q_head .. q_n) */
    size_t q_head;           /* first item not yet applied */
    size_t q_n;              /* items stored */
    size_t q_cap;            /* capacity of queue, in items */
    uint64_t n_status[5];    /* batches by kvp_router_apply status (index KVP_ROUTER_*) */
    uint64_t n_replays_ok;   /* replays that filled their gap */
    uint64_t n_replays_fail; /* replays that could not (then marked stale) */
    uint64_t n_replayed;     /* batches received from replays */
    uint64_t n_stale_marks;  /* times marked stale */
    uint64_t n_queue_drops;  /* live batches dropped while the queue was full */
    uint64_t n_key_checked;  /* engine-hash mode: blocks whose engine key was recomputed */
    uint64_t n_key_mismatch; /* of those, blocks whose key differed from the engine's */
    const char *key_likely;  /* the first mismatch's likely cause (static), or NULL */
    uint64_t n_blocks;       /* blocks held after its last storing batch (--endpoint-blocks) */
} rd_worker;

/* The daemon. */
typedef struct rd_daemon {
    kvp_router *router;       /* the index */
    kvp_config hash;          /* hash fields of every worker (--hash..., --block-size) */
    int index_by;             /* KVP_ROUTER_INDEX_* (--index-by; default tokens, engine-hash
                                 with --redis) */
    uint64_t token_seed;      /* --token-seed: the seed of the router's own xxh3 keys */
    rd_source *sources;       /* n_sources entries */
    size_t n_sources;         /* entries in sources */
    int replay_timeout_ms;    /* bound on one replay (request to end marker) */
    size_t max_body_bytes;    /* largest /score body accepted */
    void *zmq_ctx;            /* ZeroMQ context (event thread's sockets) */
    atomic_bool stop;         /* set by the main thread: the event thread returns */
    pthread_mutex_t lock;     /* guards the counters and the worker table below */
    rd_worker **workers;      /* n_workers entries, in creation order */
    size_t n_workers;         /* entries in workers */
    size_t cap_workers;       /* capacity of workers */
    uint64_t n_lookups;       /* /score requests answered */
    uint64_t n_lookup_blocks; /* full prompt blocks of those requests */
    uint64_t n_hit_blocks;    /* blocks of the best worker of each request */
    uint64_t n_http_errors;   /* requests answered 4xx */
    kvp_router_redis redis;   /* --redis...: url NULL when the index is in memory only */
    int redis_state;          /* event thread: RD_REDIS_* last logged */
    uint64_t redis_lost;      /* event thread: n_redis_lost last logged */
    uint64_t redis_reseeds;   /* event thread: n_redis_reseeds last logged */
    int64_t redis_check_ms;   /* event thread: when the store was last checked (monotonic) */

    /* Load-aware ranking (rd_load.c, rd_scrape.c). */
    rd_loads *loads;             /* workers' loads, scraped or pushed (own lock) */
    kvp_router_rank_config rank; /* --overlap-weight, --load-cap (start stays 0) */
    int scrape_interval_ms;      /* --scrape-interval: period of the metrics scrapes */
    int load_ttl_ms;             /* --load-ttl: a load older than this is unknown (0: never) */
    void *scraper;               /* the scrape thread (rd_scrape.c), NULL when none runs */
    rd_limits lim;               /* limits as a network service (rd_limits.h) */
    rd_hist score_hist;          /* the daemon's own time per /score (rd_http.c) */
    rd_hist lag_hist;            /* engine stamp of a batch -> applied (rd_events.c) */
    uint64_t n_http_timeouts;    /* requests cut at their deadline (under lock) */
    uint64_t n_http_busy;        /* /score refused: the body budget was spent (under lock) */

    /* Prompts as text (rd_text.c). */
    struct rd_text *text;   /* --tokenizer / --template table (written at start only) */
    uint64_t n_text_scored; /* /score requests in text mode answered 200 (under lock) */
    uint64_t n_text_failed; /* text requests refused after their body (under lock) */
    uint64_t n_text_tokens; /* tokens the daemon made from text (under lock) */
} rd_daemon;

/* What the daemon last said about the shared store (rd_daemon.redis_state). */
enum {
    RD_REDIS_UNKNOWN = 0, /* nothing yet: no call has reached Redis or failed */
    RD_REDIS_UP = 1,      /* the last call that tried Redis succeeded: the shared view */
    RD_REDIS_DOWN = 2     /* it failed: scores come from the local view */
};

/* The subcommand (routerd.c): argv[0] is "router". Returns the exit status. */
int rd_main(int argc, char **argv);

/* rd_spec.c ------------------------------------------------------------------------------ */

/* Parse one `ID=ENDPOINT[,replay=EP][,topic=PREFIX][,dp=N][,bind]` and append its sources
 * to d (N of them with dp=N: rank r at a tcp port + r, as vLLM numbers them). where names
 * the spec in messages. Returns 0, or non-zero after writing a message to err. */
int rd_spec_add(rd_daemon *d, const char *spec, char *err, size_t err_size);

/* Read the JSON file `{"engines": [{"id", "endpoint", "replay", "topic", "dp", "bind"}]}`
 * and append its sources. Returns 0, or non-zero after writing "FILE:LINE: ..." or
 * "FILE: engines[i]: ..." to err. */
int rd_config_load(rd_daemon *d, const char *path, char *err, size_t err_size);

/* Check the sources as a whole (ids unique per endpoint). Returns 0 or non-zero with err. */
int rd_spec_check(const rd_daemon *d, char *err, size_t err_size);

/* Free the sources' strings and the array. Cannot fail. */
void rd_spec_free(rd_daemon *d);

/* rd_events.c ---------------------------------------------------------------------------- */

/* Open every SUB socket (connect or bind, subscribe). Returns 0, or non-zero with a
 * message in err (a bad endpoint, a bind that failed). */
int rd_events_open(rd_daemon *d, char *err, size_t err_size);

/* One message received on src: frames[i] holds sizes[i] bytes, n frames (at most 4 given;
 * n counts them all). Counted, decoded, checked against the endpoint's identity and limits,
 * applied or refused. Event thread only. Cannot fail (refusals are counted and logged). */
void rd_events_intake(rd_daemon *d, rd_source *src, const void *const *frames, const size_t *sizes,
                      int n);

/* The event thread's body (arg: the rd_daemon): polls until d->stop. */
void *rd_events_run(void *arg);

/* Close the sockets, free the workers and the context. Cannot fail. */
void rd_events_free(rd_daemon *d);

/* Log an info line (rd_logl with RD_LOG_INFO; rd_log.c). */
void rd_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Monotonic milliseconds. Cannot fail. */
int64_t rd_now_ms(void);

/* rd_redis.c ----------------------------------------------------------------------------- */

/* Whether key prefix p is 1..64 of [A-Za-z0-9_.:-] (kvp_router_redis.key_prefix). */
bool rd_redis_prefix_ok(const char *p);

/* The event thread's periodic look at the store (at most every 100 ms): compare the
 * router's stats with what was last logged and log each transition (reachable,
 * unreachable, worker state lost). Does nothing without --redis. Cannot fail. */
void rd_redis_tick(rd_daemon *d);

/* Write the store's metric families (kvprefix_router_redis_*, _fallback_*) from st; nothing
 * without --redis. Cannot fail. */
void rd_metrics_redis(const kvp_router_stats *st, FILE *f);

/* rd_http.c ------------------------------------------------------------------------------ */

/* Start the HTTP server on addr:port (port 0: any free port) with n_threads threads;
 * *handle receives it and *bound_port the port. Returns 0, or non-zero with err. */
int rd_http_start(rd_daemon *d, const char *addr, uint16_t port, unsigned n_threads, void **handle,
                  uint16_t *bound_port, char *err, size_t err_size);

/* Stop the server started by rd_http_start (waits for its threads). Accepts NULL. */
void rd_http_stop(void *handle);

/* Write the Prometheus text exposition (format 0.0.4) of d to f. Returns 0, or non-zero
 * when the router's stats could not be read. */
int rd_metrics_write(rd_daemon *d, FILE *f);

/* rd_log.c ------------------------------------------------------------------------------- */

/* Log levels, least severe first. */
enum { RD_LOG_DEBUG = 0, RD_LOG_INFO = 1, RD_LOG_WARN = 2, RD_LOG_ERROR = 3 };

/* Set the format ("text": `kvprefix router: [LEVEL: ]message`; "logfmt": `ts=... level=...
 * msg="..."`) and the least level printed ("debug", "info", "warn", "error"); NULL keeps
 * the current one. Call before any thread starts. Returns 0, or non-zero with err. */
int rd_log_config(const char *format, const char *level, char *err, size_t err_size);

/* Print one log line at level to stderr (control characters escaped; one write, so
 * threads' lines do not interleave). Cannot fail. */
void rd_logl(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* rd_load.c ------------------------------------------------------------------------------ */

/* Where a worker's load came from (rd_load_set). */
enum { RD_LOAD_SCRAPE = 0, RD_LOAD_PUSH = 1, RD_LOAD_SOURCES = 2 };

/* One ranked row of a /score answer. */
typedef struct rd_rank {
    kvp_router_row row; /* the router's row */
    const char *engine; /* the worker's engine id (owned by the router until it is freed) */
    double load;        /* the load ranked with (0 when unknown), set by rd_rank_rows */
    bool load_known;    /* a fresh load was known for the worker (scraped, pushed, given) */
    bool over_cap;      /* above --load-cap x the mean load: ranked after the others */
} rd_rank;

/* What a /score request adds to the ranking (filled by whichever parser reads the body;
 * rd_req.c's scanner, through rd_http.c's rd_rank_req). Strings are owned by the caller and
 * must outlive rd_rank_rows. A name is "ENGINE" (every dp rank) or "ENGINE/RANK". */
typedef struct rd_score_opts {
    const char **workers;    /* candidate workers ("workers": [...]); NULL: all */
    size_t n_workers;        /* entries in workers */
    const char **load_names; /* loads given in the request ("loads": {NAME: LOAD}), which
                                override the table's for this request */
    double *load_values;     /* n_loads values, each >= 0 and finite */
    size_t n_loads;          /* entries in load_names and load_values */
} rd_score_opts;

/* Create the table into d->loads. Returns 0, non-zero when out of memory. */
int rd_loads_new(rd_daemon *d);

/* Free the table (and any rd_score_opts arrays are the caller's). Accepts NULL. */
void rd_loads_free(rd_loads *t);

/* Record a worker's figures (running and waiting requests, KV usage 0..1 or negative when
 * unknown) from source RD_LOAD_*, now. Returns 0, non-zero when out of memory or the table
 * is full (RD_MAX_LOADS workers). Thread-safe. */
int rd_load_set(rd_daemon *d, const char *engine, int64_t dp_rank, double running, double waiting,
                double kv_usage, int source);

/* POST /load: body[0 .. n) is {"engine", "dp_rank", "running", "waiting", "kv_usage"} or
 * {"loads": [such objects]}. Returns 0, or non-zero with a message in err (bad JSON, a
 * missing or negative figure, an unknown member). */
int rd_load_push(rd_daemon *d, const char *body, size_t n, char *err, size_t err_size);

/* Rank the rows rk[0 .. *n) (sorted by the index's order) for a prompt of prompt_blocks
 * full blocks: drop rows that are not candidates of o (o may be NULL), attach each row's
 * load, and reorder them with kvp_router_rank (d->rank; ties keep the given order).
 * *n becomes the rows kept. Returns KVP_OK or KVP_ENOMEM / KVP_EINVAL (rows untouched). */
int rd_rank_rows(rd_daemon *d, const rd_score_opts *o, size_t prompt_blocks, rd_rank *rk,
                 size_t *n);

/* Write the load families (kvprefix_router_worker_load, ..._scrapes_total) to f. Cannot
 * fail. */
void rd_metrics_load(rd_daemon *d, FILE *f);

/* rd_scrape.c ---------------------------------------------------------------------------- */

/* Start the scrape thread when a source has a metrics URL (d->scraper set). Returns 0 or
 * non-zero with err. */
int rd_scrape_start(rd_daemon *d, char *err, size_t err_size);

/* Stop and join the scrape thread. Accepts d->scraper NULL. */
void rd_scrape_stop(rd_daemon *d);

/* Parse a Prometheus text exposition text[0 .. n) for an engine of dp_size ranks: per rank,
 * running and waiting requests and KV usage (vLLM's vllm:num_requests_running,
 * vllm:num_requests_waiting, vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc;
 * SGLang's sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage), summed over
 * the series of a rank (label engine="R" or dp_rank="R"; none: rank default_rank).
 * out[r * 3 + {0,1,2}] for r < dp_size (KV usage -1 when absent), found[r] whether any
 * series named rank r. Returns the number of samples used. Cannot fail. */
size_t rd_scrape_parse(const char *text, size_t n, uint64_t dp_size, int64_t default_rank,
                       double *out, bool *found);

/* Fetch http://HOST[:PORT][/PATH] (HTTP/1.0, plain socket, IPv4 or [IPv6]) within
 * timeout_ms; the body (at most max_bytes) into *body (malloc'ed, NUL-terminated), its
 * length into *n. Returns 0, or non-zero with err (refused, timeout, not 200, too big). */
int rd_http_get(const char *url, int timeout_ms, size_t max_bytes, char **body, size_t *n,
                char *err, size_t err_size);

#endif /* CLI_ROUTERD_H */
