/*
 * index.c - the block index: a uthash table from 128-bit block key to kvp__block.
 *
 *   buckets[0 .. 2^log2_buckets)  ->  chains of kvp__block.hh  (one entry per cached key)
 *
 * Keys are already XXH3 digests, so the table never hashes them again: the bucket hash is
 * the key's low 32 bits, passed with HASH_FIND_BYHASHVALUE / HASH_ADD_KEYPTR_BYHASHVALUE.
 * (A probe into a 1M-entry table costs about 70 ns this way against about 160 ns with
 * uthash's default Jenkins hash over the 16 key bytes.)
 *
 * Adding a key never allocates, so it cannot fail:
 *  - a sentinel entry with a 1-byte key is added at init and stays until kvp__index_free,
 *    so uthash never frees or re-creates its table (a 16-byte lookup never matches it,
 *    because uthash compares key lengths before bytes);
 *  - the bucket array is sized once, at init, to the power of two >= n_blocks (the pool
 *    bounds the number of entries, so the load factor stays <= 1), and uthash's
 *    bucket-doubling is switched off by raising HASH_BKT_CAPACITY_THRESH out of reach.
 * That is what lets kvp_commit and kvp_access mutate the cache with no failure path after
 * their allocations are done. Memory: 16 bytes per bucket, 16-32 bytes per pool block.
 *
 * Several blocks may share one key in collision-proof mode (verify_tokens): the table then
 * resolves a key collision the way any hash table resolves a bucket collision, by keeping
 * every entry and letting the caller check each candidate (kvp__index_find, then
 * kvp__index_find_next along the bucket chain; see lifecycle.c find_verified). Outside that
 * mode a key is indexed at most once. Duplicates cost nothing extra on the hot path: the
 * first candidate is found exactly as before, and only a candidate that fails verification
 * makes the walk go on (bench/bench_verify: a cached 128k-token lookup with verification
 * takes 1.76x the verify-off time when every block has a forged colliding candidate probed
 * first, against 1.23x with none; docs/security.md).
 *
 * Invariant (checked by kvp__cache_check): n_items == number of blocks with indexed == 1,
 * and every such block is found under its own key (as one of the candidates in verify mode).
 */
#include <string.h>

#include "internal.h"

#undef HASH_INITIAL_NUM_BUCKETS
#undef HASH_INITIAL_NUM_BUCKETS_LOG2
#undef HASH_BKT_CAPACITY_THRESH
#undef uthash_malloc
#undef uthash_free
/* The table is made once, by kvp__index_init, where `idx` and `mem` are in scope. */
#define HASH_INITIAL_NUM_BUCKETS      (1u << idx->log2_buckets)
#define HASH_INITIAL_NUM_BUCKETS_LOG2 (idx->log2_buckets)
#define HASH_BKT_CAPACITY_THRESH      0x7fffffffu
#define uthash_malloc(sz)             kvp__mem_alloc(mem, (sz))
#define uthash_free(ptr, sz)          kvp__mem_free(mem, (ptr), (sz))

#define KEY_BYTES ((unsigned)sizeof(kvp_key))

static inline unsigned bucket_hash(kvp_key key)
{
    return (unsigned)key.lo;
}

/* Create the table for a pool of n_blocks. Returns KVP_OK or KVP_ENOMEM (idx unusable). */
int kvp__index_init(kvp__index *idx, kvp__mem *mem, uint32_t n_blocks)
{
    memset(idx, 0, sizeof *idx);
    idx->log2_buckets = 5;
    while ((1u << idx->log2_buckets) < 2 * (uint64_t)n_blocks && idx->log2_buckets < 31)
        idx->log2_buckets++;
    idx->sentinel_key = 0;
    kvp__block *s = &idx->sentinel;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, idx->head, &idx->sentinel_key, 1, 0u, s);
    if (!idx->head || s->hh.tbl == NULL) {
        idx->head = NULL;
        return KVP_ENOMEM;
    }
    return KVP_OK;
}

/* Free the table. The blocks themselves belong to the pool. Cannot fail. */
void kvp__index_free(kvp__index *idx, kvp__mem *mem)
{
    if (idx->head)
        HASH_CLEAR(hh, idx->head);
    idx->head = NULL;
    idx->n_items = 0;
}

/* The block indexed under key, or NULL. Cannot fail; does not change the table. */
kvp__block *kvp__index_find(const kvp__index *idx, kvp_key key)
{
    kvp__block *out;
    HASH_FIND_BYHASHVALUE(hh, idx->head, &key, KEY_BYTES, bucket_hash(key), out);
    return out;
}

/* The next block indexed under key after prev (itself a block indexed under key) in prev's
 * bucket chain, or NULL. Together with kvp__index_find this visits every block indexed
 * under key exactly once. Cannot fail; does not change the table. */
kvp__block *kvp__index_find_next(const kvp__index *idx, const kvp__block *prev, kvp_key key)
{
    const UT_hash_table *tbl = idx->head->hh.tbl;
    unsigned hv = bucket_hash(key);
    for (const UT_hash_handle *hh = prev->hh.hh_next; hh; hh = hh->hh_next)
        if (hh->hashv == hv && hh->keylen == KEY_BYTES && memcmp(hh->key, &key, KEY_BYTES) == 0)
            return (kvp__block *)(void *)((char *)(uintptr_t)hh - tbl->hho);
    return NULL;
}

/* Index blk under key. Outside collision-proof mode the key must not be indexed yet; in it,
 * other blocks may already be indexed under the same key. Cannot fail (see above). */
void kvp__index_add(kvp__index *idx, kvp__block *blk, kvp_key key)
{
    kvp__mem *mem = NULL; /* never used: the table exists and never expands */
    (void)mem;
    /* A second block under the same key is not asserted here (that costs a probe per store
     * in every build with asserts): callers add only after a find missed or unindexed the
     * holder, and kvp__index_check finds any block not reachable under its own key. */
    assert(!kvp__block_is_indexed(blk) && blk != &idx->sentinel);
    assert(idx->n_items < UINT32_MAX);
    blk->key = key;
    UT_hash_table *tbl = idx->head->hh.tbl;
    blk->hh.tbl = tbl;
    blk->hh.prev = blk->hh.next = NULL;
    blk->hh.key = &blk->key;
    blk->hh.keylen = KEY_BYTES;
    blk->hh.hashv = bucket_hash(key);
    int oomed = 0; /* never set: the bucket never expands */
    HASH_ADD_TO_BKT(tbl->buckets[blk->hh.hashv & (tbl->num_buckets - 1)], hh, &blk->hh, oomed);
    (void)oomed;
    tbl->num_items++;
    blk->indexed = 1;
    idx->n_items++;
}

/* Remove an indexed block from the table. Cannot fail; never frees the table because the
 * sentinel remains. */
void kvp__index_del(kvp__index *idx, kvp__block *blk)
{
    kvp__mem *mem = NULL; /* uthash frees only when the last entry goes: the sentinel stays */
    (void)mem;
    assert(kvp__block_is_indexed(blk) && blk != &idx->sentinel && idx->n_items > 0);
    assert(blk->hh.tbl == idx->head->hh.tbl); /* an entry of this table */
    UT_hash_table *tbl = idx->head->hh.tbl;
    HASH_DEL_IN_BKT(tbl->buckets[blk->hh.hashv & (tbl->num_buckets - 1)], &blk->hh);
    tbl->num_items--;
    blk->indexed = 0;
    idx->n_items--;
}

/* Bytes held by the table itself (bucket array and table header). */
size_t kvp__index_bucket_bytes(const kvp__index *idx)
{
    if (!idx->head)
        return 0;
    return (size_t)idx->head->hh.tbl->num_buckets * sizeof(UT_hash_bucket) + sizeof(UT_hash_table);
}
