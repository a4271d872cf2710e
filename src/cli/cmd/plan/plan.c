/*
 * plan.c - `kvprefix plan`: KV-cache capacity planning from the command line.
 *
 * Forward: the logical KV bytes of a token, a block, a sequence and a batch for a model:
 * 2 x L x Hkv x D x s per token for standard attention, summed over layer runs for sliding-
 * window, latent (MLA), recurrent-state and KV-sharing layers (kvplan.h), with the scales of
 * a quantized KV dtype counted. Inverse: what a GPU has left for KV after weights
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
#include <strings.h>

#include "cli.h"
#include "flags.h"
#include "hashopt.h"
#include "kvplan.h"
#include "logread.h"
#include "gpus.h"
#include "models.h"
#include "outfile.h"

#define MAX_BLOCK_SIZE 65536u /* the library's KVP_MAX_BLOCK_SIZE */
#define MAX_COUNT      (UINT64_C(1) << 31)

static const char usage_text[] =
    "Usage: kvprefix plan (--model NAME | --config FILE | --layers L --kv-heads H --head-dim D)\n"
    "                     [options]\n"
    "\n"
    "KV-cache capacity planning: logical KV bytes = 2 x L x Hkv x D x s x (sum of the active\n"
    "sequences' lengths) for standard attention, summed per layer for sliding-window, latent\n"
    "(MLA), hybrid (state) and KV-sharing models; and the inverse: how many blocks, tokens and\n"
    "requests fit a GPU.\n"
    "\n"
    "Model (one of):\n"
    "  --model NAME         a preset (--list-models shows them), e.g. Llama-3.1-8B\n"
    "  --config FILE        a Hugging Face config.json\n"
    "  --layers L --kv-heads H --head-dim D [--heads HQ]   the shape itself (HQ defaults to H)\n"
    "  (--layers, --heads, --kv-heads, --head-dim also override a preset or config)\n"
    "  --dtype T            KV and weight dtype: fp32, fp16, bf16, fp8, int8, int4 (default:\n"
    "                       the model's, bf16 for a bare shape)\n"
    "  --kv-dtype T         KV dtype only;  --weights-dtype T  weight dtype only\n"
    "  --kv-scales L        scales of a quantized KV dtype (fp8, int8, int4): per-tensor\n"
    "                       (default), per-head, per-token, per-block:G (G elements per scale)\n"
    "  --kv-scale-dtype T   element type of a scale (default fp32)\n"
    "  --window W           sliding window of W tokens on the windowed layers (on every\n"
    "                       layer when the model has none);  --no-window  full attention\n"
    "                       everywhere (the same model without its windows)\n"
    "\n";

/* The rest of the help (one literal would exceed the 4095 characters C11 guarantees). */
static const char usage_text2[] =
    "Forward:\n"
    "  --block-size N       tokens per KV block (default 16, as the library; 64 for MLA\n"
    "                       models, as vLLM's MLA backends)\n"
    "  --seq-len T          sequence length;  --batch B  sequences of that length (default 1)\n"
    "  --lens A,B,C         a variable-length batch instead of --seq-len/--batch\n"
    "  --max-len M          contiguous reservation per sequence, for the fragmentation\n"
    "                       comparison (default: the longest length)\n"
    "\n"
    "Inverse (per GPU):\n"
    "  --gpu PRESET         a GPU's memory: H100-80GB (80 GiB), A100-40GB, A100-80GB,\n"
    "                       H200-141GB, L40S-48GB, MI300X-192GB\n"
    "  --gpu-mem SIZE       or the memory of one GPU: 80GiB, 80GB (10^9), 81920MiB\n"
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
    "  --max-line-bytes N   longest accepted trace line (default 64MiB)\n"
    "  --include-output     lengths = input + output (the default: KV holds both in decode)\n"
    "  --no-include-output  lengths = input only\n"
    "\n"
    "Hash checks on the --trace lines (no capacity figure depends on them):\n" CLI_HASH_HELP
    "  With any of these, every trace line is refused as a cache with that profile would\n"
    "  refuse it, with FILE:LINE, as replay does: under vllm-* a line naming a model or a\n"
    "  tenant (vLLM keys have neither), and an id at or above --vocab-size.\n"
    "\n"
    "Output:\n"
    "  --json               JSON instead of the table\n"
    "  --list-models        list the model and GPU presets and their sources\n"
    "  --help               this text\n"
    "\n"
    "Examples:\n"
    "  kvprefix plan --layers 32 --kv-heads 32 --head-dim 128 --dtype fp16 --seq-len 4096\n"
    "  kvprefix plan --model Llama-3.1-8B --seq-len 8192 --batch 16 --gpu-mem 80GiB\n"
    "  kvprefix plan --model Llama-3.1-70B --tp 8 --gpu-mem 80GiB --reserve 4GiB "
    "--seq-len 32768\n"
    "  kvprefix plan --config config.json --params 7B --gpu-mem 24GiB --lens 512,3000,9000\n"
    "  kvprefix plan --model Qwen2.5-7B --trace trace.jsonl.gz --concurrency 64 "
    "--gpu-mem 80GiB\n"
    "\n" CLI_EXIT_HELP;

#include "plan.h"

/* Print "kvprefix plan: message" to stderr and return code (the exit status). */
#define fail(...) cli_fail("plan", __VA_ARGS__)

/* One --lens item: a length in 1 .. LOG_MAX_LEN. */
static int lens_item(void *ctx, const char *item, size_t len, size_t index)
{
    plan_opts *o = ctx;
    char tmp[32];
    if (!cli_item_copy(item, len, tmp, sizeof tmp))
        snprintf(tmp, sizeof tmp, "%.*s...", 24, item);
    int rc = cli_flag_uint("plan", "--lens", tmp, 1, LOG_MAX_LEN, &o->lens[index]);
    if (rc == 0)
        o->n_lens = index + 1;
    return rc;
}

static int parse_lens(const char *v, plan_opts *o)
{
    size_t n = 1;
    for (const char *p = v; *p; p++)
        n += *p == ',';
    free(o->lens);
    o->n_lens = 0;
    o->lens = calloc(n, sizeof *o->lens);
    if (o->lens == NULL)
        return fail(CLI_EXIT_INPUT, "--lens: out of memory");
    return cli_flag_list("plan", "--lens", v, n, lens_item, o);
}

enum {
    OPT_MODEL = 256,
    OPT_CONFIG,
    OPT_LAYERS,
    OPT_HEADS,
    OPT_KV_HEADS,
    OPT_HEAD_DIM,
    OPT_DTYPE,
    OPT_KV_DTYPE,
    OPT_W_DTYPE,
    OPT_KV_SCALES,
    OPT_KV_SCALE_DTYPE,
    OPT_WINDOW,
    OPT_NO_WINDOW,
    OPT_BLOCK_SIZE,
    OPT_SEQ_LEN,
    OPT_BATCH,
    OPT_LENS,
    OPT_MAX_LEN,
    OPT_GPU_MEM,
    OPT_GPU,
    OPT_UTIL,
    OPT_WEIGHTS_MEM,
    OPT_PARAMS,
    OPT_RESERVE,
    OPT_TP,
    OPT_TRACE,
    OPT_TRACE_BS,
    OPT_CONCURRENCY,
    OPT_MAX_LINE,
    OPT_INCLUDE_OUTPUT,
    OPT_NO_INCLUDE_OUTPUT,
    OPT_JSON,
    OPT_LIST,
    OPT_HELP = 'h'
};

static const struct option longopts[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"heads", required_argument, NULL, OPT_HEADS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
    {"weights-dtype", required_argument, NULL, OPT_W_DTYPE},
    {"kv-scales", required_argument, NULL, OPT_KV_SCALES},
    {"kv-scale-dtype", required_argument, NULL, OPT_KV_SCALE_DTYPE},
    {"window", required_argument, NULL, OPT_WINDOW},
    {"no-window", no_argument, NULL, OPT_NO_WINDOW},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"seq-len", required_argument, NULL, OPT_SEQ_LEN},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"lens", required_argument, NULL, OPT_LENS},
    {"max-len", required_argument, NULL, OPT_MAX_LEN},
    {"gpu-mem", required_argument, NULL, OPT_GPU_MEM},
    {"gpu", required_argument, NULL, OPT_GPU},
    {"util", required_argument, NULL, OPT_UTIL},
    {"weights-mem", required_argument, NULL, OPT_WEIGHTS_MEM},
    {"params", required_argument, NULL, OPT_PARAMS},
    {"reserve", required_argument, NULL, OPT_RESERVE},
    {"tp", required_argument, NULL, OPT_TP},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"trace-block-size", required_argument, NULL, OPT_TRACE_BS},
    {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
    {"max-line-bytes", required_argument, NULL, OPT_MAX_LINE},
    {"include-output", no_argument, NULL, OPT_INCLUDE_OUTPUT},
    {"no-include-output", no_argument, NULL, OPT_NO_INCLUDE_OUTPUT},
    {"json", no_argument, NULL, OPT_JSON},
    {"list-models", no_argument, NULL, OPT_LIST},
    {"help", no_argument, NULL, OPT_HELP},
    CLI_HASH_LONGOPTS,
    {NULL, 0, NULL, 0},
};

/* Apply an option that takes a number, a size or a list. Returns 0 or an exit code. */
static int apply_value(plan_opts *o, int id, const char *flag, const char *v)
{
    uint64_t x;
    int rc = 0;
    switch (id) {
    case OPT_LAYERS:
        return cli_flag_uint("plan", flag, v, 1, MAX_COUNT, &o->layers);
    case OPT_HEADS:
        return cli_flag_uint("plan", flag, v, 1, MAX_COUNT, &o->heads);
    case OPT_KV_HEADS:
        return cli_flag_uint("plan", flag, v, 1, MAX_COUNT, &o->kv_heads);
    case OPT_HEAD_DIM:
        return cli_flag_uint("plan", flag, v, 1, MAX_COUNT, &o->head_dim);
    case OPT_WINDOW:
        return cli_flag_uint("plan", flag, v, 1, MAX_COUNT, &o->window);
    case OPT_BLOCK_SIZE:
        if ((rc = cli_flag_uint("plan", flag, v, 1, MAX_BLOCK_SIZE, &x)) == 0)
            o->block_size = (uint32_t)x;
        o->block_size_given = true;
        break;
    case OPT_SEQ_LEN:
        return cli_flag_uint("plan", flag, v, 1, LOG_MAX_LEN, &o->seq_len);
    case OPT_BATCH:
        return cli_flag_uint("plan", flag, v, 1, UINT64_C(4294967295), &o->batch);
    case OPT_LENS:
        return parse_lens(v, o);
    case OPT_MAX_LEN:
        return cli_flag_uint("plan", flag, v, 1, LOG_MAX_LEN, &o->max_len);
    case OPT_GPU_MEM:
        if (o->gpu)
            return fail(CLI_EXIT_USAGE, "give either --gpu or --gpu-mem, not both");
        rc = cli_flag_bytes("plan", flag, v, 1, UINT64_MAX, &o->gpu_mem);
        o->have_gpu_mem = true;
        o->gpu_mem_arg = v;
        break;
    case OPT_GPU: {
        const cap_gpu_preset *g = cap_gpu_find(v);
        if (o->gpu_mem_arg)
            return fail(CLI_EXIT_USAGE, "give either --gpu or --gpu-mem, not both");
        if (!g) {
            char list[256] = "";
            for (size_t i = 0; i < cap_gpu_count(); i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         cap_gpu_at(i)->name);
            return fail(CLI_EXIT_USAGE, "--gpu: no preset '%s' (%s)", v, list);
        }
        o->gpu = g->name;
        o->gpu_mem = g->mem_bytes;
        o->have_gpu_mem = true;
        break;
    }
    case OPT_UTIL:
        rc = cli_flag_fraction("plan", flag, v, &o->util_ppm);
        break;
    case OPT_WEIGHTS_MEM:
        rc = cli_flag_bytes("plan", flag, v, 0, UINT64_MAX, &o->weights_mem);
        o->have_weights_mem = true;
        break;
    case OPT_PARAMS:
        return cli_flag_count("plan", flag, v, 1, UINT64_MAX, &o->params);
    case OPT_RESERVE:
        return cli_flag_bytes("plan", flag, v, 0, UINT64_MAX, &o->reserve);
    case OPT_TP:
        if ((rc = cli_flag_uint("plan", flag, v, 1, 1u << 20, &x)) == 0)
            o->tp = (uint32_t)x;
        break;
    case OPT_TRACE_BS:
        if ((rc = cli_flag_uint("plan", flag, v, 0, MAX_BLOCK_SIZE, &x)) == 0)
            o->trace_bs = (uint32_t)x;
        break;
    case OPT_CONCURRENCY:
        return cli_flag_uint("plan", flag, v, 1, UINT64_C(4294967295), &o->concurrency);
    case OPT_MAX_LINE:
        if ((rc = cli_flag_bytes("plan", flag, v, 1024, LOG_MAX_LINE_LIMIT, &x)) == 0)
            o->max_line_bytes = (size_t)x;
        break;
    default:
        break;
    }
    return rc;
}

/* Apply one option. Returns 0 or an exit code (message printed). */
static int apply_opt(plan_opts *o, int id, const char *flag, const char *v)
{
    int rc = 0;
    switch (id) {
    case OPT_MODEL:
        o->model_name = v;
        break;
    case OPT_CONFIG:
        o->config_path = v;
        break;
    case OPT_DTYPE:
        o->dtype = v;
        break;
    case OPT_KV_DTYPE:
        o->kv_dtype = v;
        break;
    case OPT_W_DTYPE:
        o->w_dtype = v;
        break;
    case OPT_KV_SCALES:
        o->kv_scales = v;
        break;
    case OPT_KV_SCALE_DTYPE:
        o->kv_scale_dtype = v;
        break;
    case OPT_NO_WINDOW:
        o->no_window = true;
        break;
    case OPT_TRACE:
        o->trace = v;
        break;
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
        if (cli_hash_is_opt(id))
            return cli_hash_apply("plan", &o->hash, id, v);
        return apply_value(o, id, flag, v);
    }
    return rc;
}

/* Parse argv[1 ..] with getopt_long. Returns 0 or an exit code (message printed). */
static int parse_args(int argc, char **argv, plan_opts *o)
{
    int c, idx;
    cli_getopt_begin();
    while ((c = getopt_long(argc, argv, ":h", longopts, &idx)) != -1) {
        if (c == '?' || c == ':')
            return cli_getopt_error("plan", c, argv, longopts);
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", c == 'h' ? "help" : longopts[idx].name);
        int rc = apply_opt(o, c, flag, optarg);
        if (rc != 0)
            return rc;
    }
    if (optind < argc &&
        (cap_model_find(argv[optind]) || cap_model_versions(argv[optind], NULL, 0)))
        return fail(CLI_EXIT_USAGE, "unexpected argument '%s' (a model is given as --model %s)",
                    argv[optind], argv[optind]);
    if (optind < argc)
        return fail(CLI_EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    if (cli_hash_any(&o->hash) && !o->trace && !o->help && !o->list_models)
        return fail(CLI_EXIT_USAGE, "--hash, --hash-key, --vllm-seed and --vocab-size check the "
                                    "lines of a request log: add --trace FILE");
    kvp_config_init(&o->hash_cfg);
    o->hash_cfg.block_size = o->block_size;
    return cli_hash_finish("plan", &o->hash, &o->hash_cfg);
}

static int dtype_flag(const char *flag, const char *v, cap_dtype *out)
{
    if (cap_dtype_parse(v, out) != CAP_OK)
        return fail(CLI_EXIT_USAGE,
                    "%s: unknown dtype '%s' (use fp32, fp16, bf16, fp8, int8 or int4)", flag, v);
    return 0;
}

/* --dtype, --kv-dtype, --weights-dtype. Returns 0 or an exit code. */
static int apply_dtype_flags(const plan_opts *o, plan_result *r)
{
    int rc;
    cap_dtype d;
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
    return 0;
}

/* The KV quantization (--kv-scales, --kv-scale-dtype: per-tensor fp32 by default for a
 * quantized KV dtype) and the window flags. Returns 0 or an exit code. */
static int apply_kv_flags(const plan_opts *o, plan_result *r)
{
    cap_kv_quant *q = &r->m.kv_quant;
    bool quant = cap_dtype_is_quantized(r->m.kv_dtype);
    if (!quant && (o->kv_scales || o->kv_scale_dtype))
        return fail(CLI_EXIT_USAGE, "--kv-scales and --kv-scale-dtype apply to a quantized KV "
                                    "dtype: add --kv-dtype fp8, int8 or int4");
    q->layout = quant ? CAP_SCALES_TENSOR : CAP_SCALES_NONE;
    q->group = 0;
    q->scale_dtype = CAP_DTYPE_FP32;
    if (o->kv_scales && cap_scales_parse(o->kv_scales, q) != CAP_OK)
        return fail(CLI_EXIT_USAGE,
                    "--kv-scales: '%s' is not per-tensor, per-head, per-token or "
                    "per-block:G (G in 1..65536)",
                    o->kv_scales);
    if (o->kv_scale_dtype && (cap_dtype_parse(o->kv_scale_dtype, &q->scale_dtype) != CAP_OK ||
                              q->scale_dtype == CAP_DTYPE_INT4))
        return fail(CLI_EXIT_USAGE, "--kv-scale-dtype: '%s' is not fp32, fp16, bf16, fp8 or int8",
                    o->kv_scale_dtype);
    if (o->no_window && o->window)
        return fail(CLI_EXIT_USAGE, "give either --window or --no-window, not both");
    if ((o->no_window || o->window) &&
        cap_model_set_window(&r->m, o->no_window ? 0 : (uint32_t)o->window) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "--window: %s has no attention layer to window",
                    r->model_label);
    return 0;
}

/* A model given by --layers, --kv-heads and --head-dim alone. Returns 0 or an exit code. */
static int bare_shape(const plan_opts *o, plan_result *r)
{
    if (o->layers == 0 && o->kv_heads == 0 && o->head_dim == 0)
        return fail(CLI_EXIT_USAGE, "no model: give --model NAME, --config FILE, or --layers, "
                                    "--kv-heads and --head-dim");
    if (o->layers == 0)
        return fail(CLI_EXIT_USAGE, "--layers is missing (the shape needs --layers, "
                                    "--kv-heads and --head-dim)");
    if (o->kv_heads == 0)
        return fail(CLI_EXIT_USAGE, "--kv-heads is missing (the shape needs --layers, "
                                    "--kv-heads and --head-dim)");
    if (o->head_dim == 0)
        return fail(CLI_EXIT_USAGE, "--head-dim is missing (the shape needs --layers, "
                                    "--kv-heads and --head-dim)");
    r->model_label = "custom shape";
    r->model_source = "command-line flags";
    if (o->heads == 0) {
        r->m.n_heads = (uint32_t)o->kv_heads;
        r->heads_assumed = true;
    }
    return 0;
}

/* Build the model shape from --model / --config / flags. Returns 0 or an exit code. */
static int build_model(const plan_opts *o, plan_result *r)
{
    static char errbuf[512];
    int rc;
    cap_model_shape_init(&r->m);
    if (o->model_name != NULL && o->config_path != NULL)
        return fail(CLI_EXIT_USAGE, "give either --model or --config, not both");
    if (o->model_name != NULL) {
        const cap_model_preset *p = cap_model_find(o->model_name), *v[4];
        size_t n_v = p ? 0 : cap_model_versions(o->model_name, v, 4);
        if (p == NULL && n_v >= 2)
            return fail(CLI_EXIT_USAGE,
                        "--model: '%s' names versions with different attention: %s, %s%s "
                        "(give the version)",
                        o->model_name, v[0]->name, v[1]->name, n_v > 2 ? ", ..." : "");
        if (p == NULL)
            return fail(CLI_EXIT_USAGE, "--model: unknown preset '%s' (see --list-models)",
                        o->model_name);
        r->m = p->shape;
        r->max_context = p->max_context;
        r->model_label = p->name;
        r->model_source = p->source;
    } else if (o->config_path != NULL) {
        if (cap_model_from_config(o->config_path, &r->m, errbuf, sizeof errbuf) != CAP_OK)
            return fail(CLI_EXIT_INPUT, "--config: %s", errbuf);
        r->model_label = o->config_path;
        r->model_source = "Hugging Face config.json";
    } else if ((rc = bare_shape(o, r)) != 0) {
        return rc;
    }
    if (r->m.layers.n_runs > 0 && (o->layers || o->kv_heads || o->head_dim))
        return fail(CLI_EXIT_USAGE,
                    "--layers, --kv-heads and --head-dim describe a uniform model; "
                    "%s has per-layer runs (edit a config.json instead)",
                    r->model_label);
    if (o->layers)
        r->m.n_layers = (uint32_t)o->layers;
    if (o->heads)
        r->m.n_heads = (uint32_t)o->heads;
    if (o->kv_heads)
        r->m.n_kv_heads = (uint32_t)o->kv_heads;
    if (o->head_dim)
        r->m.head_dim = (uint32_t)o->head_dim;
    if (o->params)
        r->m.n_params = o->params;
    if ((rc = apply_dtype_flags(o, r)) != 0 || (rc = apply_kv_flags(o, r)) != 0)
        return rc;
    const char *what = NULL;
    if (cap_model_shape_check(&r->m, &what) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "model shape: %s (--heads %u, --kv-heads %u)", what,
                    r->m.n_heads, r->m.n_kv_heads);
    if (cap_tp_split(&r->m, o->tp, &r->tp, &what) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "--tp %u: %s (query heads %u, KV heads %u)", o->tp, what,
                    r->m.n_heads, r->m.n_kv_heads);
    return 0;
}

/* Refuse rec as a cache with the hash flags' profile would: its namespace (kvp_hasher_root)
 * and its ids against --vocab-size (prompt, and output when lengths include it). Returns 0
 * or CLI_EXIT_INPUT after "FILE:LINE: why". */
static int check_trace_line(const plan_opts *o, const kvp_hasher *h, const log_record *rec)
{
    kvp_namespace ns;
    kvp_namespace_init(&ns);
    ns.model = (kvp_field){rec->model, rec->model ? rec->model_len : 0};
    ns.adapter = (kvp_field){rec->adapter, rec->adapter ? rec->adapter_len : 0};
    ns.tenant = (kvp_field){rec->tenant, rec->tenant ? rec->tenant_len : 0};
    ns.salt = (kvp_field){rec->cache_salt, rec->cache_salt ? rec->cache_salt_len : 0};
    kvp_chain root;
    int rc = kvp_hasher_root(h, &ns, &root);
    const uint32_t *bad = NULL;
    size_t n_bad = 0;
    uint32_t vocab = o->hash_cfg.vocab_size;
    for (size_t i = 0; rc == KVP_OK && vocab && i < rec->n_tokens; i++)
        if (rec->tokens[i] >= vocab)
            rc = KVP_ETOKEN, bad = rec->tokens, n_bad = rec->n_tokens;
    for (size_t i = 0; rc == KVP_OK && vocab && o->include_output && i < rec->n_output_tokens; i++)
        if (rec->output_tokens[i] >= vocab)
            rc = KVP_ETOKEN, bad = rec->output_tokens, n_bad = rec->n_output_tokens;
    if (rc == KVP_OK)
        return 0;
    char why[512];
    cli_hash_refusal(rc, o->hash_cfg.hash_profile, vocab, &ns, bad, n_bad, why, sizeof why);
    return fail(CLI_EXIT_INPUT, "%s:%llu: %s%s", cli_input_name(o->trace),
                (unsigned long long)rec->line_no, bad == rec->output_tokens && bad ? "output " : "",
                why);
}

/* Read the trace's lengths into a growing array. Returns 0 or an exit code. */
static int read_trace(const plan_opts *o, uint64_t **lens_out, size_t *n_out, plan_result *r)
{
    log_options lo;
    log_options_init(&lo);
    lo.hash_block_size = o->trace_bs;
    lo.max_line_bytes = o->max_line_bytes;
    log_reader *rd = NULL;
    char err[512];
    if (log_open(o->trace, &lo, &rd, err, sizeof err) != 0)
        return fail(CLI_EXIT_INPUT, "--trace: %s", err);
    kvp_hasher *h = NULL;
    int hrc = cli_hash_any(&o->hash) ? kvp_hasher_new(&o->hash_cfg, &h) : KVP_OK;
    if (hrc != KVP_OK) {
        log_close(rd);
        return fail(CLI_EXIT_INPUT, "--hash: cannot make the hash function: %s",
                    cli_kvp_error(hrc));
    }
    uint64_t *lens = NULL;
    size_t n = 0, cap = 0;
    int code = 0;
    for (;;) {
        log_record rec;
        int rc = log_next(rd, &rec);
        if (rc == LOG_END)
            break;
        if (rc < 0) {
            code = fail(CLI_EXIT_INPUT, "%s", log_error(rd));
            break;
        }
        if (h && (code = check_trace_line(o, h, &rec)) != 0)
            break;
        uint64_t len = rec.input_length + (o->include_output ? rec.output_length : 0);
        if (rec.format != LOG_MOONCAKE)
            r->n_tokens_fmt++;
        else
            r->n_mooncake_fmt++;
        if (!cli_grow((void **)&lens, &cap, n + 1, sizeof *lens)) {
            code = fail(CLI_EXIT_INPUT, "--trace: out of memory after %zu requests", n);
            break;
        }
        lens[n++] = len;
    }
    if (code == 0 && n == 0)
        code = fail(CLI_EXIT_INPUT, "%s: no requests (the file is empty or has only blank lines)",
                    cli_input_name(o->trace));
    kvp_hasher_free(h);
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
    return fail(CLI_EXIT_INPUT, "%s does not fit in 64 bits; use smaller values", what);
}

/* Sum of the bytes of lens[0 .. n) (each taken `mult` times), held contiguously (bs 0) or in
 * blocks of bs tokens, under the per-layer cost c. Returns 0, or 1 on overflow. */
static int sum_seq_bytes(const cap_kv_cost *c, const uint64_t *lens, size_t n, uint64_t mult,
                         uint32_t bs, uint64_t *out)
{
    uint64_t total = 0, b;
    for (size_t i = 0; i < n; i++) {
        int rc = bs ? cap_seq_paged_bytes(c, lens[i], bs, &b) : cap_seq_bytes(c, lens[i], &b);
        if (rc != CAP_OK || cap_mul(b, mult, &b) || cap_add(total, b, &total))
            return 1;
    }
    *out = total;
    return 0;
}

/* Bytes of a set of sequences (lens, each `mult` times) exact, paged, and their waste against
 * paging and against max_len reservations. Under a linear model these are the token counts of
 * *f times the bytes per token. Returns 0, or 1 on overflow. */
static int set_bytes(const plan_result *r, const cap_frag *f, const uint64_t *lens, size_t n,
                     uint64_t mult, uint64_t max_len, uint64_t out[4])
{
    const cap_kv_cost *c = &r->cost;
    uint64_t exact, paged, contig;
    if (c->linear) {
        if (cap_mul(f->n_tokens, r->tok_gpu, &exact) || cap_mul(f->n_blocks, r->blk_gpu, &paged) ||
            cap_mul(f->paged_waste_tokens, r->tok_gpu, &out[2]) ||
            cap_mul(f->contig_waste_tokens, r->tok_gpu, &out[3]))
            return 1;
        out[0] = exact;
        out[1] = paged;
        return 0;
    }
    if (sum_seq_bytes(c, lens, n, mult, 0, &exact) ||
        sum_seq_bytes(c, lens, n, mult, r->block_size, &paged) ||
        cap_seq_bytes(c, max_len, &contig) || cap_mul(contig, f->n_seqs, &contig))
        return 1;
    out[0] = exact;
    out[1] = paged;
    out[2] = paged - exact;
    out[3] = contig - exact;
    return 0;
}

/* The batch's fragmentation in tokens (--seq-len x --batch, or --lens). Returns 0 or an exit
 * code. */
static int batch_frag(const plan_opts *o, plan_result *r)
{
    if (r->uniform) {
        cap_frag f1;
        uint64_t one_len = o->seq_len;
        if (cap_fragmentation(&one_len, 1, o->block_size, r->max_len, &f1))
            return overflow("the fragmentation");
        cap_frag *f = &r->frag;
        f->n_seqs = r->batch;
        if (cap_mul(f1.n_tokens, r->batch, &f->n_tokens) ||
            cap_mul(f1.n_blocks, r->batch, &f->n_blocks) ||
            cap_mul(f1.paged_alloc_tokens, r->batch, &f->paged_alloc_tokens) ||
            cap_mul(f1.paged_waste_tokens, r->batch, &f->paged_waste_tokens) ||
            cap_mul(f1.contig_alloc_tokens, r->batch, &f->contig_alloc_tokens) ||
            cap_mul(f1.contig_waste_tokens, r->batch, &f->contig_waste_tokens) ||
            cap_seq_bytes(&r->cost, o->seq_len, &r->seq_bytes_gpu) ||
            cap_seq_paged_bytes(&r->cost, o->seq_len, o->block_size, &r->seq_paged_gpu))
            return overflow("the batch");
    } else if (cap_fragmentation(o->lens, o->n_lens, o->block_size, r->max_len, &r->frag)) {
        return overflow("the fragmentation");
    }
    return 0;
}

/* The batch: --seq-len x --batch, or --lens: its KV bytes, fragmentation and the naive
 * attention workspace. Returns 0 or an exit code. */
static int compute_batch(const plan_opts *o, plan_result *r)
{
    if (o->n_lens > 0 && (o->seq_len > 0 || o->batch > 0))
        return fail(CLI_EXIT_USAGE, "give either --lens or --seq-len/--batch, not both");
    if (o->batch > 0 && o->seq_len == 0)
        return fail(CLI_EXIT_USAGE, "--batch needs --seq-len");
    if (o->seq_len == 0 && o->n_lens == 0)
        return 0;
    uint64_t longest = 0;
    r->has_batch = true;
    r->uniform = o->n_lens == 0;
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
        return fail(CLI_EXIT_INPUT,
                    "--max-len %llu is shorter than a sequence of %llu tokens in the batch",
                    (unsigned long long)r->max_len, (unsigned long long)longest);
    int rc = batch_frag(o, r);
    if (rc != 0)
        return rc;
    r->batch_tokens = r->frag.n_tokens;
    uint64_t bytes[4];
    if (set_bytes(r, &r->frag, r->uniform ? &o->seq_len : o->lens, r->uniform ? 1 : o->n_lens,
                  r->uniform ? r->batch : 1, r->max_len, bytes))
        return overflow("the KV bytes of the batch");
    r->batch_bytes_gpu = bytes[0];
    r->batch_paged_gpu = bytes[1];
    r->waste_paged = bytes[2];
    r->waste_contig = bytes[3];
    /* Naive attention scores for one layer: sum over sequences of Hq x len^2 x s. */
    uint64_t sq = 0, s = cap_dtype_bytes(r->m.kv_dtype);
    r->ws_ok = true;
    if (r->uniform) {
        r->ws_ok = !cap_mul(o->seq_len, o->seq_len, &sq) && !cap_mul(sq, r->batch, &sq);
    } else {
        for (size_t i = 0; i < o->n_lens && r->ws_ok; i++) {
            uint64_t t;
            r->ws_ok = !cap_mul(o->lens[i], o->lens[i], &t) && !cap_add(sq, t, &sq);
        }
    }
    r->ws_ok =
        r->ws_ok && !cap_mul(sq, r->tp.q_heads_per_rank, &sq) && !cap_mul(sq, s, &r->ws_bytes_gpu);
    return 0;
}

/* ceil(a x b / n), or 1 on overflow. */
static int mean_of(uint64_t a, uint64_t b, uint64_t n, uint64_t *out)
{
    uint64_t t;
    if (cap_mul(a, b, &t))
        return 1;
    *out = t / n + (t % n != 0);
    return 0;
}

/* The KV of --concurrency requests drawn from the sorted trace tl[0 .. n): expected (N x the
 * mean) and worst (the N longest), in tokens, blocks and bytes. Returns 0 or an exit code. */
static int trace_concurrency(const plan_opts *o, plan_result *r, const uint64_t *tl, size_t n)
{
    /* Expectations: ceil(N x sum / n), the mean rounded up to whole tokens/blocks. */
    if (mean_of(r->conc, r->st.sum, n, &r->exp_tokens) ||
        mean_of(r->conc, r->sum_blocks, n, &r->exp_blocks))
        return overflow("--concurrency x the trace's total length");
    if (cap_sum_longest(tl, n, r->conc, &r->worst_tokens))
        return overflow("the sum of the longest requests");
    uint64_t wb = 0, wk = 0, wp = 0, b;
    for (uint64_t i = 0; i < r->conc; i++) {
        uint64_t len = tl[i < n ? n - 1 - i : n - 1];
        if (cap_add(wb, cap_blocks_for(len, o->block_size), &wb) ||
            cap_seq_bytes(&r->cost, len, &b) || cap_add(wk, b, &wk) ||
            cap_seq_paged_bytes(&r->cost, len, o->block_size, &b) || cap_add(wp, b, &wp))
            return overflow("the blocks of the longest requests");
    }
    r->worst_blocks = wb;
    if (r->cost.linear) {
        if (cap_mul(r->exp_tokens, r->tok_gpu, &r->exp_kv) ||
            cap_mul(r->worst_tokens, r->tok_gpu, &r->worst_kv) ||
            cap_mul(r->worst_blocks, r->blk_gpu, &r->worst_kv_paged) ||
            cap_mul(r->exp_blocks, r->blk_gpu, &r->exp_kv_paged))
            return overflow("the KV bytes of the concurrent requests");
        return 0;
    }
    uint64_t sum_exact, sum_paged;
    if (sum_seq_bytes(&r->cost, tl, n, 1, 0, &sum_exact) ||
        sum_seq_bytes(&r->cost, tl, n, 1, o->block_size, &sum_paged) ||
        mean_of(r->conc, sum_exact, n, &r->exp_kv) ||
        mean_of(r->conc, sum_paged, n, &r->exp_kv_paged))
        return overflow("the KV bytes of the concurrent requests");
    r->worst_kv = wk;
    r->worst_kv_paged = wp;
    return 0;
}

/* The trace: its length statistics, fragmentation and the KV of --concurrency requests
 * drawn from it. Sets *trace_lens (sorted, owned by the caller) and *n_trace. Returns 0 or an
 * exit code. */
static int compute_trace(const plan_opts *o, plan_result *r, uint64_t **trace_lens, size_t *n_trace)
{
    int rc;
    if ((rc = read_trace(o, trace_lens, n_trace, r)) != 0)
        return rc;
    r->has_trace = true;
    r->trace_path = o->trace;
    uint64_t *tl = *trace_lens;
    if (cap_len_stats(tl, (*n_trace), &r->st))
        return overflow("the sum of the trace lengths");
    r->tmax_len = o->max_len > 0 ? o->max_len : r->st.max;
    if (r->tmax_len < r->st.max)
        return fail(CLI_EXIT_INPUT,
                    "--max-len %llu is shorter than the longest request in the trace "
                    "(%llu tokens)",
                    (unsigned long long)r->tmax_len, (unsigned long long)r->st.max);
    if (cap_fragmentation(tl, (*n_trace), o->block_size, r->tmax_len, &r->tfrag))
        return overflow("the trace fragmentation");
    r->sum_blocks = r->tfrag.n_blocks;
    uint64_t bytes[4];
    if (set_bytes(r, &r->tfrag, tl, *n_trace, 1, r->tmax_len, bytes))
        return overflow("the KV bytes of the trace");
    r->twaste_paged = bytes[2];
    r->twaste_contig = bytes[3];
    r->conc = o->concurrency;
    return r->conc > 0 ? trace_concurrency(o, r, tl, *n_trace) : 0;
}

/* The weights of the whole model: --weights-mem, or the parameters x the weight dtype
 * (ceil(params x bits / 8)). Returns 0 or an exit code. */
static int weights_of(const plan_opts *o, plan_result *r)
{
    if (o->have_weights_mem) {
        r->weights_total = o->weights_mem;
        r->weights_from = "--weights-mem";
        return 0;
    }
    if (r->m.n_params == 0)
        return fail(CLI_EXIT_USAGE, "--gpu-mem needs the weight memory: give --weights-mem or "
                                    "--params (a --model preset knows its parameter count)");
    if (cap_elems_bytes(r->m.n_params, r->m.w_dtype, &r->weights_total))
        return overflow("the weight memory");
    unsigned bits = cap_dtype_bits(r->m.w_dtype);
    char per[32];
    if (bits % 8 == 0)
        snprintf(per, sizeof per, "%u byte%s", bits / 8, bits == 8 ? "" : "s");
    else
        snprintf(per, sizeof per, "%u bits", bits);
    snprintf(r->weights_from_buf, sizeof r->weights_from_buf, "%llu parameters (%s) x %s (%s)",
             (unsigned long long)r->m.n_params, o->params ? "--params" : "preset", per,
             cap_dtype_name(r->m.w_dtype));
    r->weights_from = r->weights_from_buf;
    return 0;
}

/* The message when weights, reserve and fixed KV bytes leave nothing for the KV cache. */
static int no_space(const plan_opts *o, const plan_result *r)
{
    char a[32], b[32], c[32];
    uint64_t q = o->gpu_mem / 1000000, rem = o->gpu_mem % 1000000;
    uint64_t budget = q * o->util_ppm + rem * o->util_ppm / 1000000;
    uint64_t wpg = r->weights_total / r->tp.tp + (r->weights_total % r->tp.tp != 0);
    return fail(CLI_EXIT_INPUT,
                "no memory left for the KV cache: weights %s per GPU (%s) + --reserve "
                "%s do not fit the budget of %s (--gpu-mem x --util)",
                cli_fmt_binary(wpg, a, sizeof a), r->weights_from,
                cli_fmt_binary(o->reserve, b, sizeof b), cli_fmt_binary(budget, c, sizeof c));
}

/* What fits the KV memory: requests of --seq-len, contiguous reservations, trace requests at
 * the mean and longest first. Under a linear model these are the seed's block counts. */
static void compute_fits(plan_result *r, const uint64_t *trace_lens, size_t n_trace)
{
    uint64_t kv = r->mem.kv_bytes, b, t;
    if (r->has_batch && r->uniform)
        r->fit_seq = r->seq_paged_gpu ? kv / r->seq_paged_gpu : 0;
    uint64_t ml = r->has_batch ? r->max_len : (r->has_trace ? r->tmax_len : 0);
    if (r->cost.linear)
        r->fit_contig = ml ? r->mem.n_tokens / ml : 0;
    else
        r->fit_contig = ml && !cap_seq_bytes(&r->cost, ml, &b) && b ? kv / b : 0;
    if (!r->has_trace)
        return;
    r->conc_worst_fit = cap_fit_longest_bytes(trace_lens, n_trace, &r->cost, r->block_size, kv);
    /* Mean-based: blocks / (sum_blocks / n) = blocks x n / sum_blocks, or in bytes. */
    uint64_t have = r->mem.n_blocks, need = r->sum_blocks;
    if (!r->cost.linear && sum_seq_bytes(&r->cost, trace_lens, n_trace, 1, r->block_size, &need))
        need = 0;
    if (!r->cost.linear)
        have = kv;
    if (need == 0)
        r->conc_mean_fit = 0;
    else if (!cap_mul(have, n_trace, &t))
        r->conc_mean_fit = t / need;
    else
        r->conc_mean_fit = (uint64_t)((double)have * (double)n_trace / (double)need);
}

/* The inverse plan: what one GPU has left for KV after the weights, the reserve and the
 * fixed KV bytes (scales), and how many requests fit it. Returns 0 or an exit code. */
static int compute_memory(const plan_opts *o, plan_result *r, const uint64_t *trace_lens,
                          size_t n_trace)
{
    int rc;
    r->has_mem = true;
    if ((rc = weights_of(o, r)) != 0)
        return rc;
    if (o->reserve >= o->gpu_mem)
        return fail(CLI_EXIT_INPUT,
                    "--reserve (%llu bytes) is not smaller than --gpu-mem "
                    "(%llu bytes)",
                    (unsigned long long)o->reserve, (unsigned long long)o->gpu_mem);
    if (r->blk_gpu == 0)
        return fail(CLI_EXIT_INPUT,
                    "%s keeps no KV per token (only recurrent states): there "
                    "are no blocks to plan",
                    r->model_label);
    cap_mem_in *in = &r->mem_in;
    in->gpu_mem_bytes = o->gpu_mem;
    in->util_ppm = o->util_ppm;
    in->weights_bytes = r->weights_total;
    in->reserve_bytes = o->reserve;
    in->tp = r->tp.tp;
    in->block_bytes = r->blk_gpu;
    in->block_size = o->block_size;
    in->fixed_bytes = r->cost.fixed_bytes;
    rc = cap_memory(in, &r->mem);
    if (rc == CAP_ENOSPACE)
        return no_space(o, r);
    if (rc != CAP_OK)
        return overflow("the memory plan");
    compute_fits(r, trace_lens, n_trace);
    return 0;
}

/* Compute every figure: Step 1 the per-layer KV cost and the bytes per token and block;
 * Step 2 the batch; Step 3 the trace; Step 4 the inverse plan. Returns 0 or an exit code. */
static int compute(const plan_opts *o, plan_result *r, uint64_t **trace_lens)
{
    int rc;
    size_t n_trace = 0;
    const char *what = "invalid";
    /* Step 1: */
    r->block_size = o->block_size;
    rc = cap_kv_cost_of(&r->m, r->tp.tp, &r->cost, &what);
    if (rc == CAP_OK)
        rc = cap_kv_cost_of(&r->m, 1, &r->cost_logical, &what);
    if (rc == CAP_EINVAL)
        return fail(CLI_EXIT_INPUT, "model: %s (--tp %u)", what, r->tp.tp);
    r->tok_gpu = r->cost.token_all;
    r->tok_logical = r->cost_logical.token_all;
    if (rc != CAP_OK || cap_mul(r->tok_gpu, o->block_size, &r->blk_gpu))
        return overflow("the KV bytes per block");
    /* Step 2: */
    if ((rc = compute_batch(o, r)) != 0)
        return rc;
    /* Step 3: */
    if (o->trace != NULL && (rc = compute_trace(o, r, trace_lens, &n_trace)) != 0)
        return rc;
    /* Step 4: */
    return o->have_gpu_mem ? compute_memory(o, r, *trace_lens, n_trace) : 0;
}

/* A short summary of a preset's layer runs ("52 sliding W1024 + 10 full") into buf. */
static const char *layout_summary(const cap_model_shape *m, char *buf, size_t size)
{
    size_t n = 0;
    if (m->layers.n_runs == 0)
        snprintf(buf, size, "%u full", m->n_layers);
    for (uint32_t i = 0; i < m->layers.n_runs; i++) {
        const cap_layer_run *l = &m->layers.run[i];
        int k = snprintf(buf + n, size - n, "%s%u %s", i ? " + " : "", l->n_layers,
                         cap_layer_kind_name(l->kind));
        if (k < 0 || (size_t)k >= size - n)
            break;
        n += (size_t)k;
        if (l->kind != CAP_LAYER_SLIDING)
            continue;
        k = snprintf(buf + n, size - n, " W%u", l->window);
        if (k < 0 || (size_t)k >= size - n)
            break;
        n += (size_t)k;
    }
    return buf;
}

static void list_models(void)
{
    char lay[96];
    printf("%-16s %-34s %6s %5s %4s %4s %5s %13s  %s\n", "preset", "Hugging Face repository",
           "layers", "heads", "kv", "dim", "dtype", "parameters", "KV layers");
    for (size_t i = 0; i < cap_model_count(); i++) {
        const cap_model_preset *p = cap_model_at(i);
        printf("%-16s %-34s %6u %5u %4u %4u %5s %13llu  %s\n", p->name, p->hf_repo,
               p->shape.n_layers, p->shape.n_heads, p->shape.n_kv_heads, p->shape.head_dim,
               cap_dtype_name(p->shape.kv_dtype), (unsigned long long)p->shape.n_params,
               layout_summary(&p->shape, lay, sizeof lay));
    }
    printf("\nSources (config.json on each model card; parameters computed from its shapes):\n");
    for (size_t i = 0; i < cap_model_count(); i++)
        printf("  %s: %s (context %llu tokens)\n", cap_model_at(i)->name, cap_model_at(i)->source,
               (unsigned long long)cap_model_at(i)->max_context);
    printf("\nGPU presets (--gpu; memory in binary units, as the card's name means it):\n");
    for (size_t i = 0; i < cap_gpu_count(); i++) {
        const cap_gpu_preset *g = cap_gpu_at(i);
        char a[32];
        printf("  %-14s %8s  %5.0f TFLOP/s dense BF16  %s\n", g->name,
               cli_fmt_binary(g->mem_bytes, a, sizeof a), g->bf16_flops / 1e12, g->host_link);
    }
}

/* vLLM's MLA attention backends use 64-token blocks: a model whose KV is a latent is planned
 * with them unless --block-size says otherwise. */
static bool has_latent(const cap_model_shape *m)
{
    for (uint32_t i = 0; i < m->layers.n_runs; i++)
        if (m->layers.run[i].kind == CAP_LAYER_LATENT)
            return true;
    return false;
}

/* Warnings on stderr that do not stop the plan: lengths beyond the model's context, a
 * --gpu-mem in decimal gigabytes that a card's name means in binary ones. Cannot fail. */
static void warn(const plan_opts *o, const plan_result *r)
{
    if (r->max_context && r->longest > r->max_context)
        fprintf(stderr,
                "kvprefix plan: warning: %llu tokens is beyond %s's context length (%llu "
                "tokens, max_position_embeddings): the model was not built for it\n",
                (unsigned long long)r->longest, r->model_label, (unsigned long long)r->max_context);
    const char *g = o->gpu_mem_arg;
    size_t n = g ? strlen(g) : 0;
    if (n > 2 && strcasecmp(g + n - 2, "GB") == 0 && o->gpu_mem % 1000000000u == 0) {
        uint64_t gb = o->gpu_mem / 1000000000u;
        fprintf(stderr,
                "kvprefix plan: note: --gpu-mem %s is %.1f GiB (GB = 10^9 bytes); a GPU sold "
                "as %lluGB has %llu GiB: --gpu-mem %lluGiB, or --gpu (e.g. H100-80GB)\n",
                g, (double)o->gpu_mem / 1073741824.0, (unsigned long long)gb,
                (unsigned long long)gb, (unsigned long long)gb);
    }
}

/* Before compute: 64-token blocks for an MLA model when --block-size is not given.
 * Cannot fail (returns 0). */
static int mla_blocks(plan_opts *o, plan_result *r)
{
    if (!o->block_size_given && has_latent(&r->m)) {
        o->block_size = 64;
        o->hash_cfg.block_size = 64;
        r->block_why = "64 for MLA, as vLLM's MLA backends; --block-size to change";
    }
    return 0;
}

/* The longest length the plan covers: --seq-len, the longest of --lens, the trace's. */
static uint64_t longest(const plan_opts *o, const plan_result *r)
{
    uint64_t m = o->seq_len;
    for (size_t i = 0; i < o->n_lens; i++)
        m = o->lens[i] > m ? o->lens[i] : m;
    if (r->has_trace && r->st.max > m)
        m = r->st.max;
    return m;
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
    o.max_line_bytes = LOG_DEFAULT_MAX_LINE;
    cli_hash_init(&o.hash);
    plan_result r;
    memset(&r, 0, sizeof r);
    uint64_t *trace_lens = NULL;

    int rc = parse_args(argc, argv, &o);
    if (rc == 0 && o.help) {
        fputs(usage_text, stdout);
        fputs(usage_text2, stdout);
    } else if (rc == 0 && o.list_models) {
        list_models();
    } else if (rc == 0 && (rc = build_model(&o, &r)) == 0 && (rc = mla_blocks(&o, &r)) == 0 &&
               (rc = compute(&o, &r, &trace_lens)) == 0) {
        r.longest = longest(&o, &r);
        warn(&o, &r);
        if (o.json)
            rc = pl_print_json(&r, &o);
        else
            pl_print_table(&r, &o);
    }
    if (rc == 0)
        rc = cli_stdout_check("plan");
    free(trace_lens);
    free(o.lens);
    return rc;
}
