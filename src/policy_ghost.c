/*
 * policy_ghost.c - the ghost of evicted keys that S3-FIFO and CDECAY keep (policy.h): a FIFO
 * of the last ghost_cap evicted keys and a table of their fingerprints for O(1) membership;
 * under CDECAY each fingerprint also carries the history of its key's latest eviction.
 *
 *   S3-FIFO:
 *   ghost[ghost_head ..]  ring of ghost_n <= ghost_cap keys' fingerprints, oldest first
 *   gtab_fp[s]            the table: open addressing, linear probing, backward-shift
 *                         deletion; slot s holds fingerprint gtab_fp[s] (0: empty)
 *   gtab_n[s]             how many times the ring holds gtab_fp[s] (a multiset)
 *   CDECAY:
 *   gring[ghost_head ..]  ring of ghost_n <= ghost_cap keys: the table slot (32-bit) each
 *                         had when added, oldest first
 *   gslot[s]              the table, as above, one 16-byte kvp__gslot per slot: its key's
 *                         fingerprint .fp (0: empty), .link = 1 + the ring slot of the key's
 *                         latest addition, .info = the info given with that addition; probed
 *                         by byte offsets (policy_ghost.h: home = bits 4.. of the mix)
 *
 * Invariants (kvp__ghost_check): ghost_n <= ghost_cap; every entry reachable from its home
 * slot without crossing an empty one. S3-FIFO: gtab_n[s] == 0 iff slot s is empty; the
 * multiset holds exactly the ring's fingerprints (each entry's count is its occurrences in the
 * ring). CDECAY (linked_check): gslot[s].link == 0 iff slot s is empty; every ring slot in use
 * names a table slot; every entry links to a ring slot in use that names it back (so no two
 * entries share a ring slot); no more entries than ring slots in use. A ring slot k holds its
 * key's latest addition iff gslot[gring[k]].link == k + 1 (an older duplicate's slot names a
 * slot linked elsewhere, or one its entry has left); when it is the oldest and G is full, that
 * entry is deleted with no probe, and each entry a deletion shifts takes its ring slot's name
 * along (policy_ghost.h).
 *
 * Cost: add and find O(1) expected: the table is at most 1/8 full under S3-FIFO and 1/4 under
 * CDECAY (whose ghost is 16 times larger). S3-FIFO's table at half full cost it about 6%
 * more instructions per request on bench_core (c) than at an eighth (probes and deletion
 * shifts), which took it from 1.26x to 1.24x LRU's. S3-FIFO: 8 bytes per ghost key plus 12
 * per table slot, 8 to 16 slots per key (94 to 180 bytes per pool block at its default ghost
 * of 0.9 pool); CDECAY: 4 bytes per key plus 16 per table slot, 4 to 8 slots per key (68 to
 * 132 bytes per key, 1.1 to 2.1 KB per pool block at its default of 16 pools). One array of
 * slots rather than three (fingerprint, link, info) frees two registers in CDECAY's full loop
 * and puts a slot on one cache line. The loops of CDECAY's batched evictions work on a copy of
 * the ghost's fields (kvp__gview, policy_ghost.h), and add to a full ghost by runs of ring
 * slots (kvp__gview_put_full); the counted multiset's deletion (S3-FIFO's) probes for the
 * oldest fingerprint, the linked one (CDECAY's) does not. On bench_core (c) an add to a full
 * ghost cost CDECAY ~55 instructions more than an add to one that is not full with main's
 * probing, out-of-line deletion, ~18 with three arrays (docs/performance.md, "CDECAY with a full
 * ghost"; one array of slots: 1.243x LRU's at pct 10).
 */
#include "policy_ghost.h"

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);       \
    } while (0)

/* The invariants of CDECAY's linked table (a ghost): every ring slot in use names a table
 * slot; every full table slot links to a ring slot in use that names it back; every full
 * slot is reachable from its home; no more keys than the ring holds. KVP_OK or KVP_ECORRUPT. */
static int linked_check(const kvp__policy *p)
{
    uint32_t t_mask = p->gtab_mask, cap = p->ghost_cap, keys = 0;
    kvp__gview g;
    kvp__gview_load(p, &g);
    for (uint32_t k = 0; k < p->ghost_n; k++)
        FAIL_IF(p->gring[(p->ghost_head + k) % cap] > t_mask);
    for (size_t s = 0; s <= t_mask; s++) {
        const kvp__gslot *e = &p->gslot[s];
        uint32_t at1 = e->link;
        FAIL_IF((e->fp == 0) != (at1 == 0));
        if (at1 == 0)
            continue;
        keys++;
        uint32_t age = (at1 - 1 + cap - p->ghost_head) % cap; /* 0: the oldest */
        FAIL_IF(at1 > cap || age >= p->ghost_n || p->gring[at1 - 1] != s);
        FAIL_IF(kvp__gview_find_slot(&g, e->fp) != s);
    }
    FAIL_IF(keys > p->ghost_n);
    return KVP_OK;
}

/* Invariants above. KVP_OK, KVP_ECORRUPT or KVP_ENOMEM (the checker's scratch). */
int kvp__ghost_check(const kvp__policy *p)
{
    FAIL_IF(p->ghost_n > p->ghost_cap || (p->ghost_cap && p->ghost_head >= p->ghost_cap));
    if (p->ghost_cap == 0)
        return KVP_OK;
    if (p->gslot)
        return linked_check(p);
    kvp__mem *mem = p->mem; /* scratch only: back to its count on return */
    size_t t = (size_t)p->gtab_mask + 1;
    uint32_t *occ = kvp__mem_calloc(mem, t, sizeof *occ);
    if (!occ)
        return kvp__fail(KVP_ENOMEM, "out of memory: the checker's %zu ghost counters", t);
    int rc = KVP_OK;
    for (uint32_t k = 0; k < p->ghost_n && rc == KVP_OK; k++) {
        uint64_t f = p->ghost[(p->ghost_head + k) % p->ghost_cap];
        uint32_t s = kvp__gtab_find(p, f);
        if (f == 0 || p->gtab_fp[s] != f)
            rc = kvp__fail(KVP_ECORRUPT,
                           "invariant violated in %s: ghost key %" PRIu32
                           " is not in the ghost table",
                           __func__, k);
        else
            occ[s]++;
    }
    for (size_t s = 0; s < t && rc == KVP_OK; s++) {
        bool empty = p->gtab_fp[s] == 0;
        if (empty != (p->gtab_n[s] == 0) || occ[s] != p->gtab_n[s])
            rc = kvp__fail(KVP_ECORRUPT,
                           "invariant violated in %s: ghost table slot %zu counts %" PRIu32
                           ", the ring holds its key %" PRIu32 " times",
                           __func__, s, p->gtab_n[s], occ[s]);
    }
    kvp__mem_free(mem, occ, t * sizeof *occ);
    return rc;
}
