/*
 * plan.h - what `kvprefix plan` computes and prints: the parsed options (plan.c) and the
 * result record that plan.c fills and plan_report.c renders as a table or as JSON.
 */
#ifndef CLI_PLAN_H
#define CLI_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hashopt.h"
#include "kvplan.h"

/* Parsed command line. */
typedef struct plan_opts {
    const char *model_name;                     /* --model, or NULL */
    const char *config_path;                    /* --config, or NULL */
    uint64_t layers, heads, kv_heads, head_dim; /* shape flags; 0 when not given */
    const char *dtype, *kv_dtype, *w_dtype;     /* dtype flags, or NULL */
    const char *kv_scales;                      /* --kv-scales, or NULL */
    const char *kv_scale_dtype;                 /* --kv-scale-dtype, or NULL */
    uint64_t window;                            /* --window; 0 when not given */
    bool no_window;                             /* --no-window */
    uint32_t block_size;                        /* --block-size (16; 64 for MLA when not given) */
    bool block_size_given;                      /* --block-size given */
    const char *gpu;                            /* --gpu preset name, or NULL */
    const char *gpu_mem_arg;                    /* --gpu-mem as given, or NULL */
    uint64_t seq_len;                           /* --seq-len; 0 when not given */
    uint64_t batch;                             /* --batch; 0 when not given (means 1) */
    uint64_t *lens;                             /* --lens values (owned), or NULL */
    size_t n_lens;                              /* number of --lens values */
    uint64_t max_len;                           /* --max-len; 0 when not given */
    bool have_gpu_mem;                          /* --gpu-mem given */
    uint64_t gpu_mem;                           /* --gpu-mem bytes */
    uint32_t util_ppm;                          /* --util in millionths */
    bool have_weights_mem;                      /* --weights-mem given */
    uint64_t weights_mem;                       /* --weights-mem bytes */
    uint64_t params;                            /* --params; 0 when not given */
    uint64_t reserve;                           /* --reserve bytes */
    uint32_t tp;                                /* --tp */
    const char *trace;                          /* --trace, or NULL */
    uint32_t trace_bs;                          /* --trace-block-size */
    uint64_t concurrency;                       /* --concurrency; 0 when not given */
    size_t max_line_bytes;                      /* --max-line-bytes */
    bool include_output;                        /* lengths include output tokens */
    bool json;                                  /* --json */
    bool list_models;                           /* --list-models */
    bool help;                                  /* --help */
    cli_hash_opts hash;                         /* --hash, --hash-key, --vllm-seed, --vocab-size */
    kvp_config hash_cfg;                        /* their hash fields (with --trace) */
} plan_opts;

/* Everything that is printed, computed once, rendered as a table or as JSON. */
typedef struct plan_result {
    cap_model_shape m;        /* the model shape in use */
    const char *model_label;  /* preset name, config path or "custom shape" */
    const char *model_source; /* preset source, "config.json", or "flags" */
    bool heads_assumed;       /* --heads not given for a bare shape: Hq = Hkv assumed */
    cap_tp tp;                /* tensor-parallel split */
    uint32_t block_size;      /* tokens per block */
    const char *block_why;    /* why that block size, or NULL for --block-size / the default */
    uint64_t max_context;     /* the preset's context length in tokens; 0 when unknown */
    uint64_t longest;         /* the longest length planned (--seq-len, --lens, the trace) */
    uint64_t tok_logical;     /* KV bytes per token, whole model without replicas */
    uint64_t tok_gpu;         /* KV bytes per token on one GPU, every layer holding it */
    uint64_t blk_gpu;         /* KV bytes per block on one GPU, every layer holding it */
    cap_kv_cost cost;         /* the per-layer cost on one GPU */
    cap_kv_cost cost_logical; /* the per-layer cost of the whole model (tp 1) */

    bool has_batch;           /* --seq-len or --lens given */
    bool uniform;             /* batch of --batch x --seq-len (else --lens) */
    uint64_t seq_len, batch;  /* uniform batch shape */
    const uint64_t *lens;     /* --lens values (uniform: NULL) */
    size_t n_lens;            /* number of --lens values */
    uint64_t batch_tokens;    /* sum of the batch's lengths */
    uint64_t seq_bytes_gpu;   /* uniform: one sequence, per GPU */
    uint64_t seq_paged_gpu;   /* uniform: one sequence in whole blocks, per GPU */
    uint64_t batch_bytes_gpu; /* the batch held contiguously (exact tokens), per GPU */
    uint64_t batch_paged_gpu; /* the batch in whole blocks, per GPU */
    cap_frag frag;            /* batch fragmentation */
    uint64_t waste_paged;     /* batch: paged - exact bytes, per GPU */
    uint64_t waste_contig;    /* batch: max_len reservations - exact bytes, per GPU */
    uint64_t max_len;         /* contiguous reservation used */
    bool max_len_given;       /* --max-len given (else the longest length) */
    bool ws_ok;               /* workspace fits 64 bits */
    uint64_t ws_bytes_gpu;    /* naive score matrix, one layer, per GPU */

    bool has_mem;               /* --gpu-mem given */
    cap_mem_in mem_in;          /* inverse-plan inputs */
    cap_mem_out mem;            /* inverse-plan result */
    uint64_t weights_total;     /* weights of the whole model */
    const char *weights_from;   /* how weights_total was obtained */
    char weights_from_buf[128]; /* storage for weights_from when it is computed */
    uint64_t fit_seq;           /* uniform: requests of seq_len that fit */
    uint64_t fit_contig;        /* requests that fit with max_len reservations */

    bool has_trace;                        /* --trace given */
    const char *trace_path;                /* --trace */
    uint64_t n_tokens_fmt, n_mooncake_fmt; /* records with tokens (token logs, OpenAI
                                              bodies) and Mooncake records */
    cap_stats st;                          /* length statistics */
    uint64_t sum_blocks;                   /* sum of ceil(len / block_size) over the trace */
    cap_frag tfrag;                        /* trace fragmentation */
    uint64_t tmax_len;                     /* contiguous reservation for the trace */
    uint64_t conc;                         /* --concurrency */
    uint64_t exp_tokens;                   /* ceil(conc x mean) */
    uint64_t exp_blocks;                   /* ceil(conc x mean blocks per request) */
    uint64_t worst_tokens;                 /* sum of the conc longest */
    uint64_t worst_blocks;                 /* their blocks */
    uint64_t exp_kv, exp_kv_paged;         /* KV bytes of the expected requests, per GPU */
    uint64_t worst_kv, worst_kv_paged;     /* KV bytes of the N longest, per GPU */
    uint64_t twaste_paged, twaste_contig;  /* trace waste in bytes, as waste_paged/_contig */
    uint64_t conc_mean_fit;                /* requests of mean size that fit the KV blocks */
    uint64_t conc_worst_fit;               /* longest-first requests that fit */
} plan_result;

/* Print r as the readable table (stdout). Cannot fail. */
void pl_print_table(const plan_result *r, const plan_opts *o);

/* Print r as one JSON object (stdout). Returns 0, or 1 after a message on stderr when the
 * JSON document cannot be built or written. */
int pl_print_json(const plan_result *r, const plan_opts *o);

/* `kvprefix plan` on argv[0 .. argc) (argv[0] is "plan"); returns the exit status (cli.h). */
int pl_main(int argc, char **argv);

#endif /* CLI_PLAN_H */
