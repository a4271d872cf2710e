/*
 * benchutil.h - the statistics every benchmark program under bench/ reports: medians of
 * repeated runs (a run is one sample; the shared, noisy machine makes the median the
 * figure to quote). Header-only, static inline: each program is one file plus this.
 *
 * A program that defines BENCH_PROG (its name, for messages) before including this also
 * gets the small helpers every library benchmark needs: a monotonic clock in ns, malloc
 * that exits on failure, and a check that exits on a library error.
 */
#ifndef KVP_BENCHUTIL_H
#define KVP_BENCHUTIL_H

#include <stdlib.h>

/* qsort comparator for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0 .. n), n >= 1: sorts v in place; the mean of the middle two for even
 * n. */
static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#ifdef BENCH_PROG
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "kvprefix.h"

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* malloc(n) (at least one byte), or exit with a message. */
static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, BENCH_PROG ": out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* Exit with a message unless rc is KVP_OK. */
static inline void check(int rc, const char *what)
{
    if (rc != KVP_OK) {
        fprintf(stderr, BENCH_PROG ": %s failed: %s\n", what, kvp_strerror(rc));
        exit(1);
    }
}
#endif /* BENCH_PROG */

#endif /* KVP_BENCHUTIL_H */
