/*
 * benchutil.h - the statistics every benchmark program under bench/ reports: medians of
 * repeated runs (a run is one sample; the shared, noisy machine makes the median the
 * figure to quote). Header-only, static inline: each program is one file plus this.
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

#endif /* KVP_BENCHUTIL_H */
