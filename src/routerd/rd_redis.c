/*
 * rd_redis.c - `kvprefix router --redis URL`: the daemon's side of the router index's shared
 * store (docs/routing.md, "Several routers on one Redis"). The library does the work (every
 * batch applied to Redis as well as to the local index, scores from Redis while it answers
 * within --redis-timeout, from the local view otherwise); this file only
 *
 *   - checks the shape of --redis-prefix, so that a typo is a usage error with its own
 *     message (a --redis URL is the library's to parse: routerd.c names it when refused);
 *   - turns the router's statistics into log lines, one per transition, from the event
 *     thread's periodic tick (every 100 ms at most; no thread of its own):
 *
 *       UNKNOWN ──first success──> UP ──a call fails──> DOWN ──a call succeeds──> UP
 *          └──────────first failure──────────────────────^
 *
 *     plus one line each time n_redis_lost grows (the store lost workers it held: Redis
 *     restarted empty or was flushed) with how many worker views the library put back from
 *     this router's local view since the last line (n_redis_reseeds), and one line when
 *     only the re-seeds grew (repairs of views another router put back in part);
 *   - writes the store's metric families.
 *
 * State: rd_daemon.redis_state, .redis_lost, .redis_reseeds and .redis_check_ms, touched by
 * the event thread only. Invariant: redis_lost <= the router's n_redis_lost and
 * redis_reseeds <= its n_redis_reseeds (counters never decrease).
 */
#include <inttypes.h>
#include <string.h>

#include "routerd.h"

/* The tick's period: a transition is logged at most this long after the call that made it. */
#define RD_REDIS_TICK_MS 100

bool rd_redis_prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == ':' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

/* Log a change of reachability seen in st. */
static void rd_redis_transition(rd_daemon *d, const kvp_router_stats *st)
{
    int now = st->redis_up ? RD_REDIS_UP : st->n_redis_errors ? RD_REDIS_DOWN : RD_REDIS_UNKNOWN;
    if (now == RD_REDIS_UNKNOWN || now == d->redis_state)
        return;
    if (now == RD_REDIS_DOWN)
        rd_logl(RD_LOG_WARN,
                "redis: unreachable (%s: %" PRIu64 " of %" PRIu64 " calls failed so far, next "
                "try within %" PRIu32 " ms), scoring from the local view",
                d->redis.url, st->n_redis_errors, st->n_redis_calls, d->redis.retry_ms);
    else if (d->redis_state == RD_REDIS_DOWN)
        rd_log("redis: reachable again (%s, %" PRIu64 " connections so far), scoring from the "
               "shared view",
               d->redis.url, st->n_redis_connects);
    else
        rd_log("redis: connected to %s (key prefix '%s'), scoring from the shared view",
               d->redis.url, d->redis.key_prefix);
    d->redis_state = now;
}

void rd_redis_tick(rd_daemon *d)
{
    if (d->redis.url == NULL)
        return;
    int64_t now = rd_now_ms();
    if (d->redis_check_ms != 0 && now - d->redis_check_ms < RD_REDIS_TICK_MS)
        return;
    d->redis_check_ms = now;
    kvp_router_stats st;
    if (kvp_router_stats_get(d->router, &st) != KVP_OK || !st.redis)
        return;
    rd_redis_transition(d, &st);
    /* Losses and re-seeds are separate figures: a re-seed also repairs a shared view that
     * another router found missing but could put back only in part (its own local view was
     * partial), so one line may report more re-seeds than losses, or re-seeds alone. */
    uint64_t lost = st.n_redis_lost - d->redis_lost, put = st.n_redis_reseeds - d->redis_reseeds;
    if (lost)
        rd_logl(RD_LOG_WARN,
                "redis: worker state lost (restart?): %" PRIu64 " worker(s) found missing (%" PRIu64
                " in all); this router re-seeded %" PRIu64 " worker view(s) from its local view "
                "since the last line (%" PRIu64 " in all); workers no router re-seeds keep only "
                "the blocks stored from now on",
                lost, st.n_redis_lost, put, st.n_redis_reseeds);
    else if (put)
        rd_log("redis: re-seeded %" PRIu64 " worker view(s) from this router's local view (%" PRIu64
               " in all): shared views another router found missing and could put back only "
               "in part",
               put, st.n_redis_reseeds);
    d->redis_lost = st.n_redis_lost;
    d->redis_reseeds = st.n_redis_reseeds;
}

/* One unlabelled sample with its # HELP and # TYPE lines. */
static void rd_sample(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);
}

void rd_metrics_redis(const kvp_router_stats *st, FILE *f)
{
    if (!st->redis)
        return;
    rd_sample(f, "kvprefix_router_redis_up", "gauge",
              "1 when the last call that tried Redis succeeded (scores from the shared view).",
              st->redis_up ? 1 : 0);
    rd_sample(f, "kvprefix_router_redis_calls_total", "counter",
              "Round trips to Redis (a pipeline counts once).", st->n_redis_calls);
    rd_sample(f, "kvprefix_router_redis_errors_total", "counter",
              "Redis calls that failed: refused, timed out, server error.", st->n_redis_errors);
    rd_sample(f, "kvprefix_router_redis_connects_total", "counter",
              "Connections made to Redis (the first, then reconnections).", st->n_redis_connects);
    rd_sample(f, "kvprefix_router_fallback_scores_total", "counter",
              "Scores answered from the local view because Redis failed or was in its retry "
              "pause.",
              st->n_fallback_scores);
    rd_sample(f, "kvprefix_router_fallback_applies_total", "counter",
              "Batches applied to the local view only.", st->n_fallback_applies);
    rd_sample(f, "kvprefix_router_redis_lost_total", "counter",
              "Workers whose shared state was found missing (Redis restarted or flushed).",
              st->n_redis_lost);
    rd_sample(f, "kvprefix_router_redis_reseeds_total", "counter",
              "Lost workers whose shared view this router put back from its local view.",
              st->n_redis_reseeds);
    rd_sample(f, "kvprefix_router_redis_duplicates_total", "counter",
              "Batches another router had already applied to the shared store.",
              st->n_redis_duplicates);
}
