/*
 * router_tmap.h - the token mode's map (router_tmap.c): one worker's engine block hashes ->
 * the router's own keys of those blocks (docs/routing.md, "Token mode"). Builds on
 * router_base.h only (layer 1, beside router_table.h).
 *
 *   entries[cap]   32 bytes each, open addressing, robin hood order, no tombstones
 *   +----------+----------+----------+------+-----+
 *   | key      | own_lo   | own_hi   | mask | aux |
 *   +----------+----------+----------+------+-----+
 *    key:  the engine's block hash (event integer)
 *    own:  the router's own 128-bit key of that block (own_lo is the index table's key;
 *          own_hi is kept because the own chain continues from all 128 bits)
 *    mask: media this engine hash is stored in; 0 marks an empty slot
 *    aux:  free for the caller (the reference map counts references in it)
 *
 * The same structure serves as a worker's reference map (key = an own key, aux = how many
 * of the worker's entries name it), kept only for own keys that two engine hashes share.
 *
 * Cost: one probe sequence per find/insert/delete (robin hood keeps it short at 90% load);
 * the map grows by 1.5x between 60% and 90% full: 35.6 to 53.3 bytes per entry.
 */
#ifndef KVP_EVENTS_ROUTER_TMAP_H
#define KVP_EVENTS_ROUTER_TMAP_H

#include "router_base.h"

typedef struct kvp__rt_tentry {
    uint64_t key;    /* engine block hash; meaningful when mask != 0 */
    uint64_t own_lo; /* own key, low 64 bits (the table's key) */
    uint64_t own_hi; /* own key, high 64 bits */
    uint32_t mask;   /* media bits (non-zero: a live entry) */
    uint32_t aux;    /* caller's field */
} kvp__rt_tentry;

typedef struct kvp__rt_tmap {
    kvp__rt_tentry *e; /* cap entries, NULL when cap == 0 */
    uint32_t cap;      /* slots; 0 or >= 16 */
    uint32_t n;        /* live entries */
    uint64_t seed;     /* position mixer (the index's table seed: positions of engine
                          hashes chosen from public prompts stay unpredictable) */
} kvp__rt_tmap;

/* Make room for n_new more inserts without growing. KVP_OK, KVP_ENOMEM (map unchanged). */
int kvp__rt_tmap_reserve(kvp__rt_tmap *m, kvp__rt_mem *mem, uint64_t n_new);

/* The entry of key, or NULL. The pointer is valid until the next insert or delete. Cannot
 * fail. */
kvp__rt_tentry *kvp__rt_tmap_find(const kvp__rt_tmap *m, uint64_t key);

/* Insert *e (e->key absent, e->mask != 0) into room made by kvp__rt_tmap_reserve. Cannot
 * fail. */
void kvp__rt_tmap_insert(kvp__rt_tmap *m, const kvp__rt_tentry *e);

/* Delete key's entry, if any. Cannot fail. */
void kvp__rt_tmap_delete(kvp__rt_tmap *m, uint64_t key);

/* Empty the map, keeping its room. Cannot fail. */
void kvp__rt_tmap_reset(kvp__rt_tmap *m);

/* Free every entry (the map is empty, cap 0). Cannot fail. */
void kvp__rt_tmap_clear(kvp__rt_tmap *m, kvp__rt_mem *mem);

/* Bytes allocated. Cannot fail. */
static inline uint64_t kvp__rt_tmap_bytes(const kvp__rt_tmap *m)
{
    return (uint64_t)m->cap * sizeof(kvp__rt_tentry);
}

/* The map's own invariants: n live entries, each at its robin hood position, keys
 * distinct. KVP_OK or KVP_ECORRUPT. */
int kvp__rt_tmap_check(const kvp__rt_tmap *m);

#endif /* KVP_EVENTS_ROUTER_TMAP_H */
