/*
 * router.h - the router index's private structures and the kvp__rt_ functions shared by
 * its source files (src/events/router*.c). Nothing here is installed or exported.
 *
 *   kvp_router
 *    |- lock            one writer-preferring reader/writer lock (router.c)
 *    |- table           block hash -> holder set (router_table.c):
 *    |                    slots[cap]: {key, hv}, open addressing, robin hood order
 *    |                    hv inline:  up to 3 holders of 21 bits (worker 15 | media 6)
 *    |                    hv spill:   class, count, record index into arenas[class]
 *    |- workers[n_slots] engine id, dp rank, group, sequence state (router_workers.c)
 *    |- groups[]         one kvp_hasher per (hash configuration, model) (router_workers.c)
 *    `- media[]          tier names and weights; weight_of_mask[] per media bit set
 *
 * A holder is a (worker slot, media mask) pair, written as one uint32 in spill records
 * and when decoded: worker << 8 | mask. A worker appears at most once in a holder set and
 * its mask is never 0. Empty slots have hv == 0 (a live entry has at least one holder, so
 * its hv is never 0).
 *
 * Files: router.c (config, lifecycle, lock, public entry points, stats, check driver),
 * router_table.c (the table), router_workers.c (workers, hash groups, media),
 * router_apply.c (batch validation, sequence numbers, apply), router_score.c (scoring).
 */
#ifndef KVP_EVENTS_ROUTER_H
#define KVP_EVENTS_ROUTER_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvprefix_events.h"

#define KVP__RT_NIL         UINT32_MAX /* "no slot / no record" */
#define KVP__RT_WORKER_BITS 15u        /* worker slot bits in an inline holder */
#define KVP__RT_MEDIA_BITS  6u         /* media mask bits (KVP_ROUTER_MAX_MEDIA) */
#define KVP__RT_INLINE      3u         /* holders that fit in hv */
#define KVP__RT_N_CLASSES   14u        /* spill record classes: 4 << c holders, c < 14 */
#define KVP__RT_SPILL_BIT   (UINT64_C(1) << 63)

/* ---------------------------------------------------------------- memory (router.c) */

/* The router's allocator: the caller's hooks (or malloc/free) plus a live-byte count. */
typedef struct kvp__rt_mem {
    kvp_allocator hooks; /* alloc/free never NULL after kvp__rt_mem_init */
    size_t live_bytes;   /* bytes currently allocated through the hooks (writer-owned) */
} kvp__rt_mem;

void kvp__rt_mem_init(kvp__rt_mem *mem, const kvp_allocator *hooks);
void *kvp__rt_alloc(kvp__rt_mem *mem, size_t size);
void kvp__rt_free(kvp__rt_mem *mem, void *ptr, size_t size);

/* ---------------------------------------------------------------- table (router_table.c) */

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

/* ---------------------------------------------------------------- workers, groups, media */

/* A hash group: workers whose keys are computed by one hasher (equal hash fields and
 * model). Immutable once published (groups are never freed before the router), so score
 * may use it outside the lock. */
typedef struct kvp__rt_group {
    kvp_hasher *hasher;   /* the group's key function */
    kvp_config hash;      /* hash fields as given (vllm_seed points at vllm_seed_copy) */
    char *vllm_seed_copy; /* owned copy of hash.vllm_seed, or NULL */
    size_t vllm_seed_len; /* bytes of vllm_seed_copy with its NUL */
    char *model;          /* owned model label, or NULL */
    size_t model_len;     /* strlen(model), when model */
    bool is_vllm;         /* vllm-* profile: keys never contain the model */
} kvp__rt_group;

/* One worker slot. live == false: a free slot (no holder names it). */
typedef struct kvp__rt_worker {
    char *engine_id;      /* owned, NUL-terminated; NULL when the slot is free */
    size_t engine_len;    /* strlen(engine_id) */
    int64_t dp_rank;      /* data-parallel rank */
    uint32_t group;       /* index in router->groups */
    uint32_t row;         /* position among live workers (score rows), when live */
    bool live;            /* the slot is in use */
    bool stale;           /* ignored by score until fresh again */
    bool partial;         /* the view lacks history: stale since, or restarted from a batch
                             other than 0 (resync, a store's local follow); whole again at a
                             batch numbered 0 or an AllBlocksCleared. A partial view never
                             re-seeds a shared store */
    bool seq_known;       /* expected is meaningful (false just after mark_stale) */
    uint64_t expected;    /* next sequence number, when seq_known */
    double ts0;           /* ts of the batch numbered 0 last applied (restart test) */
    uint64_t n_blocks;    /* holder sets naming this worker */
    uint64_t n_batches;   /* batches applied */
    uint64_t n_gaps;      /* GAP results */
    uint64_t n_restarts;  /* RESTARTED results */
    uint64_t n_malformed; /* KVP_EINVAL results */
} kvp__rt_worker;

/* The shared store (router_redis.h), NULL for an in-memory router. */
typedef struct kvp__rr kvp__rr;

typedef struct kvp__rt_medium {
    char name[KVP_ROUTER_MEDIUM_MAX + 1]; /* NUL-terminated, compared ignoring case */
    double weight;                        /* score per block in this tier */
} kvp__rt_medium;

struct kvp_router {
    kvp__rt_mem mem;                                 /* allocator (counts live bytes) */
    pthread_rwlock_t lock;                           /* see router.c */
    kvp__rt_table table;                             /* block hash -> holders */
    kvp__rt_worker *workers;                         /* cap_workers slots */
    uint32_t n_slots;                                /* slots ever used (high-water mark) */
    uint32_t cap_workers;                            /* slots allocated */
    uint32_t n_workers;                              /* live workers */
    kvp__rt_group *groups[KVP_ROUTER_MAX_GROUPS];    /* hash groups, [0 .. n_groups) */
    uint32_t n_groups;                               /* groups made */
    kvp__rt_medium media[KVP_ROUTER_MAX_MEDIA];      /* tiers, [0 .. n_media) */
    uint32_t n_media;                                /* tiers registered */
    double weight_of_mask[1u << KVP__RT_MEDIA_BITS]; /* best tier weight of a media mask */
    uint32_t default_medium;                         /* medium index of nil */
    double unknown_weight;                           /* weight of media first seen in events */
    int32_t kv_group;                                /* vLLM KV cache group indexed */
    uint32_t default_group;                          /* group of workers made by _get, or NIL */
    kvp_config default_hash;                         /* hash fields of workers made by _get */
    char *default_vllm_seed;                         /* owned copy for default_hash */
    size_t default_vllm_seed_len;                    /* its size with the NUL */
    uint64_t epoch;                                  /* bumped when the worker set changes */
    uint64_t version; /* bumped by every exclusive section (scores resume if unchanged) */
    uint64_t n_batches, n_events_stored, n_events_removed, n_events_cleared;
    uint64_t n_events_skipped, n_duplicates, n_gaps, n_restarts, n_malformed;
    atomic_ullong n_scores; /* score calls (shared lock: atomic) */
    kvp__rr *rr;            /* the shared store, or NULL (set at creation, then constant) */
};

static inline bool kvp__rt_worker_ok(const kvp_router *r, uint32_t id)
{
    return id < r->n_slots && r->workers[id].live;
}

/* Workers and groups (router_workers.c); all _locked: the caller holds the lock
 * exclusively (find: shared). Return codes as the public calls. */
int kvp__rt_worker_add_locked(kvp_router *r, const kvp_router_worker_config *wc, uint32_t *id);
int kvp__rt_worker_find_locked(const kvp_router *r, const char *engine_id, int64_t dp_rank,
                               uint32_t *id);
int kvp__rt_worker_remove_locked(kvp_router *r, uint32_t id);
void kvp__rt_workers_destroy(kvp_router *r);
/* Copy the hash fields of src into dst, with vllm_seed pointing at a fresh owned copy in
 * *seed_copy (size *seed_len). KVP_OK or KVP_ENOMEM. */
int kvp__rt_hash_copy(kvp__rt_mem *mem, const kvp_config *src, kvp_config *dst, char **seed_copy,
                      size_t *seed_len);

/* Media (router_workers.c). The index of medium name (ignoring case), or KVP__RT_NIL. */
uint32_t kvp__rt_medium_find(const kvp_router *r, const char *name);
/* Register a new medium (name not present, room left, name valid). Cannot fail. */
uint32_t kvp__rt_medium_add(kvp_router *r, const char *name, double weight);

/* Clear worker id's blocks (the table and its count). Cannot fail. */
void kvp__rt_worker_clear(kvp_router *r, uint32_t id);

/* Apply (router_apply.c), with the lock held exclusively. */
int kvp__rt_apply_locked(kvp_router *r, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                         kvp_router_apply_result *res);

/* kvp_router_apply's body (router.c), lock held exclusively; r not NULL. Returns as
 * kvp_router_apply, res filled. */
int kvp__rt_apply_one_locked(kvp_router *r, uint32_t id, uint64_t seq, const kvp_kv_batch *b,
                             kvp_router_apply_result *res);

/* kvp_router_mark_stale's body for a live worker, lock held exclusively. Cannot fail. */
void kvp__rt_mark_stale_locked(kvp_router *r, uint32_t id);

/* Score (router_score.c); takes the lock itself (shared), per group. */
int kvp__rt_score(kvp_router *r, const kvp_namespace *ns, const uint32_t *tokens, size_t n_tokens,
                  kvp_router_row *rows, size_t cap, size_t *n_rows);

/* kvp_router_score_hashes on the local index (router_score.c), under one hold of the
 * shared lock. Arguments checked by the caller; returns as kvp_router_score_hashes. */
int kvp__rt_score_hashes(kvp_router *r, const uint64_t *hashes, size_t n_hashes,
                         kvp_router_row *rows, size_t cap, size_t *n_rows);

/* Group g's keys of tokens[0 .. n_tokens) under namespace ns, for a caller that probes
 * them elsewhere (the Redis store): keys[0 .. n_tokens / block size) (room given by the
 * caller), *state KVP_ROUTER_ROW_SCORED; or *state MODEL, NOTSUP or TOKEN (no keys) as
 * kvp_router_score marks the group's rows. g is a published group (immutable: no lock
 * needed). Returns KVP_OK or KVP_EINVAL (a namespace the hasher refuses). */
int kvp__rt_group_keys(const kvp__rt_group *g, const kvp_namespace *ns, const uint32_t *tokens,
                       size_t n_tokens, uint64_t *keys, int *state);

/* Lock helpers (router.c). */
void kvp__rt_rdlock(kvp_router *r);
void kvp__rt_wrlock(kvp_router *r);
void kvp__rt_unlock(kvp_router *r);

#endif /* KVP_EVENTS_ROUTER_H */
