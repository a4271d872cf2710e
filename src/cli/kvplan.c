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

int kvp_plan_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return KVP_PLAN_EOVERFLOW;
    *out = r;
    return KVP_PLAN_OK;
}

int kvp_plan_add(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return KVP_PLAN_EOVERFLOW;
    *out = r;
    return KVP_PLAN_OK;
}

/* The dtype table: names accepted on the command line and in config.json. */
static const struct {
    const char *name;
    kvp_plan_dtype dtype;
} dtype_names[] = {
    {"fp32", KVP_DTYPE_FP32},       {"float32", KVP_DTYPE_FP32},  {"float", KVP_DTYPE_FP32},
    {"fp16", KVP_DTYPE_FP16},       {"float16", KVP_DTYPE_FP16},  {"half", KVP_DTYPE_FP16},
    {"bf16", KVP_DTYPE_BF16},       {"bfloat16", KVP_DTYPE_BF16}, {"fp8", KVP_DTYPE_FP8},
    {"fp8_e4m3", KVP_DTYPE_FP8},    {"fp8_e5m2", KVP_DTYPE_FP8},  {"float8_e4m3fn", KVP_DTYPE_FP8},
    {"float8_e5m2", KVP_DTYPE_FP8}, {"int8", KVP_DTYPE_INT8},
};

int kvp_plan_dtype_parse(const char *s, kvp_plan_dtype *out)
{
    if (s == NULL || out == NULL)
        return KVP_PLAN_EINVAL;
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (strcasecmp(s, dtype_names[i].name) == 0) {
            *out = dtype_names[i].dtype;
            return KVP_PLAN_OK;
        }
    }
    return KVP_PLAN_EINVAL;
}

unsigned kvp_plan_dtype_bytes(kvp_plan_dtype dtype)
{
    switch (dtype) {
    case KVP_DTYPE_FP32:
        return 4;
    case KVP_DTYPE_FP16:
    case KVP_DTYPE_BF16:
        return 2;
    case KVP_DTYPE_FP8:
    case KVP_DTYPE_INT8:
        return 1;
    }
    return 0;
}

const char *kvp_plan_dtype_name(kvp_plan_dtype dtype)
{
    switch (dtype) {
    case KVP_DTYPE_FP32:
        return "fp32";
    case KVP_DTYPE_FP16:
        return "fp16";
    case KVP_DTYPE_BF16:
        return "bf16";
    case KVP_DTYPE_FP8:
        return "fp8";
    case KVP_DTYPE_INT8:
        return "int8";
    }
    return "?";
}

void kvp_model_shape_init(kvp_model_shape *m)
{
    if (m == NULL)
        return;
    memset(m, 0, sizeof *m);
    m->kv_dtype = KVP_DTYPE_BF16;
    m->w_dtype = KVP_DTYPE_BF16;
}

int kvp_model_shape_check(const kvp_model_shape *m, const char **what)
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
    else if (kvp_plan_dtype_bytes(m->kv_dtype) == 0 || kvp_plan_dtype_bytes(m->w_dtype) == 0)
        msg = "unknown dtype";
    if (msg != NULL) {
        if (what != NULL)
            *what = msg;
        return KVP_PLAN_EINVAL;
    }
    return KVP_PLAN_OK;
}

int kvp_plan_tp_split(const kvp_model_shape *m, uint32_t tp, kvp_plan_tp *out, const char **what)
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
        return KVP_PLAN_EINVAL;
    }
    kvp_plan_tp r;
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
    return KVP_PLAN_OK;
}

int kvp_plan_token_bytes(const kvp_model_shape *m, uint32_t kv_heads, uint64_t *out)
{
    if (m == NULL || out == NULL || m->n_layers == 0 || kv_heads == 0 || m->head_dim == 0)
        return KVP_PLAN_EINVAL;
    unsigned s = kvp_plan_dtype_bytes(m->kv_dtype);
    if (s == 0)
        return KVP_PLAN_EINVAL;
    uint64_t r = 2;
    if (kvp_plan_mul(r, m->n_layers, &r) || kvp_plan_mul(r, kv_heads, &r) ||
        kvp_plan_mul(r, m->head_dim, &r) || kvp_plan_mul(r, s, &r))
        return KVP_PLAN_EOVERFLOW;
    *out = r;
    return KVP_PLAN_OK;
}

uint64_t kvp_plan_blocks_for(uint64_t len, uint32_t block_size)
{
    if (block_size == 0)
        return 0;
    return len / block_size + (len % block_size != 0);
}

int kvp_plan_sum(const uint64_t *lens, size_t n, uint64_t *out)
{
    uint64_t s = 0;
    if (out == NULL || (lens == NULL && n > 0))
        return KVP_PLAN_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (kvp_plan_add(s, lens[i], &s))
            return KVP_PLAN_EOVERFLOW;
    *out = s;
    return KVP_PLAN_OK;
}

int kvp_plan_fragmentation(const uint64_t *lens, size_t n, uint32_t block_size, uint64_t max_len,
                           kvp_plan_frag *out)
{
    if (out == NULL || block_size == 0 || (lens == NULL && n > 0))
        return KVP_PLAN_EINVAL;
    kvp_plan_frag f = {0};
    f.n_seqs = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = lens[i];
        uint64_t nb = kvp_plan_blocks_for(len, block_size);
        uint64_t alloc;
        if (max_len > 0 && len > max_len)
            return KVP_PLAN_EINVAL;
        if (kvp_plan_add(f.n_tokens, len, &f.n_tokens) ||
            kvp_plan_add(f.n_blocks, nb, &f.n_blocks) || kvp_plan_mul(nb, block_size, &alloc) ||
            kvp_plan_add(f.paged_alloc_tokens, alloc, &f.paged_alloc_tokens) ||
            kvp_plan_add(f.paged_waste_tokens, alloc - len, &f.paged_waste_tokens))
            return KVP_PLAN_EOVERFLOW;
        if (max_len > 0 &&
            (kvp_plan_add(f.contig_alloc_tokens, max_len, &f.contig_alloc_tokens) ||
             kvp_plan_add(f.contig_waste_tokens, max_len - len, &f.contig_waste_tokens)))
            return KVP_PLAN_EOVERFLOW;
    }
    *out = f;
    return KVP_PLAN_OK;
}

int kvp_plan_memory(const kvp_plan_mem_in *in, kvp_plan_mem_out *out)
{
    if (in == NULL || out == NULL || in->gpu_mem_bytes == 0 || in->tp == 0 ||
        in->block_bytes == 0 || in->block_size == 0 || in->util_ppm == 0 || in->util_ppm > 1000000)
        return KVP_PLAN_EINVAL;
    kvp_plan_mem_out r;
    /* floor(g * p / 10^6) without a 128-bit product: g = q * 10^6 + rem. */
    uint64_t q = in->gpu_mem_bytes / 1000000, rem = in->gpu_mem_bytes % 1000000;
    r.budget_bytes = q * in->util_ppm + rem * in->util_ppm / 1000000;
    r.weights_per_gpu_bytes = in->weights_bytes / in->tp + (in->weights_bytes % in->tp != 0);
    uint64_t used;
    if (kvp_plan_add(r.weights_per_gpu_bytes, in->reserve_bytes, &used))
        return KVP_PLAN_ENOSPACE;
    if (used >= r.budget_bytes)
        return KVP_PLAN_ENOSPACE;
    r.kv_bytes = r.budget_bytes - used;
    r.n_blocks = r.kv_bytes / in->block_bytes;
    if (kvp_plan_mul(r.n_blocks, in->block_size, &r.n_tokens))
        return KVP_PLAN_EOVERFLOW;
    *out = r;
    return KVP_PLAN_OK;
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

int kvp_plan_len_stats(uint64_t *lens, size_t n, kvp_plan_stats *out)
{
    if (lens == NULL || n == 0 || out == NULL)
        return KVP_PLAN_EINVAL;
    kvp_plan_stats s;
    qsort(lens, n, sizeof lens[0], cmp_u64);
    if (kvp_plan_sum(lens, n, &s.sum))
        return KVP_PLAN_EOVERFLOW;
    s.n = n;
    s.mean = (double)s.sum / (double)n;
    s.min = lens[0];
    s.max = lens[n - 1];
    s.p50 = nearest_rank(lens, n, 50);
    s.p90 = nearest_rank(lens, n, 90);
    s.p99 = nearest_rank(lens, n, 99);
    *out = s;
    return KVP_PLAN_OK;
}

int kvp_plan_sum_longest(const uint64_t *sorted_lens, size_t n, uint64_t k, uint64_t *out)
{
    if (sorted_lens == NULL || n == 0 || out == NULL)
        return KVP_PLAN_EINVAL;
    uint64_t s = 0;
    uint64_t take = k < n ? k : n;
    for (uint64_t i = 0; i < take; i++)
        if (kvp_plan_add(s, sorted_lens[n - 1 - i], &s))
            return KVP_PLAN_EOVERFLOW;
    if (k > n) {
        uint64_t extra;
        if (kvp_plan_mul(k - n, sorted_lens[n - 1], &extra) || kvp_plan_add(s, extra, &s))
            return KVP_PLAN_EOVERFLOW;
    }
    *out = s;
    return KVP_PLAN_OK;
}

uint64_t kvp_plan_fit_count(uint64_t n_blocks, uint64_t blocks_each)
{
    return blocks_each == 0 ? 0 : n_blocks / blocks_each;
}

uint64_t kvp_plan_fit_longest(const uint64_t *sorted_lens, size_t n, uint32_t block_size,
                              uint64_t n_blocks)
{
    if (sorted_lens == NULL || n == 0 || block_size == 0)
        return 0;
    uint64_t count = 0, left = n_blocks;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = kvp_plan_blocks_for(sorted_lens[n - 1 - i], block_size);
        if (nb > left)
            return count;
        left -= nb;
        count++;
    }
    /* Every request fitted: further draws can all be the longest one again. */
    uint64_t nb_max = kvp_plan_blocks_for(sorted_lens[n - 1], block_size);
    if (nb_max == 0)
        return count; /* zero-length requests take no blocks: no meaningful bound */
    return count + left / nb_max;
}

/* A unit suffix and its multiplier. */
typedef struct unit {
    const char *name;
    uint64_t mult;
} unit;

/* Step 1: digits before the point; Step 2: up to 6 after it; Step 3: the unit, looked up
 * case-insensitively; Step 4: value = int * mult + frac * mult / 10^digits, checked. */
static int parse_scaled(const char *s, const unit *units, size_t n_units, uint64_t *out)
{
    if (s == NULL)
        return KVP_PLAN_EINVAL;
    const char *p = s;
    uint64_t ip = 0, frac = 0, scale = 1;
    int n_int = 0, n_frac = 0;

    /* Step 1: */
    while (isdigit((unsigned char)*p)) {
        if (kvp_plan_mul(ip, 10, &ip) || kvp_plan_add(ip, (uint64_t)(*p - '0'), &ip))
            return KVP_PLAN_EOVERFLOW;
        p++;
        n_int++;
    }
    /* Step 2: */
    if (*p == '.') {
        p++;
        while (isdigit((unsigned char)*p)) {
            if (n_frac == 6)
                return KVP_PLAN_EINVAL;
            frac = frac * 10 + (uint64_t)(*p - '0');
            scale *= 10;
            p++;
            n_frac++;
        }
        if (n_frac == 0)
            return KVP_PLAN_EINVAL;
    }
    if (n_int == 0 && n_frac == 0)
        return KVP_PLAN_EINVAL;
    /* Step 3: */
    uint64_t mult = 0;
    for (size_t i = 0; i < n_units; i++) {
        if (strcasecmp(p, units[i].name) == 0) {
            mult = units[i].mult;
            break;
        }
    }
    if (mult == 0)
        return KVP_PLAN_EINVAL;
    /* Step 4: frac < 10^6 and mult <= 2^40 keep frac * mult below 2^60. */
    uint64_t v;
    if (kvp_plan_mul(ip, mult, &v) || kvp_plan_add(v, frac * mult / scale, &v))
        return KVP_PLAN_EOVERFLOW;
    *out = v;
    return KVP_PLAN_OK;
}

int kvp_plan_parse_bytes(const char *s, uint64_t *out)
{
    static const unit units[] = {
        {"", 1},
        {"b", 1},
        {"kb", UINT64_C(1000)},
        {"mb", UINT64_C(1000000)},
        {"gb", UINT64_C(1000000000)},
        {"tb", UINT64_C(1000000000000)},
        {"kib", UINT64_C(1) << 10},
        {"mib", UINT64_C(1) << 20},
        {"gib", UINT64_C(1) << 30},
        {"tib", UINT64_C(1) << 40},
    };
    return parse_scaled(s, units, sizeof units / sizeof units[0], out);
}

int kvp_plan_parse_count(const char *s, uint64_t *out)
{
    static const unit units[] = {
        {"", 1},
        {"k", UINT64_C(1000)},
        {"m", UINT64_C(1000000)},
        {"b", UINT64_C(1000000000)},
        {"t", UINT64_C(1000000000000)},
    };
    return parse_scaled(s, units, sizeof units / sizeof units[0], out);
}

int kvp_plan_parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    if (s == NULL || *s == '\0')
        return KVP_PLAN_EINVAL;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return KVP_PLAN_EINVAL;
        if (kvp_plan_mul(v, 10, &v) || kvp_plan_add(v, (uint64_t)(*p - '0'), &v))
            return KVP_PLAN_EOVERFLOW;
    }
    if (v > max)
        return KVP_PLAN_EOVERFLOW;
    *out = v;
    return KVP_PLAN_OK;
}

int kvp_plan_parse_fraction(const char *s, uint32_t *ppm)
{
    static const unit units[] = {{"", 1000000}};
    uint64_t v;
    if (ppm == NULL || parse_scaled(s, units, 1, &v) != KVP_PLAN_OK || v == 0 || v > 1000000)
        return KVP_PLAN_EINVAL;
    *ppm = (uint32_t)v;
    return KVP_PLAN_OK;
}

char *kvp_plan_fmt_binary(uint64_t bytes, char *buf, size_t size)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned i = 0;
    while (i + 1 < sizeof names / sizeof names[0] && bytes >= (UINT64_C(1) << (10 * (i + 1))))
        i++;
    uint64_t unit_bytes = UINT64_C(1) << (10 * i);
    if (bytes % unit_bytes == 0)
        snprintf(buf, size, "%llu %s", (unsigned long long)(bytes / unit_bytes), names[i]);
    else
        snprintf(buf, size, "%.2f %s", (double)bytes / (double)unit_bytes, names[i]);
    return buf;
}
