/*
 * kvplan.c - KV-cache capacity arithmetic for `kvprefix plan` (see kvplan.h).
 *
 * Everything is exact integer arithmetic on uint64_t, checked with the compiler's overflow
 * builtins, so a figure is either exact or refused: a planning tool that silently wraps
 * would print a plausible but wrong capacity. Only the mean of a length distribution is a
 * double, and it is reported, never fed back into byte counts.
 *
 * The per-layer model is resolved once into a cap_kv_cost (bytes per held token of each run
 * on one rank); a sequence's bytes are then a sum over at most CAP_MAX_RUNS runs, so the
 * per-layer model costs nothing per layer: a 61-layer model is one run.
 *
 * Cost: O(1) per formula (O(runs) per sequence); fragmentation and sums are O(n);
 * statistics sort, O(n log n).
 */
#include "kvplan.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int cap_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return CAP_EOVERFLOW;
    *out = r;
    return CAP_OK;
}

int cap_add(uint64_t a, uint64_t b, uint64_t *out)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return CAP_EOVERFLOW;
    *out = r;
    return CAP_OK;
}

/* The dtype table: names accepted on the command line and in config.json. */
static const struct {
    const char *name;
    cap_dtype dtype;
} dtype_names[] = {
    {"fp32", CAP_DTYPE_FP32},       {"float32", CAP_DTYPE_FP32},  {"float", CAP_DTYPE_FP32},
    {"fp16", CAP_DTYPE_FP16},       {"float16", CAP_DTYPE_FP16},  {"half", CAP_DTYPE_FP16},
    {"bf16", CAP_DTYPE_BF16},       {"bfloat16", CAP_DTYPE_BF16}, {"fp8", CAP_DTYPE_FP8},
    {"fp8_e4m3", CAP_DTYPE_FP8},    {"fp8_e5m2", CAP_DTYPE_FP8},  {"float8_e4m3fn", CAP_DTYPE_FP8},
    {"float8_e5m2", CAP_DTYPE_FP8}, {"int8", CAP_DTYPE_INT8},     {"int4", CAP_DTYPE_INT4},
};

int cap_dtype_parse(const char *s, cap_dtype *out)
{
    if (s == NULL || out == NULL)
        return CAP_EINVAL;
    for (size_t i = 0; i < sizeof dtype_names / sizeof dtype_names[0]; i++) {
        if (strcasecmp(s, dtype_names[i].name) == 0) {
            *out = dtype_names[i].dtype;
            return CAP_OK;
        }
    }
    return CAP_EINVAL;
}

unsigned cap_dtype_bytes(cap_dtype dtype)
{
    switch (dtype) {
    case CAP_DTYPE_FP32:
        return 4;
    case CAP_DTYPE_FP16:
    case CAP_DTYPE_BF16:
        return 2;
    case CAP_DTYPE_FP8:
    case CAP_DTYPE_INT8:
    case CAP_DTYPE_INT4:
        return 1;
    }
    return 0;
}

unsigned cap_dtype_bits(cap_dtype dtype)
{
    return dtype == CAP_DTYPE_INT4 ? 4 : 8 * cap_dtype_bytes(dtype);
}

int cap_elems_bytes(uint64_t n, cap_dtype dtype, uint64_t *out)
{
    unsigned bits = cap_dtype_bits(dtype);
    if (bits == 0 || out == NULL)
        return CAP_EINVAL;
    /* ceil(n x bits / 8) without overflowing the product: whole bytes, then the rest. */
    uint64_t q = n / 8, rem = n % 8, r;
    if (cap_mul(q, bits, &r) || cap_add(r, (rem * bits + 7) / 8, &r))
        return CAP_EOVERFLOW;
    *out = r;
    return CAP_OK;
}

const char *cap_dtype_name(cap_dtype dtype)
{
    switch (dtype) {
    case CAP_DTYPE_FP32:
        return "fp32";
    case CAP_DTYPE_FP16:
        return "fp16";
    case CAP_DTYPE_BF16:
        return "bf16";
    case CAP_DTYPE_FP8:
        return "fp8";
    case CAP_DTYPE_INT8:
        return "int8";
    case CAP_DTYPE_INT4:
        return "int4";
    }
    return "?";
}

void cap_model_shape_init(cap_model_shape *m)
{
    if (m == NULL)
        return;
    memset(m, 0, sizeof *m);
    m->kv_dtype = CAP_DTYPE_BF16;
    m->w_dtype = CAP_DTYPE_BF16;
    m->state_dtype = CAP_DTYPE_BF16;
    m->kv_quant.layout = CAP_SCALES_NONE;
    m->kv_quant.scale_dtype = CAP_DTYPE_FP32;
}

const char *cap_layer_kind_name(cap_layer_kind kind)
{
    switch (kind) {
    case CAP_LAYER_FULL:
        return "full";
    case CAP_LAYER_SLIDING:
        return "sliding";
    case CAP_LAYER_LATENT:
        return "latent";
    case CAP_LAYER_STATE:
        return "state";
    case CAP_LAYER_SHARED:
        return "shared";
    }
    return "?";
}

/* Why spec is not a valid run of its kind, or NULL. */
static const char *run_problem(const cap_layer_run *r)
{
    bool heads = r->n_kv_heads > 0 && r->head_dim > 0;
    if (r->n_layers == 0)
        return "a layer run has no layers";
    switch (r->kind) {
    case CAP_LAYER_FULL:
        return heads ? NULL : "a full-attention run needs KV heads and a head dimension";
    case CAP_LAYER_SLIDING:
        if (!heads)
            return "a sliding-window run needs KV heads and a head dimension";
        return r->window > 0 ? NULL : "a sliding-window run needs a window > 0";
    case CAP_LAYER_LATENT:
        return r->latent_dim > 0 ? NULL : "a latent run needs latent elements > 0";
    case CAP_LAYER_STATE:
        return r->state_elems > 0 ? NULL : "a state run needs state elements > 0";
    case CAP_LAYER_SHARED:
        return NULL;
    }
    return "unknown layer kind";
}

static bool same_layout(const cap_layer_run *a, const cap_layer_run *b)
{
    return a->kind == b->kind && a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           a->window == b->window && a->latent_dim == b->latent_dim &&
           a->state_elems == b->state_elems;
}

int cap_layers_add(cap_layers *ls, const cap_layer_run *spec, uint32_t n)
{
    if (ls == NULL || spec == NULL || n == 0 || ls->n_runs > CAP_MAX_RUNS)
        return CAP_EINVAL;
    cap_layer_run r = *spec;
    r.n_layers = n;
    if (run_problem(&r) != NULL)
        return CAP_EINVAL;
    for (uint32_t i = 0; i < ls->n_runs; i++) {
        if (same_layout(&ls->run[i], &r)) {
            uint32_t sum;
            if (__builtin_add_overflow(ls->run[i].n_layers, n, &sum))
                return CAP_EOVERFLOW;
            ls->run[i].n_layers = sum;
            return CAP_OK;
        }
    }
    if (ls->n_runs == CAP_MAX_RUNS)
        return CAP_EINVAL;
    ls->run[ls->n_runs++] = r;
    return CAP_OK;
}

int cap_model_set_window(cap_model_shape *m, uint32_t window)
{
    if (m == NULL || m->n_layers == 0)
        return CAP_EINVAL;
    cap_layers in = m->layers, out = {0};
    if (in.n_runs == 0)
        in = (cap_layers){1, {{CAP_LAYER_FULL, m->n_layers, m->n_kv_heads, m->head_dim, 0, 0, 0}}};
    bool any_sliding = false, changed = false;
    for (uint32_t i = 0; i < in.n_runs; i++)
        any_sliding |= in.run[i].kind == CAP_LAYER_SLIDING;
    for (uint32_t i = 0; i < in.n_runs; i++) {
        cap_layer_run r = in.run[i];
        if (r.kind == CAP_LAYER_SLIDING && window == 0) {
            r.kind = CAP_LAYER_FULL;
            r.window = 0;
            changed = true;
        } else if ((r.kind == CAP_LAYER_SLIDING || (!any_sliding && r.kind == CAP_LAYER_FULL)) &&
                   window > 0) {
            r.kind = CAP_LAYER_SLIDING;
            r.window = window;
            changed = true;
        }
        if (cap_layers_add(&out, &r, r.n_layers) != CAP_OK)
            return CAP_EINVAL;
    }
    if (!changed && window > 0)
        return CAP_EINVAL;
    m->layers = out.n_runs == 1 && out.run[0].kind == CAP_LAYER_FULL ? (cap_layers){0} : out;
    return CAP_OK;
}

/* Why m's layer runs or KV scales are inconsistent, or NULL. */
static const char *layers_problem(const cap_model_shape *m)
{
    const cap_layers *ls = &m->layers;
    uint64_t sum = 0;
    bool quant = cap_dtype_is_quantized(m->kv_dtype);
    if (quant && m->kv_quant.layout == CAP_SCALES_NONE)
        return "a quantized KV dtype needs a scale layout";
    if (!quant && m->kv_quant.layout != CAP_SCALES_NONE)
        return "KV scales apply to fp8, int8 and int4 KV only";
    if (quant && (cap_dtype_bytes(m->kv_quant.scale_dtype) == 0 ||
                  m->kv_quant.scale_dtype == CAP_DTYPE_INT4))
        return "the scale dtype must be fp32, fp16, bf16, fp8 or int8";
    if (m->kv_quant.layout == CAP_SCALES_GROUP && m->kv_quant.group == 0)
        return "per-block scales need a group of elements > 0";
    if (ls->n_runs > CAP_MAX_RUNS)
        return "too many layer runs";
    for (uint32_t i = 0; i < ls->n_runs; i++) {
        const char *p = run_problem(&ls->run[i]);
        if (p != NULL)
            return p;
        sum += ls->run[i].n_layers;
    }
    if (ls->n_runs > 0 && sum != m->n_layers)
        return "the layer runs do not add up to the number of layers";
    return NULL;
}

int cap_model_shape_check(const cap_model_shape *m, const char **what)
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
    else if (cap_dtype_bytes(m->kv_dtype) == 0 || cap_dtype_bytes(m->w_dtype) == 0 ||
             cap_dtype_bytes(m->state_dtype) == 0)
        msg = "unknown dtype";
    else
        msg = layers_problem(m);
    if (msg != NULL) {
        if (what != NULL)
            *what = msg;
        return CAP_EINVAL;
    }
    return CAP_OK;
}

int cap_tp_split(const cap_model_shape *m, uint32_t tp, cap_tp *out, const char **what)
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
        return CAP_EINVAL;
    }
    cap_tp r;
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
    return CAP_OK;
}

int cap_token_bytes(const cap_model_shape *m, uint32_t kv_heads, uint64_t *out)
{
    if (m == NULL || out == NULL || m->n_layers == 0 || kv_heads == 0 || m->head_dim == 0)
        return CAP_EINVAL;
    if (cap_dtype_bits(m->kv_dtype) == 0)
        return CAP_EINVAL;
    uint64_t r;
    if (cap_elems_bytes(m->head_dim, m->kv_dtype, &r) || cap_mul(r, 2, &r) ||
        cap_mul(r, m->n_layers, &r) || cap_mul(r, kv_heads, &r))
        return CAP_EOVERFLOW;
    *out = r;
    return CAP_OK;
}

static const struct {
    const char *name;
    cap_scales layout;
} scale_names[] = {
    {"per-tensor", CAP_SCALES_TENSOR},
    {"per-head", CAP_SCALES_HEAD},
    {"per-token", CAP_SCALES_TOKEN},
};

int cap_scales_parse(const char *s, cap_kv_quant *out)
{
    if (s == NULL || out == NULL)
        return CAP_EINVAL;
    for (size_t i = 0; i < sizeof scale_names / sizeof scale_names[0]; i++) {
        if (strcasecmp(s, scale_names[i].name) == 0) {
            out->layout = scale_names[i].layout;
            out->group = 0;
            return CAP_OK;
        }
    }
    static const char prefix[] = "per-block:";
    if (strncasecmp(s, prefix, sizeof prefix - 1) != 0)
        return CAP_EINVAL;
    const char *g = s + sizeof prefix - 1;
    unsigned long v = 0;
    size_t n = 0;
    for (; g[n] >= '0' && g[n] <= '9' && n < 6; n++)
        v = v * 10 + (unsigned long)(g[n] - '0');
    if (n == 0 || g[n] != '\0' || v == 0 || v > 65536)
        return CAP_EINVAL;
    out->layout = CAP_SCALES_GROUP;
    out->group = (uint32_t)v;
    return CAP_OK;
}

const char *cap_scales_name(cap_scales layout)
{
    switch (layout) {
    case CAP_SCALES_NONE:
        return "none";
    case CAP_SCALES_TENSOR:
        return "per-tensor";
    case CAP_SCALES_HEAD:
        return "per-head";
    case CAP_SCALES_TOKEN:
        return "per-token";
    case CAP_SCALES_GROUP:
        return "per-block";
    }
    return "?";
}

/* Bytes of one stored vector of n elements (one head's K or V of one token, or one latent)
 * with its per-token or per-block scales. Returns CAP_OK or CAP_EOVERFLOW. */
static int vector_bytes(const cap_model_shape *m, uint32_t n, uint64_t *out)
{
    uint64_t b, n_scales = 0, sb;
    if (cap_elems_bytes(n, m->kv_dtype, &b))
        return CAP_EOVERFLOW;
    if (m->kv_quant.layout == CAP_SCALES_TOKEN)
        n_scales = 1;
    else if (m->kv_quant.layout == CAP_SCALES_GROUP)
        n_scales = n / m->kv_quant.group + (n % m->kv_quant.group != 0);
    if (cap_mul(n_scales, cap_dtype_bytes(m->kv_quant.scale_dtype), &sb) || cap_add(b, sb, &b))
        return CAP_EOVERFLOW;
    *out = b;
    return CAP_OK;
}

/* KV heads of one rank for hkv heads over tp ranks, as cap_tp_split. Returns the count, or 0
 * when the heads do not split. */
static uint32_t heads_per_rank(uint32_t hkv, uint32_t tp)
{
    if (tp <= hkv)
        return hkv % tp == 0 ? hkv / tp : 0;
    return tp % hkv == 0 ? 1 : 0;
}

/* Fixed scale bytes of a run: per-tensor one scale per stored tensor (K and V, or the
 * latent), per-head one per head of it. Returns CAP_OK or CAP_EOVERFLOW. */
static int run_fixed(const cap_model_shape *m, const cap_run_cost *rc, uint64_t *out)
{
    uint64_t tensors = rc->spec.kind == CAP_LAYER_LATENT ? 1 : 2, heads = 1, r;
    cap_scales l = m->kv_quant.layout;
    if (l != CAP_SCALES_TENSOR && l != CAP_SCALES_HEAD) {
        *out = 0;
        return CAP_OK;
    }
    if (l == CAP_SCALES_HEAD && rc->spec.kind != CAP_LAYER_LATENT)
        heads = rc->kv_heads;
    if (cap_mul(tensors, heads, &r) || cap_mul(r, rc->spec.n_layers, &r) ||
        cap_mul(r, cap_dtype_bytes(m->kv_quant.scale_dtype), &r))
        return CAP_EOVERFLOW;
    *out = r;
    return CAP_OK;
}

/* Cost of one run on one rank into *rc (spec already set). Returns CAP_OK, CAP_EINVAL with
 * *what (heads that do not split over tp), CAP_EOVERFLOW. */
static int run_cost(const cap_model_shape *m, uint32_t tp, cap_run_cost *rc, const char **what)
{
    const cap_layer_run *s = &rc->spec;
    uint64_t v;
    switch (s->kind) {
    case CAP_LAYER_FULL:
    case CAP_LAYER_SLIDING:
        rc->kv_heads = heads_per_rank(s->n_kv_heads, tp);
        if (rc->kv_heads == 0) {
            *what = "the KV heads of a layer run do not split over the tensor-parallel size";
            return CAP_EINVAL;
        }
        if (vector_bytes(m, s->head_dim, &v) || cap_mul(v, 2, &v) || cap_mul(v, rc->kv_heads, &v) ||
            cap_mul(v, s->n_layers, &rc->token_bytes))
            return CAP_EOVERFLOW;
        break;
    case CAP_LAYER_LATENT:
        if (vector_bytes(m, s->latent_dim, &v) || cap_mul(v, s->n_layers, &rc->token_bytes))
            return CAP_EOVERFLOW;
        break;
    case CAP_LAYER_STATE:
        if (cap_elems_bytes(s->state_elems, m->state_dtype, &v))
            return CAP_EOVERFLOW;
        v = v / tp + (v % tp != 0);
        if (cap_mul(v, s->n_layers, &rc->state_bytes))
            return CAP_EOVERFLOW;
        break;
    case CAP_LAYER_SHARED:
        break;
    }
    return run_fixed(m, rc, &rc->fixed_bytes);
}

/* Steps: 1 check the shape and resolve the uniform model into one run; 2 cost each run;
 * 3 sum the per-token, per-sequence and fixed figures. */
int cap_kv_cost_of(const cap_model_shape *m, uint32_t tp, cap_kv_cost *out, const char **what)
{
    const char *dummy;
    if (what == NULL)
        what = &dummy;
    if (out == NULL || tp == 0) {
        *what = "the tensor-parallel size must be >= 1";
        return CAP_EINVAL;
    }
    if (cap_model_shape_check(m, what) != CAP_OK)
        return CAP_EINVAL;
    /* Step 1: */
    cap_kv_cost c;
    memset(&c, 0, sizeof c);
    c.tp = tp;
    c.linear = true;
    cap_layers uniform = {1, {{CAP_LAYER_FULL, m->n_layers, m->n_kv_heads, m->head_dim, 0, 0, 0}}};
    const cap_layers *ls = m->layers.n_runs > 0 ? &m->layers : &uniform;
    c.n_runs = ls->n_runs;
    for (uint32_t i = 0; i < c.n_runs; i++) {
        cap_run_cost *rc = &c.run[i];
        rc->spec = ls->run[i];
        /* Step 2: */
        int rc_code = run_cost(m, tp, rc, what);
        if (rc_code != CAP_OK)
            return rc_code;
        /* Step 3: */
        bool whole = rc->spec.kind == CAP_LAYER_FULL || rc->spec.kind == CAP_LAYER_LATENT;
        if (cap_add(c.token_all, rc->token_bytes, &c.token_all) ||
            (whole && cap_add(c.token_full, rc->token_bytes, &c.token_full)) ||
            cap_add(c.state_bytes, rc->state_bytes, &c.state_bytes) ||
            cap_add(c.fixed_bytes, rc->fixed_bytes, &c.fixed_bytes))
            return CAP_EOVERFLOW;
        if (rc->spec.kind == CAP_LAYER_SLIDING || rc->spec.kind == CAP_LAYER_STATE)
            c.linear = false;
    }
    *out = c;
    return CAP_OK;
}

uint64_t cap_window_blocks(uint64_t len, uint32_t window, uint32_t block_size)
{
    if (block_size == 0)
        return 0;
    uint64_t held = len < window ? len : window;
    return cap_blocks_for(len, block_size) - (len - held) / block_size;
}

/* Sum over the runs of token_bytes x held(run), plus the state; held() gives the tokens
 * (contiguous) or the block tokens (paged) a run holds. */
static int seq_sum(const cap_kv_cost *c, uint64_t len, uint32_t bs, uint64_t *out)
{
    uint64_t total = c->state_bytes;
    for (uint32_t i = 0; i < c->n_runs; i++) {
        const cap_run_cost *rc = &c->run[i];
        uint64_t held, b;
        if (rc->token_bytes == 0)
            continue;
        if (bs == 0)
            held =
                rc->spec.kind == CAP_LAYER_SLIDING && len > rc->spec.window ? rc->spec.window : len;
        else if (rc->spec.kind == CAP_LAYER_SLIDING)
            held = cap_window_blocks(len, rc->spec.window, bs) * bs;
        else
            held = cap_blocks_for(len, bs) * bs;
        if (cap_mul(held, rc->token_bytes, &b) || cap_add(total, b, &total))
            return CAP_EOVERFLOW;
    }
    *out = total;
    return CAP_OK;
}

int cap_seq_bytes(const cap_kv_cost *c, uint64_t len, uint64_t *out)
{
    if (c == NULL || out == NULL)
        return CAP_EINVAL;
    return seq_sum(c, len, 0, out);
}

int cap_seq_paged_bytes(const cap_kv_cost *c, uint64_t len, uint32_t block_size, uint64_t *out)
{
    if (c == NULL || out == NULL || block_size == 0)
        return CAP_EINVAL;
    return seq_sum(c, len, block_size, out);
}

int cap_cache_block_bytes(const cap_kv_cost *c, uint32_t block_size, uint64_t *out)
{
    if (c == NULL || out == NULL || block_size == 0)
        return CAP_EINVAL;
    uint64_t per_token = c->token_full > 0 ? c->token_full : c->token_all;
    if (per_token == 0)
        return CAP_EINVAL;
    return cap_mul(per_token, block_size, out);
}

uint64_t cap_blocks_for(uint64_t len, uint32_t block_size)
{
    if (block_size == 0)
        return 0;
    return len / block_size + (len % block_size != 0);
}

int cap_sum(const uint64_t *lens, size_t n, uint64_t *out)
{
    uint64_t s = 0;
    if (out == NULL || (lens == NULL && n > 0))
        return CAP_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (cap_add(s, lens[i], &s))
            return CAP_EOVERFLOW;
    *out = s;
    return CAP_OK;
}

int cap_fragmentation(const uint64_t *lens, size_t n, uint32_t block_size, uint64_t max_len,
                      cap_frag *out)
{
    if (out == NULL || block_size == 0 || (lens == NULL && n > 0))
        return CAP_EINVAL;
    cap_frag f = {0};
    f.n_seqs = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = lens[i];
        uint64_t nb = cap_blocks_for(len, block_size);
        uint64_t alloc;
        if (max_len > 0 && len > max_len)
            return CAP_EINVAL;
        if (cap_add(f.n_tokens, len, &f.n_tokens) || cap_add(f.n_blocks, nb, &f.n_blocks) ||
            cap_mul(nb, block_size, &alloc) ||
            cap_add(f.paged_alloc_tokens, alloc, &f.paged_alloc_tokens) ||
            cap_add(f.paged_waste_tokens, alloc - len, &f.paged_waste_tokens))
            return CAP_EOVERFLOW;
        if (max_len > 0 && (cap_add(f.contig_alloc_tokens, max_len, &f.contig_alloc_tokens) ||
                            cap_add(f.contig_waste_tokens, max_len - len, &f.contig_waste_tokens)))
            return CAP_EOVERFLOW;
    }
    *out = f;
    return CAP_OK;
}

int cap_memory(const cap_mem_in *in, cap_mem_out *out)
{
    if (in == NULL || out == NULL || in->gpu_mem_bytes == 0 || in->tp == 0 ||
        in->block_bytes == 0 || in->block_size == 0 || in->util_ppm == 0 || in->util_ppm > 1000000)
        return CAP_EINVAL;
    cap_mem_out r;
    /* floor(g * p / 10^6) without a 128-bit product: g = q * 10^6 + rem. */
    uint64_t q = in->gpu_mem_bytes / 1000000, rem = in->gpu_mem_bytes % 1000000;
    r.budget_bytes = q * in->util_ppm + rem * in->util_ppm / 1000000;
    r.weights_per_gpu_bytes = in->weights_bytes / in->tp + (in->weights_bytes % in->tp != 0);
    uint64_t used;
    if (cap_add(r.weights_per_gpu_bytes, in->reserve_bytes, &used) ||
        cap_add(used, in->fixed_bytes, &used))
        return CAP_ENOSPACE;
    if (used >= r.budget_bytes)
        return CAP_ENOSPACE;
    r.kv_bytes = r.budget_bytes - used;
    r.n_blocks = r.kv_bytes / in->block_bytes;
    if (cap_mul(r.n_blocks, in->block_size, &r.n_tokens))
        return CAP_EOVERFLOW;
    *out = r;
    return CAP_OK;
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

int cap_len_stats(uint64_t *lens, size_t n, cap_stats *out)
{
    if (lens == NULL || n == 0 || out == NULL)
        return CAP_EINVAL;
    cap_stats s;
    qsort(lens, n, sizeof lens[0], cmp_u64);
    if (cap_sum(lens, n, &s.sum))
        return CAP_EOVERFLOW;
    s.n = n;
    s.mean = (double)s.sum / (double)n;
    s.min = lens[0];
    s.max = lens[n - 1];
    s.p50 = nearest_rank(lens, n, 50);
    s.p90 = nearest_rank(lens, n, 90);
    s.p99 = nearest_rank(lens, n, 99);
    *out = s;
    return CAP_OK;
}

int cap_sum_longest(const uint64_t *sorted_lens, size_t n, uint64_t k, uint64_t *out)
{
    if (sorted_lens == NULL || n == 0 || out == NULL)
        return CAP_EINVAL;
    uint64_t s = 0;
    uint64_t take = k < n ? k : n;
    for (uint64_t i = 0; i < take; i++)
        if (cap_add(s, sorted_lens[n - 1 - i], &s))
            return CAP_EOVERFLOW;
    if (k > n) {
        uint64_t extra;
        if (cap_mul(k - n, sorted_lens[n - 1], &extra) || cap_add(s, extra, &s))
            return CAP_EOVERFLOW;
    }
    *out = s;
    return CAP_OK;
}

uint64_t cap_fit_count(uint64_t n_blocks, uint64_t blocks_each)
{
    return blocks_each == 0 ? 0 : n_blocks / blocks_each;
}

uint64_t cap_fit_longest(const uint64_t *sorted_lens, size_t n, uint32_t block_size,
                         uint64_t n_blocks)
{
    if (sorted_lens == NULL || n == 0 || block_size == 0)
        return 0;
    uint64_t count = 0, left = n_blocks;
    for (size_t i = 0; i < n; i++) {
        uint64_t nb = cap_blocks_for(sorted_lens[n - 1 - i], block_size);
        if (nb > left)
            return count;
        left -= nb;
        count++;
    }
    /* Every request fitted: further draws can all be the longest one again. */
    uint64_t nb_max = cap_blocks_for(sorted_lens[n - 1], block_size);
    if (nb_max == 0)
        return count; /* zero-length requests take no blocks: no meaningful bound */
    return count + left / nb_max;
}

uint64_t cap_fit_longest_bytes(const uint64_t *sorted_lens, size_t n, const cap_kv_cost *c,
                               uint32_t block_size, uint64_t budget)
{
    if (sorted_lens == NULL || n == 0 || c == NULL || block_size == 0)
        return 0;
    uint64_t count = 0, left = budget, b;
    for (size_t i = 0; i < n; i++) {
        if (cap_seq_paged_bytes(c, sorted_lens[n - 1 - i], block_size, &b) != CAP_OK || b > left)
            return count;
        left -= b;
        count++;
    }
    /* Every request fitted: further draws can all be the longest one again. */
    if (cap_seq_paged_bytes(c, sorted_lens[n - 1], block_size, &b) != CAP_OK || b == 0)
        return count; /* requests that cost nothing: no meaningful bound */
    return count + left / b;
}
