/*
 * plan_report.c - renders a `kvprefix plan` result (plan.h) as the readable table or as
 * JSON (jansson): per-token/block/sequence/batch KV bytes, fragmentation, the transient
 * attention workspace, the memory plan per GPU, trace statistics, and the notes on what the
 * figures leave out. Nothing here computes a plan; plan.c and kvplan.c do.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "escape.h"
#include "flags.h"
#include "plan.h"

static int json_oom(void)
{
    fputs("kvprefix plan: out of memory building the JSON output\n", stderr);
    return 1;
}

/* ---- table output ---------------------------------------------------------------------- */

static const char *attn_kind(const cap_model_shape *m)
{
    for (uint32_t i = 0; i < m->layers.n_runs; i++)
        if (m->layers.run[i].kind == CAP_LAYER_LATENT)
            return "MLA";
    if (m->n_kv_heads == m->n_heads)
        return "MHA";
    if (m->n_kv_heads == 1)
        return "MQA";
    return "GQA";
}

/* One row of bytes: per GPU, and for all GPUs when tp > 1. */
static void row(const plan_result *r, const char *label, uint64_t gpu)
{
    char b[32];
    printf("  %-40s %20llu  %*s", label, (unsigned long long)gpu, r->tp.tp > 1 ? -12 : 0,
           cli_fmt_binary(gpu, b, sizeof b));
    if (r->tp.tp > 1) {
        uint64_t all;
        if (cap_mul(gpu, r->tp.tp, &all))
            printf("  (overflow)");
        else
            printf("  %20llu  %s", (unsigned long long)all, cli_fmt_binary(all, b, sizeof b));
    }
    putchar('\n');
}

static void header(const plan_result *r, const char *title)
{
    printf("\n%-42s %20s", title, r->tp.tp > 1 ? "bytes per GPU" : "bytes");
    if (r->tp.tp > 1)
        printf("  %-12s  %20s", "", "bytes, all GPUs");
    putchar('\n');
}

static double pct(uint64_t part, uint64_t whole)
{
    return whole == 0 ? 0.0 : 100.0 * (double)part / (double)whole;
}

static void print_frag(const plan_result *r, const cap_frag *f, uint64_t max_len, bool given,
                       uint64_t waste_paged, uint64_t waste_contig)
{
    char label[96];
    double n = f->n_seqs ? (double)f->n_seqs : 1.0;
    printf("  paged, %u-token blocks: %llu blocks for %llu tokens\n", r->block_size,
           (unsigned long long)f->n_blocks, (unsigned long long)f->n_tokens);
    printf("    waste in partial last blocks: %llu tokens, %.1f per sequence, %.2f%% of "
           "allocated\n",
           (unsigned long long)f->paged_waste_tokens, (double)f->paged_waste_tokens / n,
           pct(f->paged_waste_tokens, f->paged_alloc_tokens));
    printf("  contiguous, %llu tokens reserved per sequence%s\n", (unsigned long long)max_len,
           given ? " (--max-len)" : " (the longest; set --max-len)");
    printf("    waste up to the reservation: %llu tokens, %.1f per sequence, %.2f%% of "
           "allocated\n",
           (unsigned long long)f->contig_waste_tokens, (double)f->contig_waste_tokens / n,
           pct(f->contig_waste_tokens, f->contig_alloc_tokens));
    header(r, "  waste in KV bytes");
    snprintf(label, sizeof label, "paged");
    row(r, label, waste_paged);
    snprintf(label, sizeof label, "contiguous");
    row(r, label, waste_contig);
    if (!r->cost.linear)
        printf("    (per layer: a sliding layer holds its window's blocks, a state layer no "
               "blocks)\n");
}

/* Whether the model is the seed's uniform standard-attention model. */
static bool is_uniform(const plan_result *r)
{
    return r->m.layers.n_runs == 0;
}

/* One line per layer run: what it holds, per layer. */
static void print_runs(const plan_result *r)
{
    for (uint32_t i = 0; i < r->cost.n_runs; i++) {
        const cap_layer_run *l = &r->cost.run[i].spec;
        printf("  %s %3u x ", i == 0 ? "layers:" : "       ", l->n_layers);
        switch (l->kind) {
        case CAP_LAYER_FULL:
            printf("full attention, %u KV heads x %u\n", l->n_kv_heads, l->head_dim);
            break;
        case CAP_LAYER_SLIDING:
            printf("sliding window of %u tokens, %u KV heads x %u\n", l->window, l->n_kv_heads,
                   l->head_dim);
            break;
        case CAP_LAYER_LATENT:
            printf("latent (MLA), %u elements per token, shared by all heads\n", l->latent_dim);
            break;
        case CAP_LAYER_STATE:
            printf("recurrent state, %llu %s elements per sequence\n",
                   (unsigned long long)l->state_elems, cap_dtype_name(r->m.state_dtype));
            break;
        case CAP_LAYER_SHARED:
            printf("shared KV (reads an earlier layer's)\n");
            break;
        }
    }
}

/* The KV dtype and its scales. */
static void print_dtypes(const plan_result *r)
{
    const cap_model_shape *m = &r->m;
    unsigned bits = cap_dtype_bits(m->kv_dtype);
    if (bits % 8 == 0)
        printf("  KV dtype %s (%u byte%s per element)", cap_dtype_name(m->kv_dtype), bits / 8,
               bits == 8 ? "" : "s");
    else
        printf("  KV dtype %s (%u bits per element)", cap_dtype_name(m->kv_dtype), bits);
    if (m->kv_quant.layout == CAP_SCALES_GROUP)
        printf(", per-block scales (one per %u elements), %s", m->kv_quant.group,
               cap_dtype_name(m->kv_quant.scale_dtype));
    else if (m->kv_quant.layout != CAP_SCALES_NONE)
        printf(", %s scales, %s", cap_scales_name(m->kv_quant.layout),
               cap_dtype_name(m->kv_quant.scale_dtype));
    printf("; weight dtype %s", cap_dtype_name(m->w_dtype));
    if (m->n_params)
        printf(", %llu parameters", (unsigned long long)m->n_params);
    printf("\n");
}

/* The model, its dtypes and the tensor-parallel split. */
static void print_model_section(const plan_result *r, const plan_opts *o)
{
    const cap_model_shape *m = &r->m;
    if (is_uniform(r))
        printf("kvprefix plan: logical KV-cache bytes = 2 x L x Hkv x D x s per token\n\n");
    else
        printf("kvprefix plan: logical KV-cache bytes, summed over the model's layer runs\n\n");
    fputs("Model: ", stdout);
    cli_put_escaped(stdout, r->model_label, strlen(r->model_label));
    printf("\n  source: %s\n", r->model_source);
    printf("  %u layers, %u query heads%s, %u KV heads (%s", m->n_layers, m->n_heads,
           r->heads_assumed ? " (assumed equal to KV heads: give --heads)" : "", m->n_kv_heads,
           attn_kind(m));
    if (m->n_kv_heads != m->n_heads)
        printf(", %u query heads per KV head", m->n_heads / m->n_kv_heads);
    printf("), head dim %u\n", m->head_dim);
    if (r->max_context)
        printf("  context length %llu tokens%s\n", (unsigned long long)r->max_context,
               r->longest > r->max_context ? " (this plan goes beyond it)" : "");
    if (r->block_why)
        printf("  block size %s\n", r->block_why);
    if (!is_uniform(r))
        print_runs(r);
    print_dtypes(r);
    if (r->tp.tp > 1) {
        printf("Tensor parallelism: %u GPUs, %u KV head%s and %u query heads per GPU", r->tp.tp,
               r->tp.kv_heads_per_rank, r->tp.kv_heads_per_rank == 1 ? "" : "s",
               r->tp.q_heads_per_rank);
        if (r->tp.replication > 1)
            printf("; tp > KV heads, so each KV head is replicated on %u GPUs", r->tp.replication);
        printf("\n");
    }
}

/* The rows a per-layer model adds: a token beyond the windows, the state, fixed scales. */
static void print_layer_rows(const plan_result *r)
{
    const cap_kv_cost *c = &r->cost;
    char label[128];
    if (c->token_full != c->token_all) {
        snprintf(label, sizeof label, "per token beyond every window");
        row(r, label, c->token_full);
    }
    if (c->state_bytes > 0)
        row(r, "recurrent state per sequence", c->state_bytes);
    if (c->fixed_bytes > 0)
        row(r, "scales (fixed, not per token)", c->fixed_bytes);
}

/* How the per-layer figures above were counted. */
static void print_window_note(const plan_result *r)
{
    bool sliding = false, state = false;
    for (uint32_t i = 0; i < r->cost.n_runs; i++) {
        sliding |= r->cost.run[i].spec.kind == CAP_LAYER_SLIDING;
        state |= r->cost.run[i].spec.kind == CAP_LAYER_STATE;
    }
    if (sliding)
        printf("  A sliding layer holds the last min(T, W) tokens: contiguously exactly those, "
               "in blocks\n  the ceil(T/bs) - floor((T - min(T, W))/bs) blocks that hold "
               "any of them (engines free\n  a block once all its tokens left the window; "
               "at most ceil(W/bs) + 1 per layer).\n");
    if (state)
        printf("  A state layer holds a fixed state per sequence, whatever its length, and "
               "no blocks.\n");
}

/* KV bytes per token, block, sequence and batch. */
static void print_kv_section(const plan_result *r, const plan_opts *o)
{
    char label[128];
    header(r, "KV cache (persistent, grows with context)");
    row(r, r->cost.token_full != r->cost.token_all ? "per token, in every layer" : "per token",
        r->tok_gpu);
    print_layer_rows(r);
    snprintf(label, sizeof label, "per block (%u tokens)", r->block_size);
    row(r, label, r->blk_gpu);
    if (r->has_batch) {
        if (r->uniform) {
            snprintf(label, sizeof label, "per sequence (%llu tokens)",
                     (unsigned long long)r->seq_len);
            row(r, label, r->seq_bytes_gpu);
            if (!r->cost.linear)
                row(r, "  in blocks", r->seq_paged_gpu);
            snprintf(label, sizeof label, "batch (%llu x %llu = %llu tokens)",
                     (unsigned long long)r->batch, (unsigned long long)r->seq_len,
                     (unsigned long long)r->batch_tokens);
        } else {
            snprintf(label, sizeof label, "batch (%zu sequences, %llu tokens)", r->n_lens,
                     (unsigned long long)r->batch_tokens);
        }
        row(r, label, r->batch_bytes_gpu);
        if (r->cost.linear)
            snprintf(label, sizeof label, "batch in blocks (%llu blocks)",
                     (unsigned long long)r->frag.n_blocks);
        else
            snprintf(label, sizeof label, "batch in blocks (whole blocks per layer)");
        row(r, label, r->batch_paged_gpu);
    }
    if (!r->cost.linear)
        print_window_note(r);
    if (r->tp.replication > 1) {
        printf("  (all-GPU figures include %u replicas of each KV head; the model itself needs "
               "%llu bytes per token)\n",
               r->tp.replication, (unsigned long long)r->tok_logical);
    }
}

/* Fragmentation of the batch and the attention workspace. */
static void print_batch_section(const plan_result *r, const plan_opts *o)
{
    if (r->has_batch) {
        printf("\nFragmentation of the batch\n");
        print_frag(r, &r->frag, r->max_len, r->max_len_given, r->waste_paged, r->waste_contig);
        header(r, "Attention workspace (transient, one layer)");
        if (r->ws_ok)
            row(r, "naive scores B x Hq x T x T x s", r->ws_bytes_gpu);
        else
            printf("  naive scores B x Hq x T x T x s: more than 2^64 bytes\n");
        printf("  Memory-saving attention kernels such as FlashAttention avoid materializing "
               "this\n  matrix; they shrink the transient workspace, not the KV cache above.\n");
    }
}

/* The trace: lengths, fragmentation and --concurrency requests. */
static void print_trace_section(const plan_result *r, const plan_opts *o)
{
    char label[128];
    if (r->has_trace) {
        const cap_stats *s = &r->st;
        fputs("\nTrace ", stdout);
        cli_put_escaped(stdout, r->trace_path, strlen(r->trace_path));
        printf(": %llu requests (%llu token-log or OpenAI lines, %llu Mooncake lines)\n",
               (unsigned long long)s->n, (unsigned long long)r->n_tokens_fmt,
               (unsigned long long)r->n_mooncake_fmt);
        printf("  lengths = %s\n", o->include_output
                                       ? "input + output tokens (KV holds both during decode; "
                                         "--no-include-output for input only)"
                                       : "input tokens only (--no-include-output)");
        printf("  mean %.1f, p50 %llu, p90 %llu, p99 %llu, min %llu, max %llu tokens\n", s->mean,
               (unsigned long long)s->p50, (unsigned long long)s->p90, (unsigned long long)s->p99,
               (unsigned long long)s->min, (unsigned long long)s->max);
        print_frag(r, &r->tfrag, r->tmax_len, o->max_len > 0, r->twaste_paged, r->twaste_contig);
        if (r->conc > 0) {
            header(r, "KV for concurrent requests from the trace");
            snprintf(label, sizeof label, "expected: %llu x mean = %llu tokens",
                     (unsigned long long)r->conc, (unsigned long long)r->exp_tokens);
            row(r, label, r->exp_kv);
            snprintf(label, sizeof label, "  in blocks: %llu blocks",
                     (unsigned long long)r->exp_blocks);
            row(r, label, r->exp_kv_paged);
            snprintf(label, sizeof label, "worst: %llu longest = %llu tokens",
                     (unsigned long long)r->conc, (unsigned long long)r->worst_tokens);
            row(r, label, r->worst_kv);
            snprintf(label, sizeof label, "  in blocks: %llu blocks",
                     (unsigned long long)r->worst_blocks);
            row(r, label, r->worst_kv_paged);
            printf("  expected = N x the mean length (and N x the mean blocks per request), "
                   "rounded up;\n  worst = the sum of the N longest requests in the trace%s.\n",
                   r->conc > s->n ? " (all of them, then the longest again)" : "");
        }
    }
}

/* The inverse plan: memory per GPU and what fits it. */
static void print_memory_section(const plan_result *r, const plan_opts *o)
{
    char label[128], b1[32];
    if (r->has_mem) {
        const cap_mem_in *in = &r->mem_in;
        const cap_mem_out *mo = &r->mem;
        printf("\n%-42s %20s\n", "Memory per GPU", "bytes");
        printf("  %-40s %20llu  %s\n", "GPU memory (--gpu-mem)",
               (unsigned long long)in->gpu_mem_bytes,
               cli_fmt_binary(in->gpu_mem_bytes, b1, sizeof b1));
        char util[16];
        snprintf(util, sizeof util, "%u.%06u", in->util_ppm / 1000000, in->util_ppm % 1000000);
        for (size_t k = strlen(util) - 1; util[k] == '0'; k--)
            util[k] = '\0';
        if (util[strlen(util) - 1] == '.')
            strcat(util, "0");
        snprintf(label, sizeof label, "usable at --util %s", util);
        printf("  %-40s %20llu  %s\n", label, (unsigned long long)mo->budget_bytes,
               cli_fmt_binary(mo->budget_bytes, b1, sizeof b1));
        snprintf(label, sizeof label, "- weights (all weights / tp %u)", in->tp);
        printf("  %-40s %20llu  %s\n", label, (unsigned long long)mo->weights_per_gpu_bytes,
               cli_fmt_binary(mo->weights_per_gpu_bytes, b1, sizeof b1));
        printf("      all weights: %llu bytes (%s), from %s\n",
               (unsigned long long)r->weights_total,
               cli_fmt_binary(r->weights_total, b1, sizeof b1), r->weights_from);
        printf("  %-40s %20llu  %s\n", "- reserve (--reserve)",
               (unsigned long long)in->reserve_bytes,
               cli_fmt_binary(in->reserve_bytes, b1, sizeof b1));
        printf("  %-40s %20llu  %s\n", "= left for the KV cache", (unsigned long long)mo->kv_bytes,
               cli_fmt_binary(mo->kv_bytes, b1, sizeof b1));
        printf("  KV blocks: %llu of %u tokens (%llu tokens in all); the same number on every "
               "GPU\n",
               (unsigned long long)mo->n_blocks, r->block_size, (unsigned long long)mo->n_tokens);
        uint64_t full_blk;
        if (!r->cost.linear && r->cost.token_full > 0 &&
            !cap_mul(r->cost.token_full, r->block_size, &full_blk))
            printf("  (blocks held in every layer; %llu if only the full-context layers held "
                   "them)\n",
                   (unsigned long long)(mo->kv_bytes / full_blk));
        if (r->has_batch && r->uniform && r->cost.linear)
            printf("  concurrent requests of %llu tokens: %llu (paged, %llu blocks each)\n",
                   (unsigned long long)r->seq_len, (unsigned long long)r->fit_seq,
                   (unsigned long long)cap_blocks_for(r->seq_len, r->block_size));
        if (r->has_batch && r->uniform && !r->cost.linear)
            printf("  concurrent requests of %llu tokens: %llu (paged, %s each)\n",
                   (unsigned long long)r->seq_len, (unsigned long long)r->fit_seq,
                   cli_fmt_binary(r->seq_paged_gpu, b1, sizeof b1));
        if (r->has_batch && !r->uniform)
            printf("  the batch needs %llu blocks: it %s\n", (unsigned long long)r->frag.n_blocks,
                   r->batch_paged_gpu <= mo->kv_bytes ? "fits" : "does NOT fit");
        if (r->has_trace)
            printf("  concurrent requests from the trace: about %llu at the mean (%.1f blocks "
                   "each), %llu if they are the longest\n",
                   (unsigned long long)r->conc_mean_fit, (double)r->sum_blocks / (double)r->st.n,
                   (unsigned long long)r->conc_worst_fit);
        if (r->fit_contig > 0 || r->has_batch || r->has_trace)
            printf("  with contiguous %llu-token reservations instead: %llu requests\n",
                   (unsigned long long)(r->has_batch ? r->max_len : r->tmax_len),
                   (unsigned long long)r->fit_contig);
    }
}

/* The notes under every table. */
static void print_notes(const plan_result *r, const plan_opts *o)
{
    const cap_model_shape *m = &r->m;
    printf("\nNotes\n");
    printf("  - These are logical KV bytes, not all the memory an engine uses: weights, "
           "activations,\n    CUDA graphs, allocator slack and fragmentation come on top "
           "(--reserve covers some).\n");
    if (cap_dtype_is_quantized(m->kv_dtype))
        printf("  - %s KV is counted with its %s scales; quantized KV has numerical error: "
               "these\n    are capacity figures only. Documented layouts: vLLM fp8 KV, "
               "per-tensor (default) or\n    per-attention-head fp32 scales; TensorRT-LLM "
               "int8/fp8 KV, one per-tensor scale per\n    layer. Engines using per-token or "
               "per-block KV scales: not found in their docs.\n",
               cap_dtype_name(m->kv_dtype), cap_scales_name(m->kv_quant.layout));
    else
        printf("  - fp8/int8/int4 KV figures (--kv-dtype) are capacity estimates only: real KV "
               "quantization\n    adds scales (--kv-scales counts them) and numerical "
               "error.\n");
}

void pl_print_table(const plan_result *r, const plan_opts *o)
{
    print_model_section(r, o);
    print_kv_section(r, o);
    print_batch_section(r, o);
    print_trace_section(r, o);
    print_memory_section(r, o);
    print_notes(r, o);
}

/* ---- JSON output ----------------------------------------------------------------------- */

static json_t *ju(uint64_t v)
{
    return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static json_t *jfrag(const plan_result *r, const cap_frag *f, uint64_t max_len, uint64_t pw,
                     uint64_t cw)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "sequences", ju(f->n_seqs),
                     "tokens", ju(f->n_tokens), "block_size", ju(r->block_size), "paged_blocks",
                     ju(f->n_blocks), "paged_waste_tokens", ju(f->paged_waste_tokens),
                     "paged_waste_bytes_per_gpu", ju(pw), "contiguous_max_len", ju(max_len),
                     "contiguous_alloc_tokens", ju(f->contig_alloc_tokens),
                     "contiguous_waste_tokens", ju(f->contig_waste_tokens),
                     "contiguous_waste_bytes_per_gpu", ju(cw));
}

/* The batch: sizes, fragmentation and the attention workspace. Adds its object to root. */
static void json_batch(json_t *root, const plan_result *r, const plan_opts *o)
{
    json_t *b = json_pack("{s:o,s:o,s:o,s:o}", "sequences", ju(r->frag.n_seqs), "tokens",
                          ju(r->batch_tokens), "kv_bytes_per_gpu", ju(r->batch_bytes_gpu),
                          "paged_kv_bytes_per_gpu", ju(r->batch_paged_gpu));
    if (r->uniform) {
        json_object_set_new(b, "seq_len", ju(r->seq_len));
        json_object_set_new(b, "batch", ju(r->batch));
        json_object_set_new(b, "seq_kv_bytes_per_gpu", ju(r->seq_bytes_gpu));
        json_object_set_new(b, "seq_paged_kv_bytes_per_gpu", ju(r->seq_paged_gpu));
    } else {
        json_t *a = json_array();
        for (size_t i = 0; i < r->n_lens; i++)
            json_array_append_new(a, ju(r->lens[i]));
        json_object_set_new(b, "lens", a);
    }
    uint64_t all = 0;
    cap_mul(r->batch_bytes_gpu, r->tp.tp, &all);
    json_object_set_new(b, "kv_bytes_all_gpus", ju(all));
    json_object_set_new(root, "batch", b);
    json_object_set_new(root, "fragmentation",
                        jfrag(r, &r->frag, r->max_len, r->waste_paged, r->waste_contig));
    json_object_set_new(
        root, "workspace",
        json_pack("{s:s,s:o,s:s}", "what", "naive attention scores B x Hq x T x T x s, one layer",
                  "bytes_per_gpu", r->ws_ok ? ju(r->ws_bytes_gpu) : json_null(), "note",
                  "transient; FlashAttention-style kernels reduce it, not the KV cache"));
}

/* The trace: lengths, fragmentation and --concurrency requests. Adds its object to root. */
static void json_trace(json_t *root, const plan_result *r, const plan_opts *o)
{
    const cap_stats *s = &r->st;
    json_t *t =
        json_pack("{s:s,s:o,s:o,s:o,s:b,s:f,s:o,s:o,s:o,s:o,s:o,s:o}", "path", r->trace_path,
                  "requests", ju(s->n), "token_log_lines", ju(r->n_tokens_fmt), "mooncake_lines",
                  ju(r->n_mooncake_fmt), "include_output", o->include_output, "mean_len", s->mean,
                  "p50_len", ju(s->p50), "p90_len", ju(s->p90), "p99_len", ju(s->p99), "min_len",
                  ju(s->min), "max_len", ju(s->max), "total_blocks", ju(r->sum_blocks));
    json_object_set_new(t, "fragmentation",
                        jfrag(r, &r->tfrag, r->tmax_len, r->twaste_paged, r->twaste_contig));
    if (r->conc > 0) {
        uint64_t eb = r->exp_kv, wb = r->worst_kv, ebb = r->exp_kv_paged, wbb = r->worst_kv_paged;
        json_object_set_new(
            t, "concurrency",
            json_pack("{s:o,s:s,s:o,s:o,s:o,s:o,s:s,s:o,s:o,s:o,s:o}", "n", ju(r->conc),
                      "expected_is", "N x mean length, rounded up", "expected_tokens",
                      ju(r->exp_tokens), "expected_kv_bytes_per_gpu", ju(eb), "expected_blocks",
                      ju(r->exp_blocks), "expected_block_bytes_per_gpu", ju(ebb), "worst_is",
                      "sum of the N longest requests", "worst_tokens", ju(r->worst_tokens),
                      "worst_kv_bytes_per_gpu", ju(wb), "worst_blocks", ju(r->worst_blocks),
                      "worst_block_bytes_per_gpu", ju(wbb)));
    }
    json_object_set_new(root, "trace", t);
}

/* The inverse plan: memory per GPU and what fits it. Adds its object to root. */
static void json_memory(json_t *root, const plan_result *r, const plan_opts *o)
{
    const cap_mem_in *in = &r->mem_in;
    const cap_mem_out *mo = &r->mem;
    json_t *mj = json_pack(
        "{s:o,s:f,s:o,s:o,s:s,s:o,s:o,s:o,s:o,s:o,s:o}", "gpu_mem_bytes", ju(in->gpu_mem_bytes),
        "util", (double)in->util_ppm / 1e6, "budget_bytes", ju(mo->budget_bytes),
        "weights_total_bytes", ju(r->weights_total), "weights_from", r->weights_from,
        "weights_per_gpu_bytes", ju(mo->weights_per_gpu_bytes), "reserve_bytes",
        ju(in->reserve_bytes), "kv_bytes_per_gpu", ju(mo->kv_bytes), "kv_blocks", ju(mo->n_blocks),
        "kv_tokens", ju(mo->n_tokens), "contiguous_requests", ju(r->fit_contig));
    if (r->has_batch && r->uniform)
        json_object_set_new(mj, "requests_of_seq_len", ju(r->fit_seq));
    if (r->has_batch && !r->uniform)
        json_object_set_new(mj, "batch_fits", json_boolean(r->batch_paged_gpu <= mo->kv_bytes));
    if (r->has_trace) {
        json_object_set_new(mj, "trace_requests_at_mean", ju(r->conc_mean_fit));
        json_object_set_new(mj, "trace_requests_longest_first", ju(r->conc_worst_fit));
    }
    json_object_set_new(root, "memory", mj);
}

/* The layer runs as a JSON array (one object per run, its per-GPU bytes included). */
static json_t *json_runs(const plan_result *r)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < r->cost.n_runs; i++) {
        const cap_run_cost *c = &r->cost.run[i];
        json_array_append_new(
            a, json_pack("{s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "kind",
                         cap_layer_kind_name(c->spec.kind), "layers", ju(c->spec.n_layers),
                         "kv_heads", ju(c->spec.n_kv_heads), "head_dim", ju(c->spec.head_dim),
                         "window", ju(c->spec.window), "latent_dim", ju(c->spec.latent_dim),
                         "state_elems", ju(c->spec.state_elems), "token_bytes_per_gpu",
                         ju(c->token_bytes), "state_bytes_per_gpu", ju(c->state_bytes)));
    }
    return a;
}

int pl_print_json(const plan_result *r, const plan_opts *o)
{
    const cap_model_shape *m = &r->m;
    json_t *root = json_object();
    if (root == NULL)
        return json_oom();
    json_object_set_new(
        root, "model",
        json_pack("{s:s,s:s,s:o,s:o,s:o,s:o,s:s,s:s,s:o,s:s,s:o}", "name", r->model_label, "source",
                  r->model_source, "layers", ju(m->n_layers), "query_heads", ju(m->n_heads),
                  "kv_heads", ju(m->n_kv_heads), "head_dim", ju(m->head_dim), "attention",
                  attn_kind(m), "kv_dtype", cap_dtype_name(m->kv_dtype), "kv_dtype_bytes",
                  ju(cap_dtype_bytes(m->kv_dtype)), "weights_dtype", cap_dtype_name(m->w_dtype),
                  "params", m->n_params ? ju(m->n_params) : json_null()));
    json_object_set_new(json_object_get(root, "model"), "kv_dtype_bits",
                        ju(cap_dtype_bits(m->kv_dtype)));
    json_object_set_new(json_object_get(root, "model"), "layer_runs", json_runs(r));
    json_object_set_new(json_object_get(root, "model"), "context_length",
                        r->max_context ? ju(r->max_context) : json_null());
    json_object_set_new(json_object_get(root, "model"), "beyond_context",
                        json_boolean(r->max_context && r->longest > r->max_context));
    json_object_set_new(json_object_get(root, "model"), "kv_scales",
                        json_pack("{s:s,s:o,s:s}", "layout", cap_scales_name(m->kv_quant.layout),
                                  "group", ju(m->kv_quant.group), "dtype",
                                  cap_dtype_name(m->kv_quant.scale_dtype)));
    json_object_set_new(root, "tp",
                        json_pack("{s:o,s:o,s:o,s:o}", "size", ju(r->tp.tp), "kv_heads_per_gpu",
                                  ju(r->tp.kv_heads_per_rank), "kv_head_replication",
                                  ju(r->tp.replication), "query_heads_per_gpu",
                                  ju(r->tp.q_heads_per_rank)));
    uint64_t all_tok = 0, all_blk = 0;
    cap_mul(r->tok_gpu, r->tp.tp, &all_tok);
    cap_mul(r->blk_gpu, r->tp.tp, &all_blk);
    json_t *kv = json_pack(
        "{s:o,s:o,s:o,s:o,s:o,s:o}", "block_size", ju(r->block_size), "token_bytes_logical",
        ju(r->tok_logical), "token_bytes_per_gpu", ju(r->tok_gpu), "token_bytes_all_gpus",
        ju(all_tok), "block_bytes_per_gpu", ju(r->blk_gpu), "block_bytes_all_gpus", ju(all_blk));
    json_object_set_new(kv, "token_bytes_beyond_windows_per_gpu", ju(r->cost.token_full));
    json_object_set_new(kv, "state_bytes_per_sequence_per_gpu", ju(r->cost.state_bytes));
    json_object_set_new(kv, "fixed_scale_bytes_per_gpu", ju(r->cost.fixed_bytes));
    json_object_set_new(root, "kv", kv);
    if (r->has_batch)
        json_batch(root, r, o);
    if (r->has_trace)
        json_trace(root, r, o);
    if (r->has_mem)
        json_memory(root, r, o);
    json_t *notes = json_array();
    json_array_append_new(notes, json_string("Logical KV bytes only: not all the memory an "
                                             "engine uses (weights, activations, CUDA graphs, "
                                             "allocator slack come on top)."));
    json_array_append_new(notes, json_string("Quantized KV (fp8/int8/int4) is counted with the "
                                             "scales of --kv-scales (per-tensor fp32 by "
                                             "default) and has numerical error: capacity "
                                             "figures only. vLLM fp8 KV: per-tensor or "
                                             "per-attention-head fp32 scales; TensorRT-LLM "
                                             "int8/fp8 KV: one per-tensor scale per layer."));
    json_array_append_new(notes, json_string("The attention workspace is transient; "
                                             "memory-saving kernels such as FlashAttention reduce "
                                             "it, not the persistent KV cache."));
    json_object_set_new(root, "notes", notes);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (s == NULL)
        return json_oom();
    puts(s);
    free(s);
    return 0;
}
