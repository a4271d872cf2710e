/*
 * router_rank.c - kvp_router_rank: the one ordering of candidate workers by cached blocks
 * and load, shared by `kvprefix router` (its /score answer) and `kvprefix fleet` (its
 * least-loaded and cache-aware policies), so the simulation's what-if figures describe the
 * daemon's choices (docs/routing.md, "Load-aware ranking").
 *
 * Order, as a key compared field by field (rank_key):
 *
 *   over_cap  | primary                   | secondary | turn
 *   ----------+---------------------------+-----------+-----------------------
 *   0 first   | cache first: -cached      | load      | (i - start) mod n
 *             | cost: w x prefill + load  | -cached   |
 *
 * where prefill = max(0, prompt_blocks - cached) and w = overlap_weight. over_cap is set
 * when load_cap > 0 and the load is above load_cap x the mean load, except for the
 * least-loaded candidate (the lowest index among equals), which always stays within, so
 * there is always one. The turn makes the order total: no two candidates compare equal.
 *
 * With cap 1 the best is found in one scan (the fleet simulation asks this per request);
 * otherwise the keys are sorted (qsort on a key array: on the stack up to 64 candidates,
 * malloc'ed beyond). The function has no state and never reads beyond in[0 .. n).
 */
#include <math.h>
#include <stdlib.h>

#include "kvprefix_events.h"

#define RANK_STACK 64u /* candidates ranked without malloc */

/* One candidate's sort key. */
typedef struct rank_key {
    int over_cap;     /* 1 when above the load cap (ranks after all within it) */
    double primary;   /* cache first: -cached; cost mode: the cost */
    double secondary; /* cache first: load; cost mode: -cached */
    size_t turn;      /* (index - start) mod n: the tie-break, distinct per candidate */
    uint32_t index;   /* the candidate's index in in[] */
} rank_key;

void kvp_router_rank_config_init(kvp_router_rank_config *cfg)
{
    if (cfg == NULL)
        return;
    cfg->overlap_weight = 0.0;
    cfg->load_cap = 0.0;
    cfg->start = 0;
}

/* Whether a is better than b (ranks before it). Cannot fail. */
static inline bool rank_key_before(const rank_key *a, const rank_key *b)
{
    if (a->over_cap != b->over_cap)
        return a->over_cap < b->over_cap;
    if (a->primary != b->primary)
        return a->primary < b->primary;
    if (a->secondary != b->secondary)
        return a->secondary < b->secondary;
    return a->turn < b->turn;
}

static int rank_key_cmp(const void *pa, const void *pb)
{
    const rank_key *a = pa, *b = pb;
    return rank_key_before(a, b) ? -1 : rank_key_before(b, a) ? 1 : 0;
}

/* Whether the configuration and inputs are acceptable. */
static bool rank_valid(const kvp_router_rank_config *cfg, double prompt_blocks,
                       const kvp_router_rank_input *in, size_t n)
{
    if (!isfinite(cfg->overlap_weight) || cfg->overlap_weight < 0.0)
        return false;
    if (isnan(cfg->load_cap) || (cfg->load_cap != 0.0 && cfg->load_cap < 1.0))
        return false;
    if (!isfinite(prompt_blocks) || prompt_blocks < 0.0 || n > UINT32_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(in[i].cached) || in[i].cached < 0.0 || !isfinite(in[i].load) ||
            in[i].load < 0.0)
            return false;
    return true;
}

/* Candidate i's key, given the load limit (INFINITY without a cap) and the least-loaded
 * candidate. Cannot fail. */
static rank_key rank_key_of(const kvp_router_rank_config *cfg, double prompt_blocks,
                            const kvp_router_rank_input *in, size_t n, size_t i, double limit,
                            size_t least)
{
    rank_key k;
    k.over_cap = in[i].load > limit && i != least;
    if (cfg->overlap_weight > 0.0) {
        double prefill = prompt_blocks > in[i].cached ? prompt_blocks - in[i].cached : 0.0;
        k.primary = cfg->overlap_weight * prefill + in[i].load;
        k.secondary = -in[i].cached;
    } else {
        k.primary = -in[i].cached;
        k.secondary = in[i].load;
    }
    size_t s = cfg->start % n;
    k.turn = i >= s ? i - s : i + n - s;
    k.index = (uint32_t)i;
    return k;
}

int kvp_router_rank(const kvp_router_rank_config *cfg, double prompt_blocks,
                    const kvp_router_rank_input *in, size_t n, uint32_t *order, size_t cap,
                    size_t *n_order, size_t *n_within)
{
    if (cfg == NULL || (in == NULL && n > 0) || (order == NULL && cap > 0) || n_order == NULL)
        return KVP_EINVAL;
    if (!rank_valid(cfg, prompt_blocks, in, n))
        return KVP_EINVAL;
    /* Step 1: the load limit and the least-loaded candidate. */
    double limit = (double)INFINITY;
    size_t least = 0;
    if (cfg->load_cap > 0.0 && n > 0) {
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) {
            sum += in[i].load;
            least = in[i].load < in[least].load ? i : least;
        }
        limit = cfg->load_cap * (sum / (double)n);
    }
    size_t within = 0;
    size_t m = n < cap ? n : cap;
    if (m == 1) {
        /* Step 2a: the best alone, in one scan. */
        rank_key best = rank_key_of(cfg, prompt_blocks, in, n, 0, limit, least);
        within += !best.over_cap;
        for (size_t i = 1; i < n; i++) {
            rank_key k = rank_key_of(cfg, prompt_blocks, in, n, i, limit, least);
            within += !k.over_cap;
            if (rank_key_before(&k, &best))
                best = k;
        }
        order[0] = best.index;
    } else if (m > 1) {
        /* Step 2b: sort every key, keep the first m. */
        rank_key stack[RANK_STACK];
        rank_key *keys = n <= RANK_STACK ? stack : malloc(n * sizeof *keys);
        if (keys == NULL)
            return KVP_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            keys[i] = rank_key_of(cfg, prompt_blocks, in, n, i, limit, least);
            within += !keys[i].over_cap;
        }
        qsort(keys, n, sizeof *keys, rank_key_cmp);
        for (size_t i = 0; i < m; i++)
            order[i] = keys[i].index;
        if (keys != stack)
            free(keys);
    } else {
        for (size_t i = 0; i < n; i++)
            within += !rank_key_of(cfg, prompt_blocks, in, n, i, limit, least).over_cap;
    }
    *n_order = m;
    if (n_within)
        *n_within = within;
    return KVP_OK;
}
