/*
 * policy_ghost.h - the ghost's hot operations (add, find), inline in the policies that use
 * them (policy_s3fifo.c, policy_cdecay.c): what policy_ghost.c describes. Out-of-line calls
 * through a second file cost S3-FIFO 4% of its instructions per request on bench_core (c).
 */
#ifndef KVP_POLICY_GHOST_H
#define KVP_POLICY_GHOST_H

#include "internal.h"

/* A key's nonzero 64-bit fingerprint (keys are uniform hashes: the low word, mixed with
 * the high one so that the test-only truncation still tells keys apart). */
static inline uint64_t kvp__ghost_fp(kvp_key key)
{
    uint64_t f = key.lo ^ (key.hi * UINT64_C(0x9e3779b97f4a7c15));
    return f ? f : 1;
}

static inline uint32_t kvp__ghost_home(const kvp__policy *p, uint64_t f)
{
    return (uint32_t)(f ^ (f >> 32)) & p->gtab_mask;
}

/* The table slot holding fingerprint f, or the empty slot where it would go. */
static inline uint32_t kvp__gtab_find(const kvp__policy *p, uint64_t f)
{
    uint32_t s = kvp__ghost_home(p, f);
    while (p->gtab_fp[s] != 0 && p->gtab_fp[s] != f)
        s = (s + 1) & p->gtab_mask;
    return s;
}

/* Remove one occurrence of f (present) from the multiset: backward-shift deletion (infos:
 * the table keeps infos, gtab_info; a constant in each policy's copy). */
static inline void kvp__gtab_drop(kvp__policy *p, uint64_t f, bool infos)
{
    uint32_t s = kvp__gtab_find(p, f);
    assert(p->gtab_fp[s] == f && p->gtab_n[s] > 0);
    if (--p->gtab_n[s] > 0)
        return;
    for (uint32_t j = (s + 1) & p->gtab_mask;; j = (j + 1) & p->gtab_mask) {
        if (p->gtab_fp[j] == 0)
            break;
        uint32_t h = kvp__ghost_home(p, p->gtab_fp[j]);
        /* Entry j may move to s iff its home is not in (s, j] cyclically. */
        if (((j - h) & p->gtab_mask) >= ((j - s) & p->gtab_mask)) {
            p->gtab_fp[s] = p->gtab_fp[j];
            p->gtab_n[s] = p->gtab_n[j];
            if (infos)
                p->gtab_info[s] = p->gtab_info[j];
            s = j;
        }
    }
    p->gtab_fp[s] = 0;
    p->gtab_n[s] = 0;
}

/* Remember key in G (with info, kept if infos: the table keeps them, gtab_info, as CDECAY's
 * does and S3-FIFO's does not), forgetting G's oldest key when G is full. Cannot fail. */
static inline void kvp__ghost_add(kvp__policy *p, kvp_key key, uint16_t info, bool infos)
{
    if (p->ghost_cap == 0)
        return;
    assert(infos == (p->gtab_info != NULL));
    uint64_t f = kvp__ghost_fp(key);
    if (p->ghost_n == p->ghost_cap) {
        /* Full: the oldest key leaves, and the new one takes its ring slot (the slot after
         * the newest), which becomes the newest; the oldest is then the next slot. */
        uint32_t h = p->ghost_head;
        kvp__gtab_drop(p, p->ghost[h], infos);
        p->ghost[h] = f;
        p->ghost_head = h + 1 == p->ghost_cap ? 0 : h + 1;
    } else {
        uint32_t at = p->ghost_head + p->ghost_n;
        p->ghost[at >= p->ghost_cap ? at - p->ghost_cap : at] = f;
        p->ghost_n++;
    }
    uint32_t s = kvp__gtab_find(p, f);
    p->gtab_fp[s] = f;
    p->gtab_n[s]++;
    if (infos)
        p->gtab_info[s] = info;
}

/* Is key remembered in G? If so and info is not NULL, *info is the info of its latest
 * addition (0 without gtab_info). Cannot fail. */
static inline bool kvp__ghost_find(const kvp__policy *p, kvp_key key, uint16_t *info)
{
    if (p->ghost_cap == 0)
        return false;
    uint32_t s = kvp__gtab_find(p, kvp__ghost_fp(key));
    if (p->gtab_fp[s] == 0)
        return false;
    if (info)
        *info = p->gtab_info ? p->gtab_info[s] : 0;
    return true;
}

/* As kvp__ghost_find, and key's info is spent: until key is added again, a find gives info
 * 0, so that the history one eviction left is learned from once (CDECAY). Cannot fail. */
static inline bool kvp__ghost_take(kvp__policy *p, kvp_key key, uint16_t *info)
{
    if (p->ghost_cap == 0)
        return false;
    uint32_t s = kvp__gtab_find(p, kvp__ghost_fp(key));
    if (p->gtab_fp[s] == 0)
        return false;
    *info = p->gtab_info ? p->gtab_info[s] : 0;
    if (p->gtab_info)
        p->gtab_info[s] = 0;
    return true;
}

#endif /* KVP_POLICY_GHOST_H */
