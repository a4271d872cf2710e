/*
 * kvplan.c - KV-cache capacity arithmetic for `kvprefix plan` (see kvplan.h).
 *
 * Everything is exact integer arithmetic on uint64_t, checked with the compiler's overflow
 * builtins, so a figure is either exact or refused: a planning tool that silently wraps
 * would print a plausible but wrong capacity. Only the mean of a length distribution is a
 * double, and it is reported, never fed back into byte counts.
 *
 * Cost: O(1) per formula; fragmentation and sums are O(n); statistics sort, O(n log n).
 */
#include "kvplan.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int pl_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return PL_EOVERFLOW;
    *out = r;
    return PL_OK;
}

int pl_add(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return PL_EOVERFLOW;
    *out = r;
    return PL_OK;
}

/* The dtype table: names accepted on the command line and in config.json. */
static const struct {
    const char *name;
    pl_dtype dtype;
} dtype_names[] = {
    {"fp32", PL_DTYPE_FP32},       {"float32", PL_DTYPE_FP32},  {"float", PL_DTYPE_FP32},
    {"fp16", PL_DTYPE_FP16},       {"float16", PL_DTYPE_FP16},  {"half", PL_DTYPE_FP16},
    {"bf16", PL_DTYPE_BF16},       {"bfloat16", PL_DTYPE_BF16}, {"fp8", PL_DTYPE_FP8},
    {"fp8_e4m3", PL_DTYPE_FP8},    {"fp8_e5m2", PL_DTYPE_FP8},  {"float8_e4m3fn", PL_DTYPE_FP8},
    {"float8_e5m2", PL_DTYPE_FP8}, {"int8", PL_DTYPE_INT8},
};

int pl_dtype_parse(const char *s, pl_dtype *out)
{
    if (s == NULL || out == NULL)
        return PL_EINVAL;
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (strcasecmp(s, dtype_names[i].name) == 0) {
            *out = dtype_names[i].dtype;
            return PL_OK;
        }
    }
    return PL_EINVAL;
}

unsigned pl_dtype_bytes(pl_dtype dtype)
{
    switch (dtype) {
    case PL_DTYPE_FP32:
        return 4;
    case PL_DTYPE_FP16:
    case PL_DTYPE_BF16:
        return 2;
    case PL_DTYPE_FP8:
    case PL_DTYPE_INT8:
        return 1;
    }
    return 0;
}

const char *pl_dtype_name(pl_dtype dtype)
{
    switch (dtype) {
    case PL_DTYPE_FP32:
        return "fp32";
    case PL_DTYPE_FP16:
        return "fp16";
    case PL_DTYPE_BF16:
        return "bf16";
    case PL_DTYPE_FP8:
        return "fp8";
    case PL_DTYPE_INT8:
        return "int8";
    }
    return "?";
}

void pl_model_shape_init(pl_model_shape *m)
{
    if (m == NULL)
        return;
    memset(m, 0, sizeof *m);
    m->kv_dtype = PL_DTYPE_BF16;
    m->w_dtype = PL_DTYPE_BF16;
}

int pl_model_shape_check(const pl_model_shape *m, const char **what)
{
    const char *msg = NULL;
    if (m == NULL)
        msg = "no model shape";
    else if (m->n_layers == 0)
        msg = "the number of layers must be > 0";
    else if (m->n_heads == 0)
        msg = "the number of query heads must be > 0";
    else if (m->n_kv_heads == 0)
        msg = "the number of KV heads must be > 0";
    else if (m->head_dim == 0)
        msg = "the head dimension must be > 0";
    else if (m->n_kv_heads > m->n_heads)
        msg = "there cannot be more KV heads than query heads";
    else if (m->n_heads % m->n_kv_heads != 0)
        msg = "the query heads must be a multiple of the KV heads";
    else if (pl_dtype_bytes(m->kv_dtype) == 0 || pl_dtype_bytes(m->w_dtype) == 0)
        msg = "unknown dtype";
    if (msg != NULL) {
        if (what != NULL)
            *what = msg;
        return PL_EINVAL;
    }
    return PL_OK;
}

int pl_tp_split(const pl_model_shape *m, uint32_t tp, pl_tp *out, const char **what)
{
    const char *msg = NULL;
    if (m == NULL || out == NULL || tp == 0)
        msg = "the tensor-parallel size must be >= 1";
    else if (m->n_kv_heads == 0 || m->n_heads == 0)
        msg = "the model has no heads";
    else if (m->n_heads % tp != 0)
        msg = "the query heads must be a multiple of the tensor-parallel size";
    else if (tp <= m->n_kv_heads && m->n_kv_heads % tp != 0)
        msg = "the KV heads must be a multiple of the tensor-parallel size";
    else if (tp > m->n_kv_heads && tp % m->n_kv_heads != 0)
        msg = "the tensor-parallel size must be a multiple of the KV heads when it exceeds "
              "them (each KV head is then replicated)";
    if (msg != NULL) {
        if (what != NULL)
            *what = msg;
        return PL_EINVAL;
    }
    pl_tp r;
    r.tp = tp;
    if (tp <= m->n_kv_heads) {
        r.kv_heads_per_rank = m->n_kv_heads / tp;
        r.replication = 1;
    } else {
        r.kv_heads_per_rank = 1;
        r.replication = tp / m->n_kv_heads;
    }
    r.q_heads_per_rank = m->n_heads / tp;
    *out = r;
    return PL_OK;
}

int pl_token_bytes(const pl_model_shape *m, uint32_t kv_heads, uint64_t *out)
{
    if (m == NULL || out == NULL || m->n_layers == 0 || kv_heads == 0 || m->head_dim == 0)
        return PL_EINVAL;
    unsigned s = pl_dtype_bytes(m->kv_dtype);
    if (s == 0)
        return PL_EINVAL;
    uint64_t r = 2;
    if (pl_mul(r, m->n_layers, &r) || pl_mul(r, kv_heads, &r) || pl_mul(r, m->head_dim, &r) ||
        pl_mul(r, s, &r))
        return PL_EOVERFLOW;
    *out = r;
    return PL_OK;
}

uint64_t pl_blocks_for(uint64_t len, uint32_t block_size)
{
    if (block_size == 0)
        return 0;
    return len / block_size + (len % block_size != 0);
}

int pl_sum(const uint64_t *lens, size_t n, uint64_t *out)
{
    uint64_t s = 0;
    if (out == NULL || (lens == NULL && n > 0))
        return PL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (pl_add(s, lens[i], &s))
            return PL_EOVERFLOW;
    *out = s;
    return PL_OK;
}

int pl_fragmentation(const uint64_t *lens, size_t n, uint32_t block_size, uint64_t max_len,
                     pl_frag *out)
{
    if (out == NULL || block_size == 0 || (lens == NULL && n > 0))
        return PL_EINVAL;
    pl_frag f = {0};
    f.n_seqs = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = lens[i];
        uint64_t nb = pl_blocks_for(len, block_size);
        uint64_t alloc;
        if (max_len > 0 && len > max_len)
            return PL_EINVAL;
        if (pl_add(f.n_tokens, len, &f.n_tokens) || pl_add(f.n_blocks, nb, &f.n_blocks) ||
            pl_mul(nb, block_size, &alloc) ||
            pl_add(f.paged_alloc_tokens, alloc, &f.paged_alloc_tokens) ||
            pl_add(f.paged_waste_tokens, alloc - len, &f.paged_waste_tokens))
            return PL_EOVERFLOW;
        if (max_len > 0 && (pl_add(f.contig_alloc_tokens, max_len, &f.contig_alloc_tokens) ||
                            pl_add(f.contig_waste_tokens, max_len - len, &f.contig_waste_tokens)))
            return PL_EOVERFLOW;
    }
    *out = f;
    return PL_OK;
}

int pl_memory(const pl_mem_in *in, pl_mem_out *out)
{
    if (in == NULL || out == NULL || in->gpu_mem_bytes == 0 || in->tp == 0 ||
        in->block_bytes == 0 || in->block_size == 0 || in->util_ppm == 0 || in->util_ppm > 1000000)
        return PL_EINVAL;
    pl_mem_out r;
    /* floor(g * p / 10^6) without a 128-bit product: g = q * 10^6 + rem. */
    uint64_t q = in->gpu_mem_bytes / 1000000, rem = in->gpu_mem_bytes % 1000000;
    r.budget_bytes = q * in->util_ppm + rem * in->util_ppm / 1000000;
    r.weights_per_gpu_bytes = in->weights_bytes / in->tp + (in->weights_bytes % in->tp != 0);
    uint64_t used;
    if (pl_add(r.weights_per_gpu_bytes, in->reserve_bytes, &used))
        return PL_ENOSPACE;
    if (used >= r.budget_bytes)
        return PL_ENOSPACE;
    r.kv_bytes = r.budget_bytes - used;
    r.n_blocks = r.kv_bytes / in->block_bytes;
    if (pl_mul(r.n_blocks, in->block_size, &r.n_tokens))
        return PL_EOVERFLOW;
    *out = r;
    return PL_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the ceil(p/100 * n)-th smallest (1-based), for p in 1..100. */
static uint64_t nearest_rank(const uint64_t *sorted, size_t n, unsigned p)
{
    uint64_t rank = ((uint64_t)n * p + 99) / 100;
    if (rank == 0)
        rank = 1;
    return sorted[rank - 1];
}

int pl_len_stats(uint64_t *lens, size_t n, pl_stats *out)
{
    if (lens == NULL || n == 0 || out == NULL)
        return PL_EINVAL;
    pl_stats s;
    qsort(lens, n, sizeof lens[0], cmp_u64);
    if (pl_sum(lens, n, &s.sum))
        return PL_EOVERFLOW;
    s.n = n;
    s.mean = (double)s.sum / (double)n;
    s.min = lens[0];
    s.max = lens[n - 1];
    s.p50 = nearest_rank(lens, n, 50);
    s.p90 = nearest_rank(lens, n, 90);
    s.p99 = nearest_rank(lens, n, 99);
    *out = s;
    return PL_OK;
}

int pl_sum_longest(const uint64_t *sorted_lens, size_t n, uint64_t k, uint64_t *out)
{
    if (sorted_lens == NULL || n == 0 || out == NULL)
        return PL_EINVAL;
    uint64_t s = 0;
    uint64_t take = k < n ? k : n;
    for (uint64_t i = 0; i < take; i++)
        if (pl_add(s, sorted_lens[n - 1 - i], &s))
            return PL_EOVERFLOW;
    if (k > n) {
        uint64_t extra;
        if (pl_mul(k - n, sorted_lens[n - 1], &extra) || pl_add(s, extra, &s))
            return PL_EOVERFLOW;
    }
    *out = s;
    return PL_OK;
}

uint64_t pl_fit_count(uint64_t n_blocks, uint64_t blocks_each)
{
    return blocks_each == 0 ? 0 : n_blocks / blocks_each;
}

uint64_t pl_fit_longest(const uint64_t *sorted_lens, size_t n, uint32_t block_size,
                        uint64_t n_blocks)
{
    if (sorted_lens == NULL || n == 0 || block_size == 0)
        return 0;
    uint64_t count = 0, left = n_blocks;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = pl_blocks_for(sorted_lens[n - 1 - i], block_size);
        if (nb > left)
            return count;
        left -= nb;
        count++;
    }
    /* Every request fitted: further draws can all be the longest one again. */
    uint64_t nb_max = pl_blocks_for(sorted_lens[n - 1], block_size);
    if (nb_max == 0)
        return count; /* zero-length requests take no blocks: no meaningful bound */
    return count + left / nb_max;
}
