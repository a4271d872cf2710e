/*
 * replay_pol.h - `kvprefix replay --policy`: the library's eviction policies (kvp_config.eviction)
 * and the offline optimum (replay_opt.h) replayed on the log the engine recorded, one capacity
 * per call.
 *
 * The log is an rp_opt (replay_opt.h): per request its prompt tokens, full prompt blocks and
 * the dense block numbers it touched (rp_sim_last_blocks). A library policy replays it through
 * a kvp_cache of min(capacity, distinct blocks) blocks with that policy, one kvp_access_ids per
 * request (a kvp_lookup_ids first when output blocks are cached, as replay_sim.c does with
 * tokens), the dense numbers standing for the block keys: they name whole prefixes, as the
 * keys do, so the pool sees the same hits and misses. A pool of the log's distinct blocks
 * never evicts, so it stands for any larger capacity. `opt` is rp_opt_eval (RP_OPT_USEFUL).
 *
 * Retention priorities (docs/replay.md): with a retention table (rp_retain, one entry per
 * request of the log, from the lines' "retention" fields and --retain-prefix), every policy
 * replayed through the library (slru, s3fifo, cdecay, and retain: LRU with retention) passes each
 * request's retention to kvp_access_ids_retained; lru (the engine's curve) and opt ignore it.
 *
 * Cost per call: a library policy is one pass over the log, O(A) pool operations for A block
 * touches, plus the pool (about 170 bytes per block with a policy record and the parent links
 * that count orphans, plus CDECAY's ghost of 16 evicted keys per block); opt is
 * rp_opt_eval's O(A log C). A sweep of P points with K policies other than lru makes K x P
 * such passes (LRU comes from the engine's one-pass curve).
 */
#ifndef CLI_REPLAY_POL_H
#define CLI_REPLAY_POL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix.h"
#include "replay_opt.h"

/* The policies --policy names, in the order the report lists them. */
enum {
    RP_POL_LRU = 0,    /* KVP_EVICT_LRU; the report takes its figures from the engine */
    RP_POL_SLRU = 1,   /* KVP_EVICT_SLRU with the library's defaults */
    RP_POL_S3FIFO = 2, /* KVP_EVICT_S3FIFO with the library's defaults */
    RP_POL_CDECAY = 3, /* KVP_EVICT_CDECAY with the library's defaults */
    RP_POL_OPT = 4,    /* the offline optimum, replay_opt.c */
    RP_POL_RETAIN = 5, /* KVP_EVICT_LRU with each request's retention priorities */
    RP_N_POLICIES = 6
};

/* The figures of one policy at one capacity. */
typedef struct rp_pol_figs {
    uint64_t capacity;        /* blocks */
    uint64_t n_hit_tokens;    /* prefill tokens skipped */
    uint64_t n_blocks_cached; /* full prompt blocks in the longest cached prefix (uncapped) */
    uint64_t n_blocks_hit;    /* of those, reused (capped so one token is computed) */
    uint64_t n_evicted;       /* cached blocks evicted to make room */
    uint64_t n_orphaned;      /* library policies: cached blocks whose parent block is not
                                 cached at the end of the log (kvp_stats.n_blocks_orphaned);
                                 UINT64_MAX when not measured (opt; lru along a sweep) */
} rp_pol_figs;

/* The name of policy pol as --policy spells it ("lru", "slru", "s3fifo", "cdecay", "opt",
 * "retain"). */
const char *rp_pol_name(int pol);

/* Replay the log with policy pol (RP_POL_*) at capacity blocks (>= 1) into *out. LRU is
 * accepted too (the tests compare it with the engine). Returns 0, or -1 with a message in err
 * (out of memory, a pool the library refuses, more distinct blocks than a pool can hold);
 * *out is untouched on failure. */
int rp_pol_eval(rp_opt *log, uint32_t block_size, int pol, uint64_t capacity, rp_pol_figs *out,
                char *err, size_t err_size);

/* Each request's retention, in log order (one rp_retain_add per rp_opt_add). */
typedef struct rp_retain rp_retain;

/* A new, empty table, or NULL when out of memory. */
rp_retain *rp_retain_new(void);

/* Append the next request's retention: none (r NULL), or *r (its ranges copied). Returns 0,
 * or -1 when out of memory (nothing appended). */
int rp_retain_add(rp_retain *t, const kvp_retention *r);

/* Free the table. Accepts NULL. */
void rp_retain_free(rp_retain *t);

/* rp_pol_eval with each request's retention from ret (NULL: none; see the top of this
 * file). */
int rp_pol_eval_retained(rp_opt *log, const rp_retain *ret, uint32_t block_size, int pol,
                         uint64_t capacity, rp_pol_figs *out, char *err, size_t err_size);

#endif /* CLI_REPLAY_POL_H */
