/*
 * plan.c - `kvprefix plan`: KV-cache capacity planning from the command line.
 *
 * Forward: the logical KV bytes of a token, a block, a sequence and a batch for a model
 * shape (2 x L x Hkv x D x s per token). Inverse: what a GPU has left for KV after weights
 * and a runtime reserve, as blocks, tokens and concurrent requests. Fragmentation of paged
 * blocks versus contiguous max-length reservations, and the length distribution of a request
 * log (logread.c) with the KV that N concurrent requests drawn from it need.
 *
 * This file only parses arguments and gathers the figures into a plan_result; plan_report.c
 * prints it as a table or as JSON, the arithmetic lives in kvplan.c, the presets and the
 * config.json reader in models.c. Exit status: 0 success, 1 an input was wrong (a value, a file), 2
 * usage (unknown or missing flags, conflicting flags). It never aborts on input.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "kvplan.h"
#include "logread.h"
#include "models.h"

#define EXIT_INPUT     1
#define EXIT_USAGE     2
#define MAX_BLOCK_SIZE 65536u /* the library's KVP_MAX_BLOCK_SIZE */
#define MAX_COUNT      (UINT64_C(1) << 31)

static const char usage_text[] =
    "Usage: kvprefix plan MODEL [options]\n"
    "\n"
    "KV-cache capacity planning: logical KV bytes = 2 x L x Hkv x D x s x (sum of the active\n"
    "sequences' lengths), and the inverse: how many blocks, tokens and requests fit a GPU.\n"
    "\n"
    "Model (one of):\n"
    "  --model NAME         a preset (--list-models shows them), e.g. Llama-3.1-8B\n"
    "  --config FILE        a Hugging Face config.json\n"
    "  --layers L --kv-heads H --head-dim D [--heads HQ]   the shape itself (HQ defaults to H)\n"
    "  (--layers, --heads, --kv-heads, --head-dim also override a preset or config)\n"
    "  --dtype T            KV and weight dtype: fp32, fp16, bf16, fp8, int8 (default: the\n"
    "                       model's, bf16 for a bare shape)\n"
    "  --kv-dtype T         KV dtype only;  --weights-dtype T  weight dtype only\n"
    "\n"
    "Forward:\n"
    "  --block-size N       tokens per KV block (default 16, as the library)\n"
    "  --seq-len T          sequence length;  --batch B  sequences of that length (default 1)\n"
    "  --lens A,B,C         a variable-length batch instead of --seq-len/--batch\n"
    "  --max-len M          contiguous reservation per sequence, for the fragmentation\n"
    "                       comparison (default: the longest length)\n"
    "\n"
    "Inverse (per GPU):\n"
    "  --gpu-mem SIZE       memory of one GPU: 80GiB, 80GB (10^9), 81920MiB\n"
    "  --util F             usable fraction, as vLLM's gpu_memory_utilization (default 0.9)\n"
    "  --weights-mem SIZE   memory of all the weights (split over --tp), or\n"
    "  --params N           parameter count, e.g. 8B, 70.6B (x the weight dtype size);\n"
    "                       a preset knows its own\n"
    "  --reserve SIZE       activations, workspace, allocator, per GPU (default 0)\n"
    "  --tp N               tensor-parallel GPUs: KV heads split over them, replicated when N\n"
    "                       exceeds the KV heads; weights split too (default 1)\n"
    "\n"
    "From a request log:\n"
    "  --trace FILE         token-id JSON Lines, Mooncake trace or OpenAI request bodies\n"
    "                       (approximate lengths); '-' is stdin; .gz and .zst are read\n"
    "  --trace-block-size N tokens per Mooncake hash id, checked against input_length\n"
    "                       (default 512; 0 disables the check)\n"
    "  --concurrency N      KV for N concurrent requests drawn from the trace\n"
    "  --include-output     lengths = input + output (the default: KV holds both in decode)\n"
    "  --no-include-output  lengths = input only\n"
    "\n"
    "Output:\n"
    "  --json               JSON instead of the table\n"
    "  --list-models        list the presets and their sources\n"
    "  --help               this text\n"
    "\n"
    "Examples:\n"
    "  kvprefix plan --layers 32 --kv-heads 32 --head-dim 128 --dtype fp16 --seq-len 4096\n"
    "  kvprefix plan --model Llama-3.1-8B --seq-len 8192 --batch 16 --gpu-mem 80GiB\n"
    "  kvprefix plan --model Llama-3.1-70B --tp 8 --gpu-mem 80GiB --reserve 4GiB "
    "--seq-len 32768\n"
    "  kvprefix plan --config config.json --params 7B --gpu-mem 24GiB --lens 512,3000,9000\n"
    "  kvprefix plan --model Qwen2.5-7B --trace trace.jsonl.gz --concurrency 64 "
    "--gpu-mem 80GiB\n";

#include "plan.h"

/* Print "kvprefix plan: message" to stderr and return code (the exit status). */
#define fail(...) cli_fail("plan", __VA_ARGS__)

/* A positive integer flag value up to max. Returns 0 or an exit code (message printed). */
static int flag_uint(const char *flag, const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t x;
    int rc = cli_parse_uint(v, max, &x);
    if (rc == PL_EINVAL)
        return fail(EXIT_INPUT, "%s: '%s' is not a non-negative integer", flag, v);
    if (rc != PL_OK)
        return fail(EXIT_INPUT, "%s: %s is too large (at most %llu)", flag, v,
                    (unsigned long long)max);
    if (x < min)
        return fail(EXIT_INPUT, "%s must be at least %llu, not %s", flag, (unsigned long long)min,
                    v);
    *out = x;
    return 0;
}

static int flag_bytes(const char *flag, const char *v, uint64_t *out)
{
    int rc = cli_parse_bytes(v, out);
    if (rc == PL_EOVERFLOW)
        return fail(EXIT_INPUT, "%s: %s is too large", flag, v);
    if (rc != PL_OK)
        return fail(EXIT_INPUT,
                    "%s: '%s' is not a size (examples: 80GiB, 80GB = 80x10^9, 81920MiB, "
                    "4096; a bare G or M is ambiguous)",
                    flag, v);
    return 0;
}

static int parse_lens(const char *v, plan_opts *o)
{
    size_t n = 1;
    for (const char *p = v; *p; p++)
        n += *p == ',';
    free(o->lens);
    o->lens = calloc(n, sizeof *o->lens);
    if (o->lens == NULL)
        return fail(EXIT_INPUT, "--lens: out of memory");
    o->n_lens = 0;
    const char *p = v;
    for (size_t i = 0; i < n; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char tmp[32];
        if (len == 0 || len >= sizeof tmp)
            return fail(EXIT_INPUT, "--lens: '%s' is not a comma-separated list of lengths", v);
        memcpy(tmp, p, len);
        tmp[len] = '\0';
        int rc = flag_uint("--lens", tmp, 1, LOG_MAX_LEN, &o->lens[i]);
        if (rc != 0)
            return rc;
        o->n_lens++;
        p = comma ? comma + 1 : p + len;
    }
    return 0;
}

enum {
    OPT_MODEL = 1,
    OPT_CONFIG,
    OPT_LAYERS,
    OPT_HEADS,
    OPT_KV_HEADS,
    OPT_HEAD_DIM,
    OPT_DTYPE,
    OPT_KV_DTYPE,
    OPT_W_DTYPE,
    OPT_BLOCK_SIZE,
    OPT_SEQ_LEN,
    OPT_BATCH,
    OPT_LENS,
    OPT_MAX_LEN,
    OPT_GPU_MEM,
    OPT_UTIL,
    OPT_WEIGHTS_MEM,
    OPT_PARAMS,
    OPT_RESERVE,
    OPT_TP,
    OPT_TRACE,
    OPT_TRACE_BS,
    OPT_CONCURRENCY,
    OPT_INCLUDE_OUTPUT,
    OPT_NO_INCLUDE_OUTPUT,
    OPT_JSON,
    OPT_LIST,
    OPT_HELP
};

static const struct {
    const char *name;
    int id;
    bool has_arg;
} options[] = {
    {"model", OPT_MODEL, true},
    {"config", OPT_CONFIG, true},
    {"layers", OPT_LAYERS, true},
    {"heads", OPT_HEADS, true},
    {"kv-heads", OPT_KV_HEADS, true},
    {"head-dim", OPT_HEAD_DIM, true},
    {"dtype", OPT_DTYPE, true},
    {"kv-dtype", OPT_KV_DTYPE, true},
    {"weights-dtype", OPT_W_DTYPE, true},
    {"block-size", OPT_BLOCK_SIZE, true},
    {"seq-len", OPT_SEQ_LEN, true},
    {"batch", OPT_BATCH, true},
    {"lens", OPT_LENS, true},
    {"max-len", OPT_MAX_LEN, true},
    {"gpu-mem", OPT_GPU_MEM, true},
    {"util", OPT_UTIL, true},
    {"weights-mem", OPT_WEIGHTS_MEM, true},
    {"params", OPT_PARAMS, true},
    {"reserve", OPT_RESERVE, true},
    {"tp", OPT_TP, true},
    {"trace", OPT_TRACE, true},
    {"trace-block-size", OPT_TRACE_BS, true},
    {"concurrency", OPT_CONCURRENCY, true},
    {"include-output", OPT_INCLUDE_OUTPUT, false},
    {"no-include-output", OPT_NO_INCLUDE_OUTPUT, false},
    {"json", OPT_JSON, false},
    {"list-models", OPT_LIST, false},
    {"help", OPT_HELP, false},
};

/* Apply one option. Returns 0 or an exit code (message printed). */
static int apply_opt(plan_opts *o, int id, const char *flag, const char *v)
{
    uint64_t x;
    int rc = 0;
    switch (id) {
    case OPT_MODEL:
        o->model_name = v;
        break;
    case OPT_CONFIG:
        o->config_path = v;
        break;
    case OPT_LAYERS:
        return flag_uint(flag, v, 1, MAX_COUNT, &o->layers);
    case OPT_HEADS:
        return flag_uint(flag, v, 1, MAX_COUNT, &o->heads);
    case OPT_KV_HEADS:
        return flag_uint(flag, v, 1, MAX_COUNT, &o->kv_heads);
    case OPT_HEAD_DIM:
        return flag_uint(flag, v, 1, MAX_COUNT, &o->head_dim);
    case OPT_DTYPE:
        o->dtype = v;
        break;
    case OPT_KV_DTYPE:
        o->kv_dtype = v;
        break;
    case OPT_W_DTYPE:
        o->w_dtype = v;
        break;
    case OPT_BLOCK_SIZE:
        if ((rc = flag_uint(flag, v, 1, MAX_BLOCK_SIZE, &x)) == 0)
            o->block_size = (uint32_t)x;
        break;
    case OPT_SEQ_LEN:
        return flag_uint(flag, v, 1, LOG_MAX_LEN, &o->seq_len);
    case OPT_BATCH:
        return flag_uint(flag, v, 1, UINT64_C(4294967295), &o->batch);
    case OPT_LENS:
        return parse_lens(v, o);
    case OPT_MAX_LEN:
        return flag_uint(flag, v, 1, LOG_MAX_LEN, &o->max_len);
    case OPT_GPU_MEM:
        if ((rc = flag_bytes(flag, v, &o->gpu_mem)) == 0 && o->gpu_mem == 0)
            rc = fail(EXIT_INPUT, "--gpu-mem must be greater than 0");
        o->have_gpu_mem = true;
        break;
    case OPT_UTIL:
        if (cli_parse_fraction(v, &o->util_ppm) != PL_OK)
            rc = fail(EXIT_INPUT,
                      "--util: '%s' is not a fraction in (0, 1] with at most 6 decimals", v);
        break;
    case OPT_WEIGHTS_MEM:
        rc = flag_bytes(flag, v, &o->weights_mem);
        o->have_weights_mem = true;
        break;
    case OPT_PARAMS: {
        int prc = cli_parse_count(v, &o->params);
        if (prc == PL_EOVERFLOW)
            rc = fail(EXIT_INPUT, "--params: %s is too large", v);
        else if (prc != PL_OK)
            rc = fail(EXIT_INPUT, "--params: '%s' is not a count (examples: 8B, 70.6B, 7000M)", v);
        else if (o->params == 0)
            rc = fail(EXIT_INPUT, "--params must be greater than 0");
        break;
    }
    case OPT_RESERVE:
        return flag_bytes(flag, v, &o->reserve);
    case OPT_TP:
        if ((rc = flag_uint(flag, v, 1, 1u << 20, &x)) == 0)
            o->tp = (uint32_t)x;
        break;
    case OPT_TRACE:
        o->trace = v;
        break;
    case OPT_TRACE_BS:
        if ((rc = flag_uint(flag, v, 0, MAX_BLOCK_SIZE, &x)) == 0)
            o->trace_bs = (uint32_t)x;
        break;
    case OPT_CONCURRENCY:
        return flag_uint(flag, v, 1, UINT64_C(4294967295), &o->concurrency);
    case OPT_INCLUDE_OUTPUT:
        o->include_output = true;
        break;
    case OPT_NO_INCLUDE_OUTPUT:
        o->include_output = false;
        break;
    case OPT_JSON:
        o->json = true;
        break;
    case OPT_LIST:
        o->list_models = true;
        break;
    case OPT_HELP:
        o->help = true;
        break;
    default:
        break;
    }
    return rc;
}

/* Parse argv[1 ..]. Returns 0 or an exit code (message printed). */
static int parse_args(int argc, char **argv, plan_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
            return fail(EXIT_USAGE, "unexpected argument '%s'", a);
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        int idx = -1;
        for (size_t k = 0; k < sizeof options / sizeof options[0]; k++) {
            if (strlen(options[k].name) == name_len &&
                strncmp(options[k].name, name, name_len) == 0) {
                idx = (int)k;
                break;
            }
        }
        if (idx < 0)
            return fail(EXIT_USAGE, "unknown option '%.*s'", (int)name_len + 2, a);
        const char *v = NULL;
        if (options[idx].has_arg) {
            if (eq != NULL)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                return fail(EXIT_USAGE, "--%s needs a value", options[idx].name);
        } else if (eq != NULL) {
            return fail(EXIT_USAGE, "--%s takes no value", options[idx].name);
        }
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", options[idx].name);
        int rc = apply_opt(o, options[idx].id, flag, v);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int dtype_flag(const char *flag, const char *v, pl_dtype *out)
{
    if (pl_dtype_parse(v, out) != PL_OK)
        return fail(EXIT_INPUT, "%s: unknown dtype '%s' (use fp32, fp16, bf16, fp8 or int8)", flag,
                    v);
    return 0;
}

/* Build the model shape from --model / --config / flags. Returns 0 or an exit code. */
static int build_model(const plan_opts *o, plan_result *r)
{
    static char errbuf[512];
    pl_model_shape_init(&r->m);
    if (o->model_name != NULL && o->config_path != NULL)
        return fail(EXIT_USAGE, "give either --model or --config, not both");
    if (o->model_name != NULL) {
        const pl_model_preset *p = pl_model_find(o->model_name);
        if (p == NULL)
            return fail(EXIT_INPUT, "--model: unknown preset '%s' (see --list-models)",
                        o->model_name);
        r->m = p->shape;
        r->model_label = p->name;
        r->model_source = p->source;
    } else if (o->config_path != NULL) {
        if (pl_model_from_config(o->config_path, &r->m, errbuf, sizeof errbuf) != PL_OK)
            return fail(EXIT_INPUT, "--config: %s", errbuf);
        r->model_label = o->config_path;
        r->model_source = "Hugging Face config.json";
    } else {
        if (o->layers == 0 && o->kv_heads == 0 && o->head_dim == 0)
            return fail(EXIT_USAGE, "no model: give --model NAME, --config FILE, or --layers, "
                                    "--kv-heads and --head-dim");
        if (o->layers == 0)
            return fail(EXIT_USAGE, "--layers is missing (the shape needs --layers, "
                                    "--kv-heads and --head-dim)");
        if (o->kv_heads == 0)
            return fail(EXIT_USAGE, "--kv-heads is missing (the shape needs --layers, "
                                    "--kv-heads and --head-dim)");
        if (o->head_dim == 0)
            return fail(EXIT_USAGE, "--head-dim is missing (the shape needs --layers, "
                                    "--kv-heads and --head-dim)");
        r->model_label = "custom shape";
        r->model_source = "command-line flags";
        if (o->heads == 0) {
            r->m.n_heads = (uint32_t)o->kv_heads;
            r->heads_assumed = true;
        }
    }
    if (o->layers)
        r->m.n_layers = (uint32_t)o->layers;
    if (o->heads)
        r->m.n_heads = (uint32_t)o->heads;
    if (o->kv_heads)
        r->m.n_kv_heads = (uint32_t)o->kv_heads;
    if (o->head_dim)
        r->m.head_dim = (uint32_t)o->head_dim;
    int rc;
    pl_dtype d;
    if (o->dtype != NULL) {
        if ((rc = dtype_flag("--dtype", o->dtype, &d)) != 0)
            return rc;
        r->m.kv_dtype = r->m.w_dtype = d;
    }
    if (o->kv_dtype != NULL) {
        if ((rc = dtype_flag("--kv-dtype", o->kv_dtype, &d)) != 0)
            return rc;
        r->m.kv_dtype = d;
    }
    if (o->w_dtype != NULL) {
        if ((rc = dtype_flag("--weights-dtype", o->w_dtype, &d)) != 0)
            return rc;
        r->m.w_dtype = d;
    }
    if (o->params)
        r->m.n_params = o->params;
    const char *what = NULL;
    if (pl_model_shape_check(&r->m, &what) != PL_OK)
        return fail(EXIT_INPUT, "model shape: %s (--heads %u, --kv-heads %u)", what, r->m.n_heads,
                    r->m.n_kv_heads);
    if (pl_tp_split(&r->m, o->tp, &r->tp, &what) != PL_OK)
        return fail(EXIT_INPUT, "--tp %u: %s (query heads %u, KV heads %u)", o->tp, what,
                    r->m.n_heads, r->m.n_kv_heads);
    return 0;
}

/* Read the trace's lengths into a growing array. Returns 0 or an exit code. */
static int read_trace(const plan_opts *o, uint64_t **lens_out, size_t *n_out, plan_result *r)
{
    log_options lo;
    log_options_init(&lo);
    lo.hash_block_size = o->trace_bs;
    log_reader *rd = NULL;
    char err[512];
    if (log_open(o->trace, &lo, &rd, err, sizeof err) != 0)
        return fail(EXIT_INPUT, "--trace: %s", err);
    uint64_t *lens = NULL;
    size_t n = 0, cap = 0;
    int code = 0;
    for (;;) {
        log_record rec;
        int rc = log_next(rd, &rec);
        if (rc == LOG_END)
            break;
        if (rc < 0) {
            code = fail(EXIT_INPUT, "%s", log_error(rd));
            break;
        }
        uint64_t len = rec.input_length + (o->include_output ? rec.output_length : 0);
        if (rec.format != LOG_MOONCAKE)
            r->n_tokens_fmt++;
        else
            r->n_mooncake_fmt++;
        if (n == cap) {
            size_t ncap = cap == 0 ? 1024 : cap * 2;
            uint64_t *nl = ncap > cap ? realloc(lens, ncap * sizeof *lens) : NULL;
            if (nl == NULL) {
                code = fail(EXIT_INPUT, "--trace: out of memory after %zu requests", n);
                break;
            }
            lens = nl;
            cap = ncap;
        }
        lens[n++] = len;
    }
    if (code == 0 && n == 0)
        code = fail(EXIT_INPUT, "%s: no requests (the file is empty or has only blank lines)",
                    strcmp(o->trace, "-") == 0 ? "<stdin>" : o->trace);
    log_close(rd);
    if (code != 0) {
        free(lens);
        return code;
    }
    *lens_out = lens;
    *n_out = n;
    return 0;
}

static int overflow(const char *what)
{
    return fail(EXIT_INPUT, "%s does not fit in 64 bits; use smaller values", what);
}

/* Compute every figure. Returns 0 or an exit code. */
static int compute(const plan_opts *o, plan_result *r, uint64_t **trace_lens)
{
    int rc;
    r->block_size = o->block_size;
    if (pl_token_bytes(&r->m, r->m.n_kv_heads, &r->tok_logical) ||
        pl_token_bytes(&r->m, r->tp.kv_heads_per_rank, &r->tok_gpu) ||
        pl_mul(r->tok_gpu, o->block_size, &r->blk_gpu))
        return overflow("the KV bytes per block");

    /* The batch: --seq-len x --batch, or --lens. */
    if (o->n_lens > 0 && (o->seq_len > 0 || o->batch > 0))
        return fail(EXIT_USAGE, "give either --lens or --seq-len/--batch, not both");
    if (o->batch > 0 && o->seq_len == 0)
        return fail(EXIT_USAGE, "--batch needs --seq-len");
    uint64_t longest = 0;
    if (o->seq_len > 0 || o->n_lens > 0) {
        r->has_batch = true;
        r->uniform = o->n_lens == 0;
        uint64_t one_len = o->seq_len;
        if (r->uniform) {
            r->seq_len = o->seq_len;
            r->batch = o->batch ? o->batch : 1;
            longest = o->seq_len;
        } else {
            r->lens = o->lens;
            r->n_lens = o->n_lens;
            for (size_t i = 0; i < o->n_lens; i++)
                longest = o->lens[i] > longest ? o->lens[i] : longest;
        }
        r->max_len_given = o->max_len > 0;
        r->max_len = o->max_len > 0 ? o->max_len : longest;
        if (r->max_len < longest)
            return fail(EXIT_INPUT,
                        "--max-len %llu is shorter than a sequence of %llu tokens in the batch",
                        (unsigned long long)r->max_len, (unsigned long long)longest);
        if (r->uniform) {
            pl_frag f1;
            if (pl_fragmentation(&one_len, 1, o->block_size, r->max_len, &f1))
                return overflow("the fragmentation");
            pl_frag *f = &r->frag;
            f->n_seqs = r->batch;
            if (pl_mul(f1.n_tokens, r->batch, &f->n_tokens) ||
                pl_mul(f1.n_blocks, r->batch, &f->n_blocks) ||
                pl_mul(f1.paged_alloc_tokens, r->batch, &f->paged_alloc_tokens) ||
                pl_mul(f1.paged_waste_tokens, r->batch, &f->paged_waste_tokens) ||
                pl_mul(f1.contig_alloc_tokens, r->batch, &f->contig_alloc_tokens) ||
                pl_mul(f1.contig_waste_tokens, r->batch, &f->contig_waste_tokens) ||
                pl_mul(o->seq_len, r->tok_gpu, &r->seq_bytes_gpu))
                return overflow("the batch");
        } else if (pl_fragmentation(o->lens, o->n_lens, o->block_size, r->max_len, &r->frag)) {
            return overflow("the fragmentation");
        }
        r->batch_tokens = r->frag.n_tokens;
        if (pl_mul(r->batch_tokens, r->tok_gpu, &r->batch_bytes_gpu))
            return overflow("the KV bytes of the batch");
        /* Naive attention scores for one layer: sum over sequences of Hq x len^2 x s. */
        uint64_t sq = 0, s = pl_dtype_bytes(r->m.kv_dtype);
        r->ws_ok = true;
        if (r->uniform) {
            r->ws_ok = !pl_mul(o->seq_len, o->seq_len, &sq) && !pl_mul(sq, r->batch, &sq);
        } else {
            for (size_t i = 0; i < o->n_lens && r->ws_ok; i++) {
                uint64_t t;
                r->ws_ok = !pl_mul(o->lens[i], o->lens[i], &t) && !pl_add(sq, t, &sq);
            }
        }
        r->ws_ok = r->ws_ok && !pl_mul(sq, r->tp.q_heads_per_rank, &sq) &&
                   !pl_mul(sq, s, &r->ws_bytes_gpu);
    }

    /* The trace. */
    size_t n_trace = 0;
    if (o->trace != NULL) {
        if ((rc = read_trace(o, trace_lens, &n_trace, r)) != 0)
            return rc;
        r->has_trace = true;
        r->trace_path = o->trace;
        uint64_t *tl = *trace_lens;
        if (pl_len_stats(tl, n_trace, &r->st))
            return overflow("the sum of the trace lengths");
        r->tmax_len = o->max_len > 0 ? o->max_len : r->st.max;
        if (r->tmax_len < r->st.max)
            return fail(EXIT_INPUT,
                        "--max-len %llu is shorter than the longest request in the trace "
                        "(%llu tokens)",
                        (unsigned long long)r->tmax_len, (unsigned long long)r->st.max);
        if (pl_fragmentation(tl, n_trace, o->block_size, r->tmax_len, &r->tfrag))
            return overflow("the trace fragmentation");
        r->sum_blocks = r->tfrag.n_blocks;
        r->conc = o->concurrency;
        if (r->conc > 0) {
            uint64_t t;
            /* Expectations: ceil(N x sum / n), the mean rounded up to whole tokens/blocks. */
            if (pl_mul(r->conc, r->st.sum, &t))
                return overflow("--concurrency x the trace's total length");
            r->exp_tokens = t / n_trace + (t % n_trace != 0);
            if (pl_mul(r->conc, r->sum_blocks, &t))
                return overflow("--concurrency x the trace's blocks");
            r->exp_blocks = t / n_trace + (t % n_trace != 0);
            if (pl_sum_longest(tl, n_trace, r->conc, &r->worst_tokens))
                return overflow("the sum of the longest requests");
            uint64_t wb = 0;
            for (uint64_t i = 0; i < r->conc; i++) {
                uint64_t len = tl[i < n_trace ? n_trace - 1 - i : n_trace - 1];
                if (pl_add(wb, pl_blocks_for(len, o->block_size), &wb))
                    return overflow("the blocks of the longest requests");
            }
            r->worst_blocks = wb;
            uint64_t b;
            if (pl_mul(r->exp_tokens, r->tok_gpu, &b) || pl_mul(r->worst_tokens, r->tok_gpu, &b) ||
                pl_mul(r->worst_blocks, r->blk_gpu, &b) || pl_mul(r->exp_blocks, r->blk_gpu, &b))
                return overflow("the KV bytes of the concurrent requests");
        }
    }

    /* The inverse plan. */
    if (o->have_gpu_mem) {
        r->has_mem = true;
        if (o->have_weights_mem) {
            r->weights_total = o->weights_mem;
            r->weights_from = "--weights-mem";
        } else if (r->m.n_params > 0) {
            if (pl_mul(r->m.n_params, pl_dtype_bytes(r->m.w_dtype), &r->weights_total))
                return overflow("the weight memory");
            snprintf(r->weights_from_buf, sizeof r->weights_from_buf,
                     "%llu parameters (%s) x %u bytes (%s)", (unsigned long long)r->m.n_params,
                     o->params ? "--params" : "preset", pl_dtype_bytes(r->m.w_dtype),
                     pl_dtype_name(r->m.w_dtype));
            r->weights_from = r->weights_from_buf;
        } else {
            return fail(EXIT_USAGE, "--gpu-mem needs the weight memory: give --weights-mem or "
                                    "--params (a --model preset knows its parameter count)");
        }
        if (o->reserve >= o->gpu_mem)
            return fail(EXIT_INPUT,
                        "--reserve (%llu bytes) is not smaller than --gpu-mem "
                        "(%llu bytes)",
                        (unsigned long long)o->reserve, (unsigned long long)o->gpu_mem);
        pl_mem_in *in = &r->mem_in;
        in->gpu_mem_bytes = o->gpu_mem;
        in->util_ppm = o->util_ppm;
        in->weights_bytes = r->weights_total;
        in->reserve_bytes = o->reserve;
        in->tp = r->tp.tp;
        in->block_bytes = r->blk_gpu;
        in->block_size = o->block_size;
        rc = pl_memory(in, &r->mem);
        if (rc == PL_ENOSPACE) {
            char a[32], b[32], c[32];
            uint64_t q = o->gpu_mem / 1000000, rem = o->gpu_mem % 1000000;
            uint64_t budget = q * o->util_ppm + rem * o->util_ppm / 1000000;
            uint64_t wpg = r->weights_total / r->tp.tp + (r->weights_total % r->tp.tp != 0);
            return fail(EXIT_INPUT,
                        "no memory left for the KV cache: weights %s per GPU (%s) + --reserve "
                        "%s do not fit the budget of %s (--gpu-mem x --util)",
                        cli_fmt_binary(wpg, a, sizeof a), r->weights_from,
                        cli_fmt_binary(o->reserve, b, sizeof b),
                        cli_fmt_binary(budget, c, sizeof c));
        }
        if (rc != PL_OK)
            return overflow("the memory plan");
        if (r->has_batch && r->uniform)
            r->fit_seq = pl_fit_count(r->mem.n_blocks, pl_blocks_for(r->seq_len, o->block_size));
        uint64_t ml = r->has_batch ? r->max_len : (r->has_trace ? r->tmax_len : 0);
        r->fit_contig = ml ? r->mem.n_tokens / ml : 0;
        if (r->has_trace) {
            uint64_t t;
            /* Mean-based: n_blocks / (sum_blocks / n) = n_blocks x n / sum_blocks. */
            if (r->sum_blocks == 0)
                r->conc_mean_fit = 0;
            else if (!pl_mul(r->mem.n_blocks, n_trace, &t))
                r->conc_mean_fit = t / r->sum_blocks;
            else
                r->conc_mean_fit =
                    (uint64_t)((double)r->mem.n_blocks * (double)n_trace / (double)r->sum_blocks);
            r->conc_worst_fit =
                pl_fit_longest(*trace_lens, n_trace, o->block_size, r->mem.n_blocks);
        }
    }
    return 0;
}

static void list_models(void)
{
    printf("%-14s %-28s %6s %6s %6s %6s %5s %14s\n", "preset", "Hugging Face repository", "layers",
           "heads", "kv", "dim", "dtype", "parameters");
    for (size_t i = 0; i < pl_model_count(); i++) {
        const pl_model_preset *p = pl_model_at(i);
        printf("%-14s %-28s %6u %6u %6u %6u %5s %14llu\n", p->name, p->hf_repo, p->shape.n_layers,
               p->shape.n_heads, p->shape.n_kv_heads, p->shape.head_dim,
               pl_dtype_name(p->shape.kv_dtype), (unsigned long long)p->shape.n_params);
    }
    printf("\nSources (config.json on each model card; parameters computed from its shapes):\n");
    for (size_t i = 0; i < pl_model_count(); i++)
        printf("  %s: %s\n", pl_model_at(i)->name, pl_model_at(i)->source);
}

int pl_main(int argc, char **argv)
{
    plan_opts o;
    memset(&o, 0, sizeof o);
    o.block_size = 16;
    o.util_ppm = 900000;
    o.tp = 1;
    o.trace_bs = 512;
    o.include_output = true;
    plan_result r;
    memset(&r, 0, sizeof r);
    uint64_t *trace_lens = NULL;

    int rc = parse_args(argc, argv, &o);
    if (rc == 0 && o.help) {
        fputs(usage_text, stdout);
    } else if (rc == 0 && o.list_models) {
        list_models();
    } else if (rc == 0 && (rc = build_model(&o, &r)) == 0 &&
               (rc = compute(&o, &r, &trace_lens)) == 0) {
        if (o.json)
            rc = pl_print_json(&r, &o);
        else
            pl_print_table(&r, &o);
    }
    if (rc == 0 && fflush(stdout) != 0)
        rc = fail(EXIT_INPUT, "cannot write the output");
    free(trace_lens);
    free(o.lens);
    return rc;
}
