/*
 * rd_limits.h - what `kvprefix router` bounds and measures as a network service: the limits
 * a hostile engine or client meets (docs/security.md, "The router daemon") and the latency
 * histograms of /metrics (rd_metrics.c). Part of rd_daemon (routerd.h).
 *
 *   rd_limits  per-request deadline, connections per client address and in all, the budget
 *              of buffered /score bodies (rd_http.c); workers and blocks per engine
 *              endpoint (rd_events.c)
 *   rd_hist    a Prometheus histogram with fixed bounds, updated without a lock (relaxed
 *              atomics: a scrape may see one observation's bucket before its sum)
 */
#ifndef CLI_RD_LIMITS_H
#define CLI_RD_LIMITS_H

#include <stdatomic.h>
#include <stdint.h>

#include "rd_req.h"

/* Buckets of an rd_hist, +Inf included. */
#define RD_HIST_BUCKETS 14

/* Limits of the daemon (defaults in routerd.c; 0 means none where said). */
typedef struct rd_limits {
    unsigned request_timeout_ms; /* a request's whole life, headers to answer (408 / closed) */
    unsigned per_ip_connections; /* open connections per client address */
    unsigned max_connections;    /* open connections in all */
    rd_budget body_budget;       /* token arrays of /score bodies held, all connections */
    uint32_t endpoint_workers;   /* workers one endpoint may create (ID '*': one per pod) */
    uint64_t endpoint_blocks;    /* blocks the workers of one endpoint may hold together */
} rd_limits;

/* A histogram: counts per bucket (not cumulative; the writer sums) and the sum in ns. */
typedef struct rd_hist {
    atomic_uint_fast64_t n[RD_HIST_BUCKETS]; /* observations per bucket, last is +Inf */
    atomic_uint_fast64_t sum_ns;             /* sum of the observations, ns */
} rd_hist;

/* Which histogram (bounds): the daemon's time per /score, the event lag. */
enum { RD_HIST_SCORE = 0, RD_HIST_LAG = 1 };

/* Count one observation of ns nanoseconds in h (kind: RD_HIST_*). Cannot fail. */
void rd_hist_add(rd_hist *h, int kind, uint64_t ns);

#endif /* CLI_RD_LIMITS_H */
