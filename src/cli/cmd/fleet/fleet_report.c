/*
 * fleet_report.c - print what `kvprefix fleet` measured: a table (default), one JSON
 * document (--json, built with jansson) or CSV rows (--csv), and the SVG chart (--plot).
 *
 * Every rate is computed here from the counts in fl_result, so the three formats agree:
 * fleet token hit rate = hit tokens / prompt tokens over all replicas; a replica's hit rate
 * the same over its own requests; imbalance = max / mean busy time over replicas; TTFT
 * percentiles are nearest-rank over all requests. The gain of cache-aware over round-robin
 * (when both ran) is the hit-rate difference in percentage points, the ratio of hit rates,
 * and the ratios of round-robin's TTFT percentiles to cache-aware's (above 1: cache-aware
 * is faster).
 *
 * The router index section (runs of the cache-aware policies) is the only part measured in
 * real time: the wall-clock time of each routing decision's prefix query (the oracle's N
 * kvp_lookup_keys calls, or one kvp_router_score_hashes), of the index's applies, and the
 * whole simulation's. Everything else is modelled time. CSV leaves it out, so that CSV
 * output stays a pure function of the input and options.
 */
#include <jansson.h>
#include <string.h>

#include "escape.h"
#include "flags.h"
#include "logread.h"
#include "fleet.h"
#include "svgplot.h"

static double ratio(double a, double b)
{
    return b != 0.0 ? a / b : 0.0;
}

static double hit_rate(const fl_result *r)
{
    return ratio((double)r->n_hit_tokens, (double)r->n_prompt_tokens);
}

static double rep_rate(const fl_replica_stats *s)
{
    return ratio((double)s->n_hit_tokens, (double)s->n_prompt_tokens);
}

/* A duration in ns as "12.3 ms", "4.56 s" or "7,890 s". */
static const char *dur(double ns, char *buf, size_t size)
{
    char n[32];
    if (ns < 1e9)
        snprintf(buf, size, "%.1f ms", ns / 1e6);
    else if (ns < 1e12)
        snprintf(buf, size, "%.2f s", ns / 1e9);
    else
        snprintf(buf, size, "%s s", cli_fmt_count((uint64_t)(ns / 1e9), n, sizeof n));
    return buf;
}

/* The slot of count index k and policy p (all zero when that pair did not run). */
static const fl_result *slot(const fl_report *r, size_t k, int p)
{
    return &r->runs[k * FL_N_POLICIES + (size_t)p];
}

/* The run of count index k and policy p, or NULL when it did not run. */
/* The name of a replica cache's eviction policy (kvp_config.eviction), as --eviction takes it.
 * Cannot fail. */
static const char *eviction_name(int eviction)
{
    switch (eviction) {
    case KVP_EVICT_SLRU:
        return "slru";
    case KVP_EVICT_S3FIFO:
        return "s3fifo";
    case KVP_EVICT_CDECAY:
        return "cdecay";
    default:
        return "lru";
    }
}

static const fl_result *run_at(const fl_options *o, const fl_report *r, size_t k, int p)
{
    const fl_result *x = slot(r, k, p);
    return o->policies[p] && x->n_replicas ? x : NULL;
}

static void rep_range(const fl_result *x, double *lo, double *hi)
{
    *lo = 1.0;
    *hi = 0.0;
    for (uint32_t i = 0; i < x->n_replicas; i++) {
        double v = rep_rate(&x->replicas[i]);
        *lo = v < *lo ? v : *lo;
        *hi = v > *hi ? v : *hi;
    }
}

/* ---- the router index ---------------------------------------------------------------------- */

static double per_second(uint64_t n, uint64_t ns)
{
    return ns ? (double)n * 1e9 / (double)ns : 0.0;
}

static bool any_scores(const fl_options *o, const fl_report *r)
{
    for (size_t k = 0; k < o->n_counts; k++)
        for (int p = 0; p < FL_N_POLICIES; p++)
            if (run_at(o, r, k, p) && slot(r, k, p)->index.n_scores)
                return true;
    return false;
}

static void table_index_head(FILE *f, const fl_options *o, const fl_report *r)
{
    int mode = o->index.mode;
    fprintf(f, "\nrouter index: %s", fl_index_name(mode));
    if (mode == FL_INDEX_ORACLE)
        fprintf(f, " (a score is one kvp_lookup_keys per replica)\n");
    else
        fprintf(f, " (kvp_router fed by the replicas' events, %.6g ms after they happen%s%s)\n",
                (double)o->index.event_delay / 1e6, mode == FL_INDEX_REDIS ? "; keys " : "",
                mode == FL_INDEX_REDIS ? r->redis_prefix : "");
    fprintf(f, "  REAL wall-clock times on this machine (the TTFT above is modelled time)\n");
    fprintf(f, "%8s  %-16s %8s %8s %10s %10s %10s %11s %9s", "replicas", "policy", "wall", "scores",
            "score p50", "score p99", "score max", "applies/s", "events");
    if (mode == FL_INDEX_REDIS)
        fprintf(f, " %11s %9s", "calls/score", "fallback");
    fputc('\n', f);
}

static void table_index(FILE *f, const fl_options *o, const fl_report *r)
{
    char a[32];
    if (!any_scores(o, r))
        return;
    table_index_head(f, o, r);
    for (size_t k = 0; k < o->n_counts; k++)
        for (int p = 0; p < FL_N_POLICIES; p++) {
            const fl_result *x = run_at(o, r, k, p);
            if (!x || !x->index.n_scores)
                continue;
            const fl_index_stats *s = &x->index;
            fprintf(f, "%8u  %-16s %7.2fs %8s %8.1fus %8.1fus %8.1fus", x->n_replicas,
                    fl_policy_name(p), s->seconds, cli_fmt_count(s->n_scores, a, sizeof a),
                    (double)s->score_p50_ns / 1e3, (double)s->score_p99_ns / 1e3,
                    (double)s->score_max_ns / 1e3);
            if (o->index.mode == FL_INDEX_ORACLE)
                fprintf(f, " %11s %9s", "-", "-");
            else
                fprintf(f, " %11.0f %9s", per_second(s->n_applies, s->apply_ns),
                        cli_fmt_count(s->n_events, a, sizeof a));
            if (o->index.mode == FL_INDEX_REDIS)
                fprintf(f, " %11.2f %9llu", ratio((double)s->n_score_calls, (double)s->n_scores),
                        (unsigned long long)s->n_fallback_scores +
                            (unsigned long long)s->n_fallback_applies);
            fputc('\n', f);
        }
}

/* ---- table -------------------------------------------------------------------------------- */

static void table_head(FILE *f, const fl_options *o, const fl_report *r)
{
    char a[32], b[32], c[32];
    fputs("kvprefix fleet: ", f);
    cli_put_escaped(f, r->input, strlen(r->input));
    fprintf(f, " (%s)\n", in_format_name(r->format));
    fprintf(f, "  requests        %s (%s prompt tokens), blocks of %u tokens\n",
            cli_fmt_count(r->n_requests, a, sizeof a),
            cli_fmt_count(r->n_prompt_tokens, b, sizeof b), r->block_size);
    in_count_table(f, "  tokens          ", &r->count);
    fprintf(f, "  per replica     %s blocks (%s tokens", cli_fmt_count(r->capacity, a, sizeof a),
            cli_fmt_count(r->capacity * r->block_size, b, sizeof b));
    if (r->block_bytes)
        fprintf(f, "; %s of KV, %s", cli_fmt_binary(r->capacity * r->block_bytes, c, sizeof c),
                r->model_desc);
    if (o->cache.eviction != KVP_EVICT_LRU) /* LRU's report stays as it was before --eviction */
        fprintf(f, "; %s eviction", eviction_name(o->cache.eviction));
    fprintf(f, ")\n");
    fprintf(f,
            "  time model      concurrency %u; prefill %.6g us per uncached prompt token, "
            "decode %.6g us per output token\n",
            o->model.concurrency, (double)o->model.prefill_ns / 1e3,
            (double)o->model.decode_ns / 1e3);
    if (r->timestamps)
        fprintf(f, "  arrivals        the log's timestamps (ms)\n");
    else
        fprintf(f, "  arrivals        timestamps where given, else %.6g ms after the previous\n",
                (double)o->log.interarrival / 1e6);
    fprintf(f,
            "  policies        cache-aware-cap skips replicas above %.3g x the mean outstanding "
            "work; affinity hashes the first %u block%s (%u ring points per replica)\n\n",
            o->model.load_cap, o->model.affinity_blocks, o->model.affinity_blocks == 1 ? "" : "s",
            o->model.vnodes);
}

static void table_runs(FILE *f, const fl_options *o, const fl_report *r, uint64_t *oversize,
                       uint64_t *waits)
{
    char a[32], b[32], c[32];
    fprintf(f, "%8s  %-16s %8s  %-17s %9s %11s %11s %11s\n", "replicas", "policy", "hit rate",
            "replica min..max", "imbalance", "TTFT p50", "TTFT p99", "TTFT mean");
    for (size_t k = 0; k < o->n_counts; k++)
        for (int p = 0; p < FL_N_POLICIES; p++) {
            const fl_result *x = run_at(o, r, k, p);
            if (!x)
                continue;
            double lo, hi;
            rep_range(x, &lo, &hi);
            char range[32];
            snprintf(range, sizeof range, "%.1f%%..%.1f%%", lo * 100.0, hi * 100.0);
            fprintf(f, "%8u  %-16s %7.1f%%  %-17s %9.2f %11s %11s %11s\n", x->n_replicas,
                    fl_policy_name(p), hit_rate(x) * 100.0, range, x->imbalance,
                    dur((double)x->ttft_p50, a, sizeof a), dur((double)x->ttft_p99, b, sizeof b),
                    dur(x->ttft_mean, c, sizeof c));
            *oversize += x->n_oversize;
            *waits += x->n_block_waits;
        }
}

static void table_gain(FILE *f, const fl_options *o, const fl_report *r)
{
    if (!o->policies[FL_ROUND_ROBIN] || !o->policies[FL_CACHE_AWARE])
        return;
    fprintf(f, "\ngain of cache-aware over round-robin (TTFT: round-robin's / cache-aware's)\n");
    fprintf(f, "%8s  %-22s %10s %10s\n", "replicas", "hit rate", "TTFT p50", "TTFT p99");
    for (size_t k = 0; k < o->n_counts; k++) {
        const fl_result *rr = slot(r, k, FL_ROUND_ROBIN), *ca = slot(r, k, FL_CACHE_AWARE);
        char g[48];
        snprintf(g, sizeof g, "%+.1f pp (x%.2f)", (hit_rate(ca) - hit_rate(rr)) * 100.0,
                 ratio(hit_rate(ca), hit_rate(rr)));
        fprintf(f, "%8u  %-22s %9.2fx %9.2fx\n", rr->n_replicas, g,
                ratio((double)rr->ttft_p50, (double)ca->ttft_p50),
                ratio((double)rr->ttft_p99, (double)ca->ttft_p99));
    }
}

static void table(FILE *f, const fl_options *o, const fl_report *r)
{
    uint64_t oversize = 0, waits = 0;
    table_head(f, o, r);
    table_runs(f, o, r, &oversize, &waits);
    table_gain(f, o, r);
    table_index(f, o, r);
    if (r->tiers.figs)
        fl_tiers_print(f, &r->tiers.setup, r->runs, r->tiers.runs, r->tiers.figs,
                       o->n_counts * FL_N_POLICIES);
    if (oversize)
        fprintf(f,
                "\n%llu request runs needed more blocks than a replica has: served without "
                "the cache\n",
                (unsigned long long)oversize);
    if (waits)
        fprintf(f, "%s%llu request starts waited for in-flight requests to free blocks\n",
                oversize ? "" : "\n", (unsigned long long)waits);
    fprintf(f, "\n%.2f s (simulation %.2f s)\n", r->seconds, r->seconds_sim);
}

/* ---- JSON --------------------------------------------------------------------------------- */

static json_t *model_json(const fl_options *o, const fl_report *r)
{
    json_t *m = json_object();
    json_object_set_new(m, "concurrency", json_integer(o->model.concurrency));
    json_object_set_new(m, "prefill_us_per_token", json_real((double)o->model.prefill_ns / 1e3));
    json_object_set_new(m, "decode_us_per_token", json_real((double)o->model.decode_ns / 1e3));
    json_object_set_new(m, "arrivals", json_string(r->timestamps ? "timestamps" : "mixed"));
    json_object_set_new(m, "interarrival_ms", json_real((double)o->log.interarrival / 1e6));
    json_object_set_new(m, "default_output_tokens", json_integer(o->log.default_output));
    json_object_set_new(m, "load_cap", json_real(o->model.load_cap));
    json_object_set_new(m, "overlap_weight_ns", json_real(o->model.overlap_weight));
    json_object_set_new(m, "vnodes", json_integer(o->model.vnodes));
    json_object_set_new(m, "affinity_blocks", json_integer(o->model.affinity_blocks));
    json_object_set_new(m, "random_seed", json_integer((json_int_t)o->model.random_seed));
    json_object_set_new(m, "index", json_string(fl_index_name(o->index.mode)));
    if (o->index.mode != FL_INDEX_ORACLE)
        json_object_set_new(m, "event_delay_ms", json_real((double)o->index.event_delay / 1e6));
    if (o->index.mode == FL_INDEX_REDIS)
        json_object_set_new(m, "redis_prefix", json_string(r->redis_prefix));
    return m;
}

static json_t *index_json(const fl_index_stats *s)
{
    json_t *j = json_object();
    json_object_set_new(j, "index", json_string(fl_index_name(s->mode)));
    json_object_set_new(j, "wall_seconds", json_real(s->seconds));
    json_object_set_new(j, "scores", json_integer((json_int_t)s->n_scores));
    json_object_set_new(j, "score_p50_us", json_real((double)s->score_p50_ns / 1e3));
    json_object_set_new(j, "score_p99_us", json_real((double)s->score_p99_ns / 1e3));
    json_object_set_new(j, "score_max_us", json_real((double)s->score_max_ns / 1e3));
    json_object_set_new(j, "score_mean_us",
                        json_real(ratio((double)s->score_ns / 1e3, (double)s->n_scores)));
    json_object_set_new(j, "applies", json_integer((json_int_t)s->n_applies));
    json_object_set_new(j, "apply_seconds", json_real((double)s->apply_ns / 1e9));
    json_object_set_new(j, "applies_per_second", json_real(per_second(s->n_applies, s->apply_ns)));
    json_object_set_new(j, "events_applied", json_integer((json_int_t)s->n_events));
    json_object_set_new(j, "event_blocks", json_integer((json_int_t)s->n_blocks));
    if (s->mode == FL_INDEX_REDIS) {
        json_object_set_new(j, "redis_calls", json_integer((json_int_t)s->n_redis_calls));
        json_object_set_new(j, "redis_calls_per_score",
                            json_real(ratio((double)s->n_score_calls, (double)s->n_scores)));
        json_object_set_new(j, "redis_calls_per_apply",
                            json_real(ratio((double)s->n_apply_calls, (double)s->n_applies)));
        json_object_set_new(j, "redis_errors", json_integer((json_int_t)s->n_redis_errors));
        json_object_set_new(j, "fallback_scores", json_integer((json_int_t)s->n_fallback_scores));
        json_object_set_new(j, "fallback_applies", json_integer((json_int_t)s->n_fallback_applies));
    }
    return j;
}

static json_t *run_json(const fl_result *x)
{
    json_t *j = json_object(), *reps = json_array();
    json_object_set_new(j, "replicas", json_integer(x->n_replicas));
    json_object_set_new(j, "policy", json_string(fl_policy_name(x->policy)));
    json_object_set_new(j, "requests", json_integer((json_int_t)x->n_requests));
    json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)x->n_prompt_tokens));
    json_object_set_new(j, "hit_tokens", json_integer((json_int_t)x->n_hit_tokens));
    json_object_set_new(j, "token_hit_rate", json_real(hit_rate(x)));
    json_object_set_new(j, "imbalance", json_real(x->imbalance));
    json_object_set_new(j, "ttft_p50_ms", json_real((double)x->ttft_p50 / 1e6));
    json_object_set_new(j, "ttft_p99_ms", json_real((double)x->ttft_p99 / 1e6));
    json_object_set_new(j, "ttft_mean_ms", json_real(x->ttft_mean / 1e6));
    json_object_set_new(j, "end_s", json_real((double)x->end / 1e9));
    json_object_set_new(j, "oversize", json_integer((json_int_t)x->n_oversize));
    json_object_set_new(j, "block_waits", json_integer((json_int_t)x->n_block_waits));
    for (uint32_t i = 0; i < x->n_replicas; i++) {
        const fl_replica_stats *s = &x->replicas[i];
        json_t *e = json_object();
        json_object_set_new(e, "requests", json_integer((json_int_t)s->n_requests));
        json_object_set_new(e, "prompt_tokens", json_integer((json_int_t)s->n_prompt_tokens));
        json_object_set_new(e, "hit_tokens", json_integer((json_int_t)s->n_hit_tokens));
        json_object_set_new(e, "token_hit_rate", json_real(rep_rate(s)));
        json_object_set_new(e, "busy_s", json_real((double)s->busy / 1e9));
        json_array_append_new(reps, e);
    }
    json_object_set_new(j, "per_replica", reps);
    if (x->index.n_scores)
        json_object_set_new(j, "router_index", index_json(&x->index));
    return j;
}

static json_t *gain_json(const fl_options *o, const fl_report *r)
{
    json_t *a = json_array();
    for (size_t k = 0;
         o->policies[FL_ROUND_ROBIN] && o->policies[FL_CACHE_AWARE] && k < o->n_counts; k++) {
        const fl_result *rr = slot(r, k, FL_ROUND_ROBIN), *ca = slot(r, k, FL_CACHE_AWARE);
        json_t *g = json_object();
        json_object_set_new(g, "replicas", json_integer(rr->n_replicas));
        json_object_set_new(g, "hit_rate_pp", json_real((hit_rate(ca) - hit_rate(rr)) * 100.0));
        json_object_set_new(g, "hit_rate_ratio", json_real(ratio(hit_rate(ca), hit_rate(rr))));
        json_object_set_new(g, "ttft_p50_speedup",
                            json_real(ratio((double)rr->ttft_p50, (double)ca->ttft_p50)));
        json_object_set_new(g, "ttft_p99_speedup",
                            json_real(ratio((double)rr->ttft_p99, (double)ca->ttft_p99)));
        json_array_append_new(a, g);
    }
    return a;
}

static int json_report(FILE *f, const fl_options *o, const fl_report *r)
{
    json_t *j = json_object(), *runs = json_array();
    json_object_set_new(j, "input", json_string(r->input));
    json_object_set_new(j, "format", json_string(in_format_name(r->format)));
    json_object_set_new(j, "lines", json_integer((json_int_t)r->n_lines));
    json_object_set_new(j, "requests", json_integer((json_int_t)r->n_requests));
    json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)r->n_prompt_tokens));
    in_count_json(j, &r->count);
    json_object_set_new(j, "block_size", json_integer(r->block_size));
    json_object_set_new(j, "capacity_blocks", json_integer((json_int_t)r->capacity));
    json_object_set_new(j, "eviction", json_string(eviction_name(o->cache.eviction)));
    if (r->block_bytes) {
        json_object_set_new(j, "capacity_bytes",
                            json_integer((json_int_t)r->capacity * (json_int_t)r->block_bytes));
        json_object_set_new(j, "kv_model", json_string(r->model_desc));
    }
    json_object_set_new(j, "model", model_json(o, r));
    for (size_t k = 0; k < o->n_counts; k++)
        for (int p = 0; p < FL_N_POLICIES; p++)
            if (run_at(o, r, k, p))
                json_array_append_new(runs, run_json(slot(r, k, p)));
    json_object_set_new(j, "runs", runs);
    json_object_set_new(j, "gain_cache_aware_over_round_robin", gain_json(o, r));
    if (r->tiers.figs)
        json_object_set_new(j, "tiers",
                            fl_tiers_json(&r->tiers.setup, r->runs, r->tiers.runs, r->tiers.figs,
                                          o->n_counts * FL_N_POLICIES));
    json_object_set_new(j, "seconds", json_real(r->seconds));
    json_object_set_new(j, "seconds_simulation", json_real(r->seconds_sim));
    int rc = json_dumpf(j, f, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    json_decref(j);
    fputc('\n', f);
    return rc;
}

/* ---- CSV ---------------------------------------------------------------------------------- */

static void csv(FILE *f, const fl_options *o, const fl_report *r)
{
    fputs("replicas,policy,requests,prompt_tokens,hit_tokens,token_hit_rate,replica_hit_min,"
          "replica_hit_max,imbalance,ttft_p50_ms,ttft_p99_ms,ttft_mean_ms,oversize,block_waits\n",
          f);
    for (size_t k = 0; k < o->n_counts; k++)
        for (int p = 0; p < FL_N_POLICIES; p++) {
            const fl_result *x = run_at(o, r, k, p);
            if (!x)
                continue;
            double lo, hi;
            rep_range(x, &lo, &hi);
            fprintf(f, "%u,%s,%llu,%llu,%llu,%.6f,%.6f,%.6f,%.4f,%.3f,%.3f,%.3f,%llu,%llu\n",
                    x->n_replicas, fl_policy_name(p), (unsigned long long)x->n_requests,
                    (unsigned long long)x->n_prompt_tokens, (unsigned long long)x->n_hit_tokens,
                    hit_rate(x), lo, hi, x->imbalance, (double)x->ttft_p50 / 1e6,
                    (double)x->ttft_p99 / 1e6, x->ttft_mean / 1e6,
                    (unsigned long long)x->n_oversize, (unsigned long long)x->n_block_waits);
        }
}

int fl_report_write(FILE *f, const fl_options *o, const fl_report *r)
{
    if (o->json) {
        if (json_report(f, o, r) != 0)
            return -1;
    } else if (o->csv) {
        csv(f, o, r);
    } else {
        table(f, o, r);
    }
    return ferror(f) ? -1 : 0;
}

/* ---- chart -------------------------------------------------------------------------------- */

int fl_plot_write(FILE *f, const fl_options *o, const fl_report *r, char *err, size_t err_size)
{
    double x[FL_MAX_COUNTS], y[FL_N_POLICIES][FL_MAX_COUNTS];
    svg_series series[FL_N_POLICIES];
    size_t n_series = 0;
    for (size_t k = 0; k < o->n_counts; k++)
        x[k] = (double)o->counts[k];
    for (int p = 0; p < FL_N_POLICIES; p++) {
        if (!o->policies[p])
            continue;
        for (size_t k = 0; k < o->n_counts; k++)
            y[n_series][k] = hit_rate(slot(r, k, p));
        series[n_series].name = fl_policy_name(p);
        series[n_series].y = y[n_series];
        n_series++;
    }
    const char *base = strrchr(r->input, '/') ? strrchr(r->input, '/') + 1 : r->input;
    char title[256], note[256], a[32];
    snprintf(title, sizeof title, "%s: fleet token hit rate by routing policy", base);
    snprintf(note, sizeof note,
             "%s blocks of %u tokens per replica; concurrency %u, prefill %.3g us/token, "
             "decode %.3g us/token",
             cli_fmt_count(r->capacity, a, sizeof a), r->block_size, o->model.concurrency,
             (double)o->model.prefill_ns / 1e3, (double)o->model.decode_ns / 1e3);
    svg_plot p;
    memset(&p, 0, sizeof p);
    p.title = title;
    p.x_label = "replicas (log scale)";
    p.y_label = "fleet token hit rate (%)";
    p.x = x;
    p.n = o->n_counts;
    p.series = series;
    p.n_series = n_series;
    p.ceiling = -1.0;
    p.x_secondary = note;
    return svg_write(f, &p, err, err_size);
}
