/*
 * kvplan.h - the arithmetic of KV-cache capacity planning, as pure functions.
 *
 * Logical KV bytes for one token are 2 x L x Hkv x D x s: keys and values, L layers, Hkv KV
 * heads, head dimension D, s bytes per element. Everything else (blocks, sequences, batches,
 * the memory left after weights, fragmentation, length statistics) follows from that figure
 * and from integer token counts. `kvprefix plan` (plan.c) parses flags and prints; this module
 * only computes, so tests link it directly and check it against hand-computed values.
 *
 * Conventions. All sizes are exact uint64_t byte or token counts; every product is
 * overflow-checked and a function that would overflow returns PL_EOVERFLOW with its
 * out-parameters untouched. Functions return PL_OK (0) or a negative PL_E* code;
 * none allocates, prints or exits, except pl_len_stats, which sorts the caller's array.
 */
#ifndef CLI_KVPLAN_H
#define CLI_KVPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    PL_OK = 0,
    PL_EINVAL = -1,    /* an argument is zero, out of range or inconsistent */
    PL_EOVERFLOW = -2, /* the result does not fit 64 bits */
    PL_ENOSPACE = -3   /* weights and reserve leave no memory for the KV cache */
};

/* Element types of the KV cache (and of the weights, for the weight estimate). */
typedef enum pl_dtype {
    PL_DTYPE_FP32 = 0, /* 4 bytes */
    PL_DTYPE_FP16,     /* 2 bytes */
    PL_DTYPE_BF16,     /* 2 bytes */
    PL_DTYPE_FP8,      /* 1 byte; capacity estimate only (scales not counted) */
    PL_DTYPE_INT8      /* 1 byte; capacity estimate only (scales not counted) */
} pl_dtype;

/* Parse a dtype name: fp32/fp16/bf16/fp8/int8, also the Hugging Face torch_dtype spellings
 * float32, float16, half, bfloat16, float8_e4m3fn, float8_e5m2, float (case-insensitive).
 * Returns PL_OK and sets *out, or PL_EINVAL (unknown or NULL). */
int pl_dtype_parse(const char *s, pl_dtype *out);

/* Bytes per element of dtype (1, 2 or 4). Cannot fail (0 for a value outside the enum). */
unsigned pl_dtype_bytes(pl_dtype dtype);

/* Short name of dtype ("bf16"...), a static string; "?" outside the enum. Cannot fail. */
const char *pl_dtype_name(pl_dtype dtype);

/* The shape of a model as far as the KV cache cares. */
typedef struct pl_model_shape {
    uint32_t n_layers;   /* transformer layers L (> 0) */
    uint32_t n_heads;    /* query heads Hq (> 0, a multiple of n_kv_heads) */
    uint32_t n_kv_heads; /* KV heads Hkv: Hq for MHA, fewer for GQA, 1 for MQA */
    uint32_t head_dim;   /* head dimension D (> 0) */
    pl_dtype kv_dtype;   /* element type of the KV cache */
    pl_dtype w_dtype;    /* element type of the weights (for --params estimates) */
    uint64_t n_params;   /* total parameter count; 0 when unknown */
} pl_model_shape;

/* Fill *m with zeros and bf16 dtypes. Cannot fail (does nothing if m is NULL). */
void pl_model_shape_init(pl_model_shape *m);

/* Check *m. Returns PL_OK, or PL_EINVAL with *what (if what is not NULL) set to
 * a static sentence naming the wrong field: a zero count, or n_heads not a multiple of
 * n_kv_heads. */
int pl_model_shape_check(const pl_model_shape *m, const char **what);

/* How tensor parallelism spreads the KV heads over tp ranks. */
typedef struct pl_tp {
    uint32_t tp;                /* ranks (GPUs) */
    uint32_t kv_heads_per_rank; /* KV heads each rank stores: Hkv / tp, or 1 if tp > Hkv */
    uint32_t replication;       /* copies of each KV head over all ranks: 1, or tp / Hkv */
    uint32_t q_heads_per_rank;  /* query heads per rank: Hq / tp */
} pl_tp;

/* Split m's heads over tp ranks, as engines such as vLLM do: each rank holds Hkv / tp KV
 * heads when tp <= Hkv (Hkv must be a multiple of tp), and one KV head, replicated tp / Hkv
 * times, when tp > Hkv (tp must be a multiple of Hkv). Query heads must divide by tp.
 * Returns PL_OK, or PL_EINVAL with *what set to a static sentence. */
int pl_tp_split(const pl_model_shape *m, uint32_t tp, pl_tp *out, const char **what);

/* KV bytes of one token on one rank: 2 x L x kv_heads x D x s. Pass m->n_kv_heads for the
 * whole (logical) model, or the tp split's kv_heads_per_rank for one GPU.
 * Returns PL_OK, PL_EINVAL (zero field), PL_EOVERFLOW. */
int pl_token_bytes(const pl_model_shape *m, uint32_t kv_heads, uint64_t *out);

/* *out = a * b, checked. Returns PL_OK or PL_EOVERFLOW (out untouched). */
int pl_mul(uint64_t a, uint64_t b, uint64_t *out);

/* *out = a + b, checked. Returns PL_OK or PL_EOVERFLOW (out untouched). */
int pl_add(uint64_t a, uint64_t b, uint64_t *out);

/* Number of blocks of block_size tokens that hold len tokens: ceil(len / block_size).
 * block_size must be > 0 (returns 0 otherwise). Cannot overflow. */
uint64_t pl_blocks_for(uint64_t len, uint32_t block_size);

/* Sum of lens[0 .. n). Returns PL_OK or PL_EOVERFLOW; lens may be NULL if n == 0. */
int pl_sum(const uint64_t *lens, size_t n, uint64_t *out);

/* Fragmentation of a set of sequences, in tokens. */
typedef struct pl_frag {
    uint64_t n_seqs;              /* sequences counted */
    uint64_t n_tokens;            /* sum of their lengths */
    uint64_t n_blocks;            /* paged: sum of ceil(len / block_size) */
    uint64_t paged_alloc_tokens;  /* paged: n_blocks x block_size */
    uint64_t paged_waste_tokens;  /* paged: sum of ceil(len/bs)*bs - len */
    uint64_t contig_alloc_tokens; /* contiguous: n_seqs x max_len (0 if max_len is 0) */
    uint64_t contig_waste_tokens; /* contiguous: sum of max_len - len (0 if max_len is 0) */
} pl_frag;

/* Compute the waste of paged blocks of block_size tokens and, when max_len > 0, of a
 * contiguous reservation of max_len tokens per sequence. Returns PL_OK;
 * PL_EINVAL (block_size 0, or a length above a non-zero max_len: it would not fit the
 * reservation); PL_EOVERFLOW. */
int pl_fragmentation(const uint64_t *lens, size_t n, uint32_t block_size, uint64_t max_len,
                     pl_frag *out);

/* Inputs of the inverse plan, all per GPU except weights_bytes. */
typedef struct pl_mem_in {
    uint64_t gpu_mem_bytes; /* memory of one GPU */
    uint32_t util_ppm;      /* fraction usable, in millionths (900000 = 0.9), 1..1000000 */
    uint64_t weights_bytes; /* weights of the whole model, split evenly over tp ranks */
    uint64_t reserve_bytes; /* activations, workspace, allocator slack, per GPU */
    uint32_t tp;            /* tensor-parallel ranks (>= 1) */
    uint64_t block_bytes;   /* KV bytes of one block on one GPU */
    uint32_t block_size;    /* tokens per block */
} pl_mem_in;

/* Result of the inverse plan, per GPU. Blocks are the same on every rank: a block of tokens
 * is spread over all ranks, each holding its share of the heads. */
typedef struct pl_mem_out {
    uint64_t budget_bytes;          /* floor(gpu_mem x util) */
    uint64_t weights_per_gpu_bytes; /* ceil(weights / tp) */
    uint64_t kv_bytes;              /* budget - weights per GPU - reserve */
    uint64_t n_blocks;              /* floor(kv_bytes / block_bytes) */
    uint64_t n_tokens;              /* n_blocks x block_size */
} pl_mem_out;

/* Memory left for the KV cache after weights and reserve, as vLLM budgets it
 * (gpu_memory_utilization covers weights, activations and KV), and the whole blocks that fit.
 * Returns PL_OK; PL_EINVAL (zero memory, tp, block size or block bytes, util out
 * of range); PL_ENOSPACE (weights + reserve >= budget: nothing left for KV);
 * PL_EOVERFLOW. */
int pl_memory(const pl_mem_in *in, pl_mem_out *out);

/* Length statistics of a distribution. Percentiles use the nearest-rank method: the smallest
 * length such that at least p% of the lengths are <= it. */
typedef struct pl_stats {
    uint64_t n;   /* number of lengths (> 0) */
    uint64_t sum; /* sum of lengths */
    double mean;  /* sum / n */
    uint64_t min; /* shortest */
    uint64_t p50; /* median (nearest rank) */
    uint64_t p90; /* 90th percentile */
    uint64_t p99; /* 99th percentile */
    uint64_t max; /* longest */
} pl_stats;

/* Sort lens[0 .. n) ascending in place and compute *out. Returns PL_OK,
 * PL_EINVAL (n == 0 or lens NULL), PL_EOVERFLOW (sum). */
int pl_len_stats(uint64_t *lens, size_t n, pl_stats *out);

/* Sum of the k largest of sorted_lens[0 .. n) (ascending order, as left by
 * pl_len_stats); when k > n, every length plus (k - n) more of the largest one, since k
 * requests drawn from the distribution can all be the longest. Returns PL_OK,
 * PL_EINVAL (n == 0), PL_EOVERFLOW. */
int pl_sum_longest(const uint64_t *sorted_lens, size_t n, uint64_t k, uint64_t *out);

/* How many requests fit n_blocks when each takes blocks_each blocks: n_blocks / blocks_each
 * (0 if blocks_each is 0). Cannot fail. */
uint64_t pl_fit_count(uint64_t n_blocks, uint64_t blocks_each);

/* How many of the longest requests fit n_blocks, taking them longest first from
 * sorted_lens[0 .. n) (ascending) and cycling back to the longest when all were taken: the
 * worst-case concurrency for a distribution. Each takes ceil(len / block_size) blocks.
 * Returns the count; 0 when block_size is 0 or n is 0. Cannot fail. */
uint64_t pl_fit_longest(const uint64_t *sorted_lens, size_t n, uint32_t block_size,
                        uint64_t n_blocks);

#endif /* CLI_KVPLAN_H */
