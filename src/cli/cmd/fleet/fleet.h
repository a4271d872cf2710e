/*
 * fleet.h - what the parts of `kvprefix fleet` share: the request log held in memory
 * (fleet_log.c), the consistent-hash ring (fleet_ring.c), the fleet simulation
 * (fleet_sim.c), the options (fleet.c) and the report (fleet_report.c).
 *
 * `kvprefix fleet` replays a request log against a fleet of N replicas, each its own
 * kvp_cache of the same capacity, under a routing policy, with a simple time model
 * (docs/routing.md, "Fleet simulation"):
 *
 *   log ──> fl_log (arrival, prompt, keys) ──> fl_sim_run(N, policy) ──> fl_result ──> report
 *              keys computed once                 N kvp_caches, one event queue
 *
 * Time is in integer nanoseconds (fl_time), so hand-computed expectations are exact. Every
 * modelled instant stays below FL_TIME_MAX; a log or model that would pass it is refused as
 * bad input rather than wrapped.
 */
#ifndef CLI_FLEET_H
#define CLI_FLEET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fl_tiers.h"
#include "hashopt.h"
#include "inopts.h"
#include "kvprefix.h"
#include "kvprefix_events.h"

typedef int64_t fl_time; /* modelled nanoseconds since the log's time 0 */

#define FL_TIME_MAX       ((fl_time)1 << 54)   /* latest modelled instant: about 208 days */
#define FL_MAX_TOKENS     (UINT64_C(1) << 24)  /* longest prompt or output of one request */
#define FL_MAX_REPLICAS   1024u                /* replicas in one fleet */
#define FL_MAX_COUNTS     16u                  /* replica counts in one run (--replicas) */
#define FL_MAX_CONCURRENT 256u                 /* requests one replica serves at once */
#define FL_MAX_CAPACITY   (UINT64_C(1) << 22)  /* blocks per replica */
#define FL_MAX_FLEET      (UINT64_C(1) << 26)  /* blocks over all replicas of one fleet */
#define FL_MAX_COST_NS    UINT64_C(1000000000) /* largest per-token cost: 1 s */

enum {
    FL_OK = 0,
    FL_EINPUT = -1,   /* the log or the model is unusable (message says why) */
    FL_ENOMEM = -2,   /* out of memory */
    FL_EINTERNAL = -3 /* a check failed: a bug in the tool or the library */
};

/* Routing policies, in the order the report lists them. */
enum {
    FL_ROUND_ROBIN = 0, /* request i goes to replica i mod N */
    FL_RANDOM,          /* uniform, from a seeded splitmix64 stream */
    FL_LEAST_LOADED,    /* least outstanding work */
    FL_AFFINITY,        /* consistent hashing of the first block (virtual nodes) */
    FL_CACHE_AWARE,     /* longest cached prefix; ties by load */
    FL_CACHE_CAP,       /* cache-aware among replicas not over the load cap */
    FL_N_POLICIES
};

/* The policy's name as the tool spells it ("round-robin", ...); NULL when out of range. */
const char *fl_policy_name(int policy);

/* ---- the log in memory (fleet_log.c) --------------------------------------------------- */

/* One request as the simulation sees it. Offsets index the arrays of its fl_log. */
typedef struct fl_req {
    fl_time arrival;   /* when it reaches the router */
    uint64_t line_no;  /* 1-based line in the log, for messages */
    uint32_t n_prompt; /* prompt tokens, 1 .. FL_MAX_TOKENS */
    uint32_t n_output; /* output tokens the model decodes, 0 .. FL_MAX_TOKENS */
    uint32_t n_keys;   /* full prompt blocks: n_prompt / block_size */
    uint32_t n_ids;    /* Mooncake: hash ids (ceil or floor of n_prompt / block_size); else 0 */
    size_t data;       /* token logs: offset of the prompt in tokens[]; Mooncake: in ids[] */
    size_t key;        /* offset of its n_keys block keys in keys[] */
    uint32_t ns;       /* its namespace: index into the namespace table (0: all absent) */
    kvp_key root;      /* the namespace root kvp_cache_keys returned */
    uint64_t affinity; /* without a full block, what the affinity ring hashes: a hash of
                          the partial first block (see fl_model.affinity_blocks) */
} fl_req;

/* How a log is read and keyed. */
typedef struct fl_log_config {
    const char *path;        /* the log; "-" for standard input */
    const in_opts *in;       /* format, block sizes, line limit, tokenizer (loaded) */
    bool sort;               /* stable sort by arrival instead of refusing disorder */
    fl_time interarrival;    /* gap after the previous arrival for a line without a
                                timestamp (the first such line arrives at 0) */
    uint32_t default_output; /* output tokens of a token-log or OpenAI line that gives
                                none (Mooncake lines always give output_length) */
    const kvp_config *cache; /* hash fields every replica shares (an explicit key) */
} fl_log_config;

typedef struct fl_log fl_log;

/* Read the whole log and compute every request's keys once. Returns FL_OK with *out (free
 * with fl_log_free), or FL_EINPUT / FL_ENOMEM with "FILE:LINE: what is wrong" (or "FILE:
 * ...") in err; an empty log (no request) is FL_EINPUT. */
int fl_log_read(const fl_log_config *cfg, fl_log **out, char *err, size_t err_size);

/* The log's invariants: every request's offsets inside their arrays, each stored key,
 * token or id owned by exactly one request, n_keys == n_prompt / block_size, lengths in
 * their limits, arrivals non-decreasing. Returns true when they hold. */
bool fl_log_check(const fl_log *log);

void fl_log_free(fl_log *log);

size_t fl_log_n(const fl_log *log); /* requests, in arrival order */
const fl_req *fl_log_req(const fl_log *log, size_t i);
int fl_log_format(const fl_log *log);             /* LOG_* of its lines */
uint32_t fl_log_block_size(const fl_log *log);    /* tokens per block of that format */
uint64_t fl_log_prompt_tokens(const fl_log *log); /* prompt tokens of all requests */
uint32_t fl_log_max_prompt(const fl_log *log);    /* longest prompt */
uint64_t fl_log_n_lines(const fl_log *log);       /* lines read */
bool fl_log_all_timestamps(const fl_log *log);    /* every line gave its arrival */
const in_count *fl_log_count(const fl_log *log);  /* how OpenAI bodies were counted */
const kvp_key *fl_log_keys(const fl_log *log, const fl_req *q); /* q's n_keys keys */

/* The namespace of q: its fields point into the log (valid until fl_log_free). */
kvp_namespace fl_log_ns(const fl_log *log, const fl_req *q);

/* The prompt tokens of q: the log's own for token logs; for a Mooncake line, written into
 * buf (n_prompt entries, which must hold fl_log_max_prompt) from its hash ids: block i
 * starts with the id's low and high 32 bits (low only when blocks are 1 token), the rest
 * are 0, so equal ids up to block i give equal tokens up to block i. buf must come zeroed
 * from calloc and be written only by this function (only block heads are ever written).
 * Cannot fail. */
const uint32_t *fl_log_tokens(const fl_log *log, const fl_req *q, uint32_t *buf);

/* ---- the consistent-hash ring (fleet_ring.c) ------------------------------------------- */

typedef struct fl_ring fl_ring;

/* A ring of n_replicas replicas with n_vnodes points each: point v of replica r sits at
 * fl_mix64(seed ^ (r << 32 | v)). Returns NULL on out of memory or a zero count. */
fl_ring *fl_ring_new(uint32_t n_replicas, uint32_t n_vnodes, uint64_t seed);

/* The replica owning h: the first point at or after h clockwise (wrapping to the first
 * point); ties between equal points go to the lower replica. Cannot fail. */
uint32_t fl_ring_pick(const fl_ring *ring, uint64_t h);

/* Points sorted and each replica holding exactly n_vnodes of them. */
bool fl_ring_check(const fl_ring *ring);

void fl_ring_free(fl_ring *ring);

/* splitmix64's output function (a bijection of 64 bits). Cannot fail. */
uint64_t fl_mix64(uint64_t x);

/* ---- the router index (fleet_index.c) -------------------------------------------------- */

/* Where the cache-aware policies learn what each replica holds (--index). */
enum {
    FL_INDEX_ORACLE = 0, /* ask every replica's kvp_cache directly (kvp_lookup_keys) */
    FL_INDEX_MEMORY,     /* a kvp_router fed by the replicas' events, in memory */
    FL_INDEX_REDIS,      /* the same router with its shared store on Redis */
    FL_N_INDEX
};

/* The index mode's name as the tool spells it ("oracle", ...); NULL when out of range. */
const char *fl_index_name(int mode);

/* How one simulation's router index is made. */
typedef struct fl_index_config {
    int mode;               /* FL_INDEX_* (ORACLE: no index is made) */
    const char *redis_url;  /* FL_INDEX_REDIS: the server ("redis://HOST:PORT", ...) */
    const char *key_prefix; /* FL_INDEX_REDIS: this simulation's keys (1..64 of
                               [A-Za-z0-9_.:-]) */
    fl_time event_delay;    /* a step's events reach the index this much later (>= 0) */
} fl_index_config;

/* What the index did during one simulation, and how long it took. The times are real
 * (CLOCK_MONOTONIC on this machine), not modelled. */
typedef struct fl_index_stats {
    int mode;                    /* FL_INDEX_* */
    uint64_t n_scores;           /* routing decisions that asked for every replica's prefix
                                    (a score: the oracle's N kvp_lookup_keys calls, or one
                                    kvp_router_score_hashes call) */
    uint64_t score_p50_ns;       /* wall time of a score: nearest-rank p50 */
    uint64_t score_p99_ns;       /* ... p99 */
    uint64_t score_max_ns;       /* ... the slowest */
    uint64_t score_ns;           /* ... summed over all */
    uint64_t n_applies;          /* kvp_router_apply calls (one batch each) */
    uint64_t apply_ns;           /* their wall time, summed */
    uint64_t n_events;           /* wire events applied (after merging chains) */
    uint64_t n_blocks;           /* block hashes in them (stored and removed) */
    uint64_t n_redis_calls;      /* kvp_router_stats: round trips to Redis, all calls */
    uint64_t n_score_calls;      /* of which made by scores */
    uint64_t n_apply_calls;      /* of which made by applies */
    uint64_t n_redis_errors;     /* Redis calls that failed */
    uint64_t n_fallback_scores;  /* scores answered from the local view instead of Redis */
    uint64_t n_fallback_applies; /* batches applied to the local view only */
    double seconds;              /* wall time of the whole simulation */
} fl_index_stats;

typedef struct fl_index fl_index;

/* Is --index memory|redis available in this build (libkvprefix-events linked)? */
bool fl_index_available(void);

/* A router index for n_replicas replicas whose blocks hold block_size tokens: worker i is
 * engine "replica-<i>", dp_rank 0. Returns FL_OK with *out (free with fl_index_free), or
 * FL_EINPUT (the router refuses the configuration, e.g. a url it cannot parse, or this
 * build has no Redis support), FL_ENOMEM, FL_EINTERNAL, with a message in err. */
int fl_index_new(const fl_index_config *cfg, uint32_t n_replicas, uint32_t block_size,
                 fl_index **out, char *err, size_t err_size);

/* Point kc's event callback at replica r's event collector. Cannot fail. */
void fl_index_attach(fl_index *x, uint32_t r, kvp_config *kc);

/* End of a simulation step at time now: each replica's events of the step become one
 * batch (its next sequence number), due at now + event_delay. Returns FL_OK, or FL_ENOMEM
 * (here or lost inside the callback) with a message in err. */
int fl_index_step(fl_index *x, fl_time now, char *err, size_t err_size);

/* Apply, in order, every batch due at or before now. Returns FL_OK, or FL_ENOMEM /
 * FL_EINTERNAL (the router refused a batch) with a message in err. */
int fl_index_sync(fl_index *x, fl_time now, char *err, size_t err_size);

/* Score the block hashes keys[0 .. n_keys).lo: cached[r] = replica r's longest held
 * prefix, in blocks (0 for a stale worker); *ns = the wall time of the router's score call
 * alone. Returns FL_OK, or FL_ENOMEM / FL_EINTERNAL with a message in err (cached
 * unspecified). */
int fl_index_score(fl_index *x, const kvp_key *keys, uint32_t n_keys, uint32_t *cached,
                   uint64_t *ns, char *err, size_t err_size);

/* Fill the apply and Redis figures of *st (the score figures are the caller's). Returns
 * FL_OK or FL_EINTERNAL. */
int fl_index_stats_get(fl_index *x, fl_index_stats *st);

/* The router's own invariant checker (kvp_router_check) and the collector's. Returns true
 * when they hold. */
bool fl_index_check(fl_index *x);

/* Remove every worker (and so, with Redis, this simulation's keys), then free. Accepts
 * NULL. */
void fl_index_free(fl_index *x);

/* ---- the simulation (fleet_sim.c) ------------------------------------------------------ */

/* The time model (docs/routing.md). */
typedef struct fl_model {
    uint32_t concurrency;     /* requests one replica serves at once (FIFO beyond) */
    uint64_t prefill_ns;      /* per uncached prompt token */
    uint64_t decode_ns;       /* per output token */
    double load_cap;          /* cache-aware-cap: skip replicas whose outstanding work
                                 exceeds load_cap x the fleet mean (>= 1) */
    double overlap_weight;    /* cache-aware policies: 0 (default) cache first; > 0 the
                                 cost overlap_weight x blocks to prefill + outstanding work
                                 (ns per block; kvp_router_rank_config.overlap_weight) */
    uint32_t vnodes;          /* affinity: ring points per replica */
    uint32_t affinity_blocks; /* affinity: the prefix hashed, in blocks (>= 1): the key of
                                 block min(affinity_blocks, n_keys) - 1, which names the
                                 whole prefix up to it; fl_req.affinity without a full block */
    uint64_t random_seed;     /* random: the splitmix64 stream's seed; also seeds the ring */
} fl_model;

typedef struct fl_sim_config {
    const char *name;        /* the log's name in "NAME:LINE:" messages ("-": <stdin>) */
    uint32_t n_replicas;     /* 1 .. FL_MAX_REPLICAS */
    int policy;              /* FL_* */
    uint32_t capacity;       /* blocks per replica */
    const kvp_config *cache; /* hash fields and block size of every replica */
    fl_model model;
    bool record;                  /* keep per-request figures (fl_result.per_req) */
    bool check;                   /* run fl_sim's invariant checker after every event (slow) */
    const fl_index_config *index; /* the cache-aware policies' index; NULL: the oracle */
    fl_tier_sim *tiers;           /* tiers below the GPU pools (fl_tiers.h), or NULL */
} fl_sim_config;

/* What one replica did. */
typedef struct fl_replica_stats {
    uint64_t n_requests;      /* requests it served */
    uint64_t n_prompt_tokens; /* their prompt tokens */
    uint64_t n_hit_tokens;    /* of those, reused from its cache */
    fl_time busy;             /* sum of its requests' service times */
} fl_replica_stats;

/* One request's outcome (when recorded). */
typedef struct fl_req_outcome {
    uint32_t replica; /* where it was routed */
    uint32_t hit;     /* prompt tokens reused (kvp_match.n_tokens_hit at its start) */
    fl_time start;    /* when it started (acquired its blocks) */
    fl_time ttft;     /* start - arrival + prefill */
    bool oversize;    /* more blocks than a replica has: served without the cache */
} fl_req_outcome;

/* The outcome of one fleet and policy. */
typedef struct fl_result {
    int policy;
    uint32_t n_replicas;
    uint64_t n_requests;
    uint64_t n_prompt_tokens;
    uint64_t n_hit_tokens;
    uint64_t n_oversize;        /* requests larger than a replica's pool */
    uint64_t n_block_waits;     /* starts postponed because in-flight requests pinned the pool */
    fl_time ttft_p50, ttft_p99; /* nearest-rank percentiles */
    double ttft_mean;           /* nanoseconds */
    fl_time end;                /* when the last request finished */
    double imbalance;           /* max / mean busy time over replicas (1 when all idle) */
    fl_index_stats index;       /* the index's work and real timings (n_scores 0: the
                                   policy never asked for prefixes) */
    fl_replica_stats *replicas; /* n_replicas entries (owned; fl_result_free) */
    fl_req_outcome *per_req;    /* per request, when recorded; else NULL (owned) */
} fl_result;

/* The decision of least-loaded and the cache-aware policies: kvp_router_rank (the router
 * daemon's ranking) over cached[r] blocks of the prompt's prompt_blocks (ignored for
 * least-loaded: may be NULL) and outstanding work work[r] of replicas 0 .. n-1, with m's
 * load cap (cache-aware-cap) and overlap weight, ties to the first replica after last.
 * scratch has room for n inputs. Writes the pick to *out. Returns FL_OK or FL_EINTERNAL
 * (kvp_router_rank refused the inputs: a negative or non-finite load). */
int fl_rank_pick(const fl_model *m, int policy, uint32_t prompt_blocks, const uint32_t *cached,
                 const double *work, uint32_t n, uint32_t last, kvp_router_rank_input *scratch,
                 uint32_t *out);

/* Simulate the whole log on a fleet. Returns FL_OK with *out filled (free its arrays with
 * fl_result_free); FL_EINPUT (the modelled time passes FL_TIME_MAX, a request the profile
 * refuses), FL_ENOMEM, FL_EINTERNAL, each with a message in err and *out untouched. */
int fl_sim_run(const fl_log *log, const fl_sim_config *cfg, fl_result *out, char *err,
               size_t err_size);

void fl_result_free(fl_result *r);

/* ---- options and report (fleet.c, fleet_report.c) -------------------------------------- */

typedef struct fl_options {
    in_opts in;                     /* --format, --block-size, --tokenizer ... (inopts.h) */
    fl_log_config log;              /* how the log is read (log.in points to in) */
    cli_hash_opts hash;             /* --hash, --hash-key, --vllm-seed, --vocab-size */
    kvp_config cache;               /* hash fields and block size of every replica */
    const char *capacity;           /* --capacity as given */
    const char *model_name;         /* --model for byte capacities, or NULL */
    const char *kv_dtype;           /* --kv-dtype override, or NULL */
    uint32_t counts[FL_MAX_COUNTS]; /* --replicas, increasing, distinct */
    size_t n_counts;
    bool policies[FL_N_POLICIES]; /* --policies */
    fl_model model;               /* the time model's constants */
    fl_index_config index;        /* --index, --redis, --event-delay-ms (key_prefix: per
                                     simulation, made from redis_prefix) */
    bool index_given;             /* --index appeared */
    const char *redis_prefix;     /* --redis-prefix, or NULL for a fresh one per run */
    bool delay_given;             /* --event-delay-ms appeared */
    bool json, csv, check;        /* output format; --check (every event) */
    const char *plot_path;        /* --plot FILE.svg, or NULL */
    const char *output_path;      /* -o FILE, or NULL for standard output */
    fl_tier_opts tiers;           /* --tiers, --shared-tier, --tier-bw, --tier-latency */
} fl_options;

/* What a run produced, for the report. */
typedef struct fl_report {
    const char *input;   /* the log's name as given */
    int format;          /* LOG_* */
    uint32_t block_size; /* tokens per block */
    uint64_t n_requests; /* requests simulated */
    uint64_t n_prompt_tokens;
    uint64_t n_lines;
    uint64_t capacity;     /* blocks per replica */
    uint64_t block_bytes;  /* KV bytes per block with --model, else 0 */
    char model_desc[128];  /* "Llama-3.1-8B, fp16 KV" or "" */
    bool timestamps;       /* every line had one (else some used --interarrival-ms) */
    in_count count;        /* how OpenAI bodies' tokens were counted */
    fl_result *runs;       /* n_counts x FL_N_POLICIES, [count][policy]; unrun: n_replicas 0 */
    char redis_prefix[64]; /* the run's key prefix with --index redis (each simulation
                              appends ":<count index>.<policy>") */
    double seconds;        /* wall time of the whole run */
    double seconds_sim;    /* of which in the simulations */
    fl_tier_report tiers;  /* --tiers, --shared-tier: the runs with them (fl_tiers.h) */
} fl_report;

/* `kvprefix fleet` (fleet.c): argv[0] is "fleet". Returns the exit status (cli.h). */
int fl_main(int argc, char **argv);

/* Print the table, JSON or CSV. Returns 0, or -1 on a write error. */
int fl_report_write(FILE *f, const fl_options *o, const fl_report *r);

/* Write the chart: fleet token hit rate of each policy against the replica count. Returns 0,
 * or -1 with a message in err. */
int fl_plot_write(FILE *f, const fl_options *o, const fl_report *r, char *err, size_t err_size);

#endif /* CLI_FLEET_H */
