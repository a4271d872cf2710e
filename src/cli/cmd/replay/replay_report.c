/*
 * replay_report.c - print what `kvprefix replay` measured: a readable table (default), one
 * JSON document (--json, built with jansson) or CSV rows (--csv).
 *
 * Every rate is computed here from counts in rp_result, never carried as a float from the
 * engine, so the table, JSON and CSV always agree. Token hit rate = hit (skipped) tokens /
 * prompt tokens; block hit rate = blocks in the longest cached prefix / full prompt blocks;
 * the per-request figures are of hit tokens / prompt tokens per request.
 *
 * --policy adds each policy's figures (rp_result.pol_primary, pol_curve): a section of the
 * table, a "policies" array in JSON, "policy:capacity" and "policy:sweep" rows in CSV. A
 * policy's capacity misses are the full prompt blocks seen before that it did not have cached:
 * blocks - cold misses - cached, since cold misses (first sights) are the same under every
 * policy.
 */
#include <jansson.h>
#include <string.h>

#include "escape.h"
#include "flags.h"
#include "logread.h"
#include "replay.h"

/* Is policy pol among those --policy named? */
static bool rp_policy_shown(const rp_options *o, int pol)
{
    for (size_t k = 0; k < o->n_policies; k++)
        if (o->policies[k] == pol)
            return true;
    return false;
}

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static const char *dim_name(int d)
{
    return d == RP_DIM_MODEL ? "model" : d == RP_DIM_ADAPTER ? "adapter" : "tenant";
}

/* A dimension is shown when the log names it: more than one value, or one present value. */
static bool dim_shown(const rp_result *r, int d)
{
    size_t n = rp_sim_n_groups(r->sim, d), len;
    return n > 1 || (n == 1 && rp_sim_group_name(r->sim, d, 0, &len) != NULL);
}

/* Group ids of dimension d ordered by prompt tokens, largest first (caller frees). */
static size_t *order_groups(const rp_result *r, int d, size_t *n_out)
{
    size_t n = rp_sim_n_groups(r->sim, d);
    size_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return NULL;
    for (size_t i = 0; i < n; i++)
        ids[i] = i;
    /* Insertion sort on a copy of the key; group counts are small next to the log. */
    for (size_t i = 1; i < n; i++) {
        size_t v = ids[i], j = i;
        while (j > 0 &&
               r->groups[d][ids[j - 1]].n_prompt_tokens < r->groups[d][v].n_prompt_tokens) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = v;
    }
    *n_out = n;
    return ids;
}

/* Print a group's name, printable ASCII kept, other bytes as \xNN, at most width columns. */
static void print_name(FILE *f, const char *s, size_t len, int width)
{
    char buf[64];
    size_t j = 0;
    if (!s) {
        snprintf(buf, sizeof buf, "(none)");
        j = strlen(buf);
    }
    for (size_t i = 0; s && i < len && j + 5 < sizeof buf && (int)j < width; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f)
            buf[j++] = (char)c;
        else
            j += (size_t)snprintf(buf + j, sizeof buf - j, "\\x%02x", c);
    }
    buf[j] = '\0';
    fprintf(f, "  %-*s", width, buf);
}

static void capacity_desc(const rp_result *r, uint64_t cap, char *buf, size_t size)
{
    char a[32], b[32], c[32];
    if (cap == RP_CAP_INF) {
        snprintf(buf, size, "unbounded");
        return;
    }
    int n = snprintf(buf, size, "%s blocks (%s tokens", cli_fmt_count(cap, a, sizeof a),
                     cli_fmt_count(cap * r->block_size, b, sizeof b));
    if (r->block_bytes && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, "; %s of KV, %s",
                      cli_fmt_binary(cap * r->block_bytes, c, sizeof c), r->model_desc);
    if (n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ")");
}

static void print_metrics(FILE *f, const rp_result *r, const rp_metrics *m)
{
    char a[32], b[32];
    fprintf(f, "  prompt tokens            %s\n", cli_fmt_count(m->n_prompt_tokens, a, sizeof a));
    fprintf(f, "  hit (prefill skipped)    %s tokens   token hit rate %.1f%%\n",
            cli_fmt_count(m->n_hit_tokens, a, sizeof a),
            100.0 * ratio(m->n_hit_tokens, m->n_prompt_tokens));
    fprintf(f, "  full prompt blocks       %s, %s in a cached prefix   block hit rate %.1f%%\n",
            cli_fmt_count(m->n_blocks_full, a, sizeof a),
            cli_fmt_count(m->n_blocks_cached, b, sizeof b),
            100.0 * ratio(m->n_blocks_cached, m->n_blocks_full));
    fprintf(f, "  per-request hit          mean %.1f%%  p50 %.1f%%  p90 %.1f%%  p99 %.1f%%\n",
            100.0 * m->mean_hit, 100.0 * m->p50_hit, 100.0 * m->p90_hit, 100.0 * m->p99_hit);
    fprintf(f, "  missed blocks            %s cold (never seen: no cache could hit)\n",
            cli_fmt_count(m->n_cold_misses, a, sizeof a));
    fprintf(f, "                           %s capacity (seen before, evicted since)\n",
            cli_fmt_count(m->n_capacity_misses, a, sizeof a));
    fprintf(f,
            "  cold-miss ceiling        token hit rate %.1f%%, block hit rate %.1f%% "
            "(unbounded cache)\n",
            100.0 * ratio(r->ceiling.n_hit_tokens, r->ceiling.n_prompt_tokens),
            100.0 * ratio(r->ceiling.n_blocks_cached, r->ceiling.n_blocks_full));
    fprintf(f, "  blocks evicted           %s\n", cli_fmt_count(m->n_evicted, a, sizeof a));
    fprintf(f, "  distinct blocks seen     %s\n", cli_fmt_count(r->distinct, a, sizeof a));
}

/* Capacity misses of policy figures p over the requests of metrics m (see the header). */
static uint64_t pol_capacity_misses(const rp_metrics *m, const rp_pol_figs *p)
{
    uint64_t seen = m->n_blocks_full - m->n_cold_misses;
    return seen > p->n_blocks_cached ? seen - p->n_blocks_cached : 0;
}

/* The --policy section at the primary capacity. */
static void print_policies(FILE *f, const rp_options *o, const rp_result *r)
{
    const rp_metrics *m = &r->primary;
    const rp_pol_figs *opt = NULL;
    char a[32], b[32], c[32];
    char d[32];
    fprintf(f,
            "\nEviction policies at this capacity (lru: the figures above; slru, s3fifo, "
            "cdecay: the library's\npool; opt: the offline optimum%s; orphans: cached blocks "
            "whose parent is not, at the end)\n",
            rp_policy_shown(o, RP_POL_RETAIN) ? "; retain: LRU with retention priorities" : "");
    fprintf(f, "  %-8s %10s %16s %16s %14s %10s\n", "policy", "token hit", "hit tokens",
            "capacity misses", "evicted", "orphans");
    for (size_t k = 0; k < o->n_policies; k++) {
        const rp_pol_figs *p = &r->pol_primary[k];
        if (o->policies[k] == RP_POL_OPT)
            opt = p;
        fprintf(f, "  %-8s %9.1f%% %16s %16s %14s %10s\n", rp_pol_name(o->policies[k]),
                100.0 * ratio(p->n_hit_tokens, m->n_prompt_tokens),
                cli_fmt_count(p->n_hit_tokens, a, sizeof a),
                cli_fmt_count(pol_capacity_misses(m, p), b, sizeof b),
                cli_fmt_count(p->n_evicted, c, sizeof c),
                p->n_orphaned == UINT64_MAX ? "-" : cli_fmt_count(p->n_orphaned, d, sizeof d));
    }
    fprintf(f, "  cold-miss ceiling %.1f%% for every policy (%s cold misses)\n",
            100.0 * ratio(r->ceiling.n_hit_tokens, r->ceiling.n_prompt_tokens),
            cli_fmt_count(m->n_cold_misses, a, sizeof a));
    if (opt && opt->n_hit_tokens == 0)
        fprintf(f, "  no policy hits anything at this size (the optimum does not)\n");
    else if (opt)
        fprintf(f, "  LRU reaches %.1f%% of the optimum's hits at this size\n",
                100.0 * ratio(m->n_hit_tokens, opt->n_hit_tokens));
}

/* The --policy table of the sweep: token hit rate per policy and capacity. */
static void print_policy_curve(FILE *f, const rp_options *o, const rp_result *r)
{
    char a[32];
    fprintf(f, "\nToken hit rate per eviction policy (lru: the pass above; the others "
               "replayed once per capacity)\n");
    fprintf(f, "  %14s", "blocks");
    for (size_t k = 0; k < o->n_policies; k++)
        fprintf(f, " %10s", rp_pol_name(o->policies[k]));
    fputc('\n', f);
    for (size_t i = 0; i < r->n_curve; i++) {
        fprintf(f, "  %14s", cli_fmt_count(r->curve[i].capacity, a, sizeof a));
        for (size_t k = 0; k < o->n_policies; k++)
            fprintf(f, " %9.1f%%",
                    100.0 * ratio(r->pol_curve[i][k].n_hit_tokens, r->curve[i].n_prompt_tokens));
        fputc('\n', f);
    }
    fprintf(f, "  %14s", "unbounded");
    for (size_t k = 0; k < o->n_policies; k++)
        fprintf(f, " %9.1f%%", 100.0 * ratio(r->ceiling.n_hit_tokens, r->ceiling.n_prompt_tokens));
    fputc('\n', f);
}

static void print_groups(FILE *f, const rp_result *r, unsigned top)
{
    for (int d = 0; d < RP_N_DIMS; d++) {
        if (!dim_shown(r, d))
            continue;
        size_t n;
        size_t *ids = order_groups(r, d, &n);
        if (!ids)
            return;
        fprintf(f, "\nBy %s (%s)\n", dim_name(d),
                r->has_primary ? "at the capacity above" : "unbounded cache");
        fprintf(f, "  %-24s %9s %14s %10s %10s %9s\n", dim_name(d), "requests", "prompt tokens",
                "token hit", "block hit", "ceiling");
        for (size_t k = 0; k < n && k < top; k++) {
            const rp_group_metrics *g = &r->groups[d][ids[k]];
            const rp_group_metrics *c = &r->groups_ceil[d][ids[k]];
            size_t len;
            const char *name = rp_sim_group_name(r->sim, d, ids[k], &len);
            char a[32], b[32];
            print_name(f, name, len, 24);
            fprintf(f, " %9s %14s %9.1f%% %9.1f%% %8.1f%%\n",
                    cli_fmt_count(g->n_requests, a, sizeof a),
                    cli_fmt_count(g->n_prompt_tokens, b, sizeof b),
                    100.0 * ratio(g->n_hit_tokens, g->n_prompt_tokens),
                    100.0 * ratio(g->n_blocks_cached, g->n_blocks_full),
                    100.0 * ratio(c->n_hit_tokens, c->n_prompt_tokens));
        }
        if (n > top)
            fprintf(f, "  (%zu more; --top N shows more)\n", n - top);
        free(ids);
    }
}

static void print_curve(FILE *f, const rp_result *r)
{
    fprintf(f, "\nCapacity sweep (one pass over the log, from LRU stack distances)\n");
    fprintf(f, "  %14s %16s %12s %10s %10s %8s %14s\n", "blocks", "tokens",
            r->block_bytes ? "KV memory" : "", "token hit", "block hit", "req p50", "evicted");
    for (size_t i = 0; i <= r->n_curve; i++) {
        const rp_metrics *m = i < r->n_curve ? &r->curve[i] : &r->ceiling;
        char a[32], b[32], c[32], e[32];
        if (i < r->n_curve)
            fprintf(f, "  %14s %16s %12s", cli_fmt_count(m->capacity, a, sizeof a),
                    cli_fmt_count(m->capacity * r->block_size, b, sizeof b),
                    r->block_bytes ? cli_fmt_binary(m->capacity * r->block_bytes, c, sizeof c)
                                   : "");
        else
            fprintf(f, "  %14s %16s %12s", "unbounded", "", "");
        fprintf(f, " %9.1f%% %9.1f%% %7.1f%% %14s\n",
                100.0 * ratio(m->n_hit_tokens, m->n_prompt_tokens),
                100.0 * ratio(m->n_blocks_cached, m->n_blocks_full), 100.0 * m->p50_hit,
                cli_fmt_count(m->n_evicted, e, sizeof e));
    }
    char k[256];
    capacity_desc(r, r->knee_blocks, k, sizeof k);
    fprintf(f, "  within 1 point of the ceiling (%.1f%%) at %s\n",
            100.0 * ratio(r->ceiling.n_hit_tokens, r->ceiling.n_prompt_tokens), k);
}

static int print_table(FILE *f, const rp_options *o, const rp_result *r)
{
    char a[32], b[32], cap[256];
    const rp_metrics *base = r->has_primary ? &r->primary : &r->ceiling;
    fputs("kvprefix replay: ", f);
    cli_put_escaped(f, r->input, strlen(r->input));
    fputc('\n', f);
    fprintf(f, "  input                    %s, %s requests from %s lines, blocks of %u tokens\n",
            in_format_name(r->format), cli_fmt_count(base->n_requests, a, sizeof a),
            cli_fmt_count(r->n_lines, b, sizeof b), r->block_size);
    in_count_table(f, "  tokens                   ", &r->count);
    if (r->n_skipped) {
        fprintf(f,
                "  skipped lines            %s (first: ", cli_fmt_count(r->n_skipped, a, sizeof a));
        cli_put_escaped(f, r->first_skip, strlen(r->first_skip));
        fputs(")\n", f);
    }
    fprintf(f, "  order                    %s; LRU, tail blocks evicted first\n",
            o->sort ? "sorted by timestamp" : "file order");
    fprintf(f, "  block keys               --hash %s\n",
            kvp_hash_profile_name(o->hash_cfg.hash_profile));
    if (o->cache_output)
        fprintf(f, "  output blocks            cached for %s requests with output_tokens%s\n",
                cli_fmt_count(r->n_output_cached, a, sizeof a),
                r->format == LOG_MOONCAKE ? " (hash-id traces carry none)" : "");
    fprintf(f, "  time                     %.3f s, %.3f s of it in the cache and LRU model\n",
            r->seconds, r->seconds_engine);
    if (r->has_primary) {
        capacity_desc(r, r->primary.capacity, cap, sizeof cap);
        if (r->pool_blocks == r->primary.capacity)
            fprintf(f, "\nAt capacity %s, replayed through the library's pool\n", cap);
        else if (r->distinct <= r->pool_blocks)
            fprintf(f,
                    "\nAt capacity %s, replayed through the library's pool (%u blocks: more "
                    "than the log's %llu distinct blocks, so the same figures)\n",
                    cap, r->pool_blocks, (unsigned long long)r->distinct);
        else
            fprintf(f,
                    "\nAt capacity %s, from the LRU model (the library's pool checked the model "
                    "at %u blocks)\n",
                    cap, r->pool_blocks);
        print_metrics(f, r, &r->primary);
        if (rp_policies_shown(o))
            print_policies(f, o, r);
    } else {
        fprintf(f, "\nUnbounded cache (the cold-miss ceiling)\n");
        print_metrics(f, r, &r->ceiling);
    }
    print_groups(f, r, o->top);
    if (r->n_curve)
        print_curve(f, r);
    if (r->n_curve && rp_policies_shown(o))
        print_policy_curve(f, o, r);
    if (r->diag && rp_diag_print(r->diag, f, o->top) != 0)
        return -1;
    if (r->tiers && rp_tiers_print(f, r->tiers) != 0)
        return -1;
    fprintf(f, "\nThese are hit rates of this log replayed in order, warm cache included: not "
               "first-access rates.\nCold misses are first sights no capacity can avoid; "
               "capacity misses are prefixes seen before and evicted.\n");
    return ferror(f) ? -1 : 0;
}

/* ---- JSON ---------------------------------------------------------------------------------- */

static json_t *metrics_json(const rp_result *r, const rp_metrics *m)
{
    json_t *j = json_object();
    if (!j)
        return NULL;
    if (m->capacity == RP_CAP_INF) {
        json_object_set_new(j, "capacity_blocks", json_null());
    } else {
        json_object_set_new(j, "capacity_blocks", json_integer((json_int_t)m->capacity));
        json_object_set_new(j, "capacity_tokens",
                            json_integer((json_int_t)(m->capacity * r->block_size)));
        if (r->block_bytes)
            json_object_set_new(j, "capacity_bytes",
                                json_integer((json_int_t)(m->capacity * r->block_bytes)));
    }
    json_object_set_new(j, "requests", json_integer((json_int_t)m->n_requests));
    json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)m->n_prompt_tokens));
    json_object_set_new(j, "hit_tokens", json_integer((json_int_t)m->n_hit_tokens));
    json_object_set_new(j, "token_hit_rate", json_real(ratio(m->n_hit_tokens, m->n_prompt_tokens)));
    json_object_set_new(j, "blocks_full", json_integer((json_int_t)m->n_blocks_full));
    json_object_set_new(j, "blocks_cached", json_integer((json_int_t)m->n_blocks_cached));
    json_object_set_new(j, "blocks_hit", json_integer((json_int_t)m->n_blocks_hit));
    json_object_set_new(j, "block_hit_rate",
                        json_real(ratio(m->n_blocks_cached, m->n_blocks_full)));
    json_object_set_new(j, "mean_request_hit", json_real(m->mean_hit));
    json_object_set_new(j, "p50_request_hit", json_real(m->p50_hit));
    json_object_set_new(j, "p90_request_hit", json_real(m->p90_hit));
    json_object_set_new(j, "p99_request_hit", json_real(m->p99_hit));
    json_object_set_new(j, "cold_misses", json_integer((json_int_t)m->n_cold_misses));
    json_object_set_new(j, "capacity_misses", json_integer((json_int_t)m->n_capacity_misses));
    json_object_set_new(j, "blocks_stored", json_integer((json_int_t)m->n_stored));
    json_object_set_new(j, "blocks_evicted", json_integer((json_int_t)m->n_evicted));
    return j;
}

/* A policy's figures p over the requests of metrics m. */
static json_t *pol_figs_json(const rp_result *r, const rp_metrics *m, const rp_pol_figs *p)
{
    json_t *j = json_object();
    if (!j)
        return NULL;
    json_object_set_new(j, "capacity_blocks", json_integer((json_int_t)p->capacity));
    json_object_set_new(j, "capacity_tokens",
                        json_integer((json_int_t)(p->capacity * r->block_size)));
    json_object_set_new(j, "hit_tokens", json_integer((json_int_t)p->n_hit_tokens));
    json_object_set_new(j, "token_hit_rate", json_real(ratio(p->n_hit_tokens, m->n_prompt_tokens)));
    json_object_set_new(j, "blocks_cached", json_integer((json_int_t)p->n_blocks_cached));
    json_object_set_new(j, "blocks_hit", json_integer((json_int_t)p->n_blocks_hit));
    json_object_set_new(j, "block_hit_rate",
                        json_real(ratio(p->n_blocks_cached, m->n_blocks_full)));
    json_object_set_new(j, "cold_misses", json_integer((json_int_t)m->n_cold_misses));
    json_object_set_new(j, "capacity_misses", json_integer((json_int_t)pol_capacity_misses(m, p)));
    json_object_set_new(j, "blocks_evicted", json_integer((json_int_t)p->n_evicted));
    if (p->n_orphaned != UINT64_MAX)
        json_object_set_new(j, "blocks_orphaned", json_integer((json_int_t)p->n_orphaned));
    return j;
}

/* The --policy array: one object per policy, at the capacity and along the sweep. */
static json_t *policies_json(const rp_options *o, const rp_result *r)
{
    json_t *arr = json_array();
    for (size_t k = 0; arr && k < o->n_policies; k++) {
        json_t *p = json_object();
        json_object_set_new(p, "policy", json_string(rp_pol_name(o->policies[k])));
        if (r->has_primary)
            json_object_set_new(p, "capacity", pol_figs_json(r, &r->primary, &r->pol_primary[k]));
        if (r->n_curve) {
            json_t *sw = json_array();
            for (size_t i = 0; sw && i < r->n_curve; i++)
                json_array_append_new(sw, pol_figs_json(r, &r->curve[i], &r->pol_curve[i][k]));
            json_object_set_new(p, "sweep", sw);
        }
        json_array_append_new(arr, p);
    }
    return arr;
}

static json_t *name_json(const char *s, size_t len)
{
    json_t *v = s ? json_stringn(s, len) : json_null();
    return v ? v : json_null();
}

static json_t *groups_json(const rp_result *r)
{
    json_t *all = json_object();
    for (int d = 0; all && d < RP_N_DIMS; d++) {
        if (!dim_shown(r, d))
            continue;
        json_t *arr = json_array();
        size_t n;
        size_t *ids = order_groups(r, d, &n);
        for (size_t k = 0; arr && ids && k < n; k++) {
            const rp_group_metrics *g = &r->groups[d][ids[k]];
            const rp_group_metrics *c = &r->groups_ceil[d][ids[k]];
            size_t len;
            const char *name = rp_sim_group_name(r->sim, d, ids[k], &len);
            json_t *o = json_object();
            json_object_set_new(o, "name", name_json(name, len));
            json_object_set_new(o, "requests", json_integer((json_int_t)g->n_requests));
            json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)g->n_prompt_tokens));
            json_object_set_new(o, "hit_tokens", json_integer((json_int_t)g->n_hit_tokens));
            json_object_set_new(o, "token_hit_rate",
                                json_real(ratio(g->n_hit_tokens, g->n_prompt_tokens)));
            json_object_set_new(o, "block_hit_rate",
                                json_real(ratio(g->n_blocks_cached, g->n_blocks_full)));
            json_object_set_new(o, "cold_misses", json_integer((json_int_t)g->n_cold_misses));
            json_object_set_new(o, "ceiling_token_hit_rate",
                                json_real(ratio(c->n_hit_tokens, c->n_prompt_tokens)));
            json_array_append_new(arr, o);
        }
        free(ids);
        json_object_set_new(all, dim_name(d), arr);
    }
    return all;
}

static int print_json(FILE *f, const rp_options *o, const rp_result *r)
{
    json_t *j = json_object();
    if (!j)
        return -1;
    json_object_set_new(j, "input", name_json(r->input, strlen(r->input)));
    json_object_set_new(j, "format", json_string(in_format_name(r->format)));
    json_object_set_new(j, "block_size", json_integer(r->block_size));
    in_count_json(j, &r->count);
    json_object_set_new(j, "order", json_string(o->sort ? "timestamp" : "file"));
    json_object_set_new(j, "hash", json_string(kvp_hash_profile_name(o->hash_cfg.hash_profile)));
    json_object_set_new(j, "lines", json_integer((json_int_t)r->n_lines));
    json_object_set_new(j, "skipped_lines", json_integer((json_int_t)r->n_skipped));
    if (r->n_skipped)
        json_object_set_new(j, "first_skipped", json_string(r->first_skip));
    if (r->block_bytes) {
        json_object_set_new(j, "model", json_string(r->model_desc));
        json_object_set_new(j, "block_bytes", json_integer((json_int_t)r->block_bytes));
    }
    json_object_set_new(j, "distinct_blocks", json_integer((json_int_t)r->distinct));
    json_object_set_new(j, "seconds", json_real(r->seconds));
    json_object_set_new(j, "seconds_engine", json_real(r->seconds_engine));
    if (r->has_primary) {
        json_object_set_new(j, "capacity", metrics_json(r, &r->primary));
        json_object_set_new(j, "pool_blocks", json_integer((json_int_t)r->pool_blocks));
    }
    json_object_set_new(j, "ceiling", metrics_json(r, &r->ceiling));
    if (r->n_curve) {
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < r->n_curve; i++)
            json_array_append_new(arr, metrics_json(r, &r->curve[i]));
        json_object_set_new(j, "sweep", arr);
        json_object_set_new(j, "knee_blocks", json_integer((json_int_t)r->knee_blocks));
    }
    if (rp_policies_shown(o)) {
        json_object_set_new(j, "policies", policies_json(o, r));
        for (size_t k = 0; r->has_primary && k < o->n_policies; k++)
            if (o->policies[k] == RP_POL_OPT && r->pol_primary[k].n_hit_tokens > 0)
                json_object_set_new(
                    j, "lru_share_of_optimum",
                    json_real(ratio(r->primary.n_hit_tokens, r->pol_primary[k].n_hit_tokens)));
    }
    json_object_set_new(j, "breakdown", groups_json(r));
    if (r->diag)
        json_object_set_new(j, "diagnose", rp_diag_json(r->diag, o->top));
    if (r->tiers)
        json_object_set_new(j, "tiers", rp_tiers_json(r->tiers));
    int rc = json_dumpf(j, f, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    json_decref(j);
    fputc('\n', f);
    return rc == 0 && !ferror(f) ? 0 : -1;
}

/* ---- CSV ----------------------------------------------------------------------------------- */

/* Replay's own columns; --tiers adds its own after them (rp_tiers_csv_header). */
#define CSV_N_COLS 19

/* End a row that is not a tier row: the tier columns empty when there are any. */
static void row_end(FILE *f, const rp_result *r)
{
    if (r->tiers)
        rp_tiers_csv_empty(f);
    fputc('\n', f);
}

static void csv_metrics(FILE *f, const rp_result *r, const char *kind, const rp_metrics *m)
{
    fprintf(f, "all,%s,", kind);
    if (m->capacity == RP_CAP_INF)
        fputs(",,", f);
    else if (r->block_bytes)
        fprintf(f, "%llu,%llu,%llu", (unsigned long long)m->capacity,
                (unsigned long long)(m->capacity * r->block_size),
                (unsigned long long)(m->capacity * r->block_bytes));
    else
        fprintf(f, "%llu,%llu,", (unsigned long long)m->capacity,
                (unsigned long long)(m->capacity * r->block_size));
    fprintf(f, ",%llu,%llu,%llu,%.6f,%llu,%llu,%.6f,%.6f,%.6f,%.6f,%.6f,%llu,%llu,%llu",
            (unsigned long long)m->n_requests, (unsigned long long)m->n_prompt_tokens,
            (unsigned long long)m->n_hit_tokens, ratio(m->n_hit_tokens, m->n_prompt_tokens),
            (unsigned long long)m->n_blocks_full, (unsigned long long)m->n_blocks_cached,
            ratio(m->n_blocks_cached, m->n_blocks_full), m->mean_hit, m->p50_hit, m->p90_hit,
            m->p99_hit, (unsigned long long)m->n_cold_misses,
            (unsigned long long)m->n_capacity_misses, (unsigned long long)m->n_evicted);
    row_end(f, r);
}

/* A --policy row: its kind ("capacity" or "sweep"), the policy's figures p over metrics m. */
static void csv_policy(FILE *f, const rp_result *r, const char *kind, int pol, const rp_metrics *m,
                       const rp_pol_figs *p)
{
    fprintf(f, "policy:%s,%s,%llu,%llu,", kind, rp_pol_name(pol), (unsigned long long)p->capacity,
            (unsigned long long)(p->capacity * r->block_size));
    if (r->block_bytes)
        fprintf(f, "%llu", (unsigned long long)(p->capacity * r->block_bytes));
    fprintf(f, ",%llu,%llu,%llu,%.6f,%llu,%llu,%.6f,,,,,%llu,%llu,%llu",
            (unsigned long long)m->n_requests, (unsigned long long)m->n_prompt_tokens,
            (unsigned long long)p->n_hit_tokens, ratio(p->n_hit_tokens, m->n_prompt_tokens),
            (unsigned long long)m->n_blocks_full, (unsigned long long)p->n_blocks_cached,
            ratio(p->n_blocks_cached, m->n_blocks_full), (unsigned long long)m->n_cold_misses,
            (unsigned long long)pol_capacity_misses(m, p), (unsigned long long)p->n_evicted);
    row_end(f, r);
}

static int print_csv(FILE *f, const rp_options *o, const rp_result *r)
{
    fputs("dimension,value,capacity_blocks,capacity_tokens,capacity_bytes,requests,"
          "prompt_tokens,hit_tokens,token_hit_rate,blocks_full,blocks_cached,block_hit_rate,"
          "mean_request_hit,p50_request_hit,p90_request_hit,p99_request_hit,cold_misses,"
          "capacity_misses,blocks_evicted",
          f);
    if (r->tiers)
        rp_tiers_csv_header(f);
    fputc('\n', f);
    if (r->has_primary)
        csv_metrics(f, r, "capacity", &r->primary);
    csv_metrics(f, r, "ceiling", &r->ceiling);
    for (size_t i = 0; i < r->n_curve; i++)
        csv_metrics(f, r, "sweep", &r->curve[i]);
    for (size_t k = 0; rp_policies_shown(o) && k < o->n_policies; k++) {
        if (r->has_primary)
            csv_policy(f, r, "capacity", o->policies[k], &r->primary, &r->pol_primary[k]);
        for (size_t i = 0; i < r->n_curve; i++)
            csv_policy(f, r, "sweep", o->policies[k], &r->curve[i], &r->pol_curve[i][k]);
    }
    for (int d = 0; d < RP_N_DIMS; d++) {
        if (!dim_shown(r, d))
            continue;
        for (size_t k = 0; k < rp_sim_n_groups(r->sim, d); k++) {
            const rp_group_metrics *g = &r->groups[d][k];
            size_t len;
            const char *name = rp_sim_group_name(r->sim, d, k, &len);
            fprintf(f, "%s,", dim_name(d));
            if (name)
                cli_csv_field(f, name, len);
            if (r->has_primary)
                fprintf(f, ",%llu,%llu,", (unsigned long long)r->primary.capacity,
                        (unsigned long long)(r->primary.capacity * r->block_size));
            else
                fputs(",,,", f);
            if (r->has_primary && r->block_bytes)
                fprintf(f, "%llu", (unsigned long long)(r->primary.capacity * r->block_bytes));
            fprintf(f, ",%llu,%llu,%llu,%.6f,%llu,%llu,%.6f,,,,,%llu,,",
                    (unsigned long long)g->n_requests, (unsigned long long)g->n_prompt_tokens,
                    (unsigned long long)g->n_hit_tokens, ratio(g->n_hit_tokens, g->n_prompt_tokens),
                    (unsigned long long)g->n_blocks_full, (unsigned long long)g->n_blocks_cached,
                    ratio(g->n_blocks_cached, g->n_blocks_full),
                    (unsigned long long)g->n_cold_misses);
            row_end(f, r);
        }
    }
    if (r->tiers && rp_tiers_csv(f, r->tiers, CSV_N_COLS) != 0)
        return -1;
    return ferror(f) ? -1 : 0;
}

int rp_report(FILE *f, const rp_options *o, const rp_result *r)
{
    if (o->json)
        return print_json(f, o, r);
    if (o->csv)
        return print_csv(f, o, r);
    return print_table(f, o, r);
}
