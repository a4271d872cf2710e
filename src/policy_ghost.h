/*
 * policy_ghost.h - the ghost's hot operations (add, find, take), inline in the policies that
 * use them (policy_s3fifo.c, policy_cdecay.c): what policy_ghost.c describes. Out-of-line
 * calls through a second file cost S3-FIFO 4% of its instructions per request on bench_core
 * (c).
 *
 * Each operation works on a kvp__gview, a copy of the ghost's fields that a loop keeps in
 * locals (kvp__gview_load before it, kvp__gview_store after it: only the ring's head and count
 * change): the per-block records' byte-wide fields may alias anything, so a store to one makes
 * the compiler reload every field of *p that the next operation reads (CDECAY's batched
 * evictions: about 15 instructions each). The kvp__ghost_* forms take the policy itself.
 */
#ifndef KVP_POLICY_GHOST_H
#define KVP_POLICY_GHOST_H

#include "internal.h"

/* The ghost's fields (kvp__policy: ghost, gtab_fp, gtab_n, gring, gslot, ghost_cap,
 * ghost_head, ghost_n, gtab_mask), borrowed by a loop. */
typedef struct kvp__gview {
    uint64_t *ring;   /* ghost (S3-FIFO) */
    uint64_t *fp;     /* gtab_fp (S3-FIFO) */
    uint32_t *n;      /* gtab_n (S3-FIFO) */
    uint32_t *lring;  /* gring (CDECAY) */
    kvp__gslot *slot; /* gslot (CDECAY; NULL under S3-FIFO) */
    uint32_t cap;     /* ghost_cap (0: no ghost) */
    uint32_t head;    /* ghost_head */
    uint32_t count;   /* ghost_n */
    uint32_t mask;    /* gtab_mask */
} kvp__gview;

static inline void kvp__gview_load(const kvp__policy *p, kvp__gview *g)
{
    g->ring = p->ghost;
    g->fp = p->gtab_fp;
    g->n = p->gtab_n;
    g->lring = p->gring;
    g->slot = p->gslot;
    g->cap = p->ghost_cap;
    g->head = p->ghost_head;
    g->count = p->ghost_n;
    g->mask = p->gtab_mask;
}

/* Write back what an add changes. */
static inline void kvp__gview_store(kvp__policy *p, const kvp__gview *g)
{
    p->ghost_head = g->head;
    p->ghost_n = g->count;
}

/* A key's nonzero 64-bit fingerprint (keys are uniform hashes: the low word, mixed with
 * the high one so that the test-only truncation still tells keys apart). */
static inline uint64_t kvp__ghost_fp(kvp_key key)
{
    uint64_t f = key.lo ^ (key.hi * UINT64_C(0x9e3779b97f4a7c15));
    return f ? f : 1;
}

static inline uint32_t kvp__gview_home(const kvp__gview *g, uint64_t f)
{
    return (uint32_t)(f ^ (f >> 32)) & g->mask;
}

/* The table slot holding fingerprint f, or the empty slot where it would go. */
static inline uint32_t kvp__gview_find(const kvp__gview *g, uint64_t f)
{
    uint32_t s = kvp__gview_home(g, f);
    while (g->fp[s] != 0 && g->fp[s] != f)
        s = (s + 1) & g->mask;
    return s;
}

/* S3-FIFO's table (counted, no infos): remove one occurrence of f (present) from the
 * multiset, by backward-shift deletion. */
static inline void kvp__gview_drop(kvp__gview *g, uint64_t f)
{
    uint32_t s = kvp__gview_find(g, f);
    assert(g->fp[s] == f && g->n[s] > 0);
    if (--g->n[s] > 0)
        return;
    for (uint32_t j = (s + 1) & g->mask;; j = (j + 1) & g->mask) {
        if (g->fp[j] == 0)
            break;
        uint32_t h = kvp__gview_home(g, g->fp[j]);
        /* Entry j may move to s iff its home is not in (s, j] cyclically. */
        if (((j - h) & g->mask) >= ((j - s) & g->mask)) {
            g->fp[s] = g->fp[j];
            g->n[s] = g->n[j];
            s = j;
        }
    }
    g->fp[s] = 0;
    g->n[s] = 0;
}

/* CDECAY's table (infos kept) is one array of slots (kvp__gslot: fingerprint, link, info)
 * and links each key to the ring instead of counting it: slot[s].link is 1 + the ring slot of
 * the key's latest addition (0: slot s empty), and the ring (lring, 32-bit) holds table
 * slots, not fingerprints (lring[k] = s: the slot its key had when added). A ring slot k
 * names its key's entry iff slot[lring[k]].link == k + 1; an older duplicate's ring slot
 * names a slot whose link is elsewhere. So the oldest key leaves with no probe, and the
 * deletion's shifts carry the links (each moved entry's ring slot is rewritten). */

/* CDECAY's table is addressed by byte offsets (a slot's number times 16): a probe adds 16 and
 * masks with mask16, and loads base + offset, with no scaling (x86 scales an index by 8 at
 * most). A fingerprint's home offset takes bits 4 and up of the same mix as
 * kvp__gview_home. */
static inline size_t kvp__gview_mask16(const kvp__gview *g)
{
    return (size_t)g->mask * sizeof(kvp__gslot);
}

static inline size_t kvp__gview_home16(size_t m16, uint64_t f)
{
    return (size_t)(f ^ (f >> 32)) & m16;
}

static inline kvp__gslot *kvp__gview_at(const kvp__gview *g, size_t off)
{
    return (kvp__gslot *)((char *)g->slot + off);
}

/* CDECAY's table slot holding fingerprint f, or the empty slot where it would go, as its byte
 * offset. */
static inline size_t kvp__gview_find_off(const kvp__gview *g, uint64_t f)
{
    size_t m16 = kvp__gview_mask16(g), o = kvp__gview_home16(m16, f);
    uint64_t x;
    while ((x = kvp__gview_at(g, o)->fp) != 0 && x != f)
        o = (o + sizeof(kvp__gslot)) & m16;
    return o;
}

/* The same as a slot number. */
static inline uint32_t kvp__gview_find_slot(const kvp__gview *g, uint64_t f)
{
    return (uint32_t)(kvp__gview_find_off(g, f) / sizeof(kvp__gslot));
}

/* Delete CDECAY's table slot at byte offset s (full, its ring link about to go): backward
 * shift, moving each entry's ring slot with it. */
static inline void kvp__gview_cut(kvp__gview *g, size_t s)
{
    size_t m16 = kvp__gview_mask16(g);
    for (size_t j = (s + sizeof(kvp__gslot)) & m16;; j = (j + sizeof(kvp__gslot)) & m16) {
        kvp__gslot *ej = kvp__gview_at(g, j);
        uint64_t fj = ej->fp;
        if (fj == 0)
            break;
        size_t h = kvp__gview_home16(m16, fj);
        /* Entry j may move to s iff its home is not in (s, j] cyclically. */
        if (((j - h) & m16) >= ((j - s) & m16)) {
            *kvp__gview_at(g, s) = *ej;
            g->lring[ej->link - 1] = (uint32_t)(s / sizeof(kvp__gslot));
            s = j;
        }
    }
    kvp__gview_at(g, s)->fp = 0;
    kvp__gview_at(g, s)->link = 0;
}

/* Fill CDECAY's table slot at byte offset off (empty) with f, linked to ring slot at, with
 * info. */
static inline void kvp__gview_fill(kvp__gview *g, size_t off, uint32_t at, uint64_t f,
                                   uint16_t info)
{
    kvp__gslot *e = kvp__gview_at(g, off); /* field by field: its pad is never read */
    e->fp = f;
    e->link = at + 1;
    e->info = info;
    g->lring[at] = (uint32_t)(off / sizeof(kvp__gslot));
}

/* CDECAY's add to a full ghost (count == cap > 0) at ring slot at, the oldest key's (the
 * caller moves head past it): that key leaves if the slot holds its latest addition, and f
 * with info takes the slot, which becomes the newest. */
static inline void kvp__gview_put_full(kvp__gview *g, uint32_t at, uint64_t f, uint16_t info)
{
    size_t s = (size_t)g->lring[at] * sizeof(kvp__gslot);
    if (kvp__gview_at(g, s)->link == at + 1)
        kvp__gview_cut(g, s);
    kvp__gview_fill(g, kvp__gview_find_off(g, f), at, f, info);
}

/* The same, at head, moving head on. */
static inline void kvp__gview_add_full(kvp__gview *g, uint64_t f, uint16_t info)
{
    uint32_t at = g->head;
    g->head = at + 1 == g->cap ? 0 : at + 1;
    kvp__gview_put_full(g, at, f, info);
}

/* CDECAY's add (the comment above): f with info into G (cap > 0). */
static inline void kvp__gview_add_linked(kvp__gview *g, uint64_t f, uint16_t info)
{
    if (g->count == g->cap) {
        kvp__gview_add_full(g, f, info);
        return;
    }
    uint32_t at = g->head + g->count;
    at = at >= g->cap ? at - g->cap : at;
    g->count++;
    kvp__gview_fill(g, kvp__gview_find_off(g, f), at, f, info);
}

/* Remember key in G (with info, kept if infos: CDECAY's table keeps them, S3-FIFO's does
 * not), forgetting G's oldest key when G is full. Cannot fail. */
static KVP__ALWAYS_INLINE void kvp__gview_add_fp(kvp__gview *g, uint64_t f, uint16_t info,
                                                 bool infos)
{
    if (g->cap == 0)
        return;
    assert(infos == (g->slot != NULL) && f != 0);
    if (infos) { /* CDECAY's: linked */
        kvp__gview_add_linked(g, f, info);
        return;
    }
    if (g->count == g->cap) {
        /* Full: the oldest key leaves, and the new one takes its ring slot (the slot after
         * the newest), which becomes the newest; the oldest is then the next slot. */
        uint32_t h = g->head;
        kvp__gview_drop(g, g->ring[h]);
        g->ring[h] = f;
        g->head = h + 1 == g->cap ? 0 : h + 1;
    } else {
        uint32_t at = g->head + g->count;
        g->ring[at >= g->cap ? at - g->cap : at] = f;
        g->count++;
    }
    uint32_t s = kvp__gview_find(g, f);
    g->fp[s] = f;
    g->n[s]++;
}

static KVP__ALWAYS_INLINE void kvp__gview_add(kvp__gview *g, kvp_key key, uint16_t info, bool infos)
{
    kvp__gview_add_fp(g, kvp__ghost_fp(key), info, infos);
}

/* The same on the policy's own fields, one operation at a time. */
static inline uint32_t kvp__gtab_find(const kvp__policy *p, uint64_t f)
{
    kvp__gview g;
    kvp__gview_load(p, &g);
    return kvp__gview_find(&g, f);
}

static inline void kvp__ghost_add(kvp__policy *p, kvp_key key, uint16_t info, bool infos)
{
    kvp__gview g;
    kvp__gview_load(p, &g);
    kvp__gview_add(&g, key, info, infos);
    kvp__gview_store(p, &g);
}

static inline void kvp__ghost_add_fp(kvp__policy *p, uint64_t f, uint16_t info, bool infos)
{
    kvp__gview g;
    kvp__gview_load(p, &g);
    kvp__gview_add_fp(&g, f, info, infos);
    kvp__gview_store(p, &g);
}

/* Is fingerprint f in G? */
static inline bool kvp__ghost_has_fp(const kvp__policy *p, uint64_t f)
{
    return p->ghost_cap != 0 && p->gtab_fp[kvp__gtab_find(p, f)] != 0;
}

#endif /* KVP_POLICY_GHOST_H */
