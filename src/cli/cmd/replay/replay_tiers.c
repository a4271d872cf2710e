/*
 * replay_tiers.c - `kvprefix replay --tiers`: sizes the tiers, evaluates them on the engine's
 * records through rp_sim_scan and the time model (replay_time.c), and reports them.
 *
 * Steps of rp_tiers_evaluate:
 *   1. the model's bytes per block on the replica (tp ranks) and the GPU tier's size: gpu=,
 *      or what --gpu-mem (or --gpu's memory) x --util leaves after the weights on --tp GPUs,
 *      as `kvprefix plan` computes it (capacity/kvplan.c, cap_memory);
 *   2. the lower tiers' sizes in blocks, checked to grow down the list (inclusive tiers);
 *   3. the time model: the prefill rate (--prefill-rate, or the model's FLOPs per token on
 *      --tp GPUs of --gpu at --mfu), each lower tier's bandwidth and latency;
 *   4. the ladder (GPU only, GPU + cpu, ...), one rp_sim_scan each;
 *   5. the knee: the least capacity of the last tier within one point of the cold-miss
 *      ceiling, by bisection over rp_sim_eval (the hit rate only depends on the largest
 *      tier's capacity, and never decreases with it);
 *   6. with --sweep, the last tier's capacity swept from the tier above it to the log's
 *      distinct blocks (or the given size when larger), log-spaced.
 *
 * Cost: each configuration is one pass over the records (a few bytes per block run) plus a
 * sort of one double per request for the TTFT percentiles.
 */
#include "replay_tiers.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "flags.h"
#include "gpus.h"
#include "kvplan.h"
#include "models.h"
#include "svgplot.h"

#define fail(...) cli_fail("replay", __VA_ARGS__)

enum { TIER_GPU = 0, TIER_CPU = 1, TIER_DISK = 2, TIER_REMOTE = 3 };

static const char *const tier_names[RP_MAX_TIERS] = {"gpu", "cpu", "disk", "remote"};
/* Defaults of the lower tiers: bandwidth (cpu: per GPU, from --gpu's host link) and latency. */
static const double default_bw[RP_MAX_TIERS] = {0.0, 0.0, 20e9, 25e9};
static const double default_latency[RP_MAX_TIERS] = {0.0, 10e-6, 100e-6, 500e-6};

const char *rp_tier_name(int k)
{
    return k >= 0 && k < RP_MAX_TIERS ? tier_names[k] : "?";
}

void rp_tiers_init(rp_tier_opts *t)
{
    memset(t, 0, sizeof *t);
    t->tp = 1;
    t->util_ppm = 900000;
    t->mfu_ppm = 500000;
}

bool rp_tiers_is_opt(int c)
{
    return c >= RP_OPT_TIERS && c <= RP_OPT_TIER_LATENCY;
}

int rp_tiers_apply(rp_tier_opts *t, int c, const char *v)
{
    uint64_t x;
    int rc;
    switch (c) {
    case RP_OPT_TIERS:
        t->tiers = v;
        return 0;
    case RP_OPT_GPU:
        if (!cap_gpu_find(v)) {
            char list[256] = "";
            for (size_t i = 0; i < cap_gpu_count(); i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         cap_gpu_at(i)->name);
            return fail(CLI_EXIT_USAGE, "--gpu: no preset '%s' (%s)", v, list);
        }
        t->gpu = v;
        return 0;
    case RP_OPT_GPU_MEM:
        return cli_flag_bytes("replay", "--gpu-mem", v, 1, UINT64_MAX, &t->gpu_mem);
    case RP_OPT_TP:
        if ((rc = cli_flag_uint("replay", "--tp", v, 1, 4096, &x)) == 0)
            t->tp = (uint32_t)x;
        return rc;
    case RP_OPT_UTIL:
        return cli_flag_fraction("replay", "--util", v, &t->util_ppm);
    case RP_OPT_MFU:
        return cli_flag_fraction("replay", "--mfu", v, &t->mfu_ppm);
    case RP_OPT_PREFILL_RATE: {
        char *end;
        double r = strtod(v, &end);
        if (end == v || *end != '\0' || !isfinite(r) || r <= 0.0 || r > 1e12)
            return fail(CLI_EXIT_USAGE,
                        "--prefill-rate: '%s' is not a positive rate in tokens per second", v);
        t->prefill_rate = r;
        return 0;
    }
    case RP_OPT_TIER_BW:
        t->bw = v;
        return 0;
    case RP_OPT_TIER_LATENCY:
        t->latency = v;
        return 0;
    default:
        return 0;
    }
}

/* ---- list values: NAME=VALUE items -------------------------------------------------------- */

/* A size as replay's capacities take it: blocks (20000, 64K), tokens (1Mtok) or bytes
 * (40GiB). */
typedef struct tier_size {
    int unit;        /* 0 blocks, 1 tokens, 2 bytes */
    uint64_t amount; /* in that unit (> 0) */
} tier_size;

typedef struct tier_list {
    const char *flag;             /* for messages */
    int what;                     /* 0 sizes, 1 rates (bytes/s), 2 durations (seconds) */
    bool given[RP_MAX_TIERS];     /* per tier name */
    tier_size size[RP_MAX_TIERS]; /* sizes */
    double value[RP_MAX_TIERS];   /* rates or durations */
    int order[RP_MAX_TIERS];      /* sizes: tier kinds in the order given */
    size_t n;                     /* items */
} tier_list;

static int list_item(void *ctx, const char *item, size_t len, size_t index)
{
    tier_list *l = ctx;
    char buf[96];
    if (!cli_item_copy(item, len, buf, sizeof buf))
        return fail(CLI_EXIT_USAGE, "%s: item %zu is too long", l->flag, index + 1);
    char *eq = strchr(buf, '=');
    if (!eq)
        return fail(CLI_EXIT_USAGE, "%s: '%s' is not NAME=VALUE (gpu, cpu, disk or remote)",
                    l->flag, buf);
    *eq = '\0';
    int k = -1;
    for (int i = 0; i < RP_MAX_TIERS; i++)
        if (strcmp(buf, tier_names[i]) == 0)
            k = i;
    if (k < 0)
        return fail(CLI_EXIT_USAGE, "%s: no tier '%s' (gpu, cpu, disk, remote)", l->flag, buf);
    if (l->given[k])
        return fail(CLI_EXIT_USAGE, "%s: tier '%s' is given twice", l->flag, buf);
    if (l->what != 0 && k == TIER_GPU)
        return fail(CLI_EXIT_USAGE, "%s: the gpu tier loads nothing (its hits are in place)",
                    l->flag);
    int rc = l->what == 0
                 ? cli_flag_sized("replay", l->flag, eq + 1, &l->size[k].unit, &l->size[k].amount)
             : l->what == 1 ? cli_flag_rate("replay", l->flag, eq + 1, &l->value[k])
                            : cli_flag_seconds("replay", l->flag, eq + 1, &l->value[k]);
    if (rc)
        return rc;
    if (l->what == 0 && l->n > 0 && l->order[l->n - 1] > k)
        return fail(CLI_EXIT_USAGE, "%s: list the tiers top down (gpu, cpu, disk, remote)",
                    l->flag);
    l->given[k] = true;
    l->order[l->n++] = k;
    return 0;
}

static int parse_list(const char *flag, const char *v, int what, tier_list *l)
{
    memset(l, 0, sizeof *l);
    l->flag = flag;
    l->what = what;
    if (!v)
        return 0;
    return cli_flag_list("replay", flag, v, RP_MAX_TIERS, list_item, l);
}

int rp_tiers_check(const rp_tier_opts *t, bool has_model)
{
    if (!t->tiers) {
        if (t->gpu || t->gpu_mem || t->tp != 1 || t->prefill_rate > 0 || t->bw || t->latency)
            return fail(CLI_EXIT_USAGE, "--gpu, --gpu-mem, --tp, --prefill-rate, --tier-bw and "
                                        "--tier-latency size and time --tiers: add --tiers");
        return 0;
    }
    tier_list l;
    int rc;
    if ((rc = parse_list("--tiers", t->tiers, 0, &l)) != 0)
        return rc;
    if (l.n == 0)
        return fail(CLI_EXIT_USAGE, "--tiers: no tier given");
    if (!l.given[TIER_GPU] && !t->gpu_mem && !t->gpu)
        return fail(CLI_EXIT_USAGE, "--tiers: give gpu=SIZE, or --gpu-mem SIZE (or --gpu) with "
                                    "--model to size the GPU tier after the weights");
    if (!l.given[TIER_GPU] && !has_model)
        return fail(CLI_EXIT_USAGE, "--tiers: sizing the gpu tier from --gpu-mem needs --model");
    for (int k = 0; k < RP_MAX_TIERS; k++)
        if (l.given[k] && l.size[k].unit == 2 && !has_model)
            return fail(CLI_EXIT_USAGE, "--tiers: a size in bytes needs --model or --config");
    tier_list b;
    if ((rc = parse_list("--tier-bw", t->bw, 1, &b)) != 0 ||
        (rc = parse_list("--tier-latency", t->latency, 2, &b)) != 0)
        return rc;
    if (!has_model)
        return fail(CLI_EXIT_USAGE, "--tiers needs --model or --config: the time model moves "
                                    "the model's KV bytes");
    return 0;
}

/* ---- the model ------------------------------------------------------------------------------ */

/* The model's shape (preset or config, --kv-dtype applied). Returns 0 or the exit status. */
static int model_shape(const char *model, const char *config, const char *kv_dtype,
                       cap_model_shape *m)
{
    cap_model_shape_init(m);
    if (model) {
        const cap_model_preset *p = cap_model_find(model);
        if (!p)
            return fail(CLI_EXIT_USAGE, "--model: no preset '%s'", model);
        *m = p->shape;
    } else {
        char err[512];
        if (cap_model_from_config(config, m, err, sizeof err) != CAP_OK)
            return fail(CLI_EXIT_INPUT, "%s", err);
    }
    if (kv_dtype && cap_dtype_parse(kv_dtype, &m->kv_dtype) != CAP_OK)
        return fail(CLI_EXIT_USAGE, "--kv-dtype: unknown dtype '%s'", kv_dtype);
    m->kv_quant.layout = cap_dtype_is_quantized(m->kv_dtype) ? CAP_SCALES_TENSOR : CAP_SCALES_NONE;
    return 0;
}

/* Step 1: bytes per block on the replica and, without gpu=, the GPU tier after the weights.
 * Returns 0 or the exit status. */
static int size_from_model(const rp_tier_opts *t, const cap_model_shape *m, uint32_t bs,
                           bool need_gpu, rp_tiers_result *r, uint64_t *gpu_blocks)
{
    const char *what = NULL;
    cap_kv_cost cost;
    uint64_t per_rank;
    if (cap_kv_cost_of(m, t->tp, &cost, &what) != CAP_OK)
        return fail(CLI_EXIT_USAGE, "--tp %u: %s", t->tp, what ? what : "does not split the model");
    if (cap_cache_block_bytes(&cost, bs, &per_rank) != CAP_OK ||
        cap_mul(per_rank, t->tp, &r->block_bytes) != CAP_OK)
        return fail(CLI_EXIT_INPUT, "model shape: no KV bytes per block");
    if (!need_gpu)
        return 0;
    const cap_gpu_preset *g = cap_gpu_find(t->gpu);
    uint64_t mem = t->gpu_mem ? t->gpu_mem : g->mem_bytes;
    cap_mem_in in;
    cap_mem_out out;
    memset(&in, 0, sizeof in);
    in.gpu_mem_bytes = mem;
    in.util_ppm = t->util_ppm;
    if (cap_elems_bytes(m->n_params, m->w_dtype, &in.weights_bytes) != CAP_OK || !m->n_params)
        return fail(CLI_EXIT_USAGE, "--tiers: the model's parameter count is unknown; give "
                                    "gpu=SIZE");
    in.tp = t->tp;
    in.block_bytes = per_rank;
    in.block_size = bs;
    in.fixed_bytes = cost.fixed_bytes;
    int rc = cap_memory(&in, &out);
    if (rc == CAP_ENOSPACE)
        return fail(CLI_EXIT_INPUT,
                    "--tiers: the weights leave no GPU memory for KV (%u GPUs of %.1f GiB at "
                    "--util %.2f)",
                    t->tp, (double)mem / (1u << 30), t->util_ppm / 1e6);
    if (rc != CAP_OK || out.n_blocks == 0)
        return fail(CLI_EXIT_INPUT, "--tiers: less than one block of KV fits the GPUs");
    *gpu_blocks = out.n_blocks;
    char a[32], b[32];
    snprintf(r->gpu_desc, sizeof r->gpu_desc,
             "%s per GPU x %u GPUs after weights (%s per GPU, --util %.2f)",
             cli_fmt_binary(out.kv_bytes, a, sizeof a), t->tp,
             cli_fmt_binary(out.weights_per_gpu_bytes, b, sizeof b), t->util_ppm / 1e6);
    r->gpu_from_plan = true;
    return 0;
}

/* A size in blocks. Returns 0 or the exit status. */
static int size_blocks(int k, const tier_size *s, uint32_t bs, uint64_t block_bytes, uint64_t *out)
{
    uint64_t b = s->unit == 0 ? s->amount : s->unit == 1 ? s->amount / bs : s->amount / block_bytes;
    if (b == 0)
        return fail(CLI_EXIT_INPUT, "--tiers: %s holds less than one block of %u tokens",
                    tier_names[k], bs);
    if (b > (UINT64_C(1) << 48))
        return fail(CLI_EXIT_INPUT, "--tiers: %s is too large (at most 2^48 blocks)",
                    tier_names[k]);
    *out = b;
    return 0;
}

/* ---- evaluation ----------------------------------------------------------------------------- */

typedef struct scan_ctx {
    const rp_time_model *tm;
    rp_tier_figs *f;
    double *ttft; /* one per request */
    size_t n;
    double sum, sum_nocache;
} scan_ctx;

static void scan_one(void *ctx, const rp_scan_req *q)
{
    scan_ctx *c = ctx;
    uint32_t hits[RP_MAX_TIERS] = {0, 0, 0, 0};
    uint32_t prev = 0;
    size_t K = c->f->n_tiers;
    for (size_t k = 0; k < K; k++) {
        uint32_t cached = q->n_below[k] < q->limit ? q->n_below[k] : q->limit;
        hits[k] = cached - prev;
        prev = cached;
    }
    size_t loaded;
    double t = rp_time_request(c->tm, q->n_tokens, hits, &loaded);
    for (size_t k = 0; k < K; k++) {
        uint64_t tok = (uint64_t)hits[k] * c->tm->block_size;
        c->f->hit_tokens[k] += tok;
        if (k <= loaded)
            c->f->loaded_tokens[k] += tok;
    }
    c->f->n_prompt_tokens += q->n_tokens;
    c->f->n_requests++;
    c->ttft[c->n++] = t;
    c->sum += t;
    uint32_t none[RP_MAX_TIERS] = {0, 0, 0, 0};
    c->sum_nocache += rp_time_request(c->tm, q->n_tokens, none, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double nearest_rank(const double *v, size_t n, unsigned pct)
{
    size_t r = (n * pct + 99) / 100;
    return n ? v[r ? r - 1 : 0] : 0.0;
}

/* Requests the engine replayed, counted once. */
static void count_one(void *ctx, const rp_scan_req *q)
{
    (void)q;
    (*(size_t *)ctx)++;
}

int rp_tiers_figs(const rp_sim *sim, const rp_time_model *tm, const uint64_t *cap, size_t n,
                  rp_tier_figs *out)
{
    if (n < 1 || n > RP_MAX_TIERS || tm->n_tiers != n)
        return RP_EINPUT;
    size_t n_req = 0;
    int rc = rp_sim_scan(sim, cap, n, count_one, &n_req);
    if (rc != RP_OK)
        return rc;
    rp_tier_figs f;
    memset(&f, 0, sizeof f);
    f.n_tiers = n;
    memcpy(f.cap, cap, n * sizeof *cap);
    scan_ctx c = {tm, &f, malloc((n_req ? n_req : 1) * sizeof(double)), 0, 0.0, 0.0};
    if (!c.ttft)
        return RP_ENOMEM;
    rp_sim_scan(sim, cap, n, scan_one, &c);
    qsort(c.ttft, c.n, sizeof *c.ttft, cmp_double);
    f.ttft_mean = c.n ? c.sum / (double)c.n : 0.0;
    f.ttft_nocache_mean = c.n ? c.sum_nocache / (double)c.n : 0.0;
    f.ttft_p50 = nearest_rank(c.ttft, c.n, 50);
    f.ttft_p90 = nearest_rank(c.ttft, c.n, 90);
    f.ttft_p99 = nearest_rank(c.ttft, c.n, 99);
    free(c.ttft);
    *out = f;
    return RP_OK;
}

static double hit_rate(const rp_metrics *m)
{
    return m->n_prompt_tokens ? (double)m->n_hit_tokens / (double)m->n_prompt_tokens : 0.0;
}

/* Step 5: the least capacity in [lo, hi] blocks whose hit rate is within one point of the
 * ceiling (hi when none below it is). Returns RP_OK or RP_ENOMEM. */
static int knee(const rp_sim *sim, double ceiling, uint64_t lo, uint64_t hi, uint64_t *out)
{
    rp_metrics m;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (rp_sim_eval(sim, mid, &m, NULL) != RP_OK)
            return RP_ENOMEM;
        if (hit_rate(&m) >= ceiling - 0.01)
            hi = mid;
        else
            lo = mid + 1;
    }
    *out = lo;
    return RP_OK;
}

int rp_knee(const rp_sim *sim, double ceiling, uint64_t *out)
{
    uint64_t distinct = rp_sim_distinct(sim);
    return knee(sim, ceiling, 1, distinct ? distinct : 1, out);
}

/* Step 3: the time model. Returns 0 or the exit status. */
static int time_model(const rp_tier_opts *t, const cap_model_shape *m, bool has_model, uint32_t bs,
                      rp_tiers_result *r)
{
    rp_time_model *tm = &r->tm;
    memset(tm, 0, sizeof *tm);
    const cap_gpu_preset *g = cap_gpu_find(t->gpu ? t->gpu : "H100-80GB");
    tm->block_size = bs;
    tm->block_bytes = (double)r->block_bytes;
    tm->n_tiers = r->n_tiers;
    if (t->prefill_rate > 0) {
        tm->prefill_tok_s = t->prefill_rate;
        snprintf(r->rate_desc, sizeof r->rate_desc, "--prefill-rate");
    } else {
        tm->prefill_tok_s = rp_time_prefill_rate(has_model ? m->n_params : 0, t->tp, g->bf16_flops,
                                                 t->mfu_ppm / 1e6);
        if (tm->prefill_tok_s <= 0)
            return fail(CLI_EXIT_USAGE, "--tiers: the model's parameter count is unknown; give "
                                        "--prefill-rate");
        tm->attn_s = rp_time_attn(m->n_layers, m->n_heads, m->head_dim, t->tp, g->bf16_flops,
                                  t->mfu_ppm / 1e6);
        snprintf(r->rate_desc, sizeof r->rate_desc,
                 "2 x %.3gB params FLOPs/token + attention on %u x %s%s (%.0f TFLOP/s) at MFU "
                 "%.2f",
                 (double)m->n_params / 1e9, t->tp, g->name, t->gpu ? "" : " (assumed; --gpu)",
                 g->bf16_flops / 1e12, t->mfu_ppm / 1e6);
    }
    if (tm->block_bytes <= 0)
        return fail(CLI_EXIT_USAGE, "--tiers: the time model needs the KV bytes: give --model");
    tier_list bw, lat;
    int rc;
    if ((rc = parse_list("--tier-bw", t->bw, 1, &bw)) != 0 ||
        (rc = parse_list("--tier-latency", t->latency, 2, &lat)) != 0)
        return rc;
    for (size_t i = 1; i < r->n_tiers; i++) {
        int k = r->kind[i];
        double dbw = k == TIER_CPU ? g->host_bw_bytes * t->tp : default_bw[k];
        tm->bw_bytes_s[i] = bw.given[k] ? bw.value[k] : dbw;
        tm->latency_s[i] = lat.given[k] ? lat.value[k] : default_latency[k];
    }
    return rp_time_valid(tm) ? 0 : fail(CLI_EXIT_INTERNAL, "internal error: bad time model");
}

int rp_tiers_evaluate(const rp_tier_opts *t, const char *model, const char *config,
                      const char *kv_dtype, const rp_sim *sim, uint32_t block_size,
                      const rp_metrics *ceiling, unsigned sweep, rp_tiers_result **out)
{
    tier_list l;
    int rc;
    if ((rc = parse_list("--tiers", t->tiers, 0, &l)) != 0)
        return rc;
    rp_tiers_result *r = calloc(1, sizeof *r);
    if (!r)
        return fail(CLI_EXIT_INPUT, "out of memory");
    r->block_size = block_size;
    bool has_model = model || config;
    cap_model_shape m;
    uint64_t cap[RP_MAX_TIERS];

    /* Step 1: bytes per block, and the GPU tier from the memory left after the weights. */
    if (has_model && (rc = model_shape(model, config, kv_dtype, &m)) != 0)
        goto fail;
    r->n_tiers = 0;
    if (!l.given[TIER_GPU]) {
        r->kind[r->n_tiers++] = TIER_GPU;
        if ((rc = size_from_model(t, &m, block_size, true, r, &cap[0])) != 0)
            goto fail;
    } else if (has_model && (rc = size_from_model(t, &m, block_size, false, r, NULL)) != 0) {
        goto fail;
    }
    /* Step 2: the sizes given, in blocks, growing down the list. */
    for (size_t i = 0; i < l.n; i++) {
        int k = l.order[i];
        size_t j = r->n_tiers++;
        r->kind[j] = k;
        if ((rc = size_blocks(k, &l.size[k], block_size, r->block_bytes, &cap[j])) != 0)
            goto fail;
        if (j == 0 && k != TIER_GPU) {
            rc = fail(CLI_EXIT_USAGE, "--tiers: the first tier must be gpu");
            goto fail;
        }
        if (j > 0 && cap[j] <= cap[j - 1]) {
            rc = fail(CLI_EXIT_INPUT,
                      "--tiers: %s (%llu blocks) is not larger than %s (%llu blocks): tiers are "
                      "inclusive, each holding everything the one above holds, so a lower tier "
                      "must be larger to add anything",
                      tier_names[k], (unsigned long long)cap[j], tier_names[r->kind[j - 1]],
                      (unsigned long long)cap[j - 1]);
            goto fail;
        }
    }
    if (!r->gpu_from_plan)
        snprintf(r->gpu_desc, sizeof r->gpu_desc, "gpu= as given");
    /* Step 3: the time model. */
    if ((rc = time_model(t, &m, has_model, block_size, r)) != 0)
        goto fail;
    /* Step 4: the ladder, and the cost of no cache at all. */
    for (size_t j = 0; j < r->n_tiers; j++) {
        rp_time_model tm = r->tm;
        tm.n_tiers = j + 1;
        if (rp_tiers_figs(sim, &tm, cap, j + 1, &r->ladder[j]) != RP_OK) {
            rc = fail(CLI_EXIT_INPUT, "out of memory");
            goto fail;
        }
    }
    r->ttft_nocache_mean = r->ladder[0].ttft_nocache_mean;
    /* Step 5: the knee, over the last tier's capacity. */
    r->ceiling = hit_rate(ceiling);
    uint64_t distinct = rp_sim_distinct(sim) ? rp_sim_distinct(sim) : 1;
    if (knee(sim, r->ceiling, 1, distinct, &r->knee_blocks) != RP_OK) {
        rc = fail(CLI_EXIT_INPUT, "out of memory");
        goto fail;
    }
    /* Step 6: the sweep of the last tier. */
    size_t K = r->n_tiers;
    uint64_t lo = K > 1 ? cap[K - 2] + 1 : 1;
    uint64_t hi = distinct > cap[K - 1] ? distinct : cap[K - 1];
    if (hi < lo)
        hi = lo;
    if (sweep > 64)
        sweep = 64;
    for (unsigned i = 0; i < sweep; i++) {
        double f = sweep > 1 ? (double)i / (double)(sweep - 1) : 1.0;
        uint64_t c =
            (uint64_t)llround(exp(log((double)lo) + f * (log((double)hi) - log((double)lo))));
        if (r->n_sweep > 0 && c <= r->sweep[r->n_sweep - 1].cap[K - 1])
            continue;
        uint64_t cs[RP_MAX_TIERS];
        memcpy(cs, cap, sizeof cs);
        cs[K - 1] = c;
        if (rp_tiers_figs(sim, &r->tm, cs, K, &r->sweep[r->n_sweep]) != RP_OK) {
            rc = fail(CLI_EXIT_INPUT, "out of memory");
            goto fail;
        }
        r->n_sweep++;
    }
    *out = r;
    return 0;
fail:
    free(r);
    return rc;
}

void rp_tiers_free(rp_tiers_result *r)
{
    free(r);
}

/* ---- report --------------------------------------------------------------------------------- */

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

/* A capacity in blocks as memory (with a model; one decimal from a GiB up) or blocks. */
static char *fmt_cap(const rp_tiers_result *r, uint64_t blocks, char *buf, size_t size)
{
    if (r->block_bytes && blocks <= UINT64_MAX / r->block_bytes) {
        double b = (double)blocks * (double)r->block_bytes;
        if (b >= 1099511627776.0)
            snprintf(buf, size, "%.1f TiB", b / 1099511627776.0);
        else if (b >= 1073741824.0)
            snprintf(buf, size, "%.1f GiB", b / 1073741824.0);
        else
            cli_fmt_binary(blocks * r->block_bytes, buf, size);
    } else {
        snprintf(buf, size, "%llu blocks", (unsigned long long)blocks);
    }
    return buf;
}

static double ms(double s)
{
    return s * 1e3;
}

static void print_figs(FILE *f, const rp_tiers_result *r, const rp_tier_figs *x, const char *label)
{
    uint64_t hit = 0, loaded = 0;
    for (size_t k = 0; k < x->n_tiers; k++) {
        hit += x->hit_tokens[k];
        loaded += x->loaded_tokens[k];
    }
    fprintf(f, "  %-22s %6.2f%%", label, pct(hit, x->n_prompt_tokens));
    for (size_t k = 0; k < r->n_tiers; k++) {
        if (k < x->n_tiers)
            fprintf(f, " %7.2f%%", pct(x->hit_tokens[k], x->n_prompt_tokens));
        else
            fprintf(f, " %8s", "-");
    }
    fprintf(f, " %7.2f%% %9.1f %9.1f %9.1f %9.1f\n", pct(loaded, x->n_prompt_tokens),
            ms(x->ttft_mean), ms(x->ttft_p50), ms(x->ttft_p90), ms(x->ttft_p99));
}

static void print_header(FILE *f, const rp_tiers_result *r, const char *first)
{
    fprintf(f, "  %-22s %7s", first, "hit");
    for (size_t k = 0; k < r->n_tiers; k++)
        fprintf(f, " %8s", rp_tier_name(r->kind[k]));
    fprintf(f, " %8s %9s %9s %9s %9s\n", "used", "TTFT ms", "p50", "p90", "p99");
}

int rp_tiers_print(FILE *f, const rp_tiers_result *r)
{
    char a[32], b[64];
    const rp_time_model *tm = &r->tm;
    fprintf(f, "\nTiers (inclusive LRU, write-through: a block is served by the fastest tier "
               "holding it)\n");
    for (size_t k = 0; k < r->n_tiers; k++) {
        const char *nm = rp_tier_name(r->kind[k]);
        fprintf(f, "  %-7s %12s", nm, fmt_cap(r, r->ladder[r->n_tiers - 1].cap[k], a, sizeof a));
        if (k == 0) {
            fprintf(f, "  hits in place; %s\n", r->gpu_desc);
            continue;
        }
        double be;
        bool pays = rp_time_tier_pays(tm, k, &be);
        double load_tok = tm->block_bytes / tm->block_size / tm->bw_bytes_s[k];
        fprintf(f, "  %.1f GB/s, %.0f us a load: %.2f us a token to load vs %.2f to compute",
                tm->bw_bytes_s[k] / 1e9, tm->latency_s[k] * 1e6, load_tok * 1e6,
                1e6 / tm->prefill_tok_s);
        if (pays)
            fprintf(f, "; pays for runs above %.3g tokens\n", be);
        else
            fprintf(f, "; never pays: recomputed\n");
    }
    fprintf(f, "  prefill %.0f tokens/s (%s); block %u tokens", tm->prefill_tok_s, r->rate_desc,
            tm->block_size);
    if (r->block_bytes)
        fprintf(f, " = %s", cli_fmt_binary(r->block_bytes, b, sizeof b));
    fprintf(f, "\n  TTFT without any cache: mean %.1f ms\n\n", ms(r->ttft_nocache_mean));
    print_header(f, r, "configuration");
    for (size_t j = 0; j < r->n_tiers; j++) {
        char label[64] = "";
        for (size_t k = 0; k <= j; k++)
            snprintf(label + strlen(label), sizeof label - strlen(label), "%s%s", k ? "+" : "",
                     rp_tier_name(r->kind[k]));
        if (j == 0)
            snprintf(label + strlen(label), sizeof label - strlen(label), " only");
        print_figs(f, r, &r->ladder[j], label);
    }
    fprintf(f, "  (hit: prompt tokens found in any tier, then per tier; used: hits loaded or in "
               "place, the rest recomputed because loading them would be slower)\n");
    size_t K = r->n_tiers;
    const char *last = rp_tier_name(r->kind[K - 1]);
    fprintf(f, "\n  cold-miss ceiling %.2f%%; within 1 point of it at %s of %s", 100 * r->ceiling,
            fmt_cap(r, r->knee_blocks, a, sizeof a), K > 1 ? last : "cache");
    if (r->knee_blocks <= r->ladder[K - 1].cap[K - 1])
        fprintf(f, " (the %s tier given reaches it)\n", K > 1 ? last : "gpu");
    else
        fprintf(f, " (more than the %s given)\n",
                fmt_cap(r, r->ladder[K - 1].cap[K - 1], b, sizeof b));
    if (r->n_sweep) {
        fprintf(f, "\nSweep of the %s tier (the tiers above as given)\n", last);
        print_header(f, r, last);
        for (size_t i = 0; i < r->n_sweep; i++)
            print_figs(f, r, &r->sweep[i], fmt_cap(r, r->sweep[i].cap[K - 1], a, sizeof a));
    }
    fprintf(f, "\n  TTFT is modelled: prefill at a fixed rate for the tokens not reused plus "
               "serial loads, no queueing, no overlap (docs/replay.md, \"Time model\").\n");
    return ferror(f) ? -1 : 0;
}

static json_t *figs_json(const rp_tiers_result *r, const rp_tier_figs *x)
{
    json_t *j = json_object(), *tiers = json_array();
    if (!j || !tiers) {
        json_decref(j);
        json_decref(tiers);
        return NULL;
    }
    uint64_t hit = 0;
    for (size_t k = 0; k < x->n_tiers; k++) {
        json_t *t = json_object();
        hit += x->hit_tokens[k];
        json_object_set_new(t, "tier", json_string(rp_tier_name(r->kind[k])));
        json_object_set_new(t, "capacity_blocks", json_integer((json_int_t)x->cap[k]));
        if (r->block_bytes && x->cap[k] <= INT64_MAX / r->block_bytes)
            json_object_set_new(t, "capacity_bytes",
                                json_integer((json_int_t)(x->cap[k] * r->block_bytes)));
        json_object_set_new(t, "hit_tokens", json_integer((json_int_t)x->hit_tokens[k]));
        json_object_set_new(t, "loaded_tokens", json_integer((json_int_t)x->loaded_tokens[k]));
        json_array_append_new(tiers, t);
    }
    json_object_set_new(j, "tiers", tiers);
    json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)x->n_prompt_tokens));
    json_object_set_new(j, "hit_tokens", json_integer((json_int_t)hit));
    json_object_set_new(j, "token_hit_rate",
                        json_real(x->n_prompt_tokens ? (double)hit / x->n_prompt_tokens : 0));
    json_object_set_new(j, "ttft_mean_s", json_real(x->ttft_mean));
    json_object_set_new(j, "ttft_p50_s", json_real(x->ttft_p50));
    json_object_set_new(j, "ttft_p90_s", json_real(x->ttft_p90));
    json_object_set_new(j, "ttft_p99_s", json_real(x->ttft_p99));
    return j;
}

/* ---- CSV: the tier rows and their columns ------------------------------------------------ */

/* The CSV columns --tiers adds after replay's own: per tier kind (gpu, cpu, disk, remote) its
 * capacity in blocks and in bytes, the prompt tokens it served and, below gpu, loaded; then
 * the modelled TTFT. */
void rp_tiers_csv_header(FILE *f)
{
    static const char *const what[] = {"blocks", "bytes", "hit_tokens", "loaded_tokens"};
    for (size_t w = 0; w < 4; w++)
        for (int k = 0; k < RP_MAX_TIERS; k++)
            fprintf(f, ",%s_%s", rp_tier_name(k), what[w]);
    fputs(",ttft_mean_s,ttft_p50_s,ttft_p90_s,ttft_p99_s,ttft_nocache_mean_s", f);
}

/* The columns of rp_tiers_csv_header left empty (a row that is not a tier row). */
void rp_tiers_csv_empty(FILE *f)
{
    for (int c = 0; c < 4 * RP_MAX_TIERS + 5; c++)
        fputc(',', f);
}

/* One configuration's row: replay's columns (dimension kind, value label, capacities empty:
 * they are per tier, in the added columns; requests, prompt and hit tokens, token hit rate;
 * the rest empty), then the tier columns. */
static void figs_csv(FILE *f, const rp_tiers_result *r, const char *kind, const rp_tier_figs *x,
                     size_t n_std)
{
    uint64_t hit = 0, cap[RP_MAX_TIERS] = {0}, served[RP_MAX_TIERS] = {0},
             loaded[RP_MAX_TIERS] = {0};
    bool has[RP_MAX_TIERS] = {false};
    fprintf(f, "tiers:%s,", kind);
    for (size_t k = 0; k < x->n_tiers; k++) {
        fprintf(f, "%s%s", k ? "+" : "", rp_tier_name(r->kind[k]));
        hit += x->hit_tokens[k];
        has[r->kind[k]] = true;
        cap[r->kind[k]] = x->cap[k];
        served[r->kind[k]] = x->hit_tokens[k];
        loaded[r->kind[k]] = x->loaded_tokens[k];
    }
    fprintf(f, ",,,,%llu,%llu,%llu,%.6f", (unsigned long long)x->n_requests,
            (unsigned long long)x->n_prompt_tokens, (unsigned long long)hit,
            x->n_prompt_tokens ? (double)hit / (double)x->n_prompt_tokens : 0.0);
    for (size_t c = 9; c < n_std; c++) /* replay's columns after token_hit_rate */
        fputc(',', f);
    const uint64_t *col[4] = {cap, NULL, served, loaded};
    for (size_t w = 0; w < 4; w++)
        for (int k = 0; k < RP_MAX_TIERS; k++) {
            fputc(',', f);
            if (!has[k])
                continue;
            if (w == 1) {
                if (r->block_bytes && cap[k] <= UINT64_MAX / r->block_bytes)
                    fprintf(f, "%llu", (unsigned long long)(cap[k] * r->block_bytes));
            } else if (w != 3 || k != 0) {
                fprintf(f, "%llu", (unsigned long long)col[w][k]);
            }
        }
    fprintf(f, ",%.6f,%.6f,%.6f,%.6f,%.6f\n", x->ttft_mean, x->ttft_p50, x->ttft_p90, x->ttft_p99,
            r->ttft_nocache_mean);
}

int rp_tiers_csv(FILE *f, const rp_tiers_result *r, size_t n_std)
{
    for (size_t i = 0; i < r->n_tiers; i++)
        figs_csv(f, r, "ladder", &r->ladder[i], n_std);
    for (size_t i = 0; i < r->n_sweep; i++)
        figs_csv(f, r, "sweep", &r->sweep[i], n_std);
    /* The knee: the last tier's capacity within one point of the ceiling. */
    int last = r->kind[r->n_tiers - 1];
    fprintf(f, "tiers:knee,%s", rp_tier_name(last));
    for (size_t c = 2; c < n_std; c++)
        fputc(',', f);
    for (size_t w = 0; w < 2; w++)
        for (int k = 0; k < RP_MAX_TIERS; k++) {
            fputc(',', f);
            if (k != last)
                continue;
            if (w == 0)
                fprintf(f, "%llu", (unsigned long long)r->knee_blocks);
            else if (r->block_bytes && r->knee_blocks <= UINT64_MAX / r->block_bytes)
                fprintf(f, "%llu", (unsigned long long)(r->knee_blocks * r->block_bytes));
        }
    for (int c = 0; c < 2 * RP_MAX_TIERS + 5; c++)
        fputc(',', f);
    fputc('\n', f);
    return ferror(f) ? -1 : 0;
}

json_t *rp_tiers_json(const rp_tiers_result *r)
{
    json_t *j = json_object(), *ladder = json_array(), *sweep = json_array(), *model = json_array();
    if (!j || !ladder || !sweep || !model) {
        json_decref(j);
        json_decref(ladder);
        json_decref(sweep);
        json_decref(model);
        return NULL;
    }
    const rp_time_model *tm = &r->tm;
    for (size_t k = 1; k < r->n_tiers; k++) {
        json_t *t = json_object();
        double be;
        bool pays = rp_time_tier_pays(tm, k, &be);
        json_object_set_new(t, "tier", json_string(rp_tier_name(r->kind[k])));
        json_object_set_new(t, "bandwidth_bytes_per_s", json_real(tm->bw_bytes_s[k]));
        json_object_set_new(t, "latency_s", json_real(tm->latency_s[k]));
        json_object_set_new(t, "pays", json_boolean(pays));
        json_object_set_new(t, "breakeven_tokens", pays ? json_real(be) : json_null());
        json_array_append_new(model, t);
    }
    json_object_set_new(j, "prefill_tokens_per_s", json_real(tm->prefill_tok_s));
    json_object_set_new(j, "prefill_rate_from", json_string(r->rate_desc));
    json_object_set_new(j, "attention_s_per_token_squared", json_real(tm->attn_s));
    json_object_set_new(j, "gpu_tier_from", json_string(r->gpu_desc));
    json_object_set_new(j, "block_bytes", json_integer((json_int_t)r->block_bytes));
    json_object_set_new(j, "lower_tiers", model);
    json_object_set_new(j, "ttft_nocache_mean_s", json_real(r->ttft_nocache_mean));
    for (size_t i = 0; i < r->n_tiers; i++)
        json_array_append_new(ladder, figs_json(r, &r->ladder[i]));
    json_object_set_new(j, "ladder", ladder);
    json_object_set_new(j, "ceiling_token_hit_rate", json_real(r->ceiling));
    json_object_set_new(j, "knee_blocks", json_integer((json_int_t)r->knee_blocks));
    if (r->block_bytes && r->knee_blocks <= INT64_MAX / r->block_bytes)
        json_object_set_new(j, "knee_bytes",
                            json_integer((json_int_t)(r->knee_blocks * r->block_bytes)));
    for (size_t i = 0; i < r->n_sweep; i++)
        json_array_append_new(sweep, figs_json(r, &r->sweep[i]));
    json_object_set_new(j, "sweep", sweep);
    return j;
}

int rp_tiers_plot(FILE *f, const rp_tiers_result *r, const char *input, char *err, size_t err_size)
{
    size_t n = r->n_sweep, K = r->n_tiers;
    if (n == 0) {
        cli_errf(err, err_size, "--plot draws the tier sweep: add --sweep");
        return -1;
    }
    double x[64], yall[64], yup[64], yt[64];
    bool gib = r->block_bytes != 0;
    for (size_t i = 0; i < n; i++) {
        const rp_tier_figs *s = &r->sweep[i];
        uint64_t hit = 0;
        for (size_t k = 0; k < K; k++)
            hit += s->hit_tokens[k];
        x[i] = gib ? (double)s->cap[K - 1] * (double)r->block_bytes / 1073741824.0
                   : (double)s->cap[K - 1];
        yall[i] = s->n_prompt_tokens ? (double)hit / (double)s->n_prompt_tokens : 0;
        yup[i] = s->n_prompt_tokens ? (double)(hit - s->hit_tokens[K - 1]) / s->n_prompt_tokens : 0;
        double t = r->ttft_nocache_mean > 0 ? s->ttft_mean / r->ttft_nocache_mean : 0;
        yt[i] = t > 1 ? 1 : t;
    }
    const char *last = rp_tier_name(r->kind[K - 1]);
    char title[256], xlabel[128], up[64], ceil_label[96], note[256], mlabel[64], a[32];
    const char *base = strrchr(input, '/') ? strrchr(input, '/') + 1 : input;
    snprintf(title, sizeof title, "%s: tiered prefix cache, hit rate and modelled TTFT", base);
    snprintf(xlabel, sizeof xlabel, "%s tier capacity (%s, log scale)", last,
             gib ? "GiB of KV" : "blocks");
    up[0] = '\0';
    for (size_t k = 0; k + 1 < K; k++)
        snprintf(up + strlen(up), sizeof up - strlen(up), "%s%s", k ? "+" : "",
                 rp_tier_name(r->kind[k]));
    char upname[96];
    snprintf(upname, sizeof upname, "token hit rate from %s", K > 1 ? up : "-");
    snprintf(ceil_label, sizeof ceil_label, "cold-miss ceiling %.1f%%", 100 * r->ceiling);
    snprintf(note, sizeof note,
             "within 1 point of the ceiling at %s; TTFT mean relative to no "
             "cache (%.0f ms)",
             fmt_cap(r, r->knee_blocks, a, sizeof a), ms(r->ttft_nocache_mean));
    svg_series series[3] = {{"token hit rate, all tiers", yall},
                            {"modelled TTFT / TTFT without cache", yt},
                            {upname, yup}};
    svg_plot p;
    memset(&p, 0, sizeof p);
    p.title = title;
    p.x_label = xlabel;
    p.y_label = "hit rate, TTFT ratio (%)";
    p.x = x;
    p.n = n;
    p.series = series;
    p.n_series = K > 1 ? 3 : 2;
    p.ceiling = r->ceiling;
    p.ceiling_label = ceil_label;
    p.x_secondary = note;
    uint64_t given = r->ladder[K - 1].cap[K - 1];
    p.marker_x = gib ? (double)given * (double)r->block_bytes / 1073741824.0 : (double)given;
    snprintf(mlabel, sizeof mlabel, "%s=%s", last, fmt_cap(r, given, a, sizeof a));
    p.marker_label = mlabel;
    return svg_write(f, &p, err, err_size);
}
