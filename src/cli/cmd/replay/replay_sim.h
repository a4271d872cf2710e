/*
 * replay_sim.h - the engine of `kvprefix replay`: one pass over a request log that drives the
 * library's pool and records, for every block access, its LRU stack distance, so that hit
 * rates at any capacity (and the cold-miss ceiling) come out of that single pass.
 *
 * Rules (docs/replay.md): each request looks up its longest cached prefix, then touches every
 * block it caches from the last to the first, so a parent is always at least as recent as
 * its children, and least-recently-used blocks beyond the capacity are evicted. Under these
 * rules LRU has the inclusion property and the cached set is closed under prefixes, so a
 * request hits at capacity C exactly the blocks whose stack distance (distinct blocks touched
 * since its last touch) is below C. The engine stores, per request, the running maximum of
 * those distances along its blocks; rp_sim_eval turns them into the metrics of any capacity.
 *
 * With pool_blocks > 0 every request also goes through kvp_access (token logs) or
 * kvp_access_ids (hash-id traces) on a kvp_cache of that many blocks, and the pool's match is
 * compared with the stack model's on every request (and the eviction count at the end): the
 * figures reported for that capacity are the pool's, checked.
 *
 * Block keys are the configured hash profile's (kvp_hasher): the pool's own hasher when
 * there is a pool, so the model and the pool agree key for key even with a random key. The
 * figures depend on the profile only through key collisions (128-bit keys: none expected).
 */
#ifndef CLI_REPLAY_SIM_H
#define CLI_REPLAY_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix.h"

/* Capacity meaning "unbounded": the cold-miss ceiling. */
#define RP_CAP_INF UINT64_MAX

enum {
    RP_OK = 0,
    RP_EINPUT = -1,   /* the request is malformed; nothing was changed */
    RP_ENOMEM = -2,   /* out of memory; the engine is unusable */
    RP_EINTERNAL = -3 /* the pool and the LRU stack model disagree: a bug */
};

enum { RP_DIM_MODEL = 0, RP_DIM_ADAPTER = 1, RP_DIM_TENANT = 2, RP_N_DIMS = 3 };

typedef struct rp_sim_config {
    uint32_t block_size;    /* tokens per block (token logs) or per hash id (traces) */
    uint64_t seed;          /* xxh3 seed, used when hash is NULL */
    uint32_t pool_blocks;   /* > 0: drive a kvp_cache of this many blocks and cross-check */
    const kvp_config *hash; /* the hash fields (profile, key, seeds, vocab_size) of the keys
                               and the pool, read during rp_sim_new only; NULL: xxh3 with
                               seed */
} rp_sim_config;

/* One request. Exactly one of tokens / hash_ids is non-NULL (tokens may be NULL when
 * n_tokens is 0 only for a trace). Pointers are the caller's, read during rp_sim_add only. */
typedef struct rp_request {
    kvp_namespace ns;         /* model, adapter, tenant, salt */
    const uint32_t *tokens;   /* token log: prompt, then (cache_output) output tokens */
    size_t n_tokens;          /* prompt tokens (token log) */
    size_t n_output_tokens;   /* output tokens following the prompt in tokens[] to cache */
    const uint64_t *hash_ids; /* hash-id trace: one id per block of the prompt */
    size_t n_hash_ids;        /* number of ids */
    uint64_t input_length;    /* hash-id trace: prompt tokens */
    uint64_t line_no;         /* for messages */
} rp_request;

/* Metrics of one capacity. Block counts are over full prompt blocks. */
typedef struct rp_metrics {
    uint64_t capacity;                /* blocks, or RP_CAP_INF */
    uint64_t n_requests;              /* requests replayed */
    uint64_t n_prompt_tokens;         /* prompt tokens */
    uint64_t n_hit_tokens;            /* prefill tokens skipped (at least one token computed) */
    uint64_t n_blocks_full;           /* full prompt blocks */
    uint64_t n_blocks_cached;         /* of those, in the longest cached prefix (uncapped) */
    uint64_t n_blocks_hit;            /* of those, reused (capped so one token is computed) */
    uint64_t n_cold_misses;           /* missed blocks never seen before: no capacity could hit */
    uint64_t n_capacity_misses;       /* missed blocks seen before (evicted since) */
    uint64_t n_stored;                /* blocks newly cached */
    uint64_t n_evicted;               /* cached blocks evicted to make room */
    double mean_hit;                  /* mean of per-request hit fraction (hit / prompt tokens) */
    double p50_hit, p90_hit, p99_hit; /* nearest-rank percentiles of that fraction */
} rp_metrics;

/* The same, per value of one dimension (model, adapter or tenant). */
typedef struct rp_group_metrics {
    uint64_t n_requests;
    uint64_t n_prompt_tokens;
    uint64_t n_hit_tokens;
    uint64_t n_blocks_full;
    uint64_t n_blocks_cached;
    uint64_t n_cold_misses;
} rp_group_metrics;

typedef struct rp_sim rp_sim;

/* Create an engine. Returns NULL with a message in err on a bad config or out of memory. */
rp_sim *rp_sim_new(const rp_sim_config *cfg, char *err, size_t err_size);

/* Replay one request. Returns RP_OK; RP_EINPUT (a hash id that follows a different prefix
 * than where it was first seen, or repeats within the request; too many blocks; a namespace
 * the hash profile cannot express; a token id at or above the vocab_size) with nothing
 * changed; RP_ENOMEM; RP_EINTERNAL. The message, without a "FILE:LINE: " prefix, is in err. */
int rp_sim_add(rp_sim *s, const rp_request *req, char *err, size_t err_size);

/* After the last request (pool mode): compare the pool's eviction count with the model's.
 * Returns RP_OK or RP_EINTERNAL with a message. */
int rp_sim_finish(rp_sim *s, char *err, size_t err_size);

/* Metrics at `capacity` blocks (>= 1, or RP_CAP_INF). groups, when not NULL, holds
 * RP_N_DIMS arrays of rp_sim_n_groups(s, dim) entries each, which are filled in.
 * Returns RP_OK or RP_ENOMEM (scratch for the percentiles). */
int rp_sim_eval(const rp_sim *s, uint64_t capacity, rp_metrics *out, rp_group_metrics **groups);

/* The blocks the last rp_sim_add touched (none when it failed), in prompt order (prompt, then
 * cached output), as dense block numbers 0 .. (number of keys seen - 1): equal numbers are equal
 * keys, and a block's index in the list is its depth (keys name whole prefixes). Sets
 * *blocks to an array owned by the engine, valid until the next rp_sim_add, and returns the
 * count (0 before any request and after a failed one). Cannot fail. For the offline optimum
 * (replay_opt.h). */
size_t rp_sim_last_blocks(const rp_sim *s, const size_t **blocks);

#define RP_SCAN_MAX_CAPS 8 /* capacities one rp_sim_scan counts at once */

/* One request as rp_sim_scan sees it. */
typedef struct rp_scan_req {
    uint64_t n_tokens;                  /* prompt tokens */
    uint32_t n_prompt_full;             /* full prompt blocks */
    uint32_t limit;                     /* most blocks a hit may reuse: (n_tokens - 1) /
                                           block size, so one token is computed */
    uint32_t n_below[RP_SCAN_MAX_CAPS]; /* per capacity: full prompt blocks in the cached
                                           prefix (uncapped by limit), non-decreasing */
} rp_scan_req;

typedef void (*rp_scan_fn)(void *ctx, const rp_scan_req *r);

/* Call fn once per request replayed, in order, with the cached prefix of its prompt at each of
 * the n_caps capacities caps[] (blocks, non-decreasing; RP_CAP_INF allowed): the same prefix
 * rp_sim_eval counts. Since the running maximum of the stack distances never decreases along
 * a prompt, block i is cached at capacity C exactly when i < n_below for C, so the blocks
 * in [n_below[k-1], n_below[k]) are those an inclusive LRU tier of capacity caps[k] holds and
 * the tier above does not (docs/replay.md, "Tiers"). Returns RP_OK, or RP_EINPUT (more than
 * RP_SCAN_MAX_CAPS capacities, or not in order) before calling fn. */
int rp_sim_scan(const rp_sim *s, const uint64_t *caps, size_t n_caps, rp_scan_fn fn, void *ctx);

/* Distinct block keys touched so far. */
uint64_t rp_sim_distinct(const rp_sim *s);

/* Number of distinct values of dimension dim seen (an absent field is its own value), and
 * the name of value i (NULL when absent; *len its byte length). Owned by the engine. */
size_t rp_sim_n_groups(const rp_sim *s, int dim);
const char *rp_sim_group_name(const rp_sim *s, int dim, size_t i, size_t *len);

/* Check the engine's invariants (stack counts, key map). Returns true when they hold. */
bool rp_sim_check(const rp_sim *s);

void rp_sim_free(rp_sim *s);

#endif /* CLI_REPLAY_SIM_H */
