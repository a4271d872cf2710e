/*
 * replay.c - `kvprefix replay`: replay a request log through the cache and report how much
 * prefill a prefix cache of a given size would have skipped (docs/replay.md).
 *
 * Flow: parse the options (the input flags and the --tokenizer rank file through
 * input/inopts.c, shared with fleet and tokenize); open the log (logread.c: token-id logs, Mooncake
 * hash-id traces, OpenAI-style bodies; plain, gzip or zstd; "-" for stdin); feed each request to
 * the engine (replay_sim.c), which records LRU stack distances and drives the library's pool at
 * min(--capacity, RP_POOL_MAX) blocks to check them; optionally buffer everything first and
 * sort it by timestamp; then evaluate the primary capacity, the unbounded ceiling and the
 * sweep, and write the report (replay_report.c) and the chart (svgplot.c) through
 * outfile.c, which replaces a target only when the whole run succeeded. The prompt-layout
 * diagnostics (diagnose.c) see the same requests. With --policy naming more than lru, each
 * request's touches are also kept (an rp_opt) and every other policy is replayed on them at
 * each capacity (replay_pol.c: the library's pool with that eviction policy, or MIN).
 *
 * Exit status (cli.h): 0 done, 1 bad input or failed I/O (a malformed line stops the run
 * unless --skip-invalid), 2 usage, 3 internal error (the pool and the LRU model disagreed).
 * Messages read "FILE:LINE: what is wrong" for lines of the log and "kvprefix replay: ..."
 * otherwise.
 */
#include "replay.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "escape.h"
#include "flags.h"
#include "logread.h"
#include "models.h"
#include "outfile.h"
#include "svgplot.h"

#define RP_CAP_MAX (UINT64_C(1) << 48) /* largest capacity in blocks (exact in JSON) */

static const char usage_text[] =
    "Usage: kvprefix replay [options] LOG\n"
    "\n"
    "Replay a request log through an LRU prefix cache (the library's pool) and report how\n"
    "much prefill it would have skipped: at one capacity, or a whole curve in one pass.\n"
    "LOG is JSON Lines, plain, .gz or .zst, or '-' for standard input; each line is one of\n"
    "  token-id log  {\"tokens\":[...], \"model\":..., \"adapter\":..., \"tenant\":...,\n"
    "                 \"cache_salt\":..., \"timestamp\":..., \"output_tokens\":[...]}\n"
    "  Mooncake      {\"timestamp\":ms, \"input_length\":n, \"output_length\":n,\n"
    "                 \"hash_ids\":[...]}   (one id per --trace-block-size tokens)\n"
    "  OpenAI body   /v1/completions {\"prompt\":...} or /v1/chat/completions\n"
    "                 {\"messages\":[...]}, optionally \"model\", \"user\" (the tenant);\n"
    "                 counts are approximate (a stand-in tokenizer) unless --tokenizer\n"
    "                 names the model's rank file\n"
    "\n"
    "Capacity (blocks; 20000 or 64K; 1Mtok = tokens; 40GiB = KV memory with a model):\n"
    "  --capacity C         replay at C through the pool (full report)\n"
    "  --sweep[=N]          also N capacities (default 20), log-spaced up to the distinct\n"
    "                       blocks seen, from one pass (LRU stack distances)\n"
    "  --capacities A,B,..  an explicit sweep list\n"
    "  --model NAME         model preset for byte capacities (kvprefix plan --list-models)\n"
    "  --config FILE        or a Hugging Face config.json;  --kv-dtype T  override\n"
    "\n"
    "Input:\n" IN_HELP
    "  --cache-output       token logs: cache the full blocks of output_tokens too\n"
    "  --sort               replay in timestamp order (stable) instead of file order\n"
    "  --skip-invalid       count and skip malformed lines instead of stopping\n";

/* The rest of --help (one string would exceed what ISO C requires compilers to take). */
static const char usage_text2[] =
    "\n"
    "Eviction policies:\n"
    "  --policy P,Q,..      compare policies side by side (default lru): lru, slru, s3fifo,\n"
    "                       cdecay (the library's, through its pool) and opt (the offline\n"
    "                       optimum); figures per policy at --capacity and each sweep\n"
    "                       point. lru's curve is one pass; every other policy replays the\n"
    "                       log once per capacity (time: policies x points replays);\n"
    "                       retain is LRU with the requests' retention priorities\n"
    "  --retain-prefix T:P  give every request's first T prompt tokens retention priority P\n"
    "                       (0..100, default 35) in slru, s3fifo, cdecay and retain,\n"
    "                       beside the lines' own \"retention\" fields (docs/replay.md)\n"
    "\n"
    "Hashing (figures differ between profiles only through key collisions):\n" CLI_HASH_HELP
    "  --seed N             --hash xxh3: the public 64-bit seed (default 0)\n"
    "  A vllm-* profile has no model or tenant field: a line naming one is bad input\n"
    "  (give the tenant as cache_salt); so is an id at or above --vocab-size.\n"
    "\n"
    "Output:\n"
    "  --json, --csv        machine-readable output instead of the table\n"
    "  -o, --output FILE    write the report to FILE (replaced only when the run succeeds)\n"
    "  --plot FILE.svg      hit rate against capacity (needs a sweep; replaced only when\n"
    "                       the run succeeds)\n"
    "  --diagnose           where shared prefixes break: common-prefix reach, the most\n"
    "                       frequent divergence points (a timestamp or id up front) and,\n"
    "                       for OpenAI bodies, the cause (message and role, tool order,\n"
    "                       whitespace, a timestamp at the start)\n"
    "  --top N              rows per breakdown and diagnostics list (default 10)\n"
    "  --progress, --no-progress   progress bar on stderr (default: when it is a "
    "terminal)\n" RP_TIERS_HELP "\n"
    "Examples:\n"
    "  kvprefix replay --capacity 4096 chat.jsonl\n"
    "  kvprefix replay --sweep --plot curve.svg --capacity 20000 conversation_trace.jsonl\n"
    "  kvprefix replay --capacity 40GiB --model Llama-3.1-8B requests.jsonl.zst\n"
    "  kvprefix replay --diagnose --capacity 1Mtok --format openai bodies.jsonl\n"
    "  kvprefix replay --policy lru,slru,s3fifo,opt --sweep=8 --plot p.svg chat.jsonl\n"
    "  kvprefix replay --policy lru,retain --retain-prefix 512:90 --sweep chat.jsonl\n"
    "  zcat big.jsonl.gz | kvprefix replay --capacities 1K,10K,100K --csv -\n"
    "  kvprefix replay --model Llama-3.1-70B --gpu-mem 80GiB --tp 8 \\\n"
    "      --tiers cpu=1TiB,disk=8TiB --sweep --plot tiers.svg conversation_trace.jsonl\n"
    "\n" CLI_EXIT_HELP;

/* Print "kvprefix replay: message" to stderr and return code (the exit status). */
#define fail(...) cli_fail("replay", __VA_ARGS__)

/* ---- options ------------------------------------------------------------------------------ */

enum {
    OPT_CAPACITY = 256,
    OPT_CAPACITIES,
    OPT_SWEEP,
    OPT_MODEL,
    OPT_CONFIG,
    OPT_KV_DTYPE,
    OPT_CACHE_OUTPUT,
    OPT_SORT,
    OPT_SEED,
    OPT_SKIP_INVALID,
    OPT_JSON,
    OPT_CSV,
    OPT_PLOT,
    OPT_DIAGNOSE,
    OPT_TOP,
    OPT_PROGRESS,
    OPT_NO_PROGRESS,
    OPT_POLICY,
    OPT_RETAIN_PREFIX
};

static const struct option longopts[] = {
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"capacities", required_argument, NULL, OPT_CAPACITIES},
    {"sweep", optional_argument, NULL, OPT_SWEEP},
    {"model", required_argument, NULL, OPT_MODEL},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"kv-dtype", required_argument, NULL, OPT_KV_DTYPE},
    {"cache-output", no_argument, NULL, OPT_CACHE_OUTPUT},
    {"sort", no_argument, NULL, OPT_SORT},
    {"seed", required_argument, NULL, OPT_SEED},
    {"skip-invalid", no_argument, NULL, OPT_SKIP_INVALID},
    {"json", no_argument, NULL, OPT_JSON},
    {"csv", no_argument, NULL, OPT_CSV},
    {"output", required_argument, NULL, 'o'},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"diagnose", no_argument, NULL, OPT_DIAGNOSE},
    {"top", required_argument, NULL, OPT_TOP},
    {"progress", no_argument, NULL, OPT_PROGRESS},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"retain-prefix", required_argument, NULL, OPT_RETAIN_PREFIX},
    {"help", no_argument, NULL, 'h'},
    CLI_HASH_LONGOPTS,
    IN_LONGOPTS,
    RP_TIERS_LONGOPTS,
    {NULL, 0, NULL, 0},
};

/* Apply an option that takes a number. Returns 0 or the exit status. */
static int apply_value(rp_options *o, int c, const char *flag, const char *v)
{
    uint64_t x = 0;
    int rc = 0;
    switch (c) {
    case OPT_SEED:
        if ((rc = cli_flag_uint("replay", flag, v, 0, UINT64_MAX, &o->seed)) == 0) {
            o->hash.seed = o->seed;
            o->hash.seed_given = true;
        }
        return rc;
    case OPT_TOP:
        if ((rc = cli_flag_uint("replay", flag, v, 1, 1000, &x)) == 0)
            o->top = (unsigned)x;
        return rc;
    case OPT_SWEEP:
        o->sweep = true;
        if (v && (rc = cli_flag_uint("replay", flag, v, 2, RP_MAX_CAPS, &x)) == 0)
            o->sweep_points = (unsigned)x;
        return rc;
    default:
        return 0;
    }
}

/* One --policy item (cli_flag_list): a policy name, each at most once. */
static int policy_item(void *ctx, const char *item, size_t len, size_t index)
{
    static const cli_choice choices[] = {{"lru", RP_POL_LRU},
                                         {"slru", RP_POL_SLRU},
                                         {"s3fifo", RP_POL_S3FIFO},
                                         {"cdecay", RP_POL_CDECAY},
                                         {"opt", RP_POL_OPT},
                                         {"retain", RP_POL_RETAIN},
                                         {NULL, 0}};
    rp_options *o = ctx;
    char name[64];
    int pol, rc;
    if (!cli_item_copy(item, len, name, sizeof name))
        snprintf(name, sizeof name, "%.*s...", 40, item);
    if ((rc = cli_flag_choice("replay", "--policy", name, choices, &pol)) != 0)
        return rc;
    for (size_t i = 0; i < index; i++)
        if (o->policies[i] == pol)
            return fail(CLI_EXIT_USAGE, "--policy: '%s' is given twice", name);
    o->policies[index] = pol;
    o->n_policies = index + 1;
    return 0;
}

/* Apply one option getopt_long returned. Returns 0, -1 after --help, or the exit status. */
static int apply_opt(rp_options *o, int c, const char *v)
{
    char name[40] = "";
    switch (c) {
    case 'h':
        fputs(usage_text, stdout);
        fputs(usage_text2, stdout);
        return -1;
    case 'o':
        o->output_path = v;
        break;
    case OPT_CAPACITY:
        o->capacity = v;
        break;
    case OPT_CAPACITIES:
        o->capacities = v;
        break;
    case OPT_MODEL:
        o->model = v;
        break;
    case OPT_CONFIG:
        o->config = v;
        break;
    case OPT_KV_DTYPE:
        o->kv_dtype = v;
        break;
    case OPT_PLOT:
        o->plot_path = v;
        break;
    case OPT_CACHE_OUTPUT:
        o->cache_output = true;
        break;
    case OPT_SORT:
        o->sort = true;
        break;
    case OPT_SKIP_INVALID:
        o->skip_invalid = true;
        break;
    case OPT_JSON:
        o->json = true;
        break;
    case OPT_CSV:
        o->csv = true;
        break;
    case OPT_DIAGNOSE:
        o->diagnose = true;
        break;
    case OPT_PROGRESS:
    case OPT_NO_PROGRESS:
        o->progress = c == OPT_PROGRESS;
        break;
    case OPT_POLICY:
        return cli_flag_list("replay", "--policy", v, RP_N_POLICIES, policy_item, o);
    case OPT_RETAIN_PREFIX: {
        /* TOKENS:PRIO */
        const char *colon = strchr(v, ':');
        char tok[32];
        uint64_t t, p;
        if (!colon || colon == v || (size_t)(colon - v) >= sizeof tok)
            return fail(CLI_EXIT_USAGE,
                        "--retain-prefix: '%s' is not TOKENS:PRIORITY (e.g. 512:90)", v);
        memcpy(tok, v, (size_t)(colon - v));
        tok[colon - v] = '\0';
        int rc = cli_flag_count("replay", "--retain-prefix", tok, 1, INT64_MAX, &t);
        if (rc == 0)
            rc = cli_flag_uint("replay", "--retain-prefix priority", colon + 1, 0, 100, &p);
        if (rc != 0)
            return rc;
        o->retain_tokens = t;
        o->retain_priority = (uint32_t)p;
        return 0;
    }
    default:
        if (cli_hash_is_opt(c))
            return cli_hash_apply("replay", &o->hash, c, v);
        if (in_is_opt(c))
            return in_apply("replay", &o->in, c, v);
        if (rp_tiers_is_opt(c))
            return rp_tiers_apply(&o->tiers, c, v);
        return apply_value(o, c, cli_opt_name(longopts, c, name, sizeof name), v);
    }
    return 0;
}

/* The checks between options, once all are known; fills o->hash_cfg. Returns 0 or the exit
 * status. */
static int check_args(rp_options *o)
{
    if (!o->path)
        return fail(CLI_EXIT_USAGE, "no log given");
    if (o->json && o->csv)
        return fail(CLI_EXIT_USAGE, "--json and --csv exclude each other");
    if (!o->capacity && !o->capacities && !o->sweep && !o->tiers.tiers)
        return fail(CLI_EXIT_USAGE,
                    "give --capacity C, --sweep or --capacities A,B,... (or --tiers)");
    if (rp_tiers_check(&o->tiers, o->model || o->config) != 0)
        return CLI_EXIT_USAGE;
    if (o->sweep && o->capacities)
        return fail(CLI_EXIT_USAGE, "--sweep and --capacities exclude each other");
    if (o->plot_path && !o->sweep && !o->capacities)
        return fail(CLI_EXIT_USAGE, "--plot draws a sweep: add --sweep or --capacities");
    if (o->model && o->config)
        return fail(CLI_EXIT_USAGE, "--model and --config exclude each other");
    if (in_check("replay", &o->in) != 0)
        return CLI_EXIT_USAGE;
    kvp_config_init(&o->hash_cfg);
    if (cli_hash_finish("replay", &o->hash, &o->hash_cfg) != 0)
        return CLI_EXIT_USAGE;
    const char *inputs[] = {o->path, o->config};
    return cli_out_check_pair("replay", o->output_path, o->plot_path, inputs, 2);
}

/* Parse argv. Returns 0, -1 after --help, or the exit status (message printed). */
static int parse_args(int argc, char **argv, rp_options *o)
{
    memset(o, 0, sizeof *o);
    in_init(&o->in);
    o->sweep_points = 20;
    o->progress = -1;
    o->top = 10;
    o->policies[0] = RP_POL_LRU;
    o->n_policies = 1;
    rp_tiers_init(&o->tiers);
    cli_hash_init(&o->hash);
    int c;
    cli_getopt_begin();
    while ((c = getopt_long(argc, argv, ":ho:", longopts, NULL)) != -1) {
        if (c == '?' || c == ':')
            return cli_getopt_error("replay", c, argv, longopts);
        int rc = apply_opt(o, c, optarg);
        if (rc)
            return rc;
    }
    if (optind < argc)
        o->path = argv[optind++];
    if (optind < argc)
        return fail(CLI_EXIT_USAGE, "one log at a time ('%s' and '%s')", o->path, argv[optind]);
    return check_args(o);
}

/* ---- capacities --------------------------------------------------------------------------- */

/* What one capacity value means before the block size and model are known. */
typedef struct capacity_spec {
    int unit;        /* 0 blocks, 1 tokens, 2 bytes */
    uint64_t amount; /* in that unit */
} capacity_spec;

static bool ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && strncmp(s + n - k, suffix, k) == 0;
}

/* Parse "20000", "64K" (blocks), "1Mtok"/"1M-tokens" (tokens), "40GiB" (bytes). */
static int parse_cap(const char *flag, const char *s, size_t n, capacity_spec *out)
{
    char buf[64];
    size_t given = n;
    if (n == 0 || n >= sizeof buf)
        return fail(CLI_EXIT_USAGE, "%s: '%.*s' is not a capacity", flag, (int)n, s);
    memcpy(buf, s, n);
    buf[n] = '\0';
    int rc;
    if (ends_with(buf, n, "tokens") || ends_with(buf, n, "tok")) {
        n -= ends_with(buf, n, "tokens") ? 6 : 3;
        if (n > 0 && buf[n - 1] == '-')
            n--;
        buf[n] = '\0';
        out->unit = 1;
        rc = cli_parse_count(buf, &out->amount);
    } else if (n > 0 && (buf[n - 1] == 'B' || buf[n - 1] == 'b')) {
        out->unit = 2;
        rc = cli_parse_bytes(buf, &out->amount);
    } else {
        if (ends_with(buf, n, "blocks")) {
            n -= 6;
            if (n > 0 && buf[n - 1] == '-')
                n--;
            buf[n] = '\0';
        }
        out->unit = 0;
        rc = cli_parse_count(buf, &out->amount);
    }
    if (rc != CAP_OK || out->amount == 0)
        return fail(CLI_EXIT_USAGE,
                    "%s: '%.*s' is not a positive capacity (blocks: 20000 or 64K; tokens: "
                    "1Mtok; KV memory: 40GiB with --model)",
                    flag, (int)given, s);
    return 0;
}

/* Convert a capacity to blocks of block_size tokens (block_bytes: 0 without a model). */
static int capacity_blocks(const char *flag, const capacity_spec *c, uint32_t block_size,
                           uint64_t block_bytes, uint64_t *out)
{
    uint64_t b = c->amount;
    if (c->unit == 1)
        b = c->amount / block_size;
    if (c->unit == 2) {
        if (block_bytes == 0)
            return fail(CLI_EXIT_USAGE, "%s: a capacity in bytes needs --model or --config", flag);
        b = c->amount / block_bytes;
    }
    if (b == 0)
        return fail(CLI_EXIT_INPUT, "%s: less than one block of %u tokens", flag, block_size);
    uint64_t unused;
    if (b > RP_CAP_MAX || cap_mul(b, block_size, &unused) != CAP_OK ||
        cap_mul(b, block_bytes, &unused) != CAP_OK)
        return fail(CLI_EXIT_INPUT,
                    "%s: %llu blocks is too large (at most 2^48, and the bytes must "
                    "fit 64 bits)",
                    flag, (unsigned long long)b);
    *out = b;
    return 0;
}

/* ---- the model shape for byte capacities --------------------------------------------------- */

/* The KV bytes of one token for --model/--config (and --kv-dtype) into *token_bytes, and a
 * description into desc; both left 0/"" without a model. Returns 0 or an exit code. */
static int model_bytes(const rp_options *o, uint64_t *token_bytes, char *desc, size_t desc_size)
{
    if (!o->model && !o->config) {
        if (o->kv_dtype)
            return fail(CLI_EXIT_USAGE, "--kv-dtype needs --model or --config");
        return 0;
    }
    cap_model_shape m;
    cap_model_shape_init(&m);
    const char *name = o->model;
    if (o->model) {
        const cap_model_preset *p = cap_model_find(o->model), *v[2];
        if (!p && cap_model_versions(o->model, v, 2) >= 2)
            return fail(CLI_EXIT_USAGE,
                        "--model: '%s' names versions that differ (%s, %s): give the version",
                        o->model, v[0]->name, v[1]->name);
        if (!p)
            return fail(CLI_EXIT_USAGE, "--model: no preset '%s' (kvprefix plan --list-models)",
                        o->model);
        m = p->shape;
        name = p->name;
    } else {
        char err[512];
        if (cap_model_from_config(o->config, &m, err, sizeof err) != CAP_OK)
            return fail(CLI_EXIT_INPUT, "%s", err);
        name = o->config;
    }
    if (o->kv_dtype && cap_dtype_parse(o->kv_dtype, &m.kv_dtype) != CAP_OK)
        return fail(CLI_EXIT_USAGE, "--kv-dtype: unknown dtype '%s'", o->kv_dtype);
    m.kv_quant.layout = cap_dtype_is_quantized(m.kv_dtype) ? CAP_SCALES_TENSOR : CAP_SCALES_NONE;
    const char *what = NULL;
    uint64_t tok;
    cap_kv_cost cost;
    if (cap_model_shape_check(&m, &what) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "model shape: %s", what ? what : "invalid");
    /* The planner's per-layer charge of a cached block, per token (kvplan.h): full and
     * latent layers; windowed and state layers hold per prefix end, not per block. */
    if (cap_kv_cost_of(&m, 1, &cost, &what) != CAP_OK || cap_cache_block_bytes(&cost, 1, &tok))
        return fail(CLI_EXIT_INPUT, "model shape: %s", what ? what : "no KV bytes per token");
    *token_bytes = tok;
    char safe[256];
    cli_escape_str(safe, sizeof safe, name); /* a config path shows in the table and chart */
    snprintf(desc, desc_size, "%.80s, %s KV%s", safe, cap_dtype_name(m.kv_dtype),
             cost.token_full && !cost.linear ? " in full-context layers" : "");
    return 0;
}

/* Everything the options say that can be checked before the log is read: capacities, the
 * model shape, the plot file. */
typedef struct prep {
    bool has_cap;                    /* --capacity given */
    capacity_spec cap;               /* its value */
    capacity_spec caps[RP_MAX_CAPS]; /* --capacities values */
    size_t n_caps;
    uint64_t token_bytes; /* KV bytes per token, 0 without a model */
    cli_out plot;         /* --plot: its temporary file, created before reading */
    cli_out report;       /* -o FILE or standard output */
} prep;

/* One --capacities item (cli_flag_list). */
static int capacity_item(void *ctx, const char *item, size_t len, size_t index)
{
    prep *p = ctx;
    p->n_caps = index + 1;
    return parse_cap("--capacities", item, len, &p->caps[index]);
}

static int prepare(const rp_options *o, prep *p, rp_result *r)
{
    memset(p, 0, sizeof *p);
    int rc;
    bool bytes = false;
    if (o->capacity) {
        if ((rc = parse_cap("--capacity", o->capacity, strlen(o->capacity), &p->cap)) != 0)
            return rc;
        p->has_cap = true;
        bytes = p->cap.unit == 2;
    }
    if (o->capacities) {
        if ((rc = cli_flag_list("replay", "--capacities", o->capacities, RP_MAX_CAPS, capacity_item,
                                p)) != 0)
            return rc;
        for (size_t i = 0; i < p->n_caps; i++)
            bytes |= p->caps[i].unit == 2;
    }
    if ((rc = model_bytes(o, &p->token_bytes, r->model_desc, sizeof r->model_desc)) != 0)
        return rc;
    if (bytes && p->token_bytes == 0)
        return fail(CLI_EXIT_USAGE, "a capacity in bytes needs --model or --config");
    /* Created now so that a path that cannot be written stops the run before the log is
     * read; nothing replaces a target before write_outputs succeeds. */
    if (o->plot_path && (rc = cli_out_open("replay", &p->plot, o->plot_path)) != 0)
        return rc;
    rc = cli_out_open("replay", &p->report, o->output_path ? o->output_path : "-");
    if (rc != 0)
        cli_out_abort(&p->plot);
    return rc;
}

/* ---- progress ----------------------------------------------------------------------------- */

typedef struct progress {
    bool on;        /* drawing */
    uint64_t total; /* input bytes when known (a regular file), else 0 */
    double start;   /* when the run began */
    double last;    /* when the bar was last drawn */
} progress;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress_draw(progress *p, uint64_t n_req, uint64_t pos, bool final)
{
    double t = now_s();
    if (!p->on || (!final && t - p->last < 0.1))
        return;
    p->last = t;
    double rate = (double)n_req / (t - p->start > 1e-9 ? t - p->start : 1e-9);
    if (p->total > 0) {
        double f = (double)pos / (double)p->total;
        f = f > 1.0 ? 1.0 : f;
        int w = (int)(f * 30.0);
        fprintf(stderr, "\r[%.*s%*s] %3.0f%%  %llu requests  %.0f/s ", w,
                "##############################", 30 - w, "", f * 100.0, (unsigned long long)n_req,
                rate);
    } else {
        fprintf(stderr, "\r%llu requests  %.0f/s ", (unsigned long long)n_req, rate);
    }
    if (final)
        fputs("\r\033[K", stderr);
}

/* ---- reading and replaying ----------------------------------------------------------------- */

/* One buffered request (for --sort): owned copies of what the engine and diagnostics use. */
typedef struct held {
    uint64_t line_no;
    double timestamp;
    size_t seq;
    char *strs[4];
    size_t lens[4];
    bool present[4];
    uint32_t *tokens; /* prompt then output tokens */
    size_t n_tokens, n_output;
    uint64_t *ids;
    size_t n_ids;
    uint64_t input_length;
    char *text;
    size_t text_len;
    uint32_t *offsets;
    tpl_seg *segs; /* the text's template segments, or NULL */
    size_t n_segs;
    bool has_ret;          /* the line's "retention" field (logread.h) */
    uint32_t ret_prio;     /* its priority */
    uint64_t ret_dur;      /* its duration */
    log_range *ret_ranges; /* its ranges, or NULL */
    size_t n_ret_ranges;
} held;

typedef struct run {
    const rp_options *o;
    const prep *prep;
    rp_result *res;
    rp_sim *sim;
    rp_opt *log;       /* --policy beyond lru: every request's touches, else NULL */
    rp_retain *retain; /* with log: every request's retention (replay_pol.h), else NULL */
    log_reader *reader;
    uint32_t *joined; /* prompt + output tokens, for --cache-output */
    size_t joined_cap;
    uint32_t *folded; /* hash ids folded to 32 bits, for the diagnostics */
    size_t folded_cap;
    held *held;
    size_t n_held, held_cap;
} run;

static kvp_field field_of(const char *p, size_t len)
{
    kvp_field f = {p, p ? len : 0};
    return f;
}

/* Report an engine error for line line_no: returns 0 to go on (skipped), or an exit code. */
static int line_error(run *ru, uint64_t line_no, int rc, const char *msg)
{
    const char *name = strcmp(ru->o->path, "-") == 0 ? "<stdin>" : ru->o->path;
    if (rc == RP_EINPUT && ru->o->skip_invalid) {
        if (ru->res->n_skipped++ == 0)
            snprintf(ru->res->first_skip, sizeof ru->res->first_skip, "%s:%llu: %s", name,
                     (unsigned long long)line_no, msg);
        return 0;
    }
    fprintf(stderr, "%s:%llu: %s\n", name, (unsigned long long)line_no, msg);
    return rc == RP_EINPUT ? CLI_EXIT_INPUT : rc == RP_ENOMEM ? CLI_EXIT_INPUT : CLI_EXIT_INTERNAL;
}

/* Request h's retention for the library's policies: the line's, plus --retain-prefix.
 * *has false: none. Returns 0, or RP_EINPUT with the message in msg (a range past the
 * prompt, too many ranges). */
static int retention_of(const run *ru, const held *h, kvp_retention *r, kvp_retention_range *buf,
                        bool *has, char *msg, size_t msg_size)
{
    uint64_t n_prompt = h->ids ? h->input_length : h->n_tokens;
    kvp_retention_init(r);
    *has = h->has_ret || ru->o->retain_tokens > 0;
    if (!*has)
        return 0;
    size_t n = 0;
    if (h->has_ret) {
        r->priority = h->ret_prio;
        r->duration = h->ret_dur;
        for (size_t i = 0; i < h->n_ret_ranges; i++) {
            const log_range *g = &h->ret_ranges[i];
            if (g->end > n_prompt) {
                cli_errf(msg, msg_size,
                         "retention.ranges[%zu] ends at token %llu, past the prompt's %llu tokens",
                         i, (unsigned long long)g->end, (unsigned long long)n_prompt);
                return RP_EINPUT;
            }
            buf[n++] = (kvp_retention_range){g->start, g->end, g->priority, g->duration};
        }
    }
    if (ru->o->retain_tokens > 0 && n_prompt > 0) {
        if (n == KVP_RETENTION_MAX_RANGES) {
            cli_errf(msg, msg_size,
                     "retention.ranges has %u ranges: with --retain-prefix, more than %u",
                     KVP_RETENTION_MAX_RANGES, KVP_RETENTION_MAX_RANGES);
            return RP_EINPUT;
        }
        uint64_t end = ru->o->retain_tokens < n_prompt ? ru->o->retain_tokens : n_prompt;
        buf[n++] = (kvp_retention_range){0, end, ru->o->retain_priority, 0};
    }
    r->ranges = n ? buf : NULL;
    r->n_ranges = n;
    return 0;
}

/* Replay one request (from a record or from the --sort buffer). */
static int replay_one(run *ru, const held *h)
{
    rp_request q;
    memset(&q, 0, sizeof q);
    q.ns.model = h->present[0] ? field_of(h->strs[0], h->lens[0]) : field_of(NULL, 0);
    q.ns.adapter = h->present[1] ? field_of(h->strs[1], h->lens[1]) : field_of(NULL, 0);
    q.ns.tenant = h->present[2] ? field_of(h->strs[2], h->lens[2]) : field_of(NULL, 0);
    q.ns.salt = h->present[3] ? field_of(h->strs[3], h->lens[3]) : field_of(NULL, 0);
    q.line_no = h->line_no;
    if (h->ids) {
        q.hash_ids = h->ids;
        q.n_hash_ids = h->n_ids;
        q.input_length = h->input_length;
    } else {
        q.tokens = h->tokens;
        q.n_tokens = h->n_tokens;
        q.n_output_tokens = ru->o->cache_output ? h->n_output : 0;
    }
    char msg[512];
    kvp_retention kr;
    kvp_retention_range kr_buf[KVP_RETENTION_MAX_RANGES];
    bool has_kr = false;
    int rc = ru->log ? retention_of(ru, h, &kr, kr_buf, &has_kr, msg, sizeof msg) : 0;
    if (rc != 0)
        return line_error(ru, h->line_no, rc, msg);
    double t0 = now_s();
    rc = rp_sim_add(ru->sim, &q, msg, sizeof msg);
    ru->res->seconds_engine += now_s() - t0;
    if (rc != RP_OK)
        return line_error(ru, h->line_no, rc, msg);
    /* --policy: the request's touches for the other policies (replay_pol.h). */
    if (ru->log) {
        const size_t *blocks;
        size_t n = rp_sim_last_blocks(ru->sim, &blocks);
        uint64_t n_prompt = h->ids ? h->input_length : h->n_tokens;
        if (rp_opt_add(ru->log, n_prompt, (uint32_t)(n_prompt / ru->res->block_size), blocks, n) ||
            rp_retain_add(ru->retain, has_kr ? &kr : NULL))
            return fail(CLI_EXIT_INPUT, "out of memory");
    }
    ru->res->n_replayed++;
    ru->res->n_output_cached += q.n_output_tokens > 0;
    if (ru->res->diag) {
        kvp_key root;
        if (kvp_namespace_key(ru->o->seed, &q.ns, &root) != KVP_OK)
            return fail(CLI_EXIT_INTERNAL, "namespace key failed");
        const uint32_t *sym = h->tokens;
        size_t n = h->n_tokens;
        if (h->ids) {
            if (!cli_grow((void **)&ru->folded, &ru->folded_cap, h->n_ids, sizeof *ru->folded))
                return fail(CLI_EXIT_INPUT, "out of memory");
            /* Only the ids of full blocks: a partial last block is never cached. */
            n = h->input_length / ru->res->block_size;
            n = n < h->n_ids ? n : h->n_ids;
            for (size_t i = 0; i < n; i++)
                ru->folded[i] = (uint32_t)(h->ids[i] ^ (h->ids[i] >> 32));
            sym = ru->folded;
        }
        if (rp_diag_add(ru->res->diag, root, sym, n, h->text, h->text_len, h->offsets, h->segs,
                        h->n_segs, h->line_no) != 0)
            return fail(CLI_EXIT_INPUT, "out of memory");
    }
    return 0;
}

/* The record's retention field into h (pointers stay the reader's). */
static void view_retention(const log_record *rec, held *h)
{
    h->has_ret = rec->has_retention;
    h->ret_prio = rec->retention_priority;
    h->ret_dur = rec->retention_duration;
    h->ret_ranges = (log_range *)rec->retention_ranges;
    h->n_ret_ranges = rec->n_retention_ranges;
}

/* View a record as a held request without copying (pointers stay the reader's). */
static int view_record(run *ru, const log_record *rec, held *h)
{
    memset(h, 0, sizeof *h);
    h->line_no = rec->line_no;
    h->timestamp = rec->timestamp;
    view_retention(rec, h);
    const char *s[4] = {rec->model, rec->adapter, rec->tenant, rec->cache_salt};
    size_t l[4] = {rec->model_len, rec->adapter_len, rec->tenant_len, rec->cache_salt_len};
    for (int i = 0; i < 4; i++) {
        h->strs[i] = (char *)s[i];
        h->lens[i] = l[i];
        h->present[i] = s[i] != NULL;
    }
    if (rec->format == LOG_MOONCAKE) {
        h->ids = (uint64_t *)rec->hash_ids;
        h->n_ids = rec->n_hash_ids;
        h->input_length = rec->input_length;
        return 0;
    }
    h->n_tokens = rec->n_tokens;
    h->tokens = (uint32_t *)rec->tokens;
    if (ru->o->cache_output && rec->n_output_tokens > 0) {
        size_t n = rec->n_tokens + rec->n_output_tokens;
        if (!cli_grow((void **)&ru->joined, &ru->joined_cap, n, sizeof *ru->joined))
            return fail(CLI_EXIT_INPUT, "out of memory");
        memcpy(ru->joined, rec->tokens, rec->n_tokens * sizeof *ru->joined);
        memcpy(ru->joined + rec->n_tokens, rec->output_tokens,
               rec->n_output_tokens * sizeof *ru->joined);
        h->tokens = ru->joined;
        h->n_output = rec->n_output_tokens;
    }
    h->text = (char *)rec->text;
    h->text_len = rec->text_len;
    h->offsets = (uint32_t *)rec->token_offsets;
    h->segs = (tpl_seg *)rec->segs;
    h->n_segs = rec->n_segs;
    return 0;
}

static void *dup_bytes(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

static void held_free(held *h)
{
    for (int i = 0; i < 4; i++)
        free(h->strs[i]);
    free(h->tokens);
    free(h->ids);
    free(h->text);
    free(h->offsets);
    free(h->segs);
    free(h->ret_ranges);
}

/* Keep an owned copy of a record's view for --sort. */
static int hold(run *ru, const held *v)
{
    if (!cli_grow((void **)&ru->held, &ru->held_cap, ru->n_held + 1, sizeof *ru->held))
        return fail(CLI_EXIT_INPUT, "out of memory");
    held *h = &ru->held[ru->n_held];
    *h = *v;
    h->seq = ru->n_held;
    bool ok = true;
    for (int i = 0; i < 4; i++) {
        h->strs[i] = v->present[i] ? dup_bytes(v->strs[i], v->lens[i] + 1) : NULL;
        ok &= !v->present[i] || h->strs[i] != NULL;
    }
    h->tokens = v->tokens ? dup_bytes(v->tokens, (v->n_tokens + v->n_output) * 4) : NULL;
    h->ids = v->ids ? dup_bytes(v->ids, v->n_ids * 8) : NULL;
    h->text = v->text ? dup_bytes(v->text, v->text_len + 1) : NULL;
    h->offsets = v->offsets ? dup_bytes(v->offsets, v->n_tokens * 4) : NULL;
    h->segs = v->segs ? dup_bytes(v->segs, v->n_segs * sizeof *v->segs) : NULL;
    h->ret_ranges =
        v->ret_ranges ? dup_bytes(v->ret_ranges, v->n_ret_ranges * sizeof *v->ret_ranges) : NULL;
    ok &= (!v->tokens || h->tokens) && (!v->ids || h->ids) && (!v->text || h->text) &&
          (!v->offsets || h->offsets) && (!v->segs || h->segs) && (!v->ret_ranges || h->ret_ranges);
    if (!ok) {
        held_free(h);
        return fail(CLI_EXIT_INPUT, "out of memory");
    }
    ru->n_held++;
    return 0;
}

static int cmp_held(const void *a, const void *b)
{
    const held *x = a, *y = b;
    if (x->timestamp != y->timestamp)
        return x->timestamp < y->timestamp ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Create the engine once the first record has fixed the format and the block size: the
 * --capacity in blocks, the pool that cross-checks the model, the diagnostics. The pool
 * holds min(capacity, RP_POOL_MAX) blocks, so a huge --capacity allocates nothing more: the
 * figures at the capacity come from the LRU model either way (exact under the inclusion
 * property), and the pool checks the model at its own size on every request. When the log
 * has at most RP_POOL_MAX distinct blocks, no capacity above that evicts anything, and a
 * pool of RP_POOL_MAX blocks behaves exactly as one of the capacity. Returns 0 or the exit
 * status. */
static int start_engine(run *ru)
{
    const rp_options *o = ru->o;
    rp_result *res = ru->res;
    rp_sim_config sc = {res->block_size, o->seed, 0, &o->hash_cfg};
    char err[256];
    uint64_t blocks = 0;
    int rc;
    if (cap_mul(ru->prep->token_bytes, res->block_size, &res->block_bytes) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "the KV bytes of one block overflow");
    if (ru->prep->has_cap) {
        if ((rc = capacity_blocks("--capacity", &ru->prep->cap, res->block_size, res->block_bytes,
                                  &blocks)) != 0)
            return rc;
        sc.pool_blocks = (uint32_t)(blocks < RP_POOL_MAX ? blocks : RP_POOL_MAX);
        res->pool_blocks = sc.pool_blocks;
        res->has_primary = true;
        res->primary.capacity = blocks;
    }
    ru->sim = rp_sim_new(&sc, err, sizeof err);
    if (!ru->sim)
        return fail(CLI_EXIT_INPUT, "%s", err);
    if (rp_policies_shown(o) &&
        (!(ru->log = rp_opt_new(res->block_size)) || !(ru->retain = rp_retain_new())))
        return fail(CLI_EXIT_INPUT, "out of memory");
    if (o->diagnose) {
        uint32_t unit = res->format == LOG_MOONCAKE ? res->block_size : 1;
        uint32_t dbs = res->format == LOG_MOONCAKE ? 1 : res->block_size;
        res->diag = rp_diag_new(dbs, unit);
        if (!res->diag)
            return fail(CLI_EXIT_INPUT, "out of memory");
    }
    return 0;
}

/* Print the reader's error to stderr with control characters escaped (it quotes input,
 * which may hold escape sequences), and return CLI_EXIT_INPUT. */
static int print_log_error(const log_reader *r)
{
    const char *e = log_error(r);
    cli_put_escaped(stderr, e, strlen(e));
    fputc('\n', stderr);
    return CLI_EXIT_INPUT;
}

/* Read the whole log, replaying as it goes (or holding for --sort). */
static int read_log(run *ru, progress *pg)
{
    const rp_options *o = ru->o;
    rp_result *res = ru->res;
    log_record rec;
    int rc;
    while ((rc = log_next(ru->reader, &rec)) != LOG_END) {
        if (rc == LOG_EINPUT) {
            if (!o->skip_invalid)
                return print_log_error(ru->reader);
            if (res->n_skipped++ == 0) {
                const char *e = log_error(ru->reader);
                cli_quote_prefix(res->first_skip, sizeof res->first_skip, e, strlen(e),
                                 sizeof res->first_skip - 4);
            }
            continue;
        }
        if (rc < 0)
            return print_log_error(ru->reader);
        char msg[160];
        if (res->format == 0) {
            res->format = rec.format;
            res->block_size = in_block_size(&o->in, rec.format);
        } else if (in_format_clash(res->format, rec.format, msg, sizeof msg)) {
            if ((rc = line_error(ru, rec.line_no, RP_EINPUT, msg)) != 0)
                return rc;
            continue;
        }
        in_note(&o->in, rec.format, &res->count);
        if (!ru->sim && (rc = start_engine(ru)) != 0)
            return rc;
        held v;
        if ((rc = view_record(ru, &rec, &v)) != 0)
            return rc;
        if (o->sort && !rec.has_timestamp) {
            if ((rc = line_error(ru, rec.line_no, RP_EINPUT, "--sort needs a timestamp")) != 0)
                return rc;
            continue;
        }
        rc = o->sort ? hold(ru, &v) : replay_one(ru, &v);
        if (rc)
            return rc;
        progress_draw(pg, log_n_records(ru->reader), log_bytes_in(ru->reader), false);
    }
    if (o->sort && ru->n_held > 0) {
        qsort(ru->held, ru->n_held, sizeof *ru->held, cmp_held);
        for (size_t i = 0; i < ru->n_held; i++)
            if ((rc = replay_one(ru, &ru->held[i])) != 0)
                return rc;
    }
    return 0;
}

/* ---- evaluation -------------------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The sweep's capacities in blocks: the --capacities list, or log-spaced points. */
static int sweep_caps(const rp_options *o, const prep *pp, rp_result *r, uint64_t *caps,
                      size_t *n_caps)
{
    size_t n = 0;
    if (o->capacities) {
        for (; n < pp->n_caps; n++) {
            int rc = capacity_blocks("--capacities", &pp->caps[n], r->block_size, r->block_bytes,
                                     &caps[n]);
            if (rc)
                return rc;
        }
    } else {
        /* Log-spaced from a thousandth of the distinct blocks (at least 1) to all of them,
         * where the curve meets the cold-miss ceiling. */
        uint64_t hi = r->distinct ? r->distinct : 1;
        uint64_t lo = hi / 1000 ? hi / 1000 : 1;
        unsigned k = o->sweep_points;
        for (unsigned i = 0; i < k; i++) {
            double f = k > 1 ? (double)i / (double)(k - 1) : 1.0;
            caps[n++] =
                (uint64_t)llround(exp(log((double)lo) + f * (log((double)hi) - log((double)lo))));
        }
    }
    qsort(caps, n, sizeof *caps, cmp_u64);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || caps[i] != caps[m - 1])
            caps[m++] = caps[i];
    *n_caps = m;
    return 0;
}

/* LRU's figures of metrics m as a policy's. */
static rp_pol_figs lru_figs(const rp_metrics *m)
{
    rp_pol_figs f = {m->capacity,     m->n_hit_tokens, m->n_blocks_cached,
                     m->n_blocks_hit, m->n_evicted,    UINT64_MAX};
    return f;
}

/* --policy: every policy's figures at the primary capacity and each sweep point, lru's from
 * the engine (its orphans, at the primary capacity only, from one replay through the
 * library's LRU pool), the others replayed (replay_pol.c) with the requests' retention ret
 * (NULL: none). Returns 0 or the exit status. */
static int evaluate_policies(const rp_options *o, rp_opt *log, const rp_retain *ret, rp_result *r)
{
    char err[256];
    for (size_t k = 0; k < o->n_policies; k++) {
        int pol = o->policies[k];
        for (size_t i = 0; i <= r->n_curve; i++) {
            bool primary = i == r->n_curve;
            if (primary && !r->has_primary)
                continue;
            const rp_metrics *m = primary ? &r->primary : &r->curve[i];
            rp_pol_figs *f = primary ? &r->pol_primary[k] : &r->pol_curve[i][k];
            rp_pol_figs lf;
            if (pol == RP_POL_LRU) {
                *f = lru_figs(m);
                if (primary &&
                    rp_pol_eval(log, r->block_size, pol, m->capacity, &lf, err, sizeof err) != 0)
                    return fail(CLI_EXIT_INPUT, "%s", err);
                if (primary)
                    f->n_orphaned = lf.n_orphaned;
            } else if (rp_pol_eval_retained(log, ret, r->block_size, pol, m->capacity, f, err,
                                            sizeof err) != 0)
                return fail(CLI_EXIT_INPUT, "%s", err);
        }
    }
    return 0;
}

static int evaluate(const rp_options *o, const prep *pp, rp_opt *log, const rp_retain *ret,
                    rp_result *r)
{
    r->distinct = rp_sim_distinct(r->sim);
    for (int d = 0; d < RP_N_DIMS; d++) {
        size_t n = rp_sim_n_groups(r->sim, d);
        r->groups[d] = calloc(n ? n : 1, sizeof *r->groups[d]);
        r->groups_ceil[d] = calloc(n ? n : 1, sizeof *r->groups_ceil[d]);
        if (!r->groups[d] || !r->groups_ceil[d])
            return fail(CLI_EXIT_INPUT, "out of memory");
    }
    if (rp_sim_eval(r->sim, RP_CAP_INF, &r->ceiling, r->groups_ceil) != RP_OK)
        return fail(CLI_EXIT_INPUT, "out of memory");
    if (r->has_primary) {
        if (rp_sim_eval(r->sim, r->primary.capacity, &r->primary, r->groups) != RP_OK)
            return fail(CLI_EXIT_INPUT, "out of memory");
    } else {
        for (int d = 0; d < RP_N_DIMS; d++)
            memcpy(r->groups[d], r->groups_ceil[d],
                   rp_sim_n_groups(r->sim, d) * sizeof *r->groups[d]);
    }
    if (o->sweep || o->capacities) {
        uint64_t caps[RP_MAX_CAPS];
        int rc = sweep_caps(o, pp, r, caps, &r->n_curve);
        if (rc)
            return rc;
        for (size_t i = 0; i < r->n_curve; i++)
            if (rp_sim_eval(r->sim, caps[i], &r->curve[i], NULL) != RP_OK)
                return fail(CLI_EXIT_INPUT, "out of memory");
        double ceil = r->ceiling.n_prompt_tokens
                          ? (double)r->ceiling.n_hit_tokens / (double)r->ceiling.n_prompt_tokens
                          : 0.0;
        if (rp_knee(r->sim, ceil, &r->knee_blocks) != RP_OK)
            return fail(CLI_EXIT_INPUT, "out of memory");
    }
    if (o->tiers.tiers) {
        int rc =
            rp_tiers_evaluate(&o->tiers, o->model, o->config, o->kv_dtype, r->sim, r->block_size,
                              &r->ceiling, o->sweep ? o->sweep_points : 0, &r->tiers);
        if (rc)
            return rc;
    }
    return log ? evaluate_policies(o, log, ret, r) : 0;
}

static int plot(const rp_options *o, FILE *f, const rp_result *r)
{
    if (r->tiers) {
        char err[256];
        if (rp_tiers_plot(f, r->tiers, r->input, err, sizeof err) != 0)
            return fail(CLI_EXIT_INPUT, "%s: %s", o->plot_path, err);
        return 0;
    }
    double x[RP_MAX_CAPS], yt[RP_MAX_CAPS], yb[RP_MAX_CAPS], yp[RP_N_POLICIES][RP_MAX_CAPS];
    /* With a model the axis is KV memory (GiB), the unit a buyer reads; else blocks. */
    double unit = r->block_bytes ? (double)r->block_bytes / 1073741824.0 : 1.0;
    for (size_t i = 0; i < r->n_curve; i++) {
        const rp_metrics *m = &r->curve[i];
        x[i] = (double)m->capacity * unit;
        yt[i] = m->n_prompt_tokens ? (double)m->n_hit_tokens / (double)m->n_prompt_tokens : 0;
        yb[i] = m->n_blocks_full ? (double)m->n_blocks_cached / (double)m->n_blocks_full : 0;
        for (size_t k = 0; k < o->n_policies; k++)
            yp[k][i] = m->n_prompt_tokens
                           ? (double)r->pol_curve[i][k].n_hit_tokens / (double)m->n_prompt_tokens
                           : 0;
    }
    const char *base = strrchr(r->input, '/') ? strrchr(r->input, '/') + 1 : r->input;
    char title[256], xlabel[128], ceil_label[128], note[256], mlabel[64];
    snprintf(title, sizeof title, "%s: LRU prefix-cache hit rate against capacity", base);
    if (r->block_bytes)
        snprintf(xlabel, sizeof xlabel, "cache capacity (GiB of KV, log scale)");
    else
        snprintf(xlabel, sizeof xlabel, "cache capacity (blocks of %u tokens, log scale)",
                 r->block_size);
    double ceil = r->ceiling.n_prompt_tokens
                      ? (double)r->ceiling.n_hit_tokens / (double)r->ceiling.n_prompt_tokens
                      : 0.0;
    snprintf(ceil_label, sizeof ceil_label, "cold-miss ceiling %.1f%% (unbounded cache)",
             ceil * 100.0);
    note[0] = '\0';
    if (r->block_bytes) {
        char b[32];
        snprintf(note, sizeof note, "1 block = %u tokens = %s of KV (%s)", r->block_size,
                 cli_fmt_binary(r->block_bytes, b, sizeof b), r->model_desc);
    }
    svg_series series[RP_N_POLICIES > 2 ? RP_N_POLICIES : 2] = {
        {"token hit rate (prefill skipped)", yt}, {"block hit rate", yb}};
    size_t n_series = 2;
    char names[RP_N_POLICIES][64];
    if (rp_policies_shown(o)) {
        /* One token-hit-rate curve per policy, in the order given. */
        snprintf(title, sizeof title, "%s: token hit rate against capacity, per eviction policy",
                 base);
        for (size_t k = 0; k < o->n_policies; k++) {
            int pol = o->policies[k];
            snprintf(names[k], sizeof names[k], "%s%s", rp_pol_name(pol),
                     pol == RP_POL_OPT ? " (offline optimum)" : "");
            series[k] = (svg_series){names[k], yp[k]};
        }
        n_series = o->n_policies;
    }
    svg_plot p;
    memset(&p, 0, sizeof p);
    p.title = title;
    p.x_label = xlabel;
    p.y_label = "hit rate (%)";
    p.x = x;
    p.n = r->n_curve;
    p.series = series;
    p.n_series = n_series;
    p.ceiling = ceil;
    p.ceiling_label = ceil_label;
    p.x_secondary = note[0] ? note : NULL;
    p.marker_x = r->has_primary ? (double)r->primary.capacity * unit : 0.0;
    snprintf(mlabel, sizeof mlabel, "--capacity %llu",
             (unsigned long long)(r->has_primary ? r->primary.capacity : 0));
    p.marker_label = mlabel;
    char err[256];
    int rc = svg_write(f, &p, err, sizeof err);
    if (rc != 0)
        return fail(CLI_EXIT_INPUT, "%s: %s", o->plot_path, err);
    return 0;
}

/* Open the log and replay it into ru and res: read, finish, evaluate. Returns 0 or the exit
 * status (message printed). */
static int replay_log(rp_options *o, const prep *pp, run *ru, rp_result *res)
{
    log_options lo;
    log_options_init(&lo);
    char err[512];
    int rc = in_load("replay", &o->in);
    if (rc != 0)
        return rc;
    in_log_options(&o->in, &lo);
    lo.no_segments = !o->diagnose; /* only the diagnostics read a chat template's segments */
    rc = log_open(o->path, &lo, &ru->reader, err, sizeof err);
    if (rc != 0)
        return fail(CLI_EXIT_INPUT, "%s%s", err,
                    rc == LOG_ENOMEM && !strstr(err, "out of memory") ? " (out of memory)" : "");

    progress pg = {false, 0, now_s(), 0.0};
    pg.on = o->progress == 1 || (o->progress < 0 && isatty(STDERR_FILENO));
    struct stat st;
    if (strcmp(o->path, "-") != 0 && stat(o->path, &st) == 0 && S_ISREG(st.st_mode))
        pg.total = (uint64_t)st.st_size;

    double t0 = now_s();
    rc = read_log(ru, &pg);
    progress_draw(&pg, log_n_records(ru->reader), pg.total, true);
    res->n_lines = log_n_lines(ru->reader);
    if (rc == 0 && res->n_replayed == 0)
        rc = fail(CLI_EXIT_INPUT, "%s: no requests%s", cli_input_name(o->path),
                  res->n_skipped ? " (every line was skipped)" : "");
    int frc;
    if (rc == 0 && (frc = rp_sim_finish(ru->sim, err, sizeof err)) != RP_OK)
        rc = fail(frc == RP_ENOMEM ? CLI_EXIT_INPUT : CLI_EXIT_INTERNAL, "%s", err);
    if (rc == 0) {
        res->sim = ru->sim;
        double t1 = now_s();
        rc = evaluate(o, pp, ru->log, ru->retain, res);
        res->seconds_engine += now_s() - t1;
        res->seconds = now_s() - t0;
    }
    return rc;
}

/* Write the chart and the report into their outputs and rename them into place; on any
 * failure both are abandoned (their targets untouched). Returns 0 or the exit status. */
static int write_outputs(const rp_options *o, prep *pp, const rp_result *res)
{
    int rc = 0;
    if (pp->plot.f)
        rc = plot(o, pp->plot.f, res);
    if (rc == 0 && rp_report(pp->report.f, o, res) != 0 && pp->report.f != stdout)
        rc = fail(CLI_EXIT_INPUT, "%s: cannot write the report", o->output_path);
    /* The report first: a chart is only replaced when the report could be written too. */
    if (rc == 0)
        rc = cli_out_commit("replay", &pp->report);
    if (rc == 0 && pp->plot.f)
        rc = cli_out_commit("replay", &pp->plot);
    cli_out_abort(&pp->plot);
    cli_out_abort(&pp->report);
    return rc;
}

static void run_free(run *ru, rp_result *res)
{
    for (size_t i = 0; i < ru->n_held; i++)
        held_free(&ru->held[i]);
    free(ru->held);
    free(ru->joined);
    free(ru->folded);
    for (int d = 0; d < RP_N_DIMS; d++) {
        free(res->groups[d]);
        free(res->groups_ceil[d]);
    }
    rp_diag_free(res->diag);
    rp_tiers_free(res->tiers);
    rp_sim_free(ru->sim);
    rp_opt_free(ru->log);
    rp_retain_free(ru->retain);
    log_close(ru->reader);
}

int rp_main(int argc, char **argv)
{
    rp_options o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc < 0 ? cli_stdout_check("replay") : rc;
    rp_result res;
    memset(&res, 0, sizeof res);
    res.input = cli_input_name(o.path);
    prep pp;
    if ((rc = prepare(&o, &pp, &res)) != 0)
        return rc;
    run ru;
    memset(&ru, 0, sizeof ru);
    ru.o = &o;
    ru.prep = &pp;
    ru.res = &res;
    rc = replay_log(&o, &pp, &ru, &res);
    if (rc == 0)
        rc = write_outputs(&o, &pp, &res);
    cli_out_abort(&pp.plot);
    cli_out_abort(&pp.report);
    run_free(&ru, &res);
    in_free(&o.in);
    return rc;
}
