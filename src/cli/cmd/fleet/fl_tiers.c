/*
 * fl_tiers.c - the tier pass of `kvprefix fleet` (fl_tiers.h): per-replica inclusive LRU
 * tiers and a fleet-wide shared LRU tier replayed on a simulation's recorded routes.
 *
 * Layout. One LRU per tier instance: a uthash map from block key to node, and the nodes on a
 * doubly linked recency list (head: most recent). Evicting reuses the tail node for the new
 * key, so a tier holds at most its capacity in nodes. A run has 2 x N + 1 of them (cpu and
 * disk of each of N replicas, one shared), made only for the tiers given.
 *
 * Steps of fl_tier_sim_start, called by the simulation at each request's start (oversize
 * requests excepted, as the simulation serves them without a cache):
 *   1. (the simulation) the GPU hit from the replica's pool;
 *   2. from the GPU hit on, find each prompt block in the first of the replica's cpu, its
 *      disk, the shared tier that holds it, stopping at the first block none holds and at the
 *      one-token cap; charge the loads that beat recomputing (fl_tiers_delta);
 *   3. touch all its full prompt blocks, last to first, in its replica's tiers and the
 *      shared one (write-through).
 *
 * Invariants: a tier's map and list hold the same nodes, at most its capacity.
 * Cost: per request O(blocks x tiers) expected hash probes; memory about 80 bytes per held
 * block per tier instance.
 */
#include "fl_tiers.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fleet.h"
#include "flags.h"

#define HASH_FUNCTION(keyptr, keylen, hashv)                                                       \
    do {                                                                                           \
        uint64_t lo_;                                                                              \
        memcpy(&lo_, (keyptr), sizeof lo_);                                                        \
        (hashv) = (unsigned)(lo_ ^ (lo_ >> 32));                                                   \
    } while (0)
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj)                                                                   \
    do {                                                                                           \
        oom_flag = true;                                                                           \
    } while (0)
#include <uthash.h>

#define fail(...) cli_fail("fleet", __VA_ARGS__)

static bool oom_flag; /* set by uthash when a table allocation fails (single-threaded tool) */

static const char *const tier_names[FL_N_TIERS] = {"cpu", "disk", "shared"};
static const double default_bw[FL_N_TIERS] = {50e9, 20e9, 25e9};
static const double default_latency[FL_N_TIERS] = {10e-6, 100e-6, 500e-6};

const char *fl_tier_name(int k)
{
    return k >= 0 && k < FL_N_TIERS ? tier_names[k] : "?";
}

bool fl_tiers_is_opt(int c)
{
    return c >= FL_OPT_TIERS && c <= FL_OPT_TIER_LATENCY;
}

int fl_tiers_apply(fl_tier_opts *t, int c, const char *v)
{
    if (c == FL_OPT_TIERS)
        t->tiers = v;
    else if (c == FL_OPT_SHARED_TIER)
        t->shared = v;
    else if (c == FL_OPT_TIER_BW)
        t->bw = v;
    else if (c == FL_OPT_TIER_LATENCY)
        t->latency = v;
    return 0;
}

/* ---- flag values ---------------------------------------------------------------------------- */

typedef struct size_spec {
    int unit;        /* 0 blocks, 1 tokens, 2 bytes */
    uint64_t amount; /* > 0 */
} size_spec;

/* NAME=VALUE items of --tiers (cpu, disk), --tier-bw and --tier-latency (cpu, disk, shared). */
typedef struct item_list {
    const char *flag;
    int what; /* 0 sizes, 1 rates, 2 durations */
    bool given[FL_N_TIERS];
    size_spec size[FL_N_TIERS];
    double value[FL_N_TIERS];
    int last; /* sizes: the last tier given, for the order */
} item_list;

static int list_item(void *ctx, const char *item, size_t len, size_t index)
{
    item_list *l = ctx;
    char buf[96];
    if (!cli_item_copy(item, len, buf, sizeof buf))
        return fail(CLI_EXIT_USAGE, "%s: item %zu is too long", l->flag, index + 1);
    char *eq = strchr(buf, '=');
    if (!eq)
        return fail(CLI_EXIT_USAGE, "%s: '%s' is not NAME=VALUE", l->flag, buf);
    *eq = '\0';
    int k = -1;
    for (int i = 0; i < (l->what == 0 ? 2 : FL_N_TIERS); i++)
        if (strcmp(buf, tier_names[i]) == 0)
            k = i;
    if (k < 0)
        return fail(CLI_EXIT_USAGE, "%s: no tier '%s' (%s)", l->flag, buf,
                    l->what == 0 ? "cpu, disk; the fleet-wide one is --shared-tier"
                                 : "cpu, disk, shared");
    if (l->given[k])
        return fail(CLI_EXIT_USAGE, "%s: tier '%s' is given twice", l->flag, buf);
    if (l->what == 0 && k < l->last)
        return fail(CLI_EXIT_USAGE, "%s: list the tiers top down (cpu, then disk)", l->flag);
    int rc = l->what == 0
                 ? cli_flag_sized("fleet", l->flag, eq + 1, &l->size[k].unit, &l->size[k].amount)
             : l->what == 1 ? cli_flag_rate("fleet", l->flag, eq + 1, &l->value[k])
                            : cli_flag_seconds("fleet", l->flag, eq + 1, &l->value[k]);
    if (rc)
        return rc;
    l->given[k] = true;
    l->last = k;
    return 0;
}

static int parse_list(const char *flag, const char *v, int what, item_list *l)
{
    memset(l, 0, sizeof *l);
    l->flag = flag;
    l->what = what;
    return v ? cli_flag_list("fleet", flag, v, FL_N_TIERS, list_item, l) : 0;
}

int fl_tiers_check(const fl_tier_opts *t, bool has_model)
{
    if (!fl_tiers_on(t)) {
        if (t->bw || t->latency)
            return fail(CLI_EXIT_USAGE, "--tier-bw and --tier-latency time the tiers: add "
                                        "--tiers or --shared-tier");
        return 0;
    }
    if (!has_model)
        return fail(CLI_EXIT_USAGE, "--tiers and --shared-tier need --model: a load moves the "
                                    "model's KV bytes");
    item_list l;
    size_spec sh;
    int rc;
    if ((rc = parse_list("--tiers", t->tiers, 0, &l)) != 0 ||
        (rc = parse_list("--tier-bw", t->bw, 1, &l)) != 0 ||
        (rc = parse_list("--tier-latency", t->latency, 2, &l)) != 0)
        return rc;
    if (t->shared &&
        (rc = cli_flag_sized("fleet", "--shared-tier", t->shared, &sh.unit, &sh.amount)) != 0)
        return rc;
    return 0;
}

static int to_blocks(const char *what, const size_spec *s, uint32_t bs, uint64_t block_bytes,
                     uint64_t *out)
{
    uint64_t b = s->unit == 0 ? s->amount : s->unit == 1 ? s->amount / bs : s->amount / block_bytes;
    if (b == 0)
        return fail(CLI_EXIT_INPUT, "%s holds less than one block of %u tokens", what, bs);
    if (b > (UINT64_C(1) << 32))
        return fail(CLI_EXIT_INPUT, "%s: %llu blocks is above the limit of 2^32", what,
                    (unsigned long long)b);
    *out = b;
    return 0;
}

int fl_tiers_setup(const fl_tier_opts *t, uint32_t block_size, uint64_t block_bytes,
                   uint64_t prefill_ns, fl_tier_setup *s)
{
    memset(s, 0, sizeof *s);
    s->block_bytes = block_bytes;
    s->block_size = block_size;
    s->prefill_ns = prefill_ns;
    item_list l, bw, lat;
    int rc;
    if ((rc = parse_list("--tiers", t->tiers, 0, &l)) != 0 ||
        (rc = parse_list("--tier-bw", t->bw, 1, &bw)) != 0 ||
        (rc = parse_list("--tier-latency", t->latency, 2, &lat)) != 0)
        return rc;
    for (int k = 0; k < 2; k++)
        if (l.given[k] && (rc = to_blocks(k ? "--tiers disk" : "--tiers cpu", &l.size[k],
                                          block_size, block_bytes, &s->cap[k])) != 0)
            return rc;
    if (s->cap[0] && s->cap[1] && s->cap[1] <= s->cap[0])
        return fail(CLI_EXIT_INPUT,
                    "--tiers: disk (%llu blocks) is not larger than cpu (%llu): the tiers are "
                    "inclusive, so a lower one must be larger to add anything",
                    (unsigned long long)s->cap[1], (unsigned long long)s->cap[0]);
    if (t->shared) {
        size_spec sh;
        if ((rc = cli_flag_sized("fleet", "--shared-tier", t->shared, &sh.unit, &sh.amount)) != 0 ||
            (rc = to_blocks("--shared-tier", &sh, block_size, block_bytes, &s->cap[2])) != 0)
            return rc;
    }
    for (int k = 0; k < FL_N_TIERS; k++) {
        s->bw[k] = bw.given[k] ? bw.value[k] : default_bw[k];
        s->latency[k] = lat.given[k] ? lat.value[k] : default_latency[k];
    }
    return 0;
}

/* ---- the LRU tiers -------------------------------------------------------------------------- */

typedef struct node {
    kvp_key key;              /* the block */
    struct node *prev, *next; /* recency list: prev is more recent */
    UT_hash_handle hh;        /* map by key */
} node;

typedef struct lru {
    node *map;         /* uthash head */
    node *head, *tail; /* most and least recently used */
    uint64_t n, cap;   /* nodes held, capacity (0: the tier is absent) */
} lru;

static node *lru_find(const lru *t, kvp_key k)
{
    node *x = NULL;
    HASH_FIND(hh, t->map, &k, sizeof k, x);
    return x;
}

static void list_unlink(lru *t, node *x)
{
    if (x->prev)
        x->prev->next = x->next;
    else
        t->head = x->next;
    if (x->next)
        x->next->prev = x->prev;
    else
        t->tail = x->prev;
}

static void list_push(lru *t, node *x)
{
    x->prev = NULL;
    x->next = t->head;
    if (t->head)
        t->head->prev = x;
    t->head = x;
    if (!t->tail)
        t->tail = x;
}

/* Touch k: make it the most recent, inserting it (and evicting the least recent when full).
 * Returns false on out of memory (the tier then lacks k, nothing else changed). */
static bool lru_touch(lru *t, kvp_key k)
{
    if (t->cap == 0)
        return true;
    node *x = lru_find(t, k);
    if (x) {
        list_unlink(t, x);
        list_push(t, x);
        return true;
    }
    if (t->n == t->cap) {
        x = t->tail;
        list_unlink(t, x);
        HASH_DELETE(hh, t->map, x);
        t->n--;
    } else if (!(x = calloc(1, sizeof *x))) {
        return false;
    }
    x->key = k;
    oom_flag = false;
    HASH_ADD(hh, t->map, key, sizeof x->key, x);
    if (oom_flag) {
        free(x);
        return false;
    }
    list_push(t, x);
    t->n++;
    return true;
}

static void lru_free(lru *t)
{
    node *x, *tmp;
    HASH_ITER(hh, t->map, x, tmp)
    {
        HASH_DELETE(hh, t->map, x);
        free(x);
    }
    memset(t, 0, sizeof *t);
}

/* ---- the pass ------------------------------------------------------------------------------- */

int64_t fl_tiers_delta(const fl_tier_setup *s, const uint32_t *hits, int *n_loaded)
{
    double best = 0.0, d = 0.0;
    int best_c = 0;
    for (int c = 1; c <= FL_N_TIERS; c++) {
        int k = c - 1;
        if (hits[k] > 0)
            d += (s->latency[k] + (double)hits[k] * (double)s->block_bytes / s->bw[k]) * 1e9 -
                 (double)hits[k] * s->block_size * (double)s->prefill_ns;
        if (d < best) {
            best = d;
            best_c = c;
        }
    }
    if (n_loaded)
        *n_loaded = best_c;
    return (int64_t)llround(best);
}

struct fl_tier_sim {
    fl_tier_setup setup; /* as given */
    uint32_t n_replicas; /* replicas */
    lru *t;              /* cpu and disk of each replica (2 r, 2 r + 1), then the shared one */
    fl_tier_figs figs;   /* so far */
};

fl_tier_sim *fl_tier_sim_new(const fl_tier_setup *s, uint32_t n_replicas)
{
    fl_tier_sim *x = calloc(1, sizeof *x);
    if (!x || !(x->t = calloc(2 * (size_t)n_replicas + 1, sizeof *x->t))) {
        free(x);
        return NULL;
    }
    x->setup = *s;
    x->n_replicas = n_replicas;
    for (uint32_t r = 0; r < n_replicas; r++) {
        x->t[2 * r].cap = s->cap[0];
        x->t[2 * r + 1].cap = s->cap[1];
    }
    x->t[2 * (size_t)n_replicas].cap = s->cap[2];
    return x;
}

int fl_tier_sim_start(fl_tier_sim *x, const fl_log *log, uint32_t i, uint32_t r, uint32_t gpu_hit,
                      int64_t *delta_ns)
{
    const fl_tier_setup *s = &x->setup;
    const fl_req *q = fl_log_req(log, i);
    const kvp_key *keys = fl_log_keys(log, q);
    lru *tiers[FL_N_TIERS] = {&x->t[2 * r], &x->t[2 * r + 1], &x->t[2 * (size_t)x->n_replicas]};
    x->figs.n_prompt_tokens += q->n_prompt;
    x->figs.gpu_tokens += gpu_hit;
    /* Step 2: the prefix past the GPU hit, block by block into the first tier holding it. */
    uint32_t hits[FL_N_TIERS] = {0, 0, 0};
    uint32_t limit = (q->n_prompt - 1) / s->block_size;
    limit = limit < q->n_keys ? limit : q->n_keys;
    for (uint32_t j = gpu_hit / s->block_size; j < limit; j++) {
        int k = 0;
        while (k < FL_N_TIERS && !(tiers[k]->cap && lru_find(tiers[k], keys[j])))
            k++;
        if (k == FL_N_TIERS)
            break;
        hits[k]++;
    }
    int loaded;
    *delta_ns = fl_tiers_delta(s, hits, &loaded);
    for (int k = 0; k < FL_N_TIERS; k++) {
        uint64_t tok = (uint64_t)hits[k] * s->block_size;
        x->figs.tier_tokens[k] += tok;
        if (k < loaded)
            x->figs.loaded_tokens[k] += tok;
    }
    /* Step 3: write-through of every full prompt block, last to first. */
    for (uint32_t j = q->n_keys; j-- > 0;)
        for (int k = 0; k < FL_N_TIERS; k++)
            if (!lru_touch(tiers[k], keys[j]))
                return FL_ENOMEM;
    return FL_OK;
}

void fl_tier_sim_figs(const fl_tier_sim *x, fl_tier_figs *out)
{
    *out = x->figs;
}

bool fl_tier_sim_check(const fl_tier_sim *x)
{
    for (size_t k = 0; k < 2 * (size_t)x->n_replicas + 1; k++) {
        const lru *t = &x->t[k];
        uint64_t n = 0;
        for (const node *y = t->head; y; y = y->next) {
            if (n++ > t->n || lru_find(t, y->key) != y || (y->next && y->next->prev != y))
                return false;
        }
        if (n != t->n || HASH_COUNT(t->map) != t->n || t->n > t->cap)
            return false;
    }
    return true;
}

void fl_tier_sim_free(fl_tier_sim *x)
{
    if (!x)
        return;
    for (size_t k = 0; k < 2 * (size_t)x->n_replicas + 1; k++)
        lru_free(&x->t[k]);
    free(x->t);
    free(x);
}

/* ---- report --------------------------------------------------------------------------------- */

static double pct(uint64_t a, uint64_t b)
{
    return b ? 100.0 * (double)a / (double)b : 0.0;
}

static uint64_t total(const fl_tier_figs *x)
{
    return x->gpu_tokens + x->tier_tokens[0] + x->tier_tokens[1] + x->tier_tokens[2];
}

/* The TTFT in milliseconds of x (mean, p50, p99). */
static void ttft_ms(const fl_result *x, double *mean, double *p50, double *p99)
{
    *mean = x->ttft_mean / 1e6;
    *p50 = (double)x->ttft_p50 / 1e6;
    *p99 = (double)x->ttft_p99 / 1e6;
}

void fl_tiers_print(FILE *f, const fl_tier_setup *s, const fl_result *base, const fl_result *tiered,
                    const fl_tier_figs *figs, size_t n)
{
    char a[32];
    fprintf(f, "\nTiers below the GPU (write-through, inclusive LRU; each run simulated again "
               "with them):\n");
    for (int k = 0; k < FL_N_TIERS; k++) {
        if (!s->cap[k])
            continue;
        fprintf(f, "  %-6s %s %s, %.1f GB/s, %.0f us a load\n", tier_names[k],
                k < 2 ? "per replica" : "fleet-wide ",
                cli_fmt_binary(s->cap[k] * s->block_bytes, a, sizeof a), s->bw[k] / 1e9,
                s->latency[k] * 1e6);
    }
    fprintf(f, "  %8s %-16s %7s %7s %7s %7s %7s %11s %11s %10s %10s\n", "replicas", "policy", "gpu",
            "cpu", "disk", "shared", "hit", "TTFT before", "with tiers", "p50", "p99");
    for (size_t i = 0; i < n; i++) {
        const fl_result *x = &tiered[i];
        const fl_tier_figs *y = &figs[i];
        if (x->n_replicas == 0)
            continue;
        fprintf(f, "  %8u %-16s %6.2f%%", x->n_replicas, fl_policy_name(x->policy),
                pct(y->gpu_tokens, y->n_prompt_tokens));
        for (int k = 0; k < FL_N_TIERS; k++) {
            if (s->cap[k])
                fprintf(f, " %6.2f%%", pct(y->tier_tokens[k], y->n_prompt_tokens));
            else
                fprintf(f, " %7s", "-");
        }
        double m, p50, p99;
        ttft_ms(x, &m, &p50, &p99);
        fprintf(f, " %6.2f%% %9.1fms %9.1fms %8.1fms %8.1fms\n", pct(total(y), y->n_prompt_tokens),
                base[i].ttft_mean / 1e6, m, p50, p99);
    }
    fprintf(f, "  (TTFT before: the same fleet and policy without the tiers; the routers see the "
               "GPU pools only)\n");
}

json_t *fl_tiers_json(const fl_tier_setup *s, const fl_result *base, const fl_result *tiered,
                      const fl_tier_figs *figs, size_t n)
{
    json_t *arr = json_array();
    if (!arr)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const fl_result *x = &tiered[i];
        const fl_tier_figs *y = &figs[i];
        if (x->n_replicas == 0)
            continue;
        json_t *j = json_object();
        json_object_set_new(j, "replicas", json_integer(x->n_replicas));
        json_object_set_new(j, "policy", json_string(fl_policy_name(x->policy)));
        json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)y->n_prompt_tokens));
        json_object_set_new(j, "gpu_hit_tokens", json_integer((json_int_t)y->gpu_tokens));
        for (int k = 0; k < FL_N_TIERS; k++) {
            char name[40];
            if (!s->cap[k])
                continue;
            snprintf(name, sizeof name, "%s_hit_tokens", tier_names[k]);
            json_object_set_new(j, name, json_integer((json_int_t)y->tier_tokens[k]));
            snprintf(name, sizeof name, "%s_loaded_tokens", tier_names[k]);
            json_object_set_new(j, name, json_integer((json_int_t)y->loaded_tokens[k]));
        }
        json_object_set_new(
            j, "token_hit_rate",
            json_real(y->n_prompt_tokens ? (double)total(y) / y->n_prompt_tokens : 0.0));
        double m, p50, p99;
        ttft_ms(x, &m, &p50, &p99);
        json_object_set_new(j, "ttft_mean_ms", json_real(m));
        json_object_set_new(j, "ttft_p50_ms", json_real(p50));
        json_object_set_new(j, "ttft_p99_ms", json_real(p99));
        json_object_set_new(j, "ttft_mean_ms_without_tiers", json_real(base[i].ttft_mean / 1e6));
        json_array_append_new(arr, j);
    }
    return arr;
}
