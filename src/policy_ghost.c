/*
 * policy_ghost.c - the ghost of evicted keys that S3-FIFO and CDECAY keep (policy.h): a FIFO
 * of the last ghost_cap evicted keys' fingerprints and a multiset of them for O(1)
 * membership; under CDECAY each fingerprint also carries the history of its key's latest
 * eviction.
 *
 *   ghost[ghost_head ..]  ring of ghost_n <= ghost_cap fingerprints, oldest first
 *   gtab_fp[s], gtab_n[s] the multiset: open addressing, linear probing, backward-shift
 *                         deletion; slot s holds fingerprint gtab_fp[s] (0: empty)
 *                         gtab_n[s] times in the ring
 *   gtab_info[s]          CDECAY: the info given with the fingerprint's latest addition
 *
 * Invariants (kvp__ghost_check): ghost_n <= ghost_cap; the multiset holds exactly the ring's
 * fingerprints (each entry's count is its occurrences in the ring, no zero-count entry, every
 * entry reachable from its home slot without crossing an empty one).
 *
 * Cost: add and find O(1) expected (the table is at most half full); 8 bytes per ghost key
 * plus 12 (S3-FIFO) or 14 (CDECAY) per table slot, 2 to 4 slots per key.
 */
#include "internal.h"

/* A key's nonzero 64-bit fingerprint (keys are uniform hashes: the low word, mixed with
 * the high one so that the test-only truncation still tells keys apart). */
static inline uint64_t fingerprint(kvp_key key)
{
    uint64_t f = key.lo ^ (key.hi * UINT64_C(0x9e3779b97f4a7c15));
    return f ? f : 1;
}

static inline uint32_t home_slot(const kvp__policy *p, uint64_t f)
{
    return (uint32_t)((f ^ (f >> 29)) * UINT64_C(0xbf58476d1ce4e5b9) >> 32) & p->gtab_mask;
}

/* The table slot holding fingerprint f, or the empty slot where it would go. */
static uint32_t gtab_find(const kvp__policy *p, uint64_t f)
{
    uint32_t s = home_slot(p, f);
    while (p->gtab_fp[s] != 0 && p->gtab_fp[s] != f)
        s = (s + 1) & p->gtab_mask;
    return s;
}

/* Remove one occurrence of f (present) from the multiset: backward-shift deletion. */
static void gtab_drop(kvp__policy *p, uint64_t f)
{
    uint32_t s = gtab_find(p, f);
    assert(p->gtab_fp[s] == f && p->gtab_n[s] > 0);
    if (--p->gtab_n[s] > 0)
        return;
    for (uint32_t j = (s + 1) & p->gtab_mask;; j = (j + 1) & p->gtab_mask) {
        if (p->gtab_fp[j] == 0)
            break;
        uint32_t h = home_slot(p, p->gtab_fp[j]);
        /* Entry j may move to s iff its home is not in (s, j] cyclically. */
        if (((j - h) & p->gtab_mask) >= ((j - s) & p->gtab_mask)) {
            p->gtab_fp[s] = p->gtab_fp[j];
            p->gtab_n[s] = p->gtab_n[j];
            if (p->gtab_info)
                p->gtab_info[s] = p->gtab_info[j];
            s = j;
        }
    }
    p->gtab_fp[s] = 0;
    p->gtab_n[s] = 0;
}

/* Remember key in G (with info, kept if gtab_info exists), forgetting G's oldest key when G
 * is full. Cannot fail. */
void kvp__ghost_add(kvp__policy *p, kvp_key key, uint16_t info)
{
    if (p->ghost_cap == 0)
        return;
    uint64_t f = fingerprint(key);
    if (p->ghost_n == p->ghost_cap) {
        gtab_drop(p, p->ghost[p->ghost_head]);
        p->ghost_head = p->ghost_head + 1 == p->ghost_cap ? 0 : p->ghost_head + 1;
        p->ghost_n--;
    }
    uint32_t at = p->ghost_head + p->ghost_n;
    p->ghost[at >= p->ghost_cap ? at - p->ghost_cap : at] = f;
    p->ghost_n++;
    uint32_t s = gtab_find(p, f);
    p->gtab_fp[s] = f;
    p->gtab_n[s]++;
    if (p->gtab_info)
        p->gtab_info[s] = info;
}

/* Is key remembered in G? If so and info is not NULL, *info is the info of its latest
 * addition (0 without gtab_info). Cannot fail. */
bool kvp__ghost_find(const kvp__policy *p, kvp_key key, uint16_t *info)
{
    if (p->ghost_cap == 0)
        return false;
    uint32_t s = gtab_find(p, fingerprint(key));
    if (p->gtab_fp[s] == 0)
        return false;
    if (info)
        *info = p->gtab_info ? p->gtab_info[s] : 0;
    return true;
}

#define FAIL_IF(cond)                                                                              \
    do {                                                                                           \
        if (cond)                                                                                  \
            return kvp__fail(KVP_ECORRUPT, "invariant violated in %s: %s", __func__, #cond);       \
    } while (0)

/* Invariants above. KVP_OK, KVP_ECORRUPT or KVP_ENOMEM (the checker's scratch). */
int kvp__ghost_check(const kvp_cache *cache)
{
    const kvp__policy *p = &cache->policy;
    FAIL_IF(p->ghost_n > p->ghost_cap || (p->ghost_cap && p->ghost_head >= p->ghost_cap));
    if (p->ghost_cap == 0)
        return KVP_OK;
    kvp__mem *mem = (kvp__mem *)&cache->mem; /* scratch only: back to its count on return */
    size_t t = (size_t)p->gtab_mask + 1;
    uint32_t *occ = kvp__mem_calloc(mem, t, sizeof *occ);
    if (!occ)
        return kvp__fail(KVP_ENOMEM, "out of memory: the checker's %zu ghost counters", t);
    int rc = KVP_OK;
    for (uint32_t k = 0; k < p->ghost_n && rc == KVP_OK; k++) {
        uint64_t f = p->ghost[(p->ghost_head + k) % p->ghost_cap];
        uint32_t s = gtab_find(p, f);
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
