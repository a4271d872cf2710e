/*
 * router_workers.h - the router's in-memory index (kvp__rt_index): the table, the workers,
 * their hash groups and names, the storage tiers and the counters, with the functions of
 * router_workers.c that manage them. Both stores (router_store.h) keep one of these: it is
 * the local view, and the Redis store's fallback.
 *
 *   kvp__rt_index
 *    |- mem, lock       allocator and index lock (router_base.h)
 *    |- table           block hash -> holder set (router_table.h)
 *    |- workers[n_slots] engine id, dp rank, group, sequence state
 *    |- names[n_names]  every engine id ever added, kept until the index is destroyed
 *    |- groups[]        one kvp_hasher per (hash configuration, model)
 *    `- media[]         tier names and weights; weight_of_mask[] per media bit set
 *
 * Lifetimes that readers outside the lock rely on: a published group is immutable and
 * lives until the index is destroyed (score hashes with it unlocked); an engine id string
 * (names[]) is immutable and lives until the index is destroyed, whatever happens to its
 * worker (score rows hand it to the caller: kvp_router_score_result.engine_ids).
 *
 * Locking (router_store.h): the functions named _locked need the index lock, exclusively
 * for those that change the index, at least shared for the others.
 */
#ifndef KVP_EVENTS_ROUTER_WORKERS_H
#define KVP_EVENTS_ROUTER_WORKERS_H

#include <stdatomic.h>

#include "router_table.h"
#include "router_tmap.h"

/* A hash group: workers whose keys are computed by one hasher (equal hash fields and
 * model). Immutable once published (groups are never freed before the index), so score
 * may use it outside the lock. */
typedef struct kvp__rt_group {
    kvp_hasher *hasher;   /* the group's key function */
    kvp_config hash;      /* hash fields as given (vllm_seed points at vllm_seed_copy) */
    char *vllm_seed_copy; /* owned copy of hash.vllm_seed, or NULL */
    size_t vllm_seed_len; /* bytes of vllm_seed_copy with its NUL */
    char *model;          /* owned model label, or NULL */
    size_t model_len;     /* strlen(model), when model */
    bool is_vllm;         /* vllm-* profile: keys never contain the model */
    bool own;             /* token mode: the router's own key function (hash is
                             kvp_router_config.token_hash with the workers' block size) */
} kvp__rt_group;

/* One worker slot. live == false: a free slot (no holder names it). */
typedef struct kvp__rt_worker {
    const char *engine_id; /* NUL-terminated, in names[] (not owned by the slot: it outlives
                              the worker); NULL when the slot is free */
    size_t engine_len;     /* strlen(engine_id) */
    int64_t dp_rank;       /* data-parallel rank */
    uint32_t group;        /* index in groups */
    uint32_t row;          /* position among live workers (score rows), when live */
    bool live;             /* the slot is in use */
    bool stale;            /* ignored by score until fresh again */
    bool partial;          /* the view lacks history: stale since, or restarted from a batch
                              other than 0 (resync, a store's local follow); whole again at a
                              batch numbered 0 or an AllBlocksCleared. A partial view never
                              re-seeds a shared store */
    bool seq_known;        /* expected is meaningful (false just after mark_stale) */
    uint64_t expected;     /* next sequence number, when seq_known */
    double ts0;            /* ts of the batch numbered 0 last applied (restart test) */
    uint64_t n_blocks;     /* holder sets naming this worker */
    uint64_t n_batches;    /* batches applied */
    uint64_t n_gaps;       /* GAP results */
    uint64_t n_restarts;   /* RESTARTED results */
    uint64_t n_malformed;  /* KVP_EINVAL results */
    /* Token mode only (empty in engine-hash mode): */
    kvp__rt_tmap tmap;          /* engine block hash -> own key and media, one entry per
                                   engine hash the worker holds */
    kvp__rt_tmap refs;          /* own keys that several of the worker's engine hashes name
                                   (aux: how many); an own key absent here is named once */
    uint64_t n_keyed;           /* stored blocks indexed under an own key */
    uint64_t n_unresolved;      /* stored blocks not indexed: parent's own key unknown */
    uint64_t n_unkeyable;       /* stored blocks not indexed: extra_keys, a lora_id without
                                   a name, a token id above vocab_size */
    uint64_t n_unknown_removed; /* removed engine hashes not in the map */
} kvp__rt_worker;

/* An engine id, interned: one copy per distinct string ever added. */
typedef struct kvp__rt_name {
    char *s;    /* owned, NUL-terminated, never changed or freed before the index */
    size_t len; /* strlen(s) */
} kvp__rt_name;

typedef struct kvp__rt_medium {
    char name[KVP_ROUTER_MEDIUM_MAX + 1]; /* NUL-terminated, compared ignoring case */
    double weight;                        /* score per block in this tier */
} kvp__rt_medium;

typedef struct kvp__rt_index {
    kvp__rt_mem mem;                                 /* allocator (counts live bytes) */
    kvp__rt_lock lock;                               /* the index lock (router_store.h) */
    kvp__rt_table table;                             /* block hash -> holders */
    kvp__rt_worker *workers;                         /* cap_workers slots */
    uint32_t n_slots;                                /* slots ever used (high-water mark) */
    uint32_t cap_workers;                            /* slots allocated */
    uint32_t n_workers;                              /* live workers */
    kvp__rt_name *names;                             /* interned engine ids, [0 .. n_names) */
    uint32_t n_names;                                /* names interned */
    uint32_t cap_names;                              /* room in names */
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
    bool by_tokens;                                  /* token mode (KVP_ROUTER_INDEX_TOKENS) */
    kvp_config token_hash;                           /* token mode: the own key function */
    uint64_t n_batches, n_events_stored, n_events_removed, n_events_cleared;
    uint64_t n_events_skipped, n_duplicates, n_gaps, n_restarts, n_malformed;
    atomic_ullong n_scores; /* successful scores (counted under the shared lock: atomic) */
} kvp__rt_index;

static inline bool kvp__rt_worker_ok(const kvp__rt_index *ix, uint32_t id)
{
    return id < ix->n_slots && ix->workers[id].live;
}

/* Whether a BlockStored's extra_keys are absent, nil or a list of nil only (msgpack): the
 * block keys hold nothing but the tokens, the parent and the LoRA name. Cannot fail. */
static inline bool kvp__rt_extra_keys_none(const kvp_kv_event *e)
{
    const uint8_t *p = e->extra_keys;
    size_t n = e->extra_keys_bytes, count = 0, i = 0;
    if (!p || n == 0)
        return true;
    if (p[0] == 0xc0)
        return n == 1;
    if ((p[0] & 0xf0) == 0x90) {
        count = p[0] & 0x0fu;
        i = 1;
    } else if (p[0] == 0xdc && n >= 3) {
        count = (size_t)p[1] << 8 | p[2];
        i = 3;
    } else if (p[0] == 0xdd && n >= 5) {
        count = (size_t)p[1] << 24 | (size_t)p[2] << 16 | (size_t)p[3] << 8 | p[4];
        i = 5;
    } else {
        return false;
    }
    if (n - i != count)
        return false;
    for (; i < n; i++) {
        if (p[i] != 0xc0)
            return false;
    }
    return true;
}

/* Set up an empty index in *ix from cfg (validated by the caller) with table seed `seed`,
 * allocating through mem (copied into ix). KVP_OK; KVP_EINVAL (the default hash config is
 * refused by kvp_hasher_new, or no room for the default medium); KVP_ENOMEM. On failure
 * *ix holds what was made: kvp__rt_index_destroy frees it. */
int kvp__rt_index_init(kvp__rt_index *ix, const kvp__rt_mem *mem, const kvp_router_config *cfg,
                       uint64_t seed);

/* Free everything the index holds (not ix itself; ix->mem keeps its count). Must not race
 * with any other call. Cannot fail. */
void kvp__rt_index_destroy(kvp__rt_index *ix);

/* Workers (exclusive lock; find: shared). Return codes as the public calls. */
int kvp__rt_worker_add_locked(kvp__rt_index *ix, const kvp_router_worker_config *wc, uint32_t *id);
int kvp__rt_worker_find_locked(const kvp__rt_index *ix, const char *engine_id, int64_t dp_rank,
                               uint32_t *id);
int kvp__rt_worker_remove_locked(kvp__rt_index *ix, uint32_t id);

/* kvp_router_worker_get's body: find (engine_id, dp_rank) or add it with the default hash
 * config. Exclusive lock. Returns as kvp_router_worker_add, never KVP_EEXIST. */
int kvp__rt_worker_get_locked(kvp__rt_index *ix, const char *engine_id, int64_t dp_rank,
                              uint32_t *id);

/* Clear worker id's blocks (the table and its count; in token mode its maps too, freed).
 * Exclusive lock. Cannot fail. */
void kvp__rt_worker_clear_locked(kvp__rt_index *ix, uint32_t id);

/* The same, keeping the maps' room (apply: room made in its step 3 must survive a clear in
 * its step 4). Exclusive lock. Cannot fail. */
void kvp__rt_worker_reset_locked(kvp__rt_index *ix, uint32_t id);

/* Token mode: the token figures of worker id, or of every worker (id KVP_ROUTER_ALL_WORKERS).
 * KVP_OK or KVP_ENOENT. Shared lock. */
int kvp__rt_token_stats_locked(const kvp__rt_index *ix, uint32_t id, kvp_router_token_stats *out);

/* kvp_router_mark_stale's body for a live worker: cleared, stale, partial, sequence
 * unknown. Exclusive lock. Cannot fail. */
void kvp__rt_mark_stale_locked(kvp__rt_index *ix, uint32_t id);

/* kvp_router_resync's body: KVP_OK (the worker is fresh) or KVP_ENOENT. Exclusive lock. */
int kvp__rt_resync_locked(kvp__rt_index *ix, uint32_t id);

/* Copy the hash fields of src into dst, with vllm_seed pointing at a fresh owned copy in
 * *seed_copy (size *seed_len). KVP_OK or KVP_ENOMEM. */
int kvp__rt_hash_copy(kvp__rt_mem *mem, const kvp_config *src, kvp_config *dst, char **seed_copy,
                      size_t *seed_len);

/* Media. The index of medium name (ignoring case), or KVP__RT_NIL. */
uint32_t kvp__rt_medium_find(const kvp__rt_index *ix, const char *name);
/* Register a new medium (name not present, room left, name valid). Cannot fail. */
uint32_t kvp__rt_medium_add(kvp__rt_index *ix, const char *name, double weight);

/* The index's fields of kvp_router_stats (shared lock; n_scores read atomically). Cannot
 * fail. */
void kvp__rt_index_stats_locked(const kvp__rt_index *ix, kvp_router_stats *st);

/* kvp_router_worker_stats_get's body: KVP_OK or KVP_ENOENT. Shared lock. */
int kvp__rt_worker_stats_locked(const kvp__rt_index *ix, uint32_t id, kvp_router_worker_stats *out);

/* The whole index's invariants (kvp_router_check). KVP_OK, KVP_ECORRUPT, KVP_ENOMEM (the
 * checker's scratch). Shared lock. */
int kvp__rt_index_check_locked(const kvp__rt_index *ix);

#endif /* KVP_EVENTS_ROUTER_WORKERS_H */
