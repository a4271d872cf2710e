/*
 * replay_tiers.h - `kvprefix replay --tiers`: the hit tokens each cache tier (GPU, host
 * memory, local disk, a remote store) would serve on a log, and the modelled time to first
 * token, from the engine's one pass (docs/replay.md, "Tiers").
 *
 * Tier model: write-through and inclusive. Every block a request computes is written to every
 * tier; tier k holds everything tier k - 1 holds plus more, and each tier evicts its least
 * recently used block, with a hit in any tier touching the block in all of them. Each tier is
 * then an LRU cache of its own capacity over the same reference stream, so it holds the blocks
 * whose stack distance is below its capacity: a block at distance d is served by the first
 * tier whose capacity exceeds d. rp_sim_scan hands over, per request, the cached prefix at
 * each tier capacity, and one pass over the records gives any tier sizes. Sizes are each
 * tier's own capacity (inclusive), so they must grow down the list.
 *
 * Files: replay_tiers.c (options, sizes, evaluation, table/JSON/chart), replay_time.c (the
 * time model).
 */
#ifndef CLI_REPLAY_TIERS_H
#define CLI_REPLAY_TIERS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "replay_sim.h"
#include "replay_time.h"

struct json_t;

enum {
    RP_OPT_TIERS = 0x1300, /* --tiers gpu=SIZE,cpu=SIZE,disk=SIZE,remote=SIZE */
    RP_OPT_GPU,            /* --gpu PRESET */
    RP_OPT_GPU_MEM,        /* --gpu-mem SIZE */
    RP_OPT_TP,             /* --tp N */
    RP_OPT_UTIL,           /* --util F */
    RP_OPT_PREFILL_RATE,   /* --prefill-rate TOKENS/s */
    RP_OPT_MFU,            /* --mfu F */
    RP_OPT_TIER_BW,        /* --tier-bw cpu=50GB,... (bytes per second) */
    RP_OPT_TIER_LATENCY    /* --tier-latency cpu=10us,... */
};

/* clang-format off */
#define RP_TIERS_LONGOPTS                                                                          \
    {"tiers", required_argument, NULL, RP_OPT_TIERS},                                              \
    {"gpu", required_argument, NULL, RP_OPT_GPU},                                                  \
    {"gpu-mem", required_argument, NULL, RP_OPT_GPU_MEM},                                          \
    {"tp", required_argument, NULL, RP_OPT_TP},                                                    \
    {"util", required_argument, NULL, RP_OPT_UTIL},                                                \
    {"prefill-rate", required_argument, NULL, RP_OPT_PREFILL_RATE},                                \
    {"mfu", required_argument, NULL, RP_OPT_MFU},                                                  \
    {"tier-bw", required_argument, NULL, RP_OPT_TIER_BW},                                          \
    {"tier-latency", required_argument, NULL, RP_OPT_TIER_LATENCY}

#define RP_TIERS_HELP                                                                              \
    "\n"                                                                                           \
    "Tiers (inclusive LRU tiers, write-through; docs/replay.md):\n"                                \
    "  --tiers gpu=S,cpu=S,disk=S,remote=S   tier sizes (blocks, 1Mtok or bytes with a\n"         \
    "                       model), each holding everything the one above holds; gpu=\n"       \
    "                       defaults to what --gpu-mem/--gpu and --tp leave after weights\n"      \
    "  --gpu PRESET         H100-80GB, A100-80GB, ... (memory, FLOP/s, host link)\n"            \
    "  --gpu-mem SIZE       memory of one GPU;  --tp N  GPUs;  --util F  (default 0.9)\n"        \
    "  --prefill-rate N     prefill tokens/s of the replica (default: 2 x params FLOPs per\n"   \
    "                       token on --tp GPUs of --gpu (H100-80GB) at --mfu, default 0.5)\n"   \
    "  --tier-bw T=RATE,..  load bandwidth, bytes/s (default cpu tp x the GPU's host link,\n"  \
    "                       disk 20GB, remote 25GB)\n"                                          \
    "  --tier-latency T=DUR,..  per-load latency: 10us, 2ms (default cpu 10us, disk 100us,\n"   \
    "                       remote 500us)\n"
/* clang-format on */

/* The tier flags as given. */
typedef struct rp_tier_opts {
    const char *tiers;   /* --tiers as given, or NULL (no tier report) */
    const char *gpu;     /* --gpu preset name, or NULL */
    uint64_t gpu_mem;    /* --gpu-mem bytes; 0 when not given */
    uint32_t tp;         /* --tp (default 1) */
    uint32_t util_ppm;   /* --util in millionths (default 900000) */
    double prefill_rate; /* --prefill-rate; 0 when not given */
    uint32_t mfu_ppm;    /* --mfu in millionths (default 500000) */
    const char *bw;      /* --tier-bw as given, or NULL */
    const char *latency; /* --tier-latency as given, or NULL */
} rp_tier_opts;

/* Defaults into *t. Cannot fail. */
void rp_tiers_init(rp_tier_opts *t);

/* Whether c is one of RP_TIERS_LONGOPTS. */
bool rp_tiers_is_opt(int c);

/* Apply option c with value v. Returns 0 or the exit status (message printed). */
int rp_tiers_apply(rp_tier_opts *t, int c, const char *v);

/* Check the tier flags against each other before the log is read (the --tiers syntax and
 * names, flags that need --tiers). Returns 0 or the exit status (message printed). */
int rp_tiers_check(const rp_tier_opts *t, bool has_model);

/* Figures of one tier configuration. */
typedef struct rp_tier_figs {
    size_t n_tiers;                       /* tiers in this configuration */
    uint64_t cap[RP_MAX_TIERS];           /* each tier's capacity, blocks (non-decreasing) */
    uint64_t hit_tokens[RP_MAX_TIERS];    /* prompt tokens found in each tier (first holder) */
    uint64_t loaded_tokens[RP_MAX_TIERS]; /* of those, loaded (tier 0: all) */
    uint64_t n_prompt_tokens;             /* prompt tokens of the log */
    uint64_t n_requests;                  /* requests */
    double ttft_mean, ttft_p50, ttft_p90, ttft_p99; /* modelled TTFT, seconds */
    double ttft_nocache_mean;                       /* the same requests with no cache at all */
} rp_tier_figs;

/* What a run with --tiers adds to the report. */
typedef struct rp_tiers_result {
    size_t n_tiers;                    /* tiers given (with the gpu tier) */
    int kind[RP_MAX_TIERS];            /* tier names: 0 gpu, 1 cpu, 2 disk, 3 remote */
    uint64_t block_bytes;              /* bytes of one block in a tier, all ranks; 0: no model */
    uint32_t block_size;               /* tokens per block */
    bool gpu_from_plan;                /* the gpu tier came from --gpu-mem/--gpu after weights */
    char gpu_desc[160];                /* how the gpu tier was sized */
    char rate_desc[160];               /* how the prefill rate was obtained */
    rp_time_model tm;                  /* the time model in use */
    double ttft_nocache_mean;          /* mean TTFT with no cache at all */
    rp_tier_figs ladder[RP_MAX_TIERS]; /* ladder[j]: tiers 0 .. j only (GPU only, +cpu...) */
    double ceiling;                    /* cold-miss ceiling, token hit rate */
    uint64_t knee_blocks;              /* least capacity of the last tier within 1 point of the
                                          ceiling, blocks */
    rp_tier_figs sweep[64];            /* --sweep: the last tier's capacity swept */
    size_t n_sweep;                    /* 0 without --sweep */
} rp_tiers_result;

/* Size the tiers and evaluate them on the engine's records: the ladder, the knee and (sweep
 * > 0) a sweep of the last tier's capacity over `sweep` points. model/config/kv_dtype are
 * replay's --model, --config and --kv-dtype (NULL when not given). Returns 0 and a new result
 * in *out (the caller frees it), or the exit status (message printed). */
int rp_tiers_evaluate(const rp_tier_opts *t, const char *model, const char *config,
                      const char *kv_dtype, const rp_sim *sim, uint32_t block_size,
                      const rp_metrics *ceiling, unsigned sweep, rp_tiers_result **out);

/* Evaluate one configuration: tiers of capacities cap[0 .. n) blocks (non-decreasing) under
 * the time model tm (whose n_tiers must be n). Returns RP_OK, RP_EINPUT (bad capacities) or
 * RP_ENOMEM. */
int rp_tiers_figs(const rp_sim *sim, const rp_time_model *tm, const uint64_t *cap, size_t n,
                  rp_tier_figs *out);

/* The tier section of the table report. Returns 0 or -1 on a write error. */
int rp_tiers_print(FILE *f, const rp_tiers_result *r);

/* --csv with --tiers: the columns the tier rows add (printed after replay's header, before
 * its newline), those columns left empty (after every other row), and the tier rows (n_std:
 * replay's own column count): "tiers:ladder" per configuration of the ladder (gpu, gpu+cpu,
 * ...), "tiers:sweep" per sweep point, "tiers:knee" (the last tier's capacity within one point
 * of the ceiling). Returns 0 or -1 on a write error. */
void rp_tiers_csv_header(FILE *f);
void rp_tiers_csv_empty(FILE *f);
int rp_tiers_csv(FILE *f, const rp_tiers_result *r, size_t n_std);

/* The tier section as a new JSON object (the caller owns it), or NULL on out of memory. */
struct json_t *rp_tiers_json(const rp_tiers_result *r);

/* The sweep as an SVG chart: hit rate against the last tier's size (memory units with a
 * model), the GPU's share and the TTFT relative to no cache. Returns 0 or -1 with err. */
int rp_tiers_plot(FILE *f, const rp_tiers_result *r, const char *input, char *err, size_t err_size);

/* The least capacity in blocks whose token hit rate is within one point of `ceiling` (a
 * token hit rate in [0,1]), by bisection over rp_sim_eval between 1 and the distinct blocks:
 * the knee of the curve. Returns RP_OK with *out, or RP_ENOMEM. */
int rp_knee(const rp_sim *sim, double ceiling, uint64_t *out);

/* The tier name of kind k ("gpu", "cpu", "disk", "remote"). */
const char *rp_tier_name(int k);

void rp_tiers_free(rp_tiers_result *r);

#endif /* CLI_REPLAY_TIERS_H */
