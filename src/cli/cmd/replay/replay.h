/*
 * replay.h - what the parts of `kvprefix replay` share: the options as parsed (replay.c),
 * the figures a run produced (replay.c fills them, replay_report.c prints them) and the
 * prompt-layout diagnostics (diagnose.c).
 */
#ifndef CLI_REPLAY_H
#define CLI_REPLAY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "hashopt.h"
#include "inopts.h"
#include "kvplan.h"
#include "replay_pol.h"
#include "replay_sim.h"
#include "replay_tiers.h"
#include "template.h"

#define RP_MAX_CAPS 64 /* capacities in one sweep */
/* Largest pool that cross-checks the LRU model (about 100 bytes per block: 6.6 MB). */
#define RP_POOL_MAX (UINT32_C(1) << 16)

typedef struct rp_options {
    const char *path;            /* the log; "-" for standard input */
    in_opts in;                  /* --format, --block-size, --tokenizer ... (inopts.h); its
                                    tokenizer is loaded once the log is about to be read */
    uint64_t seed;               /* --seed: the xxh3 seed (default 0) */
    cli_hash_opts hash;          /* --hash, --hash-key, --vllm-seed, --vocab-size, --seed */
    kvp_config hash_cfg;         /* their hash fields, filled once the options are checked */
    bool cache_output;           /* token logs: also cache full blocks of output_tokens */
    bool sort;                   /* stable sort by timestamp before replaying */
    const char *capacity;        /* --capacity as given, or NULL */
    const char *capacities;      /* --capacities list as given, or NULL */
    bool sweep;                  /* --sweep: an automatic list */
    unsigned sweep_points;       /* points of the automatic list (default 20) */
    const char *plot_path;       /* --plot FILE.svg, or NULL */
    const char *output_path;     /* -o FILE for the report, or NULL for standard output */
    bool json, csv;              /* output format (default: table) */
    bool diagnose;               /* prompt-layout diagnostics */
    bool skip_invalid;           /* count and skip malformed lines instead of stopping */
    int progress;                /* -1 auto (a terminal), 0 off, 1 on */
    unsigned top;                /* rows per breakdown and diagnostics list (default 10) */
    const char *model;           /* model preset for byte capacities, or NULL */
    const char *config;          /* HF config.json for byte capacities, or NULL */
    const char *kv_dtype;        /* KV dtype override, or NULL */
    int policies[RP_N_POLICIES]; /* --policy: RP_POL_* in the order given (default lru) */
    size_t n_policies;           /* entries in policies, >= 1 */
    rp_tier_opts tiers;          /* --tiers and the flags that size and time them */
    uint64_t retain_tokens;      /* --retain-prefix TOKENS:PRIO: every request's first TOKENS */
    uint32_t retain_priority;    /*   tokens at priority PRIO (TOKENS 0: not given) */
} rp_options;

/* Whether --policy asks for more than today's report: any list but "lru" alone. */
static inline bool rp_policies_shown(const rp_options *o)
{
    return o->n_policies > 1 || o->policies[0] != RP_POL_LRU;
}

typedef struct rp_diag rp_diag;

/* The figures of one run. */
typedef struct rp_result {
    const char *input;                   /* the log's name as given */
    int format;                          /* LOG_* of its lines (0 when it had none) */
    uint32_t block_size;                 /* tokens per block of that format */
    in_count count;                      /* how OpenAI bodies' tokens were counted */
    uint64_t n_lines;                    /* lines read */
    uint64_t n_skipped;                  /* malformed lines skipped (--skip-invalid) */
    uint64_t n_replayed;                 /* requests replayed */
    uint64_t n_output_cached;            /* of those, with output blocks cached (--cache-output) */
    char first_skip[512];                /* the first skipped line's message */
    uint64_t block_bytes;                /* KV bytes of one block; 0 without a model shape */
    char model_desc[128];                /* e.g. "Llama-3.1-8B, fp16"; "" without a model */
    bool has_primary;                    /* a single --capacity was given */
    uint32_t pool_blocks;                /* the pool that checked the model: min(capacity,
                                            RP_POOL_MAX) blocks; 0 without --capacity */
    rp_metrics primary;                  /* its figures (checked against the pool) */
    rp_metrics ceiling;                  /* unbounded capacity: the cold-miss ceiling */
    rp_metrics curve[RP_MAX_CAPS];       /* sweep points, increasing capacity */
    size_t n_curve;                      /* 0 without a sweep */
    uint64_t knee_blocks;                /* with a sweep: the least capacity within one point
                                            of the ceiling's token hit rate (rp_knee) */
    uint64_t distinct;                   /* distinct blocks seen */
    rp_group_metrics *groups[RP_N_DIMS]; /* breakdown at the primary capacity (or the
                                            ceiling when there is none) */
    rp_group_metrics *groups_ceil[RP_N_DIMS];          /* the same at unbounded capacity */
    const rp_sim *sim;                                 /* for group names */
    rp_pol_figs pol_primary[RP_N_POLICIES];            /* --policy: figures of policies[i] at the
                                                          primary capacity (valid with has_primary) */
    rp_pol_figs pol_curve[RP_MAX_CAPS][RP_N_POLICIES]; /* and at each sweep point */
    rp_diag *diag;                                     /* diagnostics, or NULL */
    rp_tiers_result *tiers;                            /* --tiers figures (owned), or NULL */
    double seconds;        /* wall time of the replay (reading included) */
    double seconds_engine; /* of which in the engine: pool, stack model, evaluation */
} rp_result;

/* Print the report: table, JSON or CSV (replay_report.c). Returns 0 or -1 on a write error. */
int rp_report(FILE *f, const rp_options *o, const rp_result *r);

/* ---- diagnostics (diagnose.c) ---- */

/* A new collector. `unit` is tokens per symbol (1 for tokens, the trace block size for hash
 * ids, whose symbols are ids). Returns NULL on out of memory. */
rp_diag *rp_diag_new(uint32_t block_size, uint32_t unit);

/* Add one request: its namespace root key, symbols (tokens, or hash ids folded to 32 bits),
 * and for OpenAI bodies its rendered text with the byte offset of each token (else NULL)
 * and, for chat bodies rendered with a template, the text's segments (else NULL, 0).
 * Returns 0, or -1 on out of memory. */
int rp_diag_add(rp_diag *d, kvp_key root, const uint32_t *sym, size_t n, const char *text,
                size_t text_len, const uint32_t *offsets, const tpl_seg *segs, size_t n_segs,
                uint64_t line_no);

/* Print the diagnostics as a section of the table report. Returns 0 or -1 (write error). */
int rp_diag_print(const rp_diag *d, FILE *f, unsigned top);

/* The diagnostics as a new JSON object (the caller owns it), or NULL on out of memory. */
struct json_t *rp_diag_json(const rp_diag *d, unsigned top);

void rp_diag_free(rp_diag *d);

/* `kvprefix replay` on argv[0 .. argc) (argv[0] is "replay"); returns the exit status
 * (cli.h). */
int rp_main(int argc, char **argv);

#endif /* CLI_REPLAY_H */
