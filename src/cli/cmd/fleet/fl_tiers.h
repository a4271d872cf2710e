/*
 * fl_tiers.h - `kvprefix fleet --tiers / --shared-tier`: what tiers below the GPU add to a
 * fleet, per replica (host memory, local disk) and fleet-wide (a shared host or remote pool,
 * as Mooncake's store or LMCache's remote backend), on the routes each policy chose
 * (docs/routing.md, "Tiers in a fleet").
 *
 * The tiers run inside the simulation (fl_sim_config.tiers): at each request's start the
 * simulation asks fl_tier_sim_start how much of the prefill the tiers save, so queueing,
 * load and routing see the shorter (or, never, longer) service. Each replica's lower tiers are
 * inclusive LRU caches of that replica's blocks (write-through: every block the replica computes or
 * loads is written to them); the shared tier is one LRU over every replica's blocks. A request's
 * prefix continues past its GPU hit block by block into the first tier holding each block
 * (the replica's cpu, then its disk, then the shared tier) and stops at the first block none
 * holds. Loads are charged as in `replay --tiers` (latency + bytes / bandwidth per tier used),
 * a tier's run being loaded only when that is faster than recomputing it at --prefill-us.
 *
 * Files: fl_tiers.c (options, the pass, the report section).
 */
#ifndef CLI_FL_TIERS_H
#define CLI_FL_TIERS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct fl_log;
struct fl_result;
struct json_t;

enum {
    FL_OPT_TIERS = 0x1400, /* --tiers cpu=SIZE,disk=SIZE (per replica) */
    FL_OPT_SHARED_TIER,    /* --shared-tier SIZE (fleet-wide) */
    FL_OPT_TIER_BW,        /* --tier-bw cpu=RATE,disk=RATE,shared=RATE */
    FL_OPT_TIER_LATENCY    /* --tier-latency cpu=DUR,... */
};

#define FL_N_TIERS 3 /* lower tiers: 0 cpu, 1 disk (per replica), 2 shared */

/* clang-format off */
#define FL_TIERS_LONGOPTS                                                                          \
    {"tiers", required_argument, NULL, FL_OPT_TIERS},                                              \
    {"shared-tier", required_argument, NULL, FL_OPT_SHARED_TIER},                                  \
    {"tier-bw", required_argument, NULL, FL_OPT_TIER_BW},                                          \
    {"tier-latency", required_argument, NULL, FL_OPT_TIER_LATENCY}

#define FL_TIERS_HELP                                                                              \
    "\n"                                                                                           \
    "Tiers below the GPU (needs --model; docs/routing.md, \"Tiers in a fleet\"):\n"               \
    "  --tiers cpu=S,disk=S per replica: inclusive LRU tiers under its GPU pool (blocks,\n"       \
    "                       1Mtok or bytes), each larger than the one above\n"                   \
    "  --shared-tier S      one fleet-wide LRU pool every replica writes to and loads from\n"    \
    "  --tier-bw T=RATE,..  load bandwidth per replica (default cpu 50GB/s, disk 20GB/s,\n"      \
    "                       shared 25GB/s)\n"                                                     \
    "  --tier-latency T=DUR,..  per load (default cpu 10us, disk 100us, shared 500us)\n"
/* clang-format on */

/* The tier flags as given. */
typedef struct fl_tier_opts {
    const char *tiers;   /* --tiers as given, or NULL */
    const char *shared;  /* --shared-tier as given, or NULL */
    const char *bw;      /* --tier-bw as given, or NULL */
    const char *latency; /* --tier-latency as given, or NULL */
} fl_tier_opts;

/* Whether c is one of FL_TIERS_LONGOPTS. */
bool fl_tiers_is_opt(int c);

/* Apply option c with value v (stored; checked by fl_tiers_check). Returns 0. */
int fl_tiers_apply(fl_tier_opts *t, int c, const char *v);

/* Whether any tier was asked for. */
static inline bool fl_tiers_on(const fl_tier_opts *t)
{
    return t->tiers || t->shared;
}

/* Check the syntax of the tier flags before the log is read. Returns 0 or the exit status
 * (message printed). */
int fl_tiers_check(const fl_tier_opts *t, bool has_model);

/* The sizes and speeds once the block size and bytes are known. */
typedef struct fl_tier_setup {
    uint64_t cap[FL_N_TIERS];   /* blocks: cpu and disk per replica, shared; 0 = absent */
    double bw[FL_N_TIERS];      /* bytes/s */
    double latency[FL_N_TIERS]; /* seconds */
    uint64_t block_bytes;       /* KV bytes of one block */
    uint32_t block_size;        /* tokens per block */
    uint64_t prefill_ns;        /* per computed token */
} fl_tier_setup;

/* Resolve the flags into *s. Returns 0 or the exit status (message printed). */
int fl_tiers_setup(const fl_tier_opts *t, uint32_t block_size, uint64_t block_bytes,
                   uint64_t prefill_ns, fl_tier_setup *s);

/* What the tiers added to one simulated run. */
typedef struct fl_tier_figs {
    uint64_t n_prompt_tokens;           /* prompt tokens of the requests started */
    uint64_t gpu_tokens;                /* reused from the replicas' GPU pools */
    uint64_t tier_tokens[FL_N_TIERS];   /* found in each lower tier */
    uint64_t loaded_tokens[FL_N_TIERS]; /* of those, loaded (the rest recomputed) */
} fl_tier_figs;

/* The tiers of one simulation: 2 x n_replicas + 1 LRUs. */
typedef struct fl_tier_sim fl_tier_sim;

/* New, empty tiers for n_replicas replicas; NULL on out of memory. */
fl_tier_sim *fl_tier_sim_new(const fl_tier_setup *s, uint32_t n_replicas);

/* Request i of log starts on replica r with gpu_hit prompt tokens from its GPU pool (the
 * simulation calls this at each start, in time order): its prefix continues past the GPU hit
 * into the first tier holding each block (r's cpu, r's disk, the shared tier) up to the
 * one-token cap; *delta_ns is the prefill time the loads that pay change (<= 0), and every
 * full prompt block is then written through to r's tiers and the shared one. Returns FL_OK,
 * or FL_ENOMEM (the tiers are then incomplete; the run must stop). */
int fl_tier_sim_start(fl_tier_sim *t, const struct fl_log *log, uint32_t i, uint32_t r,
                      uint32_t gpu_hit, int64_t *delta_ns);

/* The figures so far. Cannot fail. */
void fl_tier_sim_figs(const fl_tier_sim *t, fl_tier_figs *out);

/* The LRUs' invariants (map and list agree, at most capacity). */
bool fl_tier_sim_check(const fl_tier_sim *t);

void fl_tier_sim_free(fl_tier_sim *t);

/* One request's TTFT change (ns, negative when faster) and the tiers loaded, from its tier
 * hits (blocks) in lookup order: tiers 0 .. c - 1 are loaded for the best c. Exposed for
 * tests. Cannot fail. */
int64_t fl_tiers_delta(const fl_tier_setup *s, const uint32_t *hits, int *n_loaded);

/* The tier name ("cpu", "disk", "shared"). */
const char *fl_tier_name(int k);

/* What a run with tiers adds to the fleet report (fl_report.tiers). */
typedef struct fl_tier_report {
    fl_tier_setup setup;    /* the tiers resolved */
    struct fl_result *runs; /* per run as fl_report.runs, the run with the tiers (owned) */
    fl_tier_figs *figs;     /* their tier figures (owned); both NULL without tiers */
} fl_tier_report;

/* The section of the table report: one row per pair of runs base[i] (without tiers) and
 * tiered[i] (the same fleet and policy with them), figs[i] its tier figures, i < n (rows whose
 * n_replicas is 0 are skipped). Cannot fail. */
void fl_tiers_print(FILE *f, const fl_tier_setup *s, const struct fl_result *base,
                    const struct fl_result *tiered, const fl_tier_figs *figs, size_t n);

/* The same as a JSON array (the caller owns it), or NULL on out of memory. */
struct json_t *fl_tiers_json(const fl_tier_setup *s, const struct fl_result *base,
                             const struct fl_result *tiered, const fl_tier_figs *figs, size_t n);

#endif /* CLI_FL_TIERS_H */
