/*
 * router_table.h - the router index's hash table (router_table.c): block hash -> holder set.
 *
 *   slots[cap]   {key, hv}, open addressing, robin hood order
 *   hv inline:   up to 3 holders of 21 bits (worker 15 | media 6)
 *   hv spill:    class, count, record index into arenas[class]
 *
 * A holder is a (worker slot, media mask) pair, written as one uint32 in spill records
 * and when decoded: worker << 8 | mask. A worker appears at most once in a holder set and
 * its mask is never 0. Empty slots have hv == 0 (a live entry has at least one holder, so
 * its hv is never 0). The table knows workers only as 15-bit numbers: it includes
 * router_base.h and nothing above it. Its caller holds the index lock (router_store.h):
 * exclusively for the mutations, shared at least for the reads.
 */
#ifndef KVP_EVENTS_ROUTER_TABLE_H
#define KVP_EVENTS_ROUTER_TABLE_H

#include "router_base.h"

#define KVP__RT_WORKER_BITS 15u /* worker slot bits in an inline holder */
#define KVP__RT_MEDIA_BITS  6u  /* media mask bits (KVP_ROUTER_MAX_MEDIA) */
#define KVP__RT_INLINE      3u  /* holders that fit in hv */
#define KVP__RT_N_CLASSES   14u /* spill record classes: 4 << c holders, c < 14 */
#define KVP__RT_SPILL_BIT   (UINT64_C(1) << 63)

typedef struct kvp__rt_slot {
    uint64_t key; /* the block hash (event integer); meaningful when hv != 0 */
    uint64_t hv;  /* holder set: 0 empty slot, else inline or spill (see above) */
} kvp__rt_slot;

/* Spill records of one class: cap_records records of (4 << class) uint32 holders. */
typedef struct kvp__rt_arena {
    uint32_t *words;      /* cap_records * (4 << class) holders */
    uint32_t n_records;   /* records ever handed out (high-water mark) */
    uint32_t cap_records; /* records allocated */
    uint32_t free_head;   /* first free record (its word 0 links the next), or NIL */
    uint32_t n_free;      /* records on the free list */
} kvp__rt_arena;

typedef struct kvp__rt_table {
    kvp__rt_slot *slots;                     /* cap slots, NULL when cap == 0 */
    uint32_t cap;                            /* slots; 0 or >= 16 */
    uint32_t n_entries;                      /* live slots (distinct block hashes) */
    uint64_t n_holders;                      /* (block, worker) pairs */
    uint64_t n_holder_media;                 /* (block, worker, medium) triples */
    uint64_t seed;                           /* position mixer */
    kvp__rt_arena arenas[KVP__RT_N_CLASSES]; /* spill records by class */
    kvp__rt_mem *mem;                        /* the router's allocator */
} kvp__rt_table;

/* Decoded holder set: holders h[0 .. n) as worker << 8 | mask. Points into the table
 * (spill) or at inl (inline); valid until the next mutation. */
typedef struct kvp__rt_holders {
    const uint32_t *h;            /* the holders */
    uint32_t n;                   /* how many */
    uint32_t inl[KVP__RT_INLINE]; /* storage for inline holders */
} kvp__rt_holders;

static inline uint32_t kvp__rt_holder_worker(uint32_t h)
{
    return h >> 8;
}

static inline uint32_t kvp__rt_holder_mask(uint32_t h)
{
    return h & 0xffu;
}

static inline bool kvp__rt_hv_is_spill(uint64_t hv)
{
    return (hv & KVP__RT_SPILL_BIT) != 0;
}

/* The position mixer: splitmix64's finalizer over key ^ seed (not a PRF: it only spreads
 * keys; see router_table.c). */
static inline uint64_t kvp__rt_mix(uint64_t k, uint64_t seed)
{
    k ^= seed;
    k = (k ^ (k >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    k = (k ^ (k >> 27)) * UINT64_C(0x94d049bb133111eb);
    return k ^ (k >> 31);
}

/* Home slot of key: the top 32 bits of the mix scaled to cap (no power-of-two needed).
 * cap must be non-zero. */
static inline uint32_t kvp__rt_home(const kvp__rt_table *t, uint64_t key)
{
    return (uint32_t)(((kvp__rt_mix(key, t->seed) >> 32) * (uint64_t)t->cap) >> 32);
}

/* Hint the cache to fetch key's home slot (score probes ahead). The table must have slots.
 * Cannot fail. */
static inline void kvp__rt_prefetch(const kvp__rt_table *t, uint64_t key)
{
    assert(t->cap != 0);
#if defined(__GNUC__)
    /* kvp__rt_home's position kept 64-bit, without a branch: GCC 12 drops a prefetch in a
     * loop whose index goes through a uint32_t cast or sits behind a condition. */
    __builtin_prefetch(&t->slots[((kvp__rt_mix(key, t->seed) >> 32) * (uint64_t)t->cap) >> 32]);
#else
    (void)key;
#endif
}

void kvp__rt_table_init(kvp__rt_table *t, kvp__rt_mem *mem, uint64_t seed);
void kvp__rt_table_destroy(kvp__rt_table *t);

/* Make room for n_new more entries without growing during the next inserts. KVP_OK,
 * KVP_ENOMEM (table unchanged). */
int kvp__rt_table_reserve(kvp__rt_table *t, uint64_t n_new);

/* The slot holding key, or KVP__RT_NIL. Cannot fail. */
uint32_t kvp__rt_find(const kvp__rt_table *t, uint64_t key);

/* Decode the holder set of a live slot into *out. Cannot fail. */
void kvp__rt_holders_of(const kvp__rt_table *t, uint32_t slot, kvp__rt_holders *out);

/* Make sure that adding worker to key's holder set (if key is present and worker is not a
 * holder) will not need memory: grows the set's storage ahead. *absent says whether key is
 * not indexed (adding it needs a table slot: kvp__rt_table_reserve). KVP_OK or KVP_ENOMEM
 * (the set's contents unchanged either way). */
int kvp__rt_prepare_add(kvp__rt_table *t, uint64_t key, uint32_t worker, bool *absent);

/* Add medium bit `bit` of worker to key (inserting key if absent). Needs the room that
 * kvp__rt_table_reserve and kvp__rt_prepare_add made. Returns true when the worker was not
 * a holder of key before. Cannot fail. */
bool kvp__rt_add(kvp__rt_table *t, uint64_t key, uint32_t worker, uint32_t bit);

/* Remove the media in `mask` of worker from key. Returns true when the worker held key and
 * now holds it in no medium. Cannot fail; never allocates. */
bool kvp__rt_remove(kvp__rt_table *t, uint64_t key, uint32_t worker, uint32_t mask);

/* The media mask worker holds key in; 0 when it does not hold key. Cannot fail. */
uint32_t kvp__rt_held_mask(const kvp__rt_table *t, uint64_t key, uint32_t worker);

/* Remove worker from every holder set; returns the number of sets it was in. O(cap).
 * Cannot fail; never allocates. */
uint64_t kvp__rt_clear_worker(kvp__rt_table *t, uint32_t worker);

/* Bytes of slots and spill records as allocated. Cannot fail. */
uint64_t kvp__rt_table_bytes(const kvp__rt_table *t);

/* Check the table; counts[w] += blocks held by worker w for w < n_workers (a holder of
 * a worker at or above n_workers, or whose live[w] is false, is corruption); media_ok is
 * the mask of registered media. KVP_OK or KVP_ECORRUPT. */
int kvp__rt_table_check(const kvp__rt_table *t, uint64_t *counts, const bool *live,
                        uint32_t n_workers, uint32_t media_ok);

#endif /* KVP_EVENTS_ROUTER_TABLE_H */
