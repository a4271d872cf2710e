/*
 * rd_redis.c - `kvprefix router --redis URL`: the daemon's side of the router index's shared
 * store (docs/routing.md, "Several routers on one Redis"). The library does the work (every
 * batch applied to Redis as well as to the local index, scores from Redis while it answers
 * within --redis-timeout, from the local view otherwise); this file only
 *
 *   - checks the shape of --redis and --redis-prefix, so that a typo is a usage error with
 *     its own message before anything starts;
 *   - turns the router's statistics into log lines, one per transition, from the event
 *     thread's periodic tick (every 100 ms at most; no thread of its own):
 *
 *       UNKNOWN ──first success──> UP ──a call fails──> DOWN ──a call succeeds──> UP
 *          └──────────first failure──────────────────────^
 *
 *     plus one line each time n_redis_lost grows (the store lost workers it held: Redis
 *     restarted empty or was flushed);
 *   - writes the store's metric families.
 *
 * State: rd_daemon.redis_state, .redis_lost and .redis_check_ms, touched by the event thread
 * only. Invariant: redis_lost <= the router's n_redis_lost (a counter never decreases).
 */
#include <inttypes.h>
#include <string.h>

#include "routerd.h"

/* The tick's period: a transition is logged at most this long after the call that made it. */
#define RD_REDIS_TICK_MS 100

/* Whether s[0 .. n) is 1..max decimal digits whose value is in lo..hi. */
static bool rd_digits_in(const char *s, size_t n, unsigned long lo, unsigned long hi)
{
    if (n == 0 || n > 5)
        return false;
    unsigned long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    return v >= lo && v <= hi;
}

bool rd_redis_url_ok(const char *url)
{
    if (strncmp(url, "unix:", 5) == 0)
        return url[5] != '\0';
    const char *p = strncmp(url, "redis://", 8) == 0 ? url + 8 : url;
    const char *slash = strchr(p, '/');
    if (slash && (p == url || !rd_digits_in(slash + 1, strlen(slash + 1), 0, 15)))
        return false; /* a /DB only after redis:// */
    size_t hostport = slash ? (size_t)(slash - p) : strlen(p);
    const char *colon = NULL;
    for (size_t i = 0; i < hostport; i++)
        if (p[i] == ':')
            colon = p + i;
    if (colon == NULL || colon == p)
        return false;
    return rd_digits_in(colon + 1, (size_t)(p + hostport - colon - 1), 1, 65535);
}

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
        rd_log("redis: unreachable (%s: %" PRIu64 " of %" PRIu64 " calls failed so far, next "
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
    if (st.n_redis_lost > d->redis_lost) {
        rd_log("redis: worker state lost (restart?), %" PRIu64 " worker(s) this time, %" PRIu64
               " in all: the blocks stored before are gone from the shared view; new batches "
               "rebuild it",
               st.n_redis_lost - d->redis_lost, st.n_redis_lost);
        d->redis_lost = st.n_redis_lost;
    }
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
    rd_sample(f, "kvprefix_router_redis_duplicates_total", "counter",
              "Batches another router had already applied to the shared store.",
              st->n_redis_duplicates);
}
