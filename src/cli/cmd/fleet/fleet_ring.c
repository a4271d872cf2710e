/*
 * fleet_ring.c - the consistent-hash ring of `kvprefix fleet`'s affinity policy (fleet.h).
 *
 * Each replica r owns n_vnodes points on a 64-bit circle, point v at
 * fl_mix64(seed ^ (r << 32 | v)); a request whose affinity key hashes to h goes to the
 * replica owning the first point at or after h, wrapping past 2^64 - 1 to the first point:
 *
 *        0 ──[r1]────[r0]──h──►[r1]──────[r2]────[r0]── 2^64-1 ─┐
 *        ▲                       owner of h                     │
 *        └──────────────────────────────────────────────────────┘
 *
 * With many points per replica each one owns about 1/N of the circle, and adding a replica
 * moves only the keys that land on its new points (about 1/(N+1) of them): that is what
 * makes affinity survive fleet changes, and what the policy models.
 *
 * Layout: one array of (point, replica) sorted by point, then replica. Lookup is a binary
 * search: O(log(N * n_vnodes)). Invariant (fl_ring_check): sorted, n_vnodes points each.
 */
#include <stdlib.h>

#include "fleet.h"

typedef struct fl_point {
    uint64_t at;      /* position on the circle */
    uint32_t replica; /* its owner */
} fl_point;

struct fl_ring {
    fl_point *points;    /* n_points, sorted by (at, replica) */
    size_t n_points;     /* n_replicas * n_vnodes */
    uint32_t n_replicas; /* replicas on the ring */
    uint32_t n_vnodes;   /* points per replica */
};

uint64_t fl_mix64(uint64_t x)
{
    x += UINT64_C(0x9e3779b97f4a7c15);
    x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

static int cmp_point(const void *a, const void *b)
{
    const fl_point *x = a, *y = b;
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    return (x->replica > y->replica) - (x->replica < y->replica);
}

fl_ring *fl_ring_new(uint32_t n_replicas, uint32_t n_vnodes, uint64_t seed)
{
    if (n_replicas == 0 || n_vnodes == 0 || (size_t)n_replicas > SIZE_MAX / n_vnodes)
        return NULL;
    fl_ring *ring = calloc(1, sizeof *ring);
    size_t n = (size_t)n_replicas * n_vnodes;
    if (!ring || !(ring->points = calloc(n, sizeof *ring->points))) {
        free(ring);
        return NULL;
    }
    for (uint32_t r = 0; r < n_replicas; r++)
        for (uint32_t v = 0; v < n_vnodes; v++) {
            fl_point *p = &ring->points[(size_t)r * n_vnodes + v];
            p->at = fl_mix64(seed ^ ((uint64_t)r << 32 | v));
            p->replica = r;
        }
    qsort(ring->points, n, sizeof *ring->points, cmp_point);
    ring->n_points = n;
    ring->n_replicas = n_replicas;
    ring->n_vnodes = n_vnodes;
    return ring;
}

uint32_t fl_ring_pick(const fl_ring *ring, uint64_t h)
{
    /* The first point with at >= h: lo ends at the smallest such index (n_points if none). */
    size_t lo = 0, hi = ring->n_points;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ring->points[mid].at < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return ring->points[lo == ring->n_points ? 0 : lo].replica;
}

bool fl_ring_check(const fl_ring *ring)
{
    if (!ring || ring->n_points != (size_t)ring->n_replicas * ring->n_vnodes)
        return false;
    size_t *count = calloc(ring->n_replicas, sizeof *count);
    if (!count)
        return false;
    bool ok = true;
    for (size_t i = 0; i < ring->n_points && ok; i++) {
        ok = ring->points[i].replica < ring->n_replicas &&
             (i == 0 || cmp_point(&ring->points[i - 1], &ring->points[i]) < 0);
        if (ok)
            count[ring->points[i].replica]++;
    }
    for (uint32_t r = 0; r < ring->n_replicas && ok; r++)
        ok = count[r] == ring->n_vnodes;
    free(count);
    return ok;
}

void fl_ring_free(fl_ring *ring)
{
    if (ring)
        free(ring->points);
    free(ring);
}
