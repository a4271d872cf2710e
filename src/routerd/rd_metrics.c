/*
 * rd_metrics.c - GET /metrics of `kvprefix router`: the index's figures (kvp_router_stats)
 * and the daemon's own counters in Prometheus text exposition format 0.0.4. Every family
 * has its # HELP and # TYPE lines; label values are escaped (backslash, double quote,
 * newline) as the format requires. The list of families is in docs/routing.md.
 *
 * With --redis, the shared store's families follow the index's (rd_redis.c).
 *
 * Two histograms (rd_hist, rd_limits.h), updated by their threads without a lock:
 *   kvprefix_router_score_seconds      the daemon's own time per answered /score: the
 *                                      handler's calls (scanning the body as it arrives,
 *                                      scoring, writing the answer), not the network's
 *   kvprefix_router_event_lag_seconds  a batch's engine stamp (its ts, wall clock) to the
 *                                      moment it was applied; a stamp in the future (clock
 *                                      skew) counts as 0
 * Label values that are not UTF-8 (an engine id from a topic) have each bad byte written
 * as U+FFFD, so one engine cannot make the exposition unreadable for every scrape.
 *
 * Cost: O(workers + sources) under rd_daemon.lock, plus one kvp_router_stats_get and one
 * kvp_router_worker_stats_get per worker (shared lock of the index).
 */
#include <inttypes.h>
#include <string.h>

#include "routerd.h"

static void rd_family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Length of the UTF-8 sequence at p (RFC 3629), or 0 when it is not one. */
static size_t rd_utf8_len(const unsigned char *p)
{
    size_t len = p[0] < 0x80 ? 1 : p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : 2;
    if (len == 1)
        return 1;
    if (p[0] < 0xC2 || p[0] > 0xF4)
        return 0;
    for (size_t k = 1; k < len; k++)
        if (p[k] < 0x80 || p[k] > 0xBF)
            return 0;
    if ((p[0] == 0xE0 && p[1] < 0xA0) || (p[0] == 0xED && p[1] > 0x9F) ||
        (p[0] == 0xF0 && p[1] < 0x90) || (p[0] == 0xF4 && p[1] > 0x8F))
        return 0;
    return len;
}

/* Write s as a label value: backslash, double quote and newline escaped, bytes that are not
 * UTF-8 as U+FFFD. */
static void rd_label(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        size_t len = rd_utf8_len(p);
        if (len == 0) {
            fputs("\xef\xbf\xbd", f);
            p++;
        } else if (*p == '\\' || *p == '"') {
            fprintf(f, "\\%c", *p++);
        } else if (*p == '\n') {
            fputs("\\n", f);
            p++;
        } else {
            fwrite(p, 1, len, f);
            p += len;
        }
    }
}

/* Upper bounds (seconds) of the histograms' buckets but +Inf, by RD_HIST_*. */
static const double rd_hist_bounds[2][RD_HIST_BUCKETS - 1] = {
    {10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1.0},
    {1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 10.0, 60.0},
};

void rd_hist_add(rd_hist *h, int kind, uint64_t ns)
{
    double s = (double)ns * 1e-9;
    int b = 0;
    while (b < RD_HIST_BUCKETS - 1 && s > rd_hist_bounds[kind][b])
        b++;
    atomic_fetch_add_explicit(&h->n[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

/* One histogram family: cumulative buckets, _sum, _count. */
static void rd_metrics_hist(FILE *f, const char *name, const char *help, rd_hist *h, int kind)
{
    rd_family(f, name, "histogram", help);
    uint64_t cum = 0;
    for (int b = 0; b < RD_HIST_BUCKETS; b++) {
        cum += atomic_load_explicit(&h->n[b], memory_order_relaxed);
        if (b < RD_HIST_BUCKETS - 1)
            fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, rd_hist_bounds[kind][b], cum);
        else
            fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    }
    fprintf(f, "%s_sum %.9f\n", name,
            (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) * 1e-9);
    fprintf(f, "%s_count %" PRIu64 "\n", name, cum);
}

/* Index-wide figures from the router's stats. */
static void rd_metrics_index(FILE *f, const kvp_router_stats *st)
{
    rd_family(f, "kvprefix_router_events_total", "counter",
              "KV events applied to the index, by type (skipped: other KV cache groups).");
    fprintf(f, "kvprefix_router_events_total{type=\"stored\"} %" PRIu64 "\n", st->n_events_stored);
    fprintf(f, "kvprefix_router_events_total{type=\"removed\"} %" PRIu64 "\n",
            st->n_events_removed);
    fprintf(f, "kvprefix_router_events_total{type=\"cleared\"} %" PRIu64 "\n",
            st->n_events_cleared);
    fprintf(f, "kvprefix_router_events_total{type=\"skipped\"} %" PRIu64 "\n",
            st->n_events_skipped);
    rd_family(f, "kvprefix_router_workers", "gauge", "Workers (engine, dp rank) indexed.");
    fprintf(f, "kvprefix_router_workers %" PRIu32 "\n", st->n_workers);
    rd_family(f, "kvprefix_router_stale_workers", "gauge",
              "Workers marked stale (ignored by /score).");
    fprintf(f, "kvprefix_router_stale_workers %" PRIu32 "\n", st->n_stale);
    rd_family(f, "kvprefix_router_index_blocks", "gauge", "Distinct block hashes indexed.");
    fprintf(f, "kvprefix_router_index_blocks %" PRIu64 "\n", st->n_blocks);
    rd_family(f, "kvprefix_router_index_holders", "gauge", "(block, worker) pairs indexed.");
    fprintf(f, "kvprefix_router_index_holders %" PRIu64 "\n", st->n_holders);
    rd_family(f, "kvprefix_router_index_bytes", "gauge",
              "Bytes the index holds (every allocation of the router).");
    fprintf(f, "kvprefix_router_index_bytes %" PRIu64 "\n", st->total_bytes);
    rd_family(f, "kvprefix_router_bytes_per_holder", "gauge",
              "Index bytes per (block, worker) pair; 0 when empty.");
    fprintf(f, "kvprefix_router_bytes_per_holder %.3f\n", st->bytes_per_holder);
}

/* Per-worker batch counters and state (caller holds d->lock). */
static void rd_metrics_workers(rd_daemon *d, FILE *f)
{
    static const char *const status[] = {NULL, "applied", "restarted", "duplicate", "gap"};
    rd_family(f, "kvprefix_router_batches_total", "counter",
              "Event batches by what the index did with them (gap: refused, then replayed).");
    for (size_t i = 0; i < d->n_workers; i++) {
        rd_worker *w = d->workers[i];
        for (int s = 1; s <= 4; s++) {
            fputs("kvprefix_router_batches_total{engine=\"", f);
            rd_label(f, w->engine);
            fprintf(f, "\",dp_rank=\"%" PRId64 "\",status=\"%s\"} %" PRIu64 "\n", w->dp_rank,
                    status[s], w->n_status[s]);
        }
    }
    /* One family at a time: the format wants each family's samples together. */
    static const struct {
        const char *name, *type, *label, *help;
    } fam[] = {
        {"kvprefix_router_replays_total", "counter", "result=\"filled\",",
         "Replays asked of engines after a gap, by result (failed: marked stale)."},
        {"kvprefix_router_replays_total", NULL, "result=\"failed\",", NULL},
        {"kvprefix_router_replayed_batches_total", "counter", "",
         "Batches received from replay sockets."},
        {"kvprefix_router_stale_marks_total", "counter", "", "Times a worker was marked stale."},
        {"kvprefix_router_queue_drops_total", "counter", "",
         "Live batches dropped while a replay ran with a full queue."},
        {"kvprefix_router_worker_blocks", "gauge", "", "Blocks a worker holds, any tier."},
    };
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        if (fam[k].type)
            rd_family(f, fam[k].name, fam[k].type, fam[k].help);
        for (size_t i = 0; i < d->n_workers; i++) {
            rd_worker *w = d->workers[i];
            kvp_router_worker_stats ws;
            uint64_t vals[] = {w->n_replays_ok,  w->n_replays_fail, w->n_replayed,
                               w->n_stale_marks, w->n_queue_drops,  0};
            if (k == 5 && kvp_router_worker_stats_get(d->router, w->id, &ws) == KVP_OK)
                vals[5] = ws.n_blocks;
            fprintf(f, "%s{%sengine=\"", fam[k].name, fam[k].label);
            rd_label(f, w->engine);
            fprintf(f, "\",dp_rank=\"%" PRId64 "\"} %" PRIu64 "\n", w->dp_rank, vals[k]);
        }
    }
}

/* Engine-hash mode's key check, summed per engine id (caller holds d->lock). */
static void rd_metrics_keys(rd_daemon *d, FILE *f)
{
    static const char *const names[] = {"kvprefix_router_key_checked_total",
                                        "kvprefix_router_key_mismatch_total"};
    static const char *const helps[] = {
        "Engine-hash mode: stored blocks whose engine key the router recomputed, per engine.",
        "Engine-hash mode: of those, blocks whose key differs from the engine's (its hash "
        "algorithm, seed or key is not the router's: /score cannot find them), per engine."};
    for (int k = 0; k < 2; k++) {
        rd_family(f, names[k], "counter", helps[k]);
        for (size_t i = 0; i < d->n_workers; i++) {
            bool seen = false;
            for (size_t j = 0; j < i && !seen; j++)
                seen = strcmp(d->workers[j]->engine, d->workers[i]->engine) == 0;
            if (seen)
                continue;
            uint64_t v = 0;
            for (size_t j = i; j < d->n_workers; j++) {
                if (strcmp(d->workers[j]->engine, d->workers[i]->engine) == 0)
                    v += k ? d->workers[j]->n_key_mismatch : d->workers[j]->n_key_checked;
            }
            fprintf(f, "%s{engine=\"", names[k]);
            rd_label(f, d->workers[i]->engine);
            fprintf(f, "\"} %" PRIu64 "\n", v);
        }
    }
}

/* Token mode's map figures (kvp_router_token_stats). */
static void rd_metrics_tokens(rd_daemon *d, FILE *f)
{
    kvp_router_token_stats ts;
    if (kvp_router_token_stats_get(d->router, KVP_ROUTER_ALL_WORKERS, &ts) != KVP_OK)
        return;
    const struct {
        const char *name, *type, *help;
        uint64_t v;
    } fam[] = {
        {"kvprefix_router_token_map_entries", "gauge",
         "Token mode: (engine hash, worker) entries mapping engine hashes to the router's keys.",
         ts.n_map_entries},
        {"kvprefix_router_token_map_bytes", "gauge", "Token mode: bytes of those maps.",
         ts.map_bytes},
        {"kvprefix_router_token_unresolved_blocks_total", "counter",
         "Token mode: stored blocks not indexed because their parent was never seen.",
         ts.n_unresolved},
        {"kvprefix_router_token_unkeyable_blocks_total", "counter",
         "Token mode: stored blocks not indexed (extra_keys: cache_salt, multimodal; a "
         "lora_id without a name).",
         ts.n_unkeyable},
    };
    for (size_t k = 0; k < sizeof fam / sizeof fam[0]; k++) {
        rd_family(f, fam[k].name, fam[k].type, fam[k].help);
        fprintf(f, "%s %" PRIu64 "\n", fam[k].name, fam[k].v);
    }
}

/* Per-source message counters (caller holds d->lock). */
static void rd_metrics_sources(rd_daemon *d, FILE *f)
{
    static const char *const reasons[RD_BAD_KINDS] = {"frames", "topic",   "payload",
                                                      "batch",  "dp_rank", "limit"};
    rd_family(f, "kvprefix_router_messages_total", "counter",
              "Messages received per engine endpoint.");
    for (size_t i = 0; i < d->n_sources; i++) {
        fputs("kvprefix_router_messages_total{endpoint=\"", f);
        rd_label(f, d->sources[i].endpoint);
        fprintf(f, "\"} %" PRIu64 "\n", d->sources[i].n_messages);
    }
    rd_family(f, "kvprefix_router_malformed_messages_total", "counter",
              "Messages refused per engine endpoint, by reason (frames, topic, payload, "
              "batch, dp_rank: a rank the endpoint does not declare, limit: past "
              "--endpoint-workers or --endpoint-blocks).");
    for (size_t i = 0; i < d->n_sources; i++)
        for (int k = 0; k < RD_BAD_KINDS; k++) {
            fputs("kvprefix_router_malformed_messages_total{endpoint=\"", f);
            rd_label(f, d->sources[i].endpoint);
            fprintf(f, "\",reason=\"%s\"} %" PRIu64 "\n", reasons[k], d->sources[i].n_bad[k]);
        }
}

int rd_metrics_write(rd_daemon *d, FILE *f)
{
    kvp_router_stats st;
    if (kvp_router_stats_get(d->router, &st) != KVP_OK)
        return 1;
    rd_metrics_index(f, &st);
    rd_metrics_redis(&st, f);
    rd_metrics_load(d, f);
    rd_family(f, "kvprefix_router_index_mode", "gauge",
              "What blocks are indexed by (--index-by): 1 for the mode in use.");
    fprintf(f, "kvprefix_router_index_mode{mode=\"tokens\"} %d\n",
            d->index_by == KVP_ROUTER_INDEX_TOKENS);
    fprintf(f, "kvprefix_router_index_mode{mode=\"engine-hash\"} %d\n",
            d->index_by == KVP_ROUTER_INDEX_ENGINE_HASH);
    rd_metrics_tokens(d, f);
    pthread_mutex_lock(&d->lock);
    rd_metrics_workers(d, f);
    rd_metrics_keys(d, f);
    rd_metrics_sources(d, f);
    rd_family(f, "kvprefix_router_lookups_total", "counter", "/score requests answered.");
    fprintf(f, "kvprefix_router_lookups_total %" PRIu64 "\n", d->n_lookups);
    rd_family(f, "kvprefix_router_text_requests_total", "counter",
              "/score requests with a text prompt (prompt or messages), by result.");
    fprintf(f, "kvprefix_router_text_requests_total{result=\"scored\"} %" PRIu64 "\n",
            d->n_text_scored);
    fprintf(f, "kvprefix_router_text_requests_total{result=\"refused\"} %" PRIu64 "\n",
            d->n_text_failed);
    rd_family(f, "kvprefix_router_text_tokens_total", "counter",
              "Prompt tokens the daemon made from text (rendered and tokenized).");
    fprintf(f, "kvprefix_router_text_tokens_total %" PRIu64 "\n", d->n_text_tokens);
    rd_family(f, "kvprefix_router_lookup_blocks_total", "counter",
              "Full prompt blocks of the /score requests.");
    fprintf(f, "kvprefix_router_lookup_blocks_total %" PRIu64 "\n", d->n_lookup_blocks);
    rd_family(f, "kvprefix_router_hit_blocks_total", "counter",
              "Cached prefix blocks of the best worker of each /score request.");
    fprintf(f, "kvprefix_router_hit_blocks_total %" PRIu64 "\n", d->n_hit_blocks);
    rd_family(f, "kvprefix_router_http_errors_total", "counter",
              "HTTP requests answered with an error status.");
    fprintf(f, "kvprefix_router_http_errors_total %" PRIu64 "\n", d->n_http_errors);
    rd_family(f, "kvprefix_router_http_refused_total", "counter",
              "HTTP requests refused as a service's limits say: deadline (--request-timeout: "
              "the connection closed), budget (--body-budget spent: 503).");
    fprintf(f, "kvprefix_router_http_refused_total{reason=\"deadline\"} %" PRIu64 "\n",
            d->n_http_timeouts);
    fprintf(f, "kvprefix_router_http_refused_total{reason=\"budget\"} %" PRIu64 "\n",
            d->n_http_busy);
    pthread_mutex_unlock(&d->lock);
    rd_family(f, "kvprefix_router_body_budget_bytes", "gauge",
              "Bytes of /score token arrays held by all connections (limit: --body-budget).");
    fprintf(f, "kvprefix_router_body_budget_bytes %zu\n", atomic_load(&d->lim.body_budget.used));
    rd_metrics_hist(f, "kvprefix_router_score_seconds",
                    "The daemon's own time per answered /score (scanning the body, scoring, "
                    "writing the answer; not the network).",
                    &d->score_hist, RD_HIST_SCORE);
    rd_metrics_hist(f, "kvprefix_router_event_lag_seconds",
                    "From a batch's engine stamp (wall clock) to its application to the index.",
                    &d->lag_hist, RD_HIST_LAG);
    return 0;
}
