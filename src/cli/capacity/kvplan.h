/*
 * kvplan.h - the arithmetic of KV-cache capacity planning, as pure functions.
 *
 * Logical KV bytes for one token of standard attention are 2 x L x Hkv x D x s: keys and
 * values, L layers, Hkv KV heads, head dimension D, s bytes per element. Models deployed now
 * break that formula, so a model is also a list of layer runs (cap_layers), each a number of
 * layers that store KV the same way:
 *
 *   kind      held per sequence of T tokens, per layer          bytes per held token
 *   full      T tokens                                          2 x Hkv x D x s (+ scales)
 *   sliding   the last min(T, W) tokens (window W)              2 x Hkv x D x s (+ scales)
 *   latent    T tokens (MLA: one latent shared by all heads)    E x s (+ scales)
 *   state     a fixed state, whatever T (Mamba, linear attn.)   -  (state bytes per sequence)
 *   shared    nothing: the layer reads an earlier layer's KV    -
 *
 * cap_kv_cost turns a model, a tensor-parallel size and the KV element type (with its
 * quantization scales, cap_kv_quant) into bytes per rank, and cap_seq_bytes /
 * cap_seq_paged_bytes into the bytes of one sequence, contiguous (exact tokens) or paged
 * (whole blocks per layer). Everything else (blocks, sequences, batches, the memory left
 * after weights, fragmentation, length statistics) follows from those figures and from
 * integer token counts. `kvprefix plan` (plan.c) parses flags and prints; this module only
 * computes, so tests link it directly and check it against hand-computed values.
 *
 * Conventions. All sizes are exact uint64_t byte or token counts; every product is
 * overflow-checked and a function that would overflow returns CAP_EOVERFLOW with its
 * out-parameters untouched. Sub-byte elements (int4) are counted in bits and rounded up to
 * whole bytes once per stored vector (one head's K or V of one token, or one latent).
 * Functions return CAP_OK (0) or a negative CAP_E* code; none allocates, prints or exits,
 * except cap_len_stats, which sorts the caller's array.
 */
#ifndef CLI_KVPLAN_H
#define CLI_KVPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    CAP_OK = 0,
    CAP_EINVAL = -1,    /* an argument is zero, out of range or inconsistent */
    CAP_EOVERFLOW = -2, /* the result does not fit 64 bits */
    CAP_ENOSPACE = -3   /* weights and reserve leave no memory for the KV cache */
};

/* Element types of the KV cache (and of the weights, for the weight estimate). */
typedef enum cap_dtype {
    CAP_DTYPE_FP32 = 0, /* 4 bytes */
    CAP_DTYPE_FP16,     /* 2 bytes */
    CAP_DTYPE_BF16,     /* 2 bytes */
    CAP_DTYPE_FP8,      /* 1 byte; quantized: scales per cap_kv_quant */
    CAP_DTYPE_INT8,     /* 1 byte; quantized: scales per cap_kv_quant */
    CAP_DTYPE_INT4      /* 4 bits (half a byte); quantized: scales per cap_kv_quant */
} cap_dtype;

/* Parse a dtype name: fp32/fp16/bf16/fp8/int8/int4, also the Hugging Face torch_dtype spellings
 * float32, float16, half, bfloat16, float8_e4m3fn, float8_e5m2, float (case-insensitive).
 * Returns CAP_OK and sets *out, or CAP_EINVAL (unknown or NULL). */
int cap_dtype_parse(const char *s, cap_dtype *out);

/* Bytes per element of dtype (1, 2 or 4), rounded up for int4 (1). Cannot fail (0 for a
 * value outside the enum). */
unsigned cap_dtype_bytes(cap_dtype dtype);

/* Bits per element of dtype (4, 8, 16 or 32). Cannot fail (0 for a value outside the enum). */
unsigned cap_dtype_bits(cap_dtype dtype);

/* Whether dtype is a quantized KV type (fp8, int8, int4), which carries scales. */
static inline bool cap_dtype_is_quantized(cap_dtype dtype)
{
    return dtype == CAP_DTYPE_FP8 || dtype == CAP_DTYPE_INT8 || dtype == CAP_DTYPE_INT4;
}

/* Bytes of n elements of dtype, rounded up to a whole byte: ceil(n x bits / 8).
 * Returns CAP_OK, CAP_EINVAL (dtype outside the enum), CAP_EOVERFLOW. */
int cap_elems_bytes(uint64_t n, cap_dtype dtype, uint64_t *out);

/* How a layer stores KV (see the table at the top of this file). */
typedef enum cap_layer_kind {
    CAP_LAYER_FULL = 0, /* full attention: K and V of every token */
    CAP_LAYER_SLIDING,  /* sliding window: K and V of the last `window` tokens */
    CAP_LAYER_LATENT,   /* multi-head latent attention: latent_dim elements per token */
    CAP_LAYER_STATE,    /* recurrent state: state_elems elements per sequence */
    CAP_LAYER_SHARED    /* reuses the KV of an earlier layer: no bytes of its own */
} cap_layer_kind;

/* Short name of a layer kind ("full", "sliding"...), a static string. Cannot fail. */
const char *cap_layer_kind_name(cap_layer_kind kind);

/* A run of layers with the same KV layout (not necessarily adjacent in the model). */
typedef struct cap_layer_run {
    cap_layer_kind kind;  /* how these layers store KV */
    uint32_t n_layers;    /* layers in the run (> 0) */
    uint32_t n_kv_heads;  /* full, sliding: KV heads Hkv (> 0); else 0 */
    uint32_t head_dim;    /* full, sliding: head dimension D (> 0); else 0 */
    uint32_t window;      /* sliding: window W in tokens (> 0); else 0 */
    uint32_t latent_dim;  /* latent: elements per token (kv_lora_rank + qk_rope_head_dim) */
    uint64_t state_elems; /* state: elements per sequence per layer (> 0) */
} cap_layer_run;

#define CAP_MAX_RUNS 8 /* distinct layer layouts in one model */

/* The per-layer KV model: its runs. n_runs == 0 means every layer is full attention with the
 * shape's n_kv_heads and head_dim (the seed's uniform model). */
typedef struct cap_layers {
    uint32_t n_runs;                 /* runs in use (0 .. CAP_MAX_RUNS) */
    cap_layer_run run[CAP_MAX_RUNS]; /* run[0 .. n_runs) */
} cap_layers;

/* Add n layers of layout *spec to *ls, merging with a run of the same layout. Returns CAP_OK,
 * CAP_EINVAL (a field of spec out of range for its kind, or CAP_MAX_RUNS layouts already),
 * CAP_EOVERFLOW (more than 2^32 - 1 layers in one run); *ls untouched on failure. */
int cap_layers_add(cap_layers *ls, const cap_layer_run *spec, uint32_t n);

/* Scale layouts of quantized KV. */
typedef enum cap_scales {
    CAP_SCALES_NONE = 0, /* no scales (unquantized KV) */
    CAP_SCALES_TENSOR,   /* one scale per layer for K and one for V: fixed bytes */
    CAP_SCALES_HEAD,     /* one per KV head per layer for K and for V: fixed bytes */
    CAP_SCALES_TOKEN,    /* one per token per KV head, for K and for V: grows with tokens */
    CAP_SCALES_GROUP     /* one per `group` elements of each stored vector: grows with tokens */
} cap_scales;

/* Quantization of the KV cache: which scales are stored, and their type. */
typedef struct cap_kv_quant {
    cap_scales layout;     /* scale layout; CAP_SCALES_NONE for fp32/fp16/bf16 KV */
    uint32_t group;        /* CAP_SCALES_GROUP: elements per scale (> 0); else 0 */
    cap_dtype scale_dtype; /* element type of a scale (fp32 by default) */
} cap_kv_quant;

/* Parse a --kv-scales value: per-tensor, per-head, per-token, per-block:G (G in 1..65536).
 * Returns CAP_OK and sets layout and group in *out (scale_dtype untouched), or CAP_EINVAL. */
int cap_scales_parse(const char *s, cap_kv_quant *out);

/* Name of a scale layout ("per-tensor"...), a static string. Cannot fail. */
const char *cap_scales_name(cap_scales layout);

/* Short name of dtype ("bf16"...), a static string; "?" outside the enum. Cannot fail. */
const char *cap_dtype_name(cap_dtype dtype);

/* The shape of a model as far as the KV cache cares. */
typedef struct cap_model_shape {
    uint32_t n_layers;     /* transformer layers L (> 0) */
    uint32_t n_heads;      /* query heads Hq (> 0, a multiple of n_kv_heads) */
    uint32_t n_kv_heads;   /* KV heads Hkv: Hq for MHA, fewer for GQA, 1 for MQA */
    uint32_t head_dim;     /* head dimension D (> 0) */
    cap_dtype kv_dtype;    /* element type of the KV cache */
    cap_dtype w_dtype;     /* element type of the weights (for --params estimates) */
    uint64_t n_params;     /* total parameter count; 0 when unknown */
    cap_dtype state_dtype; /* element type of recurrent states (state layers): the model's */
    cap_kv_quant kv_quant; /* scales of a quantized kv_dtype (layout NONE otherwise) */
    cap_layers layers;     /* per-layer KV model; n_runs 0: n_layers full-attention layers */
} cap_model_shape;

/* Fill *m with zeros and bf16 dtypes (state dtype bf16, no scales, uniform layers).
 * Cannot fail (does nothing if m is NULL). */
void cap_model_shape_init(cap_model_shape *m);

/* Check *m. Returns CAP_OK, or CAP_EINVAL with *what (if what is not NULL) set to
 * a static sentence naming the wrong field: a zero count, n_heads not a multiple of
 * n_kv_heads, layer runs that do not add up to n_layers or have a zero field, scales on an
 * unquantized KV dtype (or none on a quantized one). */
int cap_model_shape_check(const cap_model_shape *m, const char **what);

/* Apply a window to m's attention layers. window 0: every sliding run becomes full attention
 * (the model without its windows). window > 0: every sliding run takes that window, or, when
 * m has none, every full-attention run becomes sliding (a Mistral-style model); a uniform
 * model is first made one explicit full run. Returns CAP_OK; CAP_EINVAL (m NULL, or no
 * attention layer to window); *m untouched on failure. */
int cap_model_set_window(cap_model_shape *m, uint32_t window);

/* How tensor parallelism spreads the KV heads over tp ranks. */
typedef struct cap_tp {
    uint32_t tp;                /* ranks (GPUs) */
    uint32_t kv_heads_per_rank; /* KV heads each rank stores: Hkv / tp, or 1 if tp > Hkv */
    uint32_t replication;       /* copies of each KV head over all ranks: 1, or tp / Hkv */
    uint32_t q_heads_per_rank;  /* query heads per rank: Hq / tp */
} cap_tp;

/* Split m's heads over tp ranks, as engines such as vLLM do: each rank holds Hkv / tp KV
 * heads when tp <= Hkv (Hkv must be a multiple of tp), and one KV head, replicated tp / Hkv
 * times, when tp > Hkv (tp must be a multiple of Hkv). Query heads must divide by tp.
 * Returns CAP_OK, or CAP_EINVAL with *what set to a static sentence. */
int cap_tp_split(const cap_model_shape *m, uint32_t tp, cap_tp *out, const char **what);

/* KV bytes of one token on one rank for the uniform model: 2 x L x kv_heads x D x s (int4:
 * ceil(D / 2) bytes per vector), without scales and ignoring m->layers. Pass m->n_kv_heads
 * for the whole (logical) model, or the tp split's kv_heads_per_rank for one GPU.
 * Returns CAP_OK, CAP_EINVAL (zero field), CAP_EOVERFLOW. */
int cap_token_bytes(const cap_model_shape *m, uint32_t kv_heads, uint64_t *out);

/* One run's cost on one rank (filled by cap_kv_cost). */
typedef struct cap_run_cost {
    cap_layer_run spec;   /* the run itself */
    uint32_t kv_heads;    /* full, sliding: KV heads stored on one rank */
    uint64_t token_bytes; /* full, sliding, latent: bytes per held token, all its layers */
    uint64_t state_bytes; /* state: bytes per sequence, all its layers */
    uint64_t fixed_bytes; /* per-tensor or per-head scales of its layers */
} cap_run_cost;

/* KV cost of a model on one rank of a tensor-parallel group. */
typedef struct cap_kv_cost {
    uint32_t n_runs;                /* runs (1 .. CAP_MAX_RUNS) */
    cap_run_cost run[CAP_MAX_RUNS]; /* run[0 .. n_runs) */
    uint32_t tp;                    /* ranks the model is split over */
    uint64_t token_all;             /* bytes of a token held in every layer (inside every
                                       window) */
    uint64_t token_full;            /* bytes of a token held for the whole sequence: full and
                                       latent layers only (a token beyond every window) */
    uint64_t state_bytes;           /* state bytes per sequence */
    uint64_t fixed_bytes;           /* scale bytes that do not grow with tokens */
    bool linear;                    /* no sliding or state layer: bytes = tokens x token_all */
} cap_kv_cost;

/* The KV cost of m on one of tp ranks. Full and sliding layers split their KV heads as
 * cap_tp_split does (Hkv / tp, or one head replicated when tp > Hkv); a latent is not split
 * (every rank holds it whole, as engines do for MLA under tensor parallelism); a state is
 * split evenly, ceil(bytes / tp). Scales: per-tensor and per-head are fixed bytes; per-token
 * adds one scale per stored vector; per-block:G adds ceil(elements / G) per vector.
 * Returns CAP_OK; CAP_EINVAL with *what set (a bad shape, tp 0, heads that do not split);
 * CAP_EOVERFLOW. */
int cap_kv_cost_of(const cap_model_shape *m, uint32_t tp, cap_kv_cost *out, const char **what);

/* Blocks of block_size tokens that a sliding layer holds for a sequence of len tokens with
 * window W: the blocks holding any of the last min(len, W) tokens, i.e.
 * ceil(len / bs) - floor((len - min(len, W)) / bs). Earlier blocks are freed (vLLM frees a
 * block once every token in it has left the window). At most ceil(W / bs) + 1.
 * Returns 0 when block_size is 0. Cannot fail. */
uint64_t cap_window_blocks(uint64_t len, uint32_t window, uint32_t block_size);

/* Bytes of one sequence of len tokens held contiguously (exact tokens): full and latent
 * layers len tokens, sliding layers min(len, W), plus the state. Returns CAP_OK, CAP_EINVAL
 * (c NULL), CAP_EOVERFLOW. */
int cap_seq_bytes(const cap_kv_cost *c, uint64_t len, uint64_t *out);

/* Bytes of one sequence of len tokens in paged blocks: full and latent layers
 * ceil(len / bs) blocks, sliding layers cap_window_blocks, each block bs tokens, plus the
 * state. Returns CAP_OK, CAP_EINVAL (c NULL or block_size 0), CAP_EOVERFLOW. */
int cap_seq_paged_bytes(const cap_kv_cost *c, uint64_t len, uint32_t block_size, uint64_t *out);

/* Bytes charged per cached prefix block of block_size tokens (replay --capacity SIZE): the
 * layers that keep every block of a cached prefix, full and latent, so bs x token_full. A
 * hit at the end of a prefix needs its sliding layers only for the last window and its state
 * layers for one state, per prefix end rather than per block: they are not charged. A model
 * whose attention is all windowed (token_full 0) is charged bs x token_all, as a single
 * block pool would be. Returns CAP_OK, CAP_EINVAL (c NULL, block_size 0, or a model with no
 * KV per token), CAP_EOVERFLOW. */
int cap_cache_block_bytes(const cap_kv_cost *c, uint32_t block_size, uint64_t *out);

/* *out = a * b, checked. Returns CAP_OK or CAP_EOVERFLOW (out untouched). */
int cap_mul(uint64_t a, uint64_t b, uint64_t *out);

/* *out = a + b, checked. Returns CAP_OK or CAP_EOVERFLOW (out untouched). */
int cap_add(uint64_t a, uint64_t b, uint64_t *out);

/* Number of blocks of block_size tokens that hold len tokens: ceil(len / block_size).
 * block_size must be > 0 (returns 0 otherwise). Cannot overflow. */
uint64_t cap_blocks_for(uint64_t len, uint32_t block_size);

/* Sum of lens[0 .. n). Returns CAP_OK or CAP_EOVERFLOW; lens may be NULL if n == 0. */
int cap_sum(const uint64_t *lens, size_t n, uint64_t *out);

/* Fragmentation of a set of sequences, in tokens. */
typedef struct cap_frag {
    uint64_t n_seqs;              /* sequences counted */
    uint64_t n_tokens;            /* sum of their lengths */
    uint64_t n_blocks;            /* paged: sum of ceil(len / block_size) */
    uint64_t paged_alloc_tokens;  /* paged: n_blocks x block_size */
    uint64_t paged_waste_tokens;  /* paged: sum of ceil(len/bs)*bs - len */
    uint64_t contig_alloc_tokens; /* contiguous: n_seqs x max_len (0 if max_len is 0) */
    uint64_t contig_waste_tokens; /* contiguous: sum of max_len - len (0 if max_len is 0) */
} cap_frag;

/* Compute the waste of paged blocks of block_size tokens and, when max_len > 0, of a
 * contiguous reservation of max_len tokens per sequence. Returns CAP_OK;
 * CAP_EINVAL (block_size 0, or a length above a non-zero max_len: it would not fit the
 * reservation); CAP_EOVERFLOW. */
int cap_fragmentation(const uint64_t *lens, size_t n, uint32_t block_size, uint64_t max_len,
                      cap_frag *out);

/* Inputs of the inverse plan, all per GPU except weights_bytes. */
typedef struct cap_mem_in {
    uint64_t gpu_mem_bytes; /* memory of one GPU */
    uint32_t util_ppm;      /* fraction usable, in millionths (900000 = 0.9), 1..1000000 */
    uint64_t weights_bytes; /* weights of the whole model, split evenly over tp ranks */
    uint64_t reserve_bytes; /* activations, workspace, allocator slack, per GPU */
    uint32_t tp;            /* tensor-parallel ranks (>= 1) */
    uint64_t block_bytes;   /* KV bytes of one block on one GPU */
    uint32_t block_size;    /* tokens per block */
    uint64_t fixed_bytes;   /* KV bytes that do not grow with tokens (scales), per GPU */
} cap_mem_in;

/* Result of the inverse plan, per GPU. Blocks are the same on every rank: a block of tokens
 * is spread over all ranks, each holding its share of the heads. */
typedef struct cap_mem_out {
    uint64_t budget_bytes;          /* floor(gpu_mem x util) */
    uint64_t weights_per_gpu_bytes; /* ceil(weights / tp) */
    uint64_t kv_bytes;              /* budget - weights per GPU - reserve - fixed */
    uint64_t n_blocks;              /* floor(kv_bytes / block_bytes) */
    uint64_t n_tokens;              /* n_blocks x block_size */
} cap_mem_out;

/* Memory left for the KV cache after weights, reserve and fixed KV bytes, as vLLM budgets it
 * (gpu_memory_utilization covers weights, activations and KV), and the whole blocks that fit.
 * Returns CAP_OK; CAP_EINVAL (zero memory, tp, block size or block bytes, util out
 * of range); CAP_ENOSPACE (weights + reserve + fixed >= budget: nothing left for KV);
 * CAP_EOVERFLOW. */
int cap_memory(const cap_mem_in *in, cap_mem_out *out);

/* Length statistics of a distribution. Percentiles use the nearest-rank method: the smallest
 * length such that at least p% of the lengths are <= it. */
typedef struct cap_stats {
    uint64_t n;   /* number of lengths (> 0) */
    uint64_t sum; /* sum of lengths */
    double mean;  /* sum / n */
    uint64_t min; /* shortest */
    uint64_t p50; /* median (nearest rank) */
    uint64_t p90; /* 90th percentile */
    uint64_t p99; /* 99th percentile */
    uint64_t max; /* longest */
} cap_stats;

/* Sort lens[0 .. n) ascending in place and compute *out. Returns CAP_OK,
 * CAP_EINVAL (n == 0 or lens NULL), CAP_EOVERFLOW (sum). */
int cap_len_stats(uint64_t *lens, size_t n, cap_stats *out);

/* Sum of the k largest of sorted_lens[0 .. n) (ascending order, as left by
 * cap_len_stats); when k > n, every length plus (k - n) more of the largest one, since k
 * requests drawn from the distribution can all be the longest. Returns CAP_OK,
 * CAP_EINVAL (n == 0), CAP_EOVERFLOW. */
int cap_sum_longest(const uint64_t *sorted_lens, size_t n, uint64_t k, uint64_t *out);

/* How many requests fit n_blocks when each takes blocks_each blocks: n_blocks / blocks_each
 * (0 if blocks_each is 0). Cannot fail. */
uint64_t cap_fit_count(uint64_t n_blocks, uint64_t blocks_each);

/* How many of the longest requests fit n_blocks, taking them longest first from
 * sorted_lens[0 .. n) (ascending) and cycling back to the longest when all were taken: the
 * worst-case concurrency for a distribution. Each takes ceil(len / block_size) blocks.
 * Returns the count; 0 when block_size is 0 or n is 0. Cannot fail. */
uint64_t cap_fit_longest(const uint64_t *sorted_lens, size_t n, uint32_t block_size,
                         uint64_t n_blocks);

/* How many of the longest requests fit budget bytes, taking them longest first from
 * sorted_lens[0 .. n) (ascending) and cycling back to the longest when all were taken, each
 * costing cap_seq_paged_bytes: the worst-case concurrency for a distribution under the
 * per-layer model. For a linear model it equals cap_fit_longest over budget / block bytes.
 * Returns the count; 0 when c is NULL, block_size is 0 or n is 0. Cannot fail (a cost that
 * overflows does not fit). */
uint64_t cap_fit_longest_bytes(const uint64_t *sorted_lens, size_t n, const cap_kv_cost *c,
                               uint32_t block_size, uint64_t budget);

#endif /* CLI_KVPLAN_H */
