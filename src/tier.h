/*
 * tier.h - the lower tiers of a cache (host memory, disk, remote store) and the copy orders
 * between them and the device pool. Private to the library.
 *
 *   kvp_cache.tiers -> kvp__tiers (NULL until kvp_cache_add_tier)
 *    |- tier[1 .. n_tiers-1]   one kvp__tier each:
 *    |     blocks[0 .. n_blocks)  state FREE | PENDING | READY, key, load pins, links
 *    |     slots[0 .. mask]       open addressing, key -> block id (linear probing,
 *    |                            backward-shift deletion): every PENDING and READY block
 *    |     free list              FREE blocks, singly linked through next
 *    |     LRU list               under LRU: READY blocks, oldest first, doubly linked
 *    |                            (prev/next); blocks pinned by loads stay in it and are
 *    |                            skipped
 *    |     pol                    under another policy (policy.h): its order of the READY
 *    |                            blocks no load pins (n_listed of them); the LRU list
 *    |                            stays empty
 *    `- orders[0 .. cap_orders)  live orders by slot (an order id is serial << 32 | slot);
 *          free slots linked through next; STORE orders not handed out yet form a FIFO
 *          (new_head .. new_tail through next)
 *
 * Invariants (kvp__tier_check): a PENDING block has exactly one live STORE order naming it,
 * which pins that order's device block once (ref counted in kvp__requests_check through
 * kvp__tier_count_pins); a READY block's ref is the number of live LOAD orders naming it;
 * a FREE block is on the free list and in no slot; n_free + n_pending + n_ready ==
 * n_blocks; every key is in at most one slot of a tier. Under LRU the LRU list holds the
 * READY blocks; under another policy its lists hold exactly the READY blocks with ref 0
 * (kvp__policy_check) and the LRU list is empty.
 *
 * Files: tier.c (the tier table: blocks, key slots, LRU, add_tier, lookups, the checker),
 * tier_orders.c (orders: acquire's loads, commit's stores, hand-out, confirmation, stats).
 */
#ifndef KVP_TIER_H
#define KVP_TIER_H

#include "internal.h"

enum { KVP__TB_FREE = 0, KVP__TB_PENDING = 1, KVP__TB_READY = 2 };

typedef struct kvp__tblock {
    kvp_key key;   /* valid unless FREE */
    uint32_t prev; /* READY: the LRU neighbour towards the oldest, KVP_NIL at the head */
    uint32_t next; /* READY: towards the newest; FREE: next free block; KVP_NIL ends */
    uint32_t ref;  /* READY: live load orders reading it */
    uint8_t state; /* KVP__TB_* */
} kvp__tblock;

typedef struct kvp__tier {
    char medium[KVP_TIER_MEDIUM_MAX + 1]; /* NUL-terminated name */
    uint32_t n_blocks;                    /* capacity */
    kvp__tblock *blocks;                  /* n_blocks entries */
    uint32_t *slots;                      /* mask + 1 entries: block id or KVP_NIL */
    uint32_t mask;                        /* slot count - 1 (a power of two >= 2 n_blocks) */
    uint32_t free_head;                   /* first FREE block, KVP_NIL if none */
    uint32_t n_free, n_pending, n_ready;  /* blocks per state */
    uint32_t n_loading;                   /* READY blocks with ref > 0 */
    uint32_t lru_head, lru_tail;          /* LRU: oldest and newest READY block, KVP_NIL if
                                             none (always, under another policy) */
    uint32_t n_listed;                    /* another policy: blocks on its lists */
    kvp__policy pol;                      /* the tier's policy (policy.h; no records under
                                             LRU), bound to blocks[].key and n_listed */
    kvp_tier_stats stats;                 /* counters (gauges filled in on read) */
} kvp__tier;

typedef struct kvp__order {
    uint64_t id;           /* 0 when the slot is free */
    uint64_t req_id;       /* as kvp_tier_order */
    kvp_key key;           /* the block's key */
    kvp_key parent;        /* STORE: the key before it, or the namespace root */
    uint32_t tier_block;   /* block id in the tier */
    uint32_t device_block; /* tier-0 block id */
    uint32_t block_index;  /* position in the request */
    uint32_t next;         /* free slot list, or the FIFO of new store orders */
    uint8_t kind;          /* KVP_ORDER_* */
    uint8_t tier;          /* 1 .. n_tiers - 1 */
    bool handed_out;       /* STORE: given by kvp_tier_orders (LOADs always are) */
    bool parent_is_root;   /* STORE: parent is the namespace root */
} kvp__order;

typedef struct kvp__tiers {
    kvp__tier tier[KVP_MAX_TIERS]; /* [1 .. n_tiers) used; [0] unused */
    int n_tiers;                   /* tiers with the device pool: 1 .. KVP_MAX_TIERS */
    kvp__order *orders;            /* cap_orders slots */
    uint32_t *tokens;              /* with an event callback: block_size tokens per slot, a
                                      STORE's block (its STORED event carries them, as
                                      vLLM's BlockStored does); else NULL */
    uint32_t cap_orders;           /* slots allocated */
    uint32_t n_orders;             /* live orders */
    uint32_t free_slot;            /* first free slot, KVP_NIL if none */
    uint32_t new_head, new_tail;   /* FIFO of store orders not handed out, KVP_NIL: empty */
    uint32_t n_new;                /* its length */
    uint32_t serial;               /* the last order serial handed out (skips 0) */
} kvp__tiers;

static inline bool kvp__tiers_on(const kvp_cache *cache)
{
    return cache->tiers != NULL && cache->tiers->n_tiers > 1;
}

/* tier.c */
int kvp__tier_add_locked(kvp_cache *cache, const kvp_tier_config *tc, int *tier);
void kvp__tiers_free(kvp_cache *cache);
const char *kvp__tier_medium(const kvp_cache *cache, int k);
uint32_t kvp__tier_find(const kvp__tier *t, kvp_key key); /* block id or KVP_NIL */
uint32_t kvp__tier_find_ready(const kvp__tiers *ts, kvp_key key, int *tier);
uint32_t kvp__tier_reserve_block(kvp_cache *cache, int tier, kvp_key key);
void kvp__tier_ready(kvp__tier *t, uint32_t id, uint32_t depth);
void kvp__tier_drop(kvp__tier *t, uint32_t id);
void kvp__tier_pin(kvp__tier *t, uint32_t id);
void kvp__tier_unpin(kvp__tier *t, uint32_t id, uint32_t depth, bool ok);
int kvp__tier_check(const kvp_cache *cache);
int kvp__tier_table_check(const kvp__tier *t);
void kvp__tier_count_pins(const kvp_cache *cache, uint32_t *refs);
int kvp__lookup_tiers_locked(kvp_cache *cache, const kvp_namespace *ns, const uint32_t *tokens,
                             size_t n_tokens, uint8_t *where, size_t cap, kvp_tier_match *out);

/* tier_orders.c */
int kvp__tier_reserve_orders(kvp_cache *cache, size_t n);
int kvp__tier_commit(kvp_cache *cache, uint64_t req_id, const kvp_key *keys, const uint32_t *tokens,
                     size_t n_tokens, size_t *n_stored);
/* lifecycle.c: kvp_commit's body (cache non-NULL), which kvp__tier_commit wraps. */
int kvp__commit_body(kvp_cache *cache, uint64_t req_id, const kvp_key *keys, const uint32_t *tokens,
                     size_t n_tokens, size_t *n_stored);
int kvp__acquire_tiers_locked(kvp_cache *cache, uint64_t req_id, const kvp_namespace *ns,
                              const uint32_t *tokens, size_t n_tokens, size_t n_capacity,
                              kvp_match *out, kvp_tier_order *loads, size_t cap, size_t *n_loads);
int kvp__tier_orders_locked(kvp_cache *cache, kvp_tier_order *out, size_t cap, size_t *n,
                            size_t *n_left);
int kvp__tier_confirm_locked(kvp_cache *cache, uint64_t order_id, bool ok);
int kvp__tier_stats_locked(const kvp_cache *cache, int tier, kvp_tier_stats *out, int *n_tiers);

#endif /* KVP_TIER_H */
